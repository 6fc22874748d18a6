/*
 * fsutil.h - small operating-system helpers shared by the other files:
 * clocks, the boot id, directory fsync, zero fill, atomic file creation.
 */
#ifndef COMET_FSUTIL_H
#define COMET_FSUTIL_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#include "sys.h"

#define COMET_PATH_MAX PATH_MAX

int64_t now_ns(void);        /* CLOCK_REALTIME */
int64_t monotonic_ns(void);  /* CLOCK_MONOTONIC */

/* The running kernel's boot id (16 bytes); zeros when unknown. */
void read_boot_id(uint8_t out[16]);

/* snprintf into a PATH_MAX buffer; returns COMET_E_INVALID when too long. */
int path_format(char *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

int fsync_dir(const char *dir);
/* Writes zeros over [from, to) with pwrite: turns preallocated (unwritten)
 * extents into written ones so that later mmap write faults stay cheap. */
int zero_fill(int fd, uint64_t from, uint64_t to);
/* posix_fallocate; returns 0 or an errno value. */
int preallocate(int fd, uint64_t size);

/* Creates dir/name holding data, all or nothing: writes a temp file, fsyncs,
 * then link()s it into place.  Returns 0, EEXIST if the name exists, or an
 * errno value. */
int create_file_exclusive(const char *dir, const char *name, const void *data, size_t len);

/* Disk space a file takes (allocated blocks, what du counts), 0 when it is
 * missing: the one measure of disk use (retention's budgets, comet stat). */
uint64_t file_disk_bytes(const char *path);

/* Reads exactly len bytes at offset 0; returns bytes read or -errno. */
long read_file_prefix(const char *path, void *buf, size_t len);

#endif
