/* SPDX-License-Identifier: MIT
 * The sweep runner (fk_runner.h).
 */
#define _GNU_SOURCE /* pipe2 */
#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/fk_clock.h"
#include "common/fk_err.h"
#include "core/fk_codec.h"
#include "engine/fk_heads.h"
#include "engine/fk_replay.h"
#include "formats/fk_dict.h"
#include "formats/fk_trace.h"
#include "kernels/fk_blas.h"
#include "kernels/fk_simd.h"
#include "runner/fk_runner.h"
#include "runner/fk_runner_int.h"
#include "runner/fk_runner_loop.h"
#include "store/fk_claim.h"
#include "store/fk_results.h"
#include "fk_version.h"

extern const char *gsl_version;

/* Relative running time of a cell for the estimate of the time left: its coding
 * multiply-adds plus a fixed per-vector cost for reading, metrics and attention (about
 * 2e5 multiply-adds). */
static double cell_weight(const struct fk_sweep *s, const struct fk_sweep_cell *c)
{
    double vec = 0, macs = fk_sweep_cell_macs(s, c, &vec);
    return macs + 2e5 * vec;
}

struct weighted {
    double w;
    int c;
};

static int heavier_first(const void *a, const void *b)
{
    const struct weighted *x = a, *y = b;
    if (x->w != y->w)
        return x->w < y->w ? 1 : -1;
    return (x->c > y->c) - (x->c < y->c);
}

int fk_runner_shards(const struct fk_sweep *s, int n_shards, int *shard)
{
    int n = s->n_cells, k = n_shards > 0 ? n_shards : 1;
    struct weighted *w = malloc(sizeof *w * (size_t)(n + 1));
    double *load = calloc((size_t)k, sizeof *load);
    if (!w || !load) {
        free(w);
        free(load);
        return fk_err(FK_ENOMEM, "out of memory");
    }
    for (int c = 0; c < n; c++)
        w[c] = (struct weighted){cell_weight(s, &s->cells[c]), c};
    qsort(w, (size_t)n, sizeof *w, heavier_first);
    for (int i = 0; i < n; i++) {
        int best = 0;
        for (int j = 1; j < k; j++)
            best = load[j] < load[best] ? j : best;
        shard[w[i].c] = best;
        load[best] += w[i].w;
    }
    free(w);
    free(load);
    return FK_OK;
}

static int in_shard(const struct run *r, int c)
{
    return r->shard[c] == (r->o->shard_n > 1 ? r->o->shard_i : 0);
}

/* 1 if cell c is to run: in this run's shard and (force, or not finished with intact
 * files). A cell recorded as finished whose files do not match their record is reported
 * (the damaged hook) and runs again. */
static int selected(struct run *r, int c)
{
    if (!in_shard(r, c))
        return 0;
    char why[512];
    enum fk_cell_state st = fk_results_state(r->s->output, r->s->cells[c].id, why, sizeof why);
    if (st == FK_CELL_DAMAGED) {
        r->sum->damaged++;
        if (r->o->hooks.damaged)
            r->o->hooks.damaged(r->o->hooks.ctx, &r->s->cells[c], why);
    }
    if (st == FK_CELL_FAILED && !r->o->force && !r->o->retry_failed) {
        char status[32];
        fk_results_status(r->s->output, r->s->cells[c].id, status, sizeof status);
        if (!strcmp(status, "crashed") || !strcmp(status, "timeout")) {
            r->sum->not_retried++;
            r->left[c] = 1;
            return 0;
        }
    }
    return r->o->force || st != FK_CELL_OK;
}

static double eta(const struct run *r, double work_done)
{
    double el = fk_wall_s() - r->t_start;
    return work_done > 0 ? el * (r->est_total - work_done) / work_done : NAN;
}

static const char *cpu_model(char *buf, size_t cap)
{
    snprintf(buf, cap, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return buf;
    char line[512];
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "model name", 10)) {
            char *c = strchr(line, ':');
            if (c) {
                snprintf(buf, cap, "%s", c + 2);
                buf[strcspn(buf, "\n")] = 0;
            }
            break;
        }
    fclose(f);
    return buf;
}

