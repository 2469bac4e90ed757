/* SPDX-License-Identifier: MIT
 * `fadkv-bench train-basis` as a library call (fk_train_basis.h).
 */
#include "train/fk_train_basis.h"

#include <gsl/gsl_blas.h>
#include <gsl/gsl_eigen.h>
#include <gsl/gsl_matrix.h>
#include <gsl/gsl_vector.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fk_clock.h"
#include "common/fk_err.h"
#include "formats/fk_basis.h"
#include "formats/fk_trace.h"
#include "kernels/fk_rope.h"
#include "train/fk_train_dict.h"

/* Sums of one (variant, group): sum x and sum x x^T (upper triangle) over n vectors. */
struct moments {
    double *sum;                 /* [dim] */
    double *xx;                  /* [dim][dim], upper triangle filled by DSYRK */
};

/* Everything one layer needs: the traces, the sums of its variants, scratch. */
struct trainer {
    const struct fk_train_basis_cfg *c;
    struct fk_trace **tr;
    int n_tr;
    struct fk_basis_shape sh;
    int T_max;
    struct moments *mom;         /* [FK_BV_N][n_groups] */
    float *kv;                   /* [H][T_max][d] one trace's keys or values */
    double *x;                   /* [T_max][dim] one group's vectors */
    double *cs, *sn;             /* [T_max][d/2] RoPE table of one trace */
    double *freq;                /* [d/2] */
    gsl_matrix *a, *evec;
    gsl_vector *eval;
    gsl_eigen_symmv_workspace *ws;
};

int fk_train_basis_check(const struct fk_train_basis_cfg *c)
{
    if (!c->out || !*c->out)
        return fk_err(FK_EINVAL, "need --out BASIS.h5");
    if (c->n_traces < 1)
        return fk_err(FK_EINVAL, "need at least one calibration trace");
    if (c->group < 0 || c->group > (1 << 16))
        return fk_err(FK_EINVAL, "--group %d: expected a number of KV heads >= 1", c->group);
    if (c->max_rank < 0)
        return fk_err(FK_EINVAL, "--max-rank %d: expected >= 1 (or 0: every component)",
                      c->max_rank);
    return FK_OK;
}

/* Opens every trace; they must agree on layers, KV heads and head_dim. */
static int open_traces(struct trainer *w)
{
    const struct fk_train_basis_cfg *c = w->c;
    w->tr = calloc((size_t)c->n_traces, sizeof *w->tr);
    if (!w->tr)
        return fk_err(FK_ENOMEM, "out of memory");
    int pre = 1;
    for (int i = 0; i < c->n_traces; i++) {
        FK_TRY(fk_trace_open(c->traces[i], &w->tr[i]));
        w->n_tr++;
        const struct fk_trace_info *in = fk_trace_get_info(w->tr[i]);
        const struct fk_trace_info *i0 = fk_trace_get_info(w->tr[0]);
        if (in->n_layers != i0->n_layers || in->n_kv_heads != i0->n_kv_heads ||
            in->head_dim != i0->head_dim)
            return fk_err(FK_EINVAL, "%s has %d layers x %d KV heads x head_dim %d, but %s has "
                          "%d x %d x %d: a basis is trained on traces of one model",
                          c->traces[i], in->n_layers, in->n_kv_heads, in->head_dim,
                          c->traces[0], i0->n_layers, i0->n_kv_heads, i0->head_dim);
        pre &= in->has_rope && in->keys_post_rope;
        w->sh.n_vectors += in->n_tokens;
        if (in->n_tokens > w->T_max)
            w->T_max = in->n_tokens;
    }
    const struct fk_trace_info *i0 = fk_trace_get_info(w->tr[0]);
    w->sh.n_layers = i0->n_layers;
    w->sh.n_kv_heads = i0->n_kv_heads;
    w->sh.head_dim = i0->head_dim;
    w->sh.group = c->group ? c->group : 1;
    if (i0->n_kv_heads % w->sh.group)
        return fk_err(FK_EINVAL, "--group %d does not divide the traces' %d KV heads (%s)",
                      w->sh.group, i0->n_kv_heads, c->traces[0]);
    int dim = w->sh.group * i0->head_dim;
    if (c->max_rank > dim)
        return fk_err(FK_EINVAL, "--max-rank %d exceeds group x head_dim = %d x %d = %d",
                      c->max_rank, w->sh.group, i0->head_dim, dim);
    w->sh.n_comp = c->max_rank ? c->max_rank : dim;
    w->sh.has_pre_rope = pre && i0->head_dim % 2 == 0;
    return FK_OK;
}

