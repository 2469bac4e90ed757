/* SPDX-License-Identifier: MIT
 * `fadkv-bench check --baseline FILE --results DIR [--tolerance portable|exact] [--rtol R]
 * [--atol A] [--metrics LIST] [--worse-only] [--strict] [--update]`: the regression gate
 * (report/fk_check.h has the rules).
 * Exit status: 0 pass; 1 regression (a drift, or a baseline row missing from the results;
 * extra result rows are reported but pass unless --strict); 2 usage or I/O error; 3 the
 * gate cannot judge (no row compared, no metric, a baseline value that is not a number).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/fk_cli.h"
#include "common/fk_err.h"
#include "report/fk_check.h"


static void check_usage(FILE *f)
{
    fprintf(f, "usage: fadkv-bench check --baseline FILE --results DIR [--tolerance portable|exact]\n"
               "                         [--rtol R] [--atol A] [--metrics LIST] [--worse-only]\n"
               "                         [--strict] [--update]\n"
               "  Compares metrics with the baseline per cell x trace x layer x kind (rows) and\n"
               "  per cell x kind, the mean over every trace and layer (aggregates, trace and\n"
               "  layer *); exit 1 on a drift beyond the tolerance or a missing row.\n"
               "  --tolerance portable  (default) each metric's cross-machine bands: what\n"
               "                  another CPU, OpenBLAS kernel set, BLAS or compiler moves it by,\n"
               "                  measured (docs/PORTABILITY.md); the table below\n"
               "  --tolerance exact     no difference at all (the same build on the same machine)\n"
               "  --rtol R, --atol A    one band for every metric and level instead:\n"
               "                  |result - baseline| <= atol + rtol * |baseline|\n"
               "  --metrics LIST  comma-separated metrics to gate (default: every metric column\n"
               "                  of the baseline) or, with --update, to record (default\n"
               "                  rel_err_mean,attn_kl,bytes)\n"
               "  --worse-only    a change for the better passes (reported as IMPROVED)\n"
               "  --strict        result rows the baseline lacks fail too\n"
               "  --update        rewrite the baseline from the results (atomically)\n"
               "  Exit status: 0 pass, 1 regression, 2 usage or I/O error, 3 nothing to judge\n"
               "  (no row compared, no metric, a baseline value that is not a finite number).\n"
               "  Gateable metrics (better: - lower, + higher, = either way) and their\n"
               "  cross-machine bands, rtol/atol of an aggregate | of a row:\n");
    for (const struct fk_metric *g = fk_metrics; g->name; g++)
        if ((g->flags & FK_MF_GATE) && g->row)
            fprintf(f, "   %-22s (%c)  %-8g / %-8g | %-8g / %g\n", g->name,
                    "-=+"[g->better + 1], g->band_agg.rtol, g->band_agg.atol, g->band_row.rtol,
                    g->band_row.atol);
}

/* Splits a comma-separated list in place (argv strings are ours to modify); empty items are
 * dropped. Returns the count, -1 when more than FK_CHECK_MAX_METRICS. */
static int split_metrics(char *list, const char **out)
{
    int n = 0;
    for (char *t = strtok(list, ","); t; t = strtok(NULL, ","))
        if (*t) {
            if (n == FK_CHECK_MAX_METRICS)
                return -1;
            out[n++] = t;
        }
    return n;
}

/* Parses the arguments into o: 0 to run, else the exit status (help, usage error). */
static int check_args(int argc, char **argv, struct fk_check_opts *o)
{
    static const char *list[FK_CHECK_MAX_METRICS];
    *o = (struct fk_check_opts){.tol = FK_CHECK_PORTABLE};
    int have_rtol = 0, have_atol = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            check_usage(stdout);
            return -1;
        } else if (!strcmp(a, "--baseline") && v) {
            o->baseline = v;
            i++;
        } else if (!strcmp(a, "--results") && v) {
            o->results = v;
            i++;
        } else if (!strcmp(a, "--tolerance") && v) {
            if (strcmp(v, "portable") && strcmp(v, "exact")) {
                fprintf(stderr, "fadkv-bench check: --tolerance %s: expected portable or "
                                "exact\n", v);
                return 2;
            }
            o->tol = !strcmp(v, "exact") ? FK_CHECK_EXACT : FK_CHECK_PORTABLE;
            i++;
        } else if ((!strcmp(a, "--rtol") || !strcmp(a, "--atol")) && v) {
            double x = strtod(v, &end);
            if (!*v || *end || !(x >= 0) || !isfinite(x)) {
                fprintf(stderr, "fadkv-bench check: %s %s: expected a finite number >= 0\n", a,
                        v);
                return 2;
            }
            if (a[2] == 'r')
                o->rtol = x, have_rtol = 1;
            else
                o->atol = x, have_atol = 1;
            i++;
        } else if (!strcmp(a, "--update")) {
            o->update = 1;
        } else if (!strcmp(a, "--worse-only")) {
            o->worse_only = 1;
        } else if (!strcmp(a, "--strict")) {
            o->strict = 1;
        } else if (!strcmp(a, "--metrics") && v) {
            int n = split_metrics(argv[++i], list);
            if (n < 0) {
                fprintf(stderr, "fadkv-bench check: --metrics: at most %d metrics\n",
                        FK_CHECK_MAX_METRICS);
                return 2;
            }
            o->metrics = list;
            o->n_metrics = n;
        } else {
            fprintf(stderr, "fadkv-bench check: unknown or incomplete option '%s'\n", a);
            check_usage(stderr);
            return 2;
        }
    }
    if (have_rtol || have_atol)
        o->tol = FK_CHECK_CUSTOM; /* the one not given is 0 */
    if (!o->baseline || !o->results) {
        check_usage(stderr);
        return 2;
    }
    return 0;
}

