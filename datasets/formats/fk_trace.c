/* SPDX-License-Identifier: MIT
 * Trace format v1 reader and writer (contract: datasets/README.md).
 */
#include "formats/fk_trace.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fk_err.h"
#include "formats/fk_h5.h"

#define MAX_ATTRS 64

struct fk_trace {
    char *path;              /* file name, for messages */
    hid_t file;              /* open HDF5 file */
    struct fk_trace_info info;
    int32_t *positions;      /* [T] */
    uint8_t *phase;          /* [T] */
    int32_t *ids;            /* [T] or NULL */
    char *attr_names[MAX_ATTRS];
    char *attr_vals[MAX_ATTRS];
    int n_attr;              /* cached string attributes */
    struct fk_trace_verify *vf; /* while fk_trace_verify runs: non-finite values are counted
                              * and described here instead of failing the read */
};

struct fk_trace_writer {
    char *path;              /* final name */
    char *tmp;               /* path + ".tmp" while writing */
    hid_t file;
    hid_t layers;            /* /layers group */
    struct fk_trace_info info;
    enum fk_encoding enc;
};

void fk_hdf5_quiet(void) { H5Eset_auto2(H5E_DEFAULT, NULL, NULL); }

/* ---- 16-bit conversions ------------------------------------------------------------- */

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define FK_F16_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define FK_F16_CLONES
#endif

static inline uint16_t f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) /* inf or nan */
        return (uint16_t)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));
    if (ax >= 0x477ff000u) /* rounds to >= 65520: overflow to inf */
        return (uint16_t)(sign | 0x7c00);
    if (ax < 0x38800000u) { /* below the smallest normal: subnormal or zero */
        if (ax < 0x33000000u)
            return (uint16_t)sign;
        uint32_t e = ax >> 23, m = (ax & 0x7fffff) | 0x800000;
        uint32_t shift = 126 - e; /* 14..24 */
        uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1)))
            q++;
        return (uint16_t)(sign | q);
    }
    uint32_t q = ((ax - 0x38000000u) >> 13), rem = ax & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (q & 1)))
        q++;
    return (uint16_t)(sign | q);
}

/* The same bits as f16_to_f32 without branches: the 15 low bits shifted into a float's
 * exponent and mantissa and scaled by 2^112 (exact: a subnormal half becomes a normal float),
 * the all-ones exponent (inf, NaN) forced to the float's, then the sign. Needs no flush of
 * subnormals to zero (the C default). */
static inline float f16_to_f32_nb(uint16_t h)
{
    uint32_t t = (uint32_t)(h & 0x7fff) << 13, b;
    float f;
    memcpy(&f, &t, 4);
    f *= 0x1p112f;
    memcpy(&b, &f, 4);
    b = (h & 0x7c00) == 0x7c00 ? t | 0x70000000u : b;
    b |= (uint32_t)(h & 0x8000) << 16;
    memcpy(&f, &b, 4);
    return f;
}

/* Blocks of 16 (a constant trip count: gcc -O2 vectorises it), then the tail. */
FK_F16_CLONES static void f16_to_f32_c(const uint16_t *src, float *dst, size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++)
            dst[i + j] = f16_to_f32_nb(src[i + j]);
    for (; i < n; i++)
        dst[i] = f16_to_f32_nb(src[i]);
}

#if defined(__GNUC__) && defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#include <stdatomic.h>

/* VCVTPH2PS: 8 halves per instruction, exact (a signalling NaN comes out quiet). The attention
 * reads every stored exact row at every evaluated step, so this conversion is hot. */
__attribute__((target("avx,f16c"))) static void f16_to_f32_f16c(const uint16_t *src,
                                                                 float *dst, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i,
                         _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(src + i))));
    if (i < n) { /* the tail through the same instruction, padded */
        uint16_t h[8] = {0};
        float f[8];
        memcpy(h, src + i, sizeof(uint16_t) * (n - i));
        _mm256_storeu_ps(f, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)h)));
        memcpy(dst + i, f, sizeof(float) * (n - i));
    }
}

static atomic_int f16c_state; /* 0 unknown, 1 available, 2 not */
static atomic_int f16c_allowed = 1;

static int f16c_available(void)
{
    int st = atomic_load_explicit(&f16c_state, memory_order_relaxed);
    if (st == 0) {
        unsigned a, b, c, d;
        /* F16C and AVX, and the OS saves the YMM state (OSXSAVE, XCR0 bits 1 and 2) */
        int ok = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) && (c & bit_AVX) &&
                 (c & bit_OSXSAVE);
        if (ok) {
            unsigned lo, hi;
            __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
            ok = (lo & 6) == 6;
        }
        st = ok ? 1 : 2;
        atomic_store_explicit(&f16c_state, st, memory_order_relaxed);
    }
    return st == 1;
}

void fk_f16_to_f32(const uint16_t *src, float *dst, size_t n)
{
    if (atomic_load_explicit(&f16c_allowed, memory_order_relaxed) && f16c_available())
        f16_to_f32_f16c(src, dst, n);
    else
        f16_to_f32_c(src, dst, n);
}

int fk_f16_accel(int allow)
{
    atomic_store_explicit(&f16c_allowed, allow != 0, memory_order_relaxed);
    return f16c_available();
}
#else
void fk_f16_to_f32(const uint16_t *src, float *dst, size_t n)
{
    f16_to_f32_c(src, dst, n);
}

int fk_f16_accel(int allow)
{
    (void)allow;
    return 0;
}
#endif

void fk_f32_to_f16(const float *src, uint16_t *dst, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = f32_to_f16(src[i]);
}

void fk_bf16_to_f32(const uint16_t *src, float *dst, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t b = (uint32_t)src[i] << 16;
        memcpy(&dst[i], &b, 4);
    }
}

void fk_f32_to_bf16(const float *src, uint16_t *dst, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t x;
        memcpy(&x, &src[i], 4);
        if ((x & 0x7fffffffu) > 0x7f800000u) {
            dst[i] = (uint16_t)((x >> 16) | 0x40); /* quiet nan */
            continue;
        }
        uint32_t rem = x & 0xffff, q = x >> 16;
        if (rem > 0x8000 || (rem == 0x8000 && (q & 1)))
            q++;
        dst[i] = (uint16_t)q;
    }
}

/* ---- reader ------------------------------------------------------------------------- */

