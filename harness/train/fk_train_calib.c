/* SPDX-License-Identifier: MIT
 * `fadkv-bench train-calib` as a library call (fk_train_calib.h; the rules: datasets/CALIB.md).
 */
#include "train/fk_train_calib.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fk_clock.h"
#include "common/fk_err.h"
#include "formats/fk_trace.h"
#include "kernels/fk_rope.h"
#include "train/fk_train_dict.h"

#define KMEANS_ITERS 50
#define K_MAX (1 << FK_KVQ_BITS_MAX)

/* The LUT sets of a (layer, fraction), as fk_calib_lut numbers them. */
enum { SET_KEYS = 0, SET_VALUES_ROW = 1, SET_VALUES_HEAD = 2 };

/* The traces and one layer's data, pre-RoPE keys and values, over all calibration tokens
 * (n = the traces' tokens one after the other). */
struct trainer {
    const struct fk_train_calib_cfg *c;
    struct fk_trace **tr;
    int n_tr;
    struct fk_calib_shape sh;
    int T_max;
    size_t n;                    /* calibration tokens */
    size_t hd;                   /* n_kv_heads * head_dim */
    uint8_t *sink;               /* [n] 1: among the first `sinks` tokens of its trace */
    float *kv;                   /* [H][T_max][d] one trace's keys or values */
    double *keys;                /* [hd][n] pre-RoPE keys, channel-major */
    double *vals;                /* [n][hd] values, token-major */
    double *norm;                /* [n * H][n_fractions][2] value rows' (zero point, range) */
    double *sorted;              /* [max(n, hd)] one channel or row, sorted */
    double *pool;                /* [hd * n] normalised values of one LUT fit */
    double *prefix;              /* [hd * n + 1] prefix sums of the sorted pool */
    double *cs, *sn, *freq;      /* [T_max][d/2] x 2, [d/2]: one trace's RoPE table */
    struct fk_rope *rope;        /* [n_tr] each trace's RoPE (described, or assumed) */
};

int fk_train_calib_check(const struct fk_train_calib_cfg *c)
{
    if (!c->out || !*c->out)
        return fk_err(FK_EINVAL, "need --out CALIB.h5");
    if (c->n_traces < 1)
        return fk_err(FK_EINVAL, "need at least one calibration trace");
    if (c->n_fractions < 1 || c->n_fractions > FK_CALIB_MAX_FRACTIONS)
        return fk_err(FK_EINVAL, "--outliers: %d fractions, expected 1 .. %d", c->n_fractions,
                      FK_CALIB_MAX_FRACTIONS);
    for (int i = 0; i < c->n_fractions; i++) {
        double f = c->fractions[i];
        if (!(f >= 0 && f < 0.5) || (i && !(f > c->fractions[i - 1])))
            return fk_err(FK_EINVAL, "--outliers: %g: expected ascending, distinct fractions "
                          "in [0, 0.5)", f);
    }
    if (c->sinks < 0)
        return fk_err(FK_EINVAL, "--sinks %d: expected a number of tokens >= 0", c->sinks);
    return FK_OK;
}

/* ---- numerics ------------------------------------------------------------------------------ */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The q quantile of the n sorted values v, NumPy's default (linear) rule. */
static double quantile(const double *v, size_t n, double q)
{
    double pos = q * (double)(n - 1);
    size_t j = (size_t)floor(pos);
    if (j >= n - 1)
        return v[n - 1];
    return v[j] + (pos - (double)j) * (v[j + 1] - v[j]);
}

/* x rounded to the nearest fp16 value (ties to even) straight from double (through float32
 * it could round twice), saturated to +-65504. */
static double half_round(double x)
{
    if (fabs(x) >= 65504)
        return copysign(65504, x);
    int e;
    frexp(x, &e);
    int q = e - 11 < -24 ? -24 : e - 11; /* the spacing of fp16 values near x: 2^q */
    return ldexp(nearbyint(ldexp(x, -q)), q);
}

