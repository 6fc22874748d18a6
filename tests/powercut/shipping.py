"""What the power-cut tests of ``comet ship`` share (test_ship.py: a directory
sink; test_ship_otlp.py: an OTLP endpoint): reading a directory sink's
objects, checking a sink against what survived in the log, and the rounds of
a writer and a shipper cut by the power (``run_ship``, described in
test_ship.py's docstring)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Callable

import zstandard

from .checks import shard_digests
from .harness import CUTS, PowerCutFS, Writer, discard_output, drain, make_synced_dir, read_state, seeded
from .scenarios import durable_stream
from .writer import digest

KEY = re.compile(r"^stream=events/dt=\d{4}-\d\d-\d\d/hour=\d\d/shard=(?P<shard>\d{4})/"
                 r"(?P<first>\d{20})-(?P<last>\d{20})\.ndjson\.zst$")
TEMP = re.compile(r"^\..+\.\d+\.tmp$")
RATE = "100"  # appends per second: the shipper keeps up, and ships entries not yet durable
FSYNC_MS = "1000"  # the writer's fsync_interval_ms: the default (comet ship polls every 0.5 s)

Objects = dict[int, list[tuple[int, int, list[str]]]]  # shard -> (first, last, payloads)


def read_sink(root: Path, where: str) -> Objects:
    """The objects of the sink, each checked whole; temporary files are skipped."""
    out: Objects = {}
    for path in sorted(root.rglob("*")):
        if path.is_dir() or TEMP.match(path.name):
            continue
        key = path.relative_to(root).as_posix()
        m = KEY.match(key)
        assert m, f"{where}: a file in the sink that is no object: {key}"
        raw = path.read_bytes()
        try:
            text = zstandard.ZstdDecompressor().decompress(raw).decode()
        except zstandard.ZstdError as exc:
            raise AssertionError(f"{where}: object {key} is not whole ({len(raw)} bytes): "
                                 f"{exc}") from None
        lines = text.split("\n")
        assert lines[-1] == "", f"{where}: object {key} does not end with a newline"
        out.setdefault(int(m["shard"]), []).append(
            (int(m["first"]), int(m["last"]), lines[:-1]))
    return out


def check_sink(objects: Objects, state: dict, where: str, complete: bool) -> int:
    """See the module docstring; ``complete``: after a run to the end.  Returns
    how many objects the sink holds."""
    shards = state["streams"]["events"]
    count = 0
    for shard, info in enumerate(shards):
        present = shard_digests(info, where)
        expect = info["first"]
        for first, last, lines in sorted(objects.get(shard, [])):
            name = f"shard {shard} object {first}-{last}"
            assert first <= expect, (f"{where}: {name}: entries {expect}..{first - 1} were never "
                                     f"shipped (a gap before it)")
            assert first == expect, (f"{where}: {name} overlaps the previous object (shipped "
                                     f"before up to {expect - 1}): entries shipped twice")
            assert len(lines) == last - first + 1, (
                f"{where}: {name} holds {len(lines)} lines for {last - first + 1} entries")
            assert last < info["next"], (
                f"{where}: {name} refers to entries up to {last}, but only entries below "
                f"{info['next']} survived the cut (durable point {info['durable']})")
            wrong = [(first + i, line[:40], present.get(first + i)) for i, line in enumerate(lines)
                     if present.get(first + i) != digest(line.encode())]
            assert not wrong, (f"{where}: {name}: lines that are not the surviving entries "
                               f"(entry, shipped line's start, digest in the log): {wrong[:5]}")
            expect = last + 1
            count += 1
        acked = state["raw_offsets"].get(f"events/shard-{shard:04d}", {}).get("ship")
        assert acked is None or acked <= expect, (
            f"{where}: shard {shard}: group ship acknowledged up to {acked - 1}, the sink "
            f"holds entries below {expect} only: acknowledged entries never shipped")
        if complete:
            assert expect == info["next"], (
                f"{where}: shard {shard}: after a run to the end the sink holds entries below "
                f"{expect}, the log {info['next']}")
    return count


def shipped_events(proc: Writer, count: int) -> tuple[int, bool]:
    """Reads the shipper's lines until ``count`` objects were stored, or it
    ended: (objects stored, whether it ended)."""
    assert proc.stdout
    seen = 0
    while seen < count:
        line = proc.stdout.readline()
        if not line or line.startswith("X"):
            return seen, True
        if line.startswith("L ") and json.loads(line[2:]).get("event") in ("shipped", "delivered"):
            seen += 1
    return seen, False


def finish(proc: Writer, where: str, ended: bool) -> None:
    """Waits for a ``--once`` shipper to end (``ended``: its ``X`` line was
    read already); it must end well."""
    assert proc.stdout
    rest = proc.stdout.read()
    code = proc.wait()
    assert code == 0 and (ended or "\nX\n" in "\n" + rest), (
        f"{where}: comet ship --once failed (exit {code}): {rest[-2000:]}\n"
        f"{proc.stderr_path.read_text()[-3000:]}")


def run_ship(powercut: PowerCutFS, mode: str, cuts: int, target: str | None = None,
             read: Callable[[str], Objects] | None = None) -> None:
    """Rounds of a writer and a shipper cut by the power, each checked (see
    the module docstring).  The sink is a directory on the power-cut mount,
    or ``target`` (an OTLP endpoint off the mount) read by ``read``."""
    data = make_synced_dir(powercut.mnt / "data")
    sink: Path | str = target or make_synced_dir(powercut.mnt / "sink")
    reader = read or (lambda where: read_sink(Path(sink), where))
    rng = seeded(f"ship-{mode}" + ("-otlp" if target else ""))
    env = {"POWERCUT_RATE": RATE, "POWERCUT_FSYNC_MS": FSYNC_MS}
    durable_stream(powercut, data, "interval", env)
    started = time.monotonic()
    objects = shipped = rerun_cuts = 0
    for rnd in range(1, cuts + 2):
        where = f"after cut {rnd - 1}"
        before = reader(where)  # as the cut left it, before any process runs
        rerun = powercut.spawn("ship", data, rnd, 0, sink, "once", "dump")
        state = read_state(rerun)
        check_sink(before, state, where, complete=False)
        ended = False
        if rnd <= cuts and rng.random() < 0.25:
            # the cut hits the rerun, if it has anything left to ship
            _, ended = shipped_events(rerun, rng.randrange(1, 4))
            if not ended:
                powercut.cut(mode, rng.randrange(1 << 30))
                drain(rerun)
                rerun_cuts += 1
                continue
        finish(rerun, f"{where}, the rerun", ended)
        objects = check_sink(reader(f"{where}, rerun"), state, f"{where}, rerun", complete=True)
        if rnd == cuts + 1:
            break
        # interval: the shipper reads entries that are not durable yet; always:
        # what follows the shipped objects survives the cut too, so that a
        # rerun that cut objects elsewhere would ship entries twice
        durability = rng.choice(["interval", "always"])
        writer = powercut.spawn("append", data, rnd, rng.randrange(1 << 30), durability, 2,
                                env=env)
        read_state(writer)
        drained = discard_output(writer)
        shipper = powercut.spawn("ship", data, rnd, 0, sink, "follow")
        shipped += shipped_events(shipper, rng.randrange(1, 6))[0]
        # the cut comes at a random moment of the shipper's next object: writing
        # its intent, storing it, acknowledging it (0.05 s: its --max-object-age)
        time.sleep(rng.uniform(0, 0.1))
        powercut.cut(mode, rng.randrange(1 << 30))
        drained.join()
        drain(shipper)
    elapsed = time.monotonic() - started
    print(f"\nship/{mode}{' to OTLP' if target else ''}: {cuts} cuts ({rerun_cuts} during a rerun), {shipped} objects stored "
          f"before cuts, {objects} objects at the end, {elapsed:.1f} s "
          f"({elapsed / cuts * 1000:.0f} ms per cut)")
