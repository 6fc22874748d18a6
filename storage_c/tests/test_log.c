/* The log through the C API: round trips, rotation, reopen, limits, framing,
 * recovery from damage, and a holder of the append lock dying. */
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdatomic.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "util.h"

static read_buf rb;

static void payload_for(uint64_t i, uint8_t *out, uint32_t *len)
{
    *len = (uint32_t)((i * 7919) % 300);
    for (uint32_t k = 0; k < *len; k++)
        out[k] = (uint8_t)(i + k);
}

static void check_range(comet_stream *s, uint32_t shard, uint64_t from, uint64_t to)
{
    uint64_t e = from;
    while (e < to) {
        CHECK_OK(read_some(s, shard, e, 1024, &rb, 0));
        CHECK(rb.res.count > 0);
        for (uint32_t i = 0; i < rb.res.count; i++, e++) {
            uint8_t want[400];
            uint32_t len;
            payload_for(e, want, &len);
            CHECK(rb.entries[i] == (int64_t)e);
            CHECK((uint32_t)(rb.offsets[i + 1] - rb.offsets[i]) == len);
            CHECK(memcmp(rb.data + rb.offsets[i], want, len) == 0);
        }
        CHECK(rb.res.next_entry == e);
    }
}

static void append_range(comet_stream *s, uint32_t shard, uint64_t from, uint64_t to)
{
    for (uint64_t e = from; e < to; e++) {
        uint8_t p[400];
        uint32_t len;
        payload_for(e, p, &len);
        int64_t got = comet_append(s, shard, p, len, 0, -1, COMET_APPEND_WAIT);
        CHECK_OK(got);
        CHECK((uint64_t)got == e);
    }
}

static void test_round_trip_rotation_reopen(void)
{
    char *dir = scratch_dir();
    comet_db *db = open_db(dir, 64 << 10);
    comet_stream *s = open_stream(db, "events", 2);
    append_range(s, 1, 0, 3000);
    check_range(s, 1, 0, 3000);
    check_range(s, 1, 1234, 3000);
    comet_shard_stats st;
    CHECK_OK(comet_shard_stats_get(s, 1, COMET_STATS_ALL, &st));
    CHECK(st.segments > 5 && st.rotations == st.segments - 1);
    CHECK(st.next_entry == 3000);
    comet_close(db);
    db = open_db(dir, 64 << 10);
    s = open_stream(db, "events", 0);
    CHECK(comet_stream_shards(s) == 2);
    append_range(s, 1, 3000, 3500);
    check_range(s, 1, 0, 3500);
    CHECK_OK(read_some(s, 0, 0, 10, &rb, 0));
    CHECK(rb.res.count == 0);
    comet_close(db);
    rm_tree(dir);
}

