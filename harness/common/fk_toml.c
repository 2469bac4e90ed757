/* SPDX-License-Identifier: MIT
 * TOML 1.0 reader (see fk_toml.h): a hand-written recursive-descent parser into a small DOM.
 *
 * Redefinition rules follow the TOML 1.0 spec as the toml-test corpus reads it: a table may be
 * defined by one [header] only; tables created by dotted keys cannot be reopened by a header;
 * dotted keys cannot extend a header-defined table or an inline table; [[x]] appends only to an
 * array created by [[x]]. These are enforced with per-node flags (TF_*). Recursion (arrays and
 * inline tables) is bounded by FK_TOML_MAX_DEPTH; every read checks the buffer end.
 * Multi-line strings normalise CRLF to LF so that a config hashes the same on every platform.
 */
#include "common/fk_toml.h"

#include "common/fk_err.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    TF_HEADER = 1u << 0, /* table defined by a [header] (or an element of [[header]]) */
    TF_DOTTED = 1u << 1, /* table created or extended by dotted keys */
    TF_INLINE = 1u << 2, /* table inside an inline-table literal, or a static array value */
    TF_AOT = 1u << 3,    /* array created by [[header]] */
};

#define TAB_INDEX_MIN 8 /* tables with at least this many keys get a hash index */

struct fk_toml_origin {
    int refs;    /* number of values and entries pointing here */
    char name[]; /* NUL-terminated source name */
};

struct tent {
    struct fk_toml_entry pub;  /* what fk_toml_table_at() hands out */
    char *key;                 /* owned; pub.key aliases it */
    struct fk_toml_value *val; /* owned; pub.value aliases it */
    struct fk_toml_origin *origin; /* reference held for pub.origin */
};

struct fk_toml_value {
    enum fk_toml_type type;        /* kind of value */
    int line, col;                 /* 1-based position of the value in origin */
    struct fk_toml_origin *origin; /* source name, shared and refcounted */
    unsigned flags;                /* TF_* (parser bookkeeping) */
    long owner;                    /* id of the inline-table literal that created it, 0 if none */
    union {
        int64_t i; /* FK_TOML_INT */
        double f;  /* FK_TOML_FLOAT */
        int b;     /* FK_TOML_BOOL: 0 or 1 */
        struct {
            char *s;    /* NUL-terminated bytes (string or date-time text) */
            size_t len; /* bytes, without the NUL */
        } str;
        struct {
            struct fk_toml_value **v; /* (n) owned elements */
            size_t n, cap;            /* used and allocated slots */
        } arr;
        struct {
            struct tent *e; /* (n) entries in insertion order */
            size_t n, cap;  /* used and allocated entries */
            size_t *index;  /* (hcap) open-addressing slots: entry index + 1, 0 = empty */
            size_t hcap;    /* power of two, or 0 without an index */
        } tab;
    } u;
};

struct keypart {
    char *s;        /* owned key bytes (NUL-terminated), NULL once moved into a table */
    size_t len;     /* bytes in s */
    size_t off;     /* byte offset of the part in the buffer */
    size_t end;     /* byte offset just past the part */
    int line, col;  /* position of the part */
};

struct key {
    struct keypart *parts; /* (n) parts of a dotted key */
    size_t n, cap;         /* used and allocated parts */
};

struct sbuf {
    char *s;       /* growing byte buffer, NUL-terminated when n > 0 */
    size_t n, cap; /* used and allocated bytes */
};

struct parser {
    const char *buf;               /* input, not NUL-terminated */
    size_t len, pos;               /* input bytes and read position */
    size_t start;                  /* offset after a leading BOM */
    struct fk_toml_origin *origin; /* source name for nodes and messages */
    size_t cur_off;                /* line/col cursor: offset ... */
    int cur_line, cur_col;         /* ... and its position (moves forward only, mostly) */
    long inline_id;                /* inline-table literal being parsed, 0 at top level */
    long next_inline;              /* last inline id handed out */
    int quiet;                     /* nonzero: errors set no message (fk_toml_table_find) */
};

/* ------------------------------------------------------------------ */
/* errors and positions                                               */

static void linecol(struct parser *p, size_t off, int *line, int *col)
{
    if (off > p->len)
        off = p->len;
    if (off < p->cur_off) {
        p->cur_off = p->start;
        p->cur_line = 1;
        p->cur_col = 1;
    }
    for (size_t i = p->cur_off; i < off; i++) {
        unsigned char c = (unsigned char)p->buf[i];
        if (c == '\n') {
            p->cur_line++;
            p->cur_col = 1;
        } else if ((c & 0xC0) != 0x80) {
            p->cur_col++;
        }
    }
    p->cur_off = off;
    *line = p->cur_line;
    *col = p->cur_col;
}

static int perr(struct parser *p, size_t off, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

static int perr(struct parser *p, size_t off, const char *fmt, ...)
{
    if (p->quiet)
        return FK_ECONFIG;
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int line, col;
    linecol(p, off, &line, &col);
    return fk_err(FK_ECONFIG, "%s:%d:%d: %s", p->origin->name, line, col, msg);
}

static int oom(void) { return fk_err(FK_ENOMEM, "toml: out of memory"); }

/* Describes the byte at off for messages: 'x', end of file, newline, U+XXXX. */
static const char *describe(const struct parser *p, size_t off, char *tmp, size_t cap)
{
    if (off >= p->len)
        return "end of file";
    unsigned char c = (unsigned char)p->buf[off];
    if (c == '\n' || (c == '\r' && off + 1 < p->len && p->buf[off + 1] == '\n'))
        return "end of line";
    if (c >= 0x21 && c < 0x7F)
        snprintf(tmp, cap, "'%c'", c);
    else if (c < 0x80)
        snprintf(tmp, cap, "U+%04X", c);
    else if (c >= 0xC2 && c <= 0xF4) { /* input is valid UTF-8 by now: decode for the reader */
        size_t k = c < 0xE0 ? 1 : c < 0xF0 ? 2 : 3;
        unsigned long cp = c & (0x3Fu >> k);
        for (size_t j = 1; j <= k && off + j < p->len; j++)
            cp = (cp << 6) | ((unsigned char)p->buf[off + j] & 0x3Fu);
        snprintf(tmp, cap, "U+%04lX", cp);
    } else {
        snprintf(tmp, cap, "byte 0x%02X", c);
    }
    return tmp;
}

/* ------------------------------------------------------------------ */
/* nodes                                                              */

static struct fk_toml_origin *origin_new(const char *name)
{
    size_t n = strlen(name);
    struct fk_toml_origin *o = malloc(sizeof *o + n + 1);
    if (!o)
        return NULL;
    o->refs = 1;
    memcpy(o->name, name, n + 1);
    return o;
}

static struct fk_toml_origin *origin_ref(struct fk_toml_origin *o)
{
    if (o)
        o->refs++;
    return o;
}

static void origin_unref(struct fk_toml_origin *o)
{
    if (o && --o->refs == 0)
        free(o);
}

static struct fk_toml_value *node_alloc(enum fk_toml_type t, struct fk_toml_origin *o, int line,
                                        int col)
{
    struct fk_toml_value *v = calloc(1, sizeof *v);
    if (!v)
        return NULL;
    v->type = t;
    v->origin = origin_ref(o);
    v->line = line;
    v->col = col;
    return v;
}

static struct fk_toml_value *node_new(struct parser *p, enum fk_toml_type t, size_t off)
{
    int line, col;
    linecol(p, off, &line, &col);
    return node_alloc(t, p->origin, line, col);
}

static void node_free(struct fk_toml_value *v)
{
    if (!v)
        return;
    switch (v->type) {
    case FK_TOML_TABLE:
        for (size_t i = 0; i < v->u.tab.n; i++) {
            free(v->u.tab.e[i].key);
            node_free(v->u.tab.e[i].val);
            origin_unref(v->u.tab.e[i].origin);
        }
        free(v->u.tab.e);
        free(v->u.tab.index);
        break;
    case FK_TOML_ARRAY:
        for (size_t i = 0; i < v->u.arr.n; i++)
            node_free(v->u.arr.v[i]);
        free(v->u.arr.v);
        break;
    case FK_TOML_STRING:
    case FK_TOML_DATETIME:
    case FK_TOML_DATETIME_LOCAL:
    case FK_TOML_DATE_LOCAL:
    case FK_TOML_TIME_LOCAL:
        free(v->u.str.s);
        break;
    default:
        break;
    }
    origin_unref(v->origin);
    free(v);
}

void fk_toml_free(struct fk_toml_value **v)
{
    if (!v)
        return;
    node_free(*v);
    *v = NULL;
}

static uint64_t key_hash(const char *k, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)k[i];
        h *= 1099511628211ull;
    }
    return h;
}

