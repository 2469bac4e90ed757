/* SPDX-License-Identifier: MIT
 * OMP core (spec: algorithms.md 3.3, 3.4, 3.8): correlations (one SGEMM), Batch-OMP in
 * Gram mode and the naive reference mode that recomputes D_C^T r every iteration.
 *
 * Gram mode is a progressive Cholesky with the Lexico/Zhu "v0" correlation update: the
 * factor L of G_SS (double) grows by one row per accepted atom (w = L^{-1} G_{S,j} from
 * the fetched Gram row j), and the residual correlations c = D^T r are updated with the
 * orthonormalised row q_k^T D = (G_j - sum_l w_l q_l^T D) / L_kk, fused with the |max|
 * search in one vectorisable pass. One Gram row is read per iteration. Already selected,
 * excluded and dead atoms are never chosen: the fused pass finds the maximum over all
 * atoms (these have |c| ~ 0) and a masked rescan runs when the first maximiser is banned.
 */
#define _DEFAULT_SOURCE /* madvise, MADV_HUGEPAGE */
#include "kernels/fk_sparse.h"

#include "common/fk_err.h"
#include "kernels/fk_blas.h"
#include "kernels/fk_dot.h"
#include "kernels/fk_simd.h"

#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define STRIP 256 /* atoms per strip of the fused update (1 KiB of stack) */


void fk_correlate(const struct fk_dict_view *d, const float *x, int nx, float *a)
{
    fk_correlate_to(d->atoms, d->n_atoms, d->m, x, nx, a, (size_t)d->n_atoms);
}

void fk_correlate_to(const float *atoms, int n_atoms, int m, const float *x, int nx, float *a,
                     size_t lda)
{
    if (nx <= 0 || n_atoms <= 0)
        return;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nx, n_atoms, m, 1.0f, x, m, atoms, m,
                0.0f, a, (int)lda);
}

float *fk_gram_alloc(size_t n_floats)
{
    enum { PAGE_2M = 2 << 20 };
    if (n_floats * sizeof(float) < PAGE_2M / 2) /* a huge page would be mostly zeroed waste */
        return aligned_alloc(64, (n_floats * sizeof(float) + 63) / 64 * 64 + 64);
    size_t bytes = (n_floats * sizeof(float) + PAGE_2M - 1) / PAGE_2M * PAGE_2M;
    float *g = aligned_alloc(PAGE_2M, bytes ? bytes : PAGE_2M);
#ifdef MADV_HUGEPAGE
    if (g)
        (void)madvise(g, bytes ? bytes : PAGE_2M, MADV_HUGEPAGE); /* advice only: may be refused */
#endif
    return g;
}

int fk_gram_compute(const float *atoms, int n_atoms, int m, float *gram)
{
    if (n_atoms <= 0 || m <= 0 || !atoms || !gram)
        return fk_err(FK_EINVAL, "fk_gram_compute: expected n_atoms > 0, m > 0, got %d, %d",
                      n_atoms, m);
    size_t n = (size_t)n_atoms;
    /* OpenBLAS's threaded SSYRK partitions differently per thread count and the bits change;
     * one BLAS thread keeps G identical whatever the caller's setting. */
    int saved = fk_blas_single();
    cblas_ssyrk(CblasRowMajor, CblasUpper, CblasNoTrans, n_atoms, m, 1.0f, atoms, m, 0.0f,
                gram, n_atoms);
    /* mirror the upper triangle in 64 x 64 tiles, each copied row by row into a local buffer
     * first: a column walk of the matrix itself misses the cache on every element, and when
     * the row stride is a multiple of 4 KiB (N = 4096) the rows of a tile even share their L1
     * sets */
    enum { B = 64, BP = B + 1 };
    float tile[B * BP];
    for (size_t i0 = 0; i0 < n; i0 += B)
        for (size_t j0 = 0; j0 <= i0; j0 += B) {
            size_t i1 = i0 + B < n ? i0 + B : n, j1 = j0 + B < n ? j0 + B : n;
            for (size_t j = j0; j < j1; j++)
                memcpy(tile + (j - j0) * BP, gram + j * n + i0, sizeof(float) * (i1 - i0));
            for (size_t i = i0; i < i1; i++)
                for (size_t j = j0; j < j1 && j < i; j++)
                    gram[i * n + j] = tile[(j - j0) * BP + (i - i0)];
        }
    fk_blas_restore(saved);
    return FK_OK;
}

static int clamp_s(int s, int m)
{
    if (s > m)
        s = m;
    if (s > FK_SMAX)
        s = FK_SMAX;
    return s < 1 ? 1 : s;
}

/* Work layout (in floats, from the first 64-byte boundary; each array starts on one),
 * shared by both modes:
 *   [0, dbl)          doubles: L (s*s), z, w, gamma (s each), rx (m)
 *   c                 n_atoms floats: residual correlations
 *   smax              n_atoms/STRIP + 1 floats: per-strip maxima
 *   r                 m floats (naive residual)
 *   mask              n_atoms bytes: 1 = selected or excluded
 *   scratch           n_atoms floats (rounded up to 16): Gram row scratch for d->gram_row
 *   dm                (s - 1) rows of n_atoms floats, each row 64-byte aligned (stride
 *                     ldm, a multiple of 16): q_k^T D rows (Gram mode), then 16 floats
 * Naive mode with candidates uses scratch .. the end of dm (s * n_atoms floats, from a 64-byte
 * boundary) as its pool copy when the candidates' rows fit. */
struct omp_ws {
    double *L;      /* (s, s) lower triangular, row-major */
    double *z;      /* (s) L^{-1} a_S */
    double *w;      /* (s) forward-solve result */
    double *gamma;  /* (s) coefficients */
    double *rx;     /* (m) residual in double */
    float *c;       /* (n_atoms) or (nc) residual correlations */
    float *scratch; /* (n_atoms) Gram row scratch */
    float *smax;    /* (n_atoms / STRIP + 1) strip maxima */
    float *r;       /* (m) residual in float */
    uint8_t *mask;  /* (n_atoms) banned atoms */
    float *dm;      /* (s - 1, ldm) orthonormalised correlation rows */
    size_t ldm;     /* their stride: n_atoms rounded up to 16 floats (aligned loads) */
    float *end;     /* one past the last float of dm and its slack */
};

#define R16(x) (((x) + 15) & ~(size_t)15)

static size_t ws_layout(int n_atoms, int m, int s, float *work, struct omp_ws *ws)
{
    size_t n = (size_t)n_atoms, sm = (size_t)s;
    size_t ndbl = sm * sm + 3 * sm + (size_t)m;
    /* offsets from the first 64-byte boundary in work (16 floats of slack), each array on
     * a boundary of its own: the passes' 64-byte loads and stores never straddle lines */
    size_t off = R16(2 * ndbl);
    size_t c_off = off;
    off += R16(n);
    size_t smax_off = off;
    off += R16(n / STRIP + 2);
    size_t r_off = off;
    off += R16((size_t)m);
    size_t mask_off = off;
    off += R16((n + 3) / 4);
    size_t scr_off = off;
    off += R16(n);
    size_t dm_off = off, ldm = R16(n);
    off += (sm > 1 ? sm - 1 : 0) * ldm + 16; /* + 16: the end's slack */
    if (work && ws) {
        float *base = (float *)(void *)(((uintptr_t)work + 63) & ~(uintptr_t)63);
        double *dbl = (double *)(void *)base;
        ws->L = dbl;
        ws->z = dbl + sm * sm;
        ws->w = ws->z + sm;
        ws->gamma = ws->w + sm;
        ws->rx = ws->gamma + sm;
        ws->c = base + c_off;
        ws->scratch = base + scr_off;
        ws->smax = base + smax_off;
        ws->r = base + r_off;
        ws->mask = (uint8_t *)(base + mask_off);
        ws->dm = base + dm_off;
        ws->ldm = ldm;
        ws->end = base + off;
    }
    return off + 16;
}

size_t fk_omp_work_floats(int n_atoms, int m, int s)
{
    if (n_atoms < 1)
        n_atoms = 1;
    if (m < 1)
        m = 1;
    return ws_layout(n_atoms, m, clamp_s(s, m), NULL, NULL);
}

