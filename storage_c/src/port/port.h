/*
 * port.h - what the core asks of the machine, in one header for log/ and
 * codec/ to include.  port/ sits at the bottom: it includes nothing of the
 * core but the public headers (comet.h: the error codes; comet_testing.h:
 * the fault kinds and cut points its test hooks arm).
 *
 *   sys.c/.h       every system call, through one table that injected faults
 *                  and the movable clock act on
 *   fsutil.c/.h    file utilities built on those calls (paths, whole-file
 *                  writes, directory syncs)
 *   cutpoint.c/.h  the named cut points where a test ends the process
 *   crc32c.c/.h    CRC32C, in hardware where the CPU has it
 *   errors.c/.h    the thread's last error and the errno-to-code mapping
 *
 * Return convention, for every function of the core, static ones too:
 *   - a function that can fail returns 0, or a negative COMET_E_* code after
 *     set_error() / set_errno_error() has said what failed (which file);
 *   - one that returns a count, size or offset returns it (>= 0), or a
 *     negative COMET_E_* code in the same way;
 *   - a predicate or a search returns 1 (true, found) or 0;
 *   - a pointer is NULL on failure, as documented at the function;
 *   - other results (an enum, a sentinel such as UINT64_MAX or -1 for
 *     "unknown" or "not found") are documented at the function and are
 *     never failures;
 *   - an errno value is never returned: it is turned into a code where the
 *     system call failed (set_errno_error maps ENOSPC to STORAGE_FULL).
 * A caller passes a code on unchanged; it sets a new message only when it
 * makes a new decision (another code).
 */
#ifndef COMET_PORT_H
#define COMET_PORT_H

#include "crc32c.h"
#include "cutpoint.h"
#include "errors.h"
#include "fsutil.h"
#include "sys.h"

#endif /* COMET_PORT_H */
