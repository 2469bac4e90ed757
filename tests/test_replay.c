/* SPDX-License-Identifier: MIT
 * Replay engine: prefill/decode semantics of spec section 4 (which tokens are coded, in which
 * event, the buffer at its boundaries, T <= n_b), the `full` codec's exactness, results that
 * do not depend on --jobs, and the results store's atomic commit.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/fk_codec.h"
#include "formats/fk_dict.h"
#include "common/fk_err.h"
#include "engine/fk_replay.h"
#include "store/fk_results.h"
#include "formats/fk_trace.h"

static char tmpdir[256];

static uint64_t rng_state = 88172645463325252ULL;
static double urand(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}
static float nrand(void)
{
    double u = urand() + 1e-12, v = urand();
    return (float)(sqrt(-2 * log(u)) * cos(6.283185307179586 * v));
}

/* Writes a random trace with queries for every token, stored with encoding enc; values are
 * rounded to the precision of `values` first (so that traces of different encodings can
 * hold the same numbers). */
static void make_trace_enc(const char *path, int L, int Hq, int H, int d, int T, int P,
                           enum fk_encoding enc, enum fk_encoding values);

static void make_trace(const char *path, int L, int Hq, int H, int d, int T, int P)
{
    make_trace_enc(path, L, Hq, H, d, T, P, FK_ENC_F32, FK_ENC_F32);
}

static void make_trace_enc(const char *path, int L, int Hq, int H, int d, int T, int P,
                           enum fk_encoding enc, enum fk_encoding values)
{
    struct fk_trace_info in = {.n_layers = L, .n_q_heads = Hq, .n_kv_heads = H, .head_dim = d,
                               .n_tokens = T, .prompt_len = P, .keys_post_rope = 1,
                               .rope_theta = 10000, .n_queries = T, .has_queries = 1};
    snprintf(in.model_id, sizeof in.model_id, "test");
    snprintf(in.source, sizeof in.source, "synthetic");
    struct fk_trace_writer *w;
    ck_assert_int_eq(fk_trace_create(path, &in, enc, &w), FK_OK);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)T), *qi = malloc(sizeof(int32_t) * (size_t)T);
    uint8_t *ph = malloc((size_t)T);
    for (int t = 0; t < T; t++) {
        pos[t] = t;
        qi[t] = t;
        ph[t] = t >= P;
    }
    ck_assert_int_eq(fk_trace_write_tokens(w, pos, ph, NULL), FK_OK);
    size_t nkv = (size_t)H * T * d, nq = (size_t)Hq * T * d;
    float *buf = malloc(sizeof(float) * (nq > nkv ? nq : nkv));
    for (int l = 0; l < L; l++)
        for (int k = 0; k < 3; k++) {
            size_t n = k == 2 ? nq : nkv;
            for (size_t i = 0; i < n; i++) {
                buf[i] = nrand();
                uint16_t h;
                if (values == FK_ENC_F16) {
                    fk_f32_to_f16(&buf[i], &h, 1);
                    fk_f16_to_f32(&h, &buf[i], 1);
                } else if (values == FK_ENC_BF16) {
                    fk_f32_to_bf16(&buf[i], &h, 1);
                    fk_bf16_to_f32(&h, &buf[i], 1);
                }
            }
            ck_assert_int_eq(fk_trace_write_layer(w, l, k, buf, k == 2 ? qi : NULL), FK_OK);
        }
    ck_assert_int_eq(fk_trace_finish(&w), FK_OK);
    free(buf);
    free(pos);
    free(qi);
    free(ph);
}

/* ---- a probe codec that records its events ---------------------------------------------- */

