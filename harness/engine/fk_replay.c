/* SPDX-License-Identifier: MIT
 * The replay engine (see fk_replay.h). Spec: algorithms.md sections 4 and 10.
 */
#include "common/fk_clock.h"
#include "engine/fk_replay.h"
#include "engine/fk_heads.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/fk_err.h"
#include "core/fk_registry.h"
#include "engine/fk_drive.h"
#include "core/fk_rewrite.h"
#include "kernels/fk_blas.h"
#include "kernels/fk_sparse.h"

static pthread_mutex_t h5_lock = PTHREAD_MUTEX_INITIALIZER; /* HDF5 calls are serialised */

void fk_replay_h5_lock(void) { pthread_mutex_lock(&h5_lock); }
void fk_replay_h5_unlock(void) { pthread_mutex_unlock(&h5_lock); }

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

/* ---- per-worker state ------------------------------------------------------------------ */

/* What the workers of one cell share (under lock). */
struct shared {
    pthread_mutex_t lock;        /* protects everything below and the progress callback */
    int next;                    /* next layer to take */
    int units_done, units_total; /* finished units, units in all */
    long vectors_done;           /* vectors coded in finished units */
    int failed;                  /* first error code, 0 if none */
    char errmsg[1024];           /* first error message */
};

struct worker {
    const struct fk_cell_input *in;
    const struct fk_replay_opts *ro;
    struct fk_cell_result *res;
    struct shared *sh;
    /* buffers */
    void *kv[2];                 /* [H_kv][T][m] exact keys, values as stored in the trace
                                  * (16-bit words of a float16 / bfloat16 trace: half the
                                  * memory of float32 and exact) */
    enum fk_encoding kv_enc[2];
    size_t cap_kv[2];            /* capacities of kv in bytes */
    float *q;                    /* [H_q][n_qsel][m] the query rows of the attention steps */
    int n_qsel;
    int32_t *qidx;               /* [Tq] query_token_idx, then the selected rows */
    int32_t *qrow;               /* [T] row in q of each attention step's token, or -1 */
    size_t cap_q, cap_qidx, cap_qrow; /* capacities in elements */
    float *gram[2];              /* [N][N] Gram buffers of K and V, reused across units (a fresh
                                  * buffer per unit costs more in page faults than the SSYRK
                                  * itself) */
    size_t cap_gram;
    int pooled;                  /* gram[] came from (and go back to) the pool's slot */
    float *ext[2];               /* [H_kv][T][m] external K and V rows (FK_CAP_EXTERNAL) */
    size_t cap_ext[2];           /* their capacities in floats */
    /* an eviction policy's inputs: float32 K and V, its queries, the keep mask */
    float *kvf[2];
    size_t cap_kvf[2];
    float *qa;                   /* [H_q][n_qa][m] */
    int32_t *qaidx, *qarow;      /* [Tq] rows read; [T] row in qa of token t, or -1 */
    size_t cap_qa, cap_qaidx, cap_qarow;
    uint8_t *keep;
    size_t cap_keep;
    struct fk_drive drive;       /* observers and event buffers */
    struct fk_unit_times times;
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
    free(w->q);
    free(w->qidx);
    free(w->qrow);
    free(w->gram[0]);
    free(w->gram[1]);
    free(w->ext[0]);
    free(w->ext[1]);
    free(w->kvf[0]);
    free(w->kvf[1]);
    free(w->qa);
    free(w->qaidx);
    free(w->qarow);
    free(w->keep);
    fk_drive_free(&w->drive);
}

/* ---- one (trace, layer) ---------------------------------------------------------------- */

/* Reads K or V of one layer as stored into w->kv[k] (grown to fit n values). */
static int read_kv_locked(struct worker *w, struct fk_trace *t, int layer, int k, size_t n)
{
    enum fk_kind kind = k ? FK_KIND_V : FK_KIND_K;
    pthread_mutex_lock(&h5_lock);
    int rc = fk_trace_encoding(t, layer, kind, &w->kv_enc[k]);
    if (rc == FK_OK)
        rc = grow(&w->kv[k], &w->cap_kv[k], n * fk_enc_size(w->kv_enc[k]), 1);
    if (rc == FK_OK)
        rc = fk_trace_read_stored(t, layer, kind, w->kv[k]);
    pthread_mutex_unlock(&h5_lock);
    return rc;
}

/* Reads the query rows of the attention steps of one layer into w->q: only those, so memory
 * does not grow with the number of queries and the stride saves the reading too. Sets
 * w->qrow[t] to the place of token t's row in w->q (-1: no attention step at t). */
