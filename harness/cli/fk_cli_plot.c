/* SPDX-License-Identifier: MIT
 * `fadkv-bench plot RESULTS_DIR [--out DIR] [--format png|pdf|svg]...`: exports the figure
 * data files, Table 4 and the equal-budget table from a results directory (fk_plotdata.c),
 * then runs gnuplot on the scripts in plots/ (plots/README.md lists the figures).
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli/fk_cli.h"
#include "report/fk_report.h"
#include "common/fk_clock.h"
#include "common/fk_err.h"
#include "core/fk_codec.h"
#include "core/fk_registry.h"
#include "report/fk_plotdata.h"
#include "report/fk_plotgen.h"
#include "store/fk_results.h"


static void plot_usage(FILE *f)
{
    fprintf(f, "usage: fadkv-bench plot RESULTS_DIR [--out DIR] [--format png|pdf|svg]...\n"
               "                         [--cost-baseline CODEC] [--budgets B,B,...]\n"
               "  Writes DIR/data/*.dat (figure data), DIR/table4.md and DIR/table4.tex,\n"
               "  DIR/table_budget.md and DIR/table_budget.tex (best setting of each codec\n"
               "  within each memory budget), and draws every figure with gnuplot\n"
               "  (scripts in plots/, found via FK_SRCDIR, next to the executable or in the\n"
               "  current directory).\n"
               "  --out DIR      output directory (default RESULTS_DIR/figures)\n"
               "  --format F     png, pdf or svg; repeatable (default: png and pdf)\n"
               "  --cost-baseline CODEC  codec Table 4's costs are relative to (default: the\n"
               "                 one cells.csv was computed with; with no baseline cell, the\n"
               "                 exact-OMP codec with a growing dictionary)\n"
               "  --budgets B,... the equal-budget table's budgets in bits per element (default:\n"
               "                 the sweep's [sweep] budgets, else from each dataset's cells:\n"
               "                 every codec's smallest bits_per_elem, rounded up)\n"
               "\n"
               "       fadkv-bench plot RESULTS_DIR --x OPTION --y METRIC [--by OPTION]\n"
               "       fadkv-bench plot RESULTS_DIR --heatmap X,Y --z METRIC\n"
               "                 [--dataset D] [--codec C] [--where OPTION=VALUE]...\n"
               "                 [--out FILE] [--format png|pdf|svg]...\n"
               "       fadkv-bench plot RESULTS_DIR --x METRIC --y METRIC [--by OPTION] [...]\n"
               "  One general figure: METRIC (a column of summary.csv, per sequence, or of\n"
               "  cells.csv, per cell) against a swept OPTION, one line per value of --by\n"
               "  (an option, codec or dataset; default codec; other options that vary make\n"
               "  lines of their own), or a heatmap of METRIC over two swept options (one\n"
               "  setting per square: narrow with --codec, --dataset, --where). A point is\n"
               "  the mean over sequences (and repeats), with a 95%% bootstrap interval over\n"
               "  sequences when it has >= %d of them, else the sequences drawn as points.\n"
               "  With --x naming a metric (bits_per_elem, say): a scatter of one point per\n"
               "  setting, a colour per --by value (codec), labels, and the Pareto frontier\n"
               "  by the metrics' better directions (`fadkv-bench metrics`).\n"
               "  --out FILE     figure file (default RESULTS_DIR/figures/plot_METRIC_OPTION\n"
               "                 or heatmap_METRIC_X_Y); its extension, if png, pdf or svg,\n"
               "                 is the format; the data file is FILE's stem + .dat\n",
            FK_CI_MIN_SEQ);
}

static int is_file(const char *p)
{
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* Finds plots/common.gp: $FK_SRCDIR/plots, then up from the executable, then ./plots. */
static int find_plots(char *out, size_t cap)
{
    char p[PATH_MAX + 64];
    const char *src = getenv("FK_SRCDIR");
    if (src && *src) {
        snprintf(p, sizeof p, "%s/plots/common.gp", src);
        if (is_file(p)) {
            snprintf(out, cap, "%s/plots", src);
            return 0;
        }
    }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *s = strrchr(exe, '/');
        if (s)
            *s = 0;
        static const char *const up[] = {"", "/..", "/../..", NULL};
        for (int i = 0; up[i]; i++) {
            snprintf(p, sizeof p, "%s%s/plots/common.gp", exe, up[i]);
            if (is_file(p)) {
                snprintf(out, cap, "%s%s/plots", exe, up[i]);
                return 0;
            }
        }
    }
    if (is_file("plots/common.gp")) {
        snprintf(out, cap, "plots");
        return 0;
    }
    return -1;
}

