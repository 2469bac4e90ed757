/* SPDX-License-Identifier: MIT
 * Model datasets in the runner (fk_runner_loop.h).
 */
#include "runner/fk_runner_loop.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fk_err.h"
#include "engine/fk_heads.h"
#include "kernels/fk_blas.h"

int fk_runner_model_dataset(const struct fk_dataset *ds, int write, struct fk_loop_set **out)
{
    *out = NULL;
    struct fk_loop_prompt *p = calloc((size_t)ds->n_prompts, sizeof *p);
    if (!p)
        return fk_err(FK_ENOMEM, "out of memory");
    for (int i = 0; i < ds->n_prompts; i++)
        p[i] = (struct fk_loop_prompt){.text = ds->prompt_text[i], .ids = ds->prompt_ids[i],
                                       .n_ids = ds->prompt_n[i]};
    int blas = fk_blas_single();
    int rc = fk_loop_set_open(ds->model, ds->tokenizer, p, ds->n_prompts, ds->steps, out);
    free(p);
    char dir[4096];
    const char *slash = ds->n_traces ? strrchr(ds->traces[0], '/') : NULL;
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - ds->traces[0]) : 1,
             slash ? ds->traces[0] : ".");
    if (rc == FK_OK && write)
        rc = fk_store_mkdir_p(dir);
    for (int i = 0; rc == FK_OK && write && i < ds->n_traces; i++)
        rc = fk_loop_set_write_trace(*out, i, ds->traces[i], ds->name);
    fk_blas_restore(blas);
    if (rc < 0) {
        fk_loop_set_free(out);
        return fk_err_context(rc, "model dataset '%s' (model %s)", ds->name, ds->model);
    }
    return FK_OK;
}

void fk_runner_loop_free(struct fk_cell_loop *l)
{
    free(l->kl);
    free(l->top1);
    free(l->nll_exact);
    free(l->nll_codec);
    free(l->kl_free);
    free(l->tokens_free);
    free(l->tokens_greedy);
    free(l->first_diverge);
    free(l->attn_cos);
    free(l->attn_kl);
    memset(l, 0, sizeof *l);
}

static int alloc_loop(struct fk_cell_loop *l, int P, int L, int S)
{
    size_t n = (size_t)P * S;
    *l = (struct fk_cell_loop){.n_prompts = P, .n_layers = L, .n_steps = S};
    l->kl = malloc(n * sizeof(double));
    l->top1 = malloc(n);
    l->nll_exact = malloc(n * sizeof(double));
    l->nll_codec = malloc(n * sizeof(double));
    l->kl_free = malloc(n * sizeof(double));
    l->tokens_free = malloc(n * sizeof(int32_t));
    l->tokens_greedy = malloc(n * sizeof(int32_t));
    l->first_diverge = malloc((size_t)P * sizeof(int32_t));
    l->attn_cos = malloc((size_t)P * L * sizeof(double));
    l->attn_kl = malloc((size_t)P * L * sizeof(double));
    if (!l->kl || !l->top1 || !l->nll_exact || !l->nll_codec || !l->kl_free || !l->tokens_free
        || !l->tokens_greedy || !l->first_diverge || !l->attn_cos || !l->attn_kl) {
        fk_runner_loop_free(l);
        return fk_err(FK_ENOMEM, "out of memory for the loop results of %d prompts", P);
    }
    return FK_OK;
}

/* Copies prompt p's teacher-forced (tf) and free-running (fr) results into l. */
static void keep(struct fk_cell_loop *l, int p, const struct fk_loop_ref *ref,
                 const struct fk_loop_result *tf, const struct fk_loop_result *fr)
{
    size_t o = (size_t)p * l->n_steps, S = (size_t)l->n_steps, L = (size_t)l->n_layers;
    memcpy(l->kl + o, tf->kl, S * sizeof(double));
    memcpy(l->top1 + o, tf->top1, S);
    memcpy(l->nll_exact + o, tf->nll_exact, S * sizeof(double));
    memcpy(l->nll_codec + o, tf->nll_codec, S * sizeof(double));
    memcpy(l->kl_free + o, fr->kl, S * sizeof(double));
    memcpy(l->tokens_free + o, fr->tokens, S * sizeof(int32_t));
    memcpy(l->tokens_greedy + o, ref->greedy + ref->prompt_len + 1, S * sizeof(int32_t));
    l->first_diverge[p] = fr->first_diverge;
    memcpy(l->attn_cos + (size_t)p * L, tf->attn_cos, L * sizeof(double));
    memcpy(l->attn_kl + (size_t)p * L, tf->attn_kl, L * sizeof(double));
}

int fk_runner_loop_cell(const struct fk_loop_set *set, const struct fk_cell_input *in,
                        struct fk_cell_loop *out)
{
    const struct fk_llama2c_config *c = fk_llama2c_model_config(set->m);
    FK_TRY(alloc_loop(out, set->n, c->n_layers, set->n ? set->refs[0].n_steps : 0));
    struct fk_loop_codec lc = {.ops = in->ops, .opts = in->opts, .dict = in->dict,
                               .basis = in->basis, .calib = in->calib, .evict = in->evict,
                               .evict_opts = in->evict_opts, .rewrite = in->rewrite,
                               .head_scores = in->heads ? in->heads->score : NULL,
                               .head_layers = in->heads ? in->heads->n_layers : 0,
                               .head_heads = in->heads ? in->heads->n_heads : 0};
    int blas = fk_blas_single(); /* nothing set within the runner's lanes (one already) */
    int rc = FK_OK;
    for (int p = 0; rc == FK_OK && p < set->n; p++) {
        struct fk_loop_result tf, fr;
        rc = fk_loop_run(set->m, &set->refs[p], &lc, FK_LOOP_TEACHER, 0, &tf);
        if (rc == FK_OK) {
            rc = fk_loop_run(set->m, &set->refs[p], &lc, FK_LOOP_FREE, 0, &fr);
            if (rc == FK_OK)
                keep(out, p, &set->refs[p], &tf, &fr);
            fk_loop_result_free(&fr);
        }
        fk_loop_result_free(&tf);
        if (rc < 0)
            rc = fk_err_context(rc, "closed loop, prompt %d", p);
    }
    fk_blas_restore(blas);
    if (rc < 0)
        fk_runner_loop_free(out);
    return rc;
}
