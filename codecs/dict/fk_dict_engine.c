/* SPDX-License-Identifier: MIT
 * The dictionary engine (dict/fk_dict_engine.h): the state of a stream group, the stored
 * codes and the eviction-event protocol every dictionary codec shares.
 *
 * Eviction-event protocol (spec section 4): phase A encodes every vector against the state
 * at the start of the event; phase B commits the codes that need no adaptation and pins
 * their atoms; phase C adapts the rest in (token, head) order. Results do not depend on
 * threads.
 *
 * The universal dictionary is shared and never written: a stream that adapts first copies
 * it (copy-on-write of the whole block, 2 MiB at N = 4096, m = 128) and grows or rewrites
 * its copy. Gram rows of appended atoms are maintained incrementally (m * N_t MACs per
 * append) for OMP in Gram mode instead of recomputing D^T D.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/fk_clock.h"
#include "common/fk_err.h"
#include "dict/fk_dict_engine.h"


const struct fk_role dc_roles[] = {
    {FK_ROLE_SPARSITY, "s"},      {FK_ROLE_POOL, "n"},         {FK_ROLE_COHERENCE, "tau_c"},
    {FK_ROLE_DELTA_K, "delta_k"}, {FK_ROLE_DELTA_V, "delta_v"}, {FK_ROLE_INDEX_BYTES, "ptr_bytes"},
    {0, NULL}};

/* ---- dictionary access ---------------------------------------------------------------- */

const float *dc_atoms(const struct dc *d)
{
    return d->atoms ? d->atoms : d->base->atoms;
}

/* Row j: an appended atom's row is one piece; a base atom's is its row of the stored Gram
 * and, once atoms were appended, the tail of their entries, gathered into gb as far as it
 * was not yet (read in place: a copy of the 16 KiB base row per read cost lexico-adp 15 %
 * of its CPU at N = 4096). */
static struct fk_gram_row dc_gram_row(void *ctx, int j, float *scratch)
{
    struct dc *d = ctx;
    (void)scratch;
    int A = d->Nt - d->N;
    if (j >= d->N)
        return (struct fk_gram_row){.head = d->ga[j - d->N]};
    const float *g0 = d->gram + (size_t)j * (size_t)d->N;
    if (A == 0)
        return (struct fk_gram_row){.head = g0};
    float *t = d->gb + (size_t)j * (size_t)d->gb_ld;
    for (int a = d->gb_fill[j]; a < A; a++)
        t[a] = d->ga[a][j];
    d->gb_fill[j] = A;
    return (struct fk_gram_row){.head = g0, .tail = t, .split = d->N};
}

struct fk_dict_view dc_view(struct dc *d)
{
    struct fk_dict_view v = {
        .m = d->m, .n_atoms = d->Nt, .atoms = dc_atoms(d), .dead = d->dead,
        .gram_row = NULL, .gram_ctx = d,
    };
    if (d->use_gram)
        v.gram_row = dc_gram_row;
    return v;
}

/* Copy-on-write of the universal dictionary before the first change. */
int dc_own_atoms(struct dc *d)
{
    if (d->atoms)
        return FK_OK;
    d->atoms = malloc(sizeof(float) * (size_t)d->acap * (size_t)d->m);
    if (!d->atoms)
        return fk_err(FK_ENOMEM, "out of memory (dictionary copy)");
    memcpy(d->atoms, d->base->atoms, sizeof(float) * (size_t)d->N * (size_t)d->m);
    return FK_OK;
}

static size_t dc_work_floats(const struct dc *d, size_t n_atoms)
{
    size_t w = fk_omp_work_floats((int)n_atoms, d->m, d->o.code.s + 1) + 2 * n_atoms + 64;
    if (d->coder->work_floats) {
        size_t wc = d->coder->work_floats((int)n_atoms, d->m, d->o.code.s);
        w = wc > w ? wc : w;
    }
    return w;
}

#define DC_GROW(p, n, type)                                                                 \
    do {                                                                                    \
        type *np_ = realloc((p), sizeof(type) * (n));                                       \
        if (!np_)                                                                           \
            return fk_err(FK_ENOMEM, "out of memory (%zu atoms)", (size_t)(n));           \
        (p) = np_;                                                                          \
    } while (0)

#define DC_RENEW(p, n, type)                                                                \
    do {                                                                                    \
        free(p);                                                                            \
        (p) = malloc(sizeof(type) * (n));                                                   \
        if (!(p))                                                                           \
            return fk_err(FK_ENOMEM, "out of memory (%zu atoms)", (size_t)(n));           \
    } while (0)

/* Per-atom arrays for at least `need` atoms (need <= cap), zero-initialised (pinned: -1);
 * dc_open allocates them with it (acap 0, need N).
 * The appended part of the capacity doubles (64, 128, ...): memory follows the atoms a
 * stream actually appends, not the worst case its length would allow (N + T x heads). */
