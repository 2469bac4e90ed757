/* SPDX-License-Identifier: MIT
 * The conformance fixtures (conformance/fk_conformance.h): a seeded random dictionary and
 * stream, and the replay driver that hands a codec its events as the engine does.
 * Nothing here judges a codec; fk_conformance.c does.
 */
#include <gsl/gsl_randist.h>
#include <gsl/gsl_rng.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/fk_err.h"
#include "conformance/fk_conformance.h"
#include "conformance/fk_test_basis.h"
#include "core/fk_registry.h"
#include "formats/fk_dict.h"
#include "kernels/fk_sparse.h"

static gsl_rng *rng_new(unsigned long seed)
{
    gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
    if (r)
        gsl_rng_set(r, seed);
    return r;
}

void fk_conf_random_dir(gsl_rng *r, int m, double norm, float *u)
{
    double s = 0;
    for (int i = 0; i < m; i++) {
        u[i] = (float)gsl_ran_gaussian(r, 1.0);
        s += (double)u[i] * u[i];
    }
    for (int i = 0; i < m; i++)
        u[i] = (float)(u[i] * norm / sqrt(s));
}

/* A direction far from the dictionary: most of its energy in the held-out coordinates. */
static void novel_dir(gsl_rng *r, const struct fk_conf_dict *d, double norm, float *u)
{
    fk_conf_random_dir(r, d->m, 1.0, u);
    for (int c = d->m - d->hold; c < d->m; c++)
        u[c] *= 4;
    double s = 0;
    for (int c = 0; c < d->m; c++)
        s += (double)u[c] * u[c];
    for (int c = 0; c < d->m; c++)
        u[c] = (float)(u[c] * norm / sqrt(s));
}

struct fk_stream_stats fk_conf_stats(const struct fk_conf_run *r)
{
    struct fk_stream_stats st;
    memset(&st, 0, sizeof st);
    r->ops->stats(r->st, &st);
    return st;
}

double fk_conf_dot(const float *a, const float *b, int m)
{
    double s = 0;
    for (int i = 0; i < m; i++)
        s += (double)a[i] * b[i];
    return s;
}

void fk_conf_dict_free(struct fk_conf_dict *d)
{
    free(d->atoms);
    free(d->dead);
    free(d->gram);
    memset(d, 0, sizeof *d);
}

int fk_conf_dict_init(struct fk_conf_dict *d, int N, int m, int hold, int with_gram,
                      unsigned long seed)
{
    memset(d, 0, sizeof *d);
    d->N = N;
    d->m = m;
    d->hold = hold;
    d->atoms = malloc(sizeof(float) * (size_t)N * m);
    d->dead = calloc((size_t)N, 1);
    gsl_rng *r = rng_new(seed);
    if (!d->atoms || !d->dead || !r) {
        if (r)
            gsl_rng_free(r);
        fk_conf_dict_free(d);
        return fk_err(FK_ENOMEM, "conformance: out of memory for a %d x %d dictionary", N, m);
    }
    for (int j = 0; j < N; j++) {
        float *a = d->atoms + (size_t)j * m;
        fk_conf_random_dir(r, m - hold, 1.0, a);
        for (int c = m - hold; c < m; c++)
            a[c] = 0;
    }
    gsl_rng_free(r);
    if (with_gram && fk_gram_build(d->atoms, N, m, &d->gram) < 0) {
        fk_conf_dict_free(d);
        return FK_ENOMEM;
    }
    d->with = (struct fk_base_dict){.n_atoms = N, .m = m, .atoms = d->atoms, .dead = d->dead,
                                    .gram = d->gram};
    d->without = d->with;
    d->without.gram = NULL;
    return FK_OK;
}

