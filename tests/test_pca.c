/* SPDX-License-Identifier: MIT
 * The low-rank family: RoPE and its inverse (codecs/kernels/fk_rope.h), the RoPE attributes
 * of traces, the basis file (datasets/formats/fk_basis.h), train-basis
 * (harness/train/fk_train_basis.h) and the pca codec (codecs/lowrank/fk_pca.c), checked
 * against naive rotations, independent dense linear algebra (GSL SVD of the data matrix)
 * and the runner's refusals before any cell.
 */
#include <check.h>
#include <gsl/gsl_errno.h>
#include <gsl/gsl_linalg.h>
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
#include "core/fk_codec.h"
#include "core/fk_registry.h"
#include "engine/fk_sweep.h"
#include "runner/fk_runner.h"
#include "formats/fk_basis.h"
#include "formats/fk_h5.h"
#include "formats/fk_trace.h"
#include "kernels/fk_rope.h"
#include "train/fk_train_basis.h"

static char g_dir[64];

static void setup(void)
{
    strcpy(g_dir, "/tmp/fk-pca-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(g_dir));
    fk_hdf5_quiet();
}

static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    ck_assert_int_eq(system(cmd), 0);
}

static void pth(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", g_dir, name);
}

static gsl_rng *rng_new(unsigned long seed)
{
    gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
    ck_assert_ptr_nonnull(r);
    gsl_rng_set(r, seed);
    return r;
}

/* ---- RoPE ------------------------------------------------------------------------------ */

/* llama2.c's rope() (datasets/gen/fk_llama2c.c), written out again: pairs (2i, 2i+1),
 * f_i = theta^(-2i/d), angles in double. */
static void naive_llama2c(double *v, int d, double theta, int pos)
{
    for (int i = 0; i < d / 2; i++) {
        double a = pos * pow(theta, -(2.0 * i) / d), c = cos(a), s = sin(a);
        double x = v[2 * i], y = v[2 * i + 1];
        v[2 * i] = x * c - y * s;
        v[2 * i + 1] = x * s + y * c;
    }
}

/* Hugging Face's apply_rotary_pos_emb: x cos + rotate_half(x) sin, with cos and sin of the
 * d/2 frequencies repeated twice and rotate_half(x) = [-x2, x1]. */
static void naive_hf(double *v, int d, const double *freq, int pos)
{
    double out[512];
    for (int j = 0; j < d; j++) {
        double a = pos * freq[j % (d / 2)];
        double rh = j < d / 2 ? -v[j + d / 2] : v[j - d / 2];
        out[j] = v[j] * cos(a) + rh * sin(a);
    }
    memcpy(v, out, sizeof(double) * (size_t)d);
}

static void rope_one(const struct fk_rope *r, int d, int pos, int dir, double *x)
{
    double freq[256], cs[256], sn[256];
    fk_rope_freqs(r, d, freq);
    int32_t p = pos;
    fk_rope_table(freq, d, &p, 1, cs, sn);
    fk_rope_apply(r->layout, d, cs, sn, dir, x);
}

START_TEST(rope_matches_naive_and_inverts)
{
    gsl_rng *g = rng_new(1);
    const int d = 64;
    const int pos[] = {0, 1, 7, 300, 4095, 131071};
    for (int layout = 0; layout < 2; layout++)
        for (size_t k = 0; k < sizeof pos / sizeof pos[0]; k++) {
            struct fk_rope r = {.theta = layout ? 500000 : 10000, .layout = layout};
            ck_assert_int_eq(fk_rope_check(&r, d), FK_OK);
            double x[64], y[64], z[64];
            for (int i = 0; i < d; i++)
                x[i] = gsl_ran_gaussian(g, 1);
            memcpy(y, x, sizeof y);
            memcpy(z, x, sizeof z);
            rope_one(&r, d, pos[k], +1, y);
            if (layout == FK_ROPE_INTERLEAVED) {
                naive_llama2c(z, d, r.theta, pos[k]);
            } else {
                double freq[32];
                for (int i = 0; i < d / 2; i++)
                    freq[i] = pow(r.theta, -(2.0 * i) / d);
                naive_hf(z, d, freq, pos[k]);
            }
            /* the same formula: equal up to the last bits of cos/sin of a large angle */
            for (int i = 0; i < d; i++)
                ck_assert_msg(fabs(y[i] - z[i]) <= 1e-12 * (1 + fabs(z[i])),
                              "layout %d pos %d channel %d: %.17g vs naive %.17g", layout,
                              pos[k], i, y[i], z[i]);
            /* the inverse is the transpose of an orthogonal map: x back to rounding */
            rope_one(&r, d, pos[k], -1, y);
            for (int i = 0; i < d; i++)
                ck_assert_msg(fabs(y[i] - x[i]) <= 1e-14 * (1 + fabs(x[i])),
                              "round trip layout %d pos %d channel %d: %.17g vs %.17g",
                              layout, pos[k], i, y[i], x[i]);
        }
    gsl_rng_free(g);
}
END_TEST

/* llama3 frequencies, Llama-3.1's numbers, against the rule written case by case. */
START_TEST(rope_llama3_frequencies)
{
    const int d = 128;
    struct fk_rope r = {.theta = 500000, .layout = FK_ROPE_HALF, .type = FK_ROPE_LLAMA3,
                        .factor = 8, .low_freq_factor = 1, .high_freq_factor = 4,
                        .original_max_position = 8192};
    ck_assert_int_eq(fk_rope_check(&r, d), FK_OK);
    double f[64];
    fk_rope_freqs(&r, d, f);
    int n_hi = 0, n_lo = 0, n_mid = 0;
    for (int i = 0; i < d / 2; i++) {
        double f0 = pow(500000.0, -(2.0 * i) / d), w = 2 * 3.14159265358979323846 / f0;
        double want;
        if (w < 8192.0 / 4) {
            want = f0;
            n_hi++;
        } else if (w > 8192.0 / 1) {
            want = f0 / 8;
            n_lo++;
        } else {
            double s = (8192.0 / w - 1) / (4 - 1);
            want = (1 - s) * f0 / 8 + s * f0;
            n_mid++;
        }
        ck_assert_msg(fabs(f[i] - want) <= 1e-15 * want, "pair %d: %.17g vs %.17g", i, f[i],
                      want);
    }
    ck_assert(n_hi > 0 && n_lo > 0 && n_mid > 0); /* every branch ran */
    /* round trip at a long position under llama3 */
    double x[128], y[128];
    for (int i = 0; i < d; i++)
        x[i] = y[i] = sin(i + 1.0);
    rope_one(&r, d, 100000, +1, y);
    rope_one(&r, d, 100000, -1, y);
    for (int i = 0; i < d; i++)
        ck_assert(fabs(y[i] - x[i]) <= 1e-14);
    /* parameters out of range are refused with the parameter's name */
    struct fk_rope bad = r;
    bad.high_freq_factor = 0.5;
    ck_assert_int_lt(fk_rope_check(&bad, d), 0);
    ck_assert_ptr_nonnull(strstr(fk_errmsg(), "rope_high_freq_factor"));
    bad = r;
    bad.factor = 0.5;
    ck_assert_int_lt(fk_rope_check(&bad, d), 0);
    ck_assert_ptr_nonnull(strstr(fk_errmsg(), "rope_factor"));
    ck_assert_int_lt(fk_rope_check(&r, 15), 0);
    ck_assert_ptr_nonnull(strstr(fk_errmsg(), "even head_dim"));
}
END_TEST

