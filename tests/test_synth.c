/* SPDX-License-Identifier: MIT
 * Tests of the synthetic trace generator (datasets/gen/fk_synth.h). Each structural property is
 * measured with an independent computation (GSL eigendecomposition for PCA and effective
 * rank, a brute-force softmax for attention, an independent RoPE rotation) and, where it
 * makes the test able to fail, against a control run with the mechanism switched off.
 * Sizes are small: 2 layers, 4 query heads, 2 KV heads, d = 32, 64 + 64 tokens.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <gsl/gsl_eigen.h>
#include <gsl/gsl_matrix.h>
#include <gsl/gsl_vector.h>

#include "fk_check_main.h"
#include "common/fk_err.h"
#include "cli/fk_cli.h"
#include "gen/fk_synth.h"
#include "formats/fk_trace.h"

struct layer {
    float *k, *v, *q;        /* [Hkv][T][d], [Hkv][T][d], [Hq][Tq][d] */
    int32_t *qidx;           /* [Tq] */
    int T, Tq, d, hkv, hq;   /* shape */
};

static void small_opts(struct fk_synth_opts *o)
{
    fk_synth_defaults(o);
    o->n_layers = 2;
    o->n_q_heads = 4;
    o->n_kv_heads = 2;
    o->head_dim = 32;
    o->prefill = 64;
    o->decode = 64;
    o->key_rank = 6;
    o->value_rank = 16;
    o->encoding = FK_ENC_F32;
}

static void gen(const struct fk_synth_opts *o, int seq, int layer, struct layer *x)
{
    x->T = o->prefill + o->decode;
    x->Tq = fk_synth_n_queries(o);
    x->d = o->head_dim;
    x->hkv = o->n_kv_heads;
    x->hq = o->n_q_heads;
    size_t nkv = (size_t)x->hkv * x->T * x->d;
    x->k = malloc(sizeof(float) * nkv);
    x->v = malloc(sizeof(float) * nkv);
    x->q = malloc(sizeof(float) * ((size_t)x->hq * x->Tq * x->d + 1));
    x->qidx = malloc(sizeof(int32_t) * ((size_t)x->Tq + 1));
    ck_assert(x->k && x->v && x->q && x->qidx);
    ck_assert_msg(fk_synth_layer(o, seq, layer, x->k, x->v, x->q, x->qidx) == FK_OK, "%s",
                  fk_errmsg());
}

static void drop(struct layer *x)
{
    free(x->k);
    free(x->v);
    free(x->q);
    free(x->qidx);
}

static const float *row(const float *a, int T, int d, int h, int t)
{
    return a + ((size_t)h * T + t) * d;
}

/* Eigenvalues (descending) and eigenvectors (columns) of the covariance of rows
 * [t0, t1) of head h, centred on their own mean (mean returned in mu when not NULL). */
static void pca(const float *a, int T, int d, int h, int t0, int t1, double *eval,
                gsl_matrix *evec, double *mu)
{
    int n = t1 - t0;
    double *m = calloc((size_t)d, sizeof(double));
    gsl_matrix *c = gsl_matrix_calloc((size_t)d, (size_t)d);
    gsl_vector *ev = gsl_vector_alloc((size_t)d);
    gsl_eigen_symmv_workspace *w = gsl_eigen_symmv_alloc((size_t)d);
    for (int t = t0; t < t1; t++)
        for (int i = 0; i < d; i++)
            m[i] += row(a, T, d, h, t)[i] / n;
    for (int t = t0; t < t1; t++) {
        const float *x = row(a, T, d, h, t);
        for (int i = 0; i < d; i++)
            for (int j = 0; j < d; j++)
                *gsl_matrix_ptr(c, (size_t)i, (size_t)j) += (x[i] - m[i]) * (x[j] - m[j]) / n;
    }
    gsl_eigen_symmv(c, ev, evec, w);
    gsl_eigen_symmv_sort(ev, evec, GSL_EIGEN_SORT_VAL_DESC);
    for (int i = 0; i < d; i++)
        eval[i] = gsl_vector_get(ev, (size_t)i);
    if (mu)
        memcpy(mu, m, sizeof(double) * (size_t)d);
    free(m);
    gsl_matrix_free(c);
    gsl_vector_free(ev);
    gsl_eigen_symmv_free(w);
}

