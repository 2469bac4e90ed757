/* SPDX-License-Identifier: MIT
 * The regression gate (see fk_check.h).
 */
#include "report/fk_check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fk_err.h"
#include "common/fk_str.h"
#include "core/fk_codec.h"
#include "core/fk_registry.h"
#include "store/fk_results.h"

const char *const fk_check_metrics[FK_CHECK_N_METRICS] = {"rel_err_mean", "attn_kl", "bytes"};


/* A gateable metric (the table's FK_MF_GATE, store/fk_metrics.c), or NULL. */
static const struct fk_metric *gateable(const char *name)
{
    const struct fk_metric *m = fk_metric_find(name);
    return m && (m->flags & FK_MF_GATE) && m->row ? m : NULL;
}

const struct fk_band *fk_check_band_of(const char *metric, int aggregate)
{
    const struct fk_metric *g = gateable(metric);
    return g ? (aggregate ? &g->band_agg : &g->band_row) : NULL;
}

/* The metrics of a run (names point into the options, the baseline or the defaults). */
struct mset {
    const char *name[FK_CHECK_MAX_METRICS];
    int n;
};

struct crow {
    char *key;                   /* codec,dataset,options,occurrence,trace,layer,kind (CSV) */
    int plen;                    /* length of its codec,dataset,options,occurrence part */
    int agg;                     /* an aggregate row (trace and layer "*") */
    int alone;                   /* a result row the baseline lacks: in no aggregate */
    double v[FK_CHECK_MAX_METRICS]; /* the mset's metrics, in its order */
};

struct ctab {
    struct crow *r;              /* [n] rows, sorted by key after load */
    int n;                       /* rows held */
    int cap;                     /* allocated rows */
};

/* The row tables of a run. */
struct tabs {
    struct ctab res, base;
};

static void ctab_free(struct ctab *t)
{
    for (int i = 0; i < t->n; i++)
        free(t->r[i].key);
    free(t->r);
    memset(t, 0, sizeof *t);
}

static int ctab_add(struct ctab *t, const char *key, int plen, int agg, const double *v)
{
    if (t->n == t->cap) {
        int nc = t->cap ? t->cap * 2 : 256;
        struct crow *nr = realloc(t->r, sizeof *nr * (size_t)nc);
        if (!nr)
            return fk_err(FK_ENOMEM, "out of memory");
        t->r = nr;
        t->cap = nc;
    }
    t->r[t->n].key = strdup(key);
    if (!t->r[t->n].key)
        return fk_err(FK_ENOMEM, "out of memory");
    t->r[t->n].plen = plen;
    t->r[t->n].agg = agg;
    t->r[t->n].alone = 0;
    memcpy(t->r[t->n].v, v, sizeof t->r[t->n].v);
    t->n++;
    return FK_OK;
}

static int cmp_row(const void *a, const void *b)
{
    return strcmp(((const struct crow *)a)->key, ((const struct crow *)b)->key);
}

static int sort_unique(struct ctab *t, const char *path)
{
    if (t->n > 1)
        qsort(t->r, (size_t)t->n, sizeof *t->r, cmp_row);
    for (int i = 1; i < t->n; i++)
        if (!strcmp(t->r[i].key, t->r[i - 1].key))
            return fk_err(FK_ECORRUPT, "%s: two rows with key %s", path, t->r[i].key);
    return FK_OK;
}

/* Appends a CSV field (quoted when needed) to b, after a comma unless first. */
static void csv_field(struct fk_sb *b, const char *v, int first)
{
    if (!first)
        fk_sb_printf(b, ",");
    fk_csv_field(b, v);
}

struct opt {
    const char *name;            /* option column */
    const char *value;           /* value text */
};

static int cmp_opt(const void *a, const void *b)
{
    return strcmp(((const struct opt *)a)->name, ((const struct opt *)b)->name);
}

