/* SPDX-License-Identifier: MIT
 * Coefficient storage formats (spec: algorithms.md 3.7): FP8 E4M3FN (OCP FP8: bias 7,
 * no infinities, NaN = S.1111.111, max 448, min subnormal 2^-9) and IEEE binary16.
 * Both encoders round to nearest, ties to even, at every boundary including subnormals.
 * FP8 saturates to +-448 (the harness policy) and counts |f| >= 464 as saturation.
 */
#include "kernels/fk_sparse.h"
#include "kernels/fk_simd.h"

#include <math.h>
#include <string.h>

/* Round half to even of a non-negative double v < 2^52 (exact: floor and v - floor are
 * exact in that range). */
static double round_half_even(double v)
{
    double fl = floor(v);
    double d = v - fl;
    if (d > 0.5 || (d == 0.5 && fmod(fl, 2.0) != 0.0))
        fl += 1.0;
    return fl;
}

uint8_t fk_fp8_encode(double f, uint64_t *saturated)
{
    if (isnan(f))
        return 0x7F;
    uint8_t sgn = signbit(f) ? 0x80 : 0x00;
    double a = fabs(f);
    if (a >= 464.0) {
        if (saturated)
            (*saturated)++;
        return sgn | 0x7E;
    }
    if (a < 0x1p-6) {
        int q = (int)round_half_even(a * 0x1p9); /* 0..8; 8 encodes 2^-6 */
        return sgn | (uint8_t)q;
    }
    /* a normal double: its 52-bit fraction rounded to 3 bits, half to even, on the bits (a
     * carry out of the fraction moves into the exponent, as 1.1111 rounds to 10.000) */
    uint64_t bits;
    memcpy(&bits, &a, sizeof bits);
    bits += ((uint64_t)1 << 48) - 1 + ((bits >> 49) & 1);
    int e = (int)(bits >> 52) - 1023;
    int q = (int)(bits >> 49) & 7;
    if (e > 8 || (e == 8 && q == 7)) { /* unreachable below 464; kept as the spec's guard */
        if (saturated)
            (*saturated)++;
        return sgn | 0x7E;
    }
    return sgn | (uint8_t)(((e + 7) << 3) | q);
}

float fk_fp8_decode(uint8_t c)
{
    uint32_t e = (c >> 3) & 15u, mt = c & 7u;
    float v;
    if (e == 15 && mt == 7)
        return NAN;
    if (e == 0) {
        v = (float)mt * 0x1p-9f; /* subnormal: exact */
    } else { /* (1 + mt/8) 2^(e-7) as float bits: exponent e - 7 + 127, mantissa mt */
        uint32_t u = ((e + 120u) << 23) | (mt << 20);
        memcpy(&v, &u, sizeof v);
    }
    return (c & 0x80) ? -v : v;
}

uint16_t fk_fp16_encode(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t au = u & 0x7FFFFFFFu;
    if (au > 0x7F800000u) /* NaN: quiet, keep the top payload bits */
        return sign | 0x7E00u | (uint16_t)((au >> 13) & 0x1FFu);
    if (au >= 0x477FF000u) /* >= 65520 rounds to infinity (and +-inf itself) */
        return sign | 0x7C00u;
    if (au < 0x38800000u) { /* below 2^-14: subnormal half, unit 2^-24 */
        float a;
        memcpy(&a, &au, sizeof a);
        int q = (int)round_half_even((double)a * 0x1p24); /* 0..1024; 1024 = 2^-14 */
        return sign | (uint16_t)q;
    }
    uint32_t mant = au & 0x7FFFFFu;
    uint32_t exp = ((au >> 23) & 0xFFu) - 127u + 15u;
    uint32_t h = (exp << 10) | (mant >> 13);
    uint32_t rem = mant & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
        h++; /* a carry into the exponent is the correct rounding */
    return sign | (uint16_t)h;
}

/* fk_fp16_decode(fk_fp16_encode(x[i])) in place, branch-free on the float's bits (every clone
 * the same bits): a normal half keeps the float's top 10 mantissa bits, rounded half to even
 * by adding 0x0FFF plus the kept LSB (a carry into the exponent is the correct rounding);
 * below 2^-14 the half's unit is 2^-24, the spacing of floats in [0.5, 1): (|x| + 0.5) - 0.5
 * rounds there half to even; from 65520 on, infinity; NaN stays NaN (quiet). */
FK_CLONES512 void fk_fp16_round(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t u, rs;
        memcpy(&u, &x[i], sizeof u);
        uint32_t s = u & 0x80000000u, a = u & 0x7FFFFFFFu;
        uint32_t r = (a + 0x0FFFu + ((a >> 13) & 1u)) & ~0x1FFFu;
        float af, sub;
        memcpy(&af, &a, sizeof af);
        sub = (af + 0.5f) - 0.5f;
        memcpy(&rs, &sub, sizeof rs);
        r = a < 0x38800000u ? rs : r;
        r = a >= 0x477FF000u ? 0x7F800000u : r;
        r = a > 0x7F800000u ? 0x7FC00000u : r;
        r |= s;
        memcpy(&x[i], &r, sizeof r);
    }
}

float fk_fp16_decode(uint16_t h)
{
    uint32_t e = (h >> 10) & 31u, mt = h & 1023u;
    float v;
    if (e == 31) {
        v = mt ? NAN : INFINITY;
    } else if (e == 0) {
        v = (float)mt * 0x1p-24f; /* subnormal: exact */
    } else { /* (1 + mt/1024) 2^(e-15) as float bits */
        uint32_t u = ((e + 112u) << 23) | (mt << 13);
        memcpy(&v, &u, sizeof v);
    }
    return (h & 0x8000u) ? -v : v;
}
