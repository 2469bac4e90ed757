/* SPDX-License-Identifier: MIT
 * The dictionary codecs: lexico, lexico-adp, gm, pl and fadkv (spec algorithms.md
 * sections 4-8, 10.6, 10.7). They differ in two choices only, so they share this engine:
 *
 *   codec        coder                        adaptation (decode phase, err > delta)
 *   lexico       OMP over all atoms           none
 *   lexico-adp   OMP over all atoms           append a new atom (RAW x/|x| or RESIDUAL)
 *   gm           Top-n pool + OMP in the pool append
 *                + ridge refinement
 *   pl           top-s of |D^T x| + ridge     append
 *   fadkv        gm (or pl)                   replace an inactive atom (size stays N)
 *
 * Eviction-event protocol (section 4): phase A encodes every vector against the state at
 * the start of the event; phase B commits the codes that need no adaptation and pins their
 * atoms; phase C adapts the rest in (token, head) order. Results do not depend on threads.
 *
 * The universal dictionary is shared and never written: a stream that adapts first copies
 * it (copy-on-write of the whole block, 2 MiB at N = 4096, m = 128) and grows or rewrites
 * its copy. Gram rows of appended atoms are maintained incrementally (m * N_t MACs per
 * append) for OMP in Gram mode instead of recomputing D^T D.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/fk_codec.h"
#include "common/fk_err.h"
#include "kernels/fk_sparse.h"

#define BLK 128      /* vectors per correlation SGEMM */
#define IDX16_MAX 32767

enum coder { CODER_OMP, CODER_GM, CODER_PL };
enum adapt { ADAPT_NONE, ADAPT_APPEND, ADAPT_REPLACE };
enum { APPEND_RAW, APPEND_RESIDUAL };
enum { TAUC_COUNT, TAUC_COHERENCE, TAUC_PERIOD };
enum { VICTIM_REFCOUNT, VICTIM_EMA };
enum { COLL_REENCODE, COLL_DROP };
enum { OMP_GRAM, OMP_NAIVE };
enum { MEM_PAPER, MEM_STRICT };

struct dc_opts {
    struct fk_common_opts c;     /* n_b, a_len, coef */
    int s;                       /* sparsity */
    int n;                       /* screening pool size */
    double tol;                  /* relative error threshold of OMP, 0 = off */
    double delta_k, delta_v;     /* adaptation thresholds on relative error */
    int tau_c;                   /* inactivity threshold (ref_count <= tau_c) */
    double lambda0, rho;         /* ridge: lambda_j = lambda0 + rho * G_jj */
    int refine_iters;            /* damped refinement iterations R */
    int append_mode;             /* APPEND_* */
    int growth_cap;              /* max appended atoms, 0 = up to 32767 atoms in total */
    int inner;                   /* fadkv coder: 0 gm, 1 pl */
    int tauc_mode;               /* TAUC_* reading of tau_c */
    double coh_max;              /* coherence reading: adapt only if max |d^T u| < coh_max */
    int victim;                  /* VICTIM_* */
    int collateral;              /* COLL_* for victims still referenced (tau_c > 0) */
    double ema_gamma;            /* EMA decay per decode step */
    int adapt_prefill;           /* bool: adapt during prefill too */
    int omp_mode;                /* OMP_* */
    int mem_mode;                /* MEM_* accounting of fadkv's replaced slots */
    int ptr_bytes;               /* accounted bytes per row pointer: 2 (paper) or 4 (code) */
};

struct variant {
    enum coder coder;
    enum adapt adapt;
};

struct row_store {               /* the stored codes of one KV head; row = token */
    int n;                       /* stored rows */
    int expect;                  /* next token while checking an event */
    int32_t *nnz;                /* [T] */
    int32_t *idx;                /* [T][stride] atom ids */
    float *coef;                 /* [T][stride] dequantised coefficients */
};

