/* SPDX-License-Identifier: MIT
 * The codec interface: one const ops struct per codec, with an option table the harness
 * checks config values against before a codec starts.
 *
 * A codec keeps one state per (sequence, layer, kind) stream group, shared by the KV heads
 * of that layer (they share the dictionary). The replay engine drives it through eviction
 * events (spec algorithms.md section 4): encode() receives every vector evicted together,
 * ordered by (token, head), and must commit them all. Stored rows are addressed by
 * (head, token): tokens are evicted in order, so the compressed tokens of a head are always
 * 0 .. n_compressed-1.
 *
 * Adding a codec = one .c file in a family folder with one exported
 * `const struct fk_codec_ops` + one line in codec_list of codecs/meson.build.
 *
 * This header is the plugin interface, installed for plugins (meson install): what a codec
 * is given and gives, and the few functions of the executable a codec may call. The
 * registry and what built-in codecs get beyond it are in core/fk_registry.h.
 */
#ifndef FK_CODEC_H
#define FK_CODEC_H

#include <stddef.h>
#include <stdint.h>

enum fk_opt_type { FK_OPT_INT, FK_OPT_DOUBLE, FK_OPT_BOOL, FK_OPT_ENUM };

/* One option of a codec. INT, BOOL and ENUM options are stored as int, DOUBLE as double,
 * at `offset` in the codec's options struct. Ranges are inclusive. */
struct fk_option {
    const char *name;            /* TOML key and CSV column, [a-z0-9_] */
    enum fk_opt_type type;
    size_t offset;               /* offsetof(options struct, field) */
    double def, min, max;        /* default and inclusive range (ENUM: index of choices) */
    const char *const *choices;  /* ENUM only: NULL-terminated names */
    const char *help;            /* one line, with units */
};

/* Options every codec has (first member of every options struct): the replay engine reads
 * them to drive the full-precision buffer and the eviction chunk, unless the codec gives
 * its own buffer rule (fk_codec_ops.buffer). */
struct fk_common_opts {
    int n_b;                     /* full-precision recent-token buffer, tokens */
    int a_len;                   /* tokens evicted per eviction event */
    int coef;                    /* coefficient storage: enum fk_coef */
};

enum fk_coef { FK_COEF_FP32 = 0, FK_COEF_FP16 = 1, FK_COEF_FP8 = 2 };

/* How a stream's full-precision buffer hands tokens to the codec: the eviction schedule
 * (harness/engine/fk_schedule.h walks it). A token is "compressed" once it has been handed
 * over; attention reads compressed rows through reconstruct() and every other row exactly.
 *   SLIDE      the n_b most recent tokens stay exact; the prefill hands over tokens
 *              0 .. P-n_b-1, and decode step t (after its attention) hands over the oldest
 *              a_len buffered tokens once n_b or more were buffered before t. Lexico's
 *              buffer; KIVI's value window is SLIDE with n_b = R, a_len = 1.
 *   BLOCK      tokens are handed over in whole blocks of n_b consecutive tokens: the prefill
 *              hands over floor(P / n_b) * n_b tokens, decode step t (after its attention)
 *              the block ending at t once it is full (t itself included). KIVI's keys: 0 ..
 *              R-1 recent keys exact, never one key at a time.
 *   BLOCK_ALL  BLOCK, except that the prefill hands over all P tokens (Hugging Face's
 *              QuantizedCache: no exact residual after the prefill).
 * n_b >= 1 in the BLOCK modes; a_len is read by SLIDE only. */
enum fk_buf_mode { FK_BUF_SLIDE = 0, FK_BUF_BLOCK = 1, FK_BUF_BLOCK_ALL = 2 };
struct fk_buffer {
    int mode;                    /* enum fk_buf_mode */
    int n_b;                     /* SLIDE: tokens kept exact; BLOCK*: block length */
    int a_len;                   /* SLIDE: tokens handed over per event */
};
extern const char *const fk_coef_names[]; /* {"fp32", "fp16", "fp8", NULL} */

