/* SPDX-License-Identifier: MIT
 * The codec conformance suite (conformance/fk_conformance.h): each rule drives the codec
 * through the fixtures of fk_conf_fixture.c and recomputes what the codec reports
 * (errors from reconstruct(), codes from sparse_row(), bytes from the accounting model).
 * A rule stops at its first violation, which it words as rule, row (head, token), expected
 * and got; what a rule allocated is released whether it passed or not.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fk_err.h"
#include "conformance/fk_conformance.h"
#include "conformance/fk_test_basis.h"
#include "core/fk_registry.h"
#include "kernels/fk_blas.h"
#include "kernels/fk_sparse.h"

const struct fk_conf_rule fk_conf_rules[] = {
    {"interface", "the ops table names the codec, has every mandatory callback (open, encode, "
                  "reconstruct, stats, close; sparse_row and atoms for FK_CAP_SPARSE) and "
                  "declares only known, consistent capability bits"},
    {"options", "the option table: [a-z0-9_] names, one line of help, defaults inside their "
                "ranges and applied, fields inside the options struct, no two options on one "
                "field, the common options n_b, a_len, coef first (unless the codec gives its "
                "own buffer rule), out-of-range, non-integer, NaN and inf values refused with "
                "a message naming the option"},
    {"errors", "on a random stream (keys and values, 3 heads, 160 tokens) every vector's "
               "reported err equals the relative error of what reconstruct() returns for its "
               "row, zero vectors are flagged and cost no atoms, rows are finite, exact codecs "
               "store every row bit-exactly, sparse codes rebuild the reconstruction"},
    {"determinism", "two runs over the same stream (at 2 and at 1 BLAS threads, both as a "
                    "trace replay opens the codec: with the rows ahead for a built-in codec "
                    "that takes them) give the same outcomes, the same rows bit for bit and "
                    "the same counters"},
    {"accounting", "with each coefficient storage the codec offers, bytes_codes is zero before "
                   "any row, positive after, never drops without adaptation, and follows a "
                   "fixed cost per row (dense) or per row and per coefficient (sparse, at least "
                   "the value bytes and an index)"},
    {"class", "what the codec declares holds: a sparse code over orthonormal atoms is the best "
              "nnz-term code and err_enc its error; fp32 coefficients make err equal err_enc; "
              "a FK_CAP_GRID row lies on a grid of 2^bits levels within half a step"},
    {"check", "every option at either end of its range: check() refuses the point with a "
              "message naming an option, or the codec opens and encodes there with finite "
              "errors (a calibrated outlier fraction: the calibration's, 0 and 0.01)"},
    {"robustness", "close() accepts NULL and a state that stored nothing, encode() refuses "
                   "token 1 before token 0 with a message (a FK_CAP_SKIPS codec accepts it "
                   "and refuses token 1 again), and a dictionary codec refuses a "
                   "dictionary of another head_dim"},
    {NULL, NULL},
};

/* ---- a rule's context: its first violation and what it holds -------------------------- */

/* What a rule holds, released at its end whether it passed or not. */
enum { HOLD_MEM, HOLD_DICT, HOLD_STREAM, HOLD_RUN };
struct held {
    int kind;                    /* HOLD_* */
    void *p;
};
struct cx {
    jmp_buf jb;
    char msg[1024];
    int oom;                     /* the rule could not run: out of memory */
    struct held *held;
    int n_held, cap_held;
};

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3), noreturn))
#endif
static void fail(struct cx *cx, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cx->msg, sizeof cx->msg, fmt, ap);
    va_end(ap);
    longjmp(cx->jb, 1);
}

#define REQUIRE(cond, ...)                                                                 \
    do {                                                                                  \
        if (!(cond))                                                                      \
            fail(cx, __VA_ARGS__);                                                        \
    } while (0)
/* A call of the harness or of the codec that must succeed. */
#define REQ_OK(call, ...)                                                                 \
    do {                                                                                  \
        if ((call) != FK_OK) {                                                            \
            char req_what_[512];                                                          \
            snprintf(req_what_, sizeof req_what_, __VA_ARGS__);                           \
            fail(cx, "%s: %s", req_what_, fk_errmsg()[0] ? fk_errmsg() : "(no message)"); \
        }                                                                                 \
    } while (0)

static void release(struct held *h)
{
    if (h->kind == HOLD_RUN)
        fk_conf_run_close(h->p);
    else if (h->kind == HOLD_STREAM)
        free(((struct fk_conf_stream *)h->p)->x);
    else if (h->kind == HOLD_DICT)
        fk_conf_dict_free(h->p);
    free(h->p);
}

static void oom(struct cx *cx)
{
    cx->oom = 1;
    fail(cx, "the conformance suite ran out of memory");
}

/* n zeroed bytes, held as `kind` (released with the rule). */
static void *cx_hold(struct cx *cx, int kind, size_t n)
{
    if (cx->n_held == cx->cap_held) {
        int cap = cx->cap_held ? 2 * cx->cap_held : 64;
        struct held *h = realloc(cx->held, sizeof *h * (size_t)cap);
        if (!h)
            oom(cx);
        cx->held = h;
        cx->cap_held = cap;
    }
    void *p = n < ((size_t)1 << 40) ? calloc(1, n ? n : 1) : NULL;
    if (!p)
        oom(cx);
    cx->held[cx->n_held++] = (struct held){.kind = kind, .p = p};
    return p;
}

static void *cx_alloc(struct cx *cx, size_t n)
{
    return cx_hold(cx, HOLD_MEM, n);
}

static struct fk_conf_dict *cx_dict(struct cx *cx, int N, int m, int hold, int gram,
                                    unsigned long seed)
{
    struct fk_conf_dict *d = cx_hold(cx, HOLD_DICT, sizeof *d);
    if (fk_conf_dict_init(d, N, m, hold, gram, seed) < 0)
        oom(cx);
    return d;
}

static struct fk_conf_stream *cx_stream(struct cx *cx, const struct fk_conf_dict *d, int H,
                                        int P, int T, const struct fk_conf_gen *g,
                                        unsigned long seed)
{
    struct fk_conf_stream *s = cx_hold(cx, HOLD_STREAM, sizeof *s);
    if (fk_conf_stream_init(s, d, H, P, T, g, seed) < 0)
        oom(cx);
    return s;
}

static struct fk_conf_run *cx_run(struct cx *cx)
{
    return cx_hold(cx, HOLD_RUN, sizeof(struct fk_conf_run));
}

static void cx_release(struct cx *cx)
{
    for (int i = cx->n_held - 1; i >= 0; i--)
        release(&cx->held[i]);
    cx->n_held = 0;
}

/* A whole stream, every event; a failure names the event and the codec's message. */
static struct fk_conf_run *run_stream(struct cx *cx, const struct fk_codec_ops *ops,
                                      const void *opts, const struct fk_conf_dict *d,
                                      const struct fk_conf_stream *s, int kind,
                                      fk_conf_hook hook, void *ctx)
{
    struct fk_conf_run *r = cx_run(cx);
    REQ_OK(fk_conf_run_stream(r, ops, opts, d, s, kind, hook, ctx), "the %s stream",
           kind ? "value" : "key");
    return r;
}

static double row_err(struct cx *cx, const struct fk_conf_run *r, const float *x, int h, int t,
                      float *xh)
{
    double e = 0;
    REQ_OK(fk_conf_row_err(r, x, h, t, xh, &e), "row (head %d, token %d)", h, t);
    return e;
}

#define stats_of fk_conf_stats
#define dot_fd fk_conf_dot

/* ---- options -------------------------------------------------------------------------- */

static void *opts_new(struct cx *cx, const struct fk_codec_ops *ops)
{
    void *o = cx_alloc(cx, ops->opts_size);
    fk_opts_defaults(ops, o);
    return o;
}

