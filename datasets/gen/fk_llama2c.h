/* SPDX-License-Identifier: MIT
 * Our own runner for llama2.c legacy checkpoints (format: data/models/README.md in the
 * shared data): checkpoint and tokenizer loading with exact validation, BPE encoding by
 * score, a float32 forward pass (OpenBLAS products, RoPE angles in double, GQA) that keeps
 * every post-RoPE key, value and query it computes, sampling, and trace export.
 *
 * Typical use: fk_llama2c_model_load -> fk_llama2c_tokenizer_load (with the model's vocab
 * size) -> fk_llama2c_run_create -> fk_llama2c_generate -> fk_llama2c_write_trace.
 */
#ifndef FK_LLAMA2C_H
#define FK_LLAMA2C_H

#include <stddef.h>
#include <stdint.h>

#include "formats/fk_trace.h"

#define FK_LLAMA2C_HEADER_BYTES 28 /* 7 little-endian int32 */

struct fk_llama2c_config {
    int dim;               /* model width */
    int hidden_dim;        /* SwiGLU hidden width */
    int n_layers;          /* transformer blocks */
    int n_heads;           /* query heads H_q */
    int n_kv_heads;        /* key/value heads H_kv (divides n_heads) */
    int vocab_size;        /* |header vocab_size| */
    int seq_len;           /* maximum positions (tokens fed) */
    int shared_classifier; /* 1 when the header vocab_size is positive (wcls = embedding) */
    int head_dim;          /* dim / n_heads */
    int kv_dim;            /* n_kv_heads * head_dim */
};

/* ---- checkpoint ---- */
struct fk_llama2c_model;

/* Loads and validates a checkpoint: header sanity, file size equal to 28 + 4 * floats
 * recomputed from the header (FK_ECORRUPT naming the file, expected and actual size),
 * finite weights. */
int fk_llama2c_model_load(const char *path, struct fk_llama2c_model **out);
void fk_llama2c_model_free(struct fk_llama2c_model **m);
const struct fk_llama2c_config *fk_llama2c_model_config(const struct fk_llama2c_model *m);
const char *fk_llama2c_model_path(const struct fk_llama2c_model *m);
/* The forward pass rotates by the checkpoint's freq_cis tables (any RoPE base or scaling
 * baked into them); 1 when they are the default theta 10000 tables to 1e-3, which it then
 * evaluates in double (bit-identical to a runner that ignores the tables). Traces of a
 * model with other tables carry no RoPE description (has_rope 0). */
int fk_llama2c_model_rope_default(const struct fk_llama2c_model *m);
/* Every float of the checkpoint after its header (*n of them): benchmarks read them. */
const float *fk_llama2c_model_floats(const struct fk_llama2c_model *m, size_t *n);

/* ---- tokenizer ---- */
struct fk_llama2c_tokenizer;

/* Loads a llama2.c tokenizer.bin; refuses one whose token count differs from vocab_size
 * (the model's) and one without a "\n<s>\n" (BOS) piece. */
int fk_llama2c_tokenizer_load(const char *path, int vocab_size,
                              struct fk_llama2c_tokenizer **out);
void fk_llama2c_tokenizer_free(struct fk_llama2c_tokenizer **t);
int fk_llama2c_tokenizer_bos(const struct fk_llama2c_tokenizer *t); /* id of "\n<s>\n" */
int fk_llama2c_tokenizer_eos(const struct fk_llama2c_tokenizer *t); /* "\n</s>\n", or -1 */
/* 1 when every byte value is its own one-byte piece (no dummy-prefix space then). */
int fk_llama2c_tokenizer_byte_level(const struct fk_llama2c_tokenizer *t);
int fk_llama2c_tokenizer_size(const struct fk_llama2c_tokenizer *t);

/* Encodes UTF-8 text: optional BOS; a dummy-prefix " " for non-byte-level vocabularies
 * when text is non-empty; one token per character (byte fallback through "<0xXX>" pieces
 * or raw one-byte pieces; FK_EINVAL when neither exists); then greedy merges of the
 * adjacent pair whose merged piece has the highest score (leftmost on ties).
 * *ids is malloc'd (caller frees), *n its length. */
int fk_llama2c_encode(const struct fk_llama2c_tokenizer *t, const char *text, int add_bos,
                      int32_t **ids, int *n);
/* Text of token id when it follows token prev: "<0xXX>" pieces give their byte, a leading
 * space after BOS is dropped (SentencePiece vocabularies). Pointer valid while t lives. */
int fk_llama2c_decode(const struct fk_llama2c_tokenizer *t, int prev, int id, const char **s,
                      size_t *len);

/* ---- forward pass ---- */
struct fk_llama2c_run;

/* Allocates the caches ([L, seq_len, kv_dim] keys and values, [L, seq_len, dim] queries)
 * and scratch for one sequence. The model must outlive the run. */
int fk_llama2c_run_create(const struct fk_llama2c_model *m, struct fk_llama2c_run **out);
void fk_llama2c_run_free(struct fk_llama2c_run **r);
/* Feeds token at position pos (0 <= pos <= tokens fed so far, pos < seq_len); positions
 * after pos are forgotten. Bit-identical results need a fixed OpenBLAS thread count
 * (threaded sgemv rounds some shapes differently per count); the trace CLI pins one.
 * *logits ([vocab], nullable) stays valid until the next call. */
int fk_llama2c_forward(struct fk_llama2c_run *r, int token, int pos, const float **logits);
/* Feeds tokens[0..n-1] at positions pos0..pos0+n-1 in one pass (each weight matrix read
 * once for the block): position pos0 + i attends, causally, to the cache rows 0..pos0 as
 * they are before the call and to the block's own rows up to itself, so the result equals n
 * calls of fk_llama2c_forward up to float rounding (sgemm instead of sgemv). logits
 * [n][vocab]; att_out [n][L][dim] and att_logit [n][L][n_heads][seq_len] (nullable) as the
 * taps of each position. Refused with a tap's pre_attention hook or keep masks set. */
