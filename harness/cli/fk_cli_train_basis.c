/* SPDX-License-Identifier: MIT
 * `fadkv-bench train-basis`: arguments and printing (the work: train/fk_train_basis.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/fk_cli.h"
#include "common/fk_clock.h"
#include "common/fk_err.h"
#include "train/fk_train_basis.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: fadkv-bench train-basis --out BASIS.h5 [--group g] [--max-rank k] [--quiet]\n"
            "       TRACE.h5...\n"
            "Computes, per (layer, kind) and group of g consecutive KV heads (g divides H_kv;\n"
            "default 1), the mean and the eigen-decompositions of the covariance (centered)\n"
            "and of the second moment (uncentered) of the calibration traces' vectors\n"
            "(never the evaluation traces), accumulated in double, and writes a basis file\n"
            "(datasets/BASIS.md) for the low-rank codecs (pca; dataset key `basis`). Keys are\n"
            "also un-rotated to pre-RoPE when every trace describes its RoPE (rope_layout).\n"
            "--max-rank keeps the k leading components (default all g x head_dim).\n");
}

struct progress {
    int quiet;
};

static void on_opened(void *ctx, int n_traces, int n_layers, int n_kv, int head_dim,
                      long tokens, int pre)
{
    const struct progress *p = ctx;
    if (!p->quiet)
        fprintf(stderr, "train-basis: %d trace(s), %d layers x %d KV heads, head_dim %d, %ld "
                        "tokens; pre-RoPE keys: %s\n", n_traces, n_layers, n_kv, head_dim,
                tokens, pre ? "yes" : "no (not every trace has rope_layout)");
}

static void on_layer(void *ctx, int layer, const double k[3], const double v[3], double sec)
{
    const struct progress *p = ctx;
    if (!p->quiet)
        fprintf(stderr, "  L%02d energy in the first 1/8, 1/4, 1/2 of the components: K %.3f "
                        "%.3f %.3f, V %.3f %.3f %.3f (%.1f s)\n", layer, k[0], k[1], k[2],
                v[0], v[1], v[2], sec);
}

/* One option with its value, a flag or a trace; -1 on a usage error (printed). */
static int parse_one(struct fk_train_basis_cfg *c, struct progress *p, char **argv, int argc,
                     int *i)
{
    const char *a = argv[*i], *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    if (!strcmp(a, "--quiet")) {
        p->quiet = 1;
    } else if (!strcmp(a, "--out") && v) {
        c->out = argv[++*i];
    } else if ((!strcmp(a, "--group") || !strcmp(a, "--max-rank")) && v) {
        char *end;
        long x = strtol(argv[++*i], &end, 10);
        if (*end || x < 1 || x > (1 << 24)) {
            fprintf(stderr, "fadkv-bench train-basis: %s %s: expected an integer >= 1\n", a, v);
            return -1;
        }
        *(!strcmp(a, "--group") ? &c->group : &c->max_rank) = (int)x;
    } else if (a[0] == '-') {
        fprintf(stderr, "fadkv-bench train-basis: unknown or incomplete option '%s'\n", a);
        usage(stderr);
        return -1;
    } else {
        ((char **)c->traces)[c->n_traces++] = argv[*i];
    }
    return 1;
}

int fk_cli_train_basis(int argc, char **argv)
{
    struct fk_train_basis_cfg c = {0};
    struct progress p = {0};
    char **paths = calloc((size_t)argc + 1, sizeof(char *));
    if (!paths)
        return 1;
    c.traces = paths;
    int rc = 0;
    for (int i = 1; i < argc && !rc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            free(paths);
            return 0;
        }
        if (parse_one(&c, &p, argv, argc, &i) < 0)
            rc = 2;
    }
    if (!rc && fk_train_basis_check(&c) < 0) {
        fprintf(stderr, "fadkv-bench train-basis: %s\n", fk_errmsg());
        usage(stderr);
        rc = 2;
    }
    double t0 = fk_wall_s();
    struct fk_train_basis_hooks h = {.ctx = &p, .opened = on_opened, .layer_done = on_layer};
    if (!rc && fk_train_basis_run(&c, &h) < 0) {
        fprintf(stderr, "fadkv-bench train-basis: %s\n", fk_errmsg());
        rc = 1;
    }
    if (!rc)
        printf("train-basis: wrote %s (%.1f s)\n", c.out, fk_wall_s() - t0);
    free(paths);
    return rc;
}
