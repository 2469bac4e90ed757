/* SPDX-License-Identifier: MIT
 * topk: keeps the s largest-magnitude coordinates of each vector (ties to the lower index)
 * and drops the others: magnitude pruning in the canonical basis, the floor a dictionary
 * codec must beat at equal bytes. Lossy; sparse without a dictionary: the atoms are the m
 * unit vectors, so sparse_row() gives coordinate indices (ascending) and atoms() the m x m
 * identity. Coefficients are stored as the common `coef` option says (fp32 | fp16 | fp8
 * E4M3FN, rounded as the dictionary codecs round theirs). O(m) per vector (fk_topn).
 * Bytes per stored row: nnz * (index + coefficient) + a count of nnz; an index takes 1 byte
 * when head_dim <= 256, the count when head_dim <= 255, else 2. A vector with fewer than s
 * nonzero coordinates stores only those (FK_VEC_PREMATURE).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/fk_err.h"
#include "core/fk_codec.h"
#include "kernels/fk_sparse.h"

struct topk_opts {
    struct fk_common_opts c;     /* n_b, a_len, coef */
    int s;                       /* coordinates kept per vector */
};

struct topk {
    int m, n_heads, n_tokens, s;
    int coef;                    /* enum fk_coef */
    int32_t *idx;                /* [n_heads][n_tokens][s] kept coordinates, ascending */
    float *val;                  /* [n_heads][n_tokens][s] dequantised coefficients */
    int32_t *nnz;                /* [n_heads][n_tokens] stored coefficients */
    int32_t *n_rows;             /* [n_heads] stored rows */
    float *eye;                  /* [m][m] the atoms: identity */
    float *work;                 /* [2m] fk_topn scratch */
    float *xh;                   /* [m] reconstruction of the vector being encoded */
    uint64_t nnz_total, rows_total;
    struct fk_stream_stats st;   /* saturated, premature, uses_total */
};

static const struct fk_option topk_options[] = {
    FK_COMMON_OPTIONS(struct topk_opts),
    {"s", FK_OPT_INT, offsetof(struct topk_opts, s), 8, 1, 4096, NULL,
     "coordinates kept per vector (at most head_dim)"},
    {NULL, 0, 0, 0, 0, 0, NULL, NULL},
};

static int topk_check(const void *opts, int head_dim, int n_atoms)
{
    const struct topk_opts *o = opts;
    if (head_dim > 0 && o->s > head_dim)
        return fk_err(FK_ECONFIG, "topk: s = %d exceeds head_dim = %d", o->s, head_dim);
    return FK_OK;
}

static void topk_close(void *state)
{
    struct topk *k = state;
    if (!k)
        return;
    free(k->idx);
    free(k->val);
    free(k->nnz);
    free(k->n_rows);
    free(k->eye);
    free(k->work);
    free(k->xh);
    free(k);
}

static int topk_open(const void *opts, const struct fk_stream_env *env, void **state)
{
    const struct topk_opts *o = opts;
    FK_TRY(topk_check(opts, env->head_dim, 0));
    struct topk *k = calloc(1, sizeof *k);
    if (!k)
        return fk_err(FK_ENOMEM, "out of memory");
    k->m = env->head_dim;
    k->n_heads = env->n_heads;
    k->n_tokens = env->n_tokens;
    k->s = o->s;
    k->coef = o->c.coef;
    size_t rows = (size_t)env->n_heads * (size_t)env->n_tokens, m = (size_t)env->head_dim;
    k->idx = malloc(sizeof(int32_t) * rows * (size_t)o->s + 1);
    k->val = malloc(sizeof(float) * rows * (size_t)o->s + 1);
    k->nnz = calloc(rows + 1, sizeof(int32_t));
    k->n_rows = calloc((size_t)env->n_heads + 1, sizeof(int32_t));
    k->eye = calloc(m * m + 1, sizeof(float));
    k->work = malloc(sizeof(float) * 2 * m + 1);
    k->xh = malloc(sizeof(float) * m + 1);
    if (!k->idx || !k->val || !k->nnz || !k->n_rows || !k->eye || !k->work || !k->xh) {
        topk_close(k);
        return fk_err(FK_ENOMEM, "out of memory (topk state)");
    }
    for (size_t j = 0; j < m; j++)
        k->eye[j * m + j] = 1.0f;
    *state = k;
    return FK_OK;
}

static float topk_quantise(struct topk *k, float c)
{
    switch (k->coef) {
    case FK_COEF_FP8: return fk_fp8_decode(fk_fp8_encode(c, &k->st.saturated));
    case FK_COEF_FP16: return fk_fp16_decode(fk_fp16_encode(c));
    default: return c;
    }
}

/* Codes x as row `row`: the s largest |x_j| that are nonzero, then out. */
/* Bytes of one stored row of nnz coefficients: value + index each, and the count. */
static double topk_row_bytes(const struct topk *k, int nnz)
{
    int b_val = k->coef == FK_COEF_FP8 ? 1 : k->coef == FK_COEF_FP16 ? 2 : 4;
    int b_idx = k->m <= 256 ? 1 : 2, b_cnt = k->m <= 255 ? 1 : 2;
    return (double)nnz * (b_idx + b_val) + b_cnt;
}