static const char *tol_name(const struct fk_check_opts *o)
{
    static char s[96];
    if (o->tol == FK_CHECK_PORTABLE)
        return "the cross-machine bands";
    if (o->tol == FK_CHECK_EXACT)
        return "exact";
    snprintf(s, sizeof s, "rtol %g / atol %g", o->rtol, o->atol);
    return s;
}

/* The findings, at most 20 missing, 20 extra and 50 drifts shown. */
static void print_findings(const struct fk_check_result *r)
{
    int missing = 0, extra = 0, shown = 0, header = 0;
    const int show_max = 50;
    for (int i = 0; i < r->n_diffs; i++) {
        const struct fk_check_diff *d = &r->diffs[i];
        if (d->kind == FK_CHECK_MISSING) {
            if (missing++ < 20)
                printf("MISSING (in baseline, not in results): %s\n", d->key);
            continue;
        }
        if (d->kind == FK_CHECK_EXTRA) {
            if (extra++ < 20)
                printf("EXTRA (in results, not in baseline): %s\n", d->key);
            continue;
        }
        if (!header++)
            printf("%-9s %-20s %15s %15s %11s %11s %-8s key (codec,dataset,options,occurrence,"
                   "trace,layer,kind)\n", "finding", "metric", "baseline", "result",
                   "abs_diff", "rel_diff", "band");
        double x = d->baseline, y = d->result;
        if (shown++ < show_max)
            printf("%-9s %-20s %15.9g %15.9g %11.3g %11.3g %-8s %s\n",
                   d->kind == FK_CHECK_IMPROVED ? "IMPROVED" : "DRIFT", r->metric[d->metric],
                   x, y, fabs(y - x), x != 0 ? fabs(y - x) / fabs(x) : INFINITY,
                   d->beyond_band ? "beyond" : "within", d->key);
    }
    if (shown > show_max)
        printf("... %d more drift(s) not shown\n", shown - show_max);
    if (missing > 20)
        printf("... %d more missing row(s)\n", missing - 20);
    if (extra > 20)
        printf("... %d more extra row(s)\n", extra - 20);
    if (header)
        printf("(band: beyond or within the metric's cross-machine band at that level; a drift "
               "within it is what another machine or BLAS may give, docs/PORTABILITY.md)\n");
}

/* Per metric, the largest relative drift at each level and its share of the band. */
static void print_extremes(const struct fk_check_result *r)
{
    printf("largest drift per metric (relative; x of the cross-machine band): ");
    for (int m = 0; m < r->n_metrics; m++)
        printf("%s%s aggregate %.2g (x%.2g), row %.2g (x%.2g)", m ? "; " : "", r->metric[m],
               r->extreme[m][0].rel, r->extreme[m][0].band_use, r->extreme[m][1].rel,
               r->extreme[m][1].band_use);
    printf("\n");
}

static void print_result(const struct fk_check_opts *o, const struct fk_check_result *r)
{
    print_findings(r);
    print_extremes(r);
    printf("check: %s: %d row(s) compared (%d aggregates) on", r->fail ? "REGRESSION" : "PASS",
           r->matched, r->matched_agg);
    for (int m = 0; m < r->n_metrics; m++)
        printf("%s%s", m ? "," : " ", r->metric[m]);
    printf(", %d value(s) beyond %s", r->drift, tol_name(o));
    if (o->tol != FK_CHECK_PORTABLE)
        printf(" (%d beyond the cross-machine bands)", r->beyond_band);
    if (o->worse_only)
        printf(" for the worse, %d for the better", r->improved);
    printf(", %d missing, %d extra%s (baseline %s, results %s)\n", r->missing, r->extra,
           o->strict && r->extra ? " (--strict: they fail)" : "", o->baseline, o->results);
}

int fk_cli_check(int argc, char **argv)
{
    struct fk_check_opts o;
    int st = check_args(argc, argv, &o);
    if (st)
        return st < 0 ? 0 : st;
    /* a damaged cell is skipped, so its rows count as missing: the gate fails; a baseline
     * is never recorded from a directory with one */
    if (fk_cli_warn_damaged("check", o.results) > 0 && o.update) {
        fprintf(stderr, "fadkv-bench check: %s has damaged cells: refusing to record a "
                        "baseline from it\n", o.results);
        return 1;
    }
    struct fk_check_result r;
    int rc = fk_check_run(&o, &r);
    if (rc < 0) {
        fprintf(stderr, "fadkv-bench check: %s\n", fk_errmsg());
        return rc == FK_CHECK_UNJUDGED ? 3 : 2;
    }
    if (o.update)
        printf("check: wrote %d row(s) to %s\n", r.written, o.baseline);
    else
        print_result(&o, &r);
    int fail = r.fail;
    fk_check_result_free(&r);
    return fail ? 1 : 0;
}
