"""``comet ship`` to an OTLP/HTTP endpoint (consumers/forward.py, otlp_sink.py):
exact records, delivery through outages and refusals, dead letters, what an
operator sees, TLS, and exactly once through crashes and lost answers.

The backend is ``tests/support/otlp_receiver.Backend``: it answers as each
test scripts it and keeps the first accepted body of every Idempotency-Key,
as a backend that honours the key (our gateway) does.
"""

from __future__ import annotations

import gzip
import os
import random
import signal
import subprocess
import sys
import threading
import time
from array import array
from pathlib import Path
from typing import Any, Iterator

import orjson
import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (ExportLogsServiceRequest,
                                                                    ExportLogsServiceResponse)

from comet.backoff import retry_after_s
from consumers import Consumer
from consumers.forward import ForwardConfig, Forwarder
from consumers.intents import ShardBusy
from consumers.otlp_sink import OtlpHttpSink, OtlpTarget, signal_url
from storage_c import Config, Log, decode_otlp
from storage_c.otlp import encode
from storage_c.testing import CUT_EXIT

from .support import otlp
from .support.flaky_http import Seen, Step
from .support.otlp_random import Gen
from .support.otlp_receiver import KEY, Backend, accepted, count_records, request_bytes
from .support.otlp_requests import logs_request, metrics_request, traces_request
from .support.tls import Pki

STREAMS = {"logs": "otel-logs", "traces": "otel-traces", "metrics": "otel-metrics"}
CONFIG = Config(shards=4, segment_bytes=1 << 20, fsync_interval_ms=50)
COMET = Path(sys.executable).with_name("comet")


def store(log: Log, signal: str, bodies: list[bytes], shard: int | None = 0) -> int:
    """Each request's events as one batch of the signal's stream, as the gateway stores them."""
    stream = STREAMS[signal]
    log.create_stream(stream, CONFIG.shards)
    count = 0
    for body in bodies:
        decoded = decode_otlp(signal, body, 0)
        events = decoded.events.split(b"\n")[:-1]
        if events:
            log.append_batch(stream, events, shard=shard)
            count += len(events)
    return count


def forward(data: Path, stream: str, backend: Backend, signal: str, *, plain: bytes | None = None,
            group: str = "fwd", **settings: Any) -> Any:
    config = ForwardConfig(**{"status_interval_s": 0, "max_batch_age_s": 0, **settings})
    sink = OtlpHttpSink(OtlpTarget(backend.url, signal), connections=config.concurrency)
    try:
        with Consumer(Log(data, Config.reader()), stream, group) as consumer:
            try:
                return Forwarder(consumer, sink, signal, plain_resource=plain, config=config).run(once=True)
            finally:
                consumer.log.close()
    finally:
        sink.close()


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def backend() -> Iterator[Backend]:
    with Backend() as b:
        yield b


# ---- exact records ---------------------------------------------------------------------

def as_sent(signal: str, bodies: list[bytes]) -> bytes:
    """The requests, as one request of the same groups (neighbours merged)."""
    return otlp.normalized(signal, b"".join(bodies))


def as_received(signal: str, body: bytes) -> bytes:
    """A forwarded request as it came, groups not merged."""
    return bytes(otlp._canonical(otlp.decode(signal, body)).SerializeToString(deterministic=True))


@pytest.mark.parametrize("signal", ["logs", "traces", "metrics"])
def test_records_arrive_as_the_producer_sent_them(data: Path, backend: Backend, signal: str) -> None:
    """Every field of every record, the groups of one resource and scope as
    the producer made them: the request that arrives is the requests that
    were stored, merged (requests of every shape, tests/support/otlp_random)."""
    rng = random.Random(int(os.environ.get("COMET_FUZZ_SEED", "7")))
    gen = Gen(rng)
    made = {"logs": logs_request, "traces": traces_request, "metrics": metrics_request}[signal]
    bodies = [made().SerializeToString()]
    while len(bodies) < 25:
        body = gen.request(signal)
        try:
            _, rejected = otlp.events(signal, body)
        except otlp.Refused:
            continue
        if not rejected and not otlp.has_repeated_keys(otlp.decode(signal, body)):
            bodies.append(body)
    with Log(data, CONFIG) as log:
        stored = store(log, signal, bodies)
    stats = forward(data, STREAMS[signal], backend, signal, max_batch_records=100_000,
                    max_batch_bytes=1 << 30)
    assert len(backend.stored) == 1 and stats.records == stored
    [received] = backend.stored.values()
    assert as_received(signal, received) == as_sent(signal, bodies)


