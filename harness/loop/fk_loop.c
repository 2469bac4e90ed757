/* SPDX-License-Identifier: MIT
 * The model in the loop (see fk_loop.h). Spec: algorithms.md section 4 (the protocol).
 */
#include "loop/fk_loop.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/fk_clock.h"
#include "common/fk_err.h"
#include "core/fk_registry.h"
#include "engine/fk_schedule.h"
#include "kernels/fk_rope.h"
#include "kernels/fk_sparse.h"

/* ---------------------------------------------------------------- metrics ---- */

static double logsumexp(const float *z, int n)
{
    double mx = z[0];
    for (int i = 1; i < n; i++)
        mx = z[i] > mx ? z[i] : mx;
    double s = 0.0;
    for (int i = 0; i < n; i++)
        s += exp((double)z[i] - mx);
    return mx + log(s);
}

double fk_loop_kl(const float *p, const float *q, int n)
{
    double lp = logsumexp(p, n), lq = logsumexp(q, n), kl = 0.0;
    for (int i = 0; i < n; i++) {
        double a = (double)p[i] - lp, b = (double)q[i] - lq;
        kl += exp(a) * (a - b);
    }
    return kl > 0.0 ? kl : 0.0;
}

double fk_loop_nll(const float *z, int n, int id) { return logsumexp(z, n) - (double)z[id]; }

int fk_loop_argmax(const float *z, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (z[i] > z[b])
            b = i;
    return b;
}

static double cosine(const float *a, const float *b, int n)
{
    double ab = 0.0, aa = 0.0, bb = 0.0;
    for (int i = 0; i < n; i++) {
        ab += (double)a[i] * b[i];
        aa += (double)a[i] * a[i];
        bb += (double)b[i] * b[i];
    }
    if (aa == 0.0 && bb == 0.0)
        return 1.0;
    if (aa == 0.0 || bb == 0.0)
        return 0.0;
    return ab / sqrt(aa * bb);
}

/* ---------------------------------------------------------------- reference ---- */

void fk_loop_ref_free(struct fk_loop_ref *r)
{
    if (!r)
        return;
    if (r->greedy != r->ids)
        free(r->greedy);
    if (r->logits_greedy != r->logits)
        free(r->logits_greedy);
    free(r->ids);
    free(r->logits);
    free(r->att_out);
    free(r->att_logit);
    memset(r, 0, sizeof *r);
}

/* Feeds ids[0 .. P+S-1] exactly; ids[P+S] and (greedy) every id after the prompt are the
 * argmax of the previous position's logits. Keeps the logits of positions P..P+S-1 and, with
 * tap buffers, the attention outputs and logits of those positions. */
static int exact_decode(const struct fk_llama2c_model *m, int32_t *ids, int P, int S,
                        int greedy, float *logits, float *att_out, float *att_logit)
{
    const struct fk_llama2c_config *c = fk_llama2c_model_config(m);
    int V = c->vocab_size, L = c->n_layers, H = c->n_heads, T = P + S;
    struct fk_llama2c_run *run = NULL;
    FK_TRY(fk_llama2c_run_create(m, &run));
    float *tap_logit = NULL, *tap_out = NULL;
    int rc = FK_OK;
    if (att_out) {
        tap_out = malloc((size_t)L * c->dim * sizeof(float));
        tap_logit = malloc((size_t)L * H * c->seq_len * sizeof(float));
        if (!tap_out || !tap_logit)
            rc = fk_err(FK_ENOMEM, "model %s: out of memory for attention taps",
                        fk_llama2c_model_path(m));
    }
    const float *z = NULL;
    for (int t = 0; t < T && rc == FK_OK; t++) {
        int tap = att_out && t >= P;
        struct fk_llama2c_tap tp = {.att_out = tap_out, .att_logit = tap_logit};
        fk_llama2c_set_tap(run, tap ? &tp : NULL);
        rc = fk_llama2c_forward(run, ids[t], t, &z);
        if (rc < 0)
            break;
        if (greedy && t >= P - 1)
            ids[t + 1] = fk_loop_argmax(z, V);
        if (t < P)
            continue;
        size_t j = (size_t)(t - P);
        memcpy(logits + j * V, z, (size_t)V * sizeof(float));
        if (!tap)
            continue;
        memcpy(att_out + j * L * c->dim, tap_out, (size_t)L * c->dim * sizeof(float));
        for (int l = 0; l < L; l++)
            for (int h = 0; h < H; h++)
                memcpy(att_logit + ((j * L + l) * H + h) * T,
                       tap_logit + ((size_t)l * H + h) * c->seq_len,
                       (size_t)(t + 1) * sizeof(float));
    }
    free(tap_out);
    free(tap_logit);
    fk_llama2c_run_free(&run);
    return rc;
}

