/* SPDX-License-Identifier: MIT
 * Figure export, regression gate and CSV reader (report/fk_plotdata.c, report/fk_check.c,
 * store/fk_csv.c), and the JSON reader and writer (common/fk_json.c):
 * the CSV reader on quoting corner cases; the bootstrap interval against the exact bootstrap
 * distribution of a 3-point sample and against the normal-theory interval of a 40-point
 * sample; `check` on a hand-made results store (identical data passes, a drift beyond rtol
 * fails, within rtol passes, missing / extra rows are reported, cell ids do not matter, NaN
 * handling, update); the exporter skips figures with a note when the store lacks their data;
 * the cross-family Pareto (frontiers, labels, family styles) and the equal-budget table (best
 * setting per budget, ties, "—", the rel_err_mean fallback without attention) on a hand-made
 * store, and both on results older than the per-head byte columns;
 * JSON escaping round-trips and syntax errors name line:col; provenance.json round-trips
 * through the store; a path past PATH_MAX is an error, not a truncation.
 * The end-to-end merge / shard test is tests/test_sweep_tools.sh.
 */
#include "fk_check_main.h"
#include "fk_test_store.h"
#include "common/fk_err.h"
#include "common/fk_json.h"
#include "common/fk_sha256.h"
#include "common/fk_str.h"
#include "report/fk_check.h"
#include "report/fk_plotdata.h"
#include "formats/fk_trace.h"
#include "core/fk_registry.h"
#include "store/fk_metrics.h"
#include "store/fk_results.h"
#include "store/fk_results_loop.h"

#include <check.h>
#include <gsl/gsl_randist.h>
#include <gsl/gsl_rng.h>
#include <gsl/gsl_statistics_double.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_dir[256];

static void make_dir(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/fk-test-plot-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(g_dir));
}

static void put(const char *name, const char *text)
{
    fk_test_put(g_dir, name, text);
}

/* Records cell `id` of results directory `res` (relative to g_dir) as a finished cell would
 * be (fk_test_seal). */
static void seal_cell(const char *res, const char *id)
{
    fk_test_seal(g_dir, res, id);
}

/* seal_cell for every row of res/cells.csv whose status is ok. */
static void seal_ok_rows(const char *res)
{
    char p[512];
    struct fk_csv c;
    snprintf(p, sizeof p, "%s/%s/cells.csv", g_dir, res);
    ck_assert_int_eq(fk_csv_load(p, &c), FK_OK);
    int ci = fk_csv_col(&c, "cell_id"), cs = fk_csv_col(&c, "status");
    for (int i = 0; i < c.n_rows; i++)
        if (!strcmp(c.rows[i][cs], "ok"))
            seal_cell(res, c.rows[i][ci]);
    fk_csv_free(&c);
}

static void rm_dir(void)
{
    fk_test_rm(g_dir);
}

/* ---- CSV --------------------------------------------------------------------------------- */

START_TEST(csv_quoting)
{
    make_dir();
    put("a.csv", "id,name,val\r\n1,\"a,b\",2.5\r\n2,\"say \"\"hi\"\"\",nan\n\n3,x\n");
    char p[512];
    snprintf(p, sizeof p, "%s/a.csv", g_dir);
    struct fk_csv c;
    ck_assert_int_eq(fk_csv_load(p, &c), FK_OK);
    ck_assert_int_eq(c.n_cols, 3);
    ck_assert_int_eq(c.n_rows, 3);
    ck_assert_str_eq(c.rows[0][1], "a,b");
    ck_assert_str_eq(c.rows[1][1], "say \"hi\"");
    ck_assert_str_eq(c.rows[2][2], "");            /* short row padded */
    ck_assert(fabs(fk_csv_num(&c, 0, 2) - 2.5) < 1e-15);
    ck_assert(isnan(fk_csv_num(&c, 1, 2)));
    ck_assert(isnan(fk_csv_num(&c, 2, 2)));
    ck_assert_int_eq(fk_csv_col(&c, "val"), 2);
    ck_assert_int_eq(fk_csv_col(&c, "nope"), -1);
    fk_csv_free(&c);
    put("b.csv", "a,b\n1,\"open\n");
    snprintf(p, sizeof p, "%s/b.csv", g_dir);
    ck_assert_int_eq(fk_csv_load(p, &c), FK_ECORRUPT);
    ck_assert_ptr_nonnull(strstr(fk_errmsg(), "b.csv:2"));
    put("c.csv", "a,b\n1,2,3\n");
    snprintf(p, sizeof p, "%s/c.csv", g_dir);
    ck_assert_int_eq(fk_csv_load(p, &c), FK_ECORRUPT);
    rm_dir();
}
END_TEST

/* ---- bootstrap ----------------------------------------------------------------------------- */

START_TEST(boot_exact_small)
{
    /* x = {0, 1, 5}: the 27 equally likely resamples have means k/3; P(mean = 0) = P(mean = 5)
     * = 1/27 > 2.5%, so the 2.5% and 97.5% quantiles of the bootstrap distribution are 0 and 5
     * (the estimate from 2000 resamples lands there unless the count is 3 sigma off). */
    double x[4] = {0, 1, 5, NAN}, m, lo, hi, m2, lo2, hi2;
    ck_assert_int_eq(fk_boot_mean_ci(x, 4, 2000, 7, &m, &lo, &hi), FK_OK);
    ck_assert(fabs(m - 2) < 1e-15);
    ck_assert(fabs(lo - 0) < 1e-12);
    ck_assert(fabs(hi - 5) < 1e-12);
    ck_assert_int_eq(fk_boot_mean_ci(x, 4, 2000, 7, &m2, &lo2, &hi2), FK_OK);
    ck_assert(lo == lo2 && hi == hi2);               /* seeded: reproducible */
    ck_assert_int_eq(fk_boot_mean_ci(x, 1, 2000, 7, &m, &lo, &hi), FK_OK);
    ck_assert(m == 0 && lo == 0 && hi == 0);         /* one value: no interval */
    ck_assert_int_eq(fk_boot_mean_ci(x + 3, 1, 2000, 7, &m, &lo, &hi), FK_OK);
    ck_assert(isnan(m) && isnan(lo) && isnan(hi));
}
END_TEST

START_TEST(boot_normal_theory)
{
    /* 40 normal draws: the percentile bootstrap interval of the mean approximates
     * mean +- 1.96 * sd_plugin / sqrt(n) (independent oracle: GSL sd). */
    enum { N = 40 };
    double x[N];
    gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
    gsl_rng_set(r, 12345);
    for (int i = 0; i < N; i++)
        x[i] = 3 + gsl_ran_gaussian(r, 2.0);
    gsl_rng_free(r);
    double m, lo, hi;
    ck_assert_int_eq(fk_boot_mean_ci(x, N, 4000, FK_BOOT_SEED, &m, &lo, &hi), FK_OK);
    double mu = gsl_stats_mean(x, 1, N);
    double sd = gsl_stats_sd_m(x, 1, N, mu) * sqrt((N - 1.0) / N);
    double half = 1.96 * sd / sqrt(N);
    ck_assert(fabs(m - mu) < 1e-12);
    ck_assert_msg(fabs((hi - lo) / 2 - half) < 0.12 * half, "half %g vs %g", (hi - lo) / 2,
                  half);
    ck_assert(fabs((lo + hi) / 2 - mu) < 0.15 * half);
}
END_TEST

