/* SPDX-License-Identifier: MIT
 * full: stores every vector exactly (float32 in memory, accounted at 2 bytes per value as
 * the fp16 cache the paper compares against). Zero error, full memory: the reference row of
 * every sweep and the exact oracle of the conformance tests.
 */
#include <stdlib.h>
#include <string.h>

#include "core/fk_codec.h"
#include "common/fk_err.h"

struct full_opts {
    struct fk_common_opts c;     /* n_b, a_len (coef is ignored) */
};

struct full {
    int m, n_heads, n_tokens;
    float *rows;                 /* [n_heads][n_tokens][m] */
    int32_t *n_rows;             /* [n_heads] stored rows */
    double bytes;                /* accounted bytes of stored rows */
};

static const struct fk_option full_options[] = {
    FK_COMMON_OPTIONS(struct full_opts),
    {NULL, 0, 0, 0, 0, 0, NULL, NULL},
};

static void full_close(void *state)
{
    struct full *f = state;
    if (!f)
        return;
    free(f->rows);
    free(f->n_rows);
    free(f);
}

static int full_open(const void *opts, const struct fk_stream_env *env, void **state)
{
    struct full *f = calloc(1, sizeof *f);
    if (!f)
        return fk_err(FK_ENOMEM, "out of memory");
    f->m = env->head_dim;
    f->n_heads = env->n_heads;
    f->n_tokens = env->n_tokens;
    f->rows = malloc(sizeof(float) * (size_t)env->n_heads * (size_t)env->n_tokens *
                     (size_t)env->head_dim + 1);
    f->n_rows = calloc((size_t)env->n_heads, sizeof(int32_t));
    if (!f->rows || !f->n_rows) {
        full_close(f);
        return fk_err(FK_ENOMEM, "out of memory");
    }
    *state = f;
    return FK_OK;
}

static int full_encode(void *state, const struct fk_event *ev, struct fk_vec_out *out)
{
    struct full *f = state;
    for (int i = 0; i < ev->n; i++) {
        int h = ev->head[i], t = ev->token[i];
        if (h < 0 || h >= f->n_heads || t != f->n_rows[h] || t >= f->n_tokens)
            return fk_err(FK_EINVAL, "full: event row (head %d, token %d) out of order", h, t);
        memcpy(f->rows + ((size_t)h * f->n_tokens + t) * f->m, ev->x + (size_t)i * f->m,
               sizeof(float) * (size_t)f->m);
        f->n_rows[h]++;
        f->bytes += 2.0 * f->m;
        double xx = 0;
        for (int j = 0; j < f->m; j++)
            xx += (double)ev->x[(size_t)i * f->m + j] * ev->x[(size_t)i * f->m + j];
        out[i] = (struct fk_vec_out){.err_enc = 0, .err = 0, .nnz = f->m,
                                     .bytes = 2.0f * f->m,
                                     .flags = xx <= 1e-30 ? FK_VEC_ZERO : 0};
    }
    return FK_OK;
}

static int full_reconstruct(const void *state, int head, int token, float *out)
{
    const struct full *f = state;
    if (head < 0 || head >= f->n_heads || token < 0 || token >= f->n_rows[head])
        return fk_err(FK_EINVAL, "full: no stored row (head %d, token %d)", head, token);
    memcpy(out, f->rows + ((size_t)head * f->n_tokens + token) * f->m,
           sizeof(float) * (size_t)f->m);
    return FK_OK;
}

static void full_stats(const void *state, struct fk_stream_stats *st)
{
    const struct full *f = state;
    memset(st, 0, sizeof *st);
    st->bytes_codes = f->bytes;
}

const struct fk_codec_ops fk_codec_full = {
    .name = "full",
    .summary = "stores vectors exactly (zero error, full fp16-equivalent memory): the reference",
    .opts_size = sizeof(struct full_opts),
    .options = full_options,
    .caps = FK_CAP_STATIC | FK_CAP_EXACT,
    .open = full_open,
    .encode = full_encode,
    .reconstruct = full_reconstruct,
    .stats = full_stats,
    .close = full_close,
};
