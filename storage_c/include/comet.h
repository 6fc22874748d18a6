/*
 * comet.h - public interface of the Comet storage core.
 *
 * A data directory holds streams; a stream has a fixed number of shards; a
 * shard is an append-only log of CRC-checked entries numbered densely from 0.
 * Any number of processes may open the same data directory: appends to a
 * shard are serialised by a process-shared robust mutex kept in the shard's
 * mmap'd state file, and readers never take a lock (they read up to the
 * committed entry published in that state).
 *
 * Conventions:
 *   - Functions that can fail return an int (or int64_t) that is negative on
 *     error: one of the COMET_E_* codes below. Those numbers are stable.
 *   - After a failure, comet_last_error() returns a human-readable sentence
 *     for the calling thread ("stream name 'a/b' contains '/'").
 *   - Every handle is safe to use from many threads at once.  Handles must
 *     not be used across fork(): open the data directory in the child.
 *
 * The on-disk format is described byte by byte in storage_c/FORMAT.md.
 */
#ifndef COMET_H
#define COMET_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define COMET_API_VERSION 2
/* Version of the files this build writes (storage_c/FORMAT.md).  Segment
 * files have their own; this build also reads segment version 1. */
#define COMET_FORMAT_VERSION 1
#define COMET_SEGMENT_VERSION 2

/* Stable error codes. 0 is success; every error is negative. */
enum {
    COMET_OK = 0,
    COMET_E_INVALID = -1,            /* bad argument (null pointer, bad config) */
    COMET_E_STREAM_NAME = -2,        /* stream name outside ^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$ */
    COMET_E_SHARD_RANGE = -3,        /* shard id >= the stream's shard count */
    COMET_E_ENTRY_TOO_LARGE = -4,    /* one entry above max_entry_bytes */
    COMET_E_SHARD_COUNT = -5,        /* reopened with another shard count */
    COMET_E_FORMAT_VERSION = -6,     /* a file written by an unknown format version */
    COMET_E_CORRUPT = -7,            /* damaged data that could not be repaired */
    COMET_E_STORAGE_FULL = -8,       /* no space (ENOSPC, EDQUOT, EFBIG) */
    COMET_E_IO = -9,                 /* any other operating-system error */
    COMET_E_NO_SLOT = -10,           /* every process slot is held */
    COMET_E_NO_STREAM = -11,         /* stream does not exist and creation was not asked */
    COMET_E_CLOSED = -12,            /* handle already closed */
    COMET_E_PROCESS_COUNT = -13,     /* running processes use another process_count */
    COMET_E_NOMEM = -14,             /* out of memory */
    COMET_E_BUFFER_TOO_SMALL = -15,  /* read buffer cannot hold the next entry */
    COMET_E_BATCH_TOO_LARGE = -16,   /* batch above COMET_MAX_BATCH_BYTES or entries */
    COMET_E_WANTS_COMPRESSION = -17, /* an entry is above raw_limit: compress it and retry */
    /* -18 is retired: never returned, never to be given another meaning */
    COMET_E_DECOMPRESS = -19,        /* a compressed entry failed to decompress */
    COMET_E_SLOT_HELD = -20,         /* this handle already holds a slot */
    COMET_E_GROUP_NAME = -21,        /* group name outside [A-Za-z0-9._-]{1,47} */
    COMET_E_TOO_MANY_GROUPS = -22,   /* every group slot of the shard is taken */
    COMET_E_NO_GROUP = -23,          /* group not registered (or deleted) */
    COMET_E_ACK_GAP = -24,           /* ack_range would skip unacknowledged entries */
    COMET_E_BAD_JSON = -25,          /* an ingested body is not valid JSON (comet_ingest_result says where) */
    COMET_E_NO_EVENTS = -26,         /* an ingested body holds no event (empty, blank lines, []) */
    COMET_E_STREAM_LIMIT = -27,      /* creating the stream would pass max_streams */
    COMET_E_WOULD_BLOCK = -28,       /* a COMET_APPEND_NOWAIT append would wait: nothing written */
    COMET_E_BAD_OTLP = -29,          /* an OTLP export request refused whole (comet_otlp_result says where) */
    COMET_E_SYNC_FAILED = -30,       /* a sync (fsync, fdatasync, msync) of the shard failed: it refuses appends until reopened */
    COMET_E_GONE = -31,              /* a file or directory of the data directory was removed while in use */
    COMET_E_READ_ONLY = -32,         /* the filesystem holding the data directory is read-only (EROFS) */
    COMET_E_KEY_REUSED = -33,        /* an idempotency key already stored another request's batch */
    COMET_E_TOO_MANY_OPEN = -34,     /* every open shard handle is in use (max_open_shards, file limit) */
};
#define COMET_ERROR_COUNT 35

