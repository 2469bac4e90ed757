/* SPDX-License-Identifier: MIT
 * Unit tests of the TOML reader (harness/common/fk_toml.h): every value kind, positions, insertion
 * order, each error class with its exact FILE:LINE:COL, --set overrides (parse_value and
 * set_path), the canonical text, clone, file input, the hash index of big tables, and a
 * deterministic mutation/truncation loop for memory safety (run it under the ASan build).
 * Oracles are hand-written expectations and independent computations (strtod for floats,
 * brute-force positions).
 */
#include <check.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fk_check_main.h"
#include "common/fk_err.h"
#include "common/fk_toml.h"

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

/* Appends printf text at buf + k (capacity cap) and returns the new length. */
static size_t bput(char *buf, size_t cap, size_t k, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

static size_t bput(char *buf, size_t cap, size_t k, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + k, cap - k, fmt, ap);
    va_end(ap);
    ck_assert(n >= 0 && (size_t)n < cap - k);
    return k + (size_t)n;
}

static struct fk_toml_value *parse_ok(const char *text)
{
    struct fk_toml_value *v = NULL;
    int rc = fk_toml_parse(text, strlen(text), "t.toml", &v);
    ck_assert_msg(rc == FK_OK, "unexpected error: %s", fk_errmsg());
    ck_assert_ptr_nonnull(v);
    return v;
}

/* Parses text, expects FK_ECONFIG with a message starting with `prefix` and containing
 * `needle`, and *out left NULL. */
static void parse_bad(const char *text, const char *prefix, const char *needle)
{
    struct fk_toml_value *v = NULL;
    int rc = fk_toml_parse(text, strlen(text), "t.toml", &v);
    ck_assert_msg(rc == FK_ECONFIG, "accepted or wrong code %d for <<%s>>", rc, text);
    ck_assert_ptr_null(v);
    const char *m = fk_errmsg();
    ck_assert_msg(strncmp(m, prefix, strlen(prefix)) == 0, "for <<%s>>: got '%s', want '%s'",
                  text, m, prefix);
    ck_assert_msg(strstr(m, needle) != NULL, "for <<%s>>: '%s' lacks '%s'", text, m, needle);
}

static char *canon(const struct fk_toml_value *v)
{
    char *s = NULL;
    size_t n = 0;
    ck_assert_int_eq(fk_toml_to_string(v, &s, &n), FK_OK);
    ck_assert_uint_eq(n, strlen(s));
    return s;
}

static void ck_canon(const struct fk_toml_value *v, const char *want)
{
    char *s = canon(v);
    ck_assert_str_eq(s, want);
    free(s);
}

START_TEST(test_scalars_and_positions)
{
    const char *doc = "# header comment\n"
                      "title = \"TOML\"\n"        /* line 2 */
                      "  n = -42  # trailing\n"    /* line 3: key col 3, value col 7 */
                      "pi = 3.14\n"
                      "yes = true\n"
                      "no = false\n"
                      "\"quoted key\" = 'lit'\n"   /* line 7 */
                      "\xc3\xa9t\xc3\xa9 = 1\n";   /* line 8: non-ASCII bare key */
    struct fk_toml_value *v = NULL;
    /* "été" is not a bare key in TOML 1.0: that line must be rejected at 8:1 */
    int rc = fk_toml_parse(doc, strlen(doc), "t.toml", &v);
    ck_assert_int_eq(rc, FK_ECONFIG);
    ck_assert_str_eq(fk_errmsg(), "t.toml:8:1: unexpected U+00E9 (expected a key: letters, "
                                  "digits, '-', '_' or a quoted string)");
    const char *doc2 = "# header comment\n"
                       "title = \"TOML\"\n"
                       "  n = -42  # trailing\n"
                       "pi = 3.14\n"
                       "yes = true\n"
                       "no = false\n"
                       "\"quoted key\" = 'lit'\n"
                       "\"\xc3\xa9t\xc3\xa9\" = 1\n";
    v = parse_ok(doc2);
    ck_assert_int_eq(fk_toml_type(v), FK_TOML_TABLE);
    ck_assert_uint_eq(fk_toml_table_len(v), 7);
    const char *s;
    size_t len;
    int64_t i;
    double d;
    int b;
    ck_assert_int_eq(fk_toml_get_string(fk_toml_table_get(v, "title"), &s, &len), FK_OK);
    ck_assert_str_eq(s, "TOML");
    ck_assert_uint_eq(len, 4);
    const struct fk_toml_value *n = fk_toml_table_get(v, "n");
    ck_assert_int_eq(fk_toml_get_int(n, &i), FK_OK);
    ck_assert_int_eq(i, -42);
    ck_assert_int_eq(fk_toml_line(n), 3);
    ck_assert_int_eq(fk_toml_col(n), 7);
    ck_assert_str_eq(fk_toml_origin(n), "t.toml");
    const struct fk_toml_entry *e = fk_toml_table_at(v, 1);
    ck_assert_str_eq(e->key, "n");
    ck_assert_int_eq(e->line, 3);
    ck_assert_int_eq(e->col, 3);
    ck_assert_str_eq(e->origin, "t.toml");
    ck_assert_ptr_eq(e->value, n);
    ck_assert_int_eq(fk_toml_get_float(fk_toml_table_get(v, "pi"), &d), FK_OK);
    ck_assert(d == strtod("3.14", NULL));
    ck_assert_int_eq(fk_toml_get_bool(fk_toml_table_get(v, "yes"), &b), FK_OK);
    ck_assert_int_eq(b, 1);
    ck_assert_int_eq(fk_toml_get_bool(fk_toml_table_get(v, "no"), &b), FK_OK);
    ck_assert_int_eq(b, 0);
    ck_assert_int_eq(fk_toml_get_string(fk_toml_table_get(v, "quoted key"), &s, NULL), FK_OK);
    ck_assert_str_eq(s, "lit");
    const struct fk_toml_entry *u = fk_toml_table_at(v, 6);
    ck_assert_str_eq(u->key, "\xc3\xa9t\xc3\xa9");
    ck_assert_int_eq(u->line, 8);
    /* columns count code points: '"été" = 1' puts the value at column 9 */
    ck_assert_int_eq(fk_toml_col(u->value), 9);
    ck_assert_ptr_null(fk_toml_table_at(v, 7));
    ck_assert_ptr_null(fk_toml_table_get(v, "absent"));
    /* wrong-type getters name the position and both types */
    ck_assert_int_eq(fk_toml_get_int(fk_toml_table_get(v, "title"), &i), FK_ECONFIG);
    ck_assert_str_eq(fk_errmsg(), "t.toml:2:9: expected an integer, got a string");
    ck_assert_int_eq(fk_toml_get_string(n, &s, NULL), FK_ECONFIG);
    ck_assert_str_eq(fk_errmsg(), "t.toml:3:7: expected a string, got an integer");
    ck_assert_int_eq(fk_toml_get_bool(NULL, &b), FK_EINVAL);
    /* get_float accepts exact integers only */
    ck_assert_int_eq(fk_toml_get_float(n, &d), FK_OK);
    ck_assert(d == -42.0);
    fk_toml_free(&v);
    ck_assert_ptr_null(v);
    v = parse_ok("big = 9007199254740993\nok = 9007199254740992\n");
    ck_assert_int_eq(fk_toml_get_float(fk_toml_table_get(v, "big"), &d), FK_ECONFIG);
    ck_assert_int_eq(fk_toml_get_float(fk_toml_table_get(v, "ok"), &d), FK_OK);
    ck_assert(d == 9007199254740992.0);
    fk_toml_free(&v);
    fk_toml_free(&v); /* idempotent */
    fk_toml_free(NULL);
}
END_TEST

