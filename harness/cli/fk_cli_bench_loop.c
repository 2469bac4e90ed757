/* SPDX-License-Identifier: MIT
 * `fadkv-bench bench loop`: the closed loop's speed (harness/bench/fk_bench_loop.h). CLI
 * layer: prints.
 */
#include "cli/fk_cli.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/fk_bench_loop.h"
#include "common/fk_err.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: fadkv-bench bench loop --model M.bin [--make-model] [--dim 2048] "
            "[--layers 16]\n"
            "            [--heads 32] [--kv-heads 8] [--hidden 8192] [--vocab 32000] "
            "[--seq-len 256]\n"
            "            [--prompt-len 16] [--steps 48] [--repeats 3] [--seed 1]\n"
            "            [--codec NAME[:OPT=V,...]]... [--block B]\n"
            "--make-model writes M.bin first: random weights at the given shape (default "
            "Llama-3.2-1B-like,\nabout 4.2 GB). Then: the exact model's seconds per token "
            "against the read-bandwidth floor\n(weight bytes / bandwidth measured over the "
            "weights in the same run, one thread), and each\ncodec's time in the loop "
            "relative to the exact model, interleaved (ratios; medians of the\nrounds); thread CPU times. "
            "Default codecs: full:n_b=0 uniform:bits=4,n_b=16 kivi:bits=2,group=16,residual=16\n"
            "quant:bits=2,group=16,residual=16 topk:s=16,n_b=16.\n"
            "--block B (> 1): each codec is also teacher-forced in blocks of up to B positions "
            "per forward\npass right after its run: decode tokens/s of the forward passes one "
            "at a time and in blocks,\ntheir ratio (median of the rounds) and the e2e KL "
            "difference.\n");
}

static int num(const char *opt, const char *v, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi)
        return fk_err(FK_EINVAL, "option %s: '%s': expected an integer in [%ld, %ld]", opt, v,
                      lo, hi);
    *out = x;
    return FK_OK;
}

/* "name:a=1,b=2" into cfg's codec k (the text is split in place). */
static void add_codec(struct fk_bench_loop_cfg *cfg, char *text, char *(*sets)[9])
{
    int k = cfg->n_codecs++;
    char *colon = strchr(text, ':');
    int n = 0;
    if (colon) {
        *colon = 0;
        for (char *t = strtok(colon + 1, ","); t && n < 8; t = strtok(NULL, ","))
            sets[k][n++] = t;
    }
    sets[k][n] = NULL;
    cfg->codec[k] = text;
    cfg->sets[k] = (const char *const *)sets[k];
}

/* "name:a=1,b=2" of cfg's codec k. */
static void codec_name(const struct fk_bench_loop_cfg *cfg, int k, char *name, size_t cap)
{
    int n = snprintf(name, cap, "%s", cfg->codec[k]);
    for (int j = 0; cfg->sets[k][j] && n < (int)cap; j++)
        n += snprintf(name + n, cap - (size_t)n, "%s%s", j ? "," : ":", cfg->sets[k][j]);
}

