"""Spark jobs over the Comet log: the ``comet`` data source and ``comet spark-ship``.

    from spark_jobs import spark_session

    spark = spark_session()
    df = spark.read.format("comet").option("path", "./data").option("stream", "events").load()

``spark_session`` (``session.py``) starts a local Spark session whose Python
workers run this interpreter, with the source registered; ``register`` adds
the source to a session started otherwise.
"""

from __future__ import annotations

from .session import register, spark_session

__all__ = ["register", "spark_session"]