static int write_provenance(const struct fk_sweep *s)
{
    char cpu[256], harness[64], hdf5[48];
    unsigned maj, min, rel;
    H5get_libversion(&maj, &min, &rel);
    snprintf(harness, sizeof harness, "fadkv-bench %s", FK_VERSION);
    snprintf(hdf5, sizeof hdf5, "%u.%u.%u", maj, min, rel);
    struct fk_provenance p = {
        .harness = harness, .git = FK_GIT_VERSION, .config = s->path,
        .config_hash = s->config_hash, .sweep = s->name, .cells = s->n_cells, .jobs = s->jobs,
        .hdf5 = hdf5, .gsl = gsl_version, .blas = fk_blas_library(),
        .blas_config = fk_blas_config(), .blas_kernels = fk_blas_kernels(),
        .simd = fk_simd_build(), .compiler = fk_compiler(), .blas_threads_per_worker = 1,
        .cpu = cpu_model(cpu, sizeof cpu), .online_cpus = sysconf(_SC_NPROCESSORS_ONLN),
        .precision = "float32 data, float32 BLAS dot products, double triangular solves and "
                     "energies",
        .cost_baseline = s->cost_baseline, .budgets = s->budgets};
    FK_TRY(fk_store_provenance_write(s->output, &p));
    return fk_store_resolved_write(s->output, s->resolved, strlen(s->resolved));
}

/* Opens the traces and the dictionary of a cell's dataset (once per dataset). */
/* What needs no computation, checked once per dataset before any cell: every trace has the
 * first one's shape (layers, heads, head_dim), and the attention layers asked for exist. */
static int check_traces(const struct fk_sweep *s, const struct fk_dataset *ds,
                        const struct loaded *L)
{
    const struct fk_trace_info *a = fk_trace_get_info(L->traces[0]);
    for (int i = 1; i < ds->n_traces; i++) {
        const struct fk_trace_info *b = fk_trace_get_info(L->traces[i]);
        if (b->n_layers != a->n_layers || b->n_kv_heads != a->n_kv_heads ||
            b->n_q_heads != a->n_q_heads || b->head_dim != a->head_dim)
            return fk_err(FK_ECONFIG, "trace %s has %d layers, %d/%d heads, head_dim %d, but "
                          "trace %s has %d, %d/%d, %d: the traces of one dataset must share "
                          "a shape", ds->traces[i], b->n_layers, b->n_q_heads, b->n_kv_heads,
                          b->head_dim, ds->traces[0], a->n_layers, a->n_q_heads,
                          a->n_kv_heads, a->head_dim);
    }
    for (int l = a->n_layers; s->attention && s->attn_layers && l < s->n_attn_layers; l++)
        if (s->attn_layers[l])
            return fk_err(FK_ECONFIG, "attn_layers names layer %d, but the traces have %d "
                          "layers (0 .. %d)", l, a->n_layers, a->n_layers - 1);
    return FK_OK;
}

/* Warns once for every (layer, kind) of dictionary d whose atoms are all zero: its vectors
 * can only be stored as empty codes. */
static void warn_dead_layers(const struct run *r, const struct fk_dataset *ds,
                             const struct fk_dict *d)
{
    const struct fk_runner_hooks *h = &r->o->hooks;
    size_t N = (size_t)d->n_atoms;
    for (int l = 0; h->warn && l < d->n_layers; l++)
        for (int k = 0; k < 2; k++) {
            const uint8_t *dead = d->dead + ((size_t)l * 2 + (size_t)k) * N;
            size_t live = 0;
            for (size_t j = 0; j < N; j++)
                live += !dead[j];
            if (live)
                continue;
            char msg[1200];
            snprintf(msg, sizeof msg, "dataset '%s': dictionary %s, layer %d %s: every one of "
                     "its %zu atoms is zero: the dictionary codecs store that layer's %s as "
                     "empty codes (relative error 1)", ds->name, ds->dict, l, k ? "V" : "K", N,
                     k ? "values" : "keys");
            h->warn(h->ctx, msg);
        }
}

