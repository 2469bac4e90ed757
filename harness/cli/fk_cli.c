/* SPDX-License-Identifier: MIT
 * fadkv-bench command line: the only main(), the only place (with the other fk_cli*.c files)
 * that prints or exits. Subcommands are listed in usage().
 */
#include <dirent.h>
#include <errno.h>
#include <hdf5.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli/fk_cli.h"
#include "common/fk_clock.h"
#include "common/fk_err.h"
#include "core/fk_codec.h"
#include "core/fk_registry.h"
#include "core/fk_evict.h"
#include "core/fk_rewrite.h"
#include "engine/fk_sweep.h"
#include "formats/fk_basis.h"
#include "formats/fk_calib.h"
#include "formats/fk_dict.h"
#include "formats/fk_h5.h"
#include "formats/fk_trace.h"
#include "runner/fk_runner.h"
#include "store/fk_results.h"
#include "fk_version.h"

static volatile sig_atomic_t g_stop, g_signal, g_quiet_stop;
/* The --plugin files of this command line (the worker processes of a run load them too). */
static const char *g_plugin_files[64];
static int g_n_plugin_files;

/* SIGINT, SIGTERM: stop within a decode step (finished cells are kept); says so at once. */
static void on_signal(int sig)
{
    static const char msg[] = "\nfadkv-bench: stopping: finished cells are kept\n";
    if (!g_stop && !g_quiet_stop)
        (void)!write(STDERR_FILENO, msg, sizeof msg - 1);
    g_signal = sig;
    g_stop = 1;
}

/* The commands: name (with its argument synopsis), one-line summary, function. */
struct command {
    const char *name;
    const char *args;
    const char *summary;
    int (*run)(int argc, char **argv);
};

static int cmd_bench(int argc, char **argv);

static const struct command commands[] = {
    {"codecs", "", "list codecs and their options", fk_cli_codecs},
    {"info", "[--verify] FILE|DIR...", "describe (and verify) traces, dictionaries, results",
     fk_cli_info},
    {"synth", "--out DIR [...]", "write synthetic traces (--help)", fk_cli_synth},
    {"trace", "--model M --tokenizer T --prompt TEXT --steps N --out DIR",
     "decode with a llama2.c model and write its trace", fk_cli_trace},
    {"loop", "--model M --prompt TEXT --steps N --codec NAME [...]",
     "one codec in the loop of a llama2.c model (--help)", fk_cli_loop},
    {"train-dict", "[...]", "train per-layer dictionaries (--help)", fk_cli_train_dict},
    {"train-basis", "--out BASIS.h5 [--group g] [--max-rank k] TRACES...",
     "per-layer PCA bases for the low-rank codecs (--help)", fk_cli_train_basis},
    {"train-calib", "--out CALIB.h5 [--outliers F,...] [--sinks N] [--rope L] TRACES...",
     "KVQuant calibration: key thresholds and k-means LUTs (--help)", fk_cli_train_calib},
    {"bench", "omp|replay [...]", "OMP kernel benchmark; replay benchmark vs reference (--help)",
     cmd_bench},
    {"plot", "RESULTS_DIR [--out DIR] [--format png|pdf|svg]", "figures of a results directory",
     fk_cli_plot},
    {"check", "--baseline FILE --results DIR [--rtol R] [--atol A] [--update]",
     "regression gate against a baseline", fk_cli_check},
    {"metrics", "[--markdown]", "every metric of a results directory: unit, better direction, "
     "definition", fk_cli_metrics},
    {"merge", "OUT_DIR SHARD_DIR...", "combine shard results", fk_cli_merge},
    {"prune", "RESULTS_DIR [--dry-run]", "remove the cells of earlier sweeps from a directory",
     fk_cli_prune},
    {"conformance", "FILE.so|CODEC...", "the codec conformance suite on a plugin or codecs",
     fk_cli_conformance},
    {NULL, NULL, NULL, NULL},
};

static const struct command bench_commands[] = {
    {"omp", "[...]", "OMP kernel benchmark", fk_cli_bench_omp},
    {"replay", "[...]", "replay benchmark vs reference", fk_cli_bench_replay},
    {"loop", "--model M.bin [--make-model] [...]",
     "closed loop: exact tokens/s vs the bandwidth floor, codec overheads", fk_cli_bench_loop},
    {NULL, NULL, NULL, NULL},
};

