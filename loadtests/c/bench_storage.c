/*
 * bench_storage.c - the storage core's append and read cost, in C.
 *
 * Usage: bench_storage <scratch-dir> [runs] [warm-mib]
 * Prints one JSON object per line:
 *   {"name": ..., "batch": ..., "ns_per_call": ..., "entries_per_s": ..., "runs_ns_per_call": [...]}
 * Each figure is the median of `runs` runs, after one unmeasured warm-up run
 * per case; every run starts on a fresh data directory so rotation,
 * preallocation and page faults are all paid for.
 * Entries are 100-byte JSON-like records, as in the issue.
 *
 * Right before each timed section, `warm-mib` MiB (default 512, 0 = off) are
 * written to <scratch-dir>/warm-page-allocator.bin in 1 MiB writes and the
 * file is deleted: the VM this runs on backs guest memory lazily and takes
 * freed memory back, so the first touch of a page costs ~10 us and would
 * make the append figures swing by 5x.  See warm_page_allocator in
 * loadtests/benchlib.py.  loadtests/bench_storage.py drives this program.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <fcntl.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comet.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int rm_one(const char *p, const struct stat *sb, int f, struct FTW *w)
{
    (void)sb, (void)f, (void)w;
    return remove(p);
}

static char entry[101];
static unsigned warm_mib = 512;

/* Writes warm_mib MiB to a file with 1 MiB writes and deletes it, so that the
 * timed section that follows allocates from pages the host already backs. */
static void warm_page_allocator(const char *base)
{
    static char chunk[1 << 20];
    char path[512];
    if (warm_mib == 0)
        return;
    snprintf(path, sizeof path, "%s/warm-page-allocator.bin", base);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        perror(path);
        exit(1);
    }
    for (unsigned i = 0; i < warm_mib; i++) {
        if (write(fd, chunk, sizeof chunk) != (ssize_t)sizeof chunk) {
            perror(path);
            exit(1);
        }
    }
    close(fd);
    unlink(path);
}

static comet_stream *fresh(const char *base, int run, comet_db **db)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/run-%d", base, run);
    nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    comet_config cfg;
    comet_config_default(&cfg);
    if (comet_open(dir, &cfg, db)) {
        fprintf(stderr, "open: %s\n", comet_last_error());
        exit(1);
    }
    comet_stream *s;
    if (comet_stream_open(*db, "bench", 5, 1, 1, &s)) {
        fprintf(stderr, "stream: %s\n", comet_last_error());
        exit(1);
    }
    return s;
}

static void done(const char *base, int run, comet_db *db)
{
    char dir[512];
    comet_close(db);
    snprintf(dir, sizeof dir, "%s/run-%d", base, run);
    nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median of v[0..n), leaving v in run order. */
static double median(const double *v, int n)
{
    double s[64];
    memcpy(s, v, (size_t)n * sizeof *v);
    qsort(s, (size_t)n, sizeof *s, cmp_d);
    return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

static void print_runs(const double *v, int n, double scale)
{
    printf(", \"runs_ns_per_call\": [");
    for (int r = 0; r < n; r++)
        printf("%s%.1f", r ? ", " : "", v[r] * scale);
    printf("]}\n");
    fflush(stdout);
}

/* ns per append call of `batch` entries, over `total` entries. */
static double run_append(const char *base, int run, uint32_t batch, uint64_t total)
{
    comet_db *db;
    comet_stream *s = fresh(base, run, &db);
    uint32_t *lens = malloc(batch * sizeof *lens);
    char *buf = malloc((size_t)batch * 100);
    for (uint32_t i = 0; i < batch; i++) {
        lens[i] = 100;
        memcpy(buf + (size_t)i * 100, entry, 100);
    }
    uint64_t calls = total / batch;
    warm_page_allocator(base);
    double t0 = now();
    for (uint64_t i = 0; i < calls; i++) {
        int64_t r = batch == 1 ? comet_append(s, 0, entry, 100, 0, -1)
                               : comet_append_batch(s, 0, buf, lens, NULL, batch, -1);
        if (r < 0) {
            fprintf(stderr, "append: %s\n", comet_last_error());
            exit(1);
        }
    }
    double dt = now() - t0;
    free(lens);
    free(buf);
    done(base, run, db);
    return dt / (double)calls * 1e9;
}

static double run_read(const char *base, int run, uint64_t total)
{
    comet_db *db;
    comet_stream *s = fresh(base, run, &db);
    uint32_t lens[1000];
    char *buf = malloc(100000);
    for (int i = 0; i < 1000; i++) {
        lens[i] = 100;
        memcpy(buf + i * 100, entry, 100);
    }
    for (uint64_t i = 0; i < total / 1000; i++)
        comet_append_batch(s, 0, buf, lens, NULL, 1000, -1);
    static uint8_t data[1 << 20];
    static int32_t offsets[1001];
    static int64_t entries[1000], ts[1000];
    comet_read_request req = {.max_entries = 1000, .data = data, .data_capacity = sizeof data,
                              .offsets = offsets, .entries = entries, .timestamps = ts};
    comet_read_result res;
    warm_page_allocator(base);
    double t0 = now();
    uint64_t got = 0;
    while (got < total) {
        req.from_entry = got;
        if (comet_read(s, 0, &req, &res) || res.count == 0) {
            fprintf(stderr, "read: %s\n", comet_last_error());
            exit(1);
        }
        got += res.count;
    }
    double dt = now() - t0;
    free(buf);
    done(base, run, db);
    return dt / (double)total * 1e9;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s <scratch-dir> [runs] [warm-mib]\n", argv[0]);
        return 2;
    }
    int runs = argc > 2 ? atoi(argv[2]) : 5;
    if (runs < 1 || runs > 64)
        runs = 5;
    if (argc > 3)
        warm_mib = (unsigned)atoi(argv[3]);
    snprintf(entry, sizeof entry, "{\"ts\":1700000000123,\"level\":\"info\",\"svc\":\"edge-gw\","
                                  "\"msg\":\"request served\",\"ms\":12.5,\"ok\":true}      ");
    struct { const char *name; uint32_t batch; uint64_t total; } cases[] = {
        {"c_append_single", 1, 1000000},
        {"c_append_batch_10", 10, 1000000},
        {"c_append_batch_100", 100, 2000000},
        {"c_append_batch_1000", 1000, 2000000},
    };
    double v[64];
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        run_append(argv[1], 0, cases[c].batch, cases[c].total); /* unmeasured warm-up run */
        for (int r = 0; r < runs; r++)
            v[r] = run_append(argv[1], r, cases[c].batch, cases[c].total);
        double m = median(v, runs);
        printf("{\"name\": \"%s\", \"batch\": %u, \"ns_per_call\": %.1f, \"entries_per_s\": %.0f",
               cases[c].name, cases[c].batch, m, 1e9 / m * cases[c].batch);
        print_runs(v, runs, 1);
    }
    run_read(argv[1], 0, 1000000); /* unmeasured warm-up run */
    for (int r = 0; r < runs; r++)
        v[r] = run_read(argv[1], r, 1000000);
    double m = median(v, runs);
    printf("{\"name\": \"c_read_batch_1000\", \"batch\": 1000, \"ns_per_call\": %.1f, "
           "\"entries_per_s\": %.0f", m * 1000, 1e9 / m);
    print_runs(v, runs, 1000);
    return 0;
}
