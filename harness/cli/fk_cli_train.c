/* SPDX-License-Identifier: MIT
 * `fadkv-bench train-dict`: trains per-(layer, kind) dictionaries from calibration traces
 * and writes a dictionary file v1 (CLI layer: parses, prints progress, exits).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/fk_cli.h"
#include "common/fk_clock.h"
#include "formats/fk_dict.h"
#include "common/fk_err.h"
#include "common/fk_sha256.h"
#include "formats/fk_trace.h"
#include "train/fk_train.h"


static const char *const method_names[] = {"sample", "random", "bcd", "lexico", NULL};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: fadkv-bench train-dict --out DICT.h5 [--atoms N] [--sparsity s]\n"
            "       [--method bcd|lexico|sample|random] [--epochs E] [--seed S]\n"
            "       [--heldout FRAC] [--max-train n] [--lr LR] [--batch B] [--jobs J]\n"
            "       [--compare] [--quiet] TRACE.h5...\n"
            "Trains one dictionary of N unit atoms per (layer, kind) on the keys and values of\n"
            "the calibration traces (never the evaluation traces), holding out every\n"
            "1/FRAC-th vector to report the held-out relative OMP error after each epoch.\n"
            "--compare trains with every method and prints held-out error and time of each.\n"
            "Defaults: N 4096, s 8, method bcd, 8 epochs, seed 1, heldout 0.1, lr 1e-3.\n");
}

struct progress {
    int quiet;
    int n_layers;
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

/* Reads every trace's keys and values into per-(layer, kind) arrays. */
static int load(char **paths, int n_paths, long max_per, struct fk_train_data *d,
                char **hashes)
{
    memset(d, 0, sizeof *d);
    for (int f = 0; f < n_paths; f++) {
        struct fk_trace *t;
        FK_TRY(fk_trace_open(paths[f], &t));
        const struct fk_trace_info *in = fk_trace_get_info(t);
        if (f == 0) {
            d->n_layers = in->n_layers;
            d->m = in->head_dim;
            d->x = calloc((size_t)in->n_layers * 2, sizeof(float *));
            d->n = calloc((size_t)in->n_layers * 2, sizeof(long));
            if (!d->x || !d->n) {
                fk_trace_close(&t);
                return fk_err(FK_ENOMEM, "out of memory");
            }
        } else if (in->n_layers != d->n_layers || in->head_dim != d->m) {
            fk_trace_close(&t);
            return fk_err(FK_EINVAL, "%s: %d layers x head_dim %d, but %s has %d x %d",
                          paths[f], in->n_layers, in->head_dim, paths[0], d->n_layers, d->m);
        }
        size_t per = (size_t)in->n_kv_heads * in->n_tokens * in->head_dim;
        float *buf = malloc(sizeof(float) * per);
        if (!buf) {
            fk_trace_close(&t);
            return fk_err(FK_ENOMEM, "out of memory");
        }
        int rc = FK_OK;
        for (int l = 0; l < in->n_layers && rc == FK_OK; l++)
            for (int k = 0; k < 2 && rc == FK_OK; k++) {
                rc = fk_trace_read(t, l, k, buf);
                if (rc < 0)
                    break;
                int slot = 2 * l + k;
                long add = (long)in->n_kv_heads * in->n_tokens;
                float *nx = realloc(d->x[slot], sizeof(float) * (size_t)(d->n[slot] + add) *
                                                    (size_t)d->m);
                if (!nx) {
                    rc = fk_err(FK_ENOMEM, "out of memory");
                    break;
                }
                d->x[slot] = nx;
                /* token-major order (all heads of a token together) */
                for (int tk = 0; tk < in->n_tokens; tk++)
                    for (int h = 0; h < in->n_kv_heads; h++)
                        memcpy(nx + (size_t)(d->n[slot]++) * d->m,
                               buf + ((size_t)h * in->n_tokens + tk) * d->m,
                               sizeof(float) * (size_t)d->m);
            }
        free(buf);
        fk_trace_close(&t);
        FK_TRY(rc);
        FK_TRY(fk_sha256_file(paths[f], hashes[f]));
    }
    /* evenly spaced sub-sample when a cap is set */
    for (int s = 0; max_per > 0 && s < d->n_layers * 2; s++) {
        if (d->n[s] <= max_per)
            continue;
        for (long i = 0; i < max_per; i++) {
            long src = (long)((double)i * d->n[s] / max_per);
            memmove(d->x[s] + (size_t)i * d->m, d->x[s] + (size_t)src * d->m,
                    sizeof(float) * (size_t)d->m);
        }
        d->n[s] = max_per;
    }
    return FK_OK;
}

