/* SPDX-License-Identifier: MIT
 * kvquant (codecs/quant/fk_kvquant.c) against spec families-quant-2026.md 4.3 and 4.4:
 *   - every row read back equals a reference written here from the rules: keys un-rotated
 *     (the trace's RoPE), per channel on the calibrated thresholds, outliers (strict) kept
 *     in fp16; values per token row (all heads, or one) by their sorted copy's linear
 *     quantiles, inclusive outliers, the range of the row with its outliers replaced by its
 *     lower median, fp16 centre and half-width; levels by a full scan (nearest, ties to the
 *     lower) or the uniform grid; fp16 at the end, keys before their rotation back; sinks
 *     in fp16. Over bits 2..4, nuq and uniform, outliers 0 and 1 %, both value groups;
 *   - the bytes of each row, counted by hand (codes, 4 bytes per outlier, the value
 *     range's share, sink rows 2 d), and the model constants;
 *   - the refusals: no calibration, an uncalibrated fraction, a value row without all its
 *     heads, an odd head_dim.
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fk_check_main.h"
#include "common/fk_err.h"
#include "conformance/fk_test_basis.h"
#include "core/fk_codec.h"
#include "core/fk_registry.h"
#include "kernels/fk_rope.h"
#include "kernels/fk_sparse.h"

enum { H = 2, M = 16, T = 24, SINKS = 2 };

static uint64_t g_rng = 4242;

static double gauss(void)
{
    double u[2];
    for (int i = 0; i < 2; i++) {
        g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
        u[i] = ((g_rng >> 11) + 0.5) / 9007199254740992.0;
    }
    return sqrt(-2 * log(u[0])) * cos(6.283185307179586 * u[1]);
}

static float half(double v) { return fk_fp16_decode(fk_fp16_encode((float)v)); }

/* [T][H][M]: Gaussian rows, every 7th value spiked (values' outliers). */
static void make_rows(float *x, double scale)
{
    for (int i = 0; i < T * H * M; i++)
        x[i] = (float)(scale * gauss() * (i % 7 == 3 ? 6 : 1));
}

struct run {
    const struct fk_codec_ops *ops;
    void *opts, *st;
    struct fk_test_basis tb;
    struct fk_vec_out out[T * H];
};

static void set(struct run *r, const char *name, const char *v)
{
    const struct fk_option *o = fk_codec_option(r->ops, name);
    ck_assert_ptr_nonnull(o);
    int rc = o->type == FK_OPT_ENUM ? fk_opts_set_enum(r->ops, r->opts, o, v)
                                    : fk_opts_set(r->ops, r->opts, o, atof(v));
    ck_assert_int_eq(rc, FK_OK);
}

/* Opens kvquant (options kv: name, value, ..., NULL) on the fixture's calibration. */
static int run_open(struct run *r, const char *const *kv, int kind, int with_calib)
{
    r->ops = fk_codec_find("kvquant");
    ck_assert_ptr_nonnull(r->ops);
    r->opts = calloc(1, r->ops->opts_size);
    fk_opts_defaults(r->ops, r->opts);
    for (int i = 0; kv && kv[i]; i += 2)
        set(r, kv[i], kv[i + 1]);
    ck_assert_int_eq(fk_test_basis_init(&r->tb, H, M, T, 99), 0);
    struct fk_stream_env env = {.layer = 0, .kind = kind, .head_dim = M, .n_heads = H,
                                .n_tokens = T};
    fk_test_basis_env(&r->tb, r->ops, &env);
    if (!with_calib)
        env.calib = NULL;
    return r->ops->open(r->opts, &env, &r->st);
}

static void run_close(struct run *r)
{
    r->ops->close(r->st);
    fk_test_basis_free(&r->tb);
    free(r->opts);
}

/* Encodes rows x [T][H][M] as one event (tokens in order, heads in order). */
static int run_encode(struct run *r, const float *x, int n_rows)
{
    int32_t tok[T * H], head[T * H];
    for (int i = 0; i < n_rows; i++) {
        tok[i] = i / H;
        head[i] = i % H;
    }
    struct fk_event ev = {.phase = 0, .step = -1, .n = n_rows, .x = x, .token = tok,
                          .head = head};
    return r->ops->encode(r->st, &ev, r->out);
}

/* ---- the reference -------------------------------------------------------------------- */

struct ref {
    int bits, uniform;
    double f;
    const float *lut;
};

