/* SPDX-License-Identifier: MIT
 * libFuzzer target: sweep resolution (harness/engine/fk_sweep.h) on a config file.
 *
 * The input is written to a temporary file and loaded with fk_sweep_load(hash_content = 0):
 * the TOML reader, [sweep]/[[dataset]]/[defaults]/[[codec]]/[[exclude]] validation, presets,
 * grids, zips, exclusions and cell ids. Any error is fine; it must come with a message that
 * names the config file. Crashes, sanitizer reports and leaks are findings.
 *
 * Loading runs in a sandbox directory (a temporary directory holding t.h5, t2.h5, d.h5), so
 * the seeds' relative trace globs match; inputs with absolute or parent paths in them are
 * skipped (a glob such as "/ * / *" would walk the whole file system).
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/fk_err.h"
#include "engine/fk_sweep.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char g_cfg[4096];
static char g_dir[4096];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    char dir[] = "/tmp/fk-fuzz-sweep.XXXXXX";
    if (!mkdtemp(dir))
        abort();
    snprintf(g_dir, sizeof g_dir, "%s", dir);
    static const char *const files[] = {"t.h5", "t2.h5", "d.h5", NULL};
    for (int i = 0; files[i]; i++) {
        char p[4200];
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        FILE *f = fopen(p, "wb");
        if (!f)
            abort();
        fputs("placeholder\n", f);
        fclose(f);
    }
    snprintf(g_cfg, sizeof g_cfg, "%s/sweep.toml", dir);
    return 0;
}

static int risky(const uint8_t *d, size_t n)
{
    for (size_t i = 0; i + 1 < n; i++) {
        if ((d[i] == '"' || d[i] == '\'' || d[i] == '[' || d[i] == ' ' || d[i] == '=') &&
            (d[i + 1] == '/' || d[i + 1] == '~'))
            return 1;
        if (d[i] == '.' && d[i + 1] == '.')
            return 1;
        if (d[i] == '\\') /* escapes can spell a '/' */
            return 1;
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 65536 || risky(data, size))
        return 0;
    FILE *f = fopen(g_cfg, "wb");
    if (!f)
        abort();
    if (size && fwrite(data, 1, size, f) != size)
        abort();
    fclose(f);
    /* relative globs resolve in the sandbox; the fuzzer's own cwd is restored after */
    int cwd = open(".", O_RDONLY | O_DIRECTORY);
    if (cwd < 0 || chdir(g_dir) != 0)
        abort();
    struct fk_sweep *s = NULL;
    int rc = fk_sweep_load(g_cfg, NULL, 0, 0, &s);
    if (fchdir(cwd) != 0)
        abort();
    close(cwd);
    if (rc == FK_OK) {
        /* n_cells may be 0: [[exclude]] rules can drop every cell (reported as a finding:
         * the run then exits 0 having done nothing) */
        if (!s || s->n_cells < 0 || !s->resolved || !s->output || !s->name)
            abort();
        for (int c = 0; c < s->n_cells; c++)
            if (strlen(s->cells[c].id) != 16 || !s->cells[c].opts)
                abort();
        fk_sweep_free(&s);
    } else if (s || !strstr(fk_errmsg(), g_cfg)) {
        fprintf(stderr, "error without the file name: rc %d: %s\n", rc, fk_errmsg());
        abort();
    }
    return 0;
}
