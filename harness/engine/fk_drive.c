/* SPDX-License-Identifier: MIT
 * The codec driver (see fk_drive.h). Spec: algorithms.md section 4.
 */
#include "engine/fk_drive.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/fk_clock.h"
#include "common/fk_err.h"
#include "core/fk_registry.h"
#include "engine/fk_schedule.h"
#include "core/fk_rewrite.h"

int fk_drive_init(struct fk_drive *d)
{
    memset(d, 0, sizeof *d);
    return fk_obs_set_create(&d->obs);
}

void fk_drive_free(struct fk_drive *d)
{
    fk_obs_set_free(&d->obs);
    free(d->x);
    free(d->tok);
    free(d->head);
    free(d->out);
    free(d->xr);
    free(d->evict_step);
    free(d->prev);
    free(d->dropped);
    free(d->kvw[0]);
    free(d->kvw[1]);
    memset(d, 0, sizeof *d);
}

static int grow(void **p, size_t need, size_t elem)
{
    void *n = realloc(*p, need * elem);
    if (!n)
        return fk_err(FK_ENOMEM, "out of memory (%zu bytes)", need * elem);
    *p = n;
    return FK_OK;
}

/* Room for events of n vectors of m floats. */
static int reserve_event(struct fk_drive *d, size_t n, int m)
{
    if ((size_t)m * n > d->cap_x) {
        FK_TRY(grow((void **)&d->x, (size_t)m * n, sizeof(float)));
        d->cap_x = (size_t)m * n;
    }
    if (n > d->cap_n) {
        FK_TRY(grow((void **)&d->tok, n, sizeof(int32_t)));
        FK_TRY(grow((void **)&d->head, n, sizeof(int32_t)));
        FK_TRY(grow((void **)&d->out, n, sizeof(struct fk_vec_out)));
        d->cap_n = n;
    }
    return FK_OK;
}

/* The schedule of stream `kind` (its codec's buffer rule). */
static struct fk_sched unit_sched(const struct fk_unit *u, int kind)
{
    const struct fk_buffer *b = &u->buf[kind];
    return (struct fk_sched){.n_tokens = u->n_tokens, .prompt_len = u->prompt_len,
                             .n_b = b->n_b, .a_len = b->a_len, .mode = b->mode};
}

/* Nothing non-finite is recorded: every error a codec reported for the event's rows, and
 * every coordinate of the rows as they reconstruct right after it, is a finite number; else
 * FK_EINVAL naming the first offending row. */
static int check_finite(struct fk_drive *d, const struct fk_unit *u, int kind,
                        const struct fk_event *ev)
{
    int m = u->head_dim;
    if ((size_t)m > d->cap_xr) {
        FK_TRY(grow((void **)&d->xr, (size_t)m, sizeof(float)));
        d->cap_xr = (size_t)m;
    }
    for (int i = 0; i < ev->n; i++) {
        const struct fk_vec_out *o = &d->out[i];
        if (!isfinite(o->err) || !isfinite(o->err_enc))
            return fk_err(FK_EINVAL, "codec %s reported a non-finite error (err %g, err_enc %g) "
                          "for the row of head %d, token %d", u->ops->name, o->err, o->err_enc,
                          ev->head[i], ev->token[i]);
        FK_TRY(u->ops->reconstruct(u->st[kind], ev->head[i], ev->token[i], d->xr));
        for (int c = 0; c < m; c++)
            if (!isfinite(d->xr[c]))
                return fk_err(FK_EINVAL, "codec %s reconstructs the row of head %d, token %d "
                              "with a non-finite value (%g at coordinate %d)", u->ops->name,
                              ev->head[i], ev->token[i], d->xr[c], c);
    }
    return FK_OK;
}

/* Encodes tokens e->first .. e->end-1 of every head of stream `kind` as one event and
 * reports it to the observers; for a codec that accepts skipped tokens (FK_CAP_SKIPS), the
 * rows the policy has dropped already are left out. tok_step: see struct fk_commit. */
