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
#include "common/fk_err.h"
#include "conformance/fk_conformance.h"
#include "core/fk_codec.h"
#include "core/fk_registry.h"
#include "dict/fk_dict_engine.h"
#include "engine/fk_schedule.h"
#include "fk_check_main.h"
#include "formats/fk_dict.h"
#include "kernels/fk_blas.h"
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

/* ---- fixtures: dictionary, stream, the replay driver ---------------------------------
 * The conformance suite's (conformance/fk_conformance.h); each wrapper fails the test. */

#define tdict fk_conf_dict
#define tstream fk_conf_stream
#define tgen fk_conf_gen
#define trun fk_conf_run
typedef fk_conf_hook thook_fn;

static gsl_rng *rng_new(unsigned long seed)
{
    gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
    ck_assert_ptr_nonnull(r);
    gsl_rng_set(r, seed);
    return r;
}

#define random_dir fk_conf_random_dir

static void tdict_init(struct tdict *d, int N, int m, int hold, int with_gram,
                       unsigned long seed)
{
    REQ_OK(fk_conf_dict_init(d, N, m, hold, with_gram, seed));
}

static void tdict_free(struct tdict *d)
{
    fk_conf_dict_free(d);
}

static void tstream_init(struct tstream *s, const struct tdict *d, int H, int P, int T,
                         const struct tgen *g, unsigned long seed)
{
    REQ_OK(fk_conf_stream_init(s, d, H, P, T, g, seed));
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

/* The stream an FK_CAP_EXTERNAL codec's "prototype" saw (fk_conf_env: its vectors halved). */
static const struct tstream *g_ext_stream;

static void trun_open(struct trun *r, const struct fk_codec_ops *ops, const void *opts,
                      const struct tdict *d, int H, int T, int kind)
{
    REQ_OK(fk_conf_run_open(r, ops, opts, d, g_ext_stream, H, T, kind));
}

/* Encodes one event of tokens t0 .. t1-1 (all heads); returns encode's result. */
static int trun_event(struct trun *r, const struct tstream *s, int t0, int t1, int phase,
                      int step, thook_fn hook, void *ctx)
{
    return fk_conf_run_event(r, s, t0, t1, phase, step, hook, ctx);
}

/* The whole stream, event by event (fk_conf_sched). */
static void trun_stream(struct trun *r, const struct fk_codec_ops *ops, const void *opts,
                        const struct tdict *d, const struct tstream *s, int kind, thook_fn hook,
                        void *ctx)
{
    g_ext_stream = s;
    REQ_OK(fk_conf_run_stream(r, ops, opts, d, s, kind, hook, ctx));
}

static void trun_close(struct trun *r)
{
    fk_conf_run_close(r);
}

#define stats_of fk_conf_stats
#define dot_fd fk_conf_dot

/* The conformance suite's check of a run's outcome (its rule "errors"). */
static void check_stream_outcome(const struct trun *r, const struct tstream *s, const void *opts)
{
    REQ_OK(fk_conf_check_outcome(r, s, opts));
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

START_TEST(options_lint)
{
    int n_codecs = 0;
    for (int ci = 0; fk_codecs[ci]; ci++, n_codecs++) {
        const struct fk_codec_ops *ops = fk_codecs[ci];
        ck_assert_ptr_eq(fk_codec_find(ops->name), ops);
        for (int k = 0; k < ci; k++)
            ck_assert_str_ne(fk_codecs[k]->name, ops->name);
        (void)ops; /* the rest of the table: the conformance suite's rules */
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

/* Every rule of the conformance suite (conformance/fk_conformance.h: interface, options,
 * errors, determinism, accounting, class, check, robustness) on every registered codec. */
struct conf_log {
    char msg[8192];
    size_t n;
};

static void conf_report(void *ctx, const struct fk_codec_ops *ops,
                        const struct fk_conf_rule *rule, int passed, const char *message)
{
    struct conf_log *l = ctx;
    if (!passed && l->n < sizeof l->msg)
        l->n += (size_t)snprintf(l->msg + l->n, sizeof l->msg - l->n, "\n%s: rule %s: %s",
                                 ops->name, rule->name, message);
}

START_TEST(every_codec_conforms)
{
    int rules = 0;
    for (const struct fk_conf_rule *r = fk_conf_rules; r->name; r++)
        rules++;
    for (int ci = 0; fk_codecs[ci]; ci++) {
        struct conf_log log = {.n = 0};
        struct fk_conf_result res;
        fk_blas_threads_set(blas_default > 1 ? blas_default : 2);
        REQ_OK(fk_conformance_run(fk_codecs[ci], conf_report, &log, &res));
        REQUIRE(res.n_failed == 0 && res.n_rules == rules, "%s: %d of %d rules broken:%s",
                fk_codecs[ci]->name, res.n_failed, res.n_rules, log.msg);
        REQUIRE(fk_blas_threads_get() == (blas_default > 1 ? blas_default : 2),
                "the suite did not restore the BLAS thread count");
    }
    fk_blas_threads_set(1);
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

    /* append codecs: 2m bytes per appended atom. fadkv (strict, the default): (2m + 2) per
     * replaced slot and 12 bytes of activity per atom, counted; paper: nothing counted,
     * the same bytes reported as uncounted */
    struct tgen g2 = {.n_use = 40, .k_gen = 3, .noise = 0.01, .p_novel = 0.5, .zero_every = 0};
    tstream_init(&s, &d, 2, 40, 140, &g2, 63);
    const char *names[] = {"lexico-adp", "gm", "pl", "fadkv", "fadkv"};
    for (int k = 0; k < 5; k++) {
        const struct fk_codec_ops *ops = codec(names[k]);
        void *o = opts_small(ops, 4, 16);
        if (k == 4)
            opt_enum(ops, o, "mem_mode", "paper");
        struct trun r;
        trun_stream(&r, ops, o, &d, &s, 0, NULL, NULL);
        struct fk_stream_stats st = stats_of(&r);
        CHECK(st.appends + st.replacements > 0);
        if (ops->caps & FK_CAP_GROWS) {
            REQUIRE(st.bytes_dict_seq == (double)st.appends * s.m * 2,
                          "%s: bytes_dict_seq %.0f, appends %llu", names[k], st.bytes_dict_seq,
                          (unsigned long long)st.appends);
            CHECK(st.bytes_dict_seq == (double)(st.n_atoms - st.n_base) * s.m * 2);
            CHECK(st.bytes_uncounted == 0);
        } else {
            int slots = 0;
            for (int j = 0; j < d.N; j++)
                slots += st.is_adapted[j] != 0;
            ck_assert_int_gt(slots, 0);
            double want = (double)slots * (2 * s.m + 2) + 12.0 * d.N;
            double counted = k == 3 ? st.bytes_dict_seq : st.bytes_uncounted;
            double other = k == 3 ? st.bytes_uncounted : st.bytes_dict_seq;
            REQUIRE(counted == want && other == 0,
                    "fadkv %s: bytes_dict_seq %.0f, bytes_uncounted %.0f; %d replaced slots of "
                    "head_dim %d and %d atoms make %.0f", k == 3 ? "strict" : "paper",
                    st.bytes_dict_seq, st.bytes_uncounted, slots, s.m, d.N, want);
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

/* ---- Correlations ahead --------------------------------------------------------------
 * A codec opened with the rows of later events (fk_codec_takes_ahead: the adaptive
 * dictionary codecs) takes an event's correlations from a window of DC_BLK rows computed in
 * one SGEMM, and those of atoms changed since (appended, rewritten slots) from a product of
 * the event's rows with them. Its numbers are then those of other products than one SGEMM
 * per event: equal up to the BLAS's rounding, and fixed by the stream alone. So: the window
 * serves every decode event; two runs with the rows ahead are equal bit for bit; rows ahead
 * that differ from an event's rows are never used (a stream whose rows ahead all differ
 * codes bit for bit as without them, and four differing rows cost four blocks); and the
 * outcomes agree with one SGEMM per event, support for support on nearly every row and in
 * mean error within 1e-3 relative. */

static void assert_runs_equal(const struct trun *a, const struct trun *b, int H, int T,
                              const char *what)
{
    const char *name = a->ops->name;
    REQUIRE(!memcmp(a->out, b->out, sizeof *a->out * (size_t)H * T),
            "%s, %s: the vector outcomes differ", name, what);
    REQUIRE(!memcmp(a->err_commit, b->err_commit, sizeof(float) * (size_t)H * T),
            "%s, %s: the committed errors differ", name, what);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            int n1, n2;
            const int32_t *i1, *i2;
            const float *c1, *c2;
            REQ_OK(a->ops->sparse_row(a->st, h, t, &n1, &i1, &c1));
            REQ_OK(b->ops->sparse_row(b->st, h, t, &n2, &i2, &c2));
            REQUIRE(n1 == n2 && !memcmp(i1, i2, sizeof(int32_t) * (size_t)n1) &&
                        !memcmp(c1, c2, sizeof(float) * (size_t)n1),
                    "%s, %s: stored row (head %d, token %d) differs", name, what, h, t);
        }
    struct fk_stream_stats sa = stats_of(a), sb = stats_of(b);
    REQUIRE(sa.n_atoms == sb.n_atoms && sa.appends == sb.appends &&
                sa.replacements == sb.replacements && sa.adapt_failed == sb.adapt_failed &&
                sa.collateral_reencodes == sb.collateral_reencodes &&
                sa.premature == sb.premature && sa.guarded == sb.guarded &&
                sa.uses_total == sb.uses_total && sa.macs == sb.macs,
            "%s, %s: the counters differ (atoms %d / %d, appends %llu / %llu, replacements "
            "%llu / %llu)", name, what, sa.n_atoms, sb.n_atoms, (unsigned long long)sa.appends,
            (unsigned long long)sb.appends, (unsigned long long)sa.replacements,
            (unsigned long long)sb.replacements);
}

/* The share of rows whose stored supports (atom sets in order) differ between a and b, and
 * the relative difference of their mean stored errors. */
static void runs_agreement(const struct trun *a, const struct trun *b, int H, int T,
                           double *differ, double *err_rel)
{
    long n = 0, d = 0;
    double ea = 0, eb = 0;
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            int n1, n2;
            const int32_t *i1, *i2;
            const float *c1, *c2;
            REQ_OK(a->ops->sparse_row(a->st, h, t, &n1, &i1, &c1));
            REQ_OK(b->ops->sparse_row(b->st, h, t, &n2, &i2, &c2));
            n++;
            d += n1 != n2 || memcmp(i1, i2, sizeof(int32_t) * (size_t)n1);
            ea += a->out[(size_t)t * H + h].err;
            eb += b->out[(size_t)t * H + h].err;
        }
    *differ = n ? (double)d / n : 0;
    *err_rel = ea > 0 ? fabs(eb - ea) / ea : fabs(eb - ea);
}

/* One stream through every codec that takes the rows ahead. */
static void ahead_stream(const struct tdict *d, const struct tgen *g, int H, int P, int T,
                         unsigned long seed, int *n_ahead, int *rewritten)
{
    int M = d->m;
    struct tstream s, other, alien;
    tstream_init(&s, d, H, P, T, g, seed);
    other = alien = s; /* the same rows but four of the decode tokens'; every row */
    other.x = malloc(sizeof(float) * (size_t)T * H * M);
    alien.x = malloc(sizeof(float) * (size_t)T * H * M);
    ck_assert(other.x && alien.x);
    memcpy(other.x, s.x, sizeof(float) * (size_t)T * H * M);
    memcpy(alien.x, s.x, sizeof(float) * (size_t)T * H * M);
    const int moved[] = {P + 3, P + 17, (P + T) / 2, T - 1};
    for (int i = 0; i < 4; i++)
        other.x[((size_t)moved[i] * H + (size_t)(moved[i] % H)) * M + 5] += 1e-3f;
    for (size_t i = 0; i < (size_t)T * H * M; i += M)
        alien.x[i] += 1e-3f;
    *n_ahead = 0;
    for (int i = 0; i < fk_codec_count(); i++) {
        const struct fk_codec_ops *ops = fk_codec_at(i);
        if (!fk_codec_takes_ahead(ops))
            continue;
        ++*n_ahead;
        REQUIRE(ops->caps & FK_CAP_DICT, "%s: rows ahead outside the dictionary engine",
                ops->name);
        void *o = opts_small(ops, 8, 64);
        if (fk_codec_option(ops, "victim")) /* fadkv: recently used slots are victims too */
            opt_enum(ops, o, "victim", "ema");
        struct trun r0, r1, r1b, r2, r3;
        trun_stream(&r0, ops, o, d, &s, 0, NULL, NULL);
        REQ_OK(fk_conf_run_stream_ahead(&r1, ops, o, d, &s, &s, 0, NULL, NULL));
        REQ_OK(fk_conf_run_stream_ahead(&r1b, ops, o, d, &s, &s, 0, NULL, NULL));
        REQ_OK(fk_conf_run_stream_ahead(&r2, ops, o, d, &s, &other, 0, NULL, NULL));
        REQ_OK(fk_conf_run_stream_ahead(&r3, ops, o, d, &s, &alien, 0, NULL, NULL));
        const struct dc *d1 = r1.st, *d2 = r2.st, *d3 = r3.st;
        /* the fixture's schedule: the prefill in one event, then one event per decode token,
         * each of H rows: every one from a window (and the prefill's last block when it
         * spans less than a window) */
        REQUIRE(d1->ah_served >= T - P && d1->ah_served <= T - P + 1, "%s: the window "
                "served %ld blocks, for %d decode events (m = %d, %d heads)", ops->name,
                d1->ah_served, T - P, M, H);
        REQUIRE(d2->ah_served < d1->ah_served && d2->ah_served >= d1->ah_served - 4,
                "%s: with four rows ahead that differ the window served %ld events, with "
                "none %ld", ops->name, d2->ah_served, d1->ah_served);
        REQUIRE(d3->ah_served == 0, "%s: the window served %ld events whose rows ahead all "
                "differ", ops->name, d3->ah_served);
        assert_runs_equal(&r1, &r1b, H, T, "two runs with the rows ahead");
        assert_runs_equal(&r0, &r3, H, T, "with rows ahead that all differ");
        double differ, err_rel;
        runs_agreement(&r0, &r1, H, T, &differ, &err_rel);
        REQUIRE(differ <= 0.02 && err_rel <= 1e-3, "%s: with the rows ahead %.2f %% of the "
                "rows have another support and the mean error moves by %.2e relative "
                "(m = %d, %d heads)", ops->name, 100 * differ, err_rel, M, H);
        struct fk_stream_stats st = stats_of(&r0);
        REQUIRE(st.appends + st.replacements >= 40, "%s: only %llu appends and %llu "
                "replacements", ops->name, (unsigned long long)st.appends,
                (unsigned long long)st.replacements);
        if (st.replacements > (uint64_t)d1->replaced_slots)
            *rewritten = 1; /* a slot replaced twice */
        trun_close(&r0);
        trun_close(&r1);
        trun_close(&r1b);
        trun_close(&r2);
        trun_close(&r3);
        free(o);
    }
    free(other.x);
    free(alien.x);
    free(s.x);
}

START_TEST(ahead_within_rounding)
{
    struct tdict d;
    tdict_init(&d, 1024, 128, 32, 1, 111);
    /* novel vectors along 48 directions: appended atoms are used again and again */
    struct tgen reuse = {.n_use = 1000, .k_gen = 6, .noise = 0.02, .p_novel_prefill = 0.2,
                         .p_novel = 0.5, .n_dirs = 48, .zero_every = 29};
    /* fresh novel vectors: fadkv runs out of unused slots and replaces some twice */
    struct tgen fresh = {.n_use = 1000, .k_gen = 6, .noise = 0.02, .p_novel_prefill = 0.2,
                         .p_novel = 0.9, .n_dirs = 0, .zero_every = 0};
    int n_ahead = 0, rewritten = 0;
    ahead_stream(&d, &reuse, 8, 24, 96, 112, &n_ahead, &rewritten);
    ahead_stream(&d, &fresh, 8, 24, 200, 113, &n_ahead, &rewritten);
    ck_assert_int_eq(n_ahead, 4); /* lexico-adp, gm, pl, fadkv */
    ck_assert_msg(rewritten, "no slot was replaced twice");
    tdict_free(&d);
    /* head_dim 1024 (the BLAS sums k in blocks) */
    tdict_init(&d, 1024, 1024, 32, 1, 111);
    ahead_stream(&d, &reuse, 8, 24, 96, 112, &n_ahead, &rewritten);
    tdict_free(&d);
    /* the shape of the embedded fortune model (N 128, m 64, 2 heads: 2-row events, a
     * window of 64 tokens) */
    struct tgen small = {.n_use = 120, .k_gen = 6, .noise = 0.02, .p_novel_prefill = 0.2,
                         .p_novel = 0.5, .n_dirs = 0, .zero_every = 29};
    tdict_init(&d, 128, 64, 16, 1, 121);
    ahead_stream(&d, &small, 2, 7, 200, 122, &n_ahead, &rewritten);
    tdict_free(&d);
}
END_TEST

static struct fk_gram_row guard_gram_row(void *ctx, int j, float *scratch)
{
    (void)scratch;
    const struct tdict *d = ctx;
    return (struct fk_gram_row){.head = d->gram + (size_t)j * (size_t)d->N};
}

/* stats.guarded counts the codes OMP's precision guard cut. The dictionary of test_sparse's
 * omp_precision_guard: a chain of 12 atoms d_j ~ e_0 + eps (e_1 + ... + e_j), eps = 1.5e-3,
 * others in dims 12..15, and a Gram whose chain entries carry an error of 3e-6; vectors in
 * the chain's span, all prefill (one event, one correlation SGEMM), coded by lexico
 * (Batch-OMP, s = 12, n_b = 0: every token coded). The count must equal the codes that
 * fk_omp_gram, run here on the same correlations and Gram, flags FK_CODE_GUARDED (some but
 * not all: the data need the guard), and premature must equal its FK_CODE_PREMATURE codes
 * (the counters are told apart: many codes here are both). */
START_TEST(guard_counted)
{
    enum { N = 64, M = 16, S = 12, T = 48 };
    struct tdict d;
    tdict_init(&d, N, M, 0, 1, 151);
    gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
    gsl_rng_set(r, 5);
    const double eps = 1.5e-3;
    memset(d.atoms, 0, sizeof(float) * N * M);
    for (int j = 0; j < S; j++) {
        double nn = sqrt(1.0 + j * eps * eps);
        d.atoms[j * M] = (float)(1.0 / nn);
        for (int i = 1; i <= j; i++)
            d.atoms[j * M + i] = (float)(eps / nn);
    }
    for (int j = S; j < N; j++) {
        double v[4], n2 = 0;
        for (int i = 0; i < 4; i++) {
            v[i] = gsl_ran_gaussian(r, 1.0);
            n2 += v[i] * v[i];
        }
        for (int i = 0; i < 4; i++)
            d.atoms[j * M + 12 + i] = (float)(v[i] / sqrt(n2));
    }
    REQ_OK(fk_gram_compute(d.atoms, N, M, d.gram));
    for (int i = 0; i < S; i++)
        for (int j = 0; j < i; j++) {
            float e = (float)(3e-6 * gsl_ran_gaussian(r, 1.0));
            d.gram[i * N + j] += e;
            d.gram[j * N + i] += e;
        }
    struct tgen g = {.n_use = N, .k_gen = 3, .noise = 0.01};
    struct tstream st;
    tstream_init(&st, &d, 1, T, T, &g, 152);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < M; i++)
            st.x[(size_t)t * M + i] = i < S ? (float)gsl_ran_gaussian(r, 1.0) : 0.0f;
    const struct fk_codec_ops *ops = codec("lexico");
    void *o = opts_new(ops);
    opt_set(ops, o, "s", S);
    opt_set(ops, o, "n_b", 0);
    opt_enum(ops, o, "omp_mode", "gram");
    struct trun run;
    trun_stream(&run, ops, o, &d, &st, 0, NULL, NULL);
    struct fk_stream_stats ss = stats_of(&run);
    /* the oracle: the kernel on the same rows, correlations and Gram */
    struct fk_dict_view v = {.m = M, .n_atoms = N, .atoms = d.atoms, .dead = d.dead,
                             .gram_row = guard_gram_row, .gram_ctx = &d};
    float *a = malloc(sizeof(float) * T * N);
    float *work = malloc(sizeof(float) * fk_omp_work_floats(N, M, S));
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_nonnull(work);
    fk_correlate(&v, st.x, T, a);
    long want = 0, want_premature = 0;
    for (int t = 0; t < T; t++) {
        struct fk_code c;
        REQ_OK(fk_omp_gram(&v, st.x + (size_t)t * M, a + (size_t)t * N, S, 0, work, &c));
        want += (c.flags & FK_CODE_GUARDED) != 0;
        want_premature += (c.flags & FK_CODE_PREMATURE) != 0;
    }
    ck_assert_msg(want > 0 && want < T, "the guard cut %ld of %d codes", want, (int)T);
    ck_assert_msg((long)ss.guarded == want, "stats: %llu codes guarded, the kernel: %ld",
                  (unsigned long long)ss.guarded, want);
    ck_assert_msg((long)ss.premature == want_premature,
                  "stats: %llu codes premature, the kernel: %ld",
                  (unsigned long long)ss.premature, want_premature);
    free(a);
    free(work);
    trun_close(&run);
    free(o);
    free(st.x);
    tdict_free(&d);
    gsl_rng_free(r);
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
        if (ops->caps & FK_CAP_SKIPS) /* token 0 skipped (an eviction policy), then token 1 again */
            REQUIRE(trun_event(&r, &s, 1, 2, 1, 0, NULL, NULL) == FK_OK &&
                    trun_event(&r, &s, 1, 2, 1, 1, NULL, NULL) < 0 && fk_errmsg()[0],
                    "%s: encode() refused a skipped token 0 or accepted token 1 twice",
                    ops->name);
        else
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
        struct trun hold;
        memset(&hold, 0, sizeof hold);
        REQ_OK(fk_conf_env(&hold, ops, &s, &big)); /* before the address space is capped */
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
        fk_conf_run_close(&hold);
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
    tcase_add_test(tc, ahead_within_rounding);
    tcase_add_test(tc, guard_counted);
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
