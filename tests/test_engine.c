/* SPDX-License-Identifier: MIT
 * The serving engines' KV formats (kernels/fk_kvfmt.h, codec `engine`) against the worked
 * values of spec families-quant-2026.md, computed there from ggml's and vLLM's rules (T6,
 * T8-T11, 2.7): every llama.cpp block byte for byte, q8_0's two roundings on ties, FP8
 * E4M3 and E5M2 codes, the Hadamard matrix; then the codec: bytes per row by hand for each
 * format at head_dim 64 and 128, the rotation (a key parallel to a Hadamard row reads back
 * through the rotation), vLLM's first-batch scales, and the ordering of errors by bits.
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fk_check_main.h"
#include "common/fk_err.h"
#include "core/fk_codec.h"
#include "core/fk_registry.h"
#include "kernels/fk_kvfmt.h"
#include "kernels/fk_sparse.h"

/* The block of x_j = (j - 16) / 4 in hex (T8). */
static void check_block(enum fk_ggml_type t, const char *hex, int rne)
{
    float x[32];
    for (int j = 0; j < 32; j++)
        x[j] = (float)(j - 16) / 4.0f;
    uint8_t blk[64];
    fk_ggml_quantize(t, x, blk, rne);
    size_t n = fk_ggml_block_bytes(t);
    ck_assert_uint_eq(strlen(hex), 2 * n);
    char got[160];
    for (size_t i = 0; i < n; i++)
        snprintf(got + 2 * i, 3, "%02x", blk[i]);
    ck_assert_str_eq(got, hex);
}

START_TEST(ggml_blocks_spec_t8)
{
    check_block(FK_GGML_Q8_0,
                "082881899199a1a9b1b9c0c8d0d8e0e8f0f8000810182028303840474f575f676f77", 0);
    check_block(FK_GGML_Q4_0, "0038809191a2a2b3b3c4c4d5d5e6e6f7f7f8", 0);
    check_block(FK_GGML_Q4_1, "223800c480809191a2a2b3b3c4c4d5d5e6e6f7f7", 0);
    check_block(FK_GGML_Q5_0, "00340000ffff00112233445566778899aabbccddeeff", 0);
    check_block(FK_GGML_Q5_1, "003400c40000ffff00112233445566778899aabbccddeeff", 0);
    check_block(FK_GGML_IQ4_NL, "fa27809091a1b1b2c2c3d3d4e4e5e5f6f7f7", 0);
    /* the values they decode to: T8's dequantised ends */
    float x[32], y[32];
    uint8_t blk[64];
    for (int j = 0; j < 32; j++)
        x[j] = (float)(j - 16) / 4.0f;
    fk_ggml_quantize(FK_GGML_Q8_0, x, blk, 0);
    fk_ggml_dequantize(FK_GGML_Q8_0, blk, y);
    ck_assert_float_eq_tol(y[0], -3.99975586f, 1e-7f);
    ck_assert_float_eq_tol(y[31], 3.74780273f, 1e-7f);
    fk_ggml_quantize(FK_GGML_Q4_0, x, blk, 0);
    fk_ggml_dequantize(FK_GGML_Q4_0, blk, y);
    ck_assert_float_eq(y[31], 3.5f); /* clipped at 7/8 of the range */
    fk_ggml_quantize(FK_GGML_Q4_1, x, blk, 0);
    fk_ggml_dequantize(FK_GGML_Q4_1, blk, y);
    ck_assert_float_eq(y[1], -4.0f);
    ck_assert_float_eq_tol(y[31], 3.74902f, 1e-5f);
    for (int t = FK_GGML_Q5_0; t <= FK_GGML_Q5_1; t++) { /* lossless on this block */
        fk_ggml_quantize((enum fk_ggml_type)t, x, blk, 0);
        fk_ggml_dequantize((enum fk_ggml_type)t, blk, y);
        for (int j = 0; j < 32; j++)
            ck_assert_float_eq(y[j], x[j]);
    }
    fk_ggml_quantize(FK_GGML_IQ4_NL, x, blk, 0);
    fk_ggml_dequantize(FK_GGML_IQ4_NL, blk, y);
    double sse = 0;
    for (int j = 0; j < 32; j++)
        sse += ((double)y[j] - x[j]) * ((double)y[j] - x[j]);
    ck_assert_double_eq_tol(sse, 0.774172, 5e-6);
}
END_TEST

