"""What an operator can do to a running gateway's files, under load (issue 25): the data
directory removed, a shard directory removed, the active segment of a shard unlinked.

Each runs a real ``comet serve`` (tests/support/server.py) with clients posting from
threads, does the damage from outside, and checks what the clients saw (202 or 503
``storage_gone``, never 500, and no 202 for a request sent after its shard's refusal
reached a client), the one log line per cause, ``/readyz``, and what a restart does:
nothing acknowledged that still exists on disk is missing.  The read-only filesystem is
tests/test_storage_read_only.py; the core's own checks, tests/test_presence.py.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from .support.faulty_load import (ENV, STREAM, Load, active_segment, check_answers, check_logged,
                                 check_not_ready, log_records, remove, restart)
from .support.noloss import Acks, check
from .support.server import GatewayProcess


def test_data_directory_removed(data_dir: Path) -> None:
    with GatewayProcess(data_dir, env=ENV) as server:
        server.wait_ready()
        load = Load(server)
        load.until("202s", lambda a: sum(x.status == 202 for x in a) >= 100)
        remove(data_dir)
        load.until("refusal of every client", lambda a: all(
            any(x.status == 503 for x in c.answers) for c in load.clients))
        time.sleep(0.5)  # the refusals go on: no 202 among them
        answers = load.finish()
        check_answers(answers, None)
        # rm -rf removes bottom up: a check during it may find the shard's or the
        # stream's directory gone first, and names that one
        lines = check_logged(server, f"{data_dir}", most=2 * 8)
        assert any(f"the data directory {data_dir} was removed" in r["detail"] for r in lines) \
            or all(" was removed while shard " in r["detail"] for r in lines), lines
        assert len({r["slot"] for r in lines}) <= 2
        check_not_ready(server, "storage refuses writes")
        assert server.stop() == 0
    # A restart starts empty: the directory is created again, and says so.
    assert not data_dir.exists()
    with restart(data_dir, ENV) as server:
        status, body, _ = server.request("POST", f"/streams/{STREAM}", b'{"after":1}',
                                         {"content-type": "application/json"})
        assert status == 202, body
        created = log_records(server, "data_directory_created")
        assert created and created[0]["path"] == str(data_dir), created
        assert server.stop() == 0


def busiest_shard(load: Load) -> int:
    """The shard most 202s named, once there were 200 (a client's connection stays with
    one worker, which owns half of the shards)."""
    load.until("202s", lambda a: sum(x.status == 202 for x in a) >= 200)
    counts: dict[int, int] = {}
    for a in load.answers():
        if a.status == 202:
            counts[a.body["shard"]] = counts.get(a.body["shard"], 0) + 1
    return max(counts, key=lambda s: counts[s])


def test_shard_directory_removed(data_dir: Path) -> None:
    with GatewayProcess(data_dir, env=ENV) as server:
        server.wait_ready()
        load = Load(server)
        victim = busiest_shard(load)
        shard_dir = data_dir / STREAM / f"shard-{victim:04d}"
        remove(shard_dir)
        load.until("its refusal", lambda a: any(x.status == 503 for x in a))
        time.sleep(0.5)
        answers = load.finish()
        check_answers(answers, {victim})
        others = sum(a.status == 202 and a.body["shard"] != victim and a.sent > time.monotonic() - 0.5
                     for a in answers)
        assert others, "the other shards stopped too"
        check_logged(server, f"the shard directory {shard_dir} was removed", most=1)
        check_not_ready(server, str(shard_dir))
        assert server.stop() == 0
    # A restart opens the shard again empty (numbered from 0: its entries are gone with
    # the directory); every other shard holds every entry it acknowledged.
    with restart(data_dir, ENV) as server:
        assert server.stop() == 0
    acks = Acks()
    for c in load.clients:
        for (stream, shard), ranges in c.acks.by_shard.items():
            if shard != victim:
                acks.by_shard.setdefault((stream, shard), []).extend(ranges)
                acks.rids |= {r.rid for r in ranges}
                acks.events += sum(r.last - r.first + 1 for r in ranges)
                acks.requests += len(ranges)
    report = check(data_dir, acks, exact=False)
    assert report.acked_events > 0
    assert report.lost == report.duplicates == 0, (report.problems, report.examples[:5])
    assert not any(shard_dir.glob("*.log"))  # nothing written there since


def test_active_segment_unlinked(data_dir: Path) -> None:
    env = {**ENV, "COMET_STORAGE_SEGMENT_BYTES": str(64 << 10),
           "COMET_STORAGE_SEGMENT_CHUNK_BYTES": str(64 << 10)}
    with GatewayProcess(data_dir, env=env) as server:
        server.wait_ready()
        load = Load(server)
        victim = busiest_shard(load)
        shard_dir = data_dir / STREAM / f"shard-{victim:04d}"
        load.until("a sealed segment in the shard", lambda a: shard_dir.exists()
                   and len(list(shard_dir.glob("*.log"))) >= 2, timeout=60)
        segment = active_segment(shard_dir)
        segment.unlink()
        load.until("its refusal", lambda a: any(x.status == 503 for x in a))
        time.sleep(0.5)
        answers = load.finish()
        check_answers(answers, {victim})
        check_logged(server, f"the active segment {segment} of shard {victim}", most=1)
        assert server.stop() == 0
    # A restart recovers the shard from the segments left: the entries of the unlinked
    # one are gone (numbering goes on after the last that survived); every entry
    # acknowledged in a sealed segment, and in every other shard, is there.
    with restart(data_dir, env) as server:
        assert server.stop() == 0
    base = int(segment.name.split(".")[0])
    acks = Acks()
    for c in load.clients:
        for (stream, shard), ranges in c.acks.by_shard.items():
            kept = [r for r in ranges if shard != victim or r.last < base]
            acks.by_shard.setdefault((stream, shard), []).extend(kept)
            acks.rids |= {r.rid for r in kept}
            acks.events += sum(r.last - r.first + 1 for r in kept)
            acks.requests += len(kept)
    assert acks.by_shard[(STREAM, victim)], "nothing acknowledged in the sealed segments"
    report = check(data_dir, acks, exact=False)
    assert report.lost == report.duplicates == 0, (report.problems, report.examples[:5])