START_TEST(test_integers)
{
    struct fk_toml_value *v = parse_ok("a = 1_000_000\nb = +17\nc = 0xDEAD_beef\nd = 0o755\n"
                                       "e = 0b1101\nf = 9223372036854775807\n"
                                       "g = -9223372036854775808\nh = 0\ni = -0\nj = +0\n"
                                       "k = 0x7FFFFFFFFFFFFFFF\n");
    const int64_t want[] = {1000000, 17, 0xDEADBEEF, 0755, 13, INT64_MAX, INT64_MIN, 0, 0, 0,
                            INT64_MAX};
    const char *keys = "abcdefghijk";
    for (int k = 0; keys[k]; k++) {
        char key[2] = {keys[k], 0};
        int64_t x;
        ck_assert_int_eq(fk_toml_type(fk_toml_table_get(v, key)), FK_TOML_INT);
        ck_assert_int_eq(fk_toml_get_int(fk_toml_table_get(v, key), &x), FK_OK);
        ck_assert_msg(x == want[k], "key %s", key);
    }
    fk_toml_free(&v);
    parse_bad("x = 1\ny = 9223372036854775808\n", "t.toml:2:5: integer '9223372036854775808' "
              "does not fit in 64 bits", "expected");
    parse_bad("y = -9223372036854775809", "t.toml:1:5: integer", "does not fit in 64 bits");
    parse_bad("y = 0x8000000000000000", "t.toml:1:5: integer", "does not fit in 64 bits");
    parse_bad("y = 0b1_", "t.toml:1:5: malformed binary integer", "0b");
    parse_bad("y = 012", "t.toml:1:5: leading zero in number '012'", "no leading zeros");
    parse_bad("y = 1__2", "t.toml:1:5: invalid value '1__2'", "single underscores");
    parse_bad("y = _1", "t.toml:1:5: unexpected '_'", "expected a value");
    parse_bad("y = -0x1", "t.toml:1:5: sign on a hexadecimal integer", "no sign");
    parse_bad("y = 0X1", "t.toml:1:5: invalid value '0X1'", "expected a number");
}
END_TEST

START_TEST(test_floats)
{
    struct fk_toml_value *v = parse_ok("a = 3.1415\nb = -1e-3\nc = 6.626e-34\nd = 5E+22\n"
                                       "e = 1_000.000_1\nf = inf\ng = -inf\nh = nan\ni = -0.0\n"
                                       "j = 0e0\nk = +nan\nl = 1e-400\n");
    const char *src[] = {"3.1415", "-1e-3", "6.626e-34", "5E+22", "1000.0001"};
    const char *keys[] = {"a", "b", "c", "d", "e"};
    double d;
    for (int k = 0; k < 5; k++) {
        ck_assert_int_eq(fk_toml_get_float(fk_toml_table_get(v, keys[k]), &d), FK_OK);
        ck_assert_msg(d == strtod(src[k], NULL), "key %s", keys[k]);
    }
    ck_assert_int_eq(fk_toml_get_float(fk_toml_table_get(v, "f"), &d), FK_OK);
    ck_assert(isinf(d) && d > 0);
    ck_assert_int_eq(fk_toml_get_float(fk_toml_table_get(v, "g"), &d), FK_OK);
    ck_assert(isinf(d) && d < 0);
    ck_assert_int_eq(fk_toml_get_float(fk_toml_table_get(v, "h"), &d), FK_OK);
    ck_assert(isnan(d));
    ck_assert_int_eq(fk_toml_get_float(fk_toml_table_get(v, "i"), &d), FK_OK);
    ck_assert(d == 0.0 && signbit(d));
    ck_assert_int_eq(fk_toml_get_float(fk_toml_table_get(v, "k"), &d), FK_OK);
    ck_assert(isnan(d));
    ck_assert_int_eq(fk_toml_get_float(fk_toml_table_get(v, "l"), &d), FK_OK);
    ck_assert(d == 0.0);
    ck_assert_int_eq(fk_toml_type(fk_toml_table_get(v, "j")), FK_TOML_FLOAT);
    fk_toml_free(&v);
    parse_bad("a = 1.", "t.toml:1:5: invalid value '1.'", "expected a number");
    parse_bad("a = .5", "t.toml:1:5: unexpected '.'", "expected a value");
    parse_bad("a = 1e", "t.toml:1:5: invalid value '1e'", "expected a number");
    parse_bad("a = 1.5_", "t.toml:1:5: invalid value '1.5_'", "expected a number");
    parse_bad("a = 1e400", "t.toml:1:5: float '1e400' out of range", "finite");
    parse_bad("a = Inf", "t.toml:1:5: unexpected 'I'", "expected a value");
    parse_bad("\n\n  a = 03.14", "t.toml:3:7: leading zero", "03.14");
}
END_TEST

