/* SPDX-License-Identifier: MIT
 * Trace format v1 (HDF5): reader and writer. The contract is documented in
 * datasets/README.md. One file per decoded sequence.
 *
 * The reader validates everything it is asked to trust (schema, version, shapes across
 * layers, GQA divisibility, token arrays, finiteness of every value it returns) and
 * reports failures with the file, the dataset and what was expected. 16-bit encodings
 * (float16, bfloat16 stored as raw uint16) are converted by our own bulk routines.
 * The reader streams: one (layer, kind) array at a time.
 */
#ifndef FK_TRACE_H
#define FK_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/fk_rope.h"

enum fk_kind { FK_KIND_K = 0, FK_KIND_V = 1, FK_KIND_Q = 2 };
enum fk_encoding { FK_ENC_F32 = 0, FK_ENC_F16 = 1, FK_ENC_BF16 = 2 };

#define FK_TRACE_SCHEMA "fadkv-trace"
#define FK_TRACE_VERSION 1
#define FK_NAME_CAP 256

struct fk_trace_info {
    char model_id[FK_NAME_CAP];
    char source[64];        /* "synthetic" | "llama2c" | "hf" | other */
    int n_layers;
    int n_q_heads;
    int n_kv_heads;
    int head_dim;
    int n_tokens;           /* T: rows of keys/values per head */
    int prompt_len;         /* P: prefill tokens (phase 0) */
    int keys_post_rope;     /* 0/1 */
    double rope_theta;
    int has_rope;           /* 1: the root attributes rope_layout (and rope_type, ...) describe
                             * the RoPE of the keys and queries: rope is valid */
    struct fk_rope rope;    /* theta = rope_theta, layout, type, llama3 numbers */
    int has_queries;        /* 1 when every layer has queries and query_token_idx */
    int n_queries;          /* Tq: query rows per head (same for every layer) */
};

struct fk_trace;

/* Opens and validates a trace (metadata, token arrays, dataset shapes of every layer).
 * Values are checked for finiteness when read. */
int fk_trace_open(const char *path, struct fk_trace **out);
void fk_trace_close(struct fk_trace **t);

const struct fk_trace_info *fk_trace_get_info(const struct fk_trace *t);
const char *fk_trace_path(const struct fk_trace *t);
const int32_t *fk_trace_positions(const struct fk_trace *t); /* [T] */
const uint8_t *fk_trace_phase(const struct fk_trace *t);     /* [T], 0 prefill, 1 decode */
const int32_t *fk_trace_ids(const struct fk_trace *t);       /* [T] or NULL if absent */

/* Reads keys or values [H_kv, T, d] or queries [H_q, Tq, d] of one layer as float32 into
 * dst (caller-owned, large enough). Refuses non-finite values, naming layer, head, token. */
int fk_trace_read(struct fk_trace *t, int layer, enum fk_kind kind, float *dst);
/* Encoding of one layer's keys, values or queries as stored in the file. */
int fk_trace_encoding(struct fk_trace *t, int layer, enum fk_kind kind, enum fk_encoding *enc);
/* Reads keys or values [H_kv, T, d] of one layer as stored: float32 values, or the 16-bit
 * words of a float16 / bfloat16 dataset unconverted (2 bytes per value; fk_trace_encoding
 * tells which), so that a 16-bit trace takes half the memory. Same checks as fk_trace_read. */
int fk_trace_read_stored(struct fk_trace *t, int layer, enum fk_kind kind, void *dst);
/* Reads the query rows rows[0..n_rows-1] (strictly increasing, each in [0, Tq)) of one layer
 * as a float32 [H_q, n_rows, d] array into dst: attention at a stride needs only those, and
 * memory then does not grow with the number of queries. Same checks as fk_trace_read. */
int fk_trace_read_query_rows(struct fk_trace *t, int layer, const int32_t *rows, int n_rows,
                             float *dst);
