/*
 * recycle.c - reusing the file of a deleted segment as the shard's next one.
 *
 * At sustained volume the cost of an append is the page cache's first touch:
 * a new segment's pages must be allocated, zeroed and converted from
 * preallocated ("unwritten") extents, about 1.3 us per 4 KiB page here, while
 * storing into pages the cache already holds costs about 0.6 us.  Retention
 * meanwhile deletes whole segments, dropping exactly such pages.  So, like
 * RocksDB's recycled WAL files, one deleted segment file per shard is kept
 * under the name SPARE_NAME, and the next rotation takes it instead of
 * allocating a new file: the blocks are allocated and written already (no
 * SIGBUS risk on a full disk, no zero fill) and usually still cached.
 *
 * The stale entries a recycled file holds past the new segment's end must
 * never be taken for the new segment's.  Two rules make that exact:
 *   - entry checksums cover the whole 64-bit entry number (segment version
 *     2, entry.c): an entry of the file's earlier life carries a smaller
 *     number than any the new segment expects at that place, so it never
 *     checks out there, and a scan ends at it as at zeros;
 *   - the header says RECYCLED, so recovery knows that bytes past the last
 *     good entry are the earlier life's rather than a torn write to repair.
 * A reader in another process may still map the file under its old name
 * while it is reused: retention moves first_entry past the deleted segment
 * before the file is renamed, and a reader checks first_entry again after it
 * copied entries out (reader.c), dropping whatever retention took meanwhile.
 *
 * Taking the spare, crash-safely: the new header (base, capacity = the
 * file's size, RECYCLED) is written while the file still has its spare name,
 * then the file is renamed to the segment's name and the directory synced.
 * The header is not synced then (that would write back, in the append path,
 * whatever of the file's earlier life is still dirty): the first sync of an
 * entry of the new segment takes it along.  A crash before the rename leaves
 * a spare (the header is rewritten at the next take).  A power cut after it
 * may leave the segment's name on the file with its old header, saying an
 * older base: nothing of the new segment was made durable then, and
 * recovery gives the file back to the spare slot (recycle_stale).
 * Preparing a spare ahead of a rotation: a rotation that creates a file
 * allocates it and syncs it and its directory, in the append path.  So the
 * flusher, finding a shard with no spare whose active segment is half full,
 * prepares one (recycle_prepare): a file of segment_bytes, allocated, with a
 * header saying PREPARED (base 0, so it is "older" than any segment name it
 * may get) and synced, and an empty index file (SPARE_INDEX_NAME, unsynced:
 * an index is a cache, checked when mapped); both are allocated under the
 * directory's budget, named under the append lock (a rotation or retention
 * may be deciding about the spare), and the directory is synced after, with
 * no lock held.  Taking it is as above plus the index's rename; a prepared
 * file's header becomes a plain segment's (its blocks read as zeros, so the
 * appender zero-fills ahead as in a new file).  No take syncs the directory:
 * the durable point never passes an entry of a segment whose name is not
 * durable, since shard_sync syncs the directory first whenever the active
 * segment changed since the durable point's (durability.c).  Under "always"
 * an entry is acknowledged only once the durable point passed it, so a
 * segment's name is durable before any entry in it is acknowledged; a power
 * cut before that loses the name, the spare name comes back or the segment
 * name holds the file's older header, and recovery handles both as above.
 * A spare is disk the directory's budget must be able to get back: making
 * room in it unlinks other shards' spares before any data, and the shard that
 * needs the room gives up its own when nothing else may go
 * (retention_free_oldest, lock_with_room).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <sys/stat.h>
#include <unistd.h>

#include "crc32c.h"
#include "errors.h"
#include "internal.h"

static int spare_path(const shard *sh, char *out)
{
    return path_format(out, "%s/%s", sh->dir, SPARE_NAME);
}

static int spare_index_path(const shard *sh, char *out)
{
    return path_format(out, "%s/%s", sh->dir, SPARE_INDEX_NAME);
}

/* The file's size; 0 when it is missing (or cannot be stated). */
static uint64_t size_of(const char *path)
{
    struct stat sb;
    return sys_stat(path, &sb) ? 0 : (uint64_t)sb.st_size;
}

