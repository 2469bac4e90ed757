/* SPDX-License-Identifier: MIT
 * lexico: full OMP over a static universal per-layer dictionary (spec algorithms.md
 * section 5). Coder: omp (Batch-OMP in Gram mode by default). Adaptation: none, so a
 * vector's code never depends on earlier events (FK_CAP_STATIC). Lossy.
 */
#include "dict/fk_dict_engine.h"
#include "dict/fk_dict_opts.h"

static const struct fk_option lexico_options[] = {
    FK_COMMON_OPTIONS(struct dc_opts), DC_OPT_S, DC_OPT_TOL, DC_OPT_OMP, DC_OPT_PTR, DC_OPT_END,
};

DC_COMPOSE(lexico, &dc_coder_omp, NULL, 0)

const struct fk_codec_ops fk_codec_lexico = {
    .name = "lexico",
    .summary = "full OMP over a static universal per-layer dictionary",
    .options = lexico_options,
    .caps = FK_CAP_DICT | FK_CAP_SPARSE | FK_CAP_GRAM | FK_CAP_STATIC,
    DC_OPS(lexico),
};
