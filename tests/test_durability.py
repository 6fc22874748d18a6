"""Durability levels and durable-only readers (SPEC 3.3)."""

from __future__ import annotations

import time
from pathlib import Path

from storage_c import Config, Log


def test_durable_only_readers_see_synced_entries_only(data_dir: Path) -> None:
    cfg = Config(shards=1, durability="none", background_flush=False)
    with Log(data_dir, cfg) as log:
        log.append_batch("d", [b"a", b"b", b"c"], shard=0)
        assert len(log.read("d", 0)) == 3
        assert len(log.read("d", 0, durable_only=True)) == 0
        log.sync("d")
        assert list(log.read("d", 0, durable_only=True).entries) == [0, 1, 2]
        log.append("d", b"d", shard=0)
        durable = log.read("d", 0, durable_only=True)
        assert len(durable) == 3 and durable.next_entry == 3
        stats = log.shard_stats("d", 0)
        assert (stats.durable_entry, stats.next_entry) == (3, 4)


def test_always_syncs_every_append(data_dir: Path) -> None:
    with Log(data_dir, Config(shards=1, durability="always")) as log:
        for i in range(20):
            log.append("a", b"%d" % i, shard=0)
            stats = log.shard_stats("a", 0)
            assert stats.durable_entry == stats.next_entry == i + 1
        assert log.shard_stats("a", 0).syncs >= 20
        log.append_batch("a", [b"x"] * 5, shard=0)
        assert log.shard_stats("a", 0).syncs >= 21


def test_per_call_durability_override(data_dir: Path) -> None:
    with Log(data_dir, Config(shards=1, durability="none", background_flush=False)) as log:
        log.append("o", b"fast", shard=0)
        log.append("o", b"safe", shard=0, durability="always")
        assert log.shard_stats("o", 0).durable_entry == 2


def test_interval_flusher_advances_the_durable_point(data_dir: Path) -> None:
    with Log(data_dir, Config(shards=1, durability="interval", fsync_interval_ms=20)) as log:
        log.append_batch("i", [b"x"] * 10, shard=0)
        deadline = time.time() + 5
        while log.shard_stats("i", 0).durable_entry < 10 and time.time() < deadline:
            time.sleep(0.01)
        assert log.shard_stats("i", 0).durable_entry == 10
        assert log.shard_stats("i", 0).syncs >= 1


def test_group_commit_shares_syncs(data_dir: Path) -> None:
    import threading

    with Log(data_dir, Config(shards=1, durability="always")) as log:
        log.create_stream("g", 1)

        def run() -> None:
            for _ in range(50):
                log.append("g", b"x", shard=0)

        threads = [threading.Thread(target=run) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stats = log.shard_stats("g", 0)
        assert stats.durable_entry == stats.next_entry == 400
        assert stats.syncs < 400  # concurrent appends shared fdatasyncs


def test_close_flushes(data_dir: Path) -> None:
    with Log(data_dir, Config(shards=1, durability="none", background_flush=False)) as log:
        log.append("c", b"x", shard=0)
    with Log(data_dir, Config(shards=1)) as log:
        assert log.shard_stats("c", 0).durable_entry == 1