/* Sets the option with role `role` (enum fk_opt_role); returns 0 when the codec has none. */
static int opt_try(struct cx *cx, const struct fk_codec_ops *ops, void *o, int role, double v)
{
    const struct fk_option *opt = fk_codec_role(ops, role);
    if (!opt)
        return 0;
    REQ_OK(fk_opts_set(ops, o, opt, v), "setting option %s = %g", opt->name, v);
    return 1;
}

/* Defaults with the sizes of the small streams: sparse codes of 4 atoms in a pool of 24,
 * group quantisers' groups that divide head_dim 24, an exact window shorter than the
 * stream. */
static void *opts_small(struct cx *cx, const struct fk_codec_ops *ops)
{
    void *o = opts_new(cx, ops);
    opt_try(cx, ops, o, FK_ROLE_SPARSITY, 4);
    opt_try(cx, ops, o, FK_ROLE_POOL, 24);
    opt_try(cx, ops, o, FK_ROLE_GROUP, 8);
    opt_try(cx, ops, o, FK_ROLE_WINDOW, 16);
    return o;
}

static int is_name(const char *s)
{
    if (!s || !*s)
        return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '_'))
            return 0;
    return 1;
}

static void rule_interface(struct cx *cx, const struct fk_codec_ops *ops)
{
    const char *cn = ops->name ? ops->name : "(unnamed)";
    REQUIRE(ops->name && (is_name(ops->name) || strchr(ops->name, '-')),
            "the codec's name '%s' is not made of [a-z0-9_-]", cn);
    REQUIRE(ops->summary && *ops->summary, "no summary line (fadkv-bench codecs shows it)");
    REQUIRE(ops->open && ops->encode && ops->reconstruct && ops->stats && ops->close,
            "a mandatory callback is NULL (open %s, encode %s, reconstruct %s, stats %s, "
            "close %s)", ops->open ? "set" : "NULL", ops->encode ? "set" : "NULL",
            ops->reconstruct ? "set" : "NULL", ops->stats ? "set" : "NULL",
            ops->close ? "set" : "NULL");
    unsigned caps = ops->caps;
    REQUIRE(!(caps & FK_CAP_SPARSE) || (ops->sparse_row && ops->atoms),
            "FK_CAP_SPARSE declared, but sparse_row or atoms is NULL");
    unsigned known = FK_CAP_DICT | FK_CAP_GRAM | FK_CAP_SPARSE | FK_CAP_GROWS |
                     FK_CAP_ADAPTS | FK_CAP_STATIC | FK_CAP_EXACT | FK_CAP_GRID | FK_CAP_BASIS |
                     FK_CAP_EXTERNAL | FK_CAP_SKIPS | FK_CAP_CALIB;
    REQUIRE(!(caps & ~known), "unknown capability bits 0x%x", caps & ~known);
    REQUIRE(!(caps & FK_CAP_GRAM) || (caps & FK_CAP_DICT), "FK_CAP_GRAM (the base "
            "dictionary's Gram) without FK_CAP_DICT");
    REQUIRE(!(caps & FK_CAP_GROWS) || (caps & FK_CAP_SPARSE), "FK_CAP_GROWS without "
            "atoms (FK_CAP_SPARSE)");
    REQUIRE(!(caps & FK_CAP_EXACT) || !(caps & (FK_CAP_GRID | FK_CAP_ADAPTS)),
            "FK_CAP_EXACT with a lossy declaration");
    REQUIRE(ops->options != NULL, "the option table is NULL (it must end with {NULL})");
    if (caps & FK_CAP_GRID)
        REQUIRE(!(caps & FK_CAP_SPARSE) && fk_codec_option(ops, "bits"), "FK_CAP_GRID needs a "
                "dense codec with a `bits` option");
    REQUIRE(ops->opts_size >= sizeof(struct fk_common_opts), "opts_size %zu is smaller than "
            "struct fk_common_opts (%zu bytes), which every options struct starts with",
            ops->opts_size, sizeof(struct fk_common_opts));
}

static void lint_option(struct cx *cx, const struct fk_codec_ops *ops,
                        const struct fk_option *o, void *buf)
{
    REQUIRE(is_name(o->name), "option name '%s' is not [a-z0-9_]+", o->name);
    REQUIRE(o->help && *o->help, "option %s has no help line", o->name);
    REQUIRE(o->min <= o->def && o->def <= o->max, "option %s: default %g outside its range "
            "[%g, %g]", o->name, o->def, o->min, o->max);
    size_t sz = o->type == FK_OPT_DOUBLE ? sizeof(double) : sizeof(int);
    REQUIRE(o->offset + sz <= ops->opts_size, "option %s: offset %zu lies outside the options "
            "struct (opts_size %zu)", o->name, o->offset, ops->opts_size);
    if (o->type != FK_OPT_DOUBLE)
        REQUIRE(o->def == floor(o->def) && o->min == floor(o->min) &&
                    o->max == floor(o->max) && o->max <= 2147483647.0,
                "option %s: an integer option with non-integer bounds", o->name);
    if (o->type == FK_OPT_BOOL)
        REQUIRE(o->min == 0 && o->max == 1, "option %s: BOOL range is not [0, 1]", o->name);
    if (o->type == FK_OPT_ENUM) {
        REQUIRE(o->choices != NULL, "option %s: ENUM without choices", o->name);
        int n = 0;
        while (o->choices[n]) {
            REQUIRE(is_name(o->choices[n]) || strchr(o->choices[n], '-'),
                    "option %s: choice '%s' is not a name", o->name, o->choices[n]);
            for (int k = 0; k < n; k++)
                REQUIRE(strcmp(o->choices[k], o->choices[n]), "option %s: choice %s twice",
                        o->name, o->choices[n]);
            n++;
        }
        REQUIRE(o->min == 0 && o->max == n - 1, "option %s: range [%g, %g] but %d choices",
                o->name, o->min, o->max, n);
        for (int k = 0; k < n; k++) {
            REQ_OK(fk_opts_set_enum(ops, buf, o, o->choices[k]), "option %s = %s", o->name,
                   o->choices[k]);
            REQUIRE((int)fk_opts_get(buf, o) == k, "option %s = %s reads back as %g", o->name,
                    o->choices[k], fk_opts_get(buf, o));
            char txt[64];
            fk_opts_format(buf, o, txt, sizeof txt);
            REQUIRE(!strcmp(txt, o->choices[k]), "option %s = %s prints as %s", o->name,
                    o->choices[k], txt);
        }
        fk_err_clear();
        REQUIRE(fk_opts_set_enum(ops, buf, o, "no-such-choice") == FK_ECONFIG,
                "option %s accepted the choice no-such-choice", o->name);
        REQUIRE(strstr(fk_errmsg(), o->name) != NULL, "option %s: the message '%s' does not "
                "name the option", o->name, fk_errmsg());
        REQUIRE((int)fk_opts_get(buf, o) == n - 1, "option %s: a refused choice changed the "
                "value", o->name);
    }
    /* range checks: accepted ends, rejected outside, non-integers, NaN and inf */
    REQ_OK(fk_opts_set(ops, buf, o, o->min), "option %s = its minimum %g", o->name, o->min);
    REQ_OK(fk_opts_set(ops, buf, o, o->max), "option %s = its maximum %g", o->name, o->max);
    REQUIRE(fk_opts_get(buf, o) == o->max, "option %s = %g reads back as %g", o->name, o->max,
            fk_opts_get(buf, o));
    REQ_OK(fk_opts_set(ops, buf, o, o->def), "option %s = its default %g", o->name, o->def);
    double span = o->max - o->min;
    double below = o->min - (span > 0 ? span * 1e-3 : 1);
    double above = o->max + (span > 0 ? span * 1e-3 : 1);
    if (o->type != FK_OPT_DOUBLE) {
        below = o->min - 1;
        above = o->max + 1;
    }
    fk_err_clear();
    REQUIRE(fk_opts_set(ops, buf, o, below) == FK_ECONFIG, "option %s accepted %g, below its "
            "minimum %g", o->name, below, o->min);
    REQUIRE(strstr(fk_errmsg(), o->name) != NULL, "option %s: the message '%s' does not name "
            "the option", o->name, fk_errmsg());
    REQUIRE(fk_opts_set(ops, buf, o, above) == FK_ECONFIG, "option %s accepted %g, above its "
            "maximum %g", o->name, above, o->max);
    REQUIRE(fk_opts_set(ops, buf, o, NAN) == FK_ECONFIG, "option %s accepted NaN", o->name);
    REQUIRE(fk_opts_set(ops, buf, o, INFINITY) == FK_ECONFIG, "option %s accepted inf",
            o->name);
    if (o->type != FK_OPT_DOUBLE && o->max > o->min)
        REQUIRE(fk_opts_set(ops, buf, o, o->min + 0.5) == FK_ECONFIG,
                "option %s accepted the non-integer %g", o->name, o->min + 0.5);
    REQUIRE(fk_opts_get(buf, o) == o->def, "option %s: a refused value changed it", o->name);
    if (o->type == FK_OPT_DOUBLE) {
        double v = o->min + span / 3;
        REQ_OK(fk_opts_set(ops, buf, o, v), "option %s = %g", o->name, v);
        char txt[64];
        fk_opts_format(buf, o, txt, sizeof txt);
        REQUIRE(strtod(txt, NULL) == v, "option %s = %.17g prints as '%s', which does not "
                "read back", o->name, v, txt);
        REQ_OK(fk_opts_set(ops, buf, o, o->def), "option %s = %g", o->name, o->def);
    }
}

