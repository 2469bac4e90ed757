/* SPDX-License-Identifier: MIT
 * uniform: b-bit uniform asymmetric quantisation of each vector on its own (the per-token
 * baseline of the quantisation family, spec families.md 1.1/1.2: min/scale, round to
 * nearest). Per stored row: lo = min x and step = (max x - lo) / (2^b - 1), both kept as
 * fp16; q_j = clamp(round((x_j - lo) / step), 0, 2^b - 1), x_hat_j = lo + q_j step with the
 * fp16 values. A constant vector has step 0: q = 0 and x_hat = lo, so it comes back as its
 * fp16 value (exactly, for fp16 traces), never NaN. Lossy, dense, O(m) per vector.
 * Bytes per stored row: ceil(m b / 8) packed codes + 4 (fp16 lo and step); the codes are
 * kept one per byte in memory. The codes are the only coefficients: err_enc = err.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/fk_err.h"
#include "core/fk_codec.h"
#include "kernels/fk_sparse.h"

#define FP16_MAX 65504.0f

struct uniform_opts {
    struct fk_common_opts c;     /* n_b, a_len (coef is ignored) */
    int bits;                    /* b, bits per coordinate */
};

struct uniform {
    int m, n_heads, n_tokens, bits;
    uint8_t *q;                  /* [n_heads][n_tokens][m] codes, 0 .. 2^bits - 1 */
    uint16_t *meta;              /* [n_heads][n_tokens][2] fp16 lo, step */
    int32_t *n_rows;             /* [n_heads] stored rows */
    float *xh;                   /* [m] reconstruction of the vector being encoded */
    uint64_t rows_total;
};

static const struct fk_option uniform_options[] = {
    FK_COMMON_OPTIONS(struct uniform_opts),
    {"bits", FK_OPT_INT, offsetof(struct uniform_opts, bits), 4, 1, 8, NULL,
     "bits per coordinate (2^bits levels between the vector's min and max)"},
    {NULL, 0, 0, 0, 0, 0, NULL, NULL},
};

static void uniform_close(void *state)
{
    struct uniform *u = state;
    if (!u)
        return;
    free(u->q);
    free(u->meta);
    free(u->n_rows);
    free(u->xh);
    free(u);
}

static int uniform_open(const void *opts, const struct fk_stream_env *env, void **state)
{
    const struct uniform_opts *o = opts;
    struct uniform *u = calloc(1, sizeof *u);
    if (!u)
        return fk_err(FK_ENOMEM, "out of memory");
    u->m = env->head_dim;
    u->n_heads = env->n_heads;
    u->n_tokens = env->n_tokens;
    u->bits = o->bits;
    size_t rows = (size_t)env->n_heads * (size_t)env->n_tokens;
    u->q = malloc(rows * (size_t)env->head_dim + 1);
    u->meta = malloc(sizeof(uint16_t) * 2 * rows + 1);
    u->n_rows = calloc((size_t)env->n_heads + 1, sizeof(int32_t));
    u->xh = malloc(sizeof(float) * (size_t)env->head_dim + 1);
    if (!u->q || !u->meta || !u->n_rows || !u->xh) {
        uniform_close(u);
        return fk_err(FK_ENOMEM, "out of memory (uniform state)");
    }
    *state = u;
    return FK_OK;
}

/* fp16 of v, saturated to the largest finite half so that x_hat stays finite. */
static uint16_t half_sat(float v)
{
    return fk_fp16_encode(v > FP16_MAX ? FP16_MAX : v < -FP16_MAX ? -FP16_MAX : v);
}

static void uniform_dequant(const struct uniform *u, size_t row, float *out)
{
    const uint8_t *q = u->q + row * (size_t)u->m;
    float lo = fk_fp16_decode(u->meta[2 * row]), step = fk_fp16_decode(u->meta[2 * row + 1]);
    for (int j = 0; j < u->m; j++)
        out[j] = lo + (float)q[j] * step;
}

