/* SPDX-License-Identifier: MIT
 * The quantisation family's KV-cache codecs against references written here from the spec
 * (families.md 1.1 and 1.2), each with its own quantiser and fp16 rounding, never the
 * codec's:
 *   kivi          KIVI's state machine: lists Kq, Kf, Vq, Vf per head; keys flushed per
 *                 channel in blocks of R once |Kf| == R, values per token once |Vf| > R.
 *   quant hf      Hugging Face's QuantizedLayer.update: the prefill quantised whole, then
 *                 [deq(Q), residual, new] quantised again whenever |residual| + 1 >= R.
 *   quant window  a sliding window of R exact tokens, each token quantised once on leaving.
 * The codecs are driven as the replay engine drives them (harness/engine/fk_drive.c): the
 * events of engine/fk_schedule.h under fk_codec_buffer()'s rule, the prefill event first,
 * then at decode step t first attention (here: the comparison), then the step's events, K
 * before V (a BLOCK event at step t holds token t). At every decode step, and at the end,
 * the compressed counts must be the reference's |Kq| and |Vq|, and every compressed row must
 * reconstruct bit for bit as the reference's dequantised row. Also: bytes against hand
 * counts, hand-built groups (constant, ties), and the refusals of check() and encode().
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fk_check_main.h"
#include "common/fk_err.h"
#include "core/fk_codec.h"
#include "core/fk_registry.h"
#include "engine/fk_schedule.h"

#define REQUIRE(cond, ...)                                                                 \
    do {                                                                                  \
        if (!(cond))                                                                      \
            ck_abort_msg(__VA_ARGS__);                                                    \
    } while (0)
#define REQ_OK(call)                                                                      \
    do {                                                                                  \
        int req_rc_ = (call);                                                             \
        if (req_rc_ != FK_OK)                                                             \
            ck_abort_msg("%s returned %d: %s", #call, req_rc_, fk_errmsg());              \
    } while (0)

/* ---- the reference quantiser (families.md 1.1, quant/fk_quant_group.h's contract) ---- */

/* v rounded to the nearest fp16 value, ties to even, saturated to +-65504: 11 significant
 * bits, or the subnormal quantum 2^-24. */
static float ref_half(float v)
{
    double a = fabs((double)v);
    if (a > 65504)
        a = 65504;
    if (a == 0)
        return v;
    int e;
    frexp(a, &e); /* a = f 2^e, f in [0.5, 1) */
    int qe = e - 11 < -24 ? -24 : e - 11;
    double q = ldexp(nearbyint(ldexp(a, -qe)), qe); /* default rounding: half to even */
    return (float)(v < 0 ? -q : q);
}

/* One group: the n values x[0], x[xs], ... dequantised into y[0], y[ys], ...:
 * lo = fp16(min), step = fp16(float((max - min) / (2^b - 1))), q = rint(clamp((x - lo) /
 * step)) in float, y = q step + lo; step 0 gives y = lo. */
static void ref_group(const float *x, int xs, int n, int bits, float *y, int ys)
{
    float mn = x[0], mx = x[0];
    for (int i = 0; i < n; i++) {
        mn = fminf(mn, x[i * xs]);
        mx = fmaxf(mx, x[i * xs]);
    }
    float top = (float)((1 << bits) - 1);
    float lo = ref_half(mn), step = ref_half((float)(((double)mx - mn) / top));
    for (int i = 0; i < n; i++) {
        float q = 0;
        if (step > 0) {
            q = (x[i * xs] - lo) / step;
            q = nearbyintf(q < 0 ? 0 : q > top ? top : q);
        }
        y[i * ys] = q * step + lo;
    }
}

/* ---- the reference caches: one stream (K or V) of every head ------------------------- */

enum ref_rule {
    REF_KIVI_K,   /* KIVI keys: Kq, Kf; per channel over G tokens */
    REF_WINDOW,   /* KIVI values, quant window: per token over G channels */
    REF_HF,       /* QuantizedLayer: flush and re-quantise, axis token or channel */
};

struct ref {
    int rule, H, D, G, R, bits, channel; /* channel: REF_HF on quanto's axis -1 */
    int nq;                      /* |Q|: quantised tokens per head (Kq or Vq) */
    int nf;                      /* |F|: full-precision tokens per head (Kf, Vf, residual) */
    float *q;                    /* [H][T][D] the dequantised rows of Q */
    float *f;                    /* [H][T][D] the rows of F, oldest first */
    float *cat;                  /* [H][T][D] REF_HF: the cache to quantise */
    float *flat;                 /* [H T] REF_HF channel axis: one channel, flattened */
    int T;
};

static void ref_init(struct ref *r, int rule, int H, int D, int T, int G, int R, int bits,
                     int channel)
{
    *r = (struct ref){.rule = rule, .H = H, .D = D, .G = G, .R = R, .bits = bits,
                      .channel = channel, .T = T};
    size_t n = (size_t)H * T * D;
    r->q = calloc(n, sizeof(float));
    r->f = calloc(n, sizeof(float));
    r->cat = calloc(n, sizeof(float));
    r->flat = calloc((size_t)H * T, sizeof(float));
    ck_assert(r->q && r->f && r->cat && r->flat);
}

static void ref_free(struct ref *r)
{
    free(r->q);
    free(r->f);
    free(r->cat);
    free(r->flat);
}

