/*
 * db.c - a data directory opened by this process: configuration, the list of
 * open streams, and the background flusher.
 *
 * The flusher wakes every fsync_interval_ms and fdatasyncs the shards this
 * process appended to since its last pass (a flag per shard, set by appends),
 * so processes never sync one another's idle shards.  With durability
 * "always" appends sync themselves (group commit) and the flusher has little
 * to do; with "none" and "interval" it is what moves the durable point.
 */
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "log.h"
#include "stream.h"
#include "sync_failure.h"

/* Directories of deleted streams that a crash left behind. */
static void remove_deleted_leftovers(const char *path)
{
    DIR *d = sys_opendir(path);
    if (!d)
        return;
    struct dirent *de;
    char sub[COMET_PATH_MAX];
    while ((de = sys_readdir(d)))
        if (strncmp(de->d_name, DELETED_PREFIX, strlen(DELETED_PREFIX)) == 0 &&
            !path_format(sub, "%s/%s", path, de->d_name))
            remove_tree(sub);
    sys_closedir(d);
}

void comet_config_default(comet_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->segment_bytes = (uint64_t)16 << 20;
    cfg->max_entry_bytes = 16u << 20;
    cfg->index_interval_bytes = 4096;
    cfg->default_shards = 16;
    cfg->durability = COMET_DURABILITY_INTERVAL;
    cfg->fsync_interval_ms = 1000;
    cfg->process_count = 1;
    cfg->flags = COMET_OPEN_CREATE;
    cfg->retention_min_segments = 1;
    cfg->retention_protect_unconsumed = 1;
    cfg->retention_interval_ms = 60000;
    cfg->segment_chunk_bytes = 4u << 20;
}

static int check_config(const comet_config *c)
{
    if (c->segment_bytes < SEGMENT_MIN_BYTES || c->segment_bytes > SEGMENT_MAX_BYTES)
        return set_error(COMET_E_INVALID, "segment_bytes must be between %u and %llu", SEGMENT_MIN_BYTES,
                         (unsigned long long)SEGMENT_MAX_BYTES);
    if (c->max_entry_bytes == 0 || c->max_entry_bytes > COMET_MAX_ENTRY_BYTES_LIMIT)
        return set_error(COMET_E_INVALID, "max_entry_bytes must be between 1 and %u",
                         COMET_MAX_ENTRY_BYTES_LIMIT);
    if (c->index_interval_bytes < 64 || c->index_interval_bytes > (1u << 24))
        return set_error(COMET_E_INVALID, "index_interval_bytes must be between 64 and 16 MiB");
    if (c->default_shards == 0 || c->default_shards > COMET_MAX_SHARDS)
        return set_error(COMET_E_INVALID, "default_shards must be between 1 and %u", COMET_MAX_SHARDS);
    if (c->durability < COMET_DURABILITY_NONE || c->durability > COMET_DURABILITY_ALWAYS)
        return set_error(COMET_E_INVALID, "durability must be none (0), interval (1) or always (2)");
    if (c->fsync_interval_ms == 0 || c->fsync_interval_ms > 3600000)
        return set_error(COMET_E_INVALID, "fsync_interval_ms must be between 1 and 3600000");
    if (c->process_count == 0 || c->process_count > COMET_MAX_PROCESSES)
        return set_error(COMET_E_INVALID, "process_count must be between 1 and %u",
                         COMET_MAX_PROCESSES);
    if (c->segment_chunk_bytes < SEGMENT_MIN_BYTES || c->segment_chunk_bytes % 4096 ||
        c->segment_chunk_bytes > (1u << 30))
        return set_error(COMET_E_INVALID, "segment_chunk_bytes must be a multiple of 4096 between "
                         "64 KiB and 1 GiB");
    if (c->retention_interval_ms > 86400000)
        return set_error(COMET_E_INVALID, "retention_interval_ms must be at most one day");
    if (c->retention_max_total_bytes && c->retention_max_total_bytes < 2 * c->segment_bytes)
        return set_error(COMET_E_INVALID,
                         "retention_max_total_bytes must leave room for two segments (%llu bytes)",
                         (unsigned long long)(2 * c->segment_bytes));
    return 0;
}

typedef void (*shard_fn)(shard *sh, void *ctx);

/* The shards open in this process (lru.c), each entered while fn runs. */
static void for_each_open_shard(comet_db *db, shard_fn fn, void *ctx)
{
    lru_for_each_open(db, fn, ctx);
}

/* Syncs what the shard committed.  A failed sync has marked the shard (no
 * retry could be trusted: durability.c); another failure (the sync lock, a
 * segment that cannot be opened) leaves it dirty for the next pass.  Nobody
 * waits for the flusher: appends see the mark, stats and /readyz report it. */
static void flush_entries(shard *sh)
{
    if (shard_sync(sh, atomic_load_explicit(&sh->st->next_entry, memory_order_acquire)) &&
        !shard_sync_refusal(sh))
        atomic_store(&sh->dirty, 1);
}

