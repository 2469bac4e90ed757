/* SPDX-License-Identifier: MIT
 * Tests of the trace format v1 reader and writer (datasets/formats/fk_trace.h) and of the 16-bit
 * conversions. Oracles are independent of the code under test: the 16-bit values come from
 * the IEEE formulas ((-1)^s 2^(e-bias) (1 + m/2^p)) and rounding from ldexp/nearbyint in
 * double precision; bad files are made by editing a good file with the HDF5 C API; the
 * interop file is written by h5py when the system interpreter has it.
 * Sizes are small: 2 layers, H_q = 4, H_kv = 2, d = 8, T = 20, prompt 12, 8 query rows.
 */
#include <check.h>
#include <dirent.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gsl/gsl_randist.h>
#include <gsl/gsl_rng.h>
#include <hdf5.h>

#include "fk_check_main.h"
#include "common/fk_err.h"
#include "formats/fk_trace.h"

#define MAXL 4

static char g_dir[64]; /* scratch directory of this test process */

static void dir_setup(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/fk_test_trace_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(g_dir));
}

static void dir_teardown(void)
{
    DIR *dp = opendir(g_dir);
    if (!dp)
        return;
    struct dirent *e;
    char p[512];
    while ((e = readdir(dp)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        snprintf(p, sizeof p, "%s/%s", g_dir, e->d_name);
        unlink(p);
    }
    closedir(dp);
    rmdir(g_dir);
}

static void pth(char *buf, size_t cap, const char *name)
{
    snprintf(buf, cap, "%s/%s", g_dir, name);
}

static int exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

/* Asserts that msg contains every string of the NULL-terminated list. */
static void msg_has(const char *msg, ...)
{
    va_list ap;
    va_start(ap, msg);
    const char *s;
    while ((s = va_arg(ap, const char *)) != NULL)
        ck_assert_msg(strstr(msg, s) != NULL, "message \"%s\" lacks \"%s\"", msg, s);
    va_end(ap);
}

/* Hot-loop check: Check's ck_assert records a mark point per call (slow over millions),
 * so loops count failures and keep the first message; want_clean() asserts once. */
static long g_bad;        /* failures since the last want_clean() */
static char g_first[256]; /* message of the first one */
#define CHECK(cond, ...)                                                                  \
    do {                                                                                  \
        if (!(cond) && !g_bad++)                                                          \
            snprintf(g_first, sizeof g_first, __VA_ARGS__);                               \
    } while (0)

static void want_clean(void)
{
    long bad = g_bad;
    g_bad = 0;
    ck_assert_msg(bad == 0, "%ld failures, first: %s", bad, g_first);
}

/* ---- independent 16-bit oracles ---------------------------------------------------- */

/* Value of a binary16 code from the IEEE formula. */
static double f16_formula(unsigned c)
{
    unsigned s = c >> 15, e = (c >> 10) & 31, m = c & 1023;
    double sign = s ? -1.0 : 1.0;
    if (e == 0)
        return sign * ldexp((double)m, -24); /* 2^-14 * m / 1024 */
    if (e == 31)
        return m ? NAN : sign * INFINITY;
    return sign * ldexp(1024.0 + m, (int)e - 25); /* 2^(e-15) (1 + m/1024) */
}

/* Value of a bfloat16 code (8 exponent bits, bias 127, 7 mantissa bits). */
static double bf16_formula(unsigned c)
{
    unsigned s = c >> 15, e = (c >> 7) & 255, m = c & 127;
    double sign = s ? -1.0 : 1.0;
    if (e == 0)
        return sign * ldexp((double)m, -133); /* 2^-126 * m / 128 */
    if (e == 255)
        return m ? NAN : sign * INFINITY;
    return sign * ldexp(128.0 + m, (int)e - 134);
}

/* Rounds x to nearest-even in a binary format with p significand bits (implicit bit
 * included), minimum normal exponent emin and maximum exponent emax; overflow gives inf. */
static double ref_round(double x, int p, int emin, int emax)
{
    if (isnan(x) || isinf(x) || x == 0)
        return x;
    int e;
    frexp(x, &e);
    int E = e - 1 < emin ? emin : e - 1;
    int q = E - (p - 1);
    double r = ldexp(nearbyint(ldexp(x, -q)), q);
    double maxv = ldexp(2.0 - ldexp(1.0, -(p - 1)), emax);
    if (fabs(r) > maxv)
        return copysign(INFINITY, x);
    return r == 0 ? copysign(0.0, x) : r;
}

static float ref_f16(float x) { return (float)ref_round(x, 11, -14, 15); }
static float ref_bf16(float x) { return (float)ref_round(x, 8, -126, 127); }

static float expect_enc(enum fk_encoding enc, float x)
{
    return enc == FK_ENC_F32 ? x : enc == FK_ENC_F16 ? ref_f16(x) : ref_bf16(x);
}

static int same_float(double want, float got)
{
    if (isnan(want))
        return isnan(got);
    return (double)got == want && !signbit(got) == !signbit(want);
}

/* ---- a small trace ----------------------------------------------------------------- */

struct spec {
    int L, hq, hkv, d, T, P, Tq; /* layers, heads, head_dim, tokens, prompt, query rows */
};

static const struct spec SMALL = {2, 4, 2, 8, 20, 12, 8};

struct tdata {
    struct spec s;        /* shape */
    float *k[MAXL];       /* [hkv][T][d] */
    float *v[MAXL];       /* [hkv][T][d] */
    float *q[MAXL];       /* [hq][Tq][d] or NULL */
    int32_t *qidx[MAXL];  /* [Tq] */
    int32_t *pos, *ids;   /* [T] */
    uint8_t *phase;       /* [T] */
};

static size_t nkv(const struct spec *s) { return (size_t)s->hkv * s->T * s->d; }
static size_t nq(const struct spec *s) { return (size_t)s->hq * s->Tq * s->d; }

/* Gaussian values with magnitudes from 2^-22 to 2^8 (f16 subnormals included). */
static void fill(gsl_rng *r, float *a, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int sh = (int)gsl_rng_uniform_int(r, 31) - 22;
        a[i] = (float)ldexp(gsl_ran_gaussian(r, 1.0), sh);
    }
}

