/* SPDX-License-Identifier: MIT
 * Small HDF5 helpers shared by the trace, dictionary and results files: attributes of any
 * object (strings fixed or variable length, integers, doubles), dataset shapes, and the
 * 16-bit float file type. Every failure sets an fk_err message naming file and object.
 */
#ifndef FK_H5_H
#define FK_H5_H

#include <hdf5.h>
#include <stddef.h>
#include <stdint.h>

/* Reads a string attribute into buf (fixed or variable length). FK_ECORRUPT if absent or
 * not a string. */
int fk_h5_attr_str(hid_t obj, const char *file, const char *name, char *buf, size_t cap);
/* Reads a numeric attribute (any integer or float type, scalar or 1 element). */
int fk_h5_attr_i64(hid_t obj, const char *file, const char *name, int64_t *out);
int fk_h5_attr_f64(hid_t obj, const char *file, const char *name, double *out);
int fk_h5_has_attr(hid_t obj, const char *name);

/* Opens an HDF5 file read-only, naming what is wrong when it cannot: missing or unreadable
 * ("PATH: cannot open WHAT (no such file or not readable)"), not HDF5, damaged. */
int fk_h5_open_ro(const char *path, const char *what, hid_t *f);

int fk_h5_put_str(hid_t obj, const char *name, const char *value);
int fk_h5_put_i64(hid_t obj, const char *name, int64_t value);
int fk_h5_put_f64(hid_t obj, const char *name, double value);

/* Number of dimensions and extents of a dataset (rank <= 8). */
int fk_h5_shape(hid_t ds, const char *file, const char *dsname, int *rank, hsize_t dims[8]);

/* The root attributes schema = `schema` and schema_version = `version` (FK_ECORRUPT naming
 * the file, what it holds and what this reader reads otherwise). */
int fk_h5_schema(hid_t f, const char *path, const char *schema, int version);
/* An integer attribute in [lo, hi] (FK_ECORRUPT naming file and attribute otherwise). */
int fk_h5_attr_range(hid_t f, const char *path, const char *name, long lo, long hi, long *out);
/* Opens dataset `name` of file path: present, of floats, of rank `rank`; its extents into
 * dims; the caller closes *out. */
int fk_h5_open_floats(hid_t f, const char *path, const char *name, int rank, hsize_t *dims,
                      hid_t *out);
/* Reads float dataset `name` of exactly the shape want (rank dims) as memtype into dst. */
int fk_h5_read_floats(hid_t f, const char *path, const char *name, hid_t memtype, int rank,
                      const hsize_t *want, void *dst);

/* The atomic write of an HDF5 file: fk_h5_create_tmp creates PATH.tmp (its name into tmp,
 * cap bytes) for writing; fk_h5_commit_tmp closes it and, when rc is FK_OK, renames it to
 * path, else (or when closing or renaming fails) removes it: a failed write leaves no
 * file. Returns rc, or the closing or renaming failure, with path in the message. */
int fk_h5_create_tmp(const char *path, char *tmp, size_t cap, hid_t *f);
int fk_h5_commit_tmp(hid_t f, const char *tmp, const char *path, int rc);

/* The IEEE binary16 file type (caller closes with H5Tclose). */
hid_t fk_h5_f16_type(void);

/* Writes a whole dataset (contiguous or chunked along axis 1 when chunk_rows > 0). */
int fk_h5_write(hid_t loc, const char *name, hid_t filetype, hid_t memtype, int rank,
                const hsize_t *dims, int chunk_axis, hsize_t chunk_rows, const void *data);

#endif
