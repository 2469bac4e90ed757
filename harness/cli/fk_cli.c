/* SPDX-License-Identifier: MIT
 * fadkv-bench command line: the only main(), the only place (with the other fk_cli*.c files)
 * that prints or exits. Subcommands are listed in usage().
 */
#include <cblas.h>
#include <errno.h>
#include <hdf5.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/fk_clock.h"
#include "bench/fk_bench.h"
#include "cli/fk_cli_trace.h"
#include "core/fk_codec.h"
#include "formats/fk_dict.h"
#include "common/fk_err.h"
#include "formats/fk_h5.h"
#include "engine/fk_replay.h"
#include "store/fk_results.h"
#include "engine/fk_sweep.h"
#include "gen/fk_synth.h"
#include "formats/fk_trace.h"
#include "fk_version.h"

int fk_cli_plot(int argc, char **argv);
int fk_cli_check(int argc, char **argv);
int fk_cli_merge(int argc, char **argv);
int fk_cli_train_dict(int argc, char **argv);
int fk_cli_bench_replay(int argc, char **argv);
extern const char *gsl_version;

/* Codec that cells.csv's cost_mac_rel and cpu_time_rel are relative to (until the sweep
 * has a cost_baseline key). */
#define FK_COST_BASELINE "lexico-adp"

static volatile sig_atomic_t g_stop;

static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

static void usage(FILE *f)
{
    fprintf(f,
            "fadkv-bench %s: replay KV-cache traces through dictionary-based KV codecs\n"
            "\n"
            "usage:\n"
            "  fadkv-bench --config SWEEP.toml [--set KEY=VALUE]... [--jobs N] [--force]\n"
            "              [--shard I/N] [--dry-run] [--print-config] [--quiet]\n"
            "              [--attn-layers L,L,...] [--no-attention]\n"
            "  fadkv-bench codecs                       list codecs and their options\n"
            "  fadkv-bench info FILE|DIR...             describe traces, dictionaries, results\n"
            "  fadkv-bench synth --out DIR [...]        write synthetic traces (--help)\n"
            "  fadkv-bench trace --model M --tokenizer T --prompt TEXT --steps N --out DIR\n"
            "  fadkv-bench train-dict [...]             train per-layer dictionaries (--help)\n"
            "  fadkv-bench bench omp [...]              OMP kernel benchmark (--help)\n"
            "  fadkv-bench bench replay [...]           replay benchmark vs reference (--help)\n"
            "  fadkv-bench plot RESULTS_DIR [--out DIR] [--format png|pdf|svg]\n"
            "  fadkv-bench check --baseline FILE --results DIR [--rtol R] [--atol A] [--update]\n"
            "  fadkv-bench merge OUT_DIR SHARD_DIR...   combine shard results\n",
            FK_VERSION);
}

static int fail(const char *what)
{
    fprintf(stderr, "fadkv-bench: %s%s%s\n", what, *fk_errmsg() ? ": " : "", fk_errmsg());
    return 1;
}

/* ---- codecs --------------------------------------------------------------------------- */

static int cmd_codecs(void)
{
    for (int i = 0; fk_codecs[i]; i++) {
        const struct fk_codec_ops *c = fk_codecs[i];
        printf("%s: %s\n", c->name, c->summary);
        for (const struct fk_option *o = c->options; o->name; o++) {
            char def[64];
            void *tmp = calloc(1, c->opts_size);
            if (!tmp)
                return fail("out of memory");
            fk_opts_defaults(c, tmp);
            fk_opts_format(tmp, o, def, sizeof def);
            free(tmp);
            if (o->type == FK_OPT_ENUM) {
                char ch[256] = "";
                for (int k = 0; o->choices[k]; k++) {
                    size_t n = strlen(ch);
                    snprintf(ch + n, sizeof ch - n, "%s%s", k ? "|" : "", o->choices[k]);
                }
                printf("    %-14s = %-10s %s [%s]\n", o->name, def, o->help, ch);
            } else if (o->type == FK_OPT_BOOL) {
                printf("    %-14s = %-10s %s\n", o->name, def, o->help);
            } else {
                printf("    %-14s = %-10s %s [%g, %g]\n", o->name, def, o->help, o->min, o->max);
            }
        }
    }
    printf("\npresets ([[codec]] preset = \"...\"):\n");
    for (int i = 0; fk_presets[i].name; i++)
        printf("    %-14s %s\n", fk_presets[i].name, fk_presets[i].help);
    return 0;
}