/* Entries of the option table for struct fk_common_opts `c` at the start of `type`. */
#define FK_COMMON_OPTIONS(type)                                                           \
    {"n_b", FK_OPT_INT, offsetof(type, c.n_b), 128, 0, 1 << 24, NULL,                    \
     "full-precision buffer of the most recent tokens (tokens)"},                         \
    {"a_len", FK_OPT_INT, offsetof(type, c.a_len), 1, 1, 1 << 16, NULL,                  \
     "tokens compressed per eviction event"},                                            \
    {"coef", FK_OPT_ENUM, offsetof(type, c.coef), FK_COEF_FP8, 0, 2, fk_coef_names,      \
     "coefficient storage: fp32 | fp16 | fp8 (E4M3FN)"}

/* A dictionary codec without FK_CAP_GRAM may keep a Gram of its own dictionary (N x N
 * floats per stream) up to this N: the harness's memory estimate counts it (the GM coder's
 * pool OMP, dict/fk_dict_engine.h). */
#define FK_OWN_GRAM_MAX 1024

enum fk_cap {
    FK_CAP_DICT = 1u << 0,    /* needs a dictionary file */
    FK_CAP_GRAM = 1u << 1,    /* wants the base Gram matrix D^T D */
    FK_CAP_SPARSE = 1u << 2,  /* stored rows are sparse codes over atoms (sparse_row works) */
    FK_CAP_GROWS = 1u << 3,   /* the dictionary can grow */
    FK_CAP_ADAPTS = 1u << 4,  /* the dictionary changes during decoding */
    FK_CAP_STATIC = 1u << 5,  /* a vector's code never depends on earlier events: the engine
                               * may encode decode tokens in large blocks before their
                               * eviction step (results then differ from event-by-event
                               * encoding only by BLAS rounding of the block size) */
    FK_CAP_EXACT = 1u << 6,   /* reconstruct() returns every stored row bit-exactly (err 0) */
    FK_CAP_GRID = 1u << 7,    /* rows rounded to a per-row grid of 2^bits levels (option
                               * `bits`) from min to max, origin and step in fp16 */
    FK_CAP_BASIS = 1u << 8,   /* needs a basis file (dataset key `basis`): rows are coded on
                               * a projection basis per head group (struct fk_basis); a row's
                               * nnz is its share of the group's stored coefficients */
    FK_CAP_EXTERNAL = 1u << 9, /* stores rows another program computed: the dataset names a
                                * directory of reconstruction files (`reconstructions`), one
                                * trace-shaped file per trace, and env->external holds this
                                * (layer, kind)'s rows */
    FK_CAP_SKIPS = 1u << 10,  /* accepts events that skip tokens of a head: composed with an
                               * eviction policy, a token the policy dropped before its turn
                               * is never coded (the codec stores, and adapts from, only what
                               * the policy keeps); a head's rows still come in increasing
                               * token order, and reconstruct() and sparse_row() are never
                               * asked for a dropped token. Rows are skipped as they come due:
                               * declare it only for a codec coded at its turn (not
                               * FK_CAP_STATIC, whose rows are coded ahead of the policy).
                               * Without it every row is coded, dropped or not, and a codec
                               * that grows or adapts cannot be composed with a policy */
    FK_CAP_CALIB = 1u << 11,  /* needs a calibration file (dataset key `calibration`, a file
                               * of `fadkv-bench train-calib`): env->calib holds this (layer,
                               * kind)'s quantiser constants (struct fk_calib) */
};

/* What an option is to the harness beyond its value (fk_codec_ops.roles): the recall
 * diagnostics, the cost reference, the paper's figures and the conformance suite find a
 * codec's options by role, never by name. */
