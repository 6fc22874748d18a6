/* Recycled segments (src/recycle.c): a deleted segment's file, full of valid
 * entries of its earlier life, becomes the shard's next segment.  Entries
 * here all have the same size, so every old entry sits exactly where a new
 * one of the recycled segment goes: the worst case for telling them apart.
 *
 * Each payload names its own entry number, so a stale entry read back under
 * a new number is caught at once.  The checks:
 *   - with recycling, the files are reused (the counter and the spare file),
 *     reads and verification see only this life's entries;
 *   - with the flusher running, a kept file becomes the spare at once, so
 *     steady rotations recycle without a sync by the appender;
 *   - a crash (the process dies, as kill -9 would leave it) at every system
 *     call of a run of appends that rotates into recycled files: reopened,
 *     every acknowledged entry reads back as written, no entry of a file's
 *     earlier life is ever returned, and appends go on from there;
 *   - a recycled file whose new header never reached the disk, in the
 *     segment the durable point falls in, ends the log before it after a
 *     restart: the segments before it keep every entry;
 *   - a new segment whose name reached the disk without its contents (a
 *     torn creation) is removed after a restart, not set aside;
 *   - a segment file of the old format version (1) is still read. */
#include <dirent.h>
#include <errno.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "util.h"

#define PAYLOAD 100
#define SEGMENT (64u << 10)
#define MAX_N 3000

static read_buf rb;

/* Enough entries to rotate through ~12 segments: retention deletes, the
 * spare is taken and refilled many times. */
#define PER_SEGMENT (SEGMENT / (PAYLOAD + 20))
#define PREFILL (6 * PER_SEGMENT)
#define RUN_UPTO (PREFILL + 3 * PER_SEGMENT)

static void payload_for(uint64_t e, char out[PAYLOAD])
{
    memset(out, 'x', PAYLOAD);
    char head[32];
    int n = snprintf(head, sizeof head, "entry %llu;", (unsigned long long)e);
    memcpy(out, head, (size_t)n);
}

static comet_config recycle_config(void)
{
    comet_config cfg;
    comet_config_default(&cfg);
    cfg.segment_bytes = SEGMENT;
    cfg.flags |= COMET_OPEN_NO_FLUSHER;
    cfg.retention_max_shard_bytes = 3 * SEGMENT; /* with the indexes: 2 sealed kept */
    cfg.retention_interval_ms = 0;
    return cfg;
}

static comet_stream *open_recycling(const char *dir, comet_db **db)
{
    comet_config cfg = recycle_config();
    CHECK_OK(comet_open(dir, &cfg, db));
    return open_stream(*db, "r", 1);
}

/* Appends entries until next_entry reaches `upto`; returns the last result.
 * Syncs every quarter segment, as the flusher would: a deleted segment's
 * file becomes the spare once a directory sync made the deletion durable. */
static int64_t append_upto(comet_stream *s, uint64_t upto, volatile uint64_t *acked)
{
    char p[PAYLOAD];
    comet_shard_stats st;
    int64_t rc = comet_shard_stats_get(s, 0, COMET_STATS_ALL, &st);
    for (uint64_t e = st.next_entry; rc == 0 && e < upto; e++) {
        payload_for(e, p);
        int64_t got = comet_append(s, 0, p, PAYLOAD, 0, -1, COMET_APPEND_WAIT);
        if (got < 0)
            return got;
        CHECK((uint64_t)got == e);
        if (acked)
            *acked = e + 1;
        if (e % (PER_SEGMENT / 4) == 0 && (rc = comet_sync(s, 0)))
            return rc;
    }
    return rc;
}

/* Every stored entry is this life's, in order; returns next_entry. */
static uint64_t check_all(comet_stream *s, uint64_t acked)
{
    comet_shard_stats st;
    CHECK_OK(comet_shard_stats_get(s, 0, COMET_STATS_ALL, &st));
    CHECK(st.next_entry >= acked); /* nothing acknowledged is lost */
    uint64_t from = st.first_entry, seen = 0;
    char want[PAYLOAD];
    while (from < st.next_entry) {
        CHECK_OK(read_some(s, 0, from, 1024, &rb, 0));
        CHECK(rb.res.skipped == 0);
        for (uint32_t i = 0; i < rb.res.count; i++) {
            uint64_t e = (uint64_t)rb.entries[i];
            CHECK(e == from + i);
            payload_for(e, want);
            CHECK(rb.offsets[i + 1] - rb.offsets[i] == PAYLOAD);
            CHECK(memcmp(rb.data + rb.offsets[i], want, PAYLOAD) == 0);
            seen++;
        }
        CHECK(rb.res.count > 0);
        from = rb.res.next_entry;
    }
    CHECK(seen == st.next_entry - st.first_entry);
    comet_verify_report vr;
    CHECK_OK(comet_verify_shard(s, 0, &vr));
    CHECK(vr.bad_entries == 0);
    return st.next_entry;
}


