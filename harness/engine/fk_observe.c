/* SPDX-License-Identifier: MIT
 * The engine's metric observers (see fk_observe.h). Spec: algorithms.md section 10.
 * Each accumulates in the order the driver reports events and steps, exactly as the sums
 * were formed before they became observers: the numbers do not depend on the observer split.
 */
#include "engine/fk_observe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/fk_clock.h"
#include "common/fk_err.h"
#include "kernels/fk_sparse.h"

/* Grows a float buffer to hold m values. */
static int row_buf(float **p, int *cap, int m)
{
    if (m <= *cap)
        return FK_OK;
    float *n = realloc(*p, sizeof(float) * (size_t)m);
    if (!n)
        return fk_err(FK_ENOMEM, "out of memory");
    *p = n;
    *cap = m;
    return FK_OK;
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

/* Activity metrics from the codec's per-atom counters (spec 10.2); n_prefill: nonzero
 * vectors coded in prefill. */
static int activity(struct fk_stream_result *sr, const struct fk_stream_stats *st,
                    long n_prefill)
{
    sr->inactive_after_prefill = sr->gini = sr->top10_share = sr->adapted_share = NAN;
    if (!st->use_total || st->n_atoms <= 0)
        return FK_OK;
    int N = st->n_base, Nt = st->n_atoms;
    if (n_prefill > 0) {
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
static int pool_recall(struct fk_stream_result *sr, const struct fk_unit *u, int kind,
                       float *xrow, int s, int n_cell)
{
    const struct fk_base_dict *b = &u->bases[kind];
    const void *X = u->kv[kind];
    enum fk_encoding enc = u->kv_enc[kind];
    int H = u->n_kv_heads, T = u->n_tokens, P = u->prompt_len, every = u->ro->recall_every;
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
    int rc = FK_OK, prof_len = 0;
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
            /* the top max(n, 256) atoms by |a|, sorted: the first 256 (or every live atom)
             * are the correlation profile, the first n the screened pool */
            int n_prof = n_cell > 256 ? n_cell : 256 < N ? 256 : N;
            int np = fk_topn(a, b->dead, N, n_prof, 1, pool, work);
            for (int q = 0; q < 256 && q < np; q++)
                prof[q] += amax > 0 ? absa[pool[q]] / amax : 0;
            if (cnt == 0 || (np < 256 ? np : 256) < prof_len)
                prof_len = np < 256 ? np : 256;
            np = np < n_cell ? np : n_cell;
            /* screened coder at the cell's n: support agreement and error ratio */
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
        sr->screen_err_omp = e_omp;
        sr->screen_err_scr = e_scr;
        for (int q = 0; q < 256; q++)
            prof[q] /= cnt;
        sr->corr_profile = prof;
        sr->corr_len = prof_len;
        prof = NULL;
    }
    sr->recall_n = cnt;
    free(work), free(a), free(absa), free(pool), free(prof);
    return rc;
}


/* ---- error sums (spec 10.1) ------------------------------------------------------------ */

struct err_sums {
    long n_vectors, n_zero, n_prefill_coded;
    double err_sum, err_enc_sum, res2_sum, x2_sum, nnz_sum;
};

/* What one coded row adds to the sums (kept per row under an eviction policy, which sums
 * the rows retained at the end only). */
struct row_err {
    float err, err_enc;
    double xx;
    int32_t nnz;
    uint8_t coded, zero, prefill;
};

struct obs_errors {
    struct err_sums k[2];
    float *rec, *xrow;  /* [m] a reconstructed row, an exact row converted to float32 */
    int cap_rec, cap_xrow;
    struct row_err *rows[2]; /* [H][T] with an eviction policy */
    size_t cap_rows;
};

/* Adds one coded row to the sums. */
static void err_add(struct err_sums *e, const struct row_err *r)
{
    if (r->zero) {
        e->n_zero++;
        return;
    }
    e->n_vectors++;
    e->n_prefill_coded += r->prefill;
    e->err_sum += r->err;
    e->err_enc_sum += r->err_enc;
    e->res2_sum += (double)r->err * r->err * r->xx;
    e->x2_sum += r->xx;
    e->nnz_sum += r->nnz;
}

static int errors_start(void *self, const struct fk_unit *u)
{
    struct obs_errors *o = self;
    memset(o->k, 0, sizeof o->k);
    size_t n = (size_t)u->n_kv_heads * u->n_tokens;
    if (u->evict && n > o->cap_rows) {
        for (int k = 0; k < 2; k++) {
            struct row_err *p = realloc(o->rows[k], sizeof *p * n);
            if (!p)
                return fk_err(FK_ENOMEM, "out of memory (%zu rows)", n);
            o->rows[k] = p;
        }
        o->cap_rows = n;
    }
    for (int k = 0; k < 2 && u->evict; k++)
        memset(o->rows[k], 0, sizeof *o->rows[k] * n);
    FK_TRY(row_buf(&o->rec, &o->cap_rec, u->head_dim));
    return row_buf(&o->xrow, &o->cap_xrow, u->head_dim);
}

static int errors_commit(void *self, const struct fk_unit *u, const struct fk_commit *c)
{
    struct obs_errors *oe = self;
    struct err_sums *e = &oe->k[c->kind];
    int m = u->head_dim;
    for (int i = 0; i < c->ev->n; i++) {
        const struct fk_vec_out *o = &c->out[i];
        struct row_err r = {.err = o->err, .err_enc = o->err_enc, .nnz = o->nnz, .coded = 1,
                            .zero = (o->flags & FK_VEC_ZERO) != 0,
                            .prefill = c->ev->phase == 0};
        const float *x = c->ev->x + (size_t)i * m;
        double xx = 0;
        for (int j = 0; !r.zero && j < m; j++)
            xx += (double)x[j] * x[j];
        r.xx = xx;
        if (u->evict) /* summed at the end over the retained rows */
            oe->rows[c->kind][(size_t)c->ev->head[i] * u->n_tokens + c->ev->token[i]] = r;
        else if (r.zero)
            e->n_zero++;
        else {
            e->n_vectors++;
            e->n_prefill_coded += r.prefill;
            e->err_sum += o->err;
            e->err_enc_sum += o->err_enc;
            e->res2_sum += (double)o->err * o->err * xx;
            e->x2_sum += xx;
            e->nnz_sum += o->nnz;
        }
    }
    return FK_OK;
}

/* Sum of the errors of every stored row re-measured with the codec's final dictionary. */
static int final_error(struct obs_errors *o, const struct fk_unit *u, int k, double *sum)
{
    int H = u->n_kv_heads, T = u->n_tokens, m = u->head_dim;
    for (int h = 0; h < H; h++)
        for (int t = 0; t < u->n_comp[k]; t++) {
            if (u->keep && !u->keep[(size_t)h * T + t])
                continue; /* dropped: never read again */
            /* against the row the codec was given (a rewritten one, fk_unit.kvw) */
            const float *x = u->kvw[k] ? u->kvw[k] + ((size_t)h * T + t) * m
                                       : fk_stored_row(u->kv[k], u->kv_enc[k],
                                                       (size_t)h * T + t, m, o->xrow);
            FK_TRY(u->ops->reconstruct(u->st[k], h, t, o->rec));
            double xx = 0, e = 0;
            for (int c = 0; c < m; c++) {
                double d = (double)x[c] - o->rec[c];
                xx += (double)x[c] * x[c];
                e += d * d;
            }
            if (xx > 1e-30)
                *sum += sqrt(e / xx);
        }
    return FK_OK;
}

static int errors_finish(void *self, const struct fk_unit *u, struct fk_unit_result *r)
{
    struct obs_errors *o = self;
    for (int k = 0; k < 2; k++) {
        struct fk_stream_result *sr = r->sr[k];
        struct err_sums *e = &o->k[k];
        /* token-major, heads inner: the order the events committed them (the same sums as
         * without a policy when every row is kept) */
        for (int t = 0; u->evict && t < u->n_tokens; t++)
            for (int h = 0; h < u->n_kv_heads; h++) {
                size_t i = (size_t)h * u->n_tokens + t;
                if (u->keep[i] && o->rows[k][i].coded)
                    err_add(e, &o->rows[k][i]);
            }
        FK_TRY(final_error(o, u, k, &sr->err_final_sum));
        sr->n_vectors = e->n_vectors;
        sr->n_zero = e->n_zero;
        sr->n_prefill_coded = e->n_prefill_coded;
        sr->err_sum = e->err_sum;
        sr->err_enc_sum = e->err_enc_sum;
        sr->res2_sum = e->res2_sum;
        sr->x2_sum = e->x2_sum;
        sr->nnz_sum = e->nnz_sum;
    }
    return FK_OK;
}

static int errors_merge(void *self, const void *other)
{
    struct obs_errors *o = self;
    const struct obs_errors *p = other;
    for (int k = 0; k < 2; k++) {
        struct err_sums *a = &o->k[k];
        const struct err_sums *b = &p->k[k];
        a->n_vectors += b->n_vectors;
        a->n_zero += b->n_zero;
        a->n_prefill_coded += b->n_prefill_coded;
        a->err_sum += b->err_sum;
        a->err_enc_sum += b->err_enc_sum;
        a->res2_sum += b->res2_sum;
        a->x2_sum += b->x2_sum;
        a->nnz_sum += b->nnz_sum;
    }
    return FK_OK;
}

static void errors_release(void *self)
{
    struct obs_errors *o = self;
    free(o->rec);
    free(o->xrow);
    free(o->rows[0]);
    free(o->rows[1]);
    o->rec = o->xrow = NULL;
    o->rows[0] = o->rows[1] = NULL;
    o->cap_rec = o->cap_xrow = 0;
    o->cap_rows = 0;
}

static const struct fk_observer_ops obs_errors = {
    .name = "errors", .size = sizeof(struct obs_errors), .start = errors_start,
    .on_commit = errors_commit, .on_finish = errors_finish, .merge = errors_merge,
    .release = errors_release,
};

/* ---- per-step series (spec 10.1, 10.3) ------------------------------------------------- */

struct obs_series {
    int n_steps;
    float *dict_norm[2];   /* [n_steps + 1] N_t / N after each decode step */
    double *step_err[2];   /* [n_steps + 1] errors of the vectors evicted at that step */
    int32_t *step_n[2];    /* [n_steps + 1] their count */
};

static void series_release(void *self)
{
    struct obs_series *o = self;
    for (int k = 0; k < 2; k++) {
        free(o->dict_norm[k]);
        free(o->step_err[k]);
        free(o->step_n[k]);
        o->dict_norm[k] = NULL;
        o->step_err[k] = NULL;
        o->step_n[k] = NULL;
    }
}

static int series_start(void *self, const struct fk_unit *u)
{
    struct obs_series *o = self;
    series_release(o);
    int T = u->n_tokens, P = u->prompt_len;
    o->n_steps = T > P ? T - P : 0;
    for (int k = 0; k < 2; k++) {
        o->dict_norm[k] = calloc((size_t)o->n_steps + 1, sizeof(float));
        o->step_err[k] = calloc((size_t)o->n_steps + 1, sizeof(double));
        o->step_n[k] = calloc((size_t)o->n_steps + 1, sizeof(int32_t));
        if (!o->dict_norm[k] || !o->step_err[k] || !o->step_n[k])
            return fk_err(FK_ENOMEM, "out of memory");
    }
    return FK_OK;
}

static int series_commit(void *self, const struct fk_unit *u, const struct fk_commit *c)
{
    struct obs_series *o = self;
    const struct fk_event *ev = c->ev;
    (void)u;
    if (ev->phase != 1)
        return FK_OK;
    for (int i = 0; i < ev->n; i++) {
        if (c->out[i].flags & FK_VEC_ZERO)
            continue;
        int vs = c->tok_step ? c->tok_step[ev->token[i]] : ev->step;
        if (vs >= 0 && vs < o->n_steps) {
            o->step_err[c->kind][vs] += c->out[i].err;
            o->step_n[c->kind][vs]++;
        }
    }
    return FK_OK;
}

static int series_step(void *self, const struct fk_unit *u, const struct fk_step *s)
{
    struct obs_series *o = self;
    if (s->when != FK_STEP_END)
        return FK_OK;
    for (int k = 0; k < 2; k++) {
        struct fk_stream_stats ss;
        u->ops->stats(u->st[k], &ss);
        o->dict_norm[k][s->step] = ss.n_base ? (float)ss.n_atoms / ss.n_base : 1.0f;
    }
    return FK_OK;
}

static int series_finish(void *self, const struct fk_unit *u, struct fk_unit_result *r)
{
    struct obs_series *o = self;
    for (int k = 0; k < 2; k++) {
        struct fk_stream_result *sr = r->sr[k];
        sr->n_steps = o->n_steps;
        sr->n_tokens = u->n_tokens;
        sr->dict_norm = o->dict_norm[k];
        sr->step_err = o->step_err[k];
        sr->step_n = o->step_n[k];
        o->dict_norm[k] = NULL;
        o->step_err[k] = NULL;
        o->step_n[k] = NULL;
    }
    return FK_OK;
}

static const struct fk_observer_ops obs_series = {
    .name = "series", .size = sizeof(struct obs_series), .start = series_start,
    .on_commit = series_commit, .on_step = series_step, .on_finish = series_finish,
    .release = series_release,
};

/* ---- usage and activity: histograms, inactive atoms, Gini (spec 10.2) ------------------ */

struct obs_activity {
    long n_prefill_coded[2];  /* nonzero vectors coded in prefill */
};

static int activity_start(void *self, const struct fk_unit *u)
{
    (void)u;
    memset(self, 0, sizeof(struct obs_activity));
    return FK_OK;
}

static int activity_commit(void *self, const struct fk_unit *u, const struct fk_commit *c)
{
    struct obs_activity *o = self;
    (void)u;
    for (int i = 0; c->ev->phase == 0 && i < c->ev->n; i++)
        o->n_prefill_coded[c->kind] += !(c->out[i].flags & FK_VEC_ZERO);
    return FK_OK;
}

static int activity_finish(void *self, const struct fk_unit *u, struct fk_unit_result *r)
{
    struct obs_activity *o = self;
    for (int k = 0; k < 2; k++) {
        struct fk_stream_stats ss;
        u->ops->stats(u->st[k], &ss);
        FK_TRY(activity(r->sr[k], &ss, o->n_prefill_coded[k]));
        ss.ref_count = ss.prefill_use = ss.use_total = NULL;
        ss.is_adapted = NULL;
        r->sr[k]->st = ss;
    }
    return FK_OK;
}

static const struct fk_observer_ops obs_activity = {
    .name = "activity", .size = sizeof(struct obs_activity), .start = activity_start,
    .on_commit = activity_commit, .on_finish = activity_finish,
};

/* ---- screened-pool recall diagnostics (spec 10.4) -------------------------------------- */

struct obs_recall {
    float *xrow;   /* [m] an exact row converted to float32 */
    int cap_xrow;
};

static int recall_start(void *self, const struct fk_unit *u)
{
    struct obs_recall *o = self;
    return row_buf(&o->xrow, &o->cap_xrow, u->head_dim);
}

static int recall_finish(void *self, const struct fk_unit *u, struct fk_unit_result *r)
{
    struct obs_recall *o = self;
    const struct fk_codec_ops *ops = u->ops;
    for (int k = 0; k < 2; k++) {
        struct fk_stream_result *sr = r->sr[k];
        for (int q = 0; q < FK_RECALL_NS; q++)
            sr->recall[q] = NAN;
        sr->support_agree = sr->err_ratio = NAN;
        sr->screen_err_omp = sr->screen_err_scr = 0;
        const struct fk_option *os = fk_codec_role(ops, FK_ROLE_SPARSITY);
        const struct fk_option *on = fk_codec_role(ops, FK_ROLE_POOL);
        if (!u->ro->recall || !u->bases || !(ops->caps & FK_CAP_DICT) || !os)
            continue;
        int s = (int)fk_opts_get(u->opts, os);
        int n = on ? (int)fk_opts_get(u->opts, on) : FK_RECALL_POOL;
        FK_TRY(pool_recall(sr, u, k, o->xrow, s, n));
    }
    return FK_OK;
}

static void recall_release(void *self)
{
    struct obs_recall *o = self;
    free(o->xrow);
    o->xrow = NULL;
    o->cap_xrow = 0;
}

static const struct fk_observer_ops obs_recall = {
    .name = "recall", .size = sizeof(struct obs_recall), .start = recall_start,
    .on_finish = recall_finish, .release = recall_release,
};

/* ---- hashes and accounting: supports, bytes, encoder time (spec 10.6) ------------------ */

#define FNV_OFFSET 1469598103934665603ULL
#define FNV_PRIME 1099511628211ULL

struct obs_account {
    double cpu_s[2];  /* encode() thread CPU seconds */
    double tok_sum[2];/* sum over decode steps of B(t) / (t + 1) */
    int steps;        /* decode steps seen */
    /* A static codec's rows are encoded ahead of their eviction, so its stats count rows
     * not yet compressed: its held code bytes are summed from the rows' own bytes. */
    double *tok_bytes[2]; /* [T] bytes of token t's rows (every head), static codecs */
    int cap_tok;
    int done[2];      /* tokens summed into codes[] */
    double codes[2];  /* code bytes of tokens 0 .. done-1 */
    /* With an eviction policy, only retained rows count (families.md 0.1 item 6): */
    double *row_bytes[2]; /* [H][T] bytes of each coded row as encode() reported them */
    size_t cap_rows;
    double kept_codes[2]; /* bytes of the retained rows below n_comp */
    long kept_coded[2];   /* their count */
    long kept;            /* retained rows (head, token) up to the current token */
    double codes_seen[2]; /* the codec's bytes_codes after the last commit */
    int comp_seen[2];     /* tokens below which kept_codes counts the retained rows */
    long kept_pruned;     /* retained key rows whose channels think pruned (fk_unit) */
};

/* What think's channel pruning takes off stream k's bytes with `pruned` key rows stored
 * short (2 bytes per pruned channel each) and adds (a channel mask per KV head). */
static double think_bytes(const struct fk_unit *u, int k, double pruned)
{
    if (k != 0 || u->think_channels < 1 || u->think_tokens < 1)
        return 0;
    return (double)u->n_kv_heads * u->think_mask - pruned * 2.0 * u->think_channels;
}

/* Bytes of stream k held under a policy: the retained coded rows, the retained exact rows
 * (fp16), the dictionary state. */
static double held_kept(const struct obs_account *o, const struct fk_unit *u, int k)
{
    struct fk_stream_stats ss;
    u->ops->stats(u->st[k], &ss);
    return o->kept_codes[k] + ss.bytes_dict_seq +
           (double)(o->kept - o->kept_coded[k]) * u->head_dim * 2 +
           think_bytes(u, k, (double)o->kept_pruned);
}

/* A policy's step: token t arrives, the dropped rows leave, the rows coded since the last
 * step join the coded ones if retained; at FK_STEP_END adds B(t) / (t + 1). */
static void account_step_kept(struct obs_account *o, const struct fk_unit *u,
                              const struct fk_step *s)
{
    int H = u->n_kv_heads, T = u->n_tokens;
    if (s->when == FK_STEP_BEGIN) {
        o->kept += H;
        for (int i = 0; i < s->n_dropped; i++) {
            int j = s->dropped[i] % T;
            o->kept--;
            o->kept_pruned -= j < u->think_tokens;
            for (int k = 0; k < 2; k++)
                if (j < o->comp_seen[k]) {
                    o->kept_codes[k] -= o->row_bytes[k][s->dropped[i]];
                    o->kept_coded[k]--;
                }
        }
        return;
    }
    for (int k = 0; k < 2; k++) {
        for (int j = o->comp_seen[k]; j < s->n_comp[k]; j++)
            for (int h = 0; h < H; h++)
                if (u->keep[(size_t)h * T + j]) {
                    o->kept_codes[k] += o->row_bytes[k][(size_t)h * T + j];
                    o->kept_coded[k]++;
                }
        if (s->n_comp[k] > o->comp_seen[k])
            o->comp_seen[k] = s->n_comp[k];
        o->tok_sum[k] += held_kept(o, u, k) / (s->t + 1);
    }
    o->steps++;
}

/* Bytes of stream k held after step t: codes of the compressed tokens, dictionary state and
 * the exact (fp16) rows of tokens n_comp .. t of every head. */
static double held_bytes(struct obs_account *o, const struct fk_unit *u, int k, int t,
                         int n_comp)
{
    struct fk_stream_stats ss;
    u->ops->stats(u->st[k], &ss);
    double codes = ss.bytes_codes;
    if (u->ops->caps & FK_CAP_STATIC) {
        while (o->done[k] < n_comp)
            o->codes[k] += o->tok_bytes[k][o->done[k]++];
        codes = o->codes[k];
    }
    return codes + ss.bytes_dict_seq + (double)(t + 1 - n_comp) * u->n_kv_heads * u->head_dim * 2 +
           think_bytes(u, k, (double)u->n_kv_heads * u->think_tokens);
}

static int account_step(void *self, const struct fk_unit *u, const struct fk_step *s)
{
    struct obs_account *o = self;
    if (u->evict) {
        account_step_kept(o, u, s);
        return FK_OK;
    }
    if (s->when != FK_STEP_END)
        return FK_OK;
    for (int k = 0; k < 2; k++)
        o->tok_sum[k] += held_bytes(o, u, k, s->t, s->n_comp[k]) / (s->t + 1);
    o->steps++;
    return FK_OK;
}

static int account_start(void *self, const struct fk_unit *u)
{
    struct obs_account *o = self;
    double *keep[2] = {o->tok_bytes[0], o->tok_bytes[1]};
    double *rows[2] = {o->row_bytes[0], o->row_bytes[1]};
    int cap = o->cap_tok;
    size_t cap_rows = o->cap_rows;
    memset(o, 0, sizeof *o);
    o->tok_bytes[0] = keep[0];
    o->tok_bytes[1] = keep[1];
    o->row_bytes[0] = rows[0];
    o->row_bytes[1] = rows[1];
    o->cap_tok = cap;
    o->cap_rows = cap_rows;
    if (u->evict) {
        size_t n = (size_t)u->n_kv_heads * u->n_tokens;
        if (n > o->cap_rows) {
            for (int k = 0; k < 2; k++) {
                double *p = realloc(o->row_bytes[k], sizeof(double) * n);
                if (!p)
                    return fk_err(FK_ENOMEM, "out of memory");
                o->row_bytes[k] = p;
            }
            o->cap_rows = n;
        }
        for (int k = 0; k < 2; k++)
            memset(o->row_bytes[k], 0, sizeof(double) * n);
        o->kept = (long)u->n_kv_heads * u->prompt_len; /* the prefill's rows; steps add theirs */
        o->kept_pruned = (long)u->n_kv_heads * u->think_tokens;
    }
    if (!(u->ops->caps & FK_CAP_STATIC))
        return FK_OK;
    if (u->n_tokens > o->cap_tok) {
        for (int k = 0; k < 2; k++) {
            double *p = realloc(o->tok_bytes[k], sizeof(double) * (size_t)u->n_tokens);
            if (!p)
                return fk_err(FK_ENOMEM, "out of memory");
            o->tok_bytes[k] = p;
        }
        o->cap_tok = u->n_tokens;
    }
    for (int k = 0; k < 2; k++)
        memset(o->tok_bytes[k], 0, sizeof(double) * (size_t)u->n_tokens);
    return FK_OK;
}

static void account_release(void *self)
{
    struct obs_account *o = self;
    free(o->tok_bytes[0]);
    free(o->tok_bytes[1]);
    free(o->row_bytes[0]);
    free(o->row_bytes[1]);
    memset(o, 0, sizeof *o);
}

static int account_commit(void *self, const struct fk_unit *u, const struct fk_commit *c)
{
    struct obs_account *o = self;
    o->cpu_s[c->kind] += c->cpu_s;
    if (u->evict) {
        /* each row's bytes: as encode() reported them when they add up to what the codec's
         * stats grew by, else that growth shared evenly over the event's rows (codecs that
         * report per-row bytes only in stats, e.g. kivi) */
        struct fk_stream_stats ss;
        u->ops->stats(u->st[c->kind], &ss);
        double grew = ss.bytes_codes - o->codes_seen[c->kind], sum = 0;
        o->codes_seen[c->kind] = ss.bytes_codes;
        for (int i = 0; i < c->ev->n; i++)
            sum += c->out[i].bytes;
        int own = fabs(sum - grew) <= 1e-6 * (fabs(grew) + 1);
        for (int i = 0; i < c->ev->n; i++)
            o->row_bytes[c->kind][(size_t)c->ev->head[i] * u->n_tokens + c->ev->token[i]] =
                own ? c->out[i].bytes : grew / c->ev->n;
    }
    for (int i = 0; (u->ops->caps & FK_CAP_STATIC) && i < c->ev->n; i++)
        o->tok_bytes[c->kind][c->ev->token[i]] += c->out[i].bytes;
    return FK_OK;
}

/* FNV-1a of every stored row's atom ids (and, when asked, of each row): the reference mode
 * must reproduce them. */
static int support_hashes(const struct fk_unit *u, int k, struct fk_stream_result *sr)
{
    int H = u->n_kv_heads, comp = u->n_comp[k];
    uint64_t hsh = FNV_OFFSET;
    if (u->ro->row_hashes && u->ops->sparse_row && comp > 0) {
        sr->row_hash = malloc(sizeof(uint64_t) * (size_t)H * (size_t)comp);
        if (!sr->row_hash)
            return fk_err(FK_ENOMEM, "out of memory");
        sr->n_row_hash = (long)H * comp;
    }
    /* a row a skipping codec may never have coded (dropped: FK_CAP_SKIPS) hashes as empty */
    int skips = u->keep && (u->ops->caps & FK_CAP_SKIPS);
    for (int h = 0; u->ops->sparse_row && h < H; h++)
        for (int t = 0; t < comp; t++) {
            int nnz = 0;
            const int32_t *idx = NULL;
            const float *coef = NULL;
            if (!skips || u->keep[(size_t)h * u->n_tokens + t])
                FK_TRY(u->ops->sparse_row(u->st[k], h, t, &nnz, &idx, &coef));
            uint64_t rh = FNV_OFFSET;
            for (int i = 0; i <= nnz; i++) {
                rh ^= (uint64_t)(uint32_t)(i < nnz ? idx[i] : -1);
                rh *= FNV_PRIME;
            }
            if (sr->row_hash)
                sr->row_hash[(long)h * comp + t] = rh;
            hsh ^= rh;
            hsh *= FNV_PRIME;
        }
    sr->support_hash = hsh;
    return FK_OK;
}

static int account_finish(void *self, const struct fk_unit *u, struct fk_unit_result *r)
{
    struct obs_account *o = self;
    int H = u->n_kv_heads, T = u->n_tokens, m = u->head_dim;
    for (int k = 0; k < 2; k++) {
        struct fk_stream_result *sr = r->sr[k];
        FK_TRY(support_hashes(u, k, sr));
        sr->bytes_buf = (double)(T - u->n_comp[k]) * H * m * 2;
        sr->bytes_full = (double)T * H * m * 2;
        sr->n_kept = (long)H * T;
        /* think's short key rows below and above n_comp (every row kept without a policy) */
        int nt = u->think_tokens, nc = u->n_comp[k];
        long pr_codes = (long)H * (nt < nc ? nt : nc), pr_exact = (long)H * (nt > nc ? nt - nc : 0);
        if (u->evict) { /* the retained rows at the end, counted afresh */
            double codes = 0;
            long kept = 0, exact = 0;
            pr_codes = pr_exact = 0;
            for (int h = 0; h < H; h++)
                for (int t = 0; t < T; t++) {
                    size_t i = (size_t)h * T + t;
                    if (!u->keep[i])
                        continue;
                    kept++;
                    if (t < u->n_comp[k])
                        codes += o->row_bytes[k][i];
                    else
                        exact++;
                    if (t < nt)
                        *(t < nc ? &pr_codes : &pr_exact) += 1;
                }
            sr->n_kept = kept;
            sr->st.bytes_codes = codes;
            sr->bytes_buf = (double)exact * m * 2;
        }
        if (k == 0 && u->think_channels > 0 && u->think_tokens > 0) {
            sr->st.bytes_codes -= (double)pr_codes * 2 * u->think_channels;
            sr->bytes_buf -= (double)pr_exact * 2 * u->think_channels;
            sr->st.bytes_dict_seq += (double)H * u->think_mask;
        }
        sr->bytes_tok_avg = o->steps ? o->tok_sum[k] / o->steps : NAN;
        sr->n_heads = H;
        sr->head_dim = m;
        sr->cpu_s = o->cpu_s[k];
    }
    return FK_OK;
}

static const struct fk_observer_ops obs_account = {
    .name = "account", .size = sizeof(struct obs_account), .start = account_start,
    .on_commit = account_commit, .on_step = account_step, .on_finish = account_finish,
    .release = account_release,
};

/* ---- attention fidelity from the recorded queries (spec 10.5) -------------------------- */

struct obs_attn {
    struct fk_attn_acc acc;        /* this unit's accumulators */
    struct fk_attn_scratch *as;    /* sized by (m, T, H_q) below and the codec's atoms */
    int as_m, as_T, as_hq;
    float *qbuf;                   /* [H_q][m] the queries of one step */
    int cap_qbuf;
};

static int attn_start(void *self, const struct fk_unit *u)
{
    struct obs_attn *o = self;
    fk_attn_acc_free(&o->acc);
    memset(&o->acc, 0, sizeof o->acc);
    if (!u->attention)
        return FK_OK;
    int m = u->head_dim, T = u->n_tokens, hq = u->n_q_heads;
    if (!o->as || m > o->as_m || T > o->as_T || hq > o->as_hq) {
        fk_attn_scratch_free(&o->as);
        o->as_m = m > o->as_m ? m : o->as_m;
        o->as_T = T > o->as_T ? T : o->as_T;
        o->as_hq = hq > o->as_hq ? hq : o->as_hq;
        /* one atom to start with: every step grows it to what the codec holds */
        FK_TRY(fk_attn_scratch_create(o->as_m, o->as_T, 1, o->as_hq, &o->as));
    }
    return row_buf(&o->qbuf, &o->cap_qbuf, hq * m);
}

/* Makes the scratch hold the atoms the codec's K and V states declare now (atoms() of a
 * sparse codec and stats n_atoms): a codec's own dictionary, however it grew, and one
 * without a base dictionary at all. */
static int attn_reserve(struct obs_attn *o, const struct fk_unit *u)
{
    const struct fk_codec_ops *ops = u->ops;
    if (!(ops->caps & FK_CAP_SPARSE) || !ops->atoms)
        return FK_OK;
    int need = 1;
    for (int k = 0; k < 2; k++) {
        int na = 0;
        struct fk_stream_stats ss;
        ops->atoms(u->st[k], &na);
        ops->stats(u->st[k], &ss);
        need = na > need ? na : need;
        need = ss.n_atoms > need ? ss.n_atoms : need;
    }
    return fk_attn_scratch_reserve(o->as, need);
}

static int attn_step(void *self, const struct fk_unit *u, const struct fk_step *s)
{
    struct obs_attn *o = self;
    if (s->when != FK_STEP_BEGIN || !u->attention || s->step % u->ro->attn_stride != 0 ||
        u->qrow[s->t] < 0)
        return FK_OK;
    double a0 = fk_clock_s(CLOCK_THREAD_CPUTIME_ID);
    int m = u->head_dim, hq = u->n_q_heads;
    for (int h = 0; h < hq; h++)
        memcpy(o->qbuf + (size_t)h * m, u->q + ((size_t)h * u->n_qsel + u->qrow[s->t]) * m,
               sizeof(float) * (size_t)m);
    struct fk_attn_in ai = {.m = m, .n_q_heads = hq, .n_kv_heads = u->n_kv_heads,
                            .n_tokens = u->n_tokens, .t = s->t, .n_comp_k = s->n_comp[0],
                            .n_comp_v = s->n_comp[1],
                            .q = o->qbuf, .k = u->kv[0], .v = u->kv[1],
                            .k_enc = u->kv_enc[0], .v_enc = u->kv_enc[1], .ops = u->ops,
                            .kstate = u->st[0], .vstate = u->st[1],
                            .inv_scale = u->attn_inv_scale, .softcap = u->attn_softcap,
                            .window = u->attn_window, .keep = u->keep,
                            .k_cache = u->kvw[0], .v_cache = u->kvw[1]};
    int rc = s->n_comp[0] > 0 || s->n_comp[1] > 0 || u->keep || u->kvw[0]
                 ? attn_reserve(o, u)
                 : FK_OK;
    if (rc == FK_OK)
        rc = fk_attn_eval(&ai, o->as, &o->acc);
    u->times->t_attn += fk_clock_s(CLOCK_THREAD_CPUTIME_ID) - a0;
    return rc;
}

static int attn_finish(void *self, const struct fk_unit *u, struct fk_unit_result *r)
{
    struct obs_attn *o = self;
    (void)u;
    fk_attn_acc_free(r->attn);
    *r->attn = o->acc;
    memset(&o->acc, 0, sizeof o->acc);
    return FK_OK;
}

static int attn_merge(void *self, const void *other)
{
    return fk_attn_acc_merge(&((struct obs_attn *)self)->acc,
                             &((const struct obs_attn *)other)->acc);
}

static void attn_release(void *self)
{
    struct obs_attn *o = self;
    fk_attn_acc_free(&o->acc);
    fk_attn_scratch_free(&o->as);
    free(o->qbuf);
    o->qbuf = NULL;
    o->cap_qbuf = o->as_m = o->as_T = o->as_hq = 0;
}

static const struct fk_observer_ops obs_attn = {
    .name = "attention", .size = sizeof(struct obs_attn), .start = attn_start,
    .on_step = attn_step, .on_finish = attn_finish, .merge = attn_merge,
    .release = attn_release,
};

/* ---- the list -------------------------------------------------------------------------- */

const struct fk_observer_ops *const fk_observers[] = {
    &obs_errors, &obs_series, &obs_activity, &obs_recall, &obs_account, &obs_attn, NULL,
};

void fk_obs_set_free(struct fk_obs_set *set)
{
    for (int i = 0; set->self && i < set->n; i++) {
        if (set->self[i] && set->ops[i]->release)
            set->ops[i]->release(set->self[i]);
        free(set->self[i]);
    }
    free(set->self);
    free(set->ops);
    memset(set, 0, sizeof *set);
}

int fk_obs_set_create(struct fk_obs_set *set)
{
    int n = 0;
    while (fk_observers[n])
        n++;
    set->n = n;
    set->ops = calloc((size_t)n, sizeof *set->ops);
    set->self = calloc((size_t)n, sizeof *set->self);
    if (!set->ops || !set->self) {
        fk_obs_set_free(set);
        return fk_err(FK_ENOMEM, "out of memory");
    }
    for (int i = 0; i < n; i++) {
        set->ops[i] = fk_observers[i];
        set->self[i] = calloc(1, fk_observers[i]->size);
        if (!set->self[i]) {
            fk_obs_set_free(set);
            return fk_err(FK_ENOMEM, "out of memory");
        }
    }
    return FK_OK;
}
