/* SPDX-License-Identifier: MIT
 * The sweep language (configs/README.md): a TOML file naming datasets (traces and their
 * dictionary), codecs with options, grids, zips, presets and exclusions, resolved into a
 * deterministic list of cells, each with a stable id.
 *
 * Resolution of one [[codec]] block: codec defaults, then [defaults], then the preset, then
 * the block's own keys, then `grid` (cartesian product, first key outermost) and `zip`
 * (equal-length lists advanced together); times datasets, times repeats; [[exclude]] rules
 * drop matching cells; identical resolved cells are kept once. Every key is checked against
 * the codec's option table; errors name FILE:LINE:COL, the key and what is allowed.
 *
 * A block with `evict = "POLICY"` composes a token-eviction policy (core/fk_evict.h) with
 * the codec: the policy's options are ordinary keys of the block (and of grids, zips,
 * [defaults]); none may share a name with the codec's. The canonical text appends
 * ";evict=POLICY" and the policy's options to the codec's, so blocks without it keep their
 * cell ids.
 */
#ifndef FK_SWEEP_H
#define FK_SWEEP_H

#include <stdint.h>

#include "core/fk_codec.h"
#include "core/fk_registry.h"
#include "core/fk_evict.h"
#include "core/fk_rewrite.h"

struct fk_toml_value;

struct fk_dataset {
    char *name;                  /* [[dataset]] name, or "default" */
    char **traces;               /* expanded paths, sorted */
    int n_traces;
    char *dict;                  /* dictionary path or NULL */
    char *basis;                 /* basis file path (low-rank codecs) or NULL */
    char *calib;                 /* calibration file path (key calibration: FK_CAP_CALIB
                                  * codecs) or NULL */
    char *head_pattern;          /* head pattern file path (engine/fk_heads.h) or NULL */
    char *recon_dir;             /* directory of external reconstructions (codec external):
                                  * DIR/<trace file name> for each trace, or NULL */
    char **recon;                /* [n_traces] those paths (recon_dir set), else NULL */
    char *content_hash;          /* sha256 over the traces', dictionary's and basis's hashes;
                                  * with a calibration, '+' and its sha256 (only the cells
                                  * that read it hash it into their ids) */
    const struct fk_toml_value *defaults; /* dataset's option defaults (resolution only) */
    /* A model dataset (closed loop, harness/loop): a llama2.c checkpoint instead of traces;
     * traces[i] is then where the runner writes prompt i's exact decode
     * (<output>/loop-traces/<name>-<iiii>.h5), and content_hash covers the model, tokenizer,
     * prompts and steps instead of those files. */
    char *model, *tokenizer;     /* checkpoint and tokenizer paths, or NULL */
    int n_prompts, steps;        /* prompts, decode positions per prompt */
    char **prompt_text;          /* [n_prompts] a text, or NULL for a token-id prompt */
    int32_t **prompt_ids;        /* [n_prompts] its ids (token-id prompts) */
    int *prompt_n;               /* [n_prompts] their count */
    int shape_read;              /* resolution: head_dim and n_atoms were read (0: unknown) */
    int head_dim, n_atoms;       /* the first trace's head_dim, the dictionary's N */
};

/* Model-dataset keys (fk_sweep_model.c): model, tokenizer, prompts, steps of one [[dataset]]
 * entry (*handled 0 for any other key); finish checks them and names the traces; hash adds
 * them to the content hash. */
struct fk_toml_entry;
struct fk_sha256_ctx;
int fk_sweep_model_key(const struct fk_toml_entry *e, struct fk_dataset *ds, int *handled);
int fk_sweep_model_finish(const struct fk_toml_value *tab, const char *output,
                          struct fk_dataset *ds);
int fk_sweep_model_hash(const struct fk_dataset *ds, struct fk_sha256_ctx *c);
void fk_sweep_model_free(struct fk_dataset *ds);
/* The path rule of a sweep file (fk_sweep.c) for path p of value v: relative to the folder
 * of the config file naming it; absolute paths and --set values are kept. malloc'd, NULL
 * out of memory. */
