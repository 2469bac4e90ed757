/* SPDX-License-Identifier: MIT
 * rkv: R-KV for reasoning decodes (Zefan-Cai/R-KV rkv/compression/r1_kv.py R1KV.update_kv,
 * rkv/utils.py, rkv/modeling.py; spec families-budgets-2026.md section 4). The cache of a
 * KV head is compressed to `budget` tokens at the prefill's end when the prompt holds at
 * least `budget` tokens, and in the forward of every token tau with tau % period == 0
 * (the reference's `length % divide_length == 0`, prompt included); between compressions
 * it grows. A compression over the N kept tokens 0 .. tau of a head (nothing when N <
 * budget), with the queries of the last `window` tokens:
 *   importance  for each window query, the max over the KV head's query group of the
 *               logits, a softmax over the N - W older kept tokens (the window excluded,
 *               no causal mask), the mean over the window's queries, max_pool1d(kernel,
 *               padding kernel/2, -inf padding) along the cache;
 *   redundancy  S = the cosines of every pair of the N keys (norms + 1e-8), S_ii = 0; in
 *               each row i the last j with S_ij > sim_threshold zeroed (j = 0 when none,
 *               the reference's default); the column means over N, a softmax over all N,
 *               read at the older tokens (not renormalised);
 *   score       mix_lambda importance - (1 - mix_lambda) redundancy;
 * the budget - window best older tokens (ties to the lower token) and the window stay.
 * The reference compresses after the forward's attention, so the step's own attention
 * sees the cache before it: here that compression runs at the start of the next decode
 * hook, over tokens 0 .. tau (fk_evict.h). Logits are the layer's (q.k / inv_scale, soft
 * cap). The two products of a compression, the window's q.k and the normalised keys'
 * cosines, are SGEMMs (float products, double sums and softmaxes after them).
 */
#include <cblas.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "common/fk_err.h"
#include "evict/fk_evict_common.h"

struct rkv_opts {
    int budget, window, kernel, period;
    double mix_lambda, sim_threshold;
};

static const struct fk_option rkv_options[] = {
    {"budget", FK_OPT_INT, offsetof(struct rkv_opts, budget), 128, 2, 1 << 24, NULL,
     "tokens per KV head after each compression, the window included (tokens)"},
    {"window", FK_OPT_INT, offsetof(struct rkv_opts, window), 8, 1, 1 << 16, NULL,
     "observation window: the last tokens' queries score the cache, the tokens kept "
     "(tokens)"},
    {"kernel", FK_OPT_INT, offsetof(struct rkv_opts, kernel), 7, 1, 255, NULL,
     "max-pooling kernel of the importance along the cache (odd)"},
    {"period", FK_OPT_INT, offsetof(struct rkv_opts, period), 128, 1, 1 << 24, NULL,
     "compress in the forward of every token tau with tau % period = 0, prompt included "
     "(R-KV's divide_length; tokens)"},
    {"mix_lambda", FK_OPT_DOUBLE, offsetof(struct rkv_opts, mix_lambda), 0.1, 0, 1, NULL,
     "weight of importance against redundancy (R-KV's lambda; README default 0.1)"},
    {"sim_threshold", FK_OPT_DOUBLE, offsetof(struct rkv_opts, sim_threshold), 0.5, -1, 1,
     NULL, "key cosine above which a row's last similar token is exempted (cal_similarity)"},
    {NULL, 0, 0, 0, 0, 0, NULL, NULL},
};

static int rkv_check(const void *opts)
{
    const struct rkv_opts *o = opts;
    if (o->kernel % 2 == 0)
        return fk_err(FK_ECONFIG, "rkv: kernel = %d must be odd (max_pool1d with padding "
                      "kernel/2 keeps the length)", o->kernel);
    if (o->budget <= o->window)
        return fk_err(FK_ECONFIG, "rkv: budget = %d must exceed window = %d (R1KV asserts "
                      "it)", o->budget, o->window);
    return FK_OK;
}

static unsigned rkv_needs(const void *opts)
{
    (void)opts;
    return FK_EVICT_NEED_PREFILL_Q | FK_EVICT_NEED_DECODE_Q;
}

static int rkv_prefill_queries(const void *opts, int prompt_len)
{
    int w = ((const struct rkv_opts *)opts)->window;
    return w < prompt_len ? w : prompt_len;
}

