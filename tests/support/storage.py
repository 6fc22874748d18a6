"""What the storage tests share: a small config, filling a stream, reading a shard back,
and the on-disk layout of a segment (where an entry starts, a byte flipped there)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from storage_c import Config, Log

SMALL = Config(shards=4, segment_bytes=1 << 20, fsync_interval_ms=50)
SEGMENT_HEADER, ENTRY_HEADER = 64, 20  # bytes (storage_c/src/log/format.h)


def fill(log: Log, stream: str, payloads: Iterable[bytes], *, shards: int | None = None,
         shard: int | None = None, key: str | None = None, batch: int | None = None) -> None:
    """Appends ``payloads`` to ``stream`` in order: in one append, or ``batch`` to an append
    (1: an append each); into ``shard``, or the shard ``key`` maps to, or round robin.
    With ``shards``, the stream is created with that many shards first (or checked to
    have them)."""
    if shards is not None:
        log.create_stream(stream, shards)
    items = list(payloads)
    step = batch or max(1, len(items))
    for start in range(0, len(items), step):
        log.append_batch(stream, items[start: start + step], shard=shard, key=key)


def read_all(log: Log, stream: str, shard: int) -> list[tuple[int, int, bytes]]:
    """Every (entry, timestamp, payload) of a shard, in order."""
    out: list[tuple[int, int, bytes]] = []
    for batch in log.iter_entries(stream, shard):
        out.extend(zip(batch.entries, batch.timestamps, batch.payloads))
    return out


def offset_of(items: list[bytes], i: int) -> int:
    """Where entry ``i`` starts in a segment that holds ``items``, one to a frame."""
    return SEGMENT_HEADER + sum(ENTRY_HEADER + len(p) for p in items[:i])


def flip(path: Path, at: int) -> None:
    """Damages one byte of a file."""
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x5A]))
