/* SPDX-License-Identifier: MIT
 * Simulated attention fidelity (harness/engine/fk_attn.c, spec algorithms.md 10.5) on real codec
 * states: the sparse fast path against the dense reference for every registered codec, the
 * `full` codec exactly lossless, the GQA head mapping and the top-k tie rule on hand-built
 * cases, causality, skipped steps, and the metrics against an independent brute-force
 * oracle (log-ratio KL, sorted top-k).
 */
#include "fk_check_main.h"
#include "conformance/fk_test_basis.h"
#include "engine/fk_attn.h"
#include "core/fk_codec.h"
#include "core/fk_registry.h"
#include "formats/fk_dict.h"
#include "common/fk_err.h"

#include <check.h>
#include <gsl/gsl_randist.h>
#include <gsl/gsl_rng.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A small layer: exact K/V/Q, a dictionary per kind and the codec states of K and V. */
struct fix {
    const struct fk_codec_ops *ops;
    void *opts;                   /* ops->opts_size bytes */
    int m, n_kv, n_q, T, N;       /* head_dim, KV heads, query heads, tokens, atoms */
    float *k, *v;                 /* [n_kv][T][m] */
    float *ext[2];                /* an external codec's rows: k and v halved */
    float *q;                     /* [n_q][m] */
    float *atoms[2];              /* [N][m] unit norm, per kind */
    float *gram[2];               /* [N][N] */
    struct fk_base_dict base[2];
    struct fk_test_basis basis;   /* FK_CAP_BASIS codecs: a random basis (fk_test_basis.h) */
    void *st[2];                  /* codec states of K and V */
    int done;                     /* rows encoded per head */
    int step;                     /* decode events so far */
};

static void set_opt(struct fix *f, const char *name, double v)
{
    const struct fk_option *o = fk_codec_option(f->ops, name);
    if (o)
        ck_assert_int_eq(fk_opts_set(f->ops, f->opts, o, v), FK_OK);
}

static void fix_open(struct fix *f)
{
    if ((f->ops->caps & (FK_CAP_BASIS | FK_CAP_CALIB)) && !f->basis.vec)
        fk_test_basis_init(&f->basis, f->n_kv, f->m, f->T, 77);
    for (int kind = 0; kind < 2; kind++) {
        if (f->ops->caps & FK_CAP_DICT) {
            ck_assert_int_eq(fk_gram_build(f->atoms[kind], f->N, f->m, &f->gram[kind]), FK_OK);
            f->base[kind] = (struct fk_base_dict){.n_atoms = f->N, .m = f->m,
                                                  .atoms = f->atoms[kind], .dead = NULL,
                                                  .gram = f->gram[kind]};
        }
        struct fk_stream_env env = {.layer = 0, .kind = kind, .head_dim = f->m,
                                    .n_heads = f->n_kv, .n_tokens = f->T,
                                    .base = (f->ops->caps & FK_CAP_DICT) ? &f->base[kind]
                                                                         : NULL};
        fk_test_basis_env(&f->basis, f->ops, &env);
        if (f->ops->caps & FK_CAP_EXTERNAL) {
            size_t n = (size_t)f->n_kv * f->T * f->m;
            const float *x = kind ? f->v : f->k;
            free(f->ext[kind]);
            f->ext[kind] = malloc(sizeof(float) * n);
            ck_assert_ptr_nonnull(f->ext[kind]);
            for (size_t i = 0; i < n; i++)
                f->ext[kind][i] = 0.5f * x[i];
            env.external = f->ext[kind];
        }
        if (f->ops->check)
            ck_assert_msg(f->ops->check(f->opts, f->m, f->N) == FK_OK, "%s", fk_errmsg());
        ck_assert_msg(f->ops->open(f->opts, &env, &f->st[kind]) == FK_OK, "%s: %s",
                      f->ops->name, fk_errmsg());
    }
}

/* Random layer: data are sparse combinations of dictionary atoms plus noise (so codes are
 * neither exact nor useless, and adaptive codecs adapt some vectors). */
static void fix_random(struct fix *f, const struct fk_codec_ops *ops, int m, int n_kv,
                       int n_q, int T, int N, unsigned long seed)
{
    memset(f, 0, sizeof *f);
    f->ops = ops;
    f->m = m, f->n_kv = n_kv, f->n_q = n_q, f->T = T, f->N = N;
    f->opts = calloc(1, ops->opts_size);
    fk_opts_defaults(ops, f->opts);
    set_opt(f, "s", 4);
    set_opt(f, "n", N / 2);
    set_opt(f, "rank", 8); /* a basis codec: 8 of its basis's n_kv * m components, lossy */
    set_opt(f, "group", 4); /* group quantisers: groups that divide m */
    gsl_rng *rng = gsl_rng_alloc(gsl_rng_mt19937);
    gsl_rng_set(rng, seed);
    for (int kind = 0; kind < 2; kind++) {
        f->atoms[kind] = malloc(sizeof(float) * (size_t)N * m);
        for (int j = 0; j < N; j++) {
            double nn = 0;
            float *a = f->atoms[kind] + (size_t)j * m;
            for (int c = 0; c < m; c++) {
                a[c] = (float)gsl_ran_gaussian(rng, 1.0);
                nn += (double)a[c] * a[c];
            }
            for (int c = 0; c < m; c++)
                a[c] = (float)(a[c] / sqrt(nn));
        }
    }
    f->k = malloc(sizeof(float) * (size_t)n_kv * T * m);
    f->v = malloc(sizeof(float) * (size_t)n_kv * T * m);
    f->q = malloc(sizeof(float) * (size_t)n_q * m);
    for (int kind = 0; kind < 2; kind++) {
        float *x = kind ? f->v : f->k;
        for (size_t i = 0; i < (size_t)n_kv * T; i++) {
            float *row = x + i * m;
            for (int c = 0; c < m; c++)
                row[c] = (float)gsl_ran_gaussian(rng, 0.3);
            for (int a = 0; a < 3; a++) {
                int j = (int)gsl_rng_uniform_int(rng, (unsigned long)N);
                double cf = gsl_ran_gaussian(rng, 2.0);
                for (int c = 0; c < m; c++)
                    row[c] += (float)(cf * f->atoms[kind][(size_t)j * m + c]);
            }
        }
    }
    for (int i = 0; i < n_q * m; i++)
        f->q[i] = (float)gsl_ran_gaussian(rng, 1.5);
    gsl_rng_free(rng);
    fix_open(f);
}

/* Encodes rows done..n_comp-1 of every KV head: the first call as one prefill event, later
 * calls as one decode event per token (a codec with its own buffer rule, as KIVI's key
 * blocks: one event per call), vectors ordered by (token, head). */
static void fix_encode_to(struct fix *f, int n_comp)
{
    int m = f->m, H = f->n_kv;
    while (f->done < n_comp) {
        int t0 = f->done, t1 = f->done == 0 || f->ops->buffer ? n_comp : f->done + 1;
        int nv = (t1 - t0) * H;
        float *x = malloc(sizeof(float) * (size_t)nv * m);
        int32_t *tok = malloc(sizeof(int32_t) * (size_t)nv);
        int32_t *head = malloc(sizeof(int32_t) * (size_t)nv);
        struct fk_vec_out *out = malloc(sizeof *out * (size_t)nv);
        for (int kind = 0; kind < 2; kind++) {
            const float *src = kind ? f->v : f->k;
            int e = 0;
            for (int t = t0; t < t1; t++)
                for (int h = 0; h < H; h++, e++) {
                    memcpy(x + (size_t)e * m, src + ((size_t)h * f->T + t) * m,
                           sizeof(float) * (size_t)m);
                    tok[e] = t;
                    head[e] = h;
                }
            struct fk_event ev = {.phase = t0 == 0 ? 0 : 1, .step = t0 == 0 ? -1 : f->step,
                                  .n = nv, .x = x, .token = tok, .head = head};
            ck_assert_msg(f->ops->encode(f->st[kind], &ev, out) == FK_OK, "%s: %s",
                          f->ops->name, fk_errmsg());
        }
        if (t0 > 0)
            f->step++;
        f->done = t1;
        free(x);
        free(tok);
        free(head);
        free(out);
    }
}

