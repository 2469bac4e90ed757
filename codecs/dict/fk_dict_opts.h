/* SPDX-License-Identifier: MIT
 * Option-table entries the dictionary codecs share (struct dc_opts, dict/fk_dict_engine.h).
 * A codec file lists the groups it takes; names, defaults, ranges and help are defined here
 * once, so the same option reads the same in every codec.
 */
#ifndef FK_DICT_OPTS_H
#define FK_DICT_OPTS_H

#include "core/fk_codec.h"
#include "dict/fk_dict_engine.h"
#include "kernels/fk_sparse.h"

/* Choice names (NULL-terminated) of the options more than one codec has; fadkv's own
 * options are in fk_fadkv.c. */
extern const char *const dc_omp_names[];        /* omp_mode: fk_dict_coders.c */
extern const char *const dc_append_names[];     /* append_mode: fk_dict_adapt.c */

#define DC_O(field) offsetof(struct dc_opts, field)
#define DC_OPT_S {"s", FK_OPT_INT, DC_O(code.s), 8, 1, FK_SMAX - 1, NULL,                  \
                  "sparsity: atoms per vector"}
#define DC_OPT_N {"n", FK_OPT_INT, DC_O(code.n), 0, 0, 1 << 24, NULL,                      \
                  "screening pool size (atoms); 0: N/16 of the dictionary, at least s (the "   \
                  "paper's 256 for N = 4096, 512 for N = 8192)"}
#define DC_OPT_TOL {"tol", FK_OPT_DOUBLE, DC_O(code.tol), 0, 0, 1, NULL,                   \
                    "OMP relative error threshold (0 = off: always s atoms)"}
#define DC_OPT_OMP {"omp_mode", FK_OPT_ENUM, DC_O(code.omp_mode), OMP_GRAM, 0, 1,          \
                    dc_omp_names,                                                         \
                    "OMP residual update: gram (Batch-OMP) | naive (recompute D^T r)"}
#define DC_OPT_DELTA                                                                      \
    {"delta_k", FK_OPT_DOUBLE, DC_O(adapt.delta_k), 0.50, 0, 1, NULL,                     \
     "adapt a key when its relative error exceeds this"},                                 \
    {"delta_v", FK_OPT_DOUBLE, DC_O(adapt.delta_v), 0.70, 0, 1, NULL,                     \
     "adapt a value when its relative error exceeds this"},                               \
    {"adapt_prefill", FK_OPT_BOOL, DC_O(adapt.adapt_prefill), 0, 0, 1, NULL,              \
     "also adapt during prefill (default: decode only)"},                                 \
    {"ema_gamma", FK_OPT_DOUBLE, DC_O(adapt.ema_gamma), 0.99, 1e-6, 1, NULL,              \
     "decay of the atom activity EMA per decode step"}
#define DC_OPT_APPEND                                                                     \
    {"append_mode", FK_OPT_ENUM, DC_O(adapt.append_mode), APPEND_RAW, 0, 1,               \
     dc_append_names, "appended atom: raw (x/|x|) | residual (r/|r|, then refit)"},       \
    {"growth_cap", FK_OPT_INT, DC_O(adapt.growth_cap), 0, 0, 1 << 24, NULL,               \
     "max appended atoms per stream (0 = until 32767 atoms, INT16 indices)"}
#define DC_OPT_REFINE                                                                     \
    {"lambda0", FK_OPT_DOUBLE, DC_O(code.lambda0), 1e-4, 0, 1e6, NULL,                    \
     "ridge: constant term"},                                                             \
    {"rho", FK_OPT_DOUBLE, DC_O(code.rho), 0.20, 0, 1e6, NULL, "ridge: multiple of diag(G)"}, \
    {"refine_iters", FK_OPT_INT, DC_O(code.refine_iters), 1, 1, 100, NULL,                \
     "refinement iterations R (1 = one-shot ridge; >= 2 converges to least squares)"}
#define DC_OPT_PTR {"ptr_bytes", FK_OPT_INT, DC_O(ptr_bytes), 2, 2, 4, NULL,               \
                    "accounted bytes per row pointer: 2 (paper) or 4 (int32 as in code)"}
#define DC_OPT_END {NULL, 0, 0, 0, 0, 0, NULL, NULL}

#endif
