/*
 * log.h - the log: the in-memory objects of the storage engine and the
 * functions the files of log/ share.  One section per source file.
 *
 *   comet_db       a data directory opened by this process (db.c)
 *   comet_stream   a stream and its shards (stream.c)
 *   shard          one shard: its mapped state, its segments (shard.c)
 *   segment        one mapped segment file plus its sparse index (segment.c, index.c)
 *
 * log/ stands on port/ (port.h: system calls, files, clock, checksums,
 * errors, cut points) and, for comet_ingest's split of a JSON body only, on
 * codec/ (codec.h); neither of them includes this header.  The on-disk
 * layout is format.h's.  Every function follows the return convention that
 * port.h states.
 *
 * The inline tests an append makes of another file's state sit in that
 * file's own header (presence.h, stream.h, sync_failure.h; cursor.h for the
 * reader's cursor), included where they are made, so that this header calls
 * nothing of log/ and the files' calls point one way, down.
 */
#ifndef COMET_LOG_H
#define COMET_LOG_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "comet.h"
#include "format.h"
#include "port/port.h"

typedef struct shard shard;
typedef struct keys_table keys_table;

/* ---- names.c --------------------------------------------------------------- */

/* The path of segment base's file with suffix (SEGMENT_SUFFIX, INDEX_SUFFIX)
 * in the shard directory dir, into a COMET_PATH_MAX buffer. */
void segment_path(char *out, const char *dir, uint64_t base, const char *suffix);

/* ---- segment.c / index.c ------------------------------------------------- */

typedef struct segment {
    uint64_t base;         /* first entry number */
    _Atomic uint64_t capacity; /* bytes that may be accessed: allocated and announced; only rises */
    uint64_t map_bytes;    /* length of map and wmap (>= capacity): the reserved address space */
    uint8_t *map;          /* read-only shared mapping of the whole file */
    uint8_t *wmap;         /* writable mapping, only in a process that appended here */
    uint64_t zapped_to;    /* wmap pages below this were unmapped behind the writer */
    uint16_t version;      /* of its format (the header's): how its entries are checked */
    uint32_t flags;        /* SEGMENT_FLAG_* of its header */
    int fd;                /* kept by writers for zero fill and fdatasync; -1 otherwise */
    int refs;              /* users of the mapping; guarded by the shard's cache_lock */
    int removed;           /* no longer in the cache: freed when refs drop to zero */
    /* sparse index */
    uint8_t *index_map;
    size_t index_map_bytes;
    uint32_t index_capacity;
    uint32_t index_interval;
    int index_ok;          /* 0: missing or inconsistent, locate entries by scanning */
} segment;

/* A new segment file of capacity bytes whose index covers index_coverage. */
int segment_create(const char *dir, uint32_t shard_id, uint64_t base, uint64_t capacity,
                   uint64_t index_coverage, uint32_t index_interval);
/* A new segment header (version SEGMENT_VERSION) with its checksum. */
void segment_header_fill(segment_header *h, uint32_t shard_id, uint64_t base, uint64_t capacity,
                         uint64_t reserved, uint32_t flags);
segment *segment_new(uint64_t base);
/* recycle.c: a deleted segment's file reused as the shard's next segment.
 * recycle_keep makes the file of sealed segment base the shard's spare (1)
 * or leaves it to be unlinked (0).  recycle_take turns the spare, when there
 * is one of at least need bytes, into segment base: returns its capacity,
 * 0 when there is no spare, or a negative COMET_E_* code.  The spare's size
 * (0: none), counted in the shard's disk use. */
int recycle_keep(shard *sh, uint64_t base);
/* db.c: the flusher settles the file sh kept (recycle_settle) at once, not
 * at its next interval, so that the next rotation finds it the spare (a
 * rotation calls it once it is done).  Without a flusher the shard's next
 * sync settles it. */
void flusher_settle_soon(shard *sh);
int64_t recycle_take(shard *sh, uint64_t base, uint64_t need, uint64_t coverage,
                     uint32_t index_interval);
