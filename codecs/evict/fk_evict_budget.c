/* SPDX-License-Identifier: MIT
 * Budget allocation over a prefill scorer (fk_evict_budget.h).
 */
#include "evict/fk_evict_budget.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/fk_err.h"

const char *const fk_evict_alloc_names[] = {"uniform", "pyramid", "ada", NULL};

int fk_evict_budget_mean(const struct fk_evict_budget *b, int prompt_len)
{
    /* kvpress: int(L (1 - r)) in this operation order (spec 0.4.2) */
    return b->budget > 0 ? b->budget : (int)((double)prompt_len * (1.0 - b->ratio));
}

/* kvpress PyramidKVPress.get_layer_budget (spec 1.1), with the mean per layer n = P (1 - r)
 * (not truncated, as kvpress) or the budget; round half to even (Python's round). */
static int pyramid_layer(const struct fk_evict_budget *b, int P, int W, int n_layers, int l)
{
    double mean = b->budget > 0 ? (double)b->budget : (double)P * (1.0 - b->ratio);
    double cap = W + mean;
    double mn = (cap - W) / b->pyramid_beta, mx = 2 * (cap - W) - mn;
    if (mx >= P - W) {
        mx = P - W;
        mn = 2 * (cap - W) - mx;
    }
    if (!(P >= mx && mx >= mn && mn >= W))
        return (int)nearbyint(mean); /* infeasible: uniform (kvpress's fallback) */
    double steps = n_layers > 1 ? (mx - mn) / (n_layers - 1) : 0;
    return (int)nearbyint(mx - l * steps);
}

int fk_evict_budget_layer(const struct fk_evict_budget *b, int prompt_len, int n_protect,
                          int n_layers, int layer)
{
    if (b->alloc == FK_ALLOC_PYRAMID)
        return pyramid_layer(b, prompt_len, n_protect, n_layers, layer);
    return fk_evict_budget_mean(b, prompt_len);
}

int fk_evict_budget_check(const struct fk_evict_budget *b, const char *policy, int n_protect,
                          int n_layers, int n_kv_heads, int prompt_len)
{
    int P = prompt_len, W = n_protect;
    if (P <= W || n_kv_heads < 1)
        return FK_OK; /* the prompt is kept whole */
    if (b->alloc == FK_ALLOC_PYRAMID && n_layers < 1)
        return fk_err(FK_ECONFIG, "%s: alloc pyramid needs the number of layers", policy);
    for (int l = 0; l < n_layers; l++) {
        int n = fk_evict_budget_layer(b, P, W, n_layers, l);
        if (n < W)
            n = W;
        if (n < 1)
            return fk_err(FK_ECONFIG, "%s: layer %d, KV head 0 (and every head of the layer) "
                          "would keep no token of a %d-token prompt: alloc %s, %s gives 0; "
                          "raise the budget", policy, l, P, fk_evict_alloc_names[b->alloc],
                          b->budget > 0 ? "budget" : "int(P (1 - ratio))");
        if (b->alloc == FK_ALLOC_ADA && n < P && (int)(n * b->safeguard) < 1 && W < 1)
            return fk_err(FK_ECONFIG, "%s: layer %d, KV head 0 (and every head of the layer) "
                          "could keep no token: alloc ada protects int(%d x safeguard %g) = 0 "
                          "tokens per head and the scorer none, so the joint top-k may empty "
                          "a head; raise safeguard to at least %g or the budget", policy, l,
                          n, b->safeguard, 1.0 / n);
    }
    return FK_OK;
}

/* Ada-KV (kvpress AdaKVPress, spec 2.1): each head's top n_safe scores raised to protected,
 * then the H n best pairs of the layer. */
static int apply_ada(struct fk_evict_base *base, int n, int n_safe, const double *score)
{
    const struct fk_evict_env *e = &base->env;
    int H = e->n_kv_heads, P = e->prompt_len, T = e->n_tokens;
    size_t HP = (size_t)H * P;
    double *s2 = malloc(sizeof(double) * HP), *tmp = malloc(sizeof(double) * 2 * HP);
    int32_t *flat = malloc(sizeof(int32_t) * HP);
    uint8_t *row = malloc((size_t)P);
    if (!s2 || !tmp || !flat || !row) {
        free(s2), free(tmp), free(flat), free(row);
        return fk_err(FK_ENOMEM, "out of memory (Ada-KV allocation, %zu scores)", HP);
    }
    memcpy(s2, score, sizeof(double) * HP);
    for (int j = 0; j < P; j++)
        base->idx[j] = j;
    for (int h = 0; h < H; h++) {
        memset(row, 1, (size_t)P);
        fk_evict_keep_top(score + (size_t)h * P, base->idx, P, n_safe, row, tmp);
        for (int j = 0; j < P; j++) {
            if (row[j])
                s2[(size_t)h * P + j] = INFINITY;
            flat[(size_t)h * P + j] = h * T + j;
        }
    }
    fk_evict_keep_top(s2, flat, (int)HP, H * n, e->keep, tmp);
    free(s2), free(tmp), free(flat), free(row);
    return FK_OK;
}

int fk_evict_budget_apply(struct fk_evict_base *base, const struct fk_evict_budget *b,
                          int n_protect, const double *score)
{
    const struct fk_evict_env *e = &base->env;
    int P = e->prompt_len, W = n_protect;
    if (P <= W)
        return FK_OK;
    if (b->alloc == FK_ALLOC_PYRAMID && e->n_layers < 1)
        return fk_err(FK_ECONFIG, "alloc pyramid needs the number of layers");
    int n = fk_evict_budget_layer(b, P, W, e->n_layers, e->layer);
    if (n < W)
        n = W;
    if (n >= P)
        return FK_OK;
    if (n < 1 || (b->alloc == FK_ALLOC_ADA && (int)(n * b->safeguard) < 1 && W < 1))
        return fk_err(FK_ECONFIG, "layer %d: a budget of %d tokens per head (safeguard %g, "
                      "%d protected) could empty a head", e->layer, n, b->safeguard, W);
    if (b->alloc == FK_ALLOC_ADA)
        return apply_ada(base, n, (int)(n * b->safeguard), score);
    for (int j = 0; j < P; j++)
        base->idx[j] = j;
    for (int h = 0; h < e->n_kv_heads; h++)
        fk_evict_keep_top(score + (size_t)h * P, base->idx, P, n,
                          e->keep + (size_t)h * e->n_tokens, base->tmp);
    return FK_OK;
}
