/* SPDX-License-Identifier: MIT
 * `fadkv-bench trace`: decodes prompts with a llama2.c checkpoint (our own runner,
 * datasets/gen/fk_llama2c.h) and writes one fadkv-trace file per prompt. CLI layer: prints.
 */
#include "cli/fk_cli.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/fk_err.h"
#include "common/fk_sha256.h"
#include "formats/fk_trace.h"
#include "gen/fk_llama2c.h"
#include "kernels/fk_blas.h"

#ifndef FK_VERSION_STRING
#define FK_VERSION_STRING "0.1.0"
#endif

#define PROMPTS_CAP 4096

struct trace_opts {
    const char *model;       /* checkpoint path */
    const char *tokenizer;   /* tokenizer path */
    const char *prompt;      /* --prompt text or NULL */
    const char *prompts;     /* --prompts file or NULL */
    const char *out;         /* output folder */
    const char *model_id;    /* --model-id override or NULL */
    const char *dump_logits; /* hidden: raw float32 [T, vocab] logits of the one prompt */
    int steps;               /* generated tokens per prompt */
    int quiet;               /* 1: do not print the generated text */
    enum fk_encoding enc;    /* value encoding in the trace */
    struct fk_llama2c_sampling sampling; /* temperature, top_p, seed, ignore_eos */
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: fadkv-bench trace --model M.bin --tokenizer T.bin (--prompt TEXT | "
            "--prompts FILE)\n"
            "                         --steps N --out DIR [--temperature T] [--top-p P] "
            "[--seed S]\n"
            "                         [--encoding float32|float16|bfloat16] [--ignore-eos]\n"
            "                         [--model-id ID] [--quiet]\n"
            "Decodes each prompt (BOS + BPE tokens) for N steps with our llama2.c runner and "
            "writes\nDIR/<model-id>-<index>.h5 with post-RoPE keys, values and queries of "
            "every token.\n--prompts FILE: one prompt per line (blank lines skipped; \\n and "
            "\\\\ escapes).\nTemperature 0 (default) is greedy; --ignore-eos keeps decoding "
            "after EOS.\n");
}

static int parse_int(const char *opt, const char *s, long lo, long hi, long *v)
{
    char *end;
    errno = 0;
    long x = strtol(s, &end, 10);
    if (errno || end == s || *end || x < lo || x > hi)
        return fk_err(FK_EINVAL, "option %s: '%s': expected an integer in [%ld, %ld]", opt, s,
                      lo, hi);
    *v = x;
    return FK_OK;
}

static int parse_double(const char *opt, const char *s, double lo, double hi, double *v)
{
    char *end;
    errno = 0;
    double x = strtod(s, &end);
    if (errno || end == s || *end || !(x >= lo && x <= hi))
        return fk_err(FK_EINVAL, "option %s: '%s': expected a number in [%g, %g]", opt, s, lo,
                      hi);
    *v = x;
    return FK_OK;
}

static int parse_args(int argc, char **argv, struct trace_opts *o)
{
    memset(o, 0, sizeof *o);
    o->steps = -1;
    o->sampling.top_p = 1.0;
    o->enc = FK_ENC_F32;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--ignore-eos")) {
            o->sampling.ignore_eos = 1;
            continue;
        }
        if (!strcmp(a, "--quiet")) {
            o->quiet = 1;
            continue;
        }
        if (i + 1 >= argc)
            return fk_err(FK_EINVAL, "option %s: missing value (or unknown option)", a);
        const char *v = argv[++i];
        long n = 0;
        if (!strcmp(a, "--model")) {
            o->model = v;
        } else if (!strcmp(a, "--tokenizer")) {
            o->tokenizer = v;
        } else if (!strcmp(a, "--prompt")) {
            o->prompt = v;
        } else if (!strcmp(a, "--prompts")) {
            o->prompts = v;
        } else if (!strcmp(a, "--out")) {
            o->out = v;
        } else if (!strcmp(a, "--model-id")) {
            o->model_id = v;
        } else if (!strcmp(a, "--dump-logits")) {
            o->dump_logits = v;
        } else if (!strcmp(a, "--steps")) {
            FK_TRY(parse_int(a, v, 0, 1L << 24, &n));
            o->steps = (int)n;
        } else if (!strcmp(a, "--seed")) {
            FK_TRY(parse_int(a, v, 0, 2147483647L, &n));
            o->sampling.seed = (unsigned long)n;
        } else if (!strcmp(a, "--temperature")) {
            FK_TRY(parse_double(a, v, 0.0, 100.0, &o->sampling.temperature));
        } else if (!strcmp(a, "--top-p")) {
            FK_TRY(parse_double(a, v, 0.0, 1.0, &o->sampling.top_p));
            if (o->sampling.top_p == 0.0)
                return fk_err(FK_EINVAL, "option --top-p: must be > 0");
        } else if (!strcmp(a, "--encoding")) {
            if (!strcmp(v, "float32"))
                o->enc = FK_ENC_F32;
            else if (!strcmp(v, "float16"))
                o->enc = FK_ENC_F16;
            else if (!strcmp(v, "bfloat16"))
                o->enc = FK_ENC_BF16;
            else
                return fk_err(FK_EINVAL, "option --encoding: '%s': expected float32, float16 "
                              "or bfloat16", v);
        } else {
            return fk_err(FK_EINVAL, "unknown option '%s' (see fadkv-bench trace --help)", a);
        }
    }
    if (!o->model || !o->tokenizer || !o->out || o->steps < 0)
        return fk_err(FK_EINVAL, "--model, --tokenizer, --steps and --out are required");
    if (!o->prompt == !o->prompts)
        return fk_err(FK_EINVAL, "give exactly one of --prompt and --prompts");
    return FK_OK;
}

