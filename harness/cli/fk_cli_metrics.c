/* SPDX-License-Identifier: MIT
 * `fadkv-bench metrics [--markdown]`: the metric reference, from the metric table
 * (store/fk_metrics.h). docs/RESULTS.md holds its --markdown output between two markers;
 * tests/test_docs.sh fails when they differ.
 */
#include <stdio.h>
#include <string.h>

#include "cli/fk_cli.h"
#include "store/fk_metrics.h"

static const char *better(const struct fk_metric *m)
{
    return m->better < 0 ? "lower" : m->better > 0 ? "higher" : "";
}

/* Where the metric's cell value comes from (cells.csv and the .meta). */
static const char *cell_value(const struct fk_metric *m)
{
    switch (m->agg) {
    case FK_AGG_STREAMS: return "mean over streams";
    case FK_AGG_CELL: return m->flags & FK_MF_META_ONLY ? "cell (.meta only)" : "cell";
    case FK_AGG_LOOP: return "closed loop";
    case FK_AGG_TABLE: return "from the cell's columns";
    case FK_AGG_NONE: break;
    }
    return "";
}

static void band(char *buf, size_t cap, struct fk_band b)
{
    snprintf(buf, cap, "%g / %g", b.rtol, b.atol);
}

/* s with every | escaped (a Markdown table cell). */
static void md_cell(const char *s)
{
    for (; *s; s++)
        printf(*s == '|' ? "\\|" : "%c", *s);
}

static void markdown(void)
{
    for (int g = 0; fk_metric_groups[g]; g++) {
        printf("%s#### %s\n\n| metric | unit | better | cell value | summary row | check rtol / "
               "atol: cell; row | definition |\n|---|---|---|---|---|---|---|\n", g ? "\n" : "",
               fk_metric_groups[g]);
        for (const struct fk_metric *m = fk_metrics; m->name; m++) {
            if (strcmp(m->group, fk_metric_groups[g]))
                continue;
            char ba[64] = "", br[64] = "";
            if (m->flags & FK_MF_GATE) {
                band(ba, sizeof ba, m->band_agg);
                band(br, sizeof br, m->band_row);
            }
            printf("| `%s` | %s | %s | %s%s | %s | %s%s%s | ", m->name, m->unit, better(m),
                   cell_value(m), m->flags & FK_MF_TIMING ? ", timing" : "",
                   m->row ? "yes" : "", ba, *ba ? "; " : "", br);
            md_cell(m->def);
            printf(" |\n");
        }
    }
}

static void text(void)
{
    for (int g = 0; fk_metric_groups[g]; g++) {
        printf("%s:\n", fk_metric_groups[g]);
        for (const struct fk_metric *m = fk_metrics; m->name; m++) {
            if (strcmp(m->group, fk_metric_groups[g]))
                continue;
            printf("  %-22s %-14s %-7s %s%s%s\n", m->name, *m->unit ? m->unit : "-",
                   *better(m) ? better(m) : "-", m->row ? "[row] " : "",
                   m->flags & FK_MF_GATE ? "[gated] " : "", m->def);
        }
    }
}

int fk_cli_metrics(int argc, char **argv)
{
    int md = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--markdown")) {
            md = 1;
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: fadkv-bench metrics [--markdown]\n"
                   "  Every metric a results directory holds, by group: unit, better direction,\n"
                   "  [row] when summary.csv has it per stream, [gated] when `check` gates it,\n"
                   "  definition. --markdown: the table of docs/RESULTS.md, with the cell\n"
                   "  value's aggregation and check's cross-machine bands.\n");
            return 0;
        } else {
            fprintf(stderr, "fadkv-bench metrics: unknown argument '%s' (--markdown, --help)\n",
                    argv[i]);
            return 2;
        }
    }
    if (md)
        markdown();
    else
        text();
    return fflush(stdout) ? 1 : 0;
}