/* First index in [lo, hi) of the sorted s that goes to centroid b rather than a (a < b):
 * nearer to b, or as near with tie_b (b has the lower index); distances in double. The test
 * is monotone in the value: a binary search. hi if none. */
static size_t first_to_b(const double *s, size_t lo, size_t hi, double a, double b, int tie_b)
{
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        double da = fabs(s[mid] - a), db = fabs(s[mid] - b);
        if (db < da || (tie_b && db == da))
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

/* Each sorted value to its nearest centroid, ties to the lower index: centroid i takes
 * s[beg[i] .. end[i] - 1]. The centroids, in any order, are walked by value; of equal ones
 * the lowest index takes the values and the others stay empty (0 .. -1). */
static void assign(const double *s, size_t n, int k, const double *c, size_t *beg, size_t *end)
{
    int ord[K_MAX];
    for (int i = 0; i < k; i++) { /* insertion sort by (value, index) */
        int j = i;
        while (j > 0 && c[ord[j - 1]] > c[i]) {
            ord[j] = ord[j - 1];
            j--;
        }
        ord[j] = i;
        beg[i] = end[i] = 0;
    }
    size_t start = 0;
    for (int r = 0; r < k;) {
        int ia = ord[r], q = r + 1;
        while (q < k && c[ord[q]] == c[ia])
            q++;
        size_t e = q == k ? n : first_to_b(s, start, n, c[ia], c[ord[q]], ord[q] < ia);
        beg[ia] = start;
        end[ia] = e;
        start = e;
        r = q;
    }
}

/* 1-D Lloyd on the n sorted values s (prefix sums p [n + 1]): centroid i starts at
 * s[floor((i + 1/2) n / k)]; then assign, stop when nothing moved, move each centroid to its
 * cluster's mean (an empty cluster keeps its centroid). The levels: the centroids sorted
 * (equal initial centroids can leave them out of order). */
static void lloyd(const double *s, const double *p, size_t n, int k, double *c)
{
    size_t beg[K_MAX], end[K_MAX], pbeg[K_MAX], pend[K_MAX];
    for (int i = 0; i < k; i++)
        c[i] = s[((size_t)(2 * i + 1) * n) / (size_t)(2 * k)];
    for (int it = 0; it < KMEANS_ITERS; it++) {
        assign(s, n, k, c, beg, end);
        if (it > 0 && !memcmp(beg, pbeg, sizeof(size_t) * (size_t)k) &&
            !memcmp(end, pend, sizeof(size_t) * (size_t)k))
            break;
        for (int i = 0; i < k; i++)
            if (end[i] > beg[i])
                c[i] = (p[end[i]] - p[beg[i]]) / (double)(end[i] - beg[i]);
        memcpy(pbeg, beg, sizeof(size_t) * (size_t)k);
        memcpy(pend, end, sizeof(size_t) * (size_t)k);
    }
    qsort(c, (size_t)k, sizeof *c, cmp_double);
}

static void prefix_sums(const double *s, size_t n, double *p)
{
    p[0] = 0;
    for (size_t i = 0; i < n; i++)
        p[i + 1] = p[i] + s[i];
}

int fk_train_calib_kmeans(double *x, size_t n, int k, double *levels)
{
    if (k < 1 || k > K_MAX || n < (size_t)k)
        return fk_err(FK_EINVAL, "k-means: %zu values for %d levels (1 .. %d)", n, k, K_MAX);
    double *p = malloc(sizeof(double) * (n + 1));
    if (!p)
        return fk_err(FK_ENOMEM, "out of memory for %zu values", n);
    qsort(x, n, sizeof *x, cmp_double);
    prefix_sums(x, n, p);
    lloyd(x, p, n, k, levels);
    free(p);
    return FK_OK;
}

/* ---- traces and one layer ------------------------------------------------------------------ */

/* The RoPE of trace i: the one it describes, or the one the user states for a trace that
 * does not (--rope); post-RoPE keys and an even head_dim either way. */
static int trace_rope(struct trainer *w, int i)
{
    const struct fk_train_calib_cfg *c = w->c;
    const struct fk_trace_info *in = fk_trace_get_info(w->tr[i]);
    if (!in->keys_post_rope || in->head_dim % 2)
        return fk_err(FK_EINVAL, "%s: train-calib needs post-RoPE keys (keys_post_rope = 1) "
                      "and an even head_dim: KVQuant calibrates pre-RoPE keys", c->traces[i]);
    if (in->has_rope && c->assume_rope && in->rope.layout != c->assume_rope - 1)
        return fk_err(FK_EINVAL, "%s describes RoPE layout %s, but --rope says %s",
                      c->traces[i], fk_rope_layout_names[in->rope.layout],
                      fk_rope_layout_names[c->assume_rope - 1]);
    if (in->has_rope) {
        w->rope[i] = in->rope;
        return FK_OK;
    }
    if (!c->assume_rope || !(in->rope_theta > 0))
        return fk_err(FK_EINVAL, "%s does not describe its RoPE (no rope_layout; "
                      "datasets/README.md): KVQuant calibrates pre-RoPE keys (state the layout "
                      "with --rope interleaved|half when you know it, the trace giving "
                      "rope_theta > 0)", c->traces[i]);
    w->rope[i] = (struct fk_rope){.theta = in->rope_theta, .layout = c->assume_rope - 1,
                                  .type = FK_ROPE_DEFAULT};
    return fk_rope_check(&w->rope[i], in->head_dim);
}

/* Opens every trace: one shape, post-RoPE keys whose RoPE is known (trace_rope). */
static int open_traces(struct trainer *w)
{
    const struct fk_train_calib_cfg *c = w->c;
    w->tr = calloc((size_t)c->n_traces, sizeof *w->tr);
    w->rope = calloc((size_t)c->n_traces, sizeof *w->rope);
    if (!w->tr || !w->rope)
        return fk_err(FK_ENOMEM, "out of memory");
    for (int i = 0; i < c->n_traces; i++) {
        FK_TRY(fk_trace_open(c->traces[i], &w->tr[i]));
        w->n_tr++;
        const struct fk_trace_info *in = fk_trace_get_info(w->tr[i]);
        const struct fk_trace_info *i0 = fk_trace_get_info(w->tr[0]);
        if (in->n_layers != i0->n_layers || in->n_kv_heads != i0->n_kv_heads ||
            in->head_dim != i0->head_dim)
            return fk_err(FK_EINVAL, "%s has %d layers x %d KV heads x head_dim %d, but %s has "
                          "%d x %d x %d: a calibration is trained on traces of one model",
                          c->traces[i], in->n_layers, in->n_kv_heads, in->head_dim,
                          c->traces[0], i0->n_layers, i0->n_kv_heads, i0->head_dim);
        FK_TRY(trace_rope(w, i));
        w->n += (size_t)in->n_tokens;
        if (in->n_tokens > w->T_max)
            w->T_max = in->n_tokens;
    }
    const struct fk_trace_info *i0 = fk_trace_get_info(w->tr[0]);
    w->sh.n_layers = i0->n_layers;
    w->sh.n_kv_heads = i0->n_kv_heads;
    w->sh.head_dim = i0->head_dim;
    w->sh.n_fractions = c->n_fractions;
    memcpy(w->sh.fractions, c->fractions, sizeof c->fractions);
    w->sh.sinks = c->sinks;
    w->sh.n_vectors = (long)w->n;
    w->hd = (size_t)i0->n_kv_heads * (size_t)i0->head_dim;
    return FK_OK;
}

static int alloc_scratch(struct trainer *w)
{
    size_t n = w->n, hd = w->hd, T = (size_t)w->T_max, half = (size_t)w->sh.head_dim / 2;
    w->sink = calloc(n, 1);
    w->kv = malloc(sizeof(float) * hd * T);
    w->keys = malloc(sizeof(double) * hd * n);
    w->vals = malloc(sizeof(double) * hd * n);
    w->norm = malloc(sizeof(double) * 2 * n * (size_t)w->sh.n_kv_heads * w->sh.n_fractions);
    w->sorted = malloc(sizeof(double) * (n > hd ? n : hd));
    w->pool = malloc(sizeof(double) * hd * n);
    w->prefix = malloc(sizeof(double) * (hd * n + 1));
    w->cs = malloc(sizeof(double) * T * half);
    w->sn = malloc(sizeof(double) * T * half);
    w->freq = malloc(sizeof(double) * half);
    if (!w->sink || !w->kv || !w->keys || !w->vals || !w->norm || !w->sorted || !w->pool ||
        !w->prefix || !w->cs || !w->sn || !w->freq)
        return fk_err(FK_ENOMEM, "out of memory for a layer of %zu tokens x %zu channels "
                      "(about %zu MB)", n, hd, hd * n * 4 * sizeof(double) >> 20);
    size_t off = 0;
    for (int i = 0; i < w->n_tr; i++) {
        int T_i = fk_trace_get_info(w->tr[i])->n_tokens;
        for (int t = 0; t < T_i; t++)
            w->sink[off + (size_t)t] = t < w->sh.sinks;
        off += (size_t)T_i;
    }
    return FK_OK;
}

static void free_trainer(struct trainer *w)
{
    for (int i = 0; w->tr && i < w->n_tr; i++)
        fk_trace_close(&w->tr[i]);
    free(w->tr);
    free(w->sink);
    free(w->kv);
    free(w->keys);
    free(w->vals);
    free(w->norm);
    free(w->sorted);
    free(w->pool);
    free(w->prefix);
    free(w->cs);
    free(w->sn);
    free(w->freq);
    free(w->rope);
}

/* Layer l of every trace: keys un-rotated with the trace's RoPE (in double), values. */
static int load_layer(struct trainer *w, int l)
{
    int H = w->sh.n_kv_heads, d = w->sh.head_dim, half = d / 2;
    size_t off = 0;
    for (int i = 0; i < w->n_tr; i++) {
        const struct fk_trace_info *in = fk_trace_get_info(w->tr[i]);
        int T = in->n_tokens;
        fk_rope_freqs(&w->rope[i], d, w->freq);
        fk_rope_table(w->freq, d, fk_trace_positions(w->tr[i]), T, w->cs, w->sn);
        FK_TRY(fk_trace_read(w->tr[i], l, FK_KIND_K, w->kv));
        double x[4096];
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++) {
                const float *src = w->kv + ((size_t)h * T + t) * d;
                for (int ch = 0; ch < d; ch++)
                    x[ch] = src[ch];
                fk_rope_apply(w->rope[i].layout, d, w->cs + (size_t)t * half,
                              w->sn + (size_t)t * half, -1, x);
                for (int ch = 0; ch < d; ch++)
                    w->keys[((size_t)h * d + ch) * w->n + off + (size_t)t] = x[ch];
            }
        FK_TRY(fk_trace_read(w->tr[i], l, FK_KIND_V, w->kv));
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++)
                for (int ch = 0; ch < d; ch++)
                    w->vals[(off + (size_t)t) * w->hd + (size_t)h * d + ch] =
                        w->kv[((size_t)h * T + t) * d + ch];
        off += (size_t)T;
    }
    return FK_OK;
}

