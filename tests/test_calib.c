/* SPDX-License-Identifier: MIT
 * The KVQuant calibration: the file (datasets/formats/fk_calib.h) and train-calib
 * (harness/train/fk_train_calib.h), on small synthetic traces written here with their RoPE,
 * against a naive oracle written from the rules of datasets/CALIB.md: per-element
 * un-rotation, sort and the linear quantile, fp16 rounding by comparing the neighbouring fp16
 * values, a brute-force Lloyd that scans every centroid for every value. Then the reader's
 * refusals, each naming the dataset.
 */
#include <check.h>
#include <gsl/gsl_errno.h>
#include <gsl/gsl_randist.h>
#include <gsl/gsl_rng.h>
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fk_check_main.h"
#include "common/fk_err.h"
#include "formats/fk_calib.h"
#include "formats/fk_h5.h"
#include "formats/fk_trace.h"
#include "kernels/fk_rope.h"
#include "kernels/fk_sparse.h"
#include "train/fk_train_calib.h"

#define NL 2                     /* layers of the test traces */
#define D 8                      /* head_dim */
#define MAXH 2                   /* KV heads at most */

static char g_dir[64];

static void setup(void)
{
    strcpy(g_dir, "/tmp/fk-calib-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(g_dir));
    fk_hdf5_quiet();
}

static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    ck_assert_int_eq(system(cmd), 0);
}

/* ---- test traces ---------------------------------------------------------------------------- */

/* A trace as written, kept for the oracle. */
struct tdata {
    char path[160];
    int H, T;
    int has_rope;
    struct fk_rope rope;
    int32_t pos[64];
    float *x[NL][2];             /* [layer][kind]: [H][T][D] post-RoPE keys, values */
};

/* Writes trace `name` of H heads and T tokens: positions 3 t + 7, skewed Gaussian keys and
 * values with a heavy tail (outliers), token 0 set to `sink` when non-zero; rope NULL: no
 * RoPE attributes. */
static void make_trace(struct tdata *td, const char *name, int H, int T,
                       const struct fk_rope *rope, unsigned long seed, double sink)
{
    memset(td, 0, sizeof *td);
    snprintf(td->path, sizeof td->path, "%s/%s", g_dir, name);
    td->H = H, td->T = T, td->has_rope = rope != NULL;
    if (rope)
        td->rope = *rope;
    struct fk_trace_info in;
    memset(&in, 0, sizeof in);
    snprintf(in.model_id, sizeof in.model_id, "test/calib");
    snprintf(in.source, sizeof in.source, "test");
    in.n_layers = NL, in.n_q_heads = H, in.n_kv_heads = H, in.head_dim = D;
    in.n_tokens = T, in.prompt_len = 4, in.keys_post_rope = 1;
    in.rope_theta = rope ? rope->theta : 10000;
    in.has_rope = rope != NULL;
    if (rope)
        in.rope = *rope;
    struct fk_trace_writer *w;
    ck_assert_msg(fk_trace_create(td->path, &in, FK_ENC_F32, &w) == FK_OK, "%s", fk_errmsg());
    uint8_t ph[64];
    for (int t = 0; t < T; t++) {
        td->pos[t] = 3 * t + 7;
        ph[t] = t >= 4;
    }
    ck_assert_int_eq(fk_trace_write_tokens(w, td->pos, ph, NULL), FK_OK);
    gsl_rng *g = gsl_rng_alloc(gsl_rng_mt19937);
    gsl_rng_set(g, seed);
    for (int l = 0; l < NL; l++)
        for (int k = 0; k < 2; k++) {
            float *x = td->x[l][k] = malloc(sizeof(float) * (size_t)H * T * D);
            ck_assert_ptr_nonnull(x);
            for (int h = 0; h < H; h++)
                for (int t = 0; t < T; t++)
                    for (int c = 0; c < D; c++) {
                        double v = gsl_ran_gaussian(g, 1 + 0.3 * c) + 0.2 * (h - c) + 0.1 * l;
                        if (gsl_rng_uniform(g) < 0.03)
                            v *= 6;
                        x[((size_t)h * T + t) * D + c] = (float)(sink && t == 0 ? sink : v);
                    }
            ck_assert_int_eq(fk_trace_write_layer(w, l, (enum fk_kind)k, x, NULL), FK_OK);
        }
    gsl_rng_free(g);
    ck_assert_int_eq(fk_trace_finish(&w), FK_OK);
}

