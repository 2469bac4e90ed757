/* SPDX-License-Identifier: MIT
 * General figures and honest intervals (report/fk_plotgen.c, report/fk_plotdata.c) on a
 * hand-made results store whose per-sequence values the test knows: a point of `plot --x
 * OPTION --y METRIC` is the mean over sequences of the per-sequence mean over layers and
 * K/V, averaged over repeats first (the oracle recomputes it from the generating numbers,
 * not from the files); an interval only with FK_CI_MIN_SEQ sequences, else the sequences
 * themselves in the .seq.dat file; a heatmap refuses an option with one value and squares
 * holding several settings, and its squares equal the oracle; unknown options and metrics
 * are refused naming the valid ones; Table 4 prints ± only for cells with enough sequences
 * and averages the repeats of a setting.
 */
#include "fk_check_main.h"
#include "fk_test_store.h"
#include "common/fk_err.h"
#include "common/fk_sha256.h"
#include "common/fk_str.h"
#include "report/fk_plotdata.h"
#include "report/fk_plotgen.h"
#include "formats/fk_trace.h"    /* fk_hdf5_quiet */

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_dir[256];

static void put(const char *name, const char *text)
{
    fk_test_put(g_dir, name, text);
}

/* Seals a cell as a finished one with its .summary.csv rows (fk_test_seal). */
static void seal(const char *id, const char *rows)
{
    char name[128];
    snprintf(name, sizeof name, "cells/%s.summary.csv", id);
    put(name, rows);
    fk_test_seal(g_dir, ".", id);
}

static void make_dir(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/fk-test-plotgen-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(g_dir));
    char p[512];
    snprintf(p, sizeof p, "%s/cells", g_dir);
    ck_assert_int_eq(mkdir(p, 0755), 0);
    snprintf(p, sizeof p, "%s/out", g_dir);
    ck_assert_int_eq(mkdir(p, 0755), 0);
}

static void rm_dir(void)
{
    fk_test_rm(g_dir);
}

/* ---- the fixture --------------------------------------------------------------------------- */

/* Cells of dataset ds: codec, s, n, repeat, sequences. */
static const struct {
    const char *id, *codec, *s, *n;
    int repeat, n_seq;
} cells[] = {
    {"c000000000000001", "gm", "2", "32", 0, 6},
    {"c000000000000002", "gm", "2", "32", 1, 6},   /* a repeat of the cell above */
    {"c000000000000003", "gm", "4", "32", 0, 6},
    {"c000000000000004", "gm", "8", "32", 0, 2},   /* too few sequences for an interval */
    {"c000000000000005", "gm", "4", "64", 0, 6},
    {"c000000000000006", "pl", "2", "32", 0, 6},
    {"c000000000000007", "pl", "4", "32", 0, 6},
    {"c000000000000008", "full", "", "", 0, 6},    /* no s: left out of --x s */
};
#define N_CELLS ((int)(sizeof cells / sizeof cells[0]))

/* The rel_err_mean of cell c, trace t, layer l, kind k (an irregular but known number). */
static double val(int c, int t, int l, int k)
{
    return 0.1 * (c + 1) + 0.013 * t * t + 0.004 * l + 0.002 * k + 0.001 * sin(7.0 * c + t);
}

/* Oracle: the mean over layers (2) and K/V of one sequence. */
static double seq_val(int c, int t)
{
    double s = 0;
    for (int l = 0; l < 2; l++)
        for (int k = 0; k < 2; k++)
            s += val(c, t, l, k);
    return s / 4;
}