enum fk_opt_role {
    FK_ROLE_SPARSITY = 1,     /* INT: atoms (coefficients) per stored code, the paper's s:
                               * recall's OMP sparsity, the cost reference's key (cells of
                               * the cost baseline with the same value), Fig. 3d's y */
    FK_ROLE_POOL,             /* INT: the screened pool's size, the paper's n: the screening
                               * diagnostics' n (256 for a codec without one) */
    FK_ROLE_COHERENCE,        /* adaptation's coherence threshold (tau_c): Fig. 3c's x */
    FK_ROLE_DELTA_K,          /* adaptation's error threshold of keys: Fig. 3c's y */
    FK_ROLE_DELTA_V,          /* ... and of values */
    FK_ROLE_GROUP,            /* INT: a quantiser's group length along the head dimension */
    FK_ROLE_WINDOW,           /* INT: tokens the codec's own buffer rule keeps exact */
    FK_ROLE_INDEX_BYTES,      /* INT: bytes per stored atom index */
    FK_ROLE_CALIB_FRACTION,   /* DOUBLE: the outlier fraction whose calibration the codec
                               * reads (FK_CAP_CALIB): the harness refuses a cell whose
                               * calibration file holds no such fraction, before any cell */
};
struct fk_role {
    int role;                 /* enum fk_opt_role */
    const char *option;       /* the name of the codec's option that has it */
};

/* What a codec needs from the data under given options, beyond its capability flags
 * (fk_codec_ops.needs): the harness refuses a cell whose data lack it before any cell. */
enum fk_need {
    FK_NEED_ROPE = 1u << 0,   /* the traces' RoPE (rope_layout, ...; env.rope) with
                               * post-RoPE keys, and with FK_CAP_BASIS the basis's pre-RoPE
                               * keys (struct fk_basis.pre_rope) */
};
/* Codec classes, by declaration (the conformance suite picks its checks from them):
 * exact (FK_CAP_EXACT), lossy dense (neither EXACT nor SPARSE; FK_CAP_GRID for a per-row
 * uniform quantiser), sparse over a dictionary (SPARSE | DICT), sparse over the codec's own
 * atoms (SPARSE without DICT). Every codec stores every row it is given. */

/* A shared, read-only base dictionary for one (layer, kind). */
struct fk_base_dict {
    int n_atoms;                 /* N */
    int m;                       /* head_dim */
    const float *atoms;          /* [N][m] unit norm, dead atoms zero */
    const uint8_t *dead;         /* [N] 1 = dead (norm < 1e-12 at load) */
    const float *gram;           /* [N][N] or NULL when the codec did not ask for it */
};

/* A shared, read-only projection basis of one (layer, kind), trained on calibration traces
 * (datasets/BASIS.md). The KV heads are taken in groups of `group` consecutive heads; the
 * vector of a group at one token is its heads' rows concatenated (dim = group * head_dim).
 * For each group: the mean of the calibration vectors and the eigenvectors of their
 * covariance (centered, about the mean) and of their second moment (uncentered), rows
 * orthonormal, in descending eigenvalue order. */
enum fk_basis_center { FK_BASIS_CENTERED = 0, FK_BASIS_UNCENTERED = 1 };
struct fk_basis {
    int group;                   /* g: KV heads per group (divides the stream's n_heads) */
    int n_groups;                /* n_heads / g */
    int dim;                     /* g * head_dim */
    int n_comp;                  /* k: components kept per group (<= dim) */
    const float *mean;           /* [n_groups][dim] */
    const float *vec[2];         /* [enum fk_basis_center][n_groups][n_comp][dim] */
    const double *eig[2];        /* [enum fk_basis_center][n_groups][n_comp] */
    const struct fk_basis *pre_rope; /* keys: the same for the un-rotated (pre-RoPE) keys,
                                  * or NULL when the basis has none; values: NULL */
};

/* KVQuant's calibration of one (layer, kind) at one outlier fraction f, from calibration
 * traces (datasets/CALIB.md; spec families-quant-2026.md 4.2): keys pre-RoPE. t = 1 - f/2;
 * a key channel's thresholds are the (1 - t) and t quantiles of its calibration values
 * (f = 0: min and max), rounded to fp16; the LUTs are k-means levels (2^bits, ascending) of
 * the normalised calibration values u = (x - (upper + lower)/2) / ((upper - lower)/2) with
 * |u| <= 1, the first `sinks` tokens of every trace left out. Values are normalised per
 * calibration token over a row of all KV heads (FK_KVQ_ROW, KVQuant's) or of one head
 * (FK_KVQ_HEAD) by the row's own quantiles, one LUT set for each. */
