/*
 * batch.c - the public append entry points.  Each turns its input into one
 * array of entry references (pointer, length, flags), checks every limit
 * before anything is locked or written, and hands the batch to append.c.
 *
 * Five shapes, so that callers cross into C once per batch:
 *   - one entry;
 *   - one buffer plus an array of lengths (and optional per-entry flags);
 *   - an array of (pointer, length) pairs: the Python API's list of bytes,
 *     gathered by storage_c/_fastpath.c without copying a payload;
 *   - one buffer plus a delimiter (NDJSON: one entry per line);
 *   - a JSON or NDJSON request body (comet_ingest): codec/json.c validates and
 *     splits it, large events are compressed here, then one batch.
 *
 * max_entry_bytes bounds an entry as the caller gave it: a compressed entry
 * by its content size, an ingested event by its bytes as sent.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec/codec.h"
#include "log.h"

#define STACK_REFS 64

typedef struct batch {
    entry_ref *refs;
    entry_ref local[STACK_REFS];
    uint32_t count, cap;
    uint32_t compressed; /* entries flagged COMET_ENTRY_COMPRESSED */
    uint64_t total;      /* bytes on disk, headers included */
    uint64_t raw;        /* payload bytes before compression */
} batch;

static void batch_init(batch *b)
{
    b->refs = b->local;
    b->count = 0;
    b->cap = STACK_REFS;
    b->compressed = 0;
    b->total = 0;
    b->raw = 0;
}

static void batch_free(batch *b)
{
    if (b->refs != b->local)
        free(b->refs);
}

static int batch_reserve(batch *b, uint64_t n)
{
    if (n > UINT32_MAX / 2)
        return set_error(COMET_E_BATCH_TOO_LARGE, "batch of %" PRIu64 " entries is too large", n);
    if (n <= b->cap)
        return 0;
    entry_ref *r = sys_malloc(n * sizeof *r);
    if (!r)
        return set_error(COMET_E_NOMEM, "out of memory for a batch of %" PRIu64 " entries", n);
    memcpy(r, b->refs, b->count * sizeof *r);
    batch_free(b);
    b->refs = r;
    b->cap = (uint32_t)n;
    return 0;
}

/* The size an entry had as the caller gave it: a compressed entry is checked
 * against max_entry_bytes by its content size, never by its stored size. */
static int entry_raw_size(const comet_stream *s, const uint8_t *p, uint64_t len, uint32_t flags,
                          uint32_t index, uint64_t *raw)
{
    uint32_t max = s->db->cfg.max_entry_bytes;
    *raw = len;
    if (flags & COMET_ENTRY_COMPRESSED) {
        int64_t n = compress_frame_size(p, (size_t)len);
        if (n < 0)
            return set_error(COMET_E_INVALID, "entry %u is flagged compressed but is not a zstd "
                             "frame that records its content size", index);
        *raw = (uint64_t)n;
    }
    if (*raw > max || len > max)
        return set_error(COMET_E_ENTRY_TOO_LARGE,
                         "entry %u of the batch is %" PRIu64 " bytes; max_entry_bytes is %u",
                         index, *raw > len ? *raw : len, max);
    return 0;
}

static int batch_add(batch *b, const comet_stream *s, const uint8_t *p, uint64_t len,
                     uint32_t flags)
{
    uint64_t raw;
    int rc = entry_raw_size(s, p, len, flags, b->count, &raw);
    if (rc)
        return rc;
    if (b->count == b->cap && batch_reserve(b, (uint64_t)b->cap * 2))
        return COMET_E_NOMEM;
    b->refs[b->count++] = (entry_ref){p, (uint32_t)len, flags};
    b->compressed += (flags & COMET_ENTRY_COMPRESSED) != 0;
    b->total += ENTRY_HEADER_BYTES + len;
    b->raw += raw;
    return 0;
}

static int64_t batch_commit(batch *b, comet_stream *s, uint32_t shard_id, int durability,
                            int mode, const comet_idempotency *idem, uint32_t *replayed)
{
    if (b->count == 0)
        return set_error(COMET_E_INVALID, "empty batch: nothing to append");
    if (b->total > COMET_MAX_BATCH_BYTES)
        return set_error(COMET_E_BATCH_TOO_LARGE, "batch of %" PRIu64 " bytes is above %" PRIu64,
                         b->total, (uint64_t)COMET_MAX_BATCH_BYTES);
    shard *sh;
    int rc = shard_acquire_to_append(s, shard_id, mode, &sh);
    if (rc)
        return rc;
    entry_batch e = {b->refs, b->count, b->compressed, b->total, b->raw};
    int64_t r = shard_append(sh, &e, durability, mode, idem, replayed);
    shard_leave(sh);
    return r;
}

