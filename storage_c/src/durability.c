/*
 * durability.c - making committed entries durable: group commit.
 *
 * Whoever holds a shard's sync lock fdatasyncs every segment from the durable
 * point's to the active one and moves the durable point to the commit point it
 * read before syncing; appenders that queued behind it usually find their
 * entries durable already, so concurrent appends share one sync.  The durable
 * point lives in the shared state: durable-only readers in any process see it.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "errors.h"
#include "internal.h"


static int lock_sync(state_file *st)
{
    int rc = pthread_mutex_lock(&st->sync_lock.mutex);
    if (rc == EOWNERDEAD) {
        /* a syncer died: nothing to repair, the durable point is still true */
        pthread_mutex_consistent(&st->sync_lock.mutex);
        rc = 0;
    }
    return rc;
}

/* Group commit: whoever holds the sync lock syncs everything committed so far;
 * those who queued behind it usually find their entries already durable. */
int shard_sync(shard *sh, uint64_t upto_entry)
{
    state_file *st = sh->st;
    if (atomic_load_explicit(&st->durable_entry, memory_order_acquire) >= upto_entry)
        return 0;
    int rc = lock_sync(st);
    if (rc)
        return set_errno_error(rc, "cannot take the sync lock of %s", sh->dir);
    if (atomic_load_explicit(&st->durable_entry, memory_order_acquire) >= upto_entry) {
        pthread_mutex_unlock(&st->sync_lock.mutex);
        return 0;
    }
    /* The sync covers what is committed now: its time is now, not when it ends
     * (the inline-sync rule of `interval` appends compares against it). */
    int64_t started = now_ns();
    uint64_t committed = atomic_load_explicit(&st->next_entry, memory_order_acquire);
    uint64_t newest = atomic_load_explicit(&st->active_base, memory_order_acquire);
    uint64_t oldest = atomic_load_explicit(&st->durable_base, memory_order_relaxed);
    uint64_t *bases = NULL;
    size_t n = 0;
    rc = shard_segment_bases(sh, &bases, &n);
    for (size_t i = 0; !rc && i < n; i++) {
        if (bases[i] < oldest || bases[i] > newest)
            continue;
        if (i + 1 < n && bases[i + 1] <= oldest)
            continue;
        segment *seg = shard_segment_by_base(sh, bases[i]);
        if (!seg)
            continue; /* deleted by retention meanwhile */
        int fd = shard_segment_fd(sh, seg);
        if (fd >= 0 && sys_fdatasync(fd))
            rc = set_errno_error(errno, "fdatasync of segment %" PRIu64 " in %s failed",
                                 bases[i], sh->dir);
        else if (fd < 0)
            rc = fd;
        shard_segment_release(sh, seg);
    }
    free(bases);
    if (!rc) {
        atomic_store_explicit(&st->durable_base, newest, memory_order_relaxed);
        atomic_store_explicit(&st->durable_entry, committed, memory_order_release);
        atomic_store_explicit(&st->last_sync_ns, started, memory_order_relaxed);
        sc_add(st, SC_SYNCS, 1);
        /* The durable point itself reaches the disk about once per interval:
         * after a power cut, recovery starts from it, so that entries lost
         * after it are cut (the log stays a prefix) instead of left as holes. */
        int64_t every = (int64_t)sh->stream->db->cfg.fsync_interval_ms * 1000000;
        if (started - sh->state_synced_ns >= every) {
            if (sys_msync(st, STATE_FILE_BYTES, MS_SYNC))
                rc = set_errno_error(errno, "msync of the state of %s failed", sh->dir);
            else
                sh->state_synced_ns = started;
        }
    }
    pthread_mutex_unlock(&st->sync_lock.mutex);
    return rc;
}
