/* SPDX-License-Identifier: MIT
 * engine: the KV-cache formats the serving engines ship (spec families-quant-2026.md 1.3,
 * 2 and 3), each vector stored as the engine stores it and read back as it reads it:
 *   fp8_e4m3, fp8_e5m2  vLLM's fp8 cache: code = fp8(x / scale), saturated; x_hat =
 *                       decode(code) scale, then rounded to the model dtype (option dtype).
 *                       The scale (fp8_scale): vllm = vLLM's calculate_kv_scales, frozen at
 *                       the first batch: max |x| over the stream's first event (the prefill)
 *                       / 200 for keys, / 100 for values, one per layer; head = one per KV
 *                       head, max |x| of its first-event rows / 448 (llm-compressor's
 *                       attn_head strategy); unit = 1 (vLLM without scales). The scales
 *                       are model constants (bytes_model), D bytes per row.
 *   fp8_token_head      vLLM's fp8_per_token_head: s = max(max |x| / 448, 1e-6) per row,
 *                       code = e4m3(clamp(x / s, +-448)), x_hat = decode(code) s: D + 4
 *                       bytes per row.
 *   q8_0 q4_0 q4_1 q5_0 q5_1 iq4_nl
 *                       llama.cpp's cache types: blocks of 32 values along head_dim
 *                       (head_dim % 32 == 0), the bytes of ggml's block structs
 *                       (kernels/fk_kvfmt.h), after llama.cpp's Hadamard rotation (option
 *                       rot: auto = llama.cpp's rule, on when head_dim % 64 == 0; keys
 *                       rotated in blocks of the largest power of two >= 64 dividing
 *                       head_dim, values in blocks of 64); x_hat is rotated back (H = H^-1).
 * Tokens: every token is stored quantised (n_b = 0: an engine keeps no exact window); the
 * token of a decode step is attended exactly at its own step and quantised after it (the
 * engines quantise it before; the difference is that one token's). Lossy, dense; a row's
 * codes never depend on other rows (the vllm and head scales: on the first event's).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/fk_err.h"
#include "core/fk_codec.h"
#include "kernels/fk_kvfmt.h"
#include "kernels/fk_sparse.h"
#include "quant/fk_quant_rows.h"

enum { F_E4M3, F_E5M2, F_TOKEN_HEAD, F_Q8_0, F_Q4_0, F_Q4_1, F_Q5_0, F_Q5_1, F_IQ4_NL };
enum { S_VLLM, S_HEAD, S_UNIT };
enum { D_FP32, D_FP16, D_BF16 };
enum { R_AUTO, R_OFF, R_LLAMA };
enum { Q8_REF, Q8_RNE };

static const char *const format_names[] = {"fp8_e4m3", "fp8_e5m2", "fp8_token_head", "q8_0",
                                           "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", NULL};
static const char *const scale_names[] = {"vllm", "head", "unit", NULL};
static const char *const dtype_names[] = {"fp32", "fp16", "bf16", NULL};
static const char *const rot_names[] = {"auto", "off", "llama", NULL};
static const char *const q8_names[] = {"ref", "rne", NULL};

struct engine_opts {
    struct fk_common_opts c;     /* n_b, a_len (coef is not used) */
    int format, fp8_scale, dtype, rot, q8_0_round;
};

static const struct fk_option engine_options[] = {
    {"n_b", FK_OPT_INT, offsetof(struct engine_opts, c.n_b), 0, 0, 1 << 24, NULL,
     "exact window of the most recent tokens (0: every token quantised, as the engines)"},
    {"a_len", FK_OPT_INT, offsetof(struct engine_opts, c.a_len), 1, 1, 1 << 16, NULL,
     "tokens compressed per eviction event"},
    {"coef", FK_OPT_ENUM, offsetof(struct engine_opts, c.coef), FK_COEF_FP8, 0, 2,
     fk_coef_names, "not used (the format decides the storage)"},
    {"format", FK_OPT_ENUM, offsetof(struct engine_opts, format), F_E4M3, 0, 8, format_names,
     "the engine's cache format: vLLM fp8_e4m3 | fp8_e5m2 | fp8_token_head, llama.cpp "
     "q8_0 | q4_0 | q4_1 | q5_0 | q5_1 | iq4_nl"},
    {"fp8_scale", FK_OPT_ENUM, offsetof(struct engine_opts, fp8_scale), S_VLLM, 0, 2,
     scale_names, "fp8_e4m3/e5m2 scale: vllm (first batch max/200 keys, /100 values, per "
     "layer) | head (first batch max/448 per KV head) | unit (1)"},
    {"dtype", FK_OPT_ENUM, offsetof(struct engine_opts, dtype), D_FP32, 0, 2, dtype_names,
     "fp8 formats: the model dtype the cache is read back in (vLLM rounds to it)"},
    {"rot", FK_OPT_ENUM, offsetof(struct engine_opts, rot), R_AUTO, 0, 2, rot_names,
     "llama.cpp formats: Hadamard rotation of K and V: auto (llama.cpp: when head_dim % 64 "
     "== 0) | off | llama (required)"},
    {"q8_0_round", FK_OPT_ENUM, offsetof(struct engine_opts, q8_0_round), Q8_REF, 0, 1,
     q8_names, "q8_0: ref (ggml's reference, ties away from zero) | rne (its x86 AVX path)"},
    {NULL, 0, 0, 0, 0, 0, NULL, NULL},
};

