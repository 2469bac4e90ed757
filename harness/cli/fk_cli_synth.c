/* SPDX-License-Identifier: MIT
 * `fadkv-bench synth`: writes synthetic KV traces (datasets/gen/fk_synth.h, datasets/SYNTH.md).
 * CLI layer: prints and returns exit codes; the generator below it never prints.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli/fk_cli.h"
#include "common/fk_clock.h"
#include "common/fk_err.h"
#include "gen/fk_synth.h"
#include "gen/fk_synth_fit.h"

static void usage(FILE *f)
{
    struct fk_synth_opts d;
    fk_synth_defaults(&d);
    fprintf(f,
            "usage: fadkv-bench synth --out DIR [--sequences K] [--first-seq F]\n"
            "       [--shape llama-3.2-3b|llama-3.1-8b|qwen3-4b]\n"
            "       [--encoding float32|float16|bfloat16] [--no-queries] [--no-rope]\n"
            "       [--profile PROFILE.h5] [--KNOB VALUE ...]\n"
            "   or: fadkv-bench synth --fit TRACE.h5... --out PROFILE.h5\n"
            "Writes DIR/synth-<shape>-s<seed>-<k>.h5 for k = F .. F+K-1 (defaults K = 1,\n"
            "F = 0). Calibration data: same --model-seed, another --seed or --first-seq.\n"
            "--fit estimates the per-layer knobs of real traces into a profile; --profile\n"
            "uses them (profile layer floor(l x L_profile / L) for output layer l; the\n"
            "knobs it sets override the flags). See datasets/SYNTH.md, Fitted profiles.\n"
            "Knobs (default; range) -- see datasets/SYNTH.md:\n");
    int n;
    const struct fk_synth_knob *k = fk_synth_knobs(&n);
    for (int i = 0; i < n; i++) {
        char flag[64];
        size_t j = 0;
        for (; k[i].name[j] && j + 1 < sizeof flag; j++)
            flag[j] = k[i].name[j] == '_' ? '-' : k[i].name[j];
        flag[j] = 0;
        fprintf(f, "  --%-20s %-44s (%g; %g..%g)\n", flag, k[i].help, k[i].def, k[i].min,
                k[i].max);
    }
    fprintf(f, "  --encoding             default float16\n");
}

static int parse_int(const char *flag, const char *s, int lo, int *out)
{
    char *end = NULL;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v < lo || v > 1 << 24)
        return fk_err(FK_EINVAL, "%s %s: expected an integer in [%d, %d]", flag, s, lo,
                      1 << 24);
    *out = (int)v;
    return 0;
}

/* synth --fit TRACE... --out PROFILE.h5: prints the fitted knobs per layer. */
static int synth_fit(int argc, char **argv)
{
    const char *out = NULL;
    const char **paths = calloc((size_t)argc, sizeof *paths);
    int n = 0;
    if (!paths)
        return 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--fit"))
            continue;
        if (!strcmp(argv[i], "--out") && i + 1 < argc)
            out = argv[++i];
        else if (!strncmp(argv[i], "--", 2)) {
            fprintf(stderr, "fadkv-bench synth --fit: unexpected option '%s' (takes traces "
                            "and --out PROFILE.h5)\n", argv[i]);
            free(paths);
            return 2;
        } else
            paths[n++] = argv[i];
    }
    if (!out || !n) {
        fprintf(stderr, "fadkv-bench synth --fit: need traces and --out PROFILE.h5\n");
        free(paths);
        return 2;
    }
    struct fk_synth_profile *p = NULL;
    int rc = fk_synth_fit(paths, n, &p);
    if (!rc)
        rc = fk_synth_profile_write(p, out);
    free(paths);
    if (rc) {
        fprintf(stderr, "fadkv-bench: %s\n", fk_errmsg());
        fk_synth_profile_free(&p);
        return 1;
    }
    printf("layer");
    for (int k = 0; k < FK_PROFILE_NKNOBS; k++)
        printf(" %s", fk_synth_profile_knobs[k]);
    printf("\n");
    for (int l = 0; l < p->n_layers; l++) {
        printf("%d", l);
        for (int k = 0; k < FK_PROFILE_NKNOBS; k++)
            printf(" %.4g", p->knob[(size_t)l * FK_PROFILE_NKNOBS + k]);
        printf("\n");
    }
    printf("wrote %s (%d traces, %ld tokens)\n", out, p->n_traces, p->tokens);
    fk_synth_profile_free(&p);
    return 0;
}

