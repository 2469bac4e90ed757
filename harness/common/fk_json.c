/* SPDX-License-Identifier: MIT
 * JSON writer and reader (see fk_json.h).
 */
#include "common/fk_json.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fk_err.h"

/* ---- writer ---------------------------------------------------------------------------- */

/* Separator and indentation before a value (or a key) at the current level. */
static void w_sep(struct fk_json_w *w)
{
    if (w->after_key) {
        w->after_key = 0;
        return;
    }
    if (w->depth == 0) {
        if (w->sb.n)
            w->bad = 1;    /* a second top-level value */
        return;
    }
    int d = w->depth - 1;
    if (w->kind[d] == '{') {
        w->bad = 1;        /* a value in an object needs a key */
        return;
    }
    if (w->n[d]++)
        fk_sb_printf(&w->sb, ", ");
}

static void w_open(struct fk_json_w *w, char kind)
{
    w_sep(w);
    if (w->depth == FK_JSON_MAX_DEPTH) {
        w->bad = 1;
        return;
    }
    fk_sb_printf(&w->sb, "%c", kind);
    w->kind[w->depth] = kind;
    w->n[w->depth] = 0;
    w->depth++;
}

static void w_close(struct fk_json_w *w, char kind)
{
    if (w->depth == 0 || w->kind[w->depth - 1] != kind || w->after_key) {
        w->bad = 1;
        return;
    }
    w->depth--;
    if (kind == '{') {
        if (w->n[w->depth])
            fk_sb_printf(&w->sb, "\n%*s}", 2 * w->depth, "");
        else
            fk_sb_printf(&w->sb, "}");
    } else {
        fk_sb_printf(&w->sb, "]");
    }
}

void fk_json_begin_object(struct fk_json_w *w) { w_open(w, '{'); }
void fk_json_end_object(struct fk_json_w *w) { w_close(w, '{'); }
void fk_json_begin_array(struct fk_json_w *w) { w_open(w, '['); }
void fk_json_end_array(struct fk_json_w *w) { w_close(w, '['); }

static void w_string(struct fk_sb *b, const char *s)
{
    fk_sb_printf(b, "\"");
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"': fk_sb_printf(b, "\\\""); break;
        case '\\': fk_sb_printf(b, "\\\\"); break;
        case '\b': fk_sb_printf(b, "\\b"); break;
        case '\f': fk_sb_printf(b, "\\f"); break;
        case '\n': fk_sb_printf(b, "\\n"); break;
        case '\r': fk_sb_printf(b, "\\r"); break;
        case '\t': fk_sb_printf(b, "\\t"); break;
        default:
            if (*p < 0x20 || *p == 0x7f)
                fk_sb_printf(b, "\\u%04x", *p);
            else
                fk_sb_printf(b, "%c", *p);
        }
    }
    fk_sb_printf(b, "\"");
}

void fk_json_key(struct fk_json_w *w, const char *key)
{
    if (w->depth == 0 || w->kind[w->depth - 1] != '{' || w->after_key) {
        w->bad = 1;
        return;
    }
    int d = w->depth - 1;
    fk_sb_printf(&w->sb, "%s\n%*s", w->n[d]++ ? "," : "", 2 * w->depth, "");
    w_string(&w->sb, key);
    fk_sb_printf(&w->sb, ": ");
    w->after_key = 1;
}

void fk_json_str(struct fk_json_w *w, const char *s)
{
    w_sep(w);
    w_string(&w->sb, s ? s : "");
}

void fk_json_int(struct fk_json_w *w, long long v)
{
    w_sep(w);
    fk_sb_printf(&w->sb, "%lld", v);
}

void fk_json_num(struct fk_json_w *w, double v)
{
    w_sep(w);
    if (!isfinite(v)) {
        w->bad = 1;
        return;
    }
    fk_sb_printf(&w->sb, "%.17g", v);
}

void fk_json_bool(struct fk_json_w *w, int v)
{
    w_sep(w);
    fk_sb_printf(&w->sb, "%s", v ? "true" : "false");
}

