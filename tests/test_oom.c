/* SPDX-License-Identifier: MIT
 * Out-of-memory paths of the sweep runner and the replay benchmark: every allocation they
 * make (malloc, calloc, realloc, through the linker's --wrap) is made to fail in turn. A run
 * must then either return an error or, where the allocation was optional (the estimate of
 * the time left, the Gram buffer pool), succeed with exactly the clean run's results: never
 * crash, never report a success it did not have.
 * Under AddressSanitizer (CI) a leak on any of these paths fails the suite too.
 * The process-wide set-up of the CLI is checked here as well: after fk_cli_init, a GSL
 * error is returned to the caller instead of aborting the process.
 */
#include <check.h>
#include <stdatomic.h>
#include <gsl/gsl_rng.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fk_check_main.h"
#include "bench/fk_bench_replay.h"
#include "cli/fk_cli.h"
#include "common/fk_err.h"
#include "engine/fk_sweep.h"
#include "runner/fk_runner.h"

/* ---- allocation failure injection ------------------------------------------------------ */

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_realloc(void *p, size_t n);

static _Atomic long g_count; /* allocations seen while armed */
static long g_fail_at; /* fail the allocation with this 1-based number (0: none) */
static int g_armed, g_failed;

/* Called at the injected failure: a place for a debugger's breakpoint
 * (gdb -ex 'break oom_hit' ...) to see which allocation it was. */
__attribute__((noinline)) static void oom_hit(void)
{
    g_failed = 1;
    __asm__ volatile("" ::: "memory");
}

static int inject(void)
{
    if (!g_armed)
        return 0;
    if (++g_count == g_fail_at) {
        oom_hit();
        return 1;
    }
    return 0;
}

void *__wrap_malloc(size_t n) { return inject() ? NULL : __real_malloc(n); }
void *__wrap_calloc(size_t n, size_t size) { return inject() ? NULL : __real_calloc(n, size); }
void *__wrap_realloc(void *p, size_t n) { return inject() ? NULL : __real_realloc(p, n); }

/* ---- a tiny sweep on the embedded data ----------------------------------------------- */

static char g_dir[] = "/tmp/fk-oom-XXXXXX";
static char g_toml[4200];

static void setup(void)
{
    const char *src = getenv("FK_SRCDIR");
    ck_assert_msg(src, "FK_SRCDIR must name the source tree");
    strcpy(g_dir, "/tmp/fk-oom-XXXXXX");
    ck_assert(mkdtemp(g_dir));
    snprintf(g_toml, sizeof g_toml, "%s/sweep.toml", g_dir);
    FILE *f = fopen(g_toml, "w");
    ck_assert(f);
    fprintf(f,
            "[sweep]\nname = \"oom\"\noutput = \"%s/out\"\njobs = 2\nattention = true\n"
            "attn_stride = 8\nrecall = true\n"
            "[[dataset]]\nname = \"babyllama\"\n"
            "traces = [\"%s/datasets/embedded/babyllama-tok105-00.h5\"]\n"
            "dictionary = \"%s/datasets/dicts/babyllama-tok105.h5\"\n"
            "defaults = { s = 4, n = 32, n_b = 16 }\n"
            "[[codec]]\nname = \"full\"\n[[codec]]\nname = \"lexico\"\n"
            "[[codec]]\nname = \"fadkv\"\n",
            g_dir, src, src);
    fclose(f);
}

