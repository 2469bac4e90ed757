/* SPDX-License-Identifier: MIT
 * The metric table and the aggregation of a cell (fk_metrics.h). Aggregation rules: spec
 * algorithms.md section 10; every column's definition: the table below, printed by
 * `fadkv-bench metrics` (docs/RESULTS.md).
 */
#include "store/fk_metrics.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/fk_err.h"
#include "core/fk_registry.h"
#include "store/fk_results.h"
#include "store/fk_results_loop.h"

/* ---- the cell's own aggregation (FK_AGG_CELL) ----------------------------------------------------------------------- */

struct headline {
    double rel_err_mean, rel_err_k, rel_err_v;
    double energy_ratio;
    double attn_cos, attn_cos_p5, attn_relerr, attn_kl, top[3], attn_mass;
    double attn_n, attn_skipped;
    double inactive_after_prefill, inactive_k, inactive_v;
    double inactive_overlap, pool_recall[FK_RECALL_NS];
    double err_ratio;
    double bytes_per_seq, bytes_full_per_seq, bytes_codes, bytes_buf, bytes_dict_seq;
    double tokens_per_seq, bytes_per_token, macs_per_vec, cpu_us_per_vec;
    double bytes_tok_head, bytes_tok_head_avg, bits_per_elem, bits_per_elem_avg, bytes_model;
    double bytes_uncounted;
    double tok_heads, avg_heads, avg_sum, model_sum; /* sums behind the per-head bytes */
    double appends, replacements, adapt_failed, growth_capped, collateral_reencodes;
    double saturated, premature, guarded;
    double t_corr, t_code, t_adapt;
    double vectors, zero_vectors;
    double attn_rkl, attn_retained, retained_frac; /* eviction (docs/RESULTS.md) */
    double wall_s, t_io, t_encode, t_attn, t_metrics, t_gram, t_policy; /* the cell's times */
};

static double stream_err(const struct fk_stream_result *s, double sum)
{
    return s->n_vectors ? sum / s->n_vectors : NAN;
}

/* Mean over values that are not NaN. */
struct mean {
    double s;
    long n;
};
static void mean_add(struct mean *m, double v)
{
    if (!isnan(v)) {
        m->s += v;
        m->n++;
    }
}
static double mean_get(const struct mean *m) { return m->n ? m->s / m->n : NAN; }

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Means over the streams of a cell (per-stream values, K and V apart where needed). */
struct stream_means {
    struct mean kind_err[2], inact[2], rec[FK_RECALL_NS], overlap;
    double res2, x2, macs, cpu;
    double scr_err, omp_err;     /* screened and full OMP errors summed over every stream */
};

/* Inactive-set overlap (Jaccard) of stream s with the same stream of later prompts, Fig. 1d. */
static void add_overlap(const struct fk_cell_result *r, int t, int l, int k,
                        struct mean *overlap)
{
    int T = r->n_traces, L = r->n_layers;
    const struct fk_stream_result *s = &r->streams[((size_t)t * L + l) * 2 + k];
    for (int u = t + 1; u < T; u++) {
        const struct fk_stream_result *o = &r->streams[((size_t)u * L + l) * 2 + k];
        if (!s->inactive || !o->inactive || s->st.n_base != o->st.n_base)
            continue;
        long inter = 0, uni = 0;
        for (int j = 0; j < s->st.n_base; j++) {
            inter += s->inactive[j] && o->inactive[j];
            uni += s->inactive[j] || o->inactive[j];
        }
        mean_add(overlap, uni ? (double)inter / uni : NAN);
    }
}

/* Adds one stream (trace t, layer l, kind k) to the means and the totals of h. */
static void add_stream(const struct fk_cell_result *r, int t, int l, int k,
                       struct stream_means *m, struct mean *over_tr, struct headline *h)
{
    int T = r->n_traces;
    const struct fk_stream_result *s = &r->streams[((size_t)t * r->n_layers + l) * 2 + k];
    mean_add(over_tr, stream_err(s, s->err_sum));
    mean_add(&m->inact[k], s->inactive_after_prefill);
    for (int q = 0; q < FK_RECALL_NS; q++)
        mean_add(&m->rec[q], s->recall[q]);
    m->scr_err += s->screen_err_scr;
    m->omp_err += s->screen_err_omp;
    m->res2 += s->res2_sum;
    m->x2 += s->x2_sum;
    m->macs += s->st.macs;
    m->cpu += s->cpu_s;
    h->vectors += s->n_vectors;
    h->zero_vectors += s->n_zero;
    h->bytes_codes += s->st.bytes_codes / T;
    h->bytes_buf += s->bytes_buf / T;
    h->bytes_dict_seq += s->st.bytes_dict_seq / T;
    h->bytes_uncounted += s->st.bytes_uncounted / T;
    h->bytes_full_per_seq += s->bytes_full / T;
    if (k == 0) /* per (trace, layer): T H token-heads */
        h->tok_heads += (double)s->n_tokens * s->n_heads;
    if (!isnan(s->bytes_tok_avg)) {
        h->avg_sum += s->bytes_tok_avg;
        h->avg_heads += (double)s->n_heads / 2; /* K and V of one layer count one head */
    }
    if (t == 0)
        h->model_sum += s->st.bytes_model;
    h->appends += s->st.appends;
    h->replacements += s->st.replacements;
    h->adapt_failed += s->st.adapt_failed;
    h->growth_capped += s->st.growth_capped;
    h->collateral_reencodes += s->st.collateral_reencodes;
    h->saturated += s->st.saturated;
    h->premature += s->st.premature;
    h->guarded += s->st.guarded;
    h->t_corr += s->st.t_corr;
    h->t_code += s->st.t_code;
    h->t_adapt += s->st.t_adapt;
    add_overlap(r, t, l, k, &m->overlap);
}

