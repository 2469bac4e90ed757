/* SPDX-License-Identifier: MIT
 * General figures: a metric against a swept option, and a heatmap over two swept options
 * (see fk_plotgen.h). Cells are cells.csv rows with status ok; options are cells.csv's
 * option columns, plus "codec" and "dataset" for --by.
 */
#include "report/fk_plotgen.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fk_err.h"
#include "common/fk_str.h"
#include "store/fk_metrics.h"
#include "store/fk_results.h"

#define MAX_VALUES 256           /* distinct values of one axis or lines of one figure */

/* The selected cells of a results directory and the summary.csv rows of each. */
struct sel {
    struct fk_store *fs;
    const struct fk_csv *t;      /* cells.csv */
    const struct fk_csv *s;      /* summary.csv */
    int *rows;                   /* [n] selected cells.csv rows, sweep order */
    int n;
    int *first;                  /* [t->n_rows] first summary row of the cell, or -1 */
    int *next;                   /* [s->n_rows] next summary row of the same cell, or -1 */
    const struct fk_plot_titles *titles;
};

static void sel_free(struct sel *q)
{
    free(q->rows);
    free(q->first);
    free(q->next);
    fk_store_close(&q->fs);
}

static const char *field(const struct sel *q, int row, int col)
{
    return fk_csv_str(q->t, row, col);
}

/* The column of an option ("codec" and "dataset" included), or -1. */
static int opt_col(const struct sel *q, const char *name)
{
    if (!strcmp(name, "codec"))
        return q->fs->c_codec;
    if (!strcmp(name, "dataset"))
        return q->fs->c_dataset;
    for (int j = q->fs->c_first_opt; j < q->fs->c_end_opt; j++)
        if (!strcmp(q->t->head[j], name))
            return j;
    return -1;
}

static int is_number(const char *v, double *out)
{
    char *end;
    double d = strtod(v, &end);
    if (end == v || *end)
        return 0;
    if (out)
        *out = d;
    return 1;
}

/* Two option values are equal: as text, or as numbers ("8" and "8.0"). */
static int same_value(const char *a, const char *b)
{
    double x, y;
    return !strcmp(a, b) || (is_number(a, &x) && is_number(b, &y) && x == y);
}

/* Distinct values of a column: text, sort key, order. */
struct values {
    const char *v[MAX_VALUES];
    int n;
    int numeric;                 /* every value is a number (then sorted ascending) */
};

static int values_find(const struct values *vs, const char *v)
{
    for (int i = 0; i < vs->n; i++)
        if (same_value(vs->v[i], v))
            return i;
    return -1;
}

static int cmp_num_str(const void *a, const void *b)
{
    double x = strtod(*(const char *const *)a, NULL), y = strtod(*(const char *const *)b, NULL);
    return (x > y) - (x < y);
}

/* The distinct non-empty values of column col among rows[0..n-1] (sweep order; ascending
 * when all are numbers). FK_EINVAL past MAX_VALUES. */
static int values_of(const struct sel *q, const int *rows, int n, int col, struct values *vs)
{
    memset(vs, 0, sizeof *vs);
    vs->numeric = 1;
    for (int i = 0; i < n; i++) {
        const char *v = field(q, rows[i], col);
        if (!v[0] || values_find(vs, v) >= 0)
            continue;
        if (vs->n == MAX_VALUES)
            return fk_err(FK_EINVAL, "%s takes more than %d values among the selected cells",
                          q->t->head[col], MAX_VALUES);
        vs->v[vs->n++] = v;
        vs->numeric &= is_number(v, NULL);
    }
    if (vs->numeric)
        qsort(vs->v, (size_t)vs->n, sizeof vs->v[0], cmp_num_str);
    return FK_OK;
}

/* "name (a, b, c)" of every column among cols that takes two or more values, skipping
 * skip1 and skip2; "none" when none does. */
static void list_varying(const struct sel *q, const int *rows, int n, int skip1, int skip2,
                         char *out, size_t cap)
{
    size_t len = 0;
    out[0] = 0;
    int cols[512], nc = 0;
    cols[nc++] = q->fs->c_codec;
    cols[nc++] = q->fs->c_dataset;
    for (int j = q->fs->c_first_opt; j < q->fs->c_end_opt && nc < 512; j++)
        cols[nc++] = j;
    for (int k = 0; k < nc && len + 1 < cap; k++) {
        struct values vs;
        if (cols[k] == skip1 || cols[k] == skip2 || values_of(q, rows, n, cols[k], &vs) < 0 ||
            vs.n < 2)
            continue;
        len += (size_t)snprintf(out + len, cap - len, "%s%s (", len ? ", " : "",
                                q->t->head[cols[k]]);
        for (int i = 0; i < vs.n && i < 6 && len + 1 < cap; i++)
            len += (size_t)snprintf(out + len, cap - len, "%s%s", i ? " " : "", vs.v[i]);
        if (vs.n > 6 && len + 1 < cap)
            len += (size_t)snprintf(out + len, cap - len, " ...");
        if (len + 1 < cap)
            len += (size_t)snprintf(out + len, cap - len, ")");
    }
    if (len >= cap)
        out[cap - 1] = 0;
    if (!out[0])
        snprintf(out, cap, "none");
}

/* Every option column's name, comma-separated. */
static void list_options(const struct sel *q, char *out, size_t cap)
{
    size_t len = (size_t)snprintf(out, cap, "codec, dataset");
    for (int j = q->fs->c_first_opt; j < q->fs->c_end_opt && len + 1 < cap; j++)
        len += (size_t)snprintf(out + len, cap - len, ", %s", q->t->head[j]);
}

/* ---- metrics ------------------------------------------------------------------------------ */

/* cells.csv columns after the options that are not metrics. */
static const char *const not_metrics[] = {"n_traces", "traces", "dictionary", "basis", "seed",
                                          "attn_stride", "repeat", "error", NULL};
/* summary.csv columns that are not metrics. */
static const char *const not_sum_metrics[] = {"cell_id", "codec", "trace", "layer", "kind",
                                              NULL};

static int in_list(const char *const *l, const char *s)
{
    for (; *l; l++)
        if (!strcmp(*l, s))
            return 1;
    return 0;
}

/* Where metric y is read: *scol its summary.csv column (per sequence) or -1, *ccol its
 * cells.csv column (per cell) or -1. FK_EINVAL listing the metrics when neither has it. */
