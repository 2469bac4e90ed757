/* SPDX-License-Identifier: MIT
 * fk_correlate (codecs/kernels/fk_omp.c) for a few vectors, where it may compute the
 * correlations itself instead of calling OpenBLAS: its results must be bit-identical to
 * the SGEMM it replaces (the oracle, called here directly) for every shape, those where
 * OpenBLAS takes its small-matrix kernels (another summation order) included, and on data
 * other than the probe's (signed zeros, magnitudes far apart, a NaN).
 */
#include <cblas.h>
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fk_check_main.h"
#include "kernels/fk_sparse.h"

static unsigned long long g_rng = 88172645463325252ull;

static float next(void)
{
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    /* magnitudes over 2^-12 .. 2^12, both signs, some exact zeros of either sign */
    unsigned r = (unsigned)(g_rng >> 40);
    if (r % 97 == 0)
        return r & 1 ? -0.0f : 0.0f;
    return ldexpf((float)(r & 0xffff) / 65536.0f + 0.5f, (int)(r >> 16 & 15) - 7) *
           (r & 0x100000 ? -1.0f : 1.0f);
}

static int check_shape(int nx, int N, int m, int with_nan)
{
    float *d = malloc(sizeof(float) * (size_t)N * m), *x = malloc(sizeof(float) * nx * m);
    float *a = malloc(sizeof(float) * (size_t)nx * N), *b = malloc(sizeof(float) * nx * N);
    ck_assert(d && x && a && b);
    for (int i = 0; i < N * m; i++)
        d[i] = next();
    for (int i = 0; i < nx * m; i++)
        x[i] = next();
    if (with_nan)
        x[m / 2] = NAN;
    struct fk_dict_view v = {.atoms = d, .n_atoms = N, .m = m};
    fk_correlate(&v, x, nx, a);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nx, N, m, 1.0f, x, m, d, m, 0.0f, b, N);
    int bad = 0;
    for (int i = 0; i < nx * N; i++)
        bad += memcmp(&a[i], &b[i], sizeof(float)) != 0 && !(isnan(a[i]) && isnan(b[i]));
    ck_assert_msg(!bad, "nx %d, N %d, m %d%s: %d of %d correlations differ from the SGEMM's",
                  nx, N, m, with_nan ? " (a NaN)" : "", bad, nx * N);
    free(d);
    free(x);
    free(a);
    free(b);
    return fk_correlate_uses_chain(nx, N, m);
}

START_TEST(few_vectors_equal_sgemm)
{
    openblas_set_num_threads(1);
    static const int Ns[] = {1, 7, 12, 13, 128, 130, 200, 1024, 1031, 4100};
    static const int ms[] = {16, 24, 64, 128, 257};
    int chains = 0, shapes = 0;
    for (int nx = 1; nx <= 17; nx++)
        for (size_t a = 0; a < sizeof Ns / sizeof *Ns; a++)
            for (size_t b = 0; b < sizeof ms / sizeof *ms; b++) {
                if ((size_t)nx * Ns[a] * ms[b] > (1u << 22))
                    continue;
                chains += check_shape(nx, Ns[a], ms[b], 0);
                shapes++;
            }
    chains += check_shape(8, 1024, 128, 1);
    printf("fk_correlate: %d of %d shapes computed by its own chains (%s kernels)\n", chains,
           shapes + 1, openblas_get_corename());
}
END_TEST

int main(void)
{
    Suite *s = suite_create("correlate");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, few_vectors_equal_sgemm);
    suite_add_tcase(s, tc);
    return fk_suite_run(s);
}
