/* SPDX-License-Identifier: MIT
 * The HTML report (see fk_report.h).
 */
#include "report/fk_report.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fk_err.h"
#include "common/fk_str.h"
#include "store/fk_metrics.h"
#include "store/fk_results.h"

/* Text with &, <, > and " escaped. */
static void esc(struct fk_sb *b, const char *s, size_t n)
{
    for (size_t i = 0; i < n && s[i]; i++) {
        char c = s[i];
        if (c == '&')
            fk_sb_printf(b, "&amp;");
        else if (c == '<')
            fk_sb_printf(b, "&lt;");
        else if (c == '>')
            fk_sb_printf(b, "&gt;");
        else if (c == '"')
            fk_sb_printf(b, "&quot;");
        else
            fk_sb_printf(b, "%c", c);
    }
}

static void esc0(struct fk_sb *b, const char *s)
{
    esc(b, s, strlen(s));
}

static void base64(struct fk_sb *b, const unsigned char *p, size_t n)
{
    static const char a[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned)p[i] << 16 | (i + 1 < n ? (unsigned)p[i + 1] << 8 : 0) |
                     (i + 2 < n ? p[i + 2] : 0);
        char q[5] = {a[v >> 18 & 63], a[v >> 12 & 63], i + 1 < n ? a[v >> 6 & 63] : '=',
                     i + 2 < n ? a[v & 63] : '=', 0};
        fk_sb_printf(b, "%s", q);
    }
}

/* A Markdown file of `### heading` lines, pipe tables and one-line paragraphs (as plot
 * writes them) as HTML; HTML comments are left out. */
static void markdown_tables(struct fk_sb *b, const char *md)
{
    int in_table = 0, row = 0;
    for (const char *l = md; l && *l;) {
        const char *e = strchr(l, '\n');
        size_t n = e ? (size_t)(e - l) : strlen(l);
        if (n > 0 && l[0] == '|') {
            int sep = strspn(l, "|-: ") == n; /* |---|---:| */
            if (!in_table)
                fk_sb_printf(b, "<table class=\"t\">\n");
            in_table = 1;
            if (!sep) {
                fk_sb_printf(b, "<tr>");
                const char *c = l + 1, *end = l + n;
                while (c < end) {
                    const char *bar = memchr(c, '|', (size_t)(end - c));
                    const char *stop = bar ? bar : end;
                    while (c < stop && *c == ' ')
                        c++;
                    const char *t = stop;
                    while (t > c && t[-1] == ' ')
                        t--;
                    fk_sb_printf(b, row ? "<td>" : "<th>");
                    esc(b, c, (size_t)(t - c));
                    fk_sb_printf(b, row ? "</td>" : "</th>");
                    c = bar ? bar + 1 : end;
                }
                fk_sb_printf(b, "</tr>\n");
                row++;
            }
        } else {
            if (in_table)
                fk_sb_printf(b, "</table>\n");
            in_table = row = 0;
            if (n > 4 && !strncmp(l, "### ", 4)) {
                fk_sb_printf(b, "<h3>");
                esc(b, l + 4, n - 4);
                fk_sb_printf(b, "</h3>\n");
            } else if (n > 3 && !strncmp(l, "## ", 3)) {
                fk_sb_printf(b, "<h3>");
                esc(b, l + 3, n - 3);
                fk_sb_printf(b, "</h3>\n");
            } else if (n > 0 && strncmp(l, "<!--", 4)) { /* a paragraph: notes, budgets */
                fk_sb_printf(b, "<p>");
                esc(b, l, n);
                fk_sb_printf(b, "</p>\n");
            }
        }
        l = e ? e + 1 : NULL;
    }
    if (in_table)
        fk_sb_printf(b, "</table>\n");
}

