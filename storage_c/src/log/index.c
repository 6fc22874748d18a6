/*
 * index.c - the sparse index of a segment: entry -> byte offset and
 * timestamp -> entry, one record per index_interval bytes of entries.
 *
 * Finding entry N is a binary search over the records followed by a scan of
 * at most one interval, so a read never walks a segment from its start.  The
 * index is a cache of what the segment already says: it is sized when the
 * segment is created, appended under the shard lock, and rebuilt from the
 * segment whenever it is missing or inconsistent.  Records are validated when
 * mapped (strictly increasing, inside the segment); readers also check each
 * entry they land on, so a stale record costs a scan, never a wrong answer.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"

static uint32_t records_for(uint64_t capacity, uint32_t interval)
{
    uint64_t n = (capacity - SEGMENT_DATA_OFFSET) / interval + 2;
    return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

static size_t file_bytes(uint32_t records)
{
    return INDEX_RECORDS_OFFSET + (size_t)records * sizeof(index_record);
}

/* Writes an index file holding records[0..count) under a temporary name and
 * renames it into place (replacing any previous index).  The file has its
 * full size; only its first `allocate` bytes have blocks (the rest as the
 * segment grows: index_reserve), so that a shard of a few events does not
 * hold the index of a full segment. */
static int write_index(const char *dir, uint32_t shard_id, uint64_t base, uint32_t capacity,
                       uint32_t interval, const index_record *records, uint32_t count,
                       uint64_t allocate)
{
    char tmp[COMET_PATH_MAX], final[COMET_PATH_MAX];
    segment_path(final, dir, base, INDEX_SUFFIX);
    if (path_format(tmp, "%s.%ld%s", final, (long)getpid(), TEMP_SUFFIX))
        return set_error(COMET_E_INVALID, "path too long: %s", final);
    int fd = open_new(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, dir);
    if (fd < 0)
        return set_errno_error(errno, "cannot create index %s", tmp);
    uint64_t full = file_bytes(capacity);
    int rc = preallocate(fd, allocate < full ? allocate : full, tmp);
    if (!rc && allocate < full && sys_ftruncate(fd, (off_t)full))
        rc = set_errno_error(errno, "cannot size index %s", tmp);
    if (rc) {
        sys_close(fd);
        sys_unlink(tmp);
        return rc;
    }
    uint8_t head[INDEX_RECORDS_OFFSET];
    memset(head, 0, sizeof head);
    index_header *h = (index_header *)head;
    h->magic = MAGIC_INDEX;
    h->version = FORMAT_VERSION;
    h->header_bytes = FILE_HEADER_BYTES;
    h->shard_id = shard_id;
    h->interval_bytes = interval;
    h->base_entry = base;
    h->capacity = capacity;
    h->header_crc = crc32c_header(h);
    memcpy(head + INDEX_COUNT_OFFSET, &count, 4);
    ssize_t w = sys_pwrite(fd, head, sizeof head, 0);
    if (w == (ssize_t)sizeof head && count)
        w = sys_pwrite(fd, records, (size_t)count * sizeof *records, INDEX_RECORDS_OFFSET) ==
                    (ssize_t)((size_t)count * sizeof *records)
                ? w
                : -1;
    /* Not synced: an index is a hint.  A name that survives a power cut
     * without its header, or records that do not check out, make index_map
     * report the index missing, and it is rebuilt from the segment; a sync
     * here would put a device flush in every rotation. */
    if (w != (ssize_t)sizeof head) {
        int err = errno ? errno : EIO;
        sys_close(fd);
        sys_unlink(tmp);
        return set_errno_error(err, "cannot write index %s", final);
    }
    sys_close(fd);
    if (sys_rename(tmp, final)) {
        int err = errno;
        sys_unlink(tmp);
        if (err == ENOENT)
            return set_error(COMET_E_GONE, "the new index %s vanished before it was renamed: "
                                           "another program is removing the shard's files", tmp);
        return set_errno_error(err, "cannot rename index %s", final);
    }
    return 0;
}

/* Bytes of an index file that must have blocks for records of entries in
 * the first `capacity` bytes of its segment: index_note writes a record
 * only below the segment's capacity, so never into a hole. */
static uint64_t allocated_for(uint64_t capacity, uint32_t interval)
{
    return (file_bytes(records_for(capacity, interval)) + 4095) & ~(uint64_t)4095;
}

