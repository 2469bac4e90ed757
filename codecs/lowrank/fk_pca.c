/* SPDX-License-Identifier: MIT
 * pca: rank-r projection of each head group's vector on a basis trained offline
 * (families.md 3.5; the basis file: datasets/BASIS.md, `fadkv-bench train-basis`).
 *
 * Per (layer, kind) and group of g KV heads (g from the basis: 1, 4 as Palu, H_kv as
 * Eigen Attention's keys), a token's vector x is its g heads' rows concatenated (g d values):
 *   encode  c = U_r^T (x - mu)        U_r: the r leading eigenvectors of the calibration
 *   decode  x_hat = mu + U_r c_q      covariance (center = 1), or of the second moment with
 *                                     mu = 0 (center = 0: uncentered, Palu / Eigen-faithful)
 * pre_rope = 1 (keys only; values never carry RoPE): each head's post-RoPE key is un-rotated
 * first, k_pre = R(-p) k (the trace's RoPE, kernels/fk_rope.h, in double), projected on the
 * basis's pre-RoPE variant, and the reconstruction is rotated back, k_hat = R(p) k_pre_hat.
 * The trace must describe its RoPE (rope_layout): the harness refuses the cell otherwise.
 *
 * Coefficients c_q (option coef): fp32, fp16 or fp8 (E4M3FN) each, or quant: per token-group
 * asymmetric b-bit codes (b = coef_bits) between the min and max of c, with min and step
 * in fp16 (Palu's latent quantisation with lt_group_size 0). err_enc is the error with
 * unquantised coefficients.
 *
 * Bytes (stats): per stored token and group 4r (fp32), 2r (fp16), r (fp8) or
 * ceil(r b / 8) + 4 (quant); bytes_model: the basis rows the codec reads, g d r fp16 values
 * per group, plus the mean's g d when center = 1, once per (layer, kind) stream group.
 * Full-precision window: the common n_b / a_len (default n_b = 0: Palu's, none). Attention
 * sinks are not supported yet. A zero vector (all coordinates 0) is kept as a flag and comes
 * back exactly (its bit is not billed). A row's nnz is its share of the group's r
 * coefficients (r / g, the remainder to the first heads).
 *
 * With g > 1 the g heads of a group must arrive together: events are ordered (token, head)
 * with every head of a token, and encode() refuses any other order with a message.
 * Reconstructions are kept (the basis never changes): reconstruct() is a copy.
 */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/fk_err.h"
#include "core/fk_codec.h"
#include "kernels/fk_rope.h"
#include "kernels/fk_sparse.h"

enum { COEF_QUANT = 3 }; /* after FK_COEF_FP32, FP16, FP8 */
static const char *const pca_coef_names[] = {"fp32", "fp16", "fp8", "quant", NULL};

struct pca_opts {
    struct fk_common_opts c;     /* n_b, a_len, coef (pca_coef_names) */
    int rank;                    /* r */
    int center;                  /* 1: centered (covariance), 0: uncentered (second moment) */
    int coef_bits;               /* b of coef = quant */
    int pre_rope;                /* keys: un-rotate, project, rotate back */
};

