/* SPDX-License-Identifier: MIT
 * FP8 E4M3FN and binary16 storage formats (codecs/kernels/fk_fp8.c, spec: algorithms.md 3.7):
 * every code decodes per the format's formula, every code round-trips, every midpoint
 * between consecutive codes rounds to the even code (and its float neighbours to the
 * nearer code), saturation is counted from 464 on, NaN and infinities are handled.
 */
#include "fk_check_main.h"
#include "kernels/fk_sparse.h"

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

/* Independent formula: (-1)^S 2^(E-7) (1 + M/8), subnormals M 2^-9, S.1111.111 = NaN. */
static double fp8_formula(int c)
{
    int s = (c >> 7) & 1, e = (c >> 3) & 15, mt = c & 7;
    if (e == 15 && mt == 7)
        return NAN;
    double v = e == 0 ? mt / 512.0 : pow(2.0, e - 7) * (1.0 + mt / 8.0);
    return s ? -v : v;
}

START_TEST(fp8_decode_all_codes)
{
    for (int c = 0; c < 256; c++) {
        double want = fp8_formula(c);
        float got = fk_fp8_decode((uint8_t)c);
        if (isnan(want)) {
            ck_assert_msg(isnan(got), "code 0x%02x: expected NaN", c);
            continue;
        }
        ck_assert_msg((double)got == want, "code 0x%02x: %g != %g", c, (double)got, want);
        ck_assert_int_eq(!!signbit(got), c >> 7);
    }
    ck_assert(fk_fp8_decode(0x7E) == 448.0f);
    ck_assert(fk_fp8_decode(0x08) == 0x1p-6f);
    ck_assert(fk_fp8_decode(0x01) == 0x1p-9f);
    ck_assert(fk_fp8_decode(0x38) == 1.0f);
    ck_assert(isnan(fk_fp8_decode(0xFF)));
}
END_TEST

START_TEST(fp8_roundtrip_all_codes)
{
    uint64_t sat = 0;
    for (int c = 0; c < 256; c++) {
        if ((c & 0x7F) == 0x7F)
            continue;
        ck_assert_int_eq(fk_fp8_encode(fk_fp8_decode((uint8_t)c), &sat), c);
    }
    ck_assert_uint_eq(sat, 0);
    ck_assert_int_eq(fk_fp8_encode(NAN, &sat), 0x7F);
    ck_assert_int_eq(fk_fp8_encode(-NAN, NULL), 0x7F);
    ck_assert_uint_eq(sat, 0);
}
END_TEST

/* Midpoints between consecutive codes of one sign (0x00..0x7E ascending) round to the even
 * code; one ulp either side rounds to the nearer code. */
START_TEST(fp8_midpoints_round_half_even)
{
    uint64_t sat = 0;
    for (int sgn = 0; sgn < 2; sgn++) {
        for (int c = 0; c < 0x7E; c++) {
            double lo = fp8_formula(c), hi = fp8_formula(c + 1);
            double mid = 0.5 * (lo + hi);
            int even = (c % 2 == 0) ? c : c + 1;
            double s = sgn ? -1.0 : 1.0;
            int off = sgn ? 0x80 : 0;
            ck_assert_msg(fk_fp8_encode(s * mid, &sat) == even + off,
                          "midpoint %g between codes 0x%02x and 0x%02x", s * mid, c, c + 1);
            ck_assert_int_eq(fk_fp8_encode(s * nextafter(mid, 0.0), &sat), c + off);
            ck_assert_int_eq(fk_fp8_encode(s * nextafter(mid, 1e9), &sat), c + 1 + off);
        }
    }
    ck_assert_uint_eq(sat, 0);
}
END_TEST