#define MAXEV 4096
struct probe_opts {
    struct fk_common_opts c;
};
struct probe_log {
    int n_ev;
    int phase[MAXEV], step[MAXEV], first[MAXEV], count[MAXEV]; /* tokens per event */
    int ok_order;       /* every event lists (token, head) in order, all heads per token */
};
static struct probe_log plog;
struct probe {
    int H, m, next;
};
static const struct fk_option probe_options[] = {
    FK_COMMON_OPTIONS(struct probe_opts),
    {NULL, 0, 0, 0, 0, 0, NULL, NULL},
};
static int probe_open(const void *o, const struct fk_stream_env *env, void **st)
{
    struct probe *p = calloc(1, sizeof *p);
    p->H = env->n_heads;
    p->m = env->head_dim;
    *st = p;
    return FK_OK;
}
static int probe_encode(void *st, const struct fk_event *ev, struct fk_vec_out *out)
{
    struct probe *p = st;
    if (ev->n % p->H)
        plog.ok_order = 0;
    for (int i = 0; i < ev->n; i++) {
        if (ev->token[i] != p->next + i / p->H || ev->head[i] != i % p->H)
            plog.ok_order = 0;
        out[i] = (struct fk_vec_out){.err = 0, .err_enc = 0, .nnz = 1};
    }
    if (plog.n_ev < MAXEV) {
        plog.phase[plog.n_ev] = ev->phase;
        plog.step[plog.n_ev] = ev->step;
        plog.first[plog.n_ev] = ev->token[0];
        plog.count[plog.n_ev] = ev->n / p->H;
        plog.n_ev++;
    }
    p->next += ev->n / p->H;
    return FK_OK;
}
static int probe_reconstruct(const void *st, int h, int t, float *out)
{
    const struct probe *p = st;
    memset(out, 0, sizeof(float) * (size_t)p->m);
    return FK_OK;
}
static void probe_stats(const void *st, struct fk_stream_stats *s) { memset(s, 0, sizeof *s); }
static void probe_close(void *st) { free(st); }
static const struct fk_codec_ops probe_ops = {
    .name = "probe", .summary = "test probe", .opts_size = sizeof(struct probe_opts),
    .options = probe_options, .open = probe_open, .encode = probe_encode,
    .reconstruct = probe_reconstruct, .stats = probe_stats, .close = probe_close,
};

/* Replays one layer-1 trace with the probe and checks the event schedule against the rules
 * of spec section 4, independently re-derived here token by token. */
static void check_schedule(int T, int P, int n_b, int a_len)
{
    char path[512];
    snprintf(path, sizeof path, "%s/sched-%d-%d-%d-%d.h5", tmpdir, T, P, n_b, a_len);
    make_trace(path, 1, 2, 2, 4, T, P);
    struct fk_trace *tr;
    ck_assert_int_eq(fk_trace_open(path, &tr), FK_OK);
    struct probe_opts o;
    fk_opts_defaults(&probe_ops, &o);
    o.c.n_b = n_b;
    o.c.a_len = a_len;
    memset(&plog, 0, sizeof plog);
    plog.ok_order = 1;
    struct fk_cell_input in = {.ops = &probe_ops, .opts = &o, .traces = &tr, .n_traces = 1};
    struct fk_replay_opts ro = {.jobs = 1, .attn_stride = 1, .recall_every = 8};
    struct fk_cell_result res;
    ck_assert_int_eq(fk_replay_cell(&in, &ro, &res), FK_OK);
    ck_assert(plog.ok_order);
    /* events come in pairs (K then V); walk the K events */
    int comp = 0, e = 0;
    if (P > n_b) {
        ck_assert_int_ge(plog.n_ev, 2);
        ck_assert_int_eq(plog.phase[0], 0);
        ck_assert_int_eq(plog.first[0], 0);
        ck_assert_int_eq(plog.count[0], P - n_b); /* tokens 0 .. P-n_b-1 */
        ck_assert_int_eq(plog.phase[1], 0);
        comp = P - n_b;
        e = 2;
    }
    for (int t = P; t < T; t++) {
        int buffered = t - comp; /* tokens comp .. t-1 sit in the buffer before appending t */
        ck_assert_int_le(buffered, n_b);
        if (buffered >= n_b) {
            ck_assert_int_lt(e + 1, plog.n_ev);
            for (int k = 0; k < 2; k++, e++) {
                ck_assert_int_eq(plog.phase[e], 1);
                ck_assert_int_eq(plog.step[e], t - P);
                ck_assert_int_eq(plog.first[e], comp);
                ck_assert_int_eq(plog.count[e], a_len < buffered ? a_len : buffered);
            }
            comp += a_len < buffered ? a_len : buffered;
            /* after appending t the buffer holds n_b - a_len + 1 .. n_b tokens */
            ck_assert_int_ge(t + 1 - comp, n_b - a_len + 1);
        }
        ck_assert_int_le(t + 1 - comp, n_b);
    }
    ck_assert_int_eq(e, plog.n_ev); /* no other event */
    const struct fk_stream_result *s = fk_cell_stream(&res, 0, 0, 0);
    ck_assert_int_eq(s->n_vectors, (long)comp * 2);
    ck_assert(s->bytes_buf == (double)(T - comp) * 2 * 4 * 2);
    if (T <= n_b)
        ck_assert_int_eq(plog.n_ev, 0);
    fk_cell_result_free(&res);
    fk_trace_close(&tr);
}

