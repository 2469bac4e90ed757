/* SPDX-License-Identifier: MIT
 * `fadkv-bench bench omp`: the OMP kernel benchmark's command line (CLI layer: parses its
 * own options, prints a table). argv[0] is "omp".
 */
#include "bench/fk_bench.h"
#include "cli/fk_cli.h"
#include "common/fk_err.h"
#include "kernels/fk_blas.h"
#include "kernels/fk_simd.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: fadkv-bench bench omp [--atoms N] [--dim m] [--sparsity s] [--signals n]\n"
            "       [--threads t] [--repeats r] [--block b] [--naive n] [--noise sigma]\n"
            "       [--seed x] [--dump FILE.h5] [--input FILE.h5] [--codes-out FILE.h5]\n"
            "       [--pool n] [--kernels best|NAME|same|none] [--tsv]\n"
            "  Times Batch-OMP (Gram mode, progressive update) end to end (block SGEMM +\n"
            "  greedy loops) against the correlation SGEMM alone, median of repeats.\n"
            "  --dump writes the synthetic dictionary and signals and stops; --input codes\n"
            "  the /dict and /signals of a file; --codes-out writes the codes.\n"
            "  --pool n (default N/16; 0 = skip): then times the screening coders gm (Top-n\n"
            "  pool, greedy OMP in it, ridge) and pl (Top-s, ridge) next to Batch-OMP on the\n"
            "  same data, one thread, each block one SGEMM, coded as the codecs code them\n"
            "  (four vectors at a time); ratios taken within each round, and each stage's\n"
            "  wall time per vector (correlations, Top-n, greedy loop, refinement).\n"
            "  --kernels (default best): the figures again in a column of their own from a\n"
            "  child process with other OpenBLAS kernels: best = OPENBLAS_CORETYPE unset (the\n"
            "  set OpenBLAS picks for this CPU; skipped when this run has it already), NAME =\n"
            "  OPENBLAS_CORETYPE=NAME (e.g. Haswell), same = this environment, none = no child.\n"
            "  --tsv prints the figures as NAME<TAB>VALUE lines instead of the table.\n");
}

static int parse_long(const char *opt, const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "fadkv-bench bench omp: %s: expected an integer in %ld..%ld, got '%s'\n",
                opt, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

struct omp_args {
    struct fk_bench_omp_cfg cfg;
    int pool; /* -1: N / 16 */
    const char *dump, *input, *codes_out;
    const char *kernels; /* --kernels mode (fk_cli.h) */
    int tsv;
};

/* One option and its value: 0 taken, 2 usage error (printed). */
static int parse_one(struct omp_args *a, const char *o, const char *v)
{
    struct fk_bench_omp_cfg *c = &a->cfg;
    long seed = 0;
    const struct { const char *name; long lo, hi; int *to; long *to_l; } ints[] = {
        {"--atoms", 1, 1 << 20, &c->n_atoms, NULL}, {"--dim", 1, 65536, &c->dim, NULL},
        {"--sparsity", 1, FK_SMAX, &c->sparsity, NULL},
        {"--signals", 1, 1 << 26, &c->n_signals, NULL},
        {"--threads", 1, FK_BENCH_MAX_THREADS, &c->threads, NULL},
        {"--repeats", 1, 1000, &c->repeats, NULL}, {"--block", 1, 1 << 20, &c->block, NULL},
        {"--naive", 0, 1 << 26, &c->naive_signals, NULL}, {"--pool", 0, 1 << 20, &a->pool, NULL},
        {"--seed", 0, 0x7FFFFFFF, NULL, &seed}, {NULL, 0, 0, NULL, NULL}};
    for (int k = 0; ints[k].name; k++) {
        if (strcmp(o, ints[k].name))
            continue;
        long x;
        if (parse_long(o, v, ints[k].lo, ints[k].hi, &x))
            return 2;
        if (ints[k].to)
            *ints[k].to = (int)x;
        else
            c->seed = (uint64_t)x;
        return 0;
    }
    const char **path = !strcmp(o, "--dump")        ? &a->dump
                        : !strcmp(o, "--input")     ? &a->input
                        : !strcmp(o, "--codes-out") ? &a->codes_out
                                                    : NULL;
    if (path) {
        *path = v;
        return 0;
    }
    if (!strcmp(o, "--kernels")) {
        if (fk_cli_kernels_mode(v, &a->kernels) == 0)
            return 0;
        fprintf(stderr, "fadkv-bench bench omp: --kernels: expected best, none, same or an "
                        "OpenBLAS core name (letters and digits, e.g. Haswell), got '%s'\n", v);
        return 2;
    }
    if (!strcmp(o, "--noise")) {
        char *end;
        c->noise = strtod(v, &end);
        if (end == v || *end || !(c->noise >= 0)) {
            fprintf(stderr, "fadkv-bench bench omp: --noise: expected a number >= 0, "
                            "got '%s'\n", v);
            return 2;
        }
        return 0;
    }
    fprintf(stderr, "fadkv-bench bench omp: unknown option '%s'\n", o);
    usage(stderr);
    return 2;
}

/* Returns -1 to go on, else the exit status (help, usage error). */
static int parse(int argc, char **argv, struct omp_args *a)
{
    *a = (struct omp_args){0};
    a->pool = -1;
    a->kernels = "best";
    fk_bench_omp_defaults(&a->cfg);
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(o, "--tsv")) {
            a->tsv = 1;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "fadkv-bench bench omp: unknown option or missing value: '%s'\n", o);
            usage(stderr);
            return 2;
        }
        int rc = parse_one(a, o, argv[++i]);
        if (rc)
            return rc;
    }
    return -1;
}

