/* SPDX-License-Identifier: MIT
 * The sweep runner: runs the cells of a resolved sweep into its results directory.
 *
 * It owns what a run of `fadkv-bench --config` does between parsing and printing: shard
 * selection (cell c belongs to shard c mod N), resume (a cell the store holds as finished
 * is skipped unless `force`), dataset loading (every trace and dictionary a selected cell
 * needs is opened before the results directory is touched, so a damaged file fails the run
 * and leaves earlier results as they were), provenance, one replay per cell, the atomic
 * commit of each cell and the tables after it, and progress with an estimate of the time
 * left from the cost model. It prints nothing: the caller sees the run through hooks.
 */
#ifndef FK_RUNNER_H
#define FK_RUNNER_H

#include <signal.h>

#include "engine/fk_sweep.h"

/* Progress inside a cell (after each unit: one layer of every trace). */
struct fk_runner_progress {
    const struct fk_sweep_cell *cell;
    int index, todo;             /* 1-based index among the cells to run, and their count */
    int units_done, units_total;
    double vec_per_s;            /* vectors coded per second in this cell so far */
    double eta_s;                /* estimated seconds left in the run (NaN: unknown) */
    int running;                 /* cells in flight, this one included (side by side: > 1) */
    double mem_in_flight;        /* their estimated footprints, bytes ... */
    double mem_budget;           /* ... which fit this unless one runs alone */
};

/* The outcome of one cell. */
struct fk_runner_cell_end {
    const struct fk_sweep_cell *cell;
    int index, todo;
    int failed;                  /* 1: the replay failed; error holds its message */
    const char *error;
    double wall_s;               /* the cell's wall time */
    long vectors;                /* vectors coded */
    double rel_err;              /* rel_err_mean as committed (NaN if unknown) */
    double eta_s;                /* estimated seconds left in the run (NaN: unknown) */
    int running;                 /* cells in flight, this one included (side by side: > 1) */
};

/* Every hook is called by one thread at a time (cells may run side by side, see
 * fk_runner_run); every hook is optional; ctx is passed back to each. */
struct fk_runner_hooks {
    void *ctx;
    /* before the first cell: cells in the sweep, cells to run (this shard, not done) */
    void (*start)(void *ctx, const struct fk_sweep *s, int todo);
    void (*cell_start)(void *ctx, const struct fk_sweep *s, const struct fk_sweep_cell *c,
                       int index, int todo);
    void (*progress)(void *ctx, const struct fk_runner_progress *p);
    void (*cell_end)(void *ctx, const struct fk_sweep *s, const struct fk_runner_cell_end *e);
    /* before the first cell, for each selected cell recorded as finished whose files do not
     * match their record (why names the file): it is recomputed */
    void (*damaged)(void *ctx, const struct fk_sweep_cell *c, const char *why);
    /* a cell left alone because another live run holds its claim ("host pid N") */
    void (*claimed)(void *ctx, const struct fk_sweep_cell *c, const char *holder);
    /* before the first cell: what loading the data noticed but accepts (once each) */
    void (*warn)(void *ctx, const char *msg);
};

struct fk_runner_opts {
    int force;                   /* recompute finished cells (and failed ones) */
    int retry_failed;            /* rerun cells recorded as crashed or timed out (skipped
                                  * otherwise: a crash is a result, not a hiccup) */
    int shard_i, shard_n;        /* run the cells of shard shard_i of shard_n (fk_runner_shards;
                                  * shard_n 0 or 1: all) */
    volatile sig_atomic_t *stop; /* set by a signal handler: stop within a decode step */
    struct fk_runner_hooks hooks;
    /* Isolation: child_argv (NULL-terminated) starts a worker process for each lane, with
     * "--content-hash H" for each dataset (the sweep's content_hash) and "--worker" appended
     * (the CLI gives its own command line, whose worker runs fk_runner_worker): a cell whose
     * process crashes, aborts or runs past cell_timeout seconds (0: no limit) is recorded as
     * failed ("crashed", "timeout") and the other cells go on. NULL: every cell runs in this
     * process. */
    const char *const *child_argv;
    double cell_timeout;
};

struct fk_runner_summary {
    int todo;                    /* cells selected to run */
    int done, failed, skipped;   /* finished now, failed now, already finished before */
    int damaged;                 /* of the cells to run, found damaged (recomputed) */
    int elsewhere;               /* left to other runs that held their claims */
    int not_retried;             /* recorded as crashed or timed out, left (retry_failed) */
    int interrupted;             /* 1: *stop was set; finished cells are kept */
    double wall_s;
};

/* The shard of every cell when the sweep is split in n_shards (shard[n_cells]): balanced by
 * each cell's estimated cost (its coding multiply-adds plus a per-vector cost for reading,
 * metrics and attention), largest first to the least loaded shard, ties to the lower cell
 * index and shard: every process of a job array computes the same split. FK_ENOMEM. */
int fk_runner_shards(const struct fk_sweep *s, int n_shards, int *shard);

/* Runs the selected cells. With more jobs than one cell at a time can use, cells run side
 * by side: min(jobs, cells) lanes take cells heaviest first (by the cost model), each cell
 * with a share of the free workers proportional to its share of the weight left (at least
 * one, at most its layers), while the estimated footprints of the cells in flight fit the
 * memory budget ([sweep] mem_limit, else half the RAM; a cell over it runs alone). One lane
 * (jobs 1, or one cell) runs the cells in configured order with every worker, as before.
 * Results do not depend on any of this. Returns FK_OK when every cell was run or skipped (failed cells
 * are counted in sum->failed, not returned) or the run was interrupted; an error (with
 * fk_err's message) when a dataset cannot be read or the results cannot be written. */
int fk_runner_run(const struct fk_sweep *s, const struct fk_runner_opts *o,
                  struct fk_runner_summary *sum);

/* A worker process of isolation (child_argv + --worker): runs the cells named on in_fd,
 * one command line each ("RUN <cell id> <workers>"), until in_fd ends, keeping the datasets
 * loaded from cell to cell; commits each cell's files (not the tables) and reports on out_fd
 * (fk_runner_worker.c says how). Returns FK_OK at the end of the commands, or an error (an
 * unknown command). */
int fk_runner_worker(const struct fk_sweep *s, int in_fd, int out_fd,
                     volatile sig_atomic_t *stop);

#endif