START_TEST(test_strings)
{
    const char *doc =
        "a = \"tab\\there \\\"q\\\" back\\\\slash \\u00E9 \\U0001F600 nul\\u0000!\"\n"
        "b = \"\"\"\nline1\nline2\\\n     continued \\\r\n\n  end\"\"\"\n"
        "c = 'C:\\path\\no escapes'\n"
        "d = '''\n"
        "first newline trimmed\r\nsecond ''quoted'' '''\n"
        "e = \"\"\"two quotes at end\"\"\"\"\"\n"
        "f = \"\"\n"
        "g = ''''''\n";
    struct fk_toml_value *v = parse_ok(doc);
    const char *s;
    size_t n;
    ck_assert_int_eq(fk_toml_get_string(fk_toml_table_get(v, "a"), &s, &n), FK_OK);
    const char want_a[] = "tab\there \"q\" back\\slash \xc3\xa9 \xf0\x9f\x98\x80 nul\0!";
    ck_assert_uint_eq(n, sizeof want_a - 1);
    ck_assert(memcmp(s, want_a, n) == 0);
    ck_assert_int_eq(fk_toml_get_string(fk_toml_table_get(v, "b"), &s, &n), FK_OK);
    ck_assert_str_eq(s, "line1\nline2continued end");
    ck_assert_int_eq(fk_toml_get_string(fk_toml_table_get(v, "c"), &s, &n), FK_OK);
    ck_assert_str_eq(s, "C:\\path\\no escapes");
    ck_assert_int_eq(fk_toml_get_string(fk_toml_table_get(v, "d"), &s, &n), FK_OK);
    ck_assert_str_eq(s, "first newline trimmed\nsecond ''quoted'' "); /* CRLF -> LF */
    ck_assert_int_eq(fk_toml_get_string(fk_toml_table_get(v, "e"), &s, &n), FK_OK);
    ck_assert_str_eq(s, "two quotes at end\"\"");
    ck_assert_int_eq(fk_toml_get_string(fk_toml_table_get(v, "f"), &s, &n), FK_OK);
    ck_assert_uint_eq(n, 0);
    ck_assert_int_eq(fk_toml_get_string(fk_toml_table_get(v, "g"), &s, &n), FK_OK);
    ck_assert_uint_eq(n, 0);
    /* a key with a NUL in it is found by length */
    fk_toml_free(&v);
    v = parse_ok("\"a\\u0000b\" = 1\n");
    ck_assert_ptr_nonnull(fk_toml_table_getn(v, "a\0b", 3));
    ck_assert_ptr_null(fk_toml_table_get(v, "a"));
    fk_toml_free(&v);

    parse_bad("a = \"bad \\q\"", "t.toml:1:10: invalid escape sequence: backslash followed "
              "by 'q'", "\\uXXXX");
    parse_bad("a = \"\\uD800\"", "t.toml:1:6: escape '\\u' names U+D800", "scalar");
    parse_bad("a = \"\\U00110000\"", "t.toml:1:6: escape '\\U' names U+110000", "scalar");
    parse_bad("a = \"\\u12G4\"", "t.toml:1:6: invalid escape '\\u'", "4 hex digits");
    parse_bad("a = \"open\nb = 1", "t.toml:1:10: newline in a basic string", "closing");
    parse_bad("a = 'open", "t.toml:1:10: unterminated literal string opened at 1:5",
              "expected '");
    parse_bad("a = \"\"\"\nabc\n", "t.toml:3:1: unterminated multi-line basic string opened "
              "at 1:5", "\"\"\"");
    parse_bad("a = \"x\x01y\"", "t.toml:1:7: control character U+0001 in a basic string",
              "escaped");
    parse_bad("a = '''x\x7f'''", "t.toml:1:9: control character U+007F", "literal");
    parse_bad("a = \"\"\"x\ry\"\"\"", "t.toml:1:9: bare carriage return", "CRLF");
    parse_bad("a = '''x''''''", "t.toml:1:9: too many quotes", "at most 5");
    parse_bad("a = \"\"\"x \\  y\"\"\"", "t.toml:1:10: invalid escape sequence", "U+0020");
}
END_TEST

START_TEST(test_datetimes)
{
    struct fk_toml_value *v = parse_ok("odt = 1979-05-27T07:32:00.999-07:00\n"
                                       "odt2 = 1979-05-27 07:32:00z\n"
                                       "ldt = 1979-05-27T00:32:00.5\n"
                                       "ld = 2024-02-29\n"
                                       "lt = 23:59:60\n"
                                       "arr = [1979-05-27, 07:32:00]\n");
    struct {
        const char *key, *raw;
        enum fk_toml_type t;
    } want[] = {
        {"odt", "1979-05-27T07:32:00.999-07:00", FK_TOML_DATETIME},
        {"odt2", "1979-05-27 07:32:00z", FK_TOML_DATETIME},
        {"ldt", "1979-05-27T00:32:00.5", FK_TOML_DATETIME_LOCAL},
        {"ld", "2024-02-29", FK_TOML_DATE_LOCAL},
        {"lt", "23:59:60", FK_TOML_TIME_LOCAL},
    };
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
        const struct fk_toml_value *x = fk_toml_table_get(v, want[k].key);
        const char *raw;
        ck_assert_int_eq(fk_toml_type(x), want[k].t);
        ck_assert_int_eq(fk_toml_get_datetime(x, &raw), FK_OK);
        ck_assert_str_eq(raw, want[k].raw);
    }
    const struct fk_toml_value *arr = fk_toml_table_get(v, "arr");
    ck_assert_int_eq(fk_toml_type(fk_toml_array_at(arr, 0)), FK_TOML_DATE_LOCAL);
    ck_assert_int_eq(fk_toml_type(fk_toml_array_at(arr, 1)), FK_TOML_TIME_LOCAL);
    const char *raw;
    ck_assert_int_eq(fk_toml_get_datetime(fk_toml_table_get(v, "nope"), &raw), FK_EINVAL);
    ck_assert_str_eq(fk_toml_type_name(FK_TOML_DATETIME_LOCAL), "local date-time");
    fk_toml_free(&v);
    parse_bad("d = 2023-02-29", "t.toml:1:5: day 29 out of range for 2023-02", "01-28");
    parse_bad("d = 1900-02-29", "t.toml:1:5: day 29 out of range", "01-28");
    parse_bad("d = 2000-13-01", "t.toml:1:5: month 13 out of range", "01-12");
    parse_bad("d = 2000-01-01T24:00:00", "t.toml:1:16: time 24:00:00 out of range", "0-23");
    parse_bad("d = 07:32", "t.toml:1:5: malformed time", "requires seconds");
    parse_bad("d = 1979-05-27T07:32:00+7:00", "t.toml:1:24: malformed time offset", "+HH:MM");
    parse_bad("d = 1979-05-27T07:32:00.Z", "t.toml:1:24: fractional seconds without digits",
              "digits");
    parse_bad("d = 1979-5-27", "t.toml:1:5: malformed date", "YYYY-MM-DD");
}
END_TEST

