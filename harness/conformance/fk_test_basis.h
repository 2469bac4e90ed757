/* SPDX-License-Identifier: MIT
 * Seeded random model constants for the conformance suite and the unit suites that open
 * every codec with a struct fk_stream_env:
 *   FK_CAP_BASIS  a projection basis: one group of all the stream's heads (g = n_heads, so
 *                 that pca's default rank fits small head_dims), orthonormal rows (modified
 *                 Gram-Schmidt in double on Gaussian vectors), a random mean, a pre-RoPE
 *                 variant;
 *   FK_CAP_CALIB  a calibration (struct fk_calib) at the outlier fractions 0 and 0.01: key
 *                 thresholds lower = -(1.5 + |g|), upper = 1.5 + |g'| (g, g' unit Gaussian,
 *                 fp16), levels 2i / (2^b - 1) - 1 (even on [-1, 1]);
 * and the RoPE (interleaved, theta 10000) with positions 0 .. T-1 for both.
 */
#ifndef FK_TEST_BASIS_H
#define FK_TEST_BASIS_H

#include <gsl/gsl_randist.h>
#include <gsl/gsl_rng.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "core/fk_codec.h"
#include "kernels/fk_rope.h"
#include "kernels/fk_sparse.h"

struct fk_test_basis {
    struct fk_basis b, pre;      /* b.pre_rope = &pre */
    float *mean, *vec, *pmean, *pvec;
    double *eig;                 /* shared by every variant: descending 1/(j+1) */
    int32_t *pos;
    struct fk_rope rope;
    struct fk_calib cal[2];      /* K, V */
    struct fk_kvq_cal kvq[2][2]; /* [kind][fraction 0, 0.01] */
    float *cup, *clo;            /* [n_heads][m] key thresholds */
    float lev[4 + 8 + 16];       /* the even levels of 2, 3 and 4 bits */
};

/* n orthonormal rows of dim values (n <= dim) into u. Returns 0, or -1 out of memory. */
static inline int fk_test_orthonormal(gsl_rng *r, int n, int dim, float *u)
{
    double *w = malloc(sizeof(double) * (size_t)n * dim);
    if (!w)
        return -1;
    for (int i = 0; i < n; i++) {
        double *wi = w + (size_t)i * dim;
        for (int c = 0; c < dim; c++)
            wi[c] = gsl_ran_gaussian(r, 1);
        for (int pass = 0; pass < 2; pass++)
            for (int j = 0; j < i; j++) {
                double d = 0, *wj = w + (size_t)j * dim;
                for (int c = 0; c < dim; c++)
                    d += wi[c] * wj[c];
                for (int c = 0; c < dim; c++)
                    wi[c] -= d * wj[c];
            }
        double nn = 0;
        for (int c = 0; c < dim; c++)
            nn += wi[c] * wi[c];
        for (int c = 0; c < dim; c++) {
            wi[c] /= sqrt(nn); /* later rows are projected on the unit rows */
            u[(size_t)i * dim + c] = (float)wi[c];
        }
    }
    free(w);
    return 0;
}

static inline void fk_test_basis_free(struct fk_test_basis *t);

/* A basis for a stream of n_heads heads of head_dim m and T tokens. Returns 0, or -1 out
 * of memory (nothing left allocated). */
