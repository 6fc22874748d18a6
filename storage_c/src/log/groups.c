/*
 * groups.c - consumer groups: per shard, named offsets in the shard's
 * offsets file (offsets.c), shared by every process.
 *
 * An offset is the next entry a group has to consume; entries below it are
 * acknowledged.  Acknowledging is a compare-and-swap max on the mapped word,
 * so it is lock-free, visible to every process at once, monotonic whatever
 * order concurrent acks arrive in, and survives the death of any process (the
 * page cache keeps it; the flusher syncs it).  Acks past the committed entry
 * are clamped: nothing can be acknowledged before it exists.
 *
 * Registration (claiming a slot for a name) is rare and takes the shard
 * state's robust groups_lock, so two processes registering one name get one
 * slot.  The name is written before the slot's state becomes 1 (release), so
 * a reader that sees a registered slot sees its whole name.  Names are
 * checked before anything is claimed: an invalid or too long name never
 * consumes a slot and is never truncated.
 *
 * Handles cache the slot index and its generation; a slot freed and reused by
 * another group changes generation, and the handle looks its name up again.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"

struct comet_group {
    shard *sh;
    _Atomic uint32_t index;      /* may be refreshed by any thread using the handle */
    _Atomic uint32_t generation;
    size_t len;
    char name[GROUP_NAME_MAX + 1];
    struct comet_group *next; /* the shard's list of handles */
};

static int64_t coarse_now_ns(void) { return sys_clock_ns(CLOCK_REALTIME_COARSE); }

/* ---- registration ---------------------------------------------------------- */

static int lock_groups(shard *sh)
{
    int rc = pthread_mutex_lock(&sh->st->groups_lock.mutex);
    if (rc == EOWNERDEAD) {
        /* a registrant died: any slot it left half written has state 0 */
        pthread_mutex_consistent(&sh->st->groups_lock.mutex);
        rc = 0;
    }
    return rc ? set_errno_error(rc, "cannot lock the groups of %s", sh->dir) : 0;
}

/* The index of the slot registered under name, -1 when there is none. */
static int64_t find_slot(shard *sh, const char *name, size_t len)
{
    for (uint32_t i = 0; i < OFFSETS_GROUPS; i++) {
        group_slot *s = offsets_slot(sh, i);
        if (atomic_load_explicit(&s->state, memory_order_acquire) == 1 && s->name_len == len &&
            memcmp(s->name, name, len) == 0)
            return i;
    }
    return -1;
}

/* Finds the name's slot, registering it when asked (under groups_lock). */
static int64_t lookup(shard *sh, const char *name, size_t len, int create)
{
    int attached = offsets_attach(sh, create);
    if (attached < 0)
        return attached;
    if (attached == OFFSETS_NONE)
        return set_error(COMET_E_NO_GROUP, "group '%.*s' is not registered in %s", (int)len, name,
                         sh->dir);
    int64_t i = find_slot(sh, name, len);
    if (i >= 0 || !create)
        return i >= 0 ? i
                      : set_error(COMET_E_NO_GROUP, "group '%.*s' is not registered in %s",
                                  (int)len, name, sh->dir);
    int rc = lock_groups(sh);
    if (rc)
        return rc;
    i = find_slot(sh, name, len);
    for (uint32_t k = 0; i < 0 && k < OFFSETS_GROUPS; k++) {
        group_slot *s = offsets_slot(sh, k);
        if (atomic_load(&s->state) != 0)
            continue;
        memset(s->name, 0, sizeof s->name);
        memcpy(s->name, name, len);
        s->name_len = (uint32_t)len;
        atomic_store(&s->offset, atomic_load(&sh->st->first_entry));
        atomic_store(&s->last_ack_ns, 0);
        atomic_store(&s->acks, 0);
        atomic_store(&s->delivered, 0);
        atomic_store(&s->retries, 0);
        atomic_store(&s->failed, 0);
        atomic_store(&s->last_delivery_ns, 0);
        s->registered_ns = now_ns();
        atomic_fetch_add(&s->generation, 1);
        atomic_store_explicit(&s->state, 1, memory_order_release);
        i = k;
    }
    pthread_mutex_unlock(&sh->st->groups_lock.mutex);
    if (i < 0)
        return set_error(COMET_E_TOO_MANY_GROUPS,
                         "all %d group slots of %s are taken; delete unused groups first",
                         OFFSETS_GROUPS, sh->dir);
    return i;
}

