"""The ``powercut`` fixture: a power-cut filesystem mounted in a temporary directory."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Iterator

import pytest

from .harness import SEED, PowerCutFS


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The seed of the random schedules, at the end of every run that collected these
    tests (where CI's output shows it): COMET_POWERCUT_SEED=<it> replays the run."""
    terminalreporter.write_line(f"powercut: COMET_POWERCUT_SEED={SEED}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """A failure's report names the seed that replays it."""
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        report.sections.append(("powercut seed", f"COMET_POWERCUT_SEED={SEED}"))


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
