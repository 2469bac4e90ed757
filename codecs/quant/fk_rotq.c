/* SPDX-License-Identifier: MIT
 * rotq: rotated quantisation (TurboQuant and its family; spec families-quant-2026.md 1.1 and
 * 1.2). Each vector x of one (layer, kind) is rotated by a seeded orthogonal matrix Pi, then
 * each coordinate is quantised on its own:
 *   quantiser = lloyd  TurboQuant_mse: u = x / ||x||, y = Pi u, idx_j = the number of
 *                      codebook midpoints <= y_j (ties up), stored with fp16(||x||);
 *                      x_hat = ||x||_16 Pi^T c[idx] (norm correction, nc: c / ||c|| first).
 *                      The codebook (codebook): beta = the Lloyd-Max centroids of one
 *                      coordinate of a uniform point of the sphere S^(d-1) (density
 *                      (1 - x^2)^((d-3)/2)), gauss = those of N(0, 1/d), vllm = vLLM's
 *                      solve_lloyd_max (the Gaussian approximation, 200 trapezoid steps per
 *                      cell, at most 200 iterations, float32).
 *   quantiser = uniform  vLLM's value path: lo, s = (max - lo) / (2^b - 1) (s >= 1e-8) of the
 *                      rotated vector, q_j = trunc((y_j - lo) / s + 0.5) clamped, fp16 s and lo
 *                      stored and used to decode.
 *   keys = prod        TurboQuant_prod for keys: b - 1 bits of the lloyd quantiser, then the
 *                      1-bit QJL sketch z = sign(S r) of the unit residual r (S Gaussian,
 *                      seeded), its norm gamma in fp16: x_hat = ||x|| (Pi^T c[idx] +
 *                      sqrt(pi/2) / d gamma S^T z), unbiased for inner products.
 * Rotations (rotation): hadamard = H diag(s), Sylvester-Hadamard with seeded random signs
 * (head_dim a power of two); fixed = H alone (vLLM's, no signs); haar = a dense Haar-random
 * orthogonal matrix (Gram-Schmidt of a seeded Gaussian matrix, any head_dim). The rotation,
 * the codebook and S are model constants (bytes_model, fp16 entries): seeded per (layer,
 * kind) from the option rot_seed. Bytes per row: ceil(b d / 8) + 2 (lloyd), ceil(b d / 8) + 4
 * (uniform), ceil((b - 1) d / 8) + ceil(d / 8) + 4 (prod keys). Lossy, dense; a row's code
 * depends on no other row, up to float rounding: the codebook path codes an event's rows in
 * batches of RQ_NB, the dense products (haar's Pi and Pi^T, the sketch's S and S^T) one SGEMM
 * per batch, which may round a row's products differently with its place in the batch (about
 * 1e-6 relative at most; the same events give the same bits).
 */
#include <gsl/gsl_randist.h>
#include <gsl/gsl_rng.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/fk_err.h"
#include "core/fk_codec.h"
#include "kernels/fk_kvfmt.h"
#include "kernels/fk_sparse.h"
#include "quant/fk_quant_rows.h"

enum { Q_LLOYD, Q_UNIFORM };
enum { K_MSE, K_PROD };
enum { R_HAAR, R_HADAMARD, R_FIXED };
enum { C_BETA, C_GAUSS, C_VLLM };

static const char *const quant_names[] = {"lloyd", "uniform", NULL};
static const char *const keys_names[] = {"mse", "prod", NULL};
static const char *const rot_names[] = {"haar", "hadamard", "fixed", NULL};
static const char *const cb_names[] = {"beta", "gauss", "vllm", NULL};

struct rotq_opts {
    struct fk_common_opts c;     /* n_b, a_len (coef is not used) */
    int bits, quantiser, keys, rotation, codebook, nc, seed;
};

