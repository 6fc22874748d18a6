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
 *
 * The only lock a read takes is the process-local cache_lock, for the moment
 * a segment is looked up or released; the shard stays mapped because the
 * read is counted in its users (shard_acquire), which comet_close and stream
 * deletion wait for.  A cursor (cursor.c) walks entries that check out in
 * the shared mappings; here read_out / put_entry fill the caller's buffers,
 * decompressing; read_entered joins the two for comet_read, find_time_in
 * for comet_find_time.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "cursor.h"
#include "stream.h"

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

static int read_entered(shard *sh, const comet_read_request *req, comet_read_result *res);

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
        rc = read_entered(sh, req, res);
    shard_leave(sh);
    return rc;
}

/* ---- one read: the caller's buffers --------------------------------------- */

/* Where the entries of one read go: req's buffers, filled up to n and used. */
typedef struct read_out {
    const comet_read_request *req;
    comet_read_result *res;
    uint64_t cap;    /* data_capacity: a hard limit */
    uint64_t budget; /* max_bytes (at most cap): a limit once one entry is in */
    uint64_t sep;    /* 1 with COMET_READ_NEWLINES: a '\n' follows each payload */
    uint32_t n;      /* entries written */
    uint64_t used;   /* data bytes written */
    uint64_t need;   /* after PUT_FULL: the bytes the entry needs */
} read_out;

/* What became of one entry (put_entry). */
enum { PUT_DONE, PUT_SKIPPED, PUT_FULL };

static read_out read_out_init(const comet_read_request *req, comet_read_result *res)
{
    uint64_t cap = req->data_capacity;
    read_out out = {.req = req, .res = res, .cap = cap};
    out.budget = req->max_bytes && req->max_bytes < cap ? req->max_bytes : cap;
    out.sep = (req->flags & COMET_READ_NEWLINES) ? 1 : 0;
    return out;
}

/* Bytes of the payload once decoded, -1 when a compressed one does not say. */
static int64_t decoded_size(const uint8_t *payload, uint32_t lf)
{
    uint32_t len = lf & ENTRY_LEN_MASK;
    return (lf & ENTRY_FLAG_ZSTD) ? compress_frame_size(payload, len) : (int64_t)len;
}

/* Writes the payload at dst, decompressed to its size bytes: 1, or 0 when it
 * does not decompress to exactly that. */
static int copy_payload(uint8_t *dst, const uint8_t *payload, uint32_t lf, uint64_t size,
                        comet_read_result *res)
{
    uint32_t len = lf & ENTRY_LEN_MASK;
    if (lf & ENTRY_FLAG_ZSTD) {
        if (decompress_frame(dst, size, payload, len) != (int64_t)size)
            return 0;
        res->compressed++;
    } else if (len) {
        memcpy(dst, payload, len);
    }
    return 1;
}

/* Puts the entry at the cursor (len_flags lf) into the buffers: PUT_DONE;
 * PUT_SKIPPED when it checked out but does not decode; PUT_FULL when it does
 * not fit (out->need set). */
static int put_entry(read_out *out, const cursor *c, uint32_t lf)
{
    const comet_read_request *req = out->req;
    const uint8_t *payload = c->seg->map + c->off + ENTRY_HEADER_BYTES;
    int64_t size = decoded_size(payload, lf);
    if (size < 0)
        return PUT_SKIPPED;
    uint64_t need = (uint64_t)size + out->sep;
    if (out->used + need > out->cap || (out->n && out->used + need > out->budget)) {
        out->need = need;
        return PUT_FULL;
    }
    uint8_t *dst = req->data + out->used;
    if (!copy_payload(dst, payload, lf, (uint64_t)size, out->res))
        return PUT_SKIPPED;
    if (out->sep) {
        if (size && memchr(dst, '\n', (size_t)size))
            out->res->newline_payloads++;
        dst[size] = '\n';
    }
    req->entries[out->n] = (int64_t)c->entry;
    req->timestamps[out->n] = entry_timestamp(c->seg, c->off);
    out->used += need;
    out->n++;
    req->offsets[out->n] = (int32_t)out->used;
    return PUT_DONE;
}

/* Reads entries from the cursor (positioned at or before from) until
 * max_entries, the limit or a full buffer: returns 1 when it stopped at an
 * entry that does not fit (the cursor stays on it), else 0. */