START_TEST(test_arrays_and_inline_tables)
{
    struct fk_toml_value *v = parse_ok("a = [ 1, 'two', [3.0, [true]], {x = 1}, ]\n"
                                       "b = [\n  1, # one\n\n  2 # two\n,3\n]\n"
                                       "c = []\n"
                                       "d = { x = 1, y.z = [2], \"q\".w = {} }\n"
                                       "e = {}\n");
    const struct fk_toml_value *a = fk_toml_table_get(v, "a");
    ck_assert_uint_eq(fk_toml_array_len(a), 4);
    ck_assert_int_eq(fk_toml_type(fk_toml_array_at(a, 0)), FK_TOML_INT);
    ck_assert_int_eq(fk_toml_type(fk_toml_array_at(a, 1)), FK_TOML_STRING);
    ck_assert_int_eq(fk_toml_type(fk_toml_array_at(a, 2)), FK_TOML_ARRAY);
    ck_assert_int_eq(fk_toml_type(fk_toml_array_at(a, 3)), FK_TOML_TABLE);
    ck_assert_ptr_null(fk_toml_array_at(a, 4));
    ck_assert_int_eq(fk_toml_col(fk_toml_array_at(a, 1)), 10);
    const struct fk_toml_value *b = fk_toml_table_get(v, "b");
    ck_assert_uint_eq(fk_toml_array_len(b), 3);
    ck_assert_int_eq(fk_toml_line(fk_toml_array_at(b, 1)), 5);
    ck_assert_int_eq(fk_toml_col(fk_toml_array_at(b, 1)), 3);
    ck_assert_int_eq(fk_toml_line(fk_toml_array_at(b, 2)), 6);
    ck_assert_uint_eq(fk_toml_array_len(fk_toml_table_get(v, "c")), 0);
    ck_assert_int_eq(fk_toml_type(fk_toml_table_get(v, "c")), FK_TOML_ARRAY);
    ck_assert_ptr_nonnull(fk_toml_table_find(v, "d.y.z"));
    ck_assert_ptr_nonnull(fk_toml_table_find(v, "d . q . w"));
    ck_assert_ptr_nonnull(fk_toml_table_find(v, "d.\"q\".'w'"));
    ck_assert_ptr_null(fk_toml_table_find(v, "d.q.w.nope"));
    ck_assert_ptr_null(fk_toml_table_find(v, "d..q"));
    ck_assert_ptr_null(fk_toml_table_find(v, "a.x"));
    ck_assert_uint_eq(fk_toml_table_len(fk_toml_table_get(v, "e")), 0);
    ck_canon(v, "{a = [1, \"two\", [3.0, [true]], {x = 1}], b = [1, 2, 3], c = [], "
                "d = {x = 1, y = {z = [2]}, q = {w = {}}}, e = {}}");
    fk_toml_free(&v);
    parse_bad("a = [1 2]", "t.toml:1:8: unexpected '2' in array opened at 1:5",
              "expected ',' or ']'");
    parse_bad("a = [1,,2]", "t.toml:1:8: unexpected ','", "expected a value");
    parse_bad("a = [1,\n2,\n", "t.toml:3:1: unterminated array opened at 1:5", "']'");
    parse_bad("a = {x = 1,}", "t.toml:1:12: trailing comma in inline table", "key = value");
    parse_bad("a = {x = 1\n}", "t.toml:1:11: unexpected end of line in inline table opened "
              "at 1:5", "same line");
    parse_bad("a = {x = 1, x = 2}", "t.toml:1:13: duplicate key 'x' (first defined at 1:6 "
              "as an integer)", "x");
    parse_bad("a = {x = {y = 1}, x.z = 2}", "t.toml:1:19: cannot add keys to inline table "
              "'x' defined at 1:10", "complete once closed");
    parse_bad("a = {x.y = 1, x.y.z = 2}", "t.toml:1:17: key 'x.y' is already an integer "
              "defined at 1:12", "expected a table");
}
END_TEST

