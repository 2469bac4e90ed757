/* SPDX-License-Identifier: MIT
 * Codec conformance (codecs/core/fk_codec.h; spec: algorithms.md sections 3-8, 10.6, 10.7, 11).
 *
 * Every codec is driven exactly as the replay engine drives it: options from the table
 * (fk_opts_defaults, fk_opts_set, fk_opts_set_enum), ops->check, ops->open with a
 * struct fk_stream_env over a seeded random unit dictionary (Gram from fk_gram_build for
 * FK_CAP_GRAM codecs), events ordered (token, head) from the eviction schedule
 * (engine/fk_schedule.h): a codec's own buffer rule (fk_codec_buffer) when it has one, else
 * every token (the prefill whole, then decode events of a_len tokens). Results are checked
 * against independent recomputations: errors from ops->reconstruct, ref_count recounted from
 * the stored codes, supports of a brute-force top-s and of full OMP, bit-exact snapshots of
 * past rows, byte and MAC formulas of the spec.
 * This file includes GSL and never <cblas.h>.
 */
#include "fk_check_main.h"
#include "conformance/fk_test_basis.h"
#include "core/fk_codec.h"
#include "engine/fk_schedule.h"
#include "formats/fk_dict.h"
#include "common/fk_err.h"
#include "kernels/fk_sparse.h"

#include <check.h>
#include <gsl/gsl_errno.h>
#include <gsl/gsl_randist.h>
#include <gsl/gsl_rng.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#ifdef __SANITIZE_ADDRESS__
/* close_half_opened asks codecs for impossible amounts of memory: malloc returns NULL
 * under ASan as it does without it, and the codec's error path is what is tested. */
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
    return "allocator_may_return_null=1";
}
#endif

/* Check's ck_assert* record every passing assertion with a write(2); these do not, so the
 * per-row and per-coordinate checks of the hot loops stay cheap. */
#define REQUIRE(cond, ...)                                                                 \
    do {                                                                                  \
        if (!(cond))                                                                      \
            ck_abort_msg(__VA_ARGS__);                                                    \
    } while (0)
#define CHECK(cond) REQUIRE(cond, "assertion failed: %s", #cond)
#define REQ_OK(call)                                                                      \
    do {                                                                                  \
        int req_rc_ = (call);                                                             \
        if (req_rc_ != FK_OK)                                                             \
            ck_abort_msg("%s returned %d: %s", #call, req_rc_, fk_errmsg());              \
    } while (0)

/* ---- fixtures: dictionary, stream, options -------------------------------------------- */

struct tdict {
    int N, m;                    /* atoms, head_dim */
    int hold;                    /* trailing coordinates no atom spans (room for novelty) */
    float *atoms;                /* [N][m] unit norm */
    uint8_t *dead;               /* [N] all zero */
    float *gram;                 /* [N][N] from fk_gram_build, or NULL */
    struct fk_base_dict with;    /* base with the Gram (FK_CAP_GRAM codecs) */
    struct fk_base_dict without; /* base without it */
};

struct tstream {
    int m, H;                    /* head_dim, KV heads */
    int P, T;                    /* prefill tokens (one event), total tokens */
    float *x;                    /* [T][H][m] */
};

/* How a stream is generated. */
struct tgen {
    int n_use;                   /* structured vectors combine atoms 0 .. n_use-1 */
    int k_gen;                   /* atoms per structured vector */
    double noise;                /* noise standard deviation per coordinate */
    double p_novel_prefill;      /* prefill: probability of a vector far from the dictionary */
    double p_novel;              /* decode: same */
    int n_dirs;                  /* novel vectors reuse n_dirs fixed directions (0: fresh) */
    int zero_every;              /* every zero_every-th vector is exactly zero (0: never) */
    int const_every;             /* every const_every-th vector is constant, of an fp16 value */
};

static gsl_rng *rng_new(unsigned long seed)
{
    gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
    ck_assert_ptr_nonnull(r);
    gsl_rng_set(r, seed);
    return r;
}

/* A random direction of the given norm. */
static void random_dir(gsl_rng *r, int m, double norm, float *u)
{
    double s = 0;
    for (int i = 0; i < m; i++) {
        u[i] = (float)gsl_ran_gaussian(r, 1.0);
        s += (double)u[i] * u[i];
    }
    for (int i = 0; i < m; i++)
        u[i] = (float)(u[i] * norm / sqrt(s));
}

/* A direction far from the dictionary: most of its energy in the held-out coordinates. */
static void novel_dir(gsl_rng *r, const struct tdict *d, double norm, float *u)
{
    random_dir(r, d->m, 1.0, u);
    for (int c = d->m - d->hold; c < d->m; c++)
        u[c] *= 4;
    double s = 0;
    for (int c = 0; c < d->m; c++)
        s += (double)u[c] * u[c];
    for (int c = 0; c < d->m; c++)
        u[c] = (float)(u[c] * norm / sqrt(s));
}

/* N random unit atoms spanning the first m - hold coordinates. */
static void tdict_init(struct tdict *d, int N, int m, int hold, int with_gram,
                       unsigned long seed)
{
    memset(d, 0, sizeof *d);
    d->N = N;
    d->m = m;
    d->hold = hold;
    d->atoms = malloc(sizeof(float) * (size_t)N * m);
    d->dead = calloc((size_t)N, 1);
    CHECK(d->atoms && d->dead);
    gsl_rng *r = rng_new(seed);
    for (int j = 0; j < N; j++) {
        float *a = d->atoms + (size_t)j * m;
        random_dir(r, m - hold, 1.0, a);
        for (int c = m - hold; c < m; c++)
            a[c] = 0;
    }
    gsl_rng_free(r);
    if (with_gram)
        REQ_OK(fk_gram_build(d->atoms, N, m, &d->gram));
    d->with = (struct fk_base_dict){.n_atoms = N, .m = m, .atoms = d->atoms, .dead = d->dead,
                                    .gram = d->gram};
    d->without = d->with;
    d->without.gram = NULL;
}

static void tdict_free(struct tdict *d)
{
    free(d->atoms);
    free(d->dead);
    free(d->gram);
}

static void tstream_init(struct tstream *s, const struct tdict *d, int H, int P, int T,
                         const struct tgen *g, unsigned long seed)
{
    int m = d->m;
    s->m = m;
    s->H = H;
    s->P = P;
    s->T = T;
    s->x = calloc((size_t)T * H * m, sizeof(float));
    float *dirs = malloc(sizeof(float) * (size_t)(g->n_dirs + 1) * m);
    CHECK(s->x && dirs);
    gsl_rng *r = rng_new(seed);
    for (int k = 0; k < g->n_dirs; k++)
        novel_dir(r, d, 1.0, dirs + (size_t)k * m);
    int pick[FK_SMAX];
    for (int i = 0; i < T * H; i++) {
        float *x = s->x + (size_t)i * m;
        int t = i / H;
        if (g->zero_every && i % g->zero_every == g->zero_every - 1)
            continue;
        if (g->const_every && i % g->const_every == g->const_every - 1) {
            float c = (float)((int)gsl_rng_uniform_int(r, 64) - 32 + 0.5) / 8; /* 1/16 grid */
            for (int k = 0; k < m; k++)
                x[k] = c;
            continue;
        }
        double pn = t < P ? g->p_novel_prefill : g->p_novel;
        if (gsl_rng_uniform(r) < pn) {
            double norm = 1.0 + 2.0 * gsl_rng_uniform(r);
            if (g->n_dirs > 0) {
                const float *u = dirs + (size_t)gsl_rng_uniform_int(r, g->n_dirs) * m;
                for (int c = 0; c < m; c++)
                    x[c] = (float)(norm * u[c] + 0.02 * gsl_ran_gaussian(r, 1.0) / sqrt(m));
            } else {
                novel_dir(r, d, norm, x);
            }
            continue;
        }
        for (int k = 0; k < g->k_gen; k++) {
            int j, dup;
            do {
                j = (int)gsl_rng_uniform_int(r, (unsigned long)g->n_use);
                dup = 0;
                for (int l = 0; l < k; l++)
                    dup |= pick[l] == j;
            } while (dup);
            pick[k] = j;
            double w = (0.5 + gsl_rng_uniform(r)) * (gsl_rng_uniform(r) < 0.5 ? -1 : 1);
            for (int c = 0; c < m; c++)
                x[c] += (float)(w * d->atoms[(size_t)j * m + c]);
        }
        for (int c = 0; c < m; c++)
            x[c] += (float)(g->noise * gsl_ran_gaussian(r, 1.0));
    }
    gsl_rng_free(r);
    free(dirs);
}

static void *opts_new(const struct fk_codec_ops *ops)
{
    void *o = malloc(ops->opts_size);
    ck_assert_ptr_nonnull(o);
    fk_opts_defaults(ops, o);
    return o;
}

/* Sets a numeric option; returns 0 when the codec has no such option. */
static int opt_try(const struct fk_codec_ops *ops, void *o, const char *name, double v)
{
    const struct fk_option *opt = fk_codec_option(ops, name);
    if (!opt)
        return 0;
    REQUIRE(fk_opts_set(ops, o, opt, v) == FK_OK, "%s.%s = %g: %s", ops->name, name, v,
                  fk_errmsg());
    return 1;
}

static void opt_set(const struct fk_codec_ops *ops, void *o, const char *name, double v)
{
    REQUIRE(opt_try(ops, o, name, v), "codec %s has no option %s", ops->name, name);
}

static void opt_enum(const struct fk_codec_ops *ops, void *o, const char *name,
                     const char *choice)
{
    const struct fk_option *opt = fk_codec_option(ops, name);
    REQUIRE(opt != NULL, "codec %s has no option %s", ops->name, name);
    REQUIRE(fk_opts_set_enum(ops, o, opt, choice) == FK_OK, "%s.%s = %s: %s", ops->name,
                  name, choice, fk_errmsg());
}

/* Defaults with the sizes of the small tests: group quantisers get groups that divide
 * their head_dims (16, 24, 32) and an exact window shorter than their streams. */
static void *opts_small(const struct fk_codec_ops *ops, int s, int n)
{
    void *o = opts_new(ops);
    opt_try(ops, o, "s", s);
    opt_try(ops, o, "n", n);
    opt_try(ops, o, "group", 8);
    opt_try(ops, o, "residual", 16);
    return o;
}

static const struct fk_codec_ops *codec(const char *name)
{
    const struct fk_codec_ops *ops = fk_codec_find(name);
    REQUIRE(ops != NULL, "codec %s is not registered", name);
    return ops;
}

/* ---- the replay driver ---------------------------------------------------------------- */

/* FK_CAP_BASIS codecs: a seeded random orthonormal basis of one group of all H heads (kept
 * until a stream of another shape asks; fk_test_basis.h). */
static struct fk_test_basis g_tbasis;
static int g_tb_H, g_tb_m, g_tb_T;

static const struct fk_test_basis *tbasis(int H, int m, int T)
{
    if (H != g_tb_H || m != g_tb_m || T > g_tb_T) {
        if (g_tb_H)
            fk_test_basis_free(&g_tbasis);
        fk_test_basis_init(&g_tbasis, H, m, T, 1000u + (unsigned)(H * 4096 + m));
        g_tb_H = H, g_tb_m = m, g_tb_T = T;
    }
    return &g_tbasis;
}

/* env's basis, positions and RoPE for a FK_CAP_BASIS codec; other codecs' env untouched. */
/* The stream an FK_CAP_EXTERNAL codec's "prototype" saw: its rows are the stream's vectors
 * halved (exact in float: every error is 1/2 and a zero vector stays zero). */
static const struct tstream *g_ext_stream;
/* The rows of the last 16 opened states (two states of one stream are alive at once when
 * runs are compared): a ring, each slot reused 16 opens later. */
static float *g_ext_ring[16];
static int g_ext_next;

static void tenv(const struct fk_codec_ops *ops, struct fk_stream_env *env)
{
    if (ops->caps & FK_CAP_BASIS)
        fk_test_basis_env(tbasis(env->n_heads, env->head_dim, env->n_tokens), ops, env);
    size_t n = (size_t)env->n_heads * env->n_tokens * env->head_dim;
    if (!(ops->caps & FK_CAP_EXTERNAL) || n > ((size_t)1 << 24))
        return; /* too large to be a real run: open() must fail cleanly without rows */
    float **slot = &g_ext_ring[g_ext_next++ % 16];
    free(*slot);
    float *g_ext_rows = *slot = calloc(n + 1, sizeof(float));
    CHECK(g_ext_rows != NULL);
    const struct tstream *s = g_ext_stream;
    int m = env->head_dim, H = env->n_heads, T = env->n_tokens;
    if (s && s->m == m && s->H == H && s->T == T)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++)
                for (int c = 0; c < m; c++)
                    g_ext_rows[((size_t)h * T + t) * m + c] =
                        0.5f * s->x[((size_t)t * H + h) * m + c];
    env->external = g_ext_rows;
}

struct trun {
    const struct fk_codec_ops *ops;
    void *st;                    /* codec state */
    struct fk_vec_out *out;      /* [T][H] outcome of every vector */
    float *err_commit;           /* [T][H] error of each row right after its event, or NULL */
    int rule;                    /* the codec's buffer rule of this kind (enum fk_buf_mode) */
    int H, m;                    /* heads, head_dim */
    int n_tok;                   /* tokens committed (all heads) */
    int n_tok_prev;              /* tokens committed before the last event */
    int events;                  /* encode calls */
};

/* Called before (after = 0) and after (after = 1) every event. */
typedef void (*thook_fn)(void *ctx, struct trun *r, const struct fk_event *ev, int after);

