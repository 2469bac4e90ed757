/* SPDX-License-Identifier: MIT
 * kvquant: KVQuant (spec families-quant-2026.md 4; SqueezeAILab/KVQuant's simulated
 * quantisation `quant/`, read and never copied) on the constants of a calibration file
 * (FK_CAP_CALIB: struct fk_calib, `fadkv-bench train-calib`, datasets/CALIB.md).
 *   keys    pre-RoPE, per channel, static: each post-RoPE key is un-rotated with the trace's
 *           RoPE (k = R(-p) x, in double), each channel c of the H d row coded on its
 *           calibrated fp16 thresholds [lower_c, upper_c]; with outliers = f > 0 a value
 *           outside them (strict) is an outlier; the row is rotated back after.
 *   values  per token, dynamic, over the token's row of all H heads (value_group = row,
 *           KVQuant's) or of one head (head): with f > 0, up and lo are the row's t and
 *           1 - t quantiles (t = 1 - f/2, the linear rule), the values >= up or <= lo
 *           (inclusive) are outliers, and the row's range is the max and min of the row
 *           with its outliers replaced by its (lower) median; with f = 0, its max and min.
 *           The range's centre zp and half-width rg are stored in fp16.
 *   levels  nuq (KVQuant's --nuq): u = (x - zp) / rg, the nearest of the 2^bits calibrated
 *           levels of the layer's LUT (ties: the lower level), x_hat = level rg + zp; values
 *           beyond the range take the end levels. uniform (its quant_fn_zp): qx = (2^b -
 *           1) / (up - lo), q = clamp(round-half-even(qx x - lo qx), 0, 2^b - 1), x_hat =
 *           (q + lo qx) / qx. A range of width 0 gives its centre.
 *   outliers are kept in fp16 (dense-and-sparse); the first `first_fp16` tokens of the trace
 *           are kept whole in fp16 (attention sinks); every other value is rounded to fp16
 *           after coding (the reference's output dtype), keys before their rotation back.
 * Arithmetic in double (the reference computes in float32: a value at a level midpoint can
 * round the other way). The Fisher-weighted k-means of KVQuant needs the model's gradients,
 * which a trace does not hold: the calibration is its unweighted fallback. Q-Norm and the
 * deployment's fixed outlier slots are not implemented (datasets/CALIB.md).
 * Bytes per head row (the spec's compact format): codes ceil(bits d / 8); each outlier its
 * fp16 value and index (2 bytes when the row it indexes, H d or d values, fits 65536, else
 * 4); values the fp16 zp and rg of their row (4 / H with value_group = row, 4 with head);
 * a sink row 2 d. Model constants (bytes_model): the keys' thresholds, 4 H d, and the
 * LUT, 2 2^bits per (layer, kind) (nuq). Lossy, dense; a row's codes depend on the
 * calibration and its token's rows only (FK_CAP_STATIC).
 */
#include <gsl/gsl_statistics_float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/fk_err.h"
#include "core/fk_codec.h"
#include "kernels/fk_rope.h"
#include "kernels/fk_sparse.h"
#include "quant/fk_quant_rows.h"

enum { KIND_K = 0, KIND_V = 1 }; /* fk_stream_env.kind */
enum { L_NUQ, L_UNIFORM };
static const char *const levels_names[] = {"nuq", "uniform", NULL};
static const char *const group_names[] = {"row", "head", NULL};

struct kvq_opts {
    struct fk_common_opts c;     /* n_b, a_len (coef is not used) */
    int bits, levels, sinks, value_group;
    double outliers;             /* f */
};