static int dc_reserve(struct dc *d, int need)
{
    if (need <= d->acap)
        return FK_OK;
    long n = need; /* at open: exactly the base atoms */
    if (d->acap > 0) {
        n = (long)d->N + 2L * (d->acap - d->N);
        n = n < (long)d->N + 64 ? (long)d->N + 64 : n;
        n = n < need ? need : n;
    }
    n = n > d->cap ? d->cap : n;
    size_t o = (size_t)d->acap, c = (size_t)n;
    if (d->atoms)
        DC_GROW(d->atoms, c * (size_t)d->m, float);
    DC_GROW(d->dead, c, uint8_t);
    DC_GROW(d->ref_count, c, uint32_t);
    DC_GROW(d->prefill_use, c, uint32_t);
    DC_GROW(d->use_total, c, uint32_t);
    DC_GROW(d->last_use, c, int32_t);
    DC_GROW(d->ema, c, double);
    DC_GROW(d->is_adapted, c, uint8_t);
    DC_GROW(d->pinned, c, int32_t);
    DC_GROW(d->pool, FK_REFINE_LANES * c, int32_t); /* the GM coder's pools, c apart */
    /* scratch whose contents no caller keeps across a growth: allocated anew, not copied
     * (a realloc copied 4 to 8 MiB per growth step, into pages faulted in for it) */
    DC_RENEW(d->corr, (size_t)DC_BLK * c, float);
    size_t wf = dc_work_floats(d, c);
    DC_RENEW(d->work, wf, float);
    d->work_floats = wf;
    memset(d->dead + o, 0, c - o);
    memset(d->ref_count + o, 0, sizeof(uint32_t) * (c - o));
    memset(d->prefill_use + o, 0, sizeof(uint32_t) * (c - o));
    memset(d->use_total + o, 0, sizeof(uint32_t) * (c - o));
    memset(d->last_use + o, 0, sizeof(int32_t) * (c - o));
    memset(d->is_adapted + o, 0, c - o);
    for (size_t j = o; j < c; j++) {
        d->ema[j] = 0;
        d->pinned[j] = -1;
    }
    d->acap = (int)n;
    return FK_OK;
}

/* Appends unit atom u; maintains Gram rows when OMP runs in Gram mode. */
int dc_append_atom(struct dc *d, const float *u)
{
    FK_TRY(dc_reserve(d, d->Nt + 1));
    FK_TRY(dc_own_atoms(d));
    int j = d->Nt;
    memcpy(d->atoms + (size_t)j * (size_t)d->m, u, sizeof(float) * (size_t)d->m);
    d->dead[j] = 0;
    d->Nt++;
    struct fk_dict_view v = dc_view(d);
    if (v.gram_row) {
        int a = j - d->N;
        if (a + 1 > d->ga_cols) { /* room for one more column in every row */
            int cols = d->ga_cols ? d->ga_cols * 2 : 64;
            while (cols < a + 1)
                cols *= 2;
            if (cols > d->cap - d->N)
                cols = d->cap - d->N;
            for (int r = 0; r < a; r++) {
                float *nr = realloc(d->ga[r], sizeof(float) * ((size_t)d->N + (size_t)cols));
                if (!nr)
                    return fk_err(FK_ENOMEM, "out of memory (Gram rows of appended atoms)");
                d->ga[r] = nr;
            }
            d->ga_cols = cols;
        }
        if (d->gb_ld != d->ga_cols) { /* the tails, gathered again as rows are read */
            free(d->gb);
            d->gb = malloc(sizeof(float) * (size_t)d->N * (size_t)d->ga_cols);
            if (!d->gb_fill)
                d->gb_fill = malloc(sizeof(int32_t) * (size_t)d->N);
            if (!d->gb || !d->gb_fill)
                return fk_err(FK_ENOMEM, "out of memory (Gram rows of appended atoms)");
            memset(d->gb_fill, 0, sizeof(int32_t) * (size_t)d->N);
            d->gb_ld = d->ga_cols;
        }
        if (a >= d->ga_slots) {
            int slots = d->ga_slots ? d->ga_slots * 2 : 64;
            float **ns = realloc(d->ga, sizeof(float *) * (size_t)slots);
            if (!ns)
                return fk_err(FK_ENOMEM, "out of memory (Gram rows of appended atoms)");
            memset(ns + d->ga_slots, 0, sizeof(float *) * (size_t)(slots - d->ga_slots));
            d->ga = ns;
            d->ga_slots = slots;
        }
        float *row = malloc(sizeof(float) * ((size_t)d->N + (size_t)d->ga_cols));
        if (!row)
            return fk_err(FK_ENOMEM, "out of memory (Gram rows of appended atoms)");
        d->ga[a] = row;
        fk_correlate(&v, u, 1, row); /* row[i] = d_i . u for i < Nt */
        for (int r = 0; r < a; r++)
            d->ga[r][j] = row[d->N + r];
        d->st.macs += (double)d->m * d->Nt;
    }
    return FK_OK;
}

/* ---- codes ---------------------------------------------------------------------------- */

