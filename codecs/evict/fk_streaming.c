/* SPDX-License-Identifier: MIT
 * streaming: StreamingLLM (Xiao et al.; mit-han-lab/streaming-llm kv_cache.py
 * StartRecentKVCache, families.md 2.1): the first `sinks` tokens plus the `recent` most
 * recent ones, evicted at the prefill's end and at every decode token (the original's
 * per-step rule; kvpress's StreamingLLMPress is the prefill-only form). Original positions:
 * the recorded post-RoPE keys and queries are replayed as they are (no re-rotation to cache
 * positions). No queries needed.
 */
#include <stddef.h>

#include "common/fk_err.h"
#include "evict/fk_evict_common.h"

struct streaming_opts {
    int sinks, recent;
};

static const struct fk_option streaming_options[] = {
    {"sinks", FK_OPT_INT, offsetof(struct streaming_opts, sinks), 4, 0, 1 << 24, NULL,
     "attention-sink tokens kept from the start of the sequence (tokens)"},
    {"recent", FK_OPT_INT, offsetof(struct streaming_opts, recent), 256, 1, 1 << 24, NULL,
     "most recent tokens kept, the current one included (tokens)"},
    {NULL, 0, 0, 0, 0, 0, NULL, NULL},
};

struct streaming {
    struct fk_evict_base b;
    struct streaming_opts o;
};

static int streaming_open(const void *opts, const struct fk_evict_env *env, void **state)
{
    FK_TRY(fk_evict_base_open(env, sizeof(struct streaming), 0, 0, state));
    ((struct streaming *)*state)->o = *(const struct streaming_opts *)opts;
    return FK_OK;
}

/* Keeps sinks and the window ending at token t (inclusive) in every head. */
static int streaming_apply(void *state, const struct fk_evict_view *v)
{
    struct streaming *s = state;
    int n = v->t + 1;
    if (n <= s->o.sinks + s->o.recent)
        return FK_OK;
    for (int h = 0; h < s->b.env.n_kv_heads; h++)
        fk_evict_keep_ranges(&s->b, h, n, 0, s->o.sinks, n - s->o.recent, n);
    return FK_OK;
}

const struct fk_evict_ops fk_evict_streaming = {
    .name = "streaming",
    .summary = "StreamingLLM: sink tokens + recent window, evicted at the prefill's end and "
               "every decode token (streaming-llm StartRecentKVCache)",
    .opts_size = sizeof(struct streaming_opts),
    .options = streaming_options,
    .open = streaming_open,
    .prefill = streaming_apply,
    .decode = streaming_apply,
    .close = fk_evict_base_close,
};