START_TEST(fp8_saturation_counted)
{
    uint64_t sat = 0;
    ck_assert_int_eq(fk_fp8_encode(450.0, &sat), 0x7E);
    ck_assert_int_eq(fk_fp8_encode(nextafter(464.0, 0.0), &sat), 0x7E);
    ck_assert_uint_eq(sat, 0);
    ck_assert_int_eq(fk_fp8_encode(464.0, &sat), 0x7E);
    ck_assert_uint_eq(sat, 1);
    ck_assert_int_eq(fk_fp8_encode(-1e30, &sat), 0xFE);
    ck_assert_int_eq(fk_fp8_encode(INFINITY, &sat), 0x7E);
    ck_assert_int_eq(fk_fp8_encode(-INFINITY, &sat), 0xFE);
    ck_assert_uint_eq(sat, 4);
    ck_assert_int_eq(fk_fp8_encode(1e6, NULL), 0x7E);
    /* underflow: below half the smallest subnormal flushes to (signed) zero */
    ck_assert_int_eq(fk_fp8_encode(0x1p-11, &sat), 0x00);
    ck_assert_int_eq(fk_fp8_encode(-0x1p-11, &sat), 0x80);
    ck_assert_int_eq(fk_fp8_encode(0x1p-10, &sat), 0x00); /* tie to even (0) */
    ck_assert_int_eq(fk_fp8_encode(nextafter(0x1p-10, 1.0), &sat), 0x01);
    ck_assert_uint_eq(sat, 4);
}
END_TEST

/* Random values: the encoder returns the nearest code (brute force), ties to even. */
START_TEST(fp8_random_nearest)
{
    srand(12345);
    for (int t = 0; t < 20000; t++) {
        double u = (double)rand() / RAND_MAX;
        double f = ldexp(u + 0.5, (rand() % 20) - 12) * ((rand() & 1) ? -1 : 1);
        int c = fk_fp8_encode(f, NULL);
        double a = fabs(f), best = INFINITY;
        int bc = -1;
        for (int q = 0; q <= 0x7E; q++) {
            double e = fabs(fp8_formula(q) - a);
            if (e < best || (e == best && q % 2 == 0)) {
                best = e;
                bc = q;
            }
        }
        if (a >= 464.0)
            bc = 0x7E;
        ck_assert_msg((c & 0x7F) == bc, "f=%.17g: code 0x%02x, nearest 0x%02x", f, c, bc);
        ck_assert_int_eq(c >> 7, f < 0);
    }
    /* one ulp either side of every midpoint between neighbouring codes: the nearer code */
    for (int q = 0; q < 0x7E; q++) {
        double mid = (fp8_formula(q) + fp8_formula(q + 1)) / 2;
        ck_assert_int_eq(fk_fp8_encode(nextafter(mid, 0), NULL), q);
        ck_assert_int_eq(fk_fp8_encode(nextafter(mid, INFINITY), NULL), q + 1);
    }
}
END_TEST

static double fp16_formula(int h)
{
    int s = (h >> 15) & 1, e = (h >> 10) & 31, mt = h & 1023;
    double v;
    if (e == 31)
        v = mt ? NAN : INFINITY;
    else if (e == 0)
        v = mt * pow(2.0, -24);
    else
        v = pow(2.0, e - 15) * (1.0 + mt / 1024.0);
    return s ? -v : v;
}

START_TEST(fp16_all_codes)
{
    for (int h = 0; h < 65536; h++) {
        double want = fp16_formula(h);
        float got = fk_fp16_decode((uint16_t)h);
        if (isnan(want)) {
            ck_assert(isnan(got));
            ck_assert(isnan(fk_fp16_decode(fk_fp16_encode(got))));
            continue;
        }
        ck_assert_msg((double)got == want, "half 0x%04x: %g != %g", h, (double)got, want);
        ck_assert_int_eq(fk_fp16_encode(got), h);
    }
    ck_assert_int_eq(fk_fp16_encode(INFINITY), 0x7C00);
    ck_assert_int_eq(fk_fp16_encode(-INFINITY), 0xFC00);
    ck_assert_int_eq(fk_fp16_encode(1e10f), 0x7C00);
}
END_TEST