/* Durability, per data directory (config) and overridable per append. */
enum {
    COMET_DURABILITY_DEFAULT = -1, /* use the data directory's setting */
    COMET_DURABILITY_NONE = 0,     /* page cache; background flush */
    COMET_DURABILITY_INTERVAL = 1, /* page cache; fsync at most fsync_interval_ms later */
    COMET_DURABILITY_ALWAYS = 2,   /* returns after fdatasync (group commit) */
};

/* Per-entry flags, as given to appends and returned by reads. */
#define COMET_ENTRY_COMPRESSED 0x1u /* payload is one zstd frame */

/* Limits. */
#define COMET_MAX_ENTRY_BYTES_LIMIT 0x0FFFFFFFu     /* 256 MiB - 1: 28-bit length field */
#define COMET_MAX_BATCH_BYTES ((uint64_t)1 << 31)   /* one append, headers included */
#define COMET_MAX_SHARDS 65536u
#define COMET_MAX_PROCESSES 1024u
#define COMET_STREAM_NAME_MAX 64
#define COMET_GROUP_NAME_MAX 47
#define COMET_MAX_GROUPS 512

/* Open flags. */
#define COMET_OPEN_CREATE 0x1u        /* create the data directory if missing */
#define COMET_OPEN_NO_FLUSHER 0x2u    /* no background flush thread (tools, tests) */
/* Unlink every segment retention deletes.  By default one deleted file per
 * shard is kept and reused as the shard's next segment, so that appends land
 * on pages the page cache already holds (FORMAT.md, Recycled segments). */
#define COMET_OPEN_NO_RECYCLE 0x4u

typedef struct comet_config {
    uint64_t segment_bytes;        /* rotate at this size; default 16 MiB */
    uint32_t max_entry_bytes;      /* default 16 MiB */
    uint32_t index_interval_bytes; /* one sparse index record per this much data; default 4 KiB */
    uint32_t default_shards;       /* shard count of new streams; default 16 */
    int32_t durability;            /* COMET_DURABILITY_*; default INTERVAL */
    uint32_t fsync_interval_ms;    /* default 1000 */
    uint32_t process_count;        /* processes sharing the directory; default 1 */
    uint32_t flags;                /* COMET_OPEN_* */
    /* Retention (0 turns a limit off).  Whole sealed segments are deleted,
     * oldest first; the active segment never is. */
    uint64_t retention_max_age_ms;      /* entries older than this */
    uint64_t retention_max_shard_bytes; /* per shard */
    uint64_t retention_max_total_bytes; /* whole data directory; also an append budget */
    uint64_t retention_force_delete_after_ms; /* delete unconsumed data older than this anyway */
    uint32_t retention_min_segments;    /* keep at least this many per shard; default 1 */
    uint32_t retention_protect_unconsumed; /* keep segments a registered group has not acked; default 1 */
    uint32_t retention_interval_ms;     /* background pass period; 0: only when asked; default 60000 */
    /* A segment's file is allocated as it fills, not whole: it starts at
     * 16 KiB and grows by doubling, in steps of at most this many bytes (a
     * multiple of 4096, at least 64 KiB), up to segment_bytes; default 4 MiB.
     * At segment_bytes or more, segments are allocated whole at creation. */
    uint32_t segment_chunk_bytes;
    /* Streams the data directory may hold; creating one more fails with
     * COMET_E_STREAM_LIMIT (0: no limit, the default). */
    uint32_t max_streams;
    /* Shards this process keeps open at once (descriptors and mappings);
     * the least recently used idle one is closed to open another, and when
     * every open shard is in use the call fails with COMET_E_TOO_MANY_OPEN.
     * 0 (the default): min(256, (RLIMIT_NOFILE soft limit - 128) / 4). */
    uint32_t max_open_shards;
} comet_config;

