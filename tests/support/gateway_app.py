"""The gateway in the test's own process (Starlette's TestClient): a small
configuration, and what a stream holds afterwards."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gateway.config import GatewayConfig
from storage_c import Config, Log

STORAGE = Config(shards=4, segment_bytes=1 << 20)
JSON = {"content-type": "application/json"}
NDJSON = {"content-type": "application/x-ndjson"}


def config(data_dir: Path, **kw: Any) -> GatewayConfig:
    """One worker on ``data_dir`` with STORAGE, no access log; ``kw`` overrides."""
    base: dict[str, Any] = dict(data_dir=str(data_dir), workers=1, storage=STORAGE,
                                slot_wait_s=5.0, access_log=False)
    base.update(kw)
    return GatewayConfig(**base)


def in_shard(data_dir: Path, stream: str, shard: int) -> list[bytes]:
    """Every payload of one shard, in entry order."""
    with Log(data_dir, STORAGE) as log:
        return [p for batch in log.iter_entries(stream, shard) for p in batch.payloads]


def stored(data_dir: Path, stream: str) -> list[bytes]:
    """Every payload of the stream, shard after shard ([] if there is no such stream)."""
    with Log(data_dir, STORAGE) as log:
        if stream not in log.streams():
            return []
        count = log.shard_count(stream)
    return [p for shard in range(count) for p in in_shard(data_dir, stream, shard)]