/* iq4_nl against ggml's quantize_row_iq4_nl_ref rule written here (best_index_int8's
 * binary search, the weighted scale, fp16 d, nibbles j | j + 16 << 4) on random blocks and
 * on blocks whose values sit exactly on the levels and on their midpoints (ties). */
static int ref_best_index(const int8_t *val, float x)
{
    if (x <= val[0])
        return 0;
    if (x >= val[15])
        return 15;
    int ml = 0, mu = 15;
    while (mu - ml > 1) {
        int mav = (ml + mu) / 2;
        if (x < val[mav])
            mu = mav;
        else
            ml = mav;
    }
    return x - val[mu - 1] < val[mu] - x ? mu - 1 : mu;
}

static void ref_iq4_nl(const float *x, uint8_t *blk)
{
    static const int8_t lv[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                  1,    13,   25,  38,  53,  69,  89,  113};
    float amax = 0, mx = 0;
    for (int j = 0; j < 32; j++)
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            mx = x[j];
        }
    uint8_t L[32] = {0};
    float d = 0;
    if (amax >= 1e-15f) {
        float d0 = mx / -127.0f, id = 1.0f / d0, sumqx = 0, sumq2 = 0;
        for (int j = 0; j < 32; j++) {
            L[j] = (uint8_t)ref_best_index(lv, id * x[j]);
            float q = lv[L[j]], w = x[j] * x[j];
            sumqx += w * q * x[j];
            sumq2 += w * q * q;
        }
        d = sumq2 > 0 ? sumqx / sumq2 : 0;
    }
    uint16_t h = fk_fp16_encode(d);
    blk[0] = (uint8_t)(h & 0xFF);
    blk[1] = (uint8_t)(h >> 8);
    for (int j = 0; j < 16; j++)
        blk[2 + j] = (uint8_t)(L[j] | L[j + 16] << 4);
}

START_TEST(iq4_nl_against_the_rule)
{
    static const int8_t lv[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                  1,    13,   25,  38,  53,  69,  89,  113};
    uint64_t r = 12345;
    for (int b = 0; b < 3000; b++) {
        float x[32];
        uint8_t got[18], want[18];
        for (int j = 0; j < 32; j++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            double u = (double)(r >> 11) / 9007199254740992.0;
            x[j] = (float)((u - 0.5) * (b % 7 + 1));
        }
        if (b % 3 == 1) /* the levels and their midpoints, scaled so that d0 = -1 */
            for (int j = 0; j < 32; j++) {
                int l = (j * 5 + b) % 16, l1 = l < 15 ? l + 1 : l;
                x[j] = j % 2 ? (float)lv[l] : 0.5f * (float)(lv[l] + lv[l1]);
            }
        if (b % 3 == 1)
            x[b % 32] = 127.0f; /* the signed max: d0 = 127 / -127 = -1 */
        fk_ggml_quantize(FK_GGML_IQ4_NL, x, got, 0);
        ref_iq4_nl(x, want);
        ck_assert_msg(memcmp(got, want, 18) == 0, "block %d differs", b);
    }
}
END_TEST

/* T9: the ties of q8_0, reference (away from zero) against the x86 path (to even). */
START_TEST(q8_0_ties_spec_t9)
{
    float x[32] = {127, 2.5f, -2.5f, 0.5f, -0.5f, 1.5f, -1.5f, 3.5f};
    const int ref[8] = {127, 3, -3, 1, -1, 2, -2, 4}, rne[8] = {127, 2, -2, 0, 0, 2, -2, 4};
    uint8_t blk[64];
    fk_ggml_quantize(FK_GGML_Q8_0, x, blk, 0);
    for (int j = 0; j < 8; j++)
        ck_assert_int_eq((int8_t)blk[2 + j], ref[j]);
    fk_ggml_quantize(FK_GGML_Q8_0, x, blk, 1);
    for (int j = 0; j < 8; j++)
        ck_assert_int_eq((int8_t)blk[2 + j], rne[j]);
    for (int j = 8; j < 32; j++)
        ck_assert_int_eq(blk[2 + j], 0);
    /* an all-zero block: scale 0, codes 0, every format decodes zeros */
    float z[32] = {0}, y[32];
    for (int t = FK_GGML_Q8_0; t <= FK_GGML_IQ4_NL; t++) {
        fk_ggml_quantize((enum fk_ggml_type)t, z, blk, 0);
        fk_ggml_dequantize((enum fk_ggml_type)t, blk, y);
        for (int j = 0; j < 32; j++)
            ck_assert_float_eq(y[j], 0.0f);
    }
}
END_TEST

