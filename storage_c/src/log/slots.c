/*
 * slots.c - process slots: which of the N processes sharing a data directory
 * this one is.
 *
 * Slot s is held by an open-file-description write lock (F_OFD_SETLK) on one
 * byte of <data>/.slots.  The kernel drops the lock when the last descriptor
 * of that open file goes away, which includes kill -9, so a replacement
 * process gets the slot back at once and no PID is ever trusted (PIDs are
 * reused; locks are not).  OFD locks also conflict between two opens in the
 * same process, so two handles in one process get two slots.
 *
 * The header records process_count.  A process with another count may only
 * change it while no slot is held: ownership (shard % count == slot) must
 * mean the same thing to every running process.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "log.h"

/* 1 if some process holds any slot lock. */
static int any_slot_held(int fd)
{
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = SLOTS_LOCK_BASE;
    fl.l_len = COMET_MAX_PROCESSES;
    if (sys_fcntl_lock(fd, F_OFD_GETLK, &fl))
        return 1;
    return fl.l_type != F_UNLCK;
}

static int write_header(int fd, const char *path, uint32_t process_count)
{
    slots_header h;
    memset(&h, 0, sizeof h);
    h.magic = MAGIC_SLOTS;
    h.version = FORMAT_VERSION;
    h.header_bytes = FILE_HEADER_BYTES;
    h.process_count = process_count;
    h.header_crc = crc32c_header(&h);
    if (sys_pwrite(fd, &h, sizeof h, 0) != (ssize_t)sizeof h)
        return set_errno_error(errno ? errno : EIO, "cannot write %s", path);
    return 0;
}

/* Under the header lock: make the file's process_count ours, or fail. */
static int agree_on_count(comet_db *db, int fd, const char *path)
{
    slots_header h;
    memset(&h, 0, sizeof h);
    ssize_t n = sys_pread(fd, &h, sizeof h, 0);
    if (n < 0) /* unread is not fresh: writing a header here would clobber a live one */
        return set_errno_error(errno, "cannot read %s", path);
    int fresh = n == 0 || (h.magic == 0 && h.header_crc == 0);
    if (!fresh && h.magic == MAGIC_SLOTS && h.header_crc == crc32c_header(&h) &&
        h.version != FORMAT_VERSION)
        return set_error(COMET_E_FORMAT_VERSION,
                         "%s/%s has format version %u; this build reads version %u", db->path,
                         SLOTS_NAME, h.version, FORMAT_VERSION);
    int valid = !fresh && h.magic == MAGIC_SLOTS && h.header_crc == crc32c_header(&h);
    if (valid && h.process_count == db->cfg.process_count)
        return 0;
    if (valid && any_slot_held(fd))
        return set_error(COMET_E_PROCESS_COUNT,
                         "running processes use process_count %u; this one was started with %u "
                         "(stop them all, or use the same count)",
                         h.process_count, db->cfg.process_count);
    return write_header(fd, path, db->cfg.process_count);
}

int comet_claim_slot(comet_db *db, int want)
{
    if (!db)
        return set_error(COMET_E_INVALID, "comet_claim_slot: null db");
    if (atomic_load(&db->closed))
        return set_error(COMET_E_CLOSED, "data directory %s is closed", db->path);
    if (db->slot >= 0)
        return set_error(COMET_E_SLOT_HELD, "this handle already holds slot %d", db->slot);
    uint32_t count = db->cfg.process_count;
    if (want >= (int)count)
        return set_error(COMET_E_INVALID, "slot %d is out of range: process_count is %u", want,
                         count);
    char path[COMET_PATH_MAX];
    if (path_format(path, "%s/%s", db->path, SLOTS_NAME))
        return set_error(COMET_E_INVALID, "data directory path too long");
    int fd = open_new(path, O_RDWR | O_CREAT | O_CLOEXEC, db->path);
    if (fd < 0)
        return set_errno_error(errno, "cannot open %s", path);
    int rc = ofd_lock(fd, path, SLOTS_HEADER_LOCK_BYTE, 1, F_WRLCK, 1);
    if (rc) {
        sys_close(fd);
        return rc;
    }
    rc = agree_on_count(db, fd, path);
    int slot = -1;
    for (uint32_t s = 0; !rc && s < count && slot < 0; s++) {
        if (want >= 0 && (uint32_t)want != s)
            continue;
        int taken = ofd_lock(fd, path, SLOTS_LOCK_BASE + (off_t)s, 1, F_WRLCK, 0);
        if (taken == 0)
            slot = (int)s;
        else if (taken < 0)
            rc = taken; /* OFD_BUSY: try the next one */
    }
    if (!rc && slot < 0)
        rc = want >= 0 ? set_error(COMET_E_NO_SLOT, "slot %d of %s is held by another process",
                                   want, db->path)
                       : set_error(COMET_E_NO_SLOT,
                                   "all %u process slots of %s are held (process_count is %u)",
                                   count, db->path, count);
    if (!rc) {
        slot_record rec = {(int64_t)getpid(), now_ns()};
        if (sys_pwrite(fd, &rec, sizeof rec, SLOTS_RECORDS_OFFSET + (off_t)slot * (off_t)sizeof rec) < 0)
            rc = set_errno_error(errno, "cannot write slot record in %s", path);
    }
    ofd_lock(fd, path, SLOTS_HEADER_LOCK_BYTE, 1, F_UNLCK, 0);
    if (rc) {
        sys_close(fd); /* drops any lock taken above */
        return rc;
    }
    db->slots_fd = fd;
    db->slot = slot;
    return slot;
}

int comet_release_slot(comet_db *db)
{
    if (!db)
        return set_error(COMET_E_INVALID, "comet_release_slot: null db");
    if (db->slots_fd >= 0)
        sys_close(db->slots_fd);
    db->slots_fd = -1;
    db->slot = -1;
    return 0;
}

int comet_slot(const comet_db *db)
{
    return db ? db->slot : -1;
}

uint32_t comet_process_count(const comet_db *db)
{
    return db ? db->cfg.process_count : 0;
}