int fk_json_finish(struct fk_json_w *w, char **text, size_t *len)
{
    *text = NULL;
    if (w->bad || w->depth || w->after_key || !w->sb.n) {
        fk_sb_free(&w->sb);
        return fk_err(FK_EINVAL, "JSON writer misused (unbalanced, a value without a key, "
                      "or a number that is not finite)");
    }
    fk_sb_printf(&w->sb, "\n");
    if (w->sb.oom) {
        fk_sb_free(&w->sb);
        return fk_err(FK_ENOMEM, "out of memory");
    }
    *text = w->sb.s;
    if (len)
        *len = w->sb.n;
    memset(&w->sb, 0, sizeof w->sb);
    return FK_OK;
}

/* ---- reader ---------------------------------------------------------------------------- */

struct rd {
    const char *s;               /* the text */
    const char *p;               /* current position */
    const char *name;            /* for messages */
    int line;                    /* current line (1-based) */
    const char *line_start;      /* first byte of the current line */
    int depth;                   /* nesting */
};

static int rd_col(const struct rd *r) { return (int)(r->p - r->line_start) + 1; }

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static int rd_fail(const struct rd *r, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return fk_err(FK_ECORRUPT, "%s:%d:%d: %s", r->name, r->line, rd_col(r), msg);
}

static void rd_ws(struct rd *r)
{
    for (;;) {
        char c = *r->p;
        if (c == '\n') {
            r->p++;
            r->line++;
            r->line_start = r->p;
        } else if (c == ' ' || c == '\t' || c == '\r') {
            r->p++;
        } else {
            return;
        }
    }
}

static void value_free(struct fk_json *v)
{
    free(v->str);
    for (int i = 0; i < v->n; i++) {
        value_free(&v->items[i]);
        if (v->keys)
            free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    memset(v, 0, sizeof *v);
}

static int hex4(struct rd *r, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = r->p[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0)
            return rd_fail(r, "\\u needs four hex digits");
        v = v * 16 + (unsigned)d;
    }
    r->p += 4;
    *out = v;
    return FK_OK;
}

static void put_utf8(struct fk_sb *b, unsigned cp)
{
    if (cp < 0x80) {
        fk_sb_printf(b, "%c", (char)cp);
    } else if (cp < 0x800) {
        fk_sb_printf(b, "%c%c", (char)(0xc0 | cp >> 6), (char)(0x80 | (cp & 0x3f)));
    } else if (cp < 0x10000) {
        fk_sb_printf(b, "%c%c%c", (char)(0xe0 | cp >> 12), (char)(0x80 | ((cp >> 6) & 0x3f)),
                     (char)(0x80 | (cp & 0x3f)));
    } else {
        fk_sb_printf(b, "%c%c%c%c", (char)(0xf0 | cp >> 18), (char)(0x80 | ((cp >> 12) & 0x3f)),
                     (char)(0x80 | ((cp >> 6) & 0x3f)), (char)(0x80 | (cp & 0x3f)));
    }
}

/* A \u escape (r->p after the 'u'), surrogate pairs joined. */
static int rd_unicode(struct rd *r, struct fk_sb *b)
{
    unsigned cp = 0;
    FK_TRY(hex4(r, &cp));
    if (cp >= 0xdc00 && cp <= 0xdfff)
        return rd_fail(r, "lone low surrogate \\u%04x", cp);
    if (cp >= 0xd800 && cp <= 0xdbff) {
        unsigned lo = 0;
        if (r->p[0] != '\\' || r->p[1] != 'u')
            return rd_fail(r, "high surrogate \\u%04x without its low half", cp);
        r->p += 2;
        FK_TRY(hex4(r, &lo));
        if (lo < 0xdc00 || lo > 0xdfff)
            return rd_fail(r, "high surrogate \\u%04x followed by \\u%04x", cp, lo);
        cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
    }
    if (cp == 0)
        return rd_fail(r, "\\u0000 is not supported in strings");
    put_utf8(b, cp);
    return FK_OK;
}

