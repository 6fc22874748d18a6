"""Power cuts during appends at durability ``interval``: the loss is bounded, batches atomic.

docs/durability-and-sizing.md: with ``interval`` a power failure loses "up to
about fsync_interval_ms of acknowledged batches; 2 x fsync_interval_ms at
most", and "a batch is atomic across crashes".  The writer appends batches of
1-40 entries to two shards (fsync_interval_ms = 100) and stamps each
acknowledgement with CLOCK_MONOTONIC; the cut's instant is on the same clock.
After each cut: every acknowledged batch is there whole or not at all, and the
loss window - the time between the oldest lost acknowledgement and the cut -
stays within 2 x fsync_interval_ms (plus a scheduling allowance).  The measured
windows are printed.
"""

from __future__ import annotations

from .harness import PowerCutFS
from .scenarios import BOUND_S, run_interval


def test_interval_loss_is_bounded_and_batches_atomic(powercut: PowerCutFS) -> None:
    """Batches whole or absent, and the documented 2 x interval bound (plus the
    scheduling allowance) after every cut; the windows are printed."""
    run_interval(powercut, "clean", BOUND_S)