int fk_run_load_dataset(struct run *r, const struct fk_sweep_cell *cell)
{
    const struct fk_dataset *ds = &r->s->datasets[cell->dataset];
    struct loaded *L = &r->ld[cell->dataset];
    int rc = FK_OK;
    if (ds->model && !L->loop)
        rc = fk_runner_model_dataset(ds, !r->worker, &L->loop);
    if (rc == FK_OK && !L->traces) {
        L->traces = calloc((size_t)ds->n_traces, sizeof(struct fk_trace *));
        if (!L->traces)
            rc = fk_err(FK_ENOMEM, "out of memory");
        for (int i = 0; rc == FK_OK && i < ds->n_traces; i++)
            rc = fk_trace_open(ds->traces[i], &L->traces[i]);
        if (rc == FK_OK)
            rc = check_traces(r->s, ds, L);
    }
    if (rc == FK_OK && !L->dict && ds->dict && (cell->ops->caps & FK_CAP_DICT)) {
        rc = fk_dict_load(ds->dict, &L->dict);
        for (int i = 0; rc == FK_OK && i < ds->n_traces; i++)
            rc = fk_dict_check_trace(L->dict, fk_trace_get_info(L->traces[i]),
                                     fk_trace_path(L->traces[i]));
        if (rc == FK_OK)
            warn_dead_layers(r, ds, L->dict);
    }
    if (rc == FK_OK && !L->basis && ds->basis && (cell->ops->caps & FK_CAP_BASIS))
        rc = fk_basis_load(ds->basis, &L->basis);
    if (rc == FK_OK && !L->calib && ds->calib && (cell->ops->caps & FK_CAP_CALIB))
        rc = fk_calib_load(ds->calib, &L->calib);
    if (rc == FK_OK && !L->heads && ds->head_pattern && cell->evict)
        rc = fk_head_pattern_load(ds->head_pattern, &L->heads);
    if (rc == FK_OK && !L->recon && ds->recon && (cell->ops->caps & FK_CAP_EXTERNAL)) {
        L->recon = calloc((size_t)ds->n_traces, sizeof(struct fk_trace *));
        if (!L->recon)
            rc = fk_err(FK_ENOMEM, "out of memory");
        for (int i = 0; rc == FK_OK && i < ds->n_traces; i++)
            rc = fk_trace_open(ds->recon[i], &L->recon[i]);
    }
    if (rc < 0) {
        char msg[1100];
        snprintf(msg, sizeof msg, "%s", fk_errmsg());
        return fk_err(rc, "dataset '%s': %s", ds->name, msg);
    }
    return FK_OK;
}

/* The codec's cross-option checks against the dataset's shape (head_dim) and dictionary
 * size, for every selected cell before any runs: the sweep could only refuse what fails at
 * any shape (e.g. s > n), the replay repeats these checks when the cell starts. */
static int check_cell(struct run *r, const struct fk_sweep_cell *cell)
{
    const struct loaded *L = &r->ld[cell->dataset];
    if (!cell->ops->check || !L->traces || r->s->datasets[cell->dataset].n_traces < 1)
        return FK_OK;
    /* a basis codec's check needs the basis's component count, a calibrated one its
     * calibration: check_basis runs them */
    if (cell->ops->caps & (FK_CAP_BASIS | FK_CAP_CALIB))
        return FK_OK;
    int hd = fk_trace_get_info(L->traces[0])->head_dim;
    int na = (cell->ops->caps & FK_CAP_DICT) && L->dict ? L->dict->n_atoms : 0;
    int rc = cell->ops->check(cell->opts, hd, na);
    if (rc < 0)
        return fk_err_context(FK_ECONFIG, "cell %s (codec '%s' on dataset '%s', head_dim %d)",
                              cell->id, cell->ops->name, r->s->datasets[cell->dataset].name,
                              hd);
    return FK_OK;
}

void fk_run_free_loaded(struct run *r)
{
    for (int d = 0; r->ld && d < r->s->n_datasets; d++) {
        for (int i = 0; r->ld[d].traces && i < r->s->datasets[d].n_traces; i++)
            fk_trace_close(&r->ld[d].traces[i]);
        free(r->ld[d].traces);
        fk_dict_free(&r->ld[d].dict);
        fk_basis_free(&r->ld[d].basis);
        fk_calib_free(&r->ld[d].calib);
        fk_head_pattern_free(&r->ld[d].heads);
        for (int i = 0; r->ld[d].recon && i < r->s->datasets[d].n_traces; i++)
            fk_trace_close(&r->ld[d].recon[i]);
        free(r->ld[d].recon);
        fk_loop_set_free(&r->ld[d].loop);
    }
    free(r->ld);
    r->ld = NULL;
}

/* What cell c replays: its codec, options, the traces and model constants of its dataset. */
static struct fk_cell_input cell_input(const struct run *r, const struct fk_sweep_cell *cell)
{
    const struct loaded *L = &r->ld[cell->dataset];
    return (struct fk_cell_input){.ops = cell->ops, .opts = cell->opts, .traces = L->traces,
                                  .n_traces = r->s->datasets[cell->dataset].n_traces,
                                  .dict = (cell->ops->caps & FK_CAP_DICT) ? L->dict : NULL,
                                  .basis = (cell->ops->caps & FK_CAP_BASIS) ? L->basis : NULL,
                                  .calib = (cell->ops->caps & FK_CAP_CALIB) ? L->calib : NULL,
                                  .external = (cell->ops->caps & FK_CAP_EXTERNAL) ? L->recon
                                                                                  : NULL,
                                  .evict = cell->evict, .evict_opts = cell->evict_opts,
                                  .rewrite = cell->rewrite, .heads = L->heads};
}

