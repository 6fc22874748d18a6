"""The commands of this package: ``comet consume`` and ``comet ship``.

``comet`` (comet/cli.py) finds them through the ``comet.commands`` entry
points in pyproject.toml and imports this module only to run or list them.
Both open the data directory as a reader (``Config.reader``): they register
their group, acknowledge, and keep the flusher that makes acks durable.
"""

from __future__ import annotations

import logging
import os
import re
import signal as signal_module
import sys
import threading
import time
from typing import Any
from urllib.parse import urlparse

import click

from comet.clikit import check_data_dir, show
from comet.jsonlog import event, log_to
from comet.objectstore import ENDPOINT_OPTION_HELP
from storage_c import CometError

from .consumer import Consumer
from .errors import EXIT_PERMANENT, ShipError, SinkError
from .forward import ForwardConfig
from .intents import ShardBusy
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


def _headers(pairs: tuple[str, ...], signal: str) -> dict[str, str]:
    """OTEL_EXPORTER_OTLP_HEADERS, then the signal's own variable, then --header (last wins)."""
    from .otlp_sink import parse_headers

    out: dict[str, str] = {}
    for var in ("OTEL_EXPORTER_OTLP_HEADERS", f"OTEL_EXPORTER_OTLP_{signal.upper()}_HEADERS"):
        try:
            out.update(parse_headers(os.environ.get(var, "")))
        except ValueError as exc:
            raise click.UsageError(f"{var}: {exc}") from None
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise click.UsageError(f"--header {pair!r}: use NAME=VALUE")
        out[name.strip()] = value
    return out


def default_group(sink: str) -> str:
    """One group per destination: ``ship`` for objects; for an OTLP endpoint,
    ``otlp-<host>-<port>`` (a group name: at most 47 of [A-Za-z0-9._-])."""
    parsed = urlparse(sink)
    if parsed.scheme not in ("http", "https"):
        return "ship"
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", f"otlp-{parsed.hostname or 'endpoint'}-{port}")
    return name[:47]


def _timeout(value: float | None) -> float:
    if value is not None:
        return value
    raw = os.environ.get("OTEL_EXPORTER_OTLP_TIMEOUT")  # milliseconds, as the specification says
    try:
        return float(raw) / 1000 if raw else 10.0
    except ValueError:
        raise click.UsageError(f"OTEL_EXPORTER_OTLP_TIMEOUT={raw!r} is not milliseconds") from None


@click.command()
@click.argument("data_dir")
@click.argument("stream")
@click.argument("sink")
@click.option("--group", help="Consumer group (default: ship; for an OTLP endpoint, otlp-HOST-PORT).")
@click.option("--max-object-bytes", type=int, default=64 << 20, show_default=True)
@click.option("--max-object-age", type=float, default=60.0, show_default=True, help="Seconds.")
@click.option("--level", type=int, default=1, show_default=True, help="zstd level.")
@click.option("--assignment", help="i/n: ship the shards with shard % n == i.")
@click.option("--endpoint-url", help=ENDPOINT_OPTION_HELP)
@click.option("--once", is_flag=True, help="Ship what is there, then exit.")
@click.option("--max-retries", type=click.IntRange(min=0), default=None,
              help="Give up after N failed retries of one upload or request (exit 4). "
                   "Default: unlimited; 5 with --once.")
@click.option("--status-interval", type=click.FloatRange(min=0), default=60.0, show_default=True,
              help="Seconds between status lines on stderr (0: none).")
@click.option("--otlp", "signal", type=click.Choice(["logs", "traces", "metrics"]),
              help="OTLP endpoint: the stream's signal (default: from its name, otel-logs, "
                   "otel-traces, otel-metrics; any other stream's events go as log records).")
@click.option("--encoding", type=click.Choice(["protobuf", "json"]),
              help="OTLP endpoint: request encoding (default: OTEL_EXPORTER_OTLP_PROTOCOL, else protobuf).")
@click.option("--compression", type=click.Choice(["gzip", "none"]),
              help="OTLP endpoint: default OTEL_EXPORTER_OTLP_COMPRESSION, else gzip.")
@click.option("-H", "--header", "headers", multiple=True, metavar="NAME=VALUE",
              help="OTLP endpoint: a request header (repeatable; after OTEL_EXPORTER_OTLP_HEADERS).")
@click.option("--ca-file", envvar="OTEL_EXPORTER_OTLP_CERTIFICATE",
              help="OTLP endpoint: CA certificates to verify https:// with (default: the system's).")
@click.option("--client-cert", envvar="OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
              help="OTLP endpoint: client certificate (PEM) for mutual TLS.")
@click.option("--client-key", envvar="OTEL_EXPORTER_OTLP_CLIENT_KEY",
              help="OTLP endpoint: the client certificate's key (PEM).")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=None,
              help="OTLP endpoint: seconds per request (default: OTEL_EXPORTER_OTLP_TIMEOUT ms, else 10).")
@click.option("--concurrency", type=click.IntRange(min=1, max=64), default=4, show_default=True,
              help="OTLP endpoint: requests in flight.")
@click.option("--batch-records", type=click.IntRange(min=1), default=1000, show_default=True,
              help="OTLP endpoint: records per request at most.")
@click.option("--batch-bytes", type=click.IntRange(min=1), default=4 << 20, show_default=True,
              help="OTLP endpoint: stored bytes per request at most (one larger event goes alone).")
@click.option("--batch-age", type=click.FloatRange(min=0), default=1.0, show_default=True,
              help="OTLP endpoint: seconds a record waits for a fuller request.")
@click.option("--service-name", help="OTLP endpoint, plain events: the resource's service.name "
                                     "(default: the stream's name).")