START_TEST(test_tables_order_and_aot)
{
    const char *doc = "z = 1\n"
                      "a.b = 2\n"
                      "m = 3\n"
                      "[table]\n"
                      "k2 = 1\n"
                      "k1 = 2\n"
                      "[table.sub]\n"
                      "[x.y.z]\n"
                      "[x]\n"
                      "w = 0\n"
                      "y.extra = 5\n"
                      "[[fruit]]\n"
                      "name = \"apple\"\n"
                      "[fruit.physical]\n"
                      "color = \"red\"\n"
                      "[[fruit.variety]]\n"
                      "name = \"red delicious\"\n"
                      "[[fruit]]\n"
                      "name = \"banana\"\n"
                      "[fruit.physical]\n"
                      "color = \"yellow\"\n";
    struct fk_toml_value *v = parse_ok(doc);
    const char *order[] = {"z", "a", "m", "table", "x", "fruit"};
    ck_assert_uint_eq(fk_toml_table_len(v), 6);
    for (size_t i = 0; i < 6; i++)
        ck_assert_str_eq(fk_toml_table_at(v, i)->key, order[i]);
    const struct fk_toml_value *t = fk_toml_table_get(v, "table");
    ck_assert_str_eq(fk_toml_table_at(t, 0)->key, "k2");
    ck_assert_str_eq(fk_toml_table_at(t, 1)->key, "k1");
    ck_assert_str_eq(fk_toml_table_at(t, 2)->key, "sub");
    ck_assert_int_eq(fk_toml_line(t), 4); /* position of the header's key */
    ck_assert_int_eq(fk_toml_col(t), 2);
    const struct fk_toml_value *x = fk_toml_table_get(v, "x");
    ck_assert_int_eq(fk_toml_line(x), 9); /* implicit at 8, defined by [x] at 9 */
    ck_assert_str_eq(fk_toml_table_at(x, 0)->key, "y");
    ck_assert_str_eq(fk_toml_table_at(x, 1)->key, "w");
    ck_assert_ptr_nonnull(fk_toml_table_find(v, "x.y.extra"));
    const struct fk_toml_value *fruit = fk_toml_table_get(v, "fruit");
    ck_assert_uint_eq(fk_toml_array_len(fruit), 2);
    const char *s;
    ck_assert_int_eq(fk_toml_get_string(fk_toml_table_find(fk_toml_array_at(fruit, 1),
                                                           "physical.color"), &s, NULL),
                     FK_OK);
    ck_assert_str_eq(s, "yellow");
    ck_canon(v, "{z = 1, a = {b = 2}, m = 3, table = {k2 = 1, k1 = 2, sub = {}}, "
                "x = {y = {z = {}, extra = 5}, w = 0}, fruit = [{name = \"apple\", "
                "physical = {color = \"red\"}, variety = [{name = \"red delicious\"}]}, "
                "{name = \"banana\", physical = {color = \"yellow\"}}]}");
    fk_toml_free(&v);
}
END_TEST

/* The redefinition rules, each with its exact position. */
START_TEST(test_redefinitions)
{
    parse_bad("a = 1\na = 2", "t.toml:2:1: duplicate key 'a' (first defined at 1:1 as an "
              "integer)", "a");
    parse_bad("[a]\nb = 1\n[a]\n", "t.toml:3:2: table [a] is already defined at 1:2",
              "defined once");
    parse_bad("[a.b]\n[a]\n[a.b]", "t.toml:3:4: table [a.b] is already defined at 1:4",
              "defined once");
    parse_bad("a = {b = 1}\n[a]\n", "t.toml:2:2: cannot extend inline table 'a' defined at "
              "1:5", "complete once closed");
    parse_bad("a = {b = 1}\n[a.c]\n", "t.toml:2:2: cannot extend inline table 'a'", "closed");
    parse_bad("a = {b = 1}\na.c = 2\n", "t.toml:2:1: cannot add keys to inline table 'a'",
              "closed");
    parse_bad("a = [1]\n[[a]]\n", "t.toml:2:3: key 'a' is a static array defined at 1:5",
              "[[...]]");
    parse_bad("a = [{}]\n[a.b]\n", "t.toml:2:2: key 'a' is a static array", "a table");
    parse_bad("[a.b.c]\nz = 9\n[a]\nb.c.t = 1\n", "t.toml:4:3: cannot extend table "
              "[b.c] defined at 1:6 with dotted keys", "own header");
    parse_bad("[fruit]\napple.color = 'red'\n[fruit.apple]\n", "t.toml:3:8: table "
              "[fruit.apple] is already defined at 2:1 by dotted keys", "defined once");
    parse_bad("[[a]]\n[a]\n", "t.toml:2:2: table [a] conflicts with the array of tables "
              "[[a]] defined at 1:3", "expected [[a]]");
    parse_bad("[a]\n[[a]]\n", "t.toml:2:3: [[a]] conflicts with table 'a' defined at 1:2",
              "array of tables");
    parse_bad("a = 1\n[a.b]\n", "t.toml:2:2: key 'a' is already an integer defined at 1:5",
              "a table");
    parse_bad("a = 1\na.b = 2\n", "t.toml:2:1: key 'a' is already an integer defined at 1:5",
              "dotted keys");
    parse_bad("[a]\nb = 1\n[a.b]\n", "t.toml:3:4: key 'a.b' is already an integer", "table");
    /* and the allowed cases next to them */
    struct fk_toml_value *v = parse_ok("[fruit]\napple.color = 'red'\n[fruit.apple.texture]\n"
                                       "smooth = true\n[x.y]\n[x]\n[[aot]]\n[aot.sub]\n"
                                       "[[aot]]\n[aot.sub]\n");
    ck_assert_ptr_nonnull(fk_toml_table_find(v, "fruit.apple.texture.smooth"));
    fk_toml_free(&v);
}
END_TEST

