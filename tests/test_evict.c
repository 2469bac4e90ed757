/* SPDX-License-Identifier: MIT
 * Token-eviction policies (codecs/core/fk_evict.h, codecs/evict/): every registered policy
 * driven through the fk_evict.h contract on random data with GQA groups of 3, its keep mask
 * after every hook compared with an independent naive reference written here (double
 * precision, one query head at a time, plain loops and a selection sort); the contract's
 * invariants (the current token kept, >= 1 token per head, no token re-admitted);
 * causality (a planted huge later key never changes a kept set before it arrives, and rows
 * after the current token poisoned with NaN change nothing); option checks and name
 * collisions with codecs.
 */
#include "common/fk_err.h"
#include "core/fk_evict.h"
#include "core/fk_registry.h"
#include "evict/fk_evict_attn.h"
#include "evict/fk_evict_budget.h"
#include "kernels/fk_rope.h"
#include "fk_check_main.h"

#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { H = 2, G = 3, HQ = H * G, M = 16, P = 40, T = 110 };

struct data {
    float k[H][T][M], v[H][T][M];
    float q[HQ][T][M];           /* one query row per token: qrow[t] = t */
    int32_t qrow[T];
};

static uint64_t rng_state;
static double unif(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return ((rng_state >> 11) + 0.5) / 9007199254740992.0;
}
static double gauss(void)
{
    return sqrt(-2 * log(unif())) * cos(6.283185307179586 * unif());
}

static void make_data(struct data *d, uint64_t seed)
{
    rng_state = seed * 2654435761u + 1;
    for (int h = 0; h < H; h++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < M; c++) {
                d->k[h][t][c] = (float)(gauss() * (0.5 + (t % 7) * 0.2));
                d->v[h][t][c] = (float)gauss();
            }
    for (int j = 0; j < HQ; j++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < M; c++)
                d->q[j][t][c] = (float)(2.0 * gauss());
    for (int t = 0; t < T; t++)
        d->qrow[t] = t;
}

/* ---- driving a policy through the contract ---------------------------------------- */

/* masks[s][h][t] after hook s (s = 0 prefill, s = 1 + i decode token P + i). */
typedef uint8_t masks_t[T - P + 1][H][T];

static void set_opt(const struct fk_evict_ops *ops, void *opts, const char *name, double v)
{
    const struct fk_option *o = fk_evict_option(ops, name);
    ck_assert_msg(o != NULL, "%s has no option %s", ops->name, name);
    ck_assert_int_eq(fk_evict_opts_set(ops, opts, o, v), FK_OK);
}

/* The layer drive() runs and the model's layers (per-layer budgets); the RoPE and
 * positions it hands the policy (NULL: none). */
static int g_layer = 0, g_n_layers = 1;
static const struct fk_rope *g_rope;
static const int32_t *g_pos;
static const double *g_heads;

/* Runs the policy; with poison, the view's rows after the hook's token are NaN. */
static void drive(const struct fk_evict_ops *ops, const void *opts, const struct data *d,
                  int poison, masks_t out)
{
    uint8_t keep[H][T];
    memset(keep, 0, sizeof keep);
    struct fk_evict_env env = {.layer = g_layer, .n_layers = g_n_layers, .n_kv_heads = H,
                               .n_q_heads = HQ, .head_dim = M, .n_tokens = T, .prompt_len = P,
                               .keep = &keep[0][0], .rope = g_rope, .positions = g_pos,
                               .head_scores = g_heads};
    void *st = NULL;
    ck_assert_int_eq(ops->open(opts, &env, &st), FK_OK);
    struct data *w = malloc(sizeof *w);
    ck_assert_ptr_nonnull(w);
    for (int s = 0; s <= T - P; s++) {
        int t = s == 0 ? P - 1 : P + s - 1;
        memcpy(w, d, sizeof *w);
        if (poison)
            for (int j = t + 1; j < T; j++) {
                for (int h = 0; h < H; h++)
                    for (int c = 0; c < M; c++)
                        w->k[h][j][c] = w->v[h][j][c] = NAN;
                for (int g = 0; g < HQ; g++)
                    for (int c = 0; c < M; c++)
                        w->q[g][j][c] = NAN;
            }
        struct fk_evict_view v = {.t = t, .k = &w->k[0][0][0], .v = &w->v[0][0][0],
                                  .q = &w->q[0][0][0], .n_qrows = T, .qrow = w->qrow};
        if (s == 0) {
            for (int h = 0; h < H; h++)
                memset(keep[h], 1, P);
            ck_assert_int_eq(ops->prefill ? ops->prefill(st, &v) : FK_OK, FK_OK);
        } else {
            for (int h = 0; h < H; h++)
                keep[h][t] = 1;
            ck_assert_int_eq(ops->decode ? ops->decode(st, &v) : FK_OK, FK_OK);
        }
        memcpy(out[s], keep, sizeof keep);
        /* the contract's invariants */
        for (int h = 0; h < H; h++) {
            int n = 0;
            for (int j = 0; j <= t; j++) {
                n += keep[h][j];
                if (s > 0 && keep[h][j])
                    ck_assert_msg(out[s - 1][h][j] || j == t, "%s re-admitted token %d",
                                  ops->name, j);
            }
            ck_assert_msg(n >= 1, "%s keeps no token of head %d at %d", ops->name, h, t);
            if (s > 0)
                ck_assert_msg(keep[h][t], "%s dropped the current token %d", ops->name, t);
            for (int j = t + 1; j < T; j++)
                ck_assert_int_eq(keep[h][j], 0);
        }
    }
    free(w);
    ops->close(st);
}

/* ---- the naive references ------------------------------------------------------------ */

static double dotd(const float *a, const float *b)
{
    double s = 0;
    for (int c = 0; c < M; c++)
        s += (double)a[c] * b[c];
    return s;
}

/* Attention of token tq's query on the tokens kept in mk[h] up to `end` (exclusive), the
 * mean over the group of h, into a[j] (0 for the others). */
static void attn_naive(const struct data *d, int h, int tq, const uint8_t *mk, int end,
                       double *a)
{
    for (int j = 0; j < T; j++)
        a[j] = 0;
    for (int g = 0; g < G; g++) {
        const float *q = d->q[h * G + g][tq];
        double z[T], mx = -INFINITY, sum = 0;
        for (int j = 0; j < end; j++)
            if (mk[j]) {
                z[j] = dotd(q, d->k[h][j]) / sqrt((double)M);
                mx = z[j] > mx ? z[j] : mx;
            }
        for (int j = 0; j < end; j++)
            if (mk[j])
                sum += exp(z[j] - mx);
        for (int j = 0; j < end; j++)
            if (mk[j])
                a[j] += exp(z[j] - mx) / sum / G;
    }
}

/* Keeps the k best-scored candidates (cand[j] = 1) of mk: higher score, then lower token
 * (a selection sort: pick the best remaining k times). */
static void keep_best(uint8_t *mk, const uint8_t *cand, const double *sc, int end, int k)
{
    uint8_t chosen[T] = {0};
    for (int r = 0; r < k; r++) {
        int best = -1;
        for (int j = 0; j < end; j++)
            if (cand[j] && !chosen[j] && (best < 0 || sc[j] > sc[best]))
                best = j;
        if (best < 0)
            break;
        chosen[best] = 1;
    }
    for (int j = 0; j < end; j++)
        if (cand[j] && !chosen[j])
            mk[j] = 0;
}

static void ref_streaming(const struct data *d, int sinks, int recent, masks_t out)
{
    (void)d;
    memset(out, 0, sizeof(masks_t));
    for (int s = 0; s <= T - P; s++) {
        int t = s == 0 ? P - 1 : P + s - 1;
        for (int h = 0; h < H; h++)
            for (int j = 0; j <= t; j++)
                out[s][h][j] = t + 1 <= sinks + recent || j < sinks || j > t - recent;
    }
}

/* SnapKV's scores of every head (window tokens P-W .. P-1: +INFINITY, protected). */
static void ref_snapkv_scores(const struct data *d, int W, int kern, double sc[H][T])
{
    for (int h = 0; h < H; h++) {
        double raw[T] = {0};
        for (int g = 0; g < G; g++)
            for (int i = P - W; i < P; i++) {
                /* query i, head h*G+g, over keys 0..i */
                double z[T], mx = -INFINITY, sum = 0;
                for (int j = 0; j <= i; j++) {
                    z[j] = dotd(d->q[h * G + g][i], d->k[h][j]) / sqrt((double)M);
                    mx = z[j] > mx ? z[j] : mx;
                }
                for (int j = 0; j <= i; j++)
                    sum += exp(z[j] - mx);
                for (int j = 0; j < P - W; j++)
                    raw[j] += exp(z[j] - mx) / sum / (W * G);
            }
        for (int i = 0; i < P - W; i++) {
            double a = 0;
            for (int dd = -kern / 2; dd <= kern / 2; dd++)
                a += i + dd >= 0 && i + dd < P - W ? raw[i + dd] : 0;
            sc[h][i] = a / kern;
        }
        for (int i = P - W; i < P; i++)
            sc[h][i] = INFINITY;
    }
}