static int recycling_on(const shard *sh)
{
    return !(sh->stream->db->cfg.flags & COMET_OPEN_NO_RECYCLE);
}

uint64_t recycle_spare_bytes(const shard *sh)
{
    char path[COMET_PATH_MAX];
    struct stat sb;
    if (!recycling_on(sh) || spare_path(sh, path) || sys_stat(path, &sb))
        return 0;
    return (uint64_t)sb.st_size;
}

/* Whether the file at path is a spare the flusher prepared (never written). */
static int prepared(const char *path)
{
    int fd = sys_open(path, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0)
        return 0;
    segment_header h;
    int yes = sys_pread(fd, &h, sizeof h, 0) == (ssize_t)sizeof h && h.magic == MAGIC_SEGMENT &&
              h.header_crc == crc32c_header(&h) && (h.flags & SEGMENT_FLAG_PREPARED);
    sys_close(fd);
    return yes;
}

int recycle_keep(shard *sh, uint64_t base)
{
    const comet_config *cfg = &sh->stream->db->cfg;
    char from[COMET_PATH_MAX], to[COMET_PATH_MAX];
    struct stat sb;
    /* A deleted segment replaces a prepared spare (the rename unlinks it):
     * its blocks are written and its pages likely cached, which is what
     * makes a recycled segment cheaper to fill than a new one. */
    if (!recycling_on(sh) || spare_path(sh, to) || (sys_stat(to, &sb) == 0 && !prepared(to)))
        return 0;
    segment_path(from, sh->dir, base, SEGMENT_SUFFIX);
    /* Only a full-size file is worth keeping: it is what a rotation needs. */
    if (sys_stat(from, &sb) || (uint64_t)sb.st_size < cfg->segment_bytes ||
        (uint64_t)sb.st_size > SEGMENT_MAX_BYTES)
        return 0;
    return sys_rename(from, to) == 0;
}

/* Rewrites the spare's header for segment base; returns the file's size.
 * *fresh: the spare was prepared (never written), not a deleted segment. */
static int64_t rehead(shard *sh, const char *path, uint64_t base, uint64_t coverage, int *fresh)
{
    int fd = sys_open(path, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0)
        return set_errno_error(errno, "cannot open %s", path);
    struct stat sb;
    int64_t rc;
    if (sys_fstat(fd, &sb)) {
        rc = set_errno_error(errno, "cannot stat %s", path);
        goto out;
    }
    uint64_t size = (uint64_t)sb.st_size;
    segment_header h;
    *fresh = sys_pread(fd, &h, sizeof h, 0) == (ssize_t)sizeof h && h.magic == MAGIC_SEGMENT &&
             h.header_crc == crc32c_header(&h) && (h.flags & SEGMENT_FLAG_PREPARED);
    segment_header_fill(&h, sh->id, base, size, coverage, *fresh ? 0 : SEGMENT_FLAG_RECYCLED);
    if (sys_pwrite(fd, &h, sizeof h, 0) != (ssize_t)sizeof h) {
        rc = set_errno_error(errno ? errno : EIO, "cannot write the header of %s", path);
        goto out;
    }
    /* Not synced here: that would write back whatever of the file's earlier
     * life is still dirty, in the append path.  Any sync of an entry of the
     * new segment syncs this header with it (same file), so a header lost to
     * a power cut means nothing in the segment was made durable, and
     * recovery gives the file back (recycle_stale). */
    rc = (int64_t)size;
out:
    sys_close(fd);
    return rc;
}

/* A file named as segment base whose header, valid and of this shard, says
 * an older base: a recycled file whose new header never reached the disk.
 * 1 or 0, or a COMET_E_* code when the header cannot be read: an unread
 * header is not a judgement either way. */
static int header_is_older(const char *path, uint32_t shard_id, uint64_t base)
{
    segment_header h;
    int missing = 0;
    long got = read_file_prefix(path, &h, sizeof h, &missing);
    if (got < 0)
        return missing ? 0 : (int)got;
    if (got != (long)sizeof h)
        return 0;
    return h.magic == MAGIC_SEGMENT && h.header_crc == crc32c_header(&h) &&
           h.shard_id == shard_id && h.base_entry < base;
}

