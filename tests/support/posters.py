"""The one load generator of the tests: ``Poster`` threads post numbered NDJSON events
to a running gateway and keep what became of every request, for the no-loss check
(noloss.py) and for the tests' own checks of the answers (statuses, Retry-After, which
shard refused when, the TLS certificate each new connection saw).

Request ``n`` of poster ``name`` is ``"{name}.{n}"``; its events are
``{"c": name, "i": <the poster's event number>, "r": <the request>}``, as noloss.py
reads them back."""

from __future__ import annotations

import http.client
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import orjson

from .noloss import Acks
from .server import ServerProcess


@dataclass
class Answer:
    """One request and what became of it."""

    rid: str
    base: int         # the number of its first event
    sent: float       # monotonic, before the request was written
    received: float   # monotonic, after its answer was read (or the request failed)
    status: int       # 0: no answer
    body: dict[str, Any]   # the answer's JSON; {} for none or one that is not JSON
    retry_after: str | None = None


@dataclass
class Poster:
    """Posts numbered events from a thread until ``stop`` (or ``limit`` requests), on
    one keep-alive connection or (not ``keep_alive``) a new connection per request, over
    TLS when the server has it.  ``acked`` holds (shard, first, count, events) of every
    202, ``acks`` every answer for the no-loss check, ``answers`` every request.  A
    request whose connection was refused was ``not_sent``; one sent without getting an
    HTTP status is ``unanswered``, with why and the test's ``phase`` at the time.  After
    an error status a poster waits 5 ms, after no answer 10 ms: retries, not a tight loop."""

    server: ServerProcess
    name: str
    stream: str = "ev"
    keyed: bool = False
    keep_alive: bool = True
    batch: int = 5
    phase: list[str] = field(default_factory=lambda: [""])  # shared by a test's posters
    answers: list[Answer] = field(default_factory=list)
    acked: list[tuple[int, int, int, list[dict[str, Any]]]] = field(default_factory=list)
    acks: Acks = field(default_factory=Acks)
    statuses: dict[int, int] = field(default_factory=dict)
    unanswered: list[tuple[str, list[dict[str, Any]]]] = field(default_factory=list)
    not_sent: list[list[dict[str, Any]]] = field(default_factory=list)
    others: list[bytes] = field(default_factory=list)  # bodies of statuses but 202 and 503
    sent: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    @property
    def errors(self) -> int:
        """Requests without an HTTP status (a killed worker, a closed connection)."""
        return len(self.unanswered) + len(self.not_sent)

    @property
    def failures(self) -> list[str]:
        return ([f"{events[0]['r']}: {why}" for why, events in self.unanswered]
                + [f"{events[0]['r']}: not sent (no connection)" for events in self.not_sent])

    @property
    def missing_retry_after(self) -> int:
        return sum(1 for a in list(self.answers) if a.status == 503 and not a.retry_after)

    def events(self, request: int) -> list[dict[str, Any]]:
        rid = f"{self.name}.{request}"
        return [{"c": self.name, "i": request * self.batch + k, "r": rid} for k in range(self.batch)]

    def connected(self, conn: http.client.HTTPConnection) -> None:
        """Called with each new connection, once connected (a TLS one after its handshake)."""

    def run(self, limit: int | None = None) -> None:
        conn: http.client.HTTPConnection | None = None
        key = self.name if self.keyed else None
        path = f"/streams/{self.stream}" + (f"?key={key}" if key else "")
        while not self.stop.is_set() and (limit is None or self.sent < limit):
            events = self.events(self.sent)
            rid, base = events[0]["r"], events[0]["i"]
            self.sent += 1
            sent = time.monotonic()
            if conn is None:
                conn = self.server.connection(timeout=30)
                try:
                    conn.connect()
                except OSError:  # refused, or a failed TLS handshake: nothing was sent
                    self._no_answer(rid, base, sent, events, None)
                    conn = None
                    continue
                self.connected(conn)
            try:
                conn.request("POST", path, body=b"\n".join(orjson.dumps(e) for e in events),
                             headers={"content-type": "application/x-ndjson"})
                r = conn.getresponse()
                data = r.read()
            except (OSError, http.client.HTTPException) as exc:
                self._no_answer(rid, base, sent, events, f"{type(exc).__name__}: {exc}")
                conn.close()
                conn = None
                continue
            body = parsed(data)
            self.answers.append(Answer(rid, base, sent, time.monotonic(), r.status, body,
                                       r.getheader("retry-after")))
            self.statuses[r.status] = self.statuses.get(r.status, 0) + 1
            if r.status == 202:
                self.acked.append((body["shard"], body["first"], body["count"], events))
                self.acks.acknowledged(self.stream, body["shard"], body["first"], body["count"],
                                       rid, key, base)
            else:
                self.acks.refused(rid, r.status)
                if r.status != 503:
                    self.others.append(data[:300])
                self.stop.wait(0.005)
            if not self.keep_alive or r.getheader("connection", "").lower() == "close":
                conn.close()
                conn = None
        if conn is not None:
            conn.close()

    def _no_answer(self, rid: str, base: int, sent: float, events: list[dict[str, Any]],
                   why: str | None) -> None:
        self.answers.append(Answer(rid, base, sent, time.monotonic(), 0, {}))
        self.acks.refused(rid, 0)
        if why is None:
            self.not_sent.append(events)
        else:
            self.unanswered.append((why + (f" ({self.phase[0]})" if self.phase[0] else ""), events))
        self.stop.wait(0.01)

    def start(self, limit: int | None = None) -> threading.Thread:
        t = threading.Thread(target=self.run, args=(limit,), daemon=True)
        t.start()
        return t


def parsed(data: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(data or b"{}")
    except orjson.JSONDecodeError:
        return {}
    return body if isinstance(body, dict) else {}


def wait_for(what: str, check: Callable[[], bool], timeout: float = 30,
             state: Callable[[], Any] | None = None) -> None:
    """Waits (bounded) until ``check()``; the failure says ``what`` and ``state()``."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, \
            f"timed out waiting for {what}" + (f": {state()}" if state else "")
        time.sleep(0.02)