/* The non-default options of cells.csv row i, sorted by name ("default" when none). */
static int cell_options(const struct fk_store *st, int i, struct fk_sb *out)
{
    const struct fk_csv *c = &st->cells;
    const struct fk_codec_ops *ops = fk_codec_find(c->rows[i][st->c_codec]);
    struct opt o[128];
    int n = 0;
    void *def = ops ? calloc(1, ops->opts_size) : NULL;
    if (ops && !def)
        return fk_err(FK_ENOMEM, "out of memory");
    if (def)
        fk_opts_defaults(ops, def);
    for (int j = st->c_first_opt; j < st->c_end_opt && n < 128; j++) {
        const char *v = c->rows[i][j];
        if (!v[0])
            continue;
        const struct fk_option *opt = ops ? fk_codec_option(ops, c->head[j]) : NULL;
        if (opt && def) {
            char dv[64];
            fk_opts_format(def, opt, dv, sizeof dv);
            if (!strcmp(dv, v))
                continue;
        }
        o[n++] = (struct opt){c->head[j], v};
    }
    free(def);
    qsort(o, (size_t)n, sizeof *o, cmp_opt);
    for (int k = 0; k < n; k++)
        fk_sb_printf(out, "%s%s=%s", k ? ";" : "", o[k].name, o[k].value);
    if (!n)
        fk_sb_printf(out, "default");
    return FK_OK;
}

/* Per finished cell of cells.csv: its key prefix codec,dataset,options,occurrence. */
static int cell_prefixes(const struct fk_store *st, char **prefix)
{
    const struct fk_csv *c = &st->cells;
    for (int i = 0; i < c->n_rows; i++) {
        if (strcmp(c->rows[i][st->c_status], "ok"))
            continue;
        struct fk_sb opts = {0}, base = {0};
        int rc = cell_options(st, i, &opts);
        csv_field(&base, c->rows[i][st->c_codec], 1);
        csv_field(&base, c->rows[i][st->c_dataset], 0);
        csv_field(&base, opts.s ? opts.s : "", 0);
        fk_sb_free(&opts);
        int occ = 0;
        size_t bl = base.n;
        for (int j = 0; base.s && j < i; j++)
            occ += prefix[j] && !strncmp(prefix[j], base.s, bl) && prefix[j][bl] == ',';
        fk_sb_printf(&base, ",%d", occ);
        if (rc == FK_OK && base.oom)
            rc = fk_err(FK_ENOMEM, "out of memory");
        if (rc < 0) {
            fk_sb_free(&base);
            return rc;
        }
        prefix[i] = base.s;
    }
    return FK_OK;
}

struct idpos {
    const char *id;
    int row;
};

static int cmp_idpos(const void *a, const void *b)
{
    return strcmp(((const struct idpos *)a)->id, ((const struct idpos *)b)->id);
}

/* The cells.csv row of a cell id, or -1 (ids sorted with their rows). */
static int cell_row(const struct idpos *ids, int n, const char *id)
{
    struct idpos k = {id, 0};
    const struct idpos *f = n > 0 ? bsearch(&k, ids, (size_t)n, sizeof *ids, cmp_idpos) : NULL;
    return f ? f->row : -1;
}

/* The aggregate rows of the sorted per-row table t: per cell and kind, the mean of each
 * metric over its rows (NaN left out; NaN when every row is NaN). */
static int add_aggregates(struct ctab *t, int n_metrics)
{
    int n = t->n;
    for (int i0 = 0; i0 < n;) {
        int i1 = i0 + 1;
        while (i1 < n && t->r[i1].plen == t->r[i0].plen &&
               !strncmp(t->r[i1].key, t->r[i0].key, (size_t)t->r[i0].plen))
            i1++;
        for (int k = 0; k < 2; k++) {
            double sum[FK_CHECK_MAX_METRICS] = {0}, v[FK_CHECK_MAX_METRICS];
            long cnt[FK_CHECK_MAX_METRICS] = {0}, rows = 0;
            for (int i = i0; i < i1; i++) {
                const char *key = t->r[i].key;
                size_t len = strlen(key);
                if (key[len - 1] != "KV"[k] || t->r[i].alone)
                    continue;
                rows++;
                for (int m = 0; m < n_metrics; m++)
                    if (!isnan(t->r[i].v[m])) {
                        sum[m] += t->r[i].v[m];
                        cnt[m]++;
                    }
            }
            if (!rows)
                continue;
            for (int m = 0; m < n_metrics; m++)
                v[m] = cnt[m] ? sum[m] / cnt[m] : NAN;
            struct fk_sb key = {0};
            fk_sb_printf(&key, "%.*s,*,*,%c", t->r[i0].plen, t->r[i0].key, "KV"[k]);
            int rc = key.oom ? fk_err(FK_ENOMEM, "out of memory")
                             : ctab_add(t, key.s, t->r[i0].plen, 1, v);
            fk_sb_free(&key);
            FK_TRY(rc);
        }
        i0 = i1;
    }
    return FK_OK;
}