/* ---- the calibration of one layer ---------------------------------------------------------- */

/* Every channel's thresholds at every fraction: quantiles t and 1 - t, rounded to fp16. */
static void key_thresholds(struct trainer *w, struct fk_calib_file *cf, int l)
{
    for (size_t ch = 0; ch < w->hd; ch++) {
        memcpy(w->sorted, w->keys + ch * w->n, sizeof(double) * w->n);
        qsort(w->sorted, w->n, sizeof(double), cmp_double);
        for (int fi = 0; fi < w->sh.n_fractions; fi++) {
            double t = 1 - w->sh.fractions[fi] / 2;
            fk_calib_upper(cf, l, fi)[ch] = (float)half_round(quantile(w->sorted, w->n, t));
            fk_calib_lower(cf, l, fi)[ch] = (float)half_round(quantile(w->sorted, w->n, 1 - t));
        }
    }
}

/* The normalised non-sink keys of fraction fi inside their thresholds into the pool. */
static size_t pool_keys(struct trainer *w, struct fk_calib_file *cf, int l, int fi)
{
    const float *up = fk_calib_upper(cf, l, fi), *lo = fk_calib_lower(cf, l, fi);
    size_t m = 0;
    for (size_t ch = 0; ch < w->hd; ch++) {
        double zp = ((double)up[ch] + lo[ch]) / 2, rg = ((double)up[ch] - lo[ch]) / 2;
        if (!(rg > 0))
            continue;
        const double *x = w->keys + ch * w->n;
        for (size_t t = 0; t < w->n; t++) {
            double u = (x[t] - zp) / rg;
            if (!w->sink[t] && fabs(u) <= 1)
                w->pool[m++] = u;
        }
    }
    return m;
}

