/* SPDX-License-Identifier: MIT
 * The eviction policies' shared attention kernel and keep rule (fk_evict_attn.h).
 */
#include "evict/fk_evict_attn.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/fk_err.h"
#include "kernels/fk_simd.h"

void fk_evict_scratch_free(struct fk_evict_scratch *s)
{
    fk_mirror_close(&s->mr);
    free(s->zs);
    free(s->sl);
    free(s->qg);
    free(s->c);
    free(s->p);
    memset(s, 0, sizeof *s);
}

static int reserve(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return FK_OK;
    void *n = realloc(*p, need * elem);
    if (!n)
        return fk_err(FK_ENOMEM, "eviction scores: out of memory (%zu bytes)", need * elem);
    *p = n;
    *cap = need;
    return FK_OK;
}

#define LANES 8

/* The layer's logit of a scaled dot product (soft cap when the layer has one). */
static double logit(const struct fk_evict_env *env, double dot, double scale)
{
    double z = dot / scale;
    return env->softcap > 0 ? env->softcap * tanh(z / env->softcap) : z;
}

static double inv_scale(const struct fk_evict_env *env)
{
    return env->inv_scale > 0 ? env->inv_scale : sqrt((double)env->head_dim);
}

/* The G query rows of token tq of KV head h into s->qg at row offset r0 (of G*stride). */
static int gather_q(const struct fk_evict_env *env, const struct fk_evict_view *v, int h,
                    int tq, float *dst, size_t ld_head)
{
    int G = env->n_q_heads / env->n_kv_heads, m = env->head_dim;
    int row = tq >= 0 && tq < env->n_tokens && v->qrow ? v->qrow[tq] : -1;
    if (row < 0 || row >= v->n_qrows)
        return fk_err(FK_EINVAL, "eviction scores: layer %d has no recorded query of token %d",
                      env->layer, tq);
    for (int g = 0; g < G; g++)
        memcpy(dst + (size_t)g * ld_head,
               v->q + ((size_t)(h * G + g) * v->n_qrows + row) * m, sizeof(float) * (size_t)m);
    return FK_OK;
}

/* exp(x) for |x| <= 708 (the caller checks), branch-free so that loops of it
 * vectorise: x = k ln2 + r, |r| <= ln2 / 2 + 2^-40, k by the round-to-nearest shifter, r by
 * fdlibm's two-part ln2 (k ln2hi exact), exp(r) by its Taylor polynomial of degree 13 in
 * Horner form (truncation below 5e-18 relative), 2^k from k's bits (|k| <= 1022). Error below 2 ulp (the
 * test measures it against expl); no contraction and independent lanes, so every clone
 * gives the same bits. */
static inline double exp_core(double x)
{
    const double shift = 0x1.8p52, log2e = 0x1.71547652b82fep0;
    const double ln2hi = 0x1.62e42fee00000p-1, ln2lo = 0x1.a39ef35793c76p-33;
    double t = x * log2e + shift;
    double kd = t - shift;
    double r = (x - kd * ln2hi) - kd * ln2lo;
    double p = 1.0 / 6227020800.0;
    p = p * r + 1.0 / 479001600.0;
    p = p * r + 1.0 / 39916800.0;
    p = p * r + 1.0 / 3628800.0;
    p = p * r + 1.0 / 362880.0;
    p = p * r + 1.0 / 40320.0;
    p = p * r + 1.0 / 5040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    uint64_t tb, sb;
    memcpy(&tb, &t, sizeof tb);
    sb = (tb + 1023u) << 52; /* t's low bits are 2^51 + k: the exponent field k + 1023 */
    double sc;
    memcpy(&sc, &sb, sizeof sc);
    return p * sc;
}

/* 1 when |x| <= 708 (not for NaN), else 0, and x or 0 into *xc: tested on the bits, as
 * floating-point comparisons (which may trap) would keep the loops from vectorising. */
static inline uint64_t exp_in_range(double x, double *xc)
{
    uint64_t b;
    memcpy(&b, &x, sizeof b);
    uint64_t ok = (b & 0x7fffffffffffffffu) <= 0x4086200000000000u; /* 708.0 */
    b &= (uint64_t)0 - ok;
    memcpy(xc, &b, sizeof b);
    return ok;
}

FK_CLONES512 void fk_evict_exp(const double *restrict x, int n, double *restrict y)
{
    uint64_t bad = 0;
    for (int i = 0; i < n; i++) {
        double xc;
        bad |= exp_in_range(x[i], &xc) ^ 1u;
        y[i] = exp_core(xc);
    }
    if (bad)
        for (int i = 0; i < n; i++)
            if (!(fabs(x[i]) <= 708.0))
                y[i] = exp(x[i]);
}

/* The largest of the n floats c (lane-wise; the maximum does not depend on the order). */
FK_CLONES512 static float max_row(const float *restrict c, int n)
{
    float m8[LANES];
    for (int l = 0; l < LANES; l++)
        m8[l] = -INFINITY;
    int nv = n / LANES * LANES;
    for (int i = 0; i < nv; i += LANES)
        for (int l = 0; l < LANES; l++)
            m8[l] = c[i + l] > m8[l] ? c[i + l] : m8[l];
    float m = -INFINITY;
    for (int i = nv; i < n; i++)
        m = c[i] > m ? c[i] : m;
    for (int l = 0; l < LANES; l++)
        m = m8[l] > m ? m8[l] : m;
    return m;
}

