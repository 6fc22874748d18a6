"""The power-cut scenarios that more than one test runs (a test passes the mode of its
cuts and its bounds): consumer groups acknowledging while a writer appends
(test_groups.py), appends at durability ``interval`` (test_interval.py), a stream
made durable before a scenario's first cut (test_ship.py, test_spark_ship.py); and
test_regressions.py runs them in the modes that once found storage bugs."""

from __future__ import annotations

import json
import time
from pathlib import Path

from .checks import check_offsets_before_recovery, shard_entries
from .harness import (
    CUTS, SEED, PowerCutFS, discard_output, drain, make_synced_dir, read_lines, read_state,
    seeded, writeback)
from .writer import body, config, digest


# ---- consumer groups (test_groups.py) -------------------------------------------------------


def check_offsets(state: dict, where: str) -> list[int]:
    """The offsets file's group g against the data on disk, both read before recovery
    (recovery raises the commit point to an offset found beyond the data, so comparing
    with the recovered next entry could never fail), then the reopened group."""
    shards = state["streams"]["events"]
    slack = []
    check_offsets_before_recovery(state, "events", "g", where)
    for i, shard in enumerate(shards):
        raw = state["raw_offsets"].get(f"events/shard-{i:04d}", {}).get("g")
        api = shard["groups"].get("g")
        assert api is None or api <= shard["next"], (
            f"{where}: shard {i}: group g at {api} after reopening, beyond the data "
            f"({shard['next']})")
        if raw is not None:
            slack.append(shard["next"] - raw)
    return slack


def run_groups(powercut: PowerCutFS, mode: str) -> None:
    """The scenario; its ``pages`` mode runs in test_regressions.py."""
    data = make_synced_dir(powercut.mnt / "data")
    rng = seeded(f"groups-{mode}")
    # The stream, its shard directories and the group exist durably first
    # (stream creation under a cut is test_regressions.py's).
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


# ---- durability interval (test_interval.py) ---------------------------------------------------

INTERVAL_S = config().fsync_interval_ms / 1000
ALLOWANCE_S = 0.02  # scheduling: the flusher is a thread of a process sharing 2 CPUs
BOUND_S = 2 * INTERVAL_S + ALLOWANCE_S
"""docs/durability-and-sizing.md: a power failure loses "up to about fsync_interval_ms of
acknowledged batches; 2 x fsync_interval_ms at most" - asserted after every cut."""

Batch = tuple[int, int, int, str, float]  # shard, first, count, tag, acknowledged at


def lost_batches(state: dict, batches: list[Batch], where: str, pad: int = 100) -> list[Batch]:
    """The acknowledged batches not there; a batch counts as there when every entry
    is, byte for byte (``writer.body(tag.i, pad)``: POWERCUT_PAD of the writer)."""
    present = [{e[0]: e[2] for e in s["entries"]} for s in state["streams"]["events"]]
    lost = []
    shards = state["streams"]["events"]
    for shard, first, count, tag, t in batches:
        if first < shards[shard]["first"]:
            continue  # deleted by retention since, not lost
        there = [present[shard].get(first + i) == digest(body(f"{tag}.{i}", pad))
                 for i in range(count)]
        assert all(there) or not any(there), (
            f"{where}: batch {tag} (shard {shard}, entries {first}-{first + count - 1}, "
            f"acknowledged) survived in part: {there}")
        if not all(there):
            lost.append((shard, first, count, tag, t))
    return lost


def check_in_write_order(state: dict, where: str) -> None:
    """Every stored entry was written at its place: tags (round, batch, index) rise with the
    entry number.  Segment files are recycled (retention keeps 8), so an entry of a file's
    earlier life served under a new number would show here as a step back."""
    for shard, s in enumerate(state["streams"]["events"]):
        tags = [(e, tuple(int(x) for x in p.split("."))) for e, p, _ in s["entries"]]
        back = [(a, b) for a, b in zip(tags, tags[1:]) if b[1] <= a[1]]
        assert not back, f"{where}: shard {shard}: entries out of write order: {back[:3]}"


