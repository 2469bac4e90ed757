/* SPDX-License-Identifier: MIT
 * A head pattern: one score per (layer, KV head) of a model, as DuoAttention's
 * `full_attention_heads.tsv` gives it (one row per layer, one tab- or space-separated column
 * per KV head, a learned gate in [0, 1]: high = a retrieval head that needs the whole cache).
 * The dataset key `head_pattern` names the file; eviction policies that declare
 * FK_EVICT_NEED_HEADS (duo) read it through fk_evict_env.head_scores.
 */
#ifndef FK_HEADS_H
#define FK_HEADS_H

struct fk_head_pattern {
    int n_layers, n_heads;
    double *score;               /* [n_layers][n_heads], clipped to [0, 1] as DuoAttention's
                                  * loader does */
    char *path;
};

/* Reads the file; FK_EIO / FK_ECORRUPT naming the file, the line and what was expected (a
 * number, the same column count on every row, at least one row). */
int fk_head_pattern_load(const char *path, struct fk_head_pattern **out);
void fk_head_pattern_free(struct fk_head_pattern **p);

#endif