static void test_batches_and_framing(void)
{
    char *dir = scratch_dir();
    comet_db *db = open_db(dir, 1 << 20);
    comet_stream *s = open_stream(db, "b", 1);
    const char *buf = "one\ntwo\n\nthree";
    uint32_t n = 0;
    CHECK(comet_append_delimited(s, 0, buf, strlen(buf), '\n', 1, 0, -1, COMET_APPEND_WAIT,
                                 &n) == 0);
    CHECK(n == 3);
    uint32_t lens[3] = {1, 0, 2};
    CHECK(comet_append_batch(s, 0, "abc", lens, NULL, 3, -1, COMET_APPEND_WAIT) == 3);
    /* the Python API's list [b"xy", b""] */
    const comet_payload v[2] = {{"xy", 2}, {"", 0}};
    CHECK(comet_append_vector(s, 0, v, 2, 0, -1, COMET_APPEND_WAIT) == 6);
    CHECK_OK(read_some(s, 0, 0, 100, &rb, 0));
    CHECK(rb.res.count == 8);
    const char *want[8] = {"one", "two", "three", "a", "", "bc", "xy", ""};
    for (int i = 0; i < 8; i++) {
        CHECK((size_t)(rb.offsets[i + 1] - rb.offsets[i]) == strlen(want[i]));
        CHECK(memcmp(rb.data + rb.offsets[i], want[i], strlen(want[i])) == 0);
    }
    /* Bad items and limits: nothing written. */
    const comet_payload bad[2] = {{"xy", 2}, {NULL, 3}};
    CHECK(comet_append_vector(s, 0, bad, 2, 0, -1, COMET_APPEND_WAIT) == COMET_E_INVALID);
    CHECK(comet_append_vector(s, 0, NULL, 2, 0, -1, COMET_APPEND_WAIT) == COMET_E_INVALID);
    CHECK(comet_append_vector(s, 0, v, 0, 0, -1, COMET_APPEND_WAIT) == COMET_E_INVALID);
    CHECK(comet_append_vector(s, 0, v, 2, 1, -1, COMET_APPEND_WAIT) == COMET_E_WANTS_COMPRESSION);
    CHECK(comet_append_delimited(s, 0, "a\nbb\n", 5, '\n', 1, 1, -1, COMET_APPEND_WAIT, &n) ==
          COMET_E_WANTS_COMPRESSION);
    CHECK(comet_append(s, 1, "x", 1, 0, -1, COMET_APPEND_WAIT) == COMET_E_SHARD_RANGE);
    static uint8_t big[(16 << 20) + 1];
    CHECK(comet_append(s, 0, big, sizeof big, 0, -1, COMET_APPEND_WAIT) == COMET_E_ENTRY_TOO_LARGE);
    CHECK(comet_append_batch(s, 0, "", lens, NULL, 0, -1, COMET_APPEND_WAIT) == COMET_E_INVALID);
    comet_shard_stats st;
    CHECK_OK(comet_shard_stats_get(s, 0, COMET_STATS_ALL, &st));
    CHECK(st.next_entry == 8);
    comet_close(db);
    rm_tree(dir);
}

