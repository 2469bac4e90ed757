/* SPDX-License-Identifier: MIT
 * Basis file v1 reader and writer (see fk_basis.h, datasets/BASIS.md).
 */
#include "formats/fk_basis.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fk_err.h"
#include "formats/fk_h5.h"

const char *const fk_basis_variant_names[] = {"keys", "values", "keys_pre_rope", NULL};
static const char *const center_names[2] = {"centered", "uncentered"};

/* Unit-norm tolerance of a stored (float32) basis row: trained rows are orthonormal in
 * double, and rounding to float32 moves a norm by about 1e-7. */
#define NORM_TOL 1e-4

void fk_basis_free(struct fk_basis_file **bp)
{
    struct fk_basis_file *b = bp ? *bp : NULL;
    if (!b)
        return;
    free(b->path);
    free(b->mean);
    free(b->vec);
    free(b->eig);
    free(b->views);
    free(b);
    *bp = NULL;
}

static size_t slots(const struct fk_basis_shape *sh) { return (size_t)sh->n_layers * FK_BV_N; }
static size_t mean_per(const struct fk_basis_shape *sh) { return (size_t)sh->n_groups * sh->dim; }
static size_t eig_per(const struct fk_basis_shape *sh) { return (size_t)sh->n_groups * sh->n_comp; }
static size_t vec_per(const struct fk_basis_shape *sh) { return eig_per(sh) * (size_t)sh->dim; }

static size_t slot_of(const struct fk_basis_file *b, int layer, int variant)
{
    return (size_t)layer * FK_BV_N + (size_t)variant;
}

float *fk_basis_mean(struct fk_basis_file *b, int layer, int variant)
{
    return b->mean + slot_of(b, layer, variant) * mean_per(&b->sh);
}

float *fk_basis_vec(struct fk_basis_file *b, int layer, int variant, int center)
{
    return b->vec + (slot_of(b, layer, variant) * 2 + (size_t)center) * vec_per(&b->sh);
}

double *fk_basis_eig(struct fk_basis_file *b, int layer, int variant, int center)
{
    return b->eig + (slot_of(b, layer, variant) * 2 + (size_t)center) * eig_per(&b->sh);
}

/* The views of every (layer, variant); keys point to their pre-RoPE variant. */
static void make_views(struct fk_basis_file *b)
{
    for (int l = 0; l < b->sh.n_layers; l++)
        for (int v = 0; v < FK_BV_N; v++) {
            struct fk_basis *w = &b->views[slot_of(b, l, v)];
            *w = (struct fk_basis){.group = b->sh.group, .n_groups = b->sh.n_groups,
                                   .dim = b->sh.dim, .n_comp = b->sh.n_comp,
                                   .mean = fk_basis_mean(b, l, v)};
            for (int c = 0; c < 2; c++) {
                w->vec[c] = fk_basis_vec(b, l, v, c);
                w->eig[c] = fk_basis_eig(b, l, v, c);
            }
        }
    for (int l = 0; b->sh.has_pre_rope && l < b->sh.n_layers; l++)
        b->views[slot_of(b, l, FK_BV_KEYS)].pre_rope = &b->views[slot_of(b, l, FK_BV_KEYS_PRE)];
}

/* The shape's derived fields and ranges. */
static int shape_check(struct fk_basis_shape *sh, const char *path)
{
    if (sh->n_layers < 1 || sh->n_kv_heads < 1 || sh->head_dim < 1 || sh->head_dim > 4096 ||
        sh->group < 1)
        return fk_err(FK_EINVAL, "%s: basis shape %d layers x %d KV heads x head_dim %d, "
                      "group %d: expected positive sizes, head_dim <= 4096", path,
                      sh->n_layers, sh->n_kv_heads, sh->head_dim, sh->group);
    if (sh->n_kv_heads % sh->group)
        return fk_err(FK_EINVAL, "%s: group = %d does not divide n_kv_heads = %d", path,
                      sh->group, sh->n_kv_heads);
    sh->n_groups = sh->n_kv_heads / sh->group;
    sh->dim = sh->group * sh->head_dim;
    if (sh->n_comp < 1 || sh->n_comp > sh->dim)
        return fk_err(FK_EINVAL, "%s: rank = %d components, expected 1 .. group x head_dim = %d",
                      path, sh->n_comp, sh->dim);
    if ((double)slots(sh) * 2 * vec_per(sh) > 2147483648.0)
        return fk_err(FK_EINVAL, "%s: %d layers x %d groups x %d x %d exceeds the 2^31 values "
                      "this reader supports", path, sh->n_layers, sh->n_groups, sh->n_comp,
                      sh->dim);
    return FK_OK;
}