/* Headline values of the streams: errors, dictionary, bytes, cost. */
static void aggregate_streams(const struct fk_cell_result *r, struct headline *h)
{
    int T = r->n_traces, L = r->n_layers;
    struct stream_means m;
    memset(&m, 0, sizeof m);
    for (int k = 0; k < 2; k++) {
        for (int l = 0; l < L; l++) {
            struct mean over_tr = {0};
            for (int t = 0; t < T; t++)
                add_stream(r, t, l, k, &m, &over_tr, h);
            mean_add(&m.kind_err[k], mean_get(&over_tr));
        }
    }
    h->rel_err_k = mean_get(&m.kind_err[0]);
    h->rel_err_v = mean_get(&m.kind_err[1]);
    h->rel_err_mean = (h->rel_err_k + h->rel_err_v) / 2;
    h->energy_ratio = m.x2 > 0 ? m.res2 / m.x2 : NAN;
    h->inactive_k = mean_get(&m.inact[0]);
    h->inactive_v = mean_get(&m.inact[1]);
    struct mean ia = {m.inact[0].s + m.inact[1].s, m.inact[0].n + m.inact[1].n};
    h->inactive_after_prefill = mean_get(&ia);
    h->inactive_overlap = mean_get(&m.overlap);
    for (int q = 0; q < FK_RECALL_NS; q++)
        h->pool_recall[q] = mean_get(&m.rec[q]);
    /* a ratio of means over every recall vector of the cell: sum e_screened / sum e_omp
     * (a mean of per-stream ratios lets one stream with a near-zero OMP error dominate) */
    h->err_ratio = m.omp_err > 0 ? m.scr_err / m.omp_err : NAN;
    h->bytes_per_seq = h->bytes_codes + h->bytes_buf + h->bytes_dict_seq;
    for (int t = 0; t < T; t++)
        h->tokens_per_seq += (double)r->streams[(size_t)t * L * 2].n_tokens / T;
    h->bytes_per_token = h->tokens_per_seq > 0 ? h->bytes_per_seq / h->tokens_per_seq : NAN;
    /* per token per KV head (K and V together, mean over layers), families.md 0.1.6 */
    int hd = r->streams ? r->streams[0].head_dim : 0;
    h->bytes_tok_head = h->tok_heads > 0 ? h->bytes_per_seq * T / h->tok_heads : NAN;
    h->bytes_tok_head_avg = h->avg_heads > 0 ? h->avg_sum / h->avg_heads : NAN;
    h->bits_per_elem = hd > 0 ? h->bytes_tok_head * 8 / (2.0 * hd) : NAN;
    h->bits_per_elem_avg = hd > 0 ? h->bytes_tok_head_avg * 8 / (2.0 * hd) : NAN;
    h->bytes_model = h->model_sum;
    long vec = h->vectors + h->zero_vectors;
    h->macs_per_vec = vec ? m.macs / vec : NAN;
    h->cpu_us_per_vec = vec ? m.cpu / vec * 1e6 : NAN;
}

/* The 5% quantile of every attention cosine of the cell and the mean attention mass. */
static int attn_p5_mass(const struct fk_cell_result *r, long nvals, struct headline *h)
{
    size_t n_acc = (size_t)r->n_traces * r->n_layers;
    h->attn_cos_p5 = NAN;
    h->attn_mass = h->attn_rkl = h->attn_retained = NAN;
    if (nvals <= 0)
        return FK_OK;
    double *all = malloc(sizeof(double) * (size_t)nvals);
    if (!all) /* a cell without its percentile is not a finished cell */
        return fk_err(FK_ENOMEM, "out of memory (attention percentiles of %ld values)", nvals);
    double mass = 0, rkl = 0, ret = 0;
    long k = 0;
    for (size_t i = 0; i < n_acc; i++) {
        mass += r->attn[i].mass_sum;
        rkl += r->attn[i].rkl_sum;
        ret += r->attn[i].retained_sum;
        for (long j = 0; j < r->attn[i].n && r->attn[i].cos_vals; j++)
            all[k++] = r->attn[i].cos_vals[j];
    }
    if (k > 0) {
        qsort(all, (size_t)k, sizeof *all, cmp_double);
        double pos = 0.05 * (k - 1);
        long lo = (long)floor(pos);
        long hi = lo + 1 < k ? lo + 1 : lo;
        h->attn_cos_p5 = all[lo] + (pos - lo) * (all[hi] - all[lo]);
    }
    h->attn_mass = mass / nvals;
    h->attn_rkl = rkl / nvals;
    h->attn_retained = ret / nvals;
    free(all);
    return FK_OK;
}

