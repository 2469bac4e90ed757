/* SPDX-License-Identifier: MIT
 * Kernel benchmark of the OMP core (spec: anchors.md B3): Batch-OMP in Gram mode end to end
 * (block SGEMM correlations + greedy loops on the harness's own threads) against the
 * correlation SGEMM alone on the same batch (the floor), a naive-mode reference on a
 * subset, and support agreement Gram vs naive. Warm-up, then the median of repeats.
 * No printing: the CLI (fk_cli_bench_omp.c) formats the result.
 */
#ifndef FK_BENCH_H
#define FK_BENCH_H

#include "kernels/fk_sparse.h"

#include <stddef.h>
#include <stdint.h>

struct fk_bench_omp_cfg {
    int n_atoms;       /* N, dictionary atoms */
    int dim;           /* m, vector length */
    int sparsity;      /* s, atoms per code (also of the synthetic signals) */
    int n_signals;     /* signals in the timed batch */
    int threads;       /* worker threads, 1..FK_BENCH_MAX_THREADS */
    int repeats;       /* timed repeats after one warm-up, >= 1 */
    int block;         /* signals per block (one SGEMM + greedy loops), >= 1 */
    int naive_signals; /* subset coded in naive mode (speed + agreement); 0 = none */
    double noise;      /* std of the Gaussian noise added per component of a signal */
    uint64_t seed;     /* GSL mt19937 seed for the dictionary and signals */
};

#define FK_BENCH_MAX_THREADS 64

/* Sets the defaults: N 4096, m 128, s 8, 16384 signals, 1 thread, 5 repeats, blocks of 256,
 * 2048 naive signals, noise 0.05, seed 1. */
void fk_bench_omp_defaults(struct fk_bench_omp_cfg *cfg);

/* A dictionary and a batch of signals (owned; release with fk_bench_omp_data_clear). */
struct fk_bench_omp_data {
    int n_atoms;    /* N */
    int dim;        /* m */
    int n_signals;  /* rows of signals */
    float *atoms;   /* (n_atoms, dim) row-major f32, unit-norm rows */
    float *signals; /* (n_signals, dim) row-major f32 */
};

/* Random unit-norm Gaussian dictionary and structured signals: each is a combination of
 * cfg->sparsity distinct atoms with N(0,1) coefficients plus N(0, noise^2) per component. */
int fk_bench_omp_data_make(const struct fk_bench_omp_cfg *cfg, struct fk_bench_omp_data *out);
/* HDF5 file with datasets /dict (N, m) and /signals (n, m), float32; attributes sparsity,
 * seed, noise on the root group. */
int fk_bench_omp_data_write(const char *path, const struct fk_bench_omp_data *data,
                            const struct fk_bench_omp_cfg *cfg);
int fk_bench_omp_data_read(const char *path, struct fk_bench_omp_data *out);
void fk_bench_omp_data_clear(struct fk_bench_omp_data *data);

struct fk_bench_omp_result {
    double gram_s;          /* seconds to build G = D^T D (SSYRK + mirror), once */
    double e2e_med_s;       /* end to end (SGEMM + greedy) seconds, median of repeats */
    double e2e_min_s;       /* minimum of repeats */
    double gemm_med_s;      /* correlation SGEMM alone on the same blocks, median */
    double gemm_min_s;      /* minimum of repeats */
    double e2e_vps;         /* vectors per second end to end (median) */
    double gemm_vps;        /* vectors per second of the SGEMM floor (median) */
    double e2e1_vps;        /* end to end with the greedy loops one vector at a time */
    int one_identical;      /* 1: those codes are bit-identical to the batched ones */
    double e2e_gflops;      /* effective GFLOP/s: (2 m N + N s^2) per vector */
    double floor_ratio;     /* e2e_med_s / gemm_med_s (>= 1; 1 = the loop is free) */
    double naive_vps;       /* naive mode, single thread, on the subset; 0 if none */
    int naive_n;            /* signals in the naive subset */
    int agree_n;            /* of them, supports identical as sets to Gram mode */
    double mean_k;          /* mean atoms per code (Gram mode) */
    double mean_rel_err;    /* mean sqrt(err2 / xx) over non-zero signals */
    long n_premature;       /* codes flagged FK_CODE_PREMATURE */
    long n_dependent;       /* codes flagged FK_CODE_DEPENDENT */
    long n_guarded;         /* codes cut by the precision guard (FK_CODE_GUARDED) */
    uint64_t codes_hash;    /* FNV-1a over (k, idx, coef bits) of all codes: equal hashes at
                             * any thread count prove determinism */
};

/* Runs the benchmark on data (cfg->n_atoms/dim/n_signals are taken from data). codes
 * (nullable, data->n_signals entries) receives the Gram-mode codes of the last repeat.
 * Allocates its buffers before any timed region. */
