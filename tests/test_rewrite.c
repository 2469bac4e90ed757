/* SPDX-License-Identifier: MIT
 * The prefill's row rewrites (core/fk_rewrite.h) against references written here from the
 * rules, in double precision and without the BLAS: kvpress MergingPress's weighted value
 * blend into the most key-similar kept token, and ThinK's channel pruning by q^2 k^2
 * energy; the option rules, the refusals and the byte counts.
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/fk_err.h"
#include "core/fk_codec.h"
#include "core/fk_evict.h"
#include "core/fk_registry.h"
#include "core/fk_rewrite.h"
#include "fk_check_main.h"

enum { H = 2, G = 3, M = 16, T = 40, P = 30 };

static uint64_t rng;
static double unif(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}
static double gauss(void)
{
    double u = unif() + 1e-300, v = unif();
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

struct data {
    float k[H][T][M], v[H][T][M], q[H * G][T][M];
    int32_t qrow[T];
    uint8_t keep[H][T];
};

/* Random rows with a few near-duplicate keys (so similarities spread) and per-channel
 * scales (so channel energies differ), a keep mask dropping about `drop` of the prompt. */
static void make(struct data *d, uint64_t seed, double drop)
{
    rng = seed * 2654435761u + 1;
    double scale[M];
    for (int c = 0; c < M; c++)
        scale[c] = 0.2 + 2.0 * unif();
    for (int h = 0; h < H; h++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < M; c++) {
                d->k[h][t][c] = (float)(gauss() * scale[c]);
                d->v[h][t][c] = (float)gauss();
            }
    for (int h = 0; h < H; h++)
        for (int t = 3; t < T; t += 5) /* near-copies of earlier keys */
            for (int c = 0; c < M; c++)
                d->k[h][t][c] = d->k[h][t - 3][c] + (float)(0.05 * gauss());
    for (int j = 0; j < H * G; j++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < M; c++)
                d->q[j][t][c] = (float)(gauss() * (c % 3 == 0 ? 2.0 : 0.5));
    for (int t = 0; t < T; t++)
        d->qrow[t] = t;
    for (int h = 0; h < H; h++)
        for (int t = 0; t < T; t++)
            d->keep[h][t] = t >= P || unif() >= drop;
}

static struct fk_rewrite_in in_of(struct data *d, int use_keep)
{
    return (struct fk_rewrite_in){.n_kv_heads = H, .n_q_heads = H * G, .head_dim = M,
                                  .n_tokens = T, .prompt_len = P,
                                  .keep = use_keep ? &d->keep[0][0] : NULL,
                                  .k = &d->k[0][0][0], .v = &d->v[0][0][0],
                                  .q = &d->q[0][0][0], .n_qrows = T, .qrow = d->qrow};
}

static struct fk_rewrite defaults(void)
{
    struct fk_rewrite rw;
    struct fk_codec_ops as = {.options = fk_rewrite_options, .opts_size = sizeof rw};
    fk_opts_defaults(&as, &rw);
    return rw;
}

/* MergingPress from its rule (fk_rewrite.h), in double. */
static void ref_merge(const struct data *d0, double thr, float out[H][T][M])
{
    memcpy(out, d0->v, sizeof d0->v);
    for (int h = 0; h < H; h++) {
        double acc[T][M] = {{0}}, wacc[T] = {0}, vn[T];
        for (int t = 0; t < P; t++) {
            double s = 0;
            for (int c = 0; c < M; c++)
                s += (double)d0->v[h][t][c] * d0->v[h][t][c];
            vn[t] = sqrt(s);
        }
        for (int e = 0; e < P; e++) {
            if (d0->keep[h][e])
                continue;
            double ne = 0;
            for (int c = 0; c < M; c++)
                ne += (double)d0->k[h][e][c] * d0->k[h][e][c];
            ne = fmax(sqrt(ne), 1e-6);
            int best = -1;
            double bs = -2;
            for (int t = 0; t < P; t++) {
                if (!d0->keep[h][t])
                    continue;
                double nt = 0, dot = 0;
                for (int c = 0; c < M; c++) {
                    nt += (double)d0->k[h][t][c] * d0->k[h][t][c];
                    dot += (double)d0->k[h][e][c] * d0->k[h][t][c];
                }
                double s = dot / (ne * fmax(sqrt(nt), 1e-6));
                if (s > bs)
                    bs = s, best = t;
            }
            if (best < 0 || bs < thr)
                continue;
            double w = fmax(bs, 0) * vn[e] / (vn[e] + vn[best] + 1e-6);
            for (int c = 0; c < M; c++)
                acc[best][c] += w * d0->v[h][e][c];
            wacc[best] += w;
        }
        for (int t = 0; t < P; t++)
            if (wacc[t] > 0)
                for (int c = 0; c < M; c++)
                    out[h][t][c] = (float)((d0->v[h][t][c] + acc[t][c]) / (1 + wacc[t]));
    }
}

