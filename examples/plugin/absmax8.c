/* SPDX-License-Identifier: MIT
 * An example codec plugin: absmax8, a per-row int8 absmax quantiser. Each stored row keeps
 * one float scale s = max_i |x_i| and head_dim int8 codes q_i = round(127 x_i / s); it
 * reconstructs x_i ~ q_i s / 127 (m + 4 bytes per row, against the fp16 reference's 2 m).
 *
 * Build it against an installed fadkv-bench and use it:
 *     cc $(pkg-config --cflags fadkv-bench) -O2 -shared -fPIC -o absmax8.so absmax8.c
 *     fadkv-bench --plugin ./absmax8.so codecs          # listed, marked as a plugin
 *     fadkv-bench conformance ./absmax8.so              # the codec conformance suite
 *     fadkv-bench --plugin ./absmax8.so --config SWEEP.toml   # or plugins = [...] there
 * The meson build makes it too (build/examples/plugin/absmax8.so). The interface is
 * core/fk_codec.h; the plugin links against nothing: fk_err, fk_coef_names and the
 * fk_opts_* functions are the executable's.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/fk_err.h"
#include "core/fk_codec.h"

struct absmax8_opts {
    struct fk_common_opts c;     /* n_b, a_len, coef (coef unused: there are no coefficients) */
};

static const struct fk_option absmax8_options[] = {
    FK_COMMON_OPTIONS(struct absmax8_opts),
    {NULL, 0, 0, 0, 0, 0, NULL, NULL},
};

struct absmax8_state {
    int m, H, T;
    int8_t *q;                   /* [H][T][m] */
    float *scale;                /* [H][T] */
    int *stored;                 /* [H] tokens stored per head (0 .. stored-1) */
    uint64_t rows;
};

static void absmax8_close(void *state)
{
    struct absmax8_state *s = state;
    if (!s)
        return;
    free(s->q);
    free(s->scale);
    free(s->stored);
    free(s);
}

static int absmax8_open(const void *opts, const struct fk_stream_env *env, void **state)
{
    (void)opts;
    *state = NULL;
    struct absmax8_state *s = calloc(1, sizeof *s);
    if (!s)
        return fk_err(FK_ENOMEM, "absmax8: out of memory");
    *state = s;
    s->m = env->head_dim;
    s->H = env->n_heads;
    s->T = env->n_tokens;
    size_t rows = (size_t)s->H * (size_t)s->T;
    s->q = malloc(rows * (size_t)s->m + 1);
    s->scale = malloc(sizeof(float) * (rows + 1));
    s->stored = calloc((size_t)s->H + 1, sizeof(int));
    if (!s->q || !s->scale || !s->stored)
        return fk_err(FK_ENOMEM, "absmax8: out of memory for %d heads x %d tokens x %d", s->H,
                      s->T, s->m);
    return FK_OK;
}

static void absmax8_row(const struct absmax8_state *s, int h, int t, float *out)
{
    const int8_t *q = s->q + ((size_t)h * s->T + t) * s->m;
    float sc = s->scale[(size_t)h * s->T + t] / 127.0f;
    for (int c = 0; c < s->m; c++)
        out[c] = (float)q[c] * sc;
}

static int absmax8_encode(void *state, const struct fk_event *ev, struct fk_vec_out *out)
{
    struct absmax8_state *s = state;
    int m = s->m;
    for (int i = 0; i < ev->n; i++) {
        int h = ev->head[i], t = ev->token[i];
        if (h < 0 || h >= s->H || t != s->stored[h] || t >= s->T)
            return fk_err(FK_EINVAL, "absmax8: head %d token %d out of order (head %d holds "
                          "tokens 0..%d)", h, t, h, h >= 0 && h < s->H ? s->stored[h] - 1 : -1);
        const float *x = ev->x + (size_t)i * m;
        int8_t *q = s->q + ((size_t)h * s->T + t) * m;
        float amax = 0;
        for (int c = 0; c < m; c++)
            amax = fabsf(x[c]) > amax ? fabsf(x[c]) : amax;
        s->scale[(size_t)h * s->T + t] = amax;
        for (int c = 0; c < m; c++)
            q[c] = amax > 0 ? (int8_t)lrintf(127.0f * x[c] / amax) : 0;
        s->stored[h]++;
        s->rows++;
        /* the reported error is that of the row as stored, recomputed from it */
        float *xh = malloc(sizeof(float) * (size_t)m);
        if (!xh)
            return fk_err(FK_ENOMEM, "absmax8: out of memory");
        absmax8_row(s, h, t, xh);
        double e = 0, xx = 0;
        for (int c = 0; c < m; c++) {
            e += ((double)x[c] - xh[c]) * ((double)x[c] - xh[c]);
            xx += (double)x[c] * x[c];
        }
        free(xh);
        out[i] = (struct fk_vec_out){.err = xx > 0 ? (float)sqrt(e / xx) : 0, .nnz = m,
                                     .bytes = (float)(m + 4),
                                     .flags = xx > 0 ? 0 : FK_VEC_ZERO};
        out[i].err_enc = out[i].err;
    }
    return FK_OK;
}

static int absmax8_reconstruct(const void *state, int head, int token, float *out)
{
    const struct absmax8_state *s = state;
    if (head < 0 || head >= s->H || token < 0 || token >= s->stored[head])
        return fk_err(FK_EINVAL, "absmax8: row (head %d, token %d) is not stored", head, token);
    absmax8_row(s, head, token, out);
    return FK_OK;
}

static void absmax8_stats(const void *state, struct fk_stream_stats *st)
{
    const struct absmax8_state *s = state;
    memset(st, 0, sizeof *st);
    st->bytes_codes = (double)s->rows * (s->m + 4);
    st->macs = 2.0 * s->m * (double)s->rows;
}

static double absmax8_estimate(const void *opts, int m, int n_atoms)
{
    (void)opts;
    (void)n_atoms;
    return 2.0 * m;
}

static const struct fk_codec_ops absmax8 = {
    .name = "absmax8",
    .summary = "example plugin: per-row int8 absmax quantiser (m + 4 bytes per row)",
    .opts_size = sizeof(struct absmax8_opts),
    .options = absmax8_options,
    .caps = FK_CAP_STATIC,
    .open = absmax8_open,
    .encode = absmax8_encode,
    .reconstruct = absmax8_reconstruct,
    .stats = absmax8_stats,
    .estimate_macs = absmax8_estimate,
    .close = absmax8_close,
};

static const struct fk_codec_ops *const plugin_codecs[] = {&absmax8, NULL};
static const struct fk_plugin plugin = {FK_PLUGIN_ABI_VERSION, FK_PLUGIN_SIZES, "plugin",
                                        plugin_codecs};

const struct fk_plugin *fk_plugin_abi(void)
{
    return &plugin;
}