static void test_files_are_reused(void)
{
    char *dir = scratch_dir();
    comet_db *db;
    comet_stream *s = open_recycling(dir, &db);
    CHECK_OK(append_upto(s, 12 * PER_SEGMENT, NULL));
    comet_shard_stats st;
    CHECK_OK(comet_shard_stats_get(s, 0, COMET_STATS_ALL, &st));
    CHECK(st.recycled_segments >= 6 && st.retention_deleted_segments >= 6);
    CHECK(st.first_entry > 0);
    check_all(s, st.next_entry);
    comet_close(db);
    /* and again after a clean reopen, appending over the recycled tail */
    s = open_recycling(dir, &db);
    uint64_t next = check_all(s, st.next_entry);
    CHECK_OK(append_upto(s, next + 2 * PER_SEGMENT, NULL));
    check_all(s, next + 2 * PER_SEGMENT);
    comet_close(db);
    rm_tree(dir);
}

/* With the flusher running and its own passes far away, a file a rotation
 * keeps becomes the spare within moments (the rotation wakes the flusher to
 * sync the directory and name it), so the next rotation reuses it with no
 * sync by the appender: steady rotations keep recycling. */
static void test_the_flusher_settles_a_kept_file_at_once(void)
{
    char *dir = scratch_dir();
    comet_config cfg = recycle_config();
    cfg.flags &= ~COMET_OPEN_NO_FLUSHER;
    cfg.fsync_interval_ms = 600000;
    comet_db *db;
    CHECK_OK(comet_open(dir, &cfg, &db));
    comet_stream *s = open_stream(db, "r", 1);
    char p[PAYLOAD], pending[600];
    snprintf(pending, sizeof pending, "%s/r/shard-0000/spare.log.free.tmp", dir);
    struct stat sb;
    for (uint64_t e = 0; e < 10 * PER_SEGMENT; e++) {
        payload_for(e, p);
        CHECK(comet_append(s, 0, p, PAYLOAD, 0, -1, COMET_APPEND_WAIT) == (int64_t)e);
        for (int ms = 0; ms < 10000 && stat(pending, &sb) == 0; ms++)
            nanosleep(&(struct timespec){0, 1000000}, NULL);
        CHECK(stat(pending, &sb) != 0); /* settled, long before the flusher's interval */
    }
    comet_shard_stats st;
    CHECK_OK(comet_shard_stats_get(s, 0, COMET_STATS_ALL, &st));
    printf("    %llu segments deleted, %llu recycled, no sync by the appender\n",
           (unsigned long long)st.retention_deleted_segments,
           (unsigned long long)st.recycled_segments);
    CHECK(st.retention_deleted_segments >= 5);
    CHECK(st.recycled_segments + 1 >= st.retention_deleted_segments);
    check_all(s, st.next_entry);
    comet_close(db);
    rm_tree(dir);
}