static void rule_options(struct cx *cx, const struct fk_codec_ops *ops)
{
    const struct fk_option *o = ops->options;
    /* the common options come first, at the offsets of struct fk_common_opts, unless
     * the codec gives its own buffer rule (then its table names what stays exact) */
    REQUIRE(ops->buffer || (o[0].name && !strcmp(o[0].name, "n_b") &&
                            o[0].offset == offsetof(struct fk_common_opts, n_b)),
            "the first option is not n_b at offsetof(struct fk_common_opts, n_b) "
            "(FK_COMMON_OPTIONS first, or a buffer callback)");
    REQUIRE(ops->buffer || (o[1].name && !strcmp(o[1].name, "a_len") &&
                            o[1].offset == offsetof(struct fk_common_opts, a_len)),
            "the second option is not a_len (FK_COMMON_OPTIONS first, or a buffer callback)");
    REQUIRE(ops->buffer || (o[2].name && !strcmp(o[2].name, "coef") &&
                            o[2].type == FK_OPT_ENUM &&
                            o[2].offset == offsetof(struct fk_common_opts, coef)),
            "the third option is not coef (FK_COMMON_OPTIONS first, or a buffer callback)");
    void *buf = opts_new(cx, ops);
    for (int kind = 0; ops->buffer && kind < 2; kind++) {
        struct fk_buffer b; /* at the defaults, a rule the schedule walks */
        fk_codec_buffer(ops, buf, kind, &b);
        REQUIRE(b.mode >= FK_BUF_SLIDE && b.mode <= FK_BUF_BLOCK_ALL && b.a_len >= 1 &&
                    b.n_b >= (b.mode == FK_BUF_SLIDE ? 0 : 1),
                "%s stream: buffer rule (mode %d, n_b %d, a_len %d) at the defaults is no "
                "rule of enum fk_buf_mode", kind ? "value" : "key", b.mode, b.n_b, b.a_len);
    }
    for (int i = 0; o[i].name; i++) {
        for (int k = 0; k < i; k++)
            REQUIRE(strcmp(o[k].name, o[i].name), "option %s is listed twice", o[i].name);
        for (int k = 0; k < i; k++)
            REQUIRE(o[k].offset != o[i].offset, "options %s and %s share one field (offset "
                    "%zu)", o[k].name, o[i].name, o[i].offset);
        REQUIRE(fk_opts_get(buf, &o[i]) == o[i].def, "option %s: the default %g is not "
                "applied (reads %g)", o[i].name, o[i].def, fk_opts_get(buf, &o[i]));
        REQUIRE(fk_codec_option(ops, o[i].name) == &o[i], "option %s: lookup by name finds "
                "another entry", o[i].name);
        /* a name the sweep language or cells.csv already uses would collide there */
        static const char *const reserved[] = {"name", "preset", "datasets", "grid", "zip",
                                               "evict", "cell_id", "codec", "dataset",
                                               "status", "n_traces", "traces", "dictionary",
                                               "basis", "seed", "attn_stride", "repeat",
                                               "error", NULL};
        for (int r = 0; reserved[r]; r++)
            REQUIRE(strcmp(o[i].name, reserved[r]), "option %s: the name is the sweep's or "
                    "cells.csv's own (a [[codec]] key or a column)", o[i].name);
        lint_option(cx, ops, &o[i], buf);
    }
    REQUIRE(fk_codec_option(ops, "no_such_option") == NULL, "an unknown option name is found");
    /* roles: each names an option of the table, once; the integer ones are INT; a codec
     * over a dictionary has a sparsity (the recall diagnostics need it) */
    for (const struct fk_role *r = ops->roles; r && r->role; r++) {
        REQUIRE(r->role >= FK_ROLE_SPARSITY && r->role <= FK_ROLE_CALIB_FRACTION,
                "role %d of option %s is no enum fk_opt_role", r->role,
                r->option ? r->option : "(null)");
        for (const struct fk_role *q = ops->roles; q != r; q++)
            REQUIRE(q->role != r->role, "role %d is given twice (%s, %s)", r->role, q->option,
                    r->option);
        const struct fk_option *opt = fk_codec_role(ops, r->role);
        int is_int = r->role == FK_ROLE_SPARSITY || r->role == FK_ROLE_POOL ||
                     r->role == FK_ROLE_GROUP || r->role == FK_ROLE_WINDOW ||
                     r->role == FK_ROLE_INDEX_BYTES;
        REQUIRE(!opt || !is_int || opt->type == FK_OPT_INT, "role %d names option %s, which "
                "is not an integer", r->role, opt->name);
        REQUIRE(!opt || r->role != FK_ROLE_CALIB_FRACTION || opt->type == FK_OPT_DOUBLE,
                "role %d names option %s, which is not a DOUBLE", r->role, opt->name);
    }
    REQUIRE(!(ops->caps & FK_CAP_DICT) || fk_codec_role(ops, FK_ROLE_SPARSITY),
            "a codec over a dictionary (FK_CAP_DICT) gives no option the role "
            "FK_ROLE_SPARSITY (its codes' atoms, s)");
}

/* ---- errors, zero vectors, codes ------------------------------------------------------ */

/* One row's flags and reported errors: a zero row is flagged, exact and (under SLIDE) comes
 * back as zero; any other row reports the error its reconstructions have. */