static struct fk_attn_in fix_in(const struct fix *f, int t, int n_comp)
{
    return (struct fk_attn_in){.m = f->m, .n_q_heads = f->n_q, .n_kv_heads = f->n_kv,
                               .n_tokens = f->T, .t = t, .n_comp_k = n_comp, .n_comp_v = n_comp, .q = f->q,
                               .k = f->k, .v = f->v, .ops = f->ops, .kstate = f->st[0],
                               .vstate = f->st[1]};
}

static void fix_free(struct fix *f)
{
    for (int kind = 0; kind < 2; kind++) {
        if (f->st[kind])
            f->ops->close(f->st[kind]);
        free(f->atoms[kind]);
        free(f->gram[kind]);
    }
    if (f->basis.vec)
        fk_test_basis_free(&f->basis);
    free(f->opts);
    free(f->k);
    free(f->ext[0]);
    free(f->ext[1]);
    free(f->v);
    free(f->q);
}

static int n_codecs(void)
{
    int n = 0;
    while (fk_codecs[n])
        n++;
    return n;
}

static double rel_close(double a, double b, double rel, double abs_floor)
{
    return fabs(a - b) <= rel * fabs(b) + abs_floor;
}

/* KL compared at 1e-6 relative plus the effect of float32 rounding of the compressed
 * logits: both paths round z_hat at float level (the fast path in q . D, the dense one in
 * the reconstructed k_hat), and dKL/dz_hat_i = P_hat_i - P_i, so a logit error delta moves KL
 * by at most 2 TV delta. delta = 1e-6 for the O(10) logits of these tests (KL alone is a
 * small difference of two LSEs; o_hat, cos and relerr are held to 1e-6 relative). */
static int kl_close(double a, double b, double tv)
{
    return fabs(a - b) <= 1e-6 * fabs(b) + 2 * tv * 1e-6;
}

/* ---- fast path == dense reference, for every codec ------------------------------------- */

START_TEST(fast_equals_naive_every_codec)
{
    const struct fk_codec_ops *ops = fk_codecs[_i];
    struct fix f;
    fix_random(&f, ops, 16, 2, 6, 48, 64, 1234 + (unsigned long)_i);
    /* adaptation thresholds below the typical error here (about 0.3): adaptive codecs
     * change their dictionaries between the evaluations below */
    for (int kind = 0; kind < 2; kind++) {
        ops->close(f.st[kind]);
        f.st[kind] = NULL;
        free(f.gram[kind]);
        f.gram[kind] = NULL;
    }
    set_opt(&f, "delta_k", 0.2);
    set_opt(&f, "delta_v", 0.2);
    fix_open(&f);
    struct fk_attn_scratch *s = NULL;
    /* the scratch holds more atoms than the base: append codecs grow */
    ck_assert_int_eq(fk_attn_scratch_create(f.m, f.T, f.N + f.T * f.n_kv, f.n_q, &s), FK_OK);
    const int steps_all[][2] = {{6, 2}, {20, 12}, {33, 30}, {47, 40}};
    /* (t, n_comp); a codec with its own buffer rule gets spans of whole groups of 4 */
    const int steps_blk[][2] = {{6, 4}, {20, 12}, {33, 28}, {47, 40}};
    const int (*steps)[2] = ops->buffer ? steps_blk : steps_all;
    struct fk_attn_acc af = {0}, an = {0};
    double *ohn = malloc(sizeof(double) * (size_t)f.n_q * f.m);
    struct fk_attn_metrics *mn = malloc(sizeof *mn * (size_t)f.n_q);
    double worst = 0;
    uint64_t prev_app = 0, prev_rep = 0;
    int grew = 0, replaced = 0; /* evaluations after the value dictionary changed */
    for (size_t k = 0; k < sizeof steps_all / sizeof steps_all[0]; k++) {
        int t = steps[k][0], nc = steps[k][1];
        fix_encode_to(&f, nc);
        struct fk_stream_stats vs;
        ops->stats(f.st[1], &vs);
        grew += k > 0 && vs.appends != prev_app;
        replaced += k > 0 && vs.replacements != prev_rep;
        prev_app = vs.appends;
        prev_rep = vs.replacements;
        struct fk_attn_in in = fix_in(&f, t, nc);
        ck_assert_msg(fk_attn_eval(&in, s, &af) == FK_OK, "%s", fk_errmsg());
        ck_assert_msg(fk_attn_eval_naive_out(&in, &an, ohn, mn) == FK_OK, "%s", fk_errmsg());
        for (int h = 0; h < f.n_q; h++) {
            const double *o = NULL, *oh = NULL;
            struct fk_attn_metrics mf;
            ck_assert_int_eq(fk_attn_scratch_result(s, h, &o, &oh, &mf), FK_OK);
            double dd = 0, nn = 0;
            for (int c = 0; c < f.m; c++) {
                dd += (oh[c] - ohn[(size_t)h * f.m + c]) * (oh[c] - ohn[(size_t)h * f.m + c]);
                nn += ohn[(size_t)h * f.m + c] * ohn[(size_t)h * f.m + c];
            }
            double rel = sqrt(dd / nn);
            worst = rel > worst ? rel : worst;
            ck_assert_msg(rel <= 1e-6, "%s t=%d head %d: o_hat differs by %g relative",
                          ops->name, t, h, rel);
            ck_assert_msg(rel_close(mf.cos, mn[h].cos, 1e-6, 0), "%s: cos %.17g vs %.17g",
                          ops->name, mf.cos, mn[h].cos);
            /* |relerr - relerr_naive| <= ||o_hat - o_hat_naive|| / ||o|| (triangle
             * inequality): relerr is a small difference and amplifies the o_hat gap */
            double oo = 0;
            for (int c = 0; c < f.m; c++)
                oo += o[c] * o[c];
            double bound = sqrt(dd / oo);
            ck_assert_msg(fabs(mf.relerr - mn[h].relerr) <= 1.01 * bound + 1e-12,
                          "%s: relerr %.17g vs %.17g (bound %g)", ops->name, mf.relerr,
                          mn[h].relerr, bound);
            ck_assert_msg(kl_close(mf.kl, mn[h].kl, mn[h].tv), "%s: KL %.17g vs %.17g",
                          ops->name, mf.kl, mn[h].kl);
            ck_assert(rel_close(mf.tv, mn[h].tv, 1e-6, 2e-6)); /* |dTV| <= 2 delta */
            ck_assert(mf.mass == mn[h].mass);
            for (int q = 0; q < 3; q++)
                ck_assert_msg(mf.top[q] == mn[h].top[q], "%s: top[%d] %g vs %g", ops->name,
                              q, mf.top[q], mn[h].top[q]);
            ck_assert(mf.cos == af.cos_vals[af.n - f.n_q + h]);
        }
    }
    /* the fast path keeps D_V widened across steps: the refresh after appends and after
     * replacements must have been exercised by the comparisons above */
    if (ops->caps & FK_CAP_ADAPTS)
        ck_assert_msg((ops->caps & FK_CAP_GROWS) ? grew > 0 : replaced > 0,
                      "%s: the value dictionary did not change between evaluations (appended "
                      "%d, replaced %d times)", ops->name, grew, replaced);
    ck_assert_int_eq(af.n, an.n);
    ck_assert_int_eq(af.n, 4 * f.n_q);
    ck_assert(rel_close(af.kl_sum, an.kl_sum, 1e-6, 1e-12));
    ck_assert(rel_close(af.relerr_sum, an.relerr_sum, 1e-6, 1e-12));
    /* a lossy codec must show some loss, or the comparison above proves little */
    if (strcmp(ops->name, "full"))
        ck_assert_msg(af.relerr_sum > 1e-3 && af.kl_sum > 1e-4, "%s: relerr %g KL %g",
                      ops->name, af.relerr_sum, af.kl_sum);
    /* deterministic: the same step again gives the same bits */
    struct fk_attn_acc a2 = {0};
    struct fk_attn_in in = fix_in(&f, 47, 40);
    ck_assert_int_eq(fk_attn_eval(&in, s, &a2), FK_OK);
    for (int h = 0; h < f.n_q; h++)
        ck_assert(a2.cos_vals[h] == af.cos_vals[af.n - f.n_q + h]);
    fk_attn_acc_free(&a2);
    fk_attn_acc_free(&af);
    fk_attn_acc_free(&an);
    free(ohn);
    free(mn);
    fk_attn_scratch_free(&s);
    ck_assert_ptr_null(s);
    fix_free(&f);
}
END_TEST