/* ---- check ----------------------------------------------------------------------------------- */

static const char cells_csv[] =
    "cell_id,codec,dataset,status,n_b,s,n,n_traces,traces,dictionary,seed,attn_stride,"
    "rel_err_mean\n"
    "aaaaaaaaaaaaaaa1,lexico,ds,ok,128,8,,2,t0.h5;t1.h5,d.h5,1,16,0.5\n"
    "aaaaaaaaaaaaaaa2,gm,ds,ok,128,4,256,2,t0.h5;t1.h5,d.h5,2,16,0.6\n"
    "aaaaaaaaaaaaaaa3,gm,ds,failed,128,2,256,2,t0.h5;t1.h5,d.h5,3,16,nan\n";

static void summary(double v, const char *id1, int drop_last, int extra)
{
    char s[4096];
    int n = snprintf(s, sizeof s, "cell_id,codec,trace,layer,kind,rel_err_mean,attn_kl\n");
    const char *ids[2] = {id1, "aaaaaaaaaaaaaaa2"};
    int rows = 0;
    for (int c = 0; c < 2; c++)
        for (int t = 0; t < 2; t++)
            for (int l = 0; l < 2; l++)
                for (int k = 0; k < 2; k++) {
                    if (drop_last && c == 1 && t == 1 && l == 1 && k == 1)
                        continue;
                    double e = 0.1 * (c + 1) + 0.01 * t + 0.001 * l + 0.0001 * k;
                    if (rows == 0)
                        e = v;
                    /* attn_kl: NaN for gm layer 1 in both baseline and results */
                    n += snprintf(s + n, sizeof s - (size_t)n, "%s,%s,t%d.h5,%d,%c,%.9g,%s\n",
                                  ids[c], c ? "gm" : "lexico", t, l, k ? 'V' : 'K', e,
                                  c && l ? "nan" : "0.25");
                    rows++;
                }
    if (extra)
        snprintf(s + n, sizeof s - (size_t)n, "aaaaaaaaaaaaaaa2,gm,t2.h5,0,K,0.3,0.2\n");
    put("res/summary.csv", s);
}

/* Runs the gate in-process (rtol / atol: the defaults of the CLI unless given); returns
 * 0 pass, 1 regression, 2 error like the CLI. r is freed by the caller. */
static int run_check(int update, double rtol, double atol, struct fk_check_result *r)
{
    char base[512], res[512];
    snprintf(base, sizeof base, "%s/baseline.csv", g_dir);
    snprintf(res, sizeof res, "%s/res", g_dir);
    static const char *const metrics[] = {"rel_err_mean", "attn_kl"};
    struct fk_check_opts o = {.baseline = base, .results = res, .tol = FK_CHECK_CUSTOM,
                              .rtol = rtol, .atol = atol, .update = update,
                              .metrics = metrics, .n_metrics = 2};
    if (fk_check_run(&o, r) < 0)
        return 2;
    return r->fail ? 1 : 0;
}

/* 1 when r holds a finding of kind k with this key (and metric, for drifts). */
static int has_diff(const struct fk_check_result *r, enum fk_check_kind k, const char *key,
                    int metric)
{
    for (int i = 0; i < r->n_diffs; i++)
        if (r->diffs[i].kind == k && !strcmp(r->diffs[i].key, key) &&
            (k != FK_CHECK_DRIFT || r->diffs[i].metric == metric))
            return 1;
    return 0;
}

#define RTOL 1e-4
#define ATOL 1e-7

START_TEST(check_gate)
{
    make_dir();
    char p[512];
    struct fk_check_result r;
    snprintf(p, sizeof p, "%s/res", g_dir);
    ck_assert_int_eq(mkdir(p, 0755), 0);
    put("res/cells.csv", cells_csv);
    seal_cell("res", "aaaaaaaaaaaaaaa1");
    seal_cell("res", "aaaaaaaaaaaaaaa2");
    seal_cell("res", "bbbbbbbbbbbbbbb1");
    summary(0.1, "aaaaaaaaaaaaaaa1", 0, 0);
    /* update writes the baseline (16 rows and 4 aggregates, the failed cell has none) */
    ck_assert_int_eq(run_check(1, RTOL, ATOL, &r), 0);
    ck_assert_int_eq(r.written, 20);
    fk_check_result_free(&r);
    snprintf(p, sizeof p, "%s/baseline.csv", g_dir);
    struct fk_csv b;
    ck_assert_int_eq(fk_csv_load(p, &b), FK_OK);
    ck_assert_int_eq(b.n_rows, 20);
    /* the aggregate of lexico's K rows: the mean of its four rows (0.1 for the first) */
    int tr = fk_csv_col(&b, "trace"), kd = fk_csv_col(&b, "kind"),
        re = fk_csv_col(&b, "rel_err_mean");
    int found = 0;
    for (int i = 0; i < b.n_rows; i++)
        if (!strcmp(b.rows[i][0], "lexico") && !strcmp(b.rows[i][tr], "*") &&
            !strcmp(b.rows[i][kd], "K")) {
            double want = (0.1 + 0.101 + 0.11 + 0.111) / 4;
            ck_assert_msg(fabs(fk_csv_num(&b, i, re) - want) < 1e-12, "aggregate %s",
                          b.rows[i][re]);
            found = 1;
        }
    ck_assert(found);
    int opt = fk_csv_col(&b, "options");
    int has_default = 0, has_s4 = 0;
    for (int i = 0; i < b.n_rows; i++) {
        has_default |= !strcmp(b.rows[i][opt], "default");
        has_s4 |= !strcmp(b.rows[i][opt], "n=256;s=4");
    }
    /* lexico at defaults; gm: s and n differ from the defaults (8; 0, N/16 from the data) */
    ck_assert(has_default && has_s4);
    fk_csv_free(&b);
    /* identical: pass */
    ck_assert_int_eq(run_check(0, RTOL, ATOL, &r), 0);
    ck_assert_int_eq(r.matched, 20);
    ck_assert_int_eq(r.matched_agg, 4);
    ck_assert_int_eq(r.n_diffs, 0);
    fk_check_result_free(&r);
    /* within rtol: pass; beyond: fail, naming the metric and the row */
    summary(0.1 * (1 + 5e-5), "aaaaaaaaaaaaaaa1", 0, 0);
    ck_assert_int_eq(run_check(0, RTOL, ATOL, &r), 0);
    fk_check_result_free(&r);
    summary(0.1 * (1 + 5e-3), "aaaaaaaaaaaaaaa1", 0, 0);
    ck_assert_int_eq(run_check(0, RTOL, ATOL, &r), 1);
    ck_assert_int_eq(r.drift, 2); /* the row and its cell's K aggregate */
    ck_assert(has_diff(&r, FK_CHECK_DRIFT, "lexico,ds,default,0,t0.h5,0,K", 0));
    ck_assert(has_diff(&r, FK_CHECK_DRIFT, "lexico,ds,default,0,*,*,K", 0));
    ck_assert_str_eq(fk_check_metrics[0], "rel_err_mean");
    fk_check_result_free(&r);
    ck_assert_int_eq(run_check(0, 1e-2, ATOL, &r), 0);
    fk_check_result_free(&r);
    ck_assert_int_eq(run_check(0, RTOL, 1e-3, &r), 0);
    fk_check_result_free(&r);
    /* another cell id (new harness version), same configuration: still matched */
    put("res/cells.csv", "cell_id,codec,dataset,status,n_b,s,n,n_traces,traces,dictionary,"
                         "seed,attn_stride,rel_err_mean\n"
                         "bbbbbbbbbbbbbbb1,lexico,ds,ok,128,8,,2,t0.h5;t1.h5,d.h5,9,16,0.5\n"
                         "aaaaaaaaaaaaaaa2,gm,ds,ok,128,4,256,2,t0.h5;t1.h5,d.h5,2,16,0.6\n");
    summary(0.1, "bbbbbbbbbbbbbbb1", 0, 0);
    ck_assert_int_eq(run_check(0, RTOL, ATOL, &r), 0);
    fk_check_result_free(&r);
    /* a missing row fails, an extra row is reported and passes */
    summary(0.1, "bbbbbbbbbbbbbbb1", 1, 0);
    ck_assert_int_eq(run_check(0, RTOL, ATOL, &r), 1);
    ck_assert_int_eq(r.missing, 1);
    ck_assert(has_diff(&r, FK_CHECK_MISSING, "gm,ds,n=256;s=4,0,t1.h5,1,V", 0));
    ck_assert(has_diff(&r, FK_CHECK_DRIFT, "gm,ds,n=256;s=4,0,*,*,V", 0)); /* its mean moved */
    fk_check_result_free(&r);
    summary(0.1, "bbbbbbbbbbbbbbb1", 0, 1);
    ck_assert_int_eq(run_check(0, RTOL, ATOL, &r), 0); /* not in the K mean either */
    ck_assert_int_eq(r.extra, 1);
    ck_assert(has_diff(&r, FK_CHECK_EXTRA, "gm,ds,n=256;s=4,0,t2.h5,0,K", 0));
    fk_check_result_free(&r);
    /* NaN in the results where the baseline has a number: a drift */
    put("res/cells.csv", cells_csv);
    summary(NAN, "aaaaaaaaaaaaaaa1", 0, 0);
    ck_assert_int_eq(run_check(0, RTOL, ATOL, &r), 1);
    fk_check_result_free(&r);
    /* bad use: no baseline, a negative tolerance */
    struct fk_check_opts bad = {.results = "x"};
    ck_assert_int_eq(fk_check_run(&bad, &r), FK_EINVAL);
    bad.baseline = "y";
    bad.tol = FK_CHECK_CUSTOM;
    bad.rtol = -1;
    ck_assert_int_eq(fk_check_run(&bad, &r), FK_EINVAL);
    rm_dir();
}
END_TEST

