/* SPDX-License-Identifier: MIT
 * The HTML report of a results directory: one self-contained static page (no server, no
 * network, no external file): every figure `plot` drew as PNG (embedded), Table 4 and the
 * equal-budget tables, a sortable and filterable table of cells.csv, and provenance.json.
 * The page checks itself when it loads (every figure decoded, no script error) and says so
 * in its title ("fadkv-bench report: OK, N figures" or "... ERROR ..."), so a headless
 * browser can test it (tests/test_report.sh).
 */
#ifndef FK_REPORT_H
#define FK_REPORT_H

#include <stddef.h>

#include "report/fk_plotdata.h"

/* Writes fig_dir/report.html from results directory dir and the figure set that `plot`
 * exported into fig_dir (PNG files of figures without a note are embedded; figures not
 * drawn as PNG are listed with their reason). *n_figs receives the figures embedded.
 * Atomic (temporary name, rename). FK_EIO / FK_ENOMEM naming the file. */
int fk_report_write(const char *dir, const char *fig_dir, const struct fk_plot_set *set,
                    int *n_figs);

#endif