/* Reads query_token_idx [Tq] of one layer (each entry in [0, T)). */
int fk_trace_read_query_idx(struct fk_trace *t, int layer, int32_t *dst);
/* What fk_trace_verify found: every non-finite value counted, the first FK_VERIFY_MAX
 * issues described (dataset, layer, head, token or query row, channel; or the error of a
 * dataset that cannot be read, such as a wrong encoding). */
#define FK_VERIFY_MAX 64
struct fk_trace_verify {
    int datasets;                /* keys, values and queries datasets read */
    long n_nonfinite;            /* non-finite values in all */
    int n_unreadable;            /* datasets that could not be read */
    int n_issues;                /* described below */
    char issue[FK_VERIFY_MAX][320];
};
/* Reads every keys, values and queries dataset of every layer and describes what is wrong
 * instead of stopping at the first problem (`fadkv-bench info --verify`). FK_ENOMEM only. */
int fk_trace_verify(struct fk_trace *t, struct fk_trace_verify *vf);
/* Layer `layer`'s attention as the model computed it, from the attributes of its group
 * (dump_hf.py writes them): 1 / `scaling` into *inv_scale, `softcap`, `sliding_window`;
 * each 0 when absent or "none" (then: q.k / sqrt(head_dim), no cap, every key visible). */
int fk_trace_layer_attention(struct fk_trace *t, int layer, double *inv_scale,
                             double *softcap, int *window);
/* Value of a root string attribute, or NULL (pointer valid until close). */
const char *fk_trace_attr(struct fk_trace *t, const char *name);

/* Writer. Data goes to "<path>.tmp" and is renamed to path by fk_trace_finish, so a
 * crashed writer never leaves a file that looks complete. */
struct fk_trace_writer;
int fk_trace_create(const char *path, const struct fk_trace_info *info, enum fk_encoding enc,
                    struct fk_trace_writer **out);
int fk_trace_put_attr(struct fk_trace_writer *w, const char *name, const char *value);
int fk_trace_write_tokens(struct fk_trace_writer *w, const int32_t *positions,
                          const uint8_t *phase, const int32_t *ids /* nullable */);
/* data: [H, rows, d] float32, H = n_kv_heads for K/V (rows = T), n_q_heads for Q (rows = Tq);
 * qidx: [Tq] for Q, NULL otherwise. */
int fk_trace_write_layer(struct fk_trace_writer *w, int layer, enum fk_kind kind,
                         const float *data, const int32_t *qidx);
int fk_trace_finish(struct fk_trace_writer **w);
void fk_trace_abort(struct fk_trace_writer **w);

/* Bulk 16-bit conversions (exact, round-to-nearest-even on the way down). */
void fk_f16_to_f32(const uint16_t *src, float *dst, size_t n);
/* Whether fk_f16_to_f32 may use the x86 F16C instruction (allow = 1, the default; it quiets
 * a signalling NaN, otherwise the bits are the same) or the portable code only (0; for
 * tests). Returns 1 if this CPU has F16C. Process-wide. */
int fk_f16_accel(int allow);
void fk_f32_to_f16(const float *src, uint16_t *dst, size_t n);
void fk_bf16_to_f32(const uint16_t *src, float *dst, size_t n);
void fk_f32_to_bf16(const float *src, uint16_t *dst, size_t n);

/* Bytes per value of an array stored with encoding enc. */
static inline size_t fk_enc_size(enum fk_encoding enc)
{
    return enc == FK_ENC_F32 ? 4 : 2;
}

/* Row `row` (d values) of an array kept as stored (fk_trace_read_stored) as float32: a
 * pointer into base for float32 data, else buf (d floats) filled by exact conversion. */
static inline const float *fk_stored_row(const void *base, enum fk_encoding enc, size_t row,
                                         int d, float *buf)
{
    if (enc == FK_ENC_F32)
        return (const float *)base + row * (size_t)d;
    const uint16_t *w = (const uint16_t *)base + row * (size_t)d;
    if (enc == FK_ENC_F16)
        fk_f16_to_f32(w, buf, (size_t)d);
    else
        fk_bf16_to_f32(w, buf, (size_t)d);
    return buf;
}

/* Silences HDF5's automatic error printing (call once at start). */
void fk_hdf5_quiet(void);

#endif
