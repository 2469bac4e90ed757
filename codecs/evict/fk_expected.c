/* SPDX-License-Identifier: MIT
 * expected_attn: Expected Attention as kvpress computes it (kvpress/presses/
 * expected_attention_press.py; spec families-budgets-2026.md section 8.1), once at the
 * prefill's end, per query head j of the layer:
 *   1. the prompt's queries un-rotated to pre-RoPE (q_pre = R(-p_t) q_post, the trace's
 *      RoPE), the first n_sink skipped: their mean mu_j and (covariance = true) their
 *      biased covariance S_j;
 *   2. RoPE averaged over the n_future positions after the prompt's last: per frequency
 *      pair the 2x2 block [[c, -s], [s, c]] of the mean cos c and mean sin s; mu' = R mu,
 *      S' = R S R^T;
 *   3. for the prompt's keys t >= n_sink (post-RoPE, as cached): z = k.mu' / a +
 *      k^T S' k / (2 a^2), the log of E[exp(q.k / a)] for q ~ N(mu', S'), a the layer's
 *      logit scale (sqrt(D): kvpress's k.mu'/sqrt(D) + k^T S' k / (2 D));
 *   4. a softmax over t >= n_sink, the mean over the KV head's query group, times ||v_t||
 *      after adding epsilon (vnorm = true); the n_sink first tokens protected;
 * then the tokens each head keeps under the budget allocation (fk_evict_budget.h). A trace
 * without its RoPE (rope_layout) or with pre-RoPE keys is refused before any cell. Decode
 * tokens are appended uncompressed. The soft cap of a layer's logits is not modelled
 * (kvpress has none either).
 */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "common/fk_err.h"
#include "evict/fk_evict_budget.h"
#include "kernels/fk_rope.h"

struct ea_opts {
    int n_future, n_sink, covariance, vnorm;
    double epsilon;
    struct fk_evict_budget b;
};

static const struct fk_option ea_options[] = {
    {"n_future", FK_OPT_INT, offsetof(struct ea_opts, n_future), 512, 1, 1 << 20, NULL,
     "future positions RoPE is averaged over, after the prompt's last (tokens)"},
    {"n_sink", FK_OPT_INT, offsetof(struct ea_opts, n_sink), 4, 0, 1 << 16, NULL,
     "first prompt tokens protected and left out of the query statistics (tokens)"},
    {"covariance", FK_OPT_BOOL, offsetof(struct ea_opts, covariance), 1, 0, 1, NULL,
     "add the queries' covariance term k^T S' k / (2 a^2) to the expected logit"},
    {"vnorm", FK_OPT_BOOL, offsetof(struct ea_opts, vnorm), 1, 0, 1, NULL,
     "weigh each token's expected attention by its value's norm"},
    {"epsilon", FK_OPT_DOUBLE, offsetof(struct ea_opts, epsilon), 0, 0, 1e6, NULL,
     "added to the expected attention before the value norm (kvpress's leaderboard: 0.01)"},
    FK_EVICT_BUDGET_OPTIONS(struct ea_opts, b),
    {NULL, 0, 0, 0, 0, 0, NULL, NULL},
};

static unsigned ea_needs(const void *opts)
{
    const struct ea_opts *o = opts;
    return FK_EVICT_NEED_PREFILL_Q | FK_EVICT_NEED_ROPE | (o->vnorm ? FK_EVICT_NEED_VALUES : 0);
}

static int ea_prefill_queries(const void *opts, int prompt_len)
{
    (void)opts;
    return prompt_len;
}

static int ea_check_prompt(const void *opts, int n_layers, int n_kv_heads, int prompt_len)
{
    const struct ea_opts *o = opts;
    return fk_evict_budget_check(&o->b, "expected_attn", o->n_sink, n_layers, n_kv_heads,
                                 prompt_len);
}

