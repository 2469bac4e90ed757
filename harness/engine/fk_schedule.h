/* SPDX-License-Identifier: MIT
 * The eviction schedule of spec algorithms.md section 4 as plain arithmetic: which tokens
 * leave the full-precision buffer, at which step and in which event. No I/O, no codec: the
 * replay driver (fk_drive.h) walks it, and tests check it against a token-by-token model.
 *
 * SLIDE (the default): if P > n_b, tokens 0 .. P-n_b-1 are one event (phase 0, step -1).
 * Decode token t (P <= t < T, step t - P): if the buffer holds >= n_b tokens before t is
 * appended, its oldest min(a_len, held) tokens are one event (phase 1). Events with no
 * token (n_b = 0 and an empty buffer) are not listed: they code nothing.
 * BLOCK: the prefill event is tokens 0 .. floor(P/n_b)*n_b - 1; decode token t ends a block
 * when t + 1 - (tokens compressed) == n_b, and the block (t included) is its step's event.
 * BLOCK_ALL: as BLOCK, with the prefill event 0 .. P-1. (core/fk_codec.h, enum fk_buf_mode.)
 */
#ifndef FK_SCHEDULE_H
#define FK_SCHEDULE_H

#include <stdint.h>

#include "core/fk_codec.h"

struct fk_sched {
    int n_tokens;                /* T */
    int prompt_len;              /* P (<= T) */
    int n_b;                     /* full-precision buffer, tokens (>= 0) */
    int a_len;                   /* tokens per eviction event (>= 1; SLIDE only) */
    int mode;                    /* enum fk_buf_mode (0 = SLIDE); BLOCK modes need n_b >= 1 */
};

struct fk_sched_event {
    int phase;                   /* 0 prefill, 1 decode */
    int step;                    /* decode step t - P of the event, -1 in prefill */
    int first, end;              /* tokens first .. end-1 are evicted together */
};

/* A walk over the events in order (fk_sched_begin, then fk_sched_next until it returns 0). */
struct fk_sched_iter {
    struct fk_sched s;
    int t;                       /* next decode token to look at; -1 before the prefill */
    int comp;                    /* tokens evicted so far */
};

void fk_sched_begin(struct fk_sched_iter *it, const struct fk_sched *s);
/* The next event into *ev: 1, or 0 when there is none left (*ev untouched). */
int fk_sched_next(struct fk_sched_iter *it, struct fk_sched_event *ev);

/* Tokens compressed at the end of prefill: max(P - n_b, 0) (SLIDE), floor(P/n_b)*n_b
 * (BLOCK), P (BLOCK_ALL). */
int fk_sched_prefill_end(const struct fk_sched *s);
/* Tokens compressed after the last decode step. */
int fk_sched_final(const struct fk_sched *s);
/* step[t] = the decode step whose event evicts token t, -1 for prefill and never-evicted
 * tokens; step has n_tokens entries. */
void fk_sched_evict_steps(const struct fk_sched *s, int32_t *step);

/* The decode blocks of a static codec (FK_CAP_STATIC), encoded ahead of their eviction:
 * walking the decode events, whenever one reaches past what is encoded, the next block
 * runs from there over at least `block` tokens and the whole event, at most up to
 * fk_sched_final; it carries that event's phase and step. The blocks cover
 * fk_sched_prefill_end .. fk_sched_final without gap or overlap. */
struct fk_sched_blocks {
    struct fk_sched_iter ev;     /* the decode events */
    int block;                   /* minimum block, tokens (>= 1) */
    int encoded;                 /* tokens covered so far */
    int final;                   /* fk_sched_final */
};

void fk_sched_blocks_begin(struct fk_sched_blocks *b, const struct fk_sched *s, int block);
/* The next block into *ev: 1, or 0 when there is none left. */
int fk_sched_blocks_next(struct fk_sched_blocks *b, struct fk_sched_event *ev);

#endif
