/* SPDX-License-Identifier: MIT
 * The dictionary engine shared by the dictionary codecs (lexico, lexico-adp, gm, pl, fadkv;
 * spec algorithms.md sections 4-8, 10.6, 10.7). Internal to codecs/dict.
 *
 * A codec is a coder (struct dc_coder: how a block of vectors becomes sparse codes) plus an
 * adaptation (struct dc_adapt: what a badly coded decode vector changes in the dictionary,
 * or none). The engine owns everything else: the stream state (the shared read-only base
 * and the stream's own copy once it adapts, per-atom counters, Gram rows of appended atoms),
 * the stored codes, the eviction-event protocol, byte accounting and the ops callbacks.
 * Each codec file (fk_lexico.c, ...) declares its options, caps and ops by composing them.
 */
#ifndef FK_DICT_ENGINE_H
#define FK_DICT_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "core/fk_codec.h"
#include "core/fk_registry.h"
#include "kernels/fk_sparse.h"

#define DC_BLK 128          /* vectors per correlation SGEMM */
#define DC_OWN_GRAM_MAX FK_OWN_GRAM_MAX /* the GM coder's own Gram up to N 1024 (4 MiB):
                              * its rows beat passes over the pool's atoms there, not at
                              * N 4096, where each row is gathered from 64 MiB
                              * (PERFORMANCE.md) */
#define DC_IDX16_MAX 32767  /* atoms addressable by INT16 indices */

enum { APPEND_RAW, APPEND_RESIDUAL };
enum { TAUC_COUNT, TAUC_COHERENCE, TAUC_PERIOD };
enum { VICTIM_REFCOUNT, VICTIM_EMA };
enum { COLL_REENCODE, COLL_DROP };
enum { OMP_GRAM, OMP_NAIVE };
/* fadkv's accounting of its replacement state (mem_mode): strict (every codec's rule:
 * counted per sequence) or the paper's (replaced atoms free, reported as bytes_uncounted) */
enum { MEM_STRICT, MEM_PAPER };

/* Options of the coders. */
struct dc_code_opts {
    int s;                       /* sparsity */
    int n;                       /* screening pool size */
    double tol;                  /* relative error threshold of OMP, 0 = off */
    double lambda0, rho;         /* ridge: lambda_j = lambda0 + rho * G_jj */
    int refine_iters;            /* damped refinement iterations R */
    int omp_mode;                /* OMP_* */
    int inner;                   /* fadkv coder: 0 gm, 1 pl */
};

/* Options of the adaptations. */
struct dc_adapt_opts {
    double delta_k, delta_v;     /* adaptation thresholds on relative error */
    int adapt_prefill;           /* bool: adapt during prefill too */
    double ema_gamma;            /* EMA decay per decode step */
    int append_mode;             /* APPEND_* */
    int growth_cap;              /* max appended atoms, 0 = up to 32767 atoms in total */
    int tau_c;                   /* inactivity threshold (ref_count <= tau_c) */
    int tauc_mode;               /* TAUC_* reading of tau_c */
    double coh_max;              /* coherence reading: adapt only if max |d^T u| < coh_max */
    int victim;                  /* VICTIM_* */
    int collateral;              /* COLL_* for victims still referenced (tau_c > 0) */
    int mem_mode;                /* MEM_* accounting of fadkv's replaced slots */
};

/* The options struct of every dictionary codec (each uses the fields its table lists). */
struct dc_opts {
    struct fk_common_opts c;     /* n_b, a_len, coef */
    struct dc_code_opts code;
    struct dc_adapt_opts adapt;
    int ptr_bytes;               /* accounted bytes per row pointer: 2 (paper) or 4 (code) */
};

struct dc;

/* A coder: sparse codes of a block of vectors from their correlations with the atoms. */
struct dc_coder {
    /* (optional) Scratch floats it needs beyond the engine's (fk_omp_work_floats + 2 per
     * atom + 64); the engine takes the larger. */
    size_t (*work_floats)(int n_atoms, int m, int s);
    /* (optional) 1 when the options ask for Gram mode: the engine then requires the base
     * Gram matrix and serves Gram rows in the view (unless reference mode or an adaptation
     * that does not keep them). */
    int (*wants_gram)(const struct dc_code_opts *o);
    /* Largest N (0: none) at which the stream computes the Gram matrix of its own
     * dictionary, keeps it up to date as atoms are appended or rewritten, and serves its
     * rows in the view (not in reference mode): where it stays in cache, reading a Gram row
     * costs less than a pass over the atoms. */
    int own_gram_max;
    /* Codes nx vectors x [nx][m] with correlations a (= D^T x; row i at a + i lda, of
     * v->n_atoms) into out [nx], adding the cost model to d->st.macs. Uses d->work and
     * d->pool. */
    int (*encode)(struct dc *d, const struct fk_dict_view *v, int nx, const float *x,
                  const float *a, size_t lda, struct fk_code *out);
    /* Multiply-adds to code one vector over N atoms, estimated before any run. */
    double (*estimate)(const struct dc_code_opts *o, int m, int N);
};

