/*
 * fsutil.c - operating-system helpers.  Nothing here knows the log format.
 */
#include "fsutil.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "comet.h"

int64_t now_ns(void) { return sys_clock_ns(CLOCK_REALTIME); }
int64_t monotonic_ns(void) { return sys_clock_ns(CLOCK_MONOTONIC); }

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

void read_boot_id(uint8_t out[16])
{
    char text[64];
    memset(out, 0, 16);
    long n = read_file_prefix("/proc/sys/kernel/random/boot_id", text, sizeof text - 1);
    if (n <= 0)
        return;
    text[n] = 0;
    int nibbles = 0;
    for (const char *p = text; *p && nibbles < 32; p++) {
        int v = hex_value(*p);
        if (v < 0)
            continue;
        out[nibbles / 2] |= (uint8_t)(nibbles % 2 ? v : v << 4);
        nibbles++;
    }
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
        return errno;
    int rc = sys_fsync(fd) ? errno : 0;
    close(fd);
    return rc;
}

static uint8_t zeros[1 << 20];

int zero_fill(int fd, uint64_t from, uint64_t to)
{
    while (from < to) {
        size_t n = (size_t)(to - from < sizeof zeros ? to - from : sizeof zeros);
        ssize_t w = sys_pwrite(fd, zeros, n, (off_t)from);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return errno;
        }
        from += (uint64_t)w;
    }
    return 0;
}

int preallocate(int fd, uint64_t size)
{
    int rc;
    do
        rc = sys_fallocate(fd, 0, (off_t)size);
    while (rc == EINTR);
    return rc;
}

int create_file_exclusive(const char *dir, const char *name, const void *data, size_t len)
{
    char tmp[COMET_PATH_MAX], final[COMET_PATH_MAX];
    if (path_format(tmp, "%s/.%s.%ld.tmp", dir, name, (long)getpid()) ||
        path_format(final, "%s/%s", dir, name))
        return ENAMETOOLONG;
    int fd = sys_open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return errno;
    int rc = 0;
    const uint8_t *p = data;
    size_t left = len;
    while (left && !rc) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno != EINTR)
            rc = errno;
        else if (w > 0) {
            p += w;
            left -= (size_t)w;
        }
    }
    if (!rc && sys_fsync(fd))
        rc = errno;
    close(fd);
    if (!rc && sys_link(tmp, final))
        rc = errno;
    sys_unlink(tmp);
    if (!rc)
        fsync_dir(dir);
    return rc;
}

long read_file_prefix(const char *path, void *buf, size_t len)
{
    int fd = sys_open(path, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    size_t got = 0;
    while (got < len) {
        ssize_t r = pread(fd, (uint8_t *)buf + got, len - got, (off_t)got);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            int e = errno;
            close(fd);
            return -e;
        }
        if (r == 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    return (long)got;
}

uint64_t file_disk_bytes(const char *path)
{
    struct stat sb;
    return stat(path, &sb) ? 0 : (uint64_t)sb.st_blocks * 512;
}
