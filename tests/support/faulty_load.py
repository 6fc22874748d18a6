"""Posters (posters.py) posting to a running gateway from threads while a test damages its files
(tests/test_storage_gone.py, tests/test_storage_read_only.py) or its processes
(``Havoc``: kill -9 of workers and HUPs of the master, tests/test_client.py): what each
client was answered, which events were acknowledged, and the checks of those answers,
the log lines and /readyz."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable

from .noloss import Acks
from .posters import Answer, Poster
from .server import SMALL, GatewayProcess, ServerProcess

STREAM = "ev"
SHARD_OF = re.compile(r"shard (\d+) of stream|/shard-(\d+)\b")  # its number, or its directory
# Syncs (and so the checks) every 100 ms: the clients see the refusal soon.
ENV = {**SMALL, "COMET_STORAGE_FSYNC_INTERVAL_MS": "100"}


class Load:
    """``n`` posters in threads; ``until`` waits (bounded) for a condition on their answers."""

    def __init__(self, server: GatewayProcess, n: int = 3) -> None:
        self.clients = [Poster(server, f"c{k}", stream=STREAM) for k in range(n)]
        self.threads = [c.start() for c in self.clients]

    def answers(self) -> list[Answer]:
        return [a for c in self.clients for a in list(c.answers)]

    def until(self, what: str, cond: Callable[[list[Answer]], bool], timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not cond(self.answers()):
            assert time.monotonic() < deadline, f"no {what} within {timeout} s: " \
                f"{statuses(self.answers())}"
            time.sleep(0.02)

    def finish(self) -> list[Answer]:
        for c in self.clients:
            c.stop.set()
        for t in self.threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in self.threads)
        return self.answers()


class Havoc:
    """A thread that SIGKILLs a worker of ``server`` (chosen at random) every ``every_s``
    seconds and HUPs the master instead every ``hup_every``-th time, until ``stop``."""

    def __init__(self, server: GatewayProcess, *, every_s: float = 1.0, hup_every: int = 4,
                 seed: int = 0) -> None:
        self.server, self.every_s, self.hup_every = server, every_s, hup_every
        self.rng = random.Random(seed)
        self.killed: list[int] = []
        self.hups = 0
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        tick = 0
        while not self._stop.wait(self.every_s):
            tick += 1
            if tick % self.hup_every == 0:
                self.server.proc.send_signal(signal.SIGHUP)
                self.hups += 1
                continue
            workers = self.server.worker_pids()
            if workers:  # none for a moment while the master replaces them
                victim = self.rng.choice(workers)
                try:
                    os.kill(victim, signal.SIGKILL)
                    self.killed.append(victim)
                except ProcessLookupError:
                    pass

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive()


def statuses(answers: list[Answer]) -> dict[tuple[int, str], int]:
    out: dict[tuple[int, str], int] = {}
    for a in answers:
        key = (a.status, str(a.body.get("error", "")))
        out[key] = out.get(key, 0) + 1
    return out


def refusal_shard(a: Answer) -> int:
    m = SHARD_OF.search(str(a.body.get("detail", "")))
    assert m, f"a refusal that names no shard: {a.body}"
    return int(m.group(1) or m.group(2))


def check_answers(answers: list[Answer], refused_shards: set[int] | None,
                  codes: tuple[str, ...] = ("storage_gone",)) -> dict[int, float]:
    """Only 202 and 503 of ``codes`` were answered, every refusal
    names its shard (one of ``refused_shards`` when given), and no request sent after a
    refusal of its shard reached a client was acknowledged.  Returns, per refused shard,
    when its first refusal came."""
    assert {s for s, _ in statuses(answers)} <= {202, 503}, statuses(answers)
    refusals = [a for a in answers if a.status == 503]
    assert refusals and all(a.body.get("error") in codes for a in refusals), \
        statuses(answers)
    first: dict[int, float] = {}
    for a in refusals:
        shard = refusal_shard(a)
        first[shard] = min(first.get(shard, a.received), a.received)
    if refused_shards is not None:
        assert set(first) <= refused_shards, (first, refused_shards)
    late = [a for a in answers if a.status == 202 and a.body["shard"] in first
            and a.sent > first[a.body["shard"]]]
    assert not late, f"{len(late)} acknowledged after their shard's refusal, e.g. {late[:3]}"
    return first


def acks_before(clients: list[Poster], cutoff: float) -> Acks:
    """The 202s that reached their client before ``cutoff`` (monotonic)."""
    acks = Acks()
    for c in clients:
        for a in list(c.answers):
            if a.status == 202 and a.received < cutoff:
                acks.acknowledged(STREAM, a.body["shard"], a.body["first"], a.body["count"],
                                  a.rid, None, a.base)
    return acks


def log_records(server: ServerProcess, event: str) -> list[dict[str, Any]]:
    out = []
    for line in server.log_path.read_bytes().splitlines():
        if line.startswith(b"{") and f'"event":"{event}"'.encode() in line:
            out.append(json.loads(line))
    return out


def check_logged(server: GatewayProcess, names: str, most: int) -> list[dict[str, Any]]:
    """At least one and at most ``most`` "error_answer" lines of storage_gone, each naming
    ``names`` in its detail (not one per request)."""
    lines = [r for r in log_records(server, "error_answer") if r["error"] == "storage_gone"]
    assert 1 <= len(lines) <= most, lines
    assert all(names in r["detail"] and r["status"] == 503 for r in lines), lines
    return lines


def check_not_ready(server: GatewayProcess, says: str) -> None:
    """The /readyz of the worker that refused is 503 and says why (a new connection
    lands on either worker; an idle gateway may hand many in a row to the same one)."""
    deadline = time.monotonic() + 20
    while True:
        status, body, _ = server.request("GET", "/readyz")
        problems = " ".join(json.loads(body).get("problems", []))
        if status == 503 and says in problems:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"no /readyz said {says!r}; the last: {status} {body!r}")
        time.sleep(0.05)


def active_segment(shard_dir: Path) -> Path:
    return max(shard_dir.glob("*.log"))


def remove(path: Path) -> None:
    """rm -rf, done again while the gateway creates files in it meanwhile."""
    deadline = time.monotonic() + 10
    while path.exists():
        shutil.rmtree(path, ignore_errors=True)
        assert time.monotonic() < deadline, f"{path} keeps coming back"


def restart(data_dir: Path, env: dict[str, str]) -> GatewayProcess:
    server = GatewayProcess(data_dir, env=env)
    server.wait_ready()
    return server