static int read_entries(cursor *c, read_out *out, uint64_t from)
{
    uint32_t lf;
    while (out->n < out->req->max_entries && cursor_next(c, from, &lf)) {
        if (c->entry >= from) { /* below from: walking from the index record */
            int put = put_entry(out, c, lf);
            if (put == PUT_FULL)
                return 1;
            if (put == PUT_SKIPPED) { /* checksummed but undecodable: skipped, counted */
                c->damaged++;
                c->skipped++;
            }
        }
        cursor_step(c, lf);
    }
    return 0;
}

/* The first entry does not fit the buffer at all: the caller learns its size. */
static int report_too_small(cursor *c, const read_out *out)
{
    cursor_drop(c);
    out->res->needed_bytes = out->need;
    out->res->next_entry = c->entry;
    return set_error(COMET_E_BUFFER_TOO_SMALL,
                     "entry %" PRIu64 " needs %" PRIu64 " bytes; the buffer has %" PRIu64,
                     c->entry, out->need - out->sep, out->cap);
}

/* Fills the result and counts what the cursor skipped. */
static int finish_read(cursor *c, const read_out *out, uint64_t from)
{
    cursor_drop(c);
    if (c->err && out->n == 0) /* entries read are returned: the next read meets the error */
        return c->err;
    comet_read_result *res = out->res;
    res->count = out->n;
    res->data_bytes = out->used;
    res->next_entry = c->entry > from ? c->entry : from;
    res->skipped = c->skipped;
    if (c->damaged)
        sc_add(c->sh->st, SC_CRC_FAILURES, c->damaged);
    if (c->skipped)
        sc_add(c->sh->st, SC_SKIPPED_ENTRIES, c->skipped);
    return 0;
}

/* comet_read inside the shard (shard_acquire counted this thread in its
 * users, so comet_close and a stream deletion leave its mappings alone).  No
 * shard lock is taken: the append lock never, the commit point is loaded with
 * acquire; only the process-local cache_lock is held for moments, inside the
 * segment lookups (shard_segment_for, shard_segment_release). */
static int read_entered(shard *sh, const comet_read_request *req, comet_read_result *res)
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
    /* Retention in another process may delete a segment this read copies
     * from, and recycle.c may then reuse its file: what was copied could be
     * the new segment's bytes.  first_entry moves past a deleted segment
     * before its file can be reused, so once the entries are copied, any
     * below first_entry are not trusted: the read is done again from there,
     * counting them as skipped (as if retention had won the race). */
    uint64_t start = from;
    for (int attempt = 0;; attempt++) {
        read_out out = read_out_init(req, res);
        cursor c = {.sh = sh, .limit = limit, .entry = start, .skipped = start - from};
        int full = cursor_seek(&c, start) && read_entries(&c, &out, start);
        /* An RMW that changes nothing: its release half keeps the copies
         * above from moving past this load (a plain acquire load would not). */
        uint64_t first = atomic_fetch_add_explicit(&st->first_entry, 0, memory_order_acq_rel);
        if (out.n && (uint64_t)req->entries[0] < first) {
            cursor_drop(&c);
            start = first < limit ? first : limit;
            if (attempt < 8 && start < limit)
                continue;
            out.n = 0; /* retention keeps overtaking this read: nothing returned */
            out.used = 0;
            c.entry = start;
            c.skipped = start - from;
            full = 0;
        }
        if (full && out.n == 0)
            return report_too_small(&c, &out);
        return finish_read(&c, &out, from);
    }
}

static int64_t find_time_in(shard *sh, int64_t ts);

int64_t comet_entry_timestamp(comet_stream *s, uint32_t shard_id, uint64_t entry)
{
    shard *sh;
    int rc = shard_acquire(s, shard_id, &sh);
    if (rc)
        return rc;
    uint64_t first = atomic_load_explicit(&sh->st->first_entry, memory_order_acquire);
    uint32_t lf;
    int64_t ts = 0;
    rc = shard_entry_header(sh, entry < first ? first : entry, &lf, &ts);
    shard_leave(sh);
    if (rc < 0)
        return rc;
    return rc ? ts : 0;
}

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
        uint32_t lf;
        uint64_t seg_end = c.seg_end;
        while (cursor_next(&c, start, &lf) && c.entry < seg_end) {
            if (c.entry >= start && entry_timestamp(c.seg, c.off) >= ts) {
                answer = c.entry;
                break;
            }
            cursor_step(&c, lf);
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