static void flush_if_dirty(shard *sh, void *ctx)
{
    (void)ctx;
    if (shard_check_deleted(sh)) { /* another process deleted the stream */
        clear_error();
        return;
    }
    if (presence_check(sh)) /* gone: nothing left to sync */
        return;
    if (atomic_exchange(&sh->dirty, 0))
        flush_entries(sh);
    if (atomic_exchange(&sh->offsets_dirty, 0) && offsets_sync(sh) && !shard_sync_refusal(sh))
        atomic_store(&sh->offsets_dirty, 1);
    recycle_settle(sh, 0); /* a file retention kept in the append path */
}

static void flush_all(shard *sh, void *ctx)
{
    (void)ctx;
    atomic_store(&sh->dirty, 0);
    flush_entries(sh);
    atomic_store(&sh->offsets_dirty, 0);
    if (offsets_sync(sh) && !shard_sync_refusal(sh))
        atomic_store(&sh->offsets_dirty, 1);
}

static void settle_if_wanted(shard *sh, void *ctx)
{
    (void)ctx;
    if (atomic_exchange(&sh->settle_wanted, 0))
        recycle_settle(sh, 0);
}

void flusher_settle_soon(shard *sh)
{
    comet_db *db = sh->stream->db;
    atomic_store(&sh->settle_wanted, 1);
    pthread_mutex_lock(&db->flusher_lock);
    db->settle_wanted = 1;
    pthread_cond_signal(&db->flusher_wake);
    pthread_mutex_unlock(&db->flusher_lock);
}

/* The background thread: flushes (every fsync_interval_ms) and runs
 * retention (every retention_interval_ms).  Between passes it settles the
 * files rotations kept (flusher_settle_soon): at sustained volume a rotation
 * comes every few tens of milliseconds, and one that finds no spare writes a
 * fresh file, whose first touch of each page costs twice a recycled one's. */
static void *flusher_main(void *arg)
{
    comet_db *db = arg;
    int64_t last_retention = monotonic_ns();
    pthread_mutex_lock(&db->flusher_lock);
    while (!db->stopping) {
        struct timespec deadline; /* the real clock: the condition variable waits on it */
        clock_gettime(CLOCK_MONOTONIC, &deadline);
        uint64_t ns = (uint64_t)deadline.tv_nsec + (uint64_t)db->cfg.fsync_interval_ms * 1000000;
        deadline.tv_sec += (time_t)(ns / 1000000000);
        deadline.tv_nsec = (long)(ns % 1000000000);
        int rc = 0;
        while (!db->stopping && rc != ETIMEDOUT) {
            if (db->settle_wanted) {
                db->settle_wanted = 0;
                pthread_mutex_unlock(&db->flusher_lock);
                for_each_open_shard(db, settle_if_wanted, NULL);
                pthread_mutex_lock(&db->flusher_lock);
                continue;
            }
            rc = pthread_cond_timedwait(&db->flusher_wake, &db->flusher_lock, &deadline);
        }
        if (db->stopping)
            break;
        pthread_mutex_unlock(&db->flusher_lock);
        for_each_open_shard(db, flush_if_dirty, NULL);
        lru_trim(db); /* shards opened over the budget while the idle ones were dirty */
        /* Deleted streams: their mappings go once no thread is inside. */
        pthread_mutex_lock(&db->lock);
        streams_sweep_deleted(db);
        pthread_mutex_unlock(&db->lock);
        int64_t now = monotonic_ns();
        if (db->cfg.retention_interval_ms &&
            now - last_retention >= (int64_t)db->cfg.retention_interval_ms * 1000000) {
            comet_run_retention(db, NULL);
            last_retention = now;
        }
        pthread_mutex_lock(&db->flusher_lock);
    }
    pthread_mutex_unlock(&db->flusher_lock);
    return NULL;
}

int comet_config_check(const comet_config *cfg)
{
    return cfg ? check_config(cfg) : set_error(COMET_E_INVALID, "comet_config_check: null config");
}