static void usage(FILE *f)
{
    fprintf(f,
            "fadkv-bench %s: replay KV-cache traces through KV-cache codecs\n"
            "\n"
            "usage:\n"
            "  fadkv-bench --config SWEEP.toml [--set KEY=VALUE]... [--jobs N] [--force]\n"
            "              [--shard I/N] [--dry-run] [--print-config] [--quiet]\n"
            "              [--attn-layers L,L,...] [--no-attention]\n"
            "              [--cell-timeout SECONDS] [--retry-failed] [--no-isolate]\n"
            "  Cells run in worker processes: a codec's crash or abort, or a cell past\n"
            "  --cell-timeout, is recorded as that cell's (crashed, timeout) and a rerun keeps\n"
            "  it unless --retry-failed; --no-isolate runs cells in this process.\n"
            "  --plugin FILE.so (any command, repeatable): load a codec plugin first\n",
            FK_VERSION);
    for (const struct command *c = commands; c->name; c++)
        fprintf(f, "  fadkv-bench %s%s%s\n      %s\n", c->name, *c->args ? " " : "", c->args,
                c->summary);
}

static int fail(const char *what)
{
    fprintf(stderr, "fadkv-bench: %s%s%s\n", what, *fk_errmsg() ? ": " : "", fk_errmsg());
    return 1;
}

/* ---- codecs --------------------------------------------------------------------------- */

/* One codec's (or policy's, seen through its option table) options with their defaults. */
static int print_options(const struct fk_codec_ops *c)
{
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
        } else if (o->type == FK_OPT_INT) { /* integer bounds in full (1 << 24, not 1.67772e+07) */
            printf("    %-14s = %-10s %s [%.0f, %.0f]\n", o->name, def, o->help, o->min, o->max);
        } else {
            printf("    %-14s = %-10s %s [%g, %g]\n", o->name, def, o->help, o->min, o->max);
        }
    }
    return 0;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The named presets: the .toml files of the preset folder, each with its first comment. */