static float quantise(struct dc *d, double c)
{
    switch (d->o.c.coef) {
    case FK_COEF_FP8: return fk_fp8_decode(fk_fp8_encode(c, &d->st.saturated));
    case FK_COEF_FP16: return fk_fp16_decode(fk_fp16_encode((float)c));
    default: return (float)c;
    }
}

static double row_err2(const struct dc *d, const float *x, int k, const int32_t *idx,
                       const float *coef, float *xh)
{
    const float *A = dc_atoms(d);
    memset(xh, 0, sizeof(float) * (size_t)d->m);
    for (int i = 0; i < k; i++) {
        const float *a = A + (size_t)idx[i] * (size_t)d->m;
        for (int c = 0; c < d->m; c++)
            xh[c] += coef[i] * a[c];
    }
    double e = 0;
    for (int c = 0; c < d->m; c++) {
        double r = (double)x[c] - xh[c];
        e += r * r;
    }
    return e;
}

static void use_atom(struct dc *d, int j, int phase, int step, int delta)
{
    if (delta < 0) {
        d->ref_count[j]--;
        return;
    }
    d->ref_count[j]++;
    d->use_total[j]++;
    d->st.uses_total++;
    if (d->is_adapted[j])
        d->st.uses_adapted++;
    if (phase == 0) {
        d->prefill_use[j]++;
        return;
    }
    if (!d->adapt || !d->adapt->reads_activity)
        return; /* only a replacement reads the activity (a pow per atom use saved) */
    int dt = step - d->last_use[j];
    d->ema[j] = d->ema[j] * pow(d->o.adapt.ema_gamma, dt > 0 ? dt : 0) + 1.0;
    d->last_use[j] = step;
}

/* Bytes of a stored row of k coefficients (spec 10.6): value and index per coefficient and
 * the row pointer. */
static double dc_row_bytes(const struct dc *d, int k)
{
    int b_val = d->o.c.coef == FK_COEF_FP8 ? 1 : d->o.c.coef == FK_COEF_FP16 ? 2 : 4;
    int b_idx = d->cap > DC_IDX16_MAX ? 4 : 2;
    return (double)k * (b_val + b_idx) + d->o.ptr_bytes;
}

/* Stores code c as row `token` of `head` (a new row, or a rewrite of a stored one) and
 * fills out. Within an event, new rows may be committed out of token order (phase B before
 * phase C); the event was checked to hold later tokens of each head, in order. */
void dc_commit(struct dc *d, int head, int token, const float *x, const struct fk_code *c,
               int phase, int step, struct fk_vec_out *out, uint32_t flags, int rewrite)
{
    struct dc_rows *r = &d->heads[head];
    size_t off = (size_t)token * (size_t)d->stride;
    if (rewrite) {
        for (int i = 0; i < r->nnz[token]; i++)
            use_atom(d, r->idx[off + i], phase, step, -1);
        d->nnz_total -= (uint64_t)r->nnz[token];
    } else {
        if (token + 1 > r->n)
            r->n = token + 1;
        d->rows_total++;
    }
    r->nnz[token] = c->k;
    for (int i = 0; i < c->k; i++) {
        r->idx[off + i] = c->idx[i];
        r->coef[off + i] = quantise(d, c->coef[i]);
        use_atom(d, c->idx[i], phase, step, 1);
        d->pinned[c->idx[i]] = d->event_id;
    }
    d->nnz_total += (uint64_t)c->k;
    if (!out)
        return;
    out->nnz = c->k;
    out->bytes = (float)dc_row_bytes(d, c->k);
    out->flags = flags;
    if (c->flags & FK_CODE_ZERO) {
        out->flags |= FK_VEC_ZERO;
        out->err = out->err_enc = 0;
        return;
    }
    if (c->flags & FK_CODE_PREMATURE) {
        out->flags |= FK_VEC_PREMATURE;
        d->st.premature++;
    }
    if (c->flags & FK_CODE_GUARDED)
        d->st.guarded++;
    out->err_enc = (float)sqrt(c->err2 / c->xx);
    out->err = (float)sqrt(row_err2(d, x, c->k, r->idx + off, r->coef + off, d->xbuf) / c->xx);
}

/* ---- coders --------------------------------------------------------------------------- */
/* ---- ops ------------------------------------------------------------------------------ */

void dc_close(void *state)
{
    struct dc *d = state;
    if (!d)
        return;
    if (d->heads)
        for (int h = 0; h < d->env.n_heads; h++) {
            free(d->heads[h].nnz);
            free(d->heads[h].idx);
            free(d->heads[h].coef);
        }
    free(d->heads);
    free(d->atoms);
    free(d->dead);
    for (int r = 0; d->ga && r < d->ga_slots; r++)
        free(d->ga[r]);
    free(d->ga);
    free(d->gb);
    free(d->gram_own);
    free(d->gb_fill);
    free(d->ref_count);
    free(d->prefill_use);
    free(d->use_total);
    free(d->last_use);
    free(d->ema);
    free(d->is_adapted);
    free(d->pinned);
    free(d->corr);
    free(d->work);
    free(d->pool);
    free(d->xbuf);
    free(d->rbuf);
    free(d->codes);
    free(d->needs);
    free(d->acorr);
    free(d->arows);
    free(d->stale);
    free(d->stale_ids);
    free(d->ah_scratch);
    free(d);
}

