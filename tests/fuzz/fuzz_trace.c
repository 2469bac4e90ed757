/* SPDX-License-Identifier: MIT
 * libFuzzer target: the trace reader (datasets/formats/fk_trace.h) and the dictionary reader
 * (datasets/formats/fk_dict.h).
 *
 * HDF5 1.10.8 is not robust against byte-mutated files: fuzzing raw files crashes inside
 * HDF5 within seconds (README.md in this folder), which would hide every finding in our
 * code. So the input is a recipe instead: the target builds a well-formed HDF5 file through
 * the HDF5 API whose *content* is hostile to our readers -- attributes missing, of the wrong
 * type or with any value; token arrays absent, too short, of the wrong type, with any values;
 * layers missing or extra; datasets of the wrong rank, extent, type or encoding attribute;
 * values from the input bytes (NaN, inf, subnormals) -- then runs fk_trace_open,
 * fk_trace_read of every layer and kind, fk_trace_read_query_idx, fk_trace_attr and
 * fk_dict_load on it. Every error is fine but must name the file; crashes, sanitizer reports,
 * leaks, and an accepted trace whose info contradicts its file are findings.
 *
 * Every selector byte uses 0 for "as the format says", so an all-zero input builds a valid
 * trace (and a valid dictionary when the first byte is odd).
 */
#include <hdf5.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "formats/fk_dict.h"
#include "common/fk_err.h"
#include "formats/fk_h5.h"
#include "formats/fk_trace.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char g_path[4096];
static hid_t g_fapl = -1;
static volatile float g_sink;
static int g_debug; /* FK_FUZZ_DEBUG=1: print what the readers said, keep the file */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fk_hdf5_quiet();
    const char *dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(g_path, sizeof g_path, "%s/fk-fuzz-trace-%ld.h5", dir, (long)getpid());
    g_debug = getenv("FK_FUZZ_DEBUG") != NULL;
    g_fapl = H5Pcreate(H5P_FILE_ACCESS);
    H5Pset_libver_bounds(g_fapl, H5F_LIBVER_EARLIEST, H5F_LIBVER_LATEST);
    return 0;
}

/* ---- the recipe: a byte stream, zeros once exhausted ----------------------------------- */

struct src {
    const uint8_t *p;   /* next byte */
    size_t n;           /* bytes left */
};

static unsigned u8(struct src *s)
{
    if (!s->n)
        return 0;
    s->n--;
    return *s->p++;
}

static void bytes(struct src *s, void *dst, size_t n)
{
    size_t k = n < s->n ? n : s->n;
    memcpy(dst, s->p, k);
    memset((uint8_t *)dst + k, 0, n - k);
    s->p += k;
    s->n -= k;
}

/* ---- writing ------------------------------------------------------------------------------ */

static void put_str(hid_t obj, const char *name, const char *v)
{
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, strlen(v) + 1);
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(obj, name, t, sp, H5P_DEFAULT, H5P_DEFAULT);
    if (a >= 0) {
        H5Awrite(a, t, v);
        H5Aclose(a);
    }
    H5Sclose(sp);
    H5Tclose(t);
}

static void put_num(hid_t obj, const char *name, hid_t type, const void *v, hsize_t n)
{
    hid_t sp = n == 1 ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, &n, NULL);
    hid_t a = H5Acreate2(obj, name, type, sp, H5P_DEFAULT, H5P_DEFAULT);
    if (a >= 0) {
        H5Awrite(a, type, v);
        H5Aclose(a);
    }
    H5Sclose(sp);
}