static const char style[] =
    "body{font-family:sans-serif;margin:1.5em;max-width:1400px}"
    "h1{font-size:1.4em}h2{font-size:1.2em;border-bottom:1px solid #ccc}"
    "table.t{border-collapse:collapse;font-size:.85em;margin:.5em 0}"
    "table.t td,table.t th{border:1px solid #ccc;padding:2px 6px;text-align:right}"
    "table.t th{background:#eee;cursor:pointer}"
    "figure{display:inline-block;margin:.5em;vertical-align:top;max-width:640px}"
    "figure img{max-width:640px;border:1px solid #ddd}figcaption{font-size:.8em}"
    "nav ol{columns:3;font-size:.85em}tr.groups th{background:#dde}"
    "#cells{overflow-x:auto}pre{background:#f6f6f6;padding:.5em;overflow-x:auto}";

/* Sorting (click a header; numbers compare as numbers), filtering (every cell's text), and
 * the self-check the title reports. */
static const char script[] =
    "var errors=0;window.onerror=function(){errors++;};"
    "function sortBy(th){var t=th.closest('table'),i=th.cellIndex,asc=th.dataset.asc!=='1';"
    "th.dataset.asc=asc?'1':'0';var rs=Array.prototype.slice.call(t.tBodies[0].rows);"
    "rs.sort(function(a,b){var x=a.cells[i].textContent,y=b.cells[i].textContent,"
    "p=parseFloat(x),q=parseFloat(y);var c=(!isNaN(p)&&!isNaN(q))?p-q:x.localeCompare(y);"
    "return asc?c:-c;});rs.forEach(function(r){t.tBodies[0].appendChild(r);});}"
    "function filterRows(v){v=v.toLowerCase();var rs=document.getElementById('celltab')"
    ".tBodies[0].rows;for(var i=0;i<rs.length;i++)rs[i].style.display="
    "rs[i].textContent.toLowerCase().indexOf(v)>=0?'':'none';}"
    "window.addEventListener('load',function(){var im=document.images,bad=0;"
    "for(var i=0;i<im.length;i++)if(!im[i].complete||im[i].naturalWidth===0)bad++;"
    "var ths=document.querySelectorAll('#celltab thead tr:last-child th');"
    "for(var j=0;j<ths.length;j++)ths[j].onclick=function(){sortBy(this);};"
    "document.title='fadkv-bench report: '+(bad||errors?'ERROR, '+bad+' figure(s) not "
    "decoded, '+errors+' script error(s)':'OK, '+im.length+' figures');});";

/* The group of cells.csv column `col`: its metric's (store/fk_metrics.h), or "cell" for
 * the cell's identity and options. */
static const char *column_group(const char *col)
{
    const struct fk_metric *m = fk_metric_find(col);
    return m ? m->group : "cell";
}

/* The cells table of cells.csv, its columns grouped as the metric table groups them (the
 * cell's identity and the options that vary first, then each group in fk_metric_groups
 * order; columns empty or nan in every row left out, identity and option columns every
 * cell shares said once above the table), each metric's unit, better direction and
 * definition in its header's tooltip. */