static int is_ggml(int f)
{
    return f >= F_Q8_0;
}

static enum fk_ggml_type ggml_type(int f)
{
    static const enum fk_ggml_type t[] = {FK_GGML_Q8_0, FK_GGML_Q4_0, FK_GGML_Q4_1,
                                          FK_GGML_Q5_0, FK_GGML_Q5_1, FK_GGML_IQ4_NL};
    return t[f - F_Q8_0];
}

/* Stored bytes of one row of m values. */
static double row_bytes(const struct engine_opts *o, int m)
{
    if (is_ggml(o->format))
        return (double)(m / FK_GGML_QK) * (double)fk_ggml_block_bytes(ggml_type(o->format));
    return o->format == F_TOKEN_HEAD ? m + 4.0 : (double)m;
}

/* The rotation block of kind (0 keys, 1 values) for head_dim m: 0 = none. */
static int rot_block(const struct engine_opts *o, int kind, int m)
{
    if (!is_ggml(o->format) || o->rot == R_OFF || m % 64 != 0)
        return 0;
    if (kind == 1)
        return 64;
    int b = 64;
    while (m % (2 * b) == 0)
        b *= 2;
    return b;
}

static int engine_check(const void *opts, int head_dim, int n_atoms)
{
    (void)n_atoms;
    const struct engine_opts *o = opts;
    if (head_dim > 0 && is_ggml(o->format) && head_dim % FK_GGML_QK)
        return fk_err(FK_ECONFIG, "format %s: llama.cpp's blocks of 32 values need head_dim "
                      "a multiple of 32 (head_dim %d)", format_names[o->format], head_dim);
    if (head_dim > 0 && is_ggml(o->format) && o->rot == R_LLAMA && head_dim % 64)
        return fk_err(FK_ECONFIG, "rot = llama: llama.cpp rotates only when head_dim %% 64 "
                      "== 0 (head_dim %d; rot = auto leaves it off)", head_dim);
    return FK_OK;
}

struct engine {
    struct engine_opts o;
    struct fkr_rows r;           /* the rows as read back */
    int m, n_heads, kind, rot;
    float *scale;                /* [n_heads] fp8_e4m3/e5m2 scale (set at the first event) */
    int scaled;                  /* the scales are set */
    float *work;                 /* [m] */
    uint8_t blk[64];
    uint64_t saturated;
};

static void engine_close(void *state)
{
    struct engine *e = state;
    if (!e)
        return;
    fkr_free(&e->r);
    free(e->scale);
    free(e->work);
    free(e);
}

static int engine_open(const void *opts, const struct fk_stream_env *env, void **state)
{
    struct engine *e = calloc(1, sizeof *e);
    if (!e)
        return fk_err(FK_ENOMEM, "out of memory");
    *state = e; /* closed by the caller on failure too */
    memcpy(&e->o, opts, sizeof e->o);
    e->m = env->head_dim;
    e->n_heads = env->n_heads;
    e->kind = env->kind;
    FK_TRY(engine_check(opts, e->m, 0));
    e->rot = rot_block(&e->o, e->kind, e->m);
    FK_TRY(fkr_init(&e->r, env, "engine"));
    e->scale = malloc(sizeof(float) * ((size_t)e->n_heads + 1));
    e->work = malloc(sizeof(float) * ((size_t)e->m + FK_GGML_QK));
    if (!e->scale || !e->work)
        return fk_err(FK_ENOMEM, "out of memory (engine state)");
    for (int h = 0; h < e->n_heads; h++)
        e->scale[h] = 1.0f;
    return FK_OK;
}

/* The fp8_e4m3/e5m2 scales from the first event: one per layer (vllm) or per head. */
static void set_scales(struct engine *e, const struct fk_event *ev)
{
    e->scaled = 1;
    if (e->o.fp8_scale == S_UNIT)
        return;
    float amax[4096 + 1] = {0}, all = 0.0f;
    int H = e->n_heads < 4096 ? e->n_heads : 4096;
    for (int i = 0; i < ev->n; i++) {
        const float *x = ev->x + (size_t)i * e->m;
        for (int j = 0; j < e->m; j++) {
            float a = fabsf(x[j]);
            if (ev->head[i] < H && a > amax[ev->head[i]])
                amax[ev->head[i]] = a;
            all = a > all ? a : all;
        }
    }
    for (int h = 0; h < e->n_heads; h++) {
        float a = e->o.fp8_scale == S_HEAD ? (h < H ? amax[h] : all) : all;
        float div = e->o.fp8_scale == S_HEAD ? 448.0f : e->kind == 0 ? 200.0f : 100.0f;
        e->scale[h] = a > 0.0f ? a / div : 1.0f;
    }
}

