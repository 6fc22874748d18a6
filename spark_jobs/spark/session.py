"""Spark sessions of this package: ``local[*]`` on the edge box by default.

For a user, in this project's Python (a script, a notebook, ``python``)::

    from spark_jobs import spark_session

    spark = spark_session()
    df = spark.read.format("comet").option("path", "./data").option("stream", "events").load()

``spark_session`` points Spark's Python workers at this interpreter (the one
that has this package and its C core) and Spark at the loopback address,
unless ``PYSPARK_PYTHON`` and ``SPARK_LOCAL_IP`` say otherwise, and
registers the ``comet`` data source.

``comet spark-ship`` starts its own session with ``job_session``: no data
source (it reads through its own tasks, and registering one makes Spark
start a Python worker to look up installed sources), and the JVM's output
as JSON log lines (``jvm_output.py``).

Under ``spark-submit`` (a cluster, or a user's own submit) the master and
every setting come from the submit command and nothing here overrides them.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Iterable

DEFAULT_MASTER = "local[*]"


class SparkStartError(RuntimeError):
    """Spark's JVM could not be started (no Java, a broken SPARK_HOME)."""


def under_spark_submit() -> bool:
    """True inside a driver started by spark-submit (the JVM came first)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def spark_session(master: str | None = None, app: str = "comet",
                  conf: Iterable[tuple[str, str]] = ()) -> Any:
    """A SparkSession (``local[*]`` unless ``master`` says otherwise) with
    the ``comet`` data source registered."""
    spark = _builder(settings(master, app, conf)).getOrCreate()
    register(spark)
    return spark


def register(spark: Any) -> None:
    """Makes ``format("comet")`` available in ``spark``."""
    from .source import CometDataSource

    spark.dataSource.register(CometDataSource)


def job_session(master: str | None, conf: Iterable[tuple[str, str]]) -> Any:
    """The session of ``comet spark-ship``: the settings of ``spark_session``,
    no data source, and the JVM's stderr (Spark's log, the JVM's own
    warnings, Python workers' output) as JSON log lines at
    ``COMET_SPARK_LOG_LEVEL`` (default WARN)."""
    from pyspark import SparkConf, SparkContext
    from pyspark.errors import PySparkException

    from .jvm_output import start_jvm_logged
    from .schema import spark_reason

    # Spark's progress bar draws on stderr with carriage returns: not log lines.
    given = {"spark.ui.showConsoleProgress": "false",
             **settings(master, "comet-spark-ship", conf)}
    if not under_spark_submit():  # else the JVM and its output belong to spark-submit
        try:
            gateway = start_jvm_logged(given)
        except PySparkException as exc:
            raise SparkStartError(f"Spark's JVM did not start ({spark_reason(exc)}): it needs "
                                  "Java 17 or later, as JAVA_HOME or java on PATH") from None
        SparkContext(gateway=gateway, conf=SparkConf().setAll(list(given.items())))
    return _builder(given).getOrCreate()


def settings(master: str | None, app: str, conf: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The Spark settings of a session (``conf`` last, so it wins), after
    pointing the environment at this Python and, for a local master, at the
    loopback address: ``PYSPARK_PYTHON`` and ``SPARK_LOCAL_IP`` unless set."""
    # Executors' Python must be the one that has this package (and its C core).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    out = {"spark.app.name": app, "spark.sql.session.timeZone": "UTC"}
    if not under_spark_submit():
        master = master or DEFAULT_MASTER
        out["spark.master"] = master
        if master.startswith("local"):
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
            out["spark.ui.enabled"] = "false"
            # Python workers talk to the JVM over a Unix socket: measured ~+29 %
            # on a raw scan against loopback TCP (Spark 4.1+; ignored before).
            out["spark.python.unix.domain.socket.enabled"] = "true"
    out.update(conf)
    return out


def _builder(given: dict[str, str]) -> Any:
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    for key, value in given.items():
        builder = builder.config(key, value)
    return builder
