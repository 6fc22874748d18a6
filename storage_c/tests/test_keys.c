/* Idempotency keys (src/keys.c): a keyed ingest is stored once per key.
 *
 *   - a retry with the same key and body answers the first batch again and
 *     stores nothing; another body under the key is refused; a key past its
 *     window stores again; a reopened shard still knows its keys;
 *   - processes racing with the same keys store each batch once, and so do
 *     threads of one process while the flusher syncs the keys;
 *   - a shard remembers its last KEYS_CAPACITY keys;
 *   - the lock's holder dying between a key's record and its batch: the
 *     record is forgotten, the retry stores;
 *   - recovery: a keyed batch past the durable point whose record did not
 *     survive is cut, and a record whose batch did not survive is forgotten
 *     (its entry numbers go to the next batch, which its key must not name);
 *   - a crash at every system call of a run of keyed appends, each retried
 *     until it succeeds and all of them retried again after the crash: every
 *     key's batch is in the log exactly once. */
#include <pthread.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>

#include "util.h"

#define CAPACITY 65536u /* src/log/log.h KEYS_CAPACITY */
#define MAX_N 4000

static read_buf rb;

static comet_idempotency key_of(uint32_t k, uint32_t body, int64_t window_ms)
{
    comet_idempotency idem;
    memset(&idem, 0, sizeof idem);
    memcpy(idem.key, &k, sizeof k);
    idem.key[15] = 0x5a; /* not all zero */
    memcpy(idem.digest, &body, sizeof body);
    idem.window_ms = window_ms;
    return idem;
}

/* One keyed batch of two events naming the key: {"k":K,"i":0}\n{"k":K,"i":1}. */
static int64_t keyed(comet_stream *s, uint32_t k, uint32_t body, int64_t window_ms,
                     comet_ingest_result *res)
{
    char text[96];
    int n = snprintf(text, sizeof text, "{\"k\":%u,\"i\":0}\n{\"k\":%u,\"i\":1}\n", k, k);
    comet_idempotency idem = key_of(k, body, window_ms);
    comet_ingest_request req = {.body = text, .len = (size_t)n, .format = COMET_BODY_NDJSON,
                                .durability = COMET_DURABILITY_DEFAULT,
                                .mode = COMET_APPEND_WAIT, .idempotency = &idem};
    return comet_ingest(s, 0, &req, res);
}

static uint64_t next_entry(comet_stream *s)
{
    comet_shard_stats st;
    CHECK_OK(comet_shard_stats_get(s, 0, COMET_STATS_ALL, &st));
    return st.next_entry;
}

/* How many times each key's events are in the log (counts[k] += 1 per batch). */
static void count_keys(comet_stream *s, uint32_t *counts, uint32_t keys)
{
    memset(counts, 0, keys * sizeof *counts);
    comet_shard_stats st;
    CHECK_OK(comet_shard_stats_get(s, 0, COMET_STATS_ALL, &st));
    uint64_t from = st.first_entry;
    while (from < st.next_entry) {
        CHECK_OK(read_some(s, 0, from, 1024, &rb, 0));
        CHECK(rb.res.count > 0);
        for (uint32_t i = 0; i < rb.res.count; i++) {
            unsigned k, idx;
            CHECK(sscanf((const char *)rb.data + rb.offsets[i], "{\"k\":%u,\"i\":%u}", &k, &idx) == 2);
            CHECK(k < keys);
            if (idx == 0)
                counts[k]++;
        }
        from = rb.res.next_entry;
    }
    comet_verify_report vr;
    CHECK_OK(comet_verify_shard(s, 0, &vr));
    CHECK(vr.bad_entries == 0);
}

static void test_replay_reuse_window(void)
{
    char *dir = scratch_dir();
    comet_db *db = open_db(dir, 1 << 20);
    comet_stream *s = open_stream(db, "k", 1);
    comet_ingest_result res;
    CHECK(keyed(s, 1, 100, 60000, &res) == 0 && res.count == 2 && !res.replayed);
    CHECK(keyed(s, 2, 100, 60000, &res) == 2 && !res.replayed);
    CHECK(keyed(s, 1, 100, 60000, &res) == 0 && res.count == 2 && res.replayed);
    CHECK(next_entry(s) == 4);
    CHECK(keyed(s, 1, 101, 60000, &res) == COMET_E_KEY_REUSED && res.count == 0);
    CHECK(strstr(comet_last_error(), "same body") != NULL);
    CHECK(next_entry(s) == 4);
    comet_shard_stats st;
    CHECK_OK(comet_shard_stats_get(s, 0, COMET_STATS_ALL, &st));
    CHECK(st.key_replays == 1);
    /* past its window a key stores again */
    CHECK(keyed(s, 3, 100, 1, &res) == 4 && !res.replayed);
    struct timespec ts = {0, 5 * 1000000};
    nanosleep(&ts, NULL);
    CHECK(keyed(s, 3, 100, 1, &res) == 6 && !res.replayed);
    comet_close(db);
    /* reopened: the keys are still there */
    db = open_db(dir, 1 << 20);
    s = open_stream(db, "k", 1);
    CHECK(keyed(s, 2, 100, 60000, &res) == 2 && res.replayed);
    CHECK(next_entry(s) == 8);
    comet_idempotency bad = key_of(9, 9, 0);
    comet_ingest_request req = {.body = "1", .len = 1, .format = COMET_BODY_JSON,
                                .durability = -1, .idempotency = &bad};
    CHECK(comet_ingest(s, 0, &req, &res) == COMET_E_INVALID); /* a window must be positive */
    comet_close(db);
    rm_tree(dir);
}

