/*
 * bench_json.c - the JSON ingest validator alone (comet_json_split: strict
 * validation, split into events, whitespace removal), against its anchor, a
 * plain memchr split of the same bytes into lines.
 *
 * Usage: bench_json [runs] [mib-per-run]
 * Prints one JSON object per line:
 *   {"name": ..., "body_bytes": ..., "events": ..., "gb_per_s": ..., "runs_gb_per_s": [...]}
 * Bodies are the gateway benchmark's: 100 events of 200 bytes
 * (loadtests/wrk/events.lua), as NDJSON (~20 KB), as a JSON array, and as
 * NDJSON written with spaces after ':' and ',' (Python's json.dumps style),
 * which makes every event take the compaction path.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comet.h"

#define EVENTS 100
#define EVENT_BYTES 200

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* The same event as loadtests/wrk/events.lua; spaced adds ": " and ", ". */
static size_t event(char *out, int seq, int spaced)
{
    const char *colon = spaced ? ": " : ":", *comma = spaced ? ", " : ",";
    char head[256];
    int n = snprintf(head, sizeof head,
                     "{\"ts\"%s%lld%s\"level\"%s\"info\"%s\"service\"%s\"edge-gateway\"%s"
                     "\"host\"%s\"web-%03d\"%s\"method\"%s\"POST\"%s\"path\"%s"
                     "\"/api/v1/orders/%08d\"%s\"status\"%s202%s\"ms\"%s%.3f%s\"user\"%s"
                     "\"u-%06d\"%s\"pad\"%s\"",
                     colon, 1700000000000LL + seq, comma, colon, comma, colon, comma, colon,
                     seq % 1000, comma, colon, comma, colon, seq, comma, colon, comma, colon,
                     (seq % 997) / 7.0, comma, colon, seq % 1000000, comma, colon);
    int pad = EVENT_BYTES - n - 2;
    memcpy(out, head, (size_t)n);
    memset(out + n, 'x', (size_t)(pad > 0 ? pad : 0));
    memcpy(out + n + (pad > 0 ? pad : 0), "\"}", 2);
    return (size_t)n + (size_t)(pad > 0 ? pad : 0) + 2;
}

static size_t body(char *out, int array, int spaced)
{
    size_t len = 0;
    if (array)
        out[len++] = '[';
    for (int i = 1; i <= EVENTS; i++) {
        len += event(out + len, i, spaced);
        if (array && i < EVENTS)
            out[len++] = ',';
        if (!array)
            out[len++] = '\n';
    }
    if (array)
        out[len++] = ']';
    return len;
}

/* The anchor: lines found with memchr, lengths recorded, nothing checked. */
static int64_t memchr_split(const char *buf, size_t len, uint32_t *lens)
{
    const char *p = buf, *end = buf + len;
    int64_t n = 0;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        if (!nl)
            nl = end;
        if (nl > p)
            lens[n++] = (uint32_t)(nl - p);
        p = nl + 1;
    }
    return n;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void run_case(const char *name, const char *buf, size_t len, uint32_t format, int runs,
                     size_t bytes_per_run)
{
    uint8_t *out = malloc(len);
    uint32_t lens[EVENTS * 2];
    comet_ingest_request req = {.body = buf, .len = len, .format = format};
    comet_ingest_result res;
    size_t iters = bytes_per_run / len + 1;
    double rates[64];
    int64_t events = 0;
    for (int r = -1; r < runs; r++) { /* run -1 warms up */
        double t0 = now();
        for (size_t i = 0; i < iters; i++) {
            events = format ? comet_json_split(&req, 0, out, len, lens, EVENTS * 2, &res)
                            : memchr_split(buf, len, lens);
            if (events != EVENTS) {
                fprintf(stderr, "%s: %lld events (%s)\n", name, (long long)events,
                        events < 0 ? res.error_reason : "");
                exit(1);
            }
            __asm__ volatile("" ::: "memory");
        }
        if (r >= 0)
            rates[r] = (double)iters * (double)len / (now() - t0) / 1e9;
    }
    printf("{\"name\": \"%s\", \"body_bytes\": %zu, \"events\": %lld, \"runs_gb_per_s\": [", name, len,
           (long long)events);
    for (int r = 0; r < runs; r++)
        printf("%s%.4f", r ? ", " : "", rates[r]);
    qsort(rates, (size_t)runs, sizeof rates[0], cmp);
    printf("], \"gb_per_s\": %.4f}\n", rates[runs / 2]);
    free(out);
}

int main(int argc, char **argv)
{
    int runs = argc > 1 ? atoi(argv[1]) : 5;
    size_t mib = argc > 2 ? (size_t)atoi(argv[2]) : 512;
    if (runs < 1 || runs > 64)
        runs = 5;
    static char ndjson[64 << 10], array[64 << 10], spaced[64 << 10];
    size_t n = body(ndjson, 0, 0), a = body(array, 1, 0), s = body(spaced, 0, 1);
    run_case("memchr_split_ndjson", ndjson, n, 0, runs, mib << 20);
    run_case("validate_ndjson", ndjson, n, COMET_BODY_NDJSON, runs, mib << 20);
    run_case("validate_array", array, a, COMET_BODY_JSON, runs, mib << 20);
    run_case("validate_ndjson_spaced", spaced, s, COMET_BODY_NDJSON, runs, mib << 20);
    return 0;
}
