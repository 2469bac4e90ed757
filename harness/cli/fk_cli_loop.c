/* SPDX-License-Identifier: MIT
 * `fadkv-bench loop`: one codec in the loop of a llama2.c model (harness/loop/fk_loop.h),
 * teacher-forced and free-running against the exact model's decode of one prompt. CLI
 * layer: prints.
 */
#include "cli/fk_cli.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fk_err.h"
#include "core/fk_codec.h"
#include "core/fk_registry.h"
#include "core/fk_evict.h"
#include "core/fk_rewrite.h"
#include "formats/fk_basis.h"
#include "formats/fk_dict.h"
#include "gen/fk_llama2c.h"
#include "kernels/fk_blas.h"
#include "loop/fk_loop.h"

#define SETS_CAP 64

struct loop_opts {
    const char *model, *tokenizer, *prompt, *prompt_ids, *cont, *cont_ids;
    const char *codec, *dictionary, *basis, *calib, *series, *dump_logits, *evict;
    const char *sets[SETS_CAP], *evict_sets[SETS_CAP], *rewrite_sets[SETS_CAP];
    int n_sets, n_evict_sets, n_rewrite_sets, steps;
    int block;                   /* --block: teacher forcing in blocks (fk_loop_codec.block) */
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: fadkv-bench loop --model M.bin (--tokenizer T.bin --prompt TEXT | "
            "--prompt-ids ID,ID,...)\n"
            "                        --steps N --codec NAME [--set OPTION=VALUE]...\n"
            "                        [--dictionary D.h5] [--basis B.h5] [--calibration C.h5]\n"
            "                        [--continuation TEXT | --continuation-ids ID,...]\n"
            "                        [--series FILE.tsv] [--dump-logits FILE]\n"
            "                        [--evict POLICY [--evict-set OPTION=VALUE]...]\n"
            "                        [--rewrite-set OPTION=VALUE]... [--block B]\n"
            "Decodes the prompt (BOS + BPE tokens, or the ids as given) with codec NAME "
            "compressing\nevery layer's KV cache under its buffer rule (the replay "
            "protocol), and compares with\nthe exact model: teacher-forced on the reference "
            "continuation (default: the exact greedy\none; --continuation: N + 1 ids, BPE "
            "without BOS) and free-running (greedy).\n--series: one line per step; "
            "--dump-logits: the teacher-forced run's float32 [N][vocab].\n--block B: "
            "teacher forcing in blocks of up to B positions per forward pass (ending where "
            "the\nschedule hands rows to the codec; equal up to float rounding).\n"
            "--rewrite-set: the prefill's row rewrites (merge, merge_threshold, think, "
            "think_window,\nthink_recent; docs/EVICTION.md), e.g. --rewrite-set think=0.5.\n");
}

/* "1,2,3" -> ids (malloc'd). */
static int parse_ids(const char *opt, const char *s, int32_t **ids, int *n)
{
    int cap = 16, k = 0;
    int32_t *v = malloc((size_t)cap * sizeof *v);
    if (!v)
        return fk_err(FK_ENOMEM, "out of memory");
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (errno || end == p || x < 0 || x > 1L << 30 || (*end && *end != ',')) {
            free(v);
            return fk_err(FK_EINVAL, "option %s: '%s': expected comma-separated token ids "
                          "(entry %d)", opt, s, k);
        }
        if (k == cap) {
            int32_t *nv = realloc(v, (size_t)(cap *= 2) * sizeof *v);
            if (!nv) {
                free(v);
                return fk_err(FK_ENOMEM, "out of memory");
            }
            v = nv;
        }
        v[k++] = (int32_t)x;
        p = *end ? end + 1 : end;
    }
    if (k == 0) {
        free(v);
        return fk_err(FK_EINVAL, "option %s: no token ids", opt);
    }
    *ids = v;
    *n = k;
    return FK_OK;
}

