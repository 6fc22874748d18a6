/* No lock survives its holders: lock words in mapped files (a shard's state,
 * the data directory's .usage) that no living process holds open are reset
 * by the next opener, and never while one does (state.c, usage.c).
 *
 * A "rogue" process plants a held lock word: it maps the file by hand and
 * locks the mutex without opening the shard through the core, so it holds
 * no open-file-description lock; it stays alive, which is the worst case (a
 * copy of a live directory names a thread that still exists, and a robust
 * mutex reports an owner's death only to processes sharing its mapping).
 * Every opener runs in a child under alarm(): a hang fails the test. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include "util.h"

#define APPEND_LOCK 64  /* FORMAT.md, shard state: the lock words */
#define SYNC_LOCK 128
#define GROUPS_LOCK 576
#define USAGE_LOCK 64   /* FORMAT.md, .usage */
#define OPEN_TIMEOUT_S 20

static char path_buf[512];

static const char *file_of(const char *dir, const char *rel)
{
    snprintf(path_buf, sizeof path_buf, "%s/%s", dir, rel);
    return path_buf;
}

static void append_n(comet_stream *s, uint64_t from, uint64_t to)
{
    for (uint64_t e = from; e < to; e++) {
        char p[32];
        int n = snprintf(p, sizeof p, "entry %llu", (unsigned long long)e);
        int64_t got = comet_append(s, 0, p, (uint32_t)n, 0, -1, COMET_APPEND_WAIT);
        CHECK_OK(got);
        CHECK((uint64_t)got == e);
    }
}

static uint8_t *map_file(const char *path)
{
    int fd = open(path, O_RDWR);
    CHECK(fd >= 0);
    uint8_t *map = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    CHECK(map != MAP_FAILED);
    close(fd);
    return map;
}

/* A process that locks the words at offsets (ends at 0) of path by hand and
 * stays alive holding them until *release is closed.  Returns its pid once
 * it holds them. */
static pid_t plant_held_locks(const char *path, const int *offsets, int *release)
{
    int ready[2], wait_for[2];
    CHECK(pipe(ready) == 0 && pipe(wait_for) == 0);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        close(ready[0]);
        close(wait_for[1]);
        uint8_t *map = map_file(path);
        for (int i = 0; offsets[i]; i++)
            if (pthread_mutex_lock((pthread_mutex_t *)(map + offsets[i])) != 0)
                _exit(2);
        CHECK(write(ready[1], "h", 1) == 1);
        char c;
        while (read(wait_for[0], &c, 1) > 0)
            ;
        _exit(0);
    }
    close(ready[1]);
    close(wait_for[0]);
    char c;
    CHECK(read(ready[0], &c, 1) == 1);
    close(ready[0]);
    *release = wait_for[1];
    return pid;
}

