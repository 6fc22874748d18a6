"""What tenants (tokens) share in a data directory, kept apart: the streams
they may create, and the shard an Idempotency-Key's batch went to.

Stream creation.  ``max_streams`` counts the streams writes create; the
streams the operator named (the OTLP streams, ``[streams.NAME]``) may always
be created on top, so that no tenant can take their room.  A token without
the admin scope may create at most ``streams_per_token`` of them.  Who made a
stream is remembered as an empty file ``<data>/.gateway/creators/<token>/<stream>``
(``<token>``: a hash of the token's name); a creator's count is the streams
of its directory that still exist.  Counting and creating happen under one
``flock`` on ``.gateway/creators.lock``, a file only the gateway's user (and
data_group) can open, so that workers creating at once cannot pass a limit
together.

Retries to the shard of the first attempt.  A request with an
Idempotency-Key goes to the shard of its partition key (X-Comet-Key), else of
the key; a retry that carries another partition key would reach another
shard, where its key is unknown, and be stored again.  So the shard of each
key's first attempt is kept in ``.gateway/idempotency-shards`` (a table of
SLOTS records of 32 bytes, mapped by every worker, read and claimed under
``flock``), and every attempt within the key's window goes there: the
storage then decides, under that shard's lock, that one stores and the
others get its answer.  The table forgets a key whose slot a later key took
(one slot per key hash); such a retry with another partition key is stored
again, as before.
"""

from __future__ import annotations

import fcntl
import hashlib
import mmap
import os
import struct
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

from .metrics import metrics_dir


@contextmanager
def _flocked(path: Path) -> Iterator[int]:
    """An exclusive flock on ``path`` (made 0600 if missing) for the block."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)  # and the lock with it


class Creators:
    """Which token created which stream (see the module's docstring)."""

    def __init__(self, data_dir: str | os.PathLike[str]) -> None:
        self.root = metrics_dir(data_dir) / "creators"

    @contextmanager
    def locked(self) -> Iterator[None]:
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        with _flocked(self.root.with_suffix(".lock")):
            yield

    def _dir(self, token: str) -> Path:
        return self.root / hashlib.sha256(token.encode()).hexdigest()[:32]

    def count(self, token: str, existing: Iterable[str]) -> int:
        """The streams ``token`` created that still exist."""
        try:
            mine = set(os.listdir(self._dir(token)))
        except FileNotFoundError:
            return 0
        return len(mine.intersection(existing))

    def record(self, token: str | None, stream: str) -> None:
        """``token`` (None: no token) created ``stream``; an earlier creator of a
        stream of that name (deleted since) no longer counts it."""
        for other in (self.root.iterdir() if self.root.is_dir() else ()):
            if other.is_dir():
                (other / stream).unlink(missing_ok=True)
        if token is not None:
            mine = self._dir(token)
            mine.mkdir(mode=0o700, exist_ok=True)
            (mine / stream).touch(mode=0o600)


SLOTS = 1 << 16
RECORD = struct.Struct("<16sIIq")  # key hash, shard + 1, zero, expiry (unix ns)


class IdempotencyShards:
    """The shard of each Idempotency-Key's first attempt (see the module's docstring)."""

    def __init__(self, data_dir: str | os.PathLike[str]) -> None:
        self.path = metrics_dir(data_dir) / "idempotency-shards"
        self._fd = -1
        self._map: mmap.mmap | None = None
        self._lock = threading.Lock()  # the flock is the file description's: threads share it

    def _mapped(self) -> mmap.mmap:
        if self._map is None:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                if os.fstat(fd).st_size != SLOTS * RECORD.size:
                    os.ftruncate(fd, SLOTS * RECORD.size)
                self._map = mmap.mmap(fd, SLOTS * RECORD.size)
            except BaseException:
                os.close(fd)
                raise
            self._fd = fd
        return self._map

    def shard_of(self, key: bytes, shard: int, shards: int, window_s: float) -> int:
        """The shard the first attempt of ``key`` (16 bytes, the stream's and the
        scoped key's hash) went to within ``window_s``, else ``shard``, which
        this attempt claims for the key."""
        at = int.from_bytes(key[:8], "little") % SLOTS * RECORD.size
        now = time.time_ns()
        with self._lock:
            table = self._mapped()
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                held, plus_one, _, expires = RECORD.unpack_from(table, at)
                if held == key and expires > now and 0 < plus_one <= shards:
                    return int(plus_one) - 1
                RECORD.pack_into(table, at, key, shard + 1, 0, now + int(window_s * 1e9))
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        return shard

    def close(self) -> None:
        with self._lock:
            if self._map is not None:
                self._map.close()
                os.close(self._fd)
                self._map, self._fd = None, -1