/* p[i] = exp(c[i] / scale - mx): the plain logits' shifted exponentials, the library's exp
 * outside exp_core's range. */
FK_CLONES512 static void exp_shifted(const float *restrict c, int n, double scale, double mx,
                                  double *restrict p)
{
    uint64_t bad = 0;
    for (int i = 0; i < n; i++) {
        double xc;
        bad |= exp_in_range(c[i] / scale - mx, &xc) ^ 1u;
        p[i] = exp_core(xc);
    }
    if (bad)
        for (int i = 0; i < n; i++) {
            double x = c[i] / scale - mx;
            if (!(fabs(x) <= 708.0))
                p[i] = exp(x);
        }
}

/* p[i] = exp(logit(c[i]) - max_j logit(c[j])), i < n: the unnormalised softmax of the n
 * logits c (float) in double. The plain logits' maximum is taken on the floats: dividing by
 * scale > 0 keeps the order, so it is the same double as the maximum of c[i] / scale. */
static void exp_row(const struct fk_evict_env *env, const float *c, int n, double scale,
                    double *p)
{
    if (env->softcap > 0) {
        double mx = -INFINITY;
        for (int i = 0; i < n; i++) {
            p[i] = logit(env, c[i], scale);
            mx = p[i] > mx ? p[i] : mx;
        }
        for (int i = 0; i < n; i++)
            p[i] = exp(p[i] - mx);
    } else { /* the plain logits: the same numbers as logit(), without its branch */
        exp_shifted(c, n, scale, (double)max_row(c, n) / scale, p);
    }
}

/* Softmax of the n logits c (float) in double into p (max subtracted). */
static void softmax_row(const struct fk_evict_env *env, const float *c, int n, double scale,
                        double *p)
{
    exp_row(env, c, n, scale, p);
    double sum = 0;
    for (int i = 0; i < n; i++)
        sum += p[i];
    double inv = 1.0 / sum;
    for (int i = 0; i < n; i++)
        p[i] *= inv;
}

/* out[i] = src[at[i]], i < n (vectorised gathers in the AVX-512 clone). */
FK_CLONES512 static void gather_i32(const int32_t *restrict src, const int32_t *restrict at,
                                    int n, int32_t *restrict out)
{
    for (int i = 0; i < n; i++)
        out[i] = src[at[i]];
}

FK_CLONES512 static void gather_f32(const float *restrict src, const int32_t *restrict at, int n,
                                    float *restrict out)
{
    for (int i = 0; i < n; i++)
        out[i] = src[at[i]];
}

/* score[i] = (sum over g in order of p[g][i] inv[g]) / G, i < n: the group mean of the
 * normalised rows (element by element, so every clone gives the same bits). */
FK_CLONES512 static void group_mean(const double *restrict p, const double *restrict inv, int G,
                                    int n, double *restrict score)
{
    for (int i = 0; i < n; i++)
        score[i] = 0;
    for (int g = 0; g < G; g++)
        for (int i = 0; i < n; i++)
            score[i] += p[(size_t)g * n + i] * inv[g];
    for (int i = 0; i < n; i++)
        score[i] /= G;
}

int fk_evict_attn_group(const struct fk_evict_env *env, const struct fk_evict_view *v, int h,
                        int tq, const int32_t *idx, int n, struct fk_evict_scratch *s,
                        double *score)
{
    int G = env->n_q_heads / env->n_kv_heads, m = env->head_dim, T = env->n_tokens;
    if (n < 1)
        return FK_OK;
    FK_TRY(reserve((void **)&s->qg, &s->cap_qg, (size_t)G * m, sizeof(float)));
    FK_TRY(reserve((void **)&s->c, &s->cap_c, (size_t)G * n, sizeof(float)));
    FK_TRY(reserve((void **)&s->p, &s->cap_p, (size_t)G * n + G, sizeof(double)));
    FK_TRY(gather_q(env, v, h, tq, s->qg, (size_t)m));
    /* the dot products over the mirrored kept keys, then in the order of idx */
    if (!s->mr.head)
        FK_TRY(fk_mirror_open(&s->mr, env->n_kv_heads, T, m));
    FK_TRY(fk_mirror_sync(&s->mr, h, v->k + (size_t)h * T * m, idx, n));
    size_t span = (size_t)fk_mirror_span(&s->mr, h);
    FK_TRY(reserve((void **)&s->zs, &s->cap_zs, (size_t)G * span, sizeof(float)));
    fk_mirror_dots(&s->mr, h, s->qg, G, s->zs, span);
    FK_TRY(reserve((void **)&s->sl, &s->cap_sl, (size_t)n, sizeof(int32_t)));
    gather_i32(s->mr.slot + (size_t)h * T, idx, n, s->sl); /* the slots, once for the G rows */
    for (int g = 0; g < G; g++)
        gather_f32(s->zs + (size_t)g * span, s->sl, n, s->c + (size_t)g * n);
    double scale = inv_scale(env), *p = s->p, *inv = s->p + (size_t)G * n;
    for (int g = 0; g < G; g++)
        exp_row(env, s->c + (size_t)g * n, n, scale, p + (size_t)g * n);
    /* each row's sum in index order (the G = 3 sums side by side: one chain of adds each) */
    if (G == 3) {
        double s0 = 0, s1 = 0, s2 = 0;
        for (int i = 0; i < n; i++) {
            s0 += p[i];
            s1 += p[(size_t)n + i];
            s2 += p[2 * (size_t)n + i];
        }
        inv[0] = 1.0 / s0;
        inv[1] = 1.0 / s1;
        inv[2] = 1.0 / s2;
    } else {
        for (int g = 0; g < G; g++) {
            double sum = 0;
            for (int i = 0; i < n; i++)
                sum += p[(size_t)g * n + i];
            inv[g] = 1.0 / sum;
        }
    }
    group_mean(p, inv, G, n, score);
    return FK_OK;
}