START_TEST(test_schedule)
{
    check_schedule(40, 20, 8, 1);   /* prefill coded, then one token per step */
    check_schedule(40, 20, 8, 3);   /* chunks of 3: buffer cycles 6..8 */
    check_schedule(40, 5, 8, 1);    /* P <= n_b: nothing in prefill; first eviction at t = n_b */
    check_schedule(40, 8, 8, 4);    /* P == n_b boundary */
    check_schedule(10, 6, 16, 1);   /* T <= n_b: nothing is ever coded */
    check_schedule(9, 9, 8, 1);     /* no decode tokens at all */
    check_schedule(30, 0, 4, 2);    /* no prefill at all */
}
END_TEST

/* Random unit dictionary (2 layers) for the codec runs. */
static void make_dict(const char *path, int L, int N, int d)
{
    float *a = malloc(sizeof(float) * (size_t)L * 2 * N * d);
    for (size_t i = 0; i < (size_t)L * 2 * N * d; i++)
        a[i] = nrand();
    ck_assert_int_eq(fk_dict_save(path, L, d, N, a, NULL), FK_OK);
    free(a);
}

static void run_cell_pool(const char *codec, struct fk_trace **tr, int n_tr,
                          const struct fk_dict *dict, int jobs, int attention,
                          struct fk_replay_pool *pool, struct fk_cell_result *res);

static void run_cell(const char *codec, struct fk_trace **tr, int n_tr, const struct fk_dict *dict,
                     int jobs, int attention, struct fk_cell_result *res)
{
    run_cell_pool(codec, tr, n_tr, dict, jobs, attention, NULL, res);
}

static void run_cell_pool(const char *codec, struct fk_trace **tr, int n_tr,
                          const struct fk_dict *dict, int jobs, int attention,
                          struct fk_replay_pool *pool, struct fk_cell_result *res)
{
    const struct fk_codec_ops *ops = fk_codec_find(codec);
    ck_assert_ptr_nonnull(ops);
    void *o = calloc(1, ops->opts_size);
    fk_opts_defaults(ops, o);
    const struct fk_option *opt = fk_codec_option(ops, "n_b");
    ck_assert_int_eq(fk_opts_set(ops, o, opt, 16), FK_OK);
    if ((opt = fk_codec_option(ops, "n")))
        ck_assert_int_eq(fk_opts_set(ops, o, opt, 32), FK_OK);
    if ((opt = fk_codec_option(ops, "tau_c")))
        ck_assert_int_eq(fk_opts_set(ops, o, opt, 1), FK_OK);
    struct fk_cell_input in = {.ops = ops, .opts = o, .traces = tr, .n_traces = n_tr,
                               .dict = dict};
    struct fk_replay_opts ro = {.jobs = jobs, .attention = attention, .attn_stride = 3,
                                .recall = 1, .recall_every = 4, .pool = pool};
    int rc = fk_replay_cell(&in, &ro, res);
    ck_assert_msg(rc == FK_OK, "%s: %s", codec, fk_errmsg());
    free(o);
}