/* |f| as its bit pattern: for non-negative non-NaN floats the unsigned order of the bits is
 * the numeric order, and integer max reductions vectorise without -ffast-math. */
static inline uint32_t absbits(float f)
{
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return b & 0x7FFFFFFFu;
}

static inline float frombits(uint32_t b)
{
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

/* One full strip of the fused update: t = g - sum_l wf_l * dm_l; out = t * inv;
 * c -= zk * out; returns max |c| over the strip. The strip goes in chunks of CH floats whose
 * t stays in vector registers while the k rows stream past (one load per row element, no
 * stores of t); each element's operations and their order are those of strip_tail, so every
 * clone, vector width and chunking gives the same bits. Two widths, each clone with the
 * registers of its own: 16-float vectors (4 of them) where AVX-512 runs, 8-float vectors (8
 * of them) for AVX2 and the baseline (64-byte vectors there are split in two and spilled to
 * the stack around every multiply: 3.3x slower end to end on AVX2). */
#define CH 64 /* floats of t held in registers: 4 x 16 or 8 x 8 */
typedef float v16f __attribute__((vector_size(64)));
typedef float v8f __attribute__((vector_size(32)));

/* unaligned loads and stores (macros: a function returning a 32- or 64-byte vector would
 * change the ABI between clones) */
#define LD16(p) (__extension__({ v16f v_; memcpy(&v_, (p), sizeof v_); v_; }))
#define ST16(p, v) memcpy((p), &(v), sizeof(v16f))
#define LD8(p) (__extension__({ v8f v_; memcpy(&v_, (p), sizeof v_); v_; }))
#define ST8(p, v) memcpy((p), &(v), sizeof(v8f))

static inline float strip_max(const float *restrict c)
{
    uint32_t mb = 0;
    for (int i = 0; i < STRIP; i++) /* from L1, in lane-wise maxima */
        mb = absbits(c[i]) > mb ? absbits(c[i]) : mb;
    return frombits(mb);
}

FK_AVX512_ONLY static float strip_full16(const float *restrict g, const float *restrict dm,
                                         size_t ld, const float *restrict wf, int k, float inv,
                                         float zk, float *restrict c, float *restrict out)
{
    for (int i0 = 0; i0 < STRIP; i0 += CH) {
        v16f t0 = LD16(g + i0), t1 = LD16(g + i0 + 16), t2 = LD16(g + i0 + 32),
             t3 = LD16(g + i0 + 48);
        for (int l = 0; l < k; l++) {
            const float *r = dm + (size_t)l * ld + i0;
            float w = wf[l];
            t0 = t0 - w * LD16(r);
            t1 = t1 - w * LD16(r + 16);
            t2 = t2 - w * LD16(r + 32);
            t3 = t3 - w * LD16(r + 48);
        }
        t0 = t0 * inv;
        t1 = t1 * inv;
        t2 = t2 * inv;
        t3 = t3 * inv;
        ST16(out + i0, t0);
        ST16(out + i0 + 16, t1);
        ST16(out + i0 + 32, t2);
        ST16(out + i0 + 48, t3);
        v16f c0 = LD16(c + i0) - zk * t0, c1 = LD16(c + i0 + 16) - zk * t1,
             c2 = LD16(c + i0 + 32) - zk * t2, c3 = LD16(c + i0 + 48) - zk * t3;
        ST16(c + i0, c0);
        ST16(c + i0 + 16, c1);
        ST16(c + i0 + 32, c2);
        ST16(c + i0 + 48, c3);
    }
    return strip_max(c);
}

FK_CLONES static float strip_full8(const float *restrict g, const float *restrict dm,
                                   size_t ld, const float *restrict wf, int k, float inv,
                                   float zk, float *restrict c, float *restrict out)
{
    for (int i0 = 0; i0 < STRIP; i0 += CH) {
        v8f t0 = LD8(g + i0), t1 = LD8(g + i0 + 8), t2 = LD8(g + i0 + 16),
            t3 = LD8(g + i0 + 24), t4 = LD8(g + i0 + 32), t5 = LD8(g + i0 + 40),
            t6 = LD8(g + i0 + 48), t7 = LD8(g + i0 + 56);
        for (int l = 0; l < k; l++) {
            const float *r = dm + (size_t)l * ld + i0;
            float w = wf[l];
            t0 = t0 - w * LD8(r);
            t1 = t1 - w * LD8(r + 8);
            t2 = t2 - w * LD8(r + 16);
            t3 = t3 - w * LD8(r + 24);
            t4 = t4 - w * LD8(r + 32);
            t5 = t5 - w * LD8(r + 40);
            t6 = t6 - w * LD8(r + 48);
            t7 = t7 - w * LD8(r + 56);
        }
        v8f ts[8] = {t0 * inv, t1 * inv, t2 * inv, t3 * inv,
                     t4 * inv, t5 * inv, t6 * inv, t7 * inv};
        for (int j = 0; j < 8; j++) {
            ST8(out + i0 + 8 * j, ts[j]);
            v8f cj = LD8(c + i0 + 8 * j) - zk * ts[j];
            ST8(c + i0 + 8 * j, cj);
        }
    }
    return strip_max(c);
}

static float strip_full(const float *restrict g, const float *restrict dm, size_t ld,
                        const float *restrict wf, int k, float inv, float zk, float *restrict c,
                        float *restrict out)
{
    if (fk_have_avx512())
        return strip_full16(g, dm, ld, wf, k, inv, zk, c, out);
    return strip_full8(g, dm, ld, wf, k, inv, zk, c, out);
}

/* Tail strip (len < STRIP); the same arithmetic per element as strip_full, in loops over
 * the elements that vectorise (an element's chain over l runs in the same order). At N 128
 * every atom goes through here. */
FK_CLONES static float strip_tail(int len, const float *restrict g, const float *restrict dm,
                                  size_t ld, const float *restrict wf, int k, float inv,
                                  float zk, float *restrict c, float *restrict out)
{
    float t[STRIP];
    for (int i = 0; i < len; i++)
        t[i] = g[i];
    for (int l = 0; l < k; l++) {
        const float *restrict r = dm + (size_t)l * ld;
        float w = wf[l];
        for (int i = 0; i < len; i++)
            t[i] -= w * r[i];
    }
    uint32_t mb = 0;
    for (int i = 0; i < len; i++) {
        float v = t[i] * inv;
        out[i] = v;
        float cv = c[i] - zk * v;
        c[i] = cv;
        uint32_t b = absbits(cv);
        b = b > 0x7F800000u ? 0 : b; /* a NaN is passed over, as a float max would */
        mb = b > mb ? b : mb;
    }
    return frombits(mb);
}

/* c = a (copy) and strip maxima of |c|. */
FK_CLONES static float strip_copy(const float *restrict a, float *restrict c)
{
    uint32_t mb = 0;
    for (int i = 0; i < STRIP; i++) {
        float v = a[i];
        c[i] = v;
        mb = absbits(v) > mb ? absbits(v) : mb;
    }
    return frombits(mb);
}

static int is_banned(const uint8_t *mask, const uint8_t *dead, int j)
{
    return mask[j] || (dead && dead[j]);
}

/* Masked argmax over all atoms (rare path): largest |c|, ties to the lowest index. */
static int argmax_masked(const float *c, int n, const uint8_t *mask, const uint8_t *dead,
                         float *best)
{
    int bj = -1;
    float bv = -1.0f;
    for (int i = 0; i < n; i++) {
        if (is_banned(mask, dead, i))
            continue;
        float v = fabsf(c[i]);
        if (v > bv) {
            bv = v;
            bj = i;
        }
    }
    *best = bv;
    return bj;
}

static int first_match(const float *restrict c, int nc, int32_t mb, int *count);

/* Argmax over the strip maxima: the first strip holding mx, then the first index in it (one
 * vectorised pass over the strip; |c_i| == mx exactly when the bit patterns are equal, NaN
 * aside, which finds nothing as before). */
static int argmax_lookup(const float *c, int n, const float *smax, float mx)
{
    if (isnan(mx))
        return -1;
    int ns = (n + STRIP - 1) / STRIP;
    for (int s = 0; s < ns; s++) {
        if (smax[s] != mx)
            continue;
        int lo = s * STRIP, hi = lo + STRIP < n ? lo + STRIP : n, cnt;
        int p = first_match(c + lo, hi - lo, (int32_t)absbits(mx), &cnt);
        if (cnt > 0)
            return lo + p;
    }
    return -1;
}

static int check_finite(const float *x, int m)
{
    for (int i = 0; i < m; i++)
        if (!isfinite(x[i]))
            return i;
    return -1;
}

/* gamma = L^{-T} z for the k x k leading block (row-major, stride ld). */
static void back_solve(const double *L, int ld, int k, const double *z, double *gamma)
{
    for (int i = k - 1; i >= 0; i--) {
        double v = z[i];
        for (int l = i + 1; l < k; l++)
            v -= L[l * ld + i] * gamma[l];
        gamma[i] = v / L[i * ld + i];
    }
}

/* ||x - D_S gamma||^2 recomputed from the atoms in double; rx receives the residual. */
static double resid_energy(const struct fk_dict_view *d, const float *x, const int32_t *idx,
                           const double *gamma, int k, double *rx)
{
    int m = d->m;
    for (int i = 0; i < m; i++)
        rx[i] = x[i];
    for (int l = 0; l < k; l++) {
        const float *at = d->atoms + (size_t)idx[l] * m;
        double g = gamma[l];
        for (int i = 0; i < m; i++)
            rx[i] -= g * at[i];
    }
    double e = 0.0;
    for (int i = 0; i < m; i++)
        e += rx[i] * rx[i];
    return e;
}

static void code_init(struct fk_code *out, double xx)
{
    out->k = 0;
    out->xx = xx;
    out->err2 = xx;
    out->flags = 0;
    out->iters = 0;
}

static int count_live(const uint8_t *dead, const int32_t *cand, int nc)
{
    if (!dead)
        return nc;
    int live = 0;
    for (int i = 0; i < nc; i++)
        live += !dead[cand ? cand[i] : i];
    return live;
}

/* Forward solve L w = g (k x k block), returns ||w||^2. */
static double fwd_solve(const double *L, int ld, int k, const double *g, double *w)
{
    double ww = 0.0;
    for (int i = 0; i < k; i++) {
        double v = g[i];
        for (int l = 0; l < i; l++)
            v -= L[i * ld + l] * w[l];
        w[i] = v / L[i * ld + i];
        ww += w[i] * w[i];
    }
    return ww;
}

/* Row k of the Cholesky factor L (stride ld) from w = L^{-1} G_{S,j} and ww = ||w||^2, with
 * L_kk in *lkk, or 0 when the candidate depends on the support (delta^2 <= 1e-6 G_jj, spec
 * 3.3). */
static int chol_row(double *L, int ld, int k, double gjj, double ww, const double *w,
                    double *lkk)
{
    double delta2 = gjj - ww;
    if (!(gjj > 0) || delta2 <= 1e-6 * gjj)
        return 0;
    *lkk = sqrt(delta2);
    for (int l = 0; l < k; l++)
        L[k * ld + l] = w[l];
    L[k * ld + k] = *lkk;
    return 1;
}

/* Extends the Cholesky factor L of the support's Gram (k rows, stride ld) by a candidate
 * with G_jj = gjj and G_{S,j} in w (overwritten by L^{-1} G_{S,j}): chol_row. */
static int chol_extend(double *L, int ld, int k, double gjj, double *w, double *lkk)
{
    return chol_row(L, ld, k, gjj, fwd_solve(L, ld, k, w, w), w, lkk);
}

static int check_args(const struct fk_dict_view *d, const float *x, int s, const char *who)
{
    if (!d || !x || !d->atoms || d->m <= 0 || d->n_atoms < 0)
        return fk_err(FK_EINVAL, "%s: expected a dictionary view with m > 0 and atoms", who);
    if (s < 0 || s > FK_SMAX)
        return fk_err(FK_EINVAL, "%s: sparsity %d outside 0..%d", who, s, FK_SMAX);
    int bad = check_finite(x, d->m);
    if (bad >= 0)
        return fk_err(FK_EINVAL, "%s: input vector element %d is not finite (%g)", who, bad,
                      (double)x[bad]);
    return FK_OK;
}

/* Common start of both OMP modes: initialises the code and handles the zero vector and a
 * vector already within tolerance (spec 3.3, section 11). Returns s_eff = min(s, m, live
 * candidates), or 0 when the code is complete as it is. */
static int omp_start(double xx, double tol_rel, int s, int m, int live, struct fk_code *out)
{
    code_init(out, xx);
    if (xx <= 1e-30) {
        out->flags |= FK_CODE_ZERO;
        return 0;
    }
    double tol2 = tol_rel > 0 ? tol_rel * tol_rel * xx : -1.0;
    if (xx <= tol2) {
        out->flags |= FK_CODE_TOL;
        return 0;
    }
    int s_eff = s < m ? s : m;
    return s_eff < live ? s_eff : live;
}

/* Entry i of a Gram row, and len entries from i on as one array: in place, or copied into
 * buf (len floats) when they straddle the row's seam. */
static inline const float *row_ptr(const struct fk_gram_row *r, size_t i)
{
    return !r->tail || i < (size_t)r->split ? r->head + i : r->tail + (i - (size_t)r->split);
}

static const float *row_span(const struct fk_gram_row *r, size_t i, size_t len, float *buf)
{
    size_t sp = (size_t)r->split;
    if (!r->tail || i + len <= sp || i >= sp)
        return row_ptr(r, i);
    memcpy(buf, r->head + i, sizeof(float) * (sp - i));
    memcpy(buf + (sp - i), r->tail, sizeof(float) * (i + len - sp));
    return buf;
}

/* One vector's Batch-OMP in Gram mode as a resumable state: omp_init, then omp_step until
 * it is no longer active (each step accepts or excludes one candidate and, when the code
 * goes on, runs the fused correlation pass and selects the next candidate, fetching its Gram
 * row). The batch driver keeps several of these in flight so that the Gram row one vector
 * will read next is prefetched during another vector's correlation pass; every vector's
 * arithmetic is the same whatever the interleaving, so the codes are bit-identical. */
struct gstate {
    struct omp_ws ws;
    const struct fk_dict_view *d;
    const float *x, *a;
    struct fk_code *out;
    struct fk_gram_row grow; /* Gram row of the selected candidate j */
    double xx, tol2, zz;
    int n, ld, s_eff, k, j, have_max, active;
    float mx;
};

/* The precision guard (fk_sparse.h, fk_omp_gram): out holds the code of k atoms with
 * coefficients gamma and its recomputed err2; guard_energy(kp) recomputes
 * ||x - D_S' gamma'||^2 for a prefix of kp atoms, with gamma' in gamma, as the mode does. */
#define GUARD_LOSS 1e-3
static void resid_naive(const float *restrict atoms, int m, const float *restrict x,
                        const int32_t *idx, const double *gamma, int k, double *restrict rx,
                        float *restrict r);
static double energy_naive(const double *rx, int m);

struct guard {
    const struct fk_dict_view *d;
    const float *x;
    const double *L, *z;
    int ld, naive;
    double *gamma, *rx;
    float *r;
};

static double guard_energy(const struct guard *gd, const struct fk_code *out, int kp)
{
    if (gd->naive) {
        resid_naive(gd->d->atoms, gd->d->m, gd->x, out->idx, gd->gamma, kp, gd->rx, gd->r);
        return energy_naive(gd->rx, gd->d->m);
    }
    return resid_energy(gd->d, gd->x, out->idx, gd->gamma, kp, gd->rx);
}

static void precision_guard(const struct guard *gd, double zz, struct fk_code *out)
{
    int k = out->k;
    if (k < 1 || !(out->err2 - (out->xx - zz) > GUARD_LOSS * out->xx))
        return;
    int best = k;
    double be = out->err2;
    for (int kp = k - 1; kp >= 0; kp--) {
        back_solve(gd->L, gd->ld, kp, gd->z, gd->gamma);
        double e = kp ? guard_energy(gd, out, kp) : out->xx;
        if (e <= be) { /* ties to the shorter code */
            be = e;
            best = kp;
        }
    }
    if (best == k)
        return;
    back_solve(gd->L, gd->ld, best, gd->z, gd->gamma);
    for (int l = 0; l < best; l++)
        out->coef[l] = gd->gamma[l];
    out->k = best;
    out->err2 = be;
    out->flags |= FK_CODE_GUARDED;
}

static void omp_finish(struct gstate *g)
{
    struct fk_code *out = g->out;
    out->k = g->k;
    back_solve(g->ws.L, g->ld, g->k, g->ws.z, g->ws.gamma);
    for (int l = 0; l < g->k; l++)
        out->coef[l] = g->ws.gamma[l];
    out->err2 = resid_energy(g->d, g->x, out->idx, g->ws.gamma, g->k, g->ws.rx);
    struct guard gd = {.d = g->d, .x = g->x, .L = g->ws.L, .z = g->ws.z, .ld = g->ld,
                       .naive = 0, .gamma = g->ws.gamma, .rx = g->ws.rx, .r = g->ws.r};
    precision_guard(&gd, g->zz, out);
    g->active = 0;
}

/* Selects the next candidate (largest |c| not yet selected, excluded or dead) and fetches its
 * Gram row, or finishes the code when the correlations are spent. */
static void omp_select(struct gstate *g)
{
    const struct fk_dict_view *d = g->d;
    int j;
    float best;
    if (g->have_max) {
        j = argmax_lookup(g->ws.c, g->n, g->ws.smax, g->mx);
        best = g->mx;
        if (j < 0 || is_banned(g->ws.mask, d->dead, j))
            j = argmax_masked(g->ws.c, g->n, g->ws.mask, d->dead, &best);
    } else {
        j = argmax_masked(g->ws.c, g->n, g->ws.mask, d->dead, &best);
    }
    if (j < 0 || (double)best * best <= 1e-24 * g->xx) {
        g->out->flags |= FK_CODE_PREMATURE;
        omp_finish(g);
        return;
    }
    g->j = j;
    g->grow = d->gram_row(d->gram_ctx, j, g->ws.scratch);
    /* the step starts with G_jj and G_{S,j}, scattered over the row and far ahead of its
     * pass: fetch them now, while the other vector in flight runs its pass */
    __builtin_prefetch(row_ptr(&g->grow, (size_t)j), 0, 3);
    for (int l = 0; l < g->k; l++)
        __builtin_prefetch(row_ptr(&g->grow, (size_t)g->out->idx[l]), 0, 3);
    /* the atom is read again by omp_finish (the residual), after many Gram rows went by */
    const float *at = d->atoms + (size_t)j * (size_t)d->m;
    for (int i = 0; i < d->m; i += 16)
        __builtin_prefetch(at + i, 0, 3);
}

/* Starts the code of x (correlations a); live: live atoms of d. Leaves g active with a
 * selected candidate, or finished. */
static void omp_init(struct gstate *g, const struct fk_dict_view *d, const float *x,
                     const float *a, int s, double tol_rel, int live, float *work,
                     struct fk_code *out)
{
    g->d = d;
    g->x = x;
    g->a = a;
    g->out = out;
    g->n = d->n_atoms;
    g->active = 0;
    int m = d->m, n = d->n_atoms;
    g->xx = fk_dot_seq(x, x, m);
    g->s_eff = omp_start(g->xx, tol_rel, s, m, live, out);
    if (g->s_eff <= 0)
        return;
    g->tol2 = tol_rel > 0 ? tol_rel * tol_rel * g->xx : -1.0;
    ws_layout(n, m, clamp_s(s, m), work, &g->ws);
    g->ld = clamp_s(s, m); /* row stride of L */
    memset(g->ws.mask, 0, (size_t)n);
    int nfull = n / STRIP, ns = (n + STRIP - 1) / STRIP;
    float mx = 0.0f;
    for (int b = 0; b < nfull; b++) {
        float v = strip_copy(a + (size_t)b * STRIP, g->ws.c + (size_t)b * STRIP);
        g->ws.smax[b] = v;
        mx = v > mx ? v : mx;
    }
    if (nfull < ns) {
        float v = 0.0f;
        for (int i = nfull * STRIP; i < n; i++) {
            g->ws.c[i] = a[i];
            float av = fabsf(a[i]);
            v = av > v ? av : v;
        }
        g->ws.smax[nfull] = v;
        mx = v > mx ? v : mx;
    }
    g->mx = mx;
    g->k = 0;
    g->zz = 0.0;
    g->have_max = 1; /* mx and smax are valid for the current c */
    g->active = 1;
    omp_select(g);
}

/* Prefetches one strip (STRIP floats) of a Gram row another vector reads next. */
static inline void prefetch_strip(const float *p)
{
    if (p)
        for (int i = 0; i < STRIP; i += 16)
            __builtin_prefetch(p + i, 0, 3);
}

/* Accepts or excludes the selected candidate; when the code goes on, updates the correlations
 * (c -= z_k q_k^T D with q_k^T D = (G_j - sum_l w_l q_l^T D) / L_kk, fused with the max) while
 * prefetching pf (a Gram row, NULL = none), then selects the next candidate. */
static void omp_step(struct gstate *g, const struct fk_gram_row *pf)
{
    struct omp_ws *ws = &g->ws;
    struct fk_code *out = g->out;
    const int ld = g->ld, k0 = g->k, j = g->j;
    const struct fk_gram_row *grow = &g->grow;
    out->iters++;
    double gjj = *row_ptr(grow, (size_t)j);
    for (int l = 0; l < k0; l++)
        ws->w[l] = *row_ptr(grow, (size_t)out->idx[l]); /* g = G_{S,j}, solved below */
    double lkk;
    if (!chol_extend(ws->L, ld, k0, gjj, ws->w, &lkk)) {
        ws->mask[j] = 1;
        out->flags |= FK_CODE_DEPENDENT;
        g->have_max = 0;
        omp_select(g);
        return;
    }
    double wz = 0.0;
    for (int l = 0; l < k0; l++)
        wz += ws->w[l] * ws->z[l];
    double zk = ((double)g->a[j] - wz) / lkk;
    ws->z[k0] = zk;
    g->zz += zk * zk;
    out->idx[k0] = j;
    ws->mask[j] = 1;
    int k = ++g->k;
    if (g->tol2 >= 0 && g->xx - g->zz <= g->tol2)
        out->flags |= FK_CODE_TOL;
    if ((out->flags & FK_CODE_TOL) || k == g->s_eff) {
        omp_finish(g);
        return;
    }
    float wf[FK_SMAX];
    for (int l = 0; l < k - 1; l++)
        wf[l] = (float)ws->w[l];
    const size_t nn = (size_t)g->n;
    const int nfull = g->n / STRIP, ns = (g->n + STRIP - 1) / STRIP;
    float inv = (float)(1.0 / lkk), zf = (float)zk;
    const size_t ldm = ws->ldm;
    float *dmk = ws->dm + (size_t)(k - 1) * ldm;
    int keep = k + 1 < g->s_eff; /* the row of the last update is never read again */
    float sink[STRIP], seam[STRIP];
    float mx = 0.0f;
    for (int b = 0; b < nfull; b++) {
        size_t o = (size_t)b * STRIP;
        prefetch_strip(pf ? row_ptr(pf, o) : NULL);
        float v = strip_full(row_span(grow, o, STRIP, seam), ws->dm + o, ldm, wf, k - 1, inv,
                             zf, ws->c + o, keep ? dmk + o : sink);
        ws->smax[b] = v;
        mx = v > mx ? v : mx;
    }
    if (nfull < ns) {
        size_t o = (size_t)nfull * STRIP;
        float v = strip_tail(g->n - (int)o, row_span(grow, o, nn - o, seam), ws->dm + o, ldm,
                             wf, k - 1, inv, zf, ws->c + o, dmk + o);
        ws->smax[nfull] = v;
        mx = v > mx ? v : mx;
    }
    g->mx = mx;
    g->have_max = 1;
    omp_select(g);
}

static int check_gram_args(const struct fk_dict_view *d, const float *a, const float *work,
                           const struct fk_code *out, const char *who)
{
    if (!d || !d->gram_row || !a || !work || !out)
        return fk_err(FK_EINVAL, "%s: expected a Gram row function, a, work, out", who);
    return FK_OK;
}

int fk_omp_gram(const struct fk_dict_view *d, const float *x, const float *a, int s,
                double tol_rel, float *work, struct fk_code *out)
{
    FK_TRY(check_args(d, x, s, "fk_omp_gram"));
    FK_TRY(check_gram_args(d, a, work, out, "fk_omp_gram"));
    struct gstate g;
    omp_init(&g, d, x, a, s, tol_rel, count_live(d->dead, NULL, d->n_atoms), work, out);
    while (g.active)
        omp_step(&g, NULL);
    return FK_OK;
}

size_t fk_omp_batch_work_floats(int n_atoms, int m, int s)
{
    return FK_OMP_LANES * (fk_omp_work_floats(n_atoms, m, s) + 16);
}

/* A vector's Gram row is worth prefetching when its next step runs a correlation pass. */
static const struct fk_gram_row *row_to_prefetch(const struct gstate *g)
{
    return g->active && g->k + 1 < g->s_eff ? &g->grow : NULL;
}

int fk_omp_gram_batch(const struct fk_dict_view *d, int nx, const float *x, const float *a,
                      size_t lda, int s, double tol_rel, float *work, struct fk_code *out)
{
    if (nx <= 0)
        return FK_OK;
    FK_TRY(check_gram_args(d, a, work, out, "fk_omp_gram_batch"));
    for (int i = 0; i < nx; i++)
        FK_TRY(check_args(d, x + (size_t)i * d->m, s, "fk_omp_gram_batch"));
    int live = count_live(d->dead, NULL, d->n_atoms);
    size_t wf = fk_omp_work_floats(d->n_atoms, d->m, s) + 16;
    struct gstate g[FK_OMP_LANES];
    int next = 0, busy = 0;
    /* a lane takes the next vector whose code does not finish at its start */
    for (int l = 0; l < FK_OMP_LANES; l++) {
        g[l].active = 0;
        while (!g[l].active && next < nx) {
            omp_init(&g[l], d, x + (size_t)next * d->m, a + (size_t)next * lda, s, tol_rel,
                     live, work + (size_t)l * wf, &out[next]);
            next++;
        }
        busy += g[l].active;
    }
    for (int l = 0; busy > 0; l = (l + 1) % FK_OMP_LANES) {
        if (!g[l].active)
            continue;
        const struct fk_gram_row *pf = NULL;
        for (int o = 1; o < FK_OMP_LANES; o++) { /* the next lane to step */
            const struct gstate *h = &g[(l + o) % FK_OMP_LANES];
            if (h->active) {
                pf = row_to_prefetch(h);
                break;
            }
        }
        omp_step(&g[l], pf);
        while (!g[l].active && next < nx) {
            omp_init(&g[l], d, x + (size_t)next * d->m, a + (size_t)next * lda, s, tol_rel,
                     live, work + (size_t)l * wf, &out[next]);
            next++;
        }
        busy -= !g[l].active;
    }
    return FK_OK;
}

/* ---- naive mode ----------------------------------------------------------------------- */

#define FL 8  /* float accumulator lanes of the candidate correlations */

/* Sum of 8 float lanes in a fixed pairwise order. */
static inline float lsum8(const float *a)
{
    float b[4];
    for (int l = 0; l < 4; l++)
        b[l] = a[l] + a[l + 4];
    return (b[0] + b[2]) + (b[1] + b[3]);
}

/* d . r in float: FL lanes of fused multiply-adds over whole groups of FL coordinates, then
 * the remaining coordinates in lane order. fmaf rounds once everywhere, so every clone gives
 * the same bits (the x86-64-v3 clone in hardware). */
FK_FMA_CLONES static float corr1(const float *restrict d, const float *restrict r, int m)
{
    float acc[FL] = {0};
    int mf = m - m % FL;
    for (int i = 0; i < mf; i += FL)
        for (int l = 0; l < FL; l++)
            acc[l] = fmaf(d[i + l], r[i + l], acc[l]);
    float s = lsum8(acc);
    for (int i = mf; i < m; i++)
        s = fmaf(d[i], r[i], s);
    return s;
}

/* Eight rows (m a multiple of FL) sharing the loads of r; each equals corr1 of its row. */
FK_FMA_CLONES static void corr8(const float *const *restrict d, const float *restrict r, int m,
                                float *restrict out)
{
    const float *restrict d0 = d[0], *restrict d1 = d[1], *restrict d2 = d[2];
    const float *restrict d3 = d[3], *restrict d4 = d[4], *restrict d5 = d[5];
    const float *restrict d6 = d[6], *restrict d7 = d[7];
    float a0[FL] = {0}, a1[FL] = {0}, a2[FL] = {0}, a3[FL] = {0};
    float a4[FL] = {0}, a5[FL] = {0}, a6[FL] = {0}, a7[FL] = {0};
    for (int i = 0; i < m; i += FL)
        for (int l = 0; l < FL; l++) {
            float rv = r[i + l];
            a0[l] = fmaf(d0[i + l], rv, a0[l]);
            a1[l] = fmaf(d1[i + l], rv, a1[l]);
            a2[l] = fmaf(d2[i + l], rv, a2[l]);
            a3[l] = fmaf(d3[i + l], rv, a3[l]);
            a4[l] = fmaf(d4[i + l], rv, a4[l]);
            a5[l] = fmaf(d5[i + l], rv, a5[l]);
            a6[l] = fmaf(d6[i + l], rv, a6[l]);
            a7[l] = fmaf(d7[i + l], rv, a7[l]);
        }
    out[0] = lsum8(a0);
    out[1] = lsum8(a1);
    out[2] = lsum8(a2);
    out[3] = lsum8(a3);
    out[4] = lsum8(a4);
    out[5] = lsum8(a5);
    out[6] = lsum8(a6);
    out[7] = lsum8(a7);
}

/* corr8 that also copies the eight rows into blk, interleaved by groups of FL coordinates:
 * blk[i * 8 + q * FL + l] = row q [i + l] (i a multiple of FL). */
FK_FMA_CLONES static void corr8_copy(const float *const *restrict d, const float *restrict r,
                                     int m, float *restrict out, float *restrict blk)
{
    const float *restrict d0 = d[0], *restrict d1 = d[1], *restrict d2 = d[2];
    const float *restrict d3 = d[3], *restrict d4 = d[4], *restrict d5 = d[5];
    const float *restrict d6 = d[6], *restrict d7 = d[7];
    float a0[FL] = {0}, a1[FL] = {0}, a2[FL] = {0}, a3[FL] = {0};
    float a4[FL] = {0}, a5[FL] = {0}, a6[FL] = {0}, a7[FL] = {0};
    for (int i = 0; i < m; i += FL) {
        float *restrict b = blk + (size_t)i * 8;
        for (int l = 0; l < FL; l++) {
            float rv = r[i + l];
            a0[l] = fmaf(d0[i + l], rv, a0[l]);
            a1[l] = fmaf(d1[i + l], rv, a1[l]);
            a2[l] = fmaf(d2[i + l], rv, a2[l]);
            a3[l] = fmaf(d3[i + l], rv, a3[l]);
            a4[l] = fmaf(d4[i + l], rv, a4[l]);
            a5[l] = fmaf(d5[i + l], rv, a5[l]);
            a6[l] = fmaf(d6[i + l], rv, a6[l]);
            a7[l] = fmaf(d7[i + l], rv, a7[l]);
            b[l] = d0[i + l];
            b[FL + l] = d1[i + l];
            b[2 * FL + l] = d2[i + l];
            b[3 * FL + l] = d3[i + l];
            b[4 * FL + l] = d4[i + l];
            b[5 * FL + l] = d5[i + l];
            b[6 * FL + l] = d6[i + l];
            b[7 * FL + l] = d7[i + l];
        }
    }
    out[0] = lsum8(a0);
    out[1] = lsum8(a1);
    out[2] = lsum8(a2);
    out[3] = lsum8(a3);
    out[4] = lsum8(a4);
    out[5] = lsum8(a5);
    out[6] = lsum8(a6);
    out[7] = lsum8(a7);
}

/* corr8 on a block written by corr8_copy (one sequential stream); the same bits. */
FK_FMA_CLONES static void corr8_blk(const float *restrict blk, const float *restrict r, int m,
                                    float *restrict out)
{
    float a0[FL] = {0}, a1[FL] = {0}, a2[FL] = {0}, a3[FL] = {0};
    float a4[FL] = {0}, a5[FL] = {0}, a6[FL] = {0}, a7[FL] = {0};
    for (int i = 0; i < m; i += FL) {
        const float *restrict b = blk + (size_t)i * 8;
        for (int l = 0; l < FL; l++) {
            float rv = r[i + l];
            a0[l] = fmaf(b[l], rv, a0[l]);
            a1[l] = fmaf(b[FL + l], rv, a1[l]);
            a2[l] = fmaf(b[2 * FL + l], rv, a2[l]);
            a3[l] = fmaf(b[3 * FL + l], rv, a3[l]);
            a4[l] = fmaf(b[4 * FL + l], rv, a4[l]);
            a5[l] = fmaf(b[5 * FL + l], rv, a5[l]);
            a6[l] = fmaf(b[6 * FL + l], rv, a6[l]);
            a7[l] = fmaf(b[7 * FL + l], rv, a7[l]);
        }
    }
    out[0] = lsum8(a0);
    out[1] = lsum8(a1);
    out[2] = lsum8(a2);
    out[3] = lsum8(a3);
    out[4] = lsum8(a4);
    out[5] = lsum8(a5);
    out[6] = lsum8(a6);
    out[7] = lsum8(a7);
}

/* c[p] = d_{cand[p]} . r for the nc candidates, eight rows at a time (the rest one by one;
 * every row gets corr1's bits). pool (nullable): room for the first nc - nc % 8 rows; the
 * first call copies them (*pool_ready = 1), later calls stream the copy. */
static void corr_cand(const float *atoms, int m, const int32_t *cand, int nc, const float *r,
                      float *c, float *pool, int *pool_ready)
{
    int p = 0;
    if (m % FL == 0) {
        size_t bs = (size_t)8 * m; /* floats per block of eight rows */
        for (; p + 8 <= nc; p += 8) {
            float *blk = pool ? pool + (size_t)(p / 8) * bs : NULL;
            if (pool && *pool_ready) {
                corr8_blk(blk, r, m, c + p);
                continue;
            }
            const float *rows[8];
            for (int q = 0; q < 8; q++)
                rows[q] = atoms + (size_t)cand[p + q] * m;
            if (pool)
                corr8_copy(rows, r, m, c + p, blk);
            else
                corr8(rows, r, m, c + p);
        }
        if (pool)
            *pool_ready = 1;
    }
    for (; p < nc; p++)
        c[p] = corr1(atoms + (size_t)cand[p] * m, r, m);
}

/* r = x - D_S gamma: rx in double (atoms subtracted in support order), r rounded to float. */
FK_CLONES static void resid_naive(const float *restrict atoms, int m, const float *restrict x,
                                  const int32_t *idx, const double *gamma, int k,
                                  double *restrict rx, float *restrict r)
{
    int i0 = 0;
    for (; i0 + FK_RB <= m; i0 += FK_RB) {
        double t[FK_RB];
        fk_resid_block(atoms, m, idx, gamma, k, x, i0, t);
        for (int i = 0; i < FK_RB; i++) {
            rx[i0 + i] = t[i];
            r[i0 + i] = (float)t[i];
        }
    }
    for (int i = i0; i < m; i++) {
        rx[i] = fk_resid_coord(atoms, m, idx, gamma, k, x, i);
        r[i] = (float)rx[i];
    }
}

/* ||rx||^2 with FK_DL lanes. */
static double energy_naive(const double *rx, int m)
{
    double acc[FK_DL] = {0};
    for (int i = 0; i < m; i++)
        acc[i % FK_DL] += rx[i] * rx[i];
    return fk_lanes_sum(acc);
}

/* Candidate-restricted argmax for naive mode: |c_i| largest, ties to the smaller atom id. */
static int argmax_cand(const float *c, const int32_t *cand, int nc, const uint8_t *mask,
                       const uint8_t *dead, float *best)
{
    int bp = -1, bj = -1;
    float bv = -1.0f;
    for (int p = 0; p < nc; p++) {
        int j = cand ? cand[p] : p;
        if (is_banned(mask, dead, j))
            continue;
        float v = fabsf(c[p]);
        if (v > bv || (v == bv && j < bj)) {
            bv = v;
            bj = j;
            bp = p;
        }
    }
    *best = bv;
    return bp;
}

/* Largest |c_p| as its bit pattern (a NaN gives a pattern above 0x7F800000). */
FK_CLONES static int32_t absmax_bits(const float *restrict c, int nc)
{
    int32_t mb = 0;
    for (int p = 0; p < nc; p++) {
        int32_t b = (int32_t)absbits(c[p]);
        mb = b > mb ? b : mb;
    }
    return mb;
}

/* The first position holding |c_p| bits == mb, and how many do (vectorised). */
FK_CLONES512 static int first_match(const float *restrict c, int nc, int32_t mb, int *count)
{
    int pos = nc, cnt = 0;
    for (int p = 0; p < nc; p++) {
        int eq = (int32_t)absbits(c[p]) == mb;
        int q = eq ? p : nc;
        cnt += eq;
        pos = q < pos ? q : pos;
    }
    *count = cnt;
    return pos;
}

/* argmax_cand through one vectorised max over every position: the answer is the smallest
 * unbanned atom id holding that maximum. Selected atoms have |c| ~ 0, so the maximiser is
 * almost never banned; when it is (or c holds a NaN), the masked scan decides. */
static int argmax_fast(const float *c, const int32_t *cand, int nc, const uint8_t *mask,
                       const uint8_t *dead, float *best)
{
    int32_t mb = absmax_bits(c, nc);
    if (mb > 0x7F800000)
        return argmax_cand(c, cand, nc, mask, dead, best);
    int count, bp = first_match(c, nc, mb, &count);
    if (count == 1 && !is_banned(mask, dead, cand ? cand[bp] : bp)) {
        *best = frombits((uint32_t)mb);
        return bp;
    }
    int bj = -1; /* ties, or a banned maximiser */
    bp = -1;
    for (int p = 0; p < nc; p++) {
        if ((int32_t)absbits(c[p]) != mb)
            continue;
        int j = cand ? cand[p] : p;
        if (!is_banned(mask, dead, j) && (bj < 0 || j < bj)) {
            bp = p;
            bj = j;
        }
    }
    if (bp < 0)
        return argmax_cand(c, cand, nc, mask, dead, best);
    *best = frombits((uint32_t)mb);
    return bp;
}

/* Naive OMP; gss non-NULL (the pool coder): the Gram entries fk_dot_fd(d_p, d_q) of the
 * accepted atoms go to gss (row-major, stride FK_SMAX, both triangles) as they are computed,
 * and a code with k > 0 ends without its coefficients and residual (the caller refines). */
/* The arguments of the naive OMP: the candidate list (NULL: every atom, *nc = N) in range. */
static int naive_args(const struct fk_dict_view *d, const float *x, int s, const float *work,
                      const struct fk_code *out, const int32_t *cand, int *nc)
{
    FK_TRY(check_args(d, x, s, "fk_omp_naive"));
    if (!work || !out)
        return fk_err(FK_EINVAL, "fk_omp_naive: expected work and out");
    int n = d->n_atoms;
    if (!cand)
        *nc = n;
    if (*nc < 0 || *nc > n)
        return fk_err(FK_EINVAL, "fk_omp_naive: %d candidates for %d atoms", *nc, n);
    for (int p = 0; cand && p < *nc; p++)
        if (cand[p] < 0 || cand[p] >= n)
            return fk_err(FK_EINVAL, "fk_omp_naive: candidate %d is atom %d, outside 0..%d", p,
                          cand[p], n - 1);
    return FK_OK;
}

/* Row and column k of the support's Gram matrix G_SS ([FK_SMAX][FK_SMAX], symmetric): the
 * products with the earlier atoms and the new atom's own. */
static void gss_add(double *gss, int k, const double *g_prev, double gjj)
{
    double *row = gss + (size_t)k * FK_SMAX;
    for (int l = 0; l < k; l++) {
        row[l] = g_prev[l];
        gss[(size_t)l * FK_SMAX + k] = g_prev[l];
    }
    row[k] = gjj;
}

static int omp_naive(const struct fk_dict_view *d, const float *x, const float *a,
                     const int32_t *cand, int nc, int s, double tol_rel, float *work,
                     struct fk_code *out, double *gss)
{
    FK_TRY(naive_args(d, x, s, work, out, cand, &nc));
    int n = d->n_atoms, m = d->m;
    double xx = fk_dot_fd(x, x, m);
    int s_eff = omp_start(xx, tol_rel, s, m, count_live(d->dead, cand, nc), out);
    if (s_eff <= 0)
        return FK_OK;
    double tol2 = tol_rel > 0 ? tol_rel * tol_rel * xx : -1.0;

    struct omp_ws ws;
    ws_layout(n, m, clamp_s(s, m), work, &ws);
    const int ld = clamp_s(s, m);
    memset(ws.mask, 0, (size_t)n);
    const float *r = x;
    double gss_w[FK_SMAX]; /* G_{S,j} before the forward solve overwrites it */
    /* pool copy for the candidates' rows (64-byte aligned) when it fits in scratch .. dm */
    float *pool = NULL;
    int pool_ready = 0;
    if (cand && m % FL == 0 && nc >= 8) {
        uintptr_t p0 = ((uintptr_t)ws.scratch + 63) & ~(uintptr_t)63;
        float *pa = (float *)(void *)p0;
        if (pa < ws.end && (size_t)(nc / 8) * 8 * (size_t)m <= (size_t)(ws.end - pa))
            pool = pa;
    }

    for (;;) {
        /* c = D_C^T r (first pass: the given a when available) */
        if (r == x && a) {
            for (int p = 0; p < nc; p++)
                ws.c[p] = a[cand ? cand[p] : p];
        } else if (!cand) {
            cblas_sgemv(CblasRowMajor, CblasNoTrans, n, m, 1.0f, d->atoms, m, r, 1, 0.0f, ws.c,
                        1);
        } else {
            corr_cand(d->atoms, m, cand, nc, r, ws.c, pool, &pool_ready);
        }
        int accepted = 0;
        while (!accepted) {
            float best;
            int p = argmax_fast(ws.c, cand, nc, ws.mask, d->dead, &best);
            if (p < 0 || (double)best * best <= 1e-24 * xx) {
                out->flags |= FK_CODE_PREMATURE;
                goto done;
            }
            int j = cand ? cand[p] : p;
            out->iters++;
            int k = out->k;
            const float *dj = d->atoms + (size_t)j * m;
            const float *rows[FK_SMAX + 1]; /* dj . dj, then d_l . dj for the support */
            double dots[FK_SMAX + 1];
            rows[0] = dj;
            for (int l = 0; l < k; l++)
                rows[l + 1] = d->atoms + (size_t)out->idx[l] * m;
            fk_dots_fd(rows, k + 1, dj, m, dots);
            double gjj = dots[0];
            memcpy(ws.w, dots + 1, sizeof(double) * (size_t)k);
            if (gss)
                memcpy(gss_w, ws.w, sizeof(double) * (size_t)k);
            ws.mask[j] = 1;
            double lkk;
            if (!chol_extend(ws.L, ld, k, gjj, ws.w, &lkk)) {
                out->flags |= FK_CODE_DEPENDENT;
                continue;
            }
            if (gss)
                gss_add(gss, k, gss_w, gjj);
            double aj;
            if (a)
                aj = a[j];
            else
                aj = fk_dot_fd(dj, x, m);
            double wz = 0.0;
            for (int l = 0; l < k; l++)
                wz += ws.w[l] * ws.z[l];
            ws.z[k] = (aj - wz) / lkk;
            out->idx[k] = j;
            out->k = ++k;
            accepted = 1;
        }
        double zz = 0.0;
        for (int l = 0; l < out->k; l++)
            zz += ws.z[l] * ws.z[l];
        if (tol2 >= 0 && xx - zz <= tol2) {
            out->flags |= FK_CODE_TOL;
            break;
        }
        if (out->k == s_eff)
            break;
        back_solve(ws.L, ld, out->k, ws.z, ws.gamma);
        resid_naive(d->atoms, m, x, out->idx, ws.gamma, out->k, ws.rx, ws.r);
        r = ws.r;
    }
done:
    if (gss && out->k > 0)
        return FK_OK; /* coefficients and err2 come from the caller's refinement */
    back_solve(ws.L, ld, out->k, ws.z, ws.gamma);
    for (int l = 0; l < out->k; l++)
        out->coef[l] = ws.gamma[l];
    resid_naive(d->atoms, m, x, out->idx, ws.gamma, out->k, ws.rx, ws.r);
    out->err2 = energy_naive(ws.rx, m);
    double zz = 0.0;
    for (int l = 0; l < out->k; l++)
        zz += ws.z[l] * ws.z[l];
    struct guard gd = {.d = d, .x = x, .L = ws.L, .z = ws.z, .ld = ld, .naive = 1,
                       .gamma = ws.gamma, .rx = ws.rx, .r = ws.r};
    precision_guard(&gd, zz, out);
    return FK_OK;
}

int fk_omp_naive(const struct fk_dict_view *d, const float *x, const float *a,
                 const int32_t *cand, int nc, int s, double tol_rel, float *work,
                 struct fk_code *out)
{
    return omp_naive(d, x, a, cand, nc, s, tol_rel, work, out, NULL);
}

/* ---- pool mode over the Gram ---------------------------------------------------------- */

/* One step's update of the pool's correlations, Batch-OMP's over the pool alone: dmk holds
 * the selected atom's Gram entries at the pool's atoms on entry and q_k^T D_P on return,
 * (g - sum_l wf_l dm_l) * inv, and c -= zk * q_k^T D_P. Each element's operations run in
 * strip_tail's order (an element's chain over l in order). */
FK_CLONES static void pool_update(int nc, const float *restrict dm, size_t ld,
                                  const float *restrict wf, int k, float inv, float zk,
                                  float *restrict c, float *restrict dmk)
{
    for (int l = 0; l < k; l++) {
        const float *restrict r = dm + (size_t)l * ld;
        float w = wf[l];
        for (int i = 0; i < nc; i++)
            dmk[i] -= w * r[i];
    }
    for (int i = 0; i < nc; i++) {
        float v = dmk[i] * inv;
        dmk[i] = v;
        c[i] -= zk * v;
    }
}

/* The pool OMP over the dictionary's Gram (d->gram_row): the support's Gram entries and the
 * pool's come from the selected atoms' Gram rows, and the pool's correlations are updated as
 * Batch-OMP updates all of them (n k multiply-adds at step k, no pass over the atoms). The
 * selection rule and guards are the naive pool OMP's; the numbers agree with it up to
 * rounding (float Gram entries instead of double products and a recomputed residual).
 * One vector's code as a resumable state: pool_begin, then pool_step while active, so that
 * two vectors can step in turn (fk_omp_pool2); a vector's arithmetic is the same either way. */
struct pstate {
    struct omp_ws ws;
    const struct fk_dict_view *d;
    const float *x, *a;
    const int32_t *cand;
    struct fk_code *out;
    double *gss;
    struct fk_gram_row grow; /* Gram row of the selected atom, at pool position p */
    double xx;
    double gjj, lkk;          /* a step's G_jj and the new diagonal entry of L */
    double gss_w[FK_SMAX];    /* G_{S,j} (ws.w is overwritten by L^{-1} G_{S,j}) */
    int nc, s_eff, ld, p, active, prefetch, indep;
    int ppos[FK_SMAX]; /* the support's positions in the pool */
};

static void pool_end(struct pstate *g)
{
    if (g->out->k == 0) { /* as the naive mode ends a code without atoms */
        resid_naive(g->d->atoms, g->d->m, g->x, g->out->idx, g->ws.gamma, 0, g->ws.rx,
                    g->ws.r);
        g->out->err2 = energy_naive(g->ws.rx, g->d->m);
    }
    g->active = 0;
}

/* Selects the next atom (largest |c| in the pool, not selected or dead) and takes its Gram
 * row, or ends the code when the correlations are spent. With g->prefetch the row's entries
 * at the pool are requested now: another vector steps before this one gathers them. */
static void pool_select(struct pstate *g)
{
    float best;
    int p = argmax_fast(g->ws.c, g->cand, g->nc, g->ws.mask, g->d->dead, &best);
    if (p < 0 || (double)best * best <= 1e-24 * g->xx) {
        g->out->flags |= FK_CODE_PREMATURE;
        pool_end(g);
        return;
    }
    g->p = p;
    g->grow = g->d->gram_row(g->d->gram_ctx, g->cand[p], g->ws.scratch);
    if (g->prefetch && g->out->k + 1 < g->s_eff)
        for (int q = 0; q < g->nc; q++)
            __builtin_prefetch(row_ptr(&g->grow, (size_t)g->cand[q]), 0, 3);
}

static int pool_begin(struct pstate *g, const struct fk_dict_view *d, const float *x,
                      const float *a, const int32_t *cand, int nc, int s, float *work,
                      struct fk_code *out, double *gss, int prefetch)
{
    g->active = 0;
    FK_TRY(naive_args(d, x, s, work, out, cand, &nc));
    if (!cand || !a || !gss)
        return fk_err(FK_EINVAL, "fk_omp_pool: the Gram mode expects candidates, a and gss");
    int m = d->m;
    *g = (struct pstate){.d = d, .x = x, .a = a, .cand = cand, .out = out, .gss = gss,
                         .nc = nc, .prefetch = prefetch};
    g->xx = fk_dot_fd(x, x, m);
    g->s_eff = omp_start(g->xx, 0, s, m, count_live(d->dead, cand, nc), out);
    if (g->s_eff <= 0)
        return FK_OK;
    g->ld = clamp_s(s, m);
    ws_layout(d->n_atoms, m, g->ld, work, &g->ws);
    for (int p = 0; p < nc; p++) {
        g->ws.mask[cand[p]] = 0;
        g->ws.c[p] = a[cand[p]];
    }
    g->active = 1;
    pool_select(g);
    return FK_OK;
}

/* A step's first part: the selected atom's Gram row at the pool (the support is in it) in
 * one gather, whose loads overlap (a large Gram's row comes from L3), into the row of
 * q_k^T D_P; the last step reads only G_jj and G_{S,j}. */
static void pool_gather(struct pstate *g)
{
    struct omp_ws *ws = &g->ws;
    struct fk_code *out = g->out;
    const int32_t *cand = g->cand;
    int p = g->p, j = cand[p], k = out->k, nc = g->nc;
    out->iters++;
    float *dmk = ws->dm + (size_t)k * ws->ldm;
    int gather = k + 1 < g->s_eff;
    for (int q = 0; gather && q < nc; q++)
        dmk[q] = *row_ptr(&g->grow, (size_t)cand[q]);
    g->gjj = gather ? dmk[p] : *row_ptr(&g->grow, (size_t)j);
    for (int l = 0; l < k; l++)
        g->gss_w[l] = ws->w[l] =
            gather ? dmk[g->ppos[l]] : *row_ptr(&g->grow, (size_t)out->idx[l]);
    ws->mask[j] = 1;
}

/* chol_extend of two steps in lockstep (each lane's operations and order are chol_extend's:
 * the lanes overlap the latency of their chains of divisions). */
static void chol_extend2(struct pstate *g)
{
    int k[2] = {g[0].out->k, g[1].out->k}, km = k[0] > k[1] ? k[0] : k[1];
    double ww[2] = {0.0, 0.0};
    for (int i = 0; i < km; i++)
        for (int ln = 0; ln < 2; ln++) {
            if (i >= k[ln])
                continue;
            const double *L = g[ln].ws.L + (size_t)i * (size_t)g[ln].ld;
            double *w = g[ln].ws.w, v = w[i];
            for (int l = 0; l < i; l++)
                v -= L[l] * w[l];
            w[i] = v / L[i];
            ww[ln] += w[i] * w[i];
        }
    for (int ln = 0; ln < 2; ln++)
        g[ln].indep = chol_row(g[ln].ws.L, g[ln].ld, k[ln], g[ln].gjj, ww[ln], g[ln].ws.w,
                               &g[ln].lkk);
}

/* A step's last part: accepts or excludes the selected atom (g->indep); when the code goes
 * on, updates the pool's correlations and selects the next atom. */
static void pool_accept(struct pstate *g)
{
    struct omp_ws *ws = &g->ws;
    struct fk_code *out = g->out;
    int p = g->p, j = g->cand[p], k = out->k;
    if (!g->indep) {
        out->flags |= FK_CODE_DEPENDENT;
        pool_select(g);
        return;
    }
    gss_add(g->gss, k, g->gss_w, g->gjj);
    double wz = 0.0;
    for (int l = 0; l < k; l++)
        wz += ws->w[l] * ws->z[l];
    double zk = ((double)g->a[j] - wz) / g->lkk;
    ws->z[k] = zk;
    out->idx[k] = j;
    g->ppos[k] = p;
    out->k = ++k;
    if (k == g->s_eff) {
        pool_end(g);
        return;
    }
    float wf[FK_SMAX];
    for (int l = 0; l < k - 1; l++)
        wf[l] = (float)ws->w[l];
    float *dmk = ws->dm + (size_t)(k - 1) * ws->ldm;
    pool_update(g->nc, ws->dm, ws->ldm, wf, k - 1, (float)(1.0 / g->lkk), (float)zk, ws->c,
                dmk);
    pool_select(g);
}

static void pool_step(struct pstate *g)
{
    pool_gather(g);
    g->indep = chol_extend(g->ws.L, g->ld, g->out->k, g->gjj, g->ws.w, &g->lkk);
    pool_accept(g);
}

static int pool_gram(const struct fk_dict_view *d, const float *x, const float *a,
                     const int32_t *cand, int nc, int s, float *work, struct fk_code *out,
                     double *gss)
{
    struct pstate g;
    FK_TRY(pool_begin(&g, d, x, a, cand, nc, s, work, out, gss, 0));
    while (g.active)
        pool_step(&g);
    return FK_OK;
}

size_t fk_omp_pool2_work_floats(int n_atoms, int m, int s)
{
    return 2 * (fk_omp_work_floats(n_atoms, m, s) + 16);
}

int fk_omp_pool2(const struct fk_dict_view *d, const float *const x[2],
                 const float *const a[2], const int32_t *const cand[2], const int nc[2], int s,
                 float *work, struct fk_code *const out[2], double *const gss[2])
{
    if (!d || !d->gram_row || !x || !a || !cand || !nc || !work || !out || !gss)
        return fk_err(FK_EINVAL, "fk_omp_pool2: expected a Gram row function and two of each");
    struct pstate g[2];
    size_t wf = fk_omp_work_floats(d->n_atoms, d->m, s) + 16;
    /* the rows' entries are requested ahead where the Gram lies beyond L2 (1 MiB) */
    int pf = (size_t)d->n_atoms * (size_t)d->n_atoms * sizeof(float) > ((size_t)1 << 20);
    for (int l = 0; l < 2; l++)
        FK_TRY(pool_begin(&g[l], d, x[l], a[l], cand[l], nc[l], s, work + (size_t)l * wf,
                          out[l], gss[l], pf));
    while (g[0].active && g[1].active) {
        pool_gather(&g[0]);
        pool_gather(&g[1]);
        chol_extend2(g);
        pool_accept(&g[0]);
        pool_accept(&g[1]);
    }
    for (int l = 0; l < 2; l++)
        while (g[l].active)
            pool_step(&g[l]);
    return FK_OK;
}

int fk_omp_pool(const struct fk_dict_view *d, const float *x, const float *a,
                const int32_t *cand, int nc, int s, float *work, struct fk_code *out,
                double *gss)
{
    if (!gss)
        return fk_err(FK_EINVAL, "fk_omp_pool: expected gss");
    if (d && d->gram_row)
        return pool_gram(d, x, a, cand, nc, s, work, out, gss);
    return omp_naive(d, x, a, cand, nc, s, 0, work, out, gss);
}
