/* SPDX-License-Identifier: MIT
 * Tests of the model in the loop (harness/loop/fk_loop.h). Oracles: the plain runner's own
 * greedy decode (fk_llama2c_generate with its logits), bit for bit; the eviction protocol's
 * boundary (a buffer of T - 1 tokens evicts only after the last step's attention, one of
 * T - 2 changes the last step's logits and nothing before); teacher forcing and free
 * running on the same inputs. The independent NumPy closed loop is tests/loop_numpy_oracle.py.
 * Tests that need $FK_SHARED/data/models pass with a note when it is absent.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fk_err.h"
#include "core/fk_codec.h"
#include "core/fk_registry.h"
#include "core/fk_evict.h"
#include "core/fk_rewrite.h"
#include "fk_check_main.h"
#include "formats/fk_dict.h"
#include "gen/fk_llama2c.h"
#include "kernels/fk_blas.h"
#include "loop/fk_loop.h"

static char models_dir[4096];

static int have_model(const char *name)
{
    const char *sh = getenv("FK_SHARED");
    snprintf(models_dir, sizeof models_dir, "%s/data/models", sh ? sh : "/work/shared");
    char p[4200];
    snprintf(p, sizeof p, "%s/%s/model.bin", models_dir, name);
    if (access(p, R_OK) != 0) {
        printf("note: %s absent, skipping model test\n", p);
        return 0;
    }
    return 1;
}

/* A model, its tokenizer, and the plain runner's greedy decode of prompt with logits. */
struct fixture {
    struct fk_llama2c_model *m;
    struct fk_llama2c_tokenizer *tok;
    struct fk_llama2c_gen gen;
    struct fk_loop_ref ref;
    int V;
};

static void setup(struct fixture *f, const char *name, const char *prompt, int steps)
{
    memset(f, 0, sizeof *f);
    fk_blas_threads_set(1);
    char mp[4200], tp[4200];
    snprintf(mp, sizeof mp, "%s/%s/model.bin", models_dir, name);
    snprintf(tp, sizeof tp, "%s/%s/tokenizer.bin", models_dir, name);
    ck_assert_msg(fk_llama2c_model_load(mp, &f->m) == FK_OK, "%s", fk_errmsg());
    f->V = fk_llama2c_model_config(f->m)->vocab_size;
    ck_assert_msg(fk_llama2c_tokenizer_load(tp, f->V, &f->tok) == FK_OK, "%s", fk_errmsg());
    struct fk_llama2c_run *r = NULL;
    ck_assert(fk_llama2c_run_create(f->m, &r) == FK_OK);
    const struct fk_llama2c_sampling greedy = {0.0, 1.0, 0, 1};
    /* steps + 1 generated ids: the last is the target of the loop's last step */
    ck_assert_msg(fk_llama2c_generate(r, f->tok, prompt, steps + 1, &greedy, 1, &f->gen)
                  == FK_OK, "%s", fk_errmsg());
    fk_llama2c_run_free(&r);
    int P = f->gen.prompt_len;
    ck_assert_msg(fk_loop_ref_build(f->m, f->gen.ids, P, NULL, 0, steps, 1, &f->ref) == FK_OK,
                  "%s", fk_errmsg());
    /* the reference's greedy decode is the plain runner's */
    ck_assert(!memcmp(f->ref.ids, f->gen.ids, (size_t)(P + steps + 1) * sizeof(int32_t)));
    ck_assert(!memcmp(f->ref.logits, f->gen.logits + (size_t)P * f->V,
                      (size_t)steps * f->V * sizeof(float)));
}

static void teardown(struct fixture *f)
{
    fk_loop_ref_free(&f->ref);
    fk_llama2c_gen_free(&f->gen);
    fk_llama2c_tokenizer_free(&f->tok);
    fk_llama2c_model_free(&f->m);
}