static int read_queries(struct worker *w, struct fk_trace *tr, int layer)
{
    const struct fk_trace_info *info = fk_trace_get_info(tr);
    int T = info->n_tokens, P = info->prompt_len, stride = w->ro->attn_stride;
    if (!info->has_queries)
        return fk_err(FK_ECONFIG,
                      "%s: attention fidelity was asked for but the trace has no queries "
                      "(set attention = false or dump queries)",
                      fk_trace_path(tr));
    FK_TRY(grow((void **)&w->qidx, &w->cap_qidx, (size_t)info->n_queries + 1, sizeof(int32_t)));
    FK_TRY(grow((void **)&w->qrow, &w->cap_qrow, (size_t)T, sizeof(int32_t)));
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
        if (t >= P && (t - P) % stride == 0 && w->qrow[t] == r) {
            w->qrow[t] = n_sel;
            w->qidx[n_sel++] = r;
        }
    }
    for (int t = 0; t < T; t++)
        if (t < P || (t - P) % stride != 0)
            w->qrow[t] = -1;
    w->n_qsel = n_sel;
    size_t nq = (size_t)info->n_q_heads * n_sel * info->head_dim;
    FK_TRY(grow((void **)&w->q, &w->cap_q, nq ? nq : 1, sizeof(float)));
    pthread_mutex_lock(&h5_lock);
    rc = fk_trace_read_query_rows(tr, layer, w->qidx, n_sel, w->q);
    pthread_mutex_unlock(&h5_lock);
    return rc;
}

/* The prefill tokens whose queries the cell's policy and row rewrites read: the last n of
 * them (0 if none). */
static int policy_prefill_q(const struct fk_cell_input *in, int P)
{
    const struct fk_evict_ops *ev = in->evict;
    unsigned nd = ev && ev->needs ? ev->needs(in->evict_opts) : 0;
    int n = 0;
    if ((nd & FK_EVICT_NEED_PREFILL_Q) && ev->prefill_queries)
        n = ev->prefill_queries(in->evict_opts, P);
    int nr = fk_rewrite_prefill_queries(in->rewrite, P);
    n = n > nr ? n : nr;
    return n < 0 ? 0 : n > P ? P : n;
}

/* Token t's query is read by the policy or the rewrites. */
static int policy_reads_q(const struct fk_cell_input *in, int P, int t)
{
    const struct fk_evict_ops *ev = in->evict;
    unsigned nd = ev && ev->needs ? ev->needs(in->evict_opts) : 0;
    return t >= P ? (nd & FK_EVICT_NEED_DECODE_Q) != 0 : t >= P - policy_prefill_q(in, P);
}

/* Which query row of each token the policy or the rewrites read (its last row) into qarow
 * [T] (-1: none wanted), the rows ascending into qaidx; the count into *n. FK_ECONFIG naming
 * the trace, the layer and the first token whose query is wanted but absent. qidx: [Tq] the
 * layer's query_token_idx. */
static int policy_rows(const struct fk_cell_input *in, struct fk_trace *tr, int layer,
                       int32_t *qidx, int32_t *qarow, int *n)
{
    const struct fk_trace_info *info = fk_trace_get_info(tr);
    int T = info->n_tokens, P = info->prompt_len;
    for (int t = 0; t < T; t++)
        qarow[t] = -1;
    for (int r = 0; info->has_queries && r < info->n_queries; r++)
        qarow[qidx[r]] = r;
    for (int t = 0; t < T; t++) {
        int want = policy_reads_q(in, P, t);
        if (want && qarow[t] < 0) {
            struct fk_cell_input pol = *in; /* whose read: the policy's, else think's */
            pol.rewrite = NULL;
            int by_policy = in->evict && policy_reads_q(&pol, P, t);
            return fk_err(FK_ECONFIG,
                          "%s: layer %d: %s%s%s reads the query of %s token %d, but the "
                          "trace records %s (record every token's queries, e.g. "
                          "`fadkv-bench synth --prefill-queries 1`)",
                          fk_trace_path(tr), layer, by_policy ? "eviction policy '" : "",
                          by_policy ? in->evict->name : "think (ThinK's channel scores)",
                          by_policy ? "'" : "", t < P ? "prefill" : "decode", t,
                          info->has_queries ? "no query of that token" : "no queries");
        }
        if (!want)
            qarow[t] = -1;
    }
    /* the wanted rows, ascending (qidx rewritten behind the read position); qarow[t]
     * becomes the place of t's row in that list */
    int k = 0;
    for (int r = 0; info->has_queries && r < info->n_queries; r++) {
        int t = qidx[r];
        if (qarow[t] == r) {
            qidx[k] = r;
            qarow[t] = k++;
        }
    }
    *n = k;
    return FK_OK;
}

