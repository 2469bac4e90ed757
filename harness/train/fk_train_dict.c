/* SPDX-License-Identifier: MIT
 * `fadkv-bench train-dict` as a library call (fk_train_dict.h).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fk_clock.h"
#include "common/fk_err.h"
#include "common/fk_sha256.h"
#include "formats/fk_dict.h"
#include "formats/fk_trace.h"
#include "train/fk_train_dict.h"

const char *const fk_train_method_names[] = {"sample", "random", "bcd", "lexico", NULL};

/* Reads every trace's keys and values into per-(layer, kind) arrays. */
static int load(char **paths, int n_paths, long max_per, struct fk_train_data *d)
{
    memset(d, 0, sizeof *d);
    for (int f = 0; f < n_paths; f++) {
        struct fk_trace *t;
        FK_TRY(fk_trace_open(paths[f], &t));
        const struct fk_trace_info *in = fk_trace_get_info(t);
        if (f == 0) {
            d->n_layers = in->n_layers;
            d->m = in->head_dim;
            d->x = calloc((size_t)in->n_layers * 2, sizeof(float *));
            d->n = calloc((size_t)in->n_layers * 2, sizeof(long));
            if (!d->x || !d->n) {
                fk_trace_close(&t);
                return fk_err(FK_ENOMEM, "out of memory");
            }
        } else if (in->n_layers != d->n_layers || in->head_dim != d->m) {
            fk_trace_close(&t);
            return fk_err(FK_EINVAL, "%s: %d layers x head_dim %d, but %s has %d x %d",
                          paths[f], in->n_layers, in->head_dim, paths[0], d->n_layers, d->m);
        }
        size_t per = (size_t)in->n_kv_heads * in->n_tokens * in->head_dim;
        float *buf = malloc(sizeof(float) * per);
        if (!buf) {
            fk_trace_close(&t);
            return fk_err(FK_ENOMEM, "out of memory");
        }
        int rc = FK_OK;
        for (int l = 0; l < in->n_layers && rc == FK_OK; l++)
            for (int k = 0; k < 2 && rc == FK_OK; k++) {
                rc = fk_trace_read(t, l, k, buf);
                if (rc < 0)
                    break;
                int slot = 2 * l + k;
                long add = (long)in->n_kv_heads * in->n_tokens;
                float *nx = realloc(d->x[slot], sizeof(float) * (size_t)(d->n[slot] + add) *
                                                    (size_t)d->m);
                if (!nx) {
                    rc = fk_err(FK_ENOMEM, "out of memory");
                    break;
                }
                d->x[slot] = nx;
                /* token-major order (all heads of a token together) */
                for (int tk = 0; tk < in->n_tokens; tk++)
                    for (int h = 0; h < in->n_kv_heads; h++)
                        memcpy(nx + (size_t)(d->n[slot]++) * d->m,
                               buf + ((size_t)h * in->n_tokens + tk) * d->m,
                               sizeof(float) * (size_t)d->m);
            }
        free(buf);
        fk_trace_close(&t);
        FK_TRY(rc);
    }
    /* evenly spaced sub-sample when a cap is set */
    for (int s = 0; max_per > 0 && s < d->n_layers * 2; s++) {
        if (d->n[s] <= max_per)
            continue;
        for (long i = 0; i < max_per; i++) {
            long src = (long)((double)i * d->n[s] / max_per);
            memmove(d->x[s] + (size_t)i * d->m, d->x[s] + (size_t)src * d->m,
                    sizeof(float) * (size_t)d->m);
        }
        d->n[s] = max_per;
    }
    return FK_OK;
}

static void free_data(struct fk_train_data *d)
{
    for (int s = 0; d->x && s < d->n_layers * 2; s++)
        free(d->x[s]);
    free(d->x);
    free(d->n);
}

int fk_train_dict_check(const struct fk_train_dict_cfg *c)
{
    const struct fk_train_opts *o = &c->o;
    if (!c->out || c->n_traces == 0 || o->n_atoms < 1 || o->s < 1 || o->epochs < 0 ||
        o->jobs < 1 || o->batch < 1 || !(o->heldout_frac >= 0 && o->heldout_frac < 1))
        return fk_err(FK_EINVAL, "need --out, at least one trace, N >= 1, s >= 1, epochs >= 0, "
                                 "jobs >= 1, 0 <= heldout < 1");
    return FK_OK;
}

/* The methods to train, in order (-1: none): the requested one, or with compare random,
 * sample, lexico and then the requested iterative method. */
static void method_list(const struct fk_train_dict_cfg *c, int methods[4])
{
    methods[0] = (int)c->o.method;
    methods[1] = methods[2] = methods[3] = -1;
    if (!c->compare)
        return;
    methods[0] = FK_TRAIN_RANDOM;
    methods[1] = FK_TRAIN_SAMPLE;
    methods[2] = FK_TRAIN_LEXICO;
    methods[3] = c->o.method == FK_TRAIN_LEXICO ? -1 : (int)c->o.method;
    if (c->o.method == FK_TRAIN_RANDOM || c->o.method == FK_TRAIN_SAMPLE)
        methods[3] = FK_TRAIN_BCD;
}

