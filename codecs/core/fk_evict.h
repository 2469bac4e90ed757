/* SPDX-License-Identifier: MIT
 * The token-eviction policy interface (issue 18; spec families.md sections 0.1, 2 and 4).
 *
 * A policy decides, per (layer, KV head), which tokens stay in the cache: it maintains a
 * keep mask keep[h][t] (1 = retained) over the tokens seen so far. It is independent of any
 * storage codec and of the replay engine: the replay driver (harness/engine/fk_drive.c) and
 * a closed-loop decoder (a model decoding from its own compressed cache) drive the same
 * policies through the two hooks below. A storage codec (struct fk_codec_ops) stores what a
 * policy keeps; "name = \"full\", evict = \"snapkv\"" in a sweep is plain SnapKV.
 *
 * One policy state per (sequence, layer), covering the layer's KV heads (K and V share
 * the mask: a token is dropped with its key and its value).
 *
 * The driving contract (the caller is the replay driver or a decoder):
 *   1. open() once per (sequence, layer) with the shapes (struct fk_evict_env). The mask
 *      belongs to the caller (env.keep, [n_kv_heads][n_tokens] bytes); the caller zeroes it.
 *   2. Prefill: the caller sets keep[h][t] = 1 for t < P, every h, then calls prefill()
 *      once, after the prefill's attention, with a view whose rows 0 .. P-1 are valid.
 *   3. Decode token t = P .. T-1: once token t's key, value and query are known, the caller
 *      sets keep[h][t] = 1 for every h, then calls decode() with a view whose rows 0 .. t
 *      are valid, BEFORE the attention of token t. The attention of token t reads exactly
 *      the mask decode() leaves (rows j <= t with keep[h][j] = 1). A rule defined "after the
 *      step's attention" (H2O: accumulate the step's attention, then evict) is run by the
 *      policy at the start of the next decode() (token t-1's attention over the mask it
 *      left, which is still the mask of j < t), which gives the same kept sets.
 *   4. close().
 * What a policy must do:
 *   - Causality: a hook for token t reads only rows of tokens <= t (keys, values and
 *     queries) and only queries the view provides (qrow[j] >= 0).
 *   - Only clear mask bits of tokens <= t, never set one: a dropped token never comes back
 *     (the caller sets the bit of each arriving token).
 *   - decode(t) keeps token t itself (the newest token is always attended to, 0.1.3), and
 *     every hook leaves at least one token per head (kvpress PR #264: n_kept >= 1).
 *   - Deterministic: the same inputs give the same mask (ties broken by the lower token
 *     index unless a policy documents otherwise).
 * Attention scores a policy computes come from the view's queries over its current kept
 * set with the exact keys, as the layer's logits (q.k / inv_scale, then the soft cap), a
 * softmax per query head over the kept keys, then the mean over the query heads of each
 * KV head's GQA group (kvpress: scores.view(B, H_kv, G, L).mean(2); never repeat_kv): the
 * shared kernel is codecs/evict/fk_evict_attn.h.
 *
 * Adding a policy = one .c file in codecs/evict/ exporting `const struct fk_evict_ops` +
 * one line in evict_list of codecs/meson.build.
 */
#ifndef FK_EVICT_H
#define FK_EVICT_H

#include <stddef.h>
#include <stdint.h>

#include "core/fk_codec.h"

/* What a policy reads from the data under given options (fk_evict_ops.needs). The caller
 * provides at least this; a trace without it is refused before any cell. */
enum fk_evict_need {
    FK_EVICT_NEED_DECODE_Q = 1u << 0,  /* the query of every decode token t >= P */
    FK_EVICT_NEED_PREFILL_Q = 1u << 1, /* queries of prefill tokens: the last
                                        * fk_evict_ops.prefill_queries(opts, P) of them */
    FK_EVICT_NEED_VALUES = 1u << 2,    /* the exact values (view.v) */
    FK_EVICT_NEED_ROPE = 1u << 3,      /* the traces' RoPE with post-RoPE keys (env.rope,
                                        * env.positions) */
    FK_EVICT_NEED_HEADS = 1u << 4,     /* a score per (layer, KV head): the dataset's
                                        * head_pattern (env.head_scores) */
};

