/* SPDX-License-Identifier: MIT
 * Fitting the synthetic generator's per-layer knobs to traces, and the profile file
 * (datasets/SYNTH.md, "Fitted profiles"; every estimator is documented there).
 *
 * Per layer, the keys (un-rotated to pre-RoPE with the trace's RoPE) and values of tokens
 * 1..T-1 of every KV head of every trace are pooled. For each kind: outlier RoPE pairs
 * (keys) are the pairs whose RMS exceeds OUTLIER_RATIO x the median pair RMS; on the other
 * channels, the covariance spectrum gives the noise floor (median of its lower half), the
 * rank (eigenvalues above the floor's sampling edge), the unit (signal energy per channel)
 * and the decay (log-log slope); the per-pair signal variance gives the frequency tilt;
 * the projections on the leading eigenvectors give the coefficient kurtosis and so the
 * Student-t degrees of freedom. Token 0 gives the sink scales; queries give the sink mass
 * and the logit spread. All arithmetic in double.
 */
#include "gen/fk_synth_fit.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gsl/gsl_eigen.h>
#include <gsl/gsl_matrix.h>
#include <hdf5.h>

#include "common/fk_err.h"
#include "formats/fk_h5.h"
#include "formats/fk_trace.h"

#define OUTLIER_RATIO 2.5    /* outlier pair: RMS > 2.5 x the median RMS of its neighbours */
#define OUTLIER_WIN 4        /* neighbours: the 4 pairs on each side */
#define KURT_DIRS 8          /* leading eigenvectors used for the kurtosis */
#define KURT_GAUSS 0.06      /* excess kurtosis below this: Gaussian coefficients */
#define PROFILE_SCHEMA "fadkv-synth-profile"

const char *const fk_synth_profile_knobs[FK_PROFILE_NKNOBS] = {
    "key_rank",   "key_decay",   "key_noise",  "key_mean",   "key_freq_tilt",
    "key_outlier_pairs", "key_outlier_scale", "value_rank", "value_decay", "value_noise",
    "value_mean", "coef_dof",    "sink_key_scale", "sink_value_scale", "sink_mass",
    "attn_logit_std"};

enum { K_RANK, K_DECAY, K_NOISE, K_MEAN, K_TILT, K_OPAIRS, K_OSCALE, V_RANK, V_DECAY, V_NOISE,
       V_MEAN, DOF, SINK_K, SINK_V, SINK_MASS, LOGIT_STD };

/* What the fit of one kind gives. */
struct kind_fit {
    double rank, decay, noise, mean, tilt, opairs, oscale, kurt;
};

/* Channels of RoPE pair i: (2i, 2i+1) interleaved, (i, i + d/2) half. */
static void pair_ch(int layout, int d, int i, int *a, int *b)
{
    *a = layout == FK_ROPE_HALF ? i : 2 * i;
    *b = layout == FK_ROPE_HALF ? i + d / 2 : 2 * i + 1;
}

/* Un-rotates a post-RoPE key at position pos (default frequencies theta^(-2i/d)). */
static void rope_undo(const struct fk_rope *r, int d, int pos, double *x)
{
    for (int i = 0; i < d / 2; i++) {
        int a, b;
        pair_ch(r->layout, d, i, &a, &b);
        double ang = pos * pow(r->theta, -2.0 * i / d), c = cos(ang), s = sin(ang);
        double xa = x[a], xb = x[b];
        x[a] = xa * c + xb * s;
        x[b] = -xa * s + xb * c;
    }
}

