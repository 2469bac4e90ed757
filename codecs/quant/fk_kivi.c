/* SPDX-License-Identifier: MIT
 * kivi: KIVI (spec families.md 1.1, read from jy-yuan/KIVI models/llama_kivi.py and
 * quant/new_pack.py): b-bit asymmetric quantisation of keys per channel and of values per
 * token, behind a full-precision window of recent tokens.
 *
 * What stays exact (the buffer callback; families.md 1.1's state machine, R = residual):
 *   keys    FK_BUF_BLOCK, n_b = R: 0 .. R-1 recent keys exact. Once a block of R keys is
 *           full (the current key included) it is quantised, after the step's attention;
 *           the prefill hands over floor(P / R) R keys. Never one key at a time (trap (i)).
 *   values  FK_BUF_SLIDE, n_b = R, a_len = 1: exactly the R most recent values exact after
 *           each step; the oldest is quantised as the next one arrives.
 * Grouping: one `group` G for both kinds, meaning different things.
 *   keys    per (head, channel), one grid per G consecutive tokens, aligned to token 0. R is
 *           a multiple of G, so every block is whole groups and streamed codes equal
 *           one-shot codes (trap (ii)). An event must hand each head whole groups.
 *   values  per (head, token), one grid per G consecutive channels (head_dim % G == 0).
 * Quantiser: quant/fk_quant_group.h (fp16 origin and step from the group's min and max, codes
 * from the stored fp16 values, round half to even, x_hat = q step + lo; a constant group
 * comes back as its fp16 value, never NaN). A row never changes once quantised.
 *
 * Bytes (stats bytes_codes), per quantised row of either kind, exactly
 *   head_dim b / 8 + 4 head_dim / G
 * (families.md 1.1): the codes packed back to back, fractional bytes counted as such, plus
 * an fp16 origin and step per group (keys: one pair per channel per G tokens, i.e.
 * head_dim / G pairs per token; values: head_dim / G pairs per token). For b in {1, 2, 4, 8}
 * this is KIVI's packing (32/b codes per int32 word, along tokens for keys and along
 * head_dim for values, in multiples of 32/b); for other b it is the dense packing (an int32
 * packer would waste 32 mod b bits per word). Codes are kept one per byte in memory.
 *
 * Capabilities: none. Not FK_CAP_GRID: that declares one grid per row from the row's min to
 * its max, while a value row holds head_dim / G grids and a key's grid belongs to its
 * channel over G tokens, so the conformance suite's per-row grid checks do not hold. Not
 * FK_CAP_STATIC: a key's codes depend on the other keys of its group. A zero key is flagged
 * FK_VEC_ZERO (err 0, excluded from the error means) but comes back as its channels' grid
 * points, which need not be zero.
 */
#include <stdlib.h>
#include <string.h>

#include "common/fk_err.h"
#include "core/fk_codec.h"
#include "quant/fk_quant_group.h"

enum { KIND_K = 0 }; /* FK_KIND_K of datasets/formats/fk_trace.h (core/fk_codec.h: K 0, V 1) */

struct kivi_opts {
    struct fk_common_opts c;     /* unused: the buffer callback gives the rule */
    int bits;                    /* b */
    int group;                   /* G */
    int residual;                /* R */
};

struct kivi {
    struct fkq_store s;          /* codes [H][T][m]; grids: keys [H][n_groups][m] (one per
                                  * channel per G tokens), values [H][T][m/G]; col [G] */
    int kind, G;
    int n_groups;                /* keys: grids per channel, ceil(T / G) */
};

static const struct fk_option kivi_options[] = {
    {"bits", FK_OPT_INT, offsetof(struct kivi_opts, bits), 2, 1, 8, NULL,
     "bits per coordinate of keys and values (KIVI: 2; 4 for GQA models)"},
    {"group", FK_OPT_INT, offsetof(struct kivi_opts, group), 32, 1, 1 << 16, NULL,
     "group G (>= 2): keys per channel over G tokens, values per token over G channels"},
    {"residual", FK_OPT_INT, offsetof(struct kivi_opts, residual), 128, 1, 1 << 24, NULL,
     "full-precision window R (tokens, a multiple of group): keys flushed in blocks of R, "
     "the R most recent values exact"},
    {NULL, 0, 0, 0, 0, 0, NULL, NULL},
};

static void kivi_buffer(const void *opts, int kind, struct fk_buffer *b)
{
    const struct kivi_opts *o = opts;
    *b = (struct fk_buffer){.mode = kind == KIND_K ? FK_BUF_BLOCK : FK_BUF_SLIDE,
                            .n_b = o->residual, .a_len = 1};
}

static int kivi_check(const void *opts, int head_dim, int n_atoms)
{
    const struct kivi_opts *o = opts;
    (void)n_atoms;
    if (o->bits < 1 || o->bits > 8)
        return fk_err(FK_ECONFIG, "codec 'kivi': option 'bits' = %d is outside [1, 8]",
                      o->bits);
    if (o->group < 2)
        return fk_err(FK_ECONFIG, "codec 'kivi': option 'group' = %d: a key group of one "
                      "token has min == max, so keys would be stored exactly while billed as "
                      "%d-bit (families.md 1.1 trap (i)); use group >= 2", o->group, o->bits);
    if (o->residual % o->group)
        return fk_err(FK_ECONFIG, "codec 'kivi': option 'residual' = %d is not a multiple of "
                      "option 'group' = %d: key groups must follow the flush blocks of residual "
                      "keys (families.md 1.1 trap (ii))", o->residual, o->group);
    if (head_dim > 0 && head_dim % o->group)
        return fk_err(FK_ECONFIG, "codec 'kivi': option 'group' = %d does not divide head_dim "
                      "%d (values are quantised per token in groups of `group` channels)",
                      o->group, head_dim);
    return FK_OK;
}

