/*
 * recovery.c - making a shard's tail whole again.
 *
 * Runs under the append lock, whenever a process opens the shard, and when a
 * locker learns (EOWNERDEAD) that the previous holder died mid-append.
 *
 * The state's commit point says how far entries were published.  The scan
 * starts at the sparse index record before it (so the last committed entries
 * are checked again, cheaply) and walks forward, into later segments when
 * one starts where the previous ended, until the entries stop checking out:
 *
 *   - a good entry below the commit point, or one carrying the batch-end bit,
 *     moves the cut point after it: a torn batch (a writer killed half way)
 *     has no batch end and is cut whole, so batches stay atomic;
 *   - a damaged entry with good entries after it (found by length, by index
 *     record, or byte by byte) is left in place and skipped: readers count it,
 *     `verify` reports it, and nothing acknowledged after it is thrown away;
 *   - a segment that ends early but has a successor continues in the
 *     successor: the missing entries are a gap, the numbering holds;
 *   - at the real end, everything after the cut point is zeroed (and counted),
 *     later segments that do not fit the numbering are set aside as *.orphan.
 *
 * If the state itself was lost, the scan starts at the first entry of the last
 * segment and the same rules rebuild the commit point.  Recovery never fails
 * because of damaged data; it fails only on I/O errors, and then leaves
 * recovery_pending set so that the next locker tries again.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "errors.h"
#include "internal.h"

#define ZERO_RUN_BYTES ((uint64_t)64 << 10)

typedef struct scan_point {
    segment *seg;   /* referenced */
    uint64_t entry; /* next entry number */
    uint64_t off;   /* byte offset of that entry */
    int64_t ts;     /* timestamp of the entry before it (0 when unknown) */
} scan_point;

static void remove_temp_files(const char *dir)
{
    DIR *d = sys_opendir(dir);
    if (!d)
        return;
    struct dirent *de;
    char path[COMET_PATH_MAX];
    size_t tl = strlen(TEMP_SUFFIX);
    while ((de = sys_readdir(d))) {
        size_t len = strlen(de->d_name);
        if (len > tl && strcmp(de->d_name + len - tl, TEMP_SUFFIX) == 0 &&
            path_format(path, "%s/%s", dir, de->d_name) == 0)
            sys_unlink(path);
    }
    closedir(d);
}

/* End of the non-zero bytes at or after from: stops after a run of zeros. */
static uint64_t nonzero_end(const segment *seg, uint64_t from, uint64_t at_least)
{
    uint64_t end = from, cap = seg->capacity;
    if (at_least > cap)
        at_least = cap;
    uint64_t p = from;
    while (p < cap) {
        if (p >= end + ZERO_RUN_BYTES && p >= at_least)
            break;
        if (seg->map[p])
            end = p + 1;
        p++;
        /* skip zero words quickly */
        while (p + 8 <= cap && ((p & 7) == 0)) {
            uint64_t w;
            memcpy(&w, seg->map + p, 8);
            if (w)
                break;
            p += 8;
            if (p >= end + ZERO_RUN_BYTES && p >= at_least)
                break;
        }
    }
    return end;
}

static void set_aside(shard *sh, uint64_t base, int has_data)
{
    char path[COMET_PATH_MAX], idx[COMET_PATH_MAX], orphan[COMET_PATH_MAX];
    segment_path(path, sh->dir, base, SEGMENT_SUFFIX);
    segment_path(idx, sh->dir, base, INDEX_SUFFIX);
    sys_unlink(idx);
    if (has_data) {
        segment_path(orphan, sh->dir, base, SEGMENT_SUFFIX ORPHAN_SUFFIX);
        sys_rename(path, orphan);
        wc_add(sh->st, WC_ORPHANED_SEGMENTS, 1);
    } else {
        sys_unlink(path);
    }
}

static int segment_has_data(const segment *seg)
{
    uint32_t lf;
    return seg && entry_validate(seg, SEGMENT_DATA_OFFSET, seg->base, ENTRY_LEN_MASK, &lf) ==
                      ENTRY_OK;
}

