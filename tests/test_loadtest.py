"""The locust load test (loadtests/loadtest.py, loadtests/locustfile.py): the no-loss
check (tests/support/noloss.py) on made-up logs and locust records that hold a loss, a
duplicate, a misplaced batch..., then a short real run against `comet serve`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
import orjson
import pytest
import zstandard

from loadtests import loadtest as lt
from storage_c import Config, Log

from .support.noloss import NoLossReport, check, check_stored_once, locust_acks

REPO = Path(__file__).resolve().parent.parent
CONFIG = Config(shards=4, segment_bytes=64 << 10, background_flush=False, retention_interval_ms=0,
                retention_protect_unconsumed=False)


def events(rid: str, n: int) -> list[bytes]:
    return [orjson.dumps({"r": rid, "i": i, "msg": "x" * 100}) for i in range(n)]


class Fake:
    """A data directory and the records a locust run would have left."""

    def __init__(self, tmp: Path) -> None:
        self.data = tmp / "data"
        self.records = tmp / "records"
        self.records.mkdir()
        self.lines: list[dict[str, object]] = []
        self.log = Log(self.data, CONFIG)
        self.count = 0

    def post(self, n: int = 10, *, shard: int | None = None, key: str | None = None,
             store: int = 1, record: bool = True, status: int = 202) -> tuple[str, int, int]:
        """Stores a request's events ``store`` times; records its answer."""
        self.count += 1
        rid = f"{os.getpid():x}.{self.count:x}"
        res = None
        for _ in range(store):
            res = self.log.append_batch("ev", events(rid, n), shard=shard if key is None else None,
                                        key=key)
        if record and status == 202:
            assert res is not None
            self.lines.append({"r": rid, "s": "ev", "sh": res.shard, "f": res.first,
                               "l": res.last, "n": n, "k": key})
        elif record:
            self.lines.append({"r": rid, "s": "ev", "n": n, "st": status})
        return rid, (res.shard if res else -1), (res.first if res else -1)

    def check(self, sink: Path | None = None) -> NoLossReport:
        self.log.close()
        with open(self.records / "acks-1.ndjson", "w") as f:
            for line in self.lines:
                f.write(json.dumps(line) + "\n")
        return check(self.data, locust_acks(self.records), sink)


@pytest.fixture
def fake(tmp_path: Path) -> Fake:
    return Fake(tmp_path)


def test_exact_match_passes(fake: Fake) -> None:
    for i in range(20):
        fake.post(1 + i % 7, shard=i % 4)
    fake.post(5, key="device-7")
    rep = fake.check()
    assert rep.ok, rep.problems
    assert rep.acked_events == rep.stored_events == rep.matched == sum(1 + i % 7 for i in range(20)) + 5


def test_a_missing_entry_is_a_loss(fake: Fake) -> None:
    fake.post(10, shard=0)
    fake.lines.append({"r": "feed.1", "s": "ev", "sh": 0, "f": 10, "l": 14, "n": 5, "k": None})
    rep = fake.check()
    assert rep.lost == 5 and not rep.ok
    assert any("lost" in p for p in rep.problems)


def test_a_batch_stored_twice_is_a_duplicate(fake: Fake) -> None:
    fake.post(10, shard=1, store=2)  # one 202 recorded, the batch twice in the log
    rep = fake.check()
    assert rep.duplicates == 10 and rep.lost == 0 and not rep.ok
    assert rep.stored_events == 20 and rep.acked_events == 10


def test_an_ack_pointing_at_other_events_is_a_loss(fake: Fake) -> None:
    fake.post(4, shard=2)
    fake.post(4, shard=2)
    fake.lines[1]["f"], fake.lines[1]["l"] = 0, 3  # the second 202 claims the first's entries
    rep = fake.check()
    # Its own events, where they really are, count as stored outside their 202's range.
    assert rep.overlapping_acks == 1 and rep.lost == 4 and rep.duplicates == 4 and not rep.ok


def test_another_event_where_the_202_said_is_a_loss(fake: Fake) -> None:
    fake.post(4, shard=3)
    fake.lines[0]["r"] = "other.1"  # the 202's entries hold some other request's events
    rep = fake.check()
    assert rep.misplaced == 4 and rep.lost == 4 and not rep.ok


def test_stored_after_an_error_answer(fake: Fake) -> None:
    fake.post(3, shard=0, status=500)
    rep = fake.check()
    assert rep.stored_after_error == 3 and not rep.ok


def test_stored_without_an_answer_breaks_the_identity(fake: Fake) -> None:
    fake.post(2, shard=0)
    fake.post(3, shard=0, status=0)  # the client got no answer
    fake.post(4, shard=1, record=False)  # the client died before recording anything
    rep = fake.check()
    assert rep.unanswered_stored == 7 and rep.lost == 0 and rep.duplicates == 0 and not rep.ok


def test_an_unanswered_request_stored_twice_is_a_duplicate(fake: Fake) -> None:
    fake.post(2, shard=0)
    fake.post(3, shard=1, status=0, store=2)  # no answer, and the batch twice in the log
    rep = fake.check()
    assert rep.duplicates == 3 and rep.unanswered_stored == 3 and not rep.ok


