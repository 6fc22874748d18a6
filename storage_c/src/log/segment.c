/*
 * segment.c - segment files: creation, mapping, growth.
 *
 * A segment is created small and grows as it fills: its index first (sized
 * for the segment's full size), then the segment under a temporary name,
 * preallocated with posix_fallocate to its first chunk (so that a full disk
 * shows up here, as an error, and never later as SIGBUS on a mapped write),
 * headed, and linked into place.  Growth (segment_grow) preallocates the next
 * chunk and then records the new size in the header; readers that find the
 * header larger than their mapping map the file again.  Creation syncs
 * nothing: a rotation happens in the append path, and a device flush there
 * would stall every appender of the shard behind it.  The first sync that
 * covers the segment syncs its file and then the directory, before the
 * durable point moves into it (durability.c).  A crash at any point leaves
 * either no segment or a complete, empty one; temporary files are removed by
 * recovery.
 *
 * Every process maps the whole file, shared.  Appends write through that
 * mapping; readers read from it.  Pages of a fallocated file are "unwritten"
 * extents, and the first store to each costs the filesystem a conversion of a
 * few microseconds; appenders therefore zero-fill a window ahead of the write
 * position with pwrite (see append.c), which makes the later faults cheap.
 */
#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"

void segment_header_fill(segment_header *h, uint32_t shard_id, uint64_t base, uint64_t capacity,
                         uint64_t reserved, uint32_t flags)
{
    memset(h, 0, sizeof *h);
    h->flags = flags;
    h->magic = MAGIC_SEGMENT;
    h->version = SEGMENT_VERSION;
    h->header_bytes = FILE_HEADER_BYTES;
    h->shard_id = shard_id;
    h->base_entry = base;
    h->capacity = capacity;
    h->reserved = reserved > capacity ? reserved : capacity;
    h->created_ns = now_ns();
    h->header_crc = crc32c_header(h);
}

int segment_create(const char *dir, uint32_t shard_id, uint64_t base, uint64_t capacity,
                   uint64_t index_coverage, uint32_t index_interval)
{
    char tmp[COMET_PATH_MAX], final[COMET_PATH_MAX], idx[COMET_PATH_MAX];
    segment_path(final, dir, base, SEGMENT_SUFFIX);
    segment_path(idx, dir, base, INDEX_SUFFIX);
    if (path_format(tmp, "%s%s", final, TEMP_SUFFIX))
        return set_error(COMET_E_INVALID, "path too long: %s", final);

    struct stat sb;
    if (sys_stat(final, &sb) == 0)
        return set_error(COMET_E_CORRUPT, "segment %s already exists", final);
    int rc = index_create(dir, shard_id, base, index_coverage > capacity ? index_coverage : capacity,
                          index_interval, capacity);
    if (rc)
        return rc;
    int fd = open_new(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, dir);
    if (fd < 0) {
        rc = set_errno_error(errno, "cannot create segment %s", tmp);
        goto fail;
    }
    rc = preallocate(fd, capacity, final);
    if (rc) {
        sys_close(fd);
        goto fail;
    }
    segment_header h;
    segment_header_fill(&h, shard_id, base, capacity, index_coverage, 0);
    if (sys_pwrite(fd, &h, sizeof h, 0) != (ssize_t)sizeof h) {
        rc = set_errno_error(errno ? errno : EIO, "cannot write segment header %s", tmp);
        sys_close(fd);
        goto fail;
    }
    sys_close(fd);
    /* Nothing synced here, in the append path: the sync that first covers an
     * entry of this segment fdatasyncs it (header and size with it) and then
     * the directory, before the durable point moves into it (durability.c).
     * A power cut before that may leave the name with a header that never
     * reached the disk; recovery sets such a file aside past the durable
     * point, where nothing was acknowledged. */
    if (sys_link(tmp, final)) {
        rc = errno == ENOENT ? set_error(COMET_E_GONE, "the new segment %s vanished before it was "
                                                       "linked: another program is removing the "
                                                       "shard's files", tmp)
                             : set_errno_error(errno, "cannot link segment %s", final);
        goto fail;
    }
    sys_unlink(tmp);
    return 0;
fail:
    sys_unlink(tmp);
    sys_unlink(idx);
    return rc;
}