struct dc {
    struct variant v;
    struct dc_opts o;
    struct fk_stream_env env;
    const struct fk_base_dict *base;
    int m, N, Nt;                /* head_dim, base atoms, current atoms */
    int cap;                     /* atom limit (N + growth) */
    int acap;                    /* atoms the per-atom arrays hold now (N <= acap <= cap) */
    int stride;                  /* coefficient slots per row: s + 1 */
    double delta;                /* threshold of this kind */
    float *atoms;                /* [acap][m] owned copy, or NULL while base is used */
    uint8_t *dead;               /* [acap] */
    float **ga;                  /* [Nt - N] Gram rows of appended atoms, N + ga_cols floats
                                  * each (rows are allocated one by one and never copied as a
                                  * block: a doubling block held two copies at its peak) */
    int ga_cols, ga_slots;       /* appended-atom columns of each row; pointer slots */
    uint32_t *ref_count, *prefill_use, *use_total; /* [acap] */
    int32_t *last_use;           /* [acap] decode step of the last use (replace only) */
    double *ema;                 /* [acap] activity, lazily decayed (replace only) */
    uint8_t *is_adapted;         /* [acap] */
    int32_t *pinned;             /* [acap] event id that pinned the atom */
    int event_id;
    int last_adapt_step;         /* for tauc_mode = period */
    struct row_store *heads;     /* [n_heads] */
    /* scratch */
    float *corr;                 /* [BLK][acap] correlations */
    float *work;                 /* OMP/topn work */
    size_t work_floats;
    int32_t *pool;               /* [acap] */
    float *xbuf;                 /* [m] */
    float *rbuf;                 /* [m] */
    struct fk_code *codes;       /* [codes_cap] codes of the current event */
    int codes_cap;
    uint8_t *needs;              /* [codes_cap] needs adaptation */
    /* statistics */
    struct fk_stream_stats st;
    uint64_t nnz_total, rows_total;
    int replaced_slots;
};

static const char *const append_names[] = {"raw", "residual", NULL};
static const char *const inner_names[] = {"gm", "pl", NULL};
static const char *const tauc_names[] = {"count", "coherence", "period", NULL};
static const char *const victim_names[] = {"refcount", "ema", NULL};
static const char *const coll_names[] = {"reencode", "drop", NULL};
static const char *const omp_names[] = {"gram", "naive", NULL};
static const char *const mem_names[] = {"paper", "strict", NULL};

#define O(field) offsetof(struct dc_opts, field)
#define OPT_S {"s", FK_OPT_INT, O(s), 8, 1, FK_SMAX - 1, NULL, "sparsity: atoms per vector"}
#define OPT_N {"n", FK_OPT_INT, O(n), 256, 1, 1 << 24, NULL, "screening pool size (atoms)"}
#define OPT_TOL {"tol", FK_OPT_DOUBLE, O(tol), 0, 0, 1, NULL,                               \
                 "OMP relative error threshold (0 = off: always s atoms)"}
#define OPT_OMP {"omp_mode", FK_OPT_ENUM, O(omp_mode), OMP_GRAM, 0, 1, omp_names,           \
                 "OMP residual update: gram (Batch-OMP) | naive (recompute D^T r)"}
#define OPT_DELTA                                                                           \
    {"delta_k", FK_OPT_DOUBLE, O(delta_k), 0.50, 0, 1, NULL,                                \
     "adapt a key when its relative error exceeds this"},                                   \
    {"delta_v", FK_OPT_DOUBLE, O(delta_v), 0.70, 0, 1, NULL,                                \
     "adapt a value when its relative error exceeds this"},                                 \
    {"adapt_prefill", FK_OPT_BOOL, O(adapt_prefill), 0, 0, 1, NULL,                         \
     "also adapt during prefill (default: decode only)"},                                   \
    {"ema_gamma", FK_OPT_DOUBLE, O(ema_gamma), 0.99, 1e-6, 1, NULL,                         \
     "decay of the atom activity EMA per decode step"}
#define OPT_APPEND                                                                          \
    {"append_mode", FK_OPT_ENUM, O(append_mode), APPEND_RAW, 0, 1, append_names,            \
     "appended atom: raw (x/|x|) | residual (r/|r|, then refit)"},                          \
    {"growth_cap", FK_OPT_INT, O(growth_cap), 0, 0, 1 << 24, NULL,                          \
     "max appended atoms per stream (0 = until 32767 atoms, INT16 indices)"}
#define OPT_REFINE                                                                          \
    {"lambda0", FK_OPT_DOUBLE, O(lambda0), 1e-4, 0, 1e6, NULL, "ridge: constant term"},     \
    {"rho", FK_OPT_DOUBLE, O(rho), 0.20, 0, 1e6, NULL, "ridge: multiple of diag(G)"},       \
    {"refine_iters", FK_OPT_INT, O(refine_iters), 1, 1, 100, NULL,                          \
     "refinement iterations R (1 = one-shot ridge; >= 2 converges to least squares)"}
#define OPT_PTR {"ptr_bytes", FK_OPT_INT, O(ptr_bytes), 2, 2, 4, NULL,                      \
                 "accounted bytes per row pointer: 2 (paper) or 4 (int32 as in code)"}
#define OPT_END {NULL, 0, 0, 0, 0, 0, NULL, NULL}