static const char *kind_name(enum fk_kind k)
{
    return k == FK_KIND_K ? "keys" : k == FK_KIND_V ? "values" : "queries";
}

static void layer_name(char *buf, size_t cap, int layer)
{
    snprintf(buf, cap, "/layers/L%02d", layer);
}

static int read_int_attr(struct fk_trace *t, const char *name, int lo, int *out)
{
    int64_t v;
    FK_TRY(fk_h5_attr_i64(t->file, t->path, name, &v));
    if (v < lo || v > 1 << 30)
        return fk_err(FK_ECORRUPT, "%s: attribute '%s' = %lld, expected an integer >= %d",
                      t->path, name, (long long)v, lo);
    *out = (int)v;
    return FK_OK;
}

/* Opens dataset `name`, checks rank and extents (dims[i] < 0 = any) and returns it. */
static int open_ds(struct fk_trace *t, const char *name, int rank, const long *want,
                   hid_t *ds_out, hsize_t dims[8])
{
    if (H5Lexists(t->file, name, H5P_DEFAULT) <= 0)
        return fk_err(FK_ECORRUPT, "%s: missing dataset %s", t->path, name);
    hid_t ds = H5Dopen2(t->file, name, H5P_DEFAULT);
    if (ds < 0)
        return fk_err(FK_ECORRUPT, "%s: %s is not a readable dataset", t->path, name);
    int r;
    int rc = fk_h5_shape(ds, t->path, name, &r, dims);
    if (rc == FK_OK && r != rank)
        rc = fk_err(FK_ECORRUPT, "%s: dataset %s has rank %d, expected %d", t->path, name, r,
                    rank);
    for (int i = 0; rc == FK_OK && i < rank; i++)
        if (want[i] >= 0 && (long)dims[i] != want[i])
            rc = fk_err(FK_ECORRUPT, "%s: dataset %s has extent %llu on axis %d, expected %ld",
                        t->path, name, (unsigned long long)dims[i], i, want[i]);
    if (rc != FK_OK) {
        H5Dclose(ds);
        return rc;
    }
    *ds_out = ds;
    return FK_OK;
}

static int read_ints(struct fk_trace *t, const char *name, long n, hid_t memtype, void *dst)
{
    hid_t ds;
    hsize_t dims[8];
    long want[1] = {n};
    FK_TRY(open_ds(t, name, 1, want, &ds, dims));
    hid_t ft = H5Dget_type(ds);
    int ok = H5Tget_class(ft) == H5T_INTEGER;
    H5Tclose(ft);
    int rc = FK_OK;
    if (!ok)
        rc = fk_err(FK_ECORRUPT, "%s: dataset %s must hold integers", t->path, name);
    else if (n > 0 && H5Dread(ds, memtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, dst) < 0)
        rc = fk_err(FK_ECORRUPT, "%s: cannot read dataset %s", t->path, name);
    H5Dclose(ds);
    return rc;
}

static int check_array(struct fk_trace *t, enum fk_kind kind, int layer, long *want)
{
    char name[64];
    hid_t ds;
    hsize_t dims[8];
    snprintf(name, sizeof name, "/layers/L%02d/%s", layer, kind_name(kind));
    FK_TRY(open_ds(t, name, 3, want, &ds, dims));
    H5Dclose(ds);
    if (want[1] < 0)
        want[1] = (long)dims[1];
    return FK_OK;
}

/* A root attribute naming one of choices (NULL-terminated): its index. */
static int attr_choice(struct fk_trace *t, const char *name, const char *const *choices,
                       int *out)
{
    char buf[64];
    FK_TRY(fk_h5_attr_str(t->file, t->path, name, buf, sizeof buf));
    for (int i = 0; choices[i]; i++)
        if (!strcmp(buf, choices[i])) {
            *out = i;
            return FK_OK;
        }
    return fk_err(FK_ECORRUPT, "%s: attribute %s = \"%s\", expected \"%s\" or \"%s\"", t->path,
                  name, buf, choices[0], choices[1]);
}

/* A numeric root attribute, stored as a number or as a string holding one (the Python
 * writer stores unknown attributes as strings). */
static int attr_number(struct fk_trace *t, const char *name, double *out)
{
    if (!fk_h5_has_attr(t->file, name))
        return fk_err(FK_ECORRUPT, "%s: rope_type = \"llama3\" needs the attribute %s", t->path,
                      name);
    char buf[64];
    if (fk_h5_attr_str(t->file, t->path, name, buf, sizeof buf) == FK_OK) {
        char *end;
        *out = strtod(buf, &end);
        if (end == buf || *end)
            return fk_err(FK_ECORRUPT, "%s: attribute %s = \"%s\", expected a number", t->path,
                          name, buf);
        return FK_OK;
    }
    return fk_h5_attr_f64(t->file, t->path, name, out);
}

/* The optional RoPE description (datasets/README.md): rope_layout, rope_type and, for
 * llama3, its four numbers. Absent rope_layout: has_rope = 0 (nothing else may be set). */
static int parse_rope(struct fk_trace *t)
{
    struct fk_trace_info *in = &t->info;
    struct fk_rope *r = &in->rope;
    memset(r, 0, sizeof *r);
    in->has_rope = 0;
    static const char *const extra[] = {"rope_type", "rope_factor", "rope_low_freq_factor",
                                        "rope_high_freq_factor", "rope_original_max_position",
                                        NULL};
    if (!fk_h5_has_attr(t->file, "rope_layout")) {
        for (int i = 0; extra[i]; i++)
            if (fk_h5_has_attr(t->file, extra[i]))
                return fk_err(FK_ECORRUPT, "%s: attribute %s is set but rope_layout is not "
                              "(expected \"interleaved\" or \"half\")", t->path, extra[i]);
        return FK_OK;
    }
    FK_TRY(attr_choice(t, "rope_layout", fk_rope_layout_names, &r->layout));
    r->type = FK_ROPE_DEFAULT;
    if (fk_h5_has_attr(t->file, "rope_type"))
        FK_TRY(attr_choice(t, "rope_type", fk_rope_type_names, &r->type));
    if (r->type == FK_ROPE_LLAMA3) {
        FK_TRY(attr_number(t, "rope_factor", &r->factor));
        FK_TRY(attr_number(t, "rope_low_freq_factor", &r->low_freq_factor));
        FK_TRY(attr_number(t, "rope_high_freq_factor", &r->high_freq_factor));
        FK_TRY(attr_number(t, "rope_original_max_position", &r->original_max_position));
    }
    r->theta = in->rope_theta;
    if (fk_rope_check(r, in->head_dim) < 0) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", fk_errmsg());
        return fk_err(FK_ECORRUPT, "%s: RoPE attributes: %s", t->path, msg);
    }
    in->has_rope = 1;
    return FK_OK;
}