static inline int fk_test_basis_init(struct fk_test_basis *t, int n_heads, int m, int T,
                                      unsigned long seed)
{
    int dim = n_heads * m;
    gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
    if (r)
        gsl_rng_set(r, seed);
    t->mean = malloc(sizeof(float) * (size_t)dim);
    t->pmean = malloc(sizeof(float) * (size_t)dim);
    t->vec = malloc(sizeof(float) * 2 * (size_t)dim * dim);
    t->pvec = malloc(sizeof(float) * 2 * (size_t)dim * dim);
    t->eig = malloc(sizeof(double) * (size_t)dim);
    t->pos = malloc(sizeof(int32_t) * (size_t)(T > 0 ? T : 1));
    t->cup = malloc(sizeof(float) * (size_t)dim);
    t->clo = malloc(sizeof(float) * (size_t)dim);
    if (!r || !t->mean || !t->pmean || !t->vec || !t->pvec || !t->eig || !t->pos || !t->cup ||
        !t->clo) {
        if (r)
            gsl_rng_free(r);
        fk_test_basis_free(t);
        return -1;
    }
    for (int c = 0; c < dim; c++) {
        t->mean[c] = (float)gsl_ran_gaussian(r, 0.1);
        t->pmean[c] = (float)gsl_ran_gaussian(r, 0.1);
        t->eig[c] = 1.0 / (c + 1);
    }
    for (int v = 0; v < 4; v++)
        if (fk_test_orthonormal(r, dim, dim, (v < 2 ? t->vec : t->pvec) +
                                                 (size_t)(v % 2) * dim * dim) < 0) {
            gsl_rng_free(r);
            fk_test_basis_free(t);
            return -1;
        }
    for (int i = 0; i < T; i++)
        t->pos[i] = i;
    for (int c = 0; c < dim; c++) {
        t->cup[c] = fk_fp16_decode(fk_fp16_encode((float)(1.5 + fabs(gsl_ran_gaussian(r, 1)))));
        t->clo[c] = fk_fp16_decode(fk_fp16_encode((float)-(1.5 + fabs(gsl_ran_gaussian(r, 1)))));
    }
    gsl_rng_free(r);
    for (int b = FK_KVQ_BITS_MIN, o = 0; b <= FK_KVQ_BITS_MAX; o += 1 << b, b++)
        for (int i = 0; i < 1 << b; i++)
            t->lev[o + i] = (float)(2.0 * i / ((1 << b) - 1) - 1);
    for (int k = 0; k < 2; k++) {
        for (int f = 0; f < 2; f++) {
            struct fk_kvq_cal *q = &t->kvq[k][f];
            *q = (struct fk_kvq_cal){.outliers = f ? 0.01 : 0, .upper = k ? NULL : t->cup,
                                     .lower = k ? NULL : t->clo};
            for (int b = FK_KVQ_BITS_MIN, o = 0; b <= FK_KVQ_BITS_MAX; o += 1 << b, b++)
                for (int g = 0; g < 2; g++)
                    q->lut[b - FK_KVQ_BITS_MIN][g] =
                        g == FK_KVQ_ROW || k == 1 /* values */ ? t->lev + o : NULL;
        }
        t->cal[k] = (struct fk_calib){.n_kv_heads = n_heads, .head_dim = m, .sinks = 0,
                                      .n_kvq = 2, .kvq = t->kvq[k]};
    }
    t->pre = (struct fk_basis){.group = n_heads, .n_groups = 1, .dim = dim, .n_comp = dim,
                               .mean = t->pmean, .vec = {t->pvec, t->pvec + (size_t)dim * dim},
                               .eig = {t->eig, t->eig}};
    t->b = t->pre;
    t->b.mean = t->mean;
    t->b.vec[0] = t->vec;
    t->b.vec[1] = t->vec + (size_t)dim * dim;
    t->b.pre_rope = &t->pre;
    t->rope = (struct fk_rope){.theta = 10000, .layout = FK_ROPE_INTERLEAVED};
    return 0;
}

/* Sets env's basis (FK_CAP_BASIS) or calibration (FK_CAP_CALIB), positions and rope for
 * such a codec (else leaves env alone). */
static inline void fk_test_basis_env(const struct fk_test_basis *t,
                                     const struct fk_codec_ops *ops, struct fk_stream_env *env)
{
    if (!(ops->caps & (FK_CAP_BASIS | FK_CAP_CALIB)))
        return;
    if (ops->caps & FK_CAP_BASIS)
        env->basis = &t->b;
    if (ops->caps & FK_CAP_CALIB)
        env->calib = &t->cal[env->kind];
    env->positions = t->pos;
    env->rope = &t->rope;
}

static inline void fk_test_basis_free(struct fk_test_basis *t)
{
    free(t->mean);
    free(t->pmean);
    free(t->vec);
    free(t->pvec);
    free(t->eig);
    free(t->pos);
    free(t->cup);
    free(t->clo);
    t->cup = t->clo = NULL;
    t->mean = t->pmean = t->vec = t->pvec = NULL;
    t->eig = NULL;
    t->pos = NULL;
}

#endif
