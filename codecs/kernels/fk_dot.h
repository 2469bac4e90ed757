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

/* sum_i a_i b_i in double, summed in coordinate order (one accumulator). */
static inline double fk_dot_seq(const float *a, const float *b, int m)
{
    double s = 0.0;
    for (int i = 0; i < m; i++)
        s += (double)a[i] * b[i];
    return s;
}

#endif
