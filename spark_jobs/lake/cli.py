"""``comet lake``: the operator's commands for a lake ``comet spark-ship`` writes.

    comet lake history LAKE [--stream S] [--limit N]
    comet lake compact LAKE [--stream S] [--target-size BYTES]
    comet lake vacuum  LAKE [--retention-hours H] [--apply]
    comet lake check   LAKE [--data-dir D] [--group G]

Each prints one JSON document on stdout; a failure is one ``Error: ...``
line on stderr and exit status 1 (``check`` prints its report, then fails
when it found a problem).  Each is safe beside running ``comet spark-ship``
runs: see ``history.py``, ``upkeep.py`` and ``check.py`` for how.
``comet`` (comet/cli.py) finds the group through the ``comet.commands``
entry points; deltalake is imported only when a command runs.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Callable

import click

from comet.clikit import check_data_dir
from comet.jsonlog import log_to
from comet.objectstore import ENDPOINT_OPTION_HELP
from storage_c import CometError

ENDPOINT = click.option("--endpoint-url", help=ENDPOINT_OPTION_HELP)


@click.group("lake")
def lake() -> None:
    """Look after a lake that comet spark-ship writes (a directory or
    s3://bucket/prefix): its history, compaction, vacuum and a check.
    Safe beside running spark-ship runs."""


@lake.command()
@click.argument("lake_url", metavar="LAKE")
@click.option("--stream", help="Only this stream's runs (other operations are always listed).")
@click.option("--limit", type=click.IntRange(min=1), help="The last N commits of each table.")
@ENDPOINT
def history(lake_url: str, stream: str | None, limit: int | None, endpoint_url: str | None) -> None:
    """The commits of both tables, newest first: runs (shipper, run, ranges,
    rows, rejects, missing) and other operations (compaction, vacuum, added
    columns)."""
    from .history import history as read_history

    run(lambda: read_history(_delta_lake(lake_url, endpoint_url), stream, limit))


@lake.command()
@click.argument("lake_url", metavar="LAKE")
@click.option("--stream", help="Only this stream's partitions.")
@click.option("--target-size", type=click.IntRange(min=1), metavar="BYTES",
              help="Size of the files to make (default: the table's delta.targetFileSize, or 100 MB).")
@ENDPOINT
def compact(lake_url: str, stream: str | None, target_size: int | None, endpoint_url: str | None) -> None:
    """Rewrites small files into larger ones (delta-rs optimize.compact), in
    both tables; the rows stay as they are."""
    from .upkeep import compact as do_compact

    run(lambda: do_compact(_delta_lake(lake_url, endpoint_url), stream, target_size))


@lake.command()
@click.argument("lake_url", metavar="LAKE")
@click.option("--retention-hours", type=int, default=168, show_default=True,
              help="Keep files younger than this (at least 24; longer while a run has not committed).")
@click.option("--apply", is_flag=True, help="Delete the files (default: only list them).")
@ENDPOINT
def vacuum(lake_url: str, retention_hours: int, apply: bool, endpoint_url: str | None) -> None:
    """Lists (with --apply: deletes) the files of both tables that no
    version references any more and that are older than the retention:
    files compaction replaced, files of attempts that never committed."""
    from .upkeep import vacuum as do_vacuum

    run(lambda: do_vacuum(_delta_lake(lake_url, endpoint_url), retention_hours, apply))


@lake.command()
@click.argument("lake_url", metavar="LAKE")
@click.option("--data-dir", help="The data directory shipped from: the ranges must agree with "
              "the group's offsets there (opened read-only).")
@click.option("--group", default="spark-ship", show_default=True, help="The shipping group (with --data-dir).")
@ENDPOINT
def check(lake_url: str, data_dir: str | None, group: str, endpoint_url: str | None) -> None:
    """Checks that every committed file exists and reads, that no entry is
    committed twice, and that the runs' ranges have no gap and no overlap;
    exit status 1 when anything is wrong."""
    from .check import check as do_check

    if data_dir is not None:
        check_data_dir(data_dir)
    report = run(lambda: do_check(_lake(lake_url, endpoint_url), data_dir, group), echo=False)
    click.echo(json.dumps(report.to_dict()))
    if not report.ok:
        more = f" (and {len(report.problems) - 1} more)" if len(report.problems) > 1 else ""
        raise click.ClickException(f"the lake has {len(report.problems)} problem"
                                   f"{'s' if len(report.problems) > 1 else ''}: "
                                   f"{report.problems[0]}{more}")


def _lake(url: str, endpoint_url: str | None) -> Any:
    from .lakefs import Lake

    return Lake(url, endpoint_url=endpoint_url)


def _delta_lake(url: str, endpoint_url: str | None) -> Any:
    """The lake, which must have its Delta table (else a ValueError saying what it is)."""
    from .delta import LakeTable

    target = _lake(url, endpoint_url)
    if LakeTable.main(target).open() is None:
        raise ValueError(f"{target.url} has no Delta table (nothing shipped there yet?)")
    return target


def run(action: Callable[[], Any], echo: bool = True) -> Any:
    """Runs a command's work: its result as JSON on stdout, or one Error line."""
    from deltalake.exceptions import DeltaError

    from .lakefs import LakeError

    log_to(sys.stderr)
    try:
        result = action()
    except (CometError, LakeError, ValueError, FileNotFoundError, RuntimeError) as exc:
        raise click.ClickException(str(exc)) from None
    except DeltaError as exc:  # the table's own complaint (a damaged log, a store's refusal)
        raise click.ClickException(f"the lake's Delta table: {exc}") from None
    except OSError as exc:
        raise click.ClickException(f"the lake: {exc}") from None
    if echo:
        click.echo(json.dumps(result))
    return result