static void check_row_flags(struct cx *cx, const struct fk_conf_run *r, int i, int h, int t,
                            int m, const float *xh, double xx, double err, int zero_back,
                            int final_err)
{
    int sparse = (r->ops->caps & FK_CAP_SPARSE) != 0;
    const struct fk_vec_out *o = &r->out[i];
    if (xx == 0) {
        REQUIRE(o->flags & FK_VEC_ZERO, "row (head %d, token %d) is a zero vector but its "
                "outcome lacks FK_VEC_ZERO", h, t);
        REQUIRE(!(o->flags & FK_VEC_ADAPTED), "zero row (head %d, token %d) is flagged "
                "adapted", h, t);
        REQUIRE(o->err == 0 && o->err_enc == 0, "zero row (head %d, token %d) reports err "
                "%g and err_enc %g; expected 0", h, t, o->err, o->err_enc);
        for (int c = 0; zero_back && c < m; c++)
            REQUIRE(xh[c] == 0, "zero row (head %d, token %d) reconstructs %g at "
                    "coordinate %d; expected 0", h, t, xh[c], c);
        if (sparse)
            REQUIRE(o->nnz == 0, "zero row (head %d, token %d) stores %d atoms; expected 0",
                    h, t, o->nnz);
    } else {
        REQUIRE(!(o->flags & FK_VEC_ZERO), "row (head %d, token %d) is not zero but is "
                "flagged FK_VEC_ZERO", h, t);
        REQUIRE(fabs(r->err_commit[i] - o->err) <= 1e-5,
                "row (head %d, token %d): encode() reported err %.8f, but the row "
                "reconstruct() returned right after its event has relative error %.8f",
                h, t, o->err, r->err_commit[i]);
        REQUIRE(!final_err || fabs(err - o->err) <= 1e-5,
                "row (head %d, token %d): encode() reported err %.8f, but the row "
                "reconstruct() returns at the end of the stream has relative error %.8f",
                h, t, o->err, err);
        REQUIRE(isfinite(o->err_enc) && o->err_enc >= 0, "row (head %d, token %d): "
                "err_enc %g is not a finite non-negative error", h, t, o->err_enc);
    }
}

/* A sparse row's stored code: its atoms exist, its coefficients are `coef` values and it
 * sums to what reconstruct() gives (xs: scratch of m floats); returns its nnz. */
static int check_sparse_code(struct cx *cx, const struct fk_conf_run *r,
                             const struct fk_vec_out *o, int h, int t, int m, const float *xh,
                             float *xs, int s_max, const float *A, int n_atoms,
                             const struct fk_common_opts *co)
{
    const struct fk_codec_ops *ops = r->ops;
    int nnz = -1;
    const int32_t *idx = NULL;
    const float *coef = NULL;
    REQ_OK(ops->sparse_row(r->st, h, t, &nnz, &idx, &coef), "sparse_row(head %d, token "
           "%d)", h, t);
    REQUIRE(nnz == o->nnz, "row (head %d, token %d) stores %d atoms; encode() reported %d",
            h, t, nnz, o->nnz);
    REQUIRE(nnz >= 0 && nnz <= s_max, "row (head %d, token %d) has nnz %d; expected at "
            "most s = %d", h, t, nnz, s_max);
    /* stored coefficients are what the `coef` format holds (bytes are billed for it) */
    for (int k = 0; k < nnz; k++) {
        float q = co->coef == FK_COEF_FP8    ? fk_fp8_decode(fk_fp8_encode(coef[k], NULL))
                  : co->coef == FK_COEF_FP16 ? fk_fp16_decode(fk_fp16_encode(coef[k]))
                                             : coef[k];
        REQUIRE(q == coef[k], "row (head %d, token %d): coefficient %d = %.9g is not a %s "
                "value", h, t, k, coef[k], fk_coef_names[co->coef]);
    }
    /* the reconstruction is sum coef_i d_idx_i over the current atoms */
    memset(xs, 0, sizeof(float) * (size_t)m);
    for (int k = 0; k < nnz; k++) {
        REQUIRE(idx[k] >= 0 && idx[k] < n_atoms, "row (head %d, token %d) names atom %d; "
                "the codec has %d", h, t, idx[k], n_atoms);
        for (int c = 0; c < m; c++)
            xs[c] += coef[k] * A[(size_t)idx[k] * m + c];
    }
    for (int c = 0; c < m; c++)
        REQUIRE(fabsf(xs[c] - xh[c]) <= 1e-5f * (1 + fabsf(xh[c])),
                "row (head %d, token %d): reconstruct() gives %g at coordinate %d, its "
                "sparse code sums to %g", h, t, xh[c], c, xs[c]);
    return nnz;
}

/* The stream's stats against the sums over its rows (bytes, coefficients, adaptations). */
static void check_stream_totals(struct cx *cx, const struct fk_conf_run *r,
                                const struct fk_stream_stats *st, int m, int H,
                                uint64_t zeros, uint64_t nnz_sum, uint64_t adapted,
                                double bytes, double row_bytes)
{
    const struct fk_codec_ops *ops = r->ops;
    int sparse = (ops->caps & FK_CAP_SPARSE) != 0, exact = (ops->caps & FK_CAP_EXACT) != 0;
    int dict = (ops->caps & FK_CAP_DICT) != 0;
    REQUIRE(zeros > 0, "internal: the stream has no zero vector");
    if (sparse)
        REQUIRE(st->uses_total == nnz_sum, "stats: uses_total %llu, but the stored codes hold "
                "%llu coefficients", (unsigned long long)st->uses_total,
                (unsigned long long)nnz_sum);
    if (dict) /* the dictionary codecs' formula (spec 10.6) */
        REQUIRE(st->bytes_codes == bytes, "stats: bytes_codes %.0f; the stored codes cost %.0f "
                "(nnz x (coefficient + 2 index bytes) + ptr_bytes per row)", st->bytes_codes,
                bytes);
    /* a static codec's rows are encoded ahead of their eviction: the engine sums the bytes
     * of the compressed ones from what each row reported */
    if (ops->caps & FK_CAP_STATIC)
        REQUIRE(fabs(row_bytes - st->bytes_codes) <= 1e-6 * st->bytes_codes,
                "its rows report %.1f bytes in all, stats' bytes_codes is %.1f (a FK_CAP_STATIC "
                "codec's rows must sum to it)", row_bytes, st->bytes_codes);
    if (exact)
        REQUIRE(st->bytes_codes == 2.0 * m * r->n_tok * H, "exact rows cost %.0f bytes, not the "
                "fp16 reference's %.0f", st->bytes_codes, 2.0 * m * r->n_tok * H);
    REQUIRE(adapted == st->appends + st->replacements, "%llu vectors are flagged adapted, but "
            "stats count appends + replacements = %llu", (unsigned long long)adapted,
            (unsigned long long)(st->appends + st->replacements));
    if (ops->caps & FK_CAP_ADAPTS)
        REQUIRE(adapted > 0, "the codec declares FK_CAP_ADAPTS but never adapted on a stream "
                "with 40%% novel vectors");
    else
        REQUIRE(adapted == 0, "%llu vectors are flagged adapted, but the codec does not "
                "declare FK_CAP_ADAPTS", (unsigned long long)adapted);
}

/* Rows handed over in blocks (BLOCK, BLOCK_ALL) may be coded together, as KIVI's keys
 * per channel: a zero row is flagged but need not come back as zero. Under BLOCK_ALL
 * (Hugging Face's QuantizedCache) every flush may quantise the stored rows again: a vector
 * reports the error of its row right after its event, not at the end. Rows handed over by
 * SLIDE, and every codec without a buffer rule, get both checks at the end. */
