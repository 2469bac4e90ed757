/* SPDX-License-Identifier: MIT
 * `fadkv-bench check --baseline FILE --results DIR [--rtol R] [--atol A] [--update]`: the
 * regression gate. Compares rel_err_mean and attn_kl of every summary.csv row (cell x trace x
 * layer x kind) of a results directory with a committed baseline CSV.
 *
 * Rows are matched by a key that does not involve the cell id (which changes with the harness
 * version): codec, dataset name, the options that differ from the codec's defaults (sorted by
 * name, "k=v;k=v", or "default"), an occurrence number (0 unless the sweep repeats the same
 * configuration), trace file name, layer and kind. Baseline columns:
 *   codec,dataset,options,occurrence,trace,layer,kind,rel_err_mean,attn_kl
 * A value drifts when |result - baseline| > atol + rtol * |baseline|, or exactly one is NaN.
 * Exit status: 0 pass; 1 regression (a drift, or a baseline row missing from the results;
 * extra result rows are reported but pass); 2 usage or I/O error.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fk_codec.h"
#include "common/fk_err.h"
#include "report/fk_plotdata.h"
#include "store/fk_results.h"

int fk_cli_check(int argc, char **argv);

#define N_METRICS 2
static const char *const metrics[N_METRICS] = {"rel_err_mean", "attn_kl"};

struct crow {
    char *key;                   /* codec,dataset,options,occurrence,trace,layer,kind (CSV) */
    double v[N_METRICS];         /* rel_err_mean, attn_kl */
};

struct ctab {
    struct crow *r;              /* [n] rows, sorted by key after load */
    int n;                       /* rows held */
    int cap;                     /* allocated rows */
};

static void ctab_free(struct ctab *t)
{
    for (int i = 0; i < t->n; i++)
        free(t->r[i].key);
    free(t->r);
    memset(t, 0, sizeof *t);
}

static int ctab_add(struct ctab *t, const char *key, const double *v)
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
    memcpy(t->r[t->n].v, v, sizeof t->r[t->n].v);
    t->n++;
    return FK_OK;
}

static int cmp_row(const void *a, const void *b)
{
    return strcmp(((const struct crow *)a)->key, ((const struct crow *)b)->key);
}

/* Appends a CSV field (quoted when needed) to buf. */
static void csv_field(char *buf, size_t cap, const char *v, int first)
{
    size_t n = strlen(buf);
    if (!first && n + 1 < cap)
        buf[n++] = ',';
    int q = strpbrk(v, ",\"\n") != NULL;
    if (q && n + 1 < cap)
        buf[n++] = '"';
    for (const char *p = v; *p && n + 3 < cap; p++) {
        if (*p == '"')
            buf[n++] = '"';
        buf[n++] = *p;
    }
    if (q && n + 1 < cap)
        buf[n++] = '"';
    buf[n] = 0;
}

struct opt {
    const char *name;            /* option column */
    const char *value;           /* value text */
};

static int cmp_opt(const void *a, const void *b)
{
    return strcmp(((const struct opt *)a)->name, ((const struct opt *)b)->name);
}