/* ---- RoPE attributes of traces --------------------------------------------------------- */

/* Fills one layer's keys or values [n_kv][T][d] (tokens at positions 0 .. T-1). */
typedef void (*fill_fn)(void *ctx, gsl_rng *g, int layer, int kind, int n_kv, int T, int d,
                        float *x);

static void fill_gaussian(void *ctx, gsl_rng *g, int layer, int kind, int n_kv, int T, int d,
                          float *x)
{
    (void)ctx, (void)layer, (void)kind;
    for (long i = 0; i < (long)n_kv * T * d; i++)
        x[i] = (float)gsl_ran_gaussian(g, 1);
}

static void write_trace_fill(const char *path, const struct fk_rope *rope, int n_kv, int d,
                             int T, unsigned long seed, fill_fn fill, void *ctx);

/* A small trace (2 layers, n_kv KV heads, head_dim d, T tokens of which 4 prefill) with
 * Gaussian data; rope = NULL writes no RoPE attributes. */
static void write_trace(const char *path, const struct fk_rope *rope, int n_kv, int d, int T,
                        unsigned long seed)
{
    write_trace_fill(path, rope, n_kv, d, T, seed, fill_gaussian, NULL);
}

static void write_trace_fill(const char *path, const struct fk_rope *rope, int n_kv, int d,
                             int T, unsigned long seed, fill_fn fill, void *ctx)
{
    struct fk_trace_info in;
    memset(&in, 0, sizeof in);
    snprintf(in.model_id, sizeof in.model_id, "test/model");
    snprintf(in.source, sizeof in.source, "test");
    in.n_layers = 2;
    in.n_q_heads = n_kv;
    in.n_kv_heads = n_kv;
    in.head_dim = d;
    in.n_tokens = T;
    in.prompt_len = 4;
    in.keys_post_rope = 1;
    in.rope_theta = rope ? rope->theta : 10000;
    in.has_rope = rope != NULL;
    if (rope)
        in.rope = *rope;
    struct fk_trace_writer *w;
    ck_assert_msg(fk_trace_create(path, &in, FK_ENC_F32, &w) == FK_OK, "%s", fk_errmsg());
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)T);
    uint8_t *ph = malloc((size_t)T);
    float *x = malloc(sizeof(float) * (size_t)n_kv * T * d);
    ck_assert(pos && ph && x);
    for (int t = 0; t < T; t++) {
        pos[t] = t;
        ph[t] = t >= 4;
    }
    ck_assert_int_eq(fk_trace_write_tokens(w, pos, ph, NULL), FK_OK);
    gsl_rng *g = rng_new(seed);
    for (int l = 0; l < 2; l++)
        for (int k = 0; k < 2; k++) {
            fill(ctx, g, l, k, n_kv, T, d, x);
            ck_assert_int_eq(fk_trace_write_layer(w, l, (enum fk_kind)k, x, NULL), FK_OK);
        }
    gsl_rng_free(g);
    ck_assert_int_eq(fk_trace_finish(&w), FK_OK);
    free(pos);
    free(ph);
    free(x);
}

static void set_attr_str(const char *path, const char *name, const char *value)
{
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    ck_assert(f >= 0);
    if (value)
        ck_assert_int_eq(fk_h5_put_str(f, name, value), FK_OK);
    else
        H5Adelete(f, name);
    H5Fclose(f);
}

/* Opening fails with a message holding every one of want[] (NULL-terminated). */
static void assert_trace_refused(const char *path, const char *const *want)
{
    struct fk_trace *t = NULL;
    fk_err_clear();
    ck_assert_int_lt(fk_trace_open(path, &t), 0);
    for (int i = 0; want[i]; i++)
        ck_assert_msg(strstr(fk_errmsg(), want[i]), "message '%s' lacks '%s'", fk_errmsg(),
                      want[i]);
}