static const struct fk_option rotq_options[] = {
    {"n_b", FK_OPT_INT, offsetof(struct rotq_opts, c.n_b), 0, 0, 1 << 24, NULL,
     "exact window of the most recent tokens (0: every token quantised)"},
    {"a_len", FK_OPT_INT, offsetof(struct rotq_opts, c.a_len), 1, 1, 1 << 16, NULL,
     "tokens compressed per eviction event"},
    {"coef", FK_OPT_ENUM, offsetof(struct rotq_opts, c.coef), FK_COEF_FP8, 0, 2,
     fk_coef_names, "not used"},
    {"bits", FK_OPT_INT, offsetof(struct rotq_opts, bits), 4, 1, 8, NULL,
     "bits per coordinate (prod keys: b - 1 of them for the codebook, 1 for QJL)"},
    {"quantiser", FK_OPT_ENUM, offsetof(struct rotq_opts, quantiser), Q_LLOYD, 0, 1,
     quant_names, "per coordinate: lloyd (TurboQuant_mse codebook, fp16 norm) | uniform "
     "(min and scale of the rotated vector, fp16; vLLM's value path)"},
    {"keys", FK_OPT_ENUM, offsetof(struct rotq_opts, keys), K_MSE, 0, 1, keys_names,
     "keys: mse | prod (TurboQuant_prod: b - 1 bit codebook plus the QJL sign sketch)"},
    {"rotation", FK_OPT_ENUM, offsetof(struct rotq_opts, rotation), R_HAAR, 0, 2,
     rot_names, "haar (dense random orthogonal, the paper's; any head_dim) | hadamard "
     "(random signs; head_dim a power of two) | fixed (vLLM's, no signs)"},
    {"codebook", FK_OPT_ENUM, offsetof(struct rotq_opts, codebook), C_BETA, 0, 2, cb_names,
     "lloyd: beta (exact for the sphere's coordinates) | gauss (N(0, 1/d)) | vllm (its "
     "solve_lloyd_max, float32)"},
    {"nc", FK_OPT_BOOL, offsetof(struct rotq_opts, nc), 0, 0, 1, NULL,
     "norm correction of keys (vLLM's _nc presets): the decoded rotated key to unit norm"},
    {"rot_seed", FK_OPT_INT, offsetof(struct rotq_opts, seed), 1, 0, 1 << 30, NULL,
     "seed of the rotation and the QJL matrix (per layer and kind)"},
    {NULL, 0, 0, 0, 0, 0, NULL, NULL},
};

#define RQ_PI 3.14159265358979323846

static int pow2(int n)
{
    return n > 0 && (n & (n - 1)) == 0;
}

static int rotq_check(const void *opts, int head_dim, int n_atoms)
{
    (void)n_atoms;
    const struct rotq_opts *o = opts;
    if (head_dim > 0 && o->rotation != R_HAAR && !pow2(head_dim))
        return fk_err(FK_ECONFIG, "rotation = %s: the Hadamard matrix needs head_dim a power "
                      "of two (head_dim %d; rotation = haar works at any)",
                      rot_names[o->rotation], head_dim);
    if (o->keys == K_PROD && o->quantiser != Q_LLOYD)
        return fk_err(FK_ECONFIG, "keys = prod: TurboQuant_prod builds on the lloyd "
                      "quantiser (quantiser = uniform)");
    return FK_OK;
}

/* ---- codebooks ------------------------------------------------------------------------ */

/* Lloyd-Max centroids c[0..L-1] (ascending) of the symmetric density dens on [-hi, hi]:
 * the cumulative mass and first moment tabulated on a grid of G points (trapezoids) and
 * read between the points with the density interpolated linearly, so that they vary
 * smoothly with the cell edges; then the centroid condition iterated to its fixed point
 * (unique for log-concave densities; Lloyd's iteration converges slowly at 16 levels). */
#define LG 200001
struct cum {
    double hi, h, *f, *c0, *c1;  /* density and cumulative mass, first moment at the points */
};