static int metric_cols(const struct sel *q, const char *flag, const char *y, int *scol,
                       int *ccol)
{
    *scol = in_list(not_sum_metrics, y) ? -1 : fk_csv_col(q->s, y);
    int c = fk_csv_col(q->t, y);
    *ccol = c >= q->fs->c_end_opt && !in_list(not_metrics, y) ? c : -1;
    if (*scol >= 0 || *ccol >= 0)
        return FK_OK;
    struct fk_sb b = {0};
    for (int j = 0; j < q->s->n_cols; j++)
        if (!in_list(not_sum_metrics, q->s->head[j]))
            fk_sb_printf(&b, "%s%s", b.n ? ", " : "", q->s->head[j]);
    fk_sb_printf(&b, "; per cell (cells.csv):");
    for (int j = q->fs->c_end_opt; j < q->t->n_cols; j++)
        if (!in_list(not_metrics, q->t->head[j]) && fk_csv_col(q->s, q->t->head[j]) < 0)
            fk_sb_printf(&b, " %s", q->t->head[j]);
    int rc = fk_err(FK_EINVAL, "%s %s: no such metric in %s (per sequence, summary.csv: %s)",
                    flag, y, q->fs->dir, b.s ? b.s : "");
    fk_sb_free(&b);
    return rc;
}

/* ---- selection ---------------------------------------------------------------------------- */

static int sel_open(struct sel *q, const char *dir, const struct fk_plot_general *g)
{
    memset(q, 0, sizeof *q);
    q->titles = g->titles;
    FK_TRY(fk_store_open(dir, &q->fs));
    q->t = &q->fs->cells;
    q->s = &q->fs->summary;
    q->rows = malloc(sizeof(int) * (size_t)(q->t->n_rows + 1));
    q->first = malloc(sizeof(int) * (size_t)(q->t->n_rows + 1));
    q->next = malloc(sizeof(int) * (size_t)(q->s->n_rows + 1));
    int *last = malloc(sizeof(int) * (size_t)(q->t->n_rows + 1));
    if (!q->rows || !q->first || !q->next || !last) {
        free(last);
        return fk_err(FK_ENOMEM, "out of memory");
    }
    int wcol[64];
    for (int w = 0; w < g->n_where && w < 64; w++) {
        const char *eq = strchr(g->where[w], '=');
        char name[128];
        snprintf(name, sizeof name, "%.*s", eq ? (int)(eq - g->where[w]) : 0, g->where[w]);
        wcol[w] = eq ? opt_col(q, name) : -1;
        if (wcol[w] < 0) {
            char opts[4096];
            list_options(q, opts, sizeof opts);
            free(last);
            return fk_err(FK_EINVAL, "--where %s: expected OPTION=VALUE with an option of %s "
                          "(options: %s)", g->where[w], dir, opts);
        }
    }
    if (g->n_where > 64) {
        free(last);
        return fk_err(FK_EINVAL, "--where: at most 64 filters");
    }
    for (int i = 0; i < q->t->n_rows; i++) {
        q->first[i] = last[i] = -1;
        if (strcmp(field(q, i, q->fs->c_status), "ok"))
            continue;
        if (g->dataset && strcmp(field(q, i, q->fs->c_dataset), g->dataset))
            continue;
        if (g->codec && strcmp(field(q, i, q->fs->c_codec), g->codec))
            continue;
        int ok = 1;
        for (int w = 0; w < g->n_where && ok; w++)
            ok = same_value(field(q, i, wcol[w]), strchr(g->where[w], '=') + 1);
        if (ok)
            q->rows[q->n++] = i;
    }
    /* summary rows per cell: rows of one cell are contiguous, so the lookup runs once per
     * run of rows */
    int cur = -1;
    const char *cur_id = NULL;
    for (int r = 0; r < q->s->n_rows; r++) {
        const char *id = fk_csv_str(q->s, r, q->fs->s_id);
        q->next[r] = -1;
        if (!cur_id || strcmp(cur_id, id)) {
            cur_id = id;
            cur = -1;
            for (int i = 0; i < q->t->n_rows && cur < 0; i++)
                if (!strcmp(field(q, i, q->fs->c_id), id))
                    cur = i;
        }
        if (cur < 0)
            continue;
        if (last[cur] < 0)
            q->first[cur] = r;
        else
            q->next[last[cur]] = r;
        last[cur] = r;
    }
    free(last);
    if (!q->n) {
        struct fk_sb b = {0};
        if (g->dataset)
            fk_sb_printf(&b, " of dataset %s", g->dataset);
        if (g->codec)
            fk_sb_printf(&b, " of codec %s", g->codec);
        for (int w = 0; w < g->n_where; w++)
            fk_sb_printf(&b, " with %s", g->where[w]);
        int rc = fk_err(FK_EINVAL, "%s: no finished cell%s", dir, b.s ? b.s : "");
        fk_sb_free(&b);
        return rc;
    }
    return FK_OK;
}

/* ---- points ------------------------------------------------------------------------------- */

/* A point: the cells of one setting (its repeats), its per-sequence values and the mean. */
struct point {
    double mean, lo, hi;         /* lo, hi NaN: no interval */
    int n_seq, n_cells;
    double *seq;                 /* [n_seq] per-sequence values (per-sequence metrics) */
};