static int alloc_scratch(struct trainer *w)
{
    const struct fk_basis_shape *sh = &w->sh;
    int dim = sh->group * sh->head_dim, G = sh->n_kv_heads / sh->group;
    size_t T = (size_t)w->T_max, d = (size_t)sh->head_dim;
    w->mom = calloc((size_t)FK_BV_N * G, sizeof *w->mom);
    w->kv = malloc(sizeof(float) * (size_t)sh->n_kv_heads * T * d);
    w->x = malloc(sizeof(double) * T * (size_t)dim);
    w->cs = malloc(sizeof(double) * T * (d / 2 + 1));
    w->sn = malloc(sizeof(double) * T * (d / 2 + 1));
    w->freq = malloc(sizeof(double) * (d / 2 + 1));
    w->a = gsl_matrix_alloc((size_t)dim, (size_t)dim);
    w->evec = gsl_matrix_alloc((size_t)dim, (size_t)dim);
    w->eval = gsl_vector_alloc((size_t)dim);
    w->ws = gsl_eigen_symmv_alloc((size_t)dim);
    if (!w->mom || !w->kv || !w->x || !w->cs || !w->sn || !w->freq || !w->a || !w->evec ||
        !w->eval || !w->ws)
        return fk_err(FK_ENOMEM, "out of memory for the moments of %d x %d", dim, dim);
    for (int i = 0; i < FK_BV_N * G; i++) {
        w->mom[i].sum = malloc(sizeof(double) * (size_t)dim);
        w->mom[i].xx = malloc(sizeof(double) * (size_t)dim * dim);
        if (!w->mom[i].sum || !w->mom[i].xx)
            return fk_err(FK_ENOMEM, "out of memory for the moments of %d x %d", dim, dim);
    }
    return FK_OK;
}

static void free_trainer(struct trainer *w)
{
    for (int i = 0; w->tr && i < w->n_tr; i++)
        fk_trace_close(&w->tr[i]);
    free(w->tr);
    int G = w->sh.group ? w->sh.n_kv_heads / w->sh.group : 0;
    for (int i = 0; w->mom && i < FK_BV_N * G; i++) {
        free(w->mom[i].sum);
        free(w->mom[i].xx);
    }
    free(w->mom);
    free(w->kv);
    free(w->x);
    free(w->cs);
    free(w->sn);
    free(w->freq);
    if (w->a)
        gsl_matrix_free(w->a);
    if (w->evec)
        gsl_matrix_free(w->evec);
    if (w->eval)
        gsl_vector_free(w->eval);
    if (w->ws)
        gsl_eigen_symmv_free(w->ws);
}

/* Adds the T vectors of group gi of one trace's keys or values (w->kv) to the moments of
 * variant v; pre: un-rotate each head's row with the trace's RoPE table first. */
static void accumulate(struct trainer *w, int v, int gi, int T, int pre, int layout)
{
    const struct fk_basis_shape *sh = &w->sh;
    int d = sh->head_dim, g = sh->group, dim = g * d, half = d / 2;
    for (int t = 0; t < T; t++)
        for (int j = 0; j < g; j++) {
            const float *src = w->kv + ((size_t)(gi * g + j) * T + t) * d;
            double *dst = w->x + (size_t)t * dim + (size_t)j * d;
            for (int c = 0; c < d; c++)
                dst[c] = src[c];
            if (pre)
                fk_rope_apply(layout, d, w->cs + (size_t)t * half, w->sn + (size_t)t * half, -1,
                              dst);
        }
    struct moments *m = &w->mom[v * (sh->n_kv_heads / g) + gi];
    for (int t = 0; t < T; t++)
        for (int c = 0; c < dim; c++)
            m->sum[c] += w->x[(size_t)t * dim + c];
    /* sum x x^T += X^T X: the hot product, one DSYRK per (trace, group); GSL's cblas calls
     * bind to OpenBLAS (the link order of meson.build; no <cblas.h> next to GSL's) */
    gsl_matrix_view X = gsl_matrix_view_array(w->x, (size_t)T, (size_t)dim);
    gsl_matrix_view S = gsl_matrix_view_array(m->xx, (size_t)dim, (size_t)dim);
    gsl_blas_dsyrk(CblasUpper, CblasTrans, 1.0, &X.matrix, 1.0, &S.matrix);
}

