/*
 * sync_failure.c - a failed sync, recorded for every process: the first
 * failure of a shard's sync (segments, index, state, offsets, keys,
 * directories) marks the shard in its shared state (sync_failed), and every
 * later append is refused with COMET_E_SYNC_FAILED, or COMET_E_READ_ONLY when
 * the device went read-only, until an opener repairs the tail (resync.c).
 * Why a failed sync is fatal rather than retried: durability.c.
 *
 * The mark sits apart, below durability.c, because every file that syncs
 * something of the shard's records its own failures here (keys.c,
 * offsets.c, recovery.c, resync.c), and durability.c syncs through them.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "log.h"

int shard_sync_refused(shard *sh, uint32_t err)
{
    return set_error(err == EROFS ? COMET_E_READ_ONLY : COMET_E_SYNC_FAILED, /* presence.c */
                     "a sync of %s failed earlier (%s): the kernel may have dropped data it could "
                     "not write, so the shard refuses appends until it is opened again (restart or "
                     "reload the gateway), which checks its tail; see the storage's logs and the "
                     "device", sh->dir, strerror((int)err));
}

/* Records the first failed sync of the shard (err: errno) and returns the
 * refusal every later caller gets, naming what failed first. */
int shard_note_segment_sync_failure(shard *sh, int err, const char *what, uint64_t base)
{
    uint32_t none = 0;
    if (atomic_compare_exchange_strong(&sh->st->sync_failed, &none, (uint32_t)(err ? err : EIO)))
        sc_add(sh->st, SC_SYNC_FAILURES, 1);
    char first[160];
    if (base == UINT64_MAX)
        snprintf(first, sizeof first, "%s", what);
    else
        snprintf(first, sizeof first, "%s of segment %" PRIu64, what, base);
    return set_error(err == EROFS ? COMET_E_READ_ONLY : COMET_E_SYNC_FAILED, /* presence.c */
                     "%s in %s failed: %s; the shard refuses appends until it is opened again "
                     "(restart or reload the gateway), which checks its tail",
                     first, sh->dir, strerror(err));
}

int shard_note_sync_failure(shard *sh, int err, const char *what)
{
    return shard_note_segment_sync_failure(sh, err, what, UINT64_MAX);
}
