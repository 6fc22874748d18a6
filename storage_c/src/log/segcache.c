/*
 * segcache.c - the segments of a shard known to this process.
 *
 * The list is read from the shard directory once, and again only when the
 * shard's active generation changes (rotation, growth, recovery) or a segment
 * is not where the list says: readers notice rotation without reading any
 * index file.  Segments are mapped on first use.  Every user holds a
 * reference, counted under a process-local mutex, so that a refresh, an index
 * rebuild or a close never unmaps a segment another thread is reading: a
 * replaced object is freed when its last reference goes.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"


static int parse_base(const char *name, const char *suffix, uint64_t *base)
{
    size_t len = strlen(name), slen = strlen(suffix);
    if (len != 20 + slen || strcmp(name + 20, suffix) != 0)
        return 0;
    uint64_t v = 0;
    for (int i = 0; i < 20; i++) {
        if (name[i] < '0' || name[i] > '9')
            return 0;
        v = v * 10 + (uint64_t)(name[i] - '0');
    }
    *base = v;
    return 1;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int segment_list_bases(const char *dir, uint64_t **out, size_t *count)
{
    DIR *d = sys_opendir(dir);
    if (!d)
        return set_errno_error(errno, "cannot list %s", dir);
    size_t n = 0, cap = 16;
    uint64_t *bases = sys_malloc(cap * sizeof *bases);
    struct dirent *de;
    while (bases && (de = sys_readdir(d))) {
        uint64_t b;
        if (!parse_base(de->d_name, SEGMENT_SUFFIX, &b))
            continue;
        if (n == cap) {
            uint64_t *grown = sys_realloc(bases, 2 * cap * sizeof *bases);
            if (!grown) {
                free(bases);
                bases = NULL;
                break;
            }
            bases = grown;
            cap *= 2;
        }
        bases[n++] = b;
    }
    int err = bases ? errno : 0; /* from the readdir that ended the loop */
    sys_closedir(d);
    if (!bases)
        return set_error(COMET_E_NOMEM, "out of memory listing %s", dir);
    if (err) { /* a partial listing would look like missing segments */
        free(bases);
        return set_errno_error(err, "cannot list %s", dir);
    }
    qsort(bases, n, sizeof *bases, cmp_u64);
    *out = bases;
    *count = n;
    return 0;
}

static void release_locked(segment *seg)
{
    if (--seg->refs == 0 && seg->removed)
        segment_free(seg);
}

static void drop_locked(segment *seg)
{
    seg->removed = 1;
    if (seg->refs == 0)
        segment_free(seg);
}

static int refresh_locked(shard *sh)
{
    uint64_t gen = atomic_load_explicit(&sh->st->active_gen, memory_order_acquire);
    uint64_t *bases = NULL;
    size_t n = 0;
    int rc = segment_list_bases(sh->dir, &bases, &n);
    if (rc)
        return rc;
    segment **segs = sys_calloc(n ? n : 1, sizeof *segs);
    if (!segs) {
        free(bases);
        return set_error(COMET_E_NOMEM, "out of memory listing %s", sh->dir);
    }
    size_t j = 0;
    for (size_t i = 0; i < n; i++) {
        while (j < sh->nsegs && sh->segs[j]->base < bases[i])
            drop_locked(sh->segs[j++]);
        if (j < sh->nsegs && sh->segs[j]->base == bases[i])
            segs[i] = sh->segs[j++];
        else if (!(segs[i] = segment_new(bases[i]))) {
            for (size_t k = 0; k < i; k++)
                if (!segs[k]->map)
                    free(segs[k]);
            /* keep the old list intact: nothing was dropped past j */
            free(segs);
            free(bases);
            return set_error(COMET_E_NOMEM, "out of memory listing %s", sh->dir);
        }
    }
    while (j < sh->nsegs)
        drop_locked(sh->segs[j++]);
    free(sh->segs);
    free(bases);
    sh->segs = segs;
    sh->nsegs = n;
    sh->listed_active_gen = gen;
    return 0;
}

static int refresh_if_stale_locked(shard *sh)
{
    if (sh->nsegs && sh->listed_active_gen ==
                         atomic_load_explicit(&sh->st->active_gen, memory_order_acquire))
        return 0;
    return refresh_locked(sh);
}

int shard_refresh_segments(shard *sh)
{
    pthread_mutex_lock(&sh->cache_lock);
    int rc = refresh_locked(sh);
    pthread_mutex_unlock(&sh->cache_lock);
    return rc;
}

/* Maps seg if needed, or replaces it when another process grew the file. */
static int ensure_mapped_locked(shard *sh, size_t i)
{
    segment *seg = sh->segs[i];
    if (seg->map && segment_header_capacity(seg) <= seg->capacity)
        return 0;
    if (seg->map && segment_refresh_capacity(seg, sh->dir) >= segment_header_capacity(seg))
        return 0; /* grown within the mapping: nothing to map again */
    if (seg->map) {
        segment *fresh = segment_new(seg->base);
        if (!fresh)
            return set_error(COMET_E_NOMEM, "out of memory");
        drop_locked(seg);
        sh->segs[i] = seg = fresh;
    }
    int rc = segment_load(seg, sh->dir, sh->id);
    if (rc)
        return rc;
    /* A sealed segment's index that is missing or inconsistent is rebuilt
     * here, once; the active one is recovery's (it may be being appended). */
    int sealed = i + 1 < sh->nsegs &&
                 seg->base != atomic_load_explicit(&sh->st->active_base, memory_order_acquire);
    uint64_t end_entry = i + 1 < sh->nsegs ? sh->segs[i + 1]->base : UINT64_MAX;
    if (!seg->index_ok && sealed &&
        index_rebuild(seg, sh->dir, sh->id, seg->capacity, end_entry) == 0)
        sc_add(sh->st, SC_INDEX_REBUILDS, 1);
    return 0;
}

