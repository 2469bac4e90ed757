/* SPDX-License-Identifier: MIT
 * The coders of the dictionary codecs (struct dc_coder, dict/fk_dict_engine.h; spec
 * algorithms.md sections 3.2-3.6, cost model 10.7):
 *   omp  OMP over all live atoms: Batch-OMP in Gram mode (vectors interleaved, the same
 *        codes as one at a time), or naive OMP recomputing D^T r (omp_mode, reference mode)
 *   gm   Top-n pool of |D^T x|, greedy OMP in the pool, then ridge refinement
 *   pl   top-s of |D^T x| as the support, then ridge refinement
 */
#include <string.h>

#include "common/fk_err.h"
#include "dict/fk_dict_engine.h"
#include "dict/fk_dict_opts.h"
#include "kernels/fk_dot.h"

const char *const dc_omp_names[] = {"gram", "naive", NULL};

static double cost_omp(int m, double Nt, int iters)
{
    double c = 0;
    for (int k = 1; k <= iters; k++)
        c += m * Nt + Nt + 2.0 * k * m + (double)k * k;
    return c;
}

static double cost_gm(int m, double Nt, int n, int iters, int s)
{
    double c = m * Nt + Nt + (double)s * s * s / 6 + 2.0 * s * s;
    for (int k = 1; k <= iters; k++)
        c += (double)m * n + n + 2.0 * k * m + (double)k * k;
    return c;
}

static double cost_pl(int m, double Nt, int s)
{
    return m * Nt + Nt + m * s * (s + 1) / 2.0 + (double)s * s * s / 6 + 2.0 * s * s +
           (double)m * s;
}

/* ---- omp ------------------------------------------------------------------------------ */

static size_t omp_work_floats(int n_atoms, int m, int s)
{
    return fk_omp_batch_work_floats(n_atoms, m, s); /* the lanes of fk_omp_gram_batch */
}

static int omp_wants_gram(const struct dc_code_opts *o)
{
    return o->omp_mode == OMP_GRAM;
}

static int omp_encode(struct dc *d, const struct fk_dict_view *v, int nx, const float *x,
                      const float *a, size_t lda, struct fk_code *out)
{
    const struct dc_code_opts *o = &d->o.code;
    if (v->gram_row)
        FK_TRY(fk_omp_gram_batch(v, nx, x, a, lda, o->s, o->tol, d->work, out));
    for (int i = 0; i < nx; i++) {
        struct fk_code *c = &out[i];
        if (!v->gram_row)
            FK_TRY(fk_omp_naive(v, x + (size_t)i * d->m, a + (size_t)i * lda, NULL, 0, o->s,
                                o->tol, d->work, c));
        d->st.macs += cost_omp(d->m, d->Nt, c->iters > c->k ? c->iters : c->k);
    }
    return FK_OK;
}

/* Batch-OMP in Gram mode: the correlations, then s steps over N atoms. */
static double omp_estimate(const struct dc_code_opts *o, int m, int N)
{
    double s = o->s;
    return (double)m * N + N * s * (s + 1) / 2 + s * N;
}

const struct dc_coder dc_coder_omp = {
    .work_floats = omp_work_floats, .wants_gram = omp_wants_gram, .encode = omp_encode,
    .estimate = omp_estimate,
};

/* ---- gm and pl: a screened support, then ridge refinement ------------------------------ */

static int refine(struct dc *d, const struct fk_dict_view *v, const float *x, struct fk_code *c)
{
    const struct dc_code_opts *o = &d->o.code;
    if (c->k > 0 && !(c->flags & FK_CODE_ZERO))
        FK_TRY(fk_refine(v, x, o->lambda0, o->rho, o->refine_iters, c));
    return FK_OK;
}

static size_t gm_work_floats(int n_atoms, int m, int s)
{
    return fk_omp_pool2_work_floats(n_atoms, m, s);
}

/* Vectors i .. i + nv - 1 (nv 1 or 2): Top-n pools, the pool OMP (two vectors in turn over
 * the Gram: fk_omp_pool2, the same codes as one at a time), the refinement. */
