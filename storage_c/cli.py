"""The ``comet`` command line: inspect and check a data directory.

    comet stat    <data-dir> [--stream S] [--shards] [--json]
    comet tail    <data-dir> <stream> [--shard N] [-n 10] [--from-entry E] [-f] [--raw]
    comet verify  <data-dir> [--stream S]
    comet consume <data-dir> <stream> --group G [-n N] [-f]
    comet ship    <data-dir> <stream> <sink> [--group ship] [--max-object-bytes ...]
    comet serve   [--config FILE] [--data-dir D] [--host H] [--port P] [--workers N]
    comet spark-ship <data-dir> <stream> <lake> [--group spark-ship] [--schema DDL] ...

The inspection commands open the directory without creating anything, claim
no process slot and run no flusher, so they are safe next to running writers.
"""

from __future__ import annotations

import heapq
import json
import sys
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

import click

from .config import Config
from .errors import CometError
from .log import Log
from .records import Entry, GroupInfo, ShardStats, StreamStats

TOOL_CONFIG = Config(create=False, auto_create_streams=False, background_flush=False)


def open_log(data_dir: str) -> Log:
    if not Path(data_dir).is_dir():
        raise click.ClickException(f"{data_dir} is not a directory")
    try:
        return Log(data_dir, TOOL_CONFIG)
    except CometError as exc:
        raise click.ClickException(str(exc)) from None


def iso(ns: int) -> str:
    if not ns:
        return "-"
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).isoformat(timespec="milliseconds")


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def render(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


@click.group()
def main() -> None:
    """Comet: an HTTP ingest gateway with an embedded segmented log."""


@main.command()
@click.argument("data_dir")
@click.option("--stream", "only", help="Only this stream.")
@click.option("--shards", is_flag=True, help="One line per shard.")
@click.option("--json", "as_json", is_flag=True, help="Every counter, as JSON.")
def stat(data_dir: str, only: str | None, shards: bool, as_json: bool) -> None:
    """Streams, shards, sizes and counters of a data directory."""
    with open_log(data_dir) as log:
        try:
            names = [only] if only else log.streams()
            all_stats = [log.stats(name) for name in names]
        except CometError as exc:
            raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps({s.stream: {"shards": [asdict(x) for x in s.shards],
                                          "groups": [asdict(g) for g in s.groups]}
                               for s in all_stats}, indent=2))
        return
    if not all_stats:
        click.echo(f"{data_dir}: no streams")
        return
    rows = [["STREAM", "SHARDS", "ENTRIES", "DISK", "OLDEST", "NEWEST", "CRC ERRORS", "TRUNCATED"]]
    for s in all_stats:
        rows.append([s.stream, str(len(s.shards)), str(s.entries), human(s.total("disk_bytes")),
                     iso(s.oldest_timestamp), iso(s.newest_timestamp), str(s.total("crc_failures")),
                     str(s.total("truncated_entries"))])
    click.echo(render(rows))
    if shards:
        click.echo()
        click.echo(render(shard_rows(all_stats)))
    group_rows = [["STREAM", "GROUP", "SHARDS", "LAG", "LAST ACK"]]
    for s in all_stats:
        by_name: dict[str, list[GroupInfo]] = {}
        for g in s.groups:
            by_name.setdefault(g.name, []).append(g)
        for name, infos in sorted(by_name.items()):
            last = max(i.last_ack_ns for i in infos)
            group_rows.append([s.stream, name, str(len(infos)), str(sum(i.lag for i in infos)),
                               iso(last)])
    if len(group_rows) > 1:
        click.echo()
        click.echo(render(group_rows))


def shard_rows(all_stats: list[StreamStats]) -> list[list[str]]:
    rows = [["STREAM", "SHARD", "FIRST", "NEXT", "DURABLE", "SEGMENTS", "DISK", "APPENDS",
             "AVG APPEND", "SYNCS", "RECOVERIES", "LOCK DIED"]]
    for s in all_stats:
        for x in s.shards:
            rows.append([s.stream, str(x.shard), str(x.first_entry), str(x.next_entry),
                         str(x.durable_entry), str(x.segments), human(x.disk_bytes),
                         str(x.appends), average_latency(x), str(x.syncs), str(x.recoveries),
                         str(x.lock_owner_died)])
    return rows


