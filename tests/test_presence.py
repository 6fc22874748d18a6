"""The core's own look at an open shard's files (storage_c/src/log/presence.c), in one
process: what was taken away is named (StorageGone, ReadOnlyStorage), the shard then
refuses every append until it is reopened, and the answers come at a sync, a rotation or
a failed append step, never a success after the fault was seen.  EROFS and EIO come from
the core's fault injection (storage_c.testing).  The same faults against a running
gateway: tests/test_storage_gone.py and tests/test_storage_read_only.py."""

from __future__ import annotations

import errno
import os
import shutil
import time
from pathlib import Path
from typing import Callable

import pytest

from storage_c import (Config, Durability, Log, ReadOnlyStorage, StorageFull, StorageGone,
                       StorageIOError, StreamNotFound)
from storage_c.testing import MAP, NAME, OPEN, SIZE, STAT, SYNC, faults

SEG = 64 << 10


def cfg(durability: Durability = "always", flusher: bool = False) -> Config:
    return Config(shards=2, segment_bytes=SEG, segment_chunk_bytes=SEG, durability=durability,
                  background_flush=flusher, retention_interval_ms=0)


def payload(i: int) -> bytes:
    return b"%08d" % i + b"." * 200


def shard_dir(data_dir: Path, shard: int = 0) -> Path:
    return data_dir / "s" / f"shard-{shard:04d}"


def fill(log: Log, n: int, shard: int = 0, start: int = 0) -> list[int]:
    return [log.append("s", payload(start + i), shard=shard)[1] for i in range(n)]


def entries(data_dir: Path, shard: int = 0) -> list[bytes]:
    with Log(data_dir, Config(create=False, background_flush=False)) as log:
        return [p for b in log.iter_entries("s", shard) for p in b.payloads]


def rm_data(d: Path) -> str:
    shutil.rmtree(d)
    return f"the data directory {d} was removed"


def rm_shard(d: Path) -> str:
    shutil.rmtree(shard_dir(d))
    return f"the shard directory {shard_dir(d)} was removed"


def replace_shard(d: Path) -> str:
    shutil.rmtree(shard_dir(d))
    shard_dir(d).mkdir()
    return f"the shard directory {shard_dir(d)} was replaced by another directory"


def unlink_segment(d: Path) -> str:
    segment = max(shard_dir(d).glob("*.log"))
    segment.unlink()
    return f"the active segment {segment} of shard 0 of stream 's' was unlinked"


def unlink_state(d: Path) -> str:
    (shard_dir(d) / "state").unlink()
    return f"the state file {shard_dir(d) / 'state'} of shard 0"


FAULTS: dict[str, Callable[[Path], str]] = {
    "data directory removed": rm_data, "shard directory removed": rm_shard,
    "shard directory replaced": replace_shard, "active segment unlinked": unlink_segment,
    "state file unlinked": unlink_state}


@pytest.mark.parametrize("fault", FAULTS)
def test_always_refuses_at_the_next_append(data_dir: Path, fault: str) -> None:
    """durability=always syncs every append: the check at that sync refuses the very
    next append, and every one after it, with the path named."""
    with Log(data_dir, cfg()) as log:
        fill(log, 10)
        fill(log, 3, shard=1)
        says = FAULTS[fault](data_dir)
        for _ in range(3):
            with pytest.raises(StorageGone, match=says):
                log.append("s", b"after", shard=0)
        if fault not in ("data directory removed",):
            fill(log, 1, shard=1)  # another shard's files are in place: it goes on


@pytest.mark.parametrize("fault", FAULTS)
def test_interval_refuses_at_the_next_sync_or_rotation(data_dir: Path, fault: str) -> None:
    """durability=interval acknowledges before the sync: appends go on until a sync or a
    rotation looks; from then on every append is refused."""
    with Log(data_dir, cfg("interval")) as log:
        fill(log, 10)
        says = FAULTS[fault](data_dir)
        done = 0
        with pytest.raises(StorageGone, match=says):
            while True:  # the segment fills, and the rotation looks
                fill(log, 1, start=10 + done)
                done += 1
                assert done < 2 * SEG // 200, "never refused"
        with pytest.raises(StorageGone, match=says):
            log.append("s", b"after", shard=0)


def test_the_flusher_finds_it_without_an_append(data_dir: Path) -> None:
    """The flusher's pass checks every open shard, idle ones too: the first append
    after the fault is refused once a pass ran."""
    with Log(data_dir, Config(shards=1, durability="interval", fsync_interval_ms=20,
                              retention_interval_ms=0)) as log:
        fill(log, 5)
        says = rm_shard(data_dir)
        deadline = time.monotonic() + 10
        while True:  # a pass comes within fsync_interval_ms; a few passes are allowed
            time.sleep(0.05)
            try:
                log.append("s", b"probe", shard=0)
            except StorageGone as exc:
                assert says in str(exc)
                break
            assert time.monotonic() < deadline, "the flusher never noticed"
            shutil.rmtree(shard_dir(data_dir), ignore_errors=True)  # the probe made nothing