static double cum_at(const struct cum *cm, const double *tab, int moment, double x)
{
    if (x <= -cm->hi)
        return 0;
    if (x >= cm->hi)
        return tab[LG - 1];
    double pos = (x + cm->hi) / cm->h;
    int i = (int)pos;
    i = i > LG - 2 ? LG - 2 : i;
    double t = (x + cm->hi) - i * cm->h, xi = -cm->hi + i * cm->h;
    double fi = cm->f[i], fx = fi + (cm->f[i + 1] - fi) * t / cm->h;
    if (!moment)
        return tab[i] + t * (fi + fx) / 2;
    return tab[i] + t * (fi * xi + fx * x) / 2;
}

static void lloyd_grid(double (*dens)(double x, double p), double p, double hi, int L,
                       double *c)
{
    struct cum cm = {.hi = hi, .h = 2 * hi / (LG - 1)};
    cm.f = malloc(sizeof(double) * LG);
    cm.c0 = malloc(sizeof(double) * LG);
    cm.c1 = malloc(sizeof(double) * LG);
    for (int k = 0; k < L; k++)
        c[k] = 0.5 * hi * (2.0 * (k + 0.5) / L - 1.0);
    if (!cm.f || !cm.c0 || !cm.c1) {
        free(cm.f), free(cm.c0), free(cm.c1);
        return;
    }
    for (int i = 0; i < LG; i++)
        cm.f[i] = dens(-hi + i * cm.h, p);
    cm.c0[0] = cm.c1[0] = 0;
    for (int i = 1; i < LG; i++) {
        double x0 = -hi + (i - 1) * cm.h, x1 = -hi + i * cm.h;
        cm.c0[i] = cm.c0[i - 1] + cm.h * (cm.f[i - 1] + cm.f[i]) / 2;
        cm.c1[i] = cm.c1[i - 1] + cm.h * (cm.f[i - 1] * x0 + cm.f[i] * x1) / 2;
    }
    for (int it = 0; it < 200000; it++) {
        double delta = 0, lo0 = 0, lo1 = 0;
        for (int k = 0; k < L; k++) {
            double up0 = cm.c0[LG - 1], up1 = cm.c1[LG - 1];
            if (k < L - 1) {
                double mid = 0.5 * (c[k] + c[k + 1]);
                up0 = cum_at(&cm, cm.c0, 0, mid);
                up1 = cum_at(&cm, cm.c1, 1, mid);
            }
            double w = up0 - lo0, nc = w > 0 ? (up1 - lo1) / w : c[k];
            delta = fmax(delta, fabs(nc - c[k]));
            c[k] = nc;
            lo0 = up0;
            lo1 = up1;
        }
        if (delta < 1e-15 * hi)
            break;
    }
    free(cm.f), free(cm.c0), free(cm.c1);
}

static double dens_beta(double x, double d)
{
    double v = 1.0 - x * x;
    return v > 0 ? pow(v, (d - 3.0) / 2.0) : 0.0;
}

static double dens_gauss(double x, double d)
{
    return exp(-0.5 * d * x * x);
}

/* vLLM's solve_lloyd_max(d, bits): the Gaussian N(0, 1/d), 2^b centroids started evenly in
 * [-3.5 sigma, 3.5 sigma], cells cut at the midpoints and the outer ones at 3 lo and 3 hi,
 * each centroid the trapezoid (200 steps) integral of x pdf over pdf on its cell (kept when
 * the mass is <= 1e-15), up to 200 iterations, stopping when the largest move is < 1e-10
 * with the previous iterate; float32. */