def average_latency(x: ShardStats) -> str:
    if not x.append_latency_count:
        return "-"
    return f"{x.append_latency_sum_ns / x.append_latency_count / 1000:.1f} us"


def show(entry: Entry, raw: bool) -> None:
    if raw:
        sys.stdout.buffer.write(entry.payload + b"\n")
        sys.stdout.buffer.flush()
        return
    text = entry.payload.decode("utf-8", "backslashreplace")
    click.echo(f"{entry.id}\t{iso(entry.timestamp)}\t{text}")


def last_entries(log: Log, stream: str, shard: int, count: int, start: int | None) -> list[Entry]:
    stats = log.shard_stats(stream, shard)
    first = start if start is not None else max(stats.first_entry, stats.next_entry - count)
    out: list[Entry] = []
    while len(out) < count:
        batch = log.read(stream, shard, first, max_entries=min(1000, count - len(out)))
        if not len(batch):
            break
        out.extend(batch)
        first = batch.next_entry
    return out


def follow(log: Log, stream: str, shards: list[int], raw: bool) -> Iterator[None]:
    position = {s: log.shard_stats(stream, s).next_entry for s in shards}
    while True:
        idle = True
        for shard in shards:
            batch = log.read(stream, shard, position[shard])
            for entry in batch:
                show(entry, raw)
            if len(batch) or batch.next_entry != position[shard]:
                idle = False
            position[shard] = batch.next_entry
        yield
        if idle:
            time.sleep(0.2)


@main.command()
@click.argument("data_dir")
@click.argument("stream")
@click.option("--shard", type=int, help="Only this shard (default: all, merged by time).")
@click.option("-n", "--lines", "count", type=int, default=10, show_default=True)
@click.option("--from-entry", type=int, help="Start here instead of the last N (needs --shard).")
@click.option("-f", "--follow", "following", is_flag=True, help="Keep printing new entries.")
@click.option("--raw", is_flag=True, help="Payload bytes only, one per line.")
def tail(data_dir: str, stream: str, shard: int | None, count: int, from_entry: int | None,
         following: bool, raw: bool) -> None:
    """Prints the last entries of a stream: <shard>-<entry>, time, payload."""
    if from_entry is not None and shard is None:
        raise click.UsageError("--from-entry needs --shard")
    with open_log(data_dir) as log:
        try:
            shards = [shard] if shard is not None else list(range(log.shard_count(stream)))
            per_shard = [last_entries(log, stream, s, count, from_entry) for s in shards]
            merged = list(heapq.merge(*per_shard, key=lambda e: (e.timestamp, e.shard, e.entry)))
            for entry in merged if from_entry is not None else merged[-count:]:
                show(entry, raw)
            if following:
                for _ in follow(log, stream, shards, raw):
                    pass
        except CometError as exc:
            raise click.ClickException(str(exc)) from None
        except KeyboardInterrupt:
            pass


@main.command()
@click.argument("data_dir")
@click.option("--stream", "only", help="Only this stream.")
def verify(data_dir: str, only: str | None) -> None:
    """Checks the checksum of every entry; exit status 1 when data is damaged."""
    with open_log(data_dir) as log:
        try:
            report = log.verify(only)
        except CometError as exc:
            raise click.ClickException(str(exc)) from None
    click.echo(f"{report.segments} segments, {report.entries} good entries "
               f"({human(report.bytes)}), {report.bad_entries} damaged")
    if report.index_problems:
        click.echo(f"{report.index_problems} sparse indexes disagreed with their segments "
                   "and were rebuilt")
    for p in report.problems:
        click.echo(f"damaged: stream {p.stream} shard {p.shard} entry {p.entry} "
                   f"(segment {p.segment_base}, byte {p.offset})")
    if not report.ok:
        sys.exit(1)


@main.command()
@click.argument("data_dir")
@click.argument("stream")
@click.option("--group", required=True, help="Consumer group (its offsets move as entries print).")
@click.option("-n", "--max", "limit", type=int, default=0, help="Stop after this many entries.")
@click.option("-f", "--follow", "following", is_flag=True, help="Wait for new entries.")
@click.option("--raw", is_flag=True, help="Payload bytes only, one per line.")
def consume(data_dir: str, stream: str, group: str, limit: int, following: bool, raw: bool) -> None:
    """Prints entries as a consumer group, acknowledging what was printed."""
    from consumers import Consumer

    printed = 0
    try:
        with Consumer(open_log(data_dir), stream, group) as c:
            while not limit or printed < limit:
                want = min(1000, limit - printed) if limit else 1000
                batch = c.read(want)
                for entry in batch:
                    show(entry, raw)
                printed += len(batch)
                if len(batch) or batch.skipped:
                    c.ack_batch(batch)
                elif not following:
                    break
                else:
                    time.sleep(0.2)
    except CometError as exc:
        raise click.ClickException(str(exc)) from None
    except KeyboardInterrupt:
        pass