enum { FK_KVQ_BITS_MIN = 2, FK_KVQ_BITS_MAX = 4 };
enum fk_kvq_group { FK_KVQ_ROW = 0, FK_KVQ_HEAD = 1 };
struct fk_kvq_cal {
    double outliers;             /* f, the calibrated outlier fraction (0: none) */
    const float *upper, *lower;  /* keys: [n_kv_heads][head_dim] channel thresholds (fp16
                                  * values); values: NULL */
    const float *lut[FK_KVQ_BITS_MAX - FK_KVQ_BITS_MIN + 1][2]; /* [bits - 2][enum
                                  * fk_kvq_group]: 2^bits ascending levels on [-1, 1]; keys:
                                  * group FK_KVQ_ROW only (the other NULL) */
};
/* The calibration constants of one (layer, kind) (FK_CAP_CALIB). */
struct fk_calib {
    int n_kv_heads, head_dim;
    int sinks;                   /* first tokens of each calibration trace the LUTs left out */
    int n_kvq;                   /* calibrated outlier fractions, ascending */
    const struct fk_kvq_cal *kvq; /* [n_kvq] */
};

struct fk_rope; /* kernels/fk_rope.h: a trace's RoPE parameters */

/* What the harness tells a codec when it opens a stream group. */
struct fk_stream_env {
    int layer;
    int kind;                    /* FK_KIND_K or FK_KIND_V */
    int head_dim;                /* m */
    int n_heads;                 /* KV heads sharing this state */
    int n_tokens;                /* T: upper bound of stored rows per head */
    const struct fk_base_dict *base; /* NULL unless FK_CAP_DICT */
    const struct fk_basis *basis; /* this (layer, kind)'s basis; NULL unless FK_CAP_BASIS */
    const struct fk_calib *calib; /* this (layer, kind)'s calibration; NULL unless FK_CAP_CALIB */
    const float *external;       /* [n_heads][n_tokens][head_dim] the reconstruction file's rows
                                  * of this (layer, kind), float32; NULL unless FK_CAP_EXTERNAL */
    const int32_t *positions;    /* [n_tokens] position ids of the trace's tokens, or NULL */
    const struct fk_rope *rope;  /* the trace's RoPE, NULL when the trace does not describe
                                  * it (no rope_layout) or its keys are not post-RoPE */
    int reference;               /* 1: the straightforward algorithms (naive OMP recomputing
                                  * D^T r, no Gram, one vector at a time): the benchmark's
                                  * reference mode; same supports in exact arithmetic */
};

/* One eviction event: all vectors evicted together, ordered by (token, head). */
struct fk_event {
    int phase;                   /* 0 prefill, 1 decode */
    int step;                    /* decode step index (0-based), -1 in prefill */
    int n;                       /* vectors */
    const float *x;              /* [n][m] */
    const int32_t *token;        /* [n] token index in the trace */
    const int32_t *head;         /* [n] KV head */
};

enum fk_vec_flag {
    FK_VEC_ZERO = 1u << 0,       /* zero vector: empty code, excluded from error means */
    FK_VEC_ADAPTED = 1u << 1,    /* coded on a newly appended or replaced atom */
    FK_VEC_PREMATURE = 1u << 2,  /* encoder stopped early (fewer than s atoms) */
};

/* Per-vector outcome of encode(). */
struct fk_vec_out {
    float err_enc;               /* relative error with unquantised coefficients, at encode */
    float err;                   /* relative error of the stored (dequantised) row */
    int32_t nnz;                 /* stored coefficients */
    float bytes;                 /* bytes this row occupies as stored (codes and its share of
                                  * per-group metadata), as stats() counts them in bytes_codes:
                                  * a static codec's rows, encoded ahead, sum to bytes_codes */
    uint32_t flags;              /* enum fk_vec_flag */
};