static void print_presets(void)
{
    const char *dir = fk_sweep_preset_dir();
    printf("\npresets ([[codec]] preset = \"NAME\": %s/NAME.toml; or a path to your own "
           ".toml file):\n", dir);
    DIR *d = opendir(dir);
    char *names[256];
    int n = 0;
    for (struct dirent *e; d && n < 256 && (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        if (len > 5 && !strcmp(e->d_name + len - 5, ".toml") && (names[n] = strdup(e->d_name)))
            n++;
    }
    if (d)
        closedir(d);
    else
        printf("    (cannot read the folder: %s)\n", strerror(errno));
    qsort(names, (size_t)n, sizeof *names, by_name);
    for (int i = 0; i < n; i++) {
        char path[4096], line[256] = "";
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        FILE *f = fopen(path, "r");
        if (f && fgets(line, sizeof line, f) && line[0] == '#')
            line[strcspn(line, "\n")] = 0;
        else
            line[0] = 0;
        if (f)
            fclose(f);
        names[i][strlen(names[i]) - 5] = 0;
        printf("    %-14s %s\n", names[i], line[0] ? line + 1 + (line[1] == ' ') : "");
        free(names[i]);
    }
}

int fk_cli_codecs(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    for (int i = 0; fk_codec_at(i); i++) {
        const struct fk_codec_ops *c = fk_codec_at(i);
        const char *file = fk_codec_plugin(c);
        printf("%s: %s\n", c->name, c->summary);
        if (file)
            printf("    (plugin %s, family %s, sha256 %.16s...)\n", file, fk_codec_family(c),
                   fk_codec_plugin_sha256(c));
        if (print_options(c))
            return 1;
    }
    printf("\neviction policies ([[codec]] evict = \"...\", over any codec above but pca (and a "
           "plugin that adapts without FK_CAP_SKIPS); their options are keys of the same "
           "block; docs/EVICTION.md):\n");
    for (int i = 0; fk_evict_policies[i]; i++) {
        const struct fk_evict_ops *e = fk_evict_policies[i];
        struct fk_codec_ops view = {.name = e->name, .opts_size = e->opts_size,
                                    .options = e->options};
        printf("%s: %s\n", e->name, e->summary);
        if (print_options(&view))
            return 1;
    }
    printf("\nrow rewrites at the prefill (keys of a [[codec]] block, with or without a policy: "
           "merging what the policy drops, ThinK's key channel pruning over full; "
           "docs/EVICTION.md):\n");
    struct fk_codec_ops rw = {.name = "rewrite", .opts_size = sizeof(struct fk_rewrite),
                              .options = fk_rewrite_options};
    if (print_options(&rw))
        return 1;
    print_presets();
    return 0;
}

/* ---- info ----------------------------------------------------------------------------- */

/* The cells recorded in a results directory that its current sweep (resolved.txt) does
 * not hold: counted per sweep they came from. */
static void info_earlier(const char *path)
{
    char *text = NULL, **cur = NULL, **all = NULL, *names[64];
    size_t len;
    int n_cur = 0, n_all = 0, n_names = 0, count[64], earlier = 0;
    if (fk_store_resolved_read(path, &text, &len) < 0 ||
        fk_store_sweep_ids(text, &cur, &n_cur) < 0 ||
        fk_store_finished_ids(path, &all, &n_all) < 0) {
        fk_err_clear();
        free(text);
        fk_store_ids_free(&cur, n_cur);
        return;
    }
    free(text);
    for (int i = 0; i < n_all; i++) {
        int in = 0;
        for (int j = 0; j < n_cur && !in; j++)
            in = !strcmp(cur[j], all[i]);
        if (in)
            continue;
        earlier++;
        char sw[256];
        if (fk_results_meta_str(path, all[i], "sweep", sw, sizeof sw) < 0) {
            fk_err_clear();
            snprintf(sw, sizeof sw, "?");
        }
        int k = 0;
        while (k < n_names && strcmp(names[k], sw))
            k++;
        if (k == n_names && n_names < 64 && (names[k] = strdup(sw)))
            count[n_names++] = 0;
        if (k < n_names)
            count[k]++;
    }
    if (earlier) {
        printf("  %d earlier cell(s) recorded here are not in the current sweep (their files "
               "stay in cells/; `fadkv-bench prune %s` removes them):\n", earlier, path);
        for (int k = 0; k < n_names; k++)
            printf("    from sweep '%s': %d cell(s)\n", names[k][0] ? names[k] : "(unnamed)",
                   count[k]);
    }
    for (int k = 0; k < n_names; k++)
        free(names[k]);
    fk_store_ids_free(&cur, n_cur);
    fk_store_ids_free(&all, n_all);
}

/* A results directory: its cells through the store. Returns 1 if path is one. */
static int info_results(const char *path, int *rc)
{
    struct fk_store *st = NULL;
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return 0;
    if (fk_store_open(path, &st) < 0) {
        *rc = fail(path);
        return 1;
    }
    int ok = 0, failed = 0;
    for (int r = 0; r < st->cells.n_rows; r++) {
        const char *v = st->cells.rows[r][st->c_status];
        ok += !strcmp(v, "ok");
        failed += strcmp(v, "ok") && strcmp(v, "damaged");
    }
    printf("%s: results directory, %d cell(s) in cells.csv (the current sweep): %d finished, "
           "%d failed, %d damaged; see cells.csv, summary.csv\n", path, st->cells.n_rows, ok,
           failed, st->n_damaged);
    for (int i = 0; i < st->n_damaged; i++)
        printf("  damaged: %s (rerun the sweep to recompute it)\n", st->damaged[i]);
    info_earlier(path);
    fk_store_close(&st);
    *rc = 0;
    return 1;
}

int fk_cli_prune(int argc, char **argv)
{
    int dry = 0;
    const char *dir = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--dry-run"))
            dry = 1;
        else if (argv[i][0] != '-' && !dir)
            dir = argv[i];
        else {
            fprintf(stderr, "usage: fadkv-bench prune RESULTS_DIR [--dry-run]\n");
            return 2;
        }
    }
    if (!dir) {
        fprintf(stderr, "usage: fadkv-bench prune RESULTS_DIR [--dry-run]\n");
        return 2;
    }
    char **ids;
    int n;
    if (fk_store_prune(dir, dry, &ids, &n) < 0)
        return fail(dir);
    for (int i = 0; i < n; i++)
        printf("%s %s/cells/%s.*\n", dry ? "would remove" : "removed", dir, ids[i]);
    printf("prune: %d cell(s) of earlier sweeps %s; the current sweep's cells are kept\n", n,
           dry ? "would be removed" : "removed");
    fk_store_ids_free(&ids, n);
    return 0;
}

static int info_basis(const char *path)
{
    struct fk_basis_file *b;
    if (fk_basis_load(path, &b) < 0)
        return fail(path);
    const struct fk_basis_shape *sh = &b->sh;
    printf("%s: basis v%d, model '%s', %d layers x {K, V%s}, %d KV heads in groups of %d "
           "(dim %d), head_dim %d, %d components per group, %ld calibration tokens\n", path,
           FK_BASIS_VERSION, b->model_id, sh->n_layers, sh->has_pre_rope ? ", K pre-RoPE" : "",
           sh->n_kv_heads, sh->group, sh->dim, sh->head_dim, sh->n_comp, sh->n_vectors);
    fk_basis_free(&b);
    return 0;
}

static int info_calib(const char *path)
{
    struct fk_calib_file *c;
    if (fk_calib_load(path, &c) < 0)
        return fail(path);
    const struct fk_calib_shape *sh = &c->sh;
    char fr[FK_CALIB_MAX_FRACTIONS * 24] = "";
    for (int i = 0; i < sh->n_fractions; i++)
        snprintf(fr + strlen(fr), sizeof fr - strlen(fr), "%s%g", i ? ", " : "",
                 sh->fractions[i]);
    printf("%s: calibration v%d (KVQuant), model '%s', %d layers, %d KV heads, head_dim %d, "
           "outlier fractions %s, %d sink(s), %ld calibration tokens\n", path,
           FK_CALIB_VERSION, c->model_id, sh->n_layers, sh->n_kv_heads, sh->head_dim, fr,
           sh->sinks, sh->n_vectors);
    fk_calib_free(&c);
    return 0;
}

