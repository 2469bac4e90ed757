/* SPDX-License-Identifier: MIT
 * The replay engine: drives a codec through the prefill/decode semantics of spec section 4
 * for every (trace, layer, kind) of a cell, and observes every committed code.
 *
 * Work is split into units of one layer (all traces of the cell), so the layer's Gram
 * matrices are built once and stay hot; units run on --jobs worker threads, each computing
 * its unit wholly, and results land in fixed slots: the numbers do not depend on the
 * thread count. Traces are read one (layer, kind) at a time: peak memory does not grow with
 * the number of layers.
 *
 * Inside, a unit (one layer of one trace) is three parts: the eviction schedule
 * (fk_schedule.h, pure arithmetic), the codec driver (fk_drive.h: opens the K and V states,
 * runs the schedule's events through encode(), closes the states on every path) and the
 * metric observers (fk_observe.h), each of which owns its accumulators and fills its own
 * fields of struct fk_stream_result below.
 *
 * Adding a metric: write one observer in fk_observe.c (a `const struct fk_observer_ops`
 * with start / on_commit / on_step / on_finish / merge / release as it needs, see
 * fk_observe.h), add it to fk_observers[] there, and add its result fields to struct
 * fk_stream_result (or struct fk_cell_result) here, with their meaning; the results store
 * then writes them. No change to the driver or to the other observers.
 */
#ifndef FK_REPLAY_H
#define FK_REPLAY_H

#include <signal.h>
#include <stdint.h>

#include "engine/fk_attn.h"
#include "core/fk_codec.h"
#include "core/fk_evict.h"
#include "formats/fk_basis.h"
#include "formats/fk_calib.h"
#include "formats/fk_dict.h"
#include "formats/fk_trace.h"

#define FK_HIST_BINS 24 /* log2 usage bins: 0, 1, 2-3, 4-7, ... */
#define FK_RECALL_NS 8  /* recall@n for n = 8, 16, ..., 1024 */
#define FK_RECALL_POOL 256 /* the screening diagnostics' pool size for a codec without one
                            * (FK_ROLE_POOL): the paper's n for its 3B model */

struct fk_replay_opts {
    int jobs;                    /* worker threads (>= 1) */
    int attention;               /* compute attention fidelity */
    int attn_stride;             /* every k-th decode step */
    const uint8_t *attn_layers;  /* [n_layers] 1 = evaluate, or NULL = all */
    int recall;                  /* screened-pool recall diagnostics (dictionary codecs) */
    int recall_every;            /* sub-sample prefill tokens for recall (default 8) */
    volatile sig_atomic_t *stop; /* set by a signal handler: stop at the next unit */
    int reference;               /* codecs run their straightforward reference algorithms */
    int row_hashes;              /* keep a hash of every stored row's support (benchmarks) */
    const uint8_t *layers;       /* [n_layers] 1 = replay this layer, or NULL = all (a layer
                                  * left out keeps empty results: benchmarks use it) */
    /* (optional) called after each unit (one layer of every trace), serialised by the
     * engine: units done and in all, vectors coded so far in this cell */
    void (*progress)(void *ctx, int units_done, int units_total, long vectors);
    void *progress_ctx;
    struct fk_replay_pool *pool; /* (optional) Gram buffers kept from cell to cell */
};

/* Worker Gram buffers kept from one fk_replay_cell to the next: a fresh buffer of a large
 * dictionary's Gram costs page faults (in host and guest on a VM), which every worker of
 * every cell would pay otherwise. The pool keeps one slot per worker of the largest job
 * count seen, each with the buffers of the largest dictionary seen; a cell whose codec uses
 * no Gram releases them all (reference-mode cells keep them). One pool serves one
 * fk_replay_cell at a time. */
struct fk_replay_pool;
int fk_replay_pool_new(struct fk_replay_pool **out);
void fk_replay_pool_free(struct fk_replay_pool **pool);
/* Bytes of Gram buffers the pool holds between cells. */
size_t fk_replay_pool_bytes(const struct fk_replay_pool *pool);

/* Everything measured on one (trace, layer, kind) stream group. */
struct fk_stream_result {
    long n_vectors;              /* coded vectors, zero vectors excluded */
    long n_zero;                 /* zero vectors (excluded from error means) */
    long n_prefill_coded;        /* of which coded in prefill */
    double err_sum;              /* sum of relative errors of the stored rows */
    double err_enc_sum;          /* sum of unquantised relative errors (what adaptation sees) */
    double err_final_sum;        /* sum of errors re-measured with the final dictionary */
    double res2_sum, x2_sum;     /* pooled energies ||x - x_hat||^2 and ||x||^2 */
    double nnz_sum;              /* stored coefficients */
    double cpu_s;                /* encoder thread CPU time, seconds */
    struct fk_stream_stats st;   /* codec counters (pointer members are NULL) */
    double inactive_after_prefill; /* fraction of base atoms unused by prefill codes (NaN: n/a) */
    double gini;                 /* Gini coefficient of use_total (NaN: n/a) */
    double top10_share;          /* share of uses going to the top 10% atoms */
    double adapted_share;        /* share of uses going to adapted atoms */
    uint32_t hist_prefill[FK_HIST_BINS], hist_total[FK_HIST_BINS]; /* usage histograms */
    uint8_t *inactive;           /* [N] 1 = unused after prefill (for cross-prompt overlap) */
    double bytes_buf, bytes_full;/* buffer and full-precision bytes (fp16 accounting) */
    double bytes_tok_avg;        /* time average over decode steps t of B(t) / (t + 1), B(t)
                                  * = codes + dictionary state + exact tokens after step t,
                                  * summed over heads (families.md 0.1.6); NaN: no step. With
                                  * an eviction policy only retained rows count (codes of the
                                  * kept coded rows, 2 m bytes per kept exact row) */
    long n_kept;                 /* rows (head, token) retained at the end (H T without a
                                  * policy); error sums and bytes then cover these only */
    int n_tokens;                /* T of the trace */
    int n_heads, head_dim;       /* H_kv, m */
    int n_steps;                 /* decode steps */
    float *dict_norm;            /* [n_steps] N_t / N after each decode step */
    double *step_err;            /* [n_steps] sum of errors of vectors coded at that step */
    int32_t *step_n;             /* [n_steps] their count */
    double recall[FK_RECALL_NS]; /* mean recall@n of full-OMP atoms (NaN: not computed) */
    double support_agree;        /* mean |S_screened & S_omp| / s at the cell's n */
    double err_ratio;            /* mean e_screened / mean e_omp at the cell's n */
    double screen_err_omp, screen_err_scr; /* their sums over the recall_n vectors (0: none) */
    long recall_n;               /* vectors the recall was measured on */
    double *corr_profile;        /* [256] mean sorted |D^T x| / max, or NULL */
    int corr_len;                /* entries of corr_profile filled: min(256, live atoms) */
    uint64_t support_hash;       /* FNV-1a of every stored row's atom ids (sparse codecs) */
    uint64_t *row_hash;          /* [n_row_hash] per stored row (head-major), when asked */
    long n_row_hash;
};

