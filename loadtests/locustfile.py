"""Locust scenarios for the gateway's ingest path (``POST /streams/{name}``).

Runs in its own virtualenv (``make locust-venv`` -> ``.venv-locust``: locust
monkey-patches the standard library with gevent, which the project's venv must
not see).  ``loadtests/loadtest.py`` starts a gateway, runs this file headless
and proves afterwards that nothing acknowledged was lost or stored twice::

    .venv-locust/bin/locust -f loadtests/locustfile.py --headless -H http://127.0.0.1:8080 \\
        -u 16 -r 16 -t 60s --stop-timeout 30 --only-summary [UserClass ...]

User classes (all of them when none is named, one user class per user):

* ``SingleEventUser``: one JSON event per request (``application/json``);
* ``BatchUser``: 100 events per request (``application/x-ndjson``);
* ``KeyedUser``: 10-event NDJSON batches with a partition key drawn from
  ``--keys`` keys (half of them as ``?key=``, half as ``X-Comet-Key``);
* ``GzipBatchUser``: 100-event NDJSON batches, ``Content-Encoding: gzip``;
* ``MixUser``: all of the above in one user, weighted 4:2:2:1.

Every answer but 202 is a failure, as is a 202 whose body does not match the
request (count, entry range, stream).  Every event carries its request's id
and its index in the request (``{"r": "<request id>", "i": k, ...}``).  When
``COMET_LT_RECORD_DIR`` is set, each locust process appends one line per
answer to ``$COMET_LT_RECORD_DIR/acks-<pid>.ndjson``:

* a 202: ``{"r", "s" (stream), "sh" (shard), "f" (first), "l" (last), "n" (count), "k" (key)}``;
* anything else: ``{"r", "s", "n", "st"}`` with ``st`` the status, 0 when no answer came
  (connection error, timeout): the only case where the events may or may not be stored.

The files are flushed when the test stops and when locust quits.  With
``--csv PREFIX``, ``PREFIX_final_stats.csv`` gets the statistics as they are
when locust quits (its own ``PREFIX_stats.csv`` is rewritten every second and
may miss the last second and the requests finished during ``--stop-timeout``).

Pacing: none by default (each user posts as fast as it gets answers);
``--user-rps`` (``COMET_LT_USER_RPS``) paces every user at that many requests
per second.

Thresholds (command line, or environment): ``--max-fail-ratio``
(``COMET_LT_MAX_FAIL_RATIO``, default 0.01) and ``--max-p95-ms``
(``COMET_LT_MAX_P95_MS``, default 1000).  When locust quits, the exit code is
1 if either is passed (or no request was made), else 0, and
``$COMET_LT_RECORD_DIR/verdict.json`` says why.
"""

from __future__ import annotations

import csv
import gzip
import itertools
import json
import logging
import os
import random
import time
from typing import Any, TextIO

from locust import FastHttpUser, constant_throughput, events, task
from locust.runners import WorkerRunner
from locust.stats import PERCENTILES_TO_REPORT, StatsCSV

log = logging.getLogger("comet.locust")

LEVELS = ("debug", "info", "info", "info", "warn", "error")
SERVICES = ("checkout", "search", "cart", "auth", "payments", "catalog")


