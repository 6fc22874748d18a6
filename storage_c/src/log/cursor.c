/*
 * cursor.c - walking a shard's committed entries in the shared mappings,
 * without a lock: the segment list (binary search), the segment's sparse
 * index (binary search), then a scan of at most one index interval; over a
 * damaged entry (by length, by index record, byte by byte) and over deleted
 * segments, counting what it could not return (skipped, damaged).
 *
 * reader.c reads through it (comet_read, comet_find_time); keys.c asks it
 * for one entry's header (shard_entry_header), to tell whether the batch a
 * key recorded is still in the log.  It stands below both: it needs the
 * segments (segcache.c, index.c, entry.c) and nothing that opens a shard.
 */
#include <stdatomic.h>
#include <stdint.h>

#include "cursor.h"

/* Puts the cursor in seg (referenced; the next segment starts at end) at the
 * index record before target, or at the segment start. */
static void cursor_place(cursor *c, segment *seg, uint64_t end, uint64_t target)
{
    uint64_t rel, off;
    index_lookup(seg, target - seg->base, &rel, &off);
    if (!index_record_ok(seg, rel, off)) {
        /* The record points at something that is not its entry: the index
         * is wrong (or that entry is damaged).  A sealed segment's index is
         * rebuilt now; the active one's by the next appender (recovery).
         * Meanwhile scan from the start. */
        if (end != UINT64_MAX)
            seg = shard_segment_rebuild_index(c->sh, seg, end);
        else
            atomic_store(&c->sh->st->recovery_pending, 1);
        index_lookup(seg, target - seg->base, &rel, &off);
        if (!index_record_ok(seg, rel, off))
            rel = 0, off = SEGMENT_DATA_OFFSET;
    }
    c->seg = seg;
    c->seg_end = end;
    c->entry = seg->base + rel;
    c->off = off;
}

/* Positions the cursor at the index record before target (or its segment
 * start); entries below target are then walked over by the caller.  Returns
 * 0 when there is nothing to read from target on, or when the segment cannot
 * be read (c->err: an I/O error is reported, never skipped like deleted data). */
int cursor_seek(cursor *c, uint64_t target)
{
    cursor_drop(c);
    for (;;) {
        uint64_t end;
        segment *seg;
        int rc = shard_segment_for(c->sh, target, &seg, &end);
        if (rc && rc != COMET_E_CORRUPT) { /* a damaged or vanished segment is skipped below */
            c->err = rc;
            c->entry = target;
            return 0;
        }
        if (seg) {
            cursor_place(c, seg, end, target);
            return 1;
        }
        /* target lies before the first segment (deleted by retention) */
        if (end == UINT64_MAX || end <= target || end >= c->limit) {
            if (end != UINT64_MAX && end > target) {
                uint64_t stop = end < c->limit ? end : c->limit;
                c->skipped += stop - target;
                c->entry = stop;
            }
            return 0;
        }
        c->skipped += end - target;
        target = end;
    }
}

/* Moves past a damaged entry at the cursor; returns 0 when the segment has
 * nothing readable left. */
static int cursor_resync(cursor *c, uint64_t from)
{
    uint64_t bound = c->seg_end < c->limit ? c->seg_end : c->limit;
    uint64_t found_off, found_entry;
    if (entry_resync(c->seg, c->off, c->entry, c->seg->capacity, ENTRY_LEN_MASK, &found_off,
                     &found_entry) &&
        found_entry < bound) {
        if (found_entry > from)
            c->skipped += found_entry - (c->entry > from ? c->entry : from);
        c->damaged++;
        c->entry = found_entry;
        c->off = found_off;
        return 1;
    }
    if (bound > from)
        c->skipped += bound - (c->entry > from ? c->entry : from);
    c->damaged++;
    c->entry = bound;
    return 0;
}

/* Moves the cursor to the next entry that checks out, over damage and
 * segment ends: 1 with its header flags in *lf, or 0 when there is nothing
 * more below the limit (c->err: a segment could not be read). */
int cursor_next(cursor *c, uint64_t from, uint32_t *lf)
{
    while (c->entry < c->limit) {
        if (!c->seg || c->entry >= c->seg_end) {
            if (!cursor_seek(c, c->entry))
                return 0;
            continue;
        }
        if (entry_validate(c->seg, c->off, c->entry, ENTRY_LEN_MASK, lf) == ENTRY_OK)
            return 1;
        /* A mapping made before another process grew the file ends early. */
        if (!c->reloaded && segment_header_capacity(c->seg) > c->seg->capacity) {
            c->reloaded = 1;
            if (!cursor_seek(c, c->entry))
                return 0;
            continue;
        }
        if (!cursor_resync(c, from))
            cursor_drop(c);
    }
    return 0;
}

int shard_entry_header(shard *sh, uint64_t entry, uint32_t *lf, int64_t *ts)
{
    cursor c = {.sh = sh, .limit = atomic_load_explicit(&sh->st->next_entry, memory_order_acquire)};
    int found = 0;
    if (entry < c.limit && cursor_seek(&c, entry)) {
        while (cursor_next(&c, entry, lf) && c.entry <= entry) {
            if (c.entry == entry) {
                *ts = entry_timestamp(c.seg, c.off);
                found = 1;
                break;
            }
            cursor_step(&c, *lf);
        }
    }
    int err = c.err;
    cursor_drop(&c);
    return err ? err : found;
}

