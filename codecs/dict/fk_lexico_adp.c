/* SPDX-License-Identifier: MIT
 * lexico-adp: lexico plus append-growth (spec algorithms.md section 6). Coder: omp over all
 * atoms, Gram rows of appended atoms maintained (6.4). Adaptation: append, in decode, a
 * vector whose relative error exceeds delta_k / delta_v becomes a new atom. Lossy.
 */
#include "dict/fk_dict_engine.h"
#include "dict/fk_dict_opts.h"

static const struct fk_option adp_options[] = {
    FK_COMMON_OPTIONS(struct dc_opts), DC_OPT_S, DC_OPT_TOL, DC_OPT_OMP, DC_OPT_DELTA,
    DC_OPT_APPEND, DC_OPT_PTR, DC_OPT_END,
};

DC_COMPOSE(adp, &dc_coder_omp, &dc_adapt_append, 0)
DC_EXT(lexico_adp, &dc_coder_omp, &dc_adapt_append);

const struct fk_codec_ops fk_codec_lexico_adp = {
    .name = "lexico-adp",
    .summary = "lexico plus append-growth: a badly coded vector becomes a new atom",
    .options = adp_options,
    .caps = FK_CAP_DICT | FK_CAP_SPARSE | FK_CAP_GRAM | FK_CAP_GROWS | FK_CAP_ADAPTS |
            FK_CAP_SKIPS,
    DC_OPS(adp),
};
