/* SPDX-License-Identifier: MIT
 * The kept-key mirror of the eviction policies (fk_evict_mirror.h).
 */
#include "evict/fk_evict_mirror.h"

#include <stdlib.h>
#include <string.h>

#include "common/fk_err.h"
#include "kernels/fk_simd.h"

#define B FK_MIRROR_BLOCK
#define LANES 8 /* the dot product's float lanes (fk_evict_mirror.h) */

typedef float fk_v16 __attribute__((vector_size(B * sizeof(float))));

int fk_mirror_open(struct fk_mirror *mr, int n_heads, int n_tokens, int head_dim)
{
    memset(mr, 0, sizeof *mr);
    size_t ht = (size_t)n_heads * (size_t)n_tokens;
    mr->n_heads = n_heads;
    mr->n_tokens = n_tokens;
    mr->head_dim = head_dim;
    mr->head = calloc((size_t)n_heads, sizeof *mr->head);
    mr->slot = malloc(ht * sizeof *mr->slot);
    mr->mark = calloc(ht, sizeof *mr->mark);
    if (!mr->head || !mr->slot || !mr->mark) {
        fk_mirror_close(mr);
        return fk_err(FK_ENOMEM, "eviction scores: out of memory (key mirror of %d heads x %d "
                      "tokens)", n_heads, n_tokens);
    }
    for (size_t i = 0; i < ht; i++)
        mr->slot[i] = -1;
    return FK_OK;
}

void fk_mirror_close(struct fk_mirror *mr)
{
    for (int h = 0; mr->head && h < mr->n_heads; h++) {
        free(mr->head[h].blk);
        free(mr->head[h].tok);
        free(mr->head[h].free_slots);
    }
    free(mr->head);
    free(mr->slot);
    free(mr->mark);
    memset(mr, 0, sizeof *mr);
}

/* Room for at least one more slot: the block array doubled, the new blocks zeroed (their
 * unused slots then give finite dot products). */
static int grow(struct fk_mirror *mr, struct fk_mirror_head *hd)
{
    int cap = hd->cap ? 2 * hd->cap : 4 * B;
    if (cap > mr->n_tokens)
        cap = (mr->n_tokens + B - 1) / B * B;
    if (cap <= hd->cap) /* never: a head mirrors at most its T distinct tokens */
        return fk_err(FK_EINVAL, "eviction scores: key mirror full (%d slots)", hd->cap);
    size_t m = (size_t)mr->head_dim;
    float *blk = realloc(hd->blk, (size_t)cap * m * sizeof(float));
    if (blk)
        hd->blk = blk;
    int32_t *tok = blk ? realloc(hd->tok, (size_t)cap * sizeof(int32_t)) : NULL;
    if (tok)
        hd->tok = tok;
    int32_t *fr = tok ? realloc(hd->free_slots, (size_t)cap * sizeof(int32_t)) : NULL;
    if (!fr)
        return fk_err(FK_ENOMEM, "eviction scores: out of memory (key mirror, %d slots)", cap);
    hd->free_slots = fr;
    memset(hd->blk + (size_t)hd->cap * m, 0, (size_t)(cap - hd->cap) * m * sizeof(float));
    for (int s = hd->cap; s < cap; s++)
        hd->tok[s] = -1;
    hd->cap = cap;
    return FK_OK;
}

int fk_mirror_sync(struct fk_mirror *mr, int h, const float *kh, const int32_t *idx, int n)
{
    struct fk_mirror_head *hd = &mr->head[h];
    size_t T = (size_t)mr->n_tokens, m = (size_t)mr->head_dim;
    int32_t *slot = mr->slot + (size_t)h * T;
    uint32_t *mark = mr->mark + (size_t)h * T;
    if (++mr->epoch == 0) { /* the stamps wrapped: start them again */
        memset(mr->mark, 0, (size_t)mr->n_heads * T * sizeof *mr->mark);
        mr->epoch = 1;
    }
    uint32_t ep = mr->epoch;
    for (int i = 0; i < n; i++)
        mark[idx[i]] = ep;
    for (int s = 0; s < hd->hw; s++) { /* the keys that left free their slots */
        int32_t j = hd->tok[s];
        if (j >= 0 && mark[j] != ep) {
            hd->tok[s] = -1;
            slot[j] = -1;
            hd->free_slots[hd->n_free++] = s;
        }
    }
    for (int i = 0; i < n; i++) { /* the keys that arrived take a slot */
        int32_t j = idx[i];
        if (slot[j] >= 0)
            continue;
        int s;
        if (hd->n_free > 0) {
            s = hd->free_slots[--hd->n_free];
        } else {
            if (hd->hw == hd->cap)
                FK_TRY(grow(mr, hd));
            s = hd->hw++;
        }
        hd->tok[s] = j;
        slot[j] = s;
        float *col = hd->blk + (size_t)(s / B) * m * B + s % B;
        const float *k = kh + (size_t)j * m;
        for (size_t c = 0; c < m; c++)
            col[c * B] = k[c];
    }
    return FK_OK;
}

int fk_mirror_span(const struct fk_mirror *mr, int h)
{
    return (mr->head[h].hw + B - 1) / B * B;
}

/* The end of a block's dot products with query row q: coordinates mv .. m-1 (m not a
 * multiple of LANES) into their lanes a[c - mv], then the lanes summed pairwise into z[0..B).
 * Inlined into each kernel and clone. */