static void trun_open(struct trun *r, const struct fk_codec_ops *ops, const void *opts,
                      const struct tdict *d, int H, int T, int kind)
{
    memset(r, 0, sizeof *r);
    r->ops = ops;
    r->H = H;
    r->m = d->m;
    const struct fk_base_dict *base = NULL;
    if (ops->caps & FK_CAP_DICT)
        base = (ops->caps & FK_CAP_GRAM) ? &d->with : &d->without;
    if (ops->check)
        REQUIRE(ops->check(opts, d->m, base ? d->N : 0) == FK_OK, "%s: check: %s",
                      ops->name, fk_errmsg());
    struct fk_stream_env env = {.layer = 0, .kind = kind, .head_dim = d->m, .n_heads = H,
                                .n_tokens = T, .base = base};
    tenv(ops, &env);
    REQUIRE(ops->open(opts, &env, &r->st) == FK_OK, "%s: open: %s", ops->name,
                  fk_errmsg());
    struct fk_buffer b;
    fk_codec_buffer(ops, opts, kind, &b);
    r->rule = b.mode;
    r->out = calloc((size_t)T * H, sizeof *r->out);
    r->err_commit = calloc((size_t)T * H, sizeof *r->err_commit);
    ck_assert_ptr_nonnull(r->out);
    ck_assert_ptr_nonnull(r->err_commit);
}

static double row_err(const struct trun *r, const float *x, int h, int t, float *xh);

/* Encodes one event of tokens t0 .. t1-1 (all heads); returns encode's result. */
static int trun_event(struct trun *r, const struct tstream *s, int t0, int t1, int phase,
                      int step, thook_fn hook, void *ctx)
{
    int n = (t1 - t0) * s->H;
    int32_t *token = malloc(sizeof(int32_t) * (size_t)n);
    int32_t *head = malloc(sizeof(int32_t) * (size_t)n);
    CHECK(token && head);
    for (int i = 0; i < n; i++) {
        token[i] = t0 + i / s->H;
        head[i] = i % s->H;
    }
    struct fk_event ev = {.phase = phase, .step = step, .n = n,
                          .x = s->x + (size_t)t0 * s->H * s->m, .token = token, .head = head};
    if (hook)
        hook(ctx, r, &ev, 0);
    int rc = r->ops->encode(r->st, &ev, r->out + (size_t)t0 * s->H);
    if (rc == FK_OK && r->err_commit) { /* what the rows reconstruct to when committed */
        float *xh = malloc(sizeof(float) * (size_t)s->m);
        CHECK(xh != NULL);
        for (int i = 0; i < n; i++)
            r->err_commit[(size_t)t0 * s->H + i] =
                (float)row_err(r, ev.x + (size_t)i * s->m, head[i], token[i], xh);
        free(xh);
    }
    if (rc == FK_OK) {
        r->n_tok_prev = r->n_tok;
        r->n_tok = t1;
        r->events++;
        if (hook)
            hook(ctx, r, &ev, 1);
    }
    free(token);
    free(head);
    return rc;
}

/* The events of a stream. A codec with a buffer rule (ops->buffer) gets the engine's:
 * fk_codec_buffer's rule over the stream's P and T (a BLOCK event at step t holds token t
 * and comes after that step's attention), so its last exact tokens stay unstored. A codec
 * without one gets every token: the prefill whole, then one event per a_len decode tokens
 * (the schedule's BLOCK_ALL with n_b = a_len; the engine's SLIDE window would leave its
 * last n_b rows unchecked). */
static struct fk_sched trun_sched(const struct fk_codec_ops *ops, const void *opts, int kind,
                                  const struct tstream *s)
{
    struct fk_buffer b;
    fk_codec_buffer(ops, opts, kind, &b);
    if (!ops->buffer)
        b = (struct fk_buffer){.mode = FK_BUF_BLOCK_ALL, .n_b = b.a_len, .a_len = b.a_len};
    return (struct fk_sched){.n_tokens = s->T, .prompt_len = s->P, .n_b = b.n_b,
                             .a_len = b.a_len, .mode = b.mode};
}

/* The whole stream, event by event (trun_sched). */
static void trun_stream(struct trun *r, const struct fk_codec_ops *ops, const void *opts,
                        const struct tdict *d, const struct tstream *s, int kind, thook_fn hook,
                        void *ctx)
{
    g_ext_stream = s;
    trun_open(r, ops, opts, d, s->H, s->T, kind);
    struct fk_sched sc = trun_sched(ops, opts, kind, s);
    struct fk_sched_iter it;
    struct fk_sched_event e;
    fk_sched_begin(&it, &sc);
    while (fk_sched_next(&it, &e)) {
        int rc = trun_event(r, s, e.first, e.end, e.phase, e.step, hook, ctx);
        REQUIRE(rc == FK_OK, "%s: %s encode of tokens %d..%d (step %d): %s", ops->name,
                e.phase ? "decode" : "prefill", e.first, e.end - 1, e.step, fk_errmsg());
    }
}

static void trun_close(struct trun *r)
{
    r->ops->close(r->st);
    free(r->out);
    free(r->err_commit);
    r->st = NULL;
    r->out = NULL;
    r->err_commit = NULL;
}

static struct fk_stream_stats stats_of(const struct trun *r)
{
    struct fk_stream_stats st;
    memset(&st, 0, sizeof st);
    r->ops->stats(r->st, &st);
    return st;
}

static double dot_fd(const float *a, const float *b, int m)
{
    double s = 0;
    for (int i = 0; i < m; i++)
        s += (double)a[i] * b[i];
    return s;
}

/* Relative error of a stored row, recomputed from ops->reconstruct. */
static double row_err(const struct trun *r, const float *x, int h, int t, float *xh)
{
    REQUIRE(r->ops->reconstruct(r->st, h, t, xh) == FK_OK, "%s: reconstruct(%d, %d): %s",
                  r->ops->name, h, t, fk_errmsg());
    double e = 0, xx = 0;
    for (int c = 0; c < r->m; c++) {
        double d = (double)x[c] - xh[c];
        e += d * d;
        xx += (double)x[c] * x[c];
    }
    return xx > 0 ? sqrt(e / xx) : sqrt(e);
}

/* ---- checks run around events --------------------------------------------------------- */

enum {
    CK_REFCOUNT = 1u << 0, /* ref_count equals a recount of the stored codes */
    CK_PAST = 1u << 1,     /* past rows reconstruct bit-identically after the event */
    CK_ATOMS = 1u << 2,    /* atom-set evolution (sizes, unit norm, append-only) */
    CK_NODUP = 1u << 3,    /* appended atoms are no near-duplicates of pre-event atoms */
};

struct tcheck {
    unsigned what;               /* CK_* */
    int N;                       /* base atoms */
    double delta;                /* adaptation threshold of the stream's kind */
    float *snap;                 /* [T*H][m] reconstructions before the event (CK_PAST) */
    float *atoms0;               /* [n0][m] atoms before the event (CK_ATOMS) */
    int n0;                      /* atoms before the event */
    struct fk_stream_stats st0;  /* stats before the event */
    long past_rows;              /* rows compared bit-exactly */
    long recounts;               /* ref_count recounts done */
    long new_atoms;              /* appended or replaced atoms checked */
    double max_coh;              /* largest |d_j . u| of an appended atom over pre-event atoms */
};

static void recount_refs(const struct trun *r, struct tcheck *c)
{
    struct fk_stream_stats st = stats_of(r);
    ck_assert_ptr_nonnull(st.ref_count);
    uint32_t *cnt = calloc((size_t)st.n_atoms + 1, sizeof(uint32_t));
    ck_assert_ptr_nonnull(cnt);
    for (int h = 0; h < r->H; h++)
        for (int t = 0; t < r->n_tok; t++) {
            int nnz = -1;
            const int32_t *idx = NULL;
            const float *coef = NULL;
            REQ_OK(r->ops->sparse_row(r->st, h, t, &nnz, &idx, &coef));
            for (int i = 0; i < nnz; i++) {
                REQUIRE(idx[i] >= 0 && idx[i] < st.n_atoms,
                              "%s: row (%d, %d) atom %d outside [0, %d)", r->ops->name, h, t,
                              idx[i], st.n_atoms);
                for (int k = 0; k < i; k++)
                    REQUIRE(idx[k] != idx[i], "%s: row (%d, %d) holds atom %d twice",
                                  r->ops->name, h, t, idx[i]);
                cnt[idx[i]]++;
            }
        }
    for (int j = 0; j < st.n_atoms; j++)
        REQUIRE(cnt[j] == st.ref_count[j],
                      "%s: after event %d atom %d: ref_count %u, recount %u", r->ops->name,
                      r->events, j, st.ref_count[j], cnt[j]);
    free(cnt);
    c->recounts++;
}

static void check_hook(void *ctx, struct trun *r, const struct fk_event *ev, int after)
{
    struct tcheck *c = ctx;
    const struct fk_codec_ops *ops = r->ops;
    int m = r->m;
    if (!after) {
        c->st0 = stats_of(r);
        if (c->what & CK_ATOMS) {
            int n0 = -1;
            const float *A = ops->atoms(r->st, &n0);
            ck_assert_int_eq(n0, c->st0.n_atoms);
            free(c->atoms0);
            c->atoms0 = malloc(sizeof(float) * (size_t)n0 * m);
            ck_assert_ptr_nonnull(c->atoms0);
            memcpy(c->atoms0, A, sizeof(float) * (size_t)n0 * m);
            c->n0 = n0;
        }
        if ((c->what & CK_PAST) && ev->phase == 1)
            for (int i = 0; i < r->n_tok * r->H; i++)
                REQ_OK(ops->reconstruct(r->st, i % r->H, i / r->H,
                                                  c->snap + (size_t)i * m));
        return;
    }
    struct fk_stream_stats st = stats_of(r);
    if (c->what & CK_REFCOUNT)
        recount_refs(r, c);
    if ((c->what & CK_PAST) && ev->phase == 1) {
        float *xh = malloc(sizeof(float) * (size_t)m);
        ck_assert_ptr_nonnull(xh);
        for (int i = 0; i < r->n_tok_prev * r->H; i++) {
            REQ_OK(ops->reconstruct(r->st, i % r->H, i / r->H, xh));
            REQUIRE(!memcmp(xh, c->snap + (size_t)i * m, sizeof(float) * (size_t)m),
                          "%s: event %d (step %d) changed the reconstruction of stored row "
                          "(head %d, token %d); replacements %llu -> %llu",
                          ops->name, r->events, ev->step, i % r->H, i / r->H,
                          (unsigned long long)c->st0.replacements,
                          (unsigned long long)st.replacements);
            c->past_rows++;
        }
        free(xh);
    }
    if (c->what & CK_ATOMS) {
        int n1 = -1;
        const float *A = ops->atoms(r->st, &n1);
        ck_assert_int_eq(n1, st.n_atoms);
        ck_assert_int_eq(st.n_base, c->N);
        if (!(ops->caps & FK_CAP_GROWS)) {
            REQUIRE(n1 == c->N, "%s: n_atoms %d != N %d after event %d", ops->name, n1,
                          c->N, r->events);
            int changed = 0;
            for (int j = 0; j < n1; j++) {
                const float *u = A + (size_t)j * m;
                if (!memcmp(u, c->atoms0 + (size_t)j * m, sizeof(float) * (size_t)m))
                    continue;
                changed++;
                REQUIRE(fabs(sqrt(dot_fd(u, u, m)) - 1) < 1e-5,
                              "%s: replaced atom %d has norm %g", ops->name, j,
                              sqrt(dot_fd(u, u, m)));
                CHECK(st.is_adapted && st.is_adapted[j]);
                c->new_atoms++;
            }
            /* one atom can be replaced twice in an event; never more changes than replacements */
            ck_assert_uint_le((uint64_t)changed, st.replacements - c->st0.replacements);
            if (ev->phase == 0 || !(ops->caps & FK_CAP_ADAPTS))
                ck_assert_int_eq(changed, 0);
        } else {
            REQUIRE(n1 >= c->n0, "%s: the dictionary shrank from %d to %d atoms",
                          ops->name, c->n0, n1);
            if (ev->phase == 0)
                REQUIRE(n1 == c->n0, "%s: grew during prefill (%d -> %d atoms)",
                              ops->name, c->n0, n1);
            ck_assert_uint_eq((uint64_t)(n1 - c->n0), st.appends - c->st0.appends);
            REQUIRE(!memcmp(A, c->atoms0, sizeof(float) * (size_t)c->n0 * m),
                          "%s: an append changed an existing atom", ops->name);
            for (int j = c->n0; j < n1; j++) {
                const float *u = A + (size_t)j * m;
                double nrm = sqrt(dot_fd(u, u, m));
                REQUIRE(fabs(nrm - 1) < 1e-5, "%s: appended atom %d has norm %.9f",
                              ops->name, j, nrm);
                CHECK(st.is_adapted && st.is_adapted[j]);
                c->new_atoms++;
                if (!(c->what & CK_NODUP))
                    continue;
                for (int k = 0; k < c->n0; k++) {
                    double coh = fabs(dot_fd(c->atoms0 + (size_t)k * m, u, m));
                    if (coh > c->max_coh)
                        c->max_coh = coh;
                    REQUIRE(coh < 1 - 1e-6,
                                  "%s: appended atom %d duplicates atom %d (|d.u| = %.9f)",
                                  ops->name, j, k, coh);
                    /* spec 6.3: e > delta implies |d^T x|/|x| < sqrt(1 - delta^2) */
                    REQUIRE(coh < sqrt(1 - c->delta * c->delta) + 1e-4,
                                  "%s: appended atom %d has coherence %.6f with atom %d, above "
                                  "sqrt(1 - delta^2) = %.6f", ops->name, j, coh, k,
                                  sqrt(1 - c->delta * c->delta));
                }
            }
        }
    }
}

