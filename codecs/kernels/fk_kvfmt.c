/* SPDX-License-Identifier: MIT
 * The serving engines' KV-cache storage formats (see fk_kvfmt.h).
 */
#include "kernels/fk_kvfmt.h"
#include "kernels/fk_simd.h"

#include <cblas.h>
#include <float.h>
#include <math.h>
#include <string.h>

#include "kernels/fk_sparse.h"

/* iq4_nl's 16 levels (ggml-common.h kvalues_iq4nl), and as floats (the search's). */
#define IQ4NL_LEVELS {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113}
static const int8_t iq4nl_levels[16] = IQ4NL_LEVELS;
static const float iq4nl_levels_f[16] = IQ4NL_LEVELS;

size_t fk_ggml_block_bytes(enum fk_ggml_type t)
{
    switch (t) {
    case FK_GGML_Q8_0: return 2 + 32;
    case FK_GGML_Q4_0: return 2 + 16;
    case FK_GGML_Q4_1: return 4 + 16;
    case FK_GGML_Q5_0: return 2 + 4 + 16;
    case FK_GGML_Q5_1: return 4 + 4 + 16;
    case FK_GGML_IQ4_NL: return 2 + 16;
    }
    return 0;
}

static void put16(uint8_t *p, float v)
{
    uint16_t h = fk_fp16_encode(v);
    p[0] = (uint8_t)(h & 0xFF);
    p[1] = (uint8_t)(h >> 8);
}

static float get16(const uint8_t *p)
{
    return fk_fp16_decode((uint16_t)(p[0] | p[1] << 8));
}

/* The signed value at the first index of the largest |x_j| (a strict > scan), and that
 * largest |x_j|. */
static float signed_max(const float *x, float *amax)
{
    float am = 0.0f, mx = 0.0f;
    for (int j = 0; j < FK_GGML_QK; j++)
        if (fabsf(x[j]) > am) {
            am = fabsf(x[j]);
            mx = x[j];
        }
    *amax = am;
    return mx;
}

/* The nibbles of 32 codes: qs[j] = code[j] | code[j + 16] << 4. */
static void pack_nibbles(const uint8_t *q, uint8_t *qs)
{
    for (int j = 0; j < 16; j++)
        qs[j] = (uint8_t)((q[j] & 0x0F) | (q[j + 16] & 0x0F) << 4);
}

static void unpack_nibbles(const uint8_t *qs, uint8_t *q)
{
    for (int j = 0; j < 16; j++) {
        q[j] = qs[j] & 0x0F;
        q[j + 16] = qs[j] >> 4;
    }
}

/* The fifth bits of 32 codes as q5's little-endian uint32 qh: bit j is bit 4 of code j. */
static void pack_high(const uint8_t *q, uint8_t *qh)
{
    uint32_t h = 0;
    for (int j = 0; j < 32; j++)
        h |= (uint32_t)((q[j] >> 4) & 1) << j;
    for (int b = 0; b < 4; b++)
        qh[b] = (uint8_t)(h >> (8 * b));
}