/* Attention fidelity: mean over heads -> layers -> traces; p5 over all values. */
static int aggregate_attn(const struct fk_cell_result *r, struct headline *h)
{
    int T = r->n_traces, L = r->n_layers;
    struct mean a_tr[6] = {{0}};
    long nvals = 0;
    for (int t = 0; t < T; t++) {
        struct mean a_l[6] = {{0}};
        for (int l = 0; l < L; l++) {
            const struct fk_attn_acc *a = &r->attn[(size_t)t * L + l];
            h->attn_skipped += a->skipped_steps;
            h->attn_n += a->n;
            nvals += a->n;
            if (!a->n)
                continue;
            mean_add(&a_l[0], a->cos_sum / a->n);
            mean_add(&a_l[1], a->relerr_sum / a->n);
            mean_add(&a_l[2], a->kl_sum / a->n);
            for (int q = 0; q < 3; q++)
                mean_add(&a_l[3 + q], a->top_sum[q] / a->n);
        }
        for (int q = 0; q < 6; q++)
            mean_add(&a_tr[q], mean_get(&a_l[q]));
    }
    h->attn_cos = mean_get(&a_tr[0]);
    h->attn_relerr = mean_get(&a_tr[1]);
    h->attn_kl = mean_get(&a_tr[2]);
    for (int q = 0; q < 3; q++)
        h->top[q] = mean_get(&a_tr[3 + q]);
    return attn_p5_mass(r, nvals, h);
}

/* The headline metrics of a cell (spec algorithms.md section 10). */
static int aggregate(const struct fk_cell_result *r, struct headline *h)
{
    memset(h, 0, sizeof *h);
    aggregate_streams(r, h);
    /* retained fraction: rows kept at the end over rows seen (the K streams; V has the same
     * mask) */
    double kept = 0, rows = 0;
    for (size_t i = 0; i < (size_t)r->n_traces * r->n_layers; i++) {
        const struct fk_stream_result *sk = &r->streams[2 * i];
        kept += sk->n_kept;
        rows += (double)sk->n_heads * sk->n_tokens;
    }
    h->retained_frac = rows > 0 ? kept / rows : NAN;
    h->wall_s = r->wall_s;
    h->t_io = r->t_io;
    h->t_encode = r->t_encode;
    h->t_attn = r->t_attn;
    h->t_metrics = r->t_metrics;
    h->t_gram = r->t_gram;
    h->t_policy = r->t_policy;
    return aggregate_attn(r, h);
}


/* ---- summary rows (row getters) ------------------------------------------------------- */

#define ROW(name, expr)                                                                   \
    static double row_##name(const struct fk_metric_row *r)                               \
    {                                                                                     \
        const struct fk_stream_result *s = r->s;                                          \
        const struct fk_attn_acc *a = r->a;                                               \
        (void)s;                                                                          \
        (void)a;                                                                          \
        return (expr);                                                                    \
    }

ROW(rel_err_mean, stream_err(s, s->err_sum))
ROW(rel_err_enc_mean, stream_err(s, s->err_enc_sum))
ROW(rel_err_final_mean, stream_err(s, s->err_final_sum))
ROW(energy_ratio, s->x2_sum > 0 ? s->res2_sum / s->x2_sum : NAN)
ROW(nnz_mean, stream_err(s, s->nnz_sum))
ROW(attn_cos, a->n ? a->cos_sum / a->n : NAN)
ROW(attn_kl, a->n ? a->kl_sum / a->n : NAN)
ROW(attn_relerr, a->n ? a->relerr_sum / a->n : NAN)
ROW(attn_mass, a->n ? a->mass_sum / a->n : NAN)
ROW(top1_overlap, a->n ? a->top_sum[0] / a->n : NAN)
ROW(top8_overlap, a->n ? a->top_sum[1] / a->n : NAN)
ROW(top32_overlap, a->n ? a->top_sum[2] / a->n : NAN)
ROW(dict_size_norm_final, r->dict && s->st.n_base ? (double)s->st.n_atoms / s->st.n_base : NAN)
ROW(inactive_after_prefill, s->inactive_after_prefill)
ROW(gini, s->gini)
ROW(adapted_share, s->adapted_share)
ROW(pool_recall_256, s->recall[5])
ROW(support_agree, s->support_agree)
ROW(err_ratio, s->err_ratio)
ROW(bytes, s->st.bytes_codes + s->bytes_buf + s->st.bytes_dict_seq)
ROW(bytes_full, s->bytes_full)
ROW(appends, (double)s->st.appends)
ROW(replacements, (double)s->st.replacements)
ROW(adapt_failed, (double)s->st.adapt_failed)
ROW(cpu_s, s->cpu_s)
ROW(macs, s->st.macs)
ROW(loop_attn_cos, r->loop[0])
ROW(loop_attn_kl, r->loop[1])
ROW(e2e_kl, r->loop[2])
ROW(e2e_top1, r->loop[3])
ROW(e2e_nll_diff, r->loop[4])
#undef ROW

/* ---- the table ------------------------------------------------------------------------ */

#define H(f) offsetof(struct headline, f)
#define HI(f, i) (offsetof(struct headline, f) + (size_t)(i) * sizeof(double))
#define B(r, a) {r, a}
#define NOB B(0, 0)
#define GATE FK_MF_GATE
/* name, unit, group, better, aggregation, cell, row getter, flags, bands (aggregate, row),
 * definition. The bands: about two to three times the largest difference measured across
 * OpenBLAS and BLIS kernel sets, a -Dsimd=generic and a clang build on the gate's sweep,
 * configs/default.toml and configs/families.toml (tools/measure_spread.sh, 7 December 2026;
 * docs/PORTABILITY.md), with an absolute part where small values move by whole rounding
 * steps (an FP8 step of a near-exact code, one atom of 128), 1e-6 relative where nothing
 * moved, one unit for counts; the closed loop's (no model dataset measured): those of their
 * open-loop counterparts. */
