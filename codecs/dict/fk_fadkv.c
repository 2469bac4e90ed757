/* SPDX-License-Identifier: MIT
 * fadkv: a screening coder (gm or pl, option inner) plus replacement of inactive atoms, so
 * the dictionary keeps its N atoms (spec algorithms.md section 8; alternative readings of
 * tau_c in 8.4). Coder: gm | pl. Adaptation: replace. Lossy.
 */
#include "dict/fk_dict_engine.h"
#include "dict/fk_dict_opts.h"

static const char *const inner_names[] = {"gm", "pl", NULL};
static const char *const tauc_names[] = {"count", "coherence", "period", NULL};
static const char *const victim_names[] = {"refcount", "ema", NULL};
static const char *const coll_names[] = {"reencode", "drop", NULL};
static const char *const mem_names[] = {"strict", "paper", NULL};

static const struct fk_option fadkv_options[] = {
    FK_COMMON_OPTIONS(struct dc_opts),
    DC_OPT_S,
    DC_OPT_N,
    DC_OPT_REFINE,
    DC_OPT_DELTA,
    {"inner", FK_OPT_ENUM, DC_O(code.inner), 0, 0, 1, inner_names, "inner coder: gm | pl"},
    {"tau_c", FK_OPT_INT, DC_O(adapt.tau_c), 0, 0, 1 << 24, NULL,
     "an atom is inactive (replaceable) when at most tau_c stored codes use it"},
    {"tauc_mode", FK_OPT_ENUM, DC_O(adapt.tauc_mode), TAUC_COUNT, 0, 2, tauc_names,
     "reading of tau_c: count (usage) | coherence (coh_max novelty) | period (steps)"},
    {"coh_max", FK_OPT_DOUBLE, DC_O(adapt.coh_max), 0.9, 0, 1, NULL,
     "coherence reading: replace only if max_j |d_j^T u| < coh_max"},
    {"victim", FK_OPT_ENUM, DC_O(adapt.victim), VICTIM_REFCOUNT, 0, 1, victim_names,
     "victim choice: refcount (ref_count, ema, index) | ema (lowest ema; drops codes)"},
    {"collateral", FK_OPT_ENUM, DC_O(adapt.collateral), COLL_REENCODE, 0, 1, coll_names,
     "codes still using a replaced atom (tau_c > 0): reencode | drop"},
    {"mem_mode", FK_OPT_ENUM, DC_O(adapt.mem_mode), MEM_STRICT, 0, 1, mem_names,
     "accounting of the replacement state: strict (per sequence: each replaced atom, fp16, "
     "and its slot, and the per-atom activity the victim choice reads) | paper (the paper's: "
     "free; only to reproduce its figures, which then say so)"},
    DC_OPT_PTR,
    DC_OPT_END,
};

/* The pool checks (s <= n <= N) hold whichever coder inner selects. */
static int fadkv_check(const void *opts, int head_dim, int n_atoms)
{
    return dc_check(&dc_adapt_replace, 1, opts, head_dim, n_atoms);
}

static const struct dc_coder *fadkv_coder(const struct dc_opts *o)
{
    return o->code.inner ? &dc_coder_pl : &dc_coder_gm;
}

static int fadkv_open(const void *opts, const struct fk_stream_env *env, void **state)
{
    return dc_open(fadkv_coder(opts), &dc_adapt_replace, opts, env, state);
}

static int fadkv_open_ahead(const void *opts, const struct fk_stream_env *env,
                            const float *ahead, void **state)
{
    return dc_open_ahead(fadkv_coder(opts), &dc_adapt_replace, opts, env, ahead, state);
}

const struct fk_codec_ext fk_codec_ext_fadkv = {.open_ahead = fadkv_open_ahead};

static double fadkv_estimate(const void *opts, int m, int n_atoms)
{
    const struct dc_opts *o = opts;
    return fadkv_coder(o)->estimate(&o->code, m, n_atoms);
}

const struct fk_codec_ops fk_codec_fadkv = {
    .name = "fadkv",
    .summary = "screening coder (gm|pl) plus replacement of inactive atoms: fixed-size "
               "dictionary",
    .options = fadkv_options,
    .caps = FK_CAP_DICT | FK_CAP_SPARSE | FK_CAP_ADAPTS | FK_CAP_SKIPS,
    DC_OPS(fadkv),
};
