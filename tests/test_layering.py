"""One house: storage_c is the bottom and imports nothing above it; every
package owns its commands, loaded lazily by `comet`; what the packages above
need from the storage (group names, open presets, durable files, group lag,
the envelope and the object layout) is public storage_c API."""

from __future__ import annotations

import ast
import base64
import json
import os
import subprocess
import sys
import textwrap
from importlib.metadata import EntryPoint
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from storage_c import Config, GroupLag, GroupNameError, Log, check_group_name
from storage_c.cli import main
from storage_c.export import (
    envelope,
    is_plain_json,
    json_value,
    ndjson_batch_ok,
    ndjson_line,
    partition_path,
    payload_of,
    reads_as_envelope,
)
from storage_c.files import publish_durably, write_durably

REPO = Path(__file__).resolve().parent.parent
ABOVE = ("consumers", "gateway", "spark_jobs")
HEAVY = ("pyspark", "starlette", "boto3", "botocore", "pyarrow", "uvicorn", "gunicorn")


def imported_modules(path: Path) -> set[str]:
    """Every module a source file imports (at any level, lazily or not)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


# ---- layering ---------------------------------------------------------------------------


def test_storage_c_imports_nothing_above_it() -> None:
    for source in sorted((REPO / "storage_c").glob("*.py")):
        above = {m for m in imported_modules(source) if m.split(".")[0] in ABOVE}
        assert not above, f"{source.name} imports {sorted(above)}"


def test_nothing_above_storage_c_uses_its_c_binding() -> None:
    for package in ABOVE:
        for source in sorted((REPO / package).rglob("*.py")):
            assert not {m for m in imported_modules(source) if m.startswith("storage_c._")}, \
                f"{source.relative_to(REPO)} uses storage_c's private modules"


def test_spark_submit_script_does_not_go_back_through_the_comet_group() -> None:
    assert "storage_c.cli" not in imported_modules(REPO / "spark_jobs" / "submit.py")
    loaded = modules_after("import spark_jobs.submit")
    assert "storage_c.cli" not in loaded and "spark_jobs.cli" in loaded


def modules_after(code: str, *argv: str) -> set[str]:
    """The modules loaded in a fresh interpreter after ``code`` runs."""
    probe = textwrap.dedent(f"""
        import json, sys
        sys.argv = ["comet", *{list(argv)!r}]
        try:
            {code}
        except SystemExit:
            pass
        sys.stdout.flush()
        print("\\nMODULES=" + json.dumps(sorted(sys.modules)))
    """)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stdout.rsplit("MODULES=", 1)[1]))


def forbidden(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m.split(".")[0] in HEAVY + ABOVE)


@pytest.mark.parametrize("args", [["stat", "--help"], ["stat", "{data}"], ["--help"]])
def test_comet_stat_loads_no_other_package(args: list[str], data_dir: Path) -> None:
    """`comet stat` (and `comet --help`, which lists every command) import
    neither Spark, Starlette nor boto3; `comet stat` not even the packages
    above the storage."""
    with Log(data_dir, Config(shards=1)) as log:
        log.append("ev", b"{}")
    argv = [a.format(data=data_dir) for a in args]
    loaded = modules_after("from storage_c.cli import main; main()", *argv)
    if args[0] == "stat":
        assert forbidden(loaded) == []
    else:  # --help imports each package's command module, nothing heavy
        assert [m for m in forbidden(loaded) if m.split(".")[0] in HEAVY] == []


def test_installed_comet_stat_under_importtime(data_dir: Path) -> None:
    """The real console script, measured by the interpreter itself."""
    with Log(data_dir, Config(shards=1)) as log:
        log.append("ev", b"{}")
    comet = Path(sys.executable).with_name("comet")
    out = subprocess.run([sys.executable, "-X", "importtime", str(comet), "stat", str(data_dir)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "ev" in out.stdout
    imported = {line.rsplit("|", 1)[1].strip() for line in out.stderr.splitlines()
                if line.startswith("import time:") and "|" in line}
    assert "storage_c.cli" in imported
    assert forbidden(imported) == []


def test_help_lists_every_command() -> None:
    out = CliRunner().invoke(main, ["--help"])
    assert out.exit_code == 0, out.output
    listed = {line.split()[0] for line in out.output.split("Commands:")[1].splitlines() if line.strip()}
    assert listed == {"stat", "tail", "verify", "group", "stream", "consume", "ship", "serve",
                      "spark-ship"}


def test_each_package_owns_its_commands() -> None:
    ctx = main.make_context("comet", ["stat", "x"])
    owners = {name: main.get_command(ctx, name).callback.__module__  # type: ignore[union-attr]  # all listed
              for name in main.list_commands(ctx)}
    assert owners == {"stat": "storage_c.cli", "tail": "storage_c.cli", "verify": "storage_c.cli",
                      "group": "storage_c.admin", "stream": "storage_c.admin",
                      "consume": "consumers.cli", "ship": "consumers.cli",
                      "serve": "gateway.cli", "spark-ship": "spark_jobs.cli"}


def test_a_command_that_cannot_load_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    import storage_c.cli as cli

    broken = EntryPoint("broken", "no_such_package.cli:cmd", cli.ENTRY_POINT_GROUP)
    monkeypatch.setattr(cli, "entry_points", lambda group: [broken])
    listing = CliRunner().invoke(main, ["--help"])
    assert listing.exit_code == 0 and "broken" in listing.output
    out = CliRunner().invoke(main, ["broken", "./data", "--some-option"])
    assert out.exit_code == 1
    assert "comet broken is not available: cannot import no_such_package.cli:cmd" in out.output
    assert "Traceback" not in out.output


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


# ---- the envelope and the layout -----------------------------------------------------------


@pytest.mark.parametrize("payload", [b'{"a":1}', b"[1, 2]", b'"s"', b"-0", b"1E400",
                                     b'{"a":1,"a":2}', b"123456789012345678901234567890"])
def test_plain_json_is_handed_out_as_stored(payload: bytes) -> None:
    assert is_plain_json(payload)
    assert orjson.dumps({"v": json_value(payload)}) == b'{"v":' + payload + b"}"
    assert ndjson_line(payload) == payload + b"\n"


@pytest.mark.parametrize("payload", [b"", b"x", b"\x00\xff", b"1\n2", b'{"a":\n1}', b"[1,]",
                                     b'{"base64":"eA=="}', b'{ "base64" : "x" }', b"NaN",
                                     b'{"\\u0062ase64":"eA=="}'])
def test_anything_else_is_enveloped_where_json_is_handed_out(payload: bytes) -> None:
    assert not is_plain_json(payload)
    wrapped = {"base64": base64.b64encode(payload).decode()}
    assert json_value(payload) == wrapped == envelope(payload)
    assert payload_of(wrapped) == payload


@pytest.mark.parametrize("payload", [b"1\n2", b'{"base64":"eA=="}', b'{ "base64" : "x" }',
                                     b'{"\\u0062ase64":"eA=="}'])
def test_ship_lines_envelope_what_breaks_the_framing_or_reads_as_an_envelope(payload: bytes) -> None:
    line = ndjson_line(payload)
    assert line.count(b"\n") == 1 and line.endswith(b"\n")
    assert payload_of(orjson.loads(line)) == payload


def test_ship_lines_keep_one_line_payloads_as_stored() -> None:
    for payload in (b'{"a":1}', b"not json", b"\x00\xff", b'{"base64":1}', b'{"base64":"x","y":1}', b""):
        assert ndjson_line(payload) == payload + b"\n"
    assert not reads_as_envelope(b'{"base64":"x","y":1}') and reads_as_envelope(b'{"base64":""}')


def test_a_whole_ship_batch_is_checked_by_substring() -> None:
    good = [b'{"a":1}', b"[2]", b"raw bytes", b""]
    assert ndjson_batch_ok(b"".join(p + b"\n" for p in good))
    for bad in ([b'{"base64":"eA=="}'] + good, good + [b'{ "base64" : "x" }']):
        assert not ndjson_batch_ok(b"".join(p + b"\n" for p in bad))
    assert not ndjson_batch_ok(b'{"base64":"eA=="}\n')  # at the very start too


def test_payload_of_reads_plain_values_back() -> None:
    assert payload_of({"a": 1}) == b'{"a":1}'
    assert payload_of({"base64": "not base64!"}) == b'{"base64":"not base64!"}'


def test_one_hive_layout() -> None:
    from consumers import object_key
    from spark_jobs.writer import partition_dir

    ns = 1_800_000_000 * 10**9  # 2027-01-15T08:00:00Z
    hour = ns // (3600 * 10**9)
    assert partition_path("ev", ns) == "stream=ev/dt=2027-01-15/hour=08"
    assert object_key("ev", 3, hour, 0, 9).startswith("stream=ev/dt=2027-01-15/hour=08/shard=0003/")
    assert partition_dir("ev", hour) == partition_path("ev", ns)


def test_crc32c_is_public() -> None:
    """What a benchmark or a tool calls instead of storage_c._comet."""
    from storage_c import crc32c

    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    assert crc32c(b"6789", crc32c(b"12345")) == crc32c(b"123456789")
    assert crc32c(b"") == 0
