"""Power-cut scenarios that found storage bugs, kept as regression tests.

Each docstring says what failed before the fix; the fixes:
shard and data directories synced when created; a segment's file synced
before its name is linked; recovery after a restart trusts the durable point
only, scans from it, and ends the log before segments that were created but
never written; a group offset found beyond the surviving entries makes the
log skip those numbers instead of handing them out again; the durable point
reaches the disk about once per interval (an msync of the state); a sync's
time is when it started.
"""

from __future__ import annotations

import json
from pathlib import Path

from .checks import check_acked_survived
from .harness import PowerCutFS, drain, make_synced_dir, read_lines, read_state
from .scenarios import ALLOWANCE_S, BOUND_S, INTERVAL_S, lost_batches, run_groups, run_interval


def always_appends_survive_one_cut(powercut: PowerCutFS, data: Path) -> None:
    """A writer creates the stream in ``data`` and appends with ``always``;
    after one cut every acknowledged entry is there."""
    writer = powercut.spawn("append", data, 0, 0, "always", 2)
    read_state(writer)
    acked = {(int(l[1]), int(l[2])): l[3] for l in read_lines(writer, 20)}
    powercut.cut("clean", 0)
    acked.update({(int(l[1]), int(l[2])): l[3] for l in drain(writer)})
    state = read_state(powercut.spawn("dump", data, 1, 0, "always", 2))
    check_acked_survived(state, "events", acked, "after one cut")


def test_new_stream_survives_a_power_cut(powercut: PowerCutFS) -> None:
    """Was a bug: a shard directory (``<stream>/shard-NNNN``) is created with mkdir but
    ``<stream>/`` is never fsynced afterwards (stream.c syncs the data directory
    after ``stream.meta``, segment.c syncs the shard directory after a segment).
    So the segments' directory entries and their data are durable inside a
    directory whose own entry is not: after a cut the stream comes back with its
    ``stream.meta`` but without its shard directories, i.e. empty, and every
    ``always`` append acknowledged in it is lost."""
    always_appends_survive_one_cut(powercut, make_synced_dir(powercut.mnt / "data"))


def test_data_directory_created_by_open_survives_a_power_cut(powercut: PowerCutFS) -> None:
    """Was a bug: ``Log(path)`` (``comet_open`` with create) makes the data directory
    but never fsyncs its parent, so after a cut the whole directory, with every
    ``always`` append acknowledged in it, may be gone.  (Fails first on the
    shard directories of the test above; this one also needs the parent sync.)"""
    always_appends_survive_one_cut(powercut, powercut.mnt / "data")


def test_group_offsets_never_ahead_of_surviving_data_pages(powercut: PowerCutFS) -> None:
    """Was a bug: an ack moves the offset up to the commit point, not the durable
    point, and the offsets file and the segments are synced independently (by
    the flushers of different processes; and the kernel may write back the
    offsets page at any time).  After a cut the offsets file can hold an offset
    beyond the entries that survived, and reopening keeps it (it is not clamped
    to the recovered commit point): the entries appended again under those
    numbers are never delivered to the group.  The ``pages`` mode (the page
    cache wrote some dirty pages back before the cut) shows it within a few cuts."""
    run_groups(powercut, "pages")