static float *ref_row(float *base, const struct ref *r, int h, int t)
{
    return base + ((size_t)h * r->T + t) * r->D;
}

/* Q.append(quant(x)) for one token of head h: groups of G channels. */
static void ref_push_token(struct ref *r, int h, const float *x)
{
    float *y = ref_row(r->q, r, h, r->nq);
    for (int j = 0; j < r->D; j += r->G)
        ref_group(x + j, 1, r->G, r->bits, y + j, 1);
}

/* KIVI quantK: n keys of every head (rows from[h][0 .. n-1]) appended to Kq, per channel
 * in groups of G consecutive tokens. */
static void ref_push_keys(struct ref *r, float *from, int n)
{
    for (int h = 0; h < r->H; h++)
        for (int t0 = 0; t0 < n; t0 += r->G)
            for (int c = 0; c < r->D; c++)
                ref_group(ref_row(from, r, h, t0) + c, r->D, r->G, r->bits,
                          ref_row(r->q, r, h, r->nq + t0) + c, r->D);
    r->nq += n;
}

/* QuantizedLayer._quantize of the cache cat[h][0 .. n-1] into Q (|Q| = n). Axis token: per
 * token, groups of G channels. Axis channel (quanto axis -1): per channel, groups of G
 * consecutive rows of the flattening h n + t (the last one shorter). */
static void ref_requant(struct ref *r, int n)
{
    if (!r->channel) {
        for (int h = 0; h < r->H; h++)
            for (int t = 0; t < n; t++)
                for (int j = 0; j < r->D; j += r->G)
                    ref_group(ref_row(r->cat, r, h, t) + j, 1, r->G, r->bits,
                              ref_row(r->q, r, h, t) + j, 1);
    } else {
        int nr = r->H * n;
        for (int c = 0; c < r->D; c++) {
            for (int i = 0; i < nr; i++)
                r->flat[i] = ref_row(r->cat, r, i / n, i % n)[c];
            for (int g0 = 0; g0 < nr; g0 += r->G)
                ref_group(r->flat + g0, 1, nr - g0 < r->G ? nr - g0 : r->G, r->bits,
                          r->flat + g0, 1);
            for (int i = 0; i < nr; i++)
                ref_row(r->q, r, i / n, i % n)[c] = r->flat[i];
        }
    }
    r->nq = n;
}

/* X[t][h][D]: token t of head h. */
static const float *xrow(const float *X, const struct ref *r, int t, int h)
{
    return X + ((size_t)t * r->H + h) * r->D;
}

static void ref_set_f(struct ref *r, const float *X, int t0, int t1)
{
    for (int h = 0; h < r->H; h++)
        for (int t = t0; t < t1; t++)
            memcpy(ref_row(r->f, r, h, t - t0), xrow(X, r, t, h), sizeof(float) * r->D);
    r->nf = t1 - t0;
}

/* The prefill of L tokens (families.md 1.1 and 1.2, branch by branch). */
static void ref_prefill(struct ref *r, const float *X, int L)
{
    int R = r->R, rem = L % R;
    if (r->rule == REF_KIVI_K) {
        int nq = rem != 0 && L < R ? 0 : rem != 0 ? L - rem : L;
        ref_set_f(r, X, 0, nq); /* staged as a block, then quantised */
        ref_push_keys(r, r->f, nq);
        ref_set_f(r, X, nq, L);
    } else if (r->rule == REF_WINDOW) {
        int nq = L <= R ? 0 : L - R;
        for (; r->nq < nq; r->nq++)
            for (int h = 0; h < r->H; h++)
                ref_push_token(r, h, xrow(X, r, r->nq, h));
        ref_set_f(r, X, nq, L);
    } else { /* first call: quantise ALL of the prefill, no residual */
        for (int h = 0; h < r->H; h++)
            for (int t = 0; t < L; t++)
                memcpy(ref_row(r->cat, r, h, t), xrow(X, r, t, h), sizeof(float) * r->D);
        ref_requant(r, L);
        r->nf = 0;
    }
}

/* Decode token t enters the full-precision list (before attention). */
static void ref_append(struct ref *r, const float *X, int t)
{
    for (int h = 0; h < r->H; h++)
        memcpy(ref_row(r->f, r, h, r->nf), xrow(X, r, t, h), sizeof(float) * r->D);
    r->nf++;
}

/* After the step's attention. */
static void ref_after_attention(struct ref *r)
{
    if (r->rule == REF_KIVI_K && r->nf == r->R) { /* Kq.append(quantK(Kf)); Kf = [] */
        ref_push_keys(r, r->f, r->nf);
        r->nf = 0;
    } else if (r->rule == REF_WINDOW && r->nf > r->R) { /* Vq.append(quantV(Vf[0])) */
        for (int h = 0; h < r->H; h++) {
            ref_push_token(r, h, ref_row(r->f, r, h, 0));
            memmove(ref_row(r->f, r, h, 0), ref_row(r->f, r, h, 1),
                    sizeof(float) * (size_t)(r->nf - 1) * r->D);
        }
        r->nq++;
        r->nf--;
    } else if (r->rule == REF_HF && r->nf >= r->R) { /* |residual| + 1 >= R: flush */
        int n = r->nq + r->nf;
        for (int h = 0; h < r->H; h++) {
            memcpy(ref_row(r->cat, r, h, 0), ref_row(r->q, r, h, 0),
                   sizeof(float) * (size_t)r->nq * r->D);
            memcpy(ref_row(r->cat, r, h, r->nq), ref_row(r->f, r, h, 0),
                   sizeof(float) * (size_t)r->nf * r->D);
        }
        ref_requant(r, n);
        r->nf = 0;
    }
}