struct ea {
    struct fk_evict_base b;      /* b.acc: [H][P] scores; b.extra: the arrays below */
    struct ea_opts o;
    double *cs, *sn;             /* [P][D/2] the prompt's RoPE angles */
    double *mu, *cov, *mu2, *cov2, *q, *y, *cb, *sb, *freq, *z;
};

static int ea_open(const void *opts, const struct fk_evict_env *env, void **state)
{
    size_t T = (size_t)env->n_tokens, D = (size_t)env->head_dim, h2 = D / 2 + 1;
    size_t n = 2 * T * h2 + 2 * D * D + 4 * D + 3 * h2 + T;
    FK_TRY(fk_evict_base_open(env, sizeof(struct ea), 1, n, state));
    struct ea *s = *state;
    s->o = *(const struct ea_opts *)opts;
    double *p = s->b.extra;
    s->cs = p, p += T * h2;
    s->sn = p, p += T * h2;
    s->cov = p, p += D * D;
    s->cov2 = p, p += D * D;
    s->mu = p, p += D;
    s->mu2 = p, p += D;
    s->q = p, p += D;
    s->y = p, p += D;
    s->cb = p, p += h2;
    s->sb = p, p += h2;
    s->freq = p, p += h2;
    s->z = p;
    return FK_OK;
}

/* mu and (covariance) cov of query head j's pre-RoPE prompt queries t >= n_sink. */
static int query_stats(struct ea *s, const struct fk_evict_view *v, int j)
{
    const struct fk_evict_env *e = &s->b.env;
    int D = e->head_dim, P = e->prompt_len, half = D / 2, t0 = s->o.n_sink;
    double N = P - t0;
    memset(s->mu, 0, sizeof(double) * D);
    memset(s->cov, 0, sizeof(double) * D * D);
    for (int pass = 0; pass < 2; pass++)
        for (int t = t0; t < P; t++) {
            int r = v->qrow[t];
            if (r < 0)
                return fk_err(FK_EINVAL, "expected_attn: layer %d: token %d's query is not in "
                              "the view", e->layer, t);
            const float *qp = v->q + ((size_t)j * v->n_qrows + r) * D;
            for (int c = 0; c < D; c++)
                s->q[c] = qp[c];
            fk_rope_apply(e->rope->layout, D, s->cs + (size_t)t * half, s->sn + (size_t)t * half,
                          -1, s->q);
            if (pass == 0) {
                for (int c = 0; c < D; c++)
                    s->mu[c] += s->q[c] / N;
                continue;
            }
            if (!s->o.covariance)
                break;
            for (int c = 0; c < D; c++)
                s->q[c] -= s->mu[c];
            for (int a = 0; a < D; a++) { /* cov[a][.] += d_a d / N, an axpy per row */
                double f = s->q[a] / N;
                double *row = s->cov + (size_t)a * D;
                for (int c = 0; c < D; c++)
                    row[c] += f * s->q[c];
            }
        }
    return FK_OK;
}

/* mu2 = R mu, cov2 = R cov R^T for the mean rotation R (blocks per pair: cb, sb). */
static void rotate_stats(struct ea *s, int layout, int D)
{
    memcpy(s->mu2, s->mu, sizeof(double) * D);
    /* apply R to the vector: fk_rope_apply with the mean cos and sin */
    fk_rope_apply(layout, D, s->cb, s->sb, 1, s->mu2);
    if (!s->o.covariance)
        return;
    /* R cov: R applied to every column; then (R cov) R^T: R applied to every row */
    for (int c = 0; c < D; c++) {
        for (int a = 0; a < D; a++)
            s->y[a] = s->cov[(size_t)a * D + c];
        fk_rope_apply(layout, D, s->cb, s->sb, 1, s->y);
        for (int a = 0; a < D; a++)
            s->cov2[(size_t)a * D + c] = s->y[a];
    }
    for (int a = 0; a < D; a++)
        fk_rope_apply(layout, D, s->cb, s->sb, 1, s->cov2 + (size_t)a * D);
}

