/* SPDX-License-Identifier: MIT
 * Generation loop of the llama2.c runner: prompt encoding, length checks, prefill, sampling
 * with a seeded GSL mt19937 stream, decoding to text. Kept apart from fk_llama2c.c because
 * GSL headers and <cblas.h> cannot share a translation unit.
 */
#include "gen/fk_llama2c.h"

#include <gsl/gsl_rng.h>
#include <stdlib.h>
#include <string.h>

#include "common/fk_err.h"

/* Appends the decoded text of ids[from..n) to g->text. */
static int build_text(const struct fk_llama2c_tokenizer *t, struct fk_llama2c_gen *g)
{
    size_t cap = 64, len = 0;
    char *s = malloc(cap);
    if (!s)
        return fk_err(FK_ENOMEM, "decoding text: out of memory");
    int from = g->n_tokens > 0 && g->ids[0] == fk_llama2c_tokenizer_bos(t) ? 1 : 0;
    for (int i = from; i < g->n_tokens; i++) {
        const char *p;
        size_t n;
        int rc = fk_llama2c_decode(t, i > 0 ? g->ids[i - 1] : -1, g->ids[i], &p, &n);
        if (rc < 0) {
            free(s);
            return rc;
        }
        if (len + n + 1 > cap) {
            while (len + n + 1 > cap)
                cap *= 2;
            char *ns = realloc(s, cap);
            if (!ns) {
                free(s);
                return fk_err(FK_ENOMEM, "decoding text: out of memory");
            }
            s = ns;
        }
        memcpy(s + len, p, n);
        len += n;
    }
    s[len] = '\0';
    g->text = s;
    g->text_len = len;
    return FK_OK;
}

int fk_llama2c_generate(struct fk_llama2c_run *r, const struct fk_llama2c_tokenizer *t,
                        const char *prompt, int steps, const struct fk_llama2c_sampling *s,
                        int keep_logits, struct fk_llama2c_gen *out)
{
    memset(out, 0, sizeof *out);
    const struct fk_llama2c_config *c = fk_llama2c_model_config(fk_llama2c_run_model(r));
    int V = fk_llama2c_tokenizer_size(t), seq_len = c->seq_len;
    if (V != c->vocab_size)
        return fk_err(FK_EINVAL, "tokenizer has %d tokens but the model's vocab_size is %d",
                      V, c->vocab_size);
    if (steps < 0)
        return fk_err(FK_EINVAL, "steps %d must be >= 0", steps);
    if (!(s->temperature >= 0.0) || !(s->top_p > 0.0 && s->top_p <= 1.0))
        return fk_err(FK_EINVAL, "sampling temperature %g, top_p %g: expected temperature "
                      ">= 0 and top_p in (0, 1]", s->temperature, s->top_p);
    int32_t *pids = NULL;
    int P = 0;
    FK_TRY(fk_llama2c_encode(t, prompt, 1, &pids, &P));
    if (P > seq_len) {
        free(pids);
        return fk_err(FK_EINVAL, "prompt of %d tokens (with BOS) is longer than the model's "
                      "seq_len %d", P, seq_len);
    }
    if ((long)P + steps > seq_len) {
        free(pids);
        return fk_err(FK_EINVAL, "prompt of %d tokens (with BOS) plus %d steps = %ld tokens "
                      "exceeds the model's seq_len %d", P, steps, (long)P + steps, seq_len);
    }
    int cap = P + steps;
    out->ids = malloc((size_t)cap * sizeof *out->ids);
    struct fk_llama2c_cand *work = malloc((size_t)V * sizeof *work);
    if (keep_logits)
        out->logits = malloc((size_t)cap * (size_t)V * sizeof(float));
    gsl_rng *rng = gsl_rng_alloc(gsl_rng_mt19937);
    if (!out->ids || !work || (keep_logits && !out->logits) || !rng) {
        free(pids);
        free(work);
        if (rng)
            gsl_rng_free(rng);
        fk_llama2c_gen_free(out);
        return fk_err(FK_ENOMEM, "generation of %d tokens: out of memory", cap);
    }
    gsl_rng_set(rng, s->seed);
    memcpy(out->ids, pids, (size_t)P * sizeof *pids);
    free(pids);
    out->prompt_len = P;
    int eos = fk_llama2c_tokenizer_eos(t);
    int rc = FK_OK;
    const float *logits = NULL;
    for (int i = 0; i < cap && rc >= 0; i++) {
        if (i >= P) {
            double u = s->temperature > 0.0 ? gsl_rng_uniform(rng) : 0.0;
            rc = fk_llama2c_sample(logits, V, s->temperature, s->top_p, u, work);
            if (rc < 0)
                break;
            out->ids[i] = rc;
        }
        rc = fk_llama2c_forward(r, out->ids[i], i, &logits);
        if (rc < 0)
            break;
        out->n_tokens = i + 1;
        if (keep_logits)
            memcpy(out->logits + (size_t)i * V, logits, (size_t)V * sizeof(float));
        if (i >= P && out->ids[i] == eos && !s->ignore_eos) {
            out->stopped_at_eos = 1;
            break;
        }
    }
    free(work);
    gsl_rng_free(rng);
    if (rc >= 0)
        rc = build_text(t, out);
    if (rc < 0) {
        fk_llama2c_gen_free(out);
        return rc;
    }
    return FK_OK;
}

void fk_llama2c_gen_free(struct fk_llama2c_gen *g)
{
    if (!g)
        return;
    free(g->ids);
    free(g->text);
    free(g->logits);
    memset(g, 0, sizeof *g);
}
