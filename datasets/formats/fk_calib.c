/* SPDX-License-Identifier: MIT
 * Calibration file v1 reader and writer (see fk_calib.h, datasets/CALIB.md).
 */
#include "formats/fk_calib.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fk_err.h"
#include "formats/fk_h5.h"

/* The LUT sets of one (layer, fraction), and the 4 + 8 + 16 levels of each packed. */
enum { SET_KEYS = 0, SET_VALUES_ROW = 1, SET_VALUES_HEAD = 2, N_SETS = 3 };
static const char *const set_names[N_SETS] = {"keys", "values_row", "values_head"};
#define LUT_PACK 28
/* A LUT level may stray this far outside [-1, 1] (float32 rounding of a mean of values in
 * [-1, 1]). */
#define LUT_TOL 1e-6

void fk_calib_free(struct fk_calib_file **cp)
{
    struct fk_calib_file *c = cp ? *cp : NULL;
    if (!c)
        return;
    free(c->path);
    free(c->upper);
    free(c->lower);
    free(c->lut);
    free(c->kvq);
    free(c->views);
    free(c);
    *cp = NULL;
}

/* Floats of one threshold array: [n_kv_heads][head_dim]. */
static size_t thr_per(const struct fk_calib_shape *sh)
{
    return (size_t)sh->n_kv_heads * sh->head_dim;
}

/* Index of (layer, fraction index) among the n_layers x n_fractions slots. */
static size_t slot(const struct fk_calib_file *c, int layer, int fi)
{
    return (size_t)layer * c->sh.n_fractions + (size_t)fi;
}

float *fk_calib_upper(struct fk_calib_file *c, int layer, int fi)
{
    return c->upper + slot(c, layer, fi) * thr_per(&c->sh);
}

float *fk_calib_lower(struct fk_calib_file *c, int layer, int fi)
{
    return c->lower + slot(c, layer, fi) * thr_per(&c->sh);
}

float *fk_calib_lut(struct fk_calib_file *c, int layer, int fi, int set, int bits)
{
    /* bits 2, 3, 4 start at 0, 4, 12 of the packed 28 */
    return c->lut + (slot(c, layer, fi) * N_SETS + (size_t)set) * LUT_PACK +
           (size_t)((1 << bits) - 4);
}

/* The views of every (layer, kind): keys see their thresholds and the keys LUTs (group
 * FK_KVQ_ROW), values the row and head LUTs. */
static void make_views(struct fk_calib_file *c)
{
    const struct fk_calib_shape *sh = &c->sh;
    for (int l = 0; l < sh->n_layers; l++)
        for (int kind = 0; kind < 2; kind++) {
            struct fk_kvq_cal *kvq = c->kvq + ((size_t)l * 2 + kind) * sh->n_fractions;
            for (int fi = 0; fi < sh->n_fractions; fi++) {
                struct fk_kvq_cal *q = &kvq[fi];
                memset(q, 0, sizeof *q);
                q->outliers = sh->fractions[fi];
                if (kind == FK_KIND_K) {
                    q->upper = fk_calib_upper(c, l, fi);
                    q->lower = fk_calib_lower(c, l, fi);
                }
                for (int b = FK_KVQ_BITS_MIN; b <= FK_KVQ_BITS_MAX; b++) {
                    int row = kind == FK_KIND_K ? SET_KEYS : SET_VALUES_ROW;
                    q->lut[b - FK_KVQ_BITS_MIN][FK_KVQ_ROW] = fk_calib_lut(c, l, fi, row, b);
                    if (kind != FK_KIND_K)
                        q->lut[b - FK_KVQ_BITS_MIN][FK_KVQ_HEAD] =
                            fk_calib_lut(c, l, fi, SET_VALUES_HEAD, b);
                }
            }
            c->views[(size_t)l * 2 + kind] = (struct fk_calib){
                .n_kv_heads = sh->n_kv_heads, .head_dim = sh->head_dim, .sinks = sh->sinks,
                .n_kvq = sh->n_fractions, .kvq = kvq};
        }
}