static double participation_ratio(const double *ev, int d)
{
    double s = 0, s2 = 0;
    for (int i = 0; i < d; i++) {
        double l = ev[i] > 0 ? ev[i] : 0;
        s += l;
        s2 += l * l;
    }
    return s * s / s2;
}

/* Mean fraction of energy of (x - mu), rows [t0, t1), outside the top-k eigenvectors. */
static double residual(const float *a, int T, int d, int h, int t0, int t1, const double *mu,
                       const gsl_matrix *evec, int k)
{
    double acc = 0;
    for (int t = t0; t < t1; t++) {
        const float *x = row(a, T, d, h, t);
        double e = 0, p = 0;
        for (int i = 0; i < d; i++)
            e += (x[i] - mu[i]) * (x[i] - mu[i]);
        for (int j = 0; j < k; j++) {
            double c = 0;
            for (int i = 0; i < d; i++)
                c += (x[i] - mu[i]) * gsl_matrix_get(evec, (size_t)i, (size_t)j);
            p += c * c;
        }
        acc += 1 - p / e;
    }
    return acc / (t1 - t0);
}

/* Softmax of query row qr of head h over visible tokens 0..qidx (brute force). */
static void attention(const struct layer *x, int h, int qr, double *p)
{
    int g = h / (x->hq / x->hkv), tq = x->qidx[qr];
    const float *q = row(x->q, x->Tq, x->d, h, qr);
    double m = -INFINITY, s = 0;
    for (int i = 0; i <= tq; i++) {
        const float *k = row(x->k, x->T, x->d, g, i);
        double z = 0;
        for (int c = 0; c < x->d; c++)
            z += (double)q[c] * k[c];
        p[i] = z / sqrt((double)x->d);
        if (p[i] > m)
            m = p[i];
    }
    for (int i = 0; i <= tq; i++) {
        p[i] = exp(p[i] - m);
        s += p[i];
    }
    for (int i = 0; i <= tq; i++)
        p[i] /= s;
}

START_TEST(test_outlier_channels)
{
    struct fk_synth_opts o;
    small_opts(&o);
    for (int pass = 0; pass < 2; pass++) {
        o.key_outlier_pairs = pass ? 0 : 2;
        for (int l = 0; l < o.n_layers; l++) {
            struct layer x;
            gen(&o, 0, l, &x);
            for (int h = 0; h < x.hkv; h++) {
                double rms[64] = {0}, sorted[64] = {0};
                for (int c = 0; c < x.d; c++) {
                    double s = 0;
                    for (int t = 1; t < x.T; t++)
                        s += (double)row(x.k, x.T, x.d, h, t)[c] * row(x.k, x.T, x.d, h, t)[c];
                    rms[c] = sorted[c] = sqrt(s / (x.T - 1));
                }
                for (int i = 1; i < x.d; i++) /* insertion sort */
                    for (int j = i; j > 0 && sorted[j] < sorted[j - 1]; j--) {
                        double t = sorted[j];
                        sorted[j] = sorted[j - 1];
                        sorted[j - 1] = t;
                    }
                double med = 0.5 * (sorted[x.d / 2 - 1] + sorted[x.d / 2]);
                int big = 0;
                for (int c = 0; c < x.d; c++)
                    big += rms[c] > 4 * med;
                if (pass == 0)
                    ck_assert_msg(big >= 2 && big <= 4 && sorted[x.d - 1] > 5 * med,
                                  "layer %d head %d: %d channels > 4x median rms, top %.2f x",
                                  l, h, big, sorted[x.d - 1] / med);
                else
                    ck_assert_msg(big == 0, "no outliers asked, yet %d channels > 4x median",
                                  big);
            }
            drop(&x);
        }
    }
}
END_TEST

