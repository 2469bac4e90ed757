/* SPDX-License-Identifier: MIT
 * OMP kernel benchmark (see fk_bench.h). The synthetic data come from GSL's mt19937; the
 * BLAS calls go through fk_sparse.h so that this file never includes <cblas.h> next to
 * GSL's headers. Work is split into fixed blocks of signals that the worker threads take
 * from an atomic counter; every signal is coded wholly by one thread with the same
 * arithmetic, so the codes do not depend on the thread count (codes_hash shows it).
 */
#include "common/fk_clock.h"
#include "bench/fk_bench.h"

#include "common/fk_err.h"
#include "core/fk_codec.h"
#include "kernels/fk_blas.h"
#include "kernels/fk_dot.h"

#include <gsl/gsl_randist.h>
#include <gsl/gsl_rng.h>
#include <hdf5.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void fk_bench_omp_defaults(struct fk_bench_omp_cfg *cfg)
{
    cfg->n_atoms = 4096;
    cfg->dim = 128;
    cfg->sparsity = 8;
    cfg->n_signals = 16384;
    cfg->threads = 1;
    cfg->repeats = 5;
    cfg->block = 256;
    cfg->naive_signals = 2048;
    cfg->noise = 0.05;
    cfg->seed = 1;
}

void fk_bench_omp_data_clear(struct fk_bench_omp_data *data)
{
    if (!data)
        return;
    free(data->atoms);
    free(data->signals);
    memset(data, 0, sizeof *data);
}

static int data_alloc(struct fk_bench_omp_data *out, int n_atoms, int dim, int n_signals)
{
    memset(out, 0, sizeof *out);
    out->n_atoms = n_atoms;
    out->dim = dim;
    out->n_signals = n_signals;
    out->atoms = malloc((size_t)n_atoms * dim * sizeof(float));
    out->signals = malloc((size_t)n_signals * dim * sizeof(float));
    if (!out->atoms || !out->signals) {
        fk_bench_omp_data_clear(out);
        return fk_err(FK_ENOMEM, "bench omp: cannot allocate %d atoms and %d signals of %d",
                      n_atoms, n_signals, dim);
    }
    return FK_OK;
}

int fk_bench_omp_data_make(const struct fk_bench_omp_cfg *cfg, struct fk_bench_omp_data *out)
{
    int n = cfg->n_atoms, m = cfg->dim, s = cfg->sparsity;
    if (n < 1 || m < 1 || cfg->n_signals < 1 || s < 1 || s > n || s > FK_SMAX)
        return fk_err(FK_EINVAL, "bench omp: expected atoms >= 1, dim >= 1, signals >= 1, "
                      "1 <= sparsity <= min(atoms, %d); got %d, %d, %d, %d", FK_SMAX, n, m,
                      cfg->n_signals, s);
    FK_TRY(data_alloc(out, n, m, cfg->n_signals));
    gsl_rng *rng = gsl_rng_alloc(gsl_rng_mt19937);
    int *pick = malloc((size_t)s * sizeof *pick);
    if (!rng || !pick) {
        gsl_rng_free(rng);
        free(pick);
        fk_bench_omp_data_clear(out);
        return fk_err(FK_ENOMEM, "bench omp: cannot allocate the RNG");
    }
    gsl_rng_set(rng, (unsigned long)cfg->seed);
    for (int j = 0; j < n; j++) {
        float *at = out->atoms + (size_t)j * m;
        double nrm = 0.0;
        for (int i = 0; i < m; i++) {
            double v = gsl_ran_gaussian(rng, 1.0);
            at[i] = (float)v;
            nrm += v * v;
        }
        nrm = sqrt(nrm);
        for (int i = 0; i < m; i++)
            at[i] = (float)(at[i] / nrm);
    }
    for (int v = 0; v < cfg->n_signals; v++) {
        float *x = out->signals + (size_t)v * m;
        for (int i = 0; i < m; i++)
            x[i] = (float)gsl_ran_gaussian(rng, cfg->noise);
        for (int l = 0; l < s; l++) {
            int j, dup;
            do {
                j = (int)gsl_rng_uniform_int(rng, (unsigned long)n);
                dup = 0;
                for (int q = 0; q < l; q++)
                    dup |= pick[q] == j;
            } while (dup);
            pick[l] = j;
            double c = gsl_ran_gaussian(rng, 1.0);
            const float *at = out->atoms + (size_t)j * m;
            for (int i = 0; i < m; i++)
                x[i] = (float)(x[i] + c * at[i]);
        }
    }
    free(pick);
    gsl_rng_free(rng);
    return FK_OK;
}

