/*
 * errors.c - stable error codes, their messages, and a per-thread detail.
 *
 * The code says what kind of failure it was (callers branch on it); the
 * detail says which file, which stream, which limit, so that an operator
 * reading a log line knows what to do without a debugger.
 */
#include "errors.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const char *const messages[COMET_ERROR_COUNT] = {
    [0] = "success",
    [-COMET_E_INVALID] = "invalid argument",
    [-COMET_E_STREAM_NAME] = "invalid stream name",
    [-COMET_E_SHARD_RANGE] = "shard out of range",
    [-COMET_E_ENTRY_TOO_LARGE] = "entry too large",
    [-COMET_E_SHARD_COUNT] = "shard count mismatch",
    [-COMET_E_FORMAT_VERSION] = "unsupported format version",
    [-COMET_E_CORRUPT] = "corrupt data",
    [-COMET_E_STORAGE_FULL] = "storage full",
    [-COMET_E_IO] = "I/O error",
    [-COMET_E_NO_SLOT] = "no free process slot",
    [-COMET_E_NO_STREAM] = "no such stream",
    [-COMET_E_CLOSED] = "closed",
    [-COMET_E_PROCESS_COUNT] = "process count mismatch",
    [-COMET_E_NOMEM] = "out of memory",
    [-COMET_E_BUFFER_TOO_SMALL] = "buffer too small",
    [-COMET_E_BATCH_TOO_LARGE] = "batch too large",
    [-COMET_E_WANTS_COMPRESSION] = "entry wants compression",
    [-COMET_E_DECOMPRESS] = "decompression failed",
    [-COMET_E_SLOT_HELD] = "slot already held",
    [-COMET_E_GROUP_NAME] = "invalid group name",
    [-COMET_E_TOO_MANY_GROUPS] = "too many groups",
    [-COMET_E_NO_GROUP] = "no such group",
    [-COMET_E_ACK_GAP] = "ack would skip unacknowledged entries",
    [-COMET_E_BAD_JSON] = "invalid JSON",
    [-COMET_E_NO_EVENTS] = "no event in the body",
    [-COMET_E_STREAM_LIMIT] = "too many streams",
    [-COMET_E_WOULD_BLOCK] = "the append would have to wait",
    [-COMET_E_BAD_OTLP] = "invalid OTLP request",
    [-COMET_E_SYNC_FAILED] = "an earlier sync of the shard failed",
    [-COMET_E_GONE] = "removed while in use",
    [-COMET_E_READ_ONLY] = "read-only filesystem",
    [-COMET_E_KEY_REUSED] = "idempotency key reused for another request",
    [-COMET_E_TOO_MANY_OPEN] = "too many shards in use to open another",
};

static _Thread_local char detail[512];

const char *comet_strerror(int code)
{
    if (code > 0 || code <= -COMET_ERROR_COUNT || !messages[-code])
        return "unknown error"; /* or a retired code */
    return messages[-code];
}

void clear_error(void)
{
    detail[0] = 0;
}

const char *comet_last_error(void)
{
    return detail;
}

static int vset(int code, const char *fmt, va_list ap)
{
    vsnprintf(detail, sizeof detail, fmt, ap);
    return code;
}

int set_error(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vset(code, fmt, ap);
    va_end(ap);
    return code;
}

int errno_to_code(int err)
{
    switch (err) {
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
        return COMET_E_STORAGE_FULL;
    case ENOMEM:
        return COMET_E_NOMEM;
    case EROFS:
        return COMET_E_READ_ONLY;
    default:
        return COMET_E_IO;
    }
}

int set_errno_error(int err, const char *fmt, ...)
{
    char what[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return set_error(errno_to_code(err), "%s: %s", what, strerror(err));
}