START_TEST(test_merge_rule)
{
    static struct data d, d0;
    static float want[H][T][M];
    for (int seed = 1; seed <= 4; seed++) {
        make(&d, (uint64_t)seed, 0.3 + 0.1 * seed);
        d0 = d;
        struct fk_rewrite rw = defaults();
        rw.merge = FK_MERGE_KVPRESS;
        rw.merge_threshold = seed == 4 ? 0.5 : 0.0;
        ref_merge(&d0, rw.merge_threshold, want);
        struct fk_rewrite_in in = in_of(&d, 1);
        ck_assert_int_eq(fk_rewrite_apply(&rw, &in, NULL), FK_OK);
        int changed = 0;
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++)
                for (int c = 0; c < M; c++) {
                    /* keys never change; dropped and decode values neither */
                    ck_assert(d.k[h][t][c] == d0.k[h][t][c]);
                    if (!d0.keep[h][t] || t >= P)
                        ck_assert(d.v[h][t][c] == d0.v[h][t][c]);
                    ck_assert_msg(fabs(d.v[h][t][c] - want[h][t][c]) <=
                                  2e-6 * (1 + fabs(want[h][t][c])),
                                  "seed %d head %d token %d: %.9g vs %.9g", seed, h, t,
                                  d.v[h][t][c], want[h][t][c]);
                    changed += d.v[h][t][c] != d0.v[h][t][c];
                }
        ck_assert_msg(changed > M, "seed %d: merging changed only %d values", seed, changed);
    }
    /* nothing dropped (no mask, or every token kept): nothing changes */
    make(&d, 9, 0.0);
    d0 = d;
    struct fk_rewrite rw = defaults();
    rw.merge = FK_MERGE_KVPRESS;
    struct fk_rewrite_in in = in_of(&d, 1);
    ck_assert_int_eq(fk_rewrite_apply(&rw, &in, NULL), FK_OK);
    ck_assert(!memcmp(&d, &d0, sizeof d));
    in = in_of(&d, 0);
    ck_assert_int_eq(fk_rewrite_apply(&rw, &in, NULL), FK_OK);
    ck_assert(!memcmp(&d, &d0, sizeof d));
}
END_TEST

/* ThinK from its rule: channel score mean_w(q^2) (window, then group) x mean_t(k^2) over
 * the kept prompt keys; the int(M r) lowest pruned (ties to the lower channel). */
static void ref_think(const struct data *d0, const struct fk_rewrite *rw, int use_keep,
                      uint8_t chan[H][M])
{
    int W = rw->think_window < P ? rw->think_window : P, np = (int)(M * rw->think);
    for (int h = 0; h < H; h++) {
        double sc[M];
        for (int c = 0; c < M; c++) {
            double qs = 0, ks = 0;
            int nk = 0;
            for (int g = 0; g < G; g++)
                for (int j = P - W; j < P; j++)
                    qs += (double)d0->q[h * G + g][j][c] * d0->q[h * G + g][j][c];
            for (int t = 0; t < P; t++)
                if (!use_keep || d0->keep[h][t]) {
                    ks += (double)d0->k[h][t][c] * d0->k[h][t][c];
                    nk++;
                }
            sc[c] = qs / ((double)W * G) * (ks / nk);
        }
        for (int c = 0; c < M; c++)
            chan[h][c] = 1;
        for (int i = 0; i < np; i++) { /* brute force: the lowest remaining each time */
            int lo = -1;
            for (int c = 0; c < M; c++)
                if (chan[h][c] && (lo < 0 || sc[c] < sc[lo]))
                    lo = c;
            chan[h][lo] = 0;
        }
    }
}

