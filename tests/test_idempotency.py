"""Idempotency-Key on POST /streams/{name} (and OTLP): a retry stores nothing twice.

In process (Starlette's TestClient) for the answers - the replay header and body,
400 for a bad key, 422 for another body under a key, per-stream windows, every
body format and encoding - and with `comet serve` (two workers) for retries that
race on both workers and for a worker killed with SIGKILL while attempts of the
same requests are in flight (storage_c/FORMAT.md "Idempotency keys")."""

from __future__ import annotations

import gzip
import os
import signal
import threading
import time
from pathlib import Path
from typing import Iterator

import orjson
import pytest
from starlette.testclient import TestClient

from gateway.app import create_app
from gateway.config import GatewayConfig, StreamPolicy
from storage_c import Config, Log

from .support.gateway_app import JSON, NDJSON, config, stored
from .support.otlp_requests import logs_request
from .support.server import SMALL, GatewayProcess

REPLAYED = "idempotent-replayed"


def cfg(data_dir: Path, **kw: object) -> GatewayConfig:
    return config(data_dir, **kw)


@pytest.fixture
def client(data_dir: Path) -> Iterator[TestClient]:
    with TestClient(create_app(cfg(data_dir))) as c:
        yield c


def post(client: TestClient, body: bytes, key: str | None, headers: dict[str, str] = NDJSON,
         stream: str = "s") -> tuple[int, dict[str, object], dict[str, str]]:
    h = dict(headers)
    if key is not None:
        h["idempotency-key"] = key
    r = client.post(f"/streams/{stream}", content=body, headers=h)
    return r.status_code, r.json(), dict(r.headers)


def test_a_retry_gets_the_first_answer_and_stores_nothing(client: TestClient, data_dir: Path) -> None:
    body = b'{"a":1}\n{"a":2}\n{"a":3}\n'
    status, first, headers = post(client, body, "req-1")
    assert status == 202 and REPLAYED not in headers
    assert first["count"] == 3 and first["last"] == first["first"] + 2  # type: ignore[operator]
    for _ in range(3):
        again = post(client, body, "req-1")
        assert again[0] == 202 and again[1] == first and again[2][REPLAYED] == "true"
    assert stored(data_dir, "s") == [b'{"a":1}', b'{"a":2}', b'{"a":3}']
    metrics = client.get("/metrics").text
    assert 'comet_stream_key_replays_total{stream="s"} 3' in metrics
    # another key stores; the same key on another stream is another key
    assert post(client, body, "req-2")[0] == 202
    assert post(client, body, "req-1", stream="t")[2].get(REPLAYED) is None
    assert len(stored(data_dir, "s")) == 6 and len(stored(data_dir, "t")) == 3


def test_another_body_under_a_key_is_422_and_stores_nothing(client: TestClient,
                                                           data_dir: Path) -> None:
    assert post(client, b'{"a":1}\n', "k")[0] == 202
    for body, headers in ((b'{"a":2}\n', NDJSON), (b'{"a":1}\n', JSON),
                          (b'{"a":1}\n', {"content-type": "application/octet-stream"})):
        status, answer, _ = post(client, body, "k", headers)
        assert status == 422 and answer["error"] == "idempotency_key_reused"
        assert "same body" in str(answer["detail"])
    assert stored(data_dir, "s") == [b'{"a":1}']


@pytest.mark.parametrize("key", ["", "x" * 256, "caf\u00e9", "a\tb", "a\x7fb"])
def test_a_bad_key_is_400_and_stores_nothing(client: TestClient, data_dir: Path, key: str) -> None:
    r = client.post("/streams/s", content=b'{"a":1}',
                    headers=[(b"content-type", b"application/json"),
                             (b"idempotency-key", key.encode("utf-8"))])
    assert r.status_code == 400 and r.json()["error"] == "bad_idempotency_key"
    assert "1 to 255 printable ASCII" in r.json()["detail"]
    assert stored(data_dir, "s") == []


def test_keys_of_255_printable_characters_and_spaces_are_good(client: TestClient) -> None:
    for key in ("x" * 255, "a b ~!", "0"):
        assert post(client, b"{}", key, JSON)[0] == 202
        assert post(client, b"{}", key, JSON)[2][REPLAYED] == "true"


@pytest.mark.parametrize("headers,body", [
    (JSON, b'[{"a":1}, {"a":2}]'),
    (JSON, b'{"a":1}'),
    (NDJSON, b'{"a":1}\r\n{"a":2}\r\n'),
    ({"content-type": "application/octet-stream"}, b"\x00\x01 raw"),
])
@pytest.mark.parametrize("validate", [True, False])
def test_every_body_format_is_stored_once(data_dir: Path, headers: dict[str, str], body: bytes,
                                          validate: bool) -> None:
    with TestClient(create_app(cfg(data_dir, validate=validate))) as client:
        plain = client.post("/streams/plain", content=body, headers=headers)
        first = post(client, body, "k", headers)
        again = post(client, body, "k", headers)
        gz = post(client, gzip.compress(body), "k", {**headers, "content-encoding": "gzip"})
    assert plain.status_code == first[0] == again[0] == gz[0] == 202
    assert again[1] == gz[1] == first[1] and again[2][REPLAYED] == gz[2][REPLAYED] == "true"
    assert stored(data_dir, "s") == stored(data_dir, "plain")  # stored as without a key


