/*
 * stats.c - per-shard statistics, read from the shared state by any process.
 * Counters come from the state; sizes and the oldest timestamp come from the
 * segment files themselves, so they are right even after a state rebuild.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "errors.h"
#include "internal.h"

static uint64_t allocated_bytes(const char *dir, uint64_t base, const char *suffix)
{
    char path[COMET_PATH_MAX];
    segment_path(path, dir, base, suffix);
    return file_disk_bytes(path);
}

static int stats_of(shard *sh, comet_shard_stats *out);

int comet_shard_stats_get(comet_stream *s, uint32_t shard_id, comet_shard_stats *out)
{
    if (!out)
        return set_error(COMET_E_INVALID, "comet_shard_stats_get: null argument");
    shard *sh;
    int rc = shard_acquire(s, shard_id, &sh);
    if (rc)
        return rc;
    rc = stats_of(sh, out);
    shard_leave(sh);
    return rc;
}

static int stats_of(shard *sh, comet_shard_stats *out)
{
    int rc;
    state_file *st = sh->st;
    memset(out, 0, sizeof *out);
    out->next_entry = atomic_load_explicit(&st->next_entry, memory_order_acquire);
    out->durable_entry = atomic_load(&st->durable_entry);
    out->first_entry = atomic_load(&st->first_entry);
    uint64_t active_end = atomic_load(&st->active_end);
    out->active_bytes = active_end > SEGMENT_DATA_OFFSET ? active_end - SEGMENT_DATA_OFFSET : 0;

    uint64_t *bases;
    size_t n;
    rc = shard_segment_bases(sh, &bases, &n);
    if (rc)
        return rc;
    out->segments = n;
    for (size_t i = 0; i < n; i++)
        out->disk_bytes += allocated_bytes(sh->dir, bases[i], SEGMENT_SUFFIX) +
                           allocated_bytes(sh->dir, bases[i], INDEX_SUFFIX);
    if (n && out->next_entry > bases[0]) {
        if (out->first_entry < bases[0])
            out->first_entry = bases[0];
        segment *seg = shard_segment_by_base(sh, bases[0]);
        uint32_t lf;
        if (seg && entry_validate(seg, SEGMENT_DATA_OFFSET, seg->base, ENTRY_LEN_MASK, &lf) ==
                       ENTRY_OK)
            out->oldest_timestamp = entry_timestamp(seg, SEGMENT_DATA_OFFSET);
        shard_segment_release(sh, seg);
        out->newest_timestamp = atomic_load(&st->last_ts);
    }
    free(bases);
    char spare[COMET_PATH_MAX]; /* the spare (recycle.c) is the shard's disk too */
    if (!path_format(spare, "%s/%s", sh->dir, SPARE_NAME))
        out->disk_bytes += file_disk_bytes(spare);
    if (!path_format(spare, "%s/%s", sh->dir, SPARE_INDEX_NAME))
        out->disk_bytes += file_disk_bytes(spare);

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
    return 0;
}