static int gm_code(struct dc *d, const struct fk_dict_view *v, int nv, const float *x,
                   const float *a, size_t lda, struct fk_code *out)
{
    const struct dc_code_opts *o = &d->o.code;
    double gss[2][FK_SMAX * FK_SMAX]; /* G_SS of the pool OMP, reused by the refinement */
    const float *xs[2], *as[2];
    const int32_t *pools[2];
    int np[2];
    for (int i = 0; i < nv; i++) {
        xs[i] = x + (size_t)i * d->m;
        as[i] = a + (size_t)i * lda;
        int32_t *pool = d->pool + (size_t)i * (size_t)d->acap;
        np[i] = fk_topn(as[i], d->dead, d->Nt, o->n, 0, pool, d->work);
        pools[i] = pool;
    }
    if (nv == 2) {
        struct fk_code *const co[2] = {&out[0], &out[1]};
        double *const g[2] = {gss[0], gss[1]};
        FK_TRY(fk_omp_pool2(v, xs, as, pools, np, o->s, d->work, co, g));
    } else {
        FK_TRY(fk_omp_pool(v, xs[0], as[0], pools[0], np[0], o->s, d->work, &out[0], gss[0]));
    }
    for (int i = 0; i < nv; i++) {
        struct fk_code *c = &out[i];
        d->st.macs += cost_gm(d->m, d->Nt, np[i], c->iters > c->k ? c->iters : c->k, c->k);
        if (c->k > 0 && !(c->flags & FK_CODE_ZERO))
            FK_TRY(fk_refine_gss(v, xs[i], o->lambda0, o->rho, o->refine_iters, c, gss[i]));
    }
    return FK_OK;
}

static int gm_encode(struct dc *d, const struct fk_dict_view *v, int nx, const float *x,
                     const float *a, size_t lda, struct fk_code *out)
{
    /* in turn where the Gram rows come from beyond L2 (1 MiB: N >= 512); the naive mode
     * streams the pool and a small Gram sits in cache: nothing to overlap there */
    int pair = v->gram_row != NULL && d->N >= 512;
    for (int i = 0; i < nx;) {
        int nv = pair && i + 1 < nx ? 2 : 1;
        FK_TRY(gm_code(d, v, nv, x + (size_t)i * d->m, a + (size_t)i * lda, lda, &out[i]));
        i += nv;
    }
    return FK_OK;
}

/* The correlations and the Top-n pool, then s greedy steps inside the pool of n. */
static double gm_estimate(const struct dc_code_opts *o, int m, int N)
{
    double s = o->s, n = o->n ? o->n : dc_pool_default(o->s, N);
    return (double)m * N + N + s * (m * n + n);
}

const struct dc_coder dc_coder_gm = {
    .work_floats = gm_work_floats, .encode = gm_encode, .estimate = gm_estimate,
    .own_gram_max = DC_OWN_GRAM_MAX,
};

static int pl_encode(struct dc *d, const struct fk_dict_view *v, int nx, const float *x,
                     const float *a, size_t lda, struct fk_code *out)
{
    for (int i = 0; i < nx; i++) {
        const float *xi = x + (size_t)i * d->m, *ai = a + (size_t)i * lda;
        struct fk_code *c = &out[i];
        double xx = fk_dot_seq(xi, xi, d->m);
        memset(c, 0, sizeof *c);
        c->xx = xx;
        if (xx <= 1e-30) {
            c->flags = FK_CODE_ZERO;
            continue;
        }
        c->k = fk_topn(ai, d->dead, d->Nt, d->o.code.s, 1, c->idx, d->work);
        d->st.macs += cost_pl(d->m, d->Nt, c->k);
        FK_TRY(refine(d, v, xi, c));
    }
    return FK_OK;
}

/* The correlations and the Top-s selection, then one least-squares solve on s atoms. */
static double pl_estimate(const struct dc_code_opts *o, int m, int N)
{
    double s = o->s;
    return (double)m * N + N + m * s * (s + 1) / 2;
}

const struct dc_coder dc_coder_pl = {.encode = pl_encode, .estimate = pl_estimate};
