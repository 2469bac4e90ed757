/* SPDX-License-Identifier: MIT
 * The results store of a sweep directory:
 *   cells/<id>.h5           time series, histograms, recall, per-layer attention (HDF5)
 *   cells/<id>.summary.csv  this cell's rows of summary.csv (no header)
 *   cells/<id>.meta         the cell's headline metrics, "key<TAB>value" lines; written last:
 *                           its presence marks the cell finished (resume key)
 *   cells.csv, summary.csv  regenerated from the finished cells after every cell
 *   provenance.json         where, how and with what the sweep ran (fk_store_provenance_*)
 *   resolved.txt            the canonical text of the resolved sweep, one cell per line
 * Every file is written to a temporary name and renamed, so a crash never leaves a cell
 * half recorded and never damages an earlier result. This module is the only code that
 * knows these names and formats: the sweep writes through it, and plot, check and merge
 * read through it. Paths are built to their full length; one longer than PATH_MAX is an
 * error (FK_EINVAL), never a truncation.
 */
#ifndef FK_RESULTS_H
#define FK_RESULTS_H

#include <stddef.h>
#include <stdint.h>

#include "core/fk_codec.h"
#include "core/fk_rewrite.h"
#include "engine/fk_replay.h"
#include "store/fk_csv.h"

#define FK_ID_LEN 16

/* What a cell of a model dataset measured in the loop (harness/loop), per prompt p (the
 * dataset's traces are their exact decodes, trace p = prompt p). Teacher-forced series are
 * fed the exact greedy decode; free-running ones the codec's own argmax. */
struct fk_cell_loop {
    int n_prompts, n_layers, n_steps;
    double *kl;                  /* [p][step] KL(P_exact || P_codec), nats */
    uint8_t *top1;               /* [p][step] argmaxes agree */
    double *nll_exact, *nll_codec; /* [p][step] -log p(next reference id) */
    double *kl_free;             /* [p][step] free running, against the exact decode's logits */
    int32_t *tokens_free;        /* [p][step] the codec's free-running argmax */
    int32_t *tokens_greedy;      /* [p][step] the exact greedy id it is compared with */
    int32_t *first_diverge;      /* [p] first free-running step that differs, -1: none */
    double *attn_cos, *attn_kl;  /* [p][layer] closed-loop attention fidelity (teacher) */
};

/* What identifies a cell (written with its results). */
struct fk_cell_meta {
    char id[FK_ID_LEN + 1];      /* hex cell id */
    const struct fk_codec_ops *ops;
    const void *opts;
    const char *dataset;         /* dataset name */
    const char *const *traces;   /* trace paths */
    int n_traces;
    const char *dict;            /* dictionary path or NULL */
    const char *basis;           /* basis file path or NULL */
    const char *calib;           /* calibration file path or NULL (no line in meta.tsv) */
    int attn_stride;             /* 0 = no attention */
    long seed;                   /* the cell's seed */
    int repeat;                  /* 0 .. repeats-1 of the sweep (cells.csv column repeat) */
    const char *sweep;           /* name of the sweep that computed it (NULL: none) */
    const struct fk_evict_ops *evict; /* the cell's eviction policy, or NULL */
    const void *evict_opts;
    const struct fk_rewrite *rewrite; /* the cell's row rewrites (core/fk_rewrite.h), or NULL */
    const struct fk_cell_loop *loop; /* closed-loop results (model datasets), or NULL */
};

/* Creates dir and dir/cells if needed (refuses an unwritable directory). */
int fk_results_prepare(const char *dir);
/* What the directory holds of a cell. A finished cell's .meta records the size and SHA-256
 * of its .h5 and .summary.csv files; a cell whose files are missing, cut or changed is
 * DAMAGED (never trusted: resume recomputes it, readers skip or refuse it). */
enum fk_cell_state {
    FK_CELL_NONE = 0,            /* no .meta */
    FK_CELL_OK,                  /* finished, files intact */
    FK_CELL_FAILED,              /* recorded with a status other than ok */
    FK_CELL_DAMAGED,             /* status ok, but a file does not match its record */
};
/* The cell's state; for DAMAGED, why (nullable, cap bytes) names the file and how it
 * differs. Reads and hashes the cell's files; cannot fail otherwise. */
