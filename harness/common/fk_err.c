/* SPDX-License-Identifier: MIT
 * Thread-local error messages (see fk_err.h).
 */
#include "common/fk_err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define FK_ERRMSG_CAP 1024

static _Thread_local char errmsg[FK_ERRMSG_CAP];

int fk_err(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errmsg, sizeof errmsg, fmt, ap);
    va_end(ap);
    return code;
}

int fk_err_context(int code, const char *fmt, ...)
{
    char prefix[FK_ERRMSG_CAP], old[FK_ERRMSG_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, errmsg, sizeof old);
    if (old[0])
        snprintf(errmsg, sizeof errmsg, "%s: %s", prefix, old);
    else
        snprintf(errmsg, sizeof errmsg, "%s", prefix);
    return code;
}

const char *fk_errmsg(void) { return errmsg; }

void fk_err_clear(void) { errmsg[0] = '\0'; }

const char *fk_strerror(int code)
{
    switch (code) {
    case FK_OK: return "OK";
    case FK_EINVAL: return "EINVAL";
    case FK_ENOMEM: return "ENOMEM";
    case FK_EIO: return "EIO";
    case FK_ECONFIG: return "ECONFIG";
    case FK_ECORRUPT: return "ECORRUPT";
    case FK_EEXTERNAL: return "EEXTERNAL";
    case FK_ENOTSUP: return "ENOTSUP";
    case FK_EINTR: return "EINTR";
    default: return "EUNKNOWN";
    }
}
