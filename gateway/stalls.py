"""The loop monitor: how long a worker's event loop was blocked.

A task asks to wake every TICK_S and measures how late it woke: the loop
could not run it (nor any request) meanwhile - a long call on the loop, a
pause of the whole process (swap, SIGSTOP, a stopped VM).  Each tick goes
into the worker's metrics (WorkerMetrics.tick), which keep the worst per
second for /metrics.  A block shorter than TICK_S that ends before the
wake-up is not seen; one longer than that shows as at least its length minus
TICK_S; a wake-up is normally late by a millisecond or so (the loop's timers
round to milliseconds), more on a busy machine, where the process waits for
a CPU.  A wake-up every 10 ms costs the loop well under 0.1 % of its time.
"""

from __future__ import annotations

import asyncio
import time

from .runtime import Runtime

TICK_S = 0.01


async def watch_loop(runtime: Runtime) -> None:
    """Until cancelled: the lateness of every wake-up into runtime.metrics (once it has them)."""
    while True:
        # the clock, not loop.time(): uvloop's is in whole milliseconds, as of the
        # iteration's start
        due = time.monotonic() + TICK_S
        await asyncio.sleep(TICK_S)
        metrics = runtime.metrics
        if metrics is not None:
            metrics.tick(max(0.0, time.monotonic() - due))