uint64_t recycle_spare_bytes(const shard *sh);
/* The inode of a file kept by recycle_keep and not yet the spare (0: none). */
uint64_t recycle_pending(const shard *sh);
/* Gives that file the spare's name once the directory is synced, so that a
 * rotation may take it: synced is recycle_pending's answer read before a
 * directory sync that just ended, or 0 to sync here (no lock held: a device
 * flush). */
int recycle_settle(shard *sh, uint64_t synced);
/* Unlinks the spare (append lock held), whether recycling is on or not: the
 * directory's budget needs the disk back.  Returns the bytes freed. */
uint64_t recycle_drop(shard *sh);
/* Recovery: when the file named as segment base is a recycled one whose new
 * header was lost (it says an older base), gives it back (spare, or unlinked)
 * and returns 1; else 0; a COMET_E_* code when its header cannot be read. */
int recycle_stale(shard *sh, uint64_t base);
int recycle_is_stale(const shard *sh, uint64_t base); /* the test of recycle_stale */
/* Maps the file and its index (seg->map is NULL before). */
int segment_load(segment *seg, const char *dir, uint32_t shard_id);
/* Maps the file only: enough to read an entry at a known offset. */
int segment_map(segment *seg, const char *dir, uint32_t shard_id);
/* Capacity recorded in the mapped header (another process may have grown it). */
uint64_t segment_header_capacity(const segment *seg);
void segment_free(segment *seg);
int segment_fd(segment *seg, const char *dir);
/* Maps seg->wmap (under the append lock). */
int segment_writable(segment *seg, const char *dir);
/* Unmaps written pages well behind off from wmap (see segment.c), in chunks
 * of SEGMENT_RELEASE_CHUNK; the test (append.c, segment_release_behind) is
 * inline, as every append makes it. */
#define SEGMENT_RELEASE_CHUNK ((uint64_t)1 << 20)
void segment_release_to(segment *seg, uint64_t off);
/* Grows the file to capacity; *remap is set when that passes the reserved
 * address space (every process must then map the file again). */
int segment_grow(segment *seg, const char *dir, uint64_t capacity, int empty, int *remap);
/* Raises seg->capacity to what the header announces, as far as the file
 * really extends and the mapping reaches; returns the new capacity. */
uint64_t segment_refresh_capacity(segment *seg, const char *dir);

static inline index_record *index_records(const segment *seg)
{
    return (index_record *)(seg->index_map + INDEX_RECORDS_OFFSET);
}

static inline _Atomic uint32_t *index_count_ptr(const segment *seg)
{
    return (_Atomic uint32_t *)(seg->index_map + INDEX_COUNT_OFFSET);
}

int index_create(const char *dir, uint32_t shard_id, uint64_t base, uint64_t capacity,
                 uint32_t interval, uint64_t allocate); /* blocks for the first `allocate` bytes' records */
/* Gives the index of segment base blocks for records up to capacity (before
 * the segment grows to it). */
int index_reserve(const char *dir, uint64_t base, uint64_t capacity, uint32_t interval);
/* Maps seg's index file: 1 with seg->index_ok set, or 0 when the index is
 * missing or inconsistent.  Not a failure: entries are then located by
 * scanning until the index is rebuilt (segcache.c, recovery.c).  An index
 * that cannot be opened, read or mapped (EIO, EMFILE, ENOMEM...) is a
 * COMET_E_* code: an I/O error is never taken for damage and "repaired". */
int index_map(segment *seg, const char *dir, uint32_t shard_id);
void index_unmap(segment *seg);
/* Whether the mapped index has a record slot for every interval of capacity. */
int index_covers(const segment *seg, uint64_t capacity);
/* Greatest record at or before rel_entry: sets *rel and *offset (the segment
 * start when there is none). */
void index_lookup(const segment *seg, uint64_t rel_entry, uint64_t *rel, uint64_t *offset);
/* Whether a record index_lookup gave points at its entry (a wrong index must
 * not make good entries look damaged); rel 0, the segment start, always does. */
int index_record_ok(const segment *seg, uint64_t rel, uint64_t offset);
void index_lookup_time(const segment *seg, int64_t ts, uint64_t *rel, uint64_t *offset);
/* Appends a record if offset is index_interval past the last one (under lock). */
void index_note(segment *seg, uint64_t rel_entry, uint64_t offset, int64_t ts);
/* The offset from which index_note adds a record (UINT64_MAX: it adds none):
 * an append calls index_note only for the entries from there on. */