static void check_stream_outcome(struct cx *cx, const struct fk_conf_run *r,
                                 const struct fk_conf_stream *s, const void *opts)
{
    const struct fk_codec_ops *ops = r->ops;
    int m = s->m, H = s->H;
    int sparse = (ops->caps & FK_CAP_SPARSE) != 0, exact = (ops->caps & FK_CAP_EXACT) != 0;
    int zero_back = r->rule == FK_BUF_SLIDE, final_err = r->rule != FK_BUF_BLOCK_ALL;
    struct fk_stream_stats st = stats_of(r);
    float *xh = cx_alloc(cx, sizeof(float) * (size_t)m);
    float *xs = cx_alloc(cx, sizeof(float) * (size_t)m);
    const struct fk_option *so = fk_codec_role(ops, FK_ROLE_SPARSITY);
    int s_max = so ? (int)fk_opts_get(opts, so) : m;
    const struct fk_common_opts *co = opts;
    const struct fk_option *po = fk_codec_role(ops, FK_ROLE_INDEX_BYTES);
    int b_ptr = po ? (int)fk_opts_get(opts, po) : 0;
    int b_val = co->coef == FK_COEF_FP8 ? 1 : co->coef == FK_COEF_FP16 ? 2 : 4;
    double bytes = 0, row_bytes = 0;
    uint64_t nnz_sum = 0, adapted = 0, zeros = 0;
    int n_atoms = 0;
    const float *A = sparse ? ops->atoms(r->st, &n_atoms) : NULL;
    for (int i = 0; i < r->n_tok * H; i++) {
        int h = i % H, t = i / H;
        const float *x = s->x + (size_t)i * m;
        const struct fk_vec_out *o = &r->out[i];
        row_bytes += o->bytes;
        double err = row_err(cx, r, x, h, t, xh);
        double xx = dot_fd(x, x, m);
        for (int c = 0; c < m; c++)
            REQUIRE(isfinite(xh[c]), "row (head %d, token %d) reconstructs a non-finite value "
                    "(%g) at coordinate %d", h, t, xh[c], c);
        if (o->flags & FK_VEC_ADAPTED)
            adapted++;
        if (xx == 0)
            zeros++;
        check_row_flags(cx, r, i, h, t, m, xh, xx, err, zero_back, final_err);
        if (exact)
            REQUIRE(!memcmp(xh, x, sizeof(float) * (size_t)m) && o->err == 0 &&
                        o->err_enc == 0,
                    "row (head %d, token %d) is not stored exactly, yet the codec declares "
                    "FK_CAP_EXACT", h, t);
        if (!sparse) { /* dense: every coordinate is stored; a basis codec: its share */
            int basis = (ops->caps & FK_CAP_BASIS) != 0;
            REQUIRE(xx == 0 || o->nnz == m || (basis && o->nnz > 0 && o->nnz <= m),
                    "dense row (head %d, token %d) reports nnz %d; expected head_dim %d", h,
                    t, o->nnz, m);
            continue;
        }
        int nnz = check_sparse_code(cx, r, o, h, t, m, xh, xs, s_max, A, n_atoms, co);
        nnz_sum += (uint64_t)nnz;
        bytes += nnz * (b_val + 2) + b_ptr;
    }
    check_stream_totals(cx, r, &st, m, H, zeros, nnz_sum, adapted, bytes, row_bytes);
}

int fk_conf_check_outcome(const struct fk_conf_run *r, const struct fk_conf_stream *s,
                          const void *opts)
{
    struct cx *cx = calloc(1, sizeof *cx);
    if (!cx)
        return fk_err(FK_ENOMEM, "conformance: out of memory");
    volatile int failed = 0; /* set after a longjmp */
    if (setjmp(cx->jb) == 0)
        check_stream_outcome(cx, r, s, opts);
    else
        failed = 1;
    cx_release(cx);
    int rc = failed ? fk_err(cx->oom ? FK_ENOMEM : FK_EINVAL, "%s: rule errors: %s",
                             r->ops->name, cx->msg)
                    : FK_OK;
    free(cx->held);
    free(cx);
    return rc;
}

/* The stream of the errors and determinism rules: 96 atoms of head_dim 24 (6 coordinates
 * held out for novelty), 3 heads, 60 prefill + 100 decode tokens, every 17th vector zero. */
static void stream_a(struct cx *cx, struct fk_conf_dict **d, struct fk_conf_stream **s,
                     int n_use, int const_every)
{
    *d = cx_dict(cx, 96, 24, 6, 1, 11);
    struct fk_conf_gen g = {.n_use = n_use, .k_gen = 3, .noise = 0.01, .p_novel_prefill = 0.3,
                            .p_novel = 0.4, .n_dirs = 6, .zero_every = 17,
                            .const_every = const_every};
    *s = cx_stream(cx, *d, 3, 60, 160, &g, 12);
}

static void rule_errors(struct cx *cx, const struct fk_codec_ops *ops)
{
    struct fk_conf_dict *d;
    struct fk_conf_stream *s;
    stream_a(cx, &d, &s, 96, 0);
    for (int kind = 0; kind < 2; kind++) {
        void *o = opts_small(cx, ops);
        struct fk_conf_run *a = run_stream(cx, ops, o, d, s, kind, NULL, NULL);
        check_stream_outcome(cx, a, s, o);
        struct fk_stream_stats st = stats_of(a);
        REQUIRE(!(ops->caps & FK_CAP_EXACT) || st.appends + st.replacements == 0,
                "an exact codec adapted its dictionary");
    }
}

static void rule_determinism(struct cx *cx, const struct fk_codec_ops *ops)
{
    struct fk_conf_dict *d;
    struct fk_conf_stream *s;
    stream_a(cx, &d, &s, 96, 0);
    for (int kind = 0; kind < 2; kind++) {
        void *o = opts_small(cx, ops);
        struct fk_conf_run *a = cx_run(cx), *b = cx_run(cx);
        fk_blas_threads_set(2);
        REQ_OK(fk_conf_run_stream_ahead(a, ops, o, d, s, s, kind, NULL, NULL),
               "the %s stream at 2 BLAS threads", kind ? "value" : "key");
        fk_blas_threads_set(1);
        REQ_OK(fk_conf_run_stream_ahead(b, ops, o, d, s, s, kind, NULL, NULL),
               "the %s stream at 1 BLAS thread", kind ? "value" : "key");
        const char *kn = kind ? "value" : "key";
        REQUIRE(a->n_tok == b->n_tok, "%s stream: %d then %d tokens stored", kn, a->n_tok,
                b->n_tok);
        int n_vec = a->n_tok * s->H;
        for (int i = 0; i < n_vec; i++)
            REQUIRE(!memcmp(&a->out[i], &b->out[i], sizeof a->out[i]), "%s stream, row (head "
                    "%d, token %d): the first run reported err %.8g, nnz %d, %g bytes; the "
                    "second err %.8g, nnz %d, %g bytes", kn, i % s->H, i / s->H, a->out[i].err,
                    a->out[i].nnz, a->out[i].bytes, b->out[i].err, b->out[i].nnz,
                    b->out[i].bytes);
        struct fk_stream_stats sa = stats_of(a), sb = stats_of(b);
        REQUIRE(sa.n_atoms == sb.n_atoms && sa.appends == sb.appends &&
                    sa.replacements == sb.replacements && sa.adapt_failed == sb.adapt_failed &&
                    sa.saturated == sb.saturated && sa.premature == sb.premature &&
                    sa.guarded == sb.guarded && sa.uses_total == sb.uses_total &&
                    sa.macs == sb.macs && sa.bytes_codes == sb.bytes_codes &&
                    sa.bytes_dict_seq == sb.bytes_dict_seq,
                "%s stream: the counters differ between two runs (bytes_codes %.0f / %.0f, "
                "macs %.0f / %.0f, atoms %d / %d)", kn, sa.bytes_codes, sb.bytes_codes, sa.macs,
                sb.macs, sa.n_atoms, sb.n_atoms);
        float *x1 = cx_alloc(cx, sizeof(float) * (size_t)s->m);
        float *x2 = cx_alloc(cx, sizeof(float) * (size_t)s->m);
        for (int i = 0; i < n_vec; i++) {
            int h = i % s->H, t = i / s->H;
            REQ_OK(ops->reconstruct(a->st, h, t, x1), "reconstruct(head %d, token %d)", h, t);
            REQ_OK(ops->reconstruct(b->st, h, t, x2), "reconstruct(head %d, token %d)", h, t);
            for (int c = 0; c < s->m; c++)
                REQUIRE(!memcmp(&x1[c], &x2[c], sizeof(float)), "%s stream, row (head %d, "
                        "token %d), coordinate %d: %.9g in the first run, %.9g in the second",
                        kn, h, t, c, x1[c], x2[c]);
        }
        if (ops->caps & FK_CAP_SPARSE) {
            int na = 0, nb = 0;
            const float *Aa = ops->atoms(a->st, &na), *Ab = ops->atoms(b->st, &nb);
            REQUIRE(na == nb && !memcmp(Aa, Ab, sizeof(float) * (size_t)na * s->m),
                    "%s stream: the atoms differ between two runs (%d / %d atoms)", kn, na,
                    nb);
            REQUIRE(!sa.ref_count == !sb.ref_count && (!sa.ref_count ||
                        !memcmp(sa.ref_count, sb.ref_count, sizeof(uint32_t) * (size_t)na)),
                    "%s stream: ref_count differs between two runs", kn);
        }
        fk_conf_run_close(a);
        fk_conf_run_close(b);
    }
}