/* ---- JSON ------------------------------------------------------------------------------------ */

START_TEST(json_round_trip)
{
    struct fk_json_w w;
    memset(&w, 0, sizeof w);
    fk_json_begin_object(&w);
    fk_json_key(&w, "s");
    fk_json_str(&w, "a \"q\" \\ /\n\t\x01 \xc3\xa9");
    fk_json_key(&w, "n");
    fk_json_int(&w, -12);
    fk_json_key(&w, "a");
    fk_json_begin_array(&w);
    fk_json_str(&w, "x");
    fk_json_num(&w, 0.5);
    fk_json_bool(&w, 1);
    fk_json_end_array(&w);
    fk_json_end_object(&w);
    char *text;
    size_t len;
    ck_assert_int_eq(fk_json_finish(&w, &text, &len), FK_OK);
    ck_assert_str_eq(text, "{\n  \"s\": \"a \\\"q\\\" \\\\ /\\n\\t\\u0001 \xc3\xa9\",\n"
                           "  \"n\": -12,\n  \"a\": [\"x\", 0.5, true]\n}\n");
    struct fk_json *v;
    ck_assert_int_eq(fk_json_parse(text, "t.json", &v), FK_OK);
    ck_assert_str_eq(fk_json_get(v, "s")->str, "a \"q\" \\ /\n\t\x01 \xc3\xa9");
    ck_assert(fk_json_get(v, "n")->num == -12);
    ck_assert_int_eq(fk_json_get(v, "a")->n, 3);
    ck_assert_ptr_null(fk_json_get(v, "nope"));
    fk_json_free(&v);
    free(text);
    /* \u escapes, surrogate pairs */
    ck_assert_int_eq(fk_json_parse("{\"k\": \"\\u00e9\\ud83d\\ude00\"}", "u", &v), FK_OK);
    ck_assert_str_eq(fk_json_get(v, "k")->str, "\xc3\xa9\xf0\x9f\x98\x80");
    fk_json_free(&v);
    /* errors name line:col */
    static const char *const bad[][2] = {
        {"{\n  \"a\": 1,\n}", "b.json:3:1"},       /* trailing comma */
        {"{\"a\": 01}", "b.json:1:8"},              /* leading zero */
        {"{\"a\": \"x\\q\"}", "b.json:1:9"},        /* bad escape */
        {"{\"a\": 1} x", "b.json:1:10"},            /* text after the value */
        {"{\"a\" 1}", "b.json:1:6"},                /* missing colon */
        {"[1, 2", "b.json:1:6"},                    /* unterminated */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(fk_json_parse(bad[i][0], "b.json", &v), FK_ECORRUPT);
        ck_assert_msg(strstr(fk_errmsg(), bad[i][1]), "%s: %s", bad[i][0], fk_errmsg());
    }
    /* misuse of the writer */
    memset(&w, 0, sizeof w);
    fk_json_begin_object(&w);
    fk_json_str(&w, "no key");
    fk_json_end_object(&w);
    ck_assert_int_eq(fk_json_finish(&w, &text, &len), FK_EINVAL);
}
END_TEST

/* ---- provenance and paths ------------------------------------------------------------------ */

