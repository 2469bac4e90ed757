/* SPDX-License-Identifier: MIT
 * Isolation (fk_runner.h, child_argv): each lane runs its cells in a worker process of its
 * own, so that a cell whose codec crashes, aborts or runs past the time limit is recorded as
 * failed and the run goes on.
 *
 * A worker is this program started with the lane's command line (the sweep's config,
 * overrides and plugins, the datasets' content hashes) plus --worker: it resolves the sweep
 * once and keeps its datasets loaded from cell to cell. The lane writes one command per
 * cell on the worker's stdin, "RUN <cell id> <workers>", and reads its reports on fd 3,
 * one text line each: "P units_done units_total vectors" after each unit, then "D vectors
 * rel_err" (finished) or "E message" (failed), then "F code" (0 finished, 1 failed and
 * recorded, 3 interrupted, 2 anything else). The worker records the cell's files itself;
 * the lane records crashes and timeouts, whose worker is gone (the next cell starts
 * another).
 */
#define _GNU_SOURCE /* pipe2 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/fk_clock.h"
#include "common/fk_err.h"
#include "runner/fk_runner.h"
#include "runner/fk_runner_int.h"
#include "runner/fk_runner_loop.h"
#include "store/fk_results.h"

extern char **environ;

/* A lane's worker process and what it said of the current cell. */
struct fk_worker {
    pid_t pid;
    int to, from;                /* its stdin (commands), its fd 3 (reports) */
    char buf[2048];              /* an incomplete line */
    size_t n;
    long vectors;
    double rel_err;
    int done, code;              /* "D" seen; the "F" code (-1: none yet) */
    char error[1100];            /* "E" message */
};

/* ---- the lane's side ------------------------------------------------------------------- */

/* Starts lane ln's worker: argv = child_argv + --content-hash H per dataset + --worker. */
static int worker_start(struct lane *ln)
{
    struct run *r = ln->r;
    const char *const *tpl = r->o->child_argv;
    int n = 0, nd = r->s->n_datasets;
    while (tpl[n])
        n++;
    struct fk_worker *w = calloc(1, sizeof *w);
    const char **argv = calloc((size_t)n + 2 * (size_t)nd + 4, sizeof *argv);
    if (!w || !argv) {
        free(w);
        free(argv);
        return fk_err(FK_ENOMEM, "out of memory");
    }
    memcpy(argv, tpl, sizeof *argv * (size_t)n);
    for (int d = 0; d < nd; d++) { /* the worker's cell ids are this run's without rehashing */
        argv[n++] = "--content-hash";
        argv[n++] = r->s->datasets[d].content_hash ? r->s->datasets[d].content_hash : "";
    }
    argv[n++] = "--worker";
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) != 0) {
        free(w);
        free(argv);
        return fk_err(FK_EIO, "cannot make a pipe: %s", strerror(errno));
    }
    if (pipe2(out, O_CLOEXEC) != 0) {
        close(in[0]);
        close(in[1]);
        free(w);
        free(argv);
        return fk_err(FK_EIO, "cannot make a pipe: %s", strerror(errno));
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0); /* the copies lose O_CLOEXEC */
    posix_spawn_file_actions_adddup2(&fa, out[1], 3);
    fflush(NULL); /* nothing buffered here reaches the worker twice */
    int e = posix_spawn(&w->pid, argv[0], &fa, NULL, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    free(argv);
    close(in[0]);
    close(out[1]);
    if (e != 0) {
        close(in[1]);
        close(out[0]);
        free(w);
        return fk_err(FK_EIO, "cannot start %s: %s", tpl[0], strerror(e));
    }
    w->to = in[1];
    w->from = out[0];
    ln->w = w;
    return FK_OK;
}

/* Reaps lane ln's worker (already ending, or killed) into *status. */
static void worker_reap(struct lane *ln, int *status)
{
    struct fk_worker *w = ln->w;
    int st = 0;
    if (w->to >= 0)
        close(w->to);
    close(w->from);
    while (waitpid(w->pid, &st, 0) < 0 && errno == EINTR)
        ;
    if (status)
        *status = st;
    free(w);
    ln->w = NULL;
}