#define QBLOCK 64 /* queries per SGEMM of the causal sums */

int fk_evict_attn_causal_sum(const struct fk_evict_env *env, const struct fk_evict_view *v,
                             int h, const int32_t *qtok, int nq, int L, double scale,
                             struct fk_evict_scratch *s, double *acc)
{
    int G = env->n_q_heads / env->n_kv_heads, m = env->head_dim, T = env->n_tokens;
    if (nq < 1 || L < 1)
        return FK_OK;
    int rows = G * (nq < QBLOCK ? nq : QBLOCK);
    FK_TRY(reserve((void **)&s->qg, &s->cap_qg, (size_t)rows * m, sizeof(float)));
    FK_TRY(reserve((void **)&s->c, &s->cap_c, (size_t)rows * L, sizeof(float)));
    FK_TRY(reserve((void **)&s->p, &s->cap_p, (size_t)L, sizeof(double)));
    const float *kh = v->k + (size_t)h * T * m;
    double sc = inv_scale(env);
    for (int b0 = 0; b0 < nq; b0 += QBLOCK) {
        int nb = nq - b0 < QBLOCK ? nq - b0 : QBLOCK, hi = 0;
        /* rows ordered (query, head): row b*G + g */
        for (int b = 0; b < nb; b++) {
            int tq = qtok[b0 + b];
            if (tq < 0 || tq >= L)
                return fk_err(FK_EINVAL, "eviction scores: query token %d outside keys 0..%d",
                              tq, L - 1);
            FK_TRY(gather_q(env, v, h, tq, s->qg + (size_t)b * G * m, (size_t)m));
            if (tq + 1 > hi)
                hi = tq + 1;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nb * G, hi, m, 1.0f, s->qg, m, kh,
                    m, 0.0f, s->c, hi);
        for (int b = 0; b < nb; b++) {
            int tq = qtok[b0 + b];
            for (int g = 0; g < G; g++) {
                softmax_row(env, s->c + (size_t)(b * G + g) * hi, tq + 1, sc, s->p);
                for (int j = 0; j <= tq; j++)
                    acc[j] += scale * s->p[j];
            }
        }
    }
    return FK_OK;
}

int fk_evict_kept(const struct fk_evict_env *env, int h, int lo, int hi, int32_t *idx)
{
    const uint8_t *k = env->keep + (size_t)h * env->n_tokens;
    int n = 0;
    for (int j = lo < 0 ? 0 : lo; j < hi; j++) { /* branch-free: idx[n] is rewritten */
        idx[n] = j;
        n += k[j] != 0;
    }
    return n;
}

static int by_score(const void *a, const void *b)
{
    const double *x = a, *y = b;
    if (x[0] != y[0])
        return x[0] > y[0] ? -1 : 1;
    return x[1] < y[1] ? -1 : x[1] > y[1];
}

void fk_evict_keep_top(const double *score, const int32_t *idx, int n, int k,
                       uint8_t *keep_h, double *tmp)
{
    if (k >= n)
        return;
    if (k < 0)
        k = 0;
    if (n - k <= 8) {
        /* a few to drop (a decode step's one token): the worst one at a time, lower score
         * first, the higher token on ties, as the sorted order below drops them */
        for (int e = 0; e < n - k; e++) {
            int w = -1;
            for (int i = 0; i < n; i++)
                if (keep_h[idx[i]] && (w < 0 || score[i] < score[w] ||
                                       (score[i] == score[w] && idx[i] > idx[w])))
                    w = i;
            keep_h[idx[w]] = 0;
        }
        return;
    }
    for (int i = 0; i < n; i++) {
        tmp[2 * i] = score[i];
        tmp[2 * i + 1] = idx[i];
    }
    qsort(tmp, (size_t)n, 2 * sizeof(double), by_score);
    for (int i = k; i < n; i++)
        keep_h[(int)tmp[2 * i + 1]] = 0;
}
