"""One ``comet spark-ship`` per lake, stream and group at a time.

Two runs of one shipper at once would plan the same run number from the
same offsets; the Delta app transaction would refuse the second commit, but
only after both had done all the work.  So a run takes a lock before it
plans, and a second run gets a clear refusal (``LakeBusy``) and changes
nothing.

A local lake's lock is ``flock`` on ``_comet/locks/<stream>/<group>.lock``:
the kernel releases it when the process dies, however it dies, so a killed
run never leaves it held.  The file says who holds it, for the message.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from typing import Iterator

from .lakefs import Lake

LOCKS_DIR = "_comet/locks"


class LakeBusy(RuntimeError):
    """Another run of the same shipper holds the lock."""


def lock_rel(stream: str, group: str) -> str:
    return f"{LOCKS_DIR}/{stream}/{group}.lock"


def holder_text(stream: str, group: str) -> bytes:
    return json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                       "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                       "stream": stream, "group": group}).encode()


def busy_message(lake: Lake, stream: str, group: str, holder: bytes) -> str:
    try:
        who = json.loads(holder)
        by = f" (pid {who['pid']} on {who['host']}, since {who['since']})"
    except (ValueError, KeyError, TypeError):
        by = ""
    return (f"another comet spark-ship{by} is shipping stream {stream!r} with group {group!r} "
            f"into {lake.url}: one run at a time; this one changed nothing")


@contextlib.contextmanager
def run_lock(lake: Lake, stream: str, group: str, single_writer: bool = False) -> Iterator[None]:
    """Holds the shipper's lock for the block, or raises LakeBusy
    (``single_writer``: see ``s3lock.py``)."""
    if lake.is_s3:
        from .s3lock import s3_lease

        with s3_lease(lake, stream, group, single_writer):
            yield
        return
    path = lake.path(lock_rel(stream, group))
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
