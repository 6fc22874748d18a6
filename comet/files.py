"""Files that are either absent or whole, even across a power cut, for every
package above the storage: ``comet ship``'s intents and directory sink, the
Spark lake's plans and Parquet files.

The recipe is written once, here: write under a temporary name, fsync the
file, rename it over the final name, fsync the directory (the rename is only
durable once the directory entry is).  A temporary file is named
``.<name>.<pid>.tmp`` after the process writing it; a writer that fails
removes its own, one killed (``kill -9``, a power cut) leaves it, and
``remove_stale_temp_files`` removes it later once that process is gone.  That
one helper, with one rule, cleans up after ``comet ship`` and ``comet
spark-ship`` alike.
"""

from __future__ import annotations

import grp
import os
import re
import stat
import time
from pathlib import Path

TEMP_NAME = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.tmp$")
"""``.<name>.<pid>.tmp``: the temporary file of ``name`` written by process ``pid``."""

STALE_TEMP_AGE_S = 3600.0
"""A temporary file older than this is stale whoever its pid names: a writer
renames its file within seconds (one fsync), so a live process under that
pid an hour on is another one that reused it (a restarted container's
process 1, say)."""


def share_data_dir(directory: str | os.PathLike[str], group: str) -> None:
    """Shares a data directory (made if missing) with ``group``: owned by that
    group, mode 02770.  The set-group-ID bit makes what the storage creates in
    it the group's as well, with the group's read and write (storage_c/FORMAT.md,
    Modes); without it everything is the owner's alone (0700, 0600).  KeyError
    for a group that does not exist."""
    gid = grp.getgrnam(group).gr_gid
    os.makedirs(directory, mode=0o700, exist_ok=True)
    st = os.stat(directory)
    if st.st_gid != gid:
        os.chown(directory, -1, gid)
    if stat.S_IMODE(st.st_mode) != 0o2770:
        os.chmod(directory, 0o2770)


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
    """Removes the ``.<name>.<pid>.tmp`` files of ``directory`` that no writer
    will finish, and returns them.  A file is stale when

    - the process its pid names is not alive (gone, or a zombie), or
    - it is older than ``STALE_TEMP_AGE_S``, whoever its pid names.

    Files named after this very process are kept unless ``mine_are_stale``:
    only right for a caller that knows it has not started writing there.
    ``name`` limits the scan to the temporary files of that one file."""
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
        if not _is_stale(entry, int(m["pid"]), me, mine_are_stale):
            continue
        try:
            os.unlink(entry.path)
        except FileNotFoundError:
            continue
        removed.append(Path(entry.path))
    return removed


def _is_stale(entry: os.DirEntry[str], pid: int, me: int, mine_are_stale: bool) -> bool:
    try:
        age = time.time() - entry.stat(follow_symlinks=False).st_mtime
    except FileNotFoundError:
        return False  # removed meanwhile: nothing to do
    if age > STALE_TEMP_AGE_S:
        return True
    if pid == me:
        return mine_are_stale
    return not pid_alive(pid)
