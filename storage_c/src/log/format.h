/*
 * format.h - every on-disk constant and layout of the storage core, in one
 * place.  storage_c/FORMAT.md is the prose version of this file; keep the two
 * in step (a change of layout bumps the version of the file it touches).
 *
 * All integers are little-endian.  Files that several processes map at once
 * (shard state, index) hold C11 atomics and pthread mutexes; those are only
 * ever read and written through a mapping by processes on the same machine.
 */
#ifndef COMET_FORMAT_H
#define COMET_FORMAT_H

#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "comet.h"

#define FORMAT_VERSION COMET_FORMAT_VERSION
/* Segment files have their own version: 2 since entry checksums cover the
 * whole entry number (recycled segments); version 1 is still read. */
#define SEGMENT_VERSION COMET_SEGMENT_VERSION
#define SEGMENT_VERSION_OLDEST 1

/* File magics: four ASCII letters read as a little-endian u32. */
#define MAGIC_SEGMENT 0x47534d43u /* "CMSG" */
#define MAGIC_INDEX 0x58494d43u   /* "CMIX" */
#define MAGIC_STATE 0x54534d43u   /* "CMST" */
#define MAGIC_STREAM 0x4d534d43u  /* "CMSM" */
#define MAGIC_SLOTS 0x4c534d43u   /* "CMSL" */
#define MAGIC_OFFSETS 0x464f4d43u /* "CMOF" */
#define MAGIC_USAGE 0x53554d43u   /* "CMUS" */
#define MAGIC_KEYS 0x594b4d43u    /* "CMKY" */

/* Every file header: magic, version, header size, then type-specific fields,
 * with a masked CRC32C of bytes [0, 60) at offset 60. */
#define FILE_HEADER_BYTES 64
#define FILE_HEADER_CRC_OFFSET 60

/* ---- Entries --------------------------------------------------------------
 *
 *   0  u32 crc        masked CRC32C of bytes [4, 20 + length), the register
 *                     starting at ~0 xor the entry number's high 32 bits
 *                     (segment version 2; version 1: at ~0)
 *   4  u32 len_flags  bits 0-27 payload length, 28 zstd, 29 batch end,
 *                     30 keyed (on a batch end: an idempotency key was recorded
 *                     for the batch, keys.c), 31 zero
 *   8  u32 entry_lo   low 32 bits of the entry number
 *  12  i64 timestamp  unix ns
 *  20  payload
 *
 * Entries are packed back to back after the segment header.  The batch-end
 * bit marks the last entry of an append: recovery keeps a torn tail only up
 * to the last batch end, which is what makes a batch atomic across crashes.
 */
#define ENTRY_HEADER_BYTES 20u
#define ENTRY_LEN_MASK 0x0FFFFFFFu
#define ENTRY_FLAG_ZSTD 0x10000000u
#define ENTRY_FLAG_BATCH_END 0x20000000u
#define ENTRY_FLAG_KEYED 0x40000000u
#define ENTRY_FLAGS_RESERVED 0x80000000u

typedef struct entry_header {
    uint32_t crc;
    uint32_t len_flags;
    uint32_t entry_lo;
    int64_t timestamp;
} __attribute__((packed)) entry_header;
static_assert(sizeof(entry_header) == ENTRY_HEADER_BYTES, "entry header is 20 bytes");

/* ---- Segment file: <shard>/<base:020>.log ---------------------------------- */
typedef struct segment_header {
    uint32_t magic;
    uint16_t version;
    uint16_t header_bytes;
    uint32_t shard_id;
    uint32_t flags;      /* SEGMENT_FLAG_* (version 2; zero in version 1) */
    uint64_t base_entry; /* first entry number stored in this segment */
    uint64_t capacity;   /* bytes allocated so far (preallocated); grows as the segment fills */
    int64_t created_ns;
    uint64_t reserved;   /* address space every process maps: the segment's size limit (0: capacity) */
    uint8_t reserved1[12];
    uint32_t header_crc;
} segment_header;
static_assert(sizeof(segment_header) == FILE_HEADER_BYTES, "segment header is 64 bytes");
static_assert(offsetof(segment_header, header_crc) == FILE_HEADER_CRC_OFFSET,
              "every header's checksum is at byte 60");

/* The file is a recycled one: past what this segment wrote lie the entries of
 * the segment it was before, not zeros.  They never check out as this
 * segment's entries (their numbers differ), so they end a scan like zeros do. */
#define SEGMENT_FLAG_RECYCLED 0x1u