/* The store of cells[] (with only_pl: only the pl cells). */
static void fixture_of(int only_pl)
{
    struct fk_sb csv = {0}, sum = {0};
    fk_sb_printf(&csv, "cell_id,codec,dataset,status,s,n,n_traces,traces,dictionary,seed,"
                       "attn_stride,repeat,rel_err_mean,bytes_per_token\n");
    fk_sb_printf(&sum, "cell_id,codec,trace,layer,kind,rel_err_mean\n");
    for (int c = 0; c < N_CELLS; c++) {
        if (only_pl && strcmp(cells[c].codec, "pl"))
            continue;
        double cell_mean = 0;
        for (int t = 0; t < cells[c].n_seq; t++)
            cell_mean += seq_val(c, t) / cells[c].n_seq;
        fk_sb_printf(&csv, "%s,%s,ds,ok,%s,%s,%d,t.h5,d.h5,1,16,%d,%.17g,%d\n", cells[c].id,
                     cells[c].codec, cells[c].s, cells[c].n, cells[c].n_seq, cells[c].repeat,
                     cell_mean, 100 + c);
        struct fk_sb rows = {0};
        for (int t = 0; t < cells[c].n_seq; t++)
            for (int l = 0; l < 2; l++)
                for (int k = 0; k < 2; k++)
                    fk_sb_printf(&rows, "%s,%s,t%d.h5,%d,%s,%.17g\n", cells[c].id,
                                 cells[c].codec, t, l, k ? "V" : "K", val(c, t, l, k));
        fk_sb_printf(&sum, "%s", rows.s);
        seal(cells[c].id, rows.s);
        fk_sb_free(&rows);
    }
    put("cells.csv", csv.s);
    put("summary.csv", sum.s);
    fk_sb_free(&csv);
    fk_sb_free(&sum);
}

static void fixture(void)
{
    fixture_of(0);
}

/* Oracle of a point: the cells [c0, c1, ...] (-1 ended) are the repeats of one setting;
 * per sequence their mean, then the mean over sequences. */
static double point_oracle(const int *cs)
{
    double m = 0;
    int n = cells[cs[0]].n_seq;
    for (int t = 0; t < n; t++) {
        double r = 0;
        int k = 0;
        for (; cs[k] >= 0; k++)
            r += seq_val(cs[k], t);
        m += r / k / n;
    }
    return m;
}

/* ---- reading the data files ------------------------------------------------------------------- */

struct row {
    char line[128];              /* the block's title ("# line N: TITLE") */
    double x, mean, lo, hi;
    int n_seq;
};

static int read_rows(const char *path, struct row *rows, int cap)
{
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "%s not written", path);
    char buf[1024], title[128] = "";
    int n = 0;
    while (fgets(buf, sizeof buf, f)) {
        int li;
        if (sscanf(buf, "# line %d: %127[^\n]", &li, title) == 2)
            continue;
        if (buf[0] != '"')
            continue;
        char xs[64], lo[32], hi[32];
        struct row *r = &rows[n];
        ck_assert_int_lt(n, cap);
        ck_assert_int_eq(sscanf(buf, "\"%63[^\"]\" %lf %lf %31s %31s %d", xs, &r->x, &r->mean,
                                lo, hi, &r->n_seq), 6);
        r->lo = strtod(lo, NULL);    /* "NaN" reads as NaN */
        r->hi = strtod(hi, NULL);
        snprintf(r->line, sizeof r->line, "%s", title);
        n++;
    }
    fclose(f);
    return n;
}

static const struct row *find_row(const struct row *rows, int n, const char *line, double x)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(rows[i].line, line) && rows[i].x == x)
            return &rows[i];
    return NULL;
}

static int run(struct fk_plot_general *g, struct fk_plot_gen_out *o)
{
    char stem[512];
    snprintf(stem, sizeof stem, "%s/out/fig", g_dir);
    return fk_plot_general(g_dir, stem, g, o);
}

/* ---- tests ------------------------------------------------------------------------------------- */