def test_batches_split_records_in_log_order(data: Path, backend: Backend) -> None:
    """Small batches: each request holds consecutive entries; together, in
    key order, they are every record once."""
    body = logs_request().SerializeToString()
    with Log(data, CONFIG) as log:
        stored = store(log, "logs", [body] * 30, shard=None)
    stats = forward(data, "otel-logs", backend, "logs", max_batch_records=7, concurrency=3)
    assert stats.records == stored == backend.records("logs")
    per_shard: dict[int, list[tuple[int, int]]] = {}
    for key in backend.stored:
        m = KEY.match(key)
        assert m, key
        per_shard.setdefault(int(m["shard"]), []).append((int(m["first"]), int(m["last"])))
    for ranges in per_shard.values():
        ranges.sort()
        assert ranges[0][0] == 0
        assert all(b[0] == a[1] + 1 for a, b in zip(ranges, ranges[1:]))
        assert all(last - first < 7 for first, last in ranges)


def test_plain_events_become_log_records(data: Path, backend: Backend) -> None:
    """Events of a stream that is not OTLP: each the body of a log record,
    its time the entry's, under the resource service.name = the stream."""
    from consumers.cli import plain_resource

    events = [b'{"level":"warn","n":3,"x":2.5,"tags":["a",null],"ok":true}', b"42", b'"text"',
              b"not json at all", b"\xff\xfe raw"]
    with Log(data, CONFIG) as log:
        log.create_stream("app", 1)
        log.append_batch("app", events, shard=0)
        stamps = list(log.read("app", 0, 0, 10).timestamps)
    forward(data, "app", backend, "logs", plain=plain_resource("app"))
    [body] = backend.stored.values()
    request = ExportLogsServiceRequest.FromString(body)
    [group] = request.resource_logs
    assert [(kv.key, kv.value.string_value) for kv in group.resource.attributes] == [("service.name", "app")]
    records = group.scope_logs[0].log_records
    assert [r.time_unix_nano for r in records] == stamps
    assert [r.observed_time_unix_nano for r in records] == stamps
    types: dict[str, str] = {}
    bodies = [otlp.any_value(r.body, otlp.Path(types)) for r in records]
    assert bodies == [{"level": "warn", "n": 3, "x": 2.5, "tags": ["a", None], "ok": True}, 42,
                      "text", "not json at all", "//4gcmF3"]
    assert records[4].body.WhichOneof("value") == "bytes_value"
    assert isinstance(bodies[0]["x"], float) and isinstance(bodies[0]["n"], int)


def test_events_not_in_the_layout_go_to_dead_letters(data: Path, backend: Backend) -> None:
    good = decode_otlp("logs", logs_request().SerializeToString(), 0).events.split(b"\n")[:-1]
    bad = [b"[1,2]", b'{"time_unix_nano":"soon"}', b'{"trace_id":"xyz"}']
    with Log(data, CONFIG) as log:
        log.create_stream("otel-logs", 1)
        log.append_batch("otel-logs", good[:3] + bad + good[3:], shard=0)
    stats = forward(data, "otel-logs", backend, "logs")
    assert stats.dead_lettered == 3 and stats.records == len(good) == backend.records("logs")
    with Log(data, Config.reader()) as log:
        dlq = [orjson.loads(p) for p in log.read("otel-logs.dlq", 0, 0, 10).payloads]
        assert [d["entry"] for d in dlq] == [3, 4, 5]
        assert [d["payload"] for d in dlq] == [[1, 2], {"time_unix_nano": "soon"}, {"trace_id": "xyz"}]
        assert "not an OTLP logs event: the event is not an object" in dlq[0]["error"]
        assert "time_unix_nano has the wrong type" in dlq[1]["error"]
        assert log.groups("otel-logs", 0)[0].offset == len(good) + 3


