/* SPDX-License-Identifier: MIT
 * Figure data export (see fk_plotdata.h and plots/README.md).
 *
 * Cell choice. A figure that shows "one line per codec" uses, for each (dataset, codec), the
 * representative cell: the finished cell with the fewest options off the most common value
 * of that option among the dataset's cells, then the fewest off the codec's defaults, then
 * the first in sweep order. The Fig. 1 diagnostics (pool recall,
 * correlation profile, inactive atoms) use the representative cell of the first codec with
 * sparse codes over a dictionary (FK_CAP_SPARSE) present, static dictionaries first, then
 * exact OMP (FK_CAP_GRAM), then registry order. Fig. 3c shows the codec whose options
 * include tau_c, delta_k and delta_v. Codecs are listed in registry order, then codecs
 * unknown to this build in sweep order. Several datasets give one file per dataset (suffix
 * ".<dataset>").
 *
 * Cross-family Pareto and equal-budget table. The Pareto figures (pareto_head_cos, _kl,
 * _err) show every finished cell of a dataset at its bytes_tok_head, one series per codec
 * styled by its family (fk_codec_family), each point labelled by the options that tell the
 * codec's cells apart (label_cols); the equal-budget table picks each codec's best cell at
 * about 1, 2, 3 and 4 bits per element (budget_best). Both read only cells.csv columns.
 *
 * Aggregation. Per-sequence values come from summary.csv (one row per cell x trace x layer
 * x kind) or from cells/<id>.h5; a sequence's value is the mean over its layers (and kinds
 * where stated); the figure shows the mean over sequences with a 95% percentile bootstrap
 * interval over sequences (FK_BOOT_RESAMPLES resamples, gsl_rng_mt19937, FK_BOOT_SEED).
 */
#include "report/fk_plotdata.h"

#include <errno.h>
#include <gsl/gsl_rng.h>
#include <gsl/gsl_sort.h>
#include <gsl/gsl_statistics_double.h>
#include <hdf5.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/fk_codec.h"
#include "core/fk_registry.h"
#include "core/fk_evict.h"
#include "common/fk_err.h"
#include "formats/fk_h5.h"
#include "common/fk_str.h"
#include "store/fk_results.h"

/* ---- bootstrap ------------------------------------------------------------------------- */

int fk_boot_mean_ci(const double *x, int n, int resamples, unsigned long seed, double *mean,
                    double *lo, double *hi)
{
    double *v = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    if (!v)
        return fk_err(FK_ENOMEM, "out of memory");
    int k = 0;
    double s = 0;
    for (int i = 0; i < n; i++)
        if (isfinite(x[i])) {
            v[k++] = x[i];
            s += x[i];
        }
    *mean = k ? s / k : NAN;
    *lo = *hi = *mean;
    if (k < 2 || resamples < 2) {
        free(v);
        return FK_OK;
    }
    double *means = malloc(sizeof(double) * (size_t)resamples);
    gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
    if (!means || !r) {
        free(v);
        free(means);
        if (r)
            gsl_rng_free(r);
        return fk_err(FK_ENOMEM, "out of memory");
    }
    gsl_rng_set(r, seed);
    for (int b = 0; b < resamples; b++) {
        double t = 0;
        for (int i = 0; i < k; i++)
            t += v[gsl_rng_uniform_int(r, (unsigned long)k)];
        means[b] = t / k;
    }
    gsl_sort(means, 1, (size_t)resamples);
    *lo = gsl_stats_quantile_from_sorted_data(means, 1, (size_t)resamples, 0.025);
    *hi = gsl_stats_quantile_from_sorted_data(means, 1, (size_t)resamples, 0.975);
    gsl_rng_free(r);
    free(means);
    free(v);
    return FK_OK;
}

/* ---- a growable text buffer, written to a file at the end --------------------------------- */

static int buf_write(struct fk_sb *b, const char *path)
{
    if (b->oom) {
        free(b->s);
        memset(b, 0, sizeof *b);
        return fk_err(FK_ENOMEM, "out of memory");
    }
    int rc = fk_write_atomic(path, b->s ? b->s : "", b->n); /* whole or not at all */
    free(b->s);
    memset(b, 0, sizeof *b);
    return rc;
}

/* Writes a table as out_dir/<stem>.md and out_dir/<stem>.tex, their paths into md_path and
 * tex_path (cap bytes each); both buffers are freed on every path. */
static int table_write(struct fk_sb *md, struct fk_sb *tex, const char *out_dir,
                       const char *stem, char *md_path, char *tex_path, size_t cap)
{
    snprintf(md_path, cap, "%s/%s.md", out_dir, stem);
    snprintf(tex_path, cap, "%s/%s.tex", out_dir, stem);
    int rc = buf_write(md, md_path);
    if (rc < 0) {
        fk_sb_free(tex);
        return rc;
    }
    return buf_write(tex, tex_path);
}

/* A number for a data file: gnuplot reads "NaN" as missing. */
static void bnum(struct fk_sb *b, double v)
{
    if (isfinite(v))
        fk_sb_printf(b, " %.9g", v);
    else
        fk_sb_printf(b, " NaN");
}

/* " mean lo hi" of x[0..n-1] (finite values) for a data file: the 95% bootstrap interval
 * only with FK_CI_MIN_SEQ or more values, else lo and hi are NaN (the figure draws the
 * values themselves: seq_cols). *m receives the mean. */
static int ci_cols(struct fk_sb *b, const double *x, int n, double *m)
{
    double mean, lo, hi;
    int k = 0;
    for (int i = 0; i < n; i++)
        k += isfinite(x[i]) != 0;
    FK_TRY(fk_boot_mean_ci(x, n, FK_BOOT_RESAMPLES, FK_BOOT_SEED, &mean, &lo, &hi));
    if (k < FK_CI_MIN_SEQ)
        lo = hi = NAN;
    bnum(b, mean);
    bnum(b, lo);
    bnum(b, hi);
    if (m)
        *m = mean;
    return FK_OK;
}

/* The sequences' values x[0..n-1] as extra columns when there are too few for an interval
 * (n < FK_CI_MIN_SEQ); nothing otherwise. */
static void seq_cols(struct fk_sb *b, const double *x, int n)
{
    for (int i = 0; n < FK_CI_MIN_SEQ && i < n; i++)
        bnum(b, x[i]);
}

/* ---- the store ------------------------------------------------------------------------- */

#define MAX_TRACES 1024
#define FK_STR_(x) #x
#define FK_STR(x) FK_STR_(x)             /* a number macro as a string literal */

int fk_plot_codec_style(const char *codec)
{
    for (int i = 0; fk_codec_at(i); i++)
        if (!strcmp(fk_codec_at(i)->name, codec))
            return i + 1 < FK_PLOT_STYLES ? i + 1 : FK_PLOT_STYLES;
    return FK_PLOT_STYLES;
}

/* Registry position of a codec, or -1 when this build does not know it. */
static int registry_index(const char *codec)
{
    for (int i = 0; fk_codec_at(i); i++)
        if (!strcmp(fk_codec_at(i)->name, codec))
            return i;
    return -1;
}

/* Per-sequence aggregates of one cell (from summary.csv). */
struct seqv {
    char trace[256];             /* trace file name */
    double err_sum[2];           /* sum over layers of rel_err_mean, K and V */
    int err_n[2];                /* layers counted */
    double kl_sum;               /* sum over layers of attn_kl (K rows) */
    int kl_n;                    /* layers counted in kl_sum */
    double dsn_sum;              /* sum of dict_size_norm_final over streams */
    int dsn_n;                   /* streams counted in dsn_sum */
    double bytes, bytes_full;    /* bytes of the sequence (sum over streams), full KV bytes */
    double macs, vec, cpu;       /* sums: MACs, encoded + zero vectors, CPU seconds */
};

struct cell {
    int row;                     /* row in cells.csv */
    const char *id;              /* cell id */
    const char *codec;           /* "CODEC+POLICY" for a cell with an eviction policy */
    char *codec_own;             /* that name, owned (else NULL) */
    const char *dataset;
    int n_diff;                  /* rank: 1000 x options off the dataset's common values
                                  * + options off the codec's defaults */
    struct seqv *seq;            /* [n_seq] per-sequence values, summary.csv order */
    int n_seq;                   /* sequences (traces) of the cell */
    int *reps;                   /* [n_rep] cells.csv rows of its repeats (itself first), or
                                  * NULL for a single one: cells.csv values are their mean */
    int n_rep;
};

struct fk_plot_store {
    const char *dir;             /* results directory */
    const char *data_dir;        /* output directory of data files */
    struct fk_store *fs;         /* the results directory's tables */
    const struct fk_csv *cells;  /* cells.csv */
    const struct fk_csv *sum;    /* summary.csv */
    const struct fk_plot_titles *titles; /* display names (NULL: codec names) */
    const char *cost_baseline;   /* codec of Table 4's cost columns, or NULL */
    const double *budgets;       /* the equal-budget table's, or NULL: from the cells */
    int n_budgets;
    const char *budgets_from;    /* where the budgets come from, in words */
    struct cell *c;              /* [n] finished cells, sweep order */
    int n;                       /* finished cells */
    char **datasets;             /* [n_ds] dataset names, first-seen order (not owned) */
    int n_ds;                    /* datasets */
    int col_first_opt, col_end_opt; /* option columns [first, end) of cells.csv */
};

static double cnum(const struct fk_plot_store *st, const struct cell *c, const char *col)
{
    int j = fk_csv_col(st->cells, col);
    if (c->n_rep < 2)
        return fk_csv_num(st->cells, c->row, j);
    double s = 0;    /* repeats of one setting: the mean of their finite values */
    int k = 0;
    for (int i = 0; i < c->n_rep; i++) {
        double v = fk_csv_num(st->cells, c->reps[i], j);
        if (isfinite(v)) {
            s += v;
            k++;
        }
    }
    return k ? s / k : fk_csv_num(st->cells, c->row, j);
}

static const char *cstr(const struct fk_plot_store *st, const struct cell *c, const char *col)
{
    return fk_csv_str(st->cells, c->row, fk_csv_col(st->cells, col));
}

/* The name of codec's option with role `role` (enum fk_opt_role), "" when it has none. */
static const char *role_name(const char *codec, int role)
{
    const struct fk_codec_ops *ops = fk_codec_find(codec);
    const struct fk_option *o = ops ? fk_codec_role(ops, role) : NULL;
    return o ? o->name : "";
}

/* Cell c's value of its codec's option with role `role`: text ("" when none), number. */
static const char *rstr(const struct fk_plot_store *st, const struct cell *c, int role)
{
    const char *n = role_name(c->codec, role);
    return *n ? cstr(st, c, n) : "";
}

static double rnum(const struct fk_plot_store *st, const struct cell *c, int role)
{
    const char *n = role_name(c->codec, role);
    return *n ? cnum(st, c, n) : NAN;
}

static const struct fk_codec_ops *find_ops(const char *name)
{
    for (int i = 0; fk_codec_at(i); i++)
        if (!strcmp(fk_codec_at(i)->name, name))
            return fk_codec_at(i);
    return NULL;
}

static int count_nondefault(const struct fk_plot_store *st, const struct cell *c)
{
    const struct fk_codec_ops *ops = find_ops(c->codec);
    if (!ops)
        return 0;
    void *def = calloc(1, ops->opts_size);
    if (!def)
        return 0;
    fk_opts_defaults(ops, def);
    int n = 0;
    for (const struct fk_option *o = ops->options; o->name; o++) {
        char v[64];
        fk_opts_format(def, o, v, sizeof v);
        int col = fk_csv_col(st->cells, o->name);
        if (col >= 0 && strcmp(fk_csv_str(st->cells, c->row, col), v))
            n++;
    }
    free(def);
    return n;
}

/* The most common non-empty value of column j among the finished cells of dataset ds
 * (first such value in sweep order on ties), NULL when every one is empty. */
static const char *col_mode(const struct fk_plot_store *st, const char *ds, int j)
{
    const struct fk_csv *t = st->cells;
    const char *mode = NULL;
    int best = 0;
    for (int a = 0; a < st->n; a++) {
        const char *u = t->rows[st->c[a].row][j];
        if (!u[0] || strcmp(st->c[a].dataset, ds))
            continue;
        int k = 0;
        for (int b = 0; b < st->n; b++)
            k += !strcmp(st->c[b].dataset, ds) && !strcmp(t->rows[st->c[b].row][j], u);
        if (k > best) {
            best = k;
            mode = u;
        }
    }
    return mode;
}

/* Options of a cell that differ from the most common value of that option among the
 * finished cells of its dataset (first such value in sweep order on ties). */
static int count_offmode(const struct fk_plot_store *st, const struct cell *c)
{
    int n = 0;
    for (int j = st->col_first_opt; j < st->col_end_opt; j++) {
        const char *v = st->cells->rows[c->row][j];
        if (!v[0])
            continue;
        const char *mode = col_mode(st, c->dataset, j);
        n += mode && strcmp(mode, v);
    }
    return n;
}

static int load_seqs(struct fk_plot_store *st)
{
    const struct fk_csv *s = st->sum;
    int ci = fk_csv_col(s, "cell_id"), ct = fk_csv_col(s, "trace"), ck = fk_csv_col(s, "kind");
    int ce = fk_csv_col(s, "rel_err_mean"), ckl = fk_csv_col(s, "attn_kl");
    int cd = fk_csv_col(s, "dict_size_norm_final"), cb = fk_csv_col(s, "bytes");
    int cbf = fk_csv_col(s, "bytes_full"), cm = fk_csv_col(s, "macs");
    int cv = fk_csv_col(s, "n_vectors"), cz = fk_csv_col(s, "n_zero");
    int cc = fk_csv_col(s, "cpu_s");
    for (int i = 0; i < s->n_rows; i++) {
        struct cell *c = NULL;
        for (int j = 0; j < st->n && !c; j++)
            if (!strcmp(st->c[j].id, s->rows[i][ci]))
                c = &st->c[j];
        if (!c)
            continue;
        struct seqv *q = NULL;
        for (int j = 0; j < c->n_seq && !q; j++)
            if (!strcmp(c->seq[j].trace, s->rows[i][ct]))
                q = &c->seq[j];
        if (!q) {
            if (c->n_seq >= MAX_TRACES)
                continue;
            if (!c->seq) {
                c->seq = calloc(MAX_TRACES, sizeof *c->seq);
                if (!c->seq)
                    return fk_err(FK_ENOMEM, "out of memory");
            }
            q = &c->seq[c->n_seq++];
            snprintf(q->trace, sizeof q->trace, "%s", s->rows[i][ct]);
        }
        int k = !strcmp(s->rows[i][ck], "V");
        double e = fk_csv_num(s, i, ce), kl = fk_csv_num(s, i, ckl);
        double d = fk_csv_num(s, i, cd);
        if (isfinite(e)) {
            q->err_sum[k] += e;
            q->err_n[k]++;
        }
        if (!k && isfinite(kl)) {
            q->kl_sum += kl;
            q->kl_n++;
        }
        if (isfinite(d)) {
            q->dsn_sum += d;
            q->dsn_n++;
        }
        double b = fk_csv_num(s, i, cb), bf = fk_csv_num(s, i, cbf);
        double m = fk_csv_num(s, i, cm), cpu = fk_csv_num(s, i, cc);
        double v = fk_csv_num(s, i, cv) + fk_csv_num(s, i, cz);
        q->bytes += isfinite(b) ? b : 0;
        q->bytes_full += isfinite(bf) ? bf : 0;
        q->macs += isfinite(m) ? m : 0;
        q->cpu += isfinite(cpu) ? cpu : 0;
        q->vec += isfinite(v) ? v : 0;
    }
    return FK_OK;
}

/* The cell (index in st->c) of repeat 0 of the setting of cells.csv row i (same codec,
 * dataset and options), or -1. */
static int repeat_zero(const struct fk_plot_store *st, int i, int cr)
{
    const struct fk_csv *t = st->cells;
    for (int a = 0; a < st->n; a++) {
        int r = st->c[a].row, same = atoi(t->rows[r][cr]) == 0 &&
                                     !strcmp(t->rows[r][st->fs->c_codec], t->rows[i][st->fs->c_codec]) &&
                                     !strcmp(t->rows[r][st->fs->c_dataset], t->rows[i][st->fs->c_dataset]);
        for (int j = st->col_first_opt; j < st->col_end_opt && same; j++)
            same = !strcmp(t->rows[r][j], t->rows[i][j]);
        if (same)
            return a;
    }
    return -1;
}

static int add_repeat(struct cell *c, int row)
{
    int *nr = realloc(c->reps, sizeof(int) * (size_t)(c->n_rep ? c->n_rep + 1 : 2));
    if (!nr)
        return fk_err(FK_ENOMEM, "out of memory");
    c->reps = nr;
    if (!c->n_rep)
        c->reps[c->n_rep++] = c->row;
    c->reps[c->n_rep++] = row;
    return FK_OK;
}

