"""The intent journal of ``comet ship``: what makes an age cut exactly once.

Before an object is uploaded, the shipper records its range and key here,
one file per shard; the OTLP forwarder, which has several requests of a
shard in flight, records the batches it cut by age, a list per shard::

    <state>/<group>/<stream>/shard-NNNN.intent     {"first": F, "last": L, "key": K}
    <state>/<group>/<stream>/shard-NNNN.batches    [{"first": F, "last": L, "key": K}, ...]
    <state>/<group>/<stream>/shard-NNNN.lock       held (flock) by the process shipping the shard
    <state>/<group>/<stream>/stream.created        the stream's creation time (ns)

(``<state>`` is ``<data>/.ship`` by default.)  A rerun that finds an intent
whose first entry is the group's offset rebuilds exactly that object before
anything else; an intent behind the offset was acknowledged already, or the
group was reset, and is dropped.  Files are written whole or not at all
(``comet.files.write_durably``), in directories made durable in their
parents first; a writer killed meanwhile leaves a temporary file that
``remove_stale_temp_files`` removes on the next start.

``stream.created`` ties the journal to one incarnation of the stream: a
stream deleted and created again reuses shard and entry numbers, so its
objects would take the old objects' keys (``StreamRecreated``).
"""

from __future__ import annotations

import errno
import fcntl
import os
from dataclasses import dataclass
from pathlib import Path

import orjson

from comet.files import make_dirs_durably, remove_stale_temp_files, write_durably


class ShardBusy(RuntimeError):
    """Another process ships this shard for this group: two would send every
    batch twice."""


class StreamRecreated(ValueError):
    """The stream was deleted and created again since this group last shipped
    it: its objects would take the old stream's keys (the same shards and
    entry numbers), overwriting what was shipped before."""


@dataclass(frozen=True)
class Intent:
    """The object a shard's shipper decided on: entries ``first``..``last``
    (inclusive), stored under ``key``."""

    first: int
    last: int
    key: str


class IntentJournal:
    """The intents of one group on one stream, under ``state_root``."""

    def __init__(self, state_root: Path, group: str, stream: str) -> None:
        self.state_root = state_root
        self.group = group
        self.stream = stream
        self.directory = state_root / group / stream

    def path(self, shard: int) -> Path:
        return self.directory / f"shard-{shard:04d}.intent"

    def write(self, shard: int, intent: Intent) -> None:
        """Records ``intent`` durably, replacing the shard's previous one."""
        make_dirs_durably(self.directory, self.state_root)
        write_durably(self.path(shard), orjson.dumps(
            {"first": intent.first, "last": intent.last, "key": intent.key}))

    def read(self, shard: int) -> Intent | None:
        """The shard's last intent (None: there is none); a ValueError when
        the file is damaged (it is written whole: only the disk can)."""
        path = self.path(shard)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            doc = orjson.loads(data)
            return Intent(int(doc["first"]), int(doc["last"]), str(doc["key"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"intent {path} is damaged ({exc}): remove it and check the "
                             "sink for an object of that shard past the group's offset") from None

    def drop(self, shard: int) -> None:
        self.path(shard).unlink(missing_ok=True)

    def batches_path(self, shard: int) -> Path:
        return self.directory / f"shard-{shard:04d}.batches"

    def write_batches(self, shard: int, intents: list[Intent]) -> None:
        """Records the shard's batches in flight that were cut by age, whole."""
        make_dirs_durably(self.directory, self.state_root)
        write_durably(self.batches_path(shard), orjson.dumps(
            [{"first": i.first, "last": i.last, "key": i.key} for i in intents]))

    def read_batches(self, shard: int) -> list[Intent]:
        """The shard's recorded batches, by first entry (a ValueError when damaged)."""
        path = self.batches_path(shard)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return []
        try:
            items = [Intent(int(d["first"]), int(d["last"]), str(d["key"])) for d in orjson.loads(data)]
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"batch intents {path} are damaged ({exc}): remove the file; the "
                             "batches it named may then reach the backend twice") from None
        return sorted(items, key=lambda i: i.first)

    def remove_stale_batch_temp_files(self, shard: int) -> list[Path]:
        return remove_stale_temp_files(self.directory, mine_are_stale=True,
                                       name=self.batches_path(shard).name)

    def claim(self, shard: int) -> int:
        """Takes the shard's lock for this process (a descriptor to keep open),
        or raises ShardBusy naming the process that holds it."""
        make_dirs_durably(self.directory, self.state_root)
        path = self.directory / f"shard-{shard:04d}.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "another process"
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EACCES):
                raise ShardBusy(f"group {self.group!r} already ships shard {shard} of stream "
                                f"{self.stream!r} (pid {holder}, lock {path}): run one shipper "
                                "per group and shard, or split shards with --assignment") from None
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, b"%d\n" % os.getpid(), 0)
        return fd

    def remove_stale_temp_files(self, shard: int) -> list[Path]:
        """Removes what a writer of the shard's intent left when it was killed.
        This process's own are stale too: it has not started writing."""
        return remove_stale_temp_files(self.directory, mine_are_stale=True,
                                       name=self.path(shard).name)

    def check_incarnation(self, created_ns: int, *, replace: bool = False) -> bool:
        """Records the stream's creation time on first use.  When the stream
        was created again since: raises StreamRecreated, or with ``replace``
        (a shipper whose outputs name the incarnation) records the new one
        and returns True: the journal's other records are of the old stream."""
        marker = self.directory / "stream.created"
        try:
            seen = int(marker.read_text())
        except (FileNotFoundError, ValueError):
            make_dirs_durably(self.directory, self.state_root)
            write_durably(marker, b"%d" % created_ns)
            return False
        if seen == created_ns:
            return False
        if replace:
            write_durably(marker, b"%d" % created_ns)
            return True
        raise StreamRecreated(
            f"stream {self.stream!r} was deleted and created again since group "
            f"{self.group!r} last shipped it; its objects would overwrite the old "
            f"stream's (same keys): ship it to another prefix of the sink, then remove "
            f"{self.directory} to start this group's record anew")
