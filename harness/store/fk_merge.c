/* SPDX-License-Identifier: MIT
 * Shard merging (see fk_merge.h).
 */
#include "store/fk_merge.h"

#include <stdlib.h>
#include <string.h>

#include "common/fk_err.h"
#include "store/fk_results.h"

struct merge {
    const struct fk_merge_opts *o;
    char *resolved;              /* resolved.txt of shard 0 */
    size_t resolved_len;
    char **ids;                  /* [n_ids] cells of the sweep, sweep order */
    int n_ids;
    int *src;                    /* [n_ids] 1 + shard a cell came from, -1 output, 0 none */
    char *baseline;              /* cost baseline (owned) or NULL */
};

static int shard_hash(const char *dir, struct fk_provenance *p)
{
    int rc = fk_store_provenance_read(dir, p);
    return rc < 0 ? fk_err_context(rc, "shard") : FK_OK;
}

/* Every shard: same config_hash and resolved.txt as shard 0; the output: empty or the same
 * sweep. */
static int check_shards(struct merge *m)
{
    const struct fk_merge_opts *o = m->o;
    struct fk_provenance p0, p;
    FK_TRY(shard_hash(o->shards[0], &p0));
    int rc = fk_store_resolved_read(o->shards[0], &m->resolved, &m->resolved_len);
    for (int i = 1; i < o->n_shards && rc == FK_OK; i++) {
        rc = shard_hash(o->shards[i], &p);
        if (rc < 0)
            break;
        char *r2 = NULL;
        size_t n2 = 0;
        int diff = strcmp(p.config_hash, p0.config_hash) ||
                   fk_store_resolved_read(o->shards[i], &r2, &n2) < 0 ||
                   strcmp(r2, m->resolved);
        free(r2);
        if (diff)
            rc = fk_err(FK_ECORRUPT, "%s and %s are not shards of the same sweep (config_hash "
                        "%.16s... vs %.16s..., or resolved.txt differs)", o->shards[0],
                        o->shards[i], p0.config_hash, p.config_hash);
        fk_store_provenance_free(&p);
    }
    if (rc == FK_OK && fk_store_has_provenance(o->out)) {
        int r = fk_store_provenance_read(o->out, &p);
        if (r < 0 || strcmp(p.config_hash, p0.config_hash))
            rc = fk_err(FK_ECORRUPT, "%s already holds results of another sweep (config_hash "
                        "%.16s...); choose an empty OUT_DIR", o->out,
                        r < 0 ? "unreadable" : p.config_hash);
        if (r == FK_OK)
            fk_store_provenance_free(&p);
    }
    fk_store_provenance_free(&p0);
    return rc;
}

static int sweep_index(const struct merge *m, const char *id)
{
    for (int k = 0; k < m->n_ids; k++)
        if (!strcmp(m->ids[k], id))
            return k;
    return -1;
}

/* Copies the finished cells of shard s that the output does not hold yet. */
static int copy_shard(struct merge *m, int s, struct fk_merge_result *r)
{
    const struct fk_merge_opts *o = m->o;
    char **fin;
    int n_fin, rc = FK_OK;
    FK_TRY(fk_store_finished_ids(o->shards[s], &fin, &n_fin));
    for (int i = 0; i < n_fin && rc == FK_OK; i++) {
        int k = sweep_index(m, fin[i]);
        if (k < 0) {
            r->foreign++;    /* a cell of an earlier version of the sweep: not merged */
            continue;
        }
        if (m->src[k] != 0) {
            const char *other = m->src[k] > 0 ? o->shards[m->src[k] - 1] : o->out;
            int same = 0;
            rc = fk_store_cell_same(other, o->shards[s], fin[i], &same);
            if (rc == FK_OK && !same)
                rc = fk_err(FK_ECORRUPT, "cell %s differs between %s and %s (results, not "
                            "only timing): refusing to merge", fin[i], other, o->shards[s]);
            r->duplicates++;
            continue;
        }
        char why[512];
        if (fk_results_state(o->shards[s], fin[i], why, sizeof why) == FK_CELL_DAMAGED) {
            rc = fk_err(FK_ECORRUPT, "%s: cell %s is damaged (%s): rerun that shard, which "
                        "recomputes it, before merging", o->shards[s], fin[i], why);
            break;
        }
        rc = fk_store_cell_copy(o->shards[s], o->out, fin[i]);
        if (rc < 0)
            rc = fk_err_context(rc, "copying a cell");
        else
            m->src[k] = s + 1;
        r->copied += rc == FK_OK;
    }
    fk_store_ids_free(&fin, n_fin);
    return rc;
}

