/*
 * bench_pages.c - what a segment's page costs the writer, by how the page got
 * there: the measurement behind recycled segments (storage_c/src/recycle.c).
 *
 *   cc -O2 loadtests/c/bench_pages.c -o /tmp/bench_pages && /tmp/bench_pages DIR [MiB]
 *
 * Each case writes MiB (default 256) of 4 KiB pages through a shared mapping
 * of a file in DIR, the way an append does, and reports ns per page; the
 * anchor, measured in the same run, is the warm floor: the same stores into
 * pages already mapped and dirty.  Cases:
 *   fresh       fallocate'd file, first store to each page (unwritten extents)
 *   zero-ahead  the same after pwrite of zeros over the file (what the core
 *               does for a fresh segment: zero_ahead in append.c); the
 *               pwrite is counted
 *   populate    fallocate'd file, MADV_POPULATE_WRITE per MiB ahead of the
 *               stores (the prefault-ahead alternative), counted
 *   recycled    a file written and synced before (a recycled segment: its
 *               blocks are written, its pages cached), a new mapping
 * Prints a table, then one JSON object per case.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#define PAGE 4096
#define MIB (1ul << 20)

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static char src[PAGE];

/* Stores every page of the mapping; with populate, prefaults each MiB first. */
static void store_pages(char *map, size_t bytes, int populate)
{
    for (size_t off = 0; off < bytes; off += PAGE) {
        if (populate && off % MIB == 0)
            madvise(map + off, MIB, MADV_POPULATE_WRITE);
        memcpy(map + off, src, PAGE);
    }
}

static int open_sized(const char *path, size_t bytes)
{
    unlink(path);
    int fd = open(path, O_RDWR | O_CREAT, 0644);
    if (fd < 0 || posix_fallocate(fd, 0, (off_t)bytes)) {
        perror(path);
        exit(1);
    }
    return fd;
}

static double run_case(const char *dir, const char *name, size_t bytes)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/bench_pages.%s", dir, name);
    int fd = open_sized(path, bytes);
    char *map = NULL;
    if (!strcmp(name, "recycled") || !strcmp(name, "floor")) {
        map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        store_pages(map, bytes, 0);
        if (!strcmp(name, "recycled")) { /* an earlier life, synced and unmapped */
            fdatasync(fd);
            munmap(map, bytes);
        }
    }
    double t = now_ns();
    if (!strcmp(name, "zero-ahead")) {
        static char zeros[MIB];
        for (size_t off = 0; off < bytes; off += MIB)
            if (pwrite(fd, zeros, MIB, (off_t)off) != (ssize_t)MIB)
                exit(1);
    }
    if (strcmp(name, "floor"))
        map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    else
        t = now_ns(); /* the floor: the pages are mapped and dirty already */
    store_pages(map, bytes, !strcmp(name, "populate"));
    double ns = (now_ns() - t) / (double)(bytes / PAGE);
    munmap(map, bytes);
    close(fd);
    unlink(path);
    return ns;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s DIR [MiB]\n", argv[0]);
        return 2;
    }
    size_t bytes = (argc > 2 ? strtoul(argv[2], NULL, 10) : 256) * MIB;
    memset(src, 'x', sizeof src);
    const char *names[] = {"floor", "fresh", "zero-ahead", "populate", "recycled"};
    double ns[5];
    for (int i = 0; i < 5; i++)
        ns[i] = run_case(argv[1], names[i], bytes);
    printf("| case | ns per 4 KiB page | ÷ warm floor |\n|---|---|---|\n");
    for (int i = 0; i < 5; i++)
        printf("| %s | %.0f | %.2fx |\n", names[i], ns[i], ns[i] / ns[0]);
    for (int i = 0; i < 5; i++)
        printf("{\"case\": \"%s\", \"ns_per_page\": %.1f, \"ratio_to_floor\": %.3f, \"mib\": %zu}\n",
               names[i], ns[i], ns[i] / ns[0], bytes / MIB);
    return 0;
}
