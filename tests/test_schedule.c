/* SPDX-License-Identifier: MIT
 * The eviction schedule (engine/fk_schedule.h) against a naive model written here: a FIFO
 * buffer of token ids, filled by the prompt and then one token per decode step, evicting
 * its oldest min(a_len, held) tokens whenever it holds >= n_b tokens before an append
 * (spec algorithms.md section 4). Also the static codec's ahead-of-time blocks and the
 * per-token eviction steps.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fk_check_main.h"
#include "engine/fk_schedule.h"

#define MAXEV 4096
#define MAXT 2048

struct evlist {
    int n;
    struct fk_sched_event e[MAXEV];
};

/* The naive model: simulate the buffer token by token. */
static void naive_events(int T, int P, int n_b, int a_len, struct evlist *out)
{
    static int buf[MAXT];
    int head = 0, len = 0; /* buf[head .. head+len-1] are the buffered tokens, oldest first */
    out->n = 0;
    for (int t = 0; t < P; t++)
        buf[len++] = t;
    if (len > n_b) { /* prefill: everything but the last n_b tokens leaves */
        out->e[out->n++] = (struct fk_sched_event){0, -1, buf[head], buf[head] + len - n_b};
        head += len - n_b;
        len = n_b;
    }
    for (int t = P; t < T; t++) {
        if (len >= n_b && len > 0) {
            int ne = len < a_len ? len : a_len;
            out->e[out->n++] = (struct fk_sched_event){1, t - P, buf[head], buf[head] + ne};
            for (int i = 0; i < ne; i++) /* the evicted tokens are consecutive */
                ck_assert_int_eq(buf[head + i], buf[head] + i);
            head += ne;
            len -= ne;
        }
        buf[head + len++] = t;
        ck_assert_int_le(len, n_b > 0 ? n_b : 1);
    }
}

static void check_case(int T, int P, int n_b, int a_len)
{
    struct fk_sched s = {.n_tokens = T, .prompt_len = P, .n_b = n_b, .a_len = a_len};
    static struct evlist want, got;
    naive_events(T, P, n_b, a_len, &want);
    struct fk_sched_iter it;
    fk_sched_begin(&it, &s);
    got.n = 0;
    while (got.n < MAXEV && fk_sched_next(&it, &got.e[got.n]))
        got.n++;
    ck_assert_msg(got.n == want.n, "T %d P %d n_b %d a_len %d: %d events, expected %d", T, P,
                  n_b, a_len, got.n, want.n);
    int comp = 0;
    for (int i = 0; i < want.n; i++) {
        const struct fk_sched_event *a = &got.e[i], *b = &want.e[i];
        ck_assert_msg(a->phase == b->phase && a->step == b->step && a->first == b->first &&
                      a->end == b->end, "T %d P %d n_b %d a_len %d: event %d is (%d, %d, "
                      "%d..%d), expected (%d, %d, %d..%d)", T, P, n_b, a_len, i, a->phase,
                      a->step, a->first, a->end, b->phase, b->step, b->first, b->end);
        comp = a->end;
    }
    ck_assert_int_eq(fk_sched_next(&it, &got.e[0]), 0); /* stays finished */
    ck_assert_int_eq(fk_sched_final(&s), comp);
    ck_assert_int_eq(fk_sched_prefill_end(&s), want.n && want.e[0].phase == 0 ? want.e[0].end : 0);
    if (T <= n_b)
        ck_assert_int_eq(got.n, 0);

    /* eviction steps: the step of the event that evicts each token */
    static int32_t step[MAXT];
    fk_sched_evict_steps(&s, step);
    for (int t = 0; t < T; t++) {
        int w = -1;
        for (int i = 0; i < want.n; i++)
            if (want.e[i].phase == 1 && t >= want.e[i].first && t < want.e[i].end)
                w = want.e[i].step;
        ck_assert_int_eq(step[t], w);
    }

    /* static blocks of B tokens: contiguous from the prefill end to the final count; each
     * starts when an event first reaches past the blocks so far, carries its step, covers
     * at least B tokens and that whole event (or runs to the end) */
    const int B = 5;
    struct fk_sched_blocks bl;
    struct fk_sched_event e;
    fk_sched_blocks_begin(&bl, &s, B);
    int encoded = fk_sched_prefill_end(&s), wi = 0;
    while (fk_sched_blocks_next(&bl, &e)) {
        while (wi < want.n && (want.e[wi].phase == 0 || want.e[wi].end <= encoded))
            wi++;
        ck_assert_int_lt(wi, want.n);
        ck_assert_int_eq(e.phase, 1);
        ck_assert_int_eq(e.step, want.e[wi].step);
        ck_assert_int_eq(e.first, encoded);
        ck_assert(e.end == comp || (e.end - e.first >= B && e.end >= want.e[wi].end));
        ck_assert(e.end <= comp && e.end > e.first);
        ck_assert(e.end - e.first <= (B > want.e[wi].end - e.first ? B : want.e[wi].end - e.first));
        for (int t = e.first; t < e.end; t++) /* never encoded after its eviction */
            ck_assert_int_le(e.step, step[t]);
        encoded = e.end;
    }
    ck_assert_int_eq(encoded, comp);
}

START_TEST(test_boundaries)
{
    check_case(40, 20, 8, 1);   /* prefill longer than n_b, one token per step */
    check_case(40, 20, 8, 3);   /* a_len > 1, not dividing anything */
    check_case(41, 20, 8, 4);   /* a_len dividing n_b */
    check_case(40, 5, 8, 1);    /* prefill shorter than n_b: the first eviction at t = n_b */
    check_case(40, 5, 8, 3);
    check_case(40, 8, 8, 4);    /* prefill == n_b */
    check_case(40, 9, 8, 5);    /* prefill one longer than n_b */
    check_case(10, 6, 16, 1);   /* T <= n_b: nothing is ever evicted */
    check_case(16, 16, 16, 2);  /* T == n_b */
    check_case(9, 9, 8, 1);     /* no decode tokens */
    check_case(30, 0, 4, 2);    /* no prefill */
    check_case(30, 0, 0, 1);    /* no buffer at all: every token leaves at the next step */
    check_case(30, 12, 0, 3);
    check_case(50, 10, 7, 7);   /* a_len == n_b */
    check_case(50, 10, 7, 9);   /* a_len > n_b */
    check_case(1, 1, 0, 1);
}
END_TEST

START_TEST(test_sweep)
{
    for (int T = 0; T <= 40; T += 3)
        for (int P = 0; P <= T; P += 2)
            for (int n_b = 0; n_b <= 12; n_b += 3)
                for (int a_len = 1; a_len <= 7; a_len += 2)
                    check_case(T, P, n_b, a_len);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("schedule");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_boundaries);
    tcase_add_test(tc, test_sweep);
    suite_add_tcase(s, tc);
    return fk_suite_run(s);
}