START_TEST(line_plot_means)
{
    make_dir();
    fixture();
    struct fk_plot_general g = {.x = "s", .y = "rel_err_mean"};
    static struct fk_plot_gen_out o;
    ck_assert_msg(run(&g, &o) == FK_OK, "%s", fk_errmsg());
    ck_assert_str_eq(o.script, "general.gp");
    ck_assert_ptr_nonnull(strstr(o.vars, "nl=3;"));     /* gm n=32, gm n=64, pl n=32 */
    ck_assert_ptr_nonnull(strstr(o.vars, "T[1]='gm n=32';"));
    ck_assert_ptr_nonnull(strstr(o.vars, "; 1 without s"));
    char p[600];
    snprintf(p, sizeof p, "%s/out/fig.dat", g_dir);
    struct row rows[32];
    int n = read_rows(p, rows, 32);
    ck_assert_int_eq(n, 6);
    static const struct {
        const char *line;
        double x;
        int cells[3];
    } want[] = {
        {"gm n=32", 2, {0, 1, -1}}, {"gm n=32", 4, {2, -1}}, {"gm n=32", 8, {3, -1}},
        {"gm n=64", 4, {4, -1}},    {"pl n=32", 2, {5, -1}}, {"pl n=32", 4, {6, -1}},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const struct row *r = find_row(rows, n, want[i].line, want[i].x);
        ck_assert_msg(r != NULL, "no point %s at s = %g", want[i].line, want[i].x);
        double m = point_oracle(want[i].cells);
        ck_assert_msg(fabs(r->mean - m) < 1e-9, "%s s=%g: mean %.12g, oracle %.12g",
                      want[i].line, want[i].x, r->mean, m);
        int ns = cells[want[i].cells[0]].n_seq;
        ck_assert_int_eq(r->n_seq, ns);
        if (ns >= FK_CI_MIN_SEQ)
            ck_assert_msg(r->lo < m && m < r->hi, "%s s=%g: interval [%g, %g] around %g",
                          want[i].line, want[i].x, r->lo, r->hi, m);
        else
            ck_assert_msg(isnan(r->lo) && isnan(r->hi), "%s s=%g: an interval over %d "
                          "sequences", want[i].line, want[i].x, ns);
    }
    /* the repeat pair is averaged per sequence, not pooled: its point differs from either
     * cell alone */
    const struct row *rp = find_row(rows, n, "gm n=32", 2);
    ck_assert(fabs(rp->mean - point_oracle((int[]){0, -1})) > 1e-3);
    /* the 2-sequence point's sequences are drawn themselves: exactly its 2 values */
    snprintf(p, sizeof p, "%s/out/fig.seq.dat", g_dir);
    FILE *f = fopen(p, "r");
    ck_assert_ptr_nonnull(f);
    char buf[256];
    int ns = 0;
    while (fgets(buf, sizeof buf, f)) {
        double x, v;
        int style, line;
        if (buf[0] == '#' || sscanf(buf, "%lf %lf %d %d", &x, &v, &style, &line) != 4)
            continue;
        ck_assert(x == 8 && line == 1);
        ck_assert_msg(fabs(v - seq_val(3, ns)) < 1e-9, "sequence %d: %g", ns, v);
        ns++;
    }
    fclose(f);
    ck_assert_int_eq(ns, 2);
    ck_assert_ptr_nonnull(strstr(o.vars, "nseq=2;"));
    ck_assert_ptr_nonnull(strstr(o.vars, "nci=5;"));
    /* --by n within gm: lines n=32 and n=64 (numbers ascending) */
    g = (struct fk_plot_general){.x = "s", .y = "rel_err_mean", .by = "n", .codec = "gm"};
    ck_assert_msg(run(&g, &o) == FK_OK, "%s", fk_errmsg());
    ck_assert_ptr_nonnull(strstr(o.vars, "nl=2;"));
    ck_assert_ptr_nonnull(strstr(o.vars, "T[1]='n=32'; S[1]=1; T[2]='n=64';"));
    /* a cells.csv metric: one value per cell, no interval */
    g = (struct fk_plot_general){.x = "s", .y = "bytes_per_token", .codec = "pl"};
    ck_assert_msg(run(&g, &o) == FK_OK, "%s", fk_errmsg());
    snprintf(p, sizeof p, "%s/out/fig.dat", g_dir);
    n = read_rows(p, rows, 32);
    ck_assert_int_eq(n, 2);
    ck_assert(rows[0].mean == 105 && rows[1].mean == 106 && isnan(rows[0].lo));
    rm_dir();
}
END_TEST

