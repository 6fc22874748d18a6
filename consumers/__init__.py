"""Consumers of a Comet data directory: consumer groups, the processing loop,
and the shipping worker that drains a stream into NDJSON.zst objects.

    from consumers import Consumer

    with Consumer("./data", "events", "indexer") as c:
        c.process(handle_batch, max_retries=3, stop=stop_event)
"""

from .consumer import Consumer
from .errors import ShipError, SinkError, SinkFailure, classify
from .loop import ProcessingError, ProcessStats
from .ship import ShipConfig, Shipper, ShipStats, object_key
from .sinks import DirectorySink, S3Sink, Sink, sink_from_url

__all__ = [
    "Consumer",
    "DirectorySink",
    "ProcessStats",
    "ProcessingError",
    "S3Sink",
    "ShipConfig",
    "ShipError",
    "ShipStats",
    "Shipper",
    "Sink",
    "SinkError",
    "SinkFailure",
    "classify",
    "object_key",
    "sink_from_url",
]
