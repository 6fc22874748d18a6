/*
 * keys.c - idempotency keys: a request retried with the same key is stored
 * once (comet.h, comet_idempotency; FORMAT.md "Idempotency keys").
 *
 * Where a key lives.  Every attempt of one request goes to the same shard
 * (the caller picks it from the key), so a key is looked up, and recorded, in
 * one shard under its append lock, which every process of the data directory
 * shares: two attempts racing in two workers are serialised there, and the
 * second finds the first's record.  The records are a ring in the shard's
 * `keys` file, mmap'd by every process that uses it: record i of the ring
 * goes to slot i % capacity, `head` in the file counts the records written.
 * A shard remembers the last KEYS_CAPACITY keys, within the caller's window.
 *
 * How a key is found fast.  Each process keeps a hash table of ring slots
 * (open addressing on the key's first 8 bytes, twice the ring's size) and
 * catches up with `head` under the append lock before each lookup: what other
 * processes recorded is indexed then.  A slot the ring has overwritten since
 * is found stale by comparing the record's key; the table is built again
 * from the ring when stale slots fill it.  Cost per keyed append: the
 * catch-up (usually one record), one probe, and one 64-byte record written.
 *
 * Why it is durable exactly when its batch is.  The record is written before
 * the batch's entries, under the same lock, and the batch's last entry
 * carries ENTRY_FLAG_KEYED.  A sync (durability.c) reads the commit point,
 * syncs this file, then the segments: whatever a sync makes durable has its
 * record on the disk first.  Pages the kernel writes back on its own come in
 * any order, so after a restart recovery ends the log before a keyed batch
 * past the durable point whose record did not survive (keys_recorded), and
 * forgets the records whose batch did not survive (keys_forget_after):
 * entry numbers after the log's end are handed out again, and a record must
 * never name a later batch.  A replay under durability "always" waits for
 * its batch's sync like the first attempt did.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "log.h"

#define KEYS_NAME "keys"

struct keys_table {
    int fd;
    uint8_t *map;
    size_t map_bytes;
    uint32_t capacity;
    /* under the append lock: */
    uint64_t seen;   /* ring records indexed so far */
    uint32_t *slots; /* ring slot + 1; 0: empty */
    uint32_t mask;
    uint32_t filled;
    int built;
};

static _Atomic uint64_t *head_of(const keys_table *k)
{
    return (_Atomic uint64_t *)(k->map + KEYS_HEAD_OFFSET);
}

/* The highest head some sync made durable (in the file, like head). */
static _Atomic uint64_t *synced_head_of(const keys_table *k)
{
    return (_Atomic uint64_t *)(k->map + KEYS_HEAD_OFFSET + 8);
}

static key_record *record_at(const keys_table *k, uint32_t slot)
{
    return (key_record *)(k->map + KEYS_RECORDS_OFFSET) + slot;
}

static uint32_t record_crc(const key_record *r)
{
    key_record c = *r;
    c.crc = 0;
    return crc32c_mask(crc32c_value(&c, sizeof c));
}

static int record_live(const key_record *r)
{
    return r->count && r->crc == record_crc(r);
}

static size_t file_bytes(void)
{
    return KEYS_RECORDS_OFFSET + (size_t)KEYS_CAPACITY * sizeof(key_record);
}

static int create_file(shard *sh)
{
    uint8_t page[KEYS_RECORDS_OFFSET] = {0}; /* per call: shards are created by many threads */
    keys_header h;
    memset(&h, 0, sizeof h);
    h.magic = MAGIC_KEYS;
    h.version = KEYS_FILE_VERSION;
    h.header_bytes = sizeof h;
    h.shard_id = sh->id;
    h.capacity = KEYS_CAPACITY;
    h.header_crc = crc32c_header(&h);
    memcpy(page, &h, sizeof h);
    int rc = create_file_exclusive(sh->dir, KEYS_NAME, page, sizeof page);
    return rc == FILE_EXISTS ? 0 : rc;
}

