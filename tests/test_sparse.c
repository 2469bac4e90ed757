/* SPDX-License-Identifier: MIT
 * The sparse-coding core (codecs/kernels/fk_omp.c, fk_screen.c; spec: algorithms.md 3.2-3.6, 11)
 * against independent oracles: GSL least squares on the chosen support, argmax of |D^T r|
 * recomputed in double at every step, the naive mode, brute-force sorting for Top-n and a
 * GSL solve for the ridge refinement. This file includes GSL and never <cblas.h>.
 */
#include "fk_check_main.h"
#include "common/fk_err.h"
#include "kernels/fk_sparse.h"

#include <check.h>
#include <gsl/gsl_linalg.h>
#include <gsl/gsl_multifit.h>
#include <gsl/gsl_randist.h>
#include <gsl/gsl_rng.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- fixtures ---- */

struct tdict {
    int n;             /* atoms */
    int m;             /* dim */
    float *atoms;      /* (n, m) */
    float *gram;       /* (n, n) */
    uint8_t *dead;     /* (n) or NULL */
    float *work;       /* fk_omp_work_floats(n, m, FK_SMAX) */
    struct fk_dict_view v;
};

static struct fk_gram_row row_of(void *ctx, int j, float *scratch)
{
    const struct tdict *t = ctx;
    /* two pieces split where row j says (0 .. n, mostly inside a strip of the kernel's
     * pass), copied through scratch in swapped order (tail first, head after it): a read
     * from the wrong piece gets another entry, and the codes must not see the seam */
    int split = (int)(((long)j * 37 + 5) % (t->n + 1));
    const float *g = t->gram + (size_t)j * t->n;
    memcpy(scratch, g + split, (size_t)(t->n - split) * sizeof(float));
    memcpy(scratch + (t->n - split), g, (size_t)split * sizeof(float));
    return (struct fk_gram_row){.head = scratch + (t->n - split), .tail = scratch,
                                .split = split};
}

static void tdict_finish(struct tdict *t)
{
    t->gram = malloc((size_t)t->n * t->n * sizeof(float));
    ck_assert_int_eq(fk_gram_compute(t->atoms, t->n, t->m, t->gram), FK_OK);
    size_t wf = fk_omp_work_floats(t->n, t->m, FK_SMAX);
    t->work = malloc((wf + 1) * sizeof(float));
    for (size_t i = 0; i < wf + 1; i++)
        t->work[i] = NAN; /* garbage must not leak into results */
    t->v = (struct fk_dict_view){.m = t->m, .n_atoms = t->n, .atoms = t->atoms,
                                 .dead = t->dead, .gram_row = row_of, .gram_ctx = t};
}

/* The Gram and workspace again after a test changed t's atoms. */
static void tdict_refinish(struct tdict *t)
{
    free(t->gram);
    free(t->work);
    tdict_finish(t);
}

static void tdict_random(struct tdict *t, int n, int m, gsl_rng *r)
{
    memset(t, 0, sizeof *t);
    t->n = n;
    t->m = m;
    t->atoms = malloc((size_t)n * m * sizeof(float));
    for (int j = 0; j < n; j++) {
        double s = 0;
        for (int i = 0; i < m; i++) {
            double v = gsl_ran_gaussian(r, 1.0);
            t->atoms[j * m + i] = (float)v;
            s += v * v;
        }
        for (int i = 0; i < m; i++)
            t->atoms[j * m + i] = (float)(t->atoms[j * m + i] / sqrt(s));
    }
    tdict_finish(t);
}

static void tdict_free(struct tdict *t)
{
    free(t->atoms);
    free(t->gram);
    free(t->dead);
    free(t->work);
}

/* x = sum of s random atoms with N(0,1) weights + N(0, noise^2) */
static void make_signal(const struct tdict *t, int s, double noise, gsl_rng *r, float *x)
{
    for (int i = 0; i < t->m; i++)
        x[i] = (float)gsl_ran_gaussian(r, noise);
    for (int l = 0; l < s; l++) {
        int j = (int)gsl_rng_uniform_int(r, (unsigned long)t->n);
        double c = gsl_ran_gaussian(r, 1.0);
        for (int i = 0; i < t->m; i++)
            x[i] = (float)(x[i] + c * t->atoms[j * t->m + i]);
    }
}

static void correlate(const struct tdict *t, const float *x, float *a)
{
    fk_correlate(&t->v, x, 1, a);
}

/* GSL least squares on the support: coef (k), and the residual r = x - D_S coef (m). */
static void gsl_ls(const struct tdict *t, const float *x, const int32_t *idx, int k,
                   double *coef, double *r)
{
    int m = t->m;
    for (int i = 0; i < m; i++)
        r[i] = x[i];
    if (k == 0)
        return;
    gsl_matrix *A = gsl_matrix_alloc((size_t)m, (size_t)k);
    gsl_vector *y = gsl_vector_alloc((size_t)m), *c = gsl_vector_alloc((size_t)k);
    gsl_matrix *cov = gsl_matrix_alloc((size_t)k, (size_t)k);
    gsl_multifit_linear_workspace *w = gsl_multifit_linear_alloc((size_t)m, (size_t)k);
    for (int i = 0; i < m; i++) {
        gsl_vector_set(y, (size_t)i, x[i]);
        for (int l = 0; l < k; l++)
            gsl_matrix_set(A, (size_t)i, (size_t)l, t->atoms[(size_t)idx[l] * m + i]);
    }
    double chisq;
    ck_assert_int_eq(gsl_multifit_linear(A, y, c, cov, &chisq, w), 0);
    for (int l = 0; l < k; l++) {
        coef[l] = gsl_vector_get(c, (size_t)l);
        for (int i = 0; i < m; i++)
            r[i] -= coef[l] * t->atoms[(size_t)idx[l] * m + i];
    }
    gsl_multifit_linear_free(w);
    gsl_matrix_free(cov);
    gsl_matrix_free(A);
    gsl_vector_free(y);
    gsl_vector_free(c);
}

static double dot_atom(const struct tdict *t, int j, const double *r)
{
    double s = 0;
    for (int i = 0; i < t->m; i++)
        s += t->atoms[(size_t)j * t->m + i] * r[i];
    return s;
}

static int in_list(const int32_t *idx, int k, int j)
{
    for (int l = 0; l < k; l++)
        if (idx[l] == j)
            return 1;
    return 0;
}

static void assert_same_code(const struct fk_code *a, const struct fk_code *b, double ctol)
{
    ck_assert_int_eq(a->k, b->k);
    ck_assert_uint_eq(a->flags, b->flags);
    for (int l = 0; l < a->k; l++) {
        ck_assert_int_eq(a->idx[l], b->idx[l]);
        ck_assert_msg(fabs(a->coef[l] - b->coef[l]) <= ctol * (1 + fabs(b->coef[l])),
                      "coef %d: %.9g vs %.9g", l, a->coef[l], b->coef[l]);
    }
}

/* ---- OMP against the oracles ---- */

/* Every step picks argmax |D^T r| (double, r from a GSL LS on the prefix), the code for s
 * is the prefix of the code for S, coefficients equal GSL LS, r is orthogonal to D_S. */
