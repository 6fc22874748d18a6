"""The ``comet`` command line.

    comet --version
    comet stat    <data-dir> [--stream S] [--shards] [--json]
    comet tail    <data-dir> <stream> [--shard N] [-n 10] [--from-entry E] [-f] [--raw]
    comet verify  <data-dir> [--stream S]
    comet group   list|reset|delete ...          comet stream list|delete ...
    comet consume <data-dir> <stream> --group G [-n N] [-f]        (consumers)
    comet ship    <data-dir> <stream> <sink> [--group ship] ...    (consumers)
    comet serve   [--config FILE] [--data-dir D] [--host H] ...    (gateway)
    comet spark-ship <data-dir> <stream> <lake> [--group spark-ship] ...  (spark_jobs)

The command sits on the storage (storage_c) and imports no package above
it.  Its own commands (stat, tail, verify here, group and stream in
comet.admin) inspect and administer the log; every other
package declares its commands in the ``comet.commands`` entry-point group
(pyproject.toml), and ``comet`` imports a package only when one of its
commands runs (or ``comet --help`` lists them): ``comet stat`` never loads
Spark, Starlette or boto3.

The inspection commands open the directory without creating anything, claim
no process slot and run no flusher (``Config.inspector``), so they are safe
next to running writers.
"""

from __future__ import annotations

import errno

import heapq
import json
import sys
import time
from dataclasses import asdict
from importlib.metadata import EntryPoint, entry_points
from typing import Iterator

import click

from storage_c import (
    API_VERSION,
    FORMAT_VERSION,
    SEGMENT_VERSION,
    CometError,
    Entry,
    Log,
    ShardStats,
    StreamStats,
)

from . import admin
from .clikit import human, iso, open_log, render, show

ENTRY_POINT_GROUP = "comet.commands"
"""Entry points ``name = "package.module:click_command"`` of the other packages."""
DISTRIBUTION = "comet-edge"
"""The installed package whose version ``comet --version`` prints (pyproject.toml)."""
VERSION_MESSAGE = (f"%(package)s %(version)s: storage core API {API_VERSION}, "
                   f"data format {FORMAT_VERSION}, "
                   f"segment format {SEGMENT_VERSION}")


class CometGroup(click.Group):
    """A click group whose commands beyond the built-in ones are loaded from
    the ``comet.commands`` entry points, only when asked for by name."""

    def _entry_points(self) -> dict[str, EntryPoint]:
        return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(self.commands) | set(self._entry_points()))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = self.commands.get(cmd_name)
        if command is not None:
            return command
        ep = self._entry_points().get(cmd_name)
        if ep is None:
            return None
        try:
            loaded = ep.load()
        except ImportError as exc:
            # Still listed by --help, and running it says what is missing.
            return _unavailable(cmd_name, f"cannot import {ep.value}: {exc}")
        if not isinstance(loaded, click.Command):
            return _unavailable(cmd_name, f"{ep.value} is not a click command")
        self.commands[cmd_name] = loaded
        return loaded


def _unavailable(name: str, reason: str) -> click.Command:
    def fail() -> None:
        raise click.ClickException(f"comet {name} is not available: {reason} "
                                   "(is the project installed with its extras?)")

    # Whatever arguments it is given, it says why it cannot run.
    return click.Command(name, callback=fail, help=f"(not available: {reason})",
                         context_settings={"ignore_unknown_options": True,
                                           "allow_extra_args": True})


@click.group(cls=CometGroup)
@click.version_option(package_name=DISTRIBUTION, message=VERSION_MESSAGE)
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
            backlogs = {s.stream: log.backlogs(s) for s in all_stats}
        except CometError as exc:
            raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps({s.stream: {"shards": [asdict(x) for x in s.shards],
                                          "groups": [asdict(g) for g in s.groups],
                                          "backlogs": {k: asdict(b) for k, b in backlogs[s.stream].items()}}
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
    group_rows = [["STREAM", "GROUP", "SHARDS", "LAG", "LAG BYTES", "OLDEST UNACKED", "LAST ACK",
                   "DELIVERED", "RETRIES", "FAILED", "LAST DELIVERY"]]
    for s in all_stats:
        for g in s.group_lag().values():
            b = backlogs[s.stream][g.name]
            group_rows.append([s.stream, g.name, str(g.shards), str(g.lag), human(b.bytes),
                               iso(b.oldest_ns), iso(g.last_ack_ns), str(g.delivered),
                               str(g.retries), str(g.failed), iso(g.last_delivery_ns)])
    if len(group_rows) > 1:
        click.echo()
        click.echo(render(group_rows))


def shard_rows(all_stats: list[StreamStats]) -> list[list[str]]:
    rows = [["STREAM", "SHARD", "FIRST", "NEXT", "DURABLE", "SEGMENTS", "DISK", "APPENDS",
             "AVG APPEND", "SYNCS", "SYNC FAILED", "RECOVERIES", "LOCK DIED"]]
    for s in all_stats:
        for x in s.shards:
            rows.append([s.stream, str(x.shard), str(x.first_entry), str(x.next_entry),
                         str(x.durable_entry), str(x.segments), human(x.disk_bytes),
                         str(x.appends), average_latency(x), str(x.syncs), sync_failed(x),
                         str(x.recoveries), str(x.lock_owner_died)])
    return rows


def sync_failed(x: ShardStats) -> str:
    """The error of the failed sync the shard refuses appends for ("-": none)."""
    if not x.sync_failed_errno:
        return "-"
    return errno.errorcode.get(x.sync_failed_errno, str(x.sync_failed_errno))


def average_latency(x: ShardStats) -> str:
    if not x.append_latency_count:
        return "-"
    return f"{x.append_latency_sum_ns / x.append_latency_count / 1000:.1f} us"


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


main.add_command(admin.group)
main.add_command(admin.stream)

if __name__ == "__main__":
    main()