/* Trains every method of the list; atoms end as the requested method's. */
static int train(const struct fk_train_dict_cfg *c, const struct fk_train_dict_hooks *h,
                 const struct fk_train_data *d, float *atoms, double *held, double *final_err)
{
    int methods[4], rc = FK_OK;
    method_list(c, methods);
    enum fk_train_method final = c->o.method;
    *final_err = NAN;
    for (int mi = 0; mi < 4 && rc == FK_OK; mi++) {
        if (methods[mi] < 0)
            continue;
        struct fk_train_opts oo = c->o;
        oo.method = (enum fk_train_method)methods[mi];
        double m0 = fk_wall_s();
        if (h && h->method_start)
            h->method_start(h->ctx, oo.method);
        rc = fk_train_run(&oo, d, atoms, held, h ? h->progress : NULL, h ? h->ctx : NULL);
        if (rc < 0)
            break;
        double mean = 0;
        for (int s = 0; s < d->n_layers * 2; s++)
            mean += held[s] / (d->n_layers * 2);
        if (h && h->method_done)
            h->method_done(h->ctx, oo.method,
                           oo.method == FK_TRAIN_BCD || oo.method == FK_TRAIN_LEXICO ? oo.epochs
                                                                                     : 0,
                           mean, d->n_layers * 2, fk_wall_s() - m0);
        if (oo.method == c->o.method || (c->compare && mi == 3))
            *final_err = mean;
        final = oo.method;
    }
    if (rc == FK_OK && c->compare && final != c->o.method)
        /* the last trained method is kept; retrain the requested one if it differs */
        rc = fk_train_run(&c->o, d, atoms, held, NULL, NULL);
    return rc;
}

int fk_train_trace_list(char *const *traces, int n, char **out)
{
    *out = NULL;
    size_t cap = 1;
    for (int i = 0; i < n; i++)
        cap += strlen(traces[i]) + 80;
    char *tl = malloc(cap);
    if (!tl)
        return fk_err(FK_ENOMEM, "out of memory");
    size_t len = 0;
    tl[0] = 0;
    for (int i = 0; i < n; i++) {
        char hex[65];
        int rc = fk_sha256_file(traces[i], hex);
        if (rc < 0) {
            free(tl);
            return rc;
        }
        len += (size_t)snprintf(tl + len, cap - len, "%s%s sha256:%s", i ? "; " : "",
                                traces[i], hex);
    }
    *out = tl;
    return FK_OK;
}

/* Writes the dictionary with its provenance attributes. */
static int write_dict(const struct fk_train_dict_cfg *c, const struct fk_train_data *d,
                      const float *atoms, long tot, double final_err)
{
    const struct fk_train_opts *o = &c->o;
    char eps[32], sp[32], seed[32], n_tr[32], herr[32], hl[32];
    snprintf(eps, sizeof eps, "%d", o->epochs);
    snprintf(sp, sizeof sp, "%d", o->s);
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)o->seed);
    snprintf(n_tr, sizeof n_tr, "%ld", tot);
    snprintf(herr, sizeof herr, "%.6f", final_err);
    snprintf(hl, sizeof hl, "%g", o->heldout_frac);
    char *tl;
    FK_TRY(fk_train_trace_list(c->traces, c->n_traces, &tl));
    const char *attrs[] = {"method", fk_train_method_names[o->method], "sparsity", sp,
                           "epochs", eps, "seed", seed, "training_traces", tl,
                           "training_vectors", n_tr, "heldout_fraction", hl,
                           "heldout_rel_err", herr, "generator", "fadkv-bench train-dict",
                           o->keep_best ? "selection" : NULL, "lowest held-out epoch", NULL};
    int rc = fk_dict_save(c->out, d->n_layers, d->m, o->n_atoms, atoms, attrs);
    free(tl);
    return rc;
}

int fk_train_dict_run(const struct fk_train_dict_cfg *c, const struct fk_train_dict_hooks *h)
{
    FK_TRY(fk_train_dict_check(c));
    struct fk_train_data d = {0};
    double t0 = fk_wall_s();
    int rc = load((char **)c->traces, c->n_traces, c->max_load, &d);
    long tot = 0;
    for (int s = 0; rc == FK_OK && s < d.n_layers * 2; s++)
        tot += d.n[s];
    if (rc == FK_OK && h && h->loaded)
        h->loaded(h->ctx, c->n_traces, d.n_layers, d.m, tot, fk_wall_s() - t0);
    float *atoms = NULL;
    double *held = NULL, final_err = NAN;
    if (rc == FK_OK) {
        atoms = malloc(sizeof(float) * (size_t)d.n_layers * 2 * c->o.n_atoms * d.m);
        held = calloc((size_t)d.n_layers * 2, sizeof(double));
        if (!atoms || !held)
            rc = fk_err(FK_ENOMEM, "out of memory");
    }
    if (rc == FK_OK)
        rc = train(c, h, &d, atoms, held, &final_err);
    if (rc == FK_OK)
        rc = write_dict(c, &d, atoms, tot, final_err);
    free_data(&d);
    free(atoms);
    free(held);
    return rc;
}