int fk_loop_ref_build(const struct fk_llama2c_model *m, const int32_t *prompt, int n_prompt,
                      const int32_t *cont, int n_cont, int steps, int taps,
                      struct fk_loop_ref *out)
{
    memset(out, 0, sizeof *out);
    const struct fk_llama2c_config *c = fk_llama2c_model_config(m);
    const char *path = fk_llama2c_model_path(m);
    int P = n_prompt, S = steps, V = c->vocab_size;
    if (P < 1 || S < 1)
        return fk_err(FK_EINVAL, "model %s: closed loop of %d prompt ids and %d steps: "
                      "expected at least 1 of each", path, P, S);
    if ((long)P + S > c->seq_len)
        return fk_err(FK_EINVAL, "model %s: prompt of %d ids plus %d steps = %ld positions "
                      "exceeds seq_len %d", path, P, S, (long)P + S, c->seq_len);
    if (cont && n_cont < S + 1)
        return fk_err(FK_EINVAL, "model %s: teacher continuation of %d ids for %d steps: "
                      "expected at least %d (each step's target)", path, n_cont, S, S + 1);
    for (int i = 0; i < P + (cont ? S + 1 : 0); i++) {
        int id = i < P ? prompt[i] : cont[i - P];
        if (id < 0 || id >= V)
            return fk_err(FK_EINVAL, "model %s: %s id %d at %d outside the vocabulary "
                          "[0, %d)", path, i < P ? "prompt" : "continuation", id,
                          i < P ? i : i - P, V);
    }
    int T = P + S;
    out->prompt_len = P;
    out->n_steps = S;
    out->vocab = V;
    out->n_layers = c->n_layers;
    out->n_heads = c->n_heads;
    out->dim = c->dim;
    out->ids = malloc((size_t)(T + 1) * sizeof(int32_t));
    out->logits = malloc((size_t)S * V * sizeof(float));
    if (taps) {
        out->att_out = malloc((size_t)S * c->n_layers * c->dim * sizeof(float));
        out->att_logit = malloc((size_t)S * c->n_layers * c->n_heads * T * sizeof(float));
    }
    if (!out->ids || !out->logits || (taps && (!out->att_out || !out->att_logit))) {
        fk_loop_ref_free(out);
        return fk_err(FK_ENOMEM, "model %s: out of memory for a reference of %d steps",
                      path, S);
    }
    memcpy(out->ids, prompt, (size_t)P * sizeof(int32_t));
    if (cont)
        memcpy(out->ids + P, cont, (size_t)(S + 1) * sizeof(int32_t));
    int rc = exact_decode(m, out->ids, P, S, !cont, out->logits, out->att_out,
                          out->att_logit);
    if (rc == FK_OK && !cont) {
        out->greedy = out->ids;
        out->logits_greedy = out->logits;
    } else if (rc == FK_OK) {
        out->greedy = malloc((size_t)(T + 1) * sizeof(int32_t));
        out->logits_greedy = malloc((size_t)S * V * sizeof(float));
        if (!out->greedy || !out->logits_greedy)
            rc = fk_err(FK_ENOMEM, "model %s: out of memory for the greedy reference", path);
        if (rc == FK_OK) {
            memcpy(out->greedy, prompt, (size_t)P * sizeof(int32_t));
            rc = exact_decode(m, out->greedy, P, S, 1, out->logits_greedy, NULL, NULL);
        }
    }
    if (rc < 0)
        fk_loop_ref_free(out);
    return rc;
}

/* ---------------------------------------------------------------- the loop ---- */

struct loop {
    const struct fk_llama2c_model *m;
    const struct fk_codec_ops *ops;
    struct fk_llama2c_run *run;
    int L, H, m_dim, T, P;
    void **st;                   /* [L][2] codec states */
    float *raw;                  /* [L][2][H][T][m] the rows this loop computed, exactly */
    float *gram;                 /* [L][2][N][N] Gram matrices (FK_CAP_GRAM) or NULL */
    struct fk_base_dict *bases;  /* [L][2] */
    int32_t *positions;          /* [T] */
    struct fk_rope rope;
    struct fk_buffer buf[2];
    struct fk_sched_iter it[2];
    struct fk_sched_event ev[2];
    int has[2], n_comp[2];
    float *x;                    /* [n][m] one event's vectors */
    int32_t *tok, *head;
    struct fk_vec_out *vout;
    size_t cap;                  /* vectors the event buffers hold */
    double t_codec;
    /* eviction policy (fk_loop_codec.evict), or NULL */
    const struct fk_evict_ops *pol;
    void **pol_st;               /* [L] policy states */
    uint8_t **keep;              /* [L] masks [H][T] */
    uint8_t *keep_all;
    float *q;                    /* [L][H_q][T][m] every query so far (the policies' view) */
    int32_t *qrow;               /* [T] identity */
    int Hq;
    int dropped;                 /* some row was dropped: attention KL is NaN */
    int rewritten;               /* the prefill's rewrites changed rows (the cache differs
                                  * from the exact rows from the first step) */
    /* teacher forcing in blocks (fk_loop_codec.block), else blk NULL */
    int n_blk;                   /* positions per block at most */
    float *blk;                  /* [n_blk][vocab] logits */
    float *blk_out, *blk_logit;  /* [n_blk] x the attention taps, or NULL */
};

static float *raw_row(struct loop *lp, int l, int k, int h, int t)
{
    return lp->raw + ((((size_t)l * 2 + k) * lp->H + h) * lp->T + t) * lp->m_dim;
}

static void loop_free(struct loop *lp)
{
    for (int l = 0; lp->pol_st && l < lp->L; l++)
        if (lp->pol_st[l])
            lp->pol->close(lp->pol_st[l]);
    free(lp->pol_st);
    free(lp->keep);
    free(lp->keep_all);
    free(lp->q);
    free(lp->qrow);
    free(lp->blk);
    free(lp->blk_out);
    free(lp->blk_logit);
    for (int i = 0; lp->st && i < lp->L * 2; i++)
        if (lp->st[i])
            lp->ops->close(lp->st[i]);
    free(lp->st);
    free(lp->raw);
    free(lp->gram);
    free(lp->bases);
    free(lp->positions);
    free(lp->x);
    free(lp->tok);
    free(lp->head);
    free(lp->vout);
    fk_llama2c_run_free(&lp->run);
}

/* The tokens' positions 0 .. T-1 and the runner's RoPE: pairs (2i, 2i+1), theta 10000
 * (fk_llama2c_write_trace's); once, for the codecs and the eviction policy. */
static int positions_open(struct loop *lp)
{
    if (lp->positions)
        return FK_OK;
    lp->positions = malloc((size_t)lp->T * sizeof(int32_t));
    if (!lp->positions)
        return fk_err(FK_ENOMEM, "out of memory for %d positions", lp->T);
    for (int t = 0; t < lp->T; t++)
        lp->positions[t] = (int32_t)t;
    lp->rope = (struct fk_rope){.theta = 10000.0, .layout = FK_ROPE_INTERLEAVED,
                                .type = FK_ROPE_DEFAULT};
    return FK_OK;
}