/* Reads layer l of every trace into the moments of its variants. */
static int accumulate_layer(struct trainer *w, int l)
{
    const struct fk_basis_shape *sh = &w->sh;
    int G = sh->n_kv_heads / sh->group, dim = sh->group * sh->head_dim;
    for (int i = 0; i < FK_BV_N * G; i++) {
        memset(w->mom[i].sum, 0, sizeof(double) * (size_t)dim);
        memset(w->mom[i].xx, 0, sizeof(double) * (size_t)dim * dim);
    }
    for (int i = 0; i < w->n_tr; i++) {
        const struct fk_trace_info *in = fk_trace_get_info(w->tr[i]);
        if (sh->has_pre_rope) {
            fk_rope_freqs(&in->rope, sh->head_dim, w->freq);
            fk_rope_table(w->freq, sh->head_dim, fk_trace_positions(w->tr[i]), in->n_tokens,
                          w->cs, w->sn);
        }
        for (int k = 0; k < 2; k++) {
            FK_TRY(fk_trace_read(w->tr[i], l, (enum fk_kind)k, w->kv));
            for (int gi = 0; gi < G; gi++) {
                accumulate(w, k, gi, in->n_tokens, 0, 0);
                if (k == FK_KIND_K && sh->has_pre_rope)
                    accumulate(w, FK_BV_KEYS_PRE, gi, in->n_tokens, 1, in->rope.layout);
            }
        }
    }
    return FK_OK;
}

/* Eigenvectors of the symmetric matrix in w->a, descending, into rows vec [k][dim] and eig
 * [k]; each vector's sign makes its largest-magnitude entry positive (the decomposition is
 * unique only up to signs: this makes files reproducible). */
static int eigen(struct trainer *w, int dim, int k, float *vec, double *eig)
{
    if (gsl_eigen_symmv(w->a, w->eval, w->evec, w->ws) != 0)
        return fk_err(FK_EEXTERNAL, "GSL gsl_eigen_symmv failed on a %d x %d matrix", dim, dim);
    gsl_eigen_symmv_sort(w->eval, w->evec, GSL_EIGEN_SORT_VAL_DESC);
    for (int j = 0; j < k; j++) {
        int big = 0;
        for (int c = 1; c < dim; c++)
            if (fabs(gsl_matrix_get(w->evec, (size_t)c, (size_t)j)) >
                fabs(gsl_matrix_get(w->evec, (size_t)big, (size_t)j)))
                big = c;
        double s = gsl_matrix_get(w->evec, (size_t)big, (size_t)j) < 0 ? -1 : 1;
        for (int c = 0; c < dim; c++)
            vec[(size_t)j * dim + c] = (float)(s * gsl_matrix_get(w->evec, (size_t)c, (size_t)j));
        eig[j] = gsl_vector_get(w->eval, (size_t)j);
    }
    return FK_OK;
}

/* Mean and both decompositions of one (variant, group); share[3]: the centered energy held
 * by the first dim/8, dim/4 and dim/2 components. */
