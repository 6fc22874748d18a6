"""The core's named cut points (storage_c/src/port/cutpoint.h), without a power cut: a
process armed at a point dies there and nowhere else; the power-cut scenarios
that use them are tests/powercut/test_cutpoints.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from storage_c.testing import CUT_EXIT, arm_cut_point, cut_point_names

from .support.processes import worker_argv

def run(tmp_path: Path, spec: str | None) -> subprocess.CompletedProcess[str]:
    env = {"COMET_CUT_POINT": spec} if spec is not None else {}
    return subprocess.run(worker_argv("append_three_durably", tmp_path / "data"),
                          env=dict(os.environ, **env), capture_output=True, text=True,
                          timeout=60)


def test_names_are_listed_once() -> None:
    names = cut_point_names()
    assert len(names) == len(set(names)) >= 11
    assert {"append.written", "grow.sized", "rotate.created", "recovery.zeroed",
            "retention.unlinked", "offsets.acked"} <= set(names)


def test_the_nth_hit_ends_the_process_there(tmp_path: Path) -> None:
    done = run(tmp_path, "append.written:2")
    assert done.returncode == CUT_EXIT, done.stderr
    assert done.stdout.split("\n")[:-1] == ["acknowledged 0"]  # the second append never returned
    assert done.stderr.endswith("comet: cut point append.written\n")


def test_disarmed_and_unknown(tmp_path: Path) -> None:
    done = run(tmp_path, None)
    assert done.returncode == 0 and done.stdout.count("acknowledged") == 3, done.stderr
    typo = run(tmp_path, "append.writen:1")
    assert typo.returncode == 2 and "names no cut point" in typo.stderr
    with pytest.raises(ValueError):
        arm_cut_point("append.writen")
    arm_cut_point(None)  # disarming is always allowed