/* --x METRIC: a scatter of one point per setting (repeats together), the Pareto frontier by
 * the metrics' directions, labels with the options that vary within a codec, and axis
 * titles with units from the metric table. */
START_TEST(scatter_metric_metric)
{
    make_dir();
    fixture();
    struct fk_plot_general g = {.x = "bytes_per_token", .y = "rel_err_mean"};
    struct fk_plot_gen_out o;
    ck_assert_msg(run(&g, &o) == FK_OK, "%s", fk_errmsg());
    ck_assert_str_eq(o.script, "scatter_general.gp");
    ck_assert_ptr_nonnull(strstr(o.vars, "xtitle='bytes_per_token [bytes], lower is better'"));
    ck_assert_ptr_nonnull(strstr(o.vars, "ytitle='rel_err_mean, lower is better'"));
    char path[600];
    snprintf(path, sizeof path, "%s/out/fig.dat", g_dir);
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    char buf[512];
    int pts = 0, front = 0, in_front = 0;
    double fx = NAN, fy = NAN, gm_s2 = NAN;
    while (fgets(buf, sizeof buf, f)) {
        if (strstr(buf, "# Pareto frontier"))
            in_front = 1;
        double x, y;
        char label[128] = "";
        if (buf[0] != ' ' || sscanf(buf, " %lf %lf \"%127[^\"]", &x, &y, label) < 2)
            continue;
        if (in_front) {
            front++;
            fx = x, fy = y;
        } else {
            pts++;
            if (!strcmp(label, "s=2 n=32"))
                gm_s2 = y;
        }
    }
    fclose(f);
    /* 8 cells, 7 settings (cells 1 and 2 are repeats); bytes_per_token 100 + c */
    ck_assert_int_eq(pts, 7);
    const int rep[] = {0, 1, -1};
    ck_assert_double_eq_tol(gm_s2, point_oracle(rep), 1e-9);
    /* the error grows with the bytes in this fixture: the cheapest setting alone is on
     * the frontier */
    ck_assert_int_eq(front, 1);
    ck_assert_double_eq_tol(fx, 100.5, 1e-9);
    ck_assert_double_eq_tol(fy, point_oracle(rep), 1e-9);
    /* a metric neither file has is refused naming the metrics */
    struct fk_plot_general bad = {.x = "bytes_per_token", .y = "no_such_metric"};
    ck_assert_int_eq(run(&bad, &o), FK_EINVAL);
    ck_assert_ptr_nonnull(strstr(fk_errmsg(), "no such metric"));
    rm_dir();
}
END_TEST

START_TEST(refusals)
{
    make_dir();
    fixture();
    static struct fk_plot_gen_out o;
    struct fk_plot_general g = {.x = "bogus", .y = "rel_err_mean"};
    ck_assert_int_eq(run(&g, &o), FK_EINVAL);
    ck_assert_ptr_nonnull(strstr(fk_errmsg(), "--x bogus"));
    ck_assert_ptr_nonnull(strstr(fk_errmsg(), "options: codec, dataset, s, n"));
    g = (struct fk_plot_general){.x = "s", .y = "nope"};
    ck_assert_int_eq(run(&g, &o), FK_EINVAL);
    ck_assert_ptr_nonnull(strstr(fk_errmsg(), "--y nope"));
    ck_assert_ptr_nonnull(strstr(fk_errmsg(), "rel_err_mean"));
    ck_assert_ptr_nonnull(strstr(fk_errmsg(), "bytes_per_token"));
    /* x with one value among the selection */
    g = (struct fk_plot_general){.x = "n", .y = "rel_err_mean", .codec = "pl"};
    ck_assert_int_eq(run(&g, &o), FK_EINVAL);
    ck_assert_ptr_nonnull(strstr(fk_errmsg(), "--x n: one value"));
    ck_assert_ptr_nonnull(strstr(fk_errmsg(), "s (2 4)"));
    /* a heatmap over one varying option is refused, naming it */
    g = (struct fk_plot_general){.heat_x = "s", .heat_y = "n", .y = "rel_err_mean",
                                 .codec = "pl"};
    ck_assert_int_eq(run(&g, &o), FK_EINVAL);
    ck_assert_msg(strstr(fk_errmsg(), "n has one value (32)") != NULL, "%s", fk_errmsg());
    ck_assert_ptr_nonnull(strstr(fk_errmsg(), "needs two options that vary"));
    /* squares holding several settings (two codecs) */
    g = (struct fk_plot_general){.heat_x = "s", .heat_y = "n", .y = "rel_err_mean"};
    ck_assert_int_eq(run(&g, &o), FK_EINVAL);
    ck_assert_msg(strstr(fk_errmsg(), "also vary codec (gm pl)") != NULL, "%s", fk_errmsg());
    /* --where narrows to nothing */
    const char *w[] = {"s=16"};
    g = (struct fk_plot_general){.x = "s", .y = "rel_err_mean", .where = w, .n_where = 1};
    ck_assert_int_eq(run(&g, &o), FK_EINVAL);
    ck_assert_ptr_nonnull(strstr(fk_errmsg(), "no finished cell with s=16"));
    rm_dir();
}
END_TEST