static int h5_write2(hid_t file, const char *path, const char *name, hid_t type, hsize_t d0,
                     hsize_t d1, int rank, const void *buf)
{
    hsize_t dims[2] = {d0, d1};
    hid_t sp = H5Screate_simple(rank, dims, NULL);
    hid_t ds = sp < 0 ? -1 : H5Dcreate2(file, name, type, sp, H5P_DEFAULT, H5P_DEFAULT,
                                        H5P_DEFAULT);
    herr_t st = ds < 0 ? -1 : H5Dwrite(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf);
    if (ds >= 0)
        H5Dclose(ds);
    if (sp >= 0)
        H5Sclose(sp);
    if (st < 0)
        return fk_err(FK_EIO, "file %s: cannot write dataset /%s", path, name);
    return FK_OK;
}

static int h5_attr(hid_t obj, const char *path, const char *name, hid_t type, const void *v)
{
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t at = sp < 0 ? -1 : H5Acreate2(obj, name, type, sp, H5P_DEFAULT, H5P_DEFAULT);
    herr_t st = at < 0 ? -1 : H5Awrite(at, type, v);
    if (at >= 0)
        H5Aclose(at);
    if (sp >= 0)
        H5Sclose(sp);
    if (st < 0)
        return fk_err(FK_EIO, "file %s: cannot write attribute %s", path, name);
    return FK_OK;
}

int fk_bench_omp_data_write(const char *path, const struct fk_bench_omp_data *data,
                            const struct fk_bench_omp_cfg *cfg)
{
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (f < 0)
        return fk_err(FK_EIO, "file %s: cannot create", path);
    int rc = h5_write2(f, path, "dict", H5T_NATIVE_FLOAT, (hsize_t)data->n_atoms,
                       (hsize_t)data->dim, 2, data->atoms);
    if (rc == FK_OK)
        rc = h5_write2(f, path, "signals", H5T_NATIVE_FLOAT, (hsize_t)data->n_signals,
                       (hsize_t)data->dim, 2, data->signals);
    int64_t sp = cfg->sparsity, seed = (int64_t)cfg->seed;
    if (rc == FK_OK)
        rc = h5_attr(f, path, "sparsity", H5T_NATIVE_INT64, &sp);
    if (rc == FK_OK)
        rc = h5_attr(f, path, "seed", H5T_NATIVE_INT64, &seed);
    if (rc == FK_OK)
        rc = h5_attr(f, path, "noise", H5T_NATIVE_DOUBLE, &cfg->noise);
    if (H5Fclose(f) < 0 && rc == FK_OK)
        rc = fk_err(FK_EIO, "file %s: cannot close", path);
    return rc;
}

static int h5_read2(hid_t f, const char *path, const char *name, hsize_t dims[2], float **buf)
{
    hid_t ds = H5Dopen2(f, name, H5P_DEFAULT);
    if (ds < 0)
        return fk_err(FK_ECORRUPT, "file %s: dataset /%s: missing", path, name);
    hid_t sp = H5Dget_space(ds);
    int rank = sp < 0 ? -1 : H5Sget_simple_extent_ndims(sp);
    if (rank != 2) {
        if (sp >= 0)
            H5Sclose(sp);
        H5Dclose(ds);
        return fk_err(FK_ECORRUPT, "file %s: dataset /%s: expected rank 2, got %d", path, name,
                      rank);
    }
    H5Sget_simple_extent_dims(sp, dims, NULL);
    H5Sclose(sp);
    if (dims[0] < 1 || dims[1] < 1 || dims[0] > (1u << 28) || dims[1] > 65536) {
        H5Dclose(ds);
        return fk_err(FK_ECORRUPT, "file %s: dataset /%s: implausible shape (%llu, %llu)",
                      path, name, (unsigned long long)dims[0], (unsigned long long)dims[1]);
    }
    *buf = malloc((size_t)(dims[0] * dims[1]) * sizeof(float));
    herr_t st = *buf ? H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, *buf) : -1;
    H5Dclose(ds);
    if (st < 0) {
        free(*buf);
        *buf = NULL;
        return fk_err(FK_EIO, "file %s: dataset /%s: cannot read as float32", path, name);
    }
    return FK_OK;
}

int fk_bench_omp_data_read(const char *path, struct fk_bench_omp_data *out)
{
    memset(out, 0, sizeof *out);
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0)
        return fk_err(FK_EIO, "file %s: cannot open as HDF5", path);
    hsize_t dd[2], ds[2];
    int rc = h5_read2(f, path, "dict", dd, &out->atoms);
    if (rc == FK_OK)
        rc = h5_read2(f, path, "signals", ds, &out->signals);
    H5Fclose(f);
    if (rc == FK_OK && dd[1] != ds[1])
        rc = fk_err(FK_ECORRUPT, "file %s: dataset /signals: expected %llu columns like /dict, "
                    "got %llu", path, (unsigned long long)dd[1], (unsigned long long)ds[1]);
    if (rc != FK_OK) {
        fk_bench_omp_data_clear(out);
        return rc;
    }
    out->n_atoms = (int)dd[0];
    out->dim = (int)dd[1];
    out->n_signals = (int)ds[0];
    for (size_t i = 0; i < (size_t)out->n_atoms * out->dim; i++)
        if (!isfinite(out->atoms[i])) {
            fk_bench_omp_data_clear(out);
            return fk_err(FK_ECORRUPT, "file %s: dataset /dict: element %zu is not finite",
                          path, i);
        }
    return FK_OK;
}

