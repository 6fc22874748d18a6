/* No append waits for a device flush under "interval" (issue 27).
 *
 * The system-call table (src/sys.h) is wrapped so that every fsync,
 * fdatasync, msync and fallocate is counted per thread (and msyncs in all),
 * and a sync can be made to "take" seconds by moving the clocks
 * (comet_clock_shift) from inside it.  The checks:
 *   - an appender that rotates twenty times, with the flusher's work run in
 *     another thread once each segment is half full, makes none of those
 *     calls itself: the rotation takes the spare the flusher prepared
 *     (src/recycle.c) and syncs nothing; every entry reads back, and
 *     reopened the shard has them all;
 *   - the spare is prepared only when the shard's limit and the directory's
 *     budget leave room for it, and counts in the shard's disk use;
 *   - the state is msynced when the durable point moved, at most once per
 *     interval, and a move inside the interval reaches the disk at a later
 *     pass; an idle shard's state is not msynced pass after pass;
 *   - the interval is measured from a sync's end: right after a sync that
 *     took longer than twice the interval an append does not sync itself,
 *     and once twice the interval passed since that sync's end, it does. */
#include <pthread.h>
#include <stdatomic.h>
#include <sys/stat.h>

#include "sys.h"
#include "util.h"

#define PAYLOAD 1000
#define SEGMENT (256u << 10)
#define INTERVAL_MS 1000

static comet_sys_table real;
static _Thread_local long device_calls; /* this thread's fsync/fdatasync/msync/fallocate */
static atomic_long msyncs;              /* every thread's */
static atomic_int slow_sync;            /* a fdatasync "takes" 2.5 intervals */
static read_buf rb;

static int count_fsync(int fd)
{
    device_calls++;
    return real.fsync(fd);
}

static int count_fdatasync(int fd)
{
    device_calls++;
    int rc = real.fdatasync(fd);
    if (atomic_load(&slow_sync))
        comet_clock_shift((int64_t)INTERVAL_MS * 2500000);
    return rc;
}

static int count_msync(void *addr, size_t len, int flags)
{
    device_calls++;
    atomic_fetch_add(&msyncs, 1);
    return real.msync(addr, len, flags);
}

static int count_fallocate(int fd, off_t offset, off_t len)
{
    device_calls++;
    return real.fallocate(fd, offset, len);
}

static void wrap_sys(void)
{
    real = comet_sys;
    comet_sys.fsync = count_fsync;
    comet_sys.fdatasync = count_fdatasync;
    comet_sys.msync = count_msync;
    comet_sys.fallocate = count_fallocate;
}

static comet_config interval_config(void)
{
    comet_config cfg;
    comet_config_default(&cfg);
    cfg.segment_bytes = SEGMENT;
    cfg.durability = COMET_DURABILITY_INTERVAL;
    cfg.fsync_interval_ms = INTERVAL_MS;
    cfg.retention_interval_ms = 0;
    /* The flusher's work is run by the test, in a thread of its own, at
     * chosen moments: comet_sync_all does what a flusher pass does. */
    cfg.flags |= COMET_OPEN_NO_FLUSHER;
    return cfg;
}

static comet_db *open_interval(const char *dir)
{
    comet_config cfg = interval_config();
    comet_db *db = NULL;
    CHECK_OK(comet_open(dir, &cfg, &db));
    return db;
}

static void *flusher_pass(void *db)
{
    CHECK_OK(comet_sync_all(db));
    return NULL;
}

static void *sync_stream(void *s)
{
    CHECK_OK(comet_sync(s, -1));
    return NULL;
}

/* The stream's entries synced by another thread: one fdatasync, the
 * segment's (comet_sync_all would sync the offsets file too). */
static void run_sync(comet_stream *s)
{
    pthread_t t;
    CHECK(pthread_create(&t, NULL, sync_stream, s) == 0);
    CHECK(pthread_join(t, NULL) == 0);
}

/* One flusher pass, in another thread: its calls are not the appender's. */
static void run_flusher(comet_db *db)
{
    pthread_t t;
    CHECK(pthread_create(&t, NULL, flusher_pass, db) == 0);
    CHECK(pthread_join(t, NULL) == 0);
}