static void check_oracles(int gram_mode)
{
    gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
    gsl_rng_set(r, 7 + gram_mode);
    struct tdict t;
    tdict_random(&t, 512, 64, r);
    float x[64], *a = malloc(512 * sizeof(float));
    double coef[FK_SMAX], res[64];
    const int S = 12;
    double worst_coef = 0, worst_orth = 0, worst_gap = 0;
    for (int v = 0; v < 60; v++) {
        make_signal(&t, 10, 0.05, r, x);
        correlate(&t, x, a);
        struct fk_code full, pre;
        int rc = gram_mode ? fk_omp_gram(&t.v, x, a, S, 0, t.work, &full)
                           : fk_omp_naive(&t.v, x, a, NULL, 0, S, 0, t.work, &full);
        ck_assert_int_eq(rc, FK_OK);
        ck_assert_int_eq(full.k, S);
        for (int k = 0; k < S; k++) {
            /* argmax of |D^T r_k| over atoms not yet chosen, r_k from GSL on the prefix */
            gsl_ls(&t, x, full.idx, k, coef, res);
            double best = -1, chosen = fabs(dot_atom(&t, full.idx[k], res));
            for (int j = 0; j < t.n; j++) {
                if (in_list(full.idx, k, j))
                    continue;
                double c = fabs(dot_atom(&t, j, res));
                best = c > best ? c : best;
            }
            ck_assert(!in_list(full.idx, k, full.idx[k]));
            double gap = (best - chosen) / best;
            worst_gap = gap > worst_gap ? gap : worst_gap;
            ck_assert_msg(gap <= 1e-5, "vector %d step %d: chose |c|=%.9g, max is %.9g", v, k,
                          chosen, best);
            /* the code with sparsity k + 1 is the prefix */
            rc = gram_mode ? fk_omp_gram(&t.v, x, a, k + 1, 0, t.work, &pre)
                           : fk_omp_naive(&t.v, x, a, NULL, 0, k + 1, 0, t.work, &pre);
            ck_assert_int_eq(rc, FK_OK);
            ck_assert_int_eq(pre.k, k + 1);
            for (int l = 0; l <= k; l++)
                ck_assert_int_eq(pre.idx[l], full.idx[l]);
        }
        gsl_ls(&t, x, full.idx, S, coef, res);
        double cn = 0, e2 = 0;
        for (int l = 0; l < S; l++)
            cn = fmax(cn, fabs(coef[l]));
        for (int l = 0; l < S; l++) {
            double d = fabs(full.coef[l] - coef[l]) / cn;
            worst_coef = d > worst_coef ? d : worst_coef;
        }
        for (int i = 0; i < t.m; i++)
            e2 += res[i] * res[i];
        ck_assert_msg(fabs(full.err2 - e2) <= 1e-6 * e2 + 1e-12, "err2 %.12g vs GSL %.12g",
                      full.err2, e2);
        /* residual of our coefficients is orthogonal to the chosen atoms */
        double rr[64], rn = 0;
        for (int i = 0; i < t.m; i++) {
            rr[i] = x[i];
            for (int l = 0; l < S; l++)
                rr[i] -= full.coef[l] * t.atoms[(size_t)full.idx[l] * t.m + i];
            rn += rr[i] * rr[i];
        }
        for (int l = 0; l < S; l++) {
            double o = fabs(dot_atom(&t, full.idx[l], rr)) / sqrt(full.xx);
            worst_orth = o > worst_orth ? o : worst_orth;
        }
        ck_assert(fabs(rn - full.err2) <= 1e-9 * full.xx);
    }
    ck_assert_msg(worst_coef <= 1e-6, "coefficients differ from GSL by %.3g (relative)",
                  worst_coef);
    ck_assert_msg(worst_orth <= 1e-6, "residual not orthogonal: %.3g", worst_orth);
    free(a);
    tdict_free(&t);
    gsl_rng_free(r);
}

START_TEST(omp_gram_vs_oracles)
{
    check_oracles(1);
}
END_TEST

START_TEST(omp_naive_vs_oracles)
{
    check_oracles(0);
}
END_TEST

/* Gram mode and naive mode give identical supports (order included). */
START_TEST(omp_gram_equals_naive)
{
    gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
    gsl_rng_set(r, 99);
    struct tdict t;
    tdict_random(&t, 1024, 128, r);
    float x[128], *a = malloc(1024 * sizeof(float));
    int differ = 0, noise_ties = 0;
    for (int v = 0; v < 600; v++) {
        if (v % 3 == 0) { /* unstructured: pure noise */
            for (int i = 0; i < 128; i++)
                x[i] = (float)gsl_ran_gaussian(r, 1.0);
        } else {
            make_signal(&t, 8, v % 3 == 1 ? 0.05 : 0.0, r, x);
        }
        correlate(&t, x, a);
        struct fk_code g, n;
        ck_assert_int_eq(fk_omp_gram(&t.v, x, a, 8, 0, t.work, &g), FK_OK);
        ck_assert_int_eq(fk_omp_naive(&t.v, x, a, NULL, 0, 8, 0, t.work, &n), FK_OK);
        int same = g.k == n.k, first = 0;
        while (first < g.k && first < n.k && g.idx[first] == n.idx[first])
            first++;
        same = same && first == g.k;
        if (!same) {
            /* legitimate only when the residual before the split is float noise (a signal
             * built from a repeated atom lies in the span of fewer than 8 atoms) */
            struct fk_code p;
            ck_assert_int_eq(fk_omp_gram(&t.v, x, a, first, 0, t.work, &p), FK_OK);
            if (p.err2 <= 1e-10 * p.xx)
                noise_ties++;
            else
                differ++;
        } else {
            for (int l = 0; l < g.k; l++)
                ck_assert(fabs(g.coef[l] - n.coef[l]) <= 1e-5 * (1 + fabs(n.coef[l])));
        }
    }
    ck_assert_msg(noise_ties <= 12, "%d splits after the residual vanished", noise_ties);
    ck_assert_msg(differ == 0, "%d of 600 supports differ", differ);
    free(a);
    tdict_free(&t);
    gsl_rng_free(r);
}
END_TEST

START_TEST(omp_zero_and_nonfinite)
{
    gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
    struct tdict t;
    tdict_random(&t, 64, 16, r);
    float x[16] = {0}, a[64];
    correlate(&t, x, a);
    struct fk_code c;
    ck_assert_int_eq(fk_omp_gram(&t.v, x, a, 4, 0, t.work, &c), FK_OK);
    ck_assert_int_eq(c.k, 0);
    ck_assert_uint_eq(c.flags, FK_CODE_ZERO);
    ck_assert_int_eq(fk_omp_naive(&t.v, x, NULL, NULL, 0, 4, 0, t.work, &c), FK_OK);
    ck_assert_int_eq(c.k, 0);
    ck_assert_uint_eq(c.flags, FK_CODE_ZERO);
    x[0] = 1e-16f; /* ||x||^2 = 1e-32 <= 1e-30 */
    ck_assert_int_eq(fk_omp_gram(&t.v, x, a, 4, 0, t.work, &c), FK_OK);
    ck_assert_uint_eq(c.flags, FK_CODE_ZERO);
    x[3] = NAN;
    ck_assert_int_eq(fk_omp_gram(&t.v, x, a, 4, 0, t.work, &c), FK_EINVAL);
    ck_assert_int_eq(fk_omp_naive(&t.v, x, a, NULL, 0, 4, 0, t.work, &c), FK_EINVAL);
    ck_assert_ptr_nonnull(strstr(fk_errmsg(), "not finite"));
    x[3] = INFINITY;
    ck_assert_int_eq(fk_omp_gram(&t.v, x, a, 4, 0, t.work, &c), FK_EINVAL);
    /* no Gram: Gram mode refuses */
    struct fk_dict_view nv = t.v;
    nv.gram_row = NULL;
    x[3] = 1.0f;
    ck_assert_int_eq(fk_omp_gram(&nv, x, a, 4, 0, t.work, &c), FK_EINVAL);
    ck_assert_int_eq(fk_omp_gram(&t.v, x, a, FK_SMAX + 1, 0, t.work, &c), FK_EINVAL);
    tdict_free(&t);
    gsl_rng_free(r);
}
END_TEST