enum fk_cell_state fk_results_state(const char *dir, const char *id, char *why, size_t cap);
/* 1 if the cell finished and its files are intact (state FK_CELL_OK). A failed or damaged
 * cell is not done (a rerun recomputes it). */
int fk_results_done(const char *dir, const char *id);
/* The status the cell's .meta records ("ok", "failed", "crashed", "timeout") into status
 * (cap bytes): 1 when recorded, 0 when not (status ""). */
int fk_results_status(const char *dir, const char *id, char *status, size_t cap);
/* 1 if the cell is recorded, finished or failed (its .meta exists). */
int fk_results_recorded(const char *dir, const char *id);
/* Records one finished cell (h5, summary rows, then meta) atomically. */
int fk_results_commit(const char *dir, const struct fk_cell_meta *meta,
                      const struct fk_cell_result *res);
/* Records a failed cell: meta with status (e.g. "failed"; "crashed" and "timeout" for a
 * cell whose process died or ran past its time limit) and the error message. */
int fk_results_commit_failed(const char *dir, const struct fk_cell_meta *meta,
                             const char *status, const char *message);
/* Rewrites cells.csv and summary.csv from the finished cells, in the given order
 * (ids not finished are skipped). Fills cost_mac_rel and cpu_time_rel against the first
 * finished cell of codec cost_baseline on the same dataset and s (NaN when there is none,
 * or cost_baseline is NULL). */
int fk_results_tables(const char *dir, const char *const *ids, int n_ids,
                      const char *cost_baseline);