/* An adaptation: what the engine does in phase C for a vector whose error exceeds delta. */
struct dc_adapt {
    int keeps_gram;              /* Gram rows stay valid (appended atoms get theirs) */
    int reads_activity;          /* the engine maintains the per-atom activity EMA */
    /* Atom limit of a stream at open (d->N, d->o, d->env set). */
    int (*cap)(const struct dc *d);
    /* (optional) Cross-option check, after the engine's, n_atoms = 0 when unknown. */
    int (*check)(const struct dc_opts *o, int n_atoms);
    /* Adapts the dictionary for x whose code c (pinned atoms) failed; rewrites c when it
     * codes x on the adapted atom and then sets FK_VEC_ADAPTED in *flags. step: decode
     * step (0 in prefill). */
    int (*adapt)(struct dc *d, const float *x, struct fk_code *c, int step, uint32_t *flags);
    /* Per-sequence dictionary state in bytes (spec 10.6). */
    double (*dict_bytes)(const struct dc *d);
};

extern const struct dc_coder dc_coder_omp, dc_coder_gm, dc_coder_pl;
extern const struct dc_adapt dc_adapt_append, dc_adapt_replace;

struct dc_rows {                 /* the stored codes of one KV head; row = token */
    int n;                       /* stored rows */
    int expect;                  /* next token while checking an event */
    int32_t *nnz;                /* [T] */
    int32_t *idx;                /* [T][stride] atom ids */
    float *coef;                 /* [T][stride] dequantised coefficients */
};

/* The state of one stream group. */
struct dc {
    const struct dc_coder *coder;
    const struct dc_adapt *adapt; /* NULL: static dictionary */
    struct dc_opts o;
    struct fk_stream_env env;
    const struct fk_base_dict *base;
    int use_gram;                /* the view serves Gram rows (dc_gram_row) */
    const float *gram;           /* [N][N] the base atoms' Gram: base->gram or gram_own */
    float *gram_own;             /* [N][N] the stream's own (dc_coder.own_gram_max), or NULL */
    int m, N, Nt;                /* head_dim, base atoms, current atoms */
    int cap;                     /* atom limit (N + growth) */
    int acap;                    /* atoms the per-atom arrays hold now (N <= acap <= cap) */
    int stride;                  /* coefficient slots per row: s + 1 */
    double delta;                /* threshold of this kind */
    float *atoms;                /* [acap][m] owned copy, or NULL while base is used */
    uint8_t *dead;               /* [acap] */
    float **ga;                  /* [Nt - N] Gram rows of appended atoms, N + ga_cols floats
                                  * each (rows are allocated one by one and never copied as a
                                  * block: a doubling block held two copies at its peak) */
    int ga_cols, ga_slots;       /* appended-atom columns of each row; pointer slots */
    float *gb;                   /* [N][ga_cols] the appended atoms' entries of base rows
                                  * (gb[j][a] = ga[a][j]), the tails of base Gram rows,
                                  * gathered when a row is read (gb_fill[j] of them so far) */
    int32_t *gb_fill;            /* [N] */
    int gb_ld;                   /* row stride of gb (ga_cols when it was allocated) */
    uint32_t *ref_count, *prefill_use, *use_total; /* [acap] */
    int32_t *last_use;           /* [acap] decode step of the last use (replace only) */
    double *ema;                 /* [acap] activity, lazily decayed (replace only) */
    uint8_t *is_adapted;         /* [acap] */
    int32_t *pinned;             /* [acap] event id that pinned the atom */
    int event_id;
    int last_adapt_step;         /* for tauc_mode = period */
    int replaced_slots;          /* base slots replaced at least once (fadkv) */
    struct dc_rows *heads;       /* [n_heads] */
    /* correlations ahead (fk_dict_engine.c, "Correlations ahead") */
    const float *ahead;          /* the rows of later events [n_heads][n_tokens][m] while the
                                  * lookahead is on, else NULL */
    float *acorr;                /* [n_heads * ah_tok][ah_ld] the window's correlations */
    float *arows;                /* [n_heads * ah_tok][m] the window's rows, head-major */
    int ah_tok, ah_t0, ah_n;     /* tokens per window; first token held; tokens held */
    int ah_nt, ah_cols;          /* atoms when the window was computed; acorr's row room */
    size_t ah_ld;                /* acorr's row stride (ah_cols when it was computed) */
    uint8_t *stale;              /* [N] base slot rewritten since the window was computed */
    int32_t *stale_ids;          /* [N] those slots, n_stale of them */
    int n_stale;
    float *ah_scratch;           /* the rewritten slots' atoms and products */
    size_t ah_scratch_n;
    long ah_served;              /* blocks whose correlations came from a window */
    /* scratch */
    float *corr;                 /* [DC_BLK][acap] correlations */
    float *work;                 /* OMP/topn work */
    size_t work_floats;
    int32_t *pool;               /* [FK_REFINE_LANES][acap] the GM coder's screening pools */
    float *xbuf;                 /* [m] */
    float *rbuf;                 /* [m] */
    struct fk_code *codes;       /* [codes_cap] codes of the current event */
    int codes_cap;
    uint8_t *needs;              /* [codes_cap] needs adaptation */
    /* statistics */
    struct fk_stream_stats st;
    uint64_t nnz_total, rows_total;
};