void fk_run_worker_stop(struct lane *ln)
{
    if (!ln->w)
        return;
    close(ln->w->to); /* end of commands: the worker exits */
    ln->w->to = -1;
    worker_reap(ln, NULL);
}

/* Handles the complete lines of w->buf: progress (through the progress hook), done, error,
 * finish. */
static void worker_lines(struct lane *ln, struct fk_worker *w)
{
    char *line = w->buf, *nl;
    while ((nl = memchr(line, '\n', w->n - (size_t)(line - w->buf)))) {
        *nl = 0;
        int done, total, code;
        long v;
        double e;
        if (sscanf(line, "P %d %d %ld", &done, &total, &v) == 3) {
            fk_run_on_unit(ln, done, total, v);
        } else if (sscanf(line, "D %ld %lf", &v, &e) == 2) {
            w->done = 1;
            w->vectors = v;
            w->rel_err = e;
        } else if (line[0] == 'E' && line[1] == ' ') {
            snprintf(w->error, sizeof w->error, "%s", line + 2);
        } else if (sscanf(line, "F %d", &code) == 1) {
            w->code = code;
        }
        line = nl + 1;
    }
    size_t rest = w->n - (size_t)(line - w->buf);
    memmove(w->buf, line, rest);
    w->n = rest;
    if (w->n == sizeof w->buf) /* a line longer than the buffer: dropped */
        w->n = 0;
}

/* Sends lane ln's cell to its worker. */
static int worker_send(struct lane *ln)
{
    struct fk_worker *w = ln->w;
    char cmd[128];
    int n = snprintf(cmd, sizeof cmd, "RUN %s %d\n", ln->cell->id, ln->jobs);
    w->done = 0;
    w->code = -1;
    w->error[0] = 0;
    w->rel_err = NAN;
    w->vectors = 0;
    for (int off = 0; off < n;) {
        ssize_t k = write(w->to, cmd + off, (size_t)(n - off));
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return fk_err(FK_EIO, "cell %s: its worker does not take commands (%s)",
                          ln->cell->id, strerror(errno));
        off += (int)k;
    }
    return FK_OK;
}

/* What became of a cell in its worker. */
enum outcome { OUT_DONE, OUT_FAILED, OUT_STOPPED, OUT_TIMEOUT, OUT_DIED, OUT_ERROR };

/* Follows the worker through lane ln's cell: forwards its progress, kills it past the time
 * limit or half a second after a stop was asked for (it stops by itself within a decode
 * step unless it is stuck where no stop is read, in a plugin's loop). */
static enum outcome worker_follow(struct lane *ln, int *status, struct fk_worker *said)
{
    struct run *r = ln->r;
    struct fk_worker *w = ln->w;
    double t0 = fk_wall_s(), stop_at = 0, limit = r->o->cell_timeout;
    int killed = 0, stopped = 0, timed_out = 0;
    while (w->code < 0) {
        struct pollfd pf = {.fd = w->from, .events = POLLIN};
        if (poll(&pf, 1, 100) > 0) {
            ssize_t got = read(w->from, w->buf + w->n, sizeof w->buf - w->n);
            if (got > 0) {
                w->n += (size_t)got;
                worker_lines(ln, w);
            } else if (got == 0 || errno != EINTR) {
                break; /* the worker is gone */
            }
        }
        double now = fk_wall_s();
        if (limit > 0 && !killed && now - t0 > limit) {
            kill(w->pid, SIGKILL);
            killed = timed_out = 1;
        }
        if (r->o->stop && *r->o->stop && !stopped) {
            kill(w->pid, SIGTERM); /* a terminal's SIGINT reached it already */
            stopped = 1;
            stop_at = now;
        }
        if (stopped && !killed && now - stop_at > 0.5) {
            kill(w->pid, SIGKILL);
            killed = 1;
        }
    }
    int code = w->code;
    *said = *w; /* what it said of the cell, kept past the reaping below */
    if (code < 0 || killed) { /* died, or killed: reap it; the next cell starts another */
        worker_reap(ln, status);
        if (timed_out)
            return OUT_TIMEOUT;
        if (stopped)
            return OUT_STOPPED;
        return OUT_DIED; /* a signal, or exit() in the middle of the cell */
    }
    if (code == 0 && w->done)
        return OUT_DONE;
    if (code == 1)
        return OUT_FAILED;
    if (code == 3 || stopped)
        return OUT_STOPPED;
    return OUT_ERROR;
}