/* s > m: s_eff = m and the residual vanishes; s larger than the live atoms: k <= live. */
START_TEST(omp_s_exceeds_m_and_live)
{
    gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
    gsl_rng_set(r, 3);
    struct tdict t;
    tdict_random(&t, 64, 8, r);
    float x[32], a[64];
    for (int i = 0; i < 8; i++)
        x[i] = (float)gsl_ran_gaussian(r, 1.0);
    correlate(&t, x, a);
    struct fk_code g, n;
    ck_assert_int_eq(fk_omp_gram(&t.v, x, a, 20, 0, t.work, &g), FK_OK);
    ck_assert_int_eq(fk_omp_naive(&t.v, x, a, NULL, 0, 20, 0, t.work, &n), FK_OK);
    ck_assert_int_le(g.k, 8);
    ck_assert_msg(g.err2 <= 1e-8 * g.xx, "err2 %g after %d atoms", g.err2, g.k);
    for (int l = 0; l < g.k; l++)
        ck_assert_int_eq(g.idx[l], n.idx[l]);
    ck_assert_int_eq(g.k, n.k);
    tdict_free(&t);

    /* 12 atoms in dimension 32, 6 of them dead (and not zeroed: the flag alone must hold) */
    tdict_random(&t, 12, 32, r);
    t.dead = calloc(12, 1);
    for (int j = 0; j < 12; j += 2)
        t.dead[j] = 1;
    t.v.dead = t.dead;
    float b[12];
    for (int v = 0; v < 20; v++) {
        for (int i = 0; i < 32; i++)
            x[i] = (float)gsl_ran_gaussian(r, 1.0);
        for (int i = 0; i < 32; i++) /* make a dead atom the best match */
            x[i] += 3.0f * t.atoms[(size_t)(2 * (v % 6)) * 32 + i];
        correlate(&t, x, b);
        ck_assert_int_eq(fk_omp_gram(&t.v, x, b, 10, 0, t.work, &g), FK_OK);
        ck_assert_int_eq(fk_omp_naive(&t.v, x, b, NULL, 0, 10, 0, t.work, &n), FK_OK);
        ck_assert_int_eq(g.k, 6);
        ck_assert_int_eq(n.k, 6);
        for (int l = 0; l < g.k; l++) {
            ck_assert_int_eq(g.idx[l] % 2, 1);
            ck_assert_int_eq(g.idx[l], n.idx[l]);
        }
    }
    tdict_free(&t);
    gsl_rng_free(r);
}
END_TEST

/* Dependency guard: atom 1 is a near-duplicate of atom 0 (delta2 ~ 1e-8); atom 3 an exact
 * duplicate of atom 1 (tie: the lower index wins). */
START_TEST(omp_duplicates_guard)
{
    struct tdict t;
    memset(&t, 0, sizeof t);
    t.n = 10;
    t.m = 16;
    t.atoms = calloc(160, sizeof(float));
    gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
    t.atoms[0 * 16 + 0] = 1.0f;
    double nn = sqrt(1.0 + 1e-8);
    t.atoms[1 * 16 + 0] = (float)(1.0 / nn);
    t.atoms[1 * 16 + 1] = (float)(1e-4 / nn);
    for (int j = 2; j < 10; j++) { /* random atoms in components 2..15 */
        double s = 0;
        for (int i = 2; i < 16; i++) {
            double v = gsl_ran_gaussian(r, 1.0);
            t.atoms[j * 16 + i] = (float)v;
            s += v * v;
        }
        for (int i = 2; i < 16; i++)
            t.atoms[j * 16 + i] = (float)(t.atoms[j * 16 + i] / sqrt(s));
    }
    memcpy(t.atoms + 3 * 16, t.atoms + 1 * 16, 16 * sizeof(float));
    tdict_finish(&t);
    float x[16] = {0}, a[10];
    x[0] = 1.0f;
    x[1] = 5.0f;
    for (int i = 2; i < 16; i++)
        x[i] = 1e-4f * t.atoms[5 * 16 + i]; /* below atom 0's 5e-4 after step 1 */
    correlate(&t, x, a);
    struct fk_code g, n;
    /* s = 2: past {1, 5} the residual is float noise and the next pick is arbitrary */
    ck_assert_int_eq(fk_omp_gram(&t.v, x, a, 2, 0, t.work, &g), FK_OK);
    ck_assert_int_eq(fk_omp_naive(&t.v, x, a, NULL, 0, 2, 0, t.work, &n), FK_OK);
    ck_assert_int_eq(g.k, 2);
    ck_assert_int_eq(g.iters, 3);
    ck_assert_int_eq(g.idx[0], 1); /* tie with atom 3 goes to the lower index */
    ck_assert_int_eq(g.idx[1], 5);
    ck_assert(g.flags & FK_CODE_DEPENDENT);
    for (int l = 0; l < g.k; l++) {
        ck_assert_int_ne(g.idx[l], 0);
        ck_assert_int_ne(g.idx[l], 3);
        ck_assert(isfinite(g.coef[l]));
    }
    ck_assert_int_eq(g.k, n.k);
    ck_assert_uint_eq(g.flags, n.flags);
    for (int l = 0; l < g.k; l++)
        ck_assert_int_eq(g.idx[l], n.idx[l]);
    ck_assert(g.iters > g.k); /* the excluded candidate counts as an iteration */
    tdict_free(&t);
    gsl_rng_free(r);
}
END_TEST

/* Precision guard. A chain of 12 atoms d_j ~ e_0 + eps (e_1 + ... + e_j), eps = 1.5e-3 (each at
 * delta2 ~ eps^2 = 2.3e-6 from the span of the ones before, above the dependency guard;
 * cond(G_SS) ~ (12 / eps)^2 ~ 6e7), other atoms in dims 12..15, and a Gram whose chain
 * entries carry an error of 3e-6 (what a float32 Gram of larger, less tidy atoms carries on
 * such a cluster). A vector of the chain's span at s = 12 needs coefficients ~ 1 / eps, the
 * solve cancels and, unguarded, err2 reaches many times ||x||^2. Gram mode: every code must
 * end with err2 <= ||x||^2 and err2 must be its own residual (recomputed here in long
 * double); some codes must have been cut (the data exercise the guard), and some cut codes
 * must keep atoms and most of x (a guard that always cut to the empty code fails). Naive
 * mode, whose Gram entries come from the atoms themselves (so it needs no cut here): the
 * same bounds. */
