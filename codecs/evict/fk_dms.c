/* SPDX-License-Identifier: MIT
 * dms: threshold eviction as kvpress's DMSPress runs it (kvpress/presses/dms_press.py; spec
 * families-budgets-2026.md section 7): every token is scored once, when it arrives, from
 * its own key; it stays while it is among the `window` most recent tokens, and when it
 * leaves that window it is dropped iff its score < threshold (strict), else kept for good.
 * No budget: the kept fraction is an outcome (`retained_frac`). Scores: `knorm` is
 * kvpress's KnormPress, -||k||; `knorm_rel` is -||k|| / m_h, m_h the mean key norm of
 * head h over the prompt (known at the prefill's end), so that threshold -1.2 drops keys
 * 20 % longer than the prompt's mean on any model. The reference decides in its forward
 * hook after the step's attention, so a decision shows from the next token: here the
 * decode hook of token t decides the tokens up to t - 1 - window, the prefill hook those up
 * to P - 1 - window. With decoding = false (kvpress's default) only the prompt is judged.
 */
#include <math.h>
#include <stddef.h>

#include "common/fk_err.h"
#include "evict/fk_evict_common.h"

enum { DMS_KNORM = 0, DMS_KNORM_REL = 1 };
static const char *const dms_scorers[] = {"knorm", "knorm_rel", NULL};

struct dms_opts {
    double threshold;
    int window, decoding, scorer;
};

static const struct fk_option dms_options[] = {
    {"threshold", FK_OPT_DOUBLE, offsetof(struct dms_opts, threshold), -1.2, -1e300, 1e300,
     NULL, "a token leaving the window is dropped iff its score < threshold (score units)"},
    {"window", FK_OPT_INT, offsetof(struct dms_opts, window), 128, 1, 1 << 24, NULL,
     "sliding window: the most recent tokens, never judged (kvpress sliding_window_size; "
     "tokens)"},
    {"decoding", FK_OPT_BOOL, offsetof(struct dms_opts, decoding), 1, 0, 1, NULL,
     "judge decoded tokens too (kvpress's default: false, the prompt only)"},
    {"scorer", FK_OPT_ENUM, offsetof(struct dms_opts, scorer), DMS_KNORM_REL, 0, 1,
     dms_scorers, "per-token score: knorm (-||k||, kvpress) or knorm_rel (-||k|| over the "
     "head's mean prompt key norm)"},
    {NULL, 0, 0, 0, 0, 0, NULL, NULL},
};

struct dms {
    struct fk_evict_base b;      /* b.acc: [H][T] the tokens' scores; b.extra: [H] 1 / the
                                  * norm each head's scores divide by */
    struct dms_opts o;
    int decided;                 /* tokens 0 .. decided-1 are judged */
};

static int dms_open(const void *opts, const struct fk_evict_env *env, void **state)
{
    FK_TRY(fk_evict_base_open(env, sizeof(struct dms), 1, (size_t)env->n_kv_heads, state));
    ((struct dms *)*state)->o = *(const struct dms_opts *)opts;
    return FK_OK;
}

static double key_norm(const struct fk_evict_env *e, const struct fk_evict_view *v, int h,
                       int j)
{
    const float *k = v->k + ((size_t)h * e->n_tokens + j) * e->head_dim;
    double nn = 0;
    for (int c = 0; c < e->head_dim; c++)
        nn += (double)k[c] * k[c];
    return sqrt(nn);
}

/* Judges the tokens decided .. end-1 of every head. */
static void judge(struct dms *s, int end)
{
    const struct fk_evict_env *e = &s->b.env;
    for (int h = 0; h < e->n_kv_heads; h++) {
        const double *sc = s->b.acc + (size_t)h * e->n_tokens;
        uint8_t *keep = e->keep + (size_t)h * e->n_tokens;
        for (int j = s->decided; j < end; j++)
            if (sc[j] < s->o.threshold)
                keep[j] = 0;
    }
    if (end > s->decided)
        s->decided = end;
}

static int dms_prefill(void *state, const struct fk_evict_view *v)
{
    struct dms *s = state;
    const struct fk_evict_env *e = &s->b.env;
    int P = e->prompt_len;
    for (int h = 0; h < e->n_kv_heads; h++) {
        double *sc = s->b.acc + (size_t)h * e->n_tokens, mean = 0;
        for (int j = 0; j < P; j++)
            mean += (sc[j] = key_norm(e, v, h, j));
        mean /= P;
        s->b.extra[h] = s->o.scorer == DMS_KNORM_REL && mean > 0 ? 1 / mean : 1;
        for (int j = 0; j < P; j++)
            sc[j] = -sc[j] * s->b.extra[h];
    }
    judge(s, P - s->o.window);
    return FK_OK;
}

static int dms_decode(void *state, const struct fk_evict_view *v)
{
    struct dms *s = state;
    const struct fk_evict_env *e = &s->b.env;
    int t = v->t;
    for (int h = 0; h < e->n_kv_heads; h++)
        s->b.acc[(size_t)h * e->n_tokens + t] = -key_norm(e, v, h, t) * s->b.extra[h];
    if (s->o.decoding)
        judge(s, t - s->o.window);
    return FK_OK;
}

const struct fk_evict_ops fk_evict_dms = {
    .name = "dms",
    .summary = "threshold eviction (kvpress DMSPress): a token leaving the `window` most recent "
               "is dropped iff its score (key norm, raw or over the prompt's mean) < threshold; "
               "the kept fraction is an outcome",
    .opts_size = sizeof(struct dms_opts),
    .options = dms_options,
    .open = dms_open,
    .prefill = dms_prefill,
    .decode = dms_decode,
    .close = fk_evict_base_close,
};
