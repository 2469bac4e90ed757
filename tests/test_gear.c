/* SPDX-License-Identifier: MIT
 * gear (codecs/quant/fk_gear.c) against spec families-quant-2026.md 5:
 *   - without the low rank, every value of a block equals a reference written here from
 *     the rules (5.1, 5.2): outliers (k largest and smallest per value row of H d entries,
 *     per key channel over the block) replaced by their row's mean, KIVI_V2's groups
 *     quantised (round half to even, not below 0), the outliers restored, fp16 at the end;
 *   - the low rank: at full rank (r = d) with enough power iterations the error left is
 *     fp16's rounding; at rank 2 it is smaller than without it;
 *   - the bytes of the spec's example (5.6: b 2, G 64, d 128, H 8, s 2 %, r 2, T_c 1024,
 *     reference key outliers, 2-byte indices): 54.5 bytes per token and head, K and V.
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
#include "kernels/fk_sparse.h"

static uint64_t g_rng = 12345;

static double gauss(void)
{
    double u[2];
    for (int i = 0; i < 2; i++) {
        g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
        u[i] = ((g_rng >> 11) + 0.5) / 9007199254740992.0;
    }
    return sqrt(-2 * log(u[0])) * cos(6.283185307179586 * u[1]);
}

struct gr {
    const struct fk_codec_ops *ops;
    void *opts, *st;
};

static void gr_open(struct gr *r, const char *const *kv, int m, int H, int T, int kind)
{
    r->ops = fk_codec_find("gear");
    ck_assert_ptr_nonnull(r->ops);
    r->opts = calloc(1, r->ops->opts_size);
    fk_opts_defaults(r->ops, r->opts);
    for (int i = 0; kv[i]; i += 2) {
        const struct fk_option *o = fk_codec_option(r->ops, kv[i]);
        ck_assert_ptr_nonnull(o);
        int rc = o->type == FK_OPT_ENUM ? fk_opts_set_enum(r->ops, r->opts, o, kv[i + 1])
                                        : fk_opts_set(r->ops, r->opts, o, atof(kv[i + 1]));
        ck_assert_int_eq(rc, FK_OK);
    }
    struct fk_stream_env env = {.layer = 0, .kind = kind, .head_dim = m, .n_heads = H,
                                .n_tokens = T};
    ck_assert_msg(r->ops->open(r->opts, &env, &r->st) == FK_OK, "%s", fk_errmsg());
}

/* Codes tokens 0..T-1 (X [T][H][m]) as one event, reads them back into Y. */
static void gr_code(struct gr *r, const float *X, float *Y, int m, int H, int T)
{
    int n = T * H;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)n), *head = malloc(sizeof(int32_t) * (size_t)n);
    struct fk_vec_out *out = malloc(sizeof *out * (size_t)n);
    for (int i = 0; i < n; i++) {
        tok[i] = i / H;
        head[i] = i % H;
    }
    struct fk_event ev = {.phase = 0, .step = -1, .n = n, .x = X, .token = tok, .head = head};
    ck_assert_msg(r->ops->encode(r->st, &ev, out) == FK_OK, "%s", fk_errmsg());
    for (int i = 0; i < n; i++)
        ck_assert_int_eq(r->ops->reconstruct(r->st, i % H, i / H, Y + (size_t)i * m), FK_OK);
    free(tok), free(head), free(out);
}

static void gr_close(struct gr *r)
{
    r->ops->close(r->st);
    free(r->opts);
}

/* The reference (5.1, 5.2) of one block, rank 0: n values with stride s from x into y. */
static void ref_outliers(const float *x, ptrdiff_t s, int n, int k, uint8_t *mk)
{
    memset(mk, 0, (size_t)n);
    for (int side = 0; side < 2; side++)
        for (int c = 0; c < k; c++) {
            int best = -1;
            for (int i = 0; i < n; i++)
                if (!mk[i] && (best < 0 || (side ? x[i * s] < x[best * s] : x[i * s] > x[best * s])))
                    best = i;
            mk[best] = 1;
        }
}

static void ref_group(float *v, ptrdiff_t s, int n, int bits)
{
    float mn = v[0], mx = v[0];
    for (int i = 0; i < n; i++) {
        mn = fminf(mn, v[i * s]);
        mx = fmaxf(mx, v[i * s]);
    }
    float sc = (mx - mn) / (float)((1 << bits) - 1);
    for (int i = 0; i < n; i++) {
        float q = sc > 0 ? (v[i * s] - mn) / sc : 0;
        q = q < 0 ? 0 : rintf(q);
        v[i * s] = q * sc + mn;
    }
}