static void test_stream_names_and_counts(void)
{
    char *dir = scratch_dir();
    comet_db *db = open_db(dir, 1 << 20);
    comet_stream *s;
    const char *bad[] = {"", "../x", "a/b", ".hidden", "-x", "a b", "\xc3\xa9"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK(comet_stream_open(db, bad[i], strlen(bad[i]), 0, 1, &s) == COMET_E_STREAM_NAME);
    CHECK(comet_stream_open(db, "ab\0cd", 5, 0, 1, &s) == COMET_E_STREAM_NAME);
    char long_name[66];
    memset(long_name, 'a', 65);
    long_name[65] = 0;
    CHECK(comet_stream_open(db, long_name, 65, 0, 1, &s) == COMET_E_STREAM_NAME);
    CHECK_OK(comet_stream_open(db, long_name, 64, 0, 1, &s));
    CHECK(comet_stream_open(db, "missing", 7, 0, 0, &s) == COMET_E_NO_STREAM);
    s = open_stream(db, "fixed", 4);
    CHECK(comet_stream_open(db, "fixed", 5, 8, 1, &s) == COMET_E_SHARD_COUNT);
    comet_close(db);
    db = open_db(dir, 1 << 20);
    CHECK(comet_stream_open(db, "fixed", 5, 8, 1, &s) == COMET_E_SHARD_COUNT);
    char buf[4096];
    int64_t n = comet_list_streams(db, buf, sizeof buf);
    CHECK(n > 0);
    comet_close(db);
    rm_tree(dir);
}

static char *shard_file(const char *dir, const char *stream, int shard, const char *name)
{
    static char path[1024];
    snprintf(path, sizeof path, "%s/%s/shard-%04d/%s", dir, stream, shard, name);
    return path;
}

static void flip_byte(const char *path, off_t off)
{
    int fd = open(path, O_RDWR);
    CHECK(fd >= 0);
    uint8_t b;
    CHECK(pread(fd, &b, 1, off) == 1);
    b ^= 0x40;
    CHECK(pwrite(fd, &b, 1, off) == 1);
    close(fd);
}

static void test_damage_in_the_middle_is_skipped(void)
{
    char *dir = scratch_dir();
    comet_db *db = open_db(dir, 1 << 20);
    comet_stream *s = open_stream(db, "d", 1);
    append_range(s, 0, 0, 100);
    comet_close(db);
    /* entry 50 starts after entries 0..49: header 64 + sum(20 + len) */
    uint64_t off = 64;
    for (uint64_t e = 0; e < 50; e++) {
        uint8_t p[400];
        uint32_t len;
        payload_for(e, p, &len);
        off += 20 + len;
    }
    flip_byte(shard_file(dir, "d", 0, "00000000000000000000.log"), (off_t)off + 25);
    db = open_db(dir, 1 << 20);
    s = open_stream(db, "d", 1);
    comet_verify_report vr;
    CHECK_OK(comet_verify_shard(s, 0, &vr));
    CHECK(vr.bad_entries == 1 && vr.entries == 99 && vr.problem_count == 1);
    CHECK(vr.problems[0].entry == 50);
    CHECK_OK(read_some(s, 0, 0, 1000, &rb, 0));
    CHECK(rb.res.count == 99 && rb.res.skipped == 1);
    CHECK(rb.entries[49] == 49 && rb.entries[50] == 51);
    comet_shard_stats st;
    CHECK_OK(comet_shard_stats_get(s, 0, COMET_STATS_ALL, &st));
    CHECK(st.crc_failures == 1 && st.next_entry == 100);
    append_range(s, 0, 100, 110);
    comet_close(db);
    rm_tree(dir);
}

static void test_torn_tail_is_cut(void)
{
    char *dir = scratch_dir();
    comet_db *db = open_db(dir, 1 << 20);
    comet_stream *s = open_stream(db, "t", 1);
    append_range(s, 0, 0, 10);
    comet_close(db);
    /* Damage the last entry (a flipped byte): recovery cuts exactly there. */
    uint64_t off = 64;
    for (uint64_t e = 0; e < 9; e++) {
        uint8_t p[400];
        uint32_t len;
        payload_for(e, p, &len);
        off += 20 + len;
    }
    /* Opening a healthy shard checks its tail, and counts nothing. */
    comet_shard_stats st;
    for (int i = 0; i < 3; i++) {
        db = open_db(dir, 1 << 20);
        s = open_stream(db, "t", 1);
        CHECK_OK(comet_shard_stats_get(s, 0, COMET_STATS_ALL, &st));
        CHECK(st.next_entry == 10 && st.recoveries == 0 && st.truncated_bytes == 0);
        comet_close(db);
    }
    flip_byte(shard_file(dir, "t", 0, "00000000000000000000.log"), (off_t)off + 21);
    db = open_db(dir, 1 << 20);
    s = open_stream(db, "t", 1);
    open_shard(s, 0); /* statistics alone read the state as closed, without a check */
    CHECK_OK(comet_shard_stats_get(s, 0, COMET_STATS_ALL, &st));
    CHECK(st.next_entry == 9 && st.recoveries == 1);
    CHECK(st.truncated_entries == 1 && st.truncated_bytes > 0);
    check_range(s, 0, 0, 9);
    append_range(s, 0, 9, 20);
    check_range(s, 0, 0, 20);
    comet_close(db);
    rm_tree(dir);
}

static void test_missing_state_and_index_rebuilt(void)
{
    char *dir = scratch_dir();
    comet_db *db = open_db(dir, 64 << 10);
    comet_stream *s = open_stream(db, "r", 1);
    append_range(s, 0, 0, 2000);
    comet_close(db);
    unlink(shard_file(dir, "r", 0, "state"));
    unlink(shard_file(dir, "r", 0, "00000000000000000000.idx"));
    db = open_db(dir, 64 << 10);
    s = open_stream(db, "r", 1);
    comet_shard_stats st;
    CHECK_OK(comet_shard_stats_get(s, 0, COMET_STATS_ALL, &st));
    CHECK(st.next_entry == 2000 && st.state_rebuilds == 1);
    check_range(s, 0, 0, 2000);
    append_range(s, 0, 2000, 2100);
    check_range(s, 0, 1990, 2100);
    comet_verify_report vr;
    CHECK_OK(comet_verify_shard(s, 0, &vr));
    CHECK(vr.bad_entries == 0 && vr.entries == 2100);
    comet_close(db);
    rm_tree(dir);
}

/* A child takes the append lock (through a raw append of a huge entry that it
 * is killed during) - simpler: it locks the mutex by hand through the state
 * mapping and dies.  The parent's next append must repair and go on. */
static void test_lock_holder_dies(void)
{
    char *dir = scratch_dir();
    comet_db *db = open_db(dir, 1 << 20);
    comet_stream *s = open_stream(db, "l", 1);
    append_range(s, 0, 0, 5);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(shard_file(dir, "l", 0, "state"), O_RDWR);
        uint8_t *map = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        pthread_mutex_lock((pthread_mutex_t *)(map + 64));
        /* scribble a torn entry after the committed end, then die holding the lock */
        kill(getpid(), SIGKILL);
    }
    int status;
    waitpid(pid, &status, 0);
    append_range(s, 0, 5, 10);
    comet_shard_stats st;
    CHECK_OK(comet_shard_stats_get(s, 0, COMET_STATS_ALL, &st));
    CHECK(st.lock_owner_died == 1 && st.recoveries == 1);
    check_range(s, 0, 0, 10);
    comet_close(db);
    rm_tree(dir);
}

