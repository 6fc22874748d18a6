/*
 * sys.h - the operating system as the storage core uses it: every call that
 * can fail because of the machine (opening, sizing, reading, writing,
 * mapping, syncing, closing, stating, locking and naming files, reading
 * directories, allocating memory) and the clocks.
 *
 * The core makes these calls only through the functions below, which go
 * through one table, comet_sys (sys.c).  That is the seam its tests use, in
 * the way SQLite tests itself: a fault plan (comet_fault_add,
 * comet_testing.h) makes chosen calls fail with chosen errnos, shortens
 * reads and writes, or interrupts calls, and comet_clock_shift() moves both
 * clocks, so that a test can walk every failure point of open, append,
 * rotation, recovery, retention and offsets, and age data without sleeping.
 * Production pays one indirect call and one predictable branch per system
 * call, next to a system call's hundreds of nanoseconds.
 *
 * Conventions are the C library's: -1 (or NULL) and errno, except
 * sys_fallocate, which returns an errno value like posix_fallocate, and
 * sys_readdir, which leaves errno 0 at the end of a directory, so that a loop
 * deciding from a listing can tell a short listing (an I/O error) from the
 * whole directory by looking at errno right after it.  Two promises are kept
 * here, once, rather than at every call site:
 *   - EINTR is retried (POSIX lets any of these calls be interrupted before
 *     it did anything), except by close and closedir: Linux has released the
 *     descriptor whatever they return, and a retry could close a descriptor
 *     another thread just opened.
 *   - sys_pwrite writes everything or fails; sys_pread reads everything or
 *     stops at the end of the file.  A short
 *     transfer is legal for each of them and is looped over, never taken
 *     for the whole (a short header read taken for "not a segment" would set
 *     a healthy segment aside).
 */
#ifndef COMET_SYS_H
#define COMET_SYS_H

#include <dirent.h>
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>

struct flock;

typedef struct comet_sys_table {
    int (*open)(const char *path, int flags, mode_t mode);
    int (*fallocate)(int fd, off_t offset, off_t len);
    int (*ftruncate)(int fd, off_t len);
    ssize_t (*pwrite)(int fd, const void *buf, size_t n, off_t offset);
    ssize_t (*pread)(int fd, void *buf, size_t n, off_t offset);
    void *(*mmap)(void *addr, size_t len, int prot, int flags, int fd, off_t offset);
    int (*munmap)(void *addr, size_t len);
    int (*madvise)(void *addr, size_t len, int advice);
    int (*msync)(void *addr, size_t len, int flags);
    int (*fdatasync)(int fd);
    int (*fsync)(int fd);
    int (*close)(int fd);
    int (*closedir)(DIR *dir);
    int (*fstat)(int fd, struct stat *sb);
    int (*stat)(const char *path, struct stat *sb);
    int (*statvfs)(const char *path, struct statvfs *vfs);
    int (*flock)(int fd, int op);
    int (*fcntl_lock)(int fd, int cmd, struct flock *fl); /* F_OFD_SETLK(W), F_OFD_GETLK, ... */
    int (*rename)(const char *from, const char *to);
    int (*link)(const char *from, const char *to);
    int (*unlink)(const char *path);
    int (*mkdir)(const char *path, mode_t mode);
    int (*chmod)(const char *path, mode_t mode);
    int (*fchmod)(int fd, mode_t mode);
    int (*rmdir)(const char *path);
    DIR *(*opendir)(const char *path);
    struct dirent *(*readdir)(DIR *dir); /* NULL at the end (errno 0) or on an error (errno set) */
    void *(*malloc)(size_t n);
    void *(*calloc)(size_t n, size_t size);
    void *(*realloc)(void *p, size_t n);
    int64_t (*clock_ns)(int clock_id);
} comet_sys_table;

extern comet_sys_table comet_sys;

/* The call, again while it fails with EINTR. */
#define SYS_RETRY(type, call)                                                                      \
    do {                                                                                           \
        type r_;                                                                                   \
        do                                                                                         \
            r_ = (call);                                                                           \
        while (r_ == (type)-1 && errno == EINTR);                                                  \
        return r_;                                                                                 \
    } while (0)

static inline int sys_open(const char *path, int flags, mode_t mode) { SYS_RETRY(int, comet_sys.open(path, flags, mode)); }
static inline int sys_fallocate(int fd, off_t offset, off_t len)
{
    int err;
    do
        err = comet_sys.fallocate(fd, offset, len);
    while (err == EINTR);
    return err;
}
static inline int sys_ftruncate(int fd, off_t len) { SYS_RETRY(int, comet_sys.ftruncate(fd, len)); }

