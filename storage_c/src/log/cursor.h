/*
 * cursor.h - the cursor of cursor.c, which walks a shard's committed
 * entries, for reader.c; its small steps are inline (a read makes them for
 * every entry).
 */
#ifndef COMET_CURSOR_H
#define COMET_CURSOR_H

#include "log.h"

typedef struct cursor {
    shard *sh;
    segment *seg;      /* referenced */
    uint64_t seg_end;  /* first entry after this segment (UINT64_MAX: last) */
    uint64_t entry;    /* entry at off */
    uint64_t off;
    uint64_t limit;    /* committed (or durable) count */
    uint64_t skipped;
    uint64_t damaged;
    int reloaded;
    int err;           /* a segment could not be read (COMET_E_*): the read stops there */
} cursor;

static inline void cursor_drop(cursor *c)
{
    if (c->seg)
        shard_segment_release(c->sh, c->seg);
    c->seg = NULL;
}

/* Steps the cursor over the entry at it (len_flags lf). */
static inline void cursor_step(cursor *c, uint32_t lf)
{
    c->off += ENTRY_HEADER_BYTES + (lf & ENTRY_LEN_MASK);
    c->entry++;
}
/* Positions the cursor at the index record before target (or its segment
 * start); entries below target are then walked over by the caller.  Returns
 * 0 when there is nothing to read from target on, or when the segment cannot
 * be read (c->err: an I/O error is reported, never skipped like deleted data). */
int cursor_seek(cursor *c, uint64_t target);
/* Moves the cursor to the next entry that checks out, over damage and
 * segment ends: 1 with its header flags in *lf, or 0 when there is nothing
 * more below the limit (c->err: a segment could not be read). */
int cursor_next(cursor *c, uint64_t from, uint32_t *lf);

#endif /* COMET_CURSOR_H */
