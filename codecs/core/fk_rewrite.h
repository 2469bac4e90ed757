/* SPDX-License-Identifier: MIT
 * The prefill's row rewrites (implemented in codecs/evict/fk_rewrite.c): rewriting what the
 * cache keeps (docs/EVICTION.md "Merging and channel pruning"): two
 * stages that change the stored rows instead of choosing tokens, run once per (sequence,
 * layer) after the prefill's eviction (the policy's prefill hook, if any) and before any
 * row is coded. What they write is what the codec codes and the attention of every later
 * step reads; the reference attention keeps the exact rows.
 *
 *   merge = "kvpress"  (kvpress presses/merging_press.py, MergingPress) each prompt token
 *      e the policy dropped is folded into the kept prompt token t of its KV head whose key
 *      is the most cosine-similar (keys divided by max(||k||, 1e-6); ties to the lower t):
 *      with sim its similarity, w = max(sim, 0) [sim >= merge_threshold]
 *      ||v_e|| / (||v_e|| + ||v_t|| + 1e-6) (norms of the values as they were), each kept t
 *      that received contributions becomes (v_t + sum w v_e) / (1 + sum w); keys unchanged.
 *      Only tokens dropped at the prefill merge (kvpress wraps prefill scorers only): a
 *      policy that drops during decoding, whose survivors are coded by then, is refused.
 *   think = r  (ThinK, SalesforceAIResearch/ThinK kv_pruning_utils.py
 *      key_pruner_query_driven; kvpress presses/think_press.py) per KV head the
 *      int(m r) key channels of lowest score q_c k_c are pruned, with q_c the mean of the
 *      squared channel over the last think_window prompt queries and the query heads of
 *      the head's group, k_c its mean over the head's kept prompt keys (ties: the lower
 *      channel pruned first); the keys of prompt tokens 0 .. P - think_recent - 1 lose
 *      those channels (stored shorter; the attention reads them as zeros), the last
 *      think_recent prompt tokens and every decoded token keep all m (ThinK keeps a recent
 *      window whole; think_recent = 0 is kvpress, which zeroes the whole prompt's). Bytes:
 *      a pruned key row costs 2 (m - int(m r)) bytes and each (layer, KV head) its channel
 *      mask, ceil(m / 8) bytes. Counted for a codec that stores rows as they are (full);
 *      under another codec the pruned channels would be coded as zeros, which saves
 *      nothing: refused.
 */
#ifndef FK_REWRITE_H
#define FK_REWRITE_H

#include <stddef.h>
#include <stdint.h>

#include "core/fk_evict.h"

enum fk_merge_rule { FK_MERGE_NONE = 0, FK_MERGE_KVPRESS = 1 };
extern const char *const fk_merge_names[]; /* {"none", "kvpress", NULL} */

struct fk_rewrite {
    int merge;                   /* enum fk_merge_rule */
    double merge_threshold;      /* a merge needs cosine similarity >= this */
    double think;                /* fraction of key channels pruned per KV head */
    int think_window;            /* prompt queries scoring the channels */
    int think_recent;            /* last prompt tokens whose keys stay whole */
};

/* The option rows (offsets into struct fk_rewrite), {NULL}-terminated: TOML keys of a
 * [[codec]] block, canonical cell text after the policy's options. */
extern const struct fk_option fk_rewrite_options[];

/* 1 when a block's key names one of the rewrite options. */
int fk_rewrite_is_option(const char *key);

/* Key channels pruned per KV head (int(m think)) and the prompt tokens whose keys lose
 * them (P - think_recent, at least 0; 0 when no channel is pruned). */
int fk_rewrite_channels(const struct fk_rewrite *rw, int head_dim);
int fk_rewrite_pruned_tokens(const struct fk_rewrite *rw, int head_dim, int prompt_len);
/* Bytes of one (layer, KV head)'s channel mask when channels are pruned, else 0. */
int fk_rewrite_mask_bytes(const struct fk_rewrite *rw, int head_dim);

/* The last prompt tokens whose queries the stage reads (think: min(window, P); else 0). */
int fk_rewrite_prefill_queries(const struct fk_rewrite *rw, int prompt_len);

/* FK_ECONFIG when the stage cannot run over this policy (NULL: none) and codec: merge
 * without a policy or over one that drops during decoding, think over a codec that does
 * not store rows as they are (FK_CAP_EXACT). */
int fk_rewrite_check(const struct fk_rewrite *rw, const struct fk_evict_ops *ev,
                     const struct fk_codec_ops *codec);

/* One (sequence, layer) at the prefill's end. k and v ([H][T][m], rows 0 .. P-1 valid) are
 * rewritten in place; keep ([H][T], NULL: every token kept) the prefill's mask; q
 * ([H_q][n_qrows][m]) with qrow[j] the row of token j's query (think: at least the last
 * fk_rewrite_prefill_queries prompt tokens). chan ([H][m], nullable) receives 1 for each
 * key channel a head keeps. FK_EINVAL for a missing query, FK_ENOMEM. */
struct fk_rewrite_in {
    int n_kv_heads, n_q_heads, head_dim, n_tokens, prompt_len;
    const uint8_t *keep;
    float *k, *v;
    const float *q;
    int n_qrows;
    const int32_t *qrow;
};
int fk_rewrite_apply(const struct fk_rewrite *rw, const struct fk_rewrite_in *in,
                     uint8_t *chan);

#endif
