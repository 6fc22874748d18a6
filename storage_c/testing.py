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


CUT_EXIT = lib.COMET_CUT_EXIT
"""The exit status of a process that died at its armed cut point."""


def cut_point_names() -> list[str]:
    """Every named cut point of the core (storage_c/src/cutpoint.h), in its order."""
    from ._comet import ffi

    names: list[str] = []
    while (name := lib.comet_cut_point_name(len(names))) != ffi.NULL:
        names.append(ffi.string(name).decode())
    return names


def arm_cut_point(name: str | None, nth: int = 1) -> None:
    """The ``nth`` hit of cut point ``name`` ends this process (``_exit(CUT_EXIT)``);
    None disarms.  Subprocesses: ``COMET_CUT_POINT=name:nth`` in their environment."""
    if lib.comet_cut_arm(name.encode() if name is not None else _null(), nth) != 0:
        raise ValueError(f"no cut point named {name!r} (nth {nth}); see cut_point_names()")


def _null() -> object:
    from ._comet import ffi

    return ffi.NULL