int fk_cli_train_dict(int argc, char **argv)
{
    struct fk_train_opts o;
    fk_train_defaults(&o);
    const char *out = NULL;
    int compare = 0, quiet = 0;
    long max_load = 0;
    char **paths = calloc((size_t)argc + 1, sizeof(char *));
    int n_paths = 0;
    if (!paths)
        return 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int takes = v != NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            free(paths);
            return 0;
        } else if (!strcmp(a, "--compare")) {
            compare = 1;
        } else if (!strcmp(a, "--quiet")) {
            quiet = 1;
        } else if (!strcmp(a, "--out") && takes) {
            out = argv[++i];
        } else if (!strcmp(a, "--atoms") && takes) {
            o.n_atoms = atoi(argv[++i]);
        } else if (!strcmp(a, "--sparsity") && takes) {
            o.s = atoi(argv[++i]);
        } else if (!strcmp(a, "--epochs") && takes) {
            o.epochs = atoi(argv[++i]);
        } else if (!strcmp(a, "--seed") && takes) {
            o.seed = strtoull(argv[++i], NULL, 10);
        } else if (!strcmp(a, "--heldout") && takes) {
            o.heldout_frac = atof(argv[++i]);
        } else if (!strcmp(a, "--max-train") && takes) {
            max_load = atol(argv[++i]);
        } else if (!strcmp(a, "--lr") && takes) {
            o.lr = atof(argv[++i]);
        } else if (!strcmp(a, "--batch") && takes) {
            o.batch = atoi(argv[++i]);
        } else if (!strcmp(a, "--jobs") && takes) {
            o.jobs = atoi(argv[++i]);
        } else if (!strcmp(a, "--method") && takes) {
            const char *m = argv[++i];
            int found = -1;
            for (int k = 0; method_names[k]; k++)
                if (!strcmp(m, method_names[k]))
                    found = k;
            if (found < 0) {
                fprintf(stderr, "fadkv-bench train-dict: --method %s: expected bcd, lexico, "
                                "sample or random\n", m);
                free(paths);
                return 2;
            }
            o.method = (enum fk_train_method)found;
        } else if (a[0] == '-') {
            fprintf(stderr, "fadkv-bench train-dict: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            free(paths);
            return 2;
        } else {
            paths[n_paths++] = argv[i];
        }
    }
    if (!out || n_paths == 0 || o.n_atoms < 1 || o.s < 1 || o.epochs < 0 || o.jobs < 1 ||
        o.batch < 1 || !(o.heldout_frac >= 0 && o.heldout_frac < 1)) {
        fprintf(stderr, "fadkv-bench train-dict: need --out, at least one trace, N >= 1, s >= 1, "
                        "epochs >= 0, jobs >= 1, 0 <= heldout < 1\n");
        usage(stderr);
        free(paths);
        return 2;
    }
    char **hashes = calloc((size_t)n_paths, sizeof(char *));
    for (int i = 0; hashes && i < n_paths; i++)
        hashes[i] = calloc(65, 1);
    struct fk_train_data d;
    double t0 = fk_wall_s();
    int rc = hashes ? load(paths, n_paths, max_load, &d, hashes) : fk_err(FK_ENOMEM, "oom");
    if (rc < 0) {
        fprintf(stderr, "fadkv-bench train-dict: %s\n", fk_errmsg());
        free(paths);
        return 1;
    }
    long tot = 0;
    for (int s = 0; s < d.n_layers * 2; s++)
        tot += d.n[s];
    if (!quiet)
        fprintf(stderr, "train-dict: %d trace(s), %d layers x {K,V}, head_dim %d, %ld vectors "
                        "(%.1f s to load)\n", n_paths, d.n_layers, d.m, tot, fk_wall_s() - t0);
    size_t n_atoms_total = (size_t)d.n_layers * 2 * o.n_atoms * d.m;
    float *atoms = malloc(sizeof(float) * n_atoms_total);
    double *held = calloc((size_t)d.n_layers * 2, sizeof(double));
    struct progress pr = {.quiet = quiet, .n_layers = d.n_layers};
    int methods[4] = {(int)o.method, -1, -1, -1};
    if (compare) {
        methods[0] = FK_TRAIN_RANDOM;
        methods[1] = FK_TRAIN_SAMPLE;
        methods[2] = FK_TRAIN_LEXICO;
        methods[3] = (int)o.method == FK_TRAIN_LEXICO ? -1 : (int)o.method;
        if (o.method == FK_TRAIN_RANDOM || o.method == FK_TRAIN_SAMPLE)
            methods[3] = FK_TRAIN_BCD;
    }
    enum fk_train_method final = o.method;
    double final_err = NAN;
    for (int mi = 0; mi < 4 && rc == FK_OK; mi++) {
        if (methods[mi] < 0)
            continue;
        struct fk_train_opts oo = o;
        oo.method = (enum fk_train_method)methods[mi];
        double m0 = fk_wall_s();
        if (!quiet)
            fprintf(stderr, "method %s:\n", method_names[oo.method]);
        rc = fk_train_run(&oo, &d, atoms, held, on_progress, &pr);
        if (rc < 0)
            break;
        double mean = 0;
        for (int s = 0; s < d.n_layers * 2; s++)
            mean += held[s] / (d.n_layers * 2);
        printf("train-dict: method %-7s N %d s %d epochs %d: held-out rel err %.4f (mean over "
               "%d dictionaries), %.1f s\n", method_names[oo.method], o.n_atoms, o.s,
               oo.method == FK_TRAIN_BCD || oo.method == FK_TRAIN_LEXICO ? oo.epochs : 0, mean,
               d.n_layers * 2, fk_wall_s() - m0);
        if (oo.method == o.method || (compare && mi == 3))
            final_err = mean;
        final = oo.method;
    }
    if (rc == FK_OK && compare && final != o.method) {
        /* the last trained method is kept; retrain the requested one if it differs */
        rc = fk_train_run(&o, &d, atoms, held, NULL, NULL);
        final = o.method;
    }
    if (rc == FK_OK) {
        char eps[32], sp[32], seed[32], n_tr[32], herr[32], hl[32];
        snprintf(eps, sizeof eps, "%d", o.epochs);
        snprintf(sp, sizeof sp, "%d", o.s);
        snprintf(seed, sizeof seed, "%llu", (unsigned long long)o.seed);
        snprintf(n_tr, sizeof n_tr, "%ld", tot);
        snprintf(herr, sizeof herr, "%.6f", final_err);
        snprintf(hl, sizeof hl, "%g", o.heldout_frac);
        size_t cap = 64;
        for (int i = 0; i < n_paths; i++)
            cap += strlen(paths[i]) + 80;
        char *tl = malloc(cap);
        if (!tl)
            rc = fk_err(FK_ENOMEM, "oom");
        size_t len = 0;
        for (int i = 0; tl && i < n_paths; i++)
            len += (size_t)snprintf(tl + len, cap - len, "%s%s sha256:%s", i ? "; " : "",
                                    paths[i], hashes[i]);
        const char *attrs[] = {"method", method_names[final], "sparsity", sp, "epochs", eps,
                               "seed", seed, "training_traces", tl ? tl : "",
                               "training_vectors", n_tr, "heldout_fraction", hl,
                               "heldout_rel_err", herr, "generator", "fadkv-bench train-dict",
                               NULL};
        if (rc == FK_OK)
            rc = fk_dict_save(out, d.n_layers, d.m, o.n_atoms, atoms, attrs);
        free(tl);
    }
    for (int s = 0; s < d.n_layers * 2; s++)
        free(d.x[s]);
    free(d.x);
    free(d.n);
    for (int i = 0; hashes && i < n_paths; i++)
        free(hashes[i]);
    free(hashes);
    free(atoms);
    free(held);
    free(paths);
    if (rc < 0) {
        fprintf(stderr, "fadkv-bench train-dict: %s\n", fk_errmsg());
        return 1;
    }
    printf("train-dict: wrote %s (%.1f s)\n", out, fk_wall_s() - t0);
    return 0;
}
