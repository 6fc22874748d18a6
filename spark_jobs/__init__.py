"""Spark jobs over the Comet log: the ``comet`` data source and ``comet spark-ship``.

    import spark_jobs
    spark_jobs.register(spark)
    df = spark.read.format("comet").option("path", "./data").option("stream", "events").load()
"""

from __future__ import annotations

from typing import Any


def register(spark: Any) -> None:
    """Makes ``format("comet")`` available in this Spark session."""
    from .source import CometDataSource

    spark.dataSource.register(CometDataSource)


__all__ = ["register"]
