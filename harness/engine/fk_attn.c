/* SPDX-License-Identifier: MIT
 * Simulated attention fidelity (spec algorithms.md section 10.5): the output of one layer's
 * attention at a decode step with the compressed cache against the exact one.
 *
 * Fast path for sparse codecs (Lexico's query-dictionary product): U = Q D_K^T once per
 * step for every query head (one SGEMM; the dictionary is shared by the heads), then s
 * multiply-adds per compressed key; values go through the codes into atom-space weights
 * W[j][h] = sum_i P_hat_hi c_ij (double), and O_hat = W^T D_V is one SGEMM on the codec's
 * atoms. Other codecs reconstruct each compressed row once per KV head. Logits, softmax,
 * the exact outputs and every accumulator are double; the evaluation order is fixed, so
 * results are bit-identical run to run (BLAS at one thread).
 */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/fk_attn.h"
#include "common/fk_err.h"
#include "kernels/fk_simd.h"

#define TOPK_MAX 32

static const int topk_ks[3] = {1, 8, TOPK_MAX};

struct fk_attn_scratch {
    int m;                        /* head_dim capacity */
    int n_tokens;                 /* T capacity */
    int max_atoms;                /* bound on the atoms of the K and V dictionaries */
    int cap_atoms;                /* atoms u, w and wf hold now (grown on demand:
                                   * a growing codec's bound is far above its usual size) */
    int n_q_heads;                /* query head capacity */
    float *u;                     /* [n_q_heads][max_atoms] q_h . d_j of every query head */
    double *z, *zh;               /* [n_q_heads][n_tokens] exact and compressed logits */
    double *p, *ph;               /* [n_q_heads][n_tokens] their softmax */
    double *lse;                  /* [2][n_q_heads] LSE of z and z_hat */
    double *w;                    /* [max_atoms][n_q_heads] sum_i P_hat_hi c_ij, atom-major */
    float *wf;                    /* [max_atoms][n_q_heads] the same in float, for the SGEMM */
    float *of;                    /* [n_q_heads][m] W^T D_V from the SGEMM */
    float *row;                   /* [m] one reconstructed row */
    float *xrow;                  /* [m] one exact row converted from 16-bit storage */
    double *qd;                   /* [n_q_heads][m] the queries in double */
    double *pw;                   /* [n_q_heads] softmax weights of one token, per head */
    double *o, *oh;               /* [n_q_heads][m] exact and compressed outputs */
    struct fk_attn_metrics *met;  /* [n_q_heads] metrics of the last evaluated step */
    int last_heads;               /* query heads of the last evaluated step, 0 = none */
    int last_m;                   /* head_dim of the last evaluated step */
};

/* ---- numerical helpers (shared by the fast and the naive path) ----------------------- */

/* Dot product in double with four partial sums in a fixed order. */
/* The element-wise kernels below are also built for AVX2 and picked at run time (GCC
 * target_clones). ISO C mode (-std=c11) keeps floating-point contraction off, and the
 * lanes are independent, so every version computes the same bits. */

FK_CLONES static double dotd(const float *a, const float *b, int m)
{
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int c = 0;
    for (; c + 4 <= m; c += 4) {
        s0 += (double)a[c] * b[c];
        s1 += (double)a[c + 1] * b[c + 1];
        s2 += (double)a[c + 2] * b[c + 2];
        s3 += (double)a[c + 3] * b[c + 3];
    }
    for (; c < m; c++)
        s0 += (double)a[c] * b[c];
    return (s0 + s1) + (s2 + s3);
}

/* y += a x */
FK_CLONES static void axpyd(double a, const float *x, double *y, int m)
{
    for (int c = 0; c < m; c++)
        y[c] += a * x[c];
}

/* Multi-head kernels: one row of K or V serves the r query heads of its KV group, widened
 * to double once. GNU vector types (4 doubles) make the lanes explicit; a lane does exactly
 * what one of dotd's four partial sums or one element of axpyd does, in the same order (no
 * contraction in ISO C mode), so the results are the same bits as the one-head kernels. */
#if defined(__GNUC__)
typedef double v4d __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));

/* dst = four floats at x widened (a macro: vector-typed arguments or returns would change
 * the ABI between the clones) */
#define LOAD4(dst, x)                                                                         \
    do {                                                                                      \
        v4f f4_;                                                                              \
        memcpy(&f4_, (x), sizeof f4_);                                                        \
        (dst) = __builtin_convertvector(f4_, v4d);                                            \
    } while (0)

/* out[h] = q_h . k for hb <= 4 heads (rows of qd, stride ldq, already in double) */
static inline void dot_hb(const double *restrict qd, int ldq, int hb, const float *restrict k,
                          int m, double *restrict out)
{
    v4d a[4] = {{0}};
    int c = 0;
    for (; c + 4 <= m; c += 4) {
        v4d kd;
        LOAD4(kd, k + c);
        for (int h = 0; h < hb; h++) {
            v4d q;
            memcpy(&q, qd + (size_t)h * ldq + c, sizeof q);
            a[h] += q * kd;
        }
    }
    for (int h = 0; h < hb; h++) {
        double l[4];
        memcpy(l, &a[h], sizeof l);
        for (int t = c; t < m; t++)
            l[0] += qd[(size_t)h * ldq + t] * k[t];
        out[h] = (l[0] + l[1]) + (l[2] + l[3]);
    }
}