static const struct fk_option lexico_options[] = {
    FK_COMMON_OPTIONS(struct dc_opts), OPT_S, OPT_TOL, OPT_OMP, OPT_PTR, OPT_END,
};
static const struct fk_option adp_options[] = {
    FK_COMMON_OPTIONS(struct dc_opts), OPT_S, OPT_TOL, OPT_OMP, OPT_DELTA, OPT_APPEND, OPT_PTR,
    OPT_END,
};
static const struct fk_option gm_options[] = {
    FK_COMMON_OPTIONS(struct dc_opts), OPT_S, OPT_N, OPT_REFINE, OPT_DELTA, OPT_APPEND, OPT_PTR,
    OPT_END,
};
static const struct fk_option pl_options[] = {
    FK_COMMON_OPTIONS(struct dc_opts), OPT_S,
    {"n", FK_OPT_INT, O(n), 256, 1, 1 << 24, NULL, "pool size (diagnostics only for pl)"},
    OPT_REFINE, OPT_DELTA, OPT_APPEND, OPT_PTR, OPT_END,
};
static const struct fk_option fadkv_options[] = {
    FK_COMMON_OPTIONS(struct dc_opts),
    OPT_S,
    OPT_N,
    OPT_REFINE,
    OPT_DELTA,
    {"inner", FK_OPT_ENUM, O(inner), 0, 0, 1, inner_names, "inner coder: gm | pl"},
    {"tau_c", FK_OPT_INT, O(tau_c), 0, 0, 1 << 24, NULL,
     "an atom is inactive (replaceable) when at most tau_c stored codes use it"},
    {"tauc_mode", FK_OPT_ENUM, O(tauc_mode), TAUC_COUNT, 0, 2, tauc_names,
     "reading of tau_c: count (usage) | coherence (coh_max novelty) | period (steps)"},
    {"coh_max", FK_OPT_DOUBLE, O(coh_max), 0.9, 0, 1, NULL,
     "coherence reading: replace only if max_j |d_j^T u| < coh_max"},
    {"victim", FK_OPT_ENUM, O(victim), VICTIM_REFCOUNT, 0, 1, victim_names,
     "victim choice: refcount (ref_count, ema, index) | ema (lowest ema; drops codes)"},
    {"collateral", FK_OPT_ENUM, O(collateral), COLL_REENCODE, 0, 1, coll_names,
     "codes still using a replaced atom (tau_c > 0): reencode | drop"},
    {"mem_mode", FK_OPT_ENUM, O(mem_mode), MEM_PAPER, 0, 1, mem_names,
     "memory of replaced slots: paper (0, fixed size) | strict (copy-on-write delta)"},
    OPT_PTR,
    OPT_END,
};

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- dictionary access ---------------------------------------------------------------- */

static const float *dc_atoms(const struct dc *d)
{
    return d->atoms ? d->atoms : d->base->atoms;
}

static const float *dc_gram_row(void *ctx, int j, float *scratch)
{
    struct dc *d = ctx;
    int A = d->Nt - d->N;
    if (j >= d->N)
        return d->ga[j - d->N];
    const float *g0 = d->base->gram + (size_t)j * (size_t)d->N;
    if (A == 0)
        return g0;
    memcpy(scratch, g0, sizeof(float) * (size_t)d->N);
    for (int a = 0; a < A; a++)
        scratch[d->N + a] = d->ga[a][j];
    return scratch;
}

static struct fk_dict_view dc_view(struct dc *d)
{
    struct fk_dict_view v = {
        .m = d->m, .n_atoms = d->Nt, .atoms = dc_atoms(d), .dead = d->dead,
        .gram_row = NULL, .gram_ctx = d,
    };
    if (d->v.coder == CODER_OMP && d->o.omp_mode == OMP_GRAM && d->base->gram &&
        d->v.adapt != ADAPT_REPLACE && !d->env.reference)
        v.gram_row = dc_gram_row;
    return v;
}

/* Copy-on-write of the universal dictionary before the first change. */
static int dc_own_atoms(struct dc *d)
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
    size_t w = fk_omp_work_floats((int)n_atoms, d->m, d->o.s + 1) + 2 * n_atoms + 64;
    if (d->v.coder == CODER_OMP) { /* the lanes of fk_omp_gram_batch */
        size_t wb = fk_omp_batch_work_floats((int)n_atoms, d->m, d->o.s);
        w = wb > w ? wb : w;
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
    DC_GROW(d->pool, c, int32_t);
    DC_GROW(d->corr, (size_t)BLK * c, float);
    size_t wf = dc_work_floats(d, c);
    DC_GROW(d->work, wf, float);
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
static int dc_append_atom(struct dc *d, const float *u)
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
    if (d->v.adapt != ADAPT_REPLACE)
        return; /* only a replacement reads the activity (a pow per atom use saved) */
    int dt = step - d->last_use[j];
    d->ema[j] = d->ema[j] * pow(d->o.ema_gamma, dt > 0 ? dt : 0) + 1.0;
    d->last_use[j] = step;
}