/* ---- the codec, driven as fk_drive drives it ----------------------------------------- */

struct drive {
    const struct fk_codec_ops *ops;
    void *opts;                  /* owned: freed by drive_close */
    void *st[2];
    int H, D, T, P;
    const float *X[2];           /* K and V, [T][H][D] */
    struct fk_sched_iter it[2];
    struct fk_sched_event ev[2]; /* the next decode event of each kind */
    int has[2];
    int n_comp[2];               /* tokens handed over per head */
    int mode[2];                 /* the buffer rule of each kind */
    int block_events;            /* BLOCK / BLOCK_ALL decode events seen */
    struct fk_vec_out *out[2];   /* [T][H] what encode() reported for each vector */
    int last[2][2];              /* tokens first, end of each kind's last event */
};

static void encode_event(struct drive *d, int k, const struct fk_sched_event *e)
{
    int n = (e->end - e->first) * d->H;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)n);
    int32_t *head = malloc(sizeof(int32_t) * (size_t)n);
    struct fk_vec_out *out = d->out[k] + (size_t)e->first * d->H;
    ck_assert(tok && head);
    for (int i = 0; i < n; i++) {
        tok[i] = e->first + i / d->H;
        head[i] = i % d->H;
    }
    struct fk_event ev = {.phase = e->phase, .step = e->step, .n = n,
                          .x = d->X[k] + (size_t)e->first * d->H * d->D, .token = tok,
                          .head = head};
    int rc = d->ops->encode(d->st[k], &ev, out);
    REQUIRE(rc == FK_OK, "%s %c: encode of tokens %d..%d: %s", d->ops->name, "KV"[k], e->first,
            e->end - 1, fk_errmsg());
    for (int i = 0; i < n; i++)
        REQUIRE(isfinite(out[i].err) && out[i].nnz == d->D, "%s: vector %d: err %g nnz %d",
                d->ops->name, i, out[i].err, out[i].nnz);
    d->n_comp[k] = e->end;
    d->last[k][0] = e->first;
    d->last[k][1] = e->end;
    free(tok);
    free(head);
}

/* Opens K and V and hands over the prefill events. */
static void drive_open(struct drive *d, const struct fk_codec_ops *ops, void *opts, int H,
                       int D, int T, int P, const float *K, const float *V)
{
    *d = (struct drive){.ops = ops, .opts = opts, .H = H, .D = D, .T = T, .P = P,
                        .X = {K, V}};
    for (int k = 0; k < 2; k++) {
        d->out[k] = calloc((size_t)T * H + 1, sizeof(struct fk_vec_out));
        ck_assert_ptr_nonnull(d->out[k]);
    }
    REQUIRE(!ops->check || ops->check(opts, D, 0) == FK_OK, "%s: check: %s", ops->name,
            fk_errmsg());
    for (int k = 0; k < 2; k++) {
        struct fk_stream_env env = {.kind = k, .head_dim = D, .n_heads = H, .n_tokens = T};
        REQ_OK(ops->open(opts, &env, &d->st[k]));
        struct fk_buffer b;
        fk_codec_buffer(ops, opts, k, &b);
        d->mode[k] = b.mode;
        struct fk_sched s = {.n_tokens = T, .prompt_len = P, .n_b = b.n_b, .a_len = b.a_len,
                             .mode = b.mode};
        fk_sched_begin(&d->it[k], &s);
        d->has[k] = fk_sched_next(&d->it[k], &d->ev[k]);
        if (d->has[k] && d->ev[k].phase == 0) {
            encode_event(d, k, &d->ev[k]);
            d->has[k] = fk_sched_next(&d->it[k], &d->ev[k]);
        }
    }
}

/* Decode step t's events, after its attention: K's, then V's. */
static void drive_step(struct drive *d, int t)
{
    for (int k = 0; k < 2; k++) {
        if (!d->has[k] || d->ev[k].step != t - d->P)
            continue;
        if (d->mode[k] != FK_BUF_SLIDE) { /* a block ends with the step's own token */
            REQUIRE(d->ev[k].end == t + 1, "block event of step %d ends at token %d",
                    t - d->P, d->ev[k].end - 1);
            d->block_events++;
        }
        encode_event(d, k, &d->ev[k]);
        d->has[k] = fk_sched_next(&d->it[k], &d->ev[k]);
    }
}

static void drive_close(struct drive *d)
{
    for (int k = 0; k < 2; k++) {
        d->ops->close(d->st[k]);
        free(d->out[k]);
    }
    free(d->opts);
}