/* The root attributes: schema, version, shape, RoPE. */
static int validate_attrs(struct fk_trace *t)
{
    struct fk_trace_info *in = &t->info;
    char buf[FK_NAME_CAP];
    FK_TRY(fk_h5_attr_str(t->file, t->path, "schema", buf, sizeof buf));
    if (strcmp(buf, FK_TRACE_SCHEMA))
        return fk_err(FK_ECORRUPT, "%s: attribute schema = \"%s\", expected \"%s\"", t->path,
                      buf, FK_TRACE_SCHEMA);
    int version = 0;
    FK_TRY(read_int_attr(t, "schema_version", 0, &version));
    if (version != FK_TRACE_VERSION)
        return fk_err(FK_ECORRUPT, "%s: schema_version = %d, this reader reads version %d",
                      t->path, version, FK_TRACE_VERSION);
    if (fk_h5_has_attr(t->file, "model_id"))
        FK_TRY(fk_h5_attr_str(t->file, t->path, "model_id", in->model_id, sizeof in->model_id));
    if (fk_h5_has_attr(t->file, "source"))
        FK_TRY(fk_h5_attr_str(t->file, t->path, "source", in->source, sizeof in->source));
    FK_TRY(read_int_attr(t, "num_layers", 1, &in->n_layers));
    FK_TRY(read_int_attr(t, "num_q_heads", 1, &in->n_q_heads));
    FK_TRY(read_int_attr(t, "num_kv_heads", 1, &in->n_kv_heads));
    FK_TRY(read_int_attr(t, "head_dim", 1, &in->head_dim));
    FK_TRY(read_int_attr(t, "keys_post_rope", 0, &in->keys_post_rope));
    FK_TRY(read_int_attr(t, "prompt_len", 0, &in->prompt_len));
    in->rope_theta = 0;
    if (fk_h5_has_attr(t->file, "rope_theta"))
        FK_TRY(fk_h5_attr_f64(t->file, t->path, "rope_theta", &in->rope_theta));
    FK_TRY(parse_rope(t));
    if (in->n_q_heads % in->n_kv_heads)
        return fk_err(FK_ECORRUPT,
                      "%s: num_q_heads = %d is not a multiple of num_kv_heads = %d (GQA needs "
                      "H_q = r * H_kv)",
                      t->path, in->n_q_heads, in->n_kv_heads);
    if (in->head_dim > 4096)
        return fk_err(FK_ECORRUPT, "%s: head_dim = %d is out of range (1..4096)", t->path,
                      in->head_dim);
    return FK_OK;
}

/* /tokens: positions, phase (prefill first) and ids; sets n_tokens. */
static int validate_tokens(struct fk_trace *t)
{
    struct fk_trace_info *in = &t->info;
    hid_t ds;
    hsize_t dims[8];
    long any[1] = {-1};
    FK_TRY(open_ds(t, "/tokens/positions", 1, any, &ds, dims));
    H5Dclose(ds);
    if (dims[0] < 1)
        return fk_err(FK_ECORRUPT, "%s: /tokens/positions is empty: a trace needs T >= 1 token",
                      t->path);
    if (dims[0] > (1u << 24))
        return fk_err(FK_ECORRUPT, "%s: /tokens/positions has %llu entries (limit 16777216)",
                      t->path, (unsigned long long)dims[0]);
    in->n_tokens = (int)dims[0];
    long T = in->n_tokens;
    t->positions = malloc(sizeof(int32_t) * (size_t)T);
    t->phase = malloc((size_t)T);
    if (!t->positions || !t->phase)
        return fk_err(FK_ENOMEM, "out of memory");
    FK_TRY(read_ints(t, "/tokens/positions", T, H5T_NATIVE_INT32, t->positions));
    FK_TRY(read_ints(t, "/tokens/phase", T, H5T_NATIVE_UINT8, t->phase));
    if (H5Lexists(t->file, "/tokens/ids", H5P_DEFAULT) > 0) {
        t->ids = malloc(sizeof(int32_t) * (size_t)T);
        if (!t->ids)
            return fk_err(FK_ENOMEM, "out of memory");
        FK_TRY(read_ints(t, "/tokens/ids", T, H5T_NATIVE_INT32, t->ids));
    }
    int n_prefill = 0;
    for (long i = 0; i < T; i++) {
        if (t->phase[i] > 1)
            return fk_err(FK_ECORRUPT, "%s: /tokens/phase[%ld] = %u, expected 0 or 1", t->path,
                          i, t->phase[i]);
        if (t->phase[i] == 0) {
            if (i != n_prefill)
                return fk_err(FK_ECORRUPT,
                              "%s: /tokens/phase[%ld] = 0 after a decode token: prefill tokens "
                              "must come first",
                              t->path, i);
            n_prefill++;
        }
        if (t->positions[i] < 0)
            return fk_err(FK_ECORRUPT, "%s: /tokens/positions[%ld] = %d is negative", t->path,
                          i, t->positions[i]);
    }
    if (n_prefill != in->prompt_len)
        return fk_err(FK_ECORRUPT,
                      "%s: prompt_len = %d but /tokens/phase marks %d prefill tokens", t->path,
                      in->prompt_len, n_prefill);

    return FK_OK;
}

