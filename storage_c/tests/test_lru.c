/* test_lru.c - a bounded number of open shards (lru.c): shards are closed to
 * make room and reopened with everything they held; closing syncs what was
 * appended; a budget of shards all in use refuses clearly; threads racing
 * opens, closes, appends, reads and group acks under TSan. */
#include <dirent.h>
#include <sys/stat.h>
#include <pthread.h>

#include "log/log.h"
#include "util.h"

static comet_db *open_budget(const char *dir, uint32_t budget, int flusher)
{
    comet_config cfg;
    comet_config_default(&cfg);
    cfg.segment_bytes = 1 << 20;
    cfg.max_open_shards = budget;
    cfg.fsync_interval_ms = 2;
    if (!flusher)
        cfg.flags |= COMET_OPEN_NO_FLUSHER;
    comet_db *db = NULL;
    CHECK_OK(comet_open(dir, &cfg, &db));
    return db;
}

static int open_fds(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    CHECK(d != NULL);
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

static uint32_t open_count(comet_db *db)
{
    pthread_mutex_lock(&db->lru_lock);
    uint32_t n = db->open_shards;
    pthread_mutex_unlock(&db->lru_lock);
    return n;
}

/* Entry i of shard k of stream j says so: "j.k.i". */
static int payload(char *buf, size_t cap, int j, int k, int i)
{
    return snprintf(buf, cap, "%d.%d.%d", j, k, i);
}

static void check_shard(comet_stream *s, int j, int k, int count)
{
    uint8_t data[4096];
    int32_t offsets[65];
    int64_t entries[64], ts[64];
    comet_read_request req = {0, 64, 0, sizeof data, data, sizeof data, offsets, entries, ts};
    comet_read_result res;
    CHECK_OK(comet_read(s, (uint32_t)k, &req, &res));
    CHECK((int)res.count == count);
    for (int i = 0; i < count; i++) {
        char want[32];
        int n = payload(want, sizeof want, j, k, i);
        CHECK(offsets[i + 1] - offsets[i] == n);
        CHECK(memcmp(data + offsets[i], want, (size_t)n) == 0);
    }
}

static void test_budget_bounds_open_shards(void)
{
    char *dir = scratch_dir();
    int base = open_fds();
    comet_db *db = open_budget(dir, 4, 0);
    comet_stream *s[10];
    for (int j = 0; j < 10; j++) {
        char name[16];
        snprintf(name, sizeof name, "s%d", j);
        s[j] = open_stream(db, name, 4);
    }
    int most = 0;
    for (int round = 0; round < 3; round++)
        for (int j = 0; j < 10; j++)
            for (int k = 0; k < 4; k++) {
                char buf[32];
                int n = payload(buf, sizeof buf, j, k, round);
                CHECK(comet_append(s[j], (uint32_t)k, buf, (uint32_t)n, 0, -1, COMET_APPEND_WAIT) ==
                      round);
                CHECK(open_count(db) <= 4);
                if (open_fds() - base > most)
                    most = open_fds() - base;
            }
    /* 4 shards: state, offsets and one segment each, plus the db's own */
    printf("    40 shards written through a budget of 4: at most %d descriptors open\n", most);
    CHECK(most <= 4 * 3 + 4);
    for (int j = 0; j < 10; j++)
        for (int k = 0; k < 4; k++)
            check_shard(s[j], j, k, 3);
    CHECK(open_count(db) <= 4);
    CHECK_OK(comet_close(db));
    /* everything appended survives a fresh open of every shard */
    db = open_budget(dir, 0, 0);
    for (int j = 0; j < 10; j++) {
        char name[16];
        snprintf(name, sizeof name, "s%d", j);
        comet_stream *t = open_stream(db, name, 4);
        for (int k = 0; k < 4; k++)
            check_shard(t, j, k, 3);
    }
    CHECK_OK(comet_close(db));
    rm_tree(dir);
}

static void test_closing_syncs_what_was_appended(void)
{
    char *dir = scratch_dir();
    comet_db *db = open_budget(dir, 2, 0);
    comet_stream *s = open_stream(db, "a", 4);
    CHECK(comet_append(s, 0, "x", 1, 0, COMET_DURABILITY_INTERVAL, COMET_APPEND_WAIT) == 0);
    shard *sh = atomic_load(&s->shards[0]);
    CHECK(atomic_load(&sh->st->durable_entry) == 0); /* no flusher: not synced yet */
    CHECK(comet_append(s, 1, "y", 1, 0, -1, COMET_APPEND_WAIT) == 0);
    CHECK(comet_append(s, 2, "z", 1, 0, -1, COMET_APPEND_WAIT) == 0); /* closes a dirty one */
    CHECK(comet_append(s, 3, "w", 1, 0, -1, COMET_APPEND_WAIT) == 0);
    CHECK(atomic_load(&sh->open) == SHARD_CLOSED);
    comet_shard_stats st;
    CHECK_OK(comet_shard_stats_get(s, 0, COMET_STATS_ALL, &st));
    CHECK(st.next_entry == 1 && st.durable_entry == 1);
    CHECK_OK(comet_close(db));
    rm_tree(dir);
}

static void test_all_in_use_is_refused(void)
{
    char *dir = scratch_dir();
    comet_db *db = open_budget(dir, 2, 0);
    comet_stream *s = open_stream(db, "busy", 4);
    shard *a, *b;
    CHECK_OK(shard_acquire(s, 0, &a));
    CHECK_OK(shard_acquire(s, 1, &b));
    CHECK(comet_append(s, 2, "x", 1, 0, -1, COMET_APPEND_WAIT) == COMET_E_TOO_MANY_OPEN);
    CHECK(strstr(comet_last_error(), "max_open_shards 2") != NULL);
    CHECK(comet_append(s, 0, "x", 1, 0, -1, COMET_APPEND_WAIT) == 0); /* open ones still work */
    shard_leave(b);
    CHECK(comet_append(s, 2, "x", 1, 0, -1, COMET_APPEND_WAIT) == 0);
    CHECK(atomic_load(&b->open) == SHARD_CLOSED);
    shard_leave(a);
    CHECK_OK(comet_close(db));
    rm_tree(dir);
}

static void test_stats_read_closed_shards_without_opening_them(void)
{
    char *dir = scratch_dir();
    comet_db *db = open_budget(dir, 2, 0);
    comet_stream *s = open_stream(db, "st", 8);
    comet_shard_stats open_stats[4];
    for (int k = 0; k < 4; k++) {
        for (int i = 0; i <= k; i++)
            CHECK(comet_append(s, (uint32_t)k, "abc", 3, 0, -1, COMET_APPEND_WAIT) == i);
        CHECK_OK(comet_shard_stats_get(s, (uint32_t)k, COMET_STATS_ALL, &open_stats[k]));
    }
    CHECK(atomic_load(&atomic_load(&s->shards[0])->open) == SHARD_CLOSED);
    int fds = open_fds();
    for (int k = 0; k < 8; k++) {
        comet_shard_stats st;
        CHECK_OK(comet_shard_stats_get(s, (uint32_t)k, COMET_STATS_ALL, &st));
        shard *sh = atomic_load(&s->shards[k]);
        CHECK(k >= 4 ? sh == NULL : sh != NULL);
        if (k >= 4) { /* never written: zeros, and nothing created for it */
            char path[512];
            struct stat sb;
            snprintf(path, sizeof path, "%s/st/shard-%04d", dir, k);
            CHECK(st.next_entry == 0 && st.segments == 0 && stat(path, &sb) != 0);
            continue;
        }
        CHECK(st.next_entry == (uint64_t)k + 1 && st.segments == 1);
        CHECK(st.disk_bytes == open_stats[k].disk_bytes && st.disk_bytes > 0);
        CHECK(st.oldest_timestamp == open_stats[k].oldest_timestamp && st.oldest_timestamp > 0);
        CHECK(st.newest_timestamp == open_stats[k].newest_timestamp);
        CHECK(st.appended_entries == (uint64_t)k + 1);
    }
    for (int k = 0; k < 4; k++) { /* without the oldest timestamp (open or closed): the rest */
        comet_shard_stats st;
        CHECK_OK(comet_shard_stats_get(s, (uint32_t)k, 0, &st));
        CHECK(st.oldest_timestamp == 0 && st.next_entry == open_stats[k].next_entry);
        CHECK(st.first_entry == open_stats[k].first_entry && st.segments == 1);
        CHECK(st.disk_bytes == open_stats[k].disk_bytes);
        CHECK(st.newest_timestamp == open_stats[k].newest_timestamp);
    }
    CHECK(open_count(db) == 2 && open_fds() == fds);
    CHECK_OK(comet_close(db));
    rm_tree(dir);
}

/* ---- threads ---------------------------------------------------------------- */

#define STREAMS 4
#define SHARDS 8
#define PER_THREAD 600
#define THREADS 4

typedef struct {
    comet_stream **s;
    int id;
} worker_arg;

static void *worker(void *p)
{
    worker_arg *a = p;
    unsigned seed = (unsigned)a->id * 7919u + 1;
    for (int i = 0; i < PER_THREAD; i++) {
        int j = (int)(rand_r(&seed) % STREAMS), k = (int)(rand_r(&seed) % SHARDS);
        int what = (int)(rand_r(&seed) % 4);
        if (what < 2) {
            int64_t rc;
            do /* every shard may be in use for a moment: the caller retries */
                rc = comet_append(a->s[j], (uint32_t)k, "e", 1, 0, -1, COMET_APPEND_WAIT);
            while (rc == COMET_E_TOO_MANY_OPEN);
            CHECK(rc >= 0);
        } else if (what == 2) {
            uint8_t data[256];
            int32_t offsets[9];
            int64_t entries[8], ts[8];
            comet_read_request req = {0, 8, 0, sizeof data, data, sizeof data, offsets, entries, ts};
            comet_read_result res;
            int rc;
            do
                rc = comet_read(a->s[j], (uint32_t)k, &req, &res);
            while (rc == COMET_E_TOO_MANY_OPEN);
            CHECK_OK(rc);
        } else {
            comet_group *g;
            int rc;
            do
                rc = comet_group_open(a->s[j], (uint32_t)k, "g", 1, 1, &g);
            while (rc == COMET_E_TOO_MANY_OPEN);
            CHECK_OK(rc);
            int64_t r;
            do
                r = comet_group_ack(g, 0);
            while (r == COMET_E_TOO_MANY_OPEN);
            CHECK(r >= 0);
        }
    }
    return NULL;
}

static void test_threads_race_opens_and_closes(void)
{
    char *dir = scratch_dir();
    comet_db *db = open_budget(dir, 4, 1);
    comet_stream *s[STREAMS];
    for (int j = 0; j < STREAMS; j++) {
        char name[16];
        snprintf(name, sizeof name, "t%d", j);
        s[j] = open_stream(db, name, SHARDS);
    }
    pthread_t t[THREADS];
    worker_arg args[THREADS];
    for (int i = 0; i < THREADS; i++) {
        args[i] = (worker_arg){s, i};
        CHECK(pthread_create(&t[i], NULL, worker, &args[i]) == 0);
    }
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    CHECK(open_count(db) <= 4 + THREADS); /* opens racing past a full budget: one each at most */
    uint64_t appended = 0;
    for (int j = 0; j < STREAMS; j++)
        for (int k = 0; k < SHARDS; k++) {
            comet_shard_stats st;
            CHECK_OK(comet_shard_stats_get(s[j], (uint32_t)k, COMET_STATS_ALL, &st));
            appended += st.next_entry;
        }
    CHECK_OK(comet_close(db));
    /* the same count after a fresh open: nothing appended was lost in a close */
    db = open_budget(dir, 0, 0);
    uint64_t again = 0;
    for (int j = 0; j < STREAMS; j++) {
        char name[16];
        snprintf(name, sizeof name, "t%d", j);
        comet_stream *u = open_stream(db, name, SHARDS);
        for (int k = 0; k < SHARDS; k++) {
            comet_shard_stats st;
            CHECK_OK(comet_shard_stats_get(u, (uint32_t)k, COMET_STATS_ALL, &st));
            again += st.next_entry;
            CHECK(st.durable_entry == st.next_entry);
        }
    }
    printf("    %llu entries appended by %d threads through a budget of 4\n",
           (unsigned long long)appended, THREADS);
    CHECK(appended == again && appended > 0);
    CHECK_OK(comet_close(db));
    rm_tree(dir);
}

/* Counts sync calls (msync, fdatasync, fsync) from now on without failing one. */
static void count_syncs(void)
{
    comet_fault_clear();
    comet_fault_rule r = {COMET_FAULT_SYNC, 1L << 40, 1, EIO};
    CHECK_OK(comet_fault_add(&r));
}

/* An open over a full budget of dirty shards neither syncs one in the
 * opener's path nor fails: it goes over the budget (a quarter at most) and
 * the flusher's pass, once it synced them, closes the least recently used
 * back down to the budget.  At the ceiling the opener syncs a victim itself. */
static void test_dirty_shards_are_left_to_the_flusher(void)
{
    char *dir = scratch_dir();
    comet_config cfg;
    comet_config_default(&cfg);
    cfg.segment_bytes = 1 << 20;
    cfg.max_open_shards = 8;
    cfg.fsync_interval_ms = 3600000; /* the flusher runs, but never by itself here */
    comet_db *db = NULL;
    CHECK_OK(comet_open(dir, &cfg, &db));
    comet_stream *s = open_stream(db, "dirty", 16);
    for (int k = 0; k < 8; k++) /* the budget, filled and synced */
        CHECK(comet_append(s, (uint32_t)k, "x", 1, 0, -1, COMET_APPEND_WAIT) == 0);
    CHECK_OK(comet_sync(s, -1));
    for (int k = 0; k < 8; k++) /* ... and dirty again */
        CHECK(comet_append(s, (uint32_t)k, "y", 1, 0, -1, COMET_APPEND_WAIT) == 1);
    count_syncs();
    for (int k = 8; k < 10; k++) /* over the budget, up to its ceiling of 10 */
        CHECK(comet_append(s, (uint32_t)k, "z", 1, 0, -1, COMET_APPEND_WAIT) == 0);
    long synced_by_openers = comet_fault_calls();
    CHECK(open_count(db) == 10);
    CHECK(comet_append(s, 10, "c", 1, 0, -1, COMET_APPEND_WAIT) == 0); /* at the ceiling */
    long at_ceiling = comet_fault_calls();
    comet_fault_clear();
    printf("    2 opens over a budget of 8 dirty shards: %ld sync calls; the 3rd (at the "
           "ceiling): %ld\n", synced_by_openers, at_ceiling - synced_by_openers);
    CHECK(synced_by_openers == 0);
    CHECK(at_ceiling > synced_by_openers); /* a victim synced, then closed */
    CHECK(open_count(db) == 10);
    lru_trim(db); /* all dirty: the pass has not synced them yet, nothing closes */
    CHECK(open_count(db) == 10);
    CHECK_OK(comet_sync(s, -1));
    lru_trim(db); /* what the flusher does after its pass */
    CHECK(open_count(db) == 8);
    for (int k = 0; k < 11; k++) {
        comet_shard_stats st;
        CHECK_OK(comet_shard_stats_get(s, (uint32_t)k, COMET_STATS_ALL, &st));
        CHECK(st.next_entry == (k < 8 ? 2u : 1u) && st.durable_entry == st.next_entry);
    }
    CHECK_OK(comet_close(db));
    rm_tree(dir);
}

/* Opening new shards makes no device flush; the first sync of one makes its
 * directory's name durable (an fsync of the stream's directory), once for
 * every shard directory opened before it. */
static void test_new_shards_open_without_a_sync(void)
{
    char *dir = scratch_dir();
    comet_db *db = open_budget(dir, 0, 0);
    comet_stream *s = open_stream(db, "fresh", 16);
    count_syncs();
    for (int k = 0; k < 16; k++)
        CHECK(comet_append(s, (uint32_t)k, "x", 1, 0, COMET_DURABILITY_INTERVAL,
                           COMET_APPEND_WAIT) == 0);
    long opening = comet_fault_calls();
    CHECK_OK(comet_sync(s, 0));
    long first = comet_fault_calls() - opening;
    CHECK_OK(comet_sync(s, 1));
    long second = comet_fault_calls() - opening - first;
    comet_fault_clear();
    printf("    16 new shards opened and appended to: %ld sync calls; the first shard's sync: "
           "%ld, the second's: %ld\n", opening, first, second);
    CHECK(opening == 0);
    CHECK(first == second + 1); /* the stream's directory, once */
    /* That fsync is part of the sync: failing it fails the sync, never
     * silently (the shard refuses until reopened, as for its segments). */
    int seen = 0;
    for (long nth = 1; nth <= 8 && !seen; nth++) {
        char name[32];
        snprintf(name, sizeof name, "fails%d", (int)nth);
        comet_stream *t = open_stream(db, name, 1);
        CHECK(comet_append(t, 0, "x", 1, 0, COMET_DURABILITY_INTERVAL, COMET_APPEND_WAIT) == 0);
        fault_once(COMET_FAULT_SYNC, nth, EIO);
        int rc = comet_sync(t, 0);
        comet_fault_clear();
        CHECK(rc == 0 || rc == COMET_E_SYNC_FAILED);
        if (rc && strstr(comet_last_error(), "fsync of the stream directory")) {
            seen = 1;
            CHECK(comet_append(t, 0, "y", 1, 0, -1, COMET_APPEND_WAIT) == COMET_E_SYNC_FAILED);
        }
    }
    CHECK(seen);
    CHECK_OK(comet_close(db));
    rm_tree(dir);
}

int main(void)
{
    RUN(test_budget_bounds_open_shards);
    RUN(test_closing_syncs_what_was_appended);
    RUN(test_all_in_use_is_refused);
    RUN(test_stats_read_closed_shards_without_opening_them);
    RUN(test_threads_race_opens_and_closes);
    RUN(test_dirty_shards_are_left_to_the_flusher);
    RUN(test_new_shards_open_without_a_sync);
    return 0;
}
