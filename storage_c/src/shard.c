/*
 * shard.c - one shard: opening it, its append lock, and the append path.
 *
 * Appending (any process, any thread):
 *   1. take the shard's append lock (a robust mutex in the mapped state);
 *      if its previous holder died, repair the tail first (recovery.c);
 *   2. make sure the active segment has room, rotating or creating one;
 *   3. zero-fill ahead of the write position when needed (cheap page faults);
 *   4. write every entry (header + payload + CRC) through the mapping, noting
 *      sparse index records on the way; the last entry carries "batch end";
 *   5. publish: end offset, then next_entry with release order;
 *   6. unlock; with durability "always", join a group commit (durability.c).
 * Nothing but memory stores happens under the lock in the common case.
 *
 * Writes go through a shared mapping rather than pwrite: one pwrite costs
 * about 1 us here, a mapped single-entry append about 100 ns, and a mapped
 * 1000-entry batch (zero-filled ahead) beat a staged pwrite of the same bytes
 * by a third in a measurement on this kind of machine.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "errors.h"
#include "internal.h"

#define ZERO_AHEAD_BYTES ((uint64_t)1 << 20)
#define LATENCY_SAMPLE 16

static const comet_config *shard_config(const shard *sh)
{
    return &sh->stream->db->cfg;
}

/* ---- open and close ------------------------------------------------------- */

int shard_open(comet_stream *stream, uint32_t id, shard **out)
{
    shard *sh = sys_calloc(1, sizeof *sh);
    if (!sh)
        return set_error(COMET_E_NOMEM, "out of memory opening a shard");
    sh->stream = stream;
    sh->id = id;
    sh->state_fd = -1;
    sh->offsets_fd = -1;
    pthread_mutex_init(&sh->cache_lock, NULL);
    int rc = path_format(sh->dir, "%s/shard-%04u", stream->dir, id);
    if (rc) {
        rc = set_error(COMET_E_INVALID, "path of shard %u of %s is too long", id, stream->dir);
        goto fail;
    }
    if (sys_mkdir(sh->dir, 0755) == 0) {
        int err = fsync_dir(stream->dir); /* the new shard's name must survive a power cut */
        if (err) {
            rc = set_errno_error(err, "cannot sync %s", stream->dir);
            goto fail;
        }
    } else if (errno != EEXIST) {
        rc = set_errno_error(errno, "cannot create %s", sh->dir);
        goto fail;
    }
    char path[COMET_PATH_MAX];
    path_format(path, "%s/%s", sh->dir, STATE_NAME); /* sh->dir leaves room: see comet_open */
    sh->state_fd = sys_open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (sh->state_fd < 0) {
        rc = set_errno_error(errno, "cannot open %s", path);
        goto fail;
    }
    /* Openers are serialised: state validation, lock re-initialisation after
     * a reboot, and the first recovery happen one process at a time. */
    while (flock(sh->state_fd, LOCK_EX) && errno == EINTR)
        ;
    int rebuilt = 0;
    rc = state_open(sh, &rebuilt);
    if (!rc)
        rc = offsets_open(sh);
    if (!rc) {
        rc = pthread_mutex_lock(&sh->st->append_lock.mutex);
        if (rc == EOWNERDEAD) {
            sc_add(sh->st, SC_LOCK_OWNER_DIED, 1);
            pthread_mutex_consistent(&sh->st->append_lock.mutex);
            rc = 0;
        }
        if (rc)
            rc = set_errno_error(rc, "cannot lock %s", sh->dir);
        else {
            rc = recovery_repair_tail(sh, rebuilt);
            pthread_mutex_unlock(&sh->st->append_lock.mutex);
        }
    }
    flock(sh->state_fd, LOCK_UN);
    close(sh->state_fd);
    sh->state_fd = -1;
    if (rc)
        goto fail;
    *out = sh;
    return 0;
fail:
    shard_close(sh);
    return rc;
}

void shard_release(shard *sh)
{
    shard_segments_clear(sh);
    offsets_close(sh);
    state_close(sh);
}

void shard_close(shard *sh)
{
    if (!sh)
        return;
    shard_release(sh);
    pthread_mutex_destroy(&sh->cache_lock);
    if (sh->state_fd >= 0)
        close(sh->state_fd);
    free(sh);
}

/* ---- the append lock ------------------------------------------------------ */

int shard_lock(shard *sh)
{
    return shard_lock_noting_wait(sh, NULL);
}

