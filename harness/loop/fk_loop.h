/* SPDX-License-Identifier: MIT
 * The model in the loop: the llama2.c runner (datasets/gen/fk_llama2c.h) decodes from a
 * cache that a codec compresses online, so a codec's error reaches the next layer and the
 * next token (replay, harness/engine, is open loop: exact queries on a compressed copy of
 * the exact run's cache).
 *
 * Protocol (the replay engine's, spec algorithms.md section 4): every layer has its own K
 * and V codec states (struct fk_stream_env as replay opens them, n_tokens = P + S, positions
 * 0.., the runner's RoPE); each stream follows its codec's buffer rule through the eviction
 * schedule of engine/fk_schedule.h. The prompt's P positions are fed exactly; then its
 * prefill event is coded; decode position t (P <= t < P + S) is fed with a cache whose rows
 * 0 .. n_comp-1 are the codec's reconstructions and whose later rows are exact, and its
 * step's events (rows the model computed in this loop, exactly) are coded after t's forward
 * pass (the attention of step t sees the cache before its eviction). A codec that adapts or
 * grows its dictionary has every compressed row reconstructed again after each event.
 *
 * Two modes against the exact model's decode of the same prompt (struct fk_loop_ref):
 * teacher-forced (the reference ids are fed; per step KL(P_exact || P_codec) of the
 * next-token distribution, top-1 agreement, NLL of the next reference id under both) and
 * free-running (the codec's own greedy ids are fed; first step whose id differs from the
 * exact greedy decode, token agreement).
 *
 * Per step j the logits compared are those of position P + j, which predict id P + j + 1;
 * the logits of position P - 1 (the first generated id) come from the exact prefill and are
 * the same for every codec, so they are not counted.
 *
 * Determinism: everything is sequential in one thread; the caller pins OpenBLAS's thread
 * count (threaded sgemv rounds differently per count).
 */
#ifndef FK_LOOP_H
#define FK_LOOP_H

#include <stdint.h>

#include "core/fk_codec.h"
#include "core/fk_evict.h"
#include "core/fk_rewrite.h"
#include "formats/fk_basis.h"
#include "formats/fk_calib.h"
#include "formats/fk_dict.h"
#include "gen/fk_llama2c.h"

/* The exact model's decode of one prompt. */
struct fk_loop_ref {
    int prompt_len;              /* P (with BOS) */
    int n_steps;                 /* S: decode positions P .. P+S-1 */
    int vocab;                   /* V */
    int n_layers, n_heads, dim;  /* the model's L, H_q, dim */
    int32_t *ids;                /* [P + S + 1] teacher-forced ids: prompt, continuation; id
                                  * P + j + 1 is step j's target */
    int32_t *greedy;             /* [P + S + 1] prompt, then the exact greedy decode (== ids
                                  * when the reference is the greedy continuation) */
    float *logits;               /* [S][V] exact logits of positions P..P+S-1 fed ids */
    float *logits_greedy;        /* [S][V] the same fed greedy (== logits when shared) */
    float *att_out;              /* [S][L][dim] exact attention outputs on ids, or NULL */
    float *att_logit;            /* [S][L][H_q][P + S] exact attention logits, or NULL */
};

/* Runs the exact model on prompt ids [n_prompt] (BOS included) for steps decode positions.
 * cont [n_cont] (nullable): the teacher continuation, which must hold >= steps + 1 ids (its
 * first id follows the prompt); NULL: the exact greedy continuation. taps: keep the
 * attention outputs and weights (for the per-layer closed-loop attention metrics). */
int fk_loop_ref_build(const struct fk_llama2c_model *m, const int32_t *prompt, int n_prompt,
                      const int32_t *cont, int n_cont, int steps, int taps,
                      struct fk_loop_ref *out);
void fk_loop_ref_free(struct fk_loop_ref *r);

struct fk_loop_codec {
    const struct fk_codec_ops *ops;
    const void *opts;                  /* ops->opts_size bytes, checked */
    const struct fk_dict *dict;        /* required when ops->caps & FK_CAP_DICT */
    const struct fk_basis_file *basis; /* required when ops->caps & FK_CAP_BASIS */
    const struct fk_calib_file *calib; /* required when ops->caps & FK_CAP_CALIB */
    /* (optional) a token-eviction policy over the codec (core/fk_evict.h), driven by the
     * contract there: keep bits set as tokens arrive, prefill() after the prompt's forward
     * passes, decode() at every layer of decode position t once its q, k, v exist and before
     * its attention (the runner's pre_attention hook), on the exact rows this loop computed
     * and every query so far; each layer's attention then reads only the kept rows (the
     * runner's keep masks). A codec that skips dropped rows (FK_CAP_SKIPS) is never handed
     * one, as in replay; one whose dictionary grows or adapts without that is refused. With a
     * policy, attn_kl is NaN once a row is dropped (forward KL is infinite). */
    const struct fk_evict_ops *evict;
    const void *evict_opts;
    /* (optional) a score per (layer, KV head) for a policy with FK_EVICT_NEED_HEADS:
     * [head_layers][head_heads], which must be the model's layers and KV heads */
    const double *head_scores;
    int head_layers, head_heads;
    /* (optional) the prefill's row rewrites (core/fk_rewrite.h: merged values, pruned key
     * channels), after the policy's prefill hook, on the rows this loop computed: the codec
     * codes the rewritten rows and the model attends to them (its cache rows rewritten too) */
    const struct fk_rewrite *rewrite;
    /* (optional) teacher forcing in blocks of up to `block` positions per forward pass
     * (fk_llama2c_forward_block: each weight read once per block); 0 or 1: one position per
     * pass. A block ends at the first step where either stream's schedule hands rows to the
     * codec, so every position sees the cache the one-at-a-time loop gives it: the
     * reconstructions of the rows handed over before its step, the exact rows otherwise
     * (equal up to float rounding). Ignored with an eviction policy (per-position decisions)
     * or row rewrites and when free running. */
    int block;
};

