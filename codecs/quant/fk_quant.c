/* SPDX-License-Identifier: MIT
 * quant: the plain group quantiser of Hugging Face's QuantizedCache (spec families.md 1.2,
 * read from transformers cache_utils.py QuantizedLayer.update with the quanto backend, and
 * optimum-quanto tensor/grouped.py group() and MaxOptimizer), in two modes.
 *
 * mode hf (default): HF's documented behaviour. Buffer FK_BUF_BLOCK_ALL, n_b = residual R,
 *   for K and V: the prefill is quantised whole (no exact residual); decode tokens gather
 *   in an exact residual of 0 .. R-1 tokens; when the block with the current token is full
 *   (after the step's attention), the whole cache -- the dequantised history plus the new
 *   block -- is quantised AGAIN, so earlier rows change at every flush. The history is what
 *   reconstruct() returned (float32, the values attention read); HF holds it in the model
 *   dtype. One quirk of HF is not reproduced: right after a flush its residual is a 1-d
 *   empty tensor and the next step always appends, so with R = 1 it flushes every other
 *   step; here, as for every R >= 2 there, a flush comes every R steps.
 * mode window: the recommended plain baseline (families.md 1.2, "PTQ-int"). Buffer
 *   FK_BUF_SLIDE, n_b = R, a_len = 1: the R most recent tokens stay exact, each token is
 *   quantised once as it leaves the window and never again. Axis token only. R = 0: the
 *   prefill is quantised whole and (SLIDE with n_b = 0) each decode token one step after
 *   its own.
 *
 * Axes (quanto's group() over HF's [B = 1][H][T][D] tensors), per kind (axis_k, axis_v):
 *   token    quanto axis 0: groups of G contiguous channels of one token (head_dim % G == 0).
 *   channel  quanto axis -1 (mode hf only): per channel, groups of G consecutive rows of the
 *            cache flattened as [H][T_cur] (row h T_cur + t; T_cur = tokens of each head after
 *            the flush), so a group straddles two heads when T_cur % G != 0, as quanto does
 *            at batch 1. quanto refuses a flush where H T_cur % G != 0 ("Group size must be a
 *            divisor"); here the last group of each channel is then shorter (H T_cur mod G
 *            rows). Results equal quanto's whenever it runs.
 * Quantiser: quant/fk_quant_group.h, MaxOptimizer's arithmetic (scale = (max - min) /
 * (2^b - 1), shift = -min; q = round((x + shift) / scale) clamped to [0, 2^b - 1], x_hat =
 * q scale - shift), with fp16 metadata; the same numbers as kivi's quantiser.
 *
 * Bytes (stats bytes_codes), of the quantised rows held now (a re-quantised row counts
 * once), codes packed back to back (fractional bytes counted as such):
 *   token axis    per row head_dim b / 8 + 4 head_dim / G (fp16 scale and shift per group)
 *   channel axis  rows head_dim b / 8 + 4 per group held: head_dim ceil(H T_cur / G) groups
 *
 * Capabilities: none (not FK_CAP_GRID: a row holds head_dim / G grids, or belongs to
 * per-channel grids; not FK_CAP_STATIC: mode hf re-quantises). A zero vector is flagged
 * FK_VEC_ZERO (err 0); on the channel axis it comes back as grid points, not necessarily 0.
 */
#include <stdlib.h>
#include <string.h>

#include "common/fk_err.h"
#include "core/fk_codec.h"
#include "quant/fk_quant_group.h"

enum { KIND_K = 0 };                   /* FK_KIND_K (core/fk_codec.h: K 0, V 1) */
enum { AXIS_TOKEN = 0, AXIS_CHANNEL = 1 };
enum { MODE_HF = 0, MODE_WINDOW = 1 };

static const char *const axis_names[] = {"token", "channel", NULL};
static const char *const mode_names[] = {"hf", "window", NULL};

struct quant_opts {
    struct fk_common_opts c;     /* unused: the buffer callback gives the rule */
    int bits;                    /* b */
    int group;                   /* G */
    int axis_k, axis_v;          /* AXIS_* */
    int residual;                /* R */
    int mode;                    /* MODE_* */
};

struct quant {
    struct fkq_store s;          /* codes [H][T][m]; grids: token axis [H][T][m/G], channel
                                  * axis [m][max_groups]; col, qcol: token axis [m] (one
                                  * row), channel axis [H T] (one channel of the cache) */
    int G, axis, mode;
    int n_groups;                /* channel axis: grids per channel held, ceil(H t_cur / G) */
    int max_groups;              /* channel axis: ceil(H T / G) */
    int t_cur;                   /* mode hf: tokens of every head */
};

