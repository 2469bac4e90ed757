/* SPDX-License-Identifier: MIT
 * The BLAS behind the large products (kernels/fk_blas.h).
 */
#include "kernels/fk_blas.h"

#include <pthread.h>
#include <stdio.h>

#if defined(FK_BLAS_BLIS)
#include <blis.h>
#else
#include <cblas.h>
#endif

#if defined(FK_BLAS_BLIS)

void fk_blas_threads_set(int n)
{
    bli_thread_set_num_threads(n < 1 ? 1 : n);
}

int fk_blas_threads_get(void)
{
    dim_t n = bli_thread_get_num_threads(); /* -1 until set: BLIS then runs one thread */
    return n < 1 ? 1 : (int)n;
}

const char *fk_blas_library(void)
{
    return "blis";
}

const char *fk_blas_config(void)
{
    static char s[64];
    snprintf(s, sizeof s, "BLIS %s", bli_info_get_version_str());
    return s;
}

const char *fk_blas_kernels(void)
{
    bli_init(); /* the query reads BLIS's kernel structure: it must be set up first */
    return bli_arch_string(bli_arch_query_id());
}

#else

void fk_blas_threads_set(int n)
{
    openblas_set_num_threads(n < 1 ? 1 : n);
}

int fk_blas_threads_get(void)
{
    return openblas_get_num_threads();
}

const char *fk_blas_library(void)
{
    return "openblas";
}

const char *fk_blas_config(void)
{
    return openblas_get_config();
}

const char *fk_blas_kernels(void)
{
    return openblas_get_corename();
}

#endif

/* Setting is process-wide: nothing is set when the count is already the one asked for, so
 * that a scope nested in another (a cell's replay in the runner's lanes) never touches
 * what other threads are using. */
int fk_blas_single(void)
{
    int saved = fk_blas_threads_get();
    if (saved != 1)
        fk_blas_threads_set(1);
    return saved;
}

void fk_blas_restore(int saved)
{
    if (fk_blas_threads_get() != saved)
        fk_blas_threads_set(saved);
}

int fk_blas_parallel(int n, void *(*fn)(void *), void *arg, size_t stride)
{
    enum { MAX_WORKERS = 256 };
    pthread_t th[MAX_WORKERS];
    int saved = fk_blas_single(), started = 0;
    if (n > MAX_WORKERS)
        n = MAX_WORKERS;
    if (n > 1)
        for (; started < n; started++)
            if (pthread_create(&th[started], NULL, fn, (char *)arg + (size_t)started * stride))
                break;
    if (started == 0)
        fn(arg);
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    fk_blas_restore(saved);
    return started ? started : 1;
}