static int info_one(const char *path, int verify)
{
    int rc;
    if (info_results(path, &rc))
        return rc;
    hid_t fh = H5Fis_hdf5(path) > 0 ? H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT) : -1;
    int is_dict = 0, is_basis = 0, is_calib = 0;
    if (fh >= 0) {
        char buf[64] = "";
        if (fk_h5_has_attr(fh, "schema") && fk_h5_attr_str(fh, path, "schema", buf, sizeof buf) == 0) {
            is_dict = !strcmp(buf, FK_DICT_SCHEMA);
            is_basis = !strcmp(buf, FK_BASIS_SCHEMA);
            is_calib = !strcmp(buf, FK_CALIB_SCHEMA);
        }
        H5Fclose(fh);
    }
    if (is_basis)
        return info_basis(path);
    if (is_calib)
        return info_calib(path);
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
    if (!in->has_rope)
        printf("  rope: not described (no rope_layout attribute)\n");
    else if (in->rope.type == FK_ROPE_LLAMA3)
        printf("  rope: layout %s, type llama3 (factor %g, low %g, high %g, original max "
               "position %g)\n", fk_rope_layout_names[in->rope.layout], in->rope.factor,
               in->rope.low_freq_factor, in->rope.high_freq_factor,
               in->rope.original_max_position);
    else
        printf("  rope: layout %s, type default\n", fk_rope_layout_names[in->rope.layout]);
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
    int bad = 0;
    if (verify) {
        static struct fk_trace_verify vf;
        if (fk_trace_verify(t, &vf) < 0) {
            fk_trace_close(&t);
            return fail(path);
        }
        for (int i = 0; i < vf.n_issues; i++)
            printf("  verify: %s\n", vf.issue[i]);
        if (vf.n_issues == FK_VERIFY_MAX)
            printf("  verify: ... (the first %d issues shown)\n", FK_VERIFY_MAX);
        bad = vf.n_nonfinite > 0 || vf.n_unreadable > 0;
        printf("  verify: %d dataset(s) read: %ld non-finite value(s), %d unreadable "
               "dataset(s)%s\n", vf.datasets, vf.n_nonfinite, vf.n_unreadable,
               bad ? "" : ": every value is finite");
    }
    fk_trace_close(&t);
    return bad;
}

int fk_cli_info(int argc, char **argv)
{
    int verify = 0, n = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--verify"))
            verify = 1;
        else
            n++;
    }
    if (n < 1) {
        fprintf(stderr, "usage: fadkv-bench info [--verify] FILE|DIR...\n"
                        "  --verify  read every value of each trace and report each non-finite "
                        "value\n            (layer, head, token, channel) and every dataset "
                        "that cannot be read; exit 1 if any\n");
        return 2;
    }
    int rc = 0;
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--verify"))
            rc |= info_one(argv[i], verify);
    return rc;
}


/* ---- sweeps ---------------------------------------------------------------------------- */

struct sweep_args {
    const char *config;
    const char **sets;           /* --set KEY=VALUE texts, then the flags that are sets */
    int n_sets;
    char *attn_set;              /* "sweep.attn_layers=[...]" built from --attn-layers */
    int dry, print, force, quiet, jobs, shard_i, shard_n;
    int retry_failed, no_isolate;
    double cell_timeout;         /* --cell-timeout (< 0: the sweep's) */
    int worker;                  /* --worker: a worker process of an isolated run */
    const char **hashes;         /* --content-hash H...: the parent's dataset hashes */
    int n_hashes;
};

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

/* One option with its value; returns 1 if it took the value, 0 if not, -1 on a usage
 * error (printed). */
