/* SPDX-License-Identifier: MIT
 * The eviction schedule (see fk_schedule.h). Spec: algorithms.md section 4.
 */
#include "engine/fk_schedule.h"

int fk_sched_prefill_end(const struct fk_sched *s)
{
    if (s->mode == FK_BUF_BLOCK_ALL)
        return s->prompt_len;
    if (s->mode == FK_BUF_BLOCK)
        return s->n_b > 0 ? s->prompt_len / s->n_b * s->n_b : 0;
    return s->prompt_len > s->n_b ? s->prompt_len - s->n_b : 0;
}

void fk_sched_begin(struct fk_sched_iter *it, const struct fk_sched *s)
{
    it->s = *s;
    it->t = -1;
    it->comp = 0;
}

int fk_sched_next(struct fk_sched_iter *it, struct fk_sched_event *ev)
{
    const struct fk_sched *s = &it->s;
    if (it->t < 0) {
        it->t = s->prompt_len;
        it->comp = fk_sched_prefill_end(s);
        if (it->comp > 0) {
            *ev = (struct fk_sched_event){.phase = 0, .step = -1, .first = 0, .end = it->comp};
            return 1;
        }
    }
    for (; it->t < s->n_tokens && s->mode != FK_BUF_SLIDE; it->t++) {
        if (s->n_b < 1 || it->t + 1 - it->comp < s->n_b)
            continue;
        /* the block comp .. t is full: handed over after t's attention */
        *ev = (struct fk_sched_event){.phase = 1, .step = it->t - s->prompt_len,
                                      .first = it->comp, .end = it->t + 1};
        it->comp = it->t + 1;
        it->t++;
        return 1;
    }
    for (; it->t < s->n_tokens; it->t++) {
        int held = it->t - it->comp; /* tokens comp .. t-1 sit in the buffer */
        if (held < s->n_b || held == 0)
            continue;
        int ne = s->a_len < held ? s->a_len : held;
        *ev = (struct fk_sched_event){.phase = 1, .step = it->t - s->prompt_len,
                                      .first = it->comp, .end = it->comp + ne};
        it->comp += ne;
        it->t++;
        return 1;
    }
    return 0;
}

int fk_sched_final(const struct fk_sched *s)
{
    struct fk_sched_iter it;
    struct fk_sched_event ev;
    int comp = 0;
    fk_sched_begin(&it, s);
    while (fk_sched_next(&it, &ev))
        comp = ev.end;
    return comp;
}

void fk_sched_evict_steps(const struct fk_sched *s, int32_t *step)
{
    struct fk_sched_iter it;
    struct fk_sched_event ev;
    for (int t = 0; t < s->n_tokens; t++)
        step[t] = -1;
    fk_sched_begin(&it, s);
    while (fk_sched_next(&it, &ev))
        for (int t = ev.first; ev.phase == 1 && t < ev.end; t++)
            step[t] = ev.step;
}

void fk_sched_blocks_begin(struct fk_sched_blocks *b, const struct fk_sched *s, int block)
{
    fk_sched_begin(&b->ev, s);
    b->block = block < 1 ? 1 : block;
    b->encoded = fk_sched_prefill_end(s);
    b->final = fk_sched_final(s);
}

int fk_sched_blocks_next(struct fk_sched_blocks *b, struct fk_sched_event *ev)
{
    struct fk_sched_event e;
    while (fk_sched_next(&b->ev, &e)) {
        if (e.phase != 1 || e.end <= b->encoded)
            continue;
        int end = b->encoded + b->block;
        end = end < e.end ? e.end : end;
        end = end > b->final ? b->final : end;
        *ev = (struct fk_sched_event){.phase = 1, .step = e.step, .first = b->encoded,
                                      .end = end};
        b->encoded = end;
        return 1;
    }
    return 0;
}