/* ---- info ----------------------------------------------------------------------------- */

static int info_one(const char *path)
{
    char p[4200];
    snprintf(p, sizeof p, "%s/cells.csv", path);
    if (access(p, F_OK) == 0) {
        FILE *f = fopen(p, "r");
        if (!f)
            return fail(p);
        char line[1 << 14];
        int rows = -1;
        while (fgets(line, sizeof line, f))
            rows++;
        fclose(f);
        printf("%s: results directory, %d finished cell(s); see cells.csv, summary.csv\n", path,
               rows < 0 ? 0 : rows);
        return 0;
    }
    hid_t fh = H5Fis_hdf5(path) > 0 ? H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT) : -1;
    int is_dict = 0;
    if (fh >= 0) {
        char buf[64] = "";
        if (fk_h5_has_attr(fh, "schema") && fk_h5_attr_str(fh, path, "schema", buf, sizeof buf) == 0)
            is_dict = !strcmp(buf, FK_DICT_SCHEMA);
        H5Fclose(fh);
    }
    if (is_dict) {
        struct fk_dict *d;
        if (fk_dict_load(path, &d) < 0)
            return fail(path);
        printf("%s: dictionary v%d, %d layers x {K, V}, N = %d atoms, head_dim %d, %d dead "
               "atoms, max | ||d|| - 1 | before renormalisation %.3g\n",
               path, FK_DICT_VERSION, d->n_layers, d->n_atoms, d->head_dim, d->n_dead,
               d->max_norm_dev);
        fk_dict_free(&d);
        return 0;
    }
    struct fk_trace *t;
    if (fk_trace_open(path, &t) < 0)
        return fail(path);
    const struct fk_trace_info *in = fk_trace_get_info(t);
    printf("%s: trace v%d, model '%s', source %s\n", path, FK_TRACE_VERSION, in->model_id,
           in->source);
    printf("  layers %d, query heads %d, KV heads %d (GQA group %d), head_dim %d\n",
           in->n_layers, in->n_q_heads, in->n_kv_heads, in->n_q_heads / in->n_kv_heads,
           in->head_dim);
    printf("  tokens %d (prefill %d, decode %d), keys_post_rope %d, rope_theta %g\n",
           in->n_tokens, in->prompt_len, in->n_tokens - in->prompt_len, in->keys_post_rope,
           in->rope_theta);
    printf("  queries: %s", in->has_queries ? "yes" : "no");
    if (in->has_queries)
        printf(" (%d rows per head)", in->n_queries);
    printf("\n  vectors: %.0f keys + values\n",
           2.0 * in->n_layers * in->n_kv_heads * (double)in->n_tokens);
    static const char *const attrs[] = {"prompt", "model_sha256", "generator", "seed", NULL};
    for (int i = 0; attrs[i]; i++) {
        const char *v = fk_trace_attr(t, attrs[i]);
        if (v)
            printf("  %s: %.200s\n", attrs[i], v);
    }
    fk_trace_close(&t);
    return 0;
}

static int cmd_info(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: fadkv-bench info FILE|DIR...\n");
        return 2;
    }
    int rc = 0;
    for (int i = 1; i < argc; i++)
        rc |= info_one(argv[i]);
    return rc;
}

/* ---- sweeps ---------------------------------------------------------------------------- */

struct loaded {
    struct fk_trace **traces;    /* per dataset: opened traces */
    struct fk_dict *dict;
};