/* The shape's ranges: sizes, 1 .. 8 fractions ascending in [0, 0.5), sinks >= 0. */
static int shape_check(const struct fk_calib_shape *sh, const char *path)
{
    if (sh->n_layers < 1 || sh->n_layers > (1 << 16) || sh->n_kv_heads < 1 ||
        sh->n_kv_heads > (1 << 16) || sh->head_dim < 1 || sh->head_dim > 4096)
        return fk_err(FK_EINVAL, "%s: calibration shape %d layers x %d KV heads x head_dim %d: "
                      "expected positive sizes, head_dim <= 4096", path, sh->n_layers,
                      sh->n_kv_heads, sh->head_dim);
    if (sh->n_fractions < 1 || sh->n_fractions > FK_CALIB_MAX_FRACTIONS)
        return fk_err(FK_EINVAL, "%s: %d outlier fractions, expected 1 .. %d", path,
                      sh->n_fractions, FK_CALIB_MAX_FRACTIONS);
    for (int i = 0; i < sh->n_fractions; i++) {
        double f = sh->fractions[i];
        if (!(f >= 0 && f < 0.5) || (i && !(f > sh->fractions[i - 1])))
            return fk_err(FK_EINVAL, "%s: kvquant_outliers[%d] = %g: expected ascending, "
                          "distinct fractions in [0, 0.5)", path, i, f);
    }
    if (sh->sinks < 0)
        return fk_err(FK_EINVAL, "%s: sinks = %d, expected >= 0", path, sh->sinks);
    if ((double)sh->n_layers * sh->n_fractions * thr_per(sh) > 1073741824.0)
        return fk_err(FK_EINVAL, "%s: %d layers x %d fractions x %d x %d thresholds exceed the "
                      "2^30 this reader supports", path, sh->n_layers, sh->n_fractions,
                      sh->n_kv_heads, sh->head_dim);
    return FK_OK;
}

int fk_calib_alloc(const struct fk_calib_shape *sh, const char *path,
                   struct fk_calib_file **out)
{
    *out = NULL;
    FK_TRY(shape_check(sh, path));
    struct fk_calib_file *c = calloc(1, sizeof *c);
    if (!c)
        return fk_err(FK_ENOMEM, "out of memory");
    c->sh = *sh;
    size_t slots = (size_t)sh->n_layers * sh->n_fractions;
    c->path = strdup(path);
    c->upper = calloc(slots * thr_per(sh), sizeof(float));
    c->lower = calloc(slots * thr_per(sh), sizeof(float));
    c->lut = calloc(slots * N_SETS * LUT_PACK, sizeof(float));
    c->kvq = calloc(slots * 2, sizeof *c->kvq);
    c->views = calloc((size_t)sh->n_layers * 2, sizeof *c->views);
    if (!c->path || !c->upper || !c->lower || !c->lut || !c->kvq || !c->views) {
        fk_calib_free(&c);
        return fk_err(FK_ENOMEM, "%s: out of memory for the calibration (%zu thresholds)", path,
                      2 * slots * thr_per(sh));
    }
    make_views(c);
    *out = c;
    return FK_OK;
}

const struct fk_calib *fk_calib_get(const struct fk_calib_file *c, int layer, int kind)
{
    return &c->views[(size_t)layer * 2 + (size_t)kind];
}

int fk_calib_check_trace(const struct fk_calib_shape *sh, const char *calib_path,
                         const struct fk_trace_info *ti, const char *trace_path)
{
    if (sh->n_layers != ti->n_layers || sh->n_kv_heads != ti->n_kv_heads ||
        sh->head_dim != ti->head_dim)
        return fk_err(FK_ECONFIG, "calibration %s has %d layers x %d KV heads x head_dim %d but "
                      "trace %s has %d x %d x %d", calib_path, sh->n_layers, sh->n_kv_heads,
                      sh->head_dim, trace_path, ti->n_layers, ti->n_kv_heads, ti->head_dim);
    return FK_OK;
}

/* ---- reader ------------------------------------------------------------------------------ */

/* /kvquant_outliers: 1 .. FK_CALIB_MAX_FRACTIONS fractions, ascending in [0, 0.5). */
static int read_fractions(hid_t f, const char *path, struct fk_calib_shape *sh)
{
    static const char name[] = "/kvquant_outliers";
    hid_t ds;
    hsize_t n;
    FK_TRY(fk_h5_open_floats(f, path, name, 1, &n, &ds));
    H5Dclose(ds);
    if (n < 1 || n > FK_CALIB_MAX_FRACTIONS)
        return fk_err(FK_ECORRUPT, "%s: dataset %s has %llu fractions, expected 1 .. %d", path,
                      name, (unsigned long long)n, FK_CALIB_MAX_FRACTIONS);
    sh->n_fractions = (int)n;
    FK_TRY(fk_h5_read_floats(f, path, name, H5T_NATIVE_DOUBLE, 1, &n, sh->fractions));
    for (int i = 0; i < sh->n_fractions; i++) {
        double v = sh->fractions[i];
        if (!(v >= 0 && v < 0.5) || (i && !(v > sh->fractions[i - 1])))
            return fk_err(FK_ECORRUPT, "%s: dataset %s: entry %d = %g, expected ascending, "
                          "distinct fractions in [0, 0.5)", path, name, i, v);
    }
    return FK_OK;
}

