/* SPDX-License-Identifier: MIT
 * uniform: b-bit uniform asymmetric quantisation of each vector on its own (the per-token
 * baseline of the quantisation family, spec families.md 1.1/1.2: min/scale, round to
 * nearest). Per stored row: lo = min x and step = (max x - lo) / (2^b - 1), both kept as
 * fp16; q_j = clamp(round((x_j - lo) / step), 0, 2^b - 1), x_hat_j = lo + q_j step with the
 * fp16 values (the family's quantiser, quant/fk_quant_group.h, with one group per row). A
 * constant vector has step 0: q = 0 and x_hat = lo, so it comes back as its fp16 value
 * (exactly, for fp16 traces), never NaN. Lossy, dense, O(m) per vector.
 * Bytes per stored row: ceil(m b / 8) packed codes + 4 (fp16 lo and step); the codes are
 * kept one per byte in memory. The codes are the only coefficients: err_enc = err.
 */
#include <stdlib.h>
#include <string.h>

#include "common/fk_err.h"
#include "core/fk_codec.h"
#include "quant/fk_quant_group.h"

struct uniform_opts {
    struct fk_common_opts c;     /* n_b, a_len (coef is ignored) */
    int bits;                    /* b, bits per coordinate */
};

struct uniform {
    struct fkq_store s;          /* codes [n_heads][n_tokens][m], one grid per row */
};

static const struct fk_option uniform_options[] = {
    FK_COMMON_OPTIONS(struct uniform_opts),
    {"bits", FK_OPT_INT, offsetof(struct uniform_opts, bits), 4, 1, 8, NULL,
     "bits per coordinate (2^bits levels between the vector's min and max)"},
    {NULL, 0, 0, 0, 0, 0, NULL, NULL},
};

static void uniform_close(void *state)
{
    struct uniform *u = state;
    if (!u)
        return;
    fkq_store_free(&u->s);
    free(u);
}

static int uniform_open(const void *opts, const struct fk_stream_env *env, void **state)
{
    const struct uniform_opts *o = opts;
    struct uniform *u = calloc(1, sizeof *u);
    if (!u)
        return fk_err(FK_ENOMEM, "out of memory");
    *state = u; /* closed by the caller on failure too */
    size_t rows = (size_t)env->n_heads * (size_t)env->n_tokens;
    return fkq_store_init(&u->s, env, o->bits, rows, 0, "uniform");
}

static void uniform_value(const void *self, int h, int t, float *out)
{
    const struct fkq_store *s = &((const struct uniform *)self)->s;
    size_t row = fkq_row(s, h, t);
    fkq_row_value(s->q + row * s->m, s->m, s->m, s->grid + row, out);
}

static int uniform_encode(void *state, const struct fk_event *ev, struct fk_vec_out *out)
{
    struct uniform *u = state;
    struct fkq_store *s = &u->s;
    FK_TRY(fkq_check_event(s, "uniform", ev));
    for (int i = 0; i < ev->n; i++) {
        size_t row = fkq_row(s, ev->head[i], ev->token[i]);
        fkq_code_row(ev->x + (size_t)i * s->m, s->m, s->m, s->bits, s->q + row * s->m,
                     s->grid + row);
    }
    fkq_commit(s, u, uniform_value, ev, out, 0);
    for (int i = 0; i < ev->n; i++) /* a static codec's rows carry their own bytes */
        out[i].bytes = (float)((s->m * s->bits + 7) / 8 + 4);
    return FK_OK;
}

static int uniform_reconstruct(const void *state, int head, int token, float *out)
{
    const struct uniform *u = state;
    return fkq_reconstruct(&u->s, "uniform", head, token, out);
}

static void uniform_stats(const void *state, struct fk_stream_stats *st)
{
    const struct uniform *u = state;
    memset(st, 0, sizeof *st);
    st->bytes_codes = fkq_rows_stored(&u->s) * ((u->s.m * u->s.bits + 7) / 8 + 4);
}

const struct fk_codec_ops fk_codec_uniform = {
    .name = "uniform",
    .summary = "b-bit uniform quantisation of each vector between its min and max (fp16 meta)",
    .opts_size = sizeof(struct uniform_opts),
    .options = uniform_options,
    .caps = FK_CAP_STATIC | FK_CAP_GRID,
    .open = uniform_open,
    .encode = uniform_encode,
    .reconstruct = uniform_reconstruct,
    .stats = uniform_stats,
    .close = uniform_close,
};