static int write_provenance(const struct fk_sweep *s, int jobs)
{
    char cpu[256] = "unknown";
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f))
            if (!strncmp(line, "model name", 10)) {
                char *c = strchr(line, ':');
                if (c) {
                    snprintf(cpu, sizeof cpu, "%s", c + 2);
                    cpu[strcspn(cpu, "\n")] = 0;
                }
                break;
            }
        fclose(f);
    }
    unsigned maj, min, rel;
    H5get_libversion(&maj, &min, &rel);
    char harness[64], hdf5[48];
    snprintf(harness, sizeof harness, "fadkv-bench %s", FK_VERSION);
    snprintf(hdf5, sizeof hdf5, "%u.%u.%u", maj, min, rel);
    struct fk_provenance p = {
        .harness = harness, .git = FK_GIT_VERSION, .config = s->path,
        .config_hash = s->config_hash, .sweep = s->name, .cells = s->n_cells, .jobs = jobs,
        .hdf5 = hdf5, .gsl = gsl_version, .openblas = openblas_get_config(),
        .openblas_kernels = openblas_get_corename(), .blas_threads_per_worker = 1, .cpu = cpu,
        .online_cpus = sysconf(_SC_NPROCESSORS_ONLN),
        .precision = "float32 data, float32 BLAS dot products, double triangular solves and "
                     "energies"};
    FK_TRY(fk_store_provenance_write(s->output, &p));
    return fk_store_resolved_write(s->output, s->resolved, strlen(s->resolved));
}

static void free_loaded(const struct fk_sweep *s, struct loaded *ld)
{
    for (int d = 0; ld && d < s->n_datasets; d++) {
        for (int i = 0; ld[d].traces && i < s->datasets[d].n_traces; i++)
            fk_trace_close(&ld[d].traces[i]);
        free(ld[d].traces);
        fk_dict_free(&ld[d].dict);
    }
    free(ld);
}

static int parse_shard(const char *a, int *i, int *n)
{
    char *end;
    long x = strtol(a, &end, 10);
    if (*end != '/')
        return -1;
    long y = strtol(end + 1, &end, 10);
    if (*end || y < 1 || x < 0 || x >= y)
        return -1;
    *i = (int)x;
    *n = (int)y;
    return 0;
}

static void print_cell_label(const struct fk_sweep *s, const struct fk_sweep_cell *c, FILE *f)
{
    fprintf(f, "%s %-10s %-10s", c->id, c->ops->name, s->datasets[c->dataset].name);
    for (const struct fk_option *o = c->ops->options; o->name; o++) {
        if (!strcmp(o->name, "s") || !strcmp(o->name, "n") || !strcmp(o->name, "tau_c") ||
            !strcmp(o->name, "delta_k") || !strcmp(o->name, "delta_v") ||
            !strcmp(o->name, "n_b") || !strcmp(o->name, "inner")) {
            char v[64];
            fk_opts_format(c->opts, o, v, sizeof v);
            fprintf(f, " %s=%s", o->name, v);
        }
    }
    if (s->repeats > 1)
        fprintf(f, " rep=%d", c->repeat);
}

/* Relative running time of a cell for the ETA: its coding multiply-adds plus a fixed
 * per-vector cost for reading, metrics and attention (about 2e5 multiply-adds). */
static double cell_weight(const struct fk_sweep *s, const struct fk_sweep_cell *c)
{
    double vec = 0, macs = fk_sweep_cell_macs(s, c, &vec);
    return macs + 2e5 * vec;
}

/* Progress of a sweep: a bar on a terminal, a plain line every few seconds otherwise. */
struct progress {
    int tty, quiet;
    int cell, todo;              /* 1-based index among the cells to run, and their count */
    const char *codec, *dataset;
    double t_start, t_cell;      /* sweep and cell start (monotonic seconds) */
    double est_total, est_done, est_cell; /* cost-model MACs: all, finished, this cell */
    double last;                 /* last plain line */
};

static void fmt_eta(double s, char *buf, size_t cap)
{
    if (!isfinite(s) || s < 0)
        snprintf(buf, cap, "?");
    else if (s < 90)
        snprintf(buf, cap, "%.0fs", s);
    else if (s < 5400)
        snprintf(buf, cap, "%.0fm%02.0fs", floor(s / 60), fmod(s, 60));
    else
        snprintf(buf, cap, "%.1fh", s / 3600);
}

