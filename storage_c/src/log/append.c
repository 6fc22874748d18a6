/*
 * append.c - the append path of one shard, in the order it runs:
 *   1. lock: take the shard's append lock (shard.c), repairing the tail first
 *      when its previous holder died;
 *   2. room and budget: make sure the active segment has room for the batch,
 *      growing it by a chunk or rotating to a new segment; new bytes must fit
 *      in the directory's budget (usage.c), and when they do not the oldest
 *      data of the directory is deleted with this lock let go;
 *   3. write: zero-fill ahead of the write position when needed (cheap page
 *      faults), then every entry (header, payload, CRC) through the mapping,
 *      noting sparse index records on the way; the last entry carries
 *      "batch end";
 *   4. publish: end offset, then next_entry with release order; unlock;
 *      with durability "always", join a group commit (durability.c).
 * Nothing but memory stores happens under the lock in the common case.
 *
 * Steps 1 and 2 have two forms, one per append mode (comet.h).  The one that
 * waits (lock_with_room) waits for the lock, grows, rotates, frees budget and
 * zero-fills as needed.  The one that never sleeps (lock_without_sleeping)
 * takes the lock only if it is free and the shard needs no repair, maps,
 * grows and zero-fills the active segment, creates a shard's first segment -
 * short I/O, nothing synced - and refuses a rotation, deleting segments for
 * the shard's size limit or the directory's budget, and a due sync: then
 * COMET_E_WOULD_BLOCK, nothing changed.  A rotation's file syncs took up to a
 * second on a busy disk, which an event loop, or a Python thread holding the
 * GIL, must not wait for.
 *
 * Writes go through a shared mapping rather than pwrite: one pwrite costs
 * about 1 us here, a mapped single-entry append about 100 ns, and a mapped
 * 1000-entry batch (zero-filled ahead) beat a staged pwrite of the same bytes
 * by a third in a measurement on this kind of machine.
 *
 * batch.c turns each public entry point's input into the entry_ref array
 * handed to shard_append.
 */
#include <inttypes.h>
#include <stdint.h>

#include "log.h"
#include "presence.h"
#include "stream.h"
#include "sync_failure.h"

/* Unmaps the writable mapping's pages well behind off (segment_release_to):
 * the test is inline, as every append makes it. */
static inline void segment_release_behind(segment *seg, uint64_t off)
{
    if (off >= seg->zapped_to + 2 * SEGMENT_RELEASE_CHUNK)
        segment_release_to(seg, off);
}

/* The append lock if it is free now and the shard needs no repair; else
 * nonzero (shard_trylock_refused, with the lock let go).  A dead holder found
 * this way is left for a real locker to repair.  Inline: every append that
 * must not wait tries it. */
static inline int shard_trylock_clean(shard *sh)
{
    int rc = pthread_mutex_trylock(&sh->st->append_lock.mutex);
    if (rc || atomic_load(&sh->st->recovery_pending))
        return shard_trylock_refused(sh, rc);
    return 0;
}

#define ZERO_AHEAD_BYTES ((uint64_t)1 << 20)
#define LATENCY_SAMPLE 16

static const comet_config *shard_config(const shard *sh)
{
    return &sh->stream->db->cfg;
}

/* ---- room for a batch ----------------------------------------------------- */

