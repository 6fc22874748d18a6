"""Types of the fast appends (storage_c/_fastpath.c, loaded by storage_c/_native.py)."""

from typing import Any, Iterable, Iterator

from .records import BatchResult, Buffer, IdempotencyKey

class StreamBase:
    shards: int
    rotation: Iterator[int]
    def __init__(self, addr: int, shards: int) -> None: ...

class Appender:
    def _fast_init(self, streams: dict[str, Any], stream_type: type, batch_result: type,
                   threshold: int, raw_limit: int, compress_level: int) -> None: ...
    def append(self, stream: str, payload: Buffer, *, shard: int | None = None,
               key: str | bytes | None = None, durability: str | None = None,
               wait: bool = True) -> tuple[int, int]: ...
    def append_batch(self, stream: str, payloads: Iterable[Buffer], *, shard: int | None = None,
                     key: str | bytes | None = None, durability: str | None = None,
                     wait: bool = True) -> BatchResult: ...
    def ingest(self, stream: str, body: Buffer, format: str = "json", *, shard: int | None = None,
               key: str | bytes | None = None, durability: str | None = None,
               wait: bool = True, idempotency: IdempotencyKey | None = None) -> BatchResult: ...
