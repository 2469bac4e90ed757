/* SPDX-License-Identifier: MIT
 * h2o: Heavy-Hitter Oracle (Zhang et al.; FMInference/H2O utils_real_drop/modify_llama.py
 * H2OKVCache_LayerWise, families.md 2.3). A token's score is the attention it has received:
 * at the prefill's end the column sums of the causal prefill attention (every prefill query
 * over the keys it sees), then, at every decode token, the attention of that token's
 * recorded query over the kept set it saw (its own key included). Whenever more than
 * heavy + recent tokens are kept, the `recent` most recent stay and the `heavy` best-scored
 * older ones (ties to the lower token) are kept. The reference evicts after each forward's
 * attention; here that step runs at the start of the next decode hook, which gives the same
 * kept sets (fk_evict.h). GQA: the scores are the mean over each KV head's query group
 * (the reference is MHA only; issue #32), one set per KV head.
 */
#include <stddef.h>

#include "common/fk_err.h"
#include "evict/fk_evict_common.h"

struct h2o_opts {
    int heavy, recent;
};

static const struct fk_option h2o_options[] = {
    {"heavy", FK_OPT_INT, offsetof(struct h2o_opts, heavy), 64, 0, 1 << 24, NULL,
     "heavy-hitter tokens kept by accumulated attention (tokens)"},
    {"recent", FK_OPT_INT, offsetof(struct h2o_opts, recent), 64, 1, 1 << 24, NULL,
     "most recent tokens always kept (tokens)"},
    {NULL, 0, 0, 0, 0, 0, NULL, NULL},
};

static unsigned h2o_needs(const void *opts)
{
    (void)opts;
    return FK_EVICT_NEED_PREFILL_Q | FK_EVICT_NEED_DECODE_Q;
}

static int h2o_prefill_queries(const void *opts, int prompt_len)
{
    (void)opts;
    return prompt_len;
}

struct h2o {
    struct fk_evict_base b;
    struct h2o_opts o;
};

static int h2o_open(const void *opts, const struct fk_evict_env *env, void **state)
{
    FK_TRY(fk_evict_base_open(env, sizeof(struct h2o), 1, 0, state));
    ((struct h2o *)*state)->o = *(const struct h2o_opts *)opts;
    return FK_OK;
}

/* Over the n kept tokens s->b.idx[0..n) before `end` (ascending): the recent ones stay,
 * the best `heavy` older ones too. */
static void h2o_evict(struct h2o *s, int h, int end, int n)
{
    const struct fk_evict_env *e = &s->b.env;
    if (n <= s->o.heavy + s->o.recent)
        return;
    int nc = n; /* the older ones: a prefix of the ascending list */
    while (nc > 0 && s->b.idx[nc - 1] >= end - s->o.recent)
        nc--;
    const double *acc = s->b.acc + (size_t)h * e->n_tokens;
    for (int i = 0; i < nc; i++)
        s->b.score[i] = acc[s->b.idx[i]];
    fk_evict_keep_top(s->b.score, s->b.idx, nc, s->o.heavy, e->keep + (size_t)h * e->n_tokens,
                      s->b.tmp);
}

static int h2o_prefill(void *state, const struct fk_evict_view *v)
{
    struct h2o *s = state;
    const struct fk_evict_env *e = &s->b.env;
    int P = e->prompt_len, G = e->n_q_heads / e->n_kv_heads;
    for (int h = 0; h < e->n_kv_heads; h++) {
        for (int j = 0; j < P; j++)
            s->b.idx[j] = j;
        FK_TRY(fk_evict_attn_causal_sum(e, v, h, s->b.idx, P, P, 1.0 / G, &s->b.sc,
                                        s->b.acc + (size_t)h * e->n_tokens));
        h2o_evict(s, h, P, P);
    }
    return FK_OK;
}

static int h2o_decode(void *state, const struct fk_evict_view *v)
{
    struct h2o *s = state;
    const struct fk_evict_env *e = &s->b.env;
    int t = v->t;
    for (int h = 0; h < e->n_kv_heads; h++) {
        /* the kept tokens before t: the set the previous decode token saw */
        int n = fk_evict_kept(e, h, 0, t, s->b.idx);
        if (t - 1 >= e->prompt_len) { /* its attention over that set */
            FK_TRY(fk_evict_attn_group(e, v, h, t - 1, s->b.idx, n, &s->b.sc, s->b.score));
            double *acc = s->b.acc + (size_t)h * e->n_tokens;
            for (int i = 0; i < n; i++)
                acc[s->b.idx[i]] += s->b.score[i];
        }
        h2o_evict(s, h, t, n);
    }
    return FK_OK;
}

const struct fk_evict_ops fk_evict_h2o = {
    .name = "h2o",
    .summary = "H2O: heavy hitters by accumulated attention (prefill column sums + every "
               "decode query over the kept set) + recent window (FMInference/H2O real-drop)",
    .opts_size = sizeof(struct h2o_opts),
    .options = h2o_options,
    .needs = h2o_needs,
    .prefill_queries = h2o_prefill_queries,
    .open = h2o_open,
    .prefill = h2o_prefill,
    .decode = h2o_decode,
    .close = fk_evict_base_close,
};
