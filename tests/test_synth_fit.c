/* SPDX-License-Identifier: MIT
 * synth --fit and --profile (datasets/gen/fk_synth_fit.h): the fit recovers the knobs of
 * traces the generator made (two settings: the defaults and one far from them, with the
 * other RoPE layout), a profile round trip is exact, and a profile drives generation (the
 * fit of a profiled trace recovers the profile, layer by layer, at another depth).
 * Shape: 2 layers, 4 query heads, 2 KV heads, d = 64, 256 + 256 tokens, 3 sequences.
 */
#include <check.h>
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fk_check_main.h"
#include "common/fk_err.h"
#include "formats/fk_trace.h"
#include "gen/fk_synth.h"
#include "gen/fk_synth_fit.h"

static char g_dir[64];

static void setup(void)
{
    strcpy(g_dir, "/tmp/fk-fit-XXXXXX");
    ck_assert(mkdtemp(g_dir));
    fk_hdf5_quiet();
}

static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    ck_assert_int_eq(system(cmd), 0);
}

static void small(struct fk_synth_opts *o)
{
    fk_synth_defaults(o);
    o->n_layers = 2;
    o->n_q_heads = 4;
    o->n_kv_heads = 2;
    o->head_dim = 64;
    o->prefill = 256;
    o->decode = 256;
    o->key_rank = 12;
    o->value_rank = 24;
    o->encoding = FK_ENC_F32;
}

/* Writes 3 sequences with tag into g_dir; paths[3] receive their names. */
static void make(const struct fk_synth_opts *o, const char *tag, char paths[3][128])
{
    for (int s = 0; s < 3; s++) {
        snprintf(paths[s], 128, "%s/%s-%d.h5", g_dir, tag, s);
        ck_assert_msg(fk_synth_write(o, paths[s], s) == FK_OK, "%s", fk_errmsg());
    }
}

static struct fk_synth_profile *fit(char paths[3][128])
{
    const char *pp[3] = {paths[0], paths[1], paths[2]};
    struct fk_synth_profile *p = NULL;
    ck_assert_msg(fk_synth_fit(pp, 3, &p) == FK_OK, "%s", fk_errmsg());
    return p;
}

static double knob(const struct fk_synth_profile *p, int l, const char *name)
{
    for (int k = 0; k < FK_PROFILE_NKNOBS; k++)
        if (!strcmp(fk_synth_profile_knobs[k], name))
            return p->knob[(size_t)l * FK_PROFILE_NKNOBS + k];
    ck_abort_msg("no knob %s", name);
    return NAN;
}

/* The stated tolerances (datasets/SYNTH.md, "Fitted profiles"): ranks and outlier pairs
 * exact; relative 15% for noise, means, sink scales and logit spread, 25% for the
 * outlier scale (each pair draws U(0.75, 1.25) x scale); absolute 0.12 for the decays,
 * 0.1 for the sink mass; the tilt within [0.7, 1.1] x the truth (the fit reads the
 * energy profile after orthonormalisation, which flattens it); coef_dof within
 * [0.8, 1.5] x the truth. */