/* y_h += a_h x for the r heads (rows of y, stride m) */
FK_CLONES static void axpy_heads(const double *a, int r, const float *x, double *y, int m)
{
    int c = 0;
    for (; c + 4 <= m; c += 4) {
        v4d xd;
        LOAD4(xd, x + c);
        for (int h = 0; h < r; h++) {
            v4d yv, av = {a[h], a[h], a[h], a[h]};
            double *yh = y + (size_t)h * m + c;
            memcpy(&yv, yh, sizeof yv);
            yv += av * xd;
            memcpy(yh, &yv, sizeof yv);
        }
    }
    for (int h = 0; h < r; h++)
        for (int t = c; t < m; t++)
            y[(size_t)h * m + t] += a[h] * x[t];
}
#else
static void dot_hb(const double *qd, int ldq, int hb, const float *k, int m, double *out)
{
    for (int h = 0; h < hb; h++) {
        const double *q = qd + (size_t)h * ldq;
        double l[4] = {0, 0, 0, 0};
        int c = 0;
        for (; c + 4 <= m; c += 4)
            for (int t = 0; t < 4; t++)
                l[t] += q[c + t] * k[c + t];
        for (; c < m; c++)
            l[0] += q[c] * k[c];
        out[h] = (l[0] + l[1]) + (l[2] + l[3]);
    }
}

static void axpy_heads(const double *a, int r, const float *x, double *y, int m)
{
    for (int h = 0; h < r; h++)
        for (int c = 0; c < m; c++)
            y[(size_t)h * m + c] += a[h] * x[c];
}
#endif

/* out[h] = q_h . k for the r heads (rows of qd), blocks of up to four heads. */
FK_CLONES static void dot_heads(const double *qd, int r, const float *k, int m, double *out)
{
    int h = 0;
    for (; h + 4 <= r; h += 4)
        dot_hb(qd + (size_t)h * m, m, 4, k, m, out + h);
    switch (r - h) {
    case 3: dot_hb(qd + (size_t)h * m, m, 3, k, m, out + h); break;
    case 2: dot_hb(qd + (size_t)h * m, m, 2, k, m, out + h); break;
    case 1: dot_hb(qd + (size_t)h * m, m, 1, k, m, out + h); break;
    default: break;
    }
}

/* p = softmax(z) over n entries with the max subtracted; returns LSE(z). */
static double softmax(const double *z, int n, double *p)
{
    double mx = z[0];
    for (int i = 1; i < n; i++)
        if (z[i] > mx)
            mx = z[i];
    double sum = 0;
    for (int i = 0; i < n; i++) {
        p[i] = exp(z[i] - mx);
        sum += p[i];
    }
    for (int i = 0; i < n; i++)
        p[i] /= sum;
    return mx + log(sum);
}

/* The first visible key of step t: a sliding window sees t-window+1 .. t. */
static int window_lo(const struct fk_attn_in *in)
{
    int lo = in->window > 0 ? in->t - in->window + 1 : 0;
    return lo > 0 ? lo : 0;
}

static double softmax_from(double *z, int n, int lo, double *p);

/* The model's logits from the scaled dot products z[0..n): soft-capped when the layer caps
 * them, then p = softmax over the visible keys lo..n-1 (p = 0 before lo); returns LSE. With
 * neither (the default) this is softmax(z, n, p). */
static double logits_softmax(const struct fk_attn_in *in, double *z, int n, int lo, double *p)
{
    if (in->softcap > 0)
        for (int i = 0; i < n; i++)
            z[i] = in->softcap * tanh(z[i] / in->softcap);
    return softmax_from(z, n, lo, p);
}

/* p = softmax over the visible keys lo..n-1 of z (p = 0 before lo); returns LSE. */
static double softmax_from(double *z, int n, int lo, double *p)
{
    for (int i = 0; i < lo; i++)
        p[i] = 0;
    return softmax(z + lo, n - lo, p + lo);
}

/* The compressed logits zh of KV head g after the layer's cap, with dropped keys at -inf
 * (P_hat = 0 there), then P_hat as logits_softmax. */
static double logits_softmax_kept(const struct fk_attn_in *in, int g, double *zh, int n, int lo,
                                  double *ph)
{
    if (!in->keep)
        return logits_softmax(in, zh, n, lo, ph);
    if (in->softcap > 0)
        for (int i = 0; i < n; i++)
            zh[i] = in->softcap * tanh(zh[i] / in->softcap);
    const uint8_t *kp = in->keep + (size_t)g * in->n_tokens;
    for (int i = 0; i < n; i++)
        if (!kp[i])
            zh[i] = -INFINITY;
    return softmax_from(zh, n, lo, ph);
}