static size_t find_le_locked(const shard *sh, uint64_t entry)
{
    size_t lo = 0, hi = sh->nsegs; /* first segment with base > entry */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (sh->segs[mid]->base <= entry)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo; /* the answer is lo - 1; 0 means none */
}

int shard_segment_for(shard *sh, uint64_t entry, segment **out, uint64_t *seg_end_entry)
{
    *out = NULL;
    pthread_mutex_lock(&sh->cache_lock);
    int rc = refresh_if_stale_locked(sh);
    if (!rc) {
        size_t i = find_le_locked(sh, entry);
        if (i == 0) {
            *seg_end_entry = sh->nsegs ? sh->segs[0]->base : UINT64_MAX;
        } else {
            *seg_end_entry = i < sh->nsegs ? sh->segs[i]->base : UINT64_MAX;
            rc = ensure_mapped_locked(sh, i - 1);
            if (!rc) {
                *out = sh->segs[i - 1];
                (*out)->refs++;
            }
        }
    }
    pthread_mutex_unlock(&sh->cache_lock);
    return rc;
}

int shard_segment_get(shard *sh, uint64_t base, segment **out)
{
    segment *seg = NULL;
    int rc = 0;
    pthread_mutex_lock(&sh->cache_lock);
    for (int attempt = 0; attempt < 2 && !seg; attempt++) {
        /* A directory that cannot be listed is an I/O error, not a missing
         * segment: saying "missing" would send the caller into recovery. */
        int listed = attempt ? refresh_locked(sh) : refresh_if_stale_locked(sh);
        if (listed) {
            rc = listed;
            break;
        }
        size_t i = find_le_locked(sh, base);
        if (!i || sh->segs[i - 1]->base != base) {
            rc = set_error(COMET_E_CORRUPT, "segment %" PRIu64 " of %s is missing", base, sh->dir);
            continue;
        }
        rc = ensure_mapped_locked(sh, i - 1);
        if (rc == 0) {
            seg = sh->segs[i - 1];
            seg->refs++;
        }
    }
    pthread_mutex_unlock(&sh->cache_lock);
    *out = seg;
    return seg ? 0 : rc;
}

segment *shard_segment_by_base(shard *sh, uint64_t base)
{
    segment *seg;
    shard_segment_get(sh, base, &seg);
    return seg;
}

int shard_segment_fd(shard *sh, segment *seg)
{
    pthread_mutex_lock(&sh->cache_lock);
    int fd = segment_fd(seg, sh->dir);
    pthread_mutex_unlock(&sh->cache_lock);
    return fd;
}

segment *shard_segment_rebuild_index(shard *sh, segment *seg, uint64_t end_entry)
{
    segment *fresh = segment_new(seg->base);
    if (!fresh)
        return seg;
    if (segment_load(fresh, sh->dir, sh->id) ||
        index_rebuild(fresh, sh->dir, sh->id, fresh->capacity, end_entry)) {
        segment_free(fresh);
        return seg;
    }
    sc_add(sh->st, SC_INDEX_REBUILDS, 1);
    pthread_mutex_lock(&sh->cache_lock);
    fresh->refs = 1;
    fresh->removed = 1; /* unless it takes seg's place below */
    for (size_t i = 0; i < sh->nsegs; i++) {
        if (sh->segs[i] == seg) {
            sh->segs[i] = fresh;
            fresh->removed = 0;
            drop_locked(seg);
            break;
        }
    }
    release_locked(seg);
    pthread_mutex_unlock(&sh->cache_lock);
    return fresh;
}

void shard_segment_release(shard *sh, segment *seg)
{
    if (!seg)
        return;
    pthread_mutex_lock(&sh->cache_lock);
    release_locked(seg);
    pthread_mutex_unlock(&sh->cache_lock);
}

int shard_list_segments(shard *sh, uint64_t **bases, size_t *count)
{
    *bases = NULL;
    *count = 0;
    int rc = shard_refresh_segments(sh);
    return rc ? rc : shard_segment_bases(sh, bases, count);
}

int shard_segment_bases(shard *sh, uint64_t **bases, size_t *count)
{
    pthread_mutex_lock(&sh->cache_lock);
    int rc = refresh_if_stale_locked(sh);
    if (!rc) {
        *count = sh->nsegs;
        *bases = sys_malloc((sh->nsegs ? sh->nsegs : 1) * sizeof **bases);
        if (!*bases)
            rc = set_error(COMET_E_NOMEM, "out of memory");
        for (size_t i = 0; !rc && i < sh->nsegs; i++)
            (*bases)[i] = sh->segs[i]->base;
    }
    pthread_mutex_unlock(&sh->cache_lock);
    return rc;
}

/* Drops every segment of the shard from the cache (close). */
void shard_segments_clear(shard *sh)
{
    pthread_mutex_lock(&sh->cache_lock);
    if (sh->active)
        release_locked(sh->active);
    sh->active = NULL;
    for (size_t i = 0; i < sh->nsegs; i++)
        drop_locked(sh->segs[i]);
    free(sh->segs);
    sh->segs = NULL;
    sh->nsegs = 0;
    pthread_mutex_unlock(&sh->cache_lock);
}
