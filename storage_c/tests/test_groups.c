/* Consumer groups and retention through the C API (under the sanitizers). */
#include <sys/wait.h>
#include <time.h>

#include "util.h"

static read_buf rb;

static comet_db *open_cfg(const char *dir, comet_config *cfg)
{
    comet_db *db = NULL;
    CHECK_OK(comet_open(dir, cfg, &db));
    return db;
}

static void fill(comet_stream *s, uint32_t shard, int n, uint32_t size)
{
    static uint8_t buf[4096];
    for (int i = 0; i < n; i++)
        CHECK_OK(comet_append(s, shard, buf, size, 0, -1, COMET_APPEND_WAIT));
}

static void test_offsets(void)
{
    char *dir = scratch_dir();
    comet_db *db = open_db(dir, 1 << 20);
    comet_stream *s = open_stream(db, "g", 2);
    fill(s, 0, 10, 10);
    comet_group *g, *h;
    CHECK_OK(comet_group_open(s, 0, "readers", 7, 1, &g));
    CHECK(comet_group_offset(g) == 0);
    CHECK(comet_group_ack(g, 4) == 5);
    CHECK(comet_group_ack(g, 2) == 5);   /* never backwards */
    CHECK(comet_group_ack(g, 100) == 10); /* clamped to the committed end */
    CHECK(comet_group_lag(g) == 0);
    CHECK(comet_group_reset(g, -3) == 7);
    CHECK(comet_group_lag(g) == 3);
    CHECK(comet_group_ack_range(g, 9, 8) == COMET_E_INVALID);
    CHECK(comet_group_ack_range(g, 8, 9) == COMET_E_ACK_GAP);
    CHECK(comet_group_ack_range(g, 7, 8) == 9);
    CHECK_OK(comet_group_open(s, 0, "other", 5, 1, &h));
    CHECK(comet_group_offset(h) == 0); /* groups are independent */
    CHECK(comet_group_open(s, 0, "missing", 7, 0, &h) == COMET_E_NO_GROUP);
    char name[64];
    int registered = 2;
    for (int i = 0; i < 600; i++) {
        int len = snprintf(name, sizeof name, "group-%03d", i);
        int rc = comet_group_open(s, 1, name, (size_t)len, 1, &h);
        if (i < 512)
            CHECK_OK(rc);
        else
            CHECK(rc == COMET_E_TOO_MANY_GROUPS);
    }
    /* bad names are refused before a slot is taken */
    char long_name[60];
    memset(long_name, 'x', sizeof long_name);
    CHECK(comet_group_open(s, 0, long_name, 60, 1, &h) == COMET_E_GROUP_NAME);
    CHECK(comet_group_open(s, 0, long_name, 48, 1, &h) == COMET_E_GROUP_NAME);
    CHECK(comet_group_open(s, 0, "a/b", 3, 1, &h) == COMET_E_GROUP_NAME);
    CHECK(comet_group_open(s, 0, "", 0, 1, &h) == COMET_E_GROUP_NAME);
    CHECK_OK(comet_group_open(s, 0, long_name, 47, 1, &h));
    CHECK(comet_group_list(s, 0, NULL, 0) == registered + 1);
    comet_group *other;
    CHECK_OK(comet_group_open(s, 0, "other", 5, 0, &other));
    CHECK_OK(comet_group_delete(s, "other", 5));
    CHECK(comet_group_ack(other, 1) == COMET_E_NO_GROUP); /* a stale handle says so */
    CHECK(comet_group_open(s, 0, "other", 5, 0, &other) == COMET_E_NO_GROUP);
    CHECK(comet_group_list(s, 0, NULL, 0) == registered);
    comet_close(db);
    db = open_db(dir, 1 << 20);
    s = open_stream(db, "g", 2);
    CHECK_OK(comet_group_open(s, 0, "readers", 7, 0, &g));
    CHECK(comet_group_offset(g) == 9); /* survives the reopen */
    comet_close(db);
    rm_tree(dir);
}

/* A shipper's delivery counters (comet_group_count), the timestamp of the
 * entry at an offset, and what forced retention lost. */
