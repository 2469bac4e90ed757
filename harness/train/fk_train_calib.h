/* SPDX-License-Identifier: MIT
 * `fadkv-bench train-calib` as a library call: KVQuant's calibration (simquant; spec
 * families-quant-2026.md 4.2) of every layer at one or more outlier fractions f, from
 * calibration traces, one layer in memory at a time, written as a calibration file v1
 * (datasets/CALIB.md) atomically. Keys are un-rotated to pre-RoPE (kernels/fk_rope.h) first:
 * every trace must describe its RoPE and store post-RoPE keys.
 *
 * With t = 1 - f/2: key channel thresholds = the t and 1 - t quantiles (linear rule) of the
 * channel's calibration values, rounded to fp16; value rows (all KV heads of a token, or one
 * head) normalised by their own quantiles; the LUTs are 1-D Lloyd k-means levels (2, 3 and 4
 * bits) of the normalised values with |u| <= 1, the first `sinks` tokens of every trace left
 * out.
 */
#ifndef FK_TRAIN_CALIB_H
#define FK_TRAIN_CALIB_H

#include "formats/fk_calib.h"

struct fk_train_calib_cfg {
    const char *out;             /* calibration file to write */
    char *const *traces;         /* calibration traces (never the evaluation traces) */
    int n_traces;
    int n_fractions;             /* 1 .. FK_CALIB_MAX_FRACTIONS */
    double fractions[FK_CALIB_MAX_FRACTIONS]; /* ascending, distinct, each in [0, 0.5) */
    int sinks;                   /* first tokens of each trace left out of the LUT fits (>= 0) */
    int assume_rope;             /* 0, or 1 + enum fk_rope_layout: the RoPE of the traces that
                                  * do not describe theirs (no rope_layout; type default, their
                                  * rope_theta), as the user states it (--rope); a trace that
                                  * describes another layout is refused */
};

struct fk_train_calib_hooks {
    void *ctx;
    /* the traces are open and agree: their number, shape and calibration tokens */
    void (*opened)(void *ctx, int n_traces, int n_layers, int n_kv_heads, int head_dim,
                   long tokens);
    /* one layer done: for each fraction, the share of the non-sink key and value (row
     * groups) elements that fell inside their thresholds (|u| <= 1) and fed the LUTs */
    void (*layer_done)(void *ctx, int layer, int n_fractions, const double *inside_k,
                       const double *inside_v, double seconds);
};

/* Checks the configuration; FK_EINVAL with a message naming the option. */
int fk_train_calib_check(const struct fk_train_calib_cfg *c);

int fk_train_calib_run(const struct fk_train_calib_cfg *c, const struct fk_train_calib_hooks *h);

/* The 1-D Lloyd k-means of the trainer (datasets/CALIB.md), for tests: the k levels of the n
 * values x (sorted in place), ascending. FK_EINVAL when n < k. */
int fk_train_calib_kmeans(double *x, size_t n, int k, double *levels);

#endif