static int target_error(const comet_stream *s, uint32_t shard_id, int durability, int mode)
{
    int rc = stream_check_shard(s, shard_id);
    if (rc)
        return rc;
    if (durability < COMET_DURABILITY_DEFAULT || durability > COMET_DURABILITY_ALWAYS)
        return set_error(COMET_E_INVALID, "durability %d is not one of -1, 0, 1, 2", durability);
    return set_error(COMET_E_INVALID, "mode %d is not COMET_APPEND_WAIT (0) or "
                     "COMET_APPEND_NOWAIT (1)", mode);
}

/* Checked before any payload is looked at, so that a bad shard is reported
 * as such rather than as a side effect of the batch.  Inline: a single
 * append is a few hundred instructions, and this runs in every one. */
static inline int check_target(const comet_stream *s, uint32_t shard_id, int durability,
                               int mode)
{
    if (!s || shard_id >= s->shard_count || durability < COMET_DURABILITY_DEFAULT ||
        durability > COMET_DURABILITY_ALWAYS ||
        (mode != COMET_APPEND_WAIT && mode != COMET_APPEND_NOWAIT))
        return target_error(s, shard_id, durability, mode);
    return 0;
}

int64_t comet_append(comet_stream *s, uint32_t shard_id, const void *payload, uint32_t len,
                     uint32_t flags, int durability, int mode)
{
    int rc = check_target(s, shard_id, durability, mode);
    if (rc)
        return rc;
    if (!payload && len)
        return set_error(COMET_E_INVALID, "null payload");
    entry_ref r = {payload, len, flags & COMET_ENTRY_COMPRESSED};
    entry_batch b = {&r, 1, r.flags != 0, ENTRY_HEADER_BYTES + (uint64_t)len, 0};
    if ((rc = entry_raw_size(s, payload, len, r.flags, 0, &b.raw)))
        return rc;
    shard *sh;
    if ((rc = shard_acquire_to_append(s, shard_id, mode, &sh)))
        return rc;
    int64_t first = shard_append(sh, &b, durability, mode, NULL, NULL);
    shard_leave(sh);
    return first;
}

int64_t comet_append_batch(comet_stream *s, uint32_t shard_id, const void *buf,
                           const uint32_t *lens, const uint8_t *flags, uint32_t count,
                           int durability, int mode)
{
    int rc = check_target(s, shard_id, durability, mode);
    if (rc)
        return rc;
    if (count && (!lens || !buf))
        return set_error(COMET_E_INVALID, "null buffer or lengths");
    batch b;
    batch_init(&b);
    rc = batch_reserve(&b, count);
    const uint8_t *p = buf;
    for (uint32_t i = 0; !rc && i < count; i++) {
        rc = batch_add(&b, s, p, lens[i], flags ? (flags[i] & COMET_ENTRY_COMPRESSED) : 0);
        p += lens[i];
    }
    int64_t r = rc ? rc : batch_commit(&b, s, shard_id, durability, mode, NULL, NULL);
    batch_free(&b);
    return r;
}

/* Why item i of a vector is refused: null data, above the raw limit, or
 * above max_entry_bytes, in that order. */
static int item_error(const comet_stream *s, const comet_payload *item, uint32_t i,
                      uint32_t raw_limit)
{
    if (!item->data && item->len)
        return set_error(COMET_E_INVALID, "item %u: null data", i);
    if (raw_limit && item->len > raw_limit)
        return set_error(COMET_E_WANTS_COMPRESSION, "item %u is %" PRIu64
                         " bytes, above the raw limit %u", i, item->len, raw_limit);
    uint64_t raw;
    return entry_raw_size(s, item->data, item->len, 0, i, &raw);
}

int64_t comet_append_vector(comet_stream *s, uint32_t shard_id, const comet_payload *items,
                            uint32_t count, uint32_t raw_limit, int durability, int mode)
{
    int rc = check_target(s, shard_id, durability, mode);
    if (rc)
        return rc;
    if (count && !items)
        return set_error(COMET_E_INVALID, "null items");
    batch b;
    batch_init(&b);
    rc = batch_reserve(&b, count);
    /* Items carry no flags (nothing compressed to measure): one bound per
     * item, the sums once, the refusal's wording from item_error. */
    uint64_t limit = s->db->cfg.max_entry_bytes, sum = 0;
    if (raw_limit && raw_limit < limit)
        limit = raw_limit;
    for (uint32_t i = 0; !rc && i < count; i++) {
        uint64_t n = items[i].len;
        if (n > limit || (!items[i].data && n))
            rc = item_error(s, &items[i], i, raw_limit);
        b.refs[i] = (entry_ref){items[i].data, (uint32_t)n, 0};
        sum += n;
    }
    if (!rc) {
        b.count = count;
        b.total = sum + (uint64_t)count * ENTRY_HEADER_BYTES;
        b.raw = sum;
    }
    int64_t r = rc ? rc : batch_commit(&b, s, shard_id, durability, mode, NULL, NULL);
    batch_free(&b);
    return r;
}