int shard_lock_noting_wait(shard *sh, int *waited)
{
    state_file *st = sh->st;
    int rc = pthread_mutex_trylock(&st->append_lock.mutex);
    if (rc == EBUSY) {
        if (waited)
            *waited = 1;
        rc = pthread_mutex_lock(&st->append_lock.mutex);
    }
    if (rc == EOWNERDEAD) {
        /* The holder died mid-append: its partial batch must not survive.
         * Mark the lock usable at once (a failed repair must never leave it
         * unrecoverable) and let the repair below, or the next locker's, run. */
        sc_add(st, SC_LOCK_OWNER_DIED, 1);
        atomic_store(&st->recovery_pending, 1);
        pthread_mutex_consistent(&st->append_lock.mutex);
        rc = 0;
    }
    if (rc)
        return set_errno_error(rc, "cannot lock shard %s", sh->dir);
    if (atomic_load_explicit(&st->recovery_pending, memory_order_relaxed)) {
        rc = recovery_repair_tail(sh, 0);
        if (rc) {
            pthread_mutex_unlock(&st->append_lock.mutex);
            return rc;
        }
    }
    return 0;
}

/* The append lock if it is free now and the shard needs no repair; else
 * nonzero.  A dead holder found this way is left for a real locker to repair. */
int shard_trylock_clean(shard *sh)
{
    state_file *st = sh->st;
    int rc = pthread_mutex_trylock(&st->append_lock.mutex);
    if (rc == EOWNERDEAD) {
        sc_add(st, SC_LOCK_OWNER_DIED, 1);
        atomic_store(&st->recovery_pending, 1);
        pthread_mutex_consistent(&st->append_lock.mutex);
        pthread_mutex_unlock(&st->append_lock.mutex);
        return EBUSY;
    }
    if (rc)
        return rc;
    if (atomic_load(&st->recovery_pending)) {
        pthread_mutex_unlock(&st->append_lock.mutex);
        return EBUSY;
    }
    return 0;
}