static int dump_data(const struct omp_args *a, struct fk_bench_omp_data *data)
{
    int rc = fk_bench_omp_data_write(a->dump, data, &a->cfg);
    if (rc == FK_OK)
        printf("wrote %s: dict (%d, %d), signals (%d, %d), sparsity %d, seed %" PRIu64 "\n",
               a->dump, data->n_atoms, data->dim, data->n_signals, data->dim, a->cfg.sparsity,
               a->cfg.seed);
    else
        fprintf(stderr, "fadkv-bench bench omp: %s\n", fk_errmsg());
    fk_bench_omp_data_clear(data);
    return rc == FK_OK ? 0 : 1;
}

static void print_result(const struct omp_args *a, const struct fk_bench_omp_data *data,
                         const struct fk_bench_omp_result *rp)
{
    const struct fk_bench_omp_cfg cfg = a->cfg;
    const struct fk_bench_omp_result res = *rp;
    const char *input = a->input, *codes_out = a->codes_out;
    int N = data->n_atoms, m = data->dim, s = cfg.sparsity;
    printf("bench omp: N=%d m=%d s=%d signals=%d threads=%d repeats=%d block=%d (%s)\n", N, m,
           s, data->n_signals, cfg.threads, cfg.repeats, cfg.block < data->n_signals ? cfg.block
           : data->n_signals, input ? input : "synthetic");
    printf("  precision: f32 data, Gram and correlations; f64 Cholesky, coefficients, "
           "energies\n");
    printf("  %-34s %12s %12s %12s %10s\n", "step", "median s", "min s", "vectors/s",
           "GFLOP/s");
    printf("  %-34s %12.4f %12s %12s %10s\n", "Gram D^T D (ssyrk, once)", res.gram_s, "-", "-",
           "-");
    printf("  %-34s %12.4f %12.4f %12.0f %10.1f\n", "SGEMM floor (D^T X, blocks)",
           res.gemm_med_s, res.gemm_min_s, res.gemm_vps, res.gemm_vps * 2.0 * m * N * 1e-9);
    printf("  %-34s %12.4f %12.4f %12.0f %10.1f\n", "end to end (SGEMM + Batch-OMP)",
           res.e2e_med_s, res.e2e_min_s, res.e2e_vps, res.e2e_gflops);
    printf("  %-34s %12s %12s %12.0f %10s  (codes %s)\n", "  greedy one vector at a time", "-",
           "-", res.e2e1_vps, "-", res.one_identical ? "bit-identical" : "DIFFER");
    printf("  %-34s %12.3fx (%d vectors in flight, Gram rows prefetched)\n",
           "  batched greedy gain", res.e2e_vps / res.e2e1_vps, FK_OMP_LANES);
    printf("  %-34s %12.0f per core\n", "end to end", res.e2e_vps / cfg.threads);
    printf("  %-34s %12.3f (end to end / SGEMM floor)\n", "ratio to floor", res.floor_ratio);
    if (res.naive_n > 0) {
        printf("  %-34s %12s %12s %12.0f %10s  (1 thread, %d signals)\n",
               "naive OMP (D^T r every iteration)", "-", "-", res.naive_vps, "-", res.naive_n);
        printf("  %-34s %12.2fx\n", "Gram-mode speed-up over naive",
               res.e2e_vps / cfg.threads / res.naive_vps);
        printf("  %-34s %d / %d (%.4f%%)\n", "supports Gram == naive (as sets)", res.agree_n,
               res.naive_n, 100.0 * res.agree_n / res.naive_n);
    }
    printf("  mean atoms %.3f, mean relative error %.4f, premature %ld, dependent %ld, "
           "guarded %ld\n", res.mean_k, res.mean_rel_err, res.n_premature, res.n_dependent,
           res.n_guarded);
    printf("  codes hash %016" PRIx64 " (equal at any thread count)\n", res.codes_hash);
    if (codes_out)
        printf("  wrote codes to %s\n", codes_out);
}

