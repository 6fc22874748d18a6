/*
 * test_presence.c - a shard's files taken away while threads append and the
 * flusher syncs (presence.c): the appends are refused with COMET_E_GONE once
 * the flusher's pass, a sync or a rotation saw it, and never succeed again;
 * run under AddressSanitizer (make ctest) and ThreadSanitizer (make tsan), so
 * that the check's look at the active segment races with rotations.
 */
#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "util.h"

#define WRITERS 2
#define AFTER 200 /* appends tried after the first refusal: every one refused */

/* Set while the test looks for the active segment: writers stop between
 * appends (and count themselves in paused), so that no rotation makes the
 * file it picks a sealed one before it is unlinked. */
static atomic_int pause_wanted, paused;

typedef struct writer {
    comet_stream *s;
    atomic_long *appended;
    atomic_int first_error; /* the code of the first failed append */
    long after_ok;     /* appends that succeeded after it */
    long after_other;  /* refusals with another code after it */
} writer;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec / 1e9;
}

static void *append_until_refused(void *arg)
{
    writer *w = arg;
    char payload[200];
    memset(payload, 'x', sizeof payload);
    double deadline = now_s() + 30;
    while (!atomic_load(&w->first_error)) {
        if (atomic_load(&pause_wanted)) {
            atomic_fetch_add(&paused, 1);
            while (atomic_load(&pause_wanted))
                ;
            atomic_fetch_sub(&paused, 1);
        }
        int64_t rc = comet_append(w->s, 0, payload, sizeof payload, 0, COMET_DURABILITY_DEFAULT,
                                  COMET_APPEND_WAIT);
        if (rc < 0)
            atomic_store(&w->first_error, (int)rc);
        else
            atomic_fetch_add(w->appended, 1);
        CHECK(now_s() < deadline); /* never refused */
    }
    for (int i = 0; i < AFTER; i++) {
        int64_t rc = comet_append(w->s, 0, payload, sizeof payload, 0, COMET_DURABILITY_DEFAULT,
                                  COMET_APPEND_WAIT);
        if (rc >= 0)
            w->after_ok++;
        else if (rc != atomic_load(&w->first_error))
            w->after_other++;
    }
    return NULL;
}

/* The active (newest) segment of shard 0: the greatest name that ends in
 * .log (not a segment's temporary file, nor the spare). */
static void active_segment(const char *shard_dir, char *out, size_t n)
{
    DIR *d = opendir(shard_dir);
    CHECK(d);
    char best[256] = "";
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t len = strlen(de->d_name);
        if (len == 24 && strcmp(de->d_name + 20, ".log") == 0 && strcmp(de->d_name, best) > 0)
            snprintf(best, sizeof best, "%s", de->d_name);
    }
    closedir(d);
    CHECK(best[0]);
    snprintf(out, n, "%s/%s", shard_dir, best);
}

typedef enum { UNLINK_SEGMENT, REMOVE_SHARD_DIR } fault;

static void run(fault what, int durability)
{
    char *dir = scratch_dir();
    comet_config cfg;
    comet_config_default(&cfg);
    cfg.segment_bytes = 64 << 10; /* rotations while the threads append */
    cfg.segment_chunk_bytes = 64 << 10;
    cfg.durability = durability;
    cfg.fsync_interval_ms = 5;
    comet_db *db = NULL;
    CHECK_OK(comet_open(dir, &cfg, &db));
    comet_stream *s = open_stream(db, "s", 2);
    atomic_long appended = 0;
    writer w[WRITERS];
    pthread_t t[WRITERS];
    for (int i = 0; i < WRITERS; i++) {
        w[i] = (writer){.s = s, .appended = &appended, .first_error = 0};
        CHECK(pthread_create(&t[i], NULL, append_until_refused, &w[i]) == 0);
    }
    double deadline = now_s() + 30;
    while (atomic_load(&appended) < 1000)
        CHECK(now_s() < deadline);
    char shard_dir[512], path[768];
    snprintf(shard_dir, sizeof shard_dir, "%s/s/shard-0000", dir);
    if (what == UNLINK_SEGMENT) {
        /* the writers wait meanwhile: the file unlinked is the active one */
        atomic_store(&pause_wanted, 1);
        while (atomic_load(&paused) < WRITERS)
            CHECK(now_s() < deadline);
        active_segment(shard_dir, path, sizeof path);
        CHECK(unlink(path) == 0);
        atomic_store(&pause_wanted, 0);
    } else {
        rm_tree(shard_dir);
    }
    for (int i = 0; i < WRITERS; i++)
        CHECK(pthread_join(t[i], NULL) == 0);
    for (int i = 0; i < WRITERS; i++) {
        /* the rotation that found the segment gone may have made a new one
         * first only when the check is missing: every refusal is GONE */
        int first = atomic_load(&w[i].first_error);
        if (first != COMET_E_GONE)
            fprintf(stderr, "first error %d (%s)\n", first, comet_strerror(first));
        CHECK(first == COMET_E_GONE);
        CHECK(w[i].after_ok == 0);
        CHECK(w[i].after_other == 0);
    }
    char payload[8] = "other";
    CHECK_OK(comet_append(s, 1, payload, sizeof payload, 0, COMET_DURABILITY_DEFAULT,
                          COMET_APPEND_WAIT)); /* the other shard goes on */
    CHECK_OK(comet_close(db));
    rm_tree(dir);
}

static void test_segment_unlinked_interval(void) { run(UNLINK_SEGMENT, COMET_DURABILITY_INTERVAL); }
static void test_segment_unlinked_always(void) { run(UNLINK_SEGMENT, COMET_DURABILITY_ALWAYS); }
static void test_shard_dir_removed_interval(void) { run(REMOVE_SHARD_DIR, COMET_DURABILITY_INTERVAL); }
static void test_shard_dir_removed_always(void) { run(REMOVE_SHARD_DIR, COMET_DURABILITY_ALWAYS); }

int main(void)
{
    RUN(test_segment_unlinked_interval);
    RUN(test_segment_unlinked_always);
    RUN(test_shard_dir_removed_interval);
    RUN(test_shard_dir_removed_always);
    return 0;
}