struct rkv {
    struct fk_evict_base b;      /* b.extra: [4][T + 1] the work arrays below */
    struct rkv_opts o;
    double *imp, *col, *nrm, *red; /* [N] each: importance, column sums, key norms,
                                    * redundancy */
    float *kn, *qg, *c;          /* normalised keys [N][m], window queries [W G][m],
                                  * products [N][N] (grown on demand) */
    size_t cap_kn, cap_qg, cap_c;
};

static void rkv_close(void *state)
{
    struct rkv *s = state;
    if (s) {
        free(s->kn);
        free(s->qg);
        free(s->c);
    }
    fk_evict_base_close(state);
}

static int rkv_open(const void *opts, const struct fk_evict_env *env, void **state)
{
    size_t T = (size_t)env->n_tokens + 1;
    FK_TRY(fk_evict_base_open(env, sizeof(struct rkv), 0, 4 * T, state));
    struct rkv *s = *state;
    s->o = *(const struct rkv_opts *)opts;
    s->imp = s->b.extra, s->col = s->imp + T, s->nrm = s->imp + 2 * T, s->red = s->imp + 3 * T;
    return FK_OK;
}

static int grow(float **p, size_t *cap, size_t n)
{
    if (n <= *cap)
        return FK_OK;
    float *q = realloc(*p, sizeof(float) * n);
    if (!q)
        return fk_err(FK_ENOMEM, "out of memory (rkv, %zu floats)", n);
    *p = q, *cap = n;
    return FK_OK;
}

static double logit(const struct fk_evict_env *e, double qk)
{
    double z = qk / (e->inv_scale > 0 ? e->inv_scale : sqrt((double)e->head_dim));
    return e->softcap > 0 ? e->softcap * tanh(z / e->softcap) : z;
}

/* The importance of the Np older kept tokens idx[0..Np) of head h under the queries of
 * tokens tau-W+1 .. tau (the W G query rows of the group in s->qg, the keys' rows in s->kn
 * before normalising: one SGEMM), max-pooled, into s->imp. */
static int importance(struct rkv *s, const struct fk_evict_view *v, int h, int Np, int tau)
{
    const struct fk_evict_env *e = &s->b.env;
    int m = e->head_dim, G = e->n_q_heads / e->n_kv_heads, W = s->o.window;
    const int32_t *idx = s->b.idx;
    FK_TRY(grow(&s->qg, &s->cap_qg, (size_t)W * G * m));
    for (int w = 0; w < W; w++) {
        int r = v->qrow[tau - W + 1 + w];
        if (r < 0)
            return fk_err(FK_EINVAL, "rkv: layer %d: token %d's query is not in the view",
                          e->layer, tau - W + 1 + w);
        for (int g = 0; g < G; g++)
            memcpy(s->qg + ((size_t)w * G + g) * m,
                   v->q + ((size_t)(h * G + g) * v->n_qrows + r) * m, sizeof(float) * m);
    }
    for (int i = 0; i < Np; i++)
        memcpy(s->kn + (size_t)i * m, v->k + ((size_t)h * e->n_tokens + idx[i]) * m,
               sizeof(float) * m);
    /* c [W G][Np] = qg kn^T */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, W * G, Np, m, 1.0f, s->qg, m, s->kn,
                m, 0.0f, s->c, Np);
    double *a = s->b.score, *z = s->red;
    for (int i = 0; i < Np; i++)
        a[i] = 0;
    for (int w = 0; w < W; w++) {
        double mx = -INFINITY, sum = 0;
        for (int i = 0; i < Np; i++) { /* the max over the group of the logits */
            double zi = -INFINITY;
            for (int g = 0; g < G; g++) {
                double l = logit(e, s->c[((size_t)w * G + g) * Np + i]);
                zi = l > zi ? l : zi;
            }
            z[i] = zi;
            mx = zi > mx ? zi : mx;
        }
        for (int i = 0; i < Np; i++)
            sum += (z[i] = exp(z[i] - mx));
        for (int i = 0; i < Np; i++)
            a[i] += z[i] / sum / W;
    }
    int half = s->o.kernel / 2;
    for (int i = 0; i < Np; i++) {
        double mx = -INFINITY;
        for (int d = -half; d <= half; d++)
            if (i + d >= 0 && i + d < Np && a[i + d] > mx)
                mx = a[i + d];
        s->imp[i] = mx;
    }
    return FK_OK;
}

/* The redundancy of the N kept tokens idx[0..N) of head h, into s->red (softmax of the
 * column means of the exempted cosine matrix; the cosines one SGEMM of the normalised
 * keys). */