START_TEST(test_rope_pair_norms)
{
    struct fk_synth_opts o;
    small_opts(&o);
    for (int half = 0; half < 2; half++) {
        o.rope_half = half;
        struct layer a, b;
        o.rope = 1;
        gen(&o, 0, 1, &a);
        o.rope = 0;
        gen(&o, 0, 1, &b);
        int d = a.d, moved = 0;
        double worst = 0;
        for (int h = 0; h < a.hkv; h++)
            for (int t = 0; t < a.T; t++) {
                const float *x = row(a.k, a.T, d, h, t), *y = row(b.k, b.T, d, h, t);
                for (int i = 0; i < d / 2; i++) {
                    int c0 = half ? i : 2 * i, c1 = half ? i + d / 2 : 2 * i + 1;
                    double nx = hypot(x[c0], x[c1]), ny = hypot(y[c0], y[c1]);
                    double err = fabs(nx - ny) / (1 + ny);
                    worst = err > worst ? err : worst;
                    /* independent rotation: angle t * theta^(-2i/d) */
                    double ang = t * pow(o.rope_theta, -2.0 * i / d);
                    double r0 = y[c0] * cos(ang) - y[c1] * sin(ang);
                    double r1 = y[c0] * sin(ang) + y[c1] * cos(ang);
                    ck_assert_msg(fabs(r0 - x[c0]) <= 1e-4 * (1 + ny) &&
                                      fabs(r1 - x[c1]) <= 1e-4 * (1 + ny),
                                  "head %d token %d pair %d: not the RoPE rotation", h, t, i);
                    moved += fabs(x[c0] - y[c0]) > 1e-3 * (1 + ny);
                }
            }
        ck_assert_msg(worst <= 1e-4, "pair norm changed by RoPE: rel %.3g", worst);
        ck_assert_msg(moved > a.hkv * a.T, "RoPE on and off give nearly the same keys (%d)",
                      moved);
        ck_assert(!memcmp(a.v, b.v, sizeof(float) * (size_t)a.hkv * a.T * d));
        drop(&a);
        drop(&b);
    }
}
END_TEST

/* Late-decode minus early-decode residual energy of keys outside the top-k PCA subspace
 * of the prefill keys, averaged over layers and heads. */
static double drift_gap(const struct fk_synth_opts *o, enum fk_kind kind, double *early,
                        double *late)
{
    double gap = 0, e_acc = 0, l_acc = 0;
    int n = 0;
    for (int l = 0; l < o->n_layers; l++) {
        struct layer x;
        gen(o, 0, l, &x);
        const float *a = kind == FK_KIND_K ? x.k : x.v;
        int k = kind == FK_KIND_K ? o->key_rank : o->value_rank;
        for (int h = 0; h < x.hkv; h++) {
            double ev[64], mu[64];
            gsl_matrix *vec = gsl_matrix_alloc((size_t)x.d, (size_t)x.d);
            pca(a, x.T, x.d, h, 1, o->prefill, ev, vec, mu);
            double e = residual(a, x.T, x.d, h, o->prefill, o->prefill + 16, mu, vec, k);
            double f = residual(a, x.T, x.d, h, x.T - 16, x.T, mu, vec, k);
            gap += f - e;
            e_acc += e;
            l_acc += f;
            n++;
            gsl_matrix_free(vec);
        }
        drop(&x);
    }
    *early = e_acc / n;
    *late = l_acc / n;
    return gap / n;
}

START_TEST(test_decode_drift)
{
    struct fk_synth_opts o;
    small_opts(&o);
    o.drift_rate = 0.015;
    for (int kind = FK_KIND_K; kind <= FK_KIND_V; kind++) {
        double e1, l1, e0, l0;
        o.drift_rate = 0.015;
        double g1 = drift_gap(&o, (enum fk_kind)kind, &e1, &l1);
        o.drift_rate = 0;
        double g0 = drift_gap(&o, (enum fk_kind)kind, &e0, &l0);
        printf("drift %s: residual early %.3f late %.3f (no drift: %.3f %.3f)\n",
               kind ? "V" : "K", e1, l1, e0, l0);
        ck_assert_msg(g1 > 0.1 && g1 > g0 + 0.08,
                      "%s: late - early decode residual %.3f (no drift %.3f)", kind ? "V" : "K",
                      g1, g0);
    }
}
END_TEST