typedef struct comet_db comet_db;
typedef struct comet_stream comet_stream;

/* Per-shard statistics, read from the shard's shared state (any process). */
typedef struct comet_shard_stats {
    uint64_t first_entry;         /* oldest entry still stored */
    uint64_t next_entry;          /* committed count: entries [first, next) exist */
    uint64_t durable_entry;       /* entries below this are fsynced */
    uint64_t segments;
    uint64_t disk_bytes;          /* allocated size of segment and index files */
    uint64_t active_bytes;        /* bytes in use in the active segment */
    int64_t oldest_timestamp;     /* ns; 0 when empty or not asked for (below) */
    int64_t newest_timestamp;     /* ns; 0 when empty */
    uint64_t appends;             /* append calls */
    uint64_t appended_entries;
    uint64_t appended_raw_bytes;  /* payload bytes given by callers, before compression */
    uint64_t appended_stored_bytes; /* bytes written to segments, headers included */
    uint64_t compressed_entries;
    uint64_t append_latency_sum_ns;
    uint64_t append_latency_count;
    uint64_t append_latency_max_ns;
    uint64_t rotations;
    uint64_t syncs;
    uint64_t lock_owner_died;     /* times a locker found the previous holder dead */
    /* Tail checks after a dead lock holder, a rebuilt state or a restart
     * (repairing or not), and checks at open that repaired something: opening
     * a healthy shard, as every process and tool does, counts nothing. */
    uint64_t recoveries;
    uint64_t truncated_bytes;     /* garbage cut from tails on recovery */
    uint64_t truncated_entries;   /* whole entries cut (torn batches, damaged tail) */
    uint64_t orphaned_segments;   /* segments beyond a cut, set aside as *.orphan */
    uint64_t state_rebuilds;
    uint64_t index_rebuilds;
    uint64_t crc_failures;        /* damaged entries met by readers */
    uint64_t skipped_entries;     /* entries readers could not return */
    uint64_t storage_full_errors;
    uint64_t retention_deleted_segments;
    uint64_t retention_deleted_bytes;
    uint64_t retention_lost_entries;
    uint64_t recycled_segments;   /* segments that reused a deleted segment's file */
    uint64_t sync_failures;       /* fsync, fdatasync or msync calls of the shard that failed */
    /* Nonzero (the errno of the first failure): a sync failed and the shard
     * refuses appends (COMET_E_SYNC_FAILED) until an opener repairs it. */
    uint64_t sync_failed_errno;
    uint64_t key_replays;         /* keyed appends answered with the batch their key stored before */
} comet_shard_stats;

/* Batch read into caller-provided buffers. */
#define COMET_READ_DURABLE_ONLY 0x1u
/* Each payload is followed by '\n' in data (offsets then include it), and
 * payloads that hold a '\n' themselves are counted in newline_payloads: with
 * none, data is NDJSON ready to ship. */
#define COMET_READ_NEWLINES 0x2u

typedef struct comet_read_request {
    uint64_t from_entry;
    uint32_t max_entries;   /* capacity of entries/timestamps/flags; offsets holds max_entries + 1 */
    uint32_t flags;         /* COMET_READ_* */
    uint64_t max_bytes;     /* stop before payloads exceed this (at least one entry is returned) */
    uint8_t *data;          /* payloads, back to back, decompressed */
    uint64_t data_capacity; /* at most 2 GiB - 1: offsets are int32 (Arrow binary layout) */
    int32_t *offsets;       /* payload i is data[offsets[i] .. offsets[i+1]) */
    int64_t *entries;       /* entry numbers (may have gaps where damaged entries were skipped) */
    int64_t *timestamps;    /* unix ns */
} comet_read_request;

typedef struct comet_read_result {
    uint32_t count;         /* entries returned */
    uint32_t compressed;    /* how many of them were decompressed */
    uint64_t next_entry;    /* where the next read should start */
    uint64_t skipped;       /* entries skipped (damaged, or deleted by retention) */
    uint64_t data_bytes;    /* bytes used in data */
    uint64_t needed_bytes;  /* with COMET_E_BUFFER_TOO_SMALL: size of the next payload */
    uint64_t limit_entry;   /* committed (or durable) entry the read was bounded by */
    uint64_t newline_payloads; /* with COMET_READ_NEWLINES: payloads holding a newline */
} comet_read_result;