static inline uint64_t index_note_from(const segment *seg)
{
    if (!seg->index_ok)
        return UINT64_MAX;
    uint32_t n = atomic_load_explicit(index_count_ptr(seg), memory_order_relaxed);
    if (n >= seg->index_capacity)
        return UINT64_MAX;
    return (n ? index_records(seg)[n - 1].offset : SEGMENT_DATA_OFFSET) + seg->index_interval;
}
/* Drops records at or after rel_next (recovery). */
void index_truncate(segment *seg, uint64_t rel_next);
/* Rewrites the index from the entries in [SEGMENT_DATA_OFFSET, end_offset)
 * numbered below end_entry.  Replaces seg's index mapping: only for an object
 * no other thread can see (see shard_segment_rebuild_index). */
int index_rebuild(segment *seg, const char *dir, uint32_t shard_id, uint64_t end_offset,
                  uint64_t end_entry);

/* ---- entry.c: validating and writing entries ------------------------------ */

typedef struct entry_ref {
    const uint8_t *data;
    uint32_t len;
    uint32_t flags; /* COMET_ENTRY_* */
} entry_ref;

/* A batch as an append takes it (batch.c builds it, append.c writes it). */
typedef struct entry_batch {
    const entry_ref *refs;
    uint32_t count;
    uint32_t compressed; /* entries flagged COMET_ENTRY_COMPRESSED */
    uint64_t total;      /* bytes stored, headers included */
    uint64_t raw;        /* payload bytes before compression */
} entry_batch;

/* Result of checking the entry header at an offset. */
typedef enum entry_check {
    ENTRY_OK,
    ENTRY_END,     /* zero header: nothing written here */
    ENTRY_BAD,     /* damaged: bad length, flags, number or checksum */
} entry_check;

entry_check entry_validate(const segment *seg, uint64_t off, uint64_t expect_entry,
                           uint32_t max_len, uint32_t *len_flags);
/* Fields of the entry header at off of a segment's mapping (FORMAT.md,
 * Entries); the one place that knows where they sit. */
int64_t entry_timestamp(const segment *seg, uint64_t off);
uint32_t entry_len_flags(const segment *seg, uint64_t off);
uint32_t entry_number_low(const segment *seg, uint64_t off);
/* Writes k <= 4 consecutive entries (header then payload each; flags are
 * ENTRY_FLAG_*) in the format of a segment of the given version; returns the
 * bytes written. */
uint64_t entry_write_group(uint8_t *dst, uint16_t version, const entry_ref *refs, uint32_t k,
                           uint64_t entry, int64_t ts, const uint32_t *flags);
/* Next plausible entry after a damaged one at off: returns 1 with
 * *found_off and *found_entry set, or 0 when nothing valid follows before
 * limit. */
int entry_resync(const segment *seg, uint64_t off, uint64_t expect_entry, uint64_t limit,
                 uint32_t max_len, uint64_t *found_off, uint64_t *found_entry);

/* ---- shard.c ------------------------------------------------------------- */