static const struct fk_option pca_options[] = {
    {"n_b", FK_OPT_INT, offsetof(struct pca_opts, c.n_b), 0, 0, 1 << 24, NULL,
     "full-precision buffer of the most recent tokens (tokens; 0: none, as Palu)"},
    {"a_len", FK_OPT_INT, offsetof(struct pca_opts, c.a_len), 1, 1, 1 << 16, NULL,
     "tokens compressed per eviction event"},
    {"coef", FK_OPT_ENUM, offsetof(struct pca_opts, c.coef), FK_COEF_FP16, 0, 3,
     pca_coef_names, "coefficient storage: fp32 | fp16 | fp8 | quant (coef_bits per "
     "coefficient, fp16 min and step per token and group)"},
    {"rank", FK_OPT_INT, offsetof(struct pca_opts, rank), 32, 1, 1 << 16, NULL,
     "components kept per head group (1 .. group x head_dim)"},
    {"center", FK_OPT_BOOL, offsetof(struct pca_opts, center), 1, 0, 1, NULL,
     "1: centered PCA (mean + covariance basis); 0: uncentered (second moment, no mean)"},
    {"coef_bits", FK_OPT_INT, offsetof(struct pca_opts, coef_bits), 8, 1, 16, NULL,
     "bits per coefficient with coef = quant"},
    {"pre_rope", FK_OPT_BOOL, offsetof(struct pca_opts, pre_rope), 0, 0, 1, NULL,
     "keys: un-rotate (the trace's RoPE) before projecting, rotate back after"},
    {NULL, 0, 0, 0, 0, 0, NULL, NULL},
};

struct pca {
    int m, H, T;                 /* head_dim, KV heads, tokens */
    int g, G, dim, k, r;         /* group, groups, g m, basis components, rank */
    int coef, bits, pre, center;
    const float *mean;           /* [G][dim] or NULL (uncentered) */
    const float *vec;            /* [G][k][dim]: rows 0 .. r-1 of each group are U_r^T */
    int layout;                  /* RoPE layout (pre) */
    double *cs, *sn;             /* [T][m/2] RoPE angles of the trace's positions (pre) */
    float *xh;                   /* [H][T][m] stored reconstructions */
    uint8_t *zero;               /* [H][T] zero vectors */
    int32_t *n_rows;             /* [H] stored rows */
    int32_t *next;               /* [H] scratch: the order check */
    float *a, *c, *cq, *rq, *re; /* scratch: group vectors, coefficients, reconstructions */
    int32_t *occ;                /* scratch: event row of each group occurrence */
    double *rot;                 /* [m] scratch */
    size_t cap;                  /* group occurrences the scratch holds */
    uint64_t groups_total;       /* token-groups stored */
    uint64_t saturated;          /* fp8 coefficients saturated */
    double macs;
};

static int pca_check(const void *opts, int head_dim, int n_atoms)
{
    const struct pca_opts *o = opts;
    if (n_atoms > 0 && o->rank > n_atoms)
        return fk_err(FK_ECONFIG, "pca: rank = %d exceeds the basis's %d components per head "
                      "group (at most group x head_dim%s)", o->rank, n_atoms,
                      head_dim > 0 ? "" : "; head_dim not known yet");
    if (o->pre_rope && head_dim > 0 && head_dim % 2)
        return fk_err(FK_ECONFIG, "pca: pre_rope = 1 needs an even head_dim (RoPE pairs), got "
                      "%d", head_dim);
    return FK_OK;
}

static unsigned pca_needs(const void *opts)
{
    return ((const struct pca_opts *)opts)->pre_rope ? FK_NEED_ROPE : 0u;
}

static void pca_close(void *state)
{
    struct pca *p = state;
    if (!p)
        return;
    free(p->cs);
    free(p->sn);
    free(p->xh);
    free(p->zero);
    free(p->n_rows);
    free(p->next);
    free(p->a);
    free(p->c);
    free(p->cq);
    free(p->rq);
    free(p->re);
    free(p->occ);
    free(p->rot);
    free(p);
}