/* /layers: K and V of every layer, the queries and their token indices. */
static int validate_layers(struct fk_trace *t)
{
    struct fk_trace_info *in = &t->info;
    long T = in->n_tokens;
    hid_t ds;
    /* one (layer, kind) array must fit the reader's buffers (2^31 values) */
    if ((double)in->n_kv_heads * in->n_tokens * in->head_dim > 2147483648.0 ||
        (double)in->n_q_heads * in->n_tokens * in->head_dim > 2147483648.0)
        return fk_err(FK_ECORRUPT, "%s: %d heads x %d tokens x head_dim %d exceeds the 2^31 "
                      "values per layer array this reader supports",
                      t->path, in->n_q_heads, in->n_tokens, in->head_dim);
    if (H5Lexists(t->file, "/layers", H5P_DEFAULT) <= 0)
        return fk_err(FK_ECORRUPT, "%s: missing group /layers", t->path);
    in->has_queries = 1;
    in->n_queries = -1;
    for (int l = 0; l < in->n_layers; l++) {
        char name[64];
        layer_name(name, sizeof name, l);
        if (H5Lexists(t->file, name, H5P_DEFAULT) <= 0)
            return fk_err(FK_ECORRUPT, "%s: missing group %s (num_layers = %d)", t->path, name,
                          in->n_layers);
        long kv[3] = {in->n_kv_heads, T, in->head_dim};
        FK_TRY(check_array(t, FK_KIND_K, l, kv));
        FK_TRY(check_array(t, FK_KIND_V, l, kv));
        snprintf(name, sizeof name, "/layers/L%02d/queries", l);
        int hq = H5Lexists(t->file, name, H5P_DEFAULT) > 0;
        if (!hq) {
            in->has_queries = 0;
            continue;
        }
        long q[3] = {in->n_q_heads, in->n_queries, in->head_dim};
        FK_TRY(check_array(t, FK_KIND_Q, l, q));
        if (q[1] < 1)
            return fk_err(FK_ECORRUPT, "%s: layer L%02d: queries has no rows (expected "
                          "[%d][rows >= 1][%d], or no queries dataset)", t->path, l,
                          in->n_q_heads, in->head_dim);
        if (q[1] > (1L << 24))
            return fk_err(FK_ECORRUPT, "%s: layer L%02d has %ld query rows (limit 16777216)",
                          t->path, l, q[1]);
        in->n_queries = (int)q[1];
        snprintf(name, sizeof name, "/layers/L%02d/query_token_idx", l);
        if (H5Lexists(t->file, name, H5P_DEFAULT) <= 0)
            return fk_err(FK_ECORRUPT, "%s: layer L%02d has queries but no query_token_idx",
                          t->path, l);
        hsize_t qd[8];
        long w[1] = {in->n_queries};
        FK_TRY(open_ds(t, name, 1, w, &ds, qd));
        H5Dclose(ds);
    }
    if (!in->has_queries)
        in->n_queries = 0;
    return FK_OK;
}

static int validate(struct fk_trace *t)
{
    FK_TRY(validate_attrs(t));
    FK_TRY(validate_tokens(t));
    return validate_layers(t);
}

int fk_trace_open(const char *path, struct fk_trace **out)
{
    *out = NULL;
    struct fk_trace *t = calloc(1, sizeof *t);
    if (!t)
        return fk_err(FK_ENOMEM, "out of memory");
    t->file = -1;
    t->path = strdup(path);
    if (!t->path) {
        free(t);
        return fk_err(FK_ENOMEM, "out of memory");
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        fk_trace_close(&t);
        return fk_err(FK_EIO, "%s: cannot open (no such file or not readable)%s", path,
                      path[0] == '/' ? "" : " (relative to the current directory)");
    }
    fclose(f);
    if (H5Fis_hdf5(path) <= 0) {
        fk_trace_close(&t);
        return fk_err(FK_ECORRUPT, "%s: not an HDF5 file (or truncated)", path);
    }
    t->file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (t->file < 0) {
        fk_trace_close(&t);
        return fk_err(FK_ECORRUPT, "%s: HDF5 cannot open it (truncated or damaged?)", path);
    }
    int rc = validate(t);
    if (rc < 0) {
        fk_trace_close(&t);
        return rc;
    }
    *out = t;
    return FK_OK;
}

void fk_trace_close(struct fk_trace **tp)
{
    struct fk_trace *t = tp ? *tp : NULL;
    if (!t)
        return;
    if (t->file >= 0)
        H5Fclose(t->file);
    for (int i = 0; i < t->n_attr; i++) {
        free(t->attr_names[i]);
        free(t->attr_vals[i]);
    }
    free(t->positions);
    free(t->phase);
    free(t->ids);
    free(t->path);
    free(t);
    *tp = NULL;
}

const struct fk_trace_info *fk_trace_get_info(const struct fk_trace *t) { return &t->info; }
const char *fk_trace_path(const struct fk_trace *t) { return t->path; }
const int32_t *fk_trace_positions(const struct fk_trace *t) { return t->positions; }
const uint8_t *fk_trace_phase(const struct fk_trace *t) { return t->phase; }
const int32_t *fk_trace_ids(const struct fk_trace *t) { return t->ids; }

const char *fk_trace_attr(struct fk_trace *t, const char *name)
{
    for (int i = 0; i < t->n_attr; i++)
        if (!strcmp(t->attr_names[i], name))
            return t->attr_vals[i];
    if (t->n_attr == MAX_ATTRS || !fk_h5_has_attr(t->file, name))
        return NULL;
    char buf[4096];
    if (fk_h5_attr_str(t->file, t->path, name, buf, sizeof buf) < 0)
        return NULL;
    t->attr_names[t->n_attr] = strdup(name);
    t->attr_vals[t->n_attr] = strdup(buf);
    if (!t->attr_names[t->n_attr] || !t->attr_vals[t->n_attr]) {
        free(t->attr_names[t->n_attr]);
        free(t->attr_vals[t->n_attr]);
        return NULL;
    }
    return t->attr_vals[t->n_attr++];
}

static int parse_encoding(struct fk_trace *t, hid_t ds, const char *name, enum fk_encoding *e)
{
    char enc[32] = "float32";
    if (fk_h5_has_attr(ds, "encoding"))
        FK_TRY(fk_h5_attr_str(ds, t->path, "encoding", enc, sizeof enc));
    hid_t ft = H5Dget_type(ds);
    H5T_class_t cl = H5Tget_class(ft);
    size_t sz = H5Tget_size(ft);
    H5Tclose(ft);
    if (!strcmp(enc, "float32") && cl == H5T_FLOAT && sz == 4)
        *e = FK_ENC_F32;
    else if (!strcmp(enc, "float16") && cl == H5T_FLOAT && sz == 2)
        *e = FK_ENC_F16;
    else if (!strcmp(enc, "bfloat16") && cl == H5T_INTEGER && sz == 2)
        *e = FK_ENC_BF16;
    else
        return fk_err(FK_ECORRUPT,
                      "%s: dataset %s: encoding \"%s\" with a %zu-byte %s type; expected "
                      "float32 (4-byte float), float16 (2-byte float) or bfloat16 (uint16)",
                      t->path, name, enc, sz, cl == H5T_FLOAT ? "float" : "non-float");
    return FK_OK;
}