/* The point of cells[0..nc-1] (repeats of one setting) for metric columns scol / ccol. */
static int point_of(const struct sel *q, const int *cells, int nc, int scol, int ccol,
                    struct point *p)
{
    memset(p, 0, sizeof *p);
    p->mean = p->lo = p->hi = NAN;
    p->n_cells = nc;
    if (scol < 0) {
        double s = 0;
        int k = 0;
        for (int i = 0; i < nc; i++) {
            double v = fk_csv_num(q->t, cells[i], ccol);
            if (isfinite(v)) {
                s += v;
                k++;
            }
        }
        p->mean = k ? s / k : NAN;
        return FK_OK;
    }
    /* per trace: mean over the cell's layer and K/V rows, then mean over repeats */
    int cap = 0;
    for (int i = 0; i < nc; i++)
        for (int r = q->first[cells[i]]; r >= 0; r = q->next[r])
            cap++;
    const char **tn = malloc(sizeof(char *) * (size_t)(cap + 1));
    double *rs = calloc((size_t)cap + 1, sizeof(double)), *cs = calloc((size_t)cap + 1, sizeof(double));
    int *rk = calloc((size_t)cap + 1, sizeof(int)), *ck = calloc((size_t)cap + 1, sizeof(int));
    int nt = 0;
    if (!tn || !rs || !cs || !rk || !ck) {
        free(tn), free(rs), free(cs), free(rk), free(ck);
        return fk_err(FK_ENOMEM, "out of memory");
    }
    for (int i = 0; i < nc; i++) {
        memset(cs, 0, sizeof(double) * (size_t)(cap + 1));
        memset(ck, 0, sizeof(int) * (size_t)(cap + 1));
        for (int r = q->first[cells[i]]; r >= 0; r = q->next[r]) {
            const char *tr = fk_csv_str(q->s, r, q->fs->s_trace);
            int t = 0;
            while (t < nt && strcmp(tn[t], tr))
                t++;
            if (t == nt)
                tn[nt++] = tr;
            double v = fk_csv_num(q->s, r, scol);
            if (isfinite(v)) {
                cs[t] += v;
                ck[t]++;
            }
        }
        for (int t = 0; t < nt; t++)
            if (ck[t]) {
                rs[t] += cs[t] / ck[t];
                rk[t]++;
            }
    }
    p->seq = malloc(sizeof(double) * (size_t)(nt + 1));
    int rc = p->seq ? FK_OK : fk_err(FK_ENOMEM, "out of memory");
    for (int t = 0; t < nt && rc == FK_OK; t++)
        if (rk[t])
            p->seq[p->n_seq++] = rs[t] / rk[t];
    free(tn), free(rs), free(cs), free(rk), free(ck);
    if (rc == FK_OK && p->n_seq >= FK_CI_MIN_SEQ) {
        rc = fk_boot_mean_ci(p->seq, p->n_seq, FK_BOOT_RESAMPLES, FK_BOOT_SEED, &p->mean,
                             &p->lo, &p->hi);
    } else if (rc == FK_OK && p->n_seq) {
        double s = 0;
        for (int t = 0; t < p->n_seq; t++)
            s += p->seq[t];
        p->mean = s / p->n_seq;
    }
    return rc;
}

/* ---- output helpers ----------------------------------------------------------------------- */

static void num(struct fk_sb *b, double v)
{
    if (isfinite(v))
        fk_sb_printf(b, " %.9g", v);
    else
        fk_sb_printf(b, " NaN");
}

/* A quoted string field of a data file (gnuplot: no '"' inside). */
static void qstr(struct fk_sb *b, const char *s)
{
    fk_sb_printf(b, " \"");
    for (; *s; s++)
        fk_sb_printf(b, "%c", *s == '"' ? '\'' : *s);
    fk_sb_printf(b, "\"");
}

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static void var_raw(struct fk_plot_gen_out *o, const char *fmt, ...)
{
    size_t n = strlen(o->vars);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(o->vars + n, sizeof o->vars - n, fmt, ap);
    va_end(ap);
}

/* name='value' (quote doubled); enh: escape gnuplot's enhanced-text characters. */
static void var_str(struct fk_plot_gen_out *o, const char *name, const char *value, int enh)
{
    size_t n = strlen(o->vars);
    n += (size_t)snprintf(o->vars + n, sizeof o->vars - n, "%s='", name);
    for (const char *p = value; *p && n + 4 < sizeof o->vars; p++) {
        if (enh && strchr("_^{}@&~\\", *p))
            o->vars[n++] = '\\';
        if (*p == '\'')
            o->vars[n++] = '\'';
        o->vars[n++] = *p;
    }
    snprintf(o->vars + n, sizeof o->vars - n, "'; ");
}

static int write_file(const char *path, struct fk_sb *b)
{
    int rc = b->oom ? fk_err(FK_ENOMEM, "out of memory")
                    : fk_write_atomic(path, b->s ? b->s : "", b->n);
    fk_sb_free(b);
    return rc;
}

static const char *display(const struct sel *q, const char *codec)
{
    for (int i = 0; q->titles && i < q->titles->n; i++)
        if (!strcmp(q->titles->name[i], codec))
            return q->titles->title[i];
    return codec;
}

/* What the selection is, for a subtitle: "dataset D, codec C, n=64". */
static void sel_text(const struct sel *q, const struct fk_plot_general *g, char *out, size_t cap)
{
    size_t n = 0;
    out[0] = 0;
    struct values ds;
    if (values_of(q, q->rows, q->n, q->fs->c_dataset, &ds) == FK_OK && ds.n == 1)
        n += (size_t)snprintf(out + n, cap - n, "%s", ds.v[0]);
    struct values cs;
    if (values_of(q, q->rows, q->n, q->fs->c_codec, &cs) == FK_OK && cs.n == 1 && n < cap)
        n += (size_t)snprintf(out + n, cap - n, "%s%s", n ? ", " : "", display(q, cs.v[0]));
    for (int w = 0; w < g->n_where && n < cap; w++)
        n += (size_t)snprintf(out + n, cap - n, "%s%s", n ? ", " : "", g->where[w]);
}

/* An axis title from the metric table: "name [unit], lower is better" (the name alone for
 * what the table does not know, an option). */
static void axis_title(const char *name, char *out, size_t cap)
{
    const struct fk_metric *m = fk_metric_find(name);
    if (!m) {
        snprintf(out, cap, "%s", name);
        return;
    }
    snprintf(out, cap, "%s%s%s%s%s", name, *m->unit ? " [" : "", m->unit, *m->unit ? "]" : "",
             m->better < 0 ? ", lower is better" : m->better > 0 ? ", higher is better" : "");
}

/* 1 when the positive values v[0..n-1] span two decades or more (a log axis). */
static int wants_log(const double *v, int n)
{
    double lo = INFINITY, hi = 0;
    for (int i = 0; i < n; i++) {
        if (!isfinite(v[i]))
            continue;
        if (v[i] <= 0)
            return 0;
        lo = fmin(lo, v[i]);
        hi = fmax(hi, v[i]);
    }
    return hi > 0 && lo < INFINITY && hi / lo >= 100;
}

/* ---- line plot ---------------------------------------------------------------------------- */

struct line {
    int *cells;                  /* [n] cells.csv rows of the line */
    int n;
    int key_row;                 /* first cell: its group columns define the line */
};

/* The columns that define a line (gcols: room for 512): by, then every other column that
 * varies (x excluded); returns their number. */
