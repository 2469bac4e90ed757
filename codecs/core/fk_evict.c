/* SPDX-License-Identifier: MIT
 * Option tables of eviction policies (fk_evict.h): the codec option machinery
 * (fk_options.c) through a codec-shaped view of the policy's table.
 */
#include <string.h>

#include "common/fk_err.h"
#include "core/fk_evict.h"

/* The policy's name and option table seen as a codec's, for fk_opts_*. */
static struct fk_codec_ops as_codec(const struct fk_evict_ops *ops)
{
    return (struct fk_codec_ops){.name = ops->name, .opts_size = ops->opts_size,
                                 .options = ops->options};
}

const struct fk_option *fk_evict_option(const struct fk_evict_ops *ops, const char *name)
{
    struct fk_codec_ops c = as_codec(ops);
    return fk_codec_option(&c, name);
}

void fk_evict_opts_defaults(const struct fk_evict_ops *ops, void *opts)
{
    struct fk_codec_ops c = as_codec(ops);
    fk_opts_defaults(&c, opts);
}

int fk_evict_opts_set(const struct fk_evict_ops *ops, void *opts, const struct fk_option *o,
                      double value)
{
    struct fk_codec_ops c = as_codec(ops);
    return fk_opts_set(&c, opts, o, value);
}

int fk_evict_opts_set_enum(const struct fk_evict_ops *ops, void *opts,
                           const struct fk_option *o, const char *choice)
{
    struct fk_codec_ops c = as_codec(ops);
    return fk_opts_set_enum(&c, opts, o, choice);
}

int fk_evict_check_names(const struct fk_evict_ops *ev, const struct fk_codec_ops *codec)
{
    for (const struct fk_option *o = ev->options; o->name; o++)
        if (fk_codec_option(codec, o->name) || !strcmp(o->name, "name") ||
            !strcmp(o->name, "evict"))
            return fk_err(FK_ECONFIG,
                          "eviction policy '%s' and codec '%s' both have an option '%s': "
                          "rename the policy's option (one key cannot set both)",
                          ev->name, codec->name, o->name);
    return FK_OK;
}
