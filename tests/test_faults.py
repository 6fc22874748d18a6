"""Injected system-call failures seen from Python (storage_c.testing): each
gives a clear error, nothing stored is lost or changed, and the log works
again once the fault is gone.  The exhaustive sweep over every failure point
is the C test storage_c/tests/test_faults.c."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterable

import pytest

from storage_c import Config, Log, StorageFull, StorageIOError
from storage_c.testing import KINDS, MAP, NAME, OPEN, READ, SIZE, SYNC, faults

from .support import fault_worker
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


# ---- Faults that could show a loss: real processes, the page cache dropped ----
#
# The writer runs under a fault plan in a process of its own and says which
# entries it acknowledged; the test then drops the data files' pages from the
# page cache, and a fresh process (never the writer's handle) reads the
# directory back.  A read error on a segment header must be an error naming
# the file, never a reason to set the segment aside.

WORKER = Path(__file__).resolve().parent / "support" / "fault_worker.py"
TOTAL = 700  # entries of the walk's writer: three 64 KiB segments


def run(*args: object) -> list[dict[str, Any]]:
    env = dict(os.environ, PYTHONPATH=str(WORKER.parents[2]))
    proc = subprocess.run([sys.executable, str(WORKER), *map(str, args)], env=env,
                          capture_output=True, timeout=300)
    assert proc.returncode == 0, f"{args[:2]} exited {proc.returncode}:\n{proc.stderr.decode()}"
    return [json.loads(line) for line in proc.stdout.decode().splitlines()]


def drop_page_cache(where: Path) -> int:
    """Asks the kernel to forget every data file's cached pages (the writer has
    exited; its synced pages go, so the next read comes from the files)."""
    dropped = 0
    for path in where.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                dropped += 1
            finally:
                os.close(fd)
    return dropped


def orphans(where: Path) -> list[str]:
    return sorted(str(p.relative_to(where)) for p in where.rglob("*.orphan"))


def checked(where: Path) -> dict[str, Any]:
    """The directory as a fresh process reads it, after the page cache was dropped."""
    drop_page_cache(where)
    (result,) = run("check", where)
    return result


def expected(entries: Iterable[int]) -> list[list[Any]]:
    return [[e, fault_worker.payload(e).hex()] for e in entries]


def test_a_read_error_on_a_segment_header_is_a_named_error_not_an_orphan(data_dir: Path) -> None:
    """Each read of an open (the Nth and every one after it failing with EIO)
    in a process of its own: the open fails with StorageIOError, and when the
    read was a segment's header the message names that segment; no file is
    set aside, and a clean open in a fresh process reads every entry."""
    lines = run("write", data_dir, "[]", 1000, "always")
    assert lines[-1]["error"] is None
    assert checked(data_dir)["entries"] == expected(range(1000))
    named: list[str] = []
    for nth in range(1, 200):
        (got,) = run("open", data_dir, json.dumps([[["read"], nth, 0, errno.EIO]]))
        if got["calls"] < nth:  # the open made fewer reads: every one has failed once
            assert got["error"] is None and got["read"] == 1000
            break
        assert got["error"] is not None, got
        assert got["error"]["type"] == "StorageIOError", got
        assert "Input/output error" in got["error"]["message"]
        if "cannot read the header of segment" in got["error"]["message"]:
            named.append(got["error"]["message"])
        assert orphans(data_dir) == [], (nth, got)
        assert checked(data_dir)["entries"] == expected(range(1000)), nth
    else:
        raise AssertionError("the open never ran out of reads")
    segments = sorted(p.name for p in (data_dir / "s" / "shard-0000").glob("*.log"))
    assert len(segments) >= 3
    assert any(segments[-1] in message for message in named), (segments, named)


def test_a_verify_that_cannot_read_a_segment_fails_instead_of_reporting_damage(
        data_dir: Path) -> None:
    """A read error on the sealed segments' headers while verify loads them:
    an error to the caller, not entries reported bad (an operator would
    restore a healthy directory from backup)."""
    run("write", data_dir, "[]", 1000, "always")
    with Log(data_dir, fault_worker.config()) as log:
        assert list(log.read("s", 0, 0, 1).entries) == [0]  # the shard open, the first segment loaded
        with faults(READ, err=errno.EIO, persist=True) as plan:
            with pytest.raises(StorageIOError, match="cannot read the header of segment"):
                log.verify("s")
        assert plan.fired >= 1
        report = log.verify("s")
        assert report.bad_entries == 0 and report.entries == 1000


WALK = [  # kinds, errno or "short", count (0: from then on), whether the run must succeed
    (["sync"], errno.EIO, 1, False),
    (["sync"], errno.EROFS, 0, False),
    (["write"], errno.ENOSPC, 0, False),
    (["size"], errno.EROFS, 1, False),
    (["read"], errno.EIO, 0, False),
    (["open"], errno.EMFILE, 0, False),
    (["stat"], errno.EIO, 1, False),
    (["lock"], errno.ENOLCK, 1, False),
    (["close"], errno.EIO, 0, False),
    (["map"], errno.ENOMEM, 1, False),
    (list(KINDS.keys() - {"readdir", "alloc"}), errno.EINTR, 5, True),
    (["read", "write"], "short", 0, True),
]


@pytest.mark.parametrize("kinds,err,count,absorbed", WALK,
                         ids=[f"{'+'.join(w[0]) if len(w[0]) < 4 else 'all'}-{w[1]}-{w[2]}"
                              for w in WALK])
def test_acknowledged_entries_survive_every_fault_in_a_fresh_process(
        tmp_path: Path, kinds: list[str], err: int | str, count: int, absorbed: bool) -> None:
    """The Nth call of the kinds failing (for a spread of N from the open on)
    in a writer process under durability=always: it stops at its first error
    (a storage error, never anything else), or, for EINTR and short
    transfers, never fails.  Then, from a fresh process with the page cache
    dropped: every acknowledged entry is there byte for byte, nothing else but
    the one append that failed, no damage, nothing set aside."""
    reached = 0
    for nth in (1, 2, 3, 5, 8, 13, 21, 40, 80, 160, 320, 640):
        where = tmp_path / f"n{nth}"
        lines = run("write", where, json.dumps([[kinds, nth, count, err]]), TOTAL, "always")
        done = lines[-1]
        acked = [line["ack"] for line in lines[:-1]]
        assert acked == list(range(len(acked)))
        if done["calls"] < nth:
            assert done["error"] is None and len(acked) == TOTAL
            break
        reached += 1
        if absorbed:
            assert done["error"] is None, (nth, done)
            assert len(acked) == TOTAL
        else:
            assert done["error"] is None or done["error"]["type"] in STORAGE_ERRORS, (nth, done)
            if done["error"] and done["error"]["type"] == "CometError":  # no class of its own
                assert "Cannot allocate memory" in done["error"]["message"]
        got = checked(where)
        assert got["bad_entries"] == 0 and got["skipped"] == 0, (nth, done)
        assert got["entries"][:len(acked)] == expected(acked), (nth, done)
        assert len(got["entries"]) <= len(acked) + (1 if done["error"] else 0), (nth, done)
        assert got["entries"] == expected(range(len(got["entries"]))), (nth, done)
        assert orphans(where) == [], (nth, done)
    assert reached >= 1  # the walk did meet the fault


STORAGE_ERRORS = {"CometError",  # out of memory (COMET_E_NOMEM)
                  "StorageIOError", "StorageFull", "ReadOnlyStorage", "SyncFailed", "StorageGone"}