/* ---- timed kernel ---- */

struct gram_store {
    const float *g; /* (n, n) row-major Gram */
    size_t n;       /* atoms */
};

static struct fk_gram_row gram_row_stored(void *ctx, int j, float *scratch)
{
    const struct gram_store *gs = ctx;
    (void)scratch;
    return (struct fk_gram_row){.head = gs->g + (size_t)j * gs->n};
}

enum job_mode { JOB_E2E, JOB_E2E1, JOB_GEMM };

struct job {
    const struct fk_dict_view *view; /* dictionary with Gram rows */
    const float *x;                  /* (n, m) signals */
    int n;                           /* signals */
    int s;                           /* sparsity */
    int block;                       /* signals per block */
    enum job_mode mode;              /* e2e (batched greedy), e2e one vector at a time, or
                                      * the SGEMM floor */
    struct fk_code *codes;           /* (n) output of e2e */
    struct fk_code *codes1;          /* (n) output of e2e one vector at a time */
    atomic_int next;                 /* next block to take */
    atomic_int rc;                   /* first error code (0 = none) */
    char msg[256];                   /* its message (written once, by the failing thread) */
};

struct worker {
    struct job *job; /* shared job */
    float *abuf;     /* (block, n_atoms) correlations */
    float *work;     /* fk_omp_batch_work_floats */
};

static void *worker_run(void *arg)
{
    struct worker *w = arg;
    struct job *jb = w->job;
    const struct fk_dict_view *v = jb->view;
    size_t m = (size_t)v->m, na = (size_t)v->n_atoms;
    for (;;) {
        int b = atomic_fetch_add(&jb->next, 1);
        long lo = (long)b * jb->block;
        if (lo >= jb->n || atomic_load(&jb->rc) != 0)
            break;
        int cnt = (int)(jb->n - lo < jb->block ? jb->n - lo : jb->block);
        fk_correlate(v, jb->x + (size_t)lo * m, cnt, w->abuf);
        if (jb->mode == JOB_GEMM)
            continue;
        for (int i = 0; i < cnt; i++) {
            int rc;
            if (jb->mode == JOB_E2E) {
                rc = fk_omp_gram_batch(v, cnt, jb->x + (size_t)lo * m, w->abuf, na, jb->s, 0.0,
                                       w->work, &jb->codes[lo]);
                i = cnt;
            } else {
                rc = fk_omp_gram(v, jb->x + (size_t)(lo + i) * m, w->abuf + (size_t)i * na,
                                 jb->s, 0.0, w->work, &jb->codes1[lo + i]);
            }
            if (rc != FK_OK) {
                int zero = 0;
                if (atomic_compare_exchange_strong(&jb->rc, &zero, rc))
                    snprintf(jb->msg, sizeof jb->msg, "%s", fk_errmsg());
                return NULL;
            }
        }
    }
    return NULL;
}

