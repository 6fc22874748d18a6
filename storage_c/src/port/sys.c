/*
 * sys.c - the table of operating-system calls (sys.h) and the fault
 * injection behind it.
 *
 * Every entry of comet_sys is a thin wrapper over the C library call that
 * first asks fault() whether this call is to fail.  When nothing is armed
 * (always, in production) that is one relaxed load of a zero mask.  Armed,
 * the plan is up to COMET_FAULT_MAX_RULES rules (comet_fault_add), each
 * counting the calls of its kinds process-wide and failing a window of them
 * (or every one from its nth on) with its errno, shortening a read or write,
 * or killing the process.  The clocks add a shift that tests move
 * (comet_clock_shift).
 *
 * Rules are added and cleared by the test's thread while the core's threads
 * (the flusher, appenders) make calls: every field is atomic, a rule is
 * filled before the rule count and the mask publish it, and clearing zeroes
 * the mask first, so a call never sees half a rule.
 */
#include "sys.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "comet.h"
#include "comet_testing.h"

typedef struct rule {
    _Atomic unsigned kinds;
    _Atomic long nth, count, calls, fired;
    _Atomic int err;
} rule;

static _Atomic unsigned fault_kinds; /* union of the rules' kinds; 0: disarmed */
static _Atomic int rule_count;
static rule rules[COMET_FAULT_MAX_RULES];
static _Atomic int64_t clock_shift_ns;

enum { GO = 0, FAIL = 1, SHORTEN = 2 };

/* What to do with this call of `kind` (a mask: pwrite is SIZE and WRITE):
 * GO, FAIL (errno set), or SHORTEN (*n halved; only where n is given). */
static int fault(unsigned kind, size_t *n)
{
    if (!(atomic_load_explicit(&fault_kinds, memory_order_relaxed) & kind))
        return GO;
    int count = atomic_load(&rule_count), action = GO, err = 0;
    for (int i = 0; i < count; i++) {
        rule *r = &rules[i];
        if (!(atomic_load(&r->kinds) & kind))
            continue;
        long c = atomic_fetch_add(&r->calls, 1) + 1; /* every rule counts its calls */
        long nth = atomic_load(&r->nth), len = atomic_load(&r->count);
        if (action != GO || c < nth || (len && c >= nth + len))
            continue;
        int e = atomic_load(&r->err);
        if (e == COMET_FAULT_SHORT) {
            if (!n || *n < 2)
                continue; /* nothing to shorten: the call goes ahead, unfired */
            action = SHORTEN;
        } else {
            action = FAIL;
            err = e;
        }
        atomic_fetch_add(&r->fired, 1);
    }
    if (action == FAIL) {
        if (err == COMET_FAULT_CRASH)
            _exit(COMET_FAULT_CRASH_EXIT); /* killed right before this call */
        errno = err;
    } else if (action == SHORTEN) {
        *n /= 2;
    }
    return action;
}

void comet_fault_clear(void)
{
    atomic_store(&fault_kinds, 0);
    /* The rules stay readable for comet_fault_calls/fired until the next add. */
}

int comet_fault_add(const comet_fault_rule *r)
{
    if (!r || !r->kinds || (r->err == EINTR && r->count <= 0))
        return COMET_E_INVALID;
    if (!atomic_load(&fault_kinds))
        atomic_store(&rule_count, 0); /* a new plan: the cleared rules' counts go */
    int i = atomic_load(&rule_count);
    if (i >= COMET_FAULT_MAX_RULES)
        return COMET_E_INVALID;
    rule *slot = &rules[i];
    atomic_store(&slot->kinds, 0);
    atomic_store(&slot->calls, 0);
    atomic_store(&slot->fired, 0);
    atomic_store(&slot->nth, r->nth < 1 ? 1 : r->nth);
    atomic_store(&slot->count, r->count < 0 ? 0 : r->count);
    atomic_store(&slot->err, r->err ? r->err : EIO);
    atomic_store(&slot->kinds, r->kinds);
    atomic_store(&rule_count, i + 1);
    atomic_fetch_or(&fault_kinds, r->kinds);
    return 0;
}

static long rules_sum(int calls)
{
    long sum = 0;
    int count = atomic_load(&rule_count);
    for (int i = 0; i < count; i++)
        sum += atomic_load(calls ? &rules[i].calls : &rules[i].fired);
    return sum;
}

long comet_fault_calls(void) { return rules_sum(1); }
long comet_fault_fired(void) { return rules_sum(0); }
void comet_clock_shift(int64_t ns) { atomic_fetch_add(&clock_shift_ns, ns); }

static int real_open(const char *path, int flags, mode_t mode)
{
    return fault(COMET_FAULT_OPEN, NULL) ? -1 : open(path, flags, mode);
}

static int real_fallocate(int fd, off_t offset, off_t len)
{
    return fault(COMET_FAULT_SIZE, NULL) ? errno : posix_fallocate(fd, offset, len);
}

static int real_ftruncate(int fd, off_t len)
{
    return fault(COMET_FAULT_SIZE, NULL) ? -1 : ftruncate(fd, len);
}