/* Row i of KV head g is retained (no policy: every row). */
static int kept(const struct fk_attn_in *in, int g, int i)
{
    return !in->keep || in->keep[(size_t)g * in->n_tokens + i];
}

int fk_attn_topk(const double *z, int n, int k, int32_t *out)
{
    if (k < 1 || n < 1)
        return 0;
    int cnt = 0;
    for (int i = 0; i < n; i++) {
        if (cnt == k && !(z[i] > z[out[k - 1]]))
            continue;
        int p = cnt < k ? cnt++ : k - 1;
        while (p > 0 && z[i] > z[out[p - 1]]) {
            out[p] = out[p - 1];
            p--;
        }
        out[p] = i;
    }
    return cnt;
}

static void head_metrics(const double *z, const double *zh, const double *p, const double *ph,
                         double lse, double lseh, int n, int n_comp, const double *o,
                         const double *oh, int m, struct fk_attn_metrics *met)
{
    double oo = 0, hh = 0, oh_dot = 0, dd = 0;
    for (int c = 0; c < m; c++) {
        oo += o[c] * o[c];
        hh += oh[c] * oh[c];
        oh_dot += o[c] * oh[c];
        dd += (o[c] - oh[c]) * (o[c] - oh[c]);
    }
    if (oo > 0 && hh > 0) {
        /* sqrt(oo * hh), not sqrt(oo) * sqrt(hh): o == o_hat gives exactly 1 */
        double cs = oh_dot / sqrt(oo * hh);
        met->cos = cs > 1 ? 1 : cs < -1 ? -1 : cs;
    } else {
        met->cos = oo == hh ? 1 : 0;
    }
    met->relerr = oo > 0 ? sqrt(dd) / sqrt(oo) : hh > 0 ? 1 : 0;
    double kl = 0, mass = 0, tv = 0, rkl = 0, ret = 0;
    int dropped = 0;
    for (int i = 0; i < n; i++) {
        if (zh[i] == -INFINITY) { /* a dropped key (eviction): P_hat = 0 */
            dropped = 1;
            tv += p[i];
            continue;
        }
        kl += p[i] * (z[i] - zh[i]);
        tv += fabs(p[i] - ph[i]);
        ret += p[i];
        if (ph[i] > 0)
            rkl += ph[i] * (zh[i] - z[i]);
    }
    met->tv = 0.5 * tv;
    for (int i = 0; i < n_comp; i++)
        mass += p[i];
    /* KL(P || P_hat) is infinite once a key P weighs is dropped: empty (NaN), never inf */
    met->kl = dropped ? NAN : kl - lse + lseh;
    met->mass = mass;
    met->rkl = rkl + lse - lseh;
    met->retained = ret;
    int32_t ta[TOPK_MAX], tb[TOPK_MAX];
    int na = fk_attn_topk(z, n, TOPK_MAX, ta);
    fk_attn_topk(zh, n, TOPK_MAX, tb);
    for (int q = 0; q < 3; q++) {
        int kk = topk_ks[q] < na ? topk_ks[q] : na;
        int hit = 0;
        for (int a = 0; a < kk; a++)
            for (int b = 0; b < kk; b++)
                if (ta[a] == tb[b]) {
                    hit++;
                    break;
                }
        met->top[q] = (double)hit / kk;
    }
}

/* ---- accumulators ---------------------------------------------------------------------- */

int fk_attn_acc_reserve(struct fk_attn_acc *acc, long extra)
{
    if (extra < 0 || acc->n < 0)
        return fk_err(FK_EINVAL, "attention accumulator: negative size");
    long need = acc->n + extra;
    if (need <= acc->cos_cap)
        return FK_OK;
    long cap = acc->cos_cap > 0 ? acc->cos_cap : 64;
    while (cap < need)
        cap *= 2;
    double *v = realloc(acc->cos_vals, sizeof(double) * (size_t)cap);
    if (!v)
        return fk_err(FK_ENOMEM, "out of memory (attention cos values, %ld)", cap);
    acc->cos_vals = v;
    acc->cos_cap = cap;
    return FK_OK;
}

static int acc_add(struct fk_attn_acc *acc, const struct fk_attn_metrics *met, int n_heads)
{
    FK_TRY(fk_attn_acc_reserve(acc, n_heads));
    for (int h = 0; h < n_heads; h++) {
        const struct fk_attn_metrics *e = &met[h];
        acc->cos_vals[acc->n++] = e->cos;
        acc->cos_sum += e->cos;
        acc->relerr_sum += e->relerr;
        acc->kl_sum += e->kl;
        acc->tv_sum += e->tv;
        for (int q = 0; q < 3; q++)
            acc->top_sum[q] += e->top[q];
        acc->mass_sum += e->mass;
        acc->rkl_sum += e->rkl;
        acc->retained_sum += e->retained;
    }
    return FK_OK;
}

