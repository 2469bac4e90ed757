/* SPDX-License-Identifier: MIT
 * The replay engine (see fk_replay.h). Spec: algorithms.md sections 4 and 10.
 */
#include "common/fk_clock.h"
#include "engine/fk_replay.h"

#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/fk_err.h"
#include "kernels/fk_sparse.h"

static pthread_mutex_t h5_lock = PTHREAD_MUTEX_INITIALIZER; /* HDF5 calls are serialised */

#define STATIC_BLOCK 32 /* decode tokens per block of a static codec (x KV heads vectors) */

struct fk_stream_result *fk_cell_stream(struct fk_cell_result *r, int trace, int layer,
                                        int kind)
{
    return &r->streams[((size_t)trace * r->n_layers + layer) * 2 + kind];
}

/* ---- Gram buffer pool ------------------------------------------------------------------ */

struct fk_replay_pool {
    int n;             /* worker slots */
    float *(*gram)[2]; /* [n] the K and V Gram buffers of worker j */
    size_t *cap;       /* [n] their capacity in floats */
};

int fk_replay_pool_new(struct fk_replay_pool **out)
{
    *out = calloc(1, sizeof **out);
    return *out ? FK_OK : fk_err(FK_ENOMEM, "out of memory");
}

static void pool_release(struct fk_replay_pool *p)
{
    for (int j = 0; j < p->n; j++) {
        free(p->gram[j][0]);
        free(p->gram[j][1]);
        p->gram[j][0] = p->gram[j][1] = NULL;
        p->cap[j] = 0;
    }
}

void fk_replay_pool_free(struct fk_replay_pool **pool)
{
    if (!pool || !*pool)
        return;
    pool_release(*pool);
    free((*pool)->gram);
    free((*pool)->cap);
    free(*pool);
    *pool = NULL;
}

size_t fk_replay_pool_bytes(const struct fk_replay_pool *pool)
{
    size_t b = 0;
    for (int j = 0; pool && j < pool->n; j++)
        b += (size_t)(pool->gram[j][0] != NULL) * pool->cap[j] * sizeof(float) +
             (size_t)(pool->gram[j][1] != NULL) * pool->cap[j] * sizeof(float);
    return b;
}

/* Room for `jobs` worker slots (new slots empty). */
static int pool_reserve(struct fk_replay_pool *p, int jobs)
{
    if (jobs <= p->n)
        return FK_OK;
    float *(*g)[2] = realloc(p->gram, sizeof *g * (size_t)jobs);
    if (g)
        p->gram = g;
    size_t *c = realloc(p->cap, sizeof *c * (size_t)jobs);
    if (c)
        p->cap = c;
    if (!g || !c)
        return fk_err(FK_ENOMEM, "out of memory");
    for (int j = p->n; j < jobs; j++) {
        g[j][0] = g[j][1] = NULL;
        c[j] = 0;
    }
    p->n = jobs;
    return FK_OK;
}

/* ---- per-worker state ------------------------------------------------------------------ */

struct worker {
    const struct fk_cell_input *in;
    const struct fk_replay_opts *ro;
    struct fk_cell_result *res;
    pthread_mutex_t *lock;       /* protects next, err, progress */
    int *next;                   /* next layer to take */
    int *units_done;             /* finished units */
    int units_total;
    long *vectors_done;          /* vectors coded in finished units */
    int *failed;                 /* first error code, 0 if none */
    char *errmsg;                /* first error message */
    /* buffers */
    void *kv[2];                 /* [H_kv][T][m] exact keys, values as stored in the trace
                                  * (16-bit words of a float16 / bfloat16 trace: half the
                                  * memory of float32 and exact) */
    enum fk_encoding kv_enc[2];
    float *xrow;                 /* [m] one exact row converted to float32 */
    float *q;                    /* [H_q][n_qsel][m] the query rows of the attention steps */
    int n_qsel;
    int32_t *qidx;               /* [Tq] query_token_idx, then the selected rows */
    int32_t *qrow;               /* [T] row in q of each attention step's token, or -1 */
    int32_t *evict_step;         /* [T] decode step evicting each token (-1: prefill/never) */
    float *x;                    /* event vectors [max_ev][m] */
    int32_t *tok, *head;         /* [max_ev] */
    struct fk_vec_out *out;      /* [max_ev] */
    float *qbuf;                 /* [H_q][m] */
    float *rec;                  /* [m] */
    struct fk_attn_scratch *as;
    float *gram[2];              /* [N][N] Gram buffers of K and V, reused across units (a fresh
                                  * 64 MiB buffer per unit costs more in page faults than the
                                  * SSYRK itself) */
    size_t cap_gram;
    int pooled;                  /* gram[] came from (and go back to) the pool's slot */
    size_t cap_kv, cap_kv1;      /* capacities of kv in bytes */
    size_t cap_q, cap_ev, cap_ev_n; /* capacities in elements */
    double t_io, t_encode, t_attn, t_metrics, t_gram;
};

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return FK_OK;
    void *n = realloc(*p, need * elem);
    if (!n)
        return fk_err(FK_ENOMEM, "out of memory (%zu bytes)", need * elem);
    *p = n;
    *cap = need;
    return FK_OK;
}

