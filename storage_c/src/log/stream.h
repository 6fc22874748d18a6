/*
 * stream.h - the inline test a shard's calls make of a deleted stream:
 * COMET_E_NO_STREAM, and the handle marked (stream.c), when the shard's
 * stream was deleted (any process); 0 otherwise.  Call with the shard
 * entered.
 */
#ifndef COMET_STREAM_H
#define COMET_STREAM_H

#include "log.h"

static inline int shard_check_deleted(shard *sh)
{
    if (sh->st && atomic_load_explicit(&sh->st->deleted, memory_order_acquire) == STATE_DELETED)
        return stream_mark_deleted(sh->stream);
    return 0;
}

#endif /* COMET_STREAM_H */
