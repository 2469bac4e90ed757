/* SPDX-License-Identifier: MIT
 * Metric observers of the replay engine. The driver (fk_drive.h) runs a codec through the
 * eviction schedule of one unit (one layer of one trace, K and V); every metric family
 * watches it through one observer, which owns its accumulators and, when the unit ends,
 * fills its own slice of the unit's struct fk_stream_result (K and V) and attention
 * accumulator. The observers of fk_observers[] run in that order at every callback.
 *
 * Adding a metric = one observer: a `const struct fk_observer_ops` with the callbacks it
 * needs (NULL = nothing to do), its state size, and one line in fk_observers[]
 * (fk_observe.c); its results go into new fields of struct fk_stream_result (fk_replay.h),
 * which the results store then reads. An observer must not read another's accumulators or
 * change the codec states (reconstruct, sparse_row, atoms and stats are read-only).
 */
#ifndef FK_OBSERVE_H
#define FK_OBSERVE_H

#include <stddef.h>
#include <stdint.h>

#include "core/fk_codec.h"
#include "core/fk_registry.h"
#include "engine/fk_replay.h"
#include "formats/fk_trace.h"

/* Thread CPU seconds of one worker, by activity (summed into struct fk_cell_result). */
struct fk_unit_times {
    double t_io, t_encode, t_attn, t_metrics, t_gram;
    double t_policy;             /* the eviction policy's hooks */
};

/* One unit as the driver and the observers see it. Everything is borrowed from the worker
 * and valid for the whole unit; st[] and n_comp[] change as the driver runs. */
struct fk_unit {
    const struct fk_codec_ops *ops;
    const void *opts;                 /* ops->opts_size bytes, starts with fk_common_opts */
    const struct fk_replay_opts *ro;
    const char *path;                 /* the trace's file, for messages */
    int layer, n_layers;
    int n_kv_heads, n_q_heads;        /* H, H_q */
    int n_tokens, prompt_len;         /* T, P */
    int head_dim;                     /* m */
    const void *kv[2];                /* [H][T][m] exact K and V as stored (kv_enc words) */
    enum fk_encoding kv_enc[2];
    const struct fk_base_dict *bases; /* [2] the K and V bases (FK_CAP_DICT), or NULL */
    const struct fk_basis *basis[2];  /* the K and V projection bases (FK_CAP_BASIS), or NULL */
    const struct fk_calib *calib[2];  /* the K and V calibrations (FK_CAP_CALIB), or NULL */
    const int32_t *positions;         /* [T] the trace's position ids */
    const float *ext[2];              /* [H][T][m] external K and V rows (FK_CAP_EXTERNAL) */
    double attn_inv_scale, attn_softcap; /* the layer's attention (fk_trace_layer_attention) */
    int attn_window;
    const struct fk_rope *rope;       /* the trace's RoPE with post-RoPE keys, or NULL */
    int attention;                    /* evaluate attention on this layer */
    const float *q;                   /* [H_q][n_qsel][m] query rows of the attention steps */
    int n_qsel;
    const int32_t *qrow;              /* [T] row in q of token t's attention step, or -1 */
    void *st[2];                      /* the open K and V codec states */
    struct fk_buffer buf[2];          /* the K and V buffer rules (fk_codec_buffer) */
    int n_comp[2];                    /* K / V tokens 0 .. n_comp[k]-1 are compressed */
    /* A token-eviction policy (core/fk_evict.h), or evict NULL. The driver runs it; keep is
     * its mask [H][T] (1 = retained) as the attention of the current step sees it; rows
     * after the current token are 0. Observers read only retained rows. */
    const struct fk_evict_ops *evict;
    const void *evict_opts;
    const double *head_scores;        /* the dataset's head pattern, or NULL */
    uint8_t *keep;                    /* [H][T], owned by the worker; NULL without a policy */
    const float *kvf[2];              /* [H][T][m] exact K and V as float32 (the policy's view) */
    const float *qa;                  /* [H_q][n_qa][m] the queries the policy reads */
    int n_qa;
    const int32_t *qarow;             /* [T] row in qa of token t's query, or -1 */
    /* The prefill's row rewrites (evict/fk_rewrite.h), or rewrite NULL. The driver applies
     * them after the policy's prefill hook into kvw, the rows the cache holds from then on
     * (what the codec codes, the attention's cache side and later policy hooks read); kv
     * stays the exact reference. think_tokens prompt tokens of every head have keys with
     * think_channels channels fewer (bytes), each (layer, head) a mask of think_mask bytes. */
    const struct fk_rewrite *rewrite;
    const float *kvw[2];              /* [H][T][m] float32, or NULL: the exact rows */
    int think_tokens, think_channels, think_mask;
    struct fk_unit_times *times;      /* observers add their own time where it belongs */
};

/* One event as committed by encode() for one stream. */
struct fk_commit {
    int kind;                         /* 0 K, 1 V */
    const struct fk_event *ev;        /* phase, step, vectors x [n][m], token, head */
    const struct fk_vec_out *out;     /* [n] what encode() reported */
    const int32_t *tok_step;          /* [T] decode step evicting each token (a static
                                       * codec's blocks run ahead of it), or NULL: every
                                       * vector belongs to ev->step */
    double cpu_s;                     /* thread CPU seconds of the encode() call */
};

enum fk_step_when {
    FK_STEP_BEGIN = 0,                /* before the step's eviction: the cache attention sees */
    FK_STEP_END = 1,                  /* after it */
};

/* One decode step (step = t - P). n_comp: K and V tokens compressed at that moment. */
struct fk_step {
    int step, t;
    int n_comp[2];
    enum fk_step_when when;
    /* FK_STEP_BEGIN with a policy: the rows (h * T + token) it dropped since the previous
     * step (at the first step, the prefill's drops too), ascending; else 0 / NULL */
    int n_dropped;
    const int32_t *dropped;
};

/* Where a unit's results go: its K and V stream results and its attention accumulator. */
struct fk_unit_result {
    struct fk_stream_result *sr[2];
    struct fk_attn_acc *attn;
};

struct fk_observer_ops {
    const char *name;
    size_t size;                      /* bytes of its state, zeroed when created */
    /* A unit begins: reset the accumulators (dropping whatever a failed unit left). */
    int (*start)(void *self, const struct fk_unit *u);
    /* Every committed event, K and V, in the order they were encoded. */
    int (*on_commit)(void *self, const struct fk_unit *u, const struct fk_commit *c);
    /* Every decode step, twice (FK_STEP_BEGIN, then FK_STEP_END). */
    int (*on_step)(void *self, const struct fk_unit *u, const struct fk_step *s);
    /* The unit's last step is done (codec states still open, n_comp final): write this
     * observer's slice of r; arrays move into r (r owns them from then on). */
    int (*on_finish)(void *self, const struct fk_unit *u, struct fk_unit_result *r);
    /* (optional) Adds the accumulators of `other` (the same observer, over later events of
     * the same streams) into self, so that a stream replayed in parts can be summed in a
     * fixed order. NULL: the observer's metrics are not additive. */
    int (*merge)(void *self, const void *other);
    /* Frees everything self holds (after any callback, also after an error). */
    void (*release)(void *self);
};

/* The engine's observers, in call order (NULL-terminated). */
extern const struct fk_observer_ops *const fk_observers[];

/* A set of observer instances (one per fk_observers[] entry). */
struct fk_obs_set {
    int n;
    const struct fk_observer_ops **ops; /* [n] */
    void **self;                        /* [n] their states */
};

int fk_obs_set_create(struct fk_obs_set *set);
void fk_obs_set_free(struct fk_obs_set *set);

#endif
