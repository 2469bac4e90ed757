/* SPDX-License-Identifier: MIT
 * gear: GEAR (spec families-quant-2026.md 5; opengear-project/GEAR's simulated path, read
 * and never copied): a quantiser backbone, sparse outliers kept exact, and a low-rank
 * approximation of the quantisation error, on blocks of `gap` tokens compressed once
 * (the spec's `block` streaming mode; the newest tokens wait exact until their block is
 * full). Per block of T_c = gap tokens, for the stream's H heads (K or V):
 *   1. outliers: values, per token row of the H d entries, the k = floor(s H d / 2) largest
 *      and k smallest; keys, per channel over the T_c tokens, k = floor(s T_c / 2) (option
 *      key_sparse = fraction) or GEAR's own k = floor(s H d / 2) (reference); they are
 *      replaced by their row's mean before quantising, and restored exactly after;
 *   2. the backbone, KIVI_V2: keys per channel in groups of `group` tokens, values per token
 *      in groups of `group` channels; scale = (max - min) / (2^b - 1), q = round-half-even
 *      ((x - min) / scale) (not below 0), x_hat = q scale + min (a constant group: min);
 *   3. low rank: per head, the error E = X - (Q_hat + S) (T_c x d) by GEAR's power
 *      iteration: P uniform in [0, 1) (seeded), `loops` steps of Q = E P, P = E^T Q, the last
 *      with P and Q orthonormalised (reduced QR): E_lr = Q P^T, rank r;
 *   4. x_hat = Q_hat + S + E_lr, rounded to fp16.
 * Bytes per block and head (the data GEAR keeps, fp16): codes b d T_c / 8; metadata 4 bytes
 * per group (keys d T_c / group, values T_c d / group); outliers 2 + index_bytes each; low
 * rank 2 r (T_c + d). Lossy, dense; a block's codes depend on its own tokens only.
 */
#include <gsl/gsl_rng.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/fk_err.h"
#include "core/fk_codec.h"
#include "kernels/fk_sparse.h"
#include "quant/fk_quant_rows.h"

enum { KS_FRACTION, KS_REFERENCE };
static const char *const ks_names[] = {"fraction", "reference", NULL};

struct gear_opts {
    struct fk_common_opts c;     /* unused: the buffer callback gives the rule */
    int bits, group, gap, rank, loops, index_bytes, key_sparse, rank_seed;
    double outliers;             /* s */
};

static const struct fk_option gear_options[] = {
    {"bits", FK_OPT_INT, offsetof(struct gear_opts, bits), 2, 1, 8, NULL,
     "backbone bits (KIVI_V2: keys per channel, values per token)"},
    {"group", FK_OPT_INT, offsetof(struct gear_opts, group), 0, 0, 1 << 16, NULL,
     "backbone group: tokens for keys (divides gap), channels for values (divides head_dim); "
     "0: 64, or head_dim when smaller"},
    {"gap", FK_OPT_INT, offsetof(struct gear_opts, gap), 64, 1, 1 << 20, NULL,
     "tokens per compressed block (GEAR's streaming gap); the newest wait exact"},
    {"rank", FK_OPT_INT, offsetof(struct gear_opts, rank), 2, 0, 4096, NULL,
     "rank of the low-rank error per head and block (0: none)"},
    {"loops", FK_OPT_INT, offsetof(struct gear_opts, loops), 3, 1, 64, NULL,
     "power iterations"},
    {"outliers", FK_OPT_DOUBLE, offsetof(struct gear_opts, outliers), 0.02, 0, 0.5, NULL,
     "fraction s of entries kept exact as outliers"},
    {"key_sparse", FK_OPT_ENUM, offsetof(struct gear_opts, key_sparse), KS_FRACTION, 0, 1,
     ks_names, "keys' outliers per channel: fraction (s T_c / 2 per side) | reference "
     "(GEAR's s H d / 2, whatever T_c)"},
    {"index_bytes", FK_OPT_INT, offsetof(struct gear_opts, index_bytes), 2, 2, 8, NULL,
     "bytes of an outlier's index (2, 4 or 8)"},
    {"rank_seed", FK_OPT_INT, offsetof(struct gear_opts, rank_seed), 1, 0, 1 << 30, NULL,
     "seed of the power iteration's start"},
    {NULL, 0, 0, 0, 0, 0, NULL, NULL},
};

