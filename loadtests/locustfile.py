"""Locust scenarios for ``POST /streams/{name}``, run by ``loadtest.py`` in ``.venv-locust``.
Each event names its request and index; with ``COMET_LT_RECORD_DIR`` set, each process
appends a line per answer to ``acks-<pid>.ndjson`` and the master writes ``verdict.json``."""

from __future__ import annotations

import gzip
import itertools
import json
import logging
import os
import random
import time
from typing import Any, TextIO

from locust import FastHttpUser, constant_throughput, events
from locust.runners import WorkerRunner

log = logging.getLogger("comet.locust")

LEVELS = ("debug", "info", "info", "info", "warn", "error")
SERVICES = ("checkout", "search", "cart", "auth", "payments", "catalog")


class Recorder:
    """One line per answer into ``acks-<pid>.ndjson``, opened by the process that writes
    (``--processes`` forks get files of their own)."""

    def __init__(self) -> None:
        self.directory = os.environ.get("COMET_LT_RECORD_DIR") or None
        self.file: TextIO | None = None
        self.pid = 0

    def write(self, record: dict[str, Any]) -> None:
        if self.directory is not None and (self.file is None or self.pid != os.getpid()):
            self.pid = os.getpid()
            os.makedirs(self.directory, exist_ok=True)
            self.file = open(os.path.join(self.directory, f"acks-{self.pid}.ndjson"), "a",
                             encoding="utf-8", buffering=1 << 20)
        if self.file is not None:
            self.file.write(json.dumps(record, separators=(",", ":")) + "\n")

    def close(self, flush_only: bool = False) -> None:
        if self.file is not None and self.pid == os.getpid():
            self.file.flush()
            if not flush_only:
                self.file.close()
                self.file = None


RECORDER = Recorder()
_request_ids = itertools.count()


def new_request_id() -> str:
    """Unique within a run: the process id and a counter (hex)."""
    return f"{os.getpid():x}.{next(_request_ids):x}"


def events_ndjson(rid: str, count: int) -> bytes:
    """``count`` events of ~150 bytes, one per line, each naming its request and index."""
    now = int(time.time() * 1000)
    rnd = random.random
    lines = [
        f'{{"r":"{rid}","i":{i},"ts":{now},"level":"{LEVELS[int(rnd() * 6)]}",'
        f'"svc":"{SERVICES[int(rnd() * 6)]}","latency_ms":{rnd() * 250:.2f},'
        f'"msg":"request {int(rnd() * 1e9)} served","user":{int(rnd() * 1e6)}}}'
        for i in range(count)
    ]
    return ("\n".join(lines) + "\n").encode()


class CometUser(FastHttpUser):
    """Posts numbered events and records what every answer said."""

    abstract = True
    network_timeout = 30.0
    connection_timeout = 10.0
    _pace: Any = None

    def on_start(self) -> None:
        options = self.environment.parsed_options
        self.stream = getattr(options, "stream", None) or "loadtest"
        self.keys = max(1, int(getattr(options, "keys", None) or 10_000))
        self.path = f"/streams/{self.stream}"
        rps = float(getattr(options, "user_rps", None) or 0)
        self._pace = constant_throughput(rps) if rps > 0 else None

    def wait_time(self) -> float:
        """No pause between requests unless --user-rps paces each user."""
        return float(self._pace(self)) if self._pace is not None else 0.0

    def post(self, name: str, count: int, *, key: str | None = None, key_header: bool = False,
             gzipped: bool = False) -> None:
        """``count`` events (1: a JSON object, else NDJSON), optionally keyed or gzipped."""
        rid = new_request_id()
        body = events_ndjson(rid, count)
        headers = {"content-type": "application/json" if count == 1 else "application/x-ndjson"}
        if count == 1:
            body = body.rstrip(b"\n")
        if gzipped:
            body, headers["content-encoding"] = gzip.compress(body, compresslevel=1), "gzip"
        if key is not None and key_header:
            headers["x-comet-key"] = key
        path = self.path + (f"?key={key}" if key is not None and not key_header else "")
        with self.client.post(path, data=body, headers=headers, name=name, catch_response=True) as resp:
            status = resp.status_code or 0
            if status != 202:
                RECORDER.write({"r": rid, "s": self.stream, "n": count, "st": status})
                detail = (resp.text or "")[:200] if status else repr(getattr(resp, "error", None))[:200]
                resp.failure(f"HTTP {status}: {detail}")
                return
            try:
                ack = json.loads(resp.content)
                shard, first, last, got = (int(ack[k]) for k in ("shard", "first", "last", "count"))
            except (ValueError, KeyError, TypeError):
                # The request may be stored, but where is unknown: an unknown outcome.
                RECORDER.write({"r": rid, "s": self.stream, "n": count, "st": 0})
                resp.failure(f"202 with an unreadable body: {(resp.text or '')[:200]!r}")
                return
            RECORDER.write({"r": rid, "s": self.stream, "sh": shard, "f": first, "l": last,
                            "n": got, "k": key})
            if got != count or last - first + 1 != count or ack.get("stream") != self.stream:
                resp.failure(f"202 does not match the request ({count} events to {self.stream}): {ack}")
            else:
                resp.success()

    def single_event(self) -> None:
        self.post("single", 1)

    def ndjson_batch(self) -> None:
        self.post("batch100", 100)

    def keyed_batch(self) -> None:  # the key half of the time as ?key=, half as X-Comet-Key
        self.post("keyed10", 10, key=f"device-{random.randrange(self.keys)}",
                  key_header=random.random() < 0.5)

    def gzip_batch(self) -> None:
        self.post("gzip100", 100, gzipped=True)


