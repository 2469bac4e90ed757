/* SPDX-License-Identifier: MIT
 * The row store of the quantisers that code each row on its own (engine, rotq): every
 * stored row kept as it reads back, by (head, token), tokens of a head increasing with gaps
 * allowed (FK_CAP_SKIPS: a policy's dropped tokens are never coded). Header only (static
 * inline): a family's library is built from its codec files alone.
 */
#ifndef FK_QUANT_ROWS_H
#define FK_QUANT_ROWS_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/fk_err.h"
#include "core/fk_codec.h"
#include "quant/fk_quant_group.h"

struct fkr_rows {
    int m, n_heads, n_tokens;
    float *rec;                  /* [n_heads][n_tokens][m] the rows as read back */
    int32_t *n_rows;             /* [n_heads] rows stored */
    int32_t *last;               /* [n_heads] last token stored, -1: none */
};

static inline void fkr_free(struct fkr_rows *r)
{
    free(r->rec);
    free(r->n_rows);
    free(r->last);
    memset(r, 0, sizeof *r);
}

/* On failure what was allocated stays for fkr_free (half-opened states are closed). */
static inline int fkr_init(struct fkr_rows *r, const struct fk_stream_env *env,
                           const char *codec)
{
    r->m = env->head_dim;
    r->n_heads = env->n_heads;
    r->n_tokens = env->n_tokens;
    size_t rows = (size_t)env->n_heads * (size_t)env->n_tokens;
    r->rec = malloc(sizeof(float) * rows * (size_t)env->head_dim + 1);
    r->n_rows = calloc((size_t)env->n_heads + 1, sizeof(int32_t));
    r->last = malloc(sizeof(int32_t) * ((size_t)env->n_heads + 1));
    if (!r->rec || !r->n_rows || !r->last)
        return fk_err(FK_ENOMEM, "out of memory (%s state)", codec);
    for (int h = 0; h < r->n_heads; h++)
        r->last[h] = -1;
    return FK_OK;
}

/* Every row of ev in range, after its head's last stored token (gaps: any later token, a
 * FK_CAP_SKIPS codec; else the next one, each head's tokens in order within the event),
 * finite: checked before anything is stored. */
static inline int fkr_check(const struct fkr_rows *r, const char *codec,
                            const struct fk_event *ev, int gaps)
{
    for (int i = 0; i < ev->n; i++) {
        int h = ev->head[i], t = ev->token[i], next = -1;
        for (int p = i - 1; !gaps && next < 0 && p >= 0; p--) /* head h's last in ev */
            if (ev->head[p] == h)
                next = ev->token[p] + 1;
        if (!gaps && next < 0)
            next = r->last[h] + 1;
        if (h < 0 || h >= r->n_heads || t < 0 || t >= r->n_tokens || t <= r->last[h] ||
            (!gaps && t != next))
            return fk_err(FK_EINVAL, "%s: event row (head %d, token %d) out of order", codec,
                          h, t);
        const float *x = ev->x + (size_t)i * r->m;
        for (int j = 0; j < r->m; j++)
            if (!isfinite(x[j]))
                return fk_err(FK_EINVAL, "%s: vector (head %d, token %d) is not finite",
                              codec, h, t);
    }
    return FK_OK;
}

static inline float *fkr_slot(struct fkr_rows *r, int h, int t)
{
    return r->rec + ((size_t)h * r->n_tokens + t) * r->m;
}

/* Row (h, t) stored from x: its outcome (relative error; the codes are the only
 * coefficients, so err_enc = err) of `bytes` bytes. */
static inline void fkr_done(struct fkr_rows *r, int h, int t, const float *x, float bytes,
                            struct fk_vec_out *out)
{
    r->last[h] = t;
    r->n_rows[h]++;
    fkq_vec_out(x, fkr_slot(r, h, t), r->m, out);
    out->bytes = bytes;
}

static inline int fkr_reconstruct(const struct fkr_rows *r, const char *codec, int head,
                                  int token, float *out)
{
    if (head < 0 || head >= r->n_heads || token < 0 || token > r->last[head])
        return fk_err(FK_EINVAL, "%s: row (head %d, token %d) not stored", codec, head, token);
    memcpy(out, r->rec + ((size_t)head * r->n_tokens + token) * r->m,
           sizeof(float) * (size_t)r->m);
    return FK_OK;
}

static inline double fkr_rows_stored(const struct fkr_rows *r)
{
    double rows = 0;
    for (int h = 0; h < r->n_heads; h++)
        rows += r->n_rows[h];
    return rows;
}

#endif