static int store_load(struct fk_plot_store *st, const char *dir, const char *data_dir)
{
    memset(st, 0, sizeof *st);
    st->dir = dir;
    st->data_dir = data_dir;
    FK_TRY(fk_store_open(dir, &st->fs));
    st->cells = &st->fs->cells;
    st->sum = &st->fs->summary;
    const struct fk_csv *t = st->cells;
    int ci = st->fs->c_id, cc = st->fs->c_codec, cd = st->fs->c_dataset, cs = st->fs->c_status;
    st->col_first_opt = st->fs->c_first_opt;
    st->col_end_opt = st->fs->c_end_opt;
    st->c = calloc((size_t)t->n_rows + 1, sizeof *st->c);
    st->datasets = calloc((size_t)t->n_rows + 1, sizeof(char *));
    if (!st->c || !st->datasets)
        return fk_err(FK_ENOMEM, "out of memory");
    int cr = fk_csv_col(t, "repeat");
    for (int i = 0; i < t->n_rows; i++) {
        if (strcmp(t->rows[i][cs], "ok"))
            continue;
        if (cr >= 0 && atoi(t->rows[i][cr]) > 0) {
            int r0 = repeat_zero(st, i, cr);
            if (r0 >= 0) {    /* a repeat of a setting: one cell, values averaged */
                FK_TRY(add_repeat(&st->c[r0], i));
                continue;
            }
        }
        struct cell *c = &st->c[st->n++];
        c->row = i;
        c->id = t->rows[i][ci];
        c->codec = t->rows[i][cc];
        /* a policy's cells, and those with row rewrites: a series of their own
         * (codec+policy+merge+think) */
        int ce = fk_csv_col(t, "evict"), cm = fk_csv_col(t, "merge");
        int ct = fk_csv_col(t, "think");
        const char *ev = ce >= 0 ? t->rows[i][ce] : "";
        int merge = cm >= 0 && t->rows[i][cm][0] && strcmp(t->rows[i][cm], "none");
        int think = ct >= 0 && t->rows[i][ct][0] && atof(t->rows[i][ct]) > 0;
        if (ev[0] || merge || think) {
            size_t n = strlen(c->codec) + strlen(ev) + 16;
            if (!(c->codec_own = malloc(n)))
                return fk_err(FK_ENOMEM, "out of memory");
            snprintf(c->codec_own, n, "%s%s%s%s%s", c->codec, ev[0] ? "+" : "", ev,
                     merge ? "+merge" : "", think ? "+think" : "");
            c->codec = c->codec_own;
        }
        c->dataset = t->rows[i][cd];
        int seen = 0;
        for (int d = 0; d < st->n_ds; d++)
            seen |= !strcmp(st->datasets[d], c->dataset);
        if (!seen)
            st->datasets[st->n_ds++] = t->rows[i][cd];
    }
    /* representative-cell rank: options off the dataset's common values, then off the
     * codec's defaults */
    for (int i = 0; i < st->n; i++)
        st->c[i].n_diff = count_offmode(st, &st->c[i]) * 1000 + count_nondefault(st, &st->c[i]);
    return load_seqs(st);
}

static void store_free(struct fk_plot_store *st)
{
    for (int i = 0; i < st->n; i++) {
        free(st->c[i].seq);
        free(st->c[i].reps);
        free(st->c[i].codec_own);
    }
    free(st->c);
    free(st->datasets);
    fk_store_close(&st->fs);
}

/* The representative cell of (dataset, codec): lowest n_diff, then first. */
static struct cell *representative(struct fk_plot_store *st, const char *ds, const char *codec)
{
    struct cell *best = NULL;
    for (int i = 0; i < st->n; i++) {
        struct cell *c = &st->c[i];
        if (strcmp(c->dataset, ds) || strcmp(c->codec, codec))
            continue;
        if (!best || c->n_diff < best->n_diff)
            best = c;
    }
    return best;
}

/* Codecs present in a dataset, registry order first, then unknown ones in sweep order. */
static int codecs_in(struct fk_plot_store *st, const char *ds, const char **out, int cap)
{
    int n = 0;
    for (int k = 0; fk_codec_at(k); k++)
        if (representative(st, ds, fk_codec_at(k)->name) && n < cap)
            out[n++] = fk_codec_at(k)->name;
    for (int i = 0; i < st->n; i++) {
        struct cell *c = &st->c[i];
        if (strcmp(c->dataset, ds) || registry_index(c->codec) >= 0)
            continue;
        int seen = 0;
        for (int j = 0; j < n; j++)
            seen |= !strcmp(out[j], c->codec);
        if (!seen && n < cap)
            out[n++] = c->codec;
    }
    return n;
}

/* The display name of a codec (plots/common.gp ctitle), else its name. */
static const char *codec_display(const struct fk_plot_store *st, const char *codec)
{
    for (int i = 0; st->titles && i < st->titles->n; i++)
        if (!strcmp(st->titles->name[i], codec))
            return st->titles->title[i];
    return codec;
}

/* ---- figure bookkeeping ----------------------------------------------------------------- */

static struct fk_plot_fig *fig_add(struct fk_plot_set *set, const char *stem, const char *ds,
                                   int n_ds, const char *script)
{
    if (set->n_figs == set->cap) {
        int nc = set->cap ? set->cap * 2 : 32;
        struct fk_plot_fig *nf = realloc(set->figs, sizeof *nf * (size_t)nc);
        if (!nf)
            return NULL;
        set->figs = nf;
        set->cap = nc;
    }
    struct fk_plot_fig *f = &set->figs[set->n_figs++];
    memset(f, 0, sizeof *f);
    if (n_ds > 1)
        snprintf(f->name, sizeof f->name, "%s.%s", stem, ds);
    else
        snprintf(f->name, sizeof f->name, "%s", stem);
    for (char *p = f->name; *p; p++)
        if (*p == '/' || *p == ' ' || *p == '\'')
            *p = '_';
    snprintf(f->script, sizeof f->script, "%s.gp", stem);
    const struct fk_plot_kind *k = fk_plot_kind_of(stem);
    snprintf(f->caption, sizeof f->caption, "%s", k ? k->caption : "");
    return f;
}

/* Appends name='value' to the figure's -e assignments (gnuplot doubles a quote). */
static void fig_var(struct fk_plot_fig *f, const char *name, const char *value)
{
    size_t n = strlen(f->vars);
    n += (size_t)snprintf(f->vars + n, sizeof f->vars - n, "%s='", name);
    for (const char *p = value; *p && n + 4 < sizeof f->vars; p++) {
        if (*p == '\'')
            f->vars[n++] = '\'';
        f->vars[n++] = *p;
    }
    snprintf(f->vars + n, sizeof f->vars - n, "'; ");
}

/* Appends name=value (a number) to the figure's -e assignments. */
static void fig_num(struct fk_plot_fig *f, const char *name, int value)
{
    size_t n = strlen(f->vars);
    snprintf(f->vars + n, sizeof f->vars - n, "%s=%d; ", name, value);
}

/* Like fig_var for text shown in a title: escapes gnuplot's enhanced-text characters. */
static void fig_text(struct fk_plot_fig *f, const char *name, const char *value)
{
    char e[1024];
    size_t n = 0;
    for (const char *p = value; *p && n + 3 < sizeof e; p++) {
        if (strchr("_^{}@&~\\", *p))
            e[n++] = '\\';
        e[n++] = *p;
    }
    e[n] = 0;
    fig_var(f, name, e);
}

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static void fig_skip(struct fk_plot_fig *f, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->note, sizeof f->note, fmt, ap);
    va_end(ap);
    if (!f->note[0])
        snprintf(f->note, sizeof f->note, "no data");
}

/* Writes b (freed) as the figure's data file, data/<name>.dat, and sets `data` to it. */
static int fig_data(const struct fk_plot_store *st, struct fk_plot_fig *f, struct fk_sb *b)
{
    char p[4400];
    snprintf(p, sizeof p, "%s/%s.dat", st->data_dir, f->name);
    FK_TRY(buf_write(b, p));
    fig_var(f, "data", p);
    return FK_OK;
}

/* ---- HDF5 cell files -------------------------------------------------------------------- */

/* Opens the cell's series file (fk_store_series_open). */
static int h5cell_open(const struct fk_plot_store *st, const struct cell *c,
                       struct fk_cell_series *h)
{
    int rc = fk_store_series_open(st->dir, c->id, h);
    if (rc < 0)
        fk_store_series_close(h);
    return rc;
}

static long dict_atoms(const char *path);
static int has_loop(const struct fk_plot_store *st, const char *ds);

/* ---- Fig. 1 ----------------------------------------------------------------------------- */

/* Diagnostic rank of a codec: sparse codes needed (else -1); static dictionaries first,
 * then exact OMP over the Gram matrix, then registry order. */
static int diag_rank(const struct fk_codec_ops *ops, int index)
{
    if (!(ops->caps & FK_CAP_SPARSE))
        return -1;
    return ((ops->caps & FK_CAP_ADAPTS) ? 2000 : 0) + ((ops->caps & FK_CAP_GRAM) ? 0 : 1000) +
           index;
}

/* The cell of the Fig. 1 diagnostics: the representative cell of the best-ranked codec. */
static struct cell *diag_cell(struct fk_plot_store *st, const char *ds)
{
    struct cell *best = NULL;
    int best_rank = -1;
    for (int i = 0; fk_codec_at(i); i++) {
        int r = diag_rank(fk_codec_at(i), i);
        if (r < 0 || (best && r >= best_rank))
            continue;
        struct cell *c = representative(st, ds, fk_codec_at(i)->name);
        if (c) {
            best = c;
            best_rank = r;
        }
    }
    return best;
}

static const int recall_ns[8] = {8, 16, 32, 64, 128, 256, 512, 1024};

/* Fig. 1a: recall@n, per sequence the mean over layers, K and V. */
static int fig1a(struct fk_plot_store *st, struct fk_plot_set *set, const char *ds, struct cell *c)
{
    struct fk_plot_fig *f = fig_add(set, "fig1a_recall", ds, st->n_ds, "fig1a_recall");
    if (!f)
        return fk_err(FK_ENOMEM, "out of memory");
    if (!c) {
        fig_skip(f, "dataset %s has no dictionary codec cell", ds);
        return FK_OK;
    }
    struct fk_cell_series h;
    if (h5cell_open(st, c, &h) < 0) {
        fig_skip(f, "%s", fk_errmsg());
        return FK_OK;
    }
    int T = h.n_traces, rc = FK_OK, any = 0;
    double *seq = calloc((size_t)(T ? T : 1) * 16, sizeof(double));
    if (!seq) {
        fk_store_series_close(&h);
        return fk_err(FK_ENOMEM, "out of memory");
    }
    for (int t = 0; t < T && rc == FK_OK; t++)
        for (int k = 0; k < 2 && rc == FK_OK; k++)
            for (int q = 0; q < 8; q++) {
                double s = 0;
                int n = 0;
                for (int l = 0; l < h.n_layers && rc == FK_OK; l++) {
                    double *v;
                    int nv;
                    rc = fk_store_series_read(&h, t, l, k, "pool_recall", &v, &nv);
                    if (rc == FK_OK && v && q < nv && isfinite(v[q])) {
                        s += v[q];
                        n++;
                    }
                    free(v);
                }
                seq[((size_t)k * 8 + q) * (size_t)T + t] = n ? s / n : NAN;
                any |= n > 0;
            }
    fk_store_series_close(&h);
    struct fk_sb b = {0};
    fk_sb_printf(&b, "# Fig. 1a: recall of full-OMP atoms in the top-n screened pool\n"
                "# cell %s (%s, dataset %s), %d sequence(s); mean over layers, then over "
                "sequences, 95%% bootstrap interval with >= %d sequences (else NaN, and the "
                "sequences follow: K_seq..., V_seq...)\n# n K_mean K_lo K_hi V_mean V_lo V_hi\n",
            c->id, c->codec, ds, T, FK_CI_MIN_SEQ);
    long N = dict_atoms(cstr(st, c, "dictionary"));
    int nmax = 0;
    for (int q = 0; q < 8 && rc == FK_OK; q++) {
        if (N > 0 && recall_ns[q] > N)
            break;    /* a pool of all N atoms holds every atom: recall 1 by definition */
        nmax = recall_ns[q];
        fk_sb_printf(&b, "%d", recall_ns[q]);
        for (int k = 0; k < 2 && rc == FK_OK; k++)
            rc = ci_cols(&b, seq + ((size_t)k * 8 + q) * (size_t)T, T, NULL);
        for (int k = 0; k < 2; k++)
            seq_cols(&b, seq + ((size_t)k * 8 + q) * (size_t)T, T);
        fk_sb_printf(&b, "\n");
    }
    free(seq);
    if (rc < 0 || !any) {
        free(b.s);
        if (!any)
            fig_skip(f, "no pool recall in cell %s (sweep recall = false?)", c->id);
        return rc;
    }
    FK_TRY(fig_data(st, f, &b));
    fig_num(f, "nmax", nmax);
    fig_num(f, "nseq", T < FK_CI_MIN_SEQ ? T : 0);
    char t[512];
    const char *sn = role_name(c->codec, FK_ROLE_SPARSITY);
    if (N > 0)
        snprintf(t, sizeof t, "%s, %s, N = %ld, %s = %s", ds, codec_display(st, c->codec), N,
                 sn, rstr(st, c, FK_ROLE_SPARSITY));
    else
        snprintf(t, sizeof t, "%s, %s, %s = %s", ds, codec_display(st, c->codec), sn,
                 rstr(st, c, FK_ROLE_SPARSITY));
    fig_text(f, "subtitle", t);
    return FK_OK;
}