/* Reads a [H][rows][d] dataset of one layer into dst: every row, or (sel != NULL) the
 * n_sel rows sel[] (strictly increasing) as a [H][n_sel][d] array. 16-bit data are read
 * raw and widened by our own code; non-finite values are refused. */
/* A selection of n_sel rows of every head of dataset ds, as runs of consecutive rows; the
 * union is visited in file order, [h][row][d], which is the memory order of the output. */
static int select_rows(const struct fk_trace *t, hid_t ds, const char *name, int H,
                       const int32_t *sel, int n_sel, hid_t *fsp, hid_t *msp)
{
    int d = t->info.head_dim;
    hsize_t mdims[3] = {(hsize_t)H, (hsize_t)n_sel, (hsize_t)d};
    *fsp = H5Dget_space(ds);
    *msp = H5Screate_simple(3, mdims, NULL);
    herr_t e = *fsp < 0 || *msp < 0 ? -1 : H5Sselect_none(*fsp);
    for (int i = 0; i < n_sel && e >= 0;) {
        int j = i + 1;
        while (j < n_sel && sel[j] == sel[j - 1] + 1)
            j++;
        hsize_t start[3] = {0, (hsize_t)sel[i], 0};
        hsize_t count[3] = {(hsize_t)H, (hsize_t)(j - i), (hsize_t)d};
        e = H5Sselect_hyperslab(*fsp, H5S_SELECT_OR, start, NULL, count, NULL);
        i = j;
    }
    if (e < 0)
        return fk_err(FK_ECORRUPT, "%s: cannot select %d rows of dataset %s", t->path, n_sel,
                      name);
    return FK_OK;
}

/* 16-bit data of n values: read raw (no HDF5 conversion, which is slow) into the upper half
 * of dst, then widen in place from the front (the source stays ahead); or, when the caller
 * keeps the words as stored (raw), into dst itself. */
static int read_16bit(const struct fk_trace *t, hid_t ds, const char *name,
                      enum fk_encoding enc, hid_t msp, hid_t fsp, size_t n, int raw, void *out)
{
    float *dst = out;
    uint16_t *rw = raw ? (uint16_t *)out : (uint16_t *)dst + n;
    hid_t mt;
    if (enc == FK_ENC_F16) {
        mt = fk_h5_f16_type();
        H5Tset_order(mt, H5Tget_order(H5T_NATIVE_FLOAT));
    } else { /* bf16 bits: copy them unchanged whatever the integer's signedness */
        hid_t ft = H5Dget_type(ds);
        mt = H5Tcopy(H5Tget_sign(ft) == H5T_SGN_2 ? H5T_NATIVE_INT16 : H5T_NATIVE_UINT16);
        H5Tclose(ft);
    }
    int rc = FK_OK;
    if (H5Dread(ds, mt, msp, fsp, H5P_DEFAULT, rw) < 0) {
        rc = fk_err(FK_ECORRUPT, "%s: cannot read dataset %s (truncated?)", t->path, name);
    } else if (!raw) {
        /* forward widening is safe: rw[j] sits at bytes 2n + 2j, and writing dst[i] (bytes
         * 4i .. 4i+3) only reaches rw[j] for j <= i, already read; blocks of 256 keep that
         * order. */
        for (size_t i = 0; i < n; i += 256) {
            size_t c = n - i < 256 ? n - i : 256;
            uint16_t blk[256];
            memcpy(blk, rw + i, sizeof(uint16_t) * c);
            if (enc == FK_ENC_F16)
                fk_f16_to_f32(blk, dst + i, c);
            else
                fk_bf16_to_f32(blk, dst + i, c);
        }
    }
    H5Tclose(mt);
    return rc;
}

/* What read_rows read, for the non-finite check. */
struct rows_read {
    const char *name;
    int layer, rows;
    enum fk_kind kind;
    const int32_t *sel;
};

static int nonfinite(const struct fk_trace *t, const struct rows_read *r, size_t i, double v)
{
    size_t d = (size_t)t->info.head_dim, per_head = (size_t)r->rows * d;
    size_t row = (i % per_head) / d;
    char where[256];
    snprintf(where, sizeof where, "non-finite value %g at layer %d, head %zu, %s %zu, "
             "channel %zu", v, r->layer, i / per_head,
             r->kind == FK_KIND_Q ? "query row" : "token", r->sel ? (size_t)r->sel[row] : row,
             i % d);
    struct fk_trace_verify *vf = t->vf;
    if (vf) { /* verify: describe it and go on */
        if (vf->n_issues < FK_VERIFY_MAX)
            snprintf(vf->issue[vf->n_issues++], sizeof vf->issue[0], "dataset %s: %s", r->name,
                     where);
        vf->n_nonfinite++;
        return FK_OK;
    }
    return fk_err(FK_ECORRUPT, "%s: dataset %s: %s", t->path, r->name, where);
}

/* The first non-finite value of what was read (n values) is an error naming its place. */
static int check_finite(const struct fk_trace *t, const struct rows_read *r,
                        enum fk_encoding enc, int raw, size_t n, const void *out)
{
    if (raw && enc != FK_ENC_F32) {
        /* non-finite words: the all-ones exponent */
        const uint16_t *w = out;
        uint16_t em = enc == FK_ENC_F16 ? 0x7c00 : 0x7f80;
        for (size_t i = 0; i < n; i++)
            if ((w[i] & em) == em) {
                float v;
                if (enc == FK_ENC_F16)
                    fk_f16_to_f32(&w[i], &v, 1);
                else
                    fk_bf16_to_f32(&w[i], &v, 1);
                FK_TRY(nonfinite(t, r, i, v));
            }
        return FK_OK;
    }
    const float *dst = out;
    for (size_t i = 0; i < n; i++)
        if (!isfinite(dst[i]))
            FK_TRY(nonfinite(t, r, i, dst[i]));
    return FK_OK;
}