START_TEST(omp_precision_guard)
{
    gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
    gsl_rng_set(r, 5);
    struct tdict t;
    memset(&t, 0, sizeof t);
    t.n = 64;
    t.m = 16;
    t.atoms = calloc((size_t)t.n * t.m, sizeof(float));
    const double eps = 1.5e-3;
    for (int j = 0; j < 12; j++) {
        double nn = sqrt(1.0 + j * eps * eps);
        t.atoms[j * 16] = (float)(1.0 / nn);
        for (int i = 1; i <= j; i++)
            t.atoms[j * 16 + i] = (float)(eps / nn);
    }
    for (int j = 12; j < t.n; j++) {
        double v[4], s = 0;
        for (int i = 0; i < 4; i++) {
            v[i] = gsl_ran_gaussian(r, 1.0);
            s += v[i] * v[i];
        }
        for (int i = 0; i < 4; i++)
            t.atoms[j * 16 + 12 + i] = (float)(v[i] / sqrt(s));
    }
    tdict_finish(&t);
    for (int i = 0; i < 12; i++) /* the Gram's error on the chain */
        for (int j = 0; j < i; j++) {
            float e = (float)(3e-6 * gsl_ran_gaussian(r, 1.0));
            t.gram[i * t.n + j] += e;
            t.gram[j * t.n + i] += e;
        }
    int guarded[2] = {0, 0}, useful = 0;
    for (int v = 0; v < 40; v++) {
        float x[16], a[64];
        for (int i = 0; i < 16; i++) /* in the chain's span, with coefficients ~ 1 / eps */
            x[i] = i < 12 ? (float)gsl_ran_gaussian(r, 1.0) : 0.0f;
        correlate(&t, x, a);
        struct fk_code g, n;
        ck_assert_int_eq(fk_omp_gram(&t.v, x, a, 12, 0, t.work, &g), FK_OK);
        ck_assert_int_eq(fk_omp_naive(&t.v, x, a, NULL, 0, 12, 0, t.work, &n), FK_OK);
        const struct fk_code *cs[2] = {&g, &n};
        for (int q = 0; q < 2; q++) {
            const struct fk_code *c = cs[q];
            ck_assert_msg(c->err2 <= c->xx * (1 + 1e-9), "vector %d mode %d: err2 %g > xx %g",
                          v, q, c->err2, c->xx);
            long double e = 0; /* the code's own residual, independently */
            for (int i = 0; i < 16; i++) {
                long double ri = x[i];
                for (int l = 0; l < c->k; l++)
                    ri -= (long double)c->coef[l] * t.atoms[c->idx[l] * 16 + i];
                e += ri * ri;
            }
            ck_assert_msg(fabsl(e - c->err2) <= 1e-9L * c->xx, "err2 %g, residual %Lg",
                          c->err2, e);
            if (!(c->flags & FK_CODE_GUARDED))
                continue;
            guarded[q]++;
            useful += c->k > 0 && c->err2 < 0.5 * c->xx; /* not cut to nothing */
        }
    }
    /* the naive mode's exact Gram entries need no cut here; the Gram mode's do */
    ck_assert_msg(guarded[0] > 0, "the data never needed the guard (Gram mode)");
    ck_assert_msg(useful > 0, "every cut code kept (almost) nothing of x");
    tdict_free(&t);
    gsl_rng_free(r);
}
END_TEST

/* Premature stop, relative tolerance, determinism with dirty scratch. */
START_TEST(omp_premature_tol_determinism)
{
    gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
    gsl_rng_set(r, 11);
    struct tdict t;
    tdict_random(&t, 256, 32, r);
    float x[32], a[256];
    for (int i = 0; i < 32; i++)
        x[i] = 2.0f * t.atoms[17 * 32 + i];
    correlate(&t, x, a);
    struct fk_code g, n, g2;
    ck_assert_int_eq(fk_omp_gram(&t.v, x, a, 6, 0, t.work, &g), FK_OK);
    ck_assert_int_eq(fk_omp_naive(&t.v, x, a, NULL, 0, 6, 0, t.work, &n), FK_OK);
    ck_assert_int_eq(g.idx[0], 17);
    ck_assert(fabs(g.coef[0] - 2.0) < 1e-5);
    ck_assert_msg(g.err2 <= 1e-10 * g.xx, "err2 %g", g.err2);
    ck_assert_msg(g.k < 6 ? (g.flags & FK_CODE_PREMATURE) != 0 : 1, "k %d flags %u", g.k,
                  g.flags);
    ck_assert_int_eq(n.idx[0], 17);

    for (int v = 0; v < 30; v++) {
        make_signal(&t, 6, 0.05, r, x);
        correlate(&t, x, a);
        double tol = 0.3;
        ck_assert_int_eq(fk_omp_gram(&t.v, x, a, 12, tol, t.work, &g), FK_OK);
        ck_assert_int_eq(fk_omp_naive(&t.v, x, a, NULL, 0, 12, tol, t.work, &n), FK_OK);
        assert_same_code(&g, &n, 1e-5);
        if (g.flags & FK_CODE_TOL) {
            ck_assert(g.err2 <= tol * tol * g.xx * (1 + 1e-9));
            ck_assert_int_ge(g.k, 1);
            ck_assert_int_eq(fk_omp_gram(&t.v, x, a, g.k - 1, 0, t.work, &g2), FK_OK);
            ck_assert(g2.k == 0 || g2.err2 > tol * tol * g2.xx * (1 - 1e-9));
        } else {
            ck_assert_int_eq(g.k, 12);
        }
        /* bit-identical on a second call with the scratch now dirty */
        ck_assert_int_eq(fk_omp_gram(&t.v, x, a, 12, tol, t.work, &g2), FK_OK);
        ck_assert_int_eq(g2.k, g.k);
        ck_assert(!memcmp(g2.idx, g.idx, (size_t)g.k * sizeof g.idx[0]));
        ck_assert(!memcmp(g2.coef, g.coef, (size_t)g.k * sizeof g.coef[0]));
        ck_assert(g2.err2 == g.err2);
    }
    /* tol >= 1: zero atoms */
    ck_assert_int_eq(fk_omp_gram(&t.v, x, a, 12, 1.0, t.work, &g), FK_OK);
    ck_assert_int_eq(g.k, 0);
    ck_assert(g.flags & FK_CODE_TOL);
    tdict_free(&t);
    gsl_rng_free(r);
}
END_TEST

/* The interleaved batch gives, vector by vector, the bits of fk_omp_gram: zero vectors,
 * vectors done at the start (tolerance), premature stops, excluded dependent candidates, dead
 * atoms, a tail strip (n not a multiple of 256), a strided correlation matrix and a vector
 * count that leaves a lane idle at the end. */