static const struct fk_option kvq_options[] = {
    {"n_b", FK_OPT_INT, offsetof(struct kvq_opts, c.n_b), 0, 0, 1 << 24, NULL,
     "exact window of the most recent tokens (0: every token quantised, as KVQuant)"},
    {"a_len", FK_OPT_INT, offsetof(struct kvq_opts, c.a_len), 1, 1, 1 << 16, NULL,
     "tokens compressed per eviction event"},
    {"bits", FK_OPT_INT, offsetof(struct kvq_opts, bits), 4, FK_KVQ_BITS_MIN, FK_KVQ_BITS_MAX,
     NULL, "bits per value (the calibration holds LUTs of 2, 3 and 4 bits)"},
    {"levels", FK_OPT_ENUM, offsetof(struct kvq_opts, levels), L_NUQ, 0, 1, levels_names,
     "nuq (the calibrated k-means levels; unweighted: the Fisher weights need gradients) | "
     "uniform (2^bits even levels on the range)"},
    {"outliers", FK_OPT_DOUBLE, offsetof(struct kvq_opts, outliers), 0.01, 0, 0.5, NULL,
     "fraction f kept in fp16 as dense-and-sparse outliers; the calibration file must hold "
     "it (train-calib --outliers; 0: none, values clipped to the range)"},
    {"first_fp16", FK_OPT_INT, offsetof(struct kvq_opts, sinks), 1, 0, 1 << 20, NULL,
     "first tokens kept in fp16 (attention sinks; KVQuant's first_few_fp16)"},
    {"value_group", FK_OPT_ENUM, offsetof(struct kvq_opts, value_group), FK_KVQ_ROW, 0, 1,
     group_names, "values' range per token over: row (all KV heads, KVQuant's) | head"},
    {NULL, 0, 0, 0, 0, 0, NULL, NULL},
};

static const struct fk_role kvq_roles[] = {
    {FK_ROLE_CALIB_FRACTION, "outliers"},
    {0, NULL},
};

struct kvq {
    struct kvq_opts o;
    struct fkr_rows r;           /* the rows as read back */
    int m, H, kind, nl, layout;  /* head_dim, KV heads, K/V, levels, RoPE layout (keys) */
    double t;                    /* 1 - f/2 */
    const float *upper, *lower;  /* keys: [H][m] thresholds */
    const float *lut;            /* [nl] ascending (nuq) */
    double mid[16];              /* [nl - 1] the midpoints of consecutive levels */
    double *kzp, *krg;           /* keys: [H m] each channel's centre and half-width */
    double *cs, *sn;             /* keys: [T][m/2] RoPE angles of the trace's positions */
    double *v, *u, *rc;          /* [H m] a row (keys: pre-RoPE), u, its coded values */
    int32_t *code;               /* [H m] level indices */
    uint8_t *out;                /* [H m] 1: an outlier */
    float *sel, *y;              /* [H m] a value row's selection copy, its x_hat */
    int *cnt;                    /* [H] outliers per head of a value row */
    double bytes;                /* bytes of the stored rows */
    uint64_t n_out, n_val;       /* outliers and values coded (not sinks) */
};

/* Every token quantised unless a window is asked for (n_b, a_len: the common rule). */
static void kvq_buffer(const void *opts, int kind, struct fk_buffer *b)
{
    (void)kind;
    const struct kvq_opts *o = opts;
    *b = (struct fk_buffer){.mode = FK_BUF_SLIDE, .n_b = o->c.n_b, .a_len = o->c.a_len};
}

static int kvq_check(const void *opts, int head_dim, int n_atoms)
{
    (void)opts;
    (void)n_atoms;
    if (head_dim > 0 && head_dim % 2)
        return fk_err(FK_ECONFIG, "kvquant: keys are un-rotated to pre-RoPE, which needs an "
                      "even head_dim (RoPE pairs), got %d", head_dim);
    return FK_OK;
}

static unsigned kvq_needs(const void *opts)
{
    (void)opts;
    return FK_NEED_ROPE;
}

static void kvq_close(void *state)
{
    struct kvq *q = state;
    if (!q)
        return;
    fkr_free(&q->r);
    free(q->cs);
    free(q->sn);
    free(q->kzp);
    free(q->krg);
    free(q->v);
    free(q->u);
    free(q->rc);
    free(q->code);
    free(q->out);
    free(q->cnt);
    free(q->sel);
    free(q->y);
    free(q);
}