/* A low-rank cell's basis, a calibrated cell's calibration, against its traces and
 * options, before any cell runs. */
static int check_basis(const struct run *r, const struct fk_sweep_cell *cell)
{
    struct fk_cell_input in = cell_input(r, cell);
    if (fk_replay_check_basis(&in) == FK_OK && fk_replay_check_calib(&in) == FK_OK &&
        fk_replay_check_external(&in) == FK_OK &&
        fk_replay_check_evict(&in) == FK_OK)
        return FK_OK;
    char msg[1100];
    snprintf(msg, sizeof msg, "%s", fk_errmsg());
    return fk_err(FK_ECONFIG, "dataset '%s', cell %s (codec %s): %s",
                  r->s->datasets[cell->dataset].name, cell->id, cell->ops->name, msg);
}

/* Everything before the first cell: selection, loading, results directory, provenance. */
static int prepare(struct run *r)
{
    const struct fk_sweep *s = r->s;
    r->ld = calloc((size_t)s->n_datasets, sizeof *r->ld);
    r->ids = calloc((size_t)s->n_cells + 1, sizeof(char *));
    r->shard = malloc(sizeof(int) * ((size_t)s->n_cells + 1));
    r->left = calloc((size_t)s->n_cells + 1, 1);
    if (!r->ld || !r->ids || !r->shard || !r->left)
        return fk_err(FK_ENOMEM, "out of memory");
    FK_TRY(fk_runner_shards(s, r->o->shard_n, r->shard));
    for (int c = 0; c < s->n_cells; c++) {
        r->ids[c] = s->cells[c].id;
        if (selected(r, c)) {
            r->sum->todo++;
            r->est_total += cell_weight(s, &s->cells[c]);
            FK_TRY(fk_run_load_dataset(r, &s->cells[c]));
            FK_TRY(check_cell(r, &s->cells[c]));
            FK_TRY(check_basis(r, &s->cells[c]));
        }
    }
    if (fk_results_prepare(s->output) < 0 || write_provenance(s) < 0) {
        char msg[1100];
        snprintf(msg, sizeof msg, "%s", fk_errmsg());
        return fk_err(FK_EIO, "results directory: %s", msg);
    }
    r->prepared = 1;
    return FK_OK;
}

/* The cost-model weight done: finished cells and the finished part of those in flight
 * (under r->mu). */
static double work_done(const struct run *r)
{
    double w = r->est_done;
    for (int i = 0; i < r->n_lanes; i++)
        if (r->lanes[i].cell)
            w += r->lanes[i].est_cell * r->lanes[i].frac;
    return w;
}

static int in_flight(const struct run *r)
{
    int n = 0;
    for (int i = 0; i < r->n_lanes; i++)
        n += r->lanes[i].cell != NULL;
    return n;
}

void fk_run_on_unit(void *ctx, int done, int total, long vectors)
{
    struct lane *ln = ctx;
    struct run *r = ln->r;
    const struct fk_runner_hooks *h = &r->o->hooks;
    pthread_mutex_lock(&r->mu);
    double now = fk_wall_s();
    ln->frac = total ? (double)done / total : 1;
    struct fk_runner_progress p = {
        .cell = ln->cell, .index = ln->index, .todo = r->sum->todo, .units_done = done,
        .units_total = total,
        .vec_per_s = vectors / (now - ln->t_cell > 1e-9 ? now - ln->t_cell : 1e-9),
        .eta_s = eta(r, work_done(r)), .running = in_flight(r), .mem_in_flight = r->mem_used,
        .mem_budget = r->mem_budget};
    if (h->progress)
        h->progress(h->ctx, &p);
    pthread_mutex_unlock(&r->mu);
}

