/* SPDX-License-Identifier: MIT
 * Top-n correlation screening (spec: algorithms.md 3.2) and ridge / damped Gauss-Newton
 * coefficient refinement on a fixed support (spec 3.6).
 *
 * Top-n selects under the total order "larger |a| first, then smaller index", so the result
 * is unique. |a_j| is ranked through its bit pattern (for non-negative floats the unsigned
 * order of the bits is the numeric order), as a key: dead atoms 0, NaN 1, else bits + 2.
 * Small n (PL: n = s): one pass keeping the n best in a sorted list; blocks whose largest key
 * cannot enter it are skipped. Larger n (GM: the pool): a radix select, O(n_atoms): one
 * histogram of the top key bits finds the bin holding the n-th largest key; one pass emits
 * the atoms above that bin (ascending index, no sort) and collects that bin's atoms; the
 * exact threshold key within the bin is resolved on those few candidates, ties going to the
 * smaller index; the two ascending lists are merged. Only an ordered pool (sort != 0) is
 * sorted, O(n log n).
 */
#include "fk_sparse.h"

#include "fk_err.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TOPN_SMALL 32 /* n up to this: the sorted-list pass */
#define TOPN_BLK 32   /* keys per block of the sorted-list pass */
#define H1_SHIFT 20   /* first radix level: key bits 30..20 */
#define H1_BINS 2048
#define H2_SHIFT 9    /* second level: bits 19..9; third level: bits 8..0 */
#define H2_BINS 2048
#define H3_BINS 512
#define CAND_SORT 64  /* candidates up to this: resolved by insertion sort */
#define DL 16         /* double accumulator lanes of the refinement's inner products */
#define RCHUNK 64     /* residual coordinates per chunk */

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define FK_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define FK_CLONES
#endif

/* Screening key of |a_j|: unsigned order = screening order (dead 0, NaN 1, else bits + 2). */
static inline uint32_t screen_key(float v)
{
    uint32_t b;
    memcpy(&b, &v, sizeof b);
    b &= 0x7FFFFFFFu;
    return b > 0x7F800000u ? 1u : b + 2u;
}

/* keys[j] for every atom; returns the number of live atoms. */
static int make_keys(const float *a, const uint8_t *dead, int n_atoms, uint32_t *key)
{
    for (int j = 0; j < n_atoms; j++)
        key[j] = screen_key(a[j]);
    if (!dead)
        return n_atoms;
    int live = 0;
    for (int j = 0; j < n_atoms; j++) {
        uint32_t keep = dead[j] ? 0u : ~0u;
        key[j] &= keep;
        live += (int)(keep & 1u);
    }
    return live;
}

/* Pair (ka, ia) precedes pair (kb, ib) in the screening order. */
static int before(uint32_t ka, int32_t ia, uint32_t kb, int32_t ib)
{
    return ka > kb || (ka == kb && ia < ib);
}

static void sift_down(const uint32_t *key, int32_t *id, int root, int end)
{
    for (;;) {
        int ch = 2 * root + 1;
        if (ch >= end)
            return;
        if (ch + 1 < end && before(key[id[ch]], id[ch], key[id[ch + 1]], id[ch + 1]))
            ch++;
        if (!before(key[id[root]], id[root], key[id[ch]], id[ch]))
            return;
        int32_t t = id[root];
        id[root] = id[ch];
        id[ch] = t;
        root = ch;
    }
}

/* Heapsort of n atom ids into screening order (first = largest key): a max-heap under
 * "comes later", whose root is the id that belongs last. */
static void sort_ids(const uint32_t *key, int32_t *id, int n)
{
    for (int start = n / 2 - 1; start >= 0; start--)
        sift_down(key, id, start, n);
    for (int end = n - 1; end > 0; end--) {
        int32_t t = id[0];
        id[0] = id[end];
        id[end] = t;
        sift_down(key, id, 0, end);
    }
}

static void sort_ascending(int32_t *v, int n)
{
    for (int i = 1; i < n; i++) {
        int32_t t = v[i];
        int p = i;
        for (; p > 0 && v[p - 1] > t; p--)
            v[p] = v[p - 1];
        v[p] = t;
    }
}