#define RACERS 4
#define RACE_KEYS 300

static void test_processes_race(void)
{
    char *dir = scratch_dir();
    comet_db *db = open_db(dir, 1 << 20);
    open_stream(db, "k", 1);
    comet_close(db);
    pid_t pids[RACERS];
    for (int p = 0; p < RACERS; p++) {
        pids[p] = fork();
        CHECK(pids[p] >= 0);
        if (pids[p] == 0) {
            comet_db *cdb = open_db(dir, 1 << 20);
            comet_stream *cs = open_stream(cdb, "k", 1);
            comet_ingest_result r;
            for (uint32_t k = 0; k < RACE_KEYS; k++)
                if (keyed(cs, (k * 7 + (uint32_t)p) % RACE_KEYS, 1, 60000, &r) < 0)
                    _exit(2);
            comet_close(cdb);
            _exit(0);
        }
    }
    for (int p = 0; p < RACERS; p++) {
        int status;
        CHECK(waitpid(pids[p], &status, 0) == pids[p] && WIFEXITED(status) &&
              WEXITSTATUS(status) == 0);
    }
    db = open_db(dir, 1 << 20);
    comet_stream *s = open_stream(db, "k", 1);
    uint32_t counts[RACE_KEYS];
    count_keys(s, counts, RACE_KEYS);
    for (uint32_t k = 0; k < RACE_KEYS; k++)
        CHECK(counts[k] == 1);
    CHECK(next_entry(s) == 2 * RACE_KEYS);
    comet_close(db);
    rm_tree(dir);
}

typedef struct racer {
    comet_stream *s;
    uint32_t offset;
    int failed;
} racer;

static void *race_keys(void *arg)
{
    racer *r = arg;
    comet_ingest_result res;
    for (uint32_t k = 0; k < RACE_KEYS; k++)
        if (keyed(r->s, (k * 7 + r->offset) % RACE_KEYS, 1, 60000, &res) < 0)
            r->failed = 1;
    return NULL;
}

static void test_threads_race(void)
{
    char *dir = scratch_dir();
    comet_config cfg;
    comet_config_default(&cfg);
    cfg.segment_bytes = 1 << 20;
    cfg.fsync_interval_ms = 1; /* the flusher syncs the keys while they are written */
    comet_db *db;
    CHECK_OK(comet_open(dir, &cfg, &db));
    comet_stream *s = open_stream(db, "k", 1);
    pthread_t t[RACERS];
    racer r[RACERS];
    for (int i = 0; i < RACERS; i++) {
        r[i] = (racer){s, (uint32_t)i, 0};
        CHECK(pthread_create(&t[i], NULL, race_keys, &r[i]) == 0);
    }
    for (int i = 0; i < RACERS; i++) {
        CHECK(pthread_join(t[i], NULL) == 0);
        CHECK(!r[i].failed);
    }
    uint32_t counts[RACE_KEYS];
    count_keys(s, counts, RACE_KEYS);
    for (uint32_t k = 0; k < RACE_KEYS; k++)
        CHECK(counts[k] == 1);
    comet_close(db);
    rm_tree(dir);
}

typedef struct creator {
    comet_stream *s;
    uint32_t shard;
    pthread_barrier_t *start;
    int64_t rc;
} creator;

static void *first_key_of_shard(void *arg)
{
    creator *c = arg;
    comet_idempotency idem = key_of(c->shard, 1, 60000);
    comet_ingest_request req = {.body = "{}", .len = 2, .format = COMET_BODY_JSON,
                                .durability = COMET_DURABILITY_DEFAULT, .idempotency = &idem};
    comet_ingest_result res;
    pthread_barrier_wait(c->start);
    c->rc = comet_ingest(c->s, c->shard, &req, &res);
    return NULL;
}

/* Threads create the keys files of several shards at once: each file is its
 * own shard's (a buffer shared by the creators once gave one shard another's
 * header, found by the gateway's power-cut test). */