/* ---- an eviction policy's keep mask (core/fk_evict.h) ------------------------------------ */

/* The codec of the test below, seen through reconstruct / sparse_row that fail on a dropped
 * row: attention must never read one. */
static const struct fk_codec_ops *guard_inner;
static const uint8_t *guard_keep;
static int guard_T;
static int guard_reconstruct(const void *st, int head, int token, float *out)
{
    if (!guard_keep[(size_t)head * guard_T + token])
        return fk_err(FK_EINVAL, "dropped row (head %d, token %d) was read", head, token);
    return guard_inner->reconstruct(st, head, token, out);
}
static int guard_sparse_row(const void *st, int head, int token, int *nnz, const int32_t **idx,
                            const float **coef)
{
    if (!guard_keep[(size_t)head * guard_T + token])
        return fk_err(FK_EINVAL, "dropped row (head %d, token %d) was read", head, token);
    return guard_inner->sparse_row(st, head, token, nnz, idx, coef);
}

START_TEST(eviction_mask_every_codec)
{
    const struct fk_codec_ops *ops = fk_codecs[_i];
    struct fix f;
    fix_random(&f, ops, 16, 2, 6, 48, 64, 777 + (unsigned long)_i);
    struct fk_attn_scratch *s = NULL;
    ck_assert_int_eq(fk_attn_scratch_create(f.m, f.T, f.N + f.T * f.n_kv, f.n_q, &s), FK_OK);
    struct fk_codec_ops guarded = *ops;
    guarded.reconstruct = guard_reconstruct;
    guarded.sparse_row = ops->sparse_row ? guard_sparse_row : NULL;
    guard_inner = ops;
    guard_T = f.T;
    uint8_t *keep = malloc((size_t)f.n_kv * f.T);
    guard_keep = keep;
    int t = 40, nc = ops->buffer ? 36 : 30;
    fix_encode_to(&f, nc);
    struct fk_attn_acc af = {0}, an = {0};
    double *ohn = malloc(sizeof(double) * (size_t)f.n_q * f.m);
    struct fk_attn_metrics *mn = malloc(sizeof *mn * (size_t)f.n_q);
    for (int pass = 0; pass < 3; pass++) {
        /* pass 0: every row kept (the numbers of no policy at all); 1, 2: about a third
         * dropped, compressed rows and exact ones, token t kept */
        for (int g = 0; g < f.n_kv; g++)
            for (int j = 0; j < f.T; j++)
                keep[(size_t)g * f.T + j] = pass == 0 || j == t || (j * 7 + g * 3 + pass) % 3;
        struct fk_attn_in in = fix_in(&f, t, nc);
        in.ops = &guarded;
        struct fk_attn_in plain = in;
        in.keep = keep;
        ck_assert_msg(fk_attn_eval(&in, s, &af) == FK_OK, "%s: %s", ops->name, fk_errmsg());
        struct fk_attn_metrics mf[8];
        const double *oh[8], *o = NULL;
        for (int h = 0; h < f.n_q; h++)
            ck_assert_int_eq(fk_attn_scratch_result(s, h, &o, &oh[h], &mf[h]), FK_OK);
        ck_assert_msg(fk_attn_eval_naive_out(&in, &an, ohn, mn) == FK_OK, "%s: %s", ops->name,
                      fk_errmsg());
        for (int h = 0; h < f.n_q; h++) {
            double dd = 0, nn = 0;
            for (int c = 0; c < f.m; c++) {
                double d = oh[h][c] - ohn[(size_t)h * f.m + c];
                dd += d * d;
                nn += ohn[(size_t)h * f.m + c] * ohn[(size_t)h * f.m + c];
            }
            ck_assert_msg(sqrt(dd / nn) <= 1e-6, "%s pass %d head %d: o_hat differs by %g",
                          ops->name, pass, h, sqrt(dd / nn));
            ck_assert(mf[h].retained == mn[h].retained);
            ck_assert_msg(rel_close(mf[h].rkl, mn[h].rkl, 1e-6, 1e-9), "%s: rKL %.17g vs %.17g",
                          ops->name, mf[h].rkl, mn[h].rkl);
            if (pass == 0) {
                ck_assert(mf[h].retained == 1.0 || fabs(mf[h].retained - 1) < 1e-12);
                ck_assert(isfinite(mf[h].kl));
            } else {
                /* forward KL is undefined once P's keys are dropped: NaN, never inf */
                ck_assert(isnan(mf[h].kl) && isnan(mn[h].kl));
                ck_assert(mf[h].retained < 1 && mf[h].retained > 0);
                ck_assert(mf[h].rkl > 0);
            }
            if (ops->caps & FK_CAP_EXACT) /* exact keys: KL(P_hat || P) = -log(mass) */
                ck_assert_msg(fabs(mf[h].rkl + log(mf[h].retained)) <= 1e-9 &&
                              fabs(mn[h].rkl + log(mn[h].retained)) <= 1e-9,
                              "%s: rKL %.17g, -log(retained) %.17g", ops->name, mf[h].rkl,
                              -log(mf[h].retained));
        }
        if (pass == 0) { /* everything kept: the very numbers of no mask */
            struct fk_attn_acc a0 = {0};
            ck_assert_int_eq(fk_attn_eval(&plain, s, &a0), FK_OK);
            for (int h = 0; h < f.n_q; h++) {
                struct fk_attn_metrics m0;
                ck_assert_int_eq(fk_attn_scratch_result(s, h, NULL, NULL, &m0), FK_OK);
                ck_assert(m0.cos == mf[h].cos && m0.relerr == mf[h].relerr);
                ck_assert(m0.kl == mf[h].kl && m0.tv == mf[h].tv);
            }
            fk_attn_acc_free(&a0);
        }
    }
    fk_attn_acc_free(&af);
    fk_attn_acc_free(&an);
    free(ohn);
    free(mn);
    free(keep);
    fk_attn_scratch_free(&s);
    fix_free(&f);
}
END_TEST

/* ---- full: exactly lossless ------------------------------------------------------------ */

START_TEST(full_codec_exact)
{
    struct fix f;
    fix_random(&f, fk_codec_find("full"), 16, 2, 6, 48, 64, 77);
    struct fk_attn_scratch *s = NULL;
    ck_assert_int_eq(fk_attn_scratch_create(f.m, f.T, 1, f.n_q, &s), FK_OK);
    struct fk_attn_acc acc = {0};
    const int steps[][2] = {{5, 1}, {30, 20}, {47, 47 - 8}};
    for (size_t k = 0; k < 3; k++) {
        fix_encode_to(&f, steps[k][1]);
        struct fk_attn_in in = fix_in(&f, steps[k][0], steps[k][1]);
        ck_assert_int_eq(fk_attn_eval(&in, s, &acc), FK_OK);
        for (int h = 0; h < f.n_q; h++) {
            struct fk_attn_metrics mt;
            const double *o, *oh;
            ck_assert_int_eq(fk_attn_scratch_result(s, h, &o, &oh, &mt), FK_OK);
            ck_assert_msg(mt.cos == 1.0, "cos %.17g", mt.cos);
            ck_assert(mt.kl == 0.0);
            ck_assert(mt.relerr == 0.0);
            for (int q = 0; q < 3; q++)
                ck_assert(mt.top[q] == 1.0);
            ck_assert(mt.mass > 0 && mt.mass <= 1);
            ck_assert(memcmp(o, oh, sizeof(double) * (size_t)f.m) == 0);
        }
        struct fk_attn_acc an = {0};
        struct fk_attn_metrics mn[6];
        ck_assert_int_eq(fk_attn_eval_naive_out(&in, &an, NULL, mn), FK_OK);
        for (int h = 0; h < f.n_q; h++)
            ck_assert(mn[h].cos == 1.0 && mn[h].kl == 0.0 && mn[h].top[0] == 1.0);
        fk_attn_acc_free(&an);
    }
    ck_assert(acc.cos_sum == 3.0 * f.n_q);
    ck_assert(acc.kl_sum == 0.0 && acc.relerr_sum == 0.0);
    ck_assert(acc.top_sum[0] == 3.0 * f.n_q && acc.top_sum[2] == 3.0 * f.n_q);
    fk_attn_acc_free(&acc);
    fk_attn_scratch_free(&s);
    fix_free(&f);
}
END_TEST

