"""The output of Spark's JVM as JSON log lines, for ``comet spark-ship``.

The driver's JVM writes to its stderr: Spark's log (log4j), the JVM's own
warnings, and what its Python workers print.  ``start_jvm_logged`` starts
that JVM with ``log4j2.properties`` (each log4j event one JSON object: level,
logger, message with its stack trace) and its stderr on a pipe, which a
thread reads: a log4j event is logged under its own logger name at its own
level, any other line under ``spark.jvm.stderr`` as a warning.  So every
line reaches this process's logging, and its JSON handler
(``comet.jsonlog``).

``COMET_SPARK_LOG_LEVEL`` (a log4j level, default WARN) is the threshold of
both: Spark's log is filtered in the JVM, the other lines here.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import IO, Any

import orjson

LOG_LEVEL_ENV = "COMET_SPARK_LOG_LEVEL"
STDERR_LOGGER = "spark.jvm.stderr"
LOG4J_CONFIG = Path(__file__).with_name("log4j2.properties")
LEVELS = {"ALL": logging.NOTSET, "TRACE": logging.DEBUG, "DEBUG": logging.DEBUG,
          "INFO": logging.INFO, "WARN": logging.WARNING, "ERROR": logging.ERROR,
          "FATAL": logging.CRITICAL, "OFF": logging.CRITICAL + 10}
_LOG4J_EVENT = b'{"log4j": '
# What the JVM prints at every start of Spark 4, true and harmless (Spark asks
# for the incubating vector API itself): logged at debug, not as a warning.
JVM_START_NOTES = frozenset({b"WARNING: Using incubator modules: jdk.incubator.vector"})


def spark_log_level() -> str:
    """``COMET_SPARK_LOG_LEVEL``, checked: a log4j level name."""
    name = os.environ.get(LOG_LEVEL_ENV, "WARN")
    level = name.strip().upper()
    if level not in LEVELS:
        raise ValueError(f"{LOG_LEVEL_ENV}={name!r}: use one of {', '.join(LEVELS)}")
    return level


def start_jvm_logged(settings: dict[str, str]) -> Any:
    """Starts the driver's JVM (a py4j gateway) with its log as JSON lines and
    its stderr read into this process's logging; the gateway, for
    ``SparkContext(gateway=...)``."""
    from pyspark import SparkConf
    from pyspark.java_gateway import launch_gateway

    level = spark_log_level()
    options = " ".join(filter(None, [settings.get("spark.driver.extraJavaOptions", ""),
                                     f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
                                     f"-Dcomet.spark.log.level={level}"]))
    conf = SparkConf().setAll([*settings.items(), ("spark.driver.extraJavaOptions", options)])
    read_end, write_end = os.pipe()
    try:
        gateway = launch_gateway(conf, popen_kwargs={"stderr": write_end})
    except BaseException:
        os.close(read_end)
        raise
    finally:
        os.close(write_end)  # the JVM has its copy: the pipe ends when the JVM does
    logging.getLogger(STDERR_LOGGER).setLevel(LEVELS[level])
    reader = threading.Thread(target=forward, args=(os.fdopen(read_end, "rb"),),
                              name="jvm-stderr", daemon=True)
    reader.start()
    return gateway


def forward(stream: IO[bytes]) -> None:
    """Logs each line of the JVM's stderr until it closes."""
    with stream:
        for line in stream:
            log_line(line)


def log_line(line: bytes) -> None:
    """One line of the JVM's stderr, logged: a log4j event as itself, any
    other line as a warning of ``spark.jvm.stderr``."""
    line = line.rstrip(b"\r\n")
    if not line.strip():
        return
    if line.startswith(_LOG4J_EVENT):
        try:
            doc = orjson.loads(line)
            logging.getLogger(str(doc["logger"])).log(LEVELS.get(str(doc["log4j"]), logging.WARNING),
                                                      str(doc["message"]))
            return
        except (orjson.JSONDecodeError, KeyError, TypeError):
            pass  # not one of ours after all: logged as it is
    level = logging.DEBUG if line in JVM_START_NOTES else logging.WARNING
    logging.getLogger(STDERR_LOGGER).log(level, line.decode("utf-8", "replace"))
