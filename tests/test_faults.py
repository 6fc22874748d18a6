"""Injected system-call failures seen from Python (storage_c.testing): each
gives a clear error, nothing stored is lost or changed, and the log works
again once the fault is gone.  The exhaustive sweep over every failure point
is the C test storage_c/tests/test_faults.c."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from storage_c import Config, Log, StorageFull, StorageIOError
from storage_c.testing import MAP, NAME, OPEN, SIZE, SYNC, faults

from .support.storage import fill

SEG = 64 << 10


def cfg() -> Config:
    return Config(shards=1, segment_bytes=SEG, background_flush=False, retention_interval_ms=0)


def payload(e: int) -> bytes:
    return b"%08d" % e + b"." * 300


def all_entries(log: Log) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    for batch in log.iter_entries("s", 0):
        assert batch.skipped == 0
        out.extend(zip(batch.entries, batch.payloads))
    return out


def test_a_failing_fdatasync_is_an_io_error_and_the_data_stays(data_dir: Path) -> None:
    with Log(data_dir, cfg()) as log:
        fill(log, "s", map(payload, range(50)), batch=1)
        with faults(SYNC, persist=True) as plan:
            with pytest.raises(StorageIOError, match="Input/output error"):
                log.sync("s")
        assert plan.fired >= 1
        log.sync("s")
        assert all_entries(log) == [(e, payload(e)) for e in range(50)]


@pytest.mark.parametrize("kind,err,error", [(OPEN, errno.EMFILE, StorageIOError),
                                            (NAME, errno.EIO, StorageIOError),
                                            (SIZE, errno.ENOSPC, StorageFull)])
def test_a_rotation_that_cannot_create_its_segment_fails_cleanly(
        data_dir: Path, kind: int, err: int, error: type[Exception]) -> None:
    with Log(data_dir, cfg()) as log:
        fill(log, "s", map(payload, range(150)), batch=1)  # about 47 KiB: the next 200 entries need a new segment
        stored = 150
        with faults(kind, err=err, persist=True):
            with pytest.raises(error):
                for e in range(150, 350):
                    log.append("s", payload(e), shard=0)
                    stored += 1
        assert stored < 350
        for e in range(stored, 350):  # the fault is gone: the log goes on where it stopped
            assert log.append("s", payload(e), shard=0) == (0, e)
        assert all_entries(log) == [(e, payload(e)) for e in range(350)]
    with Log(data_dir, cfg()) as log:  # and reopens to the same
        assert all_entries(log) == [(e, payload(e)) for e in range(350)]


def test_a_segment_that_cannot_be_mapped_is_an_error_not_a_skip(data_dir: Path) -> None:
    with Log(data_dir, cfg()) as log:
        fill(log, "s", map(payload, range(600)), batch=1)  # several segments
        assert log.shard_stats("s", 0).segments > 2
    with Log(data_dir, cfg()) as log:
        log.open_stream("s")
        # Too many open files: before, the reader took the segments it could
        # not open for deleted ones and skipped their entries (a consumer
        # would have acknowledged past them).
        with faults(MAP | OPEN, err=errno.EMFILE, persist=True):
            with pytest.raises(StorageIOError, match="Too many open files"):
                log.read("s", 0, 0, 1000)
        assert all_entries(log) == [(e, payload(e)) for e in range(600)]
        assert log.shard_stats("s", 0).skipped_entries == 0


def test_the_fast_appends_reach_the_one_core(data_dir: Path) -> None:
    """Log.append and Log.append_batch are C methods compiled into the cffi module with
    the core: a fault armed through storage_c.testing (a cffi call) fails them too, so
    the process holds one copy of the core's fault table.  Nothing is stored meanwhile,
    and the same calls go through once the fault is gone."""
    with Log(data_dir, cfg()) as log:
        log.create_stream("s", 1)
        with faults(OPEN, err=errno.EMFILE, persist=True) as plan:
            with pytest.raises(StorageIOError, match="Too many open files"):
                log.append("s", payload(0), shard=0)
            with pytest.raises(StorageIOError, match="Too many open files"):
                log.append_batch("s", [payload(0)], shard=0)
        assert plan.fired >= 2
        assert log.append("s", payload(0), shard=0) == (0, 0)
        assert log.append_batch("s", [payload(1)], shard=0).first == 1
        assert all_entries(log) == [(0, payload(0)), (1, payload(1))]


@pytest.mark.parametrize("durability", ["interval", "always"])
def test_a_failed_directory_sync_fails_the_rotation_that_needed_it(
        data_dir: Path, durability: str) -> None:
    """Each sync of a rotation failing once in turn (the new segment's file,
    its name in the directory, the old segment...): the append that needed
    it fails with the cause, the same append then goes through, and nothing
    is lost or doubled.  A directory sync that fails is an error, not
    ignored: a segment whose name may not survive a power cut holds nothing
    acknowledged."""
    config = Config(shards=1, segment_bytes=SEG, background_flush=False, retention_interval_ms=0,
                    durability=durability)
    causes = []
    for nth in range(1, 7):
        where = data_dir / f"n{nth}"
        where.mkdir(parents=True)
        with Log(where, config) as log:
            fill(log, "s", map(payload, range(150)), batch=1)
            failed = None
            with faults(SYNC, nth=nth):
                for e in range(150, 350):
                    try:
                        assert log.append("s", payload(e), shard=0) == (0, e)
                    except StorageIOError as exc:
                        failed, causes = e, causes + [str(exc)]
                        break
            for e in range(350 if failed is None else failed, 350):  # the same appends again
                assert log.append("s", payload(e), shard=0) == (0, e)
            assert all_entries(log) == [(e, payload(e)) for e in range(350)]
        with Log(where, config) as log:
            assert all_entries(log) == [(e, payload(e)) for e in range(350)]
    assert any("cannot sync directory" in cause for cause in causes), causes