/* The prefill's mask mk, then every decode token appended. */
static void ref_append_decode(uint8_t mk[H][T], masks_t out)
{
    for (int s = 0; s <= T - P; s++) {
        if (s > 0)
            for (int h = 0; h < H; h++)
                mk[h][P + s - 1] = 1;
        memcpy(out[s], mk, (size_t)H * T);
    }
}

static void ref_snapkv(const struct data *d, int W, int kern, int keep, masks_t out)
{
    static double sc[H][T];
    uint8_t mk[H][T], cand[T];
    memset(mk, 0, sizeof mk);
    memset(cand, 0, sizeof cand);
    memset(cand, 1, P);
    ref_snapkv_scores(d, W, kern, sc);
    for (int h = 0; h < H; h++) {
        memset(mk[h], 1, P);
        keep_best(mk[h], cand, sc[h], P, keep < W ? W : keep);
    }
    ref_append_decode(mk, out);
}

/* Ada-KV as kvpress's AdaKVPress reads (spec families-budgets-2026.md 2.1): each head's
 * top int(n alpha) tokens protected, then the H n best (head, token) pairs of the layer,
 * protected first, then by score, then the lower head, then the lower token. */
static void ref_ada(double sc[H][T], int n, double alpha, uint8_t mk[H][T])
{
    uint8_t prot[H][T], chosen[H][T], cand[T];
    memset(prot, 0, sizeof prot);
    memset(chosen, 0, sizeof chosen);
    memset(cand, 0, sizeof cand);
    memset(cand, 1, P);
    for (int h = 0; h < H; h++) {
        memset(prot[h], 1, P);
        keep_best(prot[h], cand, sc[h], P, (int)(n * alpha));
    }
    for (int r = 0; r < H * n; r++) {
        int bh = -1, bj = -1;
        for (int h = 0; h < H; h++)
            for (int j = 0; j < P; j++) {
                if (chosen[h][j])
                    continue;
                int better = bh < 0 || prot[h][j] > prot[bh][bj] ||
                             (prot[h][j] == prot[bh][bj] && sc[h][j] > sc[bh][bj]);
                if (better)
                    bh = h, bj = j;
            }
        chosen[bh][bj] = 1;
    }
    for (int h = 0; h < H; h++) {
        memset(mk[h], 0, T);
        memcpy(mk[h], chosen[h], P);
    }
}

/* PyramidKV's tokens per head of layer l (kvpress get_layer_budget, spec 1.1): the mean
 * per layer n = P (1 - r) or the budget, min n / beta, max 2 n - min clamped to P - W,
 * uniform round(n) where infeasible; Python's round is half to even. */
static int ref_pyramid(int Pp, int W, double n, double beta, int n_layers, int l)
{
    double mean = (W + n) - W; /* as kvpress: cap = W + L (1 - r), then cap - W */
    double mn = mean / beta, mx = 2 * mean - mn;
    if (mx >= Pp - W) {
        mx = Pp - W;
        mn = 2 * mean - mx;
    }
    if (!(Pp >= mx && mx >= mn && mn >= W))
        return (int)nearbyint(mean);
    return (int)nearbyint(mx - l * (n_layers > 1 ? (mx - mn) / (n_layers - 1) : 0));
}

static void ref_knorm(const struct data *d, int keep, masks_t out)
{
    uint8_t mk[H][T];
    memset(mk, 0, sizeof mk);
    for (int h = 0; h < H; h++) {
        memset(mk[h], 1, P);
        double sc[T];
        uint8_t cand[T] = {0};
        for (int j = 0; j < P; j++) {
            sc[j] = -sqrt(dotd(d->k[h][j], d->k[h][j]));
            cand[j] = 1;
        }
        keep_best(mk[h], cand, sc, P, keep);
    }
    for (int s = 0; s <= T - P; s++) {
        if (s > 0)
            for (int h = 0; h < H; h++)
                mk[h][P + s - 1] = 1;
        memcpy(out[s], mk, sizeof mk);
    }
}

/* H2O as the reference code runs it: after each forward's attention, accumulate, then
 * evict to heavy + recent (the recent being the last positions). */
static void ref_h2o(const struct data *d, int heavy, int recent, masks_t out)
{
    uint8_t mk[H][T];
    double acc[H][T];
    memset(mk, 0, sizeof mk);
    memset(acc, 0, sizeof acc);
    for (int h = 0; h < H; h++)
        memset(mk[h], 1, P);
    for (int s = 0; s <= T - P; s++) {
        int t = s == 0 ? P - 1 : P + s - 1;
        if (s > 0)
            for (int h = 0; h < H; h++)
                mk[h][t] = 1;
        /* the cache attention sees at t is the mask now */
        memcpy(out[s], mk, sizeof mk);
        for (int h = 0; h < H; h++) {
            double a[T];
            if (s == 0) {
                for (int i = 0; i < P; i++) {
                    uint8_t causal[T] = {0};
                    memset(causal, 1, (size_t)i + 1);
                    attn_naive(d, h, i, causal, i + 1, a);
                    for (int j = 0; j <= i; j++)
                        acc[h][j] += a[j];
                }
            } else {
                attn_naive(d, h, t, mk[h], t + 1, a);
                for (int j = 0; j <= t; j++)
                    acc[h][j] += a[j];
            }
            int n = 0;
            for (int j = 0; j <= t; j++)
                n += mk[h][j];
            if (n > heavy + recent) {
                uint8_t cand[T] = {0};
                for (int j = 0; j <= t - recent; j++)
                    cand[j] = mk[h][j];
                keep_best(mk[h], cand, acc[h], t + 1, heavy);
            }
        }
        /* prefill: its eviction is visible at once (the hook runs after the prefill's
         * attention); decode: the eviction after t's attention shows at t + 1 */
        if (s == 0)
            memcpy(out[0], mk, sizeof mk);
    }
}

/* SCOPE (alpha < 0: instantaneous a) or Moment-KV (alpha >= 0: I = alpha I + a); variant
 * 0 slide, 1 adaptive, 2 jump (SCOPE's "discontinuous": kv_utils.py's jump_step, one layer:
 * a step whose cache holds at least the budget's decoded tokens waits while fewer than delta
 * steps have waited, else compresses and restarts the count). */
static void ref_decode_phase(const struct data *d, int budget0, int recent, int variant,
                             int delta, double alpha, masks_t out)
{
    uint8_t mk[H][T];
    double I[H][T];
    int jump_step[H] = {0};
    memset(mk, 0, sizeof mk);
    memset(I, 0, sizeof I);
    for (int h = 0; h < H; h++)
        memset(mk[h], 1, P);
    memcpy(out[0], mk, sizeof mk);
    for (int s = 1; s <= T - P; s++) {
        int t = P + s - 1, budget = budget0;
        if (variant > 0 && recent + (t - P) / delta < budget)
            budget = recent + (t - P) / delta;
        for (int h = 0; h < H; h++) {
            mk[h][t] = 1;
            int nd = 0;
            for (int j = P; j <= t; j++)
                nd += mk[h][j];
            int compress = nd > budget;
            if (variant == 2 && nd >= budget) {
                if (jump_step[h] < delta) {
                    jump_step[h]++;
                    compress = 0;
                } else {
                    jump_step[h] = 0;
                }
            } else if (variant == 2) {
                compress = 0;
            }
            double a[T];
            if (alpha >= 0 || compress)
                attn_naive(d, h, t, mk[h], t + 1, a);
            if (alpha >= 0)
                for (int j = P; j <= t; j++)
                    if (mk[h][j])
                        I[h][j] = alpha * I[h][j] + a[j];
            if (compress) {
                uint8_t cand[T] = {0};
                for (int j = P; j <= t - recent; j++)
                    cand[j] = mk[h][j];
                keep_best(mk[h], cand, alpha >= 0 ? I[h] : a, t + 1, budget - recent);
            }
        }
        memcpy(out[s], mk, sizeof mk);
    }
}

/* R-KV (spec families-budgets-2026.md 4.3), one compression of the kept tokens 0 .. tau of
 * mk: the full cosine matrix, plain loops. */
