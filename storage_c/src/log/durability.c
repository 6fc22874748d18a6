/*
 * durability.c - making committed entries durable: group commit.
 *
 * Whoever holds a shard's sync lock fdatasyncs every segment from the durable
 * point's to the active one and moves the durable point to the commit point it
 * read before syncing; appenders that queued behind it usually find their
 * entries durable already, so concurrent appends share one sync.  The durable
 * point lives in the shared state: durable-only readers in any process see it.
 *
 * A failed sync is fatal for the shard (the PostgreSQL "fsyncgate" lesson):
 * after a writeback error Linux may drop the pages it could not write and
 * marks them clean, reports the error once per open file description, and
 * lets the next sync succeed.  Retrying would move the durable point past
 * data that is gone.  So the first failure is recorded in the shared state
 * (sync_failed, sync_failure.c), the durable point stays where it was, and
 * every process refuses appends with COMET_E_SYNC_FAILED until an opener
 * repairs the tail: it writes the tail back from the page cache, syncs it
 * and keeps only the entries that verify (resync.c,
 * recovery_after_failed_sync).
 *
 * No device flush happens in the append path under "interval": a rotation
 * creates (or takes) the next segment and its index without syncing them or
 * the directory (segment.c, recycle.c).  The sync that first covers a
 * segment whose name may not be durable yet - one newer than the durable
 * point's, or the one the durable point starts - syncs the directory after
 * the segments and before it moves the durable point, so no entry is
 * durable (and, under "always", acknowledged) in a file whose name is not.
 * A rotation only ever reuses a file whose old name is durably gone
 * (recycle.c), so its new contents never reach the disk under that name.
 * A name that reached the disk without its contents (the kernel journals
 * directory changes in order: another file's sync may carry it) is a torn
 * creation recovery removes, or a recycled file it gives back (recovery.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "log.h"
#include "sync_failure.h"


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

/* A directory of the shard's (its own, or its stream's) synced: a failed
 * open leaves the durable point where it was (the next sync tries again); a
 * failed fsync is fatal, as a segment's is (a name the kernel failed to write
 * may be reported once). */
static int sync_dir(shard *sh, const char *dir, const char *what)
{
    int fd = sys_open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (fd < 0)
        return set_errno_error(errno, "cannot open directory %s", dir);
    int rc = sys_fsync(fd) ? shard_note_sync_failure(sh, errno, what) : 0;
    sys_close(fd);
    return rc;
}

int shard_sync_stream_dir(shard *sh)
{
    comet_stream *s = sh->stream;
    if (atomic_load_explicit(&s->dir_synced, memory_order_acquire) >= sh->dir_ticket)
        return 0;
    /* Every ticket drawn so far belongs to a directory made (or found)
     * before the fsync below begins. */
    uint64_t made = atomic_load_explicit(&s->dir_made, memory_order_acquire);
    int rc = sync_dir(sh, s->dir, "fsync of the stream directory");
    uint64_t seen = atomic_load_explicit(&s->dir_synced, memory_order_relaxed);
    while (!rc && seen < made &&
           !atomic_compare_exchange_weak_explicit(&s->dir_synced, &seen, made, memory_order_release,
                                                  memory_order_relaxed))
        ;
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
    rc = shard_sync_refusal(sh); /* what follows the durable point may be gone */
    if (rc) {
        pthread_mutex_unlock(&st->sync_lock.mutex);
        return rc;
    }
    /* The sync covers what is committed now: its time is now, not when it ends
     * (the inline-sync rule of `interval` appends compares against it). */
    int64_t started = now_ns();
    uint64_t durable = atomic_load_explicit(&st->durable_entry, memory_order_relaxed);
    uint64_t committed = atomic_load_explicit(&st->next_entry, memory_order_acquire);
    uint64_t newest = atomic_load_explicit(&st->active_base, memory_order_acquire);
    uint64_t oldest = atomic_load_explicit(&st->durable_base, memory_order_relaxed);
    uint64_t *bases = NULL;
    size_t n = 0;
    /* The idempotency keys first: a batch this sync makes durable has its key
     * on the disk before it (keys.c). */
    rc = keys_sync(sh);
    if (!rc)
        rc = shard_segment_bases(sh, &bases, &n);
    for (size_t i = 0; !rc && i < n; i++) {
        if (bases[i] < oldest || bases[i] > newest)
            continue;
        if (i + 1 < n && bases[i + 1] <= oldest)
            continue;
        segment *seg;
        int got = shard_segment_get(sh, bases[i], &seg);
        if (!seg && got == COMET_E_CORRUPT) {
            clear_error();
            continue; /* deleted by retention meanwhile: nothing of it to sync */
        }
        if (!seg) { /* it could not be opened or mapped: not synced, so not durable */
            rc = got;
            break;
        }
        int fd = shard_segment_fd(sh, seg);
        if (fd >= 0 && sys_fdatasync(fd))
            rc = shard_note_segment_sync_failure(sh, errno, "fdatasync", bases[i]);
        else if (fd < 0)
            rc = fd;
        shard_segment_release(sh, seg);
    }
    free(bases);
    /* The active segment holds no durable entry yet, or is newer than the
     * durable point's: its name may not be durable (a rotation syncs
     * nothing).  A failed directory sync is fatal, as a segment's is. */
    if (!rc && (newest > oldest || durable <= newest)) {
        uint64_t kept = recycle_pending(sh);
        if (!(rc = sync_dir(sh, sh->dir, "fsync of the directory")) && kept)
            recycle_settle(sh, kept); /* its old name is durably gone now */
    }
    /* The shard directory's own name: durable once any sync moved the
     * durable point past zero (that sync made it so). */
    if (!rc && durable == 0)
        rc = shard_sync_stream_dir(sh);
    rc = rc ? presence_explain(sh, rc) : presence_check(sh);
    if (!rc) {
        atomic_store_explicit(&st->durable_base, newest, memory_order_relaxed);
        atomic_store_explicit(&st->durable_entry, committed, memory_order_release);
        atomic_store_explicit(&st->last_sync_ns, started, memory_order_relaxed);
        sc_add(st, SC_SYNCS, 1);
    }
    pthread_mutex_unlock(&st->sync_lock.mutex);
    /* The durable point itself reaches the disk about once per interval:
     * after a power cut, recovery starts from it, so that entries lost after
     * it are cut (the log stays a prefix) instead of left as holes.  Written
     * after the sync lock is let go, so that this copy of the state never
     * says the lock is held (the kernel's own writeback still may: openers
     * reset lock words no living process holds, state.c). */
    int64_t every = (int64_t)sh->stream->db->cfg.fsync_interval_ms * 1000000;
    if (!rc && now_ns() - atomic_load_explicit(&sh->state_synced_ns, memory_order_relaxed) >= every) {
        if (sys_msync(st, STATE_FILE_BYTES, MS_SYNC))
            rc = shard_note_sync_failure(sh, errno, "msync of the state");
        atomic_store_explicit(&sh->state_synced_ns, now_ns(), memory_order_relaxed);
    }
    return rc;
}
