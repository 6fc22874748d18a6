"""Every bad input: a clear error, and nothing stored is lost or added."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest

from storage_c import (
    Config,
    EntryTooLarge,
    FormatVersionError,
    Log,
    ShardCountMismatch,
    ShardRangeError,
    StreamNameError,
    StreamNotFound,
)

from .support.storage import SMALL, read_all


@pytest.mark.parametrize("name", ["../x", "a/b", "", "x" * 65, "a\0b", ".hidden", "-a", "é", "a b"])
def test_invalid_stream_names_touch_nothing(data_dir: Path, name: str) -> None:
    with Log(data_dir, SMALL) as log:
        with pytest.raises(StreamNameError) as err:
            log.append(name, b"x")
        assert "stream name" in str(err.value)
        assert log.streams() == []
    assert sorted(p.name for p in data_dir.iterdir()) == []
    assert not (data_dir.parent / "x").exists()


def test_longest_name_is_fine(log: Log) -> None:
    assert log.append("a" * 64, b"x")[1] == 0


def test_shard_out_of_range(log: Log) -> None:
    log.append("s", b"keep", shard=0)
    for bad in (4, 100, -1, 2**40):
        with pytest.raises(ShardRangeError, match="out of range"):
            log.append("s", b"x", shard=bad)
        with pytest.raises(ShardRangeError):
            log.append_batch("s", [b"x"], shard=bad)
        with pytest.raises(ShardRangeError):
            log.read("s", bad)
    assert [p for _, _, p in read_all(log, "s", 0)] == [b"keep"]


def test_entry_above_max_size_writes_nothing(data_dir: Path) -> None:
    cfg = Config(shards=1, max_entry_bytes=1024, compression_threshold=0)
    with Log(data_dir, cfg) as log:
        log.append("m", b"ok", shard=0)
        with pytest.raises(EntryTooLarge, match="1025 bytes; max_entry_bytes is 1024"):
            log.append("m", b"y" * 1025, shard=0)
        with pytest.raises(EntryTooLarge, match="entry 1 of the batch"):
            log.append_batch("m", [b"a", b"y" * 2000, b"c"], shard=0)
        with pytest.raises(EntryTooLarge, match="record 2"):
            log.append_delimited("m", b"a\n" + b"y" * 2000 + b"\nc\n", shard=0)
        assert log.append("m", b"a" * 1024, shard=0) == (0, 1)
        assert [p for _, _, p in read_all(log, "m", 0)] == [b"ok", b"a" * 1024]


def test_wrong_payload_types(log: Log) -> None:
    with pytest.raises(TypeError):
        log.append("t", "text", shard=0)  # type: ignore[arg-type]  # the wrong type tested
    with pytest.raises(TypeError):
        log.append_batch("t", [b"ok", "text"], shard=0)  # type: ignore[list-item]  # as above
    with pytest.raises(TypeError):
        log.append_batch("t", [b"ok", object()], shard=0)  # type: ignore[list-item]  # as above
    assert log.append_batch("t", [bytearray(b"ba"), memoryview(b"mv")], shard=0).count == 2
    assert [p for _, _, p in read_all(log, "t", 0)] == [b"ba", b"mv"]


def test_shard_count_is_fixed(data_dir: Path) -> None:
    with Log(data_dir, SMALL) as log:
        assert log.create_stream("fixed", 8) == 8
        log.append("fixed", b"x", shard=7)
        with pytest.raises(ShardCountMismatch, match="has 8 shards; opened with 4"):
            log.create_stream("fixed", 4)
    with Log(data_dir, SMALL) as log:
        with pytest.raises(ShardCountMismatch):
            log.create_stream("fixed", 16)
        assert log.shard_count("fixed") == 8
        assert [p for _, _, p in read_all(log, "fixed", 7)] == [b"x"]


def test_unknown_stream_without_auto_create(data_dir: Path) -> None:
    with Log(data_dir, Config(auto_create_streams=False)) as log:
        with pytest.raises(StreamNotFound, match="'nope' does not exist"):
            log.append("nope", b"x")
        with pytest.raises(StreamNotFound):
            log.read("nope", 0)
    assert not (data_dir / "nope").exists()


def bump_version(path: Path, offset: int = 4) -> None:
    """Rewrites a file header's version and fixes its checksum, as a newer
    build would have written it."""
    from storage_c import crc32c

    raw = bytearray(path.read_bytes())
    raw[offset: offset + 2] = struct.pack("<H", 99)
    crc = crc32c(bytes(raw[:60]))
    masked = (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
    raw[60:64] = struct.pack("<I", masked)
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("which", ["stream.meta", "segment", "state"])
def test_files_of_another_format_version(data_dir: Path, which: str) -> None:
    with Log(data_dir, SMALL) as log:
        log.append("v", b"precious", shard=0)
    shard_dir = data_dir / "v" / "shard-0000"
    target = {
        "stream.meta": data_dir / "v" / "stream.meta",
        "segment": shard_dir / f"{0:020d}.log",
        "state": shard_dir / "state",
    }[which]
    bump_version(target)
    before = contents(data_dir)
    with Log(data_dir, SMALL) as log:
        with pytest.raises(FormatVersionError, match=r"version 99; this build reads versions? 1"):
            log.append("v", b"x", shard=0)
        with pytest.raises(FormatVersionError):
            log.read("v", 0)
    assert contents(data_dir) == before  # nothing was written, renamed or set aside


def contents(data_dir: Path) -> dict[Path, bytes]:
    """Every file's bytes; of a shard's state, its header, points and counters only
    (FORMAT.md): its lock words and clean-close mark are an opener's to reset before
    anything else, whatever it finds next."""
    files = {p: p.read_bytes() for p in data_dir.rglob("*") if p.is_file()}
    return {p: b[:64] + b[192:576] if p.name == "state" else b for p, b in files.items()}


def test_bad_config_values(data_dir: Path) -> None:
    from storage_c import InvalidArgument

    from storage_c._comet import ffi, lib

    settings: list[dict[str, Any]] = [
        {"segment_bytes": 10}, {"max_entry_bytes": 0}, {"process_count": 0}, {"shards": 0},
        {"fsync_interval_ms": 0}, {"segment_bytes": 1 << 20, "retention_max_total_bytes": 1 << 20}]
    for bad in settings:
        with pytest.raises(InvalidArgument):   # where the setting is made, before any open
            Config(**bad)
    with pytest.raises(ValueError):
        Config(durability="sometimes")  # type: ignore[arg-type]  # the wrong value tested
    with pytest.raises(ValueError, match="out of range"):
        Config(segment_bytes=-1)
    cfg = Config().to_c()                      # the C core checks again at open
    cfg.segment_bytes = 10
    assert lib.comet_open(str(data_dir).encode(), cfg, ffi.new("comet_db **")) == lib.COMET_E_INVALID
    assert not data_dir.exists() or not any(data_dir.iterdir())


def test_closed_log(data_dir: Path) -> None:
    from storage_c import Closed

    log = Log(data_dir, SMALL)
    log.append("c", b"x", shard=0)
    log.close()
    log.close()
    with pytest.raises(Closed):
        log.append("c", b"y", shard=0)
    with pytest.raises(Closed):
        log.read("c", 0)
