/* SPDX-License-Identifier: MIT
 * The replay benchmark at paper scale (`fadkv-bench bench replay`).
 *
 * In one run, on the same data: every cell of the config (default configs/bench-3b.toml)
 * timed end to end with its time breakdown, written to the config's results directory;
 * optionally each cell again without attention (the attention overhead); then the
 * reference codec (by default the config's first static dictionary codec, i.e. full OMP)
 * on the first layers in the optimised path and in the reference mode (naive OMP
 * recomputing D^T r, no Gram, one vector at a time) with their stored supports compared;
 * then interleaved rounds of that codec at 1 and 2 worker threads and of the OMP kernel
 * benchmark at the same N, m, s, so every target is a ratio measured in one run. With coding
 * rounds, before the reference: every cell again in turn on a share of the layers per round,
 * one round after another, for coding-CPU ratios that a drifting machine does not skew.
 * Nothing is printed here: rows reach the caller through a hook, the rest in the result.
 */
#ifndef FK_BENCH_REPLAY_H
#define FK_BENCH_REPLAY_H

#include <stdint.h>

#include "bench/fk_bench.h"

#define FK_BENCH_MAX_ROUNDS 15
#define FK_BENCH_MAX_CELLS 48 /* cells of the coding rounds */

struct fk_bench_replay_cfg {
    const char *config;          /* sweep file (one of its datasets is replayed) */
    const char *dataset;         /* the dataset's name (NULL: the config's first); the cells
                                  * of the others are not run */
    int jobs;                    /* worker threads, 0: the config's */
    int ref_layers;              /* layers of the optimised vs reference comparison (0: none) */
    int scale_layers;            /* layers of the thread-scaling rounds */
    int rounds;                  /* interleaved rounds, 1..FK_BENCH_MAX_ROUNDS */
    int coding_rounds;           /* 0, or rounds of every cell in turn on a share of the
                                  * layers (round r: layers l with l mod S = r mod S), 2..15 */
    int coding_shares;           /* S: layer shares of the coding rounds (0: R; 1: every
                                  * round replays all layers) */
    int kernel;                  /* run the OMP kernel benchmark in each round */
    int attention;               /* 0: the config's cells without attention fidelity */
    int overhead;                /* replay each cell again without attention, right after */
    const char *only;            /* run only the cells of this codec (NULL: all) */
    const char *ref_codec;       /* codec of the comparison and rounds (NULL: see above) */
};

/* Sets the defaults: configs/bench-3b.toml, the config's jobs, 2 reference layers, 8
 * scaling layers, 3 rounds, kernel on, attention as configured, no overhead run. */
void fk_bench_replay_defaults(struct fk_bench_replay_cfg *cfg);

/* CPU seconds summed over threads (wall: wall seconds) of one replay. */
struct fk_bench_timing {
    double wall, io, corr, code, adapt, attn, metrics, gram, write, policy;
    long vectors;
};

/* What is replayed, reported before the first cell. */
struct fk_bench_replay_info {
    int n_traces, n_layers, n_q_heads, n_kv_heads, head_dim, n_tokens, prompt_len;
    int n_atoms;                 /* N of the dataset's dictionary (0: none) */
    int jobs, attention, attn_stride;
    const char *kernels;         /* OpenBLAS kernel set */
    const char *ref_codec;       /* the reference codec (--ref-codec, else the config's first
                                  * static dictionary codec): coding CPU is compared with it */
};

/* One cell of the config, after it ran (and, with overhead, after its run without
 * attention: without_s > 0). */
struct fk_bench_cell_row {
    const char *codec;
    struct fk_bench_timing t;
    double with_s, without_s;    /* replay seconds with and without attention */
};

struct fk_bench_replay_hooks {
    void *ctx;
    void (*info)(void *ctx, const struct fk_bench_replay_info *in);
    void (*cell)(void *ctx, const struct fk_bench_cell_row *row);
};

struct fk_bench_replay_result {
    double total_wall;           /* all cells, wall seconds */
    double ov_with, ov_without;  /* summed replay seconds with and without attention */
    long cells_rss_kib;          /* peak resident memory after the cells (0: they failed) */
    const char *ref_codec;       /* codec of the comparison and rounds (NULL: none ran) */
    /* optimised vs reference mode on ref_layers layers, 1 thread, no attention */
    int ref_done;
    struct fk_bench_timing opt, ref;
    long rows_same, rows;        /* stored supports identical / compared */
    /* interleaved rounds on scale_layers layers */
    int rounds;                  /* rounds run (0: none) */
    double vps1[FK_BENCH_MAX_ROUNDS], vps2[FK_BENCH_MAX_ROUNDS], scale[FK_BENCH_MAX_ROUNDS];
    uint64_t supports_hash2;     /* stored supports at 2 threads, last round */
    struct fk_bench_timing last1; /* 1-thread run of the last round */
    int kernel_done;
    struct fk_bench_omp_cfg kernel_cfg;
    int kernel_trace_signals;    /* decode vectors of the trace's layer 0 keys */
    /* [0] synthetic data, [1] the trace's layer 0 keys: kernel vec/s and replay / kernel */
    double kernel_vps[2][FK_BENCH_MAX_ROUNDS], kernel_ratio[2][FK_BENCH_MAX_ROUNDS];
    long peak_rss_kib;           /* peak resident memory of the whole benchmark */
    /* coding rounds: every cell in turn on round r's layers, so that each cell's coding CPU
     * is compared with the reference's measured moments apart, whatever the machine does
     * over minutes (round_cpu: gram + corr + code + adapt, CPU s) */
    int coding_rounds, coding_shares, n_round_cells;
    char round_cell[FK_BENCH_MAX_CELLS][48];
    double round_cpu[FK_BENCH_MAX_CELLS][FK_BENCH_MAX_ROUNDS];
    long round_vectors[FK_BENCH_MAX_CELLS][FK_BENCH_MAX_ROUNDS];
};

/* Runs the benchmark. Returns FK_OK or an error with fk_err's message; out is filled as far
 * as it ran. */
int fk_bench_replay_run(const struct fk_bench_replay_cfg *cfg,
                        const struct fk_bench_replay_hooks *hooks,
                        struct fk_bench_replay_result *out);

/* Median of n values (n <= FK_BENCH_MAX_ROUNDS). */
double fk_bench_median(const double *v, int n);

#endif