START_TEST(test_sink)
{
    struct fk_synth_opts o;
    small_opts(&o);
    for (int l = 0; l < o.n_layers; l++) {
        struct layer x;
        gen(&o, 0, l, &x);
        for (int h = 0; h < x.hkv; h++) {
            double n0 = 0, nmax = 0, v0 = 0, vmed = 0;
            for (int t = 0; t < x.T; t++) {
                double s = 0, sv = 0;
                for (int c = 0; c < x.d; c++) {
                    s += (double)row(x.k, x.T, x.d, h, t)[c] * row(x.k, x.T, x.d, h, t)[c];
                    sv += (double)row(x.v, x.T, x.d, h, t)[c] * row(x.v, x.T, x.d, h, t)[c];
                }
                if (t == 0) {
                    n0 = s;
                    v0 = sv;
                } else {
                    nmax = s > nmax ? s : nmax;
                    vmed += sv / (x.T - 1);
                }
            }
            ck_assert_msg(n0 > nmax, "layer %d head %d: sink key norm %.2f <= max other %.2f",
                          l, h, sqrt(n0), sqrt(nmax));
            ck_assert_msg(v0 < 0.1 * vmed, "sink value energy %.3f not small (mean %.3f)", v0,
                          vmed);
        }
        double *p = malloc(sizeof(double) * (size_t)x.T);
        double *mass = malloc(sizeof(double) * (size_t)x.T);
        for (int h = 0; h < x.hq; h++) {
            memset(mass, 0, sizeof(double) * (size_t)x.T);
            for (int r = 0; r < x.Tq; r++) {
                attention(&x, h, r, p);
                for (int i = 0; i <= x.qidx[r]; i++)
                    mass[i] += p[i] / x.Tq;
            }
            int best = 0;
            for (int i = 1; i < x.T; i++)
                best = mass[i] > mass[best] ? i : best;
            ck_assert_msg(best == 0 && mass[0] > 0.1 && mass[0] < 0.95,
                          "layer %d q head %d: token %d has the largest mean mass (sink %.3f)",
                          l, h, best, mass[0]);
        }
        free(p);
        free(mass);
        drop(&x);
    }
}
END_TEST

/* Mean entropy of the attention rows, and the mean of log(visible tokens). */
static void entropy(const struct fk_synth_opts *o, double *h_mean, double *logt)
{
    double hs = 0, ls = 0;
    int n = 0;
    for (int l = 0; l < o->n_layers; l++) {
        struct layer x;
        gen(o, 0, l, &x);
        double *p = malloc(sizeof(double) * (size_t)x.T);
        for (int h = 0; h < x.hq; h++)
            for (int r = 0; r < x.Tq; r++) {
                attention(&x, h, r, p);
                double e = 0;
                for (int i = 0; i <= x.qidx[r]; i++)
                    e -= p[i] > 0 ? p[i] * log(p[i]) : 0;
                hs += e;
                ls += log(x.qidx[r] + 1.0);
                n++;
            }
        free(p);
        drop(&x);
    }
    *h_mean = hs / n;
    *logt = ls / n;
}

START_TEST(test_attention_peaked)
{
    struct fk_synth_opts o;
    small_opts(&o);
    double h, lt, h0, lt0;
    entropy(&o, &h, &lt);
    o.attn_logit_std = 0.05; /* control: nearly flat logits, no sink */
    o.sink_mass = 0;
    entropy(&o, &h0, &lt0);
    printf("attention entropy %.3f nats, log T %.3f (flat control %.3f)\n", h, lt, h0);
    ck_assert_msg(h < 0.5 * lt, "mean entropy %.3f not well below log T %.3f", h, lt);
    ck_assert_msg(h0 > 0.95 * lt0, "control should be near uniform: %.3f vs %.3f", h0, lt0);
}
END_TEST

START_TEST(test_values_more_isotropic)
{
    struct fk_synth_opts o;
    small_opts(&o);
    double pk = 0, pv = 0;
    int n = 0;
    for (int l = 0; l < o.n_layers; l++) {
        struct layer x;
        gen(&o, 0, l, &x);
        gsl_matrix *vec = gsl_matrix_alloc((size_t)x.d, (size_t)x.d);
        for (int h = 0; h < x.hkv; h++) {
            double ev[64];
            pca(x.k, x.T, x.d, h, 1, x.T, ev, vec, NULL);
            double a = participation_ratio(ev, x.d);
            pca(x.v, x.T, x.d, h, 1, x.T, ev, vec, NULL);
            double b = participation_ratio(ev, x.d);
            ck_assert_msg(b > a, "layer %d head %d: PR values %.2f <= keys %.2f", l, h, b, a);
            pk += a;
            pv += b;
            n++;
        }
        gsl_matrix_free(vec);
        drop(&x);
    }
    printf("participation ratio: keys %.2f values %.2f (d = %d)\n", pk / n, pv / n,
           o.head_dim);
    ck_assert_msg(pv > 1.3 * pk, "values PR %.2f not clearly above keys %.2f", pv / n, pk / n);
}
END_TEST