/* 2.7 and T10: FP8 E4M3 and E5M2 codes. */
START_TEST(fp8_formats_spec)
{
    const struct {
        float x;
        uint8_t c;
    } e4[] = {{0.1f, 0x1D}, {3.14159265f, 0x45}, {300, 0x79}, {448, 0x7E}, {460, 0x7E},
              {464, 0x7E}, {1000, 0x7E}, {0x1p-9f, 0x01}, {0x1p-10f, 0x00},
              {3 * 0x1p-10f, 0x02}, {9 * 0x1p-9f, 0x09}},
      e5[] = {{0.1f, 0x2E}, {300, 0x5D}, {1000, 0x64}, {0x1p-10f, 0x14}, {1e-4f, 0x07},
              {57344, 0x7B}, {60000, 0x7B}, {1e9f, 0x7B}, {-0.1f, 0xAE}};
    for (size_t i = 0; i < sizeof e4 / sizeof e4[0]; i++)
        ck_assert_msg(fk_fp8_encode(e4[i].x, NULL) == e4[i].c, "e4m3(%g) = 0x%02x, expected "
                      "0x%02x", e4[i].x, fk_fp8_encode(e4[i].x, NULL), e4[i].c);
    for (size_t i = 0; i < sizeof e5 / sizeof e5[0]; i++)
        ck_assert_msg(fk_e5m2_encode(e5[i].x) == e5[i].c, "e5m2(%g) = 0x%02x, expected "
                      "0x%02x", e5[i].x, fk_e5m2_encode(e5[i].x), e5[i].c);
    ck_assert_float_eq(fk_e5m2_decode(0x7B), 57344.0f);
    ck_assert(isinf(fk_e5m2_decode(0x7C)));
    ck_assert(isnan(fk_e5m2_decode(0x7D)));
    ck_assert_float_eq(fk_e5m2_decode(0x2E), 0.09375f);
    ck_assert_float_eq(fk_e5m2_decode(0x5D), 320.0f);
    ck_assert_float_eq_tol(fk_e5m2_decode(0x07), 1.068115234375e-4f, 1e-12f);
    ck_assert_uint_eq(fk_e5m2_encode(NAN), 0x7F);
    /* every finite code round-trips */
    for (int c = 0; c < 256; c++) {
        float v = fk_e5m2_decode((uint8_t)c);
        if (isfinite(v))
            ck_assert_uint_eq(fk_e5m2_encode(v), (v == 0 && c == 0x80) ? 0x80 : c);
    }
}
END_TEST

/* T6: the Hadamard matrix: H_4 (1,2,3,4) = (5,-1,-2,0); H_64 e_0 = 0.125 everywhere;
 * H H = I; against the matrix (-1)^popcount(i & j) / sqrt(n) written out. */
START_TEST(hadamard_spec_t6)
{
    float v[4] = {1, 2, 3, 4};
    fk_hadamard(v, 4);
    ck_assert_float_eq(v[0], 5.0f);
    ck_assert_float_eq(v[1], -1.0f);
    ck_assert_float_eq(v[2], -2.0f);
    ck_assert_float_eq(v[3], 0.0f);
    float e[64] = {1};
    fk_hadamard(e, 64);
    for (int i = 0; i < 64; i++)
        ck_assert_float_eq(e[i], 0.125f);
    float x[128], y[128];
    for (int i = 0; i < 128; i++)
        x[i] = y[i] = (float)sin(1.0 + 0.37 * i);
    fk_hadamard(y, 128);
    for (int i = 0; i < 128; i++) {
        double s = 0;
        for (int j = 0; j < 128; j++)
            s += (__builtin_popcount((unsigned)(i & j)) & 1 ? -1.0 : 1.0) * x[j];
        ck_assert_double_eq_tol(y[i], s / sqrt(128.0), 1e-5);
    }
    fk_hadamard(y, 128);
    for (int i = 0; i < 128; i++)
        ck_assert_float_eq_tol(y[i], x[i], 1e-5f);
}
END_TEST