START_TEST(omp_batch_equals_single)
{
    gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
    gsl_rng_set(r, 2027);
    /* atom 0 = e0, atom 1 = e0 + 1e-4 e1 normalised (the pair of omp_duplicates_guard), the
     * others random in components 2..30: nothing correlates with e31 */
    struct tdict t;
    memset(&t, 0, sizeof t);
    t.n = 300;
    t.m = 32;
    t.atoms = calloc(300 * 32, sizeof(float));
    t.atoms[0] = 1.0f;
    t.atoms[32 + 0] = (float)(1.0 / sqrt(1.0 + 1e-8));
    t.atoms[32 + 1] = (float)(1e-4 / sqrt(1.0 + 1e-8));
    for (int j = 2; j < 300; j++) {
        double nn = 0;
        for (int i = 2; i < 31; i++) {
            double v = gsl_ran_gaussian(r, 1.0);
            t.atoms[j * 32 + i] = (float)v;
            nn += v * v;
        }
        for (int i = 2; i < 31; i++)
            t.atoms[j * 32 + i] = (float)(t.atoms[j * 32 + i] / sqrt(nn));
    }
    t.dead = calloc(300, 1);
    for (int j = 250; j < 300; j += 7)
        t.dead[j] = 1;
    tdict_finish(&t);
    enum { NX = 37, LDA = 311 };
    float *x = malloc(sizeof(float) * NX * 32), *a = malloc(sizeof(float) * NX * LDA);
    for (int v = 0; v < NX; v++) {
        float *xv = x + v * 32;
        switch (v % 5) {
        case 0: memset(xv, 0, 32 * sizeof(float)); break;             /* zero */
        case 1: /* premature: no atom correlates */
            memset(xv, 0, 32 * sizeof(float));
            xv[31] = 1.0f + v;
            break;
        case 2: /* atom 1, then atom 0 is excluded as dependent */
            for (int i = 0; i < 32; i++)
                xv[i] = 1e-4f * t.atoms[(5 + v) * 32 + i];
            xv[0] = 1.0f;
            xv[1] = 5.0f;
            break;
        default: make_signal(&t, 10, 0.05, r, xv); break;
        }
        correlate(&t, xv, a + (size_t)v * LDA);
        for (int i = 300; i < LDA; i++)
            a[(size_t)v * LDA + i] = NAN; /* past n_atoms: never read */
    }
    size_t wb = fk_omp_batch_work_floats(300, 32, 12);
    float *wk = malloc(sizeof(float) * wb);
    for (size_t i = 0; i < wb; i++)
        wk[i] = NAN;
    const double tols[2] = {0.0, 0.2};
    long dependent = 0, premature = 0, tol = 0, zero = 0;
    for (int it = 0; it < 2; it++) {
        struct fk_code b[NX], o;
        ck_assert_int_eq(fk_omp_gram_batch(&t.v, NX, x, a, LDA, 12, tols[it], wk, b), FK_OK);
        for (int v = 0; v < NX; v++) {
            ck_assert_int_eq(fk_omp_gram(&t.v, x + v * 32, a + (size_t)v * LDA, 12, tols[it],
                                         t.work, &o), FK_OK);
            ck_assert_int_eq(b[v].k, o.k);
            ck_assert_uint_eq(b[v].flags, o.flags);
            ck_assert_int_eq(b[v].iters, o.iters);
            ck_assert(!memcmp(b[v].idx, o.idx, (size_t)o.k * sizeof o.idx[0]));
            ck_assert(!memcmp(b[v].coef, o.coef, (size_t)o.k * sizeof o.coef[0]));
            ck_assert(!memcmp(&b[v].err2, &o.err2, sizeof o.err2));
            ck_assert(!memcmp(&b[v].xx, &o.xx, sizeof o.xx));
            for (int l = 0; l < o.k; l++)
                ck_assert(!t.dead[o.idx[l]]);
            dependent += (o.flags & FK_CODE_DEPENDENT) != 0;
            premature += (o.flags & FK_CODE_PREMATURE) != 0;
            tol += (o.flags & FK_CODE_TOL) != 0;
            zero += (o.flags & FK_CODE_ZERO) != 0;
        }
    }
    /* every path the interleaving must keep apart was taken */
    ck_assert_msg(dependent > 0 && premature > 0 && tol > 0 && zero > 0,
                  "dependent %ld premature %ld tol %ld zero %ld", dependent, premature, tol,
                  zero);
    x[5 * 32 + 3] = NAN;
    struct fk_code b[NX];
    ck_assert_int_eq(fk_omp_gram_batch(&t.v, NX, x, a, LDA, 12, 0, wk, b), FK_EINVAL);
    ck_assert_ptr_nonnull(strstr(fk_errmsg(), "not finite"));
    free(x);
    free(a);
    free(wk);
    tdict_free(&t);
    gsl_rng_free(r);
}
END_TEST

/* Naive mode over a candidate pool equals Gram mode on the sub-dictionary of the pool. */
START_TEST(omp_naive_pool)
{
    gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
    gsl_rng_set(r, 5);
    struct tdict t, sub;
    tdict_random(&t, 300, 32, r);
    int32_t cand[64];
    for (int p = 0; p < 64; p++) /* unsorted pool */
        cand[p] = (int32_t)((p * 97 + 13) % 300);
    memset(&sub, 0, sizeof sub);
    sub.n = 64;
    sub.m = 32;
    sub.atoms = malloc(64 * 32 * sizeof(float));
    for (int p = 0; p < 64; p++)
        memcpy(sub.atoms + p * 32, t.atoms + cand[p] * 32, 32 * sizeof(float));
    tdict_finish(&sub);
    float x[32], a[300], as[64];
    for (int v = 0; v < 40; v++) {
        make_signal(&t, 5, 0.02, r, x);
        correlate(&t, x, a);
        correlate(&sub, x, as);
        struct fk_code n, g;
        ck_assert_int_eq(fk_omp_naive(&t.v, x, v % 2 ? a : NULL, cand, 64, 6, 0, t.work, &n),
                         FK_OK);
        ck_assert_int_eq(fk_omp_gram(&sub.v, x, as, 6, 0, sub.work, &g), FK_OK);
        ck_assert_int_eq(n.k, g.k);
        for (int l = 0; l < n.k; l++) {
            ck_assert_int_eq(n.idx[l], cand[g.idx[l]]);
            ck_assert(fabs(n.coef[l] - g.coef[l]) <= 1e-5 * (1 + fabs(g.coef[l])));
        }
    }
    int32_t badc[1] = {300};
    struct fk_code n;
    ck_assert_int_eq(fk_omp_naive(&t.v, x, a, badc, 1, 2, 0, t.work, &n), FK_EINVAL);
    tdict_free(&sub);
    tdict_free(&t);
    gsl_rng_free(r);
}
END_TEST

/* The pool OMP over the Gram (a view with gram_row) against the naive pool OMP (the same
 * view without it): the same supports, flags and iterations, G_SS within float rounding,
 * and the same refined coefficients within it; a split is allowed only where the residual
 * before it is float noise. Pools unsorted, some atoms dead, one duplicated atom in the
 * pool (the dependency guard), Gram rows read across a seam (row_of). */
