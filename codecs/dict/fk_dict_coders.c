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

/* Floats of scratch for a screened coder's refinement of FK_REFINE_LANES vectors (doubles,
 * in d->work once the screening and the pool OMP are done with it). */
static size_t refine_work_floats(int s)
{
    return 2 * fk_refine_work_doubles(FK_REFINE_LANES, s) + 16;
}

/* The refinement of the codes out[i], i < nv, that have atoms (gss[i]: their G_SS from the
 * pool OMP, or NULL), FK_REFINE_LANES at a time in lockstep: the bits of one at a time. */
static int refine_codes(struct dc *d, const struct fk_dict_view *v, int nv, const float *x,
                        struct fk_code *out, const double *const *gss)
{
    const struct dc_code_opts *o = &d->o.code;
    const float *xs[FK_REFINE_LANES];
    struct fk_code *cs[FK_REFINE_LANES];
    const double *gs[FK_REFINE_LANES];
    int n = 0;
    for (int i = 0; i < nv; i++) {
        struct fk_code *c = &out[i];
        if (c->k == 0 || (c->flags & FK_CODE_ZERO))
            continue;
        xs[n] = x + (size_t)i * d->m;
        cs[n] = c;
        gs[n] = gss ? gss[i] : NULL;
        n++;
    }
    double *w = (double *)(void *)(((uintptr_t)d->work + 7) & ~(uintptr_t)7);
    size_t wd = (d->work_floats - 2) / 2;
    return fk_refine_many(v, n, xs, o->lambda0, o->rho, o->refine_iters, cs, gss ? gs : NULL,
                          w, wd);
}

static size_t gm_work_floats(int n_atoms, int m, int s)
{
    size_t w = fk_omp_pool2_work_floats(n_atoms, m, s), r = refine_work_floats(s);
    return w > r ? w : r;
}

/* Vectors i .. i + nv - 1 (nv <= FK_REFINE_LANES): Top-n pools, the pool OMP (over the Gram,
 * two vectors in turn: fk_omp_pool2, the same codes as one at a time), the refinements in
 * lockstep. */
static int gm_code(struct dc *d, const struct fk_dict_view *v, int nv, const float *x,
                   const float *a, size_t lda, struct fk_code *out)
{
    const struct dc_code_opts *o = &d->o.code;
    /* G_SS of the pool OMP, reused by the refinement */
    double gss[FK_REFINE_LANES][FK_SMAX * FK_SMAX];
    const double *gp[FK_REFINE_LANES];
    const float *xs[FK_REFINE_LANES], *as[FK_REFINE_LANES];
    const int32_t *pools[FK_REFINE_LANES];
    int np[FK_REFINE_LANES];
    for (int i = 0; i < nv; i++) {
        xs[i] = x + (size_t)i * d->m;
        as[i] = a + (size_t)i * lda;
        int32_t *pool = d->pool + (size_t)i * (size_t)d->acap;
        np[i] = fk_topn(as[i], d->dead, d->Nt, o->n, 0, pool, d->work);
        pools[i] = pool;
        gp[i] = gss[i];
    }
    /* over the Gram, two vectors in turn: their Cholesky steps overlap, and where the Gram
     * rows come from beyond L2 (N >= 512) so do their gathers */
    int pair = v->gram_row != NULL;
    for (int i = 0; i < nv;) {
        if (pair && i + 1 < nv) {
            struct fk_code *const co[2] = {&out[i], &out[i + 1]};
            double *const g[2] = {gss[i], gss[i + 1]};
            FK_TRY(fk_omp_pool2(v, xs + i, as + i, pools + i, np + i, o->s, d->work, co, g));
            i += 2;
        } else {
            FK_TRY(fk_omp_pool(v, xs[i], as[i], pools[i], np[i], o->s, d->work, &out[i],
                               gss[i]));
            i++;
        }
    }
    for (int i = 0; i < nv; i++) {
        struct fk_code *c = &out[i];
        d->st.macs += cost_gm(d->m, d->Nt, np[i], c->iters > c->k ? c->iters : c->k, c->k);
    }
    return refine_codes(d, v, nv, x, out, gp);
}

static int gm_encode(struct dc *d, const struct fk_dict_view *v, int nx, const float *x,
                     const float *a, size_t lda, struct fk_code *out)
{
    for (int i = 0; i < nx; i += FK_REFINE_LANES) {
        int nv = nx - i < FK_REFINE_LANES ? nx - i : FK_REFINE_LANES;
        FK_TRY(gm_code(d, v, nv, x + (size_t)i * d->m, a + (size_t)i * lda, lda, &out[i]));
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

static size_t pl_work_floats(int n_atoms, int m, int s)
{
    size_t w = fk_omp_work_floats(n_atoms, m, s), r = refine_work_floats(s);
    return w > r ? w : r;
}

static int pl_encode(struct dc *d, const struct fk_dict_view *v, int nx, const float *x,
                     const float *a, size_t lda, struct fk_code *out)
{
    for (int i0 = 0; i0 < nx; i0 += FK_REFINE_LANES) {
        int nv = nx - i0 < FK_REFINE_LANES ? nx - i0 : FK_REFINE_LANES;
        for (int i = i0; i < i0 + nv; i++) {
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
        }
        FK_TRY(refine_codes(d, v, nv, x + (size_t)i0 * d->m, &out[i0], NULL));
    }
    return FK_OK;
}

/* The correlations and the Top-s selection, then one least-squares solve on s atoms. */
static double pl_estimate(const struct dc_code_opts *o, int m, int N)
{
    double s = o->s;
    return (double)m * N + N + m * s * (s + 1) / 2;
}

const struct dc_coder dc_coder_pl = {
    .work_floats = pl_work_floats, .encode = pl_encode, .estimate = pl_estimate,
};