static void ref_rkv_compress(const struct data *d, uint8_t mk[H][T], int tau, int B, int W,
                             int kern, double lam, double thr)
{
    for (int h = 0; h < H; h++) {
        int idx[T], N = 0;
        for (int j = 0; j <= tau; j++)
            if (mk[h][j])
                idx[N++] = j;
        if (N <= B)
            continue;
        int Np = N - W;
        double imp[T] = {0}, pooled[T], red[T], sc[T];
        for (int w = tau - W + 1; w <= tau; w++) {
            double z[T], mx = -INFINITY, sum = 0;
            for (int i = 0; i < Np; i++) {
                z[i] = -INFINITY;
                for (int g = 0; g < G; g++) {
                    double l = dotd(d->q[h * G + g][w], d->k[h][idx[i]]) / sqrt((double)M);
                    z[i] = l > z[i] ? l : z[i];
                }
                mx = z[i] > mx ? z[i] : mx;
            }
            for (int i = 0; i < Np; i++)
                sum += exp(z[i] - mx);
            for (int i = 0; i < Np; i++)
                imp[i] += exp(z[i] - mx) / sum / W;
        }
        for (int i = 0; i < Np; i++) {
            pooled[i] = -INFINITY;
            for (int dd = -kern / 2; dd <= kern / 2; dd++)
                if (i + dd >= 0 && i + dd < Np && imp[i + dd] > pooled[i])
                    pooled[i] = imp[i + dd];
        }
        static double S[T][T];
        for (int i = 0; i < N; i++)
            for (int j = 0; j < N; j++) {
                double ni = sqrt(dotd(d->k[h][idx[i]], d->k[h][idx[i]])) + 1e-8;
                double nj = sqrt(dotd(d->k[h][idx[j]], d->k[h][idx[j]])) + 1e-8;
                S[i][j] = i == j ? 0 : dotd(d->k[h][idx[i]], d->k[h][idx[j]]) / (ni * nj);
            }
        for (int i = 0; i < N; i++) {
            int last = 0;
            for (int j = 0; j < N; j++)
                if (S[i][j] > thr)
                    last = j;
            S[i][last] = 0;
        }
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j < N; j++) {
            red[j] = 0;
            for (int i = 0; i < N; i++)
                red[j] += S[i][j];
            red[j] /= N;
            mx = red[j] > mx ? red[j] : mx;
        }
        for (int j = 0; j < N; j++)
            sum += exp(red[j] - mx);
        uint8_t cand[T] = {0};
        double byt[T] = {0};
        for (int i = 0; i < Np; i++) {
            sc[i] = lam * pooled[i] - (1 - lam) * exp(red[i] - mx) / sum;
            cand[idx[i]] = 1;
            byt[idx[i]] = sc[i];
        }
        keep_best(mk[h], cand, byt, tau + 1, B - W);
    }
}

/* R-KV's schedule: at the prefill's end when P > budget, then in the forward of every
 * decode token tau with tau % period = 0, visible from tau + 1. */
static void ref_rkv(const struct data *d, int B, int W, int kern, int period, double lam,
                    masks_t out)
{
    uint8_t mk[H][T];
    memset(mk, 0, sizeof mk);
    for (int h = 0; h < H; h++)
        memset(mk[h], 1, P);
    if (P > B)
        ref_rkv_compress(d, mk, P - 1, B, W, kern, lam, 0.5);
    memcpy(out[0], mk, sizeof mk);
    for (int s = 1; s <= T - P; s++) {
        int t = P + s - 1;
        if (t - 1 >= P && (t - 1) % period == 0)
            ref_rkv_compress(d, mk, t - 1, B, W, kern, lam, 0.5);
        for (int h = 0; h < H; h++)
            mk[h][t] = 1;
        memcpy(out[s], mk, sizeof mk);
    }
}

/* DMSPress (spec 7.1): token j's score -||k_j|| (over the head's mean prompt key norm when
 * rel), judged once when it leaves the window: at the prefill's end the tokens up to P - 1 -
 * window, at decode token t those up to t - 1 - window (the reference's forward hook runs
 * after the step's attention). */
static void ref_dms(const struct data *d, double thr, int window, int decoding, int rel,
                    masks_t out)
{
    uint8_t mk[H][T];
    double sc[H][T];
    memset(mk, 0, sizeof mk);
    for (int h = 0; h < H; h++) {
        double mean = 0;
        for (int j = 0; j < P; j++)
            mean += sqrt(dotd(d->k[h][j], d->k[h][j])) / P;
        for (int j = 0; j < T; j++)
            sc[h][j] = -sqrt(dotd(d->k[h][j], d->k[h][j])) / (rel ? mean : 1);
        memset(mk[h], 1, P);
        for (int j = 0; j <= P - 1 - window; j++)
            mk[h][j] = !(sc[h][j] < thr);
    }
    memcpy(out[0], mk, sizeof mk);
    for (int s = 1; s <= T - P; s++) {
        int t = P + s - 1;
        for (int h = 0; h < H; h++) {
            mk[h][t] = 1;
            int j = t - 1 - window;
            if (decoding && j >= P - window && j >= 0)
                mk[h][j] = !(sc[h][j] < thr);
        }
        memcpy(out[s], mk, sizeof mk);
    }
}

/* Expected Attention (spec 8.1) with dense matrices: RoPE as D x D rotations of pairs (2i,
 * 2i+1) at angle p theta^(-2i/D), queries un-rotated by the transpose, the mean rotation
 * the mean of the matrices, mu' = R mu, S' = R S R^T, then the expected logits, a softmax
 * over t >= n_sink, the group mean, (s + eps) ||v||, the sinks protected. */
static void rope_matrix(double theta, double p, double R[M][M])
{
    memset(R, 0, sizeof(double) * M * M);
    for (int i = 0; i < M / 2; i++) {
        double a = p * pow(theta, -2.0 * i / M);
        R[2 * i][2 * i] = cos(a), R[2 * i][2 * i + 1] = -sin(a);
        R[2 * i + 1][2 * i] = sin(a), R[2 * i + 1][2 * i + 1] = cos(a);
    }
}

static void ref_expected(const struct data *d, const int32_t *pos, int n_future, int n_sink,
                         int cov, int vnorm, double eps, double sc[H][T])
{
    static double R[M][M], Rb[M][M];
    memset(Rb, 0, sizeof Rb);
    for (int f = 0; f < n_future; f++) {
        rope_matrix(10000, pos[P - 1] + 1 + f, R);
        for (int a = 0; a < M; a++)
            for (int b = 0; b < M; b++)
                Rb[a][b] += R[a][b] / n_future;
    }
    for (int h = 0; h < H; h++) {
        for (int t = 0; t < P; t++)
            sc[h][t] = 0;
        for (int g = 0; g < G; g++) {
            static double qp[T][M];
            double mu[M] = {0}, S[M][M] = {{0}}, mu2[M] = {0}, S2[M][M] = {{0}}, RS[M][M] = {{0}};
            int N = P - n_sink;
            for (int t = n_sink; t < P; t++) {
                rope_matrix(10000, pos[t], R);
                for (int a = 0; a < M; a++) {
                    qp[t][a] = 0;
                    for (int b = 0; b < M; b++) /* R^T q */
                        qp[t][a] += R[b][a] * d->q[h * G + g][t][b];
                    mu[a] += qp[t][a] / N;
                }
            }
            for (int t = n_sink; t < P && cov; t++)
                for (int a = 0; a < M; a++)
                    for (int b = 0; b < M; b++)
                        S[a][b] += (qp[t][a] - mu[a]) * (qp[t][b] - mu[b]) / N;
            for (int a = 0; a < M; a++)
                for (int b = 0; b < M; b++) {
                    mu2[a] += Rb[a][b] * mu[b];
                    for (int c = 0; c < M; c++)
                        RS[a][b] += Rb[a][c] * S[c][b];
                }
            for (int a = 0; a < M; a++)
                for (int b = 0; b < M; b++)
                    for (int c = 0; c < M; c++)
                        S2[a][b] += RS[a][c] * Rb[b][c];
            double z[T], mx = -INFINITY, sum = 0;
            for (int t = n_sink; t < P; t++) {
                const float *k = d->k[h][t];
                double lin = 0, quad = 0;
                for (int a = 0; a < M; a++) {
                    lin += k[a] * mu2[a];
                    for (int b = 0; b < M; b++)
                        quad += k[a] * S2[a][b] * k[b];
                }
                z[t] = lin / sqrt((double)M) + quad / (2.0 * M);
                mx = z[t] > mx ? z[t] : mx;
            }
            for (int t = n_sink; t < P; t++)
                sum += exp(z[t] - mx);
            for (int t = n_sink; t < P; t++)
                sc[h][t] += exp(z[t] - mx) / sum / G;
        }
        for (int t = n_sink; t < P && vnorm; t++)
            sc[h][t] = (sc[h][t] + eps) * sqrt(dotd(d->v[h][t], d->v[h][t]));
        for (int t = 0; t < n_sink; t++)
            sc[h][t] = INFINITY;
    }
}

/* ---- tests ----------------------------------------------------------------------------- */

static void expect_same(const struct fk_evict_ops *ops, masks_t got, masks_t want,
                        const char *what)
{
    for (int s = 0; s <= T - P; s++)
        for (int h = 0; h < H; h++)
            for (int j = 0; j < T; j++)
                ck_assert_msg(got[s][h][j] == want[s][h][j],
                              "%s (%s): hook %d head %d token %d: kept %d, reference %d",
                              ops->name, what, s, h, j, got[s][h][j], want[s][h][j]);
}

static int count_kept(masks_t mk, int s, int h)
{
    int n = 0;
    for (int j = 0; j < T; j++)
        n += mk[s][h][j];
    return n;
}

static void *opts_of(const struct fk_evict_ops *ops)
{
    void *o = calloc(1, ops->opts_size);
    ck_assert_ptr_nonnull(o);
    fk_evict_opts_defaults(ops, o);
    return o;
}