static int cells_table(struct fk_sb *b, const struct fk_store *st)
{
    const struct fk_csv *c = &st->cells;
    int *order = malloc(sizeof(int) * (size_t)(c->n_cols ? c->n_cols : 1)), n = 0;
    if (!order)
        return fk_err(FK_ENOMEM, "out of memory (report)");
    struct fk_sb common = {0};
    for (int g = -1; fk_metric_groups[g < 0 ? 0 : g]; g++)
        for (int j = 0; j < c->n_cols; j++) {
            int used = 0, same = 1;
            for (int i = 0; i < c->n_rows; i++) {
                used |= c->rows[i][j][0] != 0 && strcmp(c->rows[i][j], "nan");
                same &= !strcmp(c->rows[i][j], c->rows[0][j]);
            }
            if (!used || strcmp(column_group(c->head[j]), g < 0 ? "cell" : fk_metric_groups[g]))
                continue;
            if (g < 0 && same && c->n_rows > 1 && strcmp(c->head[j], "cell_id")) {
                /* an identity or option column every cell shares: said once, above */
                fk_sb_printf(&common, "%s%s = ", common.n ? ", " : "", c->head[j]);
                esc0(&common, c->rows[0][j]);
                continue;
            }
            order[n++] = j;
        }
    fk_sb_printf(b, "<p><input id=\"filter\" placeholder=\"filter rows (any text)\" "
                    "oninput=\"filterRows(this.value)\" size=\"40\"> %d cell(s); click a "
                    "column to sort; hover a header for its definition. Columns empty (or "
                    "nan) in every cell are left out (cells.csv has them all)", c->n_rows);
    if (common.n)
        fk_sb_printf(b, "; every cell has <span id=\"common\">%s</span>", common.s);
    fk_sb_free(&common);
    fk_sb_printf(b, "</p>\n<div id=\"cells\"><table class=\"t\" id=\"celltab\"><thead>"
                    "<tr class=\"groups\">");
    for (int k = 0; k < n;) {
        const char *g = column_group(c->head[order[k]]);
        int span = 1;
        while (k + span < n && !strcmp(column_group(c->head[order[k + span]]), g))
            span++;
        fk_sb_printf(b, "<th colspan=\"%d\">", span);
        esc0(b, g);
        fk_sb_printf(b, "</th>");
        k += span;
    }
    fk_sb_printf(b, "</tr><tr>");
    for (int k = 0; k < n; k++) {
        const struct fk_metric *m = fk_metric_find(c->head[order[k]]);
        fk_sb_printf(b, "<th");
        if (m) {
            fk_sb_printf(b, " title=\"");
            esc0(b, m->def);
            fk_sb_printf(b, "%s%s%s%s\"", *m->unit ? " [" : "", m->unit, *m->unit ? "]" : "",
                         m->better < 0 ? " (lower is better)"
                                       : m->better > 0 ? " (higher is better)" : "");
        }
        fk_sb_printf(b, ">");
        esc0(b, c->head[order[k]]);
        fk_sb_printf(b, "</th>");
    }
    fk_sb_printf(b, "</tr></thead><tbody>\n");
    for (int i = 0; i < c->n_rows; i++) {
        fk_sb_printf(b, "<tr>");
        for (int k = 0; k < n; k++) {
            fk_sb_printf(b, "<td>");
            esc0(b, c->rows[i][order[k]]);
            fk_sb_printf(b, "</td>");
        }
        fk_sb_printf(b, "</tr>\n");
    }
    fk_sb_printf(b, "</tbody></table></div>\n");
    free(order);
    return FK_OK;
}

/* Every drawn figure's PNG, embedded; the others listed with their reasons. */
static int figures(struct fk_sb *b, const char *fig_dir, const struct fk_plot_set *set,
                   int *n_figs)
{
    *n_figs = 0;
    for (int i = 0; i < set->n_figs; i++) {
        const struct fk_plot_fig *f = &set->figs[i];
        if (f->note[0])
            continue;
        char p[PATH_MAX];
        if ((size_t)snprintf(p, sizeof p, "%s/%s.png", fig_dir, f->name) >= sizeof p)
            continue;
        size_t n = 0;
        char *png = fk_slurp(p, &n);
        if (!png)
            continue; /* not drawn as PNG (--format pdf or svg only, or no gnuplot) */
        fk_sb_printf(b, "<figure id=\"fig-");
        esc0(b, f->name);
        fk_sb_printf(b, "\"><img alt=\"");
        esc0(b, f->name);
        fk_sb_printf(b, "\" src=\"data:image/png;base64,");
        base64(b, (const unsigned char *)png, n);
        fk_sb_printf(b, "\"><figcaption><b>");
        esc0(b, f->name);
        fk_sb_printf(b, "</b>. ");
        esc0(b, f->caption);
        fk_sb_printf(b, "</figcaption></figure>\n");
        free(png);
        (*n_figs)++;
    }
    int skipped = 0;
    for (int i = 0; i < set->n_figs; i++)
        skipped += set->figs[i].note[0] != 0;
    if (skipped) {
        fk_sb_printf(b, "<details><summary>%d figure(s) not drawn, with the reason</summary>"
                        "<ul>", skipped);
        for (int i = 0; i < set->n_figs; i++)
            if (set->figs[i].note[0]) {
                fk_sb_printf(b, "<li><b>");
                esc0(b, set->figs[i].name);
                fk_sb_printf(b, "</b>: ");
                esc0(b, set->figs[i].note);
                fk_sb_printf(b, "</li>");
            }
        fk_sb_printf(b, "</ul></details>\n");
    }
    return FK_OK;
}