static void gen(const struct spec *s, unsigned long seed, struct tdata *x)
{
    memset(x, 0, sizeof *x);
    x->s = *s;
    gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
    gsl_rng_set(r, seed);
    x->pos = malloc(sizeof(int32_t) * (size_t)s->T);
    x->ids = malloc(sizeof(int32_t) * (size_t)s->T);
    x->phase = malloc((size_t)s->T);
    ck_assert(x->pos && x->ids && x->phase);
    for (int t = 0; t < s->T; t++) {
        x->pos[t] = t + 3;
        x->ids[t] = 1000 + 7 * t;
        x->phase[t] = t >= s->P;
    }
    for (int l = 0; l < s->L; l++) {
        x->k[l] = malloc(sizeof(float) * nkv(s));
        x->v[l] = malloc(sizeof(float) * nkv(s));
        ck_assert(x->k[l] && x->v[l]);
        fill(r, x->k[l], nkv(s));
        fill(r, x->v[l], nkv(s));
        if (s->Tq > 0) {
            x->q[l] = malloc(sizeof(float) * nq(s));
            x->qidx[l] = malloc(sizeof(int32_t) * (size_t)s->Tq);
            ck_assert(x->q[l] && x->qidx[l]);
            fill(r, x->q[l], nq(s));
            for (int i = 0; i < s->Tq; i++)
                x->qidx[l][i] = s->T - s->Tq + i;
        }
    }
    gsl_rng_free(r);
}

static void drop(struct tdata *x)
{
    for (int l = 0; l < MAXL; l++) {
        free(x->k[l]);
        free(x->v[l]);
        free(x->q[l]);
        free(x->qidx[l]);
    }
    free(x->pos);
    free(x->ids);
    free(x->phase);
}

static void make_info(const struct spec *s, struct fk_trace_info *in)
{
    memset(in, 0, sizeof *in);
    snprintf(in->model_id, sizeof in->model_id, "test/model-x");
    snprintf(in->source, sizeof in->source, "synthetic");
    in->n_layers = s->L;
    in->n_q_heads = s->hq;
    in->n_kv_heads = s->hkv;
    in->head_dim = s->d;
    in->n_tokens = s->T;
    in->prompt_len = s->P;
    in->keys_post_rope = 1;
    in->rope_theta = 10000.5;
    in->has_queries = s->Tq > 0;
    in->n_queries = s->Tq;
}

static void write_trace(const char *path, enum fk_encoding enc, const struct tdata *x)
{
    struct fk_trace_info in;
    make_info(&x->s, &in);
    struct fk_trace_writer *w = NULL;
    ck_assert_msg(fk_trace_create(path, &in, enc, &w) == FK_OK, "%s", fk_errmsg());
    ck_assert_int_eq(fk_trace_write_tokens(w, x->pos, x->phase, x->ids), FK_OK);
    for (int l = 0; l < x->s.L; l++) {
        ck_assert_int_eq(fk_trace_write_layer(w, l, FK_KIND_K, x->k[l], NULL), FK_OK);
        ck_assert_int_eq(fk_trace_write_layer(w, l, FK_KIND_V, x->v[l], NULL), FK_OK);
        if (x->q[l])
            ck_assert_int_eq(fk_trace_write_layer(w, l, FK_KIND_Q, x->q[l], x->qidx[l]),
                             FK_OK);
    }
    ck_assert_msg(fk_trace_finish(&w) == FK_OK, "%s", fk_errmsg());
    ck_assert_ptr_null(w);
}

/* Writes the small float32 trace as `name` in the scratch directory. */
static void make_good(char *path, size_t cap, const char *name)
{
    pth(path, cap, name);
    struct tdata x;
    gen(&SMALL, 7, &x);
    write_trace(path, FK_ENC_F32, &x);
    drop(&x);
}

static void expect_open_fail(const char *path, int code, ...)
{
    struct fk_trace *t = NULL;
    int rc = fk_trace_open(path, &t);
    ck_assert_msg(rc == code, "%s: rc %d, expected %d (message: %s)", path, rc, code,
                  fk_errmsg());
    ck_assert_ptr_null(t);
    const char *msg = fk_errmsg();
    ck_assert_msg(strstr(msg, path) != NULL, "message \"%s\" does not name the file", msg);
    va_list ap;
    va_start(ap, code);
    const char *s;
    while ((s = va_arg(ap, const char *)) != NULL)
        ck_assert_msg(strstr(msg, s) != NULL, "message \"%s\" lacks \"%s\"", msg, s);
    va_end(ap);
}

/* ---- HDF5 editing helpers (bad files) ---------------------------------------------- */

static hid_t h5_rw(const char *path)
{
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    ck_assert_msg(f >= 0, "cannot reopen %s", path);
    return f;
}

static void edit_del_attr(const char *path, const char *obj, const char *name)
{
    hid_t f = h5_rw(path), o = H5Oopen(f, obj, H5P_DEFAULT);
    ck_assert(o >= 0 && H5Adelete(o, name) >= 0);
    H5Oclose(o);
    H5Fclose(f);
}

static void edit_attr_int(const char *path, const char *obj, const char *name, long long v)
{
    hid_t f = h5_rw(path), o = H5Oopen(f, obj, H5P_DEFAULT);
    ck_assert(o >= 0);
    if (H5Aexists(o, name) > 0)
        H5Adelete(o, name);
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(o, name, H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT);
    ck_assert(a >= 0 && H5Awrite(a, H5T_NATIVE_LLONG, &v) >= 0);
    H5Aclose(a);
    H5Sclose(sp);
    H5Oclose(o);
    H5Fclose(f);
}

/* A fixed-length string attribute (the writer uses variable length: both must read). */
static void edit_attr_str(const char *path, const char *obj, const char *name, const char *v)
{
    hid_t f = h5_rw(path), o = H5Oopen(f, obj, H5P_DEFAULT);
    ck_assert(o >= 0);
    if (H5Aexists(o, name) > 0)
        H5Adelete(o, name);
    hid_t ty = H5Tcopy(H5T_C_S1);
    H5Tset_size(ty, strlen(v) + 1);
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(o, name, ty, sp, H5P_DEFAULT, H5P_DEFAULT);
    ck_assert(a >= 0 && H5Awrite(a, ty, v) >= 0);
    H5Aclose(a);
    H5Sclose(sp);
    H5Tclose(ty);
    H5Oclose(o);
    H5Fclose(f);
}

static void edit_del_link(const char *path, const char *name)
{
    hid_t f = h5_rw(path);
    ck_assert_msg(H5Ldelete(f, name, H5P_DEFAULT) >= 0, "cannot delete %s", name);
    H5Fclose(f);
}