static int encode_event(struct fk_drive *d, struct fk_unit *u, int kind,
                        const struct fk_sched_event *e, const int32_t *tok_step)
{
    int H = u->n_kv_heads, T = u->n_tokens, m = u->head_dim;
    int n = (e->end - e->first) * H;
    if (n <= 0)
        return FK_OK;
    FK_TRY(reserve_event(d, (size_t)n, m));
    int skips = u->evict && (u->ops->caps & FK_CAP_SKIPS), i = 0;
    for (int t = e->first; t < e->end; t++)
        for (int h = 0; h < H; h++) {
            if (skips && t <= d->seen && !u->keep[(size_t)h * T + t])
                continue; /* dropped before its turn: never coded */
            float *xi = d->x + (size_t)i * m;
            const float *src = u->kvw[kind]
                                   ? u->kvw[kind] + ((size_t)h * T + t) * m
                                   : fk_stored_row(u->kv[kind], u->kv_enc[kind],
                                                   (size_t)h * T + t, m, xi);
            if (src != xi)
                memcpy(xi, src, sizeof(float) * (size_t)m);
            d->tok[i] = t;
            d->head[i] = h;
            i++;
        }
    if ((n = i) == 0)
        return FK_OK;
    struct fk_event ev = {.phase = e->phase, .step = e->step, .n = n, .x = d->x,
                          .token = d->tok, .head = d->head};
    double c0 = fk_clock_s(CLOCK_THREAD_CPUTIME_ID);
    int rc = u->ops->encode(u->st[kind], &ev, d->out);
    double c1 = fk_clock_s(CLOCK_THREAD_CPUTIME_ID);
    u->times->t_encode += c1 - c0;
    if (rc == FK_OK)
        rc = check_finite(d, u, kind, &ev);
    if (rc < 0)
        return fk_err_context(rc, "%s: layer %d %s: codec %s, %s event of tokens %d..%d",
                              u->path, u->layer, kind ? "V" : "K", u->ops->name,
                              e->phase ? "decode" : "prefill", e->first, e->end - 1);
    struct fk_commit c = {.kind = kind, .ev = &ev, .out = d->out, .tok_step = tok_step,
                          .cpu_s = c1 - c0};
    for (int j = 0; j < d->obs.n && rc == FK_OK; j++)
        if (d->obs.ops[j]->on_commit)
            rc = d->obs.ops[j]->on_commit(d->obs.self[j], u, &c);
    u->times->t_metrics += fk_clock_s(CLOCK_THREAD_CPUTIME_ID) - c1;
    return rc;
}

/* The prefill event and, for a static codec (its codes do not depend on what it coded
 * before), every decode token up front in blocks of FK_STATIC_BLOCK tokens (one large SGEMM
 * instead of one per step; stored rows are only read up to the current eviction point, so
 * nothing else changes). One stream after the other: each stream's Gram keeps its hot
 * rows in cache for the whole stream, where interleaving K and V blocks made the two
 * Grams evict each other's rows. */
/* FK_EINTR once a stop was asked for (a signal): read at every decode step and static
 * block, so that a long unit stops within a step. */
static int stop_asked(const struct fk_unit *u)
{
    if (u->ro->stop && *u->ro->stop)
        return fk_err(FK_EINTR, "interrupted");
    return FK_OK;
}

static int drive_ahead(struct fk_drive *d, struct fk_unit *u)
{
    int is_static = (u->ops->caps & FK_CAP_STATIC) != 0;
    if (is_static && (size_t)u->n_tokens + 1 > d->cap_es) {
        FK_TRY(grow((void **)&d->evict_step, (size_t)u->n_tokens + 1, sizeof(int32_t)));
        d->cap_es = (size_t)u->n_tokens + 1;
    }
    for (int k = 0; k < 2; k++) {
        struct fk_sched s = unit_sched(u, k);
        struct fk_sched_event pre = {.phase = 0, .step = -1, .first = 0,
                                     .end = fk_sched_prefill_end(&s)};
        FK_TRY(encode_event(d, u, k, &pre, NULL));
        u->n_comp[k] = pre.end;
        if (!is_static)
            continue;
        fk_sched_evict_steps(&s, d->evict_step);
        struct fk_sched_blocks b;
        struct fk_sched_event e;
        fk_sched_blocks_begin(&b, &s, FK_STATIC_BLOCK);
        while (fk_sched_blocks_next(&b, &e)) {
            FK_TRY(stop_asked(u));
            FK_TRY(encode_event(d, u, k, &e, d->evict_step));
        }
    }
    return FK_OK;
}