/* The calibration at the codec's outlier fraction. */
static int pick_cal(struct kvq *q, const struct fk_stream_env *env)
{
    const struct fk_calib *c = env->calib;
    if (!c)
        return fk_err(FK_EINVAL, "kvquant: no calibration for layer %d (set the dataset's "
                      "calibration = \"...\", a file of `fadkv-bench train-calib`)", env->layer);
    if (c->n_kv_heads != env->n_heads || c->head_dim != env->head_dim)
        return fk_err(FK_EINVAL, "kvquant: the calibration has %d KV heads of head_dim %d, the "
                      "stream %d of head_dim %d", c->n_kv_heads, c->head_dim, env->n_heads,
                      env->head_dim);
    const struct fk_kvq_cal *k = NULL;
    for (int i = 0; i < c->n_kvq; i++)
        if (fabs(c->kvq[i].outliers - q->o.outliers) <= 1e-12)
            k = &c->kvq[i];
    if (!k)
        return fk_err(FK_EINVAL, "kvquant: outliers = %g was not calibrated (the file holds "
                      "%d fraction(s); train-calib --outliers)", q->o.outliers, c->n_kvq);
    int grp = env->kind == KIND_K ? FK_KVQ_ROW : q->o.value_group;
    q->lut = k->lut[q->o.bits - FK_KVQ_BITS_MIN][grp];
    q->upper = k->upper;
    q->lower = k->lower;
    if (!q->lut || (env->kind == KIND_K && (!q->upper || !q->lower)))
        return fk_err(FK_EINVAL, "kvquant: the calibration of layer %d lacks the %d-bit "
                      "levels or the key thresholds", env->layer, q->o.bits);
    return FK_OK;
}

/* The RoPE angles of every token of the trace (keys). */
static int rope_table(struct kvq *q, const struct fk_stream_env *env)
{
    if (!env->rope || !env->positions)
        return fk_err(FK_EINVAL, "kvquant: keys are coded pre-RoPE, but the trace does not "
                      "describe its RoPE (no rope_layout attribute, or keys not post-RoPE)");
    FK_TRY(fk_rope_check(env->rope, q->m));
    size_t half = (size_t)q->m / 2, T = (size_t)env->n_tokens;
    double *freq = malloc(sizeof(double) * half + 1);
    q->cs = malloc(sizeof(double) * half * T + 1);
    q->sn = malloc(sizeof(double) * half * T + 1);
    if (!freq || !q->cs || !q->sn) {
        free(freq);
        return fk_err(FK_ENOMEM, "kvquant: out of memory for the RoPE table of %zu tokens", T);
    }
    fk_rope_freqs(env->rope, q->m, freq);
    fk_rope_table(freq, q->m, env->positions, env->n_tokens, q->cs, q->sn);
    free(freq);
    q->layout = env->rope->layout;
    return FK_OK;
}

static int kvq_open(const void *opts, const struct fk_stream_env *env, void **state)
{
    struct kvq *q = calloc(1, sizeof *q);
    if (!q)
        return fk_err(FK_ENOMEM, "out of memory");
    *state = q; /* closed by the caller on failure too */
    memcpy(&q->o, opts, sizeof q->o);
    q->m = env->head_dim;
    q->H = env->n_heads;
    q->kind = env->kind;
    q->nl = 1 << q->o.bits;
    q->t = 1.0 - q->o.outliers / 2;
    FK_TRY(kvq_check(opts, q->m, 0));
    FK_TRY(pick_cal(q, env));
    if (q->kind == KIND_K)
        FK_TRY(rope_table(q, env));
    FK_TRY(fkr_init(&q->r, env, "kvquant"));
    size_t n = (size_t)q->H * q->m;
    double **d[] = {&q->kzp, &q->krg, &q->v, &q->u, &q->rc};
    for (int i = 0; i < 5; i++)
        *d[i] = malloc(sizeof(double) * n + 1);
    q->code = malloc(sizeof(int32_t) * n + 1);
    q->out = malloc(n + 1);
    q->cnt = malloc(sizeof(int) * (size_t)q->H + 1);
    q->sel = malloc(sizeof(float) * n + 1);
    q->y = malloc(sizeof(float) * n + 1);
    if (!q->kzp || !q->krg || !q->v || !q->u || !q->rc || !q->code || !q->out || !q->cnt ||
        !q->sel || !q->y)
        return fk_err(FK_ENOMEM, "out of memory (kvquant state)");
    for (int k = 0; k + 1 < q->nl; k++) /* exact: two floats' sum fits a double */
        q->mid[k] = ((double)q->lut[k] + q->lut[k + 1]) / 2;
    for (size_t c = 0; q->kind == KIND_K && c < n; c++) {
        q->kzp[c] = ((double)q->upper[c] + q->lower[c]) / 2;
        q->krg[c] = ((double)q->upper[c] - q->lower[c]) / 2;
    }
    return FK_OK;
}

