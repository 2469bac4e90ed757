/* SPDX-License-Identifier: MIT
 * The keys of a model dataset (fk_sweep.h, struct fk_dataset.model): a [[dataset]] that
 * names a llama2.c checkpoint, prompts and a step count instead of traces. Its traces are
 * the exact decodes of its prompts, which the runner writes under the results directory
 * before any cell; every codec then also runs in the loop (harness/loop).
 */
#include "engine/fk_sweep.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fk_err.h"
#include "common/fk_sha256.h"
#include "common/fk_str.h"
#include "common/fk_toml.h"

#define PROMPTS_CAP 4096

static int at(const struct fk_toml_value *v, const char *what)
{
    return fk_err(FK_ECONFIG, "%s:%d:%d: %s", fk_toml_origin(v), fk_toml_line(v),
                  fk_toml_col(v), what);
}

static int add_prompt(struct fk_dataset *ds, char *text, int32_t *ids, int n)
{
    if (ds->n_prompts == PROMPTS_CAP) {
        free(text);
        free(ids);
        return fk_err(FK_ECONFIG, "dataset '%s': more than %d prompts", ds->name, PROMPTS_CAP);
    }
    if (!ds->prompt_text) {
        ds->prompt_text = calloc(PROMPTS_CAP, sizeof *ds->prompt_text);
        ds->prompt_ids = calloc(PROMPTS_CAP, sizeof *ds->prompt_ids);
        ds->prompt_n = calloc(PROMPTS_CAP, sizeof *ds->prompt_n);
        if (!ds->prompt_text || !ds->prompt_ids || !ds->prompt_n) {
            free(text);
            free(ids);
            return fk_err(FK_ENOMEM, "out of memory");
        }
    }
    ds->prompt_text[ds->n_prompts] = text;
    ds->prompt_ids[ds->n_prompts] = ids;
    ds->prompt_n[ds->n_prompts++] = n;
    return FK_OK;
}

/* A prompts file: one prompt per non-blank line, \n and \\ escapes (as `trace --prompts`). */
static int prompts_file(const struct fk_toml_value *v, const char *path, struct fk_dataset *ds)
{
    size_t len = 0;
    char *buf = fk_slurp(path, &len);
    if (!buf)
        return fk_err(FK_ECONFIG, "%s:%d:%d: prompts: cannot read the prompts file %s "
                      "(relative paths resolve against the folder of the config file; expected "
                      "a file of one prompt per line, or a list of texts or of token-id lists)",
                      fk_toml_origin(v), fk_toml_line(v), fk_toml_col(v), path);
    int rc = FK_OK;
    for (char *line = buf; rc == FK_OK && line < buf + len;) {
        char *end = memchr(line, '\n', (size_t)(buf + len - line));
        if (!end)
            end = buf + len;
        size_t n = (size_t)(end - line);
        if (n > 0 && line[n - 1] == '\r')
            n--;
        if (n > 0) {
            char *p = malloc(n + 1);
            size_t k = 0;
            for (size_t i = 0; p && i < n; i++) {
                if (line[i] == '\\' && i + 1 < n && (line[i + 1] == 'n' || line[i + 1] == '\\'))
                    p[k++] = line[++i] == 'n' ? '\n' : '\\';
                else
                    p[k++] = line[i];
            }
            if (!p)
                rc = fk_err(FK_ENOMEM, "out of memory");
            else {
                p[k] = '\0';
                rc = add_prompt(ds, p, NULL, 0);
            }
        }
        line = end + 1;
    }
    free(buf);
    if (rc == FK_OK && ds->n_prompts == 0)
        rc = at(v, "prompts: the prompts file holds no prompt");
    return rc;
}

static int prompt_ids(const struct fk_toml_value *e, struct fk_dataset *ds)
{
    size_t n = fk_toml_array_len(e);
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    if (!ids)
        return fk_err(FK_ENOMEM, "out of memory");
    for (size_t j = 0; j < n; j++) {
        int64_t x;
        if (fk_toml_get_int(fk_toml_array_at(e, j), &x) < 0 || x < 0 || x > (1 << 30)) {
            free(ids);
            return at(fk_toml_array_at(e, j), "prompts: a token id is an integer >= 0");
        }
        ids[j] = (int32_t)x;
    }
    if (n == 0) {
        free(ids);
        return at(e, "prompts: an empty token-id list");
    }
    return add_prompt(ds, NULL, ids, (int)n);
}

