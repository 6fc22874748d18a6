"""Power-cut tests: the storage on a FUSE filesystem that forgets what was not synced.

fs.py is the filesystem (what is volatile, what a cut does), harness.py mounts
it and cuts and reads what a writer says, writer.py is the storage-using process,
scenarios.py holds the scenarios several tests run, conftest.py the ``powercut``
fixture.  Scenarios: test_always.py, test_groups.py,
test_interval.py, test_lifecycle.py, test_ship.py (``comet ship`` to a
directory), test_spark_ship.py (``comet spark-ship`` to a local lake; its cuts:
POWERCUT_SPARK_CUTS, default 15) (and test_fs.py for the filesystem's own
model); test_regressions.py keeps the scenarios that once found storage bugs.

Needs /dev/fuse, Debian's fuse3 and libfuse3-3 (scripts/install-fuse.sh) and
mfusepy (pyproject's dev extras); runs as root, or unprivileged where user
namespaces are allowed.  POWERCUT_CUTS sets the cuts per scenario (default 30).
"""
