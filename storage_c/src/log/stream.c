/*
 * stream.c - streams: name rules, the metadata file that fixes the shard
 * count, lazy opening of shards, and key routing.
 *
 * A name is checked before anything touches the disk, so "../x" or "a/b"
 * can never become a path.  The metadata file is created all-or-nothing with
 * link(), so two processes creating the same stream at once agree on one
 * shard count, and a later open with another count is an error rather than
 * a silent re-shard.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"

static int read_meta(const char *dir, const char *name, uint32_t *shards, int64_t *created)
{
    char path[COMET_PATH_MAX];
    if (path_format(path, "%s/%s", dir, STREAM_META_NAME))
        return set_error(COMET_E_INVALID, "path too long");
    stream_meta m;
    int missing;
    long n = read_file_prefix(path, &m, sizeof m, &missing);
    if (missing)
        return COMET_E_NO_STREAM;
    if (n < 0)
        return (int)n;
    if (n < (long)sizeof m || m.magic != MAGIC_STREAM)
        return set_error(COMET_E_CORRUPT, "%s is not a stream metadata file", path);
    if (m.header_crc != crc32c_header(&m))
        return set_error(COMET_E_CORRUPT, "%s: checksum mismatch", path);
    if (m.version != FORMAT_VERSION)
        return set_error(COMET_E_FORMAT_VERSION,
                         "stream '%s' has format version %u; this build reads version %u", name,
                         m.version, FORMAT_VERSION);
    if (m.shard_count == 0 || m.shard_count > COMET_MAX_SHARDS)
        return set_error(COMET_E_CORRUPT, "%s: impossible shard count %u", path, m.shard_count);
    *shards = m.shard_count;
    if (created)
        *created = m.created_ns;
    return 0;
}

static int create_meta(const char *dir, uint32_t shards)
{
    stream_meta m;
    memset(&m, 0, sizeof m);
    m.magic = MAGIC_STREAM;
    m.version = FORMAT_VERSION;
    m.header_bytes = FILE_HEADER_BYTES;
    m.shard_count = shards;
    m.created_ns = now_ns();
    m.header_crc = crc32c_header(&m);
    return create_file_exclusive(dir, STREAM_META_NAME, &m, sizeof m);
}

/* Streams in the data directory (directories holding a metadata file). */
static int64_t count_streams(comet_db *db)
{
    int64_t need = comet_list_streams(db, NULL, 0);
    if (need < 0)
        return need;
    int64_t count = 0;
    char *buf = sys_malloc((size_t)need + 1);
    if (!buf)
        return set_error(COMET_E_NOMEM, "out of memory");
    int64_t got = comet_list_streams(db, buf, (size_t)need + 1);
    for (int64_t i = 0; i < got && i < need; i++)
        count += buf[i] == '\n';
    free(buf);
    return got < 0 ? got : count;
}

/* Creates the stream's directory and metadata, under an exclusive lock of
 * the data directory when max_streams is set, so that processes creating
 * different streams at once cannot pass the limit together. */
