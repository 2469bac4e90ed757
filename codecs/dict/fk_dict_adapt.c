/* SPDX-License-Identifier: MIT
 * The adaptations of the dictionary codecs (struct dc_adapt, dict/fk_dict_engine.h; spec
 * algorithms.md sections 6-8), run in phase C for a vector whose relative error exceeds
 * delta:
 *   append   a new atom x/|x| (raw) or r/|r| then a refit (residual); the dictionary grows
 *            up to growth_cap or 32767 atoms (INT16 indices)
 *   replace  the new atom overwrites an inactive one (tau_c and its readings, victim,
 *            collateral); the dictionary keeps N atoms
 */
#include <math.h>
#include <string.h>

#include "common/fk_err.h"
#include "dict/fk_dict_engine.h"
#include "dict/fk_dict_opts.h"
#include "kernels/fk_dot.h"

const char *const dc_append_names[] = {"raw", "residual", NULL};

/* u = x / |x|, *norm = |x|. */
static void unit(const float *x, int m, float *u, double *norm)
{
    double nn = sqrt(fk_dot_seq(x, x, m));
    for (int i = 0; i < m; i++)
        u[i] = (float)(x[i] / nn);
    *norm = nn;
}

static int append_adapt(struct dc *d, const float *x, struct fk_code *c, int step,
                        uint32_t *flags)
{
    (void)step;
    int cap = d->o.adapt.growth_cap ? d->N + d->o.adapt.growth_cap : DC_IDX16_MAX;
    if (cap > d->cap)
        cap = d->cap;
    if (d->Nt >= cap) {
        d->st.growth_capped++;
        return FK_OK;
    }
    float *u = d->xbuf;
    double norm;
    if (d->o.adapt.append_mode == APPEND_RESIDUAL && c->k > 0) {
        const float *A = dc_atoms(d);
        float *r = d->rbuf;
        for (int i = 0; i < d->m; i++)
            r[i] = x[i];
        for (int k = 0; k < c->k; k++)
            for (int i = 0; i < d->m; i++)
                r[i] -= (float)(c->coef[k] * A[(size_t)c->idx[k] * d->m + i]);
        unit(r, d->m, u, &norm);
        if (!(norm > 1e-12 * sqrt(c->xx)))
            unit(x, d->m, u, &norm);
        FK_TRY(dc_append_atom(d, u));
        c->idx[c->k++] = d->Nt - 1;
        struct fk_dict_view v = dc_view(d);
        FK_TRY(fk_refine(&v, x, 0, 0, 1, c)); /* exact least squares on S + {new} */
    } else {
        unit(x, d->m, u, &norm);
        FK_TRY(dc_append_atom(d, u));
        c->k = 1;
        c->idx[0] = d->Nt - 1;
        c->coef[0] = norm;
        c->err2 = 0;
    }
    d->is_adapted[d->Nt - 1] = 1;
    d->st.appends++;
    *flags |= FK_VEC_ADAPTED;
    return FK_OK;
}

static double ema_now(const struct dc *d, int j, int step)
{
    int dt = step - d->last_use[j];
    return d->ema[j] * pow(d->o.adapt.ema_gamma, dt > 0 ? dt : 0);
}

/* Rewrites (or drops) every stored row that uses atom v, before v is overwritten. */
static int release_victim(struct dc *d, int v, int step)
{
    for (int h = 0; h < d->env.n_heads && d->ref_count[v] > 0; h++) {
        struct dc_rows *r = &d->heads[h];
        for (int t = 0; t < r->n && d->ref_count[v] > 0; t++) {
            size_t off = (size_t)t * d->stride;
            int uses = 0;
            for (int i = 0; i < r->nnz[t]; i++)
                uses |= r->idx[off + i] == v;
            if (!uses)
                continue;
            struct fk_code c;
            memset(&c, 0, sizeof c);
            if (d->o.adapt.collateral == COLL_DROP || d->o.adapt.victim == VICTIM_EMA) {
                for (int i = 0; i < r->nnz[t]; i++) {
                    if (r->idx[off + i] == v)
                        continue;
                    c.idx[c.k] = r->idx[off + i];
                    c.coef[c.k++] = r->coef[off + i];
                }
                c.xx = 1;
                dc_commit(d, h, t, NULL, &c, 1, step, NULL, 0, 1);
                continue;
            }
            /* re-encode the current reconstruction y with v excluded */
            float *y = d->rbuf;
            const float *A = dc_atoms(d);
            memset(y, 0, sizeof(float) * (size_t)d->m);
            for (int i = 0; i < r->nnz[t]; i++)
                for (int k = 0; k < d->m; k++)
                    y[k] += r->coef[off + i] * A[(size_t)r->idx[off + i] * d->m + k];
            uint8_t was = d->dead[v];
            d->dead[v] = 1;
            int rc = dc_encode_fresh(d, y, &c);
            d->dead[v] = was;
            if (rc < 0)
                return rc;
            dc_commit(d, h, t, NULL, &c, 1, step, NULL, 0, 1);
            d->st.collateral_reencodes++;
        }
    }
    return FK_OK;
}

