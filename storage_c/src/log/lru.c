/*
 * lru.c - a bounded number of open shards per process.
 *
 * An open shard holds descriptors (its state file, offsets file, one per
 * mapped segment, its keys file once keyed) and mappings.  A process that
 * touches thousands of shards - thousands of streams of 16 shards each -
 * would run out of descriptors and memory if every shard it ever used stayed
 * open, so this process keeps at most a budget of shards open and closes the
 * least recently used idle one to open another.  Closing is what comet_close
 * does for one shard (state marked closed cleanly when this process was its
 * last holder), so reopening later is an ordinary open; a closed shard costs
 * only its small struct, which stays published in stream->shards.
 *
 * Entering a shard and closing it race without a lock on the entry path (a
 * Dekker pair of sequentially consistent operations): a thread entering
 * increments the shard's users, then checks that it is SHARD_OPEN; the
 * evictor, holding the stream's open_lock, stores SHARD_CLOSING, then checks
 * that users is zero.  At least one of the two sees the other: the entering
 * thread backs off and reopens under open_lock (waiting for the evictor), or
 * the evictor gives up on that shard.
 *
 * Trade-offs: the recency is a clock stamp per shard (lru_stamp, log.h:
 * an append's own clock read, the coarse clock for other uses) rather than a
 * list moved on every use (no shared cache line written per append), so the
 * victim is found by a scan of the open shards - at most the budget, and only
 * when a shard is opened over it.  Idle shards whose data is synced are
 * closed first.  When every idle shard is dirty (many shards written within
 * one flush interval), the opener goes over the budget, by a quarter at
 * most, rather than sync one (a device flush in a request's path); the
 * flusher, having synced them, closes the least recently used back down to
 * the budget.  Only at that ceiling does an opener sync a victim.  Group handles
 * name their shard's struct and enter it through shard_acquire, so a closed
 * shard is reopened under them.  When every open shard is in use the open
 * fails with COMET_E_TOO_MANY_OPEN (the gateway's 503): the budget bounds
 * handles, it never waits for one to be released.
 */
#include <errno.h>
#include <stdlib.h>
#include <sys/resource.h>

#include "log.h"

#define LRU_DEFAULT_MAX 256u
#define LRU_FDS_PER_SHARD 4u  /* state, offsets, the active segment, keys */
#define LRU_FDS_RESERVED 128u /* sockets, logs, the rest of the process */
#define LRU_MIN 4u

uint32_t lru_budget(const comet_config *cfg)
{
    if (cfg->max_open_shards)
        return cfg->max_open_shards;
    struct rlimit rl;
    uint64_t budget = LRU_DEFAULT_MAX;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
        uint64_t room = rl.rlim_cur > LRU_FDS_RESERVED ? rl.rlim_cur - LRU_FDS_RESERVED : 0;
        if (room / LRU_FDS_PER_SHARD < budget)
            budget = room / LRU_FDS_PER_SHARD;
    }
    return budget < LRU_MIN ? LRU_MIN : (uint32_t)budget;
}

void lru_add(shard *sh)
{
    comet_db *db = sh->stream->db;
    lru_touch(sh);
    pthread_mutex_lock(&db->lru_lock);
    sh->lru_prev = NULL;
    sh->lru_next = db->lru_head;
    if (db->lru_head)
        db->lru_head->lru_prev = sh;
    db->lru_head = sh;
    db->open_shards++;
    pthread_mutex_unlock(&db->lru_lock);
}

static void lru_unlink(shard *sh)
{
    comet_db *db = sh->stream->db;
    pthread_mutex_lock(&db->lru_lock);
    if (sh->lru_prev)
        sh->lru_prev->lru_next = sh->lru_next;
    else if (db->lru_head == sh)
        db->lru_head = sh->lru_next;
    if (sh->lru_next)
        sh->lru_next->lru_prev = sh->lru_prev;
    sh->lru_prev = sh->lru_next = NULL;
    db->open_shards--;
    pthread_mutex_unlock(&db->lru_lock);
}

void lru_close_shard(shard *sh)
{
    if (atomic_load(&sh->open) == SHARD_CLOSED)
        return;
    lru_unlink(sh);
    shard_release(sh);
    atomic_store(&sh->open, SHARD_CLOSED);
}

/* Closes sh if no thread is inside it: 1 when closed.  The caller holds no
 * lock: waiting for the stream's open_lock (another thread opening one of its
 * shards) cannot close a cycle, as nothing holding an open_lock closes shards
 * to make room. */
static int try_close(shard *sh)
{
    comet_stream *s = sh->stream;
    pthread_mutex_lock(&s->open_lock);
    int closed = 0;
    int expect = SHARD_OPEN;
    if (atomic_compare_exchange_strong(&sh->open, &expect, SHARD_CLOSING)) {
        if (atomic_load(&sh->users) == 0) {
            /* Nobody can enter now: what this process appended is synced
             * before the files go (the flusher only syncs open shards). */
            int synced = 1;
            if (atomic_load(&sh->dirty) &&
                shard_sync(sh, atomic_load_explicit(&sh->st->next_entry, memory_order_acquire)))
                synced = 0;
            if (synced && atomic_load(&sh->offsets_dirty) && offsets_sync(sh))
                synced = 0;
            if (synced) {
                lru_close_shard(sh);
                closed = 1;
            } else {
                clear_error(); /* the next flusher pass says it: the shard is marked */
            }
        }
        if (!closed)
            atomic_store(&sh->open, SHARD_OPEN);
    }
    pthread_mutex_unlock(&s->open_lock);
    return closed;
}