/* The non-default options of cells.csv row i, sorted by name. */
static void cell_options(const struct fk_csv *c, int i, const char *codec, char *out, size_t cap)
{
    const struct fk_codec_ops *ops = NULL;
    for (int k = 0; fk_codecs[k]; k++)
        if (!strcmp(fk_codecs[k]->name, codec))
            ops = fk_codecs[k];
    struct opt o[128];
    int n = 0;
    void *def = ops ? calloc(1, ops->opts_size) : NULL;
    if (def)
        fk_opts_defaults(ops, def);
    int first = fk_csv_col(c, "status") + 1, end = fk_csv_col(c, "n_traces");
    for (int j = first; j > 0 && j < end && n < 128; j++) {
        const char *v = c->rows[i][j];
        if (!v[0])
            continue;
        const struct fk_option *opt = NULL;
        for (const struct fk_option *p = ops ? ops->options : NULL; p && p->name; p++)
            if (!strcmp(p->name, c->head[j]))
                opt = p;
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
    out[0] = 0;
    size_t len = 0;
    for (int k = 0; k < n && len + 1 < cap; k++)
        len += (size_t)snprintf(out + len, cap - len, "%s%s=%s", k ? ";" : "", o[k].name,
                                o[k].value);
    if (!n)
        snprintf(out, cap, "default");
}

/* Rows of a results directory, keyed (see the top of this file). */
static int load_results(const char *dir, struct ctab *t)
{
    struct fk_csv cells, sum;
    char p[4200];
    snprintf(p, sizeof p, "%s/cells.csv", dir);
    FK_TRY(fk_csv_load(p, &cells));
    snprintf(p, sizeof p, "%s/summary.csv", dir);
    int rc = fk_csv_load(p, &sum);
    if (rc < 0) {
        fk_csv_free(&cells);
        return rc;
    }
    int ci = fk_csv_col(&cells, "cell_id"), cc = fk_csv_col(&cells, "codec");
    int cd = fk_csv_col(&cells, "dataset"), cs = fk_csv_col(&cells, "status");
    int si = fk_csv_col(&sum, "cell_id"), st = fk_csv_col(&sum, "trace");
    int sl = fk_csv_col(&sum, "layer"), sk = fk_csv_col(&sum, "kind");
    int sm[N_METRICS];
    for (int m = 0; m < N_METRICS; m++)
        sm[m] = fk_csv_col(&sum, metrics[m]);
    if (ci < 0 || cc < 0 || cd < 0 || cs < 0 || si < 0 || st < 0 || sl < 0 || sk < 0 ||
        sm[0] < 0)
        rc = fk_err(FK_ECORRUPT, "%s: cells.csv / summary.csv lack the expected columns "
                    "(cell_id, codec, dataset, status; cell_id, trace, layer, kind, "
                    "rel_err_mean)", dir);
    /* per cell: its key prefix (codec,dataset,options,occurrence) */
    char **prefix = rc == FK_OK ? calloc((size_t)cells.n_rows + 1, sizeof(char *)) : NULL;
    if (rc == FK_OK && !prefix)
        rc = fk_err(FK_ENOMEM, "out of memory");
    for (int i = 0; rc == FK_OK && i < cells.n_rows; i++) {
        if (strcmp(cells.rows[i][cs], "ok"))
            continue;
        char opts[2048], base[4096] = "";
        cell_options(&cells, i, cells.rows[i][cc], opts, sizeof opts);
        csv_field(base, sizeof base, cells.rows[i][cc], 1);
        csv_field(base, sizeof base, cells.rows[i][cd], 0);
        csv_field(base, sizeof base, opts, 0);
        int occ = 0;
        size_t bl = strlen(base);
        for (int j = 0; j < i; j++)
            occ += prefix[j] && !strncmp(prefix[j], base, bl) && prefix[j][bl] == ',';
        char full[4200];
        snprintf(full, sizeof full, "%s,%d", base, occ);
        prefix[i] = strdup(full);
        if (!prefix[i])
            rc = fk_err(FK_ENOMEM, "out of memory");
    }
    for (int r = 0; rc == FK_OK && r < sum.n_rows; r++) {
        int i = 0;
        while (i < cells.n_rows && strcmp(cells.rows[i][ci], sum.rows[r][si]))
            i++;
        if (i == cells.n_rows || !prefix[i])
            continue;
        char key[8192];
        snprintf(key, sizeof key, "%s", prefix[i]);
        csv_field(key, sizeof key, sum.rows[r][st], 0);
        csv_field(key, sizeof key, sum.rows[r][sl], 0);
        csv_field(key, sizeof key, sum.rows[r][sk], 0);
        double v[N_METRICS];
        for (int m = 0; m < N_METRICS; m++)
            v[m] = fk_csv_num(&sum, r, sm[m]);
        rc = ctab_add(t, key, v);
    }
    for (int i = 0; prefix && i < cells.n_rows; i++)
        free(prefix[i]);
    free(prefix);
    fk_csv_free(&cells);
    fk_csv_free(&sum);
    if (rc == FK_OK)
        qsort(t->r, (size_t)t->n, sizeof *t->r, cmp_row);
    return rc;
}

static const char baseline_head[] =
    "codec,dataset,options,occurrence,trace,layer,kind,rel_err_mean,attn_kl";

static int load_baseline(const char *path, struct ctab *t)
{
    struct fk_csv b;
    FK_TRY(fk_csv_load(path, &b));
    static const char *const cols[] = {"codec", "dataset", "options", "occurrence", "trace",
                                       "layer", "kind", NULL};
    int idx[8], rc = FK_OK;
    for (int k = 0; cols[k]; k++) {
        idx[k] = fk_csv_col(&b, cols[k]);
        if (idx[k] < 0)
            rc = fk_err(FK_ECORRUPT, "%s:1: expected column '%s' (header: %s)", path, cols[k],
                        baseline_head);
    }
    int im[N_METRICS];
    for (int m = 0; m < N_METRICS; m++)
        im[m] = fk_csv_col(&b, metrics[m]);
    for (int r = 0; rc == FK_OK && r < b.n_rows; r++) {
        char key[8192] = "";
        for (int k = 0; cols[k]; k++)
            csv_field(key, sizeof key, b.rows[r][idx[k]], k == 0);
        double v[N_METRICS];
        for (int m = 0; m < N_METRICS; m++)
            v[m] = fk_csv_num(&b, r, im[m]);
        rc = ctab_add(t, key, v);
    }
    fk_csv_free(&b);
    if (rc == FK_OK)
        qsort(t->r, (size_t)t->n, sizeof *t->r, cmp_row);
    for (int i = 1; rc == FK_OK && i < t->n; i++)
        if (!strcmp(t->r[i].key, t->r[i - 1].key))
            rc = fk_err(FK_ECORRUPT, "%s: row key %s appears twice", path, t->r[i].key);
    return rc;
}

static int write_baseline(const char *path, const struct ctab *t)
{
    size_t cap = 256 + (size_t)t->n * 160, n = 0;
    for (int i = 0; i < t->n; i++)
        cap += strlen(t->r[i].key);
    char *s = malloc(cap);
    if (!s)
        return fk_err(FK_ENOMEM, "out of memory");
    n += (size_t)snprintf(s + n, cap - n, "%s\n", baseline_head);
    for (int i = 0; i < t->n; i++) {
        n += (size_t)snprintf(s + n, cap - n, "%s", t->r[i].key);
        for (int m = 0; m < N_METRICS; m++) {
            if (isnan(t->r[i].v[m]))
                n += (size_t)snprintf(s + n, cap - n, ",nan");
            else
                n += (size_t)snprintf(s + n, cap - n, ",%.9g", t->r[i].v[m]);
        }
        n += (size_t)snprintf(s + n, cap - n, "\n");
    }
    int rc = fk_write_atomic(path, s, n);
    free(s);
    return rc;
}

static void check_usage(FILE *f)
{
    fprintf(f, "usage: fadkv-bench check --baseline FILE --results DIR [--rtol R] [--atol A] "
               "[--update]\n"
               "  Compares rel_err_mean and attn_kl per cell x trace x layer x kind with the\n"
               "  baseline; exit 1 on a drift beyond atol + rtol*|baseline| or a missing row.\n"
               "  --rtol R   relative tolerance (default 1e-4)\n"
               "  --atol A   absolute tolerance (default 1e-7)\n"
               "  --update   rewrite the baseline from the results (atomically)\n");
}

int fk_cli_check(int argc, char **argv)
{
    const char *base = NULL, *res = NULL;
    double rtol = 1e-4, atol = 1e-7;
    int update = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            check_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--baseline") && v) {
            base = v;
            i++;
        } else if (!strcmp(a, "--results") && v) {
            res = v;
            i++;
        } else if ((!strcmp(a, "--rtol") || !strcmp(a, "--atol")) && v) {
            double x = strtod(v, &end);
            if (*end || !(x >= 0)) {
                fprintf(stderr, "fadkv-bench check: %s %s: expected a number >= 0\n", a, v);
                return 2;
            }
            *(a[2] == 'r' ? &rtol : &atol) = x;
            i++;
        } else if (!strcmp(a, "--update")) {
            update = 1;
        } else {
            fprintf(stderr, "fadkv-bench check: unknown or incomplete option '%s'\n", a);
            check_usage(stderr);
            return 2;
        }
    }
    if (!base || !res) {
        check_usage(stderr);
        return 2;
    }
    struct ctab r = {0}, b = {0};
    if (load_results(res, &r) < 0) {
        fprintf(stderr, "fadkv-bench check: %s\n", fk_errmsg());
        ctab_free(&r);
        return 2;
    }
    for (int i = 1; i < r.n; i++)
        if (!strcmp(r.r[i].key, r.r[i - 1].key)) {
            fprintf(stderr, "fadkv-bench check: %s: two rows with key %s\n", res, r.r[i].key);
            ctab_free(&r);
            return 2;
        }
    if (update) {
        int rc = write_baseline(base, &r);
        if (rc < 0)
            fprintf(stderr, "fadkv-bench check: %s\n", fk_errmsg());
        else
            printf("check: wrote %d row(s) to %s\n", r.n, base);
        ctab_free(&r);
        return rc < 0 ? 2 : 0;
    }
    if (load_baseline(base, &b) < 0) {
        fprintf(stderr, "fadkv-bench check: %s\n", fk_errmsg());
        ctab_free(&r);
        ctab_free(&b);
        return 2;
    }
    int i = 0, j = 0, drift = 0, missing = 0, extra = 0, matched = 0, shown = 0;
    const int show_max = 50;
    while (i < b.n || j < r.n) {
        int c = i >= b.n ? 1 : j >= r.n ? -1 : strcmp(b.r[i].key, r.r[j].key);
        if (c < 0) {
            if (missing++ < 20)
                printf("MISSING (in baseline, not in results): %s\n", b.r[i].key);
            i++;
            continue;
        }
        if (c > 0) {
            if (extra++ < 20)
                printf("EXTRA (in results, not in baseline): %s\n", r.r[j].key);
            j++;
            continue;
        }
        matched++;
        for (int m = 0; m < N_METRICS; m++) {
            double x = b.r[i].v[m], y = r.r[j].v[m];
            int bad = isnan(x) != isnan(y) ||
                      (!isnan(x) && fabs(y - x) > atol + rtol * fabs(x));
            if (!bad)
                continue;
            if (!drift)
                printf("%-14s %15s %15s %11s %11s  key (codec,dataset,options,occurrence,"
                       "trace,layer,kind)\n", "metric", "baseline", "result", "abs_diff",
                       "rel_diff");
            drift++;
            if (shown++ < show_max)
                printf("%-14s %15.9g %15.9g %11.3g %11.3g  %s\n", metrics[m], x, y,
                       fabs(y - x), x != 0 ? fabs(y - x) / fabs(x) : INFINITY, b.r[i].key);
        }
        i++;
        j++;
    }
    if (shown > show_max)
        printf("... %d more drift(s) not shown\n", shown - show_max);
    if (missing > 20)
        printf("... %d more missing row(s)\n", missing - 20);
    if (extra > 20)
        printf("... %d more extra row(s)\n", extra - 20);
    int fail = drift > 0 || missing > 0;
    printf("check: %s: %d row(s) compared, %d value(s) beyond rtol %g / atol %g, %d missing, "
           "%d extra (baseline %s, results %s)\n", fail ? "REGRESSION" : "PASS", matched,
           drift, rtol, atol, missing, extra, base, res);
    ctab_free(&r);
    ctab_free(&b);
    return fail ? 1 : 0;
}
