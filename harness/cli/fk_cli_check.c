/* SPDX-License-Identifier: MIT
 * `fadkv-bench check --baseline FILE --results DIR [--rtol R] [--atol A] [--metrics LIST]
 * [--worse-only] [--update]`: the regression gate (report/fk_check.h has the rules).
 * Exit status: 0 pass; 1 regression (a drift, or a baseline row missing from the results;
 * extra result rows are reported but pass); 2 usage or I/O error.
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
    fprintf(f, "usage: fadkv-bench check --baseline FILE --results DIR [--rtol R] [--atol A] "
               "[--metrics LIST] [--worse-only] [--update]\n"
               "  Compares metrics per cell x trace x layer x kind with the baseline; exit 1\n"
               "  on a drift beyond atol + rtol*|baseline| or a missing row.\n"
               "  --rtol R        relative tolerance (default 1e-4)\n"
               "  --atol A        absolute tolerance (default 1e-7)\n"
               "  --metrics LIST  comma-separated metrics to gate (default: every metric column\n"
               "                  of the baseline) or, with --update, to record (default\n"
               "                  rel_err_mean,attn_kl)\n"
               "  --worse-only    a change for the better passes (reported as IMPROVED)\n"
               "  --update        rewrite the baseline from the results (atomically)\n"
               "  Gateable metrics (better: - lower, + higher, = either way):\n   ");
    for (int i = 0; fk_check_gateable[i].name; i++)
        fprintf(f, "%s %s(%c)", i && i % 5 == 0 ? "\n   " : "", fk_check_gateable[i].name,
                "-=+"[fk_check_gateable[i].better + 1]);
    fprintf(f, "\n");
}

/* Parses the arguments into o: 0 to run, else the exit status (help, usage error). */
static int check_args(int argc, char **argv, struct fk_check_opts *o)
{
    *o = (struct fk_check_opts){.rtol = 1e-4, .atol = 1e-7};
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
        } else if ((!strcmp(a, "--rtol") || !strcmp(a, "--atol")) && v) {
            double x = strtod(v, &end);
            if (*end || !(x >= 0)) {
                fprintf(stderr, "fadkv-bench check: %s %s: expected a number >= 0\n", a, v);
                return 2;
            }
            *(a[2] == 'r' ? &o->rtol : &o->atol) = x;
            i++;
        } else if (!strcmp(a, "--update")) {
            o->update = 1;
        } else if (!strcmp(a, "--worse-only")) {
            o->worse_only = 1;
        } else if (!strcmp(a, "--metrics") && v) {
            /* split in place: argv strings are ours to modify */
            static const char *list[FK_CHECK_MAX_METRICS];
            int n = 0;
            for (char *t = strtok(argv[++i], ","); t; t = strtok(NULL, ","))
                if (n < FK_CHECK_MAX_METRICS)
                    list[n++] = t;
            o->metrics = list;
            o->n_metrics = n;
        } else {
            fprintf(stderr, "fadkv-bench check: unknown or incomplete option '%s'\n", a);
            check_usage(stderr);
            return 2;
        }
    }
    if (!o->baseline || !o->results) {
        check_usage(stderr);
        return 2;
    }
    return 0;
}

/* The findings, at most 20 missing, 20 extra and 50 drifts shown, then the verdict. */
static void print_result(const struct fk_check_opts *o, const struct fk_check_result *r)
{
    int missing = 0, extra = 0, drift = 0, shown = 0, improved = 0;
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
        if (!drift++ && !improved)
            printf("%-9s %-20s %15s %15s %11s %11s  key (codec,dataset,options,occurrence,"
                   "trace,layer,kind)\n", "finding", "metric", "baseline", "result",
                   "abs_diff", "rel_diff");
        if (d->kind == FK_CHECK_IMPROVED)
            drift--, improved++;
        double x = d->baseline, y = d->result;
        if (shown++ < show_max)
            printf("%-9s %-20s %15.9g %15.9g %11.3g %11.3g  %s\n",
                   d->kind == FK_CHECK_IMPROVED ? "IMPROVED" : "DRIFT", r->metric[d->metric],
                   x, y, fabs(y - x), x != 0 ? fabs(y - x) / fabs(x) : INFINITY, d->key);
    }
    if (shown > show_max)
        printf("... %d more drift(s) not shown\n", shown - show_max);
    if (missing > 20)
        printf("... %d more missing row(s)\n", missing - 20);
    if (extra > 20)
        printf("... %d more extra row(s)\n", extra - 20);
    printf("check: %s: %d row(s) compared on", r->fail ? "REGRESSION" : "PASS", r->matched);
    for (int m = 0; m < r->n_metrics; m++)
        printf("%s%s", m ? "," : " ", r->metric[m]);
    printf(", %d value(s) beyond rtol %g / atol %g", r->drift, o->rtol, o->atol);
    if (o->worse_only)
        printf(" for the worse, %d for the better", r->improved);
    printf(", %d missing, %d extra (baseline %s, results %s)\n", r->missing, r->extra,
           o->baseline, o->results);
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
    if (fk_check_run(&o, &r) < 0) {
        fprintf(stderr, "fadkv-bench check: %s\n", fk_errmsg());
        return 2;
    }
    if (o.update)
        printf("check: wrote %d row(s) to %s\n", r.written, o.baseline);
    else
        print_result(&o, &r);
    int fail = r.fail;
    fk_check_result_free(&r);
    return fail ? 1 : 0;
}