START_TEST(trace_rope_attributes)
{
    char p[128];
    pth(p, sizeof p, "rope.h5");
    struct fk_rope r3 = {.theta = 500000, .layout = FK_ROPE_HALF, .type = FK_ROPE_LLAMA3,
                         .factor = 32, .low_freq_factor = 1, .high_freq_factor = 4,
                         .original_max_position = 8192};
    write_trace(p, &r3, 2, 8, 12, 1);
    struct fk_trace *t;
    ck_assert_int_eq(fk_trace_open(p, &t), FK_OK);
    const struct fk_trace_info *in = fk_trace_get_info(t);
    ck_assert_int_eq(in->has_rope, 1);
    ck_assert_int_eq(in->rope.layout, FK_ROPE_HALF);
    ck_assert_int_eq(in->rope.type, FK_ROPE_LLAMA3);
    ck_assert(in->rope.theta == 500000 && in->rope.factor == 32 &&
              in->rope.low_freq_factor == 1 && in->rope.high_freq_factor == 4 &&
              in->rope.original_max_position == 8192);
    fk_trace_close(&t);
    /* the numbers may be strings (the Python writer's default) */
    set_attr_str(p, "rope_factor", "16");
    ck_assert_int_eq(fk_trace_open(p, &t), FK_OK);
    ck_assert(fk_trace_get_info(t)->rope.factor == 16);
    fk_trace_close(&t);

    set_attr_str(p, "rope_factor", "sixteen");
    assert_trace_refused(p, (const char *[]){p, "rope_factor", "expected a number", NULL});
    set_attr_str(p, "rope_factor", NULL);
    assert_trace_refused(p, (const char *[]){p, "rope_factor", "llama3", NULL});
    set_attr_str(p, "rope_factor", "8");
    set_attr_str(p, "rope_layout", "diagonal");
    assert_trace_refused(p, (const char *[]){p, "rope_layout", "diagonal", "interleaved",
                                             "half", NULL});
    set_attr_str(p, "rope_layout", "half");
    set_attr_str(p, "rope_type", "yarn");
    assert_trace_refused(p, (const char *[]){p, "rope_type", "yarn", "llama3", NULL});
    set_attr_str(p, "rope_type", "llama3");
    set_attr_str(p, "rope_low_freq_factor", "5");
    assert_trace_refused(p, (const char *[]){p, "rope_low_freq_factor", "low < high", NULL});
    set_attr_str(p, "rope_low_freq_factor", "1");
    set_attr_str(p, "rope_layout", NULL);
    assert_trace_refused(p, (const char *[]){p, "rope_type", "rope_layout is not", NULL});

    /* no RoPE attributes at all: a valid trace that says nothing about its RoPE */
    pth(p, sizeof p, "norope.h5");
    write_trace(p, NULL, 2, 8, 12, 1);
    ck_assert_int_eq(fk_trace_open(p, &t), FK_OK);
    ck_assert_int_eq(fk_trace_get_info(t)->has_rope, 0);
    fk_trace_close(&t);
}
END_TEST

/* ---- the basis file and train-basis --------------------------------------------------- */

static int train(const char *out, char **traces, int n, int group, int max_rank)
{
    struct fk_train_basis_cfg c = {.out = out, .traces = traces, .n_traces = n,
                                   .group = group, .max_rank = max_rank};
    return fk_train_basis_run(&c, NULL);
}

/* The data matrix of (layer, kind, group gi) over the traces: rows = tokens, columns = the
 * group's heads concatenated; pre: keys un-rotated by the naive llama2.c rotation at -p. */
static double *data_matrix(char **traces, int n, int layer, int kind, int g, int gi, int pre,
                           int *rows, int *dim)
{
    double *X = NULL;
    int N = 0;
    for (int i = 0; i < n; i++) {
        struct fk_trace *t;
        ck_assert_int_eq(fk_trace_open(traces[i], &t), FK_OK);
        const struct fk_trace_info *in = fk_trace_get_info(t);
        int d = in->head_dim, T = in->n_tokens;
        *dim = g * d;
        float *kv = malloc(sizeof(float) * (size_t)in->n_kv_heads * T * d);
        X = realloc(X, sizeof(double) * (size_t)(N + T) * *dim);
        ck_assert(kv && X);
        ck_assert_int_eq(fk_trace_read(t, layer, (enum fk_kind)kind, kv), FK_OK);
        for (int tk = 0; tk < T; tk++, N++)
            for (int j = 0; j < g; j++) {
                double *row = X + (size_t)N * *dim + (size_t)j * d;
                for (int c = 0; c < d; c++)
                    row[c] = kv[((size_t)(gi * g + j) * T + tk) * d + c];
                if (pre)
                    naive_llama2c(row, d, in->rope_theta, -fk_trace_positions(t)[tk]);
            }
        free(kv);
        fk_trace_close(&t);
    }
    *rows = N;
    return X;
}

/* The basis of one (layer, variant, group) against GSL's SVD of the (centered) data matrix:
 * the right singular vectors span the same lines as the eigenvectors (|cos| = 1: the
 * eigenvalues of Gaussian data are distinct), and s_j^2 / N are the eigenvalues. */
static void compare_with_svd(struct fk_basis_file *b, double *X, int N, int dim, int layer,
                             int variant, int gi)
{
    int k = b->sh.n_comp;
    const float *mean = fk_basis_mean(b, layer, variant) + (size_t)gi * dim;
    double mu[64];
    for (int c = 0; c < dim; c++) {
        mu[c] = 0;
        for (int r = 0; r < N; r++)
            mu[c] += X[(size_t)r * dim + c] / N;
        ck_assert_msg(fabs(mu[c] - mean[c]) <= 1e-6 * (1 + fabs(mu[c])), "mean %d: %g vs %g", c,
                      (double)mean[c], mu[c]);
    }
    for (int center = 0; center < 2; center++) {
        gsl_matrix *A = gsl_matrix_alloc((size_t)N, (size_t)dim);
        gsl_matrix *V = gsl_matrix_alloc((size_t)dim, (size_t)dim);
        gsl_vector *S = gsl_vector_alloc((size_t)dim), *work = gsl_vector_alloc((size_t)dim);
        for (int r = 0; r < N; r++)
            for (int c = 0; c < dim; c++)
                gsl_matrix_set(A, (size_t)r, (size_t)c,
                               X[(size_t)r * dim + c] - (center == FK_BASIS_CENTERED ? mu[c] : 0));
        ck_assert_int_eq(gsl_linalg_SV_decomp(A, V, S, work), 0);
        const float *U = fk_basis_vec(b, layer, variant, center) + (size_t)gi * k * dim;
        const double *E = fk_basis_eig(b, layer, variant, center) + (size_t)gi * k;
        for (int j = 0; j < k; j++) {
            double s = gsl_vector_get(S, (size_t)j), cosv = 0;
            for (int c = 0; c < dim; c++)
                cosv += U[(size_t)j * dim + c] * gsl_matrix_get(V, (size_t)c, (size_t)j);
            ck_assert_msg(fabs(E[j] - s * s / N) <= 1e-9 * (1 + E[0]),
                          "variant %d center %d component %d: eigenvalue %.12g, SVD %.12g",
                          variant, center, j, E[j], s * s / N);
            ck_assert_msg(fabs(fabs(cosv) - 1) <= 1e-5, "variant %d center %d component %d: "
                          "|cos| with the SVD's vector = %.9f", variant, center, j, fabs(cosv));
        }
        gsl_matrix_free(A);
        gsl_matrix_free(V);
        gsl_vector_free(S);
        gsl_vector_free(work);
    }
}