static int gnuplot_on_path(void)
{
    const char *path = getenv("PATH");
    if (!path)
        return 0;
    char *dup = strdup(path);
    int found = 0;
    for (char *d = dup ? strtok(dup, ":") : NULL; d && !found; d = strtok(NULL, ":")) {
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/gnuplot", *d ? d : ".");
        found = access(p, X_OK) == 0;
    }
    free(dup);
    return found;
}

/* Appends name='value' (quotes doubled) to buf. */
static void add_var(char *buf, size_t cap, const char *name, const char *value)
{
    size_t n = strlen(buf);
    n += (size_t)snprintf(buf + n, cap - n, "%s='", name);
    for (const char *p = value; *p && n + 4 < cap; p++) {
        if (*p == '\'')
            buf[n++] = '\'';
        buf[n++] = *p;
    }
    snprintf(buf + n, cap - n, "'; ");
}

/* Runs gnuplot -e VARS SCRIPT with its messages (warnings such as "Skipping data file with
 * no valid points") kept in msg (cap bytes) instead of the terminal; returns its exit status
 * (or -1). */
static int run_gnuplot(const char *vars, const char *script, char *msg, size_t cap)
{
    int p[2];
    msg[0] = 0;
    fflush(stdout);
    fflush(stderr);
    if (pipe(p) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0) {
        close(p[0]);
        close(p[1]);
        return -1;
    }
    if (pid == 0) {
        dup2(p[1], STDERR_FILENO);
        dup2(p[1], STDOUT_FILENO);
        close(p[0]);
        close(p[1]);
        char *args[] = {"gnuplot", "-e", (char *)vars, (char *)script, NULL};
        execvp("gnuplot", args);
        _exit(127);
    }
    close(p[1]);
    size_t n = 0;
    char chunk[512];
    for (;;) { /* read to the end: gnuplot must never block on a full pipe */
        ssize_t k = read(p[0], chunk, sizeof chunk);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        size_t take = (size_t)k < cap - 1 - n ? (size_t)k : cap - 1 - n;
        memcpy(msg + n, chunk, take);
        n += take;
    }
    msg[n] = 0;
    close(p[0]);
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Draws path (format fmt) with gnuplot into a temporary file, checks that it is whole
 * (fk_plot_file_whole: gnuplot exits 0 on a full disk with the file cut short), then
 * renames it into place; a figure that fails leaves nothing behind. 0 written, 1 failed. */
static int draw_atomic(const char *vars0, const char *plots, const char *script,
                       const char *fmt, const char *path)
{
    char vars[20000], tmp[PATH_MAX + 64], sc[PATH_MAX + 80], msg[4096], why[256];
    snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
    snprintf(sc, sizeof sc, "%s/%s", plots, script);
    snprintf(vars, sizeof vars, "%s", vars0);
    add_var(vars, sizeof vars, "plotdir", plots);
    add_var(vars, sizeof vars, "fmt", fmt);
    add_var(vars, sizeof vars, "out", tmp);
    int rc = run_gnuplot(vars, sc, msg, sizeof msg);
    if (rc != 0) {
        unlink(tmp);
        fprintf(stderr, "fadkv-bench plot: gnuplot failed (status %d) on %s for %s%s%s", rc, sc,
                path, msg[0] ? ":\n" : "\n", msg);
        return 1;
    }
    if (!fk_plot_file_whole(tmp, fmt, why, sizeof why)) {
        unlink(tmp);
        fprintf(stderr, "fadkv-bench plot: %s: the figure gnuplot wrote is %s; nothing "
                        "written%s%s", path, why, msg[0] ? " (gnuplot said:\n" : "\n", msg);
        if (msg[0])
            fprintf(stderr, ")\n");
        return 1;
    }
    if (rename(tmp, path) != 0) {
        fprintf(stderr, "fadkv-bench plot: %s: cannot rename from %s (%s)\n", path, tmp,
                strerror(errno));
        unlink(tmp);
        return 1;
    }
    printf("  wrote %s\n", path);
    return 0;
}

/* The cost baseline of results without a baseline cell: the one their sweep recorded in
 * provenance.json ([sweep] cost_baseline), else the default of the codec list. Copied into
 * buf. */
static const char *default_baseline(const char *dir, char *buf, size_t cap)
{
    struct fk_provenance p;
    snprintf(buf, cap, "%s", fk_default_cost_baseline);
    if (dir && fk_store_has_provenance(dir) && fk_store_provenance_read(dir, &p) == FK_OK) {
        if (p.cost_baseline)
            snprintf(buf, cap, "%s", p.cost_baseline);
        fk_store_provenance_free(&p);
    }
    return buf;
}

/* The budgets the sweep recorded in provenance.json ([sweep] budgets), or NULL. */
static const char *sweep_budgets_of(const char *dir, char *buf, size_t cap)
{
    struct fk_provenance p;
    const char *r = NULL;
    if (fk_store_has_provenance(dir) && fk_store_provenance_read(dir, &p) == FK_OK) {
        if (p.budgets && *p.budgets) {
            snprintf(buf, cap, "%s", p.budgets);
            r = buf;
        }
        fk_store_provenance_free(&p);
    }
    return r;
}

/* What draw_figures did. */
struct drawn {
    int drawn, skipped, failed;
};

/* Draws every figure of set without a note, once per format, into out (a skipped figure
 * is listed with its reason; without gnuplot nothing is drawn); counts exactly the files
 * written. */
static void draw_figures(const struct fk_plot_set *set, const char *plots, const char *out,
                         const char *const *fmts, int n_fmt, int have_gp, struct drawn *d)
{
    for (int i = 0; i < set->n_figs; i++) {
        const struct fk_plot_fig *f = &set->figs[i];
        if (f->note[0]) {
            printf("  skip %-28s %s\n", f->name, f->note);
            d->skipped++;
            continue;
        }
        if (!have_gp)
            continue;
        for (int k = 0; k < n_fmt; k++) {
            char path[PATH_MAX + 200];
            snprintf(path, sizeof path, "%s/%s.%s", out, f->name, fmts[k]);
            if (draw_atomic(f->vars, plots, f->script, fmts[k], path))
                d->failed++;
            else
                d->drawn++;
        }
    }
}

/* The general figure of `plot --x/--heatmap`: data files, then one figure per format. */
static int plot_general(const char *res, const struct fk_plot_general *g, const char *out,
                        const char *const *fmts, int n_fmt)
{
    char plots[PATH_MAX];
    if (find_plots(plots, sizeof plots) < 0) {
        fprintf(stderr, "fadkv-bench plot: cannot find the gnuplot scripts (plots/common.gp): "
                        "set FK_SRCDIR to the source tree\n");
        return 1;
    }
    char stem[PATH_MAX];
    const char *ext = NULL;
    if (out) {
        snprintf(stem, sizeof stem, "%s", out);
        char *dot = strrchr(stem, '.'), *sl = strrchr(stem, '/');
        if (dot && (!sl || dot > sl) &&
            (!strcmp(dot, ".png") || !strcmp(dot, ".pdf") || !strcmp(dot, ".svg"))) {
            ext = out + (dot - stem) + 1;
            *dot = 0;
        }
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%s", stem);
        char *s = strrchr(dir, '/');
        if (s && s != dir) {
            *s = 0;
            if (fk_store_mkdir_p(dir) < 0) {
                fprintf(stderr, "fadkv-bench plot: --out %s: %s\n", out, fk_errmsg());
                return 1;
            }
        }
    } else {
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%s/figures", res);
        if (fk_store_mkdir_p(dir) < 0) {
            fprintf(stderr, "fadkv-bench plot: %s\n", fk_errmsg());
            return 1;
        }
        if (g->heat_x)
            snprintf(stem, sizeof stem, "%s/heatmap_%s_%s_%s", dir, g->y ? g->y : "", g->heat_x,
                     g->heat_y);
        else
            snprintf(stem, sizeof stem, "%s/plot_%s_%s%s%s", dir, g->y ? g->y : "", g->x,
                     g->by ? "_by_" : "", g->by ? g->by : "");
    }
    if (ext) {
        fmts = &ext;
        n_fmt = 1;
    }
    static struct fk_plot_titles titles;
    struct fk_plot_general gg = *g;
    char common[PATH_MAX + 16];
    snprintf(common, sizeof common, "%s/common.gp", plots);
    gg.titles = fk_plot_titles_load(common, &titles) == FK_OK ? &titles : NULL;
    static struct fk_plot_gen_out o;
    if (fk_plot_general(res, stem, &gg, &o) < 0) {
        fprintf(stderr, "fadkv-bench plot: %s\n", fk_errmsg());
        return 2;
    }
    printf("%s: %s; data in %s.dat\n", res, o.what, stem);
    if (!gnuplot_on_path()) {
        fprintf(stderr, "fadkv-bench plot: gnuplot not found on PATH (apt-get install "
                        "gnuplot-nox); the data file is written, no figure drawn\n");
        return 1;
    }
    int failed = 0;
    for (int k = 0; k < n_fmt; k++) {
        char path[PATH_MAX + 8];
        snprintf(path, sizeof path, "%s.%s", stem, fmts[k]);
        failed |= draw_atomic(o.vars, plots, o.script, fmts[k], path);
    }
    return failed;
}

/* What plot's arguments name besides the figure options (struct fk_plot_general). */
struct plot_args {
    const char *res, *out, *baseline, *budgets;
    const char *fmts[8];
    int n_fmt;
    char hx[128], hy[128];       /* --heatmap X,Y: g->heat_x, heat_y point here */
};

/* Reads plot's arguments into pa and g (where: g's filters); -1 to go on, else the exit code. */
static int parse_plot_args(int argc, char **argv, struct plot_args *pa,
                           struct fk_plot_general *g, const char **where)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            plot_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--x") && i + 1 < argc) {
            g->x = argv[++i];
        } else if ((!strcmp(a, "--y") || !strcmp(a, "--z")) && i + 1 < argc) {
            g->y = argv[++i];
        } else if (!strcmp(a, "--by") && i + 1 < argc) {
            g->by = argv[++i];
        } else if (!strcmp(a, "--dataset") && i + 1 < argc) {
            g->dataset = argv[++i];
        } else if (!strcmp(a, "--codec") && i + 1 < argc) {
            g->codec = argv[++i];
        } else if (!strcmp(a, "--where") && i + 1 < argc) {
            if (g->n_where == 64) {
                fprintf(stderr, "fadkv-bench plot: --where: at most 64 filters\n");
                return 2;
            }
            where[g->n_where++] = argv[++i];
        } else if (!strcmp(a, "--heatmap") && i + 1 < argc) {
            const char *v = argv[++i], *c = strchr(v, ',');
            if (!c || c == v || !c[1] || strchr(c + 1, ',') ||
                (size_t)(c - v) >= sizeof pa->hx || strlen(c + 1) >= sizeof pa->hy) {
                fprintf(stderr, "fadkv-bench plot: --heatmap %s: expected two options X,Y "
                                "(e.g. --heatmap s,n)\n", v);
                return 2;
            }
            snprintf(pa->hx, sizeof pa->hx, "%.*s", (int)(c - v), v);
            snprintf(pa->hy, sizeof pa->hy, "%s", c + 1);
            g->heat_x = pa->hx;
            g->heat_y = pa->hy;
        } else if (!strcmp(a, "--cost-baseline") && i + 1 < argc) {
            pa->baseline = argv[++i];
        } else if (!strcmp(a, "--budgets") && i + 1 < argc) {
            pa->budgets = argv[++i];
        } else if (!strcmp(a, "--out") && i + 1 < argc) {
            pa->out = argv[++i];
        } else if (!strcmp(a, "--format") && i + 1 < argc) {
            const char *f = argv[++i];
            if (strcmp(f, "png") && strcmp(f, "pdf") && strcmp(f, "svg")) {
                fprintf(stderr, "fadkv-bench plot: --format %s: expected png, pdf or svg\n", f);
                return 2;
            }
            if (pa->n_fmt < 8)
                pa->fmts[pa->n_fmt++] = f;
        } else if (a[0] == '-' || pa->res) {
            fprintf(stderr, "fadkv-bench plot: unexpected argument '%s'\n", a);
            plot_usage(stderr);
            return 2;
        } else {
            pa->res = a;
        }
    }
    return -1;
}

