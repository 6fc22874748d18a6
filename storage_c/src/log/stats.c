/*
 * stats.c - per-shard statistics, read from the shared state by any process.
 * Counters come from the state; sizes and the oldest timestamp come from the
 * segment files themselves, so they are right even after a state rebuild.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "log.h"

#define STATS_UNSETTLED 1 /* stats_closed: the shard must be opened to know */

static void counters_of(const state_file *st, comet_shard_stats *out);
static int sizes_of(const char *dir, const uint64_t *bases, size_t n, comet_shard_stats *out);
static int first_entry_from_segments(const uint64_t *bases, size_t n, comet_shard_stats *out);
static int stats_of(shard *sh, unsigned what, comet_shard_stats *out);
static int stats_closed(comet_stream *s, uint32_t shard_id, unsigned what, comet_shard_stats *out);

int comet_shard_stats_get(comet_stream *s, uint32_t shard_id, unsigned what,
                          comet_shard_stats *out)
{
    if (!out)
        return set_error(COMET_E_INVALID, "comet_shard_stats_get: null argument");
    int rc = stream_check_shard(s, shard_id);
    if (rc)
        return rc;
    shard *sh;
    rc = shard_acquire_if_open(s, shard_id, &sh);
    if (rc == COMET_E_WOULD_BLOCK) { /* not open here: read it without opening it */
        rc = stats_closed(s, shard_id, what, out);
        if (rc != STATS_UNSETTLED)
            return rc;
        rc = shard_acquire(s, shard_id, &sh); /* an opener checks the tail first */
    }
    if (rc)
        return rc;
    rc = stats_of(sh, what, out);
    shard_leave(sh);
    return rc;
}

/* Whether the state's counters can be believed without opening the shard:
 * a living process holds it open (the shared lock every holder keeps, see
 * shard.c), or its last holder closed it cleanly.  Otherwise a crash left it
 * and the tail is unchecked: only an opener's recovery knows what is there. */
static int state_settled(int fd, const state_file *st)
{
    if (st->magic != MAGIC_STATE || st->header_crc != crc32c_header(st))
        return 0;
    if (atomic_load(&((state_file *)st)->closed_clean) == STATE_CLOSED_CLEAN)
        return 1;
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = STATE_HOLDERS_LOCK_BYTE;
    fl.l_len = 1;
    return sys_fcntl_lock(fd, F_OFD_GETLK, &fl) == 0 && fl.l_type != F_UNLCK;
}

/* A shard this process has not open: its counters from a read-only mapping
 * of the state file, its sizes from the directory - no descriptor or mapping
 * is kept, no lock taken, nothing repaired, so that listing thousands of
 * streams costs no handles.  A shard never written has no directory: all
 * zeros.  STATS_UNSETTLED when the state cannot be believed without the
 * tail check an open does (state_settled). */
static int stats_closed(comet_stream *s, uint32_t shard_id, unsigned what, comet_shard_stats *out)
{
    memset(out, 0, sizeof *out);
    char dir[COMET_PATH_MAX], path[COMET_PATH_MAX];
    if (path_format(dir, "%s/shard-%04u", s->dir, shard_id) ||
        path_format(path, "%s/%s", dir, STATE_NAME))
        return set_error(COMET_E_INVALID, "path of shard %u of %s is too long", shard_id, s->dir);
    int fd = sys_open(path, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0) {
        struct stat sb;
        if (errno == ENOENT && sys_stat(dir, &sb) && errno == ENOENT)
            return 0; /* never written */
        if (errno == ENOENT)
            return STATS_UNSETTLED; /* files without a state: an open rebuilds it */
        return set_errno_error(errno, "cannot open %s", path);
    }
    /* A copy, read with pread: a mapping and its removal cost more than the
     * read (listing thousands of shards), and the counters are a snapshot
     * either way. */
    state_file *copy = sys_calloc(1, sizeof *copy);
    const state_file *st = NULL;
    int err = copy ? 0 : ENOMEM;
    /* Openers hold the flock exclusively from the state's validation to the
     * end of their tail check (shard.c), with the holders' lock taken on the
     * way: waiting for it keeps a state mid-recovery from reading as settled. */
    if (!err && sys_flock(fd, LOCK_SH))
        err = errno;
    else if (!err) {
        ssize_t got = sys_pread(fd, copy, STATE_FILE_BYTES, 0);
        if (got < 0)
            err = errno;
        else if (got == (ssize_t)STATE_FILE_BYTES) /* shorter: being made, unsettled */
            st = copy;
    }
    int settled = st && state_settled(fd, st);
    if (settled)
        counters_of(st, out);
    sys_close(fd); /* lets the flock go */
    free(copy);
    if (!st && err)
        return set_errno_error(err, "cannot read %s", path);
    if (!settled)
        return STATS_UNSETTLED;
    uint64_t *bases;
    size_t n;
    int rc = segment_list_bases(dir, &bases, &n);
    if (rc)
        return rc;
    rc = sizes_of(dir, bases, n, out);
    if (!rc && first_entry_from_segments(bases, n, out) &&
        (what & COMET_STATS_OLDEST_TIMESTAMP)) {
        segment *seg = segment_new(bases[0]);
        uint32_t lf;
        if (seg && segment_map(seg, dir, shard_id) == 0 &&
            entry_validate(seg, SEGMENT_DATA_OFFSET, seg->base, ENTRY_LEN_MASK, &lf) == ENTRY_OK)
            out->oldest_timestamp = entry_timestamp(seg, SEGMENT_DATA_OFFSET);
        clear_error();
        if (seg)
            segment_free(seg);
    }
    free(bases);
    return rc;
}

