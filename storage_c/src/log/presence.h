/*
 * presence.h - the inline test every append makes of presence.c's mark:
 * COMET_E_GONE or COMET_E_READ_ONLY (the detail says which path and what to
 * do) once this process saw the shard's files go; else 0.  A load.
 */
#ifndef COMET_PRESENCE_H
#define COMET_PRESENCE_H

#include "log.h"

int presence_refused(shard *sh, int code);
static inline int presence_refusal(shard *sh)
{
    int code = atomic_load_explicit(&sh->gone, memory_order_acquire);
    return code ? presence_refused(sh, code) : 0;
}

#endif /* COMET_PRESENCE_H */