typedef struct comet_group comet_group;

typedef struct comet_group_info {
    char name[48];
    uint64_t offset;        /* next entry to consume */
    uint64_t lag;           /* committed - offset */
    int64_t last_ack_ns;    /* when the offset last moved (coarse clock), 0: never */
    int64_t registered_ns;
    uint64_t acks;          /* acks that moved the offset */
    uint64_t delivered;     /* records the group's consumer delivered (comet_group_count) */
    uint64_t retries;       /* attempts it retried */
    uint64_t failed;        /* records it gave up on (dead letters) */
    int64_t last_delivery_ns; /* when it last delivered (coarse clock), 0: never */
} comet_group_info;

typedef struct comet_retention_report {
    uint64_t deleted_segments;
    uint64_t deleted_bytes;
    uint64_t lost_entries;       /* deleted before every registered group had them (forced) */
    uint64_t protected_segments; /* kept only because a group still needs them */
} comet_retention_report;

#define COMET_VERIFY_MAX_PROBLEMS 16

typedef struct comet_verify_problem {
    uint64_t segment_base;  /* segment file's first entry */
    uint64_t offset;        /* byte offset in the segment */
    uint64_t entry;         /* entry number expected there */
    int32_t code;           /* COMET_E_CORRUPT and friends */
    uint32_t reserved;
} comet_verify_problem;

typedef struct comet_verify_report {
    uint64_t segments;
    uint64_t entries;        /* good entries */
    uint64_t bytes;          /* good entry bytes, headers included */
    uint64_t bad_entries;    /* entries lost to damage */
    uint64_t index_problems; /* index files missing or inconsistent (rebuilt: derived data) */
    uint32_t problem_count;  /* problems listed below (at most COMET_VERIFY_MAX_PROBLEMS) */
    uint32_t reserved;
    comet_verify_problem problems[COMET_VERIFY_MAX_PROBLEMS];
} comet_verify_report;

/* Errors. */
const char *comet_strerror(int code);
const char *comet_last_error(void);

/* Configuration and data directory. */
void comet_config_default(comet_config *cfg);
/* The checks comet_open makes of cfg, without opening anything:
 * COMET_E_INVALID with the reason in comet_last_error(). */
int comet_config_check(const comet_config *cfg);
int comet_open(const char *path, const comet_config *cfg, comet_db **out);
/* Waits for calls in progress, flushes, and releases every mapping, file,
 * lock and thread.  Later calls on the handle (or its streams and shards)
 * fail with COMET_E_CLOSED: the handle's small structs are kept for the life
 * of the process so that a call racing with close never touches freed memory. */
int comet_close(comet_db *db);
int comet_sync_all(comet_db *db);

/* Process slots: claim the lowest free slot (slot < 0) or a given one.
 * Returns the slot id. The kernel releases it when the process dies. */
int comet_claim_slot(comet_db *db, int slot);
int comet_release_slot(comet_db *db);
int comet_slot(const comet_db *db);          /* -1 when none is held */
uint32_t comet_process_count(const comet_db *db);

/* Streams. Names are given with their length, so an embedded NUL is refused
 * rather than silently cutting the name.  shards = 0 takes the recorded count (or the default for a new
 * stream); create = 0 fails with COMET_E_NO_STREAM if it does not exist.
 * The handle belongs to the db and stays valid until comet_close. */
int comet_stream_open(comet_db *db, const char *name, size_t name_len, uint32_t shards,
                      int create, comet_stream **out);
int comet_validate_stream_name(const char *name, size_t name_len);
/* Deletes a stream and frees its disk.  Safe while other processes use it:
 * each shard is marked deleted under its append lock (an append or read
 * after that fails with COMET_E_NO_STREAM in every process, which then
 * releases its mappings), the directory is renamed out of the way at once
 * (the name may be created again right after) and then removed.  A crash
 * midway leaves a hidden ".deleted-*" directory that the next comet_open
 * removes. */
