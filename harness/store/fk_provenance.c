/* SPDX-License-Identifier: MIT
 * provenance.json of a results directory (see fk_results.h), through common/fk_json.
 */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fk_err.h"
#include "common/fk_json.h"
#include "store/fk_results.h"

/* The keys in file order; offsets into struct fk_provenance. */
struct pkey {
    const char *name;
    int is_num;                  /* long (else const char *) */
    size_t off;
};

#define PS(f) {#f, 0, offsetof(struct fk_provenance, f)}
#define PN(f) {#f, 1, offsetof(struct fk_provenance, f)}
static const struct pkey pkeys[] = {
    PS(harness), PS(git), PS(config), PS(config_hash), PS(sweep), PN(cells), PN(jobs),
    PS(hdf5), PS(gsl), PS(blas), PS(blas_config), PS(blas_kernels), PS(simd), PS(compiler),
    PN(blas_threads_per_worker),
    PS(cpu), PN(online_cpus), PS(precision), PS(cost_baseline), PS(budgets), {NULL, 0, 0},
};
#undef PS
#undef PN

static const char **str_field(struct fk_provenance *p, const struct pkey *k)
{
    return (const char **)(void *)((char *)p + k->off);
}

static long *num_field(struct fk_provenance *p, const struct pkey *k)
{
    return (long *)(void *)((char *)p + k->off);
}

int fk_store_provenance_write(const char *dir, const struct fk_provenance *p)
{
    struct fk_provenance c = *p;
    struct fk_json_w w;
    memset(&w, 0, sizeof w);
    fk_json_begin_object(&w);
    if (c.n_merged_from > 0) {
        fk_json_key(&w, "merged_from");
        fk_json_begin_array(&w);
        for (int i = 0; i < c.n_merged_from; i++)
            fk_json_str(&w, c.merged_from[i]);
        fk_json_end_array(&w);
    }
    for (const struct pkey *k = pkeys; k->name; k++) {
        if (k->is_num && *num_field(&c, k) != FK_PROV_NONE) {
            fk_json_key(&w, k->name);
            fk_json_int(&w, *num_field(&c, k));
        } else if (!k->is_num && *str_field(&c, k)) {
            fk_json_key(&w, k->name);
            fk_json_str(&w, *str_field(&c, k));
        }
    }
    fk_json_end_object(&w);
    char *text, *path;
    size_t len;
    FK_TRY(fk_json_finish(&w, &text, &len));
    int rc = fk_store_path(&path, dir, "provenance.json");
    if (rc == FK_OK)
        rc = fk_write_atomic(path, text, len);
    free(text);
    free(path);
    return rc;
}

/* Fills p from the parsed object (p->owned keeps the strings alive). */
static int provenance_fill(const char *path, const struct fk_json *v, struct fk_provenance *p)
{
    if (v->type != FK_JSON_OBJ)
        return fk_err(FK_ECORRUPT, "%s:%d:%d: expected a JSON object", path, v->line, v->col);
    for (const struct pkey *k = pkeys; k->name; k++) {
        const struct fk_json *m = fk_json_get(v, k->name);
        if (!m)
            continue;
        int ok = k->is_num ? m->type == FK_JSON_NUM && fabs(m->num) < 9e18 &&
                                 m->num == (double)(long)m->num
                           : m->type == FK_JSON_STR;
        if (!ok)
            return fk_err(FK_ECORRUPT, "%s:%d:%d: \"%s\": expected %s", path, m->line, m->col,
                          k->name, k->is_num ? "an integer" : "a string");
        if (k->is_num)
            *num_field(p, k) = (long)m->num;
        else
            *str_field(p, k) = m->str;
    }
    const struct fk_json *mf = fk_json_get(v, "merged_from");
    if (mf && mf->type != FK_JSON_ARR)
        return fk_err(FK_ECORRUPT, "%s:%d:%d: \"merged_from\": expected an array", path,
                      mf->line, mf->col);
    return FK_OK;
}

int fk_store_provenance_read(const char *dir, struct fk_provenance *p)
{
    memset(p, 0, sizeof *p);
    for (const struct pkey *k = pkeys; k->name; k++)
        if (k->is_num)
            *num_field(p, k) = FK_PROV_NONE;
    char *path;
    FK_TRY(fk_store_path(&path, dir, "provenance.json"));
    struct fk_json *v = NULL;
    int rc = FK_OK;
    if (access(path, R_OK) != 0)
        rc = fk_err(FK_EIO, "%s: cannot read (%s): not a results directory?", path,
                    strerror(errno));
    if (rc == FK_OK)
        rc = fk_json_load(path, &v);
    if (rc == FK_OK)
        rc = provenance_fill(path, v, p);
    if (rc == FK_OK && !p->config_hash)
        rc = fk_err(FK_ECORRUPT, "%s: expected a \"config_hash\": \"...\" entry", path);
    free(path);
    p->owned = v;
    if (rc < 0)
        fk_store_provenance_free(p);
    return rc;
}

void fk_store_provenance_free(struct fk_provenance *p)
{
    struct fk_json *v = p->owned;
    fk_json_free(&v);
    memset(p, 0, sizeof *p);
}

int fk_store_has_provenance(const char *dir)
{
    char *p;
    if (fk_store_path(&p, dir, "provenance.json") < 0)
        return 0;
    int has = access(p, F_OK) == 0;
    free(p);
    return has;
}
