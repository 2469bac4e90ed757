/* SPDX-License-Identifier: MIT
 * pl: the support is the top-s of |D^T x| (one shot), coefficients by ridge refinement
 * (spec algorithms.md section 7.2), with append-growth (7.3). Coder: pl. Adaptation:
 * append. Lossy. Its pool size n is recorded for diagnostics only.
 */
#include "dict/fk_dict_engine.h"
#include "dict/fk_dict_opts.h"

static const struct fk_option pl_options[] = {
    FK_COMMON_OPTIONS(struct dc_opts), DC_OPT_S,
    {"n", FK_OPT_INT, DC_O(code.n), 0, 0, 1 << 24, NULL,
     "pool size (diagnostics only for pl); 0: N/16 of the dictionary, at least s"},
    DC_OPT_REFINE, DC_OPT_DELTA, DC_OPT_APPEND, DC_OPT_PTR, DC_OPT_END,
};

DC_COMPOSE(pl, &dc_coder_pl, &dc_adapt_append, 0)
DC_EXT(pl, &dc_coder_pl, &dc_adapt_append);

const struct fk_codec_ops fk_codec_pl = {
    .name = "pl",
    .summary = "one-shot top-s of |D^T x| with ridge refinement; append-growth",
    .options = pl_options,
    .caps = FK_CAP_DICT | FK_CAP_SPARSE | FK_CAP_GROWS | FK_CAP_ADAPTS | FK_CAP_SKIPS,
    DC_OPS(pl),
};
