/* SPDX-License-Identifier: MIT
 * knorm: kvpress KnormPress (NVIDIA/kvpress knorm_press.py, families.md 2.4): score =
 * -||k_i||_2 of the post-RoPE key (RoPE keeps the norm), the n_kept lowest-norm prefill
 * tokens kept per KV head at the prefill's end under the budget allocation
 * (fk_evict_budget.h: uniform n_kept = int(P (1 - ratio)) as kvpress, or `budget` tokens;
 * PyramidKV's per-layer or Ada-KV's per-head budgets). A budget that rounds to no token is
 * refused before any cell (kvpress PR #264 floors it to 1 instead). Decode tokens are
 * appended uncompressed (kvpress compresses the prefill only). No queries needed.
 */
#include <math.h>
#include <stddef.h>

#include "common/fk_err.h"
#include "evict/fk_evict_budget.h"

struct knorm_opts {
    struct fk_evict_budget b;
};

static const struct fk_option knorm_options[] = {
    FK_EVICT_BUDGET_OPTIONS(struct knorm_opts, b),
    {NULL, 0, 0, 0, 0, 0, NULL, NULL},
};

static int knorm_check_prompt(const void *opts, int n_layers, int n_kv_heads, int prompt_len)
{
    const struct knorm_opts *o = opts;
    return fk_evict_budget_check(&o->b, "knorm", 0, n_layers, n_kv_heads, prompt_len);
}

struct knorm {
    struct fk_evict_base b;      /* b.acc: [H][P] the scores of every head of the layer */
    struct knorm_opts o;
};

static int knorm_open(const void *opts, const struct fk_evict_env *env, void **state)
{
    FK_TRY(fk_evict_base_open(env, sizeof(struct knorm), 1, 0, state));
    ((struct knorm *)*state)->o = *(const struct knorm_opts *)opts;
    return FK_OK;
}

static int knorm_prefill(void *state, const struct fk_evict_view *v)
{
    struct knorm *s = state;
    const struct fk_evict_env *e = &s->b.env;
    int P = e->prompt_len, m = e->head_dim;
    for (int h = 0; h < e->n_kv_heads; h++)
        for (int j = 0; j < P; j++) {
            const float *k = v->k + ((size_t)h * e->n_tokens + j) * m;
            double nn = 0;
            for (int c = 0; c < m; c++)
                nn += (double)k[c] * k[c];
            s->b.acc[(size_t)h * P + j] = -sqrt(nn);
        }
    return fk_evict_budget_apply(&s->b, &s->o.b, 0, s->b.acc);
}

const struct fk_evict_ops fk_evict_knorm = {
    .name = "knorm",
    .summary = "KNorm (kvpress KnormPress): keep the lowest-key-norm prefill tokens per KV "
               "head, decode tokens kept",
    .opts_size = sizeof(struct knorm_opts),
    .options = knorm_options,
    .open = knorm_open,
    .check_prompt = knorm_check_prompt,
    .prefill = knorm_prefill,
    .close = fk_evict_base_close,
};