/* ---- GQA mapping on a hand-built case -------------------------------------------------- */

/* m = 4, 2 KV heads, 6 query heads (r = 3), 5 tokens, t = 3. Keys k_i = 4 e_i (i < 4),
 * query head h = c e_{h mod 4}: z_i = 2c [i = h mod 4] (sqrt(m) = 2). Values of KV head g:
 * v_i = (100 g + i) e_0 + (g + 1) e_1, g = h / 3. So P_j = e^{2c} / (e^{2c} + 3) at
 * j = h mod 4, 1 / (e^{2c} + 3) elsewhere, o_0 = sum_i P_i (100 g + i), o_1 = g + 1: a wrong
 * head mapping is off by 100 in o_0. Token 4 holds a huge key and value (invisible). The
 * codec stores rows exactly (full, or lexico over the identity dictionary with fp32
 * coefficients), so o_hat must equal the hand value too. */
static void gqa_case(const char *codec, int n_comp)
{
    struct fix f;
    memset(&f, 0, sizeof f);
    f.ops = fk_codec_find(codec);
    ck_assert_ptr_nonnull(f.ops);
    f.m = 4, f.n_kv = 2, f.n_q = 6, f.T = 5, f.N = 4;
    f.opts = calloc(1, f.ops->opts_size);
    fk_opts_defaults(f.ops, f.opts);
    set_opt(&f, "s", 2);
    const struct fk_option *co = fk_codec_option(f.ops, "coef");
    ck_assert_int_eq(fk_opts_set(f.ops, f.opts, co, FK_COEF_FP32), FK_OK);
    f.k = calloc((size_t)f.n_kv * f.T * f.m, sizeof(float));
    f.v = calloc((size_t)f.n_kv * f.T * f.m, sizeof(float));
    f.q = calloc((size_t)f.n_q * f.m, sizeof(float));
    for (int kind = 0; kind < 2; kind++) {
        f.atoms[kind] = calloc((size_t)f.N * f.m, sizeof(float));
        for (int j = 0; j < 4; j++)
            f.atoms[kind][j * 4 + j] = 1;
    }
    for (int g = 0; g < 2; g++)
        for (int i = 0; i < 5; i++) {
            float *kk = f.k + ((size_t)g * f.T + i) * 4, *vv = f.v + ((size_t)g * f.T + i) * 4;
            if (i < 4) {
                kk[i] = 4;
                vv[0] = (float)(100 * g + i);
                vv[1] = (float)(g + 1);
            } else {
                kk[0] = kk[1] = kk[2] = kk[3] = 1e4f;
                vv[0] = vv[1] = 1e6f;
            }
        }
    const double c = 0.75;
    for (int h = 0; h < 6; h++)
        f.q[h * 4 + h % 4] = (float)c;
    fix_open(&f);
    fix_encode_to(&f, n_comp);
    struct fk_attn_scratch *s = NULL;
    ck_assert_int_eq(fk_attn_scratch_create(4, 5, 8, 6, &s), FK_OK);
    struct fk_attn_acc acc = {0};
    struct fk_attn_in in = fix_in(&f, 3, n_comp);
    ck_assert_msg(fk_attn_eval(&in, s, &acc) == FK_OK, "%s", fk_errmsg());
    double e = exp(2 * c), den = e + 3;
    for (int h = 0; h < 6; h++) {
        int g = h / 3, j = h % 4;
        double want0 = 0;
        for (int i = 0; i < 4; i++)
            want0 += (i == j ? e : 1) / den * (100 * g + i);
        const double *o, *oh;
        struct fk_attn_metrics mt;
        ck_assert_int_eq(fk_attn_scratch_result(s, h, &o, &oh, &mt), FK_OK);
        ck_assert_msg(fabs(o[0] - want0) < 1e-9 && fabs(o[1] - (g + 1)) < 1e-12,
                      "%s head %d: o = (%g, %g), want (%g, %d)", codec, h, o[0], o[1], want0,
                      g + 1);
        ck_assert_msg(fabs(oh[0] - want0) < 1e-5 && fabs(oh[1] - (g + 1)) < 1e-6,
                      "%s head %d: o_hat = (%g, %g), want (%g, %d)", codec, h, oh[0], oh[1],
                      want0, g + 1);
        double want_mass = 0;
        for (int i = 0; i < n_comp; i++)
            want_mass += (i == j ? e : 1) / den;
        ck_assert(fabs(mt.mass - want_mass) < 1e-12);
        ck_assert(mt.top[0] == 1.0);
    }
    ck_assert(fk_attn_scratch_result(s, 6, NULL, NULL, NULL) == FK_EINVAL);
    fk_attn_acc_free(&acc);
    fk_attn_scratch_free(&s);
    fix_free(&f);
}

START_TEST(gqa_mapping_hand_case)
{
    gqa_case("full", 2);
    gqa_case("lexico", 2);
    gqa_case("lexico", 3);
}
END_TEST

/* Ties in z go to the smaller index: keys 0 and 1 tie exactly (1.0625 e_0, 1.0625 e_1 with
 * q = e_0 + e_1); token 0 is stored with the FP8 coefficient 1.0 (1.0625 is a tie in
 * E4M3 and rounds to even), so z_hat ranks token 1 first. Top-1 overlap must be 0 (it would
 * be 1 if ties went to the larger index), top-8 (k' = 4 tokens) must be 1. */
START_TEST(topk_ties_to_smaller_index)
{
    struct fix f;
    memset(&f, 0, sizeof f);
    f.ops = fk_codec_find("lexico");
    f.m = 4, f.n_kv = 1, f.n_q = 1, f.T = 4, f.N = 4;
    f.opts = calloc(1, f.ops->opts_size);
    fk_opts_defaults(f.ops, f.opts);
    set_opt(&f, "s", 1);
    f.k = calloc(16, sizeof(float));
    f.v = calloc(16, sizeof(float));
    f.q = calloc(4, sizeof(float));
    for (int kind = 0; kind < 2; kind++) {
        f.atoms[kind] = calloc(16, sizeof(float));
        for (int j = 0; j < 4; j++)
            f.atoms[kind][j * 4 + j] = 1;
    }
    f.k[0] = 1.0625f;
    f.k[4 + 1] = 1.0625f;
    for (int i = 0; i < 4; i++)
        f.v[i * 4 + i] = 1;
    f.q[0] = f.q[1] = 1;
    fix_open(&f);
    fix_encode_to(&f, 1);
    int nnz;
    const int32_t *idx;
    const float *coef;
    ck_assert_int_eq(f.ops->sparse_row(f.st[0], 0, 0, &nnz, &idx, &coef), FK_OK);
    ck_assert(nnz == 1 && idx[0] == 0 && coef[0] == 1.0f);
    struct fk_attn_scratch *s = NULL;
    ck_assert_int_eq(fk_attn_scratch_create(4, 4, 4, 1, &s), FK_OK);
    struct fk_attn_acc acc = {0}, an = {0};
    struct fk_attn_in in = fix_in(&f, 3, 1);
    ck_assert_int_eq(fk_attn_eval(&in, s, &acc), FK_OK);
    struct fk_attn_metrics mt, mn;
    ck_assert_int_eq(fk_attn_scratch_result(s, 0, NULL, NULL, &mt), FK_OK);
    ck_assert_int_eq(fk_attn_eval_naive_out(&in, &an, NULL, &mn), FK_OK);
    ck_assert_msg(mt.top[0] == 0.0, "top-1 overlap %g", mt.top[0]);
    ck_assert(mt.top[1] == 1.0 && mt.top[2] == 1.0);
    ck_assert(mn.top[0] == 0.0 && mn.top[1] == 1.0);
    fk_attn_acc_free(&acc);
    fk_attn_acc_free(&an);
    fk_attn_scratch_free(&s);
    fix_free(&f);
}
END_TEST