int dc_pool_default(int s, int n_atoms)
{
    int n = n_atoms / 16;
    if (n < s)
        n = s;
    return n < n_atoms ? n : n_atoms;
}

void dc_resolve(void *opts, int head_dim, int n_atoms)
{
    (void)head_dim;
    struct dc_opts *o = opts;
    if (o->code.n == 0 && n_atoms > 0)
        o->code.n = dc_pool_default(o->code.s, n_atoms);
}

int dc_check(const struct dc_adapt *adapt, int screened, const void *opts, int head_dim,
             int n_atoms)
{
    (void)head_dim;
    const struct dc_opts *o = opts;
    const struct dc_code_opts *co = &o->code;
    /* n = 0: N/16 when the dictionary is known (dc_resolve) */
    if (screened && co->n > 0 && co->s > co->n)
        return fk_err(FK_ECONFIG, "s = %d must not exceed the pool size n = %d", co->s, co->n);
    if (screened && n_atoms > 0 && co->n > n_atoms)
        return fk_err(FK_ECONFIG, "pool size n = %d exceeds the dictionary's N = %d atoms",
                      co->n, n_atoms);
    if (n_atoms > 0 && co->s > n_atoms)
        return fk_err(FK_ECONFIG, "s = %d exceeds the dictionary's N = %d atoms", co->s,
                      n_atoms);
    if (o->ptr_bytes != 2 && o->ptr_bytes != 4)
        return fk_err(FK_ECONFIG, "ptr_bytes = %d: expected 2 or 4", o->ptr_bytes);
    if (adapt && adapt->check)
        FK_TRY(adapt->check(o, n_atoms));
    return FK_OK;
}

/* The stored rows: T + 1 per head, s + 1 coefficient slots each. */
static int dc_alloc_rows(struct dc *d)
{
    size_t T = (size_t)d->env.n_tokens + 1;
    d->heads = calloc((size_t)d->env.n_heads, sizeof *d->heads);
    int ok = d->heads != NULL;
    for (int h = 0; ok && h < d->env.n_heads; h++) {
        d->heads[h].nnz = calloc(T, sizeof(int32_t));
        d->heads[h].idx = malloc(sizeof(int32_t) * T * (size_t)d->stride);
        d->heads[h].coef = malloc(sizeof(float) * T * (size_t)d->stride);
        ok = d->heads[h].nnz && d->heads[h].idx && d->heads[h].coef;
    }
    return ok;
}

/* The stream's own Gram of the base atoms (dc_coder.own_gram_max); its thread CPU time
 * counts as correlation time, as the harness's Gram counts for lexico, and like that one it
 * is not in the cost model (spec 10.7 counts per vector; the Gram rows of appended and
 * rewritten atoms are). */
static int own_gram(struct dc *d)
{
    double c0 = fk_thread_cpu_s();
    d->gram_own = fk_gram_alloc((size_t)d->N * (size_t)d->N);
    if (!d->gram_own)
        return fk_err(FK_ENOMEM, "out of memory (a %d x %d Gram matrix)", d->N, d->N);
    FK_TRY(fk_gram_compute(d->base->atoms, d->N, d->m, d->gram_own));
    d->gram = d->gram_own;
    d->use_gram = 1;
    d->st.t_corr += fk_thread_cpu_s() - c0;
    return FK_OK;
}

int dc_open(const struct dc_coder *coder, const struct dc_adapt *adapt, const void *opts,
            const struct fk_stream_env *env, void **state)
{
    if (!env->base)
        return fk_err(FK_EINVAL, "dictionary codec opened without a dictionary");
    struct dc *d = calloc(1, sizeof *d);
    if (!d)
        return fk_err(FK_ENOMEM, "out of memory");
    d->coder = coder;
    d->adapt = adapt;
    memcpy(&d->o, opts, sizeof d->o);
    dc_resolve(&d->o, env->head_dim, env->base->n_atoms);
    d->env = *env;
    d->base = env->base;
    d->m = env->head_dim;
    d->N = d->Nt = env->base->n_atoms;
    d->stride = d->o.code.s + 1;
    d->delta = env->kind == 0 ? d->o.adapt.delta_k : d->o.adapt.delta_v;
    d->last_adapt_step = -1;
    d->cap = adapt ? adapt->cap(d) : d->N;
    if (d->m != env->base->m) {
        int m = d->m; /* read before the state is freed */
        dc_close(d);
        return fk_err(FK_EINVAL, "dictionary head_dim %d != stream head_dim %d", env->base->m,
                      m);
    }
    int gram = coder->wants_gram && coder->wants_gram(&d->o.code);
    if (gram && !env->base->gram && !env->reference) {
        dc_close(d);
        return fk_err(FK_EINVAL, "omp_mode = gram needs the dictionary's Gram matrix");
    }
    d->use_gram = gram && env->base->gram && !env->reference && (!adapt || adapt->keeps_gram);
    d->gram = env->base->gram;
    if (!gram && coder->own_gram_max > 0 && d->N <= coder->own_gram_max && !env->reference) {
        int rc = own_gram(d);
        if (rc < 0) {
            dc_close(d);
            return rc;
        }
    }
    d->xbuf = malloc(sizeof(float) * (size_t)d->m);
    d->rbuf = malloc(sizeof(float) * (size_t)d->m);
    int ok = dc_alloc_rows(d) && d->xbuf && d->rbuf;
    if (!ok || dc_reserve(d, d->N) < 0) { /* per-atom arrays, grown as atoms are appended */
        dc_close(d);
        return fk_err(FK_ENOMEM, "out of memory (codec state)");
    }
    if (env->base->dead)
        memcpy(d->dead, env->base->dead, (size_t)d->N);
    *state = d;
    return FK_OK;
}