static void redundancy(struct rkv *s, const struct fk_evict_view *v, int h, int N)
{
    const struct fk_evict_env *e = &s->b.env;
    int m = e->head_dim;
    const int32_t *idx = s->b.idx;
    for (int i = 0; i < N; i++) {
        const float *k = v->k + ((size_t)h * e->n_tokens + idx[i]) * m;
        double nn = 0;
        for (int c = 0; c < m; c++)
            nn += (double)k[c] * k[c];
        double inv = 1 / (sqrt(nn) + 1e-8);
        for (int c = 0; c < m; c++)
            s->kn[(size_t)i * m + c] = (float)(k[c] * inv);
        s->col[i] = 0;
    }
    cblas_ssyrk(CblasRowMajor, CblasUpper, CblasNoTrans, N, m, 1.0f, s->kn, m, 0.0f, s->c, N);
    for (int i = 0; i < N; i++) /* the lower triangle from the upper */
        for (int j = 0; j < i; j++)
            s->c[(size_t)i * N + j] = s->c[(size_t)j * N + i];
    for (int i = 0; i < N; i++) {
        float *row = s->c + (size_t)i * N;
        row[i] = 0;
        int last = 0;
        for (int j = 0; j < N; j++)
            if (row[j] > s->o.sim_threshold)
                last = j;
        row[last] = 0;
        for (int j = 0; j < N; j++)
            s->col[j] += row[j];
    }
    double mx = -INFINITY, sum = 0;
    for (int j = 0; j < N; j++) {
        s->col[j] /= N;
        mx = s->col[j] > mx ? s->col[j] : mx;
    }
    for (int j = 0; j < N; j++)
        sum += (s->red[j] = exp(s->col[j] - mx));
    for (int j = 0; j < N; j++)
        s->red[j] /= sum;
}

/* One compression of every head over the kept tokens 0 .. tau. */
static int rkv_compress(struct rkv *s, const struct fk_evict_view *v, int tau)
{
    const struct fk_evict_env *e = &s->b.env;
    int W = s->o.window, B = s->o.budget;
    double lam = s->o.mix_lambda;
    for (int h = 0; h < e->n_kv_heads; h++) {
        int N = fk_evict_kept(e, h, 0, tau + 1, s->b.idx);
        if (N <= B)
            continue;
        int Np = N - W, m = e->head_dim, G = e->n_q_heads / e->n_kv_heads;
        FK_TRY(grow(&s->kn, &s->cap_kn, (size_t)N * m));
        FK_TRY(grow(&s->c, &s->cap_c, (size_t)N * (N > W * G ? N : W * G)));
        FK_TRY(importance(s, v, h, Np, tau));
        redundancy(s, v, h, N);
        for (int i = 0; i < Np; i++)
            s->b.score[i] = lam * s->imp[i] - (1 - lam) * s->red[i];
        fk_evict_keep_top(s->b.score, s->b.idx, Np, B - W, e->keep + (size_t)h * e->n_tokens,
                          s->b.tmp);
    }
    return FK_OK;
}

static int rkv_prefill(void *state, const struct fk_evict_view *v)
{
    struct rkv *s = state;
    int P = s->b.env.prompt_len;
    /* the reference's first forward: the prompt's cache stored compressed when P >= budget
     * (the last `window` prompt tokens hold the window: P > budget > window) */
    return P > s->o.budget ? rkv_compress(s, v, P - 1) : FK_OK;
}

static int rkv_decode(void *state, const struct fk_evict_view *v)
{
    struct rkv *s = state;
    int tau = v->t - 1; /* the previous forward's token */
    if (tau >= s->b.env.prompt_len && tau % s->o.period == 0)
        return rkv_compress(s, v, tau);
    return FK_OK;
}

const struct fk_evict_ops fk_evict_rkv = {
    .name = "rkv",
    .summary = "R-KV (reasoning decodes): every `period` tokens the cache is cut to `budget` by "
               "lambda x window attention - (1 - lambda) x key redundancy, the window kept "
               "(Zefan-Cai/R-KV r1_kv.py)",
    .opts_size = sizeof(struct rkv_opts),
    .options = rkv_options,
    .check = rkv_check,
    .needs = rkv_needs,
    .prefill_queries = rkv_prefill_queries,
    .open = rkv_open,
    .prefill = rkv_prefill,
    .decode = rkv_decode,
    .close = rkv_close,
};