/* The basis of this stream (the pre-RoPE variant for keys with pre_rope) and its fit. */
static int pick_basis(const struct pca_opts *o, const struct fk_stream_env *env,
                      const struct fk_basis **out, int *pre)
{
    const struct fk_basis *b = env->basis;
    *pre = o->pre_rope && env->kind == 0;
    if (!b)
        return fk_err(FK_EINVAL, "pca: no basis for layer %d (set the dataset's basis = "
                      "\"...\")", env->layer);
    if (*pre && (!env->rope || !env->positions))
        return fk_err(FK_EINVAL, "pca: pre_rope = 1 but the trace does not describe its RoPE "
                      "(no rope_layout attribute, or keys not post-RoPE)");
    if (*pre && !b->pre_rope)
        return fk_err(FK_EINVAL, "pca: pre_rope = 1 but the basis has no pre-RoPE keys");
    if (*pre)
        b = b->pre_rope;
    if (b->group < 1 || b->group * b->n_groups != env->n_heads ||
        b->dim != b->group * env->head_dim)
        return fk_err(FK_EINVAL, "pca: the basis has %d groups of %d heads of dim %d, the "
                      "stream %d KV heads of head_dim %d", b->n_groups, b->group, b->dim,
                      env->n_heads, env->head_dim);
    if (o->rank > b->n_comp)
        return fk_err(FK_EINVAL, "pca: rank = %d exceeds the basis's %d components per group",
                      o->rank, b->n_comp);
    *out = b;
    return FK_OK;
}

/* The RoPE angles of every token of the trace (pre_rope keys). */
static int rope_table(struct pca *p, const struct fk_stream_env *env)
{
    FK_TRY(fk_rope_check(env->rope, p->m));
    size_t half = (size_t)p->m / 2;
    double *freq = malloc(sizeof(double) * half);
    p->cs = malloc(sizeof(double) * half * (size_t)p->T + 1);
    p->sn = malloc(sizeof(double) * half * (size_t)p->T + 1);
    if (!freq || !p->cs || !p->sn) {
        free(freq);
        return fk_err(FK_ENOMEM, "pca: out of memory for the RoPE table of %d tokens", p->T);
    }
    fk_rope_freqs(env->rope, p->m, freq);
    fk_rope_table(freq, p->m, env->positions, p->T, p->cs, p->sn);
    free(freq);
    p->layout = env->rope->layout;
    return FK_OK;
}

static int pca_open(const void *opts, const struct fk_stream_env *env, void **state)
{
    const struct pca_opts *o = opts;
    *state = NULL;
    const struct fk_basis *b = NULL;
    int pre = 0;
    FK_TRY(pick_basis(o, env, &b, &pre));
    struct pca *p = calloc(1, sizeof *p);
    if (!p)
        return fk_err(FK_ENOMEM, "out of memory");
    *state = p;
    *p = (struct pca){.m = env->head_dim, .H = env->n_heads, .T = env->n_tokens,
                      .g = b->group, .G = b->n_groups, .dim = b->dim, .k = b->n_comp,
                      .r = o->rank, .coef = o->c.coef, .bits = o->coef_bits, .pre = pre,
                      .center = o->center, .mean = o->center ? b->mean : NULL,
                      .vec = b->vec[o->center ? FK_BASIS_CENTERED : FK_BASIS_UNCENTERED]};
    if (pre)
        FK_TRY(rope_table(p, env));
    size_t rows = (size_t)p->H * (size_t)p->T;
    p->xh = malloc(sizeof(float) * rows * (size_t)p->m + 1);
    p->zero = calloc(rows + 1, 1);
    p->n_rows = calloc((size_t)p->H + 1, sizeof(int32_t));
    p->next = calloc((size_t)p->H + 1, sizeof(int32_t));
    p->rot = malloc(sizeof(double) * (size_t)p->m + 1);
    if (!p->xh || !p->zero || !p->n_rows || !p->next || !p->rot)
        return fk_err(FK_ENOMEM, "pca: out of memory for %d heads x %d tokens x %d", p->H, p->T,
                      p->m);
    return FK_OK;
}

static int reserve(struct pca *p, size_t n_occ)
{
    if (n_occ <= p->cap)
        return FK_OK;
    float **f[] = {&p->a, &p->rq, &p->re};
    for (int i = 0; i < 3; i++) {
        free(*f[i]);
        *f[i] = malloc(sizeof(float) * n_occ * (size_t)p->dim);
    }
    free(p->c);
    free(p->cq);
    free(p->occ);
    p->c = malloc(sizeof(float) * n_occ * (size_t)p->r);
    p->cq = malloc(sizeof(float) * n_occ * (size_t)p->r);
    p->occ = malloc(sizeof(int32_t) * n_occ);
    p->cap = p->a && p->rq && p->re && p->c && p->cq && p->occ ? n_occ : 0;
    return p->cap ? FK_OK : fk_err(FK_ENOMEM, "pca: out of memory for %zu group vectors", n_occ);
}

