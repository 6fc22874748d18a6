"""Power cuts while streams are created, rotated, trimmed by retention and deleted.

One writer process creates streams, appends large entries at ``always``
(64 KiB segments: a rotation every few appends), runs retention (at most 3
segments per shard) and deletes streams, in a random order; the cut comes after
a random number of acknowledged operations.  After each cut, reopening must
work and show no half-made or half-deleted stream or segment: every stream
opens and verifies, its entries run without a hole from the first kept one to
the commit point, a stream whose creation was acknowledged exists, one whose
deletion was acknowledged does not, and no temporary or ``.deleted-*`` leftover
is visible as a stream.  (Whether the acknowledged appends of a stream created
during the run survive is test_regressions.py's first test.)
"""

from __future__ import annotations

import time

from .checks import shard_entries
from .harness import CUTS, PowerCutFS, drain, make_synced_dir, read_lines, read_state, seeded


def test_create_rotate_retain_delete_survive_power_cuts(powercut: PowerCutFS) -> None:
    data = make_synced_dir(powercut.mnt / "data")
    rng = seeded("lifecycle")
    created: set[str] = set()
    deleted: set[str] = set()
    ops = 0
    started = time.monotonic()
    for rnd in range(CUTS + 1):
        writer = powercut.spawn("lifecycle", data, rnd, rng.randrange(1 << 30))
        state = read_state(writer)
        where = f"after cut {rnd}"
        streams = state["streams"]
        assert state["verify"]["ok"], f"{where}: verify: {state['verify']}"
        assert created - deleted <= set(streams), (
            f"{where}: acknowledged streams missing: {sorted(created - deleted - set(streams))}")
        assert not (deleted & set(streams)), f"{where}: deleted streams back: {deleted & set(streams)}"
        for name, shards in streams.items():
            assert not name.startswith("."), f"{where}: leftover listed as a stream: {name}"
            for shard in shards:
                shard_entries(shard)
        if rnd == CUTS:
            break
        for line in read_lines(writer, rng.randrange(1, 40)):
            ops += 1
            if line[0] == "C":
                created.add(line[1])
            elif line[0] == "D":
                deleted.add(line[1])
        powercut.cut("clean", rng.randrange(1 << 30))
        for line in drain(writer):
            if line[0] == "C":
                created.add(line[1])
            elif line[0] == "D":
                deleted.add(line[1])
    elapsed = time.monotonic() - started
    print(f"\nlifecycle: {CUTS} cuts, {ops} operations, {len(created)} streams created, "
          f"{len(deleted)} deleted, {elapsed:.1f} s ({elapsed / CUTS * 1000:.0f} ms per cut)")