static void tcheck_free(struct tcheck *c)
{
    free(c->snap);
    free(c->atoms0);
}

/* ---- 1. option tables and cross-option checks ----------------------------------------- */

static int is_name(const char *s)
{
    if (!s || !*s)
        return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '_'))
            return 0;
    return 1;
}

static void lint_option(const struct fk_codec_ops *ops, const struct fk_option *o, void *buf)
{
    const char *cn = ops->name;
    REQUIRE(is_name(o->name), "%s: option name '%s' is not [a-z0-9_]+", cn, o->name);
    REQUIRE(o->help && *o->help, "%s.%s: no help", cn, o->name);
    REQUIRE(o->min <= o->def && o->def <= o->max, "%s.%s: def %g outside [%g, %g]", cn,
                  o->name, o->def, o->min, o->max);
    size_t sz = o->type == FK_OPT_DOUBLE ? sizeof(double) : sizeof(int);
    REQUIRE(o->offset + sz <= ops->opts_size, "%s.%s: offset outside the struct", cn,
                  o->name);
    if (o->type != FK_OPT_DOUBLE)
        REQUIRE(o->def == floor(o->def) && o->min == floor(o->min) &&
                          o->max == floor(o->max) && o->max <= 2147483647.0,
                      "%s.%s: integer option with non-integer bounds", cn, o->name);
    if (o->type == FK_OPT_BOOL)
        REQUIRE(o->min == 0 && o->max == 1, "%s.%s: BOOL range not [0, 1]", cn, o->name);
    if (o->type == FK_OPT_ENUM) {
        REQUIRE(o->choices != NULL, "%s.%s: ENUM without choices", cn, o->name);
        int n = 0;
        while (o->choices[n]) {
            REQUIRE(is_name(o->choices[n]) || strchr(o->choices[n], '-'),
                          "%s.%s: bad choice", cn, o->name);
            for (int k = 0; k < n; k++)
                REQUIRE(strcmp(o->choices[k], o->choices[n]), "%s.%s: choice %s twice",
                              cn, o->name, o->choices[n]);
            n++;
        }
        REQUIRE(o->min == 0 && o->max == n - 1, "%s.%s: range [%g, %g] but %d choices",
                      cn, o->name, o->min, o->max, n);
        for (int k = 0; k < n; k++) {
            REQ_OK(fk_opts_set_enum(ops, buf, o, o->choices[k]));
            ck_assert_int_eq((int)fk_opts_get(buf, o), k);
            char txt[64];
            fk_opts_format(buf, o, txt, sizeof txt);
            ck_assert_str_eq(txt, o->choices[k]);
        }
        fk_err_clear();
        ck_assert_int_eq(fk_opts_set_enum(ops, buf, o, "no-such-choice"), FK_ECONFIG);
        REQUIRE(strstr(fk_errmsg(), o->name) != NULL, "%s.%s: message '%s' lacks the name",
                      cn, o->name, fk_errmsg());
        ck_assert_int_eq((int)fk_opts_get(buf, o), n - 1); /* unchanged by the failure */
    }
    /* range checks: accepted ends, rejected outside, non-integers, NaN and inf */
    REQ_OK(fk_opts_set(ops, buf, o, o->min));
    REQ_OK(fk_opts_set(ops, buf, o, o->max));
    CHECK(fk_opts_get(buf, o) == o->max);
    REQ_OK(fk_opts_set(ops, buf, o, o->def));
    double span = o->max - o->min;
    double below = o->min - (span > 0 ? span * 1e-3 : 1);
    double above = o->max + (span > 0 ? span * 1e-3 : 1);
    if (o->type != FK_OPT_DOUBLE) {
        below = o->min - 1;
        above = o->max + 1;
    }
    fk_err_clear();
    REQUIRE(fk_opts_set(ops, buf, o, below) == FK_ECONFIG, "%s.%s accepted %g", cn, o->name,
                  below);
    REQUIRE(strstr(fk_errmsg(), o->name) != NULL, "%s.%s: message '%s' lacks the name", cn,
                  o->name, fk_errmsg());
    REQUIRE(fk_opts_set(ops, buf, o, above) == FK_ECONFIG, "%s.%s accepted %g", cn, o->name,
                  above);
    ck_assert_int_eq(fk_opts_set(ops, buf, o, NAN), FK_ECONFIG);
    ck_assert_int_eq(fk_opts_set(ops, buf, o, INFINITY), FK_ECONFIG);
    if (o->type != FK_OPT_DOUBLE && o->max > o->min)
        REQUIRE(fk_opts_set(ops, buf, o, o->min + 0.5) == FK_ECONFIG,
                      "%s.%s accepted the non-integer %g", cn, o->name, o->min + 0.5);
    REQUIRE(fk_opts_get(buf, o) == o->def, "%s.%s: a rejected set changed the value", cn,
                  o->name);
    if (o->type == FK_OPT_DOUBLE) {
        double v = o->min + span / 3;
        REQ_OK(fk_opts_set(ops, buf, o, v));
        char txt[64];
        fk_opts_format(buf, o, txt, sizeof txt);
        REQUIRE(strtod(txt, NULL) == v, "%s.%s: '%s' does not read back", cn, o->name,
                      txt);
        REQ_OK(fk_opts_set(ops, buf, o, o->def));
    }
}

/* The declarations are consistent: known bits only, and what each one presupposes. */
static void lint_caps(const struct fk_codec_ops *ops)
{
    unsigned caps = ops->caps;
    unsigned known = FK_CAP_DICT | FK_CAP_GRAM | FK_CAP_SPARSE | FK_CAP_GROWS |
                     FK_CAP_ADAPTS | FK_CAP_STATIC | FK_CAP_EXACT | FK_CAP_GRID | FK_CAP_BASIS |
                     FK_CAP_EXTERNAL;
    REQUIRE(!(caps & ~known), "%s: unknown capability bits 0x%x", ops->name, caps & ~known);
    REQUIRE(!(caps & FK_CAP_GRAM) || (caps & FK_CAP_DICT), "%s: FK_CAP_GRAM (the base "
            "dictionary's Gram) without FK_CAP_DICT", ops->name);
    REQUIRE(!(caps & FK_CAP_GROWS) || (caps & FK_CAP_SPARSE), "%s: FK_CAP_GROWS without "
            "atoms (FK_CAP_SPARSE)", ops->name);
    REQUIRE(!(caps & FK_CAP_EXACT) || !(caps & (FK_CAP_GRID | FK_CAP_ADAPTS)), "%s: "
            "FK_CAP_EXACT with a lossy declaration", ops->name);
    if (caps & FK_CAP_GRID)
        REQUIRE(!(caps & FK_CAP_SPARSE) && fk_codec_option(ops, "bits"), "%s: FK_CAP_GRID "
                "needs a dense codec with a `bits` option", ops->name);
}

START_TEST(options_lint)
{
    int n_codecs = 0;
    for (int ci = 0; fk_codecs[ci]; ci++, n_codecs++) {
        const struct fk_codec_ops *ops = fk_codecs[ci];
        REQUIRE(is_name(ops->name) || strchr(ops->name, '-'), "bad codec name");
        ck_assert_ptr_eq(fk_codec_find(ops->name), ops);
        for (int k = 0; k < ci; k++)
            ck_assert_str_ne(fk_codecs[k]->name, ops->name);
        CHECK(ops->summary && *ops->summary);
        CHECK(ops->open && ops->encode && ops->reconstruct && ops->stats && ops->close);
        if (ops->caps & FK_CAP_SPARSE)
            CHECK(ops->sparse_row && ops->atoms);
        lint_caps(ops);
        ck_assert_uint_ge(ops->opts_size, sizeof(struct fk_common_opts));
        const struct fk_option *o = ops->options;
        ck_assert_ptr_nonnull(o);
        /* the common options come first, at the offsets of struct fk_common_opts, unless
         * the codec gives its own buffer rule (then its table names what stays exact) */
        REQUIRE(ops->buffer || (o[0].name && !strcmp(o[0].name, "n_b") &&
                                o[0].offset == offsetof(struct fk_common_opts, n_b)),
                      "%s: first option is not n_b", ops->name);
        REQUIRE(ops->buffer || (o[1].name && !strcmp(o[1].name, "a_len") &&
                                o[1].offset == offsetof(struct fk_common_opts, a_len)),
                      "%s: second option is not a_len", ops->name);
        REQUIRE(ops->buffer || (o[2].name && !strcmp(o[2].name, "coef") &&
                                o[2].type == FK_OPT_ENUM &&
                                o[2].offset == offsetof(struct fk_common_opts, coef)),
                      "%s: third option is not coef", ops->name);
        void *buf = opts_new(ops);
        for (int kind = 0; ops->buffer && kind < 2; kind++) {
            struct fk_buffer b; /* at the defaults, a rule the schedule walks */
            fk_codec_buffer(ops, buf, kind, &b);
            REQUIRE(b.mode >= FK_BUF_SLIDE && b.mode <= FK_BUF_BLOCK_ALL && b.a_len >= 1 &&
                        b.n_b >= (b.mode == FK_BUF_SLIDE ? 0 : 1),
                    "%s: kind %d: buffer rule (mode %d, n_b %d, a_len %d) is no rule of "
                    "enum fk_buf_mode", ops->name, kind, b.mode, b.n_b, b.a_len);
        }
        for (int i = 0; o[i].name; i++) {
            for (int k = 0; k < i; k++)
                REQUIRE(strcmp(o[k].name, o[i].name), "%s: option %s twice", ops->name,
                              o[i].name);
            for (int k = 0; k < i; k++)
                REQUIRE(o[k].offset != o[i].offset, "%s: options %s and %s overlap",
                              ops->name, o[k].name, o[i].name);
            REQUIRE(fk_opts_get(buf, &o[i]) == o[i].def, "%s.%s: default not applied",
                          ops->name, o[i].name);
            ck_assert_ptr_eq(fk_codec_option(ops, o[i].name), &o[i]);
            lint_option(ops, &o[i], buf);
        }
        ck_assert_ptr_null(fk_codec_option(ops, "no_such_option"));
        free(buf);
    }
    ck_assert_int_ge(n_codecs, 6);
    ck_assert_ptr_null(fk_codec_find("no-such-codec"));

    /* cross-option checks */
    for (int ci = 0; fk_codecs[ci]; ci++) {
        const struct fk_codec_ops *ops = fk_codecs[ci];
        if (!(ops->caps & FK_CAP_DICT))
            continue;
        CHECK(ops->check != NULL);
        void *o = opts_new(ops);
        REQUIRE(ops->check(o, 128, 4096) == FK_OK, "%s: defaults rejected: %s",
                      ops->name, fk_errmsg());
        REQUIRE(ops->check(o, 128, 0) == FK_OK, "%s: defaults rejected without N: %s",
                      ops->name, fk_errmsg());
        /* s > N */
        opt_set(ops, o, "s", 16);
        opt_try(ops, o, "n", 8);
        REQUIRE(ops->check(o, 128, 8) < 0, "%s: accepted s = 16 > N = 8", ops->name);
        free(o);
        int screened = !strcmp(ops->name, "gm") || !strcmp(ops->name, "fadkv");
        if (!screened)
            continue;
        o = opts_new(ops);
        opt_set(ops, o, "s", 8);
        opt_set(ops, o, "n", 4);
        fk_err_clear();
        REQUIRE(ops->check(o, 128, 4096) < 0, "%s: accepted s = 8 > n = 4", ops->name);
        REQUIRE(strstr(fk_errmsg(), "n = 4") != NULL, "%s: message '%s'", ops->name,
                      fk_errmsg());
        opt_set(ops, o, "n", 512);
        REQUIRE(ops->check(o, 128, 4096) == FK_OK, "%s: %s", ops->name, fk_errmsg());
        REQUIRE(ops->check(o, 128, 256) < 0, "%s: accepted n = 512 > N = 256", ops->name);
        opt_set(ops, o, "n", 8);
        REQUIRE(ops->check(o, 128, 8) == FK_OK, "%s: s = n = N rejected: %s", ops->name,
                      fk_errmsg());
        free(o);
    }
}
END_TEST

/* OpenBLAS threads at start-up; the suite runs on 1 (tiny products) except where the
 * determinism test compares thread counts. */
static int blas_default = 1;

/* ---- 2. every codec: reported errors, zero vectors, full, determinism ----------------- */

/* Rows handed over in blocks (BLOCK, BLOCK_ALL) may be coded together, as KIVI's keys
 * per channel: a zero row is flagged but need not come back as zero. Under BLOCK_ALL
 * (Hugging Face's QuantizedCache) every flush may quantise the stored rows again: a vector
 * reports the error of its row right after its event, not at the end. Rows handed over by
 * SLIDE, and every codec without a buffer rule, get both checks at the end. */
