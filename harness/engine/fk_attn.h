/* SPDX-License-Identifier: MIT
 * Simulated attention fidelity (spec algorithms.md section 10.5): what one layer's
 * attention would output at a decode step with the compressed cache, against the exact one,
 * using the queries recorded in the trace.
 */
#ifndef FK_ATTN_H
#define FK_ATTN_H

#include <stddef.h>
#include <stdint.h>

#include "core/fk_codec.h"
#include "formats/fk_trace.h"

/* One decode step of one layer: the inputs the replay engine hands over. */
struct fk_attn_in {
    int m;                        /* head_dim */
    int n_q_heads, n_kv_heads;    /* H_q = r * H_kv; query head h reads KV head h / r */
    int n_tokens;                 /* T: rows of K and V per head */
    int t;                        /* the query's token index; visible tokens are 0..t */
    int n_comp_k, n_comp_v;       /* key / value rows 0..n_comp-1 are compressed (<= t + 1;
                                   * a block buffer may have handed over token t itself) */
    const float *q;               /* [n_q_heads][m] post-RoPE queries of token t */
    const void *k, *v;            /* exact keys and values [n_kv_heads][T][m] as stored: */
    enum fk_encoding k_enc, v_enc; /* float32 (the default 0), or float16 / bfloat16 words */
    const struct fk_codec_ops *ops;
    const void *kstate, *vstate;  /* codec states of this layer's K and V streams */
    /* The layer's attention as the model computes it (the trace's layer attributes; 0 = the
     * plain default): logits q.k / inv_scale (0: sqrt(m)), soft-capped to c tanh(z / c)
     * (softcap > 0), over the keys t-window+1 .. t only (window > 0). */
    double inv_scale, softcap;
    int window;
    /* (optional) The retained rows [n_kv_heads][n_tokens] (1 = kept) of a token-eviction
     * policy (core/fk_evict.h), NULL = all kept: o_hat and P_hat read only kept rows (a
     * dropped row is never reconstructed), P_hat is the softmax over the kept visible keys,
     * and KL(P || P_hat) is NaN when a visible key is dropped. Token t is always kept. */
    const uint8_t *keep;
    /* (optional) The rows the cache holds when the prefill's row rewrites changed them
     * (merged values, pruned key channels; evict/fk_rewrite.h), float32 [n_kv_heads][T][m],
     * NULL: the exact rows. The cache side reads its uncompressed rows here (a codec that
     * stores rows exactly holds these); the exact side keeps k and v. */
    const float *k_cache, *v_cache;
};

/* Accumulators of one (trace, layer); merged in a fixed order by the caller. */
struct fk_attn_acc {
    long n;                       /* (step, query head) evaluations */
    long skipped_steps;           /* steps with nothing visible compressed */
    double cos_sum;               /* sum of cos(o, o_hat) */
    double relerr_sum;            /* sum of ||o - o_hat|| / ||o|| */
    double kl_sum;                /* sum of KL(P || P_hat) */
    double tv_sum;                /* sum of the total variation 1/2 sum |P - P_hat| */
    double top_sum[3];            /* sums of top-k overlap, k = 1, 8, 32 */
    double mass_sum;              /* sum of the exact attention mass on compressed keys */
    double rkl_sum;               /* sum of the reverse KL(P_hat || P) */
    double retained_sum;          /* sum of the exact attention mass on retained keys */
    double *cos_vals;             /* [n] every cos value (for percentiles), malloc'd */
    long cos_cap;                 /* allocated length of cos_vals */
};

/* The metrics of one (step, query head) evaluation (spec 10.5). */
struct fk_attn_metrics {
    double cos;                   /* cos(o, o_hat); 1 if o == o_hat == 0, 0 if one is 0 */
    double relerr;                /* ||o - o_hat|| / ||o||; if o == 0: 0 (o_hat == 0) or 1 */
    double kl;                    /* KL(P || P_hat), nats */
    double tv;                    /* total variation 1/2 sum |P - P_hat| */
    double top[3];                /* top-k overlap for k = 1, 8, 32, in [0, 1] */
    double mass;                  /* exact attention mass on the compressed keys */
    double rkl;                   /* reverse KL(P_hat || P), nats: -log(retained) when the
                                   * kept keys are exact (families.md 0.1 item 5) */
    double retained;              /* exact attention mass on the retained keys (1: no eviction) */
};

