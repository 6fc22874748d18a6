"""A real `comet serve` for the end-to-end tests, and clients that remember
every event a 202 acknowledged."""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from storage_c import Config, Log, NoFreeSlot

COMET = Path(sys.executable).with_name("comet")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, data_dir: Path, workers: int = 2, **env: str) -> None:
        self.data_dir = data_dir
        self.workers = workers
        self.port = free_port()
        self.out = data_dir.parent / f"serve-{self.port}.log"
        environ = {**os.environ, "COMET_ACCESS_LOG": "0", "COMET_STORAGE_SHARDS": "8",
                   "COMET_STORAGE_SEGMENT_BYTES": str(1 << 20), **env}
        self.proc = subprocess.Popen(
            [str(COMET), "serve", "--data-dir", str(data_dir), "--port", str(self.port),
             "--workers", str(workers)],
            stdout=open(self.out, "wb"), stderr=subprocess.STDOUT, env=environ,
            start_new_session=True)

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict[str, str] | None = None, timeout: float = 10) -> tuple[int, bytes, dict[str, str]]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers={"connection": "close", **(headers or {})})
            r = conn.getresponse()
            return r.status, r.read(), dict(r.getheaders())
        finally:
            conn.close()

    def wait_ready(self, timeout: float = 60) -> None:
        """Until every worker answers ready (connections land on random workers)."""
        deadline = time.monotonic() + timeout
        seen: set[int] = set()
        while len(seen) < self.workers:
            assert time.monotonic() < deadline, f"workers not ready: {self.out.read_text()[-2000:]}"
            assert self.proc.poll() is None, self.out.read_text()[-3000:]
            try:
                status, body, _ = self.request("GET", "/readyz", timeout=2)
                if status == 200:
                    seen.add(orjson.loads(body)["slot"])
            except OSError:
                time.sleep(0.05)

    def worker_pids(self) -> list[int]:
        """The gunicorn workers: processes whose parent is the master."""
        pids = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == self.proc.pid:
                pids.append(int(stat.parent.name))
        return pids

    def slots_all_held(self) -> bool:
        with Log(self.data_dir, Config(process_count=self.workers, background_flush=False)) as log:
            try:
                log.claim_slot()
            except NoFreeSlot:
                return True
            return False

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=timeout)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        try:  # and whatever is left of its workers
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@dataclass
class Poster:
    """Posts numbered events from a thread; remembers what each answer said."""

    server: Server
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
                    conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=30)
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
                time.sleep(0.01)
            i += 1
            self.sent = i
        if conn is not None:
            conn.close()

    def start(self, limit: int | None = None) -> threading.Thread:
        t = threading.Thread(target=self.run, args=(limit,), daemon=True)
        t.start()
        return t


def check_stored_once(data_dir: Path, posters: list[Poster], stream: str = "ev") -> int:
    """Every acknowledged event is stored exactly once, where its 202 said;
    nothing is stored twice.  Returns the number of acknowledged events."""
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
