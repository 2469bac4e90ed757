/* SPDX-License-Identifier: MIT
 * gm: Top-n screening of |D^T x|, greedy OMP restricted to the pool, ridge refinement
 * (spec algorithms.md section 7.1), with append-growth (7.3). Coder: gm. Adaptation:
 * append. Lossy.
 */
#include "dict/fk_dict_engine.h"
#include "dict/fk_dict_opts.h"

static const struct fk_option gm_options[] = {
    FK_COMMON_OPTIONS(struct dc_opts), DC_OPT_S, DC_OPT_N, DC_OPT_REFINE, DC_OPT_DELTA,
    DC_OPT_APPEND, DC_OPT_PTR, DC_OPT_END,
};

DC_COMPOSE(gm, &dc_coder_gm, &dc_adapt_append, 1)
DC_EXT(gm, &dc_coder_gm, &dc_adapt_append);

const struct fk_codec_ops fk_codec_gm = {
    .name = "gm",
    .summary = "Top-n screening, greedy OMP in the pool, ridge refinement; append-growth",
    .options = gm_options,
    .caps = FK_CAP_DICT | FK_CAP_SPARSE | FK_CAP_GROWS | FK_CAP_ADAPTS | FK_CAP_SKIPS,
    DC_OPS(gm),
};
