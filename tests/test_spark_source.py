"""The ``comet`` PySpark data source: batch and streaming reads of the log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
import pytest

from storage_c import Config, Log
from spark_jobs.spark.offsets import SourceOptions, cap, resolve_start
from spark_jobs.spark.source import CometStreamReader

from .support.docs import code_blocks
from .support.storage import fill, read_all

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

CFG = Config(shards=4, segment_bytes=1 << 20, compression_threshold=256)


def events(n: int, start: int = 0) -> list[bytes]:
    """Events of varied size: the large ones are stored compressed."""
    return [orjson.dumps({"n": i, "device": f"dev-{i % 7}", "pad": "x" * (i % 600)})
            for i in range(start, start + n)]


def expected_rows(log: Log, shards: range | list[int]) -> list[tuple[int, int, int, bytes]]:
    out = []
    for shard in shards:
        out += [(shard, e, t // 1000, p) for e, t, p in read_all(log, "ev", shard)]
    return out


def rows_of(df: DataFrame) -> list[tuple[int, int, int, bytes]]:
    from pyspark.sql import functions as F

    got = df.select("shard", "entry", F.unix_micros("timestamp").alias("us"), "value").collect()
    return sorted((r.shard, r.entry, r.us, bytes(r.value)) for r in got)


def comet(spark: SparkSession, data_dir: Path, **options: str) -> DataFrame:
    reader = spark.read.format("comet").option("path", str(data_dir)).option("stream", "ev")
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def test_batch_read_equals_the_storage_api(spark: SparkSession, data_dir: Path) -> None:
    with Log(data_dir, CFG) as log:
        fill(log, "ev", events(2000), batch=1)
        assert sum(log.shard_stats("ev", s).compressed_entries for s in range(4)) > 100
        want = sorted(expected_rows(log, range(4)))
    df = comet(spark, data_dir)
    assert df.columns == ["stream", "shard", "entry", "timestamp", "value"]
    assert df.rdd.getNumPartitions() == 4  # one per shard range
    assert rows_of(df) == want
    assert {r.stream for r in df.select("stream").distinct().collect()} == {"ev"}


def test_offsets_shards_and_partition_size(spark: SparkSession, data_dir: Path) -> None:
    with Log(data_dir, CFG) as log:
        fill(log, "ev", events(800), batch=1)
        everything = expected_rows(log, range(4))
        group = log.group("ev", 2, "lake")
        group.ack(49)  # shard 2 consumed up to 49
    only = comet(spark, data_dir, shards="1,3")
    assert rows_of(only) == sorted(r for r in everything if r[0] in (1, 3))
    ranged = comet(spark, data_dir, startingOffsets='{"0": 10, "1": -1}', endingOffsets='{"0": 20}')
    assert rows_of(ranged) == sorted(r for r in everything if (r[0] == 0 and 10 <= r[1] < 20)
                                     or r[0] in (2, 3))
    by_group = comet(spark, data_dir, startingOffsets="group:lake", shards="2")
    assert rows_of(by_group) == sorted(r for r in everything if r[0] == 2 and r[1] >= 50)
    latest = comet(spark, data_dir, startingOffsets="latest")
    assert latest.count() == 0
    split = comet(spark, data_dir, shards="0", maxEntriesPerPartition="30")
    count0 = sum(1 for r in everything if r[0] == 0)
    assert split.rdd.getNumPartitions() == -(-count0 // 30)
    assert rows_of(split) == sorted(r for r in everything if r[0] == 0)


def test_a_group_start_needs_a_registered_group(spark: SparkSession, data_dir: Path) -> None:
    """group:<name> of a group nobody registered is an error, not a read from the start."""
    from consumers import Consumer

    with Log(data_dir, CFG) as log:
        fill(log, "ev", events(300), batch=1)
        everything = expected_rows(log, range(4))
    opts = SourceOptions.parse({"path": str(data_dir), "stream": "ev", "startingOffsets": "group:lake"})
    with Log(data_dir, Config.inspector()) as log:  # the check batch reads and streams' first offsets share
        with pytest.raises(ValueError, match=r"^startingOffsets: consumer group 'lake' is not "
                           r"registered on stream 'ev'; known groups: \(none\) \(register it first"):
            resolve_start(log, opts, [0, 1, 2, 3], opts.starting)
        assert log.groups("ev") == []  # and it registered nothing
    with Log(data_dir, CFG) as log:
        for shard in range(4):
            log.group("ev", shard, "ship")
        log.group("ev", 1, "audit").ack(9)  # registered in shard 1 only
    with pytest.raises(Exception, match=r"consumer group 'lake' is not registered on stream 'ev'; "
                       r"known groups: audit, ship \(register it first, e\.g\. consumers\.Consumer"
                       r"\(path, 'ev', 'lake'\)\.shards\(\), or use startingOffsets=earliest\)"):
        comet(spark, data_dir, startingOffsets="group:lake").collect()
    with pytest.raises(Exception, match="consumer group 'lake' is not registered"):
        (spark.readStream.format("comet").option("path", str(data_dir)).option("stream", "ev")
         .option("startingOffsets", "group:lake").load().writeStream.format("noop")
         .trigger(availableNow=True).start().awaitTermination(120))
    # Registered as docs/spark-and-the-lake.md shows: from the oldest stored entry of every shard.
    with Consumer(str(data_dir), "ev", "lake") as group:
        assert group.shards() == [0, 1, 2, 3]
    assert rows_of(comet(spark, data_dir, startingOffsets="group:lake")) == sorted(everything)
    # A group registered in some shards: the others start at their oldest entry.
    assert rows_of(comet(spark, data_dir, startingOffsets="group:audit")) == \
        sorted(r for r in everything if r[0] != 1 or r[1] >= 10)


def test_parsed_values_and_rejects(spark: SparkSession, data_dir: Path) -> None:
    with Log(data_dir, CFG) as log:
        fill(log, "ev", events(300), batch=1)
        bad = [log.append("ev", payload, shard=shard)
               for shard, payload in enumerate([b"not json", b"", b'{"n": "text"}',
                                                b'{"n": 1}\n{"n": 2}'])]
        log.append("ev", b'{"n":\n 7, "device": "pretty"}', shard=3)  # JSON with a newline inside
    df = comet(spark, data_dir, valueSchema="n long, device string")
    assert df.columns == ["stream", "shard", "entry", "timestamp", "value", "_error", "_corrupt_record"]
    good = df.where("_error is null").select("value.*").collect()
    assert len(good) == 301
    assert sorted(r.n for r in good) == sorted(list(range(300)) + [7])
    rejects = df.where("_error is not null").collect()
    assert {(r.shard, r.entry) for r in rejects} == set(bad)
    assert all(r.value is None and r._corrupt_record is not None for r in rejects)
    assert {bytes(r._corrupt_record) for r in rejects} == {b"not json", b"", b'{"n": "text"}',
                                                          b'{"n": 1}\n{"n": 2}'}


def test_bad_options_are_clear_errors(spark: SparkSession, data_dir: Path) -> None:
    with Log(data_dir, CFG) as log:
        fill(log, "ev", events(10), batch=1)
    cases = {
        "does not exist": dict(stream="nope"),
        "neither earliest": dict(startingOffsets="{bad json"),
        "not a shard number": dict(startingOffsets='{"x": 1}'),
        "has 4 shards": dict(shards="0,9"),
        "positive integer": dict(maxEntriesPerPartition="0"),
    }
    for message, options in cases.items():
        reader = spark.read.format("comet").option("path", str(data_dir)).option("stream", "ev")
        for key, value in options.items():
            reader = reader.option(key, value)
        with pytest.raises(Exception, match=message):
            reader.load().collect()
    with pytest.raises(Exception, match="'path'"):
        spark.read.format("comet").option("stream", "ev").load().collect()


def test_streaming_read_with_a_checkpoint_reads_only_new_rows(spark: SparkSession, data_dir: Path,
                                                              tmp_path: Path) -> None:
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def run_until_caught_up() -> None:
        query = (spark.readStream.format("comet").option("path", str(data_dir))
                 .option("stream", "ev").option("maxEntriesPerTrigger", "150").load()
                 .writeStream.format("parquet").option("path", str(out))
                 .option("checkpointLocation", str(checkpoint))
                 .trigger(availableNow=True).start())
        query.awaitTermination(180)
        assert query.exception() is None

    with Log(data_dir, CFG) as log:
        fill(log, "ev", events(400), batch=1)
    run_until_caught_up()
    first = rows_of(spark.read.parquet(str(out)))
    batches = len(list((checkpoint / "offsets").iterdir()))
    assert batches >= 3  # 400 entries, at most 150 per micro-batch
    with Log(data_dir, CFG) as log:
        assert first == sorted(expected_rows(log, range(4)))
        fill(log, "ev", events(250, start=400), batch=1)
        want = sorted(expected_rows(log, range(4)))
    run_until_caught_up()
    assert rows_of(spark.read.parquet(str(out))) == want  # exactly the new rows were added


def test_stream_reader_works_without_4_2_arguments(data_dir: Path) -> None:
    """Spark 4.0/4.1 call latestOffset() with no arguments."""
    from pyspark.sql.types import StructType

    with Log(data_dir, CFG) as log:
        fill(log, "ev", events(100), batch=1)
        ends = {str(s): log.shard_stats("ev", s).next_entry for s in range(4)}
    schema = StructType.fromJson(json.loads(
        '{"type":"struct","fields":[{"name":"stream","type":"string","nullable":true,"metadata":{}},'
        '{"name":"shard","type":"integer","nullable":true,"metadata":{}},'
        '{"name":"entry","type":"long","nullable":true,"metadata":{}},'
        '{"name":"timestamp","type":"timestamp","nullable":true,"metadata":{}},'
        '{"name":"value","type":"binary","nullable":true,"metadata":{}}]}'))
    opts = SourceOptions.parse({"path": str(data_dir), "stream": "ev", "maxEntriesPerTrigger": "40"})
    reader = CometStreamReader(opts, schema)
    start = reader.initialOffset()
    assert start == {str(s): 0 for s in range(4)}
    seen = 0
    position = start
    while position != ends:
        nxt = reader.latestOffset()
        taken = sum(nxt[k] - position[k] for k in nxt)
        assert 0 < taken <= 40
        seen += taken
        position = nxt
    assert seen == 100


def test_cap_shares_the_limit_between_shards() -> None:
    assert cap({0: 0, 1: 0}, {0: 100, 1: 100}, 10) == {0: 5, 1: 5}
    assert cap({0: 0, 1: 98}, {0: 100, 1: 100}, 10) == {0: 8, 1: 100}
    assert cap({0: 5}, {0: 7}, None) == {0: 7}
    assert cap({0: 7}, {0: 7}, 10) == {0: 7}


def test_value_schema_as_ddl_or_structtype_json() -> None:
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from spark_jobs.spark.schema import value_ddl

    struct = StructType([StructField("id", LongType()), StructField("odd name", StringType())])
    assert value_ddl(struct.json()) == "`id` bigint, `odd name` string"
    assert value_ddl(" a int, b string ") == "a int, b string"
    with pytest.raises(ValueError, match="StructType's JSON"):
        value_ddl('{"type": "struct"}')


DOCS_PAGE = Path(__file__).resolve().parent.parent / "docs" / "spark-and-the-lake.md"
DOCS_SECTION = "## The comet data source"


def test_the_documented_snippet_works_in_a_plain_python(tmp_path: Path) -> None:
    """The data source's examples as the docs show them (the first read, then the
    read from a group the example registers), in a fresh ``python`` of this
    project with nothing of Spark's in its environment (no PYSPARK_PYTHON,
    no SPARK_LOCAL_IP): Spark's Python workers must find this package."""
    first, by_group = code_blocks(DOCS_PAGE, DOCS_SECTION)
    assert 'group:' in by_group
    events = [orjson.dumps({"level": "info", "n": n}) for n in range(5)]
    with Log(tmp_path / "data", Config(shards=2)) as log:
        for event in events:
            log.append("events", event)
    clean = {name: os.environ[name] for name in ("PATH", "HOME", "JAVA_HOME", "LANG")
             if name in os.environ}
    script = first + by_group + 'print("rows from the group:", df.count())\n'
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=clean,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    shown = [line.split("|") for line in out.stdout.splitlines() if line.startswith("|")]
    rows = {cells[3].strip() for cells in shown[1:]}  # below the header row
    assert rows == {event.decode() for event in events}, out.stdout
    # the group the example registers starts at the oldest stored entry of every shard
    assert f"rows from the group: {len(events)}" in out.stdout.splitlines(), out.stdout