/* The field of a string-valued option, or NULL. */
static const char **string_option(struct loop_opts *o, const char *name)
{
    static const struct {
        const char *name;
        size_t off;
    } tab[] = {
        {"--model", offsetof(struct loop_opts, model)},
        {"--tokenizer", offsetof(struct loop_opts, tokenizer)},
        {"--prompt", offsetof(struct loop_opts, prompt)},
        {"--prompt-ids", offsetof(struct loop_opts, prompt_ids)},
        {"--continuation", offsetof(struct loop_opts, cont)},
        {"--continuation-ids", offsetof(struct loop_opts, cont_ids)},
        {"--codec", offsetof(struct loop_opts, codec)},
        {"--dictionary", offsetof(struct loop_opts, dictionary)},
        {"--basis", offsetof(struct loop_opts, basis)},
        {"--calibration", offsetof(struct loop_opts, calib)},
        {"--series", offsetof(struct loop_opts, series)},
        {"--dump-logits", offsetof(struct loop_opts, dump_logits)},
        {"--evict", offsetof(struct loop_opts, evict)},
    };
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
        if (!strcmp(name, tab[i].name))
            return (const char **)((char *)o + tab[i].off);
    return NULL;
}

static int parse_args(int argc, char **argv, struct loop_opts *o)
{
    memset(o, 0, sizeof *o);
    o->steps = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (i + 1 >= argc)
            return fk_err(FK_EINVAL, "option %s: missing value (or unknown option)", a);
        const char *v = argv[++i];
        const char **slot = string_option(o, a);
        if (slot) {
            *slot = v;
        } else if (!strcmp(a, "--set") || !strcmp(a, "--evict-set") ||
                   !strcmp(a, "--rewrite-set")) {
            int *n = a[2] == 'e' ? &o->n_evict_sets : a[2] == 'r' ? &o->n_rewrite_sets
                                                                  : &o->n_sets;
            const char **to = a[2] == 'e' ? o->evict_sets : a[2] == 'r' ? o->rewrite_sets
                                                                        : o->sets;
            if (*n == SETS_CAP)
                return fk_err(FK_EINVAL, "option %s: more than %d", a, SETS_CAP);
            to[(*n)++] = v;
        } else if (!strcmp(a, "--steps") || !strcmp(a, "--block")) {
            char *end;
            errno = 0;
            long x = strtol(v, &end, 10);
            if (errno || end == v || *end || x < 1 || x > 1L << 20)
                return fk_err(FK_EINVAL, "option %s: '%s': expected an integer in [1, %ld]", a,
                              v, 1L << 20);
            *(a[2] == 's' ? &o->steps : &o->block) = (int)x;
        } else {
            return fk_err(FK_EINVAL, "unknown option '%s' (see fadkv-bench loop --help)", a);
        }
    }
    if (!o->model || !o->codec || o->steps < 0)
        return fk_err(FK_EINVAL, "--model, --steps and --codec are required");
    if (!o->prompt == !o->prompt_ids)
        return fk_err(FK_EINVAL, "give exactly one of --prompt and --prompt-ids");
    if (o->cont && o->cont_ids)
        return fk_err(FK_EINVAL, "give at most one of --continuation and --continuation-ids");
    if ((o->prompt || o->cont) && !o->tokenizer)
        return fk_err(FK_EINVAL, "--prompt and --continuation need --tokenizer");
    return FK_OK;
}

/* --evict-set OPTION=VALUE on the policy's options. */
static int apply_evict_set(const struct fk_evict_ops *ev, void *opts, const char *kv)
{
    const char *eq = strchr(kv, '=');
    char name[64];
    if (!eq || eq == kv || (size_t)(eq - kv) >= sizeof name)
        return fk_err(FK_EINVAL, "option --evict-set: '%s': expected OPTION=VALUE", kv);
    snprintf(name, sizeof name, "%.*s", (int)(eq - kv), kv);
    const struct fk_option *op = fk_evict_option(ev, name);
    if (!op)
        return fk_err(FK_EINVAL, "option --evict-set: policy %s has no option '%s'", ev->name,
                      name);
    if (op->type == FK_OPT_ENUM)
        return fk_evict_opts_set_enum(ev, opts, op, eq + 1);
    char *end;
    double x = strtod(eq + 1, &end);
    if (end == eq + 1 || *end)
        return fk_err(FK_EINVAL, "option --evict-set %s: '%s' is not a number", name, eq + 1);
    return fk_evict_opts_set(ev, opts, op, x);
}