static int run_job(struct job *jb, struct worker *ws, int threads, double *secs)
{
    atomic_store(&jb->next, 0);
    atomic_store(&jb->rc, 0);
    for (int t = 0; t < threads; t++)
        ws[t].job = jb;
    double t0 = fk_wall_s();
    int ran = fk_blas_parallel(threads, worker_run, ws, sizeof *ws);
    *secs = fk_wall_s() - t0;
    if (ran != threads)
        return fk_err(FK_EEXTERNAL, "bench omp: could not start %d threads", threads);
    int rc = atomic_load(&jb->rc);
    if (rc != 0)
        return fk_err(rc, "bench omp: %s", jb->msg);
    return FK_OK;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double fk_bench_median_sort(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static int same_support(const struct fk_code *a, const struct fk_code *b)
{
    if (a->k != b->k)
        return 0;
    int32_t x[FK_SMAX], y[FK_SMAX];
    memcpy(x, a->idx, (size_t)a->k * sizeof *x);
    memcpy(y, b->idx, (size_t)b->k * sizeof *y);
    qsort(x, (size_t)a->k, sizeof *x, cmp_i32);
    qsort(y, (size_t)b->k, sizeof *y, cmp_i32);
    return !memcmp(x, y, (size_t)a->k * sizeof *x);
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++) {
        h ^= c[i];
        h *= 1099511628211ull;
    }
    return h;
}

struct bench_bufs {
    float *gram;          /* (N, N) */
    float *abuf;          /* (threads, block, N) */
    float *work;          /* (threads, wsz) */
    struct fk_code *own;  /* (n) when the caller passed no codes */
    struct fk_code *nv;   /* (naive_n) naive codes */
    struct fk_code *one;  /* (n) codes of the one-vector-at-a-time greedy loop */
    double *times;        /* (3 * repeats) */
};

static void bufs_free(struct bench_bufs *b)
{
    free(b->gram);
    free(b->abuf);
    free(b->work);
    free(b->own);
    free(b->nv);
    free(b->one);
    free(b->times);
}

/* Timing figures of the repeats and the codes' summary. */
static void summarise(const struct fk_bench_omp_cfg *cfg, const struct fk_bench_omp_data *data,
                      double *te, double *tg, double *t1,
                      const struct fk_code *codes, const struct fk_code *one,
                      struct fk_bench_omp_result *res)
{
    int N = data->n_atoms, m = data->dim, n = data->n_signals, s = cfg->sparsity;
    int R = cfg->repeats;
    res->e2e_min_s = te[0];
    res->gemm_min_s = tg[0];
    for (int r = 1; r < R; r++) {
        res->e2e_min_s = te[r] < res->e2e_min_s ? te[r] : res->e2e_min_s;
        res->gemm_min_s = tg[r] < res->gemm_min_s ? tg[r] : res->gemm_min_s;
    }
    res->e2e_med_s = fk_bench_median_sort(te, R);
    res->gemm_med_s = fk_bench_median_sort(tg, R);
    res->e2e_vps = n / res->e2e_med_s;
    res->e2e1_vps = n / fk_bench_median_sort(t1, R);
    res->one_identical = 1;
    for (int i = 0; i < n; i++) {
        const struct fk_code *c = &codes[i], *o = &one[i];
        if (c->k != o->k || c->flags != o->flags || c->iters != o->iters ||
            memcmp(c->idx, o->idx, (size_t)c->k * sizeof c->idx[0]) ||
            memcmp(c->coef, o->coef, (size_t)c->k * sizeof c->coef[0]) ||
            memcmp(&c->err2, &o->err2, sizeof c->err2))
            res->one_identical = 0;
    }
    res->gemm_vps = n / res->gemm_med_s;
    res->e2e_gflops = res->e2e_vps * (2.0 * m * N + (double)N * s * s) * 1e-9;
    res->floor_ratio = res->e2e_med_s / res->gemm_med_s;
    uint64_t h = 1469598103934665603ull;
    double ksum = 0.0, esum = 0.0;
    long ne = 0;
    for (int i = 0; i < n; i++) {
        const struct fk_code *c = &codes[i];
        h = fnv(h, &c->k, sizeof c->k);
        h = fnv(h, c->idx, (size_t)c->k * sizeof c->idx[0]);
        h = fnv(h, c->coef, (size_t)c->k * sizeof c->coef[0]);
        ksum += c->k;
        if (c->xx > 0) {
            esum += sqrt(c->err2 / c->xx);
            ne++;
        }
        res->n_premature += (c->flags & FK_CODE_PREMATURE) != 0;
        res->n_dependent += (c->flags & FK_CODE_DEPENDENT) != 0;
        res->n_guarded += (c->flags & FK_CODE_GUARDED) != 0;
    }
    res->codes_hash = h;
    res->mean_k = ksum / n;
    res->mean_rel_err = ne ? esum / ne : 0.0;
}

/* The timed part: a warm-up pass of each kind, then R repeats of end to end, SGEMM alone and
 * end to end one vector at a time, into times [3][R]. */
static int timed_repeats(struct job *jb, struct worker *ws, int T, int R, double *times)
{
    double dt;
    jb->mode = JOB_E2E;
    FK_TRY(run_job(jb, ws, T, &dt));
    jb->mode = JOB_GEMM;
    FK_TRY(run_job(jb, ws, T, &dt));
    for (int r = 0; r < R; r++) {
        jb->mode = JOB_E2E;
        FK_TRY(run_job(jb, ws, T, &times[r]));
        jb->mode = JOB_GEMM;
        FK_TRY(run_job(jb, ws, T, &times[R + r]));
        jb->mode = JOB_E2E1;
        FK_TRY(run_job(jb, ws, T, &times[2 * R + r]));
    }
    return FK_OK;
}

/* Naive reference: single thread, recomputes D^T r every iteration (a = NULL). */
static int naive_reference(const struct fk_dict_view *view, const struct fk_bench_omp_data *data,
                           int s, int nn, struct bench_bufs *bb, const struct fk_code *codes,
                           struct fk_bench_omp_result *res)
{
    struct fk_dict_view nview = *view;
    nview.gram_row = NULL;
    double t0 = fk_wall_s();
    for (int i = 0; i < nn; i++)
        FK_TRY(fk_omp_naive(&nview, data->signals + (size_t)i * data->dim, NULL, NULL, 0, s,
                            0.0, bb->work, &bb->nv[i]));
    double tn = fk_wall_s() - t0;
    res->naive_n = nn;
    res->naive_vps = nn / tn;
    for (int i = 0; i < nn; i++)
        res->agree_n += same_support(&bb->nv[i], &codes[i]);
    return FK_OK;
}

int fk_bench_omp_run(const struct fk_bench_omp_cfg *cfg, const struct fk_bench_omp_data *data,
                     struct fk_bench_omp_result *res, struct fk_code *codes)
{
    int N = data->n_atoms, m = data->dim, n = data->n_signals, s = cfg->sparsity;
    int T = cfg->threads, R = cfg->repeats, B = cfg->block;
    if (T < 1 || T > FK_BENCH_MAX_THREADS || R < 1 || B < 1 || s < 1 || s > FK_SMAX || n < 1)
        return fk_err(FK_EINVAL, "bench omp: expected 1 <= threads <= %d, repeats >= 1, "
                      "block >= 1, 1 <= sparsity <= %d; got %d, %d, %d, %d",
                      FK_BENCH_MAX_THREADS, FK_SMAX, T, R, B, s);
    if (B > n)
        B = n;
    memset(res, 0, sizeof *res);
    int nn = cfg->naive_signals < n ? cfg->naive_signals : n;
    nn = nn < 0 ? 0 : nn;
    size_t wsz = (fk_omp_batch_work_floats(N, m, s) + 15) & ~(size_t)15;
    struct bench_bufs bb = {0};
    bb.gram = fk_gram_alloc((size_t)N * N);
    bb.abuf = malloc((size_t)T * B * N * sizeof(float));
    bb.work = malloc((size_t)T * wsz * sizeof(float));
    bb.own = codes ? NULL : malloc((size_t)n * sizeof *bb.own);
    bb.nv = malloc((size_t)(nn > 0 ? nn : 1) * sizeof *bb.nv);
    bb.one = malloc((size_t)n * sizeof *bb.one);
    bb.times = malloc((size_t)3 * R * sizeof(double));
    if (!bb.gram || !bb.abuf || !bb.work || (!codes && !bb.own) || !bb.nv || !bb.one ||
        !bb.times) {
        bufs_free(&bb);
        return fk_err(FK_ENOMEM, "bench omp: cannot allocate buffers (Gram %d x %d)", N, N);
    }
    if (!codes)
        codes = bb.own;

    double t0 = fk_wall_s();
    int rc = fk_gram_compute(data->atoms, N, m, bb.gram);
    res->gram_s = fk_wall_s() - t0;
    int saved = fk_blas_single(); /* the naive reference too calls BLAS single-threaded */

    struct gram_store gs = {bb.gram, (size_t)N};
    struct fk_dict_view view = {.m = m, .n_atoms = N, .atoms = data->atoms, .dead = NULL,
                                .gram_row = gram_row_stored, .gram_ctx = &gs};
    struct worker ws[FK_BENCH_MAX_THREADS];
    for (int t = 0; t < T; t++) {
        ws[t].abuf = bb.abuf + (size_t)t * B * N;
        ws[t].work = bb.work + (size_t)t * wsz;
    }
    struct job jb = {.view = &view, .x = data->signals, .n = n, .s = s, .block = B,
                     .codes = codes, .codes1 = bb.one};
    if (rc == FK_OK)
        rc = timed_repeats(&jb, ws, T, R, bb.times);
    if (rc == FK_OK)
        summarise(cfg, data, bb.times, bb.times + R, bb.times + 2 * R, codes, bb.one, res);
    if (rc == FK_OK && nn > 0)
        rc = naive_reference(&view, data, s, nn, &bb, codes, res);
    fk_blas_restore(saved);
    bufs_free(&bb);
    return rc;
}

int fk_bench_omp_codes_write(const char *path, const struct fk_code *codes, int n, int s,
                             const struct fk_bench_omp_result *res, int threads)
{
    if (n < 1 || s < 1 || s > FK_SMAX)
        return fk_err(FK_EINVAL, "file %s: expected n >= 1 codes of sparsity 1..%d", path,
                      FK_SMAX);
    int32_t *idx = malloc((size_t)n * s * sizeof *idx);
    double *coef = malloc((size_t)n * s * sizeof *coef);
    int32_t *k = malloc((size_t)n * sizeof *k);
    double *e2 = malloc((size_t)n * sizeof *e2);
    double *xx = malloc((size_t)n * sizeof *xx);
    int rc = FK_OK;
    if (!idx || !coef || !k || !e2 || !xx)
        rc = fk_err(FK_ENOMEM, "file %s: cannot allocate %d codes", path, n);
    for (int i = 0; rc == FK_OK && i < n; i++) {
        k[i] = codes[i].k;
        e2[i] = codes[i].err2;
        xx[i] = codes[i].xx;
        for (int l = 0; l < s; l++) {
            idx[(size_t)i * s + l] = l < codes[i].k ? codes[i].idx[l] : -1;
            coef[(size_t)i * s + l] = l < codes[i].k ? codes[i].coef[l] : 0.0;
        }
    }
    hid_t f = rc == FK_OK ? H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT) : -1;
    if (rc == FK_OK && f < 0)
        rc = fk_err(FK_EIO, "file %s: cannot create", path);
    if (rc == FK_OK)
        rc = h5_write2(f, path, "codes_idx", H5T_NATIVE_INT32, (hsize_t)n, (hsize_t)s, 2, idx);
    if (rc == FK_OK)
        rc = h5_write2(f, path, "codes_coef", H5T_NATIVE_DOUBLE, (hsize_t)n, (hsize_t)s, 2,
                       coef);
    if (rc == FK_OK)
        rc = h5_write2(f, path, "codes_k", H5T_NATIVE_INT32, (hsize_t)n, 0, 1, k);
    if (rc == FK_OK)
        rc = h5_write2(f, path, "codes_err2", H5T_NATIVE_DOUBLE, (hsize_t)n, 0, 1, e2);
    if (rc == FK_OK)
        rc = h5_write2(f, path, "codes_xx", H5T_NATIVE_DOUBLE, (hsize_t)n, 0, 1, xx);
    int64_t th = threads, sp = s;
    if (rc == FK_OK && res)
        rc = h5_attr(f, path, "vectors_per_s", H5T_NATIVE_DOUBLE, &res->e2e_vps);
    if (rc == FK_OK)
        rc = h5_attr(f, path, "threads", H5T_NATIVE_INT64, &th);
    if (rc == FK_OK)
        rc = h5_attr(f, path, "sparsity", H5T_NATIVE_INT64, &sp);
    if (f >= 0 && H5Fclose(f) < 0 && rc == FK_OK)
        rc = fk_err(FK_EIO, "file %s: cannot close", path);
    free(idx);
    free(coef);
    free(k);
    free(e2);
    free(xx);
    return rc;
}