/* The coded values r [n] of the values v [n] on the ranges centred at zp with half-width
 * rg (per value, or one for all: stride 0). nuq: the nearest level of u = (v - zp) / rg,
 * a tie to the lower, found as the number of level midpoints below u; uniform: the grid of
 * 2^bits values from zp - rg to zp + rg. A range of width 0 gives its centre. One pass per
 * step over the row, so that each vectorises. */
static void code_span(struct kvq *q, const double *v, const double *zp, const double *rg,
                      int stride, int n)
{
    double *u = q->u, *r = q->rc;
    int32_t *c = q->code;
    if (q->o.levels == L_NUQ) {
        for (int j = 0; j < n; j++)
            u[j] = rg[j * stride] > 0 ? (v[j] - zp[j * stride]) / rg[j * stride] : 0;
        for (int j = 0; j < n; j++)
            c[j] = 0;
        for (int k = 0; k + 1 < q->nl; k++)
            for (int j = 0; j < n; j++)
                c[j] += u[j] > q->mid[k];
        for (int j = 0; j < n; j++)
            r[j] = q->lut[c[j]] * rg[j * stride] + zp[j * stride];
        return;
    }
    double top = q->nl - 1;
    for (int j = 0; j < n; j++) {
        double lo = zp[j * stride] - rg[j * stride], up = zp[j * stride] + rg[j * stride];
        if (!(up > lo)) {
            r[j] = zp[j * stride];
            continue;
        }
        double qx = top / (up - lo), off = lo * qx;
        double k = rint(qx * v[j] - off); /* the default rounding mode: half to even */
        k = k < 0 ? 0 : k > top ? top : k;
        r[j] = (k + off) / qx;
    }
}

/* Bytes of one coded (not sink) head row with n_out outliers. */
static double row_bytes(const struct kvq *q, int n_out)
{
    int idx_span = q->kind == KIND_V && q->o.value_group == FK_KVQ_HEAD ? q->m : q->H * q->m;
    double b = (double)(((size_t)q->o.bits * q->m + 7) / 8);
    b += n_out * (2.0 + (idx_span <= 65536 ? 2 : 4));
    if (q->kind == KIND_V)
        b += q->o.value_group == FK_KVQ_ROW ? 4.0 / q->H : 4.0;
    return b;
}

/* y [n] = fp16(the outliers' values, the others' coded values), saturated to +-65504. */
static void round_out(const struct kvq *q, const double *v, int n, float *y)
{
    for (int j = 0; j < n; j++) {
        double a = q->out[j] ? v[j] : q->rc[j];
        a = a > 65504.0 ? 65504.0 : a < -65504.0 ? -65504.0 : a;
        y[j] = (float)a;
    }
    fk_fp16_round(y, (size_t)n);
}