START_TEST(test_full_exact)
{
    char path[512];
    snprintf(path, sizeof path, "%s/full.h5", tmpdir);
    make_trace(path, 2, 4, 2, 8, 50, 30);
    struct fk_trace *tr;
    ck_assert_int_eq(fk_trace_open(path, &tr), FK_OK);
    struct fk_cell_result r;
    run_cell("full", &tr, 1, NULL, 2, 1, &r);
    for (int l = 0; l < 2; l++) {
        for (int k = 0; k < 2; k++) {
            const struct fk_stream_result *s = fk_cell_stream(&r, 0, l, k);
            ck_assert_int_eq(s->n_vectors, (50 - 16) * 2);
            ck_assert(s->err_sum == 0 && s->err_final_sum == 0 && s->res2_sum == 0);
        }
        const struct fk_attn_acc *a = &r.attn[l];
        ck_assert_int_gt(a->n, 0);
        ck_assert(a->cos_sum == a->n && a->kl_sum == 0);
        ck_assert(a->top_sum[0] == a->n && a->top_sum[1] == a->n && a->top_sum[2] == a->n);
    }
    fk_cell_result_free(&r);
    fk_trace_close(&tr);
}
END_TEST

static void assert_same(const struct fk_cell_result *a, const struct fk_cell_result *b)
{
    ck_assert_int_eq(a->n_traces, b->n_traces);
    for (int t = 0; t < a->n_traces; t++)
        for (int l = 0; l < a->n_layers; l++) {
            for (int k = 0; k < 2; k++) {
                const struct fk_stream_result *x = fk_cell_stream((struct fk_cell_result *)a, t, l, k);
                const struct fk_stream_result *y = fk_cell_stream((struct fk_cell_result *)b, t, l, k);
                ck_assert_int_eq(x->n_vectors, y->n_vectors);
                ck_assert(memcmp(&x->err_sum, &y->err_sum, sizeof(double)) == 0);
                ck_assert(memcmp(&x->err_final_sum, &y->err_final_sum, sizeof(double)) == 0);
                ck_assert(memcmp(&x->res2_sum, &y->res2_sum, sizeof(double)) == 0);
                ck_assert(memcmp(&x->st.macs, &y->st.macs, sizeof(double)) == 0);
                ck_assert(x->st.n_atoms == y->st.n_atoms && x->st.appends == y->st.appends &&
                          x->st.replacements == y->st.replacements);
                ck_assert(memcmp(x->recall, y->recall, sizeof x->recall) == 0);
                ck_assert(memcmp(x->step_err, y->step_err, sizeof(double) * x->n_steps) == 0);
            }
            const struct fk_attn_acc *p = &a->attn[(size_t)t * a->n_layers + l];
            const struct fk_attn_acc *q = &b->attn[(size_t)t * b->n_layers + l];
            ck_assert_int_eq(p->n, q->n);
            ck_assert(memcmp(&p->kl_sum, &q->kl_sum, sizeof(double)) == 0);
            ck_assert(memcmp(&p->cos_sum, &q->cos_sum, sizeof(double)) == 0);
        }
}

