/* SPDX-License-Identifier: MIT
 * Calibrating the synthetic generator to real traces (datasets/SYNTH.md, "Fitted profiles").
 *
 * fk_synth_fit estimates, for every layer of a set of traces of one shape, the values of the
 * generator knobs listed in fk_synth_profile_knobs (spectrum, noise, mean, RoPE-frequency
 * tilt, outlier channels, coefficient tails, sink, attention spread) and stores them, with
 * the measured normalised key and value spectra, in a profile. fk_synth_profile_apply sets
 * those knobs for one layer of a generated trace of any depth (the layers of the profile
 * are spread over the layers of the output in equal-depth blocks). The profile file is
 * HDF5, schema "fadkv-synth-profile" v1.
 */
#ifndef FK_SYNTH_FIT_H
#define FK_SYNTH_FIT_H

#include "gen/fk_synth.h"

/* Knobs a profile sets per layer, in storage order. */
#define FK_PROFILE_NKNOBS 16
extern const char *const fk_synth_profile_knobs[FK_PROFILE_NKNOBS];

struct fk_synth_profile {
    int n_layers;            /* layers of the fitted traces */
    int head_dim;            /* d of the fitted traces */
    int n_traces;            /* traces fitted */
    long tokens;             /* tokens fitted (sum of T over traces) */
    char source[4096];       /* the fitted traces' paths, ';'-separated */
    char path[1024];         /* the file it was read from (fk_synth_profile_read), or "" */
    double *knob;            /* [n_layers][FK_PROFILE_NKNOBS] */
    double *spectrum;        /* [n_layers][2][head_dim]: eigenvalues of the pre-RoPE
                                covariance, K then V, descending, summing to 1 */
};

/* Fits a profile to traces of one shape (layers, head_dim); FK_EINVAL naming the trace
 * when shapes differ, a trace has post-RoPE keys without RoPE attributes, or has fewer
 * than 2 tokens. Queries (when present) give sink_mass and attn_logit_std, otherwise
 * those keep the generator defaults. */
int fk_synth_fit(const char *const *paths, int n_paths, struct fk_synth_profile **out);

int fk_synth_profile_write(const struct fk_synth_profile *p, const char *path);
int fk_synth_profile_read(const char *path, struct fk_synth_profile **out);
void fk_synth_profile_free(struct fk_synth_profile **p);

/* Profile layer of output layer l of L: floor(l * n_layers / L). */
int fk_synth_profile_layer(const struct fk_synth_profile *p, int l, int L);
/* Sets the profile's knobs of output layer l (of o->n_layers) in o; FK_EINVAL (naming the
 * knob and layers) when a value is outside the knob's range. */
int fk_synth_profile_apply(const struct fk_synth_profile *p, int l, struct fk_synth_opts *o);

#endif
