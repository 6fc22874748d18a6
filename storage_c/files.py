"""Files that are either absent or whole, even across a power cut, for every
package above the storage: ``comet ship``'s intents and directory sink, the
Spark lake's plans, manifests and Parquet files.

The recipe is written once, here: write under a temporary name, fsync the
file, rename it over the final name, fsync the directory (the rename is only
durable once the directory entry is).  A temporary file is named
``.<name>.<pid>.tmp`` after the process writing it; a writer that fails
removes its own, one killed (``kill -9``, a power cut) leaves it, and
``remove_stale_temp_files`` removes it later once that process is gone.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

TEMP_NAME = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.tmp$")
"""``.<name>.<pid>.tmp``: the temporary file of ``name`` written by process ``pid``."""


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


def temp_path(path: Path) -> Path:
    """Where this process writes ``path`` before it is whole."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Makes the renames and creations inside ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_DURABLE_DIRS: set[Path] = set()  # made durable in their parents by this process


def make_dirs_durably(directory: str | os.PathLike[str], top: str | os.PathLike[str]) -> None:
    """Creates ``directory`` (and its missing parents) and makes its entry
    durable in its parent, and so on up to ``top`` included: ``write_durably``
    syncs the directory of the file it writes, not the directories it
    creates, and a file durable in a directory whose own entry is not is lost
    with it at a power cut.

    Every directory from ``directory`` up to ``top`` is synced into its parent
    the first time this process uses it, whether it created it or found it:
    one that a killed process created may not be durable yet.  ``top`` must
    be ``directory`` or one of its parents."""
    directory, top = Path(os.path.abspath(directory)), Path(os.path.abspath(top))
    if directory in _DURABLE_DIRS and directory.is_dir():
        return
    if directory != top and top not in directory.parents:
        raise ValueError(f"{top} is not {directory} or one of its parents")
    directory.mkdir(parents=True, exist_ok=True)
    d = directory
    while d not in _DURABLE_DIRS or d == directory:
        fsync_dir(d.parent)
        _DURABLE_DIRS.add(d)
        if d == top:
            break
        d = d.parent


def publish_durably(temp: str | os.PathLike[str], path: str | os.PathLike[str]) -> None:
    """Makes a finished temporary file durable under its final name: fsync
    the file, rename it over ``path`` (atomic: readers see the old file or
    the new one), fsync the directory.  For files written by something else
    than ``write_durably`` (pyarrow's Parquet writer)."""
    fd = os.open(temp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temp, path)
    fsync_dir(os.path.dirname(os.path.abspath(path)))


def write_durably(path: Path, data: bytes) -> None:
    """Writes ``data`` under a temporary name, fsyncs it, renames it over
    ``path`` and fsyncs the directory; creates the directory if needed.  On
    failure the temporary file is removed (a process killed meanwhile leaves
    it: see ``remove_stale_temp_files``)."""
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
    fsync_dir(path.parent)


def remove_stale_temp_files(directory: Path, *, mine_are_stale: bool = False,
                            name: str | None = None) -> list[Path]:
    """Removes the ``.<name>.<pid>.tmp`` files of ``directory`` whose writer is
    not alive, and returns them.  With ``mine_are_stale``, files named after
    this very process are removed too: only right for a caller that knows it
    has not started writing there (a pid reused by a restarted container's
    process 1 would otherwise keep them forever).  ``name`` limits the scan
    to the temporary files of that one file."""
    removed: list[Path] = []
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