START_TEST(heatmap_squares)
{
    make_dir();
    fixture();
    static struct fk_plot_gen_out o;
    struct fk_plot_general g = {.heat_x = "s", .heat_y = "n", .y = "rel_err_mean",
                                .codec = "gm"};
    ck_assert_msg(run(&g, &o) == FK_OK, "%s", fk_errmsg());
    ck_assert_str_eq(o.script, "heatmap_general.gp");
    ck_assert_ptr_nonnull(strstr(o.vars, "nx=3; ny=2;"));
    char p[600], buf[512];
    snprintf(p, sizeof p, "%s/out/fig.dat", g_dir);
    FILE *f = fopen(p, "r");
    ck_assert_ptr_nonnull(f);
    int n = 0, filled = 0;
    while (fgets(buf, sizeof buf, f)) {
        int xi, yi;
        char z[32];
        if (buf[0] == '#' || sscanf(buf, "%d %d %31s", &xi, &yi, z) != 3)
            continue;
        n++;
        double v = strtod(z, NULL), want = NAN;
        /* x: s = 2, 4, 8; y: n = 32, 64 */
        if (yi == 0 && xi == 0)
            want = point_oracle((int[]){0, 1, -1});
        else if (yi == 0 && xi == 1)
            want = point_oracle((int[]){2, -1});
        else if (yi == 0 && xi == 2)
            want = point_oracle((int[]){3, -1});
        else if (yi == 1 && xi == 1)
            want = point_oracle((int[]){4, -1});
        if (isnan(want)) {
            ck_assert_msg(isnan(v), "square %d,%d: %g for no cell", xi, yi, v);
        } else {
            ck_assert_msg(fabs(v - want) < 1e-9, "square %d,%d: %.12g, oracle %.12g", xi, yi,
                          v, want);
            filled++;
        }
    }
    fclose(f);
    ck_assert_int_eq(n, 6);
    ck_assert_int_eq(filled, 4);
    rm_dir();
}
END_TEST

/* Table 4: ± only for a cell with FK_CI_MIN_SEQ sequences; repeats averaged; Fig. 1c's data
 * has no interval over 2 sequences and lists them. */
