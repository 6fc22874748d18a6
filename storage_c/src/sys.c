/*
 * sys.c - the table of operating-system calls (sys.h) and the fault
 * injection behind it.
 *
 * Every entry of comet_sys is a thin wrapper over the C library call that
 * first asks fault() whether this call is to fail.  When nothing is armed
 * (always, in production) that is one relaxed load of a zero mask.  Armed
 * (comet_fault_arm), calls of the chosen kinds are counted process-wide and
 * the nth fails with the chosen errno, once or from then on.  The clocks
 * add a shift that tests move (comet_clock_shift).
 */
#include "sys.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "comet.h"

static _Atomic unsigned fault_kinds;  /* 0: disarmed */
static _Atomic long fault_nth;
static _Atomic long fault_calls;
static _Atomic long fault_fired;
static _Atomic int fault_errno;
static _Atomic int fault_persist;
static _Atomic int64_t clock_shift_ns;

/* Nonzero (and errno set) when this call of `kind` is to fail. */
static int fault(unsigned kind)
{
    if (!(atomic_load_explicit(&fault_kinds, memory_order_relaxed) & kind))
        return 0;
    long n = atomic_fetch_add(&fault_calls, 1) + 1;
    long nth = atomic_load(&fault_nth);
    if (n < nth || (n > nth && !atomic_load(&fault_persist)))
        return 0;
    atomic_fetch_add(&fault_fired, 1);
    if (atomic_load(&fault_errno) == COMET_FAULT_CRASH)
        _exit(COMET_FAULT_CRASH_EXIT); /* killed right before this call */
    errno = atomic_load(&fault_errno);
    return 1;
}

void comet_fault_arm(unsigned kinds, long nth, int err, int persist)
{
    atomic_store(&fault_kinds, 0);
    atomic_store(&fault_calls, 0);
    atomic_store(&fault_fired, 0);
    atomic_store(&fault_nth, nth < 1 ? 1 : nth);
    atomic_store(&fault_errno, err ? err : EIO);
    atomic_store(&fault_persist, persist);
    atomic_store(&fault_kinds, kinds);
}

void comet_fault_disarm(void) { atomic_store(&fault_kinds, 0); }
long comet_fault_calls(void) { return atomic_load(&fault_calls); }
long comet_fault_fired(void) { return atomic_load(&fault_fired); }
void comet_clock_shift(int64_t ns) { atomic_fetch_add(&clock_shift_ns, ns); }

static int real_open(const char *path, int flags, mode_t mode)
{
    return fault(COMET_FAULT_OPEN) ? -1 : open(path, flags, mode);
}

static int real_fallocate(int fd, off_t offset, off_t len)
{
    return fault(COMET_FAULT_SIZE) ? errno : posix_fallocate(fd, offset, len);
}

static int real_ftruncate(int fd, off_t len)
{
    return fault(COMET_FAULT_SIZE) ? -1 : ftruncate(fd, len);
}

static ssize_t real_pwrite(int fd, const void *buf, size_t n, off_t offset)
{
    return fault(COMET_FAULT_SIZE) ? -1 : pwrite(fd, buf, n, offset);
}

static void *real_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t offset)
{
    return fault(COMET_FAULT_MAP) ? MAP_FAILED : mmap(addr, len, prot, flags, fd, offset);
}

static int real_msync(void *addr, size_t len, int flags)
{
    return fault(COMET_FAULT_SYNC) ? -1 : msync(addr, len, flags);
}

static int real_fdatasync(int fd) { return fault(COMET_FAULT_SYNC) ? -1 : fdatasync(fd); }
static int real_fsync(int fd) { return fault(COMET_FAULT_SYNC) ? -1 : fsync(fd); }

static int real_rename(const char *from, const char *to)
{
    return fault(COMET_FAULT_NAME) ? -1 : rename(from, to);
}

static int real_link(const char *from, const char *to)
{
    return fault(COMET_FAULT_NAME) ? -1 : link(from, to);
}

static int real_mkdir(const char *path, mode_t mode)
{
    return fault(COMET_FAULT_NAME) ? -1 : mkdir(path, mode);
}

static int real_unlink(const char *path) { return fault(COMET_FAULT_REMOVE) ? -1 : unlink(path); }
static int real_rmdir(const char *path) { return fault(COMET_FAULT_REMOVE) ? -1 : rmdir(path); }
static DIR *real_opendir(const char *path) { return fault(COMET_FAULT_OPEN) ? NULL : opendir(path); }

static struct dirent *real_readdir(DIR *dir)
{
    if (fault(COMET_FAULT_READDIR))
        return NULL;
    errno = 0;
    return readdir(dir);
}

static void *real_malloc(size_t n) { return fault(COMET_FAULT_ALLOC) ? NULL : malloc(n); }
static void *real_calloc(size_t n, size_t size) { return fault(COMET_FAULT_ALLOC) ? NULL : calloc(n, size); }
static void *real_realloc(void *p, size_t n) { return fault(COMET_FAULT_ALLOC) ? NULL : realloc(p, n); }

static int64_t real_clock_ns(int clock_id)
{
    struct timespec ts;
    clock_gettime(clock_id, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec +
           atomic_load_explicit(&clock_shift_ns, memory_order_relaxed);
}

comet_sys_table comet_sys = {
    .open = real_open,
    .fallocate = real_fallocate,
    .ftruncate = real_ftruncate,
    .pwrite = real_pwrite,
    .mmap = real_mmap,
    .msync = real_msync,
    .fdatasync = real_fdatasync,
    .fsync = real_fsync,
    .rename = real_rename,
    .link = real_link,
    .unlink = real_unlink,
    .mkdir = real_mkdir,
    .rmdir = real_rmdir,
    .opendir = real_opendir,
    .readdir = real_readdir,
    .malloc = real_malloc,
    .calloc = real_calloc,
    .realloc = real_realloc,
    .clock_ns = real_clock_ns,
};
