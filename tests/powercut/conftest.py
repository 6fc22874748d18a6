"""The ``powercut`` fixture: a power-cut filesystem mounted in a temporary directory."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Iterator

import pytest

from .harness import PowerCutFS


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