/* The model dtype's rounding of a value read back (vLLM: fp16 or bf16, to nearest even). */
static float to_dtype(int dtype, float v)
{
    if (dtype == D_FP16)
        return fk_fp16_decode(fk_fp16_encode(v));
    if (dtype == D_BF16 && isfinite(v)) {
        uint32_t u;
        memcpy(&u, &v, sizeof u);
        u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
        memcpy(&v, &u, sizeof v);
    }
    return v;
}

/* Row x of head h into its read-back value y (m values). */
static void code_row(struct engine *e, int h, const float *x, float *y)
{
    int m = e->m, f = e->o.format;
    if (is_ggml(f)) {
        memcpy(y, x, sizeof(float) * (size_t)m);
        for (int b = 0; e->rot && b < m; b += e->rot)
            fk_hadamard(y + b, e->rot);
        for (int b = 0; b < m; b += FK_GGML_QK) {
            fk_ggml_quantize(ggml_type(f), y + b, e->blk, e->o.q8_0_round == Q8_RNE);
            fk_ggml_dequantize(ggml_type(f), e->blk, y + b);
        }
        for (int b = 0; e->rot && b < m; b += e->rot)
            fk_hadamard(y + b, e->rot);
        return;
    }
    if (f == F_TOKEN_HEAD) {
        float amax = 0.0f;
        for (int j = 0; j < m; j++)
            amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
        float s = amax / 448.0f;
        s = s > 1e-6f ? s : 1e-6f;
        float inv = 1.0f / s;
        for (int j = 0; j < m; j++) {
            float v = x[j] * inv;
            v = v > 448.0f ? 448.0f : v < -448.0f ? -448.0f : v;
            y[j] = fk_fp8_decode(fk_fp8_encode(v, &e->saturated)) * s;
        }
        return;
    }
    float s = e->scale[h];
    for (int j = 0; j < m; j++) {
        float v = x[j] / s, d;
        if (f == F_E5M2) {
            uint8_t c = fk_e5m2_encode(v);
            e->saturated += fabsf(v) >= 61440.0f; /* past the rounding to 57344 */
            d = fk_e5m2_decode(c);
        } else {
            d = fk_fp8_decode(fk_fp8_encode(v, &e->saturated));
        }
        y[j] = to_dtype(e->o.dtype, d * s);
    }
}

static int engine_encode(void *state, const struct fk_event *ev, struct fk_vec_out *out)
{
    struct engine *e = state;
    FK_TRY(fkr_check(&e->r, "engine", ev, 1));
    if (!e->scaled)
        set_scales(e, ev);
    float rb = (float)row_bytes(&e->o, e->m);
    for (int i = 0; i < ev->n; i++) {
        int h = ev->head[i], t = ev->token[i];
        const float *x = ev->x + (size_t)i * e->m;
        code_row(e, h, x, fkr_slot(&e->r, h, t));
        fkr_done(&e->r, h, t, x, rb, &out[i]);
    }
    return FK_OK;
}

static int engine_reconstruct(const void *state, int head, int token, float *out)
{
    const struct engine *e = state;
    return fkr_reconstruct(&e->r, "engine", head, token, out);
}

static void engine_stats(const void *state, struct fk_stream_stats *st)
{
    const struct engine *e = state;
    memset(st, 0, sizeof *st);
    st->bytes_codes = fkr_rows_stored(&e->r) * row_bytes(&e->o, e->m);
    st->saturated = e->saturated;
    int f = e->o.format;
    if ((f == F_E4M3 || f == F_E5M2) && e->o.fp8_scale != S_UNIT) /* model constants */
        st->bytes_model = 4.0 * (e->o.fp8_scale == S_HEAD ? e->n_heads : 1);
}

const struct fk_codec_ops fk_codec_engine = {
    .name = "engine",
    .summary = "the serving engines' KV formats: vLLM fp8 (e4m3, e5m2, per token-head), "
               "llama.cpp q8_0 q4_0 q4_1 q5_0 q5_1 iq4_nl with its Hadamard rotation",
    .opts_size = sizeof(struct engine_opts),
    .options = engine_options,
    .caps = FK_CAP_SKIPS,
    .check = engine_check,
    .open = engine_open,
    .encode = engine_encode,
    .reconstruct = engine_reconstruct,
    .stats = engine_stats,
    .close = engine_close,
};