static void topk_code(struct topk *k, const float *x, size_t row, struct fk_vec_out *out)
{
    int m = k->m;
    int32_t *idx = k->idx + row * (size_t)k->s;
    float *val = k->val + row * (size_t)k->s;
    double xx = 0;
    for (int j = 0; j < m; j++)
        xx += (double)x[j] * x[j];
    *out = (struct fk_vec_out){0};
    k->nnz[row] = 0;
    out->bytes = (float)topk_row_bytes(k, 0);
    if (xx <= 1e-30) {
        out->flags = FK_VEC_ZERO;
        return;
    }
    int n = fk_topn(x, NULL, m, k->s, 0, idx, k->work), nnz = 0;
    for (int i = 0; i < n; i++) {
        float c = x[idx[i]];
        if (c == 0)
            continue; /* fewer than s nonzero coordinates: nothing to store */
        idx[nnz] = idx[i];
        val[nnz++] = topk_quantise(k, c);
    }
    k->nnz[row] = nnz;
    memset(k->xh, 0, sizeof(float) * (size_t)m);
    for (int i = 0; i < nnz; i++)
        k->xh[idx[i]] = val[i];
    double e = 0, e_enc = 0; /* stored error; error of the dropped coordinates alone */
    for (int j = 0, i = 0; j < m; j++) {
        double r = (double)x[j] - k->xh[j];
        e += r * r;
        if (i < nnz && idx[i] == j)
            i++;
        else
            e_enc += (double)x[j] * x[j];
    }
    out->err_enc = (float)sqrt(e_enc / xx);
    out->err = (float)sqrt(e / xx);
    out->nnz = nnz;
    out->bytes = (float)topk_row_bytes(k, nnz);
    if (nnz < k->s) {
        out->flags |= FK_VEC_PREMATURE;
        k->st.premature++;
    }
    k->nnz_total += (uint64_t)nnz;
    k->st.uses_total += (uint64_t)nnz;
}

static int topk_encode(void *state, const struct fk_event *ev, struct fk_vec_out *out)
{
    struct topk *k = state;
    for (int i = 0; i < ev->n; i++) {
        int h = ev->head[i], t = ev->token[i];
        if (h < 0 || h >= k->n_heads || t != k->n_rows[h] || t >= k->n_tokens)
            return fk_err(FK_EINVAL, "topk: event row (head %d, token %d) out of order", h, t);
        const float *x = ev->x + (size_t)i * k->m;
        for (int j = 0; j < k->m; j++)
            if (!isfinite(x[j]))
                return fk_err(FK_EINVAL, "topk: vector (head %d, token %d) is not finite", h,
                              t);
        topk_code(k, x, (size_t)h * k->n_tokens + t, &out[i]);
        k->n_rows[h]++;
        k->rows_total++;
    }
    return FK_OK;
}

static int topk_sparse_row(const void *state, int head, int token, int *nnz,
                           const int32_t **idx, const float **coef)
{
    const struct topk *k = state;
    if (head < 0 || head >= k->n_heads || token < 0 || token >= k->n_rows[head])
        return fk_err(FK_EINVAL, "topk: no stored row (head %d, token %d)", head, token);
    size_t row = (size_t)head * k->n_tokens + token;
    *nnz = k->nnz[row];
    *idx = k->idx + row * (size_t)k->s;
    *coef = k->val + row * (size_t)k->s;
    return FK_OK;
}

static int topk_reconstruct(const void *state, int head, int token, float *out)
{
    const struct topk *k = state;
    int nnz = 0;
    const int32_t *idx = NULL;
    const float *val = NULL;
    FK_TRY(topk_sparse_row(state, head, token, &nnz, &idx, &val));
    memset(out, 0, sizeof(float) * (size_t)k->m);
    for (int i = 0; i < nnz; i++)
        out[idx[i]] = val[i];
    return FK_OK;
}

static const float *topk_atoms(const void *state, int *n_atoms)
{
    const struct topk *k = state;
    *n_atoms = k->m;
    return k->eye;
}

static void topk_stats(const void *state, struct fk_stream_stats *st)
{
    const struct topk *k = state;
    *st = k->st;
    st->n_atoms = k->m;
    st->n_base = 0;
    st->bytes_codes = (double)k->nnz_total * (topk_row_bytes(k, 1) - topk_row_bytes(k, 0)) +
                      (double)k->rows_total * topk_row_bytes(k, 0);
}

const struct fk_codec_ops fk_codec_topk = {
    .name = "topk",
    .summary = "keeps the s largest-magnitude coordinates of each vector (no dictionary)",
    .opts_size = sizeof(struct topk_opts),
    .options = topk_options,
    .caps = FK_CAP_SPARSE | FK_CAP_STATIC,
    .check = topk_check,
    .open = topk_open,
    .encode = topk_encode,
    .reconstruct = topk_reconstruct,
    .sparse_row = topk_sparse_row,
    .atoms = topk_atoms,
    .stats = topk_stats,
    .close = topk_close,
    .roles = (const struct fk_role[]){{FK_ROLE_SPARSITY, "s"}, {0, NULL}},
};
