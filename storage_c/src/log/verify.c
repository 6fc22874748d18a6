/*
 * verify.c - checks every entry of a shard: checksum, length, number, and
 * that each segment holds exactly the entries its neighbours say it should.
 * Damage to entries is only reported - with its segment, offset and entry -
 * and the walk resynchronises after it the way readers do, so one bad byte is
 * one problem, not the end of the report.  A sparse index that disagrees with
 * its segment is derived data: it is counted and rebuilt on the spot (the
 * active segment's by the next appender).
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

static void note(comet_verify_report *r, uint64_t base, uint64_t off, uint64_t entry, int code)
{
    if (r->problem_count < COMET_VERIFY_MAX_PROBLEMS)
        r->problems[r->problem_count++] = (comet_verify_problem){base, off, entry, code, 0};
}

/* 1 when the index records of seg point at the entries they name. */
static int index_agrees(const segment *seg, uint64_t end_entry)
{
    if (!seg->index_ok)
        return 0;
    uint32_t n = atomic_load_explicit(index_count_ptr(seg), memory_order_acquire);
    const index_record *rec = index_records(seg);
    for (uint32_t i = 0; i < n; i++) {
        uint64_t e = seg->base + rec[i].rel_entry;
        uint32_t lf;
        if (e >= end_entry)
            break;
        if (entry_validate(seg, rec[i].offset, e, ENTRY_LEN_MASK, &lf) != ENTRY_OK)
            return 0;
    }
    return 1;
}

static void verify_entries(const segment *seg, uint64_t end_entry, comet_verify_report *r)
{
    uint64_t e = seg->base, off = SEGMENT_DATA_OFFSET;
    while (e < end_entry) {
        uint32_t lf;
        entry_check c = entry_validate(seg, off, e, ENTRY_LEN_MASK, &lf);
        if (c == ENTRY_OK) {
            r->entries++;
            r->bytes += ENTRY_HEADER_BYTES + (lf & ENTRY_LEN_MASK);
            off += ENTRY_HEADER_BYTES + (lf & ENTRY_LEN_MASK);
            e++;
            continue;
        }
        note(r, seg->base, off, e, COMET_E_CORRUPT);
        uint64_t found_off, found_entry;
        if (c == ENTRY_BAD &&
            entry_resync(seg, off, e, seg->capacity, ENTRY_LEN_MASK, &found_off, &found_entry) &&
            found_entry < end_entry) {
            r->bad_entries += found_entry - e;
            e = found_entry;
            off = found_off;
            continue;
        }
        r->bad_entries += end_entry - e;
        break;
    }
}

static int verify_in(shard *sh, comet_verify_report *out);

int comet_verify_shard(comet_stream *s, uint32_t shard_id, comet_verify_report *out)
{
    if (!out)
        return set_error(COMET_E_INVALID, "comet_verify_shard: null argument");
    memset(out, 0, sizeof *out);
    shard *sh;
    int rc = shard_acquire(s, shard_id, &sh);
    if (rc)
        return rc;
    rc = verify_in(sh, out);
    shard_leave(sh);
    return rc;
}

static int verify_in(shard *sh, comet_verify_report *out)
{
    int rc;
    uint64_t committed = atomic_load_explicit(&sh->st->next_entry, memory_order_acquire);
    uint64_t *bases;
    size_t n;
    rc = shard_segment_bases(sh, &bases, &n);
    if (rc)
        return rc;
    for (size_t i = 0; i < n; i++) {
        uint64_t end = i + 1 < n ? bases[i + 1] : committed;
        if (end > committed)
            end = committed;
        out->segments++;
        segment *seg;
        rc = shard_segment_get(sh, bases[i], &seg);
        if (rc && rc != COMET_E_CORRUPT) { /* could not read: an error, not damage to report */
            free(bases);
            return rc;
        }
        if (!seg) {
            note(out, bases[i], 0, bases[i], COMET_E_CORRUPT);
            if (end > bases[i])
                out->bad_entries += end - bases[i];
            continue;
        }
        verify_entries(seg, end, out);
        if (!index_agrees(seg, end)) {
            out->index_problems++;
            if (i + 1 < n)
                seg = shard_segment_rebuild_index(sh, seg, end);
            else
                atomic_store(&sh->st->recovery_pending, 1);
        }
        shard_segment_release(sh, seg);
    }
    free(bases);
    return 0;
}
