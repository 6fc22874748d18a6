"""`comet serve` reads its configuration once per start and once per HUP:
a changed file takes effect in the new workers, and a file broken in the
meantime is reported and the running configuration kept (the gateway goes on
serving instead of stopping on a typo)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from .support.server import COMET, SMALL, GatewayProcess, ServerProcess, free_port

JSON = {"content-type": "application/json"}


def post(server: GatewayProcess, size: int) -> int:
    body = b'{"pad":"' + b"x" * (size - 10) + b'"}'
    status, _, _ = server.request("POST", "/streams/ev", body, JSON)
    return status


def test_hup_rereads_the_file_and_keeps_the_running_config_when_it_is_broken(tmp_path: Path) -> None:
    conf = tmp_path / "comet.toml"
    conf.write_text("max_body_bytes = 1000\n")
    with GatewayProcess(tmp_path / "data", workers=1, env=SMALL, config=conf) as server:
        server.wait_ready()
        assert post(server, 2000) == 413
        assert post(server, 500) == 202

        conf.write_text("max_body_bytes = 100000\n")
        server.reload_workers()
        assert post(server, 2000) == 202

        conf.write_text("max_body_bytes = [not toml\n")
        server.reload_workers()
        assert post(server, 2000) == 202           # still the last good configuration
        assert post(server, 200_000) == 413
        assert server.stop() == 0
    log = server.log_path.read_text()
    assert "reload_config_invalid" in log and "keeping the running configuration" in log


def events(log: Path, name: str) -> list[dict[str, Any]]:
    return [r for r in map(json.loads, log.read_text().splitlines()) if r.get("event") == name]


def test_hup_says_what_it_reloaded_and_keeps_what_needs_a_restart(tmp_path: Path) -> None:
    """The `reloaded` line names the settings that changed and the tokens; the
    data directory, address and workers keep their running values, with a warning."""
    conf, port = tmp_path / "comet.toml", free_port()
    conf.write_text(f'data_dir = "{tmp_path}/data"\nport = {port}\nworkers = 1\n'
                    'auth = "on"\ntokens = ["first-token"]\n')
    with ServerProcess([str(COMET), "serve", "--config", str(conf)], port, workers=1,
                       log_path=tmp_path / "serve.log", env=SMALL) as server:
        server.wait_ready()
        conf.write_text(f'data_dir = "{tmp_path}/other"\nport = {free_port()}\nworkers = 2\n'
                        'auth = "on"\ntokens = ["first-token", "second-token"]\nmax_body_bytes = 4096\n')
        server.reload_workers()
        assert len(server.worker_pids()) == 1
        status, _, _ = server.request("POST", "/streams/ev", b"{}",
                                      {**JSON, "authorization": "Bearer second-token"})
        assert status == 202
        assert server.stop() == 0
    [warning] = events(server.log_path, "reload_needs_restart")
    assert warning["level"] == "warning" and warning["settings"] == ["data_dir", "port", "workers"]
    [reloaded] = events(server.log_path, "reloaded")
    assert reloaded["changed"] == ["max_body_bytes", "tokens"] and reloaded["tokens"] == 2
    assert reloaded["tls"] is False
    assert not (tmp_path / "other").exists()


def test_a_bad_config_stops_serve_before_any_process_starts(tmp_path: Path) -> None:
    conf = tmp_path / "comet.toml"
    conf.write_text("max_body_bytes = -1\n")
    server = GatewayProcess(tmp_path / "data", workers=1, env=SMALL, config=conf)
    assert server.proc.wait(timeout=60) == 1
    server.stop()
    assert "max_body_bytes must be positive" in server.log_path.read_text()
    assert not (tmp_path / "data").exists()


HEAP_PROBE = """
import ctypes, sys
from gateway.serving.server import keep_freed_heap
libc = ctypes.CDLL(None)
libc.sbrk.restype = libc.malloc.restype = ctypes.c_void_p
libc.sbrk.argtypes = [ctypes.c_ssize_t]
if sys.argv[1] == "keep":
    assert keep_freed_heap(64 << 20)
blocks = [libc.malloc(100 << 10) for _ in range(40)]  # 4 MB of heap, below the mmap threshold
top = libc.sbrk(0)
for block in reversed(blocks):
    libc.free(ctypes.c_void_p(block))
print("kept" if libc.sbrk(0) == top else "trimmed")
"""


def test_a_worker_keeps_freed_heap_instead_of_trimming_it_per_request() -> None:
    """post_worker_init raises glibc's trim threshold (keep_freed_heap): freeing the
    bodies at the top of the heap no longer gives the memory back with brk, to fault
    it in again with the next requests.  Without it the same frees trim the heap."""
    def run(mode: str) -> str:
        return subprocess.run([sys.executable, "-c", HEAP_PROBE, mode], capture_output=True,
                              text=True, check=True, timeout=60).stdout.strip()

    assert run("default") == "trimmed"
    assert run("keep") == "kept"
