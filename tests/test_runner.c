/* SPDX-License-Identifier: MIT
 * The sweep runner (harness/runner/fk_runner.h) and the merge of shards
 * (harness/store/fk_merge.h), in-process: shards merged equal an unsharded run cell for
 * cell; resume skips finished cells, retries failed ones, and --force recomputes them; the
 * hooks see every cell;
 * a stop asked for before the first cell computes nothing; a dataset that cannot be read
 * fails the run before the results directory is touched.
 */
#include <check.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fk_check_main.h"
#include "common/fk_err.h"
#include "engine/fk_sweep.h"
#include "formats/fk_trace.h"
#include "runner/fk_runner.h"
#include "store/fk_merge.h"
#include "store/fk_results.h"

static char g_dir[64];
static char g_toml[256];

static void write_config(const char *path, const char *trace_glob)
{
    const char *src = getenv("FK_SRCDIR");
    ck_assert_msg(src, "FK_SRCDIR must name the source tree");
    FILE *f = fopen(path, "w");
    ck_assert(f);
    fprintf(f,
            "[sweep]\nname = \"runner\"\noutput = \"%s/unsharded\"\njobs = 2\n"
            "attention = true\nattn_stride = 8\nrecall = true\n"
            "[[dataset]]\nname = \"babyllama\"\ntraces = [\"%s/datasets/embedded/%s\"]\n"
            "dictionary = \"%s/datasets/dicts/babyllama-tok105.h5\"\n"
            "defaults = { s = 4, n = 32, n_b = 16 }\n"
            "[[codec]]\nname = \"full\"\n[[codec]]\nname = \"lexico\"\n"
            "[[codec]]\nname = \"gm\"\n[[codec]]\nname = \"fadkv\"\n"
            "grid = { tau_c = [0, 2] }\n",
            g_dir, src, trace_glob, src);
    fclose(f);
}

static void setup(void)
{
    strcpy(g_dir, "/tmp/fk-runner-XXXXXX");
    ck_assert(mkdtemp(g_dir));
    snprintf(g_toml, sizeof g_toml, "%s/sweep.toml", g_dir);
    write_config(g_toml, "babyllama-tok105-0*.h5");
    fk_hdf5_quiet();
}

static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    ck_assert_int_eq(system(cmd), 0);
}

/* The sweep with output DIR/out and an optional second --set. */
static struct fk_sweep *load_with(const char *out, const char *extra)
{
    char set[300];
    snprintf(set, sizeof set, "sweep.output=\"%s/%s\"", g_dir, out);
    const char *sets[2] = {set, extra};
    struct fk_sweep *s = NULL;
    ck_assert_msg(fk_sweep_load(g_toml, sets, extra ? 2 : 1, 1, &s) == FK_OK, "%s",
                  fk_errmsg());
    return s;
}

static struct fk_sweep *load(const char *out) { return load_with(out, NULL); }

struct seen {
    int start, cell_start, cell_end, failed, progress, todo;
    unsigned long long started, ended; /* bit i-1: index i seen (cells may run side by side) */
    int max_running, jobs;
};

static void h_start(void *ctx, const struct fk_sweep *s, int todo)
{
    struct seen *w = ctx;
    w->start++;
    w->todo = todo;
    w->jobs = s->jobs;
}

static void h_cell_start(void *ctx, const struct fk_sweep *s, const struct fk_sweep_cell *c,
                         int index, int todo)
{
    struct seen *w = ctx;
    (void)s, (void)c;
    ck_assert(index >= 1 && index <= todo && index <= 64);
    ck_assert_msg(!(w->started >> (index - 1) & 1), "index %d started twice", index);
    /* indices are given in start order: every lower one has started */
    ck_assert(w->started == (1ull << (index - 1)) - 1);
    w->started |= 1ull << (index - 1);
    ck_assert_int_eq(todo, w->todo);
    w->cell_start++;
}

