/* SPDX-License-Identifier: MIT
 * Rotary position embedding (RoPE) of one head vector, and its exact inverse, in double
 * (families.md 0.1.2): the low-rank codecs un-rotate post-RoPE keys, k_pre = R(-p) k_post,
 * before projecting them, and rotate the reconstruction back.
 *
 * Pair i (0 <= i < d/2) is rotated by the angle p * f_i:
 *   layout interleaved  channels (2i, 2i+1)   Meta / llama2.c / GPT-J
 *   layout half         channels (i, i+d/2)   Hugging Face rotate_half
 *   x'_a = x_a cos - x_b sin,  x'_b = x_a sin + x_b cos
 * Frequencies: f_i = theta^(-2i/d) (type default), rescaled by Hugging Face's llama3 rule
 * (type llama3, _compute_llama3_parameters, written from its documented formula): with
 * wavelength w_i = 2 pi / f_i, w_lo = L / low_freq_factor, w_hi = L / high_freq_factor,
 * L = original_max_position:
 *   w_i < w_hi           f_i unchanged (high frequencies)
 *   w_i > w_lo           f_i / factor (low frequencies)
 *   otherwise            (1 - s) f_i / factor + s f_i,  s = (L / w_i - low) / (high - low)
 * Both types scale cos and sin by 1 (no attention factor).
 *
 * Hugging Face computes f_i in float32; this kernel in double, so un-rotating a Hugging Face
 * trace leaves a relative error of about 1e-7 * p * f_i in each pair (llama2.c computes its
 * table in double with the same formula: exact up to the trace's own rounding).
 */
#ifndef FK_ROPE_H
#define FK_ROPE_H

#include <stdint.h>

enum fk_rope_layout { FK_ROPE_INTERLEAVED = 0, FK_ROPE_HALF = 1 };
enum fk_rope_type { FK_ROPE_DEFAULT = 0, FK_ROPE_LLAMA3 = 1 };

/* The RoPE of a model, as a trace records it (datasets/README.md). */
struct fk_rope {
    double theta;                /* base, > 0 */
    int layout;                  /* enum fk_rope_layout */
    int type;                    /* enum fk_rope_type */
    /* llama3 only */
    double factor;               /* >= 1 */
    double low_freq_factor, high_freq_factor; /* 0 < low < high */
    double original_max_position; /* L > 0 */
};

extern const char *const fk_rope_layout_names[]; /* {"interleaved", "half", NULL} */
extern const char *const fk_rope_type_names[];   /* {"default", "llama3", NULL} */

/* Checks the parameters (theta > 0, known layout and type, the llama3 numbers in range) and
 * an even head_dim d; the message names the parameter and what was expected. */
int fk_rope_check(const struct fk_rope *r, int d);

/* f_i for i = 0 .. d/2 - 1 (d even). */
void fk_rope_freqs(const struct fk_rope *r, int d, double *freq);

/* The channels (a, b) of pair i. */
static inline void fk_rope_pair(int layout, int d, int i, int *a, int *b)
{
    *a = layout == FK_ROPE_HALF ? i : 2 * i;
    *b = layout == FK_ROPE_HALF ? i + d / 2 : 2 * i + 1;
}

/* cos and sin of p_t * f_i for n positions: cs, sn [n][d/2]. */
void fk_rope_table(const double *freq, int d, const int32_t *pos, int n, double *cs, double *sn);

/* Rotates x [d] in place by the angles of one position (cs, sn: [d/2]); dir = +1 applies
 * RoPE, dir = -1 its inverse (the transpose: the same angles negated). */
void fk_rope_apply(int layout, int d, const double *cs, const double *sn, int dir, double *x);

#endif
