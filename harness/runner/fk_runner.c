/* SPDX-License-Identifier: MIT
 * The sweep runner (fk_runner.h).
 */
#include <cblas.h>
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fk_clock.h"
#include "common/fk_err.h"
#include "core/fk_codec.h"
#include "engine/fk_replay.h"
#include "formats/fk_dict.h"
#include "formats/fk_trace.h"
#include "runner/fk_runner_loop.h"
#include "runner/fk_runner.h"
#include "store/fk_claim.h"
#include "store/fk_results.h"
#include "fk_version.h"

extern const char *gsl_version;

/* Opened traces, dictionary and basis of one dataset. */
struct loaded {
    struct fk_trace **traces;
    struct fk_dict *dict;
    struct fk_basis_file *basis;
    struct fk_trace **recon;     /* [n_traces] reconstruction files (codec external) or NULL */
    struct fk_loop_set *loop;    /* model dataset: the model and its exact decodes, or NULL */
};

/* The state of one run. */
struct run {
    const struct fk_sweep *s;
    const struct fk_runner_opts *o;
    struct loaded *ld;           /* [n_datasets] */
    const char **ids;            /* [n_cells] cell ids, for the tables */
    struct fk_replay_pool *pool; /* Gram buffers from cell to cell (optional) */
    struct fk_runner_summary *sum;
    int prepared;                /* the results directory exists and holds provenance */
    double t_start;
    double est_total, est_done;  /* cost-model weights: all cells to run, finished ones */
    /* the cell in progress */
    const struct fk_sweep_cell *cell;
    int index;
    double t_cell, est_cell;
    int *shard;                  /* [n_cells] fk_runner_shards */
    const struct fk_cell_loop *loop; /* the cell's closed-loop results (model datasets) */
};

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
        .hdf5 = hdf5, .gsl = gsl_version, .openblas = openblas_get_config(),
        .openblas_kernels = openblas_get_corename(), .blas_threads_per_worker = 1,
        .cpu = cpu_model(cpu, sizeof cpu), .online_cpus = sysconf(_SC_NPROCESSORS_ONLN),
        .precision = "float32 data, float32 BLAS dot products, double triangular solves and "
                     "energies",
        .cost_baseline = s->cost_baseline};
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

static int load_dataset(struct run *r, const struct fk_sweep_cell *cell)
{
    const struct fk_dataset *ds = &r->s->datasets[cell->dataset];
    struct loaded *L = &r->ld[cell->dataset];
    int rc = FK_OK;
    if (ds->model && !L->loop)
        rc = fk_runner_model_dataset(ds, &L->loop);
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
    }
    if (rc == FK_OK && !L->basis && ds->basis && (cell->ops->caps & FK_CAP_BASIS))
        rc = fk_basis_load(ds->basis, &L->basis);
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
    /* a basis codec's check needs the basis's component count: check_basis runs it */
    if (cell->ops->caps & FK_CAP_BASIS)
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

static void free_loaded(struct run *r)
{
    for (int d = 0; r->ld && d < r->s->n_datasets; d++) {
        for (int i = 0; r->ld[d].traces && i < r->s->datasets[d].n_traces; i++)
            fk_trace_close(&r->ld[d].traces[i]);
        free(r->ld[d].traces);
        fk_dict_free(&r->ld[d].dict);
        fk_basis_free(&r->ld[d].basis);
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
                                  .external = (cell->ops->caps & FK_CAP_EXTERNAL) ? L->recon
                                                                                  : NULL,
                                  .evict = cell->evict, .evict_opts = cell->evict_opts};
}