/* A consumer group may have acknowledged entries that did not survive (its
 * offsets page reached the disk, the entries' pages did not).  Their numbers
 * are never handed out again: new entries start after the furthest offset,
 * in a segment of their own, and readers count the numbers between as
 * missing.  Otherwise the group would skip the new entries given those
 * numbers, and shipped objects named by entry number would be overwritten. */
static int skip_acknowledged(shard *sh)
{
    state_file *st = sh->st;
    uint64_t next = atomic_load(&st->next_entry), acked = offsets_max(sh);
    if (acked <= next)
        return 0;
    atomic_store(&st->active_base, acked);
    atomic_store(&st->active_end, 0);
    atomic_store(&st->write_hwm, 0);
    atomic_store(&st->zeroed_end, 0);
    atomic_store_explicit(&st->next_entry, acked, memory_order_release);
    return 1;
}

static int no_segments(shard *sh, uint64_t next)
{
    state_file *st = sh->st;
    atomic_store(&st->next_entry, next);
    atomic_store(&st->active_base, next);
    atomic_store(&st->active_end, 0);
    atomic_store(&st->write_hwm, 0);
    atomic_store(&st->zeroed_end, 0);
    if (atomic_load(&st->first_entry) > next)
        atomic_store(&st->first_entry, next);
    if (atomic_load(&st->durable_entry) > next)
        atomic_store(&st->durable_entry, next);
    skip_acknowledged(sh);
    atomic_fetch_add(&st->active_gen, 1);
    atomic_store(&st->recovery_pending, 0);
    return 0;
}

/* Segment references taken during one recovery, released together. */
typedef struct holds {
    segment **seg;
    size_t n, cap;
    shard *sh;
    int fatal; /* an error that must stop recovery */
} holds;

/* A segment that cannot be loaded is damaged (NULL), unless it was written by
 * another format version: then recovery stops with that error rather than
 * setting aside data it cannot judge. */
static segment *hold(holds *h, uint64_t base)
{
    if (h->n == h->cap) {
        size_t cap = h->cap ? 2 * h->cap : 8;
        segment **grown = sys_realloc(h->seg, cap * sizeof *grown);
        if (!grown) { /* fatal: a NULL here must not read as a damaged segment */
            h->fatal = set_error(COMET_E_NOMEM, "out of memory recovering %s", h->sh->dir);
            return NULL;
        }
        h->seg = grown;
        h->cap = cap;
    }
    segment *seg;
    int rc = shard_segment_get(h->sh, base, &seg);
    if (seg)
        h->seg[h->n++] = seg;
    else if (rc == COMET_E_FORMAT_VERSION || rc == COMET_E_NOMEM || rc == COMET_E_IO)
        h->fatal = rc;
    return seg;
}

/* Rebuilds a held segment's index; the holds array keeps the new object. */
static segment *rebuild_held(holds *h, segment *seg, uint64_t end_entry)
{
    segment *fresh = shard_segment_rebuild_index(h->sh, seg, end_entry);
    for (size_t i = 0; i < h->n; i++)
        if (h->seg[i] == seg)
            h->seg[i] = fresh;
    return fresh;
}

static void release_all(holds *h)
{
    while (h->n)
        shard_segment_release(h->sh, h->seg[--h->n]);
    free(h->seg);
    h->seg = NULL;
    h->cap = 0;
}

/* Finishes the repair at the cut point: zero what follows, trim the index,
 * restore the segment's size, publish the new commit point. */
