/* SPDX-License-Identifier: MIT
 * Top-n correlation screening (spec: algorithms.md 3.2) and ridge / damped Gauss-Newton
 * coefficient refinement on a fixed support (spec 3.6).
 *
 * Top-n is a quickselect on the pairs (|a_j|, j) under the total order "larger |a| first,
 * then smaller index", so every pair is distinct and the result is unique: O(n_atoms)
 * expected, then an optional O(n log n) heapsort of the n kept atoms.
 */
#include "fk_sparse.h"

#include "fk_err.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Pair a precedes pair b in the screening order. */
static int before(float ka, int32_t ia, float kb, int32_t ib)
{
    return ka > kb || (ka == kb && ia < ib);
}

static void swap_pair(float *key, int32_t *id, int i, int j)
{
    float tk = key[i];
    key[i] = key[j];
    key[j] = tk;
    int32_t ti = id[i];
    id[i] = id[j];
    id[j] = ti;
}

/* Rearranges [lo, hi) so that position kth holds the element it would hold when sorted,
 * with every element before it preceding it. */
static void select_kth(float *key, int32_t *id, int lo, int hi, int kth)
{
    while (hi - lo > 1) {
        int mid = lo + (hi - lo) / 2, last = hi - 1;
        /* median of three moved to last */
        if (before(key[mid], id[mid], key[lo], id[lo]))
            swap_pair(key, id, mid, lo);
        if (before(key[last], id[last], key[lo], id[lo]))
            swap_pair(key, id, last, lo);
        if (before(key[mid], id[mid], key[last], id[last]))
            swap_pair(key, id, mid, last);
        float pk = key[last];
        int32_t pi = id[last];
        int store = lo;
        for (int i = lo; i < last; i++) {
            if (before(key[i], id[i], pk, pi)) {
                swap_pair(key, id, i, store);
                store++;
            }
        }
        swap_pair(key, id, store, last);
        if (store == kth)
            return;
        if (kth < store)
            hi = store;
        else
            lo = store + 1;
    }
}

/* Heapsort of n pairs into screening order (first = largest |a|). */
static void sort_pairs(float *key, int32_t *id, int n)
{
    /* max-heap under "comes later": the root is the pair that belongs last */
    for (int start = n / 2 - 1; start >= 0; start--) {
        int root = start;
        for (;;) {
            int ch = 2 * root + 1;
            if (ch >= n)
                break;
            if (ch + 1 < n && before(key[ch], id[ch], key[ch + 1], id[ch + 1]))
                ch++;
            if (!before(key[root], id[root], key[ch], id[ch]))
                break;
            swap_pair(key, id, root, ch);
            root = ch;
        }
    }
    for (int end = n - 1; end > 0; end--) {
        swap_pair(key, id, 0, end);
        int root = 0;
        for (;;) {
            int ch = 2 * root + 1;
            if (ch >= end)
                break;
            if (ch + 1 < end && before(key[ch], id[ch], key[ch + 1], id[ch + 1]))
                ch++;
            if (!before(key[root], id[root], key[ch], id[ch]))
                break;
            swap_pair(key, id, root, ch);
            root = ch;
        }
    }
}

static int cmp_i32(const void *pa, const void *pb)
{
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    return (a > b) - (a < b);
}

int fk_topn(const float *a, const uint8_t *dead, int n_atoms, int n, int sort, int32_t *out,
            float *work)
{
    if (n <= 0 || n_atoms <= 0)
        return 0;
    float *key = work;
    int32_t *id = (int32_t *)(void *)(work + n_atoms);
    int live = 0;
    for (int j = 0; j < n_atoms; j++) {
        if (dead && dead[j])
            continue;
        float v = fabsf(a[j]);
        key[live] = isnan(v) ? -1.0f : v;
        id[live] = j;
        live++;
    }
    int n_eff = n < live ? n : live;
    if (n_eff <= 0)
        return 0;
    if (n_eff < live)
        select_kth(key, id, 0, live, n_eff - 1);
    if (sort) {
        sort_pairs(key, id, n_eff);
        memcpy(out, id, (size_t)n_eff * sizeof *out);
    } else {
        memcpy(out, id, (size_t)n_eff * sizeof *out);
        qsort(out, (size_t)n_eff, sizeof *out, cmp_i32);
    }
    return n_eff;
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
        double ax = 0.0;
        for (int i = 0; i < m; i++)
            ax += (double)dp[i] * x[i];
        as[p] = ax;
        for (int q = 0; q <= p; q++) {
            const float *dq = d->atoms + (size_t)code->idx[q] * m;
            double v = 0.0;
            for (int i = 0; i < m; i++)
                v += (double)dp[i] * dq[i];
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
    double e = 0.0, xx = 0.0;
    for (int i = 0; i < m; i++) {
        double r = x[i];
        xx += r * r;
        for (int p = 0; p < k; p++)
            r -= gam[p] * d->atoms[(size_t)code->idx[p] * m + i];
        e += r * r;
    }
    for (int p = 0; p < k; p++)
        code->coef[p] = gam[p];
    code->err2 = e;
    code->xx = xx;
    return FK_OK;
}