/* Counters and accounting of one stream group, read after any event. */
struct fk_stream_stats {
    int n_atoms;                 /* N_t, current atoms (N for codecs without growth) */
    int n_base;                  /* N of the base dictionary (0: no dictionary) */
    uint64_t appends, replacements, adapt_failed, growth_capped, collateral_reencodes;
    uint64_t saturated;          /* FP8 coefficients saturated to +-448 */
    uint64_t premature;          /* codes that stopped before s atoms */
    uint64_t guarded;            /* codes OMP's precision guard cut to a prefix of their
                                  * atoms (FK_CODE_GUARDED, kernels/fk_sparse.h) */
    uint64_t uses_total;         /* nonzeros committed (all codes ever stored) */
    uint64_t uses_adapted;       /* of which on adapted atoms */
    double macs;                 /* analytical cost model (spec 10.7), summed over vectors */
    double t_corr, t_code, t_adapt; /* thread CPU seconds: correlation GEMMs, greedy coding
                                  * (screening, OMP, refinement, quantisation), adaptation
                                  * (each event's, apportioned to its phases by their wall
                                  * time) */
    double bytes_codes;          /* stored codes (spec 10.6) */
    double bytes_dict_seq;       /* per-sequence dictionary state (spec 10.6) */
    double bytes_model;          /* model-level constants this stream group reads (its universal
                                  * dictionary, a projection basis), fp16 accounting: shared by
                                  * every sequence, never counted per token */
    const uint32_t *ref_count;   /* [n_atoms] stored codes referencing atom j, or NULL */
    const uint32_t *prefill_use; /* [n_atoms] uses by prefill codes, or NULL */
    const uint32_t *use_total;   /* [n_atoms] uses ever, or NULL */
    const uint8_t *is_adapted;   /* [n_atoms] or NULL */
    double bytes_uncounted;      /* per-sequence state the codec's options leave out of
                                  * bytes_codes and bytes_dict_seq (fadkv's mem_mode = paper
                                  * counts replaced atoms as free): 0 when every byte is
                                  * counted. Figures and tables say so for such cells */
};

struct fk_codec_ops {
    const char *name;            /* registry key, TOML `name`, CSV value */
    const char *summary;         /* one line for `fadkv-bench codecs` */
    size_t opts_size;            /* sizeof(options struct); starts with fk_common_opts */
    const struct fk_option *options; /* {NULL}-terminated */
    unsigned caps;               /* enum fk_cap */

    /* (optional) The buffer rule of stream `kind` (FK_KIND_K 0, FK_KIND_V 1) under these
     * options. NULL: FK_BUF_SLIDE with the common options n_b and a_len, for both kinds. A
     * codec with this callback names its own options for what stays exact (its table need
     * not list n_b and a_len; the engine reads only what this returns). */
    void (*buffer)(const void *opts, int kind, struct fk_buffer *b);
    /* (optional) Cross-option checks after every value is in range (e.g. s <= n). Sets an
     * fk_err message naming the options. n_atoms: the dictionary's N (FK_CAP_DICT) or the
     * basis's components per group (FK_CAP_BASIS), 0 when not known yet; head_dim = 0 when
     * not known yet. */
    int (*check)(const void *opts, int head_dim, int n_atoms);
    /* (optional) enum fk_need bits under these options (NULL: none). */
    unsigned (*needs)(const void *opts);
    int (*open)(const void *opts, const struct fk_stream_env *env, void **state);
    /* Encodes and commits every vector of ev; out[i] describes vector i. */
    int (*encode)(void *state, const struct fk_event *ev, struct fk_vec_out *out);
    /* Reconstruction of a stored row with the current dictionary. */
    int (*reconstruct)(const void *state, int head, int token, float *out);
    /* (optional, FK_CAP_SPARSE) The stored code of a row: nnz, atom ids, dequantised
     * coefficients (pointers valid until the next encode). */
    int (*sparse_row)(const void *state, int head, int token, int *nnz, const int32_t **idx,
                      const float **coef);
    /* (optional, FK_CAP_SPARSE) The current atoms [n_atoms][m], contiguous (valid until
     * the next encode). */
    const float *(*atoms)(const void *state, int *n_atoms);
    void (*stats)(const void *state, struct fk_stream_stats *st);
    /* (optional) The cost model's estimate of the multiply-adds to code one vector of
     * head_dim m with these options over n_atoms atoms (0: no dictionary), before any run:
     * the sweep's estimate for progress and --dry-run. NULL: m (a copy). */
    double (*estimate_macs)(const void *opts, int m, int n_atoms);
    void (*close)(void *state); /* accepts NULL and half-opened states */
    /* (optional) The roles of its options, {0, NULL}-terminated (NULL: none). */
    const struct fk_role *roles;
    /* (optional) Fills the options whose default depends on the data, before check: the
     * sweep calls it with the dataset's head_dim and dictionary N when it knows them (0: not
     * known; leave such an option as it is, and decide it at open). The screening codecs'
     * pool n = 0 becomes N / 16 (at least s), the paper's ratio. */
    void (*resolve)(void *opts, int head_dim, int n_atoms);
};