char *fk_sweep_path(const struct fk_toml_value *v, const char *p);

struct fk_sweep_cell {
    char id[17];                 /* 16 hex digits of the cell hash */
    const struct fk_codec_ops *ops;
    void *opts;                  /* ops->opts_size bytes */
    int dataset;                 /* index into datasets */
    int repeat;                  /* 0 .. repeats-1 */
    uint64_t seed;               /* derived from base_seed and the cell */
    char *canon;                 /* canonical text of the resolved cell */
    const struct fk_evict_ops *evict; /* the block's `evict` policy (core/fk_evict.h) or NULL */
    void *evict_opts;            /* evict->opts_size bytes, or NULL */
    struct fk_rewrite *rewrite;  /* the block's row rewrites (merge, think) or NULL */
};

struct fk_sweep {
    char *path;                  /* config file */
    char *name;                  /* [sweep] name */
    char *output;                /* results directory */
    int jobs;                    /* worker threads */
    const char *const *given_hashes; /* during fk_sweep_load_hashed only */
    int n_given_hashes;
    double cell_timeout_s;       /* [sweep] cell_timeout: seconds a cell may run (0: none) */
    long mem_limit_mib;          /* [sweep] mem_limit: MiB for the cells in flight (0: half
                                  * the RAM; fk_runner_run) */
    int attention;               /* attention fidelity on/off */
    int attn_stride;             /* every k-th decode step */
    uint8_t *attn_layers;        /* [max layer + 1] or NULL = all */
    int n_attn_layers;
    int recall;                  /* pool recall diagnostics */
    int recall_every;            /* prefill sub-sampling for recall */
    int repeats;
    uint64_t base_seed;
    struct fk_dataset *datasets;
    int n_datasets;
    struct fk_sweep_cell *cells;
    int n_cells;
    char *budgets;               /* [sweep] budgets of plot's equal-budget table ("2,5,8"),
                                  * or NULL */
    char *cost_baseline;         /* codec whose cost is 1 in cost_mac_rel / cpu_time_rel
                                  * ([sweep] cost_baseline; default fk_default_cost_baseline) */
    char config_hash[65];        /* sha256 of the canonical resolved sweep */
    char *resolved;              /* canonical text of the whole resolved sweep */
    char **warnings;             /* [n_warnings] what resolution noticed but accepts (a --set
                                  * default that codec blocks override), for the caller */
    int n_warnings;
};

/* The folder of the named presets (`preset = "NAME"` reads NAME.toml there): the
 * environment's FADKV_PRESET_DIR, else the source tree's configs/presets. */
const char *fk_sweep_preset_dir(void);

/* Loads and resolves a sweep. sets: "key=value" overrides applied to the TOML tree
 * (dotted keys, e.g. "sweep.jobs=1", "defaults.s=4"). hash_content: hash the traces and
 * dictionaries (cell ids depend on the data); 0 for a quick parse (dry runs may still
 * want it). */
/* fk_sweep_load for a cell's child process: the datasets' content hashes as the parent
 * computed them (hashes[d] for dataset d, in file order) instead of reading the data again,
 * so that the cell ids are the parent's. */
int fk_sweep_load_hashed(const char *path, const char *const *sets, int n_sets,
                         const char *const *hashes, int n_hashes, struct fk_sweep **out);
int fk_sweep_load(const char *path, const char *const *sets, int n_sets, int hash_content,
                  struct fk_sweep **out);
void fk_sweep_free(struct fk_sweep **s);

/* Estimated multiply-adds of a cell from the vector counts of its traces (cost model);
 * *vectors (nullable) receives the number of key and value vectors. */
double fk_sweep_cell_macs(const struct fk_sweep *s, const struct fk_sweep_cell *c,
                          double *vectors);

#endif