int64_t comet_append_delimited(comet_stream *s, uint32_t shard_id, const void *buf, size_t len,
                               uint8_t delimiter, int skip_empty, uint32_t raw_limit,
                               int durability, int mode, uint32_t *count_out)
{
    int rc = check_target(s, shard_id, durability, mode);
    if (rc)
        return rc;
    if (!buf && len)
        return set_error(COMET_E_INVALID, "null buffer");
    batch b;
    batch_init(&b);
    const uint8_t *p = buf, *end = p + len;
    uint64_t line = 0;
    while (!rc && p < end) {
        const uint8_t *stop = memchr(p, delimiter, (size_t)(end - p));
        if (!stop)
            stop = end;
        uint64_t n = (uint64_t)(stop - p);
        line++;
        if (n || !skip_empty) {
            if (raw_limit && n > raw_limit)
                rc = set_error(COMET_E_WANTS_COMPRESSION, "record %" PRIu64 " is %" PRIu64
                               " bytes, above the raw limit %u", line, n, raw_limit);
            else if ((rc = batch_add(&b, s, p, n, 0)) == COMET_E_ENTRY_TOO_LARGE)
                rc = set_error(rc, "record %" PRIu64 " is %" PRIu64 " bytes; max_entry_bytes is %u",
                               line, n, s->db->cfg.max_entry_bytes);
        }
        p = stop + 1;
    }
    int64_t r = rc ? rc : batch_commit(&b, s, shard_id, durability, mode, NULL, NULL);
    if (count_out)
        *count_out = r >= 0 ? b.count : 0;
    batch_free(&b);
    return r;
}

/* ---- JSON ingest ------------------------------------------------------------ */

typedef struct ingest_ctx {
    batch b;
    const comet_stream *s;
    uint32_t compress_above;
    int level;
    uint8_t **packed;       /* compressed copies, freed after the commit */
    uint32_t packed_count, packed_cap;
} ingest_ctx;

static int ingest_emit(void *arg, const uint8_t *event, uint32_t len, uint64_t index)
{
    (void)index;
    ingest_ctx *c = arg;
    if (c->compress_above && len > c->compress_above) {
        if (c->packed_count == c->packed_cap) {
            uint32_t cap = c->packed_cap ? c->packed_cap * 2 : 8;
            uint8_t **grown = sys_realloc(c->packed, cap * sizeof *grown);
            if (!grown)
                return set_error(COMET_E_NOMEM, "out of memory for compressed events");
            c->packed = grown;
            c->packed_cap = cap;
        }
        size_t cap = compress_bound(len);
        uint8_t *dst = sys_malloc(cap);
        if (!dst)
            return set_error(COMET_E_NOMEM, "out of memory compressing a %u-byte event", len);
        c->packed[c->packed_count++] = dst;
        int64_t n = compress_frame(dst, cap, event, len, c->level);
        if (n < 0)
            return (int)n;
        if ((uint64_t)n < len)
            return batch_add(&c->b, c->s, dst, (uint64_t)n, COMET_ENTRY_COMPRESSED);
    }
    return batch_add(&c->b, c->s, event, len, 0);
}

static void ingest_result(comet_ingest_result *res, const json_splitter *j, int64_t first,
                          uint32_t count, uint32_t replayed)
{
    if (!res)
        return;
    res->first = first >= 0 ? first : -1;
    res->count = first < 0 ? 0 : replayed ? replayed : count;
    res->replayed = first >= 0 && replayed;
    json_report(j, res);
}

/* The events of a body stored unchecked: one per line that is not blank
 * (COMET_BODY_LINES; a "\r" before the "\n" dropped), or the whole body
 * (COMET_BODY_RAW).  A fault is reported like json_split's. */