#define SEGMENT_DATA_OFFSET FILE_HEADER_BYTES
#define SEGMENT_MIN_BYTES (64u * 1024u)
#define SEGMENT_FIRST_CHUNK (16u * 1024u) /* a new segment's first allocation */
#define SEGMENT_MAX_BYTES (((uint64_t)4 << 30) - 1) /* index offsets are u32 */

/* ---- Sparse index: <shard>/<base:020>.idx -----------------------------------
 * One record per index_interval bytes of entries (the first entry of a segment
 * has none: it sits at SEGMENT_DATA_OFFSET).  Records are appended under the
 * shard lock; count is published with release order after the record. */
typedef struct index_header {
    uint32_t magic;
    uint16_t version;
    uint16_t header_bytes;
    uint32_t shard_id;
    uint32_t interval_bytes;
    uint64_t base_entry;
    uint32_t capacity; /* records the file can hold */
    uint8_t reserved[32];
    uint32_t header_crc;
} index_header;
static_assert(sizeof(index_header) == FILE_HEADER_BYTES, "index header is 64 bytes");

typedef struct index_record {
    uint32_t rel_entry; /* entry - base_entry */
    uint32_t offset;    /* byte offset of that entry in the segment */
    int64_t timestamp;  /* its timestamp */
} index_record;
static_assert(sizeof(index_record) == 16, "index record is 16 bytes");

#define INDEX_COUNT_OFFSET 64   /* _Atomic u32: published record count */
#define INDEX_RECORDS_OFFSET 128

/* ---- Shard state: <shard>/state (4096 bytes, mmap'd by every process) ------ */
enum writer_counter {
    WC_APPENDS,
    WC_APPENDED_ENTRIES,
    WC_APPENDED_RAW_BYTES,
    WC_APPENDED_STORED_BYTES,
    WC_COMPRESSED_ENTRIES,
    WC_LATENCY_SUM_NS,
    WC_LATENCY_COUNT,
    WC_LATENCY_MAX_NS,
    WC_ROTATIONS,
    WC_RECOVERIES,
    WC_TRUNCATED_BYTES,
    WC_TRUNCATED_ENTRIES,
    WC_ORPHANED_SEGMENTS,
    WC_STATE_REBUILDS,
    WC_RETENTION_DELETED_SEGMENTS,
    WC_RETENTION_DELETED_BYTES,
    WC_RETENTION_LOST_ENTRIES,
    WC_RECYCLED_SEGMENTS,
    WC_KEY_REPLAYS,
    WC_COUNT
};

/* Counters that processes bump without holding the append lock (atomic add). */
enum shared_counter {
    SC_SYNCS,
    SC_LOCK_OWNER_DIED,
    SC_INDEX_REBUILDS,
    SC_CRC_FAILURES,
    SC_SKIPPED_ENTRIES,
    SC_STORAGE_FULL_ERRORS,
    SC_SYNC_FAILURES, /* syncs that failed (the first of them marks the shard: sync_failed) */
    SC_COUNT
};

typedef union padded_mutex {
    pthread_mutex_t mutex;
    uint8_t pad[64];
} padded_mutex;
static_assert(sizeof(pthread_mutex_t) <= 64, "a pthread mutex fits in one line");

