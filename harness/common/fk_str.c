/* SPDX-License-Identifier: MIT
 * Growable text and whole-file reading (see fk_str.h).
 */
#include "common/fk_str.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void fk_sb_printf(struct fk_sb *b, const char *fmt, ...)
{
    if (b->oom)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = b->cap - b->n;
        int k = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? room : 0, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->oom = 1;
            return;
        }
        if (b->s && (size_t)k < room) {
            b->n += (size_t)k;
            return;
        }
        size_t nc = (b->cap + (size_t)k + 1) * 2;
        char *ns = realloc(b->s, nc);
        if (!ns) {
            b->oom = 1;
            return;
        }
        b->s = ns;
        b->cap = nc;
    }
}

void fk_sb_free(struct fk_sb *b)
{
    free(b->s);
    memset(b, 0, sizeof *b);
}

char *fk_slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, n = 0;
    char *s = malloc(cap + 1);
    while (s) {
        n += fread(s + n, 1, cap - n, f);
        if (n < cap)
            break;
        char *ns = realloc(s, cap * 2 + 1);
        if (!ns) {
            free(s);
            s = NULL;
            break;
        }
        s = ns;
        cap *= 2;
    }
    int err = ferror(f);
    fclose(f);
    if (s && err) {
        free(s);
        return NULL;
    }
    if (s) {
        s[n] = 0;
        if (len)
            *len = n;
    }
    return s;
}