struct shard {
    struct comet_stream *stream;
    uint32_t id;
    char *dir; /* allocated: a process may know a shard struct for every shard it ever used */
    /* lru.c: SHARD_OPEN while its files are open here; the struct itself
     * stays published in stream->shards once made, closed or open. */
    atomic_int open;
    _Atomic int64_t last_used; /* real-time ns of the last acquire or append (lru_stamp) */
    struct shard *lru_prev, *lru_next; /* the db's open shards, under db->lru_lock */
    int state_fd;
    state_file *st;
    /* segments known to this process, sorted by base; guarded by cache_lock */
    pthread_mutex_t cache_lock;
    segment **segs;
    size_t nsegs, cap;
    uint64_t listed_active_gen; /* st->active_gen when the list was read */
    /* writer side, used under st->append_lock */
    segment *active;
    uint64_t active_gen;
    /* set by appends of this process, cleared by the flusher */
    atomic_int dirty;
    /* set when a rotation of this process left a kept file to settle,
     * cleared by the flusher's pass that settles it (flusher_settle_soon) */
    atomic_int settle_wanted;
    _Atomic int64_t state_synced_ns; /* when this process's last msync of the state ended */
    /* The stream's dir_made ticket this open drew after finding or making the
     * shard's directory: its name is durable once stream->dir_synced reaches
     * it (shard_sync_stream_dir). */
    uint64_t dir_ticket;
    /* calls inside the C core using this shard; comet_close waits for zero */
    atomic_int users;
    /* consumer offsets (offsets.c) */
    uint8_t *_Atomic offsets; /* NULL until a group is registered (offsets.c) */
    atomic_int offsets_fd;
    atomic_int offsets_dirty;
    struct comet_group *groups; /* groups.c: handles, guarded by cache_lock, kept until exit */
    /* presence.c: what the shard directory and state file were at open, and
     * the refusal once they are seen gone (0, or the code; detail under
     * cache_lock, written once before the code is published) */
    uint64_t dir_dev, dir_ino, state_dev, state_ino;
    atomic_int gone;
    char *gone_detail; /* allocated when the shard is first refused */
    /* keys.c: the idempotency keys, attached on first use (under cache_lock) */
    _Atomic(keys_table *) keys;
};

int shard_new(struct comet_stream *stream, uint32_t id, shard **out); /* closed */
int shard_open_files(shard *sh); /* the stream's open_lock held; on failure it stays closed */
void shard_close(shard *sh);   /* frees it (only for a shard never published) */
void shard_release(shard *sh); /* drops mappings and files; the struct stays */
int shard_lock(shard *sh);   /* append lock; repairs the tail if its holder died */
int shard_lock_noting_wait(shard *sh, int *waited);
/* An append that must not wait tries the lock inline (append.c,
 * shard_trylock_clean); when the lock is taken or the shard needs repair, it
 * lets go of it (if it got it) and returns nonzero from here. */
int shard_trylock_refused(shard *sh, int rc);
static inline void shard_unlock(shard *sh)
{
    pthread_mutex_unlock(&sh->st->append_lock.mutex);
}
/* append.c: the append path (lock, room and budget, write, publish). */
/* mode: COMET_APPEND_WAIT or COMET_APPEND_NOWAIT (comet.h, Appends). */
/* idem: NULL, or the request's idempotency key; a replay returns the first
 * entry of the batch the key stored before, with *replayed set to its count
 * (0 when this call stored the batch). */
int64_t shard_append(shard *sh, const entry_batch *b, int durability, int mode,
                     const comet_idempotency *idem, uint32_t *replayed);
/* keys.c: idempotency keys (FORMAT.md "Idempotency keys"). */
#define KEYS_CAPACITY 65536u /* keys a shard remembers (a power of two) */
typedef struct key_hit {
    uint64_t first;
    uint32_t count;
} key_hit;
/* Under the append lock: 1 and *hit when the key stored a batch still in
 * the log within its window, 0 when not, COMET_E_KEY_REUSED when it stored a
 * batch with another digest; COMET_E_WOULD_BLOCK (nowait) before the file is
 * attached and indexed in this process. */
int keys_find(shard *sh, const comet_idempotency *idem, int nowait, int64_t now, key_hit *hit);
/* Under the append lock, after a keys_find that returned 0: the record of the
 * batch [first, first + count) about to be written with timestamp ts. */
int keys_record(shard *sh, const comet_idempotency *idem, uint64_t first, uint32_t count,
                int64_t ts);
int keys_sync(shard *sh);          /* before a sync of the segments */
int keys_recorded(shard *sh, uint64_t first, uint64_t end); /* 1: a live record of that batch */
int keys_forget_after(shard *sh, uint64_t next); /* recovery: records of batches past next */
void keys_close(shard *sh);
int shard_sync(shard *sh, uint64_t upto_entry);
/* Makes the shard directory's name durable (an fsync of the stream's
 * directory unless a sync that began after this open made it already):
 * before anything in the directory is called durable.  0 or an error code. */
