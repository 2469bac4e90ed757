/* SPDX-License-Identifier: MIT
 * `fadkv-bench train-calib`: arguments and printing (the work: train/fk_train_calib.h).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/fk_cli.h"
#include "common/fk_clock.h"
#include "common/fk_err.h"
#include "kernels/fk_rope.h"
#include "train/fk_train_calib.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: fadkv-bench train-calib --out CALIB.h5 [--outliers F1,F2,...] [--sinks N]\n"
            "       [--rope interleaved|half] [--quiet] TRACE.h5...\n"
            "KVQuant's calibration (datasets/CALIB.md) from calibration traces (never the\n"
            "evaluation traces) with post-RoPE keys and their RoPE described (rope_layout):\n"
            "per layer and outlier fraction f (--outliers, ascending in [0, 0.5); default\n"
            "0,0.01), the pre-RoPE key channel thresholds (quantiles 1 - f/2 and f/2, fp16)\n"
            "and k-means LUTs (2, 3, 4 bits) of keys and of values normalised per token row\n"
            "(all KV heads, or one head), with the first N tokens of every trace left out of\n"
            "the LUT fits (--sinks, default 1). For the KVQuant codec (dataset key\n"
            "`calibration`). --rope states the RoPE layout of traces that do not describe\n"
            "theirs (no rope_layout; default type, their rope_theta), e.g. llama2.c traces\n"
            "written before the attribute existed: interleaved.\n");
}

struct progress {
    int quiet;
    const struct fk_train_calib_cfg *c;
};

static void on_opened(void *ctx, int n_traces, int n_layers, int n_kv, int head_dim,
                      long tokens)
{
    const struct progress *p = ctx;
    if (p->quiet)
        return;
    fprintf(stderr, "train-calib: %d trace(s), %d layers x %d KV heads, head_dim %d, %ld tokens "
                    "(%d sink(s) each); outlier fractions", n_traces, n_layers, n_kv, head_dim,
            tokens, p->c->sinks);
    for (int i = 0; i < p->c->n_fractions; i++)
        fprintf(stderr, "%s%g", i ? ", " : " ", p->c->fractions[i]);
    fprintf(stderr, "\n");
}

static void on_layer(void *ctx, int layer, int nf, const double *in_k, const double *in_v,
                     double sec)
{
    const struct progress *p = ctx;
    if (p->quiet)
        return;
    fprintf(stderr, "  L%02d inside the thresholds:", layer);
    for (int i = 0; i < nf; i++)
        fprintf(stderr, " f %g: K %.4f V %.4f;", p->c->fractions[i], in_k[i], in_v[i]);
    fprintf(stderr, " (%.1f s)\n", sec);
}

/* "F1,F2,..." into c->fractions; -1 on a malformed list (printed). */
static int parse_fractions(struct fk_train_calib_cfg *c, const char *v)
{
    c->n_fractions = 0;
    const char *s = v;
    for (;;) {
        char *end;
        errno = 0;
        double f = strtod(s, &end);
        if (end == s || errno || (*end && *end != ',') ||
            c->n_fractions == FK_CALIB_MAX_FRACTIONS) {
            fprintf(stderr, "fadkv-bench train-calib: --outliers %s: expected 1 .. %d "
                            "comma-separated fractions\n", v, FK_CALIB_MAX_FRACTIONS);
            return -1;
        }
        c->fractions[c->n_fractions++] = f;
        if (!*end)
            return 0;
        s = end + 1;
    }
}

/* One option with its value, a flag or a trace; -1 on a usage error (printed). */
static int parse_one(struct fk_train_calib_cfg *c, struct progress *p, char **argv, int argc,
                     int *i)
{
    const char *a = argv[*i], *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    if (!strcmp(a, "--quiet")) {
        p->quiet = 1;
    } else if (!strcmp(a, "--out") && v) {
        c->out = argv[++*i];
    } else if (!strcmp(a, "--outliers") && v) {
        return parse_fractions(c, argv[++*i]);
    } else if (!strcmp(a, "--rope") && v) {
        c->assume_rope = !strcmp(v, "interleaved") ? 1 + FK_ROPE_INTERLEAVED
                         : !strcmp(v, "half")      ? 1 + FK_ROPE_HALF : 0;
        ++*i;
        if (!c->assume_rope) {
            fprintf(stderr, "fadkv-bench train-calib: --rope %s: expected interleaved or half\n",
                    v);
            return -1;
        }
    } else if (!strcmp(a, "--sinks") && v) {
        char *end;
        long x = strtol(argv[++*i], &end, 10);
        if (!*v || *end || x < 0 || x > (1 << 30)) {
            fprintf(stderr, "fadkv-bench train-calib: --sinks %s: expected an integer >= 0\n", v);
            return -1;
        }
        c->sinks = (int)x;
    } else if (a[0] == '-') {
        fprintf(stderr, "fadkv-bench train-calib: unknown or incomplete option '%s'\n", a);
        usage(stderr);
        return -1;
    } else {
        ((char **)c->traces)[c->n_traces++] = argv[*i];
    }
    return 0;
}

int fk_cli_train_calib(int argc, char **argv)
{
    struct fk_train_calib_cfg c = {.n_fractions = 2, .fractions = {0, 0.01}, .sinks = 1};
    struct progress p = {.c = &c};
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
    if (!rc && fk_train_calib_check(&c) < 0) {
        fprintf(stderr, "fadkv-bench train-calib: %s\n", fk_errmsg());
        usage(stderr);
        rc = 2;
    }
    double t0 = fk_wall_s();
    struct fk_train_calib_hooks h = {.ctx = &p, .opened = on_opened, .layer_done = on_layer};
    if (!rc && fk_train_calib_run(&c, &h) < 0) {
        fprintf(stderr, "fadkv-bench train-calib: %s\n", fk_errmsg());
        rc = 1;
    }
    if (!rc)
        printf("train-calib: wrote %s (%.1f s)\n", c.out, fk_wall_s() - t0);
    free(paths);
    return rc;
}