/* Small n: one pass keeping the n_eff best (key desc, index asc) in a sorted list. */
static void topn_small(const uint32_t *key, int n_atoms, int n_eff, int sort, int32_t *out)
{
    uint32_t lk[TOPN_SMALL];
    int32_t li[TOPN_SMALL];
    int cnt = 0;
    uint32_t thr = 0; /* a key must exceed thr to enter: 0 until the list is full */
    for (int b0 = 0; b0 < n_atoms; b0 += TOPN_BLK) {
        int len = n_atoms - b0 < TOPN_BLK ? n_atoms - b0 : TOPN_BLK;
        const uint32_t *kb = key + b0;
        uint32_t mx = 0;
        if (len == TOPN_BLK) {
            for (int i = 0; i < TOPN_BLK; i++)
                mx = kb[i] > mx ? kb[i] : mx;
        } else {
            for (int i = 0; i < len; i++)
                mx = kb[i] > mx ? kb[i] : mx;
        }
        if (mx <= thr)
            continue;
        for (int i = 0; i < len; i++) {
            uint32_t k = kb[i];
            if (k <= thr)
                continue;
            /* later atoms lose ties, so k goes after every key >= k */
            int p = cnt < n_eff ? cnt : n_eff - 1;
            for (; p > 0 && lk[p - 1] < k; p--) {
                lk[p] = lk[p - 1];
                li[p] = li[p - 1];
            }
            lk[p] = k;
            li[p] = b0 + i;
            if (cnt < n_eff)
                cnt++;
            if (cnt == n_eff)
                thr = lk[n_eff - 1];
        }
    }
    memcpy(out, li, sizeof(int32_t) * (size_t)n_eff);
    if (!sort)
        sort_ascending(out, n_eff);
}

/* The bin holding the r-th largest (1-based) of a histogram; *above = count in higher bins. */
static int find_bin(const uint32_t *hist, int nbins, int r, int *above)
{
    int cum = 0;
    for (int b = nbins - 1; b > 0; b--) {
        if (cum + (int)hist[b] >= r) {
            *above = cum;
            return b;
        }
        cum += (int)hist[b];
    }
    *above = cum;
    return 0;
}

/* Descending insertion of key k into kbuf[0 .. n). */
static void insert_desc(uint32_t *kbuf, int n, uint32_t k)
{
    int p = n;
    for (; p > 0 && kbuf[p - 1] < k; p--)
        kbuf[p] = kbuf[p - 1];
    kbuf[p] = k;
}

/* The r-th largest key (1-based) among the keys of the nc candidates (which share key bits
 * 30..20); cand is only read. */
static uint32_t kth_key(const uint32_t *key, const int32_t *cand, int nc, int r)
{
    uint32_t kbuf[CAND_SORT];
    if (nc <= CAND_SORT) {
        for (int i = 0; i < nc; i++)
            insert_desc(kbuf, i, key[cand[i]]);
        return kbuf[r - 1];
    }
    uint32_t hist[H2_BINS]; /* bits 19..9 */
    memset(hist, 0, sizeof hist);
    for (int i = 0; i < nc; i++)
        hist[(key[cand[i]] >> H2_SHIFT) & (H2_BINS - 1)]++;
    int above;
    uint32_t b2 = (uint32_t)find_bin(hist, H2_BINS, r, &above);
    r -= above;
    int n2 = (int)hist[b2];
    if (n2 <= CAND_SORT) {
        int c = 0;
        for (int i = 0; i < nc; i++) {
            uint32_t k = key[cand[i]];
            if (((k >> H2_SHIFT) & (H2_BINS - 1)) == b2)
                insert_desc(kbuf, c++, k);
        }
        return kbuf[r - 1];
    }
    uint32_t hi = 0; /* bits 30..9 shared by the level-3 candidates */
    for (int b = 0; b < H3_BINS; b++)
        hist[b] = 0;
    for (int i = 0; i < nc; i++) {
        uint32_t k = key[cand[i]];
        if (((k >> H2_SHIFT) & (H2_BINS - 1)) == b2) {
            hist[k & (H3_BINS - 1)]++;
            hi = k & ~(uint32_t)(H3_BINS - 1);
        }
    }
    return hi | (uint32_t)find_bin(hist, H3_BINS, r, &above);
}

