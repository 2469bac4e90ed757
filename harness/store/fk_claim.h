/* SPDX-License-Identifier: MIT
 * Many runs on one results directory: any number of sweeps, shards or Slurm array tasks may
 * point at the same directory at once. Three rules make that safe:
 *   - temporary files carry the writer's host and process id (fk_write_atomic), so two
 *     writers never share one; a rerun removes the ones its host's dead processes left;
 *   - a cell is claimed before it is computed (cells/<id>.claim, created exclusively, holding
 *     "host pid start"), so it is computed once; a claim whose process is gone (same host,
 *     no such pid, or a pid started at another time) is stale and taken over;
 *   - claims and table rewrites happen under an exclusive lock on <dir>/.lock (flock), so
 *     two runs never interleave them.
 * A claim held by a live process of another host is honoured: on a cluster whose node died,
 * remove that cells/<id>.claim by hand (fadkv-bench names it).
 */
#ifndef FK_CLAIM_H
#define FK_CLAIM_H

#include <stddef.h>

/* The directory lock: *fd >= 0 holds it until fk_store_unlock. Blocks until it is free. */
int fk_store_lock(const char *dir, int *fd);
void fk_store_unlock(int fd);

enum fk_claim_result {
    FK_CLAIM_OK = 0,             /* the cell is ours to compute (a stale claim was taken over) */
    FK_CLAIM_HELD = 1,           /* a live run computes it (holder says which) */
    FK_CLAIM_DONE = 2,           /* it finished meanwhile (another run): nothing to do */
};

/* Claims cell id under the directory lock (force: a finished cell is claimed too). Returns
 * an enum fk_claim_result, or an error (FK_EIO naming the claim file). holder (cap bytes)
 * receives "host pid N" of the run that holds it. */
int fk_results_claim(const char *dir, const char *id, int force, char *holder, size_t cap);
/* Releases our claim on cell id (after its .meta is written, or when it was abandoned). */
void fk_results_unclaim(const char *dir, const char *id);

/* Removes the temporary files (*.tmp) and claims of dir and dir/cells that dead processes of
 * this host left behind; returns how many files were removed. */
int fk_store_sweep_stale(const char *dir);

/* "<path>.<host>.<pid>.tmp" into out (cap bytes): FK_EINVAL when it does not fit. */
int fk_store_tmp_name(const char *path, char *out, size_t cap);

#endif