/* 1 when the sorted table t holds key. */
static int has_key(const struct ctab *t, const char *key)
{
    struct crow k = {.key = (char *)key};
    return t->n > 0 && bsearch(&k, t->r, (size_t)t->n, sizeof *t->r, cmp_row) != NULL;
}

/* Rows of a results directory, keyed (see fk_check.h), with their aggregates, sorted. Rows
 * the baseline `base` (NULL: none) lacks stay out of the aggregates: a results directory
 * with more cells, traces or layers than the baseline compares on the rows they share. */
static int load_results(const char *dir, const struct mset *ms, const struct ctab *base,
                        struct ctab *t)
{
    struct fk_store *st;
    FK_TRY(fk_store_open(dir, &st));
    const struct fk_csv *sum = &st->summary;
    int sl = fk_csv_col(sum, "layer"), sm[FK_CHECK_MAX_METRICS], rc = FK_OK;
    if (sl < 0)
        rc = fk_err(FK_ECORRUPT, "%s: summary.csv lacks the column layer", dir);
    for (int m = 0; m < ms->n && rc == FK_OK; m++)
        if ((sm[m] = fk_csv_col(sum, ms->name[m])) < 0)
            rc = fk_err(FK_ECORRUPT, "%s: summary.csv has no column %s (written by an older "
                        "fadkv-bench?)", dir, ms->name[m]);
    int nc = st->cells.n_rows;
    char **prefix = rc == FK_OK ? calloc((size_t)nc + 1, sizeof(char *)) : NULL;
    struct idpos *ids = rc == FK_OK ? malloc(sizeof *ids * ((size_t)nc + 1)) : NULL;
    if (rc == FK_OK && (!prefix || !ids))
        rc = fk_err(FK_ENOMEM, "out of memory");
    if (rc == FK_OK)
        rc = cell_prefixes(st, prefix);
    for (int i = 0; rc == FK_OK && i < nc; i++)
        ids[i] = (struct idpos){st->cells.rows[i][st->c_id], i};
    if (rc == FK_OK && nc > 1)
        qsort(ids, (size_t)nc, sizeof *ids, cmp_idpos);
    for (int r = 0; rc == FK_OK && r < sum->n_rows; r++) {
        int i = cell_row(ids, nc, sum->rows[r][st->s_id]);
        if (i < 0 || !prefix[i])
            continue;
        struct fk_sb key = {0};
        fk_sb_printf(&key, "%s", prefix[i]);
        csv_field(&key, sum->rows[r][st->s_trace], 0);
        csv_field(&key, sum->rows[r][sl], 0);
        csv_field(&key, sum->rows[r][st->s_kind], 0);
        double v[FK_CHECK_MAX_METRICS] = {0};
        for (int m = 0; m < ms->n; m++)
            v[m] = fk_csv_num(sum, r, sm[m]);
        rc = key.oom ? fk_err(FK_ENOMEM, "out of memory")
                     : ctab_add(t, key.s, (int)strlen(prefix[i]), 0, v);
        fk_sb_free(&key);
    }
    for (int i = 0; prefix && i < nc; i++)
        free(prefix[i]);
    free(prefix);
    free(ids);
    fk_store_close(&st);
    if (rc == FK_OK)
        rc = sort_unique(t, dir);
    for (int i = 0; rc == FK_OK && base && i < t->n; i++)
        t->r[i].alone = !has_key(base, t->r[i].key);
    if (rc == FK_OK)
        rc = add_aggregates(t, ms->n);
    if (rc == FK_OK)
        rc = sort_unique(t, dir);
    return rc;
}

static const char baseline_keys[] = "codec,dataset,options,occurrence,trace,layer,kind";

static const char *const key_cols[] = {"codec", "dataset", "options", "occurrence", "trace",
                                       "layer", "kind", NULL};

