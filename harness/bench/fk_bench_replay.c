/* SPDX-License-Identifier: MIT
 * The replay benchmark (fk_bench_replay.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "bench/fk_bench_replay.h"
#include "common/fk_clock.h"
#include "common/fk_err.h"
#include "core/fk_codec.h"
#include "core/fk_registry.h"
#include "engine/fk_replay.h"
#include "engine/fk_sweep.h"
#include "formats/fk_basis.h"
#include "formats/fk_dict.h"
#include "formats/fk_trace.h"
#include "kernels/fk_blas.h"
#include "store/fk_results.h"

void fk_bench_replay_defaults(struct fk_bench_replay_cfg *cfg)
{
    *cfg = (struct fk_bench_replay_cfg){.config = "configs/bench-3b.toml", .ref_layers = 2,
                                        .scale_layers = 8, .rounds = 3, .kernel = 1,
                                        .attention = 1};
}

/* The data of one benchmark run. */
struct bench {
    const struct fk_bench_replay_cfg *cfg;
    struct fk_sweep *s;
    struct fk_dataset *ds;       /* the dataset replayed (cfg->dataset, else the first) */
    int d;                       /* its index */
    struct fk_trace **tr;
    struct fk_dict *dict;
    struct fk_basis_file *basis; /* the dataset's basis, when it names one */
    struct fk_calib_file *calib; /* the dataset's calibration, when it names one */
    struct fk_replay_pool *pool; /* Gram buffers from run to run, as in a sweep */
    const struct fk_trace_info *ti;
    const struct fk_codec_ops *ref; /* the reference codec (reference_codec) */
};

double fk_bench_median(const double *v, int n)
{
    double t[FK_BENCH_MAX_ROUNDS];
    memcpy(t, v, sizeof(double) * (size_t)n);
    return fk_bench_median_sort(t, n);
}