int fk_bench_omp_run(const struct fk_bench_omp_cfg *cfg, const struct fk_bench_omp_data *data,
                     struct fk_bench_omp_result *res, struct fk_code *codes);

/* Writes codes to an HDF5 file (created or truncated): /codes_idx (n, s) int32 padded with
 * -1, /codes_coef (n, s) float64 padded with 0, /codes_k (n) int32, /codes_err2 and
 * /codes_xx (n) float64, attribute vectors_per_s (and threads, sparsity). */
int fk_bench_omp_codes_write(const char *path, const struct fk_code *codes, int n, int s,
                             const struct fk_bench_omp_result *res, int threads);

/* The screening coders next to Batch-OMP on the same data (`bench omp --pool n`): one
 * thread, blocks of cfg->block vectors, each block one correlation SGEMM followed by
 *   omp  fk_omp_gram_batch (lexico's coder),
 *   gm   Top-n pool, greedy OMP in the pool, ridge refinement (fk_omp_pool + fk_refine_gss),
 *   pl   Top-s support, ridge refinement,
 * with the codecs' default ridge (lambda0 1e-4, rho 0.2, one step). The three are timed in
 * turn within each of cfg->repeats rounds; each ratio is taken within a round and its median
 * reported. gm's codes (fk_omp_pool + fk_refine_gss, G_SS shared) against the unshared
 * path (fk_omp_naive + fk_refine) on the same pools: the share of codes with the same
 * support and the largest coefficient difference relative to 1 + |coefficient| (today the
 * same arithmetic: 100 % and 0; a change of gm's kernels shows here). */
struct fk_bench_screen_result {
    int pool;                      /* n */
    double omp_vps, gm_vps, pl_vps; /* vectors per second, median of rounds */
    double gm_rel, pl_rel;          /* time per vector relative to omp, median of rounds */
    double gm_rel_r[8], pl_rel_r[8]; /* per round (first 8) */
    int rounds;
    double gm_support_same;         /* share of codes with gm's support equal to naive's */
    double gm_coef_diff;            /* max |coef - naive coef| / (1 + |naive coef|) over them */
    /* wall us per vector of each stage, median of rounds: [omp, gm, pl][correlations, Top-n,
     * greedy loop (Batch-OMP's or the pool OMP), refinement]; 0 for a stage a coder does not
     * have */
    double stage_us[3][4];
};

int fk_bench_screen_run(const struct fk_bench_omp_cfg *cfg, const struct fk_bench_omp_data *data,
                        int pool, struct fk_bench_screen_result *res);

/* The roofline of Batch-OMP's greedy loop in Gram mode (`bench omp`), per vector coded to s
 * atoms over N, one core: after the correlation SGEMM (the floor), s - 1 correlation
 * passes (codecs/kernels/fk_omp.c, strip_full), pass k reading the new atom's Gram row
 * (N floats, a random row of the N x N Gram: from memory), the k - 1 earlier rows of its
 * orthonormalised correlations (k - 1 times N floats, from L2), reading and writing the
 * correlations c and writing its own row (3 N). Counted: row_bytes = 4 N (s - 1), l2_bytes =
 * 4 N sum_k (k + 2), macs = N sum_k (k + 1) (the earlier rows, the scaling, c's update).
 * Measured on this core: the read bandwidth over a buffer of (s + 1) N floats held in L2
 * (best of 5 passes) and over random whole rows of an N x N buffer (best of 3). The bound:
 * t = t_floor + max(l2_bytes / l2_gbs, row_bytes / row_gbs) (the two streams overlapped,
 * the arithmetic free), its ratio to the floor t_floor / t; `serial` adds them instead. */
struct fk_bench_roofline {
    double macs, l2_bytes, row_bytes;   /* counted per vector */
    double l2_gbs, row_gbs;             /* measured, GB/s */
    double t_floor, t_l2, t_row;        /* seconds per vector */
    double bound_ratio, serial_ratio;   /* t_floor / t: at most what the loop can reach */
};

/* gemm_vps_per_core: the SGEMM floor's vectors per second on one core. */
int fk_bench_omp_roofline(int n_atoms, int sparsity, double gemm_vps_per_core,
                          struct fk_bench_roofline *out);

/* CLI layer (harness/cli/fk_cli_bench_omp.c): `bench omp` with argv[0] = "omp"; parses its own
 * options, prints a table. Returns the process exit status (0, 1 on failure, 2 on usage). */
int fk_cli_bench_omp(int argc, char **argv);

/* Median of v [n] (n >= 1), sorting v in place. */
double fk_bench_median_sort(double *v, int n);

#endif