static uint64_t rotations(comet_stream *s)
{
    comet_shard_stats st;
    CHECK_OK(comet_shard_stats_get(s, 0, &st));
    return st.rotations;
}

static void append_one(comet_stream *s, uint64_t e)
{
    char p[PAYLOAD];
    memset(p, 0, sizeof p);
    memcpy(p, &e, sizeof e);
    int64_t got = comet_append(s, 0, p, PAYLOAD, 0, -1, COMET_APPEND_WAIT);
    CHECK_OK(got);
    CHECK((uint64_t)got == e);
}

static void test_rotations_sync_nothing_in_the_appender(void)
{
    char *dir = scratch_dir();
    comet_db *db = open_interval(dir);
    comet_stream *s = open_stream(db, "r", 1);
    uint64_t e = 0;
    while (rotations(s) == 0) /* the first segment is created and grown by the appender */
        append_one(s, e++);
    long before = device_calls;
    uint64_t past_half = SEGMENT * 3 / 4 / (PAYLOAD + 64), since = 1; /* whatever the header */
    for (uint64_t r = rotations(s); r < 21; since++) {
        if (since == past_half)
            run_flusher(db); /* half full: the flusher prepares the next segment */
        append_one(s, e++);
        uint64_t now = rotations(s);
        if (now != r) {
            r = now;
            since = 1;
        }
    }
    long made = device_calls - before;
    if (made)
        fprintf(stderr, "the appender made %ld fsync/fdatasync/msync/fallocate calls\n", made);
    CHECK(made == 0);
    for (uint64_t at = 0; at < e;) {
        CHECK_OK(read_some(s, 0, at, 1024, &rb, 0));
        CHECK(rb.res.count > 0);
        for (uint32_t i = 0; i < rb.res.count; i++) {
            uint64_t named;
            memcpy(&named, rb.data + rb.offsets[i], sizeof named);
            CHECK((uint64_t)rb.entries[i] == at + i && named == at + i);
        }
        at += rb.res.count;
    }
    CHECK_OK(comet_close(db));
    db = open_interval(dir);
    s = open_stream(db, "r", 1);
    comet_shard_stats st;
    CHECK_OK(comet_shard_stats_get(s, 0, &st));
    CHECK(st.next_entry == e && st.durable_entry == e);
    CHECK_OK(comet_close(db));
    rm_tree(dir);
}

/* Retention's deleted segment takes the place of a prepared spare: steady
 * appends keep reusing written files (recycle.c), prepared ones or not. */
static void test_deleted_segments_replace_prepared_spares(void)
{
    char *dir = scratch_dir();
    comet_config cfg = interval_config();
    cfg.retention_max_age_ms = 1000;
    comet_db *db = NULL;
    CHECK_OK(comet_open(dir, &cfg, &db));
    comet_stream *s = open_stream(db, "k", 1);
    uint64_t e = 0, past_half = SEGMENT * 3 / 4 / (PAYLOAD + 64), since = 1;
    for (uint64_t r = rotations(s); r < 8; since++) {
        if (since == past_half) {
            run_flusher(db); /* prepares a spare when the shard has none */
            comet_clock_shift(10LL * 1000000000); /* every sealed segment is now too old */
            CHECK_OK(comet_run_retention(db, NULL)); /* keeps one, the prepared spare there */
        }
        append_one(s, e++);
        uint64_t now = rotations(s);
        if (now != r) {
            r = now;
            since = 1;
        }
    }
    comet_shard_stats st;
    CHECK_OK(comet_shard_stats_get(s, 0, &st));
    printf("    %llu rotations, %llu of them into a deleted segment's file\n",
           (unsigned long long)st.rotations, (unsigned long long)st.recycled_segments);
    CHECK(st.recycled_segments + 1 >= st.rotations); /* every rotation but the first */
    CHECK_OK(comet_close(db));
    rm_tree(dir);
}

static int exists(const char *dir, const char *name)
{
    char path[512];
    struct stat sb;
    snprintf(path, sizeof path, "%s/r/shard-0000/%s", dir, name);
    return stat(path, &sb) == 0;
}