int shard_sync_stream_dir(shard *sh);
/* sync_failure.c (the test every append makes, shard_sync_refusal, is in
 * sync_failure.h): marks the shard failed after a sync of one of its files
 * (what: "fdatasync of the offsets") failed with errno err; returns the
 * COMET_E_SYNC_FAILED.  The _segment_ form names segment base as well. */
int shard_note_sync_failure(shard *sh, int err, const char *what);
int shard_note_segment_sync_failure(shard *sh, int err, const char *what, uint64_t base);
/* Segment containing entry (a new reference), or NULL with *next_base set to
 * the first base above entry when entry is in a gap. */
/* The segment holding entry (referenced), or NULL when entry lies before the
 * first one (deleted); *seg_end_entry: the next segment's base.  An error when
 * the directory cannot be listed or the segment mapped: COMET_E_CORRUPT (with
 * *seg_end_entry set) when it is damaged or gone, another code for an I/O or
 * memory failure, which readers report rather than skip. */
int shard_segment_for(shard *sh, uint64_t entry, segment **out, uint64_t *seg_end_entry);
segment *shard_segment_by_base(shard *sh, uint64_t base);
int shard_segment_get(shard *sh, uint64_t base, segment **out); /* with the reason */
/* Rebuilds seg's index file and swaps a fresh mapping of the segment into the
 * cache.  Takes over the caller's reference to seg; returns the new object
 * (referenced), or seg itself when the rebuild failed. */
segment *shard_segment_rebuild_index(shard *sh, segment *seg, uint64_t end_entry);
void shard_segment_release(shard *sh, segment *seg);
int shard_segment_fd(shard *sh, segment *seg); /* opened once, kept */
int shard_refresh_segments(shard *sh);
void shard_segments_clear(shard *sh);
/* Snapshot of the segment bases; caller frees.  _list reads the directory
 * again first (repair and retention); _bases trusts the cache. */
int shard_segment_bases(shard *sh, uint64_t **bases, size_t *count);
/* The bases of the segment files in dir, sorted (no shard needed). */
int segment_list_bases(const char *dir, uint64_t **bases, size_t *count);
int shard_list_segments(shard *sh, uint64_t **bases, size_t *count);

/* ---- cursor.c: walking committed entries (the cursor itself: cursor.h) ---- */

/* The len_flags and timestamp of a committed entry: 1, 0 when it is not
 * there to read (deleted, damaged), or a COMET_E_* code. */
int shard_entry_header(shard *sh, uint64_t entry, uint32_t *lf, int64_t *ts);

/* ---- presence.c: files taken away from under an open shard --------------- */
/* (presence_refusal, the test of every append: presence.h) */

/* Notes the shard directory's and state file's identity (shard_open). */
void presence_note(shard *sh, int state_fd);
/* Looks (a few stat calls): the refusal, or 0 when everything is in place.
 * At every sync and rotation. */
int presence_check(shard *sh);
/* rc (an append step's error) or, when the check finds its cause, the
 * refusal instead: a vanished directory named, not its symptom. */
int presence_explain(shard *sh, int rc);

/* ---- offsets.c ----------------------------------------------------------- */

int offsets_open(shard *sh); /* at shard open, under flock */
/* Maps the file if this process has not yet (under the shard's flock), making
 * it when create: 0 when attached, OFFSETS_NONE when there is no file (and
 * !create). */
#define OFFSETS_NONE 1
int offsets_attach(shard *sh, int create);
/* Slot i of the attached offsets file. */
static inline group_slot *offsets_slot(const shard *sh, uint32_t i)
{
    return (group_slot *)(sh->offsets + OFFSETS_SLOTS_OFFSET + (size_t)i * sizeof(group_slot));
}
void offsets_close(shard *sh);
int offsets_sync(shard *sh);
/* Smallest offset of the registered groups (UINT64_MAX when none). */
uint64_t offsets_min(shard *sh, int *registered);
/* The furthest offset of the registered groups (0 when none). */
uint64_t offsets_max(shard *sh);

/* ---- retention.c --------------------------------------------------------- */

/* Deletes what the policy allows from one shard (append lock held).  need is
 * a number of bytes the caller wants freed whatever the policy says (budget
 * enforcement at rotation); 0 for a policy pass.  may_keep: a deleted
 * segment's file may become the shard's spare (recycle.c). */