int index_create(const char *dir, uint32_t shard_id, uint64_t base, uint64_t capacity,
                 uint32_t interval, uint64_t allocate)
{
    if (interval < 64)
        interval = 64;
    return write_index(dir, shard_id, base, records_for(capacity, interval), interval, NULL, 0,
                       allocated_for(allocate, interval));
}

int index_reserve(const char *dir, uint64_t base, uint64_t capacity, uint32_t interval)
{
    char path[COMET_PATH_MAX];
    segment_path(path, dir, base, INDEX_SUFFIX);
    int fd = sys_open(path, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) /* missing: rebuilt when mapped, allocated whole then */
        return errno == ENOENT ? 0 : set_errno_error(errno, "cannot open index %s", path);
    struct stat sb;
    int rc = 0;
    uint64_t want = allocated_for(capacity, interval < 64 ? 64 : interval);
    if (sys_fstat(fd, &sb))
        rc = set_errno_error(errno, "cannot stat index %s", path);
    else if (want > (uint64_t)sb.st_size)
        want = (uint64_t)sb.st_size; /* an index covering less: replaced when mapped */
    if (!rc)
        rc = preallocate(fd, want, path);
    sys_close(fd);
    return rc;
}

static int records_consistent(const segment *seg, uint32_t count)
{
    const index_record *r = index_records(seg);
    for (uint32_t i = 0; i < count; i++) {
        if (r[i].offset < SEGMENT_DATA_OFFSET + ENTRY_HEADER_BYTES ||
            r[i].offset + ENTRY_HEADER_BYTES > seg->capacity || r[i].rel_entry == 0)
            return 0;
        if (i && (r[i].rel_entry <= r[i - 1].rel_entry || r[i].offset <= r[i - 1].offset ||
                  r[i].timestamp < r[i - 1].timestamp))
            return 0;
    }
    return 1;
}

int index_map(segment *seg, const char *dir, uint32_t shard_id)
{
    char path[COMET_PATH_MAX];
    segment_path(path, dir, seg->base, INDEX_SUFFIX);
    seg->index_ok = 0;
    int fd = sys_open(path, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) /* missing: rebuilt; unreadable: an error, never taken for damage */
        return errno == ENOENT ? 0 : set_errno_error(errno, "cannot open index %s", path);
    struct stat sb;
    index_header h;
    memset(&h, 0, sizeof h);
    ssize_t got = 0;
    if (sys_fstat(fd, &sb) || (sb.st_size >= INDEX_RECORDS_OFFSET &&
                               (got = sys_pread(fd, &h, sizeof h, 0)) < 0)) {
        int rc = set_errno_error(errno, "cannot read index %s", path);
        sys_close(fd);
        return rc;
    }
    if (sb.st_size < INDEX_RECORDS_OFFSET || got != (ssize_t)sizeof h || h.magic != MAGIC_INDEX ||
        h.version != FORMAT_VERSION || h.header_crc != crc32c_header(&h) ||
        h.base_entry != seg->base || h.shard_id != shard_id || h.interval_bytes < 64 ||
        (uint64_t)sb.st_size < file_bytes(h.capacity)) {
        sys_close(fd);
        return 0;
    }
    size_t bytes = file_bytes(h.capacity);
    void *map = sys_mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int err = errno;
    sys_close(fd);
    if (map == MAP_FAILED)
        return set_errno_error(err, "cannot map index %s", path);
    seg->index_map = map;
    seg->index_map_bytes = bytes;
    seg->index_capacity = h.capacity;
    seg->index_interval = h.interval_bytes;
    uint32_t count = atomic_load_explicit(index_count_ptr(seg), memory_order_acquire);
    if (count > h.capacity || !records_consistent(seg, count)) {
        index_unmap(seg);
        seg->index_interval = h.interval_bytes;
        return 0;
    }
    seg->index_ok = 1;
    return 1;
}

void index_unmap(segment *seg)
{
    if (seg->index_map)
        sys_munmap(seg->index_map, seg->index_map_bytes);
    seg->index_map = NULL;
    seg->index_map_bytes = 0;
    seg->index_capacity = 0;
    seg->index_ok = 0;
}