void fk_attn_acc_free(struct fk_attn_acc *acc)
{
    if (!acc)
        return;
    free(acc->cos_vals);
    acc->cos_vals = NULL;
    acc->cos_cap = 0;
}

int fk_attn_acc_merge(struct fk_attn_acc *dst, const struct fk_attn_acc *src)
{
    FK_TRY(fk_attn_acc_reserve(dst, src->n));
    if (src->n > 0)
        memcpy(dst->cos_vals + dst->n, src->cos_vals, sizeof(double) * (size_t)src->n);
    dst->n += src->n;
    dst->skipped_steps += src->skipped_steps;
    dst->cos_sum += src->cos_sum;
    dst->relerr_sum += src->relerr_sum;
    dst->kl_sum += src->kl_sum;
    dst->tv_sum += src->tv_sum;
    for (int q = 0; q < 3; q++)
        dst->top_sum[q] += src->top_sum[q];
    dst->mass_sum += src->mass_sum;
    dst->rkl_sum += src->rkl_sum;
    dst->retained_sum += src->retained_sum;
    return FK_OK;
}

/* ---- scratch --------------------------------------------------------------------------- */

void fk_attn_scratch_free(struct fk_attn_scratch **sp)
{
    if (!sp || !*sp)
        return;
    struct fk_attn_scratch *s = *sp;
    free(s->u);
    free(s->z);
    free(s->zh);
    free(s->p);
    free(s->ph);
    free(s->lse);
    free(s->w);
    free(s->wf);
    free(s->of);
    free(s->row);
    free(s->xrow);
    free(s->qd);
    free(s->pw);
    free(s->o);
    free(s->oh);
    free(s->met);
    free(s);
    *sp = NULL;
}

int fk_attn_scratch_create(int m, int n_tokens, int max_atoms, int n_q_heads,
                           struct fk_attn_scratch **out)
{
    *out = NULL;
    if (m < 1 || n_tokens < 1 || max_atoms < 1 || n_q_heads < 1)
        return fk_err(FK_EINVAL, "attention scratch: head_dim %d, tokens %d, atoms %d, query "
                      "heads %d: expected all >= 1", m, n_tokens, max_atoms, n_q_heads);
    struct fk_attn_scratch *s = calloc(1, sizeof *s);
    if (!s)
        return fk_err(FK_ENOMEM, "out of memory (attention scratch)");
    s->m = m;
    s->n_tokens = n_tokens;
    s->max_atoms = max_atoms;
    s->n_q_heads = n_q_heads;
    size_t hq = (size_t)n_q_heads, nt = (size_t)n_tokens;
    s->z = malloc(sizeof(double) * hq * nt);
    s->zh = malloc(sizeof(double) * hq * nt);
    s->p = malloc(sizeof(double) * hq * nt);
    s->ph = malloc(sizeof(double) * hq * nt);
    s->lse = malloc(sizeof(double) * 2 * hq);
    s->row = malloc(sizeof(float) * (size_t)m);
    s->xrow = malloc(sizeof(float) * (size_t)m);
    s->qd = malloc(sizeof(double) * hq * (size_t)m);
    s->pw = malloc(sizeof(double) * hq);
    s->o = malloc(sizeof(double) * hq * (size_t)m);
    s->oh = malloc(sizeof(double) * hq * (size_t)m);
    s->of = malloc(sizeof(float) * hq * (size_t)m);
    s->met = malloc(sizeof(struct fk_attn_metrics) * hq);
    if (!s->z || !s->zh || !s->p || !s->ph || !s->lse || !s->row || !s->xrow || !s->qd ||
        !s->pw || !s->o || !s->oh || !s->of || !s->met) {
        fk_attn_scratch_free(&s);
        return fk_err(FK_ENOMEM, "out of memory (attention scratch: %d query heads, %d "
                      "tokens, %d atoms)", n_q_heads, n_tokens, max_atoms);
    }
    *out = s;
    return FK_OK;
}

int fk_attn_scratch_result(const struct fk_attn_scratch *s, int h, const double **o,
                           const double **o_hat, struct fk_attn_metrics *met)
{
    if (!s || h < 0 || h >= s->last_heads)
        return fk_err(FK_EINVAL, "attention result of query head %d: expected 0 <= h < %d "
                      "(query heads of the last evaluated step)", h, s ? s->last_heads : 0);
    if (o)
        *o = s->o + (size_t)h * s->last_m;
    if (o_hat)
        *o_hat = s->oh + (size_t)h * s->last_m;
    if (met)
        *met = s->met[h];
    return FK_OK;
}

/* ---- evaluation ------------------------------------------------------------------------ */