static int loop_open(struct loop *lp, const struct fk_loop_codec *c)
{
    const struct fk_codec_ops *ops = c->ops;
    const char *path = fk_llama2c_model_path(lp->m);
    size_t L = (size_t)lp->L, H = (size_t)lp->H, T = (size_t)lp->T, m = (size_t)lp->m_dim;
    if (ops->caps & FK_CAP_EXTERNAL)
        return fk_err(FK_ECONFIG, "codec %s stores reconstructions computed elsewhere: it "
                      "cannot run in the loop (model %s)", ops->name, path);
    if ((ops->caps & FK_CAP_DICT) && !c->dict)
        return fk_err(FK_ECONFIG, "codec %s needs a dictionary (model %s)", ops->name, path);
    if ((ops->caps & FK_CAP_BASIS) && !c->basis)
        return fk_err(FK_ECONFIG, "codec %s needs a basis (model %s)", ops->name, path);
    if ((ops->caps & FK_CAP_CALIB) && !c->calib)
        return fk_err(FK_ECONFIG, "codec %s needs a calibration (model %s)", ops->name, path);
    if ((ops->caps & FK_CAP_CALIB) && (c->calib->sh.n_layers != lp->L ||
        c->calib->sh.n_kv_heads != lp->H || c->calib->sh.head_dim != lp->m_dim))
        return fk_err(FK_ECONFIG, "calibration %s has %d layers, %d KV heads, head_dim %d but "
                      "model %s has %d, %d, %d", c->calib->path, c->calib->sh.n_layers,
                      c->calib->sh.n_kv_heads, c->calib->sh.head_dim, path, lp->L, lp->H,
                      lp->m_dim);
    if ((ops->caps & FK_CAP_DICT)
        && (c->dict->head_dim != lp->m_dim || c->dict->n_layers != lp->L))
        return fk_err(FK_ECONFIG, "dictionary %s has %d layers of head_dim %d but model %s "
                      "has %d of %d", c->dict->path, c->dict->n_layers, c->dict->head_dim,
                      path, lp->L, lp->m_dim);
    if (c->basis) {
        const struct fk_basis_shape *sh = &c->basis->sh;
        if ((ops->caps & FK_CAP_BASIS)
            && (sh->n_layers != lp->L || sh->n_kv_heads != lp->H || sh->head_dim != lp->m_dim))
            return fk_err(FK_ECONFIG, "basis %s has %d layers, %d KV heads, head_dim %d but "
                          "model %s has %d, %d, %d", c->basis->path, sh->n_layers,
                          sh->n_kv_heads, sh->head_dim, path, lp->L, lp->H, lp->m_dim);
    }
    lp->st = calloc(L * 2, sizeof *lp->st);
    lp->raw = malloc(L * 2 * H * T * m * sizeof(float));
    lp->bases = calloc(L * 2, sizeof *lp->bases);
    if (!lp->st || !lp->raw || !lp->bases)
        return fk_err(FK_ENOMEM, "model %s: out of memory for the loop's cache copies", path);
    FK_TRY(positions_open(lp));
    if (ops->check && ops->check(c->opts, lp->m_dim, (ops->caps & FK_CAP_DICT)
                                 ? c->dict->n_atoms : (ops->caps & FK_CAP_BASIS)
                                 ? c->basis->sh.n_comp : 0) < 0)
        return fk_err_context(FK_ECONFIG, "codec %s on model %s", ops->name, path);
    if ((ops->caps & FK_CAP_BASIS) && ops->needs && (ops->needs(c->opts) & FK_NEED_ROPE)
        && !c->basis->sh.has_pre_rope)
        return fk_err(FK_ECONFIG, "codec %s codes pre-RoPE keys but basis %s has none "
                      "(train it with pre-RoPE keys)", ops->name, c->basis->path);
    int want_gram = (ops->caps & FK_CAP_DICT) && (ops->caps & FK_CAP_GRAM);
    size_t nn = want_gram ? (size_t)c->dict->n_atoms * c->dict->n_atoms : 0;
    if (want_gram) {
        lp->gram = malloc(L * 2 * nn * sizeof(float));
        if (!lp->gram)
            return fk_err(FK_ENOMEM, "out of memory for %zu Gram matrices of %d atoms",
                          L * 2, c->dict->n_atoms);
    }
    for (int l = 0; l < lp->L; l++)
        for (int k = 0; k < 2; k++) {
            struct fk_base_dict *b = &lp->bases[l * 2 + k];
            if (ops->caps & FK_CAP_DICT) {
                fk_dict_base(c->dict, l, k, b);
                if (want_gram) {
                    float *g = lp->gram + ((size_t)l * 2 + k) * nn;
                    FK_TRY(fk_gram_compute(b->atoms, b->n_atoms, b->m, g));
                    b->gram = g;
                }
            }
            struct fk_stream_env env = {
                .layer = l, .kind = k, .head_dim = lp->m_dim, .n_heads = lp->H,
                .n_tokens = lp->T, .base = (ops->caps & FK_CAP_DICT) ? b : NULL,
                .basis = c->basis ? fk_basis_get(c->basis, l, k) : NULL,
                .calib = (ops->caps & FK_CAP_CALIB) ? fk_calib_get(c->calib, l, k) : NULL,
                .positions = lp->positions,
                .rope = fk_llama2c_model_rope_default(lp->m) ? &lp->rope : NULL};
            int rc = ops->open(c->opts, &env, &lp->st[l * 2 + k]);
            if (rc < 0)
                return fk_err_context(rc, "model %s: layer %d %s: opening codec %s", path, l,
                                      k ? "V" : "K", ops->name);
        }
    return FK_OK;
}

static int reserve(struct loop *lp, size_t n)
{
    if (n <= lp->cap)
        return FK_OK;
    float *x = realloc(lp->x, n * lp->m_dim * sizeof(float));
    if (x)
        lp->x = x;
    int32_t *tk = realloc(lp->tok, n * sizeof(int32_t));
    if (tk)
        lp->tok = tk;
    int32_t *hd = realloc(lp->head, n * sizeof(int32_t));
    if (hd)
        lp->head = hd;
    struct fk_vec_out *vo = realloc(lp->vout, n * sizeof *vo);
    if (vo)
        lp->vout = vo;
    if (!x || !tk || !hd || !vo)
        return fk_err(FK_ENOMEM, "out of memory for an event of %zu vectors", n);
    lp->cap = n;
    return FK_OK;
}