static void gear_buffer(const void *opts, int kind, struct fk_buffer *b)
{
    (void)kind;
    const struct gear_opts *o = opts;
    *b = (struct fk_buffer){.mode = FK_BUF_BLOCK, .n_b = o->gap, .a_len = 1};
}

/* group = 0: GEAR's 64, or the head when it is smaller (head_dim 0: not known yet) */
static int gear_group(const struct gear_opts *o, int head_dim)
{
    if (o->group > 0)
        return o->group;
    return head_dim > 0 && head_dim < 64 ? head_dim : 64;
}

static void gear_resolve(void *opts, int head_dim, int n_atoms)
{
    (void)n_atoms;
    struct gear_opts *o = opts;
    if (o->group == 0 && head_dim > 0)
        o->group = gear_group(o, head_dim);
}

static int gear_check(const void *opts, int head_dim, int n_atoms)
{
    (void)n_atoms;
    const struct gear_opts *o = opts;
    int G = gear_group(o, head_dim);
    if (o->gap % G)
        return fk_err(FK_ECONFIG, "group = %d must divide gap = %d (keys are grouped over the "
                      "block's tokens)", G, o->gap);
    if (head_dim > 0 && head_dim % G)
        return fk_err(FK_ECONFIG, "group = %d must divide head_dim %d (values are grouped "
                      "along a head's channels)", G, head_dim);
    if (o->index_bytes != 2 && o->index_bytes != 4 && o->index_bytes != 8)
        return fk_err(FK_ECONFIG, "index_bytes = %d: 2, 4 or 8", o->index_bytes);
    if (head_dim > 0 && o->rank > head_dim)
        return fk_err(FK_ECONFIG, "rank = %d exceeds head_dim %d", o->rank, head_dim);
    return FK_OK;
}

struct gear {
    struct gear_opts o;
    struct fkr_rows r;
    int m, H, kind;
    double bytes;                /* of the blocks stored */
    float *x, *y;                /* [gap][H][m] one block as given, as read back */
    uint8_t *out;                /* [gap][H][m] 1: an outlier */
    double *E, *P, *Q, *T;       /* low rank scratch */
    int *sel;                    /* [gap H m] the outliers chosen so far, best first */
    float *yt;                   /* [H m][gap] keys: the block transposed (a channel's
                                  * tokens contiguous) */
    uint8_t *outt;               /* [H m][gap] its outlier marks */
    gsl_rng *rng;
};

static void gear_close(void *state)
{
    struct gear *g = state;
    if (!g)
        return;
    fkr_free(&g->r);
    free(g->x), free(g->y), free(g->out), free(g->E), free(g->P), free(g->Q), free(g->T);
    free(g->sel), free(g->yt), free(g->outt);
    if (g->rng)
        gsl_rng_free(g->rng);
    free(g);
}

