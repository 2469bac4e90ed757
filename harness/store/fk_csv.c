/* SPDX-License-Identifier: MIT
 * CSV reader (see fk_csv.h).
 */
#include "store/fk_csv.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/fk_err.h"
#include "common/fk_str.h"

struct strvec {
    char **v;                    /* [n] owned strings */
    int n;                       /* strings held */
    int cap;                     /* allocated entries */
};

static int sv_push(struct strvec *a, char *s)
{
    if (!s)
        return fk_err(FK_ENOMEM, "out of memory");
    if (a->n == a->cap) {
        int nc = a->cap ? a->cap * 2 : 32;
        char **nv = realloc(a->v, sizeof(char *) * (size_t)nc);
        if (!nv) {
            free(s);
            return fk_err(FK_ENOMEM, "out of memory");
        }
        a->v = nv;
        a->cap = nc;
    }
    a->v[a->n++] = s;
    return FK_OK;
}

static void sv_free(struct strvec *a)
{
    for (int i = 0; i < a->n; i++)
        free(a->v[i]);
    free(a->v);
    memset(a, 0, sizeof *a);
}

/* Appends c to the field f (n used, cap allocated bytes, room for the NUL kept). */
static int field_put(char **f, size_t *n, size_t *cap, char c)
{
    if (*n + 2 > *cap) {
        char *nf = realloc(*f, *cap *= 2);
        if (!nf)
            return fk_err(FK_ENOMEM, "out of memory");
        *f = nf;
    }
    (*f)[(*n)++] = c;
    return FK_OK;
}

/* One field at *s (quoted or not) into *out (malloc'ed); *s moves past it. */
static int csv_field_read(const char *path, int line, const char **sp, char **out)
{
    const char *s = *sp;
    size_t cap = 64, n = 0;
    char *f = malloc(cap);
    int rc = f ? FK_OK : fk_err(FK_ENOMEM, "out of memory");
    if (rc == FK_OK && *s == '"') {
        for (s++; rc == FK_OK; s++) {
            if (!*s) {
                rc = fk_err(FK_ECORRUPT, "%s:%d: unterminated quoted field", path, line);
                break;
            }
            if (*s == '"' && s[1] == '"') {
                s++;
            } else if (*s == '"') {
                s++;
                break;
            }
            rc = field_put(&f, &n, &cap, *s);
        }
        if (rc == FK_OK && *s && *s != ',' && *s != '\n' && *s != '\r')
            rc = fk_err(FK_ECORRUPT, "%s:%d: expected ',' after a quoted field", path, line);
    } else {
        for (; rc == FK_OK && *s && *s != ',' && *s != '\n' && *s != '\r'; s++)
            rc = field_put(&f, &n, &cap, *s);
    }
    if (rc < 0) {
        free(f);
        return rc;
    }
    f[n] = 0;
    *out = f;
    *sp = s;
    return FK_OK;
}

/* Parses one record starting at *p; fields go to out; *p moves past the record's newline. */
static int csv_record(const char *path, int line, const char **p, struct strvec *out)
{
    const char *s = *p;
    for (;;) {
        char *f;
        FK_TRY(csv_field_read(path, line, &s, &f));
        FK_TRY(sv_push(out, f));
        if (*s == ',') {
            s++;
            continue;
        }
        if (*s == '\r')
            s++;
        if (*s == '\n')
            s++;
        break;
    }
    *p = s;
    return FK_OK;
}

/* ---- writing ---------------------------------------------------------------------------- */

void fk_csv_field(struct fk_sb *b, const char *v)
{
    if (!strpbrk(v, ",\"\n")) {
        fk_sb_printf(b, "%s", v);
        return;
    }
    fk_sb_printf(b, "\"");
    for (const char *p = v; *p; p++)
        fk_sb_printf(b, *p == '"' ? "\"\"" : "%c", *p);
    fk_sb_printf(b, "\"");
}

void fk_csv_free(struct fk_csv *c)
{
    for (int j = 0; j < c->n_cols; j++)
        free(c->head[j]);
    free(c->head);
    for (int i = 0; i < c->n_rows; i++) {
        for (int j = 0; j < c->n_cols; j++)
            free(c->rows[i][j]);
        free(c->rows[i]);
    }
    free(c->rows);
    memset(c, 0, sizeof *c);
}

int fk_csv_load(const char *path, struct fk_csv *out)
{
    memset(out, 0, sizeof *out);
    char *text = fk_slurp(path, NULL);
    if (!text)
        return fk_err(FK_EIO, "%s: cannot read (%s)", path, strerror(errno));
    const char *p = text;
    struct strvec rec = {0};
    int rc = csv_record(path, 1, &p, &rec);
    if (rc == FK_OK && (rec.n == 0 || (rec.n == 1 && !rec.v[0][0])))
        rc = fk_err(FK_ECORRUPT, "%s:1: expected a header line", path);
    if (rc < 0) {
        sv_free(&rec);
        free(text);
        return rc;
    }
    out->head = rec.v;
    out->n_cols = rec.n;
    int cap = 0, line = 1;
    while (*p && rc == FK_OK) {
        line++;
        if (*p == '\n' || *p == '\r') {
            p += *p == '\r' && p[1] == '\n' ? 2 : 1;
            continue;
        }
        struct strvec r = {0};
        rc = csv_record(path, line, &p, &r);
        if (rc == FK_OK && r.n > out->n_cols)
            rc = fk_err(FK_ECORRUPT, "%s:%d: %d fields, the header has %d", path, line, r.n,
                        out->n_cols);
        while (rc == FK_OK && r.n < out->n_cols)
            rc = sv_push(&r, strdup(""));
        if (rc == FK_OK && out->n_rows == cap) {
            cap = cap ? cap * 2 : 256;
            char ***nr = realloc(out->rows, sizeof(char **) * (size_t)cap);
            if (!nr)
                rc = fk_err(FK_ENOMEM, "out of memory");
            else
                out->rows = nr;
        }
        if (rc < 0) {
            sv_free(&r);
            break;
        }
        out->rows[out->n_rows++] = r.v;
    }
    free(text);
    if (rc < 0)
        fk_csv_free(out);
    return rc;
}

int fk_csv_col(const struct fk_csv *c, const char *name)
{
    for (int j = 0; j < c->n_cols; j++)
        if (!strcmp(c->head[j], name))
            return j;
    return -1;
}

double fk_csv_num(const struct fk_csv *c, int row, int col)
{
    if (col < 0 || row < 0 || row >= c->n_rows)
        return NAN;
    const char *s = c->rows[row][col];
    char *end;
    double v = strtod(s, &end);
    return end == s ? NAN : v;
}

const char *fk_csv_str(const struct fk_csv *c, int row, int col)
{
    return col < 0 ? "" : c->rows[row][col];
}
