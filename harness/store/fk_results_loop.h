/* SPDX-License-Identifier: MIT
 * The closed-loop part of a cell's files (fk_results.c calls these; struct fk_cell_loop is
 * in fk_results.h).
 */
#ifndef FK_RESULTS_LOOP_H
#define FK_RESULTS_LOOP_H

#include <stdint.h>

#include "common/fk_str.h"
#include "store/fk_results.h"

/* The closed loop's cell values (NaN without L), in the order of the table's FK_AGG_LOOP
 * metrics (store/fk_metrics.c): e2e_kl, e2e_kl_max, e2e_top1, e2e_nll_exact, e2e_nll_codec,
 * e2e_nll_diff, e2e_ppl_ratio, free_first_diverge, free_diverged, free_token_agree,
 * loop_attn_cos, loop_attn_kl, loop_steps. */
#define FK_LOOP_NHEAD 13
void fk_results_loop_head(const struct fk_cell_loop *L, double v[FK_LOOP_NHEAD]);
/* Writes prompt p's series into group loop of the cell HDF5's trace group (nothing when L
 * is NULL). */
int fk_results_loop_h5(int64_t trace_group, const struct fk_cell_loop *L, int p);
/* summary.csv's closed-loop columns of prompt p, layer l (NaN without L): loop_attn_cos,
 * loop_attn_kl (this layer), e2e_kl, e2e_top1, e2e_nll_diff (this prompt's means). */
void fk_results_loop_layer(const struct fk_cell_loop *L, int p, int l, double v[5]);

#endif