static void check_stream_outcome(const struct trun *r, const struct tstream *s, const void *opts)
{
    const struct fk_codec_ops *ops = r->ops;
    int m = s->m, H = s->H;
    int sparse = (ops->caps & FK_CAP_SPARSE) != 0, exact = (ops->caps & FK_CAP_EXACT) != 0;
    int dict = (ops->caps & FK_CAP_DICT) != 0;
    int zero_back = r->rule == FK_BUF_SLIDE, final_err = r->rule != FK_BUF_BLOCK_ALL;
    struct fk_stream_stats st = stats_of(r);
    float *xh = malloc(sizeof(float) * (size_t)m);
    float *xs = malloc(sizeof(float) * (size_t)m);
    CHECK(xh && xs);
    const struct fk_option *so = fk_codec_option(ops, "s");
    int s_max = so ? (int)fk_opts_get(opts, so) : m;
    const struct fk_common_opts *co = opts;
    const struct fk_option *po = fk_codec_option(ops, "ptr_bytes");
    int b_ptr = po ? (int)fk_opts_get(opts, po) : 0;
    int b_val = co->coef == FK_COEF_FP8 ? 1 : co->coef == FK_COEF_FP16 ? 2 : 4;
    double bytes = 0, row_bytes = 0;
    uint64_t nnz_sum = 0, adapted = 0, zeros = 0;
    int n_atoms = 0;
    const float *A = sparse ? ops->atoms(r->st, &n_atoms) : NULL;
    for (int i = 0; i < r->n_tok * H; i++) {
        int h = i % H, t = i / H;
        const float *x = s->x + (size_t)i * m;
        const struct fk_vec_out *o = &r->out[i];
        row_bytes += o->bytes;
        double err = row_err(r, x, h, t, xh);
        double xx = dot_fd(x, x, m);
        for (int c = 0; c < m; c++)
            REQUIRE(isfinite(xh[c]), "%s: row %d (head %d, token %d) reconstructs a non-finite "
                    "value at coordinate %d", ops->name, i, h, t, c);
        if (o->flags & FK_VEC_ADAPTED)
            adapted++;
        if (xx == 0) {
            zeros++;
            REQUIRE(o->flags & FK_VEC_ZERO, "%s: zero vector %d lacks FK_VEC_ZERO",
                          ops->name, i);
            CHECK(!(o->flags & FK_VEC_ADAPTED));
            CHECK(o->err == 0 && o->err_enc == 0);
            for (int c = 0; zero_back && c < m; c++)
                REQUIRE(xh[c] == 0, "%s: zero vector %d reconstructs nonzero", ops->name,
                              i);
            if (sparse)
                REQUIRE(o->nnz == 0, "%s: zero vector %d has nnz %d", ops->name, i,
                              o->nnz);
        } else {
            REQUIRE(!(o->flags & FK_VEC_ZERO), "%s: vector %d flagged zero", ops->name, i);
            REQUIRE(fabs(r->err_commit[i] - o->err) <= 1e-5,
                    "%s: vector %d (head %d, token %d): reported err %.8f, recomputed after "
                    "its event %.8f", ops->name, i, h, t, o->err, r->err_commit[i]);
            REQUIRE(!final_err || fabs(err - o->err) <= 1e-5,
                          "%s: vector %d (head %d, token %d): reported err %.8f, recomputed "
                          "%.8f", ops->name, i, h, t, o->err, err);
            CHECK(isfinite(o->err_enc) && o->err_enc >= 0);
        }
        if (exact)
            REQUIRE(!memcmp(xh, x, sizeof(float) * (size_t)m) && o->err == 0 &&
                        o->err_enc == 0,
                    "%s: row %d is not stored exactly (the codec declares FK_CAP_EXACT)",
                    ops->name, i);
        if (!sparse) { /* dense: every coordinate is stored; a basis codec: its share */
            int basis = (ops->caps & FK_CAP_BASIS) != 0;
            REQUIRE(xx == 0 || o->nnz == m || (basis && o->nnz > 0 && o->nnz <= m),
                    "%s: dense row %d reports nnz %d, not head_dim %d", ops->name, i, o->nnz, m);
            continue;
        }
        int nnz = -1;
        const int32_t *idx = NULL;
        const float *coef = NULL;
        REQ_OK(ops->sparse_row(r->st, h, t, &nnz, &idx, &coef));
        REQUIRE(nnz == o->nnz, "%s: row %d stores %d atoms, reported %d", ops->name, i,
                      nnz, o->nnz);
        REQUIRE(nnz >= 0 && nnz <= s_max, "%s: row %d has nnz %d > s %d", ops->name, i,
                      nnz, s_max);
        /* stored coefficients are what the `coef` format holds (bytes are billed for it) */
        for (int k = 0; k < nnz; k++) {
            float q = co->coef == FK_COEF_FP8    ? fk_fp8_decode(fk_fp8_encode(coef[k], NULL))
                      : co->coef == FK_COEF_FP16 ? fk_fp16_decode(fk_fp16_encode(coef[k]))
                                                 : coef[k];
            REQUIRE(q == coef[k], "%s: row %d coefficient %d = %.9g is not a %s value",
                    ops->name, i, k, coef[k], fk_coef_names[co->coef]);
        }
        /* the reconstruction is sum coef_i d_idx_i over the current atoms */
        memset(xs, 0, sizeof(float) * (size_t)m);
        for (int k = 0; k < nnz; k++) {
            CHECK(idx[k] >= 0 && idx[k] < n_atoms);
            for (int c = 0; c < m; c++)
                xs[c] += coef[k] * A[(size_t)idx[k] * m + c];
        }
        for (int c = 0; c < m; c++)
            REQUIRE(fabsf(xs[c] - xh[c]) <= 1e-5f * (1 + fabsf(xh[c])),
                          "%s: row %d: reconstruct differs from its sparse code", ops->name, i);
        nnz_sum += (uint64_t)nnz;
        bytes += nnz * (b_val + 2) + b_ptr;
    }
    ck_assert_int_gt((int)zeros, 0);
    if (sparse)
        REQUIRE(st.uses_total == nnz_sum, "%s: uses_total %llu, stored nnz %llu",
                      ops->name, (unsigned long long)st.uses_total,
                      (unsigned long long)nnz_sum);
    /* the dictionary codecs' formula (spec 10.6); every class: check_bytes_model */
    if (dict)
        REQUIRE(st.bytes_codes == bytes, "%s: bytes_codes %.0f, expected %.0f", ops->name,
                      st.bytes_codes, bytes);
    /* a static codec's rows are encoded ahead of their eviction: the engine sums the bytes
     * of the compressed ones from what each row reported */
    if (ops->caps & FK_CAP_STATIC)
        REQUIRE(fabs(row_bytes - st.bytes_codes) <= 1e-6 * st.bytes_codes,
                "%s: its rows report %.1f bytes, bytes_codes is %.1f", ops->name, row_bytes,
                st.bytes_codes);
    if (exact)
        REQUIRE(st.bytes_codes == 2.0 * m * r->n_tok * H, "%s: exact rows cost %.0f bytes, "
                "not the fp16 reference's %.0f", ops->name, st.bytes_codes,
                2.0 * m * r->n_tok * H);
    REQUIRE(adapted == st.appends + st.replacements,
                  "%s: %llu vectors flagged adapted, appends + replacements = %llu", ops->name,
                  (unsigned long long)adapted,
                  (unsigned long long)(st.appends + st.replacements));
    if (ops->caps & FK_CAP_ADAPTS)
        REQUIRE(adapted > 0, "%s: the stream never adapted (test data too easy)",
                      ops->name);
    else
        ck_assert_int_eq((int)adapted, 0);
    free(xh);
    free(xs);
}

static void assert_runs_equal(const struct trun *a, const struct trun *b, int n_vec)
{
    const char *cn = a->ops->name;
    REQUIRE(!memcmp(a->out, b->out, sizeof *a->out * (size_t)n_vec),
                  "%s: per-vector outcomes differ between two identical runs", cn);
    struct fk_stream_stats sa = stats_of(a), sb = stats_of(b);
    CHECK(sa.n_atoms == sb.n_atoms && sa.appends == sb.appends &&
              sa.replacements == sb.replacements && sa.adapt_failed == sb.adapt_failed &&
              sa.saturated == sb.saturated && sa.uses_total == sb.uses_total &&
              sa.macs == sb.macs && sa.bytes_codes == sb.bytes_codes &&
              sa.bytes_dict_seq == sb.bytes_dict_seq);
    float *x1 = malloc(sizeof(float) * (size_t)a->m), *x2 = malloc(sizeof(float) * (size_t)a->m);
    CHECK(x1 && x2);
    for (int i = 0; i < n_vec; i++) {
        REQ_OK(a->ops->reconstruct(a->st, i % a->H, i / a->H, x1));
        REQ_OK(b->ops->reconstruct(b->st, i % b->H, i / b->H, x2));
        REQUIRE(!memcmp(x1, x2, sizeof(float) * (size_t)a->m),
                      "%s: row %d differs between two identical runs", cn, i);
    }
    if (a->ops->caps & FK_CAP_SPARSE) {
        int na = 0, nb = 0;
        const float *Aa = a->ops->atoms(a->st, &na), *Ab = b->ops->atoms(b->st, &nb);
        ck_assert_int_eq(na, nb);
        CHECK(!memcmp(Aa, Ab, sizeof(float) * (size_t)na * a->m));
        CHECK(!sa.ref_count == !sb.ref_count);
        if (sa.ref_count)
            CHECK(!memcmp(sa.ref_count, sb.ref_count, sizeof(uint32_t) * (size_t)na));
    }
    free(x1);
    free(x2);
}

START_TEST(every_codec_conforms)
{
    struct tdict d;
    tdict_init(&d, 96, 24, 6, 1, 11);
    struct tstream s;
    struct tgen g = {.n_use = 96, .k_gen = 3, .noise = 0.01, .p_novel_prefill = 0.3,
                     .p_novel = 0.4, .n_dirs = 6, .zero_every = 17};
    tstream_init(&s, &d, 3, 60, 160, &g, 12);
    int blas0 = blas_default > 1 ? blas_default : 2;
    for (int ci = 0; fk_codecs[ci]; ci++) {
        const struct fk_codec_ops *ops = fk_codecs[ci];
        for (int kind = 0; kind < 2; kind++) {
            void *o = opts_small(ops, 4, 24);
            struct trun a, b;
            fk_blas_threads_set(blas0);
            trun_stream(&a, ops, o, &d, &s, kind, NULL, NULL);
            check_stream_outcome(&a, &s, o);
            if (ops->caps & FK_CAP_EXACT) {
                struct fk_stream_stats st = stats_of(&a);
                ck_assert_int_eq((int)st.appends + (int)st.replacements, 0);
            }
            fk_blas_threads_set(1); /* determinism at any BLAS thread count */
            trun_stream(&b, ops, o, &d, &s, kind, NULL, NULL);
            ck_assert_int_eq(a.n_tok, b.n_tok);
            assert_runs_equal(&a, &b, a.n_tok * s.H);
            trun_close(&a);
            trun_close(&b);
            free(o);
        }
    }
    fk_blas_threads_set(1);
    free(s.x);
    tdict_free(&d);
}
END_TEST

/* ---- 3. fadkv, tau_c = 0: replacements never touch stored rows ------------------------ */

START_TEST(fadkv_replacement_preserves_past)
{
    struct tdict d;
    tdict_init(&d, 128, 32, 16, 0, 21);
    /* prefill uses atoms 0..39 only; decode brings new directions: many free slots */
    struct tgen g = {.n_use = 40, .k_gen = 3, .noise = 0.01, .p_novel = 0.5, .n_dirs = 0,
                     .zero_every = 23};
    struct tstream s;
    tstream_init(&s, &d, 2, 50, 200, &g, 22);
    const char *inner[] = {"gm", "pl"};
    for (int k = 0; k < 2; k++) {
        const struct fk_codec_ops *ops = codec("fadkv");
        void *o = opts_small(ops, 4, 24);
        opt_enum(ops, o, "inner", inner[k]);
        opt_set(ops, o, "tau_c", 0);
        struct tcheck c = {.what = CK_PAST | CK_ATOMS | CK_REFCOUNT, .N = d.N, .delta = 0.5};
        c.snap = malloc(sizeof(float) * (size_t)s.T * s.H * s.m);
        struct trun r;
        trun_stream(&r, ops, o, &d, &s, 0, check_hook, &c);
        struct fk_stream_stats st = stats_of(&r);
        REQUIRE(st.replacements >= 10, "inner %s: only %llu replacements", inner[k],
                      (unsigned long long)st.replacements);
        ck_assert_uint_eq(st.collateral_reencodes, 0);
        ck_assert_int_gt((int)c.past_rows, 1000);
        ck_assert_int_gt((int)c.new_atoms, 0);
        trun_close(&r);
        tcheck_free(&c);
        free(o);
    }
    free(s.x);
    tdict_free(&d);
}
END_TEST

/* ---- 4. ref_count is exact after every event ------------------------------------------ */