/* ---- the codec -------------------------------------------------------------------------- */

struct run {
    const struct fk_codec_ops *ops;
    void *opts, *st;
    int m, H, T;
};

static void run_open(struct run *r, const char *format, const char *extra_name,
                     const char *extra_val, int m, int H, int T, int kind)
{
    r->ops = fk_codec_find("engine");
    ck_assert_ptr_nonnull(r->ops);
    r->opts = calloc(1, r->ops->opts_size);
    fk_opts_defaults(r->ops, r->opts);
    ck_assert_int_eq(fk_opts_set_enum(r->ops, r->opts, fk_codec_option(r->ops, "format"),
                                      format), FK_OK);
    if (extra_name)
        ck_assert_int_eq(fk_opts_set_enum(r->ops, r->opts,
                                          fk_codec_option(r->ops, extra_name), extra_val),
                         FK_OK);
    r->m = m;
    r->H = H;
    r->T = T;
    struct fk_stream_env env = {.layer = 0, .kind = kind, .head_dim = m, .n_heads = H,
                                .n_tokens = T};
    ck_assert_msg(r->ops->open(r->opts, &env, &r->st) == FK_OK, "%s", fk_errmsg());
}

static void run_close(struct run *r)
{
    r->ops->close(r->st);
    free(r->opts);
}

/* Encodes tokens t0 .. t1 - 1 of every head from X [T][H][m] as one event. */
static void run_event(struct run *r, const float *X, int t0, int t1, struct fk_vec_out *out)
{
    int n = (t1 - t0) * r->H;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)n), *head = malloc(sizeof(int32_t) * (size_t)n);
    for (int t = t0, i = 0; t < t1; t++)
        for (int h = 0; h < r->H; h++, i++) {
            tok[i] = t;
            head[i] = h;
        }
    struct fk_event ev = {.phase = t0 ? 1 : 0, .step = t0 ? t0 : -1, .n = n,
                          .x = X + (size_t)t0 * r->H * r->m, .token = tok, .head = head};
    ck_assert_msg(r->ops->encode(r->st, &ev, out) == FK_OK, "%s", fk_errmsg());
    free(tok);
    free(head);
}

/* T11: the bytes of a row per format at head_dim 64 and 128, counted by hand from the
 * block structs (and fp8's byte per element, fp8_token_head's 4-byte scale). */
START_TEST(engine_bytes_by_hand_t11)
{
    static const struct {
        const char *format;
        int b64, b128;
    } want[] = {{"fp8_e4m3", 64, 128}, {"fp8_e5m2", 64, 128}, {"fp8_token_head", 68, 132},
                {"q8_0", 68, 136},     {"q5_1", 48, 96},      {"q5_0", 44, 88},
                {"q4_1", 40, 80},      {"q4_0", 36, 72},      {"iq4_nl", 36, 72}};
    for (size_t f = 0; f < sizeof want / sizeof want[0]; f++)
        for (int m = 64; m <= 128; m += 64) {
            struct run r;
            run_open(&r, want[f].format, NULL, NULL, m, 2, 5, 0);
            float *X = calloc((size_t)5 * 2 * m, sizeof(float));
            for (int i = 0; i < 5 * 2 * m; i++)
                X[i] = (float)sin(0.1 * i);
            struct fk_vec_out out[10];
            run_event(&r, X, 0, 3, out);
            run_event(&r, X, 3, 5, out);
            struct fk_stream_stats st;
            r.ops->stats(r.st, &st);
            int per = m == 64 ? want[f].b64 : want[f].b128;
            ck_assert_msg(st.bytes_codes == 10.0 * per, "%s at %d: %g bytes for 10 rows, "
                          "expected %d each", want[f].format, m, st.bytes_codes, per);
            ck_assert_float_eq(out[0].bytes, (float)per);
            free(X);
            run_close(&r);
        }
}
END_TEST