static int cmp_dbl(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Fig. 1b: correlation profile, mean over streams with a 10-90% band over streams. */
static int fig1b(struct fk_plot_store *st, struct fk_plot_set *set, const char *ds, struct cell *c)
{
    struct fk_plot_fig *f = fig_add(set, "fig1b_corr", ds, st->n_ds, "fig1b_corr");
    if (!f)
        return fk_err(FK_ENOMEM, "out of memory");
    if (!c) {
        fig_skip(f, "dataset %s has no dictionary codec cell", ds);
        return FK_OK;
    }
    struct fk_cell_series h;
    if (h5cell_open(st, c, &h) < 0) {
        fig_skip(f, "%s", fk_errmsg());
        return FK_OK;
    }
    int S = h.n_traces * h.n_layers, rc = FK_OK, R = 256, len = 256;
    double *prof = calloc((size_t)2 * (S ? S : 1) * R, sizeof(double));
    int cnt[2] = {0, 0};
    if (!prof) {
        fk_store_series_close(&h);
        return fk_err(FK_ENOMEM, "out of memory");
    }
    for (int t = 0; t < h.n_traces && rc == FK_OK; t++)
        for (int l = 0; l < h.n_layers && rc == FK_OK; l++)
            for (int k = 0; k < 2 && rc == FK_OK; k++) {
                double *v;
                int nv;
                rc = fk_store_series_read(&h, t, l, k, "corr_profile", &v, &nv);
                /* the profile holds min(256, live atoms) entries; drawn up to the
                 * shortest */
                if (rc == FK_OK && v && nv >= 1 && isfinite(v[0])) {
                    memcpy(prof + ((size_t)k * S + cnt[k]) * R, v,
                           sizeof(double) * (size_t)(nv < R ? nv : R));
                    len = nv < len ? nv : len;
                    cnt[k]++;
                }
                free(v);
            }
    fk_store_series_close(&h);
    if (rc < 0 || !cnt[0] || !cnt[1]) {
        free(prof);
        if (rc == FK_OK)
            fig_skip(f, "no correlation profile in cell %s", c->id);
        return rc;
    }
    double *col = malloc(sizeof(double) * (size_t)S);
    struct fk_sb b = {0};
    fk_sb_printf(&b, "# Fig. 1b: sorted |D^T x| / max, mean over %d K and %d V streams "
                "(layers x sequences) of cell %s (%s, dataset %s); band: 10%% and 90%% "
                "quantiles over streams\n# rank K_mean K_p10 K_p90 V_mean V_p10 V_p90\n",
            cnt[0], cnt[1], c->id, c->codec, ds);
    for (int r = 0; col && r < len; r++) {
        fk_sb_printf(&b, "%d", r + 1);
        for (int k = 0; k < 2; k++) {
            double s = 0;
            for (int i = 0; i < cnt[k]; i++) {
                col[i] = prof[((size_t)k * S + i) * R + r];
                s += col[i];
            }
            qsort(col, (size_t)cnt[k], sizeof(double), cmp_dbl);
            bnum(&b, s / cnt[k]);
            bnum(&b, gsl_stats_quantile_from_sorted_data(col, 1, (size_t)cnt[k], 0.1));
            bnum(&b, gsl_stats_quantile_from_sorted_data(col, 1, (size_t)cnt[k], 0.9));
        }
        fk_sb_printf(&b, "\n");
    }
    free(prof);
    if (!col) {
        free(b.s);
        return fk_err(FK_ENOMEM, "out of memory");
    }
    free(col);
    FK_TRY(fig_data(st, f, &b));
    fig_num(f, "nrank", len);
    char t[512];
    snprintf(t, sizeof t, "%s, %s", ds, codec_display(st, c->codec));
    fig_text(f, "subtitle", t);
    return FK_OK;
}

/* Per-layer summary.csv values of one cell: vals[(k * L + l) * T + t]. */
static int layer_values(struct fk_plot_store *st, const struct cell *c, const char *metric,
                        int *n_l,
                        int *n_t, double **out)
{
    const struct fk_csv *s = st->sum;
    int ci = fk_csv_col(s, "cell_id"), ct = fk_csv_col(s, "trace");
    int cl = fk_csv_col(s, "layer"), ck = fk_csv_col(s, "kind"), cm = fk_csv_col(s, metric);
    int L = 0, T = c->n_seq;
    *out = NULL;
    *n_l = *n_t = 0;
    if (cm < 0 || cl < 0 || T == 0)
        return FK_OK;
    for (int i = 0; i < s->n_rows; i++)
        if (!strcmp(s->rows[i][ci], c->id)) {
            int l = atoi(s->rows[i][cl]);
            L = l + 1 > L ? l + 1 : L;
        }
    if (L == 0 || L > 100000)
        return FK_OK;
    double *v = malloc(sizeof(double) * (size_t)2 * L * T);
    if (!v)
        return fk_err(FK_ENOMEM, "out of memory");
    for (size_t i = 0; i < (size_t)2 * L * T; i++)
        v[i] = NAN;
    for (int i = 0; i < s->n_rows; i++) {
        if (strcmp(s->rows[i][ci], c->id))
            continue;
        int t = 0;
        while (t < T && strcmp(c->seq[t].trace, s->rows[i][ct]))
            t++;
        int l = atoi(s->rows[i][cl]), k = !strcmp(s->rows[i][ck], "V");
        if (t < T && l >= 0 && l < L)
            v[((size_t)k * L + l) * T + t] = fk_csv_num(s, i, cm);
    }
    *out = v;
    *n_l = L;
    *n_t = T;
    return FK_OK;
}

/* Fig. 1c: inactive fraction after prefill per layer, K and V. */
static int fig1c(struct fk_plot_store *st, struct fk_plot_set *set, const char *ds, struct cell *c)
{
    struct fk_plot_fig *f = fig_add(set, "fig1c_inactive", ds, st->n_ds, "fig1c_inactive");
    if (!f)
        return fk_err(FK_ENOMEM, "out of memory");
    if (!c) {
        fig_skip(f, "dataset %s has no dictionary codec cell", ds);
        return FK_OK;
    }
    double *v;
    int L, T, any = 0;
    FK_TRY(layer_values(st, c, "inactive_after_prefill", &L, &T, &v));
    struct fk_sb b = {0};
    fk_sb_printf(&b, "# Fig. 1c: fraction of atoms unused after prefill, cell %s (%s, dataset %s), "
                "%d sequence(s); mean and 95%% bootstrap interval over sequences with >= %d "
                "sequences (else NaN, and the sequences follow: K_seq..., V_seq...)\n"
                "# layer K_mean K_lo K_hi V_mean V_lo V_hi\n", c->id, c->codec, ds, T,
                FK_CI_MIN_SEQ);
    int rc = FK_OK;
    for (int l = 0; l < L && rc == FK_OK; l++) {
        fk_sb_printf(&b, "%d", l);
        for (int k = 0; k < 2 && rc == FK_OK; k++) {
            double m;
            rc = ci_cols(&b, v + ((size_t)k * L + l) * T, T, &m);
            any |= isfinite(m);
        }
        for (int k = 0; k < 2; k++)
            seq_cols(&b, v + ((size_t)k * L + l) * T, T);
        fk_sb_printf(&b, "\n");
    }
    free(v);
    if (rc < 0 || !any) {
        free(b.s);
        if (rc == FK_OK)
            fig_skip(f, "no inactive-atom counts in cell %s", c->id);
        return rc;
    }
    FK_TRY(fig_data(st, f, &b));
    fig_num(f, "nseq", T < FK_CI_MIN_SEQ ? T : 0);
    char t[512];
    snprintf(t, sizeof t, "%s, %s", ds, codec_display(st, c->codec));
    fig_text(f, "subtitle", t);
    return FK_OK;
}

/* Fig. 1d: inactive-set overlap (Jaccard) across prompts, per codec (cells.csv). */
static int fig1d(struct fk_plot_store *st, struct fk_plot_set *set, const char *ds)
{
    struct fk_plot_fig *f = fig_add(set, "fig1d_overlap", ds, st->n_ds, "fig1d_overlap");
    if (!f)
        return fk_err(FK_ENOMEM, "out of memory");
    const char *cod[64];
    int nc = codecs_in(st, ds, cod, 64), rows = 0;
    struct fk_sb b = {0};
    fk_sb_printf(&b, "# Fig. 1d: Jaccard overlap of the after-prefill inactive atom sets between "
                "prompts (mean over prompt pairs, layers and K/V; cells.csv "
                "inactive_overlap)\n# codec_index style overlap inactive_k inactive_v label "
                "cell\n");
    for (int i = 0; i < nc; i++) {
        struct cell *c = representative(st, ds, cod[i]);
        double o = cnum(st, c, "inactive_overlap");
        if (!isfinite(o))
            continue;
        fk_sb_printf(&b, "%d %d", rows, fk_plot_codec_style(c->codec));
        bnum(&b, o);
        bnum(&b, cnum(st, c, "inactive_k"));
        bnum(&b, cnum(st, c, "inactive_v"));
        fk_sb_printf(&b, " \"%s\" %s\n", codec_display(st, c->codec), c->id);
        rows++;
    }
    if (!rows) {
        free(b.s);
        fig_skip(f, "inactive_overlap is NaN in dataset %s (needs 2+ prompts whose prefill "
                 "is longer than the buffer n_b, and a dictionary codec)", ds);
        return FK_OK;
    }
    FK_TRY(fig_data(st, f, &b));
    fig_text(f, "subtitle", ds);
    return FK_OK;
}

/* ---- Fig. 3a / 3b: time series per codec ------------------------------------------------ */

#define BIN 64

/* Per-sequence series of a cell: out[t * n + i], n = common length. mode 0: dict_size_norm
 * per step (mean over streams); mode 1: rel. error per bin of *bin decode steps (per stream
 * sum err / sum n in the bin, then mean over streams). *bin is BIN, halved while that gives
 * fewer than 8 bins (short traces); *steps is the common number of decode steps. */
static int cell_series(struct fk_plot_store *st, const struct cell *c, int mode, double **out,
                       int *n,
                       int *n_t, int *bin, int *steps)
{
    struct fk_cell_series h;
    *out = NULL;
    *n = *n_t = 0;
    if (h5cell_open(st, c, &h) < 0)
        return FK_OK;    /* no series: the figure is skipped with a note */
    int T = h.n_traces, len = -1, rc = FK_OK;
    for (int t = 0; t < T && rc == FK_OK; t++) {
        double *v;
        int nv;
        rc = fk_store_series_read(&h, t, 0, 0, mode ? "step_n" : "dict_size_norm", &v, &nv);
        free(v);
        if (rc == FK_OK && v && (len < 0 || nv < len))
            len = nv;
    }
    if (rc < 0 || len <= 0) {
        fk_store_series_close(&h);
        return rc;
    }
    int B = BIN;
    while (B > 1 && (len + B - 1) / B < 8)
        B /= 2;
    *bin = B;
    *steps = len;
    int N = mode ? (len + B - 1) / B : len;
    double *acc = calloc((size_t)T * N, sizeof(double));
    int *cnt = calloc((size_t)T * N, sizeof(int));
    if (!acc || !cnt) {
        free(acc);
        free(cnt);
        fk_store_series_close(&h);
        return fk_err(FK_ENOMEM, "out of memory");
    }
    for (int t = 0; t < T && rc == FK_OK; t++)
        for (int l = 0; l < h.n_layers && rc == FK_OK; l++)
            for (int k = 0; k < 2 && rc == FK_OK; k++) {
                double *a = NULL, *w = NULL;
                int na = 0, nw = 0;
                rc = fk_store_series_read(&h, t, l, k, mode ? "step_err_sum" : "dict_size_norm", &a, &na);
                if (rc == FK_OK && mode)
                    rc = fk_store_series_read(&h, t, l, k, "step_n", &w, &nw);
                if (rc == FK_OK && a && na >= len && (!mode || (w && nw >= len))) {
                    for (int i = 0; i < N; i++) {
                        double s = 0, sn = 0;
                        if (!mode) {
                            s = a[i];
                            sn = 1;
                        }
                        for (int j = i * B; mode && j < (i + 1) * B && j < len; j++) {
                            s += a[j];
                            sn += w[j];
                        }
                        if (sn > 0 && isfinite(s)) {
                            acc[(size_t)t * N + i] += s / sn;
                            cnt[(size_t)t * N + i]++;
                        }
                    }
                }
                free(a);
                free(w);
            }
    fk_store_series_close(&h);
    for (size_t i = 0; i < (size_t)T * N; i++)
        acc[i] = cnt[i] ? acc[i] / cnt[i] : NAN;
    free(cnt);
    if (rc < 0) {
        free(acc);
        return rc;
    }
    *out = acc;
    *n = N;
    *n_t = T;
    return FK_OK;
}

static int fig3_series(struct fk_plot_store *st, struct fk_plot_set *set, const char *ds, int mode)
{
    struct fk_plot_fig *f = fig_add(set, mode ? "fig3b_err_steps" : "fig3a_dict_size", ds,
                                    st->n_ds, "");
    if (!f)
        return fk_err(FK_ENOMEM, "out of memory");
    const char *cod[64];
    int nc = codecs_in(st, ds, cod, 64), blocks = 0, rc = FK_OK, bin = BIN, steps = 0;
    int nseq = 0;    /* sequence columns: the most of a block with too few for an interval */
    char names[1024] = "";
    struct fk_sb b = {0};
    fk_sb_printf(&b, "# Fig. 3%c: %s vs decode step, one block per codec (representative cell), "
                "mean over layers and K/V per sequence, then mean and 95%% bootstrap interval "
                "over sequences with >= %d sequences (else NaN, and the sequences follow)\n"
                "# %s mean lo hi [seq...]\n", mode ? 'b' : 'a',
            mode ? "relative reconstruction error (bins of decode steps)"
                 : "normalised dictionary size N_t/N", FK_CI_MIN_SEQ,
            mode ? "bin_start bin_centre" : "step");
    for (int i = 0; i < nc && rc == FK_OK; i++) {
        const struct fk_codec_ops *ops = fk_codec_find(cod[i]);
        if (ops && !(ops->caps & FK_CAP_DICT))
            continue;    /* no dictionary: the uncompressed reference, not a line here */
        struct cell *c = representative(st, ds, cod[i]);
        double *v;
        int N, T, B = BIN, L = 0;
        rc = cell_series(st, c, mode, &v, &N, &T, &B, &L);
        if (rc == FK_OK && v && !blocks) {
            bin = B;
            steps = L;
        }
        if (rc < 0 || !v)
            continue;
        double *col = malloc(sizeof(double) * (size_t)T);
        if (!col) {
            free(v);
            rc = fk_err(FK_ENOMEM, "out of memory");
            break;
        }
        fk_sb_printf(&b, "%s# codec %s cell %s, %d sequence(s)\n", blocks ? "\n\n" : "", c->codec,
                c->id, T);
        for (int j = 0; j < N && rc == FK_OK; j++) {
            for (int t = 0; t < T; t++)
                col[t] = v[(size_t)t * N + j];
            int finite = 0;
            for (int t = 0; t < T; t++)
                finite |= isfinite(col[t]) != 0;
            if (!finite)
                continue;
            if (mode)
                fk_sb_printf(&b, "%d %g", j * B, j * B + B / 2.0);
            else
                fk_sb_printf(&b, "%d", j + 1);
            rc = ci_cols(&b, col, T, NULL);
            seq_cols(&b, col, T);
            fk_sb_printf(&b, "\n");
        }
        free(col);
        free(v);
        if (T < FK_CI_MIN_SEQ && T > nseq)
            nseq = T;
        size_t n = strlen(names);
        snprintf(names + n, sizeof names - n, "%s%s", blocks ? " " : "", c->codec);
        blocks++;
    }
    snprintf(f->script, sizeof f->script, "%s.gp", mode ? "fig3b_err_steps" : "fig3a_dict_size");
    if (rc < 0 || !blocks) {
        free(b.s);
        if (rc == FK_OK)
            fig_skip(f, "no per-step series for a dictionary codec in dataset %s", ds);
        return rc;
    }
    FK_TRY(fig_data(st, f, &b));
    fig_var(f, "codecs", names);
    fig_text(f, "subtitle", ds);
    fig_num(f, "bin", bin);
    fig_num(f, "nsteps", steps);
    fig_num(f, "nseq", nseq);
    return FK_OK;
}

/* ---- Fig. 3c / 3d: heatmaps -------------------------------------------------------------- */

struct axis {
    char lab[64][48];            /* distinct labels */
    double key[64][2];           /* their sort keys */
    int n;                       /* labels held */
};

static int axis_add(struct axis *a, const char *lab, double k0, double k1)
{
    for (int i = 0; i < a->n; i++)
        if (!strcmp(a->lab[i], lab))
            return i;
    if (a->n == 64)
        return -1;
    snprintf(a->lab[a->n], sizeof a->lab[0], "%s", lab);
    a->key[a->n][0] = k0;
    a->key[a->n][1] = k1;
    return a->n++;
}

/* Rank of entry i in key order. */
static int axis_rank(const struct axis *a, int i)
{
    int r = 0;
    for (int j = 0; j < a->n; j++)
        r += a->key[j][0] < a->key[i][0] ||
             (a->key[j][0] == a->key[i][0] && a->key[j][1] < a->key[i][1]) ||
             (a->key[j][0] == a->key[i][0] && a->key[j][1] == a->key[i][1] && j < i);
    return r;
}

/* The options of a cell other than `skip` (comma list), as one string. */
static void other_opts(const struct fk_plot_store *st, const struct cell *c, const char *skip,
                       char *out, size_t cap)
{
    size_t n = 0;
    out[0] = 0;
    for (int j = st->col_first_opt; j < st->col_end_opt && n + 1 < cap; j++) {
        char pat[80];
        snprintf(pat, sizeof pat, ",%s,", st->cells->head[j]);
        if (strstr(skip, pat))
            continue;
        n += (size_t)snprintf(out + n, cap - n, "%s=%s;", st->cells->head[j],
                              st->cells->rows[c->row][j]);
    }
}

/* Atoms N of a dictionary file (attribute "atoms"), or -1. */
static long dict_atoms(const char *path)
{
    if (!path || !*path)
        return -1;
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0)
        return -1;
    int64_t n = -1;
    if (fk_h5_attr_i64(f, path, "atoms", &n) < 0)
        n = -1;
    H5Fclose(f);
    fk_err_clear();
    return (long)n;
}

struct hm_pt {
    const struct cell *c;        /* the cell */
    int x, y;                    /* axis entries */
};

/* Adds cell d at square (x, y) unless an axis was full (x or y < 0) or the square is taken. */
static void hm_add(struct hm_pt *pt, int *np, const struct cell *d, int x, int y)
{
    int dup = x < 0 || y < 0;
    for (int i = 0; i < *np && !dup; i++)
        dup = pt[i].x == x && pt[i].y == y;
    if (!dup)
        pt[(*np)++] = (struct hm_pt){d, x, y};
}

/* The entry of rank r in key order. */
static int axis_at(const struct axis *a, int r)
{
    int i = 0;
    while (axis_rank(a, i) != r)
        i++;
    return i;
}

/* The square of entries (x, y) among pt, or NULL. */
static const struct cell *hm_cell(const struct hm_pt *pt, int np, int x, int y)
{
    for (int i = 0; i < np; i++)
        if (pt[i].x == x && pt[i].y == y)
            return pt[i].c;
    return NULL;
}

/* Formats metric v for a square's label ("n/a" when not finite). */
static void hm_text(char *t, size_t cap, double v)
{
    if (isfinite(v))
        snprintf(t, cap, "%.3g", v);
    else
        snprintf(t, cap, "n/a");
}