/* Key x (post-RoPE) of head h at token t into y; returns its outliers. */
static int code_key(struct kvq *q, int h, int t, const float *x, float *y)
{
    int m = q->m, n_out = 0;
    size_t half = (size_t)m / 2;
    double *v = q->v;
    for (int j = 0; j < m; j++)
        v[j] = x[j];
    fk_rope_apply(q->layout, m, q->cs + (size_t)t * half, q->sn + (size_t)t * half, -1, v);
    const float *lo = q->lower + (size_t)h * m, *up = q->upper + (size_t)h * m;
    for (int j = 0; j < m; j++) {
        q->out[j] = q->o.outliers > 0 && (v[j] > up[j] || v[j] < lo[j]);
        n_out += q->out[j];
    }
    code_span(q, v, q->kzp + (size_t)h * m, q->krg + (size_t)h * m, 1, m);
    round_out(q, v, m, y);
    for (int j = 0; j < m; j++)
        v[j] = y[j];
    fk_rope_apply(q->layout, m, q->cs + (size_t)t * half, q->sn + (size_t)t * half, +1, v);
    for (int j = 0; j < m; j++)
        y[j] = (float)v[j];
    return n_out;
}

/* The p-quantile of the n values in sel (the linear rule; sel is reordered): the j-th
 * smallest by selection, the next one the smallest of those after it. */
static double quantile(float *sel, int n, double p)
{
    double pos = p * (n - 1);
    size_t j = (size_t)floor(pos);
    double a = gsl_stats_float_select(sel, 1, (size_t)n, j);
    if (j + 1 >= (size_t)n)
        return a;
    float b = sel[j + 1];
    for (size_t i = j + 2; i < (size_t)n; i++)
        b = sel[i] < b ? sel[i] : b;
    return a + (pos - (double)j) * (b - a);
}

/* A value row x [n] (a token's heads, or one head) into y; out_per_head[k] counts the
 * outliers of head row k of it (zeroed first). */
static void code_values(struct kvq *q, const float *x, int n, float *y, int *out_per_head)
{
    double up = INFINITY, lo = -INFINITY;
    if (q->o.outliers > 0) {
        memcpy(q->sel, x, sizeof(float) * (size_t)n);
        up = quantile(q->sel, n, q->t);
        lo = quantile(q->sel, n, 1 - q->t);
    }
    memset(out_per_head, 0, sizeof(int) * (size_t)(n / q->m));
    double mn = INFINITY, mx = -INFINITY;
    int below = 0, above = 0; /* outliers on either side */
    for (int i = 0; i < n; i++) {
        q->v[i] = x[i];
        q->out[i] = x[i] >= up || x[i] <= lo;
        below += x[i] <= lo;
        above += x[i] >= up && x[i] > lo;
        if (!q->out[i]) {
            mn = x[i] < mn ? x[i] : mn;
            mx = x[i] > mx ? x[i] : mx;
        }
        out_per_head[i / q->m] += q->out[i];
    }
    /* the outliers stand in as the (lower) median, which the other values bracket unless
     * more than half of them are outliers on one side (a row of ties) */
    if (below > (n - 1) / 2 || above > n - 1 - (n - 1) / 2) {
        memcpy(q->sel, x, sizeof(float) * (size_t)n);
        double med = gsl_stats_float_select(q->sel, 1, (size_t)n, (size_t)(n - 1) / 2);
        mn = med < mn ? med : mn;
        mx = med > mx ? med : mx;
    }
    double zp = fkq_half((float)((mx + mn) / 2)), rg = fkq_half((float)((mx - mn) / 2));
    code_span(q, q->v, &zp, &rg, 0, n);
    round_out(q, q->v, n, y);
}

/* Rows i .. i + H - 1 of ev: one token's heads 0 .. H - 1 (value_group = row). */
static int whole_token(const struct kvq *q, const struct fk_event *ev, int i)
{
    if (i + q->H > ev->n)
        return 0;
    for (int h = 0; h < q->H; h++)
        if (ev->head[i + h] != h || ev->token[i + h] != ev->token[i])
            return 0;
    return 1;
}

/* Stores row i of ev as y with n_out outliers (-1: a sink row, fp16). A zero row reads back
 * as zeros (the harness's rule for zero vectors), its codes counted all the same. */
