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
 * Locks live in a file that outlives processes: the kernel may write the
 * state page to disk at any moment (writeback, an msync while some thread
 * holds a lock), so its durable copy can say "locked" by a thread that is
 * gone.  A robust mutex reports its owner's death (EOWNERDEAD) only to
 * processes that share the owner's mapping of the page; one that finds such
 * a word in a copy of the directory, a volume attached again, or after a cut
 * the kernel survived (processes killed, page cache dropped) would wait for
 * it forever.  Hence the rule: the lock words are only meaningful while a
 * process holds the shared lock.  Every process that has the shard open
 * keeps the state file's descriptor with a shared open-file-description lock
 * on STATE_HOLDERS_LOCK_BYTE, which the kernel drops when the process dies
 * (kill -9 included).  An opener, serialised with every other opener by
 * flock() on the state file, first tries that lock exclusively: when it gets
 * it, no living process has the shard open, so every lock word is
 * re-initialised before anyone uses it and the tail is checked as after a
 * restart (STATE_UNHELD: only the durable point is sure); then the lock is
 * made shared.  When the exclusive lock is refused, living processes hold
 * the shard and the words are theirs: a holder that dies is reported by the
 * robust mutex as before.  Two openers never both re-initialise: the second
 * waits for the first's flock, and by then the first holds the shared lock.
 * (flock and OFD locks are separate kinds of lock on Linux; they do not
 * conflict with each other, which is why both are needed.)
 *
 * Checking the tail as after a restart costs a scan from the durable point
 * and, in a recycled segment, a new segment (recovery.c); so the last process
 * to let the shard go (its exclusive lock granted, under flock) marks a state
 * whose commit point is all synced as closed cleanly (closed_clean, synced to
 * the disk), and an opener that finds the mark clears it on the disk before
 * anything else and checks the tail as usual: nothing was written since.
 *
 * The boot id of the kernel that initialised the locks is recorded too, and
 * the locks are initialised again when it differs (STATE_REBOOTED); after a
 * real reboot no process can hold the shard, so that is the same rule, kept
 * because only then is everything read known to have come from the disk.
 *
 * Cost: one descriptor per open shard, the state file's, held until the
 * shard is released (comet_close, a stream's deletion).  A process built
 * before this rule holds no OFD lock: run it alongside a newer one on the
 * same directory and the newer may re-initialise a lock the older holds.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"

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

/* Whether any lock word of the state is held (or was left by a holder that
 * died); never waits.  A word this call takes is let go again, so that the
 * re-initialisation that follows never frees a mutex on this thread's
 * robust list. */
static int lock_word_held(pthread_mutex_t *m)
{
    int rc = pthread_mutex_trylock(m);
    if (rc == EOWNERDEAD) {
        pthread_mutex_consistent(m);
        pthread_mutex_unlock(m);
        return 1;
    }
    if (rc == 0)
        pthread_mutex_unlock(m);
    return rc != 0;
}

/* Re-initialises the lock words of a state no living process uses; a word
 * found held (its holder gone) is counted as a dead owner's. */
static int reset_locks(state_file *st, int *held)
{
    *held = lock_word_held(&st->append_lock.mutex) | lock_word_held(&st->sync_lock.mutex) |
            lock_word_held(&st->groups_lock.mutex);
    if (*held)
        sc_add(st, SC_LOCK_OWNER_DIED, 1);
    return state_init_locks(st);
}

/* Takes this opener's shared lock on STATE_HOLDERS_LOCK_BYTE; *alone is set
 * when it could take it exclusively first (no other open of the file holds
 * it).  Under flock, so no other opener can take it exclusively meanwhile. */
static int hold_state(shard *sh, const char *path, int *alone)
{
    int rc = ofd_lock(sh->state_fd, path, STATE_HOLDERS_LOCK_BYTE, 1, F_WRLCK, 0);
    if (rc < 0)
        return rc;
    *alone = rc == 0;
    /* made shared at once: the decision is taken, and flock keeps the other
     * openers out until this one is done */
    rc = ofd_lock(sh->state_fd, path, STATE_HOLDERS_LOCK_BYTE, 1, F_RDLCK, 0);
    if (rc == OFD_BUSY) /* only an opener holds it exclusively, and they wait for our flock */
        rc = set_error(COMET_E_IO, "cannot share the lock of %s: an opener holds it outside flock",
                       path);
    return rc;
}

/* Called with flock held on sh->state_fd.  *rebuilt is set when the state
 * was created or re-created: the commit point must then come from a scan;
 * STATE_REBOOTED or STATE_UNHELD when the lock words were re-initialised
 * (see the top comment).  *stale_lock: a lock word was found held by no
 * living process.  On success the opener holds the shared lock. */
int state_open(shard *sh, int *rebuilt, int *stale_lock)
{
    *rebuilt = 0;
    *stale_lock = 0;
    char path[COMET_PATH_MAX];
    path_format(path, "%s/%s", sh->dir, STATE_NAME); /* sh->dir leaves room: see comet_open */
    int alone;
    int rc = hold_state(sh, path, &alone);
    if (rc)
        return rc;
    struct stat sb;
    if (sys_fstat(sh->state_fd, &sb))
        return set_errno_error(errno, "cannot stat state of %s", sh->dir);
    int fresh = sb.st_size == 0;
    if (sb.st_size != STATE_FILE_BYTES) {
        rc = preallocate(sh->state_fd, STATE_FILE_BYTES, path);
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
        rc = state_reset(sh, boot_id);
        if (rc)
            return rc;
        *rebuilt = STATE_REBUILT; /* recovery finds the commit point in the segments */
        return 0;
    }
    int rebooted = memcmp(st->boot_id, boot_id, 16) != 0;
    if (rebooted || alone) {
        rc = reset_locks(st, stale_lock);
        if (rc)
            return rc;
        if (rebooted)
            header_seal(st, boot_id);
        int clean = atomic_load(&st->closed_clean) == STATE_CLOSED_CLEAN;
        if (clean) {
            /* From now on this process may write past what the disk has: the
             * mark must be gone from the disk first (no lock is held now, so
             * the page written carries none). */
            atomic_store(&st->closed_clean, 0);
            if (sys_msync(st, STATE_FILE_BYTES, MS_SYNC))
                return set_errno_error(errno, "msync of the state of %s failed", sh->dir);
        }
        /* Closed cleanly and not opened since: the state is what the disk
         * holds, commit point and write_hwm exact, and only the lock words
         * may be stale (a copy, a volume attached again). */
        *rebuilt = rebooted ? STATE_REBOOTED : clean ? 0 : STATE_UNHELD;
    }
    return 0;
}

void state_close_if_last(shard *sh)
{
    state_file *st = sh->st;
    if (!st || sh->state_fd < 0)
        return;
    if (sys_flock(sh->state_fd, LOCK_EX)) /* no opener decides meanwhile */
        return;
    char path[COMET_PATH_MAX];
    path_format(path, "%s/%s", sh->dir, STATE_NAME);
    /* Only a shard whose open finished (its tail checked) is known clean: an
     * open that failed after rebuilding the state leaves a commit point that
     * recovery never confirmed. */
    if (atomic_load(&sh->open) != SHARD_CLOSED &&
        ofd_lock(sh->state_fd, path, STATE_HOLDERS_LOCK_BYTE, 1, F_WRLCK, 0) == 0 &&
        atomic_load(&st->durable_entry) >= atomic_load(&st->next_entry) &&
        !atomic_load(&st->recovery_pending) && !atomic_load(&st->sync_failed) &&
        atomic_load(&st->deleted) != STATE_DELETED) {
        /* Not synced: without a restart the page cache is what every
         * opener reads; after one the boot id differs and the mark is not
         * consulted; a mark that did reach the disk is true (everything was
         * durable, and an opener removes it from the disk before writing).
         * So closing a shard costs no device flush (lru.c closes thousands). */
        atomic_store(&st->closed_clean, STATE_CLOSED_CLEAN);
    }
    /* Let go now, not at close: a mapping keeps the open file description,
     * and with it the lock, alive for as long as it exists. */
    ofd_lock(sh->state_fd, path, STATE_HOLDERS_LOCK_BYTE, 1, F_UNLCK, 0);
    sys_flock(sh->state_fd, LOCK_UN);
}

void state_close(shard *sh)
{
    if (sh->st)
        sys_munmap(sh->st, STATE_FILE_BYTES);
    sh->st = NULL;
}