static void check_recovers(const struct fk_synth_opts *o, const struct fk_synth_profile *p)
{
    for (int l = 0; l < p->n_layers; l++) {
#define REL(name, truth, tol)                                                                \
    ck_assert_msg(fabs(knob(p, l, name) - (truth)) <= (tol) * (truth),                       \
                  "layer %d %s: fitted %g, truth %g", l, name, knob(p, l, name), (double)(truth))
#define ABS(name, truth, tol)                                                                \
    ck_assert_msg(fabs(knob(p, l, name) - (truth)) <= (tol),                                 \
                  "layer %d %s: fitted %g, truth %g", l, name, knob(p, l, name), (double)(truth))
        ABS("key_rank", o->key_rank, 0);
        ABS("value_rank", o->value_rank, 0);
        ABS("key_outlier_pairs", o->key_outlier_pairs, 0);
        ABS("key_decay", o->key_decay, 0.12);
        ABS("value_decay", o->value_decay, 0.12);
        REL("key_noise", o->key_noise, 0.15);
        REL("value_noise", o->value_noise, 0.15);
        REL("key_mean", o->key_mean, 0.2);
        REL("value_mean", o->value_mean, 0.15);
        REL("key_outlier_scale", o->key_outlier_scale, 0.25);
        REL("sink_key_scale", o->sink_key_scale, 0.15);
        REL("sink_value_scale", o->sink_value_scale, 0.15);
        REL("attn_logit_std", o->attn_logit_std, 0.15);
        ABS("sink_mass", o->sink_mass, 0.1);
        double t = knob(p, l, "key_freq_tilt"), dof = knob(p, l, "coef_dof");
        ck_assert_msg(t >= 0.7 * o->key_freq_tilt && t <= 1.1 * o->key_freq_tilt,
                      "layer %d key_freq_tilt: fitted %g, truth %g", l, t, o->key_freq_tilt);
        ck_assert_msg(dof >= 0.8 * o->coef_dof && dof <= 1.5 * o->coef_dof,
                      "layer %d coef_dof: fitted %g, truth %g", l, dof, o->coef_dof);
#undef REL
#undef ABS
    }
}

START_TEST(test_fit_recovers_defaults)
{
    struct fk_synth_opts o;
    small(&o);
    char paths[3][128];
    make(&o, "def", paths);
    struct fk_synth_profile *p = fit(paths);
    ck_assert_int_eq(p->n_layers, 2);
    ck_assert_int_eq(p->head_dim, 64);
    ck_assert_int_eq(p->n_traces, 3);
    ck_assert_int_eq(p->tokens, 3 * 512);
    check_recovers(&o, p);
    fk_synth_profile_free(&p);
}
END_TEST

START_TEST(test_fit_recovers_other_setting)
{
    struct fk_synth_opts o;
    small(&o);
    o.key_rank = 8;
    o.key_decay = 1;
    o.key_noise = 0.3;
    o.key_mean = 1;
    o.key_freq_tilt = 3;
    o.key_outlier_pairs = 3;
    o.key_outlier_scale = 10;
    o.value_rank = 16;
    o.value_decay = 0.6;
    o.value_noise = 0.2;
    o.value_mean = 0.5;
    o.coef_dof = 5;
    o.sink_key_scale = 5;
    o.sink_value_scale = 0.3;
    o.sink_mass = 0.2;
    o.attn_logit_std = 2;
    o.rope_half = 1;
    o.rope_theta = 10000; /* the llama2.c models' base: RoPE turns every pair within 512 tokens */
    char paths[3][128];
    make(&o, "other", paths);
    struct fk_synth_profile *p = fit(paths);
    check_recovers(&o, p);
    fk_synth_profile_free(&p);
}
END_TEST

/* Reads every double of a profile file in storage order (an oracle apart from the reader). */
static double *raw_doubles(const char *path, size_t *n)
{
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    ck_assert(f >= 0);
    size_t cap = 0;
    double *all = NULL;
    *n = 0;
    char name[128];
    for (int k = 0; k <= FK_PROFILE_NKNOBS; k++) {
        if (k < FK_PROFILE_NKNOBS)
            snprintf(name, sizeof name, "knobs/%s", fk_synth_profile_knobs[k]);
        else
            snprintf(name, sizeof name, "spectrum");
        hid_t ds = H5Dopen2(f, name, H5P_DEFAULT);
        ck_assert_msg(ds >= 0, "%s: no %s", path, name);
        hid_t sp = H5Dget_space(ds);
        size_t m = (size_t)H5Sget_simple_extent_npoints(sp);
        H5Sclose(sp);
        if (*n + m > cap) {
            cap = (*n + m) * 2;
            all = realloc(all, sizeof(double) * cap);
            ck_assert(all);
        }
        ck_assert(H5Dread(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, all + *n) >= 0);
        *n += m;
        H5Dclose(ds);
    }
    H5Fclose(f);
    return all;
}