static void *codec_opts(const struct fk_codec_ops *ops, const char *const *kv)
{
    void *o = calloc(1, ops->opts_size);
    ck_assert_ptr_nonnull(o);
    fk_opts_defaults(ops, o);
    for (int i = 0; kv && kv[i]; i += 2) {
        const struct fk_option *op = fk_codec_option(ops, kv[i]);
        ck_assert_msg(op != NULL, "%s has no option %s", ops->name, kv[i]);
        ck_assert(fk_opts_set(ops, o, op, atof(kv[i + 1])) == FK_OK);
    }
    return o;
}

/* Runs codec name with options kv in mode, teacher forcing in blocks of up to block
 * positions (0: one per pass); the result keeps its logits. */
static void run_block(struct fixture *f, const char *name, const char *const *kv,
                      enum fk_loop_mode mode, int block, struct fk_loop_result *res)
{
    const struct fk_codec_ops *ops = fk_codec_find(name);
    ck_assert_ptr_nonnull(ops);
    void *o = codec_opts(ops, kv);
    struct fk_loop_codec c = {.ops = ops, .opts = o, .block = block};
    int rc = fk_loop_run(f->m, &f->ref, &c, mode, 1, res);
    ck_assert_msg(rc == FK_OK, "%s: %s", name, fk_errmsg());
    free(o);
}

static void run(struct fixture *f, const char *name, const char *const *kv,
                enum fk_loop_mode mode, struct fk_loop_result *res)
{
    run_block(f, name, kv, mode, 0, res);
}

/* Step j of res has the plain runner's logits bit for bit. */
static int same_logits(const struct fixture *f, const struct fk_loop_result *res, int j)
{
    size_t V = (size_t)f->V;
    return !memcmp(res->logits + (size_t)j * V,
                   f->gen.logits + ((size_t)f->gen.prompt_len + j) * V, V * sizeof(float));
}

static void check_full(const char *model, const char *prompt)
{
    if (!have_model(model))
        return;
    struct fixture f;
    enum { S = 40 };
    setup(&f, model, prompt, S);
    /* n_b = 0: the prefill and every decode token are handed over (its default 128 would
     * keep these short decodes exact without the codec) */
    const char *kv[] = {"n_b", "0", NULL};
    for (int mode = 0; mode < 2; mode++) {
        struct fk_loop_result r;
        run(&f, "full", kv, (enum fk_loop_mode)mode, &r);
        for (int j = 0; j < S; j++)
            ck_assert_msg(same_logits(&f, &r, j), "%s full mode %d: step %d logits differ "
                          "from the plain runner's", model, mode, j);
        ck_assert(r.kl_mean == 0.0 && r.top1_agree == 1.0 && r.first_diverge == -1);
        if (mode == FK_LOOP_TEACHER) {
            ck_assert(r.ppl_ratio == 1.0);
            for (int l = 0; l < r.n_layers; l++)
                ck_assert_msg(r.attn_cos[l] > 1.0 - 1e-12 && r.attn_kl[l] == 0.0,
                              "layer %d: attn_cos %.17g attn_kl %g", l, r.attn_cos[l],
                              r.attn_kl[l]);
        } else {
            ck_assert(r.token_agree == 1.0);
        }
        fk_loop_result_free(&r);
    }
    teardown(&f);
}

/* Teacher forcing in blocks (fk_loop_codec.block) against one position per pass on the same
 * reference: the full codec with its buffer holding every token runs the whole continuation
 * in blocks and stays at the plain runner's logits up to float rounding; 2-bit uniform with
 * n_b 16 and a_len 8 (an event every 8 steps, so blocks end at events) gives every step's
 * KL, top-1, NLL and per-layer attention KL of the one-at-a-time loop up to rounding
 * (sgemm against sgemv: the block path is not bit-identical, a block of one position is). */
static void block_pair(struct fixture *f, const char *name, const char *const *kv, int block,
                       struct fk_loop_result *one, struct fk_loop_result *blk)
{
    run_block(f, name, kv, FK_LOOP_TEACHER, 0, one);
    run_block(f, name, kv, FK_LOOP_TEACHER, block, blk);
}