static int stream_create(comet_db *db, const char *name, const char *dir, uint32_t shards)
{
    int lock = -1;
    if (db->cfg.max_streams) {
        lock = sys_open(db->path, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
        if (lock < 0 || sys_flock(lock, LOCK_EX)) {
            int rc = set_errno_error(errno, "cannot lock %s to create stream '%s'", db->path, name);
            if (lock >= 0)
                sys_close(lock);
            return rc;
        }
        uint32_t known;
        int rc = read_meta(dir, name, &known, NULL); /* created while we waited? */
        int64_t n = rc == COMET_E_NO_STREAM ? count_streams(db) : 0;
        if (rc == COMET_E_NO_STREAM && n >= 0 && n >= db->cfg.max_streams) {
            sys_close(lock);
            return set_error(COMET_E_STREAM_LIMIT,
                             "cannot create stream '%s': the data directory holds %lld streams "
                             "and max_streams is %u (delete a stream or raise the limit)",
                             name, (long long)n, db->cfg.max_streams);
        }
        if (n < 0) {
            sys_close(lock);
            return (int)n;
        }
    }
    int rc = 0;
    if (make_dir(dir, db->path) && errno != EEXIST)
        rc = set_errno_error(errno, "cannot create stream directory %s", dir);
    int made = rc ? 0 : create_meta(dir, shards); /* FILE_EXISTS: another process won */
    if (made < 0)
        rc = made;
    if (!rc)
        rc = fsync_dir(db->path); /* the stream's name must survive a power cut */
    if (lock >= 0)
        sys_close(lock); /* releases the flock */
    return rc;
}

/* Temporary metadata files (".stream.meta.<pid>.tmp") of creators that died
 * before they linked them into place; a live creator's is left alone. */
static void remove_dead_creators_temps(const char *dir)
{
    DIR *d = sys_opendir(dir);
    if (!d)
        return;
    char prefix[64], path[COMET_PATH_MAX];
    snprintf(prefix, sizeof prefix, ".%s.", STREAM_META_NAME);
    size_t pl = strlen(prefix), tl = strlen(TEMP_SUFFIX);
    struct dirent *de;
    while ((de = sys_readdir(d))) {
        size_t len = strlen(de->d_name);
        if (len <= pl + tl || strncmp(de->d_name, prefix, pl) ||
            strcmp(de->d_name + len - tl, TEMP_SUFFIX))
            continue;
        long pid = strtol(de->d_name + pl, NULL, 10);
        if (pid > 0 && kill((pid_t)pid, 0) && errno == ESRCH &&
            !path_format(path, "%s/%s", dir, de->d_name))
            sys_unlink(path);
    }
    sys_closedir(d);
}

/* Reads the shard count, creating the stream when asked. */
static int stream_meta_open(comet_db *db, const char *name, const char *dir, uint32_t shards,
                            int create, uint32_t *out, int64_t *created)
{
    int rc = read_meta(dir, name, out, created);
    if (rc == COMET_E_NO_STREAM && create) {
        uint32_t want = shards ? shards : db->cfg.default_shards;
        rc = stream_create(db, name, dir, want);
        if (rc)
            return rc;
        rc = read_meta(dir, name, out, created); /* whoever created it first decided */
    }
    if (rc == COMET_E_NO_STREAM)
        return set_error(COMET_E_NO_STREAM, "stream '%s' does not exist", name);
    if (rc)
        return rc;
    remove_dead_creators_temps(dir);
    if (shards && shards != *out)
        return set_error(COMET_E_SHARD_COUNT,
                         "stream '%s' has %u shards; opened with %u (the count is fixed at creation)",
                         name, *out, shards);
    return 0;
}

static int stream_open_in(comet_db *db, const char *name, uint32_t shards, int create,
                          comet_stream **out);

int comet_stream_open(comet_db *db, const char *name, size_t name_len, uint32_t shards,
                      int create, comet_stream **out)
{
    if (!db || !out)
        return set_error(COMET_E_INVALID, "comet_stream_open: null argument");
    int rc = comet_validate_stream_name(name, name_len);
    if (rc)
        return rc;
    char nm[COMET_STREAM_NAME_MAX + 1];
    memcpy(nm, name, name_len);
    nm[name_len] = 0;
    name = nm;
    if (shards > COMET_MAX_SHARDS)
        return set_error(COMET_E_INVALID, "shard count %u above the limit of %u", shards,
                         COMET_MAX_SHARDS);
    rc = db_enter(db);
    if (rc)
        return rc;
    rc = stream_open_in(db, name, shards, create, out);
    db_leave(db);
    return rc;
}

static int stream_open_in(comet_db *db, const char *name, uint32_t shards, int create,
                          comet_stream **out)
{
    int rc;
    pthread_mutex_lock(&db->lock);
    streams_sweep_deleted(db);
    for (comet_stream *s = db->streams; s; s = s->next) {
        if (!atomic_load(&s->deleted) && strcmp(s->name, name) == 0) {
            pthread_mutex_unlock(&db->lock);
            if (shards && shards != s->shard_count)
                return set_error(COMET_E_SHARD_COUNT,
                                 "stream '%s' has %u shards; opened with %u (the count is fixed "
                                 "at creation)",
                                 name, s->shard_count, shards);
            *out = s;
            return 0;
        }
    }
    comet_stream *s = sys_calloc(1, sizeof *s);
    if (!s) {
        pthread_mutex_unlock(&db->lock);
        return set_error(COMET_E_NOMEM, "out of memory");
    }
    s->db = db;
    strcpy(s->name, name);
    char dir[COMET_PATH_MAX];
    rc = path_format(dir, "%s/%s", db->path, name);
    if (!rc && !(s->dir = strdup(dir)))
        rc = set_error(COMET_E_NOMEM, "out of memory");
    if (!rc)
        rc = stream_meta_open(db, name, s->dir, shards, create, &s->shard_count, &s->created_ns);
    if (!rc && !(s->shards = sys_calloc(s->shard_count, sizeof *s->shards)))
        rc = set_error(COMET_E_NOMEM, "out of memory");
    if (rc) {
        pthread_mutex_unlock(&db->lock);
        free(s->dir);
        free(s->shards);
        free(s);
        return rc == COMET_E_INVALID ? set_error(rc, "data directory path too long") : rc;
    }
    pthread_mutex_init(&s->open_lock, NULL);
    s->next = db->streams;
    db->streams = s;
    pthread_mutex_unlock(&db->lock);
    *out = s;
    return 0;
}

/* Opens shard id (the struct made and published on first use), or finds it
 * open; the caller enters it then. */
static int shard_open_in(comet_stream *s, uint32_t id)
{
    int rc = lru_make_room(s->db);
    if (rc)
        return rc;
    pthread_mutex_lock(&s->open_lock);
    shard *sh = atomic_load_explicit(&s->shards[id], memory_order_relaxed);
    int made = 0;
    if (atomic_load(&s->db->closed))
        rc = set_error(COMET_E_CLOSED, "data directory %s is closed", s->db->path);
    else if (atomic_load(&s->deleted))
        rc = set_error(COMET_E_NO_STREAM, "stream '%s' was deleted", s->name);
    else if (!sh)
        made = !(rc = shard_new(s, id, &sh));
    if (!rc && atomic_load(&sh->open) != SHARD_OPEN) {
        rc = shard_open_files(sh);
        if (!rc) {
            atomic_store(&sh->open, SHARD_OPEN);
            lru_add(sh);
        }
    }
    if (made && rc)
        shard_close(sh);
    else if (made)
        atomic_store_explicit(&s->shards[id], sh, memory_order_release);
    pthread_mutex_unlock(&s->open_lock);
    return rc;
}

/* Why a shard cannot be entered once the data directory is closing or the
 * stream deleted (the user taken back). */
static int enter_refused(shard *sh)
{
    atomic_fetch_sub(&sh->users, 1);
    if (atomic_load(&sh->stream->db->closed))
        return set_error(COMET_E_CLOSED, "data directory %s is closed", sh->stream->db->path);
    return set_error(COMET_E_NO_STREAM, "stream '%s' was deleted", sh->stream->name);
}

/* Inline in the ways in below: every append enters a shard. */
static inline int enter(shard *sh)
{
    /* users first, then the flags (sequentially consistent): a sweep that
     * sees no user has marked the stream before, so this sees the mark. */
    atomic_fetch_add(&sh->users, 1);
    if (atomic_load(&sh->stream->db->closed) || atomic_load(&sh->stream->deleted))
        return enter_refused(sh);
    return 0;
}

int shard_enter(shard *sh)
{
    return enter(sh);
}

/* 1: entered (open); 0: not entered, the shard is closed or closing;
 * a COMET_E_* code when the data directory is closing or the stream gone. */
static inline int shard_try_enter(shard *sh)
{
    int rc = enter(sh);
    if (rc)
        return rc;
    if (atomic_load(&sh->open) == SHARD_OPEN) /* after users: see lru.c */
        return 1;
    shard_leave(sh);
    return 0;
}

int stream_mark_deleted(comet_stream *s)
{
    atomic_store(&s->deleted, 1);
    return set_error(COMET_E_NO_STREAM, "stream '%s' was deleted", s->name);
}

void streams_sweep_deleted(comet_db *db)
{
    for (comet_stream *s = db->streams; s; s = s->next) {
        if (!atomic_load(&s->deleted) || atomic_load(&s->released))
            continue;
        int busy = 0;
        for (uint32_t i = 0; i < s->shard_count && !busy; i++) {
            shard *sh = atomic_load(&s->shards[i]);
            busy = sh && atomic_load(&sh->users) > 0;
        }
        if (busy)
            continue; /* the next sweep */
        atomic_store(&s->released, 1);
        stream_release(s);
    }
}

/* Removes a directory tree (a deleted stream's); errors are ignored: what
 * remains is retried by the next comet_open. */
static int remove_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)ftw;
    if (flag == FTW_DP)
        sys_rmdir(path);
    else
        sys_unlink(path);
    return 0;
}