static int apply_cut(shard *sh, holds *h, scan_point cut, uint64_t furthest,
                     uint64_t state_active, int *changed)
{
    state_file *st = sh->st;
    uint64_t hwm = atomic_load(&st->write_hwm);
    uint64_t garbage_end = nonzero_end(cut.seg, cut.off, cut.seg->base == state_active ? hwm : 0);
    if (garbage_end > cut.off) {
        int fd = shard_segment_fd(sh, cut.seg);
        if (fd < 0 || zero_fill(fd, cut.off, garbage_end))
            return set_error(COMET_E_IO, "cannot zero the torn tail of %s", sh->dir);
        wc_add(st, WC_TRUNCATED_BYTES, garbage_end - cut.off);
        *changed = 1;
    }
    if (furthest > cut.entry) {
        wc_add(st, WC_TRUNCATED_ENTRIES, furthest - cut.entry);
        *changed = 1;
    }
    if (!cut.seg->index_ok)
        cut.seg = rebuild_held(h, cut.seg, cut.entry);
    index_truncate(cut.seg, cut.entry - cut.seg->base);

    uint64_t want = segment_header_capacity(cut.seg);
    if (want > cut.seg->capacity) {
        int fd = shard_segment_fd(sh, cut.seg);
        int err = fd < 0 ? EIO : preallocate(fd, want);
        if (err)
            return set_errno_error(err, "cannot restore the size of segment %" PRIu64 " in %s",
                                   cut.seg->base, sh->dir);
        *changed = 1;
    }

    uint64_t zeroed = garbage_end;
    if (cut.seg->base == state_active && atomic_load(&st->zeroed_end) > zeroed)
        zeroed = atomic_load(&st->zeroed_end);
    atomic_store(&st->active_base, cut.seg->base);
    atomic_store(&st->active_end, cut.off);
    atomic_store(&st->write_hwm, cut.off);
    atomic_store(&st->zeroed_end, zeroed);
    if (cut.ts > atomic_load(&st->last_ts))
        atomic_store(&st->last_ts, cut.ts);
    if (atomic_load(&st->durable_entry) > cut.entry)
        atomic_store(&st->durable_entry, cut.entry);
    if (atomic_load(&st->durable_base) > cut.seg->base)
        atomic_store(&st->durable_base, cut.seg->base);
    atomic_store_explicit(&st->next_entry, cut.entry, memory_order_release);
    return 0;
}