/* All n bytes or -1; a call that writes nothing without an error is EIO
 * (it would loop for ever). */
static inline ssize_t sys_pwrite(int fd, const void *buf, size_t n, off_t offset)
{
    size_t done = 0;
    while (done < n) {
        ssize_t w = comet_sys.pwrite(fd, (const char *)buf + done, n - done, offset + (off_t)done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            if (w == 0)
                errno = EIO;
            return -1;
        }
        done += (size_t)w;
    }
    return (ssize_t)n;
}

/* n bytes, fewer only at the end of the file, or -1. */
static inline ssize_t sys_pread(int fd, void *buf, size_t n, off_t offset)
{
    size_t done = 0;
    while (done < n) {
        ssize_t r = comet_sys.pread(fd, (char *)buf + done, n - done, offset + (off_t)done);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -1;
        if (r == 0)
            break;
        done += (size_t)r;
    }
    return (ssize_t)done;
}

static inline void *sys_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t offset)
{
    void *p;
    do
        p = comet_sys.mmap(addr, len, prot, flags, fd, offset);
    while (p == (void *)-1 && errno == EINTR);
    return p;
}
static inline int sys_munmap(void *addr, size_t len) { SYS_RETRY(int, comet_sys.munmap(addr, len)); }
static inline int sys_madvise(void *addr, size_t len, int advice) { SYS_RETRY(int, comet_sys.madvise(addr, len, advice)); }
static inline int sys_msync(void *addr, size_t len, int flags) { SYS_RETRY(int, comet_sys.msync(addr, len, flags)); }
static inline int sys_fdatasync(int fd) { SYS_RETRY(int, comet_sys.fdatasync(fd)); }
static inline int sys_fsync(int fd) { SYS_RETRY(int, comet_sys.fsync(fd)); }
/* Never retried (see above); the descriptor is gone either way. */
static inline int sys_close(int fd) { return comet_sys.close(fd); }
static inline int sys_closedir(DIR *dir) { return comet_sys.closedir(dir); }
static inline int sys_fstat(int fd, struct stat *sb) { SYS_RETRY(int, comet_sys.fstat(fd, sb)); }
static inline int sys_stat(const char *path, struct stat *sb) { SYS_RETRY(int, comet_sys.stat(path, sb)); }
static inline int sys_statvfs(const char *path, struct statvfs *vfs) { SYS_RETRY(int, comet_sys.statvfs(path, vfs)); }
static inline int sys_chmod(const char *path, mode_t mode) { SYS_RETRY(int, comet_sys.chmod(path, mode)); }
static inline int sys_fchmod(int fd, mode_t mode) { SYS_RETRY(int, comet_sys.fchmod(fd, mode)); }
static inline int sys_flock(int fd, int op) { SYS_RETRY(int, comet_sys.flock(fd, op)); }
static inline int sys_fcntl_lock(int fd, int cmd, struct flock *fl) { SYS_RETRY(int, comet_sys.fcntl_lock(fd, cmd, fl)); }
static inline int sys_rename(const char *from, const char *to) { SYS_RETRY(int, comet_sys.rename(from, to)); }
static inline int sys_link(const char *from, const char *to) { SYS_RETRY(int, comet_sys.link(from, to)); }
static inline int sys_unlink(const char *path) { SYS_RETRY(int, comet_sys.unlink(path)); }
static inline int sys_mkdir(const char *path, mode_t mode) { SYS_RETRY(int, comet_sys.mkdir(path, mode)); }
static inline int sys_rmdir(const char *path) { SYS_RETRY(int, comet_sys.rmdir(path)); }
static inline DIR *sys_opendir(const char *path)
{
    DIR *d;
    do
        d = comet_sys.opendir(path);
    while (!d && errno == EINTR);
    return d;
}
static inline struct dirent *sys_readdir(DIR *dir) { return comet_sys.readdir(dir); }
static inline void *sys_malloc(size_t n) { return comet_sys.malloc(n); }
static inline void *sys_calloc(size_t n, size_t size) { return comet_sys.calloc(n, size); }
static inline void *sys_realloc(void *p, size_t n) { return comet_sys.realloc(p, n); }
/* CLOCK_REALTIME, CLOCK_MONOTONIC or CLOCK_REALTIME_COARSE, in nanoseconds,
 * moved by comet_clock_shift(). */
static inline int64_t sys_clock_ns(int clock_id) { return comet_sys.clock_ns(clock_id); }

#endif