const char *const fk_metric_groups[] = {"error", "attention", "memory", "cost", "dictionary",
                                        "eviction", "closed loop", "run", NULL};

const struct fk_metric fk_metrics[] = {
    /* error */
    {"rel_err_mean", "", "error", -1, FK_AGG_CELL, H(rel_err_mean), row_rel_err_mean, GATE,
     B(6e-3, 5e-4), B(1.5e-1, 5e-3),
     "mean relative error ||x - x_hat|| / ||x|| of the stored rows; cell: (rel_err_k + "
     "rel_err_v) / 2"},
    {"rel_err_k", "", "error", -1, FK_AGG_CELL, H(rel_err_k), NULL, 0, NOB, NOB,
     "keys: mean over layers of the mean over traces of each stream's mean relative error "
     "(coded nonzero rows; with an eviction policy those retained at the end)"},
    {"rel_err_v", "", "error", -1, FK_AGG_CELL, H(rel_err_v), NULL, 0, NOB, NOB,
     "values: as rel_err_k"},
    {"rel_err_enc_mean", "", "error", -1, FK_AGG_STREAMS, 0, row_rel_err_enc_mean, GATE,
     B(8e-3, 1e-5), B(1e-1, 5e-5),
     "the same error before coefficient quantisation (what adaptation sees); cell: mean over "
     "streams"},
    {"rel_err_final_mean", "", "error", -1, FK_AGG_STREAMS, 0, row_rel_err_final_mean, GATE,
     B(6e-3, 5e-4), B(1.5e-1, 5e-3),
     "every compressed row's error re-measured at the end with the codec's final state; "
     "cell: mean over streams"},
    {"energy_ratio", "", "error", -1, FK_AGG_CELL, H(energy_ratio), row_energy_ratio, GATE,
     B(2e-3, 1e-4), B(5e-2, 5e-4),
     "sum ||x - x_hat||^2 / sum ||x||^2 pooled over every coded vector"},
    {"nnz_mean", "coefficients", "error", 0, FK_AGG_STREAMS, 0, row_nnz_mean, GATE,
     B(2e-3, 1e-6), B(1.5e-2, 1e-6),
     "stored coefficients per coded vector (s for sparse codes, m for full); cell: mean over "
     "streams"},
    /* attention */
    {"attn_cos", "", "attention", 1, FK_AGG_CELL, H(attn_cos), row_attn_cos, GATE,
     B(1e-4, 1e-7), B(6e-4, 1e-6),
     "cosine of the exact and the compressed attention output; cell: mean over traces of "
     "the mean over layers of the mean over evaluations"},
    {"attn_cos_p5", "", "attention", 1, FK_AGG_CELL, H(attn_cos_p5), NULL, 0, NOB, NOB,
     "5 % quantile of every evaluation's attention cosine of the cell"},
    {"attn_kl", "nats", "attention", -1, FK_AGG_CELL, H(attn_kl), row_attn_kl, GATE,
     B(1e-4, 1e-6), B(1e-3, 2e-6),
     "KL(P || P_hat) of the attention weights, averaged as attn_cos; empty once an eviction "
     "policy drops a key P weighs (use attn_rkl)"},
    {"attn_relerr", "", "attention", -1, FK_AGG_CELL, H(attn_relerr), row_attn_relerr, GATE,
     B(5e-3, 3e-4), B(2e-2, 1.5e-3),
     "||o - o_hat|| / ||o|| of the attention output, averaged as attn_cos"},
    {"attn_mass", "probability", "attention", 0, FK_AGG_CELL, H(attn_mass), row_attn_mass,
     GATE, B(1e-6, 1e-9), B(1e-6, 1e-9),
     "exact attention mass on the compressed keys, mean over every evaluation"},
    {"top1_overlap", "", "attention", 1, FK_AGG_CELL, HI(top, 0), row_top1_overlap, GATE,
     B(5e-5, 1e-7), B(5e-4, 1e-6),
     "top-1 overlap of the exact and compressed attention, averaged as attn_cos"},
    {"top8_overlap", "", "attention", 1, FK_AGG_CELL, HI(top, 1), row_top8_overlap, GATE,
     B(5e-5, 1e-7), B(5e-4, 1e-6), "top-8 overlap, as top1_overlap"},
    {"top32_overlap", "", "attention", 1, FK_AGG_CELL, HI(top, 2), row_top32_overlap, GATE,
     B(2e-4, 1e-7), B(1e-3, 1e-6), "top-32 overlap, as top1_overlap"},
    /* dictionary */
    {"dict_size_norm_final", "", "dictionary", 0, FK_AGG_STREAMS, 0, row_dict_size_norm_final,
     GATE, B(1e-6, 1e-9), B(1e-6, 1e-9),
     "N_t / N at the end of the trace (1: no growth); cell: mean over streams"},
    {"inactive_after_prefill", "", "dictionary", 0, FK_AGG_CELL, H(inactive_after_prefill),
     row_inactive_after_prefill, GATE, B(1e-1, 2e-3), B(1.5e-1, 4e-2),
     "share of the N base atoms no prefill code used; cell: mean over every K and V stream"},
    {"inactive_k", "", "dictionary", 0, FK_AGG_CELL, H(inactive_k), NULL, 0, NOB, NOB,
     "inactive_after_prefill of the key streams"},
    {"inactive_v", "", "dictionary", 0, FK_AGG_CELL, H(inactive_v), NULL, 0, NOB, NOB,
     "inactive_after_prefill of the value streams"},
    {"inactive_overlap", "", "dictionary", 0, FK_AGG_CELL, H(inactive_overlap), NULL, 0, NOB,
     NOB, "Jaccard overlap of the inactive sets of one (layer, kind) across the dataset's "
     "traces, mean over pairs"},
    {"gini", "", "dictionary", 0, FK_AGG_STREAMS, 0, row_gini, GATE, B(4e-2, 1e-6),
     B(1e-1, 1e-6), "Gini coefficient of the atoms' total use counts; cell: mean over streams"},
    {"adapted_share", "", "dictionary", 0, FK_AGG_STREAMS, 0, row_adapted_share, GATE,
     B(3e-1, 1e-4), B(4.0, 1e-3),
     "share of the coefficient uses on adapted (appended or replaced) atoms"},
    {"pool_recall_8", "", "dictionary", 1, FK_AGG_CELL, HI(pool_recall, 0), NULL, 0, NOB, NOB,
     "screened-pool recall at n = 8: the share of full OMP's support ranked below n by "
     "|D^T x| (every recall_every-th prefill token; recall = true)"},
    {"pool_recall_16", "", "dictionary", 1, FK_AGG_CELL, HI(pool_recall, 1), NULL, 0, NOB, NOB,
     "screened-pool recall at n = 16"},
    {"pool_recall_32", "", "dictionary", 1, FK_AGG_CELL, HI(pool_recall, 2), NULL, 0, NOB, NOB,
     "screened-pool recall at n = 32"},
    {"pool_recall_64", "", "dictionary", 1, FK_AGG_CELL, HI(pool_recall, 3), NULL, 0, NOB, NOB,
     "screened-pool recall at n = 64"},
    {"pool_recall_128", "", "dictionary", 1, FK_AGG_CELL, HI(pool_recall, 4), NULL, 0, NOB,
     NOB, "screened-pool recall at n = 128"},
    {"pool_recall_256", "", "dictionary", 1, FK_AGG_CELL, HI(pool_recall, 5), row_pool_recall_256,
     GATE, B(1e-6, 1e-9), B(1e-6, 1e-9), "screened-pool recall at n = 256"},
    {"pool_recall_512", "", "dictionary", 1, FK_AGG_CELL, HI(pool_recall, 6), NULL, 0, NOB,
     NOB, "screened-pool recall at n = 512"},
    {"pool_recall_1024", "", "dictionary", 1, FK_AGG_CELL, HI(pool_recall, 7), NULL, 0, NOB,
     NOB, "screened-pool recall at n = 1024"},
    {"support_agree", "", "dictionary", 1, FK_AGG_STREAMS, 0, row_support_agree, GATE,
     B(3e-2, 1e-9), B(3e-1, 1e-9),
     "|S_screened & S_omp| / |S_omp| of reference OMP in the cell's top-n pool against full "
     "OMP on the base dictionary; cell: mean over streams"},
    {"err_ratio", "", "dictionary", -1, FK_AGG_CELL, H(err_ratio), row_err_ratio, GATE,
     B(1.0, 1e-6), B(2.5, 1e-6),
     "sum e_screened / sum e_omp of the same reference codes (> 1: the pool misses atoms)"},
    /* memory */
    {"bytes_per_seq", "bytes", "memory", -1, FK_AGG_CELL, H(bytes_per_seq), NULL, 0, NOB, NOB,
     "bytes_codes + bytes_buf + bytes_dict_seq: one sequence's cache at the end, every layer, "
     "K and V"},
    {"bytes_full_per_seq", "bytes", "memory", 0, FK_AGG_CELL, H(bytes_full_per_seq), NULL, 0,
     NOB, NOB, "the same cache exact in fp16: T H m 2 per layer and kind, mean over traces"},
    {"bytes_codes", "bytes", "memory", -1, FK_AGG_CELL, H(bytes_codes), NULL, 0, NOB, NOB,
     "stored codes per sequence (with an eviction policy the retained rows only)"},
    {"bytes_buf", "bytes", "memory", -1, FK_AGG_CELL, H(bytes_buf), NULL, 0, NOB, NOB,
     "exact rows still in the window at the end, fp16, per sequence"},
    {"bytes_dict_seq", "bytes", "memory", -1, FK_AGG_CELL, H(bytes_dict_seq), NULL, 0, NOB, NOB,
     "per-sequence side state: a dictionary's, ThinK's channel masks (think), per sequence"},
    {"tokens_per_seq", "tokens", "memory", 0, FK_AGG_CELL, H(tokens_per_seq), NULL, 0, NOB, NOB,
     "mean T over the traces"},
    {"bytes_per_token", "bytes", "memory", -1, FK_AGG_CELL, H(bytes_per_token), NULL, 0, NOB,
     NOB, "bytes_per_seq / tokens_per_seq (every layer, K and V)"},
    {"bytes_tok_head", "bytes", "memory", -1, FK_AGG_CELL, H(bytes_tok_head), NULL, 0, NOB, NOB,
     "bytes per token per KV head per layer, K and V together, at the end of the trace"},
    {"bytes_tok_head_avg", "bytes", "memory", -1, FK_AGG_CELL, H(bytes_tok_head_avg), NULL, 0,
     NOB, NOB, "its time average over decode steps t of B(t) / (t + 1), per KV head"},
    {"bits_per_elem", "bits", "memory", -1, FK_AGG_CELL, H(bits_per_elem), NULL, 0, NOB, NOB,
     "bytes_tok_head x 8 / (2 m): bits per cached element (16 = fp16)"},
    {"bits_per_elem_avg", "bits", "memory", -1, FK_AGG_CELL, H(bits_per_elem_avg), NULL, 0, NOB,
     NOB, "the same of bytes_tok_head_avg"},
    {"bytes_model", "bytes", "memory", 0, FK_AGG_CELL, H(bytes_model), NULL, 0, NOB, NOB,
     "model-level constants the cell reads (universal dictionary, PCA basis), fp16, once"},
    {"bytes_uncounted", "bytes", "memory", 0, FK_AGG_CELL, H(bytes_uncounted), NULL, 0, NOB,
     NOB, "per-sequence state the cell's accounting leaves out of bytes_per_seq (fadkv's "
     "mem_mode = paper: replaced atoms and activity counted free); 0 when every byte is "
     "counted, and figures and tables say so for cells where it is not"},
    {"bytes", "bytes", "memory", -1, FK_AGG_NONE, 0, row_bytes, GATE, B(8e-3, 1e-6),
     B(6e-2, 1e-6), "codes + exact window + dictionary state of the stream at the end"},
    {"bytes_full", "bytes", "memory", 0, FK_AGG_NONE, 0, row_bytes_full, GATE, B(1e-9, 0),
     B(1e-9, 0), "T H m 2: the stream exact in fp16"},
    /* cost */
    {"macs_per_vec", "multiply-adds", "cost", -1, FK_AGG_CELL, H(macs_per_vec), NULL, 0, NOB,
     NOB, "the codec's analytical cost model per vector (empty without one)"},
    {"cpu_us_per_vec", "us", "cost", -1, FK_AGG_CELL, H(cpu_us_per_vec), NULL, FK_MF_TIMING,
     NOB, NOB, "measured encoder thread CPU time per vector"},
    {"macs", "multiply-adds", "cost", -1, FK_AGG_NONE, 0, row_macs, GATE, B(5e-2, 1),
     B(4e-1, 1), "analytical cost summed over the stream's vectors"},
    {"cpu_s", "s", "cost", -1, FK_AGG_NONE, 0, row_cpu_s, FK_MF_TIMING, NOB, NOB,
     "encoder thread CPU time of the stream"},
    {"t_corr", "s", "cost", -1, FK_AGG_CELL, H(t_corr), NULL, FK_MF_META_ONLY | FK_MF_TIMING,
     NOB, NOB, "thread CPU time in correlation products (dictionary codecs)"},
    {"t_code", "s", "cost", -1, FK_AGG_CELL, H(t_code), NULL, FK_MF_META_ONLY | FK_MF_TIMING,
     NOB, NOB, "thread CPU time in screening, OMP, refinement and quantisation"},
    {"t_adapt", "s", "cost", -1, FK_AGG_CELL, H(t_adapt), NULL, FK_MF_META_ONLY | FK_MF_TIMING,
     NOB, NOB, "thread CPU time in adaptation"},
    /* counts */
    {"appends", "atoms", "dictionary", 0, FK_AGG_CELL, H(appends), row_appends, GATE,
     B(1e-6, 1), B(1e-6, 1), "atoms appended, over every stream"},
    {"replacements", "atoms", "dictionary", 0, FK_AGG_CELL, H(replacements), row_replacements,
     GATE, B(1e-6, 2), B(1e-6, 2), "atoms replaced, over every stream"},
    {"adapt_failed", "", "dictionary", -1, FK_AGG_CELL, H(adapt_failed), row_adapt_failed,
     GATE, B(1e-6, 1), B(1e-6, 1), "adaptations attempted and refused"},
    {"growth_capped", "", "dictionary", 0, FK_AGG_CELL, H(growth_capped), NULL, 0, NOB, NOB,
     "appends refused by growth_cap"},
    {"collateral_reencodes", "", "dictionary", 0, FK_AGG_CELL, H(collateral_reencodes), NULL, 0,
     NOB, NOB, "codes re-encoded because an atom they used was replaced (fadkv)"},
    {"saturated", "", "error", 0, FK_AGG_CELL, H(saturated), NULL, 0, NOB, NOB,
     "FP8 coefficients saturated to +-448"},
    {"premature", "", "dictionary", 0, FK_AGG_CELL, H(premature), NULL, 0, NOB, NOB,
     "sparse codes that stopped before s atoms (no candidate atom left)"},
    {"guarded", "", "dictionary", 0, FK_AGG_CELL, H(guarded), NULL, 0, NOB, NOB,
     "sparse codes OMP's precision guard cut to their best prefix of atoms"},
    /* run */
    {"vectors", "vectors", "run", 0, FK_AGG_CELL, H(vectors), NULL, FK_MF_INT, NOB, NOB,
     "coded nonzero vectors of the cell"},
    {"zero_vectors", "vectors", "run", 0, FK_AGG_CELL, H(zero_vectors), NULL, FK_MF_INT, NOB,
     NOB, "all-zero vectors of the cell"},
    {"attn_evals", "", "run", 0, FK_AGG_CELL, H(attn_n), NULL, FK_MF_INT, NOB, NOB,
     "attention evaluations (step x query head)"},
    {"attn_skipped_steps", "steps", "run", 0, FK_AGG_CELL, H(attn_skipped), NULL, FK_MF_INT,
     NOB, NOB, "evaluation steps with nothing compressed yet"},
    {"wall_s", "s", "run", 0, FK_AGG_CELL, H(wall_s), NULL, FK_MF_TIMING, NOB, NOB,
     "wall time of the cell"},
    /* eviction */
    {"attn_rkl", "nats", "eviction", -1, FK_AGG_CELL, H(attn_rkl), NULL, 0, NOB, NOB,
     "reverse KL(P_hat || P), mean over every evaluation; -log of the retained mass under "
     "pure eviction"},
    {"attn_retained", "probability", "eviction", 1, FK_AGG_CELL, H(attn_retained), NULL, 0, NOB,
     NOB, "exact attention mass on the keys a policy retains (1 without one)"},
    {"retained_frac", "", "eviction", 0, FK_AGG_CELL, H(retained_frac), NULL, 0, NOB, NOB,
     "rows (token, KV head) retained at the end over all rows (1 without a policy)"},
    /* closed loop (model datasets; empty otherwise) */
    {"e2e_kl", "nats", "closed loop", -1, FK_AGG_LOOP, 0, row_e2e_kl, GATE, B(1e-4, 1e-6),
     B(1e-3, 2e-6), "KL(exact || codec) of the next-token distributions, teacher-forced, "
     "mean over steps and prompts"},
    {"e2e_kl_max", "nats", "closed loop", -1, FK_AGG_LOOP, 1, NULL, 0, NOB, NOB,
     "its largest step"},
    {"e2e_top1", "", "closed loop", 1, FK_AGG_LOOP, 2, row_e2e_top1, GATE, B(5e-5, 1e-7),
     B(5e-4, 1e-6), "share of teacher-forced steps whose argmax agrees with the exact model's"},
    {"e2e_nll_exact", "nats", "closed loop", 0, FK_AGG_LOOP, 3, NULL, 0, NOB, NOB,
     "-log p(next reference id) of the exact model, mean over steps"},
    {"e2e_nll_codec", "nats", "closed loop", -1, FK_AGG_LOOP, 4, NULL, 0, NOB, NOB,
     "the same with the codec in the loop"},
    {"e2e_nll_diff", "nats", "closed loop", -1, FK_AGG_LOOP, 5, row_e2e_nll_diff, GATE,
     B(1e-4, 1e-6), B(1e-3, 2e-6), "e2e_nll_codec - e2e_nll_exact"},
    {"e2e_ppl_ratio", "", "closed loop", -1, FK_AGG_LOOP, 6, NULL, 0, NOB, NOB,
     "exp(e2e_nll_diff): the perplexity ratio"},
    {"free_first_diverge", "steps", "closed loop", 1, FK_AGG_LOOP, 7, NULL, 0, NOB, NOB,
     "free running: the first step whose token differs from the exact decode's, mean over "
     "prompts (the step count when none)"},
    {"free_diverged", "", "closed loop", -1, FK_AGG_LOOP, 8, NULL, 0, NOB, NOB,
     "share of prompts whose free-running decode diverged"},
    {"free_token_agree", "", "closed loop", 1, FK_AGG_LOOP, 9, NULL, 0, NOB, NOB,
     "share of free-running tokens equal to the exact decode's"},
    {"loop_attn_cos", "", "closed loop", 1, FK_AGG_LOOP, 10, row_loop_attn_cos, GATE,
     B(1e-4, 1e-7), B(6e-4, 1e-6), "teacher-forced attention output cosine in the loop"},
    {"loop_attn_kl", "nats", "closed loop", -1, FK_AGG_LOOP, 11, row_loop_attn_kl, GATE,
     B(1e-4, 1e-6), B(1e-3, 2e-6), "teacher-forced attention KL in the loop"},
    {"loop_steps", "steps", "closed loop", 0, FK_AGG_LOOP, 12, NULL, 0, NOB, NOB,
     "steps of the loop over every prompt"},
    /* from the cell's other values */
    {"bytes_ratio_full", "", "memory", -1, FK_AGG_TABLE, 0, NULL, 0, NOB, NOB,
     "bytes_per_seq / bytes_full_per_seq"},
    {"bits_per_elem_1k", "bits", "memory", -1, FK_AGG_TABLE, 0, NULL, 0, NOB, NOB,
     "bits_per_elem with the model constants (bytes_model) shared by 1,000 sequences of the "
     "cell's length: bits_per_elem x (bytes_per_seq + bytes_model / 1000) / bytes_per_seq"},
    {"cost_mac_rel", "", "cost", -1, FK_AGG_TABLE, 0, NULL, 0, NOB, NOB,
     "macs_per_vec over the cost reference cell's (the first cell of cost_baseline on the "
     "same dataset and s)"},
    {"cpu_time_rel", "", "cost", -1, FK_AGG_TABLE, 0, NULL, FK_MF_TIMING, NOB, NOB,
     "cpu_us_per_vec over the cost reference cell's"},
    /* the cell's times (.meta only) */
    {"t_io", "s", "run", 0, FK_AGG_CELL, H(t_io), NULL, FK_MF_META_ONLY | FK_MF_TIMING, NOB,
     NOB, "trace reading, summed over workers"},
    {"t_encode", "s", "run", 0, FK_AGG_CELL, H(t_encode), NULL, FK_MF_META_ONLY | FK_MF_TIMING,
     NOB, NOB, "encode calls, summed over workers"},
    {"t_attn", "s", "run", 0, FK_AGG_CELL, H(t_attn), NULL, FK_MF_META_ONLY | FK_MF_TIMING, NOB,
     NOB, "attention fidelity, summed over workers"},
    {"t_metrics", "s", "run", 0, FK_AGG_CELL, H(t_metrics), NULL,
     FK_MF_META_ONLY | FK_MF_TIMING, NOB, NOB, "the other observers, summed over workers"},
    {"t_gram", "s", "run", 0, FK_AGG_CELL, H(t_gram), NULL, FK_MF_META_ONLY | FK_MF_TIMING, NOB,
     NOB, "Gram matrices, summed over workers"},
    {"t_policy", "s", "run", 0, FK_AGG_CELL, H(t_policy), NULL, FK_MF_META_ONLY | FK_MF_TIMING,
     NOB, NOB, "the eviction policy's hooks, summed over workers"},
    {NULL, NULL, NULL, 0, FK_AGG_NONE, 0, NULL, 0, NOB, NOB, NULL},
};
#undef H
#undef HI
#undef B
#undef NOB
#undef GATE

