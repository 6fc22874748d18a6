"""Power cuts while a consumer group acknowledges: an offset is never ahead of the data.

Two real processes, as in production: a writer appending at durability
``interval`` and a consumer (``comet ship``'s role: another process) reading
and acknowledging group ``g``.  Each process's flusher syncs what it changed -
the writer the segments, the consumer the offsets file - independently.  After
each cut, before anything opens the log, the offsets file's raw content is read;
then recovery runs.  A group offset must never point past the entries that
survived: the entries in between would be skipped, never delivered, and new
entries appended under those numbers silently dropped for the group.
"""

from __future__ import annotations

import random
import time

from .conftest import CUTS, drain, read_lines, read_state
from .harness import PowerCutFS, make_synced_dir, writeback


def check_offsets(state: dict, where: str) -> list[int]:
    shards = state["streams"]["events"]
    slack = []
    for i, shard in enumerate(shards):
        raw = state["raw_offsets"].get(f"events/shard-{i:04d}", {}).get("g")
        api = shard["groups"].get("g")
        assert raw is None or raw <= shard["next"], (
            f"{where}: shard {i}: the offsets file says group g is at {raw}, but only entries "
            f"below {shard['next']} survived (durable point {shard['durable']}); "
            f"after reopening the group is at {api}")
        assert api is None or api <= shard["next"], (
            f"{where}: shard {i}: group g at {api} after reopening, beyond the data "
            f"({shard['next']})")
        if raw is not None:
            slack.append(shard["next"] - raw)
    return slack


def test_group_offsets_never_ahead_of_surviving_data(powercut: PowerCutFS) -> None:
    run_groups(powercut, "clean")


def run_groups(powercut: PowerCutFS, mode: str) -> None:
    """The scenario; ``pages`` mode is in test_bugs.py (it fails: a storage bug)."""
    data = make_synced_dir(powercut.mnt / "data")
    rng = random.Random(f"groups-{mode}")
    # The stream, its shard directories and the group exist durably first
    # (stream creation is not crash-safe: test_bugs.py).
    writer = powercut.spawn("append", data, 0, 0, "interval", 2)
    read_state(writer)
    read_lines(writer, 2)
    consumer = powercut.spawn("consume", data, 0, 0, 2)
    read_state(consumer)
    read_lines(consumer, 1)
    powercut.checkpoint()
    powercut.cut(mode, 0)
    drain(writer), drain(consumer)
    started = time.monotonic()
    acks = 0
    for rnd in range(1, CUTS + 2):
        writer = powercut.spawn("append", data, rnd, rng.randrange(1 << 30), "interval", 2)
        state = read_state(writer)
        check_offsets(state, f"after cut {rnd - 1}")
        if rnd == CUTS + 1:
            break
        consumer = powercut.spawn("consume", data, rnd, rng.randrange(1 << 30), 2)
        read_state(consumer)
        # Let both run: the cut comes after a random number of the consumer's acks
        # (the writer's pipe is read too, so that it never blocks on it).
        for _ in range(rng.randrange(1, 60)):
            read_lines(consumer, 1)
            read_lines(writer, rng.randrange(0, 3))
            acks += 1
            if mode == "pages" and rng.random() < 0.1:
                writeback(powercut.mnt)
        powercut.cut(mode, rng.randrange(1 << 30))
        drain(writer), drain(consumer)
    elapsed = time.monotonic() - started
    print(f"\ngroups/{mode}: {CUTS} cuts, {acks} acks, {elapsed:.1f} s "
          f"({elapsed / CUTS * 1000:.0f} ms per cut)")