int fk_report_write(const char *dir, const char *fig_dir, const struct fk_plot_set *set,
                    int *n_figs)
{
    struct fk_store *st;
    FK_TRY(fk_store_open(dir, &st));
    struct fk_sb b = {0};
    fk_sb_printf(&b, "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>fadkv-bench "
                     "report</title><style>%s</style><script>%s</script></head><body>\n",
                 style, script);
    fk_sb_printf(&b, "<h1>fadkv-bench report: ");
    esc0(&b, dir);
    fk_sb_printf(&b, "</h1>\n<p>%d finished cell(s) over %d dataset(s). Replay is "
                     "teacher-forced: per-layer error from the recorded queries, no "
                     "propagation across layers or steps.</p>\n", set->n_cells,
                 set->n_datasets);
    for (int i = 0; i < st->n_damaged; i++) {
        fk_sb_printf(&b, "<p><b>damaged, skipped:</b> ");
        esc0(&b, st->damaged[i]);
        fk_sb_printf(&b, "</p>\n");
    }
    /* contents: the sections, then every drawn figure */
    fk_sb_printf(&b, "<nav><h2>Contents</h2><ol><li><a href=\"#figures\">Figures</a></li>"
                     "<li><a href=\"#budget\">Equal-budget tables</a></li><li><a "
                     "href=\"#table4\">Table 4: cost and memory</a></li><li><a "
                     "href=\"#cells\">Cells</a></li><li><a href=\"#provenance\">"
                     "Provenance</a></li></ol><ol>");
    for (int i = 0; i < set->n_figs; i++) {
        if (set->figs[i].note[0])
            continue;
        fk_sb_printf(&b, "<li><a href=\"#fig-");
        esc0(&b, set->figs[i].name);
        fk_sb_printf(&b, "\">");
        esc0(&b, set->figs[i].name);
        fk_sb_printf(&b, "</a></li>");
    }
    fk_sb_printf(&b, "</ol></nav>\n<h2 id=\"figures\">Figures</h2>\n");
    int rc = figures(&b, fig_dir, set, n_figs);
    const char *tables[2][3] = {
        {"budget", "Equal-budget tables", set->budget_md},
        {"table4", "Table 4: cost and memory (paper Table 4)", set->table_md}};
    for (int k = 0; rc == FK_OK && k < 2; k++) {
        char *md = tables[k][2][0] ? fk_slurp(tables[k][2], NULL) : NULL;
        fk_sb_printf(&b, "<h2 id=\"%s\">%s</h2>\n", tables[k][0], tables[k][1]);
        if (!md) {
            fk_sb_printf(&b, "<p>Not written for these results.</p>\n");
            continue;
        }
        markdown_tables(&b, md);
        free(md);
    }
    fk_sb_printf(&b, "<h2 id=\"cells\">Cells</h2>\n");
    if (rc == FK_OK)
        rc = cells_table(&b, st);
    char *prov = NULL;
    if (fk_store_path(&prov, dir, "provenance.json") == FK_OK) {
        char *json = fk_slurp(prov, NULL);
        if (json) {
            fk_sb_printf(&b, "<h2 id=\"provenance\">Provenance</h2>\n<pre>");
            esc0(&b, json);
            fk_sb_printf(&b, "</pre>\n");
            free(json);
        }
        free(prov);
    }
    fk_sb_printf(&b, "</body></html>\n");
    char *out = NULL;
    if (rc == FK_OK)
        rc = b.oom ? fk_err(FK_ENOMEM, "out of memory (report)")
                   : fk_store_path(&out, fig_dir, "report.html");
    if (rc == FK_OK)
        rc = fk_write_atomic(out, b.s, b.n);
    free(out);
    fk_sb_free(&b);
    fk_store_close(&st);
    return rc;
}