static int group_cols(struct sel *q, int xcol, int bycol, int *gcols)
{
    int ng = 0;
    gcols[ng++] = bycol;
    int cand[512], ncand = 0;
    cand[ncand++] = q->fs->c_codec;
    cand[ncand++] = q->fs->c_dataset;
    for (int j = q->fs->c_first_opt; j < q->fs->c_end_opt && ncand < 512; j++)
        cand[ncand++] = j;
    for (int k = 0; k < ncand; k++) {
        struct values vs;
        if (cand[k] == xcol || cand[k] == bycol)
            continue;
        FK_TRY(values_of(q, q->rows, q->n, cand[k], &vs));
        if (vs.n >= 2)
            gcols[ng++] = cand[k];
    }
    return ng;
}

/* The lines: distinct values of the group columns (at most cap), sorted by the by value
 * (numbers ascending); *lnp is NULL when out of memory, else set (with *nlp) even on an
 * error. */
static int collect_lines(struct sel *q, const struct fk_plot_general *g, int bycol,
                         const int *gcols, int ng, int cap, struct line **lnp, int *nlp)
{
    struct line *ln = calloc((size_t)cap, sizeof *ln);
    int nl = 0, rc = FK_OK;
    *lnp = ln;
    *nlp = 0;
    if (!ln)
        return fk_err(FK_ENOMEM, "out of memory");
    for (int i = 0; i < q->n && rc == FK_OK; i++) {
        int r = q->rows[i], l = 0;
        for (; l < nl; l++) {
            int same = 1;
            for (int k = 0; k < ng && same; k++)
                same = !strcmp(field(q, r, gcols[k]), field(q, ln[l].key_row, gcols[k]));
            if (same)
                break;
        }
        if (l == nl) {
            if (nl == cap) {
                rc = fk_err(FK_EINVAL, "--by %s: more than %d lines", g->by ? g->by : "codec",
                            cap);
                break;
            }
            ln[nl].key_row = r;
            ln[nl].cells = malloc(sizeof(int) * (size_t)q->n);
            if (!ln[nl].cells) {
                rc = fk_err(FK_ENOMEM, "out of memory");
                break;
            }
            nl++;
        }
        ln[l].cells[ln[l].n++] = r;
    }
    double dummy;
    int by_num = 1;
    for (int l = 0; l < nl; l++)
        by_num &= is_number(field(q, ln[l].key_row, bycol), &dummy);
    for (int a = 1; by_num && a < nl; a++)    /* insertion sort, stable */
        for (int b = a; b > 0 && strtod(field(q, ln[b - 1].key_row, bycol), NULL) >
                                     strtod(field(q, ln[b].key_row, bycol), NULL); b--) {
            struct line t = ln[b];
            ln[b] = ln[b - 1];
            ln[b - 1] = t;
        }
    *nlp = nl;
    return rc;
}

/* A line's title: its group values (the codec by its display name), as "OPTION=VALUE". */
static void line_title(struct sel *q, int key_row, const int *gcols, int ng, char *title,
                       size_t cap)
{
    size_t tl = 0;
    title[0] = 0;
    for (int k = 0; k < ng && tl + 1 < cap; k++) {
        const char *v = field(q, key_row, gcols[k]);
        if (!v[0])
            continue;
        if (gcols[k] == q->fs->c_codec)
            tl += (size_t)snprintf(title + tl, cap - tl, "%s%s", tl ? " " : "",
                                   display(q, v));
        else
            tl += (size_t)snprintf(title + tl, cap - tl, "%s%s=%s", tl ? " " : "",
                                   q->t->head[gcols[k]], v);
    }
}

/* The counts over a line plot's points, for its subtitle and summary. */
struct line_counts {
    int n_ci, n_sq, n_pts, max_seq, min_seq;
};

/* Line l's points, one per x value it has: to d (the .dat block) and, for a point without
 * an interval, its sequences to sq; counted in c. */
static int line_points(struct sel *q, const struct line *ln, int l, const struct values *xs,
                       int xcol, int scol, int ccol, int style, struct fk_sb *d,
                       struct fk_sb *sq, struct line_counts *c)
{
    int rc = FK_OK;
    for (int xi = 0; xi < xs->n && rc == FK_OK; xi++) {
        int *pc = malloc(sizeof(int) * (size_t)ln->n), np = 0;
        if (!pc) {
            rc = fk_err(FK_ENOMEM, "out of memory");
            break;
        }
        for (int i = 0; i < ln->n; i++)
            if (same_value(field(q, ln->cells[i], xcol), xs->v[xi]))
                pc[np++] = ln->cells[i];
        struct point p;
        rc = np ? point_of(q, pc, np, scol, ccol, &p) : FK_OK;
        free(pc);
        if (rc < 0 || !np)
            continue;
        double xpos = xs->numeric ? strtod(xs->v[xi], NULL) : xi;
        fk_sb_printf(d, "\"%s\"", xs->v[xi]);
        num(d, xpos);
        num(d, p.mean);
        num(d, p.lo);
        num(d, p.hi);
        fk_sb_printf(d, " %d %d %d\n", p.n_seq, p.n_cells, style);
        c->n_pts++;
        c->n_ci += isfinite(p.lo);
        if (scol >= 0) {
            c->max_seq = p.n_seq > c->max_seq ? p.n_seq : c->max_seq;
            c->min_seq = p.n_seq < c->min_seq ? p.n_seq : c->min_seq;
        }
        for (int t = 0; !isfinite(p.lo) && t < p.n_seq; t++) {
            num(sq, xpos);
            num(sq, p.seq[t]);
            fk_sb_printf(sq, " %d %d\n", style, l + 1);
            c->n_sq++;
        }
        free(p.seq);
    }
    return rc;
}

/* The line plot's subtitle: the selection, the cells and what a point is. */
static void line_subtitle(struct sel *q, const struct fk_plot_general *g, int scol,
                          const struct line_counts *c, int dropped, char *sub, size_t cap)
{
    char st[600], ns[64];
    sel_text(q, g, st, sizeof st);
    if (c->min_seq == c->max_seq)
        snprintf(ns, sizeof ns, "%d", c->min_seq);
    else
        snprintf(ns, sizeof ns, "%d-%d", c->min_seq, c->max_seq);
    if (scol < 0)
        snprintf(sub, cap, "%s%s%d cells; cells.csv value, mean over repeats", st,
                 st[0] ? "; " : "", q->n);
    else if (c->n_ci == c->n_pts)
        snprintf(sub, cap, "%s%s%d cells; mean, 95%% bootstrap interval over %s "
                 "sequences", st, st[0] ? "; " : "", q->n, ns);
    else
        snprintf(sub, cap, "%s%s%d cells; mean over %s sequences (circles: %s; an "
                 "interval needs >= %d)", st, st[0] ? "; " : "", q->n, ns,
                 c->n_ci ? "each, where fewer" : "each", FK_CI_MIN_SEQ);
    if (dropped) {
        size_t n = strlen(sub);
        snprintf(sub + n, cap - n, "; %d without %s", dropped, g->x);
    }
}