int recovery_repair_tail(shard *sh, int how)
{
    int state_rebuilt = how == STATE_REBUILT;
    state_file *st = sh->st;
    remove_temp_files(sh->dir);
    uint64_t *bases;
    size_t n;
    int rc = shard_list_segments(sh, &bases, &n);
    if (rc)
        return rc;
    if (n == 0) {
        free(bases);
        return no_segments(sh, state_rebuilt ? 0 : atomic_load(&st->next_entry));
    }

    /* Entries up to the commit point are kept even without a batch end after
     * them (a batch is whole once the commit point passed it).  After a
     * restart the state's commit point may have reached the disk before the
     * entries did: only its durable point is sure, and what follows it is
     * scanned.  Without a usable point (a state re-created, or one older than
     * every segment) nothing is taken as committed and every segment is
     * scanned: only batch ends move the cut, and segments that were created
     * but never written (the power went first) end the log. */
    uint64_t committed = atomic_load(&st->next_entry);
    if (how == STATE_REBOOTED && atomic_load(&st->durable_entry) < committed)
        committed = atomic_load(&st->durable_entry);
    uint64_t scan_from = committed;
    if (state_rebuilt || committed < bases[0]) {
        scan_from = how ? bases[0] : bases[n - 1];
        committed = how ? 0 : bases[n - 1];
    }
    uint64_t state_active =
        atomic_load(&st->active_end) ? atomic_load(&st->active_base) : UINT64_MAX;
    int changed = state_rebuilt;
    holds h = {.seg = NULL, .n = 0, .cap = 0, .sh = sh, .fatal = 0};

    size_t i = n - 1;
    while (i > 0 && bases[i] > scan_from)
        i--;
    segment *seg = hold(&h, bases[i]);
    if (h.fatal) {
        free(bases);
        release_all(&h);
        return h.fatal;
    }
    uint64_t rel = 0, off = SEGMENT_DATA_OFFSET;
    if (seg) {
        index_lookup(seg, scan_from - seg->base, &rel, &off);
        uint32_t lf;
        if (!seg->index_ok ||
            (rel && entry_validate(seg, off, seg->base + rel, ENTRY_LEN_MASK, &lf) != ENTRY_OK)) {
            /* a wrong index must not make good entries look damaged */
            seg = rebuild_held(&h, seg, scan_from);
            index_lookup(seg, scan_from - seg->base, &rel, &off);
            if (rel && entry_validate(seg, off, seg->base + rel, ENTRY_LEN_MASK, &lf) != ENTRY_OK)
                rel = 0, off = SEGMENT_DATA_OFFSET;
        }
    }
    uint64_t e = bases[i] + rel;
    scan_point cut = {seg, e, off, atomic_load(&st->last_ts)};
    /* Where the log stood before its first gap, and whether any entry after
     * it checks out: when none does, the segments after the gap were never
     * written (created, then the power went) and the log ends before it. */
    scan_point before_gap = {0};
    size_t gap_at = 0;
    int good_after_gap = 0;

    for (;;) {
        uint32_t lf = 0;
        entry_check c = seg ? entry_validate(seg, off, e, ENTRY_LEN_MASK, &lf) : ENTRY_BAD;
        if (c == ENTRY_OK) {
            good_after_gap |= before_gap.seg != NULL;
            int64_t ts = entry_timestamp(seg, off);
            off += ENTRY_HEADER_BYTES + (lf & ENTRY_LEN_MASK);
            e++;
            if ((lf & ENTRY_FLAG_BATCH_END) || e <= committed)
                cut = (scan_point){seg, e, off, ts > cut.ts ? ts : cut.ts};
            continue;
        }
        if (c == ENTRY_BAD && seg) {
            uint64_t limit = nonzero_end(seg, off, seg->base == state_active ? atomic_load(&st->write_hwm) : 0);
            uint64_t found_off, found_entry;
            if (entry_resync(seg, off, e, limit + ENTRY_HEADER_BYTES, ENTRY_LEN_MASK, &found_off,
                             &found_entry) == 0) {
                off = found_off;
                e = found_entry;
                changed = 1;
                continue;
            }
        }
        if (h.fatal)
            break;
        if (!seg) { /* its header cannot be read: nothing of it can be served */
            set_aside(sh, bases[i], 1);
            changed = 1;
        }
        /* This segment ends here: continue in the next one that fits. */
        size_t j = i + 1;
        for (; j < n && bases[j] < e; j++) {
            segment *later = hold(&h, bases[j]);
            if (h.fatal)
                break;
            set_aside(sh, bases[j], segment_has_data(later));
            changed = 1;
        }
        if (j >= n || h.fatal)
            break;
        if (bases[j] != e) {
            changed = 1; /* a gap: readers count what is missing */
            if (!before_gap.seg && cut.seg) {
                before_gap = cut;
                gap_at = j;
            }
        }
        i = j;
        seg = hold(&h, bases[j]);
        if (h.fatal)
            break;
        e = bases[j];
        off = SEGMENT_DATA_OFFSET;
        if (seg)
            cut = (scan_point){seg, e, off, cut.ts};
    }
    if (!h.fatal && before_gap.seg && !good_after_gap) {
        cut = before_gap;
        for (size_t k = gap_at; k < n; k++) {
            segment *empty = hold(&h, bases[k]);
            if (h.fatal)
                break;
            set_aside(sh, bases[k], empty && segment_has_data(empty));
        }
    }
    free(bases);
    if (h.fatal) {
        release_all(&h);
        return h.fatal;
    }

    if (!cut.seg) {
        release_all(&h);
        shard_refresh_segments(sh);
        return no_segments(sh, e);
    }
    uint64_t furthest = e > committed ? e : committed;
    rc = apply_cut(sh, &h, cut, furthest, state_active, &changed);
    release_all(&h);
    if (rc)
        return rc;
    changed |= skip_acknowledged(sh);
    if (how == STATE_REBOOTED) { /* what is read after a restart came from the disk */
        atomic_store(&st->durable_base, atomic_load(&st->active_base));
        atomic_store(&st->durable_entry, atomic_load(&st->next_entry));
    }
    uint64_t *after;
    size_t m;
    if (shard_segment_bases(sh, &after, &m) == 0) {
        if (m && atomic_load(&st->first_entry) < after[0])
            atomic_store(&st->first_entry, after[0]);
        free(after);
    }
    /* Every check counts, whether it repaired anything or not (what it cut
     * is in the truncated_* counters). */
    wc_add(st, WC_RECOVERIES, 1);
    if (changed && state_rebuilt)
        wc_add(st, WC_STATE_REBUILDS, 1);
    /* Writers in other processes map the active segment again. */
    atomic_fetch_add_explicit(&st->active_gen, 1, memory_order_release);
    atomic_store(&st->recovery_pending, 0);
    return 0;
}