/* ---- causality ------------------------------------------------------------------------- */

START_TEST(future_tokens_never_matter)
{
    const char *names[] = {"full", "lexico", "fadkv"};
    for (int c = 0; c < 3; c++) {
        struct fix f;
        fix_random(&f, fk_codec_find(names[c]), 16, 2, 4, 40, 64, 99);
        fix_encode_to(&f, 20);
        struct fk_attn_scratch *s = NULL;
        ck_assert_int_eq(fk_attn_scratch_create(f.m, f.T, f.N, f.n_q, &s), FK_OK);
        struct fk_attn_acc a0 = {0}, a1 = {0}, n0 = {0}, n1 = {0};
        struct fk_attn_in in = fix_in(&f, 25, 20);
        ck_assert_int_eq(fk_attn_eval(&in, s, &a0), FK_OK);
        ck_assert_int_eq(fk_attn_eval_naive(&in, &n0), FK_OK);
        double oh0[4][16];
        for (int h = 0; h < 4; h++) {
            const double *oh;
            ck_assert_int_eq(fk_attn_scratch_result(s, h, NULL, &oh, NULL), FK_OK);
            memcpy(oh0[h], oh, sizeof oh0[h]);
        }
        /* a huge key aligned with every query and a huge value at tokens t+1 and T-1 */
        for (int g = 0; g < 2; g++)
            for (int tok = 26; tok < 40; tok += 13)
                for (int i = 0; i < 16; i++) {
                    f.k[((size_t)g * 40 + tok) * 16 + i] = 1e6f * f.q[i];
                    f.v[((size_t)g * 40 + tok) * 16 + i] = 1e9f;
                }
        ck_assert_int_eq(fk_attn_eval(&in, s, &a1), FK_OK);
        ck_assert_int_eq(fk_attn_eval_naive(&in, &n1), FK_OK);
        for (int h = 0; h < 4; h++) {
            const double *oh;
            ck_assert_int_eq(fk_attn_scratch_result(s, h, NULL, &oh, NULL), FK_OK);
            ck_assert(memcmp(oh0[h], oh, sizeof oh0[h]) == 0);
            ck_assert(a0.cos_vals[h] == a1.cos_vals[h]);
        }
        ck_assert(a0.kl_sum == a1.kl_sum && a0.relerr_sum == a1.relerr_sum);
        ck_assert(a0.top_sum[1] == a1.top_sum[1] && a0.mass_sum == a1.mass_sum);
        ck_assert(n0.kl_sum == n1.kl_sum && n0.relerr_sum == n1.relerr_sum);
        /* and the planted key is visible once t reaches it (the test can fail) */
        struct fk_attn_acc a2 = {0};
        in.t = 26;
        ck_assert_int_eq(fk_attn_eval(&in, s, &a2), FK_OK);
        ck_assert(a2.mass_sum < 1e-6 * f.n_q);
        fk_attn_acc_free(&a0);
        fk_attn_acc_free(&a1);
        fk_attn_acc_free(&a2);
        fk_attn_acc_free(&n0);
        fk_attn_acc_free(&n1);
        fk_attn_scratch_free(&s);
        fix_free(&f);
    }
}
END_TEST

/* ---- skipped steps, argument checks, merge --------------------------------------------- */

START_TEST(skipped_step_and_checks)
{
    struct fix f;
    fix_random(&f, fk_codec_find("lexico"), 16, 2, 6, 32, 64, 5);
    struct fk_attn_scratch *s = NULL;
    ck_assert_int_eq(fk_attn_scratch_create(f.m, f.T, f.N, f.n_q, &s), FK_OK);
    struct fk_attn_acc acc = {0};
    struct fk_attn_in in = fix_in(&f, 10, 0);
    ck_assert_int_eq(fk_attn_eval(&in, s, &acc), FK_OK);
    ck_assert_int_eq(fk_attn_eval_naive(&in, &acc), FK_OK);
    ck_assert_int_eq(acc.skipped_steps, 2);
    ck_assert_int_eq(acc.n, 0);
    ck_assert(acc.cos_sum == 0 && acc.kl_sum == 0 && acc.mass_sum == 0);
    ck_assert_ptr_null(acc.cos_vals);
    ck_assert_int_eq(fk_attn_scratch_result(s, 0, NULL, NULL, NULL), FK_EINVAL);
    /* misuse is refused, nothing is counted */
    in.n_comp_k = in.n_comp_v = 12; /* beyond t + 1 */
    ck_assert_int_eq(fk_attn_eval(&in, s, &acc), FK_EINVAL);
    in.n_comp_k = in.n_comp_v = 4;
    in.n_q_heads = 5;
    ck_assert_int_eq(fk_attn_eval(&in, s, &acc), FK_EINVAL);
    in = fix_in(&f, 32, 4);
    ck_assert_int_eq(fk_attn_eval(&in, s, &acc), FK_EINVAL);
    in = fix_in(&f, 10, 4);
    fix_encode_to(&f, 3);
    ck_assert_int_lt(fk_attn_eval(&in, s, &acc), 0); /* row 3 is not stored yet */
    struct fk_attn_scratch *small = NULL;
    ck_assert_int_eq(fk_attn_scratch_create(f.m, f.T, f.N - 1, f.n_q, &small), FK_OK);
    in.n_comp_k = in.n_comp_v = 3;
    ck_assert_int_eq(fk_attn_eval(&in, small, &acc), FK_EINVAL);
    ck_assert_int_eq(acc.n, 0);
    struct fk_attn_scratch *bad = s;
    ck_assert_int_eq(fk_attn_scratch_create(0, 1, 1, 1, &bad), FK_EINVAL);
    ck_assert_ptr_null(bad);
    /* merge: sums add, cos values are appended in order */
    struct fk_attn_acc b = {0};
    ck_assert_int_eq(fk_attn_eval(&in, s, &acc), FK_OK);
    ck_assert_int_eq(fk_attn_eval(&in, s, &b), FK_OK);
    in.t = 20;
    ck_assert_int_eq(fk_attn_eval(&in, s, &b), FK_OK);
    struct fk_attn_acc sum = {0};
    ck_assert_int_eq(fk_attn_acc_merge(&sum, &acc), FK_OK);
    ck_assert_int_eq(fk_attn_acc_merge(&sum, &b), FK_OK);
    ck_assert_int_eq(sum.n, 3 * f.n_q);
    ck_assert_int_eq(sum.skipped_steps, 2);
    ck_assert(sum.cos_sum == acc.cos_sum + b.cos_sum);
    ck_assert(sum.cos_vals[f.n_q + 2] == b.cos_vals[2]);
    ck_assert(sum.cos_vals[2 * f.n_q + 1] == b.cos_vals[f.n_q + 1]);
    ck_assert(b.cos_vals[1] != b.cos_vals[f.n_q + 1]);
    fk_attn_acc_free(&sum);
    fk_attn_acc_free(&b);
    fk_attn_acc_free(&acc);
    fk_attn_scratch_free(&small);
    fk_attn_scratch_free(&s);
    fix_free(&f);
}
END_TEST

/* ---- metric ranges and an independent oracle ------------------------------------------- */

static int cmp_desc(const void *a, const void *b, const double *z)
{
    int i = *(const int *)a, j = *(const int *)b;
    if (z[i] != z[j])
        return z[i] > z[j] ? -1 : 1;
    return i - j;
}

static const double *sort_key;
static int cmp_idx(const void *a, const void *b)
{
    return cmp_desc(a, b, sort_key);
}

/* KL as sum P log(P / P_hat), top-k by a full sort, cos from the definition. */
/* The layer's attention for the oracle (fk_attn_in's inv_scale, softcap, window; 0: the
 * plain default). */
static double g_inv, g_cap;
static int g_win;