/* (zero point, range) of every non-sink value row of len values (hd: a token's heads, d: one
 * head) at every fraction, from the row's own t and 1 - t quantiles, in double. */
static void value_norms(struct trainer *w, size_t len)
{
    size_t rows = w->hd / len, nf = (size_t)w->sh.n_fractions;
    for (size_t t = 0; t < w->n; t++)
        for (size_t r = 0; !w->sink[t] && r < rows; r++) {
            memcpy(w->sorted, w->vals + t * w->hd + r * len, sizeof(double) * len);
            qsort(w->sorted, len, sizeof(double), cmp_double);
            for (size_t fi = 0; fi < nf; fi++) {
                double q = 1 - w->sh.fractions[fi] / 2;
                double up = quantile(w->sorted, len, q), lo = quantile(w->sorted, len, 1 - q);
                double *zr = w->norm + ((t * rows + r) * nf + fi) * 2;
                zr[0] = (up + lo) / 2;
                zr[1] = (up - lo) / 2;
            }
        }
}

/* The normalised non-sink values of fraction fi inside their rows' quantiles into the pool
 * (rows of len values, normalised by value_norms). */
static size_t pool_values(struct trainer *w, size_t len, int fi)
{
    size_t rows = w->hd / len, nf = (size_t)w->sh.n_fractions, m = 0;
    for (size_t t = 0; t < w->n; t++)
        for (size_t r = 0; !w->sink[t] && r < rows; r++) {
            const double *zr = w->norm + ((t * rows + r) * nf + (size_t)fi) * 2;
            const double *x = w->vals + t * w->hd + r * len;
            if (!(zr[1] > 0))
                continue;
            for (size_t j = 0; j < len; j++) {
                double u = (x[j] - zr[0]) / zr[1];
                if (fabs(u) <= 1)
                    w->pool[m++] = u;
            }
        }
    return m;
}