/* ---- accounting and class ------------------------------------------------------------- */

static int coef_bytes(const void *opts)
{
    int coef = ((const struct fk_common_opts *)opts)->coef;
    return coef == FK_COEF_FP8 ? 1 : coef == FK_COEF_FP16 ? 2 : 4;
}

struct tbytes {
    struct cx *cx;
    int n;                       /* snapshots */
    double bytes[512], rows[512], nnz[512];
    double reported[512];        /* the stored rows' fk_vec_out.bytes, summed */
};

/* Stored coefficients over every stored row (sparse codecs), recounted by sparse_row. */
static double stored_nnz(struct cx *cx, const struct fk_conf_run *r)
{
    double nz = 0;
    for (int i = 0; i < r->n_tok * r->H; i++) {
        int nnz = -1;
        const int32_t *idx = NULL;
        const float *coef = NULL;
        REQ_OK(r->ops->sparse_row(r->st, i % r->H, i / r->H, &nnz, &idx, &coef),
               "sparse_row(head %d, token %d)", i % r->H, i / r->H);
        nz += nnz;
    }
    return nz;
}

static void bytes_hook(void *ctx, struct fk_conf_run *r, const struct fk_event *ev, int after)
{
    struct tbytes *b = ctx;
    struct cx *cx = b->cx;
    struct fk_stream_stats st = stats_of(r);
    (void)ev;
    if (!after) {
        if (r->events == 0)
            REQUIRE(st.bytes_codes == 0 && st.bytes_dict_seq == 0, "%.0f + %.0f bytes are "
                    "accounted before any row was stored", st.bytes_codes, st.bytes_dict_seq);
        return;
    }
    REQUIRE(isfinite(st.bytes_codes) && st.bytes_codes > 0 && isfinite(st.bytes_dict_seq) &&
                st.bytes_dict_seq >= 0,
            "after event %d: bytes_codes %g, bytes_dict_seq %g (expected bytes_codes > 0 and "
            "bytes_dict_seq >= 0)", r->events, st.bytes_codes, st.bytes_dict_seq);
    if (b->n > 0 && !(r->ops->caps & FK_CAP_ADAPTS))
        REQUIRE(st.bytes_codes >= b->bytes[b->n - 1], "event %d lowered bytes_codes from %.0f "
                "to %.0f, but no stored row can change", r->events, b->bytes[b->n - 1],
                st.bytes_codes);
    REQUIRE(b->n < 512, "internal: more than 512 events");
    b->bytes[b->n] = st.bytes_codes;
    b->rows[b->n] = (double)r->n_tok * r->H;
    b->nnz[b->n] = (r->ops->caps & FK_CAP_SPARSE) ? stored_nnz(cx, r) : 0;
    b->reported[b->n] = 0;
    for (int i = 0; i < r->n_tok * r->H; i++)
        b->reported[b->n] += r->out[i].bytes;
    b->n++;
}

/* The accounting model: a dense row costs a fixed number of bytes, or (a cost that depends
 * on its data: sparse outliers) what encode() reported for it, the rows' reports summing to
 * bytes_codes; a sparse row a fixed overhead plus a fixed cost per stored coefficient, at
 * least its value bytes (`coef`) plus one index byte. The constants are solved from two
 * snapshots and must hold at all. */
static void check_bytes_model(struct cx *cx, const struct fk_conf_run *r,
                              const struct tbytes *b, const void *opts)
{
    const struct fk_codec_ops *ops = r->ops;
    int m = r->m;
    REQUIRE(b->n >= 2, "internal: fewer than two events");
    if (!(ops->caps & FK_CAP_SPARSE)) {
        double beta = b->bytes[0] / b->rows[0];
        int fixed = 1;
        for (int k = 1; k < b->n; k++)
            fixed &= fabs(b->bytes[k] - beta * b->rows[k]) <= 1e-9 * b->bytes[k];
        for (int k = 0; k < b->n && !fixed; k++) /* each row's report is a float */
            REQUIRE(fabs(b->bytes[k] - b->reported[k]) <= 1e-6 * b->bytes[k], "a dense row "
                    "costs %g bytes after the prefill but %g after event %d, and the rows' "
                    "reported bytes sum to %.10g, not bytes_codes %.10g", beta,
                    b->bytes[k] / b->rows[k], k + 1, b->reported[k], b->bytes[k]);
        beta = b->bytes[b->n - 1] / b->rows[b->n - 1];
        REQUIRE(beta <= 2.0 * m, "a dense row costs %g bytes, more than the fp16 reference's "
                "%d", beta, 2 * m);
        const struct fk_option *bo = fk_codec_option(ops, "bits");
        if ((ops->caps & FK_CAP_GRID) && bo) {
            int bits = (int)fk_opts_get(opts, bo);
            REQUIRE(beta >= (m * bits + 7) / 8, "a row of %d %d-bit codes costs only %g bytes",
                    m, bits, beta);
        }
        return;
    }
    int b_val = coef_bytes(opts), best = 0;
    double det = 0;
    for (int k = 0; k < b->n; k++) {
        REQUIRE(b->bytes[k] >= (b_val + 1) * b->nnz[k], "after event %d, %.0f stored "
                "coefficients cost only %.0f bytes (%d value bytes + an index each)", k + 1,
                b->nnz[k], b->bytes[k], b_val);
        double dk = b->nnz[0] * b->rows[k] - b->nnz[k] * b->rows[0];
        if (fabs(dk) > fabs(det)) {
            det = dk;
            best = k;
        }
    }
    if (det == 0) { /* same coefficients per row throughout: bytes per row constant */
        for (int k = 1; k < b->n; k++)
            REQUIRE(fabs(b->bytes[k] * b->rows[0] - b->bytes[0] * b->rows[k]) <=
                        1e-9 * b->bytes[k] * b->rows[0],
                    "the bytes per row change at event %d", k + 1);
        return;
    }
    /* bytes = alpha nnz + gamma rows */
    double alpha = (b->bytes[0] * b->rows[best] - b->bytes[best] * b->rows[0]) / det;
    double gamma = (b->nnz[0] * b->bytes[best] - b->nnz[best] * b->bytes[0]) / det;
    REQUIRE(alpha >= b_val + 1 - 1e-9 && gamma >= -1e-9, "%.4g bytes per coefficient and %.4g "
            "per row: a coefficient stored as %d bytes needs an index too", alpha, gamma,
            b_val);
    for (int k = 0; k < b->n; k++)
        REQUIRE(fabs(b->bytes[k] - alpha * b->nnz[k] - gamma * b->rows[k]) <=
                    1e-6 * b->bytes[k],
                "after event %d, %.0f bytes for %.0f rows and %.0f coefficients; %.4g per "
                "coefficient and %.4g per row elsewhere", k + 1, b->bytes[k], b->rows[k],
                b->nnz[k], alpha, gamma);
}

/* Orthonormal atoms (n_atoms <= m, A A^T = I): 1, else 0. */
static int atoms_orthonormal(const float *A, int n, int m)
{
    if (n > m)
        return 0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j <= i; j++)
            if (fabs(dot_fd(A + (size_t)i * m, A + (size_t)j * m, m) - (i == j)) > 1e-6)
                return 0;
    return 1;
}

static int cmp_desc(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x < y) - (x > y);
}

/* A sparse code over orthonormal atoms: the error of the stored support with exact
 * coefficients is err_enc, and no other nnz atoms do better (the best nnz-term code keeps
 * the nnz largest |<x, a_j>|). */