/* The rotation: at head_dim 64 a key parallel to a Hadamard row (3 H_64 e_5: +-0.375) is
 * one spike after the rotation, which q4_0 keeps exactly, so with the rotation it reads
 * back exactly; without it q4_0 clips the side opposite the block's first extreme at 7/8.
 * And the rule: keys of head_dim 128 rotate in one block of 128, values in two of 64 (the
 * read-back equals H Q(H x) with those blocks, computed here). */
START_TEST(engine_rotation)
{
    float X[64], y[64];
    for (int i = 0; i < 64; i++)
        X[i] = (__builtin_popcount((unsigned)(i & 5)) & 1) ? -0.375f : 0.375f;
    struct fk_vec_out out[1];
    struct run r;
    run_open(&r, "q4_0", "rot", "llama", 64, 1, 1, 0);
    run_event(&r, X, 0, 1, out);
    ck_assert_int_eq(r.ops->reconstruct(r.st, 0, 0, y), FK_OK);
    for (int i = 0; i < 64; i++)
        ck_assert_float_eq_tol(y[i], X[i], 1e-6f);
    ck_assert_float_lt(out[0].err, 1e-6f);
    run_close(&r);
    run_open(&r, "q4_0", "rot", "off", 64, 1, 1, 0);
    run_event(&r, X, 0, 1, out);
    ck_assert_float_gt(out[0].err, 1e-2f); /* the -0.375s read back as -0.328 */
    run_close(&r);
    /* head_dim 128, keys: one block of 128; values: two of 64 */
    float Z[128], w[128], ref[128];
    for (int i = 0; i < 128; i++)
        Z[i] = (float)cos(0.3 * i) + (i % 7 == 0 ? 2.0f : 0.0f);
    for (int kind = 0; kind < 2; kind++) {
        run_open(&r, "q8_0", NULL, NULL, 128, 1, 1, kind);
        run_event(&r, Z, 0, 1, out);
        ck_assert_int_eq(r.ops->reconstruct(r.st, 0, 0, w), FK_OK);
        memcpy(ref, Z, sizeof ref);
        int blk = kind ? 64 : 128;
        for (int b = 0; b < 128; b += blk)
            fk_hadamard(ref + b, blk);
        uint8_t q[64];
        for (int b = 0; b < 128; b += 32) {
            fk_ggml_quantize(FK_GGML_Q8_0, ref + b, q, 0);
            fk_ggml_dequantize(FK_GGML_Q8_0, q, ref + b);
        }
        for (int b = 0; b < 128; b += blk)
            fk_hadamard(ref + b, blk);
        for (int i = 0; i < 128; i++)
            ck_assert_float_eq(w[i], ref[i]);
        run_close(&r);
    }
}
END_TEST

/* vLLM's first-batch scales: max |x| of the first event / 200 (keys), / 100 (values), kept
 * for later events; a later value past 448 scales saturates (counted). Per token-head:
 * each row's own scale, so a row of large values reads back within FP8's relative step. */
START_TEST(engine_fp8_scales)
{
    int m = 8, H = 2, T = 3;
    float X[3 * 2 * 8];
    for (int i = 0; i < 3 * 2 * 8; i++)
        X[i] = (float)(i % 5) - 2.0f; /* max |x| 2 in the first event */
    X[2 * 2 * 8 + 3] = 2000.0f;      /* a later spike: 2000 / 0.01 = 2e5 > 448 */
    for (int kind = 0; kind < 2; kind++) {
        struct run r;
        run_open(&r, "fp8_e4m3", NULL, NULL, m, H, T, kind);
        struct fk_vec_out out[6];
        run_event(&r, X, 0, 2, out);
        run_event(&r, X, 2, 3, out);
        float y[8];
        ck_assert_int_eq(r.ops->reconstruct(r.st, 0, 0, y), FK_OK);
        float s = 2.0f / (kind ? 100.0f : 200.0f);
        for (int j = 0; j < m; j++)
            ck_assert_float_eq(y[j], fk_fp8_decode(fk_fp8_encode(X[j] / s, NULL)) * s);
        ck_assert_int_eq(r.ops->reconstruct(r.st, 0, 2, y), FK_OK);
        ck_assert_float_eq(y[3], 448.0f * s); /* saturated */
        struct fk_stream_stats st;
        r.ops->stats(r.st, &st);
        ck_assert_uint_eq(st.saturated, 1);
        ck_assert_double_eq(st.bytes_model, 4.0); /* one scale per layer and kind */
        run_close(&r);
    }
    struct run r;
    run_open(&r, "fp8_token_head", NULL, NULL, m, H, T, 0);
    struct fk_vec_out out[6];
    run_event(&r, X, 0, 3, out);
    ck_assert_float_lt(out[2 * 2].err, 0.07f); /* the spike's row: its own scale */
    run_close(&r);
}
END_TEST

