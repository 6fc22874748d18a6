"""``python loadtests/bench_x.py`` run by its path, as the benchmarks' own usage
lines and older notes show it: the program runs again as ``python -m
loadtests.bench_x``, with the repository's root importable, so that it imports
the package and the test kit by name either way."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def rerun_as_module(file: str) -> None:
    """Replaces this process by ``python -m loadtests.<name of file> <its arguments>``;
    the working directory stays, so relative paths in the arguments mean what they did."""
    here = Path(file).resolve()
    root = str(here.parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    argv = [sys.executable, "-m", f"loadtests.{here.stem}", *sys.argv[1:]]
    os.execve(sys.executable, argv, env)
