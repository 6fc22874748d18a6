"""Power cuts under keyed batches: every key's batch is stored exactly once.

A writer sends batches with idempotency keys (writer.py ``keyed``) to four
shards until the power goes at a random moment.  Then a client that lost its
answers sends every key it ever tried again (``keyed-retry``), and the log must
hold each key's batch exactly once, whole and contiguous: a batch that survived
the cut without its key would be stored twice, a key that survived without its
batch would answer for entries that are not there (or, its numbers handed out
again, for another batch).  Under ``always`` every acknowledged batch is where
its acknowledgement said; every replay names the entries that hold its batch.
Several cuts in a row: keys of earlier rounds are retried every round.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from .harness import (
    CUTS, SEED, PowerCutFS, drain, make_synced_dir, read_lines, read_state, run_to_exit, seeded,
    writeback)
from .writer import keyed_batch

ROUNDS = max(4, CUTS // 5)


def placements(state: dict, where: str) -> dict[str, tuple[int, int]]:
    """tag -> (shard, first entry) of each keyed batch in a dump, after checking that
    each is there once, whole, in order."""
    found: dict[str, tuple[int, int]] = {}
    for shard, s in enumerate(state["streams"]["events"]):
        entries = s["entries"]
        for i, (entry, tag, _) in enumerate(entries):
            batch, _, index = tag.rpartition(".")
            if index != "0":
                continue
            assert batch not in found, (f"{where}: the batch of key {batch} is stored twice: "
                                        f"{found[batch]} and {(shard, entry)}")
            _, count = keyed_batch(batch)
            got = [t for _, t, _ in entries[i:i + count]]
            assert got == [f"{batch}.{k}" for k in range(count)], (
                f"{where}: the batch of key {batch} at {(shard, entry)} is not whole: {got}")
            found[batch] = (shard, entry)
    return found


@pytest.mark.parametrize("durability,mode", [("always", "clean"), ("always", "pages"),
                                             ("interval", "pages"), ("interval", "clean+dirs")])
def test_keyed_batches_are_stored_once_across_power_cuts(
        powercut: PowerCutFS, tmp_path: Path, durability: str, mode: str) -> None:
    data = make_synced_dir(powercut.mnt / "data")
    rng = seeded(f"keyed-{durability}-{mode}")
    tried: list[str] = []
    acked: dict[str, tuple[int, int]] = {}
    replays = 0
    started = time.monotonic()
    for rnd in range(1, ROUNDS + 1):
        where = f"{durability}/{mode}, round {rnd}, seed {SEED}"
        writer = powercut.spawn("keyed", data, rnd, 0, durability)
        read_state(writer)
        lines = read_lines(writer, rng.randrange(2, 120))
        if mode.startswith("pages") and rng.random() < 0.5:
            writeback(powercut.mnt)
        powercut.cut(mode, rng.randrange(1 << 30))
        lines += drain(writer)
        for line in lines:
            if line[0] == "T":
                tried.append(line[1])
            elif line[0] == "K":
                acked[line[1]] = (int(line[2]), int(line[3]))
        tags = tmp_path / f"tags-{rnd}"
        tags.write_text("\n".join(tried))
        retry = powercut.spawn("keyed-retry", data, rnd, 0, durability,
                               env={"POWERCUT_TAGS": str(tags)})
        out, status = run_to_exit(retry, 120)
        assert status == 0, f"{where}: the retrying client failed: {retry.stderr_path.read_text()}"
        final = [line for line in out if line[0] == "S2"]
        assert final, f"{where}: no dump from the retrying client"
        placed = placements(json.loads(" ".join(final[0][1:])), where)
        missing = sorted(set(tried) - set(placed))
        assert not missing, f"{where}: keys retried but not stored: {missing[:10]}"
        for line in out:
            if line[0] != "K":
                continue
            tag, at, replayed = line[1], (int(line[2]), int(line[3])), line[5] == "1"
            replays += replayed
            assert placed[tag] == at, (f"{where}: the retry of key {tag} answered {at}, its "
                                       f"batch is at {placed[tag]} (replayed: {replayed})")
        if durability == "always":
            moved = {t: (a, placed.get(t)) for t, a in acked.items() if placed.get(t) != a}
            assert not moved, f"{where}: acknowledged batches not where acknowledged: {moved}"
    elapsed = time.monotonic() - started
    assert replays, f"{durability}/{mode}, seed {SEED}: no retry was ever a replay"
    print(f"\nkeyed {durability}/{mode}: {ROUNDS} cuts, {len(tried)} keys, {replays} replays, "
          f"{elapsed:.1f} s")