/* What a policy needs of one trace: a budget that keeps a token everywhere (check_prompt),
 * a head pattern of its shape (FK_EVICT_NEED_HEADS), its RoPE with post-RoPE keys
 * (FK_EVICT_NEED_ROPE). */
static int check_policy_trace(const struct fk_cell_input *in, unsigned nd,
                              struct fk_trace *tr)
{
    const struct fk_evict_ops *ev = in->evict;
    const struct fk_trace_info *info = fk_trace_get_info(tr);
    if (ev->check_prompt &&
        ev->check_prompt(in->evict_opts, info->n_layers, info->n_kv_heads,
                         info->prompt_len) < 0)
        return fk_err_context(FK_ECONFIG, "%s (a prompt of %d tokens, %d layers of %d KV "
                              "heads)", fk_trace_path(tr), info->prompt_len, info->n_layers,
                              info->n_kv_heads);
    if ((nd & FK_EVICT_NEED_HEADS) &&
        (in->heads->n_layers != info->n_layers || in->heads->n_heads != info->n_kv_heads))
        return fk_err(FK_ECONFIG, "head pattern %s has %d layers x %d KV heads, trace %s "
                      "%d x %d", in->heads->path, in->heads->n_layers, in->heads->n_heads,
                      fk_trace_path(tr), info->n_layers, info->n_kv_heads);
    if ((nd & FK_EVICT_NEED_ROPE) && (!info->has_rope || !info->keys_post_rope))
        return fk_err(FK_ECONFIG, "trace %s %s, which eviction policy '%s' needs (it "
                      "un-rotates the recorded queries)", fk_trace_path(tr),
                      !info->has_rope ? "does not describe its RoPE (no rope_layout "
                      "attribute; datasets/README.md says how to stamp it)"
                                      : "stores pre-RoPE keys, not the post-RoPE ones",
                      ev->name);
    return FK_OK;
}

static int check_queries(const struct fk_cell_input *in);

int fk_replay_check_evict(const struct fk_cell_input *in)
{
    const struct fk_evict_ops *ev = in->evict;
    if (in->rewrite)
        FK_TRY(fk_rewrite_check(in->rewrite, ev, in->ops));
    if (!ev && !fk_rewrite_prefill_queries(in->rewrite, 1))
        return FK_OK;
    if (!ev)
        return check_queries(in);
    FK_TRY(fk_evict_check_names(ev, in->ops));
    if (ev->check)
        FK_TRY(ev->check(in->evict_opts));
    if ((in->ops->caps & (FK_CAP_GROWS | FK_CAP_ADAPTS)) && !(in->ops->caps & FK_CAP_SKIPS))
        return fk_err(FK_ECONFIG, "codec %s cannot store what eviction policy '%s' keeps "
                      "exactly: its dictionary grows or adapts from every row it codes, and it "
                      "cannot skip the rows the policy drops (FK_CAP_SKIPS); compose the "
                      "policy with a codec whose rows are coded independently of the dropped "
                      "rows (e.g. full, kivi, lexico) or one that skips them (lexico-adp, gm, "
                      "pl, fadkv)", in->ops->name, ev->name);
    if (in->ops->caps & FK_CAP_BASIS)
        return fk_err(FK_ECONFIG, "codec %s codes the KV heads of a group together, so a "
                      "per-head kept set of eviction policy '%s' cannot drop one head's row "
                      "from it", in->ops->name, ev->name);
    unsigned nd = ev->needs ? ev->needs(in->evict_opts) : 0;
    if ((nd & FK_EVICT_NEED_HEADS) && !in->heads)
        return fk_err(FK_ECONFIG, "eviction policy '%s' needs a score per layer and KV head: "
                      "set the dataset's head_pattern (a DuoAttention full_attention_heads.tsv: "
                      "one row per layer, one column per KV head)", ev->name);
    for (int t = 0; t < in->n_traces; t++)
        FK_TRY(check_policy_trace(in, nd, in->traces[t]));
    if (!(nd & (FK_EVICT_NEED_DECODE_Q | FK_EVICT_NEED_PREFILL_Q)) &&
        !fk_rewrite_prefill_queries(in->rewrite, 1))
        return FK_OK;
    return check_queries(in);
}