/* Mean squared cosine between the top-k PCA subspaces of two heads: k/d at random, 1 same. */
static double overlap(const float *a, const float *b, int T, int d, int ha, int hb, int t1,
                      int k)
{
    double ev[64];
    gsl_matrix *u = gsl_matrix_alloc((size_t)d, (size_t)d);
    gsl_matrix *v = gsl_matrix_alloc((size_t)d, (size_t)d);
    pca(a, T, d, ha, 1, t1, ev, u, NULL);
    pca(b, T, d, hb, 1, t1, ev, v, NULL);
    double s = 0;
    for (int i = 0; i < k; i++)
        for (int j = 0; j < k; j++) {
            double c = 0;
            for (int r = 0; r < d; r++)
                c += gsl_matrix_get(u, (size_t)r, (size_t)i) * gsl_matrix_get(v, (size_t)r,
                                                                                (size_t)j);
            s += c * c;
        }
    gsl_matrix_free(u);
    gsl_matrix_free(v);
    return s / k;
}

START_TEST(test_heads_and_layers_differ)
{
    struct fk_synth_opts o;
    small_opts(&o);
    o.rope = 0; /* compare latent subspaces directly */
    o.key_outlier_pairs = 0;
    struct layer a, b, c;
    gen(&o, 0, 0, &a);
    gen(&o, 0, 1, &b);
    o.seed = 99; /* other content, same model */
    gen(&o, 0, 0, &c);
    int T = a.T, d = a.d, k = o.key_rank, P = o.prefill;
    double same = overlap(a.k, c.k, T, d, 0, 0, P, k);
    double layer = overlap(a.k, b.k, T, d, 0, 0, P, k);
    double head = overlap(a.k, a.k, T, d, 0, 1, P, k);
    double vlay = overlap(a.v, b.v, T, d, 0, 0, P, o.value_rank / 2);
    printf("key subspace overlap: same head other seed %.2f, other layer %.2f, other head "
           "%.2f (random %.2f)\n", same, layer, head, (double)k / d);
    ck_assert_msg(same > 0.7, "same (layer, head), other seed: overlap %.2f", same);
    ck_assert_msg(layer < 0.5 && head < 0.5, "layers/heads too alike: %.2f %.2f", layer, head);
    ck_assert_msg(vlay < 0.7, "value subspaces of two layers too alike: %.2f", vlay);
    drop(&a);
    drop(&b);
    drop(&c);
}
END_TEST

static char tmpdir[64];

static void mk_tmp(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/fk_synth_test_XXXXXX");
    ck_assert(mkdtemp(tmpdir) != NULL);
}

static void rm_tmp(const char *const *files, int n)
{
    char p[256];
    for (int i = 0; i < n; i++) {
        snprintf(p, sizeof p, "%s/%s", tmpdir, files[i]);
        remove(p);
    }
    rmdir(tmpdir);
}

static float *read_kind(const char *path, int layer, enum fk_kind kind, size_t n)
{
    struct fk_trace *t = NULL;
    ck_assert_msg(fk_trace_open(path, &t) == FK_OK, "%s", fk_errmsg());
    float *x = malloc(sizeof(float) * n);
    ck_assert(x);
    ck_assert_msg(fk_trace_read(t, layer, kind, x) == FK_OK, "%s", fk_errmsg());
    fk_trace_close(&t);
    return x;
}

