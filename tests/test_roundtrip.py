"""Round trips: what goes in comes out byte for byte, with its id and time."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
import zstandard

from storage_c import Config, Log

from .support.storage import read_all

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def payloads(n: int, seed: int) -> list[bytes]:
    """Random sizes 0-64 KiB; some incompressible, some compressible, some
    starting with the zstd magic number (raw bytes that must stay raw)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        size = rng.randrange(0, 64 * 1024 + 1)
        kind = i % 4
        if kind == 0:
            body = rng.randbytes(size)
        elif kind == 1:
            body = (b"compressible %d " % i * (size // 14 + 1))[:size]
        elif kind == 2:
            body = (ZSTD_MAGIC + rng.randbytes(size))[:size]
        else:
            body = zstandard.ZstdCompressor().compress(rng.randbytes(size // 2))  # a real frame, stored raw
        out.append(body)
    return out


@pytest.mark.parametrize("count", [1, 10, 10_000])
def test_round_trip_random_sizes(data_dir: Path, count: int) -> None:
    items = payloads(count, seed=count)
    cfg = Config(shards=2, segment_bytes=32 << 20)
    before = time.time_ns()
    ids = []
    with Log(data_dir, cfg) as log:
        for i, p in enumerate(items):
            if i % 3 == 0:
                ids.append(log.append("rt", p, shard=1))
            else:
                res = log.append_batch("rt", [p], shard=1)
                ids.append((res.shard, res.first))
        after = time.time_ns()
        assert [e for _, e in ids] == list(range(count))
        stats = log.shard_stats("rt", 1)
        assert stats.next_entry == count
        if count > 100:
            assert stats.compressed_entries > 0  # the compressible ones were compressed
    with Log(data_dir, cfg) as log:  # and after a reopen
        got = read_all(log, "rt", 1)
    assert [e for e, _, _ in got] == list(range(count))
    assert [p for _, _, p in got] == items
    stamps = [t for _, t, _ in got]
    assert stamps == sorted(stamps)
    assert before <= stamps[0] and stamps[-1] <= after


def test_batches_are_contiguous_and_in_order(log: Log) -> None:
    first = log.append_batch("b", [b"a", b"", b"ccc"], shard=0)
    second = log.append_delimited("b", b"x\ny\n\nz", shard=0)
    third = log.append_batch("b", (bytes([i]) * i for i in range(50)), shard=0)
    assert (first.first, first.count) == (0, 3)
    assert (second.first, second.count, second.last) == (3, 3, 5)
    assert (third.first, third.count) == (6, 50)
    got = [p for _, _, p in read_all(log, "b", 0)]
    assert got == [b"a", b"", b"ccc", b"x", b"y", b"z"] + [bytes([i]) * i for i in range(50)]


def test_large_entries_in_batches_and_lines_are_compressed(log: Log) -> None:
    big = b"line %d of a repetitive log " * 1000
    res = log.append_batch("c", [b"small", big, b"tiny"], shard=0)
    lines = b"short\n" + big.replace(b"\n", b" ") + b"\nend\n"
    res2 = log.append_delimited("c", lines, shard=0)
    assert (res.count, res2.first, res2.count) == (3, 3, 3)
    got = [p for _, _, p in read_all(log, "c", 0)]
    assert got == [b"small", big, b"tiny", b"short", big.replace(b"\n", b" "), b"end"]
    stats = log.shard_stats("c", 0)
    assert stats.compressed_entries == 2
    assert stats.appended_raw_bytes > stats.appended_stored_bytes


def test_reopen_continues_numbering_and_rotation_keeps_order(data_dir: Path) -> None:
    cfg = Config(shards=1, segment_bytes=64 << 10, index_interval_bytes=512)
    rng = random.Random(7)
    items = [rng.randbytes(rng.randrange(0, 3000)) for _ in range(3000)]
    with Log(data_dir, cfg) as log:
        for p in items[:1500]:
            log.append("rot", p, shard=0)
    with Log(data_dir, cfg) as log:
        assert log.append("rot", items[1500], shard=0) == (0, 1500)
        res = log.append_batch("rot", items[1501:], shard=0)
        assert res.first == 1501
        stats = log.shard_stats("rot", 0)
        assert stats.segments > 20 and stats.rotations >= 1
        assert [p for _, _, p in read_all(log, "rot", 0)] == items
        # random access lands on the right entry in any segment
        for e in rng.sample(range(3000), 200):
            batch = log.read("rot", 0, e, max_entries=1)
            assert batch.entries[0] == e and batch.payloads[0] == items[e]


def test_read_bounds(log: Log) -> None:
    log.append_batch("r", [b"%d" % i * 100 for i in range(100)], shard=2)
    b = log.read("r", 2, 10, max_entries=5)
    assert list(b.entries) == [10, 11, 12, 13, 14] and b.next_entry == 15
    small = log.read("r", 2, 0, max_entries=100, max_bytes=1000)
    assert 0 < len(small) < 100 and sum(map(len, small.payloads)) <= 1000
    one = log.read("r", 2, 99, max_entries=10, max_bytes=1)  # at least one entry
    assert len(one) == 1
    assert len(log.read("r", 2, 100)) == 0 and log.read("r", 2, 100).next_entry == 100
    assert len(log.read("r", 1, 0)) == 0  # an empty shard
    entries = list(log.read("r", 2, 98))
    assert [e.id for e in entries] == ["2-98", "2-99"]


def test_find_time(log: Log) -> None:
    log.append("t", b"a", shard=0)
    mid = time.time_ns()
    time.sleep(0.002)
    log.append_batch("t", [b"b", b"c"], shard=0)
    assert log.find_time("t", 0, 0) == 0
    assert log.find_time("t", 0, mid) == 1
    assert log.find_time("t", 0, time.time_ns()) == 3


def test_unkeyed_and_keyed_routing(log: Log) -> None:
    shards = {log.append("k", b"x")[0] for _ in range(8)}
    assert shards == {0, 1, 2, 3}  # round robin over this process's shards
    keyed = {log.append("k", b"y", key="customer-42")[0] for _ in range(5)}
    assert len(keyed) == 1
    assert keyed == {log.shard_for_key("k", b"customer-42")}


def test_reads_do_not_take_the_append_lock(log: Log) -> None:
    """A reader sees committed entries while another thread keeps appending."""
    import threading

    stop = threading.Event()

    def appender() -> None:
        while not stop.is_set():
            log.append_batch("lf", [b"p"] * 50, shard=0)

    log.create_stream("lf")  # before the reader's first read, whichever thread runs first
    t = threading.Thread(target=appender)
    t.start()
    try:
        seen = 0
        deadline = time.time() + 1.0
        while time.time() < deadline:
            batch = log.read("lf", 0, seen, max_entries=1000)
            assert all(p == b"p" for p in batch.payloads)
            assert batch.next_entry % 50 == 0
            seen = batch.next_entry
        assert seen > 0
    finally:
        stop.set()
        t.join()
    assert seen % 50 == 0  # a batch becomes visible whole, never in part


def test_read_into_a_callers_buffer(log: Log) -> None:
    payloads = [bytes([i % 251]) * (i * 37 % 3000) for i in range(200)]
    log.append_batch("ev", payloads, shard=0)
    copied = log.read("ev", 0, 0, 200, 1 << 20)
    into = bytearray(1 << 20)
    viewed = log.read("ev", 0, 0, 200, 1 << 20, into=into)
    assert isinstance(viewed.data, memoryview) and viewed.data.obj is into  # no copy
    assert viewed.payloads == copied.payloads == payloads
    assert list(viewed.entries) == list(copied.entries)
    lines = log.read_ndjson("ev", 0, 0, 200, 1 << 20, into=bytearray(1 << 20))
    assert bytes(lines.data) == b"".join(p + b"\n" for p in payloads)
    # A buffer too small for even the first entry: the read still succeeds, copied.
    small = log.read("ev", 0, 1, 5, 1 << 20, into=bytearray(10))
    assert small.payloads == payloads[1:6] and isinstance(small.data, bytes)
    with pytest.raises(TypeError):
        log.read("ev", 0, 0, 5, into=b"read-only")