def test_interval_loss_window_within_twice_the_interval(powercut: PowerCutFS) -> None:
    """Was a bug (the documented bound for ``interval``: "2 x fsync_interval_ms at most").

    - after a reopen the durable point is 0 and the durable segment the first
      one, so the flusher's first sync of each shard fdatasyncs every segment
      the shard has (here ~300, ~1 ms each on this filesystem);
    - ``last_sync_ns`` is stamped when a sync *ends* (durability.c,
      shard_sync) although the sync covers only what was committed when it
      *started*, and the inline-sync rule of an ``interval`` append compares
      against that stamp; one flusher thread also syncs the shards one after
      the other.
    So entries acknowledged just after the long first sync of shard 0 started
    stay volatile until shard 1's long sync and shard 0's next one are done:
    hundreds of ms with fsync_interval_ms = 100.  The failure message lists the
    syncs the filesystem served before the cut.
    """
    data = make_synced_dir(powercut.mnt / "data")
    env = {"POWERCUT_PAD": "3000"}  # ~20 entries per 64 KiB segment
    setup = powercut.spawn("batches", data, 0, 0, "interval", 2, env=env)
    read_state(setup)
    read_lines(setup, 2)
    powercut.checkpoint()  # the stream exists durably (see the first test)
    powercut.cut("clean", 0)
    drain(setup)
    # ~300 segments per shard, synced by the flusher (the state file, never synced,
    # keeps the checkpoint's durable point)
    fill = powercut.spawn("batches", data, 0, 0, "interval", 2, env=env)
    read_state(fill)
    lines = read_lines(fill, 1200)
    while float(read_lines(fill, 1)[0][5]) < float(lines[-1][5]) + 0.5:
        pass
    powercut.cut("clean", 0)
    drain(fill)
    for rnd in range(1, 6):
        writer = powercut.spawn("batches", data, rnd, rnd, "interval", 2,
                                env=dict(env, POWERCUT_FROM='{"events/0": 1000000000, '
                                                            '"events/1": 1000000000}'))
        read_state(writer)
        batches = []
        while True:
            b = read_lines(writer, 1)[0]
            batches.append((int(b[1]), int(b[2]), int(b[3]), b[4], float(b[5])))
            if batches[-1][4] - batches[0][4] >= 0.6:
                break
        instant, _ = powercut.cut("clean", rnd)
        drain(writer)
        check = powercut.spawn("dump", data, rnd, 0, "interval", 2, env={"POWERCUT_FROM": json.dumps(
            {f"events/{s}": min(b[1] for b in batches if b[0] == s) for s in (0, 1)})})
        state = read_state(check)
        lost = lost_batches(state, batches, f"cut {rnd}", pad=3000)
        window = instant - min(b[4] for b in lost) if lost else 0.0
        if window > 2 * INTERVAL_S + ALLOWANCE_S:
            syncs = [(round((t - instant) * 1000), path.rsplit("/", 2)[-2:])
                     for t, path in powercut.synclog(instant - 1) if t < instant]
            first_syncs = [x for x in syncs if x[1][1].endswith(".log")]
            raise AssertionError(
                f"cut {rnd}: {len(lost)} acknowledged batches lost, the oldest acknowledged "
                f"{window * 1000:.0f} ms before the cut (documented: at most "
                f"{2 * INTERVAL_S * 1000:.0f} ms); segment fdatasyncs in the second before the "
                f"cut (ms before the cut, file): {len(first_syncs)}, from {first_syncs[:3]} "
                f"to {first_syncs[-3:]}")


def test_interval_log_verifies_after_power_cuts(powercut: PowerCutFS) -> None:
    """Was a bug: a segment's name is made durable before its content.  segment.c
    creates ``<base>.log.tmp``, preallocates it and writes its header, then
    ``link()``s it into place and fsyncs the shard directory - without an
    fsync of the file first (stream.meta, by contrast, is fsynced before its
    link).  With ``interval`` the flusher syncs a new segment up to
    fsync_interval_ms later; a cut in between leaves ``<base>.log`` and
    ``<base>.idx`` under durable names but without their header (size 0 here;
    on ext4 it would be zeros).  Reopening does not treat them as torn
    creations: the shard claims entries [first, next) in them, ``verify``
    counts thousands of bad entries, and a read from the first entry returns
    nothing.  Retention (8 segments per shard here) makes it worse: its unlinks
    of the older, synced segments become durable with the next segment's
    directory fsync, before the newer segments' data is, so the shard is left
    with only empty files (the state file, never synced, still says what it
    said at the last checkpoint)."""
    run_interval(powercut, "clean", BOUND_S, check_verify=True)


def test_interval_log_is_a_prefix_after_power_cuts_pages(powercut: PowerCutFS) -> None:
    """Was a bug: in the ``pages`` mode (the page cache wrote back a random half
    of the dirty pages before the cut) a page lost among written-back ones
    left a hole: recovery skipped the lost entries as damage and kept the
    entries after them, so batches came back in part (entries of one batch on
    both sides of the hole) and the log was no longer a prefix of what was
    written.  After a restart, past the durable point, the first damaged entry
    or gap now ends the log: every batch whole or absent, no hole, and the log
    verifies clean."""
    run_interval(powercut, "pages", BOUND_S, check_verify=True)