static void oracle(const struct fix *f, int t, int n_comp, int h, struct fk_attn_metrics *mt)
{
    int m = f->m, n = t + 1, g = h / (f->n_q / f->n_kv);
    double div = g_inv > 0 ? g_inv : sqrt(m);
    int lo = g_win > 0 && t - g_win + 1 > 0 ? t - g_win + 1 : 0; /* keys t-W+1 .. t */
    double *z = malloc(sizeof(double) * 4 * (size_t)n), *zh = z + n, *p = z + 2 * n,
           *ph = z + 3 * n;
    float *row = malloc(sizeof(float) * (size_t)m);
    double o[64] = {0}, oh[64] = {0};
    const float *q = f->q + (size_t)h * m;
    for (int kind = 0; kind < 2; kind++)
        for (int i = 0; i < n; i++) {
            const float *x = (kind ? f->v : f->k) + ((size_t)g * f->T + i) * m;
            double e = 0, ehat = 0;
            if (kind == 0) {
                for (int c = 0; c < m; c++)
                    e += (double)q[c] * x[c];
                z[i] = e / div;
            }
            if (i < n_comp) {
                ck_assert_int_eq(f->ops->reconstruct(f->st[kind], g, i, row), FK_OK);
                x = row;
            }
            if (kind == 0) {
                for (int c = 0; c < m; c++)
                    ehat += (double)q[c] * x[c];
                zh[i] = ehat / div;
            } else {
                for (int c = 0; c < m; c++) {
                    o[c] += p[i] * f->v[((size_t)g * f->T + i) * m + c];
                    oh[c] += ph[i] * x[c];
                }
            }
            if (kind == 0 && i == n - 1) {
                double s0 = 0, s1 = 0;
                for (int a = 0; a < n && g_cap > 0; a++) {
                    z[a] = g_cap * tanh(z[a] / g_cap);
                    zh[a] = g_cap * tanh(zh[a] / g_cap);
                }
                for (int a = lo; a < n; a++) {
                    s0 += exp(z[a]);
                    s1 += exp(zh[a]);
                }
                for (int a = 0; a < n; a++) {
                    p[a] = a < lo ? 0 : exp(z[a]) / s0;
                    ph[a] = a < lo ? 0 : exp(zh[a]) / s1;
                }
            }
        }
    double kl = 0, tv = 0, mass = 0, oo = 0, hh = 0, od = 0, dd = 0;
    for (int i = lo; i < n; i++) {
        kl += p[i] * log(p[i] / ph[i]);
        tv += fabs(p[i] - ph[i]) / 2;
    }
    mt->tv = tv;
    for (int i = lo; i < n_comp; i++)
        mass += p[i];
    for (int c = 0; c < m; c++) {
        oo += o[c] * o[c];
        hh += oh[c] * oh[c];
        od += o[c] * oh[c];
        dd += (o[c] - oh[c]) * (o[c] - oh[c]);
    }
    mt->kl = kl;
    mt->mass = mass;
    mt->cos = od / sqrt(oo) / sqrt(hh);
    mt->relerr = sqrt(dd / oo);
    int nv = n - lo; /* the visible keys */
    int *ia = malloc(sizeof(int) * (size_t)nv), *ib = malloc(sizeof(int) * (size_t)nv);
    for (int i = 0; i < nv; i++)
        ia[i] = ib[i] = lo + i;
    sort_key = z;
    qsort(ia, (size_t)nv, sizeof(int), cmp_idx);
    sort_key = zh;
    qsort(ib, (size_t)nv, sizeof(int), cmp_idx);
    const int ks[3] = {1, 8, 32};
    for (int q3 = 0; q3 < 3; q3++) {
        int kk = ks[q3] < nv ? ks[q3] : nv, hit = 0;
        for (int a = 0; a < kk; a++)
            for (int b = 0; b < kk; b++)
                hit += ia[a] == ib[b];
        mt->top[q3] = (double)hit / kk;
    }
    free(ia);
    free(ib);
    free(row);
    free(z);
}

START_TEST(metrics_ranges_and_oracle)
{
    const char *names[] = {"lexico", "gm", "pl", "lexico-adp", "fadkv"};
    long evals = 0, partial_top = 0;
    for (int c = 0; c < 5; c++) {
        struct fix f;
        fix_random(&f, fk_codec_find(names[c]), 16, 3, 6, 64, 48, 4242 + (unsigned long)c);
        struct fk_attn_scratch *s = NULL;
        ck_assert_int_eq(fk_attn_scratch_create(f.m, f.T, f.N + f.T * f.n_kv, f.n_q, &s),
                         FK_OK);
        struct fk_attn_acc acc = {0};
        for (int t = 4; t < 64; t += 7) {
            int nc = t - 3 - t / 5;
            fix_encode_to(&f, nc);
            struct fk_attn_in in = fix_in(&f, t, nc);
            ck_assert_int_eq(fk_attn_eval(&in, s, &acc), FK_OK);
            for (int h = 0; h < f.n_q; h++) {
                struct fk_attn_metrics mt, mo;
                ck_assert_int_eq(fk_attn_scratch_result(s, h, NULL, NULL, &mt), FK_OK);
                oracle(&f, t, nc, h, &mo);
                evals++;
                ck_assert_msg(mt.kl >= 0, "%s: KL %g < 0", names[c], mt.kl);
                ck_assert_msg(kl_close(mt.kl, mo.kl, mo.tv), "%s: KL %.17g vs %.17g",
                              names[c], mt.kl, mo.kl);
                ck_assert(rel_close(mt.tv, mo.tv, 1e-6, 2e-6));
                ck_assert(rel_close(mt.mass, mo.mass, 1e-12, 1e-15));
                ck_assert(rel_close(mt.cos, mo.cos, 1e-6, 1e-12));
                ck_assert(rel_close(mt.relerr, mo.relerr, 1e-6, 1e-12));
                ck_assert(mt.cos >= -1 && mt.cos <= 1 && mt.mass >= 0 && mt.mass <= 1);
                for (int q = 0; q < 3; q++) {
                    ck_assert(mt.top[q] >= 0 && mt.top[q] <= 1);
                    ck_assert_msg(mt.top[q] == mo.top[q], "%s t=%d h=%d top[%d] %g vs %g",
                                  names[c], t, h, q, mt.top[q], mo.top[q]);
                    partial_top += mt.top[q] < 1;
                }
            }
        }
        fk_attn_acc_free(&acc);
        fk_attn_scratch_free(&s);
        fix_free(&f);
    }
    ck_assert_int_gt(evals, 200);
    ck_assert_int_gt(partial_top, 10); /* the overlap check saw real disagreements */
}
END_TEST

/* A layer's recorded attention (dump_hf.py's scaling, softcap and sliding window): the fast
 * path and the naive one against the oracle with the same rules, and not the default's
 * numbers. */
START_TEST(layer_attention_as_recorded)
{
    struct fix f;
    fix_random(&f, fk_codec_find("lexico"), 16, 3, 6, 64, 48, 99);
    struct fk_attn_scratch *s = NULL;
    ck_assert_int_eq(fk_attn_scratch_create(f.m, f.T, f.N + f.T * f.n_kv, f.n_q, &s), FK_OK);
    long evals = 0, moved = 0;
    for (int t = 10; t < 64; t += 9) {
        int nc = t - 4;
        fix_encode_to(&f, nc);
        for (int mode = 0; mode < 3; mode++) {
            struct fk_attn_in in = fix_in(&f, t, nc);
            struct fk_attn_acc acc = {0}, an = {0};
            g_inv = in.inv_scale = mode == 0 ? 2.5 : 0;   /* scaling 0.4 */
            g_cap = in.softcap = mode == 1 ? 1.5 : 0;
            g_win = in.window = mode == 2 ? 6 : 0;
            struct fk_attn_metrics mn[8];
            ck_assert_int_eq(fk_attn_eval(&in, s, &acc), FK_OK);
            ck_assert_int_eq(fk_attn_eval_naive_out(&in, &an, NULL, mn), FK_OK);
            for (int h = 0; h < f.n_q; h++) {
                struct fk_attn_metrics mt, mo, md;
                ck_assert_int_eq(fk_attn_scratch_result(s, h, NULL, NULL, &mt), FK_OK);
                oracle(&f, t, nc, h, &mo);
                ck_assert_msg(kl_close(mt.kl, mo.kl, mo.tv), "mode %d t %d: KL %.17g vs %.17g",
                              mode, t, mt.kl, mo.kl);
                ck_assert(kl_close(mn[h].kl, mo.kl, mo.tv));
                ck_assert(rel_close(mt.tv, mo.tv, 1e-6, 2e-6));
                ck_assert(rel_close(mt.mass, mo.mass, 1e-12, 1e-15));
                ck_assert(rel_close(mt.cos, mo.cos, 1e-6, 1e-12));
                ck_assert(rel_close(mn[h].cos, mo.cos, 1e-6, 1e-12));
                for (int q = 0; q < 3; q++)
                    ck_assert(mt.top[q] == mo.top[q]);
                double gi = g_inv, gc = g_cap;
                int gw = g_win;
                g_inv = g_cap = 0, g_win = 0;
                oracle(&f, t, nc, h, &md); /* the default rules */
                g_inv = gi, g_cap = gc, g_win = gw;
                moved += fabs(md.kl - mo.kl) > 1e-9 * (1 + md.kl);
                evals++;
            }
            fk_attn_acc_free(&acc);
            fk_attn_acc_free(&an);
        }
    }
    g_inv = g_cap = 0, g_win = 0;
    ck_assert_int_gt(evals, 100);
    ck_assert_int_gt(moved, evals * 9 / 10); /* the rules change the numbers */
    fk_attn_scratch_free(&s);
    fix_free(&f);
}
END_TEST

