/* SPDX-License-Identifier: MIT
 * Dictionary file v1 reader and writer, Gram construction (see fk_dict.h).
 */
#include "formats/fk_dict.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fk_err.h"
#include "formats/fk_h5.h"
#include "kernels/fk_sparse.h"

static const char *const kind_ds[2] = {"keys", "values"};

void fk_dict_free(struct fk_dict **dp)
{
    struct fk_dict *d = dp ? *dp : NULL;
    if (!d)
        return;
    free(d->path);
    free(d->atoms);
    free(d->dead);
    free(d);
    *dp = NULL;
}

static int read_int(hid_t f, const char *path, const char *name, int *out)
{
    int64_t v;
    FK_TRY(fk_h5_attr_i64(f, path, name, &v));
    if (v < 1 || v > (1 << 24))
        return fk_err(FK_ECORRUPT, "%s: attribute %s = %lld is out of range [1, 16777216]",
                      path, name, (long long)v);
    *out = (int)v;
    return FK_OK;
}

static int load(struct fk_dict *d, hid_t f)
{
    const char *path = d->path;
    char buf[64];
    FK_TRY(fk_h5_attr_str(f, path, "schema", buf, sizeof buf));
    if (strcmp(buf, FK_DICT_SCHEMA))
        return fk_err(FK_ECORRUPT, "%s: attribute schema = \"%s\", expected \"%s\"", path, buf,
                      FK_DICT_SCHEMA);
    int version = 0;
    FK_TRY(read_int(f, path, "schema_version", &version));
    if (version != FK_DICT_VERSION)
        return fk_err(FK_ECORRUPT, "%s: schema_version = %d, this reader reads version %d",
                      path, version, FK_DICT_VERSION);
    FK_TRY(read_int(f, path, "head_dim", &d->head_dim));
    FK_TRY(read_int(f, path, "num_layers", &d->n_layers));
    FK_TRY(read_int(f, path, "atoms", &d->n_atoms));
    if ((double)d->n_layers * 2 * d->n_atoms * d->head_dim > 2147483648.0)
        return fk_err(FK_ECORRUPT, "%s: %d layers x 2 x %d atoms x head_dim %d exceeds the 2^31 "
                      "values this loader supports", path, d->n_layers, d->n_atoms, d->head_dim);
    size_t per = (size_t)d->n_atoms * (size_t)d->head_dim;
    size_t total = per * 2 * (size_t)d->n_layers;
    d->atoms = malloc(sizeof(float) * total);
    d->dead = calloc(total / (size_t)d->head_dim, 1);
    if (!d->atoms || !d->dead)
        return fk_err(FK_ENOMEM, "%s: out of memory for %zu atoms", path, total / d->head_dim);
    for (int l = 0; l < d->n_layers; l++) {
        for (int k = 0; k < 2; k++) {
            char name[64];
            snprintf(name, sizeof name, "/layers/L%02d/%s", l, kind_ds[k]);
            if (H5Lexists(f, "/layers", H5P_DEFAULT) <= 0 ||
                H5Lexists(f, name, H5P_DEFAULT) <= 0) {
                char g[32];
                snprintf(g, sizeof g, "/layers/L%02d", l);
                if (H5Lexists(f, "/layers", H5P_DEFAULT) <= 0 || H5Lexists(f, g, H5P_DEFAULT) <= 0)
                    return fk_err(FK_ECORRUPT, "%s: missing group %s (num_layers = %d)", path,
                                  g, d->n_layers);
                return fk_err(FK_ECORRUPT, "%s: missing dataset %s", path, name);
            }
            hid_t ds = H5Dopen2(f, name, H5P_DEFAULT);
            int rank;
            hsize_t dims[8];
            int rc = ds < 0 ? fk_err(FK_ECORRUPT, "%s: cannot open %s", path, name)
                            : fk_h5_shape(ds, path, name, &rank, dims);
            if (rc == FK_OK && (rank != 2 || dims[0] != (hsize_t)d->n_atoms ||
                                dims[1] != (hsize_t)d->head_dim))
                rc = fk_err(FK_ECORRUPT,
                            "%s: dataset %s has shape [%llu%s%llu], expected [%d, %d] (atoms, "
                            "head_dim)",
                            path, name, (unsigned long long)dims[0], rank > 1 ? ", " : "",
                            rank > 1 ? (unsigned long long)dims[1] : 0ULL, d->n_atoms,
                            d->head_dim);
            float *dst = d->atoms + per * (size_t)(2 * l + k);
            if (rc == FK_OK &&
                H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, dst) < 0)
                rc = fk_err(FK_ECORRUPT, "%s: cannot read %s (truncated?)", path, name);
            if (ds >= 0)
                H5Dclose(ds);
            FK_TRY(rc);
            uint8_t *dead = d->dead + (size_t)d->n_atoms * (size_t)(2 * l + k);
            for (int j = 0; j < d->n_atoms; j++) {
                float *a = dst + (size_t)j * d->head_dim;
                double nn = 0;
                for (int c = 0; c < d->head_dim; c++) {
                    if (!isfinite(a[c]))
                        return fk_err(FK_ECORRUPT, "%s: %s: non-finite value in atom %d", path,
                                      name, j);
                    nn += (double)a[c] * a[c];
                }
                nn = sqrt(nn);
                if (nn < 1e-12) {
                    dead[j] = 1;
                    d->n_dead++;
                    memset(a, 0, sizeof(float) * (size_t)d->head_dim);
                    continue;
                }
                if (fabs(nn - 1) > d->max_norm_dev)
                    d->max_norm_dev = fabs(nn - 1);
                for (int c = 0; c < d->head_dim; c++)
                    a[c] = (float)(a[c] / nn);
            }
        }
    }
    return FK_OK;
}