/* Keeps the rows of position t (every layer, K and V) as the forward pass computed them. */
static void keep_rows(struct loop *lp, int t)
{
    int m = lp->m_dim;
    for (int l = 0; l < lp->L; l++)
        for (int k = 0; k < 2; k++) {
            const float *row = fk_llama2c_kv_row(lp->run, l, (enum fk_kind)k, t);
            for (int h = 0; h < lp->H; h++)
                memcpy(raw_row(lp, l, k, h, t), row + (size_t)h * m, (size_t)m * sizeof(float));
        }
}

/* Whether row (h, t) of layer l is left out: dropped by the policy, for a codec that skips
 * dropped rows (FK_CAP_SKIPS; the mask covers every token of an event). */
static int skipped(const struct loop *lp, int l, int h, int t)
{
    return lp->pol && (lp->ops->caps & FK_CAP_SKIPS) && !lp->keep[l][(size_t)h * lp->T + t];
}

/* Codes event e of stream kind k in every layer and writes the reconstructions into the
 * runner's cache rows (every compressed row of a codec whose dictionary changes). */
static int code_event(struct loop *lp, int k, const struct fk_sched_event *e)
{
    int H = lp->H, m = lp->m_dim;
    int n = (e->end - e->first) * H;
    if (n <= 0)
        return FK_OK;
    FK_TRY(reserve(lp, (size_t)n));
    int again = (lp->ops->caps & (FK_CAP_ADAPTS | FK_CAP_GROWS)) != 0;
    for (int l = 0; l < lp->L; l++) {
        int i = 0;
        for (int t = e->first; t < e->end; t++)
            for (int h = 0; h < H; h++) {
                if (skipped(lp, l, h, t))
                    continue; /* never attended to again, never coded */
                memcpy(lp->x + (size_t)i * m, raw_row(lp, l, k, h, t), (size_t)m * sizeof(float));
                lp->tok[i] = t;
                lp->head[i] = h;
                i++;
            }
        if (i == 0)
            continue;
        struct fk_event ev = {.phase = e->phase, .step = e->step, .n = i, .x = lp->x,
                              .token = lp->tok, .head = lp->head};
        void *st = lp->st[l * 2 + k];
        double c0 = fk_clock_s(CLOCK_THREAD_CPUTIME_ID);
        int rc = lp->ops->encode(st, &ev, lp->vout);
        if (rc < 0)
            return fk_err_context(rc, "%s encode in the loop (layer %d %s, tokens %d..%d)",
                                  lp->ops->name, l, k ? "V" : "K", e->first, e->end - 1);
        for (int t = again ? 0 : e->first; t < e->end; t++) {
            float *row = fk_llama2c_kv_row(lp->run, l, (enum fk_kind)k, t);
            for (int h = 0; h < H && rc >= 0; h++)
                if (!skipped(lp, l, h, t))
                    rc = lp->ops->reconstruct(st, h, t, row + (size_t)h * m);
            if (rc < 0)
                return fk_err_context(rc, "%s reconstruct in the loop (layer %d %s, token %d)",
                                      lp->ops->name, l, k ? "V" : "K", t);
        }
        lp->t_codec += fk_clock_s(CLOCK_THREAD_CPUTIME_ID) - c0;
    }
    return FK_OK;
}

void fk_loop_result_free(struct fk_loop_result *r)
{
    if (!r)
        return;
    free(r->kl);
    free(r->top1);
    free(r->nll_exact);
    free(r->nll_codec);
    free(r->tokens);
    free(r->attn_cos);
    free(r->attn_kl);
    free(r->logits);
    memset(r, 0, sizeof *r);
}

static int result_alloc(struct fk_loop_result *r, int S, int L)
{
    r->n_steps = S;
    r->n_layers = L;
    r->kl = calloc((size_t)S, sizeof(double));
    r->top1 = calloc((size_t)S, 1);
    r->nll_exact = calloc((size_t)S, sizeof(double));
    r->nll_codec = calloc((size_t)S, sizeof(double));
    r->tokens = calloc((size_t)S, sizeof(int32_t));
    r->attn_cos = calloc((size_t)L, sizeof(double));
    r->attn_kl = calloc((size_t)L, sizeof(double));
    if (!r->kl || !r->top1 || !r->nll_exact || !r->nll_codec || !r->tokens || !r->attn_cos
        || !r->attn_kl)
        return fk_err(FK_ENOMEM, "out of memory for %d steps of loop results", S);
    return FK_OK;
}

/* Per layer, step j: cosines of the heads' attention outputs and KL of their attention
 * weights against the reference's (same fed ids), summed into cs, ks. */
static void attn_step(const struct fk_loop_ref *ref, int j, int hd, const float *out,
                      const float *logit, int seq_len, double *cs, double *ks)
{
    int L = ref->n_layers, H = ref->n_heads, T = ref->prompt_len + ref->n_steps;
    int t = ref->prompt_len + j;
    for (int l = 0; l < L; l++)
        for (int h = 0; h < H; h++) {
            size_t o = (size_t)l * ref->dim + (size_t)h * hd;
            cs[l] += cosine(ref->att_out + (size_t)j * L * ref->dim + o, out + o, hd);
            ks[l] += fk_loop_kl(ref->att_logit + (((size_t)j * L + l) * H + h) * T,
                                logit + ((size_t)l * H + h) * seq_len, t + 1);
        }
}