/* fk_attn_topk against a full sort on arrays full of ties (values in {0, 1, 2, 3}), for
 * every k around the list lengths. */
START_TEST(topk_matches_sort_with_ties)
{
    gsl_rng *rng = gsl_rng_alloc(gsl_rng_mt19937);
    gsl_rng_set(rng, 31);
    double z[80];
    int idx[80];
    int32_t out[40];
    for (int rep = 0; rep < 200; rep++) {
        int n = 1 + (int)gsl_rng_uniform_int(rng, 80);
        for (int i = 0; i < n; i++) {
            z[i] = (double)gsl_rng_uniform_int(rng, 4);
            idx[i] = i;
        }
        sort_key = z;
        qsort(idx, (size_t)n, sizeof(int), cmp_idx);
        for (int k = 1; k <= 40; k++) {
            int got = fk_attn_topk(z, n, k, out);
            ck_assert_int_eq(got, k < n ? k : n);
            for (int a = 0; a < got; a++)
                ck_assert_msg(out[a] == idx[a], "n %d k %d: position %d is %d, want %d", n, k,
                              a, out[a], idx[a]);
        }
    }
    gsl_rng_free(rng);
}
END_TEST

/* A stand-in codec that forgets everything: every stored row is the zero vector (sparse:
 * an empty code). It lets the test reach o_hat == 0 on both paths. */
static int zero_reconstruct(const void *st, int head, int token, float *out)
{
    memset(out, 0, sizeof(float) * 4);
    return FK_OK;
}

static int zero_sparse_row(const void *st, int head, int token, int *nnz, const int32_t **idx,
                           const float **coef)
{
    static const int32_t none_i[1] = {0};
    static const float none_f[1] = {0};
    *nnz = 0;
    *idx = none_i;
    *coef = none_f;
    return FK_OK;
}

static const float *zero_atoms(const void *st, int *n_atoms)
{
    static const float a[4] = {1, 0, 0, 0};
    *n_atoms = 1;
    return a;
}

/* cos and relerr guards: o == o_hat == 0 gives (1, 0); o != 0 == o_hat gives (0, 1). */
START_TEST(zero_output_guards)
{
    struct fk_codec_ops zdense = {.name = "zero", .caps = 0, .reconstruct = zero_reconstruct};
    struct fk_codec_ops zsparse = {.name = "zero", .caps = FK_CAP_SPARSE,
                                   .reconstruct = zero_reconstruct,
                                   .sparse_row = zero_sparse_row, .atoms = zero_atoms};
    const struct fk_codec_ops *zops[2] = {&zdense, &zsparse};
    float k[3 * 4] = {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0}, v[3 * 4] = {0}, q[4] = {1, 1, 0, 0};
    int dummy = 0;
    struct fk_attn_scratch *s = NULL;
    ck_assert_int_eq(fk_attn_scratch_create(4, 3, 1, 1, &s), FK_OK);
    for (int pass = 0; pass < 2; pass++) {
        v[0] = pass ? 1.0f : 0.0f; /* token 0 (compressed): o != 0 but o_hat == 0 */
        for (int z = 0; z < 2; z++) {
            struct fk_attn_in in = {.m = 4, .n_q_heads = 1, .n_kv_heads = 1, .n_tokens = 3,
                                    .t = 2, .n_comp_k = 2, .n_comp_v = 2, .q = q, .k = k, .v = v,
                                    .ops = zops[z], .kstate = &dummy, .vstate = &dummy};
            struct fk_attn_acc acc = {0}, an = {0};
            struct fk_attn_metrics mt, mn;
            ck_assert_int_eq(fk_attn_eval(&in, s, &acc), FK_OK);
            ck_assert_int_eq(fk_attn_scratch_result(s, 0, NULL, NULL, &mt), FK_OK);
            ck_assert_int_eq(fk_attn_eval_naive_out(&in, &an, NULL, &mn), FK_OK);
            double want_cos = pass ? 0.0 : 1.0, want_rel = pass ? 1.0 : 0.0;
            ck_assert_msg(mt.cos == want_cos && mt.relerr == want_rel,
                          "pass %d codec %d: cos %g relerr %g", pass, z, mt.cos, mt.relerr);
            ck_assert(mn.cos == want_cos && mn.relerr == want_rel);
            ck_assert(mt.kl > 0 && mt.kl == mn.kl); /* z_hat = 0 flattens P_hat */
            fk_attn_acc_free(&acc);
            fk_attn_acc_free(&an);
        }
    }
    fk_attn_scratch_free(&s);
}
END_TEST

/* ---- a scratch sized from the codec, not from a base dictionary ------------------------ */

/* A scratch created for one atom refuses a sparse codec's 32 atoms (the documented
 * contract); reserved from the codec's atoms() count it evaluates, with the same bits as a
 * scratch created large enough: the capacity never changes a number. */
START_TEST(scratch_reserve_from_codec)
{
    struct fix f;
    fix_random(&f, fk_codec_find("lexico"), 16, 2, 4, 40, 32, 11);
    fix_encode_to(&f, 24);
    struct fk_attn_in in = fix_in(&f, 30, 24);
    struct fk_attn_scratch *small = NULL, *big = NULL;
    ck_assert_int_eq(fk_attn_scratch_create(f.m, f.T, 1, f.n_q, &small), FK_OK);
    ck_assert_int_eq(fk_attn_scratch_create(f.m, f.T, f.N, f.n_q, &big), FK_OK);
    struct fk_attn_acc a = {0}, b = {0};
    ck_assert_int_eq(fk_attn_eval(&in, small, &a), FK_EINVAL);
    ck_assert_int_eq(a.n, 0);
    ck_assert_int_eq(fk_attn_scratch_reserve(small, 0), FK_EINVAL);
    int na = 0;
    f.ops->atoms(f.st[0], &na);
    ck_assert_int_eq(na, f.N);
    ck_assert_int_eq(fk_attn_scratch_reserve(small, na), FK_OK);
    ck_assert_int_eq(fk_attn_eval(&in, small, &a), FK_OK);
    ck_assert_int_eq(fk_attn_eval(&in, big, &b), FK_OK);
    ck_assert_int_eq(a.n, f.n_q);
    ck_assert(memcmp(a.cos_vals, b.cos_vals, sizeof(double) * (size_t)a.n) == 0);
    ck_assert(memcmp(&a.kl_sum, &b.kl_sum, sizeof a.kl_sum) == 0);
    ck_assert(memcmp(&a.relerr_sum, &b.relerr_sum, sizeof a.relerr_sum) == 0);
    ck_assert_int_eq(fk_attn_scratch_reserve(small, 3), FK_OK); /* never shrinks */
    ck_assert_int_eq(fk_attn_eval(&in, small, &a), FK_OK);
    fk_attn_acc_free(&a);
    fk_attn_acc_free(&b);
    fk_attn_scratch_free(&small);
    fk_attn_scratch_free(&big);
    fix_free(&f);
}
END_TEST

