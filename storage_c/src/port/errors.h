/*
 * errors.h - error reporting: every failure path returns a COMET_E_* code and
 * leaves a sentence for the calling thread in comet_last_error().
 */
#ifndef COMET_ERRORS_H
#define COMET_ERRORS_H

#include "comet.h"

/* Records "fmt" as the thread's last error and returns code. */
int set_error(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The same for an errno value: ENOSPC, EDQUOT and EFBIG become STORAGE_FULL. */
int set_errno_error(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int errno_to_code(int err);
void clear_error(void);

#endif