void fk_run_cell_meta(const struct run *r, const struct fk_sweep_cell *cell,
                      const struct fk_cell_loop *loop, struct fk_cell_meta *meta)
{
    const struct fk_sweep *s = r->s;
    const struct fk_dataset *ds = &s->datasets[cell->dataset];
    *meta = (struct fk_cell_meta){.ops = cell->ops, .opts = cell->opts, .dataset = ds->name,
                                  .traces = (const char *const *)ds->traces,
                                  .n_traces = ds->n_traces,
                                  .dict = (cell->ops->caps & FK_CAP_DICT) ? ds->dict : NULL,
                                  .basis = (cell->ops->caps & FK_CAP_BASIS) ? ds->basis : NULL,
                                  .calib = (cell->ops->caps & FK_CAP_CALIB) ? ds->calib : NULL,
                                  .attn_stride = s->attention ? s->attn_stride : 0,
                                  .seed = (long)(cell->seed & 0x7fffffffffffffffULL),
                                  .repeat = cell->repeat,
                                  .sweep = s->name, .evict = cell->evict,
                                  .evict_opts = cell->evict_opts, .rewrite = cell->rewrite,
                                  .loop = loop};
    memcpy(meta->id, cell->id, sizeof meta->id);
}

/* Reports a cell's end (under r->mu). */
void fk_run_report_end(struct run *r, struct lane *ln, struct fk_runner_cell_end *e)
{
    pthread_mutex_lock(&r->mu);
    if (e->failed) {
        r->sum->failed++;
    } else {
        r->est_done += ln->est_cell;
        r->sum->done++;
    }
    ln->frac = 0;
    e->running = in_flight(r);
    e->eta_s = eta(r, work_done(r));
    if (r->o->hooks.cell_end)
        r->o->hooks.cell_end(r->o->hooks.ctx, r->s, e);
    pthread_mutex_unlock(&r->mu);
}

/* Rewrites cells.csv and summary.csv (under store_mu) when asked (`now`) or when the last
 * rewrite is old enough: at most every 2 s, and never more than a twentieth of the time
 * (a rewrite reads every finished cell, so rewriting after each cell would make a sweep of
 * many cells quadratic). The run ends with a rewrite; a cell's files are its record. */
int fk_run_tables(struct run *r, int now)
{
    double t0 = fk_wall_s();
    double wait = 20 * r->tables_s > 2 ? 20 * r->tables_s : 2;
    if (!now && r->tables_at > 0 && t0 - r->tables_at < wait)
        return FK_OK;
    const struct fk_sweep *s = r->s;
    if (fk_results_tables(s->output, r->ids, s->n_cells, s->cost_baseline) < 0)
        return fk_err(FK_EIO, "writing cells.csv: %s", fk_errmsg());
    r->tables_at = fk_wall_s();
    r->tables_s = r->tables_at - t0;
    return FK_OK;
}

/* Records a failed cell (status, message) and reports it; under store_mu. */
int fk_run_commit_failed(struct lane *ln, const char *status, const char *msg,
                         struct fk_runner_cell_end *e)
{
    struct run *r = ln->r;
    struct fk_cell_meta meta;
    fk_run_cell_meta(r, ln->cell, ln->loop, &meta);
    e->failed = 1;
    e->error = msg;
    fk_run_report_end(r, ln, e);
    fk_replay_h5_lock();
    int fr = fk_results_commit_failed(r->s->output, &meta, status, msg);
    fk_replay_h5_unlock();
    if (fr < 0) {
        char m[1100];
        snprintf(m, sizeof m, "%s", fk_errmsg());
        return fk_err(FK_EIO, "results: %s", m);
    }
    return FK_OK;
}

/* Commits a cell's outcome (finished or failed) and reports it; then the tables (fk_run_tables()).
 * One lane at a time (store_mu), and the HDF5 file under the engine's HDF5 lock. */
static int commit(struct lane *ln, int rrc, struct fk_cell_result *res, double dt)
{
    struct run *r = ln->r;
    const struct fk_sweep *s = r->s;
    const struct fk_sweep_cell *cell = ln->cell;
    struct fk_cell_meta meta;
    fk_run_cell_meta(r, cell, ln->loop, &meta);
    struct fk_runner_cell_end e = {.cell = cell, .index = ln->index, .todo = r->sum->todo,
                                   .wall_s = dt, .rel_err = NAN};
    char msg[1100];
    int rc = FK_OK;
    pthread_mutex_lock(&r->store_mu);
    if (rrc < 0) {
        snprintf(msg, sizeof msg, "%s", fk_errmsg());
        rc = fk_run_commit_failed(ln, "failed", msg, &e);
    } else {
        fk_replay_h5_lock();
        int cr = fk_results_commit(s->output, &meta, res);
        fk_replay_h5_unlock();
        e.vectors = res->vectors;
        fk_cell_result_free(res);
        if (cr < 0) {
            snprintf(msg, sizeof msg, "%s", fk_errmsg());
            rc = fk_err(cr, "writing results (nothing of this cell was recorded as finished): "
                        "%s", msg);
        } else {
            fk_results_metric(s->output, cell->id, "rel_err_mean", &e.rel_err);
            fk_run_report_end(r, ln, &e);
        }
    }
    if (rc == FK_OK)
        rc = fk_run_tables(r, 0);
    pthread_mutex_unlock(&r->store_mu);
    return rc;
}