int retention_shard(shard *sh, uint64_t need, int may_keep, int64_t now,
                    comet_retention_report *rep);
/* Deletes sealed segments anywhere in the data directory, whatever process
 * owns the shard, the oldest data first, until `need` bytes are freed or
 * nothing more may go.  Other shards' spares (recycle.c) go before any data:
 * they hold none.  Call with no shard lock held: it takes each shard's lock
 * in turn.  Returns the bytes freed.  The requester may keep its own oldest
 * file as its spare (its next rotation takes it); when nothing else may go,
 * the caller drops that spare as the last resort. */
uint64_t retention_free_oldest(comet_db *db, const shard *requester, uint64_t need, int64_t now,
                               uint64_t *protected_segments);

/* ---- recovery.c ---------------------------------------------------------- */

/* Scans the tail from the committed point, keeps whole batches, cuts the rest.
 * Called with the append lock held. */
/* how: 0, STATE_REBUILT or STATE_REBOOTED.  due: the check has a cause (a
 * dead lock holder, recovery_pending, a rebuilt or rebooted state); without
 * one it is the check every opener makes, counted in recoveries only when it
 * repaired something, so that opening a healthy shard changes no counter. */
int recovery_repair_tail(shard *sh, int how, int due);
/* The same, the log ending at entry `limit` at the latest (resync.c). */
int recovery_repair_below(shard *sh, int how, int due, uint64_t limit);

/* ---- resync.c ------------------------------------------------------------ */

/* The repair of a shard marked sync_failed (sync_failure.c), by an opener
 * holding the append lock: writes the tail back, syncs it, keeps what
 * verifies and was acknowledged, clears the mark.  COMET_E_SYNC_FAILED (the
 * mark kept) when the device still fails. */
int recovery_after_failed_sync(shard *sh);

/* ---- state.c ------------------------------------------------------------- */

/* *rebuilt: STATE_REBUILT when the state was created or re-created (the
 * commit point must come from a scan), STATE_REBOOTED when it was written
 * before the machine restarted (only its durable point is sure), else 0. */
#define STATE_REBUILT 1
#define STATE_REBOOTED 2
/* STATE_UNHELD: no living process had the shard open (state.c), so the state
 * may be a durable copy that outlived its processes without a reboot (a copy
 * of the directory, a volume attached again, a cut the kernel survived): the
 * tail is checked as after a restart, but what is read may still come from
 * the page cache, so nothing is declared durable for it. */
#define STATE_UNHELD 3
int state_open(shard *sh, int *rebuilt, int *stale_lock);
/* Before state_close: the last process holding the shard marks a state whose
 * commit point is durable as closed cleanly (state.c). */
void state_close_if_last(shard *sh);
void state_close(shard *sh);
int state_init_locks(state_file *st);
/* A robust, process-shared mutex (in a shared mapping). */
int robust_mutex_init(pthread_mutex_t *m);

static inline uint64_t wc_get(const state_file *st, int c)
{
    return atomic_load_explicit(&((state_file *)st)->writer[c], memory_order_relaxed);
}
/* Writer counters change only under the append lock: a plain load and store. */
static inline void wc_add(state_file *st, int c, uint64_t v)
{
    atomic_store_explicit(&st->writer[c], wc_get(st, c) + v, memory_order_relaxed);
}
static inline void sc_add(state_file *st, int c, uint64_t v)
{
    atomic_fetch_add_explicit(&st->shared[c], v, memory_order_relaxed);
}

/* ---- stream.c ------------------------------------------------------------ */

struct comet_stream {
    struct comet_db *db;
    char name[COMET_STREAM_NAME_MAX + 1];
    char *dir; /* allocated: thousands of streams must not cost PATH_MAX each */
    uint32_t shard_count;
    int64_t created_ns;     /* from stream.meta: tells a stream from one created again under its name */
    pthread_mutex_t open_lock;
    shard *_Atomic *shards; /* opened lazily */
    /* Shard directories are made without syncing the stream's directory (an
     * open costs no device flush); the first sync of a shard's entries syncs
     * it, once for every shard directory opened before that sync began:
     * opens draw tickets from dir_made, a sync raises dir_synced to the
     * ticket count it read before its fsync. */
    _Atomic uint64_t dir_made;
    _Atomic uint64_t dir_synced;
    struct comet_stream *next;
    /* Set once this process learns that the stream was deleted: the handle
     * then fails every call with COMET_E_NO_STREAM, and its mappings are
     * released as soon as no thread is inside one of its shards (released). */
    atomic_int deleted;
    atomic_int released;
};