/* Quantises x into row `row`; xh receives the reconstruction. */
static void uniform_code(struct uniform *u, const float *x, size_t row, float *xh,
                         struct fk_vec_out *out)
{
    int m = u->m, top = (1 << u->bits) - 1;
    float mn = x[0], mx = x[0];
    double xx = 0;
    for (int j = 0; j < m; j++) {
        mn = x[j] < mn ? x[j] : mn;
        mx = x[j] > mx ? x[j] : mx;
        xx += (double)x[j] * x[j];
    }
    uint16_t *meta = u->meta + 2 * row;
    meta[0] = half_sat(mn);
    meta[1] = half_sat((float)(((double)mx - mn) / top));
    /* codes from the stored (fp16) origin and step: the nearest level of the grid kept */
    float lo = fk_fp16_decode(meta[0]), step = fk_fp16_decode(meta[1]);
    uint8_t *q = u->q + row * (size_t)m;
    for (int j = 0; j < m; j++) {
        float v = step > 0 ? (x[j] - lo) / step : 0.0f;
        v = v < 0 ? 0 : v > (float)top ? (float)top : v;
        q[j] = (uint8_t)lrintf(v);
    }
    uniform_dequant(u, row, xh);
    double e = 0;
    for (int j = 0; j < m; j++) {
        double r = (double)x[j] - xh[j];
        e += r * r;
    }
    int zero = xx <= 1e-30;
    float err = zero ? 0.0f : (float)sqrt(e / xx);
    *out = (struct fk_vec_out){.err_enc = err, .err = err, .nnz = m,
                               .bytes = (float)(((size_t)m * u->bits + 7) / 8 + 4),
                               .flags = zero ? FK_VEC_ZERO : 0};
}

static int uniform_encode(void *state, const struct fk_event *ev, struct fk_vec_out *out)
{
    struct uniform *u = state;
    for (int i = 0; i < ev->n; i++) {
        int h = ev->head[i], t = ev->token[i];
        const float *x = ev->x + (size_t)i * u->m;
        if (h < 0 || h >= u->n_heads || t != u->n_rows[h] || t >= u->n_tokens)
            return fk_err(FK_EINVAL, "uniform: event row (head %d, token %d) out of order", h,
                          t);
        for (int j = 0; j < u->m; j++)
            if (!isfinite(x[j]))
                return fk_err(FK_EINVAL, "uniform: vector (head %d, token %d) is not finite",
                              h, t);
        uniform_code(u, x, (size_t)h * u->n_tokens + t, u->xh, &out[i]);
        u->n_rows[h]++;
        u->rows_total++;
    }
    return FK_OK;
}

static int uniform_reconstruct(const void *state, int head, int token, float *out)
{
    const struct uniform *u = state;
    if (head < 0 || head >= u->n_heads || token < 0 || token >= u->n_rows[head])
        return fk_err(FK_EINVAL, "uniform: no stored row (head %d, token %d)", head, token);
    uniform_dequant(u, (size_t)head * u->n_tokens + token, out);
    return FK_OK;
}

static void uniform_stats(const void *state, struct fk_stream_stats *st)
{
    const struct uniform *u = state;
    memset(st, 0, sizeof *st);
    st->bytes_codes = (double)u->rows_total * (((size_t)u->m * u->bits + 7) / 8 + 4);
}

const struct fk_codec_ops fk_codec_uniform = {
    .name = "uniform",
    .summary = "b-bit uniform quantisation of each vector between its min and max (fp16 meta)",
    .opts_size = sizeof(struct uniform_opts),
    .options = uniform_options,
    .caps = FK_CAP_STATIC | FK_CAP_GRID,
    .open = uniform_open,
    .encode = uniform_encode,
    .reconstruct = uniform_reconstruct,
    .stats = uniform_stats,
    .close = uniform_close,
};