def ship(data_dir: str, stream: str, sink: str, group: str | None, max_object_bytes: int,
         max_object_age: float, level: int, assignment: str | None, endpoint_url: str | None,
         once: bool, max_retries: int | None, status_interval: float, signal: str | None,
         encoding: str | None, compression: str | None, headers: tuple[str, ...],
         ca_file: str | None, client_cert: str | None, client_key: str | None,
         timeout: float | None, concurrency: int, batch_records: int, batch_bytes: int,
         batch_age: float, service_name: str | None) -> None:
    """Drains STREAM into SINK: NDJSON.zst objects in s3://bucket/prefix or a
    directory, or export requests to an OTLP/HTTP endpoint (http:// or https://,
    a base URL: /v1/logs, /v1/traces or /v1/metrics is appended).

    SIGTERM finishes what is in progress and exits. Failures are retried with
    backoff; with --once a permanent object-store error (no such bucket, access
    denied, a directory that cannot be written) exits 3 at once, and
    --max-retries exhausted exits 4, each with one line on stderr. An OTLP
    endpoint's permanent refusals (a 4xx) put the batch in STREAM.dlq and
    shipping goes on."""
    log_to(sys.stderr, quiet=QUIET_LIBRARIES)
    parts = _parse_assignment(assignment)
    stop = threading.Event()
    for sig in (signal_module.SIGTERM, signal_module.SIGINT):
        signal_module.signal(sig, lambda *_: stop.set())
    group = group or default_group(sink)
    try:
        if urlparse(sink).scheme in ("http", "https"):
            counters = _forward(data_dir, stream, sink, group, parts, once, stop, ForwardConfig(
                max_batch_records=batch_records, max_batch_bytes=batch_bytes,
                max_batch_age_s=batch_age, concurrency=concurrency, max_retries=max_retries,
                status_interval_s=status_interval),
                signal=signal, encoding=encoding, compression=compression,
                headers=headers, ca_file=ca_file, client_cert=client_cert, client_key=client_key,
                timeout=timeout, service_name=service_name)
            event(log, "stopped", **counters)
            return
        config = ShipConfig(max_object_bytes=max_object_bytes, max_object_age_s=max_object_age,
                            compression_level=level, max_retries=max_retries,
                            status_interval_s=status_interval)
        target = sink_from_url(sink, endpoint_url=endpoint_url)
        with Consumer(check_data_dir(data_dir), stream, group, assignment=parts) as consumer:
            stats = Shipper(consumer, target, config).run(stop, once=once)
    except ShipError as exc:
        raise _failure(str(exc), exc.exit_code) from None
    except SinkError as exc:
        raise _failure(f"comet ship: {exc}: {exc.hint or 'fix the sink URL'}",
                       EXIT_PERMANENT if exc.permanent else 1) from None
    except (CometError, ValueError, ShardBusy) as exc:
        raise click.ClickException(str(exc)) from None
    event(log, "stopped", **stats.as_dict())


def _forward(data_dir: str, stream: str, sink: str, group: str, parts: tuple[int, int] | None,
             once: bool, stop: threading.Event, config: ForwardConfig, *, signal: str | None,
             encoding: str | None, compression: str | None, headers: tuple[str, ...],
             ca_file: str | None, client_cert: str | None, client_key: str | None,
             timeout: float | None, service_name: str | None) -> dict[str, Any]:
    """``comet ship`` to an OTLP/HTTP endpoint (consumers/forward.py)."""
    from storage_c.otlp import STREAM_SIGNALS

    from .forward import DLQ_SUFFIX, Forwarder
    from .otlp_sink import OtlpHttpSink, OtlpTarget

    origin = stream.removesuffix(DLQ_SUFFIX)  # dead letters go as their stream's events
    known = signal or STREAM_SIGNALS.get(origin)
    plain = None
    if known is None:
        plain = plain_resource(service_name or origin)
    elif service_name:
        raise click.UsageError("--service-name is for plain events; OTLP events keep their resource")
    protocol = os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    if encoding is None:
        if protocol not in ("http/protobuf", "http/json"):
            raise click.UsageError(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: comet ship speaks "
                                   "http/protobuf and http/json")
        encoding = protocol.rpartition("/")[2]
    if compression is None:
        compression = os.environ.get("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
        if compression not in ("gzip", "none"):
            raise click.UsageError(f"OTEL_EXPORTER_OTLP_COMPRESSION={compression!r}: use gzip or none")
    target = OtlpTarget(sink, known or "logs", encoding=encoding, compression=compression,
                        headers=_headers(headers, known or "logs"), timeout_s=_timeout(timeout),
                        ca_file=ca_file, client_cert=client_cert, client_key=client_key)
    for what, path in (("--ca-file", ca_file), ("--client-cert", client_cert),
                       ("--client-key", client_key)):
        if path and not os.access(path, os.R_OK):
            raise click.UsageError(f"{what} {path}: cannot be read")
    endpoint = OtlpHttpSink(target, connections=config.concurrency)
    try:
        with Consumer(check_data_dir(data_dir), stream, group, assignment=parts) as consumer:
            forwarder = Forwarder(consumer, endpoint, known or "logs", plain_resource=plain,
                                  config=config)
            return forwarder.run(stop, once=once).as_dict()
    finally:
        endpoint.close()


def plain_resource(service: str) -> bytes:
    """The Resource of plain events forwarded as log records: service.name."""
    from opentelemetry.proto.resource.v1.resource_pb2 import Resource

    resource = Resource()
    attribute = resource.attributes.add(key="service.name")
    attribute.value.string_value = service
    return bytes(resource.SerializeToString())