static void check_blocks(const char *model, const char *prompt)
{
    if (!have_model(model))
        return;
    struct fixture f;
    enum { S = 40 };
    setup(&f, model, prompt, S);
    size_t V = (size_t)f.V;
    struct fk_loop_result a, b;
    block_pair(&f, "full", NULL, 16, &a, &b);
    for (int j = 0; j < S; j++) {
        ck_assert_msg(same_logits(&f, &a, j), "%s: full step %d", model, j);
        double mx = 0;
        for (size_t i = 0; i < V; i++)
            mx = fmax(mx, fabs((double)b.logits[j * V + i] - f.gen.logits[(f.gen.prompt_len +
                                                                           j) * V + i]));
        ck_assert_msg(mx < 1e-4, "%s: full in blocks, step %d: logits off by %g", model, j,
                      mx);
        ck_assert_msg(b.kl[j] < 1e-9, "%s: full in blocks, step %d: KL %g", model, j, b.kl[j]);
    }
    fk_loop_result_free(&a);
    fk_loop_result_free(&b);
    const char *lossy[] = {"bits", "2", "n_b", "16", "a_len", "8", NULL};
    block_pair(&f, "uniform", lossy, 16, &a, &b);
    double kl_sum = 0;
    for (int j = 0; j < S; j++) {
        kl_sum += a.kl[j];
        ck_assert_msg(fabs(a.kl[j] - b.kl[j]) <= 1e-7 + 1e-4 * a.kl[j], "%s: uniform step %d: "
                      "KL %.9g one at a time, %.9g in blocks", model, j, a.kl[j], b.kl[j]);
        ck_assert_msg(fabs(a.nll_codec[j] - b.nll_codec[j]) < 1e-4, "%s: step %d NLL %g vs %g",
                      model, j, a.nll_codec[j], b.nll_codec[j]);
        ck_assert_int_eq(a.top1[j], b.top1[j]);
    }
    ck_assert_msg(kl_sum > 1e-3, "%s: 2-bit uniform should be lossy (KL sum %g)", model, kl_sum);
    for (int l = 0; l < f.ref.n_layers; l++)
        ck_assert_msg(fabs(a.attn_kl[l] - b.attn_kl[l]) <= 1e-7 + 1e-4 * a.attn_kl[l],
                      "%s: layer %d attention KL %g vs %g", model, l, a.attn_kl[l],
                      b.attn_kl[l]);
    fk_loop_result_free(&a);
    fk_loop_result_free(&b);
    teardown(&f);
}

START_TEST(teacher_forcing_in_blocks)
{
    check_blocks("fortune-byte-4L", "The meaning of life ");
    check_blocks("fortune-hd128", "Never trust a computer");
}
END_TEST

START_TEST(full_is_the_plain_runner)
{
    check_full("fortune-byte-4L", "The meaning of life ");
    check_full("fortune-hd128", "Never trust a computer");   /* head_dim 128, GQA 3 */
    check_full("babyllama-tok105", "Once upon a time");      /* 8 query / 4 KV heads */
}
END_TEST

/* SLIDE with n_b = T - 1 hands its only decode event over after the last step's attention:
 * every logit exact; n_b = T - 2 compresses token 0 after step S - 2: steps 0 .. S-2 exact,
 * the last step's logits not. The same with kivi's residual window (keys BLOCK, values
 * SLIDE) holding every token. */
