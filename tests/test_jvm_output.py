"""spark_jobs.spark.jvm_output: each line of Spark's JVM's stderr becomes a log record
(no JVM needed: the lines are given as the JVM writes them)."""

from __future__ import annotations

import logging

import pytest

from spark_jobs.spark.jvm_output import STDERR_LOGGER, log_line


def records(caplog: pytest.LogCaptureFixture, *lines: bytes) -> list[tuple[str, int, str]]:
    caplog.clear()
    with caplog.at_level(logging.DEBUG):
        for line in lines:
            log_line(line)
    return [(r.name, r.levelno, r.getMessage()) for r in caplog.records]


def test_a_log4j_event_keeps_its_logger_and_level(caplog: pytest.LogCaptureFixture) -> None:
    line = (b'{"log4j": "ERROR", "logger": "org.apache.spark.SparkContext", '
            b'"message": "Error initializing \\"x\\""}\n')
    assert records(caplog, line) == [("org.apache.spark.SparkContext", logging.ERROR,
                                      'Error initializing "x"')]


def test_other_lines_are_warnings_except_the_known_start_note(caplog: pytest.LogCaptureFixture) -> None:
    assert records(caplog, b"WARNING: Using incubator modules: jdk.incubator.vector\n",
                   b"Exception in thread main\n", b"\n", b'{"log4j": broken\n') == [
        (STDERR_LOGGER, logging.DEBUG, "WARNING: Using incubator modules: jdk.incubator.vector"),
        (STDERR_LOGGER, logging.WARNING, "Exception in thread main"),
        (STDERR_LOGGER, logging.WARNING, '{"log4j": broken'),
    ]