static void summarise(struct fk_loop_result *r, const struct fk_loop_ref *ref, double *cs,
                      double *ks)
{
    int S = r->n_steps;
    double kl = 0.0, ne = 0.0, nc = 0.0, agree = 0.0;
    r->kl_max = 0.0;
    for (int j = 0; j < S; j++) {
        kl += r->kl[j];
        r->kl_max = r->kl[j] > r->kl_max ? r->kl[j] : r->kl_max;
        agree += r->top1[j];
        ne += r->nll_exact[j];
        nc += r->nll_codec[j];
    }
    r->kl_mean = kl / S;
    r->top1_agree = agree / S;
    r->first_diverge = -1;
    long same = 0;
    for (int j = 0; j < S; j++) {
        int ok = r->mode == FK_LOOP_FREE ? r->tokens[j] == ref->greedy[ref->prompt_len + j + 1]
                                         : r->top1[j];
        same += ok;
        if (!ok && r->first_diverge < 0)
            r->first_diverge = j;
    }
    r->token_agree = r->mode == FK_LOOP_FREE ? (double)same / S : NAN;
    if (r->mode == FK_LOOP_TEACHER) {
        r->nll_exact_mean = ne / S;
        r->nll_codec_mean = nc / S;
        r->ppl_ratio = exp(r->nll_codec_mean - r->nll_exact_mean);
    } else {
        r->nll_exact_mean = r->nll_codec_mean = r->ppl_ratio = NAN;
    }
    double n = (double)r->attn_steps * ref->n_heads;
    for (int l = 0; l < r->n_layers; l++) {
        r->attn_cos[l] = cs && n > 0 ? cs[l] / n : NAN;
        r->attn_kl[l] = ks && n > 0 ? ks[l] / n : NAN;
    }
}

/* ---- eviction policy ---- */

static struct fk_evict_view policy_view(const struct loop *lp, int l, int t)
{
    return (struct fk_evict_view){.t = t, .k = lp->raw + ((size_t)l * 2) * lp->H * lp->T *
                                  lp->m_dim, .v = lp->raw + ((size_t)l * 2 + 1) * lp->H * lp->T *
                                  lp->m_dim, .q = lp->q + (size_t)l * lp->Hq * lp->T * lp->m_dim,
                                  .n_qrows = lp->T, .qrow = lp->qrow};
}

/* The runner's pre-attention hook: keeps position pos's rows and query, sets its keep bits
 * and, at a decode position, runs the policy's decode hook before the attention. */
static int policy_hook(void *ctx, int l, int pos, const float *q)
{
    struct loop *lp = ctx;
    int m = lp->m_dim, H = lp->H;
    for (int k = 0; k < 2; k++) {
        const float *row = fk_llama2c_kv_row(lp->run, l, (enum fk_kind)k, pos);
        for (int h = 0; h < H; h++)
            memcpy(raw_row(lp, l, k, h, pos), row + (size_t)h * m, (size_t)m * sizeof(float));
    }
    float *qb = lp->q + (size_t)l * lp->Hq * lp->T * m;
    for (int h = 0; h < lp->Hq; h++)
        memcpy(qb + ((size_t)h * lp->T + pos) * m, q + (size_t)h * m, (size_t)m * sizeof(float));
    for (int h = 0; lp->keep && h < H; h++)
        lp->keep[l][(size_t)h * lp->T + pos] = 1;
    /* no policy (row rewrites alone), or a prefill-only one (snapkv): no decode hook */
    if (pos < lp->P || !lp->pol || !lp->pol->decode)
        return FK_OK;
    struct fk_evict_view v = policy_view(lp, l, pos);
    int rc = lp->pol->decode(lp->pol_st[l], &v);
    if (rc < 0)
        return fk_err_context(rc, "eviction policy %s, layer %d, token %d", lp->pol->name, l,
                              pos);
    return FK_OK;
}

/* The row rewrites alone (no policy): every query recorded for them, no mask. */
static int rewrite_open(struct loop *lp, const struct fk_loop_codec *c)
{
    const struct fk_llama2c_config *cfg = fk_llama2c_model_config(lp->m);
    FK_TRY(fk_rewrite_check(c->rewrite, NULL, c->ops));
    size_t L = (size_t)lp->L, T = (size_t)lp->T;
    lp->Hq = cfg->n_heads;
    lp->q = malloc(L * lp->Hq * T * lp->m_dim * sizeof(float));
    lp->qrow = malloc(T * sizeof(int32_t));
    if (!lp->q || !lp->qrow)
        return fk_err(FK_ENOMEM, "out of memory for the row rewrites' queries");
    for (size_t t = 0; t < T; t++)
        lp->qrow[t] = (int32_t)t;
    return FK_OK;
}