/* Every query the policy and the rewrites read, in every layer of every trace. */
static int check_queries(const struct fk_cell_input *in)
{
    int rc = FK_OK;
    for (int t = 0; t < in->n_traces && rc == FK_OK; t++) {
        struct fk_trace *tr = in->traces[t];
        const struct fk_trace_info *info = fk_trace_get_info(tr);
        int32_t *qidx = malloc(sizeof(int32_t) * ((size_t)info->n_queries + 1));
        int32_t *qarow = malloc(sizeof(int32_t) * ((size_t)info->n_tokens + 1));
        if (!qidx || !qarow)
            rc = fk_err(FK_ENOMEM, "out of memory");
        for (int l = 0; l < info->n_layers && rc == FK_OK; l++) {
            int n = 0;
            if (info->has_queries) {
                pthread_mutex_lock(&h5_lock);
                rc = fk_trace_read_query_idx(tr, l, qidx);
                pthread_mutex_unlock(&h5_lock);
            }
            if (rc == FK_OK)
                rc = policy_rows(in, tr, l, qidx, qarow, &n);
        }
        free(qidx);
        free(qarow);
    }
    return rc;
}

/* The layer's K and V as float32 (u->kvf): the rows as read when they are float32. */
static int kv_float(struct worker *w, const struct fk_trace_info *info, struct fk_unit *u)
{
    int T = info->n_tokens, m = info->head_dim, H = info->n_kv_heads;
    size_t nkv = (size_t)H * T * m;
    for (int k = 0; k < 2; k++) {
        if (w->kv_enc[k] == FK_ENC_F32) {
            u->kvf[k] = w->kv[k];
            continue;
        }
        FK_TRY(grow((void **)&w->kvf[k], &w->cap_kvf[k], nkv, sizeof(float)));
        for (size_t r = 0; r < (size_t)H * T; r++) {
            float *dst = w->kvf[k] + r * m;
            const float *src = fk_stored_row(w->kv[k], w->kv_enc[k], r, m, dst);
            if (src != dst)
                memcpy(dst, src, sizeof(float) * (size_t)m);
        }
        u->kvf[k] = w->kvf[k];
    }
    return FK_OK;
}

/* The inputs of a policy and the row rewrites of one layer: K and V as float32, their
 * queries, a zeroed keep mask (with a policy). */
static int read_policy_inputs(struct worker *w, struct fk_trace *tr, int layer,
                              struct fk_unit *u)
{
    const struct fk_evict_ops *ev = w->in->evict;
    const struct fk_trace_info *info = fk_trace_get_info(tr);
    int T = info->n_tokens, m = info->head_dim, H = info->n_kv_heads;
    FK_TRY(kv_float(w, info, u));
    if (ev) {
        FK_TRY(grow((void **)&w->keep, &w->cap_keep, (size_t)H * T, 1));
        memset(w->keep, 0, (size_t)H * T);
        u->keep = w->keep;
    }
    FK_TRY(grow((void **)&w->qaidx, &w->cap_qaidx, (size_t)info->n_queries + 1, sizeof(int32_t)));
    FK_TRY(grow((void **)&w->qarow, &w->cap_qarow, (size_t)T, sizeof(int32_t)));
    int rc = FK_OK;
    if (info->has_queries) {
        pthread_mutex_lock(&h5_lock);
        rc = fk_trace_read_query_idx(tr, layer, w->qaidx);
        pthread_mutex_unlock(&h5_lock);
    }
    int n = 0;
    if (rc == FK_OK)
        rc = policy_rows(w->in, tr, layer, w->qaidx, w->qarow, &n);
    FK_TRY(rc);
    size_t nq = (size_t)info->n_q_heads * n * m;
    FK_TRY(grow((void **)&w->qa, &w->cap_qa, nq ? nq : 1, sizeof(float)));
    if (n > 0) {
        pthread_mutex_lock(&h5_lock);
        rc = fk_trace_read_query_rows(tr, layer, w->qaidx, n, w->qa);
        pthread_mutex_unlock(&h5_lock);
        FK_TRY(rc);
    }
    u->qa = w->qa;
    u->n_qa = n;
    u->qarow = w->qarow;
    u->evict = ev;
    u->evict_opts = w->in->evict_opts;
    u->head_scores = w->in->heads ? w->in->heads->score : NULL;
    /* the rewrites, when they change something on this trace (a prompt within think_recent
     * prunes nothing: the plain cell's numbers) */
    const struct fk_rewrite *rw = w->in->rewrite;
    u->think_channels = fk_rewrite_channels(rw, m);
    u->think_tokens = fk_rewrite_pruned_tokens(rw, m, info->prompt_len);
    u->think_mask = u->think_tokens > 0 ? fk_rewrite_mask_bytes(rw, m) : 0;
    u->rewrite = rw && ((rw->merge != FK_MERGE_NONE && ev) || u->think_tokens > 0) ? rw : NULL;
    return FK_OK;
}