/* The keep rule against keep_best, with ties, dropping few (one at a time) and many
 * (sorted). */
START_TEST(test_keep_top)
{
    rng_state = 99;
    for (int rep = 0; rep < 200; rep++) {
        int n = 1 + rep % 40, k = (int)(unif() * (n + 2)) - 1;
        double sc[T], tmp[2 * T], byt[T];
        int32_t idx[T];
        uint8_t got[T] = {0}, want[T] = {0}, cand[T] = {0};
        for (int i = 0; i < n; i++) {
            idx[i] = 2 * i + (rep % 2); /* candidates are every other token */
            sc[i] = floor(unif() * 5); /* many ties */
            got[idx[i]] = want[idx[i]] = cand[idx[i]] = 1;
            byt[idx[i]] = sc[i];
        }
        fk_evict_keep_top(sc, idx, n, k, got, tmp);
        keep_best(want, cand, byt, T, k < 0 ? 0 : k);
        for (int j = 0; j < T; j++)
            ck_assert_msg(got[j] == want[j], "n %d k %d token %d: kept %d, reference %d", n, k,
                          j, got[j], want[j]);
    }
}
END_TEST

/* The kept-key mirror: after every change of a head's set (arrivals, departures, slots
 * reused), the dot product of each member equals, bit for bit, a reference written here
 * from the rule (coordinate c into float lane c % 8 in coordinate order, the lanes summed
 * ((0+4) + (2+6)) + ((1+5) + (3+7))), for head dimensions with and without a tail. */
