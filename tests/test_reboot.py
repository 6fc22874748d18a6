"""Locks left "held" by a previous boot are initialised again (SPEC 3.4).

A power cut can leave a shard's mutex word saying "locked by thread T" in the
state file; after the reboot no thread T exists, and no robust-list cleanup
will ever run for it.  The state records the boot id of the kernel that set
its locks up; a different boot id makes the next opener initialise them again.
"""

from __future__ import annotations

import struct
import subprocess
from pathlib import Path

import pytest

from storage_c import Config, Log, crc32c

from .support.processes import worker
from .support.storage import read_all

MUTEX_AT, BOOT_ID_AT = 64, 16


def fake_stale_lock(state: Path, new_boot_id: bytes | None) -> None:
    raw = bytearray(state.read_bytes())
    # glibc's mutex: the lock word holds the owner's TID (here, a thread that
    # does not exist), __owner repeats it.
    raw[MUTEX_AT: MUTEX_AT + 4] = struct.pack("<I", 0x3FFFFFF)
    raw[MUTEX_AT + 8: MUTEX_AT + 12] = struct.pack("<I", 0x3FFFFFF)
    if new_boot_id is not None:
        raw[BOOT_ID_AT: BOOT_ID_AT + 16] = new_boot_id
        crc = crc32c(bytes(raw[:60]))
        raw[60:64] = struct.pack("<I", (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF)
    state.write_bytes(bytes(raw))


def test_locks_from_another_boot_are_reinitialised(data_dir: Path) -> None:
    with Log(data_dir, Config(shards=1)) as log:
        log.append("boot", b"before", shard=0)
    state = data_dir / "boot" / "shard-0000" / "state"
    fake_stale_lock(state, new_boot_id=bytes(range(16)))
    child = worker("append_one", data_dir, "boot", "after", stdout=subprocess.PIPE)
    out, _ = child.communicate(timeout=60)
    assert child.returncode == 0 and out.strip() == b"1"
    with Log(data_dir, Config(shards=1)) as log:
        assert [p for _, _, p in read_all(log, "boot", 0)] == [b"before", b"after"]


def test_the_same_boot_keeps_its_locks_while_a_process_holds_the_shard(data_dir: Path) -> None:
    """The control: with the boot id unchanged and a process holding the shard
    open (this one), a lock word naming a live (here: impossible) owner is
    respected - the appender waits for it.  (With nobody holding the shard the
    word means nothing and is reset: tests/test_stale_locks.py.)"""
    with Log(data_dir, Config(shards=1)) as log:
        log.append("boot", b"before", shard=0)
        state = data_dir / "boot" / "shard-0000" / "state"
        fake_stale_lock(state, new_boot_id=None)
        child = worker("append_one", data_dir, "boot", "after", stdout=subprocess.PIPE)
        with pytest.raises(subprocess.TimeoutExpired):
            child.communicate(timeout=3)
        child.kill()
        child.wait()


def test_the_same_boot_resets_a_lock_no_process_holds(data_dir: Path) -> None:
    """The same lock word with nobody holding the shard (a copy of a live
    directory, a volume attached again): the opener re-initialises it and the
    append goes through at once."""
    with Log(data_dir, Config(shards=1)) as log:
        log.append("boot", b"before", shard=0)
    state = data_dir / "boot" / "shard-0000" / "state"
    fake_stale_lock(state, new_boot_id=None)
    child = worker("append_one", data_dir, "boot", "after", stdout=subprocess.PIPE)
    try:
        out, _ = child.communicate(timeout=60)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == 0 and out.strip() == b"1"
    with Log(data_dir, Config(shards=1)) as log:
        assert [p for _, _, p in read_all(log, "boot", 0)] == [b"before", b"after"]
        assert log.shard_stats("boot", 0).lock_owner_died == 1
