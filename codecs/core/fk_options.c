/* SPDX-License-Identifier: MIT
 * Option tables of codecs: look-up, defaults, range-checked setting and canonical text.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fk_err.h"
#include "core/fk_codec.h"
#include "core/fk_registry.h"

const char *const fk_coef_names[] = {"fp32", "fp16", "fp8", NULL};

const struct fk_option *fk_codec_option(const struct fk_codec_ops *ops, const char *name)
{
    for (const struct fk_option *o = ops->options; o->name; o++)
        if (!strcmp(o->name, name))
            return o;
    return NULL;
}

const struct fk_option *fk_codec_role(const struct fk_codec_ops *ops, int role)
{
    for (const struct fk_role *r = ops->roles; r && r->role; r++)
        if (r->role == role)
            return fk_codec_option(ops, r->option);
    return NULL;
}

void fk_codec_buffer(const struct fk_codec_ops *ops, const void *opts, int kind,
                     struct fk_buffer *b)
{
    const struct fk_common_opts *co = opts;
    *b = (struct fk_buffer){.mode = FK_BUF_SLIDE, .n_b = co->n_b, .a_len = co->a_len};
    if (ops->buffer)
        ops->buffer(opts, kind, b);
}

static void put(void *opts, const struct fk_option *o, double v)
{
    char *p = (char *)opts + o->offset;
    if (o->type == FK_OPT_DOUBLE)
        memcpy(p, &v, sizeof v);
    else {
        int i = (int)v;
        memcpy(p, &i, sizeof i);
    }
}

double fk_opts_get(const void *opts, const struct fk_option *o)
{
    const char *p = (const char *)opts + o->offset;
    if (o->type == FK_OPT_DOUBLE) {
        double v;
        memcpy(&v, p, sizeof v);
        return v;
    }
    int i;
    memcpy(&i, p, sizeof i);
    return i;
}

void fk_opts_defaults(const struct fk_codec_ops *ops, void *opts)
{
    memset(opts, 0, ops->opts_size);
    for (const struct fk_option *o = ops->options; o->name; o++)
        put(opts, o, o->def);
}

int fk_opts_set(const struct fk_codec_ops *ops, void *opts, const struct fk_option *o,
                double v)
{
    if (!isfinite(v) || v < o->min || v > o->max)
        return fk_err(FK_ECONFIG, "codec '%s': option '%s' = %g is out of range [%g, %g] (%s)",
                      ops->name, o->name, v, o->min, o->max, o->help);
    if (o->type != FK_OPT_DOUBLE && v != floor(v))
        return fk_err(FK_ECONFIG, "codec '%s': option '%s' must be an integer (got %g)",
                      ops->name, o->name, v);
    put(opts, o, v);
    return FK_OK;
}

int fk_opts_set_enum(const struct fk_codec_ops *ops, void *opts, const struct fk_option *o,
                     const char *choice)
{
    char allowed[256] = "";
    for (int i = 0; o->choices && o->choices[i]; i++) {
        if (!strcmp(o->choices[i], choice)) {
            put(opts, o, i);
            return FK_OK;
        }
        size_t n = strlen(allowed);
        snprintf(allowed + n, sizeof allowed - n, "%s\"%s\"", i ? " | " : "", o->choices[i]);
    }
    return fk_err(FK_ECONFIG, "codec '%s': option '%s' = \"%s\" is not one of %s", ops->name,
                  o->name, choice, allowed);
}

void fk_opts_format(const void *opts, const struct fk_option *o, char *buf, size_t cap)
{
    double v = fk_opts_get(opts, o);
    switch (o->type) {
    case FK_OPT_DOUBLE: /* shortest text that reads back exactly */
        for (int prec = 6; prec <= 17; prec++) {
            snprintf(buf, cap, "%.*g", prec, v);
            if (strtod(buf, NULL) == v)
                break;
        }
        break;
    case FK_OPT_BOOL: snprintf(buf, cap, "%s", v != 0 ? "true" : "false"); break;
    case FK_OPT_ENUM: snprintf(buf, cap, "%s", o->choices[(int)v]); break;
    default: snprintf(buf, cap, "%d", (int)v); break;
    }
}
