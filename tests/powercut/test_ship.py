"""Power cuts while ``comet ship`` drains a stream into a directory: exactly once.

Everything is on the power-cut mount: the log (a writer appends at durability
``interval``, so the shipper can read entries that are committed but not yet
durable), the group's offsets, the intents under ``<data>/.ship/`` and the
directory sink.  In each round the writer appends while the real ``comet
ship`` command (``--max-object-age 0.05 --max-object-bytes 6000``: objects
cut by age and by size, a few entries each) ships; the cut comes after a
random number of stored objects.  After each cut, before anything reopens
the log, the sink is read; then a ``comet ship --once`` rerun reopens the
log (recovery: the ``S`` dump says which entries survived) and ships what
is left.  Checked after every cut:

- every object in the sink is whole (it decompresses, one line per entry of
  its key's range) and refers only to entries that survived, with their
  payloads (an object of lost entries would stand for data the log no longer
  has, whose numbers the log gives to new entries);
- per shard the objects run without a gap or an overlap from entry 0: an
  entry in two objects was shipped twice, and the group's acknowledged
  offset (as the offsets file holds it after the cut) is never beyond what
  the sink holds;
- after the rerun, the objects cover every surviving entry exactly once.

In some rounds the cut hits the rerun itself (a cut during recovery from the
previous cut).
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from .harness import (
    CUTS, PowerCutFS, Writer, discard_output, drain, make_synced_dir, read_lines, read_state)
from .scenarios import durable_stream
from .shipping import Objects, check_sink, finish, read_sink, run_ship


@pytest.mark.parametrize("mode", ["clean", "pages"])
def test_ship_to_a_directory_exactly_once_across_power_cuts(powercut: PowerCutFS,
                                                             mode: str) -> None:
    run_ship(powercut, mode, CUTS)


# ---- regression tests: one cut each, at a point the scenario above reaches by chance ----


def one_cut_while_shipping(powercut: PowerCutFS, durability: str, fsync_ms: str,
                           pause: str = "1", reader_fsync_ms: str = "1000") -> tuple[
        Path, Path, Objects, dict]:
    """A writer appends 20 entries a second (so ``comet ship`` cuts its objects by
    age, a few entries each); the shipper stores object ``pause`` of shard 0
    and waits, before acknowledging it; the power goes.  Returns the sink as
    the cut left it and what survived in the log."""
    data = make_synced_dir(powercut.mnt / "data")
    sink = make_synced_dir(powercut.mnt / "sink")
    env = {"POWERCUT_RATE": "20", "POWERCUT_FSYNC_MS": fsync_ms}
    durable_stream(powercut, data, "always", env)
    writer = powercut.spawn("append", data, 1, 1, durability, 2, env=env)
    read_state(writer)
    drained = discard_output(writer)
    shipper = powercut.spawn("ship", data, 1, 0, sink, "follow", stdin=subprocess.PIPE,
                             env={"POWERCUT_SHIP_PAUSE": pause,
                                  "POWERCUT_READER_FSYNC_MS": reader_fsync_ms})
    assert wait_shipped(shipper, int(pause)), shipper.stderr_path.read_text()[-3000:]
    time.sleep(0.3)  # the writer goes on: entries after the object's
    powercut.cut("clean", 1)
    drained.join()
    drain(shipper)
    before = read_sink(sink, "after the cut")
    state = read_state(powercut.spawn("dump", data, 2, 0, "interval", 2))
    return data, sink, before, state


def test_shipped_entries_are_durable_first(powercut: PowerCutFS) -> None:
    """Was a bug: ``comet ship`` read entries up to the commit point and stored
    them in an object without making them durable in the log.  With the
    writer at ``interval`` (a 10 s flush here) a power cut then takes the
    entries back from the log but not the object: the sink holds an object of
    entries that do not exist, and the log gives their numbers to new ones."""
    _, _, before, state = one_cut_while_shipping(powercut, "interval", "10000")
    check_sink(before, state, "after the cut", complete=False)


def wait_shipped(proc: Writer, count: int) -> bool:
    """Reads the shipper's lines until its ``count``-th object of shard 0 was stored."""
    assert proc.stdout
    seen = 0
    while seen < count:
        line = proc.stdout.readline()
        if not line or line.startswith("X"):
            return False
        seen += (line.startswith("L ") and json.loads(line[2:]).get("event") == "shipped"
                 and "/shard=0000/" in line)
    return True


def test_previous_ack_is_durable_before_the_next_intent(powercut: PowerCutFS) -> None:
    """Was a bug: the group's ack of an object was left to the shipper's
    flusher (here once an hour: it is never in time), while the intent of the
    shard's next object replaced the object's own.  A cut after that intent
    left the group at the first object's start and an intent for the second:
    the rerun dropped the intent as stale and cut the entries again from the
    group's offset, at other boundaries than the first (age-cut) object -
    objects overlapping it, entries shipped twice."""
    data, sink, before, state = one_cut_while_shipping(powercut, "always", "1000", pause="2",
                                                       reader_fsync_ms="3600000")
    check_sink(before, state, "after the cut", complete=False)
    rerun = powercut.spawn("ship", data, 2, 0, sink, "once")
    finish(rerun, "the rerun", False)
    check_sink(read_sink(sink, "after the rerun"), state, "after the rerun", complete=True)


def test_intents_survive_a_power_cut(powercut: PowerCutFS) -> None:
    """Was a bug: the intents directory (``<data>/.ship/<group>/<stream>/``)
    was created without syncing its parents, so a power cut took every intent
    with it.  An object stored but not yet acknowledged (cut by age) was then
    cut again from the group's offset by the rerun, at other boundaries: an
    object overlapping the stored one, its entries shipped twice."""
    data, sink, before, state = one_cut_while_shipping(powercut, "always", "1000")
    check_sink(before, state, "after the cut", complete=False)
    rerun = powercut.spawn("ship", data, 2, 0, sink, "once")
    finish(rerun, "the rerun", False)
    check_sink(read_sink(sink, "after the rerun"), state, "after the rerun", complete=True)


def test_sink_directories_survive_a_power_cut(powercut: PowerCutFS) -> None:
    """Was a bug: the directory sink created ``stream=/dt=/hour=/shard=``
    directories without syncing their parents (``write_durably`` syncs only
    the directory of the file), while closing the shipper synced the group's
    acks: after a cut the objects were gone and their entries acknowledged,
    never to be shipped again."""
    data = make_synced_dir(powercut.mnt / "data")
    sink = make_synced_dir(powercut.mnt / "sink")
    writer = powercut.spawn("append", data, 0, 0, "always", 2)
    read_state(writer)
    read_lines(writer, 40)
    powercut.checkpoint()  # the stream and its entries are durable
    powercut.cut("clean", 0)
    drain(writer)
    shipper = powercut.spawn("ship", data, 1, 0, sink, "once")
    finish(shipper, "the run", False)
    powercut.cut("clean", 1)
    state = read_state(powercut.spawn("dump", data, 2, 0, "interval", 2))
    check_sink(read_sink(sink, "after the cut"), state, "after the cut", complete=True)