START_TEST(omp_pool_gram_vs_naive)
{
    static const int shape[2][4] = {{128, 16, 32, 4}, {600, 64, 64, 8}}; /* N m n s */
    gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
    gsl_rng_set(r, 17);
    for (int sh = 0; sh < 2; sh++) {
        int N = shape[sh][0], m = shape[sh][1], n = shape[sh][2], S = shape[sh][3];
        struct tdict t;
        tdict_random(&t, N, m, r);
        double nn7 = 0; /* atom 7 within 1e-4 of atom 3: dependent on it */
        for (int i = 0; i < m; i++) {
            double u = t.atoms[3 * m + i] + 1e-4 * t.atoms[9 * m + i];
            t.atoms[7 * m + i] = (float)u;
            nn7 += u * u;
        }
        for (int i = 0; i < m; i++)
            t.atoms[7 * m + i] = (float)(t.atoms[7 * m + i] / sqrt(nn7));
        t.dead = calloc((size_t)N, 1);
        for (int j = 0; j < N; j += 29)
            t.dead[j] = 1;
        memset(t.atoms + (size_t)29 * m, 0, sizeof(float) * (size_t)m);
        tdict_refinish(&t);
        struct fk_dict_view nv = t.v;
        nv.gram_row = NULL;
        float *x = malloc(sizeof(float) * (size_t)m), *a = malloc(sizeof(float) * (size_t)N);
        int32_t *cand = malloc(sizeof(int32_t) * (size_t)n);
        int differ = 0, ties = 0, dep_seen = 0;
        for (int v = 0; v <= 300; v++) {
            make_signal(&t, S, v % 2 ? 0.05 : 0.0, r, x);
            if (v == 300) /* x = d3 + d9 on the pool {3, 7}: 7 is dependent on 3 */
                for (int i = 0; i < m; i++)
                    x[i] = t.atoms[3 * m + i] + t.atoms[9 * m + i];
            correlate(&t, x, a);
            int np = fk_topn(a, t.dead, N, n, 0, cand, t.work);
            for (int p = 0; p + 1 < np; p += 2) { /* unsorted */
                int32_t c = cand[p];
                cand[p] = cand[p + 1];
                cand[p + 1] = c;
            }
            if (v == 300) {
                cand[0] = 3;
                cand[1] = 7;
                np = 2;
            }
            struct fk_code g, e;
            double gg[FK_SMAX * FK_SMAX], ge[FK_SMAX * FK_SMAX];
            ck_assert_int_eq(fk_omp_pool(&t.v, x, a, cand, np, S, t.work, &g, gg), FK_OK);
            ck_assert_int_eq(fk_omp_pool(&nv, x, a, cand, np, S, t.work, &e, ge), FK_OK);
            int first = 0;
            while (first < g.k && first < e.k && g.idx[first] == e.idx[first])
                first++;
            if (first < g.k || g.k != e.k) {
                /* the residual after the common prefix, from GSL least squares */
                double coef[FK_SMAX], res[256], rr = 0;
                gsl_ls(&t, x, e.idx, first, coef, res);
                for (int i = 0; i < m; i++)
                    rr += res[i] * res[i];
                if (rr <= 1e-10 * e.xx)
                    ties++;
                else
                    differ++;
                continue;
            }
            ck_assert_uint_eq(g.flags, e.flags);
            ck_assert_int_eq(g.iters, e.iters);
            dep_seen += v == 300;
            if (v == 300)
                ck_assert_msg(g.k == 1 && (g.flags & FK_CODE_DEPENDENT),
                              "N %d: k %d, flags %#x on a dependent pool", N, g.k, g.flags);
            for (int p = 0; p < g.k; p++)
                for (int q = 0; q < g.k; q++)
                    ck_assert_msg(fabs(gg[p * FK_SMAX + q] - ge[p * FK_SMAX + q]) <= 1e-6,
                                  "G_SS[%d][%d]: %.9g (Gram) vs %.9g (naive)", p, q,
                                  gg[p * FK_SMAX + q], ge[p * FK_SMAX + q]);
            if (g.k == 0)
                continue;
            ck_assert_int_eq(fk_refine_gss(&t.v, x, 1e-4, 1e-3, 2, &g, gg), FK_OK);
            ck_assert_int_eq(fk_refine_gss(&nv, x, 1e-4, 1e-3, 2, &e, ge), FK_OK);
            for (int l = 0; l < g.k; l++)
                ck_assert(fabs(g.coef[l] - e.coef[l]) <= 1e-4 * (1 + fabs(e.coef[l])));
            ck_assert(fabs(g.err2 - e.err2) <= 1e-4 * e.xx);
        }
        ck_assert_msg(differ == 0, "N %d: %d of 301 supports differ", N, differ);
        ck_assert_msg(ties <= 6, "N %d: %d splits after the residual vanished", N, ties);
        ck_assert_msg(dep_seen == 1, "N %d: the dependent pool gave different supports", N);
        free(x);
        free(a);
        free(cand);
        tdict_free(&t);
    }
    gsl_rng_free(r);
}
END_TEST

/* fk_omp_pool2 (two vectors stepping in turn) gives the bits of two fk_omp_pool calls:
 * pools of different sizes, s from 1 to 8, a zero vector, a dependent pool. */
START_TEST(omp_pool2_equals_single)
{
    gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
    gsl_rng_set(r, 23);
    struct tdict t;
    tdict_random(&t, 300, 32, r);
    memcpy(t.atoms + 7 * 32, t.atoms + 3 * 32, 32 * sizeof(float)); /* atom 7 = atom 3 */
    tdict_refinish(&t);
    size_t wf = fk_omp_pool2_work_floats(300, 32, FK_SMAX);
    float *w2 = malloc(sizeof(float) * wf);
    float x[2][32], a[2][300];
    int32_t pool[2][300];
    for (int v = 0; v < 120; v++) {
        int S = 1 + v % 8, np[2];
        for (int l = 0; l < 2; l++) {
            make_signal(&t, S, 0.02 * l, r, x[l]);
            if (v % 17 == 5 && l == 1)
                memset(x[l], 0, sizeof x[l]);
            correlate(&t, x[l], a[l]);
            np[l] = fk_topn(a[l], NULL, 300, 8 + (v * 7 + l * 13) % 60, 0, pool[l], t.work);
            if (v % 11 == 3 && l == 0) {
                pool[l][0] = 3;
                pool[l][1] = 7;
                for (int i = 0; i < 32; i++)
                    x[l][i] = t.atoms[3 * 32 + i] + 0.5f * t.atoms[40 * 32 + i];
                correlate(&t, x[l], a[l]);
            }
        }
        struct fk_code one[2], two[2];
        double g1[2][FK_SMAX * FK_SMAX], g2[2][FK_SMAX * FK_SMAX];
        memset(g1, 0, sizeof g1);
        memset(g2, 0, sizeof g2);
        for (int l = 0; l < 2; l++)
            ck_assert_int_eq(fk_omp_pool(&t.v, x[l], a[l], pool[l], np[l], S, t.work, &one[l],
                                         g1[l]),
                             FK_OK);
        const float *xs[2] = {x[0], x[1]}, *as[2] = {a[0], a[1]};
        const int32_t *ps[2] = {pool[0], pool[1]};
        struct fk_code *const co[2] = {&two[0], &two[1]};
        double *const gs[2] = {g2[0], g2[1]};
        ck_assert_int_eq(fk_omp_pool2(&t.v, xs, as, ps, np, S, w2, co, gs), FK_OK);
        for (int l = 0; l < 2; l++) {
            ck_assert_int_eq(one[l].k, two[l].k);
            ck_assert_uint_eq(one[l].flags, two[l].flags);
            ck_assert_int_eq(one[l].iters, two[l].iters);
            ck_assert(one[l].xx == two[l].xx);
            if (one[l].k == 0)
                ck_assert(one[l].err2 == two[l].err2);
            for (int k = 0; k < one[l].k; k++)
                ck_assert_int_eq(one[l].idx[k], two[l].idx[k]);
            ck_assert(memcmp(g1[l], g2[l], sizeof g1[l]) == 0);
        }
    }
    free(w2);
    tdict_free(&t);
    gsl_rng_free(r);
}
END_TEST

START_TEST(correlate_and_gram)
{
    gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
    struct tdict t;
    tdict_random(&t, 200, 24, r);
    float x[3 * 24], a[3 * 200];
    for (int i = 0; i < 3 * 24; i++)
        x[i] = (float)gsl_ran_gaussian(r, 1.0);
    fk_correlate(&t.v, x, 3, a);
    for (int v = 0; v < 3; v++)
        for (int j = 0; j < 200; j++) {
            double s = 0, nx = 0;
            for (int i = 0; i < 24; i++) {
                s += (double)x[v * 24 + i] * t.atoms[j * 24 + i];
                nx += (double)x[v * 24 + i] * x[v * 24 + i];
            }
            ck_assert(fabs(a[v * 200 + j] - s) <= 1e-5 * sqrt(nx));
        }
    for (int i = 0; i < 200; i++)
        for (int j = 0; j < 200; j++) {
            ck_assert(t.gram[i * 200 + j] == t.gram[j * 200 + i]);
            double s = 0;
            for (int q = 0; q < 24; q++)
                s += (double)t.atoms[i * 24 + q] * t.atoms[j * 24 + q];
            ck_assert(fabs(t.gram[i * 200 + j] - s) <= 1e-6);
        }
    ck_assert_int_eq(fk_gram_compute(t.atoms, 0, 24, t.gram), FK_EINVAL);
    tdict_free(&t);
    gsl_rng_free(r);
}
END_TEST

/* fk_correlate_to against dot products in double written here: every element within the
 * float rounding of a sum of m products (4 m ulp of the sum of |products|), for row counts
 * around the BLAS's micro-kernel shapes, a head_dim that is not a multiple of 8, an output
 * wider than the atoms (lda > n), and nothing written outside its n columns of nx rows. */