@main.command()
@click.argument("data_dir")
@click.argument("stream")
@click.argument("sink")
@click.option("--group", default="ship", show_default=True)
@click.option("--max-object-bytes", type=int, default=64 << 20, show_default=True)
@click.option("--max-object-age", type=float, default=60.0, show_default=True, help="Seconds.")
@click.option("--level", type=int, default=1, show_default=True, help="zstd level.")
@click.option("--assignment", help="i/n: ship the shards with shard % n == i.")
@click.option("--endpoint-url", envvar="AWS_ENDPOINT_URL", help="S3 endpoint (default: AWS).")
@click.option("--once", is_flag=True, help="Ship what is there, then exit.")
@click.option("--max-retries", type=click.IntRange(min=0), default=None,
              help="Give up after N failed retries of one upload (exit 4). "
                   "Default: unlimited; 5 with --once.")
@click.option("--status-interval", type=click.FloatRange(min=0), default=60.0, show_default=True,
              help="Seconds between status lines on stderr (0: none).")
def ship(data_dir: str, stream: str, sink: str, group: str, max_object_bytes: int,
         max_object_age: float, level: int, assignment: str | None, endpoint_url: str | None,
         once: bool, max_retries: int | None, status_interval: float) -> None:
    """Drains STREAM into NDJSON.zst objects in SINK (s3://bucket/prefix or a directory).

    SIGTERM finishes the objects in progress and exits. Failed uploads are
    retried with backoff; with --once a permanent error (no such bucket,
    access denied, a directory that cannot be written) exits 3 at once, and
    --max-retries exhausted exits 4, each with one line on stderr."""
    import logging
    import signal
    import threading

    from consumers import Consumer, ShipConfig, ShipError, Shipper, SinkError, sink_from_url
    from consumers.errors import EXIT_PERMANENT

    ship_log = logging.getLogger("comet.ship")  # boto3's INFO lines stay out of stderr
    if not ship_log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        ship_log.addHandler(handler)
    ship_log.setLevel(logging.INFO)
    ship_log.propagate = False
    parts = None
    if assignment:
        try:
            i, n = (int(x) for x in assignment.split("/"))
            parts = (i, n)
        except ValueError:
            raise click.UsageError("--assignment is i/n, for example 0/3") from None
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    config = ShipConfig(max_object_bytes=max_object_bytes, max_object_age_s=max_object_age,
                        compression_level=level, max_retries=max_retries,
                        status_interval_s=status_interval)
    try:
        target = sink_from_url(sink, endpoint_url=endpoint_url)
        with Consumer(data_dir, stream, group, assignment=parts) as consumer:
            stats = Shipper(consumer, target, config).run(stop, once=once)
    except ShipError as exc:
        failed = click.ClickException(str(exc))
        failed.exit_code = exc.exit_code
        raise failed from None
    except SinkError as exc:
        failed = click.ClickException(f"comet ship: {exc}: {exc.hint or 'fix the sink URL'}")
        failed.exit_code = EXIT_PERMANENT if exc.permanent else 1
        raise failed from None
    except (CometError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(json.dumps({"event": "stopped", **stats.as_dict()}), err=True)


@main.command()
@click.option("--config", "config_file", type=click.Path(dir_okay=False), envvar="COMET_CONFIG",
              help="TOML configuration file.")
@click.option("--data-dir", help="Data directory (default ./data).")
@click.option("--host", help="Address to bind (default 127.0.0.1).")
@click.option("--port", type=int, help="Port (default 8080).")
@click.option("--workers", type=int, help="Worker processes (default: one per CPU).")
def serve(config_file: str | None, data_dir: str | None, host: str | None, port: int | None,
          workers: int | None) -> None:
    """Runs the HTTP ingest gateway (gunicorn + uvicorn workers).

    HUP reloads the workers gracefully; TERM drains and stops."""
    from gateway.config import ConfigError
    from gateway.serve import exec_gunicorn

    try:
        exec_gunicorn(config_file, {"data_dir": data_dir, "host": host, "port": port,
                                    "workers": workers})
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


@main.command("spark-ship")
@click.argument("data_dir")
@click.argument("stream")
@click.argument("lake")
@click.option("--group", default="spark-ship", show_default=True,
              help="Consumer group whose offsets the job starts from and acks.")
@click.option("--schema", "schema", help="Spark DDL of the JSON values, e.g. 'device string, temp double'.")
@click.option("--schema-file", type=click.Path(exists=True, dir_okay=False),
              help="File with the schema: DDL text, or a StructType's JSON.")
@click.option("--sample", type=int, default=1000, show_default=True,
              help="Entries sampled to infer the schema when none is given.")
@click.option("--event-time-field", help="Value field (timestamp or epoch number) for dt/hour; "
              "default: the entry's append time.")
@click.option("--event-time-unit", type=click.Choice(["s", "ms", "us", "ns"]), default="ms",
              show_default=True, help="Unit of a numeric event time field.")
@click.option("--max-entries", type=int, help="At most this many entries per run (all shards).")
@click.option("--entries-per-task", type=int, default=1_000_000, show_default=True,
              help="Spark task size: entries of one shard per task.")
@click.option("--master", help="Spark master (default local[*]); anything else goes through "
              "spark-submit.")
@click.option("--conf", "confs", multiple=True, help="Spark setting key=value (repeatable).")
@click.option("--endpoint-url", envvar="AWS_ENDPOINT_URL", help="S3 endpoint (default: AWS).")
def spark_ship(data_dir: str, stream: str, lake: str, group: str, schema: str | None,
               schema_file: str | None, sample: int, event_time_field: str | None,
               event_time_unit: str, max_entries: int | None, entries_per_task: int,
               master: str | None, confs: tuple[str, ...], endpoint_url: str | None) -> None:
    """Ships STREAM into a Parquet lake at LAKE (a directory or s3://bucket/prefix),
    partitioned by stream/dt/hour, exactly once: one run per call."""
    import logging
    import os

    from spark_jobs.lakefs import Lake, LakeError
    from spark_jobs.session import spark_session, under_spark_submit
    from spark_jobs.ship import ShipOptions, ship
    from spark_jobs.source import value_ddl

    if master and not master.startswith("local") and not under_spark_submit():
        submit_to_cluster(master, confs)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    if schema and schema_file:
        raise click.UsageError("give --schema or --schema-file, not both")
    if schema_file:
        schema = value_ddl(Path(schema_file).read_text())
    conf = []
    for item in confs:
        key, eq, value = item.partition("=")
        if not eq:
            raise click.UsageError(f"--conf {item!r}: use key=value")
        conf.append((key, value))
    if not Path(data_dir).is_dir():
        raise click.ClickException(f"{data_dir} is not a directory")
    try:
        target = Lake(lake, endpoint_url=endpoint_url)
        opts = ShipOptions(os.path.abspath(data_dir), stream, target, group, schema, sample,
                           event_time_field, event_time_unit, max_entries, entries_per_task)
        spark = spark_session(master, conf=conf)
        report = ship(spark, opts)
    except (CometError, LakeError, ValueError, FileNotFoundError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(json.dumps(report.to_dict()))


def submit_to_cluster(master: str, confs: tuple[str, ...]) -> None:
    """Re-runs this command through spark-submit with the same arguments."""
    import os
    import shutil

    import spark_jobs.submit as job

    submit = shutil.which("spark-submit")
    if submit is None:
        raise click.ClickException("spark-submit is not on PATH (it comes with pyspark)")
    args = [submit, "--master", master]
    for item in confs:
        args += ["--conf", item]
    rest, skip = [], False
    for arg in sys.argv[2:]:  # drop "comet spark-ship" and --master
        if skip:
            skip = False
        elif arg == "--master":
            skip = True
        elif not arg.startswith("--master="):
            rest.append(arg)
    os.execv(submit, args + [job.__file__, *rest])


def _admin_commands() -> None:
    from .admin import group, stream  # admin imports this module's helpers

    main.add_command(group)
    main.add_command(stream)


_admin_commands()

if __name__ == "__main__":
    main()