static size_t tab_find(const struct fk_toml_value *t, const char *k, size_t n)
{
    if (t->u.tab.index) {
        size_t mask = t->u.tab.hcap - 1;
        size_t h = (size_t)key_hash(k, n) & mask;
        while (t->u.tab.index[h]) {
            const struct tent *e = &t->u.tab.e[t->u.tab.index[h] - 1];
            if (e->pub.key_len == n && memcmp(e->key, k, n) == 0)
                return t->u.tab.index[h] - 1;
            h = (h + 1) & mask;
        }
        return SIZE_MAX;
    }
    for (size_t i = 0; i < t->u.tab.n; i++) {
        const struct tent *e = &t->u.tab.e[i];
        if (e->pub.key_len == n && memcmp(e->key, k, n) == 0)
            return i;
    }
    return SIZE_MAX;
}

static void index_put(struct fk_toml_value *t, size_t i)
{
    size_t mask = t->u.tab.hcap - 1;
    const struct tent *e = &t->u.tab.e[i];
    size_t h = (size_t)key_hash(e->key, e->pub.key_len) & mask;
    while (t->u.tab.index[h])
        h = (h + 1) & mask;
    t->u.tab.index[h] = i + 1;
}

static int index_rebuild(struct fk_toml_value *t, size_t want)
{
    size_t cap = 16;
    while (cap < 2 * want)
        cap *= 2;
    size_t *idx = calloc(cap, sizeof *idx);
    if (!idx)
        return oom();
    free(t->u.tab.index);
    t->u.tab.index = idx;
    t->u.tab.hcap = cap;
    for (size_t i = 0; i < t->u.tab.n; i++)
        index_put(t, i);
    return FK_OK;
}

/* Appends key -> val to table t. Takes ownership of key and val (freed on failure). */
static int tab_append(struct fk_toml_value *t, char *key, size_t key_len,
                      struct fk_toml_origin *o, int line, int col, struct fk_toml_value *val)
{
    if (t->u.tab.n == t->u.tab.cap) {
        size_t cap = t->u.tab.cap ? 2 * t->u.tab.cap : 4;
        struct tent *e = realloc(t->u.tab.e, cap * sizeof *e);
        if (!e) {
            free(key);
            node_free(val);
            return oom();
        }
        t->u.tab.e = e;
        t->u.tab.cap = cap;
        for (size_t i = 0; i < t->u.tab.n; i++) { /* realloc moved them: re-alias */
            t->u.tab.e[i].pub.key = t->u.tab.e[i].key;
            t->u.tab.e[i].pub.value = t->u.tab.e[i].val;
        }
    }
    struct tent *e = &t->u.tab.e[t->u.tab.n++];
    e->key = key;
    e->val = val;
    e->origin = origin_ref(o);
    e->pub.key = key;
    e->pub.key_len = key_len;
    e->pub.origin = o ? o->name : "";
    e->pub.line = line;
    e->pub.col = col;
    e->pub.value = val;
    size_t n = t->u.tab.n;
    if (n >= TAB_INDEX_MIN) {
        if (!t->u.tab.index || 2 * n > t->u.tab.hcap)
            return index_rebuild(t, 2 * n);
        index_put(t, n - 1);
    }
    return FK_OK;
}

static int arr_push(struct fk_toml_value *a, struct fk_toml_value *v)
{
    if (a->u.arr.n == a->u.arr.cap) {
        size_t cap = a->u.arr.cap ? 2 * a->u.arr.cap : 4;
        struct fk_toml_value **nv = realloc(a->u.arr.v, cap * sizeof *nv);
        if (!nv) {
            node_free(v);
            return oom();
        }
        a->u.arr.v = nv;
        a->u.arr.cap = cap;
    }
    a->u.arr.v[a->u.arr.n++] = v;
    return FK_OK;
}

static int sb_put(struct sbuf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 32;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *ns = realloc(b->s, cap);
        if (!ns)
            return oom();
        b->s = ns;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = '\0';
    return FK_OK;
}

static int sb_putc(struct sbuf *b, char c) { return sb_put(b, &c, 1); }

/* Hands the buffer over as a NUL-terminated string (an empty one if nothing was added). */
static char *sb_take(struct sbuf *b)
{
    char *s = b->s;
    if (!s)
        s = calloc(1, 1);
    b->s = NULL;
    b->n = b->cap = 0;
    return s;
}

static const char *type_label(const struct fk_toml_value *v)
{
    if (v->type == FK_TOML_TABLE && (v->flags & TF_INLINE))
        return "inline table";
    if (v->type == FK_TOML_ARRAY && (v->flags & TF_AOT))
        return "array of tables";
    return fk_toml_type_name(v->type);
}

/* "a" or "an" for a label, for messages. */
static const char *art(const char *w) { return strchr("aeiou", w[0]) ? "an" : "a"; }

/* ------------------------------------------------------------------ */
/* lexing helpers                                                     */

static int at(const struct parser *p, size_t k)
{
    return p->pos + k < p->len ? (unsigned char)p->buf[p->pos + k] : -1;
}

static int is_newline(const struct parser *p)
{
    int c = at(p, 0);
    return c == '\n' || (c == '\r' && at(p, 1) == '\n');
}

static int is_ctrl(int c) { return (c >= 0 && c < 0x20 && c != '\t') || c == 0x7F; }

static int is_bare(int c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
           c == '-' || c == '_';
}

static int is_digit(int c) { return c >= '0' && c <= '9'; }

static void skip_ws(struct parser *p)
{
    while (p->pos < p->len && (p->buf[p->pos] == ' ' || p->buf[p->pos] == '\t'))
        p->pos++;
}

/* At '#': skips to (not past) the end of the line, rejecting control characters. */
static int skip_comment(struct parser *p)
{
    p->pos++;
    while (p->pos < p->len) {
        int c = (unsigned char)p->buf[p->pos];
        if (c == '\n' || (c == '\r' && at(p, 1) == '\n'))
            break;
        if (is_ctrl(c))
            return perr(p, p->pos, "control character U+%04X in comment (expected printable "
                        "text or tab)", (unsigned)c);
        p->pos++;
    }
    return FK_OK;
}

/* Skips blanks, newlines and comments (inside arrays). */
static int skip_ws_nl(struct parser *p)
{
    for (;;) {
        skip_ws(p);
        int c = at(p, 0);
        if (c == '#') {
            FK_TRY(skip_comment(p));
        } else if (c == '\n') {
            p->pos++;
        } else if (c == '\r') {
            if (at(p, 1) != '\n')
                return perr(p, p->pos, "bare carriage return (expected CRLF or LF)");
            p->pos += 2;
        } else {
            return FK_OK;
        }
    }
}

/* After a key/value pair or header: blanks, an optional comment, then newline or EOF. */
static int expect_eol(struct parser *p, const char *after)
{
    skip_ws(p);
    if (at(p, 0) == '#')
        FK_TRY(skip_comment(p));
    if (p->pos >= p->len)
        return FK_OK;
    if (is_newline(p)) {
        p->pos += p->buf[p->pos] == '\r' ? 2 : 1;
        return FK_OK;
    }
    char tmp[16];
    if (at(p, 0) == '\r')
        return perr(p, p->pos, "bare carriage return (expected CRLF or LF)");
    return perr(p, p->pos, "unexpected %s after %s (expected a newline or a comment)",
                describe(p, p->pos, tmp, sizeof tmp), after);
}

static int check_utf8(struct parser *p)
{
    const unsigned char *s = (const unsigned char *)p->buf;
    size_t n = p->len;
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t k;
        unsigned lo = 0x80, hi = 0xBF;
        if (c < 0x80) {
            i++;
            continue;
        } else if (c >= 0xC2 && c <= 0xDF) {
            k = 1;
        } else if (c >= 0xE0 && c <= 0xEF) {
            k = 2;
            if (c == 0xE0)
                lo = 0xA0;
            else if (c == 0xED)
                hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            k = 3;
            if (c == 0xF0)
                lo = 0x90;
            else if (c == 0xF4)
                hi = 0x8F;
        } else {
            return perr(p, i, "invalid UTF-8 byte 0x%02X (expected UTF-8 text)", c);
        }
        for (size_t j = 1; j <= k; j++) {
            unsigned d = i + j < n ? s[i + j] : 0;
            unsigned l = j == 1 ? lo : 0x80, h = j == 1 ? hi : 0xBF;
            if (d < l || d > h)
                return perr(p, i, "invalid UTF-8 sequence starting with byte 0x%02X "
                            "(expected UTF-8 text)", c);
        }
        i += k + 1;
    }
    return FK_OK;
}