/* Stores code c as row `token` of `head` (a new row, or a rewrite of a stored one) and
 * fills out. Within an event, new rows may be committed out of token order (phase B before
 * phase C); the event was checked to hold exactly the next tokens of each head. */
static void commit(struct dc *d, int head, int token, const float *x, const struct fk_code *c,
                   int phase, int step, struct fk_vec_out *out, uint32_t flags, int rewrite)
{
    struct row_store *r = &d->heads[head];
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
    out->err_enc = (float)sqrt(c->err2 / c->xx);
    out->err = (float)sqrt(row_err2(d, x, c->k, r->idx + off, r->coef + off, d->xbuf) / c->xx);
}

/* ---- coders --------------------------------------------------------------------------- */

static double cost_omp(int m, double Nt, int iters)
{
    double c = 0;
    for (int k = 1; k <= iters; k++)
        c += m * Nt + Nt + 2.0 * k * m + (double)k * k;
    return c;
}

static double cost_gm(int m, double Nt, int n, int iters, int s)
{
    double c = m * Nt + Nt + (double)s * s * s / 6 + 2.0 * s * s;
    for (int k = 1; k <= iters; k++)
        c += (double)m * n + n + 2.0 * k * m + (double)k * k;
    return c;
}

static double cost_pl(int m, double Nt, int s)
{
    return m * Nt + Nt + m * s * (s + 1) / 2.0 + (double)s * s * s / 6 + 2.0 * s * s +
           (double)m * s;
}

/* Encodes x given its correlations a (length Nt) into c. */
static int encode_one(struct dc *d, const float *x, const float *a, struct fk_code *c)
{
    struct fk_dict_view v = dc_view(d);
    enum coder coder = d->v.coder;
    if (d->v.adapt == ADAPT_REPLACE)
        coder = d->o.inner ? CODER_PL : CODER_GM;
    int rc;
    if (coder == CODER_OMP) {
        if (v.gram_row)
            rc = fk_omp_gram(&v, x, a, d->o.s, d->o.tol, d->work, c);
        else
            rc = fk_omp_naive(&v, x, a, NULL, 0, d->o.s, d->o.tol, d->work, c);
        if (rc < 0)
            return rc;
        d->st.macs += cost_omp(d->m, d->Nt, c->iters > c->k ? c->iters : c->k);
        return FK_OK;
    }
    if (coder == CODER_GM) {
        int np = fk_topn(a, d->dead, d->Nt, d->o.n, 0, d->pool, d->work);
        rc = fk_omp_naive(&v, x, a, d->pool, np, d->o.s, 0, d->work, c);
        if (rc < 0)
            return rc;
        d->st.macs += cost_gm(d->m, d->Nt, np, c->iters > c->k ? c->iters : c->k, c->k);
    } else {
        double xx = 0;
        for (int i = 0; i < d->m; i++)
            xx += (double)x[i] * x[i];
        memset(c, 0, sizeof *c);
        c->xx = xx;
        if (xx <= 1e-30) {
            c->flags = FK_CODE_ZERO;
            return FK_OK;
        }
        c->k = fk_topn(a, d->dead, d->Nt, d->o.s, 1, c->idx, d->work);
        d->st.macs += cost_pl(d->m, d->Nt, c->k);
    }
    if (c->k > 0 && !(c->flags & FK_CODE_ZERO))
        FK_TRY(fk_refine(&v, x, d->o.lambda0, d->o.rho, d->o.refine_iters, c));
    return FK_OK;
}

/* Correlations of one vector with the current atoms (SGEMV-sized SGEMM). */
static int encode_fresh(struct dc *d, const float *x, struct fk_code *c)
{
    struct fk_dict_view v = dc_view(d);
    fk_correlate(&v, x, 1, d->corr);
    return encode_one(d, x, d->corr, c);
}

/* ---- adaptation ----------------------------------------------------------------------- */

static void unit(const float *x, int m, float *u, double *norm)
{
    double nn = 0;
    for (int i = 0; i < m; i++)
        nn += (double)x[i] * x[i];
    nn = sqrt(nn);
    for (int i = 0; i < m; i++)
        u[i] = (float)(x[i] / nn);
    *norm = nn;
}

