"""Power cuts while streams are created, rotated, trimmed by retention and deleted.

One writer process creates streams, appends large entries at ``always``
(64 KiB segments: a rotation every few appends), runs retention (at most 3
segments per shard) and deletes streams, in a random order; the cut comes after
a random number of acknowledged operations.  After each cut, reopening must
work and show no half-made or half-deleted stream or segment: every stream
opens and verifies, its entries run without a hole from the first kept one to
the commit point, a stream whose creation was acknowledged exists, one whose
deletion was acknowledged does not (one whose deletion was under way at the cut may
or may not), and no temporary or ``.deleted-*`` leftover
is visible as a stream, and every acknowledged append of a stream not deleted
since is there byte for byte unless retention (acknowledged ``R`` runs, and the
writer's own size limit) deleted its segment.  (Appends to a stream created right
before one cut: test_regressions.py::test_new_stream_survives_a_power_cut.)
"""

from __future__ import annotations

import time

from .checks import check_acked_survived, shard_entries
from .harness import CUTS, PowerCutFS, drain, make_synced_dir, read_lines, read_state, seeded
from .writer import LIFECYCLE_PAD


def note(line: list[str], created: set[str], deleted: set[str], acked_deleted: set[str],
         acked: dict[str, dict[tuple[int, int], str]]) -> None:
    """One acknowledged operation of the writer (writer.py ``lifecycle``)."""
    if line[0] == "C":
        created.add(line[1])
    elif line[0] in "dD":  # d: under way, the stream may survive the cut or not
        deleted.add(line[1])
        acked.pop(line[1], None)
        if line[0] == "D":
            acked_deleted.add(line[1])
    elif line[0] == "A":
        acked.setdefault(line[1], {})[int(line[2]), int(line[3])] = line[4]


def test_create_rotate_retain_delete_survive_power_cuts(powercut: PowerCutFS) -> None:
    data = make_synced_dir(powercut.mnt / "data")
    rng = seeded("lifecycle")
    created: set[str] = set()
    deleted: set[str] = set()  # deletions begun
    acked_deleted: set[str] = set()  # and acknowledged
    acked: dict[str, dict[tuple[int, int], str]] = {}
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
        back = {name for name in deleted & set(streams) if name in acked_deleted}
        assert not back, f"{where}: deleted streams back: {back}"
        for name, shards in streams.items():
            assert not name.startswith("."), f"{where}: leftover listed as a stream: {name}"
            for shard in shards:
                shard_entries(shard)
        for name, entries in acked.items():
            check_acked_survived(state, name, entries, f"{where}: stream {name}",
                                 pad=LIFECYCLE_PAD[1], low=LIFECYCLE_PAD[0], retained=True)
        if rnd == CUTS:
            break
        for line in read_lines(writer, rng.randrange(1, 40)):
            ops += 1
            note(line, created, deleted, acked_deleted, acked)
        # half the cuts keep a prefix of the unsynced directory changes (ext4's journal)
        powercut.cut(rng.choice(["clean", "clean+dirs"]), rng.randrange(1 << 30))
        for line in drain(writer):
            note(line, created, deleted, acked_deleted, acked)
    elapsed = time.monotonic() - started
    print(f"\nlifecycle: {CUTS} cuts, {ops} operations, {len(created)} streams created, "
          f"{len(deleted)} deleted, {sum(map(len, acked.values()))} appends checked, {elapsed:.1f} s ({elapsed / CUTS * 1000:.0f} ms per cut)")
