/*
 * resync.c - opening a shard again after one of its syncs failed.
 *
 * sync_failure.c marks a shard (state sync_failed) when an fsync, fdatasync or
 * msync of its files fails, and from then on every process refuses appends.
 * What a failed sync leaves is unknown: Linux marks the pages it could not
 * write clean and may keep them in the page cache (reads still see the data,
 * the disk does not have it, and no later sync writes it again) or drop them
 * (reads see what the disk has).  So the first opener after the failure, with
 * the append lock held:
 *
 *   1. writes every byte after the durable point back from the page cache
 *      and syncs it: pages the kernel kept reach the disk now; pages it
 *      dropped are written back as the disk had them, which the checks below
 *      then refuse.  If this sync fails too, the device is still failing: the
 *      mark stays and the open fails with COMET_E_SYNC_FAILED;
 *   2. repairs the tail as after a restart (recovery.c with STATE_REBOOTED):
 *      past the durable point the first entry that does not verify ends the
 *      log, so the log stays a prefix of what was written;
 *   3. keeps nothing past acked_end: entries after it were written only by
 *      `always` appends, whose callers were told the append failed (keeping
 *      them would store a retried batch twice);
 *   4. writes the consumer offsets back and syncs them the same way, syncs
 *      the state with the mark cleared.
 *
 * Cost: one pass over the segments after the durable point (up to one
 * interval of writes, or the active segment's written bytes), only after a
 * failure.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "log.h"

#define REWRITE_CHUNK ((size_t)1 << 20)

/* Writes [from, to) of the file back from map (the file's shared mapping:
 * the page cache) and syncs it.  Reads through a copy: writing a page of a
 * file from its own mapping could fault on the page being written. */
static int rewrite_and_sync(shard *sh, int fd, const uint8_t *map, uint64_t from, uint64_t to,
                            const char *what, const char *sync_what)
{
    uint8_t *buf = to > from ? sys_malloc(REWRITE_CHUNK) : NULL;
    if (to > from && !buf)
        return set_error(COMET_E_NOMEM, "out of memory repairing %s", sh->dir);
    for (; from < to; from += REWRITE_CHUNK) {
        size_t n = (size_t)(to - from < REWRITE_CHUNK ? to - from : REWRITE_CHUNK);
        memcpy(buf, map + from, n);
        if (sys_pwrite(fd, buf, n, (off_t)from) < 0) {
            int err = errno;
            free(buf);
            return set_errno_error(err, "cannot write %s of %s back", what, sh->dir);
        }
    }
    free(buf);
    if (sys_fdatasync(fd))
        return shard_note_sync_failure(sh, errno, sync_what);
    return 0;
}

/* Step 1: the segments from the durable point's on. */
static int rewrite_segments(shard *sh)
{
    state_file *st = sh->st;
    uint64_t durable_base = atomic_load(&st->durable_base);
    uint64_t active = atomic_load(&st->active_base);
    uint64_t hwm = atomic_load(&st->write_hwm), end = atomic_load(&st->active_end);
    if (hwm < end)
        hwm = end;
    uint64_t *bases;
    size_t n;
    int rc = shard_list_segments(sh, &bases, &n);
    for (size_t i = 0; !rc && i < n; i++) {
        if (bases[i] < durable_base)
            continue; /* wholly before the durable point: a segment base */
        segment *seg;
        rc = shard_segment_get(sh, bases[i], &seg);
        if (!seg) {
            /* unreadable: the repair below sets it aside or fails */
            if (rc != COMET_E_IO && rc != COMET_E_NOMEM)
                rc = 0;
            clear_error();
            continue;
        }
        uint64_t to = seg->base == active && hwm ? hwm : seg->capacity;
        if (to > seg->capacity)
            to = seg->capacity;
        int fd = shard_segment_fd(sh, seg);
        rc = fd < 0 ? fd : rewrite_and_sync(sh, fd, seg->map, 0, to, "a segment",
                                                    "fdatasync of a rewritten segment");
        shard_segment_release(sh, seg);
    }
    free(bases);
    return rc;
}

int recovery_after_failed_sync(shard *sh)
{
    state_file *st = sh->st;
    int rc = rewrite_segments(sh);
    if (rc)
        return rc;
    uint64_t durable = atomic_load(&st->durable_entry), acked = atomic_load(&st->acked_end);
    rc = recovery_repair_below(sh, STATE_REBOOTED, 1, acked > durable ? acked : durable);
    if (rc)
        return rc;
    if (sh->offsets && sh->offsets_fd >= 0) {
        rc = rewrite_and_sync(sh, sh->offsets_fd, sh->offsets, 0, OFFSETS_FILE_BYTES,
                              "the offsets", "fdatasync of the rewritten offsets");
        if (rc)
            return rc;
    }
    atomic_store(&st->sync_failed, 0);
    if (sys_msync(st, STATE_FILE_BYTES, MS_SYNC)) {
        rc = shard_note_sync_failure(sh, errno, "msync of the state");
        return rc;
    }
    return 0;
}