static int decompose(struct trainer *w, struct fk_basis_file *b, int l, int v, int gi,
                     double share[3])
{
    const struct fk_basis_shape *sh = &w->sh;
    int dim = sh->dim, k = sh->n_comp;
    const struct moments *m = &w->mom[v * sh->n_groups + gi];
    double n = (double)sh->n_vectors;
    float *mean = fk_basis_mean(b, l, v) + (size_t)gi * dim;
    for (int c = 0; c < dim; c++)
        mean[c] = (float)(m->sum[c] / n);
    for (int center = 0; center < 2; center++) {
        for (int r = 0; r < dim; r++)
            for (int c = r; c < dim; c++) {
                double e = m->xx[(size_t)r * dim + c] / n;
                if (center == FK_BASIS_CENTERED)
                    e -= (m->sum[r] / n) * (m->sum[c] / n);
                gsl_matrix_set(w->a, (size_t)r, (size_t)c, e);
                gsl_matrix_set(w->a, (size_t)c, (size_t)r, e);
            }
        double trace = 0;
        for (int r = 0; r < dim; r++)
            trace += gsl_matrix_get(w->a, (size_t)r, (size_t)r);
        FK_TRY(eigen(w, dim, k, fk_basis_vec(b, l, v, center) + (size_t)gi * k * dim,
                     fk_basis_eig(b, l, v, center) + (size_t)gi * k));
        if (center != FK_BASIS_CENTERED)
            continue;
        for (int q = 0; q < 3; q++) {
            int r = dim >> (3 - q);
            double e = 0;
            for (int j = 0; j < r && j < dim; j++)
                e += gsl_vector_get(w->eval, (size_t)j);
            share[q] = trace > 0 ? e / trace : 1;
        }
    }
    return FK_OK;
}

static int train_layer(struct trainer *w, struct fk_basis_file *b, int l,
                       const struct fk_train_basis_hooks *h)
{
    double t0 = fk_wall_s();
    FK_TRY(accumulate_layer(w, l));
    double share[2][3] = {{0}};
    for (int v = 0; v < FK_BV_N; v++) {
        if (v == FK_BV_KEYS_PRE && !w->sh.has_pre_rope)
            continue;
        for (int gi = 0; gi < w->sh.n_groups; gi++) {
            double s[3];
            FK_TRY(decompose(w, b, l, v, gi, s));
            for (int q = 0; q < 3 && v < 2; q++)
                share[v][q] += s[q] / w->sh.n_groups;
        }
    }
    if (h && h->layer_done)
        h->layer_done(h->ctx, l, share[0], share[1], fk_wall_s() - t0);
    return FK_OK;
}

/* Provenance: the traces with their sha256, the group and rank, the RoPE un-rotation. */
static int save(const struct trainer *w, const struct fk_basis_file *b)
{
    const struct fk_train_basis_cfg *c = w->c;
    char *tl;
    FK_TRY(fk_train_trace_list(c->traces, c->n_traces, &tl));
    const struct fk_trace_info *i0 = fk_trace_get_info(w->tr[0]);
    char rope[160];
    if (w->sh.has_pre_rope)
        snprintf(rope, sizeof rope, "keys_pre_rope: keys un-rotated with each trace's RoPE "
                 "(first trace: %s, %s, theta %g)", fk_rope_layout_names[i0->rope.layout],
                 fk_rope_type_names[i0->rope.type], i0->rope.theta);
    else
        snprintf(rope, sizeof rope, "no pre-RoPE keys: not every calibration trace describes "
                 "its RoPE (rope_layout) with post-RoPE keys");
    const char *attrs[] = {"training_traces", tl, "rope", rope, "accumulation",
                           "float64 sums, GSL gsl_eigen_symmv", "generator",
                           "fadkv-bench train-basis", NULL};
    int rc = fk_basis_save(b, c->out, attrs);
    free(tl);
    return rc;
}

int fk_train_basis_run(const struct fk_train_basis_cfg *c, const struct fk_train_basis_hooks *h)
{
    FK_TRY(fk_train_basis_check(c));
    struct trainer w = {.c = c};
    struct fk_basis_file *b = NULL;
    int rc = open_traces(&w);
    if (rc == FK_OK)
        rc = fk_basis_alloc(&w.sh, c->out, &b);
    if (rc == FK_OK) {
        w.sh = b->sh; /* with the derived n_groups and dim */
        snprintf(b->model_id, sizeof b->model_id, "%s", fk_trace_get_info(w.tr[0])->model_id);
        rc = alloc_scratch(&w);
    }
    if (rc == FK_OK && h && h->opened)
        h->opened(h->ctx, w.n_tr, w.sh.n_layers, w.sh.n_kv_heads, w.sh.head_dim,
                  w.sh.n_vectors, w.sh.has_pre_rope);
    for (int l = 0; rc == FK_OK && l < w.sh.n_layers; l++)
        rc = train_layer(&w, b, l, h);
    if (rc == FK_OK)
        rc = save(&w, b);
    fk_basis_free(&b);
    free_trainer(&w);
    return rc;
}
