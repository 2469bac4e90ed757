/* SPDX-License-Identifier: MIT
 * The codec driver of the replay engine: opens a unit's K and V codec states, runs them
 * through the eviction schedule (fk_schedule.h), reports every committed event and every
 * decode step to the observers (fk_observe.h), lets them write their results, and closes
 * the states, on success and on every error path alike.
 *
 * Order (spec section 4): the prefill event of K, then (a static codec) K's decode blocks,
 * then the same for V; then each decode step: FK_STEP_BEGIN (attention sees the cache
 * before the step's eviction), the step's eviction (K, then V; a static codec's were
 * encoded ahead), FK_STEP_END.
 *
 * With a token-eviction policy (fk_unit.evict, core/fk_evict.h): after the prefill events
 * the prefill hook, then at each decode token t, before FK_STEP_BEGIN, token t's mask bits
 * and the decode hook; FK_STEP_BEGIN carries the rows the hooks dropped. The codec codes
 * every row its schedule hands over, dropped or not (its event order stays the one it was
 * written for); a dropped row is never read again and never counted (fk_observe.c).
 */
#ifndef FK_DRIVE_H
#define FK_DRIVE_H

#include <stddef.h>
#include <stdint.h>

#include "engine/fk_observe.h"

#define FK_STATIC_BLOCK 32 /* decode tokens per block of a static codec (x KV heads vectors) */

/* Per-worker driver: the observers and the event buffers, reused from unit to unit. */
struct fk_drive {
    struct fk_obs_set obs;
    float *x;                    /* [cap_x] the vectors of one event, [n][m] */
    int32_t *tok, *head;         /* [cap_n] their tokens and heads */
    struct fk_vec_out *out;      /* [cap_n] what encode() reported */
    float *xr;                   /* [cap_xr] one reconstructed row */
    size_t cap_xr;
    int32_t *evict_step;         /* [cap_es] decode step evicting each token (static codecs) */
    size_t cap_x, cap_n, cap_es;
    /* a token-eviction policy (fk_unit.evict): its state, the mask as last notified and
     * the rows dropped since */
    void *pst;
    uint8_t *prev;
    int32_t *dropped;
    size_t cap_mask;
    int n_dropped;
    int seen;                    /* the newest token whose mask bits the policy has set */
    float *kvw[2];               /* [cap_kvw] the rows the row rewrites left (fk_unit.kvw) */
    size_t cap_kvw;
};

int fk_drive_init(struct fk_drive *d);
void fk_drive_free(struct fk_drive *d);

/* Replays unit u (u->st[] NULL, n_comp 0 on entry) and writes its results into r. On
 * return the codec states are closed (u->st[] NULL) whatever happened; on error, what r
 * already holds is freed with the cell result. */
int fk_drive_unit(struct fk_drive *d, struct fk_unit *u, struct fk_unit_result *r);

#endif
