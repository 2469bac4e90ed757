/* SPDX-License-Identifier: MIT
 * HDF5 helpers (see fk_h5.h).
 */
#include "formats/fk_h5.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fk_err.h"

int fk_h5_has_attr(hid_t obj, const char *name) { return H5Aexists(obj, name) > 0; }

int fk_h5_open_ro(const char *path, const char *what, hid_t *f)
{
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return fk_err(FK_EIO, "%s: cannot open %s (no such file or not readable)", path, what);
    fclose(fp);
    if (H5Fis_hdf5(path) <= 0)
        return fk_err(FK_ECORRUPT, "%s: not an HDF5 file (or truncated)", path);
    *f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (*f < 0)
        return fk_err(FK_ECORRUPT, "%s: HDF5 cannot open it (truncated?)", path);
    return FK_OK;
}

int fk_h5_attr_str(hid_t obj, const char *file, const char *name, char *buf, size_t cap)
{
    if (H5Aexists(obj, name) <= 0)
        return fk_err(FK_ECORRUPT, "%s: missing attribute '%s'", file, name);
    hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
    hid_t t = a >= 0 ? H5Aget_type(a) : -1;
    int rc = FK_OK;
    if (t < 0 || H5Tget_class(t) != H5T_STRING) {
        rc = fk_err(FK_ECORRUPT, "%s: attribute '%s' is not a string", file, name);
        goto out;
    }
    if (H5Tis_variable_str(t) > 0) {
        hid_t mt = H5Tcopy(H5T_C_S1);
        H5Tset_size(mt, H5T_VARIABLE);
        H5Tset_cset(mt, H5Tget_cset(t));
        char *s = NULL;
        if (H5Aread(a, mt, &s) < 0) {
            rc = fk_err(FK_ECORRUPT, "%s: cannot read attribute '%s'", file, name);
        } else {
            snprintf(buf, cap, "%s", s ? s : "");
            hid_t sp = H5Aget_space(a);
            H5Dvlen_reclaim(mt, sp, H5P_DEFAULT, &s);
            H5Sclose(sp);
        }
        H5Tclose(mt);
    } else {
        size_t n = H5Tget_size(t);
        char *tmp = calloc(n + 1, 1);
        if (!tmp) {
            rc = fk_err(FK_ENOMEM, "out of memory");
            goto out;
        }
        hid_t mt = H5Tcopy(H5T_C_S1);
        H5Tset_size(mt, n);
        if (H5Aread(a, mt, tmp) < 0)
            rc = fk_err(FK_ECORRUPT, "%s: cannot read attribute '%s'", file, name);
        else
            snprintf(buf, cap, "%s", tmp);
        H5Tclose(mt);
        free(tmp);
    }
out:
    if (t >= 0)
        H5Tclose(t);
    if (a >= 0)
        H5Aclose(a);
    return rc;
}

static int attr_num(hid_t obj, const char *file, const char *name, hid_t memtype, void *out)
{
    if (H5Aexists(obj, name) <= 0)
        return fk_err(FK_ECORRUPT, "%s: missing attribute '%s'", file, name);
    hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
    hid_t t = a >= 0 ? H5Aget_type(a) : -1;
    hid_t sp = a >= 0 ? H5Aget_space(a) : -1;
    int rc = FK_OK;
    H5T_class_t cl = t >= 0 ? H5Tget_class(t) : H5T_NO_CLASS;
    if (cl != H5T_INTEGER && cl != H5T_FLOAT)
        rc = fk_err(FK_ECORRUPT, "%s: attribute '%s' is not a number", file, name);
    else if (H5Sget_simple_extent_npoints(sp) != 1)
        rc = fk_err(FK_ECORRUPT, "%s: attribute '%s' must hold exactly one value", file, name);
    else if (H5Aread(a, memtype, out) < 0)
        rc = fk_err(FK_ECORRUPT, "%s: cannot read attribute '%s'", file, name);
    if (sp >= 0)
        H5Sclose(sp);
    if (t >= 0)
        H5Tclose(t);
    if (a >= 0)
        H5Aclose(a);
    return rc;
}