static void ref_block(const float *x, float *y, int T, int H, int m, int G, int bits, double frac,
                      int kind)
{
    int HD = H * m;
    uint8_t mk[4096];
    memcpy(y, x, sizeof(float) * (size_t)T * HD);
    if (kind == 1) {
        int k = (int)(frac * HD / 2);
        for (int t = 0; t < T; t++) {
            float *row = y + (size_t)t * HD;
            ref_outliers(row, 1, HD, k, mk);
            double mean = 0;
            for (int i = 0; i < HD; i++)
                mean += row[i];
            mean /= HD;
            for (int i = 0; i < HD; i++)
                if (mk[i])
                    row[i] = (float)mean;
            for (int c = 0; c < HD; c += G)
                ref_group(row + c, 1, G, bits);
            for (int i = 0; i < HD; i++)
                if (mk[i])
                    row[i] = x[(size_t)t * HD + i];
        }
    } else {
        int k = (int)(frac * T / 2);
        for (int c = 0; c < HD; c++) {
            ref_outliers(y + c, HD, T, k, mk);
            double mean = 0;
            for (int t = 0; t < T; t++)
                mean += y[(size_t)t * HD + c];
            mean /= T;
            for (int t = 0; t < T; t++)
                if (mk[t])
                    y[(size_t)t * HD + c] = (float)mean;
            for (int t0 = 0; t0 < T; t0 += G)
                ref_group(y + (size_t)t0 * HD + c, HD, G, bits);
            for (int t = 0; t < T; t++)
                if (mk[t])
                    y[(size_t)t * HD + c] = x[(size_t)t * HD + c];
        }
    }
    for (int i = 0; i < T * HD; i++)
        y[i] = fk_fp16_decode(fk_fp16_encode(y[i]));
}

START_TEST(backbone_and_outliers_match_reference)
{
    const int m = 16, H = 2, T = 32;
    float X[32 * 2 * 16], Y[32 * 2 * 16], R[16 * 2 * 16];
    for (int i = 0; i < T * H * m; i++)
        X[i] = (float)(gauss() * (i % 11 == 0 ? 6 : 1));
    for (int kind = 0; kind < 2; kind++) {
        const char *kv[] = {"bits", "2", "group", "8", "gap", "16", "rank", "0", "outliers",
                            "0.25", NULL};
        struct gr r;
        gr_open(&r, kv, m, H, T, kind);
        gr_code(&r, X, Y, m, H, T);
        for (int b = 0; b < T; b += 16) { /* two blocks of 16 tokens */
            ref_block(X + (size_t)b * H * m, R, 16, H, m, 8, 2, 0.25, kind);
            for (int i = 0; i < 16 * H * m; i++)
                ck_assert_msg(Y[(size_t)b * H * m + i] == R[i], "kind %d block %d value %d: "
                              "%.9g, reference %.9g", kind, b / 16, i, Y[(size_t)b * H * m + i],
                              R[i]);
        }
        gr_close(&r);
    }
}
END_TEST

START_TEST(low_rank_reduces_error)
{
    const int m = 16, H = 1, T = 32;
    float X[32 * 16], Y[32 * 16];
    for (int i = 0; i < T * m; i++)
        X[i] = (float)gauss();
    double err[3];
    const char *ranks[] = {"0", "2", "16"};
    for (int k = 0; k < 3; k++) {
        const char *kv[] = {"bits", "2", "group", "16", "gap", "32", "rank", ranks[k], "loops",
                            "12", "outliers", "0", NULL};
        struct gr r;
        gr_open(&r, kv, m, H, T, 1);
        gr_code(&r, X, Y, m, H, T);
        double e = 0, xx = 0;
        for (int i = 0; i < T * m; i++) {
            e += ((double)X[i] - Y[i]) * ((double)X[i] - Y[i]);
            xx += (double)X[i] * X[i];
        }
        err[k] = sqrt(e / xx);
        gr_close(&r);
    }
    ck_assert_msg(err[1] < err[0], "rank 2: %g, rank 0: %g", err[1], err[0]);
    ck_assert_msg(err[2] < 1e-3, "full rank: %g (fp16 rounding left)", err[2]);
}
END_TEST

START_TEST(bytes_of_the_spec_example)
{
    const int m = 128, H = 8, T = 1024;
    float *X = malloc(sizeof(float) * (size_t)T * H * m), *Y = malloc(sizeof(float) * (size_t)T * H * m);
    for (size_t i = 0; i < (size_t)T * H * m; i++)
        X[i] = (float)gauss();
    for (int kind = 0; kind < 2; kind++) {
        const char *kv[] = {"bits", "2", "group", "64", "gap", "1024", "rank", "2",
                            "outliers", "0.02", "key_sparse", "reference", "index_bytes", "2",
                            "loops", "1", NULL};
        struct gr r;
        gr_open(&r, kv, m, H, T, kind);
        gr_code(&r, X, Y, m, H, T);
        struct fk_stream_stats st;
        r.ops->stats(r.st, &st);
        ck_assert_double_eq_tol(st.bytes_codes / ((double)T * H), 54.5, 1e-9);
        gr_close(&r);
    }
    free(X), free(Y);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("gear");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, backbone_and_outliers_match_reference);
    tcase_add_test(tc, low_rank_reduces_error);
    tcase_add_test(tc, bytes_of_the_spec_example);
    suite_add_tcase(s, tc);
    return fk_suite_run(s);
}
