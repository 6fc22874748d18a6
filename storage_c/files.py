"""Small file-system facts shared by the packages above storage: whether the
writer of a temporary file is still alive."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """True when a process ``pid`` exists and is not a zombie (a killed
    process its parent has not reaped yet writes nothing more).  A pid in
    another PID namespace (another container) cannot be seen: it reads as
    dead."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return True  # no /proc: trust kill(0)
    return stat[stat.rfind(")") + 2:][:1] not in ("Z", "X")