START_TEST(test_jobs_determinism)
{
    char p1[512], p2[512], pd[512];
    snprintf(p1, sizeof p1, "%s/det1.h5", tmpdir);
    snprintf(p2, sizeof p2, "%s/det2.h5", tmpdir);
    snprintf(pd, sizeof pd, "%s/det-dict.h5", tmpdir);
    make_trace(p1, 4, 4, 2, 16, 70, 40);
    make_trace(p2, 4, 4, 2, 16, 60, 30);
    make_dict(pd, 4, 64, 16);
    struct fk_trace *tr[2];
    ck_assert_int_eq(fk_trace_open(p1, &tr[0]), FK_OK);
    ck_assert_int_eq(fk_trace_open(p2, &tr[1]), FK_OK);
    struct fk_dict *d;
    ck_assert_int_eq(fk_dict_load(pd, &d), FK_OK);
    for (int c = 0; fk_codecs[c]; c++) {
        struct fk_cell_result r1, r2;
        const struct fk_dict *dd = (fk_codecs[c]->caps & FK_CAP_DICT) ? d : NULL;
        run_cell(fk_codecs[c]->name, tr, 2, dd, 1, 1, &r1);
        run_cell(fk_codecs[c]->name, tr, 2, dd, 2, 1, &r2);
        assert_same(&r1, &r2);
        fk_cell_result_free(&r1);
        fk_cell_result_free(&r2);
    }
    fk_dict_free(&d);
    fk_trace_close(&tr[0]);
    fk_trace_close(&tr[1]);
}
END_TEST

/* K and V kept as the trace's 16-bit words give, for every codec, the bits of the same
 * numbers stored as float32 (encoding, final errors, recall, attention). */
START_TEST(test_stored_16bit)
{
    char pd[512];
    snprintf(pd, sizeof pd, "%s/enc-dict.h5", tmpdir);
    make_dict(pd, 2, 48, 16);
    struct fk_dict *d;
    ck_assert_int_eq(fk_dict_load(pd, &d), FK_OK);
    const enum fk_encoding encs[2] = {FK_ENC_F16, FK_ENC_BF16};
    for (int e = 0; e < 2; e++) {
        char p32[512], p16[512];
        snprintf(p32, sizeof p32, "%s/enc%d-f32.h5", tmpdir, e);
        snprintf(p16, sizeof p16, "%s/enc%d-16.h5", tmpdir, e);
        uint64_t seed = rng_state;
        make_trace_enc(p32, 2, 4, 2, 16, 60, 30, FK_ENC_F32, encs[e]);
        rng_state = seed;
        make_trace_enc(p16, 2, 4, 2, 16, 60, 30, encs[e], encs[e]);
        struct fk_trace *t32, *t16;
        ck_assert_int_eq(fk_trace_open(p32, &t32), FK_OK);
        ck_assert_int_eq(fk_trace_open(p16, &t16), FK_OK);
        enum fk_encoding got;
        ck_assert_int_eq(fk_trace_encoding(t16, 1, FK_KIND_V, &got), FK_OK);
        ck_assert_int_eq(got, encs[e]);
        for (int c = 0; fk_codecs[c]; c++) {
            struct fk_cell_result r1, r2;
            const struct fk_dict *dd = (fk_codecs[c]->caps & FK_CAP_DICT) ? d : NULL;
            run_cell(fk_codecs[c]->name, &t32, 1, dd, 1, 1, &r1);
            run_cell(fk_codecs[c]->name, &t16, 1, dd, 2, 1, &r2);
            ck_assert_int_gt(r1.attn[0].n, 0);
            assert_same(&r1, &r2);
            fk_cell_result_free(&r1);
            fk_cell_result_free(&r2);
        }
        fk_trace_close(&t32);
        fk_trace_close(&t16);
    }
    fk_dict_free(&d);
}
END_TEST