/* The start of a cell in lane ln: its index, clock, weight and the cell_start hook. */
void fk_run_cell_begin(struct lane *ln)
{
    struct run *r = ln->r;
    pthread_mutex_lock(&r->mu);
    ln->index = ++r->started;
    ln->t_cell = fk_wall_s();
    ln->est_cell = cell_weight(r->s, ln->cell);
    ln->frac = 0;
    if (r->o->hooks.cell_start)
        r->o->hooks.cell_start(r->o->hooks.ctx, r->s, ln->cell, ln->index, r->sum->todo);
    pthread_mutex_unlock(&r->mu);
}

/* Replays the cell of lane ln in this process into *res (and the closed loop into *loop for
 * a model dataset); returns the replay's status. */
int fk_run_replay_here(struct lane *ln, volatile sig_atomic_t *stop,
                       void (*progress)(void *, int, int, long), void *progress_ctx,
                       struct fk_cell_result *res, struct fk_cell_loop *loop)
{
    struct run *r = ln->r;
    const struct fk_sweep *s = r->s;
    const struct fk_sweep_cell *cell = ln->cell;
    struct fk_replay_opts ro = {.jobs = ln->jobs, .attention = s->attention,
                                .attn_stride = s->attn_stride, .attn_layers = s->attn_layers,
                                .recall = s->recall, .recall_every = s->recall_every,
                                .stop = stop, .progress = progress,
                                .progress_ctx = progress_ctx, .pool = ln->pool};
    struct fk_cell_input in = cell_input(r, cell);
    int rrc = fk_replay_cell(&in, &ro, res);
    const struct loaded *L = &r->ld[cell->dataset];
    if (rrc == FK_OK && L->loop) { /* a model dataset: the codec in the loop too */
        rrc = fk_runner_loop_cell(L->loop, &in, loop);
        if (rrc < 0)
            fk_cell_result_free(res);
    }
    return rrc;
}

/* Runs the cell of lane ln (claimed) in this process; sets sum->interrupted when a stop was
 * asked for. */
static int run_cell(struct lane *ln)
{
    struct run *r = ln->r;
    fk_run_cell_begin(ln);
    struct fk_cell_result res;
    struct fk_cell_loop loop = {0};
    double c0 = fk_wall_s();
    int rrc = fk_run_replay_here(ln, r->o->stop, fk_run_on_unit, ln, &res, &loop);
    ln->loop = rrc == FK_OK && r->ld[ln->cell->dataset].loop ? &loop : NULL;
    double dt = fk_wall_s() - c0;
    if (rrc == FK_EINTR || (r->o->stop && *r->o->stop)) {
        if (rrc == FK_OK)
            fk_cell_result_free(&res);
        ln->loop = NULL;
        fk_runner_loop_free(&loop);
        pthread_mutex_lock(&r->mu);
        r->sum->interrupted = 1;
        pthread_mutex_unlock(&r->mu);
        return FK_OK;
    }
    int crc = commit(ln, rrc, &res, dt);
    ln->loop = NULL;
    fk_runner_loop_free(&loop);
    return crc;
}

/* Estimated peak bytes of cell c replayed by `workers` workers, beyond the datasets the run
 * keeps loaded (an upper bound, not a measurement): per worker, the K and V Gram buffers of
 * a codec that wants them (N x N floats each), one layer's K and V read as float32, the
 * codec's K and V states bounded by two more copies of them, a growing codec's appended
 * atoms with their Gram rows (one per decode token and head at most), external rows and the
 * query rows of the attention steps; per cell, the result arrays of every stream. A
 * dictionary codec's Gram of its own (FK_OWN_GRAM_MAX) counts as a harness Gram. */
