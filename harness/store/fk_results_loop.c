/* SPDX-License-Identifier: MIT
 * The closed-loop part of a cell's files (struct fk_cell_loop, fk_results.h): its headline
 * keys in the .meta, its series in the cell HDF5 (T<tt>/loop/...), its per-layer columns of
 * summary.csv. Definitions: docs/RESULTS.md, "Closed loop".
 */
#include "store/fk_results_loop.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/fk_err.h"
#include "formats/fk_h5.h"

void fk_results_loop_head(const struct fk_cell_loop *L, double v[FK_LOOP_NHEAD])
{
    for (int i = 0; i < FK_LOOP_NHEAD; i++)
        v[i] = NAN;
    if (!L)
        return;
    size_t n = (size_t)L->n_prompts * L->n_steps;
    double kl = 0, kmax = 0, top = 0, ne = 0, nc = 0, fd = 0, div = 0, agree = 0;
    for (size_t i = 0; i < n; i++) {
        kl += L->kl[i];
        kmax = L->kl[i] > kmax ? L->kl[i] : kmax;
        top += L->top1[i];
        ne += L->nll_exact[i];
        nc += L->nll_codec[i];
        agree += L->tokens_free[i] == L->tokens_greedy[i];
    }
    for (int p = 0; p < L->n_prompts; p++) {
        fd += L->first_diverge[p] < 0 ? L->n_steps : L->first_diverge[p];
        div += L->first_diverge[p] >= 0;
    }
    double ac = 0, ak = 0;
    long na = 0;
    for (int i = 0; i < L->n_prompts * L->n_layers; i++)
        if (!isnan(L->attn_cos[i])) {
            ac += L->attn_cos[i];
            ak += L->attn_kl[i];
            na++;
        }
    double N = n ? (double)n : NAN, P = L->n_prompts ? L->n_prompts : NAN;
    double h[FK_LOOP_NHEAD] = {kl / N, n ? kmax : NAN, top / N, ne / N, nc / N, (nc - ne) / N,
                               exp((nc - ne) / N), fd / P, div / P, agree / N,
                               na ? ac / na : NAN, na ? ak / na : NAN, (double)n};
    memcpy(v, h, sizeof h);
}

int fk_results_loop_h5(int64_t trace_group, const struct fk_cell_loop *L, int p)
{
    if (!L || p >= L->n_prompts)
        return FK_OK;
    hid_t g = H5Gcreate2((hid_t)trace_group, "loop", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (g < 0)
        return fk_err(FK_EEXTERNAL, "HDF5: cannot create group loop of prompt %d", p);
    size_t o = (size_t)p * L->n_steps, ol = (size_t)p * L->n_layers;
    hsize_t S = (hsize_t)L->n_steps, NL = (hsize_t)L->n_layers, one = 1;
    const struct {
        const char *name;
        hid_t ft, mt;
        hsize_t n;
        const void *data;
    } ds[] = {
        {"kl", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, S, L->kl + o},
        {"top1", H5T_STD_U8LE, H5T_NATIVE_UINT8, S, L->top1 + o},
        {"nll_exact", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, S, L->nll_exact + o},
        {"nll_codec", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, S, L->nll_codec + o},
        {"kl_free", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, S, L->kl_free + o},
        {"tokens_free", H5T_STD_I32LE, H5T_NATIVE_INT32, S, L->tokens_free + o},
        {"tokens_greedy", H5T_STD_I32LE, H5T_NATIVE_INT32, S, L->tokens_greedy + o},
        {"first_diverge", H5T_STD_I32LE, H5T_NATIVE_INT32, one, L->first_diverge + p},
        {"attn_cos", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, NL, L->attn_cos + ol},
        {"attn_kl", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, NL, L->attn_kl + ol},
    };
    int rc = FK_OK;
    for (size_t i = 0; rc == FK_OK && i < sizeof ds / sizeof ds[0]; i++)
        rc = fk_h5_write(g, ds[i].name, ds[i].ft, ds[i].mt, 1, &ds[i].n, 0, 0, ds[i].data);
    H5Gclose(g);
    return rc;
}

void fk_results_loop_layer(const struct fk_cell_loop *L, int p, int l, double v[5])
{
    for (int i = 0; i < 5; i++)
        v[i] = NAN;
    if (!L || p >= L->n_prompts || l >= L->n_layers || L->n_steps < 1)
        return;
    v[0] = L->attn_cos[(size_t)p * L->n_layers + l];
    v[1] = L->attn_kl[(size_t)p * L->n_layers + l];
    double kl = 0, top = 0, d = 0;
    for (size_t j = (size_t)p * L->n_steps; j < (size_t)(p + 1) * L->n_steps; j++) {
        kl += L->kl[j];
        top += L->top1[j];
        d += L->nll_codec[j] - L->nll_exact[j];
    }
    v[2] = kl / L->n_steps;
    v[3] = top / L->n_steps;
    v[4] = d / L->n_steps;
}