int comet_stream_delete(comet_db *db, const char *name, size_t name_len);
uint32_t comet_stream_shards(const comet_stream *s);
/* When the stream was created (unix ns, from its metadata): a stream deleted
 * and created again under the same name has another value. */
int64_t comet_stream_created(const comet_stream *s);
const char *comet_stream_name(const comet_stream *s);
/* Stream names, each followed by '\n'. Returns the bytes needed (may exceed cap). */
int64_t comet_list_streams(comet_db *db, char *buf, size_t cap);

/* Shard routing: owner slot of a shard, and the shard of a partition key. */
uint32_t comet_shard_owner(const comet_stream *s, uint32_t shard);
uint32_t comet_shard_for_key(const comet_stream *s, const void *key, size_t len);
/* Opens a shard in this process (reading its files, repairing a torn tail
 * left by a dead writer) without appending: the part of a first append that
 * may wait, done ahead by a caller whose appends never wait
 * (COMET_APPEND_NOWAIT refuses a shard not open here).  shard < 0: every
 * shard this process owns (all of them without a slot), in one call.  0 when
 * open. */
int comet_shard_open(comet_stream *s, int shard);

/* ---- Appends ------------------------------------------------------------
 * Five shapes, one entry point each: one entry; entries back to back in one
 * buffer with their lengths; entries given as (pointer, length) pairs;
 * delimited records of one buffer; a JSON or NDJSON request body.  Each
 * returns the first entry number of the batch, or an error.  A batch is
 * atomic: all its entries become visible together, contiguous and in order,
 * or none does.  Every input is checked before anything is locked or
 * written, so a bad call fails with its own error whatever the mode.
 *
 * durability is a COMET_DURABILITY_*.  mode follows it in every append (in
 * comet_ingest, as the request's field after durability):
 *   COMET_APPEND_WAIT    the append waits for whatever it needs.
 *   COMET_APPEND_NOWAIT  the append never sleeps.  Where it would first have
 *       to wait - for the shard's lock held by another thread or process, to
 *       open the shard in this process, to create a segment (the first, or at
 *       a rotation: files created and synced), to delete old segments for
 *       retention_max_shard_bytes or retention_max_total_bytes, to repair the
 *       shard's tail, or to sync
 *       (durability "always", or "interval" when the shard's last sync is
 *       older than twice fsync_interval_ms) - it writes nothing and returns
 *       COMET_E_WOULD_BLOCK, and the caller makes the same call with
 *       COMET_APPEND_WAIT, for instance on a thread that may sleep.  Short
 *       I/O on the active segment it does itself: mapping it, growing its
 *       file by a chunk, zero-filling the pages ahead (well under a
 *       millisecond).  For a caller that must not sleep: an event loop, or a
 *       Python call holding the GIL. */
enum {
    COMET_APPEND_WAIT = 0,
    COMET_APPEND_NOWAIT = 1,
};

/* One entry; flags: COMET_ENTRY_*. */
int64_t comet_append(comet_stream *s, uint32_t shard, const void *payload, uint32_t len,
                     uint32_t flags, int durability, int mode);
/* count entries: entry i is the lens[i] bytes of buf after the entries
 * before it, with flags[i] (flags may be NULL: none). */
int64_t comet_append_batch(comet_stream *s, uint32_t shard, const void *buf,
                           const uint32_t *lens, const uint8_t *flags, uint32_t count,
                           int durability, int mode);
/* Entries given as (pointer, length) pairs, gathered without a copy (the
 * Python API's list of bytes).  An entry longer than raw_limit (0 = no limit)
 * makes the call fail with COMET_E_WANTS_COMPRESSION before anything is
 * written: the caller compresses it and appends with comet_append_batch. */
typedef struct comet_payload {
    const void *data;
    uint64_t len;
} comet_payload;
int64_t comet_append_vector(comet_stream *s, uint32_t shard, const comet_payload *items,
                            uint32_t count, uint32_t raw_limit, int durability, int mode);
/* One entry per delimited record; empty records are skipped when skip_empty;
 * raw_limit as above.  *count_out: the entries appended. */
int64_t comet_append_delimited(comet_stream *s, uint32_t shard, const void *buf, size_t len,
                               uint8_t delimiter, int skip_empty, uint32_t raw_limit,
                               int durability, int mode, uint32_t *count_out);

