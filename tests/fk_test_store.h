/* SPDX-License-Identifier: MIT
 * Hand-made results stores for the report tests (test_plot_check.c, test_plot_general.c):
 * writing a file below a directory, sealing a cell as a finished one (its .h5 and
 * .summary.csv, empty when absent, and a .meta holding their sizes and SHA-256, which the
 * store's integrity check verifies), removing the directory.
 */
#ifndef FK_TEST_STORE_H
#define FK_TEST_STORE_H

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "common/fk_err.h"
#include "common/fk_sha256.h"

/* Writes text to dir/name. */
static inline void fk_test_put(const char *dir, const char *name, const char *text)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    ck_assert_msg(f != NULL, "cannot create %s", p);
    fputs(text, f);
    fclose(f);
}

/* Seals cell id of results directory dir/res as finished. */
static inline void fk_test_seal(const char *dir, const char *res, const char *id)
{
    char p[1024], meta[1024];
    snprintf(p, sizeof p, "%s/%s/cells", dir, res);
    mkdir(p, 0755);
    int n = snprintf(meta, sizeof meta, "cell_id\t%s\nstatus\tok\n", id);
    static const char *const ext[] = {"h5", "summary.csv"};
    for (int i = 0; i < 2; i++) {
        struct stat sb;
        char hex[65];
        snprintf(p, sizeof p, "%s/%s/cells/%s.%s", dir, res, id, ext[i]);
        if (stat(p, &sb) != 0) {
            FILE *f = fopen(p, "w");
            ck_assert_ptr_nonnull(f);
            fclose(f);
            sb.st_size = 0;
        }
        ck_assert_int_eq(fk_sha256_file(p, hex), FK_OK);
        n += snprintf(meta + n, sizeof meta - (size_t)n, "file.%s\t%ld %s\n", ext[i],
                      (long)sb.st_size, hex);
    }
    snprintf(p, sizeof p, "%s/cells/%s.meta", res, id);
    fk_test_put(dir, p, meta);
}

/* rm -rf dir. */
static inline void fk_test_rm(const char *dir)
{
    char cmd[1100];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

#endif