int comet_group_open(comet_stream *s, uint32_t shard_id, const char *name, size_t len,
                     int create, comet_group **out)
{
    if (!out)
        return set_error(COMET_E_INVALID, "comet_group_open: null output");
    int rc = comet_validate_group_name(name, len);
    if (rc)
        return rc;
    shard *sh;
    rc = shard_acquire(s, shard_id, &sh);
    if (rc)
        return rc;
    comet_group *g = NULL;
    pthread_mutex_lock(&sh->cache_lock);
    for (g = sh->groups; g; g = g->next)
        if (g->len == len && memcmp(g->name, name, len) == 0)
            break;
    pthread_mutex_unlock(&sh->cache_lock);
    int64_t i = lookup(sh, name, len, create);
    if (i < 0) {
        shard_leave(sh);
        return (int)i;
    }
    if (!g) {
        g = sys_calloc(1, sizeof *g);
        if (!g) {
            shard_leave(sh);
            return set_error(COMET_E_NOMEM, "out of memory");
        }
        g->sh = sh;
        g->len = len;
        memcpy(g->name, name, len);
        pthread_mutex_lock(&sh->cache_lock);
        g->next = sh->groups;
        sh->groups = g;
        pthread_mutex_unlock(&sh->cache_lock);
    }
    g->index = (uint32_t)i;
    g->generation = atomic_load(&offsets_slot(sh, (uint32_t)i)->generation);
    shard_leave(sh);
    *out = g;
    return 0;
}

/* The handle's slot, looked up again when it was freed or reused. */
static group_slot *group_slot_of(comet_group *g, int *rc)
{
    group_slot *s = offsets_slot(g->sh, g->index);
    if (atomic_load_explicit(&s->state, memory_order_acquire) == 1 &&
        atomic_load_explicit(&s->generation, memory_order_relaxed) == g->generation)
        return s;
    int64_t i = lookup(g->sh, g->name, g->len, 0);
    if (i < 0) {
        *rc = set_error(COMET_E_NO_GROUP, "group '%s' was deleted from %s", g->name, g->sh->dir);
        return NULL;
    }
    g->index = (uint32_t)i;
    s = offsets_slot(g->sh, g->index);
    g->generation = atomic_load(&s->generation);
    return s;
}

/* ---- offsets --------------------------------------------------------------- */

/* Holds the shard and returns the handle's slot; NULL (and *rc) on failure,
 * with nothing held.  Pair a non-NULL result with shard_leave(g->sh). */
static group_slot *group_enter(comet_group *g, int *rc)
{
    if (!g) {
        *rc = set_error(COMET_E_INVALID, "null group");
        return NULL;
    }
    shard *sh; /* the handle's shard struct, reopened if it was closed (lru.c) */
    if ((*rc = shard_acquire(g->sh->stream, g->sh->id, &sh)))
        return NULL;
    group_slot *s = group_slot_of(g, rc);
    if (!s)
        shard_leave(g->sh);
    return s;
}

/* The entries below an offset are durable before the offset is stored: the
 * offsets page may reach the disk at any moment (the kernel writes mapped
 * pages back when it likes), and an offset on disk ahead of the entries that
 * survived a power cut would acknowledge data that is gone.  Past the
 * durable point this is a sync, shared with the writer's group commit. */
static int durable_below(shard *sh, uint64_t offset)
{
    if (atomic_load_explicit(&sh->st->durable_entry, memory_order_acquire) >= offset)
        return 0;
    return shard_sync(sh, offset);
}

