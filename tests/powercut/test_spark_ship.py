"""Power cuts while ``comet spark-ship`` ships a stream into a local lake: exactly once.

The log, the group's offsets and the lake (plans, staged and published
Parquet files, manifests) are all on the power-cut mount.  In each round a
writer appends JSON entries (durability ``interval``, a 10 s flush) while
the real ``comet spark-ship`` command runs one run (Spark ``local[2]``); the cut comes at one of the run's crash points
(``spark_jobs.ship.crash_point``: planned, written, publishing, published,
manifested, acking - the process waits there until the power goes), after
the run ended, or at a random moment of the run.  After each cut, before anything reopens the log,
the lake is read through its manifests; the next writer's reopen says which
entries survived.  Checked after every cut:

- every file a manifest lists is there and whole (Parquet that reads), and
  holds rows only for entries that survived, with their values; no manifest
  range reaches past the surviving entries (the log would give those numbers
  to new entries, which the next run, starting after the manifest, would
  never ship);
- per shard the manifests' ranges run without a gap or an overlap from entry
  0, each entry of them is a row exactly once, and the group's acknowledged
  offset (as the offsets file holds it after the cut) is not past them;
- the next round's run is the rerun; after the last cut a run to the end must
  leave every surviving entry in the lake exactly once.

Spark takes ~5 s to start on the CI box's 2 CPUs and a cut kills the driver,
so every cut costs a driver start (~8-10 s a round in all): POWERCUT_SPARK_CUTS
(default 15, ~2.5 min) cuts rather than 30, each crash point and the end of a
run hit once, the others at random moments (the test prints where).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import time
from pathlib import Path

import pyarrow.parquet as pq

from .checks import shard_entries
from .harness import PowerCutFS, Writer, discard_output, drain, make_synced_dir, read_state
from .scenarios import durable_stream

SPARK_CUTS = int(os.environ.get("POWERCUT_SPARK_CUTS", "15"))
POINTS = ["planned", "written", "publishing", "published", "manifested", "acking", "end"]
# fsync_interval_ms = 10 s: a round takes less, so what a run plans is not
# durable in the log unless the run makes it so
ENV = {"POWERCUT_RATE": "100", "POWERCUT_JSON": "1", "POWERCUT_FSYNC_MS": "10000"}


def read_lake(lake: Path, where: str) -> list[dict]:
    """The manifests in run order, each with ``rows``: (shard, entry, p, pad)
    of every row of its files (which must all be there, whole)."""
    out = []
    manifests = lake / "_comet" / "events" / "manifests"
    for path in sorted(manifests.glob("[0-9]*.json")) if manifests.is_dir() else []:
        doc = json.loads(path.read_bytes())
        rows: list[tuple[int, int, str, str]] = []
        for f in doc["files"]:
            assert f["kind"] == "data", f"{where}: run {doc['run']} rejected entries: {f}"
            file = lake / f["path"]
            assert file.is_file(), (f"{where}: manifest {path.name} lists {f['path']}, which is "
                                    f"not in the lake")
            try:
                table = pq.read_table(file)
            except Exception as exc:
                raise AssertionError(f"{where}: {f['path']} (listed by {path.name}) does not "
                                     f"read: {exc}") from None
            assert table.num_rows == f["rows"], (
                f"{where}: {f['path']} holds {table.num_rows} rows, its manifest says {f['rows']}")
            cols = table.to_pydict()
            rows += zip(cols["_comet_shard"], cols["_comet_entry"], cols["p"], cols["pad"])
        doc["rows_read"] = rows
        out.append(doc)
    return out


def check_lake(manifests: list[dict], state: dict, where: str, complete: bool) -> None:
    shards = state["streams"]["events"]
    present = []
    for info in shards:
        values = {}
        for entry, payload in shard_entries(info).items():
            value = json.loads(payload)
            values[entry] = (value["p"], value["pad"])
        present.append(values)
    ends = [0] * len(shards)
    seen: set[tuple[int, int]] = set()
    for doc in manifests:
        run = f"run {doc['run']}"
        for key, (start, end) in doc["ranges"].items():
            shard = int(key)
            assert start == ends[shard], (
                f"{where}: {run} ships shard {shard} from {start}, the runs before it up to "
                f"{ends[shard]}: {'a gap' if start > ends[shard] else 'entries twice'}")
            assert end <= shards[shard]["next"], (
                f"{where}: {run}'s manifest covers shard {shard} up to {end - 1}, but only entries "
                f"below {shards[shard]['next']} survived the cut")
            ends[shard] = max(ends[shard], end)
        assert doc["missing"] == 0, f"{where}: {run} found {doc['missing']} entries missing"
        for shard, entry, p, pad in doc["rows_read"]:
            start, end = doc["ranges"][str(shard)]
            assert start <= entry < end, f"{where}: {run} has a row of {shard}/{entry} off its range"
            assert (shard, entry) not in seen, f"{where}: entry {shard}/{entry} is in the lake twice"
            seen.add((shard, entry))
            assert present[shard].get(entry) == (p, pad), (
                f"{where}: {run}: the row of entry {shard}/{entry} is {(p, pad)}, the log holds "
                f"{present[shard].get(entry)}")
    for shard, info in enumerate(shards):
        shipped = {e for s, e in seen if s == shard}
        assert shipped == set(range(ends[shard])), (
            f"{where}: shard {shard}: the manifests cover entries below {ends[shard]}, rows exist "
            f"for {len(shipped)} of them")
        acked = state["raw_offsets"].get(f"events/shard-{shard:04d}", {}).get("spark-ship")
        assert acked is None or acked <= ends[shard], (
            f"{where}: shard {shard}: group spark-ship acknowledged entries below {acked}, the "
            f"lake's manifests end at {ends[shard]}")
        if complete:
            assert ends[shard] == info["next"], (
                f"{where}: shard {shard}: after a run to the end the lake holds entries below "
                f"{ends[shard]}, the log {info['next']}")


def wait_for(proc: Writer, prefix: str, event: str | None = None) -> bool:
    """Reads the driver's lines until one starts with ``prefix`` (with
    ``event``: the JSON log line ``L {...}`` of that event); False if it
    ended first."""
    assert proc.stdout
    while True:
        line = proc.stdout.readline()
        if not line:
            return False
        if line.startswith(prefix) and (event is None or json.loads(line[2:]).get("event") == event):
            return True


def test_spark_ship_to_a_local_lake_exactly_once_across_power_cuts(powercut: PowerCutFS) -> None:
    data = make_synced_dir(powercut.mnt / "data")
    lake = make_synced_dir(powercut.mnt / "lake")
    rng = random.Random("spark-ship")
    durable_stream(powercut, data, "interval", ENV)
    started = time.monotonic()
    points = POINTS[:] + ["random"] * max(0, SPARK_CUTS - len(POINTS))
    rng.shuffle(points)
    hit: dict[str, int] = {}
    for rnd in range(1, SPARK_CUTS + 1):
        where = f"after cut {rnd - 1}"
        before = read_lake(lake, where)  # as the cut left it, before any process runs
        writer = powercut.spawn("append", data, rnd, rng.randrange(1 << 30), "interval", 2,
                                env=ENV)
        check_lake(before, read_state(writer), where, complete=False)
        drained = discard_output(writer)
        point = points[rnd - 1]
        driver = powercut.spawn("spark-ship", data, rnd, 0, lake, point,
                                stdin=subprocess.PIPE, whole_namespace=True)
        if point == "random":
            assert wait_for(driver, "L ", event="run_start"), (
                f"round {rnd}: spark-ship ended before its run started: "
                f"{driver.stderr_path.read_text()[-3000:]}")
            time.sleep(rng.uniform(0, 3.0))
        elif point == "end":  # the run is over, the process closed the log (acks synced)
            assert wait_for(driver, "X"), f"round {rnd}: {driver.stderr_path.read_text()[-3000:]}"
            driver.wait()
        else:
            assert wait_for(driver, f"P {point}"), (
                f"round {rnd}: spark-ship never reached {point} (exit {driver.wait()}): "
                f"{driver.stderr_path.read_text()[-3000:]}")
        hit[point] = hit.get(point, 0) + 1
        powercut.cut("clean", rng.randrange(1 << 30))
        drained.join()
        drain(driver)
    where = f"after cut {SPARK_CUTS}"
    before = read_lake(lake, where)
    last = powercut.spawn("spark-ship", data, SPARK_CUTS + 1, 0, lake, "none", "dump",
                          stdin=subprocess.PIPE, whole_namespace=True)
    state = read_state(last)
    check_lake(before, state, where, complete=False)
    assert wait_for(last, "X"), f"the last run failed: {last.stderr_path.read_text()[-3000:]}"
    assert last.wait() == 0
    check_lake(read_lake(lake, "at the end"), state, "after the run to the end", complete=True)
    elapsed = time.monotonic() - started
    rows = sum(s["next"] for s in state["streams"]["events"])
    print(f"\nspark-ship: {SPARK_CUTS} cuts (at {sorted(hit.items())}), {rows} entries in the "
          f"lake at the end, exactly once; {elapsed:.1f} s ({elapsed / SPARK_CUTS:.1f} s per cut)")


# ---- regression tests: one cut each ------------------------------------------------------


def one_run_then_cut(powercut: PowerCutFS, point: str) -> tuple[list[dict], dict]:
    """The stream exists durably, a writer appends (``interval``, 10 s flush),
    one spark-ship run goes to ``point`` (a crash point, or ``end``: the run is
    over), the power goes.  Returns the lake's manifests and what survived."""
    data = make_synced_dir(powercut.mnt / "data")
    lake = make_synced_dir(powercut.mnt / "lake")
    durable_stream(powercut, data, "always", ENV)
    writer = powercut.spawn("append", data, 1, 1, "interval", 2, env=ENV)
    read_state(writer)
    drained = discard_output(writer)
    driver = powercut.spawn("spark-ship", data, 1, 0, lake, point, stdin=subprocess.PIPE,
                            whole_namespace=True)
    assert wait_for(driver, "X" if point == "end" else f"P {point}"), \
        driver.stderr_path.read_text()[-3000:]
    powercut.cut("clean", 1)
    drained.join()
    drain(driver)
    manifests = read_lake(lake, "after the cut")
    assert manifests, f"no manifest survived the cut at {point}"
    return manifests, read_state(powercut.spawn("dump", data, 2, 0, "interval", 2))


def test_a_manifest_names_only_durable_entries(powercut: PowerCutFS) -> None:
    """Was a bug: a run planned up to the committed end of each shard, entries
    the writers had not synced yet (``interval``).  A power cut after the
    manifest took them back from the log but not from the lake; the log gave
    their numbers to new entries, which the next run (starting after the
    manifest) never shipped."""
    manifests, state = one_run_then_cut(powercut, "manifested")
    check_lake(manifests, state, "after the cut", complete=False)


def test_lake_directories_survive_a_power_cut(powercut: PowerCutFS) -> None:
    """Was a bug: ``_comet/<stream>/plans``, ``.../manifests`` and new
    ``stream=/dt=/hour=`` partitions were created without syncing their
    parents (``write_durably`` and the publishing step sync only the
    directory of the file).  After a cut following a whole run, the manifest
    and the files were gone, the group's acks (synced when the run closed the
    log) not: the run's entries were never to be shipped again."""
    manifests, state = one_run_then_cut(powercut, "end")
    check_lake(manifests, state, "after the cut", complete=False)
