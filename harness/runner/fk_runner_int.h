/* SPDX-License-Identifier: MIT
 * The runner's own state, shared by its files (internal to harness/runner): fk_runner.c
 * schedules cells and runs them in this process, fk_runner_worker.c in worker processes.
 */
#ifndef FK_RUNNER_INT_H
#define FK_RUNNER_INT_H

#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

#include "engine/fk_replay.h"
#include "runner/fk_runner.h"

struct fk_trace;
struct fk_dict;
struct fk_basis_file;
struct fk_calib_file;
struct fk_loop_set;
struct fk_cell_meta;
struct fk_cell_loop;
struct run;
struct fk_worker;

/* Opened traces, dictionary, basis and calibration of one dataset. */
struct loaded {
    struct fk_trace **traces;
    struct fk_dict *dict;
    struct fk_basis_file *basis;
    struct fk_calib_file *calib; /* the dataset's calibration (codecs with FK_CAP_CALIB) */
    struct fk_trace **recon;     /* [n_traces] reconstruction files (codec external) or NULL */
    struct fk_loop_set *loop;    /* model dataset: the model and its exact decodes, or NULL */
    struct fk_head_pattern *heads; /* the dataset's head_pattern, or NULL */
};

/* A cell in flight: when the sweep's jobs outnumber what one cell can use, cells run side by
 * side, each in a lane (a thread) of its own with its own Gram buffer pool. */
struct lane {
    struct run *r;
    const struct fk_sweep_cell *cell;
    int index, jobs;             /* 1-based start order among the cells to run; its workers */
    double t_cell, est_cell, frac; /* start, cost-model weight, fraction of units done */
    double bytes;                /* estimated footprint (cell_bytes) */
    struct fk_replay_pool *pool; /* Gram buffers from cell to cell (optional) */
    const struct fk_cell_loop *loop; /* the cell's closed-loop results (model datasets) */
    struct fk_worker *w;         /* isolation: the lane's worker process, or NULL */
};

/* The state of one run. */
struct run {
    const struct fk_sweep *s;
    const struct fk_runner_opts *o;
    struct loaded *ld;           /* [n_datasets] */
    const char **ids;            /* [n_cells] cell ids, for the tables */
    struct fk_runner_summary *sum;
    int prepared;                /* the results directory exists and holds provenance */
    double t_start;
    double est_total, est_done;  /* cost-model weights: all cells to run, finished ones */
    int *shard;                  /* [n_cells] fk_runner_shards */
    uint8_t *left;               /* [n_cells] recorded as crashed or timed out: not retried */
    /* the scheduler of cells (fk_runner_run); mu guards it, the summary and the hooks */
    pthread_mutex_t mu, store_mu; /* store_mu: one commit and table rewrite at a time */
    pthread_cond_t cv;
    int *order, n_order, next;   /* cells of this shard in the order they are taken */
    double est_left;             /* weight of the cells not taken yet */
    int free_jobs, started;      /* workers not in use; cells started */
    double mem_budget, mem_used; /* bytes for the cells in flight, and their estimates */
    struct lane *lanes;          /* [n_lanes] */
    int n_lanes;
    int rc;                      /* first error of a lane (its message in errmsg) */
    char errmsg[1100];
    double tables_at, tables_s;  /* when the tables were last rewritten, and how long it took */
    int worker;                  /* a worker process (isolation): its run wrote the data */
};


/* Progress of lane ln's cell (under r->mu): the progress hook. */
void fk_run_on_unit(void *ctx, int done, int total, long vectors);
/* A cell's end: the summary's counts and the cell_end hook (under r->mu). */
void fk_run_report_end(struct run *r, struct lane *ln, struct fk_runner_cell_end *e);
/* Records lane ln's cell as failed (status, message) and reports it; under store_mu. */
int fk_run_commit_failed(struct lane *ln, const char *status, const char *msg,
                         struct fk_runner_cell_end *e);
/* Rewrites the tables when asked (now) or when the last rewrite is old enough; store_mu. */
int fk_run_tables(struct run *r, int now);
/* The start of lane ln's cell: its index, clock, weight and the cell_start hook. */
void fk_run_cell_begin(struct lane *ln);
/* Replays lane ln's cell in this process (and the closed loop of a model dataset). */
int fk_run_replay_here(struct lane *ln, volatile sig_atomic_t *stop,
                       void (*progress)(void *, int, int, long), void *progress_ctx,
                       struct fk_cell_result *res, struct fk_cell_loop *loop);
/* The metadata a cell's files record. */
void fk_run_cell_meta(const struct run *r, const struct fk_sweep_cell *cell,
                      const struct fk_cell_loop *loop, struct fk_cell_meta *meta);
/* Opens what cell needs of its dataset (once per dataset). */
int fk_run_load_dataset(struct run *r, const struct fk_sweep_cell *cell);
void fk_run_free_loaded(struct run *r);
/* Runs lane ln's cell (claimed) in the lane's worker process and records what became of
 * it (fk_runner_worker.c). */
int fk_run_cell_isolated(struct lane *ln);
/* Ends lane ln's worker process, if it has one. */
void fk_run_worker_stop(struct lane *ln);

#endif