/* An integer attribute: as given, absent, any value, of the wrong type, off by one, ... */
static void attr_int(struct src *s, hid_t obj, const char *name, int64_t good)
{
    unsigned sel = u8(s) % 10;
    int64_t v = good, two[2] = {good, good};
    double f = (double)good;
    switch (sel) {
    case 1:
        return;
    case 2:
        bytes(s, &v, sizeof v);
        break;
    case 3:
        put_str(obj, name, "12");
        return;
    case 4:
        bytes(s, &f, sizeof f); /* any double, NaN and |x| >= 2^63 included: fk_h5_attr_i64
                                 * refuses what int64_t cannot hold (B5, fixed) */
        put_num(obj, name, H5T_NATIVE_DOUBLE, &f, 1);
        return;
    case 5:
        v = good + 1;
        break;
    case 6:
        v = good - 1;
        break;
    case 7:
        put_num(obj, name, H5T_NATIVE_INT64, two, 2);
        return;
    case 8:
        v = (int64_t)(int8_t)u8(s);
        break;
    case 9: {
        uint8_t b = (uint8_t)good;
        put_num(obj, name, H5T_NATIVE_UINT8, &b, 1);
        return;
    }
    default:
        break;
    }
    put_num(obj, name, H5T_NATIVE_INT64, &v, 1);
}

static void attr_str(struct src *s, hid_t obj, const char *name, const char *good)
{
    unsigned sel = u8(s) % 5;
    int64_t one = 1;
    char buf[300];
    switch (sel) {
    case 1:
        return;
    case 2:
        put_num(obj, name, H5T_NATIVE_INT64, &one, 1);
        return;
    case 3: { /* any bytes, up to 299 (longer than the readers' buffers) */
        size_t n = u8(s) + 44;
        if (n > sizeof buf - 1)
            n = sizeof buf - 1;
        bytes(s, buf, n);
        buf[n] = 0;
        for (size_t i = 0; i < n; i++)
            if (!buf[i])
                buf[i] = 'x';
        put_str(obj, name, buf);
        return;
    }
    case 4:
        put_str(obj, name, "");
        return;
    default:
        put_str(obj, name, good);
    }
}

/* Values of n elements of the given element size: regular finite, input bytes, or zeros. */
static void *values(struct src *s, size_t n, size_t elem, int is_float32)
{
    uint8_t *buf = calloc(n ? n : 1, elem);
    if (!buf)
        abort();
    unsigned sel = u8(s) % 4;
    if (sel == 1) {
        bytes(s, buf, n * elem);
    } else if (sel == 2) {
        /* zeros */
    } else if (is_float32) {
        float *f = (float *)buf;
        for (size_t i = 0; i < n; i++)
            f[i] = (float)((double)(i % 7) * 0.25 - 0.75);
        if (sel == 3 && n) /* one value from the input */
            bytes(s, &f[u8(s) % n], 4);
    } else if (elem == 2) {
        uint16_t *h = (uint16_t *)buf;
        for (size_t i = 0; i < n; i++)
            h[i] = (uint16_t)(0x3c00 + (i % 5) * 0x100); /* 1.0 .. ~17 in f16, ~1e-2 bf16 */
        if (sel == 3 && n)
            bytes(s, &h[u8(s) % n], 2);
    } else {
        bytes(s, buf, n * elem);
    }
    return buf;
}