static void teardown(void)
{
    char cmd[4300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    ck_assert_int_eq(system(cmd), 0);
}

/* cells.csv of the run, timing columns dropped (malloc'd; NULL if unreadable). */
static char *results_table(void)
{
    static const char *const timing[] = {"wall_s", "cpu_us_per_vec", "cpu_time_rel", NULL};
    char p[4300], line[1 << 15];
    snprintf(p, sizeof p, "%s/out/cells.csv", g_dir);
    FILE *f = fopen(p, "r");
    if (!f)
        return NULL;
    size_t cap = 1 << 20, len = 0;
    char *out = __real_malloc(cap);
    int drop[512] = {0};
    for (int row = 0; out && fgets(line, sizeof line, f); row++) {
        line[strcspn(line, "\n")] = 0;
        int col = 0;
        for (char *c = line, *end; c; c = end ? end + 1 : NULL, col++) {
            end = strchr(c, ',');
            size_t n = end ? (size_t)(end - c) : strlen(c);
            for (int t = 0; row == 0 && col < 512 && timing[t]; t++)
                drop[col] |= strlen(timing[t]) == n && !strncmp(c, timing[t], n);
            if ((col < 512 && drop[col]) || len + n + 3 > cap)
                continue;
            memcpy(out + len, c, n);
            len += n;
            out[len++] = ',';
        }
        out[len++] = '\n';
    }
    fclose(f);
    if (out)
        out[len] = 0;
    return out;
}

static char *g_clean; /* results_table() of the clean run */

static int run_sweep_once(void)
{
    struct fk_sweep *s = NULL;
    const char *force[1] = {"sweep.jobs=1"};
    int rc = fk_sweep_load(g_toml, force, 1, 1, &s);
    if (rc == FK_OK) {
        struct fk_runner_opts o = {.force = 1, .shard_n = 1};
        struct fk_runner_summary sum;
        rc = fk_runner_run(s, &o, &sum);
        if (rc == FK_OK && sum.failed)
            rc = FK_ENOMEM; /* a cell whose replay ran out of memory is a failed cell */
    }
    fk_sweep_free(&s);
    return rc;
}

static int run_bench_once(void)
{
    struct fk_bench_replay_cfg c;
    fk_bench_replay_defaults(&c);
    c.config = g_toml;
    c.jobs = 1;
    c.ref_layers = 1;
    c.scale_layers = 1;
    c.rounds = 1;
    c.kernel = 0;
    static struct fk_bench_replay_result r; /* not allocated: allocations are counted */
    int rc = fk_bench_replay_run(&c, NULL, &r);
    /* the run is over: Check's own allocations (a passing ck_assert records its location
     * with one in CK_FORK=no) must not be the one made to fail */
    g_armed = 0;
    /* a success has every part: the cells, the reference comparison, one round */
    if (rc == FK_OK)
        ck_assert(r.cells_rss_kib > 0 && r.ref_done && r.rounds == 1 && r.rows > 0);
    return rc;
}

/* Counts the allocations of a clean run, then fails each of the first `dense` ones (the
 * set-up) and `dense` more evenly spread over the rest; each such run must fail, or give
 * the clean run's results. Returns the count. */
static long sweep_failures(int (*once)(void), long dense)
{
    g_fail_at = 0;
    g_count = 0;
    g_armed = 1;
    int rc = once();
    g_armed = 0;
    ck_assert_msg(rc == FK_OK, "the clean run failed: %s", fk_errmsg());
    g_clean = results_table();
    ck_assert(g_clean);
    long total = g_count, step = total > 2 * dense ? (total - dense) / dense : 1;
    for (long k = 1; k <= total; k += k < dense ? 1 : step) {
        g_fail_at = k;
        g_count = 0;
        g_failed = 0;
        g_armed = 1;
        rc = once();
        g_armed = 0;
        if (!g_failed || rc < 0)
            continue;
        char *t = results_table();
        ck_assert_msg(t && !strcmp(t, g_clean), "allocation %ld of %ld failed, the run "
                      "returned success, and its results differ from a clean run's", k, total);
        free(t);
    }
    free(g_clean);
    return total;
}

START_TEST(test_runner_oom)
{
    long n = sweep_failures(run_sweep_once, 300);
    ck_assert_msg(n > 100, "only %ld allocations counted: is --wrap in effect?", n);
}
END_TEST

START_TEST(test_bench_replay_oom)
{
    long n = sweep_failures(run_bench_once, 300);
    ck_assert_msg(n > 100, "only %ld allocations counted: is --wrap in effect?", n);
}
END_TEST

/* GSL's default error handler aborts; after fk_cli_init the error comes back as a value. */
START_TEST(test_gsl_handler_off)
{
    fk_cli_init();
    gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
    ck_assert(r);
    ck_assert_uint_eq(gsl_rng_uniform_int(r, 0), 0); /* n = 0 is a GSL_EINVAL error */
    gsl_rng_free(r);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("oom");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_runner_oom);
    tcase_add_test(tc, test_bench_replay_oom);
    tcase_add_test(tc, test_gsl_handler_off);
    suite_add_tcase(s, tc);
    return fk_suite_run(s);
}