static int put_utf8(struct sbuf *b, uint32_t cp)
{
    char u[4];
    size_t n;
    if (cp < 0x80) {
        u[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        u[0] = (char)(0xC0 | (cp >> 6));
        u[1] = (char)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        u[0] = (char)(0xE0 | (cp >> 12));
        u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[2] = (char)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        u[0] = (char)(0xF0 | (cp >> 18));
        u[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        u[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        u[3] = (char)(0x80 | (cp & 0x3F));
        n = 4;
    }
    return sb_put(b, u, n);
}

/* ------------------------------------------------------------------ */
/* strings                                                            */

/* At '\\' in a basic string: appends the escaped character. */
static int parse_escape(struct parser *p, struct sbuf *b)
{
    size_t start = p->pos;
    int e = at(p, 1);
    const char *simple = NULL;
    switch (e) {
    case 'b': simple = "\b"; break;
    case 't': simple = "\t"; break;
    case 'n': simple = "\n"; break;
    case 'f': simple = "\f"; break;
    case 'r': simple = "\r"; break;
    case '"': simple = "\""; break;
    case '\\': simple = "\\"; break;
    default: break;
    }
    if (simple) {
        p->pos += 2;
        return sb_putc(b, simple[0]);
    }
    if (e == 'u' || e == 'U') {
        int nd = e == 'u' ? 4 : 8;
        uint32_t cp = 0;
        for (int i = 0; i < nd; i++) {
            int c = at(p, 2 + (size_t)i);
            int d;
            if (c >= '0' && c <= '9')
                d = c - '0';
            else if (c >= 'a' && c <= 'f')
                d = c - 'a' + 10;
            else if (c >= 'A' && c <= 'F')
                d = c - 'A' + 10;
            else
                return perr(p, start, "invalid escape '\\%c' (expected %d hex digits)", e, nd);
            cp = cp * 16 + (uint32_t)d;
        }
        if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return perr(p, start, "escape '\\%c' names U+%" PRIX32 ", not a Unicode scalar "
                        "value (expected 0-D7FF or E000-10FFFF)", e, cp);
        p->pos += 2 + (size_t)nd;
        return put_utf8(b, cp);
    }
    char tmp[16];
    return perr(p, start, "invalid escape sequence: backslash followed by %s (expected \\b \\t "
                "\\n \\f \\r \\\" \\\\ \\uXXXX or \\UXXXXXXXX)",
                describe(p, start + 1, tmp, sizeof tmp));
}

/* At the opening quote(s). q is '"' (basic) or '\'' (literal); ml selects the triple form. */
static int parse_string(struct parser *p, int q, int ml, struct sbuf *b)
{
    size_t open = p->pos;
    const char *what = q == '"' ? (ml ? "multi-line basic string" : "basic string")
                                : (ml ? "multi-line literal string" : "literal string");
    p->pos += ml ? 3 : 1;
    if (ml && is_newline(p))
        p->pos += p->buf[p->pos] == '\r' ? 2 : 1;
    for (;;) {
        int c = at(p, 0);
        if (c < 0) {
            int line, col;
            linecol(p, open, &line, &col);
            return perr(p, p->pos, "unterminated %s opened at %d:%d (expected %s)", what, line,
                        col, q == '"' ? (ml ? "\"\"\"" : "\"") : (ml ? "'''" : "'"));
        }
        if (c == q) {
            if (!ml) {
                p->pos++;
                return FK_OK;
            }
            size_t run = 0;
            while (at(p, run) == q)
                run++;
            if (run < 3) {
                for (size_t i = 0; i < run; i++)
                    FK_TRY(sb_putc(b, (char)q));
                p->pos += run;
                continue;
            }
            if (run > 5)
                return perr(p, p->pos, "too many quotes closing the %s (expected at most 5)",
                            what);
            for (size_t i = 0; i < run - 3; i++)
                FK_TRY(sb_putc(b, (char)q));
            p->pos += run;
            return FK_OK;
        }
        if (c == '\\' && q == '"') {
            if (ml) { /* line-ending backslash: backslash, blanks, newline */
                size_t k = 1;
                while (at(p, k) == ' ' || at(p, k) == '\t')
                    k++;
                if (at(p, k) == '\n' || (at(p, k) == '\r' && at(p, k + 1) == '\n')) {
                    p->pos += k;
                    for (;;) {
                        int d = at(p, 0);
                        if (d == ' ' || d == '\t' || d == '\n')
                            p->pos++;
                        else if (d == '\r' && at(p, 1) == '\n')
                            p->pos += 2;
                        else
                            break;
                    }
                    continue;
                }
            }
            FK_TRY(parse_escape(p, b));
            continue;
        }
        if (c == '\n' || c == '\r') {
            if (!ml)
                return perr(p, p->pos, "newline in a %s (expected the closing quote; use "
                            "triple quotes for multi-line strings)", what);
            if (c == '\r' && at(p, 1) != '\n')
                return perr(p, p->pos, "bare carriage return in a %s (expected CRLF or LF)",
                            what);
            p->pos += c == '\r' ? 2 : 1;
            FK_TRY(sb_putc(b, '\n'));
            continue;
        }
        if (is_ctrl(c))
            return perr(p, p->pos, "control character U+%04X in a %s (expected it escaped%s)",
                        (unsigned)c, what, q == '"' ? "" : "; literal strings cannot escape");
        FK_TRY(sb_putc(b, (char)c));
        p->pos++;
    }
}

/* ------------------------------------------------------------------ */
/* keys                                                               */

static void key_clear(struct key *k)
{
    for (size_t i = 0; i < k->n; i++)
        free(k->parts[i].s);
    free(k->parts);
    k->parts = NULL;
    k->n = k->cap = 0;
}

/* Parses a (dotted) key at the read position into k (which must be empty). */
static int parse_key(struct parser *p, struct key *k)
{
    for (;;) {
        if (k->n == FK_TOML_MAX_DEPTH)
            return perr(p, p->pos, "key has more than %d dotted parts (expected fewer)",
                        FK_TOML_MAX_DEPTH);
        if (k->n == k->cap) {
            size_t cap = k->cap ? 2 * k->cap : 4;
            struct keypart *np = realloc(k->parts, cap * sizeof *np);
            if (!np)
                return oom();
            k->parts = np;
            k->cap = cap;
        }
        struct keypart *kp = &k->parts[k->n];
        memset(kp, 0, sizeof *kp);
        kp->off = p->pos;
        linecol(p, p->pos, &kp->line, &kp->col);
        struct sbuf b = {0};
        int c = at(p, 0);
        int rc = FK_OK;
        if (c == '"' || c == '\'') {
            rc = parse_string(p, c, 0, &b);
        } else {
            size_t s = p->pos;
            while (p->pos < p->len && is_bare((unsigned char)p->buf[p->pos]))
                p->pos++;
            if (p->pos == s) {
                char tmp[16];
                rc = perr(p, s, "unexpected %s (expected a key: letters, digits, '-', '_' or "
                          "a quoted string)", describe(p, s, tmp, sizeof tmp));
            } else {
                rc = sb_put(&b, p->buf + s, p->pos - s);
            }
        }
        kp->len = b.n;
        kp->end = p->pos;
        kp->s = sb_take(&b); /* frees nothing on error: the caller's key_clear does */
        k->n++;
        if (rc < 0)
            return rc;
        if (!kp->s)
            return oom();
        skip_ws(p);
        if (at(p, 0) != '.')
            return FK_OK;
        p->pos++;
        skip_ws(p);
    }
}

/* Quoted form of a key part for messages (truncated, control characters shown as '?'). */
static const char *key_show(const char *s, size_t n, char *tmp, size_t cap)
{
    size_t j = 0;
    for (size_t i = 0; i < n && j + 4 < cap; i++)
        tmp[j++] = (unsigned char)s[i] < 0x20 || s[i] == 0x7F ? '?' : s[i];
    if (j + 4 >= cap && n > 0) {
        tmp[j++] = '.';
        tmp[j++] = '.';
    }
    tmp[j] = '\0';
    return tmp;
}

/* The source text of parts 0..i of key k, as written ("a.\"b c\""), for messages. */
static const char *key_src(const struct parser *p, const struct key *k, size_t i, char *tmp,
                           size_t cap)
{
    size_t s = k->parts[0].off, e = k->parts[i].end;
    return key_show(p->buf + s, e - s, tmp, cap);
}

/* ------------------------------------------------------------------ */
/* scalars                                                            */

static int digits_n(const struct parser *p, size_t off, int n)
{
    for (int i = 0; i < n; i++) {
        size_t o = off + (size_t)i;
        if (o >= p->len || !is_digit((unsigned char)p->buf[o]))
            return 0;
    }
    return 1;
}

static int num_at(const struct parser *p, size_t off, int n)
{
    int v = 0;
    for (int i = 0; i < n; i++)
        v = v * 10 + (p->buf[off + (size_t)i] - '0');
    return v;
}

static int chr_at(const struct parser *p, size_t off)
{
    return off < p->len ? (unsigned char)p->buf[off] : -1;
}

/* Parses HH:MM:SS[.frac] at *off; returns nonzero on success and advances *off. */
static int parse_time_part(struct parser *p, size_t *off, int *rc)
{
    size_t o = *off;
    if (!digits_n(p, o, 2) || chr_at(p, o + 2) != ':' || !digits_n(p, o + 3, 2)) {
        *rc = perr(p, o, "malformed time (expected HH:MM:SS)");
        return 0;
    }
    if (chr_at(p, o + 5) != ':' || !digits_n(p, o + 6, 2)) {
        *rc = perr(p, o, "malformed time (expected HH:MM:SS; TOML 1.0 requires seconds)");
        return 0;
    }
    int hh = num_at(p, o, 2), mm = num_at(p, o + 3, 2), ss = num_at(p, o + 6, 2);
    if (hh > 23 || mm > 59 || ss > 60) {
        *rc = perr(p, o, "time %02d:%02d:%02d out of range (expected hour 0-23, minute 0-59, "
                   "second 0-60)", hh, mm, ss);
        return 0;
    }
    o += 8;
    if (chr_at(p, o) == '.') {
        size_t s = o + 1;
        while (is_digit(chr_at(p, s)))
            s++;
        if (s == o + 1) {
            *rc = perr(p, o, "fractional seconds without digits (expected digits after '.')");
            return 0;
        }
        o = s;
    }
    *off = o;
    return 1;
}

static int days_in_month(int y, int m)
{
    static const int d[12] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (m == 2 && ((y % 4 == 0 && y % 100 != 0) || y % 400 == 0))
        return 29;
    return d[m - 1];
}

/* At a date (YYYY-) or a time (HH:): builds one of the four date-time kinds. */
static int parse_datetime(struct parser *p, struct fk_toml_value **out)
{
    size_t s = p->pos, o = s;
    int rc = FK_OK;
    enum fk_toml_type t;
    if (digits_n(p, o, 2) && chr_at(p, o + 2) == ':') {
        if (!parse_time_part(p, &o, &rc))
            return rc;
        t = FK_TOML_TIME_LOCAL;
    } else {
        if (!digits_n(p, o, 4) || chr_at(p, o + 4) != '-' || !digits_n(p, o + 5, 2) ||
            chr_at(p, o + 7) != '-' || !digits_n(p, o + 8, 2))
            return perr(p, o, "malformed date (expected YYYY-MM-DD)");
        int y = num_at(p, o, 4), m = num_at(p, o + 5, 2), d = num_at(p, o + 8, 2);
        if (m < 1 || m > 12)
            return perr(p, o, "month %02d out of range (expected 01-12)", m);
        if (d < 1 || d > days_in_month(y, m))
            return perr(p, o, "day %02d out of range for %04d-%02d (expected 01-%02d)", d, y,
                        m, days_in_month(y, m));
        o += 10;
        t = FK_TOML_DATE_LOCAL;
        int sep = chr_at(p, o);
        int has_time = sep == 'T' || sep == 't' ||
                       (sep == ' ' && digits_n(p, o + 1, 2) && chr_at(p, o + 3) == ':');
        if (has_time) {
            o++;
            if (!parse_time_part(p, &o, &rc))
                return rc;
            t = FK_TOML_DATETIME_LOCAL;
            int z = chr_at(p, o);
            if (z == 'Z' || z == 'z') {
                o++;
                t = FK_TOML_DATETIME;
            } else if (z == '+' || z == '-') {
                if (!digits_n(p, o + 1, 2) || chr_at(p, o + 3) != ':' ||
                    !digits_n(p, o + 4, 2))
                    return perr(p, o, "malformed time offset (expected Z, +HH:MM or -HH:MM)");
                int oh = num_at(p, o + 1, 2), om = num_at(p, o + 4, 2);
                if (oh > 23 || om > 59)
                    return perr(p, o, "time offset out of range (expected hours 00-23, "
                                "minutes 00-59)");
                o += 6;
                t = FK_TOML_DATETIME;
            }
        }
    }
    struct fk_toml_value *v = node_new(p, t, s);
    if (!v)
        return oom();
    v->u.str.len = o - s;
    v->u.str.s = malloc(o - s + 1);
    if (!v->u.str.s) {
        node_free(v);
        return oom();
    }
    memcpy(v->u.str.s, p->buf + s, o - s);
    v->u.str.s[o - s] = '\0';
    p->pos = o;
    *out = v;
    return FK_OK;
}

/* Digits of base with single underscores between digits, starting at t[*i]. Returns the
 * count of digits (0 if none) or -1 if an underscore is misplaced. */
static int scan_digits(const char *t, size_t n, size_t *i, int base)
{
    int count = 0, prev_digit = 0;
    while (*i < n) {
        int c = (unsigned char)t[*i];
        int ok = base == 16 ? ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') ||
                               (c >= 'A' && c <= 'F'))
                            : (c >= '0' && c < '0' + base);
        if (ok) {
            count++;
            prev_digit = 1;
        } else if (c == '_') {
            if (!prev_digit || *i + 1 >= n)
                return -1;
            prev_digit = 0;
        } else {
            break;
        }
        (*i)++;
    }
    if (count && !prev_digit)
        return -1;
    return count;
}

static int parse_number(struct parser *p, struct fk_toml_value **out)
{
    size_t s = p->pos, e = s;
    while (e < p->len && (is_bare((unsigned char)p->buf[e]) || p->buf[e] == '.' ||
                          p->buf[e] == '+'))
        e++;
    const char *tok = p->buf + s;
    size_t n = e - s, i = 0;
    int neg = 0, is_float = 0;
    char show[48];
    snprintf(show, sizeof show, "%.*s%s", (int)(n < 40 ? n : 40), tok, n > 40 ? "..." : "");
    if (n > 0 && (tok[0] == '+' || tok[0] == '-')) {
        neg = tok[0] == '-';
        i = 1;
    }
    struct fk_toml_value *v = NULL;
    if (n - i == 3 && (memcmp(tok + i, "inf", 3) == 0 || memcmp(tok + i, "nan", 3) == 0)) {
        v = node_new(p, FK_TOML_FLOAT, s);
        if (!v)
            return oom();
        v->u.f = tok[i] == 'i' ? (neg ? -HUGE_VAL : HUGE_VAL) : (neg ? -NAN : NAN);
        p->pos = e;
        *out = v;
        return FK_OK;
    }
    if (n - i >= 2 && tok[i] == '0' && (tok[i + 1] == 'x' || tok[i + 1] == 'o' ||
                                        tok[i + 1] == 'b')) {
        int base = tok[i + 1] == 'x' ? 16 : tok[i + 1] == 'o' ? 8 : 2;
        if (i > 0)
            return perr(p, s, "sign on a %s integer '%s' (expected no sign)",
                        base == 16 ? "hexadecimal" : base == 8 ? "octal" : "binary", show);
        size_t j = 2;
        if (scan_digits(tok, n, &j, base) <= 0 || j != n)
            return perr(p, s, "malformed %s integer '%s' (expected 0%c followed by digits "
                        "with single underscores between them)",
                        base == 16 ? "hexadecimal" : base == 8 ? "octal" : "binary", show,
                        tok[1]);
        uint64_t acc = 0;
        for (j = 2; j < n; j++) {
            int c = (unsigned char)tok[j];
            if (c == '_')
                continue;
            int d = c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10;
            if (acc > ((uint64_t)INT64_MAX - (uint64_t)d) / (uint64_t)base)
                return perr(p, s, "integer '%s' does not fit in 64 bits (expected at most "
                            "%" PRId64 ")", show, INT64_MAX);
            acc = acc * (uint64_t)base + (uint64_t)d;
        }
        v = node_new(p, FK_TOML_INT, s);
        if (!v)
            return oom();
        v->u.i = (int64_t)acc;
        p->pos = e;
        *out = v;
        return FK_OK;
    }
    size_t int_start = i;
    int nd = scan_digits(tok, n, &i, 10);
    if (nd <= 0)
        goto bad;
    if (tok[int_start] == '0' && nd > 1)
        return perr(p, s, "leading zero in number '%s' (expected no leading zeros)", show);
    if (i < n && tok[i] == '.') {
        i++;
        if (i >= n || !is_digit((unsigned char)tok[i]) || scan_digits(tok, n, &i, 10) <= 0)
            goto bad;
        is_float = 1;
    }
    if (i < n && (tok[i] == 'e' || tok[i] == 'E')) {
        i++;
        if (i < n && (tok[i] == '+' || tok[i] == '-'))
            i++;
        if (i >= n || !is_digit((unsigned char)tok[i]) || scan_digits(tok, n, &i, 10) <= 0)
            goto bad;
        is_float = 1;
    }
    if (i != n)
        goto bad;
    if (is_float) {
        char buf[128];
        size_t k = 0;
        for (size_t j = 0; j < n; j++) {
            if (tok[j] == '_')
                continue;
            if (k + 1 >= sizeof buf)
                return perr(p, s, "float '%s' too long (expected at most %zu characters)",
                            show, sizeof buf - 2);
            buf[k++] = tok[j];
        }
        buf[k] = '\0';
        errno = 0;
        double d = strtod(buf, NULL);
        if (errno == ERANGE && isinf(d))
            return perr(p, s, "float '%s' out of range (expected a finite double)", show);
        v = node_new(p, FK_TOML_FLOAT, s);
        if (!v)
            return oom();
        v->u.f = d;
    } else {
        uint64_t acc = 0, lim = neg ? (uint64_t)INT64_MAX + 1u : (uint64_t)INT64_MAX;
        for (size_t j = int_start; j < n; j++) {
            if (tok[j] == '_')
                continue;
            uint64_t d = (uint64_t)(tok[j] - '0');
            if (acc > (lim - d) / 10)
                return perr(p, s, "integer '%s' does not fit in 64 bits (expected %" PRId64
                            " to %" PRId64 ")", show, INT64_MIN, INT64_MAX);
            acc = acc * 10 + d;
        }
        v = node_new(p, FK_TOML_INT, s);
        if (!v)
            return oom();
        v->u.i = neg ? (acc == (uint64_t)INT64_MAX + 1u ? INT64_MIN : -(int64_t)acc)
                     : (int64_t)acc;
    }
    p->pos = e;
    *out = v;
    return FK_OK;
bad:
    return perr(p, s, "invalid value '%s' (expected a number with single underscores between "
                "digits, e.g. 42, -1_000, 3.14, 1e-6, 0x1F, inf, nan)", show);
}

/* ------------------------------------------------------------------ */
/* values and tables                                                  */

static int parse_keyval(struct parser *p, struct fk_toml_value *tbl, int depth);

static int depth_error(struct parser *p, size_t off)
{
    return perr(p, off, "nesting deeper than %d levels (expected a flatter document)",
                FK_TOML_MAX_DEPTH);
}

/* Parses the value at the read position. parent_depth is the nesting of its container. */
static int parse_value(struct parser *p, int parent_depth, struct fk_toml_value **out)
{
    size_t s = p->pos;
    int c = at(p, 0);
    char tmp[16];
    *out = NULL;
    if (c == '"' || c == '\'') {
        int ml = at(p, 1) == c && at(p, 2) == c;
        struct fk_toml_value *v = node_new(p, FK_TOML_STRING, s);
        if (!v)
            return oom();
        struct sbuf b = {0};
        int rc = parse_string(p, c, ml, &b);
        v->u.str.len = b.n;
        v->u.str.s = sb_take(&b);
        if (rc < 0 || !v->u.str.s) {
            node_free(v);
            return rc < 0 ? rc : oom();
        }
        *out = v;
        return FK_OK;
    }
    if (c == 't' || c == 'f') {
        const char *w = c == 't' ? "true" : "false";
        size_t n = strlen(w);
        if (p->len - p->pos >= n && memcmp(p->buf + p->pos, w, n) == 0 &&
            !is_bare(at(p, n))) {
            struct fk_toml_value *v = node_new(p, FK_TOML_BOOL, s);
            if (!v)
                return oom();
            v->u.b = c == 't';
            p->pos += n;
            *out = v;
            return FK_OK;
        }
        return perr(p, s, "invalid value starting with '%c' (expected true, false, a "
                    "number, a string, a date-time, an array or an inline table)", c);
    }
    if (c == '[' || c == '{') {
        int depth = parent_depth + 1;
        if (depth > FK_TOML_MAX_DEPTH)
            return depth_error(p, s);
        struct fk_toml_value *v = node_new(p, c == '[' ? FK_TOML_ARRAY : FK_TOML_TABLE, s);
        if (!v)
            return oom();
        v->flags = TF_INLINE;
        p->pos++;
        int rc = FK_OK;
        if (c == '[') {
            for (;;) {
                if ((rc = skip_ws_nl(p)) < 0)
                    break;
                if (at(p, 0) == ']') {
                    p->pos++;
                    break;
                }
                if (p->pos >= p->len) {
                    rc = perr(p, p->pos, "unterminated array opened at %d:%d (expected ']')",
                              v->line, v->col);
                    break;
                }
                struct fk_toml_value *item;
                if ((rc = parse_value(p, depth, &item)) < 0)
                    break;
                if ((rc = arr_push(v, item)) < 0)
                    break;
                if ((rc = skip_ws_nl(p)) < 0)
                    break;
                if (at(p, 0) == ',') {
                    p->pos++;
                    continue;
                }
                if (at(p, 0) == ']') {
                    p->pos++;
                    break;
                }
                rc = perr(p, p->pos, "unexpected %s in array opened at %d:%d (expected ',' "
                          "or ']')", describe(p, p->pos, tmp, sizeof tmp), v->line, v->col);
                break;
            }
        } else {
            long saved = p->inline_id;
            v->owner = p->inline_id = ++p->next_inline;
            skip_ws(p);
            if (at(p, 0) == '}') {
                p->pos++;
            } else {
                for (;;) {
                    if ((rc = parse_keyval(p, v, depth)) < 0)
                        break;
                    skip_ws(p);
                    if (at(p, 0) == ',') {
                        p->pos++;
                        skip_ws(p);
                        if (at(p, 0) == '}') {
                            rc = perr(p, p->pos, "trailing comma in inline table (expected "
                                      "another key = value)");
                            break;
                        }
                        continue;
                    }
                    if (at(p, 0) == '}') {
                        p->pos++;
                        break;
                    }
                    rc = perr(p, p->pos, "unexpected %s in inline table opened at %d:%d "
                              "(expected ',' or '}' on the same line)",
                              describe(p, p->pos, tmp, sizeof tmp), v->line, v->col);
                    break;
                }
            }
            p->inline_id = saved;
        }
        if (rc < 0) {
            node_free(v);
            return rc;
        }
        *out = v;
        return FK_OK;
    }
    if ((digits_n(p, s, 4) && chr_at(p, s + 4) == '-') ||
        (digits_n(p, s, 2) && chr_at(p, s + 2) == ':'))
        return parse_datetime(p, out);
    if (c == '+' || c == '-' || is_digit(c) || c == 'i' || c == 'n')
        return parse_number(p, out);
    return perr(p, s, "unexpected %s (expected a value: string, number, boolean, date-time, "
                "array or inline table)", describe(p, s, tmp, sizeof tmp));
}

/* Descends from table t into dotted-key part kp (creating it), for key/value pairs. */
static int dotted_step(struct parser *p, struct fk_toml_value **t, struct key *k, size_t ki)
{
    struct keypart *kp = &k->parts[ki];
    char tmp[64];
    size_t i = tab_find(*t, kp->s, kp->len);
    if (i == SIZE_MAX) {
        struct fk_toml_value *nt = node_alloc(FK_TOML_TABLE, p->origin, kp->line, kp->col);
        if (!nt)
            return oom();
        nt->flags = TF_DOTTED | (p->inline_id ? TF_INLINE : 0);
        nt->owner = p->inline_id;
        int rc = tab_append(*t, kp->s, kp->len, p->origin, kp->line, kp->col, nt);
        kp->s = NULL; /* owned by the table now (or freed by tab_append) */
        *t = nt;
        return rc;
    }
    struct fk_toml_value *e = (*t)->u.tab.e[i].val;
    const char *name = key_src(p, k, ki, tmp, sizeof tmp);
    if (e->type != FK_TOML_TABLE)
        return perr(p, kp->off, "key '%s' is already %s %s defined at %d:%d (expected "
                    "a table to add dotted keys to)", name, art(type_label(e)), type_label(e),
                    e->line, e->col);
    if (p->inline_id ? e->owner != p->inline_id : (e->flags & TF_INLINE) != 0)
        return perr(p, kp->off, "cannot add keys to inline table '%s' defined at %d:%d "
                    "(inline tables are complete once closed)", name, e->line, e->col);
    if (e->flags & TF_HEADER)
        return perr(p, kp->off, "cannot extend table [%s] defined at %d:%d with dotted keys "
                    "(expected its keys under its own header)", name, e->line, e->col);
    e->flags |= TF_DOTTED;
    *t = e;
    return FK_OK;
}

static int parse_keyval(struct parser *p, struct fk_toml_value *tbl, int depth)
{
    struct key k = {0};
    struct fk_toml_value *t = tbl, *v = NULL;
    char tmp[16], kbuf[64];
    int rc = parse_key(p, &k);
    if (rc < 0)
        goto done;
    skip_ws(p);
    if (at(p, 0) != '=') {
        rc = perr(p, p->pos, "unexpected %s after key '%s' (expected '=')",
                  describe(p, p->pos, tmp, sizeof tmp), key_src(p, &k, k.n - 1, kbuf,
                  sizeof kbuf));
        goto done;
    }
    p->pos++;
    skip_ws(p);
    for (size_t i = 0; i + 1 < k.n; i++) {
        if (++depth > FK_TOML_MAX_DEPTH) {
            rc = depth_error(p, k.parts[i].off);
            goto done;
        }
        if ((rc = dotted_step(p, &t, &k, i)) < 0)
            goto done;
    }
    struct keypart *last = &k.parts[k.n - 1];
    size_t found = tab_find(t, last->s, last->len);
    if (found != SIZE_MAX) {
        const struct tent *e = &t->u.tab.e[found];
        rc = perr(p, last->off, "duplicate key '%s' (first defined at %d:%d as %s %s)",
                  key_src(p, &k, k.n - 1, kbuf, sizeof kbuf), e->pub.line, e->pub.col,
                  art(type_label(e->val)), type_label(e->val));
        goto done;
    }
    if (p->pos >= p->len || is_newline(p) || at(p, 0) == '#') {
        rc = perr(p, p->pos, "missing value after '=' (expected a value on the same line)");
        goto done;
    }
    if ((rc = parse_value(p, depth, &v)) < 0)
        goto done;
    rc = tab_append(t, last->s, last->len, p->origin, last->line, last->col, v);
    last->s = NULL;
done:
    key_clear(&k);
    return rc;
}

/* At '[': a [table] or [[array of tables]] header; sets *cur to the section's table. */
static int parse_header(struct parser *p, struct fk_toml_value *root,
                        struct fk_toml_value **cur, int *cur_depth)
{
    int aot = at(p, 1) == '[';
    char kbuf[64], tmp[16];
    p->pos += aot ? 2 : 1;
    skip_ws(p);
    struct key k = {0};
    int rc = parse_key(p, &k);
    if (rc < 0)
        goto done;
    skip_ws(p);
    if (at(p, 0) != ']' || (aot && at(p, 1) != ']')) {
        rc = perr(p, p->pos, "unexpected %s in %s header (expected '%s')",
                  describe(p, p->pos, tmp, sizeof tmp), aot ? "array-of-tables" : "table",
                  aot ? "]]" : "]");
        goto done;
    }
    p->pos += aot ? 2 : 1;
    struct fk_toml_value *t = root;
    int depth = 0;
    for (size_t i = 0; i < k.n; i++) {
        struct keypart *kp = &k.parts[i];
        const char *name = key_src(p, &k, i, kbuf, sizeof kbuf);
        int last = i + 1 == k.n;
        size_t f = tab_find(t, kp->s, kp->len);
        if (++depth > FK_TOML_MAX_DEPTH - (aot && last)) {
            rc = depth_error(p, kp->off);
            goto done;
        }
        if (f == SIZE_MAX) {
            struct fk_toml_value *nt = node_alloc(FK_TOML_TABLE, p->origin, kp->line, kp->col);
            if (!nt) {
                rc = oom();
                goto done;
            }
            if (last && aot) {
                struct fk_toml_value *arr =
                    node_alloc(FK_TOML_ARRAY, p->origin, kp->line, kp->col);
                if (!arr || (rc = arr_push(arr, nt)) < 0) {
                    node_free(arr);
                    rc = rc < 0 ? rc : (node_free(nt), oom());
                    goto done;
                }
                arr->flags = TF_AOT;
                nt->flags = TF_HEADER;
                rc = tab_append(t, kp->s, kp->len, p->origin, kp->line, kp->col, arr);
                depth++;
            } else {
                nt->flags = last ? TF_HEADER : 0;
                rc = tab_append(t, kp->s, kp->len, p->origin, kp->line, kp->col, nt);
            }
            kp->s = NULL;
            if (rc < 0)
                goto done;
            t = nt;
            continue;
        }
        struct fk_toml_value *e = t->u.tab.e[f].val;
        if (e->type == FK_TOML_ARRAY && (e->flags & TF_AOT)) {
            depth++;
            if (last && !aot) {
                rc = perr(p, kp->off, "table [%s] conflicts with the array of tables [[%s]] "
                          "defined at %d:%d (expected [[%s]])", name, name, e->line, e->col,
                          name);
                goto done;
            }
            if (last) {
                struct fk_toml_value *nt =
                    node_alloc(FK_TOML_TABLE, p->origin, kp->line, kp->col);
                if (!nt) {
                    rc = oom();
                    goto done;
                }
                nt->flags = TF_HEADER;
                if ((rc = arr_push(e, nt)) < 0)
                    goto done;
                t = nt;
            } else {
                t = e->u.arr.v[e->u.arr.n - 1];
            }
            continue;
        }
        if (e->type == FK_TOML_ARRAY) {
            rc = perr(p, kp->off, "key '%s' is a static array defined at %d:%d (expected %s)",
                      name, e->line, e->col, last && aot ? "an array created by [[...]] "
                      "headers to append to" : "a table");
            goto done;
        }
        if (e->type != FK_TOML_TABLE) {
            rc = perr(p, kp->off, "key '%s' is already %s %s defined at %d:%d (expected "
                      "a table)", name, art(type_label(e)), type_label(e), e->line, e->col);
            goto done;
        }
        if (e->flags & TF_INLINE) {
            rc = perr(p, kp->off, "cannot extend inline table '%s' defined at %d:%d (inline "
                      "tables are complete once closed)", name, e->line, e->col);
            goto done;
        }
        if (last && aot) {
            rc = perr(p, kp->off, "[[%s]] conflicts with table '%s' defined at %d:%d "
                      "(expected a new key or an array of tables)", name, name, e->line,
                      e->col);
            goto done;
        }
        if (last && (e->flags & (TF_HEADER | TF_DOTTED))) {
            rc = perr(p, kp->off, "table [%s] is already defined at %d:%d%s (expected each "
                      "table defined once)", name, e->line, e->col,
                      (e->flags & TF_HEADER) ? "" : " by dotted keys");
            goto done;
        }
        if (last) {
            e->flags |= TF_HEADER;
            e->line = kp->line;
            e->col = kp->col;
        }
        t = e;
    }
    *cur = t;
    *cur_depth = depth;
done:
    key_clear(&k);
    return rc;
}

static void parser_init(struct parser *p, const char *buf, size_t len,
                        struct fk_toml_origin *o)
{
    memset(p, 0, sizeof *p);
    p->buf = buf;
    p->len = len;
    p->origin = o;
    if (len >= 3 && memcmp(buf, "\xEF\xBB\xBF", 3) == 0)
        p->start = p->pos = 3;
    p->cur_off = p->start;
    p->cur_line = p->cur_col = 1;
}

static int parse_document(struct parser *p, struct fk_toml_value *root)
{
    struct fk_toml_value *cur = root;
    int cur_depth = 0;
    FK_TRY(check_utf8(p));
    for (;;) {
        skip_ws(p);
        int c = at(p, 0);
        if (c < 0)
            return FK_OK;
        if (c == '#') {
            FK_TRY(skip_comment(p));
        } else if (c == '\n') {
            p->pos++;
        } else if (c == '\r') {
            if (at(p, 1) != '\n')
                return perr(p, p->pos, "bare carriage return (expected CRLF or LF)");
            p->pos += 2;
        } else if (c == '[') {
            FK_TRY(parse_header(p, root, &cur, &cur_depth));
            FK_TRY(expect_eol(p, "table header"));
        } else {
            FK_TRY(parse_keyval(p, cur, cur_depth));
            FK_TRY(expect_eol(p, "value"));
        }
    }
}

int fk_toml_parse(const char *buf, size_t len, const char *origin, struct fk_toml_value **out)
{
    if (!out)
        return fk_err(FK_EINVAL, "fk_toml_parse: out is NULL");
    *out = NULL;
    if (!buf && len)
        return fk_err(FK_EINVAL, "fk_toml_parse: buf is NULL");
    struct fk_toml_origin *o = origin_new(origin ? origin : "<toml>");
    if (!o)
        return oom();
    struct parser p;
    parser_init(&p, buf ? buf : "", len, o);
    struct fk_toml_value *root = node_alloc(FK_TOML_TABLE, o, 1, 1);
    int rc = root ? parse_document(&p, root) : oom();
    origin_unref(o);
    if (rc < 0) {
        node_free(root);
        return rc;
    }
    *out = root;
    return FK_OK;
}

int fk_toml_parse_file(const char *path, struct fk_toml_value **out)
{
    if (!out || !path)
        return fk_err(FK_EINVAL, "fk_toml_parse_file: NULL argument");
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return fk_err(FK_EIO, "%s: cannot open: %s", path, strerror(errno));
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n == cap) {
            cap = cap ? 2 * cap : 65536;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                fclose(f);
                return oom();
            }
            buf = nb;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0)
            break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return fk_err(FK_EIO, "%s: read error", path);
    }
    int rc = fk_toml_parse(buf, n, path, out);
    free(buf);
    return rc;
}

