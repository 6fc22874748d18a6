"""The life cycle of streams and groups with real processes: deleting a stream
while a gateway writes to it, resetting a group while a consumer reads it,
and the commands and endpoints that do it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import orjson
from click.testing import CliRunner
from starlette.testclient import TestClient

from gateway.app import create_app
from comet.cli import main as comet
from storage_c import Config, Log

from .support.gateway_app import JSON, config
from .support.noloss import check_stored_once
from .support.posters import Poster
from .support.processes import worker_argv
from .support.server import COMET, SMALL, GatewayProcess

TOOL = Config.inspector()


def comet_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(COMET), *args], capture_output=True, text=True, timeout=60)


def mapped_deleted(pid: int, stream_dir: str) -> list[str]:
    """Files of a deleted stream that process pid still maps."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return []
    return [line for line in maps.splitlines() if ".deleted-" in line or
            (stream_dir in line and "(deleted)" in line)]


def test_delete_a_stream_while_a_gateway_writes_to_it(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with GatewayProcess(data, workers=2, env={**SMALL, "COMET_ADMIN": "1"}) as server:
        server.wait_ready()
        before = [Poster(server, f"b{i}") for i in range(3)]
        threads = [p.start(limit=60) for p in before]
        deadline = time.monotonic() + 30
        while sum(len(p.acked) for p in before) < 30 and time.monotonic() < deadline:
            time.sleep(0.01)
        done = comet_cli("stream", "delete", str(data), "ev", "--yes")  # while they post
        assert done.returncode == 0, done.stderr
        for t in threads:
            t.join(60)
        # every request got an answer: stored (202) or "being deleted, retry" (503)
        for p in before:
            assert p.errors == 0 and set(p.statuses) <= {202, 503}, p.statuses
        after = [Poster(server, f"a{i}") for i in range(2)]
        for t in [p.start(limit=20) for p in after]:
            t.join(60)
        assert all(p.errors == 0 and set(p.statuses) == {202} for p in after)
        assert server.proc.poll() is None and len(server.worker_pids()) == 2
        # the deleted files are no longer mapped by any worker, their disk is
        # free: at once where a write noticed, at its flusher's next tick else
        deadline = time.monotonic() + 10
        while any(mapped_deleted(pid, str(data / "ev")) for pid in server.worker_pids()):
            assert time.monotonic() < deadline, "a worker still maps the deleted stream"
            time.sleep(0.05)
        assert not [n for n in os.listdir(data) if n.startswith(".deleted-")]
    # the new stream holds what was acknowledged after the deletion, once, and
    # nothing of what was acknowledged before it started
    check_stored_once(data, after)
    with Log(data, TOOL) as log:
        stored = {(e["c"], e["i"]) for s in range(log.shard_count("ev"))
                  for b in log.iter_entries("ev", s) for e in map(orjson.loads, b.payloads)}
        assert log.verify().ok
    for p in after:
        for _, _, _, events in p.acked:
            assert all((e["c"], e["i"]) in stored for e in events)
    early = [e for p in before for _, _, _, events in p.acked[:5] for e in events]
    assert not any((e["c"], e["i"]) in stored for e in early)


def test_reset_a_group_while_a_consumer_reads(data_dir: Path) -> None:
    with Log(data_dir, Config(shards=1)) as log:
        for i in range(100):
            log.append("ev", b'{"i":%d}' % i, shard=0)
        log.group("ev", 0, "readers")
    proc = subprocess.Popen(worker_argv("consume_and_print", data_dir), stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    seen: list[int] = []
    while not seen or seen[-1] < 98:  # it consumed (nearly) everything
        seen += [int(x) for x in proc.stdout.readline().split()]
    done = comet_cli("group", "reset", str(data_dir), "ev", "readers", "--to-entry", "10")
    assert done.returncode == 0, done.stderr
    assert "reset to entry 10" in done.stdout
    replay: list[int] = []
    while 99 not in replay:
        line = proc.stdout.readline()
        assert line, "the consumer stopped before it read the replay"
        replay += [int(x) for x in line.split()]
    tail = replay[replay.index(10):]
    assert tail == list(range(10, 100))  # from the reset point, every entry, in order
    with Log(data_dir, TOOL) as log:
        deadline = time.monotonic() + 30
        while log.groups("ev")[0].offset < 100 and time.monotonic() < deadline:
            time.sleep(0.01)  # its last ack
        assert log.groups("ev")[0].offset == 100
    proc.kill()
    proc.wait()


def test_group_commands(data_dir: Path) -> None:
    with Log(data_dir, Config(shards=2)) as log:
        for i in range(10):
            log.append("ev", b"%d" % i, shard=i % 2)
        log.group("ev", 0, "a")
        log.group("ev", 1, "a")
        t0 = time.time_ns()
        log.append("ev", b"late", shard=0)
    runner = CliRunner()
    out = runner.invoke(comet, ["group", "list", str(data_dir), "ev", "--json"])
    assert out.exit_code == 0, out.output
    rows = [json.loads(line) for line in out.output.splitlines()]
    assert [(r["name"], r["shard"], r["offset"], r["lag"]) for r in rows] == [("a", 0, 0, 6), ("a", 1, 0, 5)]
    out = runner.invoke(comet, ["group", "reset", str(data_dir), "ev", "a", "--to-latest"])
    assert out.exit_code == 0 and "reset to latest in 2 shard(s)" in out.output
    iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t0 / 1e9)) + f".{t0 % 10**9 // 1000:06d}Z"
    out = runner.invoke(comet, ["group", "reset", str(data_dir), "ev", "a", "--to-time", iso, "--shard", "0"])
    assert out.exit_code == 0, out.output
    with Log(data_dir, TOOL) as log:
        assert {g.shard: g.offset for g in log.groups("ev")} == {0: 5, 1: 5}  # 5 is "late" in shard 0
    out = runner.invoke(comet, ["group", "reset", str(data_dir), "ev", "nope", "--to-earliest"])
    assert out.exit_code == 1 and "known groups: a" in out.output
    out = runner.invoke(comet, ["group", "reset", str(data_dir), "ev", "a"])
    assert out.exit_code == 2 and "exactly one" in out.output
    out = runner.invoke(comet, ["group", "reset", str(data_dir), "ev", "a", "--to-time", "yesterday"])
    assert out.exit_code == 2 and "ISO 8601" in out.output
    out = runner.invoke(comet, ["group", "delete", str(data_dir), "ev", "a"])
    assert out.exit_code == 0 and "from 2 shard(s)" in out.output
    out = runner.invoke(comet, ["group", "list", str(data_dir), "ev"])
    assert "no consumer group" in out.output
    out = runner.invoke(comet, ["stream", "delete", str(data_dir), "nope", "--yes"])
    assert out.exit_code == 1 and "does not exist" in out.output
    out = runner.invoke(comet, ["stream", "delete", str(data_dir), "ev"], input="n\n")
    assert out.exit_code == 1 and (data_dir / "ev").is_dir()  # not confirmed: kept
    out = runner.invoke(comet, ["stream", "delete", str(data_dir), "ev"], input="y\n")
    assert out.exit_code == 0 and not (data_dir / "ev").exists()