static int read_rows(struct fk_trace *t, int layer, enum fk_kind kind, const int32_t *sel,
                     int n_sel, int raw, void *out)
{
    const struct fk_trace_info *in = &t->info;
    if (layer < 0 || layer >= in->n_layers)
        return fk_err(FK_EINVAL, "%s: layer %d out of range", t->path, layer);
    if (kind == FK_KIND_Q && !in->has_queries)
        return fk_err(FK_ECORRUPT, "%s: the trace has no queries (layers/Lxx/queries)",
                      t->path);
    char name[64];
    snprintf(name, sizeof name, "/layers/L%02d/%s", layer, kind_name(kind));
    int H = kind == FK_KIND_Q ? in->n_q_heads : in->n_kv_heads;
    int all_rows = kind == FK_KIND_Q ? in->n_queries : in->n_tokens;
    int rows = sel ? n_sel : all_rows;
    for (int i = 0; sel && i < n_sel; i++)
        if (sel[i] < 0 || sel[i] >= all_rows || (i > 0 && sel[i] <= sel[i - 1]))
            return fk_err(FK_EINVAL, "%s: %s: row selection entry %d = %d: expected strictly "
                          "increasing rows in [0, %d)", t->path, name, i, sel[i], all_rows);
    size_t n = (size_t)H * (size_t)rows * (size_t)in->head_dim;
    if (n == 0)
        return FK_OK;
    hid_t ds = H5Dopen2(t->file, name, H5P_DEFAULT);
    if (ds < 0)
        return fk_err(FK_ECORRUPT, "%s: cannot open dataset %s", t->path, name);
    hid_t fsp = H5S_ALL, msp = H5S_ALL;
    enum fk_encoding enc = FK_ENC_F32;
    int rc = parse_encoding(t, ds, name, &enc);
    if (rc == FK_OK && sel)
        rc = select_rows(t, ds, name, H, sel, n_sel, &fsp, &msp);
    if (rc == FK_OK && enc != FK_ENC_F32)
        rc = read_16bit(t, ds, name, enc, msp, fsp, n, raw, out);
    else if (rc == FK_OK && H5Dread(ds, H5T_NATIVE_FLOAT, msp, fsp, H5P_DEFAULT, out) < 0)
        rc = fk_err(FK_ECORRUPT, "%s: cannot read dataset %s (truncated?)", t->path, name);
    if (msp != H5S_ALL && msp >= 0)
        H5Sclose(msp);
    if (fsp != H5S_ALL && fsp >= 0)
        H5Sclose(fsp);
    H5Dclose(ds);
    if (rc != FK_OK)
        return rc;
    struct rows_read r = {.name = name, .layer = layer, .rows = rows, .kind = kind, .sel = sel};
    return check_finite(t, &r, enc, raw, n, out);
}

int fk_trace_read(struct fk_trace *t, int layer, enum fk_kind kind, float *dst)
{
    return read_rows(t, layer, kind, NULL, 0, 0, dst);
}

int fk_trace_encoding(struct fk_trace *t, int layer, enum fk_kind kind, enum fk_encoding *enc)
{
    if (layer < 0 || layer >= t->info.n_layers)
        return fk_err(FK_EINVAL, "%s: layer %d out of range", t->path, layer);
    char name[64];
    snprintf(name, sizeof name, "/layers/L%02d/%s", layer, kind_name(kind));
    hid_t ds = H5Dopen2(t->file, name, H5P_DEFAULT);
    if (ds < 0)
        return fk_err(FK_ECORRUPT, "%s: cannot open dataset %s", t->path, name);
    int rc = parse_encoding(t, ds, name, enc);
    H5Dclose(ds);
    return rc;
}

int fk_trace_read_stored(struct fk_trace *t, int layer, enum fk_kind kind, void *dst)
{
    return read_rows(t, layer, kind, NULL, 0, 1, dst);
}

int fk_trace_read_query_rows(struct fk_trace *t, int layer, const int32_t *rows, int n_rows,
                             float *dst)
{
    if (n_rows < 0 || (n_rows > 0 && !rows))
        return fk_err(FK_EINVAL, "%s: query rows: expected a list of %d rows", t->path, n_rows);
    if (n_rows == 0)
        return t->info.has_queries ? FK_OK
                                   : fk_err(FK_ECORRUPT, "%s: the trace has no queries "
                                            "(layers/Lxx/queries)", t->path);
    return read_rows(t, layer, FK_KIND_Q, rows, n_rows, 0, dst);
}

int fk_trace_read_query_idx(struct fk_trace *t, int layer, int32_t *dst)
{
    char name[64];
    snprintf(name, sizeof name, "/layers/L%02d/query_token_idx", layer);
    FK_TRY(read_ints(t, name, t->info.n_queries, H5T_NATIVE_INT32, dst));
    for (int i = 0; i < t->info.n_queries; i++)
        if (dst[i] < 0 || dst[i] >= t->info.n_tokens)
            return fk_err(FK_ECORRUPT, "%s: %s[%d] = %d, expected a token index in [0, %d)",
                          t->path, name, i, dst[i], t->info.n_tokens);
    return FK_OK;
}

/* ---- writer ------------------------------------------------------------------------- */

/* The RoPE attributes of a trace whose info says has_rope (rope_theta, which is also the
 * base of info->rope, is written apart). */
static int put_rope(hid_t f, const struct fk_trace_info *info)
{
    struct fk_rope rr = info->rope;
    const struct fk_rope *r = &rr;
    rr.theta = info->rope_theta;
    FK_TRY(fk_rope_check(r, info->head_dim));
    FK_TRY(fk_h5_put_str(f, "rope_layout", fk_rope_layout_names[r->layout]));
    FK_TRY(fk_h5_put_str(f, "rope_type", fk_rope_type_names[r->type]));
    if (r->type != FK_ROPE_LLAMA3)
        return FK_OK;
    FK_TRY(fk_h5_put_f64(f, "rope_factor", r->factor));
    FK_TRY(fk_h5_put_f64(f, "rope_low_freq_factor", r->low_freq_factor));
    FK_TRY(fk_h5_put_f64(f, "rope_high_freq_factor", r->high_freq_factor));
    return fk_h5_put_f64(f, "rope_original_max_position", r->original_max_position);
}