/* A data directory without the background thread whose segments grow by
 * chunk bytes up to segment_bytes; shard_limit: retention_max_shard_bytes. */
static comet_db *open_chunked(const char *dir, uint64_t segment_bytes, uint32_t chunk,
                              uint64_t shard_limit)
{
    comet_config cfg;
    comet_config_default(&cfg);
    cfg.segment_bytes = segment_bytes;
    cfg.segment_chunk_bytes = chunk;
    cfg.retention_max_shard_bytes = shard_limit;
    cfg.retention_interval_ms = 0;
    cfg.flags |= COMET_OPEN_NO_FLUSHER;
    comet_db *db = NULL;
    CHECK_OK(comet_open(dir, &cfg, &db));
    return db;
}

/* One entry point per shape; each stores 1020 bytes (two 490-byte entries, or
 * one of 1000), so that one that does not fit means none does. */
enum { SHAPES = 5 };

static int64_t append_shape(comet_stream *s, int shape, int durability, int mode,
                            uint32_t raw_limit)
{
    static char x[1000], lines[2 * 491], body[2 * 491];
    memset(x, 'x', sizeof x);
    for (int i = 0; i < 2; i++) {
        memset(lines + i * 491, 'x', 490);
        lines[i * 491 + 490] = '\n';
        memcpy(body + i * 491, lines + i * 491, 491);
        body[i * 491] = body[i * 491 + 489] = '"';
    }
    const uint32_t lens[2] = {490, 490};
    const comet_payload items[2] = {{x, 490}, {x, 490}};
    comet_ingest_request req = {.body = body, .len = sizeof body, .format = COMET_BODY_NDJSON,
                                .compress_above = raw_limit, .durability = durability,
                                .mode = mode};
    comet_ingest_result res;
    uint32_t count;
    switch (shape) {
    case 0:
        return comet_append(s, 0, x, sizeof x, 0, durability, mode);
    case 1:
        return comet_append_batch(s, 0, x, lens, NULL, 2, durability, mode);
    case 2:
        return comet_append_vector(s, 0, items, 2, raw_limit, durability, mode);
    case 3:
        return comet_append_delimited(s, 0, lines, sizeof lines, '\n', 1, raw_limit, durability,
                                      mode, &count);
    default:
        return comet_ingest(s, 0, &req, &res);
    }
}

static uint64_t entries_of(int shape)
{
    return shape == 0 ? 1 : 2;
}

