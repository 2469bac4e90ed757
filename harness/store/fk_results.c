/* SPDX-License-Identifier: MIT
 * The results store (see fk_results.h). Aggregation rules: spec algorithms.md section 10.
 */
#include "store/fk_results.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fk_err.h"
#include "common/fk_sha256.h"
#include "common/fk_str.h"
#include "core/fk_registry.h"
#include "formats/fk_h5.h"
#include "store/fk_claim.h"
#include "store/fk_metrics.h"
#include "store/fk_results_loop.h"

/* ---- text helpers ------------------------------------------------------------------ */

static void sb_num(struct fk_sb *b, double v)
{
    if (isnan(v))
        fk_sb_printf(b, "nan");
    else
        fk_sb_printf(b, "%.9g", v);
}

/* ---- files ----------------------------------------------------------------------------- */

int fk_store_path(char **out, const char *dir, const char *fmt, ...)
{
    *out = NULL;
    va_list ap;
    va_start(ap, fmt);
    char probe[1];
    int k = vsnprintf(probe, sizeof probe, fmt, ap);
    va_end(ap);
    if (k < 0)
        return fk_err(FK_EINVAL, "%s: cannot format a file name", dir);
    size_t n = strlen(dir) + 1 + (size_t)k;
    if (n >= PATH_MAX)
        return fk_err(FK_EINVAL, "path too long (%zu bytes with the file name, the limit is "
                      "%d) in %s", n, PATH_MAX - 1, dir);
    char *p = malloc(n + 1);
    if (!p)
        return fk_err(FK_ENOMEM, "out of memory");
    size_t d = strlen(dir);
    memcpy(p, dir, d);
    p[d] = '/';
    va_start(ap, fmt);
    vsnprintf(p + d + 1, n - d, fmt, ap);
    va_end(ap);
    *out = p;
    return FK_OK;
}

int fk_write_atomic(const char *path, const char *text, size_t len)
{
    /* the temporary name carries host and pid: runs sharing a directory never share one */
    char *tmp = malloc(PATH_MAX);
    if (!tmp)
        return fk_err(FK_ENOMEM, "out of memory");
    if (fk_store_tmp_name(path, tmp, PATH_MAX) < 0) {
        free(tmp);
        return FK_EINVAL;
    }
    int rc = FK_OK;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        rc = fk_err(FK_EIO, "%s: cannot create (%s)", tmp, strerror(errno));
    size_t off = 0;
    while (rc == FK_OK && off < len) {
        ssize_t k = write(fd, text + off, len - off);
        if (k < 0) {
            int e = errno;
            close(fd);
            fd = -1;
            unlink(tmp);
            rc = fk_err(FK_EIO, "%s: write failed (%s)", tmp, strerror(e));
        } else {
            off += (size_t)k;
        }
    }
    if (rc == FK_OK && (fsync(fd) != 0 || close(fd) != 0)) {
        unlink(tmp);
        rc = fk_err(FK_EIO, "%s: write failed (%s)", tmp, strerror(errno));
    } else if (rc == FK_OK && rename(tmp, path) != 0) {
        unlink(tmp);
        rc = fk_err(FK_EIO, "%s: cannot rename into place (%s)", path, strerror(errno));
    }
    free(tmp);
    return rc;
}

int fk_store_mkdir_p(const char *dir)
{
    if (strlen(dir) >= PATH_MAX)
        return fk_err(FK_EINVAL, "path too long (limit %d bytes): %s", PATH_MAX - 1, dir);
    char *buf = strdup(dir);
    if (!buf)
        return fk_err(FK_ENOMEM, "out of memory");
    int rc = FK_OK;
    for (char *p = buf + 1; *p && rc == FK_OK; p++) {
        if (*p != '/')
            continue;
        *p = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            rc = fk_err(FK_EIO, "%s: cannot create directory (%s)", buf, strerror(errno));
        *p = '/';
    }
    if (rc == FK_OK && mkdir(buf, 0755) != 0 && errno != EEXIST)
        rc = fk_err(FK_EIO, "%s: cannot create directory (%s)", buf, strerror(errno));
    free(buf);
    return rc;
}

