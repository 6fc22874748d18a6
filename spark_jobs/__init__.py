"""Spark jobs over the Comet log, and the lake they write.

    from spark_jobs import spark_session

    spark = spark_session()
    df = spark.read.format("comet").option("path", "./data").option("stream", "events").load()

Two rooms: ``lake/`` (the Delta tables and ``comet lake``, no Spark) and
``spark/`` (the ``comet`` data source and ``comet spark-ship``), which uses
``lake/`` and never the other way.  ``spark_session`` (``spark/session.py``)
starts a local Spark session whose Python workers run this interpreter, with
the source registered; ``register`` adds the source to a session started
otherwise.  Both load on first use, so that the lake alone loads nothing of
``spark/``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .spark.session import register, spark_session

__all__ = ["register", "spark_session"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from .spark import session

        return getattr(session, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