START_TEST(fp16_midpoints_round_half_even)
{
    for (int sgn = 0; sgn < 2; sgn++) {
        for (int h = 0; h < 0x7BFF; h++) { /* 0x7BFF..inf: the 65520 case below */
            double lo = fp16_formula(h), hi = fp16_formula(h + 1);
            float mid = (float)(0.5 * (lo + hi)); /* exact: 12 significant bits */
            ck_assert((double)mid == 0.5 * (lo + hi));
            int even = (h % 2 == 0) ? h : h + 1;
            float s = sgn ? -1.0f : 1.0f;
            int off = sgn ? 0x8000 : 0;
            ck_assert_msg(fk_fp16_encode(s * mid) == even + off, "midpoint after 0x%04x", h);
            ck_assert_int_eq(fk_fp16_encode(s * nextafterf(mid, 0.0f)), h + off);
            ck_assert_int_eq(fk_fp16_encode(s * nextafterf(mid, INFINITY)), h + 1 + off);
        }
    }
    /* 65520 is the midpoint between 65504 and 2^16: ties to even = infinity */
    ck_assert_int_eq(fk_fp16_encode(65520.0f), 0x7C00);
    ck_assert_int_eq(fk_fp16_encode(nextafterf(65520.0f, 0.0f)), 0x7BFF);
    ck_assert_int_eq(fk_fp16_encode(0x1p-25f), 0x0000);
    ck_assert_int_eq(fk_fp16_encode(nextafterf(0x1p-25f, 1.0f)), 0x0001);
}
END_TEST

/* The bulk round trip against the scalar one on every 1021st float bit pattern, both signs,
 * and on every half's neighbourhood (the codes, their midpoints and the floats beside). */
START_TEST(fp16_round_bulk_matches_scalar)
{
    enum { N = 4096 };
    static float x[N], want[N];
    size_t n = 0, checked = 0;
    for (uint64_t b = 0; b <= 0xFFFFFFFFull; b += 1021) {
        uint32_t u = (uint32_t)b;
        memcpy(&x[n], &u, sizeof u);
        want[n] = fk_fp16_decode(fk_fp16_encode(x[n]));
        if (++n == N || b + 1021 > 0xFFFFFFFFull) {
            fk_fp16_round(x, n);
            for (size_t i = 0; i < n; i++) {
                if (isnan(want[i])) {
                    ck_assert(isnan(x[i]));
                    continue;
                }
                ck_assert_msg(memcmp(&x[i], &want[i], sizeof(float)) == 0,
                              "%a: %a, want %a", (double)x[i], (double)x[i], (double)want[i]);
            }
            checked += n;
            n = 0;
        }
    }
    for (int h = 0; h < 0x7C00; h++)
        for (int sg = 0; sg < 2; sg++) {
            float v = fk_fp16_decode((uint16_t)(h | (sg << 15)));
            float nb = fk_fp16_decode((uint16_t)((h + 1) | (sg << 15)));
            float c[5] = {v, nextafterf(v, 0.0f), nextafterf(v, 2 * v + 1),
                          (float)(0.5 * ((double)v + nb)), nextafterf((float)(0.5 * ((double)v + nb)), 0.0f)};
            float w[5];
            for (int i = 0; i < 5; i++)
                w[i] = fk_fp16_decode(fk_fp16_encode(c[i]));
            fk_fp16_round(c, 5);
            ck_assert(memcmp(c, w, sizeof c) == 0);
        }
    ck_assert(checked > 4000000);
}
END_TEST

static Suite *fp8_suite(void)
{
    Suite *s = suite_create("fp8");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, fp8_decode_all_codes);
    tcase_add_test(tc, fp8_roundtrip_all_codes);
    tcase_add_test(tc, fp8_midpoints_round_half_even);
    tcase_add_test(tc, fp8_saturation_counted);
    tcase_add_test(tc, fp8_random_nearest);
    tcase_add_test(tc, fp16_all_codes);
    tcase_add_test(tc, fp16_midpoints_round_half_even);
    tcase_add_test(tc, fp16_round_bulk_matches_scalar);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return fk_suite_run(fp8_suite());
}