static inline __attribute__((always_inline)) void lanes_finish(const float *restrict blk,
                                                               const float *restrict q, int m,
                                                               int mv, fk_v16 *a,
                                                               float *restrict z)
{
    for (int c = mv; c < m; c++) {
        fk_v16 x;
        memcpy(&x, blk + (size_t)c * B, sizeof x);
        a[c - mv] += q[c] * x;
    }
    fk_v16 r = ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
    memcpy(z, &r, sizeof r);
}

/* One block's B dot products with one query row q [m] into z[0..B): coordinate c in lane
 * c % LANES, in coordinate order, the lanes summed pairwise (fk_evict_mirror.h). */
FK_CLONES512 static void dots_block(const float *restrict blk, const float *restrict q, int m,
                                    float *restrict z)
{
    int mv = m / LANES * LANES;
    fk_v16 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, a4 = {0}, a5 = {0}, a6 = {0}, a7 = {0};
    for (int c = 0; c < mv; c += LANES) {
        const float *k = blk + (size_t)c * B;
        fk_v16 x;
#define FK_LANE(l, a)                                                                          \
    memcpy(&x, k + (l) * B, sizeof x);                                                        \
    a += q[c + (l)] * x;
        FK_LANE(0, a0) FK_LANE(1, a1) FK_LANE(2, a2) FK_LANE(3, a3)
        FK_LANE(4, a4) FK_LANE(5, a5) FK_LANE(6, a6) FK_LANE(7, a7)
#undef FK_LANE
    }
    fk_v16 a[LANES] = {a0, a1, a2, a3, a4, a5, a6, a7};
    lanes_finish(blk, q, m, mv, a, z);
}

/* Keeps a 16-float vector in an AVX-512 register (no instruction): without it GCC folds the
 * load into each of the three multiplies that read it, and loads it three times. */
#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#define FK_IN_REGISTER(v) __asm__("" : "+v"(v))
#else
#define FK_IN_REGISTER(v) (void)0
#endif

/* dots_block of three query rows q, q + m, q + 2m into z, z + ldz, z + 2 ldz, each key vector
 * loaded once for the three (dots_block is bound by its loads: a key vector and a broadcast
 * query coordinate per multiply and add); each row's lanes get the same operations in the
 * same order as in dots_block. AVX-512 only (fk_mirror_dots checks). */
FK_AVX512_ONLY static void dots_block3(const float *restrict blk, const float *restrict q, int m,
                                     float *restrict z, size_t ldz)
{
    const float *restrict q0 = q, *restrict q1 = q + m, *restrict q2 = q + 2 * (size_t)m;
    int mv = m / LANES * LANES;
    fk_v16 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, a4 = {0}, a5 = {0}, a6 = {0}, a7 = {0};
    fk_v16 b0 = {0}, b1 = {0}, b2 = {0}, b3 = {0}, b4 = {0}, b5 = {0}, b6 = {0}, b7 = {0};
    fk_v16 c0 = {0}, c1 = {0}, c2 = {0}, c3 = {0}, c4 = {0}, c5 = {0}, c6 = {0}, c7 = {0};
    for (int c = 0; c < mv; c += LANES) {
        const float *k = blk + (size_t)c * B;
        fk_v16 x;
#define FK_LANE3(l, a, b, d)                                                                   \
    memcpy(&x, k + (l) * B, sizeof x);                                                        \
    FK_IN_REGISTER(x);                                                                        \
    a += q0[c + (l)] * x;                                                                     \
    b += q1[c + (l)] * x;                                                                     \
    d += q2[c + (l)] * x;
        FK_LANE3(0, a0, b0, c0) FK_LANE3(1, a1, b1, c1) FK_LANE3(2, a2, b2, c2)
        FK_LANE3(3, a3, b3, c3) FK_LANE3(4, a4, b4, c4) FK_LANE3(5, a5, b5, c5)
        FK_LANE3(6, a6, b6, c6) FK_LANE3(7, a7, b7, c7)
#undef FK_LANE3
    }
    fk_v16 acc[3][LANES] = {{a0, a1, a2, a3, a4, a5, a6, a7}, {b0, b1, b2, b3, b4, b5, b6, b7},
                            {c0, c1, c2, c3, c4, c5, c6, c7}};
    for (int g = 0; g < 3; g++)
        lanes_finish(blk, q + (size_t)g * m, m, mv, acc[g], z + (size_t)g * ldz);
}

void fk_mirror_dots(const struct fk_mirror *mr, int h, const float *q, int G, float *z,
                    size_t ldz)
{
    const struct fk_mirror_head *hd = &mr->head[h];
    int m = mr->head_dim, nb = (hd->hw + B - 1) / B, three = fk_have_avx512();
    for (int b = 0; b < nb; b++) { /* a block (m B floats) stays in L1 for the G rows */
        const float *blk = hd->blk + (size_t)b * m * B;
        int g = 0;
        for (; three && g + 3 <= G; g += 3)
            dots_block3(blk, q + (size_t)g * m, m, z + (size_t)g * ldz + (size_t)b * B, ldz);
        for (; g < G; g++)
            dots_block(blk, q + (size_t)g * m, m, z + (size_t)g * ldz + (size_t)b * B);
    }
}