def test_without_exact_an_unanswered_request_may_be_stored_once(fake: Fake) -> None:
    fake.post(2, shard=0)
    fake.post(3, shard=1, status=0)
    fake.check()
    acks = locust_acks(fake.records)
    assert check(fake.data, acks, exact=False).ok
    client = SimpleNamespace(acks=acks)
    assert check_stored_once(fake.data, [client]) == 2
    with pytest.raises(AssertionError, match="stored != acknowledged"):
        check_stored_once(fake.data, [client], exact=True)
    acks.acknowledged("ev", 0, 2, 1, "nothing.there")  # a 202 for an entry never stored
    with pytest.raises(AssertionError, match="1 acknowledged events lost"):
        check_stored_once(fake.data, [client])


def test_keyed_request_in_the_wrong_shard(fake: Fake) -> None:
    fake.post(3, key="device-1")
    fake.post(3, key="device-2")
    want = fake.log.shard_for_key("ev", "device-2")
    # Store a keyed request elsewhere, as a broken gateway would, and record it so.
    rid = "bad.1"
    res = fake.log.append_batch("ev", events(rid, 3), shard=(want + 1) % 4)
    fake.lines.append({"r": rid, "s": "ev", "sh": res.shard, "f": res.first, "l": res.last,
                       "n": 3, "k": "device-2"})
    rep = fake.check()
    assert rep.wrong_shard_keys == 1 and rep.lost == 0 and not rep.ok


def ship(log: Log, sink: Path, shard: int, first: int, last: int) -> Path:
    """An object as `comet ship` writes it."""
    batch = log.read("ev", shard, first, last - first + 1)
    assert batch.entries[0] == first and batch.entries[-1] == last
    path = (sink / "ev" / "dt=2026-01-01" / "hour=00" / f"shard={shard:04d}"
            / f"{first:020d}-{last:020d}.ndjson.zst")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(zstandard.ZstdCompressor(write_content_size=True).compress(
        b"".join(p + b"\n" for p in batch.payloads)))
    return path


def test_soak_entries_deleted_by_retention_must_be_in_the_sink(tmp_path: Path, fake: Fake) -> None:
    for _ in range(60):
        fake.post(50, shard=0)
    sink = tmp_path / "sink"
    end = fake.log.shard_stats("ev", 0).next_entry
    objects = [ship(fake.log, sink, 0, a, min(a + 499, end - 1)) for a in range(0, end - 500, 500)]
    fake.log.close()
    # Retention, as the gateway's workers would run it, deletes shipped segments.
    with Log(fake.data, Config(background_flush=False, retention_interval_ms=0,
                               retention_max_shard_bytes=200 << 10,
                               retention_protect_unconsumed=False)) as log:
        assert log.run_retention().deleted_segments > 0
        first = log.shard_stats("ev", 0).first_entry
    assert 0 < first <= end - 500
    fake.log = Log(fake.data, CONFIG)
    rep = fake.check(sink)
    assert rep.ok, rep.problems
    assert rep.deleted_by_retention == rep.shipped_only == first
    assert rep.stored_events == rep.acked_events == 3000

    objects[0].unlink()  # a shipped object lost: its entries are nowhere now
    fake.log = Log(fake.data, CONFIG)
    rep = fake.check(sink)
    assert rep.lost == 500 and rep.deleted_unshipped == 500 and not rep.ok

    ship_again = objects[2].read_bytes()  # an overlapping object (exactly-once broken)
    overlap = objects[2].with_name(f"{1001:020d}-{1499:020d}.ndjson.zst")
    lines = zstandard.ZstdDecompressor().decompress(ship_again).split(b"\n")[1:]
    overlap.write_bytes(zstandard.ZstdCompressor(write_content_size=True).compress(b"\n".join(lines)))
    fake.log = Log(fake.data, CONFIG)
    rep = fake.check(sink)
    assert rep.overlapping_objects == 1 and not rep.ok


def processes_mentioning(text: str) -> list[str]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            cmd = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd and str(os.getpid()) != cmdline.parent.name:
            found.append(f"{cmdline.parent.name}: {cmd}")
    return found


@pytest.mark.slow
@pytest.mark.timeout(300)  # creating .venv-locust when missing takes ~20 s more
def test_short_locust_run_loses_nothing(tmp_path: Path) -> None:
    lt.ensure_locust_venv()
    results, scratch = tmp_path / "results", tmp_path / "scratch"
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "loadtests.loadtest", "--run-time", "15", "--users", "8",
         "--results-dir", str(results), "--scratch", str(scratch), "--name", "lt",
         "--max-p95-ms", "2000"],
        capture_output=True, text=True, timeout=150, cwd=REPO)
    wall = time.monotonic() - t0
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    summary = json.loads((results / "lt.json").read_text())
    assert summary["ok"], summary["problems"]
    assert summary["requests"] > 0 and summary["failures"] == 0
    assert summary["events_acked"] == summary["events_stored"] > 0
    assert summary["check"]["matched"] == summary["events_acked"]
    names = set(summary["locust"]["by_name"])
    assert {"single", "batch100", "keyed10", "gzip100", "Aggregated"} <= names
    assert (results / "lt_stats.csv").exists()
    assert summary["workers"] == 2 and summary["p95_ms"] is not None
    assert not processes_mentioning(str(scratch)), "processes left behind"
    assert wall < 60, f"the run took {wall:.0f} s"