int fk_metric_count(void)
{
    int n = 0;
    while (fk_metrics[n].name)
        n++;
    return n;
}

const struct fk_metric *fk_metric_find(const char *name)
{
    for (int i = 0; fk_metrics[i].name; i++)
        if (!strcmp(fk_metrics[i].name, name))
            return &fk_metrics[i];
    return NULL;
}

/* The mean of metric m's row value over every stream of r (kind, layer, trace order). */
static double streams_mean(const struct fk_cell_result *r, const struct fk_metric *m, int dict)
{
    static const double no_loop[5] = {NAN, NAN, NAN, NAN, NAN};
    struct mean acc = {0};
    int T = r->n_traces, L = r->n_layers;
    for (int k = 0; k < 2; k++)
        for (int l = 0; l < L; l++)
            for (int t = 0; t < T; t++) {
                struct fk_metric_row row = {
                    .s = &r->streams[((size_t)t * L + l) * 2 + k],
                    .a = &r->attn[(size_t)t * L + l], .loop = no_loop, .dict = dict};
                mean_add(&acc, m->row(&row));
            }
    return mean_get(&acc);
}

/* Metrics a codec's family does not define are empty (NaN), never zero: the dictionary's
 * size and adaptation counters without a dictionary, early-stopped codes without sparse
 * codes, FP8 saturations without FP8 coefficients, and the analytical cost without a cost
 * model. */
