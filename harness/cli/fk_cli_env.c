/* SPDX-License-Identifier: MIT
 * The process-wide set-up of the command line, before any command runs.
 */
#include <gsl/gsl_errno.h>
#include <signal.h>
#include <stdio.h>

#include "cli/fk_cli.h"
#include "formats/fk_trace.h"
#include "store/fk_results.h"

void fk_cli_init(void)
{
    /* HDF5 prints its error stack by default: errors are reported through fk_err instead */
    fk_hdf5_quiet();
    /* GSL's default handler aborts the process: errors are returned and reported instead */
    gsl_set_error_handler_off();
    /* a file-size limit makes write() fail with EFBIG (reported) instead of killing us */
    signal(SIGXFSZ, SIG_IGN);
}

int fk_cli_warn_damaged(const char *cmd, const char *dir)
{
    struct fk_store *st = NULL;
    if (fk_store_open(dir, &st) < 0)
        return 0; /* the command itself reports an unreadable directory */
    int n = st->n_damaged;
    for (int i = 0; i < n; i++)
        fprintf(stderr, "fadkv-bench %s: %s: skipping damaged cell %s (rerun the sweep to "
                        "recompute it)\n", cmd, dir, st->damaged[i]);
    fk_store_close(&st);
    return n;
}
