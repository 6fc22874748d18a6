"""Test hooks of the C core (comet_testing.h): injected faults and a movable clock.

Every call the core makes to the operating system goes through one table
(``storage_c/src/port/sys.h``).  ``faults`` makes the Nth call of chosen kinds fail
with an errno, once or from then on; ``fault_plan`` puts several rules in
force at once (each its kinds, nth call, how many calls, errno; ``SHORT``
shortens reads and writes, ``errno.EINTR`` interrupts calls, which the core
must retry); ``clock_shifted`` moves the clocks the core reads, so that a
test can age data without sleeping.  All are process-wide: use them from one
thread, and never in production.

    with faults(SYNC, nth=1, err=errno.EIO) as plan:
        with pytest.raises(CometIOError):
            log.sync("s")
    assert plan.fired == 1

    with fault_plan(Rule(READ | WRITE, err=SHORT, count=0),
                    Rule(SYNC, nth=3, err=errno.EROFS)):
        ...
"""

from __future__ import annotations

import errno
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

from ._comet import ffi, lib

OPEN = lib.COMET_FAULT_OPEN        # open, opendir
SIZE = lib.COMET_FAULT_SIZE        # fallocate, ftruncate, pwrite
MAP = lib.COMET_FAULT_MAP          # mmap
SYNC = lib.COMET_FAULT_SYNC        # msync, fdatasync, fsync
NAME = lib.COMET_FAULT_NAME        # rename, link, mkdir
REMOVE = lib.COMET_FAULT_REMOVE    # unlink, rmdir
READDIR = lib.COMET_FAULT_READDIR  # readdir
ALLOC = lib.COMET_FAULT_ALLOC      # malloc, calloc, realloc
READ = lib.COMET_FAULT_READ        # pread
WRITE = lib.COMET_FAULT_WRITE      # pwrite (also a SIZE call)
UNMAP = lib.COMET_FAULT_UNMAP      # munmap, madvise
CLOSE = lib.COMET_FAULT_CLOSE      # close, closedir
STAT = lib.COMET_FAULT_STAT        # fstat, stat, statvfs
LOCK = lib.COMET_FAULT_LOCK        # flock, fcntl record locks
ALL = lib.COMET_FAULT_ALL
KINDS = {"open": OPEN, "size": SIZE, "map": MAP, "sync": SYNC, "name": NAME, "remove": REMOVE,
         "readdir": READDIR, "alloc": ALLOC, "read": READ, "write": WRITE, "unmap": UNMAP,
         "close": CLOSE, "stat": STAT, "lock": LOCK}

SHORT = lib.COMET_FAULT_SHORT      # err: a read or write moves half of what it was asked
CRASH = lib.COMET_FAULT_CRASH      # err: the process dies at that call (exit CRASH_EXIT)
CRASH_EXIT = lib.COMET_FAULT_CRASH_EXIT


@dataclass(frozen=True)
class Rule:
    """The ``nth`` call of ``kinds`` (1: the next, counted from the arming)
    and the ``count - 1`` after it fail with ``err``; ``count=0``: every
    later one too."""
    kinds: int
    nth: int = 1
    count: int = 1
    err: int = errno.EIO


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
    lib.comet_fault_clear()
    rule = ffi.new("comet_fault_rule *", {"kinds": kinds, "nth": nth,
                                            "count": 0 if persist else 1, "err": err})
    # Refused only for a persistent EINTR (the core retries EINTR, so the call
    # would never return): nothing is armed then.
    lib.comet_fault_add(rule)
    try:
        yield FaultPlan(kinds, nth)
    finally:
        lib.comet_fault_clear()


@contextmanager
def fault_plan(*rules: Rule) -> Iterator[FaultPlan]:
    """Every rule in force at once inside the block (their calls and fired
    counts add up in the plan); cleared on leaving it."""
    lib.comet_fault_clear()
    try:
        for r in rules:
            rule = ffi.new("comet_fault_rule *", {"kinds": r.kinds, "nth": r.nth,
                                                    "count": r.count, "err": r.err})
            if lib.comet_fault_add(rule) != 0:
                raise ValueError(f"fault rule refused: {r} (EINTR for ever, no kind, or too many rules)")
        yield FaultPlan(ALL, rules[0].nth if rules else 1)
    finally:
        lib.comet_fault_clear()


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
    """Every named cut point of the core (storage_c/src/port/cutpoint.h), in its order."""
    from ._comet import ffi

    names: list[str] = []
    while (name := lib.comet_cut_point_name(len(names))) != ffi.NULL:
        names.append(ffi.string(name).decode())
    return names


def cut_point(name: str) -> None:
    """Code above the core reaching its named cut point (cutpoint.h: ``ship.*``,
    ``spark_ship.*``): armed (``COMET_CUT_POINT``), the nth hit ends the process there."""
    if lib.comet_cut_reached(name.encode()) != 0:
        raise ValueError(f"no cut point named {name!r}; see storage_c/src/port/cutpoint.h")


def arm_cut_point(name: str | None, nth: int = 1) -> None:
    """The ``nth`` hit of cut point ``name`` ends this process (``_exit(CUT_EXIT)``);
    None disarms.  Subprocesses: ``COMET_CUT_POINT=name:nth`` in their environment."""
    if lib.comet_cut_arm(name.encode() if name is not None else _null(), nth) != 0:
        raise ValueError(f"no cut point named {name!r} (nth {nth}); see cut_point_names()")


def _null() -> object:
    from ._comet import ffi

    return ffi.NULL
