/* SPDX-License-Identifier: MIT
 * Replay engine: prefill/decode semantics of spec section 4 (which tokens are coded, in which
 * event, the buffer at its boundaries, T <= n_b), the `full` codec's exactness, results that
 * do not depend on --jobs, and the results store's atomic commit.
 */
#include <check.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/fk_codec.h"
#include "core/fk_registry.h"
#include "core/fk_rewrite.h"
#include "formats/fk_dict.h"
#include "common/fk_err.h"
#include "engine/fk_observe.h"
#include "engine/fk_replay.h"
#include "engine/fk_schedule.h"
#include "store/fk_csv.h"
#include "store/fk_results.h"
#include "formats/fk_trace.h"
#include "train/fk_train_basis.h"
#include "train/fk_train_calib.h"

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
                               .rope_theta = 10000, .n_queries = T, .has_queries = 1,
                               /* described, for the codecs that code pre-RoPE keys */
                               .has_rope = 1,
                               .rope = {.theta = 10000, .layout = FK_ROPE_INTERLEAVED}};
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

/* The basis FK_CAP_BASIS codecs and the calibration FK_CAP_CALIB codecs replay with
 * (train_test_basis), or NULL. */
static struct fk_basis_file *g_basis;
static struct fk_calib_file *g_calib;

/* A basis of one group of all KV heads trained on the traces (pca's default rank 32 fits
 * 2 heads of head_dim 16). */
static void train_test_basis(char **paths, int n)
{
    char out[600];
    snprintf(out, sizeof out, "%s.basis.h5", paths[0]);
    struct fk_trace *t;
    ck_assert_int_eq(fk_trace_open(paths[0], &t), FK_OK);
    struct fk_train_basis_cfg c = {.out = out, .traces = paths, .n_traces = n,
                                   .group = fk_trace_get_info(t)->n_kv_heads};
    fk_trace_close(&t);
    ck_assert_msg(fk_train_basis_run(&c, NULL) == FK_OK, "%s", fk_errmsg());
    fk_basis_free(&g_basis);
    ck_assert_int_eq(fk_basis_load(out, &g_basis), FK_OK);
    snprintf(out, sizeof out, "%s.calib.h5", paths[0]);
    struct fk_train_calib_cfg cc = {.out = out, .traces = paths, .n_traces = n,
                                    .n_fractions = 2, .fractions = {0, 0.01}, .sinks = 1};
    ck_assert_msg(fk_train_calib_run(&cc, NULL) == FK_OK, "%s", fk_errmsg());
    fk_calib_free(&g_calib);
    ck_assert_int_eq(fk_calib_load(out, &g_calib), FK_OK);
}