#define AH_ROOM(cols) ((cols) / 4 > 256 ? (cols) / 4 : 256) /* the window's spare columns */

int dc_open_ahead(const struct dc_coder *coder, const struct dc_adapt *adapt, const void *opts,
                  const struct fk_stream_env *env, const float *ahead, void **state)
{
    FK_TRY(dc_open(coder, adapt, opts, env, state));
    struct dc *d = *state;
    if (!ahead || env->reference || env->n_heads <= 0 || env->n_tokens <= 0)
        return FK_OK;
    int H = env->n_heads;
    d->ah_tok = DC_BLK / H > 1 ? DC_BLK / H : 1;
    size_t rows = (size_t)H * (size_t)d->ah_tok;
    /* room for atoms a growing stream appends (a window computed again on new memory
     * faults in every page of it: 4 MiB at N 4096) */
    d->ah_cols = d->N + (d->cap > d->N ? AH_ROOM(d->N) : 0);
    d->acorr = malloc(sizeof(float) * rows * (size_t)d->ah_cols);
    d->arows = calloc(rows * (size_t)d->m, sizeof(float));
    d->stale = calloc((size_t)d->N, 1);
    d->stale_ids = malloc(sizeof(int32_t) * (size_t)d->N);
    if (!d->acorr || !d->arows || !d->stale || !d->stale_ids) {
        dc_close(d);
        *state = NULL;
        return fk_err(FK_ENOMEM, "out of memory (correlations ahead)");
    }
    d->ahead = ahead;
    return FK_OK;
}

static int dc_grow_codes(struct dc *d, int n)
{
    if (n <= d->codes_cap)
        return FK_OK;
    struct fk_code *c = realloc(d->codes, sizeof *c * (size_t)n);
    if (!c)
        return fk_err(FK_ENOMEM, "out of memory (event codes)");
    d->codes = c;
    uint8_t *nd = realloc(d->needs, (size_t)n);
    if (!nd)
        return fk_err(FK_ENOMEM, "out of memory (event codes)");
    d->needs = nd;
    d->codes_cap = n;
    return FK_OK;
}

int dc_encode_fresh(struct dc *d, const float *x, struct fk_code *c)
{
    struct fk_dict_view v = dc_view(d);
    fk_correlate(&v, x, 1, d->corr);
    return d->coder->encode(d, &v, 1, x, d->corr, (size_t)d->Nt, c);
}

/* The event must hold the next tokens of each head, each once, in order; an adaptive
 * codec (FK_CAP_SKIPS) may skip the tokens an eviction policy dropped before their turn
 * (their rows stay empty). */
static int check_event(struct dc *d, const struct fk_event *ev)
{
    int skips = d->adapt != NULL;
    for (int h = 0; h < d->env.n_heads; h++)
        d->heads[h].expect = d->heads[h].n;
    for (int i = 0; i < ev->n; i++) {
        int h = ev->head[i], t = ev->token[i];
        if (h < 0 || h >= d->env.n_heads || t >= d->env.n_tokens ||
            (skips ? t < d->heads[h].expect : t != d->heads[h].expect))
            return fk_err(FK_EINVAL, "event vector %d: (head %d, token %d) is not %s row of "
                          "that head", i, h, t, skips ? "a later" : "the next");
        d->heads[h].expect = t + 1;
    }
    return FK_OK;
}

/* ---- correlations ahead -----------------------------------------------------------------
 * In a decode, an adaptive codec's events hold one token of every head (a_len = 1): one
 * correlation SGEMM per event would pack the whole dictionary again for a handful of rows
 * (at N = 4096 that made gm's correlations cost twice lexico's, whose codes are computed
 * ahead in large blocks). When the rows of later events are known (a trace replay opens the
 * codec with them, dc_open_ahead), the correlations of the rows of the next ah_tok tokens
 * of every head (DC_BLK rows, the window) with every atom the stream has then come from one
 * SGEMM, and an event whose rows are those rows (compared bit for bit) copies its
 * correlations from there. The atoms that changed since (appended atoms, fadkv's rewritten
 * slots) get their columns from a product of the event's rows with those atoms alone.
 * Which product a correlation comes from is fixed by the stream's events: the numbers are
 * the same at any thread count, job count and shard split, and they agree with one SGEMM
 * per event up to the BLAS's rounding (docs/PORTABILITY.md). */

