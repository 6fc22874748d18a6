"""Exactly once from a client's first attempt to the lake, across power cuts.

The real ``comet serve`` (two workers, ``durability = "always"``) runs on the
power-cut filesystem; four ``gateway.client.CometClient`` post batches of events,
each with its own Idempotency-Key, and retries every batch whose answer it did
not get with the same key.  The power goes several times at random moments
while it posts (the gateway dies with it; the filesystem keeps only what was
synced, in a new boot) and the gateway is started again on what is left.
Then ``spark-ship`` writes the stream into a Delta table: every event the
client sent is there exactly once - none lost (a 202 under ``always`` is on
disk), none twice (a retry of a stored batch is a replay).
"""

from __future__ import annotations

import http.client
import threading
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from gateway.client import CometClient, CometHTTPError, PostResult
from spark_jobs.lake.read import read_table
from spark_jobs.lake.lakefs import Lake
from spark_jobs.spark.ship import ShipOptions, ship
from storage_c import Config

from ..support.lake import check_exactly_once
from ..support.server import free_port
from .harness import SEED, PowerCutFS, Writer, discard_output, make_synced_dir, seeded

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

EVENTS, BATCH, CUTS_HERE, PRODUCERS = 6000, 25, 4, 4
ENV = {"COMET_ACCESS_LOG": "0", "COMET_STORAGE_SHARDS": "4",
       "COMET_STORAGE_DURABILITY": "always", "COMET_STORAGE_SEGMENT_BYTES": str(1 << 20)}
T0_MS = 1_763_700_000_000


def start(powercut: PowerCutFS, data: Path, port: int) -> Writer:
    proc = powercut.spawn("serve", data, 0, 0, port, env=ENV, whole_namespace=True)
    discard_output(proc)
    deadline = time.monotonic() + 60
    ready = 0
    while ready < 4:  # both workers, answered a few times over new connections
        assert proc.poll() is None, f"comet serve exited: {proc.stderr_path.read_text()[-3000:]}"
        assert time.monotonic() < deadline, "comet serve not ready in 60 s"
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/readyz")
            ready += conn.getresponse().status == 200
            conn.close()
        except OSError:
            time.sleep(0.05)
    return proc


def post_all(url: str, batches: range, results: list[PostResult],
             errors: list[BaseException]) -> None:
    try:
        client = CometClient(url, timeout=5, max_attempts=1000, max_retry_s=300)
        for b in batches:
            batch = [{"id": i, "at": T0_MS + i * 1000} for i in range(b * BATCH, (b + 1) * BATCH)]
            key = None
            for _ in range(100):
                try:
                    results.append(client.post("ev", batch, idempotency_key=key))
                    break
                except CometHTTPError as exc:
                    # The filesystem fails every call from the cut's instant until the
                    # gateway is killed a moment later (a real cut leaves no such
                    # window): its I/O errors are 500s.  What they stored, if anything,
                    # may have survived: the batch is sent again with its key.
                    if exc.status != 500 or "Input/output error" not in exc.detail:
                        raise
                    key = exc.idempotency_key
            else:
                raise AssertionError(f"batch {b}: 100 answers of 500 in a row")
    except BaseException as exc:  # reported by the test
        errors.append(exc)


def test_every_event_in_the_lake_once_across_power_cuts(powercut: PowerCutFS, spark: SparkSession,
                                                       tmp_path: Path) -> None:
    rng = seeded("gateway-exactly-once")
    data = make_synced_dir(powercut.mnt / "data")
    port = free_port()
    server = start(powercut, data, port)
    results: list[PostResult] = []
    errors: list[BaseException] = []
    url = f"http://127.0.0.1:{port}"
    posters = [threading.Thread(target=post_all,
                                args=(url, range(k, EVENTS // BATCH, PRODUCERS), results, errors))
               for k in range(PRODUCERS)]  # several requests in flight when the power goes
    for t in posters:
        t.start()
    for cut in range(CUTS_HERE):
        target = len(results) + rng.randrange(5, (EVENTS // BATCH) // (CUTS_HERE + 1))
        while len(results) < target and any(t.is_alive() for t in posters):
            time.sleep(0.01)
        powercut.cut("pages" if cut % 2 else "clean", rng.randrange(1 << 30))
        server = start(powercut, data, port)
    for t in posters:
        t.join(timeout=600)
    assert not any(t.is_alive() for t in posters), "the clients did not finish in 10 minutes"
    assert not errors, f"seed {SEED}: the client failed: {errors[0]!r}"
    powercut.kill(server)
    assert len(results) == EVENTS // BATCH
    replays = sum(r.replayed for r in results)
    lake = Lake(str(tmp_path / "lake"))
    report = ship(ShipOptions(str(data), "ev", lake, event_time_field="at"), lambda: spark)
    check_exactly_once(lake, data, "ev", Config(shards=4))
    ids = sorted(int(i) for i in read_table(lake, "ev").column("id").to_pylist() if i is not None)
    twice = sorted(i for i, n in Counter(ids).items() if n > 1)
    assert not twice, f"seed {SEED}: events in the lake more than once: {twice[:20]}"
    missing = sorted(set(range(EVENTS)) - set(ids))
    assert not missing, f"seed {SEED}: events the gateway acknowledged are not in the lake: {missing[:20]}"
    print(f"\ngateway exactly once: {CUTS_HERE} power cuts, {len(results)} batches "
          f"({replays} answered by a replay), {report.rows} rows shipped, seed {SEED}")