START_TEST(table4_intervals)
{
    make_dir();
    put("cells.csv", "cell_id,codec,dataset,status,n_b,s,n_traces,traces,dictionary,seed,"
                     "attn_stride,repeat,rel_err_mean\n"
                     "d000000000000001,lexico,six,ok,16,8,6,t.h5,,1,16,0,0.3\n"
                     "d000000000000002,lexico,six,ok,16,8,6,t.h5,,1,16,1,0.5\n"
                     "d000000000000003,lexico,two,ok,16,8,2,t.h5,,1,16,0,0.25\n");
    struct fk_sb sum = {0};
    fk_sb_printf(&sum, "cell_id,codec,trace,layer,kind,rel_err_mean,inactive_after_prefill\n");
    static const char *const ids[] = {"d000000000000001", "d000000000000002",
                                      "d000000000000003"};
    for (int c = 0; c < 3; c++) {
        struct fk_sb rows = {0};
        for (int t = 0; t < (c < 2 ? 6 : 2); t++)
            for (int k = 0; k < 2; k++)
                fk_sb_printf(&rows, "%s,lexico,t%d.h5,0,%s,%.17g,%.17g\n", ids[c], t,
                             k ? "V" : "K", val(c, t, 0, k), 0.1 + 0.05 * t + 0.01 * k);
        fk_sb_printf(&sum, "%s", rows.s);
        seal(ids[c], rows.s);
        fk_sb_free(&rows);
    }
    put("summary.csv", sum.s);
    fk_sb_free(&sum);
    fk_hdf5_quiet();    /* the empty .h5 files are expected */
    struct fk_plot_set set;
    char out[512];
    snprintf(out, sizeof out, "%s/fig", g_dir);
    ck_assert_msg(fk_plotdata_export(g_dir, out, NULL, &set) == FK_OK, "%s", fk_errmsg());
    char p[600];
    snprintf(p, sizeof p, "%s/fig/table4.md", g_dir);
    char *t = fk_slurp(p, NULL);
    ck_assert_ptr_nonnull(t);
    const char *six = strstr(t, "| six |"), *two = strstr(t, "| two |");
    ck_assert(six && two);
    const char *six_end = strchr(six, '\n'), *two_end = strchr(two, '\n');
    const char *pm = strstr(six, "±");
    ck_assert_msg(pm && pm < six_end, "no ± in the 6-sequence row:\n%s", t);
    pm = strstr(two, "±");
    ck_assert_msg(!pm || pm > two_end, "± in the 2-sequence row:\n%s", t);
    /* the repeats of the six cell: cells.csv's 0.3 and 0.5 averaged */
    ck_assert_msg(strstr(six, "| 0.4000 ±") != NULL, "repeats not averaged:\n%s", t);
    ck_assert_ptr_null(strstr(t, "d000000000000002"));    /* one row per setting */
    free(t);
    /* Fig. 1c of dataset two: NaN interval, then the 2 sequences of K and of V */
    snprintf(p, sizeof p, "%s/fig/data/fig1c_inactive.two.dat", g_dir);
    FILE *f = fopen(p, "r");
    ck_assert_ptr_nonnull(f);
    char buf[512];
    int rows = 0;
    while (fgets(buf, sizeof buf, f)) {
        if (buf[0] == '#')
            continue;
        double v[11];
        char lo[16], hi[16];
        ck_assert_int_eq(sscanf(buf, "%lf %lf %15s %15s %lf %lf %lf %lf %lf %lf %lf", &v[0],
                                &v[1], lo, hi, &v[4], &v[5], &v[6], &v[7], &v[8], &v[9],
                                &v[10]), 11);
        ck_assert_str_eq(lo, "NaN");
        ck_assert_str_eq(hi, "NaN");
        ck_assert(fabs(v[7] - 0.1) < 1e-12 && fabs(v[8] - 0.15) < 1e-12);   /* K seqs */
        ck_assert(fabs(v[9] - 0.11) < 1e-12 && fabs(v[10] - 0.16) < 1e-12); /* V seqs */
        rows++;
    }
    fclose(f);
    ck_assert_int_eq(rows, 1);
    const struct fk_plot_fig *fig = NULL;
    for (int i = 0; i < set.n_figs; i++)
        if (!strcmp(set.figs[i].name, "fig1c_inactive.two"))
            fig = &set.figs[i];
    ck_assert_ptr_nonnull(fig);
    ck_assert_ptr_nonnull(strstr(fig->vars, "nseq=2;"));
    fk_plotdata_free(&set);
    rm_dir();
}
END_TEST

/* Fig. 3d over an s x n grid of one dataset (N does not vary): the heatmap is over s and n,
 * not a one-column N x s figure; with only s varying it is skipped naming s. */
