/*
 * retention.c - bounded disk use: deleting whole sealed segments, oldest
 * first, by age, by shard size and by the size of the whole data directory.
 *
 * Deletion always takes a prefix of a shard's segments (the numbering never
 * gets a hole), never the active segment, and leaves at least min_segments.
 * With protect_unconsumed, a segment holding entries that some registered
 * group has not acknowledged stops the deletion, until its newest entry is
 * older than force_delete_after: then it goes anyway and the entries lost to
 * the laggiest group are counted.
 *
 * Deleting is unlinking under the shard's append lock.  A reader in another
 * process that still maps the segment keeps reading it (the kernel keeps the
 * pages until the last mapping goes); a reader whose position was deleted
 * resumes at the first surviving entry and reports what it skipped.  The
 * active generation is bumped so every process lists the segments again.
 *
 * The whole-directory limit is also a budget: a rotation that would pass it
 * first deletes what the policy allows from its own shard, and when nothing
 * may go, the append fails with COMET_E_STORAGE_FULL instead of filling the
 * disk (append.c).
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"

/* Timestamp of a segment's first entry, -1 when it cannot be read. */
static int64_t first_timestamp(shard *sh, uint64_t base)
{
    segment *seg = shard_segment_by_base(sh, base);
    if (!seg)
        return -1;
    int64_t ts = -1;
    uint32_t lf;
    if (entry_validate(seg, SEGMENT_DATA_OFFSET, base, ENTRY_LEN_MASK, &lf) == ENTRY_OK)
        ts = entry_timestamp(seg, SEGMENT_DATA_OFFSET);
    shard_segment_release(sh, seg);
    return ts;
}

/* Deletes a sealed segment: its file becomes the shard's spare when it may be
 * kept (recycle.c), else it is unlinked.  Deleting to free the directory's
 * budget (may_keep 0) unlinks: a spare would free nothing. */
static void delete_segment(shard *sh, uint64_t base, uint64_t bytes, int may_keep)
{
    char path[COMET_PATH_MAX];
    int locked = usage_begin_delete(sh->stream->db);
    uint64_t kept = segment_file_bytes(sh->dir, base, SEGMENT_SUFFIX);
    if (!may_keep || !recycle_keep(sh, base)) {
        kept = 0;
        segment_path(path, sh->dir, base, SEGMENT_SUFFIX);
        if (sys_unlink(path))
            bytes = 0;
    }
    cut_point(CUT_RETENTION_UNLINKED);
    segment_path(path, sh->dir, base, INDEX_SUFFIX);
    sys_unlink(path); /* an index left by a crash here has no segment: it is never read */
    usage_end_delete(sh->stream->db, locked, bytes > kept ? bytes - kept : 0);
}