/* Moves the offset forward to want (clamped to the committed entry). */
static int64_t advance(shard *sh, group_slot *s, uint64_t want)
{
    uint64_t committed = atomic_load_explicit(&sh->st->next_entry, memory_order_acquire);
    if (want > committed)
        want = committed;
    uint64_t cur = atomic_load_explicit(&s->offset, memory_order_relaxed);
    int rc = cur < want ? durable_below(sh, want) : 0;
    if (rc)
        return rc;
    while (cur < want &&
           !atomic_compare_exchange_weak_explicit(&s->offset, &cur, want, memory_order_release,
                                                  memory_order_relaxed))
        ;
    if (cur < want) {
        cut_point(CUT_OFFSETS_ACKED);
        atomic_store_explicit(&s->last_ack_ns, coarse_now_ns(), memory_order_relaxed);
        atomic_fetch_add_explicit(&s->acks, 1, memory_order_relaxed);
        if (!atomic_load_explicit(&sh->offsets_dirty, memory_order_relaxed))
            atomic_store_explicit(&sh->offsets_dirty, 1, memory_order_relaxed);
        return (int64_t)want;
    }
    return (int64_t)cur;
}

int64_t comet_group_ack(comet_group *g, uint64_t entry)
{
    int rc;
    group_slot *s = group_enter(g, &rc);
    if (!s)
        return rc;
    int64_t r = advance(g->sh, s, entry + 1);
    shard_leave(g->sh);
    return r;
}

int64_t comet_group_ack_range(comet_group *g, uint64_t from, uint64_t to)
{
    if (from > to)
        return set_error(COMET_E_INVALID, "ack_range: from (%" PRIu64 ") is after to (%" PRIu64 ")",
                         from, to);
    int rc;
    group_slot *s = group_enter(g, &rc);
    if (!s)
        return rc;
    uint64_t cur = atomic_load(&s->offset);
    int64_t r = from > cur ? set_error(COMET_E_ACK_GAP,
                                       "ack_range(%" PRIu64 ", %" PRIu64 ") would skip entries %" PRIu64
                                       "..%" PRIu64 " that group '%s' has not acknowledged in %s",
                                       from, to, cur, from - 1, g->name, g->sh->dir)
                           : advance(g->sh, s, to + 1);
    shard_leave(g->sh);
    return r;
}

int64_t comet_group_reset(comet_group *g, int64_t offset)
{
    int rc;
    group_slot *s = group_enter(g, &rc);
    if (!s)
        return rc;
    int64_t committed = (int64_t)atomic_load_explicit(&g->sh->st->next_entry, memory_order_acquire);
    int64_t want = offset < 0 ? committed + offset : offset;
    if (want < 0)
        want = 0;
    if (want > committed)
        want = committed;
    if ((rc = durable_below(g->sh, (uint64_t)want))) {
        shard_leave(g->sh);
        return rc;
    }
    atomic_store_explicit(&s->offset, (uint64_t)want, memory_order_release);
    atomic_store(&g->sh->offsets_dirty, 1);
    shard_leave(g->sh);
    return want;
}

int64_t comet_group_offset(comet_group *g)
{
    int rc;
    group_slot *s = group_enter(g, &rc);
    if (!s)
        return rc;
    int64_t r = (int64_t)atomic_load_explicit(&s->offset, memory_order_acquire);
    shard_leave(g->sh);
    return r;
}

int comet_group_count(comet_group *g, uint64_t delivered, uint64_t retries, uint64_t failed)
{
    int rc;
    group_slot *s = group_enter(g, &rc);
    if (!s)
        return rc;
    if (delivered) {
        atomic_fetch_add_explicit(&s->delivered, delivered, memory_order_relaxed);
        atomic_store_explicit(&s->last_delivery_ns, coarse_now_ns(), memory_order_relaxed);
    }
    if (retries)
        atomic_fetch_add_explicit(&s->retries, retries, memory_order_relaxed);
    if (failed)
        atomic_fetch_add_explicit(&s->failed, failed, memory_order_relaxed);
    shard_leave(g->sh);
    return 0;
}