static void h_progress(void *ctx, const struct fk_runner_progress *p)
{
    struct seen *w = ctx;
    ck_assert(p->units_done >= 1 && p->units_done <= p->units_total);
    ck_assert(p->vec_per_s > 0);
    ck_assert(p->index >= 1 && (w->started >> (p->index - 1) & 1));
    ck_assert(!(w->ended >> (p->index - 1) & 1));
    ck_assert(p->running >= 1 && p->running <= w->jobs);
    w->max_running = p->running > w->max_running ? p->running : w->max_running;
    /* cells side by side fit the memory budget (one over it runs alone) */
    ck_assert_msg(p->running == 1 || p->mem_in_flight <= p->mem_budget,
                  "%d cells in flight need %.0f bytes, over the budget of %.0f", p->running,
                  p->mem_in_flight, p->mem_budget);
    w->progress++;
}

static void h_cell_end(void *ctx, const struct fk_sweep *s, const struct fk_runner_cell_end *e)
{
    struct seen *w = ctx;
    (void)s;
    ck_assert(e->index >= 1 && (w->started >> (e->index - 1) & 1));
    ck_assert(!(w->ended >> (e->index - 1) & 1));
    w->ended |= 1ull << (e->index - 1);
    w->cell_end++;
    w->failed += e->failed;
    ck_assert(e->failed || (e->vectors > 0 && isfinite(e->rel_err)));
}

static struct fk_runner_summary run(struct fk_sweep *s, int force, int si, int sn,
                                    struct seen *w)
{
    struct fk_runner_opts o = {.force = force, .shard_i = si, .shard_n = sn};
    if (w)
        o.hooks = (struct fk_runner_hooks){.ctx = w, .start = h_start,
                                           .cell_start = h_cell_start,
                                           .progress = h_progress, .cell_end = h_cell_end};
    struct fk_runner_summary sum;
    ck_assert_msg(fk_runner_run(s, &o, &sum) == FK_OK, "%s", fk_errmsg());
    return sum;
}

/* cells.csv of dir, timing columns blanked, as one string. */
static char *table(const char *dir)
{
    static const char *const timing[] = {"wall_s", "cpu_us_per_vec", "cpu_time_rel", NULL};
    struct fk_store *st;
    ck_assert_msg(fk_store_open(dir, &st) == FK_OK, "%s", fk_errmsg());
    size_t cap = 1 << 20, len = 0;
    char *out = malloc(cap);
    ck_assert(out);
    for (int r = -1; r < st->cells.n_rows; r++)
        for (int c = 0; c < st->cells.n_cols; c++) {
            int t = 0;
            while (timing[t] && strcmp(timing[t], st->cells.head[c]))
                t++;
            const char *v = r < 0 ? st->cells.head[c] : timing[t] ? "" : st->cells.rows[r][c];
            len += (size_t)snprintf(out + len, cap - len, "%s%c", v,
                                    c + 1 < st->cells.n_cols ? ',' : '\n');
            ck_assert(len < cap);
        }
    fk_store_close(&st);
    return out;
}

START_TEST(shards_merge_to_unsharded)
{
    struct fk_sweep *s = load("unsharded");
    struct seen w = {0};
    struct fk_runner_summary a = run(s, 0, 0, 1, &w);
    ck_assert_int_eq(a.todo, s->n_cells);
    ck_assert_int_eq(a.done, s->n_cells);
    ck_assert_int_eq(a.failed + a.skipped + a.interrupted, 0);
    ck_assert_int_eq(w.start, 1);
    ck_assert_int_eq(w.cell_start, s->n_cells);
    ck_assert_int_eq(w.cell_end, s->n_cells);
    ck_assert(w.progress >= s->n_cells); /* at least one unit per cell */
    int n = s->n_cells;
    fk_sweep_free(&s);
    char shard[2][300];
    const char *shards[2] = {shard[0], shard[1]};
    int done = 0, of[64], in_shard[2] = {0, 0};
    double load_of[2] = {0, 0};
    ck_assert_int_le(n, 64);
    for (int i = 0; i < 2; i++) {
        char name[16];
        snprintf(name, sizeof name, "shard%d", i);
        snprintf(shard[i], sizeof shard[i], "%s/%s", g_dir, name);
        s = load(name);
        ck_assert_int_eq(fk_runner_shards(s, 2, of), FK_OK);
        for (int c = 0; i == 0 && c < n; c++) {
            in_shard[of[c]]++;
            load_of[of[c]] += fk_sweep_cell_macs(s, &s->cells[c], NULL);
        }
        struct fk_runner_summary b = run(s, 0, i, 2, NULL);
        ck_assert_int_eq(b.todo, in_shard[i]);
        done += b.done;
        fk_sweep_free(&s);
    }
    ck_assert_int_eq(done, n);
    ck_assert(in_shard[0] > 0 && in_shard[1] > 0);
    /* balanced by cost, not by count: neither shard carries twice the other's coding */
    ck_assert_msg(load_of[0] < 2 * load_of[1] && load_of[1] < 2 * load_of[0],
                  "shard loads %.3g and %.3g", load_of[0], load_of[1]);
    char out[300], ref[300];
    snprintf(out, sizeof out, "%s/merged", g_dir);
    snprintf(ref, sizeof ref, "%s/unsharded", g_dir);
    struct fk_merge_opts mo = {.out = out, .shards = shards, .n_shards = 2};
    struct fk_merge_result mr;
    ck_assert_msg(fk_merge(&mo, &mr) == FK_OK, "%s", fk_errmsg());
    ck_assert_int_eq(mr.copied, n);
    ck_assert_int_eq(mr.missing, 0);
    char *ta = table(ref), *tm = table(out);
    ck_assert_msg(!strcmp(ta, tm), "merged cells.csv differs from the unsharded one");
    free(ta);
    free(tm);
}
END_TEST