/* Marks a stream handle deleted in this process (the inline test of a
 * shard's calls, shard_check_deleted: stream.h). */
int stream_mark_deleted(comet_stream *s);
/* Releases the mappings of deleted streams no thread is using (db->lock held). */
void streams_sweep_deleted(comet_db *db);

/* Removes a directory tree, ignoring errors. */
void remove_tree(const char *path);
#define DELETED_PREFIX ".deleted-" /* a deleted stream's directory until it is removed */
int stream_check_shard(const comet_stream *s, int64_t id); /* COMET_E_SHARD_RANGE with detail */
/* The shard, opened if needed (lru.c), entered: a use count that comet_close
 * and closing it to make room wait on; COMET_E_CLOSED
 * once the data directory is closing.  Pair with shard_leave. */
int shard_acquire(comet_stream *s, uint32_t id, shard **out);
/* The same for a shard id the caller checked, without opening the shard:
 * COMET_E_WOULD_BLOCK when this process has not opened it yet (opening takes
 * a file lock another process may hold and checks the shard's tail). */
int shard_acquire_if_open(comet_stream *s, uint32_t id, shard **out);
/* An append's way in: shard_acquire, or with COMET_APPEND_NOWAIT
 * shard_acquire_if_open, leaving the recency stamp to shard_append, which
 * stamps it with the clock read it makes anyway. */
int shard_acquire_to_append(comet_stream *s, uint32_t id, int mode, shard **out);
int shard_enter(shard *sh);
static inline void shard_leave(shard *sh)
{
    atomic_fetch_sub_explicit(&sh->users, 1, memory_order_release);
}
/* Unmaps and closes everything of a stream's shards; the structs stay. */
void stream_release(comet_stream *s);

/* ---- db.c ---------------------------------------------------------------- */

struct comet_db {
    char path[COMET_PATH_MAX];
    comet_config cfg;
    atomic_int closed; /* set once by comet_close */
    atomic_int users;  /* calls inside the core at db level */
    pthread_mutex_t lock; /* streams list */
    comet_stream *streams;
    /* usage.c: the shared disk-use estimate, mapped on first use */
    usage_file *_Atomic usage;
    int usage_fd; /* kept open while mapped: it holds the shared lock (usage.c) */
    atomic_int usage_failed;
    pthread_mutex_t usage_lock;
    /* slots.c */
    int slots_fd;
    int slot;
    /* flusher */
    pthread_t flusher;
    int flusher_running;
    pthread_mutex_t flusher_lock;
    pthread_cond_t flusher_wake;
    int stopping;
    int settle_wanted; /* under flusher_lock: a shard kept a file to settle */
    struct comet_db *next_retired; /* closed handles, kept (see comet_close) */
    /* lru.c: the shards open in this process, most recently opened first */
    pthread_mutex_t lru_lock;
    shard *lru_head;
    uint32_t open_shards;  /* under lru_lock */
    uint32_t open_budget;  /* max_open_shards, or derived from the file limit */
    /* retention.c: entries this process's retention deleted before every group had them */
    _Atomic uint64_t lost_entries;
};

/* A call entering the data directory, counted in users, which comet_close
 * waits for: COMET_E_CLOSED once closing; pair with db_leave.  Inline, as
 * every shard acquire makes it, and so that the files db.c calls (stream.c,
 * retention.c) need nothing of db.c back. */
static inline int db_enter(comet_db *db)
{
    atomic_fetch_add(&db->users, 1);
    if (atomic_load(&db->closed)) {
        atomic_fetch_sub(&db->users, 1);
        return set_error(COMET_E_CLOSED, "data directory %s is closed", db->path);
    }
    return 0;
}

static inline void db_leave(comet_db *db)
{
    atomic_fetch_sub(&db->users, 1);
}