static int notify_step(struct fk_drive *d, const struct fk_unit *u, const struct fk_step *s)
{
    for (int j = 0; j < d->obs.n; j++)
        if (d->obs.ops[j]->on_step)
            FK_TRY(d->obs.ops[j]->on_step(d->obs.self[j], u, s));
    return FK_OK;
}

static struct fk_step step_of(const struct fk_unit *u, int t, enum fk_step_when when)
{
    return (struct fk_step){.step = t - u->prompt_len, .t = t,
                            .n_comp = {u->n_comp[0], u->n_comp[1]}, .when = when};
}

/* ---- the eviction policy ---------------------------------------------------------------- */

static int policy_open(struct fk_drive *d, struct fk_unit *u)
{
    size_t n = (size_t)u->n_kv_heads * u->n_tokens;
    if (n > d->cap_mask) {
        FK_TRY(grow((void **)&d->prev, n, 1));
        FK_TRY(grow((void **)&d->dropped, n, sizeof(int32_t)));
        d->cap_mask = n;
    }
    memset(d->prev, 0, n);
    d->n_dropped = 0;
    d->seen = -1;
    struct fk_evict_env env = {.layer = u->layer, .n_layers = u->n_layers,
                               .n_kv_heads = u->n_kv_heads,
                               .n_q_heads = u->n_q_heads, .head_dim = u->head_dim,
                               .n_tokens = u->n_tokens, .prompt_len = u->prompt_len,
                               .keep = u->keep, .inv_scale = u->attn_inv_scale,
                               .softcap = u->attn_softcap, .rope = u->rope,
                               .positions = u->positions, .head_scores = u->head_scores};
    int rc = u->evict->open(u->evict_opts, &env, &d->pst);
    if (rc < 0)
        return fk_err_context(rc, "%s: layer %d: opening eviction policy %s", u->path, u->layer,
                              u->evict->name);
    return FK_OK;
}

/* Runs the policy's hook for token t (prefill: t = P-1) after setting the arriving tokens'
 * bits, then adds the rows it dropped to d->dropped. */
static int policy_hook(struct fk_drive *d, struct fk_unit *u, int prefill, int t)
{
    int H = u->n_kv_heads, T = u->n_tokens;
    int first = prefill ? 0 : t;
    d->seen = t;
    for (int h = 0; h < H; h++)
        for (int j = first; j <= t; j++)
            u->keep[(size_t)h * T + j] = d->prev[(size_t)h * T + j] = 1;
    unsigned nd = u->evict->needs ? u->evict->needs(u->evict_opts) : 0;
    /* the rows as the cache holds them: rewritten ones after the prefill's rewrites */
    const float *kr = u->kvw[0] ? u->kvw[0] : u->kvf[0];
    const float *vr = u->kvw[1] ? u->kvw[1] : u->kvf[1];
    struct fk_evict_view v = {.t = t, .k = kr, .v = (nd & FK_EVICT_NEED_VALUES) ? vr : NULL,
                              .q = u->qa, .n_qrows = u->n_qa, .qrow = u->qarow};
    int (*hook)(void *, const struct fk_evict_view *) =
        prefill ? u->evict->prefill : u->evict->decode;
    double c0 = fk_clock_s(CLOCK_THREAD_CPUTIME_ID);
    int rc = hook ? hook(d->pst, &v) : FK_OK;
    u->times->t_policy += fk_clock_s(CLOCK_THREAD_CPUTIME_ID) - c0;
    if (rc < 0)
        return fk_err_context(rc, "%s: layer %d: eviction policy %s at token %d", u->path,
                              u->layer, u->evict->name, t);
    for (int h = 0; h < H; h++) {
        uint8_t *kp = u->keep + (size_t)h * T, *pp = d->prev + (size_t)h * T;
        /* nothing dropped: the bits of the arriving tokens are set, so n >= 1; else the
         * blocks of 64 tokens that changed are walked, and n counts the kept tokens */
        int same = !memcmp(kp, pp, (size_t)t + 1), n = same;
        for (int j0 = 0; !same && j0 <= t; j0 += 64) {
            int j1 = t + 1 - j0 < 64 ? t + 1 : j0 + 64;
            for (int j = j0; j < j1; j++)
                n += kp[j] != 0;
            if (!memcmp(kp + j0, pp + j0, (size_t)(j1 - j0)))
                continue;
            for (int j = j0; j < j1; j++) {
                if (pp[j] && !kp[j])
                    d->dropped[d->n_dropped++] = h * T + j;
                else if (!pp[j] && kp[j])
                    return fk_err(FK_EINVAL, "%s: layer %d: eviction policy %s re-admitted "
                                  "token %d of KV head %d", u->path, u->layer, u->evict->name,
                                  j, h);
                pp[j] = kp[j];
            }
        }
        if (n < 1 || (!prefill && !kp[t]))
            return fk_err(FK_EINVAL, "%s: layer %d: eviction policy %s dropped %s of KV head "
                          "%d at token %d", u->path, u->layer, u->evict->name,
                          n < 1 ? "every token" : "the current token", h, t);
    }
    return FK_OK;
}

