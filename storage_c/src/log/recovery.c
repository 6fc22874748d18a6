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
 *
 * The code follows those steps: recovery_repair_tail lists the segments and
 * calls scan_tail (choose_start, scan_start, then scan_segment and
 * next_segment in turn, end_before_gap), which fills a `repair` struct with
 * the cut; apply_cut makes the files and the state match it, and publish
 * finishes (lost acknowledged numbers, counters, active_gen).  Every
 * segment the scan looks at stays referenced (holds) until the end, so that
 * the cut, which may point into an earlier segment, stays mapped.  The scan
 * reads the mappings directly rather than through cursor.c: it must
 * see past the commit point, which readers never do.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "log.h"

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
    sys_closedir(d);
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

/* Only ever from what was read: a header that cannot be read stops recovery
 * (*fatal) before anything is renamed. */
static void set_aside(shard *sh, int *fatal, uint64_t base, int has_data)
{
    char path[COMET_PATH_MAX], idx[COMET_PATH_MAX], orphan[COMET_PATH_MAX];
    if (*fatal)
        return;
    int stale = recycle_stale(sh, base); /* never written: its earlier life's bytes */
    if (stale < 0) {
        *fatal = stale;
        return;
    }
    segment_path(path, sh->dir, base, SEGMENT_SUFFIX);
    segment_path(idx, sh->dir, base, INDEX_SUFFIX);
    sys_unlink(idx);
    cut_point(CUT_RECOVERY_SET_ASIDE);
    if (stale)
        return;
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

/* No segment holds an entry: the log is empty and goes on at next (the
 * oldest entry is next too, whatever the state said: retention may have
 * deleted segments after the state last reached the disk). */
static int no_segments(shard *sh, uint64_t next)
{
    state_file *st = sh->st;
    atomic_store(&st->next_entry, next);
    atomic_store(&st->active_base, next);
    atomic_store(&st->active_end, 0);
    atomic_store(&st->write_hwm, 0);
    atomic_store(&st->zeroed_end, 0);
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

/* A segment that cannot be loaded is damaged (NULL) when what was read says
 * so (COMET_E_CORRUPT: bad header, missing).  Any other failure (a read
 * error, another format version, no memory, EROFS...) stops recovery with
 * that error rather than setting aside data it could not judge. */
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
    else if (rc != COMET_E_CORRUPT)
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

/* Where the bytes after the cut that this segment's own writers may have
 * written end: they are zeroed, so that appends resuming at the cut never sit
 * in front of an old torn batch a later scan could take for theirs.  In a
 * fresh segment that is where the non-zero bytes end.  A recycled segment
 * holds its earlier life's entries after them (recycle.c): without a crash
 * of the machine, the state's write_hwm bounds this life's writes; after one
 * it may not, and then only the entry header at the cut is zeroed (the scan
 * ends there) and the segment is sealed: appends go on in a new segment, so
 * nothing is ever written in front of what lies past the cut. */
static uint64_t garbage_end_of(const shard *sh, scan_point cut, uint64_t state_active, int how,
                               int ended, int *seal)
{
    uint64_t hwm = atomic_load(&sh->st->write_hwm), cap = cut.seg->capacity;
    int active = cut.seg->base == state_active;
    *seal = 0;
    /* A log ended at damage after a restart (past_durable) has pages of
     * entries after the cut that the kernel wrote back, with holes between
     * them: no bound of what to zero; it is sealed as a recycled one is. */
    if (!(cut.seg->flags & SEGMENT_FLAG_RECYCLED) && !ended)
        return nonzero_end(cut.seg, cut.off, active ? hwm : 0);
    if (how == 0 && active)
        return hwm > cut.off ? (hwm < cap ? hwm : cap) : cut.off;
    if (cut.entry == cut.seg->base) /* nothing to seal: clear the whole file once */
        return cap;
    *seal = 1;
    return cut.off + ENTRY_HEADER_BYTES < cap ? cut.off + ENTRY_HEADER_BYTES : cap;
}

/* Finishes the repair at the cut point: zero what follows, trim the index,
 * restore the segment's size, publish the new commit point. */
static int apply_cut(shard *sh, holds *h, scan_point cut, uint64_t furthest,
                     uint64_t state_active, int how, int ended, int *changed)
{
    state_file *st = sh->st;
    int seal;
    uint64_t garbage_end = garbage_end_of(sh, cut, state_active, how, ended, &seal);
    if (seal) {
        int fd = shard_segment_fd(sh, cut.seg);
        int rc = fd < 0 ? fd : zero_fill(fd, cut.off, garbage_end);
        if (rc)
            return rc;
        garbage_end = cut.off; /* the earlier life's bytes: nothing truncated */
        *changed = 1;
    }
    if (garbage_end > cut.off) {
        int fd = shard_segment_fd(sh, cut.seg);
        int rc = fd < 0 ? fd : zero_fill(fd, cut.off, garbage_end);
        if (rc)
            return rc;
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
        if (fd < 0)
            return fd;
        char path[COMET_PATH_MAX];
        segment_path(path, sh->dir, cut.seg->base, SEGMENT_SUFFIX);
        int rc = preallocate(fd, want, path);
        if (rc)
            return rc;
        *changed = 1;
    }

    cut_point(CUT_RECOVERY_ZEROED);
    uint64_t zeroed = garbage_end;
    if (cut.seg->base == state_active && atomic_load(&st->zeroed_end) > zeroed)
        zeroed = atomic_load(&st->zeroed_end);
    atomic_store(&st->active_base, cut.seg->base);
    atomic_store(&st->active_end, cut.off);
    atomic_store(&st->write_hwm, cut.off);
    atomic_store(&st->zeroed_end, zeroed);
    atomic_store(&st->seal_active, (uint32_t)seal);
    if (cut.ts > atomic_load(&st->last_ts))
        atomic_store(&st->last_ts, cut.ts);
    if (atomic_load(&st->durable_entry) > cut.entry)
        atomic_store(&st->durable_entry, cut.entry);
    if (atomic_load(&st->durable_base) > cut.seg->base)
        atomic_store(&st->durable_base, cut.seg->base);
    /* What a repair keeps was acknowledged (by this life or an earlier one):
     * a later repair after a failed sync keeps it too (resync.c). */
    if (atomic_load(&st->acked_end) < cut.entry)
        atomic_store(&st->acked_end, cut.entry);
    atomic_store_explicit(&st->next_entry, cut.entry, memory_order_release);
    return 0;
}

/* ---- the scan ------------------------------------------------------------- */

/* The state may be older than the segments' pages that reached the disk: a
 * reboot, or a state no living process held (a copy, a volume attached
 * again, a cut the kernel survived; state.c).  Only its durable point is sure. */
static int after_restart(int how)
{
    return how == STATE_REBOOTED || how == STATE_UNHELD;
}

/* One recovery: the segments, where the scan stands, the best cut so far. */
typedef struct repair {
    shard *sh;
    int how;               /* 0, STATE_REBUILT, STATE_REBOOTED or STATE_UNHELD */
    uint64_t *bases;       /* the segments, ascending */
    size_t n;
    uint64_t committed;    /* entries below this are kept without a batch end */
    uint64_t limit;        /* the log ends here at the latest (resync.c) */
    uint64_t scan_from;    /* the scan starts at the index record before this entry */
    uint64_t state_active; /* active segment according to the state (UINT64_MAX: none) */
    holds h;
    /* where the scan stands: entry e at byte off of bases[i] (seg NULL: unreadable) */
    size_t i;
    segment *seg;
    uint64_t e, off;
    scan_point cut;        /* everything from here on is cut */
    /* Where the log stood before its first gap, and whether any entry after
     * it checks out: when none does, the segments after the gap were never
     * written (created, then the power went) and the log ends before it. */
    scan_point before_gap;
    size_t gap_at;
    int good_after_gap;
    /* After a restart, damage or a gap past the durable point ends the log
     * (see past_durable): the scan stops at e, later segments are set aside,
     * and the cut segment is sealed. */
    int ended;
    int limited;           /* it ended at limit: what follows is removed, not set aside */
    int changed;           /* the repair changed something (counted as a state rebuild) */
} repair;

/* Entries up to the commit point are kept even without a batch end after
 * them (a batch is whole once the commit point passed it).  After a restart
 * the state's commit point may have reached the disk before the entries did:
 * only its durable point is sure, and what follows it is scanned.  Without a
 * usable point (a state re-created, or one older than every segment) nothing
 * is taken as committed and every segment is scanned: only batch ends move the
 * cut, and segments that were created but never written (the power went
 * first) end the log. */
static void choose_start(repair *r)
{
    state_file *st = r->sh->st;
    uint64_t committed = atomic_load(&st->next_entry);
    if (after_restart(r->how) && atomic_load(&st->durable_entry) < committed)
        committed = atomic_load(&st->durable_entry);
    uint64_t scan_from = committed;
    if (r->how == STATE_REBUILT || committed < r->bases[0]) {
        scan_from = r->how ? r->bases[0] : r->bases[r->n - 1];
        committed = r->how ? 0 : r->bases[r->n - 1];
    }
    r->committed = committed;
    r->scan_from = scan_from;
    r->state_active = atomic_load(&st->active_end) ? atomic_load(&st->active_base) : UINT64_MAX;
}

/* Byte offset of the index record at or before entry in a held segment
 * (*rel: its entry, relative); the segment start when there is none.  A
 * missing index, or one whose record is not its entry, is rebuilt first. */
static uint64_t start_offset(holds *h, segment **seg, uint64_t entry, uint64_t *rel)
{
    uint64_t off;
    index_lookup(*seg, entry - (*seg)->base, rel, &off);
    if ((*seg)->index_ok && index_record_ok(*seg, *rel, off))
        return off;
    *seg = rebuild_held(h, *seg, entry);
    index_lookup(*seg, entry - (*seg)->base, rel, &off);
    if (!index_record_ok(*seg, *rel, off)) {
        *rel = 0;
        off = SEGMENT_DATA_OFFSET;
    }
    return off;
}

/* Puts the scan in the segment holding scan_from, at the index record before
 * it; the cut starts there.  Sets h.fatal when that segment cannot be judged.
 * A segment that holds no entry to start from - a recycled file whose new
 * header never reached the disk, or a header that does not check out - is
 * reached from the segment before it instead (next_segment ends the log or
 * sets it aside there): started in, it would leave no cut at all, and the log
 * would be taken as empty while earlier segments hold entries. */
static void scan_start(repair *r)
{
    size_t i = r->n - 1;
    while (i > 0 && r->bases[i] > r->scan_from)
        i--;
    for (;; i--) {
        int stale = i > 0 ? recycle_is_stale(r->sh, r->bases[i]) : 0;
        if (stale < 0) {
            r->h.fatal = stale;
            return;
        }
        if (stale)
            continue;
        r->seg = hold(&r->h, r->bases[i]);
        if (r->h.fatal)
            return;
        if (r->seg || i == 0)
            break;
    }
    r->i = i;
    uint64_t rel = 0, off = SEGMENT_DATA_OFFSET;
    if (r->seg)
        off = start_offset(&r->h, &r->seg, r->scan_from, &rel);
    r->e = r->bases[i] + rel;
    r->off = off;
    r->cut = (scan_point){r->seg, r->e, off, atomic_load(&r->sh->st->last_ts)};
}

/* Steps over the good entry at the scan point (its len_flags lf): the cut
 * follows when it ends a batch or lies below the commit point. */
static void keep_entry(repair *r, uint32_t lf)
{
    r->good_after_gap |= r->before_gap.seg != NULL;
    int64_t ts = entry_timestamp(r->seg, r->off);
    r->off += ENTRY_HEADER_BYTES + (lf & ENTRY_LEN_MASK);
    r->e++;
    if ((lf & ENTRY_FLAG_BATCH_END) || r->e <= r->committed)
        r->cut = (scan_point){r->seg, r->e, r->off, ts > r->cut.ts ? ts : r->cut.ts};
}

/* Whether the scan stands past what is known to have reached the disk
 * before a restart.  Bytes there were never synced: a page of them the power
 * took reads as zeros, or as the earlier life of a recycled file, while later
 * pages the kernel happened to write back survive.  Keeping those would leave
 * a log that is not a prefix of what was written (a hole of lost entries,
 * batches torn by it); so there the first damaged entry or gap ends the log.
 * Before the durable point damage is damage of synced data, skipped in
 * place.  (The durable point in the state lags what was synced by up to one
 * flush interval: a byte flipped on the disk in that stretch also ends the
 * log after a restart.) */
static int past_durable(const repair *r)
{
    return after_restart(r->how) && r->e >= r->committed;
}

/* A segment created past the durable point whose header never reached the
 * disk (a rotation syncs nothing: the directory may be synced before the
 * file's first sync, durability.c): no entry of it was acknowledged as
 * durable, and there is nothing to keep.  Its header is zeros, or the file
 * is shorter than one.  A header damaged in place is not zeros. */
static int torn_creation(const repair *r, uint64_t base)
{
    if (!after_restart(r->how) || base < r->committed)
        return 0;
    char path[COMET_PATH_MAX];
    uint8_t head[FILE_HEADER_BYTES];
    int missing = 0;
    segment_path(path, r->sh->dir, base, SEGMENT_SUFFIX);
    long got = read_file_prefix(path, head, sizeof head, &missing);
    if (got < 0)
        return 0;
    for (long k = 0; k < got; k++)
        if (head[k])
            return 0;
    return 1;
}

/* Moves the scan past a damaged entry to the next good one before the
 * written end of the segment: 1, or 0 when none follows (the segment ends). */
static int skip_damage(repair *r)
{
    int active = r->seg->base == r->state_active;
    uint64_t hwm = active ? atomic_load(&r->sh->st->write_hwm) : 0;
    int recycled = (r->seg->flags & SEGMENT_FLAG_RECYCLED) != 0;
    /* Past a recycled segment's entries lie its earlier life's, which never
     * check out here: a sealed segment whose successor starts at e is
     * complete, and the active one was written no further than write_hwm. */
    if (recycled && r->i + 1 < r->n && r->bases[r->i + 1] == r->e)
        return 0;
    if (past_durable(r)) {
        r->ended = 1;
        return 0;
    }
    uint64_t limit = recycled ? (active ? hwm : r->seg->capacity) : nonzero_end(r->seg, r->off, hwm);
    uint64_t found_off, found_entry;
    if (!entry_resync(r->seg, r->off, r->e, limit + ENTRY_HEADER_BYTES, ENTRY_LEN_MASK, &found_off,
                      &found_entry))
        return 0;
    r->off = found_off;
    r->e = found_entry;
    r->changed = 1;
    return 1;
}

/* Walks the current segment until its entries stop checking out. */
static void scan_segment(repair *r)
{
    if (!r->seg)
        return;
    for (;;) {
        if (r->e >= r->limit) { /* what follows was refused to its writers */
            r->ended = r->limited = 1;
            return;
        }
        uint32_t lf = 0;
        entry_check c = entry_validate(r->seg, r->off, r->e, ENTRY_LEN_MASK, &lf);
        if (c == ENTRY_OK && (lf & ENTRY_FLAG_KEYED) && past_durable(r)) {
            /* A keyed batch whose key record did not reach the disk: a retry
             * would store it again, so it ends the log (keys.c).  The cut
             * stands at the batch's start: past the durable point it moves
             * only at batch ends. */
            int recorded = keys_recorded(r->sh, r->cut.entry, r->e + 1);
            if (recorded < 0) {
                r->h.fatal = recorded;
                return;
            }
            if (!recorded) {
                r->ended = 1;
                r->changed = 1;
                return;
            }
        }
        if (c == ENTRY_OK)
            keep_entry(r, lf);
        else if (c == ENTRY_END || !skip_damage(r))
            return;
    }
}

/* Gives back the stale recycled file at bases[from] and removes the segments
 * after it (set aside when they hold data); the scan ends before them. */
static void end_at_stale(repair *r, size_t from)
{
    for (size_t k = from; k < r->n; k++) {
        segment *later = k == from ? NULL : hold(&r->h, r->bases[k]);
        if (r->h.fatal)
            return;
        set_aside(r->sh, &r->h.fatal, r->bases[k], later && segment_has_data(later));
    }
    r->n = from;
    r->changed = 1;
}

/* Sets aside the segments from bases[from] on (removed when they hold no
 * entry, or only entries refused to their writers): the log ends before them. */
static void end_from(repair *r, size_t from)
{
    for (size_t k = from; k < r->n; k++) {
        segment *seg = hold(&r->h, r->bases[k]);
        if (r->h.fatal)
            return;
        set_aside(r->sh, &r->h.fatal, r->bases[k], !r->limited && seg && segment_has_data(seg));
        r->changed = 1;
    }
    r->n = from;
}

/* The current segment ends at entry e: continues in the next segment that
 * fits the numbering, setting aside an unreadable segment and the ones that
 * overlap.  Returns 0 at the end of the log, or when h.fatal is set. */
static int next_segment(repair *r)
{
    if (r->h.fatal)
        return 0;
    if (r->ended) {
        end_from(r, r->i + 1);
        return 0;
    }
    if (!r->seg) { /* its header cannot be read: nothing of it can be served */
        set_aside(r->sh, &r->h.fatal, r->bases[r->i], !torn_creation(r, r->bases[r->i]));
        r->changed = 1;
    }
    size_t j = r->i + 1;
    for (; j < r->n && r->bases[j] < r->e; j++) {
        segment *later = hold(&r->h, r->bases[j]);
        if (r->h.fatal)
            return 0;
        set_aside(r->sh, &r->h.fatal, r->bases[j], segment_has_data(later));
        r->changed = 1;
    }
    if (j >= r->n)
        return 0;
    if (r->bases[j] != r->e && past_durable(r)) {
        r->ended = 1;
        end_from(r, j);
        return 0;
    }
    if (r->bases[j] != r->e) {
        r->changed = 1; /* a gap: readers count what is missing */
        if (!r->before_gap.seg && r->cut.seg) {
            r->before_gap = r->cut;
            r->gap_at = j;
        }
    }
    int stale = recycle_is_stale(r->sh, r->bases[j]);
    if (stale < 0) {
        r->h.fatal = stale;
        return 0;
    }
    if (stale) {
        /* A recycled file whose new header never reached the disk: nothing
         * of it, nor of any later segment, was ever made durable (a sync
         * covers every segment up to the active one).  The log ends here. */
        end_at_stale(r, j);
        return 0;
    }
    r->i = j;
    r->seg = hold(&r->h, r->bases[j]);
    if (r->h.fatal)
        return 0;
    r->e = r->bases[j];
    r->off = SEGMENT_DATA_OFFSET;
    if (r->seg)
        r->cut = (scan_point){r->seg, r->e, r->off, r->cut.ts};
    return 1;
}

/* No entry after the first gap checked out: the log ends before the gap, and
 * the segments from it on are set aside (or removed when empty). */
static void end_before_gap(repair *r)
{
    if (r->h.fatal || !r->before_gap.seg || r->good_after_gap)
        return;
    r->cut = r->before_gap;
    end_from(r, r->gap_at);
}

/* Finds the cut: from the start point through every segment that fits, then
 * back before a gap nothing was written after.  h.fatal on an I/O error. */
static void scan_tail(repair *r)
{
    choose_start(r);
    scan_start(r);
    if (r->h.fatal)
        return;
    do
        scan_segment(r);
    while (next_segment(r));
    end_before_gap(r);
}

/* After the cut: numbers acknowledged but lost are skipped, what a restart
 * left is durable, the first entry follows retention, the check is counted
 * when it was due or repaired something, and writers of other processes map
 * the active segment again. */
static void publish(shard *sh, int how, int due, int changed)
{
    state_file *st = sh->st;
    changed |= skip_acknowledged(sh);
    if (how == STATE_REBOOTED) { /* what is read after a restart came from the disk */
        atomic_store(&st->durable_base, atomic_load(&st->active_base));
        atomic_store(&st->durable_entry, atomic_load(&st->next_entry));
    }
    uint64_t *after;
    size_t m;
    if (shard_segment_bases(sh, &after, &m) == 0) {
        /* The oldest entry is the first segment's; one past the commit point
         * is a damaged state's (readers drop entries below it, reader.c). */
        uint64_t first = atomic_load(&st->first_entry), next = atomic_load(&st->next_entry);
        if (first > next)
            first = 0;
        if (m && first < after[0])
            first = after[0] < next ? after[0] : next;
        atomic_store(&st->first_entry, first);
        free(after);
    }
    /* A check with a cause counts whether it repaired anything or not (what
     * it cut is in the truncated_* counters); the one every opener makes
     * counts only when it repaired something: an inspector's open of a
     * healthy shard changes no counter. */
    if (due || changed)
        wc_add(st, WC_RECOVERIES, 1);
    if (changed && how == STATE_REBUILT)
        wc_add(st, WC_STATE_REBUILDS, 1);
    atomic_fetch_add_explicit(&st->active_gen, 1, memory_order_release);
    atomic_store(&st->recovery_pending, 0);
}

/* The repair's own writes (zeros over the cut, a restored size) and names
 * (segments set aside) reach the disk before the state calls anything after
 * them durable: otherwise a power cut could bring back what was cut. */
static int sync_repair(shard *sh, uint64_t cut_base)
{
    segment *seg = shard_segment_by_base(sh, cut_base);
    int fd = seg ? shard_segment_fd(sh, seg) : 0;
    int failed = fd >= 0 && seg && sys_fdatasync(fd);
    int err = errno;
    if (seg)
        shard_segment_release(sh, seg);
    if (fd < 0)
        return fd;
    if (failed)
        return shard_note_sync_failure(sh, err, "fdatasync of a repaired segment");
    return fsync_dir(sh->dir);
}

/* A state that was re-created, or repaired, reaches the disk now: until the
 * first sync it would otherwise be zeros there (or the old points), and a
 * power cut would leave the next opener a state to rebuild from a scan, in
 * which entries lost in earlier segments look like damage in place. */
static int sync_state(shard *sh)
{
    if (sys_msync(sh->st, STATE_FILE_BYTES, MS_SYNC))
        return shard_note_sync_failure(sh, errno, "msync of the repaired state");
    return 0;
}

int recovery_repair_tail(shard *sh, int how, int due)
{
    return recovery_repair_below(sh, how, due, UINT64_MAX);
}

int recovery_repair_below(shard *sh, int how, int due, uint64_t limit)
{
    remove_temp_files(sh->dir);
    repair r = {.sh = sh, .how = how, .changed = how == STATE_REBUILT, .h = {.sh = sh},
                .limit = limit};
    int rc = shard_list_segments(sh, &r.bases, &r.n);
    if (rc)
        return rc;
    if (r.n == 0) {
        free(r.bases);
        rc = no_segments(sh, how == STATE_REBUILT ? 0 : atomic_load(&sh->st->next_entry));
        if (!rc && how)
            rc = keys_forget_after(sh, atomic_load(&sh->st->next_entry));
        /* A state made for a shard without segments (every new shard) is what
         * the next opener would make again if the power took it: nothing to
         * sync, and no device flush in the open of a new shard. */
        return rc || !how || how == STATE_REBUILT ? rc : sync_state(sh);
    }
    scan_tail(&r);
    free(r.bases);
    if (r.h.fatal) {
        release_all(&r.h);
        return r.h.fatal;
    }
    if (!r.cut.seg) { /* no readable segment: the log goes on where the scan ended */
        release_all(&r.h);
        shard_refresh_segments(sh);
        rc = no_segments(sh, r.e);
        return rc ? rc : keys_forget_after(sh, atomic_load(&sh->st->next_entry));
    }
    uint64_t furthest = r.e > r.committed ? r.e : r.committed;
    uint64_t cut_base = r.cut.seg->base; /* apply_cut may swap the segment object */
    rc = apply_cut(sh, &r.h, r.cut, furthest, r.state_active, r.how, r.ended, &r.changed);
    if (!rc && r.changed)
        rc = sync_repair(sh, cut_base);
    release_all(&r.h);
    if (rc)
        return rc;
    publish(sh, how, due, r.changed);
    /* Records of batches that did not survive: their numbers are handed out
     * again, and a record must never name a later batch.  A holder that died
     * (due) may have recorded a key and written none of its batch, which
     * leaves nothing past the commit point to repair. */
    if ((how || due || r.changed) &&
        (rc = keys_forget_after(sh, atomic_load(&sh->st->next_entry))))
        return rc;
    return how || r.changed ? sync_state(sh) : 0;
}
