/* SPDX-License-Identifier: MIT
 * `fadkv-bench bench replay`: the replay benchmark at paper scale (CLI layer).
 *
 * In one run, on the same data: every cell of the config (default configs/bench-3b.toml)
 * timed end to end with its time breakdown and the process's peak resident memory; lexico
 * on a subset of layers in the optimised path and in the reference mode (naive OMP
 * recomputing D^T r, no Gram, one vector at a time) with their stored supports compared;
 * lexico at 1 and 2 worker threads; and the OMP kernel benchmark at the same N, m, s, so
 * every target is a ratio measured here.
 */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "common/fk_clock.h"
#include "bench/fk_bench.h"
#include "core/fk_codec.h"
#include "formats/fk_dict.h"
#include "common/fk_err.h"
#include "engine/fk_replay.h"
#include "store/fk_results.h"
#include "engine/fk_sweep.h"
#include "formats/fk_trace.h"

/* Codec that cells.csv's cost columns are relative to (as in fk_cli.c, until the sweep
 * has a cost_baseline key). */
#define FK_COST_BASELINE "lexico-adp"

int fk_cli_bench_replay(int argc, char **argv);

/* Kernel-benchmark data from a trace: layer 0's K dictionary (copied) and the K rows of the
 * decode tokens as float32, ordered (token, head) as the replay codes them. */
