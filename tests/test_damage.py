"""Damage on disk: torn tails are cut exactly, damage in the middle is
skipped and reported, lost index and state files are rebuilt (SPEC 3.7)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from storage_c import Config, Log

from .support.storage import ENTRY_HEADER, fill, flip, offset_of, read_all

CFG = Config(shards=1, segment_bytes=1 << 20, background_flush=False)


def write_items(data_dir: Path, n: int = 100) -> list[bytes]:
    """``n`` entries of varied size in shard 0 of stream "d", an append each; their payloads."""
    items = [b"entry %03d " % i + bytes([i % 251]) * (i % 37) for i in range(n)]
    with Log(data_dir, CFG) as log:
        fill(log, "d", items, shard=0, batch=1)
    return items


def shard_dir(data_dir: Path) -> Path:
    return data_dir / "d" / "shard-0000"


def segment(data_dir: Path) -> Path:
    return shard_dir(data_dir) / f"{0:020d}.log"


def reopen(data_dir: Path) -> Log:
    """The directory opened again and shard 0 with it (its tail checked):
    statistics alone read a closed shard's state as its last holder left it."""
    log = Log(data_dir, CFG)
    log.read("d", 0, 0, 1)
    return log


def test_truncated_last_entry_is_cut_exactly(data_dir: Path) -> None:
    items = write_items(data_dir)
    end_of_99 = offset_of(items, 99) + ENTRY_HEADER + len(items[99])
    os.truncate(segment(data_dir), end_of_99 - 3)  # the file lost the last entry's tail
    with reopen(data_dir) as log:
        stats = log.shard_stats("d", 0)
        assert stats.next_entry == 99
        assert stats.truncated_entries == 1
        assert [p for _, _, p in read_all(log, "d", 0)] == items[:99]
        assert log.append("d", b"new", shard=0) == (0, 99)  # the file got its size back
        assert log.verify().ok


def test_garbage_after_the_last_entry_is_cut(data_dir: Path) -> None:
    items = write_items(data_dir)
    end = offset_of(items, 100)
    with open(segment(data_dir), "r+b") as f:
        f.seek(end)
        f.write(os.urandom(777))
    with reopen(data_dir) as log:
        stats = log.shard_stats("d", 0)
        assert stats.next_entry == 100
        assert stats.truncated_bytes >= 777
        assert [p for _, _, p in read_all(log, "d", 0)] == items
        assert log.append("d", b"next", shard=0) == (0, 100)
    with open(segment(data_dir), "rb") as f:  # and the garbage is gone from the file
        f.seek(offset_of(items, 100) + ENTRY_HEADER + 4)
        assert f.read(777) == bytes(777)


def test_flipped_byte_in_the_last_entry_cuts_there(data_dir: Path) -> None:
    items = write_items(data_dir)
    flip(segment(data_dir), offset_of(items, 99) + ENTRY_HEADER + 2)
    with reopen(data_dir) as log:
        stats = log.shard_stats("d", 0)
        assert stats.next_entry == 99 and stats.truncated_entries == 1
        assert [p for _, _, p in read_all(log, "d", 0)] == items[:99]


@pytest.mark.parametrize("where", ["payload", "length"])
def test_flipped_byte_in_the_middle_is_skipped_and_reported(data_dir: Path, where: str) -> None:
    items = write_items(data_dir)
    at = offset_of(items, 50) + (ENTRY_HEADER + 3 if where == "payload" else 5)
    flip(segment(data_dir), at)
    with reopen(data_dir) as log:
        assert log.shard_stats("d", 0).next_entry == 100  # nothing cut
        report = log.verify()
        assert not report.ok and report.bad_entries == 1
        assert [(p.shard, p.entry) for p in report.problems] == [(0, 50)]
        batch = log.read("d", 0, 0, max_entries=1000)
        assert batch.skipped == 1
        assert list(batch.entries) == [e for e in range(100) if e != 50]
        assert batch.payloads == items[:50] + items[51:]
        stats = log.shard_stats("d", 0)
        assert stats.crc_failures >= 1 and stats.skipped_entries >= 1
        assert log.append("d", b"more", shard=0) == (0, 100)