/* Writes a heatmap data file: blocks per y (ascending), rows per x (ascending). */
static int heat_write(struct fk_plot_store *st, struct fk_plot_fig *f, const struct axis *ax,
                      const struct axis *ay, const struct hm_pt *pt, int np, const char *what)
{
    struct fk_sb b = {0};
    fk_sb_printf(&b, "# %s\n# xi yi rel_err_mean attn_kl xlabel ylabel rel_err_text attn_kl_text "
                "rel_err_final_mean rel_err_final_text cell\n", what);
    for (int yr = 0; yr < ay->n; yr++) {
        int y = axis_at(ay, yr);
        for (int xr = 0; xr < ax->n; xr++) {
            int x = axis_at(ax, xr);
            const struct cell *c = hm_cell(pt, np, x, y);
            double e = c ? cnum(st, c, "rel_err_mean") : NAN;
            double kl = c ? cnum(st, c, "attn_kl") : NAN;
            double fe = c ? cnum(st, c, "rel_err_final_mean") : NAN;
            char te[32], tk[32], tf[32];
            hm_text(te, sizeof te, e);
            hm_text(tk, sizeof tk, kl);
            hm_text(tf, sizeof tf, fe);
            fk_sb_printf(&b, "%d %d", xr, yr);
            bnum(&b, e);
            bnum(&b, kl);
            fk_sb_printf(&b, " \"%s\" \"%s\" \"%s\" \"%s\"", ax->lab[x], ay->lab[y], te, tk);
            bnum(&b, fe);
            fk_sb_printf(&b, " \"%s\" %s\n", tf, c ? c->id : "-");
        }
        fk_sb_printf(&b, "\n");
    }
    FK_TRY(fig_data(st, f, &b));
    fig_num(f, "nx", ax->n);
    fig_num(f, "ny", ay->n);
    return FK_OK;
}

/* Writes the closed-loop heatmap data of a model dataset, squares as heat_write: per square
 * the replay attention KL, the end-to-end KL and the attention KL in the loop. */
static int heat_write_e2e(struct fk_plot_store *st, struct fk_plot_fig *f, const struct axis *ax,
                          const struct axis *ay, const struct hm_pt *pt, int np,
                          const char *what)
{
    static const char *const col[3] = {"attn_kl", "e2e_kl", "loop_attn_kl"};
    struct fk_sb b = {0};
    fk_sb_printf(&b, "# %s; closed loop\n# xi yi attn_kl e2e_kl loop_attn_kl xlabel ylabel "
                "attn_kl_text e2e_kl_text loop_attn_kl_text cell\n", what);
    for (int yr = 0; yr < ay->n; yr++) {
        for (int xr = 0; xr < ax->n; xr++) {
            int x = axis_at(ax, xr), y = axis_at(ay, yr);
            const struct cell *c = hm_cell(pt, np, x, y);
            char tx[3][32];
            fk_sb_printf(&b, "%d %d", xr, yr);
            for (int k = 0; k < 3; k++) {
                double v = c ? cnum(st, c, col[k]) : NAN;
                bnum(&b, v);
                hm_text(tx[k], sizeof tx[k], v);
            }
            fk_sb_printf(&b, " \"%s\" \"%s\" \"%s\" \"%s\" \"%s\" %s\n", ax->lab[x],
                         ay->lab[y], tx[0], tx[1], tx[2], c ? c->id : "-");
        }
        fk_sb_printf(&b, "\n");
    }
    FK_TRY(fig_data(st, f, &b));
    fig_num(f, "nx", ax->n);
    fig_num(f, "ny", ay->n);
    return FK_OK;
}

/* 1 when the codec has the options of the Fig. 3c grid (coherence threshold tau_c and the
 * error thresholds delta_k, delta_v: FK_ROLE_COHERENCE, _DELTA_K, _DELTA_V). */
static int has_tau_delta(const char *codec)
{
    return *role_name(codec, FK_ROLE_COHERENCE) && *role_name(codec, FK_ROLE_DELTA_K) &&
           *role_name(codec, FK_ROLE_DELTA_V);
}

/* ",TAU,DELTA_K,DELTA_V," of codec's option names: the options other_opts leaves out. */
static const char *fig3c_skip(const char *codec, char *buf, size_t cap)
{
    snprintf(buf, cap, ",%s,%s,%s,", role_name(codec, FK_ROLE_COHERENCE),
             role_name(codec, FK_ROLE_DELTA_K), role_name(codec, FK_ROLE_DELTA_V));
    return buf;
}

/* Number of distinct tau_c x (delta_k/delta_v) points of the group of cell c (same dataset,
 * codec and other options). */
static int fig3c_score(const struct fk_plot_store *st, const struct cell *c, const char *key)
{
    struct axis ax = {0}, ay = {0};
    for (int j = 0; j < st->n; j++) {
        const struct cell *d = &st->c[j];
        char k2[2048];
        if (strcmp(d->dataset, c->dataset) || strcmp(d->codec, c->codec))
            continue;
        char skip[160];
        other_opts(st, d, fig3c_skip(d->codec, skip, sizeof skip), k2, sizeof k2);
        if (strcmp(k2, key))
            continue;
        char yl[48];
        snprintf(yl, sizeof yl, "%s/%s", rstr(st, d, FK_ROLE_DELTA_K),
                 rstr(st, d, FK_ROLE_DELTA_V));
        axis_add(&ax, rstr(st, d, FK_ROLE_COHERENCE), 0, 0);
        axis_add(&ay, yl, 0, 0);
    }
    return ax.n * ay.n;
}

/* Fig. 3c: cells of the tau_c / delta codec varying tau_c and (delta_k, delta_v), per
 * dataset. */
static int fig3c(struct fk_plot_store *st, struct fk_plot_set *set, const char *ds)
{
    struct fk_plot_fig *f = fig_add(set, "fig3c_tau_delta", ds, st->n_ds, "fig3c_tau_delta");
    if (!f)
        return fk_err(FK_ENOMEM, "out of memory");
    char best_key[2048] = "", key[2048];
    const char *codec = NULL;
    int best = 0;
    /* the group (codec and other options equal) with the most distinct (tau_c, delta) pairs */
    for (int i = 0; i < st->n; i++) {
        const struct cell *c = &st->c[i];
        if (strcmp(c->dataset, ds) || !has_tau_delta(c->codec))
            continue;
        char skip[160];
        other_opts(st, c, fig3c_skip(c->codec, skip, sizeof skip), key, sizeof key);
        int score = fig3c_score(st, c, key);
        if (score > 1 && score > best) {
            best = score;
            codec = c->codec;
            snprintf(best_key, sizeof best_key, "%s", key);
        }
    }
    if (!best) {
        fig_skip(f, "no cells of a codec with options tau_c, delta_k, delta_v varying them in "
                 "dataset %s", ds);
        return FK_OK;
    }
    struct axis ax = {0}, ay = {0};
    struct hm_pt pt[4096];
    int np = 0;
    for (int j = 0; j < st->n && np < 4096; j++) {
        const struct cell *d = &st->c[j];
        if (strcmp(d->dataset, ds) || strcmp(d->codec, codec))
            continue;
        char skip[160];
        other_opts(st, d, fig3c_skip(codec, skip, sizeof skip), key, sizeof key);
        if (strcmp(key, best_key))
            continue;
        char yl[48];
        double dk = rnum(st, d, FK_ROLE_DELTA_K), dv = rnum(st, d, FK_ROLE_DELTA_V);
        snprintf(yl, sizeof yl, "%s/%s", rstr(st, d, FK_ROLE_DELTA_K),
                 rstr(st, d, FK_ROLE_DELTA_V));
        int x = axis_add(&ax, rstr(st, d, FK_ROLE_COHERENCE), rnum(st, d, FK_ROLE_COHERENCE), 0);
        int y = axis_add(&ay, yl, dk, dv);
        hm_add(pt, &np, d, x, y);
    }
    char what[2300];
    snprintf(what, sizeof what, "Fig. 3c: %s on dataset %s, tau_c (x) by delta_k/delta_v "
             "(y); other options: %s", codec, ds, best_key);
    FK_TRY(heat_write(st, f, &ax, &ay, pt, np, what));
    char t[512];
    snprintf(t, sizeof t, "%s, %s, %s = %s, %s = %s", ds, codec_display(st, codec),
             role_name(codec, FK_ROLE_SPARSITY), rstr(st, pt[0].c, FK_ROLE_SPARSITY),
             role_name(codec, FK_ROLE_POOL), rstr(st, pt[0].c, FK_ROLE_POOL));
    fig_text(f, "subtitle", t);
    if (!has_loop(st, ds))
        return FK_OK;
    /* a model dataset: the same squares' end-to-end KL beside their attention KL */
    struct fk_plot_fig *g = fig_add(set, "fig3c_tau_delta_e2e", ds, st->n_ds,
                                    "fig3c_tau_delta_e2e");
    if (!g)
        return fk_err(FK_ENOMEM, "out of memory");
    FK_TRY(heat_write_e2e(st, g, &ax, &ay, pt, np, what));
    fig_text(g, "subtitle", t);
    return FK_OK;
}

/* Distinct non-empty values of option column j among the cells of codec on dataset ds. */
static int n_values(const struct fk_plot_store *st, const char *ds, const char *codec, int j)
{
    struct axis a = {0};
    for (int i = 0; i < st->n; i++) {
        const struct cell *c = &st->c[i];
        const char *v = st->cells->rows[c->row][j];
        if (v[0] && !strcmp(c->dataset, ds) && !strcmp(c->codec, codec))
            axis_add(&a, v, 0, 0);
    }
    return a.n;
}

/* The group (cells of codec on ds sharing every option but ja and jb) with the most
 * distinct (ja, jb) settings, both axes with two or more values: their count (0: none) and
 * the group's key into key (cap bytes). */
static int pair_squares(const struct fk_plot_store *st, const char *ds, const char *codec, int ja,
                        int jb, char *key, size_t cap)
{
    char skip[160], k1[2048], k2[2048];
    snprintf(skip, sizeof skip, ",%s,%s,", st->cells->head[ja], st->cells->head[jb]);
    int best = 0;
    for (int i = 0; i < st->n; i++) {
        const struct cell *c = &st->c[i];
        if (strcmp(c->dataset, ds) || strcmp(c->codec, codec))
            continue;
        other_opts(st, c, skip, k1, sizeof k1);
        struct axis ax = {0}, ay = {0}, sq = {0};
        for (int j = 0; j < st->n; j++) {
            const struct cell *d = &st->c[j];
            if (strcmp(d->dataset, ds) || strcmp(d->codec, codec))
                continue;
            other_opts(st, d, skip, k2, sizeof k2);
            if (strcmp(k1, k2))
                continue;
            char both[100];
            snprintf(both, sizeof both, "%s|%s", st->cells->rows[d->row][ja],
                     st->cells->rows[d->row][jb]);
            axis_add(&ax, st->cells->rows[d->row][ja], 0, 0);
            axis_add(&ay, st->cells->rows[d->row][jb], 0, 0);
            axis_add(&sq, both, 0, 0);
        }
        if (ax.n > 1 && ay.n > 1 && sq.n > best) {
            best = sq.n;
            snprintf(key, cap, "%s", k1);
        }
    }
    return best;
}

/* Fig. 3d when a codec's cells do not vary N and s together: a heatmap over the two options
 * whose settings fill the most squares with every other option fixed (ties: cells.csv
 * order), on the dataset where the codec has most cells. Options of the Fig. 3c grid
 * (tau_c, delta_k, delta_v) are left to Fig. 3c. Skipped with a note naming the option when
 * only one varies. */
static int heat_two_options(struct fk_plot_store *st, struct fk_plot_fig *f, const char *codec)
{
    const char *ds = NULL;
    int most = 0;
    for (int d = 0; d < st->n_ds; d++) {
        int k = 0;
        for (int i = 0; i < st->n; i++)
            k += !strcmp(st->c[i].dataset, st->datasets[d]) && !strcmp(st->c[i].codec, codec);
        if (k > most) {
            most = k;
            ds = st->datasets[d];
        }
    }
    int cand[64], nc = 0, tau_delta = has_tau_delta(codec);
    char grid[160];
    fig3c_skip(codec, grid, sizeof grid);
    for (int j = st->col_first_opt; ds && j < st->col_end_opt && nc < 64; j++) {
        char pat[80];
        snprintf(pat, sizeof pat, ",%s,", st->cells->head[j]);
        if (n_values(st, ds, codec, j) > 1 && !(tau_delta && strstr(grid, pat)))
            cand[nc++] = j;
    }
    if (nc == 0) {
        fig_skip(f, "no %s cells varying the dictionary (N), s or two options (other than "
                 "Fig. 3c's)", codec);
        return FK_OK;
    }
    if (nc == 1) {
        fig_skip(f, "only %s varies among the %s cells of dataset %s: a heatmap needs two "
                 "options (draw it with plot --x %s --y METRIC)", st->cells->head[cand[0]],
                 codec, ds, st->cells->head[cand[0]]);
        return FK_OK;
    }
    int ja = -1, jb = -1, best = 0;
    char key[2048], best_key[2048] = "";
    for (int a = 0; a < nc; a++)
        for (int b = a + 1; b < nc; b++) {
            int k = pair_squares(st, ds, codec, cand[a], cand[b], key, sizeof key);
            if (k > best) {
                best = k;
                ja = cand[a];
                jb = cand[b];
                snprintf(best_key, sizeof best_key, "%s", key);
            }
        }
    if (!best) {
        fig_skip(f, "%s and %s vary among the %s cells of dataset %s, but no two of them "
                 "together with every other option fixed", st->cells->head[cand[0]],
                 st->cells->head[cand[1]], codec, ds);
        return FK_OK;
    }
    const char *xa = st->cells->head[ja], *yb = st->cells->head[jb];
    char skip[160];
    snprintf(skip, sizeof skip, ",%s,%s,", xa, yb);
    struct axis ax = {0}, ay = {0};
    static struct hm_pt pt[4096];
    int np = 0;
    for (int j = 0; j < st->n && np < 4096; j++) {
        const struct cell *d = &st->c[j];
        if (strcmp(d->dataset, ds) || strcmp(d->codec, codec))
            continue;
        other_opts(st, d, skip, key, sizeof key);
        if (strcmp(key, best_key))
            continue;
        const char *va = st->cells->rows[d->row][ja], *vb = st->cells->rows[d->row][jb];
        int x = axis_add(&ax, va, strtod(va, NULL), j), y = axis_add(&ay, vb, strtod(vb, NULL), j);
        hm_add(pt, &np, d, x, y);
    }
    char what[2600];
    snprintf(what, sizeof what, "Fig. 3d: %s on dataset %s, %s (x) by %s (y): the dictionary "
             "size N and s do not vary together; other options: %s", codec, ds, xa, yb,
             best_key);
    FK_TRY(heat_write(st, f, &ax, &ay, pt, np, what));
    char t[512], m[256];
    snprintf(t, sizeof t, "%s, %s", ds, codec_display(st, codec));
    fig_text(f, "subtitle", t);
    snprintf(m, sizeof m, "Sensitivity to %s and %s", xa, yb);
    fig_text(f, "main", m);
    fig_text(f, "xtitle", xa);
    fig_text(f, "ytitle", yb);
    return FK_OK;
}

/* Fig. 3d: N (dictionary atoms; dataset name when unknown) by the sparsity s
 * (FK_ROLE_SPARSITY), one figure per sweep. */
