/* SPDX-License-Identifier: MIT
 * Synthetic KV-cache trace generator (model: datasets/SYNTH.md).
 *
 * Per (layer, KV head, kind) the "model" is a latent orthonormal basis B0 [r x d], a
 * spectrum sigma [r], a mean [d] and, for keys, outlier RoPE pairs with a fixed bias and a
 * sink direction. Per sequence, each token t draws heavy-tailed latent coefficients c_t and
 * the pre-RoPE vector is mean + sum_j sigma_j c_tj (cos a_t B0_j + sin a_t N_j) + noise
 * (+ outlier bias for keys), where N is a sequence-specific drift basis orthogonal to B0 and
 * a_t = drift_rate * (decode step). Keys are then rotated by RoPE. Queries reuse the key
 * basis of their KV head, aim at a (mostly recent) target key's latent, and are scaled so
 * that the logit spread and the sink mass hit their targets on a few probe rows.
 * Internals run in double; outputs are float.
 */
#include "gen/fk_synth.h"
#include "gen/fk_synth_fit.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gsl/gsl_randist.h>
#include <gsl/gsl_rng.h>

#include "common/fk_err.h"
#include "common/fk_sha256.h"

#define SYNTH_VERSION "fk_synth 1"
#define N_PROBES 16          /* query rows used to calibrate each query head */
#define MAX_T (1 << 24)      /* trace reader limit */
#define FK_PI 3.14159265358979323846
#define SINK_CONTENT 0.2     /* latent + noise scale of the sink key (token 0) */

/* ---- knob table ---------------------------------------------------------------------- */

#define KI(n, f, d, lo, hi, h) {n, FK_SYNTH_INT, offsetof(struct fk_synth_opts, f), d, lo, hi, h}
#define KD(n, f, d, lo, hi, h) \
    {n, FK_SYNTH_DOUBLE, offsetof(struct fk_synth_opts, f), d, lo, hi, h}
#define KU(n, f, d, h) {n, FK_SYNTH_U64, offsetof(struct fk_synth_opts, f), d, 0, 9e15, h}

static const struct fk_synth_knob knobs[] = {
    KI("layers", n_layers, 28, 1, 4096, "transformer layers L"),
    KI("q_heads", n_q_heads, 24, 1, 4096, "query heads H_q (multiple of kv_heads)"),
    KI("kv_heads", n_kv_heads, 8, 1, 4096, "KV heads H_kv"),
    KI("head_dim", head_dim, 128, 2, 4096, "head dimension d (even: RoPE pairs)"),
    KI("prefill", prefill, 512, 0, MAX_T, "prefill tokens P (token 0 is the sink)"),
    KI("decode", decode, 1024, 0, MAX_T, "decode tokens D"),
    KU("seed", seed, 1, "content seed (with the sequence index)"),
    KU("model_seed", model_seed, 1, "synthetic-model seed (bases, outliers, sinks)"),
    KI("queries", queries, 1, 0, 1, "write queries (1) or not (0)"),
    KI("query_stride", query_stride, 1, 1, MAX_T, "one query row every N tokens"),
    KI("prefill_queries", prefill_queries, 0, 0, 1,
       "1: also every prefill token's query (eviction policies; other rows unchanged)"),
    KI("rope", rope, 1, 0, 1, "apply RoPE to keys and queries"),
    KD("rope_theta", rope_theta, 500000, 1, 1e12, "RoPE base theta"),
    KI("rope_half", rope_half, 0, 0, 1, "RoPE pairs: 0 = (2i,2i+1), 1 = (i,i+d/2)"),
    KI("key_rank", key_rank, 20, 1, 4096, "latent rank of keys per head"),
    KD("key_decay", key_decay, 0.5, 0, 8, "key latent std ~ (j+1)^-decay"),
    KD("key_noise", key_noise, 0.15, 0, 100, "key isotropic noise std per channel"),
    KD("key_mean", key_mean, 0.5, 0, 100, "key mean norm / sqrt(d)"),
    KD("key_freq_tilt", key_freq_tilt, 1.5, -20, 20, "key energy tilt to low-frequency pairs"),
    KI("key_outlier_pairs", key_outlier_pairs, 2, 0, 2048, "outlier RoPE pairs per head"),
    KD("key_outlier_scale", key_outlier_scale, 6, 0, 1e4, "outlier channel magnitude"),
    KD("key_outlier_jitter", key_outlier_jitter, 0.1, 0, 10, "outlier per-token rel. std"),
    KI("value_rank", value_rank, 48, 1, 4096, "latent rank of values per head"),
    KD("value_decay", value_decay, 0.3, 0, 8, "value latent std ~ (j+1)^-decay"),
    KD("value_noise", value_noise, 0.35, 0, 100, "value isotropic noise std per channel"),
    KD("value_mean", value_mean, 0.2, 0, 100, "value mean norm / sqrt(d)"),
    KD("coef_dof", coef_dof, 7, 0, 1e6, "Student-t dof of latent coefficients (0 = Gauss)"),
    KD("seq_jitter", seq_jitter, 0.3, 0, 5, "per-sequence log-normal latent weight std"),
    KD("drift_rate", drift_rate, 3e-4, 0, 10, "latent basis turn per decode step (rad)"),
    KD("sink_key_scale", sink_key_scale, 3, 0, 1e4, "sink key extra norm (typical norms)"),
    KD("sink_value_scale", sink_value_scale, 0.1, 0, 100, "sink value scale"),
    KD("sink_mass", sink_mass, 0.4, 0, 0.999, "target median attention mass on token 0"),
    KD("attn_logit_std", attn_logit_std, 3, 0, 100, "target std of non-sink logits"),
    KD("query_target_mix", query_target_mix, 0.5, 0, 1, "query weight on a target key"),
    KD("query_recent_frac", query_recent_frac, 0.5, 0, 1, "targets from the recent window"),
    KI("query_recent_window", query_recent_window, 64, 1, MAX_T, "recent window (tokens)"),
    KD("query_noise", query_noise, 0.2, 0, 100, "query noise relative to its signal"),
};