static ssize_t real_pwrite(int fd, const void *buf, size_t n, off_t offset)
{
    return fault(COMET_FAULT_SIZE | COMET_FAULT_WRITE, &n) == FAIL ? -1 : pwrite(fd, buf, n, offset);
}

static ssize_t real_pread(int fd, void *buf, size_t n, off_t offset)
{
    return fault(COMET_FAULT_READ, &n) == FAIL ? -1 : pread(fd, buf, n, offset);
}

static void *real_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t offset)
{
    return fault(COMET_FAULT_MAP, NULL) ? MAP_FAILED : mmap(addr, len, prot, flags, fd, offset);
}

static int real_munmap(void *addr, size_t len)
{
    return fault(COMET_FAULT_UNMAP, NULL) ? -1 : munmap(addr, len);
}

static int real_madvise(void *addr, size_t len, int advice)
{
    return fault(COMET_FAULT_UNMAP, NULL) ? -1 : madvise(addr, len, advice);
}

static int real_msync(void *addr, size_t len, int flags)
{
    return fault(COMET_FAULT_SYNC, NULL) ? -1 : msync(addr, len, flags);
}

static int real_fdatasync(int fd) { return fault(COMET_FAULT_SYNC, NULL) ? -1 : fdatasync(fd); }
static int real_fsync(int fd) { return fault(COMET_FAULT_SYNC, NULL) ? -1 : fsync(fd); }

/* An injected close failure closes the descriptor all the same, as Linux
 * does whatever close returns: a failed close never leaks it. */
static int real_close(int fd)
{
    if (fault(COMET_FAULT_CLOSE, NULL)) {
        int err = errno;
        close(fd);
        errno = err;
        return -1;
    }
    return close(fd);
}

static int real_closedir(DIR *dir)
{
    if (fault(COMET_FAULT_CLOSE, NULL)) {
        int err = errno;
        closedir(dir);
        errno = err;
        return -1;
    }
    return closedir(dir);
}

static int real_fstat(int fd, struct stat *sb) { return fault(COMET_FAULT_STAT, NULL) ? -1 : fstat(fd, sb); }

static int real_stat(const char *path, struct stat *sb)
{
    return fault(COMET_FAULT_STAT, NULL) ? -1 : stat(path, sb);
}

static int real_statvfs(const char *path, struct statvfs *vfs)
{
    return fault(COMET_FAULT_STAT, NULL) ? -1 : statvfs(path, vfs);
}

static int real_flock(int fd, int op) { return fault(COMET_FAULT_LOCK, NULL) ? -1 : flock(fd, op); }

static int real_fcntl_lock(int fd, int cmd, struct flock *fl)
{
    return fault(COMET_FAULT_LOCK, NULL) ? -1 : fcntl(fd, cmd, fl);
}

static int real_rename(const char *from, const char *to)
{
    return fault(COMET_FAULT_NAME, NULL) ? -1 : rename(from, to);
}

static int real_link(const char *from, const char *to)
{
    return fault(COMET_FAULT_NAME, NULL) ? -1 : link(from, to);
}

static int real_mkdir(const char *path, mode_t mode)
{
    return fault(COMET_FAULT_NAME, NULL) ? -1 : mkdir(path, mode);
}

static int real_chmod(const char *path, mode_t mode) { return chmod(path, mode); }
static int real_fchmod(int fd, mode_t mode) { return fchmod(fd, mode); }

static int real_unlink(const char *path) { return fault(COMET_FAULT_REMOVE, NULL) ? -1 : unlink(path); }
static int real_rmdir(const char *path) { return fault(COMET_FAULT_REMOVE, NULL) ? -1 : rmdir(path); }
static DIR *real_opendir(const char *path) { return fault(COMET_FAULT_OPEN, NULL) ? NULL : opendir(path); }

static struct dirent *real_readdir(DIR *dir)
{
    if (fault(COMET_FAULT_READDIR, NULL))
        return NULL;
    errno = 0;
    return readdir(dir);
}

static void *real_malloc(size_t n) { return fault(COMET_FAULT_ALLOC, NULL) ? NULL : malloc(n); }
static void *real_calloc(size_t n, size_t size) { return fault(COMET_FAULT_ALLOC, NULL) ? NULL : calloc(n, size); }
static void *real_realloc(void *p, size_t n) { return fault(COMET_FAULT_ALLOC, NULL) ? NULL : realloc(p, n); }

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
    .pread = real_pread,
    .mmap = real_mmap,
    .munmap = real_munmap,
    .madvise = real_madvise,
    .msync = real_msync,
    .fdatasync = real_fdatasync,
    .fsync = real_fsync,
    .close = real_close,
    .closedir = real_closedir,
    .fstat = real_fstat,
    .stat = real_stat,
    .statvfs = real_statvfs,
    .flock = real_flock,
    .fcntl_lock = real_fcntl_lock,
    .rename = real_rename,
    .link = real_link,
    .unlink = real_unlink,
    .mkdir = real_mkdir,
    .chmod = real_chmod,
    .fchmod = real_fchmod,
    .rmdir = real_rmdir,
    .opendir = real_opendir,
    .readdir = real_readdir,
    .malloc = real_malloc,
    .calloc = real_calloc,
    .realloc = real_realloc,
    .clock_ns = real_clock_ns,
};
