/* util.h - helpers for the C tests: scratch directories and small wrappers. */
#ifndef COMET_TEST_UTIL_H
#define COMET_TEST_UTIL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "comet.h"
#include "comet_testing.h"

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p) && errno != ENOENT; /* what vanished meanwhile is not in the way */
}

/* rm -rf, repeated while the directory is still there: a file another thread
 * creates during the walk keeps the first rmdir from succeeding. */
static inline void rm_tree(const char *dir)
{
    struct stat sb;
    for (int pass = 0; pass < 1000 && lstat(dir, &sb) == 0; pass++)
        nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static inline char *scratch_dir(void)
{
    static char buf[256];
    const char *base = getenv("COMET_TEST_TMP") ? getenv("COMET_TEST_TMP") : "/tmp";
    snprintf(buf, sizeof buf, "%s/comet-ctest-XXXXXX", base);
    CHECK(mkdtemp(buf) != NULL);
    return buf;
}

/* A plan of one rule: the nth call of kinds (1 = the next) fails with err,
 * once. */
static inline void fault_once(unsigned kinds, long nth, int err)
{
    comet_fault_clear();
    comet_fault_rule rule = {kinds, nth, 1, err};
    CHECK_OK(comet_fault_add(&rule));
}

static inline comet_db *open_db(const char *dir, uint64_t segment_bytes)
{
    comet_config cfg;
    comet_config_default(&cfg);
    cfg.segment_bytes = segment_bytes;
    cfg.flags |= COMET_OPEN_NO_FLUSHER;
    comet_db *db = NULL;
    CHECK_OK(comet_open(dir, &cfg, &db));
    return db;
}

static inline comet_stream *open_stream(comet_db *db, const char *name, uint32_t shards)
{
    comet_stream *s = NULL;
    CHECK_OK(comet_stream_open(db, name, strlen(name), shards, 1, &s));
    return s;
}

/* Opens shard id in this process (a read does; statistics would not). */
static inline void open_shard(comet_stream *s, uint32_t id)
{
    uint8_t data[256];
    int32_t offsets[2];
    int64_t entries[1], ts[1];
    comet_read_request rq = {0, 1, 0, sizeof data, data, sizeof data, offsets, entries, ts};
    comet_read_result rr;
    CHECK_OK(comet_read(s, id, &rq, &rr));
}

/* Overwrites n bytes of the file at offset `at` (a test planting damage or an
 * older state). */
static inline void rewrite_file(const char *path, long at, const void *bytes, size_t n)
{
    FILE *f = fopen(path, "r+b");
    CHECK(f != NULL);
    CHECK(fseek(f, at, SEEK_SET) == 0 && fwrite(bytes, 1, n, f) == n);
    fclose(f);
}

/* Reads up to max entries from entry `from`; fills payload lengths. */
typedef struct read_buf {
    uint8_t data[1 << 20];
    int32_t offsets[1025];
    int64_t entries[1024];
    int64_t timestamps[1024];
    comet_read_result res;
} read_buf;

static inline int read_some(comet_stream *s, uint32_t shard, uint64_t from, uint32_t max,
                            read_buf *b, uint32_t flags)
{
    comet_read_request req = {.from_entry = from,
                              .max_entries = max > 1024 ? 1024 : max,
                              .flags = flags,
                              .data = b->data,
                              .data_capacity = sizeof b->data,
                              .offsets = b->offsets,
                              .entries = b->entries,
                              .timestamps = b->timestamps};
    return comet_read(s, shard, &req, &b->res);
}

#endif