static void unpack_high(const uint8_t *qh, uint8_t *q)
{
    uint32_t h = (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 |
                 (uint32_t)qh[3] << 24;
    for (int j = 0; j < 32; j++)
        q[j] |= (uint8_t)(((h >> j) & 1) << 4);
}

static void q8_0(const float *x, uint8_t *blk, int rne)
{
    float amax = 0.0f;
    for (int j = 0; j < FK_GGML_QK; j++)
        amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
    float d = amax / 127.0f;
    float id = rne ? (amax != 0.0f ? 127.0f / amax : 0.0f) : (d != 0.0f ? 1.0f / d : 0.0f);
    put16(blk, d);
    for (int j = 0; j < FK_GGML_QK; j++) {
        float v = x[j] * id;
        blk[2 + j] = (uint8_t)(int8_t)(rne ? nearbyintf(v) : roundf(v));
    }
}

/* q4_0 and q5_0: symmetric around the signed extreme, 2^bits levels. */
static void q_0(const float *x, uint8_t *blk, int bits)
{
    float amax, mx = signed_max(x, &amax);
    int half = 1 << (bits - 1), top = (1 << bits) - 1;
    float d = mx / (float)-half;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    uint8_t q[FK_GGML_QK];
    for (int j = 0; j < FK_GGML_QK; j++) {
        int v = (int8_t)(x[j] * id + ((float)half + 0.5f));
        q[j] = (uint8_t)(v < top ? v : top);
    }
    put16(blk, d);
    if (bits == 5) {
        pack_high(q, blk + 2);
        pack_nibbles(q, blk + 6);
    } else {
        pack_nibbles(q, blk + 2);
    }
}

/* q4_1 and q5_1: from the block's minimum, 2^bits levels up to its maximum. */
static void q_1(const float *x, uint8_t *blk, int bits)
{
    float mn = FLT_MAX, mx = -FLT_MAX;
    for (int j = 0; j < FK_GGML_QK; j++) {
        mn = x[j] < mn ? x[j] : mn;
        mx = x[j] > mx ? x[j] : mx;
    }
    int top = (1 << bits) - 1;
    float d = (mx - mn) / (float)top;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    uint8_t q[FK_GGML_QK];
    for (int j = 0; j < FK_GGML_QK; j++) {
        float v = (x[j] - mn) * id + 0.5f;
        if (bits == 5) {
            q[j] = (uint8_t)v; /* q5_1 clamps nothing */
        } else {
            int iv = (int8_t)v;
            q[j] = (uint8_t)(iv < top ? iv : top);
        }
    }
    put16(blk, d);
    put16(blk + 2, mn);
    if (bits == 5) {
        pack_high(q, blk + 4);
        pack_nibbles(q, blk + 8);
    } else {
        pack_nibbles(q, blk + 4);
    }
}

/* ggml's best_index_int8 of x[j] * id for a block's 32 values into q: the nearest level,
 * below the first 0, above the last 15, an exact tie to the upper one; the count of levels
 * at or below each value taken for all 32 at once (vectorised). */
FK_CLONES512 static void iq4_levels(const float *x, float id, uint8_t *q)
{
    const float *lv = iq4nl_levels_f;
    float y[FK_GGML_QK];
    int c[FK_GGML_QK];
    for (int j = 0; j < FK_GGML_QK; j++) {
        y[j] = x[j] * id;
        c[j] = 0;
    }
    for (int l = 0; l < 16; l++)
        for (int j = 0; j < FK_GGML_QK; j++)
            c[j] += y[j] >= lv[l];
    for (int j = 0; j < FK_GGML_QK; j++) { /* below the first: 0, from the last: 15 */
        int hi = c[j] < 1 ? 1 : c[j] > 15 ? 15 : c[j];
        int l = y[j] - lv[hi - 1] < lv[hi] - y[j] ? hi - 1 : hi;
        q[j] = (uint8_t)(c[j] == 0 ? 0 : c[j] == 16 ? 15 : l);
    }
}

/* iq4_nl on the KV-cache write path (quantize_row_iq4_nl_ref: no search, no recoding): the
 * levels from d0 = max / -127, then the weighted least-squares scale (weights x_j^2). */
static void iq4_nl(const float *x, uint8_t *blk)
{
    float amax, mx = signed_max(x, &amax);
    uint8_t q[FK_GGML_QK] = {0};
    float d = 0.0f;
    if (amax >= 1e-15f) {
        float d0 = mx / (float)iq4nl_levels[0];
        float id = 1.0f / d0, sumqx = 0.0f, sumq2 = 0.0f;
        iq4_levels(x, id, q);
        for (int j = 0; j < FK_GGML_QK; j++) {
            int l = q[j];
            float lv = iq4nl_levels[l], w = x[j] * x[j];
            sumqx += w * lv * x[j];
            sumq2 += w * lv * lv;
        }
        d = sumq2 > 0.0f ? sumqx / sumq2 : 0.0f;
    }
    put16(blk, d);
    pack_nibbles(q, blk + 2);
}

void fk_ggml_quantize(enum fk_ggml_type t, const float *x, uint8_t *blk, int rne)
{
    switch (t) {
    case FK_GGML_Q8_0: q8_0(x, blk, rne); break;
    case FK_GGML_Q4_0: q_0(x, blk, 4); break;
    case FK_GGML_Q5_0: q_0(x, blk, 5); break;
    case FK_GGML_Q4_1: q_1(x, blk, 4); break;
    case FK_GGML_Q5_1: q_1(x, blk, 5); break;
    case FK_GGML_IQ4_NL: iq4_nl(x, blk); break;
    }
}

void fk_ggml_dequantize(enum fk_ggml_type t, const uint8_t *blk, float *y)
{
    float d = get16(blk);
    uint8_t q[FK_GGML_QK];
    switch (t) {
    case FK_GGML_Q8_0:
        for (int j = 0; j < FK_GGML_QK; j++)
            y[j] = (float)(int8_t)blk[2 + j] * d;
        return;
    case FK_GGML_Q4_0:
        unpack_nibbles(blk + 2, q);
        for (int j = 0; j < FK_GGML_QK; j++)
            y[j] = (float)(q[j] - 8) * d;
        return;
    case FK_GGML_Q5_0:
        unpack_nibbles(blk + 6, q);
        unpack_high(blk + 2, q);
        for (int j = 0; j < FK_GGML_QK; j++)
            y[j] = (float)(q[j] - 16) * d;
        return;
    case FK_GGML_Q4_1:
    case FK_GGML_Q5_1: {
        float m = get16(blk + 2);
        unpack_nibbles(blk + (t == FK_GGML_Q5_1 ? 8 : 4), q);
        if (t == FK_GGML_Q5_1)
            unpack_high(blk + 4, q);
        for (int j = 0; j < FK_GGML_QK; j++)
            y[j] = (float)q[j] * d + m;
        return;
    }
    case FK_GGML_IQ4_NL:
        unpack_nibbles(blk + 2, q);
        for (int j = 0; j < FK_GGML_QK; j++)
            y[j] = d * (float)iq4nl_levels[q[j]];
        return;
    }
}

/* Round half to even of a non-negative double below 2^52. */
static double rne_d(double v)
{
    double fl = floor(v), r = v - fl;
    if (r > 0.5 || (r == 0.5 && fmod(fl, 2.0) != 0.0))
        fl += 1.0;
    return fl;
}

uint8_t fk_e5m2_encode(float f)
{
    if (isnan(f))
        return 0x7F;
    uint8_t sgn = signbit(f) ? 0x80 : 0x00;
    double a = fabs((double)f);
    if (a < 0x1p-14) /* subnormal: quantum 2^-16; 4 quanta are the first normal */
        return sgn | (uint8_t)rne_d(a * 0x1p16);
    int ex;
    double fr = frexp(a, &ex); /* a = fr 2^ex, fr in [0.5, 1) */
    int e = ex - 1, q = (int)rne_d((2.0 * fr - 1.0) * 4.0);
    if (q == 4) {
        e++;
        q = 0;
    }
    if (e > 15 || (e == 15 && q > 3)) /* beyond 57344: saturated */
        return sgn | 0x7B;
    return sgn | (uint8_t)(((e + 15) << 2) | q);
}

float fk_e5m2_decode(uint8_t c)
{
    int e = (c >> 2) & 31, m = c & 3;
    double v;
    if (e == 31)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = ldexp((double)m, -16);
    else
        v = ldexp(1.0 + m / 4.0, e - 15);
    return (float)((c & 0x80) ? -v : v);
}

void fk_hadamard(float *x, int n)
{
    for (int h = 1; h < n; h *= 2)
        for (int i = 0; i < n; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
    float s = (float)(1.0 / sqrt((double)n));
    for (int i = 0; i < n; i++)
        x[i] *= s;
}

void fk_rotate_dense(const float *A, int m, const float *x, float *y)
{
    cblas_sgemv(CblasRowMajor, CblasNoTrans, m, m, 1.0f, A, m, x, 1, 0.0f, y, 1);
}

void fk_rotate_dense_rows(const float *A, int m, const float *X, int n, float *Y, int trans)
{
    cblas_sgemm(CblasRowMajor, CblasNoTrans, trans ? CblasNoTrans : CblasTrans, n, m, m, 1.0f,
                X, m, A, m, 0.0f, Y, m);
}
