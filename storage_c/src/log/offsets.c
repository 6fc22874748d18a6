/*
 * offsets.c - the consumer groups' offsets file of a shard: a mapped table of
 * up to 512 named offsets shared by every process (FORMAT.md, "Consumer
 * offsets"); groups.c registers groups in it and moves their offsets.
 *
 * A shard's offsets file exists once a group was registered in it (an idle
 * shard costs no file and no descriptor for it); a process attaches to it at
 * open, or when it first needs it, possibly made meanwhile by another.  The
 * shard's open, sync, close, recovery and retention use what it knows of
 * the registered groups (offsets_min, offsets_max) and nothing of groups.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

static void header_fill(offsets_header *h, uint32_t shard_id)
{
    memset(h, 0, sizeof *h);
    h->magic = MAGIC_OFFSETS;
    h->version = FORMAT_VERSION;
    h->header_bytes = FILE_HEADER_BYTES;
    h->shard_id = shard_id;
    h->capacity = OFFSETS_GROUPS;
    h->slot_bytes = sizeof(group_slot);
    h->header_crc = crc32c_header(h);
}

static int slot_sane(const group_slot *s)
{
    uint32_t state = atomic_load(&s->state);
    if (state == 0)
        return 1;
    return state == 1 && s->name_len >= 1 && s->name_len <= GROUP_NAME_MAX &&
           comet_validate_group_name(s->name, s->name_len) == 0;
}


/* Maps the offsets file, creating it when asked (under flock on the state
 * file, so that one process at a time checks or writes its header). */
static int offsets_map(shard *sh, int create)
{
    char path[COMET_PATH_MAX];
    if (path_format(path, "%s/%s", sh->dir, OFFSETS_NAME))
        return set_error(COMET_E_INVALID, "path too long in %s", sh->dir);
    int fd = create ? open_new(path, O_RDWR | O_CLOEXEC | O_CREAT, sh->dir)
                    : sys_open(path, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0 && errno == ENOENT && !create)
        return OFFSETS_NONE;
    if (fd < 0)
        return set_errno_error(errno, "cannot open %s", path);
    struct stat sb;
    int rc = 0, made = 0;
    if (sys_fstat(fd, &sb))
        rc = set_errno_error(errno, "cannot stat %s", path);
    else if (sb.st_size < OFFSETS_FILE_BYTES) {
        rc = preallocate(fd, OFFSETS_FILE_BYTES, path);
        made = 1;
    }
    if (rc) {
        sys_close(fd);
        return rc;
    }
    void *map = sys_mmap(NULL, OFFSETS_FILE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        rc = set_errno_error(errno, "cannot map %s", path);
        sys_close(fd);
        return rc;
    }
    offsets_header *h = map;
    int valid = h->magic == MAGIC_OFFSETS && h->header_crc == crc32c_header(h);
    if (valid && h->version != FORMAT_VERSION)
        rc = set_error(COMET_E_FORMAT_VERSION, "%s has format version %u; this build reads version %u",
                       path, h->version, FORMAT_VERSION);
    else if (!valid || h->shard_id != sh->id || h->capacity != OFFSETS_GROUPS) {
        /* New, or a damaged header: write it again and keep every slot that
         * is still consistent - offsets are data, not a cache. */
        offsets_header fresh;
        header_fill(&fresh, sh->id);
        memcpy(h, &fresh, sizeof fresh);
        for (uint32_t i = 0; i < OFFSETS_GROUPS; i++) {
            group_slot *s = (group_slot *)((uint8_t *)map + OFFSETS_SLOTS_OFFSET +
                                           (size_t)i * sizeof(group_slot));
            if (!slot_sane(s))
                memset(s, 0, sizeof *s);
        }
    }
    /* A file made now, after the shard's segments: its name and header must
     * be durable before an offset in it is, or a power cut loses the acks. */
    if (!rc && made && (sys_msync(map, OFFSETS_FILE_BYTES, MS_SYNC) || fsync_dir(sh->dir)))
        rc = set_errno_error(errno ? errno : EIO, "cannot sync the new %s", path);
    if (!rc && made)
        rc = shard_sync_stream_dir(sh);
    if (rc) {
        sys_munmap(map, OFFSETS_FILE_BYTES);
        sys_close(fd);
        return rc;
    }
    sh->offsets_fd = fd;
    sh->offsets = map; /* published last: offsets_attach reads it without the lock */
    return 0;
}

int offsets_open(shard *sh)
{
    int rc = offsets_map(sh, 0);
    return rc == OFFSETS_NONE ? 0 : rc;
}

int offsets_attach(shard *sh, int create)
{
    if (sh->offsets)
        return 0;
    pthread_mutex_lock(&sh->cache_lock);
    int rc = 0;
    if (!sh->offsets) {
        if (sys_flock(sh->state_fd, LOCK_EX))
            rc = set_errno_error(errno, "cannot lock the state of %s", sh->dir);
        else {
            rc = offsets_map(sh, create);
            sys_flock(sh->state_fd, LOCK_UN);
        }
    }
    pthread_mutex_unlock(&sh->cache_lock);
    return rc;
}

void offsets_close(shard *sh)
{
    if (sh->offsets)
        sys_munmap(sh->offsets, OFFSETS_FILE_BYTES);
    sh->offsets = NULL;
    if (sh->offsets_fd >= 0)
        sys_close(sh->offsets_fd);
    sh->offsets_fd = -1;
}

int offsets_sync(shard *sh)
{
    if (sh->offsets_fd < 0)
        return 0;
    cut_point(CUT_OFFSETS_SYNCING);
    return sys_fdatasync(sh->offsets_fd) ? shard_note_sync_failure(sh, errno, "fdatasync of the offsets")
                                         : 0;
}

uint64_t offsets_min(shard *sh, int *registered)
{
    uint64_t min = UINT64_MAX;
    *registered = 0;
    if (offsets_attach(sh, 0)) {
        clear_error(); /* no file: no group; a file that cannot be read protects nothing */
        return min;
    }
    for (uint32_t i = 0; i < OFFSETS_GROUPS; i++) {
        group_slot *s = offsets_slot(sh, i);
        if (atomic_load_explicit(&s->state, memory_order_acquire) != 1)
            continue;
        (*registered)++;
        uint64_t off = atomic_load_explicit(&s->offset, memory_order_acquire);
        if (off < min)
            min = off;
    }
    return min;
}

uint64_t offsets_max(shard *sh)
{
    uint64_t max = 0;
    if (offsets_attach(sh, 0)) {
        clear_error();
        return max;
    }
    for (uint32_t i = 0; i < OFFSETS_GROUPS; i++) {
        group_slot *s = offsets_slot(sh, i);
        if (atomic_load_explicit(&s->state, memory_order_acquire) != 1)
            continue;
        uint64_t off = atomic_load_explicit(&s->offset, memory_order_acquire);
        if (off > max)
            max = off;
    }
    return max;
}
