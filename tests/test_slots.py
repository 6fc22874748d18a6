"""Process slots held by kernel-released locks (SPEC 3.4)."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from storage_c import Config, Log, NoFreeSlot, ProcessCountMismatch, SlotAlreadyHeld

from .support.processes import worker


def start_holder(data_dir: Path, count: int) -> tuple[subprocess.Popen[bytes], str]:
    proc = worker("hold_slot", data_dir, count, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    return proc, proc.stdout.readline().decode().strip()


def test_two_processes_get_distinct_slots(data_dir: Path) -> None:
    a, slot_a = start_holder(data_dir, 2)
    b, slot_b = start_holder(data_dir, 2)
    try:
        assert {slot_a, slot_b} == {"0", "1"}
        c, answer = start_holder(data_dir, 2)
        c.wait(timeout=30)
        assert answer.startswith("busy") and "all 2 process slots" in answer
    finally:
        for p in (a, b):
            p.kill()
            p.wait()


def test_killed_holder_slot_is_reclaimed_at_once(data_dir: Path) -> None:
    a, slot_a = start_holder(data_dir, 2)
    b, slot_b = start_holder(data_dir, 2)
    try:
        victim = a if slot_a == "0" else b
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        with Log(data_dir, Config(process_count=2)) as log:
            assert log.claim_slot() == 0  # no timeout, no PID check: the lock was released
    finally:
        for p in (a, b):
            p.kill()
            p.wait()


def test_slots_in_one_process_and_errors(data_dir: Path) -> None:
    cfg = Config(process_count=3)
    with Log(data_dir, cfg) as one, Log(data_dir, cfg) as two, Log(data_dir, cfg) as three:
        assert [one.claim_slot(), two.claim_slot(), three.claim_slot()] == [0, 1, 2]
        with Log(data_dir, cfg) as four:
            with pytest.raises(NoFreeSlot, match="all 3 process slots"):
                four.claim_slot()
            assert four.slot is None
        with pytest.raises(SlotAlreadyHeld):
            one.claim_slot()
        # a process started with another count is refused while others run
        with Log(data_dir, Config(process_count=5)) as other:
            with pytest.raises(ProcessCountMismatch, match="process_count 3"):
                other.claim_slot()
        two.close()
        with Log(data_dir, cfg) as again:
            assert again.claim_slot() == 1
    with Log(data_dir, Config(process_count=5)) as later:  # nobody runs: the count may change
        assert later.claim_slot() == 0


def test_ownership_and_unkeyed_rotation(data_dir: Path) -> None:
    cfg = Config(process_count=2, shards=6)
    with Log(data_dir, cfg, claim_slot=True) as a, Log(data_dir, cfg, claim_slot=True) as b:
        assert a.owned_shards("o") == [0, 2, 4]
        assert b.owned_shards("o") == [1, 3, 5]
        assert {a.append("o", b"x")[0] for _ in range(6)} == {0, 2, 4}
        assert {b.append("o", b"x")[0] for _ in range(6)} == {1, 3, 5}
        # a write to a foreign shard is still correct (it takes that shard's lock)
        assert a.append("o", b"foreign", shard=1) == (1, 2)
