"""Retention (SPEC 3.6): whole segments, oldest first, by age, shard size and
total size; unconsumed data protected until force_delete_after; a budget
that makes appends fail cleanly when nothing may go."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from storage_c import Config, Log, StorageFull
from storage_c.testing import clock_shifted

from .support.processes import worker
from .support.storage import fill, read_all

SEG = 64 << 10


def cfg(**kw: Any) -> Config:
    base: dict[str, Any] = dict(shards=1, segment_bytes=SEG, background_flush=False, retention_interval_ms=0,
                retention_protect_unconsumed=False)
    base.update(kw)
    return Config(**base)


def numbered(n: int) -> list[bytes]:
    """Payloads 0..n-1 of 208 bytes, each starting with its number."""
    return [b"%08d" % e + b"." * 200 for e in range(n)]


def entries(log: Log, stream: str = "r") -> list[int]:
    return [e for e, _, _ in read_all(log, stream, 0)]


def test_by_age_keeps_the_active_segment_and_the_numbers(data_dir: Path) -> None:
    with Log(data_dir, cfg(retention_max_age_ms=300)) as log:
        fill(log, "r", numbered(3000), batch=100)
        segments = log.shard_stats("r", 0).segments
        assert segments > 5
        assert log.run_retention().deleted_segments == 0  # nothing old enough yet
        with clock_shifted(0.4):
            log.append("r", b"%08d" % 3000 + b"." * 200, shard=0)
            report = log.run_retention()
        stats = log.shard_stats("r", 0)
        assert report.deleted_segments == segments - 1 and stats.segments == 1  # only the active
        assert stats.first_entry > 0 and stats.next_entry == 3001
        assert entries(log) == list(range(stats.first_entry, 3001))  # numbers survive
        assert log.append("r", b"next", shard=0) == (0, 3001)
        batch = log.read("r", 0, 0, 10)
        assert batch.entries[0] == stats.first_entry and batch.skipped == stats.first_entry


def test_by_shard_size_and_min_segments(data_dir: Path) -> None:
    with Log(data_dir, cfg(retention_max_shard_bytes=4 * SEG, retention_min_segments=1)) as log:
        fill(log, "r", numbered(3000), batch=100)
        log.run_retention()
        stats = log.shard_stats("r", 0)
        assert stats.disk_bytes <= 5 * SEG and stats.segments <= 4
        assert entries(log)[-1] == 2999
    with Log(data_dir, cfg(retention_max_shard_bytes=1, retention_min_segments=3)) as log:
        log.run_retention()
        assert log.shard_stats("r", 0).segments == 3  # never below min_segments


def test_by_total_size_across_streams(data_dir: Path) -> None:
    with Log(data_dir, cfg(retention_max_total_bytes=10 * SEG)) as log:
        fill(log, "a", numbered(3000), batch=100)
        fill(log, "b", numbered(3000), batch=100)
        log.run_retention()
        used = sum(log.shard_stats(s, 0).disk_bytes for s in ("a", "b"))
        assert used <= 11 * SEG
        assert entries(log, "a")[-1] == 2999 and entries(log, "b")[-1] == 2999


def test_unconsumed_data_is_protected_until_forced(data_dir: Path) -> None:
    config = cfg(retention_max_age_ms=100, retention_protect_unconsumed=True,
                 retention_force_delete_after_ms=1500)
    with Log(data_dir, config) as log:
        fill(log, "r", numbered(3000), batch=100)
        slow = log.group("r", 0, "slow")
        fast = log.group("r", 0, "fast")
        fast.ack(2999)
        slow.ack(99)
        with clock_shifted(0.2):
            log.append("r", b"x", shard=0)
            report = log.run_retention()
            assert report.deleted_segments == 0 and report.protected_segments == 1
            assert entries(log)[0] == 0
            slow.ack(1499)  # the slow group catches up part of the way
            report = log.run_retention()
        stats = log.shard_stats("r", 0)
        assert report.deleted_segments > 0 and report.lost_entries == 0
        assert stats.first_entry <= 1500  # nothing it has not consumed
        with clock_shifted(1.8):  # past force_delete_after
            report = log.run_retention()
        stats = log.shard_stats("r", 0)
        assert report.deleted_segments > 0 and report.lost_entries > 0
        assert stats.retention_lost_entries == report.lost_entries
        assert stats.first_entry > 1500
        assert slow.lag == stats.next_entry - 1500


def test_storage_full_with_protected_data(data_dir: Path) -> None:
    config = cfg(retention_max_total_bytes=8 * SEG, retention_protect_unconsumed=True)
    with Log(data_dir, config) as log:
        log.create_stream("r", 1)
        group = log.group("r", 0, "reader")
        appended = 0
        with pytest.raises(StorageFull, match="budget .retention_max_total_bytes.*registered groups"):
            while True:
                log.append("r", b"%08d" % appended + b"." * 3000, shard=0)
                appended += 1
        assert appended > 50
        assert [e for e in entries(log)] == list(range(appended))  # nothing harmed
        with pytest.raises(StorageFull):
            log.append("r", b"%08d" % appended + b"." * 3000, shard=0)
        group.ack(appended - 1)  # consumed: retention may now delete
        assert log.append("r", b"room again", shard=0) == (0, appended)
        assert log.shard_stats("r", 0).storage_full_errors >= 2


def test_reader_in_another_process_is_unharmed(data_dir: Path, tmp_path: Path) -> None:
    with Log(data_dir, cfg()) as log:
        fill(log, "r", numbered(4000), batch=100)
    with Log(data_dir, cfg(retention_max_shard_bytes=3 * SEG)) as log:
        ready = tmp_path / "ready"
        reader = worker("read_through_deletion", data_dir, "r", 4000, ready, stdout=subprocess.PIPE)
        while not ready.exists():
            assert reader.poll() is None
            time.sleep(0.01)
        report = log.run_retention()  # deletes segments the reader is using or about to
        assert report.deleted_segments > 5
        out, _ = reader.communicate(timeout=120)
        assert reader.returncode == 0
        returned, skipped = map(int, out.split())
        assert returned + skipped == 4000 and skipped > 0


def test_background_retention_runs_by_itself(data_dir: Path) -> None:
    config = cfg(retention_max_age_ms=200, retention_interval_ms=100, background_flush=True,
                 fsync_interval_ms=50)
    with Log(data_dir, config) as log:
        fill(log, "r", numbered(3000), batch=100)
        with clock_shifted(0.3):
            log.append("r", b"fresh", shard=0)  # the newest segment holds a fresh entry
            deadline = time.monotonic() + 10
            while log.shard_stats("r", 0).retention_deleted_segments == 0:
                assert time.monotonic() < deadline, "the background pass never deleted anything"
                time.sleep(0.05)
        assert log.shard_stats("r", 0).first_entry > 0
    with Log(data_dir, cfg(retention_max_age_ms=1, retention_interval_ms=0,
                          background_flush=True, fsync_interval_ms=20)) as log:
        before = log.shard_stats("r", 0).segments
        time.sleep(0.3)  # interval 0: no background pass, whatever the age
        assert log.shard_stats("r", 0).segments == before