class SingleEventUser(CometUser):
    tasks = [CometUser.single_event]


class BatchUser(CometUser):
    tasks = [CometUser.ndjson_batch]


class KeyedUser(CometUser):
    tasks = [CometUser.keyed_batch]


class GzipBatchUser(CometUser):
    tasks = [CometUser.gzip_batch]


class MixUser(CometUser):
    tasks = {CometUser.single_event: 4, CometUser.ndjson_batch: 2, CometUser.keyed_batch: 2,
             CometUser.gzip_batch: 1}


@events.init_command_line_parser.add_listener
def add_options(parser: Any) -> None:
    parser.add_argument("--max-fail-ratio", type=float, env_var="COMET_LT_MAX_FAIL_RATIO",
                        default=0.01, help="Exit 1 when failed/requests is above this (default 0.01).")
    parser.add_argument("--max-p95-ms", type=float, env_var="COMET_LT_MAX_P95_MS", default=1000.0,
                        help="Exit 1 when the 95th percentile response time is above this (default 1000).")
    parser.add_argument("--stream", env_var="COMET_LT_STREAM", default="loadtest",
                        help="Stream to post to (default loadtest).")
    parser.add_argument("--user-rps", type=float, env_var="COMET_LT_USER_RPS", default=0.0,
                        help="Requests per second per user (default 0: no pause between requests).")
    parser.add_argument("--keys", type=int, env_var="COMET_LT_KEYS", default=10_000,
                        help="Distinct partition keys of KeyedUser (default 10000).")


@events.test_stop.add_listener
def flush_records(environment: Any, **_: Any) -> None:
    RECORDER.close(flush_only=True)


@events.quitting.add_listener
def check_thresholds(environment: Any, **_: Any) -> None:
    RECORDER.close()
    if isinstance(environment.runner, WorkerRunner):
        return  # the master judges the aggregated figures
    options = environment.parsed_options
    max_ratio = float(getattr(options, "max_fail_ratio", 0.01))
    max_p95 = float(getattr(options, "max_p95_ms", 1000.0))
    total = environment.stats.total
    ratio = total.fail_ratio
    p95 = total.get_response_time_percentile(0.95) if total.num_requests else 0
    problems = ([] if total.num_requests else ["no request was made"]) + (
        [f"failure ratio {ratio:.4f} is above {max_ratio}"] if ratio > max_ratio else []) + (
        [f"p95 {p95} ms is above {max_p95} ms"] if p95 > max_p95 else [])
    for problem in problems:
        log.error("threshold: %s", problem)
    environment.process_exit_code = 1 if problems else 0
    directory = RECORDER.directory
    if directory:
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "verdict.json"), "w", encoding="utf-8") as f:
            json.dump({"requests": total.num_requests, "failures": total.num_failures,
                       "fail_ratio": ratio, "p95_ms": p95, "max_fail_ratio": max_ratio,
                       "max_p95_ms": max_p95, "problems": problems,
                       "by_name": {**{e.name: figures(e) for e in environment.stats.entries.values()},
                                   "Aggregated": figures(total)}}, f)


def figures(e: Any) -> dict[str, Any]:
    """A locust stats entry as it is when locust quits (its CSV may miss the last second)."""
    return {"requests": e.num_requests, "failures": e.num_failures, "req_per_s": e.total_rps,
            "avg_ms": e.avg_response_time, "max_ms": e.max_response_time,
            **{f"p{p}_ms": e.get_response_time_percentile(p / 100) if e.num_requests else None
               for p in (50, 95, 99)}}