/* The roofline of the greedy loop (fk_bench.h): counted, measured, the bound and where the
 * end to end stands against it. */
static void print_roofline(const struct fk_bench_roofline *rl,
                           const struct fk_bench_omp_result *res, int threads)
{
    double got = 1.0 / res->floor_ratio, t_e2e = threads / res->e2e_vps;
    printf("roofline of the greedy loop, per vector and core (counted: s - 1 correlation passes)\n");
    printf("  %-34s %12.0f multiply-adds, %.0f KiB from L2, %.0f KiB of Gram rows\n",
           "counted", rl->macs, rl->l2_bytes / 1024, rl->row_bytes / 1024);
    printf("  %-34s %12.1f GB/s over (s + 1) N floats, %.1f GB/s over random Gram rows\n",
           "measured read bandwidth", rl->l2_gbs, rl->row_gbs);
    printf("  %-34s %12.2f us (SGEMM floor) + max(%.2f us L2, %.2f us rows)\n", "bound",
           rl->t_floor * 1e6, rl->t_l2 * 1e6, rl->t_row * 1e6);
    printf("  %-34s %12.3f of the floor (%.3f with the two streams in turn)\n",
           "best reachable", rl->bound_ratio, rl->serial_ratio);
    printf("  %-34s %12.3f of the floor (%.2f us per vector): %.2f of the bound\n",
           "end to end", got, t_e2e * 1e6, got / rl->bound_ratio);
}

/* The figures both kernel columns show: name, label, printf format. */
static const struct fk_cli_fig_label figs[] = {
    {"gemm_vps", "SGEMM floor vectors/s", "%.0f"},
    {"e2e_vps", "end to end vectors/s", "%.0f"},
    {"e2e_per_core", "end to end per core", "%.0f"},
    {"floor_ratio", "end to end / SGEMM floor (time)", "%.3f"},
    {"e2e1_vps", "one vector at a time vectors/s", "%.0f"},
    {"naive_vps", "naive OMP vectors/s", "%.0f"},
    {"agree", "supports == naive (share)", "%.6f"},
    {"mean_rel_err", "mean relative error", "%.6f"},
    {"gm_vps", "gm vectors/s", "%.0f"},
    {"gm_rel", "gm time / omp", "%.3f"},
    {"pl_vps", "pl vectors/s", "%.0f"},
    {"pl_rel", "pl time / omp", "%.3f"},
    {NULL, NULL, NULL}};

/* This run's figures as text (a figure not measured is left out). */
static void own_figs(const struct fk_bench_omp_result *res, const struct fk_bench_omp_cfg *c,
                     const struct fk_bench_screen_result *sr, struct fk_cli_figs *f)
{
    const double v[] = {res->gemm_vps, res->e2e_vps, res->e2e_vps / c->threads,
                        res->floor_ratio, res->e2e1_vps,
                        res->naive_n > 0 ? res->naive_vps : -1,
                        res->naive_n > 0 ? (double)res->agree_n / res->naive_n : -1,
                        res->mean_rel_err, sr ? sr->gm_vps : -1, sr ? sr->gm_rel : -1,
                        sr ? sr->pl_vps : -1, sr ? sr->pl_rel : -1};
    memset(f, 0, sizeof *f);
    snprintf(f->name[f->n], sizeof f->name[0], "kernels");
    snprintf(f->value[f->n++], sizeof f->value[0], "%s", fk_blas_kernels());
    for (int i = 0; figs[i].name; i++) {
        if (v[i] < 0)
            continue;
        snprintf(f->name[f->n], sizeof f->name[0], "%s", figs[i].name);
        snprintf(f->value[f->n++], sizeof f->value[0], "%.9g", v[i]);
    }
    snprintf(f->name[f->n], sizeof f->name[0], "codes_hash");
    snprintf(f->value[f->n++], sizeof f->value[0], "%016" PRIx64, res->codes_hash);
}

