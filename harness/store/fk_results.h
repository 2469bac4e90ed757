/* SPDX-License-Identifier: MIT
 * The results store of a sweep directory:
 *   cells/<id>.h5           time series, histograms, recall, per-layer attention (HDF5)
 *   cells/<id>.summary.csv  this cell's rows of summary.csv (no header)
 *   cells/<id>.meta         the cell's headline metrics, "key<TAB>value" lines; written last:
 *                           its presence marks the cell finished (resume key)
 *   cells.csv, summary.csv  regenerated from the finished cells after every cell
 *   provenance.json         written by the CLI
 * Every file is written to a temporary name and renamed, so a crash never leaves a cell
 * half recorded and never damages an earlier result.
 */
#ifndef FK_RESULTS_H
#define FK_RESULTS_H

#include "core/fk_codec.h"
#include "engine/fk_replay.h"

#define FK_ID_LEN 16

/* What identifies a cell (written with its results). */
struct fk_cell_meta {
    char id[FK_ID_LEN + 1];      /* hex cell id */
    const struct fk_codec_ops *ops;
    const void *opts;
    const char *dataset;         /* dataset name */
    const char *const *traces;   /* trace paths */
    int n_traces;
    const char *dict;            /* dictionary path or NULL */
    int attn_stride;             /* 0 = no attention */
    long seed;                   /* the cell's seed */
};

/* Creates dir and dir/cells if needed (refuses an unwritable directory). */
int fk_results_prepare(const char *dir);
/* 1 if the cell's .meta exists. */
int fk_results_done(const char *dir, const char *id);
/* Records one finished cell (h5, summary rows, then meta) atomically. */
int fk_results_commit(const char *dir, const struct fk_cell_meta *meta,
                      const struct fk_cell_result *res);
/* Records a failed cell: meta with status "failed" and the error message. */
int fk_results_commit_failed(const char *dir, const struct fk_cell_meta *meta,
                             const char *status, const char *message);
/* Rewrites cells.csv and summary.csv from the finished cells, in the given order
 * (ids not finished are skipped). Fills cost_mac_rel and cpu_time_rel against the
 * lexico-adp cell of the same dataset and s when the sweep has one. */
int fk_results_tables(const char *dir, const char *const *ids, int n_ids);

/* Writes text to path atomically (path.tmp, fsync, rename). */
int fk_write_atomic(const char *path, const char *text, size_t len);

/* Headline metrics of a finished cell, by name ("rel_err_mean", ...): NaN if absent. */
int fk_results_metric(const char *dir, const char *id, const char *name, double *value);

#endif