int fk_toml_parse_value(const char *text, const char *origin, struct fk_toml_value **out)
{
    if (!out || !text)
        return fk_err(FK_EINVAL, "fk_toml_parse_value: NULL argument");
    *out = NULL;
    struct fk_toml_origin *o = origin_new(origin ? origin : "<value>");
    if (!o)
        return oom();
    struct parser p;
    parser_init(&p, text, strlen(text), o);
    struct fk_toml_value *v = NULL;
    int rc = check_utf8(&p);
    if (rc == FK_OK) {
        skip_ws(&p);
        if (p.pos >= p.len)
            rc = perr(&p, p.pos, "empty value (expected a TOML value)");
        else
            rc = parse_value(&p, -1, &v);
    }
    if (rc == FK_OK) {
        skip_ws(&p);
        if (p.pos < p.len) {
            char tmp[16];
            rc = perr(&p, p.pos, "unexpected %s after the value (expected the end)",
                      describe(&p, p.pos, tmp, sizeof tmp));
        }
    }
    origin_unref(o);
    if (rc < 0) {
        node_free(v);
        return rc;
    }
    *out = v;
    return FK_OK;
}

/* ------------------------------------------------------------------ */
/* clone and edit                                                     */

static int clone_rec(const struct fk_toml_value *v, struct fk_toml_value **out)
{
    *out = NULL;
    struct fk_toml_value *c = node_alloc(v->type, v->origin, v->line, v->col);
    if (!c)
        return oom();
    c->flags = v->flags;
    c->owner = v->owner;
    int rc = FK_OK;
    switch (v->type) {
    case FK_TOML_TABLE:
        for (size_t i = 0; i < v->u.tab.n && rc == FK_OK; i++) {
            const struct tent *e = &v->u.tab.e[i];
            struct fk_toml_value *cv;
            char *k = malloc(e->pub.key_len + 1);
            if (!k) {
                rc = oom();
                break;
            }
            memcpy(k, e->key, e->pub.key_len + 1);
            if ((rc = clone_rec(e->val, &cv)) < 0) {
                free(k);
                break;
            }
            rc = tab_append(c, k, e->pub.key_len, e->origin, e->pub.line, e->pub.col, cv);
        }
        break;
    case FK_TOML_ARRAY:
        for (size_t i = 0; i < v->u.arr.n && rc == FK_OK; i++) {
            struct fk_toml_value *cv;
            if ((rc = clone_rec(v->u.arr.v[i], &cv)) == FK_OK)
                rc = arr_push(c, cv);
        }
        break;
    case FK_TOML_STRING:
    case FK_TOML_DATETIME:
    case FK_TOML_DATETIME_LOCAL:
    case FK_TOML_DATE_LOCAL:
    case FK_TOML_TIME_LOCAL:
        c->u.str.len = v->u.str.len;
        c->u.str.s = malloc(v->u.str.len + 1);
        if (!c->u.str.s)
            rc = oom();
        else
            memcpy(c->u.str.s, v->u.str.s, v->u.str.len + 1);
        break;
    default:
        c->u = v->u;
        break;
    }
    if (rc < 0) {
        node_free(c);
        return rc;
    }
    *out = c;
    return FK_OK;
}

