/* SPDX-License-Identifier: MIT
 * TOML 1.0 conformance: runs the toml-test corpus ($FK_SHARED/toml-test, list
 * tests/files-toml-1.0.0) through fk_toml. Valid cases must parse and equal the expected tagged
 * JSON (compared as values: key order ignored, floats numerically, date-times after RFC 3339
 * normalisation), and must survive a round trip through fk_toml_to_string/fk_toml_parse_value.
 * Invalid cases must be rejected with a "FILE:LINE:COL: " message. Skips when the corpus is
 * absent. The JSON reader below is test-only and minimal.
 */
#include "fk_check_main.h"
#include "common/fk_err.h"
#include "common/fk_toml.h"

#include <check.h>
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Allocation for test scaffolding: a failure fails the test (never returns NULL). */
static void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q) {
        ck_abort_msg("out of memory in test scaffolding");
        abort(); /* not reached; tells the compiler q is never NULL below */
    }
    return q;
}

/* ---- minimal JSON reader ---- */

enum jtype { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };

struct jv {
    enum jtype t;     /* kind */
    char *s;          /* J_STR: bytes (NUL-terminated, may hold NUL); J_NUM: literal text */
    size_t len;       /* J_STR: bytes in s */
    int b;            /* J_BOOL */
    struct jv **items; /* J_ARR: (n) elements; J_OBJ: (n) values */
    char **keys;      /* J_OBJ: (n) keys */
    size_t *klen;     /* J_OBJ: (n) key lengths */
    size_t n;         /* element count */
};

struct jp {
    const char *s; /* text */
    size_t n, i;   /* length and position */
    int depth;     /* nesting, bounded */
};

static void jv_free(struct jv *v)
{
    if (!v)
        return;
    for (size_t i = 0; i < v->n; i++) {
        jv_free(v->items[i]);
        if (v->keys)
            free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->klen);
    free(v->s);
    free(v);
}

static void jws(struct jp *p)
{
    while (p->i < p->n && isspace((unsigned char)p->s[p->i]))
        p->i++;
}

static int hex4(struct jp *p, unsigned *out)
{
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        if (p->i >= p->n || !isxdigit((unsigned char)p->s[p->i]))
            return -1;
        char c = p->s[p->i++];
        v = v * 16 + (unsigned)(isdigit((unsigned char)c) ? c - '0' : (tolower(c) - 'a' + 10));
    }
    *out = v;
    return 0;
}