/* A string (r->p at the opening quote) into *out (malloc'ed). */
static int rd_string(struct rd *r, char **out)
{
    struct fk_sb b = {0};
    r->p++;
    int rc = FK_OK;
    while (rc == FK_OK) {
        unsigned char c = (unsigned char)*r->p;
        if (c == '"') {
            r->p++;
            break;
        }
        if (!c) {
            rc = rd_fail(r, "unterminated string");
        } else if (c < 0x20) {
            rc = rd_fail(r, "control character 0x%02x in a string (escape it)", c);
        } else if (c != '\\') {
            fk_sb_printf(&b, "%c", (char)c);
            r->p++;
        } else {
            char e = r->p[1], d = 0;
            switch (e) {
            case '"': case '\\': case '/': d = e; break;
            case 'b': d = '\b'; break;
            case 'f': d = '\f'; break;
            case 'n': d = '\n'; break;
            case 'r': d = '\r'; break;
            case 't': d = '\t'; break;
            default: break;
            }
            if (e == 'u') {
                r->p += 2;
                rc = rd_unicode(r, &b);
            } else if (d) {
                r->p += 2;
                fk_sb_printf(&b, "%c", d);
            } else {
                rc = rd_fail(r, "bad escape '\\%c'", e ? e : ' ');
            }
        }
    }
    if (rc == FK_OK && b.oom)
        rc = fk_err(FK_ENOMEM, "out of memory");
    if (rc == FK_OK && !b.s && !(b.s = calloc(1, 1)))
        rc = fk_err(FK_ENOMEM, "out of memory");
    if (rc < 0) {
        fk_sb_free(&b);
        return rc;
    }
    *out = b.s;
    return FK_OK;
}

/* A number by the JSON grammar: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? */
static int rd_number(struct rd *r, double *out)
{
    const char *q = r->p;
    if (*q == '-')
        q++;
    if (*q == '0')
        q++;
    else if (*q >= '1' && *q <= '9')
        while (*q >= '0' && *q <= '9')
            q++;
    else
        return rd_fail(r, "expected a value");
    if (*q == '.') {
        q++;
        if (!(*q >= '0' && *q <= '9'))
            return rd_fail(r, "expected a digit after the decimal point");
        while (*q >= '0' && *q <= '9')
            q++;
    }
    if (*q == 'e' || *q == 'E') {
        q++;
        if (*q == '+' || *q == '-')
            q++;
        if (!(*q >= '0' && *q <= '9'))
            return rd_fail(r, "expected a digit in the exponent");
        while (*q >= '0' && *q <= '9')
            q++;
    }
    errno = 0;
    *out = strtod(r->p, NULL);
    if (errno == ERANGE && isinf(*out))
        return rd_fail(r, "number out of range");
    r->p = q;
    return FK_OK;
}

static int rd_value(struct rd *r, struct fk_json *v);

/* Appends a zeroed slot to a container; *slot points at it. */
static int grow(struct fk_json *v, int *cap, int with_keys, struct fk_json **slot)
{
    if (v->n == *cap) {
        int nc = *cap ? *cap * 2 : 8;
        struct fk_json *ni = realloc(v->items, sizeof *ni * (size_t)nc);
        if (!ni)
            return fk_err(FK_ENOMEM, "out of memory");
        v->items = ni;
        if (with_keys) {
            char **nk = realloc(v->keys, sizeof *nk * (size_t)nc);
            if (!nk)
                return fk_err(FK_ENOMEM, "out of memory");
            v->keys = nk;
        }
        *cap = nc;
    }
    *slot = &v->items[v->n];
    memset(*slot, 0, sizeof **slot);
    if (with_keys)
        v->keys[v->n] = NULL;
    v->n++;
    return FK_OK;
}