int fk_run_cell_isolated(struct lane *ln)
{
    struct run *r = ln->r;
    fk_run_cell_begin(ln);
    double c0 = fk_wall_s();
    if (!ln->w)
        FK_TRY(worker_start(ln));
    FK_TRY(worker_send(ln));
    int status = 0;
    struct fk_worker copy;
    enum outcome oc = worker_follow(ln, &status, &copy);
    double dt = fk_wall_s() - c0;
    struct fk_runner_cell_end e = {.cell = ln->cell, .index = ln->index,
                                   .todo = r->sum->todo, .wall_s = dt, .rel_err = NAN};
    if (oc == OUT_STOPPED) {
        pthread_mutex_lock(&r->mu);
        r->sum->interrupted = 1;
        pthread_mutex_unlock(&r->mu);
        return FK_OK;
    }
    char msg[1400];
    int rc = FK_OK;
    pthread_mutex_lock(&r->store_mu);
    if (oc == OUT_TIMEOUT) {
        snprintf(msg, sizeof msg, "cell %s (codec %s) ran past its time limit of %g s "
                 "(cell_timeout) and was killed", ln->cell->id, ln->cell->ops->name,
                 r->o->cell_timeout);
        rc = fk_run_commit_failed(ln, "timeout", msg, &e);
    } else if (oc == OUT_DIED) {
        if (WIFSIGNALED(status))
            snprintf(msg, sizeof msg, "cell %s (codec %s): its process died of signal %d (%s)",
                     ln->cell->id, ln->cell->ops->name, WTERMSIG(status),
                     strsignal(WTERMSIG(status)));
        else
            snprintf(msg, sizeof msg, "cell %s (codec %s): its process exited with status %d "
                     "before finishing the cell%s%s", ln->cell->id, ln->cell->ops->name,
                     WIFEXITED(status) ? WEXITSTATUS(status) : -1,
                     copy.error[0] ? ": " : "", copy.error);
        rc = fk_run_commit_failed(ln, "crashed", msg, &e);
    } else if (oc == OUT_DONE) {
        e.vectors = copy.vectors;
        e.rel_err = copy.rel_err;
        fk_run_report_end(r, ln, &e);
    } else if (oc == OUT_FAILED) { /* the worker recorded the failure */
        e.failed = 1;
        e.error = copy.error[0] ? copy.error : "failed";
        fk_run_report_end(r, ln, &e);
    } else {
        rc = fk_err(FK_EIO, "cell %s: its worker process ended with status %d: %s",
                    ln->cell->id, WIFEXITED(status) ? WEXITSTATUS(status) : -1,
                    copy.error[0] ? copy.error : "(no message)");
    }
    if (rc == FK_OK)
        rc = fk_run_tables(r, 0);
    pthread_mutex_unlock(&r->store_mu);
    return rc;
}

/* ---- the worker's side ----------------------------------------------------------------- */

