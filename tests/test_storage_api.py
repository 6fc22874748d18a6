"""What the packages above the storage need from it is public storage_c API: the open
presets (a consumer opens a path as a reader), group names and group lag, durable
files, crc32c."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from comet.cli import main
from comet.files import publish_durably, write_durably
from storage_c import Config, GroupLag, GroupNameError, Log, check_group_name


# ---- open presets -----------------------------------------------------------------------


def test_open_presets() -> None:
    reader, inspector, writer = Config.reader(), Config.inspector(), Config.writer(shards=2)
    assert (reader.create, reader.auto_create_streams, reader.background_flush,
            reader.retention_interval_ms) == (False, False, True, 0)
    assert (inspector.create, inspector.auto_create_streams, inspector.background_flush) == \
        (False, False, False)
    assert writer == Config(shards=2)
    assert Config.reader(fsync_interval_ms=50).fsync_interval_ms == 50


def test_a_consumer_opens_a_path_as_a_reader(data_dir: Path, tmp_path: Path) -> None:
    from consumers import Consumer

    with Log(data_dir, Config(shards=1)) as log:
        log.append("ev", b"{}")
    with Consumer(str(data_dir), "ev", "g") as c:
        assert c.log.config == Config.reader()
    with pytest.raises(Exception, match="nope"):  # a mistyped path creates nothing
        Consumer(str(tmp_path / "nope"), "ev", "g")
    assert not (tmp_path / "nope").exists()


def test_comet_consume_runs_with_the_ack_flusher(data_dir: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import consumers.consumer

    with Log(data_dir, Config(shards=1)) as log:
        log.append_batch("ev", [b'{"n":1}', b'{"n":2}'])
    opened: list[Config] = []

    class Spy(Log):
        def __init__(self, path: str, config: Config | None = None) -> None:
            opened.append(config or Config())
            super().__init__(path, config)

    monkeypatch.setattr(consumers.consumer, "Log", Spy)
    out = CliRunner().invoke(main, ["consume", str(data_dir), "ev", "--group", "g"])
    assert out.exit_code == 0, out.output
    assert len(out.output.splitlines()) == 2
    assert [c.background_flush for c in opened] == [True]
    with Log(data_dir, Config.inspector()) as log:
        assert [g.offset for g in log.groups("ev")] == [2]


def test_comet_consume_refuses_a_missing_directory(tmp_path: Path) -> None:
    out = CliRunner().invoke(main, ["consume", str(tmp_path / "nope"), "ev", "--group", "g"])
    assert out.exit_code == 1 and "is not a directory" in out.output
    assert not (tmp_path / "nope").exists()


# ---- group names, lag, durable files ---------------------------------------------------------


def test_group_names_are_checked_by_storage_c() -> None:
    check_group_name("ship-2.a_b")
    for bad in ("", "a b", "x" * 48, "é"):
        with pytest.raises(GroupNameError):
            check_group_name(bad)


def test_group_lag_sums_a_group_over_its_shards(data_dir: Path) -> None:
    with Log(data_dir, Config(shards=3)) as log:
        for shard in range(3):
            log.append_batch("ev", [b"{}"] * 10, shard=shard)
        log.group("ev", 0, "a").ack(3)
        log.group("ev", 2, "a")
        log.group("ev", 1, "b").ack(9)
        lag = log.stats("ev").group_lag()
    assert list(lag) == ["a", "b"]
    assert (lag["a"].shards, lag["a"].lag) == (2, 6 + 10)
    assert lag["a"].last_ack_ns > 0
    assert lag["b"] == GroupLag("b", 1, 0, lag["b"].last_ack_ns)


def test_durable_writes(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b.json"
    write_durably(target, b"one")
    write_durably(target, b"two")
    assert target.read_bytes() == b"two" and os.listdir(target.parent) == ["b.json"]
    temp = tmp_path / "a" / ".c.tmp"
    temp.write_bytes(b"whole")
    publish_durably(temp, tmp_path / "a" / "c")
    assert (tmp_path / "a" / "c").read_bytes() == b"whole" and not temp.exists()


def test_crc32c_is_public() -> None:
    """What a benchmark or a tool calls instead of storage_c._comet."""
    from storage_c import crc32c

    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    assert crc32c(b"6789", crc32c(b"12345")) == crc32c(b"123456789")
    assert crc32c(b"") == 0