def run_interval(powercut: PowerCutFS, mode: str, bound: float, check_verify: bool = False) -> list[float]:
    """CUTS cuts, each 0.05-0.8 s into a writer's run (longer than the bound: a loss
    beyond it can show); retention keeps 8 segments per shard (so that every reopen
    costs the same).  After every cut: the batches of the round whole or absent, the
    oldest lost one within ``bound`` of the cut, and every batch that survived an
    earlier cut still there (unless retention deleted its segment since)."""
    data = make_synced_dir(powercut.mnt / "data")
    rng = seeded(f"interval-{mode}")
    setup = powercut.spawn("batches", data, 0, 0, "interval", 2, env={"POWERCUT_RETAIN": "8"})
    read_state(setup)
    read_lines(setup, 2)
    powercut.checkpoint()
    powercut.cut("clean", 0)
    drain(setup)
    windows: list[float] = []
    lost_total = acked_total = 0
    batches: list[Batch] = []
    survived: list[Batch] = []
    instant = 0.0
    started = time.monotonic()
    for rnd in range(1, CUTS + 2):
        since: dict[str, int] = {}
        for b in batches + survived:
            key = f"events/{b[0]}"
            since[key] = min(since.get(key, b[1]), b[1])
        writer = powercut.spawn("batches", data, rnd, rng.randrange(1 << 30), "interval", 2,
                                env={"POWERCUT_FROM": json.dumps(since), "POWERCUT_RETAIN": "8"})
        state = read_state(writer)
        check_in_write_order(state, f"cut {rnd - 1}")
        for shard in state["streams"]["events"]:
            shard_entries(shard)  # a prefix: no hole of lost entries
        if check_verify:
            shards = state["streams"]["events"]
            assert state["verify"]["ok"], (
                f"cut {rnd - 1}: the reopened log does not verify: "
                f"{state['verify']['bad_entries']} bad entries, first problems "
                f"{state['verify']['problems'][:3]}; shards (first, next): "
                f"{[(s['first'], s['next']) for s in shards]}; segment files and sizes: "
                f"{sorted(state['files'].items())}")
        shards = state["streams"]["events"]
        survived = [b for b in survived if b[1] >= shards[b[0]]["first"]]  # else retention's
        gone = lost_batches(state, survived, f"cut {rnd - 1}")
        assert not gone, (
            f"cut {rnd - 1}: {len(gone)} batches that had survived earlier cuts are gone: "
            f"{[(b[0], b[1], b[2], b[3]) for b in gone[:5]]}; shards (first, next, durable): "
            f"{[(s['first'], s['next'], s['durable']) for s in shards]}")
        if batches:
            lost = lost_batches(state, batches, f"cut {rnd - 1}")
            survived.extend(b for b in batches if b not in lost)
            window = instant - min(b[4] for b in lost) if lost else 0.0
            windows.append(window)
            lost_total += sum(b[2] for b in lost)
            acked_total += sum(b[2] for b in batches)
            if window > bound:
                syncs = [(round((t - instant) * 1000), path.rsplit("/", 2)[-2:])
                         for t, path in powercut.synclog(instant - 1.5) if t < instant]
            assert window <= bound, (
                f"cut {rnd - 1}: {len(lost)} acknowledged batches lost, the oldest acknowledged "
                f"{window * 1000:.0f} ms before the cut (documented: at most "
                f"{2 * INTERVAL_S * 1000:.0f} ms; asserted here: {bound * 1000:.0f} ms); seed "
                f"{SEED}; "
                f"lost: {[(b[0], b[1], b[2], round((instant - b[4]) * 1000)) for b in lost[:3]]}"
                f"...{[(b[0], b[1], b[2], round((instant - b[4]) * 1000)) for b in lost[-3:]]}; "
                f"shards after the cut: "
                f"{[(s['first'], s['next'], s['durable']) for s in state['streams']['events']]}; "
                f"syncs the filesystem served in the 1.5 s before the cut (ms, file): {syncs}")
        if rnd == CUTS + 1:
            break
        batches = []
        # The cut comes at a random moment 0.05-0.8 s into the round, on the
        # writer's clock: when the first acknowledgement stamped after it arrives.
        duration = rng.uniform(0.05, 0.8)
        while True:
            line = read_lines(writer, 1)[0]
            batches.append((int(line[1]), int(line[2]), int(line[3]), line[4], float(line[5])))
            if batches[-1][4] - batches[0][4] >= duration:
                break
            if mode == "pages" and rng.random() < 0.01:
                writeback(powercut.mnt)
        instant, _ = powercut.cut(mode, rng.randrange(1 << 30))
        for line in drain(writer):
            if float(line[5]) < instant:
                batches.append((int(line[1]), int(line[2]), int(line[3]), line[4], float(line[5])))
    elapsed = time.monotonic() - started
    ordered = sorted(windows)
    print(f"\ninterval/{mode} (fsync_interval_ms={INTERVAL_S * 1000:.0f}): {CUTS} cuts, "
          f"{lost_total} of {acked_total} acknowledged entries lost; loss window per cut: "
          f"median {ordered[len(ordered) // 2] * 1000:.0f} ms, max {ordered[-1] * 1000:.0f} ms "
          f"(bound {2 * INTERVAL_S * 1000:.0f} ms); {elapsed:.1f} s "
          f"({elapsed / CUTS * 1000:.0f} ms per cut)")
    return windows


# ---- a durable stream first (test_ship.py, test_spark_ship.py) ----------------------------------


def durable_stream(powercut: PowerCutFS, data: Path, durability: str, env: dict[str, str]) -> None:
    """A writer creates the stream and appends for a moment; everything is made
    durable and the power goes: the stream and its shard directories exist
    durably before the scenario's first cut (as in test_always.py: these
    scenarios are about shipping)."""
    setup = powercut.spawn("append", data, 0, 0, durability, 2, env=env)
    read_state(setup)
    drained = discard_output(setup)
    time.sleep(0.05)
    powercut.checkpoint()
    powercut.cut("clean", 0)
    drained.join()
