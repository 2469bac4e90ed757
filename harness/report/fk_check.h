/* SPDX-License-Identifier: MIT
 * The regression gate: compares rel_err_mean and attn_kl of every summary.csv row (cell x
 * trace x layer x kind) of a results directory with a committed baseline CSV.
 *
 * Rows are matched by a key that does not involve the cell id (which changes with the
 * harness version): codec, dataset name, the options that differ from the codec's defaults
 * (sorted by name, "k=v;k=v", or "default"), an occurrence number (0 unless the sweep
 * repeats the same configuration), trace file name, layer and kind. Baseline columns:
 *   codec,dataset,options,occurrence,trace,layer,kind,rel_err_mean,attn_kl
 * A value drifts when |result - baseline| > atol + rtol * |baseline|, or exactly one is NaN.
 * The gate fails on a drift or a baseline row missing from the results; extra result rows
 * are reported and pass.
 */
#ifndef FK_CHECK_H
#define FK_CHECK_H

#define FK_CHECK_N_METRICS 2
extern const char *const fk_check_metrics[FK_CHECK_N_METRICS]; /* rel_err_mean, attn_kl */

struct fk_check_opts {
    const char *baseline;        /* baseline CSV */
    const char *results;         /* results directory */
    double rtol, atol;           /* tolerances (>= 0) */
    int update;                  /* 1: rewrite the baseline from the results instead */
};

enum fk_check_kind { FK_CHECK_MISSING, FK_CHECK_EXTRA, FK_CHECK_DRIFT };

/* One finding, in key order. */
struct fk_check_diff {
    enum fk_check_kind kind;
    const char *key;             /* codec,dataset,options,occurrence,trace,layer,kind */
    int metric;                  /* DRIFT: index into fk_check_metrics */
    double baseline, result;     /* DRIFT: the two values */
};

struct fk_check_result {
    int matched;                 /* rows in both */
    int drift;                   /* values beyond the tolerance */
    int missing;                 /* baseline rows not in the results */
    int extra;                   /* result rows not in the baseline */
    int written;                 /* update: rows written */
    int fail;                    /* 1: regression (drift or missing) */
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