/* The figures, tables and report of a whole results directory (plot without --x/--heatmap). */
static int plot_all(const char *res, const char *out, const char *baseline,
                    const char *budgets, const char *const *fmts, int n_fmt)
{
    char dbase[128];
    char outbuf[PATH_MAX];
    if (!out) {
        snprintf(outbuf, sizeof outbuf, "%s/figures", res);
        out = outbuf;
    }
    char plots[PATH_MAX];
    if (find_plots(plots, sizeof plots) < 0) {
        fprintf(stderr, "fadkv-bench plot: cannot find the gnuplot scripts (plots/common.gp): "
                        "set FK_SRCDIR to the source tree\n");
        return 1;
    }
    fk_cli_warn_damaged("plot", res);
    double t0 = fk_wall_s();
    static struct fk_plot_titles titles;
    struct fk_plot_opts po = {.titles = &titles, .cost_baseline = baseline,
                              .default_cost_baseline = default_baseline(res, dbase, sizeof dbase)};
    char sweep_budgets[256];
    const char *bl = budgets ? budgets : sweep_budgets_of(res, sweep_budgets, sizeof sweep_budgets);
    po.budgets_from = budgets ? "given by --budgets" : "the sweep's [sweep] budgets";
    if (bl && fk_plot_budgets_parse(bl, po.budgets, &po.n_budgets) < 0) {
        fprintf(stderr, "fadkv-bench plot: %s%s\n", budgets ? "--budgets: " : "provenance.json: ",
                fk_errmsg());
        return 2;
    }
    char common[PATH_MAX + 16];
    snprintf(common, sizeof common, "%s/common.gp", plots);
    if (fk_plot_titles_load(common, &titles) < 0) {
        fprintf(stderr, "fadkv-bench plot: %s (codecs are shown by name)\n", fk_errmsg());
        po.titles = NULL;
    }
    struct fk_plot_set set;
    if (fk_plotdata_export(res, out, &po, &set) < 0) {
        fprintf(stderr, "fadkv-bench plot: %s\n", fk_errmsg());
        return 1;
    }
    printf("%s: %d finished cell(s), %d dataset(s); data files in %s/data\n", res, set.n_cells,
           set.n_datasets, out);
    if (set.table_md[0])
        printf("Table 4: %s, %s\n", set.table_md, set.table_tex);
    if (set.budget_md[0])
        printf("Equal-budget table: %s, %s\n", set.budget_md, set.budget_tex);
    else if (set.budget_note[0])
        printf("  skip %-28s %s\n", "table_budget", set.budget_note);
    int have_gp = gnuplot_on_path();
    if (!have_gp)
        fprintf(stderr, "fadkv-bench plot: gnuplot not found on PATH (apt-get install "
                        "gnuplot-nox); the data files and tables are written, no figures "
                        "drawn\n");
    struct drawn d = {0};
    draw_figures(&set, plots, out, fmts, n_fmt, have_gp, &d);
    int drawn = d.drawn, skipped = d.skipped, failed = d.failed;
    int n_report = 0;
    if (fk_report_write(res, out, &set, &n_report) < 0) {
        fprintf(stderr, "fadkv-bench plot: report: %s\n", fk_errmsg());
        failed++;
    } else {
        printf("  wrote %s/report.html (one self-contained page: %d figure(s), the tables, "
               "the cells, the provenance)\n", out, n_report);
    }
    printf("%d figure file(s) written, %d figure(s) skipped, %d failed, %.1f s\n", drawn,
           skipped, failed, fk_wall_s() - t0);
    fk_plotdata_free(&set);
    return failed || !have_gp ? 1 : 0;
}