int fk_conf_stream_init(struct fk_conf_stream *s, const struct fk_conf_dict *d, int H, int P,
                        int T, const struct fk_conf_gen *g, unsigned long seed)
{
    int m = d->m;
    s->m = m;
    s->H = H;
    s->P = P;
    s->T = T;
    s->x = calloc((size_t)T * H * m, sizeof(float));
    float *dirs = malloc(sizeof(float) * (size_t)(g->n_dirs + 1) * m);
    gsl_rng *r = rng_new(seed);
    if (!s->x || !dirs || !r || g->k_gen > FK_SMAX) {
        free(s->x);
        s->x = NULL;
        free(dirs);
        if (r)
            gsl_rng_free(r);
        return fk_err(g->k_gen > FK_SMAX ? FK_EINVAL : FK_ENOMEM,
                      "conformance: cannot make a stream of %d x %d x %d", T, H, m);
    }
    for (int k = 0; k < g->n_dirs; k++)
        novel_dir(r, d, 1.0, dirs + (size_t)k * m);
    int pick[FK_SMAX];
    for (int i = 0; i < T * H; i++) {
        float *x = s->x + (size_t)i * m;
        int t = i / H;
        if (g->zero_every && i % g->zero_every == g->zero_every - 1)
            continue;
        if (g->const_every && i % g->const_every == g->const_every - 1) {
            float c = (float)((int)gsl_rng_uniform_int(r, 64) - 32 + 0.5) / 8; /* 1/16 grid */
            for (int k = 0; k < m; k++)
                x[k] = c;
            continue;
        }
        double pn = t < P ? g->p_novel_prefill : g->p_novel;
        if (gsl_rng_uniform(r) < pn) {
            double norm = 1.0 + 2.0 * gsl_rng_uniform(r);
            if (g->n_dirs > 0) {
                const float *u = dirs + (size_t)gsl_rng_uniform_int(r, g->n_dirs) * m;
                for (int c = 0; c < m; c++)
                    x[c] = (float)(norm * u[c] + 0.02 * gsl_ran_gaussian(r, 1.0) / sqrt(m));
            } else {
                novel_dir(r, d, norm, x);
            }
            continue;
        }
        for (int k = 0; k < g->k_gen; k++) {
            int j, dup;
            do {
                j = (int)gsl_rng_uniform_int(r, (unsigned long)g->n_use);
                dup = 0;
                for (int l = 0; l < k; l++)
                    dup |= pick[l] == j;
            } while (dup);
            pick[k] = j;
            double w = (0.5 + gsl_rng_uniform(r)) * (gsl_rng_uniform(r) < 0.5 ? -1 : 1);
            for (int c = 0; c < m; c++)
                x[c] += (float)(w * d->atoms[(size_t)j * m + c]);
        }
        for (int c = 0; c < m; c++)
            x[c] += (float)(g->noise * gsl_ran_gaussian(r, 1.0));
    }
    gsl_rng_free(r);
    free(dirs);
    return FK_OK;
}

int fk_conf_env(struct fk_conf_run *r, const struct fk_codec_ops *ops,
                const struct fk_conf_stream *src, struct fk_stream_env *env)
{
    if (ops->caps & (FK_CAP_BASIS | FK_CAP_CALIB)) {
        if (r->tb)
            fk_test_basis_free(r->tb);
        else if (!(r->tb = calloc(1, sizeof *r->tb)))
            return fk_err(FK_ENOMEM, "conformance: out of memory for a basis");
        if (fk_test_basis_init(r->tb, env->n_heads, env->head_dim, env->n_tokens,
                               1000u + (unsigned)(env->n_heads * 4096 + env->head_dim)) < 0)
            return fk_err(FK_ENOMEM, "conformance: out of memory for a basis");
        fk_test_basis_env(r->tb, ops, env);
    }
    size_t n = (size_t)env->n_heads * env->n_tokens * env->head_dim;
    if (!(ops->caps & FK_CAP_EXTERNAL) || n > ((size_t)1 << 24))
        return FK_OK; /* too large to be a real run: open() must fail cleanly without rows */
    free(r->ext);
    if (!(r->ext = calloc(n + 1, sizeof(float))))
        return fk_err(FK_ENOMEM, "conformance: out of memory for external rows");
    int m = env->head_dim, H = env->n_heads, T = env->n_tokens;
    if (src && src->m == m && src->H == H && src->T == T)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++)
                for (int c = 0; c < m; c++)
                    r->ext[((size_t)h * T + t) * m + c] = 0.5f * src->x[((size_t)t * H + h) * m + c];
    env->external = r->ext;
    return FK_OK;
}

