/* SPDX-License-Identifier: MIT
 * rotq (codecs/quant/fk_rotq.c) against spec families-quant-2026.md's anchors, each
 * recomputed independently here where it can be:
 *   - the MSE quantiser's distortion E||u - u_hat||^2 on random unit vectors of dimension
 *     128 (10^4 of them, fixed rotation), within 5 % of the Lloyd-Max distortion of a unit
 *     Gaussian at b = 1..4 (0.363, 0.1175, 0.0345, 0.0095, T1; the anchor) and below
 *     (sqrt(3) pi / 2) 4^-b, for every rotation;
 *   - the codebooks: gauss x sqrt(d) = T1's N(0,1) centroids, beta = T2's sphere centroids,
 *     vllm = T3's float32 values, read back through the distortion of a vector lying on a
 *     coordinate axis after the rotation (the fixed Hadamard: x = H e_j);
 *   - TurboQuant_prod is unbiased (T5): over independent sketches, the mean of <y, x_hat>
 *     is <y, x> within 3 standard errors, its variance that of the QJL estimator
 *     ((pi/2)||y||^2 - <u,y>^2) gamma^2 / d within 15 %;
 *   - the bytes of a row by hand (T11): MSE b 3 and 4, prod b 3, at head_dim 64 and 128.
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

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;

static double unif(void)
{
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return ((g_rng >> 11) + 0.5) / 9007199254740992.0;
}

static double gauss(void)
{
    return sqrt(-2 * log(unif())) * cos(6.283185307179586 * unif());
}

struct rq {
    const struct fk_codec_ops *ops;
    void *opts, *st;
    int m, T;
};

static void rq_open(struct rq *r, int m, int T, int kind, const char *const *kv)
{
    r->ops = fk_codec_find("rotq");
    ck_assert_ptr_nonnull(r->ops);
    r->opts = calloc(1, r->ops->opts_size);
    fk_opts_defaults(r->ops, r->opts);
    for (int i = 0; kv && kv[i]; i += 2) {
        const struct fk_option *o = fk_codec_option(r->ops, kv[i]);
        ck_assert_ptr_nonnull(o);
        int rc = o->type == FK_OPT_ENUM ? fk_opts_set_enum(r->ops, r->opts, o, kv[i + 1])
                                        : fk_opts_set(r->ops, r->opts, o, atof(kv[i + 1]));
        ck_assert_int_eq(rc, FK_OK);
    }
    r->m = m;
    r->T = T;
    struct fk_stream_env env = {.layer = 3, .kind = kind, .head_dim = m, .n_heads = 1,
                                .n_tokens = T};
    ck_assert_msg(r->ops->open(r->opts, &env, &r->st) == FK_OK, "%s", fk_errmsg());
}

static void rq_close(struct rq *r)
{
    r->ops->close(r->st);
    free(r->opts);
}

/* Codes the T rows of X [T][m] (one head) and reads them back into Y. */
static void rq_code(struct rq *r, const float *X, float *Y)
{
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)r->T), *head = calloc((size_t)r->T, 4);
    struct fk_vec_out *out = malloc(sizeof *out * (size_t)r->T);
    for (int t = 0; t < r->T; t++)
        tok[t] = t;
    struct fk_event ev = {.phase = 0, .step = -1, .n = r->T, .x = X, .token = tok, .head = head};
    ck_assert_msg(r->ops->encode(r->st, &ev, out) == FK_OK, "%s", fk_errmsg());
    for (int t = 0; t < r->T; t++)
        ck_assert_int_eq(r->ops->reconstruct(r->st, 0, t, Y + (size_t)t * r->m), FK_OK);
    free(tok), free(head), free(out);
}

/* The anchor: 10^4 random unit vectors of dimension 128. */
START_TEST(mse_distortion_anchor)
{
    const int m = 128, T = 10000;
    const double lm[4] = {0.363380, 0.117482, 0.034548, 0.0095010}; /* T1 */
    float *X = malloc(sizeof(float) * (size_t)T * m), *Y = malloc(sizeof(float) * (size_t)T * m);
    for (int t = 0; t < T; t++) {
        double n = 0;
        for (int j = 0; j < m; j++) {
            double g = gauss();
            X[(size_t)t * m + j] = (float)g;
            n += g * g;
        }
        for (int j = 0; j < m; j++)
            X[(size_t)t * m + j] = (float)(X[(size_t)t * m + j] / sqrt(n));
    }
    const char *rots[] = {"haar", "hadamard"};
    for (int ri = 0; ri < 2; ri++)
        for (int b = 1; b <= 4; b++) {
            char bs[8];
            snprintf(bs, sizeof bs, "%d", b);
            const char *kv[] = {"bits", bs, "rotation", rots[ri], NULL};
            struct rq r;
            rq_open(&r, m, T, 1, kv);
            rq_code(&r, X, Y);
            double d = 0;
            for (size_t i = 0; i < (size_t)T * m; i++)
                d += ((double)X[i] - Y[i]) * ((double)X[i] - Y[i]);
            d /= T;
            ck_assert_msg(fabs(d / lm[b - 1] - 1) <= 0.05, "%s b %d: distortion %.5f, Lloyd-Max "
                          "%.5f", rots[ri], b, d, lm[b - 1]);
            ck_assert(d < sqrt(3.0) * 3.14159265358979 / 2 * pow(4, -b));
            rq_close(&r);
        }
    free(X), free(Y);
}
END_TEST