/* ---- screening coders next to Batch-OMP (fk_bench_screen_run) -------------------------- */

enum { SC_OMP, SC_GM, SC_PL, SC_GM_OLD };

/* The buffers of the screening passes. */
struct screen_buf {
    float *abuf;   /* (B, N) correlations */
    float *work;   /* the coders' workspace */
    double *rwork; /* fk_refine_many's */
    size_t rwork_n;
    int32_t *cand; /* (FK_REFINE_LANES, N) pools */
    double *gss;   /* (FK_REFINE_LANES, FK_SMAX^2) G_SS of the pool OMP */
};

/* Vectors i .. i + nv - 1 as the GM coder codes them (codecs/dict/fk_dict_coders.c): every
 * Top-n pool, the pool OMP (over the Gram two vectors in turn, fk_omp_pool2, up to N
 * FK_OWN_GRAM_MAX; beyond it the naive pool OMP, as the coder keeps no Gram there), the
 * refinements in lockstep (fk_refine_many); pl: Top-s, the refinements. st[0 .. 2]: wall
 * seconds of the Top-n, the pool OMP and the refinement, added to. */
static int screen_group(int which, const struct fk_dict_view *v, int s, int pool, int nv,
                        const float *x, const float *a, const struct screen_buf *sb,
                        struct fk_code *c, double *st)
{
    int N = v->n_atoms, m = v->m;
    const float *xs[FK_REFINE_LANES], *as[FK_REFINE_LANES];
    const int32_t *ps[FK_REFINE_LANES];
    const double *gp[FK_REFINE_LANES];
    struct fk_code *cs[FK_REFINE_LANES];
    int np[FK_REFINE_LANES], nr = 0;
    double t0 = fk_wall_s();
    for (int i = 0; i < nv; i++) {
        xs[i] = x + (size_t)i * m;
        as[i] = a + (size_t)i * N;
        int32_t *ci = sb->cand + (size_t)i * N;
        ps[i] = ci;
        gp[i] = sb->gss + (size_t)i * FK_SMAX * FK_SMAX;
        if (which == SC_PL) {
            memset(&c[i], 0, sizeof c[i]);
            c[i].xx = fk_dot_seq(xs[i], xs[i], m);
            if (c[i].xx <= 1e-30) {
                c[i].flags = FK_CODE_ZERO;
                continue;
            }
            c[i].k = fk_topn(as[i], NULL, N, s, 1, c[i].idx, sb->work);
        } else {
            np[i] = fk_topn(as[i], NULL, N, pool, 0, ci, sb->work);
        }
    }
    double t1 = fk_wall_s();
    struct fk_dict_view vn = *v; /* no Gram: fk_omp_pool's naive mode */
    vn.gram_row = NULL;
    for (int i = 0; which == SC_GM && N > FK_OWN_GRAM_MAX && i < nv; i++)
        FK_TRY(fk_omp_pool(&vn, xs[i], as[i], ps[i], np[i], s, sb->work, &c[i],
                           sb->gss + (size_t)i * FK_SMAX * FK_SMAX));
    for (int i = 0; which == SC_GM && N <= FK_OWN_GRAM_MAX && i < nv;) {
        if (i + 1 < nv) {
            struct fk_code *const co[2] = {&c[i], &c[i + 1]};
            double *const g[2] = {sb->gss + (size_t)i * FK_SMAX * FK_SMAX,
                                  sb->gss + (size_t)(i + 1) * FK_SMAX * FK_SMAX};
            FK_TRY(fk_omp_pool2(v, xs + i, as + i, ps + i, np + i, s, sb->work, co, g));
            i += 2;
        } else {
            FK_TRY(fk_omp_pool(v, xs[i], as[i], ps[i], np[i], s, sb->work, &c[i],
                               sb->gss + (size_t)i * FK_SMAX * FK_SMAX));
            i++;
        }
    }
    double t2 = fk_wall_s();
    for (int i = 0; i < nv; i++)
        if (c[i].k > 0 && !(c[i].flags & FK_CODE_ZERO)) {
            xs[nr] = xs[i];
            gp[nr] = gp[i];
            cs[nr++] = &c[i];
        }
    FK_TRY(fk_refine_many(v, nr, xs, 1e-4, 0.20, 1, cs, which == SC_GM ? gp : NULL,
                          sb->rwork, sb->rwork_n));
    double t3 = fk_wall_s();
    st[0] += t1 - t0;
    st[1] += t2 - t1;
    st[2] += t3 - t2;
    return FK_OK;
}