static int is_key_column(const char *h)
{
    for (int k = 0; key_cols[k]; k++)
        if (!strcmp(key_cols[k], h))
            return 1;
    return 0;
}

/* The metrics to gate: the asked ones (each a column of the baseline b), else every column
 * of b after the key columns; each must be gateable. */
static int baseline_metrics(const char *path, const struct fk_csv *b,
                            const struct fk_check_opts *o, struct mset *ms)
{
    ms->n = 0;
    if (o->metrics) {
        for (int m = 0; m < o->n_metrics; m++) {
            if (fk_csv_col(b, o->metrics[m]) < 0)
                return fk_err(FK_EINVAL, "%s: the baseline has no column %s (record it with "
                              "check --update --metrics ...)", path, o->metrics[m]);
            ms->name[ms->n++] = o->metrics[m];
        }
        return FK_OK;
    }
    for (int c = 0; c < b->n_cols; c++) {
        const char *h = b->head[c];
        if (is_key_column(h))
            continue;
        if (!gateable(h))
            return fk_err(FK_ECORRUPT, "%s:1: column %s is not a gateable metric", path, h);
        if (ms->n == FK_CHECK_MAX_METRICS)
            return fk_err(FK_ECORRUPT, "%s: more than %d metric columns", path,
                          FK_CHECK_MAX_METRICS);
        ms->name[ms->n++] = h;
    }
    if (!ms->n)
        return fk_err(FK_CHECK_UNJUDGED, "%s:1: no metric column after %s: nothing to gate",
                      path, baseline_keys);
    return FK_OK;
}

/* A baseline value: a finite number, or "nan" (no value); else FK_CHECK_UNJUDGED naming the
 * file, line and column. */
static int baseline_value(const char *path, int line, const char *col, const char *text,
                          double *v)
{
    char *end = NULL;
    if (!strcmp(text, "nan")) {
        *v = NAN;
        return FK_OK;
    }
    *v = strtod(text, &end);
    if (!*text || *end || !isfinite(*v))
        return fk_err(FK_CHECK_UNJUDGED, "%s:%d: column %s: '%s' is not a finite number (a "
                      "baseline value is a finite number, or nan where the metric has no "
                      "value)", path, line, col, text);
    return FK_OK;
}

static int load_baseline(const char *path, const struct fk_check_opts *o, struct fk_csv *b,
                         struct mset *ms, struct ctab *t)
{
    FK_TRY(fk_csv_load(path, b));
    const char *const *cols = key_cols;
    int idx[8], rc = FK_OK;
    for (int k = 0; cols[k] && rc == FK_OK; k++) {
        idx[k] = fk_csv_col(b, cols[k]);
        if (idx[k] < 0)
            rc = fk_err(FK_ECORRUPT, "%s:1: expected column '%s' (header: %s,METRIC...)",
                        path, cols[k], baseline_keys);
    }
    if (rc == FK_OK)
        rc = baseline_metrics(path, b, o, ms);
    int im[FK_CHECK_MAX_METRICS];
    for (int m = 0; rc == FK_OK && m < ms->n; m++)
        im[m] = fk_csv_col(b, ms->name[m]);
    for (int r = 0; rc == FK_OK && r < b->n_rows; r++) {
        struct fk_sb key = {0};
        for (int k = 0; k < 4; k++)
            csv_field(&key, b->rows[r][idx[k]], k == 0);
        int plen = (int)key.n;
        for (int k = 4; cols[k]; k++)
            csv_field(&key, b->rows[r][idx[k]], 0);
        int agg = !strcmp(b->rows[r][idx[4]], "*");
        double v[FK_CHECK_MAX_METRICS] = {0};
        for (int m = 0; m < ms->n && rc == FK_OK; m++)
            rc = baseline_value(path, r + 2, ms->name[m], b->rows[r][im[m]], &v[m]);
        if (rc == FK_OK)
            rc = key.oom ? fk_err(FK_ENOMEM, "out of memory") : ctab_add(t, key.s, plen, agg, v);
        fk_sb_free(&key);
    }
    if (rc == FK_OK)
        rc = sort_unique(t, path);
    return rc;
}

