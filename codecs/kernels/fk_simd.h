/* SPDX-License-Identifier: MIT
 * Run-time kernel selection for the element-wise loops: a function marked FK_CLONES is also
 * built for AVX2 and picked at load time (GCC target_clones, x86-64 Linux); FK_FMA_CLONES
 * adds an x86-64-v3 clone instead (AVX2 with FMA, for loops that call fma() explicitly);
 * FK_CLONES512 adds an AVX-512F clone to FK_CLONES (for 16-float vector kernels).
 * FK_AVX512_ONLY builds a function for AVX-512F alone: call it only where fk_have_avx512()
 * (0 where the clones are off), with a path of the same bits for the other CPUs. FK_AVX512_FN
 * is 1 where such a function is built for AVX-512F (then it may use the <immintrin.h>
 * intrinsics of AVX-512F, for what plain C cannot say: a compress), else 0.
 * The build turns floating-point contraction off (-ffp-contract=off, meson.build) and the
 * kernels keep their lanes independent, so every clone computes the same bits. The clones
 * are off under clang (libFuzzer builds) and AddressSanitizer, whose instrumentation and
 * ifunc resolvers do not mix.
 *
 * The meson option simd caps the clones a build has, so that any CPU can run each path:
 * auto (FK_SIMD_MAX 2: default, AVX2, AVX-512), avx2 (1: no AVX-512 clone) and generic (0:
 * no clone, every kernel the x86-64 baseline). CI runs the gate with a generic build.
 */
#ifndef FK_SIMD_H
#define FK_SIMD_H

#ifndef FK_SIMD_MAX
#define FK_SIMD_MAX 2
#endif

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && \
    !defined(__SANITIZE_ADDRESS__) && FK_SIMD_MAX > 0
#define FK_CLONES __attribute__((target_clones("avx2", "default")))
#define FK_FMA_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#if FK_SIMD_MAX > 1
#define FK_CLONES512 __attribute__((target_clones("avx512f", "avx2", "default")))
#define FK_AVX512_ONLY __attribute__((target("avx512f")))
#define FK_AVX512_FN 1
#define fk_have_avx512() __builtin_cpu_supports("avx512f")
#define FK_SIMD_PATHS "avx512f avx2 default"
#else
#define FK_CLONES512 FK_CLONES
#define FK_AVX512_ONLY
#define FK_AVX512_FN 0
#define fk_have_avx512() 0
#define FK_SIMD_PATHS "avx2 default"
#endif
#else
#define FK_AVX512_ONLY
#define FK_AVX512_FN 0
#define fk_have_avx512() 0
#define FK_CLONES512
#define FK_CLONES
#define FK_FMA_CLONES
#define FK_SIMD_PATHS "default"
#endif

/* The clones of this build and the one this CPU runs: "avx512f avx2 default, running
 * avx512f", "default, running default". */
static inline const char *fk_simd_build(void)
{
#if FK_SIMD_MAX > 0 && defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && \
    defined(__linux__) && !defined(__SANITIZE_ADDRESS__)
    if (FK_SIMD_MAX > 1 && __builtin_cpu_supports("avx512f"))
        return FK_SIMD_PATHS ", running avx512f";
    if (__builtin_cpu_supports("avx2"))
        return FK_SIMD_PATHS ", running avx2";
#endif
    return FK_SIMD_PATHS ", running default";
}

/* The compiler that built this file: "gcc 12.2.0", "clang 14.0.6". */
#if defined(__clang__)
#define FK_COMPILER "clang " __clang_version__
#elif defined(__GNUC__)
#define FK_STR2_(x) #x
#define FK_STR_(x) FK_STR2_(x)
#define FK_COMPILER "gcc " FK_STR_(__GNUC__) "." FK_STR_(__GNUC_MINOR__) "." FK_STR_(__GNUC_PATCHLEVEL__)
#else
#define FK_COMPILER "cc"
#endif
static inline const char *fk_compiler(void) { return FK_COMPILER; }

#endif