/* The nearest level by a full scan, ties to the lower index. */
static double ref_level(const struct ref *p, double v, double lo, double up)
{
    if (!(up > lo))
        return (up + lo) / 2;
    int k = 1 << p->bits;
    if (!p->uniform) {
        double zp = (up + lo) / 2, rg = (up - lo) / 2, u = (v - zp) / rg;
        int best = 0;
        for (int i = 1; i < k; i++)
            if (fabs(u - p->lut[i]) < fabs(u - p->lut[best]))
                best = i;
        return p->lut[best] * rg + zp;
    }
    double qx = (k - 1) / (up - lo), off = lo * qx, c = nearbyint(qx * v - off);
    c = c < 0 ? 0 : c > k - 1 ? k - 1 : c;
    return (c + off) / qx;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* A value row of n values into y; outliers per head row of M into cnt. */
static void ref_values(const struct ref *p, const float *x, int n, float *y, int *cnt)
{
    double s[H * M], up = INFINITY, lo = -INFINITY, med = 0;
    for (int i = 0; i < n; i++)
        s[i] = x[i];
    qsort(s, (size_t)n, sizeof s[0], cmp_d);
    if (p->f > 0) {
        double t = 1 - p->f / 2, q[2] = {t, 1 - t}, r[2];
        for (int a = 0; a < 2; a++) {
            double pos = q[a] * (n - 1);
            int j = (int)floor(pos);
            r[a] = j + 1 < n ? s[j] + (pos - j) * (s[j + 1] - s[j]) : s[j];
        }
        up = r[0];
        lo = r[1];
        med = s[(n - 1) / 2];
    }
    double mn = INFINITY, mx = -INFINITY;
    for (int i = 0; i < n; i++) {
        double v = x[i] >= up || x[i] <= lo ? med : x[i];
        mn = fmin(mn, v);
        mx = fmax(mx, v);
    }
    double zp = half((mx + mn) / 2), rg = half((mx - mn) / 2);
    for (int i = 0; i < n / M; i++)
        cnt[i] = 0;
    for (int i = 0; i < n; i++) {
        int o = x[i] >= up || x[i] <= lo;
        cnt[i / M] += o;
        y[i] = o ? half(x[i]) : half(ref_level(p, x[i], zp - rg, zp + rg));
    }
}

/* A key of head h at token t (post-RoPE) into y; returns its outliers. */
static int ref_key(const struct ref *p, const struct fk_test_basis *tb, int h, int t,
                   const float *x, float *y)
{
    double cs[M / 2], sn[M / 2], freq[M / 2], k[M];
    fk_rope_freqs(&tb->rope, M, freq);
    fk_rope_table(freq, M, tb->pos + t, 1, cs, sn);
    for (int j = 0; j < M; j++)
        k[j] = x[j];
    fk_rope_apply(tb->rope.layout, M, cs, sn, -1, k);
    int n = 0;
    for (int j = 0; j < M; j++) {
        double lo = tb->clo[h * M + j], up = tb->cup[h * M + j];
        int o = p->f > 0 && (k[j] > up || k[j] < lo);
        n += o;
        k[j] = half(o ? k[j] : ref_level(p, k[j], lo, up));
    }
    fk_rope_apply(tb->rope.layout, M, cs, sn, +1, k);
    for (int j = 0; j < M; j++)
        y[j] = (float)k[j];
    return n;
}

/* ---- tests ----------------------------------------------------------------------------- */

/* _i: bits 2..4 x levels x fraction x value group, then (_i >= 24) the same with rows of
 * ties: two thirds of the values equal, so that more than half of a row are outliers on
 * one side and its median enters the range. */
START_TEST(rows_equal_reference)
{
    int ties = _i >= 24, c = _i % 24;
    int bits = 2 + c % 3, uniform = (c / 3) % 2, f1 = (c / 6) % 2, head_grp = c / 12;
    char b[8];
    snprintf(b, sizeof b, "%d", bits);
    const char *kv[] = {"bits", b, "levels", uniform ? "uniform" : "nuq", "outliers",
                        f1 ? "0.01" : "0", "first_fp16", "2", "value_group",
                        head_grp ? "head" : "row", NULL};
    static float x[T * H * M], y[M * H];
    for (int kind = 0; kind < 2; kind++) {
        struct run r;
        ck_assert_msg(run_open(&r, kv, kind, 1) == FK_OK, "%s", fk_errmsg());
        make_rows(x, kind ? 1.0 : 1.2);
        for (int j = 0; ties && j < T * H * M; j++)
            x[j] = j % 3 ? -8.0f : x[j]; /* the row minimum, tied */
        ck_assert_msg(run_encode(&r, x, T * H) == FK_OK, "%s", fk_errmsg());
        const struct fk_kvq_cal *cal = &r.tb.kvq[kind][f1];
        struct ref p = {.bits = bits, .uniform = uniform, .f = cal->outliers,
                        .lut = cal->lut[bits - 2][kind && head_grp]};
        double bytes = 0;
        int n_out = 0;
        for (int t = 0; t < T; t++) {
            int cnt[H] = {0};
            const float *xt = x + (size_t)t * H * M;
            if (t < SINKS) {
                for (int i = 0; i < H * M; i++)
                    y[i] = half(xt[i]);
            } else if (kind == 0) {
                for (int h = 0; h < H; h++)
                    cnt[h] = ref_key(&p, &r.tb, h, t, xt + h * M, y + h * M);
            } else if (!head_grp) {
                ref_values(&p, xt, H * M, y, cnt);
            } else {
                for (int h = 0; h < H; h++)
                    ref_values(&p, xt + h * M, M, y + h * M, cnt + h);
            }
            for (int h = 0; h < H; h++) {
                float got[M];
                ck_assert_int_eq(r.ops->reconstruct(r.st, h, t, got), FK_OK);
                for (int j = 0; j < M; j++)
                    ck_assert_msg(got[j] == y[h * M + j], "case %d kind %d token %d head %d "
                                  "channel %d: %.9g, reference %.9g (x %.9g)", _i, kind, t, h,
                                  j, got[j], y[h * M + j], xt[h * M + j]);
                double want = t < SINKS ? 2.0 * M
                                        : (bits * M + 7) / 8 + 4.0 * cnt[h] +
                                              (kind == 0 ? 0 : head_grp ? 4.0 : 4.0 / H);
                ck_assert_msg(fabs(r.out[t * H + h].bytes - want) < 1e-6, "case %d kind %d "
                              "token %d head %d: %g bytes, by hand %g", _i, kind, t, h,
                              r.out[t * H + h].bytes, want);
                bytes += want;
                n_out += cnt[h];
            }
        }
        /* the data have outliers when the fraction asks for them */
        ck_assert(f1 ? n_out > 0 : n_out == 0);
        /* rows of ties: more than half of each value row are outliers */
        ck_assert(!ties || !f1 || kind == 0 || n_out > (T - SINKS) * H * M / 2);
        struct fk_stream_stats st;
        r.ops->stats(r.st, &st);
        ck_assert_msg(fabs(st.bytes_codes - bytes) < 1e-6 * bytes, "%g, by hand %g",
                      st.bytes_codes, bytes);
        double model = (kind == 0 ? 4.0 * H * M : 0) + (uniform ? 0 : 2.0 * (1 << bits));
        ck_assert_double_eq_tol(st.bytes_model, model, 1e-9);
        run_close(&r);
    }
}
END_TEST

/* The sinks are the rows in fp16, and a coded row is not (the test means something). */
START_TEST(sinks_are_fp16)
{
    const char *kv[] = {"first_fp16", "3", "bits", "2", NULL};
    static float x[T * H * M];
    struct run r;
    ck_assert_int_eq(run_open(&r, kv, 1, 1), FK_OK);
    make_rows(x, 1.0);
    ck_assert_int_eq(run_encode(&r, x, T * H), FK_OK);
    double err_sink = 0, err_coded = 0;
    for (int t = 0; t < 4; t++)
        for (int h = 0; h < H; h++) {
            float got[M];
            ck_assert_int_eq(r.ops->reconstruct(r.st, h, t, got), FK_OK);
            for (int j = 0; j < M; j++) {
                double d = fabs(got[j] - x[(t * H + h) * M + j]);
                *(t < 3 ? &err_sink : &err_coded) += d;
                if (t < 3)
                    ck_assert(got[j] == half(x[(t * H + h) * M + j]));
            }
        }
    ck_assert_msg(err_coded > 10 * err_sink, "coded %g, sinks %g", err_coded, err_sink);
    run_close(&r);
}
END_TEST

START_TEST(refusals)
{
    struct run r;
    ck_assert_int_eq(run_open(&r, NULL, 0, 0), FK_EINVAL);
    ck_assert_ptr_nonnull(strstr(fk_errmsg(), "calibration"));
    run_close(&r);
    const char *kv[] = {"outliers", "0.02", NULL};
    ck_assert_int_eq(run_open(&r, kv, 0, 1), FK_EINVAL);
    ck_assert_ptr_nonnull(strstr(fk_errmsg(), "outliers = 0.02 was not calibrated"));
    run_close(&r);
    /* value_group = row: a token's heads together; head 0 alone is refused, nothing kept */
    const char *kv2[] = {"first_fp16", "0", NULL};
    static float x[T * H * M];
    make_rows(x, 1.0);
    ck_assert_int_eq(run_open(&r, kv2, 1, 1), FK_OK);
    ck_assert_int_eq(run_encode(&r, x, 1), FK_EINVAL);
    ck_assert_ptr_nonnull(strstr(fk_errmsg(), "every KV head of a token"));
    float got[M];
    ck_assert_int_eq(r.ops->reconstruct(r.st, 0, 0, got), FK_EINVAL);
    ck_assert_int_eq(run_encode(&r, x, H), FK_OK); /* and the whole token is accepted */
    ck_assert_int_eq(r.ops->check(r.opts, 15, 0), FK_ECONFIG);
    ck_assert_ptr_nonnull(strstr(fk_errmsg(), "even head_dim"));
    ck_assert_int_eq(r.ops->check(r.opts, 16, 0), FK_OK);
    run_close(&r);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("kvquant");
    TCase *tc = tcase_create("rules");
    tcase_add_loop_test(tc, rows_equal_reference, 0, 48);
    tcase_add_test(tc, sinks_are_fp16);
    tcase_add_test(tc, refusals);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return fk_suite_run(suite()); }
