/*
 * cutpoint.c - arming the named cut points of cutpoint.h.
 *
 * comet_cut_live starts at 1 so that the first cut point reached reads
 * COMET_CUT_POINT; with nothing armed it drops to 0 for good (until
 * comet_cut_arm), and every later cut point is one relaxed load.  Armed,
 * hits of the armed point are counted process-wide and the nth ends the
 * process with _exit: no atexit handler, no flush, no unmap, like a kill.
 */
#include "cutpoint.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comet.h"
#include "comet_testing.h"

_Atomic int comet_cut_live = 1;

static const char *const cut_names[CUT_COUNT] = {
#define COMET_CUT_NAME(id, name) name,
    COMET_CUT_POINTS(COMET_CUT_NAME)
#undef COMET_CUT_NAME
};

static _Atomic int cut_armed = -1; /* cut_id, -1: none */
static _Atomic long cut_nth;
static _Atomic long cut_hits;
static _Atomic int cut_env_read;

static int cut_lookup(const char *name, size_t len)
{
    for (int i = 0; i < CUT_COUNT; i++)
        if (strlen(cut_names[i]) == len && memcmp(cut_names[i], name, len) == 0)
            return i;
    return -1;
}

/* COMET_CUT_POINT=name[:nth].  An unknown name must not pass for a run that
 * cut nowhere: the process says so and dies with a different status. */
static void read_environment(void)
{
    if (atomic_exchange(&cut_env_read, 1))
        return;
    const char *spec = getenv("COMET_CUT_POINT");
    if (!spec || !*spec) {
        if (atomic_load(&cut_armed) < 0)
            atomic_store(&comet_cut_live, 0);
        return;
    }
    const char *colon = strchr(spec, ':');
    size_t len = colon ? (size_t)(colon - spec) : strlen(spec);
    long nth = colon ? strtol(colon + 1, NULL, 10) : 1;
    int id = cut_lookup(spec, len);
    if (id < 0 || nth < 1) {
        static const char msg[] = "comet: COMET_CUT_POINT names no cut point (see cutpoint.h)\n";
        if (write(2, msg, sizeof msg - 1) < 0) { /* dying anyway */
        }
        _exit(2);
    }
    atomic_store(&cut_hits, 0);
    atomic_store(&cut_nth, nth);
    atomic_store(&cut_armed, id);
}

void cut_point_hit(cut_id id)
{
    read_environment();
    if (atomic_load(&cut_armed) != (int)id)
        return;
    if (atomic_fetch_add(&cut_hits, 1) + 1 != atomic_load(&cut_nth))
        return;
    /* The test reads this line to tell the cut point from any other death. */
    char line[96] = "comet: cut point ";
    size_t n = strlen(line), len = strlen(cut_names[id]);
    memcpy(line + n, cut_names[id], len);
    line[n + len] = '\n';
    if (write(2, line, n + len + 1) < 0) { /* dying anyway */
    }
    _exit(COMET_CUT_EXIT);
}

int comet_cut_arm(const char *name, long nth)
{
    atomic_store(&cut_env_read, 1); /* an explicit arming wins over the environment */
    if (!name) {
        atomic_store(&cut_armed, -1);
        atomic_store(&comet_cut_live, 0);
        return 0;
    }
    int id = cut_lookup(name, strlen(name));
    if (id < 0 || nth < 1)
        return COMET_E_INVALID;
    atomic_store(&cut_hits, 0);
    atomic_store(&cut_nth, nth);
    atomic_store(&cut_armed, id);
    atomic_store(&comet_cut_live, 1);
    return 0;
}

int comet_cut_reached(const char *name)
{
    int id = name ? cut_lookup(name, strlen(name)) : -1;
    if (id < 0)
        return COMET_E_INVALID;
    cut_point((cut_id)id);
    return 0;
}

const char *comet_cut_point_name(int i)
{
    return i >= 0 && i < CUT_COUNT ? cut_names[i] : NULL;
}

long comet_cut_hits(void)
{
    return atomic_load(&cut_hits);
}
