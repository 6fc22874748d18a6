"""The one no-loss check of the tests and the load tests.

``Poster`` is a client thread that posts numbered NDJSON events and remembers
every event a 202 acknowledged; ``check_stored_once`` proves each of them
stored exactly once, where its 202 said, and nothing stored twice.
"""

from __future__ import annotations

import http.client
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import orjson

from storage_c import Config, Log

from .server import HOST, ServerProcess


@dataclass
class Poster:
    """Posts numbered NDJSON events from a thread; remembers what each answer said:
    ``acked`` holds (shard, first, count, events) of every 202."""

    server: ServerProcess
    name: str
    stream: str = "ev"
    keyed: bool = False
    batch: int = 5
    acked: list[tuple[int, int, int, list[dict[str, Any]]]] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    errors: int = 0
    sent: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self, limit: int | None = None) -> None:
        conn: http.client.HTTPConnection | None = None
        i = 0
        while not self.stop.is_set() and (limit is None or i < limit):
            events = [{"c": self.name, "i": i * self.batch + k} for k in range(self.batch)]
            body = b"\n".join(orjson.dumps(e) for e in events)
            path = f"/streams/{self.stream}" + (f"?key={self.name}" if self.keyed else "")
            try:
                if conn is None:
                    conn = http.client.HTTPConnection(HOST, self.server.port, timeout=30)
                conn.request("POST", path, body=body, headers={"content-type": "application/x-ndjson"})
                r = conn.getresponse()
                data = r.read()
                self.statuses[r.status] = self.statuses.get(r.status, 0) + 1
                if r.status == 202:
                    res = orjson.loads(data)
                    self.acked.append((res["shard"], res["first"], res["count"], events))
                if r.getheader("connection", "").lower() == "close":
                    conn.close()
                    conn = None
            except (OSError, http.client.HTTPException):
                self.errors += 1  # killed worker, closed connection: no answer, no promise
                if conn is not None:
                    conn.close()
                conn = None
                self.stop.wait(0.01)
            i += 1
            self.sent = i
        if conn is not None:
            conn.close()

    def start(self, limit: int | None = None) -> threading.Thread:
        t = threading.Thread(target=self.run, args=(limit,), daemon=True)
        t.start()
        return t


def check_stored_once(data_dir: Path, posters: Sequence[Poster], stream: str = "ev") -> int:
    """Asserts that every acknowledged event is stored exactly once, where its 202 said,
    and that nothing is stored twice.  Returns the number of acknowledged events."""
    with Log(data_dir, Config(background_flush=False)) as log:
        shards = {s: [orjson.loads(p) for b in log.iter_entries(stream, s) for p in b.payloads]
                  for s in range(log.shard_count(stream))}
    keys = [(e["c"], e["i"]) for entries in shards.values() for e in entries]
    assert len(keys) == len(set(keys)), "an event is stored twice"
    acked = 0
    for p in posters:
        for shard, first, count, events in p.acked:
            assert shards[shard][first: first + count] == events, f"202 for {events[0]} not where it said"
            acked += count
    return acked