# ---- delivery ------------------------------------------------------------------------------

def logs_in(data: Path, requests: int = 20, *, shard: int | None = 0) -> int:
    with Log(data, CONFIG) as log:
        return store(log, "logs", [logs_request().SerializeToString()] * requests, shard=shard)


def group_totals(data: Path, stream: str = "otel-logs", group: str = "fwd") -> Any:
    with Log(data, Config.reader()) as log:
        return log.stats(stream).group_lag()[group]


def test_an_outage_is_waited_out(data: Path) -> None:
    """Refused connections, 503 and 502 for a while, then a 2xx: every record
    is delivered once, and the retries are counted where an operator looks."""
    stored = logs_in(data)
    failures = [Step(reset=True)] * 3 + [Step(503, {"Retry-After": "0"}, b"down")] * 2 + \
               [Step(502, {}, b"bad gateway")]
    script = iter(failures)

    def answer(seen: Seen) -> Step:
        return next(script, accepted())

    with Backend(answer) as backend:
        stats = forward(data, "otel-logs", backend, "logs", retry_backoff_s=0.01, concurrency=1,
                        max_retries=100)
    assert stats.records == stored == backend.records("logs")
    assert stats.retries == len(failures) and stats.failing == 0 and stats.permanent_failures == 0
    totals = group_totals(data)
    assert (totals.lag, totals.delivered, totals.retries, totals.failed) == (0, stored, len(failures), 0)
    assert totals.last_delivery_ns > time.time_ns() - 60e9


def test_retry_after_is_honoured(data: Path) -> None:
    logs_in(data, 1)
    answers = iter([Step(429, {"Retry-After": "1"}, b"slow down")])
    with Backend(lambda seen: next(answers, accepted())) as backend:
        forward(data, "otel-logs", backend, "logs", retry_backoff_s=0.01)
    first, second = backend.seen
    assert second.at - first.at >= 0.95
    assert first.headers["idempotency-key"] == second.headers["idempotency-key"]
    assert retry_after_s("Wed, 21 Oct 2099 07:28:00 GMT", now=0) == 900.0
    assert retry_after_s("2", now=0) == 2.0 and retry_after_s("soon") is None and retry_after_s("-4") == 0.0


def test_a_refused_batch_goes_to_dead_letters_and_shipping_goes_on(data: Path) -> None:
    """A 400 is permanent for its batch: the records go to the stream's dead
    letters with the status and the answer; the next batches are delivered."""
    stored = logs_in(data, 4)
    refused: list[str] = []

    def answer(seen: Seen) -> Step:
        if not refused:
            refused.append(seen.headers["idempotency-key"])
            return Step(400, {"Content-Type": "application/json"}, b'{"code":3,"message":"bad things"}')
        return accepted()

    with Backend(answer) as backend:
        stats = forward(data, "otel-logs", backend, "logs", max_batch_records=11)
    assert stats.permanent_failures == 1 and stats.dead_lettered == 11
    assert backend.records("logs") == stored - 11 and refused[0] not in backend.stored
    assert len([s for s in backend.seen if s.headers["idempotency-key"] == refused[0]]) == 1
    with Log(data, Config.reader()) as log:
        dlq = [orjson.loads(p) for p in log.read("otel-logs.dlq", 0, 0, 100).payloads]
        assert len(dlq) == 11 and {d["status"] for d in dlq} == {400}
        assert dlq[0]["answer"] == '{"code":3,"message":"bad things"}'
        assert dlq[0]["error"].startswith("HTTP 400") and dlq[0]["group"] == "fwd"
        original = log.read("otel-logs", 0, int(KEY.match(refused[0])["first"]), 11).payloads  # type: ignore[index]
        assert [orjson.dumps(d["payload"]) for d in dlq] == [orjson.dumps(orjson.loads(p)) for p in original]
    totals = group_totals(data)
    assert (totals.lag, totals.failed, totals.delivered) == (0, 11, stored - 11)