/* A low-rank cell's basis against its traces and options, before any cell runs. */
static int check_basis(const struct run *r, const struct fk_sweep_cell *cell)
{
    struct fk_cell_input in = cell_input(r, cell);
    if (fk_replay_check_basis(&in) == FK_OK && fk_replay_check_external(&in) == FK_OK &&
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
    if (!r->ld || !r->ids || !r->shard)
        return fk_err(FK_ENOMEM, "out of memory");
    FK_TRY(fk_runner_shards(s, r->o->shard_n, r->shard));
    for (int c = 0; c < s->n_cells; c++) {
        r->ids[c] = s->cells[c].id;
        if (selected(r, c)) {
            r->sum->todo++;
            r->est_total += cell_weight(s, &s->cells[c]);
            FK_TRY(load_dataset(r, &s->cells[c]));
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
    if (fk_replay_pool_new(&r->pool) < 0)
        r->pool = NULL;
    return FK_OK;
}

static void on_unit(void *ctx, int done, int total, long vectors)
{
    struct run *r = ctx;
    const struct fk_runner_hooks *h = &r->o->hooks;
    if (!h->progress)
        return;
    double now = fk_wall_s(), frac = total ? (double)done / total : 1;
    struct fk_runner_progress p = {
        .cell = r->cell, .index = r->index, .todo = r->sum->todo, .units_done = done,
        .units_total = total,
        .vec_per_s = vectors / (now - r->t_cell > 1e-9 ? now - r->t_cell : 1e-9),
        .eta_s = eta(r, r->est_done + r->est_cell * frac)};
    h->progress(h->ctx, &p);
}

static void cell_meta(const struct run *r, const struct fk_sweep_cell *cell,
                      struct fk_cell_meta *meta)
{
    const struct fk_sweep *s = r->s;
    const struct fk_dataset *ds = &s->datasets[cell->dataset];
    *meta = (struct fk_cell_meta){.ops = cell->ops, .opts = cell->opts, .dataset = ds->name,
                                  .traces = (const char *const *)ds->traces,
                                  .n_traces = ds->n_traces,
                                  .dict = (cell->ops->caps & FK_CAP_DICT) ? ds->dict : NULL,
                                  .basis = (cell->ops->caps & FK_CAP_BASIS) ? ds->basis : NULL,
                                  .attn_stride = s->attention ? s->attn_stride : 0,
                                  .seed = (long)(cell->seed & 0x7fffffffffffffffULL),
                                  .repeat = cell->repeat,
                                  .sweep = s->name, .evict = cell->evict,
                                  .evict_opts = cell->evict_opts, .loop = r->loop};
    memcpy(meta->id, cell->id, sizeof meta->id);
}

/* Commits a cell's outcome (finished or failed) and reports it. */
static int commit(struct run *r, const struct fk_sweep_cell *cell, int rrc,
                  struct fk_cell_result *res, double dt)
{
    const struct fk_sweep *s = r->s;
    struct fk_cell_meta meta;
    cell_meta(r, cell, &meta);
    struct fk_runner_cell_end e = {.cell = cell, .index = r->index, .todo = r->sum->todo,
                                   .wall_s = dt, .rel_err = NAN};
    char msg[1100];
    if (rrc < 0) {
        snprintf(msg, sizeof msg, "%s", fk_errmsg());
        r->sum->failed++;
        e.failed = 1;
        e.error = msg;
        e.eta_s = eta(r, r->est_done);
        if (r->o->hooks.cell_end)
            r->o->hooks.cell_end(r->o->hooks.ctx, s, &e);
        if (fk_results_commit_failed(s->output, &meta, "failed", msg) < 0) {
            snprintf(msg, sizeof msg, "%s", fk_errmsg());
            return fk_err(FK_EIO, "results: %s", msg);
        }
        return FK_OK;
    }
    int cr = fk_results_commit(s->output, &meta, res);
    e.vectors = res->vectors;
    fk_cell_result_free(res);
    if (cr < 0) {
        snprintf(msg, sizeof msg, "%s", fk_errmsg());
        return fk_err(cr, "writing results (nothing of this cell was recorded as finished): %s",
                      msg);
    }
    fk_results_metric(s->output, cell->id, "rel_err_mean", &e.rel_err);
    r->est_done += r->est_cell;
    r->sum->done++;
    e.eta_s = eta(r, r->est_done);
    if (r->o->hooks.cell_end)
        r->o->hooks.cell_end(r->o->hooks.ctx, s, &e);
    return FK_OK;
}

/* Runs cell c; sets sum->interrupted when a stop was asked for. */
static int run_cell(struct run *r, int c)
{
    const struct fk_sweep *s = r->s;
    const struct fk_sweep_cell *cell = &s->cells[c];
    FK_TRY(load_dataset(r, cell));
    r->cell = cell;
    r->index = r->sum->done + r->sum->failed + 1;
    r->t_cell = fk_wall_s();
    r->est_cell = cell_weight(s, cell);
    if (r->o->hooks.cell_start)
        r->o->hooks.cell_start(r->o->hooks.ctx, s, cell, r->index, r->sum->todo);
    struct fk_replay_opts ro = {.jobs = s->jobs, .attention = s->attention,
                                .attn_stride = s->attn_stride, .attn_layers = s->attn_layers,
                                .recall = s->recall, .recall_every = s->recall_every,
                                .stop = r->o->stop, .progress = on_unit, .progress_ctx = r,
                                .pool = r->pool};
    struct fk_cell_input in = cell_input(r, cell);
    struct fk_cell_result res;
    double c0 = fk_wall_s();
    int rrc = fk_replay_cell(&in, &ro, &res);
    struct fk_cell_loop loop = {0};
    const struct loaded *L = &r->ld[cell->dataset];
    if (rrc == FK_OK && L->loop) { /* a model dataset: the codec in the loop too */
        rrc = fk_runner_loop_cell(L->loop, &in, &loop);
        if (rrc < 0)
            fk_cell_result_free(&res);
        r->loop = rrc == FK_OK ? &loop : NULL;
    }
    double dt = fk_wall_s() - c0;
    if (rrc == FK_EINTR || (r->o->stop && *r->o->stop)) {
        if (rrc == FK_OK)
            fk_cell_result_free(&res);
        r->sum->interrupted = 1;
        return FK_OK;
    }
    int crc = commit(r, cell, rrc, &res, dt);
    r->loop = NULL;
    fk_runner_loop_free(&loop);
    FK_TRY(crc);
    if (fk_results_tables(s->output, r->ids, s->n_cells, s->cost_baseline) < 0)
        return fk_err(FK_EIO, "writing cells.csv: %s", fk_errmsg());
    return FK_OK;
}

int fk_runner_run(const struct fk_sweep *s, const struct fk_runner_opts *o,
                  struct fk_runner_summary *sum)
{
    *sum = (struct fk_runner_summary){0};
    struct run r = {.s = s, .o = o, .sum = sum, .t_start = fk_wall_s()};
    int rc = prepare(&r);
    if (rc == FK_OK && o->hooks.start)
        o->hooks.start(o->hooks.ctx, s, sum->todo);
    for (int c = 0; rc == FK_OK && c < s->n_cells && !sum->interrupted; c++) {
        if (o->stop && *o->stop) {
            sum->interrupted = 1;
            break;
        }
        if (!r.shard || !in_shard(&r, c))
            continue;
        /* claimed first: another run on this directory may be computing it (a cell that
         * is finished, by an earlier run or meanwhile, comes back FK_CLAIM_DONE) */
        char holder[256];
        int cl = fk_results_claim(s->output, s->cells[c].id, o->force, holder, sizeof holder);
        if (cl == FK_CLAIM_DONE) {
            sum->skipped++;
        } else if (cl == FK_CLAIM_HELD) {
            sum->elsewhere++;
            if (o->hooks.claimed)
                o->hooks.claimed(o->hooks.ctx, &s->cells[c], holder);
        } else if (cl == FK_CLAIM_OK) {
            rc = run_cell(&r, c);
            fk_results_unclaim(s->output, s->cells[c].id);
        } else {
            rc = cl;
        }
    }
    if (r.prepared && fk_results_tables(s->output, r.ids, s->n_cells, s->cost_baseline) < 0 &&
        rc == FK_OK)
        rc = fk_err(FK_EIO, "writing cells.csv: %s", fk_errmsg());
    fk_replay_pool_free(&r.pool);
    free_loaded(&r);
    free(r.ids);
    free(r.shard);
    sum->wall_s = fk_wall_s() - r.t_start;
    return rc;
}