static int gear_open(const void *opts, const struct fk_stream_env *env, void **state)
{
    struct gear *g = calloc(1, sizeof *g);
    if (!g)
        return fk_err(FK_ENOMEM, "out of memory");
    *state = g;
    memcpy(&g->o, opts, sizeof g->o);
    g->m = env->head_dim;
    g->H = env->n_heads;
    g->kind = env->kind;
    gear_resolve(&g->o, g->m, 0);
    FK_TRY(gear_check(opts, g->m, 0));
    FK_TRY(fkr_init(&g->r, env, "gear"));
    size_t blk = (size_t)g->o.gap * g->H * g->m, tm = (size_t)g->o.gap * g->m;
    size_t r = (size_t)(g->o.rank > 0 ? g->o.rank : 1);
    g->x = malloc(sizeof(float) * blk);
    g->y = malloc(sizeof(float) * blk);
    g->out = malloc(blk);
    g->E = malloc(sizeof(double) * tm);
    g->P = malloc(sizeof(double) * (size_t)g->m * r);
    g->Q = malloc(sizeof(double) * (size_t)g->o.gap * r);
    g->T = malloc(sizeof(double) * tm);
    g->sel = malloc(sizeof(int) * blk);
    g->yt = malloc(sizeof(float) * blk);
    g->outt = malloc(blk);
    g->rng = gsl_rng_alloc(gsl_rng_mt19937);
    if (!g->x || !g->y || !g->out || !g->E || !g->P || !g->Q || !g->T || !g->sel || !g->yt || !g->outt ||
        !g->rng)
        return fk_err(FK_ENOMEM, "out of memory (gear state)");
    gsl_rng_set(g->rng, (unsigned long)g->o.rank_seed * 1000003ul +
                            (unsigned long)env->layer * 2u + (unsigned long)env->kind);
    return FK_OK;
}

/* The k largest and k smallest of n values at x[0], x[xs], ... marked in out[0], out[os],
 * ... (ties to the earlier position; the smallest among those not already the largest);
 * returns the mean of the whole row. One pass per side over a list sel of the best so
 * far (best first): a value enters when it beats the list's last, after its equals. */
static double mark_outliers(const float *x, ptrdiff_t xs, int n, int k, uint8_t *out,
                            ptrdiff_t os, int *sel)
{
    double mean = 0;
    for (int i = 0; i < n; i++) {
        mean += x[i * xs];
        out[i * os] = 0;
    }
    mean /= n;
    k = k < n ? k : n;
    for (int side = 0; side < 2 && k > 0; side++) {
        int len = 0;
        for (int i = 0; i < n; i++) {
            if (out[i * os])
                continue;
            float v = x[i * xs];
#define BEATS(a, b) (side ? (a) < (b) : (a) > (b))
            if (len == k && !BEATS(v, x[sel[len - 1] * xs]))
                continue;
            int p = len < k ? len++ : k - 1; /* the slot freed at the end, then moved up */
            while (p > 0 && BEATS(v, x[sel[p - 1] * xs])) {
                sel[p] = sel[p - 1];
                p--;
            }
            sel[p] = i;
#undef BEATS
        }
        for (int c = 0; c < len; c++)
            out[sel[c] * os] = 1;
    }
    return mean;
}

/* Quantises n values at v[0], v[vs], ... (outliers already replaced) into place. */
static void quant_group(float *v, ptrdiff_t vs, int n, int bits)
{
    float mn = v[0], mx = v[0];
    for (int i = 1; i < n; i++) {
        mn = v[i * vs] < mn ? v[i * vs] : mn;
        mx = v[i * vs] > mx ? v[i * vs] : mx;
    }
    float scale = (mx - mn) / (float)((1 << bits) - 1);
    for (int i = 0; i < n; i++) {
        float q = scale > 0 ? (v[i * vs] - mn) / scale : 0.0f;
        q = q > 0 ? nearbyintf(q) : 0.0f; /* relu, then round half to even */
        v[i * vs] = q * scale + mn;
    }
}

/* Orthonormalises the c columns of A (rows x c, row-major) in place (Gram-Schmidt, twice). */
static void orth(double *A, int rows, int c)
{
    for (int j = 0; j < c; j++) {
        for (int pass = 0; pass < 2; pass++)
            for (int l = 0; l < j; l++) {
                double d = 0;
                for (int i = 0; i < rows; i++)
                    d += A[(size_t)i * c + j] * A[(size_t)i * c + l];
                for (int i = 0; i < rows; i++)
                    A[(size_t)i * c + j] -= d * A[(size_t)i * c + l];
            }
        double n = 0;
        for (int i = 0; i < rows; i++)
            n += A[(size_t)i * c + j] * A[(size_t)i * c + j];
        n = sqrt(n);
        for (int i = 0; i < rows; i++)
            A[(size_t)i * c + j] = n > 0 ? A[(size_t)i * c + j] / n : 0.0;
    }
}