START_TEST(correlate_to_within_rounding)
{
    gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
    gsl_rng_set(r, 7);
    enum { NA = 40, MAXX = 19, LDA = 48 };
    const int dims[] = {13, 64};
    for (int di = 0; di < 2; di++) {
        int m = dims[di];
        float *atoms = malloc(sizeof(float) * NA * (size_t)m);
        float *x = malloc(sizeof(float) * MAXX * (size_t)m);
        ck_assert(atoms && x);
        for (int i = 0; i < NA * m; i++)
            atoms[i] = (float)gsl_ran_gaussian(r, 1.0);
        for (int i = 0; i < MAXX * m; i++)
            x[i] = (float)gsl_ran_gaussian(r, 1.0);
        for (int nx = 1; nx <= MAXX; nx++)
            for (int n = 1; n <= NA; n += 3) {
                float a[(MAXX + 1) * LDA];
                for (int i = 0; i < (MAXX + 1) * LDA; i++)
                    a[i] = -7.0f;
                fk_correlate_to(atoms, n, m, x, nx, a, LDA);
                for (int i = 0; i <= MAXX; i++)
                    for (int c = 0; c < LDA; c++) {
                        float got = a[i * LDA + c];
                        if (i >= nx || c >= n) {
                            ck_assert_msg(got == -7.0f, "m %d, %d rows, %d atoms: a[%d][%d] "
                                          "= %g written outside the product", m, nx, n, i, c,
                                          got);
                            continue;
                        }
                        double want = 0, mag = 0;
                        for (int k = 0; k < m; k++) {
                            double p = (double)x[i * m + k] * atoms[(size_t)c * m + k];
                            want += p;
                            mag += fabs(p);
                        }
                        ck_assert_msg(fabs(got - want) <= 4.0 * m * FLT_EPSILON * mag,
                                      "m %d, %d rows, %d atoms: a[%d][%d] = %.9g, the dot "
                                      "product is %.9g", m, nx, n, i, c, got, want);
                    }
            }
        free(atoms);
        free(x);
    }
    gsl_rng_free(r);
}
END_TEST

/* ---- Top-n ---- */

struct pair {
    float k;   /* |a| */
    int32_t j; /* atom */
};

static int cmp_pair(const void *pa, const void *pb)
{
    const struct pair *a = pa, *b = pb;
    if (a->k != b->k)
        return a->k > b->k ? -1 : 1;
    return (a->j > b->j) - (a->j < b->j);
}

static int cmp_int(const void *pa, const void *pb)
{
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    return (a > b) - (a < b);
}

START_TEST(topn_vs_sort)
{
    gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
    gsl_rng_set(r, 21);
    const int N_MAX = 4133; /* 700: one candidate pass; 4096: the sampled threshold first */
    float *a = malloc(N_MAX * sizeof(float)), *work = malloc(2 * N_MAX * sizeof(float));
    uint8_t *dead = malloc(N_MAX);
    int32_t *out = malloc(N_MAX * sizeof(int32_t)), *ref = malloc(N_MAX * sizeof(int32_t));
    struct pair *p = malloc(N_MAX * sizeof *p);
    /* 2100: > 2048 candidates; 8 .. 32: the sorted list, screened by block maxima when the
     * blocks of 32 atoms are at least n (not at N 600, n 32) */
    const int ns[] = {1, 2, 7, 8, 16, 32, 64, 256, 400, 699, 700, 2100, 5000};
    for (int trial = 0; trial < 128; trial++) {
        /* from trial 96: N not a multiple of 32 or 600; NaNs (ranked below every number),
         * a rising ramp (each block beats the last), a dead array without a dead atom */
        const int N = trial < 60 ? 700 : trial < 96 ? 4096 : trial % 8 < 4 ? 4133 : 600;
        int kind = trial < 96 ? -1 : trial % 4;
        int levels = trial % 3 == 0 ? 5 : (trial % 3 == 1 ? 50 : 0); /* many ties */
        int tiny = trial >= 90 && trial < 96; /* |a| within 4096 float steps of 1 */
        int use_dead = kind < 0 ? trial % 2 : kind >= 2;
        int live = 0;
        for (int j = 0; j < N; j++) {
            double u = gsl_ran_gaussian(r, 1.0);
            a[j] = levels ? (float)((int)(u * levels) / (double)levels) : (float)u;
            if (tiny)
                a[j] = (u < 0 ? -1.0f : 1.0f) *
                       (1.0f + FLT_EPSILON * (float)gsl_rng_uniform_int(r, 4096));
            if (kind == 1)
                a[j] = (float)(j + (levels ? 0 : u)) * (j % 2 ? 1.0f : -1.0f);
            if ((kind == 0 || kind == 3) && gsl_rng_uniform(r) < 0.05)
                a[j] = NAN;
            dead[j] = use_dead && kind != 2 ? (gsl_rng_uniform(r) < 0.2) : 0;
            if (!dead[j]) /* the screening order: NaN below every number */
                p[live++] = (struct pair){isnan(a[j]) ? -1.0f : fabsf(a[j]), j};
        }
        qsort(p, (size_t)live, sizeof *p, cmp_pair);
        for (size_t q = 0; q < sizeof ns / sizeof ns[0]; q++) {
            int n = ns[q];
            int want = n < live ? n : live;
            for (int sort = 0; sort < 2; sort++) {
                int got = fk_topn(a, use_dead ? dead : NULL, N, n, sort, out, work);
                ck_assert_int_eq(got, want);
                for (int i = 0; i < want; i++)
                    ref[i] = p[i].j;
                if (!sort)
                    qsort(ref, (size_t)want, sizeof *ref, cmp_int);
                for (int i = 0; i < want; i++)
                    ck_assert_msg(out[i] == ref[i], "trial %d n %d sort %d pos %d: %d vs %d",
                                  trial, n, sort, i, out[i], ref[i]);
            }
        }
    }
    ck_assert_int_eq(fk_topn(a, NULL, N_MAX, 0, 1, out, work), 0);
    free(a);
    free(work);
    free(dead);
    free(out);
    free(ref);
    free(p);
    gsl_rng_free(r);
}
END_TEST

/* ---- refinement ---- */