/* Per-thread working memory of fk_attn_eval: logits and softmax of every query head
 * ([n_q_heads][n_tokens] doubles, four of them), q . D_K and the atom-space value weights
 * ([n_q_heads] per atom) and the outputs of the last evaluated step. The per-atom arrays
 * grow on demand to the largest dictionary seen (at most max_atoms, the bound the scratch
 * was created with or reserved). */
struct fk_attn_scratch;

/* max_atoms bounds the current atom count N_t of both codec states (append codecs grow;
 * fk_attn_scratch_reserve raises it). Returns FK_OK, FK_EINVAL (a size < 1) or FK_ENOMEM;
 * *out is NULL on failure. */
int fk_attn_scratch_create(int m, int n_tokens, int max_atoms, int n_q_heads,
                           struct fk_attn_scratch **out);
void fk_attn_scratch_free(struct fk_attn_scratch **s);

/* Raises the atom bound to at least n_atoms and makes room for them: callers size the
 * scratch from what the codec states declare at each step (atoms() of a sparse codec,
 * stats n_atoms), whatever the base dictionary. FK_EINVAL (n_atoms < 1), FK_ENOMEM (the
 * scratch stays valid at its old size). */
int fk_attn_scratch_reserve(struct fk_attn_scratch *s, int n_atoms);


/* Evaluates every query head at one step and adds to acc. Uses the sparse fast path
 * (q . D_K once per query, s multiply-adds per compressed key, values through the codes)
 * when the codec has FK_CAP_SPARSE, else reconstructs rows. Double precision for logits,
 * softmax and accumulators (q . D_K itself is one float SGEMM for all query heads; the
 * atom-space values go through one float SGEMM). If no key and no value is compressed it only
 * counts a skipped step.
 * Allocates nothing except growing acc->cos_vals when it is full (see
 * fk_attn_acc_reserve) and the scratch's per-atom arrays when a dictionary is larger than
 * any before. Bit-identical run to run with OpenBLAS at one thread.
 * Errors: FK_EINVAL (inconsistent sizes, n_comp > t + 1, scratch too small), the codec's error
 * for a missing row, FK_ECORRUPT for a code naming a nonexistent atom; acc is then
 * unchanged. */
int fk_attn_eval(const struct fk_attn_in *in, struct fk_attn_scratch *s,
                 struct fk_attn_acc *acc);

/* The straightforward reference (reconstruct every compressed row, dense softmax): used by
 * tests against fk_attn_eval. Same accumulator semantics. */
int fk_attn_eval_naive(const struct fk_attn_in *in, struct fk_attn_acc *acc);

/* fk_attn_eval_naive that also returns, per query head, o_hat ([n_q_heads][m], nullable)
 * and the metrics ([n_q_heads], nullable). Allocates its own memory. */
int fk_attn_eval_naive_out(const struct fk_attn_in *in, struct fk_attn_acc *acc,
                           double *o_hat, struct fk_attn_metrics *met);

/* Results of query head h from the last fk_attn_eval that evaluated a step with this
 * scratch: o and o_hat ([m], valid until the next call; either pointer nullable) and the
 * metrics (nullable). FK_EINVAL if h is out of range or no step was evaluated. */
int fk_attn_scratch_result(const struct fk_attn_scratch *s, int h, const double **o,
                           const double **o_hat, struct fk_attn_metrics *met);

/* Makes room for `extra` more cos values, so that the next evaluations do not allocate
 * (fk_attn_eval otherwise grows cos_vals geometrically when it is full). */
int fk_attn_acc_reserve(struct fk_attn_acc *acc, long extra);

/* Top-k selection used by the overlap metric: the min(k, n) indices of the largest z,
 * ordered by (z descending, index ascending), into out [k]. O(n k) at worst, about O(n)
 * on typical data. Returns min(k, n) (0 if k < 1 or n < 1). */
int fk_attn_topk(const double *z, int n, int k, int32_t *out);

void fk_attn_acc_free(struct fk_attn_acc *acc);
/* dst += src (cos values appended in order). */
int fk_attn_acc_merge(struct fk_attn_acc *dst, const struct fk_attn_acc *src);

#endif
