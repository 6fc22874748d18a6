"""Power cuts at the core's named cut points (storage_c/src/port/cutpoint.h).

For every named point a writer (writer.py ``cutpoint``: batches at durability
``always`` to one shard with production's 4 MiB chunks and segments larger than
a chunk, retention at about two segments, group ``g`` acknowledged after each
batch) runs until the process dies at that point (``COMET_CUT_POINT=name:nth``,
nth drawn from the run's seed); then the power goes, in mode ``clean``, then
``pages`` (the page cache wrote back some of the dead writer's pages first), then
``clean+dirs`` (a prefix of the unsynced directory changes survives: retention's
unlinks, a rotation's names), and a fresh process recovers.  The recovery points are cut *during* recovery: a
writer at durability ``interval`` dies mid-rotation, the power goes, the next
opener dies at the recovery point, the power goes again, and another opener
recovers.  After each cut, checks.py's checks: every acknowledged entry there
byte for byte (``always``), no ``.orphan`` file, ``verify`` clean, the log a
prefix without holes, and no group offset ahead of the data on disk as read
before recovery.  The output lists, per point and mode, the nth hit, the cuts
and the pages the cut kept; the run's seed is in the session header.
"""

from __future__ import annotations

import json

import pytest

from storage_c.testing import CUT_EXIT, cut_point_names

from .checks import (
    check_acked_survived, check_offsets_before_recovery, shard_entries)
from .harness import (
    ROUNDS, SEED, PowerCutFS, Writer, make_synced_dir, read_state, run_to_exit, seeded,
    writeback)

POINTS = [p for p in cut_point_names()  # those reached above the core: test_ship_otlp.py's, spark-ship's
          if not p.startswith(("ship.", "spark_ship."))]
RECOVERY_POINTS = [p for p in POINTS if p.startswith("recovery.")]
WRITER_POINTS = [p for p in POINTS if p not in RECOVERY_POINTS]
REACH_S = 60  # a point not reached by then fails the test: it names a step that never runs
HITS = {"append.mid_batch": 40, "append.written": 40, "offsets.acked": 40, "grow.sized": 6,
        "offsets.syncing": 6}  # nth drawn from 1..HITS (default 2): hits a writer gets soon


def died_at(proc: Writer, point: str, where: str) -> list[list[str]]:
    """The lines of a process armed to die at ``point``, after checking it did."""
    lines, status = run_to_exit(proc, REACH_S)
    died_at_status(proc, status, point, where)
    return lines


def died_at_status(proc: Writer, status: int, point: str, where: str) -> None:
    err = proc.stderr_path.read_text()
    assert status == CUT_EXIT and f"comet: cut point {point}\n" in err, (
        f"{where}: the process was to die at cut point {point} but ended with status "
        f"{status} (cut point exit: {CUT_EXIT}; -9: not reached in {REACH_S} s):\n{err[-2000:]}")


def read_state_line(lines: list[list[str]], proc: Writer) -> dict:
    """The ``S`` line among a finished process's lines (``drain`` split it in words)."""
    assert lines and lines[0][0] == "S", f"no state: {proc.stderr_path.read_text()}"
    return json.loads(" ".join(lines[0][1:]))


def check_all(state: dict, acked: dict[tuple[int, int], str], where: str) -> None:
    check_offsets_before_recovery(state, "events", "g", where)
    check_acked_survived(state, "events", acked, where, pad=6000, retained=True)


def note(lines: list[list[str]], acked: dict[tuple[int, int], str]) -> None:
    for line in lines:
        if line[0] == "B":
            for i in range(int(line[3])):
                acked[0, int(line[2]) + i] = f"{line[4]}.{i}"


@pytest.mark.parametrize("point", WRITER_POINTS)
def test_power_cut_at_each_named_point(powercut: PowerCutFS, point: str) -> None:
    rng = seeded(f"cutpoint-{point}")
    data = make_synced_dir(powercut.mnt / "data")
    acked: dict[tuple[int, int], str] = {}
    report = []
    rnd = 0
    for _ in range(ROUNDS):
        for mode in MODES:
            rnd += 1
            nth = rng.randint(1, HITS.get(point, 2))
            where = f"{point}:{nth} then a cut ({mode}), seed {SEED}"
            writer = powercut.spawn("cutpoint", data, rnd, rng.randrange(1 << 30), "always",
                                    env={"COMET_CUT_POINT": f"{point}:{nth}"})
            lines = died_at(writer, point, where)
            if lines and lines[0][0] == "S":  # the open before (may die inside it: retention)
                lines = lines[1:]
            note(lines, acked)
            if mode.startswith("pages"):
                writeback(powercut.mnt)  # the dead writer's mapped pages reach the disk, unsynced
            _, kept = powercut.cut(mode, rng.randrange(1 << 30))
            state = read_state(powercut.spawn("cutdump", data, rnd, 0, "always"))
            check_all(state, acked, where)
            report.append(f"{mode} nth={nth} acked={len(acked)} kept_pages={kept}")
    print(f"\ncut point {point} (seed {SEED}): {powercut.cuts} cuts; " + "; ".join(report))


