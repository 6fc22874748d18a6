"""Data retention deleted before a consumer group had it: said in the log
as it happens.

With ``retention_force_delete_after_ms`` set, retention (in this worker's
storage core, for its shards) deletes segments that a group has not
acknowledged once they are that old: the operator chose losing unshipped
data over refusing new data.  The loss is counted per stream in
``comet_stream_retention_lost_entries_total``; this task also logs it once
per check, with the count, so that it is seen where errors are looked for.
One call into the core every CHECK_S.
"""

from __future__ import annotations

import asyncio
import logging

from comet.jsonlog import event

from .runtime import Runtime

CHECK_S = 5.0
log = logging.getLogger("comet.gateway")


async def watch_losses(runtime: Runtime) -> None:
    """Until cancelled: a ``retention_lost_entries`` warning when this worker's
    retention deleted entries a group had not acknowledged."""
    seen = 0
    while True:
        await asyncio.sleep(CHECK_S)
        storage = runtime.log
        if storage is None or storage.closed:
            continue
        total = storage.retention_lost_entries()
        if total > seen:
            event(log, "retention_lost_entries", logging.WARNING, entries=total - seen, total=total,
                  setting="retention_force_delete_after_ms",
                  detail="retention deleted entries that a consumer group had not acknowledged; "
                         "per stream: comet_stream_retention_lost_entries_total")
            seen = total