static void free_trace(struct tdata *td)
{
    for (int l = 0; l < NL; l++)
        for (int k = 0; k < 2; k++)
            free(td->x[l][k]);
}

static const struct fk_rope rope_a = {.theta = 10000, .layout = FK_ROPE_INTERLEAVED};
static const struct fk_rope rope_b = {.theta = 500000, .layout = FK_ROPE_HALF};

static int train(const char *out, struct tdata *td, int n, const double *fr, int nf, int sinks)
{
    char *paths[4];
    for (int i = 0; i < n; i++)
        paths[i] = td[i].path;
    struct fk_train_calib_cfg c = {.out = out, .traces = paths, .n_traces = n,
                                   .n_fractions = nf, .sinks = sinks};
    memcpy(c.fractions, fr, sizeof(double) * (size_t)nf);
    return fk_train_calib_run(&c, NULL);
}

/* ---- the oracle ----------------------------------------------------------------------------- */

/* k_pre = R(-p) k_post, pair by pair, from the formulas of datasets/README.md. */
static void unrotate(const struct fk_rope *r, int p, double *x)
{
    for (int i = 0; i < D / 2; i++) {
        double f = pow(r->theta, -2.0 * i / D), cs = cos(p * f), sn = sin(p * f);
        int a = r->layout == FK_ROPE_HALF ? i : 2 * i;
        int b = r->layout == FK_ROPE_HALF ? i + D / 2 : 2 * i + 1;
        double xa = x[a], xb = x[b];
        x[a] = xa * cs + xb * sn;
        x[b] = -xa * sn + xb * cs;
    }
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pct(double *v, size_t n, double q)
{
    qsort(v, n, sizeof *v, cmp_d);
    double pos = q * (double)(n - 1);
    size_t j = (size_t)floor(pos);
    return j + 1 >= n ? v[n - 1] : v[j] + (pos - (double)j) * (v[j + 1] - v[j]);
}

/* The fp16 value nearest v (ties to an even code), among the codes next to float32's. */
static double half_of(double v)
{
    uint16_t h = fk_fp16_encode((float)v);
    double best = NAN;
    for (int dc = -1; dc <= 1; dc++) {
        uint16_t c = (uint16_t)(h + dc);
        double x = fk_fp16_decode(c);
        if (!isfinite(x))
            continue;
        double e = fabs(x - v), eb = fabs(best - v);
        if (isnan(best) || e < eb || (e == eb && !(c & 1)))
            best = x;
    }
    return best;
}

/* Lloyd on the n sorted values, every centroid scanned for every value; the levels sorted. */
static void lloyd_naive(const double *x, size_t n, int k, double *c)
{
    int *as = malloc(sizeof(int) * n), *prev = malloc(sizeof(int) * n);
    ck_assert(as && prev);
    for (int i = 0; i < k; i++)
        c[i] = x[(size_t)floor((i + 0.5) * (double)n / k)];
    for (int it = 0; it < 50; it++) {
        for (size_t j = 0; j < n; j++) {
            int best = 0;
            for (int i = 1; i < k; i++)
                if (fabs(x[j] - c[i]) < fabs(x[j] - c[best]))
                    best = i;
            as[j] = best;
        }
        if (it > 0 && !memcmp(as, prev, sizeof(int) * n))
            break;
        for (int i = 0; i < k; i++) {
            double s = 0;
            size_t m = 0;
            for (size_t j = 0; j < n; j++)
                if (as[j] == i)
                    s += x[j], m++;
            if (m)
                c[i] = s / (double)m;
        }
        memcpy(prev, as, sizeof(int) * n);
    }
    qsort(c, (size_t)k, sizeof *c, cmp_d);
    free(as);
    free(prev);
}

/* What the oracle expects of one (layer, fraction). */
struct expect {
    double up[MAXH * D], lo[MAXH * D];
    double lut[3][3][16];        /* [set: keys, values row, values head][bits - 2][level] */
};

/* The pre-RoPE keys of layer l over the traces, channel-major: [H D][n]. */
static double *oracle_keys(struct tdata *td, int n_tr, int l, size_t *n_out)
{
    int H = td[0].H;
    size_t n = 0, off = 0;
    for (int i = 0; i < n_tr; i++)
        n += (size_t)td[i].T;
    double *k = malloc(sizeof(double) * n * H * D);
    ck_assert_ptr_nonnull(k);
    for (int i = 0; i < n_tr; i++) {
        for (int h = 0; h < H; h++)
            for (int t = 0; t < td[i].T; t++) {
                double x[D];
                for (int c = 0; c < D; c++)
                    x[c] = td[i].x[l][0][((size_t)h * td[i].T + t) * D + c];
                unrotate(&td[i].rope, td[i].pos[t], x);
                for (int c = 0; c < D; c++)
                    k[(size_t)(h * D + c) * n + off + (size_t)t] = x[c];
            }
        off += (size_t)td[i].T;
    }
    *n_out = n;
    return k;
}

static void fit(double *pool, size_t m, double lut[3][16])
{
    qsort(pool, m, sizeof *pool, cmp_d);
    for (int b = 2; b <= 4; b++)
        lloyd_naive(pool, m, 1 << b, lut[b - 2]);
}

/* Keys: thresholds per channel, then the LUTs of the non-sink |u| <= 1. */
static void oracle_keys_cal(struct tdata *td, int n_tr, int l, double f, int sinks,
                            struct expect *e)
{
    int H = td[0].H;
    size_t n, m = 0;
    double *k = oracle_keys(td, n_tr, l, &n);
    double *tmp = malloc(sizeof(double) * n), *pool = malloc(sizeof(double) * n * H * D);
    ck_assert(tmp && pool);
    double t = 1 - f / 2;
    for (int ch = 0; ch < H * D; ch++) {
        memcpy(tmp, k + (size_t)ch * n, sizeof(double) * n);
        e->up[ch] = half_of(pct(tmp, n, t));
        e->lo[ch] = half_of(pct(tmp, n, 1 - t));
        double zp = (e->up[ch] + e->lo[ch]) / 2, rg = (e->up[ch] - e->lo[ch]) / 2;
        size_t tok = 0;
        for (int i = 0; i < n_tr; i++)
            for (int tt = 0; tt < td[i].T; tt++, tok++) {
                double u = (k[(size_t)ch * n + tok] - zp) / rg;
                if (tt >= sinks && rg > 0 && fabs(u) <= 1)
                    pool[m++] = u;
            }
    }
    fit(pool, m, e->lut[0]);
    free(k);
    free(tmp);
    free(pool);
}

/* Values: each non-sink row (a token's heads, or one head) by its own quantiles. */
static void oracle_values_cal(struct tdata *td, int n_tr, int l, double f, int sinks,
                              struct expect *e)
{
    int H = td[0].H;
    double t = 1 - f / 2;
    for (int g = 0; g < 2; g++) {
        int len = g == 0 ? H * D : D;
        double *pool = malloc(sizeof(double) * 64 * 2 * H * D * (size_t)n_tr), row[MAXH * D];
        ck_assert_ptr_nonnull(pool);
        size_t m = 0;
        for (int i = 0; i < n_tr; i++)
            for (int tt = sinks; tt < td[i].T; tt++)
                for (int r = 0; r < H * D / len; r++) {
                    double x[MAXH * D];
                    for (int j = 0; j < len; j++) {
                        int h = (r * len + j) / D, c = (r * len + j) % D;
                        x[j] = row[j] = td[i].x[l][1][((size_t)h * td[i].T + tt) * D + c];
                    }
                    double up = pct(row, (size_t)len, t), lo = pct(row, (size_t)len, 1 - t);
                    double zp = (up + lo) / 2, rg = (up - lo) / 2;
                    for (int j = 0; j < len; j++)
                        if (rg > 0 && fabs((x[j] - zp) / rg) <= 1)
                            pool[m++] = (x[j] - zp) / rg;
                }
        fit(pool, m, e->lut[1 + g]);
        free(pool);
    }
}

/* The file c against the oracle: thresholds exact, LUTs within 1e-6; returns the largest
 * LUT difference. */
static double compare(struct fk_calib_file *c, struct tdata *td, int n_tr, int sinks)
{
    double worst = 0;
    for (int l = 0; l < NL; l++)
        for (int fi = 0; fi < c->sh.n_fractions; fi++) {
            struct expect e;
            oracle_keys_cal(td, n_tr, l, c->sh.fractions[fi], sinks, &e);
            oracle_values_cal(td, n_tr, l, c->sh.fractions[fi], sinks, &e);
            for (int ch = 0; ch < td[0].H * D; ch++) {
                ck_assert_msg(fk_calib_upper(c, l, fi)[ch] == e.up[ch] &&
                              fk_calib_lower(c, l, fi)[ch] == e.lo[ch],
                              "L%d F%d channel %d: [%.9g, %.9g], oracle [%.9g, %.9g]", l, fi,
                              ch, fk_calib_lower(c, l, fi)[ch], fk_calib_upper(c, l, fi)[ch],
                              e.lo[ch], e.up[ch]);
            }
            for (int s = 0; s < 3; s++)
                for (int b = 2; b <= 4; b++)
                    for (int i = 0; i < 1 << b; i++) {
                        double got = fk_calib_lut(c, l, fi, s, b)[i];
                        double d = fabs(got - e.lut[s][b - 2][i]);
                        worst = d > worst ? d : worst;
                    }
        }
    return worst;
}

/* ---- train-calib against the oracle --------------------------------------------------------- */

static struct fk_calib_file *load_ok(const char *path)
{
    struct fk_calib_file *c = NULL;
    ck_assert_msg(fk_calib_load(path, &c) == FK_OK, "%s", fk_errmsg());
    return c;
}

START_TEST(kmeans_matches_brute_force)
{
    /* duplicates (equal initial centroids), ties at midpoints, and Gaussian data */
    double dup[] = {0, 0, 0, 0, 0, 0, 0, 1};
    double mid[] = {-1, -0.5, 0, 0, 0.5, 0.5, 1, 1, 0.25, -0.25, 0.75};
    gsl_rng *g = gsl_rng_alloc(gsl_rng_mt19937);
    gsl_rng_set(g, 3);
    double gauss[2000];
    for (int i = 0; i < 2000; i++)
        gauss[i] = tanh(gsl_ran_gaussian(g, 0.6));
    gsl_rng_free(g);
    struct {
        const double *x;
        size_t n;
    } sets[] = {{dup, 8}, {mid, 11}, {gauss, 2000}, {gauss, 17}};
    for (size_t s = 0; s < sizeof sets / sizeof sets[0]; s++)
        for (int k = 4; k <= 16; k *= 2) {
            if (sets[s].n < (size_t)k)
                continue;
            double a[2000], b[2000], ca[16], cb[16];
            memcpy(a, sets[s].x, sizeof(double) * sets[s].n);
            memcpy(b, sets[s].x, sizeof(double) * sets[s].n);
            ck_assert_int_eq(fk_train_calib_kmeans(a, sets[s].n, k, ca), FK_OK);
            qsort(b, sets[s].n, sizeof(double), cmp_d);
            lloyd_naive(b, sets[s].n, k, cb);
            for (int i = 0; i < k; i++) {
                ck_assert_msg(fabs(ca[i] - cb[i]) <= 1e-12, "set %zu k %d level %d: %.17g vs "
                              "%.17g", s, k, i, ca[i], cb[i]);
                ck_assert(i == 0 || ca[i] >= ca[i - 1]);
            }
        }
    double few[3] = {0, 1, 2}, lv[4];
    ck_assert_int_lt(fk_train_calib_kmeans(few, 3, 4, lv), 0);
}
END_TEST

START_TEST(trainer_matches_oracle)
{
    struct tdata td[2];
    make_trace(&td[0], "a.h5", 2, 40, &rope_a, 1, 0);
    make_trace(&td[1], "b.h5", 2, 31, &rope_b, 2, 0);
    char out[160];
    snprintf(out, sizeof out, "%s/calib.h5", g_dir);
    const double fr[3] = {0, 0.05, 0.3};
    for (int sinks = 0; sinks <= 2; sinks += 2) {
        ck_assert_msg(train(out, td, 2, fr, 3, sinks) == FK_OK, "%s", fk_errmsg());
        struct fk_calib_file *c = load_ok(out);
        ck_assert_int_eq(c->sh.n_vectors, 71);
        ck_assert_int_eq(c->sh.sinks, sinks);
        ck_assert_str_eq(c->model_id, "test/calib");
        double worst = compare(c, td, 2, sinks);
        ck_assert_msg(worst <= 1e-6, "sinks %d: LUTs %g from the oracle", sinks, worst);
        /* the oracle can tell: the other sink count gives other LUTs */
        ck_assert_msg(compare(c, td, 2, 2 - sinks) > 1e-4, "sinks %d vs %d indistinguishable",
                      sinks, 2 - sinks);
        fk_calib_free(&c);
    }
    free_trace(&td[0]);
    free_trace(&td[1]);
}
END_TEST

/* A sink token of huge values moves neither value LUT (its rows are left out and each row is
 * normalised on its own) and the keys still match the oracle that leaves it out. */
START_TEST(sinks_left_out)
{
    struct tdata td[2], huge[2];
    make_trace(&td[0], "a.h5", 2, 40, &rope_a, 5, 0);
    make_trace(&td[1], "b.h5", 2, 31, &rope_a, 6, 0);
    make_trace(&huge[0], "ha.h5", 2, 40, &rope_a, 5, 1000);
    make_trace(&huge[1], "hb.h5", 2, 31, &rope_a, 6, -1000);
    char p[160], q[160];
    snprintf(p, sizeof p, "%s/plain.h5", g_dir);
    snprintf(q, sizeof q, "%s/huge.h5", g_dir);
    const double fr[2] = {0, 0.1};
    ck_assert_int_eq(train(p, td, 2, fr, 2, 1), FK_OK);
    ck_assert_int_eq(train(q, huge, 2, fr, 2, 1), FK_OK);
    struct fk_calib_file *a = load_ok(p), *b = load_ok(q);
    for (int l = 0; l < NL; l++)
        for (int fi = 0; fi < 2; fi++)
            for (int s = 1; s <= 2; s++)
                for (int bits = 2; bits <= 4; bits++)
                    ck_assert(!memcmp(fk_calib_lut(a, l, fi, s, bits),
                                      fk_calib_lut(b, l, fi, s, bits),
                                      sizeof(float) << bits));
    /* f = 0: the sink (+-1000 in every channel, un-rotated: one of each pair >= 1000 in
     * magnitude) sets a threshold of every channel pair */
    for (int ch = 0; ch < 2 * D; ch += 2) {
        const float *up = fk_calib_upper(b, 0, 0), *lo = fk_calib_lower(b, 0, 0);
        ck_assert(fmax(fmax(up[ch], up[ch + 1]), -fmin(lo[ch], lo[ch + 1])) >= 999);
    }
    ck_assert_double_le(compare(b, huge, 2, 1), 1e-6);
    fk_calib_free(&a);
    fk_calib_free(&b);
    for (int i = 0; i < 2; i++) {
        free_trace(&td[i]);
        free_trace(&huge[i]);
    }
}
END_TEST

START_TEST(views_and_round_trip)
{
    struct tdata td;
    make_trace(&td, "a.h5", 2, 30, &rope_b, 9, 0);
    char out[160], again[160];
    snprintf(out, sizeof out, "%s/c.h5", g_dir);
    snprintf(again, sizeof again, "%s/again.h5", g_dir);
    const double fr[2] = {0, 0.01};
    ck_assert_int_eq(train(out, &td, 1, fr, 2, 1), FK_OK);
    struct fk_calib_file *c = load_ok(out);
    for (int l = 0; l < NL; l++) {
        const struct fk_calib *k = fk_calib_get(c, l, FK_KIND_K);
        const struct fk_calib *v = fk_calib_get(c, l, FK_KIND_V);
        ck_assert(k->n_kv_heads == 2 && k->head_dim == D && k->sinks == 1 && k->n_kvq == 2);
        ck_assert(v->n_kv_heads == 2 && v->head_dim == D && v->sinks == 1 && v->n_kvq == 2);
        for (int fi = 0; fi < 2; fi++) {
            ck_assert(k->kvq[fi].outliers == fr[fi] && v->kvq[fi].outliers == fr[fi]);
            ck_assert_ptr_eq(k->kvq[fi].upper, fk_calib_upper(c, l, fi));
            ck_assert_ptr_eq(k->kvq[fi].lower, fk_calib_lower(c, l, fi));
            ck_assert(!v->kvq[fi].upper && !v->kvq[fi].lower);
            for (int b = 2; b <= 4; b++) {
                ck_assert_ptr_eq(k->kvq[fi].lut[b - 2][FK_KVQ_ROW], fk_calib_lut(c, l, fi, 0, b));
                ck_assert_ptr_null(k->kvq[fi].lut[b - 2][FK_KVQ_HEAD]);
                ck_assert_ptr_eq(v->kvq[fi].lut[b - 2][FK_KVQ_ROW], fk_calib_lut(c, l, fi, 1, b));
                ck_assert_ptr_eq(v->kvq[fi].lut[b - 2][FK_KVQ_HEAD], fk_calib_lut(c, l, fi, 2, b));
            }
        }
    }
    /* save, load: the same numbers; provenance kept */
    ck_assert_int_eq(fk_calib_save(c, again, (const char *const[]){"generator", "test", NULL}),
                     FK_OK);
    struct fk_calib_file *d = load_ok(again);
    size_t nthr = (size_t)NL * 2 * 2 * D;
    ck_assert(!memcmp(c->upper, d->upper, sizeof(float) * nthr));
    ck_assert(!memcmp(c->lower, d->lower, sizeof(float) * nthr));
    ck_assert(!memcmp(c->lut, d->lut, sizeof(float) * NL * 2 * 3 * 28));
    ck_assert(!memcmp(&c->sh, &d->sh, sizeof c->sh));
    ck_assert_str_eq(c->model_id, d->model_id);
    hid_t f = H5Fopen(out, H5F_ACC_RDONLY, H5P_DEFAULT);
    char buf[256];
    ck_assert_int_eq(fk_h5_attr_str(f, out, "generator", buf, sizeof buf), FK_OK);
    ck_assert_str_eq(buf, "fadkv-bench train-calib");
    ck_assert_int_eq(fk_h5_attr_str(f, out, "training_traces", buf, sizeof buf), FK_OK);
    ck_assert_ptr_nonnull(strstr(buf, "a.h5 sha256:"));
    H5Fclose(f);
    fk_calib_free(&c);
    fk_calib_free(&d);
    free_trace(&td);
}
END_TEST

/* ---- refusals ------------------------------------------------------------------------------- */

/* Replaces dataset name by rank-1/2 float data (NULL: deletes it). */
static void put_ds(const char *path, const char *name, const hsize_t *shape, int rank,
                   const void *data, int f64)
{
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    ck_assert(f >= 0);
    ck_assert(H5Ldelete(f, name, H5P_DEFAULT) >= 0);
    if (data)
        ck_assert_int_eq(fk_h5_write(f, name, f64 ? H5T_IEEE_F64LE : H5T_IEEE_F32LE,
                                     f64 ? H5T_NATIVE_DOUBLE : H5T_NATIVE_FLOAT, rank, shape, 0,
                                     0, data), FK_OK);
    H5Fclose(f);
}

static void assert_refused(const char *path, const char *const *want)
{
    struct fk_calib_file *c = NULL;
    fk_err_clear();
    ck_assert_int_lt(fk_calib_load(path, &c), 0);
    ck_assert_ptr_null(c);
    for (int i = 0; want[i]; i++)
        ck_assert_msg(strstr(fk_errmsg(), want[i]), "message '%s' lacks '%s'", fk_errmsg(),
                      want[i]);
}

START_TEST(reader_refusals)
{
    struct tdata td;
    make_trace(&td, "a.h5", 2, 30, &rope_a, 4, 0);
    char out[160], cp[160], cmd[400];
    snprintf(out, sizeof out, "%s/c.h5", g_dir);
    snprintf(cp, sizeof cp, "%s/copy.h5", g_dir);
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", out, cp);
    const double fr[2] = {0, 0.01};
    ck_assert_int_eq(train(out, &td, 1, fr, 2, 1), FK_OK);
    struct fk_calib_file *c = load_ok(out);
    float up[2 * D];
    memcpy(up, fk_calib_upper(c, 1, 1), sizeof up);
    fk_calib_free(&c);

    ck_assert_int_eq(system(cmd), 0);
    put_ds(cp, "/layers/L01/kvquant/F1/values_head_lut3", NULL, 0, NULL, 0);
    assert_refused(cp, (const char *[]){cp, "missing dataset",
                                        "/layers/L01/kvquant/F1/values_head_lut3", NULL});
    ck_assert_int_eq(system(cmd), 0);
    float zero[2 * D] = {0};
    put_ds(cp, "/layers/L00/kvquant/F0/keys_upper", (const hsize_t[]){2, 7}, 2, zero, 0);
    assert_refused(cp, (const char *[]){cp, "/layers/L00/kvquant/F0/keys_upper", "[2, 7]",
                                        "expected [2, 8]", NULL});
    ck_assert_int_eq(system(cmd), 0);
    put_ds(cp, "/layers/L00/kvquant/F1/keys_lut2", (const hsize_t[]){4}, 1,
           (const float[]){-0.5f, 0.5f, 0.25f, 0.75f}, 0);
    assert_refused(cp, (const char *[]){cp, "/layers/L00/kvquant/F1/keys_lut2", "ascending",
                                        NULL});
    ck_assert_int_eq(system(cmd), 0);
    put_ds(cp, "/layers/L01/kvquant/F0/values_row_lut2", (const hsize_t[]){4}, 1,
           (const float[]){-1, 0, 0.5f, 1.01f}, 0);
    assert_refused(cp, (const char *[]){cp, "/layers/L01/kvquant/F0/values_row_lut2",
                                        "[-1, 1]", NULL});
    ck_assert_int_eq(system(cmd), 0);
    float lo[2 * D];
    memcpy(lo, up, sizeof lo);
    lo[5] = up[5] + 0.5f;
    put_ds(cp, "/layers/L01/kvquant/F1/keys_lower", (const hsize_t[]){2, D}, 2, lo, 0);
    assert_refused(cp, (const char *[]){cp, "/layers/L01/kvquant/F1/keys_lower", "head 0, "
                                        "channel 5", "> upper", NULL});
    ck_assert_int_eq(system(cmd), 0);
    put_ds(cp, "/kvquant_outliers", (const hsize_t[]){2}, 1, (const double[]){0.01, 0}, 1);
    assert_refused(cp, (const char *[]){cp, "/kvquant_outliers", "ascending", NULL});
    ck_assert_int_eq(system(cmd), 0);
    put_ds(cp, "/kvquant_outliers", (const hsize_t[]){3}, 1, (const double[]){0, 0.01, 0.1}, 1);
    assert_refused(cp, (const char *[]){cp, "missing dataset", "/layers/L00/kvquant/F2", NULL});
    ck_assert_int_eq(system(cmd), 0);
    hid_t f = H5Fopen(cp, H5F_ACC_RDWR, H5P_DEFAULT);
    ck_assert_int_eq(fk_h5_put_str(f, "schema", "fadkv-basis"), FK_OK);
    H5Fclose(f);
    assert_refused(cp, (const char *[]){cp, "schema", "fadkv-calib", NULL});
    assert_refused("/nonexistent/calib.h5",
                   (const char *[]){"/nonexistent/calib.h5", "no such file", NULL});
    free_trace(&td);
}
END_TEST

/* A trace without RoPE, traces of two shapes, bad options: refused, no file left; and
 * fk_calib_check_trace. */
START_TEST(trainer_refusals)
{
    struct tdata td[3];
    make_trace(&td[0], "a.h5", 2, 30, &rope_a, 1, 0);
    make_trace(&td[1], "norope.h5", 2, 30, NULL, 2, 0);
    make_trace(&td[2], "one-head.h5", 1, 30, &rope_a, 3, 0);
    char out[160], tmp[170];
    snprintf(out, sizeof out, "%s/never.h5", g_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", out);
    const double fr[2] = {0, 0.01};
    fk_err_clear();
    ck_assert_int_lt(train(out, td, 2, fr, 2, 1), 0);
    ck_assert_msg(strstr(fk_errmsg(), td[1].path) && strstr(fk_errmsg(), "rope_layout"),
                  "message '%s'", fk_errmsg());
    struct tdata mixed[2] = {td[0], td[2]};
    ck_assert_int_lt(train(out, mixed, 2, fr, 2, 1), 0);
    ck_assert_msg(strstr(fk_errmsg(), td[0].path) && strstr(fk_errmsg(), td[2].path) &&
                      strstr(fk_errmsg(), "1 KV heads"), "message '%s'", fk_errmsg());
    ck_assert_int_lt(train(out, td, 1, (const double[]){0.01, 0}, 2, 1), 0);
    ck_assert_ptr_nonnull(strstr(fk_errmsg(), "--outliers"));
    ck_assert_int_lt(train(out, td, 1, (const double[]){0.5}, 1, 1), 0);
    ck_assert_ptr_nonnull(strstr(fk_errmsg(), "[0, 0.5)"));
    /* every token a sink: nothing left for the LUTs */
    ck_assert_int_lt(train(out, td, 1, fr, 2, 30), 0);
    ck_assert_msg(strstr(fk_errmsg(), "layer 0, keys, outlier fraction 0:"), "message '%s'",
                  fk_errmsg());
    ck_assert_int_ne(access(out, F_OK), 0);
    ck_assert_int_ne(access(tmp, F_OK), 0);

    struct fk_calib_shape sh = {.n_layers = NL, .n_kv_heads = 2, .head_dim = D};
    struct fk_trace *t;
    ck_assert_int_eq(fk_trace_open(td[2].path, &t), FK_OK);
    fk_err_clear();
    ck_assert_int_lt(fk_calib_check_trace(&sh, "cal.h5", fk_trace_get_info(t), td[2].path), 0);
    ck_assert_msg(strstr(fk_errmsg(), "cal.h5") && strstr(fk_errmsg(), td[2].path) &&
                      strstr(fk_errmsg(), "2 layers x 2 KV heads"), "message '%s'", fk_errmsg());
    fk_trace_close(&t);
    ck_assert_int_eq(fk_trace_open(td[0].path, &t), FK_OK);
    ck_assert_int_eq(fk_calib_check_trace(&sh, "cal.h5", fk_trace_get_info(t), td[0].path),
                     FK_OK);
    fk_trace_close(&t);
    for (int i = 0; i < 3; i++)
        free_trace(&td[i]);
}
END_TEST

/* ---- the suite ------------------------------------------------------------------------------ */

static TCase *tcase(const char *name)
{
    TCase *tc = tcase_create(name);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    return tc;
}

int main(void)
{
    gsl_set_error_handler_off();
    Suite *s = suite_create("calib");
    TCase *tc = tcase("train");
    tcase_add_test(tc, kmeans_matches_brute_force);
    tcase_add_test(tc, trainer_matches_oracle);
    tcase_add_test(tc, sinks_left_out);
    tcase_add_test(tc, views_and_round_trip);
    suite_add_tcase(s, tc);
    tc = tcase("refusals");
    tcase_add_test(tc, reader_refusals);
    tcase_add_test(tc, trainer_refusals);
    suite_add_tcase(s, tc);
    return fk_suite_run(s);
}