static int write_baseline(const char *path, const struct mset *ms, const struct ctab *t)
{
    struct fk_sb s = {0};
    fk_sb_printf(&s, "%s", baseline_keys);
    for (int m = 0; m < ms->n; m++)
        fk_sb_printf(&s, ",%s", ms->name[m]);
    fk_sb_printf(&s, "\n");
    for (int i = 0; i < t->n; i++) {
        fk_sb_printf(&s, "%s", t->r[i].key);
        for (int m = 0; m < ms->n; m++) {
            if (isnan(t->r[i].v[m]))
                fk_sb_printf(&s, ",nan");
            else /* every digit: --tolerance exact compares bit for bit */
                fk_sb_printf(&s, ",%.17g", t->r[i].v[m]);
        }
        fk_sb_printf(&s, "\n");
    }
    int rc = s.oom ? fk_err(FK_ENOMEM, "out of memory") : fk_write_atomic(path, s.s, s.n);
    fk_sb_free(&s);
    return rc;
}

static int add_diff(struct fk_check_result *r, int *cap, struct fk_check_diff d)
{
    if (r->n_diffs == *cap) {
        int nc = *cap ? *cap * 2 : 64;
        struct fk_check_diff *nd = realloc(r->diffs, sizeof *nd * (size_t)nc);
        if (!nd)
            return fk_err(FK_ENOMEM, "out of memory");
        r->diffs = nd;
        *cap = nc;
    }
    r->diffs[r->n_diffs++] = d;
    return FK_OK;
}

/* 1 when x and y differ beyond band b (or exactly one is NaN). */
static int beyond(const struct fk_band *b, double x, double y)
{
    return isnan(x) != isnan(y) || (!isnan(x) && fabs(y - x) > b->atol + b->rtol * fabs(x));
}

/* Records the largest drifts of metric m at a level. */
static void note_extreme(struct fk_check_extreme *e, const struct fk_band *band, double x,
                         double y)
{
    if (isnan(x) || isnan(y))
        return;
    double d = fabs(y - x), rel = d / (fabs(x) > 1e-300 ? fabs(x) : 1e-300);
    double lim = band->atol + band->rtol * fabs(x);
    double use = lim > 0 ? d / lim : (d > 0 ? INFINITY : 0);
    if (rel > e->rel)
        e->rel = rel;
    if (use > e->band_use)
        e->band_use = use;
}

/* Walks both sorted tables in key order, recording every finding. */
static int compare(const struct ctab *b, const struct ctab *res, const struct mset *ms,
                   const struct fk_check_opts *o, struct fk_check_result *r)
{
    int i = 0, j = 0, cap = 0, rc = FK_OK;
    while ((i < b->n || j < res->n) && rc == FK_OK) {
        int c = i >= b->n ? 1 : j >= res->n ? -1 : strcmp(b->r[i].key, res->r[j].key);
        if (c < 0) {
            r->missing++;
            rc = add_diff(r, &cap, (struct fk_check_diff){FK_CHECK_MISSING, b->r[i].key, 0,
                                                          NAN, NAN, b->r[i].agg, 0});
            i++;
            continue;
        }
        if (c > 0) {
            r->extra++;
            rc = add_diff(r, &cap, (struct fk_check_diff){FK_CHECK_EXTRA, res->r[j].key, 0,
                                                          NAN, NAN, res->r[j].agg, 0});
            j++;
            continue;
        }
        int agg = b->r[i].agg;
        r->matched++;
        r->matched_agg += agg;
        for (int m = 0; m < ms->n && rc == FK_OK; m++) {
            double x = b->r[i].v[m], y = res->r[j].v[m];
            const struct fk_band *band = fk_check_band_of(ms->name[m], agg);
            struct fk_band tol = {0, 0};
            if (o->tol == FK_CHECK_PORTABLE)
                tol = *band;
            else if (o->tol == FK_CHECK_CUSTOM)
                tol = (struct fk_band){o->rtol, o->atol};
            note_extreme(&r->extreme[m][agg ? 0 : 1], band, x, y);
            if (!beyond(&tol, x, y))
                continue;
            /* worse_only: a finite change in the metric's better direction passes */
            int better = gateable(ms->name[m])->better;
            int up = !isnan(x) && !isnan(y) && better && (y - x) * better > 0;
            enum fk_check_kind k = o->worse_only && up ? FK_CHECK_IMPROVED : FK_CHECK_DRIFT;
            int out = beyond(band, x, y);
            if (k == FK_CHECK_DRIFT) {
                r->drift++;
                r->beyond_band += out;
            } else {
                r->improved++;
            }
            rc = add_diff(r, &cap, (struct fk_check_diff){k, b->r[i].key, m, x, y, agg, out});
        }
        i++;
        j++;
    }
    r->fail = r->drift > 0 || r->missing > 0 || (o->strict && r->extra > 0);
    return rc;
}