START_TEST(basis_matches_svd)
{
    char p[2][128], out[128];
    char *tr[2] = {p[0], p[1]};
    struct fk_rope rope = {.theta = 10000, .layout = FK_ROPE_INTERLEAVED};
    for (int i = 0; i < 2; i++) {
        snprintf(p[i], sizeof p[i], "%s/cal-%d.h5", g_dir, i);
        write_trace(p[i], &rope, 4, 8, 40 + 7 * i, 10 + i);
    }
    pth(out, sizeof out, "basis.h5");
    for (int g = 1; g <= 2; g++) {
        ck_assert_msg(train(out, tr, 2, g, g == 2 ? 12 : 0) == FK_OK, "%s", fk_errmsg());
        struct fk_basis_file *b;
        ck_assert_msg(fk_basis_load(out, &b) == FK_OK, "%s", fk_errmsg());
        ck_assert_int_eq(b->sh.group, g);
        ck_assert_int_eq(b->sh.n_groups, 4 / g);
        ck_assert_int_eq(b->sh.n_comp, g == 2 ? 12 : 8);
        ck_assert_int_eq(b->sh.has_pre_rope, 1);
        ck_assert_int_eq((int)b->sh.n_vectors, 40 + 47);
        for (int l = 0; l < 2; l++)
            for (int v = 0; v < FK_BV_N; v++)
                for (int gi = 0; gi < 4 / g; gi++) {
                    int N, dim;
                    double *X = data_matrix(tr, 2, l, v == FK_BV_VALUES, g, gi,
                                            v == FK_BV_KEYS_PRE, &N, &dim);
                    compare_with_svd(b, X, N, dim, l, v, gi);
                    free(X);
                }
        /* the codec's view: keys carry their pre-RoPE variant, values none */
        const struct fk_basis *bk = fk_basis_get(b, 1, FK_KIND_K);
        ck_assert_ptr_nonnull(bk->pre_rope);
        ck_assert_ptr_eq(bk->pre_rope->mean, fk_basis_mean(b, 1, FK_BV_KEYS_PRE));
        ck_assert_ptr_null(fk_basis_get(b, 1, FK_KIND_V)->pre_rope);
        fk_basis_free(&b);
    }
}
END_TEST

/* Delete (want_shape = NULL) or replace a dataset by a float32 one of another shape. */
static void damage_dataset(const char *path, const char *name, const hsize_t *shape, int rank)
{
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    ck_assert(f >= 0);
    ck_assert(H5Ldelete(f, name, H5P_DEFAULT) >= 0);
    if (shape) {
        float zero[4096] = {0};
        ck_assert_int_eq(fk_h5_write(f, name, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, rank, shape, 0,
                                     0, zero), FK_OK);
    }
    H5Fclose(f);
}

static void assert_basis_refused(const char *path, const char *const *want)
{
    struct fk_basis_file *b = NULL;
    fk_err_clear();
    ck_assert_int_lt(fk_basis_load(path, &b), 0);
    ck_assert_ptr_null(b);
    for (int i = 0; want[i]; i++)
        ck_assert_msg(strstr(fk_errmsg(), want[i]), "message '%s' lacks '%s'", fk_errmsg(),
                      want[i]);
}

START_TEST(basis_file_refusals)
{
    char tp[2][128], out[128], cp[160];
    char *tr[2] = {tp[0], tp[1]};
    pth(tp[0], sizeof tp[0], "a.h5");
    pth(tp[1], sizeof tp[1], "b.h5");
    write_trace(tp[0], NULL, 2, 8, 12, 1);
    write_trace(tp[1], NULL, 2, 8, 12, 2);
    pth(out, sizeof out, "basis.h5");
    ck_assert_int_eq(train(out, tr, 2, 1, 0), FK_OK);
    struct fk_basis_file *b;
    ck_assert_int_eq(fk_basis_load(out, &b), FK_OK);
    ck_assert_int_eq(b->sh.has_pre_rope, 0); /* no rope_layout: no pre-RoPE keys */
    ck_assert_ptr_null(fk_basis_get(b, 0, FK_KIND_K)->pre_rope);
    fk_basis_free(&b);
    char cmd[512];
#define FRESH()                                                                           \
    do {                                                                                  \
        snprintf(cp, sizeof cp, "%s/copy.h5", g_dir);                                     \
        snprintf(cmd, sizeof cmd, "cp '%s' '%s'", out, cp);                               \
        ck_assert_int_eq(system(cmd), 0);                                                 \
    } while (0)
    FRESH();
    set_attr_str(cp, "schema", "fadkv-dict");
    assert_basis_refused(cp, (const char *[]){cp, "schema", "fadkv-basis", NULL});
    FRESH();
    damage_dataset(cp, "/layers/L01/values/uncentered_basis", NULL, 0);
    assert_basis_refused(cp, (const char *[]){cp, "missing dataset",
                                              "/layers/L01/values/uncentered_basis", NULL});
    FRESH();
    damage_dataset(cp, "/layers/L00/keys/mean", (const hsize_t[]){2, 7}, 2);
    assert_basis_refused(cp, (const char *[]){cp, "/layers/L00/keys/mean", "[2, 7]",
                                              "expected [2, 8]", NULL});
    FRESH();
    damage_dataset(cp, "/layers/L00/keys/centered_basis", (const hsize_t[]){2, 8, 8}, 3);
    assert_basis_refused(cp, (const char *[]){cp, "/layers/L00/keys/centered_basis", "norm",
                                              NULL});
    FRESH();
    set_attr_str(cp, "group", NULL);
    assert_basis_refused(cp, (const char *[]){cp, "group", NULL});
    assert_basis_refused("/nonexistent/basis.h5",
                         (const char *[]){"/nonexistent/basis.h5", "no such file", NULL});
#undef FRESH

    /* train-basis refuses traces of different shapes, a group that does not divide H_kv and
     * a rank above g x head_dim, and then leaves no file behind */
    char other[128], out2[128];
    pth(other, sizeof other, "c.h5");
    write_trace(other, NULL, 4, 8, 12, 3);
    pth(out2, sizeof out2, "never.h5");
    char *mixed[2] = {tp[0], other};
    fk_err_clear();
    ck_assert_int_lt(train(out2, mixed, 2, 1, 0), 0);
    ck_assert_msg(strstr(fk_errmsg(), other) && strstr(fk_errmsg(), tp[0]) &&
                      strstr(fk_errmsg(), "4 KV heads"), "message '%s'", fk_errmsg());
    ck_assert_int_lt(train(out2, tr, 2, 3, 0), 0);
    ck_assert_ptr_nonnull(strstr(fk_errmsg(), "--group 3 does not divide"));
    ck_assert_int_lt(train(out2, tr, 2, 1, 9), 0);
    ck_assert_ptr_nonnull(strstr(fk_errmsg(), "--max-rank 9"));
    ck_assert_int_ne(access(out2, F_OK), 0);
    char tmp[160];
    snprintf(tmp, sizeof tmp, "%s.tmp", out2);
    ck_assert_int_ne(access(tmp, F_OK), 0);
}
END_TEST