static int run_open(struct fk_conf_run *r, const struct fk_codec_ops *ops, const void *opts,
                    const struct fk_conf_dict *d, const struct fk_conf_stream *src, int H,
                    int T, int kind, const struct fk_conf_stream *ahead);

int fk_conf_run_open(struct fk_conf_run *r, const struct fk_codec_ops *ops, const void *opts,
                     const struct fk_conf_dict *d, const struct fk_conf_stream *src, int H,
                     int T, int kind)
{
    return run_open(r, ops, opts, d, src, H, T, kind, NULL);
}

/* The rows ahead (r->ahead) from the rows of a ([T][H][m]) in the layout [H][T][m]. */
static int rows_ahead(struct fk_conf_run *r, const struct fk_conf_stream *a,
                      const struct fk_stream_env *env)
{
    int m = env->head_dim, H = env->n_heads, T = env->n_tokens;
    if (a->m != m || a->H != H || a->T != T)
        return fk_err(FK_EINVAL, "conformance: the rows ahead are %d x %d x %d, the env's "
                      "%d x %d x %d", a->H, a->T, a->m, H, T, m);
    if (!(r->ahead = malloc(sizeof(float) * (size_t)H * T * m)))
        return fk_err(FK_ENOMEM, "conformance: out of memory for the rows ahead");
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++)
            memcpy(r->ahead + ((size_t)h * T + t) * m, a->x + ((size_t)t * H + h) * m,
                   sizeof(float) * (size_t)m);
    return FK_OK;
}

static int run_open(struct fk_conf_run *r, const struct fk_codec_ops *ops, const void *opts,
                    const struct fk_conf_dict *d, const struct fk_conf_stream *src, int H,
                    int T, int kind, const struct fk_conf_stream *ahead)
{
    memset(r, 0, sizeof *r);
    r->ops = ops;
    r->H = H;
    r->m = d->m;
    const struct fk_base_dict *base = NULL;
    if (ops->caps & FK_CAP_DICT)
        base = (ops->caps & FK_CAP_GRAM) ? &d->with : &d->without;
    if (ops->check && ops->check(opts, d->m, base ? d->N : 0) != FK_OK)
        return fk_err_context(FK_ECONFIG, "%s: check() refused the options", ops->name);
    struct fk_stream_env env = {.layer = 0, .kind = kind, .head_dim = d->m, .n_heads = H,
                                .n_tokens = T, .base = base};
    FK_TRY(fk_conf_env(r, ops, src, &env));
    if (ahead && fk_codec_takes_ahead(ops))
        FK_TRY(rows_ahead(r, ahead, &env));
    r->out = calloc((size_t)T * H, sizeof *r->out);
    r->err_commit = calloc((size_t)T * H, sizeof *r->err_commit);
    if (!r->out || !r->err_commit)
        return fk_err(FK_ENOMEM, "conformance: out of memory for %d x %d outcomes", T, H);
    fk_err_clear();
    if (fk_codec_open(ops, opts, &env, r->ahead, &r->st) != FK_OK)
        return fk_err_context(FK_EINVAL, "%s: open() failed", ops->name);
    struct fk_buffer b;
    fk_codec_buffer(ops, opts, kind, &b);
    r->rule = b.mode;
    return FK_OK;
}

int fk_conf_row_err(const struct fk_conf_run *r, const float *x, int h, int t, float *xh,
                    double *err)
{
    fk_err_clear();
    if (r->ops->reconstruct(r->st, h, t, xh) != FK_OK)
        return fk_err_context(FK_EINVAL, "%s: reconstruct(head %d, token %d) failed",
                              r->ops->name, h, t);
    double e = 0, xx = 0;
    for (int c = 0; c < r->m; c++) {
        double dd = (double)x[c] - xh[c];
        e += dd * dd;
        xx += (double)x[c] * x[c];
    }
    *err = xx > 0 ? sqrt(e / xx) : sqrt(e);
    return FK_OK;
}