/* ---- plugins ----------------------------------------------------------------------------
 * A plugin is a shared library of codecs built against this header (and common/fk_err.h),
 * loaded with `--plugin FILE.so` or `plugins = ["FILE.so"]` in a sweep's [sweep] table. It
 * exports one function, fk_plugin_abi(), returning its description:
 *
 *     static const struct fk_codec_ops *const codecs[] = {&my_codec, NULL};
 *     static const struct fk_plugin plugin = {FK_PLUGIN_ABI_VERSION, FK_PLUGIN_SIZES,
 *                                             "plugin", codecs};
 *     const struct fk_plugin *fk_plugin_abi(void) { return &plugin; }
 *
 * The harness refuses a plugin built for another ABI version or against structs of other
 * sizes (another fk_codec.h), and a codec whose name is taken. The functions this header
 * declares (fk_opts_*, fk_codec_option, fk_coef_names, fk_err) are the executable's: a
 * plugin links against nothing of fadkv-bench. FK_PLUGIN_ABI_VERSION changes with any
 * change of the structs of this header (4, 7 December 2026: struct fk_stream_env lost the
 * rows ahead, now internal to the built-in codecs, core/fk_registry.h; 5, the same day:
 * struct fk_codec_ops gained the roles of its options and resolve; 6, the same day: struct
 * fk_stream_stats gained bytes_uncounted; 7, 8 December 2026: struct fk_stream_env gained
 * calib). */
#define FK_PLUGIN_ABI_VERSION 7
#define FK_PLUGIN_ENTRY "fk_plugin_abi"
struct fk_plugin {
    int abi_version;             /* FK_PLUGIN_ABI_VERSION the plugin was built with */
    unsigned sizes[4];           /* FK_PLUGIN_SIZES the plugin was built with */
    const char *family;          /* family column and figure style of its codecs; NULL or ""
                                  * = "plugin" */
    const struct fk_codec_ops *const *codecs; /* NULL-terminated */
};
#define FK_PLUGIN_SIZES                                                                   \
    {(unsigned)sizeof(struct fk_codec_ops), (unsigned)sizeof(struct fk_stream_env),        \
     (unsigned)sizeof(struct fk_vec_out), (unsigned)sizeof(struct fk_stream_stats)}
const struct fk_plugin *fk_plugin_abi(void); /* what a plugin defines */

/* The option of a codec named `name`, or NULL. */
const struct fk_option *fk_codec_option(const struct fk_codec_ops *ops, const char *name);
/* The option of a codec with role `role` (enum fk_opt_role), or NULL. */
const struct fk_option *fk_codec_role(const struct fk_codec_ops *ops, int role);

/* Option values: defaults, set (range-checked, message names the option and the range),
 * get as double, and canonical text ("8", "0.5", "fp8"). */
void fk_opts_defaults(const struct fk_codec_ops *ops, void *opts);
int fk_opts_set(const struct fk_codec_ops *ops, void *opts, const struct fk_option *o,
                double value);
int fk_opts_set_enum(const struct fk_codec_ops *ops, void *opts, const struct fk_option *o,
                     const char *choice);
double fk_opts_get(const void *opts, const struct fk_option *o);
void fk_opts_format(const void *opts, const struct fk_option *o, char *buf, size_t cap);

#endif