int fk_h5_attr_i64(hid_t obj, const char *file, const char *name, int64_t *out)
{
    double d;
    FK_TRY(attr_num(obj, file, name, H5T_NATIVE_DOUBLE, &d));
    if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0) || d != floor(d))
        return fk_err(FK_ECORRUPT, "%s: attribute '%s' must be an integer (got %g)", file,
                      name, d);
    *out = (int64_t)d;
    return FK_OK;
}

int fk_h5_attr_f64(hid_t obj, const char *file, const char *name, double *out)
{
    return attr_num(obj, file, name, H5T_NATIVE_DOUBLE, out);
}

static int put_attr(hid_t obj, const char *name, hid_t type, const void *v)
{
    if (H5Aexists(obj, name) > 0)
        H5Adelete(obj, name);
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(obj, name, type, sp, H5P_DEFAULT, H5P_DEFAULT);
    int rc = FK_OK;
    if (a < 0 || H5Awrite(a, type, v) < 0)
        rc = fk_err(FK_EIO, "cannot write attribute '%s'", name);
    if (a >= 0)
        H5Aclose(a);
    H5Sclose(sp);
    return rc;
}

int fk_h5_put_str(hid_t obj, const char *name, const char *value)
{
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, H5T_VARIABLE);
    H5Tset_cset(t, H5T_CSET_UTF8);
    int rc = put_attr(obj, name, t, &value);
    H5Tclose(t);
    return rc;
}

int fk_h5_put_i64(hid_t obj, const char *name, int64_t value)
{
    return put_attr(obj, name, H5T_NATIVE_INT64, &value);
}

int fk_h5_put_f64(hid_t obj, const char *name, double value)
{
    return put_attr(obj, name, H5T_NATIVE_DOUBLE, &value);
}

int fk_h5_shape(hid_t ds, const char *file, const char *dsname, int *rank, hsize_t dims[8])
{
    hid_t sp = H5Dget_space(ds);
    if (sp < 0)
        return fk_err(FK_ECORRUPT, "%s: dataset %s: cannot read its dataspace", file, dsname);
    int r = H5Sget_simple_extent_ndims(sp);
    if (r < 0 || r > 8) {
        H5Sclose(sp);
        return fk_err(FK_ECORRUPT, "%s: dataset %s: unsupported rank %d", file, dsname, r);
    }
    H5Sget_simple_extent_dims(sp, dims, NULL);
    H5Sclose(sp);
    *rank = r;
    return FK_OK;
}

hid_t fk_h5_f16_type(void)
{
    /* IEEE binary16: sign bit 15, exponent bits 10..14 (bias 15), mantissa bits 0..9. */
    hid_t t = H5Tcopy(H5T_IEEE_F32LE);
    H5Tset_fields(t, 15, 10, 5, 0, 10);
    H5Tset_precision(t, 16);
    H5Tset_size(t, 2);
    H5Tset_ebias(t, 15);
    return t;
}