/* The low-rank part of E (T x m, row-major) added into y (head h of the block). */
static void low_rank(struct gear *g, int T, int h)
{
    int m = g->m, r = g->o.rank;
    double *E = g->E, *P = g->P, *Q = g->Q;
    for (int i = 0; i < m * r; i++)
        P[i] = gsl_rng_uniform(g->rng);
    for (int it = 0; it < g->o.loops; it++) {
        int last = it == g->o.loops - 1;
        if (last)
            orth(P, m, r);
        for (int t = 0; t < T; t++) /* Q = E P */
            for (int c = 0; c < r; c++) {
                double s = 0;
                for (int j = 0; j < m; j++)
                    s += E[(size_t)t * m + j] * P[(size_t)j * r + c];
                Q[(size_t)t * r + c] = s;
            }
        if (last)
            orth(Q, T, r);
        /* P = E^T Q, each sum over t in order from 0, E read row by row */
        double *restrict Pr = P;
        for (int i = 0; i < m * r; i++)
            Pr[i] = 0;
        for (int t = 0; t < T; t++) {
            const double *restrict q = Q + (size_t)t * r, *restrict e = E + (size_t)t * m;
            for (int j = 0; j < m; j++)
                for (int c = 0; c < r; c++)
                    Pr[(size_t)j * r + c] += e[j] * q[c];
        }
    }
    for (int t = 0; t < T; t++) /* y += Q P^T */
        for (int j = 0; j < m; j++) {
            double s = 0;
            for (int c = 0; c < r; c++)
                s += Q[(size_t)t * r + c] * P[(size_t)j * r + c];
            g->y[((size_t)t * g->H + h) * m + j] += (float)s;
        }
}

/* Compresses the block of T tokens in g->x ([T][H][m]) into g->y; returns its bytes. */
static double compress_block(struct gear *g, int T)
{
    int H = g->H, m = g->m, G = g->o.group, b = g->o.bits, HD = H * m;
    size_t n = (size_t)T * HD;
    memcpy(g->y, g->x, sizeof(float) * n);
    double outl = 0;
    if (g->kind == 1) { /* values: outliers per token row, then groups of G channels */
        int k = (int)(g->o.outliers * HD / 2);
        for (int t = 0; t < T; t++) {
            float *row = g->y + (size_t)t * HD;
            double mean = mark_outliers(row, 1, HD, k, g->out + (size_t)t * HD, 1, g->sel);
            for (int i = 0; i < HD; i++)
                if (g->out[(size_t)t * HD + i])
                    row[i] = (float)mean;
            for (int c = 0; c < HD; c += G)
                quant_group(row + c, 1, G, b);
        }
    } else { /* keys: outliers per channel over the block, then groups of G tokens */
        int k = g->o.key_sparse == KS_REFERENCE ? (int)(g->o.outliers * HD / 2)
                                                : (int)(g->o.outliers * T / 2);
        for (int t = 0; t < T; t++) /* channel-major: each channel's tokens contiguous */
            for (int c = 0; c < HD; c++)
                g->yt[(size_t)c * T + t] = g->y[(size_t)t * HD + c];
        for (int c = 0; c < HD; c++) {
            float *ch = g->yt + (size_t)c * T;
            uint8_t *oc = g->outt + (size_t)c * T;
            double mean = mark_outliers(ch, 1, T, k, oc, 1, g->sel);
            for (int t = 0; t < T; t++)
                if (oc[t])
                    ch[t] = (float)mean;
            for (int t0 = 0; t0 < T; t0 += G) /* a short last group in a short block */
                quant_group(ch + t0, 1, T - t0 < G ? T - t0 : G, b);
        }
        for (int t = 0; t < T; t++)
            for (int c = 0; c < HD; c++) {
                g->y[(size_t)t * HD + c] = g->yt[(size_t)c * T + t];
                g->out[(size_t)t * HD + c] = g->outt[(size_t)c * T + t];
            }
    }
    for (size_t i = 0; i < n; i++) /* the outliers back, exact */
        if (g->out[i]) {
            g->y[i] = g->x[i];
            outl++;
        }
    for (int h = 0; g->o.rank > 0 && h < H; h++) {
        for (int t = 0; t < T; t++)
            for (int j = 0; j < m; j++) {
                size_t i = ((size_t)t * H + h) * m + j;
                g->E[(size_t)t * m + j] = (double)g->x[i] - g->y[i];
            }
        low_rank(g, T, h);
    }
    fk_fp16_round(g->y, n);
    double meta = g->kind == 0 ? 4.0 * HD * ((T + G - 1) / G) : 4.0 * T * (HD / G);
    return (double)b * n / 8 + meta + outl * (2 + g->o.index_bytes) +
           2.0 * g->o.rank * (T + m) * H;
}