static int adapt_append(struct dc *d, const float *x, struct fk_code *c, uint32_t *flags)
{
    int cap = d->o.growth_cap ? d->N + d->o.growth_cap : IDX16_MAX;
    if (cap > d->cap)
        cap = d->cap;
    if (d->Nt >= cap) {
        d->st.growth_capped++;
        return FK_OK;
    }
    float *u = d->xbuf;
    double norm;
    if (d->o.append_mode == APPEND_RESIDUAL && c->k > 0) {
        const float *A = dc_atoms(d);
        float *r = d->rbuf;
        for (int i = 0; i < d->m; i++)
            r[i] = x[i];
        for (int k = 0; k < c->k; k++)
            for (int i = 0; i < d->m; i++)
                r[i] -= (float)(c->coef[k] * A[(size_t)c->idx[k] * d->m + i]);
        unit(r, d->m, u, &norm);
        if (!(norm > 1e-12 * sqrt(c->xx)))
            unit(x, d->m, u, &norm);
        FK_TRY(dc_append_atom(d, u));
        c->idx[c->k++] = d->Nt - 1;
        struct fk_dict_view v = dc_view(d);
        FK_TRY(fk_refine(&v, x, 0, 0, 1, c)); /* exact least squares on S + {new} */
    } else {
        unit(x, d->m, u, &norm);
        FK_TRY(dc_append_atom(d, u));
        c->k = 1;
        c->idx[0] = d->Nt - 1;
        c->coef[0] = norm;
        c->err2 = 0;
    }
    d->is_adapted[d->Nt - 1] = 1;
    d->st.appends++;
    *flags |= FK_VEC_ADAPTED;
    return FK_OK;
}

static double ema_now(const struct dc *d, int j, int step)
{
    int dt = step - d->last_use[j];
    return d->ema[j] * pow(d->o.ema_gamma, dt > 0 ? dt : 0);
}

/* Rewrites (or drops) every stored row that uses atom v, before v is overwritten. */
static int release_victim(struct dc *d, int v, int step)
{
    for (int h = 0; h < d->env.n_heads && d->ref_count[v] > 0; h++) {
        struct row_store *r = &d->heads[h];
        for (int t = 0; t < r->n && d->ref_count[v] > 0; t++) {
            size_t off = (size_t)t * d->stride;
            int uses = 0;
            for (int i = 0; i < r->nnz[t]; i++)
                uses |= r->idx[off + i] == v;
            if (!uses)
                continue;
            struct fk_code c;
            memset(&c, 0, sizeof c);
            if (d->o.collateral == COLL_DROP || d->o.victim == VICTIM_EMA) {
                for (int i = 0; i < r->nnz[t]; i++) {
                    if (r->idx[off + i] == v)
                        continue;
                    c.idx[c.k] = r->idx[off + i];
                    c.coef[c.k++] = r->coef[off + i];
                }
                c.xx = 1;
                commit(d, h, t, NULL, &c, 1, step, NULL, 0, 1);
                continue;
            }
            /* re-encode the current reconstruction y with v excluded */
            float *y = d->rbuf;
            const float *A = dc_atoms(d);
            memset(y, 0, sizeof(float) * (size_t)d->m);
            for (int i = 0; i < r->nnz[t]; i++)
                for (int k = 0; k < d->m; k++)
                    y[k] += r->coef[off + i] * A[(size_t)r->idx[off + i] * d->m + k];
            uint8_t was = d->dead[v];
            d->dead[v] = 1;
            int rc = encode_fresh(d, y, &c);
            d->dead[v] = was;
            if (rc < 0)
                return rc;
            commit(d, h, t, NULL, &c, 1, step, NULL, 0, 1);
            d->st.collateral_reencodes++;
        }
    }
    return FK_OK;
}

static int adapt_replace(struct dc *d, const float *x, struct fk_code *c, int step,
                         uint32_t *flags)
{
    float *u = d->xbuf;
    double norm;
    unit(x, d->m, u, &norm);
    int tau = d->o.tauc_mode == TAUC_COUNT ? d->o.tau_c : 0;
    if (d->o.tauc_mode == TAUC_PERIOD && d->o.tau_c > 0 && d->last_adapt_step >= 0 &&
        step - d->last_adapt_step < d->o.tau_c) {
        d->st.adapt_failed++;
        return FK_OK;
    }
    if (d->o.tauc_mode == TAUC_COHERENCE) {
        const float *A = dc_atoms(d);
        for (int j = 0; j < d->Nt; j++) {
            if (d->dead[j])
                continue;
            double dot = 0;
            for (int i = 0; i < d->m; i++)
                dot += (double)A[(size_t)j * d->m + i] * u[i];
            if (fabs(dot) >= d->o.coh_max) {
                d->st.adapt_failed++;
                return FK_OK;
            }
        }
    }
    int best = -1;
    double best_ema = 0;
    for (int j = 0; j < d->Nt; j++) {
        if (d->pinned[j] == d->event_id)
            continue;
        if (d->o.victim == VICTIM_REFCOUNT && d->ref_count[j] > (uint32_t)tau)
            continue;
        double e = ema_now(d, j, step);
        if (best < 0) {
            best = j;
            best_ema = e;
            continue;
        }
        int better = d->o.victim == VICTIM_EMA
                         ? e < best_ema
                         : (d->ref_count[j] < d->ref_count[best] ||
                            (d->ref_count[j] == d->ref_count[best] && e < best_ema));
        if (better) {
            best = j;
            best_ema = e;
        }
    }
    if (best < 0) {
        d->st.adapt_failed++;
        return FK_OK;
    }
    FK_TRY(dc_own_atoms(d));
    if (d->ref_count[best] > 0)
        FK_TRY(release_victim(d, best, step));
    memcpy(d->atoms + (size_t)best * d->m, u, sizeof(float) * (size_t)d->m);
    d->dead[best] = 0;
    if (!d->is_adapted[best] && best < d->N)
        d->replaced_slots++;
    d->is_adapted[best] = 1;
    d->ema[best] = 0;
    d->last_use[best] = step;
    c->k = 1;
    c->idx[0] = best;
    c->coef[0] = norm;
    c->err2 = 0;
    c->flags &= ~(unsigned)FK_CODE_PREMATURE;
    d->st.replacements++;
    *flags |= FK_VEC_ADAPTED;
    return FK_OK;
}