static float lane_dot(const float *q, const float *k, int m)
{
    float l[8] = {0};
    for (int c = 0; c < m; c++)
        l[c % 8] += q[c] * k[c];
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

START_TEST(test_mirror)
{
    enum { MT = 300, MH = 2, MG = 5 }; /* query rows: three at a time, then one by one */
    const int dims[] = {128, 13, 8};
    for (int di = 0; di < 3; di++) {
        int m = dims[di];
        float *k = malloc(sizeof(float) * MH * MT * (size_t)m);
        float *q = malloc(sizeof(float) * MG * (size_t)m), *z = malloc(sizeof(float) * MG * MT);
        int32_t idx[MT];
        uint8_t in[MH][MT];
        ck_assert(k && q && z);
        rng_state = 11 + (uint64_t)m;
        for (size_t i = 0; i < (size_t)MH * MT * m; i++)
            k[i] = (float)gauss();
        for (int i = 0; i < MG * m; i++)
            q[i] = (float)gauss();
        memset(in, 0, sizeof in);
        struct fk_mirror mr;
        ck_assert_int_eq(fk_mirror_open(&mr, MH, MT, m), FK_OK);
        int max_hw = 0;
        for (int round = 0; round < 60; round++) {
            for (int h = 0; h < MH; h++) {
                /* a set that grows, churns and shrinks: up to 120 members of MT tokens */
                double p_in = round < 20 ? 0.4 : round < 40 ? 0.25 : 0.1;
                for (int j = 0; j < MT; j++)
                    if (unif() < 0.15)
                        in[h][j] = unif() < p_in;
                int n = 0;
                for (int j = 0; j < MT; j++)
                    if (in[h][j])
                        idx[n++] = j;
                const float *kh = k + (size_t)h * MT * m;
                ck_assert_int_eq(fk_mirror_sync(&mr, h, kh, idx, n), FK_OK);
                int span = fk_mirror_span(&mr, h);
                ck_assert_int_ge(span, n);
                ck_assert_int_eq(span % FK_MIRROR_BLOCK, 0);
                max_hw = mr.head[h].hw > max_hw ? mr.head[h].hw : max_hw;
                fk_mirror_dots(&mr, h, q, MG, z, (size_t)span);
                for (int i = 0; i < n; i++) {
                    int sl = mr.slot[(size_t)h * MT + idx[i]];
                    ck_assert_int_ge(sl, 0);
                    ck_assert_int_eq(mr.head[h].tok[sl], idx[i]);
                    for (int g = 0; g < MG; g++) {
                        float want = lane_dot(q + (size_t)g * m, kh + (size_t)idx[i] * m, m);
                        ck_assert_msg(z[(size_t)g * span + sl] == want,
                                      "m %d round %d head %d token %d query %d: %.9g, want "
                                      "%.9g", m, round, h, idx[i], g,
                                      z[(size_t)g * span + sl], want);
                    }
                }
                /* no slot holds a token outside the set */
                for (int sl = 0; sl < mr.head[h].hw; sl++) {
                    int j = mr.head[h].tok[sl];
                    ck_assert(j < 0 || in[h][j]);
                }
            }
        }
        /* slots were reused: the high-water mark stayed near the largest set, far below
         * the 300 tokens that passed through */
        ck_assert_int_lt(max_hw, 200);
        fk_mirror_close(&mr);
        free(k);
        free(q);
        free(z);
    }
}
END_TEST

/* The softmax's vectorised exp: within 2 ulp of expl on |x| <= 708 (random points, the
 * range-reduction boundaries k ln2 / 2, tiny and signed zero arguments), the C library's exp
 * bit for bit outside (underflow, overflow, infinities, NaN). */
START_TEST(test_exp)
{
    enum { N = 200000 };
    double *x = malloc(sizeof(double) * N), *y = malloc(sizeof(double) * N);
    ck_assert(x && y);
    rng_state = 7;
    int n = 0;
    for (int i = 0; i < N - 4000; i++)
        x[n++] = -708.0 + 1416.0 * unif();
    for (int k = -1000; k < 1000 && n < N - 12; k++) /* both sides of k ln2 / 2 */
        x[n++] = k * 0.34657359027997264 * (1 + (k % 2 ? 1e-15 : -1e-15));
    const double special[] = {0.0, -0.0, 1e-300, -1e-300, 708.0, -708.0, -708.5, -745.0,
                              -746.0, 709.5, -INFINITY, INFINITY};
    for (int i = 0; i < 12; i++)
        x[n++] = special[i];
    fk_evict_exp(x, n, y);
    double worst = 0;
    for (int i = 0; i < n; i++) {
        if (fabs(x[i]) <= 708.0) {
            long double e = expl((long double)x[i]);
            double ulp = ldexp(1.0, ilogb((double)e) - 52);
            double err = (double)fabsl((long double)y[i] - e) / ulp;
            ck_assert_msg(err < 2.0, "exp(%.17g) = %.17g, %.2f ulp from expl", x[i], y[i], err);
            worst = err > worst ? err : worst;
        } else {
            ck_assert_msg(y[i] == exp(x[i]), "exp(%.17g) = %.17g, libm %.17g", x[i], y[i],
                          exp(x[i]));
        }
    }
    double nan_in = NAN, nan_out;
    fk_evict_exp(&nan_in, 1, &nan_out);
    ck_assert(isnan(nan_out));
    ck_assert_msg(worst > 0.3, "worst error %.3f ulp: the test points miss the rounding", worst);
    free(x);
    free(y);
}
END_TEST

START_TEST(test_streaming)
{
    const struct fk_evict_ops *ops = fk_evict_find("streaming");
    ck_assert_ptr_nonnull(ops);
    static struct data d;
    static masks_t got, want;
    make_data(&d, 1);
    void *o = opts_of(ops);
    int cases[][2] = {{4, 16}, {0, 1}, {2, 60}, {4, 200}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        set_opt(ops, o, "sinks", cases[c][0]);
        set_opt(ops, o, "recent", cases[c][1]);
        drive(ops, o, &d, 0, got);
        ref_streaming(&d, cases[c][0], cases[c][1], want);
        expect_same(ops, got, want, "sinks + window");
    }
    free(o);
}
END_TEST

START_TEST(test_snapkv)
{
    const struct fk_evict_ops *ops = fk_evict_find("snapkv");
    ck_assert_ptr_nonnull(ops);
    static struct data d;
    static masks_t got, want;
    void *o = opts_of(ops);
    int cases[][3] = {{8, 5, 20}, {8, 3, 9}, {16, 7, 30}, {4, 1, 4}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        make_data(&d, 10 + c);
        set_opt(ops, o, "window", cases[c][0]);
        set_opt(ops, o, "kernel", cases[c][1]);
        set_opt(ops, o, "budget", cases[c][2]);
        drive(ops, o, &d, 0, got);
        ref_snapkv(&d, cases[c][0], cases[c][1], cases[c][2], want);
        expect_same(ops, got, want, "kvpress SnapKV");
        ck_assert_int_eq(count_kept(got, 0, 0), cases[c][2]);
    }
    /* ratio: int(P (1 - ratio)) tokens */
    set_opt(ops, o, "budget", 0);
    set_opt(ops, o, "window", 8);
    set_opt(ops, o, "kernel", 5);
    set_opt(ops, o, "ratio", 0.7);
    drive(ops, o, &d, 0, got);
    ref_snapkv(&d, 8, 5, (int)(P * (1 - 0.7)), want);
    expect_same(ops, got, want, "ratio 0.7");
    free(o);
}
END_TEST

START_TEST(test_knorm)
{
    const struct fk_evict_ops *ops = fk_evict_find("knorm");
    ck_assert_ptr_nonnull(ops);
    static struct data d;
    static masks_t got, want;
    make_data(&d, 3);
    void *o = opts_of(ops);
    set_opt(ops, o, "budget", 13);
    drive(ops, o, &d, 0, got);
    ref_knorm(&d, 13, want);
    expect_same(ops, got, want, "lowest norms");
    set_opt(ops, o, "budget", 0);
    set_opt(ops, o, "ratio", 1.0); /* keeps int(0): refused (kvpress PR #264 floors it to 1) */
    ck_assert_int_eq(ops->check_prompt(o, 3, H, P), FK_ECONFIG);
    ck_assert_ptr_nonnull(strstr(fk_errmsg(), "layer 0, KV head 0"));
    ck_assert_ptr_nonnull(strstr(fk_errmsg(), "knorm"));
    set_opt(ops, o, "ratio", 0.99); /* int(40 x 0.01) = 0 too; 0.975 keeps 1 */
    ck_assert_int_eq(ops->check_prompt(o, 3, H, P), FK_ECONFIG);
    set_opt(ops, o, "ratio", 0.975);
    ck_assert_int_eq(ops->check_prompt(o, 3, H, P), FK_OK);
    drive(ops, o, &d, 0, got);
    ref_knorm(&d, 1, want);
    expect_same(ops, got, want, "1 token");
    ck_assert_int_eq(count_kept(got, 0, 1), 1);
    /* ties go to the lower token: every key of head 1 has the same norm */
    for (int j = 0; j < T; j++)
        for (int c = 0; c < M; c++)
            d.k[1][j][c] = (float)((c + j) % M == 0 ? 2.0 : 0.0);
    set_opt(ops, o, "budget", 7);
    drive(ops, o, &d, 0, got);
    for (int j = 0; j < P; j++)
        ck_assert_int_eq(got[0][1][j], j < 7);
    free(o);
}
END_TEST

/* The budget arithmetic against the spec's worked vectors (families-budgets-2026.md T1,
 * kvpress PyramidKVPress) and Ada-KV's split of T2. */
START_TEST(test_budget_vectors)
{
    struct fk_evict_budget b = {.ratio = 0.5, .alloc = FK_ALLOC_PYRAMID, .safeguard = 0.2,
                                .pyramid_beta = 20};
    static const int t11[] = {3994, 2697, 1399, 102}, t12[] = {1984, 1344, 704, 64};
    for (int l = 0; l < 4; l++) {
        ck_assert_int_eq(fk_evict_budget_layer(&b, 4096, 64, 4, l), t11[l]);
        ck_assert_int_eq(fk_evict_budget_layer(&b, 2048, 64, 4, l), t12[l]);
    }
    /* T1.4: 32 layers */
    static const int t14a[] = {960, 931, 902, 122, 93, 64}, t14b[] = {3994, 3868, 3743, 353,
                                                                      228, 102};
    long sa = 0, sb = 0;
    for (int l = 0; l < 32; l++) {
        int a = fk_evict_budget_layer(&b, 1024, 64, 32, l), c = fk_evict_budget_layer(&b, 4096,
                                                                                     64, 32, l);
        sa += a, sb += c;
        int i = l < 3 ? l : l >= 29 ? l - 26 : -1;
        if (i >= 0) {
            ck_assert_int_eq(a, t14a[i]);
            ck_assert_int_eq(c, t14b[i]);
        }
    }
    ck_assert_int_eq(sa, 16384);
    ck_assert_int_eq(sb, 65536);
    /* T1.3: infeasible pyramids fall back to uniform round(n): 1024; 205 where int gives 204 */
    b.ratio = 0.75;
    for (int l = 0; l < 4; l++)
        ck_assert_int_eq(fk_evict_budget_layer(&b, 4096, 64, 4, l), 1024);
    b.ratio = 0.8;
    ck_assert_int_eq(fk_evict_budget_layer(&b, 1024, 64, 32, 7), 205);
    b.alloc = FK_ALLOC_UNIFORM;
    ck_assert_int_eq(fk_evict_budget_layer(&b, 1024, 64, 32, 7), 204);
    /* ... and L = 10, r = 0.96 (kvpress #265): without a window the pyramid is feasible,
     * round(0.78) = 1 and round(0.02) = 0 tokens: refused, naming the layer and head */
    b.alloc = FK_ALLOC_PYRAMID;
    b.ratio = 0.96;
    ck_assert_int_eq(fk_evict_budget_check(&b, "knorm", 0, 2, 4, 10), FK_ECONFIG);
    ck_assert_ptr_nonnull(strstr(fk_errmsg(), "layer 1, KV head 0"));
    ck_assert_int_eq(fk_evict_budget_check(&b, "snapkv", 2, 2, 4, 10), FK_OK); /* a window */

    /* T2: one layer, 2 heads, 8 tokens, n_kept 4 */
    static const double sc[2][8] = {{0.9, 0.8, 0.7, 0.6, 0.05, 0.04, 0.03, 0.02},
                                    {0.5, 0.015, 0.014, 0.013, 0.012, 0.011, 0.010, 0.009}};
    static const struct { double alpha; int kept_a, kept_b; } t2[] = {
        {0.25, 7, 1}, {0.5, 6, 2}, {1.0, 4, 4}};
    for (size_t c = 0; c < 3; c++) {
        uint8_t keep[2][8];
        memset(keep, 1, sizeof keep);
        struct fk_evict_env env = {.n_layers = 1, .n_kv_heads = 2, .n_q_heads = 2,
                                   .head_dim = 1, .n_tokens = 8, .prompt_len = 8,
                                   .keep = &keep[0][0]};
        void *st;
        ck_assert_int_eq(fk_evict_base_open(&env, sizeof(struct fk_evict_base), 0, 0, &st), FK_OK);
        struct fk_evict_budget a = {.ratio = 0.5, .alloc = FK_ALLOC_ADA,
                                    .safeguard = t2[c].alpha, .pyramid_beta = 20};
        ck_assert_int_eq(fk_evict_budget_apply(st, &a, 0, &sc[0][0]), FK_OK);
        fk_evict_base_close(st);
        for (int j = 0; j < 8; j++) {
            ck_assert_int_eq(keep[0][j], j < t2[c].kept_a);
            ck_assert_int_eq(keep[1][j], j < t2[c].kept_b);
        }
    }
    /* a safeguard of int(4 x 0.2) = 0 tokens and nothing protected: refused */
    struct fk_evict_budget a0 = {.ratio = 0.5, .alloc = FK_ALLOC_ADA, .safeguard = 0.2,
                                 .pyramid_beta = 20};
    ck_assert_int_eq(fk_evict_budget_check(&a0, "knorm", 0, 1, 2, 8), FK_ECONFIG);
    ck_assert_ptr_nonnull(strstr(fk_errmsg(), "safeguard"));
    ck_assert_int_eq(fk_evict_budget_check(&a0, "snapkv", 1, 1, 2, 8), FK_OK);
}
END_TEST

/* SnapKV and KNorm under PyramidKV's and Ada-KV's budgets against the references: the
 * scores of ref_snapkv_scores / the key norms, the counts of ref_pyramid, the split of
 * ref_ada. */
START_TEST(test_alloc_policies)
{
    const struct fk_evict_ops *sn = fk_evict_find("snapkv"), *kn = fk_evict_find("knorm");
    static struct data d;
    static masks_t got, want;
    static double sc[H][T];
    uint8_t mk[H][T];
    void *o = opts_of(sn);
    set_opt(sn, o, "window", 8);
    set_opt(sn, o, "kernel", 5);
    set_opt(sn, o, "budget", 20);
    set_opt(sn, o, "pyramid_beta", 2);
    ck_assert_int_eq(fk_evict_opts_set_enum(sn, o, fk_evict_option(sn, "alloc"), "pyramid"),
                     FK_OK);
    make_data(&d, 70);
    g_n_layers = 4;
    int total = 0;
    for (g_layer = 0; g_layer < 4; g_layer++) {
        int n = ref_pyramid(P, 8, 20, 2, 4, g_layer);
        total += n;
        drive(sn, o, &d, 0, got);
        ref_snapkv(&d, 8, 5, n, want);
        expect_same(sn, got, want, "PyramidKV");
        ck_assert_int_eq(count_kept(got, 0, 1), n);
    }
    ck_assert_int_eq(total, 4 * 20); /* 30, 23, 17, 10: the mean is the budget */
    /* Ada-KV: the heads' counts differ, the layer's total is H n */
    ck_assert_int_eq(fk_evict_opts_set_enum(sn, o, fk_evict_option(sn, "alloc"), "ada"), FK_OK);
    set_opt(sn, o, "window", 4);
    set_opt(sn, o, "budget", 14);
    set_opt(sn, o, "safeguard", 0.3);
    int uneven = 0;
    for (int seed = 0; seed < 4; seed++) {
        make_data(&d, 80 + seed);
        drive(sn, o, &d, 0, got);
        ref_snapkv_scores(&d, 4, 5, sc);
        ref_ada(sc, 14, 0.3, mk);
        ref_append_decode(mk, want);
        expect_same(sn, got, want, "Ada-KV");
        ck_assert_int_eq(count_kept(got, 0, 0) + count_kept(got, 0, 1), 2 * 14);
        uneven += count_kept(got, 0, 0) != 14;
        ck_assert_int_ge(count_kept(got, 0, 1), 4);
    }
    ck_assert_msg(uneven > 0, "Ada-KV never moved budget between heads on this data");
    free(o);
    /* KNorm (nothing protected) under Ada-KV */
    o = opts_of(kn);
    ck_assert_int_eq(fk_evict_opts_set_enum(kn, o, fk_evict_option(kn, "alloc"), "ada"), FK_OK);
    set_opt(kn, o, "budget", 10);
    set_opt(kn, o, "safeguard", 0.25);
    make_data(&d, 90);
    for (int h = 0; h < H; h++)
        for (int j = 0; j < T; j++)
            for (int c = 0; c < M; c++)
                d.k[h][j][c] *= h ? 0.1f : 1.0f; /* head 1's norms lower: it wins the top-k */
    g_layer = 0;
    drive(kn, o, &d, 0, got);
    for (int h = 0; h < H; h++)
        for (int j = 0; j < T; j++)
            sc[h][j] = j < P ? -sqrt(dotd(d.k[h][j], d.k[h][j])) : 0;
    ref_ada(sc, 10, 0.25, mk);
    ref_append_decode(mk, want);
    expect_same(kn, got, want, "KNorm, Ada-KV");
    ck_assert_int_eq(count_kept(got, 0, 0), 2); /* int(10 x 0.25): the safeguard only */
    free(o);
    g_n_layers = 1;
}
END_TEST

/* R-KV: the spec's worked example T4.1 (one head, 2-D keys: the duplicate of a later key
 * goes), then the policy against ref_rkv on the random data, prefill and decode. */
START_TEST(test_rkv)
{
    const struct fk_evict_ops *ops = fk_evict_find("rkv");
    ck_assert_ptr_nonnull(ops);
    void *o = opts_of(ops);
    static const float k6[6][2] = {{1, 0}, {0.96f, 0.28f}, {0, 1}, {0.6f, 0.8f}, {1, 0},
                                   {-1, 0}};
    static const float q6[6][2] = {{0, 0}, {0, 0}, {0, 0}, {0, 0}, {1, 0}, {0, 1}};
    static const int32_t qr6[6] = {0, 1, 2, 3, 4, 5};
    for (int kern = 1; kern <= 7; kern += 6) {
        uint8_t keep[6];
        memset(keep, 1, sizeof keep);
        struct fk_evict_env env = {.n_layers = 1, .n_kv_heads = 1, .n_q_heads = 1,
                                   .head_dim = 2, .n_tokens = 6, .prompt_len = 6, .keep = keep};
        set_opt(ops, o, "budget", 4);
        set_opt(ops, o, "window", 2);
        set_opt(ops, o, "kernel", kern);
        void *st;
        ck_assert_int_eq(ops->open(o, &env, &st), FK_OK);
        struct fk_evict_view v = {.t = 5, .k = &k6[0][0], .q = &q6[0][0], .n_qrows = 6,
                                  .qrow = qr6};
        ck_assert_int_eq(ops->prefill(st, &v), FK_OK);
        ops->close(st);
        for (int j = 0; j < 6; j++)
            ck_assert_msg(keep[j] == (j >= 2), "kernel %d: token %d kept %d", kern, j, keep[j]);
    }
    static struct data d;
    static masks_t got, want;
    int cases[][4] = {{20, 4, 7, 16}, {12, 3, 1, 5}, {30, 8, 3, 32}, {50, 2, 5, 7}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        make_data(&d, 100 + c);
        set_opt(ops, o, "budget", cases[c][0]);
        set_opt(ops, o, "window", cases[c][1]);
        set_opt(ops, o, "kernel", cases[c][2]);
        set_opt(ops, o, "period", cases[c][3]);
        set_opt(ops, o, "mix_lambda", 0.1 + 0.2 * c);
        drive(ops, o, &d, 0, got);
        ref_rkv(&d, cases[c][0], cases[c][1], cases[c][2], cases[c][3], 0.1 + 0.2 * c, want);
        expect_same(ops, got, want, "R-KV");
        /* right after a compression a head holds the budget and the arriving token; the
         * cache never grows beyond budget + period between compressions */
        int at_budget = 0;
        for (int s = 1; s <= T - P; s++) {
            int n = count_kept(got, s, 0);
            at_budget += n == cases[c][0] + 1;
            ck_assert_int_le(n, (P > cases[c][0] ? cases[c][0] : P) + cases[c][3] + 1 +
                                    (P > cases[c][0] ? 0 : cases[c][0]));
        }
        ck_assert_msg(at_budget > 0, "case %zu: never compressed to the budget", c);
    }
    set_opt(ops, o, "budget", 8);
    set_opt(ops, o, "window", 8);
    ck_assert_int_eq(ops->check(o), FK_ECONFIG);
    ck_assert_ptr_nonnull(strstr(fk_errmsg(), "budget = 8 must exceed window = 8"));
    free(o);
}
END_TEST

/* DMSPress: the spec's worked example T7.1 (scores s_j as key norms 1 - s_j, threshold -1
 * on -||k||), then against ref_dms on the random data. */
START_TEST(test_dms)
{
    const struct fk_evict_ops *ops = fk_evict_find("dms");
    ck_assert_ptr_nonnull(ops);
    void *o = opts_of(ops);
    static const double s8[8] = {0.9, -0.5, 0.3, -0.2, 0.1, -0.7, 0.4, -1.0};
    float k8[8][2];
    for (int j = 0; j < 8; j++)
        k8[j][0] = (float)(1 - s8[j]), k8[j][1] = 0;
    set_opt(ops, o, "threshold", -1);
    set_opt(ops, o, "window", 2);
    ck_assert_int_eq(fk_evict_opts_set_enum(ops, o, fk_evict_option(ops, "scorer"), "knorm"),
                     FK_OK);
    uint8_t keep[8] = {0};
    memset(keep, 1, 5);
    struct fk_evict_env env = {.n_layers = 1, .n_kv_heads = 1, .n_q_heads = 1, .head_dim = 2,
                               .n_tokens = 8, .prompt_len = 5, .keep = keep};
    void *st;
    ck_assert_int_eq(ops->open(o, &env, &st), FK_OK);
    struct fk_evict_view v = {.t = 4, .k = &k8[0][0]};
    ck_assert_int_eq(ops->prefill(st, &v), FK_OK);
    static const char *const want8[] = {"10111", "101111", "1010111", "10101111"};
    for (int t = 4; t < 8; t++) {
        if (t > 4) {
            keep[t] = 1;
            v.t = t;
            ck_assert_int_eq(ops->decode(st, &v), FK_OK);
        }
        for (int j = 0; j <= t; j++)
            ck_assert_msg(keep[j] == want8[t - 4][j] - '0', "token %d at %d: %d", j, t, keep[j]);
    }
    ops->close(st);
    static struct data d;
    static masks_t got, want;
    static const struct { double thr; int window, decoding, rel; } cases[] = {
        {-1.1, 8, 1, 1}, {-0.9, 1, 1, 1}, {-1.0, 30, 0, 1}, {-4.5, 3, 1, 0}};
    int dropped = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        make_data(&d, 120 + c);
        set_opt(ops, o, "threshold", cases[c].thr);
        set_opt(ops, o, "window", cases[c].window);
        set_opt(ops, o, "decoding", cases[c].decoding);
        ck_assert_int_eq(fk_evict_opts_set_enum(ops, o, fk_evict_option(ops, "scorer"),
                                                cases[c].rel ? "knorm_rel" : "knorm"), FK_OK);
        drive(ops, o, &d, 0, got);
        ref_dms(&d, cases[c].thr, cases[c].window, cases[c].decoding, cases[c].rel, want);
        expect_same(ops, got, want, "DMSPress");
        dropped += T - count_kept(got, T - P, 0);
    }
    ck_assert_msg(dropped > 20, "the thresholds drop %d tokens: the cases test nothing", dropped);
    free(o);
}
END_TEST

