/* SPDX-License-Identifier: MIT
 * The closed-loop benchmark (fk_bench_loop.h).
 */
#include "bench/fk_bench_loop.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/fk_clock.h"
#include "common/fk_err.h"
#include "core/fk_codec.h"
#include "core/fk_registry.h"
#include "kernels/fk_blas.h"
#include "loop/fk_loop.h"

static uint64_t next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* n floats: uniform in [-a, a] (a > 0) or all 1 (a == 0). */
static int put_block(FILE *f, float *buf, size_t cap, size_t n, double a, uint64_t *s)
{
    while (n) {
        size_t k = n < cap ? n : cap;
        for (size_t i = 0; i < k; i++)
            buf[i] = a > 0 ? (float)(a * ((double)(next(s) >> 11) / 4503599627370496.0 - 1.0))
                           : 1.0f;
        if (fwrite(buf, sizeof(float), k, f) != k)
            return -1;
        n -= k;
    }
    return 0;
}

int fk_bench_loop_make_model(const char *path, const struct fk_llama2c_config *c,
                             uint64_t seed)
{
    if (c->dim % c->n_heads || (c->dim / c->n_heads) % 2 || c->n_heads % c->n_kv_heads)
        return fk_err(FK_EINVAL, "model shape: dim %d, heads %d, KV heads %d: expected an even "
                      "head_dim and heads a multiple of KV heads", c->dim, c->n_heads,
                      c->n_kv_heads);
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return fk_err(FK_EIO, "file %s: cannot create: %s", tmp, strerror(errno));
    size_t cap = 1 << 20;
    float *buf = malloc(cap * sizeof(float));
    int32_t h[7] = {c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads,
                    c->vocab_size, c->seq_len};
    size_t d = (size_t)c->dim, hid = (size_t)c->hidden_dim, L = (size_t)c->n_layers;
    size_t hd = d / (size_t)c->n_heads, kv = hd * (size_t)c->n_kv_heads;
    double ad = 1.0 / sqrt((double)d), ah = 1.0 / sqrt((double)hid);
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    int bad = !buf || fwrite(h, sizeof h, 1, f) != 1;
    struct { size_t n; double a; } part[] = {
        {(size_t)c->vocab_size * d, 1.0}, {L * d, 0}, {L * d * d, ad}, {L * kv * d, ad},
        {L * kv * d, ad}, {L * d * d, ad}, {L * d, 0}, {L * hid * d, ad}, {L * d * hid, ah},
        {L * hid * d, ad}, {d, 0},
    };
    for (size_t i = 0; !bad && i < sizeof part / sizeof part[0]; i++)
        bad = put_block(f, buf, cap, part[i].n, part[i].a, &s) < 0;
    for (int k = 0; !bad && k < 2; k++) /* freq_cis real, imaginary: theta 10000 */
        for (int p = 0; !bad && p < c->seq_len; p++) {
            for (size_t i = 0; i < hd / 2; i++) {
                double ang = p * pow(10000.0, -(2.0 * (double)i) / (double)hd);
                buf[i] = (float)(k ? sin(ang) : cos(ang));
            }
            bad = fwrite(buf, sizeof(float), hd / 2, f) != hd / 2;
        }
    free(buf);
    if (fclose(f) != 0 || bad) {
        remove(tmp);
        return fk_err(FK_EIO, "file %s: write failed (disk full?)", tmp);
    }
    if (rename(tmp, path) != 0)
        return fk_err(FK_EIO, "file %s: cannot rename to %s: %s", tmp, path, strerror(errno));
    return FK_OK;
}

