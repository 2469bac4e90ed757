/* SPDX-License-Identifier: MIT
 * Dictionary file format v1 (HDF5; documented in datasets/README.md): one dictionary of
 * N unit atoms per (layer, kind), atom-major [N][head_dim] float32.
 *
 * The loader renormalises every atom to unit L2 norm (spec 3.1), zeroes and flags dead
 * atoms (norm < 1e-12), and records the largest deviation from unit norm. Near-duplicate
 * atoms are counted when a Gram matrix is built.
 */
#ifndef FK_DICT_H
#define FK_DICT_H

#include <stdint.h>

#include "core/fk_codec.h"
#include "formats/fk_trace.h"

#define FK_DICT_SCHEMA "fadkv-dict"
#define FK_DICT_VERSION 1

struct fk_dict {
    char *path;                  /* file name, for messages */
    int n_layers;
    int head_dim;                /* m */
    int n_atoms;                 /* N */
    float *atoms;                /* [n_layers][2][N][m], unit norm, dead atoms zero */
    uint8_t *dead;               /* [n_layers][2][N] */
    int n_dead;                  /* over all layers and kinds */
    double max_norm_dev;         /* max_j | ||d_j|| - 1 | before renormalisation */
};

int fk_dict_load(const char *path, struct fk_dict **out);
void fk_dict_free(struct fk_dict **d);

/* The atom count N of a dictionary file, from its attributes alone (no atom is read). */
int fk_dict_atoms(const char *path, int *n_atoms);

/* Refuses a dictionary whose head_dim or layer count does not match the trace. */
int fk_dict_check_trace(const struct fk_dict *d, const struct fk_trace_info *ti,
                        const char *trace_path);

/* The base dictionary of (layer, kind) without a Gram (out->gram = NULL). */
void fk_dict_base(const struct fk_dict *d, int layer, int kind, struct fk_base_dict *out);

/* Writes a dictionary (atoms [n_layers][2][N][m]) atomically (temp file + rename).
 * attrs: NULL-terminated list of name, value string pairs for provenance. */
int fk_dict_save(const char *path, int n_layers, int head_dim, int n_atoms, const float *atoms,
                 const char *const *attrs);

/* G = D^T D for unit atoms [N][m] (SSYRK, mirrored): caller frees *gram. */
int fk_gram_build(const float *atoms, int n_atoms, int m, float **gram);
/* Pairs i < j of live atoms with |G_ij| > 1 - 1e-6. */
long fk_gram_duplicates(const float *gram, int n_atoms, const uint8_t *dead);

#endif
