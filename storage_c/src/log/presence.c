/*
 * presence.c - noticing that the files of an open shard were taken away
 * from under this process: the data, stream or shard directory removed or
 * replaced (an operator's rm -rf, a volume that went away), the active
 * segment or the state file unlinked, the filesystem turned read-only.
 *
 * None of these makes a system call of the append path fail at once.  An
 * unlinked file stays open and mapped, so appends write into it and succeed,
 * fdatasync succeeds too, and the entries are gone for good as soon as the
 * process closes it; a filesystem remounted read-only after an error fails the
 * next allocation, often with a misleading message ("no room after growing
 * it").  So the shard looks for itself, where that costs nothing next to what
 * runs anyway:
 *   - at every sync (group commit, the flusher's pass) and every rotation:
 *     presence_check, a handful of stat calls (a few microseconds against an
 *     fdatasync's milliseconds, or a second of flusher sleep);
 *   - after any failed append step: presence_explain, so that the error
 *     names the cause instead of its symptom.  An rm -rf takes the files one
 *     by one before the directory, so a step may fail while the directory is
 *     still in place: the explanation also looks for the active segment by
 *     its name (only here: a stat more per sync would buy nothing), and a
 *     step that saw a file it had just made vanish says so with
 *     COMET_E_GONE, which marks the shard like the checks do.
 * What it compares: the shard directory and the state file by path against
 * the device and inode seen at open (a path that no longer resolves, or
 * resolves to another inode, means the directory was removed or replaced -
 * whichever level of the data/stream/shard path it was); the active
 * segment's link count through the descriptor writers keep (0: unlinked);
 * the filesystem's read-only flag (statvfs).
 *
 * Once seen, the shard is refused: every later append of this process gets
 * the same code (COMET_E_GONE or COMET_E_READ_ONLY) and detail from
 * presence_refusal, a relaxed atomic load on the append path.  The mark is
 * this process's, in memory, never in the state file (which may be gone, or
 * may outlive the fault); reopening the shard (a restart) decides afresh
 * from what is on disk then.  Other processes using the shard notice by
 * themselves at their next check.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "log.h"
#include "presence.h"

void presence_note(shard *sh, int state_fd)
{
    struct stat sb;
    if (sys_stat(sh->dir, &sb) == 0) {
        sh->dir_dev = (uint64_t)sb.st_dev;
        sh->dir_ino = (uint64_t)sb.st_ino;
    }
    if (state_fd >= 0 && sys_fstat(state_fd, &sb) == 0) {
        sh->state_dev = (uint64_t)sb.st_dev;
        sh->state_ino = (uint64_t)sb.st_ino;
    }
}

/* Marks the shard refused with code and the detail (the first cause wins:
 * later checks would describe the same fault from further away). */