typedef struct state_file {
    /* [0, 64): header */
    uint32_t magic;
    uint16_t version;
    uint16_t header_bytes;
    uint32_t shard_id;
    uint32_t reserved0;
    uint8_t boot_id[16]; /* locks are re-initialised when this differs from the running kernel's */
    int64_t created_ns;
    uint8_t reserved1[20];
    uint32_t header_crc;
    /* [64, 192): locks, meaningful only while a process holds the shard open
     * (STATE_HOLDERS_LOCK_BYTE); re-initialised by the first opener otherwise */
    padded_mutex append_lock; /* every append, rotation and repair */
    padded_mutex sync_lock;   /* group commit: one fdatasync at a time */
    /* [192, 256): commit point, written under append_lock */
    _Atomic uint64_t next_entry;  /* committed: entries below are complete and visible */
    _Atomic uint64_t active_base; /* first entry of the active segment */
    _Atomic uint64_t active_end;  /* byte offset after the last committed entry */
    _Atomic int64_t last_ts;      /* newest timestamp (kept non-decreasing) */
    _Atomic uint64_t write_hwm;   /* highest offset an append may have written */
    _Atomic uint64_t zeroed_end;  /* active segment is zero-filled up to here */
    _Atomic uint64_t active_gen;  /* bumped whenever the active segment file changes */
    _Atomic uint32_t recovery_pending;
    _Atomic uint32_t deleted;     /* STATE_DELETED once the stream is deleted (under append_lock) */
    /* [256, 320): durability */
    _Atomic uint64_t durable_entry; /* entries below are on stable storage */
    _Atomic uint64_t durable_base;  /* segment of the durable point */
    _Atomic int64_t last_sync_ns;
    _Atomic uint64_t first_entry;   /* oldest entry not deleted by retention */
    _Atomic uint32_t seal_active;   /* 1: the next append starts a new segment (recovery) */
    /* A failed sync: the errno of the first fsync, fdatasync or msync of the
     * shard that failed since its last repair (0: none).  Set by whichever
     * process saw it; every process then refuses appends until an opener
     * repairs the tail (recovery.c).  acked_end: entries below it were
     * acknowledged without waiting for a sync (durability none, interval);
     * the repair keeps what verifies up to it and cuts what only `always`
     * appends, which were refused, wrote after the durable point. */
    _Atomic uint32_t sync_failed;
    _Atomic uint64_t acked_end;
    /* 1 once the shard's keys file exists (keys.c): every syncer then syncs
     * it before the segments, whether or not its process wrote a key. */
    _Atomic uint32_t keys_in_use;
    uint8_t reserved3[12];
    /* [320, 512): counters */
    _Atomic uint64_t writer[WC_COUNT];
    uint8_t reserved4[(24 - WC_COUNT) * 8];
    /* [512, 576) */
    _Atomic uint64_t shared[SC_COUNT];
    uint8_t reserved5[(8 - SC_COUNT) * 8];
    /* [576, 640): registration of consumer groups in the offsets file */
    padded_mutex groups_lock;
    /* [640, 644): STATE_CLOSED_CLEAN when the last process holding the shard
     * closed it with everything committed synced (state.c); cleared, and
     * synced, by the next opener that finds nobody holding the shard */
    _Atomic uint32_t closed_clean;
    uint8_t reserved6[4096 - 644];
} state_file;
static_assert(sizeof(state_file) == 4096, "state file is one page");
static_assert(WC_COUNT <= 24 && SC_COUNT <= 8, "counter areas are full");
static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "64-bit atomics must be lock-free to share memory");

#define STATE_FILE_BYTES 4096
/* Every process with the shard open holds a shared open-file-description lock
 * on this byte of the state file (beyond the page: no data is there); the
 * lock words above mean something only while someone holds it (state.c). */
#define STATE_HOLDERS_LOCK_BYTE STATE_FILE_BYTES
/* The deletion mark: a magic value, not a flag, so that a damaged byte never
 * makes a live stream look deleted. */
#define STATE_DELETED 0x4445454cu
/* The clean-close mark: a magic value too, so that a damaged byte never
 * makes a state look like one whose last holder closed it cleanly. */
#define STATE_CLOSED_CLEAN 0x4e4c4343u

/* ---- Consumer offsets: <shard>/offsets ---------------------------------------
 * A header page, then OFFSETS_GROUPS slots of 128 bytes.  A slot is claimed
 * under the state's groups_lock: name first, then state = 1 (release).  The
 * offset only moves forward through ack (compare-and-swap max) unless reset. */
#define OFFSETS_GROUPS 512
#define OFFSETS_SLOTS_OFFSET 4096
#define OFFSETS_FILE_BYTES (OFFSETS_SLOTS_OFFSET + OFFSETS_GROUPS * 128)
#define GROUP_NAME_MAX COMET_GROUP_NAME_MAX

typedef struct offsets_header {
    uint32_t magic;
    uint16_t version;
    uint16_t header_bytes;
    uint32_t shard_id;
    uint32_t capacity;   /* OFFSETS_GROUPS */
    uint32_t slot_bytes; /* 128 */
    uint8_t reserved[40];
    uint32_t header_crc;
} offsets_header;
static_assert(sizeof(offsets_header) == FILE_HEADER_BYTES, "offsets header is 64 bytes");

typedef struct group_slot {
    _Atomic uint32_t state;      /* 0 free, 1 registered */
    uint32_t name_len;
    char name[48];               /* NUL-padded */
    _Atomic uint32_t generation; /* bumped when the slot is claimed or freed */
    uint32_t reserved0;
    _Atomic uint64_t offset;     /* next entry to consume: entries below are acknowledged */
    _Atomic int64_t last_ack_ns;
    int64_t registered_ns;
    _Atomic uint64_t acks;
    /* What the group's consumer reports of its deliveries (comet_group_count). */
    _Atomic uint64_t delivered;
    _Atomic uint64_t retries;
    _Atomic uint64_t failed;
    _Atomic int64_t last_delivery_ns;
} group_slot;
static_assert(sizeof(group_slot) == 128, "a group slot is 128 bytes");