static void commit_row(struct kvq *q, const struct fk_event *ev, int i, const float *y,
                       int n_out, struct fk_vec_out *out)
{
    int h = ev->head[i], t = ev->token[i], zero = 1;
    double b = n_out < 0 ? 2.0 * q->m : row_bytes(q, n_out);
    for (int j = 0; j < q->m && zero; j++)
        zero = ev->x[(size_t)i * q->m + j] == 0.0f;
    memcpy(fkr_slot(&q->r, h, t), y, sizeof(float) * (size_t)q->m);
    if (zero)
        memset(fkr_slot(&q->r, h, t), 0, sizeof(float) * (size_t)q->m);
    fkr_done(&q->r, h, t, ev->x + (size_t)i * q->m, (float)b, &out[i]);
    q->bytes += b;
    if (n_out >= 0) {
        q->n_out += (uint64_t)n_out;
        q->n_val += (uint64_t)q->m;
    }
}

/* Rows of ev coded together from row i: a value row of every head (value_group = row,
 * after the sinks), else 1. */
static int rows_at(const struct kvq *q, const struct fk_event *ev, int i)
{
    int by_row = q->kind == KIND_V && q->o.value_group == FK_KVQ_ROW;
    return by_row && ev->token[i] >= q->o.sinks ? q->H : 1;
}

static int kvq_encode(void *state, const struct fk_event *ev, struct fk_vec_out *out)
{
    struct kvq *q = state;
    FK_TRY(fkr_check(&q->r, "kvquant", ev, 0));
    int m = q->m;
    for (int i = 0; i < ev->n; i += rows_at(q, ev, i))
        if (rows_at(q, ev, i) > 1 && !whole_token(q, ev, i))
            return fk_err(FK_EINVAL, "kvquant: value_group = row needs every KV head of a "
                          "token together, in order (event row %d is head %d, token %d)", i,
                          ev->head[i], ev->token[i]);
    for (int i = 0; i < ev->n;) {
        const float *x = ev->x + (size_t)i * m;
        int t = ev->token[i];
        if (t < q->o.sinks) {
            for (int j = 0; j < m; j++)
                q->y[j] = fkq_half(x[j]);
            commit_row(q, ev, i++, q->y, -1, out);
        } else if (q->kind == KIND_K) {
            commit_row(q, ev, i, q->y, code_key(q, ev->head[i], t, x, q->y), out);
            i++;
        } else {
            int rows = rows_at(q, ev, i);
            code_values(q, x, rows * m, q->y, q->cnt);
            for (int k = 0; k < rows; k++)
                commit_row(q, ev, i + k, q->y + (size_t)k * m, q->cnt[k], out);
            i += rows;
        }
    }
    return FK_OK;
}

static int kvq_reconstruct(const void *state, int head, int token, float *out)
{
    const struct kvq *q = state;
    return fkr_reconstruct(&q->r, "kvquant", head, token, out);
}

static void kvq_stats(const void *state, struct fk_stream_stats *st)
{
    const struct kvq *q = state;
    memset(st, 0, sizeof *st);
    st->bytes_codes = q->bytes;
    st->bytes_model = (q->kind == KIND_K ? 4.0 * q->H * q->m : 0.0) +
                      (q->o.levels == L_NUQ ? 2.0 * q->nl : 0.0);
}

const struct fk_codec_ops fk_codec_kvquant = {
    .name = "kvquant",
    .summary = "KVQuant: pre-RoPE per-channel keys, per-token values, calibrated k-means "
               "levels, dense-and-sparse fp16 outliers, fp16 sinks (dataset key calibration)",
    .opts_size = sizeof(struct kvq_opts),
    .options = kvq_options,
    .caps = FK_CAP_CALIB | FK_CAP_STATIC,
    .buffer = kvq_buffer,
    .check = kvq_check,
    .needs = kvq_needs,
    .open = kvq_open,
    .encode = kvq_encode,
    .reconstruct = kvq_reconstruct,
    .stats = kvq_stats,
    .close = kvq_close,
    .roles = kvq_roles,
};
