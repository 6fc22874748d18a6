"""Whether users other than this one can run this Python (a venv's: the one it
links to).

A venv links to the interpreter that made it: one under /root (pyenv's, for
one) cannot be run by another user, so a service that runs as a user of its
own (docs/operations.md's systemd unit) fails at once with "Permission
denied".

    venv-reach.py           a note when other users cannot run it (make venv
                            runs this with the venv's python); exit status 0
    venv-reach.py --check   exit status 0 if this is a Python 3.11+ that can
                            make venvs and every user can run, else 1
                            (scripts/pick-python: which Python make venv uses)
"""

from __future__ import annotations

import os
import stat
import sys
import sysconfig
from pathlib import Path


def unreachable(path: Path) -> Path | None:
    """The first directory on the way to ``path``, or ``path`` itself, that
    other users may not pass (the interpreter: run)."""
    for part in [*reversed(path.parents), path]:
        if not part.stat().st_mode & stat.S_IXOTH:
            return part
    return None


def closed() -> tuple[Path, Path | None]:
    """This Python's interpreter, and what of it other users cannot reach (None: nothing)."""
    python = Path(os.path.realpath(getattr(sys, "_base_executable", sys.executable)))
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return python, unreachable(python) or unreachable(stdlib)


def main(argv: list[str]) -> int:
    python, blocked = closed()
    if argv == ["--check"]:
        try:
            import ensurepip  # noqa: F401  (Debian's python3 without python3-venv makes no venv)
        except ImportError:
            return 1
        return 0 if sys.version_info >= (3, 11) and blocked is None else 1
    if blocked is not None:
        print(f"note: this venv runs {python}, which other users cannot reach ({blocked} is "
              "closed to them): fine for you, but a service running as another user needs a "
              "venv made from a Python every user can run, e.g. "
              "make venv PYTHON=/usr/bin/python3 (docs/operations.md, A systemd unit)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
