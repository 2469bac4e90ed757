/* SPDX-License-Identifier: MIT
 * The eviction schedule (engine/fk_schedule.h) against a naive model written here: a FIFO
 * buffer of token ids, filled by the prompt and then one token per decode step, evicting
 * its oldest min(a_len, held) tokens whenever it holds >= n_b tokens before an append
 * (spec algorithms.md section 4); and for the block rules (KIVI's keys, Hugging Face's
 * QuantizedCache) a list of exact tokens that is flushed whole, the current token included,
 * once it holds n_b tokens. Also the static codec's ahead-of-time blocks and the per-token
 * eviction steps.
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

/* The block rules, written as KIVI's key state machine (families.md 1.1): the prefill
 * quantises all but its last P mod R tokens (BLOCK) or all of them (BLOCK_ALL); each decode
 * token is appended to the exact list, and a list of R tokens is flushed whole. */
static void naive_block_events(int T, int P, int R, int all, struct evlist *out)
{
    out->n = 0;
    int n_exact = all ? 0 : P % R; /* the exact list is tokens first .. first+n_exact-1 */
    int first = P - n_exact;
    if (first > 0)
        out->e[out->n++] = (struct fk_sched_event){0, -1, 0, first};
    for (int t = P; t < T; t++) {
        n_exact++; /* append t; attention would run here; then the flush */
        if (n_exact == R) {
            out->e[out->n++] = (struct fk_sched_event){1, t - P, first, t + 1};
            first = t + 1;
            n_exact = 0;
        }
        ck_assert_int_lt(n_exact, R);
    }
}

static void check_mode(int T, int P, int n_b, int a_len, int mode)
{
    struct fk_sched s = {.n_tokens = T, .prompt_len = P, .n_b = n_b, .a_len = a_len,
                         .mode = mode};
    static struct evlist want, got;
    if (mode == FK_BUF_SLIDE)
        naive_events(T, P, n_b, a_len, &want);
    else
        naive_block_events(T, P, n_b, mode == FK_BUF_BLOCK_ALL, &want);
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
    if (T <= n_b && mode == FK_BUF_SLIDE)
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

static void check_case(int T, int P, int n_b, int a_len)
{
    check_mode(T, P, n_b, a_len, FK_BUF_SLIDE);
}

START_TEST(test_blocks)
{
    /* KIVI's keys at R = 4: prefill below, equal to, above R and a multiple of it */
    for (int all = 0; all < 2; all++) {
        int mode = all ? FK_BUF_BLOCK_ALL : FK_BUF_BLOCK;
        check_mode(20, 3, 4, 1, mode);
        check_mode(20, 4, 4, 1, mode);
        check_mode(20, 6, 4, 1, mode);
        check_mode(20, 8, 4, 1, mode);
        check_mode(20, 0, 4, 1, mode);
        check_mode(7, 7, 4, 1, mode);   /* no decode step */
        check_mode(12, 2, 1, 1, mode);  /* R = 1: every token leaves at its own step */
    }
    /* the hand-written case: P = 6, R = 4: prefill 0..3, then 4..7 at step 2 (token 7) */
    struct fk_sched s = {.n_tokens = 12, .prompt_len = 6, .n_b = 4, .mode = FK_BUF_BLOCK};
    struct fk_sched_iter it;
    struct fk_sched_event e;
    fk_sched_begin(&it, &s);
    ck_assert(fk_sched_next(&it, &e) && e.phase == 0 && e.first == 0 && e.end == 4);
    ck_assert(fk_sched_next(&it, &e) && e.step == 1 && e.first == 4 && e.end == 8);
    ck_assert(fk_sched_next(&it, &e) && e.step == 5 && e.first == 8 && e.end == 12);
    ck_assert(!fk_sched_next(&it, &e));
    s.mode = FK_BUF_BLOCK_ALL;
    fk_sched_begin(&it, &s);
    ck_assert(fk_sched_next(&it, &e) && e.phase == 0 && e.first == 0 && e.end == 6);
    ck_assert(fk_sched_next(&it, &e) && e.step == 3 && e.first == 6 && e.end == 10);
    ck_assert(!fk_sched_next(&it, &e));
    for (int T = 0; T <= 30; T += 3)
        for (int P = 0; P <= T; P += 2)
            for (int R = 1; R <= 9; R += 2) {
                check_mode(T, P, R, 1, FK_BUF_BLOCK);
                check_mode(T, P, R, 1, FK_BUF_BLOCK_ALL);
            }
}
END_TEST

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
    tcase_add_test(tc, test_blocks);
    suite_add_tcase(s, tc);
    return fk_suite_run(s);
}
