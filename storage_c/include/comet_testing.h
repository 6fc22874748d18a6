/*
 * comet_testing.h - the test hooks of the Comet storage core: injected
 * faults, a movable clock and named cut points.
 *
 * They live apart from comet.h so that the interface a program uses says
 * nothing of them: a production process never arms them, and disarmed they
 * cost one predictable branch per system call or cut point.  The tests (C
 * and Python, storage_c/testing.py) and the shippers' own cut points
 * (comet_cut_reached) are their only callers.
 */
#ifndef COMET_TESTING_H
#define COMET_TESTING_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Testing: injected faults and a movable clock (port/sys.c) ----------
 * Every call the core makes to the operating system goes through one table
 * (src/port/sys.h).  A fault plan is a set of rules, all in force at once: each
 * counts the calls of its `kinds` from the moment it is added, and makes the
 * nth of them (1 = the next) and the count - 1 after it fail with `err`, or
 * every later one when count is 0 (a disk that stays broken).  comet_clock_shift
 * moves both clocks the core reads (cumulative), to age data without
 * sleeping.  Process-wide and for tests: a production process never arms them. */
#define COMET_FAULT_OPEN 0x01u    /* open, opendir */
#define COMET_FAULT_SIZE 0x02u    /* fallocate, ftruncate, pwrite */
#define COMET_FAULT_MAP 0x04u     /* mmap */
#define COMET_FAULT_SYNC 0x08u    /* msync, fdatasync, fsync */
#define COMET_FAULT_NAME 0x10u    /* rename, link, mkdir */
#define COMET_FAULT_REMOVE 0x20u  /* unlink, rmdir */
#define COMET_FAULT_READDIR 0x40u /* readdir */
#define COMET_FAULT_ALLOC 0x80u   /* malloc, calloc, realloc */
#define COMET_FAULT_READ 0x100u   /* pread */
#define COMET_FAULT_WRITE 0x200u  /* pwrite (also a SIZE call) */
#define COMET_FAULT_UNMAP 0x400u  /* munmap, madvise */
#define COMET_FAULT_CLOSE 0x800u  /* close, closedir */
#define COMET_FAULT_STAT 0x1000u  /* fstat, stat, statvfs */
#define COMET_FAULT_LOCK 0x2000u  /* flock, fcntl record locks */
#define COMET_FAULT_ALL 0x3FFFu
/* err COMET_FAULT_CRASH: the process dies at that call instead (_exit with
 * COMET_FAULT_CRASH_EXIT, before the call is made), as a kill -9 there would
 * leave it: what it wrote through its mappings stays, the rest never happens. */
#define COMET_FAULT_CRASH (-1)
#define COMET_FAULT_CRASH_EXIT 77
/* err COMET_FAULT_SHORT: a read or write (READ, WRITE kinds) moves half of
 * the bytes asked (at least one) and returns that count, as a signal or a
 * full disk can make it; calls of other kinds, and of one byte, are not
 * shortened (and not counted as fired).  err EINTR: the call is interrupted
 * before it starts; the core retries it (except close, which Linux has
 * closed already), so the operation must succeed as if nothing happened. */
#define COMET_FAULT_SHORT (-2)
#define COMET_FAULT_MAX_RULES 16
typedef struct comet_fault_rule {
    unsigned kinds; /* COMET_FAULT_* mask */
    long nth;       /* the first call to fail, among this rule's kinds (1 = the next) */
    long count;     /* calls failing from the nth on; 0: every later one */
    int err;        /* an errno value, COMET_FAULT_CRASH or COMET_FAULT_SHORT */
} comet_fault_rule;
/* Adds a rule to the plan: 0, or COMET_E_INVALID when the plan is full, the
 * rule has no kind, or it asks EINTR for ever (the core retries EINTR, so it
 * would never return). */
int comet_fault_add(const comet_fault_rule *rule);
/* Removes every rule; comet_fault_calls/fired keep their values until the
 * next add. */
void comet_fault_clear(void);
long comet_fault_calls(void); /* calls counted by the plan's rules since they were added */
long comet_fault_fired(void); /* of those, how many were made to fail (or were shortened) */
void comet_clock_shift(int64_t ns);

/* ---- Testing: named cut points (src/port/cutpoint.h) --------------------
 * Steps of the core where a power cut hurts most (mid-append, mid-growth,
 * mid-rotation, recovery's repair, retention's unlinks, offset writes) carry
 * a named cut point.  comet_cut_arm(name, nth): the nth hit of that point
 * ends the process at once, _exit(COMET_CUT_EXIT), after writing
 * "comet: cut point NAME" to stderr; name NULL disarms.  COMET_E_INVALID for an
 * unknown name.  The environment does the same without code:
 * COMET_CUT_POINT=name:nth, read at the first cut point reached.
 * comet_cut_point_name(i) lists the names (NULL past the last);
 * comet_cut_hits counts hits of the armed point.  Process-wide, for tests. */
#define COMET_CUT_EXIT 78
int comet_cut_arm(const char *name, long nth);
/* Code above the core (the shippers, in Python) reaching its own named cut
 * point: the same arming, the same death.  COMET_E_INVALID for no such name. */
int comet_cut_reached(const char *name);
const char *comet_cut_point_name(int i);
long comet_cut_hits(void);

#ifdef __cplusplus
}
#endif
#endif /* COMET_TESTING_H */