START_TEST(test_file_shapes_and_attrs)
{
    struct fk_synth_opts o;
    small_opts(&o);
    o.seed = 5;
    mk_tmp();
    char path[256], name[128];
    fk_synth_file_name(&o, 3, name, sizeof name);
    ck_assert_str_eq(name, "synth-custom-L2-q4-kv2-d32-s5-3.h5");
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    /* layer 1 generated alone, before anything else: order must not matter */
    struct layer one;
    gen(&o, 3, 1, &one);
    ck_assert_msg(fk_synth_write(&o, path, 3) == FK_OK, "%s", fk_errmsg());
    struct fk_trace *t = NULL;
    ck_assert_msg(fk_trace_open(path, &t) == FK_OK, "%s", fk_errmsg());
    const struct fk_trace_info *in = fk_trace_get_info(t);
    ck_assert_int_eq(in->n_layers, 2);
    ck_assert_int_eq(in->n_q_heads, 4);
    ck_assert_int_eq(in->n_kv_heads, 2);
    ck_assert_int_eq(in->head_dim, 32);
    ck_assert_int_eq(in->n_tokens, 128);
    ck_assert_int_eq(in->prompt_len, 64);
    ck_assert_int_eq(in->has_queries, 1);
    ck_assert_int_eq(in->n_queries, 64);
    ck_assert_int_eq(in->keys_post_rope, 1);
    ck_assert(in->rope_theta == 500000);
    ck_assert_str_eq(in->source, "synthetic");
    ck_assert_str_eq(in->model_id, "synthetic-custom-L2-q4-kv2-d32");
    for (int i = 0; i < 128; i++) {
        ck_assert_int_eq(fk_trace_positions(t)[i], i);
        ck_assert_int_eq(fk_trace_phase(t)[i], i >= 64);
    }
    int32_t qidx[64];
    ck_assert(fk_trace_read_query_idx(t, 1, qidx) == FK_OK);
    for (int i = 0; i < 64; i++)
        ck_assert_int_eq(qidx[i], 64 + i);
    ck_assert_str_eq(fk_trace_attr(t, "synth.seed"), "5");
    ck_assert_str_eq(fk_trace_attr(t, "synth.seq_index"), "3");
    ck_assert_str_eq(fk_trace_attr(t, "synth.key_rank"), "6");
    ck_assert_str_eq(fk_trace_attr(t, "synth.rope_theta"), "500000");
    ck_assert_str_eq(fk_trace_attr(t, "synth.encoding"), "float32");
    int nk;
    const struct fk_synth_knob *kn = fk_synth_knobs(&nk);
    for (int i = 0; i < nk; i++) {
        char an[96];
        snprintf(an, sizeof an, "synth.%s", kn[i].name);
        ck_assert_msg(fk_trace_attr(t, an) != NULL, "attribute %s missing", an);
    }
    size_t nkv = (size_t)2 * 128 * 32, nq = (size_t)4 * 64 * 32;
    float *k = malloc(sizeof(float) * nkv), *v = malloc(sizeof(float) * nkv);
    float *q = malloc(sizeof(float) * nq);
    ck_assert(fk_trace_read(t, 1, FK_KIND_K, k) == FK_OK);
    ck_assert(fk_trace_read(t, 1, FK_KIND_V, v) == FK_OK);
    ck_assert(fk_trace_read(t, 1, FK_KIND_Q, q) == FK_OK);
    ck_assert(!memcmp(k, one.k, sizeof(float) * nkv));
    ck_assert(!memcmp(v, one.v, sizeof(float) * nkv));
    ck_assert(!memcmp(q, one.q, sizeof(float) * nq));
    fk_trace_close(&t);
    /* float16: same data within half-precision rounding */
    char name16[128], path16[256];
    o.encoding = FK_ENC_F16;
    o.seed = 6;
    fk_synth_file_name(&o, 0, name16, sizeof name16);
    snprintf(path16, sizeof path16, "%s/%s", tmpdir, name16);
    ck_assert_msg(fk_synth_write(&o, path16, 0) == FK_OK, "%s", fk_errmsg());
    struct layer ref;
    gen(&o, 0, 0, &ref);
    float *k16 = read_kind(path16, 0, FK_KIND_K, nkv);
    for (size_t i = 0; i < nkv; i++)
        ck_assert_msg(fabsf(k16[i] - ref.k[i]) <= 1e-3f * fabsf(ref.k[i]) + 1e-7f,
                      "float16 element %zu: %g vs %g", i, k16[i], ref.k[i]);
    free(k16);
    drop(&ref);
    free(k);
    free(v);
    free(q);
    drop(&one);
    const char *files[] = {name, name16};
    rm_tmp(files, 2);
}
END_TEST

START_TEST(test_determinism)
{
    struct fk_synth_opts o;
    small_opts(&o);
    o.n_layers = 1;
    mk_tmp();
    const char *files[] = {"a.h5", "b.h5", "c.h5", "d.h5"};
    char p[4][256];
    for (int i = 0; i < 4; i++)
        snprintf(p[i], sizeof p[i], "%s/%s", tmpdir, files[i]);
    ck_assert(fk_synth_write(&o, p[0], 0) == FK_OK);
    ck_assert(fk_synth_write(&o, p[1], 0) == FK_OK);
    o.seed = 2;
    ck_assert(fk_synth_write(&o, p[2], 0) == FK_OK);
    o.seed = 1;
    ck_assert(fk_synth_write(&o, p[3], 1) == FK_OK); /* next sequence index */
    size_t nkv = (size_t)2 * 128 * 32, nq = (size_t)4 * 64 * 32;
    for (int kind = FK_KIND_K; kind <= FK_KIND_Q; kind++) {
        size_t n = kind == FK_KIND_Q ? nq : nkv;
        float *x[4];
        for (int i = 0; i < 4; i++)
            x[i] = read_kind(p[i], 0, (enum fk_kind)kind, n);
        ck_assert_msg(!memcmp(x[0], x[1], sizeof(float) * n), "kind %d: same seed differs",
                      kind);
        ck_assert_msg(memcmp(x[0], x[2], sizeof(float) * n), "kind %d: seeds 1, 2 equal", kind);
        ck_assert_msg(memcmp(x[0], x[3], sizeof(float) * n), "kind %d: sequences 0, 1 equal",
                      kind);
        for (int i = 0; i < 4; i++)
            free(x[i]);
    }
    rm_tmp(files, 4);
}
END_TEST

