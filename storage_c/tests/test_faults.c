/* Injected faults (src/sys.h), in the way SQLite tests itself: a scenario
 * that opens a data directory, creates a stream, appends through several
 * rotations, acknowledges a consumer group, syncs, ages the data with the
 * injected clock, runs retention and closes, is run again and again with
 * the Nth system call (or allocation) of one kind failing, for every N until
 * the scenario no longer reaches the Nth call: once or from then on, with
 * several errnos (EIO, ENOSPC, EROFS, ...), interrupted (EINTR: the scenario
 * must then succeed as if nothing happened) or shortened (a read or write
 * that moves half of what it was asked: the same).
 *
 * Each run must end with a COMET_E_* code and a message (or succeed), never
 * crash, leak (ASan) or lose what it acknowledged: reopened without faults,
 * every appended entry that retention did not delete reads back intact,
 * nothing is stored twice (at most the one append that failed survives),
 * verification finds no damage, no group is ahead of its shard's data, and
 * no healthy segment was set aside (*.orphan). */
#include <dirent.h>
#include <errno.h>
#include <sys/stat.h>

#include "util.h"

#define SHARDS 2
#define APPENDS 1500
#define MAX_N 5000
/* Under ThreadSanitizer (ten times slower) the walks take every STRIDE-th
 * call: races do not need every failure point, ASan's run has them all. */
#ifdef __SANITIZE_THREAD__
#define STRIDE 9
#else
#define STRIDE 1
#endif

static read_buf rb;

typedef struct outcome {
    uint64_t acked[SHARDS]; /* entries appended with success, per shard */
    int rc;                 /* the first error, 0 when none */
    const char *step;
} outcome;

static void payload_for(uint32_t shard, uint64_t e, uint8_t *out, uint32_t *len)
{
    *len = 40 + (uint32_t)((e * 7919 + shard) % 200);
    for (uint32_t k = 0; k < *len; k++)
        out[k] = (uint8_t)(e * 31 + k + shard);
}

/* Appends the shard's next entry; counts it as acknowledged when it succeeds. */
static int64_t append_next(comet_stream *s, outcome *o, uint32_t shard)
{
    uint8_t p[256];
    uint32_t len;
    payload_for(shard, o->acked[shard], p, &len);
    int64_t got = comet_append(s, shard, p, len, 0, -1, COMET_APPEND_WAIT);
    if (got >= 0) {
        CHECK((uint64_t)got == o->acked[shard]);
        o->acked[shard]++;
    }
    return got;
}

static comet_config scenario_config(void)
{
    comet_config cfg;
    comet_config_default(&cfg);
    cfg.segment_bytes = 64 << 10;
    cfg.flags |= COMET_OPEN_NO_FLUSHER;
    cfg.retention_max_age_ms = 60000;
    cfg.retention_protect_unconsumed = 0;
    cfg.retention_interval_ms = 0;
    cfg.retention_max_total_bytes = 64 << 20; /* never reached: exercises the disk-use estimate */
    return cfg;
}

static int failed(outcome *o, const char *step, long long rc)
{
    if (rc >= 0)
        return 0;
    o->rc = (int)rc;
    o->step = step;
    return 1;
}

/* Runs the scenario; stops at the first error (closing what it opened). */
static void scenario(const char *dir, outcome *o)
{
    memset(o, 0, sizeof *o);
    comet_config cfg = scenario_config();
    comet_db *db = NULL;
    if (failed(o, "open", comet_open(dir, &cfg, &db)))
        return;
    comet_stream *s = NULL;
    comet_group *g = NULL;
    if (failed(o, "stream_open", comet_stream_open(db, "s", 1, SHARDS, 1, &s)) ||
        failed(o, "group_open", comet_group_open(s, 0, "g", 1, 1, &g)))
        goto close;
    for (uint64_t i = 0; i < APPENDS; i++) {
        uint32_t shard = (uint32_t)(i % SHARDS);
        if (failed(o, "append", append_next(s, o, shard)))
            goto close;
        if (shard == 0 && i % 50 == 0 && failed(o, "ack", comet_group_ack(g, o->acked[0] - 1)))
            goto close;
    }
    if (failed(o, "sync", comet_sync(s, -1)))
        goto close;
    comet_clock_shift(120LL * 1000000000); /* every entry is now past retention_max_age_ms */
    comet_retention_report rep;
    memset(&rep, 0, sizeof rep);
    failed(o, "retention", comet_run_retention(db, &rep));
close:;
    int rc = comet_close(db);
    if (!o->rc)
        failed(o, "close", rc);
}

