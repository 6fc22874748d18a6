"""Log.append and Log.append_batch take a fast way in C (storage_c/_fastpath.c) in the
common case and the general way (Python) otherwise; both must store the same entries,
number them the same way and raise the same errors.  The fast way appends holding the
GIL unless the append would wait (the core's COMET_APPEND_NOWAIT); then it lets the GIL
go.  wait=False means that same thing in every append method."""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import threading
import time
from pathlib import Path
from typing import Callable

import pytest

from storage_c import Config, Log
from storage_c.errors import (Closed, EntryTooLarge, ShardRangeError, StreamNameError, StreamNotFound,
                              WouldBlock)

from .support.storage import read_all

CONFIG = Config(shards=2, segment_bytes=1 << 20, fsync_interval_ms=50, compression_threshold=4096)


def test_every_way_stores_the_same(data_dir: Path) -> None:
    """Calls that go the fast way and calls that go the general way (durability given,
    a key, payloads that are not bytes, payloads above the compression threshold, a
    generator) interleave on one shard: dense numbering, every payload back as sent."""
    big = b"b" * 10_000  # compressed on the general way
    calls: list[tuple[str, object, dict[str, object]]] = [
        ("one", b"fast", {"shard": 1}),
        ("one", bytearray(b"bytearray"), {"shard": 1}),
        ("one", memoryview(b"memoryview"), {"shard": 1}),
        ("one", b"always", {"shard": 1, "durability": "always"}),
        ("one", big, {"shard": 1}),
        ("batch", [b"f1", b"f2"], {"shard": 1}),
        ("batch", (b"t1", b"t2"), {"shard": 1}),
        ("batch", (p for p in [b"g1", b"g2"]), {"shard": 1}),
        ("batch", [b"x", bytearray(b"y")], {"shard": 1}),
        ("batch", [b"n1", big], {"shard": 1}),
        ("batch", [b"d1"], {"shard": 1, "durability": "none"}),
    ]
    expected: list[bytes] = []
    with Log(data_dir, CONFIG) as log:
        log.create_stream("s", 2)
        for kind, payload, kw in calls:
            if kind == "one":
                shard, entry = log.append("s", payload, **kw)  # type: ignore[arg-type]
                assert (shard, entry) == (1, len(expected))
                expected.append(bytes(payload))  # type: ignore[call-overload]
            else:
                items = [bytes(p) for p in payload]  # type: ignore[attr-defined]
                if not isinstance(payload, (list, tuple)):
                    payload = iter(items)
                result = log.append_batch("s", payload, **kw)  # type: ignore[arg-type]
                assert tuple(result) == (1, len(expected), len(items))
                assert (result.shard, result.first, result.count) == tuple(result)
                expected.extend(items)
        assert [p for _, _, p in read_all(log, "s", 1)] == expected
        assert log.shard_stats("s", 1).compressed_entries == 2


def test_unkeyed_and_keyed_appends_choose_their_shard(data_dir: Path) -> None:
    with Log(data_dir, CONFIG) as log:
        log.create_stream("s", 2)
        shards = [log.append("s", b"r%d" % i)[0] for i in range(6)]
        assert shards == [0, 1, 0, 1, 0, 1]  # in turn, first time through the general way too
        assert [log.append_batch("s", [b"b"]).shard for _ in range(4)] == [0, 1, 0, 1]
        keyed = {log.append("s", b"k", key="device-7")[0] for _ in range(5)}
        keyed |= {log.append_batch("s", [b"k"], key=b"device-7").shard for _ in range(5)}
        assert keyed == {log.shard_for_key("s", "device-7")}


def test_bad_calls_raise_the_same_errors(data_dir: Path) -> None:
    with Log(data_dir, Config(shards=2, max_entry_bytes=1000)) as log:
        log.create_stream("s", 2)
        log.append("s", b"x", shard=0)  # the shard is open: the fast way stores without waiting
        for shard in (2, -1, 1 << 40):
            with pytest.raises(ShardRangeError, match="out of range"):
                log.append("s", b"x", shard=shard)
            with pytest.raises(ShardRangeError, match="out of range"):
                log.append_batch("s", [b"x"], shard=shard)
        with pytest.raises(EntryTooLarge):
            log.append("s", b"x" * 1001, shard=0)
        with pytest.raises(EntryTooLarge):
            log.append_batch("s", [b"x", b"x" * 1001], shard=0)
        with pytest.raises(TypeError, match="bytes-like"):
            log.append("s", 5, shard=0)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="bytes-like"):
            log.append_batch("s", [b"x", 5], shard=0)  # type: ignore[list-item]
        with pytest.raises(TypeError, match="unexpected keyword argument 'shards'"):
            log.append("s", b"x", shards=0)  # type: ignore[call-arg]
        with pytest.raises(TypeError, match="positional"):
            log.append("s", b"x", 0)  # type: ignore[call-arg]
        with pytest.raises(ValueError, match="empty batch"):
            log.append_batch("s", [], shard=0)
        with pytest.raises(StreamNameError):
            log.append("bad name", b"x")
        assert log.shard_stats("s", 0).next_entry == 1  # nothing else was stored
        assert log.shard_stats("s", 1).next_entry == 0
    with pytest.raises(Closed):
        log.append("s", b"x", shard=0)
    with pytest.raises(Closed):
        log.append_batch("s", [b"x"], shard=0)


