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
    free(s->kg);
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

/* Softmax of the n logits c (float) in double into p; returns nothing (max subtracted). */
static void softmax_row(const struct fk_evict_env *env, const float *c, int n, double scale,
                        double *p)
{
    double mx = -INFINITY;
    if (env->softcap > 0)
        for (int i = 0; i < n; i++) {
            p[i] = logit(env, c[i], scale);
            mx = p[i] > mx ? p[i] : mx;
        }
    else /* the plain logits: the same numbers as logit(), without its branch */
        for (int i = 0; i < n; i++) {
            p[i] = c[i] / scale;
            mx = p[i] > mx ? p[i] : mx;
        }
    double sum = 0;
    for (int i = 0; i < n; i++) {
        p[i] = exp(p[i] - mx);
        sum += p[i];
    }
    double inv = 1.0 / sum;
    for (int i = 0; i < n; i++)
        p[i] *= inv;
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

#define LANES 8

/* z[g][i] = q_g . k_{idx[i]} for the G query rows q [G][m] and the n key rows idx[] of kh:
 * each key row read once for the G queries, in place (no gathered copy, no dropped row
 * touched). Coordinate c goes to float lane c % LANES, the lanes summed in a fixed pairwise
 * order; nothing is reassociated (ISO C, no contraction), so every clone gives the same
 * bits. A BLAS SGEMM of G = 3 rows packed the whole key block at every call and cost more
 * than the products; SGEMV per query head read the block G times. */
FK_CLONES static void dots_rows(const float *restrict q, int G, const float *restrict kh,
                                const int32_t *restrict idx, int n, int m, float *restrict z)
{
    int mv = m / LANES * LANES;
    for (int i = 0; i < n; i++) {
        const float *k = kh + (size_t)idx[i] * m;
        for (int g = 0; g < G; g++) {
            const float *qg = q + (size_t)g * m;
            float acc[LANES] = {0};
            for (int c = 0; c < mv; c += LANES)
                for (int l = 0; l < LANES; l++)
                    acc[l] += qg[c + l] * k[c + l];
            for (int c = mv; c < m; c++)
                acc[c - mv] += qg[c] * k[c];
            float s4[4], s2[2];
            for (int l = 0; l < 4; l++)
                s4[l] = acc[l] + acc[l + 4];
            s2[0] = s4[0] + s4[2];
            s2[1] = s4[1] + s4[3];
            z[(size_t)g * n + i] = s2[0] + s2[1];
        }
    }
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
    FK_TRY(reserve((void **)&s->p, &s->cap_p, (size_t)n, sizeof(double)));
    FK_TRY(gather_q(env, v, h, tq, s->qg, (size_t)m));
    const float *kh = v->k + (size_t)h * T * m;
    dots_rows(s->qg, G, kh, idx, n, m, s->c);
    double scale = inv_scale(env);
    for (int i = 0; i < n; i++)
        score[i] = 0;
    for (int g = 0; g < G; g++) {
        softmax_row(env, s->c + (size_t)g * n, n, scale, s->p);
        for (int i = 0; i < n; i++)
            score[i] += s->p[i];
    }
    for (int i = 0; i < n; i++)
        score[i] /= G;
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
    for (int j = lo < 0 ? 0 : lo; j < hi; j++)
        if (k[j])
            idx[n++] = j;
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
