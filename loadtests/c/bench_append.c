/*
 * bench_append.c - what one append call costs the core: a fixed workload of
 * 1, 10, 100 and 1000 entries per call into one shard, the calls the Python
 * API makes (storage_c/_fastpath.c: comet_append and comet_append_vector
 * without waiting, then waiting when refused), measured in instructions by
 * callgrind (deterministic: the quick tier's budget check,
 * storage_c/tests/append_budget.py) or in nanoseconds by the clock (noisy on
 * a shared machine; the Python API's timed figures are bench_storage.py's).
 *
 *   make append-budget                             # build, count, compare
 *   build/bench/bench_append DIR [SCALE [storage]]  # timed, SCALE x the calls
 *
 * The core is compiled as the cffi module compiles it (-O2, hidden
 * visibility; Makefile: BENCH_CFLAGS).  Each case appends to a stream of its
 * own, one shard, after a warm-up that maps its first segment; the measured
 * calls then include what they amortize: growing the segment by chunks,
 * zero-filling ahead, rotations (4 MiB segments grown by 1 MiB chunks), the
 * per-shard size limit deleting old segments (8 MiB) and recycling them, so
 * a change that makes those dearer shows too.  "storage" sizes them as
 * bench_storage.py does (16 MiB segments, the default 4 MiB chunks, 128 MiB
 * per shard; SCALE 80 writes about 1 GiB per case).  Counted, it runs no
 * flusher thread: the count is this thread's alone (deleted segments are then
 * recycled only by syncs); timed, the flusher runs as in production.  The
 * payloads are bench_storage.py's (116 B; 10 x 88 B; 100 x ~98 B and
 * 1000 x ~110 B, +-4 B).
 *
 * Under callgrind (--instr-atstart=yes), each case's calls sit between
 * CALLGRIND_ZERO_STATS and CALLGRIND_DUMP_STATS_AT("append N"): one dump per
 * case.  Relative paths keep the count independent of DIR's length (paths
 * are formatted on the rotation path).  Prints one JSON object per case:
 * ns, user and system ns per call, rotations and recycled segments.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
#include <valgrind/callgrind.h>

#include "comet.h"

#define CASES 4
#define MAX_ENTRIES 1000

static const uint32_t ENTRIES[CASES] = {1, 10, 100, 1000};
static const uint32_t MEAN_BYTES[CASES] = {116, 88, 98, 110};
/* Calls per case at SCALE 1: about 12 MiB stored each, three segments. */
static const uint32_t CALLS[CASES] = {90000, 12000, 1100, 100};
#define WARMUP_CALLS 8

static int64_t clock_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* CPU time of the process so far, in the process and in the kernel (ns). */
static void cpu_ns(int64_t *user, int64_t *sys)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    *user = (int64_t)ru.ru_utime.tv_sec * 1000000000 + (int64_t)ru.ru_utime.tv_usec * 1000;
    *sys = (int64_t)ru.ru_stime.tv_sec * 1000000000 + (int64_t)ru.ru_stime.tv_usec * 1000;
}

/* bench_storage.py's payload i of `size` bytes: a JSON log line. */
static void payload(uint8_t *p, uint32_t i, uint32_t size)
{
    int head = snprintf((char *)p, size, "{\"ts\":%u,\"seq\":%u,\"level\":\"info\",\"svc\":\"edge-gw\","
                        "\"msg\":\"", 1700000000u + i, i);
    for (uint32_t k = (uint32_t)head; k < size - 2; k++)
        p[k] = (uint8_t)"request served "[(k - (uint32_t)head) % 15];
    memcpy(p + size - 2, "\"}", 2);
}

#if COMET_API_VERSION >= 2
static int64_t append_once(comet_stream *s, const comet_payload *items, uint32_t n)
{
    int64_t rc;
    if (n == 1) {
        rc = comet_append(s, 0, items[0].data, (uint32_t)items[0].len, 0, COMET_DURABILITY_DEFAULT,
                          COMET_APPEND_NOWAIT);
        if (rc == COMET_E_WOULD_BLOCK)
            rc = comet_append(s, 0, items[0].data, (uint32_t)items[0].len, 0,
                              COMET_DURABILITY_DEFAULT, COMET_APPEND_WAIT);
    } else {
        rc = comet_append_vector(s, 0, items, n, 0, COMET_DURABILITY_DEFAULT, COMET_APPEND_NOWAIT);
        if (rc == COMET_E_WOULD_BLOCK)
            rc = comet_append_vector(s, 0, items, n, 0, COMET_DURABILITY_DEFAULT, COMET_APPEND_WAIT);
    }
    return rc;
}
#else
/* A tree from before the five append entry points (comparing with older
 * commits): what its _fastpath.c called. */