/* Writes text to path atomically (path.tmp, fsync, rename). */
int fk_write_atomic(const char *path, const char *text, size_t len);
/* *out = "dir/" + printf(fmt, ...) (malloc'ed): FK_EINVAL when longer than PATH_MAX - 1. */
int fk_store_path(char **out, const char *dir, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* mkdir -p (FK_EIO naming the component that failed). */
int fk_store_mkdir_p(const char *dir);

/* Text value of a cell's .meta key into buf (cap bytes; "" when absent). */
int fk_results_meta_str(const char *dir, const char *id, const char *key, char *buf,
                        size_t cap);
/* Headline metrics of a finished cell, by name ("rel_err_mean", ...): NaN if absent. */
int fk_results_metric(const char *dir, const char *id, const char *name, double *value);


/* ---- reading a results directory ------------------------------------------------------- */

/* cells.csv and summary.csv of a results directory, with the columns every reader needs. */
struct fk_store {
    char *dir;                   /* the results directory */
    struct fk_csv cells;         /* cells.csv: one row per cell in sweep order */
    struct fk_csv summary;       /* summary.csv: one row per cell x trace x layer x kind */
    int c_id, c_codec, c_dataset, c_status; /* cells.csv columns */
    int c_first_opt, c_end_opt;  /* option columns [first, end) of cells.csv */
    int s_id, s_trace, s_kind;   /* summary.csv columns */
    char **damaged;              /* [n_damaged] "ID: reason" of the cells cells.csv lists as
                                  * ok whose files do not match their record; their status
                                  * reads "damaged" here, so readers skip them */
    int n_damaged;
};

/* Opens a results directory: FK_EIO when a table is unreadable, FK_ECORRUPT when it lacks
 * cell_id, codec, dataset, status (cells.csv) or cell_id, trace, kind (summary.csv). Every
 * finished cell's files are verified (see damaged). */
int fk_store_open(const char *dir, struct fk_store **out);
void fk_store_close(struct fk_store **st);
/* The cost baseline the tables were computed with: the codec of the first finished cell
 * whose cost_mac_rel and cpu_time_rel are both exactly 1 (a baseline cell against itself);
 * NULL when no cell is (no baseline in the sweep). Points into st. */
const char *fk_store_cost_baseline(const struct fk_store *st);

/* The per-cell HDF5 series (cells/<id>.h5): T<tt>/L<ll>/<K|V>/<name>. */
struct fk_cell_series {
    char *path;                  /* cells/<id>.h5 */
    int64_t file;                /* HDF5 file id */
    int n_traces, n_layers;      /* groups T00.. and T00/L00.. present */
};
/* FK_EIO when the file cannot be opened (a failed cell has none). */
int fk_store_series_open(const char *dir, const char *id, struct fk_cell_series *out);
/* Series `name` of trace t, layer l, kind k (0 K, 1 V) as doubles (malloc'ed, *n values);
 * *out NULL when absent; FK_ECORRUPT when it is not one-dimensional. */
int fk_store_series_read(struct fk_cell_series *s, int t, int l, int k, const char *name,
                         double **out, int *n);
void fk_store_series_close(struct fk_cell_series *s);

/* resolved.txt (*text malloc'ed, NUL-terminated). */
int fk_store_resolved_read(const char *dir, char **text, size_t *len);
int fk_store_resolved_write(const char *dir, const char *text, size_t len);
/* Cell ids of a resolved.txt text, in sweep order (*ids malloc'ed, free with
 * fk_store_ids_free). */
int fk_store_sweep_ids(const char *resolved, char ***ids, int *n);
/* Removes the files of every recorded cell of dir that the current sweep (resolved.txt)
 * does not hold, under the directory lock (dry: only lists them). *removed (malloc'ed ids,
 * fk_store_ids_free) lists them. A cell that a live run has claimed is kept. */
int fk_store_prune(const char *dir, int dry, char ***removed, int *n);
/* Ids of the finished cells of dir (those with a cells/<id>.meta), directory order. */
int fk_store_finished_ids(const char *dir, char ***ids, int *n);
void fk_store_ids_free(char ***ids, int n);
/* *same = 1 when the cell holds the same results in both directories: its .meta without
 * timing keys (wall_s, t_*, cpu_us_per_vec) and its summary rows without cpu_s. */
int fk_store_cell_same(const char *dir_a, const char *dir_b, const char *id, int *same);
/* Copies a finished cell (h5 if any, summary rows, then .meta last), atomically each. */
int fk_store_cell_copy(const char *from_dir, const char *to_dir, const char *id);

/* ---- provenance.json --------------------------------------------------------------------- */

#define FK_PROV_NONE (-0x7fffffffL - 1) /* a number absent from the file */

/* The keys of provenance.json, written in this order (NULL / FK_PROV_NONE: left out). */
struct fk_provenance {
    const char *const *merged_from; /* [n_merged_from] shard directories (merge only) */
    int n_merged_from;
    const char *harness;         /* "fadkv-bench VERSION" */
    const char *git;             /* git describe */
    const char *config;          /* sweep file */
    const char *config_hash;     /* sha256 of the resolved sweep */
    const char *sweep;           /* [sweep] name */
    long cells, jobs;            /* cells of the sweep, worker threads */
    const char *hdf5, *gsl;      /* library versions */
    const char *blas;            /* "openblas" or "blis" (meson option blas) */
    const char *blas_config;     /* the BLAS's own description (version, build) */
    const char *blas_kernels;    /* the kernel set it runs here ("Haswell", "zen3", ...) */
    const char *simd;            /* the build's own SIMD kernels (meson option simd) */
    const char *compiler;        /* the compiler that built fadkv-bench */
    long blas_threads_per_worker;
    const char *cpu;             /* /proc/cpuinfo model name */
    long online_cpus;
    const char *precision;       /* arithmetic used */
    const char *cost_baseline;   /* codec of the relative cost columns ([sweep] cost_baseline) */
    const char *budgets;         /* [sweep] budgets of the equal-budget table ("2,5,8"), or
                                  * NULL */
    void *owned;                 /* what fk_store_provenance_read allocated */
};

int fk_store_provenance_write(const char *dir, const struct fk_provenance *p);
/* Reads DIR/provenance.json: FK_EIO if unreadable, FK_ECORRUPT (file:line:col) if it is not
 * a JSON object, a known key has the wrong type, or config_hash is absent. Free with
 * fk_store_provenance_free. */
int fk_store_provenance_read(const char *dir, struct fk_provenance *p);
void fk_store_provenance_free(struct fk_provenance *p);
/* 1 when DIR/provenance.json exists. */
int fk_store_has_provenance(const char *dir);

#endif