/* An object or array (r->p at '{' or '['). */
static int rd_container(struct rd *r, struct fk_json *v)
{
    int obj = *r->p == '{', cap = 0;
    char close = obj ? '}' : ']';
    v->type = obj ? FK_JSON_OBJ : FK_JSON_ARR;
    if (++r->depth > FK_JSON_MAX_DEPTH)
        return rd_fail(r, "nested deeper than %d levels", FK_JSON_MAX_DEPTH);
    r->p++;
    rd_ws(r);
    if (*r->p == close) {
        r->p++;
        r->depth--;
        return FK_OK;
    }
    for (;;) {
        struct fk_json *slot = NULL;
        FK_TRY(grow(v, &cap, obj, &slot));
        if (obj) {
            if (*r->p != '"')
                return rd_fail(r, "expected a member name in double quotes");
            FK_TRY(rd_string(r, &v->keys[v->n - 1]));
            rd_ws(r);
            if (*r->p != ':')
                return rd_fail(r, "expected ':' after the member name");
            r->p++;
            rd_ws(r);
        }
        FK_TRY(rd_value(r, slot));
        rd_ws(r);
        if (*r->p == ',') {
            r->p++;
            rd_ws(r);
            if (*r->p == close)
                return rd_fail(r, "trailing comma before '%c'", close);
            continue;
        }
        if (*r->p == close) {
            r->p++;
            r->depth--;
            return FK_OK;
        }
        return rd_fail(r, "expected ',' or '%c'", close);
    }
}

static int rd_value(struct rd *r, struct fk_json *v)
{
    v->line = r->line;
    v->col = rd_col(r);
    char c = *r->p;
    if (c == '{' || c == '[')
        return rd_container(r, v);
    if (c == '"') {
        v->type = FK_JSON_STR;
        return rd_string(r, &v->str);
    }
    static const char *const words[] = {"true", "false", "null"};
    for (int i = 0; i < 3; i++) {
        size_t n = strlen(words[i]);
        if (!strncmp(r->p, words[i], n)) {
            v->type = i < 2 ? FK_JSON_BOOL : FK_JSON_NULL;
            v->boolean = i == 0;
            r->p += n;
            return FK_OK;
        }
    }
    v->type = FK_JSON_NUM;
    return rd_number(r, &v->num);
}

int fk_json_parse(const char *text, const char *name, struct fk_json **out)
{
    *out = NULL;
    struct rd r = {.s = text, .p = text, .name = name ? name : "(json)", .line = 1,
                   .line_start = text};
    struct fk_json *v = calloc(1, sizeof *v);
    if (!v)
        return fk_err(FK_ENOMEM, "out of memory");
    rd_ws(&r);
    int rc = *r.p ? rd_value(&r, v) : rd_fail(&r, "empty document");
    if (rc == FK_OK) {
        rd_ws(&r);
        if (*r.p)
            rc = rd_fail(&r, "unexpected text after the value");
    }
    if (rc < 0) {
        value_free(v);
        free(v);
        return rc;
    }
    *out = v;
    return FK_OK;
}

int fk_json_load(const char *path, struct fk_json **out)
{
    *out = NULL;
    size_t len = 0;
    char *text = fk_slurp(path, &len);
    if (!text)
        return fk_err(FK_EIO, "%s: cannot read (%s)", path, strerror(errno));
    int rc = strlen(text) != len ? fk_err(FK_ECORRUPT, "%s: NUL byte in a JSON file", path)
                                 : fk_json_parse(text, path, out);
    free(text);
    return rc;
}

void fk_json_free(struct fk_json **v)
{
    if (!v || !*v)
        return;
    value_free(*v);
    free(*v);
    *v = NULL;
}

const struct fk_json *fk_json_get(const struct fk_json *obj, const char *key)
{
    if (!obj || obj->type != FK_JSON_OBJ)
        return NULL;
    for (int i = obj->n - 1; i >= 0; i--)
        if (!strcmp(obj->keys[i], key))
            return &obj->items[i];
    return NULL;
}