static const struct fk_option quant_options[] = {
    {"bits", FK_OPT_INT, offsetof(struct quant_opts, bits), 4, 1, 8, NULL,
     "bits per coordinate (HF QuantizedCache: nbits 4; quanto offers 2 and 4)"},
    {"group", FK_OPT_INT, offsetof(struct quant_opts, group), 64, 1, 1 << 16, NULL,
     "group G (>= 2): token axis G channels of a token, channel axis G cache rows"},
    {"axis_k", FK_OPT_ENUM, offsetof(struct quant_opts, axis_k), AXIS_TOKEN, 0, 1, axis_names,
     "key groups: token (quanto axis 0) | channel (quanto axis -1, mode hf only)"},
    {"axis_v", FK_OPT_ENUM, offsetof(struct quant_opts, axis_v), AXIS_TOKEN, 0, 1, axis_names,
     "value groups: token (quanto axis 0) | channel (quanto axis -1, mode hf only)"},
    {"residual", FK_OPT_INT, offsetof(struct quant_opts, residual), 128, 0, 1 << 24, NULL,
     "exact tokens R: hf flushes (re-quantising all) every R decode tokens; window keeps "
     "the R most recent"},
    {"mode", FK_OPT_ENUM, offsetof(struct quant_opts, mode), MODE_HF, 0, 1, mode_names,
     "hf (QuantizedCache: prefill quantised, flush-and-requantise) | window (sliding, "
     "quantised once)"},
    {NULL, 0, 0, 0, 0, 0, NULL, NULL},
};

static void quant_buffer(const void *opts, int kind, struct fk_buffer *b)
{
    const struct quant_opts *o = opts;
    (void)kind;
    *b = (struct fk_buffer){.mode = o->mode == MODE_HF ? FK_BUF_BLOCK_ALL : FK_BUF_SLIDE,
                            .n_b = o->residual, .a_len = 1};
}

static int quant_check(const void *opts, int head_dim, int n_atoms)
{
    const struct quant_opts *o = opts;
    (void)n_atoms;
    if (o->bits < 1 || o->bits > 8)
        return fk_err(FK_ECONFIG, "codec 'quant': option 'bits' = %d is outside [1, 8]",
                      o->bits);
    if (o->group < 2)
        return fk_err(FK_ECONFIG, "codec 'quant': option 'group' = %d: a group of one value "
                      "is stored exactly at 4 bytes of metadata; use group >= 2", o->group);
    if (o->mode == MODE_HF && o->residual < 1)
        return fk_err(FK_ECONFIG, "codec 'quant': option 'residual' = %d: mode hf flushes its "
                      "residual every `residual` decode tokens, so it needs residual >= 1 "
                      "(mode window takes 0: no exact window)", o->residual);
    for (int k = 0; k < 2; k++) {
        int axis = k ? o->axis_v : o->axis_k;
        const char *name = k ? "axis_v" : "axis_k";
        if (axis == AXIS_CHANNEL && o->mode == MODE_WINDOW)
            return fk_err(FK_ECONFIG, "codec 'quant': option '%s' = channel needs mode hf: mode "
                          "window quantises each token once, on its own, and a per-channel "
                          "group spans tokens; use mode = \"hf\" (flush and re-quantise, as "
                          "QuantizedCache) or the kivi codec (per-channel keys in blocks)",
                          name);
        if (axis == AXIS_TOKEN && head_dim > 0 && head_dim % o->group)
            return fk_err(FK_ECONFIG, "codec 'quant': option 'group' = %d does not divide "
                          "head_dim %d (%s = token: groups of `group` channels of one token)",
                          o->group, head_dim, name);
    }
    return FK_OK;
}

static void quant_close(void *state)
{
    struct quant *u = state;
    if (!u)
        return;
    fkq_store_free(&u->s);
    free(u);
}

static int quant_open(const void *opts, const struct fk_stream_env *env, void **state)
{
    const struct quant_opts *o = opts;
    FK_TRY(quant_check(opts, env->head_dim, 0));
    struct quant *u = calloc(1, sizeof *u);
    if (!u)
        return fk_err(FK_ENOMEM, "out of memory");
    *state = u; /* closed by the caller on failure too */
    u->G = o->group;
    u->axis = env->kind == KIND_K ? o->axis_k : o->axis_v;
    u->mode = o->mode;
    size_t rows = (size_t)env->n_heads * (size_t)env->n_tokens;
    u->max_groups = (int)((rows + (size_t)o->group - 1) / (size_t)o->group);
    int ch = u->axis == AXIS_CHANNEL;
    size_t grids = ch ? (size_t)u->max_groups * (size_t)env->head_dim
                      : rows * (size_t)(env->head_dim / o->group);
    return fkq_store_init(&u->s, env, o->bits, grids, ch ? rows : (size_t)env->head_dim,
                          "quant");
}

/* Channel axis: the grid of row (h, t) of channel c, with the cache flattened at t_cur. */
static const struct fkq_grid *channel_grid(const struct quant *u, int h, int t, int c)
{
    return u->s.grid + (size_t)c * u->max_groups + ((size_t)h * u->t_cur + t) / u->G;
}

static void quant_value(const void *self, int h, int t, float *out)
{
    const struct quant *u = self;
    const struct fkq_store *s = &u->s;
    const uint8_t *q = s->q + fkq_row(s, h, t) * s->m;
    if (u->axis == AXIS_TOKEN) {
        fkq_row_value(q, s->m, u->G, s->grid + fkq_row(s, h, t) * (s->m / u->G), out);
        return;
    }
    for (int c = 0; c < s->m; c++)
        out[c] = fkq_value(*channel_grid(u, h, t, c), q[c]);
}