START_TEST(resume_and_force)
{
    struct fk_sweep *s = load("resume");
    struct fk_runner_summary a = run(s, 0, 0, 1, NULL);
    ck_assert_int_eq(a.done, s->n_cells);
    struct fk_runner_summary b = run(s, 0, 0, 1, NULL);
    ck_assert_int_eq(b.todo, 0);
    ck_assert_int_eq(b.done, 0);
    ck_assert_int_eq(b.skipped, s->n_cells);
    struct fk_runner_summary c = run(s, 1, 0, 1, NULL);
    ck_assert_int_eq(c.todo, s->n_cells);
    ck_assert_int_eq(c.done, s->n_cells);
    ck_assert_int_eq(c.skipped, 0);
    fk_sweep_free(&s);
}
END_TEST

/* A small trace (2 layers, d 8) whose layer 1 values hold a NaN: every cell on it passes
 * the checks before the run and fails at replay, when the layer is read. */
static void write_nan_trace(const char *path)
{
    enum { L = 2, H = 2, D = 8, T = 24, P = 8 };
    struct fk_trace_info ti = {.n_layers = L, .n_q_heads = H, .n_kv_heads = H, .head_dim = D,
                               .n_tokens = T, .prompt_len = P, .n_queries = T,
                               .keys_post_rope = 1, .rope_theta = 10000};
    strcpy(ti.model_id, "nan-test");
    strcpy(ti.source, "synthetic");
    int32_t pos[T];
    uint8_t ph[T];
    float x[H * T * D];
    for (int t = 0; t < T; t++)
        pos[t] = t, ph[t] = t >= P;
    struct fk_trace_writer *w;
    ck_assert_int_eq(fk_trace_create(path, &ti, FK_ENC_F32, &w), FK_OK);
    ck_assert_int_eq(fk_trace_write_tokens(w, pos, ph, NULL), FK_OK);
    for (int l = 0; l < L; l++)
        for (int k = 0; k < 2; k++) {
            for (int i = 0; i < H * T * D; i++)
                x[i] = (float)((i * 37 + l * 11 + k) % 17) / 17.0f - 0.5f;
            if (l == 1 && k == 1)
                x[5 * D + 3] = NAN;
            ck_assert_int_eq(fk_trace_write_layer(w, l, (enum fk_kind)k, x, NULL), FK_OK);
        }
    int32_t qidx[T];
    for (int t = 0; t < T; t++)
        qidx[t] = t;
    x[5 * D + 3] = 0.25f; /* the queries are finite */
    for (int l = 0; l < L; l++)
        ck_assert_int_eq(fk_trace_write_layer(w, l, FK_KIND_Q, x, qidx), FK_OK);
    ck_assert_int_eq(fk_trace_finish(&w), FK_OK);
}

/* A failed cell is not done: a rerun retries it, and only it; the cells that finished
 * stay finished. (The cell on a trace with a NaN fails at replay.) */