/* Every shape refuses with COMET_APPEND_NOWAIT, and stores nothing. */
static void check_every_shape_would_block(comet_stream *s, int durability, uint64_t next)
{
    for (int shape = 0; shape < SHAPES; shape++)
        CHECK(append_shape(s, shape, durability, COMET_APPEND_NOWAIT, 0) == COMET_E_WOULD_BLOCK);
    comet_shard_stats st;
    CHECK_OK(comet_shard_stats_get(s, 0, COMET_STATS_ALL, &st));
    CHECK(st.next_entry == next);
}

/* COMET_APPEND_NOWAIT means the same in every shape (comet.h, Appends): it
 * maps, grows by chunks and zero-fills the active segment itself, makes the
 * shard's first segment (nothing synced), and refuses - nothing written -
 * where the append would wait: the shard not open in this process, a
 * rotation, the lock held elsewhere, a sync. */
static void test_nowait_appends_never_sleep(void)
{
    char *dir = scratch_dir();
    comet_db *db = open_chunked(dir, 1 << 20, 128 << 10, 0);
    comet_stream *s = open_stream(db, "q", 1);
    /* the shard not open in this process yet */
    for (int shape = 0; shape < SHAPES; shape++)
        CHECK(append_shape(s, shape, -1, COMET_APPEND_NOWAIT, 0) == COMET_E_WOULD_BLOCK);
    CHECK(comet_shard_open(s, 1) == COMET_E_SHARD_RANGE);
    CHECK_OK(comet_shard_open(s, -1)); /* every shard: no slot held here */
    comet_shard_stats st;
    CHECK_OK(comet_shard_stats_get(s, 0, COMET_STATS_ALL, &st));
    CHECK(st.next_entry == 0 && st.segments == 0);
    /* open, no segment yet: the first append makes it, and syncs nothing */
    CHECK(append_shape(s, 0, -1, COMET_APPEND_NOWAIT, 0) == 0);
    CHECK_OK(comet_shard_stats_get(s, 0, COMET_STATS_ALL, &st));
    CHECK(st.segments == 1 && st.syncs == 0 && st.rotations == 0);
    /* chunks grown and pages zero-filled on the way: never refused */
    uint64_t next = 1;
    int64_t rc;
    for (int i = 0; (rc = append_shape(s, i % SHAPES, -1, COMET_APPEND_NOWAIT, 0)) >= 0; i++) {
        CHECK((uint64_t)rc == next);
        next += entries_of(i % SHAPES);
    }
    CHECK(rc == COMET_E_WOULD_BLOCK);
    CHECK_OK(comet_shard_stats_get(s, 0, COMET_STATS_ALL, &st));
    CHECK(st.rotations == 0 && st.active_bytes > (1000u << 10));
    check_every_shape_would_block(s, -1, next); /* a rotation */
    CHECK((uint64_t)append_shape(s, 1, -1, COMET_APPEND_WAIT, 0) == next);
    next += 2;
    for (int shape = 0; shape < SHAPES; shape++) {
        CHECK((uint64_t)append_shape(s, shape, -1, COMET_APPEND_NOWAIT, 0) == next);
        next += entries_of(shape);
    }
    check_every_shape_would_block(s, COMET_DURABILITY_ALWAYS, next); /* a sync */
    /* the append lock held elsewhere (here by this thread, through the state file) */
    int fd = open(shard_file(dir, "q", 0, "state"), O_RDWR);
    CHECK(fd >= 0);
    uint8_t *map = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    CHECK(map != MAP_FAILED);
    CHECK(pthread_mutex_lock((pthread_mutex_t *)(map + 64)) == 0);
    check_every_shape_would_block(s, -1, next);
    CHECK(pthread_mutex_unlock((pthread_mutex_t *)(map + 64)) == 0);
    munmap(map, 4096);
    close(fd);
    /* a bad call fails with its own error in either mode */
    for (int shape = 0; shape < SHAPES; shape++) {
        CHECK(append_shape(s, shape, -1, 2, 0) == COMET_E_INVALID);
        CHECK(append_shape(s, shape, 3, COMET_APPEND_NOWAIT, 0) == COMET_E_INVALID);
    }
    CHECK(append_shape(s, 2, -1, COMET_APPEND_NOWAIT, 100) == COMET_E_WANTS_COMPRESSION);
    CHECK(append_shape(s, 3, -1, COMET_APPEND_NOWAIT, 100) == COMET_E_WANTS_COMPRESSION);
    CHECK_OK(comet_shard_stats_get(s, 0, COMET_STATS_ALL, &st));
    CHECK(st.next_entry == next && st.rotations == 1);
    comet_verify_report vr;
    CHECK_OK(comet_verify_shard(s, 0, &vr));
    CHECK(vr.bad_entries == 0 && vr.entries == next);
    comet_close(db);
    rm_tree(dir);
}