static void end_rogue(pid_t pid, int release)
{
    close(release);
    int status;
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* Waits for a child; it must have exited 0 (SIGALRM: it hung opening). */
static void expect_clean_exit(pid_t pid, const char *what)
{
    int status;
    CHECK(waitpid(pid, &status, 0) == pid);
    if (WIFSIGNALED(status))
        fprintf(stderr, "    %s: killed by signal %d%s\n", what, WTERMSIG(status),
                WTERMSIG(status) == SIGALRM ? " (it waited for a lock nobody holds)" : "");
    else if (WEXITSTATUS(status))
        fprintf(stderr, "    %s: exit %d\n", what, WEXITSTATUS(status));
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

static void make_shard(const char *dir, uint64_t entries)
{
    comet_db *db = open_db(dir, 1 << 20);
    comet_stream *s = open_stream(db, "l", 1);
    append_n(s, 0, entries);
    CHECK_OK(comet_close(db));
}

/* A state whose append, sync and groups words are held by a process that
 * does not hold the shard open: an opener resets them (counted once as a
 * dead owner's), appends, syncs and registers a group without waiting. */
static void test_a_lock_held_by_no_opener_is_reset(void)
{
    char *dir = scratch_dir();
    make_shard(dir, 5);
    static const int words[] = {APPEND_LOCK, SYNC_LOCK, GROUPS_LOCK, 0};
    int release;
    pid_t rogue = plant_held_locks(file_of(dir, "l/shard-0000/state"), words, &release);
    pid_t opener = fork();
    CHECK(opener >= 0);
    if (opener == 0) {
        alarm(OPEN_TIMEOUT_S);
        comet_db *db = open_db(dir, 1 << 20);
        comet_stream *s = open_stream(db, "l", 0);
        append_n(s, 5, 10);
        CHECK_OK(comet_sync(s, 0));
        comet_group *g = NULL;
        CHECK_OK(comet_group_open(s, 0, "g", 1, 1, &g));
        comet_shard_stats st;
        CHECK_OK(comet_shard_stats_get(s, 0, COMET_STATS_ALL, &st));
        CHECK(st.next_entry == 10 && st.lock_owner_died == 1 && st.durable_entry == 10);
        comet_verify_report vr;
        CHECK_OK(comet_verify_shard(s, 0, &vr));
        CHECK(vr.entries == 10 && vr.bad_entries == 0);
        CHECK_OK(comet_close(db));
        _exit(0);
    }
    expect_clean_exit(opener, "opener");
    end_rogue(rogue, release);
    rm_tree(dir);
}

/* Where the calling thread is blocked: 1 while pid's main thread waits in
 * futex(), 0 once pid is gone (reaped by the caller later). */
static int waits_in_futex(pid_t pid)
{
    char path[64], buf[64];
    snprintf(path, sizeof path, "/proc/%d/syscall", (int)pid);
    for (;;) {
        int fd = open(path, O_RDONLY);
        if (fd < 0)
            return 0;
        ssize_t n = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (n <= 0)
            return 0;
        buf[n] = 0;
        if (atol(buf) == SYS_futex)
            return 1;
        siginfo_t info;
        memset(&info, 0, sizeof info);
        if (waitid(P_PID, (id_t)pid, &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid)
            return 0; /* it finished without waiting */
        sched_yield();
    }
}

/* A process that has the shard open holds its append lock; a second opener
 * must wait for it (it may not take the word for a stale one), then go on. */
static void test_a_live_holders_lock_is_not_reset(void)
{
    char *dir = scratch_dir();
    make_shard(dir, 5);
    atomic_int *held = mmap(NULL, sizeof *held, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                            -1, 0);
    CHECK(held != MAP_FAILED);
    atomic_store(held, 0);
    int ready[2], go[2];
    CHECK(pipe(ready) == 0 && pipe(go) == 0);
    pid_t holder = fork();
    CHECK(holder >= 0);
    if (holder == 0) {
        alarm(OPEN_TIMEOUT_S);
        close(ready[0]);
        close(go[1]);
        comet_db *db = open_db(dir, 1 << 20);
        comet_stream *s = open_stream(db, "l", 0);
        open_shard(s, 0); /* its lock is held from here */
        uint8_t *map = map_file(file_of(dir, "l/shard-0000/state"));
        CHECK(pthread_mutex_lock((pthread_mutex_t *)(map + APPEND_LOCK)) == 0);
        atomic_store(held, 1);
        CHECK(write(ready[1], "h", 1) == 1);
        char c;
        while (read(go[0], &c, 1) > 0)
            ;
        atomic_store(held, 0);
        CHECK(pthread_mutex_unlock((pthread_mutex_t *)(map + APPEND_LOCK)) == 0);
        CHECK_OK(comet_close(db));
        _exit(0);
    }
    close(ready[1]);
    close(go[0]);
    char c;
    CHECK(read(ready[0], &c, 1) == 1);
    pid_t second = fork();
    CHECK(second >= 0);
    if (second == 0) {
        alarm(OPEN_TIMEOUT_S);
        close(go[1]); /* the holder's release is the parent's alone */
        comet_db *db = open_db(dir, 1 << 20);
        comet_stream *s = open_stream(db, "l", 0);
        append_n(s, 5, 6); /* opening the shard takes the append lock */
        if (atomic_load(held))
            _exit(3); /* it went through while the holder held the lock: reset under it */
        comet_shard_stats st;
        CHECK_OK(comet_shard_stats_get(s, 0, COMET_STATS_ALL, &st));
        CHECK(st.lock_owner_died == 0);
        CHECK_OK(comet_close(db));
        _exit(0);
    }
    int blocked = waits_in_futex(second); /* an event, not a sleep: it waits for the holder */
    close(go[1]);
    expect_clean_exit(holder, "holder");
    expect_clean_exit(second, "second opener");
    CHECK(blocked);
    munmap(held, sizeof *held);
    close(ready[0]);
    rm_tree(dir);
}

/* Openers started together after a planted stale lock: exactly one resets
 * it, and while any of them holds the append lock nobody else does. */
static void test_concurrent_openers_reset_once(void)
{
    enum { OPENERS = 4, ROUNDS = 50 };
    char *dir = scratch_dir();
    make_shard(dir, 5);
    static const int words[] = {APPEND_LOCK, 0};
    int release;
    pid_t rogue = plant_held_locks(file_of(dir, "l/shard-0000/state"), words, &release);
    atomic_int *inside = mmap(NULL, sizeof *inside, PROT_READ | PROT_WRITE,
                              MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(inside != MAP_FAILED);
    atomic_store(inside, 0);
    int go[2];
    CHECK(pipe(go) == 0);
    pid_t kids[OPENERS];
    for (int k = 0; k < OPENERS; k++) {
        kids[k] = fork();
        CHECK(kids[k] >= 0);
        if (kids[k] == 0) {
            alarm(OPEN_TIMEOUT_S);
            close(go[1]);
            char c;
            while (read(go[0], &c, 1) > 0) /* all start at once */
                ;
            comet_db *db = open_db(dir, 1 << 20);
            comet_stream *s = open_stream(db, "l", 0);
            open_shard(s, 0);
            pthread_mutex_t *m =
                (pthread_mutex_t *)(map_file(file_of(dir, "l/shard-0000/state")) + APPEND_LOCK);
            for (int r = 0; r < ROUNDS; r++) {
                CHECK(pthread_mutex_lock(m) == 0);
                if (atomic_fetch_add(inside, 1) != 0)
                    _exit(3); /* two holders at once: a lock was reset under its holder */
                sched_yield();
                atomic_fetch_sub(inside, 1);
                CHECK(pthread_mutex_unlock(m) == 0);
                CHECK_OK(comet_append(s, 0, "x", 1, 0, -1, COMET_APPEND_WAIT));
            }
            CHECK_OK(comet_close(db));
            _exit(0);
        }
    }
    close(go[0]);
    close(go[1]);
    for (int k = 0; k < OPENERS; k++)
        expect_clean_exit(kids[k], "concurrent opener");
    end_rogue(rogue, release);
    comet_db *db = open_db(dir, 1 << 20);
    comet_stream *s = open_stream(db, "l", 0);
    comet_shard_stats st;
    CHECK_OK(comet_shard_stats_get(s, 0, COMET_STATS_ALL, &st));
    CHECK(st.next_entry == 5 + OPENERS * ROUNDS);
    CHECK(st.lock_owner_died == 1); /* the planted word, found once */
    CHECK_OK(comet_close(db));
    munmap(inside, sizeof *inside);
    rm_tree(dir);
}

/* The data directory's disk-use estimate has a lock word of its own. */
static void test_a_usage_lock_held_by_no_opener_is_reset(void)
{
    char *dir = scratch_dir();
    comet_config cfg;
    comet_config_default(&cfg);
    cfg.segment_bytes = 64 << 10;
    cfg.flags |= COMET_OPEN_NO_FLUSHER;
    cfg.retention_max_total_bytes = 1 << 20;
    cfg.retention_interval_ms = 0;
    comet_db *db = NULL;
    CHECK_OK(comet_open(dir, &cfg, &db));
    append_n(open_stream(db, "l", 1), 0, 5);
    CHECK_OK(comet_close(db));
    struct stat sb;
    CHECK(stat(file_of(dir, ".usage"), &sb) == 0);
    static const int words[] = {USAGE_LOCK, 0};
    int release;
    pid_t rogue = plant_held_locks(file_of(dir, ".usage"), words, &release);
    pid_t opener = fork();
    CHECK(opener >= 0);
    if (opener == 0) {
        alarm(OPEN_TIMEOUT_S);
        comet_db *d = NULL;
        CHECK_OK(comet_open(dir, &cfg, &d));
        comet_stream *s = open_stream(d, "l", 0);
        char p[1000];
        memset(p, 'u', sizeof p);
        for (int i = 0; i < 200; i++) /* several segment growths: reservations */
            CHECK_OK(comet_append(s, 0, p, sizeof p, 0, -1, COMET_APPEND_WAIT));
        CHECK(comet_data_bytes(d) > 0);
        CHECK_OK(comet_close(d));
        _exit(0);
    }
    expect_clean_exit(opener, "opener under a budget");
    end_rogue(rogue, release);
    rm_tree(dir);
}

int main(void)
{
    RUN(test_a_lock_held_by_no_opener_is_reset);
    RUN(test_a_live_holders_lock_is_not_reset);
    RUN(test_concurrent_openers_reset_once);
    RUN(test_a_usage_lock_held_by_no_opener_is_reset);
    return 0;
}
