/*
 * usage.c - what the data directory takes on disk, without a walk per growth.
 *
 * A budget (retention_max_total_bytes) is checked before a segment is created
 * or grown, under the shard's append lock.  Counting means a stat of every
 * segment and index file of the directory: done under the lock at every
 * growth, the check cost more the more shards and streams there were.
 *
 * Instead every process that appends under a budget maps <data>/.usage: an
 * estimate of the bytes, kept under a robust process-shared mutex that is
 * held only while files are allocated, deleted or counted.  An appender
 * reserves what it is about to allocate (usage_reserve: the estimate goes up
 * and the mutex stays held, or the reservation fails when it would pass the
 * budget: two appenders can never both take the last room), allocates, and
 * lets go (usage_allocated, which gives back what was not allocated).
 * Allocations are thereby serialised across the directory: one file
 * creation or growth at a time, once per segment chunk.  Retention's
 * deletions take the estimate down under the same mutex.  A full count
 * (usage_recount: the walk, under the mutex, outside every shard lock) is
 * exact, since no allocation or deletion can run during it; it runs when the
 * estimate first says the budget is spent and at every retention pass over a
 * budget, and corrects what deletes files without going through here (a
 * stream deleted, a segment set aside by recovery: the estimate only runs high
 * meanwhile).  A process that dies holding the mutex leaves the next holder
 * to count again (EOWNERDEAD).  Without the file (it cannot be created or
 * mapped) every check is a full count, as before: slower, and not atomic
 * across appenders.
 *
 * The mutex word, like a shard state's (state.c), is only meaningful while a
 * process holds the file's shared open-file-description lock (byte
 * USAGE_FILE_BYTES): every process that maps it keeps its descriptor open
 * with that lock, and the process that maps it while no other holds it (the
 * exclusive lock is granted, under flock) sets the file up again, so that a
 * word left "locked" in a copy of the directory, or by processes killed
 * without a reboot, never blocks anyone.  One descriptor per data directory
 * that appends under a budget.
 *
 * The counts themselves are here too (usage_total_bytes, usage_shard_bytes,
 * segment_file_bytes): the append's shard budget, retention and the
 * statistics use them.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"

#define USAGE_FILE_BYTES 4096

uint64_t segment_file_bytes(const char *dir, uint64_t base, const char *suffix)
{
    char path[COMET_PATH_MAX];
    segment_path(path, dir, base, suffix);
    return file_disk_bytes(path);
}

uint64_t usage_shard_bytes(shard *sh)
{
    uint64_t *bases, total = 0;
    size_t n;
    if (shard_segment_bases(sh, &bases, &n))
        return 0;
    for (size_t i = 0; i < n; i++)
        total += segment_file_bytes(sh->dir, bases[i], SEGMENT_SUFFIX) +
                 segment_file_bytes(sh->dir, bases[i], INDEX_SUFFIX);
    free(bases);
    return total;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a > b && strcmp(s + a - b, suffix) == 0;
}

static uint64_t dir_log_bytes(const char *dir)
{
    DIR *d = sys_opendir(dir);
    if (!d)
        return 0;
    uint64_t total = 0;
    char path[COMET_PATH_MAX];
    struct dirent *de;
    while ((de = sys_readdir(d)))
        if ((ends_with(de->d_name, SEGMENT_SUFFIX) || ends_with(de->d_name, INDEX_SUFFIX) ||
             strcmp(de->d_name, SPARE_NAME) == 0 || strcmp(de->d_name, SPARE_PENDING_NAME) == 0) &&
            !path_format(path, "%s/%s", dir, de->d_name))
            total += file_disk_bytes(path);
    sys_closedir(d);
    return total;
}

uint64_t usage_total_bytes(comet_db *db)
{
    DIR *d = sys_opendir(db->path);
    if (!d)
        return 0;
    uint64_t total = 0;
    char path[COMET_PATH_MAX];
    struct dirent *de;
    while ((de = sys_readdir(d))) {
        if (comet_validate_stream_name(de->d_name, strlen(de->d_name)))
            continue;
        if (path_format(path, "%s/%s", db->path, de->d_name))
            continue;
        DIR *s = sys_opendir(path);
        if (!s)
            continue;
        struct dirent *sd;
        char shard_dir[COMET_PATH_MAX];
        while ((sd = sys_readdir(s)))
            if (strncmp(sd->d_name, "shard-", 6) == 0 &&
                !path_format(shard_dir, "%s/%s", path, sd->d_name))
                total += dir_log_bytes(shard_dir);
        sys_closedir(s);
    }
    sys_closedir(d);
    return total;
}

static void count_into(comet_db *db, usage_file *u)
{
    u->bytes = usage_total_bytes(db);
    u->counted_ns = now_ns();
}

/* Sets a new file up, or one no living process holds (alone; its lock may be
 * held by a process that is gone), or from another boot or version; under
 * flock. */
