"""The comet command line: stat, tail, verify."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from comet.cli import main
from storage_c import Config, Log

from .support.storage import flip, offset_of


def two_streams(data_dir: Path) -> None:
    """30 events alternating over the 2 shards of "events", one binary entry in "other"."""
    with Log(data_dir, Config(shards=2, segment_bytes=1 << 20)) as log:
        for i in range(30):
            log.append("events", b'{"n": %d}' % i, shard=i % 2)
        log.append("other", b"\xff\xfebinary", shard=0)


def test_stat(data_dir: Path) -> None:
    two_streams(data_dir)
    result = CliRunner().invoke(main, ["stat", str(data_dir), "--shards"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split()[:3] == ["STREAM", "SHARDS", "ENTRIES"]
    assert lines[1].split()[:3] == ["events", "2", "30"]
    assert any(line.split()[:4] == ["events", "1", "0", "15"] for line in lines)
    with Log(data_dir) as log:
        log.group("events", 1, "indexer").ack(4)
    as_json = json.loads(CliRunner().invoke(main, ["stat", str(data_dir), "--json"]).output)
    assert sum(s["next_entry"] for s in as_json["events"]["shards"]) == 30
    [group] = as_json["events"]["groups"]
    assert (group["name"], group["shard"], group["offset"], group["lag"]) == ("indexer", 1, 5, 10)


def test_tail(data_dir: Path) -> None:
    two_streams(data_dir)
    result = CliRunner().invoke(main, ["tail", str(data_dir), "events", "-n", "3"])
    assert result.exit_code == 0, result.output
    ids = [line.split("\t")[0] for line in result.output.splitlines()]
    assert ids == ["1-13", "0-14", "1-14"]
    assert result.output.splitlines()[-1].endswith('{"n": 29}')
    one = CliRunner().invoke(main, ["tail", str(data_dir), "events", "--shard", "0",
                                    "--from-entry", "2", "-n", "2"])
    assert [line.split("\t")[2] for line in one.output.splitlines()] == ['{"n": 4}', '{"n": 6}']
    binary = CliRunner().invoke(main, ["tail", str(data_dir), "other"])
    assert "\\xff\\xfebinary" in binary.output


def test_verify_and_exit_status(data_dir: Path) -> None:
    two_streams(data_dir)
    ok = CliRunner().invoke(main, ["verify", str(data_dir)])
    assert ok.exit_code == 0 and "31 good entries" in ok.output and "0 damaged" in ok.output
    items = [b'{"n": %d}' % i for i in range(0, 30, 2)]
    flip(data_dir / "events" / "shard-0000" / f"{0:020d}.log", offset_of(items, 5) + 22)
    bad = CliRunner().invoke(main, ["verify", str(data_dir)])
    assert bad.exit_code == 1
    assert "damaged: stream events shard 0 entry 5" in bad.output


def test_errors_are_clear(tmp_path: Path) -> None:
    missing = CliRunner().invoke(main, ["stat", str(tmp_path / "nope")])
    assert missing.exit_code != 0 and "is not a directory" in missing.output
    (tmp_path / "d").mkdir()
    unknown = CliRunner().invoke(main, ["tail", str(tmp_path / "d"), "ghost"])
    assert unknown.exit_code != 0 and "stream 'ghost' does not exist" in unknown.output
    assert not (tmp_path / "d" / "ghost").exists()


def test_installed_entry_point(data_dir: Path) -> None:
    two_streams(data_dir)
    comet = Path(sys.executable).with_name("comet")
    out = subprocess.run([str(comet), "stat", str(data_dir)], capture_output=True, text=True,
                         check=True).stdout
    assert "events" in out and "other" in out


def test_stat_changes_no_counter(data_dir: Path) -> None:
    """An inspector's open checks every shard's tail; on a healthy directory that
    counts no recovery, nor anything else: three runs of ``comet stat`` print the
    same counters, RECOVERIES 0."""
    two_streams(data_dir)
    comet = Path(sys.executable).with_name("comet")
    runs = [subprocess.run([str(comet), "stat", str(data_dir), "--json"], capture_output=True,
                           text=True, check=True).stdout for _ in range(3)]
    assert runs[0] == runs[1] == runs[2]
    shards = json.loads(runs[0])["events"]["shards"]
    assert [s["recoveries"] for s in shards] == [0, 0]
    table = CliRunner().invoke(main, ["stat", str(data_dir), "--shards"]).output.splitlines()
    at = next(i for i, line in enumerate(table) if "RECOVERIES" in line)
    assert table[at].split()[-3] == "RECOVERIES"  # then LOCK DIED, two words, one value
    assert [row.split()[-2] for row in table[at + 1:]] == ["0"] * 4  # events and other


def test_version(tmp_path: Path) -> None:
    """``comet --version``: the installed package's version and the core's API and
    on-disk format versions."""
    from importlib.metadata import version

    from storage_c._comet import lib

    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output == (f"comet-edge {version('comet-edge')}: storage core API "
                             f"{lib.COMET_API_VERSION}, data format {lib.COMET_FORMAT_VERSION}, "
                             f"segment format {lib.COMET_SEGMENT_VERSION}\n")
    assert lib.COMET_API_VERSION == 2 and lib.COMET_FORMAT_VERSION == 1