static void lloyd_vllm(int d, int L, double *c)
{
    double sigma = 1.0 / sqrt((double)d), lo = -3.5 * sigma, hi = 3.5 * sigma;
    double cur[256], prev[256], b[257];
    for (int k = 0; k < L; k++)
        cur[k] = lo + (hi - lo) * (k + 0.5) / L;
    for (int it = 0; it < 200; it++) {
        memcpy(prev, cur, sizeof(double) * (size_t)L);
        b[0] = 3 * lo;
        b[L] = 3 * hi;
        for (int k = 1; k < L; k++)
            b[k] = 0.5 * (cur[k - 1] + cur[k]);
        double mv = 0;
        for (int k = 0; k < L; k++) {
            double a = b[k], e = b[k + 1], step = (e - a) / 200, num = 0, den = 0;
            for (int i = 0; i <= 200; i++) {
                double x = a + i * step,
                       f = exp(-0.5 * x * x / (sigma * sigma)) / (sigma * sqrt(2 * RQ_PI));
                double w = (i == 0 || i == 200) ? 0.5 : 1.0;
                num += w * x * f;
                den += w * f;
            }
            num *= step;
            den *= step;
            double nc = den > 1e-15 ? num / den : cur[k];
            mv = fmax(mv, fabs(nc - cur[k]));
            cur[k] = nc;
        }
        if (mv < 1e-10) {
            memcpy(cur, prev, sizeof(double) * (size_t)L);
            break;
        }
    }
    for (int k = 0; k < L; k++)
        c[k] = (float)cur[k];
}

/* The codebooks computed so far (each stream group of a sweep asks for the same few). */
static struct {
    int which, d, b;
    float cent[256];
} cb_cache[32];
static int cb_n;
static pthread_mutex_t cb_lock = PTHREAD_MUTEX_INITIALIZER;

/* The codebook of b bits for dimension d: centroids and midpoints, float32. */
static void codebook(int which, int d, int b, float *cent, float *mid)
{
    int L = 1 << b, hit = 0;
    pthread_mutex_lock(&cb_lock);
    for (int i = 0; i < cb_n && !hit; i++)
        if (cb_cache[i].which == which && cb_cache[i].d == d && cb_cache[i].b == b) {
            memcpy(cent, cb_cache[i].cent, sizeof(float) * (size_t)L);
            hit = 1;
        }
    pthread_mutex_unlock(&cb_lock);
    if (hit) {
        for (int k = 0; k + 1 < L; k++)
            mid[k] = (cent[k] + cent[k + 1]) * 0.5f;
        return;
    }
    double c[256];
    if (which == C_VLLM) {
        lloyd_vllm(d, L, c);
    } else if (which == C_GAUSS) {
        lloyd_grid(dens_gauss, d, 12.0 / sqrt((double)d), L, c);
    } else {
        lloyd_grid(dens_beta, d, 1.0, L, c);
    }
    for (int k = 0; k < L; k++)
        cent[k] = (float)c[k];
    for (int k = 0; k + 1 < L; k++) /* vLLM: (c_k + c_k+1) / 2 in float32 */
        mid[k] = (cent[k] + cent[k + 1]) * 0.5f;
    pthread_mutex_lock(&cb_lock);
    if (cb_n < 32) {
        cb_cache[cb_n].which = which;
        cb_cache[cb_n].d = d;
        cb_cache[cb_n].b = b;
        memcpy(cb_cache[cb_n].cent, cent, sizeof(float) * (size_t)L);
        cb_n++;
    }
    pthread_mutex_unlock(&cb_lock);
}

/* ---- the state ------------------------------------------------------------------------ */

struct rotq {
    struct rotq_opts o;
    struct fkr_rows rows;        /* the rows as read back */
    int m, kind, b_mse, prod;
    float *sign;                 /* [m] hadamard: the random signs */
    float *Q, *Qt;               /* [m][m] haar: rows of Pi, and Pi^T */
    float *S;                    /* [m][m] prod keys: the Gaussian sketch */
    float cent[256], mid[256];
    double *u, *y, *r, *t;       /* [m] scratch */
    float *fy;                   /* [m] */
    float *fb;                   /* [2 m] the SGEMVs' vectors */
    /* a batch of RQ_NB rows of the codebook path (the dense products as SGEMMs) */
    float *bu, *bv;              /* [RQ_NB][m] floats: the rows rotated, and back */
    double *bd, *bm, *bn;        /* [RQ_NB][m] unit rows, their mse part; [RQ_NB] norms */
};

