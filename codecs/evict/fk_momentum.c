/* SPDX-License-Identifier: MIT
 * momentum: Moment-KV's momentum-aggregated decoding-phase scores (Jana, Nishad, Singh,
 * arXiv 2605.29873; families.md 4.1). The published rule is only partly known (no code was
 * found; the one equation is from a secondary source): I_j(t) = alpha I_j(t-1) + a_j(t) for
 * every kept decoded token j, a_j(t) the attention of token t's recorded query over the
 * kept cache (GQA group mean per KV head; our choice, the head aggregation is unknown), the
 * prefill kept whole, and the SCOPE scaffold for the budget (our choice): once more than
 * decode_budget decoded tokens are kept, the last `recent` stay and of the older ones the
 * decode_budget - recent highest I. alpha = 0 is SCOPE-slide; alpha = 1 is decode-only H2O.
 */
#include <stddef.h>

#include "common/fk_err.h"
#include "evict/fk_evict_common.h"

struct momentum_opts {
    double alpha;
    int decode_budget, recent;
};

static const struct fk_option momentum_options[] = {
    {"alpha", FK_OPT_DOUBLE, offsetof(struct momentum_opts, alpha), 0.9, 0, 1, NULL,
     "momentum decay of the aggregated attention I(t) = alpha I(t-1) + a(t) (published rule "
     "only partly known)"},
    {"decode_budget", FK_OPT_INT, offsetof(struct momentum_opts, decode_budget), 512, 1,
     1 << 24, NULL, "decoded tokens kept per KV head, the recent ones included (tokens)"},
    {"recent", FK_OPT_INT, offsetof(struct momentum_opts, recent), 32, 1, 1 << 24, NULL,
     "most recent decoded tokens always kept (tokens; our choice: unknown in the paper)"},
    {NULL, 0, 0, 0, 0, 0, NULL, NULL},
};

static int momentum_check(const void *opts)
{
    const struct momentum_opts *o = opts;
    if (o->recent > o->decode_budget)
        return fk_err(FK_ECONFIG, "momentum: recent = %d must not exceed decode_budget = %d",
                      o->recent, o->decode_budget);
    return FK_OK;
}

static unsigned momentum_needs(const void *opts)
{
    (void)opts;
    return FK_EVICT_NEED_DECODE_Q;
}

struct momentum {
    struct fk_evict_base b;
    struct momentum_opts o;
};

static int momentum_open(const void *opts, const struct fk_evict_env *env, void **state)
{
    FK_TRY(fk_evict_base_open(env, sizeof(struct momentum), 1, 0, state));
    ((struct momentum *)*state)->o = *(const struct momentum_opts *)opts;
    return FK_OK;
}

static int momentum_decode(void *state, const struct fk_evict_view *v)
{
    struct momentum *s = state;
    const struct fk_evict_env *e = &s->b.env;
    int t = v->t, P = e->prompt_len;
    for (int h = 0; h < e->n_kv_heads; h++) {
        int n = fk_evict_kept(e, h, 0, t + 1, s->b.idx);
        FK_TRY(fk_evict_attn_group(e, v, h, t, s->b.idx, n, &s->b.sc, s->b.score));
        double *I = s->b.acc + (size_t)h * e->n_tokens;
        for (int i = 0; i < n; i++) {
            int j = s->b.idx[i];
            if (j >= P)
                I[j] = s->o.alpha * I[j] + s->b.score[i];
        }
        fk_evict_decode_window(&s->b, h, t, s->o.decode_budget, s->o.recent, I);
    }
    return FK_OK;
}

const struct fk_evict_ops fk_evict_momentum = {
    .name = "momentum",
    .summary = "Moment-KV (rule partly known): decoded tokens scored by I(t) = alpha I(t-1) + "
               "a(t), prefill intact, lowest I beyond a decode budget evicted",
    .opts_size = sizeof(struct momentum_opts),
    .options = momentum_options,
    .check = momentum_check,
    .needs = momentum_needs,
    .open = momentum_open,
    .decode = momentum_decode,
    .close = fk_evict_base_close,
};
