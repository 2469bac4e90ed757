/* SPDX-License-Identifier: MIT
 * external: rows that another program computed. A codec prototyped in Python or PyTorch
 * writes, for each trace, a file laid out like the trace (the same schema, shapes and
 * tokens; its keys and values are the prototype's reconstructions), into one directory that
 * the dataset names (`reconstructions = "DIR"`: DIR/<trace file name>; datasets/EXTERNAL.md,
 * examples/external_codec.py). This codec stores those rows as they are when the engine
 * hands a token over, so every metric and figure of the harness (errors, attention fidelity
 * from the recorded queries, bytes, the Pareto figures) applies to a codec written anywhere.
 * The buffer is the common n_b / a_len: tokens in the exact window are read from the trace,
 * as for every codec. Bytes per stored vector: the option `bytes_per_vector` (the
 * prototype's own accounting: codes, metadata, its share of per-group constants), 0 = fp16
 * (2 head_dim, no compression). Model constants of the prototype (its dictionary or basis)
 * go in `bytes_model` (bytes for the whole model, counted once and never per token).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/fk_err.h"
#include "core/fk_codec.h"

struct external_opts {
    struct fk_common_opts c;     /* n_b, a_len (coef is not used) */
    double bytes_per_vector;     /* bytes of one stored K or V vector of one head; 0: fp16 */
    double bytes_model;          /* the prototype's model constants, whole model */
};

struct external {
    int m, n_heads, n_tokens, layer, kind;
    const float *rows;           /* [n_heads][n_tokens][m] the prototype's rows (env) */
    int32_t *n_rows;             /* [n_heads] stored rows */
    double row_bytes, model_share;
    uint64_t rows_total;
};

static const struct fk_option external_options[] = {
    FK_COMMON_OPTIONS(struct external_opts),
    {"bytes_per_vector", FK_OPT_DOUBLE, offsetof(struct external_opts, bytes_per_vector), 0, 0,
     1e9, NULL, "bytes of one stored K or V vector of one head, as the prototype counts them "
     "(0: fp16, 2 x head_dim)"},
    {"bytes_model", FK_OPT_DOUBLE, offsetof(struct external_opts, bytes_model), 0, 0, 1e15,
     NULL, "the prototype's model-level constants (dictionary, basis), bytes for the whole "
     "model"},
    {NULL, 0, 0, 0, 0, 0, NULL, NULL},
};

static void external_close(void *state)
{
    struct external *e = state;
    if (!e)
        return;
    free(e->n_rows);
    free(e);
}

static int external_open(const void *opts, const struct fk_stream_env *env, void **state)
{
    const struct external_opts *o = opts;
    if (!env->external)
        return fk_err(FK_EINVAL, "external: no reconstructions for layer %d %s (the dataset "
                      "needs reconstructions = \"DIR\")", env->layer, env->kind ? "V" : "K");
    struct external *e = calloc(1, sizeof *e);
    if (!e)
        return fk_err(FK_ENOMEM, "out of memory");
    *state = e; /* closed by the caller on failure too */
    e->m = env->head_dim;
    e->n_heads = env->n_heads;
    e->n_tokens = env->n_tokens;
    e->layer = env->layer;
    e->kind = env->kind;
    e->rows = env->external;
    e->row_bytes = o->bytes_per_vector > 0 ? o->bytes_per_vector : 2.0 * env->head_dim;
    e->model_share = o->bytes_model; /* split over (layer, kind) by the store's sum: see stats */
    e->n_rows = calloc((size_t)env->n_heads + 1, sizeof(int32_t));
    return e->n_rows ? FK_OK : fk_err(FK_ENOMEM, "out of memory (external state)");
}

static const float *row_of(const struct external *e, int h, int t)
{
    return e->rows + ((size_t)h * e->n_tokens + t) * e->m;
}

static int external_encode(void *state, const struct fk_event *ev, struct fk_vec_out *out)
{
    struct external *e = state;
    for (int i = 0; i < ev->n; i++) {
        int h = ev->head[i], t = ev->token[i];
        if (h < 0 || h >= e->n_heads || t != e->n_rows[h] || t >= e->n_tokens)
            return fk_err(FK_EINVAL, "external: event row (head %d, token %d) out of order", h,
                          t);
        const float *x = ev->x + (size_t)i * e->m, *r = row_of(e, h, t);
        double xx = 0, d2 = 0;
        for (int j = 0; j < e->m; j++) {
            double d = (double)x[j] - r[j];
            xx += (double)x[j] * x[j];
            d2 += d * d;
        }
        int zero = xx <= 1e-30;
        float err = zero ? 0.0f : (float)sqrt(d2 / xx);
        out[i] = (struct fk_vec_out){.err_enc = err, .err = err, .nnz = e->m,
                                     .bytes = (float)e->row_bytes,
                                     .flags = zero ? FK_VEC_ZERO : 0};
        e->n_rows[h]++;
        e->rows_total++;
    }
    return FK_OK;
}

static int external_reconstruct(const void *state, int head, int token, float *out)
{
    const struct external *e = state;
    if (head < 0 || head >= e->n_heads || token < 0 || token >= e->n_rows[head])
        return fk_err(FK_EINVAL, "external: no stored row (head %d, token %d)", head, token);
    memcpy(out, row_of(e, head, token), sizeof(float) * (size_t)e->m);
    return FK_OK;
}

static void external_stats(const void *state, struct fk_stream_stats *st)
{
    const struct external *e = state;
    memset(st, 0, sizeof *st);
    st->bytes_codes = (double)e->rows_total * e->row_bytes;
    /* the whole model's constants, reported by the first (layer, kind) only: the store sums
     * bytes_model over layers and kinds */
    st->bytes_model = e->layer == 0 && e->kind == 0 ? e->model_share : 0;
}

const struct fk_codec_ops fk_codec_external = {
    .name = "external",
    .summary = "rows computed by another program (a Python prototype), read from "
               "trace-shaped files",
    .opts_size = sizeof(struct external_opts),
    .options = external_options,
    .caps = FK_CAP_STATIC | FK_CAP_EXTERNAL,
    .open = external_open,
    .encode = external_encode,
    .reconstruct = external_reconstruct,
    .stats = external_stats,
    .close = external_close,
};