int fk_cli_bench_loop(int argc, char **argv)
{
    struct fk_llama2c_config shape = {.dim = 2048, .hidden_dim = 8192, .n_layers = 16,
                                      .n_heads = 32, .n_kv_heads = 8, .vocab_size = 32000,
                                      .seq_len = 256};
    struct fk_bench_loop_cfg cfg = {.prompt_len = 16, .steps = 48, .repeats = 3, .seed = 1};
    static char *sets[FK_BENCH_LOOP_MAX][9];
    static char defaults[5][48] = {"full:n_b=0", "uniform:bits=4,n_b=16",
                                   "kivi:bits=2,group=16,residual=16",
                                   "quant:bits=2,group=16,residual=16", "topk:s=16,n_b=16"};
    int make = 0, rc = FK_OK;
    for (int i = 1; i < argc && rc == FK_OK; i++) {
        const char *a = argv[i];
        long v = 0;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--make-model")) {
            make = 1;
        } else if (i + 1 >= argc) {
            rc = fk_err(FK_EINVAL, "option %s: missing value (or unknown option)", a);
        } else if (!strcmp(a, "--model")) {
            cfg.model = argv[++i];
        } else if (!strcmp(a, "--codec")) {
            if (cfg.n_codecs == FK_BENCH_LOOP_MAX)
                rc = fk_err(FK_EINVAL, "more than %d codecs", FK_BENCH_LOOP_MAX);
            else
                add_codec(&cfg, argv[++i], sets);
        } else {
            static const char *const names[] = {"--dim", "--layers", "--heads", "--kv-heads",
                                                "--hidden", "--vocab", "--seq-len",
                                                "--prompt-len", "--steps", "--repeats",
                                                "--seed", "--block", NULL};
            int *dst[] = {&shape.dim, &shape.n_layers, &shape.n_heads, &shape.n_kv_heads,
                          &shape.hidden_dim, &shape.vocab_size, &shape.seq_len,
                          &cfg.prompt_len, &cfg.steps, &cfg.repeats, NULL, &cfg.block};
            int j = 0;
            while (names[j] && strcmp(names[j], a))
                j++;
            if (!names[j]) {
                rc = fk_err(FK_EINVAL, "unknown option '%s' (see fadkv-bench bench loop "
                            "--help)", a);
            } else if ((rc = num(a, argv[++i], 1, 1 << 20, &v)) == FK_OK) {
                if (dst[j])
                    *dst[j] = (int)v;
                else if (!strcmp(a, "--seed"))
                    cfg.seed = (uint64_t)v;
            }
        }
    }
    if (rc == FK_OK && !cfg.model)
        rc = fk_err(FK_EINVAL, "--model is required");
    if (rc == FK_OK && cfg.prompt_len + cfg.steps > shape.seq_len && make)
        rc = fk_err(FK_EINVAL, "--prompt-len + --steps exceeds --seq-len %d", shape.seq_len);
    if (rc < 0) {
        fprintf(stderr, "fadkv-bench bench loop: %s\n", fk_errmsg());
        usage(stderr);
        return 2;
    }
    if (cfg.n_codecs == 0)
        for (int k = 0; k < 5; k++)
            add_codec(&cfg, defaults[k], sets);
    if (make) {
        printf("writing %s: dim %d, hidden %d, %d layers, %d/%d heads, vocab %d, seq_len %d\n",
               cfg.model, shape.dim, shape.hidden_dim, shape.n_layers, shape.n_heads,
               shape.n_kv_heads, shape.vocab_size, shape.seq_len);
        fflush(stdout);
        rc = fk_bench_loop_make_model(cfg.model, &shape, cfg.seed);
    }
    struct fk_bench_loop_result r;
    if (rc == FK_OK)
        rc = fk_bench_loop_run(&cfg, &r);
    if (rc < 0) {
        fprintf(stderr, "fadkv-bench bench loop: %s\n", fk_errmsg());
        return 1;
    }
    printf("weights read per token %.3f GB; read bandwidth %.2f GB/s (1 thread, best of 3 "
           "passes over the weights; thread CPU time)\n", r.weight_bytes / 1e9, r.read_gbs);
    printf("exact model: %.4f s/token (%.3f tokens/s); bandwidth floor %.4f s/token: "
           "%.2f of the floor's speed\n", r.exact_s, 1.0 / r.exact_s, r.floor_s, r.floor_ratio);
    printf("%-36s %12s %14s %12s\n", "codec", "s/token", "x exact (med)",
           "e2e KL");
    for (int k = 0; k < cfg.n_codecs; k++) {
        char name[128];
        codec_name(&cfg, k, name, sizeof name);
        printf("%-36s %12.4f %14.3f %12.4g\n", name, r.codec_s[k], r.codec_ratio[k],
               r.codec_kl[k]);
    }
    if (cfg.block > 1) {
        printf("teacher forcing, decode forward passes: one position per pass vs blocks of "
               "up to %d\n%-36s %12s %12s %12s %12s\n", cfg.block, "codec", "tok/s one",
               "tok/s blocks", "x (med)", "|dKL|");
        for (int k = 0; k < cfg.n_codecs; k++) {
            char name[128];
            codec_name(&cfg, k, name, sizeof name);
            printf("%-36s %12.3f %12.3f %12.3f %12.3g\n", name, r.tf_one_tps[k],
                   r.tf_blk_tps[k], r.tf_blk_speedup[k], r.tf_blk_dkl[k]);
        }
    }
    printf("(%d prompt + %d decode positions per run, %d interleaved rounds)\n",
           cfg.prompt_len, cfg.steps, cfg.repeats);
    return 0;
}