/* Writes all of a line to the lane (a short write is retried). */
static void say(int fd, const char *line)
{
    size_t n = strlen(line), off = 0;
    while (off < n) {
        ssize_t w = write(fd, line + off, n - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return;
        off += (size_t)w;
    }
}

struct report {
    int fd;
};

static void say_unit(void *ctx, int done, int total, long vectors)
{
    const struct report *rp = ctx;
    char line[96];
    snprintf(line, sizeof line, "P %d %d %ld\n", done, total, vectors);
    say(rp->fd, line);
}

/* "E message": the message on one line. */
static void say_error(int fd, const char *msg)
{
    char line[1200];
    snprintf(line, sizeof line, "E %s", msg);
    for (char *p = line; *p; p++)
        if (*p == '\n' || *p == '\r')
            *p = ' ';
    strncat(line, "\n", sizeof line - strlen(line) - 1);
    say(fd, line);
}

/* Runs one cell in the worker: 0 finished, 1 failed (recorded), 3 interrupted, 2 else. */
static int worker_cell(struct run *r, struct lane *ln, int fd, volatile sig_atomic_t *stop)
{
    const struct fk_sweep *s = r->s;
    struct fk_cell_result res;
    struct fk_cell_loop loop = {0};
    struct report rp = {.fd = fd};
    int rrc = fk_run_load_dataset(r, ln->cell);
    if (rrc == FK_OK)
        rrc = fk_run_replay_here(ln, stop, say_unit, &rp, &res, &loop);
    ln->loop = rrc == FK_OK && r->ld[ln->cell->dataset].loop ? &loop : NULL;
    int code;
    char msg[1100];
    if (rrc == FK_EINTR || (stop && *stop)) {
        if (rrc == FK_OK)
            fk_cell_result_free(&res);
        code = 3;
    } else {
        struct fk_cell_meta meta;
        fk_run_cell_meta(r, ln->cell, ln->loop, &meta);
        int wrc;
        if (rrc < 0) {
            snprintf(msg, sizeof msg, "%s", fk_errmsg());
            say_error(fd, msg);
            wrc = fk_results_commit_failed(s->output, &meta, "failed", msg);
            code = 1;
        } else {
            long vectors = res.vectors;
            wrc = fk_results_commit(s->output, &meta, &res);
            fk_cell_result_free(&res);
            double e = NAN;
            if (wrc == FK_OK) {
                fk_results_metric(s->output, ln->cell->id, "rel_err_mean", &e);
                snprintf(msg, sizeof msg, "D %ld %.17g\n", vectors, e);
                say(fd, msg);
            }
            code = 0;
        }
        if (wrc < 0) {
            snprintf(msg, sizeof msg, "writing results: %s", fk_errmsg());
            say_error(fd, msg);
            code = 2;
        }
    }
    ln->loop = NULL;
    fk_runner_loop_free(&loop);
    return code;
}

/* The next command line from fd (up to a newline) into buf; 0 at the end of commands. */
static int read_command(int fd, char *buf, size_t cap)
{
    size_t n = 0;
    while (n + 1 < cap) {
        char c;
        ssize_t k = read(fd, &c, 1);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return 0;
        if (c == '\n')
            break;
        buf[n++] = c;
    }
    buf[n] = 0;
    return 1;
}

int fk_runner_worker(const struct fk_sweep *s, int in_fd, int out_fd,
                     volatile sig_atomic_t *stop)
{
    struct fk_runner_summary sum = {0};
    struct fk_runner_opts o = {.stop = stop};
    struct run r = {.s = s, .o = &o, .sum = &sum, .t_start = fk_wall_s(),
                    .mu = PTHREAD_MUTEX_INITIALIZER, .store_mu = PTHREAD_MUTEX_INITIALIZER,
                    .cv = PTHREAD_COND_INITIALIZER, .worker = 1};
    r.ld = calloc((size_t)s->n_datasets, sizeof *r.ld);
    if (!r.ld)
        return fk_err(FK_ENOMEM, "out of memory");
    struct lane ln = {.r = &r};
    if (fk_replay_pool_new(&ln.pool) < 0)
        ln.pool = NULL;
    char cmd[256], id[128];
    int jobs, rc = FK_OK;
    while (rc == FK_OK && !(stop && *stop) && read_command(in_fd, cmd, sizeof cmd)) {
        if (sscanf(cmd, "RUN %127s %d", id, &jobs) != 2 || jobs < 1) {
            rc = fk_err(FK_EINVAL, "worker: unknown command '%s'", cmd);
            break;
        }
        int c = 0;
        while (c < s->n_cells && strcmp(s->cells[c].id, id))
            c++;
        int code = 2;
        if (c == s->n_cells) {
            char msg[256];
            snprintf(msg, sizeof msg, "no cell %s in sweep %s", id, s->path);
            say_error(out_fd, msg);
        } else {
            ln.cell = &s->cells[c];
            ln.jobs = jobs;
            code = worker_cell(&r, &ln, out_fd, stop);
        }
        char fin[32];
        snprintf(fin, sizeof fin, "F %d\n", code);
        say(out_fd, fin);
    }
    fk_replay_pool_free(&ln.pool);
    fk_run_free_loaded(&r);
    return rc;
}