int fk_results_prepare(const char *dir)
{
    char *p;
    FK_TRY(fk_store_path(&p, dir, "cells"));
    int rc = fk_store_mkdir_p(p);
    free(p);
    FK_TRY(rc);
    char test[PATH_MAX];
    FK_TRY(fk_store_path(&p, dir, "cells/.write-test"));
    rc = fk_store_tmp_name(p, test, sizeof test); /* one per process: runs may share dir */
    free(p);
    FK_TRY(rc);
    rc = fk_write_atomic(test, "ok\n", 3);
    if (rc == FK_OK)
        unlink(test);
    FK_TRY(rc);
    int fd;
    FK_TRY(fk_store_lock(dir, &fd));
    fk_store_sweep_stale(dir);
    fk_store_unlock(fd);
    return FK_OK;
}

/* No allocation: an answer that cannot fail (a path beyond PATH_MAX cannot exist). */
static int meta_path(char *p, size_t cap, const char *dir, const char *id)
{
    int n = snprintf(p, cap, "%s/cells/%s.meta", dir, id);
    return n >= 0 && (size_t)n < cap;
}

int fk_results_status(const char *dir, const char *id, char *status, size_t cap)
{
    char p[PATH_MAX], line[512];
    status[0] = 0;
    FILE *f = meta_path(p, sizeof p, dir, id) ? fopen(p, "r") : NULL;
    if (!f)
        return 0;
    while (fgets(line, sizeof line, f)) {
        int whole = strchr(line, '\n') != NULL;
        if (whole && !strncmp(line, "status\t", 7)) {
            line[strcspn(line, "\n")] = 0;
            snprintf(status, cap, "%s", line + 7);
            break;
        }
        while (!whole && fgets(line, sizeof line, f))
            whole = strchr(line, '\n') != NULL;
    }
    fclose(f);
    return 1;
}

int fk_results_recorded(const char *dir, const char *id)
{
    char p[PATH_MAX];
    return meta_path(p, sizeof p, dir, id) && access(p, F_OK) == 0;
}

/* The recorded size and digest of a cell file ("file.h5\t<size> <hex>") against the file. */
static int verify_file(const char *dir, const char *id, const char *ext, const char *rec,
                       char *why, size_t cap)
{
    char p[PATH_MAX], hex[65], want[65];
    long size = -1;
    struct stat sb;
    if (sscanf(rec, "%ld %64s", &size, want) != 2 || strlen(want) != 64) {
        snprintf(why, cap, "cells/%s.meta: unreadable checksum of its .%s file", id, ext);
        return 0;
    }
    int n = snprintf(p, sizeof p, "%s/cells/%s.%s", dir, id, ext);
    if (n < 0 || (size_t)n >= sizeof p || stat(p, &sb) != 0) {
        snprintf(why, cap, "cells/%s.%s is missing", id, ext);
        return 0;
    }
    if ((long)sb.st_size != size) {
        snprintf(why, cap, "cells/%s.%s has %ld bytes, %ld were recorded", id, ext,
                 (long)sb.st_size, size);
        return 0;
    }
    if (fk_sha256_file(p, hex) < 0 || strcmp(hex, want)) {
        snprintf(why, cap, "cells/%s.%s does not match its recorded SHA-256", id, ext);
        return 0;
    }
    return 1;
}

enum fk_cell_state fk_results_state(const char *dir, const char *id, char *why, size_t cap)
{
    char p[PATH_MAX], line[512], rec[2][160] = {"", ""};
    char dummy[8];
    if (!why)
        why = dummy, cap = sizeof dummy;
    why[0] = 0;
    FILE *f = meta_path(p, sizeof p, dir, id) ? fopen(p, "r") : NULL;
    if (!f)
        return FK_CELL_NONE;
    int status = -1; /* 1 ok, 0 not ok, -1 no status line */
    /* short lines only (status, file.*): a longer line (the traces) is skipped whole */
    while (fgets(line, sizeof line, f)) {
        int whole = strchr(line, '\n') != NULL;
        if (!strncmp(line, "status\t", 7))
            status = !strcmp(line + 7, "ok\n");
        else if (whole && !strncmp(line, "file.h5\t", 8))
            snprintf(rec[0], sizeof rec[0], "%s", line + 8);
        else if (whole && !strncmp(line, "file.summary.csv\t", 17))
            snprintf(rec[1], sizeof rec[1], "%s", line + 17);
        while (!whole && fgets(line, sizeof line, f))
            whole = strchr(line, '\n') != NULL;
    }
    fclose(f);
    if (status != 1)
        return FK_CELL_FAILED;
    if (!rec[0][0] || !rec[1][0]) {
        snprintf(why, cap, "cells/%s.meta records no checksums of the cell's files", id);
        return FK_CELL_DAMAGED;
    }
    if (!verify_file(dir, id, "h5", rec[0], why, cap) ||
        !verify_file(dir, id, "summary.csv", rec[1], why, cap))
        return FK_CELL_DAMAGED;
    return FK_CELL_OK;
}

