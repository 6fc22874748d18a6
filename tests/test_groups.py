"""Consumer-group offsets (SPEC 3.5): per group, per shard, shared by every
process, monotonic, and safe from bad names."""

from __future__ import annotations

from pathlib import Path

import pytest

from consumers import Consumer
from storage_c import AckGapError, GroupNameError, GroupNotFound, InvalidArgument, Log
from storage_c import TooManyGroups

from .support.processes import run_worker, worker
from .support.storage import SMALL, fill


TEN = [b"e%d" % i for i in range(10)]


def test_read_without_ack_repeats_and_ack_moves_on(log: Log) -> None:
    fill(log, "ev", TEN, shards=2, shard=0)
    c = Consumer(log, "ev", "g")
    first = c.read(4, shard=0)
    assert list(first.entries) == [0, 1, 2, 3]
    assert list(c.read(4, shard=0).entries) == [0, 1, 2, 3]  # not acked: read again
    assert c.ack(0, 1) == 2
    assert list(c.read(4, shard=0).entries) == [2, 3, 4, 5]
    assert c.ack(0, 0) == 2  # monotonic: an older ack changes nothing
    assert c.ack(0, 99) == 10  # clamped to the committed end
    assert c.lag(0) == 0 and len(c.read(4, shard=0)) == 0
    log.append("ev", b"late", shard=0)
    assert list(c.read(4, shard=0).entries) == [10]  # the clamp did not skip the future


def test_groups_are_isolated_persistent_and_shared(data_dir: Path) -> None:
    with Log(data_dir, SMALL) as log:
        fill(log, "ev", TEN, shards=2, shard=0)
        a, b = Consumer(log, "ev", "a"), Consumer(log, "ev", "b")
        a.ack(0, 5)
        assert (a.offset(0), b.offset(0)) == (6, 0)
        # another process sees the offset at once, and moves it
        out = run_worker("group_offset", data_dir, "ev", "a", 0, 7)
        assert out.split() == ["6", "8"]
        assert a.offset(0) == 8
    with Log(data_dir, SMALL) as log:  # and after a restart
        assert Consumer(log, "ev", "a").offset(0) == 8
        assert Consumer(log, "ev", "b").offset(0) == 0


def test_reset_and_ack_range(log: Log) -> None:
    fill(log, "ev", TEN, shards=2, shard=0)
    c = Consumer(log, "ev", "g")
    c.ack(0, 9)
    assert c.reset_offset(0, -3) == 7
    assert [p for p in c.read(10, shard=0).payloads] == [b"e7", b"e8", b"e9"]
    with pytest.raises(InvalidArgument, match="from .9. is after to .8."):
        c.ack_range(0, 9, 8)
    with pytest.raises(AckGapError, match="would skip entries 7..7"):
        c.ack_range(0, 8, 9)
    assert c.ack_range(0, 7, 8) == 9
    assert c.reset_offset(0, 0) == 0
    assert c.reset_offset(0, 1000) == 10


def test_512_groups_and_bad_names(log: Log) -> None:
    fill(log, "ev", TEN, shards=2, shard=0)
    for i in range(512):
        log.group("ev", 1, f"group.{i:03d}")
    with pytest.raises(TooManyGroups, match="all 512 group slots"):
        log.group("ev", 1, "one-too-many")
    assert len(log.groups("ev", 1)) == 512
    log.group("ev", 1, "group.000")  # an existing one still opens
    # refused up front: no slot is taken in shard 0
    for bad in ["x" * 60, "x" * 48, "a/b", "", "é", "a b"]:
        with pytest.raises(GroupNameError):
            log.group("ev", 0, bad)
        with pytest.raises(GroupNameError):
            Consumer(log, "ev", bad)
    assert log.groups("ev", 0) == []
    log.group("ev", 0, "x" * 47)  # 47 bytes is the limit, not cut
    assert [g.name for g in log.groups("ev", 0)] == ["x" * 47]
    log.delete_group("ev", "group.000")
    with pytest.raises(GroupNotFound):
        log.group("ev", 1, "group.000", create=False)
    log.group("ev", 1, "one-too-many")  # the freed slot is reused


def test_offsets_survive_kill_9(data_dir: Path) -> None:
    with Log(data_dir, SMALL) as log:
        fill(log, "ev", TEN, shards=2, shard=0)
    proc = worker("group_offset", data_dir, "ev", "k", 0, 4, "--then-die")
    assert proc.wait(timeout=60) < 0  # killed itself with SIGKILL after the ack
    with Log(data_dir, SMALL) as log:
        assert log.group("ev", 0, "k").offset == 5