static int synth_gen(int argc, char **argv, struct fk_synth_profile **pr)
{
    struct fk_synth_opts o;
    fk_synth_defaults(&o);
    const char *out = NULL;
    int n_seq = 1, first = 0;
    /* --shape first, so explicit --layers etc. override it wherever they appear */
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--shape") && fk_synth_set_shape(&o, argv[i + 1])) {
            fprintf(stderr, "fadkv-bench: %s\n", fk_errmsg());
            return 2;
        }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--no-queries")) {
            o.queries = 0;
            continue;
        }
        if (!strcmp(a, "--no-rope")) {
            o.rope = 0;
            continue;
        }
        if (strncmp(a, "--", 2) || i + 1 >= argc) {
            fprintf(stderr, "fadkv-bench synth: unexpected argument '%s' (missing value?)\n",
                    a);
            usage(stderr);
            return 2;
        }
        const char *v = argv[++i];
        int rc = 0;
        if (!strcmp(a, "--out"))
            out = v;
        else if (!strcmp(a, "--shape"))
            continue;
        else if (!strcmp(a, "--sequences"))
            rc = parse_int(a, v, 1, &n_seq);
        else if (!strcmp(a, "--first-seq"))
            rc = parse_int(a, v, 0, &first);
        else if (!strcmp(a, "--encoding"))
            rc = fk_synth_parse_encoding(v, &o.encoding);
        else if (!strcmp(a, "--profile")) {
            fk_synth_profile_free(pr);
            rc = fk_synth_profile_read(v, pr);
            o.profile = *pr; /* freed by the caller */
        }
        else
            rc = fk_synth_set(&o, a + 2, v);
        if (rc) {
            fprintf(stderr, "fadkv-bench: %s\n", fk_errmsg());
            return 2;
        }
    }
    if (!out) {
        fprintf(stderr, "fadkv-bench synth: --out DIR is required\n");
        usage(stderr);
        return 2;
    }
    if (fk_synth_validate(&o)) {
        fprintf(stderr, "fadkv-bench: %s\n", fk_errmsg());
        return 2;
    }
    struct stat st;
    if (stat(out, &st) != 0 && mkdir(out, 0777) != 0) {
        fprintf(stderr, "fadkv-bench synth: cannot create directory %s\n", out);
        return 1;
    }
    for (int k = first; k < first + n_seq; k++) {
        char name[256];
        fk_synth_file_name(&o, k, name, sizeof name);
        size_t len = strlen(out) + strlen(name) + 2;
        char *path = malloc(len);
        if (!path) {
            fprintf(stderr, "fadkv-bench synth: out of memory\n");
            return 1;
        }
        snprintf(path, len, "%s/%s", out, name);
        double t0 = fk_wall_s();
        int rc = fk_synth_write(&o, path, k);
        double dt = fk_wall_s() - t0;
        if (rc) {
            fprintf(stderr, "fadkv-bench: %s\n", fk_errmsg());
            free(path);
            return 1;
        }
        long long bytes = stat(path, &st) == 0 ? (long long)st.st_size : -1;
        printf("wrote %s (%lld bytes, %.2f s)\n", path, bytes, dt);
        free(path);
    }
    return 0;
}

int fk_cli_synth(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--fit"))
            return synth_fit(argc, argv);
    struct fk_synth_profile *pr = NULL;
    int rc = synth_gen(argc, argv, &pr);
    fk_synth_profile_free(&pr);
    return rc;
}