void dc_slot_rewritten(struct dc *d, int j)
{
    if (d->gram_own && j < d->N && d->Nt > d->N) {
        d->use_gram = 0; /* appended atoms' entries are not rewritten: the naive mode */
    } else if (d->gram_own && j < d->N) { /* row and column j of the own Gram */
        float *row = d->gram_own + (size_t)j * (size_t)d->N;
        const float *A = dc_atoms(d);
        fk_correlate_to(A, d->N, d->m, A + (size_t)j * (size_t)d->m, 1, row, (size_t)d->N);
        for (int i = 0; i < d->N; i++)
            d->gram_own[(size_t)i * (size_t)d->N + (size_t)j] = row[i];
        d->st.macs += (double)d->m * d->N;
    }
    if (!d->ahead || j >= d->ah_nt)
        return;
    if (j >= d->N) { /* not tracked: the window is computed again when next needed */
        d->ah_n = 0;
        return;
    }
    if (d->stale[j])
        return;
    d->stale[j] = 1;
    d->stale_ids[d->n_stale++] = j;
}

/* The window of tokens t0 .. t0 + ah_tok - 1 (within the trace) of every head, against
 * the current atoms, rows of ah_ld = ah_cols floats (room for atoms appended later); 0 when
 * out of memory (the lookahead is then off). */
static int ahead_fill(struct dc *d, int t0)
{
    int H = d->env.n_heads, T = d->env.n_tokens, m = d->m, Nt = d->Nt;
    size_t rows = (size_t)H * d->ah_tok;
    if (Nt > d->ah_cols) {
        int cols = d->ah_cols + AH_ROOM(d->ah_cols);
        cols = cols > Nt ? cols : Nt;
        free(d->acorr); /* computed again below: nothing to keep */
        d->acorr = malloc(sizeof(float) * rows * (size_t)cols);
        if (!d->acorr) {
            d->ahead = NULL;
            return 0;
        }
        d->ah_cols = cols;
    }
    int n = T - t0 < d->ah_tok ? T - t0 : d->ah_tok;
    for (int h = 0; h < H; h++)
        memcpy(d->arows + (size_t)h * d->ah_tok * m, d->ahead + ((size_t)h * T + t0) * m,
               sizeof(float) * (size_t)n * m);
    d->ah_ld = (size_t)d->ah_cols;
    fk_correlate_to(dc_atoms(d), Nt, m, d->arows, (int)rows, d->acorr, d->ah_ld);
    for (int i = 0; i < d->n_stale; i++)
        d->stale[d->stale_ids[i]] = 0;
    d->n_stale = 0;
    d->ah_t0 = t0;
    d->ah_n = n;
    d->ah_nt = Nt;
    return 1;
}

/* The columns of the rewritten slots (stale_ids) for nc rows x into a (row r at a + r lda):
 * the slots' atoms gathered, one product, scattered. 0 when out of memory. */
static int stale_columns(struct dc *d, const float *x, int nc, float *a, size_t lda)
{
    int ns = d->n_stale, m = d->m;
    size_t need = (size_t)ns * (size_t)m + (size_t)nc * (size_t)ns;
    if (need > d->ah_scratch_n) {
        float *g = realloc(d->ah_scratch, sizeof(float) * need);
        if (!g)
            return 0;
        d->ah_scratch = g;
        d->ah_scratch_n = need;
    }
    float *atoms = d->ah_scratch, *c = d->ah_scratch + (size_t)ns * m;
    const float *A = dc_atoms(d);
    for (int i = 0; i < ns; i++)
        memcpy(atoms + (size_t)i * m, A + (size_t)d->stale_ids[i] * m, sizeof(float) * (size_t)m);
    fk_correlate_to(atoms, ns, m, x, nc, c, (size_t)ns);
    for (int r = 0; r < nc; r++)
        for (int i = 0; i < ns; i++)
            a[(size_t)r * lda + (size_t)d->stale_ids[i]] = c[(size_t)r * ns + i];
    return 1;
}

/* The correlations of nc event rows x (tokens tok, heads head, in token order) with every
 * current atom from the window: NULL when it cannot (a row is not the row ahead, or the rows
 * span more tokens than a window, or no memory). When the rows lie evenly spaced in the
 * window (an event of one token of every head, in head order) and their rows have room for
 * the atoms appended since, they are served in place (row i at the result + i *lda; the
 * changed atoms' columns written into them: each window row belongs to one event);
 * otherwise copied into d->corr (*lda = Nt). */
