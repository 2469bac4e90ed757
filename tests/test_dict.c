/* SPDX-License-Identifier: MIT
 * Tests of the dictionary file v1 (datasets/formats/fk_dict.h): save/load round trip with
 * renormalisation checked against a double-precision normalisation, dead and non-finite
 * atoms, files made bad by editing with the HDF5 C API, the trace compatibility check, and
 * the Gram matrix against a naive double-precision D^T D with planted duplicates.
 */
#include <check.h>
#include <dirent.h>
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
#include "formats/fk_dict.h"
#include "common/fk_err.h"
#include "formats/fk_h5.h"

enum { NL = 2, M = 8, NA = 16 }; /* layers, head_dim, atoms */

static char g_dir[64]; /* scratch directory of this test process */

static void dir_setup(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/fk_test_dict_XXXXXX");
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

static void msg_has(const char *msg, ...)
{
    va_list ap;
    va_start(ap, msg);
    const char *s;
    while ((s = va_arg(ap, const char *)) != NULL)
        ck_assert_msg(strstr(msg, s) != NULL, "message \"%s\" lacks \"%s\"", msg, s);
    va_end(ap);
}

/* Atoms [NL][2][NA][M], gaussian directions with norms in [0.25, 4). */
static float *gen_atoms(unsigned long seed)
{
    gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
    gsl_rng_set(r, seed);
    size_t n = (size_t)NL * 2 * NA * M;
    float *a = malloc(sizeof(float) * n);
    ck_assert_ptr_nonnull(a);
    for (size_t j = 0; j < n / M; j++) {
        double v[M], nn = 0;
        for (int c = 0; c < M; c++) {
            v[c] = gsl_ran_gaussian(r, 1.0);
            nn += v[c] * v[c];
        }
        double scale = ldexp(1.0, (int)gsl_rng_uniform_int(r, 4) - 2) *
                       (1 + gsl_rng_uniform(r)) / sqrt(nn);
        for (int c = 0; c < M; c++)
            a[j * M + c] = (float)(v[c] * scale);
    }
    gsl_rng_free(r);
    return a;
}

static float *atom(float *a, int l, int k, int j)
{
    return a + (((size_t)l * 2 + k) * NA + j) * M;
}

static void save_ok(const char *path, const float *a)
{
    static const char *const attrs[] = {"trained_on", "unit-test", "method", "ksvd", NULL};
    ck_assert_msg(fk_dict_save(path, NL, M, NA, a, attrs) == FK_OK, "%s", fk_errmsg());
}

static void expect_load_fail(const char *path, int code, ...)
{
    struct fk_dict *d = NULL;
    int rc = fk_dict_load(path, &d);
    ck_assert_msg(rc == code, "%s: rc %d, expected %d (%s)", path, rc, code, fk_errmsg());
    ck_assert_ptr_null(d);
    const char *msg = fk_errmsg();
    ck_assert_msg(strstr(msg, path) != NULL, "message \"%s\" does not name the file", msg);
    va_list ap;
    va_start(ap, code);
    const char *s;
    while ((s = va_arg(ap, const char *)) != NULL)
        ck_assert_msg(strstr(msg, s) != NULL, "message \"%s\" lacks \"%s\"", msg, s);
    va_end(ap);
}

/* ---- HDF5 editing helpers ----------------------------------------------------------- */

static hid_t h5_rw(const char *path)
{
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    ck_assert_msg(f >= 0, "cannot reopen %s", path);
    return f;
}

static void edit_attr_int(const char *path, const char *name, long long v)
{
    hid_t f = h5_rw(path);
    if (H5Aexists(f, name) > 0)
        H5Adelete(f, name);
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(f, name, H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT);
    ck_assert(a >= 0 && H5Awrite(a, H5T_NATIVE_LLONG, &v) >= 0);
    H5Aclose(a);
    H5Sclose(sp);
    H5Fclose(f);
}

static void edit_attr_str(const char *path, const char *name, const char *v)
{
    hid_t f = h5_rw(path);
    if (H5Aexists(f, name) > 0)
        H5Adelete(f, name);
    hid_t ty = H5Tcopy(H5T_C_S1);
    H5Tset_size(ty, strlen(v) + 1);
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(f, name, ty, sp, H5P_DEFAULT, H5P_DEFAULT);
    ck_assert(a >= 0 && H5Awrite(a, ty, v) >= 0);
    H5Aclose(a);
    H5Sclose(sp);
    H5Tclose(ty);
    H5Fclose(f);
}

static void edit_del_link(const char *path, const char *name)
{
    hid_t f = h5_rw(path);
    ck_assert_msg(H5Ldelete(f, name, H5P_DEFAULT) >= 0, "cannot delete %s", name);
    H5Fclose(f);
}

static void edit_put_ds(const char *path, const char *name, int rank, const hsize_t *dims,
                        const float *data)
{
    hid_t f = h5_rw(path);
    if (H5Lexists(f, name, H5P_DEFAULT) > 0)
        H5Ldelete(f, name, H5P_DEFAULT);
    hid_t sp = H5Screate_simple(rank, dims, NULL);
    hid_t ds = H5Dcreate2(f, name, H5T_IEEE_F32LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    ck_assert(ds >= 0 && H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0);
    H5Dclose(ds);
    H5Sclose(sp);
    H5Fclose(f);
}

/* ---- 1. save / load ------------------------------------------------------------------ */

START_TEST(test_round_trip)
{
    char p[512], tmp[600];
    pth(p, sizeof p, "dict.h5");
    snprintf(tmp, sizeof tmp, "%s.tmp", p);
    float *a = gen_atoms(1);
    memset(atom(a, 1, 1, 5), 0, sizeof(float) * M); /* dead: zero */
    for (int c = 0; c < M; c++)
        atom(a, 0, 0, 9)[c] = 1e-14f; /* dead: norm 2.8e-14 < 1e-12 */
    atom(a, 0, 1, 2)[0] = 3.0f;      /* a live atom that is not dead although sparse */
    for (int c = 1; c < M; c++)
        atom(a, 0, 1, 2)[c] = 0;
    save_ok(p, a);
    ck_assert(exists(p) && !exists(tmp));

    /* oracle: double-precision norms of what was saved, excluding the dead atoms */
    double maxdev = 0;
    for (int l = 0; l < NL; l++)
        for (int k = 0; k < 2; k++)
            for (int j = 0; j < NA; j++) {
                const float *x = atom(a, l, k, j);
                double nn = 0;
                for (int c = 0; c < M; c++)
                    nn += (double)x[c] * x[c];
                nn = sqrt(nn);
                if (nn >= 1e-12 && fabs(nn - 1) > maxdev)
                    maxdev = fabs(nn - 1);
            }
    ck_assert(maxdev > 0.5); /* norms were far from 1: renormalisation is exercised */

    struct fk_dict *d = NULL;
    ck_assert_msg(fk_dict_load(p, &d) == FK_OK, "%s", fk_errmsg());
    ck_assert_int_eq(d->n_layers, NL);
    ck_assert_int_eq(d->head_dim, M);
    ck_assert_int_eq(d->n_atoms, NA);
    ck_assert_str_eq(d->path, p);
    ck_assert_int_eq(d->n_dead, 2);
    ck_assert_msg(fabs(d->max_norm_dev - maxdev) <= 1e-12 * (1 + maxdev),
                  "max_norm_dev %.17g, expected %.17g", d->max_norm_dev, maxdev);
    for (int l = 0; l < NL; l++) {
        for (int k = 0; k < 2; k++) {
            struct fk_base_dict b;
            fk_dict_base(d, l, k, &b);
            ck_assert_int_eq(b.n_atoms, NA);
            ck_assert_int_eq(b.m, M);
            ck_assert_ptr_null(b.gram);
            for (int j = 0; j < NA; j++) {
                const float *x = atom(a, l, k, j), *y = b.atoms + (size_t)j * M;
                int want_dead = (l == 1 && k == 1 && j == 5) || (l == 0 && k == 0 && j == 9);
                ck_assert_msg(b.dead[j] == want_dead, "L%d k%d atom %d: dead %d", l, k, j,
                              b.dead[j]);
                double nn = 0, ny = 0;
                for (int c = 0; c < M; c++) {
                    nn += (double)x[c] * x[c];
                    ny += (double)y[c] * y[c];
                }
                if (want_dead) {
                    ck_assert(ny == 0);
                    continue;
                }
                ck_assert_msg(fabs(sqrt(ny) - 1) < 1e-6, "atom %d norm %.9g", j, sqrt(ny));
                for (int c = 0; c < M; c++)
                    ck_assert_msg(fabs(y[c] - x[c] / sqrt(nn)) < 1e-6,
                                  "L%d k%d atom %d [%d]: %g vs %g", l, k, j, c, y[c],
                                  x[c] / sqrt(nn));
            }
        }
    }
    fk_dict_free(&d);
    ck_assert_ptr_null(d);
    fk_dict_free(&d); /* NULL is fine */

    /* provenance attributes are stored as strings */
    hid_t f = H5Fopen(p, H5F_ACC_RDONLY, H5P_DEFAULT);
    ck_assert(f >= 0);
    char buf[64];
    ck_assert_int_eq(fk_h5_attr_str(f, p, "method", buf, sizeof buf), FK_OK);
    ck_assert_str_eq(buf, "ksvd");
    ck_assert_int_eq(fk_h5_attr_str(f, p, "trained_on", buf, sizeof buf), FK_OK);
    ck_assert_str_eq(buf, "unit-test");
    H5Fclose(f);

    /* unit atoms: max_norm_dev close to 0 */
    float *u = gen_atoms(2);
    for (size_t j = 0; j < (size_t)NL * 2 * NA; j++) {
        double nn = 0;
        for (int c = 0; c < M; c++)
            nn += (double)u[j * M + c] * u[j * M + c];
        for (int c = 0; c < M; c++)
            u[j * M + c] = (float)(u[j * M + c] / sqrt(nn));
    }
    save_ok(p, u); /* overwrites */
    ck_assert_int_eq(fk_dict_load(p, &d), FK_OK);
    ck_assert_int_eq(d->n_dead, 0);
    ck_assert_msg(d->max_norm_dev < 1e-6, "max_norm_dev %g", d->max_norm_dev);
    fk_dict_free(&d);
    free(u);
    free(a);
}
END_TEST

START_TEST(test_nonfinite)
{
    char p[512];
    float *a = gen_atoms(3);
    pth(p, sizeof p, "nan.h5");
    atom(a, 0, 0, 3)[4] = NAN;
    save_ok(p, a);
    expect_load_fail(p, FK_ECORRUPT, "/layers/L00/keys", "atom 3", NULL);
    atom(a, 0, 0, 3)[4] = 0.5f;
    pth(p, sizeof p, "inf.h5");
    atom(a, 1, 1, 15)[0] = -INFINITY;
    save_ok(p, a);
    expect_load_fail(p, FK_ECORRUPT, "/layers/L01/values", "atom 15", NULL);
    free(a);
}
END_TEST

START_TEST(test_bad_files)
{
    char p[512];
    float *a = gen_atoms(4);

    pth(p, sizeof p, "missing.h5");
    expect_load_fail(p, FK_EIO, NULL);

    pth(p, sizeof p, "text.h5");
    FILE *fp = fopen(p, "w");
    ck_assert_ptr_nonnull(fp);
    fputs("not a dictionary\n", fp);
    fclose(fp);
    expect_load_fail(p, FK_ECORRUPT, "HDF5", NULL);

    pth(p, sizeof p, "schema.h5");
    save_ok(p, a);
    edit_attr_str(p, "schema", "fadkv-trace");
    expect_load_fail(p, FK_ECORRUPT, "schema", "fadkv-trace", "fadkv-dict", NULL);

    pth(p, sizeof p, "version.h5");
    save_ok(p, a);
    edit_attr_int(p, "schema_version", 2);
    expect_load_fail(p, FK_ECORRUPT, "schema_version = 2", NULL);

    pth(p, sizeof p, "noattr.h5");
    save_ok(p, a);
    hid_t f = h5_rw(p);
    ck_assert(H5Adelete(f, "atoms") >= 0);
    H5Fclose(f);
    expect_load_fail(p, FK_ECORRUPT, "atoms", NULL);

    pth(p, sizeof p, "nods.h5");
    save_ok(p, a);
    edit_del_link(p, "/layers/L01/values");
    expect_load_fail(p, FK_ECORRUPT, "/layers/L01/values", NULL);

    pth(p, sizeof p, "nolayer.h5");
    save_ok(p, a);
    edit_attr_int(p, "num_layers", 3);
    expect_load_fail(p, FK_ECORRUPT, "/layers/L02", NULL);

    pth(p, sizeof p, "shape.h5");
    save_ok(p, a);
    hsize_t wide[2] = {NA, M + 1};
    edit_put_ds(p, "/layers/L00/keys", 2, wide, a);
    expect_load_fail(p, FK_ECORRUPT, "/layers/L00/keys", "[16, 9]", "[16, 8]", NULL);

    pth(p, sizeof p, "rank.h5");
    save_ok(p, a);
    hsize_t r3[3] = {2, NA / 2, M};
    edit_put_ds(p, "/layers/L01/keys", 3, r3, a);
    expect_load_fail(p, FK_ECORRUPT, "/layers/L01/keys", "[16, 8]", NULL);

    pth(p, sizeof p, "few.h5");
    save_ok(p, a);
    edit_attr_int(p, "atoms", NA + 1);
    expect_load_fail(p, FK_ECORRUPT, "/layers/L00/keys", "[17, 8]", NULL);

    /* the writer refuses a directory that does not exist and leaves nothing */
    char q[600];
    snprintf(q, sizeof q, "%s/nodir/d.h5", g_dir);
    ck_assert_int_eq(fk_dict_save(q, NL, M, NA, a, NULL), FK_EIO);
    msg_has(fk_errmsg(), q, NULL);
    free(a);
}
END_TEST

/* ---- 2. compatibility with a trace -------------------------------------------------- */

START_TEST(test_check_trace)
{
    char p[512];
    pth(p, sizeof p, "d.h5");
    float *a = gen_atoms(5);
    save_ok(p, a);
    struct fk_dict *d = NULL;
    ck_assert_int_eq(fk_dict_load(p, &d), FK_OK);
    struct fk_trace_info ti;
    memset(&ti, 0, sizeof ti);
    ti.n_layers = NL;
    ti.head_dim = M;
    ti.n_q_heads = 4;
    ti.n_kv_heads = 2;
    ck_assert_int_eq(fk_dict_check_trace(d, &ti, "/data/t.h5"), FK_OK);
    ti.head_dim = 16;
    ck_assert_int_lt(fk_dict_check_trace(d, &ti, "/data/t.h5"), 0);
    msg_has(fk_errmsg(), p, "/data/t.h5", "head_dim", "8", "16", NULL);
    ti.head_dim = M;
    ti.n_layers = 3;
    ck_assert_int_lt(fk_dict_check_trace(d, &ti, "/data/t.h5"), 0);
    msg_has(fk_errmsg(), p, "/data/t.h5", "layers", "2", "3", NULL);
    fk_dict_free(&d);
    free(a);
}
END_TEST

/* ---- 3. Gram matrix ----------------------------------------------------------------- */

static void unit(float *x, int m)
{
    double nn = 0;
    for (int c = 0; c < m; c++)
        nn += (double)x[c] * x[c];
    for (int c = 0; c < m; c++)
        x[c] = (float)(x[c] / sqrt(nn));
}

START_TEST(test_gram)
{
    enum { N = 37, D = 11 };
    gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
    gsl_rng_set(r, 6);
    float *a = malloc(sizeof(float) * N * D);
    ck_assert_ptr_nonnull(a);
    for (int j = 0; j < N; j++) {
        for (int c = 0; c < D; c++)
            a[j * D + c] = (float)gsl_ran_gaussian(r, 1.0);
        unit(a + j * D, D);
    }
    /* planted near-duplicates: an exact copy, an antipode, a 1e-4 perturbation
     * (cosine about 1 - 5e-9: counted), and a 1.4e-2 one (cosine about 1 - 1e-4: not) */
    memcpy(a + 5 * D, a + 2 * D, sizeof(float) * D);
    for (int c = 0; c < D; c++)
        a[9 * D + c] = -a[3 * D + c];
    for (int c = 0; c < D; c++)
        a[12 * D + c] = a[7 * D + c] + (float)(1e-4 * gsl_ran_gaussian(r, 1.0) / sqrt(D));
    unit(a + 12 * D, D);
    for (int c = 0; c < D; c++)
        a[20 * D + c] = a[8 * D + c] + (float)(1.4e-2 * gsl_ran_gaussian(r, 1.0) / sqrt(D));
    unit(a + 20 * D, D);

    float *g = NULL;
    ck_assert_int_eq(fk_gram_build(a, N, D, &g), FK_OK);
    ck_assert_ptr_nonnull(g);
    double maxerr = 0;
    long naive_dups = 0;
    for (int i = 0; i < N; i++) {
        for (int j = 0; j < N; j++) {
            double s = 0;
            for (int c = 0; c < D; c++)
                s += (double)a[i * D + c] * a[j * D + c];
            double e = fabs(g[i * N + j] - s);
            if (e > maxerr)
                maxerr = e;
            ck_assert_msg(g[i * N + j] == g[j * N + i], "G not symmetric at (%d, %d)", i, j);
            if (i < j && fabs(s) > 1 - 1e-6)
                naive_dups++;
        }
    }
    ck_assert_msg(maxerr < 1e-5, "max |G - D^T D| = %g", maxerr);
    ck_assert_int_eq(naive_dups, 3);
    double c20 = 0;
    for (int c = 0; c < D; c++)
        c20 += (double)a[20 * D + c] * a[8 * D + c];
    ck_assert_msg(c20 < 1 - 1e-5 && c20 > 0.999, "control cosine %.9f", c20);

    ck_assert_int_eq(fk_gram_duplicates(g, N, NULL), 3);
    uint8_t dead[N];
    memset(dead, 0, sizeof dead);
    ck_assert_int_eq(fk_gram_duplicates(g, N, dead), 3);
    dead[5] = 1; /* a dead copy is not a duplicate */
    ck_assert_int_eq(fk_gram_duplicates(g, N, dead), 2);
    dead[5] = 0;
    dead[3] = 1; /* nor is the partner of a dead atom */
    ck_assert_int_eq(fk_gram_duplicates(g, N, dead), 2);
    dead[12] = 1;
    ck_assert_int_eq(fk_gram_duplicates(g, N, dead), 1);
    free(g);

    /* a single atom */
    ck_assert_int_eq(fk_gram_build(a, 1, D, &g), FK_OK);
    ck_assert(fabs(g[0] - 1) < 1e-6);
    ck_assert_int_eq(fk_gram_duplicates(g, 1, NULL), 0);
    free(g);
    free(a);
    gsl_rng_free(r);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("dict");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_unchecked_fixture(tc, dir_setup, dir_teardown); /* once, even on failure */
    tcase_add_test(tc, test_round_trip);
    tcase_add_test(tc, test_nonfinite);
    tcase_add_test(tc, test_bad_files);
    tcase_add_test(tc, test_check_trace);
    tcase_add_test(tc, test_gram);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    fk_hdf5_quiet();
    return fk_suite_run(suite());
}