START_TEST(test_refusals)
{
    char p[512], pd[512];
    snprintf(p, sizeof p, "%s/noq.h5", tmpdir);
    snprintf(pd, sizeof pd, "%s/ref-dict.h5", tmpdir);
    /* a trace without queries: attention is refused with a clear message */
    struct fk_trace_info in = {.n_layers = 1, .n_q_heads = 2, .n_kv_heads = 2, .head_dim = 4,
                               .n_tokens = 10, .prompt_len = 5, .keys_post_rope = 1};
    struct fk_trace_writer *w;
    ck_assert_int_eq(fk_trace_create(p, &in, FK_ENC_F32, &w), FK_OK);
    int32_t pos[10];
    uint8_t ph[10];
    float kv[2 * 10 * 4];
    for (int t = 0; t < 10; t++) {
        pos[t] = t;
        ph[t] = t >= 5;
    }
    for (int i = 0; i < 80; i++)
        kv[i] = nrand();
    ck_assert_int_eq(fk_trace_write_tokens(w, pos, ph, NULL), FK_OK);
    ck_assert_int_eq(fk_trace_write_layer(w, 0, FK_KIND_K, kv, NULL), FK_OK);
    ck_assert_int_eq(fk_trace_write_layer(w, 0, FK_KIND_V, kv, NULL), FK_OK);
    ck_assert_int_eq(fk_trace_finish(&w), FK_OK);
    struct fk_trace *tr;
    ck_assert_int_eq(fk_trace_open(p, &tr), FK_OK);
    const struct fk_codec_ops *ops = fk_codec_find("full");
    struct fk_common_opts o = {.n_b = 2, .a_len = 1};
    struct fk_cell_input ci = {.ops = ops, .opts = &o, .traces = &tr, .n_traces = 1};
    struct fk_replay_opts ro = {.jobs = 1, .attention = 1, .attn_stride = 1};
    struct fk_cell_result r;
    ck_assert_int_eq(fk_replay_cell(&ci, &ro, &r), FK_ECONFIG);
    ck_assert_ptr_nonnull(strstr(fk_errmsg(), "no queries"));
    /* a dictionary codec without a dictionary, and a dictionary of another head_dim */
    const struct fk_codec_ops *lx = fk_codec_find("lexico");
    void *lo = calloc(1, lx->opts_size);
    fk_opts_defaults(lx, lo);
    struct fk_cell_input c2 = {.ops = lx, .opts = lo, .traces = &tr, .n_traces = 1};
    ro.attention = 0;
    ck_assert_int_eq(fk_replay_cell(&c2, &ro, &r), FK_ECONFIG);
    ck_assert_ptr_nonnull(strstr(fk_errmsg(), "needs a dictionary"));
    make_dict(pd, 1, 32, 8);
    struct fk_dict *d;
    ck_assert_int_eq(fk_dict_load(pd, &d), FK_OK);
    c2.dict = d;
    ck_assert_int_eq(fk_replay_cell(&c2, &ro, &r), FK_ECONFIG);
    ck_assert_ptr_nonnull(strstr(fk_errmsg(), "head_dim"));
    free(lo);
    fk_dict_free(&d);
    fk_trace_close(&tr);
}
END_TEST

START_TEST(test_results_commit)
{
    char p[512], pd[512], out[512];
    snprintf(p, sizeof p, "%s/res.h5", tmpdir);
    snprintf(pd, sizeof pd, "%s/res-dict.h5", tmpdir);
    snprintf(out, sizeof out, "%s/results", tmpdir);
    make_trace(p, 2, 2, 2, 8, 40, 24);
    make_dict(pd, 2, 32, 8);
    struct fk_trace *tr;
    struct fk_dict *d;
    ck_assert_int_eq(fk_trace_open(p, &tr), FK_OK);
    ck_assert_int_eq(fk_dict_load(pd, &d), FK_OK);
    struct fk_cell_result r;
    run_cell("lexico", &tr, 1, d, 1, 1, &r);
    ck_assert_int_eq(fk_results_prepare(out), FK_OK);
    const struct fk_codec_ops *ops = fk_codec_find("lexico");
    void *o = calloc(1, ops->opts_size);
    fk_opts_defaults(ops, o);
    const char *traces[1] = {p};
    struct fk_cell_meta m = {.id = "0123456789abcdef", .ops = ops, .opts = o,
                             .dataset = "default", .traces = traces, .n_traces = 1, .dict = pd};
    ck_assert(!fk_results_done(out, m.id));
    ck_assert_int_eq(fk_results_commit(out, &m, &r), FK_OK);
    ck_assert(fk_results_done(out, m.id));
    const char *ids[1] = {m.id};
    ck_assert_int_eq(fk_results_tables(out, ids, 1, NULL), FK_OK);
    /* cells.csv's rel_err_mean equals the mean over kinds of the mean over layers */
    double want = 0;
    for (int k = 0; k < 2; k++) {
        double s = 0;
        for (int l = 0; l < 2; l++) {
            const struct fk_stream_result *st = fk_cell_stream(&r, 0, l, k);
            s += st->err_sum / st->n_vectors;
        }
        want += s / 4;
    }
    double got;
    ck_assert_int_eq(fk_results_metric(out, m.id, "rel_err_mean", &got), FK_OK);
    ck_assert_double_eq_tol(got, want, 1e-8);
    char csv[600];
    snprintf(csv, sizeof csv, "%s/cells.csv", out);
    ck_assert_int_eq(access(csv, F_OK), 0);
    snprintf(csv, sizeof csv, "%s/cells.csv.tmp", out);
    ck_assert_int_ne(access(csv, F_OK), 0); /* nothing half-written left behind */
    /* an unwritable location is refused with the path in the message */
    ck_assert_int_eq(fk_results_prepare("/proc/fadkv-results"), FK_EIO);
    ck_assert_ptr_nonnull(strstr(fk_errmsg(), "/proc"));
    free(o);
    fk_cell_result_free(&r);
    fk_dict_free(&d);
    fk_trace_close(&tr);
}
END_TEST