/* ---- ops ------------------------------------------------------------------------------ */

static void dc_close(void *state)
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
    free(d);
}

static int dc_check(const struct variant *v, const void *opts, int head_dim, int n_atoms)
{
    const struct dc_opts *o = opts;
    int screened = v->coder == CODER_GM || v->adapt == ADAPT_REPLACE;
    if (screened && o->s > o->n)
        return fk_err(FK_ECONFIG, "s = %d must not exceed the pool size n = %d", o->s, o->n);
    if (screened && n_atoms > 0 && o->n > n_atoms)
        return fk_err(FK_ECONFIG, "pool size n = %d exceeds the dictionary's N = %d atoms",
                      o->n, n_atoms);
    if (n_atoms > 0 && o->s > n_atoms)
        return fk_err(FK_ECONFIG, "s = %d exceeds the dictionary's N = %d atoms", o->s,
                      n_atoms);
    if (o->ptr_bytes != 2 && o->ptr_bytes != 4)
        return fk_err(FK_ECONFIG, "ptr_bytes = %d: expected 2 or 4", o->ptr_bytes);
    if (v->adapt == ADAPT_APPEND && n_atoms > 0 && n_atoms >= IDX16_MAX && !o->growth_cap)
        return fk_err(FK_ECONFIG, "N = %d leaves no room to append under INT16 indices; set "
                      "growth_cap", n_atoms);
    return FK_OK;
}