/* ---- the pca codec ----------------------------------------------------------------------- */

/* Affine data of rank q per (layer, kind, head group of g heads): x = mu + sum_j a_tj b_j on
 * the group's concatenated heads; keys then rotated by RoPE at position t with the naive
 * rotation of `layout` (llama2.c's or Hugging Face's), unless layout < 0. */
struct lowrank {
    int q, g, layout;
    double theta;
};

static void fill_lowrank(void *ctx, gsl_rng *g, int layer, int kind, int n_kv, int T, int d,
                         float *x)
{
    const struct lowrank *lr = ctx;
    (void)layer;
    int dim = lr->g * d;
    double *b = malloc(sizeof(double) * (size_t)lr->q * dim), *mu = malloc(sizeof(double) * dim);
    double *v = malloc(sizeof(double) * dim);
    ck_assert(b && mu && v);
    for (int gi = 0; gi < n_kv / lr->g; gi++) {
        for (int i = 0; i < lr->q * dim; i++)
            b[i] = gsl_ran_gaussian(g, 1);
        for (int c = 0; c < dim; c++)
            mu[c] = 2 + gsl_ran_gaussian(g, 1);
        for (int t = 0; t < T; t++) {
            memcpy(v, mu, sizeof(double) * dim);
            for (int j = 0; j < lr->q; j++) {
                double a = gsl_ran_gaussian(g, 1);
                for (int c = 0; c < dim; c++)
                    v[c] += a * b[(size_t)j * dim + c];
            }
            for (int h = 0; h < lr->g; h++) {
                double *row = v + (size_t)h * d;
                if (kind == FK_KIND_K && lr->layout == FK_ROPE_INTERLEAVED)
                    naive_llama2c(row, d, lr->theta, t);
                if (kind == FK_KIND_K && lr->layout == FK_ROPE_HALF) {
                    double freq[64];
                    for (int i = 0; i < d / 2; i++)
                        freq[i] = pow(lr->theta, -(2.0 * i) / d);
                    naive_hf(row, d, freq, t);
                }
                for (int c = 0; c < d; c++)
                    x[((size_t)(gi * lr->g + h) * T + t) * d + c] = (float)row[c];
            }
        }
    }
    free(b);
    free(mu);
    free(v);
}

struct pca_run {
    double max_err, mean_err;    /* relative errors of the rows, recomputed here */
    struct fk_stream_stats st;
    int rc;                      /* open / encode result */
};

/* pca with options "name=value" (NULL-terminated) on one (layer, kind) of a trace: one event
 * of every token (token, head), then every row reconstructed and compared with the trace. */
static struct pca_run run_pca(const char *trace, const char *basis, int layer, int kind,
                              const char *const *opts)
{
    const struct fk_codec_ops *ops = fk_codec_find("pca");
    ck_assert_ptr_nonnull(ops);
    void *o = calloc(1, ops->opts_size);
    fk_opts_defaults(ops, o);
    for (int i = 0; opts[i]; i++) {
        char name[64];
        const char *eq = strchr(opts[i], '=');
        snprintf(name, sizeof name, "%.*s", (int)(eq - opts[i]), opts[i]);
        const struct fk_option *op = fk_codec_option(ops, name);
        ck_assert_ptr_nonnull(op);
        if (op->type == FK_OPT_ENUM)
            ck_assert_int_eq(fk_opts_set_enum(ops, o, op, eq + 1), FK_OK);
        else
            ck_assert_int_eq(fk_opts_set(ops, o, op, atof(eq + 1)), FK_OK);
    }
    struct fk_trace *t;
    struct fk_basis_file *b;
    ck_assert_int_eq(fk_trace_open(trace, &t), FK_OK);
    ck_assert_msg(fk_basis_load(basis, &b) == FK_OK, "%s", fk_errmsg());
    const struct fk_trace_info *in = fk_trace_get_info(t);
    int H = in->n_kv_heads, T = in->n_tokens, d = in->head_dim;
    float *kv = malloc(sizeof(float) * (size_t)H * T * d), *x = malloc(sizeof(float) * (size_t)H * T * d);
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)H * T), *hd = malloc(sizeof(int32_t) * (size_t)H * T);
    struct fk_vec_out *out = calloc((size_t)H * T, sizeof *out);
    float xh[512];
    ck_assert(kv && x && tok && hd && out);
    ck_assert_int_eq(fk_trace_read(t, layer, (enum fk_kind)kind, kv), FK_OK);
    for (int i = 0; i < H * T; i++) {
        tok[i] = i / H;
        hd[i] = i % H;
        memcpy(x + (size_t)i * d, kv + ((size_t)hd[i] * T + tok[i]) * d, sizeof(float) * d);
    }
    struct fk_stream_env env = {.layer = layer, .kind = kind, .head_dim = d, .n_heads = H,
                                .n_tokens = T, .basis = fk_basis_get(b, layer, kind),
                                .positions = fk_trace_positions(t),
                                .rope = in->has_rope ? &in->rope : NULL};
    struct pca_run r = {0};
    void *st = NULL;
    r.rc = ops->check(o, d, b->sh.n_comp);
    if (r.rc == FK_OK)
        r.rc = ops->open(o, &env, &st);
    struct fk_event ev = {.phase = 0, .step = -1, .n = H * T, .x = x, .token = tok, .head = hd};
    if (r.rc == FK_OK)
        r.rc = ops->encode(st, &ev, out);
    for (int i = 0; r.rc == FK_OK && i < H * T; i++) {
        ck_assert_int_eq(ops->reconstruct(st, hd[i], tok[i], xh), FK_OK);
        double e = 0, n = 0;
        for (int c = 0; c < d; c++) {
            double dd = (double)x[(size_t)i * d + c] - xh[c];
            e += dd * dd;
            n += (double)x[(size_t)i * d + c] * x[(size_t)i * d + c];
        }
        double err = sqrt(e / n);
        ck_assert_msg(fabs(err - out[i].err) <= 1e-5, "row %d: reported %g, recomputed %g", i,
                      out[i].err, err);
        r.max_err = err > r.max_err ? err : r.max_err;
        r.mean_err += err / (H * T);
    }
    if (st)
        ops->stats(st, &r.st);
    ops->close(st);
    fk_basis_free(&b);
    fk_trace_close(&t);
    free(kv), free(x), free(tok), free(hd), free(out), free(o);
    return r;
}