START_TEST(test_profile_round_trip_is_exact)
{
    struct fk_synth_opts o;
    small(&o);
    o.n_layers = 3;
    char paths[3][128];
    make(&o, "rt", paths);
    struct fk_synth_profile *p = fit(paths), *q = NULL;
    char a[128], b[128];
    snprintf(a, sizeof a, "%s/a.h5", g_dir);
    snprintf(b, sizeof b, "%s/b.h5", g_dir);
    ck_assert_msg(fk_synth_profile_write(p, a) == FK_OK, "%s", fk_errmsg());
    ck_assert_msg(fk_synth_profile_read(a, &q) == FK_OK, "%s", fk_errmsg());
    ck_assert_int_eq(q->n_layers, 3);
    ck_assert_int_eq(q->head_dim, 64);
    ck_assert_int_eq(q->n_traces, 3);
    ck_assert_int_eq(q->tokens, p->tokens);
    ck_assert_str_eq(q->source, p->source);
    ck_assert(!memcmp(q->knob, p->knob, sizeof(double) * 3 * FK_PROFILE_NKNOBS));
    ck_assert(!memcmp(q->spectrum, p->spectrum, sizeof(double) * 3 * 2 * 64));
    ck_assert_msg(fk_synth_profile_write(q, b) == FK_OK, "%s", fk_errmsg());
    size_t na, nb;
    double *va = raw_doubles(a, &na), *vb = raw_doubles(b, &nb);
    ck_assert_uint_eq(na, (size_t)3 * FK_PROFILE_NKNOBS + 3 * 2 * 64);
    ck_assert_uint_eq(na, nb);
    ck_assert(!memcmp(va, vb, sizeof(double) * na));
    /* and the values are those of the fit, in storage order (knob k, layer l) */
    for (int k = 0; k < FK_PROFILE_NKNOBS; k++)
        for (int l = 0; l < 3; l++)
            ck_assert(!memcmp(&va[k * 3 + l], &p->knob[l * FK_PROFILE_NKNOBS + k],
                              sizeof(double)));
    free(va);
    free(vb);
    fk_synth_profile_free(&p);
    fk_synth_profile_free(&q);
    /* a damaged profile is refused, naming the file and what is wrong */
    hid_t f = H5Fopen(b, H5F_ACC_RDWR, H5P_DEFAULT);
    ck_assert(f >= 0);
    ck_assert(H5Ldelete(f, "knobs/key_rank", H5P_DEFAULT) >= 0);
    H5Fclose(f);
    ck_assert_int_eq(fk_synth_profile_read(b, &q), FK_ECORRUPT);
    ck_assert_msg(strstr(fk_errmsg(), b) && strstr(fk_errmsg(), "key_rank"), "%s",
                  fk_errmsg());
}
END_TEST

/* Two-layer profile of two different settings, applied to a 4-layer generation: output
 * layers 0-1 read profile layer 0, layers 2-3 profile layer 1 (equal-depth blocks); the fit
 * of the generated traces gives back each block's values. */
