/* SPDX-License-Identifier: MIT
 * A policy's copy of the kept keys of each KV head, laid out for the decode-step dot
 * products (fk_evict_attn_group): each key row lives in a slot, slots go in blocks of
 * FK_MIRROR_BLOCK, and a block stores its keys coordinate-major ([m][FK_MIRROR_BLOCK]
 * floats), so that one vector register holds one coordinate of a block's keys and the dot
 * products of a block read contiguous memory once per query row.
 *
 * The mirror follows the sets it is asked for: fk_mirror_sync(h, idx, n) makes head h's
 * slots hold exactly the keys idx[0..n), copying the keys that arrived since the last call
 * and freeing the slots of those that left (a slot is reused by a later arrival). A decode
 * step's set differs from the previous one by a token or two, so a sync copies about one
 * key row. Keys never change (a token's exact key is fixed), so a row copied once stays
 * valid for the state's life.
 *
 * The dot products: z[g][slot] = q_g . k_slot with coordinate c summed into lane c % 8 in
 * coordinate order, then the 8 lanes pairwise ((0+4) + (2+6)) + ((1+5) + (3+7)): exactly the
 * order of a dot product of 8-float vectors, so the numbers do not depend on the layout,
 * the block or the clone that ran (ISO C, no contraction).
 */
#ifndef FK_EVICT_MIRROR_H
#define FK_EVICT_MIRROR_H

#include <stddef.h>
#include <stdint.h>

#define FK_MIRROR_BLOCK 16 /* key rows per block: one AVX-512 register of floats */

struct fk_mirror_head {
    float *blk;                  /* [cap / FK_MIRROR_BLOCK][m][FK_MIRROR_BLOCK] */
    int32_t *tok;                /* [cap] token of each slot, -1 when free */
    int32_t *free_slots;         /* [cap] stack of free slots below hw */
    int cap, hw, n_free;         /* slots allocated, slots ever used, free ones below hw */
};

struct fk_mirror {
    int n_heads, n_tokens, head_dim;
    struct fk_mirror_head *head; /* [H] */
    int32_t *slot;               /* [H][T] slot of each token, -1 when not mirrored */
    uint32_t *mark, epoch;       /* [H][T] membership stamps of fk_mirror_sync */
};

/* An empty mirror for H heads of T tokens of dimension m; FK_ENOMEM. */
int fk_mirror_open(struct fk_mirror *mr, int n_heads, int n_tokens, int head_dim);
void fk_mirror_close(struct fk_mirror *mr); /* accepts a zeroed or half-opened mirror */

/* Head h's slots hold exactly the keys of the n distinct tokens idx[] (rows of kh, [T][m]);
 * FK_ENOMEM when the slots cannot grow. */
int fk_mirror_sync(struct fk_mirror *mr, int h, const float *kh, const int32_t *idx, int n);

/* z[g * ldz + slot] = q_g . k_slot for the G query rows q [G][m] and every slot below head
 * h's high-water mark (rounded up to a block; ldz at least that); free slots give
 * meaningless finite values. */
void fk_mirror_dots(const struct fk_mirror *mr, int h, const float *q, int G, float *z,
                    size_t ldz);

/* Slots fk_mirror_dots writes per query row for head h (a multiple of FK_MIRROR_BLOCK). */
int fk_mirror_span(const struct fk_mirror *mr, int h);

#endif