/* JSON ingest: a request body in, its events appended as one atomic batch.
 *
 * In one linear pass over the (already decoded) body, comet_ingest checks
 * strict RFC 8259 JSON, UTF-8 included; splits it into events - a JSON body
 * that is an array gives one event per element, any other JSON value one
 * event; an NDJSON body gives one event per line that is not blank; drops only
 * insignificant whitespace, so every string and number token is stored byte
 * for byte as sent (numbers are never converted; duplicate keys are kept as
 * sent); checks each event's size as sent against max_entry_bytes; compresses
 * events above compress_above; and appends them all, or nothing.  On a bad
 * body it stores nothing and fills the result's error fields: the first bad
 * event's index, its line, the byte offset of the fault and the reason.
 * Nesting of arrays and objects within one event is limited to
 * COMET_JSON_MAX_DEPTH levels (the event itself is level 1).  The body is
 * checked in either mode before the append is tried. */
#define COMET_BODY_JSON 1u
#define COMET_BODY_NDJSON 2u
#define COMET_BODY_LINES 3u /* one event per line that is not empty, stored unchecked (a "\r" before the "\n" is dropped) */
#define COMET_BODY_RAW 4u   /* the whole body is one event, stored unchecked */
#define COMET_JSON_MAX_DEPTH 512
#define COMET_NO_INDEX UINT64_MAX /* error_index of a fault outside every event */

/* Idempotent ingest (keys.c, FORMAT.md "Idempotency keys").  A request
 * carrying a key is stored once per shard within window_ms: a later call
 * with the same key finds the batch the first one stored and answers it again
 * (res->replayed = 1, first and count of that batch, nothing stored), or
 * COMET_E_KEY_REUSED when its digest differs (another request under the same
 * key).  Under durability "always" a replay returns once that batch is
 * durable.  The key is durable exactly when its batch is: kept across kill -9
 * and power cuts with the batch, forgotten with it.  All processes of the
 * data directory see every key of a shard; the caller sends every attempt of
 * one request to the same shard (a shard chosen from the key).  The hashes
 * are the caller's: 16 bytes of a strong hash of the client's key and of what
 * the request asked to store. */
typedef struct comet_idempotency {
    uint8_t key[16];
    uint8_t digest[16];
    int64_t window_ms; /* > 0 */
} comet_idempotency;

typedef struct comet_ingest_request {
    const void *body;
    size_t len;
    uint32_t format;          /* COMET_BODY_* */
    uint32_t compress_above;  /* events longer than this are stored zstd-compressed; 0: never */
    int32_t compress_level;   /* zstd level for those */
    int32_t durability;       /* COMET_DURABILITY_* */
    int32_t mode;             /* COMET_APPEND_WAIT or COMET_APPEND_NOWAIT */
    uint32_t reserved;
    const comet_idempotency *idempotency; /* NULL, or the request's key (above) */
} comet_ingest_request;

typedef struct comet_ingest_result {
    int64_t first;            /* first entry number of the batch */
    uint32_t count;           /* events stored */
    uint32_t replayed;        /* 1: the idempotency key had stored this batch before; nothing stored now */
    /* After COMET_E_BAD_JSON, COMET_E_ENTRY_TOO_LARGE or COMET_E_NO_EVENTS: */
    uint64_t error_index;     /* 0-based event index, or COMET_NO_INDEX */
    uint64_t error_line;      /* 1-based line of the body */
    uint64_t error_offset;    /* byte offset in the body */
    char error_reason[160];   /* what was wrong there, without the position */
} comet_ingest_result;

/* Returns the first entry number (also in res->first) or an error. */
int64_t comet_ingest(comet_stream *s, uint32_t shard, const comet_ingest_request *req,
                     comet_ingest_result *res);
/* The same checks and split without storing anything (tools, tests, the
 * validator's benchmark).  Events are written compacted, back to back, into
 * out (out_cap >= len always suffices) with their lengths in lens (lens_cap
 * entries; COMET_E_BUFFER_TOO_SMALL when more events are found).  Returns the
 * number of events.  max_entry_bytes 0 means no limit. */
