"""The power-cut filesystem itself: what survives a cut, and how syncs reach it.

These pin the model the scenarios rely on (see fs.py): a shared mapping's
stores reach the daemon only when the kernel writes them back, ``msync`` and
``fdatasync`` write back and then fsync, ``syncfs`` writes back without making
anything durable, and a directory entry is durable only after ``fsyncdir``.
"""

from __future__ import annotations

import errno
import mmap
import os
from pathlib import Path

from .harness import PowerCutFS, make_synced_dir, writeback


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def test_msync_and_fdatasync_make_mapped_pages_durable(powercut: PowerCutFS) -> None:
    d = make_synced_dir(powercut.mnt / "d")
    fd = os.open(d / "f", os.O_RDWR | os.O_CREAT, 0o644)
    os.posix_fallocate(fd, 0, 4 * 4096)
    os.fsync(fd)
    _fsync_dir(d)
    m = mmap.mmap(fd, 4 * 4096, mmap.MAP_SHARED)
    before = powercut.stats()
    m[0:5] = b"msync"
    assert powercut.stats().get("write", 0) == before.get("write", 0)  # only in the page cache
    m.flush(0, 4096)  # msync(MS_SYNC)
    after = powercut.stats()
    assert after["write"] > before.get("write", 0) and after["fsync"] > before["fsync"]
    m[4096:4101] = b"fdata"
    os.fdatasync(fd)
    m[8192:8197] = b"wrote"
    writeback(powercut.mnt)  # reaches the daemon, stays volatile
    assert powercut.stats()["fsync"] == after["fsync"] + 1
    m[12288:12293] = b"never"  # never leaves the page cache
    m.close()
    os.close(fd)
    powercut.cut("clean", 0)
    raw = (d / "f").read_bytes()
    assert raw[0:5] == b"msync" and raw[4096:4101] == b"fdata"
    assert raw[8192:8197] == bytes(5) and raw[12288:12293] == bytes(5)


def test_pages_mode_keeps_a_subset_of_written_back_pages(powercut: PowerCutFS) -> None:
    d = make_synced_dir(powercut.mnt / "d")
    fd = os.open(d / "f", os.O_RDWR | os.O_CREAT, 0o644)
    os.posix_fallocate(fd, 0, 64 * 4096)
    os.fsync(fd)
    _fsync_dir(d)
    for page in range(64):
        os.pwrite(fd, b"p", page * 4096)
    os.close(fd)
    _, kept = powercut.cut("pages", 7)
    raw = (d / "f").read_bytes()
    survived = sum(raw[p * 4096] == ord("p") for p in range(64))
    assert survived == kept and 0 < kept < 64


def test_directory_entries_need_their_directory_synced(powercut: PowerCutFS) -> None:
    d = make_synced_dir(powercut.mnt / "d")
    for name in ("synced", "unsynced"):
        with open(d / name, "wb") as f:
            f.write(name.encode())
            f.flush()
            os.fsync(f.fileno())
        if name == "synced":
            _fsync_dir(d)
    os.mkdir(d / "sub")  # its entry in d is never synced
    with open(d / "sub" / "inner", "wb") as f:
        os.fsync(f.fileno())
    _fsync_dir(d / "sub")
    os.rename(d / "synced", d / "renamed")  # not synced either: the old name comes back
    powercut.cut("clean", 0)
    assert sorted(os.listdir(d)) == ["synced"]
    assert (d / "synced").read_bytes() == b"synced"


def test_nothing_reaches_the_daemon_after_the_cut(powercut: PowerCutFS) -> None:
    """A writer that is still running at the instant of the cut: its later syncs
    fail, and its dirty pages are dropped, never written back."""
    d = make_synced_dir(powercut.mnt / "d")
    fd = os.open(d / "f", os.O_RDWR | os.O_CREAT, 0o644)
    os.posix_fallocate(fd, 0, 4096)
    os.fsync(fd)
    _fsync_dir(d)
    m = mmap.mmap(fd, 4096, mmap.MAP_SHARED)
    m[0:4] = b"late"
    assert powercut._cmd("freeze") == "frozen"
    try:
        os.fdatasync(fd)
        raise AssertionError("a sync after the cut succeeded")
    except OSError:
        pass
    m.close()
    try:
        os.close(fd)  # the close's flush fails too; the descriptor is gone anyway
    except OSError:
        pass
    powercut._unmount()
    assert powercut._cmd("reset clean 0").startswith("reset")
    powercut.mount()
    assert (d / "f").read_bytes() == bytes(4096)


def test_ftruncate_through_a_descriptor(powercut: PowerCutFS) -> None:
    """Was a bug of the filesystem, not of what it tests: FUSE 3 sends an
    ``ftruncate`` without a path, and mfusepy dropped its file handle, so it
    failed with EBADF (a spark-ship run's lock file is truncated so)."""
    d = make_synced_dir(powercut.mnt / "d")
    fd = os.open(d / "f", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, b"0123456789", 0)
        os.ftruncate(fd, 4)
        os.fsync(fd)
    finally:
        os.close(fd)
    _fsync_dir(d)
    powercut.cut("clean", 0)
    assert (d / "f").read_bytes() == b"0123"


def test_dirs_mode_keeps_a_prefix_of_unsynced_directory_changes(powercut: PowerCutFS) -> None:
    """``+dirs``: of the directory changes no fsyncdir made durable, a prefix survives,
    in order; a rename never loses its file; synced changes always survive."""
    seen = set()
    for seed in range(12):
        d = make_synced_dir(powercut.mnt / f"d{seed}")
        (d / "synced").write_bytes(b"s")
        _fsync_dir(d)
        for name in ("a", "b", "c"):
            (d / name).write_bytes(name.encode())
        os.rename(d / "a", d / "a2")
        os.unlink(d / "synced")
        powercut.cut("clean+dirs", seed)
        names = sorted(p.name for p in d.iterdir())
        prefixes = [["synced"], ["a", "synced"], ["a", "b", "synced"], ["a", "b", "c", "synced"],
                    ["a", "a2", "b", "c", "synced"], ["a2", "b", "c", "synced"], ["a2", "b", "c"]]
        assert names in prefixes, f"seed {seed}: {names} is no prefix of the changes"
        seen.add(len(names) + names.count("a2") * 10)
        stats = powercut.stats()
        assert stats["dirs_unsynced"] == 6 and 0 <= stats["dirs_kept"] <= 6
    assert len(seen) > 2, f"12 resets kept the same prefix lengths: {seen}"


def test_failsync_fails_the_next_syncs_and_drops_unsynced_data(powercut: PowerCutFS) -> None:
    """``failsync``: the next fsync fails (EIO) and drops what was not durable; the one
    after succeeds with nothing to write (fsyncgate); reading past the page cache
    (a restart, same boot) shows the durable bytes only."""
    d = make_synced_dir(powercut.mnt / "d")
    fd = os.open(d / "f", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, b"durable!", 0)
        os.fsync(fd)
        _fsync_dir(d)
        os.pwrite(fd, b"volatile", 8)
        powercut.failsync(d / "f", 1)
        try:
            os.fsync(fd)
            raise AssertionError("the armed fsync succeeded")
        except OSError as exc:
            assert exc.errno == errno.EIO
        os.fsync(fd)  # succeeds: the failed write-back is forgotten
        assert powercut.stats()["injected"] == 1
    finally:
        os.close(fd)
    powercut.restart()
    assert (d / "f").read_bytes() == b"durable!"