static int replay_layer(struct worker *w, int ti, int layer, const struct fk_base_dict *bases)
{
    struct fk_trace *tr = w->in->traces[ti];
    const struct fk_trace_info *info = fk_trace_get_info(tr);
    const struct fk_replay_opts *ro = w->ro;
    struct fk_unit u = {.ops = w->in->ops, .opts = w->in->opts, .ro = ro,
                        .path = fk_trace_path(tr), .layer = layer, .n_layers = info->n_layers,
                        .n_kv_heads = info->n_kv_heads, .n_q_heads = info->n_q_heads,
                        .n_tokens = info->n_tokens, .prompt_len = info->prompt_len,
                        .head_dim = info->head_dim, .bases = bases, .times = &w->times,
                        .positions = fk_trace_positions(tr),
                        .rope = info->has_rope && info->keys_post_rope ? &info->rope : NULL};
    for (int k = 0; k < 2 && w->in->basis; k++)
        u.basis[k] = fk_basis_get(w->in->basis, layer, k);
    for (int k = 0; k < 2 && w->in->calib; k++)
        u.calib[k] = fk_calib_get(w->in->calib, layer, k);
    u.attention = ro->attention && (!ro->attn_layers || ro->attn_layers[layer]);
    size_t nkv = (size_t)u.n_kv_heads * u.n_tokens * u.head_dim;
    double t0 = fk_clock_s(CLOCK_MONOTONIC);
    FK_TRY(read_kv_locked(w, tr, layer, 0, nkv));
    FK_TRY(read_kv_locked(w, tr, layer, 1, nkv));
    if (u.attention)
        FK_TRY(read_queries(w, tr, layer));
    if (u.attention || w->in->evict) { /* a policy scores with the layer's logits too */
        pthread_mutex_lock(&h5_lock);
        int rc = fk_trace_layer_attention(tr, layer, &u.attn_inv_scale, &u.attn_softcap,
                                          &u.attn_window);
        pthread_mutex_unlock(&h5_lock);
        FK_TRY(rc);
    }
    for (int k = 0; k < 2 && (w->in->ops->caps & FK_CAP_EXTERNAL); k++) {
        /* the prototype's rows of this (trace, layer, kind), as float32 */
        FK_TRY(grow((void **)&w->ext[k], &w->cap_ext[k], nkv, sizeof(float)));
        pthread_mutex_lock(&h5_lock);
        int rc = fk_trace_read(w->in->external[ti], layer, k ? FK_KIND_V : FK_KIND_K,
                               w->ext[k]);
        pthread_mutex_unlock(&h5_lock);
        FK_TRY(rc);
        u.ext[k] = w->ext[k];
    }
    if (w->in->evict || w->in->rewrite)
        FK_TRY(read_policy_inputs(w, tr, layer, &u));
    else if (fk_codec_takes_ahead(w->in->ops) && !ro->reference)
        FK_TRY(kv_float(w, info, &u)); /* the codec's rows ahead */
    w->times.t_io += fk_clock_s(CLOCK_MONOTONIC) - t0;
    for (int k = 0; k < 2; k++) {
        u.kv[k] = w->kv[k];
        u.kv_enc[k] = w->kv_enc[k];
    }
    u.q = w->q;
    u.n_qsel = w->n_qsel;
    u.qrow = w->qrow;
    struct fk_unit_result r = {.sr = {fk_cell_stream(w->res, ti, layer, 0),
                                      fk_cell_stream(w->res, ti, layer, 1)},
                               .attn = &w->res->attn[(size_t)ti * w->res->n_layers + layer]};
    return fk_drive_unit(&w->drive, &u, &r);
}

/* The K and V bases of one layer, with their Gram matrices when the codec wants them. */
static int layer_bases(struct worker *w, int layer, struct fk_base_dict bases[2])
{
    const struct fk_cell_input *in = w->in;
    for (int k = 0; k < 2; k++) {
        fk_dict_base(in->dict, layer, k, &bases[k]);
        if (!(in->ops->caps & FK_CAP_GRAM) || w->ro->reference)
            continue;
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
        FK_TRY(fk_gram_compute(bases[k].atoms, bases[k].n_atoms, bases[k].m, w->gram[k]));
        w->times.t_gram += fk_clock_s(CLOCK_THREAD_CPUTIME_ID) - g0;
        bases[k].gram = w->gram[k];
    }
    return FK_OK;
}

