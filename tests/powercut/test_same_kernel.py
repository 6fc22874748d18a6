"""A cut the kernel survives: the processes are killed and the unsynced data is
dropped, but the boot id stays the same (LazyFS-style; a volume detached and
attached again).  The durable copy of a shard's state was written by the
msync of the durable point, with the sync lock held, so it says "locked" by a
thread that is gone; no robust-list cleanup ever reaches that copy, and the
boot id gives no reason to re-initialise.  What does: no living process holds
the state's shared lock, so the first opener resets the lock words
(storage_c/FORMAT.md, shard state).  Every reopen must answer within a timeout.
"""

from __future__ import annotations

import json
import queue
import threading

import pytest

from .checks import check_acked_survived
from .harness import PowerCutFS, Writer, make_synced_dir

TIMEOUT_S = 30
ROUNDS = 3


class Lines:
    """A process's stdout lines, read by a thread: waited for with a timeout."""

    def __init__(self, proc: Writer) -> None:
        self.proc = proc
        self.q: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout
        for line in self.proc.stdout:
            self.q.put(line)
        self.q.put(None)

    def next(self, what: str) -> str:
        try:
            line = self.q.get(timeout=TIMEOUT_S)
        except queue.Empty:
            pytest.fail(f"{what}: nothing in {TIMEOUT_S} s (waiting for a lock nobody holds?); "
                        f"stderr:\n{self.proc.stderr_path.read_text()}")
        assert line is not None, (f"{what}: the process ended (exit {self.proc.wait()}):\n"
                                  f"{self.proc.stderr_path.read_text()}")
        return line

    def rest(self) -> list[list[str]]:
        """Complete lines of a killed process."""
        out = []
        while (line := self.q.get(timeout=TIMEOUT_S)) is not None:
            if line.endswith("\n"):
                out.append(line.split())
        return out


def acked_of(lines: list[list[str]]) -> dict[tuple[int, int], str]:
    return {(int(l[1]), int(l[2])): l[3] for l in lines if l[0] == "A"}


def test_a_cut_the_kernel_survives_reopens_without_waiting(powercut: PowerCutFS) -> None:
    """Was a hang: a writer appends with ``always`` (every sync msyncs the state
    now and then, under the sync lock); the power-cut filesystem drops what was
    not synced and the writer is killed, with the boot id kept.  The next writer,
    a fresh process, must report what survived and go on appending (both locks
    taken) within the timeout, three cuts in a row, every acknowledged entry kept."""
    data = make_synced_dir(powercut.mnt / "data")
    acked: dict[tuple[int, int], str] = {}
    for rnd in range(ROUNDS + 1):
        writer = powercut.spawn("append", data, rnd, rnd, "always", 2)
        lines = Lines(writer)
        state_line = lines.next(f"reopen after cut {rnd}" if rnd else "first open")
        assert state_line.startswith("S "), state_line
        check_acked_survived(json.loads(state_line[2:]), "events", acked, f"after cut {rnd}")
        acked.update(acked_of([lines.next(f"append after cut {rnd}").split() for _ in range(40)]))
        if rnd == ROUNDS:
            break
        boot = powercut.boot_file.read_text()
        powercut.cut("clean", rnd)
        powercut.boot_file.write_text(boot)  # the same kernel: the boot id stays
        acked.update(acked_of(lines.rest()))
