/* SPDX-License-Identifier: MIT
 * `fadkv-bench train-basis` as a library call: per (layer, kind) and group of g KV heads,
 * the mean, covariance and second moment of the calibration traces' vectors, accumulated in
 * double (one layer in memory at a time), their eigen-decompositions (GSL's symmetric
 * eigensolver, descending order) and a basis file v1 (datasets/BASIS.md) written atomically.
 * Keys are also un-rotated to pre-RoPE (kernels/fk_rope.h) when every calibration trace
 * describes its RoPE and stores post-RoPE keys.
 */
#ifndef FK_TRAIN_BASIS_H
#define FK_TRAIN_BASIS_H

struct fk_train_basis_cfg {
    const char *out;             /* basis file to write */
    char *const *traces;         /* calibration traces (never the evaluation traces) */
    int n_traces;
    int group;                   /* g KV heads per group (divides H_kv); 0 means 1 */
    int max_rank;                /* components kept per group; 0: all, g * head_dim */
};

struct fk_train_basis_hooks {
    void *ctx;
    /* the traces are open and agree: shape, calibration tokens, pre-RoPE keys trained */
    void (*opened)(void *ctx, int n_traces, int n_layers, int n_kv_heads, int head_dim,
                   long tokens, int pre_rope);
    /* one layer done: the share of the energy its K / V components 0 .. r-1 hold
     * (centered, mean over groups), for r = k/8, k/4, k/2 (k = g * head_dim) */
    void (*layer_done)(void *ctx, int layer, const double share_k[3], const double share_v[3],
                       double seconds);
};

/* Checks the configuration; FK_EINVAL with a message naming the option. */
int fk_train_basis_check(const struct fk_train_basis_cfg *c);

int fk_train_basis_run(const struct fk_train_basis_cfg *c, const struct fk_train_basis_hooks *h);

#endif