static void kivi_close(void *state)
{
    struct kivi *k = state;
    if (!k)
        return;
    fkq_store_free(&k->s);
    free(k);
}

static int kivi_open(const void *opts, const struct fk_stream_env *env, void **state)
{
    const struct kivi_opts *o = opts;
    FK_TRY(kivi_check(opts, env->head_dim, 0));
    struct kivi *k = calloc(1, sizeof *k);
    if (!k)
        return fk_err(FK_ENOMEM, "out of memory");
    *state = k; /* closed by the caller on failure too */
    k->kind = env->kind;
    k->G = o->group;
    k->n_groups = (env->n_tokens + o->group - 1) / o->group;
    size_t m = (size_t)env->head_dim, T = (size_t)env->n_tokens;
    size_t per_head = env->kind == KIND_K ? (size_t)k->n_groups * m : T * (m / (size_t)o->group);
    return fkq_store_init(&k->s, env, o->bits, per_head * (size_t)env->n_heads,
                          (size_t)o->group, "kivi");
}

/* Keys: each head's tokens of the event, G at a time, per channel (the event is checked). */
static int kivi_code_keys(struct kivi *k, const struct fk_event *ev)
{
    struct fkq_store *s = &k->s;
    int m = s->m, G = k->G;
    for (int h = 0; h < s->n_heads; h++)
        if (s->cnt[h] % G)
            return fk_err(FK_EINVAL, "kivi: the event hands head %d %d keys (tokens %d..%d): "
                          "keys are quantised per channel in whole groups of option 'group' = "
                          "%d tokens (kivi's buffer rule hands them over in blocks of "
                          "`residual`)", h, s->cnt[h], s->n_rows[h],
                          s->n_rows[h] + s->cnt[h] - 1, G);
    FK_TRY(fkq_by_head(s, ev));
    for (int h = 0; h < s->n_heads; h++)
        for (int k0 = 0; k0 < s->cnt[h]; k0 += G) {
            int t0 = s->n_rows[h] + k0; /* a multiple of G: groups start at token 0 */
            const int32_t *vi = s->idx + s->off[h] + k0;
            uint8_t *q = s->q + fkq_row(s, h, t0) * m;
            struct fkq_grid *g = s->grid + ((size_t)h * k->n_groups + t0 / G) * m;
            for (int c = 0; c < m; c++) {
                for (int i = 0; i < G; i++)
                    s->col[i] = ev->x[(size_t)vi[i] * m + c];
                g[c] = fkq_code(s->col, 1, G, s->bits, q + c, m);
            }
        }
    return FK_OK;
}

/* Values: each vector on its own, in groups of G channels. */
static void kivi_code_values(struct kivi *k, const struct fk_event *ev)
{
    struct fkq_store *s = &k->s;
    for (int i = 0; i < ev->n; i++) {
        size_t row = fkq_row(s, ev->head[i], ev->token[i]);
        fkq_code_row(ev->x + (size_t)i * s->m, s->m, k->G, s->bits, s->q + row * s->m,
                     s->grid + row * (s->m / k->G));
    }
}

static void kivi_value(const void *self, int h, int t, float *out)
{
    const struct kivi *k = self;
    const struct fkq_store *s = &k->s;
    size_t row = fkq_row(s, h, t);
    const uint8_t *q = s->q + row * s->m;
    if (k->kind != KIND_K) {
        fkq_row_value(q, s->m, k->G, s->grid + row * (s->m / k->G), out);
        return;
    }
    const struct fkq_grid *g = s->grid + ((size_t)h * k->n_groups + t / k->G) * s->m;
    for (int c = 0; c < s->m; c++)
        out[c] = fkq_value(g[c], q[c]);
}

static int kivi_encode(void *state, const struct fk_event *ev, struct fk_vec_out *out)
{
    struct kivi *k = state;
    FK_TRY(fkq_check_event(&k->s, "kivi", ev));
    if (k->kind == KIND_K)
        FK_TRY(kivi_code_keys(k, ev));
    else
        kivi_code_values(k, ev);
    fkq_commit(&k->s, k, kivi_value, ev, out, 0);
    return FK_OK;
}

static int kivi_reconstruct(const void *state, int head, int token, float *out)
{
    const struct kivi *k = state;
    return fkq_reconstruct(&k->s, "kivi", head, token, out);
}

static void kivi_stats(const void *state, struct fk_stream_stats *st)
{
    const struct kivi *k = state;
    memset(st, 0, sizeof *st);
    st->bytes_codes = fkq_rows_stored(&k->s) *
                      ((double)k->s.m * k->s.bits / 8 + 4.0 * k->s.m / k->G);
}

const struct fk_codec_ops fk_codec_kivi = {
    .name = "kivi",
    .summary = "KIVI: b-bit keys per channel in blocks of residual, values per token behind "
               "a sliding window of residual exact tokens (fp16 meta)",
    .opts_size = sizeof(struct kivi_opts),
    .options = kivi_options,
    .caps = 0,
    .buffer = kivi_buffer,
    .check = kivi_check,
    .open = kivi_open,
    .encode = kivi_encode,
    .reconstruct = kivi_reconstruct,
    .stats = kivi_stats,
    .close = kivi_close,
    .roles = (const struct fk_role[]){{FK_ROLE_GROUP, "group"}, {FK_ROLE_WINDOW, "residual"},
                                      {0, NULL}},
};
