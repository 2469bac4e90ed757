/* SPDX-License-Identifier: MIT
 * train-dict as a library call (harness/train/fk_train_dict.h), in-process: the file it
 * writes, the provenance it records, what its hooks report, and that --compare keeps the
 * requested method's dictionary.
 */
#include <check.h>
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fk_check_main.h"
#include "common/fk_err.h"
#include "common/fk_sha256.h"
#include "formats/fk_dict.h"
#include "formats/fk_h5.h"
#include "formats/fk_trace.h"
#include "train/fk_train_dict.h"

static char g_dir[64];
static char g_traces[2][4200];
static char *g_paths[2];

static void setup(void)
{
    const char *src = getenv("FK_SRCDIR");
    ck_assert_msg(src, "FK_SRCDIR must name the source tree");
    strcpy(g_dir, "/tmp/fk-train-XXXXXX");
    ck_assert(mkdtemp(g_dir));
    for (int i = 0; i < 2; i++) {
        snprintf(g_traces[i], sizeof g_traces[i],
                 "%s/datasets/embedded/train/babyllama-tok105-%02d.h5", src, i);
        g_paths[i] = g_traces[i];
    }
    fk_hdf5_quiet();
}

static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    ck_assert_int_eq(system(cmd), 0);
}

struct seen {
    int loaded, methods_started, methods_done, progress;
    long vectors;
    double last_err;
    enum fk_train_method last;
};

static void on_loaded(void *ctx, int n_traces, int n_layers, int m, long vectors, double s)
{
    struct seen *w = ctx;
    (void)s;
    ck_assert_int_eq(n_traces, 2);
    ck_assert_int_eq(n_layers, 5);
    ck_assert_int_eq(m, 16);
    w->loaded++;
    w->vectors = vectors;
}

static void on_start(void *ctx, enum fk_train_method m)
{
    struct seen *w = ctx;
    w->methods_started++;
    w->last = m;
}

static void on_done(void *ctx, enum fk_train_method m, int epochs, double err, int n, double s)
{
    struct seen *w = ctx;
    (void)epochs;
    (void)s;
    ck_assert_int_eq((int)m, (int)w->last);
    ck_assert_int_eq(n, 10);
    ck_assert(err > 0 && err < 1);
    w->methods_done++;
    w->last_err = err;
}

static void on_progress(void *ctx, int layer, int kind, int epoch, double he, double te,
                        double s)
{
    struct seen *w = ctx;
    (void)layer, (void)kind, (void)epoch, (void)te, (void)s;
    ck_assert(he >= 0 && he <= 1);
    w->progress++;
}

static void cfg_init(struct fk_train_dict_cfg *c, const char *name)
{
    static char out[2][128];
    static int k;
    memset(c, 0, sizeof *c);
    fk_train_defaults(&c->o);
    c->o.n_atoms = 32;
    c->o.s = 4;
    c->o.epochs = 2;
    c->o.method = FK_TRAIN_BCD;
    c->o.jobs = 2;
    k ^= 1;
    snprintf(out[k], sizeof out[k], "%s/%s.h5", g_dir, name);
    c->out = out[k];
    c->traces = g_paths;
    c->n_traces = 2;
}

static void attr(const char *path, const char *name, char *buf, size_t cap)
{
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    ck_assert(f >= 0);
    ck_assert_int_eq(fk_h5_attr_str(f, path, name, buf, cap), FK_OK);
    H5Fclose(f);
}

START_TEST(test_writes_dictionary_with_provenance)
{
    struct fk_train_dict_cfg c;
    cfg_init(&c, "bcd");
    struct seen w = {0};
    struct fk_train_dict_hooks h = {.ctx = &w, .loaded = on_loaded, .method_start = on_start,
                                    .method_done = on_done, .progress = on_progress};
    ck_assert_msg(fk_train_dict_run(&c, &h) == FK_OK, "%s", fk_errmsg());
    ck_assert_int_eq(w.loaded, 1);
    ck_assert_int_eq(w.methods_started, 1);
    ck_assert_int_eq(w.methods_done, 1);
    ck_assert_int_eq(w.progress, 10 * 3); /* 10 dictionaries, initialisation + 2 epochs */
    struct fk_dict *d;
    ck_assert_int_eq(fk_dict_load(c.out, &d), FK_OK);
    ck_assert_int_eq(d->n_layers, 5);
    ck_assert_int_eq(d->n_atoms, 32);
    ck_assert_int_eq(d->head_dim, 16);
    for (long j = 0; j < 10L * 32; j++) {
        double n2 = 0;
        for (int i = 0; i < 16; i++)
            n2 += (double)d->atoms[j * 16 + i] * d->atoms[j * 16 + i];
        ck_assert(d->dead[j] ? n2 == 0 : fabs(n2 - 1) < 1e-5);
    }
    fk_dict_free(&d);
    char buf[8192], hex[65];
    attr(c.out, "method", buf, sizeof buf);
    ck_assert_str_eq(buf, "bcd");
    attr(c.out, "training_traces", buf, sizeof buf);
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(fk_sha256_file(g_paths[i], hex), FK_OK);
        char want[4300];
        snprintf(want, sizeof want, "%s sha256:%s", g_paths[i], hex);
        ck_assert_msg(strstr(buf, want), "training_traces = '%s' lacks '%s'", buf, want);
    }
    attr(c.out, "training_vectors", buf, sizeof buf);
    ck_assert_int_eq(atol(buf), w.vectors);
    attr(c.out, "heldout_rel_err", buf, sizeof buf);
    ck_assert(fabs(atof(buf) - w.last_err) < 1e-6);
}
END_TEST