/* A prepared spare is new disk: made only when the shard's limit and the
 * directory's budget leave room for it, and counted in the shard's disk use. */
static void test_prepared_spare_within_the_limits(void)
{
    for (int which = 0; which < 4; which++) {
        int roomy = which & 1, budget = which & 2;
        char *dir = scratch_dir();
        comet_config cfg = interval_config();
        if (budget)
            cfg.retention_max_total_bytes = (roomy ? 4 : 2) * (uint64_t)SEGMENT;
        else
            cfg.retention_max_shard_bytes = (roomy ? 3 : 2) * (uint64_t)SEGMENT;
        comet_db *db = NULL;
        CHECK_OK(comet_open(dir, &cfg, &db));
        comet_stream *s = open_stream(db, "r", 1);
        for (uint64_t e = 0; e < SEGMENT * 3 / 4 / (PAYLOAD + 64); e++)
            append_one(s, e);
        run_flusher(db);
        if (exists(dir, "spare.log.free") != roomy || exists(dir, "spare.idx.free") != roomy)
            fprintf(stderr, "%s %s: a spare %s\n", budget ? "budget" : "shard limit",
                    roomy ? "with room" : "without room", roomy ? "missing" : "made");
        CHECK(exists(dir, "spare.log.free") == roomy && exists(dir, "spare.idx.free") == roomy);
        comet_shard_stats st;
        CHECK_OK(comet_shard_stats_get(s, 0, &st));
        CHECK(st.disk_bytes >= (roomy ? 2 : 1) * (uint64_t)SEGMENT);
        uint64_t limit = budget ? cfg.retention_max_total_bytes : cfg.retention_max_shard_bytes;
        CHECK(st.disk_bytes <= limit);
        CHECK_OK(comet_close(db));
        rm_tree(dir);
    }
}

static void test_state_msynced_only_when_changed(void)
{
    char *dir = scratch_dir();
    comet_db *db = open_interval(dir);
    comet_stream *s = open_stream(db, "r", 1);
    append_one(s, 0);
    long at = atomic_load(&msyncs);
    run_flusher(db);
    CHECK(atomic_load(&msyncs) == at + 1); /* moved: written */
    append_one(s, 1);
    run_flusher(db);
    CHECK(atomic_load(&msyncs) == at + 1); /* moved, but inside the interval */
    comet_clock_shift((int64_t)INTERVAL_MS * 1000000);
    run_flusher(db);
    CHECK(atomic_load(&msyncs) == at + 2); /* that move reaches the disk at a later pass */
    for (int pass = 0; pass < 5; pass++) { /* idle: nothing to write, pass after pass */
        comet_clock_shift((int64_t)INTERVAL_MS * 1000000);
        run_flusher(db);
    }
    CHECK(atomic_load(&msyncs) == at + 2);
    CHECK_OK(comet_close(db));
    rm_tree(dir);
}

static void test_interval_from_the_end_of_a_sync(void)
{
    char *dir = scratch_dir();
    comet_db *db = open_interval(dir);
    comet_stream *s = open_stream(db, "r", 1);
    append_one(s, 0);
    atomic_store(&slow_sync, 1);
    run_sync(s); /* a sync that takes 2.5 intervals */
    atomic_store(&slow_sync, 0);
    long before = device_calls;
    append_one(s, 1);
    CHECK(device_calls == before); /* just synced: no sync of its own */
    comet_clock_shift((int64_t)INTERVAL_MS * 2100000);
    append_one(s, 2);
    CHECK(device_calls > before); /* the flusher fell behind: the appender syncs */
    CHECK_OK(comet_close(db));
    rm_tree(dir);
}

int main(void)
{
    wrap_sys();
    RUN(test_rotations_sync_nothing_in_the_appender);
    RUN(test_prepared_spare_within_the_limits);
    RUN(test_state_msynced_only_when_changed);
    RUN(test_interval_from_the_end_of_a_sync);
    RUN(test_deleted_segments_replace_prepared_spares);
    return 0;
}
