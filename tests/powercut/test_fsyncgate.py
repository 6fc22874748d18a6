"""A failed sync ("fsyncgate"): the shard refuses appends, and nothing acknowledged is lost.

On Linux a failed fsync/fdatasync/msync may drop the pages it could not write
and report success to the next sync of the same file; fs.py's ``failsync``
does exactly that to one file (the next sync fails with EIO, the file's unsynced
data is gone from the "disk", later syncs succeed).  A writer appends single
entries to one shard; its active segment's next sync fails once.  The contract
(issue 25, "A failed fsync, fdatasync or msync is fatal for its shard"): from the
failure on every append of that process fails with ``SyncFailed``
(COMET_E_SYNC_FAILED), never a success after the fault was seen; and after a
restart (same boot, the page cache dropped: the next process reads what the
"disk" holds) the reopened log is a prefix without holes that verifies, and under
``always`` every acknowledged entry is there byte for byte (none was acknowledged
without a successful sync).  Under ``interval`` entries acknowledged before the
failed sync may be lost (they never were durable), but what is there is exact.
The count of injected faults is printed.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Callable

import pytest

from .checks import check_acked_survived, shard_digests
from .harness import (
    SEED, PowerCutFS, Writer, discard_output, make_synced_dir, read_lines, read_state)
from .writer import body, digest

WAIT_S = 5.0  # for the failure to show in the appends (the flusher runs every 100 ms)


def lines_until(proc: Writer, done: Callable[[list[list[str]]], bool],
                timeout: float) -> list[list[str]]:
    """The writer's lines until ``done(lines)`` or ``timeout`` seconds."""
    q: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stdout
        for line in proc.stdout:
            q.put(line)

    threading.Thread(target=pump, daemon=True).start()
    out: list[list[str]] = []
    end = time.monotonic() + timeout
    while not done(out) and time.monotonic() < end:
        try:
            out.append(q.get(timeout=0.1).split())
        except queue.Empty:
            continue
    return out


@pytest.mark.parametrize("durability", ["always", "interval"])
def test_a_failed_sync_fails_the_shard_and_loses_nothing_acknowledged(
        powercut: PowerCutFS, durability: str) -> None:
    data = make_synced_dir(powercut.mnt / "data")
    setup = powercut.spawn("fsyncgate", data, 0, 0, "always")
    read_state(setup)
    read_lines(setup, 5)
    powercut.checkpoint()  # the stream exists durably; this test is about the failed sync
    powercut.cut("clean", 0)
    discard_output(setup)

    writer = powercut.spawn("fsyncgate", data, 1, 0, durability)
    read_state(writer)
    before = read_lines(writer, 50)
    segment = max((data / "events" / "shard-0000").glob("*.log"))
    powercut.failsync(segment, 1)
    after = lines_until(writer, lambda ls: sum(1 for x in ls if x[0] == "F") >= 5, WAIT_S)
    injected = powercut.stats()["injected"]
    where = f"{durability}, seed {SEED}, {injected} injected fault(s) on {segment.name}"
    assert injected == 1, f"{where}: the armed sync never ran in {WAIT_S} s"
    failures = [x for x in after if x[0] == "F"]
    assert failures, (f"{where}: the segment's sync failed, yet in {WAIT_S} s no append failed "
                      f"({sum(1 for x in after if x[0] == 'A')} acknowledged after it)")
    assert failures[0][1] == "SyncFailed", f"{where}: the first failure is {failures[0][1]}"
    first_failure = after.index(failures[0])
    late = [x for x in after[first_failure:] if x[0] == "A"]
    assert not late, f"{where}: {len(late)} appends acknowledged after the failure: {late[:3]}"
    acked = {(0, int(x[2])): x[3] for x in before + after if x[0] == "A"}

    powercut.restart()
    state = read_state(powercut.spawn("dump", data, 2, 0, durability, 1))
    if durability == "always":
        check_acked_survived(state, "events", acked, where)
    else:
        present = shard_digests(state["streams"]["events"][0], where)  # a prefix, no hole
        wrong = [k for k, tag in acked.items() if k[1] in present
                 and present[k[1]] != digest(body(tag, 200))]
        assert not wrong, f"{where}: entries changed: {wrong[:5]}"
        assert state["verify"]["ok"], f"{where}: verify: {state['verify']}"
    print(f"\nfsyncgate/{durability} (seed {SEED}): 1 failed sync injected, "
          f"{len(acked)} acknowledged, {len(failures)} appends refused after it")
