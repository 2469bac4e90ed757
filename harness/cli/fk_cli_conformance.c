/* SPDX-License-Identifier: MIT
 * fadkv-bench conformance FILE.so|CODEC...: the codec conformance suite
 * (conformance/fk_conformance.h) on every codec of a plugin, or on built-in codecs by name;
 * one line per rule, the broken rules with their first violation; exit 1 if one broke.
 */
#define _XOPEN_SOURCE 700 /* realpath */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/fk_cli.h"
#include "common/fk_err.h"
#include "conformance/fk_conformance.h"
#include "core/fk_codec.h"
#include "core/fk_registry.h"

static void report(void *ctx, const struct fk_codec_ops *ops, const struct fk_conf_rule *rule,
                   int passed, const char *message)
{
    (void)ctx;
    (void)ops;
    if (passed) {
        printf("  ok    %-12s\n", rule->name);
        return;
    }
    printf("  FAIL  %-12s %s\n", rule->name, message);
    printf("        the rule: %s\n", rule->what);
}

static int usage(void)
{
    fprintf(stderr,
            "usage: fadkv-bench conformance FILE.so|CODEC...\n"
            "  runs the codec conformance suite on every codec of each plugin FILE.so (a path\n"
            "  with a '/' or ending in .so) or on the named codecs (built-in, or of a plugin\n"
            "  loaded with --plugin); prints each rule, and for a broken one its first\n"
            "  violation (row, expected, got); exit 1 if a rule is broken, 2 on usage errors\n"
            "rules:\n");
    for (int i = 0; fk_conf_rules[i].name; i++)
        fprintf(stderr, "  %-12s %s\n", fk_conf_rules[i].name, fk_conf_rules[i].what);
    return 2;
}

static int run_one(const struct fk_codec_ops *ops, int *broken)
{
    const char *file = fk_codec_plugin(ops);
    printf("%s (%s%s):\n", ops->name, file ? "plugin " : "built-in",
           file ? file : "");
    struct fk_conf_result res;
    if (fk_conformance_run(ops, report, NULL, &res) < 0) {
        fprintf(stderr, "fadkv-bench: conformance: %s\n", fk_errmsg());
        return -1;
    }
    printf("  %s: %d of %d rules kept\n", ops->name, res.n_rules - res.n_failed, res.n_rules);
    *broken += res.n_failed > 0;
    return 0;
}

int fk_cli_conformance(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help"))
        return usage();
    int broken = 0, codecs = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        size_t n = strlen(a);
        int is_file = strchr(a, '/') || (n > 3 && !strcmp(a + n - 3, ".so"));
        if (!is_file) {
            const struct fk_codec_ops *ops = fk_codec_find(a);
            if (!ops) {
                fprintf(stderr, "fadkv-bench: conformance: no codec named '%s' (`fadkv-bench "
                                "codecs` lists them; a plugin's file needs a '/' or .so)\n", a);
                return 2;
            }
            if (run_one(ops, &broken) < 0)
                return 1;
            codecs++;
            continue;
        }
        char abs[PATH_MAX];
        if (fk_plugin_load(a) < 0 || !realpath(a, abs)) {
            fprintf(stderr, "fadkv-bench: conformance: %s\n", fk_errmsg());
            return 1;
        }
        int found = 0;
        for (int k = 0; k < fk_codec_count(); k++) {
            const struct fk_codec_ops *ops = fk_codec_at(k);
            const char *f = fk_codec_plugin(ops);
            if (!f || strcmp(f, abs))
                continue;
            found++;
            if (run_one(ops, &broken) < 0)
                return 1;
        }
        codecs += found;
    }
    printf("conformance: %d codec(s), %d with a broken rule\n", codecs, broken);
    return broken ? 1 : 0;
}
