/* SPDX-License-Identifier: MIT
 * The group quantiser the quantisation family shares: asymmetric min/scale, round to
 * nearest (spec families.md 1.1, KIVI's triton_quantize_and_pack_along_last_dim, and 1.2,
 * quanto's MaxOptimizer: scale = (max - min) / (2^b - 1), shift = -min, the same numbers).
 * For a group of n values x_i (a channel over tokens, or channels of one token):
 *   lo = fp16(min x), step = fp16((max x - min x) / (2^b - 1))         (the stored metadata)
 *   q_i = round-half-even(clamp((x_i - lo) / step, 0, 2^b - 1))         (from the stored lo, step)
 *   x_hat_i = q_i * step + lo
 * in float32 arithmetic (the references compute in the activation dtype; a value can land
 * on the other side of a rounding tie there). A constant group has step 0: q = 0 and
 * x_hat = lo, never NaN (the references divide 0 by 0). Metadata beyond +-65504 saturates
 * to it, so that x_hat stays finite. The grids are kept decoded (floats holding fp16
 * values): reconstruct() runs once per row and decode step, and decoding fp16 there would
 * dominate it.
 *
 * Header only (static inline): a family's library is built from its codec files alone.
 */
#ifndef FK_QUANT_GROUP_H
#define FK_QUANT_GROUP_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/fk_err.h"
#include "core/fk_codec.h"
#include "kernels/fk_sparse.h"

#define FKQ_FP16_MAX 65504.0f

/* One group's grid: origin and step, fp16 values. */
struct fkq_grid {
    float lo, step;
};

/* The fp16 value of v, saturated to the largest finite half. */
static inline float fkq_half(float v)
{
    v = v > FKQ_FP16_MAX ? FKQ_FP16_MAX : v < -FKQ_FP16_MAX ? -FKQ_FP16_MAX : v;
    return fk_fp16_decode(fk_fp16_encode(v));
}

/* Quantises the n values x[0], x[xs], x[2 xs], ... into q[0], q[qs], ...; returns the
 * group's grid. */
static inline struct fkq_grid fkq_code(const float *x, ptrdiff_t xs, int n, int bits,
                                       uint8_t *q, ptrdiff_t qs)
{
    int top = (1 << bits) - 1;
    float mn = x[0], mx = x[0];
    for (int i = 1; i < n; i++) {
        float v = x[i * xs];
        mn = v < mn ? v : mn;
        mx = v > mx ? v : mx;
    }
    struct fkq_grid g = {fkq_half(mn), fkq_half((float)(((double)mx - mn) / top))};
    for (int i = 0; i < n; i++) {
        float v = g.step > 0 ? (x[i * xs] - g.lo) / g.step : 0.0f;
        v = v < 0 ? 0 : v > (float)top ? (float)top : v;
        q[i * qs] = (uint8_t)lrintf(v); /* the default rounding mode: half to even */
    }
    return g;
}

static inline float fkq_value(struct fkq_grid g, uint8_t q)
{
    return (float)q * g.step + g.lo;
}

/* A row of m values in groups of G contiguous channels (m % G == 0): codes q[m] and the
 * m / G grids. */
static inline void fkq_code_row(const float *x, int m, int G, int bits, uint8_t *q,
                                struct fkq_grid *grid)
{
    for (int j = 0; j < m / G; j++)
        grid[j] = fkq_code(x + j * G, 1, G, bits, q + j * G, 1);
}

static inline void fkq_row_value(const uint8_t *q, int m, int G, const struct fkq_grid *grid,
                                 float *out)
{
    for (int c = 0; c < m; c++)
        out[c] = fkq_value(grid[c / G], q[c]);
}

/* What encode() reports for a vector x stored as xh: the relative error (the codes are the
 * only coefficients, so err_enc = err) and FK_VEC_ZERO for a zero vector (err 0; a
 * quantiser whose groups span tokens need not give it back as zero). */
static inline void fkq_vec_out(const float *x, const float *xh, int m, struct fk_vec_out *out)
{
    double e = 0, xx = 0;
    for (int j = 0; j < m; j++) {
        double r = (double)x[j] - xh[j];
        e += r * r;
        xx += (double)x[j] * x[j];
    }
    int zero = xx <= 1e-30;
    float err = zero ? 0.0f : (float)sqrt(e / xx);
    *out = (struct fk_vec_out){.err_enc = err, .err = err, .nnz = m,
                               .flags = zero ? FK_VEC_ZERO : 0};
}

/* What a quantiser of the family keeps per stream group: codes, grids, rows per head and
 * the scratch of one event. */
struct fkq_store {
    int m, n_heads, n_tokens, bits;
    uint8_t *q;                  /* [n_heads][n_tokens][m] codes, one per byte */
    struct fkq_grid *grid;       /* [n_grids], laid out by the codec */
    int32_t *n_rows;             /* [n_heads] stored rows */
    int32_t *cnt, *off;          /* [n_heads], [n_heads + 1]: one event's tokens per head */
    int32_t *idx;                /* [cap_idx] one event's vectors by head (fkq_by_head) */
    size_t cap_idx;
    float *col;                  /* [n_col] the codec's scratch values */
    uint8_t *qcol;               /* [n_col] and codes */
    float *xh;                   /* [m] a reconstruction */
    float *rec;                  /* [n_heads][n_tokens][m] every stored row as value()
                                  * reconstructs it, kept current by fkq_commit: attention
                                  * reads every compressed row at every step, and a copy costs
                                  * less than decoding the grids again */
};

static inline void fkq_store_free(struct fkq_store *s)
{
    free(s->q);
    free(s->grid);
    free(s->n_rows);
    free(s->cnt);
    free(s->off);
    free(s->idx);
    free(s->col);
    free(s->qcol);
    free(s->xh);
    free(s->rec);
    memset(s, 0, sizeof *s);
}