/* Writes dataset `name` under loc with the given extents, perturbed by the recipe. */
static void dataset(struct src *s, hid_t loc, const char *name, int rank, const hsize_t *want,
                    int float_data, int is_trace)
{
    unsigned shape = u8(s) % 8;
    if (shape == 1)
        return; /* absent */
    hsize_t dims[4] = {0, 0, 0, 0};
    memcpy(dims, want, sizeof(hsize_t) * (size_t)rank);
    int r = rank;
    if (shape >= 2 && shape <= 4) {
        int ax = (int)(shape - 2) % rank;
        dims[ax] = dims[ax] + (u8(s) & 1 ? 1 : (dims[ax] ? (hsize_t)-1 : 1));
    } else if (shape == 5) {
        r = rank > 1 ? rank - 1 : 2;
        if (r > rank)
            dims[1] = 1;
    } else if (shape == 6) {
        r = rank + 1;
        dims[rank] = 1;
    }
    size_t n = 1;
    for (int i = 0; i < r; i++)
        n *= (size_t)dims[i];
    if (n > 4096)
        return;
    hid_t ft, mt;
    size_t elem;
    int is_f32 = 0;
    unsigned type = float_data ? u8(s) % 7 : (u8(s) % 5 ? 10 : u8(s) % 7);
    switch (type) {
    case 1: ft = fk_h5_f16_type(); mt = H5Tcopy(ft); elem = 2; break;
    case 2: ft = H5Tcopy(H5T_STD_I16LE); mt = H5Tcopy(ft); elem = 2; break;
    case 3: ft = H5Tcopy(H5T_STD_U16LE); mt = H5Tcopy(ft); elem = 2; break;
    case 4: ft = H5Tcopy(H5T_STD_I32LE); mt = H5Tcopy(ft); elem = 4; break;
    case 5: ft = H5Tcopy(H5T_IEEE_F64LE); mt = H5Tcopy(ft); elem = 8; break;
    case 6: ft = H5Tcopy(H5T_STD_U8LE); mt = H5Tcopy(ft); elem = 1; break;
    case 10: ft = H5Tcopy(H5T_STD_I32LE); mt = H5Tcopy(ft); elem = 4; break;
    default: ft = H5Tcopy(H5T_IEEE_F32LE); mt = H5Tcopy(ft); elem = 4; is_f32 = 1; break;
    }
    void *buf = values(s, n, elem, is_f32);
    hid_t sp = H5Screate_simple(r, dims, NULL);
    hid_t ds = H5Dcreate2(loc, name, ft, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (ds >= 0) {
        if (n)
            H5Dwrite(ds, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf);
        if (float_data && is_trace) {
            static const char *const enc[] = {NULL, "float32", "float16", "bfloat16", "int8"};
            unsigned e = u8(s) % 6;
            const char *v = e == 0 ? (type == 1 ? "float16" : type == 2 || type == 3
                                                               ? "bfloat16" : "float32")
                                   : e < 5 ? enc[e] : NULL;
            if (v)
                put_str(ds, "encoding", v);
            else if (e == 5) {
                int64_t one = 1;
                put_num(ds, "encoding", H5T_NATIVE_INT64, &one, 1);
            }
        }
        H5Dclose(ds);
    }
    H5Sclose(sp);
    H5Tclose(ft);
    H5Tclose(mt);
    free(buf);
}

static void build_trace(struct src *s, hid_t f)
{
    int L = 1 + (int)(u8(s) % 3), hkv = 1 + (int)(u8(s) % 2), grp = 1 + (int)(u8(s) % 2);
    int hq = hkv * grp, d = 1 + (int)(u8(s) % 4), P = (int)(u8(s) % 4), D = (int)(u8(s) % 4);
    int T = P + D + 1;
    attr_str(s, f, "schema", FK_TRACE_SCHEMA);
    attr_int(s, f, "schema_version", FK_TRACE_VERSION);
    attr_str(s, f, "model_id", "fuzz");
    attr_str(s, f, "source", "synthetic");
    attr_int(s, f, "num_layers", L);
    attr_int(s, f, "num_q_heads", hq);
    attr_int(s, f, "num_kv_heads", hkv);
    attr_int(s, f, "head_dim", d);
    attr_int(s, f, "keys_post_rope", 1);
    attr_int(s, f, "prompt_len", P);
    attr_int(s, f, "rope_theta", 10000);
    attr_str(s, f, "prompt", "once upon a time");
    hid_t tok = H5Gcreate2(f, "tokens", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    hsize_t t1[1] = {(hsize_t)T};
    if (u8(s) % 4 == 0) { /* the format's own token arrays */
        int32_t pos[16];
        uint8_t ph[16];
        for (int i = 0; i < T; i++) {
            pos[i] = i;
            ph[i] = i >= P;
        }
        hid_t sp = H5Screate_simple(1, t1, NULL);
        hid_t a = H5Dcreate2(tok, "positions", H5T_STD_I32LE, sp, H5P_DEFAULT, H5P_DEFAULT,
                             H5P_DEFAULT);
        H5Dwrite(a, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, pos);
        H5Dclose(a);
        a = H5Dcreate2(tok, "phase", H5T_STD_U8LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        H5Dwrite(a, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, ph);
        H5Dclose(a);
        H5Sclose(sp);
    } else {
        dataset(s, tok, "positions", 1, t1, 0, 1);
        dataset(s, tok, "phase", 1, t1, 0, 1);
    }
    if (u8(s) & 1)
        dataset(s, tok, "ids", 1, t1, 0, 1);
    H5Gclose(tok);
    unsigned lsel = u8(s) % 4;
    if (lsel == 3)
        return; /* no /layers */
    hid_t layers = H5Gcreate2(f, "layers", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    int Lw = L + (lsel == 1 ? -1 : lsel == 2 ? 1 : 0);
    int queries = u8(s) % 3 != 1;
    int Tq = queries ? 1 + (int)(u8(s) % (unsigned)T) : 0;
    for (int l = 0; l < Lw; l++) {
        char g[16];
        snprintf(g, sizeof g, "L%02d", l);
        hid_t gl = H5Gcreate2(layers, g, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        hsize_t kv[3] = {(hsize_t)hkv, (hsize_t)T, (hsize_t)d};
        hsize_t qd[3] = {(hsize_t)hq, (hsize_t)Tq, (hsize_t)d};
        hsize_t qi[1] = {(hsize_t)Tq};
        dataset(s, gl, "keys", 3, kv, 1, 1);
        dataset(s, gl, "values", 3, kv, 1, 1);
        if (queries) {
            dataset(s, gl, "queries", 3, qd, 1, 1);
            if (u8(s) % 3 == 0) {
                int32_t idx[16];
                for (int i = 0; i < Tq; i++)
                    idx[i] = (int32_t)(T - Tq + i);
                hid_t sp = H5Screate_simple(1, qi, NULL);
                hid_t a = H5Dcreate2(gl, "query_token_idx", H5T_STD_I32LE, sp, H5P_DEFAULT,
                                     H5P_DEFAULT, H5P_DEFAULT);
                H5Dwrite(a, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, idx);
                H5Dclose(a);
                H5Sclose(sp);
            } else {
                dataset(s, gl, "query_token_idx", 1, qi, 0, 1);
            }
        }
        H5Gclose(gl);
    }
    H5Gclose(layers);
}

static void build_dict(struct src *s, hid_t f)
{
    int L = 1 + (int)(u8(s) % 3), d = 1 + (int)(u8(s) % 4), N = 1 + (int)(u8(s) % 6);
    attr_str(s, f, "schema", FK_DICT_SCHEMA);
    attr_int(s, f, "schema_version", FK_DICT_VERSION);
    attr_int(s, f, "num_layers", L);
    attr_int(s, f, "head_dim", d);
    attr_int(s, f, "atoms", N);
    unsigned lsel = u8(s) % 4;
    if (lsel == 3)
        return;
    int Lw = L + (lsel == 1 ? -1 : lsel == 2 ? 1 : 0);
    for (int l = 0; l < Lw; l++) {
        char g[32];
        snprintf(g, sizeof g, "/layers/L%02d", l);
        hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
        H5Pset_create_intermediate_group(lcpl, 1);
        hid_t gl = H5Gcreate2(f, g, lcpl, H5P_DEFAULT, H5P_DEFAULT);
        H5Pclose(lcpl);
        hsize_t dims[2] = {(hsize_t)N, (hsize_t)d};
        dataset(s, gl, "keys", 2, dims, 1, 0);
        dataset(s, gl, "values", 2, dims, 1, 0);
        H5Gclose(gl);
    }
}

/* ---- reading back -------------------------------------------------------------------------- */

static void named_or_abort(const char *what)
{
    if (g_debug)
        fprintf(stderr, "%s: %s\n", what, fk_errmsg());
    if (!strstr(fk_errmsg(), g_path)) {
        fprintf(stderr, "%s: error message does not name the file: %s\n", what, fk_errmsg());
        abort();
    }
}

static void read_trace(void)
{
    struct fk_trace *t = NULL;
    if (fk_trace_open(g_path, &t) != FK_OK) {
        if (t)
            abort();
        named_or_abort("fk_trace_open");
        return;
    }
    const struct fk_trace_info *in = fk_trace_get_info(t);
    if (g_debug)
        fprintf(stderr, "trace accepted: L %d, H %d/%d, d %d, T %d, P %d, Tq %d\n",
                in->n_layers, in->n_q_heads, in->n_kv_heads, in->head_dim, in->n_tokens,
                in->prompt_len, in->n_queries);
    if (in->n_layers < 1 || in->n_kv_heads < 1 || in->n_q_heads % in->n_kv_heads ||
        in->n_tokens < 1 || in->head_dim < 1 || in->prompt_len > in->n_tokens ||
        in->n_queries < 0 || (in->has_queries && in->n_queries < 1))
        abort();
    const uint8_t *ph = fk_trace_phase(t);
    const int32_t *pos = fk_trace_positions(t);
    for (int i = 0; i < in->n_tokens; i++)
        if (ph[i] != (i >= in->prompt_len) || pos[i] < 0)
            abort();
    size_t kv = (size_t)in->n_kv_heads * (size_t)in->n_tokens * (size_t)in->head_dim;
    size_t q = (size_t)in->n_q_heads * (size_t)in->n_queries * (size_t)in->head_dim;
    size_t cap = kv > q ? kv : q;
    float *buf = malloc(sizeof(float) * (cap ? cap : 1));
    int32_t *qi = malloc(sizeof(int32_t) * ((size_t)in->n_queries + 1));
    if (!buf || !qi)
        abort();
    for (int l = 0; l < in->n_layers; l++) {
        for (int k = 0; k < (in->has_queries ? 3 : 2); k++) {
            if (fk_trace_read(t, l, (enum fk_kind)k, buf) == FK_OK) {
                size_t n = k == FK_KIND_Q ? q : kv;
                for (size_t i = 0; i < n; i++)
                    if (!isfinite(buf[i]))
                        abort(); /* the reader promises finite values */
                if (n)
                    g_sink = buf[n - 1];
            } else {
                named_or_abort("fk_trace_read");
            }
        }
        if (in->has_queries) {
            if (fk_trace_read_query_idx(t, l, qi) == FK_OK) {
                for (int i = 0; i < in->n_queries; i++)
                    if (qi[i] < 0 || qi[i] >= in->n_tokens)
                        abort();
            } else {
                named_or_abort("fk_trace_read_query_idx");
            }
        }
    }
    free(buf);
    free(qi);
    (void)fk_trace_attr(t, "prompt");
    (void)fk_trace_attr(t, "model_id");
    (void)fk_trace_attr(t, "no_such_attribute");
    fk_trace_close(&t);
}

static void read_dict(void)
{
    struct fk_dict *d = NULL;
    if (fk_dict_load(g_path, &d) != FK_OK) {
        if (d)
            abort();
        named_or_abort("fk_dict_load");
        return;
    }
    if (g_debug)
        fprintf(stderr, "dictionary accepted: L %d, d %d, N %d\n", d->n_layers, d->head_dim,
                d->n_atoms);
    if (d->n_layers < 1 || d->head_dim < 1 || d->n_atoms < 1)
        abort();
    fk_dict_free(&d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 8192)
        return 0;
    struct src s = {data, size};
    unsigned mode = u8(&s);
    hid_t f = H5Fcreate(g_path, H5F_ACC_TRUNC, H5P_DEFAULT, g_fapl);
    if (f < 0)
        abort();
    if (mode & 1)
        build_dict(&s, f);
    else
        build_trace(&s, f);
    if (H5Fclose(f) < 0)
        abort();
    read_trace();
    read_dict();
    if (!g_debug)
        unlink(g_path);
    return 0;
}
