/* SPDX-License-Identifier: MIT
 * `fadkv-bench merge OUT_DIR SHARD_DIR...`: combines the results directories of the shards of
 * one sweep (`--shard I/N` runs) into one.
 *
 * Refuses shards of different sweeps (provenance.json config_hash or resolved.txt differ, or
 * an OUT_DIR already holding another sweep). Copies every finished cell (cells/<id>.h5,
 * <id>.summary.csv, then <id>.meta, each written atomically). A cell present in two shards
 * (or already in OUT_DIR) must hold the same results: its .meta without the timing keys
 * (wall_s, t_*, cpu_us_per_vec) and its summary rows without cpu_s must match, else the merge
 * refuses. Then writes resolved.txt and provenance.json ("merged_from" added) and regenerates
 * cells.csv and summary.csv with fk_results_tables in resolved.txt's cell order.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fk_err.h"
#include "store/fk_results.h"
#include "common/fk_str.h"

int fk_cli_merge(int argc, char **argv);

/* The "config_hash" of a provenance.json text, into out. */
static int config_hash(const char *dir, char *out, size_t cap)
{
    char p[4200];
    snprintf(p, sizeof p, "%s/provenance.json", dir);
    char *t = fk_slurp(p, NULL);
    if (!t)
        return fk_err(FK_EIO, "%s: cannot read (%s): not a results directory?", p,
                      strerror(errno));
    const char *k = strstr(t, "\"config_hash\"");
    const char *q = k ? strchr(k + 13, '"') : NULL;
    const char *e = q ? strchr(q + 1, '"') : NULL;
    if (!e) {
        free(t);
        return fk_err(FK_ECORRUPT, "%s: expected a \"config_hash\": \"...\" entry", p);
    }
    snprintf(out, cap, "%.*s", (int)(e - q - 1), q + 1);
    free(t);
    return FK_OK;
}