static const float *ahead_fetch(struct dc *d, const float *x, const int32_t *tok,
                                const int32_t *head, int nc, size_t *lda)
{
    int T = d->env.n_tokens, m = d->m, Nt = d->Nt;
    int t_lo = tok[0], t_hi = tok[nc - 1];
    if (t_hi - t_lo >= d->ah_tok)
        return NULL;
    if ((t_lo < d->ah_t0 || t_hi >= d->ah_t0 + d->ah_n) && !ahead_fill(d, t_lo))
        return NULL;
    int nw = d->ah_nt;
    size_t ld = d->ah_ld, r0 = 0, step = 1;
    int even = Nt <= d->ah_cols; /* room for the atoms appended since */
    for (int i = 0; i < nc; i++) {
        int t = tok[i], h = head[i];
        if (t < d->ah_t0 || t >= d->ah_t0 + d->ah_n ||
            memcmp(x + (size_t)i * m, d->ahead + ((size_t)h * T + t) * m,
                   sizeof(float) * (size_t)m))
            return NULL;
        size_t ri = (size_t)h * d->ah_tok + (size_t)(t - d->ah_t0);
        if (i == 0)
            r0 = ri;
        else if (i == 1)
            step = ri - r0; /* wraps when ri < r0: then not even */
        even &= ri == r0 + (size_t)i * step && (i == 0 || ri > r0);
    }
    float *a;
    if (even) {
        a = d->acorr + r0 * ld;
        *lda = step * ld;
    } else {
        a = d->corr;
        *lda = (size_t)Nt;
        for (int i = 0; i < nc; i++) {
            size_t ri = (size_t)head[i] * d->ah_tok + (size_t)(tok[i] - d->ah_t0);
            memcpy(a + (size_t)i * Nt, d->acorr + ri * ld, sizeof(float) * (size_t)nw);
        }
    }
    if (d->n_stale > 0 && !stale_columns(d, x, nc, a, *lda))
        return NULL;
    if (Nt > nw)
        fk_correlate_to(dc_atoms(d) + (size_t)nw * m, Nt - nw, m, x, nc, a + nw, *lda);
    return a;
}

/* The correlations of a block of nc event rows x with the atoms of view v (row i at the
 * result + i *lda): from the window when its rows are these (a full block of DC_BLK rows
 * gets its own SGEMM), else by their own SGEMM into d->corr. */
static const float *block_correlate(struct dc *d, const struct fk_dict_view *v, const float *x,
                                    const int32_t *tok, const int32_t *head, int nc,
                                    size_t *lda)
{
    if (d->ahead && nc < DC_BLK) {
        const float *a = ahead_fetch(d, x, tok, head, nc, lda);
        if (a) {
            d->ah_served++;
            return a;
        }
    }
    fk_correlate(v, x, nc, d->corr);
    *lda = (size_t)v->n_atoms;
    return d->corr;
}

/* Wall seconds of an event's phases (fk_wall_s, a vDSO read): dc_encode apportions the
 * event's thread CPU time to them. The thread CPU clock is a system call (1.25 us per read
 * on a KVM guest), so it is read twice per event, outside the phases; reading it around
 * each phase put 2-4 system calls inside the measured coding of every event, as much as
 * the coding of a few N 128 vectors. */
struct phase_wall {
    double corr, code, adapt;
};

/* Phase A of nb vectors x [nb][m] (tokens tok, heads head): codes into d->codes, d->needs
 * set where adaptation is due. One correlation SGEMM per DC_BLK vectors (reference mode:
 * one vector at a time), or the correlations ahead. */
static int encode_span(struct dc *d, const float *x, const int32_t *tok, const int32_t *head,
                       int nb, int can_adapt, struct phase_wall *pw)
{
    int blk = d->env.reference ? 1 : DC_BLK;
    for (int c0 = 0; c0 < nb; c0 += blk) {
        int nc = nb - c0 < blk ? nb - c0 : blk;
        const float *xb = x + (size_t)c0 * d->m;
        struct fk_dict_view v = dc_view(d);
        double t0 = fk_wall_s();
        size_t lda;
        const float *a = block_correlate(d, &v, xb, tok + c0, head + c0, nc, &lda);
        double t1 = fk_wall_s();
        pw->corr += t1 - t0;
        FK_TRY(d->coder->encode(d, &v, nc, xb, a, lda, &d->codes[c0]));
        for (int i = 0; i < nc; i++) {
            const struct fk_code *c = &d->codes[c0 + i];
            d->needs[c0 + i] = can_adapt && !(c->flags & FK_CODE_ZERO) &&
                               c->err2 > d->delta * d->delta * c->xx;
        }
        pw->code += fk_wall_s() - t1;
    }
    return FK_OK;
}

/* The event's thread CPU seconds cpu, spent over wall seconds wall, apportioned to its
 * phases by their wall time (a share of at most 1: time the thread did not run is not
 * counted). */
static void add_phase_cpu(struct dc *d, const struct phase_wall *pw, double cpu, double wall)
{
    double f = wall > 0 && cpu < wall ? cpu / wall : 1.0;
    f = f > 0 ? f : 0;
    d->st.t_corr += f * pw->corr;
    d->st.t_code += f * pw->code;
    d->st.t_adapt += f * pw->adapt;
}

static int encode_phases(struct dc *d, const struct fk_event *ev, struct fk_vec_out *out,
                         struct phase_wall *pw);