static void worker_free(struct worker *w)
{
    free(w->kv[0]);
    free(w->kv[1]);
    free(w->xrow);
    free(w->q);
    free(w->qidx);
    free(w->qrow);
    free(w->evict_step);
    free(w->x);
    free(w->tok);
    free(w->head);
    free(w->out);
    free(w->qbuf);
    free(w->rec);
    free(w->gram[0]);
    free(w->gram[1]);
    fk_attn_scratch_free(&w->as);
}

/* ---- metrics helpers ------------------------------------------------------------------ */

static int hist_bin(uint32_t v)
{
    int b = 0;
    while (v && b < FK_HIST_BINS - 1) {
        v >>= 1;
        b++;
    }
    return b;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* Activity metrics from the codec's per-atom counters (spec 10.2). */
static int activity(struct fk_stream_result *sr, const struct fk_stream_stats *st)
{
    sr->inactive_after_prefill = sr->gini = sr->top10_share = sr->adapted_share = NAN;
    if (!st->use_total || st->n_atoms <= 0)
        return FK_OK;
    int N = st->n_base, Nt = st->n_atoms;
    if (sr->n_prefill_coded > 0) {
        long inact = 0;
        sr->inactive = malloc((size_t)N);
        if (!sr->inactive)
            return fk_err(FK_ENOMEM, "out of memory");
        for (int j = 0; j < N; j++) {
            sr->inactive[j] = st->prefill_use[j] == 0;
            inact += sr->inactive[j];
        }
        sr->inactive_after_prefill = (double)inact / N;
    }
    uint32_t *u = malloc(sizeof(uint32_t) * (size_t)Nt);
    if (!u)
        return fk_err(FK_ENOMEM, "out of memory");
    double total = 0;
    for (int j = 0; j < Nt; j++) {
        u[j] = st->use_total[j];
        total += u[j];
        sr->hist_total[hist_bin(st->use_total[j])]++;
        if (j < N)
            sr->hist_prefill[hist_bin(st->prefill_use[j])]++;
    }
    if (total > 0) {
        qsort(u, (size_t)Nt, sizeof *u, cmp_u32);
        double cum = 0, top = 0;
        int top_n = (Nt + 9) / 10;
        for (int j = 0; j < Nt; j++) {
            cum += (2.0 * (j + 1) - Nt - 1) * u[j];
            if (j >= Nt - top_n)
                top += u[j];
        }
        sr->gini = cum / (Nt * total);
        sr->top10_share = top / total;
        sr->adapted_share = st->uses_total ? (double)st->uses_adapted / st->uses_total : 0;
    }
    free(u);
    return FK_OK;
}

/* Screened-pool recall of full-OMP supports on the base dictionary (spec 10.4), on every
 * `every`-th prefill token of every head, plus the correlation profile (Fig. 1b). */
static int pool_recall(struct fk_stream_result *sr, const struct fk_base_dict *b,
                       const void *X, enum fk_encoding enc, float *xrow, int H, int T, int P,
                       int every, int s, int n_cell)
{
    for (int i = 0; i < FK_RECALL_NS; i++)
        sr->recall[i] = NAN;
    sr->support_agree = sr->err_ratio = NAN;
    if (P <= 0 || s < 1)
        return FK_OK;
    int m = b->m, N = b->n_atoms;
    if (s > m)
        s = m;
    if (n_cell < s)
        n_cell = s;
    if (n_cell > N)
        n_cell = N;
    size_t wf = fk_omp_work_floats(N, m, s) + 2 * (size_t)N;
    float *work = malloc(sizeof(float) * wf);
    float *a = malloc(sizeof(float) * (size_t)N);
    float *absa = malloc(sizeof(float) * (size_t)N);
    int32_t *pool = malloc(sizeof(int32_t) * (size_t)N);
    double *prof = calloc(256, sizeof(double));
    if (!work || !a || !absa || !pool || !prof) {
        free(work), free(a), free(absa), free(pool), free(prof);
        return fk_err(FK_ENOMEM, "out of memory (recall)");
    }
    struct fk_dict_view v = {.m = m, .n_atoms = N, .atoms = b->atoms, .dead = b->dead};
    double rec[FK_RECALL_NS] = {0}, agree = 0, e_omp = 0, e_scr = 0;
    long cnt = 0;
    int rc = FK_OK;
    for (int h = 0; h < H && rc == FK_OK; h++) {
        for (int t = 0; t < P && rc == FK_OK; t += every) {
            const float *x = fk_stored_row(X, enc, (size_t)h * T + t, m, xrow);
            struct fk_code full, scr;
            fk_correlate(&v, x, 1, a);
            rc = fk_omp_naive(&v, x, a, NULL, 0, s, 0, work, &full);
            if (rc < 0 || full.k == 0 || (full.flags & FK_CODE_ZERO))
                continue;
            for (int j = 0; j < N; j++)
                absa[j] = fabsf(a[j]);
            double amax = 0;
            for (int j = 0; j < N; j++)
                amax = absa[j] > amax ? absa[j] : amax;
            /* rank of each support atom: #{i: |a_i| > |a_j| or (== and i < j)} */
            for (int k = 0; k < full.k; k++) {
                int j = full.idx[k];
                long rank = 0;
                for (int i = 0; i < N; i++)
                    rank += absa[i] > absa[j] || (absa[i] == absa[j] && i < j);
                for (int q = 0; q < FK_RECALL_NS; q++)
                    rec[q] += rank < (8L << q) ? 1.0 / full.k : 0;
            }
            /* screened coder at the cell's n: support agreement and error ratio */
            int np = fk_topn(a, b->dead, N, n_cell, 1, pool, work);
            for (int q = 0; q < 256 && q < np; q++)
                prof[q] += amax > 0 ? absa[pool[q]] / amax : 0;
            rc = fk_omp_naive(&v, x, a, pool, np, s, 0, work, &scr);
            if (rc < 0)
                break;
            int common = 0;
            for (int p = 0; p < scr.k; p++)
                for (int k = 0; k < full.k; k++)
                    common += scr.idx[p] == full.idx[k];
            agree += (double)common / full.k;
            e_omp += sqrt(full.err2 / full.xx);
            e_scr += sqrt(scr.err2 / scr.xx);
            cnt++;
        }
    }
    if (rc == FK_OK && cnt > 0) {
        for (int q = 0; q < FK_RECALL_NS; q++)
            sr->recall[q] = rec[q] / cnt;
        sr->support_agree = agree / cnt;
        sr->err_ratio = e_omp > 0 ? e_scr / e_omp : NAN;
        for (int q = 0; q < 256; q++)
            prof[q] /= cnt;
        sr->corr_profile = prof;
        prof = NULL;
    }
    sr->recall_n = cnt;
    free(work), free(a), free(absa), free(pool), free(prof);
    return rc;
}

/* ---- one (trace, layer) ---------------------------------------------------------------- */

/* Encodes tokens a..b-1 of every head as one event. tok_step (nullable): the decode step at
 * which each token is evicted, for the per-step error series (blocks of a static codec run
 * ahead of their eviction); otherwise every vector belongs to `step`. */
static int encode_range(struct worker *w, const struct fk_codec_ops *ops, void *state, int kind,
                        const void *X, int H, int T, int m, int a, int b, int phase, int step,
                        const int32_t *tok_step, struct fk_stream_result *sr)
{
    int n = (b - a) * H;
    if (n <= 0)
        return FK_OK;
    size_t cx = w->cap_ev, ct = w->cap_ev_n, ch = w->cap_ev_n, co = w->cap_ev_n;
    FK_TRY(grow((void **)&w->x, &cx, (size_t)n * m, sizeof(float)));
    FK_TRY(grow((void **)&w->tok, &ct, (size_t)n, sizeof(int32_t)));
    FK_TRY(grow((void **)&w->head, &ch, (size_t)n, sizeof(int32_t)));
    FK_TRY(grow((void **)&w->out, &co, (size_t)n, sizeof(struct fk_vec_out)));
    w->cap_ev = cx;
    w->cap_ev_n = ct;
    int i = 0;
    for (int t = a; t < b; t++)
        for (int h = 0; h < H; h++, i++) {
            float *xi = w->x + (size_t)i * m;
            const float *src = fk_stored_row(X, w->kv_enc[kind], (size_t)h * T + t, m, xi);
            if (src != xi)
                memcpy(xi, src, sizeof(float) * (size_t)m);
            w->tok[i] = t;
            w->head[i] = h;
        }
    struct fk_event ev = {.phase = phase, .step = step, .n = n, .x = w->x, .token = w->tok,
                          .head = w->head};
    double c0 = fk_clock_s(CLOCK_THREAD_CPUTIME_ID);
    int rc = ops->encode(state, &ev, w->out);
    double c1 = fk_clock_s(CLOCK_THREAD_CPUTIME_ID);
    sr->cpu_s += c1 - c0;
    w->t_encode += c1 - c0;
    if (rc < 0)
        return fk_err_context(rc, "%s encode (layer, kind %s, tokens %d..%d)", ops->name,
                              kind ? "V" : "K", a, b - 1);
    for (i = 0; i < n; i++) {
        const struct fk_vec_out *o = &w->out[i];
        if (o->flags & FK_VEC_ZERO) {
            sr->n_zero++;
            continue;
        }
        const float *x = w->x + (size_t)i * m;
        double xx = 0;
        for (int c = 0; c < m; c++)
            xx += (double)x[c] * x[c];
        sr->n_vectors++;
        sr->n_prefill_coded += phase == 0;
        sr->err_sum += o->err;
        sr->err_enc_sum += o->err_enc;
        sr->res2_sum += (double)o->err * o->err * xx;
        sr->x2_sum += xx;
        sr->nnz_sum += o->nnz;
        int vs = tok_step ? tok_step[w->tok[i]] : step;
        if (phase == 1 && vs >= 0 && vs < sr->n_steps) {
            sr->step_err[vs] += o->err;
            sr->step_n[vs]++;
        }
    }
    w->t_metrics += fk_clock_s(CLOCK_THREAD_CPUTIME_ID) - c1;
    return FK_OK;
}

/* A static codec's decode blocks, ahead of time: replays the eviction schedule from comp
 * and, whenever an eviction reaches past what is encoded, encodes the next block (at least
 * STATIC_BLOCK tokens and the whole eviction, at most up to final_comp) with that
 * eviction's step: the blocks and steps it would get if encoded during the decode loop. */
static int encode_static_blocks(struct worker *w, const struct fk_codec_ops *ops, void *state,
                                int kind, int H, int T, int m, int P, int n_b, int a_len,
                                int comp, int final_comp, struct fk_stream_result *sr)
{
    int encoded = comp;
    for (int t = P; t < T; t++) {
        if (t - comp < n_b)
            continue;
        int ne = a_len < t - comp ? a_len : t - comp;
        if (comp + ne > encoded) {
            int end = encoded + STATIC_BLOCK;
            end = end < comp + ne ? comp + ne : end;
            end = end > final_comp ? final_comp : end;
            FK_TRY(encode_range(w, ops, state, kind, w->kv[kind], H, T, m, encoded, end, 1,
                                t - P, w->evict_step, sr));
            encoded = end;
        }
        comp += ne;
    }
    return FK_OK;
}

/* Reads K or V of one layer as stored into w->kv[k] (grown to fit n values). */
static int read_kv_locked(struct worker *w, struct fk_trace *t, int layer, int k, size_t n)
{
    enum fk_kind kind = k ? FK_KIND_V : FK_KIND_K;
    pthread_mutex_lock(&h5_lock);
    int rc = fk_trace_encoding(t, layer, kind, &w->kv_enc[k]);
    if (rc == FK_OK) {
        size_t *cap = k ? &w->cap_kv1 : &w->cap_kv;
        rc = grow(&w->kv[k], cap, n * fk_enc_size(w->kv_enc[k]), 1);
    }
    if (rc == FK_OK)
        rc = fk_trace_read_stored(t, layer, kind, w->kv[k]);
    pthread_mutex_unlock(&h5_lock);
    return rc;
}

static int read_query_rows_locked(struct fk_trace *t, int layer, const int32_t *rows, int n,
                                  float *dst)
{
    pthread_mutex_lock(&h5_lock);
    int rc = fk_trace_read_query_rows(t, layer, rows, n, dst);
    pthread_mutex_unlock(&h5_lock);
    return rc;
}

static int replay_layer(struct worker *w, int ti, int layer, const struct fk_base_dict *bases)
{
    const struct fk_cell_input *in = w->in;
    const struct fk_replay_opts *ro = w->ro;
    const struct fk_codec_ops *ops = in->ops;
    struct fk_trace *tr = in->traces[ti];
    const struct fk_trace_info *info = fk_trace_get_info(tr);
    const struct fk_common_opts *co = in->opts;
    int H = info->n_kv_heads, T = info->n_tokens, m = info->head_dim, P = info->prompt_len;
    int Hq = info->n_q_heads;
    size_t nkv = (size_t)H * T * m;
    double t0 = fk_clock_s(CLOCK_MONOTONIC);
    FK_TRY(read_kv_locked(w, tr, layer, 0, nkv));
    FK_TRY(read_kv_locked(w, tr, layer, 1, nkv));
    float *xr = realloc(w->xrow, sizeof(float) * (size_t)m);
    if (!xr)
        return fk_err(FK_ENOMEM, "out of memory");
    w->xrow = xr;
    int attn = ro->attention && (!ro->attn_layers || ro->attn_layers[layer]);
    if (attn) {
        if (!info->has_queries)
            return fk_err(FK_ECONFIG,
                          "%s: attention fidelity was asked for but the trace has no queries "
                          "(set attention = false or dump queries)",
                          fk_trace_path(tr));
        /* only the query rows of the attention steps are read: memory does not grow with
         * the number of queries, and the stride saves the reading too */
        int32_t *qi = realloc(w->qidx, sizeof(int32_t) * ((size_t)info->n_queries + 1));
        int32_t *qr = realloc(w->qrow, sizeof(int32_t) * (size_t)T);
        if (qi)
            w->qidx = qi;
        if (qr)
            w->qrow = qr;
        if (!qi || !qr)
            return fk_err(FK_ENOMEM, "out of memory");
        pthread_mutex_lock(&h5_lock);
        int rc = fk_trace_read_query_idx(tr, layer, w->qidx);
        pthread_mutex_unlock(&h5_lock);
        FK_TRY(rc);
        for (int t = 0; t < T; t++)
            w->qrow[t] = -1;
        for (int r = 0; r < info->n_queries; r++)
            w->qrow[w->qidx[r]] = r;
        /* the rows of the attention steps (each token's last row), ascending, into qidx
         * (written behind the read position); qrow[t] becomes the place in that list */
        int n_sel = 0;
        for (int r = 0; r < info->n_queries; r++) {
            int t = w->qidx[r];
            if (t >= P && (t - P) % ro->attn_stride == 0 && w->qrow[t] == r) {
                w->qrow[t] = n_sel;
                w->qidx[n_sel++] = r;
            }
        }
        for (int t = 0; t < T; t++)
            if (t < P || (t - P) % ro->attn_stride != 0)
                w->qrow[t] = -1;
        w->n_qsel = n_sel;
        size_t nq = (size_t)Hq * n_sel * m;
        FK_TRY(grow((void **)&w->q, &w->cap_q, nq ? nq : 1, sizeof(float)));
        rc = read_query_rows_locked(tr, layer, w->qidx, n_sel, w->q);
        FK_TRY(rc);
        float *qb = realloc(w->qbuf, sizeof(float) * (size_t)Hq * m);
        if (!qb)
            return fk_err(FK_ENOMEM, "out of memory");
        w->qbuf = qb;
    }
    w->t_io += fk_clock_s(CLOCK_MONOTONIC) - t0;

    int n_steps = T > P ? T - P : 0;
    void *st[2] = {NULL, NULL};
    int rc = FK_OK;
    struct fk_stream_result *sr[2];
    for (int k = 0; k < 2; k++) {
        sr[k] = fk_cell_stream(w->res, ti, layer, k);
        sr[k]->n_steps = n_steps;
        sr[k]->n_tokens = T;
        sr[k]->dict_norm = calloc((size_t)n_steps + 1, sizeof(float));
        sr[k]->step_err = calloc((size_t)n_steps + 1, sizeof(double));
        sr[k]->step_n = calloc((size_t)n_steps + 1, sizeof(int32_t));
        if (!sr[k]->dict_norm || !sr[k]->step_err || !sr[k]->step_n)
            return fk_err(FK_ENOMEM, "out of memory");
        for (int q = 0; q < FK_RECALL_NS; q++)
            sr[k]->recall[q] = NAN;
        sr[k]->support_agree = sr[k]->err_ratio = NAN;
        struct fk_stream_env env = {.layer = layer, .kind = k, .head_dim = m, .n_heads = H,
                                    .n_tokens = T, .base = bases ? &bases[k] : NULL,
                                    .reference = ro->reference};
        rc = ops->open(in->opts, &env, &st[k]);
        if (rc < 0) {
            rc = fk_err_context(rc, "%s: layer %d %s: opening codec %s", fk_trace_path(tr),
                                layer, k ? "V" : "K", ops->name);
            goto out;
        }
    }
    int n_b = co->n_b, a_len = co->a_len;
    int comp = P > n_b ? P - n_b : 0; /* tokens compressed at the end of prefill */
    /* The eviction schedule (spec section 4), simulated once: the step at which each token
     * leaves the buffer. A static codec (its codes do not depend on what it coded before)
     * encodes its decode tokens up front, in blocks of STATIC_BLOCK tokens (one large SGEMM
     * instead of one per step); stored rows are only ever read up to the current eviction
     * point, so nothing else changes. */
    int static_blocks = (ops->caps & FK_CAP_STATIC) != 0;
    int final_comp = comp;
    if (static_blocks) {
        int32_t *es = realloc(w->evict_step, sizeof(int32_t) * ((size_t)T + 1));
        if (!es) {
            rc = fk_err(FK_ENOMEM, "out of memory");
            goto out;
        }
        w->evict_step = es;
        for (int t = 0; t < T; t++)
            es[t] = -1;
        for (int t = P; t < T; t++)
            if (t - final_comp >= n_b) {
                int ne = a_len < t - final_comp ? a_len : t - final_comp;
                for (int i = 0; i < ne; i++)
                    es[final_comp + i] = t - P;
                final_comp += ne;
            }
    }
    /* One stream after the other (prefill, then a static codec's decode blocks): each
     * stream's Gram keeps its hot rows in cache for the whole stream; interleaving K and V
     * blocks made the two 64 MiB Grams evict each other's rows. */
    for (int k = 0; k < 2 && rc == FK_OK; k++) {
        if (comp > 0)
            rc = encode_range(w, ops, st[k], k, w->kv[k], H, T, m, 0, comp, 0, -1, NULL, sr[k]);
        if (static_blocks && rc == FK_OK)
            rc = encode_static_blocks(w, ops, st[k], k, H, T, m, P, n_b, a_len, comp,
                                      final_comp, sr[k]);
    }
    struct fk_attn_acc *acc = &w->res->attn[(size_t)ti * w->res->n_layers + layer];
    for (int t = P; t < T && rc == FK_OK; t++) {
        int step = t - P;
        if (attn && step % ro->attn_stride == 0 && w->qrow[t] >= 0) {
            double a0 = fk_clock_s(CLOCK_THREAD_CPUTIME_ID);
            for (int h = 0; h < Hq; h++)
                memcpy(w->qbuf + (size_t)h * m,
                       w->q + ((size_t)h * w->n_qsel + w->qrow[t]) * m,
                       sizeof(float) * (size_t)m);
            struct fk_attn_in ai = {.m = m, .n_q_heads = Hq, .n_kv_heads = H, .n_tokens = T,
                                    .t = t, .n_comp = comp, .q = w->qbuf, .k = w->kv[0],
                                    .v = w->kv[1], .k_enc = w->kv_enc[0],
                                    .v_enc = w->kv_enc[1], .ops = ops, .kstate = st[0],
                                    .vstate = st[1]};
            rc = fk_attn_eval(&ai, w->as, acc);
            w->t_attn += fk_clock_s(CLOCK_THREAD_CPUTIME_ID) - a0;
            if (rc < 0)
                break;
        }
        if (t - comp >= n_b) {
            int ne = a_len < t - comp ? a_len : t - comp;
            if (!static_blocks) {
                for (int k = 0; k < 2 && rc == FK_OK; k++)
                    rc = encode_range(w, ops, st[k], k, w->kv[k], H, T, m, comp, comp + ne, 1,
                                      step, NULL, sr[k]);
            }
            comp += ne;
        }
        for (int k = 0; k < 2 && rc == FK_OK; k++) {
            struct fk_stream_stats ss;
            ops->stats(st[k], &ss);
            sr[k]->dict_norm[step] = ss.n_base ? (float)ss.n_atoms / ss.n_base : 1.0f;
        }
    }
    /* final error with the final dictionary, accounting, activity */
    double m0 = fk_clock_s(CLOCK_THREAD_CPUTIME_ID);
    for (int k = 0; k < 2 && rc == FK_OK; k++) {
        const void *X = w->kv[k];
        for (int h = 0; h < H && rc == FK_OK; h++)
            for (int t = 0; t < comp && rc == FK_OK; t++) {
                const float *x = fk_stored_row(X, w->kv_enc[k], (size_t)h * T + t, m, w->xrow);
                rc = ops->reconstruct(st[k], h, t, w->rec);
                double xx = 0, e = 0;
                for (int c = 0; c < m; c++) {
                    double d = (double)x[c] - w->rec[c];
                    xx += (double)x[c] * x[c];
                    e += d * d;
                }
                if (xx > 1e-30)
                    sr[k]->err_final_sum += sqrt(e / xx);
            }
        if (rc < 0)
            break;
        /* a hash of the stored supports: the reference mode must reproduce them */
        uint64_t hsh = 1469598103934665603ULL;
        if (ro->row_hashes && ops->sparse_row && comp > 0) {
            sr[k]->row_hash = malloc(sizeof(uint64_t) * (size_t)H * (size_t)comp);
            if (!sr[k]->row_hash) {
                rc = fk_err(FK_ENOMEM, "out of memory");
                break;
            }
            sr[k]->n_row_hash = (long)H * comp;
        }
        for (int h = 0; ops->sparse_row && h < H && rc == FK_OK; h++)
            for (int t = 0; t < comp && rc == FK_OK; t++) {
                int nnz = 0;
                const int32_t *idx = NULL;
                const float *coef = NULL;
                rc = ops->sparse_row(st[k], h, t, &nnz, &idx, &coef);
                uint64_t rh = 1469598103934665603ULL;
                for (int i = 0; rc == FK_OK && i <= nnz; i++) {
                    rh ^= (uint64_t)(uint32_t)(i < nnz ? idx[i] : -1);
                    rh *= 1099511628211ULL;
                }
                if (sr[k]->row_hash)
                    sr[k]->row_hash[(long)h * comp + t] = rh;
                hsh ^= rh;
                hsh *= 1099511628211ULL;
            }
        sr[k]->support_hash = hsh;
        if (rc < 0)
            break;
        struct fk_stream_stats ss;
        ops->stats(st[k], &ss);
        rc = activity(sr[k], &ss);
        ss.ref_count = ss.prefill_use = ss.use_total = NULL;
        ss.is_adapted = NULL;
        sr[k]->st = ss;
        sr[k]->bytes_buf = (double)(T - comp) * H * m * 2;
        sr[k]->bytes_full = (double)T * H * m * 2;
        if (rc == FK_OK && ro->recall && bases && (ops->caps & FK_CAP_DICT)) {
            const struct fk_option *os = fk_codec_option(ops, "s"), *on = fk_codec_option(ops, "n");
            int s = os ? (int)fk_opts_get(in->opts, os) : 8;
            int n = on ? (int)fk_opts_get(in->opts, on) : 256;
            rc = pool_recall(sr[k], &bases[k], X, w->kv_enc[k], w->xrow, H, T, P,
                             ro->recall_every, s, n);
        }
    }
    w->t_metrics += fk_clock_s(CLOCK_THREAD_CPUTIME_ID) - m0;
out:
    for (int k = 0; k < 2; k++)
        if (st[k])
            ops->close(st[k]);
    return rc;
}

static int replay_unit(struct worker *w, int layer)
{
    const struct fk_cell_input *in = w->in;
    struct fk_base_dict bases[2];
    int rc = FK_OK;
    if (in->ops->caps & FK_CAP_DICT) {
        for (int k = 0; k < 2; k++) {
            fk_dict_base(in->dict, layer, k, &bases[k]);
            if ((in->ops->caps & FK_CAP_GRAM) && !w->ro->reference) {
                size_t nn = (size_t)bases[k].n_atoms * bases[k].n_atoms;
                if (nn > w->cap_gram) {
                    for (int g = 0; g < 2; g++) {
                        free(w->gram[g]);
                        w->gram[g] = fk_gram_alloc(nn);
                    }
                    w->cap_gram = w->gram[0] && w->gram[1] ? nn : 0;
                    if (!w->cap_gram)
                        return fk_err(FK_ENOMEM, "out of memory for two %d x %d Gram matrices",
                                      bases[k].n_atoms, bases[k].n_atoms);
                }
                double g0 = fk_clock_s(CLOCK_THREAD_CPUTIME_ID);
                FK_TRY(fk_gram_compute(bases[k].atoms, bases[k].n_atoms, bases[k].m,
                                       w->gram[k]));
                w->t_gram += fk_clock_s(CLOCK_THREAD_CPUTIME_ID) - g0;
                bases[k].gram = w->gram[k];
            }
        }
    }
    for (int ti = 0; ti < in->n_traces && rc == FK_OK; ti++) {
        if (w->ro->stop && *w->ro->stop) {
            rc = fk_err(FK_EINTR, "interrupted");
            break;
        }
        rc = replay_layer(w, ti, layer, (in->ops->caps & FK_CAP_DICT) ? bases : NULL);
    }
    return rc;
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    for (;;) {
        pthread_mutex_lock(w->lock);
        int layer = *w->failed ? w->res->n_layers : (*w->next)++;
        pthread_mutex_unlock(w->lock);
        if (layer >= w->res->n_layers)
            break;
        if (w->ro->layers && !w->ro->layers[layer])
            continue;
        int rc = replay_unit(w, layer);
        if (rc == FK_OK) {
            long v = 0;
            for (int t = 0; t < w->res->n_traces; t++)
                for (int k = 0; k < 2; k++) {
                    const struct fk_stream_result *sr = fk_cell_stream(w->res, t, layer, k);
                    v += sr->n_vectors + sr->n_zero;
                }
            pthread_mutex_lock(w->lock);
            (*w->units_done)++;
            *w->vectors_done += v;
            if (w->ro->progress)
                w->ro->progress(w->ro->progress_ctx, *w->units_done, w->units_total,
                                *w->vectors_done);
            pthread_mutex_unlock(w->lock);
        }
        if (rc < 0) {
            pthread_mutex_lock(w->lock);
            if (!*w->failed) {
                *w->failed = rc;
                snprintf(w->errmsg, 1024, "%s", fk_errmsg());
            }
            pthread_mutex_unlock(w->lock);
            break;
        }
    }
    return NULL;
}

void fk_cell_result_free(struct fk_cell_result *r)
{
    if (!r || !r->streams)
        return;
    size_t n = (size_t)r->n_traces * r->n_layers;
    for (size_t i = 0; i < 2 * n; i++) {
        free(r->streams[i].dict_norm);
        free(r->streams[i].step_err);
        free(r->streams[i].step_n);
        free(r->streams[i].inactive);
        free(r->streams[i].corr_profile);
        free(r->streams[i].row_hash);
    }
    for (size_t i = 0; r->attn && i < n; i++)
        fk_attn_acc_free(&r->attn[i]);
    free(r->streams);
    free(r->attn);
    memset(r, 0, sizeof *r);
}

int fk_replay_cell(const struct fk_cell_input *in, const struct fk_replay_opts *ro,
                   struct fk_cell_result *out)
{
    memset(out, 0, sizeof *out);
    if (in->n_traces < 1)
        return fk_err(FK_EINVAL, "a cell needs at least one trace");
    const struct fk_trace_info *i0 = fk_trace_get_info(in->traces[0]);
    int max_T = 0, max_hq = 0;
    for (int t = 0; t < in->n_traces; t++) {
        const struct fk_trace_info *it = fk_trace_get_info(in->traces[t]);
        if (it->n_layers != i0->n_layers || it->head_dim != i0->head_dim)
            return fk_err(FK_ECONFIG, "traces %s and %s differ in layers or head_dim: put them "
                          "in separate datasets", fk_trace_path(in->traces[0]),
                          fk_trace_path(in->traces[t]));
        if (in->dict)
            FK_TRY(fk_dict_check_trace(in->dict, it, fk_trace_path(in->traces[t])));
        if (ro->attention && !it->has_queries)
            return fk_err(FK_ECONFIG, "%s: attention fidelity was asked for but the trace has no "
                          "queries (set attention = false, or dump queries)",
                          fk_trace_path(in->traces[t]));
        max_T = it->n_tokens > max_T ? it->n_tokens : max_T;
        max_hq = it->n_q_heads > max_hq ? it->n_q_heads : max_hq;
    }
    if ((in->ops->caps & FK_CAP_DICT) && !in->dict)
        return fk_err(FK_ECONFIG, "codec %s needs a dictionary (set dictionary = \"...\")",
                      in->ops->name);
    if (in->ops->check)
        FK_TRY(in->ops->check(in->opts, i0->head_dim, in->dict ? in->dict->n_atoms : 0));
    out->n_traces = in->n_traces;
    out->n_layers = i0->n_layers;
    size_t n = (size_t)in->n_traces * out->n_layers;
    out->streams = calloc(2 * n, sizeof *out->streams);
    out->attn = calloc(n, sizeof *out->attn);
    if (!out->streams || !out->attn) {
        fk_cell_result_free(out);
        return fk_err(FK_ENOMEM, "out of memory");
    }
    int jobs = ro->jobs < 1 ? 1 : ro->jobs;
    if (jobs > out->n_layers)
        jobs = out->n_layers;
    struct worker *ws = calloc((size_t)jobs, sizeof *ws);
    pthread_t *th = calloc((size_t)jobs, sizeof *th);
    pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    int next = 0, failed = 0, units_done = 0, units_total = 0;
    long vectors_done = 0;
    char errmsg[1024] = "";
    int rc = FK_OK;
    for (int l = 0; l < out->n_layers; l++)
        units_total += !ro->layers || ro->layers[l];
    if (!ws || !th)
        rc = fk_err(FK_ENOMEM, "out of memory");
    int max_atoms = in->dict ? in->dict->n_atoms : 1;
    if (in->ops->caps & FK_CAP_GROWS)
        max_atoms = 32767;
    struct fk_replay_pool *pool = ro->pool;
    if (pool && !(in->ops->caps & FK_CAP_GRAM))
        pool_release(pool);
    else if (pool && rc == FK_OK)
        rc = pool_reserve(pool, jobs);
    for (int j = 0; j < jobs && rc == FK_OK; j++) {
        ws[j] = (struct worker){.in = in, .ro = ro, .res = out, .lock = &lock, .next = &next,
                                .failed = &failed, .errmsg = errmsg,
                                .units_done = &units_done, .units_total = units_total,
                                .vectors_done = &vectors_done};
        if (pool && (in->ops->caps & FK_CAP_GRAM)) { /* the worker owns them until it ends */
            ws[j].gram[0] = pool->gram[j][0];
            ws[j].gram[1] = pool->gram[j][1];
            ws[j].cap_gram = pool->cap[j];
            pool->gram[j][0] = pool->gram[j][1] = NULL;
            pool->cap[j] = 0;
            ws[j].pooled = 1;
        }
        ws[j].rec = malloc(sizeof(float) * (size_t)i0->head_dim);
        if (!ws[j].rec)
            rc = fk_err(FK_ENOMEM, "out of memory");
        if (rc == FK_OK && ro->attention)
            rc = fk_attn_scratch_create(i0->head_dim, max_T, max_atoms, max_hq, &ws[j].as);
    }
    /* One BLAS thread per worker: no oversubscription, and every product is computed the
     * same way whatever --jobs is, so results are identical at any thread count. */
    int blas_threads = openblas_get_num_threads();
    openblas_set_num_threads(1);
    double w0 = fk_clock_s(CLOCK_MONOTONIC);
    int started = 0;
    if (rc == FK_OK) {
        if (jobs == 1) {
            worker_main(&ws[0]);
        } else {
            for (; started < jobs; started++)
                if (pthread_create(&th[started], NULL, worker_main, &ws[started]) != 0)
                    break;
            if (started == 0)
                worker_main(&ws[0]);
            for (int j = 0; j < started; j++)
                pthread_join(th[j], NULL);
        }
        if (failed)
            rc = fk_err(failed, "%s", errmsg);
    }
    out->wall_s = fk_clock_s(CLOCK_MONOTONIC) - w0;
    openblas_set_num_threads(blas_threads);
    for (int j = 0; ws && j < jobs; j++) {
        out->t_io += ws[j].t_io;
        out->t_encode += ws[j].t_encode;
        out->t_attn += ws[j].t_attn;
        out->t_metrics += ws[j].t_metrics;
        out->t_gram += ws[j].t_gram;
        if (ws[j].pooled) {
            pool->gram[j][0] = ws[j].gram[0];
            pool->gram[j][1] = ws[j].gram[1];
            pool->cap[j] = ws[j].cap_gram;
            ws[j].gram[0] = ws[j].gram[1] = NULL;
        }
        worker_free(&ws[j]);
    }
    for (size_t i = 0; rc == FK_OK && i < 2 * n; i++)
        out->vectors += out->streams[i].n_vectors + out->streams[i].n_zero;
    free(ws);
    free(th);
    if (rc < 0)
        fk_cell_result_free(out);
    return rc;
}
