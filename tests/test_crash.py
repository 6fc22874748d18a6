"""Crash safety with real processes and SIGKILL (SPEC 3.7)."""

from __future__ import annotations

import os
import random
import select
import signal
import time
from pathlib import Path

import pytest

from storage_c import Config, Log

from .children.workers import batch_payloads
from .support.processes import worker

CFG = Config(shards=1, segment_bytes=1 << 20, background_flush=False)


def check_batches(log: Log, acked: dict[int, tuple[int, int]], start: int = 0) -> int:
    """From entry `start` (a batch boundary) on: every acknowledged batch is
    present and intact at its place, and every visible entry belongs to a
    complete batch.  Returns the entry count."""
    entries = [(e, p) for b in log.iter_entries("crash", 0, start)
               for e, p in zip(b.entries, b.payloads)]
    assert [e for e, _ in entries] == list(range(start, start + len(entries))), "a gap"
    i = 0
    while i < len(entries):
        seq, item, count = (int(x) for x in entries[i][1].split(b":", 3)[:3])
        assert item == 0, f"entry {i} starts in the middle of batch {seq}"
        want = batch_payloads(seq, count, 2000)
        got = [p for _, p in entries[i: i + count]]
        assert got == want, f"batch {seq} at entry {i} is torn or damaged"
        if seq in acked:
            assert acked.pop(seq) == (start + i, count)
        i += count
    assert not acked, f"acknowledged batches missing: {sorted(acked)[:5]}"
    return start + len(entries)


@pytest.mark.slow
def test_crash_loop_kill_9(data_dir: Path) -> None:
    rng = random.Random(2024)
    seq = 0
    total = 0
    for round_ in range(50):
        r, w = os.pipe()
        child = worker("crash_appender", data_dir, w, seq, rng.choice([1, 20, 400]), pass_fds=(w,))
        os.close(w)
        # once the child has acknowledged its first batch, a random moment of appending
        ready, _, _ = select.select([r], [], [], 60)
        assert ready, "the appender acknowledged nothing within 60 s"
        acks = os.read(r, 1 << 16)
        time.sleep(rng.uniform(0.0, 0.3))
        child.send_signal(signal.SIGKILL)
        child.wait()
        while chunk := os.read(r, 1 << 16):
            acks += chunk
        os.close(r)
        acked = {}
        for line in acks.decode().splitlines():
            s, first, count = map(int, line.split())
            acked[s] = (first, count)
        seq = max(acked, default=seq - 1) + 2  # the killed batch's number is never reused
        with Log(data_dir, CFG) as log:
            before = total
            total = check_batches(log, acked, start=before)  # what this child wrote
            assert total >= before
            # the log keeps accepting appends after every crash
            res = log.append_batch("crash", batch_payloads(seq, 3, 2000), shard=0)
            assert res.first == total
            total += 3
            seq += 1
    with Log(data_dir, CFG) as log:
        assert check_batches(log, {}) == total  # and everything, once more, at the end
        stats = log.shard_stats("crash", 0)
        assert stats.next_entry == total
        assert log.verify().ok


def test_killed_while_holding_the_lock(data_dir: Path) -> None:
    with Log(data_dir, CFG) as log:
        for i in range(20):
            log.append("locked", b"before %d" % i, shard=0)
        checks = log.shard_stats("locked", 0).recoveries
        child = worker("die_holding_lock", data_dir, "locked", 0, stdout=-1)
        assert child.stdout is not None
        assert child.stdout.readline() == b"locked\n"
        child.wait()
        assert child.returncode == -signal.SIGKILL
        # this process is the next appender: it is told the holder died, cuts
        # the torn bytes the holder left, and goes on
        assert log.append("locked", b"after", shard=0) == (0, 20)
        stats = log.shard_stats("locked", 0)
        assert stats.lock_owner_died == 1
        assert stats.recoveries == checks + 1  # the dead holder's tail was checked
        assert stats.truncated_bytes >= 300
        got = [p for b in log.iter_entries("locked", 0) for p in b.payloads]
        assert got == [b"before %d" % i for i in range(20)] + [b"after"]
    # another process appends too, without trouble
    with Log(data_dir, CFG) as other:
        assert other.append("locked", b"later", shard=0) == (0, 21)