/* Opens a dictionary file read-only, naming what is wrong with it when it cannot. */
static int open_file(const char *path, hid_t *f)
{
    return fk_h5_open_ro(path, "dictionary", f);
}

int fk_dict_load(const char *path, struct fk_dict **out)
{
    *out = NULL;
    hid_t f;
    FK_TRY(open_file(path, &f));
    struct fk_dict *d = calloc(1, sizeof *d);
    int rc = d && (d->path = strdup(path)) ? load(d, f) : fk_err(FK_ENOMEM, "out of memory");
    H5Fclose(f);
    if (rc < 0) {
        fk_dict_free(&d);
        return rc;
    }
    *out = d;
    return FK_OK;
}

int fk_dict_atoms(const char *path, int *n_atoms)
{
    *n_atoms = 0;
    hid_t f;
    FK_TRY(open_file(path, &f));
    int rc = read_int(f, path, "atoms", n_atoms);
    H5Fclose(f);
    return rc;
}

int fk_dict_check_trace(const struct fk_dict *d, const struct fk_trace_info *ti,
                        const char *trace_path)
{
    if (d->head_dim != ti->head_dim)
        return fk_err(FK_ECONFIG, "dictionary %s has head_dim %d but trace %s has head_dim %d",
                      d->path, d->head_dim, trace_path, ti->head_dim);
    if (d->n_layers != ti->n_layers)
        return fk_err(FK_ECONFIG, "dictionary %s has %d layers but trace %s has %d", d->path,
                      d->n_layers, trace_path, ti->n_layers);
    return FK_OK;
}

void fk_dict_base(const struct fk_dict *d, int layer, int kind, struct fk_base_dict *out)
{
    size_t slot = (size_t)(2 * layer + kind);
    out->n_atoms = d->n_atoms;
    out->m = d->head_dim;
    out->atoms = d->atoms + slot * (size_t)d->n_atoms * (size_t)d->head_dim;
    out->dead = d->dead + slot * (size_t)d->n_atoms;
    out->gram = NULL;
}

int fk_dict_save(const char *path, int n_layers, int head_dim, int n_atoms, const float *atoms,
                 const char *const *attrs)
{
    char tmp[4096];
    hid_t f;
    FK_TRY(fk_h5_create_tmp(path, tmp, sizeof tmp, &f));
    int rc = fk_h5_put_str(f, "schema", FK_DICT_SCHEMA);
    if (!rc) rc = fk_h5_put_i64(f, "schema_version", FK_DICT_VERSION);
    if (!rc) rc = fk_h5_put_i64(f, "head_dim", head_dim);
    if (!rc) rc = fk_h5_put_i64(f, "num_layers", n_layers);
    if (!rc) rc = fk_h5_put_i64(f, "atoms", n_atoms);
    for (int i = 0; !rc && attrs && attrs[i] && attrs[i + 1]; i += 2)
        rc = fk_h5_put_str(f, attrs[i], attrs[i + 1]);
    hid_t lg = rc ? -1 : H5Gcreate2(f, "layers", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    for (int l = 0; !rc && l < n_layers; l++) {
        char g[32];
        snprintf(g, sizeof g, "L%02d", l);
        hid_t gl = H5Gcreate2(lg, g, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        hsize_t dims[2] = {(hsize_t)n_atoms, (hsize_t)head_dim};
        for (int k = 0; !rc && k < 2; k++)
            rc = fk_h5_write(gl, kind_ds[k], H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 2, dims, 0, 0,
                             atoms + (size_t)(2 * l + k) * n_atoms * head_dim);
        H5Gclose(gl);
    }
    if (lg >= 0)
        H5Gclose(lg);
    return fk_h5_commit_tmp(f, tmp, path, rc);
}

int fk_gram_build(const float *atoms, int n, int m, float **gram)
{
    float *g = fk_gram_alloc((size_t)n * (size_t)n);
    if (!g)
        return fk_err(FK_ENOMEM, "out of memory for a %d x %d Gram matrix", n, n);
    int rc = fk_gram_compute(atoms, n, m, g); /* one BLAS thread: bits independent of threads */
    if (rc < 0) {
        free(g);
        return rc;
    }
    *gram = g;
    return FK_OK;
}

long fk_gram_duplicates(const float *g, int n, const uint8_t *dead)
{
    long c = 0;
    for (int i = 0; i < n; i++) {
        if (dead && dead[i])
            continue;
        for (int j = i + 1; j < n; j++)
            if (!(dead && dead[j]) && fabsf(g[(size_t)i * n + j]) > 1 - 1e-6f)
                c++;
    }
    return c;
}