int fk_toml_clone(const struct fk_toml_value *v, struct fk_toml_value **out)
{
    if (!out || !v)
        return fk_err(FK_EINVAL, "fk_toml_clone: NULL argument");
    return clone_rec(v, out);
}

int fk_toml_set_path(struct fk_toml_value *root, const char *path, const char *origin,
                     struct fk_toml_value **val)
{
    if (!val || !*val || !root || !path) {
        if (val)
            fk_toml_free(val);
        return fk_err(FK_EINVAL, "fk_toml_set_path: NULL argument");
    }
    struct fk_toml_value *v = *val;
    *val = NULL;
    if (root->type != FK_TOML_TABLE) {
        node_free(v);
        return fk_err(FK_EINVAL, "fk_toml_set_path: root is %s %s, not a table",
                      art(type_label(root)), type_label(root));
    }
    struct fk_toml_origin *o = origin_new(origin ? origin : "<set>");
    if (!o) {
        node_free(v);
        return oom();
    }
    struct parser p;
    parser_init(&p, path, strlen(path), o);
    struct key k = {0};
    char kbuf[64], tmp[16];
    int rc = check_utf8(&p);
    if (rc == FK_OK) {
        skip_ws(&p);
        rc = parse_key(&p, &k);
    }
    if (rc == FK_OK && p.pos < p.len)
        rc = perr(&p, p.pos, "unexpected %s in key path '%s' (expected a dotted key such as "
                  "a.b.c)", describe(&p, p.pos, tmp, sizeof tmp), path);
    struct fk_toml_value *t = root;
    for (size_t i = 0; rc == FK_OK && i + 1 < k.n; i++) {
        struct keypart *kp = &k.parts[i];
        size_t f = tab_find(t, kp->s, kp->len);
        if (f == SIZE_MAX) {
            struct fk_toml_value *nt = node_alloc(FK_TOML_TABLE, o, kp->line, kp->col);
            if (!nt) {
                rc = oom();
                break;
            }
            rc = tab_append(t, kp->s, kp->len, o, kp->line, kp->col, nt);
            kp->s = NULL;
            t = nt;
            continue;
        }
        struct fk_toml_value *e = t->u.tab.e[f].val;
        if (e->type != FK_TOML_TABLE) {
            rc = perr(&p, kp->off, "key '%s' in '%s' is %s %s at %s:%d:%d (expected a "
                      "table)", key_show(kp->s, kp->len, kbuf, sizeof kbuf), path,
                      art(type_label(e)), type_label(e),
                      e->origin->name, e->line, e->col);
            break;
        }
        t = e;
    }
    if (rc == FK_OK) {
        struct keypart *last = &k.parts[k.n - 1];
        size_t f = tab_find(t, last->s, last->len);
        if (f == SIZE_MAX) {
            rc = tab_append(t, last->s, last->len, o, last->line, last->col, v);
            last->s = NULL;
        } else {
            struct tent *e = &t->u.tab.e[f];
            node_free(e->val);
            e->val = v;
            e->pub.value = v;
        }
        v = NULL;
    }
    node_free(v);
    key_clear(&k);
    origin_unref(o);
    return rc;
}

