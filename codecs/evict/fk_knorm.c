/* SPDX-License-Identifier: MIT
 * knorm: kvpress KnormPress (NVIDIA/kvpress knorm_press.py, families.md 2.4): score =
 * -||k_i||_2 of the post-RoPE key (RoPE keeps the norm), the n_kept lowest-norm prefill
 * tokens kept per KV head at the prefill's end, n_kept = int(P (1 - ratio)) (kvpress) or
 * `budget` tokens when budget > 0; at least 1 (kvpress PR #264). Decode tokens are appended
 * uncompressed (kvpress compresses the prefill only). No queries needed.
 */
#include <math.h>
#include <stddef.h>

#include "common/fk_err.h"
#include "evict/fk_evict_common.h"

struct knorm_opts {
    double ratio;
    int budget;
};

static const struct fk_option knorm_options[] = {
    {"ratio", FK_OPT_DOUBLE, offsetof(struct knorm_opts, ratio), 0.5, 0, 1, NULL,
     "compression ratio of the prefill: keep int(P (1 - ratio)) tokens (fraction; unused "
     "when budget > 0)"},
    {"budget", FK_OPT_INT, offsetof(struct knorm_opts, budget), 0, 0, 1 << 24, NULL,
     "prefill tokens kept per KV head (tokens; 0: use ratio)"},
    {NULL, 0, 0, 0, 0, 0, NULL, NULL},
};

struct knorm {
    struct fk_evict_base b;
    struct knorm_opts o;
};

static int knorm_open(const void *opts, const struct fk_evict_env *env, void **state)
{
    FK_TRY(fk_evict_base_open(env, sizeof(struct knorm), 0, state));
    ((struct knorm *)*state)->o = *(const struct knorm_opts *)opts;
    return FK_OK;
}

static int knorm_prefill(void *state, const struct fk_evict_view *v)
{
    struct knorm *s = state;
    const struct fk_evict_env *e = &s->b.env;
    int P = e->prompt_len, m = e->head_dim;
    int keep = s->o.budget > 0 ? s->o.budget : (int)(P * (1.0 - s->o.ratio));
    if (keep < 1)
        keep = 1;
    for (int h = 0; h < e->n_kv_heads; h++) {
        int n = fk_evict_kept(e, h, 0, P, s->b.idx);
        for (int i = 0; i < n; i++) {
            const float *k = v->k + ((size_t)h * e->n_tokens + s->b.idx[i]) * m;
            double nn = 0;
            for (int c = 0; c < m; c++)
                nn += (double)k[c] * k[c];
            s->b.score[i] = -sqrt(nn);
        }
        fk_evict_keep_top(s->b.score, s->b.idx, n, keep, e->keep + (size_t)h * e->n_tokens,
                          s->b.tmp);
    }
    return FK_OK;
}

const struct fk_evict_ops fk_evict_knorm = {
    .name = "knorm",
    .summary = "KNorm (kvpress KnormPress): keep the lowest-key-norm prefill tokens per KV "
               "head, decode tokens kept",
    .opts_size = sizeof(struct knorm_opts),
    .options = knorm_options,
    .open = knorm_open,
    .prefill = knorm_prefill,
    .close = fk_evict_base_close,
};