/* --compare trains every method first (ending with bcd); the file holds the requested
 * method's atoms (here sample, which compare trains second). */
START_TEST(test_compare_keeps_requested_method)
{
    struct fk_train_dict_cfg a, b;
    cfg_init(&a, "plain");
    cfg_init(&b, "compare");
    a.o.method = b.o.method = FK_TRAIN_SAMPLE;
    b.compare = 1;
    struct seen w = {0};
    struct fk_train_dict_hooks h = {.ctx = &w, .method_start = on_start, .method_done = on_done};
    ck_assert_int_eq(fk_train_dict_run(&a, NULL), FK_OK);
    ck_assert_int_eq(fk_train_dict_run(&b, &h), FK_OK);
    ck_assert_int_eq(w.methods_done, 4); /* random, sample, lexico, bcd */
    ck_assert_int_eq((int)w.last, FK_TRAIN_BCD);
    struct fk_dict *da, *db;
    ck_assert_int_eq(fk_dict_load(a.out, &da), FK_OK);
    ck_assert_int_eq(fk_dict_load(b.out, &db), FK_OK);
    ck_assert(!memcmp(da->atoms, db->atoms, sizeof(float) * 10 * 32 * 16));
    fk_dict_free(&da);
    fk_dict_free(&db);
}
END_TEST

/* --keep-best: each dictionary is the one of its epoch with the lowest held-out error. The
 * oracle: a plain run stopped at that epoch (training is deterministic) gives the same atoms,
 * and the reported error is the mean of the per-dictionary minima. */
struct per_epoch {
    double he[10][5];
    double mean;
};

static void on_epoch(void *ctx, int layer, int kind, int epoch, double he, double te,
                     double s)
{
    struct per_epoch *w = ctx;
    (void)te, (void)s;
    ck_assert(epoch >= 0 && epoch < 5);
    w->he[layer * 2 + kind][epoch] = he;
}

static void on_mean(void *ctx, enum fk_train_method m, int epochs, double err, int n,
                    double s)
{
    (void)m, (void)epochs, (void)n, (void)s;
    ((struct per_epoch *)ctx)->mean = err;
}

START_TEST(test_keep_best_keeps_lowest_heldout_epoch)
{
    struct fk_train_dict_cfg c;
    cfg_init(&c, "best");
    c.o.epochs = 4;
    c.o.keep_best = 1;
    static struct per_epoch w;
    struct fk_train_dict_hooks h = {.ctx = &w, .progress = on_epoch, .method_done = on_mean};
    ck_assert_msg(fk_train_dict_run(&c, &h) == FK_OK, "%s", fk_errmsg());
    char out[128];
    snprintf(out, sizeof out, "%s", c.out); /* cfg_init reuses its two name buffers */
    struct fk_dict *best;
    ck_assert_int_eq(fk_dict_load(out, &best), FK_OK);
    double sum = 0;
    int not_last = 0;
    for (int slot = 0; slot < 10; slot++) {
        int e_min = 0;
        for (int e = 1; e <= 4; e++)
            if (w.he[slot][e] < w.he[slot][e_min])
                e_min = e;
        sum += w.he[slot][e_min];
        not_last += e_min != 4;
        struct fk_train_dict_cfg p;
        cfg_init(&p, "plain");
        p.o.epochs = e_min;
        if (e_min == 0)
            p.o.method = FK_TRAIN_SAMPLE; /* the initialisation alone */
        ck_assert_int_eq(fk_train_dict_run(&p, NULL), FK_OK);
        struct fk_dict *d;
        ck_assert_int_eq(fk_dict_load(p.out, &d), FK_OK);
        size_t off = (size_t)slot * 32 * 16;
        ck_assert_msg(!memcmp(best->atoms + off, d->atoms + off, sizeof(float) * 32 * 16),
                      "dictionary %d: not the atoms of epoch %d", slot, e_min);
        fk_dict_free(&d);
    }
    fk_dict_free(&best);
    ck_assert(fabs(w.mean - sum / 10) < 1e-12);
    char buf[256];
    attr(out, "selection", buf, sizeof buf);
    ck_assert_str_eq(buf, "lowest held-out epoch");
    ck_assert_int_gt(not_last, 0); /* the data exercise the selection */
}
END_TEST

START_TEST(test_bad_options)
{
    struct fk_train_dict_cfg c;
    cfg_init(&c, "bad");
    c.o.heldout_frac = 1;
    ck_assert_int_eq(fk_train_dict_run(&c, NULL), FK_EINVAL);
    ck_assert(strstr(fk_errmsg(), "heldout"));
    cfg_init(&c, "bad");
    c.n_traces = 0;
    ck_assert_int_eq(fk_train_dict_run(&c, NULL), FK_EINVAL);
    cfg_init(&c, "bad");
    char missing[] = "/nonexistent/trace.h5";
    char *paths[1] = {missing};
    c.traces = paths;
    c.n_traces = 1;
    ck_assert_int_lt(fk_train_dict_run(&c, NULL), 0);
    ck_assert(strstr(fk_errmsg(), "/nonexistent/trace.h5"));
    ck_assert_int_ne(access(c.out, F_OK), 0); /* nothing written */
}
END_TEST

int main(void)
{
    Suite *s = suite_create("train_dict");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_writes_dictionary_with_provenance);
    tcase_add_test(tc, test_compare_keeps_requested_method);
    tcase_add_test(tc, test_bad_options);
    tcase_add_test(tc, test_keep_best_keeps_lowest_heldout_epoch);
    suite_add_tcase(s, tc);
    return fk_suite_run(s);
}
