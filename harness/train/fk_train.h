/* SPDX-License-Identifier: MIT
 * Dictionary training for `fadkv-bench train-dict` (spec algorithms.md section 9).
 *
 * Methods, per (layer, kind), on vectors of calibration traces (never the evaluation ones):
 *   sample  N distinct training vectors, normalised (also the initialisation of the others);
 *   random  N Gaussian random unit atoms (a baseline);
 *   bcd     alternating: OMP codes of every training vector with the current atoms (Batch-OMP,
 *           Gram mode), then one pass of exact block-coordinate descent over the atoms on the
 *           statistics A = sum c c^T and B = sum x c^T (Mairal et al.'s dictionary update,
 *           batch form); unused atoms are re-seeded with the worst-coded training vectors;
 *   lexico  Lexico's objective: mini-batches of OMP codes, gradient of the mean squared error,
 *           tangent projection, Adam (lr 1e-3 by default), renormalisation.
 * Held-out error (mean relative OMP error on a held-out split) is reported per epoch.
 */
#ifndef FK_TRAIN_H
#define FK_TRAIN_H

#include <stdint.h>

enum fk_train_method { FK_TRAIN_SAMPLE, FK_TRAIN_RANDOM, FK_TRAIN_BCD, FK_TRAIN_LEXICO };

struct fk_train_opts {
    int n_atoms;                 /* N */
    int s;                       /* sparsity used for training and held-out error */
    int epochs;                  /* passes (bcd, lexico) */
    enum fk_train_method method;
    uint64_t seed;
    double heldout_frac;         /* fraction of vectors held out (every k-th vector) */
    int max_train;               /* cap of training vectors per (layer, kind), 0 = all */
    double lr;                   /* lexico: Adam learning rate */
    int batch;                   /* lexico: mini-batch size */
    int jobs;                    /* dictionaries trained in parallel */
    int keep_best;               /* 1: keep the epoch (0 = initialisation included) with
                                    the lowest held-out error, not the last one */
};

void fk_train_defaults(struct fk_train_opts *o);

/* Progress callback: one call per (layer, kind, epoch), epoch 0 = initialisation. */
typedef void (*fk_train_progress)(void *ctx, int layer, int kind, int epoch,
                                  double heldout_err, double train_err, double seconds);

/* Trains n_layers x 2 dictionaries from the vectors of one (layer, kind) read by the caller:
 * X[layer][kind] holds n[layer][kind] vectors of dimension m. atoms_out: [L][2][N][m]. */
struct fk_train_data {
    int n_layers, m;
    float **x;                   /* [L*2] vectors [n][m] */
    long *n;                     /* [L*2] counts */
};

int fk_train_run(const struct fk_train_opts *o, const struct fk_train_data *data,
                 float *atoms_out, double *heldout_err /* [L*2], final */,
                 fk_train_progress cb, void *cb_ctx);

/* Mean relative OMP error (s atoms, Gram mode) of vectors X [n][m] on atoms [N][m]. */
int fk_train_eval(const float *atoms, int N, int m, int s, const float *x, long n, double *err);

#endif
