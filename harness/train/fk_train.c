/* SPDX-License-Identifier: MIT
 * Dictionary training (see fk_train.h).
 */
#include "common/fk_clock.h"
#include "train/fk_train.h"

#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/fk_err.h"
#include "formats/fk_dict.h"
#include "kernels/fk_blas.h"
#include "kernels/fk_sparse.h"

int fk_train_rng_pick(uint64_t seed, long n, long k, long *out);
int fk_train_rng_gauss(uint64_t seed, long count, float *out);
int fk_train_rng_perm(uint64_t seed, long n, long *out);

#define BLK 256

void fk_train_defaults(struct fk_train_opts *o)
{
    *o = (struct fk_train_opts){.n_atoms = 4096, .s = 8, .epochs = 8, .method = FK_TRAIN_BCD,
                                .seed = 1, .heldout_frac = 0.1, .max_train = 0, .lr = 1e-3,
                                .batch = 1024, .jobs = 1};
}

static struct fk_gram_row gram_row(void *ctx, int j, float *scratch)
{
    const struct fk_base_dict *b = ctx;
    (void)scratch;
    return (struct fk_gram_row){.head = b->gram + (size_t)j * b->n_atoms};
}

static void normalise(float *a, int m)
{
    double nn = 0;
    for (int i = 0; i < m; i++)
        nn += (double)a[i] * a[i];
    nn = sqrt(nn);
    if (nn > 0)
        for (int i = 0; i < m; i++)
            a[i] = (float)(a[i] / nn);
}

/* OMP codes of x[0..n) with the atoms (Gram mode). codes may be NULL (errors only). */
static int code_all(const float *atoms, int N, int m, int s, const float *x, long n,
                    struct fk_code *codes, double *errs)
{
    float *gram = NULL;
    FK_TRY(fk_gram_build(atoms, N, m, &gram));
    struct fk_base_dict b = {.n_atoms = N, .m = m, .atoms = atoms, .gram = gram};
    struct fk_dict_view v = {.m = m, .n_atoms = N, .atoms = atoms, .gram_row = gram_row,
                             .gram_ctx = &b};
    float *a = malloc(sizeof(float) * (size_t)BLK * N);
    float *work = malloc(sizeof(float) * fk_omp_batch_work_floats(N, m, s));
    struct fk_code *tmp = codes ? NULL : malloc(sizeof *tmp * BLK);
    int rc = a && work && (codes || tmp) ? FK_OK : fk_err(FK_ENOMEM, "out of memory");
    for (long b0 = 0; b0 < n && rc == FK_OK; b0 += BLK) {
        int nb = n - b0 < BLK ? (int)(n - b0) : BLK;
        fk_correlate(&v, x + (size_t)b0 * m, nb, a);
        struct fk_code *c = codes ? codes + b0 : tmp;
        rc = fk_omp_gram_batch(&v, nb, x + (size_t)b0 * m, a, (size_t)N, s, 0, work, c);
        for (int i = 0; i < nb && rc == FK_OK && errs; i++)
            errs[b0 + i] = c[i].xx > 1e-30 ? sqrt(c[i].err2 / c[i].xx) : 0;
    }
    free(a);
    free(tmp);
    free(work);
    free(gram);
    return rc;
}

int fk_train_eval(const float *atoms, int N, int m, int s, const float *x, long n, double *err)
{
    if (n == 0) {
        *err = NAN;
        return FK_OK;
    }
    double *e = malloc(sizeof(double) * (size_t)n);
    if (!e)
        return fk_err(FK_ENOMEM, "out of memory");
    int rc = code_all(atoms, N, m, s, x, n, NULL, e);
    double sum = 0;
    for (long i = 0; i < n; i++)
        sum += e[i];
    *err = sum / n;
    free(e);
    return rc;
}

struct ev {
    double e;
    long i;
};

static int cmp_ev(const void *a, const void *b)
{
    const struct ev *x = a, *y = b;
    if (x->e != y->e)
        return x->e < y->e ? 1 : -1;
    return (x->i > y->i) - (x->i < y->i);
}