static int check_in(const struct fk_attn_in *in)
{
    if (in->m < 1 || in->n_kv_heads < 1 || in->n_q_heads < 1 ||
        in->n_q_heads % in->n_kv_heads)
        return fk_err(FK_EINVAL, "attention: head_dim %d, %d query heads, %d KV heads: "
                      "expected head_dim >= 1 and query heads a multiple of KV heads",
                      in->m, in->n_q_heads, in->n_kv_heads);
    if (in->t < 0 || in->t >= in->n_tokens || in->n_comp_k < 0 || in->n_comp_k > in->t + 1 ||
        in->n_comp_v < 0 || in->n_comp_v > in->t + 1)
        return fk_err(FK_EINVAL, "attention: step t = %d, compressed keys %d, values %d, %d "
                      "tokens: expected 0 <= compressed <= t + 1 and t < tokens", in->t,
                      in->n_comp_k, in->n_comp_v, in->n_tokens);
    if (!in->q || !in->k || !in->v)
        return fk_err(FK_EINVAL, "attention: missing queries, keys or values");
    if ((in->n_comp_k > 0 || in->n_comp_v > 0) && (!in->ops || !in->ops->reconstruct || !in->kstate || !in->vstate))
        return fk_err(FK_EINVAL, "attention: compressed rows but no codec states");
    for (int g = 0; in->keep && g < in->n_kv_heads; g++)
        if (!in->keep[(size_t)g * in->n_tokens + in->t])
            return fk_err(FK_EINVAL, "attention: token %d of KV head %d is not retained (an "
                          "eviction policy must keep the current token)", in->t, g);
    return FK_OK;
}

static int use_sparse(const struct fk_codec_ops *ops)
{
    return (ops->caps & FK_CAP_SPARSE) && ops->sparse_row && ops->atoms;
}

static int bad_atom(const char *kind, int g, int i, int j, int n_atoms)
{
    return fk_err(FK_ECORRUPT, "attention: %s row (head %d, token %d) uses atom %d of %d",
                  kind, g, i, j, n_atoms);
}

/* Makes the per-atom arrays hold na atoms (na <= max_atoms, checked by the callers; the
 * capacity may run ahead of max_atoms when the bound itself grows step by step). */
static int atoms_reserve(struct fk_attn_scratch *s, int na)
{
    if (na <= s->cap_atoms)
        return FK_OK;
    /* geometric growth: a growing codec appends atoms one by one, and reallocating these
     * megabyte arrays for every one leaves the heap fragmented */
    long want = (long)s->cap_atoms + s->cap_atoms / 4;
    want = want < na ? na : want;
    size_t n = (size_t)want, hq = (size_t)s->n_q_heads;
    float *u = realloc(s->u, sizeof(float) * hq * n);
    if (u)
        s->u = u;
    double *w = realloc(s->w, sizeof(double) * hq * n);
    if (w)
        s->w = w;
    float *wf = realloc(s->wf, sizeof(float) * hq * n);
    if (wf)
        s->wf = wf;
    if (!u || !w || !wf) /* the arrays that moved stay valid at the old size */
        return fk_err(FK_ENOMEM, "out of memory (attention scratch for %d atoms)", na);
    s->cap_atoms = (int)want;
    return FK_OK;
}

int fk_attn_scratch_reserve(struct fk_attn_scratch *s, int n_atoms)
{
    if (!s || n_atoms < 1)
        return fk_err(FK_EINVAL, "attention scratch: reserving %d atoms: expected >= 1",
                      n_atoms);
    if (n_atoms > s->max_atoms)
        s->max_atoms = n_atoms;
    return atoms_reserve(s, n_atoms);
}

/* U = Q D_K^T: q_h . d_j for every query head h and key atom j, one SGEMM (sparse codecs;
 * the dictionary is shared by all heads of the stream). Returns the atom count in *na. */
static int key_products(const struct fk_attn_in *in, struct fk_attn_scratch *s, int *na)
{
    const float *A = in->ops->atoms(in->kstate, na);
    if (*na < 1 || *na > s->max_atoms || !A)
        return fk_err(FK_EINVAL, "attention: key dictionary has %d atoms, scratch holds %d",
                      *na, s->max_atoms);
    FK_TRY(atoms_reserve(s, *na));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, in->n_q_heads, *na, in->m, 1.0f,
                in->q, in->m, A, in->m, 0.0f, s->u, *na);
    return FK_OK;
}

/* Exact row i of KV head g of K (kind 0) or V (1) as float32 (converted into buf when the
 * rows are kept as 16-bit words). */
static const float *exact_row(const struct fk_attn_in *in, int kind, int g, int i, float *buf)
{
    return fk_stored_row(kind ? in->v : in->k, kind ? in->v_enc : in->k_enc,
                         (size_t)g * in->n_tokens + i, in->m, buf);
}

/* Row i of KV head g as the cache holds it uncompressed: the rewritten row (k_cache,
 * v_cache) or the exact one. */
static const float *cache_row(const struct fk_attn_in *in, int kind, int g, int i, float *buf)
{
    const float *c = kind ? in->v_cache : in->k_cache;
    if (c)
        return c + ((size_t)g * in->n_tokens + i) * in->m;
    return exact_row(in, kind, g, i, buf);
}