#define N_KNOBS ((int)(sizeof knobs / sizeof knobs[0]))

const struct fk_synth_knob *fk_synth_knobs(int *count)
{
    *count = N_KNOBS;
    return knobs;
}

static void knob_put(struct fk_synth_opts *o, const struct fk_synth_knob *k, double v)
{
    char *p = (char *)o + k->offset;
    if (k->type == FK_SYNTH_INT) {
        int x = (int)v;
        memcpy(p, &x, sizeof x);
    } else if (k->type == FK_SYNTH_U64) {
        uint64_t x = (uint64_t)v;
        memcpy(p, &x, sizeof x);
    } else {
        memcpy(p, &v, sizeof v);
    }
}

static void knob_text(const struct fk_synth_opts *o, const struct fk_synth_knob *k, char *buf,
                      size_t cap)
{
    const char *p = (const char *)o + k->offset;
    if (k->type == FK_SYNTH_INT) {
        int x;
        memcpy(&x, p, sizeof x);
        snprintf(buf, cap, "%d", x);
    } else if (k->type == FK_SYNTH_U64) {
        uint64_t x;
        memcpy(&x, p, sizeof x);
        snprintf(buf, cap, "%llu", (unsigned long long)x);
    } else {
        double x;
        memcpy(&x, p, sizeof x);
        snprintf(buf, cap, "%.17g", x);
    }
}

struct shape {
    const char *name;        /* table name */
    int layers, q_heads, kv_heads, head_dim; /* L, H_q, H_kv, d */
    double theta;            /* rope base */
};

static const struct shape shapes[] = {
    {"llama-3.2-3b", 28, 24, 8, 128, 500000},
    {"llama-3.1-8b", 32, 32, 8, 128, 500000},
    {"qwen3-4b", 36, 32, 8, 128, 1000000},
};

#define N_SHAPES ((int)(sizeof shapes / sizeof shapes[0]))

void fk_synth_defaults(struct fk_synth_opts *o)
{
    memset(o, 0, sizeof *o);
    for (int i = 0; i < N_KNOBS; i++)
        knob_put(o, &knobs[i], knobs[i].def);
    o->encoding = FK_ENC_F16;
}

int fk_synth_set_shape(struct fk_synth_opts *o, const char *name)
{
    for (int i = 0; i < N_SHAPES; i++) {
        if (strcmp(shapes[i].name, name))
            continue;
        o->n_layers = shapes[i].layers;
        o->n_q_heads = shapes[i].q_heads;
        o->n_kv_heads = shapes[i].kv_heads;
        o->head_dim = shapes[i].head_dim;
        o->rope_theta = shapes[i].theta;
        return FK_OK;
    }
    return fk_err(FK_EINVAL, "shape \"%s\": expected llama-3.2-3b, llama-3.1-8b or qwen3-4b",
                  name);
}

int fk_synth_set(struct fk_synth_opts *o, const char *name, const char *value)
{
    char key[64];
    size_t n = strlen(name);
    if (n >= sizeof key)
        return fk_err(FK_EINVAL, "synth knob \"%s\": unknown", name);
    for (size_t i = 0; i <= n; i++)
        key[i] = name[i] == '-' ? '_' : name[i];
    for (int i = 0; i < N_KNOBS; i++) {
        const struct fk_synth_knob *k = &knobs[i];
        if (strcmp(k->name, key))
            continue;
        char *end = NULL;
        double v = strtod(value, &end);
        if (!*value || *end || !isfinite(v))
            return fk_err(FK_EINVAL, "synth knob %s = \"%s\": expected a number", key, value);
        if (k->type != FK_SYNTH_DOUBLE && v != floor(v))
            return fk_err(FK_EINVAL, "synth knob %s = \"%s\": expected an integer", key,
                          value);
        if (v < k->min || v > k->max)
            return fk_err(FK_EINVAL, "synth knob %s = %s: expected a value in [%g, %g]", key,
                          value, k->min, k->max);
        knob_put(o, k, v);
        return FK_OK;
    }
    return fk_err(FK_EINVAL, "synth knob \"%s\": unknown (see datasets/SYNTH.md)", name);
}

static const char *const enc_names[] = {"float32", "float16", "bfloat16"};

int fk_synth_parse_encoding(const char *s, enum fk_encoding *out)
{
    for (int i = 0; i < 3; i++)
        if (!strcmp(s, enc_names[i])) {
            *out = (enum fk_encoding)i;
            return FK_OK;
        }
    return fk_err(FK_EINVAL, "encoding \"%s\": expected float32, float16 or bfloat16", s);
}