/* One pass of a coder over every signal, block by block (one correlation SGEMM each): its
 * thread CPU seconds to *sec, the wall seconds of its stages added to st (correlations;
 * Top-n, pool OMP or greedy loop, refinement). */
static int screen_pass(int which, const struct fk_dict_view *v, const struct fk_bench_omp_data *d,
                       int s, int pool, int B, const struct screen_buf *sb,
                       struct fk_code *codes, double *sec, double *st)
{
    int n = d->n_signals, m = d->dim, N = d->n_atoms;
    double t0 = fk_thread_cpu_s();
    for (int b0 = 0; b0 < n; b0 += B) {
        int nb = n - b0 < B ? n - b0 : B;
        const float *xb = d->signals + (size_t)b0 * m;
        double w0 = fk_wall_s();
        fk_correlate(v, xb, nb, sb->abuf);
        double w1 = fk_wall_s();
        st[0] += w1 - w0;
        if (which == SC_OMP) {
            FK_TRY(fk_omp_gram_batch(v, nb, xb, sb->abuf, (size_t)N, s, 0.0, sb->work,
                                     codes + b0));
            st[2] += fk_wall_s() - w1;
            continue;
        }
        if (which == SC_GM_OLD) { /* the naive pool OMP and refinement, one at a time */
            for (int i = 0; i < nb; i++) {
                const float *xi = xb + (size_t)i * m, *ai = sb->abuf + (size_t)i * N;
                struct fk_code *c = &codes[b0 + i];
                int np = fk_topn(ai, NULL, N, pool, 0, sb->cand, sb->work);
                FK_TRY(fk_omp_naive(v, xi, ai, sb->cand, np, s, 0, sb->work, c));
                if (c->k > 0 && !(c->flags & FK_CODE_ZERO))
                    FK_TRY(fk_refine(v, xi, 1e-4, 0.20, 1, c));
            }
            continue;
        }
        for (int i = 0; i < nb; i += FK_REFINE_LANES) {
            int nv = nb - i < FK_REFINE_LANES ? nb - i : FK_REFINE_LANES;
            FK_TRY(screen_group(which, v, s, pool, nv, xb + (size_t)i * m,
                                sb->abuf + (size_t)i * N, sb, codes + b0 + i, st + 1));
        }
    }
    *sec = fk_thread_cpu_s() - t0;
    return FK_OK;
}

