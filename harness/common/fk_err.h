/* SPDX-License-Identifier: MIT
 * Error codes and the error message of the current thread.
 *
 * Every fallible function returns FK_OK (0) or a negative code and, on failure, sets a
 * message with fk_err(). Only the CLI prints it (fk_errmsg()); nothing below the CLI prints
 * or exits. The message is thread-local, so worker threads never clobber each other.
 */
#ifndef FK_ERR_H
#define FK_ERR_H

enum {
    FK_OK = 0,
    FK_EINVAL = -1,    /* bad argument or API misuse */
    FK_ENOMEM = -2,    /* allocation failed */
    FK_EIO = -3,       /* file could not be read or written */
    FK_ECONFIG = -4,   /* configuration error (file:line:col in the message) */
    FK_ECORRUPT = -5,  /* input file violates its format contract */
    FK_EEXTERNAL = -6, /* HDF5, GSL or BLAS failure */
    FK_ENOTSUP = -7,   /* valid request this build or codec declines */
    FK_EINTR = -8,     /* interrupted by a signal (SIGINT/SIGTERM) */
};

/* Sets the thread's message from a printf format and returns code (so: return fk_err(...)). */
int fk_err(int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Prefixes the current message with "prefix: " (adds context on the way up). Returns code. */
int fk_err_context(int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

const char *fk_errmsg(void);       /* the last message set on this thread ("" if none) */
void fk_err_clear(void);
const char *fk_strerror(int code); /* stable name: "EINVAL", ... */

/* Forward a negative result unchanged. */
#define FK_TRY(expr)                                                                      \
    do {                                                                                  \
        int fk_try_rc_ = (expr);                                                          \
        if (fk_try_rc_ < 0)                                                               \
            return fk_try_rc_;                                                            \
    } while (0)

#endif
