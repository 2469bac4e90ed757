/* SPDX-License-Identifier: MIT
 * Run-time kernel selection for the element-wise loops: a function marked FK_CLONES is also
 * built for AVX2 and picked at load time (GCC target_clones, x86-64 Linux); FK_FMA_CLONES
 * adds an x86-64-v3 clone instead (AVX2 with FMA, for loops that call fma() explicitly);
 * FK_CLONES512 adds an AVX-512F clone to FK_CLONES (for 16-float vector kernels).
 * FK_AVX512_ONLY builds a function for AVX-512F alone: call it only where fk_have_avx512()
 * (0 where the clones are off), with a path of the same bits for the other CPUs.
 * The build turns floating-point contraction off (-ffp-contract=off, meson.build) and the
 * kernels keep their lanes independent, so every clone computes the same bits. The clones
 * are off under clang (libFuzzer builds) and AddressSanitizer, whose instrumentation and
 * ifunc resolvers do not mix.
 */
#ifndef FK_SIMD_H
#define FK_SIMD_H

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && \
    !defined(__SANITIZE_ADDRESS__)
#define FK_CLONES __attribute__((target_clones("avx2", "default")))
#define FK_FMA_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#define FK_CLONES512 __attribute__((target_clones("avx512f", "avx2", "default")))
#define FK_AVX512_ONLY __attribute__((target("avx512f")))
#define fk_have_avx512() __builtin_cpu_supports("avx512f")
#else
#define FK_AVX512_ONLY
#define fk_have_avx512() 0
#define FK_CLONES512
#define FK_CLONES
#define FK_FMA_CLONES
#endif

#endif