START_TEST(buffer_holding_every_token_is_exact)
{
    if (!have_model("fortune-byte-4L"))
        return;
    struct fixture f;
    enum { S = 30 };
    setup(&f, "fortune-byte-4L", "The meaning of life ", S);
    int T = f.gen.prompt_len + S;
    char nb[2][16];
    snprintf(nb[0], sizeof nb[0], "%d", T - 1);
    snprintf(nb[1], sizeof nb[1], "%d", T - 2);
    for (int c = 0; c < 2; c++) {
        const char *kv[] = {"n_b", nb[c], "bits", "2", NULL};
        struct fk_loop_result r;
        run(&f, "uniform", kv, FK_LOOP_TEACHER, &r);
        for (int j = 0; j < S - 1; j++)
            ck_assert_msg(same_logits(&f, &r, j), "uniform n_b %s: step %d not exact", nb[c],
                          j);
        ck_assert_msg(same_logits(&f, &r, S - 1) == (c == 0), "uniform n_b %s: last step "
                      "%s", nb[c], c == 0 ? "not exact" : "exact though token 0 is 2-bit");
        ck_assert((r.kl[S - 1] == 0.0) == (c == 0));
        fk_loop_result_free(&r);
    }
    snprintf(nb[0], sizeof nb[0], "%d", (T + 15) / 16 * 16);
    const char *kv[] = {"residual", nb[0], "group", "16", "bits", "2", NULL};
    struct fk_loop_result r;
    run(&f, "kivi", kv, FK_LOOP_TEACHER, &r);
    for (int j = 0; j < S; j++)
        ck_assert_msg(same_logits(&f, &r, j), "kivi residual %s: step %d not exact", nb[0], j);
    fk_loop_result_free(&r);
    teardown(&f);
}
END_TEST

/* Free running feeds the codec's own argmax: up to and including its first divergence the
 * inputs are the teacher's, so every number agrees bit for bit; a 2-bit cache diverges. */
START_TEST(teacher_and_free_agree_until_divergence)
{
    if (!have_model("fortune-byte-4L"))
        return;
    struct fixture f;
    enum { S = 80 };
    setup(&f, "fortune-byte-4L", "Never trust a computer", S);
    const char *kv[] = {"n_b", "4", "bits", "2", NULL};
    struct fk_loop_result tf, fr;
    run(&f, "uniform", kv, FK_LOOP_TEACHER, &tf);
    run(&f, "uniform", kv, FK_LOOP_FREE, &fr);
    ck_assert_msg(fr.first_diverge >= 0, "the 2-bit cache never diverged in %d steps", S);
    ck_assert(tf.kl_mean > 0.0);
    size_t V = (size_t)f.V;
    for (int j = 0; j <= fr.first_diverge; j++) {
        ck_assert_msg(!memcmp(tf.logits + j * V, fr.logits + j * V, V * sizeof(float)),
                      "step %d (first divergence %d): logits differ", j, fr.first_diverge);
        ck_assert(tf.kl[j] == fr.kl[j] && tf.tokens[j] == fr.tokens[j]);
    }
    /* teacher: top-1 misses and free-running divergence begin at the same step */
    ck_assert_int_eq(tf.first_diverge, fr.first_diverge);
    ck_assert(fr.token_agree < 1.0);
    fk_loop_result_free(&tf);
    fk_loop_result_free(&fr);
    teardown(&f);
}
END_TEST

/* A teacher continuation equal to the greedy one gives the same numbers as the default. */
START_TEST(given_continuation_equals_default)
{
    if (!have_model("fortune-byte-4L"))
        return;
    struct fixture f;
    enum { S = 20 };
    setup(&f, "fortune-byte-4L", "You will be", S);
    int P = f.gen.prompt_len;
    struct fk_loop_ref ref2;
    ck_assert(fk_loop_ref_build(f.m, f.gen.ids, P, f.gen.ids + P, S + 1, S, 0, &ref2)
              == FK_OK);
    ck_assert(!memcmp(ref2.logits, f.ref.logits, (size_t)S * f.V * sizeof(float)));
    ck_assert(!memcmp(ref2.greedy, f.ref.ids, (size_t)(P + S + 1) * sizeof(int32_t)));
    /* too short a continuation is refused, naming what was expected */
    struct fk_loop_ref bad;
    ck_assert(fk_loop_ref_build(f.m, f.gen.ids, P, f.gen.ids + P, S, S, 0, &bad) == FK_EINVAL);
    ck_assert_msg(strstr(fk_errmsg(), "at least 21") != NULL, "%s", fk_errmsg());
    fk_loop_ref_free(&ref2);
    teardown(&f);
}
END_TEST