static int policy_open(struct loop *lp, const struct fk_loop_codec *c)
{
    const struct fk_evict_ops *ev = c->evict;
    const struct fk_llama2c_config *cfg = fk_llama2c_model_config(lp->m);
    if (!ev)
        return rewrite_open(lp, c);
    if (c->rewrite)
        FK_TRY(fk_rewrite_check(c->rewrite, ev, c->ops));
    if ((c->ops->caps & (FK_CAP_GROWS | FK_CAP_ADAPTS)) && !(c->ops->caps & FK_CAP_SKIPS))
        return fk_err(FK_ECONFIG, "eviction policy %s over codec %s: the codec's dictionary "
                      "changes with rows the policy may drop and it cannot skip them "
                      "(FK_CAP_SKIPS): refused", ev->name, c->ops->name);
    FK_TRY(fk_evict_check_names(ev, c->ops));
    if (ev->check)
        FK_TRY(ev->check(c->evict_opts));
    if (ev->check_prompt)
        FK_TRY(ev->check_prompt(c->evict_opts, lp->L, lp->H, lp->P));
    FK_TRY(positions_open(lp));
    const struct fk_rope *rope = fk_llama2c_model_rope_default(lp->m) ? &lp->rope : NULL;
    if (ev->needs && (ev->needs(c->evict_opts) & FK_EVICT_NEED_HEADS) &&
        (!c->head_scores || c->head_layers != lp->L || c->head_heads != lp->H))
        return fk_err(FK_ECONFIG, "eviction policy %s needs a head pattern of the model's %d "
                      "layers x %d KV heads (the dataset's head_pattern)%s", ev->name, lp->L,
                      lp->H, c->head_scores ? ": the one given has another shape" : "");
    if (ev->needs && (ev->needs(c->evict_opts) & FK_EVICT_NEED_ROPE) && !rope)
        return fk_err(FK_ECONFIG, "eviction policy %s needs the model's RoPE, which this "
                      "model does not describe", ev->name);
    size_t L = (size_t)lp->L, T = (size_t)lp->T;
    lp->pol = ev;
    lp->Hq = cfg->n_heads;
    lp->pol_st = calloc(L, sizeof *lp->pol_st);
    lp->keep = calloc(L, sizeof *lp->keep);
    lp->keep_all = calloc(L * lp->H * T, 1);
    lp->q = malloc(L * lp->Hq * T * lp->m_dim * sizeof(float));
    lp->qrow = malloc(T * sizeof(int32_t));
    if (!lp->pol_st || !lp->keep || !lp->keep_all || !lp->q || !lp->qrow)
        return fk_err(FK_ENOMEM, "out of memory for the eviction policy's masks and queries");
    for (size_t t = 0; t < T; t++)
        lp->qrow[t] = (int32_t)t;
    for (int l = 0; l < lp->L; l++) {
        lp->keep[l] = lp->keep_all + (size_t)l * lp->H * T;
        struct fk_evict_env env = {.layer = l, .n_layers = lp->L, .n_kv_heads = lp->H,
                                   .n_q_heads = lp->Hq, .rope = rope,
                                   .positions = lp->positions, .head_scores = c->head_scores,
                                   .head_dim = lp->m_dim, .n_tokens = lp->T,
                                   .prompt_len = lp->P, .keep = lp->keep[l]};
        int rc = ev->open(c->evict_opts, &env, &lp->pol_st[l]);
        if (rc < 0)
            return fk_err_context(rc, "eviction policy %s, layer %d: opening", ev->name, l);
    }
    return FK_OK;
}

/* The policy's prefill hook of every layer, after the prompt's forward passes. */
static int policy_prefill(struct loop *lp)
{
    for (int l = 0; lp->pol && lp->pol->prefill && l < lp->L; l++) {
        struct fk_evict_view v = policy_view(lp, l, lp->P - 1);
        int rc = lp->pol->prefill(lp->pol_st[l], &v);
        if (rc < 0)
            return fk_err_context(rc, "eviction policy %s, layer %d, prefill", lp->pol->name, l);
    }
    return FK_OK;
}

/* The row rewrites of every layer after the policy's prefill hooks: the loop's rows
 * rewritten in place, and the prompt's rows of the model's cache with them (a coded row's
 * reconstruction replaces it when its event runs). */
static int rewrite_prefill(struct loop *lp, const struct fk_rewrite *rw)
{
    int m = lp->m_dim, H = lp->H;
    /* rewrites that change nothing here (a prompt within think_recent): none at all */
    if (rw && rw->merge == FK_MERGE_NONE && fk_rewrite_pruned_tokens(rw, m, lp->P) < 1)
        rw = NULL;
    lp->rewritten = rw != NULL;
    for (int l = 0; rw && l < lp->L; l++) {
        struct fk_rewrite_in in = {.n_kv_heads = H, .n_q_heads = lp->Hq, .head_dim = m,
                                   .n_tokens = lp->T, .prompt_len = lp->P,
                                   .keep = lp->keep ? lp->keep[l] : NULL,
                                   .k = raw_row(lp, l, 0, 0, 0), .v = raw_row(lp, l, 1, 0, 0),
                                   .q = lp->q + (size_t)l * lp->Hq * lp->T * m,
                                   .n_qrows = lp->T, .qrow = lp->qrow};
        int rc = fk_rewrite_apply(rw, &in, NULL);
        if (rc < 0)
            return fk_err_context(rc, "the prefill's row rewrites, layer %d", l);
        for (int k = 0; k < 2; k++)
            for (int t = 0; t < lp->P; t++) {
                float *row = fk_llama2c_kv_row(lp->run, l, (enum fk_kind)k, t);
                for (int h = 0; h < H; h++)
                    memcpy(row + (size_t)h * m, raw_row(lp, l, k, h, t),
                           (size_t)m * sizeof(float));
            }
    }
    return FK_OK;
}

/* 1 when some row of some layer is dropped (the masks cover tokens 0..t). */
static int any_dropped(const struct loop *lp, int t)
{
    for (int l = 0; lp->pol && l < lp->L; l++)
        for (int h = 0; h < lp->H; h++)
            for (int j = 0; j <= t; j++)
                if (!lp->keep[l][(size_t)h * lp->T + j])
                    return 1;
    return 0;
}

/* Feeds the prompt exactly and codes each stream's prefill event. */
static int loop_prefill(struct loop *lp, const int32_t *ids, const struct fk_rewrite *rw)
{
    for (int t = 0; t < lp->P; t++) {
        FK_TRY(fk_llama2c_forward(lp->run, ids[t], t, NULL));
        keep_rows(lp, t);
    }
    FK_TRY(policy_prefill(lp));
    FK_TRY(rewrite_prefill(lp, rw));
    for (int k = 0; k < 2; k++) {
        struct fk_sched s = {.n_tokens = lp->T, .prompt_len = lp->P, .n_b = lp->buf[k].n_b,
                             .a_len = lp->buf[k].a_len, .mode = lp->buf[k].mode};
        fk_sched_begin(&lp->it[k], &s);
        lp->has[k] = fk_sched_next(&lp->it[k], &lp->ev[k]);
        if (lp->has[k] && lp->ev[k].phase == 0) {
            FK_TRY(code_event(lp, k, &lp->ev[k]));
            lp->n_comp[k] = lp->ev[k].end;
            lp->has[k] = fk_sched_next(&lp->it[k], &lp->ev[k]);
        }
    }
    return FK_OK;
}

/* Steps of the block starting at step j: up to lp->n_blk, ending at the first step whose
 * event (either stream) codes rows, since the positions after it read the reconstructions. */