static int line_plot(struct sel *q, const char *stem, const struct fk_plot_general *g,
                     struct fk_plot_gen_out *o)
{
    int xcol = opt_col(q, g->x), bycol = g->by ? opt_col(q, g->by) : q->fs->c_codec;
    char opts[4096], vary[4096];
    list_options(q, opts, sizeof opts);
    if (xcol < 0 || xcol == q->fs->c_codec)
        return fk_err(FK_EINVAL, "--x %s: not an option of %s (options: %s)", g->x,
                      q->fs->dir, opts);
    if (bycol < 0)
        return fk_err(FK_EINVAL, "--by %s: not an option of %s (options: %s)", g->by,
                      q->fs->dir, opts);
    if (bycol == xcol)
        return fk_err(FK_EINVAL, "--by %s: the same option as --x", g->by);
    int scol, ccol;
    FK_TRY(metric_cols(q, "--y", g->y, &scol, &ccol));
    /* the cells that have the x option */
    int nk = 0;
    for (int i = 0; i < q->n; i++)
        if (field(q, q->rows[i], xcol)[0])
            q->rows[nk++] = q->rows[i];
    int dropped = q->n - nk;
    q->n = nk;
    struct values xs;
    FK_TRY(values_of(q, q->rows, q->n, xcol, &xs));
    if (xs.n < 2) {
        list_varying(q, q->rows, q->n, -1, -1, vary, sizeof vary);
        return fk_err(FK_EINVAL, "--x %s: %s among the %d selected cell(s) having it: nothing "
                      "to draw against (options that vary: %s)", g->x,
                      xs.n ? "one value" : "no value", q->n, vary);
    }
    /* group columns: by, then every other column that varies (x excluded) */
    int gcols[512], ng = group_cols(q, xcol, bycol, gcols);
    FK_TRY(ng);
    /* lines: distinct group values, sorted by the by value (numbers ascending) */
    struct line *ln;
    int nl, rc = collect_lines(q, g, bycol, gcols, ng, MAX_VALUES, &ln, &nl);
    if (!ln)
        return rc;
    struct fk_sb d = {0}, sq = {0};
    struct line_counts cnt = {.n_ci = 0, .n_sq = 0, .n_pts = 0, .max_seq = 0,
                              .min_seq = 1 << 30};
    fk_sb_printf(&d, "# %s vs %s, %s: one block per line; a point is the mean over sequences "
                 "(per sequence: mean over layers and K/V, then over repeats) with the 95%% "
                 "bootstrap interval over sequences when it has >= %d sequences (else lo, hi "
                 "are NaN and the sequences are in the .seq.dat file)\n",
                 g->y, g->x, scol >= 0 ? "summary.csv" : "cells.csv (one value per cell: "
                 "mean over repeats, no interval)", FK_CI_MIN_SEQ);
    fk_sb_printf(&sq, "# individual sequences of the points with fewer than %d sequences\n"
                 "# x_pos value style line\n", FK_CI_MIN_SEQ);
    var_raw(o, "nl=%d; array T[%d]; array S[%d]; ", nl, nl ? nl : 1, nl ? nl : 1);
    for (int l = 0; l < nl && rc == FK_OK; l++) {
        char title[512];
        line_title(q, ln[l].key_row, gcols, ng, title, sizeof title);
        /* the codec's colour when the lines are the codecs, else one colour per line */
        int style = bycol == q->fs->c_codec && ng == 1
                        ? fk_plot_codec_style(field(q, ln[l].key_row, q->fs->c_codec))
                        : l % FK_PLOT_STYLES + 1;
        char nm[16];
        snprintf(nm, sizeof nm, "T[%d]", l + 1);
        var_str(o, nm, title, 0);
        var_raw(o, "S[%d]=%d; ", l + 1, style);
        fk_sb_printf(&d, "%s# line %d: %s\n# x x_pos mean lo hi n_seq n_cells style\n",
                     l ? "\n\n" : "", l + 1, title);
        rc = line_points(q, &ln[l], l, &xs, xcol, scol, ccol, style, &d, &sq, &cnt);
    }
    for (int l = 0; l < nl; l++)
        free(ln[l].cells);
    free(ln);
    if (rc < 0) {
        fk_sb_free(&d);
        fk_sb_free(&sq);
        return rc;
    }
    char path[4200];
    snprintf(path, sizeof path, "%s.dat", stem);
    var_str(o, "data", path, 0);
    rc = write_file(path, &d);
    snprintf(path, sizeof path, "%s.seq.dat", stem);
    var_str(o, "seq", path, 0);
    if (rc == FK_OK)
        rc = write_file(path, &sq);
    else
        fk_sb_free(&sq);
    FK_TRY(rc);
    double x0 = strtod(xs.v[0], NULL), x1 = strtod(xs.v[xs.n - 1], NULL);
    var_raw(o, "nci=%d; nseq=%d; cat=%d; logx=%d; ", cnt.n_ci, cnt.n_sq, !xs.numeric,
            xs.numeric && x0 > 0 && x1 / x0 >= 16);
    char yt[200];
    axis_title(g->y, yt, sizeof yt);
    var_str(o, "xtitle", g->x, 0);
    var_str(o, "ytitle", yt, 0);
    char main_t[300];
    snprintf(main_t, sizeof main_t, "%s vs %s", g->y, g->x);
    var_str(o, "main", main_t, 1);
    char sub[1024];
    line_subtitle(q, g, scol, &cnt, dropped, sub, sizeof sub);
    var_str(o, "subtitle", sub, 1);
    snprintf(o->script, sizeof o->script, "general.gp");
    snprintf(o->what, sizeof o->what, "%s vs %s: %d line(s), %d point(s) from %d cell(s), "
             "%d with an interval", g->y, g->x, nl, cnt.n_pts, q->n, cnt.n_ci);
    return FK_OK;
}