/* ---- for coders and adaptations ---- */

/* The current atoms [Nt][m]: the stream's copy, or the base while it has none. */
const float *dc_atoms(const struct dc *d);
/* The dictionary as the coders see it now (valid until the atoms change). */
struct fk_dict_view dc_view(struct dc *d);
/* Copy-on-write of the base dictionary before the first change. */
int dc_own_atoms(struct dc *d);
/* Records that base slot j (< N) now holds another atom (fadkv's replacements). */
void dc_slot_rewritten(struct dc *d, int j);
/* Appends unit atom u (Nt grows by one); maintains Gram rows in Gram mode. */
int dc_append_atom(struct dc *d, const float *u);
/* Codes x against the current atoms (its own correlation pass) into c. */
int dc_encode_fresh(struct dc *d, const float *x, struct fk_code *c);
/* Stores c as row `token` of `head`: a new row, or (rewrite) a replacement of a stored one;
 * fills out (nullable). */
void dc_commit(struct dc *d, int head, int token, const float *x, const struct fk_code *c,
               int phase, int step, struct fk_vec_out *out, uint32_t flags, int rewrite);

/* ---- the codec ops ---- */

/* Cross-option checks: screened = the codec codes in a Top-n pool (s <= n <= N). */
int dc_check(const struct dc_adapt *adapt, int screened, const void *opts, int head_dim,
             int n_atoms);
int dc_open(const struct dc_coder *coder, const struct dc_adapt *adapt, const void *opts,
            const struct fk_stream_env *env, void **state);
/* dc_open with the rows the events will hold, ahead [n_heads][n_tokens][m] (NULL: none):
 * their correlations are then computed in windows of DC_BLK rows ("Correlations ahead"). */
int dc_open_ahead(const struct dc_coder *coder, const struct dc_adapt *adapt, const void *opts,
                  const struct fk_stream_env *env, const float *ahead, void **state);
int dc_encode(void *state, const struct fk_event *ev, struct fk_vec_out *out);
int dc_reconstruct(const void *state, int head, int token, float *out);
int dc_sparse_row(const void *state, int head, int token, int *nnz, const int32_t **idx,
                  const float **coef);
const float *dc_atoms_op(const void *state, int *n_atoms);
void dc_stats(const void *state, struct fk_stream_stats *st);
void dc_close(void *state);

/* A codec composed of coder CODER and adaptation ADAPT (NULL: none): defines static
 * NAME_check and NAME_open. SCREENED: it codes in a Top-n pool (the checks s <= n <= N). */
#define DC_COMPOSE(NAME, CODER, ADAPT, SCREENED)                                          \
    static int NAME##_check(const void *opts, int head_dim, int n_atoms)                  \
    {                                                                                     \
        return dc_check(ADAPT, SCREENED, opts, head_dim, n_atoms);                        \
    }                                                                                     \
    static int NAME##_open(const void *opts, const struct fk_stream_env *env, void **state) \
    {                                                                                     \
        return dc_open(CODER, ADAPT, opts, env, state);                                   \
    }                                                                                     \
    static double NAME##_estimate(const void *opts, int m, int n_atoms)                   \
    {                                                                                     \
        return (CODER)->estimate(&((const struct dc_opts *)opts)->code, m, n_atoms);      \
    }

/* The built-in extension (core/fk_registry.h) of an adaptive codec NAME composed of CODER
 * and ADAPT: its open with the rows ahead. Defines fk_codec_ext_NAME, which codecs/meson.build
 * lists beside the codec. */
#define DC_EXT(NAME, CODER, ADAPT)                                                        \
    static int NAME##_open_ahead(const void *opts, const struct fk_stream_env *env,      \
                                 const float *ahead, void **state)                        \
    {                                                                                     \
        return dc_open_ahead(CODER, ADAPT, opts, env, ahead, state);                      \
    }                                                                                     \
    const struct fk_codec_ext fk_codec_ext_##NAME = {.open_ahead = NAME##_open_ahead}

/* The fk_codec_ops fields of codec NAME beyond name, summary, options and caps: its
 * NAME_check and NAME_open, and the engine's callbacks. */
/* The screening pool's default for sparsity s over N atoms: N / 16, at least s, at most N;
 * dc_resolve sets it where n = 0 (the option's default) and N is known. */
int dc_pool_default(int s, int n_atoms);
void dc_resolve(void *opts, int head_dim, int n_atoms);

/* The roles of the dictionary codecs' options (those a codec lacks are not found). */
extern const struct fk_role dc_roles[];

#define DC_OPS(NAME)                                                                      \
    .check = NAME##_check, .open = NAME##_open, .opts_size = sizeof(struct dc_opts),      \
    .encode = dc_encode, .reconstruct = dc_reconstruct, .sparse_row = dc_sparse_row,      \
    .atoms = dc_atoms_op, .stats = dc_stats, .close = dc_close,                           \
    .estimate_macs = NAME##_estimate, .roles = dc_roles, .resolve = dc_resolve

#endif