static int replay_unit(struct worker *w, int layer)
{
    const struct fk_cell_input *in = w->in;
    struct fk_base_dict bases[2];
    int has_dict = (in->ops->caps & FK_CAP_DICT) != 0;
    if (has_dict)
        FK_TRY(layer_bases(w, layer, bases));
    for (int ti = 0; ti < in->n_traces; ti++) {
        if (w->ro->stop && *w->ro->stop)
            return fk_err(FK_EINTR, "interrupted");
        FK_TRY(replay_layer(w, ti, layer, has_dict ? bases : NULL));
    }
    return FK_OK;
}

/* Counts a finished unit and reports progress. */
static void unit_done(struct worker *w, int layer)
{
    long v = 0;
    for (int t = 0; t < w->res->n_traces; t++)
        for (int k = 0; k < 2; k++) {
            const struct fk_stream_result *sr = fk_cell_stream(w->res, t, layer, k);
            v += sr->n_vectors + sr->n_zero;
        }
    struct shared *sh = w->sh;
    pthread_mutex_lock(&sh->lock);
    sh->units_done++;
    sh->vectors_done += v;
    if (w->ro->progress)
        w->ro->progress(w->ro->progress_ctx, sh->units_done, sh->units_total,
                        sh->vectors_done);
    pthread_mutex_unlock(&sh->lock);
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct shared *sh = w->sh;
    for (;;) {
        pthread_mutex_lock(&sh->lock);
        int layer = sh->failed ? w->res->n_layers : sh->next++;
        pthread_mutex_unlock(&sh->lock);
        if (layer >= w->res->n_layers)
            break;
        if (w->ro->layers && !w->ro->layers[layer])
            continue;
        int rc = replay_unit(w, layer);
        if (rc == FK_OK) {
            unit_done(w, layer);
            continue;
        }
        pthread_mutex_lock(&sh->lock);
        if (!sh->failed) {
            sh->failed = rc;
            snprintf(sh->errmsg, sizeof sh->errmsg, "%s", fk_errmsg());
        }
        pthread_mutex_unlock(&sh->lock);
        break;
    }
    return NULL;
}

/* ---- one cell -------------------------------------------------------------------------- */