def test_windows_per_stream(data_dir: Path) -> None:
    short = {"short": StreamPolicy(idempotency_window_s=0.2)}
    with TestClient(create_app(cfg(data_dir, streams=short))) as client:
        assert post(client, b"{}", "k", JSON, "short")[0] == 202
        assert post(client, b"{}", "k", JSON, "long")[0] == 202
        deadline = time.monotonic() + 10
        while post(client, b"{}", "k", JSON, "short")[2].get(REPLAYED):
            assert time.monotonic() < deadline, "the 0.2 s window never ended"
            time.sleep(0.05)
        assert post(client, b"{}", "k", JSON, "long")[2][REPLAYED] == "true"  # 600 s by default
    assert len(stored(data_dir, "long")) == 1
    assert len(stored(data_dir, "short")) >= 2


def test_window_settings_are_checked(data_dir: Path) -> None:
    from gateway.config import ConfigError, load
    (data_dir.parent / "c.toml").write_text("[streams.x]\nidempotency_window_s = 0\n")
    with pytest.raises(ConfigError, match="streams.x.idempotency_window_s must be above 0"):
        load(data_dir.parent / "c.toml", env={})
    with pytest.raises(ConfigError, match="idempotency_window_s must be above 0"):
        load(None, env={"COMET_IDEMPOTENCY_WINDOW_S": "-1"})
    assert load(None, env={"COMET_IDEMPOTENCY_WINDOW_S": "30"}).idempotency_window("x") == 30


def test_otlp_requests_with_a_key_are_stored_once(client: TestClient, data_dir: Path) -> None:
    body = logs_request().SerializeToString()
    headers = {"content-type": "application/x-protobuf", "idempotency-key": "batch-7"}
    first = client.post("/v1/logs", content=body, headers=headers)
    again = client.post("/v1/logs", content=body, headers=headers)
    assert first.status_code == again.status_code == 200 and first.content == again.content
    assert len(stored(data_dir, "otel-logs")) > 0
    with TestClient(create_app(cfg(data_dir.parent / "plain"))) as plain:
        assert plain.post("/v1/logs", content=body, headers={"content-type": "application/x-protobuf"}).status_code == 200
    assert len(stored(data_dir, "otel-logs")) == len(stored(data_dir.parent / "plain", "otel-logs"))


# ---- with `comet serve`: two workers, kill -9 ----------------------------------------------

def send_all(server: GatewayProcess, keys: list[str], answers: dict[str, bytes],
             errors: list[str]) -> None:
    """Each key's batch, retried until an answer of 202 (a worker killed under it: again)."""
    for key in keys:
        body = b"\n".join(orjson.dumps({"k": key, "i": i}) for i in range(3))
        for _ in range(200):
            try:
                status, answer, _ = server.request("POST", "/streams/ev", body,
                                                   {**NDJSON, "idempotency-key": key}, timeout=10)
            except OSError:
                continue
            if status == 202:
                if key in answers and answers[key] != answer:
                    errors.append(f"{key}: answered {answer!r} after {answers[key]!r}")
                answers[key] = answer
                break
            if status not in (503, 429):
                errors.append(f"{key}: {status} {answer!r}")
                break


def batches_by_key(data_dir: Path) -> dict[str, list[tuple[int, int]]]:
    """key -> the (shard, entry) of each stored first event of its batch."""
    out: dict[str, list[tuple[int, int]]] = {}
    with Log(data_dir, Config(background_flush=False)) as log:
        for shard in range(log.shard_count("ev")):
            for batch in log.iter_entries("ev", shard):
                for entry, payload in zip(batch.entries, batch.payloads):
                    event = orjson.loads(payload)
                    if event["i"] == 0:
                        out.setdefault(event["k"], []).append((shard, entry))
    return out


def test_retries_on_both_workers_and_through_kill_9_store_once(data_dir: Path) -> None:
    keys = [f"key-{i}" for i in range(300)]
    answers: dict[str, bytes] = {}
    errors: list[str] = []
    with GatewayProcess(data_dir, env=SMALL) as server:
        server.wait_ready()
        # Three clients send the same keys at once: every batch races on both workers.
        clients = [threading.Thread(target=send_all, args=(server, keys, answers, errors))
                   for _ in range(3)]
        for t in clients:
            t.start()
        killed = 0
        while any(t.is_alive() for t in clients) and killed < 4:
            workers = server.worker_pids()
            if len(workers) == 2 and len(answers) > 40 * (killed + 1):
                os.kill(workers[killed % 2], signal.SIGKILL)
                killed += 1
            time.sleep(0.05)
        for t in clients:
            t.join(timeout=300)
        assert server.stop() == 0
    assert not errors, errors[:5]
    assert killed >= 1, "no worker was killed while the clients sent"
    stored_at = batches_by_key(data_dir)
    twice = {k: v for k, v in stored_at.items() if len(v) != 1}
    assert not twice, f"batches stored more than once: {list(twice.items())[:5]}"
    assert sorted(stored_at) == sorted(keys)
    for key, answer in answers.items():
        a = orjson.loads(answer)
        assert [(a["shard"], a["first"])] == stored_at[key], key


@pytest.mark.parametrize("headers", [NDJSON, JSON, {"content-type": "application/octet-stream"}])
def test_a_blank_unchecked_body_is_400_with_a_key_as_without(data_dir: Path,
                                                             headers: dict[str, str]) -> None:
    with TestClient(create_app(cfg(data_dir, validate=False))) as client:
        for key in (None, "blank"):
            status, answer, _ = post(client, b" \r\n \n", key, headers)
            assert (status, answer["error"]) == (400, "empty_body")
    assert stored(data_dir, "s") == []
