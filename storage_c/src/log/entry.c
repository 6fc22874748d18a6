/*
 * entry.c - writing one entry, checking one entry, and finding the next good
 * entry after a damaged one.
 *
 * The checksum covers the header fields after it and the payload, so a reader
 * that finds it right knows the length, the flags, the entry number and the
 * timestamp are those the writer wrote.  The entry number in the header lets a
 * reader tell a stale or misplaced entry from the one it expects, and gives
 * resynchronisation an exact count of what was skipped.
 */
#include <stddef.h>
#include <string.h>

#include "log.h"

/* The checksum register's starting value for an entry.  From segment version
 * 2 on it carries the high half of the entry number (the low half is in the
 * header), so the checksum covers the whole 64-bit number: an entry left in a
 * recycled segment file by its earlier life can never check out as the entry
 * expected at its place, whatever the numbers (FORMAT.md, Recycled segments).
 * A start value that differs changes the checksum of every message of the
 * same length, CRC being linear.  Version 1 starts from all ones. */
static inline uint32_t entry_seed(uint16_t version, uint64_t entry)
{
    uint32_t seed = 0xFFFFFFFFu;
    if (version >= 2)
        seed ^= (uint32_t)(entry >> 32);
    return seed;
}

static inline uint32_t entry_checksum(uint32_t seed, const uint8_t *fields16,
                                      const uint8_t *payload, uint32_t len)
{
    uint32_t reg = crc32c_extend(seed, fields16, 16);
    reg = crc32c_extend(reg, payload, len);
    return crc32c_mask(~reg);
}

/* The header's fields after the checksum, as they are stored. */
static inline void fields_fill(uint8_t fields[16], uint32_t len, uint32_t flags, uint64_t entry,
                               int64_t ts)
{
    uint32_t len_flags = len | flags;
    uint32_t entry_lo = (uint32_t)entry;
    memcpy(fields, &len_flags, 4);
    memcpy(fields + 4, &entry_lo, 4);
    memcpy(fields + 8, &ts, 8);
}

/* Copies one entry's fields and payload into place; returns where its
 * checksummed bytes (fields then payload, one run) start. */
static inline uint8_t *entry_place(uint8_t *dst, const uint8_t *payload, uint32_t len,
                                   uint32_t flags, uint64_t entry, int64_t ts)
{
    uint8_t fields[16];
    fields_fill(fields, len, flags, entry, ts);
    memcpy(dst + 4, fields, 16); /* one store: the checksum's loads of it are forwarded */
    if (len)
        memcpy(dst + ENTRY_HEADER_BYTES, payload, len);
    return dst + 4;
}

/* One entry: copied into place, then the stored bytes are checksummed
 * (still in the CPU's cache), and the checksum goes in front.  Copying first
 * and checksumming apart costs half of checksumming while copying 8 bytes at
 * a time, and what is checksummed is exactly what was stored. */
static void entry_write(uint8_t *dst, uint16_t version, const uint8_t *payload, uint32_t len,
                        uint32_t flags, uint64_t entry, int64_t ts)
{
    const uint8_t *sum = entry_place(dst, payload, len, flags, entry, ts);
    uint32_t reg = crc32c_extend(entry_seed(version, entry), sum, 16 + (size_t)len);
    uint32_t crc = crc32c_mask(~reg);
    memcpy(dst, &crc, 4);
}

/* Four entries the same way, their checksums as four interleaved chains
 * (sum4: the kernel, inlined where this is). */
