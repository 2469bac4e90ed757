/* SPDX-License-Identifier: MIT
 * The prefill's row rewrites: merging dropped values, pruning key channels (fk_rewrite.h).
 */
#include "core/fk_rewrite.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/fk_err.h"

#define MERGE_EPS 1e-6 /* kvpress's _EPS: norm floor and denominator guard */

const char *const fk_merge_names[] = {"none", "kvpress", NULL};

const struct fk_option fk_rewrite_options[] = {
    {"merge", FK_OPT_ENUM, offsetof(struct fk_rewrite, merge), FK_MERGE_NONE, 0, 1,
     fk_merge_names,
     "fold each prompt token the policy drops into its most key-similar kept token: none, "
     "kvpress (MergingPress's weighted value blend)"},
    {"merge_threshold", FK_OPT_DOUBLE, offsetof(struct fk_rewrite, merge_threshold), 0, 0, 1,
     NULL, "merge: the least cosine similarity of the keys for a merge (cosine)"},
    {"think", FK_OPT_DOUBLE, offsetof(struct fk_rewrite, think), 0, 0, 0.99, NULL,
     "ThinK: fraction of key channels pruned per KV head in the prompt's keys (fraction; 0: "
     "none)"},
    {"think_window", FK_OPT_INT, offsetof(struct fk_rewrite, think_window), 32, 1, 1 << 20,
     NULL, "ThinK: the last prompt queries scoring the channels (tokens)"},
    {"think_recent", FK_OPT_INT, offsetof(struct fk_rewrite, think_recent), 32, 0, 1 << 20,
     NULL, "ThinK: the last prompt tokens whose keys keep every channel (tokens; 0: kvpress)"},
    {NULL, 0, 0, 0, 0, 0, NULL, NULL},
};

int fk_rewrite_is_option(const char *key)
{
    for (const struct fk_option *o = fk_rewrite_options; o->name; o++)
        if (!strcmp(o->name, key))
            return 1;
    return 0;
}

int fk_rewrite_channels(const struct fk_rewrite *rw, int head_dim)
{
    return rw ? (int)(head_dim * rw->think) : 0;
}

int fk_rewrite_pruned_tokens(const struct fk_rewrite *rw, int head_dim, int prompt_len)
{
    if (fk_rewrite_channels(rw, head_dim) < 1)
        return 0;
    int n = prompt_len - rw->think_recent;
    return n > 0 ? n : 0;
}

int fk_rewrite_mask_bytes(const struct fk_rewrite *rw, int head_dim)
{
    return fk_rewrite_channels(rw, head_dim) > 0 ? (head_dim + 7) / 8 : 0;
}

int fk_rewrite_prefill_queries(const struct fk_rewrite *rw, int prompt_len)
{
    if (!rw || rw->think <= 0)
        return 0;
    return rw->think_window < prompt_len ? rw->think_window : prompt_len;
}

int fk_rewrite_check(const struct fk_rewrite *rw, const struct fk_evict_ops *ev,
                     const struct fk_codec_ops *codec)
{
    if (rw->merge != FK_MERGE_NONE && !ev)
        return fk_err(FK_ECONFIG, "merge = \"%s\" folds the tokens an eviction policy drops: "
                      "give the block an `evict` policy", fk_merge_names[rw->merge]);
    if (rw->merge != FK_MERGE_NONE && ev->decode)
        return fk_err(FK_ECONFIG, "merge = \"%s\" over eviction policy %s: merging folds the "
                      "prompt tokens dropped at the prefill, and %s drops tokens during "
                      "decoding, when the survivors are coded already (use a prefill scorer: "
                      "snapkv, knorm, expected_attn)", fk_merge_names[rw->merge], ev->name,
                      ev->name);
    if (rw->think > 0 && !(codec->caps & FK_CAP_EXACT))
        return fk_err(FK_ECONFIG, "think = %g over codec %s: pruned key channels are saved "
                      "by a cache that stores rows as they are (full); %s would code them as "
                      "zeros and save nothing", rw->think, codec->name, codec->name);
    return FK_OK;
}