/* Points sh->active at the state's active segment (under the append lock). */
static int writer_segment(shard *sh)
{
    state_file *st = sh->st;
    uint64_t gen = atomic_load_explicit(&st->active_gen, memory_order_acquire);
    if (sh->active && sh->active_gen == gen)
        return 0;
    if (sh->active)
        shard_segment_release(sh, sh->active);
    sh->active = NULL;
    sh->active_gen = gen;
    if (atomic_load_explicit(&st->active_end, memory_order_relaxed) == 0)
        return 0; /* no segment yet */
    if (atomic_load_explicit(&st->seal_active, memory_order_relaxed))
        return 0; /* sealed by recovery: the next append rotates */
    uint64_t base = atomic_load_explicit(&st->active_base, memory_order_relaxed);
    segment *seg = NULL;
    int rc = shard_segment_get(sh, base, &seg);
    if (rc == COMET_E_CORRUPT) { /* really not there: recovery decides what the shard holds */
        atomic_store(&st->recovery_pending, 1);
        return set_error(COMET_E_CORRUPT, "active segment %" PRIu64 " of %s is missing", base,
                         sh->dir);
    }
    if (rc)
        return rc;
    int fd = shard_segment_fd(sh, seg);
    if (fd < 0 || (fd = segment_writable(seg, sh->dir)) < 0) {
        shard_segment_release(sh, seg);
        return fd;
    }
    sh->active = seg;
    return 0;
}

static void start_segment(state_file *st, uint64_t base, uint64_t zeroed_end)
{
    atomic_store_explicit(&st->active_base, base, memory_order_relaxed);
    atomic_store_explicit(&st->active_end, SEGMENT_DATA_OFFSET, memory_order_relaxed);
    atomic_store_explicit(&st->write_hwm, SEGMENT_DATA_OFFSET, memory_order_relaxed);
    atomic_store_explicit(&st->zeroed_end, zeroed_end, memory_order_relaxed);
    atomic_store_explicit(&st->seal_active, 0, memory_order_relaxed);
    atomic_fetch_add_explicit(&st->active_gen, 1, memory_order_release);
}

/* Bytes the last failed budget check of this thread was short by, and the
 * segments consumer groups kept when the directory-wide pass tried to free them. */
static _Thread_local uint64_t budget_short, budget_protected;

/* Whether new_bytes more of segment space would take the shard past its
 * size limit. */
static int over_shard_limit(shard *sh, uint64_t new_bytes)
{
    const comet_config *cfg = shard_config(sh);
    return cfg->retention_max_shard_bytes &&
           usage_shard_bytes(sh) + new_bytes > cfg->retention_max_shard_bytes;
}

/* The per-shard size limit, applied before the shard takes new_bytes more of
 * segment space: its oldest segments go first (policy: it never fails for
 * lack of something to delete).  Deleted files may become the shard's spare.
 * Unless may_sleep, COMET_E_WOULD_BLOCK instead of deleting.  One walk of the
 * shard's files (usage_shard_bytes) either way. */
static int enforce_shard_limit(shard *sh, uint64_t new_bytes, int may_sleep)
{
    if (!over_shard_limit(sh, new_bytes))
        return 0;
    return may_sleep ? retention_shard(sh, 0, 1, now_ns(), NULL) : COMET_E_WOULD_BLOCK;
}

/* Keeps the data directory inside retention_max_total_bytes: new_bytes of
 * new file space must fit in the shared estimate (usage.c), which reserves
 * them; *reserved then tells the caller to call usage_allocated once the file
 * is created or grown. */
static int reserve_budget(shard *sh, uint64_t new_bytes, int *reserved)
{
    *reserved = 0;
    uint64_t budget = shard_config(sh)->retention_max_total_bytes;
    if (!budget || !new_bytes)
        return 0;
    uint64_t used; /* the shared estimate: no walk under this lock */
    int fit = usage_reserve(sh->stream->db, new_bytes, budget, &used);
    if (fit) {
        *reserved = fit == USAGE_RESERVED;
        return 0;
    }
    /* Over budget: the oldest data of the whole directory goes first, this
     * shard's included, in shard_append, outside this lock. */
    budget_short = used + new_bytes - budget;
    return set_error(COMET_E_STORAGE_FULL,
                     "the data directory uses %" PRIu64 " of its %" PRIu64 " byte budget "
                     "(retention_max_total_bytes) and the active segment of %s needs %" PRIu64
                     " more; nothing more may be deleted%s",
                     used, budget, sh->dir, new_bytes,
                     budget_protected ? ": registered groups have not consumed the oldest data "
                                        "(retention_protect_unconsumed)"
                                      : ": what is left is active segments and "
                                        "retention_min_segments");
}