/* Every compressed row of stream k against the reference, bit for bit. */
static void compare(const struct drive *d, int k, const struct ref *r, int t)
{
    const char *what = k ? "V" : "K";
    REQUIRE(d->n_comp[k] == r->nq, "%s %s, step t = %d: %d tokens compressed, the reference "
            "has %d", d->ops->name, what, t, d->n_comp[k], r->nq);
    float *row = malloc(sizeof(float) * (size_t)d->D);
    ck_assert_ptr_nonnull(row);
    for (int h = 0; h < d->H; h++)
        for (int i = 0; i < r->nq; i++) {
            REQ_OK(d->ops->reconstruct(d->st[k], h, i, row));
            const float *want = r->q + ((size_t)h * r->T + i) * r->D;
            for (int c = 0; c < d->D; c++)
                REQUIRE(!memcmp(&row[c], &want[c], sizeof(float)), "%s %s, step t = %d: row "
                        "(head %d, token %d) channel %d reconstructs as %.9g, the reference "
                        "as %.9g", d->ops->name, what, t, h, i, c, row[c], want[c]);
        }
    free(row);
}

/* What encode() reported for the vectors of stream k's last event: the relative error of
 * the reference's row (as it stands right after that event), FK_VEC_ZERO for a zero one. */
static void check_reported(const struct drive *d, int k, const struct ref *r)
{
    for (int t = d->last[k][0]; t < d->last[k][1]; t++)
        for (int h = 0; h < d->H; h++) {
            const float *x = d->X[k] + ((size_t)t * d->H + h) * d->D;
            const float *y = r->q + ((size_t)h * r->T + t) * r->D;
            double e = 0, xx = 0;
            for (int c = 0; c < d->D; c++) {
                e += ((double)x[c] - y[c]) * ((double)x[c] - y[c]);
                xx += (double)x[c] * x[c];
            }
            const struct fk_vec_out *o = &d->out[k][(size_t)t * d->H + h];
            double want = xx > 0 ? sqrt(e / xx) : 0;
            REQUIRE(fabs(o->err - want) <= 1e-6 * (1 + want) && o->err_enc == o->err &&
                        !(o->flags & FK_VEC_ZERO) == (xx > 0),
                    "%s %c: vector (head %d, token %d) reports err %.8g (err_enc %.8g, flags "
                    "%u), its row's error is %.8g", d->ops->name, "KV"[k], h, t, o->err,
                    o->err_enc, o->flags, want);
        }
}

static double bytes_of(const struct drive *d, int k)
{
    struct fk_stream_stats st;
    d->ops->stats(d->st[k], &st);
    ck_assert(st.bytes_model == 0 && st.bytes_dict_seq == 0);
    return st.bytes_codes;
}

/* Rows of stream k whose reconstruction changed since snap (taken when n rows were
 * compressed); snap is then refreshed. */
static int changed_rows(const struct drive *d, int k, float *snap, int n_before)
{
    float *row = malloc(sizeof(float) * (size_t)d->D);
    ck_assert_ptr_nonnull(row);
    int changed = 0;
    for (int h = 0; h < d->H; h++)
        for (int i = 0; i < d->n_comp[k]; i++) {
            float *s = snap + ((size_t)h * d->T + i) * d->D;
            REQ_OK(d->ops->reconstruct(d->st[k], h, i, row));
            changed += i < n_before && memcmp(row, s, sizeof(float) * (size_t)d->D) != 0;
            memcpy(s, row, sizeof(float) * (size_t)d->D);
        }
    free(row);
    return changed;
}

/* ---- data ---------------------------------------------------------------------------- */

static uint64_t rng = 88172645463325252ull;

static double uniform01(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) * 0x1p-53;
}