/* --rewrite-set OPTION=VALUE on the row rewrites' options (core/fk_rewrite.h). */
static int apply_rewrite_set(struct fk_rewrite *rw, const char *kv)
{
    const char *eq = strchr(kv, '=');
    char name[64];
    if (!eq || eq == kv || (size_t)(eq - kv) >= sizeof name)
        return fk_err(FK_EINVAL, "option --rewrite-set: '%s': expected OPTION=VALUE", kv);
    snprintf(name, sizeof name, "%.*s", (int)(eq - kv), kv);
    struct fk_codec_ops as = {.name = "rewrite", .options = fk_rewrite_options,
                              .opts_size = sizeof *rw};
    const struct fk_option *op = fk_codec_option(&as, name);
    if (!op)
        return fk_err(FK_EINVAL, "option --rewrite-set: no row rewrite option '%s' (merge, "
                      "merge_threshold, think, think_window, think_recent)", name);
    if (op->type == FK_OPT_ENUM)
        return fk_opts_set_enum(&as, rw, op, eq + 1);
    char *end;
    double x = strtod(eq + 1, &end);
    if (end == eq + 1 || *end)
        return fk_err(FK_EINVAL, "option --rewrite-set %s: '%s' is not a number", name, eq + 1);
    return fk_opts_set(&as, rw, op, x);
}

/* --set OPTION=VALUE on the codec's options. */
static int apply_set(const struct fk_codec_ops *ops, void *opts, const char *kv)
{
    const char *eq = strchr(kv, '=');
    char name[64];
    if (!eq || eq == kv || (size_t)(eq - kv) >= sizeof name)
        return fk_err(FK_EINVAL, "option --set: '%s': expected OPTION=VALUE", kv);
    memcpy(name, kv, (size_t)(eq - kv));
    name[eq - kv] = '\0';
    const struct fk_option *op = fk_codec_option(ops, name);
    if (!op)
        return fk_err(FK_EINVAL, "option --set: codec %s has no option '%s' (see fadkv-bench "
                      "codecs)", ops->name, name);
    if (op->type == FK_OPT_ENUM)
        return fk_opts_set_enum(ops, opts, op, eq + 1);
    if (op->type == FK_OPT_BOOL && (!strcmp(eq + 1, "true") || !strcmp(eq + 1, "false")))
        return fk_opts_set(ops, opts, op, !strcmp(eq + 1, "true"));
    char *end;
    errno = 0;
    double x = strtod(eq + 1, &end);
    if (errno || end == eq + 1 || *end)
        return fk_err(FK_EINVAL, "option --set %s: '%s' is not a number", name, eq + 1);
    return fk_opts_set(ops, opts, op, x);
}

static int write_series(const char *path, const struct fk_loop_ref *ref,
                        const struct fk_loop_result *tf, const struct fk_loop_result *fr)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return fk_err(FK_EIO, "file %s: cannot create: %s", path, strerror(errno));
    fprintf(f, "step\tkl\ttop1\tnll_exact\tnll_codec\ttoken\tkl_free\ttop1_free\ttoken_free"
               "\ttoken_greedy\n");
    for (int j = 0; j < ref->n_steps; j++)
        fprintf(f, "%d\t%.10g\t%d\t%.10g\t%.10g\t%d\t%.10g\t%d\t%d\t%d\n", j, tf->kl[j],
                tf->top1[j], tf->nll_exact[j], tf->nll_codec[j], tf->tokens[j], fr->kl[j],
                fr->top1[j], fr->tokens[j], ref->greedy[ref->prompt_len + j + 1]);
    if (fclose(f) != 0)
        return fk_err(FK_EIO, "file %s: write failed", path);
    return FK_OK;
}

