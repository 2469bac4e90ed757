/* SPDX-License-Identifier: MIT
 * The regression gate: compares metrics of every summary.csv row (cell x trace x layer x
 * kind) of a results directory with a committed baseline CSV.
 *
 * Rows are matched by a key that does not involve the cell id (which changes with the
 * harness version): codec, dataset name, the options that differ from the codec's defaults
 * (sorted by name, "k=v;k=v", or "default"), an occurrence number (0 unless the sweep
 * repeats the same configuration), trace file name, layer and kind. Baseline columns:
 *   codec,dataset,options,occurrence,trace,layer,kind,METRIC...
 * The gated metrics are the ones asked for (--metrics), else every metric column of the
 * baseline; a baseline is recorded with the asked metrics, else rel_err_mean and attn_kl.
 * Any per-row metric of summary.csv but cpu_s can be gated (fk_check_gateable): errors,
 * attention (cos, KL, relative error, top-k overlaps, mass), bytes, dictionary counters.
 * A value drifts when |result - baseline| > atol + rtol * |baseline|, or exactly one is NaN.
 * With worse_only, a drift in the better direction of a metric that has one (lower errors,
 * KL and bytes; higher cosine, overlaps and recall) is reported as an improvement and passes.
 * The gate fails on a drift or a baseline row missing from the results; extra result rows
 * are reported and pass.
 */
#ifndef FK_CHECK_H
#define FK_CHECK_H

#define FK_CHECK_N_METRICS 2
extern const char *const fk_check_metrics[FK_CHECK_N_METRICS]; /* the default pair */
#define FK_CHECK_MAX_METRICS 32

/* The gateable metrics, NULL-terminated, and each one's better direction: -1 lower is
 * better, +1 higher is better, 0 neither (always two-sided). */
extern const struct fk_check_metric {
    const char *name;
    int better;
} fk_check_gateable[];

struct fk_check_opts {
    const char *baseline;        /* baseline CSV */
    const char *results;         /* results directory */
    double rtol, atol;           /* tolerances (>= 0) */
    int update;                  /* 1: rewrite the baseline from the results instead */
    const char *const *metrics;  /* [n_metrics] metrics to gate or record; NULL: see above */
    int n_metrics;
    int worse_only;              /* 1: drifts for the better pass (as improvements) */
};

enum fk_check_kind { FK_CHECK_MISSING, FK_CHECK_EXTRA, FK_CHECK_DRIFT, FK_CHECK_IMPROVED };

/* One finding, in key order. */
struct fk_check_diff {
    enum fk_check_kind kind;
    const char *key;             /* codec,dataset,options,occurrence,trace,layer,kind */
    int metric;                  /* DRIFT, IMPROVED: index into fk_check_result.metric */
    double baseline, result;     /* DRIFT, IMPROVED: the two values */
};

struct fk_check_result {
    int matched;                 /* rows in both */
    int drift;                   /* values beyond the tolerance (worse, with worse_only) */
    int improved;                /* worse_only: values beyond the tolerance, for the better */
    int missing;                 /* baseline rows not in the results */
    int extra;                   /* result rows not in the baseline */
    int written;                 /* update: rows written */
    int fail;                    /* 1: regression (drift or missing) */
    const char *metric[FK_CHECK_MAX_METRICS]; /* [n_metrics] the metrics gated or written */
    int n_metrics;
    struct fk_check_diff *diffs; /* [n_diffs] every finding, key order */
    int n_diffs;
    void *owned;                 /* the row tables the keys point into */
};

/* Runs the gate (or the update). FK_EIO / FK_ECORRUPT / FK_ENOMEM on unreadable or
 * malformed inputs (a results key present twice is FK_ECORRUPT); the verdict is in r.
 * Free r with fk_check_result_free. */
int fk_check_run(const struct fk_check_opts *o, struct fk_check_result *r);
void fk_check_result_free(struct fk_check_result *r);

#endif