int fk_cli_plot(int argc, char **argv)
{
    static const char *where[64];
    struct fk_plot_general g = {.where = where};
    struct plot_args pa = {.res = NULL};
    int rc = parse_plot_args(argc, argv, &pa, &g, where);
    if (rc >= 0)
        return rc;
    const char *res = pa.res, *out = pa.out, *baseline = pa.baseline;
    const char **fmts = pa.fmts;
    int n_fmt = pa.n_fmt;
    if (!res) {
        plot_usage(stderr);
        return 2;
    }
    if (!n_fmt) {
        fmts[n_fmt++] = "png";
        fmts[n_fmt++] = "pdf";
    }
    if (g.x && g.heat_x) {
        fprintf(stderr, "fadkv-bench plot: --x and --heatmap: one figure at a time\n");
        return 2;
    }
    if (g.x || g.heat_x)
        return plot_general(res, &g, out, fmts, n_fmt);
    if (pa.budgets && (g.x || g.heat_x)) {
        fprintf(stderr, "fadkv-bench plot: --budgets is for the tables of a whole results "
                        "directory (without --x or --heatmap)\n");
        return 2;
    }
    if (g.y || g.by || g.dataset || g.codec || g.n_where) {
        fprintf(stderr, "fadkv-bench plot: --y, --z, --by, --dataset, --codec and --where "
                        "need --x OPTION or --heatmap X,Y\n");
        return 2;
    }
    return plot_all(res, out, baseline, pa.budgets, fmts, n_fmt);
}