static uint64_t grown_capacity(const comet_config *cfg, uint64_t capacity, uint64_t needed,
                               uint64_t limit)
{
    if (cfg->segment_chunk_bytes >= limit) /* chunking off: whole segments */
        return limit > needed ? limit : needed;
    uint64_t cap = capacity;
    while (cap < needed) {
        uint64_t step = cap < SEGMENT_FIRST_CHUNK ? SEGMENT_FIRST_CHUNK : cap;
        cap += step < cfg->segment_chunk_bytes ? step : cfg->segment_chunk_bytes;
    }
    if (cap > limit)
        cap = limit > needed ? limit : needed;
    return cap;
}

/* Bytes of an index file covering a segment of capacity bytes. */
static uint64_t index_bytes_for(const comet_config *cfg, uint64_t capacity)
{
    return capacity / cfg->index_interval_bytes * 16 + 4096;
}

/* Makes room for `total` more bytes in the active segment (under the append
 * lock): grows its file by the next chunk while it is below segment_bytes (or
 * is empty and one batch needs more), else rotates to a new segment (or makes
 * the shard's first).  Unless may_sleep, it returns COMET_E_WOULD_BLOCK having
 * changed nothing instead of rotating (a rotation creates and syncs files) or
 * deleting segments for the shard's size limit. */
static int make_room(shard *sh, uint64_t total, int may_sleep)
{
    state_file *st = sh->st;
    const comet_config *cfg = shard_config(sh);
    int rc = writer_segment(sh);
    if (rc)
        return rc;
    uint64_t end = atomic_load_explicit(&st->active_end, memory_order_relaxed);
    if (sh->active && end + total <= sh->active->capacity)
        return 0;
    if (sh->active && end + total <= segment_refresh_capacity(sh->active, sh->dir))
        return 0; /* another process grew it */
    uint64_t limit = cfg->segment_bytes;
    uint64_t next = atomic_load_explicit(&st->next_entry, memory_order_relaxed);
    if (sh->active && (end + total <= limit || next == sh->active->base)) {
        uint64_t have = sh->active->capacity;
        uint64_t capacity = grown_capacity(cfg, have, end + total, limit);
        int reserved;
        if ((rc = enforce_shard_limit(sh, capacity - have, may_sleep)) ||
            (rc = reserve_budget(sh, capacity - have, &reserved)))
            return rc;
        int remap;
        rc = segment_grow(sh->active, sh->dir, capacity, next == sh->active->base, &remap);
        if (reserved)
            usage_allocated(sh->stream->db, capacity - have, rc == 0);
        if (rc)
            return rc;
        if (remap)
            atomic_fetch_add_explicit(&st->active_gen, 1, memory_order_release);
    } else {
        /* A rotation waits; a shard's first segment does not: like growing
         * one, it is file creation only (two files, nothing synced), and the
         * appends that never wait would otherwise all go to a thread for the
         * first entry of every shard. */
        int first = !sh->active && atomic_load_explicit(&st->active_end, memory_order_relaxed) == 0;
        if (!may_sleep && !first)
            return COMET_E_WOULD_BLOCK;
        if ((rc = presence_check(sh)))
            return rc;
        uint64_t need = SEGMENT_DATA_OFFSET + total;
        uint64_t capacity = grown_capacity(cfg, 0, need, limit);
        uint64_t coverage = limit > need ? limit : need;
        uint64_t index_bytes = index_bytes_for(cfg, coverage);
        uint64_t spare = recycle_spare_bytes(sh);
        if ((rc = enforce_shard_limit(sh, (spare >= need ? spare : capacity) + index_bytes,
                                      may_sleep)))
            return rc;
        /* The spare (perhaps just made by the limit above) is disk the budget
         * counts already: only the new index needs room then. */
        spare = recycle_spare_bytes(sh);
        int reserved;
        uint64_t new_bytes = (spare >= need ? 0 : capacity) + index_bytes;
        if ((rc = reserve_budget(sh, new_bytes, &reserved)))
            return rc;
        int64_t taken = spare >= need ? recycle_take(sh, next, need, coverage,
                                                     cfg->index_interval_bytes) : 0;
        rc = taken < 0 ? (int)taken
                       : taken > 0 ? 0
                                   : segment_create(sh->dir, sh->id, next, capacity, coverage,
                                                    cfg->index_interval_bytes);
        if (reserved)
            usage_allocated(sh->stream->db, new_bytes, rc == 0);
        if (rc)
            return rc;
        if (taken > 0)
            wc_add(st, WC_RECYCLED_SEGMENTS, 1);
        cut_point(CUT_ROTATE_CREATED);
        if (atomic_load_explicit(&st->active_end, memory_order_relaxed))
            wc_add(st, WC_ROTATIONS, 1);
        /* A recycled file's blocks are written already: no zero fill. */
        start_segment(st, next, taken > 0 ? (uint64_t)taken : SEGMENT_DATA_OFFSET);
        cut_point(CUT_ROTATE_STARTED);
        /* A file the limit kept above becomes the spare once the flusher has
         * synced the directory: now, after the spare was taken (a settle
         * that still saw it would unlink the kept file, one spare being
         * all a rotation takes), not at its next pass. */
        if (recycle_pending(sh))
            flusher_settle_soon(sh);
    }
    rc = writer_segment(sh);
    if (!rc && (!sh->active || atomic_load(&st->active_end) + total > sh->active->capacity))
        rc = set_error(COMET_E_IO, "segment %" PRIu64 " of %s has no room after growing it", next,
                       sh->dir);
    return rc;
}