/* ---- merge ------------------------------------------------------------------------------ */

struct merge_work {
    float *kk, *ke;              /* [P][m] unit kept keys, unit dropped keys */
    float *sim;                  /* [P][P] dropped x kept similarities */
    int32_t *kept, *drop;        /* [P] tokens */
    double *vn, *acc, *wacc;     /* [P] kept value norms; [P][m] sums; [P] weights */
};

static void unit_row(const float *x, int m, float *out)
{
    double nn = 0;
    for (int c = 0; c < m; c++)
        nn += (double)x[c] * x[c];
    double n = sqrt(nn);
    n = n > MERGE_EPS ? n : MERGE_EPS;
    for (int c = 0; c < m; c++)
        out[c] = (float)(x[c] / n);
}

static double norm(const float *x, int m)
{
    double nn = 0;
    for (int c = 0; c < m; c++)
        nn += (double)x[c] * x[c];
    return sqrt(nn);
}

static void merge_head(const struct fk_rewrite *rw, const struct fk_rewrite_in *in, int h,
                       struct merge_work *w)
{
    int m = in->head_dim, P = in->prompt_len, T = in->n_tokens, nk = 0, ne = 0;
    const float *kh = in->k + (size_t)h * T * m;
    float *vh = in->v + (size_t)h * T * m;
    const uint8_t *kp = in->keep + (size_t)h * T;
    for (int j = 0; j < P; j++) {
        if (kp[j])
            w->kept[nk++] = j;
        else
            w->drop[ne++] = j;
    }
    if (ne == 0 || nk == 0)
        return;
    for (int i = 0; i < nk; i++) {
        unit_row(kh + (size_t)w->kept[i] * m, m, w->kk + (size_t)i * m);
        w->vn[i] = norm(vh + (size_t)w->kept[i] * m, m);
        w->wacc[i] = 0;
    }
    memset(w->acc, 0, sizeof(double) * (size_t)nk * m);
    for (int i = 0; i < ne; i++)
        unit_row(kh + (size_t)w->drop[i] * m, m, w->ke + (size_t)i * m);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, ne, nk, m, 1.0f, w->ke, m, w->kk, m,
                0.0f, w->sim, nk);
    for (int i = 0; i < ne; i++) {
        const float *s = w->sim + (size_t)i * nk;
        int best = 0;
        for (int j = 1; j < nk; j++)
            if (s[j] > s[best])
                best = j; /* kept tokens ascend: ties stay with the lower token */
        double sim = s[best];
        if (!(sim >= rw->merge_threshold))
            continue;
        const float *ve = vh + (size_t)w->drop[i] * m;
        double en = norm(ve, m);
        double wt = (sim > 0 ? sim : 0) * en / (en + w->vn[best] + MERGE_EPS);
        double *a = w->acc + (size_t)best * m;
        for (int c = 0; c < m; c++)
            a[c] += wt * ve[c];
        w->wacc[best] += wt;
    }
    for (int i = 0; i < nk; i++) {
        if (!(w->wacc[i] > 0))
            continue;
        float *vt = vh + (size_t)w->kept[i] * m;
        const double *a = w->acc + (size_t)i * m;
        for (int c = 0; c < m; c++)
            vt[c] = (float)((vt[c] + a[c]) / (1.0 + w->wacc[i]));
    }
}

static int merge_all(const struct fk_rewrite *rw, const struct fk_rewrite_in *in)
{
    size_t P = (size_t)in->prompt_len, m = (size_t)in->head_dim;
    struct merge_work w = {
        .kk = malloc(sizeof(float) * P * m), .ke = malloc(sizeof(float) * P * m),
        .sim = malloc(sizeof(float) * (P / 2 + 1) * (P / 2 + 1)), /* ne nk, ne + nk = P */
        .kept = malloc(sizeof(int32_t) * P), .drop = malloc(sizeof(int32_t) * P),
        .vn = malloc(sizeof(double) * P), .acc = malloc(sizeof(double) * P * m),
        .wacc = malloc(sizeof(double) * P)};
    int rc = FK_OK;
    if (!w.kk || !w.ke || !w.sim || !w.kept || !w.drop || !w.vn || !w.acc || !w.wacc)
        rc = fk_err(FK_ENOMEM, "out of memory (merging a prompt of %zu tokens)", P);
    for (int h = 0; rc == FK_OK && h < in->n_kv_heads; h++)
        merge_head(rw, in, h, &w);
    free(w.kk), free(w.ke), free(w.sim), free(w.kept), free(w.drop), free(w.vn);
    free(w.acc), free(w.wacc);
    return rc;
}