static int fig3d(struct fk_plot_store *st, struct fk_plot_set *set, const char *codec)
{
    struct fk_plot_fig *f = fig_add(set, "fig3d_N_s", codec, 2, "fig3d_N_s");
    if (!f)
        return fk_err(FK_ENOMEM, "out of memory");
    const char *sname = role_name(codec, FK_ROLE_SPARSITY);
    char skip[80];
    snprintf(skip, sizeof skip, ",%s,", sname);
    long *natoms = malloc(sizeof(long) * (size_t)(st->n ? st->n : 1));
    if (!natoms)
        return fk_err(FK_ENOMEM, "out of memory");
    for (int i = 0; i < st->n; i++) {
        natoms[i] = -2;
        for (int j = 0; j < i && natoms[i] == -2; j++)
            if (!strcmp(cstr(st, &st->c[j], "dictionary"), cstr(st, &st->c[i], "dictionary")))
                natoms[i] = natoms[j];
        if (natoms[i] == -2)
            natoms[i] = dict_atoms(cstr(st, &st->c[i], "dictionary"));
    }
    /* group: codec + traces + other options; the one with the most pairs */
    char best_key[4096] = "", key[4096];
    int best = 0;
    for (int i = 0; i < st->n; i++) {
        const struct cell *c = &st->c[i];
        if (!cstr(st, c, "dictionary")[0] || strcmp(c->codec, codec))
            continue;
        snprintf(key, sizeof key, "%s|%s|", c->codec, cstr(st, c, "traces"));
        size_t n = strlen(key);
        other_opts(st, c, skip, key + n, sizeof key - n);
        struct axis ax = {0}, ay = {0};
        for (int j = 0; j < st->n; j++) {
            const struct cell *d = &st->c[j];
            char k2[4096];
            snprintf(k2, sizeof k2, "%s|%s|", d->codec, cstr(st, d, "traces"));
            size_t n2 = strlen(k2);
            other_opts(st, d, skip, k2 + n2, sizeof k2 - n2);
            if (strcmp(k2, key))
                continue;
            axis_add(&ax, d->dataset, 0, 0);
            axis_add(&ay, rstr(st, d, FK_ROLE_SPARSITY), 0, 0);
        }
        int score = ax.n * ay.n;
        if (ax.n > 1 && ay.n > 1 && score > best) {    /* both axes vary */
            best = score;
            snprintf(best_key, sizeof best_key, "%s", key);
        }
    }
    if (!best) {    /* N and s do not vary together: the two options that do, if any */
        free(natoms);
        return heat_two_options(st, f, codec);
    }
    struct axis ax = {0}, ay = {0};
    struct hm_pt pt[4096];
    int np = 0, known = 1;
    for (int j = 0; j < st->n && np < 4096; j++) {
        const struct cell *d = &st->c[j];
        snprintf(key, sizeof key, "%s|%s|", d->codec, cstr(st, d, "traces"));
        size_t n = strlen(key);
        other_opts(st, d, skip, key + n, sizeof key - n);
        if (strcmp(key, best_key))
            continue;
        char xl[48];
        if (natoms[j] > 0)
            snprintf(xl, sizeof xl, "%ld", natoms[j]);
        else
            snprintf(xl, sizeof xl, "%s", d->dataset);
        known &= natoms[j] > 0;
        int x = axis_add(&ax, xl, natoms[j] > 0 ? (double)natoms[j] : 1e18, j);
        int y = axis_add(&ay, rstr(st, d, FK_ROLE_SPARSITY), rnum(st, d, FK_ROLE_SPARSITY), 0);
        hm_add(pt, &np, d, x, y);
    }
    free(natoms);
    char what[4400];
    snprintf(what, sizeof what, "Fig. 3d: %s, dictionary atoms N (x) by sparsity s (y); "
             "group %s", pt[0].c->codec, best_key);
    FK_TRY(heat_write(st, f, &ax, &ay, pt, np, what));
    char t[512];
    if (rstr(st, pt[0].c, FK_ROLE_POOL)[0])
        snprintf(t, sizeof t, "%s, %s = %s", codec_display(st, pt[0].c->codec),
                 role_name(codec, FK_ROLE_POOL), rstr(st, pt[0].c, FK_ROLE_POOL));
    else
        snprintf(t, sizeof t, "%s", codec_display(st, pt[0].c->codec));
    fig_text(f, "subtitle", t);
    fig_var(f, "xtitle", known ? "dictionary atoms N" : "dataset (dictionary)");
    return FK_OK;
}

/* ---- Pareto ------------------------------------------------------------------------------ */

static int label_cols(const struct fk_plot_store *st, const char *ds, const char *codec, int *cols,
                      int *n_cols);
static void cell_label(const struct fk_plot_store *st, const struct cell *c, const int *cols, int n,
                       char *out, size_t cap);

/* Label placement without overlap: boxes of labels placed so far in axis fractions (x
 * linear, y logarithmic over the figure's range). */
struct lbox {
    double u0, u1, v0, v1;
};
#define LBOX_CW 0.0125           /* a label character, fraction of the data's x range */
#define LBOX_H 0.032             /* a label line, fraction of the y axis (whole decades) */

/* The y (data units) of the label of point (x, y), text len characters: right of the point,
 * moved down or up a line at a time off every label placed before (at most 2 lines: a label
 * further away would name the wrong point; then it stays at its point), then recorded in
 * boxes. */
static double place_label(struct lbox *boxes, int *nb, double x, double y, int len,
                          const double *rng)
{
    double u = (x - rng[0]) / (rng[1] - rng[0] > 0 ? rng[1] - rng[0] : 1);
    double lv = log(y), v = (lv - rng[2]) / (rng[3] - rng[2] > 0 ? rng[3] - rng[2] : 1);
    struct lbox b = {u + 0.01, u + 0.01 + LBOX_CW * len, v, v + LBOX_H};
    for (int k = 0; k <= 5; k++) {
        double dv = k == 5 ? 0 : (k % 2 ? -1 : 1) * ((k + 1) / 2) * LBOX_H;
        struct lbox t = {b.u0, b.u1, b.v0 - dv, b.v1 - dv};
        int hit = 0;
        for (int i = 0; i < *nb && !hit; i++)
            hit = t.u0 < boxes[i].u1 && boxes[i].u0 < t.u1 && t.v0 < boxes[i].v1 &&
                  boxes[i].v0 < t.v1;
        if (!hit || k == 5) {
            boxes[(*nb)++] = t;
            return exp(rng[2] + (t.v0 + LBOX_H / 2) * (rng[3] - rng[2]));
        }
    }
    return y;
}

/* Appends to a figure's subtitle that n of its cells use the paper's accounting. */
static void accounting_note(int n, char *t, size_t cap)
{
    size_t len = strlen(t);
    if (n > 0 && len < cap)
        snprintf(t + len, cap - len, "; %d cell(s) in the paper's accounting: replaced atoms "
                 "free (bytes_uncounted)", n);
}

static int pareto(struct fk_plot_store *st, struct fk_plot_set *set, const char *ds)
{
    struct fk_plot_fig *f = fig_add(set, "pareto_bytes_kl", ds, st->n_ds, "pareto_bytes_kl");
    if (!f)
        return fk_err(FK_ENOMEM, "out of memory");
    const char *cod[64];
    int nc = codecs_in(st, ds, cod, 64), blocks = 0, skipped = 0;
    char names[1024] = "";
    struct fk_sb b = {0};
    fk_sb_printf(&b, "# Pareto: bytes per token vs attention KL, every finished cell of dataset %s; "
                "one block per codec, the last block is the Pareto front\n"
                "# label: the options that tell the codec's cells apart (as pareto_head)\n"
                "# label_y: where the label sits (moved off the labels before it)\n"
                "# bytes_per_token attn_kl rel_err_mean label cell label_y\n", ds);
    double (*front)[2] = malloc(sizeof *front * (size_t)(st->n ? st->n : 1));
    struct lbox *boxes = malloc(sizeof *boxes * (size_t)(st->n ? st->n : 1));
    int nf = 0, nbox = 0;
    if (!front || !boxes) {
        free(front);
        free(boxes);
        return fk_err(FK_ENOMEM, "out of memory");
    }
    double rng[4] = {INFINITY, -INFINITY, INFINITY, -INFINITY};    /* x, log y ranges */
    for (int j = 0; j < st->n; j++) {
        double x = cnum(st, &st->c[j], "bytes_per_token"), y = cnum(st, &st->c[j], "attn_kl");
        if (strcmp(st->c[j].dataset, ds) || !isfinite(x) || !isfinite(y) || y <= 0)
            continue;
        rng[0] = fmin(rng[0], x), rng[1] = fmax(rng[1], x);
        rng[2] = fmin(rng[2], log(y)), rng[3] = fmax(rng[3], log(y));
    }
    /* the log y axis spans whole decades (gnuplot's autoscale) */
    rng[2] = floor(rng[2] / log(10) + 1e-9) * log(10);
    rng[3] = ceil(rng[3] / log(10) - 1e-9) * log(10);
    for (int i = 0; i < nc; i++) {
        int rows = 0, cols[32], ncol = 0, rc = label_cols(st, ds, cod[i], cols, &ncol);
        if (rc < 0) {
            free(front);
            free(boxes);
            free(b.s);
            return rc;
        }
        for (int j = 0; j < st->n; j++) {
            const struct cell *c = &st->c[j];
            if (strcmp(c->dataset, ds) || strcmp(c->codec, cod[i]))
                continue;
            double x = cnum(st, c, "bytes_per_token"), y = cnum(st, c, "attn_kl");
            if (!isfinite(x) || !isfinite(y) || y <= 0) {
                skipped++;
                continue;
            }
            if (!rows)
                fk_sb_printf(&b, "%s# codec %s\n", blocks ? "\n\n" : "", cod[i]);
            bnum(&b, x);
            bnum(&b, y);
            bnum(&b, cnum(st, c, "rel_err_mean"));
            char label[64];
            cell_label(st, c, cols, ncol, label, sizeof label);
            fk_sb_printf(&b, " \"%s\" %s", label, c->id);
            bnum(&b, label[0] ? place_label(boxes, &nbox, x, y, (int)strlen(label), rng) : y);
            fk_sb_printf(&b, "\n");
            front[nf][0] = x;
            front[nf][1] = y;
            nf++;
            rows++;
        }
        if (rows) {
            size_t n = strlen(names);
            snprintf(names + n, sizeof names - n, "%s%s", blocks ? " " : "", cod[i]);
            blocks++;
        }
    }
    free(boxes);
    if (!blocks) {
        free(front);
        free(b.s);
        fig_skip(f, "no cell with bytes_per_token and attn_kl > 0 in dataset %s (attention "
                 "off?)", ds);
        return FK_OK;
    }
    qsort(front, (size_t)nf, sizeof *front, cmp_dbl);
    fk_sb_printf(&b, "\n\n# Pareto front (no other cell has fewer bytes and lower KL)\n");
    double lowest = INFINITY;
    for (int i = 0; i < nf; i++)
        if (front[i][1] < lowest) {
            lowest = front[i][1];
            bnum(&b, front[i][0]);
            bnum(&b, front[i][1]);
            fk_sb_printf(&b, " NaN \"\" front NaN\n");
        }
    free(front);
    FK_TRY(fig_data(st, f, &b));
    fig_var(f, "codecs", names);
    char t[768];
    snprintf(t, sizeof t, "%s%s", ds, skipped ? " (cells with KL = 0, e.g. full, not shown)"
                                              : "");
    int uncounted = 0;
    for (int j = 0; j < st->n; j++)
        uncounted += !strcmp(st->c[j].dataset, ds) && cnum(st, &st->c[j], "bytes_uncounted") > 0;
    accounting_note(uncounted, t, sizeof t);
    fig_text(f, "subtitle", t);
    return FK_OK;
}

/* ---- cross-family Pareto (bytes per token per KV head) ---------------------------------- */

/* The family of a codec in the cross-family figure and table (fk_codec_family: the folder
 * of its source; "-" when this build does not know the codec), with its style: colour = the
 * family's position among the registry's families in registry order (1-based; 0 for an
 * unknown codec: grey), marker = the codec's position among the registry codecs of its
 * family (1-based). The same colour and marker in every results directory. */
static const char *family_style(const char *codec, int *colour, int *marker)
{
    const struct fk_codec_ops *ops = fk_codec_find(codec);
    const char *fam = ops ? fk_codec_family(ops) : "";
    int idx = registry_index(codec), nf = 0;
    *colour = 0;
    *marker = 1;
    const char *plus = strchr(codec, '+');
    if (plus) { /* CODEC+POLICY: the eviction family, after the registry's families; marker:
                 * the policy's registry position, composed ones after the plain ones */
        for (int i = 0; fk_codec_at(i); i++) {
            int seen = 0;
            for (int j = 0; j < i && !seen; j++)
                seen = !strcmp(fk_codec_family(fk_codec_at(j)), fk_codec_family(fk_codec_at(i)));
            nf += !seen;
        }
        int np = 0, at = 0;
        for (; fk_evict_policies[np]; np++)
            if (!strcmp(fk_evict_policies[np]->name, plus + 1))
                at = np + 1;
        *colour = nf + 1;
        *marker = at + (strncmp(codec, "full+", 5) ? np : 0);
        return "evict";
    }
    if (!fam[0])
        return "-";
    for (int i = 0; fk_codec_at(i); i++) {
        const char *f = fk_codec_family(fk_codec_at(i));
        int seen = 0;
        for (int j = 0; j < i && !seen; j++)
            seen = !strcmp(fk_codec_family(fk_codec_at(j)), f);
        nf += !seen;
        if (!strcmp(f, fam)) {
            if (!seen)
                *colour = nf;
            if (i < idx)
                (*marker)++;
        }
    }
    return fam;
}

#define LABEL_COLS 32            /* option columns in one label, at most */
#define LABEL_LEN 64             /* characters of a label */

/* Short name of an option in a label: the first letter of each '_'-separated word ("bits"
 * b, "s" s, "n_b" nb, "group_size" gs). */
static void opt_abbrev(const char *name, char *out, size_t cap)
{
    size_t n = 0;
    for (const char *p = name; *p && n + 1 < cap; p++)
        if (p == name || p[-1] == '_')
            if (*p != '_')
                out[n++] = *p;
    out[n] = 0;
}

/* The option columns that label the cells of `codec` in dataset ds, in cells.csv order:
 * those the codec's finished cells of the dataset set to two or more values (swept), and
 * those some of them set off both the codec's default and the dataset's most common value
 * (col_mode). Options every cell of the codec shares with the dataset are left out. */
static int label_cols(const struct fk_plot_store *st, const char *ds, const char *codec, int *cols,
                      int *n_cols)
{
    const struct fk_codec_ops *ops = fk_codec_find(codec);
    void *def = ops ? calloc(1, ops->opts_size) : NULL;
    if (ops && !def)
        return fk_err(FK_ENOMEM, "out of memory");
    if (def)
        fk_opts_defaults(ops, def);
    *n_cols = 0;
    for (int j = st->col_first_opt; j < st->col_end_opt && *n_cols < LABEL_COLS; j++) {
        if (!strcmp(st->cells->head[j], "evict"))
            continue; /* the series' name says it (CODEC+POLICY) */
        const struct fk_option *o = ops ? fk_codec_option(ops, st->cells->head[j]) : NULL;
        char dv[64] = "";
        if (o)
            fk_opts_format(def, o, dv, sizeof dv);
        const char *first = NULL, *mode = NULL;
        int swept = 0, off = 0, mode_known = 0;
        for (int i = 0; i < st->n && !swept && !off; i++) {
            const struct cell *c = &st->c[i];
            const char *v = st->cells->rows[c->row][j];
            if (strcmp(c->dataset, ds) || strcmp(c->codec, codec) || !v[0])
                continue;
            if (!first)
                first = v;
            swept = strcmp(first, v) != 0;
            if (!o || strcmp(v, dv)) {
                if (!mode_known)
                    mode = col_mode(st, ds, j);
                mode_known = 1;
                off = mode && strcmp(v, mode);
            }
        }
        if (swept || off)
            cols[(*n_cols)++] = j;
    }
    free(def);
    return FK_OK;
}

/* The label of a cell from its label columns: abbreviation and value, joined by spaces,
 * e.g. "b2 g32", "s8", "nb16"; a value that is not a number follows an '=' ("c=fp16"); two
 * columns with the same abbreviation are written as name=value ("bits=2 block=16"). ""
 * when the codec has no label column (its one setting on the dataset). */
static void cell_label(const struct fk_plot_store *st, const struct cell *c, const int *cols, int n,
                       char *out, size_t cap)
{
    size_t len = 0;
    out[0] = 0;
    for (int k = 0; k < n && len + 1 < cap; k++) {
        const char *name = st->cells->head[cols[k]];
        const char *v = st->cells->rows[c->row][cols[k]];
        if (!v[0])
            continue;
        char ab[64], ab2[64];
        opt_abbrev(name, ab, sizeof ab);
        int clash = 0;
        for (int q = 0; q < n && !clash; q++) {
            opt_abbrev(st->cells->head[cols[q]], ab2, sizeof ab2);
            clash = q != k && !strcmp(ab, ab2);
        }
        char *end;
        strtod(v, &end);
        int num = end != v && !*end;
        len += (size_t)snprintf(out + len, cap - len, "%s%s%s%s", len ? " " : "",
                                clash ? name : ab, num && !clash ? "" : "=", v);
        if (len >= cap)
            len = cap - 1;
    }
}

/* The fp16 level of a dataset in bytes per token per KV head: 4 x head_dim (K and V, 2
 * bytes per element), from the first cell with bytes_tok_head and bits_per_elem
 * (head_dim = bytes_tok_head x 8 / (2 bits_per_elem)); NaN when none has both. */
static double fp16_level(const struct fk_plot_store *st, const char *ds)
{
    for (int i = 0; i < st->n; i++) {
        const struct cell *c = &st->c[i];
        double x = cnum(st, c, "bytes_tok_head"), b = cnum(st, c, "bits_per_elem");
        if (!strcmp(c->dataset, ds) && isfinite(x) && isfinite(b) && x > 0 && b > 0)
            return 16 * x / b;
    }
    return NAN;
}