int fk_cli_bench_omp(int argc, char **argv)
{
    struct omp_args a;
    int u = parse(argc, argv, &a);
    if (u >= 0)
        return u;
    struct fk_bench_omp_data data;
    int rc = a.input ? fk_bench_omp_data_read(a.input, &data)
                     : fk_bench_omp_data_make(&a.cfg, &data);
    if (rc != FK_OK) {
        fprintf(stderr, "fadkv-bench bench omp: %s\n", fk_errmsg());
        return 1;
    }
    if (a.dump)
        return dump_data(&a, &data);
    struct fk_code *codes = malloc((size_t)data.n_signals * sizeof *codes);
    struct fk_bench_omp_result res;
    rc = codes ? fk_bench_omp_run(&a.cfg, &data, &res, codes)
               : fk_err(FK_ENOMEM, "cannot allocate %d codes", data.n_signals);
    if (rc == FK_OK && a.codes_out)
        rc = fk_bench_omp_codes_write(a.codes_out, codes, data.n_signals, a.cfg.sparsity, &res,
                                      a.cfg.threads);
    if (rc == FK_OK && !a.tsv)
        print_result(&a, &data, &res);
    struct fk_bench_roofline rl;
    int have_rl = rc == FK_OK && !a.tsv && data.n_atoms % 64 == 0 && a.cfg.sparsity >= 2 &&
                  fk_bench_omp_roofline(data.n_atoms, a.cfg.sparsity,
                                        res.gemm_vps / a.cfg.threads, &rl) == FK_OK;
    if (have_rl)
        print_roofline(&rl, &res, a.cfg.threads);
    int pool = a.pool < 0 ? data.n_atoms / 16 : a.pool;
    if (pool > 0 && pool < a.cfg.sparsity)
        pool = a.cfg.sparsity;
    struct fk_bench_screen_result sr;
    if (rc == FK_OK && pool > 0)
        rc = fk_bench_screen_run(&a.cfg, &data, pool, &sr);
    if (rc == FK_OK && pool > 0 && !a.tsv) {
        printf("screening coders next to Batch-OMP: n=%d (pool), s=%d, 1 thread, block %d, "
               "ridge lambda0 1e-4 rho 0.2\n", sr.pool, a.cfg.sparsity,
               a.cfg.block < data.n_signals ? a.cfg.block : data.n_signals);
        printf("  %-34s %12s %12s\n", "coder (SGEMM + coder)", "vectors/s", "time / omp");
        printf("  %-34s %12.0f %12.3f\n", "omp (Batch-OMP, lexico)", sr.omp_vps, 1.0);
        printf("  %-34s %12.0f %12.3f  (rounds", "gm (Top-n, OMP in pool, ridge)", sr.gm_vps,
               sr.gm_rel);
        for (int r = 0; r < sr.rounds && r < 8; r++)
            printf(" %.3f", sr.gm_rel_r[r]);
        printf(")\n  %-34s %12.0f %12.3f  (rounds", "pl (Top-s, ridge)", sr.pl_vps, sr.pl_rel);
        for (int r = 0; r < sr.rounds && r < 8; r++)
            printf(" %.3f", sr.pl_rel_r[r]);
        printf(")\n  stages, wall us per vector (median of rounds): correlations, Top-n, greedy "
               "loop, refinement\n");
        static const char *const who[3] = {"omp", "gm", "pl"};
        for (int w = 0; w < 3; w++)
            printf("    %-4s %8.3f %8.3f %8.3f %8.3f\n", who[w], sr.stage_us[w][0],
                   sr.stage_us[w][1], sr.stage_us[w][2], sr.stage_us[w][3]);
        printf("  gm codes against the naive pool OMP (fk_omp_naive + fk_refine): the same "
               "support in %.2f%%, coefficients within %.2g\n", 100 * sr.gm_support_same,
               sr.gm_coef_diff);
    }
    struct fk_cli_figs own;
    if (rc == FK_OK)
        own_figs(&res, &a.cfg, pool > 0 ? &sr : NULL, &own);
    for (int i = 0; rc == FK_OK && a.tsv && i < own.n; i++)
        printf("%s\t%s\n", own.name[i], own.value[i]);
    if (rc == FK_OK && !a.tsv) /* which of our kernels' clones ran */
        printf("SIMD path: %s (meson -Dsimd=generic|avx2 builds the others)\n",
               fk_simd_build());
    if (rc == FK_OK && !a.tsv && fk_cli_kernels_wanted(a.kernels)) {
        fk_cli_kernels_compare(a.kernels, argc, argv, &own, figs);
    } else if (rc == FK_OK && !a.tsv) {
        printf("OpenBLAS kernel set: %s (%s)%s\n", fk_blas_kernels(),
               fk_cli_kernels_origin(),
               !strcmp(a.kernels, "best") ? ": the CPU's best that this OpenBLAS has" : "");
    }
    if (rc != FK_OK)
        fprintf(stderr, "fadkv-bench bench omp: %s\n", fk_errmsg());
    free(codes);
    fk_bench_omp_data_clear(&data);
    return rc == FK_OK ? 0 : 1;
}
