/* SPDX-License-Identifier: MIT
 * Locks, claims and temporary names of a results directory (see fk_claim.h).
 */
#include "store/fk_claim.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fk_err.h"
#include "store/fk_results.h"

/* This host's name with '.', '/' and blanks replaced, so that it can sit inside a file
 * name and be read back. */
static const char *host_name(void)
{
    static char host[72];
    if (!host[0]) {
        if (gethostname(host, sizeof host - 1) != 0 || !host[0])
            strcpy(host, "localhost");
        host[sizeof host - 1] = 0;
        for (char *p = host; *p; p++)
            if (*p == '.' || *p == '/' || *p == ' ' || *p == '\t' || *p == '\n')
                *p = '_';
    }
    return host;
}

/* The first cap-1 bytes of a small file, NUL-terminated; 0 when it cannot be read. */
static int read_small(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, cap - 1, f);
    fclose(f);
    buf[n] = 0;
    return 1;
}

/* Start time of process pid in clock ticks since boot (field 22 of /proc/PID/stat), or 0
 * when it cannot be read. */
static unsigned long long proc_start(long pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    if (!read_small(path, buf, sizeof buf))
        return 0;
    const char *p = strrchr(buf, ')'); /* the command name may hold blanks and parentheses */
    unsigned long long start = 0;
    /* after ")": state (field 3) ... starttime (field 22) */
    for (int field = 2; p && *p && field < 22; p++)
        if (*p == ' ')
            field++;
    if (p && sscanf(p, "%llu", &start) != 1)
        start = 0;
    return start;
}

/* 1 if process pid of this host is alive and started at `start` (0: not recorded). */
static int alive(long pid, unsigned long long start)
{
    if (pid <= 0 || (kill((pid_t)pid, 0) != 0 && errno != EPERM))
        return 0;
    unsigned long long now = proc_start(pid);
    return !start || !now || now == start;
}

int fk_store_tmp_name(const char *path, char *out, size_t cap)
{
    int n = snprintf(out, cap, "%s.%s.%ld.tmp", path, host_name(), (long)getpid());
    if (n < 0 || (size_t)n >= cap)
        return fk_err(FK_EINVAL, "path too long for its temporary name (limit %zu bytes): %s",
                      cap - 1, path);
    return FK_OK;
}

int fk_store_lock(const char *dir, int *fd)
{
    char p[PATH_MAX];
    *fd = -1;
    int n = snprintf(p, sizeof p, "%s/.lock", dir);
    if (n < 0 || (size_t)n >= sizeof p)
        return fk_err(FK_EINVAL, "path too long: %s/.lock", dir);
    int f = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (f < 0)
        return fk_err(FK_EIO, "%s: cannot open the results directory's lock (%s)", p,
                      strerror(errno));
    while (flock(f, LOCK_EX) != 0) {
        if (errno == EINTR)
            continue;
        int e = errno;
        close(f);
        return fk_err(FK_EIO, "%s: cannot lock (%s): this file system cannot keep runs on "
                      "one results directory apart; give each run its own directory and "
                      "merge them", p, strerror(e));
    }
    *fd = f;
    return FK_OK;
}

void fk_store_unlock(int fd)
{
    if (fd >= 0) {
        flock(fd, LOCK_UN);
        close(fd);
    }
}

static int claim_path(char *p, size_t cap, const char *dir, const char *id)
{
    int n = snprintf(p, cap, "%s/cells/%s.claim", dir, id);
    return n >= 0 && (size_t)n < cap ? FK_OK : fk_err(FK_EINVAL, "path too long: %s", dir);
}

/* What a claim file says: host, pid, start. 1 if it parses. */
static int read_claim(const char *p, char *host, size_t hcap, long *pid,
                      unsigned long long *start)
{
    char buf[256], h[128];
    if (!read_small(p, buf, sizeof buf))
        return 0;
    if (sscanf(buf, "%127s %ld %llu", h, pid, start) != 3)
        return 0;
    snprintf(host, hcap, "%s", h);
    return 1;
}

/* 1 if the claim (or a temporary file) of host/pid/start is ours or belongs to a dead
 * process of this host. */
static int stale(const char *host, long pid, unsigned long long start)
{
    if (strcmp(host, host_name()))
        return 0;
    return pid == (long)getpid() || !alive(pid, start);
}

/* Creates claim p holding "host pid start", or returns 1 if it exists. The content is
 * written to a temporary file first and linked into place (link fails if p exists), so a
 * claim is never seen empty or half-written, even when its writer is killed meanwhile (a
 * killed writer leaves at most its temporary file, which fk_store_sweep_stale removes). */
