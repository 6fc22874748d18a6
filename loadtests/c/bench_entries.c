/*
 * bench_entries.c - what writing a batch of entries costs the CPU alone, with
 * no page cache in the way: the part of issue 14's "within 3x of the
 * warm-page floor" that no choice about pages can remove.
 *
 *   cc -O2 -std=c11 -D_GNU_SOURCE -Istorage_c/include -Istorage_c/src \
 *      loadtests/c/bench_entries.c storage_c/src/log/entry.c storage_c/src/port/crc32c.c \
 *      -o /tmp/bench_entries && /tmp/bench_entries [ROUNDS] [MiB]
 *
 * Every case writes batches of N entries (1000 x ~110 B and 100 x ~98 B, the
 * payloads of loadtests/bench_storage.py, each entry its own buffer as the
 * Python API hands them over) round-robin into one 64 MiB anonymous mapping,
 * pre-faulted and written first: the destination of bench_storage.py's
 * warm-page floor.  Cases, ns per call:
 *   floor    one memcpy of the batch's stored bytes, joined beforehand (the
 *            anchor: bench_storage.py's floor, without its Python call)
 *   copy     one memcpy per entry from its own buffer to its place, nothing
 *            else: no header, no checksum
 *   crc      the entries' CRC32C alone (four chains, as the writer runs them),
 *            nothing stored
 *   entries  the core's writer, entry_write_group (entry.c): header, payload
 *            copy and CRC32C of every entry, four at a time, as an append
 *            does under the shard lock
 * Median of ROUNDS (default 5) rounds of MiB (default 1024) each, cases
 * interleaved.  Prints a table, then one JSON object per case.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "log/log.h"

#define RING_BYTES (64u << 20)
#define MAX_ROUNDS 15
#define MAX_BATCH 1000

enum { FLOOR, COPY, CRC, ENTRIES, CASES };
static const char *const NAMES[CASES] = {"floor", "copy", "crc", "entries"};

typedef struct batch {
    uint32_t n, stored;
    entry_ref refs[MAX_BATCH];
    uint32_t flags[MAX_BATCH];
    uint8_t *joined; /* the stored bytes of one call, for the floor */
} batch;

static double clock_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

/* bench_storage.py's payloads: a JSON log line of size +-4 B around mean. */
static void batch_make(batch *b, uint32_t n, uint32_t mean)
{
    b->n = n;
    b->stored = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t len = mean + (i % 9) - 4;
        uint8_t *p = malloc(len);
        int head = snprintf((char *)p, len, "{\"ts\":%u,\"seq\":%u,\"level\":\"info\",\"msg\":\"",
                            1700000000u + i, i);
        memset(p + head, 'r', len - (uint32_t)head - 2);
        memcpy(p + len - 2, "\"}", 2);
        b->refs[i] = (entry_ref){p, len, 0};
        b->flags[i] = 0;
        b->stored += ENTRY_HEADER_BYTES + len;
    }
    b->joined = malloc(b->stored);
    uint64_t off = 0;
    for (uint32_t i = 0; i < n; i += 4)
        off += entry_write_group(b->joined + off, 2, b->refs + i, n - i < 4 ? n - i : 4, i, 1, b->flags + i);
}

static volatile uint32_t sink;

static double run_case(int which, const batch *b, uint8_t *ring, uint64_t calls)
{
    uint64_t off = 0;
    uint32_t reg[4] = {0};
    double t0 = clock_ns();
    for (uint64_t c = 0; c < calls; c++) {
        if (off + b->stored > RING_BYTES)
            off = 0;
        uint8_t *dst = ring + off;
        switch (which) {
        case FLOOR:
            memcpy(dst, b->joined, b->stored);
            break;
        case COPY:
            for (uint32_t i = 0, o = 0; i < b->n; i++) {
                memcpy(dst + o + ENTRY_HEADER_BYTES, b->refs[i].data, b->refs[i].len);
                o += ENTRY_HEADER_BYTES + b->refs[i].len;
            }
            break;
        case CRC:
            for (uint32_t i = 0; i + 4 <= b->n; i += 4) {
                const uint8_t *p[4];
                size_t n[4];
                for (int k = 0; k < 4; k++) {
                    p[k] = b->refs[i + k].data;
                    n[k] = b->refs[i + k].len;
                }
                crc32c_extend4(reg, p, n);
            }
            break;
        case ENTRIES:
            for (uint32_t i = 0, o = 0; i < b->n; i += 4)
                o += (uint32_t)entry_write_group(dst + o, 2, b->refs + i, b->n - i < 4 ? b->n - i : 4,
                                                 c * b->n + i, 1, b->flags + i);
            break;
        }
        off += b->stored;
    }
    sink = reg[0] ^ ring[off / 2];
    return (clock_ns() - t0) / (double)calls;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 5;
    uint64_t bytes = (argc > 2 ? strtoull(argv[2], NULL, 10) : 1024) << 20;
    if (rounds < 1 || rounds > MAX_ROUNDS || bytes == 0) {
        fprintf(stderr, "usage: %s [ROUNDS 1-%d] [MiB]\n", argv[0], MAX_ROUNDS);
        return 2;
    }
    uint8_t *ring = mmap(NULL, RING_BYTES, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (ring == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    memset(ring, 1, RING_BYTES);
    static batch batches[2];
    batch_make(&batches[0], 1000, 110);
    batch_make(&batches[1], 100, 98);
    double ns[2][CASES][MAX_ROUNDS];
    for (int r = 0; r < rounds; r++)
        for (int bi = 0; bi < 2; bi++)
            for (int c = 0; c < CASES; c++)
                ns[bi][c][r] = run_case(c, &batches[bi], ring, bytes / batches[bi].stored);
    printf("| entries per call | case | ns per call (median of %d) | ÷ floor |\n|---|---|---|---|\n",
           rounds);
    double med[2][CASES];
    for (int bi = 0; bi < 2; bi++)
        for (int c = 0; c < CASES; c++) {
            qsort(ns[bi][c], (size_t)rounds, sizeof(double), cmp_double);
            med[bi][c] = ns[bi][c][rounds / 2];
            printf("| %u | %s | %.0f | %.2fx |\n", batches[bi].n, NAMES[c], med[bi][c],
                   med[bi][c] / med[bi][FLOOR]);
        }
    for (int bi = 0; bi < 2; bi++)
        for (int c = 0; c < CASES; c++)
            printf("{\"entries\": %u, \"case\": \"%s\", \"ns_per_call\": %.1f, \"ratio_to_floor\": %.3f, "
                   "\"min\": %.1f, \"max\": %.1f, \"rounds\": %d, \"mib\": %llu}\n",
                   batches[bi].n, NAMES[c], med[bi][c], med[bi][c] / med[bi][FLOOR], ns[bi][c][0],
                   ns[bi][c][rounds - 1], rounds, (unsigned long long)(bytes >> 20));
    return 0;
}