/* ---- scatter: a metric against a metric ---------------------------------------------------- */

struct spt {
    double x, y;
    int group, row;              /* its --by group; its first cells.csv row */
};

/* Pareto order: the better x first (ties: the better y). */
static int g_sx, g_sy;           /* +1 higher is better, -1 lower */
static int spt_cmp(const void *a, const void *b)
{
    const struct spt *p = a, *q = b;
    if (p->x != q->x)
        return (p->x < q->x) == (g_sx < 0) ? -1 : 1;
    if (p->y != q->y)
        return (p->y < q->y) == (g_sy < 0) ? -1 : 1;
    return p->row - q->row;
}

/* Group k's points of a scatter into d, each labelled with the options that vary among
 * the group's settings. */
static void scatter_group(struct sel *q, struct fk_sb *d, const struct spt *pt, int np, int k,
                          int style, const int *gcols, int ng, int bycol)
{
    int rows[MAX_VALUES], nr = 0, lab[64], nlab = 0;
    for (int i = 0; i < np && nr < MAX_VALUES; i++)
        if (pt[i].group == k)
            rows[nr++] = pt[i].row;
    for (int c = 0; c < ng && nlab < 64; c++) {
        struct values vs;
        if (gcols[c] != bycol && values_of(q, rows, nr, gcols[c], &vs) == FK_OK && vs.n > 1)
            lab[nlab++] = gcols[c];
    }
    for (int i = 0; i < np; i++) {
        if (pt[i].group != k)
            continue;
        char label[512] = "";
        size_t n = 0;
        for (int c = 0; c < nlab && n + 1 < sizeof label; c++)
            if (field(q, pt[i].row, lab[c])[0])
                n += (size_t)snprintf(label + n, sizeof label - n, "%s%s=%s", n ? " " : "",
                                      q->t->head[lab[c]], field(q, pt[i].row, lab[c]));
        num(d, pt[i].x);
        num(d, pt[i].y);
        qstr(d, label);
        fk_sb_printf(d, " %d\n", style);
    }
}

/* The Pareto frontier of the np points (sorted in place by spt_cmp) into d; returns its
 * size. */
static int scatter_frontier(struct fk_sb *d, struct spt *pt, int np)
{
    qsort(pt, (size_t)np, sizeof *pt, spt_cmp);
    fk_sb_printf(d, "\n\n# Pareto frontier (no other setting is better on both)\n");
    int nfront = 0;
    double best = NAN;
    for (int i = 0; i < np; i++)
        if (isnan(best) || (g_sy < 0 ? pt[i].y < best : pt[i].y > best)) {
            best = pt[i].y;
            num(d, pt[i].x);
            num(d, pt[i].y);
            fk_sb_printf(d, " \"\" 0\n");
            nfront++;
        }
    return nfront;
}

/* A scatter's axes: titles with unit and direction, log scales where the values span two
 * decades, a linear axis from 0 when no value is negative. */
static void scatter_axes(struct fk_plot_gen_out *o, const struct fk_plot_general *g,
                         const double *vx, const double *vy, int np)
{
    char xt[200], yt[200];
    axis_title(g->x, xt, sizeof xt);
    axis_title(g->y, yt, sizeof yt);
    var_str(o, "xtitle", xt, 0);
    var_str(o, "ytitle", yt, 0);
    int lx = wants_log(vx, np), ly = wants_log(vy, np);
    double minx = INFINITY, miny = INFINITY;
    for (int i = 0; i < np; i++)
        minx = fmin(minx, vx[i]), miny = fmin(miny, vy[i]);
    var_raw(o, "logx=%d; logy=%d; ", lx, ly);
    if (!lx && minx >= 0)
        var_raw(o, "xmin0=0; ");
    if (!ly && miny >= 0)
        var_raw(o, "ymin0=0; ");
}

/* A metric against a metric (`--x METRIC --y METRIC [--by OPTION]`): one point per setting
 * (its repeats together; per-sequence metrics: the mean over sequences), one colour per
 * --by value (per codec by default), each point labelled with the options that tell the
 * settings apart, and the Pareto frontier by the metrics' better directions (a metric that
 * has none: lower is better). */