static int check_header(const segment_header *h, uint64_t size, uint32_t shard_id,
                        uint64_t base, const char *path)
{
    if (h->magic != MAGIC_SEGMENT)
        return set_error(COMET_E_CORRUPT, "%s is not a segment file (bad magic)", path);
    if (h->version < SEGMENT_VERSION_OLDEST || h->version > SEGMENT_VERSION)
        return set_error(COMET_E_FORMAT_VERSION,
                         "%s has format version %u; this build reads versions %u to %u", path,
                         h->version, SEGMENT_VERSION_OLDEST, SEGMENT_VERSION);
    if (h->header_crc != crc32c_header(h) || h->header_bytes != FILE_HEADER_BYTES)
        return set_error(COMET_E_CORRUPT, "%s: segment header checksum mismatch", path);
    if (h->base_entry != base || h->shard_id != shard_id)
        return set_error(COMET_E_CORRUPT,
                         "%s: header says shard %u base %" PRIu64 ", name says shard %u base %" PRIu64,
                         path, h->shard_id, h->base_entry, shard_id, base);
    if (h->capacity < SEGMENT_DATA_OFFSET || size < SEGMENT_DATA_OFFSET)
        return set_error(COMET_E_CORRUPT, "%s: impossible capacity", path);
    return 0;
}

static int map_file(segment *seg, const char *path, uint32_t shard_id)
{
    int fd = sys_open(path, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0)
        return errno == ENOENT ? set_error(COMET_E_CORRUPT, "segment %s is missing", path)
                               : set_errno_error(errno, "cannot open segment %s", path);
    struct stat sb;
    if (sys_fstat(fd, &sb)) {
        int rc = set_errno_error(errno, "cannot stat %s", path);
        sys_close(fd);
        return rc;
    }
    segment_header h;
    memset(&h, 0, sizeof h);
    /* A read error is not damage: the caller gets it, and recovery never
     * sets a segment aside that it could not read.  A file shorter than a
     * header (zeros below) is damage. */
    ssize_t got = sys_pread(fd, &h, sizeof h, 0);
    if (got < 0) {
        int rc = set_errno_error(errno, "cannot read the header of segment %s", path);
        sys_close(fd);
        return rc;
    }
    if (got < (ssize_t)sizeof h)
        memset(&h, 0, sizeof h);
    int rc = check_header(&h, (uint64_t)sb.st_size, shard_id, seg->base, path);
    if (rc) {
        sys_close(fd);
        return rc;
    }
    /* A file shorter than its header says was truncated behind our back: map
     * what is there; recovery extends the active segment again. */
    uint64_t size = (uint64_t)sb.st_size < h.capacity ? (uint64_t)sb.st_size : h.capacity;
    /* The whole reserved size is mapped, so that growth needs no new mapping;
     * nothing past `size` (the capacity) is ever touched. */
    uint64_t span = h.reserved > size && h.reserved <= SEGMENT_MAX_BYTES ? h.reserved : size;
    void *map = sys_mmap(NULL, span, PROT_READ, MAP_SHARED, fd, 0);
    sys_close(fd);
    if (map == MAP_FAILED)
        return set_errno_error(errno, "cannot map segment %s", path);
    seg->map = map;
    seg->map_bytes = span;
    seg->capacity = size;
    seg->version = h.version;
    seg->flags = h.version >= 2 ? h.flags : 0;
    return 0;
}

segment *segment_new(uint64_t base)
{
    segment *seg = sys_calloc(1, sizeof *seg);
    if (seg) {
        seg->base = base;
        seg->fd = -1;
    }
    return seg;
}

int segment_map(segment *seg, const char *dir, uint32_t shard_id)
{
    char path[COMET_PATH_MAX];
    segment_path(path, dir, seg->base, SEGMENT_SUFFIX);
    return map_file(seg, path, shard_id);
}

int segment_load(segment *seg, const char *dir, uint32_t shard_id)
{
    int rc = segment_map(seg, dir, shard_id);
    if (rc)
        return rc;
    /* A missing or damaged index is rebuilt later; one that cannot be read
     * fails the load (unmapped again, so that the next use tries anew). */
    rc = index_map(seg, dir, shard_id);
    if (rc < 0) {
        sys_munmap(seg->map, seg->map_bytes);
        seg->map = NULL;
        seg->map_bytes = 0;
        seg->capacity = 0;
        return rc;
    }
    return 0;
}

uint64_t segment_header_capacity(const segment *seg)
{
    uint64_t cap;
    memcpy(&cap, seg->map + offsetof(segment_header, capacity), 8);
    return cap;
}

