/* SPDX-License-Identifier: MIT
 * The read side of the results store (see fk_results.h): the tables, the per-cell HDF5
 * series, resolved.txt, and the cell-level operations merge needs (list, compare, copy).
 */
#include "store/fk_results.h"

#include <dirent.h>
#include <errno.h>
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fk_err.h"
#include "common/fk_str.h"
#include "formats/fk_h5.h"
#include "store/fk_claim.h"

_Static_assert(sizeof(hid_t) == sizeof(int64_t), "hid_t is stored as int64_t");

/* ---- tables ----------------------------------------------------------------------------- */

static int load_table(const char *dir, const char *name, struct fk_csv *t)
{
    char *p;
    FK_TRY(fk_store_path(&p, dir, "%s", name));
    int rc = fk_csv_load(p, t);
    free(p);
    return rc;
}

static int find_columns(struct fk_store *st)
{
    const struct fk_csv *t = &st->cells, *s = &st->summary;
    st->c_id = fk_csv_col(t, "cell_id");
    st->c_codec = fk_csv_col(t, "codec");
    st->c_dataset = fk_csv_col(t, "dataset");
    st->c_status = fk_csv_col(t, "status");
    if (st->c_id < 0 || st->c_codec < 0 || st->c_dataset < 0 || st->c_status < 0)
        return fk_err(FK_ECORRUPT, "%s/cells.csv: expected columns cell_id, codec, dataset, "
                      "status", st->dir);
    st->c_first_opt = st->c_status + 1;
    st->c_end_opt = fk_csv_col(t, "n_traces");
    if (st->c_end_opt < 0)
        st->c_end_opt = st->c_first_opt;
    st->s_id = fk_csv_col(s, "cell_id");
    st->s_trace = fk_csv_col(s, "trace");
    st->s_kind = fk_csv_col(s, "kind");
    if (st->s_id < 0 || st->s_trace < 0 || st->s_kind < 0)
        return fk_err(FK_ECORRUPT, "%s/summary.csv: expected columns cell_id, trace, kind",
                      st->dir);
    return FK_OK;
}

/* Every row of cells.csv that says ok is checked against its cell's files: a cell whose
 * files are missing, cut or changed is marked "damaged" (readers skip every row that is not
 * ok) and listed in st->damaged with the reason. */
static int mark_damaged(struct fk_store *st)
{
    for (int i = 0; i < st->cells.n_rows; i++) {
        char **status = &st->cells.rows[i][st->c_status], why[512];
        const char *id = st->cells.rows[i][st->c_id];
        if (strcmp(*status, "ok"))
            continue;
        enum fk_cell_state cs = fk_results_state(st->dir, id, why, sizeof why);
        if (cs == FK_CELL_OK)
            continue;
        if (cs != FK_CELL_DAMAGED)
            snprintf(why, sizeof why, "cells.csv says ok but cells/%s.meta %s", id,
                     cs == FK_CELL_NONE ? "is missing" : "records a failure");
        char *msg = NULL, *bad = strdup("damaged");
        char **grown = realloc(st->damaged, sizeof(char *) * (size_t)(st->n_damaged + 1));
        if (grown)
            st->damaged = grown;
        size_t len = strlen(id) + strlen(why) + 3;
        if (grown && bad && (msg = malloc(len)))
            snprintf(msg, len, "%s: %s", id, why);
        if (!grown || !bad || !msg) {
            free(bad);
            free(msg);
            return fk_err(FK_ENOMEM, "out of memory");
        }
        st->damaged[st->n_damaged++] = msg;
        free(*status);
        *status = bad;
    }
    return FK_OK;
}

int fk_store_open(const char *dir, struct fk_store **out)
{
    *out = NULL;
    struct fk_store *st = calloc(1, sizeof *st);
    if (!st || !(st->dir = strdup(dir))) {
        free(st);
        return fk_err(FK_ENOMEM, "out of memory");
    }
    int rc = load_table(dir, "cells.csv", &st->cells);
    if (rc == FK_OK)
        rc = load_table(dir, "summary.csv", &st->summary);
    if (rc == FK_OK)
        rc = find_columns(st);
    if (rc == FK_OK)
        rc = mark_damaged(st);
    if (rc < 0) {
        fk_store_close(&st);
        return rc;
    }
    *out = st;
    return FK_OK;
}

void fk_store_close(struct fk_store **st)
{
    if (!st || !*st)
        return;
    fk_csv_free(&(*st)->cells);
    fk_csv_free(&(*st)->summary);
    for (int i = 0; i < (*st)->n_damaged; i++)
        free((*st)->damaged[i]);
    free((*st)->damaged);
    free((*st)->dir);
    free(*st);
    *st = NULL;
}