/* Expected Attention: the spec's worked example T8.1 (D = 2: one frequency, 1), then the
 * policy against ref_expected on the random data (positions with a gap), uniform and
 * Ada-KV budgets; a view without the RoPE is refused. */
START_TEST(test_expected)
{
    const struct fk_evict_ops *ops = fk_evict_find("expected_attn");
    ck_assert_ptr_nonnull(ops);
    void *o = opts_of(ops);
    struct fk_rope rope = {.theta = 10000, .layout = FK_ROPE_INTERLEAVED};
    /* T8.1: pre-RoPE queries (1, 0), (1, 0.2), (1, -0.2) rotated to their positions */
    static const double qpre[3][2] = {{1, 0}, {1, 0.2}, {1, -0.2}};
    float q3[3][2], k3[3][2] = {{1, 0}, {0, 1}, {-1, 0}}, v3[3][2] = {{1, 0}, {0, 2}, {1, 0}};
    for (int t = 0; t < 3; t++) {
        q3[t][0] = (float)(qpre[t][0] * cos(t) - qpre[t][1] * sin(t));
        q3[t][1] = (float)(qpre[t][0] * sin(t) + qpre[t][1] * cos(t));
    }
    static const int32_t pos3[3] = {0, 1, 2}, qr3[3] = {0, 1, 2};
    set_opt(ops, o, "n_sink", 0);
    set_opt(ops, o, "n_future", 2);
    static const struct { int budget, vnorm; const char *keep; } t8[] = {
        {2, 1, "011"}, {1, 1, "001"}, {1, 0, "001"}};
    for (size_t c = 0; c < 3; c++) {
        uint8_t keep[3] = {1, 1, 1};
        struct fk_evict_env env = {.n_layers = 1, .n_kv_heads = 1, .n_q_heads = 1,
                                   .head_dim = 2, .n_tokens = 3, .prompt_len = 3, .keep = keep,
                                   .rope = &rope, .positions = pos3};
        set_opt(ops, o, "budget", t8[c].budget);
        set_opt(ops, o, "vnorm", t8[c].vnorm);
        void *st;
        ck_assert_int_eq(ops->open(o, &env, &st), FK_OK);
        struct fk_evict_view v = {.t = 2, .k = &k3[0][0], .v = &v3[0][0], .q = &q3[0][0],
                                  .n_qrows = 3, .qrow = qr3};
        ck_assert_int_eq(ops->prefill(st, &v), FK_OK);
        /* the scores themselves: T8.1's 0.177277, 0.511920, 0.566763 (vnorm) */
        const double *sc = ((struct fk_evict_base *)st)->acc;
        if (t8[c].vnorm) {
            ck_assert_double_eq_tol(sc[0], 0.177277, 2e-6);
            ck_assert_double_eq_tol(sc[1], 0.511920, 2e-6);
            ck_assert_double_eq_tol(sc[2], 0.566763, 2e-6);
        } else {
            ck_assert_double_eq_tol(sc[1], 0.255960, 2e-6);
        }
        ops->close(st);
        for (int j = 0; j < 3; j++)
            ck_assert_int_eq(keep[j], t8[c].keep[j] - '0');
    }
    /* random data: positions 0 .. P-1 then a jump of 7 */
    static struct data d;
    static masks_t got, want;
    static double sc[H][T];
    static int32_t pos[T];
    uint8_t mk[H][T];
    for (int t = 0; t < T; t++)
        pos[t] = t < 20 ? t : t + 7;
    g_rope = &rope;
    g_pos = pos;
    static const struct { int n_future, n_sink, cov, vnorm, budget, ada; double eps; } cases[] =
        {{16, 4, 1, 1, 15, 0, 0}, {5, 0, 0, 1, 9, 0, 0.01}, {32, 2, 1, 0, 20, 0, 0},
         {8, 3, 1, 1, 12, 1, 0.01}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        make_data(&d, 140 + c);
        set_opt(ops, o, "n_future", cases[c].n_future);
        set_opt(ops, o, "n_sink", cases[c].n_sink);
        set_opt(ops, o, "covariance", cases[c].cov);
        set_opt(ops, o, "vnorm", cases[c].vnorm);
        set_opt(ops, o, "budget", cases[c].budget);
        set_opt(ops, o, "epsilon", cases[c].eps);
        set_opt(ops, o, "safeguard", 0.5);
        ck_assert_int_eq(fk_evict_opts_set_enum(ops, o, fk_evict_option(ops, "alloc"),
                                                cases[c].ada ? "ada" : "uniform"), FK_OK);
        drive(ops, o, &d, 0, got);
        ref_expected(&d, pos, cases[c].n_future, cases[c].n_sink, cases[c].cov,
                     cases[c].vnorm, cases[c].eps, sc);
        if (cases[c].ada) {
            ref_ada(sc, cases[c].budget, 0.5, mk);
        } else {
            uint8_t cand[T] = {0};
            memset(cand, 1, P);
            memset(mk, 0, sizeof mk);
            for (int h = 0; h < H; h++) {
                memset(mk[h], 1, P);
                keep_best(mk[h], cand, sc[h], P, cases[c].budget);
            }
        }
        ref_append_decode(mk, want);
        expect_same(ops, got, want, "Expected Attention");
    }
    /* no RoPE in the view: refused */
    g_rope = NULL;
    uint8_t keep[H][T];
    memset(keep, 1, sizeof keep);
    struct fk_evict_env env = {.n_layers = 1, .n_kv_heads = H, .n_q_heads = HQ, .head_dim = M,
                               .n_tokens = T, .prompt_len = P, .keep = &keep[0][0]};
    void *st;
    ck_assert_int_eq(ops->open(o, &env, &st), FK_OK);
    struct fk_evict_view v = {.t = P - 1, .k = &d.k[0][0][0], .v = &d.v[0][0][0],
                              .q = &d.q[0][0][0], .n_qrows = T, .qrow = d.qrow};
    ck_assert_int_eq(ops->prefill(st, &v), FK_ECONFIG);
    ops->close(st);
    ck_assert(ops->needs(o) & FK_EVICT_NEED_ROPE);
    g_pos = NULL;
    free(o);
}
END_TEST