/* One pass of batch block-coordinate descent (A = sum c c^T, B = sum x c^T). */
static int bcd_epoch(float *D, int N, int m, int s, const float *x, long n, uint64_t seed,
                     double *train_err)
{
    struct fk_code *codes = malloc(sizeof *codes * (size_t)n);
    double *errs = malloc(sizeof(double) * (size_t)n);
    double *A = calloc((size_t)N * N, sizeof(double));
    double *B = calloc((size_t)N * m, sizeof(double)); /* row j = b_j */
    double *u = malloc(sizeof(double) * (size_t)m);
    long *order = malloc(sizeof(long) * (size_t)n);
    int rc = codes && errs && A && B && u && order ? FK_OK : fk_err(FK_ENOMEM, "out of memory");
    if (rc == FK_OK)
        rc = code_all(D, N, m, s, x, n, codes, errs);
    double tot = 0;
    for (long i = 0; rc == FK_OK && i < n; i++) {
        const struct fk_code *c = &codes[i];
        tot += errs[i];
        for (int p = 0; p < c->k; p++) {
            int j = c->idx[p];
            for (int q = 0; q < c->k; q++)
                A[(size_t)j * N + c->idx[q]] += c->coef[p] * c->coef[q];
            const float *xi = x + (size_t)i * m;
            for (int t = 0; t < m; t++)
                B[(size_t)j * m + t] += c->coef[p] * xi[t];
        }
    }
    if (rc == FK_OK)
        *train_err = n ? tot / n : NAN;
    /* worst-coded vectors first, for re-seeding unused atoms (ties: lower index) */
    long n_seed = 0;
    struct ev *ranked = rc == FK_OK ? malloc(sizeof *ranked * (size_t)(n ? n : 1)) : NULL;
    if (rc == FK_OK && !ranked)
        rc = fk_err(FK_ENOMEM, "out of memory");
    if (rc == FK_OK) {
        for (long i = 0; i < n; i++)
            ranked[i] = (struct ev){errs[i], i};
        qsort(ranked, (size_t)n, sizeof *ranked, cmp_ev);
        n_seed = n;
        for (long i = 0; i < n; i++)
            order[i] = ranked[i].i;
    }
    free(ranked);
    long next_seed = 0;
    (void)seed;
    for (int j = 0; rc == FK_OK && j < N; j++) {
        double ajj = A[(size_t)j * N + j];
        float *dj = D + (size_t)j * m;
        if (ajj < 1e-12) {
            if (next_seed < n_seed) {
                memcpy(dj, x + (size_t)order[next_seed++] * m, sizeof(float) * (size_t)m);
                normalise(dj, m);
            }
            continue;
        }
        /* u = d_j + (b_j - D a_j) / A_jj, with a_j = column j of A (symmetric: row j) */
        for (int t = 0; t < m; t++)
            u[t] = B[(size_t)j * m + t];
        const double *aj = A + (size_t)j * N;
        for (int k = 0; k < N; k++) {
            if (aj[k] == 0)
                continue;
            const float *dk = D + (size_t)k * m;
            for (int t = 0; t < m; t++)
                u[t] -= aj[k] * dk[t];
        }
        double nn = 0;
        for (int t = 0; t < m; t++) {
            u[t] = dj[t] + u[t] / ajj;
            nn += u[t] * u[t];
        }
        nn = sqrt(nn);
        if (nn > 1e-12)
            for (int t = 0; t < m; t++)
                dj[t] = (float)(u[t] / nn);
    }
    free(codes);
    free(errs);
    free(A);
    free(B);
    free(u);
    free(order);
    return rc;
}