START_TEST(failed_cells_are_retried)
{
    char nan_path[128];
    snprintf(nan_path, sizeof nan_path, "%s/nan.h5", g_dir);
    write_nan_trace(nan_path);
    FILE *f = fopen(g_toml, "a");
    ck_assert(f);
    fprintf(f, "[[dataset]]\nname = \"broken\"\ntraces = [\"%s\"]\n"
               "[[exclude]]\ndataset = \"broken\"\ncodec = \"lexico\"\n"
               "[[exclude]]\ndataset = \"broken\"\ncodec = \"gm\"\n"
               "[[exclude]]\ndataset = \"broken\"\ncodec = \"fadkv\"\n", nan_path);
    fclose(f);
    struct fk_sweep *s = load("retry");
    int n = s->n_cells, bad = -1;
    for (int c = 0; c < n; c++)
        if (!strcmp(s->datasets[s->cells[c].dataset].name, "broken"))
            bad = c;
    ck_assert_int_ge(bad, 0);
    struct fk_runner_summary a = run(s, 0, 0, 1, NULL);
    ck_assert_int_eq(a.failed, 1);
    ck_assert_int_eq(a.done, n - 1);
    struct fk_runner_summary b = run(s, 0, 0, 1, NULL);
    ck_assert_int_eq(b.todo, 1);
    ck_assert_int_eq(b.failed, 1);
    ck_assert_int_eq(b.done, 0);
    ck_assert_int_eq(b.skipped, n - 1);
    ck_assert(!fk_results_done(s->output, s->cells[bad].id));
    ck_assert(fk_results_recorded(s->output, s->cells[bad].id)); /* in cells.csv */
    char *t = table(s->output);
    ck_assert_msg(strstr(t, "non-finite"), "cells.csv lacks the failed cell's error");
    free(t);
    fk_sweep_free(&s);
}
END_TEST

/* A check that needs the data's shape (topk's s against head_dim) refuses the run before
 * any cell and before the results directory exists, naming the cell, codec and dataset. */
START_TEST(shape_checks_before_any_cell)
{
    FILE *f = fopen(g_toml, "a");
    ck_assert(f);
    fprintf(f, "[[codec]]\nname = \"topk\"\ns = 32\n");
    fclose(f);
    /* the sweep checks the options against the data's head_dim as it resolves (the dry run
     * refuses what the run would), naming the block and the dataset */
    char set[300];
    snprintf(set, sizeof set, "sweep.output=\"%s/shape\"", g_dir);
    const char *sets[1] = {set};
    struct fk_sweep *s = NULL;
    ck_assert_int_eq(fk_sweep_load(g_toml, sets, 1, 1, &s), FK_ECONFIG);
    const char *msg = fk_errmsg();
    ck_assert_msg(strstr(msg, "codec 'topk' (dataset 'babyllama')") &&
                  strstr(msg, "s = 32 exceeds head_dim = 16") && strstr(msg, "sweep.toml:"),
                  "message: %s", msg);
    ck_assert_ptr_null(s);
    char out[600];
    snprintf(out, sizeof out, "%s/shape", g_dir);
    struct stat st;
    ck_assert_int_ne(stat(out, &st), 0); /* nothing written */
}
END_TEST

/* Metrics a family does not define are empty, never zero: the full codec has no dictionary,
 * no sparse codes and no cost model; lexico has all of them. */
START_TEST(undefined_metrics_empty)
{
    struct fk_sweep *s = load("empty");
    struct fk_runner_summary a = run(s, 0, 0, 1, NULL);
    ck_assert_int_eq(a.failed, 0);
    static const char *const dict_only[] = {"dict_size_norm_final", "appends", "replacements",
                                            "adapt_failed", "growth_capped", "premature",
                                            "guarded", "macs_per_vec", NULL};
    int seen = 0;
    for (int c = 0; c < s->n_cells; c++) {
        const char *codec = s->cells[c].ops->name;
        int is_full = !strcmp(codec, "full"), is_lexico = !strcmp(codec, "lexico");
        for (int k = 0; (is_full || is_lexico) && dict_only[k]; k++) {
            double v;
            ck_assert_int_eq(fk_results_metric(s->output, s->cells[c].id, dict_only[k], &v),
                             FK_OK);
            ck_assert_msg(is_full ? isnan(v) : isfinite(v), "%s: %s = %g", codec,
                          dict_only[k], v);
        }
        seen += is_full + is_lexico;
    }
    ck_assert_int_eq(seen, 2);
    fk_sweep_free(&s);
}
END_TEST