enum { RQ_NB = 32 };

static void rotq_close(void *state)
{
    struct rotq *q = state;
    if (!q)
        return;
    fkr_free(&q->rows);
    free(q->sign), free(q->Q), free(q->Qt), free(q->S);
    free(q->u), free(q->y), free(q->r), free(q->t), free(q->fy), free(q->fb);
    free(q->bu), free(q->bv), free(q->bd), free(q->bm), free(q->bn);
    free(q);
}

/* t = A v (A [m][m] float, row-major): one SGEMV (the BLAS's) on v rounded to float (the
 * quantiser reads the rotated coordinates as floats). fb: [2 m] floats of scratch. */
static void matvec(const float *A, const double *v, int m, double *t, float *fb)
{
    for (int j = 0; j < m; j++)
        fb[j] = (float)v[j];
    fk_rotate_dense(A, m, fb, fb + m);
    for (int i = 0; i < m; i++)
        t[i] = fb[m + i];
}

/* The transpose of A [m][m] (float), or NULL when out of memory. */
static float *transposed(const float *A, int m)
{
    float *T = malloc(sizeof(float) * (size_t)m * m);
    for (int i = 0; T && i < m; i++)
        for (int j = 0; j < m; j++)
            T[(size_t)j * m + i] = A[(size_t)i * m + j];
    return T;
}

/* y = Pi u (fw) or u = Pi^T y (!fw), in place on v (m doubles). */
static void rotate(const struct rotq *q, double *v, int fw)
{
    int m = q->m;
    if (q->o.rotation == R_HAAR) {
        matvec(fw ? q->Q : q->Qt, v, m, q->t, q->fb);
        memcpy(v, q->t, sizeof(double) * (size_t)m);
        return;
    }
    float *f = q->fy;
    for (int i = 0; i < m; i++)
        f[i] = (float)(fw && q->sign ? v[i] * q->sign[i] : v[i]);
    fk_hadamard(f, m); /* H is symmetric: H^T = H */
    for (int i = 0; i < m; i++)
        v[i] = !fw && q->sign ? (double)f[i] * q->sign[i] : (double)f[i];
}

