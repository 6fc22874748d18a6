"""The command of this package: ``comet spark-ship``.

``comet`` (comet/cli.py) finds it through the ``comet.commands`` entry
points in pyproject.toml; pyspark and pyarrow are imported only when it
runs, so listing it in ``comet --help`` costs nothing.  Under spark-submit,
``submit.py`` runs this same command.

Everything it writes to stderr is JSON lines (``comet.jsonlog``), Spark's
JVM included (``jvm_output.py``), except click's usage errors and the one
``Error: ...`` line of a failed run; its report is one JSON line on stdout.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import click

from comet.clikit import check_data_dir
from comet.jsonlog import log_to
from comet.objectstore import ENDPOINT_OPTION_HELP
from storage_c import CometError

SUBMIT_SCRIPT = Path(__file__).with_name("submit.py")
"""The spark-submit application that runs this command (see ``submit.py``)."""


@click.command("spark-ship")
@click.argument("data_dir")
@click.argument("stream")
@click.argument("lake")
@click.option("--group", default="spark-ship", show_default=True,
              help="Consumer group whose offsets the job starts from and acks.")
@click.option("--schema", "schema", help="Spark DDL of the JSON values, e.g. 'device string, temp double'; "
              "it wins over the built-in OTLP schema of a stream named otel-logs, otel-traces or "
              "otel-metrics.")
@click.option("--schema-file", type=click.Path(exists=True, dir_okay=False),
              help="File with the schema: DDL text, or a StructType's JSON.")
@click.option("--otlp", type=click.Choice(["logs", "traces", "metrics"]),
              help="The stream holds the gateway's OTLP events of this signal: ship them with its "
              "built-in schema (typed columns, attributes as maps).  Default: from the stream's name "
              "(otel-logs, otel-traces, otel-metrics) unless --schema is given; not with --schema.")
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
@click.option("--endpoint-url", help=ENDPOINT_OPTION_HELP)
@click.option("--single-writer", is_flag=True,
              help="Only this process ever writes into the lake: needed on an S3 store without "
              "conditional writes (If-None-Match), such as OpenStack Swift's S3 API, which cannot "
              "keep a second writer out; the Delta commits are then made in a local copy of the "
              "table's log and uploaded.")
def spark_ship(data_dir: str, stream: str, lake: str, group: str, schema: str | None,
               schema_file: str | None, otlp: str | None, sample: int, event_time_field: str | None,
               event_time_unit: str, max_entries: int | None, entries_per_task: int,
               master: str | None, confs: tuple[str, ...], endpoint_url: str | None,
               single_writer: bool) -> None:
    """Ships STREAM into the Delta Lake table at LAKE (a directory or
    s3://bucket/prefix), partitioned by stream/dt/hour, exactly once: one run
    per call.  Without --schema, new JSON fields become new columns; the OTLP
    streams (--otlp) have a built-in schema."""
    from .jvm_output import spark_log_level
    from deltalake.exceptions import DeltaError

    from ..lake.lakefs import Lake, LakeError
    from ..lake.lock import LakeBusy
    from .session import SparkStartError, job_session, under_spark_submit
    from .ship import ShipOptions, ship

    if schema and schema_file:
        raise click.UsageError("give --schema or --schema-file, not both")
    if otlp and (schema or schema_file):
        raise click.UsageError("give --otlp or a schema (--schema, --schema-file), not both")
    if master and not master.startswith("local") and not under_spark_submit():
        submit_to_cluster(master, confs)
    log_to(sys.stderr, quiet=("py4j",))
    if schema_file:
        schema = Path(schema_file).read_text()
    conf = []
    for item in confs:
        key, eq, value = item.partition("=")
        if not eq:
            raise click.UsageError(f"--conf {item!r}: use key=value")
        conf.append((key, value))
    check_data_dir(data_dir)
    try:
        spark_log_level()
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    started: list[Any] = []

    def start_spark() -> Any:
        started.append(job_session(master, conf))
        return started[-1]

    try:
        target = Lake(lake, endpoint_url=endpoint_url, single_writer=single_writer)
        opts = ShipOptions(os.path.abspath(data_dir), stream, target, group, schema, sample,
                           event_time_field, event_time_unit, max_entries, entries_per_task, otlp=otlp)
        report = ship(opts, start_spark)
    except (CometError, LakeError, LakeBusy, SparkStartError, ValueError, FileNotFoundError) as exc:
        raise click.ClickException(str(exc)) from None
    except DeltaError as exc:  # the table's own complaint (a damaged log, a store's refusal)
        raise click.ClickException(f"the lake's Delta table: {exc}") from None
    finally:
        for spark in started:  # an orderly stop, after an error too
            spark.stop()
    click.echo(json.dumps(report.to_dict()))


def submit_to_cluster(master: str, confs: tuple[str, ...]) -> None:
    """Re-runs this command through spark-submit with the same arguments."""
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
    os.execv(submit, args + [str(SUBMIT_SCRIPT), *rest])