int fk_trace_create(const char *path, const struct fk_trace_info *info, enum fk_encoding enc,
                    struct fk_trace_writer **out)
{
    *out = NULL;
    if (info->n_layers < 1 || info->n_kv_heads < 1 || info->n_q_heads < 1 ||
        info->head_dim < 1 || info->n_tokens < 0 || info->n_q_heads % info->n_kv_heads)
        return fk_err(FK_EINVAL, "%s: invalid trace shape (layers %d, heads %d/%d, dim %d)",
                      path, info->n_layers, info->n_q_heads, info->n_kv_heads, info->head_dim);
    struct fk_trace_writer *w = calloc(1, sizeof *w);
    if (!w)
        return fk_err(FK_ENOMEM, "out of memory");
    size_t n = strlen(path);
    w->path = strdup(path);
    w->tmp = malloc(n + 5);
    w->file = -1;
    w->layers = -1;
    if (!w->path || !w->tmp) {
        fk_trace_abort(&w);
        return fk_err(FK_ENOMEM, "out of memory");
    }
    memcpy(w->tmp, path, n);
    memcpy(w->tmp + n, ".tmp", 5);
    w->info = *info;
    w->enc = enc;
    w->file = H5Fcreate(w->tmp, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (w->file < 0) {
        fk_trace_abort(&w);
        return fk_err(FK_EIO, "%s: cannot create (directory missing or not writable?)", path);
    }
    hid_t f = w->file;
    int rc = fk_h5_put_str(f, "schema", FK_TRACE_SCHEMA);
    if (!rc) rc = fk_h5_put_i64(f, "schema_version", FK_TRACE_VERSION);
    if (!rc) rc = fk_h5_put_str(f, "model_id", info->model_id);
    if (!rc) rc = fk_h5_put_i64(f, "num_layers", info->n_layers);
    if (!rc) rc = fk_h5_put_i64(f, "num_q_heads", info->n_q_heads);
    if (!rc) rc = fk_h5_put_i64(f, "num_kv_heads", info->n_kv_heads);
    if (!rc) rc = fk_h5_put_i64(f, "head_dim", info->head_dim);
    if (!rc) rc = fk_h5_put_i64(f, "keys_post_rope", info->keys_post_rope);
    if (!rc) rc = fk_h5_put_f64(f, "rope_theta", info->rope_theta);
    if (!rc) rc = fk_h5_put_str(f, "source", info->source);
    if (!rc && info->has_rope)
        rc = put_rope(f, info);
    if (!rc) rc = fk_h5_put_i64(f, "prompt_len", info->prompt_len);
    if (!rc) {
        hid_t g = H5Gcreate2(f, "tokens", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        w->layers = H5Gcreate2(f, "layers", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        if (g < 0 || w->layers < 0)
            rc = fk_err(FK_EIO, "%s: cannot create groups", w->tmp);
        if (g >= 0)
            H5Gclose(g);
    }
    if (rc) {
        fk_trace_abort(&w);
        return fk_err_context(rc, "%s", path);
    }
    *out = w;
    return FK_OK;
}

int fk_trace_put_attr(struct fk_trace_writer *w, const char *name, const char *value)
{
    return fk_h5_put_str(w->file, name, value);
}

int fk_trace_write_tokens(struct fk_trace_writer *w, const int32_t *positions,
                          const uint8_t *phase, const int32_t *ids)
{
    hsize_t d[1] = {(hsize_t)w->info.n_tokens};
    FK_TRY(fk_h5_write(w->file, "/tokens/positions", H5T_STD_I32LE, H5T_NATIVE_INT32, 1, d, 0, 0,
                       positions));
    FK_TRY(fk_h5_write(w->file, "/tokens/phase", H5T_STD_U8LE, H5T_NATIVE_UINT8, 1, d, 0, 0,
                       phase));
    if (ids)
        FK_TRY(fk_h5_write(w->file, "/tokens/ids", H5T_STD_I32LE, H5T_NATIVE_INT32, 1, d, 0, 0,
                           ids));
    return FK_OK;
}

int fk_trace_write_layer(struct fk_trace_writer *w, int layer, enum fk_kind kind,
                         const float *data, const int32_t *qidx)
{
    const struct fk_trace_info *in = &w->info;
    if (layer < 0 || layer >= in->n_layers)
        return fk_err(FK_EINVAL, "%s: layer %d out of range", w->path, layer);
    if (kind == FK_KIND_Q && in->n_queries < 1) /* the reader refuses a queries array of no rows */
        return fk_err(FK_EINVAL, "%s: queries written with n_queries = %d (set it to the rows "
                      "written, >= 1)", w->path, in->n_queries);
    char g[32], name[64];
    snprintf(g, sizeof g, "L%02d", layer);
    hid_t grp;
    if (H5Lexists(w->layers, g, H5P_DEFAULT) > 0)
        grp = H5Gopen2(w->layers, g, H5P_DEFAULT);
    else
        grp = H5Gcreate2(w->layers, g, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (grp < 0)
        return fk_err(FK_EIO, "%s: cannot create group /layers/%s", w->tmp, g);
    int H = kind == FK_KIND_Q ? in->n_q_heads : in->n_kv_heads;
    int rows = kind == FK_KIND_Q ? in->n_queries : in->n_tokens;
    size_t n = (size_t)H * (size_t)rows * (size_t)in->head_dim;
    hsize_t dims[3] = {(hsize_t)H, (hsize_t)rows, (hsize_t)in->head_dim};
    snprintf(name, sizeof name, "%s", kind_name(kind));
    int rc = FK_OK;
    static const char *const enc_names[] = {"float32", "float16", "bfloat16"};
    for (size_t i = 0; i < n; i++) {
        float a = fabsf(data[i]);
        /* finite values the encoding cannot hold would silently become inf; non-finite
         * values are recorded as given (the reader reports them) */
        int bad = isfinite(data[i]) && ((w->enc == FK_ENC_F16 && a >= 65520.0f) ||
                                        (w->enc == FK_ENC_BF16 && a > 3.3895e38f));
        if (bad) {
            size_t per = (size_t)rows * (size_t)in->head_dim;
            H5Gclose(grp);
            return fk_err(FK_EINVAL,
                          "%s: layer %d %s: value %g at head %zu, row %zu does not fit the %s "
                          "encoding (it would become infinite)",
                          w->path, layer, kind_name(kind), (double)data[i], i / per,
                          (i % per) / (size_t)in->head_dim,
                          w->enc == FK_ENC_F16 ? "float16" : w->enc == FK_ENC_BF16 ? "bfloat16"
                                                                                   : "float32");
        }
    }
    if (w->enc == FK_ENC_F32) {
        rc = fk_h5_write(grp, name, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 3, dims, 1, 256, data);
    } else {
        uint16_t *buf = malloc(n * 2 + 2);
        if (!buf) {
            H5Gclose(grp);
            return fk_err(FK_ENOMEM, "out of memory");
        }
        hid_t ft;
        if (w->enc == FK_ENC_F16) {
            fk_f32_to_f16(data, buf, n);
            ft = fk_h5_f16_type();
            H5Tset_order(ft, H5Tget_order(H5T_NATIVE_FLOAT));
        } else {
            fk_f32_to_bf16(data, buf, n);
            ft = H5Tcopy(H5T_NATIVE_UINT16);
        }
        hid_t file_t = w->enc == FK_ENC_F16 ? fk_h5_f16_type() : H5Tcopy(H5T_STD_U16LE);
        rc = fk_h5_write(grp, name, file_t, ft, 3, dims, 1, 256, buf);
        H5Tclose(file_t);
        H5Tclose(ft);
        free(buf);
    }
    if (rc == FK_OK) {
        hid_t ds = H5Dopen2(grp, name, H5P_DEFAULT);
        rc = fk_h5_put_str(ds, "encoding", enc_names[w->enc]);
        H5Dclose(ds);
    }
    if (rc == FK_OK && kind == FK_KIND_Q) {
        hsize_t qd[1] = {(hsize_t)in->n_queries};
        rc = fk_h5_write(grp, "query_token_idx", H5T_STD_I32LE, H5T_NATIVE_INT32, 1, qd, 0, 0,
                         qidx);
    }
    H5Gclose(grp);
    if (rc)
        return fk_err_context(rc, "%s: layer %d %s", w->path, layer, kind_name(kind));
    return FK_OK;
}

int fk_trace_finish(struct fk_trace_writer **wp)
{
    struct fk_trace_writer *w = *wp;
    int rc = FK_OK;
    if (w->layers >= 0)
        H5Gclose(w->layers);
    w->layers = -1;
    if (H5Fclose(w->file) < 0)
        rc = fk_err(FK_EIO, "%s: closing the file failed (disk full?)", w->tmp);
    w->file = -1;
    if (rc == FK_OK && rename(w->tmp, w->path) != 0)
        rc = fk_err(FK_EIO, "%s: cannot rename %s into place", w->path, w->tmp);
    if (rc != FK_OK) {
        fk_trace_abort(wp);
        return rc;
    }
    free(w->tmp);
    free(w->path);
    free(w);
    *wp = NULL;
    return FK_OK;
}

void fk_trace_abort(struct fk_trace_writer **wp)
{
    struct fk_trace_writer *w = wp ? *wp : NULL;
    if (!w)
        return;
    if (w->layers >= 0)
        H5Gclose(w->layers);
    if (w->file >= 0)
        H5Fclose(w->file);
    if (w->tmp)
        remove(w->tmp);
    free(w->tmp);
    free(w->path);
    free(w);
    *wp = NULL;
}

int fk_trace_verify(struct fk_trace *t, struct fk_trace_verify *vf)
{
    memset(vf, 0, sizeof *vf);
    const struct fk_trace_info *in = &t->info;
    size_t kv = (size_t)in->n_kv_heads * in->n_tokens * in->head_dim;
    size_t q = in->has_queries ? (size_t)in->n_q_heads * in->n_queries * in->head_dim : 0;
    float *buf = malloc(sizeof(float) * (kv > q ? kv : q) + 1);
    if (!buf)
        return fk_err(FK_ENOMEM, "out of memory (%s)", t->path);
    t->vf = vf;
    for (int l = 0; l < in->n_layers; l++)
        for (int k = 0; k < (in->has_queries ? 3 : 2); k++) {
            vf->datasets++;
            if (fk_trace_read(t, l, (enum fk_kind)k, buf) == FK_OK)
                continue;
            /* anything else (encoding, shape, truncation): described, and the scan goes on */
            if (vf->n_issues < FK_VERIFY_MAX)
                snprintf(vf->issue[vf->n_issues++], sizeof vf->issue[0], "%s", fk_errmsg());
            vf->n_unreadable++;
            fk_err_clear();
        }
    t->vf = NULL;
    free(buf);
    return FK_OK;
}

/* Attribute `name` of obj as a number: a string holding one ("none": *v = 0) or a numeric
 * attribute; 0 when absent. FK_ECORRUPT naming the file, the object and what was found. */
static int layer_num(hid_t obj, const char *file, const char *grp, const char *name,
                     double *v)
{
    *v = 0;
    if (!fk_h5_has_attr(obj, name))
        return FK_OK;
    hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
    hid_t ty = a >= 0 ? H5Aget_type(a) : -1;
    int is_str = ty >= 0 && H5Tget_class(ty) == H5T_STRING, rc = FK_OK;
    if (!is_str && (ty < 0 || H5Aread(a, H5T_NATIVE_DOUBLE, v) < 0))
        rc = fk_err(FK_ECORRUPT, "%s: %s: attribute '%s' is neither a number nor a string",
                    file, grp, name);
    if (ty >= 0)
        H5Tclose(ty);
    if (a >= 0)
        H5Aclose(a);
    if (rc < 0 || !is_str)
        return rc;
    char buf[64], *end;
    FK_TRY(fk_h5_attr_str(obj, file, name, buf, sizeof buf));
    if (!strcmp(buf, "none") || !buf[0])
        return FK_OK;
    *v = strtod(buf, &end);
    if (*end || !isfinite(*v) || *v < 0)
        return fk_err(FK_ECORRUPT, "%s: %s: attribute '%s' = \"%s\": expected a number >= 0 "
                      "or \"none\"", file, grp, name, buf);
    return FK_OK;
}

int fk_trace_layer_attention(struct fk_trace *t, int layer, double *inv_scale,
                             double *softcap, int *window)
{
    *inv_scale = *softcap = 0;
    *window = 0;
    char grp[32];
    snprintf(grp, sizeof grp, "/layers/L%02d", layer);
    hid_t g = H5Gopen2(t->file, grp, H5P_DEFAULT);
    if (g < 0)
        return fk_err(FK_ECORRUPT, "%s: cannot open group %s", t->path, grp);
    double sc = 0, w = 0;
    int rc = layer_num(g, t->path, grp, "scaling", &sc);
    if (rc == FK_OK)
        rc = layer_num(g, t->path, grp, "softcap", softcap);
    if (rc == FK_OK)
        rc = layer_num(g, t->path, grp, "sliding_window", &w);
    H5Gclose(g);
    FK_TRY(rc);
    *inv_scale = sc > 0 ? 1.0 / sc : 0;
    *window = w >= 1 && w < 2147483647.0 ? (int)w : 0;
    return FK_OK;
}