static inline __attribute__((always_inline)) uint64_t
write_four_with(crc32c4_fn sum4, uint8_t *dst, uint16_t version, const entry_ref *refs,
                uint64_t entry, int64_t ts, const uint32_t flags[4])
{
    const uint8_t *sum[4];
    size_t n[4];
    uint32_t reg[4];
    uint64_t off = 0;
    for (int k = 0; k < 4; k++) {
        sum[k] = entry_place(dst + off, refs[k].data, refs[k].len, flags[k], entry + (uint64_t)k, ts);
        n[k] = 16 + (size_t)refs[k].len;
        reg[k] = entry_seed(version, entry + (uint64_t)k);
        off += ENTRY_HEADER_BYTES + refs[k].len;
    }
    sum4(reg, sum, n);
    for (int k = 0; k < 4; k++) {
        uint32_t crc = crc32c_mask(~reg[k]);
        memcpy((uint8_t *)sum[k] - 4, &crc, 4);
    }
    return off;
}

#ifdef CRC32C_HW_TARGET
CRC32C_HW_TARGET static uint64_t write_four_hw(uint8_t *dst, uint16_t version,
                                               const entry_ref *refs, uint64_t entry, int64_t ts,
                                               const uint32_t flags[4])
{
    return write_four_with(crc32c_hw_four, dst, version, refs, entry, ts, flags);
}
#endif

static uint64_t write_four(uint8_t *dst, uint16_t version, const entry_ref *refs, uint64_t entry,
                           int64_t ts, const uint32_t flags[4])
{
#ifdef CRC32C_HW_TARGET
    if (crc32c_hw_ok)
        return write_four_hw(dst, version, refs, entry, ts, flags);
#endif
    return write_four_with(crc32c_portable4, dst, version, refs, entry, ts, flags);
}

uint64_t entry_write_group(uint8_t *dst, uint16_t version, const entry_ref *refs, uint32_t k,
                           uint64_t entry, int64_t ts, const uint32_t *flags)
{
    if (k == 4)
        return write_four(dst, version, refs, entry, ts, flags);
    uint64_t off = 0;
    for (uint32_t i = 0; i < k; i++) {
        entry_write(dst + off, version, refs[i].data, refs[i].len, flags[i], entry + i, ts);
        off += ENTRY_HEADER_BYTES + refs[i].len;
    }
    return off;
}

static int header_is_zero(const uint8_t *p)
{
    uint64_t a, b;
    uint32_t c;
    memcpy(&a, p, 8);
    memcpy(&b, p + 8, 8);
    memcpy(&c, p + 16, 4);
    return (a | b | c) == 0;
}

int64_t entry_timestamp(const segment *seg, uint64_t off)
{
    int64_t ts;
    memcpy(&ts, seg->map + off + offsetof(entry_header, timestamp), sizeof ts);
    return ts;
}

uint32_t entry_len_flags(const segment *seg, uint64_t off)
{
    uint32_t v;
    memcpy(&v, seg->map + off + offsetof(entry_header, len_flags), sizeof v);
    return v;
}

uint32_t entry_number_low(const segment *seg, uint64_t off)
{
    uint32_t v;
    memcpy(&v, seg->map + off + offsetof(entry_header, entry_lo), sizeof v);
    return v;
}

entry_check entry_validate(const segment *seg, uint64_t off, uint64_t expect_entry,
                           uint32_t max_len, uint32_t *len_flags_out)
{
    if (off + ENTRY_HEADER_BYTES > seg->capacity)
        return ENTRY_END;
    const uint8_t *p = seg->map + off;
    if (header_is_zero(p))
        return ENTRY_END;
    uint32_t crc, len_flags = entry_len_flags(seg, off), entry_lo = entry_number_low(seg, off);
    memcpy(&crc, p + offsetof(entry_header, crc), 4);
    uint32_t len = len_flags & ENTRY_LEN_MASK;
    if ((len_flags & ENTRY_FLAGS_RESERVED) || len > max_len ||
        off + ENTRY_HEADER_BYTES + len > seg->capacity || entry_lo != (uint32_t)expect_entry)
        return ENTRY_BAD;
    if (entry_checksum(entry_seed(seg->version, expect_entry), p + offsetof(entry_header, len_flags),
                       p + ENTRY_HEADER_BYTES, len) != crc)
        return ENTRY_BAD;
    *len_flags_out = len_flags;
    return ENTRY_OK;
}