static void run_cell_pool(const char *codec, struct fk_trace **tr, int n_tr,
                          const struct fk_dict *dict, int jobs, int attention,
                          struct fk_replay_pool *pool, struct fk_cell_result *res)
{
    const struct fk_codec_ops *ops = fk_codec_find(codec);
    ck_assert_ptr_nonnull(ops);
    void *o = calloc(1, ops->opts_size);
    fk_opts_defaults(ops, o);
    /* short traces, head_dim 16: a small buffer, and quantiser groups that divide 16 */
    const struct fk_option *opt = fk_codec_option(ops, "n_b");
    if (opt)
        ck_assert_int_eq(fk_opts_set(ops, o, opt, 16), FK_OK);
    if ((opt = fk_codec_option(ops, "group")))
        ck_assert_int_eq(fk_opts_set(ops, o, opt, 8), FK_OK);
    if ((opt = fk_codec_option(ops, "residual")))
        ck_assert_int_eq(fk_opts_set(ops, o, opt, 16), FK_OK);
    if ((opt = fk_codec_option(ops, "gap"))) /* gear: blocks of 16 tokens, not 64 */
        ck_assert_int_eq(fk_opts_set(ops, o, opt, 16), FK_OK);
    if ((opt = fk_codec_option(ops, "n")))
        ck_assert_int_eq(fk_opts_set(ops, o, opt, 32), FK_OK);
    if ((opt = fk_codec_option(ops, "tau_c")))
        ck_assert_int_eq(fk_opts_set(ops, o, opt, 1), FK_OK);
    struct fk_cell_input in = {.ops = ops, .opts = o, .traces = tr, .n_traces = n_tr,
                               .dict = dict,
                               .basis = (ops->caps & FK_CAP_BASIS) ? g_basis : NULL,
                               .calib = (ops->caps & FK_CAP_CALIB) ? g_calib : NULL,
                               /* an external codec reads each trace as its own prototype */
                               .external = (ops->caps & FK_CAP_EXTERNAL) ? tr : NULL};
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

/* ---- eviction policies (core/fk_evict.h) through the engine ------------------------------ */

/* The row rewrites run_cell_evict's cells get (NULL: none). */
static const struct fk_rewrite *g_rw;

/* run_cell with the policy `policy` (NULL: none) and its options name=value. */
static int run_cell_evict(const char *codec, const char *policy, const char *const *kv,
                          struct fk_trace **tr, int n_tr, const struct fk_dict *dict, int jobs,
                          struct fk_cell_result *res)
{
    const struct fk_codec_ops *ops = fk_codec_find(codec);
    ck_assert_ptr_nonnull(ops);
    void *o = calloc(1, ops->opts_size);
    fk_opts_defaults(ops, o);
    const char *set[][2] = {{"n_b", "16"}, {"group", "8"}, {"residual", "16"}, {"n", "32"}};
    for (size_t i = 0; i < sizeof set / sizeof set[0]; i++) {
        const struct fk_option *opt = fk_codec_option(ops, set[i][0]);
        if (opt)
            ck_assert_int_eq(fk_opts_set(ops, o, opt, atof(set[i][1])), FK_OK);
    }
    const struct fk_evict_ops *ev = policy ? fk_evict_find(policy) : NULL;
    void *eo = ev ? calloc(1, ev->opts_size) : NULL;
    if (ev)
        fk_evict_opts_defaults(ev, eo);
    for (int i = 0; ev && kv && kv[i]; i += 2) {
        const struct fk_option *opt = fk_evict_option(ev, kv[i]);
        ck_assert_msg(opt != NULL, "%s has no option %s", policy, kv[i]);
        ck_assert_int_eq(fk_evict_opts_set(ev, eo, opt, atof(kv[i + 1])), FK_OK);
    }
    struct fk_cell_input in = {.ops = ops, .opts = o, .traces = tr, .n_traces = n_tr,
                               .dict = dict, .evict = ev, .evict_opts = eo, .rewrite = g_rw};
    struct fk_replay_opts ro = {.jobs = jobs, .attention = 1, .attn_stride = 3};
    int rc = fk_replay_cell(&in, &ro, res);
    free(o);
    free(eo);
    return rc;
}

/* The eviction tests' data: 2 layers, 6/2 heads, head_dim 16, 70 tokens (40 prefill), and a
 * 64-atom dictionary, written under the name `tag`. */
static void evict_fixture(const char *tag, struct fk_trace **tr, struct fk_dict **d)
{
    char p1[512], pd[512];
    snprintf(p1, sizeof p1, "%s/%s.h5", tmpdir, tag);
    snprintf(pd, sizeof pd, "%s/%s-dict.h5", tmpdir, tag);
    make_trace(p1, 2, 6, 2, 16, 70, 40);
    make_dict(pd, 2, 64, 16);
    ck_assert_int_eq(fk_trace_open(p1, tr), FK_OK);
    ck_assert_int_eq(fk_dict_load(pd, d), FK_OK);
}

/* A budget that keeps every token gives exactly the numbers without a policy (full: cos 1,
 * KL 0), for every policy over full, kivi, lexico and uniform; a policy cell is the same at
 * any --jobs. */
START_TEST(test_evict_keep_all)
{
    struct fk_trace *tr;
    struct fk_dict *d;
    evict_fixture("ev1", &tr, &d);
    static const char *const keep_all[][6] = {
        {"snapkv", "budget", "1000", "window", "8"}, {"h2o", "heavy", "1000", NULL, NULL},
        {"streaming", "recent", "1000", NULL, NULL}, {"scope", "decode_budget", "1000", NULL, NULL},
        {"momentum", "decode_budget", "1000", NULL, NULL}, {"knorm", "budget", "1000", NULL, NULL},
    };
    const char *codecs[] = {"full", "kivi", "lexico", "uniform"};
    for (size_t c = 0; c < 4; c++) {
        const struct fk_dict *dd = (fk_codec_find(codecs[c])->caps & FK_CAP_DICT) ? d : NULL;
        struct fk_cell_result r0;
        ck_assert_int_eq(run_cell_evict(codecs[c], NULL, NULL, &tr, 1, dd, 1, &r0), FK_OK);
        for (size_t p = 0; p < sizeof keep_all / sizeof keep_all[0]; p++) {
            struct fk_cell_result r1;
            ck_assert_msg(run_cell_evict(codecs[c], keep_all[p][0], keep_all[p] + 1, &tr, 1,
                                         dd, 1 + (int)(p % 2), &r1) == FK_OK,
                          "%s+%s: %s", codecs[c], keep_all[p][0], fk_errmsg());
            assert_same(&r0, &r1);
            for (int l = 0; l < 2; l++) {
                for (int k = 0; k < 2; k++) {
                    const struct fk_stream_result *x = fk_cell_stream(&r0, 0, l, k);
                    const struct fk_stream_result *y = fk_cell_stream(&r1, 0, l, k);
                    ck_assert_int_eq(y->n_kept, 2 * 70);
                    double bx = x->st.bytes_codes + x->bytes_buf, by = y->st.bytes_codes + y->bytes_buf;
                    ck_assert_msg(fabs(bx - by) <= 1e-9 * bx, "%s+%s bytes %.17g vs %.17g",
                                  codecs[c], keep_all[p][0], bx, by);
                    ck_assert_msg(fabs(x->bytes_tok_avg - y->bytes_tok_avg) <= 1e-9 * x->bytes_tok_avg,
                                  "%s+%s: time-averaged bytes %.17g vs %.17g", codecs[c],
                                  keep_all[p][0], x->bytes_tok_avg, y->bytes_tok_avg);
                }
                const struct fk_attn_acc *a = &r1.attn[l];
                ck_assert(a->retained_sum == a->n); /* every key retained, exactly */
                if (!strcmp(codecs[c], "full"))
                    ck_assert(a->cos_sum == a->n && a->kl_sum == 0 && a->rkl_sum == 0);
            }
            fk_cell_result_free(&r1);
        }
        fk_cell_result_free(&r0);
    }
    fk_dict_free(&d);
    fk_trace_close(&tr);
}
END_TEST

/* Bytes under eviction against a count written here: the full codec with StreamingLLM keeps
 * min(t + 1, sinks + recent) rows per head, 2 m bytes each; the kept rows and the retained
 * fraction at the end; the same cell at 1 and 2 jobs. */
START_TEST(test_evict_bytes)
{
    char p1[512];
    snprintf(p1, sizeof p1, "%s/evb.h5", tmpdir);
    int T = 60, P = 30, H = 2, m = 16, keep = 3 + 9;
    make_trace(p1, 2, 6, H, m, T, P);
    struct fk_trace *tr;
    ck_assert_int_eq(fk_trace_open(p1, &tr), FK_OK);
    const char *kv[] = {"sinks", "3", "recent", "9", NULL};
    struct fk_cell_result r, r2;
    ck_assert_int_eq(run_cell_evict("full", "streaming", kv, &tr, 1, NULL, 1, &r), FK_OK);
    ck_assert_int_eq(run_cell_evict("full", "streaming", kv, &tr, 1, NULL, 2, &r2), FK_OK);
    assert_same(&r, &r2);
    double avg = 0;
    for (int t = P; t < T; t++)
        avg += (double)H * keep * 2 * m / (t + 1);
    avg /= T - P;
    for (int l = 0; l < 2; l++)
        for (int k = 0; k < 2; k++) {
            const struct fk_stream_result *s = fk_cell_stream(&r, 0, l, k);
            ck_assert_int_eq(s->n_kept, H * keep);
            ck_assert(s->st.bytes_codes + s->bytes_buf == (double)H * keep * 2 * m);
            ck_assert_msg(fabs(s->bytes_tok_avg - avg) <= 1e-12 * avg, "avg %.17g, want %.17g",
                          s->bytes_tok_avg, avg);
            /* the error means cover the retained coded rows only: the sinks (the window is
             * in the buffer) */
            ck_assert_int_eq(s->n_vectors + s->n_zero, H * 3);
            const struct fk_attn_acc *a = &r.attn[l];
            ck_assert(a->n > 0 && isnan(a->kl_sum) && a->retained_sum < a->n);
        }
    fk_cell_result_free(&r);
    fk_cell_result_free(&r2);
    fk_trace_close(&tr);
}
END_TEST

/* ---- the prefill's row rewrites (core/fk_rewrite.h) through the engine ------------------ */

static struct fk_rewrite rw_defaults(void)
{
    struct fk_rewrite rw;
    struct fk_codec_ops as = {.options = fk_rewrite_options, .opts_size = sizeof rw};
    fk_opts_defaults(&as, &rw);
    return rw;
}

/* Rewrites that change nothing (merge none, think 0) give the numbers of no rewrites at
 * all, bit for bit, for full, kivi and uniform, with and without a policy, at 1 and 2 jobs;
 * merging changes the values only: the same kept rows and bytes as the policy alone, other
 * attention numbers. */
START_TEST(test_rewrite_inactive_and_merge)
{
    struct fk_trace *tr;
    struct fk_dict *d;
    evict_fixture("rw1", &tr, &d);
    const char *kv[] = {"ratio", "0.5", "window", "4", NULL};
    struct fk_rewrite idle = rw_defaults();
    const char *codecs[] = {"full", "kivi", "uniform"};
    for (int c = 0; c < 3; c++)
        for (int pol = 0; pol < 2; pol++) {
            struct fk_cell_result r0, r1;
            const char *p = pol ? "snapkv" : NULL;
            g_rw = NULL;
            ck_assert_int_eq(run_cell_evict(codecs[c], p, kv, &tr, 1, NULL, 1, &r0), FK_OK);
            g_rw = &idle;
            ck_assert_msg(run_cell_evict(codecs[c], p, kv, &tr, 1, NULL, 1 + c % 2, &r1) ==
                          FK_OK, "%s: %s", codecs[c], fk_errmsg());
            assert_same(&r0, &r1);
            for (int l = 0; l < 2; l++)
                for (int k = 0; k < 2; k++) {
                    const struct fk_stream_result *x = fk_cell_stream(&r0, 0, l, k);
                    const struct fk_stream_result *y = fk_cell_stream(&r1, 0, l, k);
                    ck_assert(x->st.bytes_codes == y->st.bytes_codes);
                    ck_assert(x->bytes_buf == y->bytes_buf && x->n_kept == y->n_kept);
                    ck_assert(x->bytes_tok_avg == y->bytes_tok_avg);
                }
            fk_cell_result_free(&r0);
            fk_cell_result_free(&r1);
        }
    struct fk_rewrite merge = rw_defaults();
    merge.merge = FK_MERGE_KVPRESS;
    struct fk_cell_result r0, r1;
    g_rw = NULL;
    ck_assert_int_eq(run_cell_evict("full", "snapkv", kv, &tr, 1, NULL, 1, &r0), FK_OK);
    g_rw = &merge;
    ck_assert_int_eq(run_cell_evict("full", "snapkv", kv, &tr, 1, NULL, 2, &r1), FK_OK);
    for (int l = 0; l < 2; l++) {
        for (int k = 0; k < 2; k++) {
            const struct fk_stream_result *x = fk_cell_stream(&r0, 0, l, k);
            const struct fk_stream_result *y = fk_cell_stream(&r1, 0, l, k);
            ck_assert(x->st.bytes_codes + x->bytes_buf == y->st.bytes_codes + y->bytes_buf);
            ck_assert(x->n_kept == y->n_kept && x->n_kept < 2 * 70);
            ck_assert(y->err_sum == 0); /* full stores the merged values exactly */
        }
        const struct fk_attn_acc *a = &r0.attn[l], *b = &r1.attn[l];
        ck_assert(a->n == b->n && a->n > 0);
        ck_assert(a->retained_sum == b->retained_sum); /* the same kept keys */
        ck_assert_msg(a->cos_sum != b->cos_sum, "layer %d: merging changed no output", l);
    }
    fk_cell_result_free(&r0);
    fk_cell_result_free(&r1);
    g_rw = NULL;
    fk_dict_free(&d);
    fk_trace_close(&tr);
}
END_TEST

/* ThinK's bytes against a count written here: full keeps every row; the keys of prompt
 * tokens 0 .. P - recent - 1 of each head are stored with int(m r) channels fewer (2 bytes
 * each), and each (layer, head) adds its channel mask (ceil(m / 8) bytes); the values and
 * the time average as well. With SnapKV the count covers the retained rows only. A codec
 * that would code the zeros (kivi) is refused, and so is merging over h2o. */
START_TEST(test_think_bytes)
{
    char p1[512];
    snprintf(p1, sizeof p1, "%s/thk.h5", tmpdir);
    int T = 60, P = 30, H = 2, m = 16, recent = 8, np = 8, nt = P - recent, mask = 2;
    make_trace(p1, 2, 6, H, m, T, P);
    struct fk_trace *tr;
    ck_assert_int_eq(fk_trace_open(p1, &tr), FK_OK);
    struct fk_rewrite rw = rw_defaults();
    rw.think = 0.5;
    rw.think_window = 10;
    rw.think_recent = recent;
    g_rw = &rw;
    struct fk_cell_result r, r2;
    ck_assert_msg(run_cell_evict("full", NULL, NULL, &tr, 1, NULL, 1, &r) == FK_OK, "%s",
                  fk_errmsg());
    ck_assert_int_eq(run_cell_evict("full", NULL, NULL, &tr, 1, NULL, 2, &r2), FK_OK);
    assert_same(&r, &r2);
    double kbytes = (double)H * (T * m * 2 - nt * 2 * np) + H * mask, avg = 0;
    for (int t = P; t < T; t++)
        avg += ((double)H * ((t + 1) * m * 2 - nt * 2 * np) + H * mask) / (t + 1);
    avg /= T - P;
    for (int l = 0; l < 2; l++) {
        const struct fk_stream_result *k = fk_cell_stream(&r, 0, l, 0);
        const struct fk_stream_result *v = fk_cell_stream(&r, 0, l, 1);
        double kb = k->st.bytes_codes + k->bytes_buf + k->st.bytes_dict_seq;
        ck_assert_msg(kb == kbytes, "layer %d: K bytes %.17g, want %.17g", l, kb, kbytes);
        ck_assert(v->st.bytes_codes + v->bytes_buf + v->st.bytes_dict_seq ==
                  (double)H * T * m * 2);
        ck_assert_msg(fabs(k->bytes_tok_avg - avg) <= 1e-12 * avg, "avg %.17g, want %.17g",
                      k->bytes_tok_avg, avg);
        const struct fk_attn_acc *a = &r.attn[l];
        ck_assert(a->n > 0 && a->retained_sum == a->n);
        ck_assert(a->kl_sum > 0 && isfinite(a->kl_sum) && a->cos_sum < a->n);
    }
    fk_cell_result_free(&r);
    fk_cell_result_free(&r2);
    /* a prompt within think_recent prunes nothing: the plain cell's numbers and bytes (no
     * mask charged), bit for bit */
    rw.think_recent = P;
    ck_assert_int_eq(run_cell_evict("full", NULL, NULL, &tr, 1, NULL, 1, &r), FK_OK);
    g_rw = NULL;
    ck_assert_int_eq(run_cell_evict("full", NULL, NULL, &tr, 1, NULL, 1, &r2), FK_OK);
    assert_same(&r, &r2);
    for (int l = 0; l < 2; l++) {
        const struct fk_stream_result *a = fk_cell_stream(&r, 0, l, 0);
        const struct fk_stream_result *b = fk_cell_stream(&r2, 0, l, 0);
        ck_assert(a->st.bytes_codes + a->bytes_buf + a->st.bytes_dict_seq ==
                  b->st.bytes_codes + b->bytes_buf + b->st.bytes_dict_seq);
        ck_assert(a->bytes_tok_avg == b->bytes_tok_avg);
        ck_assert(r.attn[l].n == r2.attn[l].n);
    }
    fk_cell_result_free(&r);
    fk_cell_result_free(&r2);
    g_rw = &rw;
    rw.think_recent = recent;
    /* over SnapKV keeping 15 of 30 prompt tokens (window 8): the retained pruned rows */
    const char *kv[] = {"budget", "15", "window", "8", NULL};
    ck_assert_int_eq(run_cell_evict("full", "snapkv", kv, &tr, 1, NULL, 1, &r), FK_OK);
    for (int l = 0; l < 2; l++) {
        const struct fk_stream_result *k = fk_cell_stream(&r, 0, l, 0);
        /* kept: 15 prompt tokens per head: the window, tokens 22..29 = the think_recent
         * ones (nt = 22), whole, and 7 of tokens 0..21, pruned */
        double want = (double)H * ((15 + T - P) * m * 2 - 7 * 2 * np) + H * mask;
        ck_assert_int_eq(k->n_kept, H * (15 + T - P));
        ck_assert_msg(k->st.bytes_codes + k->bytes_buf + k->st.bytes_dict_seq == want,
                      "layer %d: %.17g, want %.17g", l,
                      k->st.bytes_codes + k->bytes_buf + k->st.bytes_dict_seq, want);
    }
    fk_cell_result_free(&r);
    /* refusals, before any cell */
    const struct fk_codec_ops *kivi = fk_codec_find("kivi");
    void *ko = calloc(1, kivi->opts_size);
    fk_opts_defaults(kivi, ko);
    struct fk_cell_input in = {.ops = kivi, .opts = ko, .traces = &tr, .n_traces = 1,
                               .rewrite = &rw};
    ck_assert_int_eq(fk_replay_check_evict(&in), FK_ECONFIG);
    ck_assert_ptr_nonnull(strstr(fk_errmsg(), "kivi"));
    free(ko);
    struct fk_rewrite mg = rw_defaults();
    mg.merge = FK_MERGE_KVPRESS;
    g_rw = &mg;
    const char *h2o[] = {"heavy", "4", "recent", "4", NULL};
    ck_assert_int_eq(run_cell_evict("full", "h2o", h2o, &tr, 1, NULL, 1, &r), FK_ECONFIG);
    ck_assert_ptr_nonnull(strstr(fk_errmsg(), "h2o"));
    g_rw = NULL;
    fk_trace_close(&tr);
}
END_TEST

/* Refused before any cell, with messages naming what is missing. */
/* A codec that skips dropped tokens (FK_CAP_SKIPS) is handed exactly the rows the policy
 * still keeps when their turn comes, in token order: against the set derived here from
 * StreamingLLM's rule (sinks + the `recent` newest tokens) and the buffer rule (n_b exact
 * tokens, a_len 1: token j is due at the prefill's end when j < P - n_b, else at token
 * j + n_b); a codec without the capability still gets every row. */
enum { SK_T = 60, SK_P = 30, SK_H = 2, SK_NB = 8, SK_SINKS = 2 };
static int skip_seen[2][SK_H][SK_T]; /* [kind][head][token] times coded */
static int skip_order_ok;
struct skip_probe {
    int kind, m, last[SK_H];
};
static int skip_open(const void *o, const struct fk_stream_env *env, void **st)
{
    (void)o;
    struct skip_probe *p = calloc(1, sizeof *p);
    p->kind = env->kind;
    p->m = env->head_dim;
    for (int h = 0; h < SK_H; h++)
        p->last[h] = -1;
    *st = p;
    return FK_OK;
}
static int skip_encode(void *st, const struct fk_event *ev, struct fk_vec_out *out)
{
    struct skip_probe *p = st;
    for (int i = 0; i < ev->n; i++) {
        int h = ev->head[i], t = ev->token[i];
        if (t <= p->last[h])
            skip_order_ok = 0;
        p->last[h] = t;
        skip_seen[p->kind][h][t]++;
        out[i] = (struct fk_vec_out){.err = 0, .err_enc = 0, .nnz = 1};
    }
    return FK_OK;
}
static int skip_reconstruct(const void *st, int h, int t, float *out)
{
    const struct skip_probe *p = st;
    ck_assert_int_gt(skip_seen[p->kind][h][t], 0); /* never asked for a skipped row */
    memset(out, 0, sizeof(float) * (size_t)p->m);
    return FK_OK;
}
static const struct fk_codec_ops skip_ops = {
    .name = "skip-probe", .summary = "test probe skipping dropped rows",
    .opts_size = sizeof(struct probe_opts), .options = probe_options,
    .caps = FK_CAP_SKIPS | FK_CAP_ADAPTS, .open = skip_open, .encode = skip_encode,
    .reconstruct = skip_reconstruct, .stats = probe_stats, .close = probe_close,
};

START_TEST(test_evict_skips)
{
    char path[512];
    snprintf(path, sizeof path, "%s/skips.h5", tmpdir);
    make_trace(path, 1, 4, SK_H, 8, SK_T, SK_P);
    struct fk_trace *tr;
    ck_assert_int_eq(fk_trace_open(path, &tr), FK_OK);
    const struct fk_evict_ops *ev = fk_evict_find("streaming");
    void *eo = calloc(1, ev->opts_size);
    fk_evict_opts_defaults(ev, eo);
    ck_assert_int_eq(fk_evict_opts_set(ev, eo, fk_evict_option(ev, "sinks"), SK_SINKS), FK_OK);
    const int recents[] = {5, 10};
    for (int c = 0; c < 4; c++) {
        int recent = recents[c % 2], skips = c < 2;
        ck_assert_int_eq(fk_evict_opts_set(ev, eo, fk_evict_option(ev, "recent"), recent),
                         FK_OK);
        const struct fk_codec_ops *ops = skips ? &skip_ops : &probe_ops;
        struct probe_opts o;
        fk_opts_defaults(ops, &o);
        o.c.n_b = SK_NB;
        o.c.a_len = 1;
        memset(skip_seen, 0, sizeof skip_seen);
        skip_order_ok = 1;
        memset(&plog, 0, sizeof plog);
        plog.ok_order = 1;
        struct fk_cell_input in = {.ops = ops, .opts = &o, .traces = &tr, .n_traces = 1,
                                   .evict = ev, .evict_opts = eo};
        struct fk_replay_opts ro = {.jobs = 1, .attention = 1, .attn_stride = 1};
        struct fk_cell_result res;
        ck_assert_msg(fk_replay_cell(&in, &ro, &res) == FK_OK, "%s", fk_errmsg());
        if (!skips) { /* the old contract: every row up to the last due one, in order */
            ck_assert(plog.ok_order);
            int coded = 0;
            for (int e = 0; e < plog.n_ev; e++)
                coded += plog.count[e];
            ck_assert_int_eq(coded, 2 * (SK_T - SK_NB));
            fk_cell_result_free(&res);
            continue;
        }
        ck_assert(skip_order_ok);
        int n_coded = 0;
        for (int j = 0; j < SK_T; j++) {
            int due = j < SK_P - SK_NB ? SK_P - 1 : j + SK_NB; /* the token of its event */
            int kept = due >= SK_T ? 0 : j < SK_SINKS || j >= due + 1 - recent;
            for (int k = 0; k < 2; k++)
                for (int h = 0; h < SK_H; h++) {
                    ck_assert_msg(skip_seen[k][h][j] == kept, "recent %d: %s head %d token %d "
                                  "coded %d times, expected %d", recent, k ? "V" : "K", h, j,
                                  skip_seen[k][h][j], kept);
                    n_coded += kept;
                }
        }
        if (recent > SK_NB) /* the window outlives the buffer: not only the sinks */
            ck_assert_int_gt(n_coded, 4 * SK_SINKS);
        fk_cell_result_free(&res);
    }
    free(eo);
    fk_trace_close(&tr);
}
END_TEST

/* The adaptive dictionary codecs under a policy that drops rows before and after their turn
 * (recent < n_b): every cell finishes (the supports hash, errors and attention read only kept
 * rows; a row a skipping codec never coded is never asked for), the kept count is the
 * policy's, and the numbers are the same at 1 and 2 jobs. */
START_TEST(test_evict_adaptive_codecs)
{
    struct fk_trace *tr;
    struct fk_dict *d;
    evict_fixture("eva", &tr, &d);
    static const char *const pol[][6] = {
        {"streaming", "sinks", "2", "recent", "5"}, {"h2o", "heavy", "4", "recent", "4"},
        {"scope", "decode_budget", "8", "recent", "4"}, {"snapkv", "window", "4", "budget", "9"},
    };
    const int kept_end[] = {7, 9, 40 + 8, 9 + 30}; /* per head at the last token */
    const char *codecs[] = {"lexico-adp", "gm", "pl", "fadkv"};
    for (size_t c = 0; c < 4; c++)
        for (size_t p = 0; p < 4; p++) {
            struct fk_cell_result r1, r2;
            ck_assert_msg(run_cell_evict(codecs[c], pol[p][0], pol[p] + 1, &tr, 1, d, 1, &r1) ==
                              FK_OK, "%s+%s: %s", codecs[c], pol[p][0], fk_errmsg());
            ck_assert_msg(run_cell_evict(codecs[c], pol[p][0], pol[p] + 1, &tr, 1, d, 2, &r2) ==
                              FK_OK, "%s+%s at 2 jobs: %s", codecs[c], pol[p][0], fk_errmsg());
            assert_same(&r1, &r2);
            for (int l = 0; l < 2; l++)
                for (int k = 0; k < 2; k++) {
                    const struct fk_stream_result *x = fk_cell_stream(&r1, 0, l, k);
                    ck_assert_msg(x->n_kept == 2 * kept_end[p], "%s+%s: %ld kept, expected %d",
                                  codecs[c], pol[p][0], x->n_kept, 2 * kept_end[p]);
                    ck_assert(x->n_vectors > 0 && isfinite(x->err_sum));
                }
            fk_cell_result_free(&r1);
            fk_cell_result_free(&r2);
        }
    fk_dict_free(&d);
    fk_trace_close(&tr);
}
END_TEST

START_TEST(test_evict_refusals)
{
    char p1[512], p2[512];
    snprintf(p1, sizeof p1, "%s/evr.h5", tmpdir);
    make_trace(p1, 1, 4, 2, 16, 40, 20);
    snprintf(p2, sizeof p2, "%s/evr-noq.h5", tmpdir);
    {
        /* a trace without queries */
        struct fk_trace_info in = {.n_layers = 1, .n_q_heads = 4, .n_kv_heads = 2,
                                   .head_dim = 16, .n_tokens = 40, .prompt_len = 20,
                                   .keys_post_rope = 1, .rope_theta = 10000};
        snprintf(in.model_id, sizeof in.model_id, "test");
        snprintf(in.source, sizeof in.source, "synthetic");
        struct fk_trace_writer *w;
        ck_assert_int_eq(fk_trace_create(p2, &in, FK_ENC_F32, &w), FK_OK);
        int32_t pos[40];
        uint8_t ph[40];
        for (int t = 0; t < 40; t++) {
            pos[t] = t;
            ph[t] = t >= 20;
        }
        ck_assert_int_eq(fk_trace_write_tokens(w, pos, ph, NULL), FK_OK);
        float buf[2 * 40 * 16];
        for (int i = 0; i < 2 * 40 * 16; i++)
            buf[i] = nrand();
        for (int k = 0; k < 2; k++)
            ck_assert_int_eq(fk_trace_write_layer(w, 0, k, buf, NULL), FK_OK);
        ck_assert_int_eq(fk_trace_finish(&w), FK_OK);
    }
    struct fk_trace *tq, *tn;
    ck_assert_int_eq(fk_trace_open(p1, &tq), FK_OK);
    ck_assert_int_eq(fk_trace_open(p2, &tn), FK_OK);
    const struct fk_evict_ops *h2o = fk_evict_find("h2o");
    void *eo = calloc(1, h2o->opts_size);
    fk_evict_opts_defaults(h2o, eo);
    const struct fk_codec_ops *full = fk_codec_find("full");
    void *o = calloc(1, full->opts_size);
    fk_opts_defaults(full, o);
    struct fk_cell_input in = {.ops = full, .opts = o, .traces = &tn, .n_traces = 1,
                               .evict = h2o, .evict_opts = eo};
    ck_assert_int_eq(fk_replay_check_evict(&in), FK_ECONFIG);
    ck_assert_msg(strstr(fk_errmsg(), "evr-noq.h5") && strstr(fk_errmsg(), "no queries") &&
                  strstr(fk_errmsg(), "h2o"), "%s", fk_errmsg());
    /* a policy that reads no query runs on it */
    in.evict = fk_evict_find("streaming");
    void *so = calloc(1, in.evict->opts_size);
    fk_evict_opts_defaults(in.evict, so);
    in.evict_opts = so;
    ck_assert_int_eq(fk_replay_check_evict(&in), FK_OK);
    /* a codec that adapts from every coded row and cannot skip dropped ones cannot store a
     * kept set exactly; the dictionary codecs skip them */
    struct fk_codec_ops adapts = skip_ops;
    adapts.name = "adapts-probe";
    adapts.caps = FK_CAP_ADAPTS;
    in.ops = &adapts;
    ck_assert_int_eq(fk_replay_check_evict(&in), FK_ECONFIG);
    ck_assert_ptr_nonnull(strstr(fk_errmsg(), "adapts-probe"));
    const char *skippers[] = {"lexico-adp", "gm", "pl", "fadkv"};
    for (int c = 0; c < 4; c++) {
        in.ops = fk_codec_find(skippers[c]);
        ck_assert_msg(fk_replay_check_evict(&in) == FK_OK, "%s: %s", skippers[c], fk_errmsg());
    }
    /* queries present: fine */
    in.ops = full;
    in.traces = &tq;
    in.evict = h2o;
    in.evict_opts = eo;
    ck_assert_int_eq(fk_replay_check_evict(&in), FK_OK);
    free(eo);
    free(so);
    free(o);
    fk_trace_close(&tq);
    fk_trace_close(&tn);
}
END_TEST


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
    train_test_basis((char *[]){p1, p2}, 2);
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
        train_test_basis((char *[]){p32}, 1);
        ck_assert_int_eq(fk_trace_encoding(t16, 1, FK_KIND_V, &got), FK_OK);
        ck_assert_int_eq(got, encs[e]);
        for (int c = 0; fk_codecs[c]; c++) {
            struct fk_cell_result r1, r2;
            const struct fk_dict *dd = (fk_codecs[c]->caps & FK_CAP_DICT) ? d : NULL;
            run_cell(fk_codecs[c]->name, &t32, 1, dd, 1, 1, &r1);
            run_cell(fk_codecs[c]->name, &t16, 1, dd, 2, 1, &r2);
            ck_assert_msg(r1.attn[0].n > 0, "%s: no attention rows", fk_codecs[c]->name);
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
    /* the correlation profile holds min(256, N) = 32 filled entries (no zero padding), the
     * sorted |D^T x| / max: 1 first, non-increasing, positive; the cell file stores 32 */
    struct fk_cell_series h;
    ck_assert_int_eq(fk_store_series_open(out, m.id, &h), FK_OK);
    for (int i = 0; i < 4; i++) {
        const struct fk_stream_result *st = fk_cell_stream(&r, 0, i / 2, i % 2);
        ck_assert_ptr_nonnull(st->corr_profile);
        ck_assert_int_eq(st->corr_len, 32);
        ck_assert_double_eq_tol(st->corr_profile[0], 1, 1e-12);
        for (int q = 1; q < 32; q++)
            ck_assert(st->corr_profile[q] <= st->corr_profile[q - 1] + 1e-12);
        ck_assert(st->corr_profile[31] > 0);
        double *v;
        int nv;
        ck_assert_int_eq(fk_store_series_read(&h, 0, i / 2, i % 2, "corr_profile", &v, &nv),
                         FK_OK);
        ck_assert_int_eq(nv, 32);
        ck_assert(v[31] == st->corr_profile[31]);
        free(v);
    }
    fk_store_series_close(&h);
    char csv[600];
    snprintf(csv, sizeof csv, "%s/cells.csv", out);
    ck_assert_int_eq(access(csv, F_OK), 0);
    snprintf(csv, sizeof csv, "%s/cells.csv.tmp", out);
    ck_assert_int_ne(access(csv, F_OK), 0); /* nothing half-written left behind */
    /* err_ratio is a ratio of means over the cell's recall vectors: the sum of the
     * screened-OMP errors over the sum of the full-OMP errors of every stream, not the mean
     * of per-stream ratios (which one stream with a near-zero OMP error dominates); the
     * sums as the recall observer leaves them, stream (L0, K) with a ratio of 1000 */
    static const double omp[4] = {0.001, 2.0, 3.0, 4.0}, scr[4] = {1.0, 2.2, 3.3, 4.4};
    double so = 0, ss = 0, mean_of_ratios = 0;
    for (int i = 0; i < 4; i++) {
        struct fk_stream_result *st = fk_cell_stream(&r, 0, i / 2, i % 2);
        st->screen_err_omp = omp[i];
        st->screen_err_scr = scr[i];
        st->err_ratio = scr[i] / omp[i];
        so += omp[i];
        ss += scr[i];
        mean_of_ratios += scr[i] / omp[i] / 4;
    }
    struct fk_cell_meta m2 = m;
    snprintf(m2.id, sizeof m2.id, "00000000000000e7");
    m2.repeat = 3;
    ck_assert_int_eq(fk_results_commit(out, &m2, &r), FK_OK);
    const char *ids2[2] = {m.id, m2.id};
    ck_assert_int_eq(fk_results_tables(out, ids2, 2, NULL), FK_OK);
    struct fk_csv c;
    snprintf(csv, sizeof csv, "%s/cells.csv", out);
    ck_assert_int_eq(fk_csv_load(csv, &c), FK_OK);
    ck_assert_int_eq(c.n_rows, 2);
    double ratio = fk_csv_num(&c, 1, fk_csv_col(&c, "err_ratio"));
    ck_assert_double_eq_tol(ratio, ss / so, 1e-8);          /* 10.9 / 9.001 = 1.211 */
    ck_assert(fabs(ratio - mean_of_ratios) > 100);          /* not 250.8 */
    ck_assert_str_eq(fk_csv_str(&c, 0, fk_csv_col(&c, "repeat")), "0");
    ck_assert_str_eq(fk_csv_str(&c, 1, fk_csv_col(&c, "repeat")), "3");
    fk_csv_free(&c);
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
     * run, of the largest N seen since the last release; none after gm. A worker may find
     * every layer taken before it starts (its slot keeps what it held, maybe nothing): at
     * least one slot holds the largest buffers, at most every slot does. */
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
        size_t got = fk_replay_pool_bytes(pool);
        ck_assert_msg(held[i] ? got >= held[i] / 2 && got <= held[i] : got == 0,
                      "after cell %zu (%s, %d jobs): the pool holds %zu bytes, expected %zu "
                      "(or half of it)", i, seq[i].codec, seq[i].jobs, got, held[i]);
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

/* ---- a codec that fails on demand: every opened state must be closed ------------------ */

static atomic_int flaky_opens, flaky_closes, flaky_encodes, flaky_recons;
static int flaky_fail_open, flaky_fail_encode, flaky_fail_recon; /* 1-based call, 0: never */
struct flaky {
    int m;
    float *payload; /* something for the leak checker to find if a state is not closed */
};
static int flaky_open(const void *o, const struct fk_stream_env *env, void **st)
{
    (void)o;
    int n = atomic_fetch_add(&flaky_opens, 1) + 1;
    if (n == flaky_fail_open)
        return fk_err(FK_ENOMEM, "flaky: open call %d refused", n);
    struct flaky *f = calloc(1, sizeof *f);
    f->m = env->head_dim;
    f->payload = calloc(1024, sizeof(float));
    *st = f;
    return FK_OK;
}
static int flaky_encode(void *st, const struct fk_event *ev, struct fk_vec_out *out)
{
    (void)st;
    int n = atomic_fetch_add(&flaky_encodes, 1) + 1;
    if (n == flaky_fail_encode)
        return fk_err(FK_EINVAL, "flaky: encode call %d refused", n);
    for (int i = 0; i < ev->n; i++)
        out[i] = (struct fk_vec_out){.nnz = 1};
    return FK_OK;
}
static int flaky_reconstruct(const void *st, int h, int t, float *out)
{
    (void)h, (void)t;
    int n = atomic_fetch_add(&flaky_recons, 1) + 1;
    if (n == flaky_fail_recon)
        return fk_err(FK_ECORRUPT, "flaky: reconstruct call %d refused", n);
    memset(out, 0, sizeof(float) * (size_t)((const struct flaky *)st)->m);
    return FK_OK;
}
static void flaky_close(void *st)
{
    struct flaky *f = st;
    if (!f)
        return;
    atomic_fetch_add(&flaky_closes, 1);
    free(f->payload);
    free(f);
}
static const struct fk_codec_ops flaky_ops = {
    .name = "flaky", .summary = "fails on demand", .opts_size = sizeof(struct probe_opts),
    .options = probe_options, .open = flaky_open, .encode = flaky_encode,
    .reconstruct = flaky_reconstruct, .stats = probe_stats, .close = flaky_close,
};

/* One cell with the flaky codec; returns its result code. */
static int run_flaky(struct fk_trace *tr, int jobs, int fail_open, int fail_encode,
                     int fail_recon)
{
    struct probe_opts o;
    fk_opts_defaults(&flaky_ops, &o);
    o.c.n_b = 4;
    o.c.a_len = 2;
    atomic_store(&flaky_opens, 0);
    atomic_store(&flaky_closes, 0);
    atomic_store(&flaky_encodes, 0);
    atomic_store(&flaky_recons, 0);
    flaky_fail_open = fail_open;
    flaky_fail_encode = fail_encode;
    flaky_fail_recon = fail_recon;
    struct fk_cell_input in = {.ops = &flaky_ops, .opts = &o, .traces = &tr, .n_traces = 1};
    struct fk_replay_opts ro = {.jobs = jobs, .attention = 1, .attn_stride = 2,
                                .recall_every = 8};
    struct fk_cell_result res;
    int rc = fk_replay_cell(&in, &ro, &res);
    /* a failed cell leaves nothing to free; a state that opened was closed */
    if (rc < 0)
        ck_assert_ptr_null(res.streams);
    fk_cell_result_free(&res);
    int failed_opens = fail_open > 0 && fail_open <= atomic_load(&flaky_opens);
    ck_assert_msg(atomic_load(&flaky_closes) == atomic_load(&flaky_opens) - failed_opens,
                  "open %d fail %d/%d/%d: %d states opened, %d closed", fail_open,
                  fail_encode, fail_recon, jobs, atomic_load(&flaky_opens) - failed_opens,
                  atomic_load(&flaky_closes));
    return rc;
}

/* A codec whose open() fails for the V stream (or any later open), whose encode() or
 * reconstruct() fails on the N-th call: the error comes back with its message, and every
 * state that did open is closed (under ASan with detect_leaks=1 a leaked state also fails
 * the run through its payload). */
START_TEST(test_codec_failures)
{
    char path[512];
    snprintf(path, sizeof path, "%s/flaky.h5", tmpdir);
    make_trace(path, 3, 2, 2, 4, 30, 12);
    struct fk_trace *tr;
    ck_assert_int_eq(fk_trace_open(path, &tr), FK_OK);
    for (int jobs = 1; jobs <= 2; jobs++) {
        ck_assert_int_eq(run_flaky(tr, jobs, 0, 0, 0), FK_OK);
        ck_assert_int_eq(atomic_load(&flaky_opens), 6); /* 3 layers, K and V */
        for (int n = 1; n <= 6; n++) { /* n = 2: the V stream of the first layer */
            ck_assert_int_eq(run_flaky(tr, jobs, n, 0, 0), FK_ENOMEM);
            ck_assert_ptr_nonnull(strstr(fk_errmsg(), "opening codec flaky"));
            ck_assert_ptr_nonnull(strstr(fk_errmsg(), "refused"));
        }
        for (int n = 1; n <= 7; n += 3) {
            ck_assert_int_eq(run_flaky(tr, jobs, 0, n, 0), FK_EINVAL);
            /* the message names the trace, the layer, the kind and the codec */
            ck_assert_msg(strstr(fk_errmsg(), "flaky.h5: layer ") &&
                              strstr(fk_errmsg(), ": codec flaky, "), "%s", fk_errmsg());
        }
        for (int n = 1; n <= 200; n += 99) /* attention, then the final error */
            ck_assert_int_eq(run_flaky(tr, jobs, 0, 0, n), FK_ECORRUPT);
    }
    fk_trace_close(&tr);
}
END_TEST

/* ---- a sparse codec without a dictionary: its atoms are the m x m identity ------------ */

#define IDS_S 3
struct ids {
    int H, T, m;
    float *atoms;             /* [m][m] identity */
    int32_t *nnz;             /* [H][T] */
    int32_t *idx;             /* [H][T][IDS_S] */
    float *coef;              /* [H][T][IDS_S] exact coordinates */
};
static int ids_open(const void *o, const struct fk_stream_env *env, void **st)
{
    (void)o;
    struct ids *p = calloc(1, sizeof *p);
    p->H = env->n_heads;
    p->T = env->n_tokens;
    p->m = env->head_dim;
    size_t rows = (size_t)p->H * p->T;
    p->atoms = calloc((size_t)p->m * p->m, sizeof(float));
    p->nnz = calloc(rows, sizeof(int32_t));
    p->idx = calloc(rows * IDS_S, sizeof(int32_t));
    p->coef = calloc(rows * IDS_S, sizeof(float));
    for (int j = 0; j < p->m; j++)
        p->atoms[(size_t)j * p->m + j] = 1;
    *st = p;
    return FK_OK;
}
/* keeps the IDS_S largest-magnitude coordinates (ties: the lower index) */
static int ids_encode(void *st, const struct fk_event *ev, struct fk_vec_out *out)
{
    struct ids *p = st;
    for (int i = 0; i < ev->n; i++) {
        const float *x = ev->x + (size_t)i * p->m;
        size_t row = (size_t)ev->head[i] * p->T + ev->token[i];
        int32_t *id = p->idx + row * IDS_S;
        float *cf = p->coef + row * IDS_S;
        int k = 0;
        double xx = 0, kept = 0;
        for (int c = 0; c < p->m; c++) {
            xx += (double)x[c] * x[c];
            int pos = k < IDS_S ? k++ : IDS_S;
            while (pos > 0 && fabsf(x[c]) > fabsf(x[id[pos - 1]])) {
                if (pos < IDS_S)
                    id[pos] = id[pos - 1];
                pos--;
            }
            if (pos < IDS_S)
                id[pos] = c;
        }
        for (int e = 0; e < k; e++) {
            cf[e] = x[id[e]];
            kept += (double)cf[e] * cf[e];
        }
        p->nnz[row] = k;
        float err = xx > 0 ? (float)sqrt((xx - kept) / xx) : 0;
        out[i] = (struct fk_vec_out){.err = err, .err_enc = err, .nnz = k};
    }
    return FK_OK;
}
static int ids_reconstruct(const void *st, int h, int t, float *out)
{
    const struct ids *p = st;
    size_t row = (size_t)h * p->T + t;
    memset(out, 0, sizeof(float) * (size_t)p->m);
    for (int e = 0; e < p->nnz[row]; e++)
        out[p->idx[row * IDS_S + e]] = p->coef[row * IDS_S + e];
    return FK_OK;
}
static int ids_sparse_row(const void *st, int h, int t, int *nnz, const int32_t **idx,
                          const float **coef)
{
    const struct ids *p = st;
    size_t row = (size_t)h * p->T + t;
    *nnz = p->nnz[row];
    *idx = p->idx + row * IDS_S;
    *coef = p->coef + row * IDS_S;
    return FK_OK;
}
static const float *ids_atoms(const void *st, int *n_atoms)
{
    const struct ids *p = st;
    *n_atoms = p->m;
    return p->atoms;
}
static void ids_stats(const void *st, struct fk_stream_stats *s)
{
    memset(s, 0, sizeof *s);
    s->n_atoms = ((const struct ids *)st)->m;
}
static void ids_close(void *st)
{
    struct ids *p = st;
    if (!p)
        return;
    free(p->atoms);
    free(p->nnz);
    free(p->idx);
    free(p->coef);
    free(p);
}
static const struct fk_codec_ops ids_ops = {
    .name = "idsparse", .summary = "identity atoms", .opts_size = sizeof(struct probe_opts),
    .options = probe_options, .caps = FK_CAP_SPARSE, .open = ids_open, .encode = ids_encode,
    .reconstruct = ids_reconstruct, .sparse_row = ids_sparse_row, .atoms = ids_atoms,
    .stats = ids_stats, .close = ids_close,
};

static int close_rel(double a, double b, double tol)
{
    return isfinite(a) && isfinite(b) && fabs(a - b) <= tol * (fabs(b) > 1 ? fabs(b) : 1);
}

/* The attention of every evaluated step of a layer, straight from fk_attn_eval_naive: a
 * fresh state holding every row, the exact K, V and queries, n_comp from the schedule. */
static void naive_layer_attn_rules(struct fk_trace *tr, int layer, const struct probe_opts *o,
                                   int stride, struct fk_attn_acc *acc, int rk, int rv,
                                   double *bytes_avg);

static void naive_layer_attn(struct fk_trace *tr, int layer, const struct probe_opts *o,
                             int stride, struct fk_attn_acc *acc)
{
    naive_layer_attn_rules(tr, layer, o, stride, acc, 0, 0, NULL);
}

/* Compressed keys and values at each step under KIVI's rules, re-derived token by token:
 * keys flushed in whole blocks of rk (the current token included), values in a sliding
 * window of rv exact tokens (one leaves per step). comp[0..1] are the counts attention sees
 * at step t; kivi_advance moves them past step t. */
static void kivi_prefill(int P, int rk, int rv, int comp[2])
{
    comp[0] = P / rk * rk;
    comp[1] = P > rv ? P - rv : 0;
}
static void kivi_advance(int t, int rk, int rv, int comp[2])
{
    if (t + 1 - comp[0] == rk)
        comp[0] = t + 1;
    if (t - comp[1] >= rv)
        comp[1]++;
}

/* rk > 0: the schedule is KIVI's (kivi_prefill/kivi_advance) instead of o's SLIDE rule, and
 * *bytes_avg (nullable) receives the time average over decode steps of the exact fp16 rows
 * held after each step per token, K plus V (the ids codec's own bytes are 0). */
static void naive_layer_attn_rules(struct fk_trace *tr, int layer, const struct probe_opts *o,
                                   int stride, struct fk_attn_acc *acc, int rk, int rv,
                                   double *bytes_avg)
{
    const struct fk_trace_info *ti = fk_trace_get_info(tr);
    int H = ti->n_kv_heads, Hq = ti->n_q_heads, T = ti->n_tokens, m = ti->head_dim;
    int P = ti->prompt_len;
    float *k = malloc(sizeof(float) * (size_t)H * T * m);
    float *v = malloc(sizeof(float) * (size_t)H * T * m);
    float *q = malloc(sizeof(float) * (size_t)Hq * T * m), *qt = malloc(sizeof(float) * Hq * m);
    ck_assert_int_eq(fk_trace_read(tr, layer, FK_KIND_K, k), FK_OK);
    ck_assert_int_eq(fk_trace_read(tr, layer, FK_KIND_V, v), FK_OK);
    ck_assert_int_eq(fk_trace_read(tr, layer, FK_KIND_Q, q), FK_OK); /* query row t = token t */
    void *st[2];
    struct fk_vec_out *out = malloc(sizeof *out * (size_t)H);
    int32_t tok[64], head[64];
    for (int kind = 0; kind < 2; kind++) {
        struct fk_stream_env env = {.layer = layer, .kind = kind, .head_dim = m, .n_heads = H,
                                    .n_tokens = T};
        ck_assert_int_eq(ids_open(o, &env, &st[kind]), FK_OK);
        float *x = malloc(sizeof(float) * (size_t)H * m);
        for (int t = 0; t < T; t++) { /* a static codec: one token per event is the same */
            for (int h = 0; h < H; h++) {
                memcpy(x + (size_t)h * m, (kind ? v : k) + ((size_t)h * T + t) * m,
                       sizeof(float) * (size_t)m);
                tok[h] = t;
                head[h] = h;
            }
            struct fk_event ev = {.phase = 1, .n = H, .x = x, .token = tok, .head = head};
            ck_assert_int_eq(ids_encode(st[kind], &ev, out), FK_OK);
        }
        free(x);
    }
    struct fk_sched s = {.n_tokens = T, .prompt_len = P, .n_b = o->c.n_b, .a_len = o->c.a_len};
    struct fk_sched_iter it;
    struct fk_sched_event e;
    fk_sched_begin(&it, &s);
    int comp = 0, has = fk_sched_next(&it, &e), kc[2] = {0, 0};
    if (has && e.phase == 0) {
        comp = e.end;
        has = fk_sched_next(&it, &e);
    }
    if (rk > 0)
        kivi_prefill(P, rk, rv, kc);
    double bsum = 0;
    for (int t = P; t < T; t++) {
        int ck = rk > 0 ? kc[0] : comp, cv = rk > 0 ? kc[1] : comp;
        if ((t - P) % stride == 0) {
            for (int h = 0; h < Hq; h++)
                memcpy(qt + (size_t)h * m, q + ((size_t)h * T + t) * m, sizeof(float) * m);
            struct fk_attn_in in = {.m = m, .n_q_heads = Hq, .n_kv_heads = H, .n_tokens = T,
                                    .t = t, .n_comp_k = ck, .n_comp_v = cv, .q = qt, .k = k,
                                    .v = v, .ops = &ids_ops, .kstate = st[0], .vstate = st[1]};
            ck_assert_int_eq(fk_attn_eval_naive(&in, acc), FK_OK);
        }
        if (rk > 0) {
            kivi_advance(t, rk, rv, kc);
            bsum += (double)(2 * (t + 1) - kc[0] - kc[1]) * H * m * 2 / (t + 1);
        } else if (has && e.step == t - P) {
            comp = e.end;
            has = fk_sched_next(&it, &e);
        }
    }
    if (bytes_avg)
        *bytes_avg = T > P ? bsum / (T - P) : NAN;
    ids_close(st[0]);
    ids_close(st[1]);
    free(out), free(k), free(v), free(q), free(qt);
}

/* Attention of a sparse codec with no dictionary: the scratch follows the codec's own atom
 * count (it used to take it from the base dictionary and refuse "key dictionary has 16
 * atoms, scratch holds 1"); the metrics are finite and those of the naive path. */
START_TEST(test_sparse_no_dict_attention)
{
    char path[512];
    snprintf(path, sizeof path, "%s/idsparse.h5", tmpdir);
    make_trace(path, 2, 4, 2, 16, 48, 20);
    struct fk_trace *tr;
    ck_assert_int_eq(fk_trace_open(path, &tr), FK_OK);
    struct probe_opts o;
    fk_opts_defaults(&ids_ops, &o);
    o.c.n_b = 8;
    o.c.a_len = 3;
    const int stride = 2;
    struct fk_cell_input in = {.ops = &ids_ops, .opts = &o, .traces = &tr, .n_traces = 1};
    struct fk_replay_opts ro = {.jobs = 2, .attention = 1, .attn_stride = stride,
                                .recall_every = 8};
    struct fk_cell_result res;
    int rc = fk_replay_cell(&in, &ro, &res);
    ck_assert_msg(rc == FK_OK, "%s", fk_errmsg());
    for (int l = 0; l < 2; l++) {
        const struct fk_attn_acc *a = &res.attn[l];
        struct fk_attn_acc b = {0};
        naive_layer_attn(tr, l, &o, stride, &b);
        ck_assert_int_gt(a->n, 0);
        ck_assert_int_eq(a->n, b.n);
        ck_assert_int_eq(a->skipped_steps, b.skipped_steps);
        ck_assert_msg(close_rel(a->cos_sum, b.cos_sum, 1e-5), "cos %.17g %.17g", a->cos_sum,
                      b.cos_sum);
        ck_assert(close_rel(a->relerr_sum, b.relerr_sum, 1e-4));
        ck_assert(close_rel(a->kl_sum, b.kl_sum, 1e-6));
        ck_assert(close_rel(a->tv_sum, b.tv_sum, 1e-6));
        ck_assert(close_rel(a->mass_sum, b.mass_sum, 1e-9));
        for (int q = 0; q < 3; q++)
            ck_assert(close_rel(a->top_sum[q], b.top_sum[q], 1e-9));
        ck_assert(a->kl_sum > 0 && a->relerr_sum > 0); /* lossy: something was measured */
        for (long i = 0; i < a->n; i++)
            ck_assert(isfinite(a->cos_vals[i]));
        fk_attn_acc_free(&b);
    }
    fk_cell_result_free(&res);
    fk_trace_close(&tr);
}
END_TEST

/* The ids codec with KIVI's buffer rules (keys in blocks of 5, a value window of 7). */
static void ids_kivi_buffer(const void *opts, int kind, struct fk_buffer *b)
{
    (void)opts;
    *b = kind == FK_KIND_K ? (struct fk_buffer){.mode = FK_BUF_BLOCK, .n_b = 5}
                           : (struct fk_buffer){.mode = FK_BUF_SLIDE, .n_b = 7, .a_len = 1};
}

/* A codec whose keys and values follow different buffer rules: attention reads each kind's
 * compressed rows up to its own count (against the naive path with the counts re-derived
 * here), the vectors coded and the exact bytes are each kind's, and the time-averaged
 * bytes are those of the rows held after every step. */
START_TEST(test_buffer_rules)
{
    static const int P_cases[] = {3, 5, 7, 12};
    for (int pc = 0; pc < 4; pc++) {
        int P = P_cases[pc], T = 40;
        char path[512];
        snprintf(path, sizeof path, "%s/rules-%d.h5", tmpdir, P);
        make_trace(path, 2, 4, 2, 16, T, P);
        struct fk_trace *tr;
        ck_assert_int_eq(fk_trace_open(path, &tr), FK_OK);
        struct fk_codec_ops ops = ids_ops;
        ops.buffer = ids_kivi_buffer;
        struct probe_opts o;
        fk_opts_defaults(&ops, &o);
        struct fk_cell_input in = {.ops = &ops, .opts = &o, .traces = &tr, .n_traces = 1};
        struct fk_replay_opts ro = {.jobs = 2, .attention = 1, .attn_stride = 1,
                                    .recall_every = 8};
        struct fk_cell_result res;
        int rc = fk_replay_cell(&in, &ro, &res);
        ck_assert_msg(rc == FK_OK, "%s", fk_errmsg());
        int kc[2];
        kivi_prefill(P, 5, 7, kc);
        for (int t = P; t < T; t++)
            kivi_advance(t, 5, 7, kc);
        for (int l = 0; l < 2; l++) {
            const struct fk_attn_acc *a = &res.attn[l];
            struct fk_attn_acc b = {0};
            double avg = 0;
            naive_layer_attn_rules(tr, l, &o, 1, &b, 5, 7, &avg);
            ck_assert_int_eq(a->n, b.n);
            ck_assert_int_eq(a->skipped_steps, b.skipped_steps);
            ck_assert_msg(close_rel(a->cos_sum, b.cos_sum, 1e-5), "P %d: cos %.17g %.17g", P,
                          a->cos_sum, b.cos_sum);
            ck_assert(close_rel(a->kl_sum, b.kl_sum, 1e-6));
            ck_assert(close_rel(a->mass_sum, b.mass_sum, 1e-9));
            for (int k = 0; k < 2; k++) {
                const struct fk_stream_result *sr = fk_cell_stream(&res, 0, l, k);
                ck_assert_int_eq(sr->n_vectors + sr->n_zero, (long)kc[k] * 2);
                ck_assert(sr->bytes_buf == (double)(T - kc[k]) * 2 * 16 * 2);
            }
            double got = fk_cell_stream(&res, 0, l, 0)->bytes_tok_avg +
                         fk_cell_stream(&res, 0, l, 1)->bytes_tok_avg;
            ck_assert_msg(close_rel(got, avg, 1e-12), "P %d: time-averaged bytes %.17g, "
                          "expected %.17g", P, got, avg);
            fk_attn_acc_free(&b);
        }
        fk_cell_result_free(&res);
        fk_trace_close(&tr);
    }
}
END_TEST

/* ---- observers that merge: two halves of a stream, merged, give the whole -------------- */

START_TEST(test_observer_merge)
{
    const int H = 2, m = 4, n = 6;
    struct probe_opts o;
    fk_opts_defaults(&probe_ops, &o);
    struct fk_replay_opts ro = {.jobs = 1, .attn_stride = 1};
    struct fk_unit_times times = {0};
    struct fk_unit u = {.ops = &probe_ops, .opts = &o, .ro = &ro, .path = "merge",
                        .n_kv_heads = H, .n_q_heads = H, .n_tokens = 8, .prompt_len = 4,
                        .head_dim = m, .times = &times};
    float x[6 * 4];
    int32_t tok[6], head[6];
    struct fk_vec_out out[6];
    for (int i = 0; i < n; i++) {
        for (int c = 0; c < m; c++)
            x[i * m + c] = (float)(i + c) * 0.5f; /* exact in float and double */
        tok[i] = i / H;
        head[i] = i % H;
        out[i] = (struct fk_vec_out){.err = 0.25f * (float)i, .err_enc = 0.125f * (float)i,
                                     .nnz = i, .flags = i == 3 ? FK_VEC_ZERO : 0};
    }
    struct fk_obs_set whole, part[2];
    ck_assert_int_eq(fk_obs_set_create(&whole), FK_OK);
    ck_assert_int_eq(fk_obs_set_create(&part[0]), FK_OK);
    ck_assert_int_eq(fk_obs_set_create(&part[1]), FK_OK);
    int merged = 0;
    for (int j = 0; j < whole.n; j++) {
        const struct fk_observer_ops *ops = whole.ops[j];
        if (!ops->merge)
            continue;
        merged++;
        for (int p = 0; p < 2; p++)
            ck_assert_int_eq(ops->start(part[p].self[j], &u), FK_OK);
        ck_assert_int_eq(ops->start(whole.self[j], &u), FK_OK);
        for (int kind = 0; kind < 2 && ops->on_commit; kind++) {
            /* vectors 0..2 in part 0, 3..5 in part 1, all six in the whole */
            for (int p = 0; p < 2; p++) {
                struct fk_event ev = {.phase = p, .step = p - 1, .n = 3, .x = x + p * 3 * m,
                                      .token = tok + p * 3, .head = head + p * 3};
                struct fk_commit c = {.kind = kind, .ev = &ev, .out = out + p * 3};
                ck_assert_int_eq(ops->on_commit(part[p].self[j], &u, &c), FK_OK);
                ck_assert_int_eq(ops->on_commit(whole.self[j], &u, &c), FK_OK);
            }
        }
        ck_assert_int_eq(ops->merge(part[0].self[j], part[1].self[j]), FK_OK);
        struct fk_stream_result a[2], b[2];
        struct fk_attn_acc aa = {0}, ab = {0};
        memset(a, 0, sizeof a);
        memset(b, 0, sizeof b);
        struct fk_unit_result ra = {.sr = {&a[0], &a[1]}, .attn = &aa};
        struct fk_unit_result rb = {.sr = {&b[0], &b[1]}, .attn = &ab};
        ck_assert_int_eq(ops->on_finish(part[0].self[j], &u, &ra), FK_OK);
        ck_assert_int_eq(ops->on_finish(whole.self[j], &u, &rb), FK_OK);
        ck_assert_msg(memcmp(a, b, sizeof a) == 0, "observer %s: merged halves differ from "
                      "the whole", ops->name);
        ck_assert(aa.n == ab.n && aa.skipped_steps == ab.skipped_steps);
        fk_attn_acc_free(&aa);
        fk_attn_acc_free(&ab);
        if (!strcmp(ops->name, "errors"))
            ck_assert(a[1].n_vectors == 5 && a[1].n_zero == 1 && a[1].n_prefill_coded == 3 &&
                      a[1].err_sum == 0.25 * (0 + 1 + 2 + 4 + 5) && a[1].nnz_sum == 12);
    }
    ck_assert_int_ge(merged, 2); /* errors and attention at least */
    fk_obs_set_free(&whole);
    fk_obs_set_free(&part[0]);
    fk_obs_set_free(&part[1]);
}
END_TEST

static Suite *replay_suite(void)
{
    Suite *s = suite_create("replay");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_schedule);
    tcase_add_test(tc, test_full_exact);
    tcase_add_test(tc, test_evict_keep_all);
    tcase_add_test(tc, test_evict_bytes);
    tcase_add_test(tc, test_rewrite_inactive_and_merge);
    tcase_add_test(tc, test_think_bytes);
    tcase_add_test(tc, test_evict_skips);
    tcase_add_test(tc, test_evict_adaptive_codecs);
    tcase_add_test(tc, test_evict_refusals);
    tcase_add_test(tc, test_jobs_determinism);
    tcase_add_test(tc, test_stored_16bit);
    tcase_add_test(tc, test_refusals);
    tcase_add_test(tc, test_results_commit);
    tcase_add_test(tc, test_reference_mode);
    tcase_add_test(tc, test_pool);
    tcase_add_test(tc, test_codec_failures);
    tcase_add_test(tc, test_sparse_no_dict_attention);
    tcase_add_test(tc, test_buffer_rules);
    tcase_add_test(tc, test_observer_merge);
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