static int sweep_option(struct sweep_args *a, const char *o, const char *v)
{
    if (!strcmp(o, "--config") && v)
        a->config = v;
    else if (!strcmp(o, "--set") && v)
        a->sets[a->n_sets++] = v;
    else if (!strcmp(o, "--jobs") && v) {
        a->jobs = atoi(v);
        if (a->jobs < 1 || a->jobs > 256) {
            fprintf(stderr, "fadkv-bench: --jobs %s: expected 1..256\n", v);
            return -1;
        }
    } else if (!strcmp(o, "--cell-timeout") && v) {
        char *end;
        a->cell_timeout = strtod(v, &end);
        if (!*v || *end || !(a->cell_timeout >= 0) || !isfinite(a->cell_timeout)) {
            fprintf(stderr, "fadkv-bench: --cell-timeout %s: expected seconds >= 0 (0: no "
                            "limit)\n", v);
            return -1;
        }
    } else if (!strcmp(o, "--content-hash") && v) {
        a->hashes[a->n_hashes++] = v;
    } else if (!strcmp(o, "--shard") && v) {
        if (parse_shard(v, &a->shard_i, &a->shard_n)) {
            fprintf(stderr, "fadkv-bench: --shard %s: expected I/N with 0 <= I < N\n", v);
            return -1;
        }
    } else if (!strcmp(o, "--attn-layers") && v) {
        size_t n = strlen(v) + 40;
        free(a->attn_set);
        if (!(a->attn_set = malloc(n))) {
            fprintf(stderr, "fadkv-bench: out of memory\n");
            return -1;
        }
        snprintf(a->attn_set, n, "sweep.attn_layers=[%s]", v);
    } else
        return 0;
    return 1;
}

static int sweep_flag(struct sweep_args *a, const char *o)
{
    if (!strcmp(o, "--dry-run"))
        a->dry = 1;
    else if (!strcmp(o, "--print-config"))
        a->print = 1;
    else if (!strcmp(o, "--force"))
        a->force = 1;
    else if (!strcmp(o, "--resume"))
        a->force = 0;
    else if (!strcmp(o, "--quiet"))
        a->quiet = 1;
    else if (!strcmp(o, "--retry-failed"))
        a->retry_failed = 1;
    else if (!strcmp(o, "--no-isolate"))
        a->no_isolate = 1;
    else if (!strcmp(o, "--worker"))
        a->worker = 1;
    else if (!strcmp(o, "--no-attention"))
        a->sets[a->n_sets++] = "sweep.attention=false";
    else
        return 0;
    return 1;
}