START_TEST(refuses_what_cannot_run)
{
    if (!have_model("fortune-byte-4L"))
        return;
    struct fixture f;
    setup(&f, "fortune-byte-4L", "You will be", 4);
    const char *names[] = {"external", "lexico", "pca"};
    const char *want[] = {"cannot run in the loop", "needs a dictionary", "needs a basis"};
    for (int i = 0; i < 3; i++) {
        const struct fk_codec_ops *ops = fk_codec_find(names[i]);
        void *o = codec_opts(ops, NULL);
        struct fk_loop_codec c = {.ops = ops, .opts = o};
        struct fk_loop_result r;
        ck_assert(fk_loop_run(f.m, &f.ref, &c, FK_LOOP_TEACHER, 0, &r) < 0);
        ck_assert_msg(strstr(fk_errmsg(), want[i]) != NULL, "%s: %s", names[i], fk_errmsg());
        ck_assert_ptr_null(r.kl);
        free(o);
    }
    teardown(&f);
}
END_TEST

/* A codec that skips dropped rows, recording what it is handed (layer 0), and storing rows
 * exactly: the closed loop's counterpart of test_replay's skip probe. */
enum { LP_T = 512, LP_H = 16 };
static int lp_seen[2][LP_H][LP_T];
struct lp_probe_opts {
    struct fk_common_opts c;
};
static const struct fk_option lp_probe_options[] = {
    FK_COMMON_OPTIONS(struct lp_probe_opts),
    {NULL, 0, 0, 0, 0, 0, NULL, NULL},
};
struct lp_probe {
    int kind, layer, m, H, T;
    float *rows;
};
static int lp_open(const void *o, const struct fk_stream_env *env, void **st)
{
    (void)o;
    struct lp_probe *p = calloc(1, sizeof *p);
    ck_assert_ptr_nonnull(p);
    *p = (struct lp_probe){.kind = env->kind, .layer = env->layer, .m = env->head_dim,
                           .H = env->n_heads, .T = env->n_tokens};
    p->rows = calloc((size_t)p->H * p->T * p->m, sizeof(float));
    ck_assert_ptr_nonnull(p->rows);
    *st = p;
    return FK_OK;
}
static int lp_encode(void *st, const struct fk_event *ev, struct fk_vec_out *out)
{
    struct lp_probe *p = st;
    for (int i = 0; i < ev->n; i++) {
        int h = ev->head[i], t = ev->token[i];
        ck_assert(h < LP_H && t < LP_T);
        if (p->layer == 0)
            lp_seen[p->kind][h][t]++;
        memcpy(p->rows + ((size_t)h * p->T + t) * p->m, ev->x + (size_t)i * p->m,
               sizeof(float) * (size_t)p->m);
        out[i] = (struct fk_vec_out){.nnz = p->m};
    }
    return FK_OK;
}
static int lp_reconstruct(const void *st, int h, int t, float *out)
{
    const struct lp_probe *p = st;
    ck_assert_msg(p->layer != 0 || lp_seen[p->kind][h][t] > 0, "row (%d, %d) never coded", h,
                  t);
    memcpy(out, p->rows + ((size_t)h * p->T + t) * p->m, sizeof(float) * (size_t)p->m);
    return FK_OK;
}
static void lp_stats(const void *st, struct fk_stream_stats *s)
{
    (void)st;
    memset(s, 0, sizeof *s);
}
static void lp_close(void *st)
{
    struct lp_probe *p = st;
    if (p)
        free(p->rows);
    free(p);
}
static const struct fk_codec_ops lp_probe_ops = {
    .name = "loop-skip-probe", .summary = "test probe", .opts_size = sizeof(struct lp_probe_opts),
    .options = lp_probe_options, .caps = FK_CAP_SKIPS | FK_CAP_ADAPTS, .open = lp_open,
    .encode = lp_encode, .reconstruct = lp_reconstruct, .stats = lp_stats, .close = lp_close,
};

