/* SPDX-License-Identifier: MIT
 * The regression gate: compares metrics of a results directory with a committed baseline
 * CSV, at two levels:
 *   rows        every summary.csv row (cell x trace x layer x kind), and
 *   aggregates  per cell and kind, the mean of each metric over the cell's rows of that
 *               kind (every trace and layer; NaN rows left out): trace and layer are "*".
 * An aggregate is stable across machines where a single row is not: a greedy coder turns a
 * last-bit difference of another BLAS or kernel set into another atom now and then, which
 * moves a mean over a handful of vectors by percents and the mean over a cell by far less
 * (docs/PORTABILITY.md has the measured spread).
 *
 * Rows are matched by a key that does not involve the cell id (which changes with the
 * harness version): codec, dataset name, the options that differ from the codec's defaults
 * (sorted by name, "k=v;k=v", or "default"), an occurrence number (0 unless the sweep
 * repeats the same configuration), trace file name, layer and kind. Baseline columns:
 *   codec,dataset,options,occurrence,trace,layer,kind,METRIC...
 * The gated metrics are the ones asked for (--metrics), else every metric column of the
 * baseline; a baseline is recorded with the asked metrics, else fk_check_metrics. A
 * baseline value is a finite number, or "nan" where the metric has no value (the result
 * must have none either).
 *
 * Tolerances. A value drifts when |result - baseline| > atol + rtol * |baseline|, or
 * exactly one is NaN. The band (rtol, atol) is, by tolerance mode:
 *   PORTABLE  the metric's cross-machine band at the row's level (the metric table,
 *             store/fk_metrics.h: the metrics flagged FK_MF_GATE are gateable): what
 *             another CPU, kernel set, BLAS or compiler moves it by, measured, with margin;
 *   EXACT     0: the same build on the same machine;
 *   CUSTOM    the given rtol and atol, for every metric and level.
 * Every drift says whether it also lies beyond the cross-machine band. With worse_only, a
 * drift in the better direction of a metric that has one (lower errors, KL and bytes;
 * higher cosine, overlaps and recall) is reported as an improvement and passes. The gate
 * fails on a drift or a baseline row missing from the results; extra result rows are
 * reported and pass, unless strict.
 */
#ifndef FK_CHECK_H
#define FK_CHECK_H

#include "store/fk_metrics.h"

#define FK_CHECK_N_METRICS 3
extern const char *const fk_check_metrics[FK_CHECK_N_METRICS]; /* recorded by default */
#define FK_CHECK_MAX_METRICS 32

/* What fk_check_run returns when the gate cannot judge: no row was compared, no metric is
 * gated, or a baseline value is not a finite number (nor "nan"). */
#define FK_CHECK_UNJUDGED (-100)

enum fk_check_tol { FK_CHECK_PORTABLE = 0, FK_CHECK_EXACT, FK_CHECK_CUSTOM };

struct fk_check_opts {
    const char *baseline;        /* baseline CSV */
    const char *results;         /* results directory */
    enum fk_check_tol tol;       /* which bands (see above) */
    double rtol, atol;           /* CUSTOM: the band of every metric and level (>= 0) */
    int update;                  /* 1: rewrite the baseline from the results instead */
    const char *const *metrics;  /* [n_metrics] metrics to gate or record; NULL: see above */
    int n_metrics;
    int worse_only;              /* 1: drifts for the better pass (as improvements) */
    int strict;                  /* 1: result rows the baseline lacks fail too */
};

enum fk_check_kind { FK_CHECK_MISSING, FK_CHECK_EXTRA, FK_CHECK_DRIFT, FK_CHECK_IMPROVED };

/* One finding, in key order. */
struct fk_check_diff {
    enum fk_check_kind kind;
    const char *key;             /* codec,dataset,options,occurrence,trace,layer,kind */
    int metric;                  /* DRIFT, IMPROVED: index into fk_check_result.metric */
    double baseline, result;     /* DRIFT, IMPROVED: the two values */
    int aggregate;               /* an aggregate row (trace and layer "*") */
    int beyond_band;             /* DRIFT, IMPROVED: also beyond the cross-machine band */
};

/* The largest drift of one metric at one level, relative to its cross-machine band. */
struct fk_check_extreme {
    double rel;                  /* max |result - baseline| / max(|baseline|, tiny) */
    double band_use;             /* max |result - baseline| / (atol + rtol |baseline|) */
};

struct fk_check_result {
    int matched;                 /* rows in both (rows and aggregates) */
    int matched_agg;             /* of which aggregates */
    int drift;                   /* values beyond the tolerance (worse, with worse_only) */
    int beyond_band;             /* of which also beyond the cross-machine band */
    int improved;                /* worse_only: values beyond the tolerance, for the better */
    int missing;                 /* baseline rows not in the results */
    int extra;                   /* result rows not in the baseline */
    int written;                 /* update: rows written */
    int fail;                    /* 1: regression (drift, missing, or extra under strict) */
    const char *metric[FK_CHECK_MAX_METRICS]; /* [n_metrics] the metrics gated or written */
    int n_metrics;
    struct fk_check_extreme extreme[FK_CHECK_MAX_METRICS][2]; /* [metric][0 agg, 1 row] */
    struct fk_check_diff *diffs; /* [n_diffs] every finding, key order */
    int n_diffs;
    void *owned;                 /* the row tables the keys point into */
};

/* The cross-machine band of a gateable metric at a level (aggregate or row); NULL when the
 * metric is not gateable. */
const struct fk_band *fk_check_band_of(const char *metric, int aggregate);

/* Runs the gate (or the update). FK_EINVAL on bad options, FK_EIO / FK_ECORRUPT /
 * FK_ENOMEM on unreadable or malformed inputs (a results key present twice is
 * FK_ECORRUPT), FK_CHECK_UNJUDGED when the gate cannot judge (see above); the verdict is
 * in r. Free r with fk_check_result_free. */
int fk_check_run(const struct fk_check_opts *o, struct fk_check_result *r);
void fk_check_result_free(struct fk_check_result *r);

#endif
