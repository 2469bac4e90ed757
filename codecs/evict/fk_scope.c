/* SPDX-License-Identifier: MIT
 * scope: SCOPE's decoding-phase compression with the prefill kept whole (Linking-ai/SCOPE
 * model/kv_utils.py update_kv_in_decoding with the ALLKV prefill, families.md 4.2). At every
 * decode token t, once more than decode_budget decoded tokens are kept: the attention of
 * t's own query over the whole kept cache (instantaneous, softmax over every kept key, GQA
 * group mean per KV head instead of the reference's repeat_kv), and of the decoded tokens
 * before the last `recent` the best decode_budget - recent stay. variant "slide" (the
 * reference's "fixed") keeps decode_budget constant; "adaptive" ("linear") uses
 * recent + floor(step / delta) at decode step `step` (never more than decode_budget);
 * "jump" (the reference's "discontinuous") the adaptive budget, but once the cache has
 * reached it the reference lets it grow for delta more steps and compresses at the next
 * one, then waits delta steps again: its counters (jump_step, jump_layer) are class-global
 * and advance once per layer call, so with every layer holding the same tokens each layer
 * compresses every delta + 1 steps of a cache at or over its budget; here one counter per
 * KV head counts those steps (every head keeps the same count under this rule).
 */
#include <stddef.h>
#include <stdlib.h>

#include "common/fk_err.h"
#include "evict/fk_evict_common.h"

static const char *const scope_variants[] = {"slide", "adaptive", "jump", NULL};

struct scope_opts {
    int decode_budget, recent, variant, delta;
};

static const struct fk_option scope_options[] = {
    {"decode_budget", FK_OPT_INT, offsetof(struct scope_opts, decode_budget), 512, 1, 1 << 24,
     NULL, "decoded tokens kept per KV head, the recent ones included (tokens; W_d)"},
    {"recent", FK_OPT_INT, offsetof(struct scope_opts, recent), 256, 1, 1 << 24, NULL,
     "most recent decoded tokens always kept (tokens; W_r)"},
    {"variant", FK_OPT_ENUM, offsetof(struct scope_opts, variant), 0, 0, 2, scope_variants,
     "slide: constant decode_budget | adaptive: budget recent + floor(step / delta) | jump: "
     "the adaptive budget, compressing once every delta + 1 steps at or over it"},
    {"delta", FK_OPT_INT, offsetof(struct scope_opts, delta), 15, 1, 1 << 20, NULL,
     "adaptive and jump variants: decode steps per extra kept token, and jump's steps "
     "between compressions (steps)"},
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

enum { SLIDE, ADAPTIVE, JUMP };

struct scope {
    struct fk_evict_base b;
    struct scope_opts o;
    int *wait;                   /* [H] jump: steps at or over the budget since the last
                                  * compression */
};

static void scope_close(void *state)
{
    struct scope *s = state;
    if (s)
        free(s->wait);
    fk_evict_base_close(state);
}

static int scope_open(const void *opts, const struct fk_evict_env *env, void **state)
{
    FK_TRY(fk_evict_base_open(env, sizeof(struct scope), 1, 0, state));
    struct scope *s = *state;
    s->o = *(const struct scope_opts *)opts;
    s->wait = calloc((size_t)env->n_kv_heads, sizeof *s->wait);
    if (!s->wait) {
        scope_close(s);
        *state = NULL;
        return fk_err(FK_ENOMEM, "out of memory (scope, %d KV heads)", env->n_kv_heads);
    }
    return FK_OK;
}

/* jump: whether head h compresses at this step, its cache holding nd decoded tokens
 * (the reference's jump_step: a step at or over the budget either waits, while fewer than
 * delta have waited, or compresses and restarts the count). */
static int jump_now(struct scope *s, int h, int nd, int budget)
{
    if (nd < budget)
        return 0;
    if (s->wait[h] < s->o.delta) {
        s->wait[h]++;
        return 0;
    }
    s->wait[h] = 0;
    return 1;
}

static int scope_decode(void *state, const struct fk_evict_view *v)
{
    struct scope *s = state;
    const struct fk_evict_env *e = &s->b.env;
    int t = v->t, budget = s->o.decode_budget;
    if (s->o.variant != SLIDE) {
        long b = s->o.recent + (long)(t - e->prompt_len) / s->o.delta;
        budget = b < budget ? (int)b : budget;
    }
    for (int h = 0; h < e->n_kv_heads; h++) {
        int nd = fk_evict_decoded_kept(&s->b, h, t);
        if ((s->o.variant == JUMP && !jump_now(s, h, nd, budget)) || nd <= budget)
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
    .close = scope_close,
};
