"""Power-cut tests: the storage on a FUSE filesystem that forgets what was not synced.

fs.py is the filesystem (what is volatile, what a cut does), harness.py mounts
it and cuts and reads what a writer says, writer.py is the storage-using process,
scenarios.py holds the scenarios several tests run, checks.py the checks of what
survived, conftest.py the ``powercut`` fixture.  Scenarios: test_always.py,
test_cutpoints.py (a cut at each named cut point of the core, and during
recovery), test_fsyncgate.py (a failed sync), test_groups.py,
test_interval.py, test_lifecycle.py, test_ship.py (``comet ship`` to a
directory), test_spark_ship.py (``comet spark-ship`` to a local lake; its cuts:
POWERCUT_SPARK_CUTS, default 15) (and test_fs.py for the filesystem's own
model); test_regressions.py keeps the scenarios that once found storage bugs.

Needs /dev/fuse, Debian's fuse3 and libfuse3-3 (scripts/install-fuse.sh) and
mfusepy (pyproject's dev extras); runs as root, or unprivileged where user
namespaces are allowed.  POWERCUT_CUTS sets the cuts per scenario (default 30),
COMET_POWERCUT_ROUNDS how often test_cutpoints.py goes round its points (default 1;
more for a longer run offline).  The random schedules change with every run: their
seed is printed in the session's header and in every failure, and
COMET_POWERCUT_SEED=<seed> replays it.

Named cut points: storage_c/src/port/cutpoint.h lists them (the one list; the tests
read it through ``storage_c.testing.cut_point_names``) and says where each sits:
append.mid_batch, append.written, grow.sized, rotate.created, rotate.started,
recovery.zeroed, recovery.set_aside, retention.unlinked, retention.deleted,
offsets.acked, offsets.syncing.  ``COMET_CUT_POINT=name:nth`` in a process's
environment ends it (``_exit(78)``, "comet: cut point NAME" on stderr) at the nth
hit of that point; the harness then cuts the power.
"""