/* The replacement victim: not pinned by this event; refcount: at most tau stored uses,
 * fewest uses, then lowest activity, then lowest index; ema: lowest activity. -1: none. */
static int pick_victim(const struct dc *d, int tau, int step)
{
    int best = -1;
    double best_ema = 0;
    for (int j = 0; j < d->Nt; j++) {
        if (d->pinned[j] == d->event_id)
            continue;
        if (d->o.adapt.victim == VICTIM_REFCOUNT && d->ref_count[j] > (uint32_t)tau)
            continue;
        double e = ema_now(d, j, step);
        if (best < 0) {
            best = j;
            best_ema = e;
            continue;
        }
        int better = d->o.adapt.victim == VICTIM_EMA
                         ? e < best_ema
                         : (d->ref_count[j] < d->ref_count[best] ||
                            (d->ref_count[j] == d->ref_count[best] && e < best_ema));
        if (better) {
            best = j;
            best_ema = e;
        }
    }
    return best;
}

static int replace_adapt(struct dc *d, const float *x, struct fk_code *c, int step,
                         uint32_t *flags)
{
    float *u = d->xbuf;
    double norm;
    unit(x, d->m, u, &norm);
    int tau = d->o.adapt.tauc_mode == TAUC_COUNT ? d->o.adapt.tau_c : 0;
    if (d->o.adapt.tauc_mode == TAUC_PERIOD && d->o.adapt.tau_c > 0 &&
        d->last_adapt_step >= 0 && step - d->last_adapt_step < d->o.adapt.tau_c) {
        d->st.adapt_failed++;
        return FK_OK;
    }
    if (d->o.adapt.tauc_mode == TAUC_COHERENCE) {
        const float *A = dc_atoms(d);
        for (int j = 0; j < d->Nt; j++) {
            if (d->dead[j])
                continue;
            double dot = fk_dot_seq(A + (size_t)j * d->m, u, d->m);
            if (fabs(dot) >= d->o.adapt.coh_max) {
                d->st.adapt_failed++;
                return FK_OK;
            }
        }
    }
    int best = pick_victim(d, tau, step);
    if (best < 0) {
        d->st.adapt_failed++;
        return FK_OK;
    }
    FK_TRY(dc_own_atoms(d));
    if (d->ref_count[best] > 0)
        FK_TRY(release_victim(d, best, step));
    memcpy(d->atoms + (size_t)best * d->m, u, sizeof(float) * (size_t)d->m);
    dc_slot_rewritten(d, best);
    d->dead[best] = 0;
    if (!d->is_adapted[best] && best < d->N)
        d->replaced_slots++;
    d->is_adapted[best] = 1;
    d->ema[best] = 0;
    d->last_use[best] = step;
    c->k = 1;
    c->idx[0] = best;
    c->coef[0] = norm;
    c->err2 = 0;
    c->flags &= ~(unsigned)FK_CODE_PREMATURE;
    d->st.replacements++;
    *flags |= FK_VEC_ADAPTED;
    return FK_OK;
}

/* ---- the two adaptations -------------------------------------------------------------- */

static int append_cap(const struct dc *d)
{
    long decode_max = (long)d->env.n_tokens * d->env.n_heads;
    long cap = d->o.adapt.growth_cap ? (long)d->N + d->o.adapt.growth_cap : DC_IDX16_MAX;
    if (cap > d->N + decode_max)
        cap = d->N + decode_max;
    return cap > d->N ? (int)cap : d->N;
}

static int append_check(const struct dc_opts *o, int n_atoms)
{
    if (n_atoms > 0 && n_atoms >= DC_IDX16_MAX && !o->adapt.growth_cap)
        return fk_err(FK_ECONFIG, "N = %d leaves no room to append under INT16 indices; set "
                      "growth_cap", n_atoms);
    return FK_OK;
}

static double append_dict_bytes(const struct dc *d)
{
    return (double)(d->Nt - d->N) * d->m * 2;
}

const struct dc_adapt dc_adapt_append = {
    .keeps_gram = 1, .reads_activity = 0, .cap = append_cap, .check = append_check,
    .adapt = append_adapt, .dict_bytes = append_dict_bytes,
};

static int replace_cap(const struct dc *d)
{
    return d->N;
}

/* What a sequence holds beyond the shared dictionary: each base slot replaced at least
 * once as a copy-on-write delta (its atom in fp16 and its 2-byte slot index), and the
 * per-atom activity the victim choice reads (ref_count, EMA, last use: 32 bits each). The
 * paper's accounting (mem_mode = paper) leaves it out: dc_stats reports it apart. */
static double replace_dict_bytes(const struct dc *d)
{
    if (d->rows_total == 0)
        return 0; /* nothing stored yet: the sequence has no state */
    return (double)d->replaced_slots * (d->m * 2 + 2) + (double)d->Nt * 12;
}

const struct dc_adapt dc_adapt_replace = {
    .keeps_gram = 0, .reads_activity = 1, .cap = replace_cap, .check = NULL,
    .adapt = replace_adapt, .dict_bytes = replace_dict_bytes,
};