def test_a_restart_after_an_unlinked_segment_keeps_the_sealed_ones(data_dir: Path) -> None:
    """Reopening recovers from what is left: the sealed segments' entries are all there;
    the unlinked segment's are gone, and numbering goes on after the last survivor."""
    with Log(data_dir, cfg()) as log:
        numbers = fill(log, 700)
        segments = sorted(shard_dir(data_dir).glob("*.log"))
        assert len(segments) >= 2
        active_base = int(segments[-1].name.split(".")[0])
        unlink_segment(data_dir)
        with pytest.raises(StorageGone):
            log.append("s", b"after", shard=0)
    assert entries(data_dir) == [payload(i) for i in range(active_base)]
    with Log(data_dir, cfg()) as log:
        assert log.append("s", b"new", shard=0)[1] == active_base
    assert numbers[-1] >= active_base


@pytest.mark.parametrize("kind, name", [(SIZE, "size"), (OPEN, "open"), (NAME, "name"),
                                        (SYNC, "sync"), (MAP, "map")])
def test_erofs_from_any_call_is_read_only_and_refuses(data_dir: Path, kind: int,
                                                      name: str) -> None:
    """EROFS, whichever call of an append (growth, rotation, sync) gets it, reaches the
    caller as ReadOnlyStorage naming the shard, and the shard stays refused after the
    filesystem came back (it needs an operator: a restart); reopened, it takes appends
    and every entry acknowledged before is there."""
    with Log(data_dir, cfg()) as log:
        acked = fill(log, 20)
        with faults(kind, err=errno.EROFS, persist=True) as plan:
            with pytest.raises(ReadOnlyStorage, match="Read-only file system") as raised:
                fill(log, 2 * SEG // 200, start=20)  # grows, rotates, syncs
            assert plan.fired >= 1
        assert "shard 0 of stream 's'" in str(raised.value)
        with pytest.raises(ReadOnlyStorage):
            log.append("s", b"after", shard=0)
        fill(log, 1, shard=1)  # another shard: no EROFS seen there
    stored = entries(data_dir)
    assert stored[:len(acked)] == [payload(i) for i in range(len(acked))]
    with Log(data_dir, cfg()) as log:
        fill(log, 1)


def test_eio_names_the_file_and_does_not_refuse(data_dir: Path) -> None:
    """EIO at a segment's growth is an I/O error naming the file: one failed append,
    nothing refused (it may pass), nothing stored lost."""
    with Log(data_dir, Config(shards=1, segment_bytes=1 << 20, segment_chunk_bytes=SEG,
                              durability="always", background_flush=False,
                              retention_interval_ms=0)) as log:
        fill(log, 10)
        with faults(SIZE, err=errno.EIO, persist=True):
            with pytest.raises(StorageIOError, match=r"\.log: Input/output error") as raised:
                fill(log, 2 * SEG // 200, start=10)
        assert not isinstance(raised.value, (StorageGone, ReadOnlyStorage, StorageFull))
        fill(log, 5, start=1000)


def test_an_os_error_is_not_blamed_on_a_vanished_file(data_dir: Path) -> None:
    """With every file in place, a failed step keeps its own error (ENOSPC: full)."""
    with Log(data_dir, cfg()) as log:
        fill(log, 10)
        with faults(SIZE, err=errno.ENOSPC, persist=True):
            with pytest.raises(StorageFull):
                fill(log, 2 * SEG // 200, start=10)
        fill(log, 1, start=99)
    assert os.path.isdir(shard_dir(data_dir))


@pytest.mark.parametrize("durability", ["always", "interval"])
def test_a_deleted_stream_is_not_a_vanished_one(data_dir: Path, durability: Durability) -> None:
    """Deleting a stream renames its directory away on purpose: another handle's next
    append learns of the deletion (the stream is created again), never StorageGone."""
    with Log(data_dir, cfg(durability)) as log, Log(data_dir, cfg(durability)) as other:
        fill(log, 5)
        other.delete_stream("s")
        log.sync()
        try:
            log.append("s", b"after", shard=0)
        except StorageGone as exc:
            pytest.fail(f"a deleted stream taken for a vanished one: {exc}")
        except StreamNotFound:
            pass  # the handle says so; the gateway opens (or creates) the stream again


def test_a_failing_stat_is_not_taken_for_a_vanished_file(data_dir: Path) -> None:
    """stat, fstat and statvfs failing with EIO tell nothing about the files: the
    shard's appends go on (the check looks again at the next sync)."""
    with Log(data_dir, cfg()) as log:
        fill(log, 5)
        with faults(STAT, err=errno.EIO, persist=True) as plan:
            fill(log, 20, start=5)
            assert plan.fired >= 20  # every append's checks did fail
        fill(log, 5, start=25)
    assert entries(data_dir) == [payload(i) for i in range(30)]