/* Allocates the store of one stream group (on failure what was allocated stays for
 * fkq_store_free, as the engine closes half-opened states). */
static inline int fkq_store_init(struct fkq_store *s, const struct fk_stream_env *env,
                                 int bits, size_t n_grids, size_t n_col, const char *codec)
{
    s->m = env->head_dim;
    s->n_heads = env->n_heads;
    s->n_tokens = env->n_tokens;
    s->bits = bits;
    size_t rows = (size_t)env->n_heads * (size_t)env->n_tokens;
    s->q = malloc(rows * (size_t)env->head_dim + 1);
    s->grid = malloc(sizeof(struct fkq_grid) * n_grids + 1);
    s->n_rows = calloc((size_t)env->n_heads + 1, sizeof(int32_t));
    s->cnt = calloc((size_t)env->n_heads + 1, sizeof(int32_t));
    s->off = calloc((size_t)env->n_heads + 1, sizeof(int32_t));
    s->col = malloc(sizeof(float) * n_col + 1);
    s->qcol = malloc(n_col + 1);
    s->xh = malloc(sizeof(float) * (size_t)env->head_dim + 1);
    s->rec = malloc(sizeof(float) * rows * (size_t)env->head_dim + 1);
    if (!s->q || !s->grid || !s->n_rows || !s->cnt || !s->off || !s->col || !s->qcol || !s->xh ||
        !s->rec)
        return fk_err(FK_ENOMEM, "out of memory (%s state)", codec);
    return FK_OK;
}

static inline size_t fkq_row(const struct fkq_store *s, int h, int t)
{
    return (size_t)h * s->n_tokens + t;
}

static inline double fkq_rows_stored(const struct fkq_store *s)
{
    double rows = 0;
    for (int h = 0; h < s->n_heads; h++)
        rows += s->n_rows[h];
    return rows;
}

/* The checks every event passes before anything is stored: heads in range, each head's
 * tokens consecutive from the rows it holds, within n_tokens, finite values. On success
 * s->cnt[h] = the event's tokens of head h. */
static inline int fkq_check_event(struct fkq_store *s, const char *codec,
                                  const struct fk_event *ev)
{
    for (int h = 0; h < s->n_heads; h++)
        s->cnt[h] = 0;
    for (int i = 0; i < ev->n; i++) {
        int h = ev->head[i], t = ev->token[i];
        if (h < 0 || h >= s->n_heads || t != s->n_rows[h] + s->cnt[h] || t >= s->n_tokens)
            return fk_err(FK_EINVAL, "%s: event row (head %d, token %d) out of order", codec,
                          h, t);
        const float *x = ev->x + (size_t)i * s->m;
        for (int j = 0; j < s->m; j++)
            if (!isfinite(x[j]))
                return fk_err(FK_EINVAL, "%s: vector (head %d, token %d) is not finite",
                              codec, h, t);
        s->cnt[h]++;
    }
    return FK_OK;
}

/* The vectors of a checked event grouped by head, each head's in token order: head h's k-th
 * token is vector s->idx[s->off[h] + k] of the event. */
static inline int fkq_by_head(struct fkq_store *s, const struct fk_event *ev)
{
    if ((size_t)ev->n >= s->cap_idx) {
        void *p = realloc(s->idx, sizeof(int32_t) * ((size_t)ev->n + 1));
        if (!p)
            return fk_err(FK_ENOMEM, "out of memory (%d event rows)", ev->n);
        s->idx = p;
        s->cap_idx = (size_t)ev->n + 1;
    }
    s->off[0] = 0;
    for (int h = 0; h < s->n_heads; h++)
        s->off[h + 1] = s->off[h] + s->cnt[h];
    for (int i = 0; i < ev->n; i++) {
        int h = ev->head[i];
        s->idx[s->off[h] + ev->token[i] - s->n_rows[h]] = i;
    }
    return FK_OK;
}

/* After the event's codes are stored: its rows count as stored, their reconstructions are
 * kept, and out[i] reports each vector as value() now reconstructs it. requant: the event
 * re-quantised the rows stored before it too (Hugging Face's flushes), whose kept
 * reconstructions are then refreshed. */
static inline void fkq_commit(struct fkq_store *s, const void *self,
                              void (*value)(const void *self, int h, int t, float *out),
                              const struct fk_event *ev, struct fk_vec_out *out, int requant)
{
    for (int h = 0; requant && h < s->n_heads; h++)
        for (int t = 0; t < s->n_rows[h]; t++)
            value(self, h, t, s->rec + fkq_row(s, h, t) * s->m);
    for (int h = 0; h < s->n_heads; h++)
        s->n_rows[h] += s->cnt[h];
    for (int i = 0; i < ev->n; i++) {
        float *xh = s->rec + fkq_row(s, ev->head[i], ev->token[i]) * s->m;
        value(self, ev->head[i], ev->token[i], xh);
        fkq_vec_out(ev->x + (size_t)i * s->m, xh, s->m, &out[i]);
    }
}

/* reconstruct(): row (head, token) if it is stored, as kept by fkq_commit. */
static inline int fkq_reconstruct(const struct fkq_store *s, const char *codec, int head,
                                  int token, float *out)
{
    if (head < 0 || head >= s->n_heads || token < 0 || token >= s->n_rows[head])
        return fk_err(FK_EINVAL, "%s: no stored row (head %d, token %d)", codec, head, token);
    memcpy(out, s->rec + fkq_row(s, head, token) * s->m, sizeof(float) * (size_t)s->m);
    return FK_OK;
}

#endif
