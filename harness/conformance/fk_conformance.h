/* SPDX-License-Identifier: MIT
 * The codec conformance suite: the rules every codec of core/fk_codec.h keeps, checked on
 * any struct fk_codec_ops (a built-in codec or a plugin's), by `fadkv-bench conformance`
 * and by the unit suite tests/test_codecs.c (one implementation).
 *
 * A codec is driven as the replay engine drives it: options from its table, ops->check,
 * ops->open over a seeded random unit dictionary (FK_CAP_DICT, with its Gram for
 * FK_CAP_GRAM), a seeded random basis (FK_CAP_BASIS) or reconstruction rows (FK_CAP_EXTERNAL:
 * the stream's vectors halved), events ordered (token, head) from its eviction schedule.
 * What each rule checks is in fk_conf_rules[]; a failure names the rule, the row (head,
 * token), what was expected and what the codec gave.
 */
#ifndef FK_CONFORMANCE_H
#define FK_CONFORMANCE_H

#include <gsl/gsl_rng.h>
#include <stdint.h>

#include "core/fk_codec.h"
#include "engine/fk_schedule.h"

struct fk_test_basis;

/* ---- the fixtures (the unit suites drive codecs through them too) ---------------------- */

/* A seeded random dictionary of N unit atoms spanning the first m - hold coordinates. */
struct fk_conf_dict {
    int N, m;                    /* atoms, head_dim */
    int hold;                    /* trailing coordinates no atom spans (room for novelty) */
    float *atoms;                /* [N][m] unit norm */
    uint8_t *dead;               /* [N] all zero */
    float *gram;                 /* [N][N] from fk_gram_build, or NULL */
    struct fk_base_dict with;    /* base with the Gram (FK_CAP_GRAM codecs) */
    struct fk_base_dict without; /* base without it */
};

/* A stream of T tokens of H heads, the first P of them the prefill (one event). */
struct fk_conf_stream {
    int m, H;                    /* head_dim, KV heads */
    int P, T;                    /* prefill tokens, total tokens */
    float *x;                    /* [T][H][m] */
};

/* How a stream is generated. */
struct fk_conf_gen {
    int n_use;                   /* structured vectors combine atoms 0 .. n_use-1 */
    int k_gen;                   /* atoms per structured vector */
    double noise;                /* noise standard deviation per coordinate */
    double p_novel_prefill;      /* prefill: probability of a vector far from the dictionary */
    double p_novel;              /* decode: same */
    int n_dirs;                  /* novel vectors reuse n_dirs fixed directions (0: fresh) */
    int zero_every;              /* every zero_every-th vector is exactly zero (0: never) */
    int const_every;             /* every const_every-th vector is constant, of an fp16 value */
};

/* One codec state driven over a stream, with every vector's outcome. */
struct fk_conf_run {
    const struct fk_codec_ops *ops;
    void *st;                    /* codec state */
    struct fk_vec_out *out;      /* [T][H] outcome of every vector */
    float *err_commit;           /* [T][H] error of each row right after its event */
    int rule;                    /* the codec's buffer rule of this kind (enum fk_buf_mode) */
    int H, m;                    /* heads, head_dim */
    int n_tok;                   /* tokens committed (all heads) */
    int n_tok_prev;              /* tokens committed before the last event */
    int events;                  /* encode calls */
    float *ext;                  /* FK_CAP_EXTERNAL: the rows its env names (owned) */
    struct fk_test_basis *tb;    /* FK_CAP_BASIS: the basis its env names (owned) */
    float *ahead;                /* the rows ahead it was opened with (owned), or NULL */
};

/* Called before (after = 0) and after (after = 1) every event. */
typedef void (*fk_conf_hook)(void *ctx, struct fk_conf_run *r, const struct fk_event *ev,
                             int after);

/* A random direction of the given norm into u[m] (Gaussian coordinates, scaled). */
void fk_conf_random_dir(gsl_rng *r, int m, double norm, float *u);
/* ops->stats of a run's state; the dot product of two float vectors in double. */
struct fk_stream_stats fk_conf_stats(const struct fk_conf_run *r);
double fk_conf_dot(const float *a, const float *b, int m);

int fk_conf_dict_init(struct fk_conf_dict *d, int N, int m, int hold, int with_gram,
                      unsigned long seed);