int64_t comet_group_lag(comet_group *g)
{
    int64_t off = comet_group_offset(g);
    if (off < 0)
        return off;
    int64_t committed = (int64_t)atomic_load_explicit(&g->sh->st->next_entry, memory_order_acquire);
    return committed > off ? committed - off : 0;
}

int comet_group_delete(comet_stream *s, const char *name, size_t len)
{
    int rc = comet_validate_group_name(name, len);
    if (rc)
        return rc;
    int found = 0;
    for (uint32_t id = 0; id < (s ? s->shard_count : 0); id++) {
        shard *sh;
        rc = shard_acquire(s, id, &sh);
        if (rc)
            return rc;
        int attached = offsets_attach(sh, 0);
        if (attached) {
            shard_leave(sh);
            if (attached < 0)
                return attached;
            continue; /* no group was ever registered in this shard */
        }
        rc = lock_groups(sh);
        if (!rc) {
            int64_t i = find_slot(sh, name, len);
            if (i >= 0) {
                group_slot *slot = offsets_slot(sh, (uint32_t)i);
                atomic_store_explicit(&slot->state, 0, memory_order_release);
                atomic_fetch_add(&slot->generation, 1);
                found = 1;
            }
            pthread_mutex_unlock(&sh->st->groups_lock.mutex);
        }
        shard_leave(sh);
        if (rc)
            return rc;
    }
    if (!s)
        return set_error(COMET_E_INVALID, "null stream");
    return found ? 0 : set_error(COMET_E_NO_GROUP, "group '%.*s' is not registered in stream '%s'",
                                 (int)len, name, s->name);
}

int comet_group_list(comet_stream *s, uint32_t shard_id, comet_group_info *out, uint32_t cap)
{
    shard *sh;
    int rc = stream_check_shard(s, shard_id);
    if (rc)
        return rc;
    rc = shard_acquire_if_open(s, shard_id, &sh);
    if (rc == COMET_E_WOULD_BLOCK) {
        /* Not open here: a shard without an offsets file has no group, and
         * listing thousands of idle shards must not open them (lru.c). */
        char path[COMET_PATH_MAX];
        struct stat sb;
        if (!path_format(path, "%s/shard-%04u/%s", s->dir, shard_id, OFFSETS_NAME) &&
            sys_stat(path, &sb) && errno == ENOENT)
            return 0;
        rc = shard_acquire(s, shard_id, &sh);
    }
    if (rc)
        return rc;
    uint32_t n = 0;
    uint64_t committed = atomic_load_explicit(&sh->st->next_entry, memory_order_acquire);
    if ((rc = offsets_attach(sh, 0)) != 0) {
        shard_leave(sh);
        return rc == OFFSETS_NONE ? 0 : rc;
    }
    for (uint32_t i = 0; i < OFFSETS_GROUPS; i++) {
        group_slot *slot = offsets_slot(sh, i);
        if (atomic_load_explicit(&slot->state, memory_order_acquire) != 1)
            continue;
        if (out && n < cap) {
            comet_group_info *info = &out[n];
            memset(info, 0, sizeof *info);
            memcpy(info->name, slot->name, slot->name_len);
            info->offset = atomic_load(&slot->offset);
            info->lag = committed > info->offset ? committed - info->offset : 0;
            info->last_ack_ns = atomic_load(&slot->last_ack_ns);
            info->registered_ns = slot->registered_ns;
            info->acks = atomic_load(&slot->acks);
            info->delivered = atomic_load(&slot->delivered);
            info->retries = atomic_load(&slot->retries);
            info->failed = atomic_load(&slot->failed);
            info->last_delivery_ns = atomic_load(&slot->last_delivery_ns);
        }
        n++;
    }
    shard_leave(sh);
    return (int)n;
}