static void test_delivery_counters_and_backlog(void)
{
    char *dir = scratch_dir();
    comet_config cfg;
    comet_config_default(&cfg);
    cfg.segment_bytes = 64 << 10;
    cfg.flags |= COMET_OPEN_NO_FLUSHER;
    cfg.retention_max_age_ms = 1;
    cfg.retention_force_delete_after_ms = 1;
    comet_db *db = open_cfg(dir, &cfg);
    comet_stream *s = open_stream(db, "d", 1);
    comet_group *g;
    CHECK_OK(comet_group_open(s, 0, "ship", 4, 1, &g));
    CHECK(comet_entry_timestamp(s, 0, 0) == 0); /* no such entry yet */
    fill(s, 0, 100, 4000);
    int64_t first_ts = comet_entry_timestamp(s, 0, 0);
    CHECK(first_ts > 0 && comet_entry_timestamp(s, 0, 99) >= first_ts);
    CHECK(comet_entry_timestamp(s, 0, 100) == 0);
    CHECK_OK(comet_group_count(g, 10, 2, 0));
    CHECK_OK(comet_group_count(g, 5, 0, 3));
    comet_group_info info[4];
    CHECK(comet_group_list(s, 0, info, 4) == 1);
    CHECK(info[0].delivered == 15 && info[0].retries == 2 && info[0].failed == 3);
    CHECK(info[0].last_delivery_ns > 0);
    CHECK_OK(comet_group_count(g, 0, 1, 0)); /* a retry alone does not stamp a delivery */
    CHECK(comet_group_list(s, 0, info, 4) == 1 && info[0].retries == 3);
    /* forced retention deletes what the group did not take: counted for this process */
    CHECK(comet_retention_lost(db) == 0);
    struct timespec pause = {0, 5 * 1000 * 1000};
    nanosleep(&pause, NULL);
    comet_retention_report rep;
    CHECK_OK(comet_run_retention(db, &rep));
    CHECK(rep.lost_entries > 0 && comet_retention_lost(db) == rep.lost_entries);
    /* an offset below the first stored entry: the oldest stored entry's time */
    CHECK(comet_entry_timestamp(s, 0, 0) >= first_ts);
    CHECK(comet_retention_lost(NULL) == 0);
    /* a deleted and registered-again group starts from zero counters */
    CHECK_OK(comet_group_delete(s, "ship", 4));
    CHECK(comet_group_count(g, 1, 0, 0) == COMET_E_NO_GROUP);
    CHECK_OK(comet_group_open(s, 0, "ship", 4, 1, &g));
    CHECK(comet_group_list(s, 0, info, 4) == 1 && info[0].delivered == 0 && info[0].retries == 0);
    comet_close(db);
    rm_tree(dir);
}

/* The shippers' cut points, reached from above the core: the same arming,
 * the same death. */
static void test_cut_points_reached_from_above(void)
{
    CHECK(comet_cut_reached("no.such.point") == COMET_E_INVALID);
    CHECK(comet_cut_reached(NULL) == COMET_E_INVALID);
    CHECK(comet_cut_reached("ship.acked") == 0); /* not armed: nothing happens */
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        comet_cut_arm("ship.delivered", 2);
        comet_cut_reached("ship.delivered");
        comet_cut_reached("ship.acked");
        comet_cut_reached("ship.delivered"); /* the 2nd hit of the armed point */
        _exit(0);
    }
    int status;
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == COMET_CUT_EXIT);
}

static void test_retention_and_budget(void)
{
    char *dir = scratch_dir();
    comet_config cfg;
    comet_config_default(&cfg);
    cfg.segment_bytes = 64 << 10;
    cfg.flags |= COMET_OPEN_NO_FLUSHER;
    cfg.retention_max_total_bytes = 8 * (64 << 10) + 8 * 4096;
    comet_db *db = open_cfg(dir, &cfg);
    comet_stream *s = open_stream(db, "r", 1);
    comet_group *g;
    CHECK_OK(comet_group_open(s, 0, "slow", 4, 1, &g));
    int64_t rc = 0;
    int appended = 0;
    static uint8_t buf[4000];
    while ((rc = comet_append(s, 0, buf, sizeof buf, 0, -1, COMET_APPEND_WAIT)) >= 0)
        appended++;
    CHECK(rc == COMET_E_STORAGE_FULL);
    CHECK(appended > 50);
    /* the group acks everything: retention may now delete, appends go on */
    CHECK(comet_group_ack(g, (uint64_t)appended - 1) == appended);
    CHECK_OK(comet_append(s, 0, buf, sizeof buf, 0, -1, COMET_APPEND_WAIT));
    comet_shard_stats st;
    CHECK_OK(comet_shard_stats_get(s, 0, COMET_STATS_ALL, &st));
    CHECK(st.retention_deleted_segments > 0 && st.first_entry > 0);
    /* a reader from 0 resumes at the first surviving entry and says so */
    CHECK_OK(read_some(s, 0, 0, 10, &rb, 0));
    CHECK(rb.res.count > 0 && (uint64_t)rb.entries[0] == st.first_entry);
    CHECK(rb.res.skipped == st.first_entry);
    comet_retention_report rep;
    CHECK_OK(comet_run_retention(db, &rep));
    comet_close(db);
    rm_tree(dir);
}

int main(void)
{
    RUN(test_offsets);
    RUN(test_delivery_counters_and_backlog);
    RUN(test_cut_points_reached_from_above);
    RUN(test_retention_and_budget);
    return 0;
}