/* Deleting old segments for a size limit sleeps (unlinks, other shards'
 * locks): COMET_APPEND_NOWAIT leaves it to the call that may wait. */
static void test_nowait_leaves_deleting_to_the_waiting_call(void)
{
    char *dir = scratch_dir();
    comet_db *db = open_chunked(dir, 256 << 10, 64 << 10, 400 << 10);
    comet_stream *s = open_stream(db, "d", 1);
    static char p[1000];
    memset(p, 'p', sizeof p);
    comet_shard_stats st;
    uint64_t waited = 0;
    for (uint64_t e = 0; e < 2000; e++) {
        CHECK_OK(comet_shard_stats_get(s, 0, COMET_STATS_ALL, &st));
        uint64_t deleted = st.retention_deleted_segments;
        int64_t rc = comet_append(s, 0, p, sizeof p, 0, -1, COMET_APPEND_NOWAIT);
        CHECK_OK(comet_shard_stats_get(s, 0, COMET_STATS_ALL, &st));
        CHECK(st.retention_deleted_segments == deleted);
        if (rc == COMET_E_WOULD_BLOCK) {
            rc = comet_append(s, 0, p, sizeof p, 0, -1, COMET_APPEND_WAIT);
            waited++;
        }
        CHECK((uint64_t)rc == e);
    }
    CHECK_OK(comet_shard_stats_get(s, 0, COMET_STATS_ALL, &st));
    CHECK(st.retention_deleted_segments >= 4 && waited > st.rotations);
    comet_close(db);
    rm_tree(dir);
}

typedef struct racer {
    comet_stream *s;
    int closed_seen;
    _Atomic int appended; /* the main thread closes once every racer is under way */
    read_buf *rb;         /* each thread its own */
} racer;

static void *race_appends(void *arg)
{
    racer *r = arg;
    for (int i = 0; i < 200000; i++) {
        int64_t a = comet_append(r->s, 0, "x", 1, 0, -1,
                                 i % 2 ? COMET_APPEND_WAIT : COMET_APPEND_NOWAIT);
        if (a == COMET_E_WOULD_BLOCK)
            a = comet_append(r->s, 0, "y", 1, 0, -1, COMET_APPEND_WAIT);
        if (a == COMET_E_CLOSED) {
            r->closed_seen = 1;
            break;
        }
        CHECK_OK(a);
        atomic_store(&r->appended, i + 1);
        if (i % 64 == 0)
            CHECK(read_some(r->s, 0, (uint64_t)a, 4, r->rb, 0) == 0 ||
                  comet_read(r->s, 0, &(comet_read_request){0}, &r->rb->res) == COMET_E_CLOSED);
    }
    return NULL;
}

/* Closing while other threads append: they finish or get COMET_E_CLOSED,
 * never a crash (the sanitizers watch for use after free). */