#define LRU_TRIES 16

/* Holds data or offsets this process has not synced yet. */
static int unsynced(shard *sh)
{
    return atomic_load(&sh->dirty) || atomic_load(&sh->offsets_dirty);
}

static int tried(shard *const *failed, int n, const shard *sh)
{
    for (int i = 0; i < n; i++)
        if (failed[i] == sh)
            return 1;
    return 0;
}

/* The least recently used open shard nobody is inside and not tried yet,
 * preferring clean ones; NULL when there is none.  Under lru_lock.  Shards
 * opened or read within one tick of the coarse clock (1-10 ms, by the kernel)
 * share a stamp: of those, the one opened first (the list runs newest first). */
static shard *pick_victim(comet_db *db, shard *const *failed, int nfailed)
{
    shard *best = NULL;
    int best_dirty = 1;
    int64_t best_used = 0;
    for (shard *sh = db->lru_head; sh; sh = sh->lru_next) {
        if (atomic_load(&sh->users) || atomic_load(&sh->open) != SHARD_OPEN ||
            tried(failed, nfailed, sh))
            continue;
        int64_t used = atomic_load_explicit(&sh->last_used, memory_order_relaxed);
        int dirty = unsynced(sh);
        if (!best || dirty < best_dirty || (dirty == best_dirty && used <= best_used)) {
            best = sh;
            best_dirty = dirty;
            best_used = used;
        }
    }
    return best;
}

/* Over the budget while the idle shards are all dirty, up to this many. */
static uint32_t lru_ceiling(const comet_db *db)
{
    return db->open_budget + (db->open_budget + 3) / 4;
}

int lru_make_room(comet_db *db)
{
    shard *failed[LRU_TRIES]; /* entered again meanwhile, or its sync failed: passed over */
    int nfailed = 0;
    /* A victim another thread closed first is no failure (the budget is
     * checked again), but racing openers may keep taking the room made: the
     * rounds are bounded too. */
    for (uint32_t rounds = 0; nfailed < LRU_TRIES && rounds < 4 * LRU_TRIES + db->open_budget;
         rounds++) {
        pthread_mutex_lock(&db->lru_lock);
        if (db->open_shards < db->open_budget) {
            pthread_mutex_unlock(&db->lru_lock);
            return 0;
        }
        shard *victim = pick_victim(db, failed, nfailed);
        int wait_for_flusher =
            victim && db->flusher_running && db->open_shards < lru_ceiling(db) && unsynced(victim);
        pthread_mutex_unlock(&db->lru_lock);
        if (wait_for_flusher)
            return 0;
        if (!victim)
            break;
        /* The struct outlives any close: reading it after the list lock is
         * safe, and try_close checks again under the stream's lock. */
        if (!try_close(victim) && atomic_load(&victim->open) == SHARD_OPEN)
            failed[nfailed++] = victim;
    }
    pthread_mutex_lock(&db->lru_lock);
    uint32_t open = db->open_shards, budget = db->open_budget;
    pthread_mutex_unlock(&db->lru_lock);
    if (open < budget)
        return 0;
    return set_error(COMET_E_TOO_MANY_OPEN,
                     "cannot open another shard: all %u open shards of this process are in use "
                     "(max_open_shards %u; raise it, and the file limit, for more streams written "
                     "at once)",
                     open, budget);
}

void lru_trim(comet_db *db)
{
    shard *failed[LRU_TRIES];
    int nfailed = 0;
    while (nfailed < LRU_TRIES) {
        pthread_mutex_lock(&db->lru_lock);
        shard *victim = db->open_shards > db->open_budget ? pick_victim(db, failed, nfailed) : NULL;
        int dirty = victim && unsynced(victim);
        pthread_mutex_unlock(&db->lru_lock);
        if (!victim || dirty) /* the next pass syncs it first */
            return;
        if (!try_close(victim) && atomic_load(&victim->open) == SHARD_OPEN)
            failed[nfailed++] = victim;
    }
}

void lru_for_each_open(comet_db *db, void (*fn)(shard *sh, void *ctx), void *ctx)
{
    pthread_mutex_lock(&db->lru_lock);
    shard *sh = db->lru_head;
    while (sh) {
        atomic_fetch_add(&sh->users, 1); /* then the state: see the top comment */
        if (atomic_load(&sh->open) != SHARD_OPEN || atomic_load(&sh->stream->deleted)) {
            atomic_fetch_sub(&sh->users, 1);
            sh = sh->lru_next; /* still under the list lock */
            continue;
        }
        /* Entered and open, the shard cannot leave the list, so its
         * successor is valid again once the lock is taken back. */
        pthread_mutex_unlock(&db->lru_lock);
        fn(sh, ctx);
        pthread_mutex_lock(&db->lru_lock);
        shard *next = sh->lru_next;
        atomic_fetch_sub(&sh->users, 1);
        sh = next;
    }
    pthread_mutex_unlock(&db->lru_lock);
}