START_TEST(test_syntax_errors)
{
    parse_bad("a = ", "t.toml:1:5: missing value after '='", "same line");
    parse_bad("a =\n1", "t.toml:1:4: missing value", "same line");
    parse_bad("a 1", "t.toml:1:3: unexpected '1' after key 'a' (expected '=')", "=");
    parse_bad("= 1", "t.toml:1:1: unexpected '='", "expected a key");
    parse_bad("a = 1 b = 2", "t.toml:1:7: unexpected 'b' after value", "newline");
    parse_bad("[a] x = 1", "t.toml:1:5: unexpected 'x' after table header", "newline");
    parse_bad("[a", "t.toml:1:3: unexpected end of file in table header", "']'");
    parse_bad("[[a]", "t.toml:1:4: unexpected ']' in array-of-tables header", "']]'");
    parse_bad("[[a] ]", "t.toml:1:4: unexpected ']' in array-of-tables header", "']]'");
    parse_bad("a = 1\r\nb = 2\r", "t.toml:2:6: bare carriage return", "CRLF");
    parse_bad("# ok\n# bad \x01 char\n", "t.toml:2:7: control character U+0001 in comment",
              "printable");
    parse_bad("a = \"\xff\"", "t.toml:1:6: invalid UTF-8 byte 0xFF", "UTF-8");
    parse_bad("a = \"\xc3\"", "t.toml:1:6: invalid UTF-8 sequence", "UTF-8");
    parse_bad("a = \"\xed\xa0\x80\"", "t.toml:1:6: invalid UTF-8 sequence", "0xED");
    parse_bad("a = \"\xe0\x80\xaf\"", "t.toml:1:6: invalid UTF-8 sequence", "0xE0");
    parse_bad("a = truth", "t.toml:1:5: invalid value starting with 't'", "true, false");
    parse_bad("a = True", "t.toml:1:5: unexpected 'T'", "expected a value");
    parse_bad("\xef\xbb\xbf\xef\xbb\xbf" "a = 1", "t.toml:1:1: unexpected U+FEFF",
              "expected a key");
    /* a leading BOM is skipped and does not count as a column */
    struct fk_toml_value *v = parse_ok("\xef\xbb\xbf" "a = 1");
    ck_assert_int_eq(fk_toml_col(fk_toml_table_get(v, "a")), 5);
    fk_toml_free(&v);
    /* NUL inside the buffer (length-delimited input) is a control character */
    struct fk_toml_value *w = NULL;
    ck_assert_int_eq(fk_toml_parse("a = 1\n\0", 7, "t.toml", &w), FK_ECONFIG);
    ck_assert_str_eq(fk_errmsg(), "t.toml:2:1: unexpected U+0000 (expected a key: letters, "
                                  "digits, '-', '_' or a quoted string)");
    ck_assert_ptr_null(w);
    /* empty documents are fine */
    v = parse_ok("");
    ck_assert_uint_eq(fk_toml_table_len(v), 0);
    fk_toml_free(&v);
    ck_assert_int_eq(fk_toml_parse(NULL, 0, "t.toml", &v), FK_OK);
    fk_toml_free(&v);
    ck_assert_int_eq(fk_toml_parse("a=1", 3, "t.toml", NULL), FK_EINVAL);
}
END_TEST

START_TEST(test_depth_limit)
{
    /* arrays: FK_TOML_MAX_DEPTH levels pass, one more fails at the offending bracket */
    size_t cap = 4 * FK_TOML_MAX_DEPTH + 64;
    char *doc = xrealloc(NULL, cap);
    for (int depth = FK_TOML_MAX_DEPTH; depth <= FK_TOML_MAX_DEPTH + 1; depth++) {
        size_t k = 0;
        k = bput(doc, cap, k, "a = ");
        for (int i = 0; i < depth; i++)
            doc[k++] = '[';
        for (int i = 0; i < depth; i++)
            doc[k++] = ']';
        doc[k] = '\0';
        struct fk_toml_value *v = NULL;
        int rc = fk_toml_parse(doc, k, "t.toml", &v);
        if (depth == FK_TOML_MAX_DEPTH) {
            ck_assert_int_eq(rc, FK_OK);
            fk_toml_free(&v);
        } else {
            char want[64];
            snprintf(want, sizeof want, "t.toml:1:%d: nesting deeper than %d levels",
                     4 + depth, FK_TOML_MAX_DEPTH);
            ck_assert_int_eq(rc, FK_ECONFIG);
            ck_assert_msg(strncmp(fk_errmsg(), want, strlen(want)) == 0, "%s", fk_errmsg());
        }
    }
    free(doc);
    /* inline tables and dotted keys count too; a very deep input fails cleanly */
    size_t big = 200000;
    cap = 3 * big + 16;
    doc = xrealloc(NULL, cap);
    size_t k = bput(doc, cap, 0, "a = ");
    for (size_t i = 0; i < big; i++)
        k = bput(doc, cap, k, "{b=");
    struct fk_toml_value *v = NULL;
    ck_assert_int_eq(fk_toml_parse(doc, k, "t.toml", &v), FK_ECONFIG);
    ck_assert(strstr(fk_errmsg(), "nesting deeper than") != NULL);
    k = 0;
    for (size_t i = 0; i < 300; i++)
        k = bput(doc, cap, k, "k.");
    k = bput(doc, cap, k, "k = 1");
    ck_assert_int_eq(fk_toml_parse(doc, k, "t.toml", &v), FK_ECONFIG);
    ck_assert(strstr(fk_errmsg(), "dotted parts") != NULL);
    free(doc);
}
END_TEST