/* The prefill's row rewrites in the loop (core/fk_rewrite.h): rewrites that change nothing
 * (think with every prompt token in its recent window, merge none) give the exact logits
 * bit for bit; ThinK pruning half the key channels of the whole prompt changes them from the
 * first step; merging what SnapKV drops changes SnapKV's logits, with the same kept tokens;
 * think over kivi is refused. */
START_TEST(row_rewrites_in_the_loop)
{
    if (!have_model("fortune-byte-4L"))
        return;
    struct fixture f;
    enum { S = 12 };
    setup(&f, "fortune-byte-4L", "The meaning of life ", S);
    int P = f.gen.prompt_len;
    const struct fk_codec_ops *full = fk_codec_find("full");
    const char *kv[] = {"n_b", "0", NULL};
    void *fo = codec_opts(full, kv);
    struct fk_rewrite rw;
    struct fk_codec_ops as = {.options = fk_rewrite_options, .opts_size = sizeof rw};
    fk_opts_defaults(&as, &rw);
    rw.think = 0.5;
    rw.think_window = 8;
    rw.think_recent = P; /* nothing pruned */
    struct fk_loop_codec lc = {.ops = full, .opts = fo, .rewrite = &rw};
    struct fk_loop_result r;
    ck_assert_msg(fk_loop_run(f.m, &f.ref, &lc, FK_LOOP_TEACHER, 1, &r) == FK_OK, "%s",
                  fk_errmsg());
    for (int j = 0; j < S; j++)
        ck_assert_msg(same_logits(&f, &r, j), "step %d: logits changed, nothing pruned", j);
    fk_loop_result_free(&r);
    rw.think_recent = 0; /* the whole prompt's keys lose half their channels */
    ck_assert_int_eq(fk_loop_run(f.m, &f.ref, &lc, FK_LOOP_TEACHER, 1, &r), FK_OK);
    ck_assert(!same_logits(&f, &r, 0));
    ck_assert(r.kl[0] > 0 && isfinite(r.kl[0]) && r.attn_kl[0] > 0);
    fk_loop_result_free(&r);
    /* merge over SnapKV */
    const struct fk_evict_ops *ev = fk_evict_find("snapkv");
    void *eo = calloc(1, ev->opts_size);
    fk_evict_opts_defaults(ev, eo);
    ck_assert(fk_evict_opts_set(ev, eo, fk_evict_option(ev, "window"), 4) == FK_OK);
    ck_assert(fk_evict_opts_set(ev, eo, fk_evict_option(ev, "ratio"), 0.5) == FK_OK);
    struct fk_loop_codec sk = {.ops = full, .opts = fo, .evict = ev, .evict_opts = eo};
    struct fk_loop_result r0, r1;
    ck_assert_int_eq(fk_loop_run(f.m, &f.ref, &sk, FK_LOOP_TEACHER, 1, &r0), FK_OK);
    fk_opts_defaults(&as, &rw);
    rw.merge = FK_MERGE_KVPRESS;
    sk.rewrite = &rw;
    ck_assert_msg(fk_loop_run(f.m, &f.ref, &sk, FK_LOOP_TEACHER, 1, &r1) == FK_OK, "%s",
                  fk_errmsg());
    size_t V = (size_t)f.V;
    ck_assert(memcmp(r0.logits, r1.logits, V * sizeof(float)) != 0);
    ck_assert(isnan(r0.attn_kl[0]) && isnan(r1.attn_kl[0])); /* tokens dropped in both */
    fk_loop_result_free(&r0);
    fk_loop_result_free(&r1);
    /* think over a codec that would code the zeros */
    const struct fk_codec_ops *kivi = fk_codec_find("kivi");
    void *ko = codec_opts(kivi, NULL);
    fk_opts_defaults(&as, &rw);
    rw.think = 0.5;
    struct fk_loop_codec kc = {.ops = kivi, .opts = ko, .rewrite = &rw};
    ck_assert_int_eq(fk_loop_run(f.m, &f.ref, &kc, FK_LOOP_TEACHER, 1, &r), FK_ECONFIG);
    ck_assert_ptr_nonnull(strstr(fk_errmsg(), "kivi"));
    free(ko);
    free(eo);
    free(fo);
    teardown(&f);
}
END_TEST