START_TEST(refine_vs_gsl)
{
    gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
    gsl_rng_set(r, 31);
    struct tdict t;
    tdict_random(&t, 128, 32, r);
    float x[32], a[128];
    for (int v = 0; v < 30; v++) {
        make_signal(&t, 6, 0.1, r, x);
        correlate(&t, x, a);
        struct fk_code c;
        int s = 1 + v % 8;
        ck_assert_int_eq(fk_omp_gram(&t.v, x, a, s, 0, t.work, &c), FK_OK);
        int k = c.k;
        /* oracle: (G_SS + Lambda) gamma = a_S by GSL Cholesky on double dot products */
        gsl_matrix *M = gsl_matrix_alloc((size_t)k, (size_t)k);
        gsl_vector *b = gsl_vector_alloc((size_t)k), *g = gsl_vector_alloc((size_t)k);
        double res[32];
        for (int p = 0; p < k; p++) {
            double as = 0;
            for (int i = 0; i < 32; i++)
                as += (double)t.atoms[c.idx[p] * 32 + i] * x[i];
            gsl_vector_set(b, (size_t)p, as);
            for (int q = 0; q < k; q++) {
                double s2 = 0;
                for (int i = 0; i < 32; i++)
                    s2 += (double)t.atoms[c.idx[p] * 32 + i] * t.atoms[c.idx[q] * 32 + i];
                if (p == q)
                    s2 += 1e-4 + 0.2 * s2;
                gsl_matrix_set(M, (size_t)p, (size_t)q, s2);
            }
        }
        ck_assert_int_eq(gsl_linalg_cholesky_decomp1(M), 0);
        ck_assert_int_eq(gsl_linalg_cholesky_solve(M, b, g), 0);
        struct fk_code c1 = c;
        ck_assert_int_eq(fk_refine(&t.v, x, 1e-4, 0.2, 1, &c1), FK_OK);
        for (int p = 0; p < k; p++)
            ck_assert_msg(fabs(c1.coef[p] - gsl_vector_get(g, (size_t)p)) <=
                              1e-10 * (1 + fabs(gsl_vector_get(g, (size_t)p))),
                          "coef %d: %.12g vs %.12g", p, c1.coef[p], gsl_vector_get(g, (size_t)p));
        double e2 = 0;
        for (int i = 0; i < 32; i++) {
            double rr = x[i];
            for (int p = 0; p < k; p++)
                rr -= c1.coef[p] * t.atoms[c.idx[p] * 32 + i];
            e2 += rr * rr;
        }
        ck_assert(fabs(c1.err2 - e2) <= 1e-12 * (1 + e2));
        ck_assert(c1.err2 >= c.err2 * (1 - 1e-9)); /* ridge never beats least squares */
        /* many damped steps converge to the least-squares solution */
        struct fk_code c3 = c;
        ck_assert_int_eq(fk_refine(&t.v, x, 1e-4, 0.2, 60, &c3), FK_OK);
        double ls[FK_SMAX];
        gsl_ls(&t, x, c.idx, k, ls, res);
        for (int p = 0; p < k; p++)
            ck_assert(fabs(c3.coef[p] - ls[p]) <= 1e-8 * (1 + fabs(ls[p])));
        gsl_matrix_free(M);
        gsl_vector_free(b);
        gsl_vector_free(g);
    }
    /* duplicates and k > m stay solvable (ridge is PD) */
    struct fk_code d = {.k = 3};
    d.idx[0] = 4;
    d.idx[1] = 4;
    d.idx[2] = 9;
    ck_assert_int_eq(fk_refine(&t.v, x, 1e-4, 0.2, 1, &d), FK_OK);
    ck_assert(isfinite(d.coef[0]) && fabs(d.coef[0] - d.coef[1]) < 1e-12);
    ck_assert_int_eq(fk_refine(&t.v, x, 1e-4, 0.2, 0, &d), FK_EINVAL);
    d.idx[2] = 128;
    ck_assert_int_eq(fk_refine(&t.v, x, 1e-4, 0.2, 1, &d), FK_EINVAL);
    tdict_free(&t);
    gsl_rng_free(r);
}
END_TEST

/* fk_refine_many (lanes of one support size in lockstep) gives the bits of one fk_refine or
 * fk_refine_gss call per code, in groups cut by a change of k, by a full set of lanes and by
 * a code that is not zero; an invalid code fails as the calls in order fail (the codes
 * before it refined, nothing after it), and so does a work buffer too small for k. */
START_TEST(refine_many_equals_single)
{
    gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
    gsl_rng_set(r, 211);
    struct tdict t;
    tdict_random(&t, 200, 32, r);
    enum { NV = 11 };
    static const int ks[NV] = {3, 3, 3, 5, 5, 5, 5, 5, 0, 2, 5}; /* 5 x 5: a full set + 1 */
    float x[NV][32];
    struct fk_code c0[NV], one[NV], many[NV];
    static double gss[NV][FK_SMAX * FK_SMAX];
    for (int v = 0; v < NV; v++) {
        make_signal(&t, 4, 0.05, r, x[v]);
        float a[200];
        correlate(&t, x[v], a);
        int32_t pool[200];
        int np = fk_topn(a, NULL, 200, 40, 0, pool, t.work);
        ck_assert_int_eq(fk_omp_pool(&t.v, x[v], a, pool, np, ks[v], t.work, &c0[v], gss[v]),
                         FK_OK);
        ck_assert_int_eq(c0[v].k, ks[v]);
    }
    double work[4 * (2 * 25 + 15)];
    size_t wd = sizeof work / sizeof *work;
    ck_assert_uint_ge(wd, fk_refine_work_doubles(FK_REFINE_LANES, 5));
    const float *xs[NV];
    struct fk_code *cs[NV];
    const double *gs[NV];
    for (int with_gss = 0; with_gss < 2; with_gss++) {
        for (int v = 0; v < NV; v++) {
            one[v] = many[v] = c0[v];
            xs[v] = x[v];
            cs[v] = &many[v];
            gs[v] = gss[v];
            if (ks[v] > 0)
                ck_assert_int_eq(with_gss ? fk_refine_gss(&t.v, x[v], 1e-4, 0.2, 3, &one[v],
                                                          gss[v])
                                          : fk_refine(&t.v, x[v], 1e-4, 0.2, 3, &one[v]),
                                 FK_OK);
        }
        ck_assert_int_eq(fk_refine_many(&t.v, NV, xs, 1e-4, 0.2, 3, cs, with_gss ? gs : NULL,
                                        work, wd),
                         FK_OK);
        for (int v = 0; v < NV; v++) {
            ck_assert_int_eq(many[v].k, one[v].k);
            ck_assert(memcmp(many[v].coef, one[v].coef, sizeof(double) * (size_t)ks[v]) == 0);
            ck_assert(memcmp(&many[v].err2, &one[v].err2, sizeof(double)) == 0);
            ck_assert(memcmp(&many[v].xx, &one[v].xx, sizeof(double)) == 0);
        }
    }
    /* an atom out of range in code 6: codes 0 .. 5 refined, 7 .. untouched */
    for (int v = 0; v < NV; v++)
        many[v] = c0[v];
    many[6].idx[1] = 200;
    ck_assert_int_eq(fk_refine_many(&t.v, NV, xs, 1e-4, 0.2, 3, cs, gs, work, wd), FK_EINVAL);
    for (int v = 0; v < NV; v++) {
        int refined = memcmp(many[v].coef, c0[v].coef, sizeof(double) * (size_t)ks[v]) != 0;
        ck_assert_int_eq(refined, v < 6);
    }
    ck_assert_int_eq(fk_refine_many(&t.v, NV, xs, 1e-4, 0.2, 3, cs, gs, work,
                                    fk_refine_work_doubles(1, 4)),
                     FK_EINVAL);
    ck_assert_int_eq(fk_refine_many(&t.v, NV, xs, 1e-4, 0.2, 0, cs, gs, work, wd), FK_EINVAL);
    tdict_free(&t);
    gsl_rng_free(r);
}
END_TEST

static Suite *sparse_suite(void)
{
    Suite *s = suite_create("sparse");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, omp_gram_vs_oracles);
    tcase_add_test(tc, omp_naive_vs_oracles);
    tcase_add_test(tc, omp_gram_equals_naive);
    tcase_add_test(tc, omp_zero_and_nonfinite);
    tcase_add_test(tc, omp_s_exceeds_m_and_live);
    tcase_add_test(tc, omp_duplicates_guard);
    tcase_add_test(tc, omp_precision_guard);
    tcase_add_test(tc, omp_premature_tol_determinism);
    tcase_add_test(tc, omp_batch_equals_single);
    tcase_add_test(tc, omp_naive_pool);
    tcase_add_test(tc, omp_pool_gram_vs_naive);
    tcase_add_test(tc, omp_pool2_equals_single);
    tcase_add_test(tc, correlate_and_gram);
    tcase_add_test(tc, correlate_to_within_rounding);
    tcase_add_test(tc, topn_vs_sort);
    tcase_add_test(tc, refine_vs_gsl);
    tcase_add_test(tc, refine_many_equals_single);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    gsl_set_error_handler_off();
    return fk_suite_run(sparse_suite());
}