int fk_basis_alloc(const struct fk_basis_shape *shape, const char *path,
                   struct fk_basis_file **out)
{
    *out = NULL;
    struct fk_basis_shape sh = *shape;
    FK_TRY(shape_check(&sh, path));
    struct fk_basis_file *b = calloc(1, sizeof *b);
    if (!b)
        return fk_err(FK_ENOMEM, "out of memory");
    b->sh = sh;
    b->path = strdup(path);
    b->mean = calloc(slots(&sh) * mean_per(&sh), sizeof(float));
    b->vec = calloc(slots(&sh) * 2 * vec_per(&sh), sizeof(float));
    b->eig = calloc(slots(&sh) * 2 * eig_per(&sh), sizeof(double));
    b->views = calloc(slots(&sh), sizeof *b->views);
    if (!b->path || !b->mean || !b->vec || !b->eig || !b->views) {
        fk_basis_free(&b);
        return fk_err(FK_ENOMEM, "%s: out of memory for the basis (%zu floats)", path,
                      slots(&sh) * 2 * vec_per(&sh));
    }
    make_views(b);
    *out = b;
    return FK_OK;
}

/* ---- reader ------------------------------------------------------------------------------ */

static int open_file(const char *path, hid_t *f)
{
    return fk_h5_open_ro(path, "basis file", f);
}

static int read_shape(hid_t f, const char *path, struct fk_basis_shape *sh)
{
    memset(sh, 0, sizeof *sh);
    FK_TRY(fk_h5_schema(f, path, FK_BASIS_SCHEMA, FK_BASIS_VERSION));
    long v = 0;
    FK_TRY(fk_h5_attr_range(f, path, "n_layers", 1, 1 << 16, &v));
    sh->n_layers = (int)v;
    FK_TRY(fk_h5_attr_range(f, path, "n_kv_heads", 1, 1 << 16, &v));
    sh->n_kv_heads = (int)v;
    FK_TRY(fk_h5_attr_range(f, path, "head_dim", 1, 4096, &v));
    sh->head_dim = (int)v;
    FK_TRY(fk_h5_attr_range(f, path, "group", 1, 1 << 16, &v));
    sh->group = (int)v;
    FK_TRY(fk_h5_attr_range(f, path, "rank", 1, 1 << 24, &v));
    sh->n_comp = (int)v;
    FK_TRY(fk_h5_attr_range(f, path, "keys_pre_rope", 0, 1, &v));
    sh->has_pre_rope = (int)v;
    FK_TRY(fk_h5_attr_range(f, path, "n_vectors", 1, 1L << 40, &sh->n_vectors));
    int rc = shape_check(sh, path);
    return rc == FK_EINVAL ? FK_ECORRUPT : rc;
}

/* Basis rows of unit norm, eigenvalues finite and descending (>= 0 up to rounding). */
static int check_variant(const struct fk_basis_file *b, const char *name, const float *vec,
                         const double *eig, const float *mean)
{
    const struct fk_basis_shape *sh = &b->sh;
    for (size_t i = 0; i < mean_per(sh); i++)
        if (!isfinite(mean[i]))
            return fk_err(FK_ECORRUPT, "%s: %s/mean: non-finite value at %zu", b->path, name, i);
    for (int g = 0; g < sh->n_groups; g++)
        for (int j = 0; j < sh->n_comp; j++) {
            const float *u = vec + ((size_t)g * sh->n_comp + j) * sh->dim;
            double nn = 0;
            for (int c = 0; c < sh->dim; c++)
                nn += (double)u[c] * u[c];
            if (!(fabs(sqrt(nn) - 1) <= NORM_TOL))
                return fk_err(FK_ECORRUPT, "%s: %s_basis: group %d row %d has norm %g, expected "
                              "orthonormal rows", b->path, name, g, j, sqrt(nn));
            double e = eig[(size_t)g * sh->n_comp + j];
            double prev = j ? eig[(size_t)g * sh->n_comp + j - 1] : INFINITY;
            if (!isfinite(e) || e > prev || e < -1e-6 * (fabs(eig[(size_t)g * sh->n_comp]) + 1))
                return fk_err(FK_ECORRUPT, "%s: %s_eigenvalues: group %d entry %d = %g, expected "
                              "finite values >= 0 in descending order", b->path, name, g, j, e);
        }
    return FK_OK;
}