static int rotq_open(const void *opts, const struct fk_stream_env *env, void **state)
{
    struct rotq *q = calloc(1, sizeof *q);
    if (!q)
        return fk_err(FK_ENOMEM, "out of memory");
    *state = q;
    memcpy(&q->o, opts, sizeof q->o);
    q->m = env->head_dim;
    q->kind = env->kind;
    FK_TRY(rotq_check(opts, q->m, 0));
    q->prod = q->kind == 0 && q->o.keys == K_PROD;
    q->b_mse = q->prod ? q->o.bits - 1 : q->o.bits;
    int m = q->m;
    FK_TRY(fkr_init(&q->rows, env, "rotq"));
    q->u = malloc(sizeof(double) * (size_t)m);
    q->y = malloc(sizeof(double) * (size_t)m);
    q->r = malloc(sizeof(double) * (size_t)m);
    q->t = malloc(sizeof(double) * (size_t)m);
    q->fy = malloc(sizeof(float) * (size_t)m);
    q->fb = malloc(sizeof(float) * 2 * (size_t)m);
    q->bu = malloc(sizeof(float) * RQ_NB * (size_t)m);
    q->bv = malloc(sizeof(float) * RQ_NB * (size_t)m);
    q->bd = malloc(sizeof(double) * RQ_NB * (size_t)m);
    q->bm = malloc(sizeof(double) * RQ_NB * (size_t)m);
    q->bn = malloc(sizeof(double) * RQ_NB);
    if (!q->u || !q->y || !q->r || !q->t || !q->fy || !q->fb || !q->bu || !q->bv || !q->bd ||
        !q->bm || !q->bn)
        return fk_err(FK_ENOMEM, "out of memory (rotq state)");
    if (q->b_mse > 0 && q->o.quantiser == Q_LLOYD)
        codebook(q->o.codebook, m, q->b_mse, q->cent, q->mid);
    /* the model constants of this (layer, kind), from the seed */
    gsl_rng *g = gsl_rng_alloc(gsl_rng_mt19937);
    if (!g)
        return fk_err(FK_ENOMEM, "out of memory (rotq rng)");
    gsl_rng_set(g, (unsigned long)q->o.seed * 1000003ul + (unsigned long)env->layer * 2u +
                       (unsigned long)env->kind);
    int rc = FK_OK;
    if (q->o.rotation == R_HADAMARD) {
        if (!(q->sign = malloc(sizeof(float) * (size_t)m)))
            rc = fk_err(FK_ENOMEM, "out of memory (rotq signs)");
        for (int i = 0; rc == FK_OK && i < m; i++)
            q->sign[i] = gsl_rng_uniform(g) < 0.5 ? -1.0f : 1.0f;
    } else if (q->o.rotation == R_HAAR) {
        double *G = malloc(sizeof(double) * (size_t)m * m);
        if (!G || !(q->Q = malloc(sizeof(float) * (size_t)m * m)))
            rc = fk_err(FK_ENOMEM, "out of memory (rotq rotation)");
        for (size_t i = 0; rc == FK_OK && i < (size_t)m * m; i++)
            G[i] = gsl_ran_gaussian(g, 1.0);
        /* rows of Pi: Gram-Schmidt of the Gaussian rows, twice (R's diagonal positive:
         * the sign-fixed QR of the spec) */
        for (int i = 0; rc == FK_OK && i < m; i++) {
            double *gi = G + (size_t)i * m;
            for (int pass = 0; pass < 2; pass++)
                for (int k = 0; k < i; k++) {
                    double *gk = G + (size_t)k * m, d = 0;
                    for (int j = 0; j < m; j++)
                        d += gi[j] * gk[j];
                    for (int j = 0; j < m; j++)
                        gi[j] -= d * gk[j];
                }
            double nn = 0;
            for (int j = 0; j < m; j++)
                nn += gi[j] * gi[j];
            nn = sqrt(nn);
            for (int j = 0; j < m; j++) {
                gi[j] /= nn;
                q->Q[(size_t)i * m + j] = (float)gi[j];
            }
        }
        free(G);
        if (rc == FK_OK && !(q->Qt = transposed(q->Q, m)))
            rc = fk_err(FK_ENOMEM, "out of memory (rotq rotation)");
    }
    if (rc == FK_OK && q->prod) {
        if (!(q->S = malloc(sizeof(float) * (size_t)m * m)))
            rc = fk_err(FK_ENOMEM, "out of memory (rotq sketch)");
        for (size_t i = 0; rc == FK_OK && i < (size_t)m * m; i++)
            q->S[i] = (float)gsl_ran_gaussian(g, 1.0);
    }
    gsl_rng_free(g);
    return rc;
}

static double row_bytes(const struct rotq *q)
{
    int m = q->m, b = q->o.bits;
    if (q->prod)
        return (double)((q->b_mse * m + 7) / 8 + (m + 7) / 8 + 4);
    return (double)((b * m + 7) / 8 + (q->o.quantiser == Q_UNIFORM ? 4 : 2));
}

/* The uniform quantiser of the rotated row: its min and scale (fp16), codes. */
static void code_row_uniform(struct rotq *q, const float *x, float *xh)
{
    int m = q->m;
    {
        for (int j = 0; j < m; j++)
            q->y[j] = x[j];
        rotate(q, q->y, 1);
        int top = (1 << q->o.bits) - 1;
        float lo = (float)q->y[0], hi = lo;
        for (int j = 0; j < m; j++) {
            float v = (float)q->y[j];
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
        }
        float s = (hi - lo) / (float)top;
        s = s > 1e-8f ? s : 1e-8f;
        float s16 = fk_fp16_decode(fk_fp16_encode(s)), lo16 = fk_fp16_decode(fk_fp16_encode(lo));
        for (int j = 0; j < m; j++) {
            int c = (int)((float)((float)q->y[j] - lo) / s + 0.5f);
            c = c < 0 ? 0 : c > top ? top : c;
            q->y[j] = (float)c * s16 + lo16;
        }
        rotate(q, q->y, 0);
        for (int j = 0; j < m; j++)
            xh[j] = (float)q->y[j];
    }
}