START_TEST(test_parse_value_and_set_path)
{
    struct fk_toml_value *v = NULL;
    int64_t i;
    ck_assert_int_eq(fk_toml_parse_value("8", "--set", &v), FK_OK);
    ck_assert_int_eq(fk_toml_get_int(v, &i), FK_OK);
    ck_assert_int_eq(i, 8);
    fk_toml_free(&v);
    ck_assert_int_eq(fk_toml_parse_value(" [4, 8] ", "--set", &v), FK_OK);
    ck_assert_uint_eq(fk_toml_array_len(v), 2);
    ck_assert_int_eq(fk_toml_col(fk_toml_array_at(v, 1)), 6);
    fk_toml_free(&v);
    ck_assert_int_eq(fk_toml_parse_value("\"fp8\"", "--set", &v), FK_OK);
    ck_assert_int_eq(fk_toml_type(v), FK_TOML_STRING);
    fk_toml_free(&v);
    ck_assert_int_eq(fk_toml_parse_value("{a = 1, b.c = 'x'}", "--set", &v), FK_OK);
    ck_canon(v, "{a = 1, b = {c = \"x\"}}");
    fk_toml_free(&v);
    ck_assert_int_eq(fk_toml_parse_value("8 9", "--set", &v), FK_ECONFIG);
    ck_assert_str_eq(fk_errmsg(), "--set:1:3: unexpected '9' after the value (expected the "
                                  "end)");
    ck_assert_ptr_null(v);
    ck_assert_int_eq(fk_toml_parse_value("  ", "--set", &v), FK_ECONFIG);
    ck_assert_str_eq(fk_errmsg(), "--set:1:3: empty value (expected a TOML value)");
    ck_assert_int_eq(fk_toml_parse_value("fp8", "--set", &v), FK_ECONFIG);
    ck_assert(strncmp(fk_errmsg(), "--set:1:1: invalid value starting with 'f'", 42) == 0);
    ck_assert_int_eq(fk_toml_parse_value("[1,", "--set", &v), FK_ECONFIG);

    struct fk_toml_value *root = parse_ok("[codec.lexico]\nsparsity = 4\n[run]\nseed = 1\n");
    ck_assert_int_eq(fk_toml_parse_value("[8, 16]", "--set", &v), FK_OK);
    ck_assert_int_eq(fk_toml_set_path(root, "codec.lexico.sparsity", "--set", &v), FK_OK);
    ck_assert_ptr_null(v);
    const struct fk_toml_value *sp = fk_toml_table_find(root, "codec.lexico.sparsity");
    ck_assert_int_eq(fk_toml_type(sp), FK_TOML_ARRAY);
    ck_assert_str_eq(fk_toml_origin(sp), "--set");
    /* the key keeps its place (and position) in the file */
    const struct fk_toml_entry *e = fk_toml_table_at(fk_toml_table_find(root, "codec.lexico"),
                                                     0);
    ck_assert_str_eq(e->key, "sparsity");
    ck_assert_int_eq(e->line, 2);
    ck_assert_str_eq(e->origin, "t.toml");
    /* new intermediate tables are appended in order */
    ck_assert_int_eq(fk_toml_parse_value("true", "--set", &v), FK_OK);
    ck_assert_int_eq(fk_toml_set_path(root, "new.\"a.b\".flag", "--set", &v), FK_OK);
    ck_canon(root, "{codec = {lexico = {sparsity = [8, 16]}}, run = {seed = 1}, "
                   "new = {\"a.b\" = {flag = true}}}");
    e = fk_toml_table_at(root, 2);
    ck_assert_str_eq(e->origin, "--set");
    ck_assert_int_eq(e->col, 1);
    /* crossing a non-table fails with both origins; ownership still taken */
    ck_assert_int_eq(fk_toml_parse_value("1", "--set", &v), FK_OK);
    ck_assert_int_eq(fk_toml_set_path(root, "run.seed.x", "--set", &v), FK_ECONFIG);
    ck_assert_ptr_null(v);
    ck_assert_str_eq(fk_errmsg(), "--set:1:5: key 'seed' in 'run.seed.x' is an integer at "
                                  "t.toml:4:8 (expected a table)");
    ck_assert_int_eq(fk_toml_parse_value("1", "--set", &v), FK_OK);
    ck_assert_int_eq(fk_toml_set_path(root, "run..x", "--set", &v), FK_ECONFIG);
    ck_assert_ptr_null(v);
    ck_assert(strncmp(fk_errmsg(), "--set:1:5: unexpected '.'", 25) == 0);
    ck_assert_int_eq(fk_toml_parse_value("1", "--set", &v), FK_OK);
    ck_assert_int_eq(fk_toml_set_path(root, "run = 2", "--set", &v), FK_ECONFIG);
    ck_assert_str_eq(fk_errmsg(), "--set:1:5: unexpected '=' in key path 'run = 2' (expected "
                                  "a dotted key such as a.b.c)");
    /* replacing a whole table */
    ck_assert_int_eq(fk_toml_parse_value("{seed = 7}", "--set", &v), FK_OK);
    ck_assert_int_eq(fk_toml_set_path(root, "run", "--set", &v), FK_OK);
    ck_assert_ptr_nonnull(fk_toml_table_find(root, "run.seed"));
    ck_assert_int_eq(fk_toml_set_path(root, "x", "--set", &v), FK_EINVAL); /* *val NULL */
    fk_toml_free(&root);
}
END_TEST

START_TEST(test_canonical_text)
{
    struct fk_toml_value *v = parse_ok("f = 0.1\ng = 1e300\nh = -0.0\ni = 2.0\nj = [inf, -inf, "
                                       "nan]\nk = \"q\\\"\\\\\\n\\u0001\\u007f\xc3\xa9\"\n"
                                       "\"key with space\" = 1\n\"\" = 2\nd = 1979-05-27 "
                                       "07:32:00Z\nb = false\n");
    char *s = canon(v);
    ck_assert_str_eq(s, "{f = 0.10000000000000001, g = 1.0000000000000001e+300, h = -0.0, "
                        "i = 2.0, j = [inf, -inf, nan], "
                        "k = \"q\\\"\\\\\\n\\u0001\\u007F\xc3\xa9\", "
                        "\"key with space\" = 1, \"\" = 2, d = 1979-05-27 07:32:00Z, b = false}");
    /* it is a fixed point of parse_value -> to_string, and doubles survive exactly */
    struct fk_toml_value *back = NULL;
    ck_assert_int_eq(fk_toml_parse_value(s, "canon", &back), FK_OK);
    char *s2 = canon(back);
    ck_assert_str_eq(s, s2);
    double a, b;
    ck_assert_int_eq(fk_toml_get_float(fk_toml_table_get(v, "f"), &a), FK_OK);
    ck_assert_int_eq(fk_toml_get_float(fk_toml_table_get(back, "f"), &b), FK_OK);
    ck_assert(memcmp(&a, &b, sizeof a) == 0);
    free(s);
    free(s2);
    fk_toml_free(&back);
    /* clone: same text, independent storage */
    struct fk_toml_value *c = NULL, *one = NULL;
    ck_assert_int_eq(fk_toml_clone(v, &c), FK_OK);
    s = canon(v);
    s2 = canon(c);
    ck_assert_str_eq(s, s2);
    free(s2);
    ck_assert_int_eq(fk_toml_parse_value("1", "--set", &one), FK_OK);
    ck_assert_int_eq(fk_toml_set_path(c, "f", "--set", &one), FK_OK);
    s2 = canon(v);
    ck_assert_str_eq(s, s2); /* original untouched */
    free(s);
    free(s2);
    ck_assert_int_eq(fk_toml_line(fk_toml_table_get(c, "g")), 2);
    fk_toml_free(&c);
    fk_toml_free(&v);
}
END_TEST