def test_a_stream_deleted_by_another_handle(data_dir: Path) -> None:
    """The fast way holds the stream's handles: a deletion elsewhere is reported as
    StreamNotFound once, and the next append creates the stream anew."""
    with Log(data_dir, CONFIG) as log, Log(data_dir, CONFIG) as other:
        log.create_stream("s", 2)
        assert log.append("s", b"a", shard=0) == (0, 0)
        assert log.append_batch("s", [b"b"], shard=0).first == 1
        other.delete_stream("s")
        with pytest.raises(StreamNotFound):
            log.append("s", b"c", shard=0)
        assert log.append("s", b"c", shard=0) == (0, 0)
        other.delete_stream("s")
        with pytest.raises(StreamNotFound):
            log.append_batch("s", [b"d"], shard=0)
        assert log.append_batch("s", [b"d"], shard=0).first == 0


def _append_lock(mapped: mmap.mmap) -> tuple[ctypes.CDLL, ctypes.c_void_p]:
    """libc, and the address of the shard's append lock in its mapped state file."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    address = ctypes.addressof(ctypes.c_char.from_buffer(mapped, 64))  # FORMAT.md: shard state
    return libc, ctypes.c_void_p(address)


def test_an_append_that_waits_lets_the_gil_go(data_dir: Path) -> None:
    """With the shard's append lock held elsewhere, an append waits for it with the GIL
    let go: another Python thread keeps running meanwhile, and the append completes
    once the lock is free."""
    with Log(data_dir, CONFIG) as log:
        log.create_stream("s", 2)
        log.append("s", b"first", shard=0)
        state = data_dir / "s" / "shard-0000" / "state"
        with open(state, "r+b") as f:
            mapped = mmap.mmap(f.fileno(), 4096)
        libc, lock = _append_lock(mapped)
        holder_locked, release = threading.Event(), threading.Event()

        def hold() -> None:  # the lock is held by a thread that is not appending
            assert libc.pthread_mutex_lock(lock) == 0
            holder_locked.set()
            release.wait()
            assert libc.pthread_mutex_unlock(lock) == 0

        holder = threading.Thread(target=hold)
        holder.start()
        assert holder_locked.wait(10)
        results: list[object] = []
        appenders = [threading.Thread(target=lambda: results.append(log.append("s", b"waited", shard=0))),
                     threading.Thread(target=lambda: results.append(
                         log.append_batch("s", [b"w1", b"w2"], shard=0)))]
        for t in appenders:
            t.start()
        ticks, until = 0, time.monotonic() + 0.3
        while time.monotonic() < until:  # runs only if the appenders let the GIL go
            ticks += 1
        assert not results, "an append went through while the lock was held"
        assert ticks > 1000
        release.set()
        holder.join()
        for t in appenders:
            t.join(10)
        assert len(results) == 2
        del lock
        mapped.close()
        assert sorted(p for _, _, p in read_all(log, "s", 0)) == [b"first", b"w1", b"w2", b"waited"]


def test_a_wrong_call_names_the_method_called(data_dir: Path) -> None:
    """A call the fast way cannot take goes to the general way; its TypeError still
    names Log.append / Log.append_batch, not the Python function behind them."""
    with Log(str(data_dir), CONFIG) as log:
        log.create_stream("s")
        with pytest.raises(TypeError, match=r"^Log\.append\(\) got an unexpected keyword argument 'bogus'"):
            log.append("s", b"x", bogus=1)  # type: ignore[call-arg]
        with pytest.raises(TypeError, match=r"^Log\.append\(\) missing 1 required positional"):
            log.append("s")  # type: ignore[call-arg]
        with pytest.raises(TypeError, match=r"^Log\.append_batch\(\) got an unexpected keyword"):
            log.append_batch("s", [b"x"], nope=2)  # type: ignore[call-arg]
        assert log.stats("s").entries == 0


def test_ingest_fast_and_general_ways_agree(data_dir: Path) -> None:
    """Log.ingest takes the C way for a known stream without key or durability and
    Log._ingest_general otherwise: the same events stored, the same BatchResult, and
    for a refused body the same error with the same fault (index, line, offset,
    reason), nothing stored."""
    from storage_c.errors import InvalidJSON, NoEvents

    bodies: list[tuple[object, str]] = [
        (b'{"a":1}', "json"), (bytearray(b"[1, 2 ,3]"), "json"), (memoryview(b'"s"\n\n4\n'), "ndjson"),
    ]
    with Log(str(data_dir), Config(shards=2, segment_bytes=1 << 20, max_entry_bytes=1000)) as log:
        log.create_stream("s")
        for body, fmt in bodies:
            fast = log.ingest("s", body, fmt, shard=0)  # type: ignore[arg-type]
            general = log._ingest_general("s", body, fmt, shard=1)  # type: ignore[arg-type]
            assert fast[0] == 0 and general[0] == 1 and fast[1:] == general[1:]
        stored = [[(e, p) for e, _, p in read_all(log, "s", shard)] for shard in (0, 1)]
        assert stored[0] == stored[1] == list(enumerate([b'{"a":1}', b"1", b"2", b"3", b'"s"', b"4"]))
        for bad, fmt, kind in [(b'[1,{"a" 2}]', "json", InvalidJSON), (b"1\n\n[2\n", "ndjson", InvalidJSON),
                               (b" \n\t\n", "ndjson", NoEvents)]:
            with pytest.raises(kind) as fast_error:
                log.ingest("s", bad, fmt, shard=0)
            with pytest.raises(kind) as general_error:
                log._ingest_general("s", bad, fmt, shard=0)
            assert fast_error.value.fault == general_error.value.fault
            assert str(fast_error.value) == str(general_error.value)
        with pytest.raises(EntryTooLarge) as too_large:
            log.ingest("s", b'["' + b"x" * 2000 + b'"]', shard=0)
        assert too_large.value.fault is not None and too_large.value.fault.index == 0
        assert log.ingest("s", b"[7]", key="k").count == 1  # a key: the general way
        with pytest.raises(ShardRangeError):
            log.ingest("s", b"[8]", shard=2)
        with pytest.raises(TypeError, match=r"^Log\.ingest\(\) got an unexpected keyword"):
            log.ingest("s", b"[9]", nope=1)  # type: ignore[call-arg]
        with pytest.raises(ValueError, match="'xml' is not one of json, ndjson, lines, raw"):
            log.ingest("s", b"[9]", "xml")
        assert log.stats("s").entries == 13


def test_wait_false_stores_only_what_needs_no_waiting(data_dir: Path) -> None:
    """wait=False, for a caller on an event loop: an append that would first wait (the
    shard to open in this process, the first segment to create, a rotation; durability
    "always") raises WouldBlock and stores nothing; the same call with wait=True then
    stores it.  Growing the segment by a chunk and zero-filling ahead it does itself.
    Every way - fast and general, each append method - and the entries come out exact."""
    cfg = Config(shards=1, segment_bytes=1 << 20, segment_chunk_bytes=256 << 10,
                 compression_threshold=4096)
    big = b"c" * 5000  # above the compression threshold: the general way
    event = b'{"n":"' + b"p" * 490 + b'"}'
    ways: dict[str, tuple[int, Callable[[Log, bool], object]]] = {  # entries per call, call
        "append": (1, lambda log, wait: log.append("s", b"x" * 1000, shard=0, wait=wait)),
        "append keyed": (1, lambda log, wait: log.append("s", b"k" * 1000, key="k", wait=wait)),
        "append_batch": (3, lambda log, wait: log.append_batch("s", [b"y" * 340] * 3, shard=0,
                                                               wait=wait)),
        "append_batch general": (2, lambda log, wait: log.append_batch(
            "s", [b"z" * 1000, big], shard=0, wait=wait)),
        "append_delimited": (2, lambda log, wait: log.append_delimited(
            "s", b"d" * 500 + b"\n" + b"e" * 500 + b"\n", shard=0, wait=wait)),
        "ingest": (2, lambda log, wait: log.ingest("s", event + b"\n" + event + b"\n", "ndjson",
                                                   shard=0, wait=wait)),
        "ingest keyed": (2, lambda log, wait: log.ingest("s", b"[" + event + b"," + event + b"]",
                                                         key="k", wait=wait)),
    }
    for name, (per_call, call) in ways.items():
        with Log(data_dir.parent / ("wait-" + name.replace(" ", "-")), cfg) as log:
            blocked = 0
            calls = 3000  # ~3 MB: the first segment, chunks, then rotations
            for _ in range(calls):
                before = log.stats("s").entries if "s" in log.streams() else 0
                try:
                    call(log, False)
                except WouldBlock:
                    blocked += 1
                    assert (log.stats("s").entries if "s" in log.streams() else 0) == before
                    call(log, True)
            stats = log.stats("s").shards[0]
            assert stats.rotations >= 2, name
            assert stats.rotations + 1 <= blocked < 50, name  # each of those waited, nothing else
            with pytest.raises(WouldBlock):
                log.append("s", b"always", shard=0, durability="always", wait=False)
            assert log.stats("s").entries == calls * per_call, name
            assert log.verify().ok


def test_a_refused_call_names_the_shard_it_chose(data_dir: Path) -> None:
    """Without shard= the shards take turns: WouldBlock says which shard the refused
    call had chosen, so that its retry goes there (not to the next in turn, which left
    a shard behind that never got ready)."""
    with Log(data_dir, Config(shards=2, segment_bytes=1 << 20)) as log:
        body = b'{"a":"' + b"x" * 190 + b'"}\n'
        refused: list[int | None] = []
        for _ in range(400):
            try:
                log.ingest("s", body * 20, "ndjson", wait=False)
            except WouldBlock as exc:
                refused.append(exc.shard)
                log.ingest("s", body * 20, "ndjson", shard=exc.shard)
        assert set(refused) == {0, 1} and len(refused) < 20
        assert [s.next_entry for s in log.stats("s").shards] == [4000, 4000]
