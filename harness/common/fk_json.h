/* SPDX-License-Identifier: MIT
 * A small, strict JSON writer and reader (RFC 8259), enough for provenance.json.
 *
 * The writer lays an object out one member per line, indented by two spaces per level, and
 * an array on one line ("[a, b]"); strings are escaped (quote, backslash, control
 * characters). The reader takes objects, arrays, strings, numbers, true, false and null,
 * rejects anything else (trailing commas, comments, bad escapes, text after the value), and
 * names FILE:LINE:COL in its errors.
 */
#ifndef FK_JSON_H
#define FK_JSON_H

#include <stddef.h>

#include "common/fk_str.h"

/* ---- writer ---------------------------------------------------------------------------- */

#define FK_JSON_MAX_DEPTH 32

struct fk_json_w {
    struct fk_sb sb;             /* the text so far */
    int depth;                   /* open objects and arrays */
    int n[FK_JSON_MAX_DEPTH];    /* values written at each level */
    char kind[FK_JSON_MAX_DEPTH]; /* '{' or '[' per level */
    int after_key;               /* a key was written, its value comes next */
    int bad;                     /* misuse (too deep, value without key, ...) */
};

void fk_json_begin_object(struct fk_json_w *w);
void fk_json_end_object(struct fk_json_w *w);
void fk_json_begin_array(struct fk_json_w *w);
void fk_json_end_array(struct fk_json_w *w);
void fk_json_key(struct fk_json_w *w, const char *key);
void fk_json_str(struct fk_json_w *w, const char *s);
void fk_json_int(struct fk_json_w *w, long long v);
void fk_json_num(struct fk_json_w *w, double v); /* %.17g; NaN and infinities are misuse */
void fk_json_bool(struct fk_json_w *w, int v);
/* The finished text (NUL-terminated, ends with a newline), ownership to the caller:
 * FK_ENOMEM, or FK_EINVAL when the writer was misused or a value is still open. */
int fk_json_finish(struct fk_json_w *w, char **text, size_t *len);

/* ---- reader ---------------------------------------------------------------------------- */

enum fk_json_type { FK_JSON_NULL, FK_JSON_BOOL, FK_JSON_NUM, FK_JSON_STR, FK_JSON_ARR,
                    FK_JSON_OBJ };

struct fk_json {
    enum fk_json_type type;
    int boolean;                 /* FK_JSON_BOOL */
    double num;                  /* FK_JSON_NUM */
    char *str;                   /* FK_JSON_STR: UTF-8, NUL-terminated */
    struct fk_json *items;       /* FK_JSON_ARR, FK_JSON_OBJ: [n] values */
    char **keys;                 /* FK_JSON_OBJ: [n] member names */
    int n;                       /* members or elements */
    int line, col;               /* where the value starts (1-based) */
};

/* Parses text (name is used in messages, e.g. the file path). FK_ECORRUPT with
 * "name:line:col: ..." on a syntax error, FK_ENOMEM. *out is freed with fk_json_free. */
int fk_json_parse(const char *text, const char *name, struct fk_json **out);
/* Reads and parses a file (FK_EIO if unreadable). */
int fk_json_load(const char *path, struct fk_json **out);
void fk_json_free(struct fk_json **v);
/* Member `key` of an object (the last one when repeated), or NULL. */
const struct fk_json *fk_json_get(const struct fk_json *obj, const char *key);

#endif