START_TEST(provenance_round_trip)
{
    make_dir();
    const char *shards[] = {"a", "b \"q\""};
    struct fk_provenance p = {.merged_from = shards, .n_merged_from = 2, .harness = "h",
                              .config = "c\\d.toml", .config_hash = "abc", .cells = 3,
                              .jobs = FK_PROV_NONE, .blas_threads_per_worker = 1,
                              .online_cpus = -1, .cpu = "x\ty"};
    ck_assert_int_eq(fk_store_provenance_write(g_dir, &p), FK_OK);
    char path[512];
    snprintf(path, sizeof path, "%s/provenance.json", g_dir);
    char *t1 = fk_slurp(path, NULL);
    ck_assert_ptr_nonnull(t1);
    ck_assert_str_eq(t1, "{\n  \"merged_from\": [\"a\", \"b \\\"q\\\"\"],\n  \"harness\": \"h\",\n"
                         "  \"config\": \"c\\\\d.toml\",\n  \"config_hash\": \"abc\",\n"
                         "  \"cells\": 3,\n  \"blas_threads_per_worker\": 1,\n"
                         "  \"cpu\": \"x\\ty\",\n  \"online_cpus\": -1\n}\n");
    struct fk_provenance q;
    ck_assert_msg(fk_store_provenance_read(g_dir, &q) == FK_OK, "%s", fk_errmsg());
    ck_assert_str_eq(q.config, "c\\d.toml");
    ck_assert_str_eq(q.cpu, "x\ty");
    ck_assert_int_eq(q.cells, 3);
    ck_assert_int_eq(q.jobs, FK_PROV_NONE);
    q.merged_from = shards;
    q.n_merged_from = 2;
    ck_assert_int_eq(fk_store_provenance_write(g_dir, &q), FK_OK);
    fk_store_provenance_free(&q);
    char *t2 = fk_slurp(path, NULL);
    ck_assert_str_eq(t1, t2);
    free(t1);
    free(t2);
    /* no config_hash, a wrong type: errors naming the file */
    put("provenance.json", "{\"cells\": \"3\", \"config_hash\": \"x\"}\n");
    ck_assert_int_eq(fk_store_provenance_read(g_dir, &q), FK_ECORRUPT);
    ck_assert_ptr_nonnull(strstr(fk_errmsg(), "provenance.json:1:11"));
    put("provenance.json", "{}\n");
    ck_assert_int_eq(fk_store_provenance_read(g_dir, &q), FK_ECORRUPT);
    /* a directory name near PATH_MAX: the store refuses instead of truncating */
    char *longdir = malloc(PATH_MAX);
    ck_assert_ptr_nonnull(longdir);
    memset(longdir, 'd', PATH_MAX - 10);
    longdir[0] = '/';
    longdir[PATH_MAX - 10] = 0;
    char *q2 = NULL;
    ck_assert_int_eq(fk_store_path(&q2, longdir, "provenance.json"), FK_EINVAL);
    ck_assert_ptr_null(q2);
    ck_assert_ptr_nonnull(strstr(fk_errmsg(), "path too long"));
    ck_assert_int_eq(fk_store_provenance_write(longdir, &p), FK_EINVAL);
    free(longdir);
    rm_dir();
}
END_TEST

/* ---- export ---------------------------------------------------------------------------------- */

/* summary.csv of cell aaaaaaaaaaaaaaa1 (lexico) with attn_cos and bytes beside the errors:
 * row 0 gets (cos, bytes), the other rows fixed values. */
static void summary_cos_bytes(double cos0, double bytes0)
{
    char s[2048];
    int n = snprintf(s, sizeof s, "cell_id,codec,trace,layer,kind,rel_err_mean,attn_kl,"
                                  "attn_cos,bytes\n");
    for (int l = 0; l < 2; l++)
        for (int k = 0; k < 2; k++)
            n += snprintf(s + n, sizeof s - (size_t)n, "aaaaaaaaaaaaaaa1,lexico,t0.h5,%d,%c,"
                          "0.1,0.2,%.9g,%.9g\n", l, k ? 'V' : 'K',
                          l + k ? 0.9 : cos0, l + k ? 100.0 : bytes0);
    put("res/summary.csv", s);
}

/* check --metrics chooses what a baseline records and what is gated; --worse-only lets a
 * change for the better pass (lower bytes, higher cosine) and still fails one for the
 * worse; metrics the baseline lacks or that cannot be gated are refused by name. */
START_TEST(check_metrics_worse_only)
{
    make_dir();
    char p[512];
    snprintf(p, sizeof p, "%s/res", g_dir);
    ck_assert_int_eq(mkdir(p, 0755), 0);
    put("res/cells.csv", "cell_id,codec,dataset,status,n_b,s,n,n_traces,traces,dictionary,"
                         "seed,attn_stride,rel_err_mean\n"
                         "aaaaaaaaaaaaaaa1,lexico,ds,ok,128,8,,1,t0.h5,d.h5,1,16,0.1\n");
    seal_cell("res", "aaaaaaaaaaaaaaa1");
    summary_cos_bytes(0.9, 100);
    char base[512], res[512];
    snprintf(base, sizeof base, "%s/baseline.csv", g_dir);
    snprintf(res, sizeof res, "%s/res", g_dir);
    const char *pick[] = {"attn_cos", "bytes"};
    struct fk_check_opts o = {.baseline = base, .results = res, .tol = FK_CHECK_CUSTOM,
                              .rtol = RTOL, .atol = ATOL, .update = 1, .metrics = pick,
                              .n_metrics = 2};
    struct fk_check_result r;
    ck_assert_int_eq(fk_check_run(&o, &r), FK_OK);
    ck_assert_int_eq(r.written, 6); /* 4 rows, the K and V aggregates */
    fk_check_result_free(&r);
    struct fk_csv b;
    ck_assert_int_eq(fk_csv_load(base, &b), FK_OK);
    ck_assert_int_eq(b.n_cols, 9);
    ck_assert_str_eq(b.head[7], "attn_cos");
    ck_assert_str_eq(b.head[8], "bytes");
    fk_csv_free(&b);
    o.update = 0;
    o.metrics = NULL; /* gate what the baseline holds */
    o.n_metrics = 0;
    ck_assert_int_eq(fk_check_run(&o, &r), FK_OK);
    ck_assert(!r.fail && r.matched == 6 && r.n_metrics == 2);
    fk_check_result_free(&r);
    /* better on both (row 0 and the K aggregate): a regression two-sided, a pass with
     * --worse-only */
    summary_cos_bytes(0.95, 90);
    ck_assert_int_eq(fk_check_run(&o, &r), FK_OK);
    ck_assert(r.fail && r.drift == 4);
    fk_check_result_free(&r);
    o.worse_only = 1;
    ck_assert_int_eq(fk_check_run(&o, &r), FK_OK);
    ck_assert(!r.fail && r.drift == 0 && r.improved == 4);
    ck_assert(has_diff(&r, FK_CHECK_IMPROVED, "lexico,ds,default,0,t0.h5,0,K", 0));
    ck_assert_str_eq(r.metric[0], "attn_cos");
    fk_check_result_free(&r);
    /* worse cosine, better bytes: fails on the cosine only */
    summary_cos_bytes(0.8, 90);
    ck_assert_int_eq(fk_check_run(&o, &r), FK_OK);
    ck_assert(r.fail && r.drift == 2 && r.improved == 2);
    ck_assert(has_diff(&r, FK_CHECK_DRIFT, "lexico,ds,default,0,t0.h5,0,K", 0));
    fk_check_result_free(&r);
    /* asked metric absent from the baseline; not a gateable metric */
    const char *absent[] = {"attn_kl"}, *bogus[] = {"cpu_s"};
    o.metrics = absent;
    o.n_metrics = 1;
    ck_assert_int_eq(fk_check_run(&o, &r), FK_EINVAL);
    ck_assert_ptr_nonnull(strstr(fk_errmsg(), "the baseline has no column attn_kl"));
    o.metrics = bogus;
    ck_assert_int_eq(fk_check_run(&o, &r), FK_EINVAL);
    ck_assert_ptr_nonnull(strstr(fk_errmsg(), "'cpu_s' is not a gateable metric"));
    rm_dir();
}
END_TEST

