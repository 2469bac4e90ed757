/* SPDX-License-Identifier: MIT
 * The roofline of Batch-OMP's greedy loop (fk_bench.h, fk_bench_omp_roofline): counted bytes
 * and multiply-adds per vector, and this core's read bandwidths over the two places they
 * come from.
 */
#include "bench/fk_bench.h"

#include <gsl/gsl_rng.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/fk_clock.h"
#include "common/fk_err.h"
#include "kernels/fk_simd.h"

/* Sum of the n floats at p (n a multiple of 64) in 64 independent lanes: a read stream that
 * the adds do not throttle (4 x 16 or 8 x 8 vectors in flight). */
FK_CLONES512 static float stream_sum(const float *restrict p, size_t n)
{
    float acc[64] = {0};
    for (size_t i = 0; i + 64 <= n; i += 64)
        for (int j = 0; j < 64; j++)
            acc[j] += p[i + j];
    float t = 0;
    for (int j = 0; j < 64; j++)
        t += acc[j];
    return t;
}

/* GB/s of reading the n floats at p over and over for at least 20 ms: the best of 5. The
 * clock is read once per 4 MiB of passes (a read costs about a microsecond: once per pass
 * it would dominate a buffer held in L1 or L2). */
static double resident_gbs(const float *p, size_t n, volatile float *sink)
{
    double best = 0;
    size_t reps = ((size_t)1 << 20) / n + 1;
    for (int r = 0; r < 5; r++) {
        double t0 = fk_clock_s(CLOCK_THREAD_CPUTIME_ID), dt;
        size_t passes = 0;
        do {
            for (size_t i = 0; i < reps; i++)
                *sink += stream_sum(p, n);
            passes += reps;
            dt = fk_clock_s(CLOCK_THREAD_CPUTIME_ID) - t0;
        } while (dt < 0.02);
        double gbs = (double)passes * (double)n * sizeof(float) / dt / 1e9;
        best = gbs > best ? gbs : best;
    }
    return best;
}

/* GB/s of reading whole random rows (N floats) of the N x N floats at g: 3 passes of 256
 * rows each (seeded), the best. */
static double rows_gbs(const float *g, size_t N, volatile float *sink)
{
    gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
    if (!r)
        return 0;
    gsl_rng_set(r, 7);
    double best = 0;
    for (int p = 0; p < 3; p++) {
        double t0 = fk_clock_s(CLOCK_THREAD_CPUTIME_ID);
        for (int i = 0; i < 256; i++)
            *sink += stream_sum(g + (size_t)gsl_rng_uniform_int(r, N) * N, N);
        double dt = fk_clock_s(CLOCK_THREAD_CPUTIME_ID) - t0;
        double gbs = 256.0 * (double)N * sizeof(float) / dt / 1e9;
        best = gbs > best ? gbs : best;
    }
    gsl_rng_free(r);
    return best;
}

int fk_bench_omp_roofline(int n_atoms, int sparsity, double gemm_vps_per_core,
                          struct fk_bench_roofline *out)
{
    memset(out, 0, sizeof *out);
    if (n_atoms < 64 || n_atoms % 64 || sparsity < 2 || !(gemm_vps_per_core > 0))
        return fk_err(FK_EINVAL, "roofline: needs N a multiple of 64 (got %d), s >= 2 (got "
                      "%d) and a measured SGEMM floor", n_atoms, sparsity);
    size_t N = (size_t)n_atoms, s = (size_t)sparsity;
    double passes_l2 = 0, passes_mac = 0;
    for (size_t k = 1; k < s; k++) {
        passes_l2 += (double)(k + 2);
        passes_mac += (double)(k + 1);
    }
    out->row_bytes = 4.0 * (double)N * (double)(s - 1);
    out->l2_bytes = 4.0 * (double)N * passes_l2;
    out->macs = (double)N * passes_mac;
    float *l2 = malloc(sizeof(float) * (s + 1) * N);
    float *g = malloc(sizeof(float) * N * N);
    if (!l2 || !g) {
        free(l2);
        free(g);
        return fk_err(FK_ENOMEM, "roofline: out of memory for a %zu x %zu buffer", N, N);
    }
    for (size_t i = 0; i < (s + 1) * N; i++)
        l2[i] = (float)(i % 7);
    for (size_t i = 0; i < N * N; i++) /* touched: every page is mapped before timing */
        g[i] = (float)(i % 5);
    volatile float sink = 0;
    out->l2_gbs = resident_gbs(l2, (s + 1) * N, &sink);
    out->row_gbs = rows_gbs(g, N, &sink);
    free(l2);
    free(g);
    if (!(out->l2_gbs > 0) || !(out->row_gbs > 0))
        return fk_err(FK_EEXTERNAL, "roofline: no bandwidth measured (clock?)");
    out->t_floor = 1.0 / gemm_vps_per_core;
    out->t_l2 = out->l2_bytes / (out->l2_gbs * 1e9);
    out->t_row = out->row_bytes / (out->row_gbs * 1e9);
    double t = out->t_floor + (out->t_l2 > out->t_row ? out->t_l2 : out->t_row);
    out->bound_ratio = out->t_floor / t;
    out->serial_ratio = out->t_floor / (out->t_floor + out->t_l2 + out->t_row);
    return FK_OK;
}