START_TEST(test_think_rule)
{
    static struct data d, d0;
    const double ratios[] = {0.25, 0.5, 0.8};
    const int recents[] = {0, 8, 32, 100};
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 4; j++) {
            make(&d, (uint64_t)(10 + i * 4 + j), 0.4);
            d0 = d;
            struct fk_rewrite rw = defaults();
            rw.think = ratios[i];
            rw.think_window = 4 + 5 * j;
            rw.think_recent = recents[j];
            int use_keep = j % 2;
            uint8_t chan[H][M], want[H][M];
            ref_think(&d0, &rw, use_keep, want);
            struct fk_rewrite_in in = in_of(&d, use_keep);
            ck_assert_int_eq(fk_rewrite_apply(&rw, &in, &chan[0][0]), FK_OK);
            int np = (int)(M * ratios[i]), nt = P - recents[j] > 0 ? P - recents[j] : 0;
            ck_assert_int_eq(fk_rewrite_channels(&rw, M), np);
            ck_assert_int_eq(fk_rewrite_pruned_tokens(&rw, M, P), nt);
            ck_assert_int_eq(fk_rewrite_mask_bytes(&rw, M), 2); /* 16 bits */
            for (int h = 0; h < H; h++) {
                int kept = 0;
                for (int c = 0; c < M; c++) {
                    ck_assert_msg(chan[h][c] == want[h][c], "ratio %g recent %d head %d "
                                  "channel %d: %d vs %d", ratios[i], recents[j], h, c,
                                  chan[h][c], want[h][c]);
                    kept += chan[h][c];
                }
                ck_assert_int_eq(kept, M - np);
                for (int t = 0; t < T; t++)
                    for (int c = 0; c < M; c++) {
                        float x = d.k[h][t][c], x0 = d0.k[h][t][c];
                        if (t < nt && !want[h][c])
                            ck_assert(x == 0.0f);
                        else
                            ck_assert(x == x0);
                        ck_assert(d.v[h][t][c] == d0.v[h][t][c]);
                    }
            }
        }
    /* ties: equal scores prune the lower channel first */
    make(&d, 77, 0.0);
    for (int h = 0; h < H; h++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < M; c++)
                d.k[h][t][c] = 1.0f;
    for (int j = 0; j < H * G; j++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < M; c++)
                d.q[j][t][c] = 1.0f;
    struct fk_rewrite rw = defaults();
    rw.think = 0.25;
    uint8_t chan[H][M];
    struct fk_rewrite_in in = in_of(&d, 0);
    ck_assert_int_eq(fk_rewrite_apply(&rw, &in, &chan[0][0]), FK_OK);
    for (int c = 0; c < M; c++)
        ck_assert_int_eq(chan[0][c], c >= 4);
    /* a missing window query is an error, not a silent zero */
    make(&d, 78, 0.0);
    d.qrow[P - 2] = -1;
    in = in_of(&d, 0);
    ck_assert_int_eq(fk_rewrite_apply(&rw, &in, NULL), FK_EINVAL);
    ck_assert_ptr_nonnull(strstr(fk_errmsg(), "prompt token 28"));
}
END_TEST

START_TEST(test_rules_and_refusals)
{
    struct fk_rewrite rw = defaults();
    ck_assert_int_eq(rw.merge, FK_MERGE_NONE);
    ck_assert(rw.think == 0 && rw.think_window == 32 && rw.think_recent == 32);
    ck_assert_int_eq(fk_rewrite_prefill_queries(&rw, 100), 0);
    ck_assert_int_eq(fk_rewrite_channels(&rw, 128), 0);
    ck_assert_int_eq(fk_rewrite_pruned_tokens(&rw, 128, 100), 0);
    ck_assert_int_eq(fk_rewrite_mask_bytes(&rw, 128), 0);
    ck_assert(fk_rewrite_is_option("think") && fk_rewrite_is_option("merge_threshold"));
    ck_assert(!fk_rewrite_is_option("ratio"));
    rw.think = 0.4;
    ck_assert_int_eq(fk_rewrite_prefill_queries(&rw, 100), 32);
    ck_assert_int_eq(fk_rewrite_prefill_queries(&rw, 20), 20);
    ck_assert_int_eq(fk_rewrite_channels(&rw, 128), 51); /* int(128 * 0.4) */
    ck_assert_int_eq(fk_rewrite_pruned_tokens(&rw, 128, 100), 68);
    ck_assert_int_eq(fk_rewrite_pruned_tokens(&rw, 128, 20), 0);
    ck_assert_int_eq(fk_rewrite_mask_bytes(&rw, 128), 16);
    ck_assert_int_eq(fk_rewrite_mask_bytes(&rw, 100), 13);
    const struct fk_codec_ops *full = fk_codec_find("full"), *kivi = fk_codec_find("kivi");
    ck_assert_int_eq(fk_rewrite_check(&rw, NULL, full), FK_OK);
    ck_assert_int_eq(fk_rewrite_check(&rw, NULL, kivi), FK_ECONFIG);
    ck_assert_ptr_nonnull(strstr(fk_errmsg(), "kivi"));
    rw.think = 0;
    rw.merge = FK_MERGE_KVPRESS;
    ck_assert_int_eq(fk_rewrite_check(&rw, NULL, full), FK_ECONFIG);
    ck_assert_ptr_nonnull(strstr(fk_errmsg(), "evict"));
    ck_assert_int_eq(fk_rewrite_check(&rw, fk_evict_find("snapkv"), kivi), FK_OK);
    ck_assert_int_eq(fk_rewrite_check(&rw, fk_evict_find("h2o"), full), FK_ECONFIG);
    ck_assert_ptr_nonnull(strstr(fk_errmsg(), "during decoding"));
    /* no rewrite option is a codec's or a policy's: the block keys stay unambiguous */
    for (const struct fk_option *o = fk_rewrite_options; o->name; o++) {
        for (int c = 0; fk_codec_at(c); c++)
            ck_assert_msg(!fk_codec_option(fk_codec_at(c), o->name), "%s is also codec %s's",
                          o->name, fk_codec_at(c)->name);
        for (int c = 0; fk_evict_policies[c]; c++)
            ck_assert_msg(!fk_evict_option(fk_evict_policies[c], o->name),
                          "%s is also policy %s's", o->name, fk_evict_policies[c]->name);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("rewrite");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_merge_rule);
    tcase_add_test(tc, test_think_rule);
    tcase_add_test(tc, test_rules_and_refusals);
    suite_add_tcase(s, tc);
    return fk_suite_run(s);
}