/* ------------------------------------------------------------------ */
/* accessors                                                          */

enum fk_toml_type fk_toml_type(const struct fk_toml_value *v) { return v ? v->type : 0; }

const char *fk_toml_type_name(enum fk_toml_type t)
{
    switch (t) {
    case FK_TOML_TABLE: return "table";
    case FK_TOML_ARRAY: return "array";
    case FK_TOML_STRING: return "string";
    case FK_TOML_INT: return "integer";
    case FK_TOML_FLOAT: return "float";
    case FK_TOML_BOOL: return "boolean";
    case FK_TOML_DATETIME: return "offset date-time";
    case FK_TOML_DATETIME_LOCAL: return "local date-time";
    case FK_TOML_DATE_LOCAL: return "local date";
    case FK_TOML_TIME_LOCAL: return "local time";
    }
    return "invalid";
}

int fk_toml_line(const struct fk_toml_value *v) { return v ? v->line : 0; }
int fk_toml_col(const struct fk_toml_value *v) { return v ? v->col : 0; }
const char *fk_toml_origin(const struct fk_toml_value *v)
{
    return v && v->origin ? v->origin->name : "";
}

size_t fk_toml_table_len(const struct fk_toml_value *v)
{
    return v && v->type == FK_TOML_TABLE ? v->u.tab.n : 0;
}