/* The rows A [n][m] (floats) rotated into B: Pi a (fw) or Pi^T a: one SGEMM for the dense
 * (Haar) rotation, the fast transform row by row otherwise. */
static void rotate_rows(struct rotq *q, const float *A, int n, float *B, int fw)
{
    int m = q->m;
    if (q->o.rotation == R_HAAR) { /* B = A Pi^T (fw) or A Pi */
        fk_rotate_dense_rows(q->Q, m, A, n, B, !fw);
        return;
    }
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < m; j++)
            q->y[j] = A[(size_t)i * m + j];
        rotate(q, q->y, fw);
        for (int j = 0; j < m; j++)
            B[(size_t)i * m + j] = (float)q->y[j];
    }
}

/* The codebook path (TurboQuant_mse, and _prod for keys) of n <= RQ_NB rows x into xh[i]:
 * u = x / ||x||; y = Pi u (u as floats); each y_j to its nearest centroid (ties up), for nc
 * keys rescaled to unit norm; mse = Pi^T c; prod: the residual r = u - mse sketched,
 * z = sign(S r) (sign(0) = +1), mse += sqrt(pi / 2) / m gamma S^T z with gamma = ||r|| in fp16;
 * x_hat = ||x||_fp16 mse. The dense products are SGEMMs over the batch. */
static void code_rows_lloyd(struct rotq *q, const float *X, int n, float *const *xh)
{
    int m = q->m, L = 1 << q->b_mse;
    double *U = q->bd, *MSE = q->bm;
    for (int i = 0; i < n; i++) {
        const float *x = X + (size_t)i * m;
        double nn = 0;
        for (int j = 0; j < m; j++)
            nn += (double)x[j] * x[j];
        nn = sqrt(nn);
        q->bn[i] = nn;
        for (int j = 0; j < m; j++) {
            U[(size_t)i * m + j] = nn > 0 ? x[j] / nn : 0.0;
            q->bu[(size_t)i * m + j] = (float)U[(size_t)i * m + j];
        }
    }
    if (q->b_mse > 0) {
        rotate_rows(q, q->bu, n, q->bv, 1);
        for (int i = 0; i < n; i++) {
            float *y = q->bv + (size_t)i * m;
            double cc = 0;
            for (int j = 0; j < m; j++) {
                int idx = 0;
                for (int k = 0; k + 1 < L; k++) /* midpoints at or below y: ties up */
                    idx += y[j] >= q->mid[k];
                y[j] = q->cent[idx];
                cc += (double)y[j] * y[j];
            }
            if (q->o.nc && q->kind == 0 && cc > 0) {
                double sc = 1.0 / sqrt(cc + 1e-16);
                for (int j = 0; j < m; j++)
                    y[j] = (float)(y[j] * sc);
            }
        }
        rotate_rows(q, q->bv, n, q->bu, 0);
        for (size_t e = 0; e < (size_t)n * m; e++)
            MSE[e] = q->bu[e];
    } else {
        memset(MSE, 0, sizeof(double) * (size_t)n * m);
    }
    if (q->prod) { /* QJL of the residuals r = u - mse: Z = R S^T, then sign(Z) S */
        for (int i = 0; i < n; i++) {
            double g2 = 0;
            for (int j = 0; j < m; j++) {
                double r = U[(size_t)i * m + j] - MSE[(size_t)i * m + j];
                q->bu[(size_t)i * m + j] = (float)r;
                g2 += r * r;
            }
            U[(size_t)i * m] = g2; /* (row i of U is read no more) */
        }
        fk_rotate_dense_rows(q->S, m, q->bu, n, q->bv, 0);
        for (size_t e = 0; e < (size_t)n * m; e++)
            q->bv[e] = q->bv[e] >= 0 ? 1.0f : -1.0f;
        fk_rotate_dense_rows(q->S, m, q->bv, n, q->bu, 1);
        for (int i = 0; i < n; i++) {
            float gamma16 = fk_fp16_decode(fk_fp16_encode((float)sqrt(U[(size_t)i * m])));
            double k = sqrt(RQ_PI / 2) / m * gamma16;
            for (int j = 0; j < m; j++)
                MSE[(size_t)i * m + j] += k * q->bu[(size_t)i * m + j];
        }
    }
    for (int i = 0; i < n; i++) {
        float n16 = fk_fp16_decode(fk_fp16_encode((float)q->bn[i]));
        for (int j = 0; j < m; j++)
            xh[i][j] = q->bn[i] > 0 ? (float)(n16 * MSE[(size_t)i * m + j]) : 0.0f;
    }
}