static int load_variant(struct fk_basis_file *b, hid_t f, int l, int v)
{
    const struct fk_basis_shape *sh = &b->sh;
    char g[64], name[128];
    snprintf(g, sizeof g, "/layers/L%02d/%s", l, fk_basis_variant_names[v]);
    hsize_t md[2] = {(hsize_t)sh->n_groups, (hsize_t)sh->dim};
    hsize_t vd[3] = {(hsize_t)sh->n_groups, (hsize_t)sh->n_comp, (hsize_t)sh->dim};
    snprintf(name, sizeof name, "%s/mean", g);
    FK_TRY(fk_h5_read_floats(f, b->path, name, H5T_NATIVE_FLOAT, 2, md, fk_basis_mean(b, l, v)));
    for (int c = 0; c < 2; c++) {
        snprintf(name, sizeof name, "%s/%s_basis", g, center_names[c]);
        FK_TRY(fk_h5_read_floats(f, b->path, name, H5T_NATIVE_FLOAT, 3, vd, fk_basis_vec(b, l, v, c)));
        snprintf(name, sizeof name, "%s/%s_eigenvalues", g, center_names[c]);
        FK_TRY(fk_h5_read_floats(f, b->path, name, H5T_NATIVE_DOUBLE, 2, vd, fk_basis_eig(b, l, v, c)));
        snprintf(name, sizeof name, "%s/%s", g, center_names[c]);
        FK_TRY(check_variant(b, name, fk_basis_vec(b, l, v, c), fk_basis_eig(b, l, v, c),
                             fk_basis_mean(b, l, v)));
    }
    return FK_OK;
}

static int load(hid_t f, const char *path, struct fk_basis_file **out)
{
    struct fk_basis_shape sh;
    FK_TRY(read_shape(f, path, &sh));
    FK_TRY(fk_basis_alloc(&sh, path, out));
    struct fk_basis_file *b = *out;
    if (fk_h5_has_attr(f, "model_id"))
        FK_TRY(fk_h5_attr_str(f, path, "model_id", b->model_id, sizeof b->model_id));
    for (int l = 0; l < sh.n_layers; l++)
        for (int v = 0; v < (sh.has_pre_rope ? FK_BV_N : FK_BV_KEYS_PRE); v++)
            FK_TRY(load_variant(b, f, l, v));
    return FK_OK;
}

int fk_basis_load(const char *path, struct fk_basis_file **out)
{
    *out = NULL;
    hid_t f;
    FK_TRY(open_file(path, &f));
    int rc = load(f, path, out);
    H5Fclose(f);
    if (rc < 0)
        fk_basis_free(out);
    return rc;
}

int fk_basis_read_shape(const char *path, struct fk_basis_shape *out)
{
    hid_t f;
    FK_TRY(open_file(path, &f));
    int rc = read_shape(f, path, out);
    H5Fclose(f);
    return rc;
}

int fk_basis_check_trace(const struct fk_basis_shape *sh, const char *basis_path,
                         const struct fk_trace_info *ti, const char *trace_path)
{
    if (sh->n_layers != ti->n_layers || sh->n_kv_heads != ti->n_kv_heads ||
        sh->head_dim != ti->head_dim)
        return fk_err(FK_ECONFIG, "basis %s has %d layers x %d KV heads x head_dim %d but trace "
                      "%s has %d x %d x %d", basis_path, sh->n_layers, sh->n_kv_heads,
                      sh->head_dim, trace_path, ti->n_layers, ti->n_kv_heads, ti->head_dim);
    return FK_OK;
}

