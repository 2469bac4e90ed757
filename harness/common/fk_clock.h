/* SPDX-License-Identifier: MIT
 * Clocks, in seconds: wall time (monotonic), this thread's and this process's CPU time.
 */
#ifndef FK_CLOCK_H
#define FK_CLOCK_H

#include <time.h>

static inline double fk_clock_s(clockid_t clk)
{
    struct timespec ts;
    clock_gettime(clk, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline double fk_wall_s(void) { return fk_clock_s(CLOCK_MONOTONIC); }
static inline double fk_thread_cpu_s(void) { return fk_clock_s(CLOCK_THREAD_CPUTIME_ID); }
static inline double fk_process_cpu_s(void) { return fk_clock_s(CLOCK_PROCESS_CPUTIME_ID); }

#endif