def test_a_redirect_is_retried_and_named(data: Path) -> None:
    """A 3xx says the URL given is wrong, not the batch: nothing goes to dead
    letters, and the failure names where the endpoint points."""
    stored = logs_in(data, 1)
    answers = iter([Step(308, {"Location": "https://elsewhere/v1/logs"}, b"")])
    with Backend(lambda seen: next(answers, accepted())) as backend:
        stats = forward(data, "otel-logs", backend, "logs", retry_backoff_s=0.01)
    assert stats.retries == 1 and stats.dead_lettered == 0 and backend.records("logs") == stored
    assert stats.last_error == "HTTP 308: redirected to https://elsewhere/v1/logs: give comet ship that URL"


def test_partial_success_is_counted_not_retried(data: Path) -> None:
    stored = logs_in(data, 2)
    response = ExportLogsServiceResponse()
    response.partial_success.rejected_log_records = 3
    response.partial_success.error_message = "3 too old"
    with Backend(lambda seen: accepted(200, response.SerializeToString())) as backend:
        stats = forward(data, "otel-logs", backend, "logs")
    assert stats.rejected == 3 * len(backend.stored) and stats.records == stored
    assert len(backend.seen) == len(backend.stored)  # not one retry


def test_a_lost_answer_is_sent_again_under_the_same_key(data: Path) -> None:
    """The backend stored the batch but its answer never came: the retry has
    the same key and the same records, so a backend that keeps keys stores
    it once."""
    stored = logs_in(data, 6)
    keys_seen: set[str] = set()

    def answer(seen: Seen) -> Step:
        key = seen.headers["idempotency-key"]
        if key not in keys_seen:
            keys_seen.add(key)
            return Step(lost=True)
        return accepted()

    with Backend(answer) as backend:
        stats = forward(data, "otel-logs", backend, "logs", max_batch_records=13, retry_backoff_s=0.01)
    backend.check_keys()
    assert backend.records("logs") == stored == stats.records
    assert set(backend.duplicates) == set(backend.stored)  # each sent twice, stored once


def test_acknowledged_in_order_with_requests_in_flight(data: Path) -> None:
    """Later batches of a shard are delivered while the first hangs: the
    offset stays before the first until it is delivered too."""
    logs_in(data, 3)
    gate = threading.Event()

    def answer(seen: Seen) -> Step:
        m = KEY.match(seen.headers["idempotency-key"])
        if m and m["first"] == "0" and not gate.is_set():  # the shard's first batch waits
            gate.wait(30)
            return Step(503, {"Retry-After": "0"}, b"late")
        return accepted()

    result: list[Any] = []
    with Backend(answer) as backend:
        runner = threading.Thread(target=lambda: result.append(
            forward(data, "otel-logs", backend, "logs", max_batch_records=5, concurrency=4)))
        runner.start()
        backend.wait_for(lambda seen: len(backend.stored) >= 3)
        assert group_totals(data).lag == 33  # nothing acknowledged: the first batch is in flight
        gate.set()
        runner.join(60)
    assert result and result[0].records == 33 and group_totals(data).lag == 0


def test_two_shippers_of_one_group_do_not_run_at_once(data: Path, backend: Backend) -> None:
    logs_in(data, 1)
    with Log(data, Config.reader()) as log, Consumer(log, "otel-logs", "fwd") as consumer:
        sink = OtlpHttpSink(OtlpTarget(backend.url, "logs"))
        held = Forwarder(consumer, sink, "logs")
        fds = [held.intents.claim(s) for s in consumer.shards()]
        try:
            with pytest.raises(ShardBusy, match=rf"group 'fwd' already ships shard 0 .*pid {os.getpid()}"):
                forward(data, "otel-logs", backend, "logs")
        finally:
            for fd in fds:
                os.close(fd)
    forward(data, "otel-logs", backend, "logs")
    assert backend.records("logs") == 11


# ---- the command -------------------------------------------------------------------------

def ship(data: Path, stream: str, url: str, *args: str, env: dict[str, str] | None = None,
         timeout: float = 120) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "COMET_"))}
    return subprocess.run([str(COMET), "ship", str(data), stream, url, "--status-interval", "0", *args],
                          capture_output=True, text=True, timeout=timeout, env={**environ, **(env or {})},
                          stdin=subprocess.DEVNULL)