START_TEST(export_skips_absent)
{
    /* A store with only a full cell and a lexico cell whose .h5 is missing: no figure can be
     * drawn but fig1c (per-layer inactive from summary.csv) and fig1d; every skipped figure
     * has a note, and Table 4 is written. */
    make_dir();
    char p[512];
    snprintf(p, sizeof p, "%s/cells", g_dir);
    ck_assert_int_eq(mkdir(p, 0755), 0);
    put("cells.csv", "cell_id,codec,dataset,status,n_b,s,n_traces,traces,dictionary,seed,"
                     "attn_stride,rel_err_mean,attn_kl,inactive_overlap,bytes_per_seq,"
                     "bytes_per_token,bytes_full_per_seq,tokens_per_seq,cost_mac_rel\n"
                     "f000000000000001,full,ds,ok,128,,1,t0.h5,,1,16,0,0,nan,100,10,100,10,nan\n"
                     "f000000000000002,lexico,ds,ok,128,8,1,t0.h5,d.h5,2,16,0.5,nan,0.2,50,5,"
                     "100,10,nan\n");
    put("summary.csv", "cell_id,codec,trace,layer,kind,rel_err_mean,attn_kl,"
                       "inactive_after_prefill,bytes,bytes_full\n"
                       "f000000000000001,full,t0.h5,0,K,0,0,nan,25,25\n"
                       "f000000000000001,full,t0.h5,0,V,0,0,nan,25,25\n"
                       "f000000000000002,lexico,t0.h5,0,K,0.4,nan,0.3,12,25\n"
                       "f000000000000002,lexico,t0.h5,0,V,0.6,nan,0.1,13,25\n");
    seal_cell(".", "f000000000000001"); /* the lexico cell's .h5 is empty: unreadable */
    seal_cell(".", "f000000000000002");
    fk_hdf5_quiet();    /* the missing .h5 is expected: no HDF5 error stack */
    struct fk_plot_set set;
    char out[512];
    snprintf(out, sizeof out, "%s/fig", g_dir);
    ck_assert_msg(fk_plotdata_export(g_dir, out, NULL, &set) == FK_OK, "%s", fk_errmsg());
    int drawn = 0;
    for (int i = 0; i < set.n_figs; i++) {
        const struct fk_plot_fig *f = &set.figs[i];
        if (!f->note[0]) {
            drawn++;
            ck_assert_msg(!strncmp(f->name, "fig1c", 5) || !strncmp(f->name, "fig1d", 5),
                          "%s drawn", f->name);
            ck_assert_ptr_nonnull(strstr(f->vars, "data='"));
        }
    }
    ck_assert_int_eq(drawn, 2);
    ck_assert_int_ge(set.n_figs, 8);
    ck_assert_str_ne(set.table_md, "");
    snprintf(p, sizeof p, "%s/fig/table4.md", g_dir);
    ck_assert_int_eq(access(p, F_OK), 0);
    /* fig1c data: layer 0, K mean 0.3, V mean 0.1 */
    snprintf(p, sizeof p, "%s/fig/data/fig1c_inactive.dat", g_dir);
    FILE *f = fopen(p, "r");
    ck_assert_ptr_nonnull(f);
    char line[512];
    double vals[7] = {0};
    while (fgets(line, sizeof line, f))
        if (line[0] != '#')
            ck_assert_int_eq(sscanf(line, "%lf %lf %lf %lf %lf %lf %lf", &vals[0], &vals[1],
                                    &vals[2], &vals[3], &vals[4], &vals[5], &vals[6]), 7);
    fclose(f);
    ck_assert(vals[0] == 0 && fabs(vals[1] - 0.3) < 1e-12 && fabs(vals[4] - 0.1) < 1e-12);
    fk_plotdata_free(&set);
    ck_assert_int_eq(fk_plot_codec_style("fadkv"), 6);
    ck_assert_int_eq(fk_plot_codec_style("other"), FK_PLOT_STYLES);
    ck_assert_int_eq(fk_plot_codec_style("external"), 12); /* every built-in codec its own */
    rm_dir();
}
END_TEST

/* ---- cross-family Pareto and equal-budget table -------------------------------------------- */

/* The cross-family fixture (head_dim 16: fp16 = 64 bytes per token per head, bits_per_elem
 * = bytes_tok_head / 4). Dataset ds has every metric; dataset noattn none of the attention
 * metrics, a lexico cell without byte accounting and a codec unknown to this build
 * ("mystery", whose options bits and block share the abbreviation b). */
static void xfam_fixture(void)
{
    put("cells.csv",
        "cell_id,codec,dataset,status,n_b,a_len,coef,s,bits,block,n_traces,traces,dictionary,"
        "seed,attn_stride,rel_err_mean,attn_cos,attn_kl,bytes_tok_head,bits_per_elem\n"
        /* id           codec      ds  n_b a_len coef s bits block ... err  cos  kl  bytes bpe */
        "a000000000000001,full,ds,ok,16,1,fp8,,,,1,t0.h5,,1,16,0,1,0,64,16\n"
        "a000000000000002,topk,ds,ok,16,1,fp8,2,,,1,t0.h5,,1,16,0.7,0.9,0.3,12,3\n"
        "a000000000000003,topk,ds,ok,16,1,fp8,3,,,1,t0.h5,,1,16,0.6,0.93,0.22,14,3.5\n"
        "a000000000000004,topk,ds,ok,16,1,fp8,4,,,1,t0.h5,,1,16,0.55,0.93,0.2,16,4\n"
        "a000000000000005,uniform,ds,ok,16,1,fp8,,2,,1,t0.h5,,1,16,0.4,0.95,0.1,8.8,2.2\n"
        "a000000000000006,uniform,ds,ok,16,1,fp8,,4,,1,t0.h5,,1,16,0.1,0.99,0.01,17.6,4.4\n"
        "a000000000000007,uniform,ds,ok,16,1,fp8,,8,,1,t0.h5,,1,16,0.01,0.999,0.001,33.6,8.4\n"
        "a000000000000008,lexico,ds,ok,16,1,fp8,2,,,1,t0.h5,,1,16,0.45,0.95,0.12,8.8,2.2\n"
        "a000000000000009,lexico,ds,ok,16,1,fp8,4,,,1,t0.h5,,1,16,0.3,0.97,0.05,12.4,3.1\n"
        "a00000000000000a,lexico,ds,ok,8,1,fp8,8,,,1,t0.h5,,1,16,0.2,0.985,0.02,20,5\n"
        "a00000000000000b,lexico-adp,ds,ok,16,1,fp16,6,,,1,t0.h5,,1,16,0.25,0.975,0.03,18,4.5\n"
        "a00000000000000c,gm,ds,ok,16,1,fp8,2,,,1,t0.h5,,1,16,0.35,0.96,0.08,10,2.5\n"
        "a00000000000000d,gm,ds,failed,16,1,fp8,4,,,1,t0.h5,,1,16,nan,nan,nan,nan,nan\n"
        "b000000000000001,full,noattn,ok,16,1,fp8,,,,1,t0.h5,,1,16,0,,,64,16\n"
        "b000000000000002,uniform,noattn,ok,16,1,fp8,,2,,1,t0.h5,,1,16,0.4,,,8.8,2.2\n"
        "b000000000000003,uniform,noattn,ok,16,1,fp8,,4,,1,t0.h5,,1,16,0.1,,,17.6,4.4\n"
        "b000000000000004,topk,noattn,ok,16,1,fp8,2,,,1,t0.h5,,1,16,0.7,,,12,3\n"
        "b000000000000005,lexico,noattn,ok,16,1,fp8,4,,,1,t0.h5,,1,16,0.3,,,,\n"
        "b000000000000006,mystery,noattn,ok,16,1,fp8,,2,16,1,t0.h5,,1,16,0.5,,,9.6,2.4\n"
        "b000000000000007,mystery,noattn,ok,16,1,fp8,,3,32,1,t0.h5,,1,16,0.35,,,13.6,3.4\n");
    put("summary.csv", "cell_id,codec,trace,layer,kind,rel_err_mean,attn_kl\n");
    seal_ok_rows(".");
}

