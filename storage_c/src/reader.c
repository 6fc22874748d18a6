/*
 * reader.c - lock-free batch reads and timestamp lookup.
 *
 * A reader loads the committed entry count (acquire) and reads entries below
 * it from the shared mappings; it never takes the append lock, so readers in
 * any number of processes never slow writers down.  Entry N is found with the
 * segment list (binary search), the segment's sparse index (binary search)
 * and a scan of at most one index interval.
 *
 * Every entry returned has had its checksum verified.  A damaged entry is
 * skipped, never returned: the reader looks for the next good entry (by
 * length, by index record, byte by byte), counts what it could not return in
 * the shard's crc_failures and skipped_entries, and reports it in the
 * result.  Entries that retention deleted are skipped the same way, so a
 * reader always learns how many entries it did not see.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "internal.h"

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

static void cursor_drop(cursor *c)
{
    if (c->seg)
        shard_segment_release(c->sh, c->seg);
    c->seg = NULL;
}

/* Positions the cursor at the index record before target (or its segment
 * start); entries below target are then walked over by the caller.  Returns
 * 0 when there is nothing to read from target on, or when the segment cannot
 * be read (c->err: an I/O error is reported, never skipped like deleted data). */
static int cursor_seek(cursor *c, uint64_t target)
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
            uint64_t rel, off;
            index_lookup(seg, target - seg->base, &rel, &off);
            uint32_t lf;
            if (rel && entry_validate(seg, off, seg->base + rel, ENTRY_LEN_MASK, &lf) != ENTRY_OK) {
                /* The record points at something that is not its entry: the
                 * index is wrong (or that entry is damaged).  A sealed
                 * segment's index is rebuilt now; the active one's by the
                 * next appender (recovery).  Meanwhile scan from the start. */
                if (end != UINT64_MAX)
                    seg = shard_segment_rebuild_index(c->sh, seg, end);
                else
                    atomic_store(&c->sh->st->recovery_pending, 1);
                index_lookup(seg, target - seg->base, &rel, &off);
                if (rel && entry_validate(seg, off, seg->base + rel, ENTRY_LEN_MASK, &lf) != ENTRY_OK)
                    rel = 0, off = SEGMENT_DATA_OFFSET;
            }
            c->seg = seg;
            c->seg_end = end;
            c->entry = seg->base + rel;
            c->off = off;
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
                     &found_entry) == 0 &&
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

/* Returns the header flags of the entry at the cursor once it checks out,
 * moving over damage and segment ends; -1 when there is nothing more. */
static int64_t cursor_next(cursor *c, uint64_t from)
{
    while (c->entry < c->limit) {
        if (!c->seg || c->entry >= c->seg_end) {
            if (!cursor_seek(c, c->entry))
                return -1;
            continue;
        }
        uint32_t lf;
        entry_check chk = entry_validate(c->seg, c->off, c->entry, ENTRY_LEN_MASK, &lf);
        if (chk == ENTRY_OK)
            return lf;
        /* A mapping made before another process grew the file ends early. */
        if (!c->reloaded && segment_header_capacity(c->seg) > c->seg->capacity) {
            c->reloaded = 1;
            uint64_t e = c->entry;
            if (!cursor_seek(c, e))
                return -1;
            continue;
        }
        if (!cursor_resync(c, from)) {
            cursor_drop(c);
            continue;
        }
    }
    return -1;
}

static int check_request(const comet_read_request *req, const comet_read_result *res)
{
    if (!req || !res)
        return set_error(COMET_E_INVALID, "comet_read: null argument");
    if (req->max_entries && (!req->data || !req->offsets || !req->entries || !req->timestamps))
        return set_error(COMET_E_INVALID, "comet_read: null buffer");
    if (req->data_capacity > INT32_MAX)
        return set_error(COMET_E_INVALID, "comet_read: data buffer above 2 GiB - 1");
    return 0;
}

static int read_locked_in(shard *sh, const comet_read_request *req, comet_read_result *res);

int comet_read(comet_stream *s, uint32_t shard_id, const comet_read_request *req,
               comet_read_result *res)
{
    int rc = check_request(req, res);
    if (rc)
        return rc;
    memset(res, 0, sizeof *res);
    shard *sh;
    rc = shard_acquire(s, shard_id, &sh);
    if (rc)
        return rc;
    rc = shard_check_deleted(sh);
    if (!rc)
        rc = read_locked_in(sh, req, res);
    shard_leave(sh);
    return rc;
}