START_TEST(test_profile_drives_generation)
{
    struct fk_synth_opts o;
    small(&o);
    char paths[3][128];
    make(&o, "base", paths);
    struct fk_synth_profile *p = fit(paths);
    /* make the two profile layers clearly different */
    for (int k = 0; k < FK_PROFILE_NKNOBS; k++) {
        const char *n = fk_synth_profile_knobs[k];
        double *v1 = &p->knob[FK_PROFILE_NKNOBS + k];
        if (!strcmp(n, "key_rank"))
            *v1 = 6;
        else if (!strcmp(n, "value_noise"))
            *v1 = 0.15;
        else if (!strcmp(n, "sink_value_scale"))
            *v1 = 0.5;
    }
    ck_assert_int_eq(fk_synth_profile_layer(p, 0, 4), 0);
    ck_assert_int_eq(fk_synth_profile_layer(p, 1, 4), 0);
    ck_assert_int_eq(fk_synth_profile_layer(p, 2, 4), 1);
    ck_assert_int_eq(fk_synth_profile_layer(p, 3, 4), 1);
    ck_assert_int_eq(fk_synth_profile_layer(p, 27, 28), 1);
    ck_assert_int_eq(fk_synth_profile_layer(p, 13, 28), 0);
    struct fk_synth_opts g;
    small(&g);
    g.n_layers = 4;
    g.seed = 9;
    g.profile = p;
    char gp[3][128];
    make(&g, "prof", gp);
    struct fk_synth_profile *r = fit(gp);
    ck_assert_int_eq(r->n_layers, 4);
    for (int l = 0; l < 4; l++) {
        int pl = l / 2;
        ck_assert_msg(knob(r, l, "key_rank") == knob(p, pl, "key_rank"),
                      "layer %d key_rank %g, profile %g", l, knob(r, l, "key_rank"),
                      knob(p, pl, "key_rank"));
        ck_assert_msg(fabs(knob(r, l, "value_noise") / knob(p, pl, "value_noise") - 1) < 0.15,
                      "layer %d value_noise %g, profile %g", l, knob(r, l, "value_noise"),
                      knob(p, pl, "value_noise"));
        ck_assert_msg(fabs(knob(r, l, "sink_value_scale") / knob(p, pl, "sink_value_scale") -
                           1) < 0.15, "layer %d sink_value_scale %g, profile %g", l,
                      knob(r, l, "sink_value_scale"), knob(p, pl, "sink_value_scale"));
    }
    /* the trace records which profile replaced its knobs */
    struct fk_trace *t;
    ck_assert_int_eq(fk_trace_open(gp[0], &t), FK_OK);
    ck_assert(fk_trace_attr(t, "synth.profile") != NULL);
    fk_trace_close(&t);
    /* without a profile the generator's output is what it was (same bytes per layer) */
    struct fk_synth_opts a;
    small(&a);
    size_t nkv = (size_t)2 * 512 * 64;
    float *k1 = malloc(sizeof(float) * nkv), *v1 = malloc(sizeof(float) * nkv);
    float *k2 = malloc(sizeof(float) * nkv), *v2 = malloc(sizeof(float) * nkv);
    ck_assert(k1 && v1 && k2 && v2);
    ck_assert_int_eq(fk_synth_layer(&a, 0, 1, k1, v1, NULL, NULL), FK_OK);
    a.profile = NULL;
    ck_assert_int_eq(fk_synth_layer(&a, 0, 1, k2, v2, NULL, NULL), FK_OK);
    ck_assert(!memcmp(k1, k2, sizeof(float) * nkv) && !memcmp(v1, v2, sizeof(float) * nkv));
    free(k1);
    free(v1);
    free(k2);
    free(v2);
    fk_synth_profile_free(&p);
    fk_synth_profile_free(&r);
}
END_TEST

START_TEST(test_fit_refuses_mixed_shapes)
{
    struct fk_synth_opts o, w;
    small(&o);
    small(&w);
    w.head_dim = 32;
    w.key_rank = 8;
    w.value_rank = 16;
    char a[128], b[128];
    snprintf(a, sizeof a, "%s/d64.h5", g_dir);
    snprintf(b, sizeof b, "%s/d32.h5", g_dir);
    ck_assert_int_eq(fk_synth_write(&o, a, 0), FK_OK);
    ck_assert_int_eq(fk_synth_write(&w, b, 0), FK_OK);
    const char *pp[2] = {a, b};
    struct fk_synth_profile *p = NULL;
    ck_assert_int_eq(fk_synth_fit(pp, 2, &p), FK_EINVAL);
    ck_assert_msg(strstr(fk_errmsg(), b) && strstr(fk_errmsg(), "head_dim"), "%s",
                  fk_errmsg());
    ck_assert(p == NULL);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("synth_fit");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_fit_recovers_defaults);
    tcase_add_test(tc, test_fit_recovers_other_setting);
    tcase_add_test(tc, test_profile_round_trip_is_exact);
    tcase_add_test(tc, test_profile_drives_generation);
    tcase_add_test(tc, test_fit_refuses_mixed_shapes);
    suite_add_tcase(s, tc);
    return fk_suite_run(s);
}