static int block_len(const struct loop *lp, int j, int S)
{
    int n = 1;
    while (n < lp->n_blk && j + n < S) {
        int ev = 0;
        for (int k = 0; k < 2; k++)
            ev |= lp->has[k] && lp->ev[k].step == j + n - 1;
        if (ev)
            break;
        n++;
    }
    return n;
}

static int loop_decode(struct loop *lp, const struct fk_loop_ref *ref, enum fk_loop_mode mode,
                       struct fk_loop_result *r, double *cs, double *ks, float *tap_out,
                       float *tap_logit)
{
    int P = lp->P, S = ref->n_steps, V = ref->vocab;
    const struct fk_llama2c_config *c = fk_llama2c_model_config(lp->m);
    const int32_t *target = mode == FK_LOOP_FREE ? ref->greedy : ref->ids;
    const float *exact = mode == FK_LOOP_FREE ? ref->logits_greedy : ref->logits;
    int32_t fed = ref->ids[P]; /* the first generated id comes from the exact prefill */
    if (mode == FK_LOOP_FREE)
        fed = ref->greedy[P];
    int j_blk = 0, n_blk = 0; /* the current block: steps j_blk .. j_blk + n_blk - 1 */
    for (int j = 0; j < S; j++) {
        int t = P + j;
        const float *z = NULL;
        double f0 = fk_clock_s(CLOCK_THREAD_CPUTIME_ID);
        if (lp->blk && j >= j_blk + n_blk) {
            j_blk = j;
            n_blk = block_len(lp, j, S);
            if (n_blk > 1) /* (a block of one runs the one-position forward) */
                FK_TRY(fk_llama2c_forward_block(lp->run, ref->ids + t, n_blk, t, lp->blk,
                                                lp->blk_out, lp->blk_logit));
        }
        const float *t_out = tap_out, *t_logit = tap_logit; /* this step's taps */
        if (lp->blk && n_blk > 1) {
            size_t i = (size_t)(j - j_blk);
            z = lp->blk + i * V;
            t_out = lp->blk_out ? lp->blk_out + i * lp->L * c->dim : NULL;
            t_logit = lp->blk_logit ? lp->blk_logit + i * lp->L * c->n_heads * c->seq_len
                                    : NULL;
        } else {
            FK_TRY(fk_llama2c_forward(lp->run, mode == FK_LOOP_FREE ? fed : ref->ids[t], t,
                                      &z));
        }
        r->t_forward += fk_clock_s(CLOCK_THREAD_CPUTIME_ID) - f0;
        const float *ze = exact + (size_t)j * V;
        r->kl[j] = fk_loop_kl(ze, z, V);
        if (r->logits)
            memcpy(r->logits + (size_t)j * V, z, (size_t)V * sizeof(float));
        r->tokens[j] = fk_loop_argmax(z, V);
        r->top1[j] = r->tokens[j] == fk_loop_argmax(ze, V);
        if (mode == FK_LOOP_TEACHER) {
            r->nll_exact[j] = fk_loop_nll(ze, V, target[t + 1]);
            r->nll_codec[j] = fk_loop_nll(z, V, target[t + 1]);
        } else {
            r->nll_exact[j] = r->nll_codec[j] = NAN;
        }
        lp->dropped = lp->dropped || any_dropped(lp, t);
        /* as replay: the steps whose cache differs from the exact rows (something compressed,
         * dropped or rewritten) */
        int differs = lp->n_comp[0] > 0 || lp->n_comp[1] > 0 || lp->dropped || lp->rewritten;
        if (cs && differs) {
            attn_step(ref, j, c->head_dim, t_out, t_logit, c->seq_len, cs, ks);
            r->attn_steps++;
        }
        fed = r->tokens[j];
        keep_rows(lp, t);
        for (int k = 0; k < 2; k++) {
            if (!lp->has[k] || lp->ev[k].step != j)
                continue;
            FK_TRY(code_event(lp, k, &lp->ev[k]));
            lp->n_comp[k] = lp->ev[k].end;
            lp->has[k] = fk_sched_next(&lp->it[k], &lp->ev[k]);
        }
    }
    return FK_OK;
}

/* The buffers of blocks of up to n positions (with the attention taps when taps). */
static int block_alloc(struct loop *lp, int n, int taps)
{
    const struct fk_llama2c_config *c = fk_llama2c_model_config(lp->m);
    size_t N = (size_t)n, L = (size_t)c->n_layers;
    lp->n_blk = n;
    lp->blk = malloc(N * c->vocab_size * sizeof(float));
    if (taps) {
        lp->blk_out = malloc(N * L * c->dim * sizeof(float));
        lp->blk_logit = malloc(N * L * c->n_heads * c->seq_len * sizeof(float));
    }
    if (!lp->blk || (taps && (!lp->blk_out || !lp->blk_logit)))
        return fk_err(FK_ENOMEM, "model %s: out of memory for blocks of %d positions",
                      fk_llama2c_model_path(lp->m), n);
    return FK_OK;
}