/* DuoAttention's split: the spec's worked example T3.1 (2 layers x 2 KV heads, gates
 * [[0.9, 0.1], [0.4, 0.7]], head_ratio 0.5: heads (0, 1) and (1, 0) stream; sinks 2, recent 3
 * of 10 prompt tokens: 2 .. 6 dropped), the half-to-even count (5 heads x 0.5 = 2), then
 * both modes against StreamingLLM's reference on the streaming head of the random data. */
START_TEST(test_duo)
{
    const struct fk_evict_ops *ops = fk_evict_find("duo");
    ck_assert_ptr_nonnull(ops);
    void *o = opts_of(ops);
    set_opt(ops, o, "head_ratio", 0.5);
    set_opt(ops, o, "sinks", 2);
    set_opt(ops, o, "recent", 3);
    static const double gates[2][2] = {{0.9, 0.1}, {0.4, 0.7}};
    static const char *const want[2][2] = {{"1111111111", "1100000111"},
                                           {"1100000111", "1111111111"}};
    for (int l = 0; l < 2; l++) {
        uint8_t keep[2][10];
        memset(keep, 1, sizeof keep);
        struct fk_evict_env env = {.layer = l, .n_layers = 2, .n_kv_heads = 2, .n_q_heads = 2,
                                   .head_dim = 2, .n_tokens = 10, .prompt_len = 10,
                                   .keep = &keep[0][0], .head_scores = &gates[0][0]};
        void *st;
        ck_assert_int_eq(ops->open(o, &env, &st), FK_OK);
        struct fk_evict_view v = {.t = 9};
        ck_assert_int_eq(ops->prefill(st, &v), FK_OK);
        ops->close(st);
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < 10; j++)
                ck_assert_msg(keep[h][j] == want[l][h][j] - '0', "layer %d head %d token %d", l,
                              h, j);
    }
    /* no pattern: refused */
    uint8_t k1[10];
    struct fk_evict_env bad = {.n_layers = 1, .n_kv_heads = 1, .n_q_heads = 1, .head_dim = 2,
                               .n_tokens = 10, .prompt_len = 10, .keep = k1};
    void *st = NULL;
    ck_assert_int_eq(ops->open(o, &bad, &st), FK_ECONFIG);
    ck_assert_ptr_nonnull(strstr(fk_errmsg(), "head_pattern"));
    /* 5 pairs x 0.5 = 2.5 rounds to 2 streaming heads (half to even) */
    static const double g5[5] = {0.5, 0.1, 0.3, 0.2, 0.9};
    int streaming = 0;
    for (int l = 0; l < 5; l++) {
        uint8_t keep[10];
        memset(keep, 1, sizeof keep);
        struct fk_evict_env env = {.layer = l, .n_layers = 5, .n_kv_heads = 1, .n_q_heads = 1,
                                   .head_dim = 2, .n_tokens = 10, .prompt_len = 10,
                                   .keep = keep, .head_scores = g5};
        ck_assert_int_eq(ops->open(o, &env, &st), FK_OK);
        struct fk_evict_view v = {.t = 9};
        ck_assert_int_eq(ops->prefill(st, &v), FK_OK);
        ops->close(st);
        streaming += !keep[5];
        ck_assert_int_eq(!keep[5], l == 1 || l == 3); /* the gates 0.1 and 0.2 */
    }
    ck_assert_int_eq(streaming, 2);
    /* the random data: head 1 streams, head 0 keeps everything; both modes */
    static const double g2[2] = {0.8, 0.2};
    static struct data d;
    static masks_t got, want_s;
    make_data(&d, 160);
    g_heads = g2;
    set_opt(ops, o, "sinks", 4);
    set_opt(ops, o, "recent", 9);
    for (int rolling = 0; rolling < 2; rolling++) {
        set_opt(ops, o, "rolling", rolling);
        drive(ops, o, &d, 0, got);
        ref_streaming(&d, 4, 9, want_s);
        for (int s = 0; s <= T - P; s++) {
            int t = s == 0 ? P - 1 : P + s - 1;
            for (int j = 0; j <= t; j++) {
                ck_assert_int_eq(got[s][0][j], 1);
                int w = rolling || s == 0 ? want_s[s][1][j] : j >= P || want_s[0][1][j];
                ck_assert_msg(got[s][1][j] == w, "rolling %d hook %d token %d", rolling, s, j);
            }
        }
    }
    g_heads = NULL;
    free(o);
}
END_TEST

