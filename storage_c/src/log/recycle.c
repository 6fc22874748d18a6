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
 * Keeping a file, power-cut-safely: the segment's file is renamed to
 * SPARE_PENDING_NAME under the append lock, and only after the directory is
 * synced (recycle_settle: by the sync that covers the next segment, by
 * retention, or by the flusher, with no lock held) does it get the spare's
 * name, or is unlinked when a spare is there still.  A rotation that deletes
 * for the shard's limit keeps the file it deletes and takes the spare kept
 * before, so steady rotations keep reusing files.  A rotation takes nothing
 * else, so a file is written in its new life only once its old name is
 * durably gone: otherwise the page cache could write the new life's pages
 * under the old name, whose entries the state on the disk may still count.
 *
 * Taking the spare, crash-safely: the new header (base, capacity = the
 * file's size, RECYCLED) is written while the file still has its spare name,
 * then the file is renamed to the segment's name.  Neither the directory
 * (the first sync covering the segment does that, durability.c) nor the
 * header is synced then (that would write back, in the append path,
 * whatever of the file's earlier life is still dirty): the first sync of an
 * entry of the new segment takes it along.  A crash before the rename leaves
 * a spare (the header is rewritten at the next take).  A power cut after it
 * may leave the segment's name on the file with its old header, saying an
 * older base: nothing of the new segment was made durable then, and
 * recovery gives the file back to the spare slot (recycle_stale).
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

#include "log.h"

static int spare_path(const shard *sh, char *out)
{
    return path_format(out, "%s/%s", sh->dir, SPARE_NAME);
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

static int pending_path(const shard *sh, char *out)
{
    return path_format(out, "%s/%s", sh->dir, SPARE_PENDING_NAME);
}

int recycle_keep(shard *sh, uint64_t base)
{
    const comet_config *cfg = &sh->stream->db->cfg;
    char from[COMET_PATH_MAX], to[COMET_PATH_MAX];
    struct stat sb;
    if (!recycling_on(sh) || pending_path(sh, to) || sys_stat(to, &sb) == 0)
        return 0;
    segment_path(from, sh->dir, base, SEGMENT_SUFFIX);
    /* Only a full-size file is worth keeping: it is what a rotation needs. */
    if (sys_stat(from, &sb) || (uint64_t)sb.st_size < cfg->segment_bytes ||
        (uint64_t)sb.st_size > SEGMENT_MAX_BYTES)
        return 0;
    return sys_rename(from, to) == 0;
}

/* Rewrites the spare's header for segment base; returns the file's size. */
static int64_t rehead(shard *sh, const char *path, uint64_t base, uint64_t coverage)
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
    segment_header_fill(&h, sh->id, base, size, coverage, SEGMENT_FLAG_RECYCLED);
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

static uint64_t drop(shard *sh, int (*name)(const shard *, char *))
{
    char path[COMET_PATH_MAX];
    struct stat sb;
    if (name(sh, path) || sys_stat(path, &sb))
        return 0;
    int locked = usage_begin_delete(sh->stream->db);
    uint64_t freed = sys_unlink(path) == 0 ? (uint64_t)sb.st_size : 0;
    usage_end_delete(sh->stream->db, locked, freed);
    return freed;
}

uint64_t recycle_drop(shard *sh)
{
    return drop(sh, spare_path) + drop(sh, pending_path);
}

uint64_t recycle_pending(const shard *sh)
{
    char pending[COMET_PATH_MAX];
    struct stat sb;
    if (pending_path(sh, pending) || sys_stat(pending, &sb))
        return 0;
    return (uint64_t)sb.st_ino;
}

int recycle_settle(shard *sh, uint64_t synced)
{
    char pending[COMET_PATH_MAX], spare[COMET_PATH_MAX];
    struct stat sb;
    if (pending_path(sh, pending) || spare_path(sh, spare))
        return 0;
    if (!synced) {
        if (!(synced = recycle_pending(sh)))
            return 0;
        int rc = fsync_dir(sh->dir);
        if (rc)
            return rc; /* kept pending: the next pass tries again, an opener removes it */
    }
    /* Only the file that had its pending name before the directory sync
     * began: a file kept since then may still have its old name on disk.
     * Another process may have settled it meanwhile (nothing to rename).
     * This rename need not be durable: a power cut that loses it leaves a
     * temporary file, which openers remove. */
    if (sys_stat(pending, &sb) || (uint64_t)sb.st_ino != synced)
        return 0;
    if (sys_stat(spare, &sb) == 0) { /* one spare is all a rotation takes */
        drop(sh, pending_path);
        return 0;
    }
    if (sys_rename(pending, spare) && errno != ENOENT)
        return set_errno_error(errno, "cannot rename %s to %s", pending, spare);
    return 0;
}

int64_t recycle_take(shard *sh, uint64_t base, uint64_t need, uint64_t coverage,
                     uint32_t index_interval)
{
    char spare[COMET_PATH_MAX], final[COMET_PATH_MAX], idx[COMET_PATH_MAX];
    struct stat sb;
    if (!recycling_on(sh) || spare_path(sh, spare) || sys_stat(spare, &sb) ||
        (uint64_t)sb.st_size < need || (uint64_t)sb.st_size > SEGMENT_MAX_BYTES)
        return 0;
    segment_path(final, sh->dir, base, SEGMENT_SUFFIX);
    segment_path(idx, sh->dir, base, INDEX_SUFFIX);
    if (sys_stat(final, &sb) == 0)
        return set_error(COMET_E_CORRUPT, "segment %s already exists", final);
    uint64_t size = (uint64_t)sb.st_size;
    if (coverage < size)
        coverage = size;
    int64_t rc = index_create(sh->dir, sh->id, base, coverage, index_interval, size);
    if (rc)
        return rc;
    rc = rehead(sh, spare, base, coverage);
    if (rc < 0)
        goto fail;
    size = (uint64_t)rc;
    if (sys_rename(spare, final)) {
        rc = set_errno_error(errno, "cannot rename %s to %s", spare, final);
        goto fail;
    }
    /* The name is synced by the first sync covering the segment, before
     * the durable point moves into it (durability.c); until then a power cut
     * may leave the old name, or the new one with the old header (recovery
     * gives the file back: recycle_stale). */
    return (int64_t)size;
fail:
    sys_unlink(idx);
    return rc;
}