/* comet_read with the shard held (its mappings cannot go away meanwhile). */
static int read_locked_in(shard *sh, const comet_read_request *req, comet_read_result *res)
{
    state_file *st = sh->st;
    uint64_t limit = (req->flags & COMET_READ_DURABLE_ONLY)
                         ? atomic_load_explicit(&st->durable_entry, memory_order_acquire)
                         : atomic_load_explicit(&st->next_entry, memory_order_acquire);
    uint64_t from = req->from_entry;
    res->limit_entry = limit;
    res->next_entry = from;
    if (req->max_entries)
        req->offsets[0] = 0;
    if (from >= limit || req->max_entries == 0)
        return 0;

    uint64_t cap = req->data_capacity;
    uint64_t budget = req->max_bytes && req->max_bytes < cap ? req->max_bytes : cap;
    uint64_t sep = (req->flags & COMET_READ_NEWLINES) ? 1 : 0;
    cursor c = {.sh = sh, .limit = limit, .entry = from};
    uint32_t n = 0;
    uint64_t used = 0;
    if (!cursor_seek(&c, from))
        goto done;
    int64_t lf;
    while (n < req->max_entries && (lf = cursor_next(&c, from)) >= 0) {
        uint32_t len = (uint32_t)lf & ENTRY_LEN_MASK;
        if (c.entry < from) { /* walking from the index record to the start */
            c.off += ENTRY_HEADER_BYTES + len;
            c.entry++;
            continue;
        }
        const uint8_t *payload = c.seg->map + c.off + ENTRY_HEADER_BYTES;
        uint64_t out_len = len;
        int compressed = (lf & ENTRY_FLAG_ZSTD) != 0;
        if (compressed) {
            int64_t size = codec_frame_size(payload, len);
            if (size < 0) { /* checksummed but undecodable: skip it, counted */
                c.damaged++;
                c.skipped++;
                c.off += ENTRY_HEADER_BYTES + len;
                c.entry++;
                continue;
            }
            out_len = (uint64_t)size;
        }
        if (used + out_len + sep > cap || (n && used + out_len + sep > budget)) {
            if (n == 0) {
                res->needed_bytes = out_len + sep;
                cursor_drop(&c);
                res->next_entry = c.entry;
                return set_error(COMET_E_BUFFER_TOO_SMALL,
                                 "entry %" PRIu64 " needs %" PRIu64 " bytes; the buffer has %" PRIu64,
                                 c.entry, out_len, cap);
            }
            break;
        }
        if (compressed) {
            int64_t got = codec_decompress(req->data + used, out_len, payload, len);
            if (got != (int64_t)out_len) {
                c.damaged++;
                c.skipped++;
                c.off += ENTRY_HEADER_BYTES + len;
                c.entry++;
                continue;
            }
            res->compressed++;
        } else if (len) {
            memcpy(req->data + used, payload, len);
        }
        if (sep) {
            if (out_len && memchr(req->data + used, '\n', out_len))
                res->newline_payloads++;
            req->data[used + out_len] = '\n';
            out_len++;
        }
        int64_t ts = entry_timestamp(c.seg, c.off);
        req->entries[n] = (int64_t)c.entry;
        req->timestamps[n] = ts;
        used += out_len;
        n++;
        req->offsets[n] = (int32_t)used;
        c.off += ENTRY_HEADER_BYTES + len;
        c.entry++;
    }
done:
    cursor_drop(&c);
    if (c.err && n == 0) /* with entries read, they are returned; the next read meets the error */
        return c.err;
    res->count = n;
    res->data_bytes = used;
    res->next_entry = c.entry > from ? c.entry : from;
    res->skipped = c.skipped;
    if (c.damaged)
        sc_add(st, SC_CRC_FAILURES, c.damaged);
    if (c.skipped)
        sc_add(st, SC_SKIPPED_ENTRIES, c.skipped);
    return 0;
}

static int64_t find_time_in(shard *sh, int64_t ts);

int64_t comet_find_time(comet_stream *s, uint32_t shard_id, int64_t ts)
{
    shard *sh;
    int rc = shard_acquire(s, shard_id, &sh);
    if (rc)
        return rc;
    int64_t answer = find_time_in(sh, ts);
    shard_leave(sh);
    return answer;
}

static int64_t find_time_in(shard *sh, int64_t ts)
{
    int rc;
    uint64_t limit = atomic_load_explicit(&sh->st->next_entry, memory_order_acquire);
    uint64_t *bases;
    size_t n;
    rc = shard_segment_bases(sh, &bases, &n);
    if (rc)
        return rc;
    /* Segments from the newest whose first entry is older than ts. */
    size_t i = n;
    while (i > 0) {
        segment *seg;
        if ((rc = shard_segment_get(sh, bases[i - 1], &seg))) {
            free(bases);
            return rc;
        }
        int64_t first_ts = entry_timestamp(seg, SEGMENT_DATA_OFFSET);
        shard_segment_release(sh, seg);
        i--;
        if (first_ts < ts)
            break;
    }
    uint64_t answer = limit;
    cursor c = {.sh = sh, .limit = limit};
    for (; i < n && answer == limit; i++) {
        segment *seg;
        if ((rc = shard_segment_get(sh, bases[i], &seg))) {
            free(bases);
            return rc;
        }
        uint64_t rel, off;
        index_lookup_time(seg, ts, &rel, &off);
        uint64_t start = seg->base + rel;
        shard_segment_release(sh, seg);
        if (start >= limit)
            break;
        c.entry = start;
        if (!cursor_seek(&c, start)) {
            if (c.err) {
                free(bases);
                return c.err;
            }
            continue;
        }
        int64_t lf;
        uint64_t seg_end = c.seg_end;
        while ((lf = cursor_next(&c, start)) >= 0 && c.entry < seg_end) {
            int64_t ets = entry_timestamp(c.seg, c.off);
            if (c.entry >= start && ets >= ts) {
                answer = c.entry;
                break;
            }
            c.off += ENTRY_HEADER_BYTES + ((uint32_t)lf & ENTRY_LEN_MASK);
            c.entry++;
        }
        cursor_drop(&c);
        if (c.err) {
            free(bases);
            return c.err;
        }
    }
    free(bases);
    return (int64_t)answer;
}