const struct fk_toml_entry *fk_toml_table_at(const struct fk_toml_value *v, size_t i)
{
    if (!v || v->type != FK_TOML_TABLE || i >= v->u.tab.n)
        return NULL;
    return &v->u.tab.e[i].pub;
}

const struct fk_toml_value *fk_toml_table_getn(const struct fk_toml_value *v, const char *key,
                                               size_t key_len)
{
    if (!v || !key || v->type != FK_TOML_TABLE)
        return NULL;
    size_t i = tab_find(v, key, key_len);
    return i == SIZE_MAX ? NULL : v->u.tab.e[i].val;
}

const struct fk_toml_value *fk_toml_table_get(const struct fk_toml_value *v, const char *key)
{
    return key ? fk_toml_table_getn(v, key, strlen(key)) : NULL;
}

const struct fk_toml_value *fk_toml_table_find(const struct fk_toml_value *v,
                                               const char *dotted)
{
    if (!v || !dotted)
        return NULL;
    struct fk_toml_origin o = {1}; /* on the stack: never unref'd to zero here */
    struct parser p;
    parser_init(&p, dotted, strlen(dotted), &o);
    p.quiet = 1;
    struct key k = {0};
    const struct fk_toml_value *r = NULL;
    skip_ws(&p);
    if (check_utf8(&p) == FK_OK && parse_key(&p, &k) == FK_OK && p.pos == p.len) {
        r = v;
        for (size_t i = 0; i < k.n && r; i++)
            r = fk_toml_table_getn(r, k.parts[i].s, k.parts[i].len);
    }
    key_clear(&k);
    return r;
}