/* What fk_check_result.owned holds besides the tables: the baseline CSV (metric names point
 * into its header). */
struct owned {
    struct tabs t;
    struct fk_csv base_csv;
};

static int check_opts(const struct fk_check_opts *o)
{
    if (!o->baseline || !o->results)
        return fk_err(FK_EINVAL, "check: a baseline and a results directory needed");
    if (o->tol == FK_CHECK_CUSTOM && !(o->rtol >= 0 && o->atol >= 0 && isfinite(o->rtol) &&
                                       isfinite(o->atol)))
        return fk_err(FK_EINVAL, "check: tolerances must be finite numbers >= 0");
    if (o->n_metrics > FK_CHECK_MAX_METRICS)
        return fk_err(FK_EINVAL, "check: at most %d metrics", FK_CHECK_MAX_METRICS);
    if (o->metrics && o->n_metrics == 0)
        return fk_err(FK_CHECK_UNJUDGED, "check: the metric list is empty: nothing to gate");
    for (int m = 0; o->metrics && m < o->n_metrics; m++)
        if (!gateable(o->metrics[m]))
            return fk_err(FK_EINVAL, "check: '%s' is not a gateable metric (the per-row "
                          "columns of summary.csv but cpu_s: see fadkv-bench check --help)",
                          o->metrics[m]);
    return FK_OK;
}

int fk_check_run(const struct fk_check_opts *o, struct fk_check_result *r)
{
    memset(r, 0, sizeof *r);
    FK_TRY(check_opts(o));
    struct owned *w = calloc(1, sizeof *w);
    if (!w)
        return fk_err(FK_ENOMEM, "out of memory");
    r->owned = w;
    struct mset ms = {.n = 0};
    int rc = FK_OK;
    if (o->update) {
        for (int m = 0; m < (o->metrics ? o->n_metrics : FK_CHECK_N_METRICS); m++)
            ms.name[ms.n++] = o->metrics ? o->metrics[m] : fk_check_metrics[m];
        rc = load_results(o->results, &ms, NULL, &w->t.res);
        if (rc == FK_OK && w->t.res.n == 0)
            rc = fk_err(FK_CHECK_UNJUDGED, "check: %s has no finished cell: refusing to "
                        "record an empty baseline", o->results);
        if (rc == FK_OK)
            rc = write_baseline(o->baseline, &ms, &w->t.res);
        r->written = rc == FK_OK ? w->t.res.n : 0;
    } else {
        rc = load_baseline(o->baseline, o, &w->base_csv, &ms, &w->t.base);
        if (rc == FK_OK)
            rc = load_results(o->results, &ms, &w->t.base, &w->t.res);
        if (rc == FK_OK)
            rc = compare(&w->t.base, &w->t.res, &ms, o, r);
        if (rc == FK_OK && r->matched == 0)
            rc = fk_err(FK_CHECK_UNJUDGED, "check: no row of %s matches a row of %s (%d "
                        "baseline rows, %d result rows): nothing was compared", o->baseline,
                        o->results, w->t.base.n, w->t.res.n);
    }
    for (int m = 0; m < ms.n; m++)
        r->metric[m] = ms.name[m];
    r->n_metrics = ms.n;
    if (rc < 0)
        fk_check_result_free(r);
    return rc;
}

void fk_check_result_free(struct fk_check_result *r)
{
    struct owned *w = r->owned;
    if (w) {
        ctab_free(&w->t.res);
        ctab_free(&w->t.base);
        fk_csv_free(&w->base_csv);
        free(w);
    }
    free(r->diffs);
    memset(r, 0, sizeof *r);
}
