/*
 * append.c - the public append entry points.  Each turns its input into one
 * array of entry references (pointer, length, flags), checks every limit
 * before anything is locked or written, and hands the batch to shard.c.
 *
 * Three shapes, so that callers cross into C once per batch:
 *   - one buffer plus an array of lengths (and optional per-entry flags);
 *   - one buffer plus a delimiter (NDJSON: one entry per line);
 *   - a Python list of bytes framed by marshal: '[' u32 n, then per item
 *     's' u32 len + bytes.  marshal.dumps() produces this at memcpy speed,
 *     which spares Python a per-item loop to collect lengths.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"
#include "internal.h"

#define STACK_REFS 64

typedef struct batch {
    entry_ref *refs;
    entry_ref local[STACK_REFS];
    uint32_t count, cap;
    uint64_t total; /* bytes on disk, headers included */
    uint64_t raw;   /* payload bytes before compression */
} batch;

static void batch_init(batch *b)
{
    b->refs = b->local;
    b->count = 0;
    b->cap = STACK_REFS;
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
    entry_ref *r = malloc(n * sizeof *r);
    if (!r)
        return set_error(COMET_E_NOMEM, "out of memory for a batch of %" PRIu64 " entries", n);
    memcpy(r, b->refs, b->count * sizeof *r);
    batch_free(b);
    b->refs = r;
    b->cap = (uint32_t)n;
    return 0;
}

static int batch_add(batch *b, const comet_stream *s, const uint8_t *p, uint64_t len,
                     uint32_t flags)
{
    uint32_t max = s->db->cfg.max_entry_bytes;
    if (len > max)
        return set_error(COMET_E_ENTRY_TOO_LARGE,
                         "entry %u of the batch is %" PRIu64 " bytes; max_entry_bytes is %u",
                         b->count, len, max);
    if (b->count == b->cap && batch_reserve(b, (uint64_t)b->cap * 2))
        return COMET_E_NOMEM;
    b->refs[b->count++] = (entry_ref){p, (uint32_t)len, flags};
    b->total += ENTRY_HEADER_BYTES + len;
    if (flags & COMET_ENTRY_COMPRESSED) {
        int64_t raw = codec_frame_size(p, (size_t)len);
        b->raw += raw > 0 ? (uint64_t)raw : len;
    } else {
        b->raw += len;
    }
    return 0;
}

static int64_t batch_commit(batch *b, comet_stream *s, uint32_t shard_id, int durability)
{
    if (b->count == 0)
        return set_error(COMET_E_INVALID, "empty batch: nothing to append");
    if (b->total > COMET_MAX_BATCH_BYTES)
        return set_error(COMET_E_BATCH_TOO_LARGE, "batch of %" PRIu64 " bytes is above %" PRIu64,
                         b->total, (uint64_t)COMET_MAX_BATCH_BYTES);
    shard *sh;
    int rc = shard_acquire(s, shard_id, &sh);
    if (rc)
        return rc;
    int64_t r = shard_append(sh, b->refs, b->count, b->total, b->raw, durability);
    shard_leave(sh);
    return r;
}

/* Checked before any payload is looked at, so that a bad shard is reported
 * as such rather than as a side effect of the batch. */
static int check_target(const comet_stream *s, uint32_t shard_id, int durability)
{
    int rc = stream_check_shard(s, shard_id);
    if (rc)
        return rc;
    if (durability < COMET_DURABILITY_DEFAULT || durability > COMET_DURABILITY_ALWAYS)
        return set_error(COMET_E_INVALID, "durability %d is not one of -1, 0, 1, 2", durability);
    return 0;
}

int64_t comet_append(comet_stream *s, uint32_t shard_id, const void *payload, uint32_t len,
                     uint32_t flags, int durability)
{
    int rc = check_target(s, shard_id, durability);
    if (rc)
        return rc;
    if (!payload && len)
        return set_error(COMET_E_INVALID, "null payload");
    if (len > s->db->cfg.max_entry_bytes)
        return set_error(COMET_E_ENTRY_TOO_LARGE, "entry is %u bytes; max_entry_bytes is %u", len,
                         s->db->cfg.max_entry_bytes);
    shard *sh;
    rc = shard_acquire(s, shard_id, &sh);
    if (rc)
        return rc;
    entry_ref r = {payload, len, flags & COMET_ENTRY_COMPRESSED};
    uint64_t raw = len;
    if (r.flags) {
        int64_t n = codec_frame_size(payload, len);
        raw = n > 0 ? (uint64_t)n : len;
    }
    int64_t first = shard_append(sh, &r, 1, ENTRY_HEADER_BYTES + (uint64_t)len, raw, durability);
    shard_leave(sh);
    return first;
}