/* Larger n: radix select (see the file comment). cand: n_atoms int32 of scratch. */
static void topn_radix(const uint32_t *key, int n_atoms, int n_eff, int32_t *out,
                       int32_t *cand)
{
    uint32_t hist[H1_BINS];
    memset(hist, 0, sizeof hist);
    for (int j = 0; j < n_atoms; j++)
        hist[key[j] >> H1_SHIFT]++;
    int above;
    uint32_t b = (uint32_t)find_bin(hist, H1_BINS, n_eff, &above);
    /* atoms above bin b are all in; bin b's atoms are candidates, both in index order */
    int nd = 0, nc = 0;
    for (int j = 0; j < n_atoms; j++) {
        uint32_t kb = key[j] >> H1_SHIFT;
        if (kb > b)
            out[nd++] = j;
        else if (kb == b)
            cand[nc++] = j;
    }
    int r = n_eff - above; /* 1 <= r <= nc */
    uint32_t thr = kth_key(key, cand, nc, r);
    int gt = 0;
    for (int i = 0; i < nc; i++)
        gt += key[cand[i]] > thr;
    int ties = r - gt, nk = 0;
    for (int i = 0; i < nc; i++) {
        uint32_t k = key[cand[i]];
        if (k > thr || (k == thr && ties-- > 0))
            cand[nk++] = cand[i];
    }
    /* merge the two ascending lists from the back into out[0 .. n_eff) */
    int i = nd - 1, q = nk - 1;
    for (int w = n_eff - 1; q >= 0; w--) {
        if (i >= 0 && out[i] > cand[q])
            out[w] = out[i--];
        else
            out[w] = cand[q--];
    }
}

int fk_topn(const float *a, const uint8_t *dead, int n_atoms, int n, int sort, int32_t *out,
            float *work)
{
    if (n <= 0 || n_atoms <= 0)
        return 0;
    uint32_t *key = (uint32_t *)(void *)work;
    int live = make_keys(a, dead, n_atoms, key);
    int n_eff = n < live ? n : live;
    if (n_eff <= 0)
        return 0;
    if (n_eff <= TOPN_SMALL) {
        topn_small(key, n_atoms, n_eff, sort, out);
        return n_eff;
    }
    if (n_eff == live) {
        int c = 0;
        for (int j = 0; j < n_atoms; j++)
            if (key[j])
                out[c++] = j;
    } else {
        topn_radix(key, n_atoms, n_eff, out, (int32_t *)(void *)(work + n_atoms));
    }
    if (sort)
        sort_ids(key, out, n_eff);
    return n_eff;
}

/* Sum of DL lanes in a fixed pairwise order. */
static inline double lanes_sum(double *acc)
{
    for (int w = DL / 2; w >= 1; w /= 2)
        for (int l = 0; l < w; l++)
            acc[l] += acc[l + w];
    return acc[0];
}

/* sum_i a_i b_i in double: exact float products, DL lanes, fixed order (vectorises; the
 * same bits in every clone since there is no reassociation and no contraction). */
FK_CLONES static double dot_fd(const float *restrict a, const float *restrict b, int m)
{
    double acc[DL] = {0};
    int i = 0;
    for (; i + DL <= m; i += DL)
        for (int l = 0; l < DL; l++)
            acc[l] += (double)a[i + l] * b[i + l];
    for (int l = 0; i + l < m; l++)
        acc[l] += (double)a[i + l] * b[i + l];
    return lanes_sum(acc);
}

/* ||x - D_S gam||^2 and ||x||^2 in double (each residual coordinate subtracts the atoms in
 * support order). */
FK_CLONES static double resid_refine(const float *restrict atoms, const int32_t *idx,
                                     const double *gam, int k, int m, const float *restrict x,
                                     double *xx_out)
{
    double acc[DL] = {0}, accx[DL] = {0};
    double r[RCHUNK];
    for (int i0 = 0; i0 < m; i0 += RCHUNK) {
        int len = m - i0 < RCHUNK ? m - i0 : RCHUNK;
        for (int i = 0; i < len; i++)
            r[i] = x[i0 + i];
        for (int p = 0; p < k; p++) {
            const float *restrict at = atoms + (size_t)idx[p] * m + i0;
            double g = gam[p];
            for (int i = 0; i < len; i++)
                r[i] -= g * at[i];
        }
        for (int i = 0; i < len; i++) {
            acc[i % DL] += r[i] * r[i];
            accx[i % DL] += (double)x[i0 + i] * x[i0 + i];
        }
    }
    *xx_out = lanes_sum(accx);
    return lanes_sum(acc);
}

