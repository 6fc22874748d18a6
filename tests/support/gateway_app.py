"""The gateway app in process (Starlette's TestClient): the config the tests start it
with, the content-type headers they post with, and what a stream holds afterwards."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gateway.config import GatewayConfig
from storage_c import Config, Log

from .storage import read_all

STORAGE = Config(shards=4, segment_bytes=1 << 20)
JSON = {"content-type": "application/json"}
NDJSON = {"content-type": "application/x-ndjson"}


def config(data_dir: Path, **kw: Any) -> GatewayConfig:
    """One worker on ``data_dir`` with STORAGE, no access log; ``kw`` overrides."""
    base: dict[str, Any] = dict(data_dir=str(data_dir), workers=1, storage=STORAGE, slot_wait_s=5.0,
                                access_log=False)
    base.update(kw)
    return GatewayConfig(**base)


def stored(data_dir: Path, stream: str) -> list[bytes]:
    """Every payload of ``stream``, shard by shard ([] when there is no such stream)."""
    with Log(data_dir, STORAGE) as log:
        if stream not in log.streams():
            return []
        return [p for shard in range(log.shard_count(stream)) for _, _, p in read_all(log, stream, shard)]


def in_shard(data_dir: Path, stream: str, shard: int) -> list[bytes]:
    """Every payload of one shard of ``stream``."""
    with Log(data_dir, STORAGE) as log:
        return [p for _, _, p in read_all(log, stream, shard)]