static int scatter(struct sel *q, const char *stem, const struct fk_plot_general *g,
                   struct fk_plot_gen_out *o)
{
    int xs_col, xc_col, ys_col, yc_col;
    FK_TRY(metric_cols(q, "--x", g->x, &xs_col, &xc_col));
    FK_TRY(metric_cols(q, "--y", g->y, &ys_col, &yc_col));
    int bycol = g->by ? opt_col(q, g->by) : q->fs->c_codec;
    if (bycol < 0) {
        char opts[4096];
        list_options(q, opts, sizeof opts);
        return fk_err(FK_EINVAL, "--by %s: not an option of %s (options: %s)", g->by,
                      q->fs->dir, opts);
    }
    const struct fk_metric *mx = fk_metric_find(g->x), *my = fk_metric_find(g->y);
    g_sx = mx && mx->better > 0 ? 1 : -1;
    g_sy = my && my->better > 0 ? 1 : -1;
    /* settings: the cells equal in every option and dataset (repeats) */
    int gcols[512], ng = group_cols(q, -1, bycol, gcols);
    FK_TRY(ng);
    struct line *ln;
    int nl, rc = collect_lines(q, g, bycol, gcols, ng, q->n, &ln, &nl);
    if (!ln)
        return rc;
    struct spt *pt = malloc(sizeof *pt * (size_t)(nl ? nl : 1));
    double *vx = malloc(sizeof(double) * (size_t)(nl ? nl : 1));
    double *vy = malloc(sizeof(double) * (size_t)(nl ? nl : 1));
    struct values groups;
    int np = 0, uncounted = 0, ucol = fk_csv_col(q->t, "bytes_uncounted");
    if (!pt || !vx || !vy)
        rc = fk_err(FK_ENOMEM, "out of memory");
    if (rc == FK_OK)
        rc = values_of(q, q->rows, q->n, bycol, &groups);
    for (int l = 0; l < nl && rc == FK_OK; l++) {
        struct point px, py;
        rc = point_of(q, ln[l].cells, ln[l].n, xs_col, xc_col, &px);
        if (rc == FK_OK)
            rc = point_of(q, ln[l].cells, ln[l].n, ys_col, yc_col, &py);
        free(px.seq);
        free(py.seq);
        if (rc < 0 || !isfinite(px.mean) || !isfinite(py.mean))
            continue;
        for (int i = 0; ucol >= 0 && i < ln[l].n; i++)
            uncounted += fk_csv_num(q->t, ln[l].cells[i], ucol) > 0;
        pt[np] = (struct spt){px.mean, py.mean,
                              values_find(&groups, field(q, ln[l].key_row, bycol)),
                              ln[l].key_row};
        vx[np] = px.mean;
        vy[np] = py.mean;
        np++;
    }
    struct fk_sb d = {0};
    if (rc == FK_OK && np == 0)
        rc = fk_err(FK_EINVAL, "--x %s --y %s: no selected cell has both (of %d)", g->x, g->y,
                    q->n);
    if (rc == FK_OK) {
        fk_sb_printf(&d, "# %s (x) against %s (y): one point per setting (repeats together; "
                     "a per-sequence metric is the mean over sequences), one block per %s "
                     "value, then the Pareto frontier\n# x y label style\n", g->x, g->y,
                     q->t->head[bycol]);
        var_raw(o, "nl=%d; array T[%d]; array S[%d]; ", groups.n, groups.n ? groups.n : 1,
                groups.n ? groups.n : 1);
        for (int k = 0; k < groups.n; k++) {
            int style = bycol == q->fs->c_codec ? fk_plot_codec_style(groups.v[k])
                                                : k % FK_PLOT_STYLES + 1;
            char nm[16];
            snprintf(nm, sizeof nm, "T[%d]", k + 1);
            var_str(o, nm, bycol == q->fs->c_codec ? display(q, groups.v[k]) : groups.v[k], 0);
            var_raw(o, "S[%d]=%d; ", k + 1, style);
            fk_sb_printf(&d, "%s# %s %s\n", k ? "\n\n" : "", q->t->head[bycol], groups.v[k]);
            scatter_group(q, &d, pt, np, k, style, gcols, ng, bycol);
        }
        int nfront = scatter_frontier(&d, pt, np);
        char path[4200], main_t[300], sub[1024], st[600];
        snprintf(path, sizeof path, "%s.dat", stem);
        var_str(o, "data", path, 0);
        rc = write_file(path, &d);
        scatter_axes(o, g, vx, vy, np);
        snprintf(main_t, sizeof main_t, "%s against %s", g->y, g->x);
        var_str(o, "main", main_t, 1);
        sel_text(q, g, st, sizeof st);
        size_t n = (size_t)snprintf(sub, sizeof sub, "%s%s%d settings of %d cells; Pareto "
                                    "frontier dashed", st, st[0] ? "; " : "", np, q->n);
        if (uncounted && n < sizeof sub)
            snprintf(sub + n, sizeof sub - n, "; %d cell(s) in the paper's accounting "
                     "(replaced atoms free, bytes_uncounted)", uncounted);
        var_str(o, "subtitle", sub, 1);
        snprintf(o->script, sizeof o->script, "scatter_general.gp");
        snprintf(o->what, sizeof o->what, "%s against %s: %d setting(s) in %d group(s), %d on "
                 "the Pareto frontier, from %d cell(s)", g->y, g->x, np, groups.n, nfront, q->n);
    } else {
        fk_sb_free(&d);
    }
    for (int l = 0; l < nl; l++)
        free(ln[l].cells);
    free(ln);
    free(pt);
    free(vx);
    free(vy);
    return rc;
}

/* ---- heatmap ------------------------------------------------------------------------------ */

static int heatmap(struct sel *q, const char *stem, const struct fk_plot_general *g,
                   struct fk_plot_gen_out *o)
{
    int xcol = opt_col(q, g->heat_x), ycol = opt_col(q, g->heat_y);
    char opts[4096], vary[4096];
    list_options(q, opts, sizeof opts);
    if (xcol < 0 || ycol < 0)
        return fk_err(FK_EINVAL, "--heatmap %s,%s: %s is not an option of %s (options: %s)",
                      g->heat_x, g->heat_y, xcol < 0 ? g->heat_x : g->heat_y, q->fs->dir, opts);
    if (xcol == ycol)
        return fk_err(FK_EINVAL, "--heatmap %s,%s: two different options expected", g->heat_x,
                      g->heat_y);
    int scol, ccol;
    FK_TRY(metric_cols(q, "--z", g->y, &scol, &ccol));
    int nk = 0;
    for (int i = 0; i < q->n; i++)
        if (field(q, q->rows[i], xcol)[0] && field(q, q->rows[i], ycol)[0])
            q->rows[nk++] = q->rows[i];
    q->n = nk;
    struct values xs, ys;
    FK_TRY(values_of(q, q->rows, q->n, xcol, &xs));
    FK_TRY(values_of(q, q->rows, q->n, ycol, &ys));
    if (xs.n < 2 || ys.n < 2) {
        const struct values *one = xs.n < 2 ? &xs : &ys;
        list_varying(q, q->rows, q->n, -1, -1, vary, sizeof vary);
        return fk_err(FK_EINVAL, "--heatmap %s,%s: %s has %s%s%s among the %d selected "
                      "cell(s) having both: a heatmap needs two options that vary (options "
                      "that vary: %s; one option: --x OPTION --y METRIC)", g->heat_x, g->heat_y,
                      xs.n < 2 ? g->heat_x : g->heat_y, one->n ? "one value (" : "no value",
                      one->n ? one->v[0] : "", one->n ? ")" : "", q->n, vary);
    }
    list_varying(q, q->rows, q->n, xcol, ycol, vary, sizeof vary);
    if (strcmp(vary, "none"))
        return fk_err(FK_EINVAL, "--heatmap %s,%s: the selected cells also vary %s: one "
                      "setting per square needed (narrow with --codec, --dataset or --where "
                      "OPTION=VALUE)", g->heat_x, g->heat_y, vary);
    struct fk_sb d = {0};
    fk_sb_printf(&d, "# heatmap of %s (%s) over %s (x) and %s (y): per square the mean over "
                 "sequences (per sequence: mean over layers and K/V, then over repeats)\n"
                 "# xi yi z xlabel ylabel ztext n_seq n_cells\n", g->y,
                 scol >= 0 ? "summary.csv" : "cells.csv, mean over repeats", g->heat_x,
                 g->heat_y);
    int rc = FK_OK, filled = 0;
    int *pc = malloc(sizeof(int) * (size_t)q->n);
    if (!pc)
        return fk_err(FK_ENOMEM, "out of memory");
    for (int yi = 0; yi < ys.n && rc == FK_OK; yi++) {
        for (int xi = 0; xi < xs.n && rc == FK_OK; xi++) {
            int np = 0;
            for (int i = 0; i < q->n; i++)
                if (same_value(field(q, q->rows[i], xcol), xs.v[xi]) &&
                    same_value(field(q, q->rows[i], ycol), ys.v[yi]))
                    pc[np++] = q->rows[i];
            struct point p = {.mean = NAN};
            if (np)
                rc = point_of(q, pc, np, scol, ccol, &p);
            char zt[32] = "n/a";
            if (isfinite(p.mean))
                snprintf(zt, sizeof zt, "%.3g", p.mean);
            filled += isfinite(p.mean);
            fk_sb_printf(&d, "%d %d", xi, yi);
            num(&d, p.mean);
            qstr(&d, xs.v[xi]);
            qstr(&d, ys.v[yi]);
            qstr(&d, zt);
            fk_sb_printf(&d, " %d %d\n", p.n_seq, np);
            free(p.seq);
        }
        fk_sb_printf(&d, "\n");
    }
    free(pc);
    if (rc < 0) {
        fk_sb_free(&d);
        return rc;
    }
    char path[4200];
    snprintf(path, sizeof path, "%s.dat", stem);
    var_str(o, "data", path, 0);
    FK_TRY(write_file(path, &d));
    var_raw(o, "nx=%d; ny=%d; ", xs.n, ys.n);
    var_str(o, "xtitle", g->heat_x, 0);
    var_str(o, "ytitle", g->heat_y, 0);
    char zt_title[200];
    axis_title(g->y, zt_title, sizeof zt_title);
    var_str(o, "ztitle", zt_title, 0);
    char main_t[300];
    snprintf(main_t, sizeof main_t, "%s over %s and %s", g->y, g->heat_x, g->heat_y);
    var_str(o, "main", main_t, 1);
    char sub[1024], st[600];
    sel_text(q, g, st, sizeof st);
    snprintf(sub, sizeof sub, "%s; %d cells%s", st, q->n,
             scol >= 0 ? "; mean over sequences (and repeats)" : "; mean over repeats");
    var_str(o, "subtitle", sub, 1);
    snprintf(o->script, sizeof o->script, "heatmap_general.gp");
    snprintf(o->what, sizeof o->what, "heatmap of %s over %s (%d) x %s (%d): %d of %d squares "
             "filled from %d cell(s)", g->y, g->heat_x, xs.n, g->heat_y, ys.n, filled,
             xs.n * ys.n, q->n);
    return FK_OK;
}