static int dump(const char *path, const float *z, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return fk_err(FK_EIO, "file %s: cannot create: %s", path, strerror(errno));
    size_t w = fwrite(z, sizeof(float), n, f);
    if (fclose(f) != 0 || w != n)
        return fk_err(FK_EIO, "file %s: write failed", path);
    return FK_OK;
}

struct loop_data {
    struct fk_llama2c_model *m;
    struct fk_llama2c_tokenizer *tok;
    struct fk_dict *dict;
    struct fk_basis_file *basis;
    struct fk_calib_file *calib;
    int32_t *prompt, *cont;
    int n_prompt, n_cont;
    void *opts, *evict_opts;
    const struct fk_evict_ops *evict;
    struct fk_rewrite rewrite;   /* --rewrite-set's, when has_rewrite */
    int has_rewrite;
    struct fk_loop_ref ref;
    struct fk_loop_result tf, fr;
};

static void data_free(struct loop_data *d)
{
    fk_loop_result_free(&d->tf);
    fk_loop_result_free(&d->fr);
    fk_loop_ref_free(&d->ref);
    fk_llama2c_tokenizer_free(&d->tok);
    fk_llama2c_model_free(&d->m);
    fk_dict_free(&d->dict);
    fk_basis_free(&d->basis);
    fk_calib_free(&d->calib);
    free(d->prompt);
    free(d->cont);
    free(d->opts);
    free(d->evict_opts);
}

static int load(const struct loop_opts *o, const struct fk_codec_ops *ops, struct loop_data *d)
{
    FK_TRY(fk_llama2c_model_load(o->model, &d->m));
    const struct fk_llama2c_config *c = fk_llama2c_model_config(d->m);
    if (o->tokenizer)
        FK_TRY(fk_llama2c_tokenizer_load(o->tokenizer, c->vocab_size, &d->tok));
    if (o->prompt)
        FK_TRY(fk_llama2c_encode(d->tok, o->prompt, 1, &d->prompt, &d->n_prompt));
    else
        FK_TRY(parse_ids("--prompt-ids", o->prompt_ids, &d->prompt, &d->n_prompt));
    if (o->cont)
        FK_TRY(fk_llama2c_encode(d->tok, o->cont, 0, &d->cont, &d->n_cont));
    else if (o->cont_ids)
        FK_TRY(parse_ids("--continuation-ids", o->cont_ids, &d->cont, &d->n_cont));
    if (o->dictionary)
        FK_TRY(fk_dict_load(o->dictionary, &d->dict));
    if (o->basis)
        FK_TRY(fk_basis_load(o->basis, &d->basis));
    if (o->calib)
        FK_TRY(fk_calib_load(o->calib, &d->calib));
    d->opts = calloc(1, ops->opts_size);
    if (!d->opts)
        return fk_err(FK_ENOMEM, "out of memory");
    fk_opts_defaults(ops, d->opts);
    for (int i = 0; i < o->n_sets; i++)
        FK_TRY(apply_set(ops, d->opts, o->sets[i]));
    if (o->n_rewrite_sets) {
        struct fk_codec_ops as = {.options = fk_rewrite_options, .opts_size = sizeof d->rewrite};
        fk_opts_defaults(&as, &d->rewrite);
        for (int i = 0; i < o->n_rewrite_sets; i++)
            FK_TRY(apply_rewrite_set(&d->rewrite, o->rewrite_sets[i]));
        d->has_rewrite = 1;
    }
    if (!o->evict && o->n_evict_sets)
        return fk_err(FK_EINVAL, "--evict-set needs --evict POLICY");
    if (!o->evict)
        return FK_OK;
    if (!(d->evict = fk_evict_find(o->evict)))
        return fk_err(FK_EINVAL, "unknown eviction policy '%s' (see fadkv-bench codecs)",
                      o->evict);
    if (!(d->evict_opts = calloc(1, d->evict->opts_size ? d->evict->opts_size : 1)))
        return fk_err(FK_ENOMEM, "out of memory");
    fk_evict_opts_defaults(d->evict, d->evict_opts);
    for (int i = 0; i < o->n_evict_sets; i++)
        FK_TRY(apply_evict_set(d->evict, d->evict_opts, o->evict_sets[i]));
    return FK_OK;
}