def test_headers_encodings_and_the_standard_environment(data: Path, backend: Backend) -> None:
    stored = logs_in(data, 2)
    done = ship(data, "otel-logs", backend.url + "/otlp/", "--once", "--encoding", "json",
                "--compression", "none", "-H", "Authorization=Bearer s3cret", "--group", "j",
                env={"OTEL_EXPORTER_OTLP_HEADERS": "x-tenant=edge%201,authorization=wrong",
                     "OTEL_EXPORTER_OTLP_LOGS_HEADERS": "x-signal=logs"})
    assert done.returncode == 0, done.stderr
    assert {s.path for s in backend.seen} == {"/otlp/v1/logs"}
    seen = backend.seen[0]
    assert seen.headers["authorization"] == "Bearer s3cret" and seen.headers["x-tenant"] == "edge 1"
    assert seen.headers["x-signal"] == "logs" and seen.headers["content-type"] == "application/json"
    assert "content-encoding" not in seen.headers
    doc = orjson.loads(seen.body)
    record = doc["resourceLogs"][0]["scopeLogs"][0]["logRecords"][0]
    assert record["traceId"] == bytes(range(16)).hex()  # OTLP/JSON: ids in hex
    assert backend.records("logs") == stored
    json_records = {k: v for k, v in backend.stored.items()}
    # the same records as protobuf and gzip (the defaults), under the same keys
    with Backend() as second:
        done = ship(data, "otel-logs", second.url, "--once", "--group", "j2")
        assert done.returncode == 0, done.stderr
        assert second.seen[0].headers["content-encoding"] == "gzip"
        assert second.seen[0].headers["content-type"] == "application/x-protobuf"
        assert {k: as_received("logs", v) for k, v in second.stored.items()} == \
               {k: as_received("logs", v) for k, v in json_records.items()}


def test_command_line_mistakes_are_one_line(data: Path, backend: Backend) -> None:
    logs_in(data, 1)
    for args, env, wanted in [
        (["--header", "novalue"], {}, "--header 'novalue': use NAME=VALUE"),
        ([], {"OTEL_EXPORTER_OTLP_HEADERS": "broken"}, "OTEL_EXPORTER_OTLP_HEADERS: header 'broken'"),
        ([], {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "speaks http/protobuf and http/json"),
        (["--client-cert", "/nonexistent.pem"], {}, "--client-cert /nonexistent.pem: cannot be read"),
        (["--service-name", "x"], {}, "--service-name is for plain events"),
    ]:
        done = ship(data, "otel-logs", backend.url, "--once", *args, env=env)
        assert done.returncode != 0 and wanted in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr
    done = ship(data, "otel-logs", "http://:4318", "--once")
    assert done.returncode == 1 and "an OTLP/HTTP endpoint is an http:// or https:// URL" in done.stderr
    assert signal_url("https://h:4318/base/", "traces") == "https://h:4318/base/v1/traces"


def test_an_endpoint_that_stays_down_exits_4_with_once(data: Path) -> None:
    logs_in(data, 1)
    with Backend(lambda seen: Step(reset=True)) as backend:
        url = backend.url
    done = ship(data, "otel-logs", url, "--once", "--max-retries", "1")
    assert done.returncode == 4, done.stderr
    last = done.stderr.splitlines()[-1]
    assert last.startswith(f"Error: comet ship: cannot deliver to {url}/v1/logs: no answer (") and \
        "Connection refused" in last and "still failing after 2 attempts (--max-retries 1)" in last
    assert group_totals(data, group=f"otlp-127.0.0.1-{url.rsplit(':', 1)[1]}").lag == 11


def test_mutual_tls(data: Path, tmp_path: Path) -> None:
    import ssl

    pki = Pki.make(tmp_path / "pki")
    ca, client_cert = pki.ca, pki.client
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki.server.cert, pki.server.key)
    context.load_verify_locations(ca.cert)
    context.verify_mode = ssl.CERT_REQUIRED
    stored = logs_in(data, 1)
    with Backend(tls=context) as backend:
        refused = ship(data, "otel-logs", backend.url, "--once", "--max-retries", "0",
                       "--ca-file", str(ca.cert))
        assert refused.returncode == 4, refused.stderr  # no client certificate
        done = ship(data, "otel-logs", backend.url, "--once", "--client-cert", str(client_cert.cert),
                    "--client-key", str(client_cert.key),
                    env={"OTEL_EXPORTER_OTLP_CERTIFICATE": str(ca.cert)})
        assert done.returncode == 0, done.stderr
        assert backend.records("logs") == stored