static void on_progress(void *ctx, int done, int total, long vectors)
{
    struct progress *p = ctx;
    if (p->quiet)
        return;
    double now = fk_wall_s(), frac = total ? (double)done / total : 1;
    double el = now - p->t_start, work = p->est_done + p->est_cell * frac;
    char eta[32];
    fmt_eta(work > 0 ? el * (p->est_total - work) / work : NAN, eta, sizeof eta);
    double rate = vectors / (now - p->t_cell > 1e-9 ? now - p->t_cell : 1e-9);
    if (p->tty) {
        char bar[21];
        int fill = (int)(20 * frac);
        for (int i = 0; i < 20; i++)
            bar[i] = i < fill ? '#' : '.';
        bar[20] = 0;
        fprintf(stderr, "\r\033[K[%d/%d] %s %s [%s] %d/%d layers, %.0f vec/s, ETA %s", p->cell,
                p->todo, p->codec, p->dataset, bar, done, total, rate, eta);
        fflush(stderr);
    } else if (now - p->last >= 5) {
        fprintf(stderr, "    ... %d/%d layers, %.0f vec/s, ETA %s\n", done, total, rate, eta);
        p->last = now;
    }
}

static int cmd_sweep(int argc, char **argv)
{
    const char *config = NULL;
    const char **sets = calloc((size_t)argc + 1, sizeof(char *));
    int n_sets = 0, dry = 0, print = 0, force = 0, quiet = 0, jobs = 0, sh_i = 0, sh_n = 1;
    int no_attn = 0;
    const char *attn_layers = NULL;
    if (!sets)
        return fail("out of memory");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--config") && v) {
            config = v;
            i++;
        } else if (!strcmp(a, "--set") && v) {
            sets[n_sets++] = v;
            i++;
        } else if (!strcmp(a, "--jobs") && v) {
            jobs = atoi(v);
            i++;
            if (jobs < 1 || jobs > 256) {
                fprintf(stderr, "fadkv-bench: --jobs %s: expected 1..256\n", v);
                free(sets);
                return 2;
            }
        } else if (!strcmp(a, "--shard") && v) {
            i++;
            if (parse_shard(v, &sh_i, &sh_n)) {
                fprintf(stderr, "fadkv-bench: --shard %s: expected I/N with 0 <= I < N\n", v);
                free(sets);
                return 2;
            }
        } else if (!strcmp(a, "--attn-layers") && v) {
            attn_layers = v;
            i++;
        } else if (!strcmp(a, "--dry-run")) {
            dry = 1;
        } else if (!strcmp(a, "--print-config")) {
            print = 1;
        } else if (!strcmp(a, "--force")) {
            force = 1;
        } else if (!strcmp(a, "--resume")) {
            force = 0;
        } else if (!strcmp(a, "--quiet")) {
            quiet = 1;
        } else if (!strcmp(a, "--no-attention")) {
            no_attn = 1;
        } else {
            fprintf(stderr, "fadkv-bench: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            free(sets);
            return 2;
        }
    }
    char *layer_set = NULL;
    if (attn_layers) {
        size_t n = strlen(attn_layers) + 3;
        layer_set = malloc(n);
        if (!layer_set) {
            free(sets);
            return fail("out of memory");
        }
        snprintf(layer_set, n, "[%s]", attn_layers);
        char *kv = malloc(n + 32);
        if (!kv) {
            free(layer_set);
            free(sets);
            return fail("out of memory");
        }
        snprintf(kv, n + 32, "sweep.attn_layers=%s", layer_set);
        free(layer_set);
        layer_set = kv;
        sets[n_sets++] = layer_set;
    }
    if (no_attn)
        sets[n_sets++] = "sweep.attention=false";
    struct fk_sweep *s = NULL;
    int rc = fk_sweep_load(config, sets, n_sets, 1, &s);
    free(sets);
    free(layer_set);
    if (rc < 0)
        return fail("configuration error");
    if (jobs)
        s->jobs = jobs;
    if (print) {
        printf("# %s resolved: %d cell(s), config hash %s\n%s", s->path, s->n_cells,
               s->config_hash, s->resolved);
        for (int d = 0; d < s->n_datasets; d++) {
            printf("# dataset %s: dictionary %s\n", s->datasets[d].name,
                   s->datasets[d].dict ? s->datasets[d].dict : "(none)");
            for (int i = 0; i < s->datasets[d].n_traces; i++)
                printf("#   %s\n", s->datasets[d].traces[i]);
        }
        fk_sweep_free(&s);
        return 0;
    }
    if (dry) {
        double total = 0;
        printf("%-16s %-10s %-10s options / estimated GMAC\n", "cell", "codec", "dataset");
        for (int c = 0; c < s->n_cells; c++) {
            if (c % sh_n != sh_i)
                continue;
            double macs = fk_sweep_cell_macs(s, &s->cells[c], NULL);
            total += macs;
            print_cell_label(s, &s->cells[c], stdout);
            printf("  %.1f GMAC\n", macs / 1e9);
        }
        printf("%d cell(s), about %.0f GMAC of coding in total (about %.0f s at 10 GMAC/s)\n",
               s->n_cells, total / 1e9, total / 1e10);
        fk_sweep_free(&s);
        return 0;
    }
    /* Open every trace and dictionary a cell to run needs before the results directory is
     * touched: a damaged file then fails the run and leaves earlier results as they were. */
    struct loaded *ld = calloc((size_t)s->n_datasets, sizeof *ld);
    if (!ld) {
        fk_sweep_free(&s);
        return fail("out of memory");
    }
    int lrc0 = FK_OK;
    for (int c = 0; c < s->n_cells && lrc0 == FK_OK; c++) {
        const struct fk_sweep_cell *cell = &s->cells[c];
        if (c % sh_n != sh_i || (!force && fk_results_done(s->output, cell->id)))
            continue;
        struct fk_dataset *ds = &s->datasets[cell->dataset];
        struct loaded *L = &ld[cell->dataset];
        if (!L->traces) {
            L->traces = calloc((size_t)ds->n_traces, sizeof(struct fk_trace *));
            if (!L->traces)
                lrc0 = fk_err(FK_ENOMEM, "out of memory");
            for (int i = 0; lrc0 == FK_OK && i < ds->n_traces; i++)
                lrc0 = fk_trace_open(ds->traces[i], &L->traces[i]);
        }
        if (lrc0 == FK_OK && !L->dict && ds->dict && (cell->ops->caps & FK_CAP_DICT))
            lrc0 = fk_dict_load(ds->dict, &L->dict);
        if (lrc0 < 0)
            fprintf(stderr, "fadkv-bench: dataset '%s': %s\n", ds->name, fk_errmsg());
    }
    if (lrc0 < 0) {
        free_loaded(s, ld);
        fk_sweep_free(&s);
        return 1;
    }
    if (fk_results_prepare(s->output) < 0 || write_provenance(s, s->jobs) < 0) {
        free_loaded(s, ld);
        fk_sweep_free(&s);
        return fail("results directory");
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);

    const char **ids = calloc((size_t)s->n_cells + 1, sizeof(char *));
    if (!ids) {
        free_loaded(s, ld);
        fk_sweep_free(&s);
        return fail("out of memory");
    }
    for (int c = 0; c < s->n_cells; c++)
        ids[c] = s->cells[c].id;
    int todo = 0, failed = 0, done = 0, skipped = 0;
    for (int c = 0; c < s->n_cells; c++)
        todo += c % sh_n == sh_i && (force || !fk_results_done(s->output, s->cells[c].id));
    int tty = isatty(STDERR_FILENO);
    double t_start = fk_wall_s(), vec_done = 0, est_total = 0, est_done = 0;
    for (int c = 0; c < s->n_cells; c++)
        if (c % sh_n == sh_i && (force || !fk_results_done(s->output, s->cells[c].id)))
            est_total += cell_weight(s, &s->cells[c]);
    if (!quiet)
        fprintf(stderr, "fadkv-bench: sweep '%s': %d cell(s), %d to run%s, %d job(s) -> %s\n",
                s->name, s->n_cells, todo, sh_n > 1 ? " in this shard" : "", s->jobs,
                s->output);
    rc = 0;
    struct fk_replay_pool *pool = NULL; /* Gram buffers from cell to cell (optional) */
    if (fk_replay_pool_new(&pool) < 0)
        pool = NULL;
    for (int c = 0; c < s->n_cells && !g_stop; c++) {
        struct fk_sweep_cell *cell = &s->cells[c];
        if (c % sh_n != sh_i)
            continue;
        if (!force && fk_results_done(s->output, cell->id)) {
            skipped++;
            continue;
        }
        struct fk_dataset *ds = &s->datasets[cell->dataset];
        struct loaded *L = &ld[cell->dataset];
        int lrc = FK_OK;
        if (!L->traces) {
            L->traces = calloc((size_t)ds->n_traces, sizeof(struct fk_trace *));
            if (!L->traces)
                lrc = fk_err(FK_ENOMEM, "out of memory");
            for (int i = 0; lrc == FK_OK && i < ds->n_traces; i++)
                lrc = fk_trace_open(ds->traces[i], &L->traces[i]);
        }
        if (lrc == FK_OK && !L->dict && ds->dict && (cell->ops->caps & FK_CAP_DICT))
            lrc = fk_dict_load(ds->dict, &L->dict);
        struct fk_cell_meta meta = {.ops = cell->ops, .opts = cell->opts, .dataset = ds->name,
                                    .traces = (const char *const *)ds->traces,
                                    .n_traces = ds->n_traces,
                                    .dict = (cell->ops->caps & FK_CAP_DICT) ? ds->dict : NULL,
                                    .attn_stride = s->attention ? s->attn_stride : 0,
                                    .seed = (long)(cell->seed & 0x7fffffffffffffffULL)};
        memcpy(meta.id, cell->id, sizeof meta.id);
        if (lrc < 0) {
            /* a dataset that cannot be read fails the run: nothing can be measured on it */
            fprintf(stderr, "fadkv-bench: dataset '%s': %s\n", ds->name, fk_errmsg());
            rc = 1;
            break;
        }
        struct progress pg = {.tty = tty, .quiet = quiet, .cell = done + failed + 1,
                              .todo = todo, .codec = cell->ops->name, .dataset = ds->name,
                              .t_start = t_start, .t_cell = fk_wall_s(), .est_total = est_total,
                              .est_done = est_done, .est_cell = cell_weight(s, cell)};
        pg.last = pg.t_cell;
        if (!quiet && !tty) {
            fprintf(stderr, "[%d/%d] ", pg.cell, todo);
            print_cell_label(s, cell, stderr);
            fprintf(stderr, "\n");
        }
        struct fk_replay_opts ro = {.jobs = s->jobs, .attention = s->attention,
                                    .attn_stride = s->attn_stride,
                                    .attn_layers = s->attn_layers, .recall = s->recall,
                                    .recall_every = s->recall_every, .stop = &g_stop,
                                    .progress = on_progress, .progress_ctx = &pg,
                                    .pool = pool};
        struct fk_cell_input in = {.ops = cell->ops, .opts = cell->opts,
                                   .traces = L->traces, .n_traces = ds->n_traces,
                                   .dict = (cell->ops->caps & FK_CAP_DICT) ? L->dict : NULL};
        struct fk_cell_result res;
        double c0 = fk_wall_s();
        int r = fk_replay_cell(&in, &ro, &res);
        double dt = fk_wall_s() - c0;
        if (r == FK_EINTR || g_stop) {
            if (r == FK_OK)
                fk_cell_result_free(&res);
            break;
        }
        if (r < 0) {
            failed++;
            char msg[1100];
            snprintf(msg, sizeof msg, "%s", fk_errmsg());
            if (!quiet && tty) {
                fprintf(stderr, "\r\033[K[%d/%d] ", pg.cell, todo);
                print_cell_label(s, cell, stderr);
            }
            if (!quiet)
                fprintf(stderr, "%s  FAILED: %s\n", tty ? "" : "   ", msg);
            if (fk_results_commit_failed(s->output, &meta, "failed", msg) < 0) {
                rc = fail("results");
                break;
            }
        } else {
            int cr = fk_results_commit(s->output, &meta, &res);
            vec_done += (double)res.vectors;
            est_done += cell_weight(s, cell);
            double err = NAN;
            if (cr == FK_OK)
                fk_results_metric(s->output, cell->id, "rel_err_mean", &err);
            long vecs = res.vectors;
            fk_cell_result_free(&res);
            if (cr < 0) {
                rc = fail("writing results (nothing of this cell was recorded as finished)");
                break;
            }
            done++;
            double el = fk_wall_s() - t_start;
            double eta = est_done > 0 ? el * (est_total - est_done) / est_done : NAN;
            char etas[32];
            fmt_eta(eta, etas, sizeof etas);
            if (!quiet && tty) {
                fprintf(stderr, "\r\033[K[%d/%d] ", pg.cell, todo);
                print_cell_label(s, cell, stderr);
            }
            if (!quiet)
                fprintf(stderr, "%s  %.1f s, %.0f vec/s, rel_err %.4f, ETA %s\n",
                        tty ? "" : "   ", dt, vecs / (dt > 0 ? dt : 1), err, etas);
        }
        if (fk_results_tables(s->output, ids, s->n_cells, FK_COST_BASELINE) < 0) {
            rc = fail("writing cells.csv");
            break;
        }
    }
    if (fk_results_tables(s->output, ids, s->n_cells, FK_COST_BASELINE) < 0 && !rc)
        rc = fail("writing cells.csv");
    fk_replay_pool_free(&pool);
    free_loaded(s, ld);
    free(ids);
    if (g_stop) {
        fprintf(stderr, "fadkv-bench: interrupted: %d cell(s) finished and kept; run the same "
                        "command again to resume\n", done);
        fk_sweep_free(&s);
        return 130;
    }
    if (!quiet)
        fprintf(stderr, "fadkv-bench: %d cell(s) run, %d failed, %d already done; %.1f s; "
                        "results in %s/cells.csv\n", done, failed, skipped, fk_wall_s() - t_start,
                s->output);
    (void)vec_done;
    fk_sweep_free(&s);
    return rc ? rc : failed ? 1 : 0;
}