/* The text of a file below g_dir (malloc'ed). */
static char *slurp_rel(const char *rel)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", g_dir, rel);
    char *t = fk_slurp(p, NULL);
    ck_assert_msg(t != NULL, "%s not written", p);
    return t;
}

/* The figure named name, or NULL. */
static const struct fk_plot_fig *find_fig(const struct fk_plot_set *set, const char *name)
{
    for (int i = 0; i < set->n_figs; i++)
        if (!strcmp(set->figs[i].name, name))
            return &set->figs[i];
    return NULL;
}

/* hay holds needle (the message shows the start of hay: Check limits its length) */
#define ASSERT_HAS(hay, needle)                                                              \
    ck_assert_msg(strstr(hay, needle), "missing <%s> in:\n%.1500s", needle, hay)

START_TEST(export_cross_family)
{
    make_dir();
    xfam_fixture();
    fk_hdf5_quiet();
    struct fk_plot_set set;
    char out[512];
    snprintf(out, sizeof out, "%s/fig", g_dir);
    /* the budgets given (plot --budgets 4,1,3,2: sorted) */
    struct fk_plot_opts po = {.budgets_from = "given by --budgets"};
    ck_assert_int_eq(fk_plot_budgets_parse("4,1,3,2", po.budgets, &po.n_budgets), FK_OK);
    ck_assert_int_eq(po.n_budgets, 4);
    ck_assert(po.budgets[0] == 1 && po.budgets[3] == 4);
    double bad[FK_PLOT_MAX_BUDGETS];
    int nbad;
    ck_assert_int_eq(fk_plot_budgets_parse("2,x", bad, &nbad), FK_EINVAL);
    ck_assert_int_eq(fk_plot_budgets_parse("2,2", bad, &nbad), FK_EINVAL);
    ck_assert_int_eq(fk_plot_budgets_parse("0", bad, &nbad), FK_EINVAL);
    ck_assert_int_eq(fk_plot_budgets_parse("1,2,3,4,5,6,7,8,9", bad, &nbad), FK_EINVAL);
    ck_assert_msg(fk_plotdata_export(g_dir, out, &po, &set) == FK_OK, "%s", fk_errmsg());

    /* every figure, drawn or skipped, is a row of the catalogue and has its caption */
    for (int i = 0; i < set.n_figs; i++)
        ck_assert_msg(strlen(set.figs[i].caption) > 20, "figure %s has no caption",
                      set.figs[i].name);
    /* dataset ds, cosine: every codec a block (registry order), colours by family */
    const struct fk_plot_fig *f = find_fig(&set, "pareto_head_cos.ds");
    ck_assert_ptr_nonnull(f);
    ck_assert_str_eq(f->note, "");
    ck_assert_str_eq(f->script, "pareto_head.gp");
    ASSERT_HAS(f->vars, "codecs='full lexico lexico-adp gm topk uniform'; ");
    ASSERT_HAS(f->vars, "cfamname='baseline dict dict dict baseline quant'; ");
    ASSERT_HAS(f->vars, "metric='cos'; logy=0; fp16=64; ");
    int col[6], mk[6];
    const char *cf = strstr(f->vars, "cfam='"), *cp = strstr(f->vars, "cpt='");
    ck_assert(cf && cp);
    ck_assert_int_eq(sscanf(cf, "cfam='%d %d %d %d %d %d'", &col[0], &col[1], &col[2], &col[3],
                            &col[4], &col[5]), 6);
    ck_assert_int_eq(sscanf(cp, "cpt='%d %d %d %d %d %d'", &mk[0], &mk[1], &mk[2], &mk[3],
                            &mk[4], &mk[5]), 6);
    ck_assert(col[0] == col[4] && col[1] == col[2] && col[2] == col[3]);  /* one per family */
    ck_assert(col[0] != col[1] && col[5] != col[0] && col[5] != col[1] && col[0] >= 1);
    ck_assert(mk[0] != mk[4] && mk[1] != mk[2] && mk[2] != mk[3] && mk[1] != mk[3]);
    char *d = slurp_rel("fig/data/pareto_head_cos.ds.dat");
    ASSERT_HAS(d, "# teacher-forced replay");
    ASSERT_HAS(d, "# fp16 level: 64 bytes");
    /* labels: swept options (topk s, uniform bits, lexico n_b and s), options off both the
     * codec's default and the dataset's common value (lexico-adp coef and s), none for a
     * codec at the common values (gm s = 2, full) */
    ASSERT_HAS(d, "# codec full (family baseline)\n 64 1 16 \"\" full a000000000000001\n");
    ASSERT_HAS(d, "# codec lexico (family dict)\n"
                  " 8.8 0.95 2.2 \"nb16 s2\" lexico a000000000000008\n"
                  " 12.4 0.97 3.1 \"nb16 s4\" lexico a000000000000009\n"
                  " 20 0.985 5 \"nb8 s8\" lexico a00000000000000a\n");
    ASSERT_HAS(d, " 18 0.975 4.5 \"c=fp16 s6\" lexico-adp a00000000000000b\n");
    ASSERT_HAS(d, " 10 0.96 2.5 \"\" gm a00000000000000c\n");
    ASSERT_HAS(d, " 12 0.9 3 \"s2\" topk a000000000000002\n");
    ASSERT_HAS(d, " 33.6 0.999 8.4 \"b8\" uniform a000000000000007\n");
    /* the frontier: bytes ascending, strictly better cosine; at 8.8 bytes uniform b2 and
     * lexico s2 tie (first in sweep order kept); topk is dominated everywhere */
    const char *fr = strstr(d, "# Pareto frontier");
    ck_assert_ptr_nonnull(fr);
    fr = strchr(fr, '\n') + 1;
    ck_assert_str_eq(fr, " 8.8 0.95 2.2 \"b2\" uniform a000000000000005\n"
                         " 10 0.96 2.5 \"\" gm a00000000000000c\n"
                         " 12.4 0.97 3.1 \"nb16 s4\" lexico a000000000000009\n"
                         " 17.6 0.99 4.4 \"b4\" uniform a000000000000006\n"
                         " 33.6 0.999 8.4 \"b8\" uniform a000000000000007\n"
                         " 64 1 16 \"\" full a000000000000001\n");
    free(d);
    /* KL on a log axis: full (KL 0) left out and said so; frontier of the lowest KL */
    f = find_fig(&set, "pareto_head_kl.ds");
    ck_assert(f && !f->note[0]);
    ASSERT_HAS(f->vars, "codecs='lexico lexico-adp gm topk uniform'; ");
    ASSERT_HAS(f->vars, "metric='kl'; logy=1; ");
    ASSERT_HAS(f->vars, "1 cell(s) with attn\\_kl = 0 not shown");
    d = slurp_rel("fig/data/pareto_head_kl.ds.dat");
    fr = strchr(strstr(d, "# Pareto frontier"), '\n') + 1;
    ck_assert_str_eq(fr, " 8.8 0.1 2.2 \"b2\" uniform a000000000000005\n"
                         " 10 0.08 2.5 \"\" gm a00000000000000c\n"
                         " 12.4 0.05 3.1 \"nb16 s4\" lexico a000000000000009\n"
                         " 17.6 0.01 4.4 \"b4\" uniform a000000000000006\n"
                         " 33.6 0.001 8.4 \"b8\" uniform a000000000000007\n");
    free(d);

    /* dataset noattn: no attention metrics, so the cosine and KL panels are skipped with
     * the reason; the error panel is drawn (lexico without bytes left out, full's 0 too) */
    f = find_fig(&set, "pareto_head_cos.noattn");
    ck_assert_ptr_nonnull(f);
    ck_assert_str_eq(f->note, "no cell with attn_cos in dataset noattn (attention off, or "
                              "traces without queries)");
    f = find_fig(&set, "pareto_head_kl.noattn");
    ck_assert(f && strstr(f->note, "no cell with attn_kl in dataset noattn"));
    f = find_fig(&set, "pareto_head_err.noattn");
    ck_assert(f && !f->note[0]);
    ASSERT_HAS(f->vars, "codecs='topk uniform mystery'; cfamname='baseline quant -'; ");
    cf = strstr(f->vars, "cfam='");
    ck_assert(cf && sscanf(cf, "cfam='%d %d %d'", &col[0], &col[1], &col[2]) == 3);
    ck_assert_int_eq(col[2], 0);    /* unknown to this build: grey */
    d = slurp_rel("fig/data/pareto_head_err.noattn.dat");
    ck_assert_ptr_null(strstr(d, " lexico "));
    fr = strchr(strstr(d, "# Pareto frontier"), '\n') + 1;
    ck_assert_str_eq(fr, " 8.8 0.4 2.2 \"b2\" uniform b000000000000002\n"
                         " 13.6 0.35 3.4 \"bits=3 block=32\" mystery b000000000000007\n"
                         " 17.6 0.1 4.4 \"b4\" uniform b000000000000003\n");
    free(d);

    /* the equal-budget table: bits_per_elem <= 1.1 x budget (2.2 and 4.4 are inside, 4.5
     * is not), highest attn_cos, ties to fewer bits (topk s3 over s4 at 4 bits) */
    ck_assert_str_ne(set.budget_md, "");
    ck_assert_str_eq(set.budget_note, "");
    char *t = slurp_rel("fig/table_budget.md");
    ASSERT_HAS(t, "### Dataset ds\n");
    ASSERT_HAS(t, "| 1 | uniform | quant | — | — | — | — | — | — | — |\n");
    ASSERT_HAS(t, "| 2 | full | baseline | — | — | — | — | — | — | — |\n");
    ASSERT_HAS(t, "| 2 | lexico | dict | nb16 s2 | 2.20 | 0.95000 | 0.12 | 0.4500 | attn_cos | "
                  "a000000000000008 |\n");
    ASSERT_HAS(t, "| 2 | gm | dict | — | — | — | — | — | — | — |\n");
    ASSERT_HAS(t, "| 2 | uniform | quant | b2 | 2.20 | 0.95000 | 0.1 | 0.4000 | attn_cos | "
                  "a000000000000005 |\n");
    ASSERT_HAS(t, "| 3 | lexico | dict | nb16 s4 | 3.10 | 0.97000 | 0.05 | 0.3000 | attn_cos | "
                  "a000000000000009 |\n");
    ASSERT_HAS(t, "| 3 | gm | dict | (one setting) | 2.50 | 0.96000 | 0.08 | 0.3500 | attn_cos | "
                  "a00000000000000c |\n");
    ASSERT_HAS(t, "| 3 | topk | baseline | s2 | 3.00 | 0.90000 | 0.3 | 0.7000 | attn_cos | "
                  "a000000000000002 |\n");
    ASSERT_HAS(t, "| 4 | topk | baseline | s3 | 3.50 | 0.93000 | 0.22 | 0.6000 | attn_cos | "
                  "a000000000000003 |\n");
    ASSERT_HAS(t, "| 4 | uniform | quant | b4 | 4.40 | 0.99000 | 0.01 | 0.1000 | attn_cos | "
                  "a000000000000006 |\n");
    ASSERT_HAS(t, "| 4 | lexico-adp | dict | — | — | — | — | — | — | — |\n");
    /* without attention: ranked by the lowest rel_err_mean, and said so */
    const char *na = strstr(t, "### Dataset noattn\n");
    ck_assert_ptr_nonnull(na);
    ck_assert_ptr_null(strstr(na, "attn_cos |"));
    ASSERT_HAS(na, "| 2 | uniform | quant | b2 | 2.20 | — | — | 0.4000 | rel_err_mean | "
                   "b000000000000002 |\n");
    ASSERT_HAS(na, "| 2 | mystery | - | — | — | — | — | — | — | — |\n");
    ASSERT_HAS(na, "| 3 | mystery | - | bits=2 block=16 | 2.40 | — | — | 0.5000 | rel_err_mean | "
                   "b000000000000006 |\n");
    ASSERT_HAS(na, "| 4 | mystery | - | bits=3 block=32 | 3.40 | — | — | 0.3500 | rel_err_mean | "
                   "b000000000000007 |\n");
    ASSERT_HAS(na, "| 4 | lexico | dict | — | — | — | — | — | — | — |\n");
    free(t);
    t = slurp_rel("fig/table_budget.tex");
    ASSERT_HAS(t, "\\multicolumn{9}{l}{Dataset ds} \\\\\n");
    ASSERT_HAS(t, "4 & topk & baseline & s3 & $3.50$ & $0.93000$ & $0.22$ & $0.6000$ & "
                  "attn\\_cos \\\\\n");
    ASSERT_HAS(t, "4 & lexico-adp & dict & --- & --- & --- & --- & --- & --- \\\\\n");
    ASSERT_HAS(t, "3 & mystery & - & bits=2 block=16 & $2.40$ & --- & --- & $0.5000$ & "
                  "rel\\_err\\_mean \\\\\n");
    free(t);
    fk_plotdata_free(&set);
    /* no budgets given: from the cells, every codec's smallest bits/elem rounded up to a
     * tenth, at most 5 spread over them; the largest (full's 16) fills every codec's row */
    ck_assert_msg(fk_plotdata_export(g_dir, out, NULL, &set) == FK_OK, "%s", fk_errmsg());
    t = slurp_rel("fig/table_budget.md");
    ASSERT_HAS(t, "Budgets, bits per element: 2.2, 2.5, 3, 4.5, 16 (from the cells");
    ASSERT_HAS(t, "<= 1.10 x the budget");
    ASSERT_HAS(t, "| 16 | full | baseline | (one setting) | 16.00 |");
    ASSERT_HAS(t, "| 2.2 | uniform | quant | b2 | 2.20 |");
    free(t);
    fk_plotdata_free(&set);
    rm_dir();
}
END_TEST