/* Maps the keys file (creating it when create is set): 0, 1 when it does
 * not exist and create is 0, or an error. */
static int attach_file(shard *sh, int create, keys_table **out)
{
    char path[COMET_PATH_MAX];
    if (path_format(path, "%s/%s", sh->dir, KEYS_NAME))
        return set_error(COMET_E_INVALID, "path too long in %s", sh->dir);
    int rc = create ? create_file(sh) : 0;
    if (rc)
        return rc;
    int fd = sys_open(path, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0)
        return errno == ENOENT && !create ? 1 : set_errno_error(errno, "cannot open %s", path);
    struct stat sb;
    size_t bytes = file_bytes();
    if (sys_fstat(fd, &sb))
        rc = set_errno_error(errno, "cannot stat %s", path);
    else if ((size_t)sb.st_size < bytes)
        rc = preallocate(fd, bytes, path);
    void *map = rc ? MAP_FAILED : sys_mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (!rc && map == MAP_FAILED)
        rc = set_errno_error(errno, "cannot map %s", path);
    if (!rc) {
        const keys_header *h = map;
        if (h->magic != MAGIC_KEYS || h->header_crc != crc32c_header(h) || h->shard_id != sh->id)
            rc = set_error(COMET_E_CORRUPT, "%s is not the keys file of shard %u (magic %08x, "
                           "shard %u, header checksum %s, %lld bytes)", path, sh->id, h->magic,
                           h->shard_id, h->header_crc == crc32c_header(h) ? "good" : "bad",
                           (long long)sb.st_size);
        else if (h->version != KEYS_FILE_VERSION)
            rc = set_error(COMET_E_FORMAT_VERSION, "%s has version %u; this build reads %u", path,
                           h->version, KEYS_FILE_VERSION);
        else if (h->capacity != KEYS_CAPACITY)
            rc = set_error(COMET_E_CORRUPT, "%s holds %u keys; this build uses %u", path,
                           h->capacity, KEYS_CAPACITY);
    }
    keys_table *k = rc ? NULL : calloc(1, sizeof *k);
    if (!rc && !k)
        rc = set_error(COMET_E_NOMEM, "out of memory for the keys of %s", sh->dir);
    if (rc) {
        if (map != MAP_FAILED)
            sys_munmap(map, bytes);
        sys_close(fd);
        return rc;
    }
    k->fd = fd;
    k->map = map;
    k->map_bytes = bytes;
    k->capacity = KEYS_CAPACITY;
    *out = k;
    return 0;
}

/* How attach finds the file: created when missing (an append), opened when
 * it exists (recovery: the state's keys_in_use may not have reached the disk
 * when the file did), or opened only when keys_in_use says it exists (a sync:
 * no lookup of the directory each time). */
enum { KEYS_CREATE = 1, KEYS_PROBE = 2, KEYS_IF_IN_USE = 3 };

/* The shard's table, attached once per process (NULL when there is no file). */
static int attach(shard *sh, int how, keys_table **out)
{
    keys_table *k = atomic_load_explicit(&sh->keys, memory_order_acquire);
    if (k || (how == KEYS_IF_IN_USE &&
              !atomic_load_explicit(&sh->st->keys_in_use, memory_order_acquire))) {
        *out = k;
        return 0;
    }
    int create = how == KEYS_CREATE;
    pthread_mutex_lock(&sh->cache_lock);
    k = atomic_load_explicit(&sh->keys, memory_order_relaxed);
    int rc = k ? 0 : attach_file(sh, create, &k);
    if (rc == 1) {
        rc = 0;
        k = NULL;
    }
    if (!rc && k)
        atomic_store_explicit(&sh->keys, k, memory_order_release);
    pthread_mutex_unlock(&sh->cache_lock);
    if (!rc && k)
        atomic_store_explicit(&sh->st->keys_in_use, 1, memory_order_release);
    *out = k;
    return rc;
}

void keys_close(shard *sh)
{
    keys_table *k = atomic_exchange(&sh->keys, NULL);
    if (!k)
        return;
    sys_munmap(k->map, k->map_bytes);
    sys_close(k->fd);
    free(k->slots);
    free(k);
}

