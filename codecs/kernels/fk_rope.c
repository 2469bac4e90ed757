/* SPDX-License-Identifier: MIT
 * RoPE and its inverse in double (see fk_rope.h).
 */
#include "kernels/fk_rope.h"

#include <math.h>
#include <stddef.h>

#include "common/fk_err.h"

#define FK_PI 3.14159265358979323846

const char *const fk_rope_layout_names[] = {"interleaved", "half", NULL};
const char *const fk_rope_type_names[] = {"default", "llama3", NULL};

int fk_rope_check(const struct fk_rope *r, int d)
{
    if (!(r->theta > 0) || !isfinite(r->theta))
        return fk_err(FK_EINVAL, "rope_theta = %g, expected a finite base > 0", r->theta);
    if (r->layout != FK_ROPE_INTERLEAVED && r->layout != FK_ROPE_HALF)
        return fk_err(FK_EINVAL, "rope_layout %d, expected interleaved or half", r->layout);
    if (d < 2 || d % 2)
        return fk_err(FK_EINVAL, "RoPE needs an even head_dim, got %d", d);
    if (r->type == FK_ROPE_DEFAULT)
        return FK_OK;
    if (r->type != FK_ROPE_LLAMA3)
        return fk_err(FK_EINVAL, "rope_type %d, expected default or llama3", r->type);
    if (!(r->factor >= 1) || !isfinite(r->factor))
        return fk_err(FK_EINVAL, "rope_factor = %g, expected a finite factor >= 1", r->factor);
    if (!(r->low_freq_factor > 0) || !(r->high_freq_factor > r->low_freq_factor) ||
        !isfinite(r->high_freq_factor))
        return fk_err(FK_EINVAL, "rope_low_freq_factor = %g, rope_high_freq_factor = %g: "
                      "expected 0 < low < high", r->low_freq_factor, r->high_freq_factor);
    if (!(r->original_max_position > 0) || !isfinite(r->original_max_position))
        return fk_err(FK_EINVAL, "rope_original_max_position = %g, expected > 0",
                      r->original_max_position);
    return FK_OK;
}

/* Hugging Face's llama3 rescaling of one frequency (fk_rope.h). */
static double llama3_freq(const struct fk_rope *r, double f)
{
    double L = r->original_max_position, lo = r->low_freq_factor, hi = r->high_freq_factor;
    double w = 2 * FK_PI / f;
    if (w < L / hi)
        return f;
    if (w > L / lo)
        return f / r->factor;
    double s = (L / w - lo) / (hi - lo);
    return (1 - s) * f / r->factor + s * f;
}

void fk_rope_freqs(const struct fk_rope *r, int d, double *freq)
{
    for (int i = 0; i < d / 2; i++) {
        double f = pow(r->theta, -(2.0 * i) / d);
        freq[i] = r->type == FK_ROPE_LLAMA3 ? llama3_freq(r, f) : f;
    }
}

void fk_rope_table(const double *freq, int d, const int32_t *pos, int n, double *cs, double *sn)
{
    int half = d / 2;
    for (int t = 0; t < n; t++)
        for (int i = 0; i < half; i++) {
            double a = (double)pos[t] * freq[i];
            cs[(long)t * half + i] = cos(a);
            sn[(long)t * half + i] = sin(a);
        }
}

void fk_rope_apply(int layout, int d, const double *cs, const double *sn, int dir, double *x)
{
    for (int i = 0; i < d / 2; i++) {
        int a, b;
        fk_rope_pair(layout, d, i, &a, &b);
        double c = cs[i], s = dir < 0 ? -sn[i] : sn[i];
        double xa = x[a], xb = x[b];
        x[a] = xa * c - xb * s;
        x[b] = xa * s + xb * c;
    }
}
