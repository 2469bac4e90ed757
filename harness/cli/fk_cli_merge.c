/* SPDX-License-Identifier: MIT
 * `fadkv-bench merge OUT_DIR SHARD_DIR... [--cost-baseline CODEC]`: combines the results
 * directories of the shards of one sweep (`--shard I/N` runs) into one (store/fk_merge.h
 * has the rules).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/fk_cli.h"
#include "common/fk_err.h"
#include "store/fk_merge.h"


static void merge_usage(FILE *f)
{
    fprintf(f, "usage: fadkv-bench merge OUT_DIR SHARD_DIR... [--cost-baseline CODEC]\n"
               "  Combines the results of the shards of one sweep (same config hash).\n"
               "  --cost-baseline CODEC  codec of cost_mac_rel / cpu_time_rel (default: the one\n"
               "                         the shards' cells.csv were computed with)\n");
}

int fk_cli_merge(int argc, char **argv)
{
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        merge_usage(stdout);
        return 0;
    }
    const char **dirs = calloc((size_t)argc + 1, sizeof(char *));
    if (!dirs) {
        fprintf(stderr, "fadkv-bench merge: out of memory\n");
        return 1;
    }
    struct fk_merge_opts o = {0};
    int n = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--cost-baseline") && i + 1 < argc)
            o.cost_baseline = argv[++i];
        else
            dirs[n++] = argv[i];
    }
    if (n < 2) {
        fprintf(stderr, "usage: fadkv-bench merge OUT_DIR SHARD_DIR...\n");
        free(dirs);
        return 2;
    }
    o.out = dirs[0];
    o.shards = dirs + 1;
    o.n_shards = n - 1;
    struct fk_merge_result r;
    int rc = fk_merge(&o, &r);
    if (rc < 0) {
        fprintf(stderr, "fadkv-bench merge: %s\n", fk_errmsg());
        free(dirs);
        return 1;
    }
    printf("merge: %d cell(s) copied from %d shard(s) into %s (%d present twice and "
           "identical, %d not in the sweep, skipped)\n", r.copied, o.n_shards, o.out,
           r.duplicates, r.foreign);
    if (r.missing)
        printf("merge: %d of %d cell(s) of the sweep are in no shard yet\n", r.missing,
               r.n_cells);
    free(dirs);
    return 0;
}