static int kernel_trace_data(struct fk_trace *t, const struct fk_dict *dict,
                             struct fk_bench_omp_data *out)
{
    memset(out, 0, sizeof *out);
    const struct fk_trace_info *in = fk_trace_get_info(t);
    int H = in->n_kv_heads, T = in->n_tokens, P = in->prompt_len, m = in->head_dim;
    struct fk_base_dict b;
    fk_dict_base(dict, 0, 0, &b);
    size_t nkv = (size_t)H * T * m;
    float *kv = malloc(sizeof(float) * nkv);
    out->n_atoms = b.n_atoms;
    out->dim = m;
    out->n_signals = H * (T - P);
    out->atoms = malloc(sizeof(float) * (size_t)b.n_atoms * m);
    out->signals = malloc(sizeof(float) * (size_t)out->n_signals * m + 1);
    int rc = kv && out->atoms && out->signals && out->n_signals > 0
                 ? FK_OK
                 : fk_err(FK_ENOMEM, "bench replay: kernel data: out of memory (or no decode)");
    if (rc == FK_OK)
        rc = fk_trace_read(t, 0, FK_KIND_K, kv);
    if (rc == FK_OK) {
        memcpy(out->atoms, b.atoms, sizeof(float) * (size_t)b.n_atoms * m);
        size_t i = 0;
        for (int tk = P; tk < T; tk++)
            for (int h = 0; h < H; h++, i++)
                memcpy(out->signals + i * m, kv + ((size_t)h * T + tk) * m, sizeof(float) * m);
    }
    free(kv);
    if (rc != FK_OK)
        fk_bench_omp_data_clear(out);
    return rc;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(const double *v, int n)
{
    double t[16];
    memcpy(t, v, sizeof(double) * (size_t)n);
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

static void print_list(const double *v, int n, const char *fmt)
{
    for (int i = 0; i < n; i++) {
        if (i)
            printf(", ");
        printf(fmt, v[i]);
    }
}

static long peak_rss_kib(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

struct timing {
    double wall, io, corr, code, adapt, attn, metrics, gram, write;
    long vectors;
};

static void sum_streams(const struct fk_cell_result *r, struct timing *t)
{
    t->io += r->t_io;
    t->attn += r->t_attn;
    t->metrics += r->t_metrics;
    t->gram += r->t_gram;
    t->vectors += r->vectors;
    for (size_t i = 0; i < (size_t)r->n_traces * r->n_layers * 2; i++) {
        t->corr += r->streams[i].st.t_corr;
        t->code += r->streams[i].st.t_code;
        t->adapt += r->streams[i].st.t_adapt;
    }
}

static uint64_t supports_hash(const struct fk_cell_result *r, const uint8_t *layers)
{
    uint64_t h = 1469598103934665603ULL;
    for (int t = 0; t < r->n_traces; t++)
        for (int l = 0; l < r->n_layers; l++)
            for (int k = 0; k < 2 && (!layers || layers[l]); k++) {
                h ^= fk_cell_stream((struct fk_cell_result *)r, t, l, k)->support_hash;
                h *= 1099511628211ULL;
            }
    return h;
}

/* Rows whose stored supports are identical in a and b (same cell on the same data). */
static void rows_agree(const struct fk_cell_result *a, const struct fk_cell_result *b,
                       long *same, long *total)
{
    *same = *total = 0;
    for (size_t i = 0; i < (size_t)a->n_traces * a->n_layers * 2; i++) {
        const struct fk_stream_result *x = &a->streams[i], *y = &b->streams[i];
        for (long r = 0; r < x->n_row_hash && r < y->n_row_hash; r++)
            *same += x->row_hash[r] == y->row_hash[r];
        *total += x->n_row_hash;
    }
}

static int run(const struct fk_cell_input *in, int jobs, int attention, int stride,
               int reference, const uint8_t *layers, struct fk_replay_pool *pool,
               struct fk_cell_result *res, struct timing *t)
{
    struct fk_replay_opts ro = {.jobs = jobs, .attention = attention, .attn_stride = stride,
                                .recall = 0, .recall_every = 8, .reference = reference,
                                .layers = layers, .row_hashes = layers != NULL, .pool = pool};
    double t0 = fk_wall_s();
    int rc = fk_replay_cell(in, &ro, res);
    if (t)
        t->wall += fk_wall_s() - t0;
    if (rc == FK_OK && t)
        sum_streams(res, t);
    return rc;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: fadkv-bench bench replay [--config FILE] [--jobs N] [--ref-layers K]\n"
               "       [--scale-layers K] [--no-kernel] [--no-attention] [--overhead]\n"
               "       [--only CODEC] [--rounds R]\n"
               "Runs every cell of FILE (default configs/bench-3b.toml) and prints vectors/s,\n"
               "a time breakdown and peak memory; then lexico optimised vs reference mode on\n"
               "the first K layers (default 2); then R interleaved rounds (default 3, at most\n"
               "15) of lexico at 1 and 2 threads on the first K layers (default 8) and the OMP\n"
               "kernel benchmark at the same N, m, s (synthetic data and the trace's own\n"
               "layer 0 keys), with the median of each round's ratios.\n"
               "--overhead also replays each cell without attention right after it and prints\n"
               "the extra time of attention fidelity, per cell and in total.\n");
}

int fk_cli_bench_replay(int argc, char **argv)
{
    const char *config = "configs/bench-3b.toml", *only = NULL;
    int jobs = 0, ref_layers = 2, scale_layers = 8, kernel = 1, no_attn = 0, overhead = 0;
    int rounds = 3;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--config") && v) {
            config = v;
            i++;
        } else if (!strcmp(a, "--jobs") && v) {
            jobs = atoi(v);
            i++;
        } else if (!strcmp(a, "--ref-layers") && v) {
            ref_layers = atoi(v);
            i++;
        } else if (!strcmp(a, "--scale-layers") && v) {
            scale_layers = atoi(v);
            i++;
        } else if (!strcmp(a, "--rounds") && v) {
            rounds = atoi(v);
            i++;
        } else if (!strcmp(a, "--only") && v) {
            only = v;
            i++;
        } else if (!strcmp(a, "--no-kernel")) {
            kernel = 0;
        } else if (!strcmp(a, "--no-attention")) {
            no_attn = 1;
        } else if (!strcmp(a, "--overhead")) {
            overhead = 1;
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
    }
    struct fk_sweep *s = NULL;
    const char *no_attn_set[1] = {"sweep.attention=false"}; /* cell ids include it */
    if (fk_sweep_load(config, no_attn_set, no_attn, 1, &s) < 0) {
        fprintf(stderr, "fadkv-bench bench replay: %s\n", fk_errmsg());
        return 1;
    }
    if (jobs > 0)
        s->jobs = jobs;
    struct fk_dataset *ds = &s->datasets[0];
    struct fk_trace **tr = calloc((size_t)ds->n_traces, sizeof *tr);
    struct fk_dict *dict = NULL;
    int rc = tr ? FK_OK : fk_err(FK_ENOMEM, "out of memory");
    for (int i = 0; rc == FK_OK && i < ds->n_traces; i++)
        rc = fk_trace_open(ds->traces[i], &tr[i]);
    if (rc == FK_OK && ds->dict)
        rc = fk_dict_load(ds->dict, &dict);
    if (rc == FK_OK)
        rc = fk_results_prepare(s->output);
    struct fk_replay_pool *pool = NULL; /* Gram buffers from run to run, as in a sweep */
    if (rc == FK_OK)
        rc = fk_replay_pool_new(&pool);
    if (rc < 0) {
        fprintf(stderr, "fadkv-bench bench replay: %s\n", fk_errmsg());
        fk_sweep_free(&s);
        return 1;
    }
    const struct fk_trace_info *ti = fk_trace_get_info(tr[0]);
    printf("bench replay: %s: %d trace(s), %d layers, %d/%d heads, head_dim %d, %d tokens "
           "(%d prefill), N = %d, %d job(s), attention %s (stride %d), OpenBLAS %s kernels\n",
           config, ds->n_traces, ti->n_layers, ti->n_q_heads, ti->n_kv_heads, ti->head_dim,
           ti->n_tokens, ti->prompt_len, dict ? dict->n_atoms : 0, s->jobs,
           s->attention ? "on" : "off", s->attn_stride, openblas_get_corename());
    printf("\n%-11s %8s %9s %7s | %6s %6s %6s %6s %6s %6s %6s %6s  (CPU s, summed over threads)\n",
           "codec", "wall s", "vectors", "vec/s", "io", "gram", "corr", "code", "adapt", "attn",
           "metric", "write");
    double total_wall = 0, ov_with = 0, ov_without = 0;
    char ov_lines[4096] = "";
    size_t ov_len = 0;
    const char **ids = calloc((size_t)s->n_cells + 1, sizeof(char *));
    int n_ids = 0;
    for (int c = 0; c < s->n_cells && rc == FK_OK; c++) {
        struct fk_sweep_cell *cell = &s->cells[c];
        if (only && strcmp(cell->ops->name, only))
            continue;
        struct fk_cell_input in = {.ops = cell->ops, .opts = cell->opts, .traces = tr,
                                   .n_traces = ds->n_traces,
                                   .dict = (cell->ops->caps & FK_CAP_DICT) ? dict : NULL};
        struct fk_cell_result res;
        struct timing t = {0};
        rc = run(&in, s->jobs, s->attention, s->attn_stride, 0, NULL, pool, &res, &t);
        if (rc < 0)
            break;
        double w0 = fk_wall_s();
        struct fk_cell_meta meta = {.ops = cell->ops, .opts = cell->opts, .dataset = ds->name,
                                    .traces = (const char *const *)ds->traces,
                                    .n_traces = ds->n_traces, .dict = ds->dict,
                                    .attn_stride = s->attention ? s->attn_stride : 0};
        memcpy(meta.id, cell->id, sizeof meta.id);
        rc = fk_results_commit(s->output, &meta, &res);
        ids[n_ids++] = cell->id;
        t.write = fk_wall_s() - w0;
        t.wall += t.write;
        total_wall += t.wall;
        printf("%-11s %8.1f %9ld %7.0f | %6.1f %6.1f %6.1f %6.1f %6.1f %6.1f %6.1f %6.2f\n",
               cell->ops->name, t.wall, t.vectors, t.vectors / t.wall, t.io, t.gram, t.corr,
               t.code, t.adapt, t.attn, t.metrics, t.write);
        fflush(stdout);
        fk_cell_result_free(&res);
        if (overhead && s->attention && rc == FK_OK) {
            /* the same cell without attention, right away: both halves of the ratio see
             * the machine in the same state */
            struct timing t0 = {0};
            rc = run(&in, s->jobs, 0, s->attn_stride, 0, NULL, pool, &res, &t0);
            if (rc < 0)
                break;
            fk_cell_result_free(&res);
            double with = t.wall - t.write;
            ov_with += with;
            ov_without += t0.wall;
            if (ov_len < sizeof ov_lines)
                ov_len += (size_t)snprintf(ov_lines + ov_len, sizeof ov_lines - ov_len,
                                           "  %-11s %6.1f s with, %6.1f s without: %+5.1f%%\n",
                                           cell->ops->name, with, t0.wall,
                                           100.0 * (with - t0.wall) / t0.wall);
        }
    }
    if (rc == FK_OK && ov_without > 0)
        printf("attention fidelity (stride %d), each cell replayed again without it right "
               "after:\n%s  all cells  %6.1f s with, %6.1f s without: %+5.1f%%\n",
               s->attn_stride, ov_lines, ov_with, ov_without,
               100.0 * (ov_with - ov_without) / ov_without);
    if (rc == FK_OK)
        rc = fk_results_tables(s->output, ids, n_ids, FK_COST_BASELINE);
    free(ids);
    long rss = peak_rss_kib();
    if (rc == FK_OK)
        printf("whole config: %.1f s wall; peak resident memory %.0f MiB\n", total_wall,
               rss / 1024.0);

    /* lexico: optimised vs reference on the first ref_layers layers, then 1 vs 2 threads */
    const struct fk_codec_ops *lx = fk_codec_find("lexico");
    void *lo = calloc(1, lx->opts_size);
    struct fk_sweep_cell *lcell = NULL;
    for (int c = 0; c < s->n_cells; c++)
        if (s->cells[c].ops == lx)
            lcell = &s->cells[c];
    if (lo)
        memcpy(lo, lcell ? lcell->opts : lo, lcell ? lx->opts_size : 0);
    if (lo && !lcell)
        fk_opts_defaults(lx, lo);
    uint8_t *mask = calloc((size_t)ti->n_layers, 1);
    if (rc == FK_OK && lo && mask && dict && ref_layers > 0) {
        for (int l = 0; l < ti->n_layers && l < ref_layers; l++)
            mask[l] = 1;
        struct fk_cell_input in = {.ops = lx, .opts = lo, .traces = tr,
                                   .n_traces = ds->n_traces, .dict = dict};
        struct fk_cell_result a, b;
        struct timing ta = {0}, tb = {0};
        /* untimed: both worker slots of the pool hold their Gram buffers before any timed
         * run, so no run below pays first-touch page faults the other does not */
        rc = run(&in, 2, 0, 16, 0, mask, pool, &a, NULL);
        if (rc == FK_OK) {
            fk_cell_result_free(&a);
            rc = run(&in, 1, 0, 16, 0, mask, pool, &a, &ta);
        }
        if (rc == FK_OK) {
            rc = run(&in, 1, 0, 16, 1, mask, pool, &b, &tb);
            if (rc < 0)
                fk_cell_result_free(&a);
        }
        if (rc == FK_OK) {
            long same = 0, rows = 0;
            rows_agree(&a, &b, &same, &rows);
            printf("\nlexico, first %d layer(s), 1 thread, no attention: optimised %.0f vec/s "
                   "(%.2f s), reference %.0f vec/s (%.2f s): speed-up %.1fx; stored supports "
                   "identical on %ld of %ld rows (%.4f%%)\n", ref_layers, ta.vectors / ta.wall,
                   ta.wall, tb.vectors / tb.wall, tb.wall, tb.wall / ta.wall, same, rows,
                   rows ? 100.0 * same / rows : 0.0);
            fk_cell_result_free(&a);
            fk_cell_result_free(&b);
        }
        memset(mask, 0, (size_t)ti->n_layers);
        for (int l = 0; l < ti->n_layers && l < scale_layers; l++)
            mask[l] = 1;
        /* Interleaved rounds (1 thread, 2 threads, kernel on synthetic data, kernel on the
         * trace's data): each ratio is taken within a round, from measurements seconds
         * apart, and the median over rounds is reported; on a shared VM one measurement
         * of each side minutes apart can be off by 20%. */
        struct fk_bench_omp_cfg kc;
        fk_bench_omp_defaults(&kc);
        kc.n_atoms = dict->n_atoms;
        kc.dim = dict->head_dim;
        kc.sparsity = (int)fk_opts_get(lo, fk_codec_option(lx, "s"));
        kc.threads = 1;
        kc.repeats = 3;
        kc.naive_signals = 0;
        struct fk_bench_omp_data kd[2];
        memset(kd, 0, sizeof kd);
        if (rc == FK_OK && kernel)
            rc = fk_bench_omp_data_make(&kc, &kd[0]);
        /* layer 0's K dictionary and the K rows of its decode tokens, in replay order */
        if (rc == FK_OK && kernel)
            rc = kernel_trace_data(tr[0], dict, &kd[1]);
        enum { MAXR = 15 };
        double v1[MAXR], v2[MAXR], sc[MAXR], kv[2][MAXR], kr_[2][MAXR];
        int R = rounds < 1 ? 1 : rounds > MAXR ? MAXR : rounds;
        uint64_t h2 = 0;
        struct timing t1 = {0};
        for (int r = 0; r < R && rc == FK_OK; r++) {
            struct timing t2 = {0};
            t1 = (struct timing){0};
            rc = run(&in, 1, 0, 16, 0, mask, pool, &a, &t1);
            if (rc == FK_OK) {
                fk_cell_result_free(&a);
                rc = run(&in, 2, 0, 16, 0, mask, pool, &a, &t2);
            }
            if (rc < 0)
                break;
            h2 = supports_hash(&a, mask);
            fk_cell_result_free(&a);
            v1[r] = t1.vectors / t1.wall;
            v2[r] = t2.vectors / t2.wall;
            sc[r] = t1.wall / t2.wall;
            for (int k = 0; k < 2 && kernel && rc == FK_OK; k++) {
                struct fk_bench_omp_result kres;
                rc = fk_bench_omp_run(&kc, &kd[k], &kres, NULL);
                kv[k][r] = kres.e2e_vps;
                kr_[k][r] = v1[r] / kres.e2e_vps;
            }
        }
        if (rc == FK_OK) {
            printf("lexico, first %d layer(s), no attention, %d interleaved round(s) (median; "
                   "each round):\n  1 thread %.0f vec/s, 2 threads %.0f vec/s: %.2fx (", scale_layers,
                   R, median(v1, R), median(v2, R), median(sc, R));
            print_list(sc, R, "%.2f");
            printf("); supports hash %016llx at 2 threads\n", (unsigned long long)h2);
            double rest = t1.wall - t1.gram - t1.corr - t1.code - t1.io - t1.metrics;
            printf("  1 thread, last round: %.2f s = Gram %.2f + correlation SGEMMs %.2f + greedy "
                   "loops %.2f + trace I/O %.2f + metrics %.2f + rest %.2f (%.1f us per vector "
                   "outside the kernel's two parts)\n", t1.wall, t1.gram, t1.corr, t1.code, t1.io,
                   t1.metrics, rest, 1e6 * (t1.wall - t1.corr - t1.code) / t1.vectors);
            for (int k = 0; k < 2 && kernel; k++) {
                if (k == 0)
                    printf("  OMP kernel benchmark (N %d, m %d, s %d, 1 thread), synthetic data: ",
                           kc.n_atoms, kc.dim, kc.sparsity);
                else
                    printf("  OMP kernel benchmark on the trace's layer 0 keys (%d decode vectors) "
                           "with their dictionary: ", kd[1].n_signals);
                printf("%.0f vec/s; lexico replay at 1 thread = %.0f%% of it (", median(kv[k], R),
                       100 * median(kr_[k], R));
                for (int r = 0; r < R; r++)
                    printf("%s%.0f%%", r ? ", " : "", 100 * kr_[k][r]);
                printf(")\n");
            }
        }
        fk_bench_omp_data_clear(&kd[0]);
        fk_bench_omp_data_clear(&kd[1]);
    }
    free(mask);
    free(lo);
    fk_replay_pool_free(&pool);
    for (int i = 0; i < ds->n_traces; i++)
        fk_trace_close(&tr[i]);
    free(tr);
    fk_dict_free(&dict);
    fk_sweep_free(&s);
    if (rc < 0) {
        fprintf(stderr, "fadkv-bench bench replay: %s\n", fk_errmsg());
        return 1;
    }
    printf("peak resident memory of the whole benchmark: %.0f MiB\n", peak_rss_kib() / 1024.0);
    return 0;
}
