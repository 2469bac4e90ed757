/* SPDX-License-Identifier: MIT
 * snapkv: SnapKV as kvpress computes it (NVIDIA/kvpress snapkv_press.py, families.md 2.2),
 * once at the prefill's end: the last W prefill queries attend causally over the P prefill
 * keys (softmax over every key each query sees), the mean over the W queries of the
 * attention on the P-W tokens before the window, avg_pool1d(kernel, padding kernel/2,
 * stride 1, zero padding counted), the mean over each KV head's query group (SnapKV issue
 * #22: never repeat_kv), the W window tokens protected (always kept, counted in the
 * budget), then the tokens each head keeps under the budget allocation
 * (fk_evict_budget.h: uniform int(P (1 - ratio)) or `budget`, PyramidKV's per-layer or
 * Ada-KV's per-head budgets); at least the window (a choice of ours: kvpress pads the
 * window with the maximum score, which ties). A prompt of P <= W tokens is kept whole
 * (kvpress asserts P > W). Decode tokens are appended uncompressed.
 */
#include <math.h>
#include <stddef.h>

#include "common/fk_err.h"
#include "evict/fk_evict_budget.h"

struct snapkv_opts {
    int window, kernel;
    struct fk_evict_budget b;
};

static const struct fk_option snapkv_options[] = {
    {"window", FK_OPT_INT, offsetof(struct snapkv_opts, window), 64, 1, 1 << 20, NULL,
     "observation window: the last prefill queries scoring the prompt, always kept (tokens)"},
    {"kernel", FK_OPT_INT, offsetof(struct snapkv_opts, kernel), 5, 1, 255, NULL,
     "average-pooling kernel over tokens (odd; zero padding counted)"},
    FK_EVICT_BUDGET_OPTIONS(struct snapkv_opts, b),
    {NULL, 0, 0, 0, 0, 0, NULL, NULL},
};

static int snapkv_check(const void *opts)
{
    const struct snapkv_opts *o = opts;
    if (o->kernel % 2 == 0)
        return fk_err(FK_ECONFIG, "snapkv: kernel = %d must be odd (avg_pool1d with padding "
                      "kernel/2 keeps the length)", o->kernel);
    return FK_OK;
}

static unsigned snapkv_needs(const void *opts)
{
    (void)opts;
    return FK_EVICT_NEED_PREFILL_Q;
}

static int snapkv_prefill_queries(const void *opts, int prompt_len)
{
    int w = ((const struct snapkv_opts *)opts)->window;
    return w < prompt_len ? w : prompt_len;
}

static int snapkv_check_prompt(const void *opts, int n_layers, int n_kv_heads, int prompt_len)
{
    const struct snapkv_opts *o = opts;
    return fk_evict_budget_check(&o->b, "snapkv", o->window, n_layers, n_kv_heads, prompt_len);
}

struct snapkv {
    struct fk_evict_base b;      /* b.acc: [H][P] the scores of every head of the layer */
    struct snapkv_opts o;
};

static int snapkv_open(const void *opts, const struct fk_evict_env *env, void **state)
{
    FK_TRY(fk_evict_base_open(env, sizeof(struct snapkv), 1, 0, state));
    ((struct snapkv *)*state)->o = *(const struct snapkv_opts *)opts;
    return FK_OK;
}

static int snapkv_prefill(void *state, const struct fk_evict_view *v)
{
    struct snapkv *s = state;
    const struct fk_evict_env *e = &s->b.env;
    int P = e->prompt_len, W = s->o.window, G = e->n_q_heads / e->n_kv_heads;
    if (P <= W)
        return FK_OK;
    int L = P - W, half = s->o.kernel / 2;
    int32_t *qtok = s->b.idx;
    double *raw = s->b.tmp;
    for (int h = 0; h < e->n_kv_heads; h++) {
        double *sc = s->b.acc + (size_t)h * P;
        for (int i = 0; i < W; i++)
            qtok[i] = L + i;
        for (int j = 0; j < P; j++)
            raw[j] = 0;
        FK_TRY(fk_evict_attn_causal_sum(e, v, h, qtok, W, P, 1.0 / ((double)W * G), &s->b.sc,
                                        raw));
        for (int i = 0; i < L; i++) {
            double a = 0;
            for (int d = -half; d <= half; d++)
                if (i + d >= 0 && i + d < L)
                    a += raw[i + d];
            sc[i] = a / s->o.kernel;
        }
        for (int i = L; i < P; i++)
            sc[i] = INFINITY; /* the window: protected */
    }
    return fk_evict_budget_apply(&s->b, &s->o.b, W, s->b.acc);
}

const struct fk_evict_ops fk_evict_snapkv = {
    .name = "snapkv",
    .summary = "SnapKV, kvpress semantics: the last `window` prefill queries score the prompt "
               "(pooled, GQA group mean), top tokens + window kept at the prefill's end; "
               "budgets uniform, PyramidKV or Ada-KV (`alloc`)",
    .opts_size = sizeof(struct snapkv_opts),
    .options = snapkv_options,
    .check = snapkv_check,
    .needs = snapkv_needs,
    .prefill_queries = snapkv_prefill_queries,
    .check_prompt = snapkv_check_prompt,
    .open = snapkv_open,
    .prefill = snapkv_prefill,
    .close = fk_evict_base_close,
};