/* Pages of a preallocated file are unwritten extents; the first mapped store
 * to each costs a filesystem conversion (~2-3 us here).  Writing zeros with
 * pwrite a window ahead converts them in bulk and makes later faults cheap. */
static void zero_ahead(shard *sh, uint64_t from, uint64_t to)
{
    state_file *st = sh->st;
    uint64_t zeroed = atomic_load_explicit(&st->zeroed_end, memory_order_relaxed);
    if (to <= zeroed)
        return;
    if (zeroed < from)
        zeroed = from;
    uint64_t target = (to + ZERO_AHEAD_BYTES) & ~(ZERO_AHEAD_BYTES - 1);
    if (target > sh->active->capacity)
        target = sh->active->capacity;
    if (zero_fill(sh->active->fd, zeroed, target) == 0)
        atomic_store_explicit(&st->zeroed_end, target, memory_order_relaxed);
}

/* ---- append --------------------------------------------------------------- */

static int resolve_durability(const shard *sh, int durability)
{
    return durability < 0 ? shard_config(sh)->durability : durability;
}

/* "interval" promises a bound: when the last sync of the shard is older than
 * twice the interval at `now` (the flusher fell behind), an append syncs. */
static int interval_sync_due(const shard *sh, int mode, int64_t now)
{
    if (mode != COMET_DURABILITY_INTERVAL)
        return 0;
    int64_t last = atomic_load_explicit(&sh->st->last_sync_ns, memory_order_relaxed);
    return last && now - last > 2 * (int64_t)shard_config(sh)->fsync_interval_ms * 1000000;
}

/* Zero-fills ahead when `total` more bytes pass the zeroed pages; *slow is
 * set when that or a new mapping (active_gen moved since gen_before) happened. */