/* Shapes of one (sequence, layer), fixed for the state's life. */
struct fk_evict_env {
    int layer;
    int n_layers;                /* the model's layers (per-layer budgets); 0: not known */
    int n_kv_heads;              /* H */
    int n_q_heads;               /* H_q = G * H; query head j reads KV head j / G */
    int head_dim;                /* m */
    int n_tokens;                /* T: capacity (rows per head of the view's arrays) */
    int prompt_len;              /* P: prefill tokens (1 <= P <= T) */
    uint8_t *keep;               /* [H][T] the keep mask, owned by the caller (see above) */
    /* The layer's attention: logits q.k / inv_scale (0: sqrt(m)), soft-capped to
     * c tanh(z / c) when softcap > 0. */
    double inv_scale, softcap;
    const struct fk_rope *rope;  /* the trace's RoPE (keys post-RoPE), or NULL */
    const int32_t *positions;    /* [T] the tokens' position ids, or NULL */
    const double *head_scores;   /* [n_layers][n_kv_heads] the head pattern, or NULL */
};

/* The data a hook may read, valid during the call only. Rows of tokens > t (the hook's
 * token; P-1 in prefill) may be garbage or absent: never read them. */
struct fk_evict_view {
    int t;                       /* the newest token: P-1 in prefill(), t in decode() */
    const float *k;              /* [H][T][m] exact post-RoPE keys, float32 */
    const float *v;              /* [H][T][m] exact values, float32; NULL unless the policy
                                  * declared FK_EVICT_NEED_VALUES */
    const float *q;              /* [H_q][n_qrows][m] post-RoPE queries, float32 */
    int n_qrows;
    const int32_t *qrow;         /* [T] row in q of token j's query, -1 when not given: at
                                  * least the tokens the policy's needs name, for j <= t */
};

struct fk_evict_ops {
    const char *name;            /* registry key, TOML `evict`, CSV value */
    const char *summary;         /* one line for `fadkv-bench codecs` (with provenance) */
    size_t opts_size;            /* sizeof(options struct) */
    const struct fk_option *options; /* {NULL}-terminated; names must not collide with the
                                  * storage codec's options (checked when composed) */
    /* (optional) Cross-option checks (e.g. recent <= budget); fk_err message names them. */
    int (*check)(const void *opts);
    /* enum fk_evict_need bits under these options (NULL: none). */
    unsigned (*needs)(const void *opts);
    /* (FK_EVICT_NEED_PREFILL_Q) How many of the last prefill tokens' queries prefill()
     * reads, for a prompt of P tokens (P: all of them). */
    int (*prefill_queries)(const void *opts, int prompt_len);
    /* (optional) FK_ECONFIG, naming layer and KV head, when under these options some
     * (layer, KV head) of a prompt of P tokens could keep no token (a budget that rounds to
     * zero); called for every trace before any cell runs. */
    int (*check_prompt)(const void *opts, int n_layers, int n_kv_heads, int prompt_len);
    int (*open)(const void *opts, const struct fk_evict_env *env, void **state);
    /* Once, after the prefill's attention (contract item 2). NULL: keeps the prefill. */
    int (*prefill)(void *state, const struct fk_evict_view *view);
    /* Every decode token, before its attention (contract item 3). NULL: keeps every
     * decode token (a prefill-only policy). */
    int (*decode)(void *state, const struct fk_evict_view *view);
    void (*close)(void *state);  /* accepts NULL and half-opened states */
};

/* Registry (codecs/fk_registry.c, generated from evict_list in codecs/meson.build). */
extern const struct fk_evict_ops *const fk_evict_policies[]; /* NULL-terminated */
const struct fk_evict_ops *fk_evict_find(const char *name);
const struct fk_option *fk_evict_option(const struct fk_evict_ops *ops, const char *name);

/* Option values of a policy, as fk_opts_* for codecs (codecs/core/fk_options.c): defaults,
 * range-checked set (the message names the policy, the option and its range), enum set. */
void fk_evict_opts_defaults(const struct fk_evict_ops *ops, void *opts);
int fk_evict_opts_set(const struct fk_evict_ops *ops, void *opts, const struct fk_option *o,
                      double value);
int fk_evict_opts_set_enum(const struct fk_evict_ops *ops, void *opts,
                           const struct fk_option *o, const char *choice);
/* FK_ECONFIG naming both when a policy option has the name of one of the codec's. */
int fk_evict_check_names(const struct fk_evict_ops *ev, const struct fk_codec_ops *codec);

#endif
