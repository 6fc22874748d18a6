"""Limits on streams (max_streams, auto_create patterns) and readiness while
storage is full: clear 4xx/503 answers, nothing created or lost."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from gateway.app import create_app
from gateway.config import ConfigError, load
from storage_c import Config, Log, StreamLimit

from .support.gateway_app import JSON, config, stored


def names(data_dir: Path) -> list[str]:
    with Log(data_dir, Config(background_flush=False)) as log:
        return log.streams()


def test_max_streams_refuses_a_new_stream_with_409(data_dir: Path) -> None:
    with TestClient(create_app(config(data_dir, max_streams=3))) as c:
        for name in ("a", "b", "c"):
            assert c.post(f"/streams/{name}", content=b"{}", headers=JSON).status_code == 202
        r = c.post("/streams/d", content=b"{}", headers=JSON)
        assert r.status_code == 409 and r.json()["error"] == "too_many_streams"
        assert "max_streams is 3" in r.json()["detail"]
        assert c.post("/streams/a", content=b'{"more":1}', headers=JSON).status_code == 202
        metrics = c.get("/metrics").text
    assert 'comet_http_requests_total{slot="0",code="409"} 1' in metrics
    assert names(data_dir) == ["a", "b", "c"]
    assert not (data_dir / "d").exists()
    assert stored(data_dir, "a") == [b"{}", b'{"more":1}']


def _create(path: str, name: str, out: "multiprocessing.Queue[str]") -> None:
    with Log(path, Config(max_streams=4, background_flush=False)) as log:
        try:
            log.create_stream(name)
            out.put("ok")
        except StreamLimit:
            out.put("limit")


@pytest.mark.slow
def test_max_streams_holds_across_processes(data_dir: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    out: "multiprocessing.Queue[str]" = ctx.Queue()
    procs = [ctx.Process(target=_create, args=(str(data_dir), f"s{i}", out)) for i in range(10)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    results = sorted(out.get(timeout=5) for _ in procs)
    assert results.count("ok") == 4 and results.count("limit") == 6
    assert len(names(data_dir)) == 4


def test_auto_create_patterns(data_dir: Path) -> None:
    cfg = config(data_dir, auto_create=("logs-*", "metrics.?"))
    with TestClient(create_app(cfg)) as c:
        assert c.post("/streams/logs-web", content=b"{}", headers=JSON).status_code == 202
        assert c.post("/streams/metrics.a", content=b"{}", headers=JSON).status_code == 202
        for bad in ("evnets", "metrics.ab", "xlogs-web"):
            r = c.post(f"/streams/{bad}", content=b"{}", headers=JSON)
            assert r.status_code == 404 and r.json()["error"] == "unknown_stream"
            assert "logs-*" in r.json()["detail"]
    assert names(data_dir) == ["logs-web", "metrics.a"]


def test_auto_create_setting_forms(tmp_path: Path) -> None:
    file = tmp_path / "c.toml"
    file.write_text('auto_create = ["logs-*", "m.*"]\nmax_streams = 7\n')
    cfg = load(file, env={})
    assert cfg.auto_create == ("logs-*", "m.*") and cfg.max_streams == 7
    assert load(env={"COMET_AUTO_CREATE": "a-*,b-*"}).auto_create == ("a-*", "b-*")
    assert load(env={"COMET_AUTO_CREATE": "false"}).auto_create is False
    assert load(env={}).max_streams == 100
    with pytest.raises(ConfigError):
        load(env={"COMET_MAX_STREAMS": "-1"})
    file.write_text("auto_create = 3\n")
    with pytest.raises(ConfigError):
        load(file, env={})


def test_readyz_says_storage_full_and_recovers_when_space_returns(data_dir: Path) -> None:
    storage = Config(shards=1, segment_bytes=65536, segment_chunk_bytes=65536,
                     retention_max_total_bytes=262144)
    app = create_app(config(data_dir, storage=storage))
    with TestClient(app) as c:
        assert c.get("/readyz").status_code == 200
        assert c.post("/streams/full", content=b"{}", headers=JSON).status_code == 202
        runtime = app.state.runtime
        assert runtime.log is not None
        group = runtime.log.group("full", 0, "slow")  # protects what it has not acknowledged
        body = b"[" + b",".join([b'{"pad":"%s"}' % (b"p" * 1000)] * 27) + b"]"
        statuses = [c.post("/streams/full", content=body, headers=JSON).status_code for _ in range(12)]
        assert 507 in statuses and statuses.index(507) > 0
        r = c.get("/readyz")
        assert r.status_code == 503 and any("storage full" in p for p in r.json()["problems"])
        assert c.get("/readyz").status_code == 503  # still full: nothing changed
        group.ack(runtime.log.shard_stats("full", 0).next_entry - 1)  # now retention may delete
        r = c.get("/readyz")
        assert r.status_code == 200, r.json()
        assert c.post("/streams/full", content=body, headers=JSON).status_code == 202