/* The 2-, 3- and 4-bit LUTs of one set from the m pooled values. */
static int fit_luts(struct trainer *w, struct fk_calib_file *cf, int l, int fi, int set,
                    size_t m)
{
    static const char *const what[3] = {"keys", "values (rows of all KV heads)",
                                        "values (rows of one head)"};
    qsort(w->pool, m, sizeof(double), cmp_double);
    prefix_sums(w->pool, m, w->prefix);
    for (int b = FK_KVQ_BITS_MIN; b <= FK_KVQ_BITS_MAX; b++) {
        int k = 1 << b;
        if (m < (size_t)k)
            return fk_err(FK_EINVAL, "layer %d, %s, outlier fraction %g: %zu normalised values "
                          "inside the thresholds (sinks left out), fewer than the %d levels of "
                          "the %d-bit LUT: more calibration tokens or fewer --sinks", l,
                          what[set], w->sh.fractions[fi], m, k, b);
        double c[K_MAX];
        lloyd(w->pool, w->prefix, m, k, c);
        float *lut = fk_calib_lut(cf, l, fi, set, b);
        for (int i = 0; i < k; i++)
            lut[i] = (float)c[i];
    }
    return FK_OK;
}

static int train_layer(struct trainer *w, struct fk_calib_file *cf, int l,
                       const struct fk_train_calib_hooks *h)
{
    double t0 = fk_wall_s();
    FK_TRY(load_layer(w, l));
    key_thresholds(w, cf, l);
    size_t n_in = 0;
    for (size_t t = 0; t < w->n; t++)
        n_in += !w->sink[t];
    double elems = (double)n_in * (double)w->hd;
    double inside_k[FK_CALIB_MAX_FRACTIONS], inside_v[FK_CALIB_MAX_FRACTIONS];
    for (int fi = 0; fi < w->sh.n_fractions; fi++) {
        size_t m = pool_keys(w, cf, l, fi);
        inside_k[fi] = elems > 0 ? (double)m / elems : 0;
        FK_TRY(fit_luts(w, cf, l, fi, SET_KEYS, m));
    }
    for (int set = SET_VALUES_ROW; set <= SET_VALUES_HEAD; set++) {
        size_t len = set == SET_VALUES_ROW ? w->hd : (size_t)w->sh.head_dim;
        value_norms(w, len);
        for (int fi = 0; fi < w->sh.n_fractions; fi++) {
            size_t m = pool_values(w, len, fi);
            if (set == SET_VALUES_ROW)
                inside_v[fi] = elems > 0 ? (double)m / elems : 0;
            FK_TRY(fit_luts(w, cf, l, fi, set, m));
        }
    }
    if (h && h->layer_done)
        h->layer_done(h->ctx, l, w->sh.n_fractions, inside_k, inside_v, fk_wall_s() - t0);
    return FK_OK;
}