/* Lexico's objective with Adam (spec 9.1/9.2), mini-batches over a fixed permutation. */
static int lexico_epoch(float *D, double *mom, double *vel, long *t_adam, int N, int m, int s,
                        const float *x, long n, const struct fk_train_opts *o, uint64_t seed,
                        double *train_err)
{
    long *perm = malloc(sizeof(long) * (size_t)n);
    float *xb = malloc(sizeof(float) * (size_t)o->batch * m);
    struct fk_code *codes = malloc(sizeof *codes * (size_t)o->batch);
    double *g = malloc(sizeof(double) * (size_t)N * m);
    double *errs = malloc(sizeof(double) * (size_t)o->batch);
    int rc = perm && xb && codes && g && errs ? fk_train_rng_perm(seed, n, perm)
                                              : fk_err(FK_ENOMEM, "out of memory");
    double tot = 0;
    for (long b0 = 0; rc == FK_OK && b0 < n; b0 += o->batch) {
        int nb = n - b0 < o->batch ? (int)(n - b0) : o->batch;
        for (int i = 0; i < nb; i++)
            memcpy(xb + (size_t)i * m, x + (size_t)perm[b0 + i] * m, sizeof(float) * (size_t)m);
        rc = code_all(D, N, m, s, xb, nb, codes, errs);
        if (rc < 0)
            break;
        memset(g, 0, sizeof(double) * (size_t)N * m);
        double scale = 2.0 / ((double)nb * m);
        for (int i = 0; i < nb; i++) {
            const struct fk_code *c = &codes[i];
            tot += errs[i];
            double r[1024];
            if (m > 1024) {
                rc = fk_err(FK_ENOTSUP, "lexico training supports head_dim <= 1024");
                break;
            }
            for (int t = 0; t < m; t++)
                r[t] = -(double)xb[(size_t)i * m + t];
            for (int p = 0; p < c->k; p++)
                for (int t = 0; t < m; t++)
                    r[t] += c->coef[p] * D[(size_t)c->idx[p] * m + t];
            for (int p = 0; p < c->k; p++)
                for (int t = 0; t < m; t++)
                    g[(size_t)c->idx[p] * m + t] += scale * c->coef[p] * r[t];
        }
        (*t_adam)++;
        double b1 = 0.9, b2 = 0.999, eps = 1e-8;
        double c1 = 1 - pow(b1, (double)*t_adam), c2 = 1 - pow(b2, (double)*t_adam);
        for (int j = 0; j < N; j++) {
            float *dj = D + (size_t)j * m;
            double *gj = g + (size_t)j * m, dot = 0;
            for (int t = 0; t < m; t++)
                dot += gj[t] * dj[t];
            for (int t = 0; t < m; t++) {
                double gt = gj[t] - dot * dj[t]; /* tangent projection */
                size_t q = (size_t)j * m + t;
                mom[q] = b1 * mom[q] + (1 - b1) * gt;
                vel[q] = b2 * vel[q] + (1 - b2) * gt * gt;
                dj[t] -= (float)(o->lr * (mom[q] / c1) / (sqrt(vel[q] / c2) + eps));
            }
            normalise(dj, m);
        }
    }
    if (rc == FK_OK)
        *train_err = n ? tot / n : NAN;
    free(perm);
    free(xb);
    free(codes);
    free(g);
    free(errs);
    return rc;
}

struct job {
    const struct fk_train_opts *o;
    const struct fk_train_data *data;
    float *atoms_out;
    double *heldout;
    fk_train_progress cb;
    void *cb_ctx;
    pthread_mutex_t *lock;
    int *next, *failed;
    char *errmsg;
};