/* One fidelity metric of the cross-family Pareto figures. */
struct pmetric {
    const char *stem;            /* figure name (".<dataset>" appended when several) */
    const char *col;             /* cells.csv column of y */
    const char *key;             /* `metric` of plots/pareto_head.gp */
    const char *what;            /* y in words */
    const char *why;             /* likely reason when no cell has it */
    int higher;                  /* 1: higher is better (else lower) */
    int logy;                    /* log y: cells with y <= 0 are left out */
};

static const struct pmetric pmetrics[] = {
    {"pareto_head_cos", "attn_cos", "cos", "attention-output cosine",
     " (attention off, or traces without queries)", 1, 0},
    {"pareto_head_kl", "attn_kl", "kl", "attention KL(P || P_hat)",
     " (attention off, or traces without queries)", 0, 1},
    {"pareto_head_err", "rel_err_mean", "err", "relative reconstruction error", "", 0, 1},
    /* defined under eviction too (docs/RESULTS.md), where attn_kl is empty */
    {"pareto_head_rkl", "attn_rkl", "rkl", "attention reverse KL(P_hat || P)",
     " (attention off, or traces without queries)", 0, 1},
    {"pareto_head_mass", "attn_retained", "mass", "retained attention mass",
     " (attention off, or traces without queries)", 1, 0},
    /* closed loop (model datasets only: drawn when the dataset has the column) */
    {"pareto_head_e2e", "e2e_kl", "e2e", "end-to-end next-token KL(P_exact || P_codec)", "",
     0, 1},
};

/* A point of a cross-family Pareto figure. */
struct ppt {
    const struct cell *c;        /* its cell */
    int codec;                   /* index in the dataset's codec list */
    int order;                   /* sweep position */
    double x, y, bits;           /* bytes_tok_head, the metric, bits_per_elem */
    char label[LABEL_LEN];       /* setting (cell_label) */
};

/* Blocks: codec, then bytes, then sweep order. */
static int ppt_cmp_block(const void *a, const void *b)
{
    const struct ppt *p = a, *q = b;
    if (p->codec != q->codec)
        return p->codec - q->codec;
    if (p->x != q->x)
        return p->x < q->x ? -1 : 1;
    return p->order - q->order;
}

/* Frontier candidates: bytes, then the better value first, then sweep order. */
static int ppt_front(const struct ppt *p, const struct ppt *q, int higher)
{
    if (p->x != q->x)
        return p->x < q->x ? -1 : 1;
    if (p->y != q->y)
        return (p->y > q->y) == higher ? -1 : 1;
    return p->order - q->order;
}
static int ppt_cmp_front_hi(const void *a, const void *b) { return ppt_front(a, b, 1); }
static int ppt_cmp_front_lo(const void *a, const void *b) { return ppt_front(a, b, 0); }

static void bpoint(struct fk_sb *b, const struct ppt *p)
{
    bnum(b, p->x);
    bnum(b, p->y);
    bnum(b, p->bits);
    fk_sb_printf(b, " \"%s\" %s %s\n", p->label, p->c->codec, p->c->id);
}

/* Appends name=value (a real number; 0 when not finite) to the figure's -e assignments. */
static void fig_dbl(struct fk_plot_fig *f, const char *name, double value)
{
    size_t n = strlen(f->vars);
    snprintf(f->vars + n, sizeof f->vars - n, "%s=%.9g; ", name, isfinite(value) ? value : 0);
}

/* Starts the data block of codec (the blocks-th, 0-based) and appends its name, family,
 * colour and marker to the figure's word lists (fams[1024], cfam[256], cpt[256]). */
static void block_start(struct fk_sb *b, const char *codec, int blocks, char *names,
                        char *fams, char *cfam, char *cpt)
{
    int colour, marker;
    const char *fam = family_style(codec, &colour, &marker);
    fk_sb_printf(b, "%s# codec %s (family %s)\n", blocks ? "\n\n" : "", codec, fam);
    const char *sep = blocks ? " " : "";
    size_t n = strlen(names);
    snprintf(names + n, 1024 - n, "%s%s", sep, codec);
    n = strlen(fams);
    snprintf(fams + n, 1024 - n, "%s%s", sep, fam);
    n = strlen(cfam);
    snprintf(cfam + n, 256 - n, "%s%d", sep, colour);
    n = strlen(cpt);
    snprintf(cpt + n, 256 - n, "%s%d", sep, marker);
}

/* The points of dataset ds for metric m (ppt_cmp_block order): *np points, *n_x cells with
 * bytes, *n_y of them with the metric, *n_zero left out for y <= 0 on a log axis. */
static int pareto_points(const struct fk_plot_store *st, const char *ds, const struct pmetric *m,
                         const char *const *cod, int nc, struct ppt *pt, int *np, int *n_x,
                         int *n_y, int *n_zero)
{
    *np = *n_x = *n_y = *n_zero = 0;
    for (int i = 0; i < nc; i++) {
        int cols[LABEL_COLS], ncol = 0;
        FK_TRY(label_cols(st, ds, cod[i], cols, &ncol));
        for (int j = 0; j < st->n; j++) {
            const struct cell *c = &st->c[j];
            if (strcmp(c->dataset, ds) || strcmp(c->codec, cod[i]))
                continue;
            double x = cnum(st, c, "bytes_tok_head"), y = cnum(st, c, m->col);
            if (!isfinite(x))
                continue;
            (*n_x)++;
            if (!isfinite(y))
                continue;
            (*n_y)++;
            if (m->logy && y <= 0) {
                (*n_zero)++;
                continue;
            }
            struct ppt *p = &pt[(*np)++];
            *p = (struct ppt){.c = c, .codec = i, .order = j, .x = x, .y = y,
                              .bits = cnum(st, c, "bits_per_elem")};
            cell_label(st, c, cols, ncol, p->label, sizeof p->label);
        }
    }
    qsort(pt, (size_t)*np, sizeof *pt, ppt_cmp_block);
    return FK_OK;
}

/* The cross-family Pareto figure of metric m on dataset ds: bytes per token per KV head
 * (x) vs m (y) of every finished cell, one block per codec, then the frontier. */
static int pareto_head(struct fk_plot_store *st, struct fk_plot_set *set, const char *ds,
                       const struct pmetric *m)
{
    struct fk_plot_fig *f = fig_add(set, m->stem, ds, st->n_ds, "pareto_head");
    if (!f)
        return fk_err(FK_ENOMEM, "out of memory");
    snprintf(f->script, sizeof f->script, "pareto_head.gp");    /* one script, three metrics */
    if (fk_csv_col(st->cells, "bytes_tok_head") < 0) {
        fig_skip(f, "cells.csv has no bytes_tok_head column (written by an older fadkv-bench: "
                 "rerun the sweep)");
        return FK_OK;
    }
    const char *cod[64];
    int nc = codecs_in(st, ds, cod, 64), np, n_x, n_y, n_zero;
    struct ppt *pt = malloc(sizeof *pt * (size_t)(st->n ? st->n : 1));
    if (!pt)
        return fk_err(FK_ENOMEM, "out of memory");
    int rc = pareto_points(st, ds, m, cod, nc, pt, &np, &n_x, &n_y, &n_zero);
    if (rc < 0 || !np) {
        free(pt);
        if (rc == FK_OK && !n_x)
            fig_skip(f, "no cell with bytes_tok_head in dataset %s", ds);
        else if (rc == FK_OK && !n_y)
            fig_skip(f, "no cell with %s in dataset %s%s", m->col, ds, m->why);
        else if (rc == FK_OK)
            fig_skip(f, "every cell of dataset %s has %s = 0: nothing to draw on a log scale",
                     ds, m->col);
        return rc;
    }
    double ylo = INFINITY, yhi = -INFINITY;
    for (int i = 0; i < np; i++)
        ylo = fmin(ylo, pt[i].y), yhi = fmax(yhi, pt[i].y);
    if (np > 1 && yhi - ylo <= 1e-12 * fmax(1, fabs(yhi))) { /* one level: no information */
        free(pt);
        fig_skip(f, "every cell of dataset %s has %s = %g: nothing to compare", ds, m->col,
                 yhi);
        return FK_OK;
    }
    int uncounted = 0;
    for (int i = 0; i < np; i++)
        uncounted += cnum(st, pt[i].c, "bytes_uncounted") > 0;
    double fp16 = fp16_level(st, ds), xmax = fp16;
    struct fk_sb b = {0};
    fk_sb_printf(&b, "# Cross-family Pareto, dataset %s: bytes per token per KV head "
                 "(bytes_tok_head: K and V together, mean over layers, end of the trace) vs %s "
                 "(%s), every finished cell; one block per codec (order of `codecs`) by bytes, "
                 "then the Pareto frontier\n# %s\n", ds, m->what, m->col,
                 strcmp(m->key, "e2e") ? "teacher-forced replay: recorded queries, per-layer "
                 "error, no propagation across layers or decode steps" : "closed loop: the "
                 "model decodes from the compressed cache (harness/loop)");
    if (isfinite(fp16))
        fk_sb_printf(&b, "# fp16 level: %.9g bytes (4 x head_dim, 16 bits per element)\n", fp16);
    fk_sb_printf(&b, "# label: options swept within the codec's cells of the dataset or off "
                 "both the codec's default and the dataset's common value\n"
                 "# bytes_tok_head %s bits_per_elem label codec cell\n", m->col);
    char names[1024] = "", fams[1024] = "", cfam[256] = "", cpt[256] = "";
    int blocks = 0;
    for (int i = 0; i < np; i++) {
        if (i == 0 || pt[i].codec != pt[i - 1].codec) {
            block_start(&b, pt[i].c->codec, blocks, names, fams, cfam, cpt);
            blocks++;
        }
        bpoint(&b, &pt[i]);
        if (!(xmax >= pt[i].x))
            xmax = pt[i].x;
    }
    qsort(pt, (size_t)np, sizeof *pt, m->higher ? ppt_cmp_front_hi : ppt_cmp_front_lo);
    fk_sb_printf(&b, "\n\n# Pareto frontier: no other cell has as few bytes and a %s %s\n",
                 m->higher ? "higher" : "lower", m->col);
    double best = NAN;
    for (int i = 0; i < np; i++)
        if (i == 0 || (m->higher ? pt[i].y > best : pt[i].y < best)) {
            bpoint(&b, &pt[i]);
            best = pt[i].y;
        }
    free(pt);
    FK_TRY(fig_data(st, f, &b));
    fig_var(f, "codecs", names);
    fig_var(f, "cfamname", fams);
    fig_var(f, "cfam", cfam);
    fig_var(f, "cpt", cpt);
    fig_var(f, "metric", m->key);
    size_t cl = strlen(f->caption);
    snprintf(f->caption + cl, sizeof f->caption - cl, " Panel: %s (%s).", m->what, m->col);
    fig_num(f, "logy", m->logy);
    fig_dbl(f, "fp16", fp16);
    fig_dbl(f, "xmax", xmax * 1.08);
    char t[768];
    if (n_zero)
        snprintf(t, sizeof t, "%s (%d cell(s) with %s = 0 not shown on the log scale)", ds,
                 n_zero, m->col);
    else
        snprintf(t, sizeof t, "%s", ds);
    accounting_note(uncounted, t, sizeof t);
    fig_text(f, "subtitle", t);
    return FK_OK;
}

/* ---- open loop vs closed loop ------------------------------------------------------------ */

/* 1 when a finished cell of dataset ds ran in the loop (a model dataset). */
static int has_loop(const struct fk_plot_store *st, const char *ds)
{
    if (fk_csv_col(st->cells, "loop_attn_kl") < 0)
        return 0;
    for (int i = 0; i < st->n; i++)
        if (!strcmp(st->c[i].dataset, ds) && isfinite(cnum(st, &st->c[i], "loop_attn_kl")))
            return 1;
    return 0;
}

/* Open loop vs closed loop on dataset ds: each cell's replay attention KL (x, recorded
 * queries on the compressed copy of the exact cache) against the same codec's attention KL in
 * the loop (y, the model decoding from the compressed cache), log-log with the diagonal:
 * points above it are what the replay proxy understates. */
static int loop_gap(struct fk_plot_store *st, struct fk_plot_set *set, const char *ds)
{
    struct fk_plot_fig *f = fig_add(set, "loop_gap", ds, st->n_ds, "loop_gap");
    if (!f)
        return fk_err(FK_ENOMEM, "out of memory");
    static const struct pmetric m = {"loop_gap", "loop_attn_kl", "kl", "", "", 0, 1};
    const char *cod[64];
    int nc = codecs_in(st, ds, cod, 64), np, n_x, n_y, n_zero;
    struct ppt *pt = malloc(sizeof *pt * (size_t)(st->n ? st->n : 1));
    if (!pt)
        return fk_err(FK_ENOMEM, "out of memory");
    int rc = pareto_points(st, ds, &m, cod, nc, pt, &np, &n_x, &n_y, &n_zero);
    int k = 0;
    for (int i = 0; rc == FK_OK && i < np; i++) { /* x: the open-loop attention KL */
        pt[i].x = cnum(st, pt[i].c, "attn_kl");
        if (pt[i].x > 0)
            pt[k++] = pt[i];
    }
    if (rc < 0 || k == 0) {
        free(pt);
        if (rc == FK_OK)
            fig_skip(f, "no cell of dataset %s has attn_kl > 0 and loop_attn_kl > 0 (attention "
                     "off, or only the full cache)", ds);
        return rc;
    }
    struct fk_sb b = {0};
    fk_sb_printf(&b, "# Open loop vs closed loop, dataset %s: attention KL of the replay "
                 "(attn_kl: recorded queries, compressed copy of the exact cache) vs in the loop "
                 "(loop_attn_kl: the model decodes from the compressed cache; both mean over "
                 "steps with a compressed row, heads, layers, prompts); one block per codec\n"
                 "# attn_kl loop_attn_kl bits_per_elem label codec cell\n", ds);
    char names[1024] = "", fams[1024] = "", cfam[256] = "", cpt[256] = "";
    double lo = INFINITY, hi = 0;
    for (int i = 0; i < k; i++) {
        if (i == 0 || pt[i].codec != pt[i - 1].codec)
            block_start(&b, pt[i].c->codec, i, names, fams, cfam, cpt);
        bpoint(&b, &pt[i]);
        double a = pt[i].x < pt[i].y ? pt[i].x : pt[i].y, z = pt[i].x > pt[i].y ? pt[i].x : pt[i].y;
        lo = a < lo ? a : lo;
        hi = z > hi ? z : hi;
    }
    free(pt);
    FK_TRY(fig_data(st, f, &b));
    fig_var(f, "codecs", names);
    fig_var(f, "cfam", cfam);
    fig_var(f, "cpt", cpt);
    fig_dbl(f, "lo", lo / 1.5);
    fig_dbl(f, "hi", hi * 1.5);
    fig_text(f, "subtitle", ds);
    return FK_OK;
}

/* ---- equal-budget table ------------------------------------------------------------------ */

#define BUDGET_SLACK 1.10        /* "about b bits": bits_per_elem <= b x BUDGET_SLACK */
#define AUTO_BUDGETS 5           /* budgets chosen from the cells, at most */

int fk_plot_budgets_parse(const char *text, double *budgets, int *n)
{
    *n = 0;
    for (const char *p = text; *p;) {
        char *end;
        double b = strtod(p, &end);
        int len = (int)strcspn(p, ",");
        if (end == p || (*end && *end != ',') || !(b > 0 && b <= 64))
            return fk_err(FK_EINVAL, "'%.*s' in '%s': a budget is a number of bits per "
                          "element in (0, 64]", len, p, text);
        if (*n == FK_PLOT_MAX_BUDGETS)
            return fk_err(FK_EINVAL, "'%s': at most %d budgets", text, FK_PLOT_MAX_BUDGETS);
        int i = *n;
        while (i > 0 && budgets[i - 1] > b) /* ascending */
            budgets[i] = budgets[i - 1], i--;
        if (i > 0 && budgets[i - 1] == b) {
            for (; i < *n; i++)
                budgets[i] = budgets[i + 1];
            return fk_err(FK_EINVAL, "'%s': budget %g is given twice", text, b);
        }
        budgets[i] = b;
        (*n)++;
        p = *end ? end + 1 : end;
    }
    return *n ? FK_OK : fk_err(FK_EINVAL, "'%s': no budget", text);
}

/* The budgets of dataset ds from its cells: every codec's smallest finite bits_per_elem,
 * rounded up to a tenth (so that the codec's cell is within it), distinct and ascending;
 * past AUTO_BUDGETS, that many spread from the smallest to the largest. Every codec
 * with bits_per_elem has a row within the largest. Returns their number (0: none). */