static void test_shards_create_their_keys_at_once(void)
{
    enum { SHARDS = 8 };
    char *dir = scratch_dir();
    comet_db *db = open_db(dir, 1 << 20);
    comet_stream *s = open_stream(db, "k", SHARDS);
    pthread_barrier_t start;
    CHECK(pthread_barrier_init(&start, NULL, SHARDS) == 0);
    pthread_t t[SHARDS];
    creator c[SHARDS];
    for (uint32_t i = 0; i < SHARDS; i++) {
        c[i] = (creator){s, i, &start, -1};
        CHECK(pthread_create(&t[i], NULL, first_key_of_shard, &c[i]) == 0);
    }
    for (uint32_t i = 0; i < SHARDS; i++) {
        CHECK(pthread_join(t[i], NULL) == 0);
        CHECK(c[i].rc == 0);
    }
    pthread_barrier_destroy(&start);
    comet_close(db);
    db = open_db(dir, 1 << 20); /* a new process's view: each file's header is read */
    s = open_stream(db, "k", SHARDS);
    for (uint32_t i = 0; i < SHARDS; i++) {
        comet_idempotency idem = key_of(i, 1, 60000);
        comet_ingest_request req = {.body = "{}", .len = 2, .format = COMET_BODY_JSON,
                                    .durability = COMET_DURABILITY_DEFAULT, .idempotency = &idem};
        comet_ingest_result res;
        CHECK(comet_ingest(s, i, &req, &res) == 0 && res.replayed);
    }
    comet_close(db);
    rm_tree(dir);
}

static void test_ring_remembers_the_last_keys(void)
{
    char *dir = scratch_dir();
    comet_db *db = open_db(dir, 64 << 20);
    comet_stream *s = open_stream(db, "k", 1);
    comet_ingest_result res;
    for (uint32_t k = 0; k < CAPACITY + 10; k++)
        CHECK(keyed(s, k, 1, 3600000, &res) == 2 * (int64_t)k);
    uint64_t next = next_entry(s);
    CHECK(keyed(s, CAPACITY + 5, 1, 3600000, &res) == 2 * (int64_t)(CAPACITY + 5) && res.replayed);
    CHECK(keyed(s, 11, 1, 3600000, &res) == 22 && res.replayed);
    CHECK(keyed(s, 3, 1, 3600000, &res) == (int64_t)next && !res.replayed); /* overwritten */
    comet_close(db);
    rm_tree(dir);
}

/* A child appends keyed batches (durability none: nothing synced) and dies
 * as kill -9 would leave it; the page cache keeps what it wrote. */
static void crash_after_keyed(const char *dir, uint32_t from, uint32_t to)
{
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        comet_config cfg;
        comet_config_default(&cfg);
        cfg.segment_bytes = 1 << 20;
        cfg.durability = COMET_DURABILITY_NONE;
        cfg.flags |= COMET_OPEN_NO_FLUSHER;
        comet_db *cdb;
        if (comet_open(dir, &cfg, &cdb))
            _exit(2);
        comet_stream *cs = open_stream(cdb, "k", 1);
        comet_ingest_result r;
        for (uint32_t k = from; k < to; k++)
            if (keyed(cs, k, 1, 60000, &r) < 0)
                _exit(3);
        _exit(0);
    }
    int status;
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

static void test_recovery_keeps_keys_and_batches_together(void)
{
    char *dir = scratch_dir();
    comet_db *db = open_db(dir, 1 << 20);
    comet_stream *s = open_stream(db, "k", 1);
    comet_ingest_result res;
    for (uint32_t k = 0; k < 5; k++) /* entries 0-9, synced by the close */
        CHECK(keyed(s, k, 1, 60000, &res) >= 0);
    comet_close(db);
    crash_after_keyed(dir, 5, 8); /* entries 10-15, past the durable point */

    /* The record of key 6 (ring slot 6) never reached the disk: its batch
     * (entries 12-13) ends the log, and key 7's batch after it goes too. */
    char path[600];
    snprintf(path, sizeof path, "%s/k/shard-0000/keys", dir);
    uint8_t zeros[64] = {0};
    rewrite_file(path, 4096 + 6 * 64, zeros, sizeof zeros);
    db = open_db(dir, 1 << 20);
    s = open_stream(db, "k", 1);
    CHECK(next_entry(s) == 12);
    CHECK(keyed(s, 5, 1, 60000, &res) == 10 && res.replayed); /* its record and batch survived */
    /* key 7's record named entries 14-15, which are gone: forgotten, so the
     * next batch - key 20 at entries 12-13, then key 21 at 14-15 - is not
     * taken for key 7's */
    CHECK(keyed(s, 20, 1, 60000, &res) == 12 && !res.replayed);
    CHECK(keyed(s, 21, 1, 60000, &res) == 14 && !res.replayed);
    CHECK(keyed(s, 7, 1, 60000, &res) == 16 && !res.replayed);
    CHECK(keyed(s, 6, 1, 60000, &res) == 18 && !res.replayed);
    uint32_t counts[22];
    count_keys(s, counts, 22);
    for (uint32_t k = 0; k < 8; k++)
        CHECK(counts[k] == 1);
    comet_close(db);
    rm_tree(dir);
}