START_TEST(export_cross_family_old_results)
{
    /* results written before the per-head byte columns: the three panels are skipped with
     * the reason and the equal-budget table is not written, with a note */
    make_dir();
    put("cells.csv", "cell_id,codec,dataset,status,n_b,s,n_traces,traces,dictionary,seed,"
                     "attn_stride,rel_err_mean,attn_cos,attn_kl,bytes_per_token\n"
                     "f000000000000001,full,ds,ok,16,,1,t0.h5,,1,16,0,1,0,10\n"
                     "f000000000000002,topk,ds,ok,16,2,1,t0.h5,,1,16,0.5,0.9,0.2,5\n");
    put("summary.csv", "cell_id,codec,trace,layer,kind,rel_err_mean,attn_kl\n");
    seal_ok_rows(".");
    fk_hdf5_quiet();
    struct fk_plot_set set;
    char out[512];
    snprintf(out, sizeof out, "%s/fig", g_dir);
    ck_assert_msg(fk_plotdata_export(g_dir, out, NULL, &set) == FK_OK, "%s", fk_errmsg());
    static const char *const names[] = {"pareto_head_cos", "pareto_head_kl", "pareto_head_err"};
    for (int i = 0; i < 3; i++) {
        const struct fk_plot_fig *f = find_fig(&set, names[i]);
        ck_assert_msg(f != NULL, "%s", names[i]);
        ASSERT_HAS(f->note, "cells.csv has no bytes_tok_head column");
    }
    ck_assert_str_eq(set.budget_md, "");
    ASSERT_HAS(set.budget_note, "no cell has bits_per_elem");
    char p[512];
    snprintf(p, sizeof p, "%s/fig/table_budget.md", g_dir);
    ck_assert_int_ne(access(p, F_OK), 0);
    ck_assert_str_ne(set.table_md, "");    /* Table 4 as before */
    fk_plotdata_free(&set);
    rm_dir();
}
END_TEST