/* Compressed logits zh[h][i], i < n_comp, of the r query heads h0.. of KV head g: through
 * the codes and U when na > 0 (sparse codecs), else from reconstructed rows. */
static int keys_compressed(const struct fk_attn_in *in, struct fk_attn_scratch *s, int g,
                           int r, double sqrtm, int na)
{
    const struct fk_codec_ops *ops = in->ops;
    int m = in->m, T = s->n_tokens, h0 = g * r;
    if (na > 0) {
        for (int i = 0; i < in->n_comp_k; i++) {
            int nnz = 0;
            const int32_t *idx = NULL;
            const float *coef = NULL;
            if (!kept(in, g, i))
                continue; /* a dropped row is never read (its logit is set to -inf) */
            FK_TRY(ops->sparse_row(in->kstate, g, i, &nnz, &idx, &coef));
            for (int e = 0; e < nnz; e++)
                if (idx[e] < 0 || idx[e] >= na)
                    return bad_atom("key", g, i, idx[e], na);
            for (int hl = 0; hl < r; hl++) {
                const float *u = s->u + (size_t)(h0 + hl) * na;
                double acc = 0;
                for (int e = 0; e < nnz; e++)
                    acc += (double)coef[e] * u[idx[e]];
                s->zh[(size_t)(h0 + hl) * T + i] = acc / sqrtm;
            }
        }
        return FK_OK;
    }
    /* the kernel of the exact logits: a codec that stores rows exactly gives z_hat == z
     * (FK_CAP_EXACT: its rows are the exact ones, whose logits z the caller has just computed
     * with this kernel: copied) */
    const double *qg = s->qd + (size_t)h0 * m;
    int exact = (ops->caps & FK_CAP_EXACT) != 0 && !in->k_cache; /* rewritten: reconstructed */
    for (int i = 0; i < in->n_comp_k; i++) {
        if (!kept(in, g, i))
            continue;
        if (exact) {
            for (int hl = 0; hl < r; hl++)
                s->zh[(size_t)(h0 + hl) * T + i] = s->z[(size_t)(h0 + hl) * T + i];
            continue;
        }
        FK_TRY(ops->reconstruct(in->kstate, g, i, s->row));
        dot_heads(qg, r, s->row, m, s->pw);
        for (int hl = 0; hl < r; hl++)
            s->zh[(size_t)(h0 + hl) * T + i] = s->pw[hl] / sqrtm;
    }
    return FK_OK;
}


/* Compressed outputs oh[h] of the r query heads h0.. of KV head g from reconstructed rows
 * (codecs without sparse codes), in token order as for o: a codec that stores rows exactly
 * gives o_hat == o. */
static int values_dense(const struct fk_attn_in *in, struct fk_attn_scratch *s, int g, int r)
{
    int m = in->m, T = s->n_tokens, n = in->t + 1, h0 = g * r;
    double *oh = s->oh + (size_t)h0 * m;
    memset(oh, 0, sizeof(double) * (size_t)r * m);
    for (int i = 0; i < n; i++) {
        const float *x;
        if (!kept(in, g, i))
            continue;
        if (i < in->n_comp_v && !(in->ops->caps & FK_CAP_EXACT)) {
            FK_TRY(in->ops->reconstruct(in->vstate, g, i, s->row));
            x = s->row;
        } else { /* the row as cached (an exact codec stores it as it is: FK_CAP_EXACT) */
            x = cache_row(in, 1, g, i, s->xrow);
        }
        for (int hl = 0; hl < r; hl++)
            s->pw[hl] = s->ph[(size_t)(h0 + hl) * T + i];
        axpy_heads(s->pw, r, x, oh, m);
    }
    return FK_OK;
}

/* Compressed outputs of every query head through the codes (sparse codecs): the atom-space
 * weights W[j][h] = sum_i P_hat_hi c_ij over the compressed rows (atom-major: a code updates
 * r adjacent doubles), then O_hat = W^T D_V as one SGEMM on the codec's float atoms (an
 * O_hat within about 1e-6 relative of the double sum: far below any codec's error, and the
 * DGEMM on a double copy of D_V cost more attention time and its memory), then the
 * exact rows of the uncompressed tail in double. */
