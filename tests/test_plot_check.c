/* SPDX-License-Identifier: MIT
 * Figure export, regression gate and CSV reader (harness/fk_plotdata.c, fk_cli_check.c):
 * the CSV reader on quoting corner cases; the bootstrap interval against the exact bootstrap
 * distribution of a 3-point sample and against the normal-theory interval of a 40-point
 * sample; `check` on a hand-made results store (identical data passes, a drift beyond rtol
 * fails, within rtol passes, missing / extra rows are reported, cell ids do not matter, NaN
 * handling, --update); the exporter skips figures with a note when the store lacks their data.
 * The end-to-end merge / shard test is tests/test_sweep_tools.sh.
 */
#include "common/fk_err.h"
#include "report/fk_plotdata.h"
#include "formats/fk_trace.h"

#include <check.h>
#include <gsl/gsl_randist.h>
#include <gsl/gsl_rng.h>
#include <gsl/gsl_statistics_double.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int fk_cli_check(int argc, char **argv);

static char g_dir[256];

static void make_dir(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/fk-test-plot-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(g_dir));
}

static void put(const char *name, const char *text)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    FILE *f = fopen(p, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

static void rm_dir(void)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    ck_assert_int_eq(system(cmd), 0);
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

/* Runs check with stdout captured into out (cap bytes); returns its exit status. */
static int run_check(const char *extra1, const char *extra2, char *out, size_t cap)
{
    char base[512], res[512], cap_path[512];
    snprintf(base, sizeof base, "%s/baseline.csv", g_dir);
    snprintf(res, sizeof res, "%s/res", g_dir);
    snprintf(cap_path, sizeof cap_path, "%s/stdout.txt", g_dir);
    char *argv[10] = {"check", "--baseline", base, "--results", res};
    int argc = 5;
    if (extra1)
        argv[argc++] = (char *)extra1;
    if (extra2)
        argv[argc++] = (char *)extra2;
    fflush(stdout);
    int saved = dup(1);
    FILE *f = fopen(cap_path, "w");
    ck_assert_ptr_nonnull(f);
    dup2(fileno(f), 1);
    int rc = fk_cli_check(argc, argv);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    fclose(f);
    f = fopen(cap_path, "r");
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = 0;
    fclose(f);
    return rc;
}

START_TEST(check_gate)
{
    make_dir();
    char p[512], out[16384];
    snprintf(p, sizeof p, "%s/res", g_dir);
    ck_assert_int_eq(mkdir(p, 0755), 0);
    put("res/cells.csv", cells_csv);
    summary(0.1, "aaaaaaaaaaaaaaa1", 0, 0);
    /* --update writes the baseline (16 rows, the failed cell has none) */
    ck_assert_int_eq(run_check("--update", NULL, out, sizeof out), 0);
    ck_assert_ptr_nonnull(strstr(out, "wrote 16 row(s)"));
    snprintf(p, sizeof p, "%s/baseline.csv", g_dir);
    struct fk_csv b;
    ck_assert_int_eq(fk_csv_load(p, &b), FK_OK);
    ck_assert_int_eq(b.n_rows, 16);
    int opt = fk_csv_col(&b, "options");
    int has_default = 0, has_s4 = 0;
    for (int i = 0; i < b.n_rows; i++) {
        has_default |= !strcmp(b.rows[i][opt], "default");
        has_s4 |= !strcmp(b.rows[i][opt], "s=4");
    }
    ck_assert(has_default && has_s4);    /* lexico at defaults; gm: only s differs (n=256) */
    fk_csv_free(&b);
    /* identical: pass */
    ck_assert_int_eq(run_check(NULL, NULL, out, sizeof out), 0);
    ck_assert_ptr_nonnull(strstr(out, "PASS: 16 row(s) compared"));
    /* within rtol: pass; beyond: fail, naming the metric and the row */
    summary(0.1 * (1 + 5e-5), "aaaaaaaaaaaaaaa1", 0, 0);
    ck_assert_int_eq(run_check(NULL, NULL, out, sizeof out), 0);
    summary(0.1 * (1 + 5e-3), "aaaaaaaaaaaaaaa1", 0, 0);
    ck_assert_int_eq(run_check(NULL, NULL, out, sizeof out), 1);
    ck_assert_ptr_nonnull(strstr(out, "REGRESSION"));
    ck_assert_ptr_nonnull(strstr(out, "rel_err_mean"));
    ck_assert_ptr_nonnull(strstr(out, "lexico,ds,default,0,t0.h5,0,K"));
    ck_assert_int_eq(run_check("--rtol", "1e-2", out, sizeof out), 0);
    ck_assert_int_eq(run_check("--atol", "1e-3", out, sizeof out), 0);
    /* another cell id (new harness version), same configuration: still matched */
    put("res/cells.csv", "cell_id,codec,dataset,status,n_b,s,n,n_traces,traces,dictionary,"
                         "seed,attn_stride,rel_err_mean\n"
                         "bbbbbbbbbbbbbbb1,lexico,ds,ok,128,8,,2,t0.h5;t1.h5,d.h5,9,16,0.5\n"
                         "aaaaaaaaaaaaaaa2,gm,ds,ok,128,4,256,2,t0.h5;t1.h5,d.h5,2,16,0.6\n");
    summary(0.1, "bbbbbbbbbbbbbbb1", 0, 0);
    ck_assert_int_eq(run_check(NULL, NULL, out, sizeof out), 0);
    /* a missing row fails, an extra row is reported and passes */
    summary(0.1, "bbbbbbbbbbbbbbb1", 1, 0);
    ck_assert_int_eq(run_check(NULL, NULL, out, sizeof out), 1);
    ck_assert_ptr_nonnull(strstr(out, "MISSING"));
    ck_assert_ptr_nonnull(strstr(out, "gm,ds,s=4,0,t1.h5,1,V"));
    summary(0.1, "bbbbbbbbbbbbbbb1", 0, 1);
    ck_assert_int_eq(run_check(NULL, NULL, out, sizeof out), 0);
    ck_assert_ptr_nonnull(strstr(out, "EXTRA"));
    ck_assert_ptr_nonnull(strstr(out, "1 extra"));
    /* NaN in the results where the baseline has a number: a drift */
    put("res/cells.csv", cells_csv);
    summary(NAN, "aaaaaaaaaaaaaaa1", 0, 0);
    ck_assert_int_eq(run_check(NULL, NULL, out, sizeof out), 1);
    /* bad usage */
    char *bad[] = {"check", "--results", "x"};
    ck_assert_int_eq(fk_cli_check(3, bad), 2);
    rm_dir();
}
END_TEST

/* ---- export ---------------------------------------------------------------------------------- */

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
    fk_hdf5_quiet();    /* the missing .h5 is expected: no HDF5 error stack */
    struct fk_plot_set set;
    char out[512];
    snprintf(out, sizeof out, "%s/fig", g_dir);
    ck_assert_msg(fk_plotdata_export(g_dir, out, &set) == FK_OK, "%s", fk_errmsg());
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
    ck_assert_int_eq(fk_plot_codec_style("other"), 7);
    rm_dir();
}
END_TEST

static Suite *plot_suite(void)
{
    Suite *s = suite_create("plot_check");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, csv_quoting);
    tcase_add_test(tc, boot_exact_small);
    tcase_add_test(tc, boot_normal_theory);
    tcase_add_test(tc, check_gate);
    tcase_add_test(tc, export_skips_absent);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(plot_suite());
    srunner_run_all(sr, CK_NORMAL);
    int nf = srunner_ntests_failed(sr);
    srunner_free(sr);
    return nf ? EXIT_FAILURE : EXIT_SUCCESS;
}