void index_lookup(const segment *seg, uint64_t rel_entry, uint64_t *rel, uint64_t *offset)
{
    *rel = 0;
    *offset = SEGMENT_DATA_OFFSET;
    if (!seg->index_ok)
        return;
    uint32_t n = atomic_load_explicit(index_count_ptr(seg), memory_order_acquire);
    const index_record *r = index_records(seg);
    uint32_t lo = 0, hi = n; /* first record with rel_entry > target */
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (r[mid].rel_entry <= rel_entry)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo) {
        *rel = r[lo - 1].rel_entry;
        *offset = r[lo - 1].offset;
    }
}

int index_record_ok(const segment *seg, uint64_t rel, uint64_t offset)
{
    uint32_t lf;
    return rel == 0 ||
           entry_validate(seg, offset, seg->base + rel, ENTRY_LEN_MASK, &lf) == ENTRY_OK;
}

void index_lookup_time(const segment *seg, int64_t ts, uint64_t *rel, uint64_t *offset)
{
    *rel = 0;
    *offset = SEGMENT_DATA_OFFSET;
    if (!seg->index_ok)
        return;
    uint32_t n = atomic_load_explicit(index_count_ptr(seg), memory_order_acquire);
    const index_record *r = index_records(seg);
    uint32_t lo = 0, hi = n; /* first record with timestamp >= ts */
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (r[mid].timestamp < ts)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo) {
        *rel = r[lo - 1].rel_entry;
        *offset = r[lo - 1].offset;
    }
}

int index_covers(const segment *seg, uint64_t capacity)
{
    return seg->index_map && seg->index_interval &&
           seg->index_capacity >= records_for(capacity, seg->index_interval);
}

void index_note(segment *seg, uint64_t rel_entry, uint64_t offset, int64_t ts)
{
    if (offset < index_note_from(seg))
        return;
    _Atomic uint32_t *countp = index_count_ptr(seg);
    uint32_t n = atomic_load_explicit(countp, memory_order_relaxed);
    index_record *r = index_records(seg);
    r[n].rel_entry = (uint32_t)rel_entry;
    r[n].offset = (uint32_t)offset;
    r[n].timestamp = ts;
    atomic_store_explicit(countp, n + 1, memory_order_release);
}

void index_truncate(segment *seg, uint64_t rel_next)
{
    if (!seg->index_ok)
        return;
    _Atomic uint32_t *countp = index_count_ptr(seg);
    uint32_t n = atomic_load_explicit(countp, memory_order_relaxed);
    const index_record *r = index_records(seg);
    while (n && r[n - 1].rel_entry >= rel_next)
        n--;
    atomic_store_explicit(countp, n, memory_order_release);
}

int index_rebuild(segment *seg, const char *dir, uint32_t shard_id, uint64_t end_offset,
                  uint64_t end_entry)
{
    uint32_t interval = seg->index_interval ? seg->index_interval : 4096;
    uint32_t capacity = records_for(seg->capacity, interval);
    index_record *records = sys_malloc((size_t)capacity * sizeof *records);
    if (!records)
        return set_error(COMET_E_NOMEM, "out of memory rebuilding an index");
    uint32_t count = 0;
    uint64_t off = SEGMENT_DATA_OFFSET, entry = seg->base, last = SEGMENT_DATA_OFFSET;
    if (end_offset > seg->capacity)
        end_offset = seg->capacity;
    while (off < end_offset && entry < end_entry) {
        uint32_t lf;
        entry_check c = entry_validate(seg, off, entry, ENTRY_LEN_MASK, &lf);
        if (c == ENTRY_END)
            break;
        if (c == ENTRY_BAD) {
            uint64_t next_off, next_entry;
            if (!entry_resync(seg, off, entry, end_offset, ENTRY_LEN_MASK, &next_off, &next_entry))
                break;
            off = next_off;
            entry = next_entry;
            continue;
        }
        if (off - last >= interval && count < capacity) {
            records[count++] = (index_record){(uint32_t)(entry - seg->base), (uint32_t)off,
                                              entry_timestamp(seg, off)};
            last = off;
        }
        off += ENTRY_HEADER_BYTES + (lf & ENTRY_LEN_MASK);
        entry++;
    }
    index_unmap(seg);
    int rc = write_index(dir, shard_id, seg->base, capacity, interval, records, count,
                         file_bytes(capacity));
    free(records);
    if (rc)
        return rc;
    rc = index_map(seg, dir, shard_id);
    if (rc < 0)
        return rc;
    if (!rc)
        return set_error(COMET_E_IO, "rebuilt index of segment %" PRIu64 " does not map",
                         seg->base);
    return 0;
}
