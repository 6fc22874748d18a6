"""What a connection may take of a worker before the app sees a request: the
limits and deadlines of each phase, the connection budget, and the one place
their refusals are counted and logged.

``Limits`` is what gateway.serving.protocol.CometHttpProtocol enforces, built by the
worker from the GatewayConfig (gateway.serving.worker); ``Refusals`` counts each
refusal in the worker's metrics (``comet_http_refused_total``) and logs it
once per reason per minute (``connection_refused``, with ``repeats``), so a
flood of slow clients is one line a minute, not one per connection.
"""

from __future__ import annotations

import logging
import resource
from dataclasses import dataclass, field
from typing import Callable

from .config import GatewayConfig
from .errors import CauseLog
from .metrics import REFUSALS, WorkerMetrics

log = logging.getLogger("comet.gateway.limits")

MAX_DERIVED_CONNECTIONS = 1024
MIN_DERIVED_CONNECTIONS = 16
DESCRIPTORS_KEPT = 64  # the worker's own files besides shards and connections: logs, metrics, pipes


def derived_connections(max_open_shards: int, nofile: int | None = None) -> int:
    """Connections a worker may keep open when max_connections is 0: what its
    file limit leaves after its shards (4 descriptors each, the storage's own
    reckoning: storage_c.Config.max_open_shards) and a few files of its own,
    between MIN_ and MAX_DERIVED_CONNECTIONS.  Accepting past the file limit
    fails in the kernel (EMFILE) for every client alike, unseen by the app."""
    if nofile is None:
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if nofile == resource.RLIM_INFINITY:
        return MAX_DERIVED_CONNECTIONS
    shards = max_open_shards or min(256, max(1, (nofile - 128) // 4))
    return max(MIN_DERIVED_CONNECTIONS,
               min(MAX_DERIVED_CONNECTIONS, nofile - 4 * shards - DESCRIPTORS_KEPT))


class Refusals:
    """Counts and logs what the protocol refused: one ``connection_refused``
    line per reason per minute per worker, with the last client's address."""

    def __init__(self, counts: Callable[[], WorkerMetrics | None] = lambda: None) -> None:
        self.counts = counts
        self.lines = CauseLog(log, "connection_refused", logging.WARNING)

    def refused(self, reason: str, client: object = None, cause: str | None = None,
                **fields: object) -> None:
        """One refusal for ``reason`` (one of gateway.metrics.REFUSALS), logged once a
        minute per reason (and ``cause``, a finer reason of its own)."""
        assert reason in REFUSALS, reason
        metrics = self.counts()
        if metrics is not None:
            metrics.refused(reason)
        address = client[0] if isinstance(client, tuple) and client else client
        self.lines.note((reason, cause), reason=reason, client=address, **fields)


@dataclass(frozen=True)
class Limits:
    """The limits of gateway.config.GatewayConfig that the protocol enforces
    (the docs of each are there and in docs/configuration.md)."""

    max_header_bytes: int = 64 << 10
    max_headers: int = 100
    header_timeout_s: float = 10.0
    idle_timeout_s: float = 5.0
    body_timeout_s: float = 10.0
    body_min_rate: int = 1024
    max_connections: int = MAX_DERIVED_CONNECTIONS
    refusals: Refusals = field(default_factory=Refusals, compare=False)

    @classmethod
    def of(cls, config: GatewayConfig, refusals: Refusals | None = None) -> Limits:
        return cls(max_header_bytes=config.max_header_bytes, max_headers=config.max_headers,
                   header_timeout_s=config.header_timeout_s, idle_timeout_s=config.idle_timeout_s,
                   body_timeout_s=config.body_timeout_s, body_min_rate=config.body_min_rate,
                   max_connections=(config.max_connections
                                    or derived_connections(config.storage.max_open_shards)),
                   refusals=refusals or Refusals())
