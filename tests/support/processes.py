"""The programs of tests/children/ in child processes of their own (never a fork of pytest)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
CHILDREN = REPO / "tests" / "children"
WORKERS = CHILDREN / "workers.py"
FAULT_WORKER = CHILDREN / "fault_worker.py"


def worker_argv(*args: object) -> list[str]:
    """The command line of ``tests/children/workers.py <args>``."""
    return [sys.executable, str(WORKERS), *map(str, args)]


def worker(*args: object, **popen: Any) -> subprocess.Popen[bytes]:
    """Starts ``tests/children/workers.py <args>`` in a real child process."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen(worker_argv(*args), env=env, **popen)


def run_worker(*args: object, timeout: float = 120) -> str:
    """Runs ``tests/children/workers.py <args>`` to its end; its stdout (it must exit 0)."""
    proc = worker(*args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"worker {args} failed ({proc.returncode}):\n{err.decode()}"
    return out.decode()