static double cell_bytes(const struct run *r, const struct fk_sweep_cell *c, int workers)
{
    const struct loaded *L = &r->ld[c->dataset];
    if (!L->traces || !L->traces[0])
        return 0;
    const struct fk_trace_info *ti = fk_trace_get_info(L->traces[0]);
    unsigned caps = c->ops->caps;
    double H = ti->n_kv_heads, T = ti->n_tokens, m = ti->head_dim;
    double N = (caps & FK_CAP_DICT) && L->dict ? L->dict->n_atoms : 0;
    double dec = ti->n_tokens > ti->prompt_len ? ti->n_tokens - ti->prompt_len : 0;
    double kv = 2 * H * T * m * 4, w = 3 * kv;
    if ((caps & FK_CAP_GRAM) || ((caps & FK_CAP_DICT) && N <= FK_OWN_GRAM_MAX))
        w += 2 * N * N * 4;
    if (caps & FK_CAP_GROWS)
        w += 2 * H * dec * (m + N + dec) * 4;
    if (caps & FK_CAP_EXTERNAL)
        w += kv;
    if (r->s->attention)
        w += (double)ti->n_q_heads * (dec / r->s->attn_stride + 1) * m * 4 + 2 * H * T * 8;
    double streams = 2.0 * r->s->datasets[c->dataset].n_traces * ti->n_layers;
    return workers * w + streams * (16 * dec + N + 4096);
}

/* The memory budget of the cells in flight: [sweep] mem_limit, else half the RAM. */
static double mem_budget(const struct fk_sweep *s)
{
    if (s->mem_limit_mib > 0)
        return s->mem_limit_mib * 1048576.0;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? 0.5 * (double)pages * (double)page : 4.0 * (1 << 30);
}

/* Workers for cell c when it starts (under r->mu; 0: wait): the free workers shared in
 * proportion to its share of the cost-model weight left (a cell that holds most of what
 * is left takes them all), at least one, at most its layers; fewer when the budget would
 * be exceeded; when nothing runs, a cell over budget runs alone with all workers. */
static int choose_jobs(const struct run *r, const struct fk_sweep_cell *c, double *bytes)
{
    if (r->free_jobs < 1)
        return 0;
    int units = 1;
    if (r->ld[c->dataset].traces && r->ld[c->dataset].traces[0])
        units = fk_trace_get_info(r->ld[c->dataset].traces[0])->n_layers;
    double wc = cell_weight(r->s, c), share = r->est_left > 0 ? wc / r->est_left : 1;
    int j = (int)floor(r->free_jobs * share + 0.5);
    j = j < 1 ? 1 : j > r->free_jobs ? r->free_jobs : j;
    j = r->n_lanes == 1 ? r->free_jobs : j > units ? units : j;
    int running = r->free_jobs < r->s->jobs;
    for (; j >= 1; j--) {
        *bytes = cell_bytes(r, c, j);
        if (!running || r->mem_used + *bytes <= r->mem_budget)
            return j;
    }
    return 0;
}

/* A lane: takes the next cell when it can start, claims it, runs it, until none is left,
 * a stop is asked for, or a lane failed. */
static void *lane_main(void *arg)
{
    struct lane *ln = arg;
    struct run *r = ln->r;
    const struct fk_sweep *s = r->s;
    const struct fk_runner_opts *o = r->o;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        if (r->rc < 0 || r->sum->interrupted || r->next >= r->n_order)
            break;
        if (o->stop && *o->stop) {
            r->sum->interrupted = 1;
            break;
        }
        int c = r->order[r->next];
        double bytes = 0;
        int j = choose_jobs(r, &s->cells[c], &bytes);
        if (j == 0) {
            /* an idle lane gives its Gram buffers back before it waits */
            if (ln->pool && fk_replay_pool_bytes(ln->pool) > 0) {
                fk_replay_pool_free(&ln->pool);
                if (fk_replay_pool_new(&ln->pool) < 0)
                    ln->pool = NULL;
            }
            pthread_cond_wait(&r->cv, &r->mu);
            continue;
        }
        r->next++;
        r->est_left -= cell_weight(s, &s->cells[c]);
        r->free_jobs -= j;
        r->mem_used += bytes;
        ln->jobs = j;
        ln->bytes = bytes;
        pthread_mutex_unlock(&r->mu);
        /* claimed first: another run on this directory may be computing it (a cell that
         * is finished, by an earlier run or meanwhile, comes back FK_CLAIM_DONE) */
        char holder[256];
        int rc = FK_OK;
        int cl = fk_results_claim(s->output, s->cells[c].id, o->force, holder, sizeof holder);
        if (cl == FK_CLAIM_OK) {
            ln->cell = &s->cells[c];
            rc = o->child_argv ? fk_run_cell_isolated(ln) : run_cell(ln);
            fk_results_unclaim(s->output, s->cells[c].id);
        } else if (cl < 0) {
            rc = cl;
        }
        pthread_mutex_lock(&r->mu);
        ln->cell = NULL;
        r->free_jobs += j;
        r->mem_used -= bytes;
        if (cl == FK_CLAIM_DONE) {
            r->sum->skipped++;
        } else if (cl == FK_CLAIM_HELD) {
            r->sum->elsewhere++;
            if (o->hooks.claimed)
                o->hooks.claimed(o->hooks.ctx, &s->cells[c], holder);
        }
        if (rc < 0 && r->rc == FK_OK) {
            r->rc = rc;
            snprintf(r->errmsg, sizeof r->errmsg, "%s", fk_errmsg());
        }
        pthread_cond_broadcast(&r->cv);
    }
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    fk_run_worker_stop(ln);
    return NULL;
}