int64_t comet_json_split(const comet_ingest_request *req, uint32_t max_entry_bytes,
                         uint8_t *out, size_t out_cap, uint32_t *lens, uint32_t lens_cap,
                         comet_ingest_result *res);

/* ---- OTLP export requests (otlp.c) ----------------------------------------
 * comet_otlp_decode turns the protobuf body of an OTLP/HTTP export request
 * (ExportLogsServiceRequest, ExportTraceServiceRequest or
 * ExportMetricsServiceRequest) into one JSON event per log record, span or
 * metric data point, each followed by '\n', in the layout that
 * tests/support/otlp.py specifies.  The whole request is refused (COMET_E_BAD_OTLP,
 * error_offset and reason set) when protobuf would not parse it, when an
 * attribute value or a body nests arrays and maps deeper than
 * COMET_OTLP_MAX_DEPTH, or when it uses key_strindex or
 * string_value_strindex.  A record whose trace or span id has a length other
 * than 0 or 16 (trace) / 8 (span), or whose event (without its '\n') would
 * be longer than max_event_bytes, is left out and counted in `rejected`
 * (partial success).  max_event_bytes 0 means no limit: every event holds
 * its resource and scope, so a large resource over many small records makes
 * output many times the body's size: max_output_bytes (0: no limit) bounds
 * all events together, their '\n' included; a request whose events would
 * pass it is refused with COMET_E_BATCH_TOO_LARGE.  The partition key is the service.name string attribute
 * of the first resource.  COMET_E_INVALID for a bad argument, COMET_E_NOMEM.
 * Call comet_otlp_free after every call, whatever it returned. */
#define COMET_OTLP_LOGS 1
#define COMET_OTLP_TRACES 2
#define COMET_OTLP_METRICS 3
#define COMET_OTLP_MAX_DEPTH 32
typedef struct {
    uint8_t *events;       /* out: the events, each followed by '\n' (malloc'd; comet_otlp_free) */
    uint64_t events_len;
    uint64_t count;        /* events written */
    uint64_t rejected;     /* records refused (not written) */
    uint64_t key_offset;   /* has_key: the partition key is body[key_offset, key_offset + key_len) */
    uint32_t key_len;
    int32_t has_key;
    uint64_t error_offset; /* COMET_E_BAD_OTLP: the byte where decoding failed */
    char reason[256];      /* COMET_E_BAD_OTLP: why; else, when rejected > 0: why the first was */
} comet_otlp_result;
int comet_otlp_decode(int32_t signal, const uint8_t *body, uint64_t len,
                      uint32_t max_event_bytes, uint64_t max_output_bytes,
                      comet_otlp_result *out);
void comet_otlp_free(comet_otlp_result *out);

/* comet_otlp_encode is the way back (otlp_encode.c): stored events of
 * `signal` into one export request (protobuf), for forwarding to an OTLP/HTTP
 * backend.  Payload i is data[offsets[i], offsets[i + 1]) (the layout of
 * comet_read).  Consecutive events with the same resource, scope (and
 * metric) share one group, as the producer grouped them.  An event that is
 * not in the layout of the signal (not a JSON object, a field of the wrong
 * type or range, an id that is not hex of the right length, a string that
 * has no UTF-8) is left out and named in rejected_index, with its reason.
 * With COMET_OTLP_PLAIN (logs only), payloads are any events: each becomes
 * a log record whose body is the event (JSON values keep their types; a
 * payload that is not JSON is a string, or bytes when it is not UTF-8),
 * whose time and observed time are its timestamp, under one resource: the
 * Resource message `resource` (its encoded fields) and an empty scope.
 * COMET_E_INVALID for a bad argument, COMET_E_NOMEM.  Call
 * comet_otlp_encoded_free after every call, whatever it returned. */
#define COMET_OTLP_PLAIN 0x1u
#define COMET_OTLP_REASON_BYTES 128
typedef struct {
    uint8_t *data;            /* out: the export request (malloc'd) */
    uint64_t len;
    uint32_t count;           /* records in the request */
    uint32_t rejected;        /* events left out */
    uint32_t *rejected_index; /* their indexes (malloc'd) */
    char *reasons;            /* COMET_OTLP_REASON_BYTES each, NUL-terminated (malloc'd) */
} comet_otlp_encoded;
int comet_otlp_encode(int32_t signal, uint32_t flags, const uint8_t *data, const int32_t *offsets,
                      const int64_t *timestamps, uint32_t count, const uint8_t *resource,
                      uint64_t resource_len, comet_otlp_encoded *out);
