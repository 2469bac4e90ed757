/* SPDX-License-Identifier: MIT
 * The serving engines' KV-cache storage formats, written from their rules (spec
 * families-quant-2026.md sections 1.3, 2 and 3; no engine code is copied):
 *   - llama.cpp's blocks of 32 values (ggml-common.h structs, ggml-quants.c
 *     quantize_row_*_ref rules): q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, byte for byte;
 *   - FP8 E5M2 (vLLM's fp8_e5m2: bias 15, 2 mantissa bits, round to nearest even, saturated
 *     to +-57344); E4M3FN is fk_fp8_encode (kernels/fk_sparse.h);
 *   - the normalised Sylvester-Hadamard transform llama.cpp rotates K and V with.
 * All arithmetic is float32 as the references do; the stored scales are fp16 (round to
 * nearest even) and the codes are computed from the float32 scale, the values decoded from
 * the fp16 one (the references' mismatch, kept).
 */
#ifndef FK_KVFMT_H
#define FK_KVFMT_H

#include <stddef.h>
#include <stdint.h>

#define FK_GGML_QK 32            /* values per block, every type */

enum fk_ggml_type {
    FK_GGML_Q8_0,                /* fp16 d; int8 qs[32]                       34 bytes */
    FK_GGML_Q4_0,                /* fp16 d; uint8 qs[16]                      18 bytes */
    FK_GGML_Q4_1,                /* fp16 d; fp16 m; uint8 qs[16]              20 bytes */
    FK_GGML_Q5_0,                /* fp16 d; uint8 qh[4]; uint8 qs[16]         22 bytes */
    FK_GGML_Q5_1,                /* fp16 d; fp16 m; uint8 qh[4]; uint8 qs[16] 24 bytes */
    FK_GGML_IQ4_NL,              /* fp16 d; uint8 qs[16] (non-linear levels)  18 bytes */
};

/* Bytes of one block of type t. */
size_t fk_ggml_block_bytes(enum fk_ggml_type t);

/* One block: the 32 floats x into the block's bytes blk (little-endian, the struct's field
 * order), by the quantize_row_*_ref rule of t. rne (q8_0 only): llama.cpp's x86 AVX path
 * instead of the reference (inverse scale 127 / amax, ties to even). */
void fk_ggml_quantize(enum fk_ggml_type t, const float *x, uint8_t *blk, int rne);

/* The 32 values a block of type t decodes to. */
void fk_ggml_dequantize(enum fk_ggml_type t, const uint8_t *blk, float *y);

/* FP8 E5M2: round to nearest even, subnormals (quantum 2^-16) included, saturated to
 * +-57344 (0x7B); NaN gives 0x7F. */
uint8_t fk_e5m2_encode(float f);
float fk_e5m2_decode(uint8_t c);

/* x <- H_n x in place for the normalised Sylvester-Hadamard matrix of size n (a power of
 * two): H_n[i][j] = (-1)^popcount(i & j) / sqrt(n), symmetric and orthonormal (H H = I).
 * Butterflies in float, then the scale. */
void fk_hadamard(float *x, int n);

/* y = A x for a dense rotation A [m][m] (float, row-major): one SGEMV of the BLAS. */
void fk_rotate_dense(const float *A, int m, const float *x, float *y);
/* The n rows X [n][m] by a dense A [m][m] (float, row-major) into Y [n][m]: rows A x
 * (trans 0: Y = X A^T) or A^T x (trans 1: Y = X A), one SGEMM of the BLAS. */
void fk_rotate_dense_rows(const float *A, int m, const float *X, int n, float *Y, int trans);

#endif