/* A cheap test before the checksum: flags, length and a number that fits the
 * distance from the damaged entry (each entry takes at least a header). */
static int plausible(const segment *seg, uint64_t p, uint64_t from_off, uint64_t expect,
                     uint32_t max_len, uint64_t *entry_out)
{
    uint32_t len_flags = entry_len_flags(seg, p), entry_lo = entry_number_low(seg, p);
    if (len_flags & ENTRY_FLAGS_RESERVED)
        return 0;
    uint32_t len = len_flags & ENTRY_LEN_MASK;
    if (len > max_len || p + ENTRY_HEADER_BYTES + len > seg->capacity)
        return 0;
    uint32_t delta = entry_lo - (uint32_t)expect;
    if (delta == 0 || delta > (p - from_off) / ENTRY_HEADER_BYTES + 1)
        return 0;
    *entry_out = expect + delta;
    return 1;
}

/* The first valid entry at a byte in [start, stop): 1 and its place, or 0. */
static int scan_bytes(const segment *seg, uint64_t from_off, uint64_t start, uint64_t stop,
                      uint64_t expect_entry, uint32_t max_len, uint64_t *found_off,
                      uint64_t *found_entry)
{
    uint32_t lf;
    for (uint64_t p = start; p < stop && p + ENTRY_HEADER_BYTES <= seg->capacity; p++) {
        uint64_t e;
        if (!plausible(seg, p, from_off, expect_entry, max_len, &e))
            continue;
        if (entry_validate(seg, p, e, max_len, &lf) == ENTRY_OK) {
            *found_off = p;
            *found_entry = e;
            return 1;
        }
    }
    return 0;
}

/* The order keeps the loss smallest and the cost bounded:
 *   1. the damaged entry's own length, if it leads to a good entry (only the
 *      payload was hit: exactly one entry lost);
 *   2. a byte scan up to the next sparse index record (at most one interval);
 *   3. the index records after it (each is checked before it is trusted);
 *   4. a byte scan of the rest, when the index is missing or wrong too. */
int entry_resync(const segment *seg, uint64_t off, uint64_t expect_entry, uint64_t limit,
                 uint32_t max_len, uint64_t *found_off, uint64_t *found_entry)
{
    uint32_t lf;
    if (limit > seg->capacity)
        limit = seg->capacity;
    if (off + ENTRY_HEADER_BYTES <= limit) {
        uint32_t len_flags = entry_len_flags(seg, off);
        uint64_t next = off + ENTRY_HEADER_BYTES + (len_flags & ENTRY_LEN_MASK);
        if (!(len_flags & ENTRY_FLAGS_RESERVED) && next < limit &&
            entry_validate(seg, next, expect_entry + 1, max_len, &lf) == ENTRY_OK) {
            *found_off = next;
            *found_entry = expect_entry + 1;
            return 1;
        }
    }
    uint32_t n = seg->index_ok ? atomic_load_explicit(index_count_ptr(seg), memory_order_acquire) : 0;
    const index_record *r = n ? index_records(seg) : NULL;
    uint32_t first = 0;
    while (first < n && (r[first].offset <= off || seg->base + r[first].rel_entry <= expect_entry))
        first++;
    uint64_t window = first < n && r[first].offset < limit ? r[first].offset : limit;
    if (scan_bytes(seg, off, off + 1, window, expect_entry, max_len, found_off, found_entry))
        return 1;
    for (uint32_t i = first; i < n && r[i].offset < limit; i++) {
        uint64_t e = seg->base + r[i].rel_entry;
        if (entry_validate(seg, r[i].offset, e, max_len, &lf) == ENTRY_OK) {
            *found_off = r[i].offset;
            *found_entry = e;
            return 1;
        }
    }
    return scan_bytes(seg, off, window, limit, expect_entry, max_len, found_off, found_entry);
}