/* Returns 0, or the exit status of a usage error (printed). */
static int parse_sweep_args(int argc, char **argv, struct sweep_args *a)
{
    *a = (struct sweep_args){.shard_n = 1, .cell_timeout = -1};
    a->sets = calloc((size_t)argc + 2, sizeof(char *));
    a->hashes = calloc((size_t)argc + 2, sizeof(char *));
    if (!a->sets || !a->hashes)
        return fail("out of memory");
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int took = sweep_option(a, argv[i], v);
        if (took < 0)
            return 2;
        if (took) {
            i++;
            continue;
        }
        if (!sweep_flag(a, argv[i])) {
            fprintf(stderr, "fadkv-bench: unknown or incomplete option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (a->attn_set)
        a->sets[a->n_sets++] = a->attn_set;
    return 0;
}

/* A cell's label: id, codec, dataset and every option whose value differs between the
 * cells of the same codec in this sweep (what the sweep varies), then the repeat. */
static void print_cell_label(const struct fk_sweep *s, const struct fk_sweep_cell *c, FILE *f)
{
    fprintf(f, "%s %-10s %-10s", c->id, c->ops->name, s->datasets[c->dataset].name);
    for (const struct fk_option *o = c->ops->options; o->name; o++) {
        double v = fk_opts_get(c->opts, o);
        int varies = 0;
        for (int k = 0; k < s->n_cells && !varies; k++)
            varies = s->cells[k].ops == c->ops && fk_opts_get(s->cells[k].opts, o) != v;
        if (varies) {
            char t[64];
            fk_opts_format(c->opts, o, t, sizeof t);
            fprintf(f, " %s=%s", o->name, t);
        }
    }
    if (c->evict) { /* the eviction policy and all its options */
        fprintf(f, " evict=%s", c->evict->name);
        for (const struct fk_option *o = c->evict->options; o->name; o++) {
            char t[64];
            fk_opts_format(c->evict_opts, o, t, sizeof t);
            fprintf(f, " %s=%s", o->name, t);
        }
    }
    for (const struct fk_option *o = c->rewrite ? fk_rewrite_options : NULL; o && o->name;
         o++) { /* the row rewrites and all their options */
        char t[64];
        fk_opts_format(c->rewrite, o, t, sizeof t);
        fprintf(f, " %s=%s", o->name, t);
    }
    if (s->repeats > 1)
        fprintf(f, " rep=%d", c->repeat);
}

static void print_config(const struct fk_sweep *s)
{
    printf("# %s resolved: %d cell(s), config hash %s\n%s", s->path, s->n_cells,
           s->config_hash, s->resolved);
    for (int d = 0; d < s->n_datasets; d++) {
        printf("# dataset %s: dictionary %s, basis %s\n", s->datasets[d].name,
               s->datasets[d].dict ? s->datasets[d].dict : "(none)",
               s->datasets[d].basis ? s->datasets[d].basis : "(none)");
        for (int i = 0; i < s->datasets[d].n_traces; i++)
            printf("#   %s\n", s->datasets[d].traces[i]);
    }
}

static int print_dry_run(const struct fk_sweep *s, int sh_i, int sh_n)
{
    int *shard = malloc(sizeof(int) * ((size_t)s->n_cells + 1)), n = 0;
    if (!shard || fk_runner_shards(s, sh_n, shard) < 0) {
        free(shard);
        return fail("dry run");
    }
    double total = 0;
    int unknown = 0;
    printf("%-16s %-10s %-10s options / estimated GMAC\n", "cell", "codec", "dataset");
    for (int c = 0; c < s->n_cells; c++) {
        if (shard[c] != (sh_n > 1 ? sh_i : 0))
            continue;
        double macs = fk_sweep_cell_macs(s, &s->cells[c], NULL);
        n++;
        print_cell_label(s, &s->cells[c], stdout);
        if (isfinite(macs)) {
            total += macs;
            printf("  %.3g GMAC\n", macs / 1e9);
        } else { /* a model dataset: its traces are the decodes the run will make */
            unknown++;
            printf("  (known once the model has decoded)\n");
        }
    }
    printf("%d cell(s)%s, about %.3g GMAC of coding in total (about %.3g s at 10 GMAC/s)",
           n, sh_n > 1 ? " in this shard" : "", total / 1e9, total / 1e10);
    if (unknown)
        printf(", not counting %d cell(s) of model datasets", unknown);
    printf("\n");
    free(shard);
    return 0;
}

/* Progress display: a bar on a terminal, a plain line every few seconds otherwise. */
struct display {
    const struct fk_sweep *s;
    int tty, quiet, shard_n;
    double last;                 /* time of the last plain progress line */
    int line_of;                 /* not a terminal: the cell whose start line is the last
                                  * line printed (its end continues it), 0: none */
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

static void show_start(void *ctx, const struct fk_sweep *s, int todo)
{
    const struct display *d = ctx;
    if (!d->quiet)
        fprintf(stderr, "fadkv-bench: sweep '%s': %d cell(s), %d to run%s, %d job(s) -> %s\n",
                s->name, s->n_cells, todo, d->shard_n > 1 ? " in this shard" : "", s->jobs,
                s->output);
}

static void show_damaged(void *ctx, const struct fk_sweep_cell *c, const char *why)
{
    (void)ctx; /* printed even with --quiet: a result is being recomputed */
    fprintf(stderr, "fadkv-bench: cell %s was recorded as finished but %s: recomputing it\n",
            c->id, why);
}

static void show_claimed(void *ctx, const struct fk_sweep_cell *c, const char *holder)
{
    const struct display *d = ctx;
    if (!d->quiet)
        fprintf(stderr, "fadkv-bench: cell %s is being computed by another run (%s): left "
                        "to it\n", c->id, holder);
}

static void show_warning(void *ctx, const char *msg)
{
    ((struct display *)ctx)->line_of = 0; /* printed even with --quiet, like the sweep's own
                                           * warnings */
    fprintf(stderr, "fadkv-bench: warning: %s\n", msg);
}

static void show_cell_start(void *ctx, const struct fk_sweep *s, const struct fk_sweep_cell *c,
                            int index, int todo)
{
    struct display *d = ctx;
    d->last = fk_wall_s();
    if (d->quiet || d->tty)
        return;
    fprintf(stderr, "[%d/%d] ", index, todo);
    print_cell_label(s, c, stderr);
    fprintf(stderr, "\n");
    d->line_of = index;
}

/* Columns of the terminal on stderr (COLUMNS, else 80, when the ioctl cannot tell). */
static int term_cols(void)
{
    struct winsize w;
    if (ioctl(STDERR_FILENO, TIOCGWINSZ, &w) == 0 && w.ws_col > 0)
        return w.ws_col;
    const char *c = getenv("COLUMNS");
    int n = c ? atoi(c) : 0;
    return n > 0 ? n : 80;
}

/* The terminal's progress line, rewritten in place: it never wraps (a wrapped line cannot be
 * erased by \r and leaves stale lines), so the bar shrinks, then the speed goes, then the
 * line is cut to the width. */
static void progress_line(const struct display *d, const struct fk_runner_progress *p,
                          const char *eta)
{
    char head[160], tail[96], speed[40], line[512], bar[64];
    int cols = term_cols() - 1; /* the last column would wrap on some terminals */
    snprintf(head, sizeof head, "[%d/%d] %s %s ", p->index, p->todo, p->cell->ops->name,
             d->s->datasets[p->cell->dataset].name);
    snprintf(speed, sizeof speed, ", %.0f vec/s", p->vec_per_s);
    for (int drop_speed = 0; drop_speed < 2; drop_speed++) {
        snprintf(tail, sizeof tail, " %d/%d layers%s, ETA %s", p->units_done, p->units_total,
                 drop_speed ? "" : speed, eta);
        int room = cols - (int)strlen(head) - (int)strlen(tail) - 2;
        if (room >= 5 || drop_speed) {
            int w = room > 20 ? 20 : room < 0 ? 0 : room;
            int fill = p->units_total ? w * p->units_done / p->units_total : w;
            for (int i = 0; i < w; i++)
                bar[i] = i < fill ? '#' : '.';
            bar[w] = 0;
            snprintf(line, sizeof line, "%s%s%s%s%s", head, w ? "[" : "", bar, w ? "]" : "",
                     tail);
            break;
        }
    }
    if ((int)strlen(line) > cols && cols > 0)
        line[cols] = 0;
    fprintf(stderr, "\r\033[K%s", line);
    fflush(stderr);
}

static void show_progress(void *ctx, const struct fk_runner_progress *p)
{
    struct display *d = ctx;
    if (d->quiet)
        return;
    char eta[32];
    fmt_eta(p->eta_s, eta, sizeof eta);
    double now = fk_wall_s();
    if (d->tty) {
        progress_line(d, p, eta);
    } else if (now - d->last >= 5) {
        char which[32] = ""; /* cells side by side: say which */
        if (p->running > 1)
            snprintf(which, sizeof which, " [%d/%d]", p->index, p->todo);
        fprintf(stderr, "   %s ... %d/%d layers, %.0f vec/s, ETA %s\n", which, p->units_done,
                p->units_total, p->vec_per_s, eta);
        d->last = now;
        d->line_of = 0;
    }
}

static void show_cell_end(void *ctx, const struct fk_sweep *s, const struct fk_runner_cell_end *e)
{
    struct display *d = ctx;
    if (d->quiet)
        return;
    /* the label again, unless the line above is this cell's own start line (not a terminal,
     * nothing printed since: cells side by side put other lines between) */
    int label = d->tty || d->line_of != e->index;
    d->line_of = 0;
    if (label) {
        fprintf(stderr, "%s[%d/%d] ", d->tty ? "\r\033[K" : "", e->index, e->todo);
        print_cell_label(s, e->cell, stderr);
    }
    if (e->failed) {
        fprintf(stderr, "%s  FAILED: %s\n", label ? "" : "   ", e->error);
        return;
    }
    char eta[32];
    fmt_eta(e->eta_s, eta, sizeof eta);
    fprintf(stderr, "%s  %.1f s, %.0f vec/s, rel_err %.4f, ETA %s\n", label ? "" : "   ",
            e->wall_s, e->vectors / (e->wall_s > 0 ? e->wall_s : 1), e->rel_err, eta);
}

/* The command line of a lane's worker process (isolation): this program with the same
 * plugins, config and overrides; the runner appends the content hashes and --worker.
 * NULL when this program's path cannot be known (then cells run in this process). */
static const char **child_command(const struct sweep_args *a)
{
    static char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0 || !a->config)
        return NULL;
    exe[n] = 0;
    const char **v = calloc((size_t)(2 * g_n_plugin_files + 2 * a->n_sets + 6), sizeof *v);
    if (!v)
        return NULL;
    int k = 0;
    v[k++] = exe;
    for (int i = 0; i < g_n_plugin_files; i++) {
        v[k++] = "--plugin";
        v[k++] = g_plugin_files[i];
    }
    v[k++] = "--config";
    v[k++] = a->config;
    for (int i = 0; i < a->n_sets; i++) {
        v[k++] = "--set";
        v[k++] = a->sets[i];
    }
    v[k++] = "--quiet";
    v[k] = NULL;
    return v;
}

static int run_sweep(const struct fk_sweep *s, const struct sweep_args *a)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    struct display d = {.s = s, .tty = isatty(STDERR_FILENO), .quiet = a->quiet, .shard_n = a->shard_n};
    const char **child = a->no_isolate ? NULL : child_command(a);
    struct fk_runner_opts ro = {
        .force = a->force, .retry_failed = a->retry_failed, .shard_i = a->shard_i,
        .shard_n = a->shard_n, .stop = &g_stop, .child_argv = child,
        .cell_timeout = a->cell_timeout >= 0 ? a->cell_timeout : s->cell_timeout_s,
        .hooks = {.ctx = &d, .start = show_start, .cell_start = show_cell_start,
                  .progress = show_progress, .cell_end = show_cell_end,
                  .damaged = show_damaged, .claimed = show_claimed, .warn = show_warning}};
    struct fk_runner_summary sum;
    int rc = fk_runner_run(s, &ro, &sum);
    free(child);
    if (rc < 0) {
        fprintf(stderr, "fadkv-bench: %s\n", fk_errmsg());
        return 1;
    }
    if (sum.interrupted || g_stop) {
        fprintf(stderr, "fadkv-bench: interrupted: %d cell(s) finished and kept; run the same "
                        "command%s again to resume\n", sum.done,
                a->force ? " without --force" : "");
        return g_signal == SIGTERM ? 143 : 130;
    }
    if (!a->quiet)
        fprintf(stderr, "fadkv-bench: %d cell(s) run, %d failed, %d already done; %.1f s; "
                        "results in %s/cells.csv\n", sum.done, sum.failed, sum.skipped,
                sum.wall_s, s->output);
    if (sum.failed)
        fprintf(stderr, "fadkv-bench: %d cell(s) failed (their errors are in cells.csv); "
                        "running the same command again retries those that did not crash or "
                        "time out\n", sum.failed);
    if (sum.not_retried)
        fprintf(stderr, "fadkv-bench: %d cell(s) crashed or timed out in an earlier run and "
                        "were left as recorded (--retry-failed runs them again)\n",
                sum.not_retried);
    if (sum.elsewhere)
        fprintf(stderr, "fadkv-bench: %d cell(s) were being computed by other runs on %s; "
                        "the last run to finish writes the complete tables\n", sum.elsewhere,
                s->output);
    return sum.failed ? 1 : 0;
}

/* A worker process of an isolated run (--worker): cells named on stdin, reports on fd 3
 * (runner/fk_runner_worker.c). Exit 0 at the end of the commands, 2 on an error (said on
 * stderr). */
static int run_worker(const struct fk_sweep *s)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    g_quiet_stop = 1;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    if (fk_runner_worker(s, STDIN_FILENO, 3, &g_stop) < 0) {
        fprintf(stderr, "fadkv-bench: worker: %s\n", fk_errmsg());
        return 2;
    }
    return 0;
}