static void zero_fill_for(shard *sh, uint64_t total, uint64_t gen_before, int *slow)
{
    state_file *st = sh->st;
    uint64_t end = atomic_load_explicit(&st->active_end, memory_order_relaxed) + total;
    if (end > atomic_load_explicit(&st->zeroed_end, memory_order_relaxed)) {
        zero_ahead(sh, end - total, end);
        *slow = 1;
    }
    *slow |= gen_before != atomic_load_explicit(&st->active_gen, memory_order_relaxed);
}

/* The lock, refused for a shard this process saw go (the repair a pending
 * recovery runs at the lock would only meet the missing files), its repair's
 * failure explained like any step's. */
static int lock_unless_gone(shard *sh, int *slow)
{
    int rc = presence_refusal(sh);
    if (!rc && (rc = shard_lock_noting_wait(sh, slow)))
        rc = presence_explain(sh, rc);
    return rc;
}

/* The blocking way in: the lock (waiting for it), then room for `total` more
 * bytes, freeing the oldest data of the directory when over its budget.
 * *slow is set when anything but memory stores happened. */
static int lock_with_room(shard *sh, uint64_t total, int *slow)
{
    state_file *st = sh->st;
    int rc = lock_unless_gone(sh, slow);
    if (rc)
        return rc;
    if ((rc = shard_check_deleted(sh)) || (rc = presence_refusal(sh))) {
        shard_unlock(sh);
        return rc;
    }
    uint64_t gen_before = atomic_load_explicit(&st->active_gen, memory_order_relaxed);
    budget_short = 0;
    rc = make_room(sh, total, 1);
    for (int attempt = 0; rc == COMET_E_STORAGE_FULL && budget_short && attempt < 8; attempt++) {
        /* Over the directory's budget and this shard has nothing more to
         * delete: free the oldest data of the whole directory, whatever
         * process owns it.  That takes other shards' locks, so this one is
         * let go meanwhile (never two locks at once: no lock order to break),
         * and everything is read again once it is back.  Another appender
         * may take the room freed first: then again, while deleting frees
         * something. */
        shard_unlock(sh);
        uint64_t freed = retention_free_oldest(sh->stream->db, sh, budget_short, now_ns(),
                                               &budget_protected);
        if ((rc = lock_unless_gone(sh, slow)))
            return rc;
        if ((rc = shard_check_deleted(sh)) || (rc = presence_refusal(sh))) {
            shard_unlock(sh);
            return rc;
        }
        if (!freed) /* nothing else may go: this shard's own spare is the last resort */
            freed = recycle_drop(sh);
        *slow = 1;
        int last = attempt > 0 && !freed;
        budget_short = 0;
        rc = make_room(sh, total, 1);
        if (last)
            break;
    }
    budget_short = budget_protected = 0;
    if (rc) {
        rc = presence_explain(sh, rc);
        shard_unlock(sh);
        if (rc == COMET_E_STORAGE_FULL)
            sc_add(st, SC_STORAGE_FULL_ERRORS, 1);
        return rc;
    }
    zero_fill_for(sh, total, gen_before, slow);
    return 0;
}

/* The way in that never sleeps: the lock if it is free and the shard needs no
 * repair; room made on the active segment (map, grow, zero fill); a rotation,
 * or room only deleting segments would give, refused: COMET_E_WOULD_BLOCK,
 * nothing changed. */
static int lock_without_sleeping(shard *sh, uint64_t total, int *slow)
{
    state_file *st = sh->st;
    if (shard_trylock_clean(sh))
        return COMET_E_WOULD_BLOCK;
    int rc = shard_check_deleted(sh);
    rc = rc ? rc : presence_refusal(sh);
    uint64_t gen_before = atomic_load_explicit(&st->active_gen, memory_order_acquire);
    uint64_t end = atomic_load_explicit(&st->active_end, memory_order_relaxed) + total;
    if (!rc && sh->active && sh->active_gen == gen_before && end <= sh->active->capacity &&
        end <= atomic_load_explicit(&st->zeroed_end, memory_order_relaxed))
        return 0; /* the common case: room and zeroed pages in the mapped segment */
    if (!rc) {
        budget_short = 0;
        rc = make_room(sh, total, 0);
        if (rc == COMET_E_STORAGE_FULL && budget_short)
            rc = COMET_E_WOULD_BLOCK; /* the waiting way frees the oldest data */
        budget_short = budget_protected = 0;
    }
    if (rc) {
        rc = presence_explain(sh, rc);
        shard_unlock(sh);
        return rc;
    }
    zero_fill_for(sh, total, gen_before, slow);
    return 0;
}