/* Full rank (rank = g x head_dim) with fp32 coefficients gives x back up to float32
 * rounding: x_hat = mu + U U^T (x - mu) with U orthonormal to ~1e-7 (float32 rows of a
 * double eigensolve) and two float32 products of g d terms each, so a relative error of a
 * few 1e-7 * sqrt(g d); the tolerance 1e-5 leaves a margin of 10 over that bound and is far
 * below anything a dropped component gives (about 1/sqrt(g d) = 0.35 for d 8). */
START_TEST(pca_full_rank_exact)
{
    char tr[128], bp[128];
    pth(tr, sizeof tr, "t.h5");
    pth(bp, sizeof bp, "b.h5");
    write_trace(tr, NULL, 4, 8, 40, 5);
    for (int g = 1; g <= 4; g *= 2) {
        ck_assert_int_eq(train(bp, (char *[]){tr}, 1, g, 0), FK_OK);
        char rank[32];
        snprintf(rank, sizeof rank, "rank=%d", 8 * g);
        for (int kind = 0; kind < 2; kind++)
            for (int center = 0; center < 2; center++) {
                const char *opts[] = {rank, center ? "center=1" : "center=0", "coef=fp32",
                                      NULL};
                struct pca_run r = run_pca(tr, bp, 1, kind, opts);
                ck_assert_msg(r.rc == FK_OK, "%s", fk_errmsg());
                ck_assert_msg(r.max_err <= 1e-5, "g %d kind %d center %d: max rel err %g", g,
                              kind, center, r.max_err);
            }
        /* one component fewer loses something: the check above can fail */
        snprintf(rank, sizeof rank, "rank=%d", 8 * g - 1);
        struct pca_run r = run_pca(tr, bp, 1, 1, (const char *[]){rank, "coef=fp32", NULL});
        ck_assert_msg(r.max_err > 1e-3, "g %d: rank %d max rel err %g", g, 8 * g - 1, r.max_err);
    }
}
END_TEST

/* Data of affine rank 3: centered PCA at rank 3 and uncentered at rank 4 (the mean is one
 * more direction) reconstruct them to float32 rounding (tolerance as above); uncentered at
 * rank 3 cannot. */
START_TEST(pca_low_rank_data_exact)
{
    char tr[128], bp[128];
    pth(tr, sizeof tr, "t.h5");
    pth(bp, sizeof bp, "b.h5");
    for (int g = 1; g <= 2; g++) {
        struct lowrank lr = {.q = 3, .g = g, .layout = -1};
        write_trace_fill(tr, NULL, 4, 16, 60, 7 + g, fill_lowrank, &lr);
        ck_assert_int_eq(train(bp, (char *[]){tr}, 1, g, 0), FK_OK);
        for (int kind = 0; kind < 2; kind++) {
            struct pca_run c3 = run_pca(tr, bp, 0, kind,
                                        (const char *[]){"rank=3", "coef=fp32", NULL});
            struct pca_run u4 = run_pca(tr, bp, 0, kind, (const char *[]){"rank=4", "center=0",
                                                                          "coef=fp32", NULL});
            struct pca_run u3 = run_pca(tr, bp, 0, kind, (const char *[]){"rank=3", "center=0",
                                                                          "coef=fp32", NULL});
            ck_assert_msg(c3.max_err <= 1e-5, "g %d kind %d centered rank 3: %g", g, kind,
                          c3.max_err);
            ck_assert_msg(u4.max_err <= 1e-5, "g %d kind %d uncentered rank 4: %g", g, kind,
                          u4.max_err);
            ck_assert_msg(u3.max_err > 1e-3, "g %d kind %d uncentered rank 3: %g", g, kind,
                          u3.max_err);
        }
    }
}
END_TEST

/* Keys of affine rank 2 before RoPE, rotated by the tests' naive rotations (llama2.c's
 * interleaved pairs, Hugging Face's rotate_half) with the trace saying which: pre_rope = 1
 * un-rotates with the trace's attributes and reconstructs them at rank 2 to float32 rounding
 * (the un-rotation and re-rotation in double add ~1e-15); the same rank on post-RoPE keys
 * does not. A layout read the wrong way round would not be low rank either. */
START_TEST(pca_pre_rope_round_trip)
{
    char tr[128], bp[128];
    pth(tr, sizeof tr, "t.h5");
    pth(bp, sizeof bp, "b.h5");
    for (int layout = 0; layout < 2; layout++) {
        struct lowrank lr = {.q = 2, .g = 1, .layout = layout, .theta = 10000};
        struct fk_rope rope = {.theta = 10000, .layout = layout};
        write_trace_fill(tr, &rope, 2, 16, 80, 30 + layout, fill_lowrank, &lr);
        ck_assert_int_eq(train(bp, (char *[]){tr}, 1, 1, 0), FK_OK);
        struct pca_run pre = run_pca(tr, bp, 1, FK_KIND_K,
                                     (const char *[]){"rank=2", "pre_rope=1", "coef=fp32", NULL});
        struct pca_run post = run_pca(tr, bp, 1, FK_KIND_K,
                                      (const char *[]){"rank=2", "coef=fp32", NULL});
        ck_assert_msg(pre.rc == FK_OK, "%s", fk_errmsg());
        ck_assert_msg(pre.max_err <= 1e-5, "layout %d: pre-RoPE rank 2 max rel err %g", layout,
                      pre.max_err);
        ck_assert_msg(post.mean_err > 1e-2, "layout %d: post-RoPE rank 2 mean rel err %g",
                      layout, post.mean_err);
        /* values never carry RoPE: pre_rope leaves them alone */
        struct pca_run v = run_pca(tr, bp, 1, FK_KIND_V,
                                   (const char *[]){"rank=2", "pre_rope=1", "coef=fp32", NULL});
        ck_assert_msg(v.max_err <= 1e-5, "layout %d: values %g", layout, v.max_err);
    }
    /* the same keys stamped with the other layout: un-rotating the wrong pairs breaks them */
    set_attr_str(tr, "rope_layout", "interleaved");
    ck_assert_int_eq(train(bp, (char *[]){tr}, 1, 1, 0), FK_OK);
    struct pca_run wrong = run_pca(tr, bp, 1, FK_KIND_K,
                                   (const char *[]){"rank=2", "pre_rope=1", "coef=fp32", NULL});
    ck_assert_msg(wrong.mean_err > 1e-2, "wrong layout: mean rel err %g", wrong.mean_err);
}
END_TEST