/* Reads one prompt per non-blank line, decoding \n and \\ escapes. */
static int read_prompts(const char *path, char ***out, int *n_out)
{
    *out = NULL;
    *n_out = 0;
    FILE *f = fopen(path, "r");
    if (!f)
        return fk_err(FK_EIO, "file %s: cannot open: %s", path, strerror(errno));
    char **list = calloc(PROMPTS_CAP, sizeof *list);
    char *line = NULL;
    size_t lcap = 0;
    ssize_t got;
    int n = 0, lineno = 0, rc = list ? FK_OK : fk_err(FK_ENOMEM, "out of memory");
    while (rc >= 0 && (got = getline(&line, &lcap, f)) >= 0) {
        lineno++;
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r'))
            line[--got] = '\0';
        if (got == 0)
            continue;
        if (n == PROMPTS_CAP) {
            rc = fk_err(FK_EINVAL, "file %s:%d: more than %d prompts", path, lineno,
                        PROMPTS_CAP);
            break;
        }
        char *p = malloc((size_t)got + 1);
        if (!p) {
            rc = fk_err(FK_ENOMEM, "out of memory");
            break;
        }
        size_t k = 0;
        for (ssize_t i = 0; i < got; i++) {
            if (line[i] == '\\' && i + 1 < got && (line[i + 1] == 'n' || line[i + 1] == '\\')) {
                p[k++] = line[i + 1] == 'n' ? '\n' : '\\';
                i++;
            } else {
                p[k++] = line[i];
            }
        }
        p[k] = '\0';
        list[n++] = p;
    }
    free(line);
    fclose(f);
    if (rc >= 0 && n == 0)
        rc = fk_err(FK_EINVAL, "file %s: no prompts (one per line expected)", path);
    if (rc < 0) {
        for (int i = 0; list && i < n; i++)
            free(list[i]);
        free(list);
        return rc;
    }
    *out = list;
    *n_out = n;
    return FK_OK;
}

/* "x/babyllama-tok105/model.bin" -> "babyllama-tok105"; "x/stories.bin" -> "stories". */
static void model_stem(const char *path, char *dst, size_t cap)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    if (!strcmp(base, "model.bin") && base > path + 1) {
        const char *end = base - 1, *start = end;
        while (start > path && start[-1] != '/')
            start--;
        snprintf(dst, cap, "%.*s", (int)(end - start), start);
        return;
    }
    const char *dot = strrchr(base, '.');
    size_t n = dot && dot != base ? (size_t)(dot - base) : strlen(base);
    snprintf(dst, cap, "%.*s", (int)n, base);
}

/* mkdir -p: creates dir and its missing parents. */
static int make_dirs(const char *dir)
{
    char buf[4096];
    size_t n = strlen(dir);
    if (n == 0 || n >= sizeof buf)
        return fk_err(FK_EINVAL, "folder '%s': empty or too long", dir);
    memcpy(buf, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != '\0')
            continue;
        char c = buf[i];
        buf[i] = '\0';
        if (mkdir(buf, 0777) != 0 && errno != EEXIST)
            return fk_err(FK_EIO, "folder %s: cannot create: %s", buf, strerror(errno));
        buf[i] = c;
    }
    return FK_OK;
}

