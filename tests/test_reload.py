"""20 HUP reloads and a final TERM of a real `comet serve` under steady load:
every request a client sent gets an HTTP status (202, or 503 with
Retry-After), every 202'd event is stored exactly once where its answer said,
and no event without a 202 is stored.

The clients are of the two kinds that meet a closing server differently:
a new connection per request (as curl does: the connection may be accepted
by a worker that starts draining before the request's bytes arrive) and
persistent keep-alive connections (http.client: a request may be on its way
as the worker decides to close the idle connection)."""

from __future__ import annotations

import http.client
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest

from .support.noloss import Acks, check_stored_once
from .support.server import SMALL, GatewayProcess

RELOADS = 20


@dataclass
class Client:
    """Posts numbered events from a thread and records what became of each
    request: its status, or that the connection was refused (nothing sent),
    or that it was sent and got no status (a failure of the gateway)."""

    server: GatewayProcess
    name: str
    keep_alive: bool
    batch: int = 2
    acked: list[tuple[int, int, int, list[dict[str, Any]]]] = field(default_factory=list)
    acks: Acks = field(default_factory=Acks)
    statuses: dict[int, int] = field(default_factory=dict)
    unanswered: list[tuple[str, list[dict[str, Any]]]] = field(default_factory=list)
    not_sent: list[list[dict[str, Any]]] = field(default_factory=list)
    missing_retry_after: int = 0
    other: list[bytes] = field(default_factory=list)  # bodies of statuses other than 202/503
    phase: list[str] = field(default_factory=lambda: ["start"])  # shared: where the test is
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        conn: http.client.HTTPConnection | None = None
        i = 0
        while not self.stop.is_set():
            rid = f"{self.name}.{i}"
            events: list[dict[str, Any]] = [{"c": self.name, "i": i * self.batch + k, "r": rid}
                                            for k in range(self.batch)]
            body = b"\n".join(orjson.dumps(e) for e in events)
            i += 1
            if conn is None:
                conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=30)
                try:
                    conn.connect()
                except OSError:  # refused: the server is gone, nothing was sent
                    self.not_sent.append(events)
                    conn = None
                    time.sleep(0.01)
                    continue
            try:
                conn.request("POST", "/streams/ev", body=body,
                             headers={"content-type": "application/x-ndjson"})
                r = conn.getresponse()
                data = r.read()
            except (OSError, http.client.HTTPException) as exc:
                self.unanswered.append((f"{type(exc).__name__}: {exc} ({self.phase[0]})", events))
                self.acks.refused(rid, 0)
                conn.close()
                conn = None
                continue
            self.statuses[r.status] = self.statuses.get(r.status, 0) + 1
            if r.status == 202:
                res = orjson.loads(data)
                self.acked.append((res["shard"], res["first"], res["count"], events))
                self.acks.acknowledged("ev", res["shard"], res["first"], res["count"], rid,
                                       base=events[0]["i"])
            else:
                self.acks.refused(rid, r.status)
                if r.status == 503 and not r.getheader("retry-after"):
                    self.missing_retry_after += 1
                if r.status != 503:
                    self.other.append(data[:300])
                time.sleep(0.005)
            if not self.keep_alive or r.getheader("connection", "").lower() == "close":
                conn.close()
                conn = None
        if conn is not None:
            conn.close()

    def start(self) -> threading.Thread:
        t = threading.Thread(target=self.run, daemon=True)
        t.start()
        return t


def acked_total(clients: list[Client]) -> int:
    return sum(len(c.acked) for c in clients)


def wait_for(what: str, check: Any, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.mark.slow
def test_reloads_and_stop_under_load_answer_every_request(data_dir: Path) -> None:
    t0 = time.monotonic()
    with GatewayProcess(data_dir, env=SMALL) as server:
        server.wait_ready()
        phase = ["start"]
        clients = [Client(server, "fresh-0", keep_alive=False, phase=phase),
                   Client(server, "keep-0", keep_alive=True, phase=phase),
                   Client(server, "keep-1", keep_alive=True, phase=phase)]
        threads = [c.start() for c in clients]
        try:
            for n in range(RELOADS):
                phase[0] = f"reload {n + 1}"
                old = set(server.worker_pids())
                server.proc.send_signal(signal.SIGHUP)
                wait_for("the reload to replace the workers",
                         lambda: not set(server.worker_pids()) & old and len(server.worker_pids()) == 2)
                server.wait_ready()  # every new worker holds its slot and answers
                # every client has been served by the new workers before the next reload
                before = [len(c.acked) for c in clients]
                wait_for("load on the new workers",
                         lambda: all(len(c.acked) > b for c, b in zip(clients, before)))
            so_far = acked_total(clients)
            wait_for("load before the stop", lambda: acked_total(clients) >= so_far + 5)
            phase[0] = "stop"
            assert server.stop(signal.SIGTERM) == 0  # the clients keep posting through it
        finally:
            for c in clients:
                c.stop.set()
            for t in threads:
                t.join(timeout=30)

    problems = [f"{c.name}: {why} for {events[0]}" for c in clients for why, events in c.unanswered]
    assert not problems, f"{len(problems)} requests sent without an HTTP status: {problems[:10]}"
    for c in clients:
        assert set(c.statuses) <= {202, 503}, (c.name, c.statuses, c.other)
        assert c.missing_retry_after == 0, f"{c.name}: a 503 without Retry-After"
        assert c.statuses.get(202, 0) > RELOADS, (c.name, c.statuses)

    check_stored_once(data_dir, clients, exact=True)
    assert time.monotonic() - t0 < 120