/* Reference mode (naive OMP, no Gram, one vector at a time) stores the same supports as the
 * optimised path (up to float near-ties) and never builds a Gram matrix. */
START_TEST(test_reference_mode)
{
    char p[512], pd[512];
    snprintf(p, sizeof p, "%s/refmode.h5", tmpdir);
    snprintf(pd, sizeof pd, "%s/refmode-dict.h5", tmpdir);
    make_trace(p, 2, 4, 2, 16, 80, 40);
    make_dict(pd, 2, 64, 16);
    struct fk_trace *tr;
    struct fk_dict *d;
    ck_assert_int_eq(fk_trace_open(p, &tr), FK_OK);
    ck_assert_int_eq(fk_dict_load(pd, &d), FK_OK);
    const struct fk_codec_ops *ops = fk_codec_find("lexico");
    void *o = calloc(1, ops->opts_size);
    fk_opts_defaults(ops, o);
    ck_assert_int_eq(fk_opts_set(ops, o, fk_codec_option(ops, "n_b"), 8), FK_OK);
    ck_assert_int_eq(fk_opts_set(ops, o, fk_codec_option(ops, "s"), 4), FK_OK);
    struct fk_cell_input in = {.ops = ops, .opts = o, .traces = &tr, .n_traces = 1, .dict = d};
    uint8_t layers[2] = {1, 1};
    struct fk_replay_opts ro = {.jobs = 1, .recall_every = 8, .row_hashes = 1,
                                .layers = layers};
    struct fk_cell_result a, b;
    ck_assert_int_eq(fk_replay_cell(&in, &ro, &a), FK_OK);
    ro.reference = 1;
    ck_assert_int_eq(fk_replay_cell(&in, &ro, &b), FK_OK);
    ck_assert(a.t_gram > 0 && b.t_gram == 0);
    long same = 0, total = 0;
    for (size_t i = 0; i < (size_t)a.n_traces * a.n_layers * 2; i++) {
        ck_assert_int_eq(a.streams[i].n_row_hash, b.streams[i].n_row_hash);
        ck_assert_int_gt(a.streams[i].n_row_hash, 0);
        for (long r = 0; r < a.streams[i].n_row_hash; r++)
            same += a.streams[i].row_hash[r] == b.streams[i].row_hash[r];
        total += a.streams[i].n_row_hash;
    }
    ck_assert_msg(same >= total - total / 100, "%ld of %ld rows agree", same, total);
    fk_cell_result_free(&a);
    fk_cell_result_free(&b);
    free(o);
    fk_dict_free(&d);
    fk_trace_close(&tr);
}
END_TEST

