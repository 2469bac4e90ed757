/* SPDX-License-Identifier: MIT
 * Basis file format v1 (HDF5; documented in datasets/BASIS.md): per (layer, kind) and head
 * group, the mean and the eigen-decompositions (centered covariance, uncentered second
 * moment) of calibration vectors, for the low-rank codecs (FK_CAP_BASIS). Keys are stored
 * post-RoPE always, and un-rotated (pre-RoPE) as a third variant when every calibration
 * trace described its RoPE.
 *
 * The reader checks every attribute, every dataset's presence, shape and type, finite
 * values, unit-norm basis rows and descending eigenvalues, naming the file and the dataset.
 * The writer writes a temporary file and renames it into place.
 */
#ifndef FK_BASIS_H
#define FK_BASIS_H

#include "core/fk_codec.h"
#include "formats/fk_trace.h"

#define FK_BASIS_SCHEMA "fadkv-basis"
#define FK_BASIS_VERSION 1

/* The variants of a layer: keys (as the traces store them, post-RoPE), values, and keys
 * un-rotated to pre-RoPE (present when has_pre_rope). */
enum fk_basis_variant { FK_BV_KEYS = 0, FK_BV_VALUES = 1, FK_BV_KEYS_PRE = 2, FK_BV_N = 3 };
extern const char *const fk_basis_variant_names[]; /* "keys", "values", "keys_pre_rope" */

/* What a basis file's attributes say (fk_basis_shape reads only these). */
struct fk_basis_shape {
    int n_layers, n_kv_heads, head_dim;
    int group;                   /* g, divides n_kv_heads */
    int n_groups, dim;           /* n_kv_heads / g, g * head_dim */
    int n_comp;                  /* k <= dim */
    int has_pre_rope;            /* keys_pre_rope variant present */
    long n_vectors;              /* calibration tokens (each gives one vector per group) */
};

struct fk_basis_file {
    char *path;                  /* file name, for messages */
    struct fk_basis_shape sh;
    char model_id[256];
    /* [n_layers][FK_BV_N] slots (the pre-RoPE slot unused without has_pre_rope) */
    float *mean;                 /* [slot][n_groups][dim] */
    float *vec;                  /* [slot][2 (center)][n_groups][n_comp][dim] */
    double *eig;                 /* [slot][2][n_groups][n_comp] */
    struct fk_basis *views;      /* [n_layers][FK_BV_N], pointing into the arrays */
};

/* A basis of this shape with zeroed arrays (the trainer fills them); shape fields n_groups
 * and dim are derived. FK_EINVAL when g does not divide n_kv_heads or k is out of range. */
int fk_basis_alloc(const struct fk_basis_shape *sh, const char *path,
                   struct fk_basis_file **out);
void fk_basis_free(struct fk_basis_file **b);

int fk_basis_load(const char *path, struct fk_basis_file **out);
/* The shape of a basis file from its attributes alone (no dataset is read). */
int fk_basis_read_shape(const char *path, struct fk_basis_shape *out);

/* Refuses a basis whose layers, KV heads or head_dim differ from the trace's. */
int fk_basis_check_trace(const struct fk_basis_shape *sh, const char *basis_path,
                         const struct fk_trace_info *ti, const char *trace_path);

/* The basis of (layer, kind) as a codec sees it; for keys its pre_rope member points to the
 * pre-RoPE variant (NULL without one). */
const struct fk_basis *fk_basis_get(const struct fk_basis_file *b, int layer, int kind);

/* Slot arrays of (layer, variant), for the trainer. */
float *fk_basis_mean(struct fk_basis_file *b, int layer, int variant);
float *fk_basis_vec(struct fk_basis_file *b, int layer, int variant, int center);
double *fk_basis_eig(struct fk_basis_file *b, int layer, int variant, int center);

/* Writes b atomically (temporary file + rename). attrs: NULL-terminated name, value string
 * pairs of provenance. */
int fk_basis_save(const struct fk_basis_file *b, const char *path, const char *const *attrs);

#endif