int recycle_is_stale(const shard *sh, uint64_t base)
{
    char path[COMET_PATH_MAX];
    segment_path(path, sh->dir, base, SEGMENT_SUFFIX);
    return header_is_older(path, sh->id, base);
}

int recycle_stale(shard *sh, uint64_t base)
{
    char path[COMET_PATH_MAX], spare[COMET_PATH_MAX];
    struct stat sb;
    segment_path(path, sh->dir, base, SEGMENT_SUFFIX);
    int older = header_is_older(path, sh->id, base);
    if (older <= 0)
        return older;
    if (recycling_on(sh) && !spare_path(sh, spare) && sys_stat(spare, &sb) != 0 &&
        sys_rename(path, spare) == 0)
        return 1;
    return sys_unlink(path) == 0;
}

/* Unlinks the file at path, counting it out of the directory's usage. */
static uint64_t drop_file(comet_db *db, const char *path)
{
    struct stat sb;
    if (sys_stat(path, &sb))
        return 0;
    int locked = usage_begin_delete(db);
    uint64_t freed = sys_unlink(path) == 0 ? (uint64_t)sb.st_size : 0;
    usage_end_delete(db, locked, freed);
    return freed;
}

uint64_t recycle_drop(shard *sh)
{
    char path[COMET_PATH_MAX], idx[COMET_PATH_MAX];
    if (spare_path(sh, path) || spare_index_path(sh, idx))
        return 0;
    return drop_file(sh->stream->db, path) + drop_file(sh->stream->db, idx);
}

int recycle_spare_index_fits(const shard *sh, uint64_t coverage, uint32_t index_interval)
{
    char idx[COMET_PATH_MAX];
    return recycling_on(sh) && !spare_index_path(sh, idx) &&
           size_of(idx) == index_file_bytes(coverage, index_interval);
}

/* The spare file, prepared at tmp: allocated, a PREPARED header, synced.
 * Returns the descriptor (allocated, not yet synced) or a COMET_E_* code. */
static int prepared_file(shard *sh, const char *tmp, uint64_t size)
{
    int fd = sys_open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return set_errno_error(errno, "cannot create %s", tmp);
    int rc = preallocate(fd, size, tmp);
    segment_header h;
    segment_header_fill(&h, sh->id, 0, size, size, SEGMENT_FLAG_PREPARED);
    if (!rc && sys_pwrite(fd, &h, sizeof h, 0) != (ssize_t)sizeof h)
        rc = set_errno_error(errno ? errno : EIO, "cannot write the header of %s", tmp);
    if (rc) {
        sys_close(fd);
        sys_unlink(tmp);
        return rc;
    }
    return fd;
}

/* Failures leave the thread's last error set, as the flusher's syncs do:
 * comet_close runs this in the caller's thread, whose own error must stay. */
