/* Fuzzing of every on-disk and in-memory parser, under the sanitizers:
 * random damage to segment, index, state and metadata files, and random
 * batch framings.  The log may lose damaged entries, but it must never crash,
 * never return an entry that differs from what was written under that number,
 * and must keep accepting appends. */
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>

#include "util.h"

#define ENTRIES 600
static read_buf rb;
static uint32_t rng_state = 12345;

static uint32_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 17;
    rng_state ^= rng_state << 5;
    return rng_state;
}

static void payload_for(uint64_t i, uint8_t *out, uint32_t *len)
{
    *len = (uint32_t)(i * 31 % 400);
    for (uint32_t k = 0; k < *len; k++)
        out[k] = (uint8_t)(i * 7 + k);
}

static comet_db *open_small(const char *dir)
{
    comet_config cfg;
    comet_config_default(&cfg);
    cfg.segment_bytes = 64 << 10;
    cfg.index_interval_bytes = 256;
    cfg.flags |= COMET_OPEN_NO_FLUSHER;
    comet_db *db = NULL;
    CHECK_OK(comet_open(dir, &cfg, &db));
    return db;
}

static void build(const char *dir)
{
    comet_db *db = open_small(dir);
    comet_stream *s = open_stream(db, "f", 1);
    for (uint64_t e = 0; e < ENTRIES;) {
        uint8_t buf[64 * 400];
        uint32_t lens[64], n = 1 + rnd() % 8, used = 0;
        for (uint32_t i = 0; i < n && e + i < ENTRIES; i++) {
            payload_for(e + i, buf + used, &lens[i]);
            used += lens[i];
        }
        if (e + n > ENTRIES)
            n = (uint32_t)(ENTRIES - e);
        CHECK(comet_append_batch(s, 0, buf, lens, NULL, n, -1, COMET_APPEND_WAIT) == (int64_t)e);
        e += n;
    }
    comet_close(db);
}

static void damage_file(const char *path)
{
    int fd = open(path, O_RDWR);
    if (fd < 0)
        return;
    struct stat sb;
    fstat(fd, &sb);
    if (sb.st_size == 0) {
        close(fd);
        return;
    }
    uint32_t kind = rnd() % 4;
    if (kind == 0) { /* truncate somewhere */
        CHECK(ftruncate(fd, (off_t)(rnd() % (uint32_t)sb.st_size)) == 0);
    } else { /* flip bytes, write garbage runs */
        uint32_t flips = 1 + rnd() % (kind == 1 ? 3 : 200);
        off_t span = sb.st_size < 20000 ? sb.st_size : 20000;
        off_t base = (off_t)(rnd() % (uint32_t)sb.st_size);
        for (uint32_t i = 0; i < flips; i++) {
            uint8_t b = (uint8_t)rnd();
            off_t at = kind == 3 ? base + (off_t)i : (off_t)(rnd() % (uint32_t)span);
            if (at < sb.st_size)
                CHECK(pwrite(fd, &b, 1, at) == 1);
        }
    }
    close(fd);
}

static void check_contents(comet_stream *s)
{
    uint64_t from = 0;
    for (int rounds = 0; rounds < 10000; rounds++) {
        int rc = read_some(s, 0, from, 1024, &rb, 0);
        CHECK(rc == 0);
        for (uint32_t i = 0; i < rb.res.count; i++) {
            uint8_t want[512];
            uint32_t len;
            uint64_t e = (uint64_t)rb.entries[i];
            if (e >= ENTRIES)
                continue; /* appended after the damage */
            payload_for(e, want, &len);
            CHECK((uint32_t)(rb.offsets[i + 1] - rb.offsets[i]) == len);
            CHECK(memcmp(rb.data + rb.offsets[i], want, len) == 0);
        }
        if (rb.res.next_entry == from || rb.res.next_entry >= rb.res.limit_entry)
            break;
        from = rb.res.next_entry;
    }
}

/* A random file of the shard whose name ends with suffix (or the named file). */
static int pick_file(const char *dir, const char *suffix, char *out, size_t cap)
{
    char shard[512];
    snprintf(shard, sizeof shard, "%s/f/shard-0000", dir);
    DIR *d = opendir(shard);
    CHECK(d != NULL);
    char names[64][64];
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) && n < 64) {
        size_t len = strlen(de->d_name), sl = strlen(suffix);
        if (len > sl && len < 64 && strcmp(de->d_name + len - sl, suffix) == 0)
            strcpy(names[n++], de->d_name);
    }
    closedir(d);
    if (n == 0)
        return -1;
    snprintf(out, cap, "%s/%s", shard, names[rnd() % (uint32_t)n]);
    return 0;
}

static void test_damaged_files(void)
{
    for (int iter = 0; iter < 150; iter++) {
        char *dir = scratch_dir();
        build(dir);
        char path[700];
        int v = (int)(rnd() % 4);
        if (v == 0)
            CHECK(pick_file(dir, ".log", path, sizeof path) == 0);
        else if (v == 1)
            CHECK(pick_file(dir, ".idx", path, sizeof path) == 0);
        else
            snprintf(path, sizeof path, "%s/%s", dir, v == 2 ? "f/shard-0000/state" : "f/stream.meta");
        damage_file(path);
        if (rnd() % 3 == 0)
            damage_file(path);
        comet_db *db = open_small(dir);
        comet_stream *s = NULL;
        int rc = comet_stream_open(db, "f", 1, 0, 0, &s);
        if (rc == 0) {
            check_contents(s);
            comet_verify_report vr;
            CHECK_OK(comet_verify_shard(s, 0, &vr));
            int64_t next = comet_append(s, 0, "after", 5, 0, -1, COMET_APPEND_WAIT);
            CHECK_OK(next);
            CHECK_OK(read_some(s, 0, (uint64_t)next, 1, &rb, 0));
            CHECK(rb.res.count == 1 && rb.offsets[1] == 5 && memcmp(rb.data, "after", 5) == 0);
        } else {
            /* only the stream's metadata file can make a stream unopenable */
            CHECK(v == 3 && (rc == COMET_E_CORRUPT || rc == COMET_E_FORMAT_VERSION));
        }
        comet_close(db);
        rm_tree(dir);
    }
}

static void test_random_delimited(void)
{
    char *dir = scratch_dir();
    comet_db *db = open_small(dir);
    comet_stream *s = open_stream(db, "m", 1);
    uint8_t buf[600];
    int accepted = 0;
    for (int iter = 0; iter < 20000; iter++) {
        size_t len = rnd() % sizeof buf;
        for (size_t i = 0; i < len; i++)
            buf[i] = (uint8_t)rnd();
        uint32_t count = 0;
        int64_t r = comet_append_delimited(s, 0, buf, len, (uint8_t)(rnd() % 4), (int)(rnd() % 2),
                                           0, -1, COMET_APPEND_WAIT, &count);
        CHECK(r >= 0 || r == COMET_E_INVALID);
        accepted += r >= 0;
    }
    CHECK(accepted > 0);
    comet_verify_report vr;
    CHECK_OK(comet_verify_shard(s, 0, &vr));
    CHECK(vr.bad_entries == 0);
    comet_close(db);
    rm_tree(dir);
}

int main(void)
{
    RUN(test_damaged_files);
    RUN(test_random_delimited);
    return 0;
}