/* The append lock's holder dies after it recorded a key, before any entry of
 * the batch (the cut point between them): the next process to take the lock
 * repairs the shard and forgets the record, so that the numbers it named go
 * to the next batch and the retry of the key stores its batch anew - never a
 * replay answering with another batch's entries (found by the kill -9 test of
 * the gateway's client). */
static void test_holder_dies_between_key_and_batch(void)
{
    char *dir = scratch_dir();
    comet_db *db = open_db(dir, 1 << 20);
    comet_stream *s = open_stream(db, "k", 1);
    comet_ingest_result res;
    CHECK(keyed(s, 1, 1, 60000, &res) == 0);
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        comet_cut_arm("append.keyed", 1);
        keyed(s, 2, 1, 60000, &res); /* dies holding the lock: the parent's too (shared) */
        _exit(0);
    }
    int status;
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 78);
    CHECK(keyed(s, 3, 1, 60000, &res) == 2 && !res.replayed); /* takes the numbers key 2 named */
    CHECK(keyed(s, 2, 1, 60000, &res) == 4 && !res.replayed); /* stored anew, not key 3's */
    CHECK(keyed(s, 2, 1, 60000, &res) == 4 && res.replayed);
    uint32_t counts[4];
    count_keys(s, counts, 4);
    CHECK(counts[1] == 1 && counts[2] == 1 && counts[3] == 1);
    comet_close(db);
    rm_tree(dir);
}

#define CRASH_KEYS 12

static void test_crash_at_every_call(void)
{
    long crashes = 0, n = 1;
    for (; n <= MAX_N; n++) {
        char *dir = scratch_dir();
        comet_db *db = open_db(dir, 64 << 10); /* rotations within the run */
        comet_stream *s = open_stream(db, "k", 1);
        comet_ingest_result res;
        for (uint32_t k = 0; k < 5; k++)
            CHECK(keyed(s, k, 1, 60000, &res) >= 0);
        comet_close(db);
        fflush(NULL);
        pid_t pid = fork();
        CHECK(pid >= 0);
        if (pid == 0) {
            fault_once(COMET_FAULT_ALL, n, COMET_FAULT_CRASH);
            comet_config cfg;
            comet_config_default(&cfg);
            cfg.segment_bytes = 64 << 10;
            cfg.flags |= COMET_OPEN_NO_FLUSHER;
            cfg.durability = COMET_DURABILITY_ALWAYS;
            comet_db *cdb;
            if (comet_open(dir, &cfg, &cdb) == 0) {
                comet_stream *cs = NULL;
                comet_ingest_result r;
                if (comet_stream_open(cdb, "k", 1, 1, 0, &cs) == 0)
                    for (uint32_t k = 0; k < CRASH_KEYS; k++)
                        for (int tries = 0; tries < 3 && keyed(cs, k, 1, 60000, &r) < 0; tries++)
                            ;
                comet_close(cdb);
            }
            _exit(0);
        }
        int status;
        CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status));
        int crashed = WEXITSTATUS(status) == COMET_FAULT_CRASH_EXIT;
        CHECK(crashed || WEXITSTATUS(status) == 0);
        crashes += crashed;
        /* the client retries every batch: each key's batch is there once */
        db = open_db(dir, 64 << 10);
        s = open_stream(db, "k", 1);
        for (uint32_t k = 0; k < CRASH_KEYS; k++)
            CHECK(keyed(s, k, 1, 60000, &res) >= 0);
        uint32_t counts[CRASH_KEYS];
        count_keys(s, counts, CRASH_KEYS);
        for (uint32_t k = 0; k < CRASH_KEYS; k++)
            CHECK(counts[k] == 1);
        comet_close(db);
        rm_tree(dir);
        if (!crashed)
            break;
    }
    CHECK(n <= MAX_N && crashes > 100);
    printf("    %ld crash points, every key's batch stored once\n", crashes);
}

int main(void)
{
    RUN(test_replay_reuse_window);
    RUN(test_processes_race);
    RUN(test_threads_race);
    RUN(test_shards_create_their_keys_at_once);
    RUN(test_ring_remembers_the_last_keys);
    RUN(test_recovery_keeps_keys_and_batches_together);
    RUN(test_holder_dies_between_key_and_batch);
    RUN(test_crash_at_every_call);
    return 0;
}
