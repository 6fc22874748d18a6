"""Power cuts while a consumer group acknowledges: an offset is never ahead of the data.

Two real processes, as in production: a writer appending at durability
``interval`` and a consumer (``comet ship``'s role: another process) reading
and acknowledging group ``g``.  Each process's flusher syncs what it changed -
the writer the segments, the consumer the offsets file - independently.  After
each cut, before anything opens the log, the offsets file's raw content is read;
then recovery runs.  A group offset must never point past the entries that
survived: the entries in between would be skipped, never delivered, and new
entries appended under those numbers silently dropped for the group.
"""

from __future__ import annotations

from .harness import PowerCutFS
from .scenarios import run_groups


def test_group_offsets_never_ahead_of_surviving_data(powercut: PowerCutFS) -> None:
    run_groups(powercut, "clean")
