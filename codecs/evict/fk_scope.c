/* SPDX-License-Identifier: MIT
 * scope: SCOPE's decoding-phase compression with the prefill kept whole (Linking-ai/SCOPE
 * model/kv_utils.py update_kv_in_decoding with the ALLKV prefill, families.md 4.2). At every
 * decode token t, once more than decode_budget decoded tokens are kept: the attention of
 * t's own query over the whole kept cache (instantaneous, softmax over every kept key, GQA
 * group mean per KV head instead of the reference's repeat_kv), and of the decoded tokens
 * before the last `recent` the best decode_budget - recent stay. variant "slide" (the
 * reference's "fixed") keeps decode_budget constant; "adaptive" ("linear") uses
 * recent + floor(step / delta) at decode step `step` (never more than decode_budget).
 * The reference's "jump" variant (compress once every delta steps) is not implemented.
 */
#include <stddef.h>

#include "common/fk_err.h"
#include "evict/fk_evict_common.h"

static const char *const scope_variants[] = {"slide", "adaptive", NULL};

struct scope_opts {
    int decode_budget, recent, variant, delta;
};

static const struct fk_option scope_options[] = {
    {"decode_budget", FK_OPT_INT, offsetof(struct scope_opts, decode_budget), 512, 1, 1 << 24,
     NULL, "decoded tokens kept per KV head, the recent ones included (tokens; W_d)"},
    {"recent", FK_OPT_INT, offsetof(struct scope_opts, recent), 256, 1, 1 << 24, NULL,
     "most recent decoded tokens always kept (tokens; W_r)"},
    {"variant", FK_OPT_ENUM, offsetof(struct scope_opts, variant), 0, 0, 1, scope_variants,
     "slide: constant decode_budget | adaptive: budget recent + floor(step / delta)"},
    {"delta", FK_OPT_INT, offsetof(struct scope_opts, delta), 15, 1, 1 << 20, NULL,
     "adaptive variant: decode steps per extra kept token (steps)"},
    {NULL, 0, 0, 0, 0, 0, NULL, NULL},
};

static int scope_check(const void *opts)
{
    const struct scope_opts *o = opts;
    if (o->recent > o->decode_budget)
        return fk_err(FK_ECONFIG, "scope: recent = %d must not exceed decode_budget = %d",
                      o->recent, o->decode_budget);
    return FK_OK;
}

static unsigned scope_needs(const void *opts)
{
    (void)opts;
    return FK_EVICT_NEED_DECODE_Q;
}

struct scope {
    struct fk_evict_base b;
    struct scope_opts o;
};

static int scope_open(const void *opts, const struct fk_evict_env *env, void **state)
{
    FK_TRY(fk_evict_base_open(env, sizeof(struct scope), 1, state));
    ((struct scope *)*state)->o = *(const struct scope_opts *)opts;
    return FK_OK;
}

static int scope_decode(void *state, const struct fk_evict_view *v)
{
    struct scope *s = state;
    const struct fk_evict_env *e = &s->b.env;
    int t = v->t, budget = s->o.decode_budget;
    if (s->o.variant == 1) {
        long b = s->o.recent + (long)(t - e->prompt_len) / s->o.delta;
        budget = b < budget ? (int)b : budget;
    }
    for (int h = 0; h < e->n_kv_heads; h++) {
        if (fk_evict_decoded_kept(&s->b, h, t) <= budget)
            continue;
        int n = fk_evict_kept(e, h, 0, t + 1, s->b.idx);
        FK_TRY(fk_evict_attn_group(e, v, h, t, s->b.idx, n, &s->b.sc, s->b.score));
        double *a = s->b.acc + (size_t)h * e->n_tokens;
        for (int i = 0; i < n; i++)
            a[s->b.idx[i]] = s->b.score[i];
        fk_evict_decode_window(&s->b, h, t, budget, s->o.recent, a);
    }
    return FK_OK;
}

const struct fk_evict_ops fk_evict_scope = {
    .name = "scope",
    .summary = "SCOPE decoding-phase compression: prefill intact, decoded tokens beyond a "
               "budget evicted by the current query's attention, recent kept (Linking-ai/SCOPE)",
    .opts_size = sizeof(struct scope_opts),
    .options = scope_options,
    .check = scope_check,
    .needs = scope_needs,
    .open = scope_open,
    .decode = scope_decode,
    .close = fk_evict_base_close,
};