int fk_h5_write(hid_t loc, const char *name, hid_t filetype, hid_t memtype, int rank,
                const hsize_t *dims, int chunk_axis, hsize_t chunk_rows, const void *data)
{
    hid_t sp = H5Screate_simple(rank, dims, NULL);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_obj_track_times(dcpl, 0); /* identical data give identical file bytes */
    int empty = 0;
    for (int i = 0; i < rank; i++)
        empty |= dims[i] == 0;
    if (chunk_rows > 0 && !empty) {
        hsize_t ch[8];
        for (int i = 0; i < rank; i++)
            ch[i] = i < chunk_axis ? 1 : dims[i];
        ch[chunk_axis] = chunk_rows < dims[chunk_axis] ? chunk_rows : dims[chunk_axis];
        H5Pset_chunk(dcpl, rank, ch);
    }
    hid_t ds = H5Dcreate2(loc, name, filetype, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    int rc = FK_OK;
    if (ds < 0 || (!empty && H5Dwrite(ds, memtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0))
        rc = fk_err(FK_EIO, "cannot write dataset %s", name);
    if (ds >= 0)
        H5Dclose(ds);
    H5Pclose(dcpl);
    H5Sclose(sp);
    return rc;
}

int fk_h5_attr_range(hid_t f, const char *path, const char *name, long lo, long hi, long *out)
{
    int64_t v;
    FK_TRY(fk_h5_attr_i64(f, path, name, &v));
    if (v < lo || v > hi)
        return fk_err(FK_ECORRUPT, "%s: attribute %s = %lld, expected %ld .. %ld", path, name,
                      (long long)v, lo, hi);
    *out = (long)v;
    return FK_OK;
}

/* "a, b, c" of n dimensions into buf. */
static void dims_text(char *buf, size_t cap, int n, const hsize_t *d)
{
    buf[0] = 0;
    for (int i = 0; i < n && i < 8; i++)
        snprintf(buf + strlen(buf), cap - strlen(buf), "%s%llu", i ? ", " : "",
                 (unsigned long long)d[i]);
}

int fk_h5_open_floats(hid_t f, const char *path, const char *name, int rank, hsize_t *dims,
                      hid_t *out)
{
    if (H5Lexists(f, name, H5P_DEFAULT) <= 0)
        return fk_err(FK_ECORRUPT, "%s: missing dataset %s", path, name);
    hid_t ds = H5Dopen2(f, name, H5P_DEFAULT);
    if (ds < 0)
        return fk_err(FK_ECORRUPT, "%s: %s is not a readable dataset", path, name);
    int r = 0;
    hsize_t d[8];
    int rc = fk_h5_shape(ds, path, name, &r, d);
    if (rc == FK_OK && r != rank) {
        char got[96];
        dims_text(got, sizeof got, r, d);
        rc = fk_err(FK_ECORRUPT, "%s: dataset %s has shape [%s], expected %d dimension(s)",
                    path, name, got, rank);
    }
    hid_t ft = rc == FK_OK ? H5Dget_type(ds) : -1;
    if (rc == FK_OK && H5Tget_class(ft) != H5T_FLOAT)
        rc = fk_err(FK_ECORRUPT, "%s: dataset %s must hold floats", path, name);
    if (ft >= 0)
        H5Tclose(ft);
    if (rc != FK_OK) {
        H5Dclose(ds);
        return rc;
    }
    memcpy(dims, d, sizeof(hsize_t) * (size_t)rank);
    *out = ds;
    return FK_OK;
}

int fk_h5_read_floats(hid_t f, const char *path, const char *name, hid_t memtype, int rank,
                      const hsize_t *want, void *dst)
{
    hid_t ds;
    hsize_t dims[8];
    FK_TRY(fk_h5_open_floats(f, path, name, rank, dims, &ds));
    int rc = FK_OK;
    if (memcmp(dims, want, sizeof(hsize_t) * (size_t)rank)) {
        char got[96], exp[96];
        dims_text(got, sizeof got, rank, dims);
        dims_text(exp, sizeof exp, rank, want);
        rc = fk_err(FK_ECORRUPT, "%s: dataset %s has shape [%s], expected [%s]", path, name,
                    got, exp);
    }
    if (rc == FK_OK && H5Dread(ds, memtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, dst) < 0)
        rc = fk_err(FK_ECORRUPT, "%s: cannot read dataset %s (truncated?)", path, name);
    H5Dclose(ds);
    return rc;
}

int fk_h5_schema(hid_t f, const char *path, const char *schema, int version)
{
    char buf[64];
    FK_TRY(fk_h5_attr_str(f, path, "schema", buf, sizeof buf));
    if (strcmp(buf, schema))
        return fk_err(FK_ECORRUPT, "%s: attribute schema = \"%s\", expected \"%s\"", path, buf,
                      schema);
    long v = 0;
    FK_TRY(fk_h5_attr_range(f, path, "schema_version", 0, 1L << 30, &v));
    if (v != version)
        return fk_err(FK_ECORRUPT, "%s: schema_version = %ld, this reader reads version %d",
                      path, v, version);
    return FK_OK;
}

int fk_h5_create_tmp(const char *path, char *tmp, size_t cap, hid_t *f)
{
    snprintf(tmp, cap, "%s.tmp", path);
    *f = H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (*f < 0)
        return fk_err(FK_EIO, "%s: cannot create (directory missing or not writable?)", path);
    return FK_OK;
}

int fk_h5_commit_tmp(hid_t f, const char *tmp, const char *path, int rc)
{
    if (H5Fclose(f) < 0 && !rc)
        rc = fk_err(FK_EIO, "%s: closing failed (disk full?)", tmp);
    if (!rc && rename(tmp, path) != 0)
        rc = fk_err(FK_EIO, "%s: cannot rename %s into place", path, tmp);
    if (rc)
        remove(tmp);
    return rc;
}