/* Gram buffers passed from cell to cell through a pool (dictionaries of two sizes, a growing
 * codec, a cell without Gram that releases them, different job counts) give the results of
 * cells that allocate their own. */
START_TEST(test_pool)
{
    char p[512], d1[512], d2[512];
    snprintf(p, sizeof p, "%s/pool.h5", tmpdir);
    snprintf(d1, sizeof d1, "%s/pool-d32.h5", tmpdir);
    snprintf(d2, sizeof d2, "%s/pool-d96.h5", tmpdir);
    make_trace(p, 3, 4, 2, 16, 60, 30);
    make_dict(d1, 3, 32, 16);
    make_dict(d2, 3, 96, 16);
    struct fk_trace *tr;
    struct fk_dict *small, *large;
    ck_assert_int_eq(fk_trace_open(p, &tr), FK_OK);
    ck_assert_int_eq(fk_dict_load(d1, &small), FK_OK);
    ck_assert_int_eq(fk_dict_load(d2, &large), FK_OK);
    struct {
        const char *codec;
        const struct fk_dict *dict;
        int jobs;
    } seq[] = {{"lexico", small, 2}, {"lexico-adp", large, 2}, {"lexico", small, 1},
               {"gm", large, 2},     {"lexico", large, 2},     {"lexico-adp", large, 1}};
    /* bytes the pool holds after each cell: two N x N buffers per worker slot that has
     * run, of the largest N seen since the last release; none after gm */
    const size_t g32 = 2 * 32 * 32 * sizeof(float), g96 = 2 * 96 * 96 * sizeof(float);
    const size_t held[] = {2 * g32, 2 * g96, 2 * g96, 0, 2 * g96, 2 * g96};
    struct fk_replay_pool *pool;
    ck_assert_int_eq(fk_replay_pool_new(&pool), FK_OK);
    ck_assert_uint_eq(fk_replay_pool_bytes(pool), 0);
    for (size_t i = 0; i < sizeof seq / sizeof seq[0]; i++) {
        struct fk_cell_result a, b;
        run_cell_pool(seq[i].codec, &tr, 1, seq[i].dict, seq[i].jobs, 1, pool, &a);
        run_cell(seq[i].codec, &tr, 1, seq[i].dict, seq[i].jobs, 1, &b);
        if (!strcmp(seq[i].codec, "lexico"))
            ck_assert(a.t_gram > 0);
        assert_same(&a, &b);
        ck_assert_msg(fk_replay_pool_bytes(pool) == held[i], "after cell %zu (%s, %d jobs): "
                      "the pool holds %zu bytes, expected %zu", i, seq[i].codec, seq[i].jobs,
                      fk_replay_pool_bytes(pool), held[i]);
        fk_cell_result_free(&a);
        fk_cell_result_free(&b);
    }
    fk_replay_pool_free(&pool);
    ck_assert_ptr_null(pool);
    fk_replay_pool_free(&pool); /* a freed pool is NULL; freeing it again is a no-op */
    fk_dict_free(&small);
    fk_dict_free(&large);
    fk_trace_close(&tr);
}
END_TEST

static Suite *replay_suite(void)
{
    Suite *s = suite_create("replay");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_schedule);
    tcase_add_test(tc, test_full_exact);
    tcase_add_test(tc, test_jobs_determinism);
    tcase_add_test(tc, test_stored_16bit);
    tcase_add_test(tc, test_refusals);
    tcase_add_test(tc, test_results_commit);
    tcase_add_test(tc, test_reference_mode);
    tcase_add_test(tc, test_pool);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    fk_hdf5_quiet();
    snprintf(tmpdir, sizeof tmpdir, "/tmp/fk-replay-XXXXXX");
    if (!mkdtemp(tmpdir))
        return 1;
    SRunner *sr = srunner_create(replay_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        failed++;
    return failed ? 1 : 0;
}