static int values_sparse(const struct fk_attn_in *in, struct fk_attn_scratch *s)
{
    const struct fk_codec_ops *ops = in->ops;
    int na = 0;
    const float *A = ops->atoms(in->vstate, &na);
    if (na < 1 || na > s->max_atoms || !A)
        return fk_err(FK_EINVAL, "attention: value dictionary has %d atoms, scratch holds %d",
                      na, s->max_atoms);
    FK_TRY(atoms_reserve(s, na));
    int m = in->m, T = s->n_tokens, n = in->t + 1, hq = in->n_q_heads;
    int r = hq / in->n_kv_heads;
    memset(s->w, 0, sizeof(double) * (size_t)na * hq);
    for (int g = 0; g < in->n_kv_heads; g++) {
        int h0 = g * r;
        for (int i = 0; i < in->n_comp_v; i++) {
            int nnz = 0;
            const int32_t *idx = NULL;
            const float *coef = NULL;
            if (!kept(in, g, i))
                continue;
            FK_TRY(ops->sparse_row(in->vstate, g, i, &nnz, &idx, &coef));
            double *pw = s->pw; /* the r heads' weights of token i, gathered once */
            for (int hl = 0; hl < r; hl++)
                pw[hl] = s->ph[(size_t)(h0 + hl) * T + i];
            for (int e = 0; e < nnz; e++) {
                int j = idx[e];
                if (j < 0 || j >= na)
                    return bad_atom("value", g, i, j, na);
                double *wj = s->w + (size_t)j * hq + h0;
                for (int hl = 0; hl < r; hl++)
                    wj[hl] += pw[hl] * coef[e];
            }
        }
    }
    /* O_hat = W^T D_V, one SGEMM on the codec's atoms as they are now (nothing is cached
     * from step to step); W is summed in double, the product in float */
    for (size_t e = 0; e < (size_t)na * hq; e++)
        s->wf[e] = (float)s->w[e];
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, hq, m, na, 1.0f, s->wf, hq, A, m, 0.0f,
                s->of, m);
    for (size_t e = 0; e < (size_t)hq * m; e++)
        s->oh[e] = s->of[e];
    for (int g = 0; g < in->n_kv_heads; g++) {
        for (int i = in->n_comp_v; i < n; i++) {
            if (!kept(in, g, i))
                continue;
            for (int hl = 0; hl < r; hl++)
                s->pw[hl] = s->ph[(size_t)(g * r + hl) * T + i];
            axpy_heads(s->pw, r, cache_row(in, 1, g, i, s->xrow), s->oh + (size_t)g * r * m,
                       m);
        }
    }
    return FK_OK;
}

int fk_attn_eval(const struct fk_attn_in *in, struct fk_attn_scratch *s,
                 struct fk_attn_acc *acc)
{
    FK_TRY(check_in(in));
    if (in->n_comp_k == 0 && in->n_comp_v == 0 && !in->keep && !in->k_cache) {
        acc->skipped_steps++;
        return FK_OK;
    }
    if (in->m > s->m || in->t + 1 > s->n_tokens || in->n_q_heads > s->n_q_heads)
        return fk_err(FK_EINVAL, "attention: head_dim %d, %d visible tokens, %d query heads "
                      "exceed the scratch (%d, %d, %d)", in->m, in->t + 1, in->n_q_heads,
                      s->m, s->n_tokens, s->n_q_heads);
    int m = in->m, n = in->t + 1, nc = in->n_comp_k, T = s->n_tokens, hq = in->n_q_heads;
    int r = hq / in->n_kv_heads;
    double sqrtm = in->inv_scale > 0 ? in->inv_scale : sqrt((double)m);
    int lo = window_lo(in);
    s->last_heads = 0;
    s->last_m = m;
    for (size_t e = 0; e < (size_t)hq * m; e++)
        s->qd[e] = in->q[e];
    int sparse = use_sparse(in->ops), nak = 0;
    if (sparse)
        FK_TRY(key_products(in, s, &nak));
    for (int g = 0; g < in->n_kv_heads; g++) {
        int h0 = g * r;
        /* exact logits, token-major: each key row is widened once for the r heads */
        const double *qg = s->qd + (size_t)h0 * m;
        for (int i = 0; i < n; i++) {
            dot_heads(qg, r, exact_row(in, 0, g, i, s->xrow), m, s->pw);
            for (int hl = 0; hl < r; hl++)
                s->z[(size_t)(h0 + hl) * T + i] = s->pw[hl] / sqrtm;
        }
        for (int hl = 0; hl < r; hl++) {
            size_t off = (size_t)(h0 + hl) * T;
            memcpy(s->zh + off + nc, s->z + off + nc, sizeof(double) * (size_t)(n - nc));
        }
        for (int i = nc; in->k_cache && i < n; i++) { /* rewritten uncompressed keys */
            dot_heads(qg, r, cache_row(in, 0, g, i, s->xrow), m, s->pw);
            for (int hl = 0; hl < r; hl++)
                s->zh[(size_t)(h0 + hl) * T + i] = s->pw[hl] / sqrtm;
        }
        FK_TRY(keys_compressed(in, s, g, r, sqrtm, nak));
        for (int hl = 0; hl < r; hl++) {
            int h = h0 + hl;
            size_t off = (size_t)h * T;
            s->lse[h] = logits_softmax(in, s->z + off, n, lo, s->p + off);
            s->lse[s->n_q_heads + h] = logits_softmax_kept(in, g, s->zh + off, n, lo,
                                                           s->ph + off);
        }
        double *o = s->o + (size_t)h0 * m;
        memset(o, 0, sizeof(double) * (size_t)r * m);
        for (int i = 0; i < n; i++) {
            for (int hl = 0; hl < r; hl++)
                s->pw[hl] = s->p[(size_t)(h0 + hl) * T + i];
            axpy_heads(s->pw, r, exact_row(in, 1, g, i, s->xrow), o, m);
        }
        if (!sparse)
            FK_TRY(values_dense(in, s, g, r));
    }
    if (sparse)
        FK_TRY(values_sparse(in, s));
    for (int h = 0; h < hq; h++) {
        size_t off = (size_t)h * T, oo = (size_t)h * m;
        head_metrics(s->z + off + lo, s->zh + off + lo, s->p + off + lo, s->ph + off + lo,
                     s->lse[h], s->lse[s->n_q_heads + h], n - lo, nc > lo ? nc - lo : 0,
                     s->o + oo, s->oh + oo, m, &s->met[h]);
    }
    s->last_heads = hq;
    return acc_add(acc, s->met, hq);
}