START_TEST(test_h2o)
{
    const struct fk_evict_ops *ops = fk_evict_find("h2o");
    ck_assert_ptr_nonnull(ops);
    static struct data d;
    static masks_t got, want;
    void *o = opts_of(ops);
    int cases[][2] = {{10, 6}, {3, 1}, {0, 5}, {25, 20}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        make_data(&d, 20 + c);
        set_opt(ops, o, "heavy", cases[c][0]);
        set_opt(ops, o, "recent", cases[c][1]);
        drive(ops, o, &d, 0, got);
        ref_h2o(&d, cases[c][0], cases[c][1], want);
        expect_same(ops, got, want, "accumulated attention");
        ck_assert_int_eq(count_kept(got, T - P, 0), cases[c][0] + cases[c][1] + 1);
    }
    free(o);
}
END_TEST

START_TEST(test_scope_momentum)
{
    const struct fk_evict_ops *sc = fk_evict_find("scope"), *mo = fk_evict_find("momentum");
    ck_assert_ptr_nonnull(sc);
    ck_assert_ptr_nonnull(mo);
    static struct data d;
    static masks_t got, want;
    void *o = opts_of(sc);
    int cases[][4] = {{20, 5, 0, 1}, {7, 1, 0, 1}, {30, 4, 1, 3}, {12, 12, 0, 1},
                      {30, 4, 2, 3}, {9, 2, 2, 4}, {40, 6, 2, 1}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        make_data(&d, 30 + c);
        set_opt(sc, o, "decode_budget", cases[c][0]);
        set_opt(sc, o, "recent", cases[c][1]);
        set_opt(sc, o, "variant", cases[c][2]);
        set_opt(sc, o, "delta", cases[c][3]);
        drive(sc, o, &d, 0, got);
        ref_decode_phase(&d, cases[c][0], cases[c][1], cases[c][2], cases[c][3], -1, want);
        expect_same(sc, got, want, "SCOPE");
        if (!cases[c][2])
            ck_assert_int_eq(count_kept(got, T - P, 1), P + cases[c][0]);
        /* jump alone lets the cache exceed its budget between compressions */
        int over = 0;
        for (int s = 1; s <= T - P; s++) {
            int t = P + s - 1, b = cases[c][1] + (t - P) / cases[c][3];
            b = cases[c][2] == 0 || b > cases[c][0] ? cases[c][0] : b;
            over += count_kept(got, s, 0) > P + b;
        }
        ck_assert_msg(cases[c][2] == 2 ? over > 0 : over == 0, "case %zu: %d steps over the "
                      "budget", c, over);
    }
    free(o);
    o = opts_of(mo);
    double alphas[] = {0.9, 0.0, 1.0, 0.5};
    for (size_t c = 0; c < 4; c++) {
        make_data(&d, 40 + c);
        set_opt(mo, o, "alpha", alphas[c]);
        set_opt(mo, o, "decode_budget", 15 + 3 * (int)c);
        set_opt(mo, o, "recent", 2 + (int)c);
        drive(mo, o, &d, 0, got);
        ref_decode_phase(&d, 15 + 3 * (int)c, 2 + (int)c, 0, 1, alphas[c], want);
        expect_same(mo, got, want, "Moment-KV");
    }
    free(o);
}
END_TEST

/* Causality: a planted huge key at token tp (aligned with every query) changes no kept set
 * before tp arrives; rows after the current token poisoned with NaN change nothing. */
START_TEST(test_causality)
{
    static struct data d, d2;
    static masks_t a, b;
    static int32_t pos[T];
    struct fk_rope rope = {.theta = 10000, .layout = FK_ROPE_HALF};
    for (int t = 0; t < T; t++)
        pos[t] = t;
    static const double heads[H] = {0.2, 0.8};
    g_rope = &rope; /* for the policies that read it (FK_EVICT_NEED_ROPE, _HEADS) */
    g_pos = pos;
    g_heads = heads;
    for (int i = 0; fk_evict_policies[i]; i++) {
        const struct fk_evict_ops *ops = fk_evict_policies[i];
        void *o = opts_of(ops);
        /* budgets small enough that every policy evicts on this data */
        const char *small[][2] = {{"recent", "6"}, {"heavy", "5"}, {"budget", "12"},
                                  {"window", "4"}, {"decode_budget", "10"}, {"sinks", "2"}};
        for (size_t s = 0; s < sizeof small / sizeof small[0]; s++)
            if (fk_evict_option(ops, small[s][0]))
                set_opt(ops, o, small[s][0], atof(small[s][1]));
        make_data(&d, 50);
        drive(ops, o, &d, 0, a);
        drive(ops, o, &d, 1, b);
        expect_same(ops, b, a, "future rows poisoned");
        for (int tp = P + 5; tp < T; tp += 23) {
            memcpy(&d2, &d, sizeof d);
            for (int h = 0; h < H; h++)
                for (int c = 0; c < M; c++)
                    d2.k[h][tp][c] = 1e3f * d.q[h * G][tp][c];
            drive(ops, o, &d2, 0, b);
            int changed = 0;
            for (int s = 0; s <= T - P; s++) {
                int t = s == 0 ? P - 1 : P + s - 1;
                int diff = memcmp(a[s], b[s], sizeof a[s]) != 0;
                ck_assert_msg(t >= tp || !diff, "%s: a key planted at %d changed the kept set "
                              "at %d", ops->name, tp, t);
                changed |= diff;
            }
            (void)changed;
        }
        free(o);
    }
    g_rope = NULL;
    g_pos = NULL;
    g_heads = NULL;
}
END_TEST

START_TEST(test_options_and_names)
{
    const struct fk_evict_ops *sc = fk_evict_find("scope");
    void *o = opts_of(sc);
    set_opt(sc, o, "recent", 300);
    set_opt(sc, o, "decode_budget", 100);
    ck_assert_int_eq(sc->check(o), FK_ECONFIG);
    ck_assert_ptr_nonnull(strstr(fk_errmsg(), "decode_budget"));
    free(o);
    const struct fk_evict_ops *sn = fk_evict_find("snapkv");
    o = opts_of(sn);
    ck_assert_int_eq(fk_evict_opts_set(sn, o, fk_evict_option(sn, "ratio"), 1.5), FK_ECONFIG);
    ck_assert_ptr_nonnull(strstr(fk_errmsg(), "snapkv"));
    set_opt(sn, o, "kernel", 4);
    ck_assert_int_eq(sn->check(o), FK_ECONFIG);
    free(o);
    ck_assert_ptr_null(fk_evict_find("nope"));
    /* no registered policy option collides with a registered codec's */
    for (int i = 0; fk_evict_policies[i]; i++)
        for (int c = 0; fk_codecs[c]; c++)
            ck_assert_msg(fk_evict_check_names(fk_evict_policies[i], fk_codecs[c]) == FK_OK,
                          "%s", fk_errmsg());
    /* a collision is refused, naming both */
    static const struct fk_option bad_opts[] = {
        {"n_b", FK_OPT_INT, 0, 1, 0, 10, NULL, "x"}, {NULL, 0, 0, 0, 0, 0, NULL, NULL}};
    struct fk_evict_ops bad = {.name = "bad", .options = bad_opts, .opts_size = sizeof(int)};
    ck_assert_int_eq(fk_evict_check_names(&bad, fk_codec_find("full")), FK_ECONFIG);
    ck_assert_ptr_nonnull(strstr(fk_errmsg(), "'n_b'"));
    ck_assert_ptr_nonnull(strstr(fk_errmsg(), "full"));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("evict");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_keep_top);
    tcase_add_test(tc, test_exp);
    tcase_add_test(tc, test_mirror);
    tcase_add_test(tc, test_streaming);
    tcase_add_test(tc, test_snapkv);
    tcase_add_test(tc, test_knorm);
    tcase_add_test(tc, test_budget_vectors);
    tcase_add_test(tc, test_alloc_policies);
    tcase_add_test(tc, test_h2o);
    tcase_add_test(tc, test_rkv);
    tcase_add_test(tc, test_dms);
    tcase_add_test(tc, test_expected);
    tcase_add_test(tc, test_duo);
    tcase_add_test(tc, test_scope_momentum);
    tcase_add_test(tc, test_causality);
    tcase_add_test(tc, test_options_and_names);
    suite_add_tcase(s, tc);
    return fk_suite_run(s);
}