static int budgets_of(const struct fk_plot_store *st, const char *ds, double *out)
{
    double v[64];
    int n = 0;
    const char *cod[64];
    int nc = codecs_in((struct fk_plot_store *)st, ds, cod, 64);
    for (int k = 0; k < nc; k++) {
        double lo = INFINITY;
        for (int i = 0; i < st->n; i++)
            if (!strcmp(st->c[i].dataset, ds) && !strcmp(st->c[i].codec, cod[k]))
                lo = fmin(lo, cnum(st, &st->c[i], "bits_per_elem"));
        if (!isfinite(lo))
            continue;
        double b = ceil(lo * 10 - 1e-9) / 10;
        int i = n;
        while (i > 0 && v[i - 1] > b)
            v[i] = v[i - 1], i--;
        if (i > 0 && v[i - 1] == b) {
            for (; i < n; i++)
                v[i] = v[i + 1];
            continue;
        }
        v[i] = b;
        n++;
    }
    if (n <= AUTO_BUDGETS) {
        memcpy(out, v, sizeof(double) * (size_t)n);
        return n;
    }
    for (int k = 0; k < AUTO_BUDGETS; k++)
        out[k] = v[(size_t)k * (size_t)(n - 1) / (AUTO_BUDGETS - 1)];
    return AUTO_BUDGETS;
}

/* The best cell of codec in dataset ds within a budget of bits per element: among its
 * finished cells with bits_per_elem <= budget x BUDGET_SLACK, the highest attn_cos (ties:
 * fewer bits, then sweep order); when none of them has attn_cos, the lowest rel_err_mean
 * (same ties); when none has either, the fewest bits. *by names the column ranked. NULL when
 * no cell is within the budget. */
static const struct cell *budget_best(const struct fk_plot_store *st, const char *ds,
                                      const char *codec, double budget, const char **by)
{
    static const struct {
        const char *col;
        int higher;
    } rank[] = {{"attn_cos", 1}, {"rel_err_mean", 0}, {"bits_per_elem", 0}};
    for (size_t r = 0; r < sizeof rank / sizeof rank[0]; r++) {
        const struct cell *best = NULL;
        double bv = NAN, bb = NAN;
        for (int i = 0; i < st->n; i++) {
            const struct cell *c = &st->c[i];
            if (strcmp(c->dataset, ds) || strcmp(c->codec, codec))
                continue;
            double bits = cnum(st, c, "bits_per_elem"), v = cnum(st, c, rank[r].col);
            if (!(bits <= budget * BUDGET_SLACK) || !isfinite(v))
                continue;
            if (!best || (rank[r].higher ? v > bv : v < bv) || (v == bv && bits < bb)) {
                best = c;
                bv = v;
                bb = bits;
            }
        }
        if (best) {
            *by = rank[r].col;
            return best;
        }
    }
    return NULL;
}

/* Text in a LaTeX table cell. */
static void tex_text(struct fk_sb *b, const char *s)
{
    for (; *s; s++) {
        if (strchr("&%$#_{}", *s))
            fk_sb_printf(b, "\\%c", *s);
        else if (*s == '~')
            fk_sb_printf(b, "\\textasciitilde{}");
        else if (*s == '^')
            fk_sb_printf(b, "\\textasciicircum{}");
        else if (*s == '\\')
            fk_sb_printf(b, "\\textbackslash{}");
        else
            fk_sb_printf(b, "%c", *s);
    }
}

/* One number of the equal-budget table ("—" / "---" when missing). */
static void bt_num(struct fk_sb *md, struct fk_sb *tex, const char *fmt, double v)
{
    char a[64];
    if (!isfinite(v)) {
        fk_sb_printf(md, " — |");
        fk_sb_printf(tex, " & ---");
        return;
    }
    snprintf(a, sizeof a, fmt, v);
    fk_sb_printf(md, " %s |", a);
    fk_sb_printf(tex, " & $%s$", a);
}

/* One row of the equal-budget table: codec within budget on dataset ds. */
static int budget_row(const struct fk_plot_store *st, const char *ds, const char *codec,
                      double budget, struct fk_sb *md, struct fk_sb *tex)
{
    int colour, marker;
    const char *fam = family_style(codec, &colour, &marker), *by = NULL;
    const struct cell *c = budget_best(st, ds, codec, budget, &by);
    fk_sb_printf(md, "| %g | %s | %s |", budget, codec_display(st, codec), fam);
    fk_sb_printf(tex, "%g & ", budget);
    tex_text(tex, codec_display(st, codec));
    fk_sb_printf(tex, " & ");
    tex_text(tex, fam);
    if (!c) {
        fk_sb_printf(md, " — | — | — | — | — | — | — |\n");
        fk_sb_printf(tex, " & --- & --- & --- & --- & --- & --- \\\\\n");
        return FK_OK;
    }
    int cols[LABEL_COLS], ncol = 0;
    char label[LABEL_LEN];
    FK_TRY(label_cols(st, ds, codec, cols, &ncol));
    cell_label(st, c, cols, ncol, label, sizeof label);
    if (!label[0])
        snprintf(label, sizeof label, "(one setting)");
    if (cnum(st, c, "bytes_uncounted") > 0) /* the paper's accounting: said on the row */
        snprintf(label + strlen(label), sizeof label - strlen(label), " †");
    fk_sb_printf(md, " %s |", label);
    fk_sb_printf(tex, " & ");
    tex_text(tex, label);
    bt_num(md, tex, "%.2f", cnum(st, c, "bits_per_elem"));
    bt_num(md, tex, "%.5f", cnum(st, c, "attn_cos"));
    bt_num(md, tex, "%.3g", cnum(st, c, "attn_kl"));
    bt_num(md, tex, "%.4f", cnum(st, c, "rel_err_mean"));
    fk_sb_printf(md, " %s | %s |\n", by, c->id);
    fk_sb_printf(tex, " & ");
    tex_text(tex, by);
    fk_sb_printf(tex, " \\\\\n");
    return FK_OK;
}

/* The equal-budget table of every dataset: out_dir/table_budget.md and .tex. */
static int budget_table(struct fk_plot_store *st, struct fk_plot_set *set, const char *out_dir)
{
    struct fk_sb md = {0}, tex = {0};
    int tables = 0, rc = FK_OK;
    fk_sb_printf(&md, "<!-- Equal-budget table (best setting of each codec within a budget of "
                 "bits per element); generated by `fadkv-bench plot` from %s -->\n", st->dir);
    fk_sb_printf(&tex, "%% Equal-budget table (best setting of each codec within a budget of "
                 "bits per element); generated by fadkv-bench plot\n");
    for (int d = 0; d < st->n_ds && rc == FK_OK; d++) {
        const char *ds = st->datasets[d];
        int any = 0;
        for (int i = 0; i < st->n && !any; i++)
            any = !strcmp(st->c[i].dataset, ds) && isfinite(cnum(st, &st->c[i], "bits_per_elem"));
        fk_sb_printf(&md, "\n### Dataset %s\n\n", ds);
        if (!any) {
            fk_sb_printf(&md, "No cell of this dataset has bits_per_elem (results written by "
                         "an older fadkv-bench: rerun the sweep).\n");
            fk_sb_printf(&tex, "\n%% dataset %s: no cell has bits_per_elem\n", ds);
            continue;
        }
        tables++;
        double budgets[FK_PLOT_MAX_BUDGETS];
        int nb = st->n_budgets;
        if (nb)
            memcpy(budgets, st->budgets, sizeof(double) * (size_t)nb);
        else
            nb = budgets_of(st, ds, budgets);
        fk_sb_printf(&md, "Budgets, bits per element: ");
        for (int k = 0; k < nb; k++)
            fk_sb_printf(&md, "%s%g", k ? ", " : "", budgets[k]);
        fk_sb_printf(&md, " (%s). A codec's row: its best cell with bits/elem <= %.2f x the "
                     "budget.\n\n", st->n_budgets ? st->budgets_from
                                                 : "from the cells: every codec's smallest "
                                                   "bits/elem, rounded up to a tenth",
                     BUDGET_SLACK);
        int uncounted = 0;
        for (int i = 0; i < st->n; i++)
            uncounted += !strcmp(st->c[i].dataset, ds) &&
                         cnum(st, &st->c[i], "bytes_uncounted") > 0;
        fk_sb_printf(&md, "| Budget (bits/elem) | Method | Family | Setting | Bits/elem | "
                     "Attn cos | Attn KL | Rel. error | Chosen by | Cell |\n"
                     "|---:|---|---|---|---:|---:|---:|---:|---|---|\n");
        fk_sb_printf(&tex, "\n\\begin{tabular}{rlllrrrrl}\n\\hline\n\\multicolumn{9}{l}{Dataset ");
        tex_text(&tex, ds);
        fk_sb_printf(&tex, "} \\\\\n\\hline\nBudget & Method & Family & Setting & Bits/elem & "
                     "Attn cos & Attn KL & Rel.\\ error & Chosen by \\\\\n\\hline\n");
        const char *cod[64];
        int nc = codecs_in(st, ds, cod, 64);
        for (int k = 0; k < nb && rc == FK_OK; k++) {
            for (int i = 0; i < nc && rc == FK_OK; i++)
                rc = budget_row(st, ds, cod[i], budgets[k], &md, &tex);
            fk_sb_printf(&tex, "\\hline\n");
        }
        fk_sb_printf(&tex, "\\end{tabular}\n");
        if (uncounted)
            fk_sb_printf(&md, "\n† %d cell(s) of this dataset use the paper's accounting "
                         "(fadkv mem_mode = paper): their replaced atoms and the activity "
                         "state count as free (bytes_uncounted), so their bits/elem are below "
                         "what a sequence holds.\n", uncounted);
    }
    fk_sb_printf(&md, "\nBudget b: a codec's finished cells of the dataset with bits_per_elem "
                 "<= %.2f x b (\"about b bits\"; bits_per_elem = bytes_tok_head x 8 / (2 x "
                 "head_dim) at the end of the trace, K and V: codes, per-group metadata, the "
                 "fp16 buffer, appended and replaced atoms and the state their adaptation "
                 "reads; model constants such as the universal dictionary, bytes_model, "
                 "excluded: bits_per_elem_1k shares them among 1,000 sequences; 16 = fp16). "
                 "Best: the highest attn_cos, "
                 "ties to fewer bits, then sweep order; a codec none of whose cells within the "
                 "budget has attn_cos (attention off) is ranked by the lowest rel_err_mean "
                 "(\"Chosen by\"). —: no setting of the codec within the budget. Setting: the "
                 "options swept among the codec's cells of the dataset, or set off both the "
                 "codec's default and the dataset's common value. Teacher-forced replay: "
                 "recorded queries, per-layer error, no propagation across layers or decode "
                 "steps.\n", BUDGET_SLACK);
    if (rc < 0 || !tables) {
        free(md.s);
        free(tex.s);
        if (rc == FK_OK)
            snprintf(set->budget_note, sizeof set->budget_note, "no cell has bits_per_elem "
                     "(results written by an older fadkv-bench: rerun the sweep)");
        return rc;
    }
    return table_write(&md, &tex, out_dir, "table_budget", set->budget_md, set->budget_tex,
                       sizeof set->budget_md);
}

/* ---- Table 4 ------------------------------------------------------------------------------ */

/* A per-sequence value of a cell for Table 4 (NaN when not defined). */
static double seq_value(const struct fk_plot_store *st, const struct cell *c, const struct seqv *q,
                        int what, double full_per_token)
{
    (void)st;
    switch (what) {
    case 0:
        return q->vec > 0 ? q->macs / q->vec : NAN;
    case 1:
        return q->vec > 0 ? q->cpu / q->vec : NAN;
    case 2:
        return q->bytes / 1e9;
    case 3:
        return q->bytes_full > 0 ? q->bytes / q->bytes_full * full_per_token : NAN;
    case 4:
        return q->dsn_n ? q->dsn_sum / q->dsn_n : NAN;
    case 5: {
        double k = q->err_n[0] ? q->err_sum[0] / q->err_n[0] : NAN;
        double v = q->err_n[1] ? q->err_sum[1] / q->err_n[1] : NAN;
        return (k + v) / 2;
    }
    default:
        (void)c;
        return NAN;
    }
}

struct t4col {
    const char *head_md;         /* Markdown header (rel: followed by the baseline and ")") */
    const char *head_tex;        /* LaTeX header */
    const char *col;             /* cells.csv column of the headline value */
    double scale;                /* headline multiplier */
    const char *fmt;             /* printf format of value and interval */
    int rel;                     /* relative to the cost baseline */
};

static const struct t4col t4cols[] = {
    {"Cost (MACs, rel. ", "Cost (MACs)", "cost_mac_rel", 1, "%.3f", 1},
    {"CPU time (rel. ", "CPU time", "cpu_time_rel", 1, "%.3f", 1},
    {"KV GB/seq", "KV GB/seq", "bytes_per_seq", 1e-9, "%.5f", 0},
    {"Bytes/token", "Bytes/token", "bytes_per_token", 1, "%.1f", 0},
    {"N_T/N", "$N_T/N$", "dict_size_norm_final", 1, "%.3f", 0},
    {"Rel. error", "Rel.\\ error", "rel_err_mean", 1, "%.4f", 0},
};

static void t4_cell(struct fk_sb *md, struct fk_sb *tex, const struct t4col *col, double v,
                    double half, int tex_only)
{
    char a[64] = "–", h[64] = "";
    if (isfinite(v))
        snprintf(a, sizeof a, col->fmt, v);
    if (isfinite(v) && isfinite(half) && half > 0)
        snprintf(h, sizeof h, col->fmt, half);
    if (!tex_only) {
        if (h[0])
            fk_sb_printf(md, " %s ± %s |", a, h);
        else
            fk_sb_printf(md, " %s |", a);
    }
    if (!isfinite(v))
        fk_sb_printf(tex, " & --");
    else if (h[0])
        fk_sb_printf(tex, " & $%s \\pm %s$", a, h);
    else
        fk_sb_printf(tex, " & $%s$", a);
}

