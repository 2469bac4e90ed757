/* SPDX-License-Identifier: MIT
 * The metric table: every number a results directory holds about a cell (its .meta, its
 * cells.csv row, its summary.csv rows), one row each, with its unit, its better direction,
 * how a cell's value is aggregated, how a summary row's value is read from a stream's
 * result, the cross-machine bands `check` gates it with, its report group and a one-line
 * definition. The results writer, the tables, check's gateable set, the report's column
 * groups and `fadkv-bench metrics` (the reference in docs/RESULTS.md) all read it.
 *
 * Adding a metric: an observer (engine/fk_observe.c) that fills fields of struct
 * fk_stream_result, and one row of fk_metrics[] (fk_metrics.c) with its row getter; a cell
 * value that is the mean of the rows over every stream needs nothing more (FK_AGG_STREAMS).
 */
#ifndef FK_METRICS_H
#define FK_METRICS_H

#include <stddef.h>

#include "core/fk_codec.h"
#include "engine/fk_replay.h"

struct fk_cell_loop;

/* A tolerance band: |result - baseline| <= atol + rtol * |baseline|. */
struct fk_band {
    double rtol, atol;
};

/* What a summary row's getter reads: one (trace, layer, kind) stream. */
struct fk_metric_row {
    const struct fk_stream_result *s;
    const struct fk_attn_acc *a;     /* the (trace, layer)'s attention */
    const double *loop;              /* [5] its closed-loop values (fk_results_loop_layer) */
    int dict;                        /* the codec reads a dictionary (FK_CAP_DICT) */
};

enum fk_metric_agg {
    FK_AGG_NONE = 0,   /* no cell value: a summary.csv column only */
    FK_AGG_STREAMS,    /* the mean of the row value over every stream of the cell (NaN left
                        * out; streams in kind, layer, trace order) */
    FK_AGG_CELL,       /* the store's own aggregation of the cell (fk_metrics.c) */
    FK_AGG_LOOP,       /* the closed loop's (model datasets; empty otherwise) */
    FK_AGG_TABLE,      /* cells.csv only: from the cell's other values and its cost reference
                        * cell (the tables writer, store/fk_results.c) */
};

enum fk_metric_flag {
    FK_MF_META_ONLY = 1u << 0, /* in the .meta, not a cells.csv column */
    FK_MF_GATE = 1u << 1,      /* `check` may gate its summary rows */
    FK_MF_TIMING = 1u << 2,    /* a measured time: differs run to run (%.6g) */
    FK_MF_INT = 1u << 3,       /* a count, written without decimals */
};

struct fk_metric {
    const char *name;            /* column and .meta key */
    const char *unit;            /* "" when dimensionless */
    const char *group;           /* one of fk_metric_groups[] */
    int better;                  /* -1 lower is better, +1 higher, 0 neither */
    enum fk_metric_agg agg;
    size_t cell;                 /* FK_AGG_CELL: offset in the aggregation's record;
                                  * FK_AGG_LOOP: index of fk_results_loop_head's values */
    double (*row)(const struct fk_metric_row *r); /* its summary.csv value, or NULL */
    unsigned flags;              /* enum fk_metric_flag */
    struct fk_band band_agg;     /* FK_MF_GATE: a cell's mean over its rows of one kind */
    struct fk_band band_row;     /* FK_MF_GATE: one row */
    const char *def;             /* one line */
};

extern const struct fk_metric fk_metrics[]; /* {NULL}-terminated, in column order */
/* The groups, in the order the report and the reference show them ({NULL}-terminated):
 * every metric's group is one of them. */
extern const char *const fk_metric_groups[];
int fk_metric_count(void);
const struct fk_metric *fk_metric_find(const char *name);

/* The cell value of every metric (v[fk_metric_count()], table order; NaN where a metric
 * has none, FK_AGG_TABLE ones included): the aggregation of r, the closed loop, and NaN
 * for what the codec's family does not define (a dictionary's counters without one, ...).
 * FK_ENOMEM. */
int fk_metrics_cell(const struct fk_cell_result *r, const struct fk_cell_loop *loop,
                    const struct fk_codec_ops *ops, const void *opts, double *v);

#endif