START_TEST(stop_before_first_cell)
{
    struct fk_sweep *s = load("stopped");
    volatile sig_atomic_t stop = 1;
    struct fk_runner_opts o = {.shard_n = 1, .stop = &stop};
    struct fk_runner_summary sum;
    ck_assert_int_eq(fk_runner_run(s, &o, &sum), FK_OK);
    ck_assert(sum.interrupted);
    ck_assert_int_eq(sum.done + sum.failed, 0);
    ck_assert(!fk_results_done(s->output, s->cells[0].id));
    fk_sweep_free(&s);
}
END_TEST

/* A trace that goes away between resolution and the run fails it before the results
 * directory is made. */
START_TEST(unreadable_dataset_touches_nothing)
{
    char copy[300], cmd[700];
    snprintf(copy, sizeof copy, "%s/trace.h5", g_dir);
    snprintf(cmd, sizeof cmd, "cp '%s/datasets/embedded/babyllama-tok105-00.h5' '%s'",
             getenv("FK_SRCDIR"), copy);
    ck_assert_int_eq(system(cmd), 0);
    FILE *f = fopen(g_toml, "w");
    ck_assert(f);
    fprintf(f, "[sweep]\nname = \"gone\"\noutput = \"%s/gone\"\ntraces = [\"%s\"]\n"
               "[[codec]]\nname = \"full\"\n", g_dir, copy);
    fclose(f);
    struct fk_sweep *s = NULL;
    ck_assert_int_eq(fk_sweep_load(g_toml, NULL, 0, 1, &s), FK_OK);
    ck_assert_int_eq(unlink(copy), 0);
    struct fk_runner_opts o = {.shard_n = 1};
    struct fk_runner_summary sum;
    ck_assert_int_lt(fk_runner_run(s, &o, &sum), 0);
    ck_assert_msg(strstr(fk_errmsg(), "dataset 'default'") && strstr(fk_errmsg(), copy),
                  "message: %s", fk_errmsg());
    struct stat sb;
    ck_assert_int_ne(stat(s->output, &sb), 0);
    fk_sweep_free(&s);
}
END_TEST

/* cells.csv (timings aside) is the same at --jobs 1, 2 and 3; at 2 and 3 cells ran side by
 * side (the 5 cells of 4 layers each, heaviest first, one worker each: the first two start
 * together and each takes many milliseconds), at 1 never. With a budget of 1 MiB the cells
 * in flight never need more (h_progress checks it) and the results are the same again. */
START_TEST(jobs_do_not_change_results)
{
    static const char *const jobs[] = {"sweep.jobs=1", "sweep.jobs=2", "sweep.jobs=3",
                                       "sweep.mem_limit=1"};
    char *ref = NULL;
    for (int i = 0; i < 4; i++) {
        char name[16];
        snprintf(name, sizeof name, "jobs%d", i);
        struct fk_sweep *s = load_with(name, jobs[i]);
        struct seen w = {0};
        struct fk_runner_summary a = run(s, 0, 0, 1, &w);
        ck_assert_int_eq(a.done, s->n_cells);
        ck_assert_int_eq(w.cell_end, s->n_cells);
        if (i == 0)
            ck_assert_int_eq(w.max_running, 1);
        else if (i < 3)
            ck_assert_msg(w.max_running >= 2, "%s: cells did not run side by side", jobs[i]);
        char *t = table(s->output);
        if (!ref)
            ref = t;
        else
            ck_assert_msg(!strcmp(ref, t), "%s: cells.csv differs from --jobs 1", jobs[i]);
        if (t != ref)
            free(t);
        fk_sweep_free(&s);
    }
    free(ref);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("runner");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, shards_merge_to_unsharded);
    tcase_add_test(tc, resume_and_force);
    tcase_add_test(tc, failed_cells_are_retried);
    tcase_add_test(tc, shape_checks_before_any_cell);
    tcase_add_test(tc, undefined_metrics_empty);
    tcase_add_test(tc, stop_before_first_cell);
    tcase_add_test(tc, unreadable_dataset_touches_nothing);
    tcase_add_test(tc, jobs_do_not_change_results);
    suite_add_tcase(s, tc);
    return fk_suite_run(s);
}