static void undefined_empty(const struct fk_codec_ops *ops, const void *opts, double *v)
{
    static const char *const dict[] = {"dict_size_norm_final", "appends", "replacements",
                                       "adapt_failed", "growth_capped",
                                       "collateral_reencodes", NULL};
    static const char *const sparse[] = {"premature", "guarded", NULL};
    /* every options struct starts with the common options; a codec whose table does not
     * list coef keeps it 0 (fp32) */
    int fp8 = ((const struct fk_common_opts *)opts)->coef == FK_COEF_FP8;
    for (int i = 0; fk_metrics[i].name; i++) {
        const char *n = fk_metrics[i].name;
        for (int j = 0; !(ops->caps & FK_CAP_DICT) && dict[j]; j++)
            if (!strcmp(n, dict[j]))
                v[i] = NAN;
        for (int j = 0; !(ops->caps & FK_CAP_SPARSE) && sparse[j]; j++)
            if (!strcmp(n, sparse[j]))
                v[i] = NAN;
        if (!fp8 && !strcmp(n, "saturated"))
            v[i] = NAN;
        if (!ops->estimate_macs && !strcmp(n, "macs_per_vec") && v[i] == 0)
            v[i] = NAN;
    }
}

int fk_metrics_cell(const struct fk_cell_result *r, const struct fk_cell_loop *loop,
                    const struct fk_codec_ops *ops, const void *opts, double *v)
{
    struct headline h;
    FK_TRY(aggregate(r, &h));
    double lh[FK_LOOP_NHEAD];
    fk_results_loop_head(loop, lh);
    int dict = (ops->caps & FK_CAP_DICT) != 0;
    for (int i = 0; fk_metrics[i].name; i++) {
        const struct fk_metric *m = &fk_metrics[i];
        v[i] = NAN;
        if (m->agg == FK_AGG_CELL)
            v[i] = *(const double *)(const void *)((const char *)&h + m->cell);
        else if (m->agg == FK_AGG_STREAMS)
            v[i] = streams_mean(r, m, dict);
        else if (m->agg == FK_AGG_LOOP)
            v[i] = lh[m->cell];
    }
    undefined_empty(ops, opts, v);
    return FK_OK;
}