def test_http_endpoints_are_off_unless_admin(data_dir: Path) -> None:
    with TestClient(create_app(config(data_dir))) as c:
        assert c.post("/streams/ev", content=b"[1,2,3]", headers=JSON).status_code == 202
        assert c.get("/streams/ev/groups").json() == {"stream": "ev", "groups": []}
        for r in (c.delete("/streams/ev"), c.delete("/streams/ev/groups/g"),
                  c.put("/streams/ev/groups/g", json={"to": "latest"})):
            assert r.status_code == 403 and r.json()["error"] == "admin_disabled"
        assert c.get("/streams/ev").status_code == 200


def test_http_groups_and_delete(data_dir: Path) -> None:
    app = create_app(config(data_dir, admin=True))
    with TestClient(app) as c:
        r = c.post("/streams/ev", content=b"[1,2,3]", headers=JSON).json()
        app.state.runtime.log.group("ev", r["shard"], "g")
        groups = c.get("/streams/ev/groups").json()["groups"]
        assert groups[0]["name"] == "g" and groups[0]["lag"] == 3
        for bad in ({}, {"to": "middle"}, {"to_entry": -1}, {"to": "latest", "to_entry": 1},
                    {"to_time": "soon"}, {"to": "latest", "shard": "x"}):
            assert c.put("/streams/ev/groups/g", json=bad).status_code == 400
        assert c.put("/streams/ev/groups/zz", json={"to": "latest"}).status_code == 404
        done = c.put("/streams/ev/groups/g", json={"to": "latest"}).json()
        assert done["shards"] == [{"shard": r["shard"], "before": 0, "after": 3}]
        assert c.delete("/streams/ev/groups/g").json()["deleted_from_shards"] == [r["shard"]]
        assert c.delete("/streams/ev").json() == {"stream": "ev", "deleted": True}
        assert c.delete("/streams/ev").status_code == 404
        assert c.get("/streams/ev").status_code == 404
        again = c.post("/streams/ev", content=b"[4]", headers=JSON).json()  # created anew
        assert again["first"] == 0