START_TEST(ref_count_matches_recount)
{
    struct tdict d;
    tdict_init(&d, 48, 16, 4, 1, 31);
    struct tgen g = {.n_use = 32, .k_gen = 3, .noise = 0.02, .p_novel_prefill = 0.1,
                     .p_novel = 0.6, .n_dirs = 0, .zero_every = 19};
    struct tstream s;
    tstream_init(&s, &d, 3, 40, 150, &g, 32);
    struct {
        const char *codec;       /* registry name */
        int tau_c;               /* -1: codec has none */
        const char *collateral;  /* fadkv collateral policy */
        const char *victim;      /* fadkv victim choice */
    } cases[] = {
        {"lexico-adp", -1, NULL, NULL}, {"gm", -1, NULL, NULL},
        {"pl", -1, NULL, NULL},         {"fadkv", 0, "reencode", "refcount"},
        {"fadkv", 2, "reencode", "refcount"}, {"fadkv", 2, "drop", "refcount"},
        {"fadkv", 0, "reencode", "ema"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const struct fk_codec_ops *ops = codec(cases[k].codec);
        void *o = opts_small(ops, 4, 16);
        if (cases[k].tau_c >= 0) {
            opt_set(ops, o, "tau_c", cases[k].tau_c);
            opt_enum(ops, o, "collateral", cases[k].collateral);
            opt_enum(ops, o, "victim", cases[k].victim);
        }
        struct tcheck c = {.what = CK_REFCOUNT | CK_ATOMS, .N = d.N, .delta = 0.5};
        struct trun r;
        trun_stream(&r, ops, o, &d, &s, 0, check_hook, &c);
        struct fk_stream_stats st = stats_of(&r);
        ck_assert_int_eq((int)c.recounts, r.events);
        REQUIRE(st.appends + st.replacements > 0, "case %zu: no adaptation", k);
        if (cases[k].tau_c > 0 && !strcmp(cases[k].collateral, "reencode"))
            REQUIRE(st.collateral_reencodes > 0, "case %zu: no collateral re-encode", k);
        trun_close(&r);
        tcheck_free(&c);
        free(o);
    }
    free(s.x);
    tdict_free(&d);
}
END_TEST

/* ---- 5 + 7. atom-set evolution: unit appends, no duplicates, sizes -------------------- */

START_TEST(atom_set_evolution)
{
    struct tdict d;
    tdict_init(&d, 64, 32, 16, 1, 41);
    struct tgen g = {.n_use = 32, .k_gen = 3, .noise = 0.01, .p_novel_prefill = 0.5,
                     .p_novel = 0.5, .n_dirs = 0, .zero_every = 29};
    struct tstream s;
    tstream_init(&s, &d, 4, 40, 140, &g, 42);
    const char *names[] = {"lexico", "lexico-adp", "gm", "pl", "fadkv"};
    for (int k = 0; k < 5; k++) {
        const struct fk_codec_ops *ops = codec(names[k]);
        for (int kind = 0; kind < 2; kind++) {
            void *o = opts_small(ops, 4, 16);
            double delta = kind == 0 ? 0.5 : 0.7;
            struct tcheck c = {.what = CK_ATOMS, .N = d.N, .delta = delta};
            if (!strcmp(names[k], "lexico-adp"))
                c.what |= CK_NODUP;
            struct trun r;
            trun_stream(&r, ops, o, &d, &s, kind, check_hook, &c);
            struct fk_stream_stats st = stats_of(&r);
            /* fadkv's replacements are exercised with free slots in
             * fadkv_replacement_preserves_past (same CK_ATOMS checks) */
            if (ops->caps & FK_CAP_GROWS) {
                REQUIRE(c.new_atoms > 10, "%s: only %ld new atoms", names[k], c.new_atoms);
                ck_assert_int_eq(st.n_atoms, d.N + (int)st.appends);
            }
            trun_close(&r);
            free(o);
            tcheck_free(&c);
        }
    }
    free(s.x);
    tdict_free(&d);
}
END_TEST

/* ---- 6. gm with n = N equals full OMP; pl is the brute-force top-s -------------------- */

static void sorted_copy(const int32_t *idx, int n, int32_t *out)
{
    memcpy(out, idx, sizeof(int32_t) * (size_t)n);
    for (int i = 1; i < n; i++)
        for (int k = i; k > 0 && out[k - 1] > out[k]; k--) {
            int32_t t = out[k];
            out[k] = out[k - 1];
            out[k - 1] = t;
        }
}

START_TEST(gm_full_pool_and_pl_topn)
{
    struct tdict d;
    tdict_init(&d, 128, 32, 0, 1, 51);
    struct tgen g = {.n_use = 128, .k_gen = 4, .noise = 0.05, .p_novel_prefill = 0.5,
                     .zero_every = 0};
    struct tstream s;
    tstream_init(&s, &d, 2, 200, 200, &g, 52); /* prefill only */
    int S = 6, nv = s.T * s.H;
    const struct fk_codec_ops *lex = codec("lexico"), *gm = codec("gm"), *pl = codec("pl");
    void *ol = opts_small(lex, S, 0), *og = opts_small(gm, S, d.N), *op = opts_small(pl, S, 16);
    opt_enum(lex, ol, "coef", "fp32");
    opt_enum(gm, og, "coef", "fp32");
    opt_set(gm, og, "delta_k", 1);
    opt_set(gm, og, "delta_v", 1);
    struct trun rl, rg, rp;
    trun_stream(&rl, lex, ol, &d, &s, 0, NULL, NULL);
    trun_stream(&rg, gm, og, &d, &s, 0, NULL, NULL);
    trun_stream(&rp, pl, op, &d, &s, 0, NULL, NULL);
    int32_t sa[FK_SMAX], sb[FK_SMAX];
    double *a = malloc(sizeof(double) * (size_t)d.N);
    int32_t *ord = malloc(sizeof(int32_t) * (size_t)d.N);
    CHECK(a && ord);
    int near_ties = 0;
    for (int i = 0; i < nv; i++) {
        int h = i % s.H, t = i / s.H;
        int n1, n2;
        const int32_t *i1, *i2;
        const float *c1, *c2;
        REQ_OK(lex->sparse_row(rl.st, h, t, &n1, &i1, &c1));
        REQ_OK(gm->sparse_row(rg.st, h, t, &n2, &i2, &c2));
        ck_assert_int_eq(n1, S);
        REQUIRE(n1 == n2, "vector %d: lexico %d atoms, gm %d", i, n1, n2);
        sorted_copy(i1, n1, sa);
        sorted_copy(i2, n2, sb);
        REQUIRE(!memcmp(sa, sb, sizeof(int32_t) * (size_t)n1),
                      "vector %d: gm (n = N) support differs from full OMP", i);
        /* pl: brute-force top-s of |D^T x| in double, ties to the smaller index */
        const float *x = s.x + (size_t)i * s.m;
        for (int j = 0; j < d.N; j++) {
            a[j] = fabs(dot_fd(d.atoms + (size_t)j * s.m, x, s.m));
            ord[j] = j;
        }
        for (int j = 1; j < d.N; j++)
            for (int k = j; k > 0; k--) {
                int32_t p = ord[k - 1], q = ord[k];
                if (a[p] > a[q] || (a[p] == a[q] && p < q))
                    break;
                ord[k - 1] = q;
                ord[k] = p;
            }
        REQ_OK(pl->sparse_row(rp.st, h, t, &n2, &i2, &c2));
        ck_assert_int_eq(n2, S);
        sorted_copy(ord, S, sa);
        sorted_copy(i2, S, sb);
        if (memcmp(sa, sb, sizeof(int32_t) * (size_t)S)) {
            /* only a float-vs-double near tie at the boundary may differ */
            double gap = a[ord[S - 1]] - a[ord[S]];
            REQUIRE(gap < 1e-5 * sqrt(dot_fd(x, x, s.m)),
                          "vector %d: pl support differs from the top-%d of |D^T x| "
                          "(boundary gap %g)", i, S, gap);
            near_ties++;
        }
    }
    ck_assert_int_le(near_ties, 2);
    free(a);
    free(ord);
    trun_close(&rl);
    trun_close(&rg);
    trun_close(&rp);
    free(ol);
    free(og);
    free(op);
    free(s.x);
    tdict_free(&d);
}
END_TEST

/* ---- 8. memory accounting (spec 10.6) ------------------------------------------------- */

START_TEST(memory_accounting)
{
    struct tdict d;
    tdict_init(&d, 128, 32, 8, 1, 61);
    struct tgen g = {.n_use = 128, .k_gen = 3, .noise = 0.01, .p_novel_prefill = 0.2,
                     .zero_every = 0};
    struct tstream s;
    tstream_init(&s, &d, 2, 100, 100, &g, 62);
    const struct fk_codec_ops *lex = codec("lexico");
    struct {
        const char *coef;        /* coefficient storage */
        int ptr;                 /* ptr_bytes */
        int per_row;             /* expected bytes per stored vector at s = 8 */
    } cases[] = {{"fp8", 2, 26}, {"fp16", 2, 34}, {"fp32", 2, 50}, {"fp8", 4, 28}};
    int rows = s.T * s.H;
    for (int k = 0; k < 4; k++) {
        void *o = opts_small(lex, 8, 0);
        opt_enum(lex, o, "coef", cases[k].coef);
        opt_set(lex, o, "tol", 0);
        opt_set(lex, o, "ptr_bytes", cases[k].ptr);
        struct trun r;
        trun_stream(&r, lex, o, &d, &s, 0, NULL, NULL);
        for (int i = 0; i < rows; i++)
            ck_assert_int_eq(r.out[i].nnz, 8);
        struct fk_stream_stats st = stats_of(&r);
        REQUIRE(st.bytes_codes == (double)cases[k].per_row * rows,
                      "lexico coef %s ptr %d: bytes_codes %.0f, expected %d x %d", cases[k].coef,
                      cases[k].ptr, st.bytes_codes, cases[k].per_row, rows);
        CHECK(st.bytes_dict_seq == 0);
        trun_close(&r);
        free(o);
    }
    free(s.x);

    /* append codecs: 2m bytes per appended atom; fadkv: 0 (paper) or (2m + 2) per slot */
    struct tgen g2 = {.n_use = 40, .k_gen = 3, .noise = 0.01, .p_novel = 0.5, .zero_every = 0};
    tstream_init(&s, &d, 2, 40, 140, &g2, 63);
    const char *names[] = {"lexico-adp", "gm", "pl", "fadkv", "fadkv"};
    for (int k = 0; k < 5; k++) {
        const struct fk_codec_ops *ops = codec(names[k]);
        void *o = opts_small(ops, 4, 16);
        if (k == 4)
            opt_enum(ops, o, "mem_mode", "strict");
        struct trun r;
        trun_stream(&r, ops, o, &d, &s, 0, NULL, NULL);
        struct fk_stream_stats st = stats_of(&r);
        CHECK(st.appends + st.replacements > 0);
        if (ops->caps & FK_CAP_GROWS) {
            REQUIRE(st.bytes_dict_seq == (double)st.appends * s.m * 2,
                          "%s: bytes_dict_seq %.0f, appends %llu", names[k], st.bytes_dict_seq,
                          (unsigned long long)st.appends);
            CHECK(st.bytes_dict_seq == (double)(st.n_atoms - st.n_base) * s.m * 2);
        } else if (k == 3) {
            CHECK(st.bytes_dict_seq == 0);
        } else {
            int slots = 0;
            for (int j = 0; j < d.N; j++)
                slots += st.is_adapted[j] != 0;
            ck_assert_int_gt(slots, 0);
            REQUIRE(st.bytes_dict_seq == (double)slots * (2 * s.m + 2),
                          "fadkv strict: bytes_dict_seq %.0f, %d replaced slots",
                          st.bytes_dict_seq, slots);
        }
        trun_close(&r);
        free(o);
    }
    free(s.x);
    tdict_free(&d);
}
END_TEST

/* ---- 9. FP8 saturation is counted ----------------------------------------------------- */

START_TEST(fp8_saturation_counted)
{
    struct tdict d;
    tdict_init(&d, 64, 16, 0, 1, 71);
    struct tstream s = {.m = 16, .H = 1, .P = 3, .T = 3};
    s.x = calloc((size_t)3 * 16, sizeof(float));
    ck_assert_ptr_nonnull(s.x);
    for (int c = 0; c < 16; c++) {
        s.x[c] = 1000 * d.atoms[c] + d.atoms[16 + c];      /* |coef| 1000 >= 464 */
        s.x[16 + c] = 400 * d.atoms[32 + c] + d.atoms[48 + c]; /* 400: no saturation */
        s.x[32 + c] = -2000 * d.atoms[80 + c];             /* -2000: saturates */
    }
    const char *coefs[] = {"fp8", "fp16", "fp32"};
    for (int k = 0; k < 3; k++) {
        const struct fk_codec_ops *lex = codec("lexico");
        void *o = opts_small(lex, 4, 0);
        opt_enum(lex, o, "coef", coefs[k]);
        struct trun r;
        trun_stream(&r, lex, o, &d, &s, 0, NULL, NULL);
        struct fk_stream_stats st = stats_of(&r);
        REQUIRE(st.saturated == (k == 0 ? 2u : 0u), "coef %s: saturated = %llu",
                      coefs[k], (unsigned long long)st.saturated);
        if (k == 0) {
            /* stored +-448 instead of 1000 and 2000: the reported error shows it */
            REQUIRE(fabs(r.out[0].err - (1000 - 448) / 1000.0) < 0.01, "err %g",
                          r.out[0].err);
            CHECK(fabs(r.out[2].err - (2000 - 448) / 2000.0) < 0.01);
            CHECK(r.out[1].err < 0.1);
        } else {
            CHECK(r.out[0].err < 1e-3 && r.out[2].err < 1e-3);
        }
        trun_close(&r);
        free(o);
    }
    free(s.x);

    /* an appended atom of a huge vector carries a saturated coefficient too */
    struct tstream s2 = {.m = 16, .H = 1, .P = 0, .T = 1};
    s2.x = malloc(sizeof(float) * 16);
    ck_assert_ptr_nonnull(s2.x);
    gsl_rng *rng = rng_new(72);
    random_dir(rng, 16, 5000, s2.x);
    gsl_rng_free(rng);
    const struct fk_codec_ops *gm = codec("gm");
    void *o = opts_small(gm, 4, 16);
    opt_set(gm, o, "delta_k", 0);
    struct trun r;
    trun_stream(&r, gm, o, &d, &s2, 0, NULL, NULL);
    struct fk_stream_stats st = stats_of(&r);
    ck_assert_uint_eq(st.appends, 1);
    ck_assert_uint_eq(st.saturated, 1);
    CHECK(fabs(r.out[0].err - (5000 - 448) / 5000.0) < 0.01);
    trun_close(&r);
    free(o);
    free(s2.x);
    tdict_free(&d);
}
END_TEST

/* ---- 10. OMP Gram mode and naive mode agree, also with appended atoms ----------------- */

static void assert_same_codes(const struct trun *a, const struct trun *b, int n_vec)
{
    for (int i = 0; i < n_vec; i++) {
        int h = i % a->H, t = i / a->H;
        int n1, n2;
        const int32_t *i1, *i2;
        const float *c1, *c2;
        REQ_OK(a->ops->sparse_row(a->st, h, t, &n1, &i1, &c1));
        REQ_OK(b->ops->sparse_row(b->st, h, t, &n2, &i2, &c2));
        REQUIRE(n1 == n2 && !memcmp(i1, i2, sizeof(int32_t) * (size_t)n1),
                      "%s: row %d (head %d, token %d): gram and naive supports differ",
                      a->ops->name, i, h, t);
        for (int k = 0; k < n1; k++)
            REQUIRE(fabsf(c1[k] - c2[k]) <= 1e-4f * (1 + fabsf(c1[k])),
                          "%s: row %d coef %d: gram %g, naive %g", a->ops->name, i, k, c1[k],
                          c2[k]);
        ck_assert_int_eq(a->out[i].flags, b->out[i].flags);
    }
}

START_TEST(omp_gram_equals_naive)
{
    struct tdict d;
    tdict_init(&d, 128, 32, 16, 1, 81);
    struct tgen g = {.n_use = 128, .k_gen = 4, .noise = 0.02, .p_novel_prefill = 0.3,
                     .p_novel = 0.5, .n_dirs = 0, .zero_every = 31};
    struct tstream s;
    tstream_init(&s, &d, 3, 60, 200, &g, 82);
    const char *names[] = {"lexico", "lexico-adp"};
    for (int k = 0; k < 2; k++) {
        const struct fk_codec_ops *ops = codec(names[k]);
        void *og = opts_small(ops, 5, 0), *on = opts_small(ops, 5, 0);
        opt_enum(ops, og, "coef", "fp32");
        opt_enum(ops, on, "coef", "fp32");
        opt_enum(ops, og, "omp_mode", "gram");
        opt_enum(ops, on, "omp_mode", "naive");
        struct trun rg, rn;
        trun_stream(&rg, ops, og, &d, &s, 0, NULL, NULL);
        trun_stream(&rn, ops, on, &d, &s, 0, NULL, NULL);
        struct fk_stream_stats sg = stats_of(&rg), sn = stats_of(&rn);
        ck_assert_int_eq(sg.n_atoms, sn.n_atoms);
        ck_assert_uint_eq(sg.appends, sn.appends);
        if (k == 1) {
            /* later codes must use appended atoms, through their incremental Gram rows */
            REQUIRE(sg.appends >= 10, "only %llu appends",
                          (unsigned long long)sg.appends);
            REQUIRE(sg.uses_adapted > sg.appends, "appended atoms never reused");
        }
        assert_same_codes(&rg, &rn, s.T * s.H);
        trun_close(&rg);
        trun_close(&rn);
        free(og);
        free(on);
    }
    free(s.x);
    tdict_free(&d);
}
END_TEST

/* Growing codecs reserve their per-atom arrays as atoms are appended (the appended part of
 * the capacity doubles from 64). Hundreds of appends cross several reallocations: stored
 * rows, atoms and reference counts must come through each one intact, Gram mode must still
 * give naive mode's codes, and growth_cap must stop the growth inside a step. */
START_TEST(growth_across_reallocations)
{
    struct tdict d;
    tdict_init(&d, 96, 32, 8, 1, 91);
    struct tgen g = {.n_use = 96, .k_gen = 3, .noise = 0.01, .p_novel_prefill = 0.2,
                     .p_novel = 0.9, .n_dirs = 0, .zero_every = 0};
    struct tstream s;
    tstream_init(&s, &d, 8, 12, 200, &g, 92);
    const char *names[] = {"lexico-adp", "gm", "pl"};
    for (int k = 0; k < 3; k++) {
        const struct fk_codec_ops *ops = codec(names[k]);
        for (int capped = 0; capped < 2; capped++) {
            void *o = opts_small(ops, 4, 16);
            opt_enum(ops, o, "coef", "fp32");
            opt_set(ops, o, "delta_k", 0.1);
            if (capped)
                opt_set(ops, o, "growth_cap", 100);
            struct tcheck c = {.what = CK_PAST | CK_ATOMS | CK_REFCOUNT, .N = d.N,
                               .delta = 0.5};
            c.snap = malloc(sizeof(float) * (size_t)s.T * s.H * s.m);
            struct trun r;
            trun_stream(&r, ops, o, &d, &s, 0, check_hook, &c);
            struct fk_stream_stats st = stats_of(&r);
            ck_assert_int_eq(st.n_atoms, d.N + (int)st.appends);
            if (capped) {
                REQUIRE(st.appends == 100 && st.growth_capped > 0,
                        "%s: growth_cap 100: %llu appends, %llu capped", names[k],
                        (unsigned long long)st.appends, (unsigned long long)st.growth_capped);
            } else {
                REQUIRE(st.appends > 64 + 128 + 256, "%s: only %llu appends", names[k],
                        (unsigned long long)st.appends);
            }
            if (k == 0) { /* the same stream in naive mode: no Gram rows at all */
                void *on = opts_small(ops, 4, 16);
                opt_enum(ops, on, "coef", "fp32");
                opt_enum(ops, on, "omp_mode", "naive");
                opt_set(ops, on, "delta_k", 0.1);
                if (capped)
                    opt_set(ops, on, "growth_cap", 100);
                struct trun rn;
                trun_stream(&rn, ops, on, &d, &s, 0, NULL, NULL);
                assert_same_codes(&r, &rn, s.T * s.H);
                trun_close(&rn);
                free(on);
            }
            trun_close(&r);
            free(o);
            tcheck_free(&c);
        }
    }
    free(s.x);
    tdict_free(&d);
}
END_TEST

/* ---- 11. analytical cost model (spec 10.7) -------------------------------------------- */

static double c_omp(int m, int N, int s)
{
    double c = 0;
    for (int k = 1; k <= s; k++)
        c += (double)m * N + N + 2.0 * k * m + (double)k * k;
    return c;
}

static double c_gm(int m, int N, int n, int s)
{
    double c = (double)m * N + N + (double)s * s * s / 6 + 2.0 * s * s;
    for (int k = 1; k <= s; k++)
        c += (double)m * n + n + 2.0 * k * m + (double)k * k;
    return c;
}

static double c_pl(int m, int N, int s)
{
    return (double)m * N + N + m * s * (s + 1) / 2.0 + (double)s * s * s / 6 + 2.0 * s * s +
           (double)m * s;
}

/* MACs of one stream of random vectors (prefill only: no growth). */
static double macs_of(const char *name, const struct tdict *d, const struct tstream *s, int S,
                      int n)
{
    const struct fk_codec_ops *ops = codec(name);
    void *o = opts_small(ops, S, n);
    if (fk_codec_option(ops, "omp_mode"))
        opt_enum(ops, o, "omp_mode", d->gram ? "gram" : "naive");
    struct trun r;
    trun_stream(&r, ops, o, d, s, 0, NULL, NULL);
    for (int i = 0; i < s->T * s->H; i++)
        REQUIRE(r.out[i].nnz == S, "%s: vector %d has %d atoms", name, i, r.out[i].nnz);
    struct fk_stream_stats st = stats_of(&r);
    ck_assert_int_eq(st.n_atoms, d->N);
    trun_close(&r);
    free(o);
    return st.macs;
}

START_TEST(cost_model)
{
    struct tdict d;
    tdict_init(&d, 96, 24, 0, 1, 91);
    struct tgen g = {.p_novel_prefill = 1.0};
    struct tstream s;
    tstream_init(&s, &d, 2, 50, 50, &g, 92);
    int nv = s.T * s.H, S = 4, n = 20;
    double want = nv * c_omp(d.m, d.N, S);
    double got = macs_of("lexico-adp", &d, &s, S, 0);
    REQUIRE(got == want, "lexico-adp: macs %.1f, expected %.1f", got, want);
    CHECK(macs_of("lexico", &d, &s, S, 0) == want);
    got = macs_of("gm", &d, &s, S, n);
    want = nv * c_gm(d.m, d.N, n, S);
    REQUIRE(fabs(got - want) <= 1e-9 * want, "gm: macs %.3f, expected %.3f", got, want);
    got = macs_of("pl", &d, &s, S, n);
    want = nv * c_pl(d.m, d.N, S);
    REQUIRE(fabs(got - want) <= 1e-9 * want, "pl: macs %.3f, expected %.3f", got, want);
    free(s.x);
    tdict_free(&d);

    /* Table 4 shape: m = 128, N = 4096, s = 8, n = 256, one random vector each */
    tdict_init(&d, 4096, 128, 0, 0, 93);
    tstream_init(&s, &d, 1, 1, 1, &g, 94);
    double adp = macs_of("lexico-adp", &d, &s, 8, 0);
    double gmm = macs_of("gm", &d, &s, 8, 256);
    double plm = macs_of("pl", &d, &s, 8, 256);
    REQUIRE(fabs(adp - 4236492) < 0.5, "lexico-adp %.1f", adp);
    REQUIRE(fabs(gmm - 802209.333) < 0.5, "gm %.3f", gmm);
    REQUIRE(fabs(plm - 534229.333) < 0.5, "pl %.3f", plm);
    REQUIRE(fabs(gmm / adp - 0.189) <= 0.001, "gm/lexico-adp = %.4f", gmm / adp);
    REQUIRE(fabs(plm / adp - 0.126) <= 0.001, "pl/lexico-adp = %.4f", plm / adp);
    free(s.x);
    tdict_free(&d);
}
END_TEST

/* ---- fp32 coefficients: the stored error is the encoder's error ---------------------- */

/* With fp32 storage nothing is quantised, so err (stored row, atoms after the event) must
 * equal err_enc (encoder, atoms it coded against) for every vector. A difference means a
 * committed code refers to an atom that changed after the code was computed. */
START_TEST(stored_error_is_encoder_error)
{
    struct tdict d;
    tdict_init(&d, 48, 16, 4, 1, 111);
    struct tgen g = {.n_use = 32, .k_gen = 3, .noise = 0.02, .p_novel_prefill = 0.1,
                     .p_novel = 0.6, .n_dirs = 0, .zero_every = 19};
    struct tstream s;
    tstream_init(&s, &d, 4, 40, 200, &g, 112);
    const char *names[] = {"lexico", "lexico-adp", "gm", "pl", "fadkv", "fadkv"};
    for (int k = 0; k < 6; k++) {
        const struct fk_codec_ops *ops = codec(names[k]);
        void *o = opts_small(ops, 4, 16);
        opt_enum(ops, o, "coef", "fp32");
        if (k == 5)
            opt_enum(ops, o, "inner", "pl");
        struct trun r;
        trun_stream(&r, ops, o, &d, &s, 0, NULL, NULL);
        struct fk_stream_stats st = stats_of(&r);
        for (int i = 0; i < s.T * s.H; i++)
            REQUIRE(fabsf(r.out[i].err - r.out[i].err_enc) <= 1e-5f,
                    "%s (k %d): vector %d (head %d, token %d, flags %u): stored err %.6f, "
                    "encoder err %.6f (replacements %llu, adapt_failed %llu)",
                    names[k], k, i, i % s.H, i / s.H, r.out[i].flags, r.out[i].err,
                    r.out[i].err_enc, (unsigned long long)st.replacements,
                    (unsigned long long)st.adapt_failed);
        trun_close(&r);
        free(o);
    }
    free(s.x);
    tdict_free(&d);
}
END_TEST

/* The same invariant in a constructed fadkv event (s = 1, tau_c = 0, one free slot, atom 7):
 * head 0's vector A is orthogonal to every atom and takes slot 7 in phase C; head 1's
 * vector B = d_7 + 2 n (n orthogonal to the atoms) was coded on atom 7 in phase A, needs
 * adaptation too, and finds no free slot left. B's stored code must not be a coefficient
 * fitted to the old atom 7 applied to A's direction.
 * Regression test: fk_dcodec.c once pinned only the atoms of phase-B commits, so
 * adapt_replace overwrote an atom a pending phase-C code used; when that vector's own
 * adaptation then failed, the stale code was committed (stored err 1.067 > 1 against
 * err_enc 0.898). */
START_TEST(fadkv_pending_code_keeps_its_atoms)
{
    struct tdict d;
    tdict_init(&d, 8, 16, 8, 0, 121);
    struct tstream s = {.m = 16, .H = 2, .P = 7, .T = 8};
    s.x = calloc((size_t)s.T * s.H * s.m, sizeof(float));
    CHECK(s.x != NULL);
    for (int t = 0; t < 7; t++) /* prefill: token t of both heads is atom t */
        for (int h = 0; h < 2; h++)
            memcpy(s.x + ((size_t)t * 2 + h) * 16, d.atoms + (size_t)t * 16, sizeof(float) * 16);
    float *xa = s.x + (size_t)14 * 16, *xb = s.x + (size_t)15 * 16;
    xa[8] = 1;     /* A: held-out direction e_8 */
    xb[9] = 2;     /* B: d_7 + 2 e_9 */
    for (int c = 0; c < 16; c++)
        xb[c] += d.atoms[7 * 16 + c];
    const struct fk_codec_ops *ops = codec("fadkv");
    void *o = opts_small(ops, 1, 8);
    opt_enum(ops, o, "coef", "fp32");
    opt_set(ops, o, "tau_c", 0);
    struct trun r;
    trun_stream(&r, ops, o, &d, &s, 0, NULL, NULL);
    struct fk_stream_stats st = stats_of(&r);
    int nnz;
    const int32_t *idx;
    const float *coef;
    REQ_OK(ops->sparse_row(r.st, 1, 6, &nnz, &idx, &coef));
    REQUIRE(nnz == 1 && idx[0] == 6, "prefill row (1, 6) is not atom 6");
    REQ_OK(ops->sparse_row(r.st, 1, 7, &nnz, &idx, &coef));
    const struct fk_vec_out *ob = &r.out[15];
    REQUIRE(fabsf(ob->err - ob->err_enc) <= 1e-5f && ob->err <= 1.0f,
            "vector B: stored err %.6f but encoder err %.6f (nnz %d, atom %d, coef %.4f; "
            "replacements %llu, adapt_failed %llu): its code was fitted to an atom that was "
            "replaced in the same event", ob->err, ob->err_enc, nnz, nnz ? idx[0] : -1,
            nnz ? coef[0] : 0.0f, (unsigned long long)st.replacements,
            (unsigned long long)st.adapt_failed);
    trun_close(&r);
    free(o);
    free(s.x);
    tdict_free(&d);
}
END_TEST

/* ---- eviction events of several tokens per head --------------------------------------- */

/* With a_len > 1 (Lexico's config uses 32), or with adapt_prefill = true (the prefill event
 * holds P tokens per head), an event holds several tokens of one head. A vector that needs
 * adaptation is committed in phase C, after later tokens of its head that need none
 * (phase B); the codec must accept that and store every row at its own token.
 * Regression test: dc_encode once checked `t != d->heads[h].n` in phase B against the rows
 * committed so far and refused the later token as "out of order" (FK_EINVAL); commit() also
 * took the deferred earlier token for a rewrite. */
static void run_multi(int a_len, int adapt_prefill)
{
    struct tdict d;
    tdict_init(&d, 128, 16, 4, 1, 101); /* n_use < N: free slots for fadkv */
    struct tgen g = {.n_use = 32, .k_gen = 2, .noise = 0.01, .p_novel_prefill = 0.3,
                     .p_novel = 0.4, .n_dirs = 0, .zero_every = 13};
    struct tstream s;
    tstream_init(&s, &d, 2, 30, 130, &g, 102);
    const char *names[] = {"lexico", "lexico-adp", "gm", "pl", "fadkv"};
    for (int k = adapt_prefill ? 1 : 0; k < 5; k++) {
        const struct fk_codec_ops *ops = codec(names[k]);
        void *o = opts_small(ops, 4, 16);
        opt_set(ops, o, "a_len", a_len);
        if (adapt_prefill)
            opt_set(ops, o, "adapt_prefill", 1);
        struct tcheck c = {.what = CK_REFCOUNT, .N = d.N, .delta = 0.5};
        struct trun r;
        trun_stream(&r, ops, o, &d, &s, 0, check_hook, &c);
        check_stream_outcome(&r, &s, o);
        trun_close(&r);
        tcheck_free(&c);
        free(o);
    }
    free(s.x);
    tdict_free(&d);
}

START_TEST(multi_token_events)
{
    run_multi(4, 0);
}
END_TEST

/* The prefill event adapts too (P tokens per head in one event). */
START_TEST(adapt_prefill_events)
{
    run_multi(1, 1);
}
END_TEST

/* ---- 12. conformance by declaration: every class, every registered codec ---------------
 *
 * The checks a codec gets follow from what it declares (ops->caps, its options, what its
 * callbacks return), never from its name, so a new codec is covered by adding it to
 * codec_list. Classes: exact (FK_CAP_EXACT: bit-exact rows, err 0, billed as the fp16
 * reference), lossy dense (every coordinate stored; FK_CAP_GRID: a per-row uniform grid of
 * 2^bits levels), sparse over a dictionary (SPARSE | DICT: the dictionary checks above) and
 * sparse over the codec's own atoms (SPARSE without DICT: when those atoms are orthonormal,
 * the best nnz-term code is known exactly). Every codec so far stores every row it is
 * given; a codec that drops tokens will declare that, and the row checks will then skip
 * the rows it reports dropped. */

static int coef_bytes(const void *opts)
{
    int coef = ((const struct fk_common_opts *)opts)->coef;
    return coef == FK_COEF_FP8 ? 1 : coef == FK_COEF_FP16 ? 2 : 4;
}

/* Stored coefficients over every stored row (sparse codecs), recounted by sparse_row. */
static double stored_nnz(const struct trun *r)
{
    double nz = 0;
    for (int i = 0; i < r->n_tok * r->H; i++) {
        int nnz = -1;
        const int32_t *idx = NULL;
        const float *coef = NULL;
        REQ_OK(r->ops->sparse_row(r->st, i % r->H, i / r->H, &nnz, &idx, &coef));
        nz += nnz;
    }
    return nz;
}

/* bytes_codes, stored rows and stored coefficients after every event. */
struct tbytes {
    int n;                       /* snapshots */
    double bytes[512], rows[512], nnz[512];
};

static void bytes_hook(void *ctx, struct trun *r, const struct fk_event *ev, int after)
{
    struct tbytes *b = ctx;
    struct fk_stream_stats st = stats_of(r);
    if (!after) {
        if (r->events == 0)
            REQUIRE(st.bytes_codes == 0 && st.bytes_dict_seq == 0, "%s: %.0f + %.0f bytes "
                    "accounted before any row was stored", r->ops->name, st.bytes_codes,
                    st.bytes_dict_seq);
        return;
    }
    REQUIRE(isfinite(st.bytes_codes) && st.bytes_codes > 0 && isfinite(st.bytes_dict_seq) &&
                st.bytes_dict_seq >= 0,
            "%s: after event %d: bytes_codes %g, bytes_dict_seq %g", r->ops->name, r->events,
            st.bytes_codes, st.bytes_dict_seq);
    if (b->n > 0 && !(r->ops->caps & FK_CAP_ADAPTS))
        REQUIRE(st.bytes_codes >= b->bytes[b->n - 1], "%s: event %d lowered bytes_codes from "
                "%.0f to %.0f, but no stored row can change", r->ops->name, r->events,
                b->bytes[b->n - 1], st.bytes_codes);
    CHECK(b->n < 512);
    b->bytes[b->n] = st.bytes_codes;
    b->rows[b->n] = (double)r->n_tok * r->H;
    b->nnz[b->n] = (r->ops->caps & FK_CAP_SPARSE) ? stored_nnz(r) : 0;
    b->n++;
    (void)ev;
}

/* The accounting model: a dense row costs a fixed number of bytes; a sparse row a fixed
 * overhead plus a fixed cost per stored coefficient, at least its value bytes (`coef`)
 * plus one index byte. The constants are solved from two snapshots and must hold at all. */
static void check_bytes_model(const struct trun *r, const struct tbytes *b, const void *opts)
{
    const struct fk_codec_ops *ops = r->ops;
    int m = r->m;
    CHECK(b->n >= 2);
    if (!(ops->caps & FK_CAP_SPARSE)) {
        double beta = b->bytes[0] / b->rows[0];
        for (int k = 1; k < b->n; k++)
            REQUIRE(fabs(b->bytes[k] - beta * b->rows[k]) <= 1e-9 * b->bytes[k],
                    "%s: a dense row costs %g bytes after the prefill but %g after event %d",
                    ops->name, beta, b->bytes[k] / b->rows[k], k + 1);
        REQUIRE(beta <= 2.0 * m, "%s: a dense row costs %g bytes, more than the fp16 "
                "reference's %d", ops->name, beta, 2 * m);
        const struct fk_option *bo = fk_codec_option(ops, "bits");
        if ((ops->caps & FK_CAP_GRID) && bo) {
            int bits = (int)fk_opts_get(opts, bo);
            REQUIRE(beta >= (m * bits + 7) / 8, "%s: a row of %d %d-bit codes costs %g bytes",
                    ops->name, m, bits, beta);
        }
        return;
    }
    int b_val = coef_bytes(opts), best = 0;
    double det = 0;
    for (int k = 0; k < b->n; k++) {
        REQUIRE(b->bytes[k] >= (b_val + 1) * b->nnz[k], "%s: after event %d, %.0f stored "
                "coefficients cost only %.0f bytes (%d value bytes + an index each)",
                ops->name, k + 1, b->nnz[k], b->bytes[k], b_val);
        double dk = b->nnz[0] * b->rows[k] - b->nnz[k] * b->rows[0];
        if (fabs(dk) > fabs(det)) {
            det = dk;
            best = k;
        }
    }
    if (det == 0) { /* same coefficients per row throughout: bytes per row constant */
        for (int k = 1; k < b->n; k++)
            REQUIRE(fabs(b->bytes[k] * b->rows[0] - b->bytes[0] * b->rows[k]) <=
                        1e-9 * b->bytes[k] * b->rows[0],
                    "%s: bytes per row change at event %d", ops->name, k + 1);
        return;
    }
    /* bytes = alpha nnz + gamma rows */
    double alpha = (b->bytes[0] * b->rows[best] - b->bytes[best] * b->rows[0]) / det;
    double gamma = (b->nnz[0] * b->bytes[best] - b->nnz[best] * b->bytes[0]) / det;
    REQUIRE(alpha >= b_val + 1 - 1e-9 && gamma >= -1e-9, "%s: %.4g bytes per coefficient and "
            "%.4g per row: a coefficient stored as %d bytes needs an index too", ops->name,
            alpha, gamma, b_val);
    for (int k = 0; k < b->n; k++)
        REQUIRE(fabs(b->bytes[k] - alpha * b->nnz[k] - gamma * b->rows[k]) <=
                    1e-6 * b->bytes[k],
                "%s: after event %d, %.0f bytes for %.0f rows and %.0f coefficients; %.4g per "
                "coefficient and %.4g per row elsewhere", ops->name, k + 1, b->bytes[k],
                b->rows[k], b->nnz[k], alpha, gamma);
}

/* Orthonormal atoms (n_atoms <= m, A A^T = I): 1, else 0. */
static int atoms_orthonormal(const float *A, int n, int m)
{
    if (n > m)
        return 0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j <= i; j++)
            if (fabs(dot_fd(A + (size_t)i * m, A + (size_t)j * m, m) - (i == j)) > 1e-6)
                return 0;
    return 1;
}