/* The cells of this shard in the order lanes take them: as configured with one lane;
 * heaviest first (by the cost model, ties by index) when cells run side by side, so that
 * the last to finish are small. */
static int make_order(struct run *r, int n_lanes)
{
    const struct fk_sweep *s = r->s;
    struct weighted *w = malloc(sizeof *w * ((size_t)s->n_cells + 1));
    r->order = malloc(sizeof(int) * ((size_t)s->n_cells + 1));
    if (!w || !r->order) {
        free(w);
        return fk_err(FK_ENOMEM, "out of memory");
    }
    int n = 0;
    for (int c = 0; c < s->n_cells; c++)
        if (in_shard(r, c) && !r->left[c])
            w[n++] = (struct weighted){n_lanes > 1 ? cell_weight(s, &s->cells[c]) : 0, c};
    if (n_lanes > 1)
        qsort(w, (size_t)n, sizeof *w, heavier_first);
    for (int i = 0; i < n; i++)
        r->order[i] = w[i].c;
    r->n_order = n;
    free(w);
    return FK_OK;
}

/* Runs the lanes: min(jobs, cells to run) of them, the calling thread alone when one (or
 * when no thread starts), each BLAS call on one thread for the whole run (the engine sets
 * that per cell, which side by side cells would undo for each other). */
static void run_lanes(struct run *r)
{
    int n = r->s->jobs < r->sum->todo ? r->s->jobs : r->sum->todo;
    n = n < 1 ? 1 : n;
    r->lanes = calloc((size_t)n, sizeof *r->lanes);
    if (!r->lanes) {
        n = 1; /* one lane on the stack */
        free(r->lanes);
        r->lanes = NULL;
    }
    struct lane one = {.r = r};
    struct lane *lanes = r->lanes ? r->lanes : &one;
    r->lanes = lanes;
    r->n_lanes = n;
    for (int i = 0; i < n; i++) {
        lanes[i].r = r;
        if (fk_replay_pool_new(&lanes[i].pool) < 0)
            lanes[i].pool = NULL;
    }
    fk_blas_parallel(n, lane_main, lanes, sizeof *lanes);
    for (int i = 0; i < n; i++)
        fk_replay_pool_free(&lanes[i].pool);
    if (lanes == &one)
        r->lanes = NULL;
}

int fk_runner_run(const struct fk_sweep *s, const struct fk_runner_opts *o,
                  struct fk_runner_summary *sum)
{
    *sum = (struct fk_runner_summary){0};
    struct run r = {.s = s, .o = o, .sum = sum, .t_start = fk_wall_s(),
                    .mu = PTHREAD_MUTEX_INITIALIZER, .store_mu = PTHREAD_MUTEX_INITIALIZER,
                    .cv = PTHREAD_COND_INITIALIZER};
    int rc = prepare(&r);
    if (rc == FK_OK && o->hooks.start)
        o->hooks.start(o->hooks.ctx, s, sum->todo);
    int n_lanes = s->jobs < sum->todo ? s->jobs : sum->todo;
    if (rc == FK_OK)
        rc = make_order(&r, n_lanes);
    if (rc == FK_OK) {
        for (int i = 0; i < r.n_order; i++)
            r.est_left += cell_weight(s, &s->cells[r.order[i]]);
        r.free_jobs = s->jobs < 1 ? 1 : s->jobs;
        r.mem_budget = mem_budget(s);
        run_lanes(&r);
        if (r.rc < 0)
            rc = fk_err(r.rc, "%s", r.errmsg);
    }
    if (r.prepared && fk_run_tables(&r, 1) < 0 && rc == FK_OK)
        rc = FK_EIO;
    free(r.lanes);
    free(r.order);
    fk_run_free_loaded(&r);
    free(r.ids);
    free(r.shard);
    free(r.left);
    sum->wall_s = fk_wall_s() - r.t_start;
    return rc;
}

