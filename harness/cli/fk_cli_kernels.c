/* SPDX-License-Identifier: MIT
 * Kernel honesty for `bench omp` and `bench replay` (fk_cli.h): the same benchmark run again
 * in a child process with other OpenBLAS kernels, whose figures the parent prints in a
 * column of their own. OpenBLAS picks its kernel set when the library loads (from the CPU,
 * or from OPENBLAS_CORETYPE), so another set needs another process: the child is this
 * program with the same arguments plus `--tsv --kernels none`, and OPENBLAS_CORETYPE unset
 * (the CPU's best kernels that this OpenBLAS has), set to a name, or left as it is (same:
 * the mechanism without changing the kernels). Only that child's environment changes.
 */
#include <errno.h>
#include <math.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/fk_cli.h"
#include "kernels/fk_blas.h"

extern char **environ;

int fk_cli_kernels_mode(const char *v, const char **mode)
{
    if (!strcmp(v, "best") || !strcmp(v, "none") || !strcmp(v, "same")) {
        *mode = v;
        return 0;
    }
    for (const char *c = v; *c; c++)
        if (!((*c >= 'A' && *c <= 'Z') || (*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9')))
            return -1;
    *mode = *v ? v : NULL;
    return *v ? 0 : -1;
}

int fk_cli_kernels_wanted(const char *mode)
{
    if (!mode || !strcmp(mode, "none"))
        return 0;
    /* best with OPENBLAS_CORETYPE unset: this run has them already */
    return strcmp(mode, "best") || getenv("OPENBLAS_CORETYPE") != NULL;
}

const char *fk_cli_kernels_origin(void)
{
    return getenv("OPENBLAS_CORETYPE") ? "OPENBLAS_CORETYPE set" : "chosen for this CPU";
}

/* The child's environment: ours with OPENBLAS_CORETYPE removed, or replaced by name. */
static char **child_env(const char *mode, char *set, size_t cap)
{
    size_t n = 0;
    while (environ[n])
        n++;
    char **env = calloc(n + 2, sizeof *env);
    if (!env)
        return NULL;
    size_t k = 0;
    int same = !strcmp(mode, "same");
    for (size_t i = 0; i < n; i++)
        if (same || strncmp(environ[i], "OPENBLAS_CORETYPE=", 18))
            env[k++] = environ[i];
    if (!same && strcmp(mode, "best")) {
        snprintf(set, cap, "OPENBLAS_CORETYPE=%s", mode);
        env[k++] = set;
    }
    env[k] = NULL;
    return env;
}

/* The child's arguments: the program, `bench`, ours without --kernels / --codes-out / --dump
 * and their values (it writes no files), then --tsv --kernels none. */
static char **child_args(char *exe, int argc, char **argv)
{
    char **av = calloc((size_t)argc + 6, sizeof *av);
    if (!av)
        return NULL;
    int k = 0;
    av[k++] = exe;
    av[k++] = "bench";
    for (int i = 0; i < argc; i++) {
        if (i > 0 && i + 1 < argc &&
            (!strcmp(argv[i], "--kernels") || !strcmp(argv[i], "--codes-out") ||
             !strcmp(argv[i], "--dump"))) {
            i++;
            continue;
        }
        if (i > 0 && !strcmp(argv[i], "--tsv"))
            continue;
        av[k++] = argv[i];
    }
    av[k++] = "--tsv";
    av[k++] = "--kernels";
    av[k++] = "none";
    av[k] = NULL;
    return av;
}

/* Reads the child's "NAME<TAB>VALUE" lines into figs. */
static void parse_figs(char *text, struct fk_cli_figs *figs)
{
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        char *tab = strchr(line, '\t');
        if (!tab || figs->n >= FK_CLI_FIGS_MAX)
            continue;
        *tab = 0;
        snprintf(figs->name[figs->n], sizeof figs->name[0], "%s", line);
        snprintf(figs->value[figs->n], sizeof figs->value[0], "%s", tab + 1);
        figs->n++;
    }
}

int fk_cli_kernels_child(const char *mode, int argc, char **argv, struct fk_cli_figs *figs,
                         char *err, size_t cap)
{
    memset(figs, 0, sizeof *figs);
    char exe[4096], set[128];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) {
        snprintf(err, cap, "cannot find this program (/proc/self/exe: %s)", strerror(errno));
        return -1;
    }
    exe[len] = 0;
    char **env = child_env(mode, set, sizeof set), **av = child_args(exe, argc, argv);
    int fd[2] = {-1, -1}, rc = -1;
    posix_spawn_file_actions_t fa;
    int have_fa = 0;
    pid_t pid = -1;
    if (!env || !av) {
        snprintf(err, cap, "out of memory");
    } else if (pipe(fd) != 0) {
        snprintf(err, cap, "pipe: %s", strerror(errno));
    } else if (posix_spawn_file_actions_init(&fa) == 0) {
        have_fa = 1;
        posix_spawn_file_actions_adddup2(&fa, fd[1], STDOUT_FILENO);
        posix_spawn_file_actions_addclose(&fa, fd[0]);
        /* /proc/self/exe: this very program, even when its file was replaced meanwhile */
        int e = posix_spawn(&pid, "/proc/self/exe", &fa, NULL, av, env);
        if (e != 0) {
            snprintf(err, cap, "cannot start %s: %s", exe, strerror(e));
            pid = -1;
        }
    }
    if (fd[1] >= 0)
        close(fd[1]);
    size_t n = 0, room = 1 << 16;
    char *text = pid > 0 ? malloc(room) : NULL;
    if (pid > 0 && !text)
        snprintf(err, cap, "out of memory");
    for (ssize_t r; text && (r = read(fd[0], text + n, room - 1 - n)) != 0;) {
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            break;
        n += (size_t)r;
        if (n + 1 >= room) { /* keep reading (a full pipe would block the child) */
            char *t = realloc(text, 2 * room);
            if (!t) {
                n = 0; /* nothing half-read is parsed */
                break;
            }
            text = t;
            room *= 2;
        }
    }
    if (fd[0] >= 0)
        close(fd[0]);
    int status = 0;
    if (pid > 0) {
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
            ;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            snprintf(err, cap, "the child (--kernels %s) failed (wait status %d)", mode,
                     status);
        else if (text) {
            text[n] = 0;
            parse_figs(text, figs);
            rc = figs->n > 0 ? 0 : -1;
            if (rc)
                snprintf(err, cap, "the child printed no figures");
        }
    }
    if (have_fa)
        posix_spawn_file_actions_destroy(&fa);
    free(text);
    free(env);
    free(av);
    return rc;
}

const char *fk_cli_fig(const struct fk_cli_figs *figs, const char *name)
{
    for (int i = 0; i < figs->n; i++)
        if (!strcmp(figs->name[i], name))
            return figs->value[i];
    return NULL;
}

static void kernels_header(const char *mode, const struct fk_cli_figs *child)
{
    const char *k = fk_cli_fig(child, "kernels");
    char how[96];
    if (!strcmp(mode, "best") || !strcmp(mode, "same"))
        snprintf(how, sizeof how, "OPENBLAS_CORETYPE %s",
                 !strcmp(mode, "best") ? "unset: the CPU's best" : "as here");
    else
        snprintf(how, sizeof how, "OPENBLAS_CORETYPE=%s", mode);
    printf("OpenBLAS kernel sets: this run %s (%s); other %s (%s). Both columns after this run "
           "come from child processes run in turn (other, then this run's kernels again): "
           "other/this divides by the mean of the two runs with this run's kernels\n",
           fk_blas_kernels(), fk_cli_kernels_origin(), k ? k : "?", how);
}

/* One row: the figure in the three runs, and other / mean(this, again). */
static void table_row(const char *label, const char *fmt, const char *a, const char *b,
                      const char *c)
{
    double x = atof(a), y = atof(b), z = c ? atof(c) : x, ref = 0.5 * (x + z);
    char ta[32], tb[32], tc[32];
    if (!fmt)
        fmt = fabs(x) >= 100 ? "%.0f" : "%.4f";
    snprintf(ta, sizeof ta, fmt, x);
    snprintf(tb, sizeof tb, fmt, y);
    snprintf(tc, sizeof tc, fmt, z);
    printf("  %-34s %14s %14s %14s %10.3f\n", label, ta, tb, c ? tc : "?",
           ref != 0 ? y / ref : 0.0);
}

static void kernels_table(const char *mode, const struct fk_cli_figs *own,
                          const struct fk_cli_figs *other, const struct fk_cli_figs *again,
                          const struct fk_cli_fig_label *labels)
{
    kernels_header(mode, other);
    const char *ko = fk_cli_fig(other, "kernels");
    printf("  %-34s %14s %14s %14s %10s\n", "figure", fk_cli_fig(own, "kernels"),
           ko ? ko : "?", "this again", "other/this");
    for (int i = 0; labels ? labels[i].name != NULL : i < own->n; i++) {
        const char *name = labels ? labels[i].name : own->name[i];
        const char *a = fk_cli_fig(own, name), *b = fk_cli_fig(other, name);
        if (!a || !b || !strcmp(name, "kernels") || !strcmp(name, "codes_hash"))
            continue;
        table_row(labels ? labels[i].label : name, labels ? labels[i].fmt : NULL, a, b,
                  fk_cli_fig(again, name));
    }
    const char *ha = fk_cli_fig(own, "codes_hash"), *hb = fk_cli_fig(other, "codes_hash"),
               *hc = fk_cli_fig(again, "codes_hash");
    if (ha)
        printf("  %-34s %14s %14s %14s %10s\n", "codes hash", ha, hb ? hb : "?", hc ? hc : "?",
               hc && !strcmp(ha, hc) ? (hb && !strcmp(ha, hb) ? "all equal" : "again equal")
                                     : "differ");
}

void fk_cli_kernels_compare(const char *mode, int argc, char **argv,
                            const struct fk_cli_figs *own,
                            const struct fk_cli_fig_label *labels)
{
    static struct fk_cli_figs other, again; /* large: not on the stack */
    char err[256];
    fflush(stdout);
    if (fk_cli_kernels_child(mode, argc, argv, &other, err, sizeof err) != 0) {
        printf("OpenBLAS kernel sets: this run %s; the other column failed: %s\n",
               fk_blas_kernels(), err);
        return;
    }
    if (fk_cli_kernels_child("same", argc, argv, &again, err, sizeof err) != 0)
        again.n = 0; /* the column shows ? */
    kernels_table(mode, own, &other, &again, labels);
}