/* ---- think ------------------------------------------------------------------------------ */

static int think_all(const struct fk_rewrite *rw, const struct fk_rewrite_in *in,
                     uint8_t *chan)
{
    int m = in->head_dim, P = in->prompt_len, T = in->n_tokens, H = in->n_kv_heads;
    int G = in->n_q_heads / H, W = fk_rewrite_prefill_queries(rw, P);
    int np = fk_rewrite_channels(rw, m), nt = fk_rewrite_pruned_tokens(rw, m, P);
    for (int j = P - W; j < P; j++)
        if (in->qrow[j] < 0 || in->qrow[j] >= in->n_qrows)
            return fk_err(FK_EINVAL, "think: the query of prompt token %d is missing", j);
    double *qs = malloc(sizeof(double) * (size_t)m * 2);
    int32_t *order = malloc(sizeof(int32_t) * (size_t)m);
    if (!qs || !order) {
        free(qs), free(order);
        return fk_err(FK_ENOMEM, "out of memory");
    }
    double *ks = qs + m;
    for (int h = 0; h < H; h++) {
        for (int c = 0; c < m; c++)
            qs[c] = ks[c] = 0;
        for (int g = 0; g < G; g++) { /* mean over the window, then over the group */
            const float *qh = in->q + (size_t)(h * G + g) * in->n_qrows * m;
            for (int j = P - W; j < P; j++) {
                const float *q = qh + (size_t)in->qrow[j] * m;
                for (int c = 0; c < m; c++)
                    qs[c] += (double)q[c] * q[c];
            }
        }
        int nk = 0;
        for (int j = 0; j < P; j++) {
            if (in->keep && !in->keep[(size_t)h * T + j])
                continue;
            const float *k = in->k + ((size_t)h * T + j) * m;
            for (int c = 0; c < m; c++)
                ks[c] += (double)k[c] * k[c];
            nk++;
        }
        /* score_c = mean q_c^2 mean k_c^2; the np lowest pruned, ties to the lower channel */
        for (int c = 0; c < m; c++) {
            qs[c] = qs[c] / ((double)W * G) * (ks[c] / (nk ? nk : 1));
            order[c] = c;
        }
        for (int a = 1; a < m; a++) { /* insertion sort: m is a head dimension */
            int32_t c = order[a];
            int b = a;
            while (b > 0 && qs[order[b - 1]] > qs[c])
                order[b] = order[b - 1], b--;
            order[b] = c;
        }
        uint8_t *ch = chan ? chan + (size_t)h * m : NULL;
        for (int c = 0; ch && c < m; c++)
            ch[c] = 1;
        for (int i = 0; i < np; i++) {
            int c = order[i];
            if (ch)
                ch[c] = 0;
            for (int j = 0; j < nt; j++)
                in->k[((size_t)h * T + j) * m + c] = 0.0f;
        }
    }
    free(qs);
    free(order);
    return FK_OK;
}

int fk_rewrite_apply(const struct fk_rewrite *rw, const struct fk_rewrite_in *in,
                     uint8_t *chan)
{
    if (in->prompt_len < 1)
        return FK_OK;
    /* merging reads the keys as they were: before think prunes any channel */
    if (rw->merge != FK_MERGE_NONE && in->keep)
        FK_TRY(merge_all(rw, in));
    if (fk_rewrite_channels(rw, in->head_dim) > 0)
        FK_TRY(think_all(rw, in, chan));
    else
        for (size_t i = 0; chan && i < (size_t)in->n_kv_heads * in->head_dim; i++)
            chan[i] = 1;
    return FK_OK;
}