static int has_orphans(const char *dir)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/s", dir);
    DIR *d = opendir(path);
    if (!d)
        return 0;
    int found = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        char sub[1300];
        snprintf(sub, sizeof sub, "%s/%s", path, de->d_name);
        DIR *sd = opendir(sub);
        struct dirent *f;
        while (sd && (f = readdir(sd)))
            if (strstr(f->d_name, ".orphan"))
                found = 1;
        if (sd)
            closedir(sd);
    }
    closedir(d);
    return found;
}

/* Reopened without faults: what the scenario acknowledged is there. */
static void check_after(const char *dir, const outcome *o, unsigned kinds, long n)
{
    comet_config cfg = scenario_config();
    comet_db *db = NULL;
    int rc = comet_open(dir, &cfg, &db);
    if (rc < 0) {
        fprintf(stderr, "kinds %#x n %ld: reopen failed: %s (%s)\n", kinds, n, comet_strerror(rc),
                comet_last_error());
        exit(1);
    }
    comet_stream *s = NULL;
    rc = comet_stream_open(db, "s", 1, 0, 0, &s);
    if (rc == COMET_E_NO_STREAM) { /* never created: then nothing was acknowledged */
        CHECK(o->acked[0] == 0 && o->acked[1] == 0);
        CHECK_OK(comet_close(db));
        return;
    }
    CHECK_OK(rc);
    for (uint32_t shard = 0; shard < SHARDS; shard++) {
        comet_shard_stats st;
        CHECK_OK(comet_shard_stats_get(s, shard, COMET_STATS_ALL, &st));
        /* An append that failed may have stored its entry (the fault came
         * after the entry was written); nothing else may be there. */
        uint64_t most = o->acked[shard] + (o->rc && !strcmp(o->step, "append") ? 1 : 0);
        if (st.next_entry > most) {
            fprintf(stderr, "kinds %#x n %ld (%s failed): shard %u has %llu entries, %llu were "
                    "acknowledged: stored twice?\n", kinds, n, o->step ? o->step : "-", shard,
                    (unsigned long long)st.next_entry, (unsigned long long)o->acked[shard]);
            exit(1);
        }
        if (st.next_entry < o->acked[shard]) {
            fprintf(stderr, "kinds %#x n %ld (%s failed): shard %u has %llu entries, %llu were "
                    "acknowledged\n", kinds, n, o->step ? o->step : "-", shard,
                    (unsigned long long)st.next_entry, (unsigned long long)o->acked[shard]);
            exit(1);
        }
        for (uint64_t e = st.first_entry; e < o->acked[shard];) {
            CHECK_OK(read_some(s, shard, e, 1024, &rb, 0));
            CHECK(rb.res.count > 0);
            for (uint32_t i = 0; i < rb.res.count && e < o->acked[shard]; i++, e++) {
                uint8_t want[256];
                uint32_t len;
                payload_for(shard, e, want, &len);
                CHECK(rb.entries[i] == (int64_t)e);
                CHECK((uint32_t)(rb.offsets[i + 1] - rb.offsets[i]) == len);
                CHECK(memcmp(rb.data + rb.offsets[i], want, len) == 0);
            }
        }
        comet_verify_report vr;
        CHECK_OK(comet_verify_shard(s, shard, &vr));
        CHECK(vr.bad_entries == 0);
    }
    comet_group *g = NULL;
    if (comet_group_open(s, 0, "g", 1, 0, &g) == 0) {
        comet_shard_stats st;
        CHECK_OK(comet_shard_stats_get(s, 0, COMET_STATS_ALL, &st));
        CHECK((uint64_t)comet_group_offset(g) <= st.next_entry);
    }
    CHECK_OK(comet_close(db));
    if (has_orphans(dir)) {
        fprintf(stderr, "kinds %#x n %ld (%s failed): a segment was set aside as .orphan\n",
                kinds, n, o->step ? o->step : "-");
        exit(1);
    }
}

static int known_code(int rc)
{
    return rc == COMET_E_IO || rc == COMET_E_NOMEM || rc == COMET_E_STORAGE_FULL ||
           rc == COMET_E_READ_ONLY || rc == COMET_E_SYNC_FAILED;
}