const char *fk_store_cost_baseline(const struct fk_store *st)
{
    int cm = fk_csv_col(&st->cells, "cost_mac_rel"), cc = fk_csv_col(&st->cells, "cpu_time_rel");
    if (cm < 0 || cc < 0)
        return NULL;
    for (int i = 0; i < st->cells.n_rows; i++)
        if (!strcmp(st->cells.rows[i][st->c_status], "ok") &&
            fk_csv_num(&st->cells, i, cm) == 1 && fk_csv_num(&st->cells, i, cc) == 1)
            return st->cells.rows[i][st->c_codec];
    return NULL;
}

/* ---- per-cell HDF5 series ------------------------------------------------------------------ */

static int h5_exists(hid_t loc, const char *name)
{
    return H5Lexists(loc, name, H5P_DEFAULT) > 0;
}

int fk_store_series_open(const char *dir, const char *id, struct fk_cell_series *h)
{
    memset(h, 0, sizeof *h);
    h->file = -1;
    FK_TRY(fk_store_path(&h->path, dir, "cells/%s.h5", id));
    h->file = H5Fopen(h->path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (h->file < 0)
        return fk_err(FK_EIO, "%s: cannot open", h->path);
    char g[64];
    for (;;) {
        snprintf(g, sizeof g, "T%02d", h->n_traces);
        if (!h5_exists(h->file, g))
            break;
        h->n_traces++;
    }
    for (;;) {
        snprintf(g, sizeof g, "T00/L%02d", h->n_layers);
        if (h->n_traces == 0 || !h5_exists(h->file, g))
            break;
        h->n_layers++;
    }
    return FK_OK;
}

void fk_store_series_close(struct fk_cell_series *h)
{
    if (h->file >= 0)
        H5Fclose(h->file);
    h->file = -1;
    free(h->path);
    h->path = NULL;
}

int fk_store_series_read(struct fk_cell_series *h, int t, int l, int k, const char *name,
                         double **out, int *n)
{
    char p[128];
    snprintf(p, sizeof p, "T%02d/L%02d/%s/%s", t, l, k ? "V" : "K", name);
    *out = NULL;
    *n = 0;
    if (!h5_exists(h->file, p))
        return FK_OK;
    char g[64];
    snprintf(g, sizeof g, "T%02d/L%02d/%s", t, l, k ? "V" : "K");
    if (!h5_exists(h->file, g))
        return FK_OK;
    hid_t ds = H5Dopen2(h->file, p, H5P_DEFAULT);
    if (ds < 0)
        return fk_err(FK_ECORRUPT, "%s: dataset %s: cannot open", h->path, p);
    int rank;
    hsize_t dims[8];
    int rc = fk_h5_shape(ds, h->path, p, &rank, dims);
    if (rc == FK_OK && rank != 1)
        rc = fk_err(FK_ECORRUPT, "%s: dataset %s: expected 1 dimension, found %d", h->path, p,
                    rank);
    double *v = NULL;
    if (rc == FK_OK) {
        v = malloc(sizeof(double) * (size_t)(dims[0] ? dims[0] : 1));
        if (!v)
            rc = fk_err(FK_ENOMEM, "out of memory");
    }
    if (rc == FK_OK && dims[0] &&
        H5Dread(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) < 0)
        rc = fk_err(FK_ECORRUPT, "%s: dataset %s: read failed", h->path, p);
    H5Dclose(ds);
    if (rc < 0) {
        free(v);
        return rc;
    }
    *out = v;
    *n = (int)dims[0];
    return FK_OK;
}

/* ---- resolved.txt and cell lists ----------------------------------------------------------- */

int fk_store_resolved_read(const char *dir, char **text, size_t *len)
{
    char *p;
    FK_TRY(fk_store_path(&p, dir, "resolved.txt"));
    *text = fk_slurp(p, len);
    int rc = *text ? FK_OK : fk_err(FK_EIO, "%s: cannot read", p);
    free(p);
    return rc;
}

int fk_store_resolved_write(const char *dir, const char *text, size_t len)
{
    char *p;
    FK_TRY(fk_store_path(&p, dir, "resolved.txt"));
    int rc = fk_write_atomic(p, text, len);
    free(p);
    return rc;
}

void fk_store_ids_free(char ***ids, int n)
{
    for (int i = 0; *ids && i < n; i++)
        free((*ids)[i]);
    free(*ids);
    *ids = NULL;
}

static int ids_push(char ***ids, int *n, int *cap, const char *id)
{
    if (*n == *cap) {
        int nc = *cap ? *cap * 2 : 64;
        char **ni = realloc(*ids, sizeof(char *) * (size_t)nc);
        if (!ni)
            return fk_err(FK_ENOMEM, "out of memory");
        *ids = ni;
        *cap = nc;
    }
    if (!((*ids)[*n] = strdup(id)))
        return fk_err(FK_ENOMEM, "out of memory");
    (*n)++;
    return FK_OK;
}

int fk_store_sweep_ids(const char *resolved, char ***ids, int *n)
{
    *ids = NULL;
    *n = 0;
    int cap = 0, rc = FK_OK;
    /* the lines after the header that start with a 16-digit id */
    for (const char *l = strchr(resolved, '\n'); rc == FK_OK && l && l[1];
         l = strchr(l + 1, '\n')) {
        char id[FK_ID_LEN + 2];
        if (sscanf(l + 1, "%17s", id) != 1 || strlen(id) != FK_ID_LEN)
            continue;
        rc = ids_push(ids, n, &cap, id);
    }
    if (rc < 0)
        fk_store_ids_free(ids, *n);
    return rc;
}

int fk_store_finished_ids(const char *dir, char ***ids, int *n)
{
    *ids = NULL;
    *n = 0;
    char *cd;
    FK_TRY(fk_store_path(&cd, dir, "cells"));
    DIR *d = opendir(cd);
    if (!d) {
        int rc = fk_err(FK_EIO, "%s: cannot open (%s)", cd, strerror(errno));
        free(cd);
        return rc;
    }
    free(cd);
    int cap = 0, rc = FK_OK;
    struct dirent *e;
    while (rc == FK_OK && (e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len != FK_ID_LEN + 5 || strcmp(e->d_name + FK_ID_LEN, ".meta"))
            continue;
        char id[FK_ID_LEN + 1];
        memcpy(id, e->d_name, FK_ID_LEN);
        id[FK_ID_LEN] = 0;
        rc = ids_push(ids, n, &cap, id);
    }
    closedir(d);
    if (rc < 0)
        fk_store_ids_free(ids, *n);
    return rc;
}

/* ---- comparing and copying cells ------------------------------------------------------------- */

/* Keys whose values change from run to run: timing, and the checksums of the cell's files
 * (its summary rows hold cpu_s; the rows themselves are compared without it). */
static int is_timing_key(const char *k, size_t n)
{
    static const char *const keys[] = {"wall_s", "cpu_us_per_vec", NULL};
    if (n >= 2 && k[0] == 't' && k[1] == '_')
        return 1;
    if (n >= 5 && !strncmp(k, "file.", 5))
        return 1;
    for (int i = 0; keys[i]; i++)
        if (strlen(keys[i]) == n && !strncmp(k, keys[i], n))
            return 1;
    return 0;
}

/* The .meta text without timing lines (lines kept in order). */
static char *meta_core(const char *text)
{
    char *out = malloc(strlen(text) + 1);
    if (!out)
        return NULL;
    size_t n = 0;
    for (const char *l = text; *l;) {
        const char *e = strchr(l, '\n');
        size_t len = e ? (size_t)(e - l) + 1 : strlen(l);
        const char *tab = memchr(l, '\t', len);
        if (!tab || !is_timing_key(l, (size_t)(tab - l))) {
            memcpy(out + n, l, len);
            n += len;
        }
        l += len;
    }
    out[n] = 0;
    return out;
}

/* Summary rows without field `skip` (0-based; -1 keeps all). */
static char *summary_core(const char *text, int skip)
{
    char *out = malloc(strlen(text) + 1);
    if (!out)
        return NULL;
    size_t n = 0;
    int field = 0;
    for (const char *p = text; *p; p++) {
        if (*p == '\n') {
            field = 0;
            out[n++] = '\n';
            continue;
        }
        if (*p == ',') {
            field++;
            if (field != skip)
                out[n++] = ',';
            continue;
        }
        if (field != skip)
            out[n++] = *p;
    }
    out[n] = 0;
    return out;
}

/* Index of the cpu_s column in DIR/summary.csv's header, or -1. */
static int cpu_field(const char *dir)
{
    char *p;
    if (fk_store_path(&p, dir, "summary.csv") < 0)
        return -1;
    FILE *f = fopen(p, "r");
    free(p);
    if (!f)
        return -1;
    char line[4096];
    int idx = -1;
    if (fgets(line, sizeof line, f)) {
        int k = 0;
        for (char *t = strtok(line, ",\n"); t; t = strtok(NULL, ",\n"), k++)
            if (!strcmp(t, "cpu_s"))
                idx = k;
    }
    fclose(f);
    return idx;
}

/* 1 when cells/<id>.<ext> of both directories read the same through core(text, arg). */
static int same_file(const char *dir_a, const char *dir_b, const char *id, const char *ext,
                     int arg_a, int arg_b, int *same)
{
    char *pa, *pb = NULL;
    FK_TRY(fk_store_path(&pa, dir_a, "cells/%s.%s", id, ext));
    int rc = fk_store_path(&pb, dir_b, "cells/%s.%s", id, ext);
    char *ta = rc == FK_OK ? fk_slurp(pa, NULL) : NULL, *tb = rc == FK_OK ? fk_slurp(pb, NULL) : NULL;
    int meta = !strcmp(ext, "meta");
    char *ca = ta ? (meta ? meta_core(ta) : summary_core(ta, arg_a)) : NULL;
    char *cb = tb ? (meta ? meta_core(tb) : summary_core(tb, arg_b)) : NULL;
    *same = ca && cb && !strcmp(ca, cb);
    free(pa);
    free(pb);
    free(ta);
    free(tb);
    free(ca);
    free(cb);
    return rc;
}

int fk_store_cell_same(const char *dir_a, const char *dir_b, const char *id, int *same)
{
    FK_TRY(same_file(dir_a, dir_b, id, "meta", 0, 0, same));
    if (!*same)
        return FK_OK;
    return same_file(dir_a, dir_b, id, "summary.csv", cpu_field(dir_a), cpu_field(dir_b), same);
}

static int copy_file(const char *from, const char *to)
{
    size_t n = 0;
    char *t = fk_slurp(from, &n);
    if (!t)
        return fk_err(FK_EIO, "%s: cannot read (%s)", from, strerror(errno));
    int rc = fk_write_atomic(to, t, n);
    free(t);
    return rc;
}

int fk_store_cell_copy(const char *from_dir, const char *to_dir, const char *id)
{
    static const char *const ext[] = {"h5", "summary.csv", "meta", NULL};
    int rc = FK_OK;
    for (int i = 0; ext[i] && rc == FK_OK; i++) {
        char *a, *b = NULL;
        FK_TRY(fk_store_path(&a, from_dir, "cells/%s.%s", id, ext[i]));
        rc = fk_store_path(&b, to_dir, "cells/%s.%s", id, ext[i]);
        if (rc == FK_OK && access(a, F_OK) != 0) {
            if (strcmp(ext[i], "h5"))    /* failed cells have no .h5 */
                rc = fk_err(FK_ECORRUPT, "%s: missing (the cell's .meta exists)", a);
        } else if (rc == FK_OK) {
            rc = copy_file(a, b);
        }
        free(a);
        free(b);
    }
    return rc;
}

/* ---- pruning the cells of earlier sweeps ---------------------------------------------------- */

static int in_list(char **ids, int n, const char *id)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(ids[i], id))
            return 1;
    return 0;
}