/* The metric table's rules, and a cell value aggregated by the table (FK_AGG_STREAMS) against
 * the mean written out here over a hand-made cell of 2 traces x 3 layers. */
START_TEST(metric_table)
{
    int n = fk_metric_count(), per_group[16] = {0};
    ck_assert_int_ge(n, 80);
    for (int i = 0; i < n; i++) {
        const struct fk_metric *m = &fk_metrics[i];
        ck_assert_msg(strspn(m->name, "abcdefghijklmnopqrstuvwxyz0123456789_") ==
                          strlen(m->name), "metric %s: not [a-z0-9_]", m->name);
        ck_assert_msg(fk_metric_find(m->name) == m, "metric %s is listed twice", m->name);
        int g = 0;
        while (fk_metric_groups[g] && strcmp(fk_metric_groups[g], m->group))
            g++;
        ck_assert_msg(fk_metric_groups[g] != NULL, "metric %s: group '%s' is not one of "
                      "fk_metric_groups", m->name, m->group);
        per_group[g]++;
        ck_assert_msg(m->def && strlen(m->def) > 10, "metric %s has no definition", m->name);
        ck_assert_msg(m->better >= -1 && m->better <= 1, "metric %s: better", m->name);
        if (m->flags & FK_MF_GATE) /* gated: a row to gate, and bands that let noise pass */
            ck_assert_msg(m->row && m->band_agg.rtol + m->band_agg.atol > 0 &&
                              m->band_row.rtol + m->band_row.atol > 0 &&
                              !(m->flags & FK_MF_TIMING),
                          "gated metric %s lacks a row getter or bands, or is a time", m->name);
        if (m->agg == FK_AGG_STREAMS || m->agg == FK_AGG_NONE)
            ck_assert_msg(m->row != NULL, "metric %s: no row to aggregate or write", m->name);
        if (m->agg == FK_AGG_LOOP)
            ck_assert_msg(m->cell < FK_LOOP_NHEAD, "metric %s: loop index %zu", m->name, m->cell);
        if (m->agg == FK_AGG_TABLE || (m->flags & FK_MF_META_ONLY))
            ck_assert_msg(m->row == NULL, "metric %s: a table or .meta value with a row",
                          m->name);
    }
    for (int g = 0; fk_metric_groups[g]; g++)
        ck_assert_msg(per_group[g] > 0, "group %s has no metric", fk_metric_groups[g]);
    ck_assert_ptr_null(fk_metric_find("no_such_metric"));

    enum { T = 2, L = 3 };
    struct fk_stream_result st[2 * T * L];
    struct fk_attn_acc at[T * L];
    memset(st, 0, sizeof st);
    memset(at, 0, sizeof at);
    struct fk_cell_result r = {.n_traces = T, .n_layers = L, .streams = st, .attn = at};
    double want = 0;
    int k = 0;
    for (int i = 0; i < 2 * T * L; i++) {
        st[i].n_tokens = 8;
        st[i].n_heads = 2;
        st[i].bytes_full = 64;
        st[i].gini = i == 4 ? NAN : 0.1 + 0.03 * i; /* NaN is left out of the mean */
        if (i != 4) {
            want += st[i].gini;
            k++;
        }
    }
    want /= k;
    const struct fk_codec_ops *ops = fk_codec_find("gm");
    ck_assert_ptr_nonnull(ops);
    void *opts = calloc(1, ops->opts_size);
    ck_assert_ptr_nonnull(opts);
    fk_opts_defaults(ops, opts);
    double *v = malloc(sizeof(double) * (size_t)n);
    ck_assert_ptr_nonnull(v);
    ck_assert_int_eq(fk_metrics_cell(&r, NULL, ops, opts, v), FK_OK);
    int gi = (int)(fk_metric_find("gini") - fk_metrics);
    ck_assert_double_eq_tol(v[gi], want, 1e-15);
    int li = (int)(fk_metric_find("e2e_kl") - fk_metrics); /* no closed loop: empty */
    ck_assert(isnan(v[li]));
    int si = (int)(fk_metric_find("saturated") - fk_metrics); /* fp8 by default: defined */
    ck_assert(!isnan(v[si]));
    free(v);
    free(opts);
}
END_TEST

static Suite *plot_suite(void)
{
    Suite *s = suite_create("plot_check");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, csv_quoting);
    tcase_add_test(tc, metric_table);
    tcase_add_test(tc, boot_exact_small);
    tcase_add_test(tc, boot_normal_theory);
    tcase_add_test(tc, check_gate);
    tcase_add_test(tc, check_metrics_worse_only);
    tcase_add_test(tc, json_round_trip);
    tcase_add_test(tc, provenance_round_trip);
    tcase_add_test(tc, export_skips_absent);
    tcase_add_test(tc, export_cross_family);
    tcase_add_test(tc, export_cross_family_old_results);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return fk_suite_run(plot_suite());
}