def test_a_running_shipper_stops_cleanly_when_its_stream_is_deleted(data_dir: Path, tmp_path: Path) -> None:
    with Log(data_dir, Config(shards=2)) as log:
        for i in range(50):
            log.append("ev", b'{"i":%d}' % i)
    out = tmp_path / "out"
    proc = subprocess.Popen([str(COMET), "ship", str(data_dir), "ev", str(out), "--max-object-age", "0.2",
                             "--status-interval", "0.2"], stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    while '"event":"status"' not in proc.stderr.readline():  # it is under way
        assert proc.poll() is None
    done = comet_cli("stream", "delete", str(data_dir), "ev", "--yes")
    assert done.returncode == 0, done.stderr
    rest = proc.communicate(timeout=60)[1]
    assert proc.returncode == 1
    assert "Traceback" not in rest and "Error: stream 'ev' was deleted" in rest


def test_a_killed_stream_creation_leaves_no_temporary_file(data_dir: Path) -> None:
    with Log(data_dir, Config(shards=1)) as log:
        log.create_stream("ev")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = data_dir / "ev" / f".stream.meta.{dead.pid}.tmp"   # what a kill -9 mid-creation leaves
    live = data_dir / "ev" / f".stream.meta.{os.getpid()}.tmp"  # a creator still at work
    stale.write_bytes(b"x")
    live.write_bytes(b"x")
    with Log(data_dir, Config(shards=1, background_flush=False)) as log:
        log.append("ev", b"{}")
    assert not stale.exists() and live.exists()


def test_ship_refuses_a_stream_created_again_under_the_same_name(data_dir: Path, tmp_path: Path) -> None:
    """Object keys name shards and entry numbers: a recreated stream's objects
    would overwrite the old ones, so the same group refuses to ship it."""
    out = tmp_path / "out"
    with Log(data_dir, Config(shards=1)) as log:
        log.append("ev", b'{"old":1}')
    first = comet_cli("ship", str(data_dir), "ev", str(out), "--once")
    assert first.returncode == 0, first.stderr
    shipped = {p.relative_to(out): p.read_bytes() for p in out.rglob("*.zst")}
    assert len(shipped) == 1
    assert comet_cli("stream", "delete", str(data_dir), "ev", "--yes").returncode == 0
    with Log(data_dir, Config(shards=1)) as log:
        log.append("ev", b'{"new":1}')  # entry 0 again, same shard, same hour
    again = comet_cli("ship", str(data_dir), "ev", str(out), "--once")
    assert again.returncode == 1 and "deleted and created again" in again.stderr
    assert "Traceback" not in again.stderr
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*.zst")} == shipped  # untouched
