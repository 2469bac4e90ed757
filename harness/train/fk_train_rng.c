/* SPDX-License-Identifier: MIT
 * Random draws of dictionary training, with GSL's named generator (mt19937) seeded per
 * (layer, kind). Kept apart from the BLAS code: GSL's and OpenBLAS's cblas headers clash.
 */
#include <gsl/gsl_randist.h>
#include <gsl/gsl_rng.h>
#include <stdint.h>
#include <stdlib.h>

#include "common/fk_err.h"

int fk_train_rng_pick(uint64_t seed, long n, long k, long *out);
int fk_train_rng_gauss(uint64_t seed, long count, float *out);
int fk_train_rng_perm(uint64_t seed, long n, long *out);

static gsl_rng *make(uint64_t seed)
{
    gsl_rng *r = gsl_rng_alloc(gsl_rng_mt19937);
    if (r)
        gsl_rng_set(r, (unsigned long)(seed ^ (seed >> 32)));
    return r;
}

/* k distinct indices of 0..n-1 (k <= n), in the order drawn (Floyd's sampling avoided in
 * favour of a partial Fisher-Yates shuffle: exact, O(n)). */
int fk_train_rng_pick(uint64_t seed, long n, long k, long *out)
{
    long *perm = malloc(sizeof(long) * (size_t)(n > 0 ? n : 1));
    gsl_rng *r = make(seed);
    if (!perm || !r) {
        free(perm);
        gsl_rng_free(r);
        return fk_err(FK_ENOMEM, "out of memory");
    }
    for (long i = 0; i < n; i++)
        perm[i] = i;
    for (long i = 0; i < k && i < n; i++) {
        long j = i + (long)gsl_rng_uniform_int(r, (unsigned long)(n - i));
        long t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
        out[i] = perm[i];
    }
    free(perm);
    gsl_rng_free(r);
    return FK_OK;
}

int fk_train_rng_perm(uint64_t seed, long n, long *out)
{
    return fk_train_rng_pick(seed, n, n, out);
}

int fk_train_rng_gauss(uint64_t seed, long count, float *out)
{
    gsl_rng *r = make(seed);
    if (!r)
        return fk_err(FK_ENOMEM, "out of memory");
    for (long i = 0; i < count; i++)
        out[i] = (float)gsl_ran_gaussian_ziggurat(r, 1.0);
    gsl_rng_free(r);
    return FK_OK;
}