/* ---- the reference path ---------------------------------------------------------------- */

int fk_attn_eval_naive_out(const struct fk_attn_in *in, struct fk_attn_acc *acc,
                           double *o_hat, struct fk_attn_metrics *met)
{
    FK_TRY(check_in(in));
    if (in->n_comp_k == 0 && in->n_comp_v == 0 && !in->keep && !in->k_cache) {
        acc->skipped_steps++;
        return FK_OK;
    }
    int m = in->m, n = in->t + 1, Hkv = in->n_kv_heads, Hq = in->n_q_heads;
    int r = Hq / Hkv;
    double sqrtm = in->inv_scale > 0 ? in->inv_scale : sqrt((double)m);
    int lo = window_lo(in);
    size_t rows = (size_t)Hkv * n * m;
    float *kh = malloc(sizeof(float) * rows), *vh = malloc(sizeof(float) * rows);
    float *xr = malloc(sizeof(float) * (size_t)m); /* an exact row converted from 16 bits */
    double *z = malloc(sizeof(double) * 4 * (size_t)n);
    double *o = malloc(sizeof(double) * 2 * (size_t)m);
    struct fk_attn_metrics *mt = malloc(sizeof *mt * (size_t)Hq);
    int rc = FK_OK;
    if (!kh || !vh || !xr || !z || !o || !mt)
        rc = fk_err(FK_ENOMEM, "out of memory (naive attention)");
    /* dense K_hat, V_hat: codec rows below n_comp_k / n_comp_v, exact rows above */
    for (int g = 0; g < Hkv && rc == FK_OK; g++)
        for (int i = 0; i < n && rc == FK_OK; i++) {
            size_t dst = ((size_t)g * n + i) * m;
            for (int kind = 0; kind < 2 && rc == FK_OK; kind++) {
                float *row = (kind ? vh : kh) + dst;
                if (!kept(in, g, i)) {
                    memset(row, 0, sizeof(float) * (size_t)m); /* never read: P_hat = 0 */
                } else if (i < (kind ? in->n_comp_v : in->n_comp_k)) {
                    rc = in->ops->reconstruct(kind ? in->vstate : in->kstate, g, i, row);
                } else {
                    const float *x = cache_row(in, kind, g, i, row);
                    if (x != row)
                        memcpy(row, x, sizeof(float) * (size_t)m);
                }
            }
        }
    for (int h = 0; h < Hq && rc == FK_OK; h++) {
        int g = h / r;
        const float *q = in->q + (size_t)h * m;
        double *zz = z, *zh = z + n, *p = z + 2 * (size_t)n, *ph = z + 3 * (size_t)n;
        for (int i = 0; i < n; i++) {
            zz[i] = dotd(q, exact_row(in, 0, g, i, xr), m) / sqrtm;
            zh[i] = dotd(q, kh + ((size_t)g * n + i) * m, m) / sqrtm;
        }
        double lse = logits_softmax(in, zz, n, lo, p);
        double lseh = logits_softmax_kept(in, g, zh, n, lo, ph);
        double *oe = o, *oa = o + m;
        memset(o, 0, sizeof(double) * 2 * (size_t)m);
        for (int i = 0; i < n; i++) {
            axpyd(p[i], exact_row(in, 1, g, i, xr), oe, m);
            axpyd(ph[i], vh + ((size_t)g * n + i) * m, oa, m);
        }
        int nc = in->n_comp_k > lo ? in->n_comp_k - lo : 0;
        head_metrics(zz + lo, zh + lo, p + lo, ph + lo, lse, lseh, n - lo, nc, oe, oa, m,
                     &mt[h]);
        if (o_hat)
            memcpy(o_hat + (size_t)h * m, oa, sizeof(double) * (size_t)m);
    }
    if (rc == FK_OK) {
        if (met)
            memcpy(met, mt, sizeof *mt * (size_t)Hq);
        rc = acc_add(acc, mt, Hq);
    }
    free(kh);
    free(xr);
    free(vh);
    free(z);
    free(o);
    free(mt);
    return rc;
}

int fk_attn_eval_naive(const struct fk_attn_in *in, struct fk_attn_acc *acc)
{
    return fk_attn_eval_naive_out(in, acc, NULL, NULL);
}