int fk_refine(const struct fk_dict_view *d, const float *x, double lambda0, double rho,
              int iters, struct fk_code *code)
{
    if (!d || !x || !code || !d->atoms || d->m <= 0)
        return fk_err(FK_EINVAL, "fk_refine: expected a dictionary view, x and a code");
    int k = code->k, m = d->m;
    if (k < 0 || k > FK_SMAX)
        return fk_err(FK_EINVAL, "fk_refine: support size %d outside 0..%d", k, FK_SMAX);
    if (iters < 1)
        return fk_err(FK_EINVAL, "fk_refine: expected iters >= 1, got %d", iters);
    if (!(lambda0 >= 0) || !(rho >= 0) || !isfinite(lambda0) || !isfinite(rho))
        return fk_err(FK_EINVAL, "fk_refine: expected finite lambda0, rho >= 0, got %g, %g",
                      lambda0, rho);
    for (int l = 0; l < k; l++)
        if (code->idx[l] < 0 || code->idx[l] >= d->n_atoms)
            return fk_err(FK_EINVAL, "fk_refine: support entry %d is atom %d, outside 0..%d",
                          l, (int)code->idx[l], d->n_atoms - 1);
    for (int i = 0; i < m; i++)
        if (!isfinite(x[i]))
            return fk_err(FK_EINVAL, "fk_refine: input vector element %d is not finite", i);

    double g[FK_SMAX * FK_SMAX];  /* (k, k) G_SS, row-major stride k */
    double ch[FK_SMAX * FK_SMAX]; /* (k, k) lower Cholesky factor of G_SS + Lambda */
    double as[FK_SMAX], gam[FK_SMAX], res[FK_SMAX];
    for (int p = 0; p < k; p++) {
        const float *dp = d->atoms + (size_t)code->idx[p] * m;
        as[p] = dot_fd(dp, x, m);
        for (int q = 0; q <= p; q++) {
            double v = dot_fd(dp, d->atoms + (size_t)code->idx[q] * m, m);
            g[p * k + q] = v;
            g[q * k + p] = v;
        }
    }
    for (int p = 0; p < k; p++) {
        for (int q = 0; q <= p; q++) {
            double v = g[p * k + q];
            if (p == q)
                v += lambda0 + rho * g[p * k + p];
            for (int l = 0; l < q; l++)
                v -= ch[p * k + l] * ch[q * k + l];
            if (p == q) {
                if (!(v > 0))
                    return fk_err(FK_EINVAL,
                                  "fk_refine: G_SS + Lambda not positive definite at row %d "
                                  "(lambda0 = %g, rho = %g)",
                                  p, lambda0, rho);
                ch[p * k + p] = sqrt(v);
            } else {
                ch[p * k + q] = v / ch[q * k + q];
            }
        }
    }
    for (int p = 0; p < k; p++)
        gam[p] = 0.0;
    for (int it = 0; it < iters; it++) {
        for (int p = 0; p < k; p++) {
            double v = as[p];
            for (int q = 0; q < k; q++)
                v -= g[p * k + q] * gam[q];
            res[p] = v;
        }
        for (int p = 0; p < k; p++) { /* M y = res */
            double v = res[p];
            for (int l = 0; l < p; l++)
                v -= ch[p * k + l] * res[l];
            res[p] = v / ch[p * k + p];
        }
        for (int p = k - 1; p >= 0; p--) { /* M^T dy = y */
            double v = res[p];
            for (int l = p + 1; l < k; l++)
                v -= ch[l * k + p] * res[l];
            res[p] = v / ch[p * k + p];
        }
        for (int p = 0; p < k; p++)
            gam[p] += res[p];
    }
    double xx;
    double e = resid_refine(d->atoms, code->idx, gam, k, m, x, &xx);
    for (int p = 0; p < k; p++)
        code->coef[p] = gam[p];
    code->err2 = e;
    code->xx = xx;
    return FK_OK;
}