static int64_t append_once(comet_stream *s, const comet_payload *items, uint32_t n)
{
    int64_t rc;
    static comet_stream *opened;
    static comet_shard *sh; /* opened once per stream, as Python kept it */
    if (n == 1) {
        if (opened != s && (rc = comet_shard_open(s, 0, &sh)))
            return rc;
        opened = s;
        rc = comet_append_to_nowait(sh, items[0].data, (uint32_t)items[0].len);
        if (rc == COMET_E_WOULD_BLOCK)
            rc = comet_append_to(sh, items[0].data, (uint32_t)items[0].len);
    } else {
        rc = comet_append_vector_nowait(s, 0, items, n, 0, COMET_DURABILITY_DEFAULT);
        if (rc == COMET_E_WOULD_BLOCK)
            rc = comet_append_vector(s, 0, items, n, 0, COMET_DURABILITY_DEFAULT);
    }
    return rc;
}
#endif

static int run_case(comet_db *db, int c, uint32_t scale)
{
    static uint8_t bytes[MAX_ENTRIES][128];
    static comet_payload items[MAX_ENTRIES];
    uint32_t n = ENTRIES[c];
    for (uint32_t i = 0; i < n; i++) {
        uint32_t size = MEAN_BYTES[c] + (n >= 100 ? i % 9 : 4) - 4;
        payload(bytes[i], i, size);
        items[i] = (comet_payload){bytes[i], size};
    }
    char name[16];
    snprintf(name, sizeof name, "append%u", n);
    comet_stream *s;
    int rc = comet_stream_open(db, name, strlen(name), 1, 1, &s);
    for (uint32_t i = 0; !rc && i < WARMUP_CALLS; i++)
        rc = append_once(s, items, n) < 0;
    if (rc) {
        fprintf(stderr, "bench_append: %s: %s\n", name, comet_last_error());
        return 1;
    }
    uint64_t calls = (uint64_t)CALLS[c] * scale;
    int64_t last = 0;
    int64_t user0, sys0, user1, sys1;
    cpu_ns(&user0, &sys0);
    CALLGRIND_ZERO_STATS;
    int64_t t0 = clock_ns();
    for (uint64_t i = 0; i < calls && last >= 0; i++)
        last = append_once(s, items, n);
    int64_t t1 = clock_ns();
    cpu_ns(&user1, &sys1);
    char label[32];
    snprintf(label, sizeof label, "append %u", n);
    CALLGRIND_DUMP_STATS_AT(label);
    if (last < 0) {
        fprintf(stderr, "bench_append: %s: %s\n", name, comet_last_error());
        return 1;
    }
    comet_shard_stats st;
#ifdef COMET_STATS_ALL
    rc = comet_shard_stats_get(s, 0, 0, &st);
#else
    rc = comet_shard_stats_get(s, 0, &st);
#endif
    if (rc) {
        fprintf(stderr, "bench_append: %s: %s\n", name, comet_last_error());
        return 1;
    }
    printf("{\"case\": \"append %u\", \"entries\": %u, \"calls\": %llu, \"ns_per_call\": %.1f, "
           "\"user_ns_per_call\": %.1f, \"sys_ns_per_call\": %.1f, \"rotations\": %llu, "
           "\"recycled_segments\": %llu}\n",
           n, n, (unsigned long long)calls, (double)(t1 - t0) / (double)calls,
           (double)(user1 - user0) / (double)calls, (double)(sys1 - sys0) / (double)calls,
           (unsigned long long)st.rotations, (unsigned long long)st.recycled_segments);
    return 0;
}

int main(int argc, char **argv)
{
    int storage_sizing = argc == 4 && strcmp(argv[3], "storage") == 0;
    if (argc < 2 || argc > 4 || (argc == 4 && !storage_sizing)) {
        fprintf(stderr, "usage: bench_append DIR [SCALE [storage]]\n");
        return 2;
    }
    uint32_t scale = argc >= 3 ? (uint32_t)strtoul(argv[2], NULL, 10) : 1;
    if (!scale || chdir(argv[1])) {
        perror("bench_append: DIR");
        return 2;
    }
    comet_config cfg;
    comet_config_default(&cfg);
    cfg.flags = COMET_OPEN_CREATE | (RUNNING_ON_VALGRIND ? COMET_OPEN_NO_FLUSHER : 0);
    if (storage_sizing) {
        cfg.retention_max_shard_bytes = 128u << 20;
    } else {
        cfg.segment_bytes = 4u << 20;
        cfg.segment_chunk_bytes = 1u << 20;
        cfg.retention_max_shard_bytes = 8u << 20;
    }
    comet_db *db;
    if (comet_open("data", &cfg, &db)) {
        fprintf(stderr, "bench_append: open: %s\n", comet_last_error());
        return 1;
    }
    int rc = 0;
    for (int c = 0; c < CASES && !rc; c++)
        rc = run_case(db, c, scale);
    if (comet_close(db) && !rc) {
        fprintf(stderr, "bench_append: close: %s\n", comet_last_error());
        rc = 1;
    }
    return rc;
}