void fk_cell_result_free(struct fk_cell_result *r)
{
    if (!r)
        return;
    size_t n = (size_t)r->n_traces * r->n_layers;
    for (size_t i = 0; r->streams && i < 2 * n; i++) {
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

/* The cell's inputs agree with each other and with the options. */
static int check_cell(const struct fk_cell_input *in, const struct fk_replay_opts *ro)
{
    if (in->n_traces < 1)
        return fk_err(FK_EINVAL, "a cell needs at least one trace");
    const struct fk_trace_info *i0 = fk_trace_get_info(in->traces[0]);
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
    }
    if ((in->ops->caps & FK_CAP_DICT) && !in->dict)
        return fk_err(FK_ECONFIG, "codec %s needs a dictionary (set dictionary = \"...\")",
                      in->ops->name);
    if (in->ops->caps & FK_CAP_EXTERNAL)
        FK_TRY(fk_replay_check_external(in));
    FK_TRY(fk_replay_check_evict(in));
    if (in->ops->caps & FK_CAP_BASIS)
        return fk_replay_check_basis(in);
    if (in->ops->caps & FK_CAP_CALIB)
        return fk_replay_check_calib(in);
    if (in->ops->check)
        FK_TRY(in->ops->check(in->opts, i0->head_dim, in->dict ? in->dict->n_atoms : 0));
    return FK_OK;
}

int fk_replay_check_external(const struct fk_cell_input *in)
{
    if (!(in->ops->caps & FK_CAP_EXTERNAL))
        return FK_OK;
    if (!in->external)
        return fk_err(FK_ECONFIG, "codec %s stores reconstructions computed elsewhere: the "
                      "dataset needs reconstructions = \"DIR\" (DIR/<trace file name> for each "
                      "trace, laid out like the trace; datasets/EXTERNAL.md)", in->ops->name);
    for (int t = 0; t < in->n_traces; t++) {
        const struct fk_trace_info *a = fk_trace_get_info(in->traces[t]);
        const struct fk_trace_info *b = fk_trace_get_info(in->external[t]);
        if (a->n_layers != b->n_layers || a->n_kv_heads != b->n_kv_heads ||
            a->n_tokens != b->n_tokens || a->head_dim != b->head_dim)
            return fk_err(FK_ECONFIG, "reconstructions %s have %d layers, %d KV heads, %d "
                          "tokens, head_dim %d, but trace %s has %d, %d, %d, %d",
                          fk_trace_path(in->external[t]), b->n_layers, b->n_kv_heads,
                          b->n_tokens, b->head_dim, fk_trace_path(in->traces[t]), a->n_layers,
                          a->n_kv_heads, a->n_tokens, a->head_dim);
    }
    return FK_OK;
}

/* FK_NEED_ROPE: every trace's RoPE with post-RoPE keys, and a basis's pre-RoPE keys. */
static int check_rope_need(const struct fk_cell_input *in)
{
    for (int t = 0; t < in->n_traces; t++) {
        const struct fk_trace_info *it = fk_trace_get_info(in->traces[t]);
        if (!it->has_rope)
            return fk_err(FK_ECONFIG, "trace %s does not describe its RoPE (no rope_layout "
                          "attribute; datasets/README.md says how to stamp it), which codec "
                          "%s needs%s", fk_trace_path(in->traces[t]), in->ops->name,
                          in->basis ? " for pre_rope = 1" : " (its keys are coded pre-RoPE)");
        if (!it->keys_post_rope)
            return fk_err(FK_ECONFIG, "trace %s stores pre-RoPE keys (keys_post_rope = 0): "
                          "codec %s un-rotates post-RoPE keys%s",
                          fk_trace_path(in->traces[t]), in->ops->name,
                          in->basis ? " (set pre_rope = 0)" : "");
    }
    if (in->basis && !in->basis->sh.has_pre_rope)
        return fk_err(FK_ECONFIG, "basis %s has no pre-RoPE keys (train-basis makes them only "
                      "from calibration traces that all have rope_layout), which codec %s "
                      "needs for pre_rope = 1", in->basis->path, in->ops->name);
    return FK_OK;
}

int fk_replay_check_basis(const struct fk_cell_input *in)
{
    const struct fk_codec_ops *ops = in->ops;
    if (!(ops->caps & FK_CAP_BASIS))
        return FK_OK;
    if (!in->basis)
        return fk_err(FK_ECONFIG, "codec %s needs a basis (set basis = \"...\", a file of "
                      "`fadkv-bench train-basis`)", ops->name);
    for (int t = 0; t < in->n_traces; t++)
        FK_TRY(fk_basis_check_trace(&in->basis->sh, in->basis->path,
                                    fk_trace_get_info(in->traces[t]),
                                    fk_trace_path(in->traces[t])));
    if (ops->check && in->n_traces > 0 &&
        ops->check(in->opts, in->basis->sh.head_dim, in->basis->sh.n_comp) < 0)
        return fk_err_context(FK_ECONFIG, "codec %s with basis %s (group %d x head_dim %d, %d "
                              "components)", ops->name, in->basis->path, in->basis->sh.group,
                              in->basis->sh.head_dim, in->basis->sh.n_comp);
    if (ops->needs && (ops->needs(in->opts) & FK_NEED_ROPE))
        FK_TRY(check_rope_need(in));
    return FK_OK;
}

/* The calibrated fraction of the codec's option with role FK_ROLE_CALIB_FRACTION. */
static int check_calib_fraction(const struct fk_cell_input *in)
{
    const struct fk_option *o = fk_codec_role(in->ops, FK_ROLE_CALIB_FRACTION);
    if (!o)
        return FK_OK;
    double f = fk_opts_get(in->opts, o);
    const struct fk_calib_shape *sh = &in->calib->sh;
    char have[256] = "", list[256] = ""; /* "0, 0.01" for people, "0,0.01," for the CLI */
    for (int i = 0; i < sh->n_fractions; i++) {
        if (fabs(sh->fractions[i] - f) <= 1e-12)
            return FK_OK;
        snprintf(have + strlen(have), sizeof have - strlen(have), "%s%g", i ? ", " : "",
                 sh->fractions[i]);
        snprintf(list + strlen(list), sizeof list - strlen(list), "%g,", sh->fractions[i]);
    }
    return fk_err(FK_ECONFIG, "codec %s: %s = %g, but calibration %s holds only %s (train it "
                  "with `fadkv-bench train-calib --outliers %s%g ...`)", in->ops->name, o->name,
                  f, in->calib->path, have, list, f);
}

int fk_replay_check_calib(const struct fk_cell_input *in)
{
    const struct fk_codec_ops *ops = in->ops;
    if (!(ops->caps & FK_CAP_CALIB))
        return FK_OK;
    if (!in->calib)
        return fk_err(FK_ECONFIG, "codec %s needs a calibration (set calibration = \"...\", a "
                      "file of `fadkv-bench train-calib`)", ops->name);
    for (int t = 0; t < in->n_traces; t++)
        FK_TRY(fk_calib_check_trace(&in->calib->sh, in->calib->path,
                                    fk_trace_get_info(in->traces[t]),
                                    fk_trace_path(in->traces[t])));
    FK_TRY(check_calib_fraction(in));
    if (ops->check && in->n_traces > 0 && ops->check(in->opts, in->calib->sh.head_dim, 0) < 0)
        return fk_err_context(FK_ECONFIG, "codec %s with calibration %s", ops->name,
                              in->calib->path);
    if (ops->needs && (ops->needs(in->opts) & FK_NEED_ROPE))
        FK_TRY(check_rope_need(in));
    return FK_OK;
}

/* Sets up worker j; it takes the pool's Gram buffers of slot j (if any) until it ends. */
static int worker_init(struct worker *w, int j, const struct fk_cell_input *in,
                       const struct fk_replay_opts *ro, struct fk_cell_result *out,
                       struct shared *sh)
{
    *w = (struct worker){.in = in, .ro = ro, .res = out, .sh = sh};
    struct fk_replay_pool *pool = ro->pool;
    if (pool && (in->ops->caps & FK_CAP_GRAM)) {
        w->gram[0] = pool->gram[j][0];
        w->gram[1] = pool->gram[j][1];
        w->cap_gram = pool->cap[j];
        pool->gram[j][0] = pool->gram[j][1] = NULL;
        pool->cap[j] = 0;
        w->pooled = 1;
    }
    return fk_drive_init(&w->drive);
}

/* Adds worker j's times into the cell, gives its Gram buffers back to the pool, frees it. */
static void worker_end(struct worker *w, int j, struct fk_cell_result *out)
{
    out->t_io += w->times.t_io;
    out->t_encode += w->times.t_encode;
    out->t_attn += w->times.t_attn;
    out->t_metrics += w->times.t_metrics;
    out->t_gram += w->times.t_gram;
    out->t_policy += w->times.t_policy;
    if (w->pooled) {
        struct fk_replay_pool *pool = w->ro->pool;
        pool->gram[j][0] = w->gram[0];
        pool->gram[j][1] = w->gram[1];
        pool->cap[j] = w->cap_gram;
        w->gram[0] = w->gram[1] = NULL;
    }
    worker_free(w);
}

int fk_replay_cell(const struct fk_cell_input *in, const struct fk_replay_opts *ro,
                   struct fk_cell_result *out)
{
    memset(out, 0, sizeof *out);
    FK_TRY(check_cell(in, ro));
    out->n_traces = in->n_traces;
    out->n_layers = fk_trace_get_info(in->traces[0])->n_layers;
    size_t n = (size_t)in->n_traces * out->n_layers;
    out->streams = calloc(2 * n, sizeof *out->streams);
    out->attn = calloc(n, sizeof *out->attn);
    int jobs = ro->jobs < 1 ? 1 : ro->jobs;
    if (jobs > out->n_layers)
        jobs = out->n_layers;
    struct worker *ws = calloc((size_t)jobs, sizeof *ws);
    struct shared sh = {.lock = PTHREAD_MUTEX_INITIALIZER};
    for (int l = 0; l < out->n_layers; l++)
        sh.units_total += !ro->layers || ro->layers[l];
    int rc = FK_OK, n_init = 0;
    if (!out->streams || !out->attn || !ws)
        rc = fk_err(FK_ENOMEM, "out of memory");
    struct fk_replay_pool *pool = ro->pool;
    if (rc == FK_OK && pool && !(in->ops->caps & FK_CAP_GRAM))
        pool_release(pool);
    else if (rc == FK_OK && pool)
        rc = pool_reserve(pool, jobs);
    for (; n_init < jobs && rc == FK_OK; n_init++)
        rc = worker_init(&ws[n_init], n_init, in, ro, out, &sh);
    double w0 = fk_clock_s(CLOCK_MONOTONIC);
    if (rc == FK_OK) {
        /* one BLAS thread per worker: results identical at any --jobs */
        fk_blas_parallel(jobs, worker_main, ws, sizeof *ws);
        if (sh.failed)
            rc = fk_err(sh.failed, "%s", sh.errmsg);
    }
    out->wall_s = fk_clock_s(CLOCK_MONOTONIC) - w0;
    for (int j = 0; j < n_init; j++)
        worker_end(&ws[j], j, out);
    for (size_t i = 0; rc == FK_OK && i < 2 * n; i++)
        out->vectors += out->streams[i].n_vectors + out->streams[i].n_zero;
    free(ws);
    if (rc < 0)
        fk_cell_result_free(out);
    return rc;
}
