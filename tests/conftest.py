"""Shared fixtures: scratch data directories, small configs, child processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from storage_c import Config, Log

WORKERS = Path(__file__).with_name("workers.py")
REPO = Path(__file__).resolve().parent.parent

SMALL = Config(shards=4, segment_bytes=1 << 20, fsync_interval_ms=50)


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def log(data_dir: Path) -> Iterator[Log]:
    with Log(data_dir, SMALL) as opened:
        yield opened


def worker(*args: object, **popen: object) -> subprocess.Popen[bytes]:
    """Starts tests/workers.py in a real child process (never a fork of pytest)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen([sys.executable, str(WORKERS), *map(str, args)], env=env, **popen)


def run_worker(*args: object, timeout: float = 120) -> str:
    proc = worker(*args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"worker {args} failed ({proc.returncode}):\n{err.decode()}"
    return out.decode()


def read_all(log: Log, stream: str, shard: int) -> list[tuple[int, int, bytes]]:
    """Every (entry, timestamp, payload) of a shard, in order."""
    out: list[tuple[int, int, bytes]] = []
    for batch in log.iter_entries(stream, shard):
        out.extend(zip(batch.entries, batch.timestamps, batch.payloads))
    return out
