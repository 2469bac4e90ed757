/* SPDX-License-Identifier: MIT
 * Calibration file format v1 (HDF5; documented in datasets/CALIB.md): the model-level
 * constants of the calibrated quantisers (FK_CAP_CALIB), trained on calibration traces by
 * `fadkv-bench train-calib`: per layer, KVQuant's pre-RoPE key channel thresholds and its
 * k-means levels (LUTs) of keys and values, at one or more outlier fractions (struct
 * fk_calib, core/fk_codec.h).
 *
 * The reader checks every attribute, every dataset's presence, shape and type, finite
 * values, lower <= upper, and LUTs ascending within [-1, 1] (up to 1e-6), naming the file
 * and the dataset. The writer writes a temporary file and renames it into place.
 */
#ifndef FK_CALIB_H
#define FK_CALIB_H

#include "core/fk_codec.h"
#include "formats/fk_trace.h"

#define FK_CALIB_SCHEMA "fadkv-calib"
#define FK_CALIB_VERSION 1
#define FK_CALIB_MAX_FRACTIONS 8

/* What a calibration file's attributes say. */
struct fk_calib_shape {
    int n_layers, n_kv_heads, head_dim;
    int n_fractions;             /* KVQuant outlier fractions, 1 .. FK_CALIB_MAX_FRACTIONS */
    double fractions[FK_CALIB_MAX_FRACTIONS]; /* ascending, each in [0, 0.5) */
    int sinks;                   /* first tokens of each trace the LUT fits left out (>= 0) */
    long n_vectors;              /* calibration tokens over all traces */
};

struct fk_calib_file {
    char *path;                  /* file name, for messages */
    struct fk_calib_shape sh;
    char model_id[256];
    /* [n_layers][n_fractions]: keys' upper and lower thresholds [n_kv_heads][head_dim] */
    float *upper, *lower;
    /* [n_layers][n_fractions][3 LUT sets: keys, values row, values head][bits 2..4]: the
     * 4 + 8 + 16 levels of each set packed, bits 2 first */
    float *lut;
    struct fk_kvq_cal *kvq;      /* [n_layers][2 kinds][n_fractions] views into the arrays */
    struct fk_calib *views;      /* [n_layers][2 kinds] */
};

/* A calibration file of this shape with zeroed arrays (the trainer fills them). */
int fk_calib_alloc(const struct fk_calib_shape *sh, const char *path,
                   struct fk_calib_file **out);
void fk_calib_free(struct fk_calib_file **c);

int fk_calib_load(const char *path, struct fk_calib_file **out);

/* Refuses a calibration whose layers, KV heads or head_dim differ from the trace's. */
int fk_calib_check_trace(const struct fk_calib_shape *sh, const char *calib_path,
                         const struct fk_trace_info *ti, const char *trace_path);

/* The calibration of (layer, kind) as a codec sees it. */
const struct fk_calib *fk_calib_get(const struct fk_calib_file *c, int layer, int kind);

/* The arrays of (layer, fraction index), for the trainer: the keys' thresholds and the LUT
 * of `set` (0 keys, 1 values by row, 2 values by head) at `bits` (2 .. 4). */
float *fk_calib_upper(struct fk_calib_file *c, int layer, int fi);
float *fk_calib_lower(struct fk_calib_file *c, int layer, int fi);
float *fk_calib_lut(struct fk_calib_file *c, int layer, int fi, int set, int bits);

/* Writes c atomically (temporary file + rename). attrs: NULL-terminated name, value string
 * pairs of provenance. */
int fk_calib_save(const struct fk_calib_file *c, const char *path, const char *const *attrs);

#endif