static int gear_encode(void *state, const struct fk_event *ev, struct fk_vec_out *out)
{
    struct gear *g = state;
    FK_TRY(fkr_check(&g->r, "gear", ev, 0));
    int H = g->H, m = g->m, gap = g->o.gap;
    if (ev->n % H)
        return fk_err(FK_EINVAL, "gear: an event of %d rows is no whole number of tokens of %d "
                      "heads", ev->n, H);
    /* blocks of gap tokens (the buffer rule hands over whole ones; an event of another
     * length ends with a shorter block) */
    for (int b0 = 0; b0 < ev->n; b0 += H * gap) {
        int rows = ev->n - b0 < H * gap ? ev->n - b0 : H * gap, T = rows / H;
        int t0 = ev->token[b0];
        for (int i = 0; i < rows; i++) {
            int h = ev->head[b0 + i], t = ev->token[b0 + i] - t0;
            if (t < 0 || t >= T || ev->token[b0 + i] != t0 + i / H)
                return fk_err(FK_EINVAL, "gear: the event's rows are not whole tokens in order "
                              "(at token %d, head %d)", ev->token[b0 + i], h);
            memcpy(g->x + ((size_t)t * H + h) * m, ev->x + (size_t)(b0 + i) * m,
                   sizeof(float) * (size_t)m);
        }
        double bytes = compress_block(g, T);
        g->bytes += bytes;
        for (int i = 0; i < rows; i++) {
            int h = ev->head[b0 + i], t = ev->token[b0 + i];
            memcpy(fkr_slot(&g->r, h, t), g->y + ((size_t)(t - t0) * H + h) * m,
                   sizeof(float) * (size_t)m);
            fkr_done(&g->r, h, t, ev->x + (size_t)(b0 + i) * m, (float)(bytes / rows),
                     &out[b0 + i]);
        }
    }
    return FK_OK;
}

static int gear_reconstruct(const void *state, int head, int token, float *out)
{
    const struct gear *g = state;
    return fkr_reconstruct(&g->r, "gear", head, token, out);
}

static void gear_stats(const void *state, struct fk_stream_stats *st)
{
    const struct gear *g = state;
    memset(st, 0, sizeof *st);
    st->bytes_codes = g->bytes;
}

const struct fk_codec_ops fk_codec_gear = {
    .name = "gear",
    .summary = "GEAR: KIVI-style quantisation, exact sparse outliers and a low-rank "
               "approximation of the error, per block of gap tokens",
    .opts_size = sizeof(struct gear_opts),
    .options = gear_options,
    .caps = 0,
    .buffer = gear_buffer,
    .check = gear_check,
    .resolve = gear_resolve,
    .open = gear_open,
    .encode = gear_encode,
    .reconstruct = gear_reconstruct,
    .stats = gear_stats,
    .close = gear_close,
    .roles = (const struct fk_role[]){{FK_ROLE_GROUP, "group"}, {FK_ROLE_WINDOW, "gap"},
                                      {0, NULL}},
};