int fk_cli_sweep(int argc, char **argv)
{
    struct sweep_args a;
    int rc = parse_sweep_args(argc, argv, &a);
    struct fk_sweep *s = NULL;
    if (rc == 0 && (a.worker ? fk_sweep_load_hashed(a.config, a.sets, a.n_sets, a.hashes,
                                                  a.n_hashes, &s)
                           : fk_sweep_load(a.config, a.sets, a.n_sets, 1, &s)) < 0)
        rc = fail("configuration error");
    for (int i = 0; rc == 0 && !a.worker && i < s->n_warnings; i++)
        fprintf(stderr, "fadkv-bench: warning: %s\n", s->warnings[i]);
    if (rc == 0) {
        if (a.jobs)
            s->jobs = a.jobs;
        if (a.worker)
            rc = run_worker(s);
        else if (a.print)
            print_config(s);
        else if (a.dry)
            rc = print_dry_run(s, a.shard_i, a.shard_n);
        else
            rc = run_sweep(s, &a);
    }
    fk_sweep_free(&s);
    free(a.sets);
    free(a.hashes);
    free(a.attn_set);
    return rc;
}

static const struct command *find_command(const struct command *table, const char *name)
{
    for (const struct command *c = table; c->name; c++)
        if (!strcmp(c->name, name))
            return c;
    return NULL;
}

