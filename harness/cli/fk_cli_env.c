/* SPDX-License-Identifier: MIT
 * The process-wide set-up of the command line, before any command runs.
 */
#include <gsl/gsl_errno.h>
#include <signal.h>

#include "cli/fk_cli.h"
#include "formats/fk_trace.h"

void fk_cli_init(void)
{
    /* HDF5 prints its error stack by default: errors are reported through fk_err instead */
    fk_hdf5_quiet();
    /* GSL's default handler aborts the process: errors are returned and reported instead */
    gsl_set_error_handler_off();
    /* a file-size limit makes write() fail with EFBIG (reported) instead of killing us */
    signal(SIGXFSZ, SIG_IGN);
}