START_TEST(fig3d_two_options)
{
    make_dir();
    fixture();
    fk_hdf5_quiet();    /* d.h5 and the cells' .h5 files are absent or empty */
    struct fk_plot_set set;
    char out[512];
    snprintf(out, sizeof out, "%s/fig", g_dir);
    ck_assert_msg(fk_plotdata_export(g_dir, out, NULL, &set) == FK_OK, "%s", fk_errmsg());
    const struct fk_plot_fig *f = NULL;
    for (int i = 0; i < set.n_figs; i++)
        if (!strcmp(set.figs[i].name, "fig3d_N_s.gm"))
            f = &set.figs[i];
    ck_assert_ptr_nonnull(f);
    ck_assert_str_eq(f->note, "");
    ck_assert_msg(strstr(f->vars, "nx=3; ny=2;") != NULL, "%s", f->vars);
    ck_assert_ptr_nonnull(strstr(f->vars, "xtitle='s';"));
    ck_assert_ptr_nonnull(strstr(f->vars, "ytitle='n';"));
    fk_plotdata_free(&set);
    rm_dir();
    make_dir();
    fixture_of(1);
    ck_assert_msg(fk_plotdata_export(g_dir, out, NULL, &set) == FK_OK, "%s", fk_errmsg());
    f = NULL;
    for (int i = 0; i < set.n_figs; i++)
        if (!strncmp(set.figs[i].name, "fig3d", 5))
            f = &set.figs[i];
    ck_assert_ptr_nonnull(f);
    ck_assert_msg(strstr(f->note, "only s varies among the pl cells") != NULL, "%s", f->note);
    fk_plotdata_free(&set);
    rm_dir();
}
END_TEST

/* Fig. 3c in the loop: on a model dataset (cells with loop_attn_kl) `plot` writes
 * fig3c_tau_delta_e2e beside fig3c_tau_delta, whose squares (x: tau_c ascending, y:
 * delta_k/delta_v ascending) carry each cell's attn_kl, e2e_kl and loop_attn_kl, NaN for the
 * missing square; a replay-only dataset gets no such figure. */
static double e2e_val(int ti, int di, int k)
{
    return 0.01 * (ti + 1) + 0.1 * (di + 1) + 1.0 * k + 0.0007 * ti * di;
}