static int train_one(struct job *jb, int slot)
{
    const struct fk_train_opts *o = jb->o;
    int m = jb->data->m, N = o->n_atoms, layer = slot / 2, kind = slot % 2;
    const float *X = jb->data->x[slot];
    long n = jb->data->n[slot];
    uint64_t seed = o->seed * 1000003ULL + (uint64_t)slot * 7919ULL + 1;
    /* split: every k-th non-zero vector is held out */
    long k_held = o->heldout_frac > 0 ? (long)llround(1.0 / o->heldout_frac) : 0;
    float *tr = malloc(sizeof(float) * (size_t)(n ? n : 1) * m);
    float *ho = malloc(sizeof(float) * (size_t)(n ? n : 1) * m);
    if (!tr || !ho) {
        free(tr);
        free(ho);
        return fk_err(FK_ENOMEM, "out of memory");
    }
    long n_tr = 0, n_ho = 0, nz = 0;
    for (long i = 0; i < n; i++) {
        const float *v = X + (size_t)i * m;
        double nn = 0;
        for (int t = 0; t < m; t++)
            nn += (double)v[t] * v[t];
        if (nn <= 1e-30)
            continue;
        if (k_held > 1 && nz++ % k_held == k_held - 1)
            memcpy(ho + (size_t)n_ho++ * m, v, sizeof(float) * (size_t)m);
        else
            memcpy(tr + (size_t)n_tr++ * m, v, sizeof(float) * (size_t)m);
    }
    if (o->max_train > 0 && n_tr > o->max_train)
        n_tr = o->max_train;
    float *D = jb->atoms_out + (size_t)slot * N * m;
    int rc = FK_OK;
    double t0 = fk_wall_s();
    if (n_tr == 0) {
        rc = fk_err(FK_EINVAL, "layer %d %s: no non-zero training vectors", layer,
                    kind ? "V" : "K");
    } else if (o->method == FK_TRAIN_RANDOM) {
        rc = fk_train_rng_gauss(seed, (long)N * m, D);
        for (int j = 0; rc == FK_OK && j < N; j++)
            normalise(D + (size_t)j * m, m);
    } else {
        long *idx = malloc(sizeof(long) * (size_t)N);
        rc = idx ? fk_train_rng_pick(seed, n_tr, N < n_tr ? N : n_tr, idx)
                 : fk_err(FK_ENOMEM, "out of memory");
        for (int j = 0; rc == FK_OK && j < N; j++) {
            if (j < n_tr) {
                memcpy(D + (size_t)j * m, tr + (size_t)idx[j] * m, sizeof(float) * (size_t)m);
            } else { /* fewer training vectors than atoms: random atoms fill the rest */
                rc = fk_train_rng_gauss(seed + (uint64_t)j, m, D + (size_t)j * m);
            }
            normalise(D + (size_t)j * m, m);
        }
        free(idx);
    }
    double he = NAN, te = NAN;
    if (rc == FK_OK)
        rc = fk_train_eval(D, N, m, o->s, ho, n_ho, &he);
    if (rc == FK_OK && jb->cb) {
        pthread_mutex_lock(jb->lock);
        jb->cb(jb->cb_ctx, layer, kind, 0, he, te, fk_wall_s() - t0);
        pthread_mutex_unlock(jb->lock);
    }
    /* --keep-best: the dictionary of the epoch with the lowest held-out error */
    float *best = rc == FK_OK && o->keep_best && n_ho > 0
                      ? malloc(sizeof(float) * (size_t)N * m) : NULL;
    double best_he = he;
    if (rc == FK_OK && o->keep_best && n_ho > 0 && !best)
        rc = fk_err(FK_ENOMEM, "out of memory");
    if (best)
        memcpy(best, D, sizeof(float) * (size_t)N * m);
    double *mom = NULL, *vel = NULL;
    long t_adam = 0;
    if (o->method == FK_TRAIN_LEXICO) {
        mom = calloc((size_t)N * m, sizeof(double));
        vel = calloc((size_t)N * m, sizeof(double));
        if (!mom || !vel)
            rc = fk_err(FK_ENOMEM, "out of memory");
    }
    for (int e = 1; rc == FK_OK && e <= o->epochs &&
                    (o->method == FK_TRAIN_BCD || o->method == FK_TRAIN_LEXICO);
         e++) {
        if (o->method == FK_TRAIN_BCD)
            rc = bcd_epoch(D, N, m, o->s, tr, n_tr, seed + (uint64_t)e, &te);
        else
            rc = lexico_epoch(D, mom, vel, &t_adam, N, m, o->s, tr, n_tr, o,
                              seed + (uint64_t)e, &te);
        if (rc == FK_OK)
            rc = fk_train_eval(D, N, m, o->s, ho, n_ho, &he);
        if (rc == FK_OK && jb->cb) {
            pthread_mutex_lock(jb->lock);
            jb->cb(jb->cb_ctx, layer, kind, e, he, te, fk_wall_s() - t0);
            pthread_mutex_unlock(jb->lock);
        }
        if (rc == FK_OK && best && he < best_he) {
            best_he = he;
            memcpy(best, D, sizeof(float) * (size_t)N * m);
        }
    }
    if (rc == FK_OK && best) {
        memcpy(D, best, sizeof(float) * (size_t)N * m);
        he = best_he;
    }
    free(best);
    jb->heldout[slot] = he;
    free(mom);
    free(vel);
    free(tr);
    free(ho);
    return rc;
}

static void *train_main(void *arg)
{
    struct job *jb = arg;
    int total = jb->data->n_layers * 2;
    for (;;) {
        pthread_mutex_lock(jb->lock);
        int slot = *jb->failed ? total : (*jb->next)++;
        pthread_mutex_unlock(jb->lock);
        if (slot >= total)
            break;
        int rc = train_one(jb, slot);
        if (rc < 0) {
            pthread_mutex_lock(jb->lock);
            if (!*jb->failed) {
                *jb->failed = rc;
                snprintf(jb->errmsg, 1024, "%s", fk_errmsg());
            }
            pthread_mutex_unlock(jb->lock);
            break;
        }
    }
    return NULL;
}

int fk_train_run(const struct fk_train_opts *o, const struct fk_train_data *data,
                 float *atoms_out, double *heldout_err, fk_train_progress cb, void *cb_ctx)
{
    if (o->n_atoms < 1 || o->s < 1 || o->s >= FK_SMAX || data->m < 1)
        return fk_err(FK_EINVAL, "train-dict: need N >= 1, 1 <= s < %d", FK_SMAX);
    pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    int next = 0, failed = 0;
    char errmsg[1024] = "";
    struct job jb = {.o = o, .data = data, .atoms_out = atoms_out, .heldout = heldout_err,
                     .cb = cb, .cb_ctx = cb_ctx, .lock = &lock, .next = &next,
                     .failed = &failed, .errmsg = errmsg};
    int jobs = o->jobs < 1 ? 1 : o->jobs;
    fk_blas_parallel(jobs, train_main, &jb, 0); /* the workers share one job */
    if (failed)
        return fk_err(failed, "%s", errmsg);
    return FK_OK;
}