enum fk_loop_mode { FK_LOOP_TEACHER = 0, FK_LOOP_FREE = 1 };

/* What one run of a codec in the loop measured. */
struct fk_loop_result {
    int mode;                    /* enum fk_loop_mode */
    int n_steps, n_layers;       /* S, L */
    double *kl;                  /* [S] KL(P_exact || P_codec) of step j's logits, nats (free
                                  * running: against the exact greedy decode's logits; only
                                  * meaningful up to first_diverge) */
    uint8_t *top1;               /* [S] 1: both argmaxes agree */
    double *nll_exact, *nll_codec; /* [S] -log p(target) (teacher-forced; NaN when free) */
    int32_t *tokens;             /* [S] the codec run's argmax at each step */
    int first_diverge;           /* free: first step whose argmax differs from the exact
                                  * greedy id (teacher: first step with top1 = 0); -1: none */
    /* per layer, teacher-forced with reference taps (NaN otherwise): means over steps and
     * query heads of cos(o_exact, o_codec) of the attention outputs and of KL(a_exact ||
     * a_codec) of the attention weights, both runs fed the same ids; as replay's attention
     * metrics, over the steps that see a compressed row (NaN when none does) */
    double *attn_cos, *attn_kl;  /* [L] */
    int attn_steps;              /* steps those means are over */
    float *logits;               /* [S][V] the codec run's logits (keep_logits), or NULL */
    double t_forward, t_codec;   /* thread CPU seconds in the forward pass / in the codec */
    /* summaries */
    double kl_mean, kl_max, top1_agree;
    double nll_exact_mean, nll_codec_mean; /* nats per token */
    double ppl_ratio;            /* exp(nll_codec_mean - nll_exact_mean) */
    double token_agree;          /* free: fraction of steps whose id equals the greedy id */
};

/* Decodes ref's prompt with codec c compressing every layer's cache (mode as above). The
 * run's taps are read when ref has them and mode is TEACHER. A codec storing rows computed
 * elsewhere (FK_CAP_EXTERNAL) is refused. keep_logits: out->logits holds every step's. */
int fk_loop_run(const struct fk_llama2c_model *m, const struct fk_loop_ref *ref,
                const struct fk_loop_codec *c, enum fk_loop_mode mode, int keep_logits,
                struct fk_loop_result *out);
void fk_loop_result_free(struct fk_loop_result *r);

/* ---- a sweep's model dataset ---- */

/* One prompt: a text (BPE with BOS through the tokenizer) or token ids as given. */
struct fk_loop_prompt {
    const char *text;            /* NULL: ids */
    const int32_t *ids;
    int n_ids;
};

/* The model, its tokenizer and the exact decode of every prompt of a dataset. */
struct fk_loop_set {
    struct fk_llama2c_model *m;
    struct fk_llama2c_tokenizer *tok; /* NULL when no tokenizer is named */
    int n;                       /* prompts */
    struct fk_loop_ref *refs;    /* [n] exact greedy decodes, with attention taps */
};

/* Loads model (and tokenizer, nullable unless a prompt is a text) and decodes each prompt
 * exactly for steps positions. Messages name the model and the prompt's index. */
int fk_loop_set_open(const char *model, const char *tokenizer, const struct fk_loop_prompt *p,
                     int n, int steps, struct fk_loop_set **out);
void fk_loop_set_free(struct fk_loop_set **s);
/* Writes prompt i's exact decode (T = P + S tokens, post-RoPE keys, values and queries of
 * every token, float32) as a fadkv-trace at path (atomically, fk_trace_create's rename):
 * what replay reads for the open-loop numbers of the same decode. model_id names it. */
int fk_loop_set_write_trace(const struct fk_loop_set *s, int i, const char *path,
                            const char *model_id);

/* KL(softmax(p) || softmax(q)) of two logit vectors [n], in double, nats. */
double fk_loop_kl(const float *p, const float *q, int n);
/* -log softmax(z)[id], in double. */
double fk_loop_nll(const float *z, int n, int id);
/* Index of the largest entry (the lowest on ties). */
int fk_loop_argmax(const float *z, int n);

#endif
