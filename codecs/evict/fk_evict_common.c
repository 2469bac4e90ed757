/* SPDX-License-Identifier: MIT
 * The state every policy of this folder starts with (fk_evict_common.h).
 */
#include "evict/fk_evict_common.h"

#include <stdlib.h>
#include <string.h>

#include "common/fk_err.h"

int fk_evict_base_open(const struct fk_evict_env *env, size_t size, int acc, size_t n_extra,
                       void **state)
{
    *state = NULL;
    if (env->n_kv_heads < 1 || env->n_q_heads < env->n_kv_heads ||
        env->n_q_heads % env->n_kv_heads || env->head_dim < 1 || env->prompt_len < 0 ||
        env->prompt_len > env->n_tokens || !env->keep)
        return fk_err(FK_EINVAL, "eviction policy: bad shapes (KV heads %d, query heads %d, "
                      "head_dim %d, prompt %d of %d tokens)", env->n_kv_heads, env->n_q_heads,
                      env->head_dim, env->prompt_len, env->n_tokens);
    struct fk_evict_base *b = calloc(1, size);
    if (!b)
        return fk_err(FK_ENOMEM, "out of memory");
    size_t T = (size_t)env->n_tokens;
    b->env = *env;
    b->idx = malloc(sizeof(int32_t) * T);
    b->score = malloc(sizeof(double) * T);
    b->tmp = malloc(sizeof(double) * 2 * T);
    b->acc = acc ? calloc(T * (size_t)env->n_kv_heads, sizeof(double)) : NULL;
    b->extra = n_extra ? calloc(n_extra, sizeof(double)) : NULL;
    if (!b->idx || !b->score || !b->tmp || (acc && !b->acc) || (n_extra && !b->extra)) {
        fk_evict_base_close(b);
        return fk_err(FK_ENOMEM, "out of memory (eviction policy, %zu tokens)", T);
    }
    *state = b;
    return FK_OK;
}

void fk_evict_base_close(void *state)
{
    struct fk_evict_base *b = state;
    if (!b)
        return;
    fk_evict_scratch_free(&b->sc);
    free(b->idx);
    free(b->score);
    free(b->tmp);
    free(b->acc);
    free(b->extra);
    free(b);
}

void fk_evict_keep_ranges(struct fk_evict_base *b, int h, int end, int lo0, int hi0, int lo1,
                          int hi1)
{
    uint8_t *k = b->env.keep + (size_t)h * b->env.n_tokens;
    for (int j = 0; j < end; j++)
        if (!((j >= lo0 && j < hi0) || (j >= lo1 && j < hi1)))
            k[j] = 0;
}

int fk_evict_decoded_kept(const struct fk_evict_base *b, int h, int t)
{
    const uint8_t *k = b->env.keep + (size_t)h * b->env.n_tokens;
    int n = 0;
    for (int j = b->env.prompt_len; j <= t; j++)
        n += k[j];
    return n;
}

void fk_evict_decode_window(struct fk_evict_base *b, int h, int t, int budget, int recent,
                            const double *tok_score)
{
    if (fk_evict_decoded_kept(b, h, t) <= budget)
        return;
    int nc = fk_evict_kept(&b->env, h, b->env.prompt_len, t + 1 - recent, b->idx);
    for (int i = 0; i < nc; i++)
        b->score[i] = tok_score[b->idx[i]];
    fk_evict_keep_top(b->score, b->idx, nc, budget - recent,
                      b->env.keep + (size_t)h * b->env.n_tokens, b->tmp);
}