/* The prefill's row rewrites (evict/fk_rewrite.h): the layer's rows copied, rewritten
 * after the policy's prefill hook, and from then on the rows the cache holds (u->kvw). */
static int rewrite_rows(struct fk_drive *d, struct fk_unit *u)
{
    size_t n = (size_t)u->n_kv_heads * u->n_tokens * u->head_dim;
    if (n > d->cap_kvw) {
        FK_TRY(grow((void **)&d->kvw[0], n, sizeof(float)));
        FK_TRY(grow((void **)&d->kvw[1], n, sizeof(float)));
        d->cap_kvw = n;
    }
    for (int k = 0; k < 2; k++)
        memcpy(d->kvw[k], u->kvf[k], sizeof(float) * n);
    struct fk_rewrite_in in = {.n_kv_heads = u->n_kv_heads, .n_q_heads = u->n_q_heads,
                               .head_dim = u->head_dim, .n_tokens = u->n_tokens,
                               .prompt_len = u->prompt_len, .keep = u->keep, .k = d->kvw[0],
                               .v = d->kvw[1], .q = u->qa, .n_qrows = u->n_qa,
                               .qrow = u->qarow};
    double c0 = fk_clock_s(CLOCK_THREAD_CPUTIME_ID);
    int rc = fk_rewrite_apply(u->rewrite, &in, NULL);
    u->times->t_policy += fk_clock_s(CLOCK_THREAD_CPUTIME_ID) - c0;
    if (rc < 0)
        return fk_err_context(rc, "%s: layer %d: the prefill's row rewrites", u->path,
                              u->layer);
    u->kvw[0] = d->kvw[0];
    u->kvw[1] = d->kvw[1];
    return FK_OK;
}

/* The decode steps P .. T-1 and their evictions (K's, then V's). */
static int drive_decode(struct fk_drive *d, struct fk_unit *u)
{
    struct fk_sched_iter it[2];
    struct fk_sched_event e[2];
    int has[2];
    for (int k = 0; k < 2; k++) {
        struct fk_sched s = unit_sched(u, k);
        fk_sched_begin(&it[k], &s);
        has[k] = fk_sched_next(&it[k], &e[k]);
        if (has[k] && e[k].phase == 0)
            has[k] = fk_sched_next(&it[k], &e[k]);
    }
    int is_static = (u->ops->caps & FK_CAP_STATIC) != 0;
    for (int t = u->prompt_len; t < u->n_tokens; t++) {
        int step = t - u->prompt_len;
        FK_TRY(stop_asked(u));
        struct fk_step begin = step_of(u, t, FK_STEP_BEGIN);
        if (u->evict) {
            FK_TRY(policy_hook(d, u, 0, t));
            begin.n_dropped = d->n_dropped;
            begin.dropped = d->dropped;
        }
        FK_TRY(notify_step(d, u, &begin));
        d->n_dropped = 0;
        for (int k = 0; k < 2; k++) {
            if (!has[k] || e[k].step != step)
                continue;
            if (!is_static)
                FK_TRY(encode_event(d, u, k, &e[k], NULL));
            u->n_comp[k] = e[k].end;
            has[k] = fk_sched_next(&it[k], &e[k]);
        }
        struct fk_step end = step_of(u, t, FK_STEP_END);
        FK_TRY(notify_step(d, u, &end));
    }
    return FK_OK;
}