static int table4(struct fk_plot_store *st, struct fk_plot_set *set, const char *out_dir)
{
    struct fk_sb md = {0}, tex = {0};
    int nc = (int)(sizeof t4cols / sizeof t4cols[0]), rows = 0, rc = FK_OK;
    fk_sb_printf(&md, "<!-- Table 4 (decoding cost and KV memory); generated by `fadkv-bench plot` "
                 "from %s -->\n\n| Dataset | Method | Cell |", st->dir);
    fk_sb_printf(&tex, "%% Table 4 (decoding cost and KV memory); generated by fadkv-bench plot\n"
                  "\\begin{tabular}{ll");
    const char *base = st->cost_baseline ? codec_display(st, st->cost_baseline) : "baseline";
    for (int j = 0; j < nc; j++) {
        fk_sb_printf(&md, " %s%s%s |", t4cols[j].head_md, t4cols[j].rel ? base : "",
                     t4cols[j].rel ? ")" : "");
        fk_sb_printf(&tex, "r");
    }
    fk_sb_printf(&md, "\n|---|---|---|");
    fk_sb_printf(&tex, "}\n\\hline\nDataset & Method");
    for (int j = 0; j < nc; j++) {
        fk_sb_printf(&md, "---|");
        fk_sb_printf(&tex, " & %s", t4cols[j].head_tex);
    }
    fk_sb_printf(&md, "\n");
    fk_sb_printf(&tex, " \\\\\n\\hline\n");
    int multi = 0;
    for (int d = 0; d < st->n_ds && rc == FK_OK; d++) {
        const char *ds = st->datasets[d];
        const char *cod[64];
        int n = codecs_in(st, ds, cod, 64);
        for (int i = 0; i < n && rc == FK_OK; i++) {
            struct cell *c = representative(st, ds, cod[i]);
            /* reference for the cost columns: cells.csv's rule (the cost baseline, same
             * dataset and sparsity) */
            struct cell *ref = NULL;
            const char *sv = rstr(st, c, FK_ROLE_SPARSITY);
            for (int j = 0; st->cost_baseline && j < st->n && !ref; j++)
                if (!strcmp(st->c[j].codec, st->cost_baseline) && !strcmp(st->c[j].dataset, ds) &&
                    !strcmp(rstr(st, &st->c[j], FK_ROLE_SPARSITY), sv) && sv[0])
                    ref = &st->c[j];
            double fpt = cnum(st, c, "bytes_full_per_seq") / cnum(st, c, "tokens_per_seq");
            fk_sb_printf(&md, "| %s | %s | %s |", ds, codec_display(st, c->codec), c->id);
            fk_sb_printf(&tex, "%s & %s", ds, codec_display(st, c->codec));
            for (int j = 0; j < nc && rc == FK_OK; j++) {
                double v = cnum(st, c, t4cols[j].col) * t4cols[j].scale, half = NAN;
                if (c->n_seq >= FK_CI_MIN_SEQ) {    /* an interval needs enough sequences */
                    double *x = malloc(sizeof(double) * (size_t)c->n_seq);
                    if (!x) {
                        rc = fk_err(FK_ENOMEM, "out of memory");
                        break;
                    }
                    for (int t = 0; t < c->n_seq; t++) {
                        x[t] = seq_value(st, c, &c->seq[t], j, fpt);
                        if (t4cols[j].rel) {
                            const struct seqv *r = NULL;
                            for (int u = 0; ref && u < ref->n_seq && !r; u++)
                                if (!strcmp(ref->seq[u].trace, c->seq[t].trace))
                                    r = &ref->seq[u];
                            double rv = r ? seq_value(st, ref, r, j, fpt) : NAN;
                            x[t] = rv > 0 ? x[t] / rv : NAN;
                        }
                    }
                    double m, lo, hi;
                    rc = fk_boot_mean_ci(x, c->n_seq, FK_BOOT_RESAMPLES, FK_BOOT_SEED, &m, &lo,
                                         &hi);
                    half = (hi - lo) / 2;
                    multi = 1;
                    free(x);
                }
                t4_cell(&md, &tex, &t4cols[j], v, half, 0);
            }
            fk_sb_printf(&md, "\n");
            fk_sb_printf(&tex, " \\\\\n");
            rows++;
        }
    }
    fk_sb_printf(&tex, "\\hline\n\\end{tabular}\n");
    fk_sb_printf(&md, "\nOne row per (dataset, codec): the representative cell (options closest to "
                 "the dataset's common values). Cost and CPU time are per encoded vector, "
                 "relative to the %s cell of the same dataset and sparsity. Bytes/token and "
                 "GB/seq are replay memory (codes + buffer + appended and replaced atoms and "
                 "the state their adaptation reads; the shared universal dictionary "
                 "excluded). Rel. error: mean over K/V, layers and sequences.%s\n",
            base, multi ? " ± is half the 95% bootstrap interval over sequences (2000 "
                  "resamples), shown for cells with at least " FK_STR(FK_CI_MIN_SEQ)
                  " sequences." : " No ±: no cell has the " FK_STR(FK_CI_MIN_SEQ)
                  " sequences an interval needs.");
    int uncounted = 0;
    for (int i = 0; i < st->n; i++)
        uncounted += cnum(st, &st->c[i], "bytes_uncounted") > 0;
    if (uncounted)
        fk_sb_printf(&md, "\n%d cell(s) use the paper's accounting (fadkv mem_mode = paper): "
                     "their replaced atoms and activity state count as free "
                     "(bytes_uncounted), so their memory is below what a sequence holds.\n",
                     uncounted);
    if (rc < 0 || !rows) {
        free(md.s);
        free(tex.s);
        return rc;
    }
    return table_write(&md, &tex, out_dir, "table4", set->table_md, set->table_tex,
                       sizeof set->table_md);
}

/* ---- entry ------------------------------------------------------------------------------- */

/* ---- the figure catalogue ---------------------------------------------------------------- */

/* The exporters of the catalogue (one signature: the store, the set, the dataset, the row's
 * argument). */
static int ex_fig1(struct fk_plot_store *st, struct fk_plot_set *set, const char *ds,
                   const void *arg)
{
    int (*fig)(struct fk_plot_store *, struct fk_plot_set *, const char *, struct cell *) =
        *(int (*const *)(struct fk_plot_store *, struct fk_plot_set *, const char *,
                          struct cell *))arg;
    return fig(st, set, ds, diag_cell(st, ds));
}

static int ex_ds(struct fk_plot_store *st, struct fk_plot_set *set, const char *ds,
                 const void *arg)
{
    int (*fig)(struct fk_plot_store *, struct fk_plot_set *, const char *) =
        *(int (*const *)(struct fk_plot_store *, struct fk_plot_set *, const char *))arg;
    return fig(st, set, ds);
}

static int ex_fig3_series(struct fk_plot_store *st, struct fk_plot_set *set, const char *ds,
                          const void *arg)
{
    return fig3_series(st, set, ds, *(const int *)arg);
}

static int ex_pareto_head(struct fk_plot_store *st, struct fk_plot_set *set, const char *ds,
                          const void *arg)
{
    const struct pmetric *m = arg;
    if (!strcmp(m->key, "e2e") && !has_loop(st, ds))
        return FK_OK; /* a model dataset's only */
    return pareto_head(st, set, ds, m);
}

static int ex_loop_gap(struct fk_plot_store *st, struct fk_plot_set *set, const char *ds,
                       const void *arg)
{
    (void)arg;
    return has_loop(st, ds) ? loop_gap(st, set, ds) : FK_OK;
}

/* Fig. 3d: one figure per codec with an N x s grid; one note when no codec has one. */
static int ex_fig3d(struct fk_plot_store *st, struct fk_plot_set *set, const char *unused,
                    const void *arg)
{
    (void)unused;
    (void)arg;
    const char *cod[64];
    int n_cod = 0, rc = FK_OK;
    for (int i = 0; i < st->n; i++) {
        int seen = 0;
        for (int j = 0; j < n_cod; j++)
            seen |= !strcmp(cod[j], st->c[i].codec);
        if (!seen && n_cod < 64)
            cod[n_cod++] = st->c[i].codec;
    }
    int first3d = set->n_figs, drawn3d = 0;
    for (int i = 0; i < n_cod && rc == FK_OK; i++)
        rc = fig3d(st, set, cod[i]);
    for (int i = first3d; i < set->n_figs; i++)
        drawn3d += !set->figs[i].note[0];
    int k3d = first3d;
    for (int i = first3d; rc == FK_OK && i < set->n_figs; i++) {
        if (set->figs[i].note[0] && (drawn3d || k3d > first3d))
            continue;
        if (set->figs[i].note[0]) {
            /* the note of a codec whose cells vary one option (or two, not together), else
             * the general one */
            const char *why = NULL;
            for (int j = first3d; j < set->n_figs && !why; j++)
                if (!strncmp(set->figs[j].note, "only ", 5) ||
                    strstr(set->figs[j].note, "not together"))
                    why = set->figs[j].note;
            char note[sizeof set->figs[i].note];
            snprintf(note, sizeof note, "%s", why ? why : "no codec has cells varying the "
                     "dictionary (N) or s, or any two options, on the same traces");
            snprintf(set->figs[i].name, sizeof set->figs[i].name, "fig3d_N_s");
            snprintf(set->figs[i].note, sizeof set->figs[i].note, "%s", note);
        }
        if (k3d != i)
            set->figs[k3d] = set->figs[i];
        k3d++;
    }
    if (rc == FK_OK)
        set->n_figs = k3d;
    return rc;
}

static int (*const f1a)(struct fk_plot_store *, struct fk_plot_set *, const char *,
                        struct cell *) = fig1a;
static int (*const f1b)(struct fk_plot_store *, struct fk_plot_set *, const char *,
                        struct cell *) = fig1b;
static int (*const f1c)(struct fk_plot_store *, struct fk_plot_set *, const char *,
                        struct cell *) = fig1c;
static int (*const f1d)(struct fk_plot_store *, struct fk_plot_set *, const char *) = fig1d;
static int (*const f3c)(struct fk_plot_store *, struct fk_plot_set *, const char *) = fig3c;
static int (*const fpareto)(struct fk_plot_store *, struct fk_plot_set *, const char *) = pareto;
static const int series_err = 1, series_dict = 0;

/* The caption of the cross-family Pareto panels (pareto_head adds the panel's metric). */
#define PARETO_HEAD                                                                       \
    "The equal-memory comparison across families: bytes per token per KV head (top axis: " \
    "bits per element; dotted: fp16) against the panel's quality metric, every cell of "  \
    "every codec; dashed: the Pareto frontier. Teacher-forced replay."

const struct fk_plot_kind fk_plot_catalogue[] = {
    {"fig1a_recall", FK_SCOPE_DATASET, "a dictionary codec cell with recall = true",
     "Paper Fig. 1a: the share of full OMP's atoms (sparsity s, base dictionary) that rank "
     "in the top n by |D^T x|, keys and values, against the pool size n; band: 95% interval "
     "over sequences.",
     ex_fig1, &f1a},
    {"fig1b_corr", FK_SCOPE_DATASET, "a dictionary codec cell",
     "Paper Fig. 1b: the sorted correlations |D^T x| / max of the top atoms, mean over "
     "streams, band 10-90%: how concentrated a vector's correlations are.",
     ex_fig1, &f1b},
    {"fig1c_inactive", FK_SCOPE_DATASET, "a dictionary codec cell with coded prefill",
     "Paper Fig. 1c: the share of the base atoms no prefill code used, per layer, keys and "
     "values: the room FAD-KV's replacement has.",
     ex_fig1, &f1c},
    {"fig1d_overlap", FK_SCOPE_DATASET, "dictionary codec cells on two or more traces",
     "Paper Fig. 1d: the Jaccard overlap of the inactive atom sets between prompts, one bar "
     "per codec: whether inactivity is a property of the dictionary or of the prompt.",
     ex_ds, &f1d},
    {"fig3a_dict_size", FK_SCOPE_DATASET, "dictionary codec cells",
     "Paper Fig. 3a: dictionary size N_t / N against the decode step, one line per codec "
     "(append codecs grow, FAD-KV stays at 1).",
     ex_fig3_series, &series_dict},
    {"fig3b_err_steps", FK_SCOPE_DATASET, "cells with decode-time coding",
     "Paper Fig. 3b: the relative error of the vectors coded in each bin of decode steps, one "
     "line per codec: how the error evolves as the decode goes on.",
     ex_fig3_series, &series_err},
    {"fig3c_tau_delta", FK_SCOPE_DATASET, "FAD-KV cells varying tau_c and (delta_k, delta_v)",
     "Paper Fig. 3c: FAD-KV's encode-time error, error with the final dictionary and "
     "attention KL over the coherence threshold tau_c (x) and the error thresholds "
     "delta_k/delta_v (y).",
     ex_ds, &f3c},
    {"fig3c_tau_delta_e2e", FK_SCOPE_DATASET, "a model dataset (closed loop)",
     "Paper Fig. 3c in the closed loop: replay attention KL, attention KL in the loop and "
     "end-to-end next-token KL on the same squares.",
     NULL, NULL},
    {"fig3d_N_s", FK_SCOPE_CODEC, "a codec's cells varying N and s (or two options)",
     "Paper Fig. 3d: the same heatmap over the dictionary size N and the sparsity s, or over "
     "the two options the codec's cells vary together.",
     ex_fig3d, NULL},
    {"pareto_bytes_kl", FK_SCOPE_DATASET, "cells with attention",
     "KV memory per token (every byte a sequence needs) against attention KL, every cell "
     "labelled with its setting; dashed: the Pareto front.",
     ex_ds, &fpareto},
    {"pareto_head_cos", FK_SCOPE_DATASET, "cells with attention",
     PARETO_HEAD,
     ex_pareto_head, &pmetrics[0]},
    {"pareto_head_kl", FK_SCOPE_DATASET, "cells with attention",
     PARETO_HEAD,
     ex_pareto_head, &pmetrics[1]},
    {"pareto_head_err", FK_SCOPE_DATASET, "cells with bytes_tok_head",
     PARETO_HEAD,
     ex_pareto_head, &pmetrics[2]},
    {"pareto_head_rkl", FK_SCOPE_DATASET, "cells with attention",
     PARETO_HEAD,
     ex_pareto_head, &pmetrics[3]},
    {"pareto_head_mass", FK_SCOPE_DATASET, "cells with attention and an eviction policy",
     PARETO_HEAD,
     ex_pareto_head, &pmetrics[4]},
    {"pareto_head_e2e", FK_SCOPE_DATASET, "a model dataset (closed loop)",
     PARETO_HEAD,
     ex_pareto_head, &pmetrics[5]},
    {"loop_gap", FK_SCOPE_DATASET, "a model dataset (closed loop)",
     "Open loop against closed loop: each cell's replay attention KL (x) against its "
     "attention KL with the model in the loop (y); points above the diagonal are what the "
     "replay understates.",
     ex_loop_gap, NULL},
    {NULL, FK_SCOPE_DATASET, NULL, NULL, NULL, NULL},
};
#undef PARETO_HEAD

const struct fk_plot_kind *fk_plot_kind_of(const char *stem)
{
    for (const struct fk_plot_kind *k = fk_plot_catalogue; k->stem; k++)
        if (!strcmp(k->stem, stem))
            return k;
    return NULL;
}


int fk_plotdata_export(const char *results_dir, const char *out_dir,
                       const struct fk_plot_opts *opts, struct fk_plot_set *set)
{
    memset(set, 0, sizeof *set);
    char *data_dir;
    FK_TRY(fk_store_path(&data_dir, out_dir, "data"));
    int rc = fk_store_mkdir_p(data_dir);
    if (rc < 0) {
        free(data_dir);
        return rc;
    }
    struct fk_plot_store st;
    rc = store_load(&st, results_dir, data_dir);
    st.titles = opts ? opts->titles : NULL;
    st.budgets = opts ? opts->budgets : NULL;
    st.n_budgets = opts ? opts->n_budgets : 0;
    st.budgets_from = opts && opts->budgets_from ? opts->budgets_from : "given";
    st.cost_baseline = opts && opts->cost_baseline ? opts->cost_baseline
                       : st.fs ? fk_store_cost_baseline(st.fs) : NULL;
    if (!st.cost_baseline && opts)
        st.cost_baseline = opts->default_cost_baseline;
    set->n_cells = st.n;
    set->n_datasets = st.n_ds;
    /* every figure of the catalogue, in its order: per dataset, or per codec */
    for (const struct fk_plot_kind *k = fk_plot_catalogue; k->stem && rc == FK_OK; k++) {
        if (!k->export)
            continue; /* drawn by another row's exporter */
        if (k->scope == FK_SCOPE_CODEC) {
            rc = k->export(&st, set, NULL, k->arg);
            continue;
        }
        for (int d = 0; d < st.n_ds && rc == FK_OK; d++)
            rc = k->export(&st, set, st.datasets[d], k->arg);
    }
    if (rc == FK_OK)
        rc = table4(&st, set, out_dir);
    if (rc == FK_OK)
        rc = budget_table(&st, set, out_dir);
    store_free(&st);
    free(data_dir);
    if (rc < 0)
        fk_plotdata_free(set);
    return rc;
}

void fk_plotdata_free(struct fk_plot_set *set)
{
    free(set->figs);
    memset(set, 0, sizeof *set);
}

/* ---- codec display names ------------------------------------------------------------------ */

/* Reads a quoted gnuplot string at *p ('...', '' is a quote) into out. */
static int gp_string(const char **p, char *out, size_t cap)
{
    const char *q = *p;
    if (*q != '\'')
        return -1;
    size_t n = 0;
    for (q++; *q; q++) {
        if (*q == '\'' && q[1] == '\'')
            q++;
        else if (*q == '\'')
            break;
        if (n + 1 < cap)
            out[n++] = *q;
    }
    if (*q != '\'')
        return -1;
    out[n] = 0;
    *p = q + 1;
    return 0;
}

int fk_plot_titles_load(const char *path, struct fk_plot_titles *t)
{
    memset(t, 0, sizeof *t);
    char *text = fk_slurp(path, NULL);
    if (!text)
        return fk_err(FK_EIO, "%s: cannot read (%s)", path, strerror(errno));
    /* the definition "ctitle(c) = c eq 'name' ? 'Title' : ... : c", continued by '\' */
    const char *d = strstr(text, "\nctitle(c)");
    if (!d) {
        free(text);
        return fk_err(FK_ECORRUPT, "%s: no ctitle(c) definition", path);
    }
    struct fk_sb def = {0};
    for (const char *p = d + 1; *p; p++) {
        if (*p == '\\' && p[1] == '\n') {
            p++;
            continue;
        }
        if (*p == '\n')
            break;
        fk_sb_printf(&def, "%c", *p);
    }
    free(text);
    int rc = def.oom || !def.s ? fk_err(FK_ENOMEM, "out of memory") : FK_OK;
    for (const char *p = def.s; rc == FK_OK && (p = strstr(p, "eq ")) && t->n < FK_PLOT_MAX_TITLES;) {
        p += 3;
        if (gp_string(&p, t->name[t->n], sizeof t->name[0]) < 0)
            break;
        while (*p == ' ')
            p++;
        if (*p++ != '?')
            break;
        while (*p == ' ')
            p++;
        if (gp_string(&p, t->title[t->n], sizeof t->title[0]) < 0)
            break;
        t->n++;
    }
    if (rc == FK_OK && !t->n)
        rc = fk_err(FK_ECORRUPT, "%s: ctitle(c) maps no codec to a title", path);
    fk_sb_free(&def);
    return rc;
}
