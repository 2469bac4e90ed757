/* SPDX-License-Identifier: MIT
 * The state every policy of this folder starts with: the shapes, the scoring scratch and
 * per-call work arrays of T entries (fk_evict_attn.h).
 */
#ifndef FK_EVICT_COMMON_H
#define FK_EVICT_COMMON_H

#include "evict/fk_evict_attn.h"

struct fk_evict_base {
    struct fk_evict_env env;
    struct fk_evict_scratch sc;
    int32_t *idx;                /* [T] candidate tokens */
    double *score;               /* [T] their scores */
    double *tmp;                 /* [2 T] fk_evict_keep_top's pairs */
    double *acc;                 /* [H][T] accumulated scores (a prefill scorer's [H][P]
                                  * prompt scores, fk_evict_budget.h), or NULL (acc = 0) */
    double *extra;               /* [n_extra] a policy's own work array, zeroed, or NULL */
};

/* Allocates the base of a policy state of `size` bytes (the base its first member) with
 * accumulators when acc is 1 and n_extra doubles in `extra`; FK_ENOMEM or FK_EINVAL (bad
 * shapes) otherwise. */
int fk_evict_base_open(const struct fk_evict_env *env, size_t size, int acc, size_t n_extra,
                       void **state);
void fk_evict_base_close(void *state);

/* Keeps token range [lo, hi) and clears every other mask bit of head h below `end`. */
void fk_evict_keep_ranges(struct fk_evict_base *b, int h, int end, int lo0, int hi0, int lo1,
                          int hi1);

/* The decoding-phase scaffold (SCOPE, Moment-KV; families.md 4.1, 4.2): the prefill stays;
 * when more than `budget` decoded tokens (P .. t) of head h are kept, the `recent` most
 * recent (t-recent+1 .. t) stay and of the older kept decoded tokens the budget - recent
 * best by tok_score[j] (indexed by token; ties to the lower token). */
void fk_evict_decode_window(struct fk_evict_base *b, int h, int t, int budget, int recent,
                            const double *tok_score);
/* Decoded tokens of head h kept among P .. t. */
int fk_evict_decoded_kept(const struct fk_evict_base *b, int h, int t);
#endif