static int open_states(struct fk_unit *u)
{
    for (int k = 0; k < 2; k++) {
        struct fk_stream_env env = {.layer = u->layer, .kind = k, .head_dim = u->head_dim,
                                    .n_heads = u->n_kv_heads, .n_tokens = u->n_tokens,
                                    .base = u->bases ? &u->bases[k] : NULL,
                                    .basis = u->basis[k], .calib = u->calib[k],
                                    .external = u->ext[k],
                                    .positions = u->positions,
                                    .rope = u->rope, .reference = u->ro->reference};
        /* the rows encode_event hands over, known in advance (none in reference mode, and
         * none when the prefill's rewrites change them after the states open) */
        const float *ahead = u->ro->reference || u->rewrite ? NULL : u->kvf[k];
        int rc = fk_codec_open(u->ops, u->opts, &env, ahead, &u->st[k]);
        if (rc < 0)
            return fk_err_context(rc, "%s: layer %d %s: opening codec %s", u->path, u->layer,
                                  k ? "V" : "K", u->ops->name);
    }
    return FK_OK;
}

static int finish(struct fk_drive *d, struct fk_unit *u, struct fk_unit_result *r)
{
    double m0 = fk_clock_s(CLOCK_THREAD_CPUTIME_ID);
    int rc = FK_OK;
    for (int j = 0; j < d->obs.n && rc == FK_OK; j++)
        if (d->obs.ops[j]->on_finish)
            rc = d->obs.ops[j]->on_finish(d->obs.self[j], u, r);
    u->times->t_metrics += fk_clock_s(CLOCK_THREAD_CPUTIME_ID) - m0;
    return rc;
}

int fk_drive_unit(struct fk_drive *d, struct fk_unit *u, struct fk_unit_result *r)
{
    u->st[0] = u->st[1] = NULL;
    u->kvw[0] = u->kvw[1] = NULL;
    u->n_comp[0] = u->n_comp[1] = 0;
    for (int k = 0; k < 2; k++)
        fk_codec_buffer(u->ops, u->opts, k, &u->buf[k]);
    int rc = FK_OK;
    for (int j = 0; j < d->obs.n && rc == FK_OK; j++)
        if (d->obs.ops[j]->start)
            rc = d->obs.ops[j]->start(d->obs.self[j], u);
    if (rc == FK_OK)
        rc = open_states(u);
    if (rc == FK_OK && u->evict)
        rc = policy_open(d, u);
    /* the prefill hook reads only exact rows and queries: it runs before the prefill's
     * rows are coded, so that a codec skipping dropped tokens never sees its drops */
    if (rc == FK_OK && u->evict && u->prompt_len > 0)
        rc = policy_hook(d, u, 1, u->prompt_len - 1);
    if (rc == FK_OK && u->rewrite)
        rc = rewrite_rows(d, u);
    if (rc == FK_OK)
        rc = drive_ahead(d, u);
    if (rc == FK_OK)
        rc = drive_decode(d, u);
    if (rc == FK_OK)
        rc = finish(d, u, r);
    /* the one cleanup path: whatever opened is closed */
    for (int k = 0; k < 2; k++) {
        if (u->st[k])
            u->ops->close(u->st[k]);
        u->st[k] = NULL;
    }
    if (d->pst)
        u->evict->close(d->pst);
    d->pst = NULL;
    return rc;
}