/* ---- rows the prefill's rewrites changed (fk_attn_in.k_cache, v_cache) ---------------- */

/* The cache side reads the rewritten rows: the codec codes them (as the driver hands them
 * over), the uncompressed ones are read from k_cache / v_cache, the exact side keeps k and
 * v. Checked for every codec, with and without a keep mask: the fast path against the
 * naive one; rewritten rows equal to the exact ones give the very numbers of no cache
 * arrays; and for full, o_hat is the exact attention over the rewritten rows (computed as
 * the exact side of a run whose k and v are those rows). */
START_TEST(cache_rows_every_codec)
{
    const struct fk_codec_ops *ops = fk_codecs[_i];
    struct fix f;
    fix_random(&f, ops, 16, 2, 6, 48, 64, 4242 + (unsigned long)_i);
    size_t n = (size_t)f.n_kv * f.T * f.m;
    float *kc = malloc(sizeof(float) * n), *vc = malloc(sizeof(float) * n);
    float *k0 = f.k, *v0 = f.v;
    memcpy(kc, f.k, sizeof(float) * n);
    memcpy(vc, f.v, sizeof(float) * n);
    for (int g = 0; g < f.n_kv; g++) /* prune 6 channels of tokens < 25, blend some values */
        for (int t = 0; t < 25; t++) {
            float *kr = kc + ((size_t)g * f.T + t) * f.m, *vr = vc + ((size_t)g * f.T + t) * f.m;
            for (int c = 0; c < f.m; c++) {
                if ((c * 5 + g) % 16 < 6)
                    kr[c] = 0.0f;
                if (t % 4 == 1)
                    vr[c] = 0.6f * vr[c] + 0.4f * vr[(c + 3) % f.m];
            }
        }
    int t = 40, nc = ops->buffer ? 36 : 30;
    f.k = kc, f.v = vc; /* the codec is given the rewritten rows */
    fix_encode_to(&f, nc);
    f.k = k0, f.v = v0;
    uint8_t *keep = malloc((size_t)f.n_kv * f.T);
    for (int g = 0; g < f.n_kv; g++)
        for (int j = 0; j < f.T; j++)
            keep[(size_t)g * f.T + j] = j == t || (j * 7 + g) % 4 != 0;
    struct fk_attn_scratch *s = NULL;
    ck_assert_int_eq(fk_attn_scratch_create(f.m, f.T, f.N + f.T * f.n_kv, f.n_q, &s), FK_OK);
    double *ohn = malloc(sizeof(double) * (size_t)f.n_q * f.m);
    struct fk_attn_acc af = {0}, an = {0};
    for (int pass = 0; pass < 2; pass++) {
        struct fk_attn_in in = fix_in(&f, t, nc);
        in.k_cache = kc, in.v_cache = vc;
        in.keep = pass ? keep : NULL;
        ck_assert_msg(fk_attn_eval(&in, s, &af) == FK_OK, "%s: %s", ops->name, fk_errmsg());
        ck_assert_int_eq(fk_attn_eval_naive_out(&in, &an, ohn, NULL), FK_OK);
        for (int h = 0; h < f.n_q; h++) {
            const double *oh;
            ck_assert_int_eq(fk_attn_scratch_result(s, h, NULL, &oh, NULL), FK_OK);
            double dd = 0, nn = 0;
            for (int c = 0; c < f.m; c++) {
                double d = oh[c] - ohn[(size_t)h * f.m + c];
                dd += d * d;
                nn += ohn[(size_t)h * f.m + c] * ohn[(size_t)h * f.m + c];
            }
            ck_assert_msg(sqrt(dd / nn) <= 1e-6, "%s pass %d head %d: o_hat differs by %g",
                          ops->name, pass, h, sqrt(dd / nn));
        }
        if (!(ops->caps & FK_CAP_EXACT) || pass)
            continue;
        /* full: o_hat = the exact attention over the rewritten rows */
        struct fk_attn_in ref = fix_in(&f, t, nc);
        ref.k = kc, ref.v = vc;
        struct fk_attn_acc ar = {0};
        double oh_a[6][16];
        for (int h = 0; h < f.n_q; h++) {
            const double *oh;
            ck_assert_int_eq(fk_attn_scratch_result(s, h, NULL, &oh, NULL), FK_OK);
            memcpy(oh_a[h], oh, sizeof(double) * (size_t)f.m);
        }
        ck_assert_int_eq(fk_attn_eval(&ref, s, &ar), FK_OK);
        for (int h = 0; h < f.n_q; h++) {
            const double *o;
            ck_assert_int_eq(fk_attn_scratch_result(s, h, &o, NULL, NULL), FK_OK);
            for (int c = 0; c < f.m; c++)
                ck_assert_msg(fabs(o[c] - oh_a[h][c]) <= 1e-9 * (1 + fabs(o[c])),
                              "full: head %d coordinate %d: %.17g vs %.17g", h, c, oh_a[h][c],
                              o[c]);
        }
        fk_attn_acc_free(&ar);
    }
    /* rewritten rows equal to the exact ones: the numbers of no cache arrays, bit for bit */
    for (int kind = 0; kind < 2; kind++)
        ops->close(f.st[kind]);
    f.st[0] = f.st[1] = NULL;
    f.done = f.step = 0;
    for (int kind = 0; kind < 2; kind++) {
        free(f.gram[kind]);
        f.gram[kind] = NULL;
    }
    fix_open(&f);
    fix_encode_to(&f, nc);
    memcpy(kc, f.k, sizeof(float) * n);
    memcpy(vc, f.v, sizeof(float) * n);
    for (int pass = 0; pass < 2; pass++) {
        struct fk_attn_in plain = fix_in(&f, t, nc);
        plain.keep = pass ? keep : NULL;
        struct fk_attn_in in = plain;
        in.k_cache = kc, in.v_cache = vc;
        struct fk_attn_metrics m0[6], m1[6];
        ck_assert_int_eq(fk_attn_eval(&plain, s, &af), FK_OK);
        for (int h = 0; h < f.n_q; h++)
            ck_assert_int_eq(fk_attn_scratch_result(s, h, NULL, NULL, &m0[h]), FK_OK);
        ck_assert_int_eq(fk_attn_eval(&in, s, &af), FK_OK);
        for (int h = 0; h < f.n_q; h++) {
            ck_assert_int_eq(fk_attn_scratch_result(s, h, NULL, NULL, &m1[h]), FK_OK);
            ck_assert_msg(memcmp(&m0[h].cos, &m1[h].cos, sizeof(double)) == 0 &&
                          memcmp(&m0[h].rkl, &m1[h].rkl, sizeof(double)) == 0 &&
                          (isnan(m0[h].kl) ? isnan(m1[h].kl) : m0[h].kl == m1[h].kl),
                          "%s pass %d head %d: cos %.17g vs %.17g", ops->name, pass, h,
                          m0[h].cos, m1[h].cos);
        }
    }
    fk_attn_acc_free(&af);
    fk_attn_acc_free(&an);
    free(ohn);
    free(keep);
    free(kc);
    free(vc);
    fk_attn_scratch_free(&s);
    fix_free(&f);
}
END_TEST

static Suite *attn_suite(void)
{
    Suite *s = suite_create("attn");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, fast_equals_naive_every_codec, 0, n_codecs());
    tcase_add_loop_test(tc, eviction_mask_every_codec, 0, n_codecs());
    tcase_add_loop_test(tc, cache_rows_every_codec, 0, n_codecs());
    tcase_add_test(tc, full_codec_exact);
    tcase_add_test(tc, gqa_mapping_hand_case);
    tcase_add_test(tc, topk_ties_to_smaller_index);
    tcase_add_test(tc, topk_matches_sort_with_ties);
    tcase_add_test(tc, zero_output_guards);
    tcase_add_test(tc, future_tokens_never_matter);
    tcase_add_test(tc, skipped_step_and_checks);
    tcase_add_test(tc, metrics_ranges_and_oracle);
    tcase_add_test(tc, layer_attention_as_recorded);
    tcase_add_test(tc, scratch_reserve_from_codec);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return fk_suite_run(attn_suite());
}
