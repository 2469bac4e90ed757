/* SPDX-License-Identifier: MIT
 * Budget allocation over a prefill scorer (docs/EVICTION.md "Budgets"; spec
 * families-budgets-2026.md sections 0.4, 1 and 2). A scoring policy (snapkv, knorm) scores
 * every prompt token of every KV head of a layer; the allocation decides how many each
 * (layer, head) keeps:
 *   uniform  every head of every layer keeps n = `budget` tokens, or int(P (1 - ratio))
 *            (kvpress ScorerPress);
 *   pyramid  layer l keeps round(max - l (max - min) / (n_layers - 1)) per head, the mean
 *            over layers the uniform n (kvpress PyramidKVPress: min = n / beta, max = 2 n -
 *            min, clamped to P - W, uniform round(n) where the pyramid is infeasible);
 *   ada      the layer keeps H n pairs: each head its top int(n safeguard) first, then one
 *            top-k over every head's remaining scores (kvpress AdaKVPress).
 * W is the scorer's protected tokens (snapkv's window; knorm none), kept first and counted
 * in the budget. Ties: higher score first, then the lower head, then the lower token.
 * A budget under which some (layer, head) could keep no token is refused, naming them.
 */
#ifndef FK_EVICT_BUDGET_H
#define FK_EVICT_BUDGET_H

#include <stddef.h>

#include "evict/fk_evict_common.h"

enum fk_evict_alloc { FK_ALLOC_UNIFORM = 0, FK_ALLOC_PYRAMID = 1, FK_ALLOC_ADA = 2 };
extern const char *const fk_evict_alloc_names[]; /* {"uniform", "pyramid", "ada", NULL} */

struct fk_evict_budget {
    double ratio;                /* fraction of the prompt removed (when budget = 0) */
    int budget;                  /* tokens per head (the mean, under pyramid and ada) */
    int alloc;                   /* enum fk_evict_alloc */
    double safeguard;            /* ada: each head's share of n kept first */
    double pyramid_beta;         /* pyramid: the top layer keeps n / beta */
};

/* The option rows of a scoring policy's budget (field f of its options struct `type`). */
#define FK_EVICT_BUDGET_OPTIONS(type, f)                                                    \
    {"ratio", FK_OPT_DOUBLE, offsetof(type, f.ratio), 0.5, 0, 1, NULL,                     \
     "compression ratio of the prompt: keep int(P (1 - ratio)) tokens per head (fraction; "  \
     "unused when budget > 0)"},                                                           \
    {"budget", FK_OPT_INT, offsetof(type, f.budget), 0, 0, 1 << 24, NULL,                  \
     "prompt tokens kept per KV head, protected ones included; the mean per layer or head " \
     "under alloc pyramid or ada (tokens; 0: use ratio)"},                                 \
    {"alloc", FK_OPT_ENUM, offsetof(type, f.alloc), FK_ALLOC_UNIFORM, 0, 2,                \
     fk_evict_alloc_names,                                                                 \
     "budget allocation: uniform (every layer and head), pyramid (PyramidKV: per layer, "   \
     "falling with depth), ada (Ada-KV: one top-k over a layer's heads)"},                 \
    {"safeguard", FK_OPT_DOUBLE, offsetof(type, f.safeguard), 0.2, 0, 1, NULL,             \
     "alloc ada: the share of the per-head budget each head keeps before the joint top-k " \
     "(Ada-KV's alpha_safeguard; fraction)"},                                              \
    {"pyramid_beta", FK_OPT_DOUBLE, offsetof(type, f.pyramid_beta), 20, 1, 1e6, NULL,      \
     "alloc pyramid: the last layer keeps the mean budget / pyramid_beta (PyramidKV's "     \
     "beta)"}

/* The mean tokens per head n under the budget for a prompt of P tokens (0 when it rounds
 * to none), and the tokens per head layer l keeps (uniform and pyramid; ada: n, the
 * layer's per-head mean). n_protect: the scorer's protected tokens (counted in n). */
int fk_evict_budget_mean(const struct fk_evict_budget *b, int prompt_len);
int fk_evict_budget_layer(const struct fk_evict_budget *b, int prompt_len, int n_protect,
                          int n_layers, int layer);

/* FK_ECONFIG, naming policy, layer and head, when under b some (layer, head) of a prompt of
 * P tokens could keep no token (a count of 0 that n_protect does not lift; ada: a
 * safeguard of 0 tokens and nothing protected); FK_OK otherwise. */
int fk_evict_budget_check(const struct fk_evict_budget *b, const char *policy, int n_protect,
                          int n_layers, int n_kv_heads, int prompt_len);

/* Applies the allocation to the prompt tokens 0 .. P-1 of every head of the base's layer:
 * score[h * P + j] the scorer's score of token j of head h (higher keeps; +INFINITY:
 * protected). The mask keeps the chosen tokens and clears the others. */
int fk_evict_budget_apply(struct fk_evict_base *base, const struct fk_evict_budget *b,
                          int n_protect, const double *score);

#endif
