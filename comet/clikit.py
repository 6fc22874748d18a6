"""What every ``comet`` command shares, whichever package owns it: opening a
data directory with a clear error, and printing times, sizes, tables and
entries the same way.  Depends on click and the storage only, so a package
above may use it without pulling in any other command."""

from __future__ import annotations

import sys
from datetime import datetime, timezone
from pathlib import Path

import click

from storage_c import CometError, Config, Entry, Log


def check_data_dir(data_dir: str) -> str:
    """``data_dir``, or a ClickException when it is not a directory (the
    commands never create one: a typo would otherwise make a new, empty one)."""
    if not Path(data_dir).is_dir():
        raise click.ClickException(f"{data_dir} is not a directory")
    return data_dir


def open_log(data_dir: str, config: Config | None = None) -> Log:
    """The data directory, opened as an inspector unless told otherwise."""
    check_data_dir(data_dir)
    try:
        return Log(data_dir, config or Config.inspector())
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
    """Left-aligned columns, two spaces apart; the first row is the header."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def show(entry: Entry, raw: bool) -> None:
    """One entry: ``<shard>-<entry>\\t<time>\\t<payload>`` (bytes that are not
    UTF-8 escaped), or with ``raw`` the payload bytes alone."""
    if raw:
        sys.stdout.buffer.write(entry.payload + b"\n")
        sys.stdout.buffer.flush()
        return
    text = entry.payload.decode("utf-8", "backslashreplace")
    click.echo(f"{entry.id}\t{iso(entry.timestamp)}\t{text}")
