"""The gateway as it runs: `comet serve` with 2 gunicorn workers on 127.0.0.1,
real clients, kill -9, HUP and TERM (SPEC 4)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from storage_c import Config, Log

from .support.noloss import check_stored_once
from .support.posters import Poster
from .support.server import SMALL, GatewayProcess


def test_two_workers_share_the_work(data_dir: Path) -> None:
    with GatewayProcess(data_dir, env=SMALL) as server:
        server.wait_ready()
        assert server.slots_all_held()
        # a new connection per request: each is accepted by whichever worker is free (kept-alive
        # connections could all land on one worker when the machine is busy)
        unkeyed = [Poster(server, f"u{i}", keep_alive=False) for i in range(4)]
        keyed = [Poster(server, "device-42", keyed=True)]
        threads = [p.start(limit=60) for p in unkeyed + keyed]
        for t in threads:
            t.join(timeout=120)
        assert all(p.statuses == {202: 60} for p in unkeyed + keyed)
        acked = check_stored_once(data_dir, unkeyed + keyed)
        assert acked == 5 * 60 * 5
        shards = {shard for p in unkeyed for shard, _, _, _ in p.acked}
        assert {s % 2 for s in shards} == {0, 1}, "unkeyed load reached one worker's shards only"
        keyed_shards = {shard for shard, _, _, _ in keyed[0].acked}
        assert len(keyed_shards) == 1
        [shard] = keyed_shards
        with Log(data_dir, Config(background_flush=False)) as log:
            order = [orjson.loads(p)["i"] for b in log.iter_entries("ev", shard) for p in b.payloads
                     if orjson.loads(p)["c"] == "device-42"]
        assert order == list(range(300))  # one key, one shard, in order
        assert server.stop() == 0


def test_metrics_totals_whichever_worker_answers(data_dir: Path) -> None:
    with GatewayProcess(data_dir, env=SMALL) as server:
        server.wait_ready()
        posters = [Poster(server, f"m{i}", batch=3) for i in range(3)]
        for t in [p.start(limit=40) for p in posters]:
            t.join(timeout=120)
        acked = check_stored_once(data_dir, posters)
        seen_slots = set()
        for _ in range(12):  # new connections land on either worker
            status, body, _ = server.request("GET", "/metrics")
            assert status == 200
            families = {f.name: f for f in text_string_to_metric_families(body.decode())}
            stored = sum(s.value for s in families["comet_stream_appended_entries"].samples)
            accepted = sum(s.value for s in families["comet_http_events_accepted"].samples)
            assert stored == accepted == acked == 3 * 40 * 3
            seen_slots |= {s.labels["slot"] for s in families["comet_http_requests"].samples}
        assert seen_slots == {"0", "1"}


@pytest.mark.slow
def test_kill_9_of_a_worker_under_load(data_dir: Path) -> None:
    with GatewayProcess(data_dir, env=SMALL) as server:
        server.wait_ready()
        posters = [Poster(server, f"k{i}", keyed=i % 2 == 0) for i in range(4)]
        threads = [p.start() for p in posters]
        time.sleep(1.0)
        victim = server.worker_pids()[0]
        import os

        os.kill(victim, signal.SIGKILL)
        time.sleep(1.5)
        for p in posters:
            p.stop.set()
        for t in threads:
            t.join(timeout=60)
        deadline = time.monotonic() + 30
        while victim in server.worker_pids() or len(server.worker_pids()) < 2:
            assert time.monotonic() < deadline, "gunicorn did not replace the worker"
            time.sleep(0.1)
        server.wait_ready()  # the replacement reclaimed the freed slot
        assert server.slots_all_held()
        for p in posters:
            assert set(p.statuses) <= {202, 503}, p.statuses
        acked = check_stored_once(data_dir, posters)
        assert acked > 0
        assert server.stop() == 0


@pytest.mark.slow
def test_hup_reload_and_term_under_load(data_dir: Path) -> None:
    with GatewayProcess(data_dir, env=SMALL) as server:
        server.wait_ready()
        posters = [Poster(server, f"h{i}") for i in range(3)]
        threads = [p.start() for p in posters]
        time.sleep(0.8)
        old = set(server.worker_pids())
        server.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 60
        while set(server.worker_pids()) & old or len(server.worker_pids()) < 2:
            assert time.monotonic() < deadline, "the reload did not replace the workers"
            time.sleep(0.1)
        server.wait_ready()
        time.sleep(0.8)
        assert server.stop(signal.SIGTERM) == 0  # TERM while the clients keep posting
        for p in posters:
            p.stop.set()
        for t in threads:
            t.join(timeout=60)
        for p in posters:
            assert set(p.statuses) <= {202, 503}, p.statuses  # no 5xx but 503
        acked = check_stored_once(data_dir, posters)
        assert acked > 0 and sum(p.statuses.get(202, 0) for p in posters) > 10


def test_workers_stop_when_the_master_is_killed(data_dir: Path) -> None:
    """A master killed with SIGKILL must not leave workers holding the port and
    the process slots: they get SIGTERM from the kernel and drain."""
    import os

    with GatewayProcess(data_dir, env=SMALL) as server:
        server.wait_ready()
        workers = server.worker_pids()
        assert len(workers) == 2
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait()

        def alive(pid: int) -> bool:
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except FileNotFoundError:
                return False
            return stat.rsplit(")", 1)[1].split()[0] != "Z"

        deadline = time.monotonic() + 30
        while any(alive(p) for p in workers):
            assert time.monotonic() < deadline, "workers outlived their master"
            time.sleep(0.1)
        with Log(data_dir, Config(process_count=2, background_flush=False)) as log:
            assert log.claim_slot() in (0, 1)  # the slots came back
