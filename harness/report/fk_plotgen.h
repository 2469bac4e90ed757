/* SPDX-License-Identifier: MIT
 * General figures of a results directory: any metric against any swept option, one line per
 * value of another option (or per codec), and a heatmap of a metric over any two swept
 * options (`fadkv-bench plot RESULTS --x OPTION --y METRIC [--by OPTION]` and `--heatmap
 * X,Y --z METRIC`). Like fk_plotdata.c it recomputes no metric: it selects cells, averages
 * over repeats and sequences, and adds an interval only where there are enough sequences.
 *
 * Aggregation. A metric of summary.csv (one row per cell x trace x layer x kind) gives one
 * value per sequence: the mean over its layers and K/V rows, then the mean over the repeats
 * of the same setting (a repeat is not an independent sequence: deterministic codecs repeat
 * exactly). A point is the mean over sequences, with the 95% percentile bootstrap interval
 * over sequences (fk_boot_mean_ci) when it has FK_CI_MIN_SEQ or more sequences; with fewer
 * the individual sequences are drawn as points and no interval. A metric only in cells.csv
 * has one value per cell: the point is the mean over repeats, with no interval.
 */
#ifndef FK_PLOTGEN_H
#define FK_PLOTGEN_H

#include <stddef.h>

#include "report/fk_plotdata.h"

struct fk_plot_general {
    const char *x;               /* option on the x axis (line plot), or NULL */
    const char *y;               /* metric: y of the line plot, z of the heatmap */
    const char *by;              /* option, "codec" or "dataset": one line per value (NULL:
                                  * per codec) */
    const char *heat_x, *heat_y; /* heatmap options (both set: a heatmap, x and by unused) */
    const char *dataset;         /* only cells of this dataset (NULL: all) */
    const char *codec;           /* only cells of this codec (NULL: all) */
    const char *const *where;    /* [n_where] "OPTION=VALUE": only cells with that value */
    int n_where;
    const struct fk_plot_titles *titles; /* display names of codecs (NULL: their names) */
};

struct fk_plot_gen_out {
    char script[64];             /* gnuplot script in plots/ ("general.gp", "heatmap_general.gp") */
    char vars[16384];            /* gnuplot -e assignments, ';'-ended (data files included) */
    char what[512];              /* one line: what is drawn (cells, lines, points) */
};

/* Writes the data files data_stem.dat (and data_stem.seq.dat for a line plot) from results
 * directory dir and fills out. FK_EINVAL naming the option or metric (and listing the valid
 * ones) when the request does not fit the results: an unknown option or metric, an x option
 * with one value, a heatmap whose options do not both vary, several settings per heatmap
 * square. */
int fk_plot_general(const char *dir, const char *data_stem, const struct fk_plot_general *g,
                    struct fk_plot_gen_out *out);

/* 1 when path holds a whole figure of format fmt ("png": the signature and the closing
 * IEND chunk; "pdf": the %PDF- header and %%EOF near the end; "svg": </svg> near the end),
 * forced to disk (fsync: a full disk shows here, not later). Else 0 with why (cap bytes)
 * saying what is wrong. */
int fk_plot_file_whole(const char *path, const char *fmt, char *why, size_t cap);

#endif