/* Token axis: row (h, t) quantised from x. */
static void code_token(struct quant *u, int h, int t, const float *x)
{
    struct fkq_store *s = &u->s;
    size_t row = fkq_row(s, h, t);
    fkq_code_row(x, s->m, u->G, s->bits, s->q + row * s->m, s->grid + row * (s->m / u->G));
}

/* Token axis, mode hf: every stored row quantised again from its reconstruction. */
static void requant_tokens(struct quant *u)
{
    for (int h = 0; h < u->s.n_heads; h++)
        for (int t = 0; t < u->s.n_rows[h]; t++) {
            quant_value(u, h, t, u->s.col);
            code_token(u, h, t, u->s.col);
        }
}

/* Channel axis, mode hf: the cache after the event (the history as reconstructed, then the
 * event's k tokens per head) quantised again, one channel at a time, in groups of G rows of
 * the [H][t_cur + k] flattening. */
static int requant_channels(struct quant *u, const struct fk_event *ev, int k)
{
    struct fkq_store *s = &u->s;
    int m = s->m, H = s->n_heads, tn = u->t_cur + k, nr = H * tn;
    FK_TRY(fkq_by_head(s, ev));
    for (int c = 0; c < m; c++) {
        for (int h = 0; h < H; h++)
            for (int t = 0; t < tn; t++) {
                float *v = &s->col[(size_t)h * tn + t];
                if (t < u->t_cur)
                    *v = fkq_value(*channel_grid(u, h, t, c), s->q[fkq_row(s, h, t) * m + c]);
                else
                    *v = ev->x[(size_t)s->idx[s->off[h] + t - u->t_cur] * m + c];
            }
        struct fkq_grid *g = s->grid + (size_t)c * u->max_groups;
        for (int r0 = 0; r0 < nr; r0 += u->G) {
            int n = nr - r0 < u->G ? nr - r0 : u->G; /* the last group may be shorter */
            g[r0 / u->G] = fkq_code(s->col + r0, 1, n, s->bits, s->qcol + r0, 1);
        }
        for (int h = 0; h < H; h++)
            for (int t = 0; t < tn; t++)
                s->q[fkq_row(s, h, t) * m + c] = s->qcol[(size_t)h * tn + t];
    }
    u->n_groups = (nr + u->G - 1) / u->G;
    return FK_OK;
}

static int quant_encode(void *state, const struct fk_event *ev, struct fk_vec_out *out)
{
    struct quant *u = state;
    struct fkq_store *s = &u->s;
    FK_TRY(fkq_check_event(s, "quant", ev));
    if (ev->n == 0)
        return FK_OK;
    for (int h = 1; u->mode == MODE_HF && h < s->n_heads; h++)
        if (s->cnt[h] != s->cnt[0])
            return fk_err(FK_EINVAL, "quant (mode hf): the event hands head %d %d tokens but "
                          "head 0 %d: the whole cache is flushed at once (QuantizedLayer "
                          "quantises [H][T] together)", h, s->cnt[h], s->cnt[0]);
    if (u->axis == AXIS_CHANNEL) {
        FK_TRY(requant_channels(u, ev, s->cnt[0]));
    } else {
        if (u->mode == MODE_HF)
            requant_tokens(u);
        for (int i = 0; i < ev->n; i++)
            code_token(u, ev->head[i], ev->token[i], ev->x + (size_t)i * s->m);
    }
    u->t_cur += s->cnt[0]; /* read by mode hf only, where every head has cnt[0] */
    fkq_commit(s, u, quant_value, ev, out, u->mode == MODE_HF);
    return FK_OK;
}

static int quant_reconstruct(const void *state, int head, int token, float *out)
{
    const struct quant *u = state;
    return fkq_reconstruct(&u->s, "quant", head, token, out);
}

static void quant_stats(const void *state, struct fk_stream_stats *st)
{
    const struct quant *u = state;
    memset(st, 0, sizeof *st);
    double rows = fkq_rows_stored(&u->s), m = u->s.m;
    double codes = rows * m * u->s.bits / 8;
    st->bytes_codes = u->axis == AXIS_TOKEN ? codes + rows * 4.0 * m / u->G
                                            : codes + 4.0 * m * u->n_groups;
}

const struct fk_codec_ops fk_codec_quant = {
    .name = "quant",
    .summary = "group quantiser of HF QuantizedCache (mode hf: flush and re-quantise) or a "
               "sliding-window baseline (mode window), fp16 meta",
    .opts_size = sizeof(struct quant_opts),
    .options = quant_options,
    .caps = 0,
    .buffer = quant_buffer,
    .check = quant_check,
    .open = quant_open,
    .encode = quant_encode,
    .reconstruct = quant_reconstruct,
    .stats = quant_stats,
    .close = quant_close,
    .roles = (const struct fk_role[]){{FK_ROLE_GROUP, "group"}, {FK_ROLE_WINDOW, "residual"},
                                      {0, NULL}},
};