/* Read bandwidth over the n floats at p (one thread): the best of three passes, GB/s. */
static double read_bandwidth(const float *p, size_t n, volatile double *sink)
{
    double best = 0;
    for (int r = 0; r < 3; r++) {
        double t0 = fk_clock_s(CLOCK_THREAD_CPUTIME_ID);
        float acc[8] = {0};
        for (size_t i = 0; i + 8 <= n; i += 8)
            for (int j = 0; j < 8; j++)
                acc[j] += p[i + j];
        double dt = fk_clock_s(CLOCK_THREAD_CPUTIME_ID) - t0;
        for (int j = 0; j < 8; j++)
            *sink += acc[j];
        double gbs = (double)n * sizeof(float) / dt / 1e9;
        best = gbs > best ? gbs : best;
    }
    return best;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int codec_opts(const char *name, const char *const *sets, const struct fk_codec_ops **ops,
                      void **opts)
{
    *ops = fk_codec_find(name);
    if (!*ops)
        return fk_err(FK_EINVAL, "unknown codec '%s' (see fadkv-bench codecs)", name);
    if (!(*opts = calloc(1, (*ops)->opts_size)))
        return fk_err(FK_ENOMEM, "out of memory");
    fk_opts_defaults(*ops, *opts);
    for (int i = 0; sets && sets[i]; i++) {
        const char *eq = strchr(sets[i], '=');
        char key[64];
        snprintf(key, sizeof key, "%.*s", eq ? (int)(eq - sets[i]) : 0, sets[i]);
        const struct fk_option *o = eq ? fk_codec_option(*ops, key) : NULL;
        if (!o)
            return fk_err(FK_EINVAL, "codec %s: '%s': expected OPTION=VALUE of its options",
                          name, sets[i]);
        FK_TRY(o->type == FK_OPT_ENUM ? fk_opts_set_enum(*ops, *opts, o, eq + 1)
                                      : fk_opts_set(*ops, *opts, o, strtod(eq + 1, NULL)));
    }
    return FK_OK;
}

/* One timed exact decode (the reference build), seconds per token. */
static int time_exact(const struct fk_llama2c_model *m, const int32_t *ids, int P, int S,
                      struct fk_loop_ref *ref, double *s_tok)
{
    double t0 = fk_clock_s(CLOCK_THREAD_CPUTIME_ID);
    FK_TRY(fk_loop_ref_build(m, ids, P, NULL, 0, S, 0, ref));
    *s_tok = (fk_clock_s(CLOCK_THREAD_CPUTIME_ID) - t0) / (P + S);
    return FK_OK;
}

int fk_bench_loop_run(const struct fk_bench_loop_cfg *cfg, struct fk_bench_loop_result *out)
{
    memset(out, 0, sizeof *out);
    struct fk_llama2c_model *m = NULL;
    FK_TRY(fk_llama2c_model_load(cfg->model, &m));
    const struct fk_llama2c_config *c = fk_llama2c_model_config(m);
    int P = cfg->prompt_len, S = cfg->steps, R = cfg->repeats > 0 ? cfg->repeats : 1;
    size_t d = (size_t)c->dim, L = (size_t)c->n_layers, kv = (size_t)c->kv_dim;
    out->weight_bytes = 4.0 * (double)(L * (2 * d * d + 2 * kv * d + 3 * d * (size_t)c->hidden_dim)
                                       + (size_t)c->vocab_size * d);
    int blas = fk_blas_single();
    /* the bandwidth over the weights themselves (they are what a token reads) */
    volatile double sink = 0; /* keeps the passes from being optimised away */
    size_t nw = 0;
    const float *w = fk_llama2c_model_floats(m, &nw);
    out->read_gbs = read_bandwidth(w, nw, &sink);
    out->floor_s = out->weight_bytes / (out->read_gbs * 1e9);
    int rc = FK_OK;
    int32_t *ids = malloc((size_t)(P + S + 1) * sizeof *ids);
    double *ex = calloc((size_t)R * (cfg->n_codecs + 1), sizeof *ex);
    double *cs = calloc((size_t)R * (cfg->n_codecs + 1), sizeof *cs);
    double *rat = calloc((size_t)R * (cfg->n_codecs + 1), sizeof *rat);
    double *t1 = calloc((size_t)R * (cfg->n_codecs + 1), sizeof *t1);   /* one at a time */
    double *tb = calloc((size_t)R * (cfg->n_codecs + 1), sizeof *tb);   /* in blocks */
    double *tr = calloc((size_t)R * (cfg->n_codecs + 1), sizeof *tr);   /* their ratio */
    if (rc == FK_OK && (!ids || !ex || !cs || !rat || !t1 || !tb || !tr))
        rc = fk_err(FK_ENOMEM, "out of memory");
    uint64_t s = cfg->seed * 2654435761u + 7;
    for (int i = 0; rc == FK_OK && i < P; i++)
        ids[i] = (int32_t)(next(&s) % (uint64_t)c->vocab_size);
    int n_ex = 0;
    for (int r = 0; rc == FK_OK && r < R; r++) {
        double before = 0, after = 0;
        struct fk_loop_ref ref;
        rc = time_exact(m, ids, P, S, &ref, &before);
        ex[n_ex++] = before;
        for (int k = 0; rc == FK_OK && k < cfg->n_codecs; k++) {
            const struct fk_codec_ops *ops = NULL;
            void *opts = NULL;
            rc = codec_opts(cfg->codec[k], cfg->sets[k], &ops, &opts);
            struct fk_loop_codec lc = {.ops = ops, .opts = opts};
            struct fk_loop_result res;
            double t0 = fk_clock_s(CLOCK_THREAD_CPUTIME_ID);
            if (rc == FK_OK)
                rc = fk_loop_run(m, &ref, &lc, FK_LOOP_TEACHER, 0, &res);
            double dt = (fk_clock_s(CLOCK_THREAD_CPUTIME_ID) - t0) / (P + S);
            if (rc == FK_OK && cfg->block > 1) {
                /* the same run teacher-forced in blocks, right after it */
                struct fk_loop_result rb;
                lc.block = cfg->block;
                rc = fk_loop_run(m, &ref, &lc, FK_LOOP_TEACHER, 0, &rb);
                if (rc == FK_OK) {
                    size_t o = (size_t)k * R + r;
                    t1[o] = S / res.t_forward;
                    tb[o] = S / rb.t_forward;
                    tr[o] = tb[o] / t1[o];
                    double dk = fabs(rb.kl_mean - res.kl_mean);
                    out->tf_blk_dkl[k] = fmax(out->tf_blk_dkl[k], dk);
                    fk_loop_result_free(&rb);
                } else {
                    fk_loop_result_free(&res);
                }
            }
            if (rc == FK_OK) {
                out->codec_kl[k] = res.kl_mean;
                fk_loop_result_free(&res);
                struct fk_loop_ref ref2;
                rc = time_exact(m, ids, P, S, &ref2, &after);
                fk_loop_ref_free(&ref2);
                ex[n_ex++] = after;
                cs[(size_t)k * R + r] = dt;
                rat[(size_t)k * R + r] = dt / (0.5 * (before + after));
                before = after;
            }
            free(opts);
        }
        fk_loop_ref_free(&ref);
    }
    fk_blas_restore(blas);
    if (rc == FK_OK) {
        out->exact_s = median(ex, n_ex);
        out->floor_ratio = out->floor_s / out->exact_s;
        for (int k = 0; k < cfg->n_codecs; k++) {
            out->codec_s[k] = median(cs + (size_t)k * R, R);
            out->codec_ratio[k] = median(rat + (size_t)k * R, R);
            if (cfg->block > 1) {
                out->tf_one_tps[k] = median(t1 + (size_t)k * R, R);
                out->tf_blk_tps[k] = median(tb + (size_t)k * R, R);
                out->tf_blk_speedup[k] = median(tr + (size_t)k * R, R);
            }
        }
    }
    free(ids);
    free(ex);
    free(cs);
    free(rat);
    free(t1);
    free(tb);
    free(tr);
    fk_llama2c_model_free(&m);
    return rc;
}