void remove_tree(const char *path)
{
    nftw(path, remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

int comet_stream_delete(comet_db *db, const char *name, size_t name_len)
{
    comet_stream *s;
    int rc = comet_stream_open(db, name, name_len, 0, 0, &s);
    if (rc)
        return rc;
    rc = db_enter(db);
    if (rc)
        return rc;
    for (uint32_t id = 0; id < s->shard_count && !rc; id++) {
        char dir[COMET_PATH_MAX];
        struct stat sb;
        if (path_format(dir, "%s/shard-%04u", s->dir, id) || sys_stat(dir, &sb))
            continue; /* never written: nothing to mark */
        shard *sh;
        if ((rc = shard_acquire(s, id, &sh)))
            break;
        if (!(rc = shard_lock(sh))) {
            atomic_store_explicit(&sh->st->deleted, STATE_DELETED, memory_order_release);
            atomic_fetch_add_explicit(&sh->st->active_gen, 1, memory_order_release);
            shard_unlock(sh);
        }
        shard_leave(sh);
    }
    char hidden[COMET_PATH_MAX];
    static atomic_uint counter;
    if (!rc && path_format(hidden, "%s/%s%s.%ld.%u", db->path, DELETED_PREFIX, s->name,
                           (long)getpid(), atomic_fetch_add(&counter, 1)))
        rc = set_error(COMET_E_INVALID, "data directory path too long");
    if (!rc && sys_rename(s->dir, hidden))
        rc = set_errno_error(errno, "cannot move stream directory %s out of the way", s->dir);
    if (!rc) {
        /* The stream is gone for every process now; if the rename cannot be
         * made durable, say so: after a power cut the stream may be back. */
        int synced = fsync_dir(db->path);
        char name[sizeof s->name];
        snprintf(name, sizeof name, "%s", s->name);
        stream_mark_deleted(s);
        pthread_mutex_lock(&db->lock);
        streams_sweep_deleted(db);
        pthread_mutex_unlock(&db->lock);
        remove_tree(hidden);
        clear_error();
        if (synced)
            rc = set_error(synced, "stream %s is deleted, but syncing %s failed: after a power cut "
                           "it may be back", name, db->path);
    }
    db_leave(db);
    return rc;
}

int stream_check_shard(const comet_stream *s, int64_t id)
{
    if (!s)
        return set_error(COMET_E_INVALID, "null stream");
    if (id < 0 || id >= s->shard_count)
        return set_error(COMET_E_SHARD_RANGE,
                         "shard %" PRId64 " is out of range: stream '%s' has %u shards", id, s->name,
                         s->shard_count);
    return 0;
}

/* The shard entered when this process has it open: 1 (*out set), 0 when it
 * has not (nothing held), or a COMET_E_* code (closed or deleted). */
static inline int enter_if_open(comet_stream *s, uint32_t id, shard **out)
{
    shard *sh = atomic_load_explicit(&s->shards[id], memory_order_acquire);
    int rc = sh ? shard_try_enter(sh) : 0;
    if (rc > 0)
        *out = sh;
    return rc;
}

/* shard_acquire; its recency stamped unless the caller does (stamp 0). */
static int acquire(comet_stream *s, uint32_t id, shard **out, int stamp)
{
    int rc = stream_check_shard(s, id);
    if (rc)
        return rc;
    for (;;) {
        if (atomic_load(&s->db->closed))
            return set_error(COMET_E_CLOSED, "data directory %s is closed", s->db->path);
        if (atomic_load(&s->deleted))
            return set_error(COMET_E_NO_STREAM, "stream '%s' was deleted", s->name);
        if ((rc = enter_if_open(s, id, out)) != 0) {
            if (rc > 0 && stamp)
                lru_touch(*out);
            return rc < 0 ? rc : 0;
        }
        /* Not open here (never, or closed to make room): open it, then
         * enter as any thread would; closed again meanwhile, once more. */
        if ((rc = shard_open_in(s, id)))
            return rc;
    }
}

int shard_acquire(comet_stream *s, uint32_t id, shard **out)
{
    return acquire(s, id, out, 1);
}

int comet_shard_open(comet_stream *s, int id)
{
    int rc = stream_check_shard(s, id < 0 ? 0 : id);
    if (rc)
        return rc;
    int slot = comet_slot(s->db);
    for (uint32_t i = 0; i < s->shard_count; i++) {
        if (id >= 0 ? (uint32_t)id != i : slot >= 0 && comet_shard_owner(s, i) != (uint32_t)slot)
            continue;
        shard *sh;
        if ((rc = shard_acquire(s, i, &sh)))
            return rc;
        shard_leave(sh);
    }
    return 0;
}

/* shard_acquire_if_open without the recency stamp. */
static inline int acquire_if_open(comet_stream *s, uint32_t id, shard **out)
{
    int rc = enter_if_open(s, id, out);
    if (rc)
        return rc < 0 ? rc : 0; /* closed or deleted: said there */
    if (atomic_load(&s->db->closed) || atomic_load(&s->deleted))
        return shard_acquire(s, id, out); /* which says so */
    clear_error();
    return COMET_E_WOULD_BLOCK;
}

int shard_acquire_if_open(comet_stream *s, uint32_t id, shard **out)
{
    int rc = acquire_if_open(s, id, out);
    if (!rc)
        lru_touch(*out);
    return rc;
}

int shard_acquire_to_append(comet_stream *s, uint32_t id, int mode, shard **out)
{
    return mode == COMET_APPEND_NOWAIT ? acquire_if_open(s, id, out) : acquire(s, id, out, 0);
}

void stream_release(comet_stream *s)
{
    for (uint32_t i = 0; i < s->shard_count; i++) {
        shard *sh = atomic_load(&s->shards[i]);
        if (sh) {
            pthread_mutex_lock(&s->open_lock);
            lru_close_shard(sh);
            pthread_mutex_unlock(&s->open_lock);
        }
    }
}

int64_t comet_stream_created(const comet_stream *s)
{
    return s ? s->created_ns : COMET_E_INVALID;
}

uint32_t comet_stream_shards(const comet_stream *s)
{
    return s ? s->shard_count : 0;
}

const char *comet_stream_name(const comet_stream *s)
{
    return s ? s->name : "";
}

uint32_t comet_shard_owner(const comet_stream *s, uint32_t shard)
{
    uint32_t pc = s->db->cfg.process_count ? s->db->cfg.process_count : 1;
    return shard % pc;
}

/* FNV-1a, 64 bit: stable across processes, machines and languages. */
uint32_t comet_shard_for_key(const comet_stream *s, const void *key, size_t len)
{
    const uint8_t *p = key;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return (uint32_t)(h % s->shard_count);
}

int64_t comet_list_streams(comet_db *db, char *buf, size_t cap)
{
    if (!db)
        return set_error(COMET_E_INVALID, "comet_list_streams: null db");
    if (atomic_load(&db->closed))
        return set_error(COMET_E_CLOSED, "data directory %s is closed", db->path);
    DIR *d = sys_opendir(db->path);
    if (!d)
        return set_errno_error(errno, "cannot list %s", db->path);
    size_t need = 0;
    struct dirent *de;
    char path[COMET_PATH_MAX];
    struct stat sb;
    while ((de = sys_readdir(d))) {
        if (comet_validate_stream_name(de->d_name, strlen(de->d_name)) ||
            path_format(path, "%s/%s/%s", db->path, de->d_name, STREAM_META_NAME) ||
            sys_stat(path, &sb))
            continue;
        size_t len = strlen(de->d_name);
        if (buf && need + len + 1 <= cap) {
            memcpy(buf + need, de->d_name, len);
            buf[need + len] = '\n';
        }
        need += len + 1;
    }
    int err = errno; /* from the readdir that ended the loop */
    sys_closedir(d);
    if (err)
        return set_errno_error(err, "cannot list %s", db->path);
    clear_error();
    return (int64_t)need;
}