/* Removes cell id's files, the .meta first (the cell stops being finished at once). */
static void remove_cell(const char *dir, const char *id)
{
    static const char *const ext[] = {"meta", "h5", "summary.csv", NULL};
    for (int i = 0; ext[i]; i++) {
        char *p;
        if (fk_store_path(&p, dir, "cells/%s.%s", id, ext[i]) == FK_OK) {
            unlink(p);
            free(p);
        }
    }
}

static int claimed(const char *dir, const char *id)
{
    char *p;
    if (fk_store_path(&p, dir, "cells/%s.claim", id) < 0)
        return 0;
    int c = access(p, F_OK) == 0;
    free(p);
    return c;
}

int fk_store_prune(const char *dir, int dry, char ***removed, int *n)
{
    *removed = NULL;
    *n = 0;
    char *text, **cur = NULL, **all = NULL;
    size_t len;
    int n_cur = 0, n_all = 0, cap = 0, fd = -1;
    FK_TRY(fk_store_resolved_read(dir, &text, &len));
    int rc = fk_store_sweep_ids(text, &cur, &n_cur);
    free(text);
    if (rc == FK_OK)
        rc = fk_store_lock(dir, &fd);
    if (rc == FK_OK)
        rc = fk_store_finished_ids(dir, &all, &n_all);
    for (int i = 0; rc == FK_OK && i < n_all; i++) {
        if (in_list(cur, n_cur, all[i]) || claimed(dir, all[i]))
            continue;
        rc = ids_push(removed, n, &cap, all[i]);
        if (rc == FK_OK && !dry)
            remove_cell(dir, all[i]);
    }
    fk_store_unlock(fd);
    fk_store_ids_free(&cur, n_cur);
    fk_store_ids_free(&all, n_all);
    if (rc < 0)
        fk_store_ids_free(removed, *n);
    return rc;
}