/* ---- lru.c ----------------------------------------------------------------- */

#define SHARD_CLOSED 0
#define SHARD_OPEN 1
#define SHARD_CLOSING 2 /* an evictor is checking that no thread entered */

/* The open-shard budget for a configuration (max_open_shards or derived). */
uint32_t lru_budget(const comet_config *cfg);
/* Closes least recently used idle shards until one more fits the budget, or
 * lets the open go over it (to a ceiling) while the flusher has dirty ones to
 * sync; COMET_E_TOO_MANY_OPEN when every open shard is in use.  No lock held. */
int lru_make_room(comet_db *db);
/* Closes least recently used clean idle shards until the open ones fit the
 * budget again (the flusher, after its pass). */
void lru_trim(comet_db *db);
void lru_add(shard *sh);    /* just opened (the stream's open_lock held) */
/* Closes an open shard's files and takes it off the list (open_lock held,
 * no thread inside it). */
void lru_close_shard(shard *sh);
/* Calls fn on each open shard, entered, one at a time (the rest may be
 * closed or opened meanwhile). */
void lru_for_each_open(comet_db *db, void (*fn)(shard *sh, void *ctx), void *ctx);
/* Recency stamps are the core's real-time clock (port/sys.h: moved by tests as
 * the entries' timestamps are): an append stamps with the time its entries
 * get, any other use with the coarse clock (one tick behind at most). */
static inline void lru_stamp(shard *sh, int64_t now)
{
    if (atomic_load_explicit(&sh->last_used, memory_order_relaxed) != now)
        atomic_store_explicit(&sh->last_used, now, memory_order_relaxed);
}
static inline void lru_touch(shard *sh)
{
    lru_stamp(sh, sys_clock_ns(CLOCK_REALTIME_COARSE));
}

/* ---- usage.c --------------------------------------------------------------- */

/* Bytes the data directory's segment and index files take: never below the
 * truth (see usage.c). */
uint64_t usage_estimate(comet_db *db);
/* The counts themselves, each a walk: the bytes the segment and index files
 * (and spares) take, of one shard / of the whole data directory; and of
 * segment base's file with suffix in the shard directory dir. */
uint64_t usage_shard_bytes(shard *sh);
uint64_t usage_total_bytes(comet_db *db);
uint64_t segment_file_bytes(const char *dir, uint64_t base, const char *suffix);
/* Whether bytes about to be allocated fit under budget: 0 when not (*used:
 * the estimate compared); USAGE_RESERVED when they are reserved, with the
 * estimate's mutex held until usage_allocated; USAGE_FITS when they fit by a
 * full count (no shared estimate: nothing reserved, nothing held). */
#define USAGE_RESERVED 1
#define USAGE_FITS 2
int usage_reserve(comet_db *db, uint64_t bytes, uint64_t budget, uint64_t *used);
/* After USAGE_RESERVED: the allocation is done (or failed: done = 0, the
 * reservation is given back); lets the mutex go. */
void usage_allocated(comet_db *db, uint64_t bytes, int done);
/* Counts every file (a walk, outside shard locks), makes that plus what is
 * reserved the estimate, and returns it. */
uint64_t usage_recount(comet_db *db);
/* Around deleting segment files: the estimate goes down by bytes, atomically
 * with respect to counts.  Pass begin's result to end. */
int usage_begin_delete(comet_db *db);
void usage_end_delete(comet_db *db, int locked, uint64_t bytes);
void usage_close(comet_db *db);


/* ---- compress.c ---------------------------------------------------------- */

/* Size of the decompressed frame, or -1 when the frame does not say. */
int64_t compress_frame_size(const uint8_t *src, size_t len);
/* Decompresses into dst; returns bytes written or a negative error code. */
int64_t decompress_frame(uint8_t *dst, size_t cap, const uint8_t *src, size_t len);
/* Room a compressed copy of len bytes may need. */
size_t compress_bound(size_t len);
/* One zstd frame (recording its content size) of src in dst; returns its size
 * or a negative error code. */
int64_t compress_frame(uint8_t *dst, size_t cap, const uint8_t *src, size_t len, int level);

#endif /* COMET_LOG_H */
