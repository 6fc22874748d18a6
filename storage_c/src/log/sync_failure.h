/*
 * sync_failure.h - the inline test every append makes of sync_failure.c's
 * mark: COMET_E_SYNC_FAILED (with the detail) once a sync of the shard
 * failed in any process and no opener has repaired it since; else 0.  The
 * test is inline, the refusal is not.
 */
#ifndef COMET_SYNC_FAILURE_H
#define COMET_SYNC_FAILURE_H

#include "log.h"

int shard_sync_refused(shard *sh, uint32_t err);
static inline int shard_sync_refusal(shard *sh)
{
    uint32_t err = atomic_load_explicit(&sh->st->sync_failed, memory_order_acquire);
    return err ? shard_sync_refused(sh, err) : 0;
}

#endif /* COMET_SYNC_FAILURE_H */