/* Every row in order (each head's next token), finite, and with g > 1 every group's heads
 * together: rows i .. i+g-1 one token, heads j g .. j g + g - 1. Nothing is committed. */
static int check_event(struct pca *p, const struct fk_event *ev)
{
    memcpy(p->next, p->n_rows, sizeof(int32_t) * (size_t)p->H);
    for (int i = 0; i < ev->n; i++) {
        int h = ev->head[i], t = ev->token[i];
        if (h < 0 || h >= p->H || t != p->next[h] || t >= p->T)
            return fk_err(FK_EINVAL, "pca: event row %d (head %d, token %d) out of order", i, h,
                          t);
        p->next[h]++;
        int lead = i - i % p->g;
        if (p->g > 1 && (ev->token[lead] != t || ev->head[lead] % p->g || h != ev->head[lead] + i % p->g))
            return fk_err(FK_EINVAL, "pca: a group of %d KV heads needs its heads of a token "
                          "together, in order (event row %d is head %d, token %d)", p->g, i, h,
                          t);
        for (int j = 0; j < p->m; j++)
            if (!isfinite(ev->x[(size_t)i * p->m + j]))
                return fk_err(FK_EINVAL, "pca: vector (head %d, token %d) is not finite", h, t);
    }
    if (ev->n % p->g)
        return fk_err(FK_EINVAL, "pca: an event of %d rows is not whole groups of %d heads",
                      ev->n, p->g);
    return FK_OK;
}

/* Row i of the event as the basis sees it: un-rotated (pre) and centered, into dst [m]. */
static void project_input(const struct pca *p, const struct fk_event *ev, int i, int gi, int j,
                          float *dst)
{
    const float *x = ev->x + (size_t)i * p->m;
    const float *mu = p->mean ? p->mean + (size_t)gi * p->dim + (size_t)j * p->m : NULL;
    if (p->pre) {
        size_t half = (size_t)p->m / 2, t = (size_t)ev->token[i];
        for (int c = 0; c < p->m; c++)
            p->rot[c] = x[c];
        fk_rope_apply(p->layout, p->m, p->cs + t * half, p->sn + t * half, -1, p->rot);
        for (int c = 0; c < p->m; c++)
            dst[c] = (float)p->rot[c] - (mu ? mu[c] : 0.0f);
        return;
    }
    for (int c = 0; c < p->m; c++)
        dst[c] = x[c] - (mu ? mu[c] : 0.0f);
}

/* A reconstruction row back in the trace's space: plus the mean, rotated back (pre). */
static void finish_row(const struct pca *p, int token, int gi, int j, float *row)
{
    const float *mu = p->mean ? p->mean + (size_t)gi * p->dim + (size_t)j * p->m : NULL;
    for (int c = 0; mu && c < p->m; c++)
        row[c] += mu[c];
    if (!p->pre)
        return;
    size_t half = (size_t)p->m / 2;
    for (int c = 0; c < p->m; c++)
        p->rot[c] = row[c];
    fk_rope_apply(p->layout, p->m, p->cs + (size_t)token * half, p->sn + (size_t)token * half,
                  +1, p->rot);
    for (int c = 0; c < p->m; c++)
        row[c] = (float)p->rot[c];
}

