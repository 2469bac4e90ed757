/* SPDX-License-Identifier: MIT
 * Merging the results directories of the shards of one sweep (`--shard I/N` runs).
 *
 * Refuses shards of different sweeps (provenance.json config_hash or resolved.txt differ,
 * or an output directory already holding another sweep). Copies every finished cell of the
 * sweep (fk_store_cell_copy). A cell present in two shards (or already in the output) must
 * hold the same results (fk_store_cell_same), else the merge refuses. Then writes
 * resolved.txt and provenance.json (shard 0's, with "merged_from") and regenerates
 * cells.csv and summary.csv in resolved.txt's cell order.
 */
#ifndef FK_MERGE_H
#define FK_MERGE_H

struct fk_merge_opts {
    const char *out;             /* output results directory (created if needed) */
    const char *const *shards;   /* [n_shards] shard results directories */
    int n_shards;
    const char *cost_baseline;   /* codec of the cost columns; NULL: the one the shards'
                                  * cells.csv were computed with (fk_store_cost_baseline) */
};

struct fk_merge_result {
    int copied;                  /* cells copied from a shard */
    int duplicates;              /* cells present twice (and identical) */
    int foreign;                 /* finished cells not in the sweep (skipped) */
    int missing;                 /* cells of the sweep in no shard */
    int n_cells;                 /* cells of the sweep */
};

/* Merges; on failure the message names the shard, cell or file (FK_ECORRUPT for shards of
 * different sweeps or conflicting cells, FK_EIO, FK_ENOMEM). */
int fk_merge(const struct fk_merge_opts *o, struct fk_merge_result *r);

#endif
