"""Delta commits into a single-writer S3 lake: through a local copy of the log.

delta-rs 1.6 writes every commit file to S3 with ``If-None-Match: *`` (a PUT
only if absent), whatever its storage options say (``AWS_S3_ALLOW_UNSAFE_RENAME``,
``conditional_put=disabled`` and ``copy_if_not_exists`` all still end in that
PUT or in an error), so a store that refuses the condition (OpenStack Swift
2.30's s3api: 501 NotImplemented) refuses every commit.  A lake whose user
vouches for one writer (``Lake.single_writer``) is committed to here
instead: the table's log from its last checkpoint on is copied into a
temporary directory, delta-rs commits there (on a local filesystem, "only
if absent" is the filesystem's own), and the log files it added are
uploaded with plain PUTs: the commits first, then checkpoints, then
``_last_checkpoint``.  A commit that is on the store by then (another
writer, or a listing that had not shown it yet) is never overwritten: the
caller commits again on the log as it is (``LogMoved``).

Only for operations that write nothing but log files: adding a run's
files, adding columns, checkpoints.
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import re
import tempfile
from typing import Iterator

import pyarrow.fs as pafs

from .lakefs import Lake

LOG_DIR = "_delta_log"
LAST_CHECKPOINT = "_last_checkpoint"
_VERSIONED = re.compile(r"^(\d{20})\.(json|crc|checkpoint(\.\d+\.\d+)?\.parquet)$")


class LogMoved(Exception):
    """The store has a commit the local copy did not: commit again on the log as it is."""


@contextlib.contextmanager
def local_log(lake: Lake, rel: str) -> Iterator[str]:
    """A local table root whose ``_delta_log`` is a copy of the lake's table
    at ``rel`` (under the lake root; "" for the lake's own); the log files
    added there are uploaded when the block ends without an error."""
    log_rel = posixpath.join(rel, LOG_DIR) if rel else LOG_DIR
    with tempfile.TemporaryDirectory(prefix="comet-delta-log-") as root:
        local = os.path.join(root, LOG_DIR)
        os.mkdir(local)
        pulled = _pull(lake, log_rel, local)
        yield root
        _push(lake, log_rel, local, pulled)


def _pull(lake: Lake, log_rel: str, local: str) -> dict[str, bytes]:
    """Copies the log from its last checkpoint on; what it copied."""
    names = lake.list(log_rel)
    start = 0
    if LAST_CHECKPOINT in names:
        last = lake.read(f"{log_rel}/{LAST_CHECKPOINT}")
        start = int(json.loads(last)["version"]) if last else 0
    pulled = {}
    for name in names:
        match = _VERSIONED.match(name)
        if name != LAST_CHECKPOINT and not (match and int(match.group(1)) >= start):
            continue
        data = lake.read(f"{log_rel}/{name}")
        if data is None:
            continue  # removed meanwhile (an old one, by a log cleanup)
        with open(os.path.join(local, name), "wb") as f:
            f.write(data)
        pulled[name] = data
    return pulled


def _push(lake: Lake, log_rel: str, local: str, pulled: dict[str, bytes]) -> None:
    added = {}
    for name in os.listdir(local):
        if name == LAST_CHECKPOINT or _VERSIONED.match(name):
            with open(os.path.join(local, name), "rb") as f:
                data = f.read()
            if pulled.get(name) != data:
                added[name] = data
    commits = sorted(n for n in added if n.endswith(".json"))
    for name in commits:
        if lake.fs.get_file_info(lake.path(log_rel, name)).type != pafs.FileType.NotFound:
            raise LogMoved(f"{lake.uri(log_rel, name)} was written by another writer")
    rest = sorted(n for n in added if n not in commits and n != LAST_CHECKPOINT)
    for name in commits + rest + ([LAST_CHECKPOINT] if LAST_CHECKPOINT in added else []):
        lake.write_atomically(f"{log_rel}/{name}", added[name])