static int sizes_of(const char *dir, const uint64_t *bases, size_t n, comet_shard_stats *out)
{
    out->segments = n;
    for (size_t i = 0; i < n; i++)
        out->disk_bytes += segment_file_bytes(dir, bases[i], SEGMENT_SUFFIX) +
                           segment_file_bytes(dir, bases[i], INDEX_SUFFIX);
    char spare[COMET_PATH_MAX]; /* the spare (recycle.c) is the shard's disk too */
    if (!path_format(spare, "%s/%s", dir, SPARE_NAME))
        out->disk_bytes += file_disk_bytes(spare);
    return 0;
}

/* first_entry raised to the oldest segment's base when that segment holds
 * committed entries (entries the state still counts may be gone with deleted
 * segments); 1 when it does: its first entry is then the oldest. */
static int first_entry_from_segments(const uint64_t *bases, size_t n, comet_shard_stats *out)
{
    if (!n || out->next_entry <= bases[0])
        return 0;
    if (out->first_entry < bases[0])
        out->first_entry = bases[0];
    return 1;
}

static int stats_of(shard *sh, unsigned what, comet_shard_stats *out)
{
    int rc;
    memset(out, 0, sizeof *out);
    counters_of(sh->st, out);
    uint64_t *bases;
    size_t n;
    rc = shard_segment_bases(sh, &bases, &n);
    if (rc)
        return rc;
    sizes_of(sh->dir, bases, n, out);
    if (first_entry_from_segments(bases, n, out) && (what & COMET_STATS_OLDEST_TIMESTAMP)) {
        segment *seg = shard_segment_by_base(sh, bases[0]);
        uint32_t lf;
        if (seg && entry_validate(seg, SEGMENT_DATA_OFFSET, seg->base, ENTRY_LEN_MASK, &lf) ==
                       ENTRY_OK)
            out->oldest_timestamp = entry_timestamp(seg, SEGMENT_DATA_OFFSET);
        shard_segment_release(sh, seg);
    }
    free(bases);
    return 0;
}

/* What the shared state says; any process, open or not (a const mapping). */
static void counters_of(const state_file *cst, comet_shard_stats *out)
{
    state_file *st = (state_file *)cst; /* the atomics are only loaded */
    out->next_entry = atomic_load_explicit(&st->next_entry, memory_order_acquire);
    out->durable_entry = atomic_load(&st->durable_entry);
    out->first_entry = atomic_load(&st->first_entry);
    uint64_t active_end = atomic_load(&st->active_end);
    out->active_bytes = active_end > SEGMENT_DATA_OFFSET ? active_end - SEGMENT_DATA_OFFSET : 0;
    if (out->next_entry > out->first_entry)
        out->newest_timestamp = atomic_load(&st->last_ts);
    out->appends = wc_get(st, WC_APPENDS);
    out->appended_entries = wc_get(st, WC_APPENDED_ENTRIES);
    out->appended_raw_bytes = wc_get(st, WC_APPENDED_RAW_BYTES);
    out->appended_stored_bytes = wc_get(st, WC_APPENDED_STORED_BYTES);
    out->compressed_entries = wc_get(st, WC_COMPRESSED_ENTRIES);
    out->append_latency_sum_ns = wc_get(st, WC_LATENCY_SUM_NS);
    out->append_latency_count = wc_get(st, WC_LATENCY_COUNT);
    out->append_latency_max_ns = wc_get(st, WC_LATENCY_MAX_NS);
    out->rotations = wc_get(st, WC_ROTATIONS);
    out->recoveries = wc_get(st, WC_RECOVERIES);
    out->truncated_bytes = wc_get(st, WC_TRUNCATED_BYTES);
    out->truncated_entries = wc_get(st, WC_TRUNCATED_ENTRIES);
    out->orphaned_segments = wc_get(st, WC_ORPHANED_SEGMENTS);
    out->state_rebuilds = wc_get(st, WC_STATE_REBUILDS);
    out->retention_deleted_segments = wc_get(st, WC_RETENTION_DELETED_SEGMENTS);
    out->retention_deleted_bytes = wc_get(st, WC_RETENTION_DELETED_BYTES);
    out->retention_lost_entries = wc_get(st, WC_RETENTION_LOST_ENTRIES);
    out->recycled_segments = wc_get(st, WC_RECYCLED_SEGMENTS);
    out->syncs = atomic_load(&st->shared[SC_SYNCS]);
    out->lock_owner_died = atomic_load(&st->shared[SC_LOCK_OWNER_DIED]);
    out->index_rebuilds = atomic_load(&st->shared[SC_INDEX_REBUILDS]);
    out->crc_failures = atomic_load(&st->shared[SC_CRC_FAILURES]);
    out->skipped_entries = atomic_load(&st->shared[SC_SKIPPED_ENTRIES]);
    out->storage_full_errors = atomic_load(&st->shared[SC_STORAGE_FULL_ERRORS]);
    out->sync_failures = atomic_load(&st->shared[SC_SYNC_FAILURES]);
    out->sync_failed_errno = atomic_load(&st->sync_failed);
    out->key_replays = wc_get(st, WC_KEY_REPLAYS);
}
