/* SPDX-License-Identifier: MIT
 * duo: DuoAttention's split of the KV heads into retrieval heads, which keep the whole
 * cache, and streaming heads, which keep `sinks` first tokens and the `recent` most recent
 * (kvpress presses/duo_attention_press.py; mit-han-lab/duo-attention duo_attn/utils.py;
 * spec families-budgets-2026.md section 3). The split comes from the dataset's head_pattern
 * (DuoAttention's full_attention_heads.tsv: one gate per layer and KV head): the
 * round(n_layers H head_ratio) lowest-gated (layer, head) pairs of the whole model stream
 * (Python's round, half to even; ties to the lower layer, then the lower head: kvpress sorts
 * with NumPy's unstable argsort). rolling = false, kvpress's rule: at the prefill's end a
 * streaming head drops the prompt tokens sinks .. P - recent - 1, and decoded tokens are all
 * kept; rolling = true, the original's static cache: a streaming head keeps only the sinks
 * and the recent window at every token.
 */
#include <math.h>
#include <stddef.h>

#include "common/fk_err.h"
#include "evict/fk_evict_common.h"

struct duo_opts {
    double head_ratio;
    int sinks, recent, rolling;
};

static const struct fk_option duo_options[] = {
    {"head_ratio", FK_OPT_DOUBLE, offsetof(struct duo_opts, head_ratio), 0.5, 0, 1, NULL,
     "share of the model's (layer, KV head) pairs made streaming, the lowest gates first "
     "(kvpress head_compression_ratio; fraction)"},
    {"sinks", FK_OPT_INT, offsetof(struct duo_opts, sinks), 64, 0, 1 << 24, NULL,
     "first tokens a streaming head keeps (tokens; DuoAttention's LongBench runs: 64)"},
    {"recent", FK_OPT_INT, offsetof(struct duo_opts, recent), 256, 1, 1 << 24, NULL,
     "most recent tokens a streaming head keeps (tokens)"},
    {"rolling", FK_OPT_BOOL, offsetof(struct duo_opts, rolling), 0, 0, 1, NULL,
     "streaming heads keep sinks + recent at every token (the original); false: only the "
     "prompt is cut, decoded tokens stay (kvpress)"},
    {NULL, 0, 0, 0, 0, 0, NULL, NULL},
};

static unsigned duo_needs(const void *opts)
{
    (void)opts;
    return FK_EVICT_NEED_HEADS;
}

struct duo {
    struct fk_evict_base b;      /* b.extra: [H] 1 for a streaming head */
    struct duo_opts o;
};

static int duo_open(const void *opts, const struct fk_evict_env *env, void **state)
{
    if (!env->head_scores || env->n_layers < 1)
        return fk_err(FK_ECONFIG, "duo: layer %d: no head pattern (the dataset's "
                      "head_pattern)", env->layer);
    FK_TRY(fk_evict_base_open(env, sizeof(struct duo), 0, (size_t)env->n_kv_heads, state));
    struct duo *s = *state;
    s->o = *(const struct duo_opts *)opts;
    int H = env->n_kv_heads, n = env->n_layers * H;
    int pruned = (int)nearbyint(n * s->o.head_ratio); /* half to even, as Python's round */
    const double *sc = env->head_scores;
    for (int h = 0; h < H; h++) { /* its rank in (gate, layer, head) order */
        int me = env->layer * H + h, rank = 0;
        for (int i = 0; i < n; i++)
            rank += sc[i] < sc[me] || (sc[i] == sc[me] && i < me);
        s->b.extra[h] = rank < pruned;
    }
    return FK_OK;
}

/* A streaming head's window over tokens 0 .. t. */
static void stream(struct duo *s, int t)
{
    for (int h = 0; h < s->b.env.n_kv_heads; h++)
        if (s->b.extra[h])
            fk_evict_keep_ranges(&s->b, h, t + 1, 0, s->o.sinks, t + 1 - s->o.recent, t + 1);
}

static int duo_prefill(void *state, const struct fk_evict_view *v)
{
    stream(state, v->t);
    return FK_OK;
}

static int duo_decode(void *state, const struct fk_evict_view *v)
{
    struct duo *s = state;
    if (s->o.rolling)
        stream(s, v->t);
    return FK_OK;
}

const struct fk_evict_ops fk_evict_duo = {
    .name = "duo",
    .summary = "DuoAttention's head split (kvpress DuoAttentionPress): the lowest-gated heads "
               "of the dataset's head_pattern keep sinks + recent, the others everything",
    .opts_size = sizeof(struct duo_opts),
    .options = duo_options,
    .needs = duo_needs,
    .open = duo_open,
    .prefill = duo_prefill,
    .decode = duo_decode,
    .close = fk_evict_base_close,
};