const struct fk_basis *fk_basis_get(const struct fk_basis_file *b, int layer, int kind)
{
    return &b->views[(size_t)layer * FK_BV_N + (size_t)kind];
}

/* ---- writer ------------------------------------------------------------------------------ */

static int write_variant(struct fk_basis_file *b, hid_t lg, int l, int v)
{
    const struct fk_basis_shape *sh = &b->sh;
    hid_t g = H5Gcreate2(lg, fk_basis_variant_names[v], H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (g < 0)
        return fk_err(FK_EIO, "cannot create group L%02d/%s", l, fk_basis_variant_names[v]);
    hsize_t md[2] = {(hsize_t)sh->n_groups, (hsize_t)sh->dim};
    hsize_t vd[3] = {(hsize_t)sh->n_groups, (hsize_t)sh->n_comp, (hsize_t)sh->dim};
    int rc = fk_h5_write(g, "mean", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 2, md, 0, 0,
                         fk_basis_mean(b, l, v));
    for (int c = 0; c < 2 && rc == FK_OK; c++) {
        char name[64];
        snprintf(name, sizeof name, "%s_basis", center_names[c]);
        rc = fk_h5_write(g, name, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 3, vd, 0, 0,
                         fk_basis_vec(b, l, v, c));
        snprintf(name, sizeof name, "%s_eigenvalues", center_names[c]);
        if (rc == FK_OK)
            rc = fk_h5_write(g, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, 2, vd, 0, 0,
                             fk_basis_eig(b, l, v, c));
    }
    H5Gclose(g);
    return rc;
}

static int write_attrs(hid_t f, const struct fk_basis_file *b, const char *const *attrs)
{
    const struct fk_basis_shape *sh = &b->sh;
    int rc = fk_h5_put_str(f, "schema", FK_BASIS_SCHEMA);
    if (!rc) rc = fk_h5_put_i64(f, "schema_version", FK_BASIS_VERSION);
    if (!rc) rc = fk_h5_put_i64(f, "n_layers", sh->n_layers);
    if (!rc) rc = fk_h5_put_i64(f, "n_kv_heads", sh->n_kv_heads);
    if (!rc) rc = fk_h5_put_i64(f, "head_dim", sh->head_dim);
    if (!rc) rc = fk_h5_put_i64(f, "group", sh->group);
    if (!rc) rc = fk_h5_put_i64(f, "rank", sh->n_comp);
    if (!rc) rc = fk_h5_put_i64(f, "keys_pre_rope", sh->has_pre_rope);
    if (!rc) rc = fk_h5_put_i64(f, "n_vectors", sh->n_vectors);
    if (!rc) rc = fk_h5_put_str(f, "model_id", b->model_id);
    for (int i = 0; !rc && attrs && attrs[i] && attrs[i + 1]; i += 2)
        rc = fk_h5_put_str(f, attrs[i], attrs[i + 1]);
    return rc;
}

int fk_basis_save(const struct fk_basis_file *cb, const char *path, const char *const *attrs)
{
    struct fk_basis_file *b = (struct fk_basis_file *)cb; /* the slot accessors are not const */
    char tmp[4096];
    hid_t f;
    FK_TRY(fk_h5_create_tmp(path, tmp, sizeof tmp, &f));
    int rc = write_attrs(f, b, attrs);
    hid_t lg = rc ? -1 : H5Gcreate2(f, "layers", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (!rc && lg < 0)
        rc = fk_err(FK_EIO, "cannot create group /layers");
    for (int l = 0; !rc && l < b->sh.n_layers; l++) {
        char g[32];
        snprintf(g, sizeof g, "L%02d", l);
        hid_t gl = H5Gcreate2(lg, g, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        for (int v = 0; !rc && v < (b->sh.has_pre_rope ? FK_BV_N : FK_BV_KEYS_PRE); v++)
            rc = gl < 0 ? fk_err(FK_EIO, "cannot create group /layers/%s", g)
                        : write_variant(b, gl, l, v);
        if (gl >= 0)
            H5Gclose(gl);
    }
    if (lg >= 0)
        H5Gclose(lg);
    rc = fk_h5_commit_tmp(f, tmp, path, rc);
    return rc ? fk_err_context(rc, "%s", path) : FK_OK;
}