/* A replay of the batch an idempotency key stored: nothing written; under
 * "always" it returns once that batch is durable, as the first attempt did. */
static int64_t replay(shard *sh, int sync_mode, key_hit hit, uint32_t *replayed)
{
    wc_add(sh->st, WC_KEY_REPLAYS, 1); /* a writer counter: under the append lock */
    shard_unlock(sh);
    if (sync_mode == COMET_DURABILITY_ALWAYS) {
        int rc = shard_sync(sh, hit.first + hit.count);
        if (rc)
            return rc;
    }
    *replayed = hit.count;
    return (int64_t)hit.first;
}

int64_t shard_append(shard *sh, const entry_batch *b, int durability, int mode,
                     const comet_idempotency *idem, uint32_t *replayed)
{
    const entry_ref *refs = b->refs;
    uint32_t count = b->count;
    uint64_t total_bytes = b->total;
    state_file *st = sh->st;
    int64_t t0 = now_ns();
    lru_stamp(sh, t0);
    int sync_mode = resolve_durability(sh, durability);
    int nowait = mode == COMET_APPEND_NOWAIT;
    int slow = count > 1, rc = shard_sync_refusal(sh);
    if (replayed)
        *replayed = 0;
    if (rc)
        return rc;
    if (nowait) {
        /* What would wait after the write is refused before it.  The due
         * sync is judged at t0 below too: last_sync_ns only grows, so an
         * append let in here never syncs. */
        if (sync_mode == COMET_DURABILITY_ALWAYS || interval_sync_due(sh, sync_mode, t0))
            rc = COMET_E_WOULD_BLOCK;
        else
            rc = lock_without_sleeping(sh, total_bytes, &slow);
        if (rc == COMET_E_WOULD_BLOCK)
            clear_error(); /* no detail but comet_strerror's: nothing went wrong */
    } else if (!(sync_mode == COMET_DURABILITY_ALWAYS && (rc = presence_check(sh)))) {
        rc = lock_with_room(sh, total_bytes, &slow);
    }
    if (rc)
        return rc;
    segment *seg = sh->active;
    uint64_t off = atomic_load_explicit(&st->active_end, memory_order_relaxed);
    uint64_t first = atomic_load_explicit(&st->next_entry, memory_order_relaxed);
    uint64_t end = off + total_bytes;
    if (end > atomic_load_explicit(&st->write_hwm, memory_order_relaxed))
        atomic_store_explicit(&st->write_hwm, end, memory_order_relaxed);
    int64_t last_ts = atomic_load_explicit(&st->last_ts, memory_order_relaxed);
    int64_t ts = t0 > last_ts ? t0 : last_ts;
    uint32_t keyed = 0;
    if (idem) {
        key_hit hit;
        rc = keys_find(sh, idem, nowait, t0, &hit);
        if (rc == 0 && (rc = keys_record(sh, idem, first, count, ts)) == 0)
            cut_point(CUT_APPEND_KEYED);
        if (rc == 1)
            return replay(sh, sync_mode, hit, replayed);
        if (rc) {
            if (rc == COMET_E_WOULD_BLOCK)
                clear_error();
            shard_unlock(sh);
            return rc;
        }
        keyed = ENTRY_FLAG_KEYED;
    }

    /* Entries go four at a time.  Per entry only what the batch asks for:
     * flags when it holds compressed entries, and a sparse index record once
     * a group passes the offset where the next one is due (note_from). */
    uint64_t entry = first, note_from = index_note_from(seg);
    int cuts = cut_points_live();
    for (uint32_t i = 0; i < count; i += 4) {
        uint32_t k = count - i < 4 ? count - i : 4, flags[4] = {0, 0, 0, 0};
        for (uint32_t j = 0; b->compressed && j < k; j++)
            if (refs[i + j].flags & COMET_ENTRY_COMPRESSED)
                flags[j] = ENTRY_FLAG_ZSTD;
        if (i + k == count)
            flags[k - 1] |= ENTRY_FLAG_BATCH_END | keyed;
        uint64_t at = off;
        off += entry_write_group(seg->wmap + off, seg->version, refs + i, k, entry, ts, flags);
        for (uint32_t j = 0; off > note_from && j < k; j++) {
            if (at >= note_from) {
                index_note(seg, entry + j - seg->base, at, ts);
                note_from = index_note_from(seg);
            }
            at += ENTRY_HEADER_BYTES + refs[i + j].len;
        }
        entry += k;
        if (cuts)
            cut_point_hit(entry < first + count ? CUT_APPEND_MID_BATCH : CUT_APPEND_WRITTEN);
    }
    segment_release_behind(seg, end);
    atomic_store_explicit(&st->active_end, end, memory_order_relaxed);
    atomic_store_explicit(&st->last_ts, ts, memory_order_relaxed);
    wc_add(st, WC_APPENDS, 1);
    wc_add(st, WC_APPENDED_ENTRIES, count);
    wc_add(st, WC_APPENDED_RAW_BYTES, b->raw);
    wc_add(st, WC_APPENDED_STORED_BYTES, total_bytes);
    if (b->compressed)
        wc_add(st, WC_COMPRESSED_ENTRIES, b->compressed);
    if (sync_mode != COMET_DURABILITY_ALWAYS) /* acknowledged as soon as it returns */
        atomic_store_explicit(&st->acked_end, entry, memory_order_relaxed);
    atomic_store_explicit(&st->next_entry, entry, memory_order_release);
    /* Latency: every append that waited for the lock, rotated, zero-filled or
     * carried a batch is timed; of the plain single appends one in
     * LATENCY_SAMPLE is, and counts for LATENCY_SAMPLE (a clock read costs a
     * quarter of such an append).  Sum and count stay unbiased; max covers
     * every slow append. */
    uint64_t appends = wc_get(st, WC_APPENDS);
    int64_t t1 = 0;
    if (slow || appends % LATENCY_SAMPLE == 0) {
        t1 = now_ns();
        uint64_t weight = slow ? 1 : LATENCY_SAMPLE;
        uint64_t latency = t1 > t0 ? (uint64_t)(t1 - t0) : 0;
        wc_add(st, WC_LATENCY_SUM_NS, latency * weight);
        wc_add(st, WC_LATENCY_COUNT, weight);
        if (latency > wc_get(st, WC_LATENCY_MAX_NS))
            atomic_store_explicit(&st->writer[WC_LATENCY_MAX_NS], latency, memory_order_relaxed);
    }
    shard_unlock(sh);

    if (sync_mode == COMET_DURABILITY_ALWAYS) {
        rc = shard_sync(sh, entry);
        if (rc)
            return rc;
    } else {
        if (!atomic_load_explicit(&sh->dirty, memory_order_relaxed))
            atomic_store_explicit(&sh->dirty, 1, memory_order_relaxed);
        /* This append's entries are committed and acknowledged whatever the
         * sync says: a failure marks the shard, and the appends after it are
         * refused (a retry of this one would store it twice). */
        if (interval_sync_due(sh, sync_mode, nowait || !t1 ? t0 : t1) && shard_sync(sh, entry))
            clear_error();
    }
    return (int64_t)first;
}
