"""``comet group`` and ``comet stream``: the life cycle of consumer groups and
streams, from the command line.

    comet group list   <data-dir> <stream> [--json]
    comet group reset  <data-dir> <stream> <group> (--to-earliest | --to-latest |
                       --to-entry N | --to-time T) [--shard N]
    comet group delete <data-dir> <stream> <group>
    comet stream list   <data-dir>
    comet stream delete <data-dir> <stream> [--yes]

They are safe next to running gateways and consumers: a reset or a deletion
is seen by every process at its next read or write (see reset_group and
Log.delete_stream).
"""

from __future__ import annotations

import json
from dataclasses import asdict

import click

from storage_c import CometError, ResetTo, delete_group, reset_group

from .clikit import human, iso, open_log, render


@click.group()
def group() -> None:
    """Consumer groups of a stream: list, reset, delete."""


@group.command("list")
@click.argument("data_dir")
@click.argument("stream")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per group and shard.")
def list_groups(data_dir: str, stream: str, as_json: bool) -> None:
    """Every group with its offset, lag and last acknowledgement per shard."""
    with open_log(data_dir) as log:
        try:
            infos = sorted(log.groups(stream), key=lambda g: (g.name, g.shard))
        except CometError as exc:
            raise click.ClickException(str(exc)) from None
    if as_json:
        for g in infos:
            click.echo(json.dumps(asdict(g)))
        return
    if not infos:
        click.echo(f"stream {stream} has no consumer group")
        return
    rows = [["GROUP", "SHARD", "OFFSET", "LAG", "LAST ACK"]]
    rows += [[g.name, str(g.shard), str(g.offset), str(g.lag), iso(g.last_ack_ns)] for g in infos]
    click.echo(render(rows))


@group.command("reset")
@click.argument("data_dir")
@click.argument("stream")
@click.argument("name")
@click.option("--to-earliest", is_flag=True, help="The oldest entry still stored.")
@click.option("--to-latest", is_flag=True, help="The end: skip everything stored so far.")
@click.option("--to-entry", type=click.IntRange(min=0), help="This entry number (in each shard).")
@click.option("--to-time", help="The first entry at or after this time: ISO 8601 (UTC when no "
              "zone is given) or unix seconds.")
@click.option("--shard", type=click.IntRange(min=0), help="Only this shard (default: every shard "
              "where the group is registered).")
def reset(data_dir: str, stream: str, name: str, to_earliest: bool, to_latest: bool,
          to_entry: int | None, to_time: str | None, shard: int | None) -> None:
    """Moves a group's offsets; running consumers continue from there."""
    chosen = [to_earliest, to_latest, to_entry is not None, to_time is not None]
    if sum(chosen) != 1:
        raise click.UsageError("give exactly one of --to-earliest, --to-latest, --to-entry, --to-time")
    try:
        if to_earliest:
            target = ResetTo("earliest")
        elif to_latest:
            target = ResetTo("latest")
        elif to_entry is not None:
            target = ResetTo("entry", to_entry)
        else:
            assert to_time is not None
            target = ResetTo.time(to_time)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--to-time") from None
    with open_log(data_dir) as log:
        try:
            results = reset_group(log, stream, name, target, shard)
            log.sync()
        except CometError as exc:
            raise click.ClickException(str(exc)) from None
    rows = [["SHARD", "BEFORE", "AFTER"]] + [[str(r.shard), str(r.before), str(r.after)] for r in results]
    click.echo(render(rows))
    click.echo(f"group {name} of {stream} reset to {target} in {len(results)} shard(s)")


@group.command("delete")
@click.argument("data_dir")
@click.argument("stream")
@click.argument("name")
def delete(data_dir: str, stream: str, name: str) -> None:
    """Unregisters a group: retention stops keeping data for it."""
    with open_log(data_dir) as log:
        try:
            shards = delete_group(log, stream, name)
            log.sync()
        except CometError as exc:
            raise click.ClickException(str(exc)) from None
    click.echo(f"group {name} deleted from {len(shards)} shard(s) of {stream}")


@click.group()
def stream() -> None:
    """Streams of a data directory: list, delete."""


@stream.command("list")
@click.argument("data_dir")
def list_streams(data_dir: str) -> None:
    """Streams with their shard count, entries and disk use."""
    with open_log(data_dir) as log:
        rows = [["STREAM", "SHARDS", "ENTRIES", "DISK"]]
        for name in log.streams():
            try:
                st = log.stats(name, oldest=False)
            except CometError:
                continue  # deleted meanwhile
            rows.append([name, str(len(st.shards)), str(st.entries), human(st.total("disk_bytes"))])
    click.echo(render(rows) if len(rows) > 1 else "no stream")


@stream.command("delete")
@click.argument("data_dir")
@click.argument("name")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def delete_stream(data_dir: str, name: str, yes: bool) -> None:
    """Deletes a stream, its groups and its data, and frees the disk.

    Safe while gateways, consumers and Spark jobs run: each notices at its
    next write or read (a write may create the name again, empty)."""
    with open_log(data_dir) as log:
        if name not in log.streams():
            raise click.ClickException(f"stream {name!r} does not exist in {data_dir}")
        if not yes:
            click.confirm(f"Delete stream {name!r} and all its data?", abort=True)
        try:
            log.delete_stream(name)
        except CometError as exc:
            raise click.ClickException(str(exc)) from None
    click.echo(f"stream {name} deleted")