/* A Gaussian trace t.h5 (2 layers, n_kv heads of head_dim d, T tokens) and its basis b.h5
 * of groups of g heads, in the test's directory. */
static void trace_and_basis(char tr[128], char bp[128], int n_kv, int d, int T,
                            unsigned long seed, int g)
{
    pth(tr, 128, "t.h5");
    pth(bp, 128, "b.h5");
    write_trace(tr, NULL, n_kv, d, T, seed);
    ck_assert_int_eq(train(bp, (char *[]){tr}, 1, g, 0), FK_OK);
}

/* Bytes per stored token-group and the model constants, for every coefficient format. */
START_TEST(pca_bytes)
{
    char tr[128], bp[128];
    trace_and_basis(tr, bp, 4, 8, 30, 9, 2); /* 2 groups of dim 16 */
    const struct {
        const char *coef, *bits;
        double per_group;
    } cases[] = {{"coef=fp32", "coef_bits=8", 4 * 5}, {"coef=fp16", "coef_bits=8", 2 * 5},
                 {"coef=fp8", "coef_bits=8", 5}, {"coef=quant", "coef_bits=8", 5 + 4},
                 {"coef=quant", "coef_bits=3", 2 + 4}}; /* ceil(5 * 3 / 8) = 2 */
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int center = 0; center < 2; center++) {
            struct pca_run r = run_pca(tr, bp, 0, 0, (const char *[]){"rank=5", cases[i].coef,
                                       cases[i].bits, center ? "center=1" : "center=0", NULL});
            ck_assert_int_eq(r.rc, FK_OK);
            ck_assert_msg(r.st.bytes_codes == 30 * 2 * cases[i].per_group, "%s %s: %g bytes",
                          cases[i].coef, cases[i].bits, r.st.bytes_codes);
            ck_assert(r.st.bytes_model == 2 * (16 * 5 * 2 + (center ? 16 * 2 : 0)));
            ck_assert(isfinite(r.max_err) && r.max_err > 0); /* lossy, finite */
        }
    /* coarser coefficients lose more */
    struct pca_run q8 = run_pca(tr, bp, 0, 0, (const char *[]){"rank=16", "coef=quant", NULL});
    struct pca_run q2 = run_pca(tr, bp, 0, 0,
                                (const char *[]){"rank=16", "coef=quant", "coef_bits=2", NULL});
    struct pca_run f32 = run_pca(tr, bp, 0, 0, (const char *[]){"rank=16", "coef=fp32", NULL});
    ck_assert(f32.max_err < 1e-5 && q8.mean_err > f32.mean_err && q2.mean_err > q8.mean_err);
}
END_TEST

/* With g > 1 the heads of a group must come together and in order. */
START_TEST(pca_group_order)
{
    char tr[128], bp[128];
    trace_and_basis(tr, bp, 4, 8, 12, 3, 2);
    struct fk_basis_file *b;
    ck_assert_int_eq(fk_basis_load(bp, &b), FK_OK);
    const struct fk_codec_ops *ops = fk_codec_find("pca");
    void *o = calloc(1, ops->opts_size);
    fk_opts_defaults(ops, o);
    ck_assert_int_eq(fk_opts_set(ops, o, fk_codec_option(ops, "rank"), 4), FK_OK);
    struct fk_stream_env env = {.head_dim = 8, .n_heads = 4, .n_tokens = 12,
                                .basis = fk_basis_get(b, 0, 1)};
    void *st = NULL;
    ck_assert_int_eq(ops->open(o, &env, &st), FK_OK);
    float x[4 * 8];
    for (int i = 0; i < 32; i++)
        x[i] = (float)i;
    struct fk_vec_out out[4];
    /* heads 1, 0 of group 0: refused, nothing stored */
    struct fk_event bad = {.n = 2, .x = x, .token = (int32_t[]){0, 0}, .head = (int32_t[]){1, 0}};
    fk_err_clear();
    ck_assert_int_lt(ops->encode(st, &bad, out), 0);
    ck_assert_msg(strstr(fk_errmsg(), "together"), "%s", fk_errmsg());
    /* half a group: refused */
    struct fk_event half = {.n = 1, .x = x, .token = (int32_t[]){0}, .head = (int32_t[]){0}};
    ck_assert_int_lt(ops->encode(st, &half, out), 0);
    ck_assert_msg(strstr(fk_errmsg(), "whole groups"), "%s", fk_errmsg());
    /* group 1 alone, then group 0: accepted (each head's tokens in order) */
    struct fk_event g1 = {.n = 2, .x = x, .token = (int32_t[]){0, 0}, .head = (int32_t[]){2, 3}};
    struct fk_event g0 = {.n = 2, .x = x, .token = (int32_t[]){0, 0}, .head = (int32_t[]){0, 1}};
    ck_assert_int_eq(ops->encode(st, &g1, out), FK_OK);
    ck_assert_int_eq(ops->encode(st, &g0, out), FK_OK);
    ck_assert_int_eq(out[0].nnz + out[1].nnz, 4); /* the group's rank, shared out */
    ops->close(st);
    free(o);
    fk_basis_free(&b);
}
END_TEST

/* ---- refusals before any cell ------------------------------------------------------------ */

/* A sweep of one pca cell on one dataset; runs it and returns the runner's result (the
 * message in fk_errmsg()). `extra`: more [[codec]] keys; basis NULL: no basis key. */
