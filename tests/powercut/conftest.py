"""The ``powercut`` fixture: a power-cut filesystem mounted in a temporary directory."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from .harness import PowerCutFS, Writer

CUTS = int(os.environ.get("POWERCUT_CUTS", "30"))


def _fuse_problem() -> str | None:
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is missing: run scripts/install-fuse.sh"
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is missing"
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as exc:
        return f"mfusepy does not load ({exc}): run scripts/install-fuse.sh and install .[dev]"
    return None


@pytest.fixture
def powercut(tmp_path: Path) -> Iterator[PowerCutFS]:
    problem = _fuse_problem()
    if problem:  # a missing dependency is a failure, never a skip
        pytest.fail(problem)
    fs = PowerCutFS(tmp_path)
    try:
        yield fs
    finally:
        fs.close()


def read_state(proc: Writer) -> dict:
    """The first line of a writer: what survived (``S``), or why opening failed (``E``)."""
    assert proc.stdout
    line = proc.stdout.readline()
    if line.startswith("E "):
        raise AssertionError(f"reopening after the cut failed: {json.loads(line[2:])}")
    assert line.startswith("S "), (f"writer said {line!r} (exit {proc.wait()}):\n"
                                   f"{proc.stderr_path.read_text()}")
    return json.loads(line[2:])


def read_lines(proc: Writer, count: int) -> list[list[str]]:
    assert proc.stdout
    out = []
    for _ in range(count):
        line = proc.stdout.readline()
        assert line.endswith("\n"), (f"writer ended early (exit {proc.wait()}): {line!r}\n"
                                      f"{proc.stderr_path.read_text()}")
        out.append(line.split())
    return out


def drain(proc: subprocess.Popen[str]) -> list[list[str]]:
    """What a killed writer had written to its pipe: complete lines only."""
    assert proc.stdout
    rest = proc.stdout.read()
    proc.stdout.close()
    return [line.split() for line in rest.split("\n")[:-1]]