static int is_timing_key(const char *k, size_t n)
{
    static const char *const keys[] = {"wall_s", "cpu_us_per_vec", NULL};
    if (n >= 2 && k[0] == 't' && k[1] == '_')
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

/* Index of the cpu_s column of the summary format (from a summary.csv header), or -1. */
static int cpu_field(const char *dir)
{
    char p[4200];
    snprintf(p, sizeof p, "%s/summary.csv", dir);
    FILE *f = fopen(p, "r");
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

/* 1 when the two stored cells hold the same results (see the top of this file). */
static int same_cell(const char *dir_a, const char *dir_b, const char *id, int cpu_a,
                     int cpu_b)
{
    char pa[4200], pb[4200];
    snprintf(pa, sizeof pa, "%s/cells/%s.meta", dir_a, id);
    snprintf(pb, sizeof pb, "%s/cells/%s.meta", dir_b, id);
    char *ta = fk_slurp(pa, NULL), *tb = fk_slurp(pb, NULL);
    char *ca = ta ? meta_core(ta) : NULL, *cb = tb ? meta_core(tb) : NULL;
    int same = ca && cb && !strcmp(ca, cb);
    free(ta);
    free(tb);
    free(ca);
    free(cb);
    if (!same)
        return 0;
    snprintf(pa, sizeof pa, "%s/cells/%s.summary.csv", dir_a, id);
    snprintf(pb, sizeof pb, "%s/cells/%s.summary.csv", dir_b, id);
    ta = fk_slurp(pa, NULL);
    tb = fk_slurp(pb, NULL);
    ca = ta ? summary_core(ta, cpu_a) : NULL;
    cb = tb ? summary_core(tb, cpu_b) : NULL;
    same = ca && cb && !strcmp(ca, cb);
    free(ta);
    free(tb);
    free(ca);
    free(cb);
    return same;
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

static int copy_cell(const char *shard, const char *out, const char *id)
{
    static const char *const ext[] = {"h5", "summary.csv", "meta", NULL};
    for (int i = 0; ext[i]; i++) {
        char a[4200], b[4200];
        snprintf(a, sizeof a, "%s/cells/%s.%s", shard, id, ext[i]);
        snprintf(b, sizeof b, "%s/cells/%s.%s", out, id, ext[i]);
        if (access(a, F_OK) != 0) {
            if (!strcmp(ext[i], "h5"))
                continue;    /* failed cells have no .h5 */
            return fk_err(FK_ECORRUPT, "%s: missing (the cell's .meta exists)", a);
        }
        FK_TRY(copy_file(a, b));
    }
    return FK_OK;
}

static int merge_fail(const char *what)
{
    fprintf(stderr, "fadkv-bench merge: %s%s%s\n", what, *fk_errmsg() ? ": " : "",
            fk_errmsg());
    return 1;
}

/* Inserts "merged_from": [...] after the opening brace of a provenance.json text. */
static char *provenance_merged(const char *text, char **shards, int n)
{
    size_t cap = strlen(text) + 64;
    for (int i = 0; i < n; i++)
        cap += strlen(shards[i]) * 2 + 8;
    char *out = malloc(cap);
    if (!out)
        return NULL;
    const char *brace = strchr(text, '{');
    if (!brace) {
        free(out);
        return NULL;
    }
    size_t k = (size_t)(brace - text) + 1;
    memcpy(out, text, k);
    k += (size_t)snprintf(out + k, cap - k, "\n  \"merged_from\": [");
    for (int i = 0; i < n; i++) {
        k += (size_t)snprintf(out + k, cap - k, "%s\"", i ? ", " : "");
        for (const char *p = shards[i]; *p && k + 3 < cap; p++) {
            if (*p == '"' || *p == '\\')
                out[k++] = '\\';
            out[k++] = *p;
        }
        k += (size_t)snprintf(out + k, cap - k, "\"");
    }
    k += (size_t)snprintf(out + k, cap - k, "],");
    snprintf(out + k, cap - k, "%s", brace + 1);
    return out;
}

int fk_cli_merge(int argc, char **argv)
{
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: fadkv-bench merge OUT_DIR SHARD_DIR...\n"
               "  Combines the results of the shards of one sweep (same config hash).\n");
        return 0;
    }
    if (argc < 3) {
        fprintf(stderr, "usage: fadkv-bench merge OUT_DIR SHARD_DIR...\n");
        return 2;
    }
    const char *out = argv[1];
    char **shards = argv + 2;
    int n_sh = argc - 2;
    char hash0[128], hash[128];
    if (config_hash(shards[0], hash0, sizeof hash0) < 0)
        return merge_fail("shard");
    char rp[4200];
    snprintf(rp, sizeof rp, "%s/resolved.txt", shards[0]);
    size_t rlen = 0;
    char *resolved = fk_slurp(rp, &rlen);
    if (!resolved) {
        fprintf(stderr, "fadkv-bench merge: %s: cannot read\n", rp);
        return 1;
    }
    for (int i = 1; i < n_sh; i++) {
        if (config_hash(shards[i], hash, sizeof hash) < 0) {
            free(resolved);
            return merge_fail("shard");
        }
        snprintf(rp, sizeof rp, "%s/resolved.txt", shards[i]);
        char *r2 = fk_slurp(rp, NULL);
        int diff = strcmp(hash, hash0) || !r2 || strcmp(r2, resolved);
        free(r2);
        if (diff) {
            fprintf(stderr, "fadkv-bench merge: %s and %s are not shards of the same sweep "
                            "(config_hash %.16s... vs %.16s..., or resolved.txt differs)\n",
                    shards[0], shards[i], hash0, hash);
            free(resolved);
            return 1;
        }
    }
    char op[4200];
    snprintf(op, sizeof op, "%s/provenance.json", out);
    if (access(op, F_OK) == 0) {
        if (config_hash(out, hash, sizeof hash) < 0 || strcmp(hash, hash0)) {
            fprintf(stderr, "fadkv-bench merge: %s already holds results of another sweep "
                            "(config_hash %.16s...); choose an empty OUT_DIR\n", out, hash);
            free(resolved);
            return 1;
        }
    }
    if (fk_results_prepare(out) < 0) {
        free(resolved);
        return merge_fail(out);
    }
    /* cell ids in sweep order: resolved.txt lines after the header */
    int cap = 64, n_ids = 0;
    char **ids = malloc(sizeof(char *) * (size_t)cap);
    for (char *l = strchr(resolved, '\n'); ids && l && l[1]; l = strchr(l + 1, '\n')) {
        char id[FK_ID_LEN + 2];
        if (sscanf(l + 1, "%17s", id) != 1 || strlen(id) != FK_ID_LEN)
            continue;
        if (n_ids == cap) {
            char **ni = realloc(ids, sizeof(char *) * (size_t)(cap *= 2));
            if (!ni) {
                for (int i = 0; i < n_ids; i++)
                    free(ids[i]);
                free(ids);
                ids = NULL;
                break;
            }
            ids = ni;
        }
        ids[n_ids++] = strdup(id);
    }
    if (!ids) {
        free(resolved);
        fprintf(stderr, "fadkv-bench merge: out of memory\n");
        return 1;
    }
    int rc = 0, copied = 0, dup = 0, foreign = 0;
    int cpu_out = -1;
    int *src = calloc((size_t)n_ids + 1, sizeof(int)); /* shard index + 1 a cell came from */
    for (int i = 0; src && i < n_ids; i++)
        src[i] = fk_results_done(out, ids[i]) ? -1 : 0;
    cpu_out = cpu_field(out);
    for (int s = 0; src && s < n_sh && !rc; s++) {
        int cpu_s = cpu_field(shards[s]);
        char cd[4200];
        snprintf(cd, sizeof cd, "%s/cells", shards[s]);
        DIR *d = opendir(cd);
        if (!d) {
            fprintf(stderr, "fadkv-bench merge: %s: cannot open (%s)\n", cd, strerror(errno));
            rc = 1;
            break;
        }
        struct dirent *e;
        while (!rc && (e = readdir(d))) {
            size_t len = strlen(e->d_name);
            if (len != FK_ID_LEN + 5 || strcmp(e->d_name + FK_ID_LEN, ".meta"))
                continue;
            char id[FK_ID_LEN + 1];
            memcpy(id, e->d_name, FK_ID_LEN);
            id[FK_ID_LEN] = 0;
            int k = 0;
            while (k < n_ids && strcmp(ids[k], id))
                k++;
            if (k == n_ids) {
                foreign++;   /* a cell of an earlier version of the sweep: not merged */
                continue;
            }
            if (src[k] != 0) {
                const char *other = src[k] > 0 ? shards[src[k] - 1] : out;
                int cpu_o = src[k] > 0 ? cpu_field(other) : cpu_out;
                if (!same_cell(other, shards[s], id, cpu_o, cpu_s)) {
                    fprintf(stderr, "fadkv-bench merge: cell %s differs between %s and %s "
                                    "(results, not only timing): refusing to merge\n", id,
                            other, shards[s]);
                    rc = 1;
                }
                dup++;
                continue;
            }
            if (copy_cell(shards[s], out, id) < 0) {
                rc = merge_fail("copying a cell");
                break;
            }
            src[k] = s + 1;
            copied++;
        }
        closedir(d);
    }
    if (!src) {
        fprintf(stderr, "fadkv-bench merge: out of memory\n");
        rc = 1;
    }
    if (!rc) {
        snprintf(rp, sizeof rp, "%s/resolved.txt", out);
        if (fk_write_atomic(rp, resolved, rlen) < 0)
            rc = merge_fail("resolved.txt");
    }
    if (!rc) {
        snprintf(rp, sizeof rp, "%s/provenance.json", shards[0]);
        char *pj = fk_slurp(rp, NULL);
        char *pm = pj ? provenance_merged(pj, shards, n_sh) : NULL;
        if (!pm || fk_write_atomic(op, pm, strlen(pm)) < 0)
            rc = merge_fail("provenance.json");
        free(pj);
        free(pm);
    }
    if (!rc && fk_results_tables(out, (const char *const *)ids, n_ids) < 0)
        rc = merge_fail("writing cells.csv and summary.csv");
    int missing = 0;
    for (int i = 0; src && i < n_ids; i++)
        missing += src[i] == 0;
    if (!rc) {
        printf("merge: %d cell(s) copied from %d shard(s) into %s (%d present twice and "
               "identical, %d not in the sweep, skipped)\n", copied, n_sh, out, dup, foreign);
        if (missing)
            printf("merge: %d of %d cell(s) of the sweep are in no shard yet\n", missing,
                   n_ids);
    }
    for (int i = 0; i < n_ids; i++)
        free(ids[i]);
    free(ids);
    free(src);
    free(resolved);
    return rc;
}