BEFORE_RECOVERY = {"recovery.zeroed": ("append.mid_batch", "always"),
                   "recovery.set_aside": ("rotate.started", "interval")}
"""Where the writer dies before a recovery point, and its durability: a torn batch
leaves bytes past the commit point for recovery to zero (the death drawn from HITS: a
batch has a mid_batch hit for every 4 entries, and a death in the first batch leaves,
after a clean cut, no segment at all, since nothing names it durably before the first
sync; so up to 40 hits, past the first batch in most draws); a segment past the log's end
(set aside) needs entries lost, i.e. ``interval`` with a flusher too slow to have
synced the tail before the rotation (fsync_interval_ms 5000), and no group acks then
(acks of entries not yet durable are test_groups.py's)."""
MODES = ("clean", "pages", "clean+dirs")  # fs.py: +dirs keeps unsynced directory changes in part
ATTEMPTS = 6  # a writer's death that leaves recovery nothing to do at the point: again


@pytest.mark.parametrize("point", RECOVERY_POINTS)
def test_power_cut_during_recovery(powercut: PowerCutFS, point: str) -> None:
    rng = seeded(f"recovery-{point}")
    data = make_synced_dir(powercut.mnt / "data")
    before, durability = BEFORE_RECOVERY.get(point, ("append.mid_batch", "always"))
    acked: dict[tuple[int, int], str] = {}
    report = []
    rnd = 0

    def check(state: dict, where: str) -> None:
        where += (f"; files {sorted(state['files'].items())}; state files before the open "
                  f"(size, header): {state['raw_states']}")
        if durability == "always":
            check_all(state, acked, where)
        else:  # acknowledged entries may be lost (test_interval.py bounds it); the rest whole
            # (a later segment whose pages survived while an earlier one's did not is set
            # aside as .orphan there: the log stays a prefix, FORMAT.md "Recovery" 3)
            for shard in state["streams"]["events"]:
                shard_entries(shard, where)
            assert state["verify"]["ok"], f"{where}: verify: {state['verify']}"

    for _ in range(ROUNDS):
        for mode in MODES:
            for attempt in range(1, ATTEMPTS + 1):
                rnd += 1
                nth = rng.randint(1, HITS.get(before, 3))
                where = (f"{durability} writer at {before}:{nth}, cut, {point} in recovery, "
                         f"cut ({mode}), seed {SEED}")
                writer = powercut.spawn("cutpoint", data, rnd, rng.randrange(1 << 30), durability,
                                        env={"COMET_CUT_POINT": f"{before}:{nth}",
                                             "POWERCUT_ACK": str(int(durability == "always")),
                                             "POWERCUT_FSYNC_MS": "5000"})
                lines = died_at(writer, before, where)
                if durability == "always":
                    note(lines[1:], acked)
                if mode.startswith("pages"):
                    writeback(powercut.mnt)
                _, kept = powercut.cut(mode, rng.randrange(1 << 30))
                recovering = powercut.spawn("cutdump", data, rnd, 0, durability,
                                            env={"COMET_CUT_POINT": f"{point}:1"})
                lines, status = run_to_exit(recovering, REACH_S)
                if status == 0:  # recovered without passing the point: checked, and again
                    check(read_state_line(lines, recovering), where + " (point not reached)")
                    continue
                died_at_status(recovering, status, point, where)
                if mode.startswith("pages"):
                    writeback(powercut.mnt)  # recovery's unsynced repair reaches the disk, in part
                _, kept2 = powercut.cut(mode, rng.randrange(1 << 30))
                check(read_state(powercut.spawn("cutdump", data, rnd, 0, durability)), where)
                report.append(f"{mode}: {before} nth={nth}, attempt {attempt}, "
                              f"kept_pages={kept}+{kept2}")
                break
            else:
                raise AssertionError(f"{point} in recovery: not reached in {ATTEMPTS} writer "
                                     f"deaths at {before} ({mode}), seed {SEED}")
    print(f"\nrecovery cut point {point} ({durability} writer, seed {SEED}): {powercut.cuts} "
          f"cuts; " + "; ".join(report))