static void test_close_races_with_appends(void)
{
    char *dir = scratch_dir();
    comet_db *db = open_db(dir, 1 << 20);
    comet_stream *s = open_stream(db, "race", 1);
    racer r[3];
    pthread_t t[3];
    for (int i = 0; i < 3; i++) {
        r[i] = (racer){.s = s, .rb = malloc(sizeof(read_buf))};
        CHECK(r[i].rb != NULL);
        CHECK(pthread_create(&t[i], NULL, race_appends, &r[i]) == 0);
    }
    for (int i = 0; i < 3; i++)
        while (atomic_load(&r[i].appended) < 100)
            sched_yield();
    CHECK_OK(comet_close(db));
    for (int i = 0; i < 3; i++) {
        pthread_join(t[i], NULL);
        CHECK(r[i].closed_seen);
        free(r[i].rb);
    }
    CHECK(comet_append(s, 0, "z", 1, 0, -1, COMET_APPEND_WAIT) == COMET_E_CLOSED);
    CHECK(comet_close(db) == 0);
    db = open_db(dir, 1 << 20);
    s = open_stream(db, "race", 1);
    comet_verify_report vr;
    CHECK_OK(comet_verify_shard(s, 0, &vr));
    CHECK(vr.bad_entries == 0 && vr.entries > 0);
    comet_close(db);
    rm_tree(dir);
}

static void test_config_check(void)
{
    comet_config cfg;
    comet_config_default(&cfg);
    CHECK(comet_config_check(&cfg) == 0);
    cfg.segment_bytes = 10;
    CHECK(comet_config_check(&cfg) == COMET_E_INVALID);
    CHECK(strstr(comet_last_error(), "segment_bytes") != NULL);
    comet_config_default(&cfg);
    cfg.retention_max_total_bytes = cfg.segment_bytes;
    CHECK(comet_config_check(&cfg) == COMET_E_INVALID);
    CHECK(comet_config_check(NULL) == COMET_E_INVALID);
}

/* The background thread (flush every millisecond, retention every
 * millisecond over a small budget) while two threads append to two streams,
 * one through the directory-wide budget, and a third reads: what ThreadSanitizer
 * (make tsan) watches.  Every append succeeds or reports the budget. */
typedef struct busy {
    comet_db *db;
    comet_stream *s;
    uint32_t shard;
    int reader;
    _Atomic int *stop;
    read_buf *rb;
} busy;

static void *busy_main(void *arg)
{
    busy *b = arg;
    uint64_t next = 0;
    for (int i = 0; i < 20000 && !atomic_load(b->stop); i++) {
        if (b->reader) {
            int rc = read_some(b->s, b->shard, next, 64, b->rb, 0);
            CHECK_OK(rc);
            next = b->rb->res.next_entry;
            continue;
        }
        if (b->s != NULL && b->shard == 0 && b->db && i % 2000 == 1999 && strcmp(comet_stream_name(b->s), "b") == 0) {
            char name[16]; /* new streams while the budget pass walks the list */
            snprintf(name, sizeof name, "c%d", i / 2000);
            comet_stream *c;
            CHECK_OK(comet_stream_open(b->db, name, strlen(name), 1, 1, &c));
        }
        char p[300];
        memset(p, 'a' + (i % 26), sizeof p);
        int64_t rc = comet_append(b->s, b->shard, p, sizeof p, 0, -1, COMET_APPEND_WAIT);
        CHECK(rc >= 0 || rc == COMET_E_STORAGE_FULL);
    }
    return NULL;
}

static void test_background_thread_with_appends_and_reads(void)
{
    char *dir = scratch_dir();
    comet_config cfg;
    comet_config_default(&cfg);
    cfg.segment_bytes = 64 << 10;
    cfg.fsync_interval_ms = 1;
    cfg.retention_interval_ms = 1;
    cfg.retention_max_total_bytes = 1 << 20;
    cfg.retention_protect_unconsumed = 0;
    comet_db *db = NULL;
    CHECK_OK(comet_open(dir, &cfg, &db));
    comet_stream *a = open_stream(db, "a", 2), *b2 = open_stream(db, "b", 1);
    _Atomic int stop = 0;
    busy work[4] = {{db, a, 0, 0, &stop, NULL}, {db, a, 1, 0, &stop, NULL},
                    {db, b2, 0, 0, &stop, NULL}, {db, a, 0, 1, &stop, malloc(sizeof(read_buf))}};
    CHECK(work[3].rb != NULL);
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        CHECK(pthread_create(&t[i], NULL, busy_main, &work[i]) == 0);
    for (int i = 0; i < 3; i++)
        pthread_join(t[i], NULL);
    atomic_store(&stop, 1);
    pthread_join(t[3], NULL);
    free(work[3].rb);
    CHECK(comet_data_bytes(db) <= (int64_t)(2 << 20));
    CHECK_OK(comet_close(db));
    rm_tree(dir);
}

