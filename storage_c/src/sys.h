/*
 * sys.h - the operating system as the storage core uses it: every call that
 * can fail because of the machine (opening, sizing, mapping, syncing and
 * naming files, reading directories, allocating memory) and the clocks.
 *
 * The core makes these calls only through the functions below, which go
 * through one table, comet_sys (sys.c).  That is the seam its tests use, in
 * the way SQLite tests itself: comet_fault_arm() (comet.h) makes the Nth
 * call of chosen kinds fail with a chosen errno, and comet_clock_shift()
 * moves both clocks, so that a test can walk every failure point of open,
 * append, rotation, recovery, retention and offsets, and age data without
 * sleeping.  Production pays one indirect call and one predictable branch per
 * system call, next to a system call's hundreds of nanoseconds.
 *
 * Conventions are the C library's: -1 (or NULL) and errno, except
 * sys_fallocate, which returns an errno value like posix_fallocate, and
 * sys_readdir, which leaves errno 0 at the end of a directory, so that a loop
 * deciding from a listing can tell a short listing (an I/O error) from the
 * whole directory by looking at errno right after it.
 */
#ifndef COMET_SYS_H
#define COMET_SYS_H

#include <dirent.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct comet_sys_table {
    int (*open)(const char *path, int flags, mode_t mode);
    int (*fallocate)(int fd, off_t offset, off_t len);
    int (*ftruncate)(int fd, off_t len);
    ssize_t (*pwrite)(int fd, const void *buf, size_t n, off_t offset);
    void *(*mmap)(void *addr, size_t len, int prot, int flags, int fd, off_t offset);
    int (*msync)(void *addr, size_t len, int flags);
    int (*fdatasync)(int fd);
    int (*fsync)(int fd);
    int (*rename)(const char *from, const char *to);
    int (*link)(const char *from, const char *to);
    int (*unlink)(const char *path);
    int (*mkdir)(const char *path, mode_t mode);
    int (*rmdir)(const char *path);
    DIR *(*opendir)(const char *path);
    struct dirent *(*readdir)(DIR *dir); /* NULL at the end (errno 0) or on an error (errno set) */
    void *(*malloc)(size_t n);
    void *(*calloc)(size_t n, size_t size);
    void *(*realloc)(void *p, size_t n);
    int64_t (*clock_ns)(int clock_id);
} comet_sys_table;

extern comet_sys_table comet_sys;

static inline int sys_open(const char *path, int flags, mode_t mode) { return comet_sys.open(path, flags, mode); }
static inline int sys_fallocate(int fd, off_t offset, off_t len) { return comet_sys.fallocate(fd, offset, len); }
static inline int sys_ftruncate(int fd, off_t len) { return comet_sys.ftruncate(fd, len); }
static inline ssize_t sys_pwrite(int fd, const void *buf, size_t n, off_t offset) { return comet_sys.pwrite(fd, buf, n, offset); }
static inline void *sys_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t offset) { return comet_sys.mmap(addr, len, prot, flags, fd, offset); }
static inline int sys_msync(void *addr, size_t len, int flags) { return comet_sys.msync(addr, len, flags); }
static inline int sys_fdatasync(int fd) { return comet_sys.fdatasync(fd); }
static inline int sys_fsync(int fd) { return comet_sys.fsync(fd); }
static inline int sys_rename(const char *from, const char *to) { return comet_sys.rename(from, to); }
static inline int sys_link(const char *from, const char *to) { return comet_sys.link(from, to); }
static inline int sys_unlink(const char *path) { return comet_sys.unlink(path); }
static inline int sys_mkdir(const char *path, mode_t mode) { return comet_sys.mkdir(path, mode); }
static inline int sys_rmdir(const char *path) { return comet_sys.rmdir(path); }
static inline DIR *sys_opendir(const char *path) { return comet_sys.opendir(path); }
static inline struct dirent *sys_readdir(DIR *dir) { return comet_sys.readdir(dir); }
static inline void *sys_malloc(size_t n) { return comet_sys.malloc(n); }
static inline void *sys_calloc(size_t n, size_t size) { return comet_sys.calloc(n, size); }
static inline void *sys_realloc(void *p, size_t n) { return comet_sys.realloc(p, n); }
/* CLOCK_REALTIME, CLOCK_MONOTONIC or CLOCK_REALTIME_COARSE, in nanoseconds,
 * moved by comet_clock_shift(). */
static inline int64_t sys_clock_ns(int clock_id) { return comet_sys.clock_ns(clock_id); }

#endif