void recycle_prepare(shard *sh)
{
    comet_db *db = sh->stream->db;
    const comet_config *cfg = &db->cfg;
    char log[COMET_PATH_MAX], idx[COMET_PATH_MAX], log_tmp[COMET_PATH_MAX], idx_tmp[COMET_PATH_MAX];
    struct stat sb;
    uint64_t base = atomic_load_explicit(&sh->st->active_base, memory_order_acquire);
    if (!recycling_on(sh) ||
        atomic_load_explicit(&sh->st->active_end, memory_order_relaxed) < cfg->segment_bytes / 2 ||
        atomic_exchange(&sh->spare_checked, base + 1) == base + 1 ||
        spare_path(sh, log) || spare_index_path(sh, idx) ||
        path_format(log_tmp, "%s.%ld%s", log, (long)getpid(), TEMP_SUFFIX) ||
        path_format(idx_tmp, "%s.%ld%s", idx, (long)getpid(), TEMP_SUFFIX))
        return;
    uint64_t log_bytes = sys_stat(log, &sb) ? cfg->segment_bytes : 0;
    uint64_t idx_bytes = sys_stat(idx, &sb) ? index_file_bytes(cfg->segment_bytes,
                                                               cfg->index_interval_bytes)
                                            : 0;
    uint64_t bytes = log_bytes + idx_bytes;
    if (!bytes)
        return;
    /* Under the budgets like any new file, but never worth deleting data for:
     * without the room, the rotation creates its file as before. */
    if (cfg->retention_max_shard_bytes &&
        retention_shard_bytes(sh) + bytes > cfg->retention_max_shard_bytes)
        return;
    int reserved = 0;
    if (cfg->retention_max_total_bytes) {
        uint64_t used;
        int fit = usage_reserve(db, bytes, cfg->retention_max_total_bytes, &used);
        if (!fit)
            return;
        reserved = fit == USAGE_RESERVED;
    }
    /* Allocation only while the directory's usage lock is held (appenders
     * that grow a file under the budget wait for it): the sync comes after. */
    int fd = log_bytes ? prepared_file(sh, log_tmp, log_bytes) : -1;
    int rc = fd < 0 && log_bytes ? fd : 0;
    if (!rc && idx_bytes &&
        (rc = index_prepare(idx_tmp, sh->id, cfg->segment_bytes, cfg->index_interval_bytes)) &&
        fd >= 0) {
        sys_close(fd);
        sys_unlink(log_tmp);
        fd = -1;
    }
    if (reserved)
        usage_allocated(db, bytes, rc == 0);
    if (rc) /* the rotation creates its file as before */
        return;
    /* Header and size durable before the spare name is: a segment name may
     * reach the disk on this file (recycle_stale then finds base 0). */
    if (fd >= 0 && sys_fsync(fd)) {
        sys_close(fd);
        drop_file(db, log_tmp);
        log_bytes = 0;
    } else if (fd >= 0) {
        sys_close(fd);
    }
    int named = 0;
    if (shard_lock(sh) == 0) { /* a rotation or retention may be deciding about the spare */
        named |= log_bytes && sys_stat(log, &sb) != 0 && sys_rename(log_tmp, log) == 0;
        named |= idx_bytes && sys_stat(idx, &sb) != 0 && sys_rename(idx_tmp, idx) == 0;
        shard_unlock(sh);
    }
    drop_file(db, log_tmp); /* whatever was not named: taken meanwhile, or the lock failed */
    drop_file(db, idx_tmp);
    if (!named)
        return;
    cut_point(CUT_SPARE_PREPARED);
    /* Not a condition of taking it: the durable point syncs the directory
     * before it passes an entry of the segment the spare becomes.  Synced
     * here, out of every lock, so that that sync usually has nothing to do. */
    fsync_dir(sh->dir);
}

int64_t recycle_take(shard *sh, uint64_t base, uint64_t need, uint64_t coverage,
                     uint32_t index_interval, int *fresh)
{
    char spare[COMET_PATH_MAX], final[COMET_PATH_MAX], idx[COMET_PATH_MAX], sidx[COMET_PATH_MAX];
    struct stat sb;
    *fresh = 0;
    if (!recycling_on(sh) || spare_path(sh, spare) || spare_index_path(sh, sidx) ||
        sys_stat(spare, &sb) ||
        (uint64_t)sb.st_size < need || (uint64_t)sb.st_size > SEGMENT_MAX_BYTES)
        return 0;
    segment_path(final, sh->dir, base, SEGMENT_SUFFIX);
    segment_path(idx, sh->dir, base, INDEX_SUFFIX);
    if (sys_stat(final, &sb) == 0)
        return set_error(COMET_E_CORRUPT, "segment %s already exists", final);
    uint64_t size = (uint64_t)sb.st_size;
    if (coverage < size)
        coverage = size;
    /* The prepared index when it is the size this segment needs. */
    int64_t rc = size_of(sidx) == index_file_bytes(coverage, index_interval)
                     ? index_take(sidx, sh->dir, sh->id, base, coverage, index_interval)
                     : index_create(sh->dir, sh->id, base, coverage, index_interval, size);
    if (rc)
        return rc;
    rc = rehead(sh, spare, base, coverage, fresh);
    if (rc < 0)
        goto fail;
    size = (uint64_t)rc;
    if (sys_rename(spare, final)) {
        rc = set_errno_error(errno, "cannot rename %s to %s", spare, final);
        goto fail;
    }
    /* The directory is not synced here: see the top comment. */
    return (int64_t)size;
fail:
    sys_unlink(idx);
    return rc;
}