void fk_conf_dict_free(struct fk_conf_dict *d);
int fk_conf_stream_init(struct fk_conf_stream *s, const struct fk_conf_dict *d, int H, int P,
                        int T, const struct fk_conf_gen *g, unsigned long seed);
/* What the engine adds to env for ops beyond the dictionary: a FK_CAP_BASIS codec's basis,
 * positions and RoPE; a FK_CAP_EXTERNAL codec's rows, src's vectors halved (exact in
 * float: every error is 1/2, a zero vector stays zero; zero rows when src does not have
 * env's shape, none when env is too large to be a real run). Owned by r. */
int fk_conf_env(struct fk_conf_run *r, const struct fk_codec_ops *ops,
                const struct fk_conf_stream *src, struct fk_stream_env *env);
/* ops->check, then ops->open on an env of H heads and T tokens over d (src: fk_conf_env). */
int fk_conf_run_open(struct fk_conf_run *r, const struct fk_codec_ops *ops, const void *opts,
                     const struct fk_conf_dict *d, const struct fk_conf_stream *src, int H,
                     int T, int kind);
/* One event of tokens t0 .. t1-1 (all heads): encode's result. */
int fk_conf_run_event(struct fk_conf_run *r, const struct fk_conf_stream *s, int t0, int t1,
                      int phase, int step, fk_conf_hook hook, void *ctx);
/* The events of a stream: a codec with a buffer rule (ops->buffer) gets the engine's
 * schedule; one without gets every token (the prefill whole, then one event per a_len
 * decode tokens), so that no row stays unchecked. */
struct fk_sched fk_conf_sched(const struct fk_codec_ops *ops, const void *opts, int kind,
                              const struct fk_conf_stream *s);
/* Open, then every event of fk_conf_sched (the message names the failed event). */
int fk_conf_run_stream(struct fk_conf_run *r, const struct fk_codec_ops *ops, const void *opts,
                       const struct fk_conf_dict *d, const struct fk_conf_stream *s, int kind,
                       fk_conf_hook hook, void *ctx);
/* fk_conf_run_stream with the codec opened with the rows of `ahead` known in advance, when
 * it takes them (core/fk_registry.h, fk_codec_takes_ahead; the stream's shape; normally s
 * itself, or a copy with rows that differ), or NULL: none. */
int fk_conf_run_stream_ahead(struct fk_conf_run *r, const struct fk_codec_ops *ops,
                             const void *opts, const struct fk_conf_dict *d,
                             const struct fk_conf_stream *s, const struct fk_conf_stream *ahead,
                             int kind, fk_conf_hook hook, void *ctx);
void fk_conf_run_close(struct fk_conf_run *r); /* accepts a closed or zeroed run */
/* The relative error of stored row (h, t) against x, recomputed from ops->reconstruct (xh:
 * head_dim floats of scratch, left holding the reconstruction). */
int fk_conf_row_err(const struct fk_conf_run *r, const float *x, int h, int t, float *xh,
                    double *err);

/* The outcome checks of rule "errors" on a finished run over s with options opts: FK_OK,
 * or FK_EINVAL with the first violation in fk_errmsg. */
int fk_conf_check_outcome(const struct fk_conf_run *r, const struct fk_conf_stream *s,
                          const void *opts);

/* ---- the suite ------------------------------------------------------------------------ */

struct fk_conf_rule {
    const char *name;            /* short name, e.g. "errors" */
    const char *what;            /* the rule, in one sentence */
};
extern const struct fk_conf_rule fk_conf_rules[]; /* {NULL}-terminated */

/* Called once per rule and codec: passed = 1, or 0 with the first violation found. */
typedef void (*fk_conf_report_fn)(void *ctx, const struct fk_codec_ops *ops,
                                  const struct fk_conf_rule *rule, int passed,
                                  const char *message);

struct fk_conf_result {
    int n_rules;                 /* rules run */
    int n_failed;                /* rules broken */
};

/* Runs every rule on ops, reporting each (report may be NULL). Returns FK_OK when the
 * suite ran (its verdict is in *res), or a negative code when it could not (out of memory;
 * fk_errmsg says why). Uses OpenBLAS at one thread and restores the thread count. */
int fk_conformance_run(const struct fk_codec_ops *ops, fk_conf_report_fn report, void *ctx,
                       struct fk_conf_result *res);

#endif
