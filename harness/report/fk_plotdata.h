/* SPDX-License-Identifier: MIT
 * Figure data export: reads a results directory through the store (cells.csv,
 * summary.csv, cells/<id>.h5; see store/fk_results.h) and writes the plain whitespace-separated data files that
 * the gnuplot scripts in plots/ draw, plus Table 4 and the equal-budget table (best setting
 * of each codec at about 1, 2, 3 and 4 bits per element) as Markdown and LaTeX. Nothing here
 * recomputes a metric: it selects cells, averages per-sequence values over sequences and
 * adds 95% bootstrap intervals over sequences. plots/README.md lists every figure.
 *
 * The code names no codec: the line styles follow the registry order, display names come
 * from plots/common.gp (fk_plot_titles_load), the cost baseline from the caller or from
 * the tables, and figures about one kind of codec select it by capability or options.
 */
#ifndef FK_PLOTDATA_H
#define FK_PLOTDATA_H

#include <stddef.h>

#include "store/fk_csv.h"    /* the tables' reader, shared with check */

/* ---- bootstrap ------------------------------------------------------------------------- */

#define FK_BOOT_RESAMPLES 2000   /* resamples of the 95% intervals */
#define FK_BOOT_SEED 20250101UL  /* gsl_rng_mt19937 seed: the intervals are reproducible */
#define FK_CI_MIN_SEQ 5          /* sequences a 95% interval needs: with fewer, figures draw
                                  * the sequences themselves and tables print no +- */

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
    char caption[600];           /* what it shows and which paper figure it reproduces
                                  * (fk_plot_catalogue), for the report */
};

/* The figure catalogue: every figure `plot` can draw, one row each, in drawing order.
 * Adding a figure: a row, its exporter (report/fk_plotdata.c) and its gnuplot script. */
enum fk_plot_scope { FK_SCOPE_DATASET, FK_SCOPE_CODEC };
struct fk_plot_store;            /* the results as the exporters read them */
struct fk_plot_set;
struct fk_plot_kind {
    const char *stem;            /* file stem and gnuplot script (plots/STEM.gp) */
    enum fk_plot_scope scope;    /* one figure per dataset (suffix .DATASET with several), or
                                  * per codec with the right cells */
    const char *needs;           /* the cells it needs (else it is skipped with a note) */
    const char *caption;         /* what it shows; the paper figure it reproduces */
    /* Writes its data for dataset ds (NULL for FK_SCOPE_CODEC: every codec) and adds the
     * figure (or its skip note) to set; arg: the row's. NULL: another row's exporter draws
     * it. */
    int (*export)(struct fk_plot_store *st, struct fk_plot_set *set, const char *ds,
                  const void *arg);
    const void *arg;
};
extern const struct fk_plot_kind fk_plot_catalogue[]; /* {NULL}-terminated */
/* The catalogue row of a figure stem, or NULL. */
const struct fk_plot_kind *fk_plot_kind_of(const char *stem);

struct fk_plot_set {
    struct fk_plot_fig *figs;    /* [n_figs] in drawing order */
    int n_figs;                  /* figures, drawn and skipped */
    int cap;                     /* allocated entries */
    char table_md[4200];         /* path of Table 4 as Markdown ("" if not written) */
    char table_tex[4200];        /* path of Table 4 as LaTeX ("" if not written) */
    char budget_md[4200];        /* path of the equal-budget table as Markdown ("" if not) */
    char budget_tex[4200];       /* path of the equal-budget table as LaTeX ("" if not) */
    char budget_note[512];       /* why the equal-budget table is not written ("" if it is) */
    int n_cells;                 /* finished (status ok) cells read */
    int n_datasets;              /* datasets seen */
};

#define FK_PLOT_MAX_TITLES 64

/* Display names of codecs ("Full KV" for the codec named full, ...). */
struct fk_plot_titles {
    char name[FK_PLOT_MAX_TITLES][64];  /* codec names */
    char title[FK_PLOT_MAX_TITLES][64]; /* their display names */
    int n;                       /* entries */
};

/* Reads the ctitle(c) definition of a gnuplot script (plots/common.gp), so figures and
 * tables name codecs as the plots do: FK_EIO, FK_ECORRUPT when there is none. */
int fk_plot_titles_load(const char *gp_path, struct fk_plot_titles *t);

#define FK_PLOT_MAX_BUDGETS 8

struct fk_plot_opts {
    const struct fk_plot_titles *titles; /* display names; NULL: codec names */
    const char *cost_baseline;   /* codec of Table 4's cost columns; NULL: the one cells.csv
                                  * was computed with (fk_store_cost_baseline), else
                                  * default_cost_baseline */
    const char *default_cost_baseline; /* when the tables show none (no baseline cell) */
    double budgets[FK_PLOT_MAX_BUDGETS]; /* the equal-budget table's budgets, bits per
                                  * element, ascending; n_budgets 0: from each dataset's
                                  * cells (every codec's smallest bits_per_elem, rounded up) */
    int n_budgets;
    const char *budgets_from;    /* where they come from, in words ("--budgets") */
};

/* "2,5,8" into budgets (ascending, distinct, each > 0 and <= 64; at most
 * FK_PLOT_MAX_BUDGETS). FK_EINVAL naming the bad item. */
int fk_plot_budgets_parse(const char *text, double *budgets, int *n);

/* Writes every figure's data file into out_dir/data (created if needed), Table 4 into
 * out_dir/table4.md and out_dir/table4.tex and the equal-budget table into
 * out_dir/table_budget.md and out_dir/table_budget.tex, and fills set with the figures to
 * draw and the ones skipped (with a note). opts may be NULL. */
int fk_plotdata_export(const char *results_dir, const char *out_dir,
                       const struct fk_plot_opts *opts, struct fk_plot_set *set);
void fk_plotdata_free(struct fk_plot_set *set);

#define FK_PLOT_STYLES 16        /* line styles of plots/common.gp (the last: other codecs) */

/* Fixed style index of a codec: its registry position (1-based, the order of
 * plots/common.gp cstyle), FK_PLOT_STYLES for codecs past it or unknown: the same colour
 * and marker in every figure. */
int fk_plot_codec_style(const char *codec);

#endif
