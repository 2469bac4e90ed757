/* SPDX-License-Identifier: MIT
 * Broken codec plugins for tests/test_plugin.sh, one per value of BREAK (compiled with
 * -DBREAK=n): a plain copy codec "copy32" (rows kept as float32, billed as fp16) broken in
 * one way.
 *   1  reconstruct() returns rows 1% larger than encode() reported (err stays 0)
 *   2  non-deterministic: each open() scales its rows by a counter of opens (errors are
 *      honest), so two runs of one stream differ
 *   3  built for plugin ABI version 99
 *   4  exports no fk_plugin_abi()
 *   5  its codec is named "full", the name of a built-in codec
 *   6  says the current ABI version but was built against a struct fk_codec_ops 8 bytes
 *      larger (another fk_codec.h)
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/fk_err.h"
#include "core/fk_codec.h"

#ifndef BREAK
#error "compile with -DBREAK=1..6"
#endif

struct copy_opts {
    struct fk_common_opts c;
};
static const struct fk_option copy_options[] = {
    FK_COMMON_OPTIONS(struct copy_opts),
    {NULL, 0, 0, 0, 0, 0, NULL, NULL},
};

struct copy_state {
    int m, H, T, *stored;
    float *rows, gain;
    uint64_t n;
};

static int g_opens;

static void copy_close(void *state)
{
    struct copy_state *s = state;
    if (s) {
        free(s->rows);
        free(s->stored);
        free(s);
    }
}

static int copy_open(const void *opts, const struct fk_stream_env *env, void **state)
{
    (void)opts;
    struct copy_state *s = calloc(1, sizeof *s);
    *state = s;
    if (!s)
        return fk_err(FK_ENOMEM, "copy32: out of memory");
    s->m = env->head_dim, s->H = env->n_heads, s->T = env->n_tokens;
    s->gain = BREAK == 2 ? 1.0f + 0.001f * (float)(g_opens++ % 7) : 1.0f;
    s->rows = calloc((size_t)s->H * s->T * s->m + 1, sizeof(float));
    s->stored = calloc((size_t)s->H + 1, sizeof(int));
    return s->rows && s->stored ? FK_OK : fk_err(FK_ENOMEM, "copy32: out of memory");
}

static int copy_encode(void *state, const struct fk_event *ev, struct fk_vec_out *out)
{
    struct copy_state *s = state;
    for (int i = 0; i < ev->n; i++) {
        int h = ev->head[i], t = ev->token[i];
        if (h < 0 || h >= s->H || t != s->stored[h])
            return fk_err(FK_EINVAL, "copy32: head %d token %d out of order", h, t);
        const float *x = ev->x + (size_t)i * s->m;
        float *r = s->rows + ((size_t)h * s->T + t) * s->m;
        double e = 0, xx = 0;
        for (int c = 0; c < s->m; c++) {
            r[c] = x[c] * s->gain;
            e += ((double)r[c] - x[c]) * ((double)r[c] - x[c]);
            xx += (double)x[c] * x[c];
        }
        s->stored[h]++;
        s->n++;
        out[i] = (struct fk_vec_out){.err = xx > 0 ? (float)sqrt(e / xx) : 0, .nnz = s->m,
                                     .bytes = 2.0f * s->m, .flags = xx > 0 ? 0 : FK_VEC_ZERO};
        out[i].err_enc = out[i].err;
    }
    return FK_OK;
}

static int copy_reconstruct(const void *state, int head, int token, float *out)
{
    const struct copy_state *s = state;
    if (head < 0 || head >= s->H || token < 0 || token >= s->stored[head])
        return fk_err(FK_EINVAL, "copy32: row (%d, %d) not stored", head, token);
    const float *r = s->rows + ((size_t)head * s->T + token) * s->m;
    for (int c = 0; c < s->m; c++)
        out[c] = BREAK == 1 ? r[c] * 1.01f : r[c];
    return FK_OK;
}

static void copy_stats(const void *state, struct fk_stream_stats *st)
{
    const struct copy_state *s = state;
    memset(st, 0, sizeof *st);
    st->bytes_codes = 2.0 * s->m * (double)s->n;
}

static const struct fk_codec_ops copy32 = {
    .name = BREAK == 5 ? "full" : "copy32",
    .summary = "a broken test codec (tests/plugins/broken.c)",
    .opts_size = sizeof(struct copy_opts),
    .options = copy_options,
    .open = copy_open,
    .encode = copy_encode,
    .reconstruct = copy_reconstruct,
    .stats = copy_stats,
    .close = copy_close,
};

#if BREAK != 4
static const struct fk_codec_ops *const codecs[] = {&copy32, NULL};
#if BREAK == 6
static const struct fk_plugin plugin = {
    FK_PLUGIN_ABI_VERSION,
    {(unsigned)sizeof(struct fk_codec_ops) + 8, (unsigned)sizeof(struct fk_stream_env),
     (unsigned)sizeof(struct fk_vec_out), (unsigned)sizeof(struct fk_stream_stats)},
    NULL, codecs};
#else
static const struct fk_plugin plugin = {BREAK == 3 ? 99 : FK_PLUGIN_ABI_VERSION, FK_PLUGIN_SIZES,
                                        NULL, codecs};
#endif

const struct fk_plugin *fk_plugin_abi(void)
{
    return &plugin;
}
#else
const struct fk_codec_ops *fk_codec_table(void);
const struct fk_codec_ops *fk_codec_table(void)
{
    return &copy32;
}
#endif