/* Stored coefficients of one token-group (r values) under the `coef` format. */
static void store_coefs(struct pca *p, const float *c, float *q)
{
    int r = p->r;
    if (p->coef == FK_COEF_FP32) {
        memcpy(q, c, sizeof(float) * (size_t)r);
    } else if (p->coef == FK_COEF_FP16) {
        for (int j = 0; j < r; j++)
            q[j] = fk_fp16_decode(fk_fp16_encode(c[j]));
    } else if (p->coef == FK_COEF_FP8) {
        for (int j = 0; j < r; j++)
            q[j] = fk_fp8_decode(fk_fp8_encode(c[j], &p->saturated));
    } else { /* quant: b-bit levels from the fp16 min in fp16 steps */
        float lo = c[0], hi = c[0];
        for (int j = 1; j < r; j++) {
            lo = c[j] < lo ? c[j] : lo;
            hi = c[j] > hi ? c[j] : hi;
        }
        int top = (1 << p->bits) - 1;
        float mn = fk_fp16_decode(fk_fp16_encode(lo));
        float step = fk_fp16_decode(fk_fp16_encode((float)(((double)hi - mn) / top)));
        for (int j = 0; j < r; j++) {
            float v = step > 0 ? (c[j] - mn) / step : 0.0f;
            v = v < 0 ? 0 : v > (float)top ? (float)top : v;
            q[j] = mn + (float)lrintf(v) * step;
        }
    }
}

/* Coefficients, stored coefficients and both reconstructions of the n_occ group vectors
 * of group gi gathered in p->a (one SGEMM each way). */
static void code_group(struct pca *p, int gi, int n_occ)
{
    const float *U = p->vec + (size_t)gi * p->k * p->dim;
    int r = p->r, dim = p->dim;
    /* outputs zeroed first: OpenBLAS turns a one-row SGEMM into an SGEMV, which multiplies
     * what the output held by beta = 0, so a NaN left in the scratch would survive */
    memset(p->c, 0, sizeof(float) * (size_t)n_occ * r);
    memset(p->rq, 0, sizeof(float) * (size_t)n_occ * dim);
    memset(p->re, 0, sizeof(float) * (size_t)n_occ * dim);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n_occ, r, dim, 1.0f, p->a, dim, U,
                dim, 0.0f, p->c, r);
    for (int q = 0; q < n_occ; q++)
        store_coefs(p, p->c + (size_t)q * r, p->cq + (size_t)q * r);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n_occ, dim, r, 1.0f, p->cq, r, U,
                dim, 0.0f, p->rq, dim);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n_occ, dim, r, 1.0f, p->c, r, U,
                dim, 0.0f, p->re, dim);
    p->macs += 3.0 * n_occ * r * dim;
}

static double rel_err(const float *x, const float *y, int m, double *xx)
{
    double e = 0, n = 0;
    for (int c = 0; c < m; c++) {
        double d = (double)x[c] - y[c];
        e += d * d;
        n += (double)x[c] * x[c];
    }
    *xx = n;
    return n > 0 ? sqrt(e / n) : 0;
}

/* Bytes of one stored token-group's coefficients. */
static double group_bytes(const struct pca *p)
{
    switch (p->coef) {
    case FK_COEF_FP32:
        return 4.0 * p->r;
    case FK_COEF_FP16:
        return 2.0 * p->r;
    case FK_COEF_FP8:
        return 1.0 * p->r;
    default:
        return (double)(((size_t)p->r * p->bits + 7) / 8) + 4;
    }
}