/* The codebook read back: with the fixed Hadamard rotation, x = sqrt(d) * 0.9 H e_0 lies
 * on... every rotated coordinate equal; instead a one-coordinate check: the positive
 * centroids must be the spec's. We read them through vectors whose rotation is the axis
 * e_j scaled: x = s H e_0 rotates to (s/sqrt(d)) 1, every coordinate the same value v, which
 * the codebook maps to the centroid of v's cell; sweeping v over the cells gives every
 * centroid (norm 1 after the fp16 of ||x|| = s). */
static void centroids_of(const char *cb, int m, int b, double *c)
{
    int L = 1 << b, T = 4000;
    float *X = calloc((size_t)T * m, sizeof(float)), *Y = malloc(sizeof(float) * (size_t)T * m);
    /* unit vectors u = H (v 1_j-pattern): a vector whose rotated form is v e_0 + w e_1,
     * v from -0.8 to 0.8, w fixed so that ||u|| = 1 */
    float e[1024];
    for (int t = 0; t < T; t++) {
        double v = -0.8 + 1.6 * (t + 0.5) / T, w = sqrt(1 - v * v);
        memset(e, 0, sizeof(float) * (size_t)m);
        e[0] = (float)v;
        e[1] = (float)w;
        fk_hadamard(e, m); /* x = H y: the fixed rotation gives y back */
        memcpy(X + (size_t)t * m, e, sizeof(float) * (size_t)m);
    }
    char bs[8];
    snprintf(bs, sizeof bs, "%d", b);
    const char *kv[] = {"bits", bs, "rotation", "fixed", "codebook", cb, NULL};
    struct rq r;
    rq_open(&r, m, T, 1, kv);
    rq_code(&r, X, Y);
    for (int k = 0; k < L; k++)
        c[k] = NAN;
    for (int t = 0; t < T; t++) { /* the read-back rotated: H y_hat */
        memcpy(e, Y + (size_t)t * m, sizeof(float) * (size_t)m);
        fk_hadamard(e, m);
        double v = e[0];
        int k = 0; /* which centroid: the nearest already seen, else a new one */
        for (; k < L && !isnan(c[k]) && fabs(c[k] - v) > 1e-6; k++)
            ;
        if (k < L && isnan(c[k]))
            c[k] = v;
    }
    rq_close(&r);
    free(X), free(Y);
}

static void check_positive(const char *cb, int m, int b, const double *want, int n, double tol,
                           double scale)
{
    double c[256];
    centroids_of(cb, m, b, c);
    int L = 1 << b;
    for (int i = 0; i < n; i++) {
        int found = 0;
        for (int k = 0; k < L && !found; k++)
            found = !isnan(c[k]) && fabs(c[k] * scale - want[i]) <= tol;
        ck_assert_msg(found, "%s d %d b %d: centroid %.8g not read back", cb, m, b, want[i]);
    }
}

START_TEST(codebooks_spec)
{
    /* T1: N(0,1) Lloyd-Max, gauss codebook x sqrt(d) (the visible range of v: |c| < 0.8) */
    const double t1b2[] = {0.4528}, t1b3[] = {0.2451, 0.7560}, t1b4[] = {0.1284, 0.3880, 0.6568};
    check_positive("gauss", 64, 2, t1b2, 1, 2e-4, 8.0);
    check_positive("gauss", 64, 3, t1b3, 2, 2e-4, 8.0);
    check_positive("gauss", 64, 4, t1b4, 3, 2e-4, 8.0);
    /* T2: the sphere's coordinates (beta), d = 128 and 64, x sqrt(d) */
    const double t2_128b3[] = {0.2444, 0.7533}, t2_64b4[] = {0.1274, 0.3847, 0.6505};
    check_positive("beta", 128, 3, t2_128b3, 2, 2e-4, sqrt(128.0));
    check_positive("beta", 64, 4, t2_64b4, 3, 2e-4, 8.0);
    /* T3: vLLM's float32 centroids, as they are */
    const double t3_64b3[] = {3.06229498e-02, 9.44556892e-02, 1.67897508e-01, 2.68793702e-01},
                 t3_128b4[] = {1.13515090e-02, 3.43068577e-02, 5.80605306e-02};
    check_positive("vllm", 64, 3, t3_64b3, 4, 1e-7, 1.0);
    check_positive("vllm", 128, 4, t3_128b4, 3, 1e-7, 1.0);
}
END_TEST