static int dump_logits(const char *path, const struct fk_llama2c_gen *g, int vocab)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return fk_err(FK_EIO, "file %s: cannot create: %s", path, strerror(errno));
    size_t n = (size_t)g->n_tokens * (size_t)vocab;
    size_t w = fwrite(g->logits, sizeof(float), n, f);
    if (fclose(f) != 0 || w != n)
        return fk_err(FK_EIO, "file %s: short write of logits", path);
    return FK_OK;
}

static int run(const struct trace_opts *o)
{
    struct fk_llama2c_model *m = NULL;
    struct fk_llama2c_tokenizer *tok = NULL;
    struct fk_llama2c_run *r = NULL;
    char **prompts = NULL;
    int n_prompts = 0;
    char model_hex[65], tok_hex[65], stem[FK_NAME_CAP], path[4096];
    int rc = fk_llama2c_model_load(o->model, &m);
    if (rc >= 0)
        rc = fk_llama2c_tokenizer_load(o->tokenizer, fk_llama2c_model_config(m)->vocab_size,
                                       &tok);
    if (rc >= 0)
        rc = fk_sha256_file(o->model, model_hex);
    if (rc >= 0)
        rc = fk_sha256_file(o->tokenizer, tok_hex);
    if (rc >= 0 && o->prompts) {
        rc = read_prompts(o->prompts, &prompts, &n_prompts);
    } else if (rc >= 0) {
        prompts = malloc(sizeof *prompts);
        char *p = malloc(strlen(o->prompt) + 1);
        if (!prompts || !p) {
            free(p);
            rc = fk_err(FK_ENOMEM, "out of memory");
        } else {
            strcpy(p, o->prompt);
            prompts[0] = p;
            n_prompts = 1;
        }
    }
    if (rc >= 0 && o->dump_logits && n_prompts != 1)
        rc = fk_err(FK_EINVAL, "--dump-logits needs exactly one prompt, got %d", n_prompts);
    if (rc >= 0)
        rc = make_dirs(o->out);
    if (o->model_id)
        snprintf(stem, sizeof stem, "%s", o->model_id);
    else
        model_stem(o->model, stem, sizeof stem);
    const struct fk_llama2c_config *c = m ? fk_llama2c_model_config(m) : NULL;
    for (int i = 0; rc >= 0 && i < n_prompts; i++) {
        struct fk_llama2c_gen g;
        rc = fk_llama2c_run_create(m, &r);
        if (rc < 0)
            break;
        rc = fk_llama2c_generate(r, tok, prompts[i], o->steps, &o->sampling,
                                 o->dump_logits != NULL, &g);
        if (rc < 0) {
            fk_err_context(rc, "prompt %d", i);
            fk_llama2c_run_free(&r);
            break;
        }
        snprintf(path, sizeof path, "%s/%s-%02d.h5", o->out, stem, i);
        struct fk_llama2c_trace_meta meta = {stem, model_hex, tok_hex, prompts[i],
                                             &o->sampling, "fadkv-bench trace "
                                             FK_VERSION_STRING};
        rc = fk_llama2c_write_trace(r, &g, path, o->enc, &meta);
        if (rc >= 0 && o->dump_logits)
            rc = dump_logits(o->dump_logits, &g, c->vocab_size);
        if (rc >= 0) {
            printf("%s: %d tokens (%d prompt + %d generated%s)\n", path, g.n_tokens,
                   g.prompt_len, g.n_tokens - g.prompt_len, g.stopped_at_eos ? ", EOS" : "");
            if (!o->quiet)
                printf("%s\n", g.text);
        }
        fk_llama2c_gen_free(&g);
        fk_llama2c_run_free(&r);
    }
    for (int i = 0; i < n_prompts; i++)
        free(prompts[i]);
    free(prompts);
    fk_llama2c_tokenizer_free(&tok);
    fk_llama2c_model_free(&m);
    return rc;
}

int fk_cli_trace(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        }
    }
    struct trace_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc < 0) {
        fprintf(stderr, "fadkv-bench trace: %s\n", fk_errmsg());
        usage(stderr);
        return 2;
    }
    fk_hdf5_quiet();
    /* OpenBLAS's threaded sgemv splits some shapes (e.g. 172 x 64, 258 x 256) differently
     * per thread count; these models are tiny, so one thread keeps traces bit-identical
     * whatever OPENBLAS_NUM_THREADS says. */
    fk_blas_threads_set(1);
    rc = run(&o);
    if (rc < 0) {
        fprintf(stderr, "fadkv-bench trace: %s: %s\n", fk_strerror(rc), fk_errmsg());
        return 1;
    }
    return 0;
}
