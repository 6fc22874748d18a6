/*
 * shard.c - one shard: opening it (state, offsets, first recovery), closing it,
 * and its append lock.  The append path itself is append.c.
 *
 * The append lock is a robust, process-shared mutex in the mapped state:
 * a holder that dies leaves it "owner died", and the next locker repairs the
 * tail (recovery.c) before it appends.  Opening is serialised between
 * processes by a flock on the state file, so that validating the state,
 * re-initialising its locks when no living process holds the shard (state.c)
 * and the first recovery happen one process at a time.  The state file's
 * descriptor then stays open, with its shared lock, until the shard is
 * released: that lock is what tells the next opener the words are in use.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"

/* ---- open and close ------------------------------------------------------- */

int shard_new(comet_stream *stream, uint32_t id, shard **out)
{
    char dir[COMET_PATH_MAX];
    if (path_format(dir, "%s/shard-%04u", stream->dir, id))
        return set_error(COMET_E_INVALID, "path of shard %u of %s is too long", id, stream->dir);
    shard *sh = sys_calloc(1, sizeof *sh);
    if (!sh || !(sh->dir = strdup(dir))) {
        free(sh);
        return set_error(COMET_E_NOMEM, "out of memory opening a shard");
    }
    sh->stream = stream;
    sh->id = id;
    sh->state_fd = -1;
    sh->offsets_fd = -1;
    pthread_mutex_init(&sh->cache_lock, NULL);
    *out = sh;
    return 0;
}

/* What an open leaves behind is released by shard_release; what the last
 * open noted about the shard is forgotten here, so that a reopen starts as
 * the first open did. */
static void forget_last_open(shard *sh)
{
    sh->listed_active_gen = 0;
    sh->active_gen = 0;
    atomic_store(&sh->dirty, 0);
    atomic_store(&sh->state_synced_ns, 0);
    atomic_store(&sh->offsets_dirty, 0);
    sh->dir_dev = sh->dir_ino = sh->state_dev = sh->state_ino = 0;
    atomic_store(&sh->gone, 0);
    free(sh->gone_detail);
    sh->gone_detail = NULL;
}

int shard_open_files(shard *sh)
{
    forget_last_open(sh);
    int rc;
    if (make_dir(sh->dir, sh->stream->dir) && errno != EEXIST) {
        rc = set_errno_error(errno, "cannot create %s", sh->dir);
        goto fail;
    }
    /* Made here or by another process, its name may not be durable yet: the
     * first sync of anything in it syncs the stream's directory. */
    sh->dir_ticket = atomic_fetch_add(&sh->stream->dir_made, 1) + 1;
    char path[COMET_PATH_MAX];
    path_format(path, "%s/%s", sh->dir, STATE_NAME); /* sh->dir leaves room: see comet_open */
    sh->state_fd = open_new(path, O_RDWR | O_CREAT | O_CLOEXEC, sh->dir);
    if (sh->state_fd < 0) {
        rc = set_errno_error(errno, "cannot open %s", path);
        goto fail;
    }
    /* Openers are serialised: state validation, lock re-initialisation when
     * nobody holds the shard, and the first recovery happen one process at a
     * time. */
    if (sys_flock(sh->state_fd, LOCK_EX)) { /* never unserialised (EINTR is retried) */
        rc = set_errno_error(errno, "cannot lock %s", path);
        goto fail;
    }
    int rebuilt = 0, due = 0;
    rc = state_open(sh, &rebuilt, &due); /* a lock its holder left: the check has a cause */
    if (!rc)
        rc = offsets_open(sh);
    if (!rc) {
        rc = pthread_mutex_lock(&sh->st->append_lock.mutex);
        if (rc == EOWNERDEAD) {
            sc_add(sh->st, SC_LOCK_OWNER_DIED, 1);
            pthread_mutex_consistent(&sh->st->append_lock.mutex);
            due = 1;
            rc = 0;
        }
        if (rc)
            rc = set_errno_error(rc, "cannot lock %s", sh->dir);
        else {
            /* A state nobody held is checked, but that alone is no cause:
             * it is every first opener's case, after a clean close too. */
            due |= (rebuilt && rebuilt != STATE_UNHELD) || atomic_load(&sh->st->recovery_pending);
            /* A device that still fails keeps the mark (appends refused) but
             * not readers and inspectors out: what is committed reads. */
            if (atomic_load(&sh->st->sync_failed)) {
                rc = recovery_after_failed_sync(sh);
                if (rc == COMET_E_SYNC_FAILED)
                    rc = 0;
            } else
                rc = recovery_repair_tail(sh, rebuilt, due);
            pthread_mutex_unlock(&sh->st->append_lock.mutex);
        }
    }
    presence_note(sh, sh->state_fd);
    sys_flock(sh->state_fd, LOCK_UN); /* the descriptor stays: it holds the shared lock */
    if (rc)
        goto fail;
    return 0;
fail:
    shard_release(sh);
    return rc;
}

void shard_release(shard *sh)
{
    shard_segments_clear(sh);
    offsets_close(sh);
    keys_close(sh);
    state_close_if_last(sh);
    state_close(sh);
    /* after the unmap: the lock words are not touched again by this process */
    if (sh->state_fd >= 0)
        sys_close(sh->state_fd);
    sh->state_fd = -1;
}

void shard_close(shard *sh)
{
    if (!sh)
        return;
    shard_release(sh);
    pthread_mutex_destroy(&sh->cache_lock);
    free(sh->gone_detail);
    free(sh->dir);
    free(sh);
}

/* ---- the append lock ------------------------------------------------------ */

int shard_lock(shard *sh)
{
    return shard_lock_noting_wait(sh, NULL);
}

int shard_lock_noting_wait(shard *sh, int *waited)
{
    state_file *st = sh->st;
    int rc = pthread_mutex_trylock(&st->append_lock.mutex);
    if (rc == EBUSY) {
        if (waited)
            *waited = 1;
        rc = pthread_mutex_lock(&st->append_lock.mutex);
    }
    if (rc == EOWNERDEAD) {
        /* The holder died mid-append: its partial batch must not survive.
         * Mark the lock usable at once (a failed repair must never leave it
         * unrecoverable) and let the repair below, or the next locker's, run. */
        sc_add(st, SC_LOCK_OWNER_DIED, 1);
        atomic_store(&st->recovery_pending, 1);
        pthread_mutex_consistent(&st->append_lock.mutex);
        rc = 0;
    }
    if (rc)
        return set_errno_error(rc, "cannot lock shard %s", sh->dir);
    if (atomic_load_explicit(&st->recovery_pending, memory_order_relaxed)) {
        rc = recovery_repair_tail(sh, 0, 1);
        if (rc) {
            pthread_mutex_unlock(&st->append_lock.mutex);
            return rc;
        }
    }
    return 0;
}

int shard_trylock_refused(shard *sh, int rc)
{
    state_file *st = sh->st;
    if (rc == EOWNERDEAD) {
        sc_add(st, SC_LOCK_OWNER_DIED, 1);
        atomic_store(&st->recovery_pending, 1);
        pthread_mutex_consistent(&st->append_lock.mutex);
        pthread_mutex_unlock(&st->append_lock.mutex);
        return EBUSY;
    }
    if (rc)
        return rc;
    pthread_mutex_unlock(&st->append_lock.mutex); /* taken, but a repair is pending */
    return EBUSY;
}