static double gauss(void)
{
    double u = uniform01() + 1e-300, v = uniform01();
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

/* [T][H][D] fp16 values (the traces' precision): Gaussian, with an outlier channel. */
static float *random_kv(int T, int H, int D, double scale)
{
    float *x = malloc(sizeof(float) * (size_t)T * H * D);
    ck_assert_ptr_nonnull(x);
    for (size_t i = 0; i < (size_t)T * H * D; i++) {
        double v = scale * gauss() * (i % (size_t)D == 3 ? 8 : 1);
        x[i] = ref_half((float)v);
    }
    return x;
}

static void *opts_of(const struct fk_codec_ops *ops, const char *const *names,
                     const double *vals, int n)
{
    void *o = calloc(1, ops->opts_size);
    ck_assert_ptr_nonnull(o);
    fk_opts_defaults(ops, o);
    for (int i = 0; i < n; i++) {
        const struct fk_option *opt = fk_codec_option(ops, names[i]);
        REQUIRE(opt != NULL, "%s has no option %s", ops->name, names[i]);
        REQ_OK(fk_opts_set(ops, o, opt, vals[i]));
    }
    return o;
}

static void set_enum(const struct fk_codec_ops *ops, void *o, const char *name,
                     const char *choice)
{
    REQ_OK(fk_opts_set_enum(ops, o, fk_codec_option(ops, name), choice));
}

static const struct fk_codec_ops *codec(const char *name)
{
    const struct fk_codec_ops *ops = fk_codec_find(name);
    REQUIRE(ops != NULL, "codec %s is not registered", name);
    return ops;
}

/* The options bits, group and residual of kivi or quant, and quant's mode and axes (NULL:
 * the default). */
static void *qopts(const char *name, int bits, int G, int R, const char *mode,
                   const char *axis_k, const char *axis_v)
{
    const struct fk_codec_ops *ops = codec(name);
    void *o = opts_of(ops, (const char *const[]){"bits", "group", "residual"},
                      (const double[]){bits, G, R}, 3);
    const char *const keys[] = {"mode", "axis_k", "axis_v"}, *vals[] = {mode, axis_k, axis_v};
    for (int i = 0; i < 3; i++)
        if (vals[i])
            set_enum(ops, o, keys[i], vals[i]);
    return o;
}

/* ---- kivi against the KIVI state machine --------------------------------------------- */

/* One sequence through kivi and the reference; returns the decode steps that flushed a key
 * block. */
static int run_kivi(int H, int D, int T, int P, int G, int R, int bits, const float *K,
                    const float *V)
{
    struct drive d;
    drive_open(&d, codec("kivi"), qopts("kivi", bits, G, R, NULL, NULL, NULL), H, D, T, P, K,
               V);
    struct ref kr, vr;
    ref_init(&kr, REF_KIVI_K, H, D, T, G, R, bits, 0);
    ref_init(&vr, REF_WINDOW, H, D, T, G, R, bits, 0);
    ref_prefill(&kr, K, P);
    ref_prefill(&vr, V, P);
    check_reported(&d, 0, &kr);
    check_reported(&d, 1, &vr);
    for (int t = P; t < T; t++) {
        ref_append(&kr, K, t);
        ref_append(&vr, V, t);
        /* attention of step t: keys 0 .. R floor(t/R) - 1 and values 0 .. t-R-1 compressed
         * (the state machine by hand, as a check of the reference itself) */
        ck_assert_int_eq(kr.nq, t / R * R);
        ck_assert_int_eq(vr.nq, t > R ? t - R : 0);
        compare(&d, 0, &kr, t);
        compare(&d, 1, &vr, t);
        drive_step(&d, t);
        ref_after_attention(&kr);
        ref_after_attention(&vr);
        check_reported(&d, 0, &kr);
        check_reported(&d, 1, &vr);
    }
    compare(&d, 0, &kr, T);
    compare(&d, 1, &vr, T);
    /* families.md 1.1: D b/8 + 4 D/G per quantised row of either kind */
    double per_row = D * bits / 8.0 + 4.0 * D / G;
    REQUIRE(bytes_of(&d, 0) == per_row * kr.nq * H && bytes_of(&d, 1) == per_row * vr.nq * H,
            "kivi bytes K %.1f V %.1f, expected %.1f per row", bytes_of(&d, 0),
            bytes_of(&d, 1), per_row);
    int blocks = d.block_events;
    drive_close(&d);
    ref_free(&kr);
    ref_free(&vr);
    return blocks;
}

START_TEST(kivi_random_matches_reference)
{
    const int H = 2, D = 16;
    const int cases[][4] = {/* P, G, R, bits */
                            {5, 4, 8, 2},   {8, 4, 8, 2},   {13, 4, 8, 2},  {16, 4, 8, 4},
                            {13, 8, 16, 4}, {1, 4, 8, 4},   {40, 8, 16, 2}, {7, 2, 4, 2},
                            {3, 16, 16, 2}, {20, 4, 12, 3}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int P = cases[c][0], G = cases[c][1], R = cases[c][2], bits = cases[c][3];
        int T = P + 3 * R + R / 2 + 1;
        float *K = random_kv(T, H, D, 1.0), *V = random_kv(T, H, D, 0.5);
        int blocks = run_kivi(H, D, T, P, G, R, bits, K, V);
        /* key blocks end at the tokens t >= P with (t + 1) % R == 0 */
        int want = 0;
        for (int t = P; t < T; t++)
            want += (t + 1) % R == 0;
        REQUIRE(blocks == want, "case %zu: %d key blocks flushed in decode, expected %d", c,
                blocks, want);
        free(K);
        free(V);
    }
}
END_TEST

/* Groups of one value (constant channels over G keys, constant values over G channels)
 * come back exactly, never NaN; others mix in. Ties go to even. A zero value comes back as
 * zero, a zero key (token 13) as its channels' grid points; both are flagged FK_VEC_ZERO. */
START_TEST(kivi_hand_built_groups)
{
    const int H = 1, D = 8, G = 4, R = 4, P = 6, T = 20;
    static const float tie[4] = {0.0f, 0.5f, 2.5f, 3.0f};
    float *K = calloc((size_t)T * H * D, sizeof(float));
    float *V = calloc((size_t)T * H * D, sizeof(float));
    ck_assert(K && V);
    for (int t = 0; t < T; t++)
        for (int c = 0; c < D; c++) {
            /* keys: channels 0-3 constant within each group of 4 tokens; 4-7 vary */
            K[(size_t)t * D + c] = c < 4 ? (float)(c - 2) * 0.75f + (float)(t / G) * 0.125f
                                         : ref_half((float)gauss());
            /* values: the first 4 channels constant, the next 4 one tie pattern */
            V[(size_t)t * D + c] = c < 4 ? (float)t * 0.25f - 1.0f : tie[c - 4];
        }
    memset(K + (size_t)13 * D, 0, sizeof(float) * (size_t)D);
    memset(V + (size_t)9 * D, 0, sizeof(float) * (size_t)D);
    run_kivi(H, D, T, P, G, R, 2, K, V);
    /* the same cache read directly: constant groups exact, ties to even (2-bit, step 1:
     * 0.5 -> 0, 2.5 -> 2) */
    const struct fk_codec_ops *ops = codec("kivi");
    struct drive d;
    drive_open(&d, ops, qopts("kivi", 2, G, R, NULL, NULL, NULL), H, D, T, P, K, V);
    for (int t = P; t < T; t++)
        drive_step(&d, t);
    float row[8];
    ck_assert_int_eq(d.n_comp[0], 20); /* prefill 4, blocks ending at tokens 7, 11, 15, 19 */
    ck_assert_int_eq(d.n_comp[1], 16); /* T - R */
    for (int t = 0; t < 16; t++) {
        REQ_OK(ops->reconstruct(d.st[0], 0, t, row));
        for (int c = 0; t / G != 13 / G && c < 4; c++)
            REQUIRE(row[c] == K[(size_t)t * D + c], "constant key group: token %d channel %d "
                    "gives %g, not %g", t, c, row[c], K[(size_t)t * D + c]);
        for (int c = 0; c < D; c++)
            ck_assert(isfinite(row[c]));
        REQ_OK(ops->reconstruct(d.st[1], 0, t, row));
        for (int c = 0; c < 4; c++)
            REQUIRE(row[c] == V[(size_t)t * D + c], "constant value group: token %d gives %g",
                    t, row[c]);
        const float even[4] = {0.0f, 0.0f, 2.0f, 3.0f};
        for (int c = 4; t != 9 && c < 8; c++)
            REQUIRE(row[c] == even[c - 4], "tie value %g comes back as %g, not %g (half to "
                    "even)", V[(size_t)t * D + c], row[c], even[c - 4]);
    }
    drive_close(&d);
    free(K);
    free(V);
}
END_TEST

/* bytes_codes by hand: D = 8, G = 4, b = 2. A key group (4 tokens x 8 channels): 64 2-bit
 * codes = 8 bytes, 8 channels x (fp16 min + fp16 scale) = 32 bytes: 40 bytes per 4 keys. A
 * value: 8 codes = 2 bytes + 2 groups x 4 = 8 bytes: 10 bytes. H = 2, P = 9, R = 4, T = 9:
 * 8 keys of each head quantised (2 groups x 40 B), 5 values (5 x 10 B). D = 4, G = 2, b = 3:
 * 1.5 bytes of codes per row (fractional bytes are counted as such) + 8: 9.5 bytes. */
START_TEST(kivi_bytes_by_hand)
{
    const struct fk_codec_ops *ops = codec("kivi");
    float *K = random_kv(9, 2, 8, 1.0), *V = random_kv(9, 2, 8, 1.0);
    struct drive d;
    drive_open(&d, ops, qopts("kivi", 2, 4, 4, NULL, NULL, NULL), 2, 8, 9, 9, K, V);
    ck_assert_int_eq(d.n_comp[0], 8);
    ck_assert_int_eq(d.n_comp[1], 5);
    REQUIRE(bytes_of(&d, 0) == 2 * 2 * 40.0, "keys: %g bytes, not 160", bytes_of(&d, 0));
    REQUIRE(bytes_of(&d, 1) == 2 * 5 * 10.0, "values: %g bytes, not 100", bytes_of(&d, 1));
    drive_close(&d);
    free(K);
    free(V);
    K = random_kv(4, 1, 4, 1.0), V = random_kv(4, 1, 4, 1.0);
    drive_open(&d, ops, qopts("kivi", 3, 2, 2, NULL, NULL, NULL), 1, 4, 4, 4, K, V);
    ck_assert_int_eq(d.n_comp[0], 4);
    ck_assert_int_eq(d.n_comp[1], 2);
    REQUIRE(bytes_of(&d, 0) == 4 * 9.5 && bytes_of(&d, 1) == 2 * 9.5,
            "3-bit, D 4, G 2: %g and %g bytes, not 38 and 19", bytes_of(&d, 0),
            bytes_of(&d, 1));
    drive_close(&d);
    free(K);
    free(V);
}
END_TEST

/* ---- quant against QuantizedLayer.update and the sliding window ---------------------- */

/* One sequence through quant and the references (rule for both kinds); returns the rows
 * whose reconstruction changed at a flush, K and V summed. */
static int run_quant(const char *mode, const char *axis_k, const char *axis_v, int H, int D,
                     int T, int P, int G, int R, int bits)
{
    int hf = !strcmp(mode, "hf");
    float *K = random_kv(T, H, D, 1.0), *V = random_kv(T, H, D, 0.5);
    struct drive d;
    drive_open(&d, codec("quant"), qopts("quant", bits, G, R, mode, axis_k, axis_v), H, D, T,
               P, K, V);
    struct ref r[2];
    for (int k = 0; k < 2; k++) {
        ref_init(&r[k], hf ? REF_HF : REF_WINDOW, H, D, T, G, R, bits,
                 !strcmp(k ? axis_v : axis_k, "channel"));
        ref_prefill(&r[k], k ? V : K, P);
        check_reported(&d, k, &r[k]);
    }
    float *snap[2];
    int changed = 0;
    for (int k = 0; k < 2; k++) {
        snap[k] = calloc((size_t)H * T * D, sizeof(float));
        ck_assert_ptr_nonnull(snap[k]);
        changed_rows(&d, k, snap[k], 0);
    }
    for (int t = P; t < T; t++) {
        for (int k = 0; k < 2; k++) {
            ref_append(&r[k], k ? V : K, t);
            compare(&d, k, &r[k], t);
        }
        int before[2] = {d.n_comp[0], d.n_comp[1]};
        drive_step(&d, t);
        for (int k = 0; k < 2; k++) {
            ref_after_attention(&r[k]);
            check_reported(&d, k, &r[k]);
            changed += changed_rows(&d, k, snap[k], before[k]);
        }
    }
    for (int k = 0; k < 2; k++) {
        compare(&d, k, &r[k], T);
        free(snap[k]);
        ref_free(&r[k]);
    }
    drive_close(&d);
    free(K);
    free(V);
    return changed;
}

START_TEST(quant_hf_token_matches_reference)
{
    /* per-token groups re-quantise onto their own grid: a flush changes no stored row */
    ck_assert_int_eq(run_quant("hf", "token", "token", 2, 16, 60, 13, 8, 8, 4), 0);
    ck_assert_int_eq(run_quant("hf", "token", "token", 3, 16, 50, 4, 4, 5, 2), 0);
    ck_assert_int_eq(run_quant("hf", "token", "token", 2, 8, 30, 7, 8, 1, 3), 0);
}
END_TEST

START_TEST(quant_hf_channel_matches_reference)
{
    /* groups of G rows of [H][T_cur] straddle heads (T_cur % G != 0) and change at flushes */
    int changed = run_quant("hf", "channel", "token", 2, 16, 60, 13, 8, 8, 4);
    REQUIRE(changed > 0, "the flushes re-quantised no stored key (channel axis)");
    changed = run_quant("hf", "channel", "channel", 3, 8, 45, 5, 4, 6, 2);
    REQUIRE(changed > 0, "the flushes re-quantised no stored row (channel axes)");
    run_quant("hf", "token", "channel", 2, 16, 40, 16, 16, 16, 4);
}
END_TEST

START_TEST(quant_window_matches_reference)
{
    ck_assert_int_eq(run_quant("window", "token", "token", 2, 16, 60, 13, 8, 8, 4), 0);
    ck_assert_int_eq(run_quant("window", "token", "token", 2, 16, 40, 3, 4, 8, 2), 0);
    ck_assert_int_eq(run_quant("window", "token", "token", 1, 8, 30, 20, 8, 1, 8), 0);
}
END_TEST

/* bytes_codes by hand, quant mode hf, H = 2, D = 8, b = 4, P = 5, R = 4. Token axis, G = 4:
 * 5 tokens x 2 heads x (4 bytes of codes + 2 groups x 4 bytes) = 120. Channel axis, G = 4:
 * the 10 rows of [2][5] make 3 groups per channel (4, 4 and 2 rows), 8 x 3 x 4 = 96 bytes,
 * plus 10 x 4 bytes of codes = 136; after one flush (T_cur = 9, 18 rows: 5 groups)
 * 8 x 5 x 4 + 18 x 4 = 232. */
START_TEST(quant_bytes_by_hand)
{
    float *K = random_kv(9, 2, 8, 1.0), *V = random_kv(9, 2, 8, 1.0);
    struct drive d;
    drive_open(&d, codec("quant"), qopts("quant", 4, 4, 4, NULL, "channel", NULL), 2, 8, 9, 5,
               K, V);
    ck_assert_int_eq(d.n_comp[0], 5);
    REQUIRE(bytes_of(&d, 0) == 136, "channel axis after the prefill: %g bytes, not 136",
            bytes_of(&d, 0));
    REQUIRE(bytes_of(&d, 1) == 120, "token axis after the prefill: %g bytes, not 120",
            bytes_of(&d, 1));
    for (int t = 5; t < 9; t++)
        drive_step(&d, t);
    ck_assert_int_eq(d.n_comp[0], 9);
    REQUIRE(bytes_of(&d, 0) == 232, "channel axis after a flush: %g bytes, not 232",
            bytes_of(&d, 0));
    REQUIRE(bytes_of(&d, 1) == 216, "token axis after a flush: %g bytes, not 9 x 24",
            bytes_of(&d, 1));
    drive_close(&d);
    free(K);
    free(V);
}
END_TEST

/* mode window, residual 0: the prefill wholly quantised; the engine's SLIDE rule with
 * n_b = 0 hands a decode token over at the next step. */
START_TEST(quant_window_without_residual)
{
    float *K = random_kv(12, 1, 8, 1.0), *V = random_kv(12, 1, 8, 1.0);
    struct drive d;
    drive_open(&d, codec("quant"), qopts("quant", 4, 8, 0, "window", NULL, NULL), 1, 8, 12, 6,
               K, V);
    ck_assert_int_eq(d.n_comp[0], 6);
    for (int t = 6; t < 12; t++) {
        ck_assert_int_eq(d.n_comp[0], t > 6 ? t - 1 : 6);
        drive_step(&d, t);
    }
    ck_assert_int_eq(d.n_comp[1], 11);
    drive_close(&d);
    free(K);
    free(V);
}
END_TEST

/* ---- refusals ------------------------------------------------------------------------ */

static void expect_msg(int rc, const char *const *words, int n)
{
    REQUIRE(rc < 0, "accepted (expected a refusal mentioning '%s')", words[0]);
    for (int i = 0; i < n; i++)
        REQUIRE(strstr(fk_errmsg(), words[i]) != NULL, "message '%s' lacks '%s'", fk_errmsg(),
                words[i]);
}

START_TEST(refusals)
{
    const char *names[] = {"kivi", "quant"};
    for (int c = 0; c < 2; c++) {
        const struct fk_codec_ops *ops = codec(names[c]);
        void *o = opts_of(ops, NULL, NULL, 0);
        const struct fk_option *bits = fk_codec_option(ops, "bits");
        fk_err_clear();
        expect_msg(fk_opts_set(ops, o, bits, 0), (const char *const[]){"bits", "0"}, 2);
        expect_msg(fk_opts_set(ops, o, bits, 9), (const char *const[]){"bits", "9"}, 2);
        REQ_OK(fk_opts_set(ops, o, fk_codec_option(ops, "group"), 32));
        REQ_OK(ops->check(o, 0, 0)); /* head_dim not known yet */
        REQ_OK(ops->check(o, 64, 0));
        expect_msg(ops->check(o, 48, 0), (const char *const[]){"group", "32", "head_dim 48"},
                   3);
        REQ_OK(fk_opts_set(ops, o, fk_codec_option(ops, "group"), 1));
        expect_msg(ops->check(o, 64, 0), (const char *const[]){"group", "1"}, 2);
        free(o);
    }
    const struct fk_codec_ops *kivi = codec("kivi");
    void *o = opts_of(kivi, (const char *const[]){"group", "residual"},
                      (const double[]){32, 48}, 2);
    expect_msg(kivi->check(o, 64, 0), (const char *const[]){"residual", "48", "multiple",
               "group", "32"}, 5);
    free(o);
    const struct fk_codec_ops *quant = codec("quant");
    o = opts_of(quant, NULL, NULL, 0);
    set_enum(quant, o, "mode", "window");
    set_enum(quant, o, "axis_k", "channel");
    expect_msg(quant->check(o, 64, 0), (const char *const[]){"axis_k", "mode", "hf", "kivi"},
               4);
    set_enum(quant, o, "axis_k", "token");
    set_enum(quant, o, "axis_v", "channel");
    expect_msg(quant->check(o, 64, 0), (const char *const[]){"axis_v", "mode"}, 2);
    set_enum(quant, o, "mode", "hf");
    set_enum(quant, o, "axis_k", "channel");
    REQ_OK(quant->check(o, 48, 0)); /* channel groups need not divide head_dim */
    set_enum(quant, o, "axis_k", "token");
    set_enum(quant, o, "axis_v", "token");
    REQ_OK(fk_opts_set(quant, o, fk_codec_option(quant, "residual"), 0));
    expect_msg(quant->check(o, 64, 0), (const char *const[]){"residual", "hf"}, 2);
    free(o);
}
END_TEST

/* encode() refuses what the buffer rules never hand over: a partial key group (kivi), heads
 * flushed apart (quant hf), tokens out of order; nothing is stored then. */
START_TEST(encode_refusals)
{
    float x[3 * 2 * 8];
    for (int i = 0; i < 48; i++)
        x[i] = (float)(i % 7) - 3;
    int32_t tok[6] = {0, 0, 1, 1, 2, 2}, head[6] = {0, 1, 0, 1, 0, 1};
    struct fk_vec_out out[6];
    struct fk_stream_env env = {.kind = 0, .head_dim = 8, .n_heads = 2, .n_tokens = 8};
    const struct fk_codec_ops *kivi = codec("kivi");
    void *o = opts_of(kivi, (const char *const[]){"group", "residual"},
                      (const double[]){2, 4}, 2);
    void *st = NULL;
    REQ_OK(kivi->open(o, &env, &st));
    struct fk_event ev = {.phase = 0, .step = -1, .n = 6, .x = x, .token = tok, .head = head};
    expect_msg(kivi->encode(st, &ev, out), (const char *const[]){"whole groups", "group"}, 2);
    float row[8];
    ck_assert_int_lt(kivi->reconstruct(st, 0, 0, row), 0);
    ev.n = 4;
    REQ_OK(kivi->encode(st, &ev, out)); /* 2 keys per head: one group */
    REQ_OK(kivi->reconstruct(st, 1, 1, row));
    kivi->close(st);
    free(o);
    const struct fk_codec_ops *quant = codec("quant");
    o = opts_of(quant, NULL, NULL, 0);
    REQ_OK(fk_opts_set(quant, o, fk_codec_option(quant, "group"), 4));
    REQ_OK(quant->open(o, &env, &st));
    ev.n = 5; /* head 0 three tokens, head 1 two */
    expect_msg(quant->encode(st, &ev, out), (const char *const[]){"head 1", "flushed"}, 2);
    int32_t late[2] = {1, 1};
    struct fk_event skip = {.phase = 1, .step = 0, .n = 2, .x = x, .token = late, .head = head};
    expect_msg(quant->encode(st, &skip, out), (const char *const[]){"out of order"}, 1);
    ck_assert_int_lt(quant->reconstruct(st, 0, 0, row), 0);
    quant->close(st);
    free(o);
}
END_TEST

static Suite *quant_suite(void)
{
    Suite *s = suite_create("quant_families");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, kivi_random_matches_reference);
    tcase_add_test(tc, kivi_hand_built_groups);
    tcase_add_test(tc, kivi_bytes_by_hand);
    tcase_add_test(tc, quant_hf_token_matches_reference);
    tcase_add_test(tc, quant_hf_channel_matches_reference);
    tcase_add_test(tc, quant_window_matches_reference);
    tcase_add_test(tc, quant_bytes_by_hand);
    tcase_add_test(tc, quant_window_without_residual);
    tcase_add_test(tc, refusals);
    tcase_add_test(tc, encode_refusals);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return fk_suite_run(quant_suite());
}
