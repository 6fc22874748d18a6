"""Writing a file so that it is either absent or whole, even across a power
cut; and removing the temporary files of writers that died.

A temporary file is named ``.<name>.<pid>.tmp`` after the process writing
it.  A writer that fails removes its own; one killed (``kill -9``, a power
cut) leaves it, and ``remove_stale_temp_files`` removes it later once that
process is gone.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from storage_c.files import pid_alive

TEMP_NAME = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.tmp$")


def temp_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def write_durably(path: Path, data: bytes) -> None:
    """Writes ``data`` under a temporary name, fsyncs it, renames it over
    ``path`` and fsyncs the directory.  On failure the temporary file is
    removed (a process killed meanwhile leaves it: see
    ``remove_stale_temp_files``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_stale_temp_files(directory: Path, *, mine_are_stale: bool = False,
                            name: str | None = None) -> list[Path]:
    """Removes the ``.<name>.<pid>.tmp`` files of ``directory`` whose writer is
    not alive, and returns them.  With ``mine_are_stale``, files named after
    this very process are removed too: only right for a caller that knows it
    has not started writing there (a pid reused by a restarted container's
    process 1 would otherwise keep them forever).  ``name`` limits the scan
    to the temporary files of that one file."""
    removed = []
    try:
        entries = list(os.scandir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return removed
    me = os.getpid()
    for entry in entries:
        m = TEMP_NAME.match(entry.name)
        if m is None or (name is not None and m["name"] != name):
            continue
        pid = int(m["pid"])
        if (pid == me and not mine_are_stale) or (pid != me and pid_alive(pid)):
            continue
        try:
            os.unlink(entry.path)
        except FileNotFoundError:
            continue
        removed.append(Path(entry.path))
    return removed
