"""Consumer.process: retries, dead letters, discovery, assignment, failover (SPEC 5)."""

from __future__ import annotations

import base64
import signal
import threading
import time
from pathlib import Path

import orjson
import pytest

from consumers import Consumer, ProcessingError
from storage_c import Config, Log, ReadBatch

from .support.processes import worker
from .support.storage import SMALL, read_all


def test_retries_then_success(log: Log) -> None:
    log.create_stream("r", 1)
    log.append_batch("r", [b"a", b"b", b"c"], shard=0)
    calls: list[list[bytes]] = []
    errors: list[tuple[str, int]] = []
    stop = threading.Event()

    def handler(batch: ReadBatch) -> None:
        calls.append(batch.payloads)
        if len(calls) <= 2:
            raise RuntimeError(f"flaky {len(calls)}")
        stop.set()

    c = Consumer(log, "r", "g")
    stats = c.process(handler, max_retries=2, retry_backoff=0.001, stop=stop,
                      on_error=lambda exc, batch, retry: errors.append((str(exc), retry)))
    assert calls == [[b"a", b"b", b"c"]] * 3
    assert errors == [("flaky 1", 0), ("flaky 2", 1)]
    assert c.offset(0) == 3
    [info] = [g for g in log.groups("r") if g.name == "g"]
    assert info.acks == 1  # acknowledged once, after the success
    assert stats.failures == 2 and stats.dead_lettered == 0


def test_permanent_failure_goes_to_the_dead_letter_stream(log: Log) -> None:
    log.create_stream("p", 2)
    log.append_batch("p", [b"bad1", b"bad2"], shard=1)
    log.append_batch("p", [b"fine"], shard=0)
    handled: list[bytes] = []
    attempts = [0]

    def handler(batch: ReadBatch) -> None:
        if b"bad1" in batch.payloads:
            attempts[0] += 1
            raise ValueError("cannot parse")
        handled.extend(batch.payloads)

    c = Consumer(log, "p", "g")
    deadline = time.monotonic() + 20
    c.process(handler, max_retries=3, retry_backoff=0.001,
              stop=lambda: (c.lag() == 0 and c.lag(0) == 0) or time.monotonic() > deadline)
    assert attempts[0] == 4  # the first try and three retries, then it moved on
    assert handled == [b"fine"]
    assert (c.offset(0), c.offset(1)) == (1, 2)
    dlq = read_all(log, "p.dlq", 1)
    records = [orjson.loads(p) for _, _, p in dlq]
    assert [r["id"] for r in records] == ["1-0", "1-1"]
    # not JSON: the one envelope of comet.export, as in HTTP reads and comet ship
    assert [r["payload"] for r in records] == [{"base64": base64.b64encode(b"bad1").decode()},
                                               {"base64": base64.b64encode(b"bad2").decode()}]
    assert all("cannot parse" in r["error"] and r["attempts"] == 4 for r in records)


def test_permanent_failure_can_stop_instead(log: Log) -> None:
    log.create_stream("s", 1)
    log.append("s", b"poison", shard=0)
    c = Consumer(log, "s", "g")

    def handler(batch: ReadBatch) -> None:
        raise KeyError("nope")

    with pytest.raises(ProcessingError, match="failed 2 times on s shard 0 entries 0..0"):
        c.process(handler, max_retries=1, retry_backoff=0.001, dead_letter=False)
    assert c.offset(0) == 0  # nothing acknowledged: the next run meets it again
    assert "s.dlq" not in log.streams()


def test_cold_discovery(data_dir: Path) -> None:
    """process() starts before the stream exists and picks up its shards."""
    got: list[bytes] = []
    stop = threading.Event()
    with Log(data_dir, SMALL) as log:
        c = Consumer(log, "cold", "g")

        def handler(batch: ReadBatch) -> None:
            got.extend(batch.payloads)
            if len(got) >= 3:
                stop.set()

        t = threading.Thread(target=c.process, args=(handler,),
                             kwargs={"poll_interval": 0.01, "stop": stop})
        t.start()
        time.sleep(0.2)
        assert c.shards() == []
        log.create_stream("cold", 4)
        time.sleep(0.1)
        log.append("cold", b"one", shard=3)
        log.append("cold", b"two", shard=0)
        log.append("cold", b"three", shard=2)
        t.join(timeout=20)
        stop.set()
        assert sorted(got) == [b"one", b"three", b"two"]


def test_three_processes_split_nine_shards(data_dir: Path, tmp_path: Path) -> None:
    with Log(data_dir, Config(shards=9, segment_bytes=1 << 20)) as log:
        log.create_stream("split", 9)
        for shard in range(9):
            log.append_batch("split", [b"%d:%d" % (shard, i) for i in range(500)], shard=shard)
    outs = [tmp_path / f"out{i}" for i in range(3)]
    procs = [worker("consume_assigned", data_dir, "split", "workers", i, 3, outs[i]) for i in range(3)]
    for p in procs:
        assert p.wait(timeout=120) == 0
    seen = [o.read_bytes().split(b"\n") for o in outs]
    for i, payloads in enumerate(seen):
        assert {int(p.split(b":")[0]) % 3 for p in payloads} == {i}
    union = [p for payloads in seen for p in payloads]
    assert len(union) == len(set(union)) == 9 * 500


def test_failover_after_kill_9(data_dir: Path, tmp_path: Path) -> None:
    with Log(data_dir, Config(shards=1, segment_bytes=1 << 20)) as log:
        log.append_batch("f", [b"%d" % i for i in range(200)], shard=0)
    handled = tmp_path / "handled"
    first = worker("consume_slowly", data_dir, "f", "g", handled)
    while not handled.exists() or len(handled.read_bytes().split()) < 60:
        time.sleep(0.01)
    first.send_signal(signal.SIGKILL)  # in the middle of its third batch
    first.wait()
    with Log(data_dir, SMALL) as log:
        acked = log.group("f", 0, "g").offset
    before = [int(x) for x in handled.read_bytes().split()]
    assert acked % 25 == 0 and 0 < acked < len(before) <= 200
    second_log = tmp_path / "second"
    second = worker("consume_slowly", data_dir, "f", "g", second_log)
    while not second_log.exists() or len(second_log.read_bytes().split()) < 200 - acked:
        assert second.poll() is None
        time.sleep(0.05)
    second.kill()
    second.wait()
    after = [int(x) for x in second_log.read_bytes().split()]
    assert after[: 200 - acked] == list(range(acked, 200))  # only the unacknowledged again
    assert set(before) | set(after) == set(range(200))  # nothing lost