int main(int argc, char **argv)
{
    fk_hdf5_quiet();
    /* a file-size limit makes write() fail with EFBIG (reported) instead of killing us */
    signal(SIGXFSZ, SIG_IGN);
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--version")) {
        printf("fadkv-bench %s (%s)\n", FK_VERSION, FK_GIT_VERSION);
        return 0;
    }
    if (cmd[0] == '-')
        return cmd_sweep(argc, argv);
    if (!strcmp(cmd, "codecs"))
        return cmd_codecs();
    if (!strcmp(cmd, "info"))
        return cmd_info(argc - 1, argv + 1);
    if (!strcmp(cmd, "synth"))
        return fk_cli_synth(argc - 1, argv + 1);
    if (!strcmp(cmd, "trace"))
        return fk_cli_trace(argc - 1, argv + 1);
    if (!strcmp(cmd, "plot"))
        return fk_cli_plot(argc - 1, argv + 1);
    if (!strcmp(cmd, "check"))
        return fk_cli_check(argc - 1, argv + 1);
    if (!strcmp(cmd, "merge"))
        return fk_cli_merge(argc - 1, argv + 1);
    if (!strcmp(cmd, "train-dict"))
        return fk_cli_train_dict(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench") && argc >= 3 && !strcmp(argv[2], "replay"))
        return fk_cli_bench_replay(argc - 2, argv + 2);
    if (!strcmp(cmd, "bench") && argc >= 3 && !strcmp(argv[2], "omp"))
        return fk_cli_bench_omp(argc - 2, argv + 2);
    fprintf(stderr, "fadkv-bench: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