/* ---- the process-local index (under the append lock) ---------------------- */

static uint32_t hash_slot(const keys_table *k, const uint8_t key[16])
{
    uint64_t h;
    memcpy(&h, key, 8);
    return (uint32_t)(h ^ (h >> 29)) & k->mask;
}

static void index_insert(keys_table *k, uint32_t ring_slot)
{
    const key_record *r = record_at(k, ring_slot);
    if (!record_live(r))
        return;
    for (uint32_t i = hash_slot(k, r->key);; i = (i + 1) & k->mask) {
        uint32_t v = k->slots[i];
        if (!v) {
            k->slots[i] = ring_slot + 1;
            k->filled++;
            return;
        }
        if (v == ring_slot + 1 || memcmp(record_at(k, v - 1)->key, r->key, 16) == 0) {
            k->slots[i] = ring_slot + 1; /* the newer record of this key */
            return;
        }
    }
}

static int rebuild(keys_table *k, uint64_t head)
{
    if (!k->slots) {
        k->slots = calloc((size_t)k->capacity * 2, sizeof *k->slots);
        if (!k->slots)
            return set_error(COMET_E_NOMEM, "out of memory for an index of %u keys", k->capacity);
        k->mask = k->capacity * 2 - 1;
    } else {
        memset(k->slots, 0, (size_t)k->capacity * 2 * sizeof *k->slots);
    }
    k->filled = 0;
    uint64_t from = head > k->capacity ? head - k->capacity : 0;
    for (uint64_t i = from; i < head; i++)
        index_insert(k, (uint32_t)(i % k->capacity));
    k->seen = head;
    k->built = 1;
    return 0;
}

static int catch_up(keys_table *k)
{
    uint64_t head = atomic_load_explicit(head_of(k), memory_order_acquire);
    if (!k->built || head < k->seen || head - k->seen >= k->capacity)
        return rebuild(k, head);
    for (; k->seen < head; k->seen++)
        index_insert(k, (uint32_t)(k->seen % k->capacity));
    if (k->filled > k->capacity + k->capacity / 2) /* mostly stale slots: probes grow */
        return rebuild(k, head);
    return 0;
}

static const key_record *index_find(const keys_table *k, const uint8_t key[16])
{
    for (uint32_t i = hash_slot(k, key);; i = (i + 1) & k->mask) {
        uint32_t v = k->slots[i];
        if (!v)
            return NULL;
        const key_record *r = record_at(k, v - 1);
        if (memcmp(r->key, key, 16) == 0)
            return record_live(r) ? r : NULL;
    }
}

/* ---- the append path (under the append lock) ------------------------------ */

int keys_find(shard *sh, const comet_idempotency *idem, int nowait, int64_t now,
              key_hit *hit)
{
    keys_table *k = atomic_load_explicit(&sh->keys, memory_order_acquire);
    if (nowait && (!k || !k->built))
        return COMET_E_WOULD_BLOCK; /* opening the file or reading the ring: on a thread */
    int rc = attach(sh, KEYS_CREATE, &k);
    if (!rc)
        rc = catch_up(k);
    if (rc)
        return rc;
    const key_record *r = index_find(k, idem->key);
    if (!r)
        return 0;
    int64_t window_ns = idem->window_ms * 1000000;
    uint64_t committed = atomic_load_explicit(&sh->st->next_entry, memory_order_relaxed);
    if (r->ts < now - window_ns || r->first + r->count > committed)
        return 0; /* expired, or its batch is not in the log (recovery forgets those) */
    /* The batch the record names must be the one it recorded: its last entry
     * a keyed batch end with the record's timestamp.  Recovery forgets the
     * records of batches that did not survive, so this holds unless that
     * failed; then the key is not a duplicate - never an answer naming
     * another batch's entries.  (Only a hit pays for it.)  Entries deleted
     * by retention cannot be read: the record stands for them. */
    uint32_t lf = 0;
    int64_t ts = 0;
    uint64_t last = r->first + r->count - 1;
    if (last >= atomic_load_explicit(&sh->st->first_entry, memory_order_acquire)) {
        int got = shard_entry_header(sh, last, &lf, &ts);
        if (got < 0)
            return got;
        uint32_t want = ENTRY_FLAG_BATCH_END | ENTRY_FLAG_KEYED;
        if (got == 1 && ((lf & want) != want || ts != r->ts))
            return 0;
    }
    if (memcmp(r->digest, idem->digest, 16) != 0)
        return set_error(COMET_E_KEY_REUSED, "the idempotency key stored another request's "
                         "batch (entries %" PRIu64 "-%" PRIu64 " of shard %u) %" PRId64
                         " s ago: a retry must send the same body", r->first,
                         r->first + r->count - 1, sh->id, (now - r->ts) / 1000000000);
    hit->first = r->first;
    hit->count = r->count;
    return 1;
}

