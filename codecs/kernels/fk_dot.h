/* SPDX-License-Identifier: MIT
 * The double-precision inner products of the codecs, defined once. fk_dot_fd: exact float
 * products summed in FK_DL double lanes, then the lanes in a fixed pairwise order;
 * fk_dot_seq: the same products summed one after the other (coordinate order). Nothing is
 * reassociated, and the one fused multiply-add is exact-product (see fk_dot_fd), so every
 * clone and every caller gets the same bits.
 * (The attention's dot product in harness/engine uses another lane order on purpose.)
 */
#ifndef FK_DOT_H
#define FK_DOT_H

#include <math.h>

#include "kernels/fk_simd.h"

#define FK_DL 16 /* double accumulator lanes */

/* Sum of the FK_DL lanes of acc in a fixed pairwise order (acc is overwritten). */
static inline double fk_lanes_sum(double *acc)
{
    for (int w = FK_DL / 2; w >= 1; w /= 2)
        for (int l = 0; l < w; l++)
            acc[l] += acc[l + w];
    return acc[0];
}

/* sum_i a_i b_i in double: coordinate i goes to lane i % FK_DL (vectorises). The product
 * of two floats is exact in double, so fma(a, b, acc) rounds exactly as acc + a * b does:
 * the x86-64-v3 clone fuses them in hardware and every clone gives the same bits. */
FK_FMA_CLONES static inline double fk_dot_fd(const float *restrict a, const float *restrict b,
                                             int m)
{
    double acc[FK_DL] = {0};
    int i = 0;
    for (; i + FK_DL <= m; i += FK_DL)
        for (int l = 0; l < FK_DL; l++)
            acc[l] = fma((double)a[i + l], (double)b[i + l], acc[l]);
    for (int l = 0; i + l < m; l++)
        acc[l] = fma((double)a[i + l], (double)b[i + l], acc[l]);
    return fk_lanes_sum(acc);
}

/* fk_dot_fd(a0, b) and fk_dot_fd(a1, b) in one pass over b: each has fk_dot_fd's lanes
 * and operations in its order, so the same bits; the two accumulators interleave the fused
 * multiply-add chains that one dot product waits on. */
FK_FMA_CLONES static inline void fk_dot_fd2(const float *restrict a0, const float *restrict a1,
                                            const float *restrict b, int m, double *o0,
                                            double *o1)
{
    double acc0[FK_DL] = {0}, acc1[FK_DL] = {0};
    int i = 0;
    for (; i + FK_DL <= m; i += FK_DL)
        for (int l = 0; l < FK_DL; l++) {
            double bv = (double)b[i + l];
            acc0[l] = fma((double)a0[i + l], bv, acc0[l]);
            acc1[l] = fma((double)a1[i + l], bv, acc1[l]);
        }
    for (int l = 0; i + l < m; l++) {
        double bv = (double)b[i + l];
        acc0[l] = fma((double)a0[i + l], bv, acc0[l]);
        acc1[l] = fma((double)a1[i + l], bv, acc1[l]);
    }
    *o0 = fk_lanes_sum(acc0);
    *o1 = fk_lanes_sum(acc1);
}

/* out[i] = fk_dot_fd(rows[i], b), i < nr (the same bits), two rows per pass over b. */
static inline void fk_dots_fd(const float *const *rows, int nr, const float *b, int m,
                              double *out)
{
    int i = 0;
    for (; i + 2 <= nr; i += 2)
        fk_dot_fd2(rows[i], rows[i + 1], b, m, &out[i], &out[i + 1]);
    if (i < nr)
        out[i] = fk_dot_fd(rows[i], b, m);
}

#define FK_RB 16 /* residual coordinates a block holds in registers */

/* t[i] = x[i0 + i] - sum_l gam[l] d_{idx[l]}[i0 + i], i < FK_RB, in double: the atoms are
 * subtracted in support order, one rounding for each product and each difference. Inlined
 * into its callers' clones; the fixed length lets it vectorise (the coordinates stay in
 * registers while the k atoms stream past). */
static inline void fk_resid_block(const float *restrict atoms, int m, const int32_t *idx,
                                  const double *gam, int k, const float *restrict x, int i0,
                                  double *restrict t)
{
    for (int i = 0; i < FK_RB; i++)
        t[i] = x[i0 + i];
    for (int l = 0; l < k; l++) {
        const float *restrict at = atoms + (size_t)idx[l] * m + i0;
        double g = gam[l];
        for (int i = 0; i < FK_RB; i++)
            t[i] -= g * at[i];
    }
}

/* The same for one coordinate i (the tail beyond the last whole block). */
static inline double fk_resid_coord(const float *atoms, int m, const int32_t *idx,
                                    const double *gam, int k, const float *x, int i)
{
    double t = x[i];
    for (int l = 0; l < k; l++)
        t -= gam[l] * atoms[(size_t)idx[l] * m + i];
    return t;
}

/* sum_i a_i b_i in double, summed in coordinate order (one accumulator). */
static inline double fk_dot_seq(const float *a, const float *b, int m)
{
    double s = 0.0;
    for (int i = 0; i < m; i++)
        s += (double)a[i] * b[i];
    return s;
}

#endif