struct fk_cell_result {
    int n_traces, n_layers;
    struct fk_stream_result *streams; /* [trace][layer][kind] */
    struct fk_attn_acc *attn;         /* [trace][layer] */
    double wall_s;                    /* wall time of the cell */
    double t_io, t_encode, t_attn, t_metrics, t_gram; /* summed over workers, seconds */
    double t_policy;                  /* the eviction policy's hooks, summed likewise */
    long vectors;                     /* coded vectors in total */
};

struct fk_head_pattern;

struct fk_cell_input {
    const struct fk_codec_ops *ops;
    const void *opts;                 /* ops->opts_size bytes */
    struct fk_trace *const *traces;   /* same head_dim and layer count */
    int n_traces;
    const struct fk_dict *dict;       /* required when ops->caps & FK_CAP_DICT */
    const struct fk_basis_file *basis; /* required when ops->caps & FK_CAP_BASIS */
    const struct fk_calib_file *calib; /* required when ops->caps & FK_CAP_CALIB */
    struct fk_trace *const *external; /* [n_traces] reconstruction files, trace-shaped;
                                       * required when ops->caps & FK_CAP_EXTERNAL */
    const struct fk_evict_ops *evict; /* (optional) a token-eviction policy over the codec
                                       * (core/fk_evict.h), NULL: none */
    const void *evict_opts;           /* evict->opts_size bytes */
    const struct fk_rewrite *rewrite; /* (optional) the prefill's row rewrites (merge,
                                       * think: evict/fk_rewrite.h), NULL: none */
    const struct fk_head_pattern *heads; /* the dataset's head pattern (engine/fk_heads.h),
                                       * required by a policy with FK_EVICT_NEED_HEADS */
};

int fk_replay_cell(const struct fk_cell_input *in, const struct fk_replay_opts *ro,
                   struct fk_cell_result *out);

/* The checks of a low-rank cell (FK_CAP_BASIS) that need its data, which a runner makes
 * before any cell runs (fk_replay_cell makes them again): a basis is given and matches every
 * trace's layers, KV heads and head_dim; ops->check accepts the options with the traces'
 * head_dim and the basis's components; FK_NEED_ROPE: every trace describes its RoPE with
 * post-RoPE keys, and the basis has pre-RoPE keys. Nothing to check for other codecs. */
int fk_replay_check_basis(const struct fk_cell_input *in);
/* The same for a calibrated quantiser (FK_CAP_CALIB): a calibration is given and matches
 * every trace's layers, KV heads and head_dim, holds the fraction of the codec's option
 * with role FK_ROLE_CALIB_FRACTION; ops->check accepts the options with the traces'
 * head_dim; FK_NEED_ROPE: every trace describes its RoPE with post-RoPE keys. */
int fk_replay_check_calib(const struct fk_cell_input *in);
/* The same for a codec of external reconstructions (FK_CAP_EXTERNAL): a reconstruction file
 * for every trace, each with its trace's layers, KV heads, tokens and head_dim. */
int fk_replay_check_external(const struct fk_cell_input *in);
/* The checks of a cell with an eviction policy or row rewrites, which a runner makes before
 * any cell runs (fk_replay_cell makes them again): the policy's options (its check), no
 * option name shared with the codec, a codec whose stored rows do not depend on rows the
 * policy drops (no dictionary that grows or adapts during decoding), the rewrites' rules
 * (fk_rewrite_check), and every query the policy and the rewrites read
 * (fk_evict_ops.needs) in every layer of every trace; messages name the trace, the layer
 * and what is missing. Nothing to check without either. */
int fk_replay_check_evict(const struct fk_cell_input *in);
void fk_cell_result_free(struct fk_cell_result *r);

/* The lock that serialises the engine's HDF5 calls (the library may be built without
 * thread safety): a caller that uses HDF5 while cells replay in other threads (a runner
 * committing one cell while others run) holds it around its calls. */
void fk_replay_h5_lock(void);
void fk_replay_h5_unlock(void);

/* The result of stream (trace, layer, kind) of a cell. */
struct fk_stream_result *fk_cell_stream(struct fk_cell_result *r, int trace, int layer,
                                        int kind);

#endif
