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

from storage_c import Config, Durability, Log, StorageFull, StorageIOError, SyncFailed
from storage_c.testing import KINDS, MAP, NAME, OPEN, READ, SIZE, SYNC, faults

from .children import fault_worker
from .support.processes import FAULT_WORKER, REPO, worker
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


def test_a_failed_sync_is_fatal_for_the_shard_until_it_is_opened_again(data_dir: Path) -> None:
    """The fsyncgate rule: after a failed fdatasync the kernel may have dropped
    the pages it could not write and the next sync of the same file succeeds
    anyway.  So the shard refuses every append from then on (one error code,
    naming the first failure), the durable point does not move, and only an
    open that writes the tail back and checks it lifts the refusal."""
    with Log(data_dir, cfg()) as log:
        fill(log, "s", map(payload, range(50)), batch=1)
        durable = log.shard_stats("s", 0).durable_entry
        with faults(SYNC) as plan:
            with pytest.raises(SyncFailed, match="fdatasync of segment 0 .* failed: Input/output error"):
                log.sync("s")
        assert plan.fired == 1
        # the fault is gone, but a sync that now "succeeds" proves nothing
        with pytest.raises(SyncFailed, match="refuses appends until it is opened again"):
            log.sync("s")
        with pytest.raises(SyncFailed, match="Input/output error"):
            log.append("s", payload(50), shard=0)
        with pytest.raises(SyncFailed):
            log.append_batch("s", [payload(50)], shard=0)
        stats = log.shard_stats("s", 0)
        assert (stats.sync_failed_errno, stats.sync_failures) == (errno.EIO, 1)
        assert stats.durable_entry == durable and stats.next_entry == 50
        assert all_entries(log) == [(e, payload(e)) for e in range(50)]  # reads go on
    with Log(data_dir, cfg()) as log:  # opened again: the tail is written back and checked
        assert all_entries(log) == [(e, payload(e)) for e in range(50)]
        stats = log.shard_stats("s", 0)
        assert stats.sync_failed_errno == 0 and stats.durable_entry == 50
        assert log.append("s", payload(50), shard=0) == (0, 50)
        assert log.verify("s").bad_entries == 0