static int run_sweep(const char *trace, const char *basis, const char *extra, char *out_dir,
                     size_t cap)
{
    char toml[160];
    pth(toml, sizeof toml, "sweep.toml");
    snprintf(out_dir, cap, "%s/results", g_dir);
    FILE *f = fopen(toml, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "[sweep]\nname = \"pca\"\noutput = \"%s\"\njobs = 1\nattention = false\n"
               "[[dataset]]\nname = \"tiny\"\ntraces = [\"%s\"]\n", out_dir, trace);
    if (basis)
        fprintf(f, "basis = \"%s\"\n", basis);
    fprintf(f, "[[codec]]\nname = \"full\"\n[[codec]]\nname = \"pca\"\n%s\n", extra);
    fclose(f);
    struct fk_sweep *s = NULL;
    ck_assert_msg(fk_sweep_load(toml, NULL, 0, 1, &s) == FK_OK, "%s", fk_errmsg());
    struct fk_runner_opts ro = {.shard_n = 1};
    struct fk_runner_summary sum;
    int rc = fk_runner_run(s, &ro, &sum);
    ck_assert_int_eq(sum.done + sum.failed, 0); /* no cell ran, not even "full" */
    fk_sweep_free(&s);
    return rc;
}

static void assert_refused(int rc, const char *out_dir, const char *const *want)
{
    ck_assert_int_lt(rc, 0);
    for (int i = 0; want[i]; i++)
        ck_assert_msg(strstr(fk_errmsg(), want[i]), "message '%s' lacks '%s'", fk_errmsg(),
                      want[i]);
    ck_assert_msg(access(out_dir, F_OK) != 0, "%s exists: the run touched it", out_dir);
}

START_TEST(pca_refused_before_any_cell)
{
    char tr[128], bp[128], out[160];
    trace_and_basis(tr, bp, 2, 8, 20, 4, 1); /* no RoPE attributes */
    /* the default rank 32 exceeds the basis's 8 components (group 1 x head_dim 8) */
    assert_refused(run_sweep(tr, bp, "", out, sizeof out), out,
                   (const char *[]){"dataset 'tiny'", "pca", "rank = 32", "8 components", bp,
                                    NULL});
    /* no basis */
    assert_refused(run_sweep(tr, NULL, "rank = 4", out, sizeof out), out,
                   (const char *[]){"dataset 'tiny'", "codec pca", "needs a basis", NULL});
    /* pre_rope on a trace without RoPE attributes */
    assert_refused(run_sweep(tr, bp, "rank = 4\npre_rope = true", out, sizeof out), out,
                   (const char *[]){"dataset 'tiny'", "pca", tr, "rope_layout", NULL});
    /* a basis of another model's shape */
    char other[128], bo[128];
    pth(other, sizeof other, "other.h5");
    pth(bo, sizeof bo, "bo.h5");
    write_trace(other, NULL, 4, 8, 20, 5);
    ck_assert_int_eq(train(bo, (char *[]){other}, 1, 1, 0), FK_OK);
    assert_refused(run_sweep(tr, bo, "rank = 4", out, sizeof out), out,
                   (const char *[]){"dataset 'tiny'", bo, "4 KV heads", tr, NULL});
    /* pre_rope with a trace that has them but a basis trained without */
    char rt[128];
    pth(rt, sizeof rt, "rope.h5");
    struct fk_rope rope = {.theta = 10000, .layout = FK_ROPE_INTERLEAVED};
    write_trace(rt, &rope, 2, 8, 20, 4);
    assert_refused(run_sweep(rt, bp, "rank = 4\npre_rope = true", out, sizeof out), out,
                   (const char *[]){"dataset 'tiny'", bp, "no pre-RoPE keys", NULL});
    /* and when everything fits, the cells run */
    char bq[128], toml_out[160];
    pth(bq, sizeof bq, "bq.h5");
    ck_assert_int_eq(train(bq, (char *[]){rt}, 1, 1, 0), FK_OK);
    char toml[160];
    pth(toml, sizeof toml, "ok.toml");
    snprintf(toml_out, sizeof toml_out, "%s/ok", g_dir);
    FILE *f = fopen(toml, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "[sweep]\nname = \"ok\"\noutput = \"%s\"\nattention = false\n[[dataset]]\n"
               "name = \"tiny\"\ntraces = [\"%s\"]\nbasis = \"%s\"\n[[codec]]\nname = \"pca\"\n"
               "grid = { rank = [2, 8], pre_rope = [false, true] }\n", toml_out, rt, bq);
    fclose(f);
    struct fk_sweep *s = NULL;
    ck_assert_int_eq(fk_sweep_load(toml, NULL, 0, 1, &s), FK_OK);
    struct fk_runner_opts ro = {.shard_n = 1};
    struct fk_runner_summary sum;
    ck_assert_msg(fk_runner_run(s, &ro, &sum) == FK_OK, "%s", fk_errmsg());
    ck_assert_int_eq(sum.done, 4);
    ck_assert_int_eq(sum.failed, 0);
    fk_sweep_free(&s);
    char csv[200];
    snprintf(csv, sizeof csv, "%s/cells.csv", toml_out);
    FILE *c = fopen(csv, "r");
    ck_assert_ptr_nonnull(c);
    char line[8192];
    ck_assert_ptr_nonnull(fgets(line, sizeof line, c));
    ck_assert_ptr_nonnull(strstr(line, ",basis,"));
    ck_assert_ptr_nonnull(fgets(line, sizeof line, c));
    ck_assert_msg(strstr(line, bq), "cells.csv row '%.200s' lacks the basis path", line);
    fclose(c);
}
END_TEST

/* ---- the suite ---------------------------------------------------------------------------- */

/* A test case with the temporary directory fixture. */
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
    Suite *s = suite_create("pca");
    TCase *tc = tcase("rope");
    tcase_add_test(tc, rope_matches_naive_and_inverts);
    tcase_add_test(tc, rope_llama3_frequencies);
    tcase_add_test(tc, trace_rope_attributes);
    suite_add_tcase(s, tc);
    tc = tcase("basis");
    tcase_add_test(tc, basis_matches_svd);
    tcase_add_test(tc, basis_file_refusals);
    suite_add_tcase(s, tc);
    tc = tcase("codec");
    tcase_add_test(tc, pca_full_rank_exact);
    tcase_add_test(tc, pca_low_rank_data_exact);
    tcase_add_test(tc, pca_pre_rope_round_trip);
    tcase_add_test(tc, pca_bytes);
    tcase_add_test(tc, pca_group_order);
    tcase_add_test(tc, pca_refused_before_any_cell);
    suite_add_tcase(s, tc);
    return fk_suite_run(s);
}
