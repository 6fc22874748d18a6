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

import signal
import time
from pathlib import Path

import pytest

from .support.noloss import check_stored_once
from .support.posters import Poster, wait_for
from .support.server import SMALL, GatewayProcess

RELOADS = 20


def acked_total(clients: list[Poster]) -> int:
    return sum(len(c.acked) for c in clients)


@pytest.mark.slow
def test_reloads_and_stop_under_load_answer_every_request(data_dir: Path) -> None:
    t0 = time.monotonic()
    with GatewayProcess(data_dir, env=SMALL) as server:
        server.wait_ready()
        phase = ["start"]
        clients = [Poster(server, "fresh-0", keep_alive=False, batch=2, phase=phase),
                   Poster(server, "keep-0", keep_alive=True, batch=2, phase=phase),
                   Poster(server, "keep-1", keep_alive=True, batch=2, phase=phase)]
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
        assert set(c.statuses) <= {202, 503}, (c.name, c.statuses, c.others)
        assert c.missing_retry_after == 0, f"{c.name}: a 503 without Retry-After"
        assert c.statuses.get(202, 0) > RELOADS, (c.name, c.statuses)

    check_stored_once(data_dir, clients, exact=True)
    assert time.monotonic() - t0 < 120