static int set_up(comet_db *db, usage_file *u, int alone)
{
    uint8_t boot[16];
    int rc = read_boot_id(boot);
    if (rc)
        return rc;
    if (!alone && u->magic == MAGIC_USAGE && u->version == USAGE_VERSION &&
        !memcmp(u->boot_id, boot, 16))
        return 0;
    memset(u, 0, sizeof *u);
    rc = robust_mutex_init(&u->lock.mutex);
    if (rc)
        return rc;
    count_into(db, u);
    memcpy(u->boot_id, boot, 16);
    u->version = USAGE_VERSION;
    u->header_bytes = FILE_HEADER_BYTES;
    u->magic = MAGIC_USAGE;
    return 0;
}

/* Maps the file with its shared lock held; db->usage_fd keeps both. */
static usage_file *map_usage(comet_db *db)
{
    char path[COMET_PATH_MAX];
    if (path_format(path, "%s/%s", db->path, USAGE_NAME))
        return NULL;
    int fd = open_new(path, O_RDWR | O_CREAT | O_CLOEXEC, db->path);
    if (fd < 0)
        return NULL;
    usage_file *u = NULL;
    struct stat sb;
    if (!sys_flock(fd, LOCK_EX) && !sys_fstat(fd, &sb) &&
        (sb.st_size >= USAGE_FILE_BYTES || !sys_ftruncate(fd, USAGE_FILE_BYTES))) {
        int alone = ofd_lock(fd, path, USAGE_FILE_BYTES, 1, F_WRLCK, 0);
        if (alone >= 0 && !ofd_lock(fd, path, USAGE_FILE_BYTES, 1, F_RDLCK, 0)) {
            void *map = sys_mmap(NULL, USAGE_FILE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            if (map != MAP_FAILED) {
                u = map;
                if (set_up(db, u, alone == 0)) {
                    sys_munmap(map, USAGE_FILE_BYTES);
                    u = NULL;
                }
            }
        }
    }
    sys_flock(fd, LOCK_UN);
    if (u)
        db->usage_fd = fd;
    else
        sys_close(fd);
    return u;
}

/* The shared estimate, mapped on first use (NULL when it cannot be). */
static usage_file *usage_of(comet_db *db)
{
    usage_file *u = atomic_load_explicit(&db->usage, memory_order_acquire);
    if (u || atomic_load_explicit(&db->usage_failed, memory_order_relaxed))
        return u;
    pthread_mutex_lock(&db->usage_lock);
    u = atomic_load(&db->usage);
    if (!u && !atomic_load(&db->usage_failed)) {
        u = map_usage(db);
        if (u)
            atomic_store_explicit(&db->usage, u, memory_order_release);
        else
            atomic_store(&db->usage_failed, 1);
    }
    pthread_mutex_unlock(&db->usage_lock);
    return u;
}

/* Takes the estimate's lock; a holder that died leaves it counted again. */
static int lock_usage(comet_db *db, usage_file *u)
{
    int rc = pthread_mutex_lock(&u->lock.mutex);
    if (rc == EOWNERDEAD) {
        pthread_mutex_consistent(&u->lock.mutex);
        count_into(db, u);
        rc = 0;
    }
    return rc;
}

int usage_reserve(comet_db *db, uint64_t bytes, uint64_t budget, uint64_t *used)
{
    usage_file *u = usage_of(db);
    if (!u || lock_usage(db, u)) {
        *used = usage_total_bytes(db);
        return *used + bytes <= budget ? USAGE_FITS : 0;
    }
    *used = u->bytes;
    if (u->bytes + bytes > budget) {
        pthread_mutex_unlock(&u->lock.mutex);
        return 0;
    }
    u->bytes += bytes;
    return USAGE_RESERVED; /* the mutex stays held until usage_allocated */
}

void usage_allocated(comet_db *db, uint64_t bytes, int done)
{
    usage_file *u = atomic_load_explicit(&db->usage, memory_order_acquire);
    if (!done)
        u->bytes = u->bytes > bytes ? u->bytes - bytes : 0;
    pthread_mutex_unlock(&u->lock.mutex);
}

int usage_begin_delete(comet_db *db)
{
    usage_file *u = atomic_load_explicit(&db->usage, memory_order_acquire);
    return u && !lock_usage(db, u);
}

void usage_end_delete(comet_db *db, int locked, uint64_t bytes)
{
    usage_file *u = atomic_load_explicit(&db->usage, memory_order_acquire);
    if (!locked || !u)
        return;
    u->bytes = u->bytes > bytes ? u->bytes - bytes : 0;
    pthread_mutex_unlock(&u->lock.mutex);
}

uint64_t usage_estimate(comet_db *db)
{
    usage_file *u = usage_of(db);
    if (!u || lock_usage(db, u))
        return usage_total_bytes(db);
    uint64_t bytes = u->bytes;
    pthread_mutex_unlock(&u->lock.mutex);
    return bytes;
}

uint64_t usage_recount(comet_db *db)
{
    usage_file *u = usage_of(db);
    if (!u || lock_usage(db, u))
        return usage_total_bytes(db);
    count_into(db, u);
    uint64_t bytes = u->bytes;
    pthread_mutex_unlock(&u->lock.mutex);
    return bytes;
}

void usage_close(comet_db *db)
{
    usage_file *u = atomic_exchange(&db->usage, NULL);
    if (u)
        sys_munmap(u, USAGE_FILE_BYTES);
    if (db->usage_fd >= 0)
        sys_close(db->usage_fd); /* after the unmap: drops the shared lock */
    db->usage_fd = -1;
}