static int rotq_encode(void *state, const struct fk_event *ev, struct fk_vec_out *out)
{
    struct rotq *q = state;
    FK_TRY(fkr_check(&q->rows, "rotq", ev, 1));
    float rb = (float)row_bytes(q);
    float *xh[RQ_NB];
    for (int i0 = 0; i0 < ev->n; i0 += RQ_NB) { /* batches of RQ_NB rows */
        int n = ev->n - i0 < RQ_NB ? ev->n - i0 : RQ_NB;
        const float *X = ev->x + (size_t)i0 * q->m;
        for (int i = 0; i < n; i++)
            xh[i] = fkr_slot(&q->rows, ev->head[i0 + i], ev->token[i0 + i]);
        if (q->o.quantiser == Q_UNIFORM)
            for (int i = 0; i < n; i++)
                code_row_uniform(q, X + (size_t)i * q->m, xh[i]);
        else
            code_rows_lloyd(q, X, n, xh);
        for (int i = 0; i < n; i++)
            fkr_done(&q->rows, ev->head[i0 + i], ev->token[i0 + i], X + (size_t)i * q->m, rb,
                     &out[i0 + i]);
    }
    return FK_OK;
}

static int rotq_reconstruct(const void *state, int head, int token, float *out)
{
    const struct rotq *q = state;
    return fkr_reconstruct(&q->rows, "rotq", head, token, out);
}

static void rotq_stats(const void *state, struct fk_stream_stats *st)
{
    const struct rotq *q = state;
    memset(st, 0, sizeof *st);
    st->bytes_codes = fkr_rows_stored(&q->rows) * row_bytes(q);
    double m = q->m, model = 0;
    if (q->o.rotation == R_HAAR)
        model += 2 * m * m; /* the rotation, fp16 */
    else if (q->o.rotation == R_HADAMARD)
        model += (double)((q->m + 7) / 8); /* its signs */
    if (q->o.quantiser == Q_LLOYD && q->b_mse > 0)
        model += 2.0 * (1 << q->b_mse); /* the codebook, fp16 */
    if (q->prod)
        model += 2 * m * m; /* S, fp16 */
    st->bytes_model = model;
}

const struct fk_codec_ops fk_codec_rotq = {
    .name = "rotq",
    .summary = "rotated quantisation: a seeded Hadamard or Haar rotation, then TurboQuant's "
               "Lloyd-Max codebook (or vLLM's min/scale), prod keys with the QJL sketch",
    .opts_size = sizeof(struct rotq_opts),
    .options = rotq_options,
    .caps = FK_CAP_SKIPS,
    .check = rotq_check,
    .open = rotq_open,
    .encode = rotq_encode,
    .reconstruct = rotq_reconstruct,
    .stats = rotq_stats,
    .close = rotq_close,
};