/* T5: TurboQuant_prod's inner products are unbiased; over 2,000 independent sketches (the
 * seed) the estimate of <y, u> for a fixed unit u has the QJL variance. At b = 1 the codebook
 * has no bits: the code is QJL alone (gamma = 1). */
START_TEST(prod_unbiased)
{
    const int m = 64, R = 2000;
    float u[64], y[64], xh[64];
    double uy = 0, yy = 0;
    for (int j = 0; j < m; j++) {
        u[j] = (float)gauss();
        y[j] = (float)gauss();
    }
    double nu = 0;
    for (int j = 0; j < m; j++)
        nu += (double)u[j] * u[j];
    for (int j = 0; j < m; j++) {
        u[j] = (float)(u[j] / sqrt(nu));
        uy += (double)u[j] * y[j];
        yy += (double)y[j] * y[j];
    }
    for (int b = 1; b <= 3; b += 2) {
        double s1 = 0, s2 = 0;
        for (int r = 0; r < R; r++) {
            char seed[16], bs[8];
            snprintf(seed, sizeof seed, "%d", r + 1);
            snprintf(bs, sizeof bs, "%d", b);
            const char *kv[] = {"bits", bs, "keys", "prod", "rot_seed", seed, NULL};
            struct rq q;
            rq_open(&q, m, 1, 0, kv);
            rq_code(&q, u, xh);
            double e = 0;
            for (int j = 0; j < m; j++)
                e += (double)y[j] * xh[j];
            s1 += e;
            s2 += e * e;
            rq_close(&q);
        }
        double mean = s1 / R, var = s2 / R - mean * mean;
        if (b == 1) { /* pure QJL: variance ((pi/2)||y||^2 - <u,y>^2) / d */
            double v0 = (3.14159265358979 / 2 * yy - uy * uy) / m;
            ck_assert_msg(fabs(mean - uy) <= 3 * sqrt(v0 / R), "b 1: mean %.5f, <u,y> %.5f", mean,
                          uy);
            ck_assert_msg(fabs(var / v0 - 1) <= 0.15, "b 1: variance %.5f, QJL %.5f", var, v0);
        } else { /* unbiased, and far less spread than pure QJL */
            double v0 = (3.14159265358979 / 2 * yy) / m;
            ck_assert_msg(fabs(mean - uy) <= 3 * sqrt(var / R) + 1e-3 * fabs(uy),
                          "b 3: mean %.5f, <u,y> %.5f", mean, uy);
            ck_assert(var < 0.2 * v0);
        }
    }
}
END_TEST

/* T11: bytes per row. */
START_TEST(bytes_by_hand_t11)
{
    static const struct {
        const char *bits, *keys;
        int kind, b64, b128;
    } want[] = {{"3", "mse", 0, 26, 50}, {"4", "mse", 0, 34, 66}, {"3", "prod", 0, 28, 52},
                {"3", "prod", 1, 26, 50}}; /* values are always the MSE code */
    for (size_t w = 0; w < sizeof want / sizeof want[0]; w++)
        for (int m = 64; m <= 128; m += 64) {
            const char *kv[] = {"bits", want[w].bits, "keys", want[w].keys, NULL};
            struct rq r;
            rq_open(&r, m, 3, want[w].kind, kv);
            float X[3 * 128], Y[3 * 128];
            for (int i = 0; i < 3 * m; i++)
                X[i] = (float)sin(0.3 * i + 1);
            rq_code(&r, X, Y);
            struct fk_stream_stats st;
            r.ops->stats(r.st, &st);
            int per = m == 64 ? want[w].b64 : want[w].b128;
            ck_assert_msg(st.bytes_codes == 3.0 * per, "bits %s %s kind %d at %d: %g bytes for 3 "
                          "rows, expected %d each", want[w].bits, want[w].keys, want[w].kind, m,
                          st.bytes_codes, per);
            rq_close(&r);
        }
    /* the Hadamard rotations need a power of two; haar any head_dim */
    const struct fk_codec_ops *ops = fk_codec_find("rotq");
    void *o = calloc(1, ops->opts_size);
    fk_opts_defaults(ops, o);
    ck_assert_int_eq(ops->check(o, 96, 0), FK_OK);
    fk_opts_set_enum(ops, o, fk_codec_option(ops, "rotation"), "hadamard");
    ck_assert_int_eq(ops->check(o, 96, 0), FK_ECONFIG);
    ck_assert_int_eq(ops->check(o, 128, 0), FK_OK);
    free(o);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("rotq");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, mse_distortion_anchor);
    tcase_add_test(tc, codebooks_spec);
    tcase_add_test(tc, prod_unbiased);
    tcase_add_test(tc, bytes_by_hand_t11);
    suite_add_tcase(s, tc);
    return fk_suite_run(s);
}
