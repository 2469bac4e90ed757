/* SPDX-License-Identifier: MIT
 * A growable text buffer and whole-file reading, shared by the results store, the plot
 * export and the merge tool.
 */
#ifndef FK_STR_H
#define FK_STR_H

#include <stddef.h>

struct fk_sb {
    char *s;                     /* NUL-terminated text (NULL while empty) */
    size_t n;                    /* used bytes */
    size_t cap;                  /* allocated bytes */
    int oom;                     /* an allocation failed: later appends are dropped */
};

void fk_sb_printf(struct fk_sb *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void fk_sb_free(struct fk_sb *b);

/* The whole file, NUL-terminated (malloc'ed), or NULL when it cannot be read. */
char *fk_slurp(const char *path, size_t *len);

#endif
