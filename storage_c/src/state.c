/*
 * state.c - the shard state file: one page, mapped shared by every process
 * that uses the shard.  It holds the two process-shared robust mutexes, the
 * commit point readers poll, the durable point, and the statistics.
 *
 * The state is a cache of what the segments say, plus counters.  A missing or
 * damaged state is rebuilt (the counters restart; state_rebuilds says so) and
 * recovery then finds the commit point by scanning the last segment.  A state
 * written by another format version is refused rather than rewritten, so an
 * older build never silently downgrades a newer directory.
 *
 * Locks live in a file that outlives processes and boots.  After a reboot the
 * mutex words may still say "locked" by a thread that no longer exists, so the
 * boot id of the kernel that initialised them is recorded and the locks are
 * initialised again when it differs.  This is only ever done under sys_flock() on
 * the state file, which every opener takes, so two processes never
 * re-initialise a lock the other one is using.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "crc32c.h"
#include "errors.h"
#include "internal.h"

int robust_mutex_init(pthread_mutex_t *m)
{
    pthread_mutexattr_t attr;
    int rc = pthread_mutexattr_init(&attr);
    if (!rc)
        rc = pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    if (!rc)
        rc = pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
    if (!rc)
        rc = pthread_mutex_init(m, &attr); /* pthread calls return an errno value */
    pthread_mutexattr_destroy(&attr);
    return rc ? set_errno_error(rc, "cannot initialise a process-shared mutex") : 0;
}

int state_init_locks(state_file *st)
{
    memset(&st->append_lock, 0, sizeof st->append_lock);
    memset(&st->sync_lock, 0, sizeof st->sync_lock);
    memset(&st->groups_lock, 0, sizeof st->groups_lock);
    int rc = robust_mutex_init(&st->append_lock.mutex);
    if (!rc)
        rc = robust_mutex_init(&st->sync_lock.mutex);
    if (!rc)
        rc = robust_mutex_init(&st->groups_lock.mutex);
    return rc;
}

static void header_seal(state_file *st, const uint8_t boot_id[16])
{
    memcpy(st->boot_id, boot_id, 16);
    st->header_crc = crc32c_header(st);
}

static int state_reset(shard *sh, const uint8_t boot_id[16])
{
    state_file *st = sh->st;
    memset(st, 0, sizeof *st);
    st->magic = MAGIC_STATE;
    st->version = FORMAT_VERSION;
    st->header_bytes = FILE_HEADER_BYTES;
    st->shard_id = sh->id;
    st->created_ns = now_ns();
    header_seal(st, boot_id);
    return state_init_locks(st);
}

/* Called with flock held on sh->state_fd.  *rebuilt is set when the state
 * was created or re-created: the commit point must then come from a scan. */
int state_open(shard *sh, int *rebuilt)
{
    *rebuilt = 0;
    struct stat sb;
    if (sys_fstat(sh->state_fd, &sb))
        return set_errno_error(errno, "cannot stat state of %s", sh->dir);
    int fresh = sb.st_size == 0;
    if (sb.st_size != STATE_FILE_BYTES) {
        char path[COMET_PATH_MAX];
        path_format(path, "%s/%s", sh->dir, STATE_NAME); /* sh->dir leaves room: see comet_open */
        int rc = preallocate(sh->state_fd, STATE_FILE_BYTES, path);
        if (rc)
            return rc;
        if (sb.st_size > STATE_FILE_BYTES && sys_ftruncate(sh->state_fd, STATE_FILE_BYTES))
            return set_errno_error(errno, "cannot size state file of %s", sh->dir);
    }
    void *map = sys_mmap(NULL, STATE_FILE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, sh->state_fd, 0);
    if (map == MAP_FAILED)
        return set_errno_error(errno, "cannot map state file of %s", sh->dir);
    sh->st = map;
    state_file *st = sh->st;
    uint8_t boot_id[16];
    int brc = read_boot_id(boot_id);
    if (brc)
        return brc;

    if (st->magic == MAGIC_STATE && st->header_crc == crc32c_header(st) &&
        st->version != FORMAT_VERSION)
        return set_error(COMET_E_FORMAT_VERSION,
                         "%s/state has format version %u; this build reads version %u",
                         sh->dir, st->version, FORMAT_VERSION);
    int valid = !fresh && sb.st_size == STATE_FILE_BYTES && st->magic == MAGIC_STATE &&
                st->version == FORMAT_VERSION && st->header_bytes == FILE_HEADER_BYTES &&
                st->header_crc == crc32c_header(st) && st->shard_id == sh->id;
    if (!valid) {
        int rc = state_reset(sh, boot_id);
        if (rc)
            return rc;
        *rebuilt = STATE_REBUILT; /* recovery finds the commit point in the segments */
        return 0;
    }
    if (memcmp(st->boot_id, boot_id, 16) != 0) {
        int rc = state_init_locks(st);
        if (rc)
            return rc;
        header_seal(st, boot_id);
        *rebuilt = STATE_REBOOTED;
    }
    return 0;
}

void state_close(shard *sh)
{
    if (sh->st)
        sys_munmap(sh->st, STATE_FILE_BYTES);
    sh->st = NULL;
}