static long peak_rss_kib(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

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

static void sum_streams(const struct fk_cell_result *r, struct fk_bench_timing *t)
{
    t->io += r->t_io;
    t->attn += r->t_attn;
    t->metrics += r->t_metrics;
    t->gram += r->t_gram;
    t->policy += r->t_policy;
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

/* One replay of in; its timing is added to t (nullable). */
static int run(struct bench *b, const struct fk_cell_input *in, int jobs, int attention,
               int reference, const uint8_t *layers, struct fk_cell_result *res,
               struct fk_bench_timing *t)
{
    struct fk_replay_opts ro = {.jobs = jobs, .attention = attention,
                                .attn_stride = layers ? 16 : b->s->attn_stride, .recall = 0,
                                .recall_every = 8, .reference = reference, .layers = layers,
                                .row_hashes = layers != NULL, .pool = b->pool};
    double t0 = fk_wall_s();
    int rc = fk_replay_cell(in, &ro, res);
    if (t)
        t->wall += fk_wall_s() - t0;
    if (rc == FK_OK && t)
        sum_streams(res, t);
    return rc;
}

static int open_data(struct bench *b)
{
    const struct fk_bench_replay_cfg *cfg = b->cfg;
    const char *no_attn_set[1] = {"sweep.attention=false"}; /* cell ids include it */
    FK_TRY(fk_sweep_load(cfg->config, no_attn_set, !cfg->attention, 1, &b->s));
    if (cfg->jobs > 0)
        b->s->jobs = cfg->jobs;
    for (b->d = 0; cfg->dataset && b->d < b->s->n_datasets; b->d++)
        if (!strcmp(b->s->datasets[b->d].name, cfg->dataset))
            break;
    if (b->d == b->s->n_datasets) {
        char names[512] = "";
        for (int d = 0; d < b->s->n_datasets; d++)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", d ? ", " : "",
                     b->s->datasets[d].name);
        return fk_err(FK_EINVAL, "--dataset %s: %s has no such dataset (it has %s)",
                      cfg->dataset, cfg->config, names);
    }
    b->ds = &b->s->datasets[b->d];
    b->tr = calloc((size_t)b->ds->n_traces, sizeof *b->tr);
    if (!b->tr)
        return fk_err(FK_ENOMEM, "out of memory");
    for (int i = 0; i < b->ds->n_traces; i++)
        FK_TRY(fk_trace_open(b->ds->traces[i], &b->tr[i]));
    if (b->ds->dict)
        FK_TRY(fk_dict_load(b->ds->dict, &b->dict));
    if (b->ds->basis)
        FK_TRY(fk_basis_load(b->ds->basis, &b->basis));
    if (b->ds->calib)
        FK_TRY(fk_calib_load(b->ds->calib, &b->calib));
    FK_TRY(fk_results_prepare(b->s->output));
    FK_TRY(fk_replay_pool_new(&b->pool));
    b->ti = fk_trace_get_info(b->tr[0]);
    return FK_OK;
}

static void close_data(struct bench *b)
{
    fk_replay_pool_free(&b->pool);
    for (int i = 0; b->tr && i < b->ds->n_traces; i++)
        fk_trace_close(&b->tr[i]);
    free(b->tr);
    fk_dict_free(&b->dict);
    fk_basis_free(&b->basis);
    fk_calib_free(&b->calib);
    fk_sweep_free(&b->s);
}

static struct fk_cell_input cell_input(const struct bench *b, const struct fk_codec_ops *ops,
                                       const void *opts)
{
    return (struct fk_cell_input){.ops = ops, .opts = opts, .traces = b->tr,
                                  .n_traces = b->ds->n_traces,
                                  .dict = (ops->caps & FK_CAP_DICT) ? b->dict : NULL,
                                  .basis = (ops->caps & FK_CAP_BASIS) ? b->basis : NULL,
                                  .calib = (ops->caps & FK_CAP_CALIB) ? b->calib : NULL};
}

/* "CODEC", "CODEC+POLICY", with "+merge" and "+think" for the prefill's row rewrites. */
static void cell_name(const struct fk_sweep_cell *cell, char *name, size_t size)
{
    const struct fk_rewrite *rw = cell->rewrite;
    snprintf(name, size, "%s%s%s%s%s", cell->ops->name, cell->evict ? "+" : "",
             cell->evict ? cell->evict->name : "",
             rw && rw->merge != FK_MERGE_NONE ? "+merge" : "", rw && rw->think > 0 ? "+think" : "");
}

/* The input of cell c (its codec, options, eviction policy and rewrites). */
static struct fk_cell_input sweep_cell_input(const struct bench *b, int c)
{
    const struct fk_sweep_cell *cell = &b->s->cells[c];
    struct fk_cell_input in = cell_input(b, cell->ops, cell->opts);
    in.evict = cell->evict; /* a token-eviction policy over the codec: "CODEC+POLICY" */
    in.evict_opts = cell->evict_opts;
    in.rewrite = cell->rewrite; /* and the prefill's row rewrites: "+merge", "+think" */
    return in;
}

/* Cell c of the config: timed, committed, and with overhead replayed without attention. */
static int bench_cell(struct bench *b, int c, const struct fk_bench_replay_hooks *h,
                      struct fk_bench_replay_result *out)
{
    const struct fk_sweep *s = b->s;
    const struct fk_sweep_cell *cell = &s->cells[c];
    struct fk_cell_input in = sweep_cell_input(b, c);
    char name[128];
    cell_name(cell, name, sizeof name);
    struct fk_cell_result res;
    struct fk_bench_cell_row row = {.codec = name};
    FK_TRY(run(b, &in, s->jobs, s->attention, 0, NULL, &res, &row.t));
    double w0 = fk_wall_s();
    struct fk_cell_meta meta = {.ops = cell->ops, .opts = cell->opts, .dataset = b->ds->name,
                                .traces = (const char *const *)b->ds->traces,
                                .n_traces = b->ds->n_traces, .dict = b->ds->dict,
                                .basis = (cell->ops->caps & FK_CAP_BASIS) ? b->ds->basis : NULL,
                                .calib = (cell->ops->caps & FK_CAP_CALIB) ? b->ds->calib : NULL,
                                .sweep = s->name, .repeat = cell->repeat,
                                .attn_stride = s->attention ? s->attn_stride : 0,
                                .evict = cell->evict, .evict_opts = cell->evict_opts,
                                .rewrite = cell->rewrite};
    memcpy(meta.id, cell->id, sizeof meta.id);
    int rc = fk_results_commit(s->output, &meta, &res);
    fk_cell_result_free(&res);
    row.t.write = fk_wall_s() - w0;
    row.t.wall += row.t.write;
    row.with_s = row.t.wall - row.t.write;
    out->total_wall += row.t.wall;
    if (rc == FK_OK && b->cfg->overhead && s->attention) {
        /* the same cell without attention, right away: both halves of the ratio see the
         * machine in the same state */
        struct fk_bench_timing t0 = {0};
        FK_TRY(run(b, &in, s->jobs, 0, 0, NULL, &res, &t0));
        fk_cell_result_free(&res);
        row.without_s = t0.wall;
        out->ov_with += row.with_s;
        out->ov_without += t0.wall;
    }
    if (rc == FK_OK && h && h->cell)
        h->cell(h->ctx, &row);
    return rc;
}

/* Cell c is run: it is the dataset's (another dataset's options are for other data) and
 * --only's codec. */
static int cell_wanted(const struct bench *b, int c)
{
    const struct fk_sweep_cell *cell = &b->s->cells[c];
    return cell->dataset == b->d && (!b->cfg->only || !strcmp(cell->ops->name, b->cfg->only));
}

static int bench_cells(struct bench *b, const struct fk_bench_replay_hooks *h,
                       struct fk_bench_replay_result *out)
{
    const struct fk_sweep *s = b->s;
    const char **ids = calloc((size_t)s->n_cells + 1, sizeof(char *));
    if (!ids)
        return fk_err(FK_ENOMEM, "out of memory");
    int n_ids = 0, rc = FK_OK;
    for (int c = 0; c < s->n_cells && rc == FK_OK; c++) {
        if (!cell_wanted(b, c))
            continue;
        rc = bench_cell(b, c, h, out);
        ids[n_ids++] = s->cells[c].id;
    }
    if (rc == FK_OK)
        rc = fk_results_tables(s->output, ids, n_ids, s->cost_baseline);
    free(ids);
    if (rc == FK_OK)
        out->cells_rss_kib = peak_rss_kib();
    return rc;
}

/* Coding rounds: in round r, every cell in turn on the layers l with l mod S = r mod S (S
 * shares of the layers; the same jobs as the cells, no attention, nothing written); each
 * cell's coding CPU of the round goes to out. Layers are independent streams, so S rounds
 * code every vector of the cells once more. */
static int coding_rounds(struct bench *b, struct fk_bench_replay_result *out)
{
    int L = b->ti->n_layers, R = b->cfg->coding_rounds;
    int S = b->cfg->coding_shares > 0 ? b->cfg->coding_shares : R;
    S = S > L ? L : S;
    out->coding_shares = S;
    uint8_t *mask = calloc((size_t)L, 1);
    if (!mask)
        return fk_err(FK_ENOMEM, "out of memory");
    int rc = FK_OK;
    for (int r = 0; r < R && rc == FK_OK; r++) {
        for (int l = 0; l < L; l++)
            mask[l] = l % S == r % S;
        int k = 0;
        for (int c = 0; c < b->s->n_cells && rc == FK_OK; c++) {
            if (!cell_wanted(b, c))
                continue;
            if (k == FK_BENCH_MAX_CELLS) {
                rc = fk_err(FK_EINVAL, "--coding-rounds: at most %d cells, the config has more",
                            FK_BENCH_MAX_CELLS);
                break;
            }
            struct fk_cell_input in = sweep_cell_input(b, c);
            struct fk_cell_result res;
            struct fk_bench_timing t = {0};
            rc = run(b, &in, b->s->jobs, 0, 0, mask, &res, &t);
            if (rc != FK_OK)
                break;
            fk_cell_result_free(&res);
            cell_name(&b->s->cells[c], out->round_cell[k], sizeof out->round_cell[k]);
            out->round_cpu[k][r] = t.gram + t.corr + t.code + t.adapt;
            out->round_vectors[k][r] = t.vectors;
            k++;
        }
        out->n_round_cells = k;
        if (rc == FK_OK)
            out->coding_rounds = r + 1;
    }
    free(mask);
    return rc;
}

/* The codec of the comparison and the rounds, and the one whose coding CPU the cells are
 * compared with: cfg->ref_codec, else the codec of the config's first cell that is static
 * and uses a dictionary (the full-OMP codec), else the first such registered codec. */
static int reference_codec(const struct bench *b, const struct fk_codec_ops **ops)
{
    const struct fk_sweep *s = b->s;
    const unsigned want = FK_CAP_STATIC | FK_CAP_DICT;
    const struct fk_codec_ops *o = b->cfg->ref_codec ? fk_codec_find(b->cfg->ref_codec) : NULL;
    if (b->cfg->ref_codec && !o)
        return fk_err(FK_EINVAL, "--ref-codec %s: no such codec (fadkv-bench codecs)",
                      b->cfg->ref_codec);
    for (int c = 0; !o && c < s->n_cells; c++)
        if ((s->cells[c].ops->caps & want) == want && s->cells[c].dataset == b->d)
            o = s->cells[c].ops;
    for (int i = 0; !o && fk_codecs[i]; i++)
        if ((fk_codecs[i]->caps & want) == want)
            o = fk_codecs[i];
    if (!o)
        return fk_err(FK_ENOTSUP, "no static dictionary codec to compare with its reference");
    *ops = o;
    return FK_OK;
}

/* The reference codec b->ref with the options of its last cell in the config, or its
 * defaults. *opts is malloc'd. */
static int pick_reference(const struct bench *b, const struct fk_codec_ops **ops, void **opts)
{
    const struct fk_sweep *s = b->s;
    const struct fk_codec_ops *o = b->ref;
    if (!(*opts = calloc(1, o->opts_size)))
        return fk_err(FK_ENOMEM, "out of memory");
    fk_opts_defaults(o, *opts);
    for (int c = 0; c < s->n_cells; c++) /* the last cell of that codec, as before */
        if (s->cells[c].ops == o && s->cells[c].dataset == b->d)
            memcpy(*opts, s->cells[c].opts, o->opts_size);
    *ops = o;
    return FK_OK;
}

/* Optimised vs reference mode on the layers of mask, one thread, no attention. */
static int compare_reference(struct bench *b, const struct fk_cell_input *in,
                             const uint8_t *mask, struct fk_bench_replay_result *out)
{
    struct fk_cell_result a, r;
    /* untimed: both worker slots of the pool hold their Gram buffers before any timed run,
     * so no run below pays first-touch page faults the other does not */
    FK_TRY(run(b, in, 2, 0, 0, mask, &a, NULL));
    fk_cell_result_free(&a);
    FK_TRY(run(b, in, 1, 0, 0, mask, &a, &out->opt));
    int rc = run(b, in, 1, 0, 1, mask, &r, &out->ref);
    if (rc == FK_OK) {
        rows_agree(&a, &r, &out->rows_same, &out->rows);
        fk_cell_result_free(&r);
        out->ref_done = 1;
    }
    fk_cell_result_free(&a);
    return rc;
}

/* One interleaved round: 1 thread, 2 threads, then the kernel on both data sets. */
static int round_once(struct bench *b, const struct fk_cell_input *in, const uint8_t *mask,
                      const struct fk_bench_omp_data *kd, int r,
                      struct fk_bench_replay_result *out)
{
    struct fk_cell_result a;
    struct fk_bench_timing t2 = {0};
    out->last1 = (struct fk_bench_timing){0};
    FK_TRY(run(b, in, 1, 0, 0, mask, &a, &out->last1));
    fk_cell_result_free(&a);
    FK_TRY(run(b, in, 2, 0, 0, mask, &a, &t2));
    out->supports_hash2 = supports_hash(&a, mask);
    fk_cell_result_free(&a);
    out->vps1[r] = out->last1.vectors / out->last1.wall;
    out->vps2[r] = t2.vectors / t2.wall;
    out->scale[r] = out->last1.wall / t2.wall;
    for (int k = 0; k < 2 && b->cfg->kernel; k++) {
        struct fk_bench_omp_result kres;
        FK_TRY(fk_bench_omp_run(&out->kernel_cfg, &kd[k], &kres, NULL));
        out->kernel_vps[k][r] = kres.e2e_vps;
        out->kernel_ratio[k][r] = out->vps1[r] / kres.e2e_vps;
    }
    out->rounds = r + 1;
    return FK_OK;
}

/* Interleaved rounds: each ratio is taken within a round, from measurements seconds apart,
 * and the caller reports the median over rounds (one measurement of each side minutes
 * apart can be far off on a shared machine). */
static int scaling_rounds(struct bench *b, const struct fk_cell_input *in, uint8_t *mask,
                          struct fk_bench_replay_result *out)
{
    memset(mask, 0, (size_t)b->ti->n_layers);
    for (int l = 0; l < b->ti->n_layers && l < b->cfg->scale_layers; l++)
        mask[l] = 1;
    struct fk_bench_omp_cfg *kc = &out->kernel_cfg;
    fk_bench_omp_defaults(kc);
    kc->n_atoms = b->dict->n_atoms;
    kc->dim = b->dict->head_dim;
    const struct fk_option *os = fk_codec_role(in->ops, FK_ROLE_SPARSITY);
    kc->sparsity = os ? (int)fk_opts_get(in->opts, os) : kc->sparsity;
    kc->threads = 1;
    kc->repeats = 3;
    kc->naive_signals = 0;
    struct fk_bench_omp_data kd[2];
    memset(kd, 0, sizeof kd);
    int rc = FK_OK;
    if (b->cfg->kernel) {
        rc = fk_bench_omp_data_make(kc, &kd[0]);
        /* layer 0's K dictionary and the K rows of its decode tokens, in replay order */
        if (rc == FK_OK)
            rc = kernel_trace_data(b->tr[0], b->dict, &kd[1]);
        out->kernel_trace_signals = kd[1].n_signals;
        out->kernel_done = rc == FK_OK;
    }
    int R = b->cfg->rounds < 1 ? 1 : b->cfg->rounds > FK_BENCH_MAX_ROUNDS ? FK_BENCH_MAX_ROUNDS
                                                                         : b->cfg->rounds;
    for (int r = 0; r < R && rc == FK_OK; r++)
        rc = round_once(b, in, mask, kd, r, out);
    fk_bench_omp_data_clear(&kd[0]);
    fk_bench_omp_data_clear(&kd[1]);
    return rc;
}

static int bench_reference(struct bench *b, struct fk_bench_replay_result *out)
{
    if (!b->dict || b->cfg->ref_layers <= 0)
        return FK_OK;
    const struct fk_codec_ops *ops = NULL;
    void *opts = NULL;
    FK_TRY(pick_reference(b, &ops, &opts));
    uint8_t *mask = calloc((size_t)b->ti->n_layers, 1);
    int rc = mask ? FK_OK : fk_err(FK_ENOMEM, "out of memory");
    for (int l = 0; rc == FK_OK && l < b->ti->n_layers && l < b->cfg->ref_layers; l++)
        mask[l] = 1;
    struct fk_cell_input in = cell_input(b, ops, opts);
    out->ref_codec = ops->name;
    if (rc == FK_OK)
        rc = compare_reference(b, &in, mask, out);
    if (rc == FK_OK)
        rc = scaling_rounds(b, &in, mask, out);
    free(mask);
    free(opts);
    return rc;
}

int fk_bench_replay_run(const struct fk_bench_replay_cfg *cfg,
                        const struct fk_bench_replay_hooks *hooks,
                        struct fk_bench_replay_result *out)
{
    *out = (struct fk_bench_replay_result){0};
    struct bench b = {.cfg = cfg};
    int rc = open_data(&b);
    if (rc == FK_OK) /* a bad --ref-codec is refused before any cell */
        rc = reference_codec(&b, &b.ref);
    if (rc == FK_OK && hooks && hooks->info) {
        struct fk_bench_replay_info in = {
            .n_traces = b.ds->n_traces, .n_layers = b.ti->n_layers,
            .n_q_heads = b.ti->n_q_heads, .n_kv_heads = b.ti->n_kv_heads,
            .head_dim = b.ti->head_dim, .n_tokens = b.ti->n_tokens,
            .prompt_len = b.ti->prompt_len, .n_atoms = b.dict ? b.dict->n_atoms : 0,
            .jobs = b.s->jobs, .attention = b.s->attention, .attn_stride = b.s->attn_stride,
            .kernels = fk_blas_kernels(), .ref_codec = b.ref->name};
        hooks->info(hooks->ctx, &in);
    }
    if (rc == FK_OK)
        rc = bench_cells(&b, hooks, out);
    if (rc == FK_OK && cfg->coding_rounds > 0)
        rc = coding_rounds(&b, out);
    if (rc == FK_OK)
        rc = bench_reference(&b, out);
    close_data(&b);
    out->peak_rss_kib = peak_rss_kib();
    return rc;
}