class Recorder:
    """One line per answer into ``acks-<pid>.ndjson`` (opened in the process
    that writes, so that ``--processes`` forks get files of their own)."""

    def __init__(self) -> None:
        self.directory = os.environ.get("COMET_LT_RECORD_DIR") or None
        self.file: TextIO | None = None
        self.pid = 0

    def _out(self) -> TextIO | None:
        if self.directory is None:
            return None
        if self.file is None or self.pid != os.getpid():
            self.pid = os.getpid()
            os.makedirs(self.directory, exist_ok=True)
            self.file = open(os.path.join(self.directory, f"acks-{self.pid}.ndjson"), "a",
                             encoding="utf-8", buffering=1 << 20)
        return self.file

    def write(self, record: dict[str, Any]) -> None:
        out = self._out()
        if out is not None:
            out.write(json.dumps(record, separators=(",", ":")) + "\n")

    def flush(self) -> None:
        if self.file is not None and self.pid == os.getpid():
            self.file.flush()

    def close(self) -> None:
        if self.file is not None and self.pid == os.getpid():
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
        """None between requests (as fast as possible), unless --user-rps paces each user."""
        return float(self._pace(self)) if self._pace is not None else 0.0

    def post(self, name: str, body: bytes, count: int, rid: str, *, path: str | None = None,
             headers: dict[str, str] | None = None, key: str | None = None) -> None:
        with self.client.post(path or self.path, data=body, headers=headers, name=name,
                              catch_response=True) as resp:
            status = resp.status_code or 0
            if status != 202:
                RECORDER.write({"r": rid, "s": self.stream, "n": count, "st": status})
                detail = (resp.text or "")[:200] if status else repr(getattr(resp, "error", None))[:200]
                resp.failure(f"HTTP {status}: {detail}")
                return
            try:
                ack = json.loads(resp.content)
                shard, first, last, got = int(ack["shard"]), int(ack["first"]), int(ack["last"]), int(ack["count"])
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

    # ---- the scenarios ----------------------------------------------------------------

    def single_event(self) -> None:
        rid = new_request_id()
        self.post("single", events_ndjson(rid, 1).rstrip(b"\n"), 1, rid,
                  headers={"content-type": "application/json"})

    def ndjson_batch(self) -> None:
        rid = new_request_id()
        self.post("batch100", events_ndjson(rid, 100), 100, rid,
                  headers={"content-type": "application/x-ndjson"})

    def keyed_batch(self) -> None:
        rid = new_request_id()
        key = f"device-{random.randrange(self.keys)}"
        body = events_ndjson(rid, 10)
        if random.random() < 0.5:
            self.post("keyed10", body, 10, rid, path=f"{self.path}?key={key}", key=key,
                      headers={"content-type": "application/x-ndjson"})
        else:
            self.post("keyed10", body, 10, rid, key=key,
                      headers={"content-type": "application/x-ndjson", "x-comet-key": key})

    def gzip_batch(self) -> None:
        rid = new_request_id()
        body = gzip.compress(events_ndjson(rid, 100), compresslevel=1)
        self.post("gzip100", body, 100, rid,
                  headers={"content-type": "application/x-ndjson", "content-encoding": "gzip"})


class SingleEventUser(CometUser):
    @task
    def single(self) -> None:
        self.single_event()


class BatchUser(CometUser):
    @task
    def batch(self) -> None:
        self.ndjson_batch()


class KeyedUser(CometUser):
    @task
    def keyed(self) -> None:
        self.keyed_batch()


class GzipBatchUser(CometUser):
    @task
    def gzipped(self) -> None:
        self.gzip_batch()


class MixUser(CometUser):
    @task(4)
    def single(self) -> None:
        self.single_event()

    @task(2)
    def batch(self) -> None:
        self.ndjson_batch()

    @task(2)
    def keyed(self) -> None:
        self.keyed_batch()

    @task(1)
    def gzipped(self) -> None:
        self.gzip_batch()


# ---- options, records and thresholds ------------------------------------------------------


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
    RECORDER.flush()


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
    problems = []
    if total.num_requests == 0:
        problems.append("no request was made")
    if ratio > max_ratio:
        problems.append(f"failure ratio {ratio:.4f} is above {max_ratio}")
    if p95 > max_p95:
        problems.append(f"p95 {p95} ms is above {max_p95} ms")
    for problem in problems:
        log.error("threshold: %s", problem)
    environment.process_exit_code = 1 if problems else 0
    prefix = getattr(options, "csv_prefix", None)
    if prefix:  # locust's own <prefix>_stats.csv is written every second, so may miss the end
        with open(f"{prefix}_final_stats.csv", "w", newline="", encoding="utf-8") as f:
            StatsCSV(environment, PERCENTILES_TO_REPORT).requests_csv(csv.writer(f))
    directory = RECORDER.directory
    if directory:
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "verdict.json"), "w", encoding="utf-8") as f:
            json.dump({"requests": total.num_requests, "failures": total.num_failures,
                       "fail_ratio": ratio, "p95_ms": p95, "max_fail_ratio": max_ratio,
                       "max_p95_ms": max_p95, "problems": problems}, f)