/* Stores the reconstructions of the occurrences of group gi and describes their rows. */
static void commit_group(struct pca *p, const struct fk_event *ev, int n_occ, int gi,
                         struct fk_vec_out *out)
{
    for (int q = 0; q < n_occ; q++) {
        int i0 = p->occ[q], t = ev->token[i0];
        for (int j = 0; j < p->g; j++) {
            int i = i0 + j, h = ev->head[i];
            float *rq = p->rq + (size_t)q * p->dim + (size_t)j * p->m;
            float *re = p->re + (size_t)q * p->dim + (size_t)j * p->m;
            finish_row(p, t, gi, j, rq);
            finish_row(p, t, gi, j, re);
            const float *x = ev->x + (size_t)i * p->m;
            double xx;
            double err = rel_err(x, rq, p->m, &xx), err_enc = rel_err(x, re, p->m, &xx);
            size_t row = (size_t)h * p->T + (size_t)t;
            int zero = xx <= 1e-30;
            p->zero[row] = (uint8_t)zero;
            float *dst = p->xh + row * (size_t)p->m;
            if (zero)
                memset(dst, 0, sizeof(float) * (size_t)p->m);
            else
                memcpy(dst, rq, sizeof(float) * (size_t)p->m);
            int share = p->r / p->g + (j < p->r % p->g);
            out[i] = (struct fk_vec_out){.err_enc = zero ? 0.0f : (float)err_enc,
                                         .err = zero ? 0.0f : (float)err,
                                         .nnz = zero ? 0 : share,
                                         /* a group's bytes go to its first head's row */
                                         .bytes = j == 0 ? (float)group_bytes(p) : 0.0f,
                                         .flags = zero ? FK_VEC_ZERO : 0u};
            p->n_rows[h]++;
        }
    }
    p->groups_total += (uint64_t)n_occ;
}

static int pca_encode(void *state, const struct fk_event *ev, struct fk_vec_out *out)
{
    struct pca *p = state;
    FK_TRY(check_event(p, ev));
    FK_TRY(reserve(p, (size_t)(ev->n / p->g)));
    /* group by group: every occurrence of group gi (one token) shares gi's basis */
    for (int gi = 0; gi < p->G; gi++) {
        int n_occ = 0;
        for (int i = 0; i < ev->n; i += p->g) {
            if (ev->head[i] / p->g != gi)
                continue;
            for (int j = 0; j < p->g; j++)
                project_input(p, ev, i + j, gi, j,
                              p->a + (size_t)n_occ * p->dim + (size_t)j * p->m);
            p->occ[n_occ++] = i;
        }
        if (n_occ == 0)
            continue;
        code_group(p, gi, n_occ);
        commit_group(p, ev, n_occ, gi, out);
    }
    return FK_OK;
}

static int pca_reconstruct(const void *state, int head, int token, float *out)
{
    const struct pca *p = state;
    if (head < 0 || head >= p->H || token < 0 || token >= p->n_rows[head])
        return fk_err(FK_EINVAL, "pca: no stored row (head %d, token %d)", head, token);
    memcpy(out, p->xh + ((size_t)head * p->T + (size_t)token) * p->m, sizeof(float) * (size_t)p->m);
    return FK_OK;
}


static void pca_stats(const void *state, struct fk_stream_stats *st)
{
    const struct pca *p = state;
    memset(st, 0, sizeof *st);
    st->bytes_codes = (double)p->groups_total * group_bytes(p);
    st->bytes_model = (double)p->G * (2.0 * p->dim * p->r + (p->center ? 2.0 * p->dim : 0));
    st->saturated = p->saturated;
    st->macs = p->macs;
}

/* Per vector: its share of the projection and of both reconstructions, 3 r head_dim. */
static double pca_estimate_macs(const void *opts, int m, int n_atoms)
{
    (void)n_atoms;
    return 3.0 * ((const struct pca_opts *)opts)->rank * m;
}

const struct fk_codec_ops fk_codec_pca = {
    .name = "pca",
    .summary = "rank-r projection per head group on a trained PCA basis (dataset key basis; "
               "optionally pre-RoPE keys)",
    .opts_size = sizeof(struct pca_opts),
    .options = pca_options,
    .caps = FK_CAP_BASIS | FK_CAP_STATIC,
    .check = pca_check,
    .needs = pca_needs,
    .open = pca_open,
    .encode = pca_encode,
    .reconstruct = pca_reconstruct,
    .stats = pca_stats,
    .estimate_macs = pca_estimate_macs,
    .close = pca_close,
};