/* ---- Stream metadata: <stream>/stream.meta ------------------------------- */
typedef struct stream_meta {
    uint32_t magic;
    uint16_t version;
    uint16_t header_bytes;
    uint32_t shard_count;
    uint32_t reserved0;
    int64_t created_ns;
    uint8_t reserved1[36];
    uint32_t header_crc;
} stream_meta;
static_assert(sizeof(stream_meta) == FILE_HEADER_BYTES, "stream meta is 64 bytes");

/* ---- Process slots: <data>/.slots ---------------------------------------------
 * Header page, then one byte per slot at SLOTS_LOCK_BASE + slot: a process
 * holds slot s by an open-file-description write lock on that byte. */
typedef struct slots_header {
    uint32_t magic;
    uint16_t version;
    uint16_t header_bytes;
    uint32_t process_count;
    uint32_t reserved0;
    uint8_t reserved1[44];
    uint32_t header_crc;
} slots_header;
static_assert(sizeof(slots_header) == FILE_HEADER_BYTES, "slots header is 64 bytes");

typedef struct slot_record {
    int64_t pid;
    int64_t claimed_ns;
} slot_record;

#define SLOTS_RECORDS_OFFSET 64
#define SLOTS_LOCK_BASE 65536
#define SLOTS_HEADER_LOCK_BYTE 0

/* ---- Disk use: <data>/.usage ---------------------------------------------------
 * What the data directory's segment and index files take, shared by every
 * process that appends under a retention_max_total_bytes budget (usage.c): an
 * estimate that never runs below the truth while every process adds what it
 * allocates, set to the exact figure by each full count. */
typedef struct usage_file {
    uint32_t magic;
    uint16_t version;
    uint16_t header_bytes;
    uint64_t bytes;              /* the estimate (under lock) */
    int64_t counted_ns;          /* time of the last full count; 0: never */
    uint8_t boot_id[16];         /* the lock below is re-initialised after a reboot */
    uint8_t reserved[24];
    padded_mutex lock;           /* robust, process-shared: reservations, deletions, counts */
} usage_file;
static_assert(offsetof(usage_file, lock) == FILE_HEADER_BYTES, "usage header is 64 bytes");
#define USAGE_VERSION 1

/* ---- Names -------------------------------------------------------------------- */
#define STREAM_META_NAME "stream.meta"
#define STATE_NAME "state"
#define OFFSETS_NAME "offsets"
#define SLOTS_NAME ".slots"
#define USAGE_NAME ".usage"
#define SEGMENT_SUFFIX ".log"
#define INDEX_SUFFIX ".idx"
#define TEMP_SUFFIX ".tmp"
#define ORPHAN_SUFFIX ".orphan"
/* A deleted segment's file kept for the shard's next segment (recycle.c). */
#define SPARE_NAME "spare.log.free"
/* The same until the directory says durably that the segment is gone: a
 * rotation never takes it (a temporary file: openers remove it). */
#define SPARE_PENDING_NAME SPARE_NAME TEMP_SUFFIX

/* ---- Idempotency keys: `keys` (keys.c) ---------------------------------------
 *
 * A ring of key records, one per keyed batch, written under the append lock
 * before the batch's entries.  The header (64 bytes, checksummed) gives the
 * ring's capacity; `head` (at byte 64) counts the records ever written: the
 * next goes to slot head % capacity.  Records start at byte 4096.
 */
#define KEYS_FILE_VERSION 1
#define KEYS_HEAD_OFFSET 64
#define KEYS_RECORDS_OFFSET 4096u

typedef struct keys_header {
    uint32_t magic;
    uint16_t version;
    uint16_t header_bytes;
    uint32_t shard_id;
    uint32_t capacity; /* records */
    uint8_t reserved[44];
    uint32_t header_crc;
} keys_header;
static_assert(sizeof(keys_header) == FILE_HEADER_BYTES, "keys header is 64 bytes");

typedef struct key_record {
    uint8_t key[16];    /* the caller's hash of the client's key */
    uint8_t digest[16]; /* the caller's hash of what the request asked to store */
    uint64_t first;     /* the batch: entries [first, first + count) */
    uint32_t count;     /* 0: an empty slot, or a record forgotten by recovery */
    uint32_t crc;       /* masked CRC32C of the record with this field zero */
    int64_t ts;         /* the batch's timestamp (its entries' headers) */
    uint64_t reserved;
} key_record;
static_assert(sizeof(key_record) == 64, "a key record is 64 bytes");

#endif /* COMET_FORMAT_H */