/* What a sweep injects: `err` into the nth call of `kinds` and the count - 1
 * after it (count 0: every later one).  EINTR and COMET_FAULT_SHORT are
 * absorbed by the core: the run must then succeed. */
typedef struct fault_spec {
    unsigned kinds;
    const char *name;
    int err;
    long count;
} fault_spec;

static int absorbed(const fault_spec *f)
{
    return f->err == EINTR || f->err == COMET_FAULT_SHORT;
}

/* After one run: the error (if any) is a known code with a message, and an
 * absorbed fault left no error at all. */
static void judge(const char *what, const fault_spec *f, long n, const outcome *o, long fired)
{
    if (fired && o->rc && (absorbed(f) || !known_code(o->rc))) {
        fprintf(stderr, "%s, %s (kinds %#x, err %d, count %ld) n %ld: %s failed with %d (%s: %s)\n",
                what, f->name, f->kinds, f->err, f->count, n, o->step, o->rc,
                comet_strerror(o->rc), comet_last_error());
        exit(1);
    }
    if (o->rc)
        CHECK(comet_last_error()[0] != '\0');
}

static void arm(const fault_spec *f, long n)
{
    comet_fault_rule r = {f->kinds, n, f->count, f->err};
    CHECK_OK(comet_fault_add(&r));
}

/* Every N (every STRIDE-th) for one spec: returns how many runs reached
 * their Nth call. */
static long sweep(const fault_spec *f)
{
    long n, points = 0;
    for (n = 1; n <= MAX_N; n += STRIDE) {
        char *dir = scratch_dir();
        outcome o;
        arm(f, n);
        scenario(dir, &o);
        long fired = comet_fault_fired(), reached = comet_fault_calls() >= n;
        comet_fault_clear();
        judge("scenario", f, n, &o, fired);
        check_after(dir, &o, f->kinds, n);
        rm_tree(dir);
        if (!reached)
            break;
        points++;
    }
    CHECK(n <= MAX_N);
    return points;
}

/* ---- recovery under faults ---------------------------------------------- */

#define PREPARED 1500

/* A directory whose shard 0 lost its state file and an index (recovery
 * rebuilds them at the next open), made without faults. */
static void prepare_recovery(const char *dir, outcome *o)
{
    memset(o, 0, sizeof *o);
    comet_config cfg = scenario_config();
    comet_db *db = NULL;
    CHECK_OK(comet_open(dir, &cfg, &db));
    comet_stream *s = open_stream(db, "s", SHARDS);
    for (uint64_t i = 0; i < PREPARED; i++) {
        CHECK_OK(append_next(s, o, (uint32_t)(i % SHARDS)));
    }
    CHECK_OK(comet_close(db));
    char path[1024];
    snprintf(path, sizeof path, "%s/s/shard-0000/state", dir);
    CHECK(unlink(path) == 0);
    snprintf(path, sizeof path, "%s/s/shard-0000/00000000000000000000.idx", dir);
    CHECK(unlink(path) == 0);
}

/* Opens (recovering shard 0), reads everything back, appends one entry to each shard. */
static void recover(const char *dir, outcome *o)
{
    comet_config cfg = scenario_config();
    comet_db *db = NULL;
    if (failed(o, "open", comet_open(dir, &cfg, &db)))
        return;
    comet_stream *s = NULL;
    if (failed(o, "stream_open", comet_stream_open(db, "s", 1, 0, 0, &s)))
        goto close;
    for (uint32_t shard = 0; shard < SHARDS; shard++) {
        for (uint64_t e = 0; e < o->acked[shard];) {
            if (failed(o, "read", read_some(s, shard, e, 1024, &rb, 0)))
                goto close;
            if (rb.res.count == 0 || rb.entries[0] != (int64_t)e) {
                fprintf(stderr, "recovery, fault %ld of %ld calls: shard %u read from %llu gave %u "
                        "entries from %lld (next %llu), no error\n", comet_fault_fired(),
                        comet_fault_calls(), shard, (unsigned long long)e, rb.res.count,
                        rb.res.count ? (long long)rb.entries[0] : -1LL,
                        (unsigned long long)rb.res.next_entry);
                exit(1);
            }
            e += rb.res.count;
        }
        if (failed(o, "append", append_next(s, o, shard)))
            goto close;
    }
close:;
    int rc = comet_close(db);
    if (!o->rc)
        failed(o, "close", rc);
}

