/* SPDX-License-Identifier: MIT
 * Simulated attention fidelity (spec algorithms.md section 10.5): the output of one layer's
 * attention at a decode step with the compressed cache against the exact one.
 *
 * Fast path for sparse codecs (Lexico's query-dictionary product): u = q D_K^T once per
 * query head (one SGEMM for the r query heads of a KV group), then s multiply-adds per
 * compressed key; values go through the codes into an atom-space vector w = sum P_hat_i c_i
 * and o_hat = w D_V over the touched atoms only. Other codecs reconstruct each compressed
 * row once per KV head. Logits, softmax and every accumulator are double; the evaluation
 * order is fixed, so results are bit-identical run to run (OpenBLAS at one thread).
 */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fk_attn.h"
#include "fk_err.h"

#define TOPK_MAX 32

static const int topk_ks[3] = {1, 8, TOPK_MAX};

struct fk_attn_scratch {
    int m;                        /* head_dim capacity */
    int n_tokens;                 /* T capacity */
    int max_atoms;                /* atom capacity of the K and V dictionaries */
    int n_q_heads;                /* query head capacity */
    float *u;                     /* [n_q_heads][max_atoms] q . d_j of one KV group */
    double *z, *zh;               /* [n_q_heads][n_tokens] exact and compressed logits */
    double *p, *ph;               /* [n_q_heads][n_tokens] their softmax */
    double *lse;                  /* [2][n_q_heads] LSE of z and z_hat */
    double *w;                    /* [n_q_heads][max_atoms] sum_i P_hat_i c_i (atom space) */
    int32_t *touched;             /* [max_atoms] atoms with a nonzero w, first-touch order */
    uint8_t *mark;                /* [max_atoms] 1 = in touched (all 0 between calls) */
    float *row;                   /* [m] one reconstructed row */
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
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && \
    !defined(__SANITIZE_ADDRESS__)
#define FK_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define FK_CLONES
#endif

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
    double kl = 0, mass = 0, tv = 0;
    for (int i = 0; i < n; i++) {
        kl += p[i] * (z[i] - zh[i]);
        tv += fabs(p[i] - ph[i]);
    }
    met->tv = 0.5 * tv;
    for (int i = 0; i < n_comp; i++)
        mass += p[i];
    met->kl = kl - lse + lseh;
    met->mass = mass;
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
    free(s->touched);
    free(s->mark);
    free(s->row);
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
    size_t hq = (size_t)n_q_heads, na = (size_t)max_atoms, nt = (size_t)n_tokens;
    s->u = malloc(sizeof(float) * hq * na);
    s->z = malloc(sizeof(double) * hq * nt);
    s->zh = malloc(sizeof(double) * hq * nt);
    s->p = malloc(sizeof(double) * hq * nt);
    s->ph = malloc(sizeof(double) * hq * nt);
    s->lse = malloc(sizeof(double) * 2 * hq);
    s->w = malloc(sizeof(double) * hq * na);
    s->touched = malloc(sizeof(int32_t) * na);
    s->mark = calloc(na, 1);
    s->row = malloc(sizeof(float) * (size_t)m);
    s->o = malloc(sizeof(double) * hq * (size_t)m);
    s->oh = malloc(sizeof(double) * hq * (size_t)m);
    s->met = malloc(sizeof(struct fk_attn_metrics) * hq);
    if (!s->u || !s->z || !s->zh || !s->p || !s->ph || !s->lse || !s->w || !s->touched ||
        !s->mark || !s->row || !s->o || !s->oh || !s->met) {
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
    if (in->t < 0 || in->t >= in->n_tokens || in->n_comp < 0 || in->n_comp > in->t)
        return fk_err(FK_EINVAL, "attention: step t = %d, n_comp = %d, %d tokens: expected "
                      "0 <= n_comp <= t < tokens", in->t, in->n_comp, in->n_tokens);
    if (!in->q || !in->k || !in->v)
        return fk_err(FK_EINVAL, "attention: missing queries, keys or values");
    if (in->n_comp > 0 && (!in->ops || !in->ops->reconstruct || !in->kstate || !in->vstate))
        return fk_err(FK_EINVAL, "attention: compressed rows but no codec states");
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

/* Compressed logits zh[hl][i], i < n_comp, of the r query heads of KV head g. */
static int keys_compressed(const struct fk_attn_in *in, struct fk_attn_scratch *s, int g,
                           int r, double sqrtm)
{
    const struct fk_codec_ops *ops = in->ops;
    int m = in->m, T = s->n_tokens;
    const float *qg = in->q + (size_t)g * r * m;
    if (use_sparse(ops)) {
        int na = 0;
        const float *A = ops->atoms(in->kstate, &na);
        if (na < 1 || na > s->max_atoms || !A)
            return fk_err(FK_EINVAL, "attention: key dictionary has %d atoms, scratch holds "
                          "%d", na, s->max_atoms);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r, na, m, 1.0f, qg, m, A, m,
                    0.0f, s->u, na);
        for (int i = 0; i < in->n_comp; i++) {
            int nnz = 0;
            const int32_t *idx = NULL;
            const float *coef = NULL;
            FK_TRY(ops->sparse_row(in->kstate, g, i, &nnz, &idx, &coef));
            for (int e = 0; e < nnz; e++)
                if (idx[e] < 0 || idx[e] >= na)
                    return bad_atom("key", g, i, idx[e], na);
            for (int hl = 0; hl < r; hl++) {
                const float *u = s->u + (size_t)hl * na;
                double acc = 0;
                for (int e = 0; e < nnz; e++)
                    acc += (double)coef[e] * u[idx[e]];
                s->zh[(size_t)hl * T + i] = acc / sqrtm;
            }
        }
        return FK_OK;
    }
    for (int i = 0; i < in->n_comp; i++) {
        FK_TRY(ops->reconstruct(in->kstate, g, i, s->row));
        for (int hl = 0; hl < r; hl++)
            s->zh[(size_t)hl * T + i] = dotd(qg + (size_t)hl * m, s->row, m) / sqrtm;
    }
    return FK_OK;
}

/* Compressed outputs oh[hl] of the r query heads of KV head g (from the softmax ph). */
static int values_compressed(const struct fk_attn_in *in, struct fk_attn_scratch *s, int g,
                             int r)
{
    const struct fk_codec_ops *ops = in->ops;
    int m = in->m, T = s->n_tokens, n = in->t + 1;
    int hq0 = g * r;
    const float *vg = in->v + (size_t)g * in->n_tokens * m;
    double *oh = s->oh + (size_t)hq0 * m;
    memset(oh, 0, sizeof(double) * (size_t)r * m);
    if (!use_sparse(ops)) {
        /* token order, as for o: a codec that stores rows exactly gives o_hat == o */
        for (int i = 0; i < n; i++) {
            const float *x = vg + (size_t)i * m;
            if (i < in->n_comp) {
                FK_TRY(ops->reconstruct(in->vstate, g, i, s->row));
                x = s->row;
            }
            for (int hl = 0; hl < r; hl++)
                axpyd(s->ph[(size_t)hl * T + i], x, oh + (size_t)hl * m, m);
        }
        return FK_OK;
    }
    int na = 0;
    const float *A = ops->atoms(in->vstate, &na);
    if (na < 1 || na > s->max_atoms || !A)
        return fk_err(FK_EINVAL, "attention: value dictionary has %d atoms, scratch holds %d",
                      na, s->max_atoms);
    int nt = 0, rc = FK_OK;
    for (int i = 0; i < in->n_comp && rc == FK_OK; i++) {
        int nnz = 0;
        const int32_t *idx = NULL;
        const float *coef = NULL;
        rc = ops->sparse_row(in->vstate, g, i, &nnz, &idx, &coef);
        for (int e = 0; e < nnz && rc == FK_OK; e++) {
            int j = idx[e];
            if (j < 0 || j >= na) {
                rc = bad_atom("value", g, i, j, na);
                break;
            }
            if (!s->mark[j]) {
                s->mark[j] = 1;
                s->touched[nt++] = j;
                for (int hl = 0; hl < r; hl++)
                    s->w[(size_t)hl * na + j] = 0;
            }
            for (int hl = 0; hl < r; hl++)
                s->w[(size_t)hl * na + j] += s->ph[(size_t)hl * T + i] * coef[e];
        }
    }
    if (rc < 0) {
        for (int a = 0; a < nt; a++)
            s->mark[s->touched[a]] = 0;
        return rc;
    }
    /* o_hat += w D_V over the touched atoms in index order (streams the dictionary; the
     * first-touch order would jump around it and miss the cache on every atom) */
    for (int j = 0, left = nt; left > 0; j++) {
        if (!s->mark[j])
            continue;
        s->mark[j] = 0;
        left--;
        const float *a = A + (size_t)j * m;
        for (int hl = 0; hl < r; hl++)
            axpyd(s->w[(size_t)hl * na + j], a, oh + (size_t)hl * m, m);
    }
    for (int i = in->n_comp; i < n; i++)
        for (int hl = 0; hl < r; hl++)
            axpyd(s->ph[(size_t)hl * T + i], vg + (size_t)i * m, oh + (size_t)hl * m, m);
    return FK_OK;
}

int fk_attn_eval(const struct fk_attn_in *in, struct fk_attn_scratch *s,
                 struct fk_attn_acc *acc)
{
    FK_TRY(check_in(in));
    if (in->n_comp == 0) {
        acc->skipped_steps++;
        return FK_OK;
    }
    if (in->m > s->m || in->t + 1 > s->n_tokens || in->n_q_heads > s->n_q_heads)
        return fk_err(FK_EINVAL, "attention: head_dim %d, %d visible tokens, %d query heads "
                      "exceed the scratch (%d, %d, %d)", in->m, in->t + 1, in->n_q_heads,
                      s->m, s->n_tokens, s->n_q_heads);
    int m = in->m, n = in->t + 1, nc = in->n_comp, T = s->n_tokens;
    int r = in->n_q_heads / in->n_kv_heads;
    double sqrtm = sqrt((double)m);
    s->last_heads = 0;
    s->last_m = m;
    for (int g = 0; g < in->n_kv_heads; g++) {
        int hq0 = g * r;
        const float *kg = in->k + (size_t)g * in->n_tokens * m;
        const float *vg = in->v + (size_t)g * in->n_tokens * m;
        for (int hl = 0; hl < r; hl++) {
            const float *q = in->q + (size_t)(hq0 + hl) * m;
            double *z = s->z + (size_t)hl * T, *zh = s->zh + (size_t)hl * T;
            for (int i = 0; i < n; i++)
                z[i] = dotd(q, kg + (size_t)i * m, m) / sqrtm;
            memcpy(zh + nc, z + nc, sizeof(double) * (size_t)(n - nc));
        }
        FK_TRY(keys_compressed(in, s, g, r, sqrtm));
        for (int hl = 0; hl < r; hl++) {
            size_t off = (size_t)hl * T;
            s->lse[hl] = softmax(s->z + off, n, s->p + off);
            s->lse[s->n_q_heads + hl] = softmax(s->zh + off, n, s->ph + off);
            double *o = s->o + (size_t)(hq0 + hl) * m;
            memset(o, 0, sizeof(double) * (size_t)m);
            for (int i = 0; i < n; i++)
                axpyd(s->p[off + i], vg + (size_t)i * m, o, m);
        }
        FK_TRY(values_compressed(in, s, g, r));
        for (int hl = 0; hl < r; hl++) {
            size_t off = (size_t)hl * T, oo = (size_t)(hq0 + hl) * m;
            head_metrics(s->z + off, s->zh + off, s->p + off, s->ph + off, s->lse[hl],
                         s->lse[s->n_q_heads + hl], n, nc, s->o + oo, s->oh + oo, m,
                         &s->met[hq0 + hl]);
        }
    }
    s->last_heads = in->n_q_heads;
    return acc_add(acc, s->met, in->n_q_heads);
}

/* ---- the reference path ---------------------------------------------------------------- */

int fk_attn_eval_naive_out(const struct fk_attn_in *in, struct fk_attn_acc *acc,
                           double *o_hat, struct fk_attn_metrics *met)
{
    FK_TRY(check_in(in));
    if (in->n_comp == 0) {
        acc->skipped_steps++;
        return FK_OK;
    }
    int m = in->m, n = in->t + 1, Hkv = in->n_kv_heads, Hq = in->n_q_heads;
    int r = Hq / Hkv;
    double sqrtm = sqrt((double)m);
    size_t rows = (size_t)Hkv * n * m;
    float *kh = malloc(sizeof(float) * rows), *vh = malloc(sizeof(float) * rows);
    double *z = malloc(sizeof(double) * 4 * (size_t)n);
    double *o = malloc(sizeof(double) * 2 * (size_t)m);
    struct fk_attn_metrics *mt = malloc(sizeof *mt * (size_t)Hq);
    int rc = FK_OK;
    if (!kh || !vh || !z || !o || !mt)
        rc = fk_err(FK_ENOMEM, "out of memory (naive attention)");
    /* dense K_hat, V_hat: codec rows below n_comp, exact rows above */
    for (int g = 0; g < Hkv && rc == FK_OK; g++)
        for (int i = 0; i < n && rc == FK_OK; i++) {
            size_t src = ((size_t)g * in->n_tokens + i) * m, dst = ((size_t)g * n + i) * m;
            if (i < in->n_comp) {
                rc = in->ops->reconstruct(in->kstate, g, i, kh + dst);
                if (rc == FK_OK)
                    rc = in->ops->reconstruct(in->vstate, g, i, vh + dst);
            } else {
                memcpy(kh + dst, in->k + src, sizeof(float) * (size_t)m);
                memcpy(vh + dst, in->v + src, sizeof(float) * (size_t)m);
            }
        }
    for (int h = 0; h < Hq && rc == FK_OK; h++) {
        int g = h / r;
        const float *q = in->q + (size_t)h * m;
        double *zz = z, *zh = z + n, *p = z + 2 * (size_t)n, *ph = z + 3 * (size_t)n;
        for (int i = 0; i < n; i++) {
            zz[i] = dotd(q, in->k + ((size_t)g * in->n_tokens + i) * m, m) / sqrtm;
            zh[i] = dotd(q, kh + ((size_t)g * n + i) * m, m) / sqrtm;
        }
        double lse = softmax(zz, n, p), lseh = softmax(zh, n, ph);
        double *oe = o, *oa = o + m;
        memset(o, 0, sizeof(double) * 2 * (size_t)m);
        for (int i = 0; i < n; i++) {
            axpyd(p[i], in->v + ((size_t)g * in->n_tokens + i) * m, oe, m);
            axpyd(ph[i], vh + ((size_t)g * n + i) * m, oa, m);
        }
        head_metrics(zz, zh, p, ph, lse, lseh, n, in->n_comp, oe, oa, m, &mt[h]);
        if (o_hat)
            memcpy(o_hat + (size_t)h * m, oa, sizeof(double) * (size_t)m);
    }
    if (rc == FK_OK) {
        if (met)
            memcpy(met, mt, sizeof *mt * (size_t)Hq);
        rc = acc_add(acc, mt, Hq);
    }
    free(kh);
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