int fk_synth_validate(const struct fk_synth_opts *o)
{
    for (int i = 0; i < N_KNOBS; i++) {
        const struct fk_synth_knob *k = &knobs[i];
        const char *p = (const char *)o + k->offset;
        double v;
        if (k->type == FK_SYNTH_INT) {
            int x;
            memcpy(&x, p, sizeof x);
            v = x;
        } else if (k->type == FK_SYNTH_U64) {
            continue;
        } else {
            memcpy(&v, p, sizeof v);
        }
        if (!(v >= k->min && v <= k->max))
            return fk_err(FK_EINVAL, "synth knob %s = %g: expected a value in [%g, %g]",
                          k->name, v, k->min, k->max);
    }
    int d = o->head_dim;
    if (o->n_q_heads % o->n_kv_heads)
        return fk_err(FK_EINVAL, "synth: q_heads = %d is not a multiple of kv_heads = %d",
                      o->n_q_heads, o->n_kv_heads);
    if ((long)o->prefill + o->decode > MAX_T)
        return fk_err(FK_EINVAL, "synth: prefill + decode = %ld tokens, limit %d",
                      (long)o->prefill + o->decode, MAX_T);
    if (d % 2)
        return fk_err(FK_EINVAL, "synth: head_dim = %d: expected an even size (RoPE pairs)",
                      d);
    if (o->key_rank > d || o->value_rank > d)
        return fk_err(FK_EINVAL, "synth: key_rank = %d, value_rank = %d: expected ranks <= "
                      "head_dim = %d (pass --key-rank/--value-rank)",
                      o->key_rank, o->value_rank, d);
    int np = d / 2;
    if (o->key_outlier_pairs > np - np / 2)
        return fk_err(FK_EINVAL, "synth: key_outlier_pairs = %d: expected at most %d (the "
                      "low-frequency half of the %d RoPE pairs)",
                      o->key_outlier_pairs, np - np / 2, np);
    if (o->coef_dof != 0 && o->coef_dof <= 2)
        return fk_err(FK_EINVAL, "synth: coef_dof = %g: expected 0 (Gaussian) or > 2 (finite "
                      "variance)", o->coef_dof);
    if ((unsigned)o->encoding > FK_ENC_BF16)
        return fk_err(FK_EINVAL, "synth: encoding %d unknown", (int)o->encoding);
    return FK_OK;
}

void fk_synth_shape_name(const struct fk_synth_opts *o, char *buf, size_t cap)
{
    for (int i = 0; i < N_SHAPES; i++) {
        const struct shape *s = &shapes[i];
        if (s->layers == o->n_layers && s->q_heads == o->n_q_heads &&
            s->kv_heads == o->n_kv_heads && s->head_dim == o->head_dim &&
            s->theta == o->rope_theta) {
            snprintf(buf, cap, "%s", s->name);
            return;
        }
    }
    snprintf(buf, cap, "custom-L%d-q%d-kv%d-d%d", o->n_layers, o->n_q_heads, o->n_kv_heads,
             o->head_dim);
}

void fk_synth_file_name(const struct fk_synth_opts *o, int seq_index, char *buf, size_t cap)
{
    char shape[96];
    fk_synth_shape_name(o, shape, sizeof shape);
    snprintf(buf, cap, "synth-%s-s%llu-%d.h5", shape, (unsigned long long)o->seed, seq_index);
}

static int query_start(const struct fk_synth_opts *o)
{
    return o->decode > 0 ? o->prefill : 1;
}

/* The rows of the decode range (query_start on, every query_stride tokens). */
static int n_range_queries(const struct fk_synth_opts *o)
{
    int T = o->prefill + o->decode, s = query_start(o);
    if (!o->queries || T <= s)
        return 0;
    return (T - s + o->query_stride - 1) / o->query_stride;
}

/* The rows of the prefill range (prefill_queries: tokens 0 .. query_start-1), first. */
static int n_prefill_queries(const struct fk_synth_opts *o)
{
    return o->queries && o->prefill_queries ? query_start(o) : 0;
}

int fk_synth_n_queries(const struct fk_synth_opts *o)
{
    return n_prefill_queries(o) + n_range_queries(o);
}

void fk_synth_info(const struct fk_synth_opts *o, struct fk_trace_info *in)
{
    char shape[96];
    memset(in, 0, sizeof *in);
    fk_synth_shape_name(o, shape, sizeof shape);
    snprintf(in->model_id, sizeof in->model_id, "synthetic-%s", shape);
    snprintf(in->source, sizeof in->source, "synthetic");
    in->n_layers = o->n_layers;
    in->n_q_heads = o->n_q_heads;
    in->n_kv_heads = o->n_kv_heads;
    in->head_dim = o->head_dim;
    in->n_tokens = o->prefill + o->decode;
    in->prompt_len = o->prefill;
    in->keys_post_rope = o->rope;
    in->rope_theta = o->rope_theta;
    /* rope_apply(): pairs by rope_half, f_i = theta^(-2i/d), position = token index */
    in->has_rope = o->rope;
    in->rope = (struct fk_rope){.theta = o->rope_theta,
                                .layout = o->rope_half ? FK_ROPE_HALF : FK_ROPE_INTERLEAVED,
                                .type = FK_ROPE_DEFAULT};
    in->n_queries = fk_synth_n_queries(o);
    in->has_queries = in->n_queries > 0;
}

/* ---- random streams ------------------------------------------------------------------ */

enum purpose { P_MODEL = 0, P_CONTENT = 1, P_QUERY = 2, P_QUERY_PREFILL = 3, P_N = 4 };

/* Seed of one stream: first 4 bytes (big-endian) of
 * SHA-256("fk_synth/v1/<purpose>/<seed>/<seq>/<layer>/<head>/<kind>"); seq = -1 for the
 * model, which is shared by all sequences. */
static gsl_rng *stream(enum purpose p, uint64_t seed, int seq, int layer, int head, int kind)
{
    static const char *const pn[] = {"model", "content", "query", "query-prefill"};
    _Static_assert(sizeof pn / sizeof *pn == P_N, "one stream name per purpose");
    char text[160];
    uint8_t dg[32];
    int n = snprintf(text, sizeof text, "fk_synth/v1/%s/%llu/%d/%d/%d/%d", pn[p],
                     (unsigned long long)seed, seq, layer, head, kind);
    fk_sha256(text, (size_t)n, dg);
    unsigned long s = ((unsigned long)dg[0] << 24) | ((unsigned long)dg[1] << 16) |
                      ((unsigned long)dg[2] << 8) | dg[3];
    gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
    if (r)
        gsl_rng_set(r, s);
    return r;
}

/* Unit-variance heavy-tailed draw: Student-t(dof) / sqrt(dof/(dof-2)), or N(0,1). */
static double coef_draw(gsl_rng *r, double dof)
{
    if (dof == 0)
        return gsl_ran_gaussian_ziggurat(r, 1.0);
    return gsl_ran_tdist(r, dof) / sqrt(dof / (dof - 2));
}