void shard_unlock(shard *sh)
{
    pthread_mutex_unlock(&sh->st->append_lock.mutex);
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

static void start_segment(state_file *st, uint64_t base)
{
    atomic_store_explicit(&st->active_base, base, memory_order_relaxed);
    atomic_store_explicit(&st->active_end, SEGMENT_DATA_OFFSET, memory_order_relaxed);
    atomic_store_explicit(&st->write_hwm, SEGMENT_DATA_OFFSET, memory_order_relaxed);
    atomic_store_explicit(&st->zeroed_end, SEGMENT_DATA_OFFSET, memory_order_relaxed);
    atomic_fetch_add_explicit(&st->active_gen, 1, memory_order_release);
}

/* Bytes the last failed budget check of this thread was short by, and the
 * segments consumer groups kept when the directory-wide pass tried to free them. */
static _Thread_local uint64_t budget_short, budget_protected;

/* Keeps the data directory inside retention_max_total_bytes: new_bytes of
 * new segment space must fit in the shared estimate (usage.c), which reserves
 * them; *reserved then tells the caller to call usage_allocated once the file
 * is created or grown.  The per-shard size limit is applied here too, as
 * policy (it never fails). */
static int enforce_budget(shard *sh, uint64_t new_bytes, int *reserved)
{
    *reserved = 0;
    const comet_config *cfg = shard_config(sh);
    int64_t now = now_ns();
    if (cfg->retention_max_shard_bytes &&
        retention_shard_bytes(sh) + new_bytes > cfg->retention_max_shard_bytes) {
        int rc = retention_shard(sh, 0, now, NULL);
        if (rc)
            return rc;
    }
    uint64_t budget = cfg->retention_max_total_bytes;
    if (!budget)
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
 * is empty and one batch needs more), else rotates to a new segment. */
static int make_room(shard *sh, uint64_t total)
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
        rc = enforce_budget(sh, capacity - have, &reserved);
        if (rc)
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
        uint64_t need = SEGMENT_DATA_OFFSET + total;
        uint64_t capacity = grown_capacity(cfg, 0, need, limit);
        uint64_t coverage = limit > need ? limit : need;
        int reserved;
        rc = enforce_budget(sh, capacity + index_bytes_for(cfg, coverage), &reserved);
        if (rc)
            return rc;
        rc = segment_create(sh->dir, sh->id, next, capacity, coverage, cfg->index_interval_bytes);
        if (reserved)
            usage_allocated(sh->stream->db, capacity + index_bytes_for(cfg, coverage), rc == 0);
        if (rc)
            return rc;
        if (sh->active)
            wc_add(st, WC_ROTATIONS, 1);
        start_segment(st, next);
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

int64_t shard_append(shard *sh, const entry_ref *refs, uint32_t count, uint64_t total_bytes,
                     uint64_t raw_bytes, int durability)
{
    state_file *st = sh->st;
    int64_t t0 = now_ns();
    int slow = count > 1;
    int rc = shard_lock_noting_wait(sh, &slow);
    if (rc)
        return rc;
    if ((rc = shard_check_deleted(sh))) {
        shard_unlock(sh);
        return rc;
    }
    uint64_t gen_before = atomic_load_explicit(&st->active_gen, memory_order_relaxed);
    budget_short = 0;
    rc = make_room(sh, total_bytes);
    for (int attempt = 0; rc == COMET_E_STORAGE_FULL && budget_short && attempt < 8; attempt++) {
        /* Over the directory's budget and this shard has nothing more to
         * delete: free the oldest data of the whole directory, whatever
         * process owns it.  That takes other shards' locks, so this one is
         * let go meanwhile (never two locks at once: no lock order to break),
         * and everything is read again once it is back.  Another appender
         * may take the room freed first: then again, while deleting frees
         * something. */
        shard_unlock(sh);
        uint64_t freed = retention_free_oldest(sh->stream->db, budget_short, now_ns(),
                                               &budget_protected);
        if ((rc = shard_lock_noting_wait(sh, &slow)))
            return rc;
        if ((rc = shard_check_deleted(sh))) {
            shard_unlock(sh);
            return rc;
        }
        slow = 1;
        int last = attempt > 0 && !freed;
        budget_short = 0;
        rc = make_room(sh, total_bytes);
        if (last)
            break;
    }
    budget_short = budget_protected = 0;
    if (rc) {
        shard_unlock(sh);
        if (rc == COMET_E_STORAGE_FULL)
            sc_add(st, SC_STORAGE_FULL_ERRORS, 1);
        return rc;
    }
    segment *seg = sh->active;
    uint64_t off = atomic_load_explicit(&st->active_end, memory_order_relaxed);
    uint64_t first = atomic_load_explicit(&st->next_entry, memory_order_relaxed);
    uint64_t end = off + total_bytes;
    if (end > atomic_load_explicit(&st->zeroed_end, memory_order_relaxed)) {
        zero_ahead(sh, off, end);
        slow = 1;
    }
    if (end > atomic_load_explicit(&st->write_hwm, memory_order_relaxed))
        atomic_store_explicit(&st->write_hwm, end, memory_order_relaxed);
    int64_t last_ts = atomic_load_explicit(&st->last_ts, memory_order_relaxed);
    int64_t ts = t0 > last_ts ? t0 : last_ts;

    uint64_t entry = first, compressed = 0;
    for (uint32_t i = 0; i < count; i += 4) {
        uint32_t k = count - i < 4 ? count - i : 4, flags[4];
        for (uint32_t j = 0; j < k; j++) {
            const entry_ref *r = &refs[i + j];
            flags[j] = (i + j + 1 == count) ? ENTRY_FLAG_BATCH_END : 0;
            if (r->flags & COMET_ENTRY_COMPRESSED) {
                flags[j] |= ENTRY_FLAG_ZSTD;
                compressed++;
            }
        }
        uint64_t at = off;
        for (uint32_t j = 0; j < k; j++) {
            index_note(seg, entry + j - seg->base, at, ts);
            at += ENTRY_HEADER_BYTES + refs[i + j].len;
        }
        off += entry_write_group(seg->wmap + off, refs + i, k, entry, ts, flags);
        entry += k;
    }
    segment_release_behind(seg, end);
    atomic_store_explicit(&st->active_end, end, memory_order_relaxed);
    atomic_store_explicit(&st->last_ts, ts, memory_order_relaxed);
    wc_add(st, WC_APPENDS, 1);
    wc_add(st, WC_APPENDED_ENTRIES, count);
    wc_add(st, WC_APPENDED_RAW_BYTES, raw_bytes);
    wc_add(st, WC_APPENDED_STORED_BYTES, total_bytes);
    if (compressed)
        wc_add(st, WC_COMPRESSED_ENTRIES, compressed);
    atomic_store_explicit(&st->next_entry, entry, memory_order_release);
    /* Latency: every append that waited for the lock, rotated, zero-filled or
     * carried a batch is timed; of the plain single appends one in
     * LATENCY_SAMPLE is, and counts for LATENCY_SAMPLE (a clock read costs a
     * quarter of such an append).  Sum and count stay unbiased; max covers
     * every slow append. */
    uint64_t appends = wc_get(st, WC_APPENDS);
    slow |= gen_before != atomic_load_explicit(&st->active_gen, memory_order_relaxed);
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

    int mode = resolve_durability(sh, durability);
    if (mode == COMET_DURABILITY_ALWAYS) {
        rc = shard_sync(sh, entry);
        if (rc)
            return rc;
    } else {
        if (!atomic_load_explicit(&sh->dirty, memory_order_relaxed))
            atomic_store_explicit(&sh->dirty, 1, memory_order_relaxed);
        /* "interval" promises a bound: if the flusher fell behind, sync here. */
        if (mode == COMET_DURABILITY_INTERVAL) {
            int64_t last = atomic_load_explicit(&st->last_sync_ns, memory_order_relaxed);
            int64_t bound = 2 * (int64_t)shard_config(sh)->fsync_interval_ms * 1000000;
            if (last && (t1 ? t1 : t0) - last > bound) {
                rc = shard_sync(sh, entry);
                if (rc)
                    return rc;
            }
        }
    }
    return (int64_t)first;
}