def test_status_line_and_comet_stat_show_the_backlog(data: Path) -> None:
    stored = logs_in(data, 3)
    with Backend(lambda seen: Step(503, {"Retry-After": "0"}, b"down")) as backend:
        done = ship(data, "otel-logs", backend.url, "--once", "--max-retries", "2", "--group", "g")
    assert done.returncode == 4
    lines = [orjson.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    status = [x for x in lines if x.get("event") == "status"][-1]
    assert status["lag"] == stored and status["lag_bytes"] > 0 and status["oldest_unacked_age_s"] >= 0
    assert status["retries"] == 3 and status["last_error"] == "HTTP 503: down"
    assert [x for x in lines if x.get("event") == "send_failed"][0]["status"] == 503
    stat = subprocess.run([str(COMET), "stat", str(data), "--stream", "otel-logs"], capture_output=True,
                          text=True, check=True).stdout
    header, row = [line.split() for line in stat.strip().splitlines()[-2:]]
    assert header[:5] == ["STREAM", "GROUP", "SHARDS", "LAG", "LAG"] and row[1] == "g"
    assert row[3] == str(stored) and "RETRIES" in stat


# ---- crashes --------------------------------------------------------------------------------

def tiled(backend: Backend, entries: dict[int, int]) -> None:
    """The stored keys cover every entry of every shard exactly once."""
    backend.check_keys()
    per_shard: dict[int, list[tuple[int, int]]] = {}
    for key in backend.stored:
        m = KEY.match(key)
        assert m, key
        per_shard.setdefault(int(m["shard"]), []).append((int(m["first"]), int(m["last"])))
    for shard, count in entries.items():
        ranges = sorted(per_shard.get(shard, []))
        covered = [e for first, last in ranges for e in range(first, last + 1)]
        assert covered == list(range(count)), f"shard {shard}: {ranges}"


@pytest.mark.slow
def test_kill_9_at_random_moments(data: Path) -> None:
    """A shipper killed at random moments and started again while entries
    keep coming: each entry reaches the backend under one key, once."""
    rng = random.Random(int(os.environ.get("COMET_FUZZ_SEED", str(time.time_ns() % 2**32))))
    body = logs_request().SerializeToString()
    with Log(data, CONFIG) as log, Backend(lambda seen: accepted() if rng.random() > 0.1
                                            else Step(lost=True)) as backend:
        store(log, "logs", [body] * 5, shard=None)
        for round_ in range(12):
            proc = subprocess.Popen([str(COMET), "ship", str(data), "otel-logs", backend.url,
                                     "--group", "k", "--batch-records", "7", "--batch-age", "0.05",
                                     "--concurrency", "3", "--status-interval", "0"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            for _ in range(rng.randrange(1, 4)):
                store(log, "logs", [body], shard=None)
                log.sync()
            time.sleep(rng.uniform(0.1, 0.8))
            proc.kill()
            proc.wait(30)
        log.sync()
        entries = {s.shard: s.next_entry for s in log.stats("otel-logs").shards}
        done = ship(data, "otel-logs", backend.url, "--once", "--group", "k", "--batch-records", "7")
        assert done.returncode == 0, done.stderr
        tiled(backend, entries)


@pytest.mark.slow
@pytest.mark.parametrize("point", ["ship.recorded", "ship.delivered", "ship.acked"])
def test_killed_at_each_named_point(data: Path, point: str) -> None:
    """Killed where a crash hurts most (a batch recorded, not sent; delivered,
    not acknowledged; acknowledged, not synced): the rerun sends what is
    missing, and a batch sent again has its key and its records."""
    body = logs_request().SerializeToString()
    with Log(data, CONFIG) as log:
        store(log, "logs", [body] * 3, shard=1)
        log.sync()
        entries = {s.shard: s.next_entry for s in log.stats("otel-logs").shards}
    # At ship.acked the first run dies once its first batch is acknowledged.  Which later
    # batches were delivered by then is up to the threads and the machine's load, so in that
    # run the first batch is answered only after another batch arrived, and the others lose
    # their answers: stored by the backend, not acknowledged, they must come again.
    first_run, arrived = [point == "ship.acked"], threading.Semaphore(0)

    def answer(seen: Seen) -> Step:
        if not first_run[0]:
            return accepted()
        key = KEY.match(seen.headers.get("idempotency-key", ""))
        if key and int(key["first"]) == 0:
            arrived.acquire(timeout=10)
            return accepted()
        arrived.release()
        return Step(lost=True)

    with Backend(answer) as backend:
        deaths = 0
        for nth in range(1, 30):  # each run dies at the nth hit, the next one goes further
            done = ship(data, "otel-logs", backend.url, "--once", "--group", "p", "--batch-records", "5",
                        env={"COMET_CUT_POINT": f"{point}:{nth}"})
            first_run[0] = False
            if done.returncode == 0:
                break
            assert done.returncode == CUT_EXIT, done.stderr
            assert f"comet: cut point {point}" in done.stderr
            deaths += 1
        assert deaths and done.returncode == 0
        tiled(backend, entries)
        if point != "ship.recorded":
            assert backend.duplicates  # the killed runs' last batches came again


def test_a_stream_created_after_the_start_is_forwarded(data: Path, backend: Backend) -> None:
    """`comet ship` may start before the first request created the stream."""
    Log(data, CONFIG).close()
    stop = threading.Event()
    config = ForwardConfig(status_interval_s=0, max_batch_age_s=0, poll_interval_s=0.05)
    sink = OtlpHttpSink(OtlpTarget(backend.url, "logs"))
    with Consumer(Log(data, Config.reader()), "otel-logs", "late") as consumer:
        forwarder = Forwarder(consumer, sink, "logs", config=config)
        runner = threading.Thread(target=forwarder.run, args=(stop,))
        runner.start()
        try:
            stored = logs_in(data, 2)
            backend.wait_for(lambda seen: backend.records("logs") >= stored)
        finally:
            stop.set()
            runner.join(30)
            consumer.log.close()
    assert backend.records("logs") == stored and not runner.is_alive()


def test_dead_letters_replay_as_the_records_they_hold(data: Path) -> None:
    """`comet ship` of `<stream>.dlq` sends the events the dead letters hold,
    as the stream's signal, with their original times."""
    bodies = [logs_request().SerializeToString()]
    with Log(data, CONFIG) as log:
        store(log, "logs", bodies)
        log.create_stream("app", 1)
        log.append_batch("app", [b'{"n":1}', b'{"n":2.5}'], shard=0)
        stamps = list(log.read("app", 0, 0, 10).timestamps)
    with Backend(lambda seen: Step(400, {}, b"no")) as refusing:
        forward(data, "otel-logs", refusing, "logs")
        forward(data, "app", refusing, "logs", plain=b"")
    with Log(data, CONFIG) as log:  # and an entry that is no dead letter
        log.append_batch("app.dlq", [b'{"not":"a letter"}'], shard=0)
    with Backend() as backend:
        forward(data, "otel-logs.dlq", backend, "logs")
        [replayed] = backend.stored.values()
        assert as_received("logs", replayed) == as_sent("logs", bodies)
    with Backend() as backend:
        from consumers.cli import plain_resource
        stats = forward(data, "app.dlq", backend, "logs", plain=plain_resource("app"))
        [replayed] = backend.stored.values()
        records = ExportLogsServiceRequest.FromString(replayed).resource_logs[0].scope_logs[0].log_records
        assert [r.time_unix_nano for r in records] == stamps
        assert [r.body.kvlist_value.values[0].value.WhichOneof("value") for r in records] == \
            ["int_value", "double_value"]
        assert stats.dead_lettered == 1  # the entry that is no dead letter, with why
    with Log(data, Config.reader()) as log:
        [again] = [orjson.loads(p) for p in log.read("app.dlq.dlq", 0, 0, 10).payloads]
        assert again["error"].startswith("not an OTLP logs event: not a dead letter (KeyError")