START_TEST(test_parse_file)
{
    char path[] = "/tmp/fk_toml_testXXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    const char *doc = "[sweep]\nseeds = [1, 2]\ns = \"x\"\n";
    ck_assert_int_eq(write(fd, doc, strlen(doc)), (int)strlen(doc));
    close(fd);
    struct fk_toml_value *v = NULL;
    ck_assert_int_eq(fk_toml_parse_file(path, &v), FK_OK);
    const struct fk_toml_value *s = fk_toml_table_find(v, "sweep.s");
    ck_assert_str_eq(fk_toml_origin(s), path);
    int64_t x;
    ck_assert_int_eq(fk_toml_get_int(s, &x), FK_ECONFIG);
    char want[128];
    snprintf(want, sizeof want, "%s:3:5: expected an integer, got a string", path);
    ck_assert_str_eq(fk_errmsg(), want);
    fk_toml_free(&v);
    FILE *f = fopen(path, "w");
    fputs("[sweep]\nseeds = [1, 2\n", f);
    fclose(f);
    ck_assert_int_eq(fk_toml_parse_file(path, &v), FK_ECONFIG);
    snprintf(want, sizeof want, "%s:3:1: unexpected end of file in array opened at 2:9", path);
    ck_assert_msg(strncmp(fk_errmsg(), want, strlen(want)) == 0, "%s", fk_errmsg());
    unlink(path);
    ck_assert_int_eq(fk_toml_parse_file(path, &v), FK_EIO);
    ck_assert_ptr_null(v);
}
END_TEST

START_TEST(test_big_table_index)
{
    /* 3000 keys exercise the hash index; lookups and duplicate detection against brute force */
    size_t n = 3000, k = 0, cap = n * 32 + 64;
    char *doc = xrealloc(NULL, cap);
    for (size_t i = 0; i < n; i++)
        k = bput(doc, cap, k, "key_%zu = %zu\n", (i * 7919) % n, i);
    struct fk_toml_value *v = parse_ok(doc);
    ck_assert_uint_eq(fk_toml_table_len(v), n);
    for (size_t i = 0; i < n; i++) {
        char key[32];
        sprintf(key, "key_%zu", (i * 7919) % n);
        int64_t x;
        ck_assert_str_eq(fk_toml_table_at(v, i)->key, key);
        ck_assert_int_eq(fk_toml_get_int(fk_toml_table_get(v, key), &x), FK_OK);
        ck_assert_int_eq(x, (int64_t)i);
    }
    ck_assert_ptr_null(fk_toml_table_get(v, "key_3000"));
    fk_toml_free(&v);
    k = bput(doc, cap, k, "key_1234 = 0\n");
    char want[80];
    snprintf(want, sizeof want, "t.toml:%zu:1: duplicate key 'key_1234'", n + 1);
    parse_bad(doc, want, "first defined");
    free(doc);
}
END_TEST

/* Deterministic mini-fuzz: truncations and byte mutations of a rich document must either
 * parse or fail with a well-formed ECONFIG message; ASan/UBSan catch memory errors. */
START_TEST(test_mutations)
{
    const char *seed = "\xef\xbb\xbf" "# c\na = [1, 2.5e3, 'x', \"\\u00e9\", {b = 0x1F}]\n"
                       "[t.\"q\"]\nd = 1979-05-27T07:32:00Z\ns = \"\"\"\nml\\\n  x\"\"\"\n"
                       "[[arr]]\nv = inf\nl = '''lit'''\ni = {x.y = [true, false]}\n";
    size_t n = strlen(seed);
    char *buf = xrealloc(NULL, n + 1);
    const char alphabet[] = "[]{}=.,\"'\\#\n\r\t 0x_e+-:Tz\x80\xc3" "abc123     ";
    uint64_t st = 88172645463325252ull;
    int ok = 0, bad = 0;
    for (size_t cut = 0; cut <= n; cut++) {
        struct fk_toml_value *v = NULL;
        memcpy(buf, seed, cut);
        int rc = fk_toml_parse(buf, cut, "m.toml", &v);
        ck_assert(rc == FK_OK || rc == FK_ECONFIG);
        if (cut == n)
            ck_assert_msg(rc == FK_OK, "seed rejected: %s", fk_errmsg());
        rc == FK_OK ? ok++ : bad++;
        fk_toml_free(&v);
    }
    for (int it = 0; it < 20000; it++) {
        memcpy(buf, seed, n);
        int muts = 1 + it % 3;
        for (int m = 0; m < muts; m++) {
            st ^= st << 13;
            st ^= st >> 7;
            st ^= st << 17;
            buf[st % n] = alphabet[(st >> 32) % (sizeof alphabet - 1)];
        }
        struct fk_toml_value *v = NULL;
        int rc = fk_toml_parse(buf, n, "m.toml", &v);
        ck_assert(rc == FK_OK || rc == FK_ECONFIG);
        if (rc == FK_OK) {
            char *s = canon(v); /* canonical text of any accepted input parses back */
            struct fk_toml_value *b = NULL;
            ck_assert_msg(fk_toml_parse_value(s, "c", &b) == FK_OK, "%s: %s", s, fk_errmsg());
            char *s2 = canon(b);
            ck_assert_str_eq(s, s2);
            free(s);
            free(s2);
            fk_toml_free(&b);
            ok++;
        } else {
            ck_assert(strncmp(fk_errmsg(), "m.toml:", 7) == 0);
            bad++;
        }
        fk_toml_free(&v);
    }
    printf("toml mutations: %d accepted, %d rejected\n", ok, bad);
    ck_assert_int_gt(ok, 0);
    ck_assert_int_gt(bad, 0);
    free(buf);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("toml");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_scalars_and_positions);
    tcase_add_test(tc, test_integers);
    tcase_add_test(tc, test_floats);
    tcase_add_test(tc, test_strings);
    tcase_add_test(tc, test_datetimes);
    tcase_add_test(tc, test_arrays_and_inline_tables);
    tcase_add_test(tc, test_tables_order_and_aot);
    tcase_add_test(tc, test_redefinitions);
    tcase_add_test(tc, test_syntax_errors);
    tcase_add_test(tc, test_depth_limit);
    tcase_add_test(tc, test_parse_value_and_set_path);
    tcase_add_test(tc, test_canonical_text);
    tcase_add_test(tc, test_parse_file);
    tcase_add_test(tc, test_big_table_index);
    tcase_add_test(tc, test_mutations);
    suite_add_tcase(s, tc);
    return fk_suite_run(s);
}
