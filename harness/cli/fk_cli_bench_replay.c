/* SPDX-License-Identifier: MIT
 * `fadkv-bench bench replay`: arguments and printing of the replay benchmark
 * (harness/bench/fk_bench_replay.h says what it measures).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/fk_bench_replay.h"
#include "cli/fk_cli.h"
#include "common/fk_err.h"
#include "kernels/fk_simd.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: fadkv-bench bench replay [--config FILE] [--dataset NAME] [--jobs N]\n"
               "       [--ref-layers K] [--scale-layers K] [--no-kernel] [--no-attention]\n"
               "       [--overhead] [--only CODEC] [--ref-codec CODEC] [--rounds R]\n"
               "       [--coding-rounds R] [--coding-shares S] [--kernels best|NAME|same|none]\n"
               "       [--tsv]\n"
               "Runs every cell of FILE's dataset NAME (default: FILE's first; default FILE\n"
               "configs/bench-3b.toml) and prints vectors/s,\n"
               "a time breakdown, peak memory and each coding cell's CPU per vector against\n"
               "the reference codec's; then the reference codec (--ref-codec, by\n"
               "default the config's first static dictionary codec: lexico) optimised vs\n"
               "reference mode on the first K layers (default 2); then R interleaved rounds\n"
               "(default 3, at most 15) of it at 1 and 2 threads on the first K layers\n"
               "(default 8) and the OMP kernel benchmark at the same N, m, s (synthetic data\n"
               "and the trace's own layer 0 keys), with the median of each round's ratios.\n"
               "--overhead also replays each cell without attention right after it and prints\n"
               "the extra time of attention fidelity, per cell and in total.\n"
               "--coding-rounds R (2..15) then runs every cell again in R rounds, round r on\n"
               "the layers l with l mod S = r mod S (S = --coding-shares, default R; 1: all\n"
               "layers, for small data), every cell in turn, and prints each cell's coding\n"
               "CPU against the reference codec's within each round and their median\n"
               "(ratios a machine whose speed drifts over minutes does not skew).\n"
               "--kernels (default best): the headline figures again in a column of their own\n"
               "from a child process with other OpenBLAS kernels: best = OPENBLAS_CORETYPE\n"
               "unset (the set OpenBLAS picks for this CPU; skipped when this run has it\n"
               "already), NAME = OPENBLAS_CORETYPE=NAME (e.g. Haswell), same = this\n"
               "environment, none = no child. --tsv prints the headline figures as\n"
               "NAME<TAB>VALUE lines instead of the tables.\n");
}

/* Returns 0, or the exit status (help, usage error). */
static int parse(int argc, char **argv, struct fk_bench_replay_cfg *c, const char **kernels,
                 int *tsv)
{
    fk_bench_replay_defaults(c);
    *kernels = "best";
    *tsv = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int *num = !strcmp(a, "--jobs")           ? &c->jobs
                   : !strcmp(a, "--ref-layers")   ? &c->ref_layers
                   : !strcmp(a, "--scale-layers") ? &c->scale_layers
                   : !strcmp(a, "--rounds")       ? &c->rounds
                   : !strcmp(a, "--coding-rounds") ? &c->coding_rounds
                   : !strcmp(a, "--coding-shares") ? &c->coding_shares
                                                  : NULL;
        const char **str = !strcmp(a, "--config")      ? &c->config
                           : !strcmp(a, "--dataset")   ? &c->dataset
                           : !strcmp(a, "--only")      ? &c->only
                           : !strcmp(a, "--ref-codec") ? &c->ref_codec
                                                       : NULL;
        if ((num || str) && v) {
            if (num)
                *num = atoi(v);
            else
                *str = v;
            i++;
            if (num == &c->coding_rounds &&
                (c->coding_rounds < 2 || c->coding_rounds > FK_BENCH_MAX_ROUNDS)) {
                fprintf(stderr, "fadkv-bench bench replay: --coding-rounds: expected 2 to %d, "
                                "got '%s'\n", FK_BENCH_MAX_ROUNDS, v);
                return 2;
            }
            if (num == &c->coding_shares && c->coding_shares < 1) {
                fprintf(stderr, "fadkv-bench bench replay: --coding-shares: expected 1 or more, "
                                "got '%s'\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--kernels") && v) {
            if (fk_cli_kernels_mode(v, kernels) != 0) {
                fprintf(stderr, "fadkv-bench bench replay: --kernels: expected best, none, same "
                                "or an OpenBLAS core name (e.g. Haswell), got '%s'\n", v);
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--tsv")) {
            *tsv = 1;
        } else if (!strcmp(a, "--no-kernel")) {
            c->kernel = 0;
        } else if (!strcmp(a, "--no-attention")) {
            c->attention = 0;
        } else if (!strcmp(a, "--overhead")) {
            c->overhead = 1;
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 1;
        } else {
            usage(stderr);
            return 2;
        }
    }
    return 0;
}

#define MAX_CODING 48 /* cells whose coding CPU is listed */

/* Per-cell overhead lines, printed after the table. */
struct printer {
    const char *config;
    int stride;
    double first_wall;           /* wall seconds of the config's first cell (the x first
                                  * column: the cost of each cell against it, one run) */
    char ov_lines[4096];
    size_t ov_len;
    int tsv;                     /* print nothing but the figures at the end */
    const char *ref_codec;       /* the codec whose coding CPU the cells are compared with */
    int n_cells;                 /* cells reported so far */
    int n_coding;                /* cells that coded (coding CPU > 0), up to MAX_CODING */
    int coding_cell[MAX_CODING]; /* their ordinals in the config */
    char coding_name[MAX_CODING][40];
    double coding_us[MAX_CODING]; /* their coding CPU per vector, us */
    struct fk_cli_figs figs;     /* this run's headline figures */
};

/* Adds a figure (name, value) to f. */
static void add_fig(struct fk_cli_figs *f, const char *name, const char *fmt, double v)
{
    if (f->n >= FK_CLI_FIGS_MAX)
        return;
    snprintf(f->name[f->n], sizeof f->name[0], "%s", name);
    snprintf(f->value[f->n++], sizeof f->value[0], fmt, v);
}

static void on_info(void *ctx, const struct fk_bench_replay_info *in)
{
    struct printer *p = ctx;
    p->stride = in->attn_stride;
    p->ref_codec = in->ref_codec;
    if (p->figs.n < FK_CLI_FIGS_MAX) {
        snprintf(p->figs.name[p->figs.n], sizeof p->figs.name[0], "kernels");
        snprintf(p->figs.value[p->figs.n++], sizeof p->figs.value[0], "%s", in->kernels);
    }
    if (p->tsv)
        return;
    printf("bench replay: %s: %d trace(s), %d layers, %d/%d heads, head_dim %d, %d tokens "
           "(%d prefill), N = %d, %d job(s), attention %s (stride %d), OpenBLAS %s kernels\n",
           p->config, in->n_traces, in->n_layers, in->n_q_heads, in->n_kv_heads, in->head_dim,
           in->n_tokens, in->prompt_len, in->n_atoms, in->jobs, in->attention ? "on" : "off",
           in->attn_stride, in->kernels);
    printf("\n%-16s %8s %7s %9s %7s | %6s %6s %6s %6s %6s %6s %6s %6s %6s  (CPU s, summed "
           "over threads; evict: the eviction policy; x first: wall against the first cell)\n",
           "codec", "wall s", "x first", "vectors", "vec/s", "io", "gram", "corr", "code",
           "adapt", "evict", "attn", "metric", "write");
}

static void on_cell(void *ctx, const struct fk_bench_cell_row *r)
{
    struct printer *p = ctx;
    const struct fk_bench_timing *t = &r->t;
    if (p->first_wall <= 0)
        p->first_wall = t->wall;
    char name[48];
    snprintf(name, sizeof name, "cell %d %s vec/s", p->n_cells, r->codec);
    add_fig(&p->figs, name, "%.9g", t->vectors / t->wall);
    double coding = t->gram + t->corr + t->code + t->adapt;
    if (coding > 0 && t->vectors > 0 && p->n_coding < MAX_CODING) {
        snprintf(p->coding_name[p->n_coding], sizeof p->coding_name[0], "%s", r->codec);
        p->coding_cell[p->n_coding] = p->n_cells;
        p->coding_us[p->n_coding++] = 1e6 * coding / (double)t->vectors;
    }
    p->n_cells++;
    if (p->tsv)
        return;
    printf("%-16s %8.1f %7.2f %9ld %7.0f | %6.1f %6.1f %6.1f %6.1f %6.1f %6.1f %6.1f %6.1f "
           "%6.2f\n", r->codec, t->wall, t->wall / p->first_wall, t->vectors,
           t->vectors / t->wall, t->io, t->gram, t->corr, t->code, t->adapt, t->policy, t->attn,
           t->metrics, t->write);
    fflush(stdout);
    if (r->without_s > 0 && p->ov_len < sizeof p->ov_lines)
        p->ov_len += (size_t)snprintf(p->ov_lines + p->ov_len, sizeof p->ov_lines - p->ov_len,
                                      "  %-11s %6.1f s with, %6.1f s without: %+5.1f%%\n",
                                      r->codec, r->with_s, r->without_s,
                                      100.0 * (r->with_s - r->without_s) / r->without_s);
}

/* The coding CPU per vector of every cell that coded, against the reference codec's first
 * cell (the figures of the closer-to-the-floor comparison, from this one run). */
static void coding_figs(struct printer *p)
{
    int ref = -1;
    for (int i = 0; i < p->n_coding && ref < 0 && p->ref_codec; i++)
        if (!strcmp(p->coding_name[i], p->ref_codec))
            ref = i;
    if (p->n_coding == 0)
        return;
    if (!p->tsv) {
        printf("coding CPU per vector (gram + corr + code + adapt, summed over threads)");
        if (ref >= 0)
            printf(", against %s's:\n", p->ref_codec);
        else
            printf(" (no cell of %s to compare with):\n", p->ref_codec ? p->ref_codec : "?");
    }
    for (int i = 0; i < p->n_coding; i++) {
        char name[64];
        snprintf(name, sizeof name, "cell %d %s coding us/vec", p->coding_cell[i],
                 p->coding_name[i]);
        add_fig(&p->figs, name, "%.9g", p->coding_us[i]);
        double x = ref >= 0 ? p->coding_us[i] / p->coding_us[ref] : 0;
        if (ref >= 0) {
            snprintf(name, sizeof name, "cell %d %s coding x ref", p->coding_cell[i],
                     p->coding_name[i]);
            add_fig(&p->figs, name, "%.9g", x);
        }
        if (p->tsv)
            continue;
        printf("  %-16s %8.2f us", p->coding_name[i], p->coding_us[i]);
        if (ref >= 0)
            printf(" %7.3f", x);
        printf("\n");
    }
}

/* The coding rounds: each cell's coding CPU per vector against the reference codec's cell
 * in the same round, the median over rounds and each round's. */
static void round_figs(struct printer *p, const struct fk_bench_replay_result *r)
{
    int R = r->coding_rounds, ref = -1;
    for (int i = 0; i < r->n_round_cells && ref < 0 && p->ref_codec; i++)
        if (!strcmp(r->round_cell[i], p->ref_codec))
            ref = i;
    if (!p->tsv) {
        if (r->coding_shares > 1)
            printf("coding CPU per vector in %d interleaved rounds (round r: the layers l with "
                   "l mod %d = r mod %d, every cell in turn)", R, r->coding_shares,
                   r->coding_shares);
        else
            printf("coding CPU per vector in %d interleaved rounds (each round: every cell in "
                   "turn on all layers)", R);
        if (ref >= 0)
            printf(", against %s's in the same round: median (each round)\n", p->ref_codec);
        else
            printf(" (no cell of %s to compare with):\n", p->ref_codec ? p->ref_codec : "?");
    }
    for (int i = 0; i < r->n_round_cells; i++) {
        double us[FK_BENCH_MAX_ROUNDS], x[FK_BENCH_MAX_ROUNDS], vectors = 0;
        int coded = 1;
        for (int k = 0; k < R; k++) {
            us[k] = r->round_vectors[i][k] ? 1e6 * r->round_cpu[i][k] / r->round_vectors[i][k]
                                           : 0;
            coded &= us[k] > 0;
            x[k] = ref >= 0 && r->round_cpu[ref][k] > 0
                       ? us[k] * r->round_vectors[ref][k] / (1e6 * r->round_cpu[ref][k])
                       : 0;
            vectors += (double)r->round_vectors[i][k];
        }
        char name[96];
        snprintf(name, sizeof name, "cell %d %s rounds vectors", i, r->round_cell[i]);
        add_fig(&p->figs, name, "%.0f", vectors);
        if (!coded) /* a cell that codes nothing (full) has no ratio */
            continue;
        snprintf(name, sizeof name, "cell %d %s coding us/vec rounds", i, r->round_cell[i]);
        add_fig(&p->figs, name, "%.9g", fk_bench_median(us, R));
        if (ref >= 0) {
            snprintf(name, sizeof name, "cell %d %s coding x ref rounds", i, r->round_cell[i]);
            add_fig(&p->figs, name, "%.9g", fk_bench_median(x, R));
        }
        if (p->tsv)
            continue;
        printf("  %-16s %8.2f us", r->round_cell[i], fk_bench_median(us, R));
        if (ref >= 0) {
            printf(" %7.3f (", fk_bench_median(x, R));
            for (int k = 0; k < R; k++)
                printf("%s%.3f", k ? ", " : "", x[k]);
            printf(")");
        }
        printf("\n");
    }
}

static void print_list(const double *v, int n, const char *fmt)
{
    for (int i = 0; i < n; i++) {
        if (i)
            printf(", ");
        printf(fmt, v[i]);
    }
}

static void print_reference(const struct fk_bench_replay_cfg *c,
                            const struct fk_bench_replay_result *r)
{
    const struct fk_bench_timing *a = &r->opt, *b = &r->ref;
    printf("\n%s, first %d layer(s), 1 thread, no attention: optimised %.0f vec/s (%.2f s), "
           "reference %.0f vec/s (%.2f s): speed-up %.1fx; stored supports identical on %ld "
           "of %ld rows (%.4f%%)\n", r->ref_codec, c->ref_layers, a->vectors / a->wall, a->wall,
           b->vectors / b->wall, b->wall, b->wall / a->wall, r->rows_same, r->rows,
           r->rows ? 100.0 * r->rows_same / r->rows : 0.0);
}

static void print_rounds(const struct fk_bench_replay_cfg *c,
                         const struct fk_bench_replay_result *r)
{
    int R = r->rounds;
    printf("%s, first %d layer(s), no attention, %d interleaved round(s) (median; each "
           "round):\n  1 thread %.0f vec/s, 2 threads %.0f vec/s: %.2fx (", r->ref_codec,
           c->scale_layers, R, fk_bench_median(r->vps1, R), fk_bench_median(r->vps2, R),
           fk_bench_median(r->scale, R));
    print_list(r->scale, R, "%.2f");
    printf("); supports hash %016llx at 2 threads\n", (unsigned long long)r->supports_hash2);
    const struct fk_bench_timing *t = &r->last1;
    double rest = t->wall - t->gram - t->corr - t->code - t->io - t->metrics;
    printf("  1 thread, last round: %.2f s = Gram %.2f + correlation SGEMMs %.2f + greedy "
           "loops %.2f + trace I/O %.2f + metrics %.2f + rest %.2f (%.1f us per vector "
           "outside the kernel's two parts)\n", t->wall, t->gram, t->corr, t->code, t->io,
           t->metrics, rest, 1e6 * (t->wall - t->corr - t->code) / t->vectors);
    for (int k = 0; k < 2 && r->kernel_done; k++) {
        if (k == 0)
            printf("  OMP kernel benchmark (N %d, m %d, s %d, 1 thread), synthetic data: ",
                   r->kernel_cfg.n_atoms, r->kernel_cfg.dim, r->kernel_cfg.sparsity);
        else
            printf("  OMP kernel benchmark on the trace's layer 0 keys (%d decode vectors) "
                   "with their dictionary: ", r->kernel_trace_signals);
        printf("%.0f vec/s; %s replay at 1 thread = %.0f%% of it (",
               fk_bench_median(r->kernel_vps[k], R), r->ref_codec,
               100 * fk_bench_median(r->kernel_ratio[k], R));
        for (int i = 0; i < R; i++)
            printf("%s%.0f%%", i ? ", " : "", 100 * r->kernel_ratio[k][i]);
        printf(")\n");
    }
}

/* The headline figures after the cells (cells' vec/s are added as they end). */
static void end_figs(const struct fk_bench_replay_cfg *c, const struct fk_bench_replay_result *r,
                     struct fk_cli_figs *f)
{
    if (r->cells_rss_kib)
        add_fig(f, "whole config wall s", "%.9g", r->total_wall);
    if (r->ref_done) {
        add_fig(f, "optimised vec/s", "%.9g", r->opt.vectors / r->opt.wall);
        add_fig(f, "optimised / reference", "%.9g", r->ref.wall / r->opt.wall);
    }
    if (r->rounds) {
        add_fig(f, "1 thread vec/s", "%.9g", fk_bench_median(r->vps1, r->rounds));
        add_fig(f, "2 threads / 1", "%.9g", fk_bench_median(r->scale, r->rounds));
    }
    for (int k = 0; k < 2 && r->kernel_done && r->rounds; k++) {
        add_fig(f, k ? "OMP kernel (trace) vec/s" : "OMP kernel vec/s", "%.9g",
                fk_bench_median(r->kernel_vps[k], r->rounds));
        add_fig(f, k ? "replay / kernel (trace)" : "replay / kernel", "%.9g",
                fk_bench_median(r->kernel_ratio[k], r->rounds));
    }
    (void)c;
}

int fk_cli_bench_replay(int argc, char **argv)
{
    struct fk_bench_replay_cfg cfg;
    const char *kernels;
    int tsv;
    int u = parse(argc, argv, &cfg, &kernels, &tsv);
    if (u)
        return u == 1 ? 0 : u;
    struct printer *p = calloc(1, sizeof *p);
    struct fk_bench_replay_result *r = calloc(1, sizeof *r);
    if (!p || !r) {
        free(p);
        free(r);
        fprintf(stderr, "fadkv-bench bench replay: out of memory\n");
        return 1;
    }
    p->config = cfg.config;
    p->tsv = tsv;
    struct fk_bench_replay_hooks h = {.ctx = p, .info = on_info, .cell = on_cell};
    int rc = fk_bench_replay_run(&cfg, &h, r);
    if (rc == FK_OK)
        end_figs(&cfg, r, &p->figs);
    if (rc == FK_OK && tsv) {
        if (r->cells_rss_kib)
            coding_figs(p);
        if (r->coding_rounds)
            round_figs(p, r);
        for (int i = 0; i < p->figs.n; i++)
            printf("%s\t%s\n", p->figs.name[i], p->figs.value[i]);
        free(p);
        free(r);
        return 0;
    }
    if (r->cells_rss_kib && r->ov_without > 0)
        printf("attention fidelity (stride %d), each cell replayed again without it right "
               "after:\n%s  all cells  %6.1f s with, %6.1f s without: %+5.1f%%\n", p->stride,
               p->ov_lines, r->ov_with, r->ov_without,
               100.0 * (r->ov_with - r->ov_without) / r->ov_without);
    if (r->cells_rss_kib) {
        printf("whole config: %.1f s wall; peak resident memory %.0f MiB\n", r->total_wall,
               r->cells_rss_kib / 1024.0);
        coding_figs(p);
    }
    if (r->coding_rounds && rc == FK_OK)
        round_figs(p, r);
    if (r->ref_done)
        print_reference(&cfg, r);
    if (r->rounds && rc == FK_OK)
        print_rounds(&cfg, r);
    if (rc == FK_OK)
        printf("peak resident memory of the whole benchmark: %.0f MiB\nSIMD path: %s\n",
               r->peak_rss_kib / 1024.0, fk_simd_build());
    if (rc == FK_OK && fk_cli_kernels_wanted(kernels)) {
        printf("\n");
        fk_cli_kernels_compare(kernels, argc, argv, &p->figs, NULL);
    } else if (rc == FK_OK) {
        printf("OpenBLAS kernel set: %s (%s)%s\n", fk_cli_fig(&p->figs, "kernels"),
               fk_cli_kernels_origin(),
               !strcmp(kernels, "best") ? ": the CPU's best that this OpenBLAS has" : "");
    }
    if (rc != FK_OK)
        fprintf(stderr, "fadkv-bench bench replay: %s\n", fk_errmsg());
    free(p);
    free(r);
    return rc == FK_OK ? 0 : 1;
}