static int cmp_desc(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x < y) - (x > y);
}

/* A sparse code over orthonormal atoms: the error of the stored support with exact
 * coefficients is err_enc, and no other nnz atoms do better (the best nnz-term code keeps
 * the nnz largest |<x, a_j>|). Returns 1 when the atoms are orthonormal. */
static int check_best_terms(const struct trun *r, const struct tstream *s)
{
    const struct fk_codec_ops *ops = r->ops;
    int m = r->m, na = 0;
    const float *A = ops->atoms(r->st, &na);
    if (!atoms_orthonormal(A, na, m))
        return 0;
    double *c2 = malloc(sizeof(double) * (size_t)(na + 1));
    double *sorted = malloc(sizeof(double) * (size_t)(na + 1));
    CHECK(c2 && sorted);
    for (int i = 0; i < s->T * s->H; i++) {
        const float *x = s->x + (size_t)i * m;
        double xx = dot_fd(x, x, m), kept = 0;
        if (xx == 0)
            continue;
        for (int j = 0; j < na; j++) {
            double c = dot_fd(A + (size_t)j * m, x, m);
            c2[j] = sorted[j] = c * c;
        }
        int nnz = 0;
        const int32_t *idx = NULL;
        const float *coef = NULL;
        REQ_OK(ops->sparse_row(r->st, i % s->H, i / s->H, &nnz, &idx, &coef));
        for (int k = 0; k < nnz; k++)
            kept += c2[idx[k]];
        qsort(sorted, (size_t)na, sizeof(double), cmp_desc);
        double best = 0;
        for (int k = 0; k < nnz && k < na; k++)
            best += sorted[k];
        /* orthonormal atoms: the error of a support with exact coefficients is xx minus
         * its energy (the part outside the atoms' span included) */
        double e_sup = sqrt(xx - kept > 0 ? (xx - kept) / xx : 0);
        double e_best = sqrt(xx - best > 0 ? (xx - best) / xx : 0);
        REQUIRE(e_sup <= e_best + 1e-6, "%s: row %d (head %d, token %d) keeps %d atoms that "
                "leave a relative error of %.6f; the best %d of its orthonormal atoms leave "
                "%.6f", ops->name, i, i % s->H, i / s->H, nnz, e_sup, nnz, e_best);
        REQUIRE(fabs(r->out[i].err_enc - e_sup) <= 1e-5, "%s: row %d reports err_enc %.6f, but "
                "its support with exact coefficients leaves %.6f", ops->name, i,
                r->out[i].err_enc, e_sup);
    }
    free(c2);
    free(sorted);
    return 1;
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* FK_CAP_GRID: each row takes at most 2^bits values, lies within half a grid step of the
 * vector (plus fp16 rounding of the grid's origin and step), and a constant row of an fp16
 * value comes back exactly. */
static void check_grid(const struct trun *r, const struct tstream *s, int bits)
{
    const struct fk_codec_ops *ops = r->ops;
    int m = r->m, levels = 1 << bits;
    float *xh = malloc(sizeof(float) * (size_t)m), *v = malloc(sizeof(float) * (size_t)m);
    CHECK(xh && v);
    int constants = 0;
    for (int i = 0; i < r->n_tok * s->H; i++) {
        const float *x = s->x + (size_t)i * m;
        REQ_OK(ops->reconstruct(r->st, i % s->H, i / s->H, xh));
        float lo = x[0], hi = x[0];
        for (int c = 0; c < m; c++) {
            lo = x[c] < lo ? x[c] : lo;
            hi = x[c] > hi ? x[c] : hi;
        }
        if (lo == hi && fk_fp16_decode(fk_fp16_encode(lo)) == lo) {
            constants++;
            for (int c = 0; c < m; c++)
                REQUIRE(xh[c] == x[c], "%s (bits %d): constant row %d (head %d, token %d) of "
                        "%g comes back as %g at coordinate %d", ops->name, bits, i, i % s->H,
                        i / s->H, x[c], xh[c], c);
            continue;
        }
        double step = ((double)hi - lo) / (levels - 1);
        double tol = step / 2 + ldexp(fabs(lo) + ((double)hi - lo), -9);
        for (int c = 0; c < m; c++)
            REQUIRE(fabs((double)x[c] - xh[c]) <= tol, "%s (bits %d): row %d coordinate %d: "
                    "|x - x_hat| = |%g - %g| is more than half a step (%g) of the row's grid",
                    ops->name, bits, i, c, x[c], xh[c], step / 2);
        memcpy(v, xh, sizeof(float) * (size_t)m);
        qsort(v, (size_t)m, sizeof(float), cmp_float);
        int distinct = 1;
        for (int c = 1; c < m; c++)
            distinct += v[c] != v[c - 1];
        REQUIRE(distinct <= levels, "%s (bits %d): row %d takes %d distinct values", ops->name,
                bits, i, distinct);
    }
    ck_assert_int_gt(constants, 0);
    free(xh);
    free(v);
}

static const char *const coef_choices[] = {"fp8", "fp16", "fp32"};

/* One codec, one kind, one option point: the checks of every class it declares. */
static int run_by_class(const struct fk_codec_ops *ops, void *o, const struct tdict *d,
                        const struct tstream *s, int kind)
{
    struct tbytes *b = calloc(1, sizeof *b);
    ck_assert_ptr_nonnull(b);
    struct trun r;
    trun_stream(&r, ops, o, d, s, kind, bytes_hook, b);
    check_stream_outcome(&r, s, o);
    check_bytes_model(&r, b, o);
    int orthonormal = 0;
    if (ops->caps & FK_CAP_SPARSE) {
        orthonormal = check_best_terms(&r, s);
        if (((const struct fk_common_opts *)o)->coef == FK_COEF_FP32)
            for (int i = 0; i < s->T * s->H; i++)
                REQUIRE(fabsf(r.out[i].err - r.out[i].err_enc) <= 1e-5f, "%s: coefficients "
                        "stored as fp32, yet vector %d reports err %.6f and err_enc %.6f",
                        ops->name, i, r.out[i].err, r.out[i].err_enc);
    }
    const struct fk_option *bo = fk_codec_option(ops, "bits");
    if ((ops->caps & FK_CAP_GRID) && bo)
        check_grid(&r, s, (int)fk_opts_get(o, bo));
    trun_close(&r);
    free(b);
    return orthonormal;
}

START_TEST(every_codec_by_class)
{
    struct tdict d;
    tdict_init(&d, 96, 24, 6, 1, 11);
    struct tstream s;
    /* n_use < N: free atoms, so that fadkv can replace */
    struct tgen g = {.n_use = 64, .k_gen = 3, .noise = 0.01, .p_novel_prefill = 0.3,
                     .p_novel = 0.4, .n_dirs = 6, .zero_every = 17, .const_every = 13};
    tstream_init(&s, &d, 3, 60, 160, &g, 12);
    for (int ci = 0; fk_codecs[ci]; ci++) {
        const struct fk_codec_ops *ops = fk_codecs[ci];
        int n_coef = fk_codec_option(ops, "coef") ? 3 : 1; /* each storage it offers */
        for (int kind = 0; kind < 2; kind++)
            for (int k = 0; k < n_coef; k++) {
                void *o = opts_small(ops, 4, 24);
                if (n_coef > 1)
                    opt_enum(ops, o, "coef", coef_choices[k]);
                run_by_class(ops, o, &d, &s, kind);
                free(o);
            }
        /* a grid quantiser at every width it offers */
        const struct fk_option *bo = fk_codec_option(ops, "bits");
        if (ops->caps & FK_CAP_GRID)
            for (int bits = (int)bo->min; bits <= (int)bo->max; bits++) {
                void *o = opts_small(ops, 4, 24);
                opt_set(ops, o, "bits", bits);
                run_by_class(ops, o, &d, &s, 0);
                free(o);
            }
    }
    free(s.x);
    tdict_free(&d);
}
END_TEST

/* A whole word of msg is the name of one of the codec's options. */
static int names_an_option(const struct fk_codec_ops *ops, const char *msg)
{
    for (const struct fk_option *o = ops->options; o->name; o++) {
        size_t n = strlen(o->name);
        for (const char *p = strstr(msg, o->name); p; p = strstr(p + 1, o->name)) {
            char before = p == msg ? ' ' : p[-1], after = p[n];
            if (!is_name((char[]){before, 0}) && !is_name((char[]){after, 0}))
                return 1;
        }
    }
    return 0;
}

/* Every option at both ends of its range, the others at their defaults: check() either
 * rejects the point with a message naming an option, or the codec opens and encodes at
 * it. A codec without check() must run at every point of its table. */
START_TEST(check_accepts_only_what_runs)
{
    struct tdict d;
    tdict_init(&d, 512, 24, 6, 1, 131);
    struct tgen g = {.n_use = 512, .k_gen = 3, .noise = 0.01, .p_novel_prefill = 0.3,
                     .p_novel = 0.5, .zero_every = 7};
    struct tstream s;
    tstream_init(&s, &d, 2, 8, 24, &g, 132);
    float *xh = malloc(sizeof(float) * (size_t)d.m);
    CHECK(xh != NULL);
    int rejected = 0;
    for (int ci = 0; fk_codecs[ci]; ci++) {
        const struct fk_codec_ops *ops = fk_codecs[ci];
        int n_atoms = (ops->caps & FK_CAP_DICT)    ? d.N
                      : (ops->caps & FK_CAP_BASIS) ? tbasis(s.H, d.m, s.T)->b.n_comp
                                                   : 0;
        for (const struct fk_option *opt = ops->options; opt->name; opt++)
            for (int end = 0; end < 2; end++) {
                void *o = opts_new(ops);
                double v = end ? opt->max : opt->min;
                REQ_OK(fk_opts_set(ops, o, opt, v));
                fk_err_clear();
                int rc = ops->check ? ops->check(o, d.m, n_atoms) : FK_OK;
                if (rc != FK_OK) {
                    REQUIRE(names_an_option(ops, fk_errmsg()), "%s: check() rejects %s = %g "
                            "with '%s', which names none of its options", ops->name,
                            opt->name, v, fk_errmsg());
                    rejected++;
                    free(o);
                    continue;
                }
                const struct fk_base_dict *base = NULL;
                if (ops->caps & FK_CAP_DICT)
                    base = (ops->caps & FK_CAP_GRAM) ? &d.with : &d.without;
                struct fk_stream_env env = {.head_dim = d.m, .n_heads = s.H,
                                            .n_tokens = s.T, .base = base};
                g_ext_stream = &s;
                tenv(ops, &env);
                struct trun r = {.ops = ops, .H = s.H, .m = d.m};
                REQUIRE(ops->open(o, &env, &r.st) == FK_OK, "%s: check() accepts %s = %g, "
                        "but open() fails: %s", ops->name, opt->name, v, fk_errmsg());
                r.out = calloc((size_t)s.T * s.H, sizeof *r.out);
                CHECK(r.out != NULL);
                REQUIRE(trun_event(&r, &s, 0, s.T, 0, -1, NULL, NULL) == FK_OK, "%s: check() "
                        "accepts %s = %g, but encode() fails: %s", ops->name, opt->name, v,
                        fk_errmsg());
                for (int i = 0; i < s.T * s.H; i++) {
                    double e = row_err(&r, s.x + (size_t)i * d.m, i % s.H, i / s.H, xh);
                    REQUIRE(isfinite(e) && isfinite(r.out[i].err) &&
                                isfinite(r.out[i].err_enc),
                            "%s: %s = %g: vector %d has err %g (reported %g, err_enc %g)",
                            ops->name, opt->name, v, i, e, r.out[i].err, r.out[i].err_enc);
                }
                trun_close(&r);
                free(o);
            }
    }
    ck_assert_int_gt(rejected, 0); /* some point was rejected: the message check ran */
    free(xh);
    free(s.x);
    tdict_free(&d);
}
END_TEST

/* Caps the address space at its current size plus extra bytes (old: the limit to restore).
 * Returns 0 when it cannot. */
static int as_limit(size_t extra, struct rlimit *old)
{
    unsigned long pages = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f)
        return 0;
    int ok = fscanf(f, "%lu", &pages) == 1;
    fclose(f);
    if (!ok || getrlimit(RLIMIT_AS, old) != 0)
        return 0;
    struct rlimit lim = *old;
    lim.rlim_cur = (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + extra;
    if (old->rlim_max != RLIM_INFINITY && lim.rlim_cur > old->rlim_max)
        return 0;
    return setrlimit(RLIMIT_AS, &lim) == 0;
}

/* close() accepts NULL, a state that stored nothing, a state whose encode() failed, and
 * whatever open() leaves when it fails (the engine closes any non-NULL state). open()
 * fails here for want of memory: 4M tokens of head_dim 128 with the address space capped
 * at 32 MiB more than in use. ASan and LSan see the error paths. */
START_TEST(close_half_opened)
{
    struct tdict d, d128;
    tdict_init(&d, 48, 24, 0, 1, 141);
    tdict_init(&d128, 48, 128, 0, 1, 142);
    struct tgen g = {.n_use = 48, .k_gen = 3, .noise = 0.01};
    struct tstream s;
    tstream_init(&s, &d, 2, 4, 4, &g, 143);
    g_ext_stream = &s;
    for (int ci = 0; fk_codecs[ci]; ci++) {
        const struct fk_codec_ops *ops = fk_codecs[ci];
        ops->close(NULL);
        void *o = opts_small(ops, 4, 24);
        int dict = (ops->caps & FK_CAP_DICT) != 0, gram = (ops->caps & FK_CAP_GRAM) != 0;
        struct trun r;
        trun_open(&r, ops, o, &d, s.H, s.T, 0);
        trun_close(&r); /* nothing stored */
        trun_open(&r, ops, o, &d, s.H, s.T, 0);
        fk_err_clear();
        REQUIRE(trun_event(&r, &s, 1, 2, 1, 0, NULL, NULL) < 0 && fk_errmsg()[0],
                "%s: encode() accepted token 1 before token 0", ops->name);
        trun_close(&r);
        if (dict) { /* a dictionary of another head_dim: refused, the half-open state freed */
            struct fk_stream_env other = {.head_dim = 24, .n_heads = 2, .n_tokens = 4,
                                          .base = gram ? &d128.with : &d128.without};
            void *so = NULL;
            fk_err_clear();
            int rc = ops->open(o, &other, &so);
            REQUIRE(rc < 0 && strstr(fk_errmsg(), "head_dim"),
                    "%s: open() with a head_dim 128 dictionary for head_dim 24 gave %d (%s)",
                    ops->name, rc, fk_errmsg());
            ops->close(so);
        }
        struct fk_stream_env big = {.head_dim = 128, .n_heads = 4, .n_tokens = 1 << 22,
                                    .base = dict ? (gram ? &d128.with : &d128.without) : NULL};
        tenv(ops, &big); /* before the address space is capped */
        void *st = NULL;
        struct rlimit old;
        fk_err_clear();
        if (as_limit((size_t)32 << 20, &old)) { /* else the gigabytes would be real */
            int rc = ops->open(o, &big, &st);
            char msg[256];
            snprintf(msg, sizeof msg, "%s", fk_errmsg());
            CHECK(setrlimit(RLIMIT_AS, &old) == 0); /* before any failed assertion leaves */
            REQUIRE(rc == FK_OK || msg[0], "%s: open() failed (%d) without a message",
                    ops->name, rc);
            ops->close(st);
        }
        free(o);
    }
    free(s.x);
    tdict_free(&d);
    tdict_free(&d128);
}
END_TEST

static Suite *codecs_suite(void)
{
    Suite *s = suite_create("codecs");
    TCase *tc = tcase_create("conformance");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, options_lint);
    tcase_add_test(tc, every_codec_conforms);
    tcase_add_test(tc, fadkv_replacement_preserves_past);
    tcase_add_test(tc, ref_count_matches_recount);
    tcase_add_test(tc, atom_set_evolution);
    tcase_add_test(tc, gm_full_pool_and_pl_topn);
    tcase_add_test(tc, memory_accounting);
    tcase_add_test(tc, fp8_saturation_counted);
    tcase_add_test(tc, omp_gram_equals_naive);
    tcase_add_test(tc, growth_across_reallocations);
    tcase_add_test(tc, cost_model);
    tcase_add_test(tc, stored_error_is_encoder_error);
    tcase_add_test(tc, fadkv_pending_code_keeps_its_atoms);
    tcase_add_test(tc, multi_token_events);
    tcase_add_test(tc, adapt_prefill_events);
    tcase_add_test(tc, every_codec_by_class);
    tcase_add_test(tc, check_accepts_only_what_runs);
    tcase_add_test(tc, close_half_opened);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    gsl_set_error_handler_off();
    blas_default = fk_blas_threads_get();
    fk_blas_threads_set(1);
    return fk_suite_run(codecs_suite());
}
