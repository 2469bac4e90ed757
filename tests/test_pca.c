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

/* A small trace (2 layers, 2 KV heads, d 8, 12 tokens of which 4 prefill) with random data;
 * rope = NULL writes no RoPE attributes. */
static void write_trace(const char *path, const struct fk_rope *rope, int n_kv, int d, int T,
                        unsigned long seed)
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
            for (long i = 0; i < (long)n_kv * T * d; i++)
                x[i] = (float)gsl_ran_gaussian(g, 1);
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

/* ---- the suite ---------------------------------------------------------------------------- */

int main(void)
{
    gsl_set_error_handler_off();
    Suite *s = suite_create("pca");
    TCase *tc = tcase_create("rope");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, rope_matches_naive_and_inverts);
    tcase_add_test(tc, rope_llama3_frequencies);
    tcase_add_test(tc, trace_rope_attributes);
    suite_add_tcase(s, tc);
    tc = tcase_create("basis");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, basis_matches_svd);
    tcase_add_test(tc, basis_file_refusals);
    suite_add_tcase(s, tc);
    return fk_suite_run(s);
}
