/* SPDX-License-Identifier: MIT
 * Synthetic KV-cache traces: a generative model of the keys, values and queries of one
 * decoded sequence with the structure real caches show (post-RoPE keys, outlier channels,
 * low-rank heads, an attention sink, peaked attention, decode drift). The model and every
 * knob are documented in datasets/SYNTH.md.
 *
 * Two seeds: model_seed fixes the synthetic "model" (latent bases, means, outlier channels,
 * sink directions of every layer and head), shared by all sequences; seed and the sequence
 * index fix the content of one sequence. Calibration data = same model_seed, another seed or
 * sequence index. Every random stream is a gsl_rng_mt19937 seeded from a SHA-256 of
 * (purpose, seed, sequence, layer, head, kind), so output does not depend on generation
 * order or threads. Generation is one layer at a time (memory bounded by one layer).
 */
#ifndef FK_SYNTH_H
#define FK_SYNTH_H

#include <stddef.h>
#include <stdint.h>

#include "formats/fk_trace.h"

struct fk_synth_profile;

struct fk_synth_opts {
    /* shape */
    int n_layers;            /* L */
    int n_q_heads;           /* H_q (multiple of n_kv_heads) */
    int n_kv_heads;          /* H_kv */
    int head_dim;            /* d (even when rope is on) */
    int prefill;             /* P: prefill tokens (>= 1; token 0 is the sink) */
    int decode;              /* D: decode tokens; T = P + D */
    /* seeds and output */
    uint64_t seed;           /* content seed (with the sequence index) */
    uint64_t model_seed;     /* synthetic-model seed: bases, means, outliers, sinks */
    enum fk_encoding encoding; /* on-disk element type */
    int queries;             /* 1: write queries and query_token_idx */
    int query_stride;        /* one query row every query_stride tokens */
    int prefill_queries;     /* 1: also the queries of the prefill tokens before the first
                              * query row (eviction policies read them), from a stream of
                              * their own: the other rows stay those of 0 */
    /* RoPE */
    int rope;                /* 1: keys and queries post-RoPE; 0: pre-RoPE (for tests) */
    double rope_theta;       /* base theta; pair i turns by pos * theta^(-2i/d) rad */
    int rope_half;           /* pair layout: 0 (2i, 2i+1) interleaved, 1 (i, i+d/2) */
    /* keys */
    int key_rank;            /* r_K: latent rank per (layer, head) */
    double key_decay;        /* latent std of direction j ~ (j+1)^-key_decay */
    double key_noise;        /* isotropic noise std per channel (signal rms = 1) */
    double key_mean;         /* norm of the per-head key mean, in units of sqrt(d) */
    double key_freq_tilt;    /* energy tilt to low-frequency RoPE pairs (0 = none) */
    int key_outlier_pairs;   /* outlier RoPE pairs per head (channels = 2x) */
    double key_outlier_scale;  /* outlier channel magnitude (signal channel rms = 1) */
    double key_outlier_jitter; /* relative per-token std of the outlier magnitude */
    /* values */
    int value_rank;          /* r_V */
    double value_decay;      /* latent std of direction j ~ (j+1)^-value_decay */
    double value_noise;      /* isotropic noise std per channel */
    double value_mean;       /* norm of the per-head value mean, in units of sqrt(d) */
    /* shared */
    double coef_dof;         /* Student-t degrees of freedom of coefficients (0 = Gaussian) */
    double seq_jitter;       /* log-normal std of per-sequence latent weights */
    double drift_rate;       /* rad per decode step the latent basis turns */
    /* attention sink */
    double sink_key_scale;   /* extra key norm of token 0, in typical key norms */
    double sink_value_scale; /* value of token 0 scaled by this */
    double sink_mass;        /* median attention mass on token 0 the queries are tuned to */
    /* queries */
    double attn_logit_std;   /* std of q.k/sqrt(d) over visible non-sink tokens */
    double query_target_mix; /* weight of the target key's latent in the query, [0, 1] */
    double query_recent_frac;  /* share of targets drawn from the recent window */
    int query_recent_window; /* tokens in the recent window */
    double query_noise;      /* query noise std relative to its signal rms */
    /* per-layer knobs fitted to real traces (synth --profile, gen/fk_synth_fit.h); NULL (the
     * default) = the knobs above for every layer */
    const struct fk_synth_profile *profile;
};

/* Kind of a knob in the table. */
enum fk_synth_knob_type { FK_SYNTH_INT = 0, FK_SYNTH_DOUBLE = 1, FK_SYNTH_U64 = 2 };

/* One entry of the knob table: the CLI parses, the writer records, SYNTH.md documents. */
struct fk_synth_knob {
    const char *name;        /* "key_rank"; CLI flag --key-rank */
    enum fk_synth_knob_type type;
    size_t offset;           /* offsetof(struct fk_synth_opts, field) */
    double def;              /* default (Llama-3.2-3B shape) */
    double min, max;         /* accepted range, inclusive */
    const char *help;        /* one line */
};

/* The knob table (every numeric field of fk_synth_opts) and its length. */
const struct fk_synth_knob *fk_synth_knobs(int *count);

/* Fills the defaults: Llama-3.2-3B shape, 512 + 1024 tokens, float16, all knobs. */
void fk_synth_defaults(struct fk_synth_opts *o);
/* Sets the shape (layers, heads, head_dim, rope_theta) of a named model:
 * "llama-3.2-3b", "llama-3.1-8b", "qwen3-4b". FK_EINVAL naming the choices otherwise. */
int fk_synth_set_shape(struct fk_synth_opts *o, const char *name);
/* Sets one knob from text ("key_rank" or "key-rank"), range-checked. */
int fk_synth_set(struct fk_synth_opts *o, const char *name, const char *value);
/* Parses "float32" | "float16" | "bfloat16". */
int fk_synth_parse_encoding(const char *s, enum fk_encoding *out);
/* Checks ranges and consistency (GQA divisibility, ranks <= d, even d with RoPE, ...). */
int fk_synth_validate(const struct fk_synth_opts *o);

/* Name of the shape: a table name if layers/heads/dim/theta match one, else
 * "custom-L<L>-q<Hq>-kv<Hkv>-d<d>". */
void fk_synth_shape_name(const struct fk_synth_opts *o, char *buf, size_t cap);
/* File name synth-<shape>-s<seed>-<seq>.h5 (no directory). */
void fk_synth_file_name(const struct fk_synth_opts *o, int seq_index, char *buf, size_t cap);
/* The trace metadata of a generated sequence. */
void fk_synth_info(const struct fk_synth_opts *o, struct fk_trace_info *info);
/* Query rows per head (0 when queries are off). Rows are decode tokens P, P+stride, ...;
 * with no decode tokens, prefill tokens 1, 1+stride, ... */
int fk_synth_n_queries(const struct fk_synth_opts *o);

/* Generates one layer of sequence seq_index in memory. keys, values: [H_kv][T][d];
 * queries: [H_q][Tq][d] and qidx [Tq] (both may be NULL to skip queries). The result
 * depends only on (o, seq_index, layer). */
int fk_synth_layer(const struct fk_synth_opts *o, int seq_index, int layer, float *keys,
                   float *values, float *queries, int32_t *qidx);

/* Writes one trace file (via path.tmp, renamed at the end). Root string attributes record
 * every knob ("synth.<knob>"), the seeds, the sequence index, shape and encoding. */
int fk_synth_write(const struct fk_synth_opts *o, const char *path, int seq_index);


#endif
