/* SPDX-License-Identifier: MIT
 * Faulty codec plugins for tests/test_reliability.sh: a plain copy codec (rows kept as
 * float32, billed as fp16) that misbehaves once it has stored `after` rows (an option):
 *   segvenc   encode() dereferences NULL (SIGSEGV)
 *   abortenc  encode() calls abort() (SIGABRT)
 *   loopenc   encode() spins forever with SIGTERM and SIGINT ignored
 *   nanrec    reconstruct() returns NaN rows while encode() reports honest-looking errors
 *   nanerr    encode() reports a NaN error
 *   failenc   encode() returns an error
 * Each is a different codec of one plugin, so one sweep can hold them and good cells.
 */
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "common/fk_err.h"
#include "core/fk_codec.h"

enum fault { SEGV, ABORT, LOOP, NANREC, NANERR, FAIL };

struct faulty_opts {
    struct fk_common_opts c;
    int after;                   /* rows stored before the fault */
};
static const struct fk_option faulty_options[] = {
    FK_COMMON_OPTIONS(struct faulty_opts),
    {"after", FK_OPT_INT, offsetof(struct faulty_opts, after), 40, 0, 1 << 24, NULL,
     "rows stored before the fault strikes"},
    {NULL, 0, 0, 0, 0, 0, NULL, NULL},
};

struct faulty {
    enum fault fault;
    int m, H, T, after, *stored;
    float *rows;
    uint64_t n;
};

static void faulty_close(void *state)
{
    struct faulty *s = state;
    if (s) {
        free(s->rows);
        free(s->stored);
        free(s);
    }
}

static int faulty_open(enum fault f, const void *opts, const struct fk_stream_env *env,
                       void **state)
{
    struct faulty *s = calloc(1, sizeof *s);
    *state = s;
    if (!s)
        return fk_err(FK_ENOMEM, "faulty: out of memory");
    s->fault = f;
    s->after = ((const struct faulty_opts *)opts)->after;
    s->m = env->head_dim, s->H = env->n_heads, s->T = env->n_tokens;
    s->rows = calloc((size_t)s->H * s->T * s->m + 1, sizeof(float));
    s->stored = calloc((size_t)s->H + 1, sizeof(int));
    return s->rows && s->stored ? FK_OK : fk_err(FK_ENOMEM, "faulty: out of memory");
}

static void strike(struct faulty *s)
{
    if (s->fault == SEGV) {
        volatile int *p = NULL;
        *p = 1;
    } else if (s->fault == ABORT) {
        abort();
    } else if (s->fault == LOOP) {
        signal(SIGTERM, SIG_IGN);
        signal(SIGINT, SIG_IGN);
        for (volatile unsigned long i = 0;; i++)
            ;
    }
}

static int faulty_encode(void *state, const struct fk_event *ev, struct fk_vec_out *out)
{
    struct faulty *s = state;
    for (int i = 0; i < ev->n; i++) {
        if (s->n >= (uint64_t)s->after) {
            strike(s);
            if (s->fault == FAIL)
                return fk_err(FK_EINVAL, "failenc: refused row %llu",
                              (unsigned long long)s->n);
        }
        int h = ev->head[i], t = ev->token[i];
        const float *x = ev->x + (size_t)i * s->m;
        memcpy(s->rows + ((size_t)h * s->T + t) * s->m, x, sizeof(float) * (size_t)s->m);
        s->stored[h] = t + 1;
        s->n++;
        out[i] = (struct fk_vec_out){.err = 0.0062f, .err_enc = 0.0062f, .nnz = s->m,
                                     .bytes = 2.0f * s->m};
        if (s->fault == NANERR && s->n > (uint64_t)s->after)
            out[i].err = NAN;
    }
    return FK_OK;
}

static int faulty_reconstruct(const void *state, int head, int token, float *out)
{
    const struct faulty *s = state;
    if (head < 0 || head >= s->H || token < 0 || token >= s->stored[head])
        return fk_err(FK_EINVAL, "faulty: row (%d, %d) not stored", head, token);
    const float *r = s->rows + ((size_t)head * s->T + token) * s->m;
    for (int c = 0; c < s->m; c++)
        out[c] = s->fault == NANREC && s->n > (uint64_t)s->after ? NAN : r[c];
    return FK_OK;
}

static void faulty_stats(const void *state, struct fk_stream_stats *st)
{
    const struct faulty *s = state;
    memset(st, 0, sizeof *st);
    st->bytes_codes = 2.0 * s->m * (double)s->n;
}

#define FAULTY(NAME, FAULT)                                                               \
    static int NAME##_open(const void *opts, const struct fk_stream_env *env, void **st)  \
    {                                                                                     \
        return faulty_open(FAULT, opts, env, st);                                         \
    }                                                                                     \
    static const struct fk_codec_ops NAME = {                                             \
        .name = #NAME, .summary = "a faulty test codec (tests/plugins/faulty.c)",        \
        .opts_size = sizeof(struct faulty_opts), .options = faulty_options,               \
        .open = NAME##_open, .encode = faulty_encode, .reconstruct = faulty_reconstruct,  \
        .stats = faulty_stats, .close = faulty_close,                                     \
    }

FAULTY(segvenc, SEGV);
FAULTY(abortenc, ABORT);
FAULTY(loopenc, LOOP);
FAULTY(nanrec, NANREC);
FAULTY(nanerr, NANERR);
FAULTY(failenc, FAIL);

static const struct fk_codec_ops *const codecs[] = {&segvenc, &abortenc, &loopenc, &nanrec,
                                                    &nanerr, &failenc, NULL};
static const struct fk_plugin plugin = {FK_PLUGIN_ABI_VERSION, FK_PLUGIN_SIZES, "faulty",
                                        codecs};

const struct fk_plugin *fk_plugin_abi(void)
{
    return &plugin;
}