int fk_results_done(const char *dir, const char *id)
{
    return fk_results_state(dir, id, NULL, 0) == FK_CELL_OK;
}

/* ---- writing a cell -------------------------------------------------------------------- */

static void meta_opts(struct fk_sb *b, const struct fk_cell_meta *m)
{
    for (const struct fk_option *o = m->ops->options; o->name; o++) {
        char v[64];
        fk_opts_format(m->opts, o, v, sizeof v);
        fk_sb_printf(b, "opt.%s\t%s\n", o->name, v);
    }
    /* the eviction policy and its options (columns evict, and its options, of cells.csv) */
    if (m->evict)
        fk_sb_printf(b, "opt.evict\t%s\n", m->evict->name);
    for (const struct fk_option *o = m->evict ? m->evict->options : NULL; o && o->name; o++) {
        char v[64];
        fk_opts_format(m->evict_opts, o, v, sizeof v);
        fk_sb_printf(b, "opt.%s\t%s\n", o->name, v);
    }
    /* the row rewrites (columns merge .. think_recent, empty for cells without them) */
    for (const struct fk_option *o = m->rewrite ? fk_rewrite_options : NULL; o && o->name;
         o++) {
        char v[64];
        fk_opts_format(m->rewrite, o, v, sizeof v);
        fk_sb_printf(b, "opt.%s\t%s\n", o->name, v);
    }
}

static void meta_head(struct fk_sb *b, const struct fk_cell_meta *m, const char *status)
{
    fk_sb_printf(b, "cell_id\t%s\ncodec\t%s\ndataset\t%s\nstatus\t%s\n", m->id, m->ops->name,
              m->dataset, status);
    fk_sb_printf(b, "dictionary\t%s\nbasis\t%s\nn_traces\t%d\nseed\t%ld\nattn_stride\t%d\n",
              m->dict ? m->dict : "", m->basis ? m->basis : "", m->n_traces, m->seed,
              m->attn_stride);
    if (m->calib)
        fk_sb_printf(b, "calibration\t%s\n", m->calib);
    fk_sb_printf(b, "repeat\t%d\n", m->repeat);
    fk_sb_printf(b, "sweep\t");
    for (const char *p = m->sweep ? m->sweep : ""; *p; p++)
        fk_sb_printf(b, "%c", *p == '\n' || *p == '\t' ? ' ' : *p);
    fk_sb_printf(b, "\n");
    fk_sb_printf(b, "traces\t");
    for (int i = 0; i < m->n_traces; i++)
        fk_sb_printf(b, "%s%s", i ? ";" : "", m->traces[i]);
    fk_sb_printf(b, "\n");
    meta_opts(b, m);
}