static void check_best_terms(struct cx *cx, const struct fk_conf_run *r,
                             const struct fk_conf_stream *s)
{
    const struct fk_codec_ops *ops = r->ops;
    int m = r->m, na = 0;
    const float *A = ops->atoms(r->st, &na);
    if (!atoms_orthonormal(A, na, m))
        return;
    double *c2 = cx_alloc(cx, sizeof(double) * (size_t)(na + 1));
    double *sorted = cx_alloc(cx, sizeof(double) * (size_t)(na + 1));
    for (int i = 0; i < r->n_tok * s->H; i++) {
        const float *x = s->x + (size_t)i * m;
        double xx = dot_fd(x, x, m), kept = 0;
        if (xx == 0)
            continue;
        for (int j = 0; j < na; j++) {
            double c = dot_fd(A + (size_t)j * m, x, m);
            c2[j] = sorted[j] = c * c;
        }
        int nnz = 0;
        const int32_t *idx = NULL;
        const float *coef = NULL;
        REQ_OK(ops->sparse_row(r->st, i % s->H, i / s->H, &nnz, &idx, &coef),
               "sparse_row(head %d, token %d)", i % s->H, i / s->H);
        for (int k = 0; k < nnz; k++)
            kept += c2[idx[k]];
        qsort(sorted, (size_t)na, sizeof(double), cmp_desc);
        double best = 0;
        for (int k = 0; k < nnz && k < na; k++)
            best += sorted[k];
        double e_sup = sqrt(xx - kept > 0 ? (xx - kept) / xx : 0);
        double e_best = sqrt(xx - best > 0 ? (xx - best) / xx : 0);
        REQUIRE(e_sup <= e_best + 1e-6, "row (head %d, token %d) keeps %d atoms that leave a "
                "relative error of %.6f; the best %d of its orthonormal atoms leave %.6f",
                i % s->H, i / s->H, nnz, e_sup, nnz, e_best);
        REQUIRE(fabs(r->out[i].err_enc - e_sup) <= 1e-5, "row (head %d, token %d) reports "
                "err_enc %.6f, but its support with exact coefficients leaves %.6f", i % s->H,
                i / s->H, r->out[i].err_enc, e_sup);
    }
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* FK_CAP_GRID: each row takes at most 2^bits values, lies within half a grid step of the
 * vector (plus fp16 rounding of the grid's origin and step), and a constant row of an fp16
 * value comes back exactly. */
static void check_grid(struct cx *cx, const struct fk_conf_run *r,
                       const struct fk_conf_stream *s, int bits)
{
    const struct fk_codec_ops *ops = r->ops;
    int m = r->m, levels = 1 << bits;
    float *xh = cx_alloc(cx, sizeof(float) * (size_t)m), *v = cx_alloc(cx, sizeof(float) * (size_t)m);
    int constants = 0;
    for (int i = 0; i < r->n_tok * s->H; i++) {
        int h = i % s->H, t = i / s->H;
        const float *x = s->x + (size_t)i * m;
        REQ_OK(ops->reconstruct(r->st, h, t, xh), "reconstruct(head %d, token %d)", h, t);
        float lo = x[0], hi = x[0];
        for (int c = 0; c < m; c++) {
            lo = x[c] < lo ? x[c] : lo;
            hi = x[c] > hi ? x[c] : hi;
        }
        if (lo == hi && fk_fp16_decode(fk_fp16_encode(lo)) == lo) {
            constants++;
            for (int c = 0; c < m; c++)
                REQUIRE(xh[c] == x[c], "bits %d: constant row (head %d, token %d) of %g comes "
                        "back as %g at coordinate %d", bits, h, t, x[c], xh[c], c);
            continue;
        }
        double step = ((double)hi - lo) / (levels - 1);
        double tol = step / 2 + ldexp(fabs(lo) + ((double)hi - lo), -9);
        for (int c = 0; c < m; c++)
            REQUIRE(fabs((double)x[c] - xh[c]) <= tol, "bits %d: row (head %d, token %d) "
                    "coordinate %d: |x - x_hat| = |%g - %g| is more than half a step (%g) of "
                    "the row's grid", bits, h, t, c, x[c], xh[c], step / 2);
        memcpy(v, xh, sizeof(float) * (size_t)m);
        qsort(v, (size_t)m, sizeof(float), cmp_float);
        int distinct = 1;
        for (int c = 1; c < m; c++)
            distinct += v[c] != v[c - 1];
        REQUIRE(distinct <= levels, "bits %d: row (head %d, token %d) takes %d distinct values, "
                "more than 2^bits = %d", bits, h, t, distinct, levels);
    }
    REQUIRE(constants > 0, "internal: the stream has no constant row");
}

static const char *const coef_choices[] = {"fp8", "fp16", "fp32"};

/* One option point, one kind: the accounting model, and with `klass` the class checks. */
static void run_point(struct cx *cx, const struct fk_codec_ops *ops, void *o,
                      const struct fk_conf_dict *d, const struct fk_conf_stream *s, int kind,
                      int klass)
{
    struct tbytes *b = cx_alloc(cx, sizeof *b);
    b->cx = cx;
    struct fk_conf_run *r = run_stream(cx, ops, o, d, s, kind, bytes_hook, b);
    check_stream_outcome(cx, r, s, o);
    check_bytes_model(cx, r, b, o);
    if (klass && (ops->caps & FK_CAP_SPARSE)) {
        check_best_terms(cx, r, s);
        if (((const struct fk_common_opts *)o)->coef == FK_COEF_FP32)
            for (int i = 0; i < r->n_tok * s->H; i++)
                REQUIRE(fabsf(r->out[i].err - r->out[i].err_enc) <= 1e-5f, "coefficients are "
                        "stored as fp32, yet row (head %d, token %d) reports err %.6f and "
                        "err_enc %.6f", i % s->H, i / s->H, r->out[i].err, r->out[i].err_enc);
    }
    const struct fk_option *bo = fk_codec_option(ops, "bits");
    if (klass && (ops->caps & FK_CAP_GRID) && bo)
        check_grid(cx, r, s, (int)fk_opts_get(o, bo));
    fk_conf_run_close(r);
}

/* Each coefficient storage the codec offers, both kinds; with `klass`, each grid width. */
static void by_class(struct cx *cx, const struct fk_codec_ops *ops, int klass)
{
    struct fk_conf_dict *d;
    struct fk_conf_stream *s;
    stream_a(cx, &d, &s, 64, 13); /* n_use < N: free atoms, so that fadkv can replace */
    const struct fk_option *co = fk_codec_option(ops, "coef");
    int n_coef = co && co->type == FK_OPT_ENUM && co->choices == fk_coef_names ? 3 : 1;
    for (int kind = 0; kind < 2; kind++)
        for (int k = 0; k < n_coef; k++) {
            void *o = opts_small(cx, ops);
            if (n_coef > 1)
                REQ_OK(fk_opts_set_enum(ops, o, co, coef_choices[k]), "coef = %s",
                       coef_choices[k]);
            run_point(cx, ops, o, d, s, kind, klass);
        }
    const struct fk_option *bo = fk_codec_option(ops, "bits");
    if (klass && (ops->caps & FK_CAP_GRID) && bo)
        for (int bits = (int)bo->min; bits <= (int)bo->max; bits++) {
            void *o = opts_small(cx, ops);
            REQ_OK(fk_opts_set(ops, o, bo, bits), "bits = %d", bits);
            run_point(cx, ops, o, d, s, 0, klass);
        }
}

static void rule_accounting(struct cx *cx, const struct fk_codec_ops *ops)
{
    by_class(cx, ops, 0);
}

static void rule_class(struct cx *cx, const struct fk_codec_ops *ops)
{
    by_class(cx, ops, 1);
}

/* ---- check(), robustness -------------------------------------------------------------- */

/* A whole word of msg is the name of one of the codec's options. */
static int names_an_option(const struct fk_codec_ops *ops, const char *msg)
{
    for (const struct fk_option *o = ops->options; o->name; o++) {
        size_t n = strlen(o->name);
        for (const char *p = strstr(msg, o->name); p; p = strstr(p + 1, o->name)) {
            char before = p == msg ? ' ' : p[-1], after = p[n];
            if (!is_name((char[]){before, 0}) && !is_name((char[]){after, 0}))
                return 1;
        }
    }
    return 0;
}

static void rule_check(struct cx *cx, const struct fk_codec_ops *ops)
{
    struct fk_conf_dict *d = cx_dict(cx, 512, 24, 6, 1, 131);
    struct fk_conf_gen g = {.n_use = 512, .k_gen = 3, .noise = 0.01, .p_novel_prefill = 0.3,
                            .p_novel = 0.5, .zero_every = 7};
    struct fk_conf_stream *s = cx_stream(cx, d, 2, 8, 24, &g, 132);
    float *xh = cx_alloc(cx, sizeof(float) * (size_t)d->m);
    struct fk_conf_run *r = cx_run(cx);
    void *o = opts_new(cx, ops);
    for (const struct fk_option *opt = ops->options; opt->name; opt++)
        for (int end = 0; end < 2; end++) {
            fk_opts_defaults(ops, o);
            double v = end ? opt->max : opt->min;
            /* a calibrated fraction: the fixture's (the harness refuses the others before
             * any cell, naming the calibration file) */
            if (opt == fk_codec_role(ops, FK_ROLE_CALIB_FRACTION))
                v = end ? 0.01 : 0;
            REQ_OK(fk_opts_set(ops, o, opt, v), "option %s = %g", opt->name, v);
            fk_conf_run_close(r);
            int n_atoms = (ops->caps & FK_CAP_DICT) ? d->N : 0;
            if (ops->caps & FK_CAP_BASIS) { /* the basis's components per group */
                struct fk_stream_env probe = {.head_dim = d->m, .n_heads = s->H,
                                              .n_tokens = s->T};
                REQ_OK(fk_conf_env(r, ops, s, &probe), "a basis");
                n_atoms = probe.basis->n_comp;
            }
            fk_err_clear();
            int rc = ops->check ? ops->check(o, d->m, n_atoms) : FK_OK;
            if (rc != FK_OK) {
                REQUIRE(names_an_option(ops, fk_errmsg()), "check() refuses %s = %g with '%s', "
                        "which names none of the codec's options", opt->name, v, fk_errmsg());
                continue;
            }
            fk_conf_run_close(r);
            rc = fk_conf_run_open(r, ops, o, d, s, s->H, s->T, 0);
            REQ_OK(rc, "check() accepts %s = %g, but the codec does not open there", opt->name,
                   v);
            REQ_OK(fk_conf_run_event(r, s, 0, s->T, 0, -1, NULL, NULL), "check() accepts %s = "
                   "%g, but encode() fails there", opt->name, v);
            for (int i = 0; i < s->T * s->H; i++) {
                double e = row_err(cx, r, s->x + (size_t)i * d->m, i % s->H, i / s->H, xh);
                REQUIRE(isfinite(e) && isfinite(r->out[i].err) && isfinite(r->out[i].err_enc),
                        "%s = %g: row (head %d, token %d) has error %g (reported %g, err_enc "
                        "%g)", opt->name, v, i % s->H, i / s->H, e, r->out[i].err,
                        r->out[i].err_enc);
            }
            fk_conf_run_close(r);
        }
}

static void rule_robustness(struct cx *cx, const struct fk_codec_ops *ops)
{
    struct fk_conf_dict *d = cx_dict(cx, 48, 24, 0, 1, 141);
    struct fk_conf_dict *d128 = cx_dict(cx, 48, 128, 0, 1, 142);
    struct fk_conf_gen g = {.n_use = 48, .k_gen = 3, .noise = 0.01};
    struct fk_conf_stream *s = cx_stream(cx, d, 2, 4, 4, &g, 143);
    ops->close(NULL);
    void *o = opts_small(cx, ops);
    struct fk_conf_run *r = cx_run(cx);
    REQ_OK(fk_conf_run_open(r, ops, o, d, s, s->H, s->T, 0), "open()");
    fk_conf_run_close(r); /* nothing stored */
    REQ_OK(fk_conf_run_open(r, ops, o, d, s, s->H, s->T, 0), "open()");
    fk_err_clear();
    int rc = fk_conf_run_event(r, s, 1, 2, 1, 0, NULL, NULL);
    if (ops->caps & FK_CAP_SKIPS) { /* token 0 skipped (dropped by a policy): fine */
        REQUIRE(rc == FK_OK, "FK_CAP_SKIPS: encode() refused token 1 with token 0 skipped "
                "(%d: %s)", rc, fk_errmsg());
        fk_err_clear();
        rc = fk_conf_run_event(r, s, 1, 2, 1, 1, NULL, NULL);
        REQUIRE(rc < 0, "FK_CAP_SKIPS: encode() accepted token 1 twice");
    } else {
        REQUIRE(rc < 0, "encode() accepted token 1 before token 0 was stored");
    }
    REQUIRE(fk_errmsg()[0], "encode() refused an out-of-order token (%d) without a message",
            rc);
    fk_conf_run_close(r);
    if (ops->caps & FK_CAP_DICT) { /* a dictionary of another head_dim: refused */
        int gram = (ops->caps & FK_CAP_GRAM) != 0;
        struct fk_stream_env other = {.head_dim = 24, .n_heads = 2, .n_tokens = 4,
                                      .base = gram ? &d128->with : &d128->without};
        fk_err_clear();
        rc = ops->open(o, &other, &r->st);
        REQUIRE(rc < 0 && strstr(fk_errmsg(), "head_dim"), "open() with a head_dim 128 "
                "dictionary for head_dim 24 streams gave %d (%s); expected a refusal naming "
                "head_dim", rc, fk_errmsg());
        ops->close(r->st);
        r->st = NULL;
    }
}

/* ---- the run -------------------------------------------------------------------------- */

typedef void (*rule_fn)(struct cx *cx, const struct fk_codec_ops *ops);
static const rule_fn rule_fns[] = {rule_interface, rule_options, rule_errors, rule_determinism,
                                   rule_accounting, rule_class, rule_check, rule_robustness};

int fk_conformance_run(const struct fk_codec_ops *ops, fk_conf_report_fn report, void *ctx,
                       struct fk_conf_result *res)
{
    memset(res, 0, sizeof *res);
    struct cx *cx = calloc(1, sizeof *cx);
    if (!cx)
        return fk_err(FK_ENOMEM, "conformance: out of memory");
    int blas0 = fk_blas_single(), oom = 0, interface_ok = 1;
    for (int i = 0; fk_conf_rules[i].name && !oom; i++) {
        if (!interface_ok) /* the other rules would call what the interface lacks */
            break;
        cx->msg[0] = 0;
        volatile int failed = 0; /* set after a longjmp */
        if (setjmp(cx->jb) == 0)
            rule_fns[i](cx, ops);
        else
            failed = 1;
        cx_release(cx);
        fk_blas_threads_set(1);
        oom = cx->oom;
        if (oom)
            break;
        res->n_rules++;
        res->n_failed += failed;
        if (i == 0)
            interface_ok = !failed;
        if (report)
            report(ctx, ops, &fk_conf_rules[i], !failed, cx->msg);
    }
    fk_blas_restore(blas0);
    char msg[sizeof cx->msg];
    snprintf(msg, sizeof msg, "%s", cx->msg);
    free(cx->held);
    free(cx);
    fk_err_clear();
    if (oom)
        return fk_err(FK_ENOMEM, "conformance of %s: %s", ops->name ? ops->name : "?", msg);
    return FK_OK;
}