int segment_fd(segment *seg, const char *dir)
{
    if (seg->fd >= 0)
        return seg->fd;
    char path[COMET_PATH_MAX];
    segment_path(path, dir, seg->base, SEGMENT_SUFFIX);
    seg->fd = sys_open(path, O_RDWR | O_CLOEXEC, 0);
    if (seg->fd < 0)
        return set_errno_error(errno, "cannot open segment %s", path);
    return seg->fd;
}

/* Grows the active segment's file to capacity (under the append lock): the
 * space first, then the header that announces it, so that no process ever
 * touches past the allocated end.  Within the reserved size the mappings
 * already reach: capacity is raised in place.  Past it (an empty segment that
 * one batch makes larger), the header reserves the new size and the caller
 * bumps active_gen so that every process maps the file again; the index is
 * recreated then if it does not cover the new size. */
int segment_grow(segment *seg, const char *dir, uint64_t capacity, int empty, int *remap)
{
    *remap = 0;
    int fd = segment_fd(seg, dir);
    if (fd < 0)
        return fd;
    segment_header h;
    memcpy(&h, seg->map, sizeof h);
    if (h.capacity >= capacity) { /* grown already (by another process) */
        segment_refresh_capacity(seg, dir);
        return 0;
    }
    char path[COMET_PATH_MAX];
    segment_path(path, dir, seg->base, SEGMENT_SUFFIX);
    int rc = preallocate(fd, capacity, path);
    if (!rc && seg->index_interval)
        rc = index_reserve(dir, seg->base, capacity, seg->index_interval);
    if (rc)
        return rc;
    cut_point(CUT_GROW_SIZED);
    h.capacity = capacity;
    if (capacity > seg->map_bytes) {
        h.reserved = capacity;
        *remap = 1;
    }
    h.header_crc = crc32c_header(&h);
    if (sys_pwrite(fd, &h, sizeof h, 0) != (ssize_t)sizeof h)
        return set_errno_error(errno ? errno : EIO, "cannot rewrite header of segment %" PRIu64,
                               seg->base);
    if (!*remap) {
        segment_refresh_capacity(seg, dir);
        return 0;
    }
    if (!empty || index_covers(seg, capacity))
        return 0;
    uint32_t interval = seg->index_interval ? seg->index_interval : 4096;
    return index_create(dir, h.shard_id, seg->base, capacity, interval, capacity);
}

uint64_t segment_refresh_capacity(segment *seg, const char *dir)
{
    uint64_t have = atomic_load(&seg->capacity);
    uint64_t want = segment_header_capacity(seg);
    if (want <= have)
        return have;
    if (want > seg->map_bytes)
        want = seg->map_bytes;
    /* Only as far as the file really reaches (a file cut short behind our
     * back is recovery's to restore; a mapped access past its end would fault). */
    char path[COMET_PATH_MAX];
    struct stat sb;
    segment_path(path, dir, seg->base, SEGMENT_SUFFIX);
    if (sys_stat(path, &sb) || (uint64_t)sb.st_size < want)
        return have;
    while (have < want && !atomic_compare_exchange_weak(&seg->capacity, &have, want))
        ;
    return atomic_load(&seg->capacity);
}

int segment_writable(segment *seg, const char *dir)
{
    if (seg->wmap)
        return 0;
    int fd = segment_fd(seg, dir);
    if (fd < 0)
        return fd;
    void *map = sys_mmap(NULL, seg->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED)
        return set_errno_error(errno, "cannot map segment %" PRIu64 " for writing", seg->base);
    seg->wmap = map;
    seg->zapped_to = 0;
    return 0;
}

/* Writeback write-protects every page that is mapped writable and dirty, one
 * TLB shootdown (an IPI to each CPU running this process) per page.  With a
 * writer thread running, that costs the writer microseconds per page.  Pages
 * far behind the write position are never written again, so they are
 * unmapped from the writable mapping in 1 MiB chunks (one shootdown each);
 * readers use the read-only mapping, which writeback leaves alone. */
void segment_release_to(segment *seg, uint64_t off)
{
    uint64_t to = (off - SEGMENT_RELEASE_CHUNK) & ~(SEGMENT_RELEASE_CHUNK - 1);
    if (sys_madvise(seg->wmap + seg->zapped_to, to - seg->zapped_to, MADV_DONTNEED) == 0)
        seg->zapped_to = to;
}

void segment_free(segment *seg)
{
    if (!seg)
        return;
    if (seg->wmap)
        sys_munmap(seg->wmap, seg->map_bytes);
    if (seg->map)
        sys_munmap(seg->map, seg->map_bytes);
    index_unmap(seg);
    if (seg->fd >= 0)
        sys_close(seg->fd);
    free(seg);
}