int fk_llama2c_forward_block(struct fk_llama2c_run *r, const int32_t *tokens, int n, int pos0,
                             float *logits, float *att_out, float *att_logit);
const struct fk_llama2c_model *fk_llama2c_run_model(const struct fk_llama2c_run *r);
/* Number of positions fed (valid rows of the caches). */
int fk_llama2c_run_len(const struct fk_llama2c_run *r);
/* Copies one layer for the first n positions: keys/values as [H_kv, n, head_dim], queries
 * as [H_q, n, head_dim]; all post-RoPE. dst is caller-owned. */
int fk_llama2c_gather(const struct fk_llama2c_run *r, int layer, enum fk_kind kind, int n,
                      float *dst);

/* The cache row of one layer at position pos ([kv_dim], head h at h * head_dim), writable:
 * the closed loop (harness/loop) replaces a compressed token's exact row by the codec's
 * reconstruction, which every later forward's attention then reads. NULL when layer or pos
 * is out of range (pos < seq_len; rows at or after the tokens fed are scratch). */
float *fk_llama2c_kv_row(struct fk_llama2c_run *r, int layer, enum fk_kind kind, int pos);

/* Optional taps of a forward pass (each pointer may be NULL): att_out [L][dim] receives each
 * layer's attention output (the heads' softmax-weighted values, before wo), att_logit
 * [L][n_heads][seq_len] each query head's attention logits q.k / sqrt(head_dim) over
 * positions 0..pos (entries after pos untouched). tap NULL turns them off; the struct is
 * copied. */
struct fk_llama2c_tap {
    float *att_out;
    float *att_logit;
    /* (optional) Called at every layer once position pos's query, key and value are computed
     * (post-RoPE; key and value in the cache rows of pos) and before its attention; it may
     * edit cache rows and masks. A negative return stops the forward pass with that error. */
    int (*pre_attention)(void *ctx, int layer, int pos, const float *q);
    void *ctx;
    /* (optional) [n_layers] masks [n_kv_heads][keep_stride] bytes: the attention of a query
     * head reads only rows j <= pos with keep[layer][kv_head * keep_stride + j] = 1 (the
     * caller keeps at least one; att_logit still receives every row's logit). */
    uint8_t *const *keep;
    int keep_stride;
};
void fk_llama2c_set_tap(struct fk_llama2c_run *r, const struct fk_llama2c_tap *tap);

/* ---- sampling and generation ---- */
struct fk_llama2c_sampling {
    double temperature;    /* 0 = greedy (argmax, lowest id on ties) */
    double top_p;          /* nucleus mass in (0, 1]; 1 = plain temperature sampling */
    unsigned long seed;    /* seed of the gsl_rng_mt19937 stream */
    int ignore_eos;        /* 1: keep decoding after EOS; 0: stop once EOS is fed */
};

struct fk_llama2c_cand {
    float p; /* probability after temperature */
    int id;  /* token id */
};

/* Draws one id (return value >= 0) from logits [n] given a uniform u in [0, 1): greedy
 * when temperature is 0, else softmax(logits / temperature) restricted to the smallest
 * most-probable set of mass >= top_p. work: [n] scratch. Deterministic in its inputs. */
int fk_llama2c_sample(const float *logits, int n, double temperature, double top_p, double u,
                      struct fk_llama2c_cand *work);

struct fk_llama2c_gen {
    int32_t *ids;       /* [n_tokens] ids fed to the model: prompt (with BOS), then generated */
    int n_tokens;       /* T = prompt_len + generated tokens */
    int prompt_len;     /* P (includes BOS) */
    int stopped_at_eos; /* 1 when decoding stopped because EOS was generated */
    char *text;         /* decoded text of all tokens after BOS, NUL-terminated */
    size_t text_len;    /* bytes in text */
    float *logits;      /* [n_tokens, vocab] logits after each fed token, or NULL */
};

/* Encodes prompt (with BOS), refuses P > seq_len or P + steps > seq_len, feeds the prompt,
 * then generates steps tokens, each fed so that its key/value/query exist (the run then
 * holds T = P + steps positions unless EOS stopped it). keep_logits stores every logits
 * row. Release out with fk_llama2c_gen_free. */
int fk_llama2c_generate(struct fk_llama2c_run *r, const struct fk_llama2c_tokenizer *t,
                        const char *prompt, int steps, const struct fk_llama2c_sampling *s,
                        int keep_logits, struct fk_llama2c_gen *out);
void fk_llama2c_gen_free(struct fk_llama2c_gen *g);

/* ---- trace export ---- */
struct fk_llama2c_trace_meta {
    const char *model_id;         /* model folder or file stem */
    const char *model_sha256;     /* hex, nullable */
    const char *tokenizer_sha256; /* hex, nullable */
    const char *prompt;           /* prompt text */
    const struct fk_llama2c_sampling *sampling; /* settings used */
    const char *generator;        /* "fadkv-bench trace <version>" */
};

/* Writes the run's first g->n_tokens positions as a fadkv-trace file (source "llama2c",
 * post-RoPE keys, rope_theta 10000 unless the checkpoint's RoPE tables are other ones,
 * queries for every token). */
int fk_llama2c_write_trace(const struct fk_llama2c_run *r, const struct fk_llama2c_gen *g,
                           const char *path, enum fk_encoding enc,
                           const struct fk_llama2c_trace_meta *meta);

#endif
