/* SPDX-License-Identifier: MIT
 * `fadkv-bench train-dict` as a library call: reads the keys and values of calibration
 * traces, trains one dictionary per (layer, kind) with fk_train_run (or every method, to
 * compare them) and writes a dictionary file v1 whose attributes record the method, the
 * options, the training traces with their SHA-256 and the held-out error.
 */
#ifndef FK_TRAIN_DICT_H
#define FK_TRAIN_DICT_H

#include "train/fk_train.h"

extern const char *const fk_train_method_names[]; /* "sample", "random", "bcd", "lexico" */

struct fk_train_dict_hooks {
    void *ctx;
    /* the traces are read: vectors over every (layer, kind) */
    void (*loaded)(void *ctx, int n_traces, int n_layers, int head_dim, long vectors,
                   double seconds);
    void (*method_start)(void *ctx, enum fk_train_method m);
    /* one method trained: mean held-out error over the dictionaries */
    void (*method_done)(void *ctx, enum fk_train_method m, int epochs, double heldout_err,
                        int n_dicts, double seconds);
    fk_train_progress progress;  /* per (layer, kind, epoch) */
};

struct fk_train_dict_cfg {
    struct fk_train_opts o;
    const char *out;             /* dictionary file to write */
    char *const *traces;         /* calibration traces */
    int n_traces;
    long max_load;               /* evenly spaced cap of vectors per (layer, kind), 0: all */
    int compare;                 /* train with every method first (the requested one is kept) */
};

/* Checks the options; FK_EINVAL with a message naming what is wrong. */
int fk_train_dict_check(const struct fk_train_dict_cfg *c);

int fk_train_dict_run(const struct fk_train_dict_cfg *c, const struct fk_train_dict_hooks *h);

/* The provenance text of training traces: "PATH sha256:HEX; ..." (caller frees *out). */
int fk_train_trace_list(char *const *traces, int n, char **out);

#endif