/* Replaces (or creates) dataset `name` with `data` of native type `ty` and shape dims. */
static void edit_put_ds(const char *path, const char *name, hid_t ty, int rank,
                        const hsize_t *dims, const void *data)
{
    hid_t f = h5_rw(path);
    if (H5Lexists(f, name, H5P_DEFAULT) > 0)
        H5Ldelete(f, name, H5P_DEFAULT);
    hid_t sp = H5Screate_simple(rank, dims, NULL);
    hid_t ds = H5Dcreate2(f, name, ty, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    ck_assert(ds >= 0);
    hssize_t n = H5Sget_simple_extent_npoints(sp);
    if (n > 0)
        ck_assert(H5Dwrite(ds, ty, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0);
    H5Dclose(ds);
    H5Sclose(sp);
    H5Fclose(f);
}

/* ---- 1. round trip ------------------------------------------------------------------ */

START_TEST(test_round_trip)
{
    enum fk_encoding enc = (enum fk_encoding)_i;
    static const char *const names[] = {"float32", "float16", "bfloat16"};
    char path[512], tmp[600], nm[32];
    snprintf(nm, sizeof nm, "rt%d.h5", _i);
    pth(path, sizeof path, nm);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    struct tdata x;
    gen(&SMALL, 11 + (unsigned long)_i, &x);
    /* exact f16 ties in the data: 1 + 2^-11 -> 1, 1 + 3 * 2^-11 -> 1 + 2^-9 */
    x.k[0][0] = 1.0f + 0x1p-11f;
    x.k[0][1] = 1.0f + 0x3p-11f;
    x.k[0][2] = 1.0f + 0x1p-8f; /* bf16 tie: -> 1 */
    x.k[0][3] = 1.0f + 0x3p-8f; /* bf16 tie: -> 1 + 2^-6 */

    struct fk_trace_info in;
    make_info(&x.s, &in);
    struct fk_trace_writer *w = NULL;
    ck_assert_msg(fk_trace_create(path, &in, enc, &w) == FK_OK, "%s", fk_errmsg());
    ck_assert_msg(exists(tmp) && !exists(path), "the writer must write %s first", tmp);
    ck_assert_int_eq(fk_trace_write_tokens(w, x.pos, x.phase, x.ids), FK_OK);
    for (int l = 0; l < x.s.L; l++) {
        ck_assert_int_eq(fk_trace_write_layer(w, l, FK_KIND_K, x.k[l], NULL), FK_OK);
        ck_assert_int_eq(fk_trace_write_layer(w, l, FK_KIND_V, x.v[l], NULL), FK_OK);
        ck_assert_int_eq(fk_trace_write_layer(w, l, FK_KIND_Q, x.q[l], x.qidx[l]), FK_OK);
    }
    ck_assert_int_eq(fk_trace_finish(&w), FK_OK);
    ck_assert_msg(exists(path) && !exists(tmp), "%s left behind", tmp);

    struct fk_trace *t = NULL;
    ck_assert_msg(fk_trace_open(path, &t) == FK_OK, "%s", fk_errmsg());
    const struct fk_trace_info *o = fk_trace_get_info(t);
    ck_assert_str_eq(o->model_id, "test/model-x");
    ck_assert_str_eq(o->source, "synthetic");
    ck_assert_int_eq(o->n_layers, 2);
    ck_assert_int_eq(o->n_q_heads, 4);
    ck_assert_int_eq(o->n_kv_heads, 2);
    ck_assert_int_eq(o->head_dim, 8);
    ck_assert_int_eq(o->n_tokens, 20);
    ck_assert_int_eq(o->prompt_len, 12);
    ck_assert_int_eq(o->keys_post_rope, 1);
    ck_assert(o->rope_theta == 10000.5);
    ck_assert_int_eq(o->has_queries, 1);
    ck_assert_int_eq(o->n_queries, 8);
    ck_assert_str_eq(fk_trace_path(t), path);
    ck_assert_int_eq(memcmp(fk_trace_positions(t), x.pos, sizeof(int32_t) * 20), 0);
    ck_assert_int_eq(memcmp(fk_trace_phase(t), x.phase, 20), 0);
    ck_assert_ptr_nonnull(fk_trace_ids(t));
    ck_assert_int_eq(memcmp(fk_trace_ids(t), x.ids, sizeof(int32_t) * 20), 0);

    float *buf = malloc(sizeof(float) * nkv(&x.s)); /* exact size: ASan sees overruns */
    float *qbuf = malloc(sizeof(float) * nq(&x.s));
    int32_t qi[8];
    ck_assert(buf && qbuf);
    long n16 = 0;
    for (int l = 0; l < 2; l++) {
        for (int kind = 0; kind < 3; kind++) {
            const float *src = kind == 0 ? x.k[l] : kind == 1 ? x.v[l] : x.q[l];
            float *dst = kind == 2 ? qbuf : buf;
            size_t n = kind == 2 ? nq(&x.s) : nkv(&x.s);
            ck_assert_msg(fk_trace_read(t, l, (enum fk_kind)kind, dst) == FK_OK, "%s",
                          fk_errmsg());
            for (size_t i = 0; i < n; i++) {
                float want = expect_enc(enc, src[i]);
                ck_assert_msg(same_float(want, dst[i]),
                              "%s layer %d kind %d [%zu]: wrote %a, read %a, expected %a",
                              names[enc], l, kind, i, (double)src[i], (double)dst[i],
                              (double)want);
                n16 += dst[i] != src[i];
            }
        }
        ck_assert_int_eq(fk_trace_read_query_idx(t, l, qi), FK_OK);
        ck_assert_int_eq(memcmp(qi, x.qidx[l], sizeof qi), 0);
        /* a row subset (runs and gaps) equals those rows of the full read, head by head */
        ck_assert_int_eq(fk_trace_read(t, l, FK_KIND_Q, qbuf), FK_OK);
        static const int32_t sel[] = {0, 2, 3, 4, 7};
        const int ns = 5, H = x.s.hq, d = x.s.d, Tq = x.s.Tq;
        float *sub = malloc(sizeof(float) * (size_t)H * ns * d);
        ck_assert_ptr_nonnull(sub);
        ck_assert_msg(fk_trace_read_query_rows(t, l, sel, ns, sub) == FK_OK, "%s", fk_errmsg());
        for (int h = 0; h < H; h++)
            for (int i = 0; i < ns; i++)
                ck_assert_msg(memcmp(sub + ((size_t)h * ns + i) * d,
                                     qbuf + ((size_t)h * Tq + sel[i]) * d,
                                     sizeof(float) * (size_t)d) == 0,
                              "%s layer %d: query row %d of head %d differs in the subset read",
                              names[enc], l, sel[i], h);
        static const int32_t unsorted[] = {3, 2}, dup[] = {1, 1}, out_of_range[] = {0, 8};
        ck_assert_int_eq(fk_trace_read_query_rows(t, l, unsorted, 2, sub), FK_EINVAL);
        ck_assert_int_eq(fk_trace_read_query_rows(t, l, dup, 2, sub), FK_EINVAL);
        ck_assert_int_eq(fk_trace_read_query_rows(t, l, out_of_range, 2, sub), FK_EINVAL);
        ck_assert_int_eq(fk_trace_read_query_rows(t, l, sel, 0, sub), FK_OK);
        free(sub);
    }
    /* the ties above went to even */
    ck_assert_int_eq(fk_trace_read(t, 0, FK_KIND_K, buf), FK_OK);
    if (enc == FK_ENC_F16) {
        ck_assert(buf[0] == 1.0f && buf[1] == 1.0f + 0x1p-9f);
        ck_assert(n16 > 1000); /* rounding happened: the comparison was not vacuous */
    } else if (enc == FK_ENC_BF16) {
        ck_assert(buf[2] == 1.0f && buf[3] == 1.0f + 0x1p-6f);
        ck_assert(n16 > 1000);
    } else {
        ck_assert_int_eq(n16, 0);
    }
    free(buf);
    free(qbuf);
    fk_trace_close(&t);
    ck_assert_ptr_null(t);

    /* abort leaves nothing: neither the temp file nor the final name */
    char p2[512], tmp2[600];
    pth(p2, sizeof p2, "aborted.h5");
    snprintf(tmp2, sizeof tmp2, "%s.tmp", p2);
    ck_assert_int_eq(fk_trace_create(p2, &in, enc, &w), FK_OK);
    ck_assert_int_eq(fk_trace_write_tokens(w, x.pos, x.phase, x.ids), FK_OK);
    ck_assert_int_eq(fk_trace_write_layer(w, 0, FK_KIND_K, x.k[0], NULL), FK_OK);
    fk_trace_abort(&w);
    ck_assert_ptr_null(w);
    ck_assert(!exists(p2) && !exists(tmp2));
    drop(&x);
}
END_TEST

/* A buffer of exactly n values (plus a guard) must not be overrun for odd n. */
START_TEST(test_read_odd_count)
{
    enum fk_encoding enc = (enum fk_encoding)_i;
    static const struct spec odd = {1, 1, 1, 3, 5, 3, 0};
    char path[512];
    pth(path, sizeof path, "odd.h5");
    struct tdata x;
    gen(&odd, 5, &x);
    write_trace(path, enc, &x);
    struct fk_trace *t = NULL;
    ck_assert_msg(fk_trace_open(path, &t) == FK_OK, "%s", fk_errmsg());
    ck_assert_int_eq(fk_trace_get_info(t)->has_queries, 0);
    size_t n = nkv(&odd); /* 15 */
    float *buf = malloc(sizeof(float) * (n + 1));
    ck_assert_ptr_nonnull(buf);
    buf[n] = 12345.0f;
    ck_assert_msg(fk_trace_read(t, 0, FK_KIND_K, buf) == FK_OK, "%s", fk_errmsg());
    for (size_t i = 0; i < n; i++)
        CHECK(same_float(expect_enc(enc, x.k[0][i]), buf[i]), "value %zu", i);
    float guard = buf[n];
    /* free before asserting, so a failure here leaks nothing under LeakSanitizer */
    free(buf);
    fk_trace_close(&t);
    drop(&x);
    want_clean();
    ck_assert_msg(guard == 12345.0f, "fk_trace_read wrote past the %zu values of dst "
                  "(the guard after them became %a)", n, (double)guard);
}
END_TEST

/* ---- 2. 16-bit conversions ---------------------------------------------------------- */

START_TEST(test_f16_to_f32_exhaustive)
{
    uint16_t *c = malloc(sizeof(uint16_t) * 65536);
    float *f = malloc(sizeof(float) * 65536);
    ck_assert(c && f);
    for (unsigned i = 0; i < 65536; i++)
        c[i] = (uint16_t)i;
    for (int accel = 1; accel >= 0; accel--) { /* F16C (where the CPU has it), then portable */
        fk_f16_accel(accel);
        fk_f16_to_f32(c, f, 65536);
        for (unsigned i = 0; i < 65536; i++) {
            double want = f16_formula(i);
            CHECK(same_float(want, f[i]), "f16 %04x -> %a, expected %a", i, (double)f[i], want);
            CHECK(!isnan(want) || !signbit(f[i]) == !(i & 0x8000), "f16 %04x: nan sign", i);
            uint32_t b;
            memcpy(&b, &f[i], 4);
            /* the payload is kept; F16C sets the quiet bit of a signalling NaN */
            uint32_t pay = (i & 1023u) << 13, got = b & 0x7fffff;
            CHECK(!isnan(want) || got == pay || (!accel ? 0 : got == (pay | 0x400000)),
                  "f16 %04x: nan payload", i);
        }
        /* an odd count and offset: the block loop's tail */
        float g[37];
        fk_f16_to_f32(c + 0x7bf0, g, 37); /* ... largest finite, inf, NaNs */
        for (unsigned i = 0; i < 37; i++)
            CHECK(!memcmp(&g[i], &f[0x7bf0 + i], 4), "f16 %04x: tail differs", 0x7bf0 + i);
    }
    fk_f16_accel(1);
    fk_bf16_to_f32(c, f, 65536);
    for (unsigned i = 0; i < 65536; i++) {
        double want = bf16_formula(i);
        CHECK(same_float(want, f[i]), "bf16 %04x -> %a, expected %a", i, (double)f[i], want);
    }
    want_clean();
    free(c);
    free(f);
}
END_TEST

static uint16_t to16(int bf, float x)
{
    uint16_t h;
    if (bf)
        fk_f32_to_bf16(&x, &h, 1);
    else
        fk_f32_to_f16(&x, &h, 1);
    return h;
}

/* Every midpoint between consecutive finite values (ties to the even code), one float ulp
 * above and below, the values themselves, and both signs. */
static void midpoints(int bf)
{
    unsigned last = bf ? 0x7f7f : 0x7bff;
    double (*val)(unsigned) = bf ? bf16_formula : f16_formula;
    const char *nm = bf ? "bf16" : "f16";
    for (unsigned c = 0; c <= last; c++) {
        float a = (float)val(c);
        CHECK(to16(bf, a) == c && to16(bf, -a) == (c | 0x8000), "%s: %a not exact", nm,
              (double)a);
        if (c == last)
            break;
        double mid = (val(c) + val(c + 1)) / 2;
        float fm = (float)mid;
        CHECK(fm == mid, "midpoint %a is not a float", mid); /* one more bit: exact */
        unsigned even = (c & 1) ? c + 1 : c;
        CHECK(to16(bf, fm) == even, "%s: midpoint %a -> %04x, expected %04x", nm, mid,
              to16(bf, fm), even);
        CHECK(to16(bf, -fm) == (even | 0x8000), "%s: -midpoint %a", nm, mid);
        CHECK(to16(bf, nextafterf(fm, INFINITY)) == c + 1, "%s: above %a", nm, mid);
        CHECK(to16(bf, nextafterf(fm, 0)) == c, "%s: below %a", nm, mid);
        CHECK(to16(bf, -nextafterf(fm, INFINITY)) == ((c + 1) | 0x8000), "%s: -above %a", nm,
              mid);
    }
    want_clean();
}

START_TEST(test_f32_to_f16_rounding)
{
    midpoints(0);
    /* overflow: 65520 is the tie between 65504 and 2^16, which rounds to even = inf */
    ck_assert_uint_eq(to16(0, 65520.0f), 0x7c00);
    ck_assert_uint_eq(to16(0, nextafterf(65520.0f, 0)), 0x7bff);
    ck_assert_uint_eq(to16(0, -65520.0f), 0xfc00);
    ck_assert_uint_eq(to16(0, 1e10f), 0x7c00);
    ck_assert_uint_eq(to16(0, FLT_MAX), 0x7c00);
    ck_assert_uint_eq(to16(0, INFINITY), 0x7c00);
    ck_assert_uint_eq(to16(0, -INFINITY), 0xfc00);
    uint16_t h = to16(0, NAN);
    ck_assert((h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0);
    /* underflow: 2^-25 is the tie between 0 and the smallest subnormal */
    ck_assert_uint_eq(to16(0, 0x1p-25f), 0x0000);
    ck_assert_uint_eq(to16(0, nextafterf(0x1p-25f, 1)), 0x0001);
    ck_assert_uint_eq(to16(0, 0x3p-26f), 0x0001);
    ck_assert_uint_eq(to16(0, 1e-30f), 0x0000);
    ck_assert_uint_eq(to16(0, -1e-30f), 0x8000);
    ck_assert_uint_eq(to16(0, FLT_TRUE_MIN), 0x0000);
    ck_assert_uint_eq(to16(0, -0.0f), 0x8000);
    ck_assert_uint_eq(to16(0, 0x1p-14f), 0x0400);                    /* smallest normal */
    ck_assert_uint_eq(to16(0, nextafterf(0x1p-14f, 0)), 0x0400);     /* rounds up into it */
    ck_assert_uint_eq(to16(0, 0x1p-14f - 0x1p-25f), 0x0400);         /* tie, 0x400 even */
    ck_assert_uint_eq(to16(0, 0x1p-14f - 0x3p-25f), 0x03fe);         /* tie, 0x3fe even */
    ck_assert_uint_eq(to16(0, 0x1p-14f - 0x1p-24f), 0x03ff);
}
END_TEST

START_TEST(test_f32_to_bf16_rounding)
{
    midpoints(1);
    /* the tie above the largest bf16 (2^128 - 2^119) is not a float: FLT_MAX is above it */
    ck_assert_uint_eq(to16(1, FLT_MAX), 0x7f80);
    ck_assert_uint_eq(to16(1, -FLT_MAX), 0xff80);
    ck_assert_uint_eq(to16(1, (float)(ldexp(1, 128) - ldexp(1, 119) - ldexp(1, 104))), 0x7f7f);
    ck_assert_uint_eq(to16(1, INFINITY), 0x7f80);
    uint16_t h = to16(1, NAN);
    ck_assert((h & 0x7f80) == 0x7f80 && (h & 0x7f) != 0);
    /* a NaN whose payload sits only in the low 16 bits must not become inf */
    uint32_t nb = 0x7f800001u;
    float sn;
    memcpy(&sn, &nb, 4);
    h = to16(1, sn);
    ck_assert_msg((h & 0x7f80) == 0x7f80 && (h & 0x7f) != 0, "nan %08x -> %04x", nb, h);
    ck_assert_uint_eq(to16(1, FLT_TRUE_MIN), 0x0000);
    ck_assert_uint_eq(to16(1, -0.0f), 0x8000);
}
END_TEST

/* Random bit patterns against the ldexp/nearbyint oracle (all exponents). */
START_TEST(test_conversion_random)
{
    gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
    gsl_rng_set(r, 2024);
    enum { N = 1 << 20 };
    float *x = malloc(sizeof(float) * N);
    uint16_t *h = malloc(sizeof(uint16_t) * N), *b = malloc(sizeof(uint16_t) * N);
    ck_assert(x && h && b);
    for (int i = 0; i < N; i++) {
        uint32_t u = (uint32_t)gsl_rng_get(r);
        if (i & 1) /* half of them near the f16 range */
            u = (u & 0x807fffffu) | ((uint32_t)(100 + gsl_rng_uniform_int(r, 45)) << 23);
        memcpy(&x[i], &u, 4);
    }
    fk_f32_to_f16(x, h, N);
    fk_f32_to_bf16(x, b, N);
    for (int i = 0; i < N; i++) {
        if (isnan(x[i]))
            continue;
        double w16 = ref_round(x[i], 11, -14, 15), wb = ref_round(x[i], 8, -126, 127);
        CHECK(same_float(w16, (float)f16_formula(h[i])), "f16(%a) = %04x, expected %a",
              (double)x[i], h[i], w16);
        CHECK(same_float(wb, (float)bf16_formula(b[i])), "bf16(%a) = %04x, expected %a",
              (double)x[i], b[i], wb);
    }
    want_clean();
    free(x);
    free(h);
    free(b);
    gsl_rng_free(r);
}
END_TEST

/* ---- 3. h5py interop ---------------------------------------------------------------- */

static const char *const PY_WRITER =
    "import sys\n"
    "import numpy as np, h5py\n"
    "L, Hq, Hkv, d, T, P = 2, 4, 2, 8, 20, 12\n"
    "Tq = T - P\n"
    "def vals(layer, kind, shape):\n"
    "    i = np.arange(int(np.prod(shape)), dtype=np.int64)\n"
    "    x = ((i * 7919 + layer * 104729 + kind * 1299709) % 2001 - 1000) / 37.0\n"
    "    return x.astype(np.float32).reshape(shape)\n"
    "def bf16(x):\n"
    "    b = x.view(np.uint32).astype(np.uint64)\n"
    "    return ((b + 0x7fff + ((b >> 16) & 1)) >> 16).astype(np.uint16)\n"
    "with h5py.File(sys.argv[1], 'w') as f:\n"
    "    f.attrs['schema'] = 'fadkv-trace'\n"
    "    f.attrs['schema_version'] = 1\n"
    "    f.attrs['model_id'] = 'h5py/model'\n"
    "    for k, v in (('num_layers', L), ('num_q_heads', Hq), ('num_kv_heads', Hkv),\n"
    "                 ('head_dim', d), ('keys_post_rope', 1), ('prompt_len', P)):\n"
    "        f.attrs[k] = v\n"
    "    f.attrs['rope_theta'] = 500000.0\n"
    "    f['tokens/positions'] = np.arange(T, dtype=np.int32)\n"
    "    f['tokens/phase'] = (np.arange(T) >= P).astype(np.uint8)\n"
    "    for l in range(L):\n"
    "        g = f.create_group('layers/L%02d' % l)\n"
    "        for kind, name, H, rows in ((0, 'keys', Hkv, T), (1, 'values', Hkv, T),\n"
    "                                    (2, 'queries', Hq, Tq)):\n"
    "            x = vals(l, kind, (H, rows, d))\n"
    "            enc = 'float16' if l == 0 else ('float32' if kind == 1 else 'bfloat16')\n"
    "            y = {'float16': x.astype(np.float16), 'float32': x, 'bfloat16': bf16(x)}\n"
    "            ds = g.create_dataset(name, data=y[enc], chunks=(1, rows, d))\n"
    "            ds.attrs['encoding'] = enc\n"
    "        g['query_token_idx'] = np.arange(P, T, dtype=np.int32)\n";

START_TEST(test_h5py_interop)
{
    if (system("PYENV_VERSION=system python3 -c 'import h5py' >/dev/null 2>&1") != 0) {
        printf("test_h5py_interop: skipped (no h5py for the system python3)\n");
        return;
    }
    char script[512], path[512], cmd[1200];
    pth(script, sizeof script, "writer.py");
    pth(path, sizeof path, "h5py.h5");
    FILE *fp = fopen(script, "w");
    ck_assert_ptr_nonnull(fp);
    fputs(PY_WRITER, fp);
    fclose(fp);
    snprintf(cmd, sizeof cmd, "PYENV_VERSION=system python3 '%s' '%s'", script, path);
    ck_assert_msg(system(cmd) == 0, "h5py writer failed: %s", cmd);

    struct fk_trace *t = NULL;
    ck_assert_msg(fk_trace_open(path, &t) == FK_OK, "%s", fk_errmsg());
    const struct fk_trace_info *in = fk_trace_get_info(t);
    ck_assert_str_eq(in->model_id, "h5py/model");
    ck_assert(in->rope_theta == 500000.0);
    ck_assert_int_eq(in->n_queries, 8);
    ck_assert_ptr_null(fk_trace_ids(t));
    float buf[4 * 20 * 8];
    for (int l = 0; l < 2; l++) {
        for (int kind = 0; kind < 3; kind++) {
            int H = kind == 2 ? 4 : 2, rows = kind == 2 ? 8 : 20;
            enum fk_encoding enc = l == 0 ? FK_ENC_F16 : kind == 1 ? FK_ENC_F32 : FK_ENC_BF16;
            ck_assert_msg(fk_trace_read(t, l, (enum fk_kind)kind, buf) == FK_OK, "%s",
                          fk_errmsg());
            long changed = 0;
            for (long i = 0; i < (long)H * rows * 8; i++) {
                float xf = (float)((double)((i * 7919 + l * 104729 + kind * 1299709) % 2001 -
                                            1000) / 37.0);
                float want = expect_enc(enc, xf);
                ck_assert_msg(same_float(want, buf[i]), "layer %d kind %d [%ld]: %a vs %a", l,
                              kind, i, (double)buf[i], (double)want);
                changed += want != xf;
            }
            if (enc != FK_ENC_F32)
                ck_assert(changed > H * rows); /* the values really were rounded */
        }
    }
    fk_trace_close(&t);
}
END_TEST

/* ---- 4. validation ------------------------------------------------------------------ */

START_TEST(test_bad_container)
{
    char p[512];
    pth(p, sizeof p, "text.h5");
    FILE *fp = fopen(p, "w");
    ck_assert_ptr_nonnull(fp);
    fputs("schema = \"fadkv-trace\"\nthis is not HDF5\n", fp);
    fclose(fp);
    expect_open_fail(p, FK_ECORRUPT, "HDF5", NULL);

    pth(p, sizeof p, "missing.h5");
    expect_open_fail(p, FK_EIO, NULL);

    make_good(p, sizeof p, "trunc.h5");
    struct stat st;
    ck_assert_int_eq(stat(p, &st), 0);
    ck_assert_int_eq(truncate(p, st.st_size / 2), 0);
    struct fk_trace *t = NULL;
    int rc = fk_trace_open(p, &t);
    ck_assert_msg(rc == FK_ECORRUPT || rc == FK_EIO, "truncated: rc %d (%s)", rc, fk_errmsg());
    ck_assert_ptr_null(t);
    msg_has(fk_errmsg(), p, NULL);

    /* the writer refuses a directory that does not exist */
    char q[600];
    snprintf(q, sizeof q, "%s/nodir/x.h5", g_dir);
    struct fk_trace_info in;
    make_info(&SMALL, &in);
    struct fk_trace_writer *w = NULL;
    ck_assert_int_eq(fk_trace_create(q, &in, FK_ENC_F32, &w), FK_EIO);
    ck_assert_ptr_null(w);
    msg_has(fk_errmsg(), q, NULL);
}
END_TEST

START_TEST(test_bad_metadata)
{
    char p[512];
    make_good(p, sizeof p, "schema.h5");
    edit_attr_str(p, "/", "schema", "other-trace");
    expect_open_fail(p, FK_ECORRUPT, "schema", "other-trace", "fadkv-trace", NULL);

    make_good(p, sizeof p, "version.h5");
    edit_attr_int(p, "/", "schema_version", 2);
    expect_open_fail(p, FK_ECORRUPT, "schema_version = 2", NULL);

    make_good(p, sizeof p, "nodim.h5");
    edit_del_attr(p, "/", "head_dim");
    expect_open_fail(p, FK_ECORRUPT, "missing attribute", "head_dim", NULL);

    make_good(p, sizeof p, "gqa.h5");
    edit_attr_int(p, "/", "num_q_heads", 3);
    expect_open_fail(p, FK_ECORRUPT, "num_q_heads = 3", "num_kv_heads = 2", NULL);

    make_good(p, sizeof p, "layers.h5");
    edit_attr_int(p, "/", "num_layers", 3);
    expect_open_fail(p, FK_ECORRUPT, "/layers/L02", NULL);
}
END_TEST

START_TEST(test_bad_tokens)
{
    char p[512];
    make_good(p, sizeof p, "nopos.h5");
    edit_del_link(p, "/tokens/positions");
    expect_open_fail(p, FK_ECORRUPT, "/tokens/positions", NULL);

    uint8_t ph[20];
    hsize_t d19[1] = {19}, d20[1] = {20}, d0[1] = {0};
    for (int i = 0; i < 20; i++)
        ph[i] = i >= 12;
    make_good(p, sizeof p, "phaselen.h5");
    edit_put_ds(p, "/tokens/phase", H5T_NATIVE_UINT8, 1, d19, ph);
    expect_open_fail(p, FK_ECORRUPT, "/tokens/phase", "19", "expected 20", NULL);

    /* same number of prefill tokens (12), but token 4 is decode: token 5 is the first
     * prefill token after a decode token */
    ph[4] = 1;
    ph[12] = 0;
    make_good(p, sizeof p, "order.h5");
    edit_put_ds(p, "/tokens/phase", H5T_NATIVE_UINT8, 1, d20, ph);
    expect_open_fail(p, FK_ECORRUPT, "/tokens/phase[5]", "prefill", NULL);

    make_good(p, sizeof p, "prompt.h5");
    edit_attr_int(p, "/", "prompt_len", 10);
    expect_open_fail(p, FK_ECORRUPT, "prompt_len = 10", "12", NULL);

    int32_t none[1] = {0};
    make_good(p, sizeof p, "empty.h5");
    edit_put_ds(p, "/tokens/positions", H5T_NATIVE_INT32, 1, d0, none);
    expect_open_fail(p, FK_ECORRUPT, "/tokens/positions", "empty", NULL);
}
END_TEST

START_TEST(test_bad_arrays)
{
    char p[512];
    float *z = calloc(4 * 20 * 8, sizeof(float));
    ck_assert_ptr_nonnull(z);

    make_good(p, sizeof p, "rank.h5");
    hsize_t r2[2] = {2, 160};
    edit_put_ds(p, "/layers/L01/keys", H5T_NATIVE_FLOAT, 2, r2, z);
    expect_open_fail(p, FK_ECORRUPT, "/layers/L01/keys", "rank 2", "expected 3", NULL);

    make_good(p, sizeof p, "shape.h5");
    hsize_t s19[3] = {2, 19, 8};
    edit_put_ds(p, "/layers/L01/keys", H5T_NATIVE_FLOAT, 3, s19, z);
    expect_open_fail(p, FK_ECORRUPT, "/layers/L01/keys", "19", "expected 20", NULL);

    make_good(p, sizeof p, "heads.h5");
    hsize_t h3[3] = {3, 20, 8};
    edit_put_ds(p, "/layers/L00/keys", H5T_NATIVE_FLOAT, 3, h3, z);
    expect_open_fail(p, FK_ECORRUPT, "/layers/L00/keys", "expected 2", NULL);

    make_good(p, sizeof p, "values.h5");
    hsize_t v7[3] = {2, 20, 7};
    edit_put_ds(p, "/layers/L00/values", H5T_NATIVE_FLOAT, 3, v7, z);
    expect_open_fail(p, FK_ECORRUPT, "/layers/L00/values", "expected 8", NULL);

    make_good(p, sizeof p, "qshape.h5");
    hsize_t q7[3] = {4, 7, 8};
    edit_put_ds(p, "/layers/L01/queries", H5T_NATIVE_FLOAT, 3, q7, z);
    expect_open_fail(p, FK_ECORRUPT, "/layers/L01/queries", "expected 8", NULL);

    make_good(p, sizeof p, "qempty.h5"); /* a queries array of no rows (fuzz_trace found it) */
    hsize_t q0[3] = {4, 0, 8};
    edit_put_ds(p, "/layers/L00/queries", H5T_NATIVE_FLOAT, 3, q0, z);
    expect_open_fail(p, FK_ECORRUPT, "layer L00", "queries has no rows", NULL);

    make_good(p, sizeof p, "noqidx.h5");
    edit_del_link(p, "/layers/L01/query_token_idx");
    expect_open_fail(p, FK_ECORRUPT, "L01", "query_token_idx", NULL);
    free(z);
}
END_TEST

START_TEST(test_bad_query_idx)
{
    char p[512];
    make_good(p, sizeof p, "qidx.h5");
    int32_t qi[8] = {12, 13, 14, 15, 16, 17, 18, 20};
    hsize_t d8[1] = {8};
    edit_put_ds(p, "/layers/L00/query_token_idx", H5T_NATIVE_INT32, 1, d8, qi);
    qi[7] = 19;
    qi[2] = -1;
    edit_put_ds(p, "/layers/L01/query_token_idx", H5T_NATIVE_INT32, 1, d8, qi);
    struct fk_trace *t = NULL;
    ck_assert_msg(fk_trace_open(p, &t) == FK_OK, "%s", fk_errmsg());
    int32_t got[8];
    ck_assert_int_eq(fk_trace_read_query_idx(t, 0, got), FK_ECORRUPT);
    msg_has(fk_errmsg(), p, "/layers/L00/query_token_idx", "[7] = 20", "[0, 20)", NULL);
    ck_assert_int_eq(fk_trace_read_query_idx(t, 1, got), FK_ECORRUPT);
    msg_has(fk_errmsg(), p, "/layers/L01/query_token_idx", "[2] = -1", NULL);
    fk_trace_close(&t);
}
END_TEST

START_TEST(test_nonfinite)
{
    enum fk_encoding enc = (enum fk_encoding)_i;
    char p[512];
    pth(p, sizeof p, "nan.h5");
    struct tdata x;
    gen(&SMALL, 3, &x);
    size_t T = 20, d = 8;
    x.k[1][(1 * T + 7) * d + 3] = NAN;      /* layer 1, head 1, token 7, channel 3 */
    x.v[0][(0 * T + 15) * d + 5] = INFINITY; /* layer 0, head 0, token 15, channel 5 */
    x.q[1][(3 * 8 + 2) * d + 0] = -INFINITY; /* layer 1, head 3, query row 2 */
    write_trace(p, enc, &x);
    struct fk_trace *t = NULL;
    ck_assert_msg(fk_trace_open(p, &t) == FK_OK, "%s", fk_errmsg());
    float buf[4 * 20 * 8];
    ck_assert_int_eq(fk_trace_read(t, 0, FK_KIND_K, buf), FK_OK);
    ck_assert_int_eq(fk_trace_read(t, 1, FK_KIND_V, buf), FK_OK);
    ck_assert_int_eq(fk_trace_read(t, 1, FK_KIND_K, buf), FK_ECORRUPT);
    msg_has(fk_errmsg(), p, "/layers/L01/keys", "layer 1", "head 1", "token 7", NULL);
    ck_assert_int_eq(fk_trace_read(t, 0, FK_KIND_V, buf), FK_ECORRUPT);
    msg_has(fk_errmsg(), p, "/layers/L00/values", "layer 0", "head 0", "token 15", NULL);
    ck_assert_int_eq(fk_trace_read(t, 1, FK_KIND_Q, buf), FK_ECORRUPT);
    msg_has(fk_errmsg(), p, "/layers/L01/queries", "layer 1", "head 3", "row 2", NULL);
    ck_assert_int_eq(fk_trace_read(t, 0, FK_KIND_Q, buf), FK_OK);
    fk_trace_close(&t);
    drop(&x);
}
END_TEST

START_TEST(test_bad_encoding)
{
    char p[512];
    make_good(p, sizeof p, "enc.h5");
    edit_attr_str(p, "/layers/L00/keys", "encoding", "int8");
    edit_attr_str(p, "/layers/L01/values", "encoding", "float16"); /* but 4-byte floats */
    struct fk_trace *t = NULL;
    float buf[4 * 20 * 8];
    int rc = fk_trace_open(p, &t);
    if (rc == FK_OK) { /* the reader may defer the encoding check to the read */
        rc = fk_trace_read(t, 0, FK_KIND_K, buf);
        ck_assert_int_eq(rc, FK_ECORRUPT);
        msg_has(fk_errmsg(), p, "/layers/L00/keys", "int8", NULL);
        ck_assert_int_eq(fk_trace_read(t, 1, FK_KIND_V, buf), FK_ECORRUPT);
        msg_has(fk_errmsg(), p, "/layers/L01/values", "float16", NULL);
        ck_assert_int_eq(fk_trace_read(t, 0, FK_KIND_V, buf), FK_OK);
        fk_trace_close(&t);
    } else {
        ck_assert_int_eq(rc, FK_ECORRUPT);
        msg_has(fk_errmsg(), p, "/layers/L00/keys", "int8", NULL);
    }
}
END_TEST

/* bfloat16 raw bits stored as a SIGNED 16-bit integer (what torch's .view(torch.int16)
 * gives): the reader must either reinterpret the bits or refuse, never convert the values
 * (a value conversion int16 -> uint16 would clamp every negative number to 0). */
START_TEST(test_bf16_as_int16)
{
    char p[512];
    make_good(p, sizeof p, "i16.h5");
    enum { N = 2 * 20 * 8 };
    float src[N], got[N];
    uint16_t bits[N];
    for (int i = 0; i < N; i++)
        src[i] = (float)((i % 13) - 6) * 0.75f; /* exact in bf16, half of them negative */
    fk_f32_to_bf16(src, bits, N);
    hsize_t dims[3] = {2, 20, 8};
    edit_put_ds(p, "/layers/L00/keys", H5T_NATIVE_INT16, 3, dims, bits);
    edit_attr_str(p, "/layers/L00/keys", "encoding", "bfloat16");
    struct fk_trace *t = NULL;
    int rc = fk_trace_open(p, &t);
    if (rc == FK_OK)
        rc = fk_trace_read(t, 0, FK_KIND_K, got);
    fk_trace_close(&t);
    if (rc != FK_OK) {
        ck_assert_int_eq(rc, FK_ECORRUPT);
        msg_has(fk_errmsg(), p, "/layers/L00/keys", NULL);
        return;
    }
    long wrong = 0;
    int first = -1;
    for (int i = 0; i < N; i++)
        if (got[i] != src[i] && wrong++ == 0)
            first = i;
    ck_assert_msg(wrong == 0, "int16-stored bfloat16 read with %ld wrong values, first [%d]: "
                  "%g instead of %g", wrong, first, first < 0 ? 0.0 : (double)got[first],
                  first < 0 ? 0.0 : (double)src[first]);
}
END_TEST

/* ---- 5. string attributes ----------------------------------------------------------- */

START_TEST(test_attrs)
{
    char p[512];
    pth(p, sizeof p, "attrs.h5");
    struct tdata x;
    gen(&SMALL, 9, &x);
    struct fk_trace_info in;
    make_info(&SMALL, &in);
    struct fk_trace_writer *w = NULL;
    ck_assert_int_eq(fk_trace_create(p, &in, FK_ENC_BF16, &w), FK_OK);
    ck_assert_int_eq(fk_trace_put_attr(w, "prompt_sha256", "9f86d081884c7d65"), FK_OK);
    ck_assert_int_eq(fk_trace_put_attr(w, "created_utc", "2024-05-01T12:00:00Z"), FK_OK);
    ck_assert_int_eq(fk_trace_put_attr(w, "note", "first"), FK_OK);
    ck_assert_int_eq(fk_trace_put_attr(w, "note", "second"), FK_OK); /* overwrite */
    ck_assert_int_eq(fk_trace_put_attr(w, "empty", ""), FK_OK);
    ck_assert_int_eq(fk_trace_write_tokens(w, x.pos, x.phase, NULL), FK_OK);
    for (int l = 0; l < 2; l++) {
        ck_assert_int_eq(fk_trace_write_layer(w, l, FK_KIND_K, x.k[l], NULL), FK_OK);
        ck_assert_int_eq(fk_trace_write_layer(w, l, FK_KIND_V, x.v[l], NULL), FK_OK);
    }
    ck_assert_int_eq(fk_trace_finish(&w), FK_OK);
    edit_attr_str(p, "/", "fixed_len", "fixed string"); /* fixed-length string too */

    struct fk_trace *t = NULL;
    ck_assert_msg(fk_trace_open(p, &t) == FK_OK, "%s", fk_errmsg());
    ck_assert_int_eq(fk_trace_get_info(t)->has_queries, 0);
    ck_assert_int_eq(fk_trace_get_info(t)->n_queries, 0);
    ck_assert_ptr_null(fk_trace_ids(t));
    const char *a = fk_trace_attr(t, "prompt_sha256");
    ck_assert_ptr_nonnull(a);
    ck_assert_str_eq(a, "9f86d081884c7d65");
    ck_assert_str_eq(fk_trace_attr(t, "created_utc"), "2024-05-01T12:00:00Z");
    ck_assert_str_eq(fk_trace_attr(t, "note"), "second");
    ck_assert_str_eq(fk_trace_attr(t, "empty"), "");
    ck_assert_str_eq(fk_trace_attr(t, "fixed_len"), "fixed string");
    ck_assert_str_eq(fk_trace_attr(t, "schema"), "fadkv-trace");
    ck_assert_str_eq(fk_trace_attr(t, "prompt_sha256"), "9f86d081884c7d65"); /* cached */
    ck_assert_ptr_null(fk_trace_attr(t, "no_such_attr"));
    ck_assert_ptr_null(fk_trace_attr(t, "head_dim")); /* not a string */
    float q[4 * 8 * 8];
    ck_assert_int_eq(fk_trace_read(t, 0, FK_KIND_Q, q), FK_ECORRUPT); /* no queries */
    fk_trace_close(&t);
    drop(&x);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("trace");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_unchecked_fixture(tc, dir_setup, dir_teardown); /* once, even on failure */
    tcase_add_loop_test(tc, test_round_trip, FK_ENC_F32, FK_ENC_BF16 + 1);
    tcase_add_loop_test(tc, test_read_odd_count, FK_ENC_F32, FK_ENC_BF16 + 1);
    tcase_add_test(tc, test_f16_to_f32_exhaustive);
    tcase_add_test(tc, test_f32_to_f16_rounding);
    tcase_add_test(tc, test_f32_to_bf16_rounding);
    tcase_add_test(tc, test_conversion_random);
    tcase_add_test(tc, test_h5py_interop);
    tcase_add_test(tc, test_bad_container);
    tcase_add_test(tc, test_bad_metadata);
    tcase_add_test(tc, test_bad_tokens);
    tcase_add_test(tc, test_bad_arrays);
    tcase_add_test(tc, test_bad_query_idx);
    tcase_add_loop_test(tc, test_nonfinite, FK_ENC_F32, FK_ENC_BF16 + 1);
    tcase_add_test(tc, test_bad_encoding);
    tcase_add_test(tc, test_bf16_as_int16);
    tcase_add_test(tc, test_attrs);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    fk_hdf5_quiet();
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    return fk_suite_run(suite());
}