static int ea_prefill(void *state, const struct fk_evict_view *v)
{
    struct ea *s = state;
    const struct fk_evict_env *e = &s->b.env;
    int P = e->prompt_len, D = e->head_dim, half = D / 2, t0 = s->o.n_sink;
    int G = e->n_q_heads / e->n_kv_heads;
    if (P <= t0)
        return FK_OK;
    if (!e->rope || !e->positions)
        return fk_err(FK_ECONFIG, "expected_attn: layer %d: the trace's RoPE is not known",
                      e->layer);
    double a = e->inv_scale > 0 ? e->inv_scale : sqrt((double)D);
    fk_rope_freqs(e->rope, D, s->freq);
    fk_rope_table(s->freq, D, e->positions, P, s->cs, s->sn);
    /* the mean rotation over the future positions p0 .. p0 + n_future - 1 */
    double p0 = (double)e->positions[P - 1] + 1;
    for (int i = 0; i < half; i++) {
        double c = 0, sn = 0;
        for (int f = 0; f < s->o.n_future; f++) {
            c += cos((p0 + f) * s->freq[i]);
            sn += sin((p0 + f) * s->freq[i]);
        }
        s->cb[i] = c / s->o.n_future;
        s->sb[i] = sn / s->o.n_future;
    }
    for (int h = 0; h < e->n_kv_heads; h++) {
        double *sc = s->b.acc + (size_t)h * P;
        for (int t = 0; t < P; t++)
            sc[t] = 0;
        for (int g = 0; g < G; g++) {
            FK_TRY(query_stats(s, v, h * G + g));
            rotate_stats(s, e->rope->layout, D);
            double mx = -INFINITY, sum = 0;
            for (int t = t0; t < P; t++) {
                const float *k = v->k + ((size_t)h * e->n_tokens + t) * D;
                double lin = 0, quad = 0;
                for (int c = 0; c < D; c++)
                    lin += k[c] * s->mu2[c];
                if (s->o.covariance) {
                    for (int c = 0; c < D; c++) /* y = cov2 k, column by column */
                        s->y[c] = 0;
                    for (int b = 0; b < D; b++) {
                        const double *col = s->cov2 + (size_t)b * D; /* symmetric: row b */
                        for (int c = 0; c < D; c++)
                            s->y[c] += col[c] * k[b];
                    }
                    for (int c = 0; c < D; c++)
                        quad += k[c] * s->y[c];
                }
                s->z[t] = lin / a + quad / (2 * a * a);
                mx = s->z[t] > mx ? s->z[t] : mx;
            }
            for (int t = t0; t < P; t++)
                sum += (s->z[t] = exp(s->z[t] - mx));
            for (int t = t0; t < P; t++)
                sc[t] += s->z[t] / sum / G;
        }
        for (int t = t0; t < P && s->o.vnorm; t++) {
            const float *vv = v->v + ((size_t)h * e->n_tokens + t) * D;
            double nn = 0;
            for (int c = 0; c < D; c++)
                nn += (double)vv[c] * vv[c];
            sc[t] = (sc[t] + s->o.epsilon) * sqrt(nn);
        }
        for (int t = 0; t < t0; t++)
            sc[t] = INFINITY; /* the sinks: protected */
    }
    return fk_evict_budget_apply(&s->b, &s->o.b, t0, s->b.acc);
}

const struct fk_evict_ops fk_evict_expected = {
    .name = "expected_attn",
    .summary = "Expected Attention (kvpress): the attention the statistics of the prompt's "
               "pre-RoPE queries, rotated to future positions, expect on each key, times the "
               "value norm; needs the trace's RoPE; budgets uniform, PyramidKV or Ada-KV",
    .opts_size = sizeof(struct ea_opts),
    .options = ea_options,
    .needs = ea_needs,
    .prefill_queries = ea_prefill_queries,
    .check_prompt = ea_check_prompt,
    .open = ea_open,
    .prefill = ea_prefill,
    .close = fk_evict_base_close,
};
