"""The commands of this package: ``comet consume`` and ``comet ship``.

``comet`` (storage_c/cli.py) finds them through the ``comet.commands`` entry
points in pyproject.toml and imports this module only to run or list them.
Both open the data directory as a reader (``Config.reader``): they register
their group, acknowledge, and keep the flusher that makes acks durable.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time

import click

from storage_c import CometError
from storage_c.clikit import check_data_dir, show
from storage_c.jsonlog import event, log_to

from .consumer import Consumer
from .errors import EXIT_PERMANENT, ShipError, SinkError
from .ship import ShipConfig, Shipper
from .sinks import sink_from_url

log = logging.getLogger("comet.ship")
QUIET_LIBRARIES = ("boto3", "botocore", "s3transfer", "urllib3")
"""Their INFO lines (credentials found, connections opened) stay out of the log."""


def _failure(message: str, exit_code: int) -> click.ClickException:
    """A ClickException that ends the command with ``exit_code``: click reads
    the code from the exception's class (a class variable), hence a subclass."""
    failure: type[click.ClickException] = type(
        f"ExitCode{exit_code}", (click.ClickException,), {"exit_code": exit_code})
    return failure(message)


@click.command()
@click.argument("data_dir")
@click.argument("stream")
@click.option("--group", required=True, help="Consumer group (its offsets move as entries print).")
@click.option("-n", "--max", "limit", type=int, default=0, help="Stop after this many entries.")
@click.option("-f", "--follow", "following", is_flag=True, help="Wait for new entries.")
@click.option("--raw", is_flag=True, help="Payload bytes only, one per line.")
def consume(data_dir: str, stream: str, group: str, limit: int, following: bool, raw: bool) -> None:
    """Prints entries as a consumer group, acknowledging what was printed."""
    log_to(sys.stderr)
    printed = 0
    try:
        with Consumer(check_data_dir(data_dir), stream, group) as c:
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


def _parse_assignment(assignment: str | None) -> tuple[int, int] | None:
    if not assignment:
        return None
    try:
        i, n = (int(x) for x in assignment.split("/"))
    except ValueError:
        raise click.UsageError("--assignment is i/n, for example 0/3") from None
    return i, n


@click.command()
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
    log_to(sys.stderr, quiet=QUIET_LIBRARIES)
    parts = _parse_assignment(assignment)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    config = ShipConfig(max_object_bytes=max_object_bytes, max_object_age_s=max_object_age,
                        compression_level=level, max_retries=max_retries,
                        status_interval_s=status_interval)
    try:
        target = sink_from_url(sink, endpoint_url=endpoint_url)
        with Consumer(check_data_dir(data_dir), stream, group, assignment=parts) as consumer:
            stats = Shipper(consumer, target, config).run(stop, once=once)
    except ShipError as exc:
        raise _failure(str(exc), exc.exit_code) from None
    except SinkError as exc:
        raise _failure(f"comet ship: {exc}: {exc.hint or 'fix the sink URL'}",
                       EXIT_PERMANENT if exc.permanent else 1) from None
    except (CometError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    event(log, "stopped", **stats.as_dict())