/* The cost baseline: the caller's, else the one the sweep recorded in shard 0's
 * provenance.json, else the first one a shard's cells.csv was computed with. */
static int find_baseline(struct merge *m)
{
    const char *b = m->o->cost_baseline;
    struct fk_provenance p;
    if (!b && fk_store_provenance_read(m->o->shards[0], &p) == FK_OK) {
        if (p.cost_baseline && !(m->baseline = strdup(p.cost_baseline))) {
            fk_store_provenance_free(&p);
            return fk_err(FK_ENOMEM, "out of memory");
        }
        fk_store_provenance_free(&p);
        if (m->baseline)
            return FK_OK;
    }
    struct fk_store *st = NULL;
    for (int s = 0; !b && s < m->o->n_shards; s++) {
        fk_store_close(&st);
        if (fk_store_open(m->o->shards[s], &st) == FK_OK)
            b = fk_store_cost_baseline(st);
    }
    fk_err_clear();
    if (b && !(m->baseline = strdup(b))) {
        fk_store_close(&st);
        return fk_err(FK_ENOMEM, "out of memory");
    }
    fk_store_close(&st);
    return FK_OK;
}

/* resolved.txt, provenance.json with merged_from, and the tables. */
static int write_merged(struct merge *m)
{
    const struct fk_merge_opts *o = m->o;
    int rc = fk_store_resolved_write(o->out, m->resolved, m->resolved_len);
    if (rc < 0)
        return fk_err_context(rc, "resolved.txt");
    struct fk_provenance p;
    rc = fk_store_provenance_read(o->shards[0], &p);
    if (rc == FK_OK) {
        p.merged_from = o->shards;
        p.n_merged_from = o->n_shards;
        rc = fk_store_provenance_write(o->out, &p);
        fk_store_provenance_free(&p);
    }
    if (rc < 0)
        return fk_err_context(rc, "provenance.json");
    rc = fk_results_tables(o->out, (const char *const *)m->ids, m->n_ids, m->baseline);
    return rc < 0 ? fk_err_context(rc, "writing cells.csv and summary.csv") : FK_OK;
}

int fk_merge(const struct fk_merge_opts *o, struct fk_merge_result *r)
{
    memset(r, 0, sizeof *r);
    if (!o->out || !o->shards || o->n_shards < 1)
        return fk_err(FK_EINVAL, "merge: an output directory and at least one shard needed");
    struct merge m = {.o = o};
    int rc = check_shards(&m);
    if (rc == FK_OK && (rc = fk_results_prepare(o->out)) < 0)
        rc = fk_err_context(rc, "%s", o->out);
    if (rc == FK_OK)
        rc = fk_store_sweep_ids(m.resolved, &m.ids, &m.n_ids);
    if (rc == FK_OK && !(m.src = calloc((size_t)m.n_ids + 1, sizeof(int))))
        rc = fk_err(FK_ENOMEM, "out of memory");
    for (int i = 0; rc == FK_OK && i < m.n_ids; i++)
        m.src[i] = fk_results_recorded(o->out, m.ids[i]) ? -1 : 0;
    for (int s = 0; rc == FK_OK && s < o->n_shards; s++)
        rc = copy_shard(&m, s, r);
    if (rc == FK_OK)
        rc = find_baseline(&m);
    if (rc == FK_OK)
        rc = write_merged(&m);
    r->n_cells = m.n_ids;
    for (int i = 0; m.src && i < m.n_ids; i++)
        r->missing += m.src[i] == 0;
    fk_store_ids_free(&m.ids, m.n_ids);
    free(m.src);
    free(m.resolved);
    free(m.baseline);
    return rc;
}