static void print_result(const char *what, const struct fk_loop_result *r)
{
    if (r->mode == FK_LOOP_TEACHER) {
        printf("%s: kl_mean %.6g kl_max %.6g top1_agree %.4f nll_exact %.6f nll_codec %.6f "
               "ppl_ratio %.6f first_top1_miss %d\n", what, r->kl_mean, r->kl_max,
               r->top1_agree, r->nll_exact_mean, r->nll_codec_mean, r->ppl_ratio,
               r->first_diverge);
        for (int l = 0; l < r->n_layers && !isnan(r->attn_cos[l]); l++)
            printf("  layer %d: attn_cos %.6f attn_kl %.6g (closed loop)\n", l,
                   r->attn_cos[l], r->attn_kl[l]);
    } else {
        printf("%s: first_diverge %d token_agree %.4f kl_mean_to_divergence %.6g\n", what,
               r->first_diverge, r->token_agree,
               r->first_diverge < 0 ? r->kl_mean : r->kl[r->first_diverge]);
    }
}

int fk_cli_loop(int argc, char **argv)
{
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        usage(stdout);
        return 0;
    }
    struct loop_opts o;
    if (parse_args(argc, argv, &o) < 0) {
        fprintf(stderr, "fadkv-bench loop: %s\n", fk_errmsg());
        usage(stderr);
        return 2;
    }
    const struct fk_codec_ops *ops = fk_codec_find(o.codec);
    if (!ops) {
        fprintf(stderr, "fadkv-bench loop: unknown codec '%s' (see fadkv-bench codecs)\n",
                o.codec);
        return 2;
    }
    fk_blas_threads_set(1); /* bit-identical numbers (fk_llama2c_forward) */
    struct loop_data d;
    memset(&d, 0, sizeof d);
    int rc = load(&o, ops, &d);
    if (rc >= 0)
        rc = fk_loop_ref_build(d.m, d.prompt, d.n_prompt, d.cont, d.n_cont, o.steps, 1,
                               &d.ref);
    struct fk_loop_codec lc = {.ops = ops, .opts = d.opts, .dict = d.dict, .basis = d.basis,
                               .calib = d.calib, .evict = d.evict, .evict_opts = d.evict_opts,
                               .rewrite = d.has_rewrite ? &d.rewrite : NULL,
                               .block = o.block};
    if (rc >= 0)
        rc = fk_loop_run(d.m, &d.ref, &lc, FK_LOOP_TEACHER, o.dump_logits != NULL, &d.tf);
    if (rc >= 0)
        rc = fk_loop_run(d.m, &d.ref, &lc, FK_LOOP_FREE, 0, &d.fr);
    if (rc >= 0 && o.series)
        rc = write_series(o.series, &d.ref, &d.tf, &d.fr);
    if (rc >= 0 && o.dump_logits)
        rc = dump(o.dump_logits, d.tf.logits, (size_t)d.ref.n_steps * d.ref.vocab);
    if (rc < 0) {
        fprintf(stderr, "fadkv-bench loop: %s\n", fk_errmsg());
        data_free(&d);
        return 1;
    }
    printf("model %s, codec %s, prompt %d ids, %d steps\n", o.model, ops->name, d.n_prompt,
           o.steps);
    print_result("teacher-forced", &d.tf);
    print_result("free-running", &d.fr);
    printf("cpu: forward %.3f s, codec %.3f s (teacher-forced run)\n", d.tf.t_forward,
           d.tf.t_codec);
    data_free(&d);
    return 0;
}