/* 1 when a and b have the same support (order included); the largest coefficient
 * difference relative to 1 + |b's| goes to *diff when it is larger. */
static int gm_agrees(const struct fk_code *a, const struct fk_code *b, double *diff)
{
    if (a->k != b->k)
        return 0;
    for (int l = 0; l < a->k; l++)
        if (a->idx[l] != b->idx[l])
            return 0;
    for (int l = 0; l < a->k; l++) {
        double e = fabs(a->coef[l] - b->coef[l]) / (1 + fabs(b->coef[l]));
        *diff = e > *diff ? e : *diff;
    }
    return 1;
}

int fk_bench_screen_run(const struct fk_bench_omp_cfg *cfg, const struct fk_bench_omp_data *data,
                        int pool, struct fk_bench_screen_result *res)
{
    int N = data->n_atoms, m = data->dim, n = data->n_signals, s = cfg->sparsity;
    int B = cfg->block < n ? cfg->block : n, R = cfg->repeats;
    memset(res, 0, sizeof *res);
    if (pool < s || pool > N || s < 1 || s > FK_SMAX || B < 1 || R < 1)
        return fk_err(FK_EINVAL, "bench omp --pool: expected s <= n <= N (s %d, n %d, N %d)",
                      s, pool, N);
    res->pool = pool;
    size_t wsz = fk_omp_batch_work_floats(N, m, s);
    size_t w2 = fk_omp_pool2_work_floats(N, m, s) + 2 * (size_t)N + 64;
    wsz = wsz > w2 ? wsz : w2;
    float *gram = fk_gram_alloc((size_t)N * N);
    struct screen_buf sb = {
        .abuf = malloc((size_t)B * N * sizeof(float)), .work = malloc(wsz * sizeof(float)),
        .rwork_n = fk_refine_work_doubles(FK_REFINE_LANES, s),
        .cand = malloc((size_t)FK_REFINE_LANES * N * sizeof(int32_t)),
        .gss = malloc((size_t)FK_REFINE_LANES * FK_SMAX * FK_SMAX * sizeof(double))};
    sb.rwork = malloc(sb.rwork_n * sizeof(double));
    struct fk_code *codes = malloc((size_t)n * sizeof *codes);
    struct fk_code *codes2 = malloc((size_t)n * sizeof *codes2);
    double *t = malloc((size_t)3 * R * sizeof(double));
    double *st = calloc((size_t)3 * 4 * R, sizeof(double)); /* [coder][stage][round] */
    double *rel = malloc((size_t)2 * R * sizeof(double));
    int rc = gram && sb.abuf && sb.work && sb.rwork && sb.cand && sb.gss && codes && codes2 &&
                     t && st && rel
                 ? FK_OK
                 : fk_err(FK_ENOMEM, "bench omp --pool: cannot allocate buffers");
    if (rc == FK_OK)
        rc = fk_gram_compute(data->atoms, N, m, gram);
    int saved = fk_blas_single();
    struct gram_store gs = {gram, (size_t)N};
    struct fk_dict_view v = {.m = m, .n_atoms = N, .atoms = data->atoms, .dead = NULL,
                             .gram_row = gram_row_stored, .gram_ctx = &gs};
    double dt, sw[4];
    for (int w = SC_OMP; rc == FK_OK && w <= SC_PL; w++) /* warm-up */
        rc = screen_pass(w, &v, data, s, pool, B, &sb, codes, &dt, sw);
    for (int r = 0; rc == FK_OK && r < R; r++)
        for (int w = SC_OMP; rc == FK_OK && w <= SC_PL; w++) {
            memset(sw, 0, sizeof sw);
            rc = screen_pass(w, &v, data, s, pool, B, &sb, codes, &t[(size_t)w * R + r], sw);
            for (int k = 0; k < 4; k++)
                st[((size_t)w * 4 + k) * R + r] = sw[k];
        }
    if (rc == FK_OK) {
        rc = screen_pass(SC_GM, &v, data, s, pool, B, &sb, codes, &dt, sw);
        if (rc == FK_OK)
            rc = screen_pass(SC_GM_OLD, &v, data, s, pool, B, &sb, codes2, &dt, sw);
        int same = 0;
        for (int i = 0; rc == FK_OK && i < n; i++)
            same += gm_agrees(&codes[i], &codes2[i], &res->gm_coef_diff);
        res->gm_support_same = n ? (double)same / n : 1;
    }
    if (rc == FK_OK) {
        for (int r = 0; r < R; r++) {
            rel[r] = t[R + r] / t[r];
            rel[R + r] = t[2 * R + r] / t[r];
            if (r < 8) {
                res->gm_rel_r[r] = rel[r];
                res->pl_rel_r[r] = rel[R + r];
            }
        }
        res->rounds = R;
        res->omp_vps = n / fk_bench_median_sort(t, R);
        res->gm_vps = n / fk_bench_median_sort(t + R, R);
        res->pl_vps = n / fk_bench_median_sort(t + 2 * R, R);
        res->gm_rel = fk_bench_median_sort(rel, R);
        res->pl_rel = fk_bench_median_sort(rel + R, R);
        for (int w = 0; w < 3; w++)
            for (int k = 0; k < 4; k++)
                res->stage_us[w][k] = 1e6 / n * fk_bench_median_sort(st + ((size_t)w * 4 + k) * R, R);
    }
    fk_blas_restore(saved);
    free(gram);
    free(sb.abuf);
    free(sb.work);
    free(sb.rwork);
    free(sb.cand);
    free(sb.gss);
    free(codes);
    free(codes2);
    free(t);
    free(st);
    free(rel);
    return rc;
}
