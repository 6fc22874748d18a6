"""Test hooks of the C core (comet.h, "Testing"): injected faults and a movable clock.

Every call the core makes to the operating system goes through one table
(``storage_c/src/sys.h``).  ``faults`` makes the Nth call of chosen kinds fail
with an errno, once or from then on; ``clock_shifted`` moves the clocks the
core reads, so that a test can age data without sleeping.  Both are
process-wide: use them from one thread, and never in production.

    with faults(SYNC, nth=1, err=errno.EIO) as plan:
        with pytest.raises(CometIOError):
            log.sync("s")
    assert plan.fired == 1
"""

from __future__ import annotations

import errno
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

from ._comet import lib

OPEN = lib.COMET_FAULT_OPEN        # open, opendir
SIZE = lib.COMET_FAULT_SIZE        # fallocate, ftruncate, pwrite
MAP = lib.COMET_FAULT_MAP          # mmap
SYNC = lib.COMET_FAULT_SYNC        # msync, fdatasync, fsync
NAME = lib.COMET_FAULT_NAME        # rename, link, mkdir
REMOVE = lib.COMET_FAULT_REMOVE    # unlink, rmdir
READDIR = lib.COMET_FAULT_READDIR  # readdir
ALLOC = lib.COMET_FAULT_ALLOC      # malloc, calloc, realloc
ALL = lib.COMET_FAULT_ALL


@dataclass
class FaultPlan:
    kinds: int
    nth: int

    @property
    def calls(self) -> int:
        """Calls of the armed kinds since the arming."""
        return int(lib.comet_fault_calls())

    @property
    def fired(self) -> int:
        """Of those, how many were made to fail."""
        return int(lib.comet_fault_fired())


@contextmanager
def faults(kinds: int, nth: int = 1, err: int = errno.EIO, *,
           persist: bool = False) -> Iterator[FaultPlan]:
    """The ``nth`` call (1: the next) of ``kinds`` fails with ``err``; with
    ``persist``, every later one too.  Disarmed on leaving the block."""
    lib.comet_fault_arm(kinds, nth, err, int(persist))
    try:
        yield FaultPlan(kinds, nth)
    finally:
        lib.comet_fault_disarm()


@contextmanager
def clock_shifted(seconds: float) -> Iterator[None]:
    """The core's clocks run ``seconds`` ahead inside the block."""
    shift = int(seconds * 1e9)
    lib.comet_clock_shift(shift)
    try:
        yield
    finally:
        lib.comet_clock_shift(-shift)