int fk_sweep_model_key(const struct fk_toml_entry *e, struct fk_dataset *ds, int *handled)
{
    *handled = 1;
    const struct fk_toml_value *v = e->value;
    size_t len;
    const char *str = NULL;
    if (!strcmp(e->key, "model") || !strcmp(e->key, "tokenizer")) {
        if (fk_toml_get_string(v, &str, &len) < 0)
            return at(v, "expected a path to a llama2.c file");
        char **dst = !strcmp(e->key, "model") ? &ds->model : &ds->tokenizer;
        free(*dst);
        if (!(*dst = fk_sweep_path(v, str)))
            return fk_err(FK_ENOMEM, "out of memory");
        return FK_OK;
    }
    if (!strcmp(e->key, "steps")) {
        int64_t x;
        if (fk_toml_get_int(v, &x) < 0 || x < 1 || x > 1 << 20)
            return at(v, "steps: expected an integer from 1 to 1048576 (decode positions "
                         "per prompt)");
        ds->steps = (int)x;
        return FK_OK;
    }
    if (strcmp(e->key, "prompts")) {
        *handled = 0;
        return FK_OK;
    }
    if (fk_toml_get_string(v, &str, &len) == FK_OK) {
        char *path = fk_sweep_path(v, str);
        if (!path)
            return fk_err(FK_ENOMEM, "out of memory");
        int rc = prompts_file(v, path, ds);
        free(path);
        return rc;
    }
    if (fk_toml_type(v) != FK_TOML_ARRAY)
        return at(v, "prompts: expected a prompts file, or a list of texts or of token-id "
                     "lists");
    for (size_t i = 0; i < fk_toml_array_len(v); i++) {
        const struct fk_toml_value *p = fk_toml_array_at(v, i);
        if (fk_toml_get_string(p, &str, &len) == FK_OK) {
            char *t = strdup(str);
            if (!t)
                return fk_err(FK_ENOMEM, "out of memory");
            FK_TRY(add_prompt(ds, t, NULL, 0));
        } else if (fk_toml_type(p) == FK_TOML_ARRAY) {
            FK_TRY(prompt_ids(p, ds));
        } else {
            return at(p, "prompts: each entry is a text or a list of token ids");
        }
    }
    if (ds->n_prompts == 0)
        return at(v, "prompts: an empty list");
    return FK_OK;
}

int fk_sweep_model_finish(const struct fk_toml_value *tab, const char *output,
                          struct fk_dataset *ds)
{
    int any = ds->model || ds->tokenizer || ds->n_prompts || ds->steps;
    if (!any)
        return FK_OK;
    if (!ds->model || !ds->n_prompts || !ds->steps)
        return at(tab, "a model dataset needs model, prompts and steps (tokenizer for text "
                       "prompts)");
    if (ds->n_traces)
        return at(tab, "a model dataset has no traces: its traces are the exact decodes of "
                       "its prompts");
    ds->traces = calloc((size_t)ds->n_prompts, sizeof *ds->traces);
    if (!ds->traces)
        return fk_err(FK_ENOMEM, "out of memory");
    for (int i = 0; i < ds->n_prompts; i++) {
        size_t n = strlen(output) + strlen(ds->name) + 40;
        if (!(ds->traces[i] = malloc(n)))
            return fk_err(FK_ENOMEM, "out of memory");
        snprintf(ds->traces[i], n, "%s/loop-traces/%s-%04d.h5", output, ds->name, i);
        ds->n_traces++;
    }
    return FK_OK;
}

int fk_sweep_model_hash(const struct fk_dataset *ds, struct fk_sha256_ctx *c)
{
    char hex[65], num[32];
    fk_sha256_update(c, "model-loop-1", 12);
    FK_TRY(fk_sha256_file(ds->model, hex));
    fk_sha256_update(c, hex, 64);
    if (ds->tokenizer) {
        FK_TRY(fk_sha256_file(ds->tokenizer, hex));
        fk_sha256_update(c, hex, 64);
    }
    snprintf(num, sizeof num, "steps=%d;", ds->steps);
    fk_sha256_update(c, num, strlen(num));
    for (int i = 0; i < ds->n_prompts; i++) {
        if (ds->prompt_text[i]) {
            fk_sha256_update(c, "text:", 5);
            fk_sha256_update(c, ds->prompt_text[i], strlen(ds->prompt_text[i]) + 1);
            continue;
        }
        fk_sha256_update(c, "ids:", 4);
        for (int j = 0; j < ds->prompt_n[i]; j++) {
            snprintf(num, sizeof num, "%d,", ds->prompt_ids[i][j]);
            fk_sha256_update(c, num, strlen(num));
        }
    }
    return FK_OK;
}

void fk_sweep_model_free(struct fk_dataset *ds)
{
    for (int i = 0; i < ds->n_prompts; i++) {
        free(ds->prompt_text[i]);
        free(ds->prompt_ids[i]);
    }
    free(ds->prompt_text);
    free(ds->prompt_ids);
    free(ds->prompt_n);
    free(ds->model);
    free(ds->tokenizer);
}