/* Provenance: the traces with their sha256, the RoPE un-rotation, the method. */
static int save(const struct trainer *w, const struct fk_calib_file *cf)
{
    const struct fk_train_calib_cfg *c = w->c;
    char *tl;
    FK_TRY(fk_train_trace_list(c->traces, c->n_traces, &tl));
    const struct fk_trace_info *i0 = fk_trace_get_info(w->tr[0]);
    char rope[240];
    snprintf(rope, sizeof rope, "keys un-rotated to pre-RoPE with each trace's RoPE (first "
             "trace: %s, %s, theta %g%s)", fk_rope_layout_names[w->rope[0].layout],
             fk_rope_type_names[w->rope[0].type], w->rope[0].theta,
             i0->has_rope ? "" : "; not described by the trace: stated with --rope");
    const char *attrs[] = {
        "training_traces", tl, "rope", rope, "method",
        "KVQuant simquant calibration: per-channel key thresholds (linear quantiles t = 1 - f/2 "
        "and 1 - t, fp16), per-row value quantiles, LUTs by 1-D Lloyd k-means (init "
        "sorted[floor((i + 1/2) n / k)], <= 50 iterations) of |u| <= 1, sinks left out",
        "generator", "fadkv-bench train-calib", NULL};
    int rc = fk_calib_save(cf, c->out, attrs);
    free(tl);
    return rc;
}

int fk_train_calib_run(const struct fk_train_calib_cfg *c, const struct fk_train_calib_hooks *h)
{
    FK_TRY(fk_train_calib_check(c));
    struct trainer w = {.c = c};
    struct fk_calib_file *cf = NULL;
    int rc = open_traces(&w);
    if (rc == FK_OK)
        rc = fk_calib_alloc(&w.sh, c->out, &cf);
    if (rc == FK_OK) {
        snprintf(cf->model_id, sizeof cf->model_id, "%s", fk_trace_get_info(w.tr[0])->model_id);
        rc = alloc_scratch(&w);
    }
    if (rc == FK_OK && h && h->opened)
        h->opened(h->ctx, w.n_tr, w.sh.n_layers, w.sh.n_kv_heads, w.sh.head_dim,
                  w.sh.n_vectors);
    for (int l = 0; rc == FK_OK && l < w.sh.n_layers; l++)
        rc = train_layer(&w, cf, l, h);
    if (rc == FK_OK)
        rc = save(&w, cf);
    fk_calib_free(&cf);
    free_trainer(&w);
    return rc;
}