int fk_loop_run(const struct fk_llama2c_model *m, const struct fk_loop_ref *ref,
                const struct fk_loop_codec *c, enum fk_loop_mode mode, int keep_logits,
                struct fk_loop_result *out)
{
    memset(out, 0, sizeof *out);
    out->mode = mode;
    const struct fk_llama2c_config *cfg = fk_llama2c_model_config(m);
    if (ref->vocab != cfg->vocab_size || ref->n_layers != cfg->n_layers
        || ref->dim != cfg->dim)
        return fk_err(FK_EINVAL, "model %s: the reference was decoded by another model",
                      fk_llama2c_model_path(m));
    struct loop lp = {.m = m, .ops = c->ops, .L = cfg->n_layers, .H = cfg->n_kv_heads,
                      .m_dim = cfg->head_dim, .T = ref->prompt_len + ref->n_steps,
                      .P = ref->prompt_len};
    for (int k = 0; k < 2; k++)
        fk_codec_buffer(c->ops, c->opts, k, &lp.buf[k]);
    int taps = mode == FK_LOOP_TEACHER && ref->att_out && ref->att_logit;
    double *cs = NULL, *ks = NULL;
    float *tap_out = NULL, *tap_logit = NULL;
    int rc = result_alloc(out, ref->n_steps, cfg->n_layers);
    if (rc == FK_OK && keep_logits
        && !(out->logits = malloc((size_t)ref->n_steps * ref->vocab * sizeof(float))))
        rc = fk_err(FK_ENOMEM, "out of memory for %d steps of logits", ref->n_steps);
    if (rc == FK_OK)
        rc = fk_llama2c_run_create(m, &lp.run);
    if (rc == FK_OK && taps) {
        cs = calloc((size_t)lp.L, sizeof *cs);
        ks = calloc((size_t)lp.L, sizeof *ks);
        tap_out = malloc((size_t)lp.L * cfg->dim * sizeof(float));
        tap_logit = malloc((size_t)lp.L * cfg->n_heads * cfg->seq_len * sizeof(float));
        if (!cs || !ks || !tap_out || !tap_logit)
            rc = fk_err(FK_ENOMEM, "out of memory for the loop's attention taps");
        struct fk_llama2c_tap tp = {.att_out = tap_out, .att_logit = tap_logit};
        if (rc == FK_OK)
            fk_llama2c_set_tap(lp.run, &tp);
    }
    if (rc == FK_OK && (c->evict || c->rewrite)) {
        rc = policy_open(&lp, c);
        struct fk_llama2c_tap tp = {.att_out = tap_out, .att_logit = tap_logit,
                                    .pre_attention = policy_hook, .ctx = &lp,
                                    .keep = lp.keep, .keep_stride = lp.T};
        if (rc == FK_OK)
            fk_llama2c_set_tap(lp.run, &tp);
    }
    if (rc == FK_OK && c->block > 1 && mode == FK_LOOP_TEACHER && !c->evict && !c->rewrite)
        rc = block_alloc(&lp, c->block, taps);
    if (rc == FK_OK)
        rc = loop_open(&lp, c);
    if (rc == FK_OK)
        rc = loop_prefill(&lp, ref->ids, c->rewrite);
    if (rc == FK_OK)
        rc = loop_decode(&lp, ref, mode, out, cs, ks, tap_out, tap_logit);
    if (rc == FK_OK) {
        out->t_codec = lp.t_codec;
        summarise(out, ref, cs, lp.dropped ? NULL : ks);
    }
    free(cs);
    free(ks);
    free(tap_out);
    free(tap_logit);
    loop_free(&lp);
    if (rc < 0)
        fk_loop_result_free(out);
    return rc;
}

/* ---------------------------------------------------------------- model datasets ---- */

void fk_loop_set_free(struct fk_loop_set **sp)
{
    struct fk_loop_set *s = sp ? *sp : NULL;
    if (!s)
        return;
    for (int i = 0; s->refs && i < s->n; i++)
        fk_loop_ref_free(&s->refs[i]);
    free(s->refs);
    fk_llama2c_tokenizer_free(&s->tok);
    fk_llama2c_model_free(&s->m);
    free(s);
    *sp = NULL;
}

int fk_loop_set_open(const char *model, const char *tokenizer, const struct fk_loop_prompt *p,
                     int n, int steps, struct fk_loop_set **out)
{
    *out = NULL;
    struct fk_loop_set *s = calloc(1, sizeof *s);
    if (!s || !(s->refs = calloc((size_t)(n > 0 ? n : 1), sizeof *s->refs))) {
        free(s);
        return fk_err(FK_ENOMEM, "out of memory");
    }
    s->n = n;
    int rc = fk_llama2c_model_load(model, &s->m);
    if (rc == FK_OK && tokenizer)
        rc = fk_llama2c_tokenizer_load(tokenizer, fk_llama2c_model_config(s->m)->vocab_size,
                                       &s->tok);
    for (int i = 0; rc == FK_OK && i < n; i++) {
        int32_t *ids = NULL;
        int n_ids = p[i].n_ids;
        if (p[i].text && !s->tok)
            rc = fk_err(FK_ECONFIG, "model %s: prompt %d is a text but no tokenizer is named "
                        "(give tokenizer, or the prompt's token ids)", model, i);
        else if (p[i].text)
            rc = fk_llama2c_encode(s->tok, p[i].text, 1, &ids, &n_ids);
        if (rc == FK_OK)
            rc = fk_loop_ref_build(s->m, p[i].text ? ids : p[i].ids, n_ids, NULL, 0, steps, 1,
                                   &s->refs[i]);
        if (rc < 0)
            rc = fk_err_context(rc, "prompt %d", i);
        free(ids);
    }
    if (rc < 0) {
        fk_loop_set_free(&s);
        return rc;
    }
    *out = s;
    return FK_OK;
}

int fk_loop_set_write_trace(const struct fk_loop_set *s, int i, const char *path,
                            const char *model_id)
{
    const struct fk_loop_ref *ref = &s->refs[i];
    int T = ref->prompt_len + ref->n_steps;
    struct fk_llama2c_run *run = NULL;
    FK_TRY(fk_llama2c_run_create(s->m, &run));
    int rc = FK_OK;
    for (int t = 0; t < T && rc == FK_OK; t++)
        rc = fk_llama2c_forward(run, ref->ids[t], t, NULL);
    struct fk_llama2c_gen g = {.ids = ref->ids, .n_tokens = T, .prompt_len = ref->prompt_len,
                               .text = "", .text_len = 0};
    const struct fk_llama2c_sampling greedy = {0.0, 1.0, 0, 1};
    struct fk_llama2c_trace_meta meta = {.model_id = model_id, .prompt = "",
                                         .sampling = &greedy,
                                         .generator = "fadkv-bench closed loop"};
    if (rc == FK_OK)
        rc = fk_llama2c_write_trace(run, &g, path, FK_ENC_F32, &meta);
    fk_llama2c_run_free(&run);
    return rc;
}