static int refuse(shard *sh, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int refuse(shard *sh, int code, const char *fmt, ...)
{
    pthread_mutex_lock(&sh->cache_lock);
    if (!atomic_load_explicit(&sh->gone, memory_order_relaxed)) {
        char detail[512];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(detail, sizeof detail, fmt, ap);
        va_end(ap);
        free(sh->gone_detail);
        sh->gone_detail = strdup(detail); /* NULL: the code alone tells the cause */
        atomic_store_explicit(&sh->gone, code, memory_order_release);
    }
    pthread_mutex_unlock(&sh->cache_lock);
    return presence_refusal(sh);
}

int presence_refused(shard *sh, int code)
{
    return set_error(code, "%s", sh->gone_detail ? sh->gone_detail : comet_strerror(code));
}

/* The outermost of data, stream and shard directory that no longer resolves
 * to what it was: what the operator removed (only on the failure path). */
static const char *vanished_level(shard *sh, char *out, size_t n)
{
    const char *levels[3] = {sh->stream->db->path, sh->stream->dir, sh->dir};
    const char *names[3] = {"data directory", "stream directory", "shard directory"};
    struct stat sb;
    for (int i = 0; i < 3; i++)
        if (sys_stat(levels[i], &sb) ? errno == ENOENT || errno == ENOTDIR : !S_ISDIR(sb.st_mode)) {
            snprintf(out, n, "%s", levels[i]);
            return names[i];
        }
    snprintf(out, n, "%s", sh->dir);
    return "shard directory";
}

#define RESTART_ADVICE                                                                           \
    "appends to it are refused until the directory is restored (or recreated) and the "          \
    "process restarted; entries written since the last sync may be lost"
#define REOPEN_ADVICE                                                                            \
    "appends to it are refused until the process restarts (which recovers the shard from the "   \
    "files left); entries written since the last sync may be lost"

/* The active segment's base in *base; 0 when the shard has no segment yet. */
static int active_base(shard *sh, uint64_t *base)
{
    state_file *st = sh->st;
    if (!atomic_load_explicit(&st->active_end, memory_order_relaxed))
        return 0;
    *base = atomic_load_explicit(&st->active_base, memory_order_acquire);
    return 1;
}

/* The active segment's link count through a descriptor this process holds
 * (writers keep one): 0 once it was unlinked.  Under the cache lock, which
 * keeps the segment in the cache (and its descriptor open) meanwhile. */
static int active_segment_unlinked(shard *sh, uint64_t *base_out)
{
    uint64_t base;
    if (!active_base(sh, &base))
        return 0;
    int unlinked = 0;
    pthread_mutex_lock(&sh->cache_lock);
    for (size_t i = sh->nsegs; i-- > 0;) {
        segment *seg = sh->segs[i];
        if (seg->base < base)
            break; /* sorted: the active one is at the end */
        struct stat sb;
        if (seg->base == base && seg->fd >= 0 && sys_fstat(seg->fd, &sb) == 0)
            unlinked = sb.st_nlink == 0;
    }
    pthread_mutex_unlock(&sh->cache_lock);
    *base_out = base;
    return unlinked;
}

/* 1 when path no longer names the file of that device and inode: gone
 * (ENOENT, ENOTDIR; *err set) or replaced (*err 0).  Another failure of stat
 * (EIO, EACCES, no memory) tells nothing about it: 0, as when in place. */
static int moved(const char *path, uint64_t dev, uint64_t ino, int *err)
{
    struct stat sb;
    *err = 0;
    if (sys_stat(path, &sb)) {
        *err = errno;
        return *err == ENOENT || *err == ENOTDIR;
    }
    return (uint64_t)sb.st_ino != ino || (uint64_t)sb.st_dev != dev;
}

int presence_check(shard *sh)
{
    int rc = presence_refusal(sh);
    if (rc || !sh->st || !sh->dir_ino)
        return rc;
    /* A deleted stream's directory is renamed away on purpose: the deletion's
     * own answer (COMET_E_NO_STREAM, from shard_check_deleted) is the right one. */
    if (atomic_load_explicit(&sh->st->deleted, memory_order_acquire) == STATE_DELETED)
        return 0;
    char where[COMET_PATH_MAX];
    int err;
    if (moved(sh->dir, sh->dir_dev, sh->dir_ino, &err)) {
        int missing = err != 0;
        const char *level = vanished_level(sh, where, sizeof where);
        return refuse(sh, COMET_E_GONE,
                      "the %s %s was %s while shard %u of stream '%s' was open%s%s; " RESTART_ADVICE,
                      level, where, missing ? "removed" : "replaced by another directory",
                      sh->id, sh->stream->name, missing ? ": " : "",
                      missing ? strerror(err) : "");
    }
    uint64_t base;
    if (active_segment_unlinked(sh, &base)) {
        char path[COMET_PATH_MAX];
        segment_path(path, sh->dir, base, SEGMENT_SUFFIX);
        return refuse(sh, COMET_E_GONE,
                      "the active segment %s of shard %u of stream '%s' was unlinked while open "
                      "(its link count is 0); " REOPEN_ADVICE,
                      path, sh->id, sh->stream->name);
    }
    if (sh->state_ino) {
        path_format(where, "%s/%s", sh->dir, STATE_NAME);
        if (moved(where, sh->state_dev, sh->state_ino, &err))
            return refuse(sh, COMET_E_GONE,
                          "the state file %s of shard %u of stream '%s' was removed or replaced "
                          "while open; " REOPEN_ADVICE,
                          where, sh->id, sh->stream->name);
    }
    struct statvfs vfs;
    if (sys_statvfs(sh->dir, &vfs) == 0 && (vfs.f_flag & ST_RDONLY))
        return refuse(sh, COMET_E_READ_ONLY,
                      "the filesystem of %s is read-only (remounted after an error, or by an "
                      "operator); appends to shard %u of stream '%s' are refused until it is "
                      "writable again and the process restarted",
                      sh->dir, sh->id, sh->stream->name);
    return 0;
}

/* 1 when the active segment's name no longer resolves (failure path only:
 * the check at every sync looks through the descriptor instead). */
static int active_segment_removed(shard *sh, char path[COMET_PATH_MAX])
{
    uint64_t base;
    if (!active_base(sh, &base))
        return 0;
    struct stat sb;
    segment_path(path, sh->dir, base, SEGMENT_SUFFIX);
    return sys_stat(path, &sb) && (errno == ENOENT || errno == ENOTDIR);
}

int presence_explain(shard *sh, int rc)
{
    if (rc >= 0 || rc == COMET_E_WOULD_BLOCK || rc == COMET_E_NO_STREAM || rc == COMET_E_CLOSED)
        return rc;
    /* The error's own detail is kept unless the check finds a cause. */
    char detail[512];
    snprintf(detail, sizeof detail, "%s", comet_last_error());
    int cause = presence_check(sh);
    if (cause)
        return cause;
    if (sh->st && atomic_load_explicit(&sh->st->deleted, memory_order_acquire) != STATE_DELETED) {
        char path[COMET_PATH_MAX];
        if (rc == COMET_E_GONE) /* a step saw a file it made vanish */
            return refuse(sh, COMET_E_GONE, "%s (shard %u of stream '%s'); " REOPEN_ADVICE, detail,
                          sh->id, sh->stream->name);
        if (active_segment_removed(sh, path))
            return refuse(sh, COMET_E_GONE,
                          "the active segment %s of shard %u of stream '%s' was removed while "
                          "open; " REOPEN_ADVICE,
                          path, sh->id, sh->stream->name);
    }
    /* A filesystem turned read-only after an error (ext4's errors=remount-ro)
     * does not always say so to statvfs: EROFS from any call is the sign, and
     * it lasts until an operator acts, so the shard is refused from now on. */
    if (rc == COMET_E_READ_ONLY)
        return refuse(sh, COMET_E_READ_ONLY,
                      "the filesystem of %s turned read-only (%s); appends to shard %u of "
                      "stream '%s' are refused until it is writable again and the process "
                      "restarted",
                      sh->dir, detail, sh->id, sh->stream->name);
    return set_error(rc, "%s", detail);
}
