"""Says when users other than this one cannot run the venv's Python.

A venv links to the interpreter that made it: one under /root (pyenv's, for
one) cannot be run by another user, so a service that runs as a user of
its own (docs/operations.md's systemd unit) fails at once with "Permission
denied".  Run with the venv's python by `make venv`; prints a note, and
always exits 0 (a developer's own venv needs no other user).
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


def main() -> int:
    python = Path(os.path.realpath(getattr(sys, "_base_executable", sys.executable)))
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in (python, stdlib):
        blocked = unreachable(path)
        if blocked is not None:
            print(f"note: this venv runs {python}, which other users cannot reach ({blocked} is "
                  "closed to them): fine for you, but a service running as another user needs a "
                  "venv made from a Python every user can run, e.g. "
                  "make venv PYTHON=/usr/bin/python3 (docs/operations.md, A systemd unit)")
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
