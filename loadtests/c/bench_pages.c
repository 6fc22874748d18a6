/*
 * bench_pages.c - what a segment's page costs the writer, by how the page got
 * there: the measurement behind recycled segments (storage_c/src/log/recycle.c).
 *
 *   cc -O2 -pthread loadtests/c/bench_pages.c -o /tmp/bench_pages && /tmp/bench_pages DIR [MiB]
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
 *   populate-thread, recycled-thread
 *               fresh / recycled, with a second thread faulting each MiB in
 *               (MADV_POPULATE_WRITE) up to PREFAULT_AHEAD MiB ahead of the
 *               stores: the writer's time falls, the CPU the process spends
 *               does not (the "cpu" column: both threads, ns per page)
 * Prints a table, then one JSON object per case.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
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
#define PREFAULT_AHEAD 8
#define MIB (1ul << 20)

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static double cpu_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static char src[PAGE];

/* The prefault thread: MiB by MiB, at most PREFAULT_AHEAD ahead of the writer. */
typedef struct prefault {
    char *map;
    size_t bytes;
    _Atomic size_t written, faulted;
} prefault;

static void *prefault_ahead(void *arg)
{
    prefault *pf = arg;
    for (size_t off = 0; off < pf->bytes; off += MIB) {
        while (off >= atomic_load(&pf->written) + PREFAULT_AHEAD * MIB)
            sched_yield();
        madvise(pf->map + off, MIB, MADV_POPULATE_WRITE);
        atomic_store(&pf->faulted, off + MIB);
    }
    return NULL;
}

static void store_pages_threaded(char *map, size_t bytes)
{
    prefault pf = {.map = map, .bytes = bytes};
    pthread_t t;
    pthread_create(&t, NULL, prefault_ahead, &pf);
    for (size_t off = 0; off < bytes; off += PAGE) {
        memcpy(map + off, src, PAGE);
        if (off % MIB == 0)
            atomic_store(&pf.written, off);
    }
    pthread_join(t, NULL);
}

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

static double run_case(const char *dir, const char *name, size_t bytes, double *cpu)
{
    int threaded = strstr(name, "-thread") != NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/bench_pages.%s", dir, name);
    int fd = open_sized(path, bytes);
    char *map = NULL;
    if (!strncmp(name, "recycled", 8) || !strcmp(name, "floor")) {
        map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        store_pages(map, bytes, 0);
        if (strcmp(name, "floor")) { /* an earlier life, synced and unmapped */
            fdatasync(fd);
            munmap(map, bytes);
        }
    }
    double t = now_ns(), c = cpu_ns();
    if (!strcmp(name, "zero-ahead")) {
        static char zeros[MIB];
        for (size_t off = 0; off < bytes; off += MIB)
            if (pwrite(fd, zeros, MIB, (off_t)off) != (ssize_t)MIB)
                exit(1);
    }
    if (strcmp(name, "floor"))
        map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    else
        t = now_ns(), c = cpu_ns(); /* the floor: the pages are mapped and dirty already */
    if (threaded)
        store_pages_threaded(map, bytes);
    else
        store_pages(map, bytes, !strcmp(name, "populate"));
    double ns = (now_ns() - t) / (double)(bytes / PAGE);
    *cpu = (cpu_ns() - c) / (double)(bytes / PAGE);
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
    const char *names[] = {"floor", "fresh", "zero-ahead", "populate", "recycled",
                           "populate-thread", "recycled-thread"};
    enum { CASES = sizeof names / sizeof names[0] };
    double ns[CASES], cpu[CASES];
    for (int i = 0; i < CASES; i++)
        ns[i] = run_case(argv[1], names[i], bytes, &cpu[i]);
    printf("| case | ns per 4 KiB page (writer) | ÷ warm floor | cpu ns per page (process) |\n"
           "|---|---|---|---|\n");
    for (int i = 0; i < CASES; i++)
        printf("| %s | %.0f | %.2fx | %.0f |\n", names[i], ns[i], ns[i] / ns[0], cpu[i]);
    for (int i = 0; i < CASES; i++)
        printf("{\"case\": \"%s\", \"ns_per_page\": %.1f, \"ratio_to_floor\": %.3f, "
               "\"cpu_ns_per_page\": %.1f, \"mib\": %zu}\n",
               names[i], ns[i], ns[i] / ns[0], cpu[i], bytes / MIB);
    return 0;
}