int fk_plot_general(const char *dir, const char *data_stem, const struct fk_plot_general *g,
                    struct fk_plot_gen_out *out)
{
    memset(out, 0, sizeof *out);
    if (!g->y)
        return fk_err(FK_EINVAL, "%s: a metric is needed (--y METRIC, or --z with --heatmap)",
                      g->heat_x ? "--heatmap" : "--x");
    struct sel q;
    int rc = sel_open(&q, dir, g);
    /* --x names a metric, not an option: a scatter of two metrics */
    int x_metric = !g->heat_x && g->x && rc == FK_OK && opt_col(&q, g->x) < 0 &&
                   (fk_csv_col(q.t, g->x) >= q.fs->c_end_opt || fk_csv_col(q.s, g->x) >= 0);
    if (rc == FK_OK)
        rc = g->heat_x ? heatmap(&q, data_stem, g, out)
             : x_metric ? scatter(&q, data_stem, g, out)
                        : line_plot(&q, data_stem, g, out);
    sel_free(&q);
    return rc;
}

/* The last `want` bytes of the open file fd of size sz into buf (NUL-terminated). */
static size_t file_tail(int fd, off_t sz, char *buf, size_t want)
{
    size_t n = (off_t)want < sz ? want : (size_t)sz;
    ssize_t got = pread(fd, buf, n, sz - (off_t)n);
    n = got > 0 ? (size_t)got : 0;
    buf[n] = 0;
    return n;
}

/* 1 when the first n bytes of buf hold the text s. */
static int has_text(const char *buf, size_t n, const char *s)
{
    size_t k = strlen(s);
    for (size_t i = 0; i + k <= n; i++)
        if (!memcmp(buf + i, s, k))
            return 1;
    return 0;
}

int fk_plot_file_whole(const char *path, const char *fmt, char *why, size_t cap)
{
    int fd = open(path, O_RDWR);
    if (fd < 0) {
        snprintf(why, cap, "not written (%s)", strerror(errno));
        return 0;
    }
    struct stat sb;
    char head[16] = {0}, tail[1100];
    int ok = fstat(fd, &sb) == 0 && sb.st_size > 0;
    if (!ok)
        snprintf(why, cap, "empty");
    if (ok && fsync(fd) != 0) {
        snprintf(why, cap, "cannot be forced to disk (%s)", strerror(errno));
        ok = 0;
    }
    if (ok && pread(fd, head, 8, 0) != 8 && strcmp(fmt, "svg")) {
        snprintf(why, cap, "cut short (%ld bytes)", (long)sb.st_size);
        ok = 0;
    }
    size_t n = ok ? file_tail(fd, sb.st_size, tail, 1024) : 0;
    close(fd);
    if (!ok)
        return 0;
    static const unsigned char png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    static const unsigned char png_end[8] = {'I', 'E', 'N', 'D', 0xae, 0x42, 0x60, 0x82};
    if (!strcmp(fmt, "png"))
        ok = !memcmp(head, png_sig, 8) && n >= 8 && !memcmp(tail + n - 8, png_end, 8);
    else if (!strcmp(fmt, "pdf"))
        ok = !memcmp(head, "%PDF-", 5) && has_text(tail, n, "%%EOF");
    else if (!strcmp(fmt, "svg"))
        ok = has_text(tail, n, "</svg>");
    if (!ok)
        snprintf(why, cap, "not a whole %s file (%ld bytes, its %s missing: cut short?)", fmt,
                 (long)sb.st_size, !strcmp(fmt, "png") ? "IEND chunk or signature"
                                   : !strcmp(fmt, "pdf") ? "%PDF header or %%EOF" : "</svg>");
    return ok;
}