def test_damage_spanning_several_entries_resyncs_on_the_index(data_dir: Path) -> None:
    cfg = Config(shards=1, segment_bytes=1 << 20, index_interval_bytes=256, background_flush=False)
    items = [b"%04d" % i + b"." * 60 for i in range(400)]
    with Log(data_dir, cfg) as log:
        log.append_batch("d", items, shard=0)
    start = offset_of(items, 100)
    with open(segment(data_dir), "r+b") as f:
        f.seek(start)
        f.write(os.urandom(offset_of(items, 110) - start))  # ten entries destroyed
    with Log(data_dir, cfg) as log:
        got = read_all(log, "d", 0)
        entries = [e for e, _, _ in got]
        assert entries[:100] == list(range(100)) and entries[-1] == 399
        lost = set(range(400)) - set(entries)
        assert lost >= set(range(100, 110)) and len(lost) < 20
        assert all(items[e] == p for e, _, p in got)
        report = log.verify()
        assert report.bad_entries == len(lost)


@pytest.mark.parametrize("damage", ["missing", "garbage"])
def test_state_file_is_rebuilt(data_dir: Path, damage: str) -> None:
    items = write_items(data_dir)
    state = shard_dir(data_dir) / "state"
    if damage == "missing":
        state.unlink()
    else:
        state.write_bytes(os.urandom(4096))
    with reopen(data_dir) as log:
        stats = log.shard_stats("d", 0)
        assert stats.next_entry == 100 and stats.state_rebuilds == 1
        assert [p for _, _, p in read_all(log, "d", 0)] == items
        assert log.append("d", b"go on", shard=0) == (0, 100)


@pytest.mark.parametrize("damage", ["missing", "garbage", "wrong-records"])
def test_index_files_are_rebuilt(data_dir: Path, damage: str) -> None:
    cfg = Config(shards=1, segment_bytes=64 << 10, index_interval_bytes=256, background_flush=False)
    items = [b"%05d" % i + b"-" * (i % 200) for i in range(3000)]
    with Log(data_dir, cfg) as log:
        for p in items:
            log.append("d", p, shard=0)
    indexes = sorted(shard_dir(data_dir).glob("*.idx"))
    assert len(indexes) > 5
    for idx in indexes:
        if damage == "missing":
            idx.unlink()
        elif damage == "garbage":
            idx.write_bytes(os.urandom(idx.stat().st_size))
        else:  # a valid header, records pointing at the wrong places
            raw = bytearray(idx.read_bytes())
            raw[64:68] = (3).to_bytes(4, "little")
            for r in range(3):
                at = 128 + 16 * r
                raw[at: at + 8] = (r + 1).to_bytes(4, "little") + (9999 + r).to_bytes(4, "little")
            idx.write_bytes(bytes(raw))
    with Log(data_dir, cfg) as log:
        for e in (0, 1, 1234, 2999, 1500, 17):
            batch = log.read("d", 0, e, max_entries=1)
            assert (batch.entries[0], batch.payloads[0]) == (e, items[e])
        assert [p for _, _, p in read_all(log, "d", 0)] == items
        first = log.verify()  # repairs what reads did not touch
        assert first.ok and first.entries == 3000
        again = log.verify()
        assert again.ok and again.index_problems == 0
        stats = log.shard_stats("d", 0)
        assert stats.index_rebuilds >= 1
    assert all(idx.exists() for idx in indexes)


def test_unreadable_segment_header_in_the_middle(data_dir: Path) -> None:
    cfg = Config(shards=1, segment_bytes=64 << 10, background_flush=False)
    items = [b"%05d" % i + b"~" * 300 for i in range(1000)]
    with Log(data_dir, cfg) as log:
        for p in items:
            log.append("d", p, shard=0)
    segments = sorted(shard_dir(data_dir).glob("*.log"))
    victim = segments[1]
    with open(victim, "r+b") as f:
        f.write(b"\0" * 64)  # its header is gone
    first_lost, next_base = int(victim.stem), int(segments[2].stem)
    with Log(data_dir, cfg) as log:
        got = read_all(log, "d", 0)
        entries = [e for e, _, _ in got]
        assert entries == [e for e in range(1000) if not first_lost <= e < next_base]
        batch = log.read("d", 0, first_lost, max_entries=5)
        assert batch.entries[0] == next_base and batch.skipped == next_base - first_lost
        assert not log.verify().ok
        assert log.append("d", b"tail", shard=0) == (0, 1000)
