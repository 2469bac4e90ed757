/* SPDX-License-Identifier: MIT
 * Benchmark of the model in the loop (harness/loop): a llama2.c checkpoint of random weights
 * at a chosen shape (fk_bench_loop_make_model; the default is Llama-3.2-1B-like), the exact
 * model's tokens/s against the memory-bandwidth floor (weight bytes / read bandwidth
 * measured in the same run, one thread as the runner), and each codec's time in the loop
 * relative to the exact model, interleaved (exact, codec, exact, codec, ...). Every time is
 * the thread's CPU time (everything runs on one thread), so that a loaded machine's
 * descheduling does not enter the numbers (its contention for memory bandwidth still does).
 * No printing: fk_cli_bench_loop.c formats.
 */
#ifndef FK_BENCH_LOOP_H
#define FK_BENCH_LOOP_H

#include <stdint.h>

#include "gen/fk_llama2c.h"

/* Writes a llama2.c legacy checkpoint of shape c (dim, hidden_dim, n_layers, n_heads,
 * n_kv_heads, vocab_size, seq_len; shared classifier) with seeded random weights (uniform,
 * scale 1/sqrt(fan-in); norms 1) and the default RoPE tables, atomically (path.tmp). */
int fk_bench_loop_make_model(const char *path, const struct fk_llama2c_config *c,
                             uint64_t seed);

#define FK_BENCH_LOOP_MAX 32

struct fk_bench_loop_cfg {
    const char *model;           /* checkpoint */
    int prompt_len, steps;       /* random prompt ids, decode positions */
    int repeats;                 /* interleaved rounds (>= 1) */
    int n_codecs;
    const char *codec[FK_BENCH_LOOP_MAX];      /* names */
    const char *const *sets[FK_BENCH_LOOP_MAX]; /* per codec: "opt=value", NULL-terminated */
    uint64_t seed;
    int block;                   /* > 1: each codec also teacher-forced in blocks of this many
                                  * positions (fk_loop_codec.block), right after its run */
};

struct fk_bench_loop_result {
    double weight_bytes;         /* float32 weights read per token */
    double read_gbs;             /* read bandwidth, GB/s: best of the passes over the weights */
    double floor_s;              /* weight_bytes / read bandwidth: seconds per token at best */
    double exact_s;              /* exact model, seconds per token (median over rounds) */
    double floor_ratio;          /* floor_s / exact_s (1 = at the bandwidth floor) */
    double codec_s[FK_BENCH_LOOP_MAX];     /* in the loop, seconds per token (median) */
    double codec_ratio[FK_BENCH_LOOP_MAX]; /* median over rounds of codec / adjacent exact */
    double codec_kl[FK_BENCH_LOOP_MAX];    /* its e2e KL (the random model's), a sanity value */
    /* with cfg.block > 1: teacher-forced decode tokens/s of the forward passes (the loop's
     * t_forward over its steps), one position per pass and in blocks (medians), the median
     * of the per-round ratios (blocks / one), and |e2e KL in blocks - one at a time| */
    double tf_one_tps[FK_BENCH_LOOP_MAX], tf_blk_tps[FK_BENCH_LOOP_MAX];
    double tf_blk_speedup[FK_BENCH_LOOP_MAX], tf_blk_dkl[FK_BENCH_LOOP_MAX];
};

int fk_bench_loop_run(const struct fk_bench_loop_cfg *cfg, struct fk_bench_loop_result *out);

#endif