static long sweep_recovery(const fault_spec *f)
{
    long n, points = 0;
    for (n = 1; n <= MAX_N; n += STRIDE) {
        char *dir = scratch_dir();
        outcome o;
        prepare_recovery(dir, &o);
        arm(f, n);
        recover(dir, &o);
        long fired = comet_fault_fired(), reached = comet_fault_calls() >= n;
        comet_fault_clear();
        judge("recovery", f, n, &o, fired);
        check_after(dir, &o, f->kinds, n);
        rm_tree(dir);
        if (!reached)
            break;
        points++;
    }
    CHECK(n <= MAX_N);
    return points;
}

static void run_specs(const fault_spec *specs, size_t count)
{
    for (size_t k = 0; k < count; k++) {
        long points = sweep(&specs[k]);
        long in_recovery = sweep_recovery(&specs[k]);
        const char *err = specs[k].err == COMET_FAULT_SHORT ? "short" : strerrorname_np(specs[k].err);
        fprintf(stderr, "    %-8s %-7s %-12s: %4ld failure points in the scenario, %4ld in recovery\n",
                specs[k].name, err, specs[k].count == 1 ? "once" :
                specs[k].count ? "a stretch" : "from then on", points, in_recovery);
    }
}

/* Every kind, once and from then on. */
static void test_every_failure_point(void)
{
    static const fault_spec specs[] = {
        {COMET_FAULT_OPEN, "open", EIO, 1},       {COMET_FAULT_OPEN, "open", EMFILE, 0},
        {COMET_FAULT_SIZE, "size", ENOSPC, 1},    {COMET_FAULT_SIZE, "size", ENOSPC, 0},
        {COMET_FAULT_MAP, "map", ENOMEM, 1},      {COMET_FAULT_MAP, "map", ENOMEM, 0},
        {COMET_FAULT_SYNC, "sync", EIO, 1},       {COMET_FAULT_SYNC, "sync", EIO, 0},
        {COMET_FAULT_NAME, "name", EIO, 1},       {COMET_FAULT_NAME, "name", EIO, 0},
        {COMET_FAULT_REMOVE, "remove", EIO, 1},   {COMET_FAULT_REMOVE, "remove", EIO, 0},
        {COMET_FAULT_READDIR, "readdir", EIO, 1}, {COMET_FAULT_READDIR, "readdir", EIO, 0},
        {COMET_FAULT_ALLOC, "alloc", ENOMEM, 1},  {COMET_FAULT_ALLOC, "alloc", ENOMEM, 0},
        {COMET_FAULT_READ, "read", EIO, 1},       {COMET_FAULT_READ, "read", EIO, 0},
        {COMET_FAULT_WRITE, "write", EIO, 1},     {COMET_FAULT_WRITE, "write", ENOSPC, 0},
        {COMET_FAULT_UNMAP, "unmap", EINVAL, 1},  {COMET_FAULT_UNMAP, "unmap", EINVAL, 0},
        {COMET_FAULT_CLOSE, "close", EIO, 1},     {COMET_FAULT_CLOSE, "close", EIO, 0},
        {COMET_FAULT_STAT, "stat", EIO, 1},       {COMET_FAULT_STAT, "stat", EIO, 0},
        {COMET_FAULT_LOCK, "lock", ENOLCK, 1},    {COMET_FAULT_LOCK, "lock", ENOLCK, 0},
    };
    run_specs(specs, sizeof specs / sizeof specs[0]);
}

/* The errno decides the code the caller sees: a read-only filesystem, a full
 * disk and an I/O error, from the calls that meet them in production. */
static void test_errnos(void)
{
    static const fault_spec specs[] = {
        {COMET_FAULT_SYNC, "sync", EROFS, 0},   {COMET_FAULT_SYNC, "sync", ENOSPC, 1},
        {COMET_FAULT_SIZE, "size", EROFS, 1},   {COMET_FAULT_SIZE, "size", EIO, 0},
        {COMET_FAULT_WRITE, "write", EROFS, 1}, {COMET_FAULT_OPEN, "open", EROFS, 0},
        {COMET_FAULT_NAME, "name", EROFS, 1},   {COMET_FAULT_NAME, "name", ENOSPC, 1},
        {COMET_FAULT_READ, "read", EAGAIN, 1},  {COMET_FAULT_LOCK, "lock", EAGAIN, 1},
    };
    run_specs(specs, sizeof specs / sizeof specs[0]);
}

