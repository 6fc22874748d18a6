/*
 * fsutil.c - operating-system helpers.  Nothing here knows the log format.
 * Each failure is reported here, with the file it concerns, as a COMET_E_*
 * code and a message (set_errno_error maps ENOSPC to COMET_E_STORAGE_FULL):
 * callers pass the code on and need not know errno.
 */
#include "fsutil.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "comet.h"
#include "errors.h"

int64_t monotonic_ns(void) { return sys_clock_ns(CLOCK_MONOTONIC); }

/* The value of a hex digit, -1 for any other character. */
static int hex_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

int read_boot_id(uint8_t out[16])
{
    /* Read once per process: it cannot change while the process lives. */
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    static uint8_t cached[16];
    static int known;
    pthread_mutex_lock(&lock);
    int rc = 0;
    if (!known) {
        char text[64];
        int missing = 0;
        long n = read_file_prefix("/proc/sys/kernel/random/boot_id", text, sizeof text - 1, &missing);
        if (n < 0 && !missing) {
            rc = (int)n; /* the message names the file */
            goto out;
        }
        if (n < 0)
            n = 0; /* no such file (no /proc): zeros, as every process of this machine reads */
        text[n] = 0;
        int nibbles = 0;
        for (const char *p = text; *p && nibbles < 32; p++) {
            int v = hex_value(*p);
            if (v < 0)
                continue;
            cached[nibbles / 2] |= (uint8_t)(nibbles % 2 ? v : v << 4);
            nibbles++;
        }
        known = 1;
    }
out:
    memcpy(out, cached, 16);
    pthread_mutex_unlock(&lock);
    return rc;
}

int path_format(char *out, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out, COMET_PATH_MAX, fmt, ap);
    va_end(ap);
    return (n < 0 || n >= COMET_PATH_MAX) ? COMET_E_INVALID : 0;
}

int fsync_dir(const char *dir)
{
    int fd = sys_open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (fd < 0)
        return set_errno_error(errno, "cannot open directory %s", dir);
    int rc = sys_fsync(fd) ? set_errno_error(errno, "cannot sync directory %s", dir) : 0;
    sys_close(fd);
    return rc;
}

static uint8_t zeros[1 << 20];

int zero_fill(int fd, uint64_t from, uint64_t to)
{
    for (; from < to; from += sizeof zeros) {
        size_t n = (size_t)(to - from < sizeof zeros ? to - from : sizeof zeros);
        if (sys_pwrite(fd, zeros, n, (off_t)from) < 0)
            return set_errno_error(errno, "cannot write zeros over [%" PRIu64 ", %" PRIu64 ")",
                                   from, to);
    }
    return 0;
}

int preallocate(int fd, uint64_t size, const char *path)
{
    int err;
    do
        err = sys_fallocate(fd, 0, (off_t)size); /* an errno value, like posix_fallocate */
    while (err == EINTR);
    if (err)
        return set_errno_error(err, "cannot preallocate %" PRIu64 " bytes for %s", size, path);
    return 0;
}

static int is_shared(const char *dir)
{
    struct stat sb;
    return sys_stat(dir, &sb) == 0 && (sb.st_mode & S_ISGID);
}

int open_new(const char *path, int flags, const char *dir)
{
    int shared = is_shared(dir);
    int fd = sys_open(path, flags, shared ? 0660 : 0600);
    if (fd >= 0 && shared)
        sys_fchmod(fd, 0660); /* the umask may have taken the group's write; another member's file stays */
    return fd;
}

int make_dir(const char *path, const char *dir)
{
    int shared = is_shared(dir);
    int rc = sys_mkdir(path, shared ? 02770 : 0700);
    if (rc == 0 && shared)
        sys_chmod(path, 02770);
    return rc;
}

void restrict_data_dir(const char *path)
{
    struct stat sb;
    if (sys_stat(path, &sb) || sb.st_uid != geteuid())
        return;
    mode_t keep = (sb.st_mode & S_ISGID) ? (mode_t)(S_ISGID | 0770) : (mode_t)0700;
    if (sb.st_mode & 07777 & ~keep)
        sys_chmod(path, sb.st_mode & keep);
}

int create_file_exclusive(const char *dir, const char *name, const void *data, size_t len)
{
    char tmp[COMET_PATH_MAX], final[COMET_PATH_MAX];
    if (path_format(tmp, "%s/.%s.%ld.tmp", dir, name, (long)getpid()) ||
        path_format(final, "%s/%s", dir, name))
        return set_error(COMET_E_INVALID, "path too long: %s/%s", dir, name);
    int fd = open_new(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, dir);
    if (fd < 0)
        return set_errno_error(errno, "cannot create %s", tmp);
    int err = 0; /* the errno value of the first failure */
    if (sys_pwrite(fd, data, len, 0) < 0 || sys_fsync(fd))
        err = errno;
    sys_close(fd);
    int rc = err ? set_errno_error(err, "cannot write %s", tmp) : 0;
    if (!rc && sys_link(tmp, final))
        rc = errno == EEXIST ? FILE_EXISTS : set_errno_error(errno, "cannot create %s", final);
    sys_unlink(tmp);
    if (!rc)
        rc = fsync_dir(dir); /* the file is complete; its name must be durable too */
    return rc;
}

long read_file_prefix(const char *path, void *buf, size_t len, int *missing)
{
    int fd = sys_open(path, O_RDONLY | O_CLOEXEC, 0);
    if (missing)
        *missing = fd < 0 && errno == ENOENT;
    if (fd < 0)
        return set_errno_error(errno, "cannot open %s", path);
    ssize_t got = sys_pread(fd, buf, len, 0); /* short only at the end of the file */
    if (got < 0) {
        int rc = set_errno_error(errno, "cannot read %s", path);
        sys_close(fd);
        return rc;
    }
    sys_close(fd);
    return (long)got;
}

uint64_t file_disk_bytes(const char *path)
{
    struct stat sb;
    return sys_stat(path, &sb) ? 0 : (uint64_t)sb.st_blocks * 512;
}

int ofd_lock(int fd, const char *path, off_t start, off_t len, short type, int wait)
{
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = start;
    fl.l_len = len;
    int rc;
    do
        rc = sys_fcntl_lock(fd, wait ? F_OFD_SETLKW : F_OFD_SETLK, &fl);
    while (rc && errno == EINTR);
    if (!rc)
        return 0;
    if (!wait && (errno == EAGAIN || errno == EACCES))
        return OFD_BUSY;
    return set_errno_error(errno, "cannot lock bytes %lld+%lld of %s", (long long)start,
                           (long long)len, path);
}
