"""One ``comet spark-ship`` per lake, stream and group at a time.

Two runs of one shipper at once would plan the same run number from the
same offsets; the Delta app transaction would refuse the second commit, but
only after both had done all the work.  So a run takes a lock before it
plans, and a second run gets a clear refusal (``LakeBusy``) and changes
nothing.

A local lake's lock is ``flock`` on ``_comet/locks/<stream>/<group>.lock``:
the kernel releases it when the process dies, however it dies, so a killed
run never leaves it held.  The file says who holds it, for the message.
An S3 lake's is a lease (``s3lease.py``); what both share, ``holder.py``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from typing import Iterator

from ..lakefs import Lake
from .holder import LakeBusy, busy_message, holder_text, lock_rel


@contextlib.contextmanager
def run_lock(lake: Lake, stream: str, group: str) -> Iterator[None]:
    """Holds the shipper's lock for the block, or raises LakeBusy (on S3,
    NoConditionalWrites too: ``s3lease.py``)."""
    if lake.is_s3:
        from .s3lease import s3_lease

        with s3_lease(lake, stream, group):
            yield
        return
    path = lake.path(lock_rel(stream, group))
    new_lake = not os.path.exists(lake.root)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LakeBusy(busy_message(lake, stream, group, os.pread(fd, 4096, 0))) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, holder_text(stream, group), 0)
        yield
    finally:
        os.close(fd)  # and the lock with it
        if new_lake:
            _remove_if_only_the_lock(lake.root, path)


def _remove_if_only_the_lock(root: str, lock: str) -> None:
    """A run that made the lake's directory for its lock and then stopped
    before writing anything (a schema Spark refused) leaves no lake behind.
    (Another run that opened this lock file meanwhile was refused, or holds
    it on a lake with nothing in it: the app transaction still refuses a
    second commit of a run.)"""
    for directory, _, names in os.walk(root):
        if any(os.path.join(directory, name) != lock for name in names):
            return
    shutil.rmtree(root, ignore_errors=True)