static size_t utf8_put(char *o, unsigned cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

static int jstr(struct jp *p, char **out, size_t *len)
{
    if (p->i >= p->n || p->s[p->i] != '"')
        return -1;
    p->i++;
    char *o = xrealloc(NULL, p->n - p->i + 1); /* decoded text is never longer than the source */
    size_t k = 0;
    while (p->i < p->n && p->s[p->i] != '"') {
        char c = p->s[p->i++];
        if (c != '\\') {
            o[k++] = c;
            continue;
        }
        if (p->i >= p->n)
            break;
        c = p->s[p->i++];
        unsigned cp;
        switch (c) {
        case 'b': o[k++] = '\b'; break;
        case 'f': o[k++] = '\f'; break;
        case 'n': o[k++] = '\n'; break;
        case 'r': o[k++] = '\r'; break;
        case 't': o[k++] = '\t'; break;
        case 'u':
            if (hex4(p, &cp) < 0)
                goto bad;
            if (cp >= 0xD800 && cp < 0xDC00 && p->i + 1 < p->n && p->s[p->i] == '\\' &&
                p->s[p->i + 1] == 'u') {
                unsigned lo;
                p->i += 2;
                if (hex4(p, &lo) < 0)
                    goto bad;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            k += utf8_put(o + k, cp);
            break;
        default: o[k++] = c; break;
        }
    }
    if (p->i >= p->n)
        goto bad;
    p->i++;
    o[k] = '\0';
    *out = o;
    *len = k;
    return 0;
bad:
    free(o);
    return -1;
}

static struct jv *jparse(struct jp *p)
{
    jws(p);
    if (p->i >= p->n || ++p->depth > 200)
        return NULL;
    struct jv *v = xrealloc(NULL, sizeof *v);
    memset(v, 0, sizeof *v);
    char c = p->s[p->i];
    if (c == '{' || c == '[') {
        v->t = c == '{' ? J_OBJ : J_ARR;
        p->i++;
        size_t cap = 0;
        jws(p);
        if (p->i < p->n && p->s[p->i] == (c == '{' ? '}' : ']')) {
            p->i++;
            p->depth--;
            return v;
        }
        for (;;) {
            if (v->n == cap) {
                cap = cap ? 2 * cap : 4;
                v->items = xrealloc(v->items, cap * sizeof *v->items);
                if (c == '{') {
                    v->keys = xrealloc(v->keys, cap * sizeof *v->keys);
                    v->klen = xrealloc(v->klen, cap * sizeof *v->klen);
                }
            }
            if (c == '{') {
                jws(p);
                if (jstr(p, &v->keys[v->n], &v->klen[v->n]) < 0)
                    goto bad;
                jws(p);
                if (p->i >= p->n || p->s[p->i++] != ':') {
                    free(v->keys[v->n]);
                    goto bad;
                }
            }
            struct jv *item = jparse(p);
            if (!item) {
                if (c == '{')
                    free(v->keys[v->n]);
                goto bad;
            }
            v->items[v->n++] = item;
            jws(p);
            if (p->i < p->n && p->s[p->i] == ',') {
                p->i++;
                continue;
            }
            if (p->i < p->n && p->s[p->i] == (c == '{' ? '}' : ']')) {
                p->i++;
                break;
            }
            goto bad;
        }
    } else if (c == '"') {
        v->t = J_STR;
        if (jstr(p, &v->s, &v->len) < 0)
            goto bad;
    } else if (strncmp(p->s + p->i, "true", 4) == 0 || strncmp(p->s + p->i, "false", 5) == 0) {
        v->t = J_BOOL;
        v->b = c == 't';
        p->i += v->b ? 4 : 5;
    } else if (strncmp(p->s + p->i, "null", 4) == 0) {
        v->t = J_NULL;
        p->i += 4;
    } else {
        size_t s = p->i;
        while (p->i < p->n && strchr("+-0123456789.eE", p->s[p->i]))
            p->i++;
        if (p->i == s)
            goto bad;
        v->t = J_NUM;
        v->s = xrealloc(NULL, p->i - s + 1);
        memcpy(v->s, p->s + s, p->i - s);
        v->s[p->i - s] = '\0';
    }
    p->depth--;
    return v;
bad:
    jv_free(v);
    return NULL;
}

static const struct jv *jget(const struct jv *o, const char *key)
{
    for (size_t i = 0; o && o->t == J_OBJ && i < o->n; i++)
        if (strcmp(o->keys[i], key) == 0)
            return o->items[i];
    return NULL;
}

/* ---- comparison ---- */

static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 4096, n = 0;
    char *b = xrealloc(NULL, cap);
    size_t got;
    while ((got = fread(b + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (cap - n - 1 == 0) {
            cap *= 2;
            b = xrealloc(b, cap);
        }
    }
    fclose(f);
    b[n] = '\0';
    *len = n;
    return b;
}

/* RFC 3339 normal form: 'T' separator, upper-case Z, fraction without trailing zeros. */
static void norm_datetime(const char *in, char *out, size_t cap)
{
    snprintf(out, cap, "%s", in);
    size_t n = strlen(out);
    for (size_t i = 0; i < n; i++) {
        if (out[i] == 't' || (out[i] == ' ' && i == 10))
            out[i] = 'T';
        if (out[i] == 'z')
            out[i] = 'Z';
    }
    char *dot = strchr(out, '.');
    if (dot) {
        char *e = dot + 1;
        while (isdigit((unsigned char)*e))
            e++;
        char *z = e;
        while (z > dot + 1 && z[-1] == '0')
            z--;
        if (z == dot + 1)
            z = dot;
        memmove(z, e, strlen(e) + 1);
    }
}

static const char *tag_of(enum fk_toml_type t)
{
    switch (t) {
    case FK_TOML_STRING: return "string";
    case FK_TOML_INT: return "integer";
    case FK_TOML_FLOAT: return "float";
    case FK_TOML_BOOL: return "bool";
    case FK_TOML_DATETIME: return "datetime";
    case FK_TOML_DATETIME_LOCAL: return "datetime-local";
    case FK_TOML_DATE_LOCAL: return "date-local";
    case FK_TOML_TIME_LOCAL: return "time-local";
    default: return "?";
    }
}

/* Returns 1 if v equals the tagged JSON j; else 0 with a reason in why. */
static int same(const struct fk_toml_value *v, const struct jv *j, char *why, size_t cap)
{
    enum fk_toml_type t = fk_toml_type(v);
    if (t == FK_TOML_TABLE) {
        if (j->t != J_OBJ) {
            snprintf(why, cap, "table vs non-object at %d:%d", fk_toml_line(v), fk_toml_col(v));
            return 0;
        }
        if (fk_toml_table_len(v) != j->n) {
            snprintf(why, cap, "table at %d:%d has %zu keys, expected %zu", fk_toml_line(v),
                     fk_toml_col(v), fk_toml_table_len(v), j->n);
            return 0;
        }
        for (size_t i = 0; i < j->n; i++) {
            const struct fk_toml_value *c = fk_toml_table_getn(v, j->keys[i], j->klen[i]);
            if (!c) {
                snprintf(why, cap, "missing key '%s'", j->keys[i]);
                return 0;
            }
            if (!same(c, j->items[i], why, cap))
                return 0;
        }
        return 1;
    }
    if (t == FK_TOML_ARRAY) {
        if (j->t != J_ARR || fk_toml_array_len(v) != j->n) {
            snprintf(why, cap, "array at %d:%d: length/type mismatch", fk_toml_line(v),
                     fk_toml_col(v));
            return 0;
        }
        for (size_t i = 0; i < j->n; i++)
            if (!same(fk_toml_array_at(v, i), j->items[i], why, cap))
                return 0;
        return 1;
    }
    const struct jv *jt = jget(j, "type"), *jval = jget(j, "value");
    if (j->t != J_OBJ || !jt || !jval || jt->t != J_STR || jval->t != J_STR) {
        snprintf(why, cap, "scalar at %d:%d vs untagged JSON", fk_toml_line(v), fk_toml_col(v));
        return 0;
    }
    if (strcmp(jt->s, tag_of(t)) != 0) {
        snprintf(why, cap, "value at %d:%d is %s, expected %s", fk_toml_line(v),
                 fk_toml_col(v), tag_of(t), jt->s);
        return 0;
    }
    const char *ex = jval->s;
    int ok = 0;
    switch (t) {
    case FK_TOML_STRING: {
        const char *s;
        size_t n;
        ck_assert_int_eq(fk_toml_get_string(v, &s, &n), FK_OK);
        ok = n == jval->len && memcmp(s, ex, n) == 0;
        break;
    }
    case FK_TOML_INT: {
        int64_t i;
        ck_assert_int_eq(fk_toml_get_int(v, &i), FK_OK);
        ok = i == strtoll(ex, NULL, 10);
        break;
    }
    case FK_TOML_FLOAT: {
        double d, e;
        ck_assert_int_eq(fk_toml_get_float(v, &d), FK_OK);
        if (strcmp(ex, "nan") == 0 || strcmp(ex, "+nan") == 0 || strcmp(ex, "-nan") == 0) {
            ok = isnan(d);
        } else {
            e = strcmp(ex, "inf") == 0 || strcmp(ex, "+inf") == 0 ? HUGE_VAL
                : strcmp(ex, "-inf") == 0                        ? -HUGE_VAL
                                                                 : strtod(ex, NULL);
            ok = d == e && (d != 0 || signbit(d) == signbit(e));
        }
        break;
    }
    case FK_TOML_BOOL: {
        int b;
        ck_assert_int_eq(fk_toml_get_bool(v, &b), FK_OK);
        ok = b == (strcmp(ex, "true") == 0);
        break;
    }
    default: {
        const char *s;
        char a[96], b[96];
        ck_assert_int_eq(fk_toml_get_datetime(v, &s), FK_OK);
        norm_datetime(s, a, sizeof a);
        norm_datetime(ex, b, sizeof b);
        ok = strcmp(a, b) == 0;
        break;
    }
    }
    if (!ok) {
        char *got = NULL;
        fk_toml_to_string(v, &got, NULL);
        snprintf(why, cap, "value at %d:%d is %s, expected %s", fk_toml_line(v),
                 fk_toml_col(v), got ? got : "?", ex);
        free(got);
    }
    return ok;
}

/* Checks that a rejection message starts with "path:LINE:COL: ". */
static int well_formed_error(const char *path, const char *msg)
{
    size_t n = strlen(path);
    if (strncmp(msg, path, n) != 0 || msg[n] != ':')
        return 0;
    const char *s = msg + n + 1;
    int line, col, used = 0;
    if (sscanf(s, "%d:%d: %n", &line, &col, &used) != 2 || used == 0)
        return 0;
    return line >= 1 && col >= 1 && s[used] != '\0';
}

START_TEST(test_corpus)
{
    const char *shared = getenv("FK_SHARED");
    char root[1024], list[1200];
    snprintf(root, sizeof root, "%s/toml-test/tests", shared ? shared : "/work/shared");
    snprintf(list, sizeof list, "%s/files-toml-1.0.0", root);
    FILE *f = fopen(list, "r");
    if (!f) {
        printf("toml conformance: SKIPPED: %s not found (corpus absent)\n", list);
        return;
    }
    char line[1024];
    int vpass = 0, vfail = 0, ipass = 0, ifail = 0, shown = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = '\0';
        size_t ln = strlen(line);
        if (ln < 5 || strcmp(line + ln - 5, ".toml") != 0)
            continue;
        int valid = strncmp(line, "valid/", 6) == 0;
        char path[2400], jpath[2400], why[512] = "";
        snprintf(path, sizeof path, "%s/%s", root, line);
        size_t n;
        char *buf = read_all(path, &n);
        ck_assert_msg(buf != NULL, "cannot read %s", path);
        struct fk_toml_value *doc = (struct fk_toml_value *)(void *)line; /* must be reset */
        int rc = fk_toml_parse(buf, n, path, &doc);
        int ok;
        if (rc == FK_OK)
            ck_assert_ptr_nonnull(doc);
        else
            ck_assert_ptr_null(doc);
        if (valid) {
            ok = rc == FK_OK;
            if (!ok)
                snprintf(why, sizeof why, "rejected: %s", fk_errmsg());
            struct jv *j = NULL;
            if (ok) {
                snprintf(jpath, sizeof jpath, "%.*s.json", (int)(strlen(path) - 5), path);
                size_t jn;
                char *jb = read_all(jpath, &jn);
                ck_assert_msg(jb != NULL, "cannot read %s", jpath);
                struct jp jp = {jb, jn, 0, 0};
                j = jparse(&jp);
                ck_assert_msg(j != NULL, "bad JSON in %s", jpath);
                free(jb);
                ok = same(doc, j, why, sizeof why);
            }
            if (ok) { /* canonical text parses back to the same document */
                char *text = NULL;
                struct fk_toml_value *back = NULL;
                ck_assert_int_eq(fk_toml_to_string(doc, &text, NULL), FK_OK);
                rc = fk_toml_parse_value(text, "roundtrip", &back);
                ok = rc == FK_OK && same(back, j, why, sizeof why);
                if (rc != FK_OK)
                    snprintf(why, sizeof why, "round trip rejected: %s", fk_errmsg());
                char *text2 = NULL;
                if (ok) {
                    ck_assert_int_eq(fk_toml_to_string(back, &text2, NULL), FK_OK);
                    ok = strcmp(text, text2) == 0;
                    if (!ok)
                        snprintf(why, sizeof why, "canonical text not a fixed point");
                }
                free(text);
                free(text2);
                fk_toml_free(&back);
            }
            jv_free(j);
            ok ? vpass++ : vfail++;
        } else {
            ok = rc == FK_ECONFIG && well_formed_error(path, fk_errmsg());
            if (rc == FK_OK)
                snprintf(why, sizeof why, "accepted");
            else if (!ok)
                snprintf(why, sizeof why, "bad error (%d) message: %s", rc, fk_errmsg());
            ok ? ipass++ : ifail++;
        }
        if (!ok && shown++ < 40)
            printf("FAIL %s: %s\n", line, why);
        fk_toml_free(&doc);
        ck_assert_ptr_null(doc);
        free(buf);
    }
    fclose(f);
    printf("toml conformance (toml-test, TOML 1.0.0): valid %d passed, %d failed; "
           "invalid %d passed, %d failed; total passed %d, failed %d, skipped 0\n",
           vpass, vfail, ipass, ifail, vpass + ipass, vfail + ifail);
    fflush(stdout);
    ck_assert_int_gt(vpass, 0);
    ck_assert_int_gt(ipass, 0);
    ck_assert_int_eq(vfail + ifail, 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("toml_conformance");
    TCase *tc = tcase_create("corpus");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_corpus);
    suite_add_tcase(s, tc);
    return fk_suite_run(s);
}