static int dc_open(const struct variant *v, const void *opts, const struct fk_stream_env *env,
                   void **state)
{
    if (!env->base)
        return fk_err(FK_EINVAL, "dictionary codec opened without a dictionary");
    struct dc *d = calloc(1, sizeof *d);
    if (!d)
        return fk_err(FK_ENOMEM, "out of memory");
    d->v = *v;
    memcpy(&d->o, opts, sizeof d->o);
    d->env = *env;
    d->base = env->base;
    d->m = env->head_dim;
    d->N = d->Nt = env->base->n_atoms;
    d->stride = d->o.s + 1;
    d->delta = env->kind == 0 ? d->o.delta_k : d->o.delta_v;
    d->last_adapt_step = -1;
    d->cap = d->N;
    if (v->adapt == ADAPT_APPEND) {
        long decode_max = (long)env->n_tokens * env->n_heads;
        long cap = d->o.growth_cap ? (long)d->N + d->o.growth_cap : IDX16_MAX;
        if (cap > d->N + decode_max)
            cap = d->N + decode_max;
        d->cap = cap > d->N ? (int)cap : d->N;
    }
    if (d->m != env->base->m) {
        dc_close(d);
        return fk_err(FK_EINVAL, "dictionary head_dim %d != stream head_dim %d", env->base->m,
                      d->m);
    }
    if (v->coder == CODER_OMP && d->o.omp_mode == OMP_GRAM && !env->base->gram &&
        !env->reference) {
        dc_close(d);
        return fk_err(FK_EINVAL, "omp_mode = gram needs the dictionary's Gram matrix");
    }
    size_t T = (size_t)env->n_tokens + 1;
    d->heads = calloc((size_t)env->n_heads, sizeof *d->heads);
    d->xbuf = malloc(sizeof(float) * (size_t)d->m);
    d->rbuf = malloc(sizeof(float) * (size_t)d->m);
    int ok = d->heads && d->xbuf && d->rbuf;
    for (int h = 0; ok && h < env->n_heads; h++) {
        d->heads[h].nnz = calloc(T, sizeof(int32_t));
        d->heads[h].idx = malloc(sizeof(int32_t) * T * (size_t)d->stride);
        d->heads[h].coef = malloc(sizeof(float) * T * (size_t)d->stride);
        ok = d->heads[h].nnz && d->heads[h].idx && d->heads[h].coef;
    }
    if (!ok || dc_reserve(d, d->N) < 0) { /* per-atom arrays, grown as atoms are appended */
        dc_close(d);
        return fk_err(FK_ENOMEM, "out of memory (codec state)");
    }
    if (env->base->dead)
        memcpy(d->dead, env->base->dead, (size_t)d->N);
    *state = d;
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

static int dc_encode(void *state, const struct fk_event *ev, struct fk_vec_out *out)
{
    struct dc *d = state;
    int m = d->m;
    d->event_id++;
    int can_adapt = d->v.adapt != ADAPT_NONE && (ev->phase == 1 || d->o.adapt_prefill);
    int step = ev->phase == 1 ? ev->step : 0;
    /* Without adaptation, blocks are committed as they are coded (bounded memory);
     * with it, the whole event is coded first (phase A), then committed (B, C). */
    /* the event must hold exactly the next tokens of each head, each once, in order */
    for (int h = 0; h < d->env.n_heads; h++)
        d->heads[h].expect = d->heads[h].n;
    for (int i = 0; i < ev->n; i++) {
        int h = ev->head[i], t = ev->token[i];
        if (h < 0 || h >= d->env.n_heads || t != d->heads[h].expect || t >= d->env.n_tokens)
            return fk_err(FK_EINVAL, "event vector %d: (head %d, token %d) is not the next row "
                          "of that head", i, h, t);
        d->heads[h].expect++;
    }
    int span = can_adapt ? ev->n : (ev->n < BLK ? ev->n : BLK);
    FK_TRY(dc_grow_codes(d, span > 0 ? span : 1));
    for (int b0 = 0; b0 < ev->n; b0 += span) {
        int nb = ev->n - b0 < span ? ev->n - b0 : span;
        /* phase A (reference mode: one vector at a time) */
        int blk = d->env.reference ? 1 : BLK;
        for (int c0 = 0; c0 < nb; c0 += blk) {
            int nc = nb - c0 < blk ? nb - c0 : blk;
            struct fk_dict_view v = dc_view(d);
            double t0 = cpu_s();
            fk_correlate(&v, ev->x + (size_t)(b0 + c0) * m, nc, d->corr);
            double t1 = cpu_s();
            d->st.t_corr += t1 - t0;
            const float *xb = ev->x + (size_t)(b0 + c0) * m;
            int batched = d->v.coder == CODER_OMP && v.gram_row;
            if (batched) { /* Batch-OMP, vectors interleaved (same codes as one at a time) */
                FK_TRY(fk_omp_gram_batch(&v, nc, xb, d->corr, (size_t)d->Nt, d->o.s, d->o.tol,
                                         d->work, &d->codes[c0]));
                for (int i = 0; i < nc; i++) {
                    const struct fk_code *c = &d->codes[c0 + i];
                    d->st.macs += cost_omp(d->m, d->Nt, c->iters > c->k ? c->iters : c->k);
                }
            }
            for (int i = 0; i < nc; i++) {
                struct fk_code *c = &d->codes[c0 + i];
                if (!batched)
                    FK_TRY(encode_one(d, xb + (size_t)i * m, d->corr + (size_t)i * d->Nt, c));
                d->needs[c0 + i] = can_adapt && !(c->flags & FK_CODE_ZERO) &&
                                   c->err2 > d->delta * d->delta * c->xx;
            }
            d->st.t_code += cpu_s() - t1;
        }
        /* pin every atom an event's code uses, committed now (phase B) or kept later when
         * its adaptation fails (phase C): a replacement must never damage either */
        for (int i = 0; i < nb; i++)
            for (int k = 0; k < d->codes[i].k; k++)
                d->pinned[d->codes[i].idx[k]] = d->event_id;
        /* phase B: commit codes that need no adaptation */
        for (int i = 0; i < nb; i++) {
            int g = b0 + i, h = ev->head[g], t = ev->token[g];
            if (!d->needs[i])
                commit(d, h, t, ev->x + (size_t)g * m, &d->codes[i], ev->phase, step, &out[g],
                       0, 0);
        }
        /* phase C: adapt the rest in (token, head) order */
        double ta = cpu_s();
        for (int i = 0; i < nb; i++) {
            if (!d->needs[i])
                continue;
            int g = b0 + i;
            uint32_t flags = 0;
            const float *x = ev->x + (size_t)g * m;
            if (d->v.adapt == ADAPT_APPEND)
                FK_TRY(adapt_append(d, x, &d->codes[i], &flags));
            else
                FK_TRY(adapt_replace(d, x, &d->codes[i], step, &flags));
            if (flags & FK_VEC_ADAPTED)
                d->last_adapt_step = step;
            commit(d, ev->head[g], ev->token[g], x, &d->codes[i], ev->phase, step, &out[g],
                   flags, 0);
        }
        d->st.t_adapt += cpu_s() - ta;
    }
    return FK_OK;
}

static int dc_sparse_row(const void *state, int head, int token, int *nnz, const int32_t **idx,
                         const float **coef)
{
    const struct dc *d = state;
    if (head < 0 || head >= d->env.n_heads || token < 0 || token >= d->heads[head].n)
        return fk_err(FK_EINVAL, "no stored row (head %d, token %d)", head, token);
    const struct row_store *r = &d->heads[head];
    size_t off = (size_t)token * d->stride;
    *nnz = r->nnz[token];
    *idx = r->idx + off;
    *coef = r->coef + off;
    return FK_OK;
}

static int dc_reconstruct(const void *state, int head, int token, float *out)
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

static const float *dc_atoms_op(const void *state, int *n_atoms)
{
    const struct dc *d = state;
    *n_atoms = d->Nt;
    return dc_atoms(d);
}

static void dc_stats(const void *state, struct fk_stream_stats *st)
{
    const struct dc *d = state;
    *st = d->st;
    st->n_atoms = d->Nt;
    st->n_base = d->N;
    int b_val = d->o.c.coef == FK_COEF_FP8 ? 1 : d->o.c.coef == FK_COEF_FP16 ? 2 : 4;
    int b_idx = d->cap > IDX16_MAX ? 4 : 2;
    st->bytes_codes = (double)d->nnz_total * (b_val + b_idx) + (double)d->rows_total * d->o.ptr_bytes;
    if (d->v.adapt == ADAPT_APPEND)
        st->bytes_dict_seq = (double)(d->Nt - d->N) * d->m * 2;
    else if (d->v.adapt == ADAPT_REPLACE && d->o.mem_mode == MEM_STRICT)
        st->bytes_dict_seq = (double)d->replaced_slots * (d->m * 2 + 2);
    st->ref_count = d->ref_count;
    st->prefill_use = d->prefill_use;
    st->use_total = d->use_total;
    st->is_adapted = d->is_adapted;
}

#define DEFINE_CODEC(sym, cname, csummary, copts, ccoder, cadapt, ccaps)                     \
    static const struct variant sym##_variant = {ccoder, cadapt};                            \
    static int sym##_open(const void *o, const struct fk_stream_env *e, void **s)            \
    {                                                                                        \
        return dc_open(&sym##_variant, o, e, s);                                             \
    }                                                                                        \
    static int sym##_check(const void *o, int hd, int na)                                    \
    {                                                                                        \
        return dc_check(&sym##_variant, o, hd, na);                                          \
    }                                                                                        \
    const struct fk_codec_ops fk_codec_##sym = {                                             \
        .name = cname, .summary = csummary, .opts_size = sizeof(struct dc_opts),            \
        .options = copts, .caps = FK_CAP_DICT | FK_CAP_SPARSE | (ccaps),                     \
        .check = sym##_check, .open = sym##_open, .encode = dc_encode,                      \
        .reconstruct = dc_reconstruct, .sparse_row = dc_sparse_row, .atoms = dc_atoms_op,   \
        .stats = dc_stats, .close = dc_close,                                               \
    }

DEFINE_CODEC(lexico, "lexico", "full OMP over a static universal per-layer dictionary",
             lexico_options, CODER_OMP, ADAPT_NONE, FK_CAP_GRAM | FK_CAP_STATIC);
DEFINE_CODEC(lexico_adp, "lexico-adp",
             "lexico plus append-growth: a badly coded vector becomes a new atom", adp_options,
             CODER_OMP, ADAPT_APPEND, FK_CAP_GRAM | FK_CAP_GROWS | FK_CAP_ADAPTS);
DEFINE_CODEC(gm, "gm", "Top-n screening, greedy OMP in the pool, ridge refinement; append-growth",
             gm_options, CODER_GM, ADAPT_APPEND, FK_CAP_GROWS | FK_CAP_ADAPTS);
DEFINE_CODEC(pl, "pl", "one-shot top-s of |D^T x| with ridge refinement; append-growth",
             pl_options, CODER_PL, ADAPT_APPEND, FK_CAP_GROWS | FK_CAP_ADAPTS);
DEFINE_CODEC(fadkv, "fadkv",
             "screening coder (gm|pl) plus replacement of inactive atoms: fixed-size dictionary",
             fadkv_options, CODER_GM, ADAPT_REPLACE, FK_CAP_ADAPTS);