/* prefill_queries: every prefill token's query in front, the keys, values and decode queries
 * bit for bit those without it; the prefill queries attend like the decode ones (a query
 * row is finite, token 0's targets the sink). */
START_TEST(test_prefill_queries)
{
    struct fk_synth_opts o;
    small_opts(&o);
    struct layer a, b;
    gen(&o, 0, 1, &a);
    o.prefill_queries = 1;
    gen(&o, 0, 1, &b);
    ck_assert_int_eq(b.Tq, a.Tq + o.prefill);
    size_t nkv = (size_t)a.hkv * a.T * a.d;
    ck_assert(!memcmp(a.k, b.k, sizeof(float) * nkv) && !memcmp(a.v, b.v, sizeof(float) * nkv));
    for (int i = 0; i < b.Tq; i++)
        ck_assert_int_eq(b.qidx[i], i < o.prefill ? i : a.qidx[i - o.prefill]);
    for (int h = 0; h < a.hq; h++) {
        ck_assert(!memcmp(row(a.q, a.Tq, a.d, h, 0), row(b.q, b.Tq, b.d, h, o.prefill),
                          sizeof(float) * (size_t)a.Tq * a.d));
        for (int t = 0; t < o.prefill; t++)
            for (int c = 0; c < a.d; c++)
                ck_assert(isfinite(row(b.q, b.Tq, b.d, h, t)[c]));
        /* not a copy of the decode rows */
        ck_assert(memcmp(row(b.q, b.Tq, b.d, h, o.prefill - 1), row(b.q, b.Tq, b.d, h, o.prefill),
                         sizeof(float) * (size_t)a.d));
    }
    drop(&a);
    drop(&b);
}
END_TEST

START_TEST(test_options)
{
    struct fk_synth_opts o;
    fk_synth_defaults(&o);
    ck_assert_int_eq(fk_synth_validate(&o), FK_OK);
    ck_assert_int_eq(o.n_layers, 28);
    ck_assert_int_eq(o.n_q_heads, 24);
    ck_assert_int_eq(o.n_kv_heads, 8);
    ck_assert_int_eq(o.head_dim, 128);
    ck_assert_int_eq(o.prefill, 512);
    ck_assert_int_eq(o.decode, 1024);
    ck_assert_int_eq(fk_synth_n_queries(&o), 1024);
    char name[128];
    fk_synth_file_name(&o, 0, name, sizeof name);
    ck_assert_str_eq(name, "synth-llama-3.2-3b-s1-0.h5");
    ck_assert_int_eq(fk_synth_set_shape(&o, "qwen3-4b"), FK_OK);
    ck_assert_int_eq(o.n_layers, 36);
    ck_assert(o.rope_theta == 1e6);
    fk_synth_shape_name(&o, name, sizeof name);
    ck_assert_str_eq(name, "qwen3-4b");
    ck_assert_int_eq(fk_synth_set_shape(&o, "gpt-2"), FK_EINVAL);
    ck_assert(strstr(fk_errmsg(), "llama-3.1-8b") != NULL);
    ck_assert_int_eq(fk_synth_set(&o, "key-rank", "7"), FK_OK);
    ck_assert_int_eq(o.key_rank, 7);
    ck_assert_int_eq(fk_synth_set(&o, "drift_rate", "0.25"), FK_OK);
    ck_assert(o.drift_rate == 0.25);
    ck_assert_int_eq(fk_synth_set(&o, "seed", "123456789012"), FK_OK);
    ck_assert(o.seed == 123456789012ULL);
    ck_assert_int_eq(fk_synth_set(&o, "key-rank", "7.5"), FK_EINVAL);
    ck_assert_int_eq(fk_synth_set(&o, "sink_mass", "1.5"), FK_EINVAL);
    ck_assert(strstr(fk_errmsg(), "sink_mass") != NULL);
    ck_assert_int_eq(fk_synth_set(&o, "no_such_knob", "1"), FK_EINVAL);
    ck_assert_int_eq(fk_synth_set(&o, "decode", "x"), FK_EINVAL);
    enum fk_encoding e;
    ck_assert_int_eq(fk_synth_parse_encoding("bfloat16", &e), FK_OK);
    ck_assert_int_eq(e, FK_ENC_BF16);
    ck_assert_int_eq(fk_synth_parse_encoding("int8", &e), FK_EINVAL);
    fk_synth_defaults(&o);
    o.n_q_heads = 12;
    o.n_kv_heads = 5;
    ck_assert_int_eq(fk_synth_validate(&o), FK_EINVAL);
    fk_synth_defaults(&o);
    o.head_dim = 33;
    ck_assert_int_eq(fk_synth_validate(&o), FK_EINVAL);
    fk_synth_defaults(&o);
    o.head_dim = 32; /* value_rank 48 > 32 */
    ck_assert_int_eq(fk_synth_validate(&o), FK_EINVAL);
    ck_assert(strstr(fk_errmsg(), "value_rank") != NULL);
    fk_synth_defaults(&o);
    o.coef_dof = 1.5;
    ck_assert_int_eq(fk_synth_validate(&o), FK_EINVAL);
    fk_synth_defaults(&o);
    o.decode = 0;
    o.prefill = 10;
    ck_assert_int_eq(fk_synth_n_queries(&o), 9); /* prefill tokens 1..9 */
    o.queries = 0;
    ck_assert_int_eq(fk_synth_n_queries(&o), 0);
}
END_TEST

