/*
 * fsutil.h - small operating-system helpers shared by the other files:
 * clocks, the boot id, directory fsync, zero fill, atomic file creation,
 * open-file-description locks.
 * They follow the core's return convention (port.h): a failure is a
 * negative COMET_E_* code with the message set, never an errno value.
 */
#ifndef COMET_FSUTIL_H
#define COMET_FSUTIL_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "sys.h"

#define COMET_PATH_MAX PATH_MAX

/* CLOCK_REALTIME; inline, as every append reads it. */
static inline int64_t now_ns(void) { return sys_clock_ns(CLOCK_REALTIME); }
int64_t monotonic_ns(void);  /* CLOCK_MONOTONIC */

/* The running kernel's boot id (16 bytes; zeros when the kernel has none):
 * 0, or a COMET_E_* code when it cannot be read.  A boot id that differs from
 * a file's means "rebooted: reset its locks", so a failed read must never
 * pass for one (it would reset locks that living processes hold). */
int read_boot_id(uint8_t out[16]);

/* snprintf into a PATH_MAX buffer; returns COMET_E_INVALID when too long. */
int path_format(char *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* fsync of a directory (a new or removed name survives a power cut). */
int fsync_dir(const char *dir);
/* Writes zeros over [from, to) with pwrite: turns preallocated (unwritten)
 * extents into written ones so that later mmap write faults stay cheap. */
int zero_fill(int fd, uint64_t from, uint64_t to);
/* posix_fallocate of the file at path (open as fd) to size bytes; path only
 * names the file in the error message. */
int preallocate(int fd, uint64_t size, const char *path);

/* Creates dir/name holding data, all or nothing: writes a temp file, fsyncs,
 * then link()s it into place.  Returns 0, FILE_EXISTS (1) when the name
 * exists already (nothing written), or a negative COMET_E_* code. */
#define FILE_EXISTS 1
int create_file_exclusive(const char *dir, const char *name, const void *data, size_t len);

/* Modes of what the core creates (FORMAT.md, "Modes"): the owner's alone
 * (files 0600, directories 0700), or, inside a directory shared with a group
 * (its set-group-ID bit, which the directories made in it inherit), the
 * group's as well (0660, 02770) whatever the umask.  Nobody else may open a
 * file of the data directory: a process that can open a file read-only can
 * still flock() it, or take an OFD read lock on it, against the writers.
 *
 * open_new: sys_open of path with flags (which hold O_CREAT) in dir, with
 * that mode; make_dir: sys_mkdir of path in dir, with that mode (errno
 * EEXIST when it exists).  Both return what the call returned. */
int open_new(const char *path, int flags, const char *dir);
int make_dir(const char *path, const char *dir);
/* Takes away what the data directory's mode grants beyond that rule (group
 * bits of an unshared directory, anything for others) when this user owns it:
 * a data directory made by an older build with the umask's 0755 keeps every
 * other user out from then on. */
void restrict_data_dir(const char *path);

/* Disk space a file takes (allocated blocks, what du counts), 0 when it is
 * missing: the one measure of disk use (retention's budgets, comet stat). */
uint64_t file_disk_bytes(const char *path);

/* Reads up to len bytes at offset 0: returns the bytes read (fewer when the
 * file is shorter), or a negative COMET_E_* code.  *missing (may be NULL) is
 * set when the file does not exist: COMET_E_IO is returned then too, so that
 * a caller for whom a missing file means something else can tell. */
long read_file_prefix(const char *path, void *buf, size_t len, int *missing);

/* Takes (type F_RDLCK or F_WRLCK; a lock already held by this descriptor is
 * converted, atomically) or drops (F_UNLCK) an open-file-description lock on
 * bytes [start, start + len) of the file at path, open as fd.  Returns 0,
 * OFD_BUSY when wait is 0 and another open of the file holds a conflicting
 * lock, or a negative COMET_E_* code.  OFD locks belong to the open file, not
 * to the process: the kernel drops them when its last descriptor is closed
 * (kill -9 included), and two opens in one process conflict like two
 * processes.  They are independent of flock() locks on the same file. */
#define OFD_BUSY 1
int ofd_lock(int fd, const char *path, off_t start, off_t len, short type, int wait);

#endif