/* Interrupted calls (every kind that can return EINTR) and short transfers
 * are absorbed: each run succeeds and check_after finds exactly its data. */
static void test_interrupted_and_short(void)
{
    static const fault_spec specs[] = {
        {COMET_FAULT_ALL & ~(COMET_FAULT_READDIR | COMET_FAULT_ALLOC), "all", EINTR, 1},
        {COMET_FAULT_OPEN | COMET_FAULT_SYNC | COMET_FAULT_LOCK, "o+s+l", EINTR, 3},
        {COMET_FAULT_READ | COMET_FAULT_WRITE, "rw", COMET_FAULT_SHORT, 1},
        {COMET_FAULT_READ | COMET_FAULT_WRITE, "rw", COMET_FAULT_SHORT, 0},
    };
    run_specs(specs, sizeof specs / sizeof specs[0]);
}

/* Several rules at once: every read and write shortened, every call of any
 * kind interrupted for a stretch, and one sync failing within it.  Each run
 * fails cleanly at the sync (or succeeds) and keeps what it acknowledged. */
static void test_plan_of_rules(void)
{
    int failed_runs = 0;
    for (long n = 1; n <= 40; n += 3) {
        char *dir = scratch_dir();
        outcome o;
        comet_fault_rule rules[] = {
            {COMET_FAULT_READ | COMET_FAULT_WRITE, 1, 0, COMET_FAULT_SHORT},
            {COMET_FAULT_ALL & ~(COMET_FAULT_READDIR | COMET_FAULT_ALLOC), n, 200, EINTR},
            {COMET_FAULT_SYNC, n, 1, EIO},
        };
        for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++)
            CHECK_OK(comet_fault_add(&rules[i]));
        scenario(dir, &o);
        comet_fault_clear();
        fault_spec f = {COMET_FAULT_SYNC, "plan", EIO, 1};
        judge("plan", &f, n, &o, 1);
        failed_runs += o.rc != 0;
        check_after(dir, &o, COMET_FAULT_ALL, n);
        rm_tree(dir);
    }
    CHECK(failed_runs > 0); /* the sync rule did fire */
}

static void test_rules_refused(void)
{
    comet_fault_rule forever_eintr = {COMET_FAULT_SYNC, 1, 0, EINTR}, none = {0, 1, 1, EIO};
    CHECK(comet_fault_add(&forever_eintr) == COMET_E_INVALID);
    CHECK(comet_fault_add(&none) == COMET_E_INVALID);
    comet_fault_rule ok = {COMET_FAULT_SYNC, 1, 1, EIO};
    for (int i = 0; i < COMET_FAULT_MAX_RULES; i++)
        CHECK_OK(comet_fault_add(&ok));
    CHECK(comet_fault_add(&ok) == COMET_E_INVALID);
    comet_fault_clear();
}

static void test_clock_shift_ages_data(void)
{
    char *dir = scratch_dir();
    comet_config cfg = scenario_config();
    comet_db *db = NULL;
    CHECK_OK(comet_open(dir, &cfg, &db));
    comet_stream *s = open_stream(db, "s", 1);
    for (int i = 0; i < 2000; i++)
        CHECK_OK(comet_append(s, 0, "0123456789012345678901234567890123456789", 40, 0, -1,
                              COMET_APPEND_WAIT));
    comet_shard_stats before;
    CHECK_OK(comet_shard_stats_get(s, 0, COMET_STATS_ALL, &before));
    CHECK(before.segments > 1);
    comet_retention_report rep;
    memset(&rep, 0, sizeof rep);
    CHECK_OK(comet_run_retention(db, &rep));
    CHECK(rep.deleted_segments == 0); /* nothing is a minute old yet */
    comet_clock_shift(61LL * 1000000000);
    CHECK_OK(comet_run_retention(db, &rep));
    comet_shard_stats after;
    CHECK_OK(comet_shard_stats_get(s, 0, COMET_STATS_ALL, &after));
    CHECK(rep.deleted_segments == before.segments - 1 && after.segments == 1);
    CHECK_OK(comet_close(db));
    rm_tree(dir);
}

int main(void)
{
    RUN(test_clock_shift_ages_data);
    RUN(test_rules_refused);
    RUN(test_interrupted_and_short);
    RUN(test_plan_of_rules);
    RUN(test_errnos);
    RUN(test_every_failure_point);
    return 0;
}