/* ---- geometry helpers ---------------------------------------------------------------- */

/* RoPE pair index of channel c and the two channels of pair i. */
static int pair_of(int c, int d, int half)
{
    return half ? c % (d / 2) : c / 2;
}

static void pair_channels(int i, int d, int half, int *a, int *b)
{
    *a = half ? i : 2 * i;
    *b = half ? i + d / 2 : 2 * i + 1;
}

/* Energy weight of pair i: exp(tilt * (i/(np-1) - 1)), 1 at the lowest frequency. */
static double tilt_weight(int i, int np, double tilt)
{
    return np > 1 ? exp(tilt * ((double)i / (np - 1) - 1.0)) : 1.0;
}

static double dot(const double *a, const double *b, int n)
{
    double s = 0;
    for (int i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* Orthonormalises rows first..count-1 of v [count x d] against all previous rows (two
 * passes of modified Gram-Schmidt). Returns -1 if a row is numerically dependent. */
static int orthonormalise(double *v, int first, int count, int d)
{
    for (int j = first; j < count; j++) {
        double *x = v + (size_t)j * d;
        for (int pass = 0; pass < 2; pass++)
            for (int k = 0; k < j; k++) {
                const double *y = v + (size_t)k * d;
                double p = dot(x, y, d);
                for (int c = 0; c < d; c++)
                    x[c] -= p * y[c];
            }
        double nrm = sqrt(dot(x, x, d));
        if (nrm < 1e-9)
            return -1;
        for (int c = 0; c < d; c++)
            x[c] /= nrm;
    }
    return 0;
}

/* Rotates x [d] in place by RoPE at the angles of one position (cs/sn: [d/2]). */
static void rope_apply(double *x, const double *cs, const double *sn, int d, int half)
{
    for (int i = 0; i < d / 2; i++) {
        int a, b;
        pair_channels(i, d, half, &a, &b);
        double xa = x[a], xb = x[b];
        x[a] = xa * cs[i] - xb * sn[i];
        x[b] = xa * sn[i] + xb * cs[i];
    }
}

/* ---- one (layer, head, kind) stream -------------------------------------------------- */

struct head {
    int d;                   /* head dimension */
    int r;                   /* latent rank */
    int r_drift;             /* basis vectors that drift (min(r, d - r)) */
    double *basis;           /* [r + r_drift][d]: rows 0..r-1 = B0, then drift rows N */
    double *sigma;           /* [r] latent std (per-sequence weights included) */
    double *mean;            /* [d] */
    double *bias;            /* [d] outlier bias (keys; zero elsewhere) */
    int *outlier_pair;       /* [n_out] outlier pair indices (keys) */
    int n_out;               /* outlier pairs */
    double *sink;            /* [d] unit sink direction (keys) */
    double typ_norm;         /* typical pre-RoPE vector norm */
    double *coef;            /* [T][r] latent coefficients of every token (keys) */
};

static void head_free(struct head *h)
{
    free(h->basis);
    free(h->sigma);
    free(h->mean);
    free(h->bias);
    free(h->outlier_pair);
    free(h->sink);
    free(h->coef);
    memset(h, 0, sizeof *h);
}

/* Builds the model part (basis B0, spectrum, mean, outliers, sink) of one head and kind,
 * then the sequence part (drift basis, spectrum weights). */
static int head_init(struct head *h, const struct fk_synth_opts *o, int seq, int layer, int g,
                     enum fk_kind kind)
{
    int d = o->head_dim, np = d / 2, is_k = kind == FK_KIND_K, T = o->prefill + o->decode;
    memset(h, 0, sizeof *h);
    h->d = d;
    h->r = is_k ? o->key_rank : o->value_rank;
    h->r_drift = h->r < d - h->r ? h->r : d - h->r;
    double tilt = is_k ? o->key_freq_tilt : 0.0;
    double decay = is_k ? o->key_decay : o->value_decay;
    double mean_n = is_k ? o->key_mean : o->value_mean;
    double noise = is_k ? o->key_noise : o->value_noise;
    int rows = h->r + h->r_drift;
    h->basis = malloc(sizeof(double) * (size_t)rows * d);
    h->sigma = malloc(sizeof(double) * (size_t)h->r);
    h->mean = calloc((size_t)d, sizeof(double));
    h->bias = calloc((size_t)d, sizeof(double));
    h->outlier_pair = calloc((size_t)np + 1, sizeof(int));
    h->sink = calloc((size_t)d, sizeof(double));
    h->coef = is_k ? malloc(sizeof(double) * (size_t)T * h->r) : NULL;
    gsl_rng *rm = stream(P_MODEL, o->model_seed, -1, layer, g, kind);
    gsl_rng *rc = stream(P_CONTENT, o->seed, seq, layer, g, kind);
    int rc_ = FK_OK;
    if (!h->basis || !h->sigma || !h->mean || !h->bias || !h->outlier_pair || !h->sink ||
        (is_k && !h->coef) || !rm || !rc) {
        rc_ = fk_err(FK_ENOMEM, "synth: out of memory (layer %d head %d)", layer, g);
        goto out;
    }
    /* model: basis rows B0 (tilted towards low-frequency pairs for keys) */
    for (int j = 0; j < h->r; j++)
        for (int c = 0; c < d; c++)
            h->basis[(size_t)j * d + c] = gsl_ran_gaussian_ziggurat(rm, 1.0) *
                                          tilt_weight(pair_of(c, d, o->rope_half), np, tilt);
    for (int j = 0; j < h->r; j++)
        h->sigma[j] = pow(j + 1.0, -decay);
    for (int c = 0; c < d; c++)
        h->mean[c] = gsl_ran_gaussian_ziggurat(rm, 1.0) *
                     tilt_weight(pair_of(c, d, o->rope_half), np, tilt);
    double mn = sqrt(dot(h->mean, h->mean, d));
    for (int c = 0; c < d; c++)
        h->mean[c] *= mn > 0 ? mean_n * sqrt((double)d) / mn : 0.0;
    double bias2 = 0;
    if (is_k) {
        /* outlier pairs: distinct, in the low-frequency half [np/2, np) */
        int lo = np / 2, span = np - lo;
        int *cand = malloc(sizeof(int) * (size_t)span);
        if (!cand) {
            rc_ = fk_err(FK_ENOMEM, "synth: out of memory");
            goto out;
        }
        for (int i = 0; i < span; i++)
            cand[i] = lo + i;
        h->n_out = o->key_outlier_pairs;
        for (int i = 0; i < h->n_out; i++) { /* partial Fisher-Yates */
            int k = i + (int)gsl_rng_uniform_int(rm, (unsigned long)(span - i));
            int t = cand[i];
            cand[i] = cand[k];
            cand[k] = t;
            h->outlier_pair[i] = cand[i];
            int a, b;
            pair_channels(cand[i], d, o->rope_half, &a, &b);
            double m = o->key_outlier_scale * sqrt(2.0) * (0.75 + 0.5 * gsl_rng_uniform(rm));
            double phi = 2 * FK_PI * gsl_rng_uniform(rm);
            h->bias[a] = m * cos(phi);
            h->bias[b] = m * sin(phi);
            bias2 += m * m;
        }
        free(cand);
        /* sink direction: lowest-frequency quarter of pairs, outlier pairs excluded
         * (widened to the low-frequency half, then to all pairs, if that leaves none) */
        int from[3] = {np - (np / 4 > 1 ? np / 4 : 1), np / 2, 0};
        for (int f = 0; f < 3; f++) {
            double nn = 0;
            for (int i = from[f]; i < np; i++) {
                int is_out = 0;
                for (int k = 0; k < h->n_out; k++)
                    is_out |= h->outlier_pair[k] == i;
                if (is_out)
                    continue;
                int a, b;
                pair_channels(i, d, o->rope_half, &a, &b);
                h->sink[a] = gsl_ran_gaussian_ziggurat(rm, 1.0);
                h->sink[b] = gsl_ran_gaussian_ziggurat(rm, 1.0);
                nn += h->sink[a] * h->sink[a] + h->sink[b] * h->sink[b];
            }
            if (nn > 0) {
                for (int c = 0; c < d; c++)
                    h->sink[c] /= sqrt(nn);
                break;
            }
        }
    }
    /* sequence: spectrum weights, renormalised so the signal energy is d (rms 1) */
    double e = 0;
    for (int j = 0; j < h->r; j++) {
        h->sigma[j] *= exp(o->seq_jitter * gsl_ran_gaussian_ziggurat(rc, 1.0));
        e += h->sigma[j] * h->sigma[j];
    }
    for (int j = 0; j < h->r; j++)
        h->sigma[j] *= sqrt((double)d / e);
    /* sequence: drift directions, orthogonal to B0 and to each other */
    for (int j = h->r; j < rows; j++)
        for (int c = 0; c < d; c++)
            h->basis[(size_t)j * d + c] = gsl_ran_gaussian_ziggurat(rc, 1.0) *
                                          tilt_weight(pair_of(c, d, o->rope_half), np, tilt);
    if (orthonormalise(h->basis, 0, rows, d)) {
        rc_ = fk_err(FK_EEXTERNAL, "synth: layer %d head %d: degenerate latent basis", layer,
                     g);
        goto out;
    }
    h->typ_norm = sqrt(d * (1.0 + noise * noise) + mean_n * mean_n * d + bias2);
out:
    gsl_rng_free(rm);
    gsl_rng_free(rc);
    if (rc_)
        head_free(h);
    return rc_;
}

/* Drift angle of token t (0 in prefill). */
static double drift_angle(const struct fk_synth_opts *o, int t)
{
    return t < o->prefill ? 0.0 : o->drift_rate * (t - o->prefill + 1);
}

/* Adds sum_j w_j (cos a B0_j + sin a N_j) to x. */
static void latent_add(const struct head *h, const double *w, double angle, double *x)
{
    double ca = cos(angle), sa = sin(angle);
    int d = h->d;
    for (int j = 0; j < h->r; j++) {
        double p = w[j] * (j < h->r_drift ? ca : 1.0);
        const double *b = h->basis + (size_t)j * d;
        for (int c = 0; c < d; c++)
            x[c] += p * b[c];
        if (j < h->r_drift && sa != 0) {
            double q = w[j] * sa;
            const double *nv = h->basis + (size_t)(h->r + j) * d;
            for (int c = 0; c < d; c++)
                x[c] += q * nv[c];
        }
    }
}

/* Generates the T vectors [T][d] of one head and kind into dst (float). */
static int head_tokens(struct head *h, const struct fk_synth_opts *o, int seq, int layer, int g,
                       enum fk_kind kind, const double *cs, const double *sn, float *dst)
{
    int d = h->d, T = o->prefill + o->decode, is_k = kind == FK_KIND_K;
    double noise = is_k ? o->key_noise : o->value_noise, max_norm = 0;
    double *x = malloc(sizeof(double) * (size_t)d);
    double *w = malloc(sizeof(double) * (size_t)h->r);
    double *c = malloc(sizeof(double) * (size_t)h->r);
    /* a second content stream (kind + 2) so the token draws do not depend on the model */
    gsl_rng *rng = stream(P_CONTENT, o->seed, seq, layer, g, kind + 2);
    if (!x || !w || !c || !rng) {
        free(x);
        free(w);
        free(c);
        gsl_rng_free(rng);
        return fk_err(FK_ENOMEM, "synth: out of memory");
    }
    for (int t = 0; t < T; t++) {
        for (int j = 0; j < h->r; j++) {
            c[j] = coef_draw(rng, o->coef_dof);
            w[j] = h->sigma[j] * c[j];
        }
        if (h->coef)
            memcpy(h->coef + (size_t)t * h->r, c, sizeof(double) * (size_t)h->r);
        memset(x, 0, sizeof(double) * (size_t)d);
        latent_add(h, w, drift_angle(o, t), x);
        /* the sink key carries little content, so its logit is set by the sink direction */
        double content = is_k && t == 0 ? SINK_CONTENT : 1.0;
        for (int k = 0; k < d; k++)
            x[k] = content * (x[k] + noise * gsl_ran_gaussian_ziggurat(rng, 1.0)) + h->mean[k];
        if (is_k) {
            for (int i = 0; i < h->n_out; i++) {
                int a, b;
                pair_channels(h->outlier_pair[i], d, o->rope_half, &a, &b);
                double f = 1.0 + o->key_outlier_jitter * gsl_ran_gaussian_ziggurat(rng, 1.0);
                x[a] += f * h->bias[a];
                x[b] += f * h->bias[b];
            }
            if (t > 0 && sqrt(dot(x, x, d)) > max_norm)
                max_norm = sqrt(dot(x, x, d));
            if (o->rope)
                rope_apply(x, cs + (size_t)t * (d / 2), sn + (size_t)t * (d / 2), d,
                           o->rope_half);
        } else if (t == 0) {
            for (int k = 0; k < d; k++)
                x[k] *= o->sink_value_scale;
        }
        for (int k = 0; k < d; k++)
            dst[(size_t)t * d + k] = (float)x[k];
    }
    if (is_k) {
        /* sink: token 0 (RoPE is the identity there) gets m * sink direction, with m large
         * enough that its norm beats every other key of the head by 25 % */
        double k0 = 0, m = o->sink_key_scale * h->typ_norm;
        for (int k = 0; k < d; k++)
            k0 += (double)dst[k] * dst[k];
        if (T > 1 && o->sink_key_scale > 0 && m < 1.25 * max_norm + sqrt(k0))
            m = 1.25 * max_norm + sqrt(k0);
        for (int k = 0; k < d; k++)
            dst[k] = (float)(dst[k] + m * h->sink[k]);
    }
    free(x);
    free(w);
    free(c);
    gsl_rng_free(rng);
    return FK_OK;
}

/* ---- queries ------------------------------------------------------------------------- */

/* f(gamma) = log-odds of the attention mass on token 0 for logits z_i + gamma * u_i
 * (i = 0..n-1) minus target log-odds; *df = f'(gamma). */
static double sink_f(const double *z, const double *u, int n, double gamma, double target,
                     double *df)
{
    double m = -INFINITY;
    for (int i = 1; i < n; i++)
        if (z[i] + gamma * u[i] > m)
            m = z[i] + gamma * u[i];
    double s = 0, su = 0;
    for (int i = 1; i < n; i++) {
        double e = exp(z[i] + gamma * u[i] - m);
        s += e;
        su += e * u[i];
    }
    *df = u[0] - su / s;
    return z[0] + gamma * u[0] - (m + log(s)) - target;
}

/* Smallest gamma >= 0 with sink mass >= target: safeguarded Newton (f is concave and
 * increasing while u_0 dominates, so a handful of steps suffice). */
static double solve_gamma(const double *z, const double *u, int n, double mass)
{
    if (mass <= 0 || n < 2)
        return 0;
    double target = log(mass / (1 - mass)), df;
    double flo = sink_f(z, u, n, 0, target, &df);
    if (flo >= 0)
        return 0;
    double lo = 0, hi = df > 0 ? -flo / df : 1, fhi = sink_f(z, u, n, hi, target, &df);
    for (int i = 0; i < 60 && fhi < 0; i++) {
        lo = hi;
        hi *= 2;
        fhi = sink_f(z, u, n, hi, target, &df);
    }
    if (fhi < 0)
        return hi;
    double x = lo, f = sink_f(z, u, n, x, target, &df);
    for (int it = 0; it < 50 && fabs(f) > 1e-9 && hi - lo > 1e-12 * hi; it++) {
        if (f < 0)
            lo = x;
        else
            hi = x;
        double xn = df > 0 ? x - f / df : 0.5 * (lo + hi);
        x = xn > lo && xn < hi ? xn : 0.5 * (lo + hi);
        f = sink_f(z, u, n, x, target, &df);
    }
    return x;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The query rows of tokens q0, q0 + stride, ... (nq of them) of one range. */
struct qrange {
    int q0, nq, stride;
    enum purpose purpose;        /* its random stream */
};

/* Queries [nq][d] of range rg of query head qh, which reads KV head g (model h, post-RoPE
 * keys kf). */
static int head_queries(const struct head *h, const struct fk_synth_opts *o, int seq,
                        int layer, int qh, const float *kf, const double *cs, const double *sn,
                        const struct qrange *rg, float *dst)
{
    int d = h->d, r = h->r, nq = rg->nq, q0 = rg->q0;
    int T = o->prefill + o->decode, hd = d / 2;
    double *sig = malloc(sizeof(double) * (size_t)nq * d); /* raw pre-RoPE signal + noise */
    double *a = malloc(sizeof(double) * (size_t)r);
    double *x = malloc(sizeof(double) * (size_t)d);
    double *ur = malloc(sizeof(double) * (size_t)d);
    double *z = malloc(sizeof(double) * (size_t)T);
    double *u = malloc(sizeof(double) * (size_t)T);
    gsl_rng *rng = stream(rg->purpose, o->seed, seq, layer, qh, FK_KIND_Q);
    int rc = FK_OK;
    if (!sig || !a || !x || !ur || !z || !u || !rng) {
        rc = fk_err(FK_ENOMEM, "synth: out of memory (queries)");
        goto out;
    }
    double mix = o->query_target_mix, rest = sqrt(1.0 - mix * mix);
    double qn = o->query_noise * sqrt((double)r / d);
    for (int q = 0; q < nq; q++) {
        int t = q0 + q * rg->stride;
        /* target key in [1, t]: recent window with probability query_recent_frac (token 0's
         * query, of the prefill range only, targets the sink) */
        int lo = 1;
        if (gsl_rng_uniform(rng) < o->query_recent_frac && t - o->query_recent_window + 1 > 1)
            lo = t - o->query_recent_window + 1;
        int tgt = t < 1 ? 0 : lo + (int)gsl_rng_uniform_int(rng, (unsigned long)(t - lo + 1));
        const double *ct = h->coef + (size_t)tgt * r;
        double cn = sqrt(dot(ct, ct, r));
        for (int j = 0; j < r; j++)
            a[j] = mix * (cn > 0 ? ct[j] * sqrt((double)r) / cn : 0.0) +
                   rest * gsl_ran_gaussian_ziggurat(rng, 1.0);
        double *s = sig + (size_t)q * d;
        memset(s, 0, sizeof(double) * (size_t)d);
        latent_add(h, a, drift_angle(o, t), s);
        for (int k = 0; k < d; k++)
            s[k] += qn * gsl_ran_gaussian_ziggurat(rng, 1.0);
        double ps = dot(s, h->sink, d); /* the sink share is set by gamma alone */
        for (int k = 0; k < d; k++)
            s[k] -= ps * h->sink[k];
    }
    /* calibrate beta (logit spread over non-sink keys) and gamma (sink mass) on probes */
    int np_ = nq < N_PROBES ? nq : N_PROBES;
    double beta_acc = 0, gam[N_PROBES];
    int nb = 0;
    double rs = 1.0 / sqrt((double)d);
    for (int pass = 0; pass < 2; pass++) {
        double beta = pass ? (nb && beta_acc > 0 ? o->attn_logit_std / (beta_acc / nb) : 1.0)
                           : 1.0;
        for (int p = 0; p < np_; p++) {
            int q = (int)((2L * p + 1) * nq / (2L * np_)), t = q0 + q * rg->stride;
            memcpy(x, sig + (size_t)q * d, sizeof(double) * (size_t)d);
            memcpy(ur, h->sink, sizeof(double) * (size_t)d);
            if (o->rope) {
                rope_apply(x, cs + (size_t)t * hd, sn + (size_t)t * hd, d, o->rope_half);
                rope_apply(ur, cs + (size_t)t * hd, sn + (size_t)t * hd, d, o->rope_half);
            }
            double m1 = 0, m2 = 0;
            for (int i = 0; i <= t; i++) {
                const float *k = kf + (size_t)i * d;
                double zx = 0, zu = 0;
                for (int c = 0; c < d; c++) {
                    zx += x[c] * k[c];
                    zu += ur[c] * k[c];
                }
                z[i] = beta * zx * rs;
                u[i] = zu * rs;
                if (i > 0) {
                    m1 += z[i];
                    m2 += z[i] * z[i];
                }
            }
            if (pass == 0) {
                if (t >= 2) {
                    double mean = m1 / t, var = m2 / t - mean * mean;
                    beta_acc += sqrt(var > 0 ? var : 0);
                    nb++;
                }
            } else {
                gam[p] = solve_gamma(z, u, t + 1, o->sink_mass);
            }
        }
        if (pass == 1) {
            qsort(gam, (size_t)np_, sizeof gam[0], cmp_double);
            double gamma = np_ ? (np_ % 2 ? gam[np_ / 2]
                                          : 0.5 * (gam[np_ / 2 - 1] + gam[np_ / 2]))
                               : 0.0;
            for (int q = 0; q < nq; q++) {
                int t = q0 + q * rg->stride;
                const double *s = sig + (size_t)q * d;
                for (int c = 0; c < d; c++)
                    x[c] = beta * s[c] + gamma * h->sink[c];
                if (o->rope)
                    rope_apply(x, cs + (size_t)t * hd, sn + (size_t)t * hd, d, o->rope_half);
                for (int c = 0; c < d; c++)
                    dst[(size_t)q * d + c] = (float)x[c];
            }
        }
    }
out:
    free(sig);
    free(a);
    free(x);
    free(ur);
    free(z);
    free(u);
    gsl_rng_free(rng);
    return rc;
}

/* ---- layers and files ---------------------------------------------------------------- */

int fk_synth_layer(const struct fk_synth_opts *o, int seq_index, int layer, float *keys,
                   float *values, float *queries, int32_t *qidx)
{
    FK_TRY(fk_synth_validate(o));
    if (layer < 0 || layer >= o->n_layers)
        return fk_err(FK_EINVAL, "synth: layer %d out of range [0, %d)", layer, o->n_layers);
    struct fk_synth_opts lo;
    if (o->profile) { /* this layer's fitted knobs */
        lo = *o;
        lo.profile = NULL;
        FK_TRY(fk_synth_profile_apply(o->profile, layer, &lo));
        FK_TRY(fk_synth_validate(&lo));
        o = &lo;
    }
    int d = o->head_dim, hd = d / 2, T = o->prefill + o->decode, nq = fk_synth_n_queries(o);
    int group = o->n_q_heads / o->n_kv_heads;
    double *cs = malloc(sizeof(double) * (size_t)T * hd);
    double *sn = malloc(sizeof(double) * (size_t)T * hd);
    if (!cs || !sn) {
        free(cs);
        free(sn);
        return fk_err(FK_ENOMEM, "synth: out of memory (RoPE table, %d tokens)", T);
    }
    for (int i = 0; i < hd; i++) {
        double w = pow(o->rope_theta, -2.0 * i / d);
        for (int t = 0; t < T; t++) {
            cs[(size_t)t * hd + i] = cos(t * w);
            sn[(size_t)t * hd + i] = sin(t * w);
        }
    }
    int rc = FK_OK;
    for (int g = 0; g < o->n_kv_heads && rc == FK_OK; g++) {
        struct head hk, hv;
        float *kf = keys + (size_t)g * T * d;
        rc = head_init(&hk, o, seq_index, layer, g, FK_KIND_K);
        if (rc)
            break;
        rc = head_tokens(&hk, o, seq_index, layer, g, FK_KIND_K, cs, sn, kf);
        /* the prefill range's rows first, then the decode range's (as without it) */
        struct qrange pre = {.q0 = 0, .nq = n_prefill_queries(o), .stride = 1,
                              .purpose = P_QUERY_PREFILL};
        struct qrange dec = {.q0 = query_start(o), .nq = n_range_queries(o),
                             .stride = o->query_stride, .purpose = P_QUERY};
        for (int j = 0; j < group && rc == FK_OK && queries && nq > 0; j++) {
            int qh = g * group + j;
            float *qd = queries + (size_t)qh * nq * d;
            if (pre.nq > 0)
                rc = head_queries(&hk, o, seq_index, layer, qh, kf, cs, sn, &pre, qd);
            if (rc == FK_OK && dec.nq > 0)
                rc = head_queries(&hk, o, seq_index, layer, qh, kf, cs, sn, &dec,
                                  qd + (size_t)pre.nq * d);
        }
        head_free(&hk);
        if (rc)
            break;
        rc = head_init(&hv, o, seq_index, layer, g, FK_KIND_V);
        if (rc)
            break;
        rc = head_tokens(&hv, o, seq_index, layer, g, FK_KIND_V, cs, sn,
                         values + (size_t)g * T * d);
        head_free(&hv);
    }
    if (rc == FK_OK && qidx)
        for (int q = 0; q < nq; q++)
            qidx[q] = q < n_prefill_queries(o) ? q
                                                : query_start(o) +
                                                      (q - n_prefill_queries(o)) * o->query_stride;
    free(cs);
    free(sn);
    if (rc)
        return fk_err_context(rc, "synth: sequence %d layer %d", seq_index, layer);
    return FK_OK;
}

static int put_attrs(struct fk_trace_writer *w, const struct fk_synth_opts *o, int seq)
{
    char name[96], val[128];
    for (int i = 0; i < N_KNOBS; i++) {
        snprintf(name, sizeof name, "synth.%s", knobs[i].name);
        knob_text(o, &knobs[i], val, sizeof val);
        FK_TRY(fk_trace_put_attr(w, name, val));
    }
    fk_synth_shape_name(o, val, sizeof val);
    FK_TRY(fk_trace_put_attr(w, "synth.shape", val));
    FK_TRY(fk_trace_put_attr(w, "synth.generator", SYNTH_VERSION));
    FK_TRY(fk_trace_put_attr(w, "synth.encoding", enc_names[o->encoding]));
    FK_TRY(fk_trace_put_attr(w, "synth.rope_layout", o->rope_half ? "half" : "interleaved"));
    FK_TRY(fk_trace_put_attr(w, "synth.rng", "gsl_rng_mt19937, seed = sha256 of "
                             "fk_synth/v1/<purpose>/<seed>/<seq>/<layer>/<head>/<kind>"));
    snprintf(val, sizeof val, "%d", seq);
    FK_TRY(fk_trace_put_attr(w, "synth.seq_index", val));
    if (o->profile) /* its knobs replace the synth.<knob> values above, layer by layer */
        FK_TRY(fk_trace_put_attr(w, "synth.profile", o->profile->path));
    return FK_OK;
}

int fk_synth_write(const struct fk_synth_opts *o, const char *path, int seq_index)
{
    FK_TRY(fk_synth_validate(o));
    struct fk_trace_info info;
    fk_synth_info(o, &info);
    int d = o->head_dim, T = info.n_tokens, nq = info.n_queries;
    size_t nkv = (size_t)o->n_kv_heads * T * d, nqf = (size_t)o->n_q_heads * nq * d;
    float *k = malloc(sizeof(float) * nkv), *v = malloc(sizeof(float) * nkv);
    float *q = nq ? malloc(sizeof(float) * nqf) : NULL;
    int32_t *qidx = nq ? malloc(sizeof(int32_t) * (size_t)nq) : NULL;
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)T);
    uint8_t *phase = malloc((size_t)T);
    struct fk_trace_writer *w = NULL;
    int rc = FK_OK;
    if (!k || !v || (nq && (!q || !qidx)) || !pos || !phase) {
        rc = fk_err(FK_ENOMEM, "%s: out of memory for one layer (%zu floats)", path,
                    2 * nkv + nqf);
        goto out;
    }
    for (int t = 0; t < T; t++) {
        pos[t] = t;
        phase[t] = t >= o->prefill;
    }
    rc = fk_trace_create(path, &info, o->encoding, &w);
    if (!rc)
        rc = put_attrs(w, o, seq_index);
    if (!rc)
        rc = fk_trace_write_tokens(w, pos, phase, NULL);
    for (int l = 0; l < o->n_layers && !rc; l++) {
        rc = fk_synth_layer(o, seq_index, l, k, v, q, qidx);
        if (!rc)
            rc = fk_trace_write_layer(w, l, FK_KIND_K, k, NULL);
        if (!rc)
            rc = fk_trace_write_layer(w, l, FK_KIND_V, v, NULL);
        if (!rc && nq)
            rc = fk_trace_write_layer(w, l, FK_KIND_Q, q, qidx);
    }
    if (!rc) {
        rc = fk_trace_finish(&w);
    } else {
        fk_trace_abort(&w);
        rc = fk_err_context(rc, "%s", path);
    }
out:
    free(k);
    free(v);
    free(q);
    free(qidx);
    free(pos);
    free(phase);
    return rc;
}