int comet_shard_open(comet_stream *s, uint32_t shard_id, comet_shard **out)
{
    int rc = check_target(s, shard_id, COMET_DURABILITY_DEFAULT);
    if (rc)
        return rc;
    if (!out)
        return set_error(COMET_E_INVALID, "null output");
    rc = shard_acquire(s, shard_id, out);
    if (rc == 0)
        shard_leave(*out);
    return rc;
}

int64_t comet_append_to(comet_shard *sh, const char *payload, uint32_t len)
{
    uint32_t max = sh->stream->db->cfg.max_entry_bytes;
    if (len > max)
        return set_error(COMET_E_ENTRY_TOO_LARGE, "entry is %u bytes; max_entry_bytes is %u", len,
                         max);
    if (!payload && len)
        return set_error(COMET_E_INVALID, "null payload");
    int rc = shard_enter(sh);
    if (rc)
        return rc;
    entry_ref r = {(const uint8_t *)payload, len, 0};
    int64_t first = shard_append(sh, &r, 1, ENTRY_HEADER_BYTES + (uint64_t)len, len,
                                 COMET_DURABILITY_DEFAULT);
    shard_leave(sh);
    return first;
}

int64_t comet_append_batch(comet_stream *s, uint32_t shard_id, const void *buf,
                           const uint32_t *lens, const uint8_t *flags, uint32_t count,
                           int durability)
{
    int rc = check_target(s, shard_id, durability);
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
    int64_t r = rc ? rc : batch_commit(&b, s, shard_id, durability);
    batch_free(&b);
    return r;
}

int64_t comet_append_delimited(comet_stream *s, uint32_t shard_id, const void *buf, size_t len,
                               uint8_t delimiter, int skip_empty, uint32_t raw_limit,
                               int durability, uint32_t *count_out)
{
    int rc = check_target(s, shard_id, durability);
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
    int64_t r = rc ? rc : batch_commit(&b, s, shard_id, durability);
    if (count_out)
        *count_out = r >= 0 ? b.count : 0;
    batch_free(&b);
    return r;
}

static uint32_t le32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

int64_t comet_append_marshal(comet_stream *s, uint32_t shard_id, const void *buf, size_t len,
                             uint32_t raw_limit, int durability, uint32_t *count_out)
{
    int rc = check_target(s, shard_id, durability);
    if (rc)
        return rc;
    const uint8_t *p = buf, *end = p + len;
    if (!buf || len < 5 || ((p[0] & 0x7F) != '[' && (p[0] & 0x7F) != '('))
        return set_error(COMET_E_BAD_FRAMING, "not a marshalled list of bytes");
    uint32_t n = le32(p + 1);
    if (n > len / 5)
        return set_error(COMET_E_BAD_FRAMING, "marshalled list claims %u items in %zu bytes", n, len);
    p += 5;
    batch b;
    batch_init(&b);
    rc = batch_reserve(&b, n);
    for (uint32_t i = 0; !rc && i < n; i++) {
        if (end - p < 5 || (p[0] & 0x7F) != 's') {
            rc = set_error(COMET_E_BAD_FRAMING, "item %u is not a bytes object", i);
            break;
        }
        uint32_t L = le32(p + 1);
        p += 5;
        if (L > (uint64_t)(end - p)) {
            rc = set_error(COMET_E_BAD_FRAMING, "item %u runs past the end of the buffer", i);
            break;
        }
        if (raw_limit && L > raw_limit)
            rc = set_error(COMET_E_WANTS_COMPRESSION, "item %u is %u bytes, above the raw limit %u",
                           i, L, raw_limit);
        else
            rc = batch_add(&b, s, p, L, 0);
        p += L;
    }
    if (!rc && p != end)
        rc = set_error(COMET_E_BAD_FRAMING, "%zu bytes after the last item", (size_t)(end - p));
    int64_t r = rc ? rc : batch_commit(&b, s, shard_id, durability);
    if (count_out)
        *count_out = r >= 0 ? b.count : 0;
    batch_free(&b);
    return r;
}