int comet_open(const char *path, const comet_config *cfg, comet_db **out)
{
    if (!path || !out)
        return set_error(COMET_E_INVALID, "comet_open: null argument");
    comet_config defaults;
    if (!cfg) {
        comet_config_default(&defaults);
        cfg = &defaults;
    }
    int rc = check_config(cfg);
    if (rc)
        return rc;
    if (strlen(path) + 1 + COMET_STREAM_NAME_MAX + 64 >= COMET_PATH_MAX)
        return set_error(COMET_E_INVALID, "data directory path is too long");
    struct stat sb;
    if (sys_stat(path, &sb)) {
        if (errno != ENOENT || !(cfg->flags & COMET_OPEN_CREATE))
            return set_errno_error(errno, "cannot open data directory %s", path);
        if (sys_mkdir(path, 0700) && errno != EEXIST)
            return set_errno_error(errno, "cannot create data directory %s", path);
        char parent[COMET_PATH_MAX]; /* its name must survive a power cut too */
        strcpy(parent, path);
        char *slash = strrchr(parent, '/');
        if (slash == parent)
            slash[1] = '\0';
        else if (slash)
            *slash = '\0';
        else
            strcpy(parent, ".");
        int rc = fsync_dir(parent);
        if (rc)
            return rc;
    } else if (!S_ISDIR(sb.st_mode)) {
        return set_error(COMET_E_INVALID, "%s is not a directory", path);
    }
    restrict_data_dir(path);
    remove_deleted_leftovers(path);
    comet_db *db = sys_calloc(1, sizeof *db);
    if (!db)
        return set_error(COMET_E_NOMEM, "out of memory");
    strcpy(db->path, path);
    db->cfg = *cfg;
    db->slots_fd = -1;
    db->usage_fd = -1;
    db->slot = -1;
    pthread_mutex_init(&db->lock, NULL);
    pthread_mutex_init(&db->usage_lock, NULL);
    pthread_mutex_init(&db->flusher_lock, NULL);
    pthread_mutex_init(&db->lru_lock, NULL);
    db->open_budget = lru_budget(&db->cfg);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&db->flusher_wake, &ca);
    pthread_condattr_destroy(&ca);
    if (!(cfg->flags & COMET_OPEN_NO_FLUSHER)) {
        rc = pthread_create(&db->flusher, NULL, flusher_main, db);
        if (rc) {
            free(db);
            return set_errno_error(rc, "cannot start the flusher thread");
        }
        db->flusher_running = 1;
    }
    *out = db;
    return 0;
}

int comet_sync_all(comet_db *db)
{
    if (!db)
        return set_error(COMET_E_INVALID, "comet_sync_all: null db");
    int rc = db_enter(db);
    if (rc)
        return rc;
    for_each_open_shard(db, flush_all, NULL);
    db_leave(db);
    return 0;
}

int comet_sync(comet_stream *s, int shard_id)
{
    int rc = shard_id < 0 ? stream_check_shard(s, 0) : stream_check_shard(s, shard_id);
    if (rc)
        return rc;
    for (uint32_t i = 0; i < s->shard_count; i++) {
        if (shard_id >= 0 && (uint32_t)shard_id != i)
            continue;
        shard *known = atomic_load_explicit(&s->shards[i], memory_order_acquire);
        if (shard_id < 0 && (!known || atomic_load(&known->open) != SHARD_OPEN))
            continue; /* not open here: nothing of ours to sync (closing synced it) */
        shard *sh;
        rc = shard_acquire(s, i, &sh);
        if (rc)
            return rc;
        atomic_store(&sh->dirty, 0);
        rc = shard_sync(sh, atomic_load_explicit(&sh->st->next_entry, memory_order_acquire));
        shard_leave(sh);
        if (rc)
            return rc;
    }
    return 0;
}

/* Waits for calls already inside the core to finish (the shards of deleted
 * streams included: their users are what a sweep waits for too). */
static void drain(comet_db *db)
{
    for (;;) {
        int busy = atomic_load(&db->users) != 0;
        pthread_mutex_lock(&db->lock);
        comet_stream *head = db->streams;
        pthread_mutex_unlock(&db->lock);
        for (comet_stream *s = head; s && !busy; s = s->next)
            for (uint32_t i = 0; i < s->shard_count && !busy; i++) {
                shard *sh = atomic_load_explicit(&s->shards[i], memory_order_acquire);
                busy = sh && atomic_load(&sh->users) != 0;
            }
        if (!busy)
            return;
        struct timespec pause = {0, 100000};
        nanosleep(&pause, NULL);
    }
}

/* Closed handles: their structs are kept for the life of the process. */
static comet_db *retired;
static pthread_mutex_t retired_lock = PTHREAD_MUTEX_INITIALIZER;

/* Closing releases every mapping, file and thread.  The db, stream and shard
 * structs themselves stay allocated (a few KiB each, on a list of retired
 * handles): a call racing with close then reads the closed flag and fails
 * with COMET_E_CLOSED instead of touching freed memory. */
int comet_close(comet_db *db)
{
    if (!db || atomic_exchange(&db->closed, 1))
        return 0;
    pthread_mutex_lock(&retired_lock);
    db->next_retired = retired;
    retired = db;
    pthread_mutex_unlock(&retired_lock);
    pthread_mutex_lock(&db->flusher_lock);
    db->stopping = 1;
    pthread_cond_broadcast(&db->flusher_wake);
    pthread_mutex_unlock(&db->flusher_lock);
    if (db->flusher_running)
        pthread_join(db->flusher, NULL);
    db->flusher_running = 0;
    pthread_mutex_lock(&db->lock);
    db->stopping = 1;
    pthread_mutex_unlock(&db->lock);
    drain(db);
    for_each_open_shard(db, flush_if_dirty, NULL);
    for (comet_stream *s = db->streams; s; s = s->next)
        stream_release(s);
    comet_release_slot(db);
    usage_close(db);
    return 0;
}
