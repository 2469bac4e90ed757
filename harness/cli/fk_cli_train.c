/* SPDX-License-Identifier: MIT
 * `fadkv-bench train-dict`: arguments and printing (the work: train/fk_train_dict.h).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/fk_cli.h"
#include "common/fk_clock.h"
#include "common/fk_err.h"
#include "train/fk_train_dict.h"



static void usage(FILE *f)
{
    fprintf(f,
            "usage: fadkv-bench train-dict --out DICT.h5 [--atoms N] [--sparsity s]\n"
            "       [--method bcd|lexico|sample|random] [--epochs E] [--seed S]\n"
            "       [--heldout FRAC] [--max-train n] [--lr LR] [--batch B] [--jobs J]\n"
            "       [--keep-best] [--compare] [--quiet] TRACE.h5...\n"
            "Trains one dictionary of N unit atoms per (layer, kind) on the keys and values of\n"
            "the calibration traces (never the evaluation traces), holding out every\n"
            "1/FRAC-th vector to report the held-out relative OMP error after each epoch.\n"
            "--compare trains with every method and prints held-out error and time of each.\n"
            "--keep-best keeps each dictionary's epoch (initialisation included) with the\n"
            "lowest held-out error instead of the last epoch.\n"
            "Defaults: N 4096, s 8, method bcd, 8 epochs, seed 1, heldout 0.1, lr 1e-3.\n");
}

struct progress {
    int quiet;
    int N, s;
};

static void on_progress(void *ctx, int layer, int kind, int epoch, double he, double te,
                        double sec)
{
    struct progress *p = ctx;
    if (p->quiet)
        return;
    if (isnan(te))
        fprintf(stderr, "  L%02d %s epoch %2d: held-out rel err %.4f  (%.1f s)\n", layer,
                kind ? "V" : "K", epoch, he, sec);
    else
        fprintf(stderr, "  L%02d %s epoch %2d: held-out rel err %.4f, train %.4f  (%.1f s)\n",
                layer, kind ? "V" : "K", epoch, he, te, sec);
}

static void on_loaded(void *ctx, int n_traces, int n_layers, int head_dim, long vectors,
                      double seconds)
{
    const struct progress *p = ctx;
    if (!p->quiet)
        fprintf(stderr, "train-dict: %d trace(s), %d layers x {K,V}, head_dim %d, %ld vectors "
                        "(%.1f s to load)\n", n_traces, n_layers, head_dim, vectors, seconds);
}

static void on_method_start(void *ctx, enum fk_train_method m)
{
    const struct progress *p = ctx;
    if (!p->quiet)
        fprintf(stderr, "method %s:\n", fk_train_method_names[m]);
}

static void on_method_done(void *ctx, enum fk_train_method m, int epochs, double err,
                           int n_dicts, double seconds)
{
    const struct progress *p = ctx;
    printf("train-dict: method %-7s N %d s %d epochs %d: held-out rel err %.4f (mean over "
           "%d dictionaries), %.1f s\n", fk_train_method_names[m], p->N, p->s, epochs, err,
           n_dicts, seconds);
}

/* One option with its value (returns 1), a flag (1), a trace (1), or a usage error (-1). */
static int parse_one(struct fk_train_dict_cfg *c, struct progress *p, char **argv, int argc,
                     int *i)
{
    const char *a = argv[*i], *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    struct fk_train_opts *o = &c->o;
    int *num = !strcmp(a, "--atoms")      ? &o->n_atoms
               : !strcmp(a, "--sparsity") ? &o->s
               : !strcmp(a, "--epochs")   ? &o->epochs
               : !strcmp(a, "--batch")    ? &o->batch
               : !strcmp(a, "--jobs")     ? &o->jobs
                                          : NULL;
    double *real = !strcmp(a, "--heldout") ? &o->heldout_frac : !strcmp(a, "--lr") ? &o->lr : NULL;
    if (!strcmp(a, "--compare"))
        c->compare = 1;
    else if (!strcmp(a, "--quiet"))
        p->quiet = 1;
    else if (!strcmp(a, "--keep-best"))
        o->keep_best = 1;
    else if ((num || real) && v)
        num ? (void)(*num = atoi(argv[++*i])) : (void)(*real = atof(argv[++*i]));
    else if (!strcmp(a, "--out") && v)
        c->out = argv[++*i];
    else if (!strcmp(a, "--seed") && v)
        o->seed = strtoull(argv[++*i], NULL, 10);
    else if (!strcmp(a, "--max-train") && v)
        c->max_load = atol(argv[++*i]);
    else if (!strcmp(a, "--method") && v) {
        const char *m = argv[++*i];
        int found = -1;
        for (int k = 0; fk_train_method_names[k]; k++)
            if (!strcmp(m, fk_train_method_names[k]))
                found = k;
        if (found < 0) {
            fprintf(stderr, "fadkv-bench train-dict: --method %s: expected bcd, lexico, "
                            "sample or random\n", m);
            return -1;
        }
        o->method = (enum fk_train_method)found;
    } else if (a[0] == '-') {
        fprintf(stderr, "fadkv-bench train-dict: unknown or incomplete option '%s'\n", a);
        usage(stderr);
        return -1;
    } else
        ((char **)c->traces)[c->n_traces++] = argv[*i];
    return 1;
}

int fk_cli_train_dict(int argc, char **argv)
{
    struct fk_train_dict_cfg c = {0};
    struct progress p = {0};
    fk_train_defaults(&c.o);
    char **paths = calloc((size_t)argc + 1, sizeof(char *));
    if (!paths)
        return 1;
    c.traces = paths;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            free(paths);
            return 0;
        }
        if (parse_one(&c, &p, argv, argc, &i) < 0) {
            free(paths);
            return 2;
        }
    }
    if (fk_train_dict_check(&c) < 0) {
        fprintf(stderr, "fadkv-bench train-dict: %s\n", fk_errmsg());
        usage(stderr);
        free(paths);
        return 2;
    }
    p.N = c.o.n_atoms;
    p.s = c.o.s;
    struct fk_train_dict_hooks h = {.ctx = &p, .loaded = on_loaded,
                                    .method_start = on_method_start,
                                    .method_done = on_method_done, .progress = on_progress};
    double t0 = fk_wall_s();
    int rc = fk_train_dict_run(&c, &h);
    free(paths);
    if (rc < 0) {
        fprintf(stderr, "fadkv-bench train-dict: %s\n", fk_errmsg());
        return 1;
    }
    printf("train-dict: wrote %s (%.1f s)\n", c.out, fk_wall_s() - t0);
    return 0;
}