static int split_unchecked(json_splitter *j, const uint8_t *body, size_t len, uint32_t format,
                           uint32_t max_entry_bytes, ingest_ctx *c)
{
    memset(j, 0, sizeof *j);
    j->body = body;
    j->end = body + len;
    j->index = COMET_NO_INDEX;
    const uint8_t *p = body, *end = body + len;
    while (p < end) {
        const uint8_t *stop = format == COMET_BODY_RAW ? end : memchr(p, '\n', (size_t)(end - p));
        if (!stop)
            stop = end;
        const uint8_t *e = stop;
        if (format == COMET_BODY_LINES && e > p && e[-1] == '\r')
            e--;
        uint64_t n = (uint64_t)(e - p);
        if (n > 0) {
            if (max_entry_bytes && n > max_entry_bytes) {
                j->index = j->count;
                j->fault = p;
                snprintf(j->reason, sizeof j->reason, "event of %" PRIu64
                         " bytes is above max_entry_bytes (%u)", n, max_entry_bytes);
                return j->code = COMET_E_ENTRY_TOO_LARGE;
            }
            int rc = ingest_emit(c, p, (uint32_t)n, j->count);
            if (rc)
                return j->code = rc;
            j->count++;
        }
        p = stop + 1;
    }
    if (j->count == 0) {
        j->fault = body;
        snprintf(j->reason, sizeof j->reason, "the body holds no event");
        return j->code = COMET_E_NO_EVENTS;
    }
    return 0;
}

int64_t comet_ingest(comet_stream *s, uint32_t shard_id, const comet_ingest_request *req,
                     comet_ingest_result *res)
{
    json_splitter j;
    memset(&j, 0, sizeof j);
    if (!req || (!req->body && req->len)) {
        ingest_result(res, &j, -1, 0, 0);
        return set_error(COMET_E_INVALID, "null request or body");
    }
    int rc = check_target(s, shard_id, req->durability, req->mode);
    if (rc) {
        ingest_result(res, &j, -1, 0, 0);
        return rc;
    }
    const comet_idempotency *idem = req->idempotency;
    if (idem && idem->window_ms <= 0) {
        ingest_result(res, &j, -1, 0, 0);
        return set_error(COMET_E_INVALID, "an idempotency window must be positive");
    }
    ingest_ctx c = {.s = s, .compress_above = req->compress_above, .level = req->compress_level};
    batch_init(&c.b);
    uint32_t max = s->db->cfg.max_entry_bytes;
    if (req->format == COMET_BODY_LINES || req->format == COMET_BODY_RAW)
        rc = split_unchecked(&j, req->body, req->len, req->format, max, &c);
    else
        rc = json_split(&j, req->body, req->len, req->format, max, ingest_emit, &c);
    int64_t r;
    uint32_t replayed = 0;
    if (rc) {
        r = rc == COMET_E_BAD_JSON || rc == COMET_E_ENTRY_TOO_LARGE || rc == COMET_E_NO_EVENTS
                ? set_error(rc, "%s", j.reason) : rc;
    } else {
        r = batch_commit(&c.b, s, shard_id, req->durability, req->mode, idem, &replayed);
    }
    ingest_result(res, &j, r, c.b.count, replayed);
    for (uint32_t i = 0; i < c.packed_count; i++)
        free(c.packed[i]);
    free(c.packed);
    batch_free(&c.b);
    json_split_free(&j);
    return r;
}

typedef struct split_ctx {
    uint8_t *out;
    size_t cap, used;
    uint32_t *lens;
    uint32_t lens_cap;
} split_ctx;

static int split_emit(void *arg, const uint8_t *event, uint32_t len, uint64_t index)
{
    split_ctx *c = arg;
    if (index >= c->lens_cap || c->cap - c->used < len)
        return set_error(COMET_E_BUFFER_TOO_SMALL, "more events than the output buffers hold");
    memcpy(c->out + c->used, event, len);
    c->used += len;
    c->lens[index] = len;
    return 0;
}

int64_t comet_json_split(const comet_ingest_request *req, uint32_t max_entry_bytes,
                         uint8_t *out, size_t out_cap, uint32_t *lens, uint32_t lens_cap,
                         comet_ingest_result *res)
{
    json_splitter j;
    memset(&j, 0, sizeof j);
    if (!req || (!req->body && req->len) || (!out && out_cap) || (!lens && lens_cap)) {
        ingest_result(res, &j, -1, 0, 0);
        return set_error(COMET_E_INVALID, "null request or buffer");
    }
    split_ctx c = {out, out_cap, 0, lens, lens_cap};
    int rc = json_split(&j, req->body, req->len, req->format, max_entry_bytes, split_emit, &c);
    int64_t r = rc == 0 ? (int64_t)j.count
                : rc == COMET_E_BAD_JSON || rc == COMET_E_ENTRY_TOO_LARGE || rc == COMET_E_NO_EVENTS
                    ? set_error(rc, "%s", j.reason) : rc;
    ingest_result(res, &j, r >= 0 ? 0 : r, (uint32_t)j.count, 0);
    json_split_free(&j);
    return r;
}