static void test_crash_at_every_call(void)
{
    volatile uint64_t *acked = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                                    -1, 0);
    CHECK(acked != MAP_FAILED);
    long crashes = 0, n = 1;
    for (; n <= MAX_N; n++) {
        char *dir = scratch_dir();
        comet_db *db;
        comet_stream *s = open_recycling(dir, &db);
        CHECK_OK(append_upto(s, PREFILL, NULL));
        comet_shard_stats st;
        CHECK_OK(comet_shard_stats_get(s, 0, COMET_STATS_ALL, &st));
        CHECK(st.recycled_segments > 0); /* the active segment is a file full of old entries */
        comet_close(db);
        *acked = PREFILL;
        fflush(NULL);
        pid_t pid = fork();
        CHECK(pid >= 0);
        if (pid == 0) {
            fault_once(COMET_FAULT_ALL, n, COMET_FAULT_CRASH);
            comet_db *cdb;
            comet_config cfg = recycle_config();
            if (comet_open(dir, &cfg, &cdb) == 0) {
                comet_stream *cs = NULL;
                if (comet_stream_open(cdb, "r", 1, 1, 0, &cs) == 0)
                    append_upto(cs, RUN_UPTO, acked);
                comet_close(cdb);
            }
            _exit(0);
        }
        int status;
        CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status));
        int crashed = WEXITSTATUS(status) == COMET_FAULT_CRASH_EXIT;
        CHECK(crashed || WEXITSTATUS(status) == 0);
        crashes += crashed;
        s = open_recycling(dir, &db);
        uint64_t next = check_all(s, *acked);
        CHECK_OK(append_upto(s, next + PER_SEGMENT, NULL)); /* appends go on after the crash */
        check_all(s, next + PER_SEGMENT);
        comet_close(db);
        rm_tree(dir);
        if (!crashed)
            break; /* the run no longer reaches the nth call */
    }
    CHECK(n <= MAX_N && crashes > 50);
    printf("    %ld crash points, every one recovered without an old entry\n", crashes);
    munmap((void *)acked, 4096);
}

/* A version 1 segment: the header says 1 and each checksum starts from ~0
 * alone (entries below 2^32 checksum the same in both versions; the flag
 * bits of the header must be zero).  Reading it back needs no conversion. */
static void test_version_1_segment_is_read(void)
{
    char *dir = scratch_dir();
    comet_db *db = open_db(dir, SEGMENT);
    comet_stream *s = open_stream(db, "r", 1);
    char p[PAYLOAD];
    for (uint64_t e = 0; e < 10; e++) {
        payload_for(e, p);
        CHECK(comet_append(s, 0, p, PAYLOAD, 0, -1, COMET_APPEND_WAIT) == (int64_t)e);
    }
    comet_close(db);
    char path[512];
    snprintf(path, sizeof path, "%s/r/shard-0000/%020d.log", dir, 0);
    FILE *f = fopen(path, "r+b");
    CHECK(f != NULL);
    uint8_t h[64];
    CHECK(fread(h, 1, 64, f) == 64);
    uint16_t v = 1;
    memcpy(h + 4, &v, 2);
    uint32_t crc = comet_crc32c(0, h, 60, 0);
    crc = ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
    memcpy(h + 60, &crc, 4);
    CHECK(fseek(f, 0, SEEK_SET) == 0 && fwrite(h, 1, 64, f) == 64);
    fclose(f);
    db = open_db(dir, SEGMENT);
    s = open_stream(db, "r", 1);
    payload_for(10, p);
    /* appended in version 1 */
    CHECK(comet_append(s, 0, p, PAYLOAD, 0, -1, COMET_APPEND_WAIT) == 10);
    check_all(s, 11);
    comet_close(db);
    rm_tree(dir);
}

/* The bases of the shard's segment files, ascending (at most max). */
static size_t segment_bases(const char *shard_dir, uint64_t *bases, size_t max)
{
    DIR *d = opendir(shard_dir);
    CHECK(d != NULL);
    size_t n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t len = strlen(de->d_name);
        if (len == 24 && strcmp(de->d_name + 20, ".log") == 0 && n < max)
            bases[n++] = strtoull(de->d_name, NULL, 10);
    }
    closedir(d);
    for (size_t i = 1; i < n; i++)
        for (size_t j = i; j > 0 && bases[j - 1] > bases[j]; j--) {
            uint64_t t = bases[j];
            bases[j] = bases[j - 1];
            bases[j - 1] = t;
        }
    return n;
}

/* The power went right after a rotation took the spare: the new segment's
 * header (not synced then) reads as its earlier life's, and the state's
 * durable point is the new segment's base (everything before it synced).  The
 * scan of a restart starts in the segment holding the durable point: that
 * stale file, which holds no entry.  The log must end at its base, with every
 * earlier segment's entries there (found by the power-cut tests: the shard
 * was taken as empty from that base on, hiding two segments of entries). */