START_TEST(test_cli)
{
    mk_tmp();
    char *argv[] = {"synth", "--out", tmpdir, "--layers", "1", "--q-heads", "2", "--kv-heads",
                    "1", "--head-dim", "16", "--prefill", "8", "--decode", "8", "--key-rank",
                    "4", "--value-rank", "8", "--key-outlier-pairs", "1", "--sequences", "2",
                    "--first-seq", "3", "--seed", "7", "--encoding", "bfloat16",
                    "--no-queries", "--shape", "llama-3.1-8b"};
    int argc = (int)(sizeof argv / sizeof argv[0]);
    ck_assert_int_eq(fk_cli_synth(argc, argv), 0);
    const char *files[] = {"synth-custom-L1-q2-kv1-d16-s7-3.h5",
                           "synth-custom-L1-q2-kv1-d16-s7-4.h5"};
    for (int i = 0; i < 2; i++) {
        char p[256];
        snprintf(p, sizeof p, "%s/%s", tmpdir, files[i]);
        struct fk_trace *t = NULL;
        ck_assert_msg(fk_trace_open(p, &t) == FK_OK, "%s", fk_errmsg());
        ck_assert_int_eq(fk_trace_get_info(t)->has_queries, 0);
        ck_assert_int_eq(fk_trace_get_info(t)->n_tokens, 16);
        ck_assert_str_eq(fk_trace_attr(t, "synth.encoding"), "bfloat16");
        fk_trace_close(&t);
    }
    char *bad[] = {"synth", "--out", tmpdir, "--key-rank", "999"};
    ck_assert_int_eq(fk_cli_synth(5, bad), 2);
    char *bad2[] = {"synth", "--out", tmpdir, "--frobnicate", "1"};
    ck_assert_int_eq(fk_cli_synth(5, bad2), 2);
    rm_tmp(files, 2);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("synth");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_options);
    tcase_add_test(tc, test_outlier_channels);
    tcase_add_test(tc, test_rope_pair_norms);
    tcase_add_test(tc, test_decode_drift);
    tcase_add_test(tc, test_sink);
    tcase_add_test(tc, test_attention_peaked);
    tcase_add_test(tc, test_values_more_isotropic);
    tcase_add_test(tc, test_heads_and_layers_differ);
    tcase_add_test(tc, test_file_shapes_and_attrs);
    tcase_add_test(tc, test_determinism);
    tcase_add_test(tc, test_prefill_queries);
    tcase_add_test(tc, test_cli);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    fk_hdf5_quiet();
    return fk_suite_run(suite());
}