/* An eviction policy in the loop: StreamingLLM whose window holds every token gives the
 * plain runner's logits bit for bit; a short window changes them only once the sequence is
 * longer than sinks + recent (the NumPy oracle checks the values); over fadkv, which skips
 * the rows a policy drops, the same holds against fadkv alone; a codec that adapts and cannot
 * skip is refused. */
START_TEST(eviction_policy_in_the_loop)
{
    if (!have_model("fortune-byte-4L"))
        return;
    struct fixture f;
    enum { S = 30 };
    setup(&f, "fortune-byte-4L", "The meaning of life ", S);
    int P = f.gen.prompt_len;
    const struct fk_evict_ops *ev = fk_evict_find("streaming");
    ck_assert_ptr_nonnull(ev);
    void *eo = calloc(1, ev->opts_size);
    fk_evict_opts_defaults(ev, eo);
    const struct fk_codec_ops *full = fk_codec_find("full");
    const char *kv[] = {"n_b", "0", NULL};
    void *fo = codec_opts(full, kv);
    int recent[2] = {P + S, P + 4}; /* sinks 4: all tokens / drops from step 5 on */
    for (int c = 0; c < 2; c++) {
        ck_assert(fk_evict_opts_set(ev, eo, fk_evict_option(ev, "sinks"), 4) == FK_OK);
        ck_assert(fk_evict_opts_set(ev, eo, fk_evict_option(ev, "recent"), recent[c]) == FK_OK);
        struct fk_loop_codec lc = {.ops = full, .opts = fo, .evict = ev, .evict_opts = eo};
        struct fk_loop_result r;
        ck_assert_msg(fk_loop_run(f.m, &f.ref, &lc, FK_LOOP_TEACHER, 1, &r) == FK_OK, "%s",
                      fk_errmsg());
        /* step j attends to P + j + 1 tokens: all kept while that is <= 4 + recent */
        for (int j = 0; j < S; j++)
            ck_assert_msg(same_logits(&f, &r, j) == (P + j + 1 <= 4 + recent[c]),
                          "recent %d, step %d: logits %s", recent[c], j,
                          same_logits(&f, &r, j) ? "exact though rows are dropped"
                                                 : "differ though every row is kept");
        ck_assert(c == 0 ? r.attn_kl[0] == 0.0 : isnan(r.attn_kl[0]));
        fk_loop_result_free(&r);
    }
    /* over fadkv (it skips dropped rows): a window holding every token gives fadkv's own
     * logits bit for bit; a short one the same logits up to the first drop, then others */
    const struct fk_codec_ops *fad = fk_codec_find("fadkv");
    const char *fkv[] = {"n_b", "4", "n", "32", NULL};
    void *ao = codec_opts(fad, fkv);
    char dpath[4200];
    const char *src = getenv("FK_SRCDIR");
    snprintf(dpath, sizeof dpath, "%s/datasets/dicts/fortune-byte-4L.h5", src ? src : ".");
    struct fk_dict *dict = NULL;
    ck_assert_msg(fk_dict_load(dpath, &dict) == FK_OK, "%s", fk_errmsg());
    struct fk_loop_codec plain = {.ops = fad, .opts = ao, .dict = dict};
    struct fk_loop_result r0;
    ck_assert_msg(fk_loop_run(f.m, &f.ref, &plain, FK_LOOP_TEACHER, 1, &r0) == FK_OK, "%s",
                  fk_errmsg());
    size_t V = (size_t)f.V;
    for (int c = 0; c < 2; c++) {
        ck_assert(fk_evict_opts_set(ev, eo, fk_evict_option(ev, "recent"), recent[c]) == FK_OK);
        struct fk_loop_codec lc = {.ops = fad, .opts = ao, .dict = dict, .evict = ev,
                                   .evict_opts = eo};
        struct fk_loop_result r;
        ck_assert_msg(fk_loop_run(f.m, &f.ref, &lc, FK_LOOP_TEACHER, 1, &r) == FK_OK,
                      "fadkv+streaming: %s", fk_errmsg());
        int differ = 0;
        for (int j = 0; j < S; j++) {
            int same = !memcmp(r.logits + j * V, r0.logits + j * V, V * sizeof(float));
            if (P + j + 1 <= 4 + recent[c])
                ck_assert_msg(same, "recent %d, step %d: fadkv's logits changed before a drop",
                              recent[c], j);
            differ += !same;
        }
        ck_assert_msg(c == 0 ? differ == 0 : differ > 0, "recent %d: %d steps differ",
                      recent[c], differ);
        fk_loop_result_free(&r);
    }
    fk_loop_result_free(&r0);
    /* the rows a skipping codec is handed: exactly those StreamingLLM keeps when they come
     * due (n_b 8, a_len 1: token j at the prompt's end when j < P - 8, else at token j + 8) */
    const int lrec = 6;
    ck_assert(fk_evict_opts_set(ev, eo, fk_evict_option(ev, "recent"), lrec) == FK_OK);
    struct lp_probe_opts po;
    fk_opts_defaults(&lp_probe_ops, &po);
    po.c.n_b = 8;
    po.c.a_len = 1;
    memset(lp_seen, 0, sizeof lp_seen);
    struct fk_loop_codec pc = {.ops = &lp_probe_ops, .opts = &po, .evict = ev,
                               .evict_opts = eo};
    struct fk_loop_result rp;
    ck_assert_msg(fk_loop_run(f.m, &f.ref, &pc, FK_LOOP_TEACHER, 0, &rp) == FK_OK, "%s",
                  fk_errmsg());
    fk_loop_result_free(&rp);
    int T = P + S, n_kv = fk_llama2c_model_config(f.m)->n_kv_heads, coded = 0;
    for (int j = 0; j < T; j++) {
        int due = j < P - 8 ? P - 1 : j + 8;
        int want = due >= T - 1 ? 0 : j < 4 || j >= due + 1 - lrec;
        for (int k = 0; k < 2; k++)
            for (int h = 0; h < n_kv; h++) {
                ck_assert_msg(lp_seen[k][h][j] == want, "%s head %d token %d coded %d times, "
                              "expected %d", k ? "V" : "K", h, j, lp_seen[k][h][j], want);
                coded += want;
            }
    }
    ck_assert_int_gt(coded, 0);
    /* a codec that adapts and cannot skip dropped rows is refused */
    struct fk_codec_ops noskip = *fad;
    noskip.caps &= ~(unsigned)FK_CAP_SKIPS;
    struct fk_loop_codec lc = {.ops = &noskip, .opts = ao, .dict = dict, .evict = ev,
                               .evict_opts = eo};
    struct fk_loop_result r;
    ck_assert(fk_loop_run(f.m, &f.ref, &lc, FK_LOOP_TEACHER, 0, &r) == FK_ECONFIG);
    ck_assert_msg(strstr(fk_errmsg(), "refused") != NULL, "%s", fk_errmsg());
    fk_dict_free(&dict);
    free(ao);
    free(fo);
    free(eo);
    teardown(&f);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("loop");
    TCase *tc = tcase_create("models");
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, full_is_the_plain_runner);
    tcase_add_test(tc, buffer_holding_every_token_is_exact);
    tcase_add_test(tc, teacher_and_free_agree_until_divergence);
    tcase_add_test(tc, given_continuation_equals_default);
    tcase_add_test(tc, refuses_what_cannot_run);
    tcase_add_test(tc, eviction_policy_in_the_loop);
    tcase_add_test(tc, row_rewrites_in_the_loop);
    tcase_add_test(tc, teacher_forcing_in_blocks);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return fk_suite_run(suite());
}