static int read_shape(hid_t f, const char *path, struct fk_calib_shape *sh)
{
    memset(sh, 0, sizeof *sh);
    FK_TRY(fk_h5_schema(f, path, FK_CALIB_SCHEMA, FK_CALIB_VERSION));
    long v = 0;
    FK_TRY(fk_h5_attr_range(f, path, "n_layers", 1, 1 << 16, &v));
    sh->n_layers = (int)v;
    FK_TRY(fk_h5_attr_range(f, path, "n_kv_heads", 1, 1 << 16, &v));
    sh->n_kv_heads = (int)v;
    FK_TRY(fk_h5_attr_range(f, path, "head_dim", 1, 4096, &v));
    sh->head_dim = (int)v;
    FK_TRY(fk_h5_attr_range(f, path, "sinks", 0, 1L << 30, &v));
    sh->sinks = (int)v;
    FK_TRY(fk_h5_attr_range(f, path, "n_vectors", 1, 1L << 40, &sh->n_vectors));
    FK_TRY(read_fractions(f, path, sh));
    int rc = shape_check(sh, path);
    return rc == FK_EINVAL ? FK_ECORRUPT : rc;
}

/* Finite thresholds with lower <= upper, channel by channel. */
static int check_thresholds(const struct fk_calib_file *c, const char *g, const float *up,
                            const float *lo)
{
    for (size_t i = 0; i < thr_per(&c->sh); i++) {
        const char *bad = !isfinite(up[i]) ? "upper" : !isfinite(lo[i]) ? "lower" : NULL;
        if (bad)
            return fk_err(FK_ECORRUPT, "%s: dataset %s/keys_%s: non-finite value at head %zu, "
                          "channel %zu", c->path, g, bad, i / (size_t)c->sh.head_dim,
                          i % (size_t)c->sh.head_dim);
        if (lo[i] > up[i])
            return fk_err(FK_ECORRUPT, "%s: dataset %s/keys_lower: head %zu, channel %zu: lower "
                          "%g > upper %g (%s/keys_upper)", c->path, g,
                          i / (size_t)c->sh.head_dim, i % (size_t)c->sh.head_dim, lo[i], up[i],
                          g);
    }
    return FK_OK;
}

/* A LUT: finite, non-decreasing, within [-1, 1] up to LUT_TOL. */
static int check_lut(const char *path, const char *name, const float *lut, int n)
{
    for (int i = 0; i < n; i++)
        if (!(fabs(lut[i]) <= 1 + LUT_TOL) || (i && !(lut[i] >= lut[i - 1])))
            return fk_err(FK_ECORRUPT, "%s: dataset %s: level %d = %g, expected finite, "
                          "ascending levels in [-1, 1]", path, name, i, lut[i]);
    return FK_OK;
}

static int load_slot(struct fk_calib_file *c, hid_t f, int l, int fi)
{
    const struct fk_calib_shape *sh = &c->sh;
    char g[64], name[128];
    snprintf(g, sizeof g, "/layers/L%02d/kvquant/F%d", l, fi);
    hsize_t td[2] = {(hsize_t)sh->n_kv_heads, (hsize_t)sh->head_dim};
    snprintf(name, sizeof name, "%s/keys_upper", g);
    FK_TRY(fk_h5_read_floats(f, c->path, name, H5T_NATIVE_FLOAT, 2, td, fk_calib_upper(c, l, fi)));
    snprintf(name, sizeof name, "%s/keys_lower", g);
    FK_TRY(fk_h5_read_floats(f, c->path, name, H5T_NATIVE_FLOAT, 2, td, fk_calib_lower(c, l, fi)));
    FK_TRY(check_thresholds(c, g, fk_calib_upper(c, l, fi), fk_calib_lower(c, l, fi)));
    for (int s = 0; s < N_SETS; s++)
        for (int b = FK_KVQ_BITS_MIN; b <= FK_KVQ_BITS_MAX; b++) {
            hsize_t n = (hsize_t)1 << b;
            float *lut = fk_calib_lut(c, l, fi, s, b);
            snprintf(name, sizeof name, "%s/%s_lut%d", g, set_names[s], b);
            FK_TRY(fk_h5_read_floats(f, c->path, name, H5T_NATIVE_FLOAT, 1, &n, lut));
            FK_TRY(check_lut(c->path, name, lut, (int)n));
        }
    return FK_OK;
}