int fk_conf_run_event(struct fk_conf_run *r, const struct fk_conf_stream *s, int t0, int t1,
                      int phase, int step, fk_conf_hook hook, void *ctx)
{
    int n = (t1 - t0) * s->H;
    int32_t *token = malloc(sizeof(int32_t) * (size_t)(n + 1));
    int32_t *head = malloc(sizeof(int32_t) * (size_t)(n + 1));
    float *xh = malloc(sizeof(float) * (size_t)s->m);
    if (!token || !head || !xh) {
        free(token);
        free(head);
        free(xh);
        return fk_err(FK_ENOMEM, "conformance: out of memory for an event of %d vectors", n);
    }
    for (int i = 0; i < n; i++) {
        token[i] = t0 + i / s->H;
        head[i] = i % s->H;
    }
    struct fk_event ev = {.phase = phase, .step = step, .n = n,
                          .x = s->x + (size_t)t0 * s->H * s->m, .token = token, .head = head};
    if (hook)
        hook(ctx, r, &ev, 0);
    fk_err_clear();
    int rc = r->ops->encode(r->st, &ev, r->out + (size_t)t0 * s->H);
    for (int i = 0; rc == FK_OK && r->err_commit && i < n; i++) {
        double e; /* what the rows reconstruct to when committed */
        rc = fk_conf_row_err(r, ev.x + (size_t)i * s->m, head[i], token[i], xh, &e);
        r->err_commit[(size_t)t0 * s->H + i] = (float)e;
    }
    if (rc == FK_OK) {
        r->n_tok_prev = r->n_tok;
        r->n_tok = t1;
        r->events++;
        if (hook)
            hook(ctx, r, &ev, 1);
    }
    free(token);
    free(head);
    free(xh);
    return rc;
}

struct fk_sched fk_conf_sched(const struct fk_codec_ops *ops, const void *opts, int kind,
                              const struct fk_conf_stream *s)
{
    struct fk_buffer b;
    fk_codec_buffer(ops, opts, kind, &b);
    if (!ops->buffer)
        b = (struct fk_buffer){.mode = FK_BUF_BLOCK_ALL, .n_b = b.a_len, .a_len = b.a_len};
    return (struct fk_sched){.n_tokens = s->T, .prompt_len = s->P, .n_b = b.n_b,
                             .a_len = b.a_len, .mode = b.mode};
}

int fk_conf_run_stream(struct fk_conf_run *r, const struct fk_codec_ops *ops, const void *opts,
                       const struct fk_conf_dict *d, const struct fk_conf_stream *s, int kind,
                       fk_conf_hook hook, void *ctx)
{
    return fk_conf_run_stream_ahead(r, ops, opts, d, s, NULL, kind, hook, ctx);
}

int fk_conf_run_stream_ahead(struct fk_conf_run *r, const struct fk_codec_ops *ops,
                             const void *opts, const struct fk_conf_dict *d,
                             const struct fk_conf_stream *s, const struct fk_conf_stream *ahead,
                             int kind, fk_conf_hook hook, void *ctx)
{
    FK_TRY(run_open(r, ops, opts, d, s, s->H, s->T, kind, ahead));
    struct fk_sched sc = fk_conf_sched(ops, opts, kind, s);
    struct fk_sched_iter it;
    struct fk_sched_event e;
    fk_sched_begin(&it, &sc);
    while (fk_sched_next(&it, &e))
        if (fk_conf_run_event(r, s, e.first, e.end, e.phase, e.step, hook, ctx) < 0)
            return fk_err_context(FK_EINVAL, "%s: %s encode of tokens %d..%d (step %d)",
                                  ops->name, e.phase ? "decode" : "prefill", e.first,
                                  e.end - 1, e.step);
    return FK_OK;
}

void fk_conf_run_close(struct fk_conf_run *r)
{
    if (r->ops && r->st)
        r->ops->close(r->st);
    free(r->out);
    free(r->err_commit);
    free(r->ext);
    free(r->ahead);
    if (r->tb)
        fk_test_basis_free(r->tb);
    free(r->tb);
    r->ahead = NULL;
    r->st = NULL;
    r->out = NULL;
    r->err_commit = NULL;
    r->ext = NULL;
    r->tb = NULL;
}
