/* SPDX-License-Identifier: MIT
 * A head pattern file (engine/fk_heads.h).
 */
#include "engine/fk_heads.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fk_err.h"

void fk_head_pattern_free(struct fk_head_pattern **p)
{
    if (!p || !*p)
        return;
    free((*p)->score);
    free((*p)->path);
    free(*p);
    *p = NULL;
}

/* Appends the numbers of one line to p (cols: their count). */
static int parse_line(struct fk_head_pattern *p, size_t *cap, char *line, const char *path,
                      int ln, int *cols)
{
    *cols = 0;
    for (char *s = line;;) {
        while (*s == ' ' || *s == '\t' || *s == '\r' || *s == '\n')
            s++;
        if (!*s)
            return FK_OK;
        char *end;
        errno = 0;
        double v = strtod(s, &end);
        if (end == s || errno || !isfinite(v)) {
            int len = (int)strcspn(s, " \t\r\n");
            return fk_err(FK_ECORRUPT, "%s:%d: expected a number (a head's gate), got '%.*s'",
                          path, ln, len < 20 ? len : 20, s);
        }
        size_t n = (size_t)p->n_layers * (size_t)(p->n_heads > 0 ? p->n_heads : 0) + *cols;
        if (n + 1 > *cap) {
            size_t c = *cap ? 2 * *cap : 256;
            double *q = realloc(p->score, sizeof(double) * c);
            if (!q)
                return fk_err(FK_ENOMEM, "out of memory");
            p->score = q, *cap = c;
        }
        p->score[n] = v < 0 ? 0 : v > 1 ? 1 : v; /* clipped, as load_attn_pattern */
        (*cols)++;
        s = end;
    }
}

int fk_head_pattern_load(const char *path, struct fk_head_pattern **out)
{
    *out = NULL;
    FILE *f = fopen(path, "r");
    if (!f)
        return fk_err(FK_EIO, "%s: cannot open the head pattern: %s", path, strerror(errno));
    struct fk_head_pattern *p = calloc(1, sizeof *p);
    char *line = NULL;
    size_t lcap = 0, cap = 0;
    int rc = p && (p->path = strdup(path)) ? FK_OK : fk_err(FK_ENOMEM, "out of memory");
    for (int ln = 1; rc == FK_OK && getline(&line, &lcap, f) >= 0; ln++) {
        int cols;
        rc = parse_line(p, &cap, line, path, ln, &cols);
        if (rc < 0 || cols == 0)
            continue;
        if (p->n_layers == 0)
            p->n_heads = cols;
        else if (cols != p->n_heads)
            rc = fk_err(FK_ECORRUPT, "%s:%d: %d columns where the first row has %d (one "
                        "column per KV head)", path, ln, cols, p->n_heads);
        if (rc == FK_OK)
            p->n_layers++;
    }
    if (rc == FK_OK && ferror(f))
        rc = fk_err(FK_EIO, "%s: read error", path);
    if (rc == FK_OK && p->n_layers == 0)
        rc = fk_err(FK_ECORRUPT, "%s: no row of gates (expected one row per layer, one column "
                    "per KV head)", path);
    free(line);
    fclose(f);
    if (rc < 0)
        fk_head_pattern_free(&p);
    *out = p;
    return rc;
}