/* The bytes of the directory's files, counted while another process appends:
 * a walk is not atomic, and the other process may delete a segment the walk
 * counted and create the next one before the walk reaches it, again and again
 * while this one waits for a CPU on a busy machine.  Such a count is over
 * `bound` once; an overshoot that three walks in a row see is real. */
static int64_t data_bytes_while_shared(comet_db *db, int64_t bound)
{
    int64_t used = comet_data_bytes(db);
    for (int walk = 1; walk < 3 && used > bound; walk++)
        used = comet_data_bytes(db);
    if (used > bound)
        fprintf(stderr, "  %" PRId64 " bytes of files, over %" PRId64 "\n", used, bound);
    return used;
}

/* Two processes append to two streams under one small directory budget:
 * each reserves from the shared estimate (.usage) instead of counting files,
 * so they cannot both take the last room.  Counting the files while the
 * other process deletes one and creates the next can see both (a walk is not
 * atomic): one segment of slack while they run, none once they are done. */
static void test_budget_across_processes(void)
{
    char *dir = scratch_dir();
    comet_config cfg;
    comet_config_default(&cfg);
    cfg.segment_bytes = 64 << 10;
    cfg.flags |= COMET_OPEN_NO_FLUSHER;
    cfg.retention_max_total_bytes = 768 << 10;
    cfg.retention_protect_unconsumed = 0;
    cfg.retention_interval_ms = 0;
    const int64_t segment = (64 << 10) + 4096; /* a segment and its index */
    pid_t child = fork();
    CHECK(child >= 0);
    const char *name = child == 0 ? "child" : "parent";
    comet_db *db = NULL;
    CHECK_OK(comet_open(dir, &cfg, &db));
    comet_stream *s = open_stream(db, name, 1);
    char p[500];
    memset(p, 'b', sizeof p);
    for (int i = 0; i < 6000; i++) {
        CHECK_OK(comet_append(s, 0, p, sizeof p, 0, -1, COMET_APPEND_WAIT));
        CHECK(data_bytes_while_shared(db, (int64_t)cfg.retention_max_total_bytes + segment) <=
              (int64_t)cfg.retention_max_total_bytes + segment);
    }
    CHECK_OK(comet_close(db));
    if (child == 0)
        _exit(0);
    int status;
    CHECK(waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK_OK(comet_open(dir, &cfg, &db));
    CHECK(comet_data_bytes(db) <= (int64_t)cfg.retention_max_total_bytes);
    comet_stream *a = open_stream(db, "parent", 0), *b = open_stream(db, "child", 0);
    comet_shard_stats sa, sb;
    CHECK_OK(comet_shard_stats_get(a, 0, COMET_STATS_ALL, &sa));
    CHECK_OK(comet_shard_stats_get(b, 0, COMET_STATS_ALL, &sb));
    CHECK(sa.next_entry == 6000 && sb.next_entry == 6000);
    CHECK(sa.retention_deleted_segments + sb.retention_deleted_segments > 0);
    CHECK_OK(comet_close(db));
    rm_tree(dir);
}

int main(void)
{
    RUN(test_config_check);
    RUN(test_round_trip_rotation_reopen);
    RUN(test_batches_and_framing);
    RUN(test_stream_names_and_counts);
    RUN(test_damage_in_the_middle_is_skipped);
    RUN(test_torn_tail_is_cut);
    RUN(test_missing_state_and_index_rebuilt);
    RUN(test_lock_holder_dies);
    RUN(test_nowait_appends_never_sleep);
    RUN(test_nowait_leaves_deleting_to_the_waiting_call);
    RUN(test_close_races_with_appends);
    RUN(test_background_thread_with_appends_and_reads);
    RUN(test_budget_across_processes);
    return 0;
}
