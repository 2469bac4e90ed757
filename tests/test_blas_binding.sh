#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Proves the link order: every cblas_* call of the project AND of libgsl binds to the BLAS
# of the build (OpenBLAS, or BLIS with -Dblas=blis), none to GSL's slow reference CBLAS
# (libgslcblas, about 25x slower; environment.md snag 4). The probe is a test binary that
# calls GSL's least squares (which calls cblas_d*) and the project's BLAS kernels.
# usage: test_blas_binding.sh PROBE_BINARY
set -u
probe=$1
log=$(LD_DEBUG=bindings "$probe" 2>&1 >/dev/null)
gsl=$(printf '%s\n' "$log" | grep -c "to .*libgslcblas.*symbol \`cblas_")
ob_gsl=$(printf '%s\n' "$log" | grep "libgsl.so" | grep -c -E "to .*lib(openblas|blis).*symbol \`cblas_")
ob_own=$(printf '%s\n' "$log" | grep -v "libgsl.so" | grep -c -E "to .*lib(openblas|blis).*symbol \`cblas_")
echo "cblas_* bindings: to libgslcblas $gsl; from libgsl to the BLAS $ob_gsl; from the project to the BLAS $ob_own"
if [ "$gsl" -ne 0 ] || [ "$ob_gsl" -eq 0 ] || [ "$ob_own" -eq 0 ]; then
    echo "FAIL: a cblas_* symbol binds to libgslcblas, or nothing binds to the BLAS"
    echo "0 passed, 1 failed"
    exit 1
fi
echo "1 passed, 0 failed"