static int cmp_dbl(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, long n)
{
    if (n <= 0)
        return NAN;
    qsort(v, (size_t)n, sizeof *v, cmp_dbl);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Least-squares slope of y on x (n >= 2 points). */
static double ls_slope(const double *x, const double *y, int n)
{
    double mx = 0, my = 0, sxy = 0, sxx = 0;
    for (int i = 0; i < n; i++) {
        mx += x[i];
        my += y[i];
    }
    mx /= n;
    my /= n;
    for (int i = 0; i < n; i++) {
        sxy += (x[i] - mx) * (y[i] - my);
        sxx += (x[i] - mx) * (x[i] - mx);
    }
    return sxx > 0 ? sxy / sxx : 0;
}

/* Per-channel second moments m2 [d] of X [n][d] and each pair's RMS into prms and tmp [d/2]. */
static void pair_rms(const double *X, long n, int d, double *m2, double *prms, double *tmp)
{
    int np = d / 2;
    for (long t = 0; t < n; t++)
        for (int c = 0; c < d; c++)
            m2[c] += X[(size_t)t * d + c] * X[(size_t)t * d + c];
    for (int c = 0; c < d; c++)
        m2[c] /= (double)n;
    for (int i = 0; i < np; i++) {
        int a, b;
        pair_ch(FK_ROPE_INTERLEAVED, d, i, &a, &b); /* layout fixed: keys are pre-RoPE */
        prms[i] = tmp[i] = sqrt(0.5 * (m2[a] + m2[b]));
    }
}

/* lmed [np]: the median RMS of each pair's frequency neighbours (tmp [np]: scratch). */
static void neighbour_median(const double *prms, int np, double *tmp, double *lmed)
{
    for (int i = 0; i < np; i++) {
        int k = 0;
        for (int j = i - OUTLIER_WIN; j <= i + OUTLIER_WIN; j++)
            if (j >= 0 && j < np && j != i)
                tmp[k++] = prms[j];
        lmed[i] = median(tmp, k);
    }
}

/* Marks outlier pairs' channels in out [d], largest first, at most np - np/2; their count. */
static int mark_outliers(int d, const double *prms, const double *lmed, int *out)
{
    int np = d / 2, n_out = 0;
    for (int pass = 0; pass < np - np / 2; pass++) {
        int best = -1;
        for (int i = 0; i < np; i++) {
            int a, b;
            pair_ch(FK_ROPE_INTERLEAVED, d, i, &a, &b);
            if (!out[a] && prms[i] > OUTLIER_RATIO * lmed[i] &&
                (best < 0 || prms[i] > prms[best]))
                best = i;
        }
        if (best < 0)
            break;
        int a, b;
        pair_ch(FK_ROPE_INTERLEAVED, d, best, &a, &b);
        out[a] = out[b] = 1;
        n_out++;
    }
    return n_out;
}

/* Mean mu [dp] and covariance C [dp][dp] of the channels ch [dp] of X [n][d]. */
static void mean_cov(const double *X, long n, int d, const int *ch, int dp, double *mu,
                     gsl_matrix *C)
{
    for (long t = 0; t < n; t++)
        for (int i = 0; i < dp; i++)
            mu[i] += X[(size_t)t * d + ch[i]];
    for (int i = 0; i < dp; i++)
        mu[i] /= (double)n;
    for (long t = 0; t < n; t++) {
        const double *x = X + (size_t)t * d;
        for (int i = 0; i < dp; i++) {
            double xi = x[ch[i]] - mu[i];
            double *row = C->data + (size_t)i * C->tda;
            for (int j = 0; j <= i; j++)
                row[j] += xi * (x[ch[j]] - mu[j]);
        }
    }
    for (int i = 0; i < dp; i++)
        for (int j = 0; j <= i; j++) {
            double v = gsl_matrix_get(C, (size_t)i, (size_t)j) / (double)n;
            gsl_matrix_set(C, (size_t)i, (size_t)j, v);
            gsl_matrix_set(C, (size_t)j, (size_t)i, v);
        }
}

/* pvar [d/2]: each pair's mean channel variance from C, NAN for outlier pairs. */
static void pair_variance(const gsl_matrix *C, const int *ch, int dp, int d, double *pvar)
{
    int np = d / 2;
    for (int i = 0; i < np; i++) {
        int a, b, ia = -1, ib = -1;
        pair_ch(FK_ROPE_INTERLEAVED, d, i, &a, &b);
        for (int k = 0; k < dp; k++) {
            ia = ch[k] == a ? k : ia;
            ib = ch[k] == b ? k : ib;
        }
        pvar[i] = ia >= 0 && ib >= 0 ? 0.5 * (gsl_matrix_get(C, (size_t)ia, (size_t)ia) +
                                              gsl_matrix_get(C, (size_t)ib, (size_t)ib))
                                     : NAN;
    }
}

/* Rank, noise, mean and decay of f from the sorted eigenvalues lam [dp] (xx, yy [dp]:
 * scratch); returns the noise floor and sets *u2 (the latent energy per channel). */
static double fit_spectrum(const double *lam, int dp, long n, double tot, const double *mu,
                           double *xx, double *yy, struct kind_fit *f, double *u2_out)
{
    /* noise floor: median of the lower half; rank: eigenvalues above its sampling edge */
    for (int i = 0; i < dp - dp / 2; i++)
        xx[i] = lam[dp / 2 + i];
    double floor_ = median(xx, dp - dp / 2);
    double edge = 1 + sqrt((double)dp / (double)n);
    double thr = 2 * floor_ * edge * edge;
    int r = 0;
    while (r < dp && lam[r] > thr)
        r++;
    if (r < 1)
        r = 1;
    double S = 0;
    for (int j = 0; j < r; j++)
        S += lam[j] - floor_;
    double u2 = S > 0 ? S / dp : (tot > 0 ? tot / dp : 1);
    f->rank = r;
    f->noise = sqrt(floor_ / u2);
    double mn = 0;
    for (int i = 0; i < dp; i++)
        mn += mu[i] * mu[i];
    f->mean = sqrt(mn / (u2 * dp));
    int k = 0;
    for (int j = 0; j < r; j++)
        if (lam[j] - floor_ > 0) {
            xx[k] = log(j + 1.0);
            yy[k++] = 0.5 * log(lam[j] - floor_);
        }
    f->decay = k >= 2 ? -ls_slope(xx, yy, k) : 0;
    if (f->decay < 0)
        f->decay = 0;
    if (f->decay > 8)
        f->decay = 8;
    *u2_out = u2;
    return floor_;
}

/* Keys only: frequency tilt of f from pvar [np], outlier count and scale from out, prms and
 * lmed (xx, yy [np]: scratch). */
static void fit_key_pairs(int d, const double *pvar, const int *out, int n_out,
                          const double *prms, const double *lmed, double floor_, double u2,
                          double *xx, double *yy, struct kind_fit *f)
{
    int np = d / 2, k = 0;
    for (int i = 0; i < np; i++) {
        if (isnan(pvar[i]))
            continue;
        double v = pvar[i] - floor_;
        xx[k] = np > 1 ? (double)i / (np - 1) - 1.0 : 0;
        yy[k++] = log((v > 1e-3 * u2 ? v : 1e-3 * u2) / u2);
    }
    f->tilt = k >= 2 ? 0.5 * ls_slope(xx, yy, k) : 0;
    if (f->tilt < -20) /* the knob's range; negative: energy in high-frequency pairs */
        f->tilt = -20;
    if (f->tilt > 20)
        f->tilt = 20;
    f->opairs = n_out;
    double os = 0;
    for (int i = 0; i < np; i++) {
        int a, b;
        pair_ch(FK_ROPE_INTERLEAVED, d, i, &a, &b);
        if (out[a]) {
            double e = prms[i] * prms[i] - lmed[i] * lmed[i]; /* minus an ordinary pair */
            os += sqrt(e > 0 ? e : 0) / sqrt(u2);
        }
    }
    f->oscale = n_out ? os / n_out : 0;
}

/* coefficient tails: excess kurtosis of the projections on the kd leading eigenvectors V,
 * per (trace, head) segment, weighted by its vectors */
static double coef_kurtosis(const double *X, int d, const int *ch, int dp, const double *mu,
                            const gsl_matrix *V, int kd, const long *seg, int n_seg)
{
    double ksum = 0, kw = 0;
    for (int s = 0; s < n_seg; s++) {
        long a0 = seg[s], a1 = seg[s + 1], ns = a1 - a0;
        if (ns < 8)
            continue;
        for (int j = 0; j < kd; j++) {
            double s1 = 0, s2 = 0, s4 = 0;
            for (long t = a0; t < a1; t++) {
                double p = 0;
                for (int i = 0; i < dp; i++)
                    p += (X[(size_t)t * d + ch[i]] - mu[i]) * gsl_matrix_get(V, (size_t)i, (size_t)j);
                s1 += p;
            }
            double m = s1 / ns;
            for (long t = a0; t < a1; t++) {
                double p = 0;
                for (int i = 0; i < dp; i++)
                    p += (X[(size_t)t * d + ch[i]] - mu[i]) * gsl_matrix_get(V, (size_t)i, (size_t)j);
                p -= m;
                s2 += p * p;
                s4 += p * p * p * p;
            }
            s2 /= ns;
            s4 /= ns;
            if (s2 > 0) {
                ksum += (double)ns * (s4 / (s2 * s2) - 3);
                kw += (double)ns;
            }
        }
    }
    return kw > 0 ? ksum / kw : 0;
}

/* Fits one kind from X [n][d] (pre-RoPE, tokens >= 1); seg [n_seg + 1]: row offsets of the
 * (trace, head) segments. spec_out [d]: normalised eigenvalues (non-outlier channels). */
static int fit_kind(const double *X, long n, int d, int is_key, const long *seg, int n_seg,
                    struct kind_fit *f, double *spec_out)
{
    int np = d / 2, rc = FK_OK;
    double *m2 = calloc((size_t)d, sizeof(double)), *prms = malloc(sizeof(double) * np);
    double *tmp = malloc(sizeof(double) * np);
    int *out = calloc((size_t)d, sizeof(int)), *ch = malloc(sizeof(int) * d);
    gsl_matrix *C = NULL, *V = NULL;
    gsl_vector *ev = NULL;
    gsl_eigen_symmv_workspace *ws = NULL;
    double *mu = NULL, *lam = NULL, *xx = NULL, *yy = NULL, *lmed = NULL;
    memset(f, 0, sizeof *f);
    if (!m2 || !prms || !tmp || !out || !ch) {
        rc = fk_err(FK_ENOMEM, "synth --fit: out of memory");
        goto done;
    }
    pair_rms(X, n, d, m2, prms, tmp);
    /* the RMS a pair would have without outliers: the median of its frequency neighbours
     * (pairs i - OUTLIER_WIN .. i + OUTLIER_WIN but i), so a smooth tilt is not an outlier */
    lmed = malloc(sizeof(double) * np);
    if (!lmed) {
        rc = fk_err(FK_ENOMEM, "synth --fit: out of memory");
        goto done;
    }
    neighbour_median(prms, np, tmp, lmed);
    int n_out = 0;
    if (is_key)
        n_out = mark_outliers(d, prms, lmed, out);
    int dp = 0;
    for (int c = 0; c < d; c++)
        if (!out[c])
            ch[dp++] = c;
    mu = calloc((size_t)dp, sizeof(double));
    C = gsl_matrix_calloc((size_t)dp, (size_t)dp);
    V = gsl_matrix_alloc((size_t)dp, (size_t)dp);
    ev = gsl_vector_alloc((size_t)dp);
    ws = gsl_eigen_symmv_alloc((size_t)dp);
    lam = malloc(sizeof(double) * dp);
    xx = malloc(sizeof(double) * (dp > np ? dp : np));
    yy = malloc(sizeof(double) * (dp > np ? dp : np));
    if (!mu || !C || !V || !ev || !ws || !lam || !xx || !yy) {
        rc = fk_err(FK_ENOMEM, "synth --fit: out of memory");
        goto done;
    }
    mean_cov(X, n, d, ch, dp, mu, C);
    /* per-pair variance (before the eigensolver overwrites C) */
    double *pvar = tmp; /* reuse [np] */
    pair_variance(C, ch, dp, d, pvar);
    if (gsl_eigen_symmv(C, ev, V, ws)) {
        rc = fk_err(FK_EEXTERNAL, "synth --fit: eigen-decomposition failed");
        goto done;
    }
    gsl_eigen_symmv_sort(ev, V, GSL_EIGEN_SORT_VAL_DESC);
    double tot = 0;
    for (int i = 0; i < dp; i++) {
        lam[i] = gsl_vector_get(ev, (size_t)i) > 0 ? gsl_vector_get(ev, (size_t)i) : 0;
        tot += lam[i];
    }
    for (int i = 0; i < d; i++)
        spec_out[i] = i < dp && tot > 0 ? lam[i] / tot : 0;
    double u2;
    double floor_ = fit_spectrum(lam, dp, n, tot, mu, xx, yy, f, &u2);
    if (is_key)
        fit_key_pairs(d, pvar, out, n_out, prms, lmed, floor_, u2, xx, yy, f);
    int r = (int)f->rank, kd = r < KURT_DIRS ? r : KURT_DIRS;
    f->kurt = coef_kurtosis(X, d, ch, dp, mu, V, kd, seg, n_seg);
done:
    free(lmed);
    free(m2);
    free(prms);
    free(tmp);
    free(out);
    free(ch);
    free(mu);
    free(lam);
    free(xx);
    free(yy);
    if (C)
        gsl_matrix_free(C);
    if (V)
        gsl_matrix_free(V);
    if (ev)
        gsl_vector_free(ev);
    if (ws)
        gsl_eigen_symmv_free(ws);
    return rc;
}

/* Growing buffers of one layer. */
struct pool {
    double *x[2];            /* [n][d] per kind */
    long n[2], cap[2];
    long *seg[2];            /* segment offsets, [n_seg + 1] */
    int n_seg[2], seg_cap[2];
    double sink_k, sink_v;   /* sums of the per-(trace, head) ratios */
    int n_sink;
    double *mass, *lstd;     /* per (query row, head) */
    long n_att, cap_att;
};

static int pool_push(struct pool *p, int kind, const double *rows, long n, int d)
{
    if (p->n[kind] + n > p->cap[kind]) {
        long cap = (p->n[kind] + n) * 2;
        double *x = realloc(p->x[kind], sizeof(double) * (size_t)cap * d);
        if (!x)
            return fk_err(FK_ENOMEM, "synth --fit: out of memory");
        p->x[kind] = x;
        p->cap[kind] = cap;
    }
    if (p->n_seg[kind] + 2 > p->seg_cap[kind]) {
        int cap = (p->n_seg[kind] + 2) * 2;
        long *s = realloc(p->seg[kind], sizeof(long) * (size_t)cap);
        if (!s)
            return fk_err(FK_ENOMEM, "synth --fit: out of memory");
        p->seg[kind] = s;
        p->seg_cap[kind] = cap;
    }
    if (p->n_seg[kind] == 0)
        p->seg[kind][0] = 0;
    memcpy(p->x[kind] + (size_t)p->n[kind] * d, rows, sizeof(double) * (size_t)n * d);
    p->n[kind] += n;
    p->seg[kind][++p->n_seg[kind]] = p->n[kind];
    return FK_OK;
}

static int att_push(struct pool *p, double mass, double lstd)
{
    if (p->n_att + 1 > p->cap_att) {
        long cap = (p->n_att + 1) * 2;
        double *a = realloc(p->mass, sizeof(double) * (size_t)cap);
        if (!a)
            return fk_err(FK_ENOMEM, "synth --fit: out of memory");
        p->mass = a;
        double *b = realloc(p->lstd, sizeof(double) * (size_t)cap);
        if (!b)
            return fk_err(FK_ENOMEM, "synth --fit: out of memory");
        p->lstd = b;
        p->cap_att = cap;
    }
    p->mass[p->n_att] = mass;
    p->lstd[p->n_att++] = lstd;
    return FK_OK;
}

static void pool_free(struct pool *p)
{
    for (int k = 0; k < 2; k++) {
        free(p->x[k]);
        free(p->seg[k]);
    }
    free(p->mass);
    free(p->lstd);
    memset(p, 0, sizeof *p);
}

/* Sink mass and logit spread of every query row (token >= 2) of one layer of one trace,
 * into the pool of the query head's KV head (p: one pool per KV head). */
static int attention_stats(struct fk_trace *t, const struct fk_trace_info *in, int layer,
                           const float *K, struct pool *p)
{
    int d = in->head_dim, T = in->n_tokens, nq = in->n_queries, group = in->n_q_heads /
                                                                       in->n_kv_heads;
    float *Q = malloc(sizeof(float) * (size_t)in->n_q_heads * nq * d);
    int32_t *qi = malloc(sizeof(int32_t) * (size_t)nq);
    double *z = malloc(sizeof(double) * (size_t)T);
    int rc = Q && qi && z ? FK_OK : fk_err(FK_ENOMEM, "synth --fit: out of memory");
    if (rc == FK_OK)
        rc = fk_trace_read(t, layer, FK_KIND_Q, Q);
    if (rc == FK_OK)
        rc = fk_trace_read_query_idx(t, layer, qi);
    double sc = 1 / sqrt((double)d);
    for (int h = 0; rc == FK_OK && h < in->n_q_heads; h++) {
        const float *kh = K + (size_t)(h / group) * T * d;
        for (int r = 0; rc == FK_OK && r < nq; r++) {
            int tok = qi[r];
            if (tok < 2)
                continue;
            const float *q = Q + ((size_t)h * nq + r) * d;
            double mx = -INFINITY, s1 = 0, s2 = 0;
            for (int j = 0; j <= tok; j++) {
                double v = 0;
                for (int c = 0; c < d; c++)
                    v += (double)q[c] * kh[(size_t)j * d + c];
                z[j] = v * sc;
                mx = z[j] > mx ? z[j] : mx;
                if (j > 0) {
                    s1 += z[j];
                    s2 += z[j] * z[j];
                }
            }
            double den = 0;
            for (int j = 0; j <= tok; j++)
                den += exp(z[j] - mx);
            double m1 = s1 / tok, var = s2 / tok - m1 * m1;
            rc = att_push(&p[h / group], exp(z[0] - mx) / den, sqrt(var > 0 ? var : 0));
        }
    }
    free(Q);
    free(qi);
    free(z);
    return rc;
}

/* Reads one layer of one trace into the pools (one per KV head). */
static int pool_trace(struct fk_trace *t, int layer, struct pool *p)
{
    const struct fk_trace_info *in = fk_trace_get_info(t);
    int d = in->head_dim, T = in->n_tokens, H = in->n_kv_heads, hd = d / 2;
    size_t nkv = (size_t)H * T * d;
    float *K = malloc(sizeof(float) * nkv), *Vv = malloc(sizeof(float) * nkv);
    double *rows = malloc(sizeof(double) * (size_t)T * d);
    const int32_t *pos = fk_trace_positions(t);
    int rc = K && Vv && rows ? FK_OK : fk_err(FK_ENOMEM, "synth --fit: out of memory");
    if (rc == FK_OK && in->keys_post_rope && in->rope.type != FK_ROPE_DEFAULT)
        rc = fk_err(FK_ENOTSUP, "%s: rope_type other than default: the fit un-rotates "
                    "default RoPE only", fk_trace_path(t));
    if (rc == FK_OK)
        rc = fk_trace_read(t, layer, FK_KIND_K, K);
    if (rc == FK_OK)
        rc = fk_trace_read(t, layer, FK_KIND_V, Vv);
    for (int g = 0; rc == FK_OK && g < H; g++) {
        for (int kind = 0; rc == FK_OK && kind < 2; kind++) {
            const float *src = (kind ? Vv : K) + (size_t)g * T * d;
            double n0 = 0, nt = 0;
            for (int tk = 0; tk < T; tk++) {
                double *x = rows + (size_t)(tk ? tk - 1 : 0) * d, nn = 0;
                double x0[4096];
                double *dst = tk ? x : x0;
                for (int c = 0; c < d; c++)
                    dst[c] = src[(size_t)tk * d + c];
                if (!kind && in->keys_post_rope)
                    rope_undo(&in->rope, d, pos[tk], dst);
                if (!kind && in->keys_post_rope && in->rope.layout == FK_ROPE_HALF) {
                    /* store pairs interleaved, so the fit reads pair i at (2i, 2i+1) */
                    double tmp[4096];
                    for (int i = 0; i < hd; i++) {
                        tmp[2 * i] = dst[i];
                        tmp[2 * i + 1] = dst[i + hd];
                    }
                    memcpy(dst, tmp, sizeof(double) * (size_t)d);
                }
                for (int c = 0; c < d; c++)
                    nn += dst[c] * dst[c];
                if (tk)
                    nt += nn;
                else
                    n0 = nn;
            }
            rc = pool_push(&p[g], kind, rows, T - 1, d);
            double ratio = nt > 0 ? sqrt(n0 / (nt / (T - 1))) : 0;
            if (kind)
                p[g].sink_v += ratio;
            else
                p[g].sink_k += ratio;
        }
        p[g].n_sink++;
    }
    if (rc == FK_OK && in->has_queries)
        rc = attention_stats(t, in, layer, K, p);
    free(K);
    free(Vv);
    free(rows);
    return rc;
}

void fk_synth_profile_free(struct fk_synth_profile **p)
{
    if (!p || !*p)
        return;
    free((*p)->knob);
    free((*p)->spectrum);
    free(*p);
    *p = NULL;
}

static struct fk_synth_profile *profile_alloc(int L, int d)
{
    struct fk_synth_profile *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->n_layers = L;
    p->head_dim = d;
    p->knob = calloc((size_t)L * FK_PROFILE_NKNOBS, sizeof(double));
    p->spectrum = calloc((size_t)L * 2 * d, sizeof(double));
    if (!p->knob || !p->spectrum)
        fk_synth_profile_free(&p);
    return p;
}

/* Opens the traces paths [n_paths] into tr and checks they share one shape: its layers *L and
 * head_dim *d; *queries: whether all have queries; *tokens: their tokens in total. */
static int open_traces(const char *const *paths, int n_paths, struct fk_trace **tr, int *L,
                       int *d, int *queries, long *tokens)
{
    int rc = FK_OK;
    for (int i = 0; i < n_paths && rc == FK_OK; i++) {
        rc = fk_trace_open(paths[i], &tr[i]);
        if (rc)
            break;
        const struct fk_trace_info *in = fk_trace_get_info(tr[i]);
        if (i == 0) {
            *L = in->n_layers;
            *d = in->head_dim;
        }
        if (in->n_layers != *L || in->head_dim != *d)
            rc = fk_err(FK_EINVAL, "%s: %d layers, head_dim %d; expected %d and %d as %s "
                        "(one profile fits traces of one shape)", paths[i], in->n_layers,
                        in->head_dim, *L, *d, paths[0]);
        else if (in->n_tokens < 3)
            rc = fk_err(FK_EINVAL, "%s: %d tokens; expected at least 3", paths[i],
                        in->n_tokens);
        else if (*d % 2 || *d > 4096)
            rc = fk_err(FK_EINVAL, "%s: head_dim %d; expected an even size <= 4096", paths[i],
                        *d);
        else if (in->keys_post_rope && !in->has_rope)
            rc = fk_err(FK_EINVAL, "%s: post-RoPE keys without the RoPE attributes "
                        "(rope_layout; datasets/README.md): cannot un-rotate them", paths[i]);
        *queries &= in->has_queries;
        *tokens += in->n_tokens;
    }
    return rc;
}

/* Fits one layer from its pools pl [H]: adds the heads' mean spectra into sp [2 d] and writes
 * the knobs k [FK_PROFILE_NKNOBS] (spec [d]: scratch; def: defaults where a trace has none). */
static int fit_layer(struct pool *pl, int H, int d, int queries,
                     const struct fk_synth_opts *def, double *spec, double *sp, double *k)
{
    int rc = FK_OK;
    /* every KV head is fitted on its own (each has its own basis, mean and outliers);
     * the layer's knob is the mean over heads (ranks and outlier pairs rounded) */
    double acc[FK_PROFILE_NKNOBS] = {0}, kurt = 0, mass = 0, lstd = 0;
    long n_att = 0;
    for (int g = 0; rc == FK_OK && g < H; g++) {
        struct kind_fit fk, fv;
        rc = fit_kind(pl[g].x[0], pl[g].n[0], d, 1, pl[g].seg[0], pl[g].n_seg[0], &fk,
                      spec);
        for (int c = 0; rc == FK_OK && c < d; c++)
            sp[c] += spec[c] / H;
        if (rc == FK_OK)
            rc = fit_kind(pl[g].x[1], pl[g].n[1], d, 0, pl[g].seg[1], pl[g].n_seg[1],
                          &fv, spec);
        for (int c = 0; rc == FK_OK && c < d; c++)
            sp[d + c] += spec[c] / H;
        if (rc)
            break;
        double v[FK_PROFILE_NKNOBS] = {
            [K_RANK] = fk.rank, [K_DECAY] = fk.decay, [K_NOISE] = fk.noise,
            [K_MEAN] = fk.mean, [K_TILT] = fk.tilt, [K_OPAIRS] = fk.opairs,
            [K_OSCALE] = fk.oscale, [V_RANK] = fv.rank, [V_DECAY] = fv.decay,
            [V_NOISE] = fv.noise, [V_MEAN] = fv.mean,
            [SINK_K] = pl[g].n_sink ? pl[g].sink_k / pl[g].n_sink : def->sink_key_scale,
            [SINK_V] = pl[g].n_sink ? pl[g].sink_v / pl[g].n_sink : def->sink_value_scale};
        for (int j = 0; j < FK_PROFILE_NKNOBS; j++)
            acc[j] += v[j] / H;
        kurt += 0.5 * (fk.kurt + fv.kurt) / H;
        if (pl[g].n_att > 0) {
            mass += median(pl[g].mass, pl[g].n_att);
            lstd += median(pl[g].lstd, pl[g].n_att);
            n_att++;
        }
    }
    if (rc == FK_OK) {
        memcpy(k, acc, sizeof acc);
        k[K_RANK] = round(k[K_RANK]);
        k[V_RANK] = round(k[V_RANK]);
        k[K_OPAIRS] = round(k[K_OPAIRS]);
        k[DOF] = kurt > KURT_GAUSS ? 4 + 6 / kurt : 0;
        if (k[DOF] > 1e6)
            k[DOF] = 0;
        k[SINK_MASS] = queries && n_att ? mass / n_att : def->sink_mass;
        k[LOGIT_STD] = queries && n_att ? lstd / n_att : def->attn_logit_std;
        if (k[SINK_MASS] > 0.999)
            k[SINK_MASS] = 0.999;
    }
    return rc;
}

int fk_synth_fit(const char *const *paths, int n_paths, struct fk_synth_profile **out)
{
    *out = NULL;
    if (n_paths < 1)
        return fk_err(FK_EINVAL, "synth --fit: no traces given");
    struct fk_trace **tr = calloc((size_t)n_paths, sizeof *tr);
    if (!tr)
        return fk_err(FK_ENOMEM, "synth --fit: out of memory");
    int rc = FK_OK, L = 0, d = 0, queries = 1;
    long tokens = 0;
    rc = open_traces(paths, n_paths, tr, &L, &d, &queries, &tokens);
    struct fk_synth_profile *p = rc == FK_OK ? profile_alloc(L, d) : NULL;
    if (rc == FK_OK && !p)
        rc = fk_err(FK_ENOMEM, "synth --fit: out of memory");
    if (p) {
        p->n_traces = n_paths;
        p->tokens = tokens;
        size_t o = 0;
        for (int i = 0; i < n_paths && o + 2 < sizeof p->source; i++)
            o += (size_t)snprintf(p->source + o, sizeof p->source - o, "%s%s", i ? ";" : "",
                                  paths[i]);
    }
    struct fk_synth_opts def;
    fk_synth_defaults(&def);
    int H = rc == FK_OK ? fk_trace_get_info(tr[0])->n_kv_heads : 0;
    for (int i = 1; rc == FK_OK && i < n_paths; i++)
        if (fk_trace_get_info(tr[i])->n_kv_heads != H)
            rc = fk_err(FK_EINVAL, "%s: %d KV heads; expected %d as %s", paths[i],
                        fk_trace_get_info(tr[i])->n_kv_heads, H, paths[0]);
    struct pool *pl = rc == FK_OK ? calloc((size_t)H, sizeof *pl) : NULL;
    double *spec = rc == FK_OK ? malloc(sizeof(double) * (size_t)d) : NULL;
    if (rc == FK_OK && (!pl || !spec))
        rc = fk_err(FK_ENOMEM, "synth --fit: out of memory");
    for (int l = 0; rc == FK_OK && l < L; l++) {
        for (int i = 0; i < n_paths && rc == FK_OK; i++)
            rc = pool_trace(tr[i], l, pl);
        if (rc == FK_OK)
            rc = fit_layer(pl, H, d, queries, &def, spec, p->spectrum + (size_t)l * 2 * d,
                           p->knob + (size_t)l * FK_PROFILE_NKNOBS);
        for (int g = 0; pl && g < H; g++)
            pool_free(&pl[g]);
        if (rc)
            rc = fk_err_context(rc, "synth --fit: layer %d", l);
    }
    free(pl);
    free(spec);
    for (int i = 0; i < n_paths; i++)
        fk_trace_close(&tr[i]);
    free(tr);
    if (rc) {
        fk_synth_profile_free(&p);
        return rc;
    }
    *out = p;
    return FK_OK;
}

/* ---- the profile file ---------------------------------------------------------------- */

int fk_synth_profile_write(const struct fk_synth_profile *p, const char *path)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    hid_t f = H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (f < 0)
        return fk_err(FK_EIO, "%s: cannot create the profile file", tmp);
    int rc = fk_h5_put_str(f, "schema", PROFILE_SCHEMA);
    if (!rc)
        rc = fk_h5_put_i64(f, "schema_version", 1);
    if (!rc)
        rc = fk_h5_put_i64(f, "n_layers", p->n_layers);
    if (!rc)
        rc = fk_h5_put_i64(f, "head_dim", p->head_dim);
    if (!rc)
        rc = fk_h5_put_i64(f, "n_traces", p->n_traces);
    if (!rc)
        rc = fk_h5_put_i64(f, "tokens", p->tokens);
    if (!rc)
        rc = fk_h5_put_str(f, "source", p->source);
    if (!rc)
        rc = fk_h5_put_str(f, "generator", "fadkv-bench synth --fit");
    double *col = malloc(sizeof(double) * (size_t)p->n_layers);
    if (!rc && !col)
        rc = fk_err(FK_ENOMEM, "out of memory");
    hid_t g = rc ? -1 : H5Gcreate2(f, "knobs", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (!rc && g < 0)
        rc = fk_err(FK_EEXTERNAL, "%s: cannot create group knobs", tmp);
    for (int k = 0; !rc && k < FK_PROFILE_NKNOBS; k++) {
        for (int l = 0; l < p->n_layers; l++)
            col[l] = p->knob[(size_t)l * FK_PROFILE_NKNOBS + k];
        hsize_t dims[1] = {(hsize_t)p->n_layers};
        rc = fk_h5_write(g, fk_synth_profile_knobs[k], H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, 1,
                         dims, 0, 0, col);
    }
    if (g >= 0)
        H5Gclose(g);
    free(col);
    if (!rc) {
        hsize_t dims[3] = {(hsize_t)p->n_layers, 2, (hsize_t)p->head_dim};
        rc = fk_h5_write(f, "spectrum", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, 3, dims, 0, 0,
                         p->spectrum);
    }
    if (H5Fclose(f) < 0 && !rc)
        rc = fk_err(FK_EIO, "%s: cannot close", tmp);
    if (!rc && rename(tmp, path))
        rc = fk_err(FK_EIO, "%s: cannot rename to %s", tmp, path);
    if (rc)
        remove(tmp);
    return rc ? fk_err_context(rc, "%s", path) : FK_OK;
}

static int read_doubles(hid_t loc, const char *file, const char *name, int rank,
                        const hsize_t *want, double *dst)
{
    hid_t ds = H5Dopen2(loc, name, H5P_DEFAULT);
    if (ds < 0)
        return fk_err(FK_ECORRUPT, "%s: profile dataset %s missing", file, name);
    int r;
    hsize_t dims[8];
    int rc = fk_h5_shape(ds, file, name, &r, dims);
    for (int i = 0; !rc && i < rank; i++)
        if (r != rank || dims[i] != want[i])
            rc = fk_err(FK_ECORRUPT, "%s: profile dataset %s: unexpected shape (expected "
                        "rank %d, extent %llu on axis %d)", file, name, rank,
                        (unsigned long long)want[i], i);
    if (!rc && H5Dread(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, dst) < 0)
        rc = fk_err(FK_EEXTERNAL, "%s: cannot read profile dataset %s", file, name);
    H5Dclose(ds);
    return rc;
}

int fk_synth_profile_read(const char *path, struct fk_synth_profile **out)
{
    *out = NULL;
    hid_t f;
    FK_TRY(fk_h5_open_ro(path, "synth profile", &f));
    char schema[64];
    int64_t ver = 0, L = 0, d = 0, nt = 0, tok = 0;
    int rc = fk_h5_attr_str(f, path, "schema", schema, sizeof schema);
    if (!rc && strcmp(schema, PROFILE_SCHEMA))
        rc = fk_err(FK_ECORRUPT, "%s: schema \"%s\"; expected \"%s\"", path, schema,
                    PROFILE_SCHEMA);
    if (!rc)
        rc = fk_h5_attr_i64(f, path, "schema_version", &ver);
    if (!rc && ver != 1)
        rc = fk_err(FK_ECORRUPT, "%s: schema_version %lld; expected 1", path, (long long)ver);
    if (!rc)
        rc = fk_h5_attr_i64(f, path, "n_layers", &L);
    if (!rc)
        rc = fk_h5_attr_i64(f, path, "head_dim", &d);
    if (!rc && (L < 1 || L > 4096 || d < 2 || d > 4096))
        rc = fk_err(FK_ECORRUPT, "%s: n_layers %lld, head_dim %lld; expected 1..4096 and "
                    "2..4096", path, (long long)L, (long long)d);
    if (!rc)
        rc = fk_h5_attr_i64(f, path, "n_traces", &nt);
    if (!rc)
        rc = fk_h5_attr_i64(f, path, "tokens", &tok);
    struct fk_synth_profile *p = rc ? NULL : profile_alloc((int)L, (int)d);
    if (!rc && !p)
        rc = fk_err(FK_ENOMEM, "out of memory");
    if (!rc) {
        snprintf(p->path, sizeof p->path, "%s", path);
        p->n_traces = (int)nt;
        p->tokens = (long)tok;
        rc = fk_h5_attr_str(f, path, "source", p->source, sizeof p->source);
    }
    double *col = rc ? NULL : malloc(sizeof(double) * (size_t)L);
    if (!rc && !col)
        rc = fk_err(FK_ENOMEM, "out of memory");
    hid_t g = rc ? -1 : H5Gopen2(f, "knobs", H5P_DEFAULT);
    if (!rc && g < 0)
        rc = fk_err(FK_ECORRUPT, "%s: profile group knobs missing", path);
    for (int k = 0; !rc && k < FK_PROFILE_NKNOBS; k++) {
        hsize_t want[1] = {(hsize_t)L};
        rc = read_doubles(g, path, fk_synth_profile_knobs[k], 1, want, col);
        for (int l = 0; !rc && l < L; l++) {
            if (!isfinite(col[l]))
                rc = fk_err(FK_ECORRUPT, "%s: knobs/%s[%d] is not finite", path,
                            fk_synth_profile_knobs[k], l);
            else
                p->knob[(size_t)l * FK_PROFILE_NKNOBS + k] = col[l];
        }
    }
    if (g >= 0)
        H5Gclose(g);
    free(col);
    if (!rc) {
        hsize_t want[3] = {(hsize_t)L, 2, (hsize_t)d};
        rc = read_doubles(f, path, "spectrum", 3, want, p->spectrum);
    }
    H5Fclose(f);
    if (rc) {
        fk_synth_profile_free(&p);
        return rc;
    }
    *out = p;
    return FK_OK;
}

int fk_synth_profile_layer(const struct fk_synth_profile *p, int l, int L)
{
    long pl = (long)l * p->n_layers / (L > 0 ? L : 1);
    return pl < p->n_layers ? (int)pl : p->n_layers - 1;
}

int fk_synth_profile_apply(const struct fk_synth_profile *p, int l, struct fk_synth_opts *o)
{
    int pl = fk_synth_profile_layer(p, l, o->n_layers);
    for (int k = 0; k < FK_PROFILE_NKNOBS; k++) {
        char v[64];
        snprintf(v, sizeof v, "%.17g", p->knob[(size_t)pl * FK_PROFILE_NKNOBS + k]);
        int rc = fk_synth_set(o, fk_synth_profile_knobs[k], v);
        if (rc)
            return fk_err_context(rc, "profile layer %d (for layer %d of %d)", pl, l,
                                  o->n_layers);
    }
    return FK_OK;
}