static void test_stale_recycled_segment_at_the_durable_point(void)
{
    char *dir = scratch_dir();
    comet_db *db;
    comet_stream *s = open_recycling(dir, &db);
    CHECK_OK(append_upto(s, PREFILL, NULL));
    comet_shard_stats st;
    CHECK_OK(comet_shard_stats_get(s, 0, COMET_STATS_ALL, &st));
    CHECK(st.recycled_segments > 0);
    comet_close(db);

    char shard_dir[512], path[600];
    snprintf(shard_dir, sizeof shard_dir, "%s/r/shard-0000", dir);
    uint64_t bases[64];
    size_t n = segment_bases(shard_dir, bases, 64);
    CHECK(n >= 2);
    uint64_t first = bases[0], last = bases[n - 1];
    CHECK(first == st.first_entry);
    uint8_t older[64]; /* a valid header of this shard saying an older base */
    snprintf(path, sizeof path, "%s/%020llu.log", shard_dir, (unsigned long long)first);
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL && fread(older, 1, sizeof older, f) == sizeof older);
    fclose(f);
    snprintf(path, sizeof path, "%s/%020llu.log", shard_dir, (unsigned long long)last);
    rewrite_file(path, 0, older, sizeof older);
    snprintf(path, sizeof path, "%s/state", shard_dir);
    rewrite_file(path, 192, &last, 8);  /* next_entry */
    rewrite_file(path, 256, &last, 8);  /* durable_entry */
    uint32_t zero = 0;
    rewrite_file(path, 640, &zero, 4);  /* no clean close: opened as after a restart */

    s = open_recycling(dir, &db);
    CHECK_OK(comet_shard_stats_get(s, 0, COMET_STATS_ALL, &st));
    CHECK(st.first_entry == first);
    CHECK(st.next_entry == last);
    check_all(s, last);
    CHECK_OK(append_upto(s, last + PER_SEGMENT, NULL)); /* and appends go on from there */
    check_all(s, last + PER_SEGMENT);
    comet_close(db);
    rm_tree(dir);
}

/* A rotation syncs nothing: the power may leave a new segment's name on the
 * disk without its contents (zeros, or an empty file).  Past the durable
 * point nothing of it was acknowledged: recovery removes it - never sets it
 * aside as damage - and appends create the segment again under its name. */
static void test_torn_creation_past_the_durable_point(void)
{
    static const uint64_t sizes[] = {0, 64u << 10};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        char *dir = scratch_dir();
        comet_db *db;
        comet_stream *s = open_recycling(dir, &db);
        CHECK_OK(append_upto(s, 2 * PER_SEGMENT, NULL));
        comet_shard_stats st;
        CHECK_OK(comet_shard_stats_get(s, 0, COMET_STATS_ALL, &st));
        comet_close(db);

        char shard_dir[512], path[600];
        snprintf(shard_dir, sizeof shard_dir, "%s/r/shard-0000", dir);
        snprintf(path, sizeof path, "%s/%020llu.log", shard_dir,
                 (unsigned long long)st.next_entry);
        FILE *f = fopen(path, "wb");
        CHECK(f != NULL && ftruncate(fileno(f), (off_t)sizes[k]) == 0);
        fclose(f);
        snprintf(path, sizeof path, "%s/state", shard_dir);
        uint32_t zero = 0;
        rewrite_file(path, 640, &zero, 4); /* no clean close: opened as after a restart */

        s = open_recycling(dir, &db);
        comet_shard_stats after;
        CHECK_OK(comet_shard_stats_get(s, 0, COMET_STATS_ALL, &after));
        CHECK(after.next_entry == st.next_entry && after.first_entry == st.first_entry);
        CHECK(after.orphaned_segments == st.orphaned_segments);
        uint64_t bases[64];
        size_t n = segment_bases(shard_dir, bases, 64);
        CHECK(n >= 1 && bases[n - 1] < st.next_entry); /* the torn file is gone */
        snprintf(path, sizeof path, "%s/%020llu.log.orphan", shard_dir,
                 (unsigned long long)st.next_entry);
        CHECK(access(path, F_OK) != 0);
        check_all(s, st.next_entry);
        CHECK_OK(append_upto(s, st.next_entry + PER_SEGMENT, NULL)); /* the name is free again */
        check_all(s, st.next_entry + PER_SEGMENT);
        comet_close(db);
        rm_tree(dir);
    }
}

int main(void)
{
    RUN(test_files_are_reused);
    RUN(test_the_flusher_settles_a_kept_file_at_once);
    RUN(test_stale_recycled_segment_at_the_durable_point);
    RUN(test_torn_creation_past_the_durable_point);
    RUN(test_version_1_segment_is_read);
    RUN(test_crash_at_every_call);
    return 0;
}
