/* SPDX-License-Identifier: MIT
 * Figure data export: reads a results directory (cells.csv, summary.csv, cells/<id>.h5,
 * resolved.txt; see fk_results.h) and writes the plain whitespace-separated data files that
 * the gnuplot scripts in plots/ draw, plus Table 4 as Markdown and LaTeX. Nothing here
 * recomputes a metric: it selects cells, averages per-sequence values over sequences and
 * adds 95% bootstrap intervals over sequences. plots/README.md lists every figure.
 *
 * Also the small CSV reader shared by `plot`, `check` and `merge`.
 */
#ifndef FK_PLOTDATA_H
#define FK_PLOTDATA_H

#include <stddef.h>

/* ---- CSV (RFC 4180 quoting, first line = header) ---------------------------------------- */

struct fk_csv {
    char **head;                 /* [n_cols] column names */
    int n_cols;                  /* columns */
    char ***rows;                /* [n_rows][n_cols] fields ("" when a row is short) */
    int n_rows;                  /* data rows (header excluded) */
};

/* Loads a CSV file; FK_EIO if unreadable, FK_ECORRUPT naming path:line on bad quoting. */
int fk_csv_load(const char *path, struct fk_csv *out);
void fk_csv_free(struct fk_csv *c);
/* Column index of name, or -1. */
int fk_csv_col(const struct fk_csv *c, const char *name);
/* Field as a number (NaN when empty, "nan" or not a number). */
double fk_csv_num(const struct fk_csv *c, int row, int col);

/* ---- bootstrap ------------------------------------------------------------------------- */

#define FK_BOOT_RESAMPLES 2000   /* resamples of the 95% intervals */
#define FK_BOOT_SEED 20250101UL  /* gsl_rng_mt19937 seed: the intervals are reproducible */

/* Mean of the finite x[0..n-1] and the 2.5% / 97.5% quantiles of the means of `resamples`
 * resamples with replacement (gsl_rng_mt19937 seeded with seed). With fewer than two finite
 * values lo = hi = mean (NaN when none). */
int fk_boot_mean_ci(const double *x, int n, int resamples, unsigned long seed, double *mean,
                    double *lo, double *hi);

/* ---- figures --------------------------------------------------------------------------- */

struct fk_plot_fig {
    char name[160];              /* output stem: figure files are <name>.<png|pdf|svg> */
    char script[64];             /* gnuplot script in plots/, e.g. "fig1a_recall.gp" */
    char vars[4096];             /* gnuplot -e assignments ("data='...'; ..."), ';'-ended */
    char note[512];              /* why the figure is skipped; "" = draw it */
};

struct fk_plot_set {
    struct fk_plot_fig *figs;    /* [n_figs] in drawing order */
    int n_figs;                  /* figures, drawn and skipped */
    int cap;                     /* allocated entries */
    char table_md[4200];         /* path of Table 4 as Markdown ("" if not written) */
    char table_tex[4200];        /* path of Table 4 as LaTeX ("" if not written) */
    int n_cells;                 /* finished (status ok) cells read */
    int n_datasets;              /* datasets seen */
};

/* Writes every figure's data file into out_dir/data (created if needed) and Table 4 into
 * out_dir/table4.md and out_dir/table4.tex, and fills set with the figures to draw and the
 * ones skipped (with a note). */
int fk_plotdata_export(const char *results_dir, const char *out_dir, struct fk_plot_set *set);
void fk_plotdata_free(struct fk_plot_set *set);

/* Codec display name and fixed style index (1 full, 2 lexico, 3 lexico-adp, 4 gm, 5 pl,
 * 6 fadkv, 7 anything else): the same colour and marker in every figure. */
int fk_plot_codec_style(const char *codec);

#endif
