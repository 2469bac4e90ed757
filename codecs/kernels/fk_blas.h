/* SPDX-License-Identifier: MIT
 * The BLAS behind the large products: OpenBLAS (the default) or BLIS (meson option
 * -Dblas=blis). Both give the CBLAS interface (<cblas.h>); this is the one place that names
 * either library: its thread count, and what it is and which kernels it runs (provenance).
 *
 * Code that runs its own worker threads, or whose bits must not depend on the BLAS's thread
 * count, runs the BLAS on one thread for a while:
 *
 *     int saved = fk_blas_single();
 *     ... cblas_* calls ...
 *     fk_blas_restore(saved);
 */
#ifndef FK_BLAS_H
#define FK_BLAS_H

#include <stddef.h>

/* The BLAS's thread count (process-wide; n < 1 counts as 1). */
void fk_blas_threads_set(int n);
int fk_blas_threads_get(void);

/* One BLAS thread from now on; returns the count to give fk_blas_restore. Nothing is set
 * when the count already is the one asked for (scopes nest). */
int fk_blas_single(void);
void fk_blas_restore(int saved);

/* The worker pool: runs fn(arg + i * stride) for i = 0 .. n-1, each on a thread of its own,
 * with the BLAS on one thread throughout (no oversubscription, and every product computed
 * the same way whatever n is); the calling thread runs fn(arg) alone when n <= 1 or no
 * thread starts, and when some threads do not start the others run without them. Returns
 * the number of workers that ran (1 .. n): the workers share their work through a counter,
 * so that fewer workers still do all of it. */
int fk_blas_parallel(int n, void *(*fn)(void *), void *arg, size_t stride);

/* "openblas" or "blis". */
const char *fk_blas_library(void);
/* The library's own description: OpenBLAS's config string ("OpenBLAS 0.3.21 DYNAMIC_ARCH
 * ... Haswell MAX_THREADS=64"), "BLIS 0.9.0". */
const char *fk_blas_config(void);
/* The kernel set the library chose for this CPU (or was told to use: OPENBLAS_CORETYPE,
 * BLIS_ARCH_TYPE): "Haswell", "Zen", "SkylakeX", ... for OpenBLAS, "zen3", "skx",
 * "generic", ... for BLIS. */
const char *fk_blas_kernels(void);

#endif