static int load(hid_t f, const char *path, struct fk_calib_file **out)
{
    struct fk_calib_shape sh;
    FK_TRY(read_shape(f, path, &sh));
    FK_TRY(fk_calib_alloc(&sh, path, out));
    struct fk_calib_file *c = *out;
    if (fk_h5_has_attr(f, "model_id"))
        FK_TRY(fk_h5_attr_str(f, path, "model_id", c->model_id, sizeof c->model_id));
    for (int l = 0; l < sh.n_layers; l++)
        for (int fi = 0; fi < sh.n_fractions; fi++)
            FK_TRY(load_slot(c, f, l, fi));
    return FK_OK;
}

int fk_calib_load(const char *path, struct fk_calib_file **out)
{
    *out = NULL;
    hid_t f;
    FK_TRY(fk_h5_open_ro(path, "calibration file", &f));
    int rc = load(f, path, out);
    H5Fclose(f);
    if (rc < 0)
        fk_calib_free(out);
    return rc;
}

/* ---- writer ------------------------------------------------------------------------------ */

/* Group /layers/Lxx/kvquant/F{fi} (intermediate groups created) with its datasets. */
static int write_slot(struct fk_calib_file *c, hid_t f, hid_t lcpl, int l, int fi)
{
    const struct fk_calib_shape *sh = &c->sh;
    char name[64];
    snprintf(name, sizeof name, "/layers/L%02d/kvquant/F%d", l, fi);
    hid_t g = H5Gcreate2(f, name, lcpl, H5P_DEFAULT, H5P_DEFAULT);
    if (g < 0)
        return fk_err(FK_EIO, "cannot create group %s", name);
    hsize_t td[2] = {(hsize_t)sh->n_kv_heads, (hsize_t)sh->head_dim};
    int rc = fk_h5_write(g, "keys_upper", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 2, td, 0, 0,
                         fk_calib_upper(c, l, fi));
    if (rc == FK_OK)
        rc = fk_h5_write(g, "keys_lower", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 2, td, 0, 0,
                         fk_calib_lower(c, l, fi));
    for (int s = 0; s < N_SETS && rc == FK_OK; s++)
        for (int b = FK_KVQ_BITS_MIN; b <= FK_KVQ_BITS_MAX && rc == FK_OK; b++) {
            hsize_t n = (hsize_t)1 << b;
            char ds[32];
            snprintf(ds, sizeof ds, "%s_lut%d", set_names[s], b);
            rc = fk_h5_write(g, ds, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 1, &n, 0, 0,
                             fk_calib_lut(c, l, fi, s, b));
        }
    H5Gclose(g);
    return rc;
}

static int write_attrs(hid_t f, const struct fk_calib_file *c, const char *const *attrs)
{
    const struct fk_calib_shape *sh = &c->sh;
    int rc = fk_h5_put_str(f, "schema", FK_CALIB_SCHEMA);
    if (!rc) rc = fk_h5_put_i64(f, "schema_version", FK_CALIB_VERSION);
    if (!rc) rc = fk_h5_put_i64(f, "n_layers", sh->n_layers);
    if (!rc) rc = fk_h5_put_i64(f, "n_kv_heads", sh->n_kv_heads);
    if (!rc) rc = fk_h5_put_i64(f, "head_dim", sh->head_dim);
    if (!rc) rc = fk_h5_put_i64(f, "sinks", sh->sinks);
    if (!rc) rc = fk_h5_put_i64(f, "n_vectors", sh->n_vectors);
    if (!rc) rc = fk_h5_put_str(f, "model_id", c->model_id);
    for (int i = 0; !rc && attrs && attrs[i] && attrs[i + 1]; i += 2)
        rc = fk_h5_put_str(f, attrs[i], attrs[i + 1]);
    hsize_t n = (hsize_t)sh->n_fractions;
    if (!rc)
        rc = fk_h5_write(f, "kvquant_outliers", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, 1, &n, 0, 0,
                         sh->fractions);
    return rc;
}

int fk_calib_save(const struct fk_calib_file *cc, const char *path, const char *const *attrs)
{
    struct fk_calib_file *c = (struct fk_calib_file *)cc; /* the slot accessors are not const */
    char tmp[4096];
    hid_t f;
    FK_TRY(fk_h5_create_tmp(path, tmp, sizeof tmp, &f));
    int rc = write_attrs(f, c, attrs);
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    if (!rc && (lcpl < 0 || H5Pset_create_intermediate_group(lcpl, 1) < 0))
        rc = fk_err(FK_EEXTERNAL, "HDF5: cannot make a link creation property list");
    for (int l = 0; !rc && l < c->sh.n_layers; l++)
        for (int fi = 0; !rc && fi < c->sh.n_fractions; fi++)
            rc = write_slot(c, f, lcpl, l, fi);
    if (lcpl >= 0)
        H5Pclose(lcpl);
    rc = fk_h5_commit_tmp(f, tmp, path, rc);
    return rc ? fk_err_context(rc, "%s", path) : FK_OK;
}
