"""Disk in proportion to data: segments are allocated in chunks as they fill,
and a full filesystem fails an append with StorageFull at a chunk boundary,
never with SIGBUS, and appends work again when space returns."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from storage_c import Config, Log

from .support.processes import worker_argv
from .support.storage import read_all

MiB = 1 << 20


def disk_bytes(path: Path) -> int:
    """What du counts: allocated blocks of every file below path."""
    total = 0
    for root, dirs, files in os.walk(path):
        for name in files + dirs:
            total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total


def test_a_new_16_shard_stream_with_one_event_per_shard_is_small(data_dir: Path) -> None:
    with Log(data_dir, Config(shards=16)) as log:
        for shard in range(16):
            log.append("ev", b'{"a":1}', shard=shard)
    assert disk_bytes(data_dir) <= 16 * MiB
    three = data_dir.parent / "three"
    with Log(three, Config()) as log:  # three mistyped one-event streams
        for name in ("evnets", "evetns", "eevnts"):
            log.append(name, b"{}")
    assert disk_bytes(three) <= 3 * 16 * MiB // 4


def test_segments_grow_in_chunks_up_to_their_size(data_dir: Path) -> None:
    cfg = Config(shards=1, segment_bytes=8 * MiB, segment_chunk_bytes=1 * MiB)
    entry = b"x" * 1000
    with Log(data_dir, cfg) as log:
        sizes = []
        segment = data_dir / "g" / "shard-0000" / ("0" * 20 + ".log")
        for i in range(12_000):  # ~12 MB: one full segment and part of a second
            log.append("g", entry, shard=0)
            if i % 500 == 0:
                sizes.append(segment.stat().st_size)
        assert sizes[0] == 16 * 1024
        steps = {b - a for a, b in zip(sizes, sizes[1:]) if b != a}
        assert max(steps) <= 1 * MiB and segment.stat().st_size == 8 * MiB
        got = [p for _, _, p in read_all(log, "g", 0)]
        assert got == [entry] * 12_000
        assert log.verify().ok
        assert log.stats("g").shards[0].segments == 2


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 6 MiB tmpfs: a real filesystem that runs out of space."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / f"fs-{uuid.uuid4().hex[:8]}"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_full_filesystem_fails_appends_cleanly_and_recovers(small_fs: Path) -> None:
    data = small_fs / "data"
    ballast = small_fs / "ballast"
    ballast.write_bytes(b"\0" * (2 * MiB))
    proc = subprocess.Popen(worker_argv("fill_the_disk", data), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdin is not None
    line = proc.stdout.readline().split(maxsplit=2)
    assert line[0] == "full", f"writer died: {proc.wait()}"  # a SIGBUS would end it here
    appended = int(line[1])
    assert "preallocate" in line[2] or "space" in line[2].lower()
    ballast.unlink()  # space returns
    proc.stdin.write("go\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "after"
    assert proc.wait(timeout=30) == 0
    with Log(data, Config(shards=1, background_flush=False)) as log:
        got = [p for _, _, p in read_all(log, "full", 0)]
        assert got == [b"%08d" % i + b"y" * 992 for i in range(appended)] + [b"after"]
        assert log.verify().ok


def test_the_budget_frees_the_oldest_data_of_the_whole_directory(data_dir: Path) -> None:
    """A writer of stream b needs room: stream a's oldest segments go, though
    another process wrote them (and b's own shards have nothing to spare)."""
    def write(stream: str, count: int) -> None:
        out = subprocess.run(worker_argv("write_within_budget", data_dir, stream, count),
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr

    write("a", 2500)  # ~2.5 MB: most of the 3 MiB budget
    with Log(data_dir, Config(background_flush=False)) as log:
        a_first = [log.shard_stats("a", s).first_entry for s in (0, 1)]
    write("b", 2000)  # ~2 MB: fits only once a's oldest data is deleted
    with Log(data_dir, Config(background_flush=False)) as log:
        a_after = [log.shard_stats("a", s) for s in (0, 1)]
        b = [log.shard_stats("b", s) for s in (0, 1)]
        assert all(s.next_entry == 1000 and s.first_entry == 0 for s in b)  # b lost nothing
        assert [s.first_entry for s in a_after] > a_first  # a's oldest went
        assert sum(s.retention_deleted_segments for s in a_after) >= 4
        # what is left of a is its newest data, intact
        for s in (0, 1):
            got = [p for _, _, p in read_all(log, "a", s)]
            assert got and got[-1].startswith(b"a-%08d" % (2498 + s))
        assert log.verify().ok
    used = sum(os.stat(os.path.join(r, f)).st_size for r, _, fs in os.walk(data_dir)
               for f in fs if f.endswith((".log", ".idx")))
    assert used <= 3 << 20


SPARE = "spare.log.free"  # a deleted segment's file kept for reuse (storage_c/FORMAT.md)


def data_files_bytes(path: Path) -> int:
    """Bytes of segment, index and spare files below path: what the budget counts."""
    return sum(os.stat(os.path.join(r, f)).st_size for r, _, fs in os.walk(path)
               for f in fs if f.endswith((".log", ".idx", ".free")))


def test_a_budget_of_two_segments_holds_one_shard_writing_on_forever(data_dir: Path) -> None:
    """Growing the active segment under a tight budget must get its room by
    deleting the oldest segment outright: kept as a spare, the file would
    hold the room the growth needs, and appends failed with StorageFull at
    ~75 % of the budget while nothing but the spare could go."""
    budget = 2 * MiB
    cfg = Config(shards=1, segment_bytes=1 * MiB, segment_chunk_bytes=256 << 10,
                 retention_max_total_bytes=budget, retention_interval_ms=0)
    count = 16_000  # ~16 MB through a 2 MiB budget
    with Log(data_dir, cfg) as log:
        for i in range(count):
            log.append("s", b"%08d" % i + b"q" * 992, shard=0)
            if i % 1000 == 999:
                assert data_files_bytes(data_dir) <= budget
        stats = log.shard_stats("s", 0)
        assert stats.next_entry == count and stats.retention_deleted_segments >= 10
        got = [p for _, _, p in read_all(log, "s", 0)]
        assert got == [b"%08d" % i + b"q" * 992 for i in range(stats.first_entry, count)]
        assert len(got) >= 500  # what is left is the newest data
        assert log.verify().ok


def small_segments(shard_limit: int = 0, budget: int = 0) -> Config:
    """1 MiB segments, no background retention pass; the limits given."""
    return Config(shards=1, segment_bytes=1 * MiB, segment_chunk_bytes=256 << 10,
                  retention_interval_ms=0, retention_max_shard_bytes=shard_limit,
                  retention_max_total_bytes=budget)


def stream_with_a_spare(data_dir: Path) -> tuple[Path, tuple[int, int]]:
    """Stream a, written past a 2 MiB shard limit and trimmed by a retention
    pass, which keeps one deleted file as a's spare: the spare's path and a's
    (first, next) entry."""
    with Log(data_dir, small_segments()) as log:
        for i in range(3_500):  # ~3.5 MB: four segments
            log.append("a", b"%08d" % i + b"a" * 992, shard=0)
    with Log(data_dir, small_segments(shard_limit=2 * MiB)) as log:
        log.run_retention()
        a = log.shard_stats("a", 0)
    spare = data_dir / "a" / "shard-0000" / SPARE
    assert spare.exists() and a.first_entry > 0
    return spare, (a.first_entry, a.next_entry)


def a_entries(log: Log) -> tuple[int, int]:
    a = log.shard_stats("a", 0)
    return a.first_entry, a.next_entry


def test_spares_go_before_any_data_when_the_budget_is_short(data_dir: Path) -> None:
    """A spare holds no data: when another stream needs room, the spare of
    stream a is unlinked and a keeps every entry it had."""
    spare, a_before = stream_with_a_spare(data_dir)
    budget = data_files_bytes(data_dir) + 1 * MiB  # room for b's first chunks, not its second segment
    with Log(data_dir, small_segments(budget=budget)) as log:
        for i in range(1_500):  # ~1.5 MB for b: needs the spare's room
            log.append("b", b"%08d" % i + b"b" * 992, shard=0)
        assert not spare.exists() and a_entries(log) == a_before
        assert [p for _, _, p in read_all(log, "b", 0)] == [
            b"%08d" % i + b"b" * 992 for i in range(1_500)]
        assert log.verify().ok
    assert data_files_bytes(data_dir) <= budget


def test_a_retention_pass_over_the_budget_unlinks_spares_before_data(data_dir: Path) -> None:
    spare, a_before = stream_with_a_spare(data_dir)
    budget = data_files_bytes(data_dir) - 512 * 1024  # over by less than the spare
    with Log(data_dir, small_segments(budget=budget)) as log:
        report = log.run_retention()
        assert not spare.exists() and a_entries(log) == a_before
        assert report.deleted_segments == 0
    assert data_files_bytes(data_dir) <= budget