def test_every_process_refuses_after_one_saw_a_failed_sync(data_dir: Path) -> None:
    """The mark is in the shared state: a second process that has the shard
    open (and would see no error of its own from the kernel) refuses too.
    (A process that opens the shard after the failure repairs it: see above.)"""
    with Log(data_dir, cfg()) as log:
        fill(log, "s", map(payload, range(10)), batch=1)
        other = worker("try_append", data_dir, "s", stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert other.stdout and other.stdin and other.stdout.readline() == b"open\n"
        with faults(SYNC):
            with pytest.raises(SyncFailed):
                log.sync("s")
        out, _ = other.communicate(b"go\n", timeout=60)
        said = out.decode()
        assert said.startswith("refused: SyncFailed:") and "refuses appends" in said, said


@pytest.mark.parametrize("durability", ["interval", "always"])
def test_what_a_failed_append_sync_leaves_is_stored_once_after_a_retry(
        data_dir: Path, durability: Durability) -> None:
    """Under `always` an append whose sync failed was refused to its caller:
    the reopen cuts it, so the caller's retry stores it once.  Under
    `interval` appends are acknowledged before their sync: the reopen keeps
    them (written back from the page cache and checked)."""
    config = Config(shards=1, segment_bytes=SEG, background_flush=False, retention_interval_ms=0,
                    durability=durability)
    with Log(data_dir, config) as log:
        fill(log, "s", map(payload, range(20)), batch=1)
        log.sync("s")
        acked = 20
        with faults(SYNC):
            if durability == "always":
                with pytest.raises(SyncFailed):
                    log.append("s", payload(20), shard=0)
            else:
                assert log.append("s", payload(20), shard=0) == (0, 20)
                acked = 21
                with pytest.raises(SyncFailed):
                    log.sync("s")
        with pytest.raises(SyncFailed):
            log.append("s", payload(acked), shard=0)
    with Log(data_dir, config) as log:
        assert all_entries(log) == [(e, payload(e)) for e in range(acked)]
        for e in range(acked, 25):  # the caller's retry
            assert log.append("s", payload(e), shard=0) == (0, e)
    with Log(data_dir, config) as log:
        assert all_entries(log) == [(e, payload(e)) for e in range(25)]
        assert log.verify("s").bad_entries == 0
    assert not list(data_dir.rglob("*.orphan"))


def test_a_refused_always_append_that_rotated_leaves_no_segment_behind(data_dir: Path) -> None:
    """The refused append was the first in a new segment: the reopen empties
    that segment (it holds nothing acknowledged; nothing is set aside as an
    .orphan: there is no damage) and the retry lands there once."""
    config = Config(shards=1, segment_bytes=SEG, background_flush=False, retention_interval_ms=0,
                    durability="always")
    for nth in range(1, 10):
        where = data_dir / f"n{nth}"
        where.mkdir(parents=True)
        with Log(where, config) as log:
            fill(log, "s", map(payload, range(199)), batch=1)  # the segment is full
            assert log.shard_stats("s", 0).segments == 1
            with faults(SYNC, nth=nth):
                try:
                    log.append("s", payload(199), shard=0)
                except SyncFailed:
                    segments = log.shard_stats("s", 0).segments
                    break
                except StorageIOError:
                    continue
    else:
        pytest.fail("no sync of the rotating append marked the shard")
    assert segments == 2
    with Log(where, config) as log:
        assert all_entries(log) == [(e, payload(e)) for e in range(199)]
        assert log.append("s", payload(199), shard=0) == (0, 199)
        assert all_entries(log) == [(e, payload(e)) for e in range(200)]
        assert log.verify("s").bad_entries == 0
    assert not list(where.rglob("*.orphan"))


def test_a_device_that_still_fails_keeps_the_shard_refusing(data_dir: Path) -> None:
    with Log(data_dir, cfg()) as log:
        fill(log, "s", map(payload, range(10)), batch=1)
        with faults(SYNC):
            with pytest.raises(SyncFailed):
                log.sync("s")
    with faults(SYNC, persist=True):
        with Log(data_dir, cfg()) as log:
            assert all_entries(log) == [(e, payload(e)) for e in range(10)]  # reads go on
            assert log.shard_stats("s", 0).sync_failed_errno == errno.EIO
            with pytest.raises(SyncFailed):
                log.append("s", payload(10), shard=0)
    with Log(data_dir, cfg()) as log:
        assert all_entries(log) == [(e, payload(e)) for e in range(10)]
        assert log.append("s", payload(10), shard=0) == (0, 10)


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
def test_every_sync_of_a_rotation_that_fails_is_seen(data_dir: Path, durability: Durability) -> None:
    """Each sync around a rotation failing once in turn (the segments' data,
    the directory that names the new segment, the state): the failure is
    never silent.  A rotation itself syncs nothing (no device flush in the
    append path); the sync that covers the new segment fdatasyncs the
    segments and then the directory, and any of those failing marks the
    shard, which refuses until it is opened again.  After the retry every
    entry is there once."""
    config = Config(shards=1, segment_bytes=SEG, background_flush=False, retention_interval_ms=0,
                    durability=durability)
    causes: list[str] = []
    for nth in range(1, 16):
        where = data_dir / f"n{nth}"
        where.mkdir(parents=True)
        with Log(where, config) as log:
            fill(log, "s", map(payload, range(196)), batch=1)  # the segment is full at 199
            log.sync("s")
            failed: int | None = None
            refused = False
            with faults(SYNC, nth=nth) as plan:
                for e in range(196, 260):
                    try:
                        assert log.append("s", payload(e), shard=0) == (0, e)
                    except SyncFailed as exc:
                        failed, refused, causes = e, True, causes + [str(exc)]
                        break
                    except StorageIOError as exc:
                        failed, causes = e, causes + [str(exc)]
                        break
                else:
                    try:
                        log.sync("s")
                    except SyncFailed as exc:
                        failed, refused, causes = 260, True, causes + [str(exc)]
            if not plan.fired:  # every sync of the scenario has failed once
                assert failed is None and nth > 3, nth  # two segments, the directory
                break
            assert failed is not None, f"sync #{nth} failed and nobody was told"
        if refused:  # opened again: the tail is checked, the refusal lifted
            with Log(where, config) as log:
                failed = log.shard_stats("s", 0).next_entry
        with Log(where, config) as log:
            for e in range(failed, 260):  # the same appends again
                assert log.append("s", payload(e), shard=0) == (0, e)
            assert all_entries(log) == [(e, payload(e)) for e in range(260)]
        with Log(where, config) as log:
            assert all_entries(log) == [(e, payload(e)) for e in range(260)]
    assert any("fsync of the directory" in cause for cause in causes), causes
    assert all("refuses appends" in cause for cause in causes), causes


# ---- Faults that could show a loss: real processes, the page cache dropped ----
#
# The writer runs under a fault plan in a process of its own and says which
# entries it acknowledged; the test then drops the data files' pages from the
# page cache, and a fresh process (never the writer's handle) reads the
# directory back.  A read error on a segment header must be an error naming
# the file, never a reason to set the segment aside.

TOTAL = 700  # entries of the walk's writer: three 64 KiB segments


def run(*args: object) -> list[dict[str, Any]]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, str(FAULT_WORKER), *map(str, args)], env=env,
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
