/*
 * cutpoint.h - named cut points: the steps of the core where a power cut
 * hurts most, and the one list of their names.
 *
 * A power-cut test wants the process to die at a chosen step (a segment
 * grown but its header not yet saying so, a rotation half done, recovery
 * between its zero-fill and its new commit point), not only at random
 * moments.  Each step calls cut_point(CUT_X); armed, the nth hit of the
 * chosen point ends the process at once with _exit(COMET_CUT_EXIT), as a
 * kill -9 there would: what it wrote through its mappings stays in the page
 * cache, nothing after the point happens.  The test then cuts the power
 * (tests/powercut) and a fresh process recovers.
 *
 * Armed from the environment, COMET_CUT_POINT=name:nth (read once, at the
 * first cut point a process reaches; nth 1 = the first hit, default 1), or
 * with comet_cut_arm (comet_testing.h).  Disarmed - always, in production -
 * a cut point costs one relaxed load of a zero word.
 *
 * The list (name, then where it sits and what is half done there).  Adding
 * a point: a line here, one call at the step, and tests/powercut picks it
 * up through comet_cut_point_name (test_cutpoints.py runs every name).
 */
#ifndef COMET_CUTPOINT_H
#define COMET_CUTPOINT_H

#include <stdatomic.h>

#define COMET_CUT_POINTS(X)                                                                        \
    /* append.c shard_append: a batch's first group of entries written through the mapping,     \
     * the rest not, the commit point (next_entry) not moved: a torn batch */                   \
    X(APPEND_MID_BATCH, "append.mid_batch")                                                        \
    /* append.c shard_append: a keyed batch's key recorded (keys.c), none of its entries        \
     * written: the lock holder dies with a record naming entries not there */                 \
    X(APPEND_KEYED, "append.keyed")                                                                \
    /* append.c shard_append: every entry of the batch written, next_entry not moved yet */      \
    X(APPEND_WRITTEN, "append.written")                                                            \
    /* segment.c segment_grow: the file preallocated to the next chunk, the header still        \
     * announcing the old capacity */                                                           \
    X(GROW_SIZED, "grow.sized")                                                                    \
    /* append.c make_room: the new segment created (file, index, name synced), the state        \
     * still naming the old segment active */                                                   \
    X(ROTATE_CREATED, "rotate.created")                                                            \
    /* append.c make_room: the state names the new segment active, nothing written in it */     \
    X(ROTATE_STARTED, "rotate.started")                                                            \
    /* recovery.c apply_cut: the bytes after the cut point zero-filled (when there were any),   \
     * the new commit point not written */                                                      \
    X(RECOVERY_ZEROED, "recovery.zeroed")                                                          \
    /* recovery.c set_aside: a segment past the log's end being set aside: its index unlinked, \
     * the segment not yet renamed (.orphan, the spare) or unlinked; earlier ones of the same   \
     * repair (nth > 1) done; the commit point not written */                                   \
    X(RECOVERY_SET_ASIDE, "recovery.set_aside")                                                    \
    /* retention.c delete_segment: a segment unlinked (or kept as the spare), its index not */  \
    X(RETENTION_UNLINKED, "retention.unlinked")                                                    \
    /* retention.c retention_shard: the segments deleted, first_entry not moved past them */    \
    X(RETENTION_DELETED, "retention.deleted")                                                      \
    /* offsets.c advance: a group's offset stored in the mapped offsets file, its ack           \
     * counters not */                                                                          \
    X(OFFSETS_ACKED, "offsets.acked")                                                              \
    /* offsets.c offsets_sync: the offsets file about to be fdatasynced */                      \
    X(OFFSETS_SYNCING, "offsets.syncing")                                                          \
    /* The points of the shippers above the core, reached from Python through                   \
     * comet_cut_reached (consumers/forward.py).  A batch cut by age recorded durably in the     \
     * forwarder's intents, not sent: */                                                        \
    X(SHIP_RECORDED, "ship.recorded")                                                              \
    /* a batch delivered (the endpoint answered 2xx), the group's offset not moved */           \
    X(SHIP_DELIVERED, "ship.delivered")                                                            \
    /* the group's offset moved past delivered batches (in the mapping), not synced */          \
    X(SHIP_ACKED, "ship.acked")                                                                    \
    /* The steps of a comet spark-ship run, reached from Python the same way (the driver,       \
     * spark_jobs/spark/ship.py).  Its plan written, no task started: */                        \
    X(SPARK_SHIP_PLANNED, "spark_ship.planned")                                                    \
    /* every task's Parquet files written, the run's schema not settled */                      \
    X(SPARK_SHIP_WRITTEN, "spark_ship.written")                                                    \
    /* the schema settled, its columns added, the plan rewritten resolved; nothing committed */ \
    X(SPARK_SHIP_RESOLVED, "spark_ship.resolved")                                                  \
    /* the rejects table's commit made (or the table created), the main table's not */          \
    X(SPARK_SHIP_COMMITTING, "spark_ship.committing")                                              \
    /* the main table's commit made, the group not acked */                                     \
    X(SPARK_SHIP_COMMITTED, "spark_ship.committed")                                                \
    /* the group acked in every shard of the run's ranges but the last */                       \
    X(SPARK_SHIP_ACKING, "spark_ship.acking")

typedef enum cut_id {
#define COMET_CUT_ENUM(id, name) CUT_##id,
    COMET_CUT_POINTS(COMET_CUT_ENUM)
#undef COMET_CUT_ENUM
        CUT_COUNT
} cut_id;

/* Nonzero while the environment is unread or a point is armed. */
extern _Atomic int comet_cut_live;

void cut_point_hit(cut_id id);

/* Whether a cut point may fire: a loop over a batch loads it once. */
static inline int cut_points_live(void)
{
    return atomic_load_explicit(&comet_cut_live, memory_order_relaxed);
}

static inline void cut_point(cut_id id)
{
    if (cut_points_live())
        cut_point_hit(id);
}

#endif /* COMET_CUTPOINT_H */
