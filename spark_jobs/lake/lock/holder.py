"""What every lock of a shipper (the local ``flock``, the S3 lease) shares: where
it is in the lake, the note saying who holds it, and the refusal a second
run gets (``LakeBusy``)."""

from __future__ import annotations

import json
import os
import socket
import time

from ..lakefs import Lake

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