static int create_claim(const char *p)
{
    char tmp[PATH_MAX];
    FK_TRY(fk_store_tmp_name(p, tmp, sizeof tmp));
    int f = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (f < 0)
        return fk_err(FK_EIO, "%s: cannot create (%s)", tmp, strerror(errno));
    char buf[160];
    int n = snprintf(buf, sizeof buf, "%s %ld %llu\n", host_name(), (long)getpid(),
                     proc_start(getpid()));
    int ok = write(f, buf, (size_t)n) == n;
    if (close(f) != 0 || !ok) {
        unlink(tmp);
        return fk_err(FK_EIO, "%s: cannot write", tmp);
    }
    int rc = link(tmp, p), err = errno;
    unlink(tmp);
    if (rc == 0)
        return FK_OK;
    return err == EEXIST ? 1 : fk_err(FK_EIO, "%s: cannot create (%s)", p, strerror(err));
}

int fk_results_claim(const char *dir, const char *id, int force, char *holder, size_t cap)
{
    char p[PATH_MAX];
    FK_TRY(claim_path(p, sizeof p, dir, id));
    int fd;
    FK_TRY(fk_store_lock(dir, &fd));
    int rc;
    if (!force && fk_results_done(dir, id)) {
        rc = FK_CLAIM_DONE;
    } else if ((rc = create_claim(p)) == 1) {
        char host[128] = "?";
        long pid = 0;
        unsigned long long start = 0;
        int parsed = read_claim(p, host, sizeof host, &pid, &start);
        if (parsed && stale(host, pid, start)) {
            unlink(p); /* under the lock: nobody else can take it between the two calls */
            rc = create_claim(p);
            if (rc == 1)
                rc = fk_err(FK_EIO, "%s: reappeared under the lock", p);
        } else {
            if (parsed)
                snprintf(holder, cap, "%s pid %ld", host, pid);
            else /* never written by this version (create_claim links whole files) */
                snprintf(holder, cap, "an unreadable claim, %s: delete it if no run is "
                         "computing the cell", p);
            rc = FK_CLAIM_HELD;
        }
    }
    fk_store_unlock(fd);
    return rc;
}

void fk_results_unclaim(const char *dir, const char *id)
{
    char p[PATH_MAX], host[128];
    long pid;
    unsigned long long start;
    if (claim_path(p, sizeof p, dir, id) < 0) {
        fk_err_clear();
        return;
    }
    /* under the directory's lock: another run's claim checks "finished?" and then creates
     * the claim; an unclaim between the two (the cell finished meanwhile) would let it
     * compute the cell again */
    int fd;
    if (fk_store_lock(dir, &fd) < 0) {
        fk_err_clear();
        fd = -1;
    }
    if (read_claim(p, host, sizeof host, &pid, &start) && !strcmp(host, host_name()) &&
        pid == (long)getpid())
        unlink(p);
    fk_store_unlock(fd);
}

/* Removes the stale temporary files and claims of one directory. */
static int sweep_dir(const char *d)
{
    DIR *dh = opendir(d);
    if (!dh)
        return 0;
    int removed = 0;
    struct dirent *e;
    while ((e = readdir(dh))) {
        const char *n = e->d_name;
        size_t len = strlen(n);
        char p[PATH_MAX], host[128] = "";
        long pid = 0;
        unsigned long long start = 0;
        if ((size_t)snprintf(p, sizeof p, "%s/%s", d, n) >= sizeof p)
            continue;
        int dead = 0;
        if (len > 6 && !strcmp(n + len - 6, ".claim")) {
            dead = read_claim(p, host, sizeof host, &pid, &start) &&
                   strcmp(host, host_name()) == 0 && !alive(pid, start);
        } else if (len > 4 && !strcmp(n + len - 4, ".tmp")) {
            /* NAME.HOST.PID.tmp: the pid, then the host before it */
            const char *end = n + len - 4, *dot = end;
            while (dot > n && dot[-1] != '.')
                dot--;
            pid = strtol(dot, NULL, 10);
            const char *hd = dot - 1;
            size_t hl = strlen(host_name());
            dead = dot > n + 1 && pid > 0 && (size_t)(hd - n) > hl &&
                   !strncmp(hd - hl, host_name(), hl) && hd[-(long)hl - 1] == '.' &&
                   !alive(pid, 0);
        }
        if (dead && unlink(p) == 0)
            removed++;
    }
    closedir(dh);
    return removed;
}

int fk_store_sweep_stale(const char *dir)
{
    char p[PATH_MAX];
    int n = sweep_dir(dir);
    if ((size_t)snprintf(p, sizeof p, "%s/cells", dir) < sizeof p)
        n += sweep_dir(p);
    return n;
}
