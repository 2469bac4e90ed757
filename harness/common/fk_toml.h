/* SPDX-License-Identifier: MIT
 * TOML 1.0 reader: parses a document into a tree of values (a small DOM).
 *
 * Debian ships no C TOML library, so the project has its own. It accepts exactly TOML 1.0.0
 * (checked against the toml-test corpus) including date-times, which are kept as raw text with
 * a type tag. Every value remembers its file name, line and column (1-based, columns count
 * code points) so that later validation can say "sweep.toml:12:5: key 's' ...". Tables keep
 * their keys in insertion order. Errors are FK_ECONFIG with "FILE:LINE:COL: what (expected
 * ...)". Nesting (tables, arrays, inline tables) is limited to FK_TOML_MAX_DEPTH levels.
 *
 * Values are opaque; read them with the accessors below. A tree is owned by whoever received
 * it from a parse/clone function and is released with fk_toml_free(). Functions are reentrant
 * (no global state); a tree may be read from many threads but edited from one.
 *
 * Notes: multi-line strings normalise CRLF to LF (same bytes on every platform, so config
 * hashes agree); floats are converted with strtod, so the process must keep the "C" LC_NUMERIC
 * locale (the default unless someone calls setlocale); floats that overflow a double are
 * rejected, integers outside int64_t are rejected.
 */
#ifndef FK_TOML_H
#define FK_TOML_H

#include <stddef.h>
#include <stdint.h>

#define FK_TOML_MAX_DEPTH 128 /* deepest nesting of containers accepted */

enum fk_toml_type {
    FK_TOML_TABLE = 1,      /* table (also the document root and inline tables) */
    FK_TOML_ARRAY,          /* array (static or array of tables) */
    FK_TOML_STRING,         /* UTF-8 string; may contain NUL (use the length) */
    FK_TOML_INT,            /* int64_t */
    FK_TOML_FLOAT,          /* double */
    FK_TOML_BOOL,           /* 0 or 1 */
    FK_TOML_DATETIME,       /* offset date-time, e.g. 1979-05-27T07:32:00Z (raw text) */
    FK_TOML_DATETIME_LOCAL, /* local date-time, e.g. 1979-05-27T07:32:00 (raw text) */
    FK_TOML_DATE_LOCAL,     /* local date, e.g. 1979-05-27 (raw text) */
    FK_TOML_TIME_LOCAL,     /* local time, e.g. 07:32:00.5 (raw text) */
};

struct fk_toml_value;

/* One key of a table, in insertion order. Valid until the table is edited or freed. */
struct fk_toml_entry {
    const char *key;                   /* NUL-terminated copy; may hold NULs: use key_len */
    size_t key_len;                    /* bytes in key */
    const char *origin;                /* source the key was read from ("sweep.toml", "--set") */
    int line, col;                     /* 1-based position of the key in origin */
    const struct fk_toml_value *value; /* owned by the table */
};

/* ---- parsing and lifetime ---- */

/* Parses a whole TOML document of len bytes; origin names the source in messages.
 * @return FK_OK and *out = new root table (caller frees), or FK_ECONFIG / FK_ENOMEM with
 * *out = NULL. */
int fk_toml_parse(const char *buf, size_t len, const char *origin, struct fk_toml_value **out);

/* Reads and parses the file at path (messages name the path). FK_EIO if unreadable. */
int fk_toml_parse_file(const char *path, struct fk_toml_value **out);

/* Parses one TOML value ("8", "[4, 8]", "\"fp8\"", "{a = 1}", "2024-01-01"), surrounded by
 * optional blanks, e.g. the right-hand side of a `--set key=value` override. */
int fk_toml_parse_value(const char *text, const char *origin, struct fk_toml_value **out);

/* Frees a tree and sets *v to NULL. Accepts v == NULL and *v == NULL. */
void fk_toml_free(struct fk_toml_value **v);

/* Deep copy of v (positions and origins kept). */
int fk_toml_clone(const struct fk_toml_value *v, struct fk_toml_value **out);

/* ---- inspection ---- */

enum fk_toml_type fk_toml_type(const struct fk_toml_value *v); /* 0 for NULL */
const char *fk_toml_type_name(enum fk_toml_type t); /* "table", "integer", ... */
int fk_toml_line(const struct fk_toml_value *v);        /* 1-based line of the value */
int fk_toml_col(const struct fk_toml_value *v);         /* 1-based column of the value */
const char *fk_toml_origin(const struct fk_toml_value *v); /* file name given at parse */

/* Tables (these return 0 / NULL when v is not a table or the key is absent). */
size_t fk_toml_table_len(const struct fk_toml_value *v);
const struct fk_toml_entry *fk_toml_table_at(const struct fk_toml_value *v, size_t i);
const struct fk_toml_value *fk_toml_table_get(const struct fk_toml_value *v, const char *key);
const struct fk_toml_value *fk_toml_table_getn(const struct fk_toml_value *v, const char *key,
                                               size_t key_len);
/* Looks up a dotted key ("codec.lexico.grid", quoted parts allowed); NULL if absent/invalid. */
const struct fk_toml_value *fk_toml_table_find(const struct fk_toml_value *v,
                                               const char *dotted);

/* Arrays (0 / NULL when v is not an array or i is out of range). */
size_t fk_toml_array_len(const struct fk_toml_value *v);
const struct fk_toml_value *fk_toml_array_at(const struct fk_toml_value *v, size_t i);

/* Typed getters: FK_OK, or FK_ECONFIG "FILE:LINE:COL: expected T, got U" for a wrong type
 * (FK_EINVAL for v == NULL). fk_toml_get_float also accepts an integer of magnitude <= 2^53. */
int fk_toml_get_int(const struct fk_toml_value *v, int64_t *out);
int fk_toml_get_float(const struct fk_toml_value *v, double *out);
int fk_toml_get_bool(const struct fk_toml_value *v, int *out);
int fk_toml_get_string(const struct fk_toml_value *v, const char **out, size_t *len);
/* Any of the four date-time kinds: the raw text as written, e.g. "1979-05-27 07:32:00z". */
int fk_toml_get_datetime(const struct fk_toml_value *v, const char **out);

/* ---- editing and output ---- */

/* Sets the value at a dotted key path inside table root, creating intermediate tables and
 * replacing any existing value. Takes ownership of *val and sets *val = NULL (also on error).
 * FK_ECONFIG (message names origin) if the path is not a valid key or crosses a non-table. */
int fk_toml_set_path(struct fk_toml_value *root, const char *path, const char *origin,
                     struct fk_toml_value **val);

/* Canonical one-line text of v, an inline TOML value: tables as {k = v, ...} in insertion
 * order, floats with %.17g (inf, -inf, nan), strings as escaped basic strings, date-times as
 * written. Deterministic (used to hash resolved configs); parses back with
 * fk_toml_parse_value. *out is malloc'ed (caller frees); *len (optional) excludes the NUL. */
int fk_toml_to_string(const struct fk_toml_value *v, char **out, size_t *len);

#endif