size_t fk_toml_array_len(const struct fk_toml_value *v)
{
    return v && v->type == FK_TOML_ARRAY ? v->u.arr.n : 0;
}

const struct fk_toml_value *fk_toml_array_at(const struct fk_toml_value *v, size_t i)
{
    if (!v || v->type != FK_TOML_ARRAY || i >= v->u.arr.n)
        return NULL;
    return v->u.arr.v[i];
}

static int type_err(const struct fk_toml_value *v, const char *want)
{
    if (!v)
        return fk_err(FK_EINVAL, "toml: NULL value (expected %s)", want);
    return fk_err(FK_ECONFIG, "%s:%d:%d: expected %s, got %s %s", fk_toml_origin(v), v->line,
                  v->col, want, art(type_label(v)), type_label(v));
}

int fk_toml_get_int(const struct fk_toml_value *v, int64_t *out)
{
    if (!v || v->type != FK_TOML_INT)
        return type_err(v, "an integer");
    *out = v->u.i;
    return FK_OK;
}

int fk_toml_get_float(const struct fk_toml_value *v, double *out)
{
    if (v && v->type == FK_TOML_FLOAT) {
        *out = v->u.f;
        return FK_OK;
    }
    if (v && v->type == FK_TOML_INT) {
        const int64_t lim = (int64_t)1 << 53;
        if (v->u.i > lim || v->u.i < -lim)
            return fk_err(FK_ECONFIG, "%s:%d:%d: integer %" PRId64 " is not exactly "
                          "representable as a float (expected magnitude <= 2^53)",
                          fk_toml_origin(v), v->line, v->col, v->u.i);
        *out = (double)v->u.i;
        return FK_OK;
    }
    return type_err(v, "a float");
}

int fk_toml_get_bool(const struct fk_toml_value *v, int *out)
{
    if (!v || v->type != FK_TOML_BOOL)
        return type_err(v, "a boolean");
    *out = v->u.b;
    return FK_OK;
}

int fk_toml_get_string(const struct fk_toml_value *v, const char **out, size_t *len)
{
    if (!v || v->type != FK_TOML_STRING)
        return type_err(v, "a string");
    *out = v->u.str.s;
    if (len)
        *len = v->u.str.len;
    return FK_OK;
}

int fk_toml_get_datetime(const struct fk_toml_value *v, const char **out)
{
    if (!v || v->type < FK_TOML_DATETIME || v->type > FK_TOML_TIME_LOCAL)
        return type_err(v, "a date-time");
    *out = v->u.str.s;
    return FK_OK;
}

/* ------------------------------------------------------------------ */
/* canonical text                                                     */

static int put_quoted(struct sbuf *b, const char *s, size_t n)
{
    FK_TRY(sb_putc(b, '"'));
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[8];
        const char *r = NULL;
        switch (c) {
        case '"': r = "\\\""; break;
        case '\\': r = "\\\\"; break;
        case '\b': r = "\\b"; break;
        case '\t': r = "\\t"; break;
        case '\n': r = "\\n"; break;
        case '\f': r = "\\f"; break;
        case '\r': r = "\\r"; break;
        default:
            if (c < 0x20 || c == 0x7F) {
                snprintf(esc, sizeof esc, "\\u%04X", c);
                r = esc;
            }
            break;
        }
        if (r)
            FK_TRY(sb_put(b, r, strlen(r)));
        else
            FK_TRY(sb_putc(b, (char)c));
    }
    return sb_putc(b, '"');
}

static int emit(struct sbuf *b, const struct fk_toml_value *v)
{
    char num[64];
    switch (v->type) {
    case FK_TOML_TABLE:
        FK_TRY(sb_putc(b, '{'));
        for (size_t i = 0; i < v->u.tab.n; i++) {
            const struct tent *e = &v->u.tab.e[i];
            int bare = e->pub.key_len > 0;
            for (size_t j = 0; j < e->pub.key_len && bare; j++)
                bare = is_bare((unsigned char)e->key[j]);
            if (i)
                FK_TRY(sb_put(b, ", ", 2));
            if (bare)
                FK_TRY(sb_put(b, e->key, e->pub.key_len));
            else
                FK_TRY(put_quoted(b, e->key, e->pub.key_len));
            FK_TRY(sb_put(b, " = ", 3));
            FK_TRY(emit(b, e->val));
        }
        return sb_putc(b, '}');
    case FK_TOML_ARRAY:
        FK_TRY(sb_putc(b, '['));
        for (size_t i = 0; i < v->u.arr.n; i++) {
            if (i)
                FK_TRY(sb_put(b, ", ", 2));
            FK_TRY(emit(b, v->u.arr.v[i]));
        }
        return sb_putc(b, ']');
    case FK_TOML_STRING:
        return put_quoted(b, v->u.str.s, v->u.str.len);
    case FK_TOML_INT:
        snprintf(num, sizeof num, "%" PRId64, v->u.i);
        return sb_put(b, num, strlen(num));
    case FK_TOML_FLOAT:
        if (isnan(v->u.f)) {
            snprintf(num, sizeof num, "nan");
        } else if (isinf(v->u.f)) {
            snprintf(num, sizeof num, "%s", v->u.f < 0 ? "-inf" : "inf");
        } else {
            snprintf(num, sizeof num, "%.17g", v->u.f);
            if (!strpbrk(num, ".eE"))
                strcat(num, ".0");
        }
        return sb_put(b, num, strlen(num));
    case FK_TOML_BOOL:
        return v->u.b ? sb_put(b, "true", 4) : sb_put(b, "false", 5);
    case FK_TOML_DATETIME:
    case FK_TOML_DATETIME_LOCAL:
    case FK_TOML_DATE_LOCAL:
    case FK_TOML_TIME_LOCAL:
        return sb_put(b, v->u.str.s, v->u.str.len);
    }
    return fk_err(FK_EINVAL, "fk_toml_to_string: corrupt value");
}

int fk_toml_to_string(const struct fk_toml_value *v, char **out, size_t *len)
{
    if (!v || !out)
        return fk_err(FK_EINVAL, "fk_toml_to_string: NULL argument");
    *out = NULL;
    struct sbuf b = {0};
    int rc = emit(&b, v);
    if (rc < 0) {
        free(b.s);
        return rc;
    }
    size_t n = b.n;
    char *s = sb_take(&b);
    if (!s)
        return oom();
    *out = s;
    if (len)
        *len = n;
    return FK_OK;
}