void comet_otlp_encoded_free(comet_otlp_encoded *out);

/* Reads (lock-free, any process). */
int comet_read(comet_stream *s, uint32_t shard, const comet_read_request *req,
               comet_read_result *res);
/* First entry whose timestamp is >= ts (next_entry when none). */
int64_t comet_find_time(comet_stream *s, uint32_t shard, int64_t ts);
/* The timestamp of entry (of the oldest stored one when it was deleted), or
 * 0 when there is no such entry (not written yet, or damaged). */
int64_t comet_entry_timestamp(comet_stream *s, uint32_t shard, uint64_t entry);

/* Consumer groups: one offset per (group, shard), shared by every process.
 * comet_group_open registers the name in that shard when create is set (a
 * new group starts at the oldest stored entry).  ack moves the offset past
 * entry (never backwards, never past the committed end); ack_range acks
 * [from, to] and refuses to skip unacknowledged entries; reset sets it
 * anywhere (negative: that many entries before the end). */
int comet_validate_group_name(const char *name, size_t len);
int comet_group_open(comet_stream *s, uint32_t shard, const char *name, size_t len, int create,
                     comet_group **out);
int64_t comet_group_ack(comet_group *g, uint64_t entry);
int64_t comet_group_ack_range(comet_group *g, uint64_t from, uint64_t to);
int64_t comet_group_reset(comet_group *g, int64_t offset);
int64_t comet_group_offset(comet_group *g);
int64_t comet_group_lag(comet_group *g);
/* A consumer that ships records somewhere adds what became of them to the
 * group's counters in this shard (shared, kept with the offset): records
 * delivered (stamping the time), failed attempts it retried, records it gave
 * up on.  They are reports, not offsets: nothing depends on them. */
int comet_group_count(comet_group *g, uint64_t delivered, uint64_t retries, uint64_t failed);
int comet_group_delete(comet_stream *s, const char *name, size_t len); /* every shard */
/* Registered groups of a shard (at most cap written); returns how many there are. */
int comet_group_list(comet_stream *s, uint32_t shard, comet_group_info *out, uint32_t cap);

/* Retention now, over every stream: the shards this process owns (all of them
 * when it holds no slot).  Reports are added up into out (may be NULL). */
int comet_run_retention(comet_db *db, comet_retention_report *out);
/* Entries this process's retention (its passes and the background one)
 * deleted before every registered group had them (retention_force_delete_after_ms),
 * since it opened the directory: for a process to log each loss as it happens. */
uint64_t comet_retention_lost(comet_db *db);
/* The same, deleting what the policy allows until `room` more bytes fit in
 * retention_max_total_bytes (readiness after a storage-full error). */
int comet_run_retention_room(comet_db *db, uint64_t room, comet_retention_report *out);
/* Bytes of every segment and index file of the data directory: what
 * retention_max_total_bytes counts. */
int64_t comet_data_bytes(comet_db *db);

/* Durability and inspection. */
int comet_sync(comet_stream *s, int shard); /* shard < 0: every shard */
/* `what`: COMET_STATS_ALL, or 0 for the counters and sizes alone (oldest_timestamp
 * left 0: it reads the shard's first entry, a random read of every shard in a
 * listing of many streams). */
#define COMET_STATS_OLDEST_TIMESTAMP 0x1u
#define COMET_STATS_ALL COMET_STATS_OLDEST_TIMESTAMP
int comet_shard_stats_get(comet_stream *s, uint32_t shard, unsigned what, comet_shard_stats *out);
int comet_verify_shard(comet_stream *s, uint32_t shard, comet_verify_report *out);

/* CRC32C, exposed for tests and tools. impl: 0 = best, 1 = portable, 2 = hardware. */
uint32_t comet_crc32c(uint32_t crc, const void *data, size_t len, int impl);
int comet_crc32c_hw_available(void);

#ifdef __cplusplus
}
#endif
#endif /* COMET_H */