int keys_record(shard *sh, const comet_idempotency *idem, uint64_t first, uint32_t count,
                int64_t ts)
{
    keys_table *k = atomic_load_explicit(&sh->keys, memory_order_acquire);
    uint64_t head = atomic_load_explicit(head_of(k), memory_order_relaxed);
    uint32_t slot = (uint32_t)(head % k->capacity);
    key_record r;
    memset(&r, 0, sizeof r);
    memcpy(r.key, idem->key, 16);
    memcpy(r.digest, idem->digest, 16);
    r.first = first;
    r.count = count;
    r.ts = ts;
    r.crc = record_crc(&r);
    memcpy(record_at(k, slot), &r, sizeof r);
    atomic_store_explicit(head_of(k), head + 1, memory_order_release);
    k->seen = head + 1;
    index_insert(k, slot);
    return 0;
}

/* ---- syncs and recovery ----------------------------------------------------- */

int keys_sync(shard *sh)
{
    keys_table *k;
    int rc = attach(sh, KEYS_IF_IN_USE, &k);
    if (rc || !k)
        return rc;
    uint64_t head = atomic_load_explicit(head_of(k), memory_order_acquire);
    if (atomic_load_explicit(synced_head_of(k), memory_order_relaxed) >= head)
        return 0;
    if (sys_fdatasync(k->fd))
        return shard_note_sync_failure(sh, errno, "fdatasync of the idempotency keys");
    uint64_t was = atomic_load_explicit(synced_head_of(k), memory_order_relaxed);
    while (was < head &&
           !atomic_compare_exchange_weak_explicit(synced_head_of(k), &was, head,
                                                  memory_order_relaxed, memory_order_relaxed))
        ;
    return 0;
}

int keys_recorded(shard *sh, uint64_t first, uint64_t end)
{
    keys_table *k;
    int rc = attach(sh, KEYS_PROBE, &k);
    if (rc)
        return rc;
    if (!k)
        return 0;
    uint64_t head = atomic_load_explicit(head_of(k), memory_order_acquire);
    uint64_t from = head > k->capacity ? head - k->capacity : 0;
    for (uint64_t i = head; i > from; i--) { /* the newest first: the tail's batches */
        const key_record *r = record_at(k, (uint32_t)((i - 1) % k->capacity));
        if (record_live(r) && r->first == first && r->first + r->count == end)
            return 1;
    }
    return 0;
}

int keys_forget_after(shard *sh, uint64_t next)
{
    keys_table *k;
    int rc = attach(sh, KEYS_PROBE, &k);
    if (rc || !k)
        return rc;
    int changed = 0;
    for (uint32_t i = 0; i < k->capacity; i++) {
        key_record *r = record_at(k, i);
        if (r->count && r->first + r->count > next) {
            memset(r, 0, sizeof *r);
            changed = 1;
        }
    }
    k->built = 0; /* this process's index is read again; others compare what they find */
    if (changed && sys_fdatasync(k->fd))
        return shard_note_sync_failure(sh, errno, "fdatasync of the idempotency keys");
    return 0;
}