static int cmd_bench(int argc, char **argv)
{
    const struct command *c = argc >= 2 ? find_command(bench_commands, argv[1]) : NULL;
    if (!c) {
        fprintf(stderr, "usage: fadkv-bench bench omp|replay [...] (--help)\n");
        return 2;
    }
    return c->run(argc - 1, argv + 1);
}

/* --plugin FILE (anywhere on the line, repeatable): loads each plugin and removes the pair
 * from argv. Returns 0, or the exit status of a failure (printed). */
static int load_plugins(int *argc, char **argv)
{
    int k = 1;
    for (int i = 1; i < *argc; i++) {
        if (strcmp(argv[i], "--plugin")) {
            argv[k++] = argv[i];
            continue;
        }
        if (i + 1 >= *argc) {
            fprintf(stderr, "fadkv-bench: --plugin needs a file (a shared library of codecs)\n");
            return 2;
        }
        if (fk_plugin_load(argv[++i]) < 0)
            return fail("--plugin");
        if (g_n_plugin_files < 64)
            g_plugin_files[g_n_plugin_files++] = argv[i];
    }
    argv[k] = NULL;
    *argc = k;
    return 0;
}

int main(int argc, char **argv)
{
    fk_cli_init();
    int prc = load_plugins(&argc, argv);
    if (prc)
        return prc;
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
        return fk_cli_sweep(argc, argv);
    const struct command *c = find_command(commands, cmd);
    if (c)
        return c->run(argc - 1, argv + 1);
    fprintf(stderr, "fadkv-bench: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
