/* SPDX-License-Identifier: MIT
 * What the eviction policies share (core/fk_evict.h): the attention-score kernel (exact
 * keys, recorded queries; a decode step reads each kept key row once for its KV head's G
 * query rows, the prefill's causal sums are one SGEMM per block of queries; GQA group
 * averaged per KV head as kvpress does: never repeat_kv), the kept-set helpers and the
 * top-k keep rule.
 */
#ifndef FK_EVICT_ATTN_H
#define FK_EVICT_ATTN_H

#include <stddef.h>
#include <stdint.h>

#include "core/fk_evict.h"
#include "evict/fk_evict_mirror.h"

/* Working memory of the kernel, grown on demand; zero-initialise, free with _free. */
struct fk_evict_scratch {
    float *qg;                   /* gathered queries [rows][m] */
    float *c;                    /* logits [rows][n] */
    double *p;                   /* softmax rows [G][n] and G reciprocal sums */
    float *zs;                   /* the mirror's dot products [G][span] */
    int32_t *sl;                 /* the mirror slots of the kept keys [n] */
    size_t cap_qg, cap_c, cap_p, cap_zs, cap_sl;
    struct fk_mirror mr;         /* the kept keys of every KV head (opened on first use) */
};
void fk_evict_scratch_free(struct fk_evict_scratch *s);

/* score[i], i < n: the attention of token tq's query on key idx[i] of KV head h, as the
 * mean over the G query heads of h of softmax_i(logit(q_j, k_idx[i])) over the n keys
 * idx[0..n) (the kept set the query sees; logits as struct fk_evict_env says). FK_EINVAL
 * when tq's query is not in the view. */
int fk_evict_attn_group(const struct fk_evict_env *env, const struct fk_evict_view *v, int h,
                        int tq, const int32_t *idx, int n, struct fk_evict_scratch *s,
                        double *score);

/* Causal attention of several queries over the keys 0 .. L-1 of KV head h (no eviction
 * yet): for each query token tq in qtok[0..nq) (tq < L), the softmax of each of the G query
 * heads over keys 0 .. tq, summed over queries and heads, times `scale`, added to acc[j]
 * (j < L). Queries in blocks, one SGEMM per block. */
int fk_evict_attn_causal_sum(const struct fk_evict_env *env, const struct fk_evict_view *v,
                             int h, const int32_t *qtok, int nq, int L, double scale,
                             struct fk_evict_scratch *s, double *acc);

/* y[i] = exp(x[i]), i < n (x and y distinct): the softmax's vectorised exp, within 2 ulp
 * of the exact value for |x| <= 708, the C library's exp elsewhere. */
void fk_evict_exp(const double *x, int n, double *y);

/* The kept tokens of head h in [lo, hi), ascending, into idx; returns their count. */
int fk_evict_kept(const struct fk_evict_env *env, int h, int lo, int hi, int32_t *idx);

/* Among the n candidates idx[i] (distinct tokens, all kept in keep_h) with scores score[i],
 * keeps the k best (k >= 0) and clears the mask bits of the others in row keep_h: higher
 * score first, ties to the lower token. tmp: room for n (score, index) pairs ([2 n]
 * doubles). */
void fk_evict_keep_top(const double *score, const int32_t *idx, int n, int k,
                       uint8_t *keep_h, double *tmp);

#endif