int dc_encode(void *state, const struct fk_event *ev, struct fk_vec_out *out)
{
    struct dc *d = state;
    struct phase_wall pw = {0};
    double c0 = fk_thread_cpu_s(), w0 = fk_wall_s();
    int rc = encode_phases(d, ev, out, &pw);
    add_phase_cpu(d, &pw, fk_thread_cpu_s() - c0, fk_wall_s() - w0);
    return rc;
}

static int encode_phases(struct dc *d, const struct fk_event *ev, struct fk_vec_out *out,
                         struct phase_wall *pw)
{
    int m = d->m;
    d->event_id++;
    int can_adapt = d->adapt && (ev->phase == 1 || d->o.adapt.adapt_prefill);
    int step = ev->phase == 1 ? ev->step : 0;
    /* Without adaptation, blocks are committed as they are coded (bounded memory);
     * with it, the whole event is coded first (phase A), then committed (B, C). */
    FK_TRY(check_event(d, ev));
    int span = can_adapt ? ev->n : (ev->n < DC_BLK ? ev->n : DC_BLK);
    FK_TRY(dc_grow_codes(d, span > 0 ? span : 1));
    for (int b0 = 0; b0 < ev->n; b0 += span) {
        int nb = ev->n - b0 < span ? ev->n - b0 : span;
        FK_TRY(encode_span(d, ev->x + (size_t)b0 * m, ev->token + b0, ev->head + b0, nb,
                           can_adapt, pw));
        /* pin every atom an event's code uses, committed now (phase B) or kept later when
         * its adaptation fails (phase C): a replacement must never damage either */
        for (int i = 0; i < nb; i++)
            for (int k = 0; k < d->codes[i].k; k++)
                d->pinned[d->codes[i].idx[k]] = d->event_id;
        /* phase B: commit codes that need no adaptation */
        for (int i = 0; i < nb; i++) {
            int g = b0 + i, h = ev->head[g], t = ev->token[g];
            if (!d->needs[i])
                dc_commit(d, h, t, ev->x + (size_t)g * m, &d->codes[i], ev->phase, step,
                          &out[g], 0, 0);
        }
        /* phase C: adapt the rest in (token, head) order */
        double ta = fk_wall_s();
        for (int i = 0; i < nb; i++) {
            if (!d->needs[i])
                continue;
            int g = b0 + i;
            uint32_t flags = 0;
            const float *x = ev->x + (size_t)g * m;
            FK_TRY(d->adapt->adapt(d, x, &d->codes[i], step, &flags));
            if (flags & FK_VEC_ADAPTED)
                d->last_adapt_step = step;
            dc_commit(d, ev->head[g], ev->token[g], x, &d->codes[i], ev->phase, step, &out[g],
                      flags, 0);
        }
        pw->adapt += fk_wall_s() - ta;
    }
    return FK_OK;
}

int dc_sparse_row(const void *state, int head, int token, int *nnz, const int32_t **idx,
                  const float **coef)
{
    const struct dc *d = state;
    if (head < 0 || head >= d->env.n_heads || token < 0 || token >= d->heads[head].n)
        return fk_err(FK_EINVAL, "no stored row (head %d, token %d)", head, token);
    const struct dc_rows *r = &d->heads[head];
    size_t off = (size_t)token * d->stride;
    *nnz = r->nnz[token];
    *idx = r->idx + off;
    *coef = r->coef + off;
    return FK_OK;
}

int dc_reconstruct(const void *state, int head, int token, float *out)
{
    const struct dc *d = state;
    int nnz = 0;
    const int32_t *idx = NULL;
    const float *coef = NULL;
    FK_TRY(dc_sparse_row(state, head, token, &nnz, &idx, &coef));
    const float *A = dc_atoms(d);
    memset(out, 0, sizeof(float) * (size_t)d->m);
    for (int i = 0; i < nnz; i++)
        for (int c = 0; c < d->m; c++)
            out[c] += coef[i] * A[(size_t)idx[i] * d->m + c];
    return FK_OK;
}

const float *dc_atoms_op(const void *state, int *n_atoms)
{
    const struct dc *d = state;
    *n_atoms = d->Nt;
    return dc_atoms(d);
}

void dc_stats(const void *state, struct fk_stream_stats *st)
{
    const struct dc *d = state;
    *st = d->st;
    st->n_atoms = d->Nt;
    st->n_base = d->N;
    st->bytes_codes = (double)d->nnz_total * (dc_row_bytes(d, 1) - dc_row_bytes(d, 0)) +
                      (double)d->rows_total * dc_row_bytes(d, 0);
    if (d->adapt && d->o.adapt.mem_mode == MEM_PAPER)
        st->bytes_uncounted = d->adapt->dict_bytes(d);
    else if (d->adapt)
        st->bytes_dict_seq = d->adapt->dict_bytes(d);
    st->bytes_model = (double)d->N * d->m * 2; /* the universal dictionary, fp16 (10.6) */
    st->ref_count = d->ref_count;
    st->prefill_use = d->prefill_use;
    st->use_total = d->use_total;
    st->is_adapted = d->is_adapted;
}