START_TEST(fig3c_e2e_squares)
{
    make_dir();
    static const char *tau[3] = {"4", "0", "1"};   /* out of order: the axis sorts them */
    static const int tau_rank[3] = {2, 0, 1};
    static const char *dk[2] = {"0.5", "0.3"}, *dv[2] = {"0.7", "0.42"};
    static const int d_rank[2] = {1, 0};
    struct fk_sb csv = {0}, sum = {0};
    fk_sb_printf(&csv, "cell_id,codec,dataset,status,tau_c,delta_k,delta_v,n_traces,traces,"
                       "dictionary,seed,attn_stride,repeat,rel_err_mean,attn_kl,e2e_kl,"
                       "loop_attn_kl,bytes_per_token\n");
    fk_sb_printf(&sum, "cell_id,codec,trace,layer,kind,rel_err_mean\n");
    int id = 0;
    for (int m = 0; m < 2; m++)              /* m = 0: model dataset "m"; 1: replay "r" */
        for (int ti = 0; ti < 3; ti++)
            for (int di = 0; di < 2; di++) {
                if (m == 0 && ti == 0 && di == 0)
                    continue;                /* the missing square (tau_c 4, 0.5/0.7) */
                char cid[20], rows[200];
                snprintf(cid, sizeof cid, "e%015d", ++id);
                if (m == 0)
                    fk_sb_printf(&csv, "%s,fadkv,m,ok,%s,%s,%s,1,t.h5,d.h5,1,1,0,0.5,%.17g,"
                                 "%.17g,%.17g,100\n", cid, tau[ti], dk[di], dv[di],
                                 e2e_val(ti, di, 0), e2e_val(ti, di, 1), e2e_val(ti, di, 2));
                else
                    fk_sb_printf(&csv, "%s,fadkv,r,ok,%s,%s,%s,1,t.h5,d.h5,1,1,0,0.5,%.17g,,,"
                                 "100\n", cid, tau[ti], dk[di], dv[di], e2e_val(ti, di, 0));
                snprintf(rows, sizeof rows, "%s,fadkv,t.h5,0,K,0.5\n%s,fadkv,t.h5,0,V,0.5\n",
                         cid, cid);
                fk_sb_printf(&sum, "%s", rows);
                seal(cid, rows);
            }
    put("cells.csv", csv.s);
    put("summary.csv", sum.s);
    fk_sb_free(&csv);
    fk_sb_free(&sum);
    fk_hdf5_quiet();
    struct fk_plot_set set;
    char out[512];
    snprintf(out, sizeof out, "%s/fig", g_dir);
    ck_assert_msg(fk_plotdata_export(g_dir, out, NULL, &set) == FK_OK, "%s", fk_errmsg());
    const struct fk_plot_fig *f = NULL;
    int plain = 0;
    for (int i = 0; i < set.n_figs; i++) {
        ck_assert_str_ne(set.figs[i].name, "fig3c_tau_delta_e2e.r");
        if (!strcmp(set.figs[i].name, "fig3c_tau_delta_e2e.m"))
            f = &set.figs[i];
        plain += !strcmp(set.figs[i].name, "fig3c_tau_delta.m") && !set.figs[i].note[0];
    }
    ck_assert_int_eq(plain, 1);
    ck_assert_ptr_nonnull(f);
    ck_assert_str_eq(f->note, "");
    ck_assert_str_eq(f->script, "fig3c_tau_delta_e2e.gp");
    ck_assert_msg(strstr(f->vars, "nx=3; ny=2;") != NULL, "%s", f->vars);
    char p[600], buf[512];
    snprintf(p, sizeof p, "%s/fig/data/fig3c_tau_delta_e2e.m.dat", g_dir);
    FILE *df = fopen(p, "r");
    ck_assert_msg(df != NULL, "%s not written", p);
    int n = 0, filled = 0;
    while (fgets(buf, sizeof buf, df)) {
        int xi, yi;
        char z[3][32], xl[32], yl[32], cell[32];
        if (buf[0] == '#' || sscanf(buf, "%d %d %31s %31s %31s \"%31[^\"]\" \"%31[^\"]\" "
                                    "%*s %*s %*s %31s", &xi, &yi, z[0], z[1], z[2], xl, yl,
                                    cell) != 8)
            continue;
        n++;
        int ti = 0, di = 0;
        while (tau_rank[ti] != xi)
            ti++;
        while (d_rank[di] != yi)
            di++;
        ck_assert_str_eq(xl, tau[ti]);
        char want_y[32];
        snprintf(want_y, sizeof want_y, "%s/%s", dk[di], dv[di]);
        ck_assert_str_eq(yl, want_y);
        for (int k = 0; k < 3; k++) {
            double v = strtod(z[k], NULL);
            if (ti == 0 && di == 0) {
                ck_assert_msg(isnan(v), "missing square %d,%d: %g", xi, yi, v);
                ck_assert_str_eq(cell, "-");
            } else {
                ck_assert_msg(fabs(v - e2e_val(ti, di, k)) < 1e-8, "square %d,%d column %d: "
                              "%.12g, cell %.12g", xi, yi, k, v, e2e_val(ti, di, k));
            }
        }
        filled += !(ti == 0 && di == 0);
    }
    fclose(df);
    ck_assert_int_eq(n, 6);
    ck_assert_int_eq(filled, 5);
    fk_plotdata_free(&set);
    rm_dir();
}
END_TEST

static Suite *plotgen_suite(void)
{
    Suite *s = suite_create("plot_general");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, line_plot_means);
    tcase_add_test(tc, refusals);
    tcase_add_test(tc, scatter_metric_metric);
    tcase_add_test(tc, heatmap_squares);
    tcase_add_test(tc, table4_intervals);
    tcase_add_test(tc, fig3d_two_options);
    tcase_add_test(tc, fig3c_e2e_squares);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return fk_suite_run(plotgen_suite());
}
