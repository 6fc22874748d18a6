"""Power cuts during appends at durability ``always``: no acknowledged entry is lost.

The writer is a real process appending to two shards (each append fdatasyncs
before it returns); the cut comes after a random number of acknowledgements,
while the writer keeps appending.  Every acknowledgement the writer had written
to its pipe when it was killed counts: an ``always`` append cannot be
acknowledged after the cut, as every sync fails from that instant.  After each
cut the next writer reopens the log (recovery) and reports what is there.
"""

from __future__ import annotations

import time

import pytest

from .checks import check_acked_survived
from .harness import (
    CUTS, PowerCutFS, drain, make_synced_dir, read_lines, read_state, seeded, writeback)


@pytest.mark.parametrize("mode", ["clean", "pages"])
def test_always_appends_survive_power_cuts(powercut: PowerCutFS, mode: str) -> None:
    data = make_synced_dir(powercut.mnt / "data")
    rng = seeded(f"always-{mode}")
    acked: dict[tuple[int, int], str] = {}
    started = time.monotonic()
    # The stream and its shard directories exist durably before the first cut:
    # creating them under a cut is test_regressions.py's, and this test is about appends.
    setup = powercut.spawn("append", data, 0, 0, "always", 2)
    read_state(setup)
    for line in read_lines(setup, 2):
        acked[int(line[1]), int(line[2])] = line[3]
    powercut.checkpoint()
    powercut.cut(mode, 0)
    for line in drain(setup):
        acked[int(line[1]), int(line[2])] = line[3]
    for rnd in range(1, CUTS + 2):
        writer = powercut.spawn("append", data, rnd, rng.randrange(1 << 30), "always", 2)
        state = read_state(writer)
        check_acked_survived(state, "events", acked, f"after cut {rnd}")
        if rnd == CUTS + 1:
            break
        for line in read_lines(writer, rng.randrange(1, 80)):
            acked[int(line[1]), int(line[2])] = line[3]
            if mode == "pages" and rng.random() < 0.1:
                writeback(powercut.mnt)
        powercut.cut(mode, rng.randrange(1 << 30))
        for line in drain(writer):
            acked[int(line[1]), int(line[2])] = line[3]
    elapsed = time.monotonic() - started
    print(f"\nalways/{mode}: {CUTS} cuts, {len(acked)} acknowledged entries checked, "
          f"{elapsed:.1f} s ({elapsed / CUTS * 1000:.0f} ms per cut)")