int retention_shard(shard *sh, uint64_t need, int may_keep, int64_t now,
                    comet_retention_report *rep)
{
    const comet_config *cfg = &sh->stream->db->cfg;
    state_file *st = sh->st;
    uint64_t *bases;
    size_t n;
    int rc = shard_list_segments(sh, &bases, &n);
    if (rc)
        return rc;
    uint64_t active = atomic_load(&st->active_end) ? atomic_load(&st->active_base) : UINT64_MAX;
    uint64_t keep = cfg->retention_min_segments > 1 ? cfg->retention_min_segments : 1;
    uint64_t total = 0;
    uint64_t *sizes = sys_calloc(n ? n : 1, sizeof *sizes);
    if (!sizes) {
        free(bases);
        return set_error(COMET_E_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        sizes[i] = segment_file_bytes(sh->dir, bases[i], SEGMENT_SUFFIX) +
                   segment_file_bytes(sh->dir, bases[i], INDEX_SUFFIX);
        total += sizes[i];
    }
    int registered = 0;
    uint64_t min_offset = cfg->retention_protect_unconsumed ? offsets_min(sh, &registered) : UINT64_MAX;
    int64_t age_cut = cfg->retention_max_age_ms ? now - (int64_t)cfg->retention_max_age_ms * 1000000 : INT64_MIN;
    int64_t force_cut = cfg->retention_force_delete_after_ms
                            ? now - (int64_t)cfg->retention_force_delete_after_ms * 1000000
                            : INT64_MIN;
    uint64_t freed = 0, deleted = 0, lost = 0;
    for (size_t i = 0; i + 1 < n && bases[i] < active && n - deleted > keep; i++) {
        uint64_t end = bases[i + 1];
        int64_t newest = first_timestamp(sh, end); /* no entry of segment i is newer */
        int by_age = newest >= 0 && newest < age_cut;
        int by_size = cfg->retention_max_shard_bytes && total - freed > cfg->retention_max_shard_bytes;
        int by_need = freed < need;
        if (!by_age && !by_size && !by_need)
            break;
        uint64_t lost_here = 0;
        if (min_offset < end) {
            if (!(newest >= 0 && newest < force_cut)) {
                if (rep)
                    rep->protected_segments++;
                break;
            }
            lost_here = end - (min_offset > bases[i] ? min_offset : bases[i]);
        }
        delete_segment(sh, bases[i], sizes[i], may_keep);
        freed += sizes[i];
        deleted++;
        lost += lost_here;
    }
    if (deleted) {
        cut_point(CUT_RETENTION_DELETED);
        atomic_store(&st->first_entry, bases[deleted]);
        wc_add(st, WC_RETENTION_DELETED_SEGMENTS, deleted);
        wc_add(st, WC_RETENTION_DELETED_BYTES, freed);
        wc_add(st, WC_RETENTION_LOST_ENTRIES, lost);
        if (lost)
            atomic_fetch_add_explicit(&sh->stream->db->lost_entries, lost, memory_order_relaxed);
        atomic_fetch_add_explicit(&st->active_gen, 1, memory_order_release);
        shard_refresh_segments(sh);
        if (rep) {
            rep->deleted_segments += deleted;
            rep->deleted_bytes += freed;
            rep->lost_entries += lost;
        }
    }
    free(sizes);
    free(bases);
    return 0;
}

uint64_t comet_retention_lost(comet_db *db)
{
    return db ? atomic_load_explicit(&db->lost_entries, memory_order_relaxed) : 0;
}

static int owned(const comet_db *db, uint32_t shard_id)
{
    return db->slot < 0 || shard_id % db->cfg.process_count == (uint32_t)db->slot;
}

/* Whether a shard this process has not open holds more than retention may
 * keep (more segments than retention_min_segments, or a spare): a directory
 * listing instead of an open, so that a pass over thousands of idle shards
 * costs no handles (lru.c). */
static int worth_opening(comet_db *db, const char *dir)
{
    uint64_t *bases;
    size_t n;
    if (segment_list_bases(dir, &bases, &n)) {
        clear_error();
        return 1; /* let the open say what is wrong */
    }
    free(bases);
    char spare[COMET_PATH_MAX];
    struct stat sb;
    uint32_t keep = db->cfg.retention_min_segments ? db->cfg.retention_min_segments : 1;
    return n > keep || (!path_format(spare, "%s/%s", dir, SPARE_NAME) && sys_stat(spare, &sb) == 0);
}

/* One pass over a stream's existing shards that this process owns. */
static int retention_stream(comet_db *db, comet_stream *s, uint64_t *excess, int64_t now,
                            comet_retention_report *rep)
{
    for (uint32_t id = 0; id < s->shard_count; id++) {
        char dir[COMET_PATH_MAX];
        struct stat sb;
        if (!owned(db, id) || path_format(dir, "%s/shard-%04u", s->dir, id) || sys_stat(dir, &sb))
            continue; /* never created: nothing to delete, and nothing to create */
        shard *sh;
        int rc = shard_acquire_if_open(s, id, &sh);
        if (rc == COMET_E_WOULD_BLOCK) {
            if (!worth_opening(db, dir))
                continue; /* closed here and nothing it could delete: not opened for it */
            rc = shard_acquire(s, id, &sh);
        }
        if (rc)
            return rc;
        rc = shard_lock(sh);
        if (!rc) {
            comet_retention_report here = {0};
            rc = retention_shard(sh, *excess, *excess == 0, now, &here);
            shard_unlock(sh);
            if (!rc)
                recycle_settle(sh, 0); /* a failure leaves no spare: nothing lost */
            *excess = here.deleted_bytes >= *excess ? 0 : *excess - here.deleted_bytes;
            if (rep) {
                rep->deleted_segments += here.deleted_segments;
                rep->deleted_bytes += here.deleted_bytes;
                rep->lost_entries += here.lost_entries;
                rep->protected_segments += here.protected_segments;
            }
        }
        shard_leave(sh);
        if (rc)
            return rc;
    }
    return 0;
}

int64_t comet_data_bytes(comet_db *db)
{
    if (!db)
        return set_error(COMET_E_INVALID, "comet_data_bytes: null db");
    int rc = db_enter(db);
    if (rc)
        return rc;
    int64_t used = (int64_t)usage_total_bytes(db);
    db_leave(db);
    return used;
}

static uint64_t free_spares(comet_db *db, uint64_t need);

int comet_run_retention(comet_db *db, comet_retention_report *out)
{
    return comet_run_retention_room(db, 0, out);
}

int comet_run_retention_room(comet_db *db, uint64_t room, comet_retention_report *out)
{
    if (!db)
        return set_error(COMET_E_INVALID, "comet_run_retention: null db");
    int rc = db_enter(db);
    if (rc)
        return rc;
    if (out)
        memset(out, 0, sizeof *out);
    uint64_t excess = 0;
    if (db->cfg.retention_max_total_bytes) {
        uint64_t used = usage_recount(db) + room;
        excess = used > db->cfg.retention_max_total_bytes ? used - db->cfg.retention_max_total_bytes : 0;
    }
    if (excess) {
        uint64_t freed = free_spares(db, excess);
        excess -= freed < excess ? freed : excess;
    }
    int64_t now = now_ns();
    DIR *d = sys_opendir(db->path);
    if (!d) {
        rc = set_errno_error(errno, "cannot list %s", db->path);
        db_leave(db);
        return rc;
    }
    struct dirent *de;
    while (!rc && (de = sys_readdir(d))) {
        size_t len = strlen(de->d_name);
        if (comet_validate_stream_name(de->d_name, len))
            continue;
        comet_stream *s;
        if (comet_stream_open(db, de->d_name, len, 0, 0, &s))
            continue; /* a directory that is not a stream */
        rc = retention_stream(db, s, &excess, now, out);
    }
    if (!rc && errno) /* the listing ended early: the rest is for the next pass */
        rc = set_errno_error(errno, "cannot list %s", db->path);
    sys_closedir(d);
    if (!rc)
        clear_error();
    db_leave(db);
    return rc;
}

/* ---- the budget across the whole directory ------------------------------------ */

typedef struct candidate {
    shard *sh;
    int64_t newest; /* no entry of the shard's oldest sealed segment is newer; -1: none */
    int spare;      /* the shard has a spare file (recycle.c) */
} candidate;

/* Room for one more candidate; 0, or COMET_E_NOMEM (c unchanged). */
static int grow_candidates(candidate **c, size_t n, size_t *cap)
{
    if (n < *cap)
        return 0;
    size_t want = *cap ? *cap * 2 : 64;
    candidate *more = sys_realloc(*c, want * sizeof *more);
    if (!more)
        return set_error(COMET_E_NOMEM, "out of memory for %zu retention candidates", want);
    *c = more;
    *cap = want;
    return 0;
}

static int by_age(const void *a, const void *b)
{
    int64_t x = ((const candidate *)a)->newest, y = ((const candidate *)b)->newest;
    return (x > y) - (x < y);
}

/* Whether the shard holds a spare file, recycling on or not (one left by an
 * earlier open with recycling on is disk all the same). */
static int has_spare(const shard *sh)
{
    char path[COMET_PATH_MAX];
    struct stat sb;
    return !path_format(path, "%s/%s", sh->dir, SPARE_NAME) && sys_stat(path, &sb) == 0;
}

/* The shards of every stream that have a sealed segment or a spare, entered
 * (pair each with shard_leave), oldest data first. */
static size_t gather(comet_db *db, candidate **out)
{
    size_t n = 0, cap = 0;
    candidate *c = NULL;
    DIR *d = sys_opendir(db->path);
    struct dirent *de;
    while (d && (de = sys_readdir(d))) {
        size_t len = strlen(de->d_name);
        comet_stream *s;
        if (comet_validate_stream_name(de->d_name, len) ||
            comet_stream_open(db, de->d_name, len, 0, 0, &s))
            continue;
        for (uint32_t id = 0; id < s->shard_count; id++) {
            char dir[COMET_PATH_MAX];
            struct stat sb;
            shard *sh;
            if (path_format(dir, "%s/shard-%04u", s->dir, id) || sys_stat(dir, &sb))
                continue;
            int rc = shard_acquire_if_open(s, id, &sh);
            if (rc == COMET_E_WOULD_BLOCK && worth_opening(db, dir))
                rc = shard_acquire(s, id, &sh);
            if (rc) {
                clear_error();
                continue;
            }
            uint64_t *bases;
            size_t nb;
            int64_t newest = -1;
            if (shard_list_segments(sh, &bases, &nb) == 0) {
                if (nb >= 2)
                    newest = first_timestamp(sh, bases[1]);
                free(bases);
            }
            int spare = has_spare(sh);
            if ((newest < 0 && !spare) || grow_candidates(&c, n, &cap)) {
                shard_leave(sh); /* nothing to delete here, or no memory: skipped */
                continue;
            }
            c[n++] = (candidate){sh, newest, spare};
        }
    }
    if (d && errno) { /* a partial listing would not know which data is the oldest */
        for (size_t i = 0; i < n; i++)
            shard_leave(c[i].sh);
        n = 0;
    }
    if (d)
        sys_closedir(d);
    clear_error();
    if (n)
        qsort(c, n, sizeof *c, by_age);
    *out = c;
    return n;
}

/* Unlinks the spares of gathered shards until need bytes are freed, but
 * skip's (the requester's: its next rotation takes it; its caller drops it
 * when nothing else may go).  Spares go before any data: they hold warm pages
 * for a rotation, no entry. */
static uint64_t drop_spares(candidate *c, size_t n, const shard *skip, uint64_t need)
{
    uint64_t freed = 0;
    for (size_t i = 0; i < n && freed < need; i++)
        if (c[i].spare && c[i].sh != skip && shard_lock(c[i].sh) == 0) {
            freed += recycle_drop(c[i].sh);
            shard_unlock(c[i].sh);
        }
    return freed;
}

/* The spares of the whole directory, until need bytes are freed: a policy
 * pass over the budget takes them before any data. */
static uint64_t free_spares(comet_db *db, uint64_t need)
{
    candidate *c = NULL;
    size_t n = gather(db, &c);
    uint64_t freed = drop_spares(c, n, NULL, need);
    for (size_t i = 0; i < n; i++)
        shard_leave(c[i].sh);
    free(c);
    return freed;
}

uint64_t retention_free_oldest(comet_db *db, const shard *requester, uint64_t need, int64_t now,
                               uint64_t *protected_segments)
{
    *protected_segments = 0;
    /* The shortfall was measured on the estimate, which counts no deletion:
     * what it overstates needs no deleting. */
    uint64_t estimate = usage_estimate(db), counted = usage_recount(db);
    if (estimate > counted) {
        if (estimate - counted >= need)
            return need;
        need -= estimate - counted;
    }
    uint64_t freed = 0;
    for (int pass = 0; pass < 4 && freed < need; pass++) {
        candidate *c = NULL;
        size_t n = gather(db, &c);
        uint64_t before = freed;
        freed += drop_spares(c, n, requester, need - freed);
        for (size_t i = 0; i < n; i++) {
            if (freed < need && c[i].newest >= 0 && shard_lock(c[i].sh) == 0) {
                comet_retention_report rep = {0};
                /* its oldest segment, if it may go; the requester's may become
                 * its spare: its next rotation takes it */
                retention_shard(c[i].sh, 1, c[i].sh == requester, now, &rep);
                shard_unlock(c[i].sh);
                freed += rep.deleted_bytes;
                *protected_segments += rep.protected_segments;
            }
            shard_leave(c[i].sh);
        }
        free(c);
        if (freed == before)
            break; /* nothing more may be deleted */
    }
    return freed;
}