static const char *base_name(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

/* What a finished cell's .meta records of one of its files: size and SHA-256. */
struct file_sum {
    long size;
    char hex[65];
};

static void file_sum_of(const void *data, size_t len, struct file_sum *fs)
{
    uint8_t d[32];
    fk_sha256(data, len, d);
    fk_sha256_hex(d, fs->hex);
    fs->size = (long)len;
}

static int write_h5(const char *path, const struct fk_cell_meta *m,
                    const struct fk_cell_result *r, struct file_sum *fs)
{
    /* The file is built in memory (core driver, no backing store) and written with
     * fk_write_atomic: HDF5 never writes to the disk, so a full disk is an ordinary write
     * error here (HDF5 1.10 crashes at exit after a failed H5Fclose, HDFGroup/hdf5#2257). */
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (fapl < 0 || H5Pset_fapl_core(fapl, 1 << 20, 0) < 0) {
        if (fapl >= 0)
            H5Pclose(fapl);
        return fk_err(FK_EEXTERNAL, "%s: HDF5 core driver unavailable", path);
    }
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    H5Pclose(fapl);
    if (f < 0)
        return fk_err(FK_EIO, "%s: cannot create (in memory)", path);
    int rc = fk_h5_put_str(f, "schema", "fadkv-cell");
    if (!rc) rc = fk_h5_put_str(f, "cell_id", m->id);
    if (!rc) rc = fk_h5_put_str(f, "codec", m->ops->name);
    static const char *const kn[2] = {"K", "V"};
    for (int t = 0; !rc && t < r->n_traces; t++) {
        char g[64];
        snprintf(g, sizeof g, "T%02d", t);
        hid_t gt = H5Gcreate2(f, g, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        rc = fk_h5_put_str(gt, "trace", m->traces[t]);
        if (!rc)
            rc = fk_results_loop_h5(gt, m->loop, t);
        for (int l = 0; !rc && l < r->n_layers; l++) {
            char gl[32];
            snprintf(gl, sizeof gl, "L%02d", l);
            hid_t g2 = H5Gcreate2(gt, gl, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
            const struct fk_attn_acc *a = &r->attn[(size_t)t * r->n_layers + l];
            if (a->n && a->cos_vals) {
                hsize_t d[1] = {(hsize_t)a->n};
                rc = fk_h5_write(g2, "attn_cos", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, 1, d, 0, 0,
                                 a->cos_vals);
            }
            for (int k = 0; !rc && k < 2; k++) {
                const struct fk_stream_result *s =
                    &r->streams[((size_t)t * r->n_layers + l) * 2 + k];
                hid_t gk = H5Gcreate2(g2, kn[k], H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
                hsize_t d[1] = {(hsize_t)s->n_steps};
                rc = fk_h5_write(gk, "dict_size_norm", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 1, d, 0,
                                 0, s->dict_norm);
                if (!rc) rc = fk_h5_write(gk, "step_err_sum", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE,
                                          1, d, 0, 0, s->step_err);
                if (!rc) rc = fk_h5_write(gk, "step_n", H5T_STD_I32LE, H5T_NATIVE_INT32, 1, d, 0,
                                          0, s->step_n);
                hsize_t hb[1] = {FK_HIST_BINS};
                if (!rc) rc = fk_h5_write(gk, "hist_prefill_use", H5T_STD_U32LE,
                                          H5T_NATIVE_UINT32, 1, hb, 0, 0, s->hist_prefill);
                if (!rc) rc = fk_h5_write(gk, "hist_use_total", H5T_STD_U32LE, H5T_NATIVE_UINT32,
                                          1, hb, 0, 0, s->hist_total);
                hsize_t rn[1] = {FK_RECALL_NS};
                if (!rc) rc = fk_h5_write(gk, "pool_recall", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE,
                                          1, rn, 0, 0, s->recall);
                if (!rc && s->corr_profile && s->corr_len > 0) {
                    hsize_t cp[1] = {(hsize_t)s->corr_len}; /* the filled entries */
                    rc = fk_h5_write(gk, "corr_profile", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, 1,
                                     cp, 0, 0, s->corr_profile);
                }
                H5Gclose(gk);
            }
            H5Gclose(g2);
        }
        H5Gclose(gt);
    }
    char *img = NULL;
    ssize_t len = 0;
    if (!rc && H5Fflush(f, H5F_SCOPE_GLOBAL) < 0)
        rc = fk_err(FK_EEXTERNAL, "%s: HDF5 flush failed", path);
    if (!rc && (len = H5Fget_file_image(f, NULL, 0)) <= 0)
        rc = fk_err(FK_EEXTERNAL, "%s: HDF5 file image unavailable", path);
    if (!rc && !(img = malloc((size_t)len)))
        rc = fk_err(FK_ENOMEM, "out of memory (%zd bytes)", len);
    if (!rc && H5Fget_file_image(f, img, (size_t)len) != len)
        rc = fk_err(FK_EEXTERNAL, "%s: HDF5 file image unavailable", path);
    H5Fclose(f);
    if (!rc) {
        file_sum_of(img, (size_t)len, fs);
        rc = fk_write_atomic(path, img, (size_t)len);
    }
    free(img);
    return rc;
}

/* cells/<id>.summary.csv: one row per trace x layer x kind (summary.csv without header):
 * the identity columns, then every metric with a row getter, in table order. */
static int summary_rows(const struct fk_cell_meta *m, const struct fk_cell_result *r,
                        struct fk_sb *b)
{
    int dict = (m->ops->caps & FK_CAP_DICT) != 0;
    for (int t = 0; t < r->n_traces; t++)
        for (int l = 0; l < r->n_layers; l++)
            for (int k = 0; k < 2; k++) {
                const struct fk_stream_result *s =
                    &r->streams[((size_t)t * r->n_layers + l) * 2 + k];
                double lv[5]; /* closed loop (fk_results_loop_layer) */
                fk_results_loop_layer(m->loop, t, l, lv);
                struct fk_metric_row row = {.s = s, .a = &r->attn[(size_t)t * r->n_layers + l],
                                            .loop = lv, .dict = dict};
                fk_sb_printf(b, "%s,%s,", m->id, m->ops->name);
                fk_csv_field(b, base_name(m->traces[t]));
                fk_sb_printf(b, ",%d,%s,%ld,%ld", l, k ? "V" : "K", s->n_vectors, s->n_zero);
                for (const struct fk_metric *x = fk_metrics; x->name; x++)
                    if (x->row) {
                        fk_sb_printf(b, ",");
                        sb_num(b, x->row(&row));
                    }
                fk_sb_printf(b, "\n");
            }
    return b->oom ? fk_err(FK_ENOMEM, "out of memory") : FK_OK;
}

/* cells/<id>.meta of a finished cell: identity, options, then every metric with a cell value
 * (the table's; the closed loop's only for a model dataset). */
static int meta_text(const struct fk_cell_meta *m, const struct fk_cell_result *r,
                     struct fk_sb *mb)
{
    int n = fk_metric_count();
    double *v = malloc(sizeof(double) * (size_t)n);
    if (!v)
        return fk_err(FK_ENOMEM, "out of memory");
    int rc = fk_metrics_cell(r, m->loop, m->ops, m->opts, v);
    if (rc == FK_OK) {
        meta_head(mb, m, "ok");
        for (int i = 0; i < n; i++) {
            const struct fk_metric *x = &fk_metrics[i];
            if (x->agg == FK_AGG_NONE || x->agg == FK_AGG_TABLE ||
                (x->agg == FK_AGG_LOOP && !m->loop))
                continue;
            if (x->flags & FK_MF_INT)
                fk_sb_printf(mb, "%s\t%.0f\n", x->name, v[i]);
            else if (x->flags & FK_MF_TIMING)
                fk_sb_printf(mb, "%s\t%.6g\n", x->name, v[i]);
            else
                fk_sb_printf(mb, "%s\t%.9g\n", x->name, v[i]);
        }
        rc = mb->oom ? fk_err(FK_ENOMEM, "out of memory") : FK_OK;
    }
    free(v);
    return rc;
}

/* Writes text to DIR/cells/<id>.<ext> atomically. */
static int write_cell_file(const char *dir, const char *id, const char *ext, const char *text,
                           size_t len)
{
    char *path;
    FK_TRY(fk_store_path(&path, dir, "cells/%s.%s", id, ext));
    int rc = fk_write_atomic(path, text ? text : "", len);
    free(path);
    return rc;
}

/* The .meta lines that let a reader verify the cell's other files. */
static void meta_files(struct fk_sb *b, const struct file_sum *h5, const struct file_sum *sum)
{
    fk_sb_printf(b, "file.h5\t%ld %s\nfile.summary.csv\t%ld %s\n", h5->size, h5->hex,
                 sum->size, sum->hex);
}

int fk_results_commit(const char *dir, const struct fk_cell_meta *m,
                      const struct fk_cell_result *r)
{
    char *path;
    struct file_sum fh5, fsum;
    FK_TRY(fk_store_path(&path, dir, "cells/%s.h5", m->id));
    int rc = write_h5(path, m, r, &fh5);
    free(path);
    FK_TRY(rc);

    struct fk_sb b = {0};
    rc = summary_rows(m, r, &b);
    if (rc == FK_OK) {
        file_sum_of(b.s ? b.s : "", b.n, &fsum);
        rc = write_cell_file(dir, m->id, "summary.csv", b.s, b.n);
    }
    fk_sb_free(&b);
    FK_TRY(rc);

    /* meta last: its presence marks the cell finished; it carries the other files' sums */
    rc = meta_text(m, r, &b);
    if (rc == FK_OK) {
        meta_files(&b, &fh5, &fsum);
        rc = b.oom ? fk_err(FK_ENOMEM, "out of memory")
                   : write_cell_file(dir, m->id, "meta", b.s, b.n);
    }
    fk_sb_free(&b);
    return rc;
}

int fk_results_commit_failed(const char *dir, const struct fk_cell_meta *m, const char *status,
                             const char *message)
{
    struct fk_sb b = {0};
    meta_head(&b, m, status);
    fk_sb_printf(&b, "error\t");
    for (const char *p = message; *p; p++)
        fk_sb_printf(&b, "%c", *p == '\n' || *p == '\t' ? ' ' : *p);
    fk_sb_printf(&b, "\n");
    int rc = write_cell_file(dir, m->id, "summary.csv", "", 0);
    if (!rc)
        rc = b.oom ? fk_err(FK_ENOMEM, "out of memory")
                   : write_cell_file(dir, m->id, "meta", b.s, b.n);
    fk_sb_free(&b);
    return rc;
}

/* ---- tables ---------------------------------------------------------------------------- */

struct kv {
    char **k, **v;
    int n;
};

static void kv_free(struct kv *m)
{
    for (int i = 0; i < m->n; i++) {
        free(m->k[i]);
        free(m->v[i]);
    }
    free(m->k);
    free(m->v);
    memset(m, 0, sizeof *m);
}

static int kv_load(const char *path, struct kv *m)
{
    memset(m, 0, sizeof *m);
    char *text = fk_slurp(path, NULL);
    if (!text)
        return fk_err(FK_EIO, "%s: cannot read", path);
    int cap = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        char *tab = strchr(line, '\t');
        if (!tab)
            continue;
        *tab = 0;
        if (m->n == cap) {
            cap = cap ? cap * 2 : 64;
            char **nk = realloc(m->k, sizeof(char *) * (size_t)cap);
            if (nk)
                m->k = nk;
            char **nv = realloc(m->v, sizeof(char *) * (size_t)cap);
            if (nv)
                m->v = nv;
            if (!nk || !nv) {
                free(text);
                kv_free(m);
                return fk_err(FK_ENOMEM, "out of memory");
            }
        }
        m->k[m->n] = strdup(line);
        m->v[m->n] = strdup(tab + 1);
        m->n++;
    }
    free(text);
    return FK_OK;
}

/* The value of key, or "" when absent. */
static const char *kv_get(const struct kv *m, const char *key)
{
    for (int i = 0; i < m->n; i++)
        if (!strcmp(m->k[i], key))
            return m->v[i];
    return "";
}

static double kv_num(const struct kv *m, const char *key)
{
    const char *v = kv_get(m, key);
    return *v ? strtod(v, NULL) : NAN;
}

/* Loads cells/<id>.meta of dir. */
static int load_cell_meta(const char *dir, const char *id, struct kv *m)
{
    char *p;
    FK_TRY(fk_store_path(&p, dir, "cells/%s.meta", id));
    int rc = kv_load(p, m);
    free(p);
    return rc;
}

int fk_results_meta_str(const char *dir, const char *id, const char *key, char *buf,
                        size_t cap)
{
    struct kv m;
    FK_TRY(load_cell_meta(dir, id, &m));
    snprintf(buf, cap, "%s", kv_get(&m, key));
    kv_free(&m);
    return FK_OK;
}

int fk_results_metric(const char *dir, const char *id, const char *name, double *value)
{
    struct kv m;
    FK_TRY(load_cell_meta(dir, id, &m));
    *value = kv_num(&m, name);
    kv_free(&m);
    return FK_OK;
}

/* 1 when metric x is a cells.csv column. */
static int cells_column(const struct fk_metric *x)
{
    return x->agg != FK_AGG_NONE && !(x->flags & FK_MF_META_ONLY);
}

/* summary.csv's header: the identity columns, then every metric with a row getter. */
static void summary_header(struct fk_sb *b)
{
    fk_sb_printf(b, "cell_id,codec,trace,layer,kind,n_vectors,n_zero");
    for (const struct fk_metric *x = fk_metrics; x->name; x++)
        if (x->row)
            fk_sb_printf(b, ",%s", x->name);
    fk_sb_printf(b, "\n");
}

/* The union of the option columns of every registered codec, in registry order. */
static int option_columns(const char **cols, int cap)
{
    int n = 0;
    for (int c = 0; fk_codec_at(c); c++)
        for (const struct fk_option *o = fk_codec_at(c)->options; o->name; o++) {
            int seen = 0;
            for (int j = 0; j < n; j++)
                seen |= !strcmp(cols[j], o->name);
            if (!seen && n < cap)
                cols[n++] = o->name;
        }
    /* then `evict` and the eviction policies' options (empty for cells without one) */
    if (n < cap)
        cols[n++] = "evict";
    for (int c = 0; fk_evict_policies[c]; c++)
        for (const struct fk_option *o = fk_evict_policies[c]->options; o->name; o++) {
            int seen = 0;
            for (int j = 0; j < n; j++)
                seen |= !strcmp(cols[j], o->name);
            if (!seen && n < cap)
                cols[n++] = o->name;
        }
    for (const struct fk_option *o = fk_rewrite_options; o->name && n < cap; o++)
        cols[n++] = o->name; /* then the row rewrites' (core/fk_rewrite.h) */
    return n;
}

static void cells_header(struct fk_sb *b, const char *const *opt_cols, int n_opt)
{
    fk_sb_printf(b, "cell_id,codec,dataset,status");
    for (int j = 0; j < n_opt; j++)
        fk_sb_printf(b, ",%s", opt_cols[j]);
    fk_sb_printf(b, ",n_traces,traces,dictionary,basis,seed,attn_stride,repeat");
    for (const struct fk_metric *x = fk_metrics; x->name; x++)
        if (cells_column(x))
            fk_sb_printf(b, ",%s", x->name);
    fk_sb_printf(b, ",error\n");
}

/* The value of the sparsity option (FK_ROLE_SPARSITY) of cell m's codec, "" when it has
 * none. */
static const char *sparsity_of(const struct kv *m)
{
    const struct fk_codec_ops *ops = fk_codec_find(kv_get(m, "codec"));
    const struct fk_option *o = ops ? fk_codec_role(ops, FK_ROLE_SPARSITY) : NULL;
    char key[96];
    if (!o || (size_t)snprintf(key, sizeof key, "opt.%s", o->name) >= sizeof key)
        return "";
    return kv_get(m, key);
}

/* The cost reference of cell m: the first finished cell of codec `baseline` on the same
 * dataset and sparsity (FK_ROLE_SPARSITY; none on either side counts as equal), or NULL
 * (no baseline given, or none in the sweep). */
static const struct kv *cost_reference(const struct kv *metas, const uint8_t *have, int n_ids,
                                       const struct kv *m, const char *baseline)
{
    const char *ds = kv_get(m, "dataset"), *sv = sparsity_of(m);
    for (int r = 0; baseline && r < n_ids; r++) {
        if (!have[r] || strcmp(kv_get(&metas[r], "codec"), baseline) ||
            strcmp(kv_get(&metas[r], "status"), "ok"))
            continue;
        const char *ds2 = kv_get(&metas[r], "dataset"), *sv2 = sparsity_of(&metas[r]);
        if (strcmp(ds, ds2) || strcmp(sv, sv2))
            continue;
        return &metas[r];
    }
    return NULL;
}

/* The FK_AGG_TABLE values of cell m: from its other values and its cost reference ref
 * (NULL: none). */
static double table_value(const struct kv *m, const char *name, const struct kv *ref)
{
    if (!strcmp(name, "bytes_ratio_full")) {
        double full = kv_num(m, "bytes_full_per_seq"), seq = kv_num(m, "bytes_per_seq");
        return full > 0 ? seq / full : NAN;
    }
    if (!strcmp(name, "bits_per_elem_1k")) {
        double seq = kv_num(m, "bytes_per_seq"), model = kv_num(m, "bytes_model");
        return seq > 0 ? kv_num(m, "bits_per_elem") * (seq + (model > 0 ? model : 0) / 1000) / seq
                       : NAN;
    }
    if (!strcmp(name, "cost_mac_rel"))
        return ref ? kv_num(m, "macs_per_vec") / kv_num(ref, "macs_per_vec") : NAN;
    if (!strcmp(name, "cpu_time_rel"))
        return ref ? kv_num(m, "cpu_us_per_vec") / kv_num(ref, "cpu_us_per_vec") : NAN;
    return NAN;
}

/* One cells.csv row (ref: the cost reference or NULL). */
static void cells_row(struct fk_sb *b, const struct kv *m, const char *const *opt_cols,
                      int n_opt, const struct kv *ref)
{
    fk_sb_printf(b, "%s,%s,", kv_get(m, "cell_id"), kv_get(m, "codec"));
    fk_csv_field(b, kv_get(m, "dataset"));
    fk_sb_printf(b, ",%s", kv_get(m, "status"));
    for (int j = 0; j < n_opt; j++) {
        char key[128];
        snprintf(key, sizeof key, "opt.%s", opt_cols[j]);
        fk_sb_printf(b, ",");
        fk_csv_field(b, kv_get(m, key));
    }
    fk_sb_printf(b, ",%s,", kv_get(m, "n_traces"));
    fk_csv_field(b, kv_get(m, "traces"));
    fk_sb_printf(b, ",");
    fk_csv_field(b, kv_get(m, "dictionary"));
    fk_sb_printf(b, ",");
    fk_csv_field(b, kv_get(m, "basis"));
    fk_sb_printf(b, ",%s,%s,%s", kv_get(m, "seed"), kv_get(m, "attn_stride"),
                 kv_get(m, "repeat"));
    for (const struct fk_metric *x = fk_metrics; x->name; x++) {
        if (!cells_column(x))
            continue;
        fk_sb_printf(b, ",");
        sb_num(b, x->agg == FK_AGG_TABLE ? table_value(m, x->name, ref) : kv_num(m, x->name));
    }
    fk_sb_printf(b, ",");
    fk_csv_field(b, kv_get(m, "error"));
    fk_sb_printf(b, "\n");
}

/* Loads the .meta of every finished cell of ids (have[i] = 1 when loaded). */
static int load_metas(const char *dir, const char *const *ids, int n_ids, struct kv *metas,
                      uint8_t *have)
{
    for (int i = 0; i < n_ids; i++) {
        if (!fk_results_recorded(dir, ids[i]))
            continue;
        char *p;
        FK_TRY(fk_store_path(&p, dir, "cells/%s.meta", ids[i]));
        int rc = kv_load(p, &metas[i]);
        free(p);
        FK_TRY(rc);
        have[i] = 1;
    }
    return FK_OK;
}

/* Appends cells/<id>.summary.csv to s (a missing file adds nothing). */
static int append_summary(const char *dir, const char *id, struct fk_sb *s)
{
    char *p;
    FK_TRY(fk_store_path(&p, dir, "cells/%s.summary.csv", id));
    char *rows = fk_slurp(p, NULL);
    free(p);
    if (rows)
        fk_sb_printf(s, "%s", rows);
    free(rows);
    return FK_OK;
}

static int write_table(const char *dir, const char *name, const struct fk_sb *b)
{
    char *p;
    FK_TRY(fk_store_path(&p, dir, "%s", name));
    int rc = fk_write_atomic(p, b->s ? b->s : "", b->n);
    free(p);
    return rc;
}

static int tables_locked(const char *dir, const char *const *ids, int n_ids,
                         const char *cost_baseline);

int fk_results_tables(const char *dir, const char *const *ids, int n_ids,
                      const char *cost_baseline)
{
    /* under the directory lock: two runs never interleave their rewrites, and the last
     * one to finish a cell writes tables that hold every finished cell */
    int fd;
    FK_TRY(fk_store_lock(dir, &fd));
    int rc = tables_locked(dir, ids, n_ids, cost_baseline);
    fk_store_unlock(fd);
    return rc;
}

static int tables_locked(const char *dir, const char *const *ids, int n_ids,
                         const char *cost_baseline)
{
    struct kv *metas = calloc((size_t)n_ids + 1, sizeof *metas);
    uint8_t *have = calloc((size_t)n_ids + 1, 1);
    if (!metas || !have) {
        free(metas);
        free(have);
        return fk_err(FK_ENOMEM, "out of memory");
    }
    int rc = load_metas(dir, ids, n_ids, metas, have);
    const char *opt_cols[256];
    int n_opt = option_columns(opt_cols, 256);
    struct fk_sb b = {0}, s = {0};
    cells_header(&b, opt_cols, n_opt);
    summary_header(&s);
    for (int i = 0; i < n_ids && rc == FK_OK; i++) {
        if (!have[i])
            continue;
        const struct kv *ref = cost_reference(metas, have, n_ids, &metas[i], cost_baseline);
        cells_row(&b, &metas[i], opt_cols, n_opt, ref);
        rc = append_summary(dir, ids[i], &s);
    }
    if (rc == FK_OK && (b.oom || s.oom))
        rc = fk_err(FK_ENOMEM, "out of memory");
    if (rc == FK_OK)
        rc = write_table(dir, "summary.csv", &s);
    if (rc == FK_OK)
        rc = write_table(dir, "cells.csv", &b);
    fk_sb_free(&b);
    fk_sb_free(&s);
    for (int i = 0; i < n_ids; i++)
        kv_free(&metas[i]);
    free(metas);
    free(have);
    return rc;
}