/* On Gaussian rows the formats' errors order by their bits: q8_0 < q5_1 < q4_1 and
 * q5_0 < q4_0, e4m3 between q8_0 and the 5-bit ones, the rotation no worse on average. */
START_TEST(engine_errors_order)
{
    int m = 128, H = 1, T = 200;
    float *X = malloc(sizeof(float) * (size_t)T * m);
    uint64_t s = 7;
    for (int i = 0; i < T * m; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        double u1 = ((s >> 11) + 0.5) / 9007199254740992.0;
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        double u2 = ((s >> 11) + 0.5) / 9007199254740992.0;
        X[i] = (float)(sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2));
    }
    const char *fmts[] = {"q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "iq4_nl", "fp8_e4m3"};
    double err[7];
    struct fk_vec_out *out = malloc(sizeof *out * (size_t)T);
    for (int f = 0; f < 7; f++) {
        struct run r;
        run_open(&r, fmts[f], NULL, NULL, m, H, T, 1);
        run_event(&r, X, 0, T, out);
        err[f] = 0;
        for (int t = 0; t < T; t++)
            err[f] += out[t].err / T;
        run_close(&r);
    }
    ck_assert(err[0] < err[6] && err[6] < err[1] && err[1] < err[3] && err[2] < err[4]);
    ck_assert(err[1] < err[2] && err[3] < err[4] && err[5] < err[4]);
    free(out);
    free(X);
}
END_TEST

/* Options refused before anything runs: blocks of 32 need head_dim % 32 == 0, rot = llama
 * head_dim % 64 == 0. */
START_TEST(engine_checks)
{
    const struct fk_codec_ops *ops = fk_codec_find("engine");
    void *o = calloc(1, ops->opts_size);
    fk_opts_defaults(ops, o);
    ck_assert_int_eq(ops->check(o, 24, 0), FK_OK); /* fp8: any head_dim */
    fk_opts_set_enum(ops, o, fk_codec_option(ops, "format"), "q4_1");
    ck_assert_int_eq(ops->check(o, 48, 0), FK_ECONFIG);
    ck_assert_ptr_nonnull(strstr(fk_errmsg(), "head_dim a multiple of 32"));
    ck_assert_int_eq(ops->check(o, 96, 0), FK_OK); /* rot auto: off at 96 */
    fk_opts_set_enum(ops, o, fk_codec_option(ops, "rot"), "llama");
    ck_assert_int_eq(ops->check(o, 96, 0), FK_ECONFIG);
    ck_assert_int_eq(ops->check(o, 192, 0), FK_OK);
    free(o);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("engine");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, ggml_blocks_spec_t8);
    tcase_add_test(tc, iq4_nl_against_the_rule);
    tcase_add_test(tc, q8_0_ties_spec_t9);
    tcase_add_test(tc, fp8_formats_spec);
    tcase_add_test(tc, hadamard_spec_t6);
    tcase_add_test(tc, engine_bytes_by_hand_t11);
    tcase_add_test(tc, engine_rotation);
    tcase_add_test(tc, engine_fp8_scales);
    tcase_add_test(tc, engine_errors_order);
    tcase_add_test(tc, engine_checks);
    suite_add_tcase(s, tc);
    return fk_suite_run(s);
}
