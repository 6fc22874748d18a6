"""Generic helpers shared by the load-test benchmarks in ``loadtests/``.

Nothing here knows about the storage engine: medians, the page-allocator
warm-up this VM needs, scratch directories, machine facts, and the markdown /
JSON writers for ``loadtests/results/``.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import shutil
import statistics
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

MiB = 1 << 20
WARM_CHUNK_BYTES = 1 * MiB
DEFAULT_WARM_MIB = 512


def median(values: Sequence[float]) -> float:
    """Median of a non-empty sequence (mean of the two middle values when even)."""
    if not values:
        raise ValueError("median of no values")
    return float(statistics.median(values))


def warm_page_allocator(scratch: Path, mib: int = DEFAULT_WARM_MIB) -> float:
    """Writes ``mib`` MiB to a file in ``scratch`` with 1 MiB writes, deletes it; returns seconds.

    Why: this VM backs guest memory lazily and the host takes freed guest
    memory back.  The first touch of a page the host does not back costs
    ~10 µs per 4 KiB page (measured here: 0.8 s for a first 256 MiB write,
    0.07 s for the same write once warm) - about 250 ns per 100-byte
    entry stored, more than a C append - so a write benchmark that lands on
    such pages swings by up to 5x depending on what ran before it.  Writing
    and deleting a large file makes the host back a few hundred MiB of guest
    pages that the guest then keeps on its free lists; a measurement that
    starts immediately afterwards takes its page-cache and heap pages from
    that warm pool instead of paying the first touch inside the timer.  Call
    it after a case's setup, right before its timer starts.
    """
    scratch.mkdir(parents=True, exist_ok=True)
    path = scratch / "warm-page-allocator.bin"
    chunk = b"\x00" * WARM_CHUNK_BYTES
    t0 = time.perf_counter()
    with open(path, "wb", buffering=0) as f:
        for _ in range(mib * MiB // WARM_CHUNK_BYTES):
            f.write(chunk)
    path.unlink()
    return time.perf_counter() - t0


@dataclass
class Series:
    """Every measured run of one case, plus its unmeasured warm-up run."""

    name: str
    unit: str
    runs: list[float] = field(default_factory=list)
    warmup: float | None = None

    @property
    def median(self) -> float:
        return median(self.runs)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "unit": self.unit, "median": self.median,
                "runs": self.runs, "warmup_run": self.warmup}


def repeat(name: str, unit: str, runs: int, one_run: Callable[[int], float]) -> Series:
    """Calls ``one_run(-1)`` once unmeasured, then ``one_run(0..runs-1)``; keeps every value.

    ``one_run`` must start from a fresh data directory each time and return
    the measured figure for that run.
    """
    return repeat_many({name: unit}, runs, lambda i: {name: one_run(i)})[name]


def repeat_many(units: dict[str, str], runs: int,
                one_run: Callable[[int], dict[str, float]]) -> dict[str, Series]:
    """Like :func:`repeat` for a run that yields several figures (name -> value)."""
    series = {name: Series(name, unit) for name, unit in units.items()}
    for name, value in one_run(-1).items():
        series[name].warmup = value
    for i in range(runs):
        for name, value in one_run(i).items():
            series[name].runs.append(value)
    return series


@dataclass(frozen=True)
class CpuSnapshot:
    """Machine-wide busy CPU seconds and this process's own (children included)."""

    wall: float
    busy: float
    own: float


def cpu_snapshot() -> CpuSnapshot:
    """Reads /proc/stat and os.times(); children count once they have been waited for."""
    hz = os.sysconf("SC_CLK_TCK")
    with open("/proc/stat", encoding="utf-8") as f:
        ticks = [int(x) for x in f.readline().split()[1:9]]  # user..steal (guest is in user)
    idle = ticks[3] + ticks[4]  # idle + iowait
    t = os.times()
    return CpuSnapshot(time.perf_counter(), (sum(ticks) - idle) / hz,
                       t.user + t.system + t.children_user + t.children_system)


def other_cpu_share(start: CpuSnapshot, end: CpuSnapshot) -> float:
    """Fraction of the machine's CPU capacity used by anything but this benchmark
    (other programs, and kernel threads such as writeback) between two snapshots.

    On a 2-CPU machine a value near 0.5 means another program kept one CPU busy:
    single-threaded figures suffer a little, the multi-process ones a lot.
    """
    wall = end.wall - start.wall
    if wall <= 0:
        return 0.0
    other = (end.busy - start.busy) - (end.own - start.own)
    return max(0.0, other / (wall * (os.cpu_count() or 1)))


def _process_ticks() -> dict[int, tuple[int, str]]:
    """pid -> (utime + stime ticks, command line) of every other process."""
    me = os.getpid()
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        cmd = " ".join(cmd.split())  # one line: a `python -c` program holds newlines
        name = cmd or "[" + stat.split("(", 1)[1].rsplit(")", 1)[0] + "]"
        out[int(entry.name)] = (int(fields[11]) + int(fields[12]), name)
    return out


def _busy_since(before: dict[int, tuple[int, str]], after: dict[int, tuple[int, str]],
                seconds: float, min_share: float) -> list[str]:
    """Processes whose CPU share of one CPU between two _process_ticks() was >= min_share,
    busiest first."""
    hz = os.sysconf("SC_CLK_TCK")
    shares = []
    for pid, (ticks, name) in after.items():
        share = (ticks - before.get(pid, (ticks, ""))[0]) / hz / seconds
        if share >= min_share:
            shares.append((share, pid, name))
    return [f"pid {pid} at {share:.0%} of a CPU: {name[:120]}"
            for share, pid, name in sorted(shares, reverse=True)]


def busy_processes(interval_s: float = 1.0, min_share: float = 0.1) -> list[str]:
    """Other processes using at least ``min_share`` of one CPU over ``interval_s`` seconds."""
    before = _process_ticks()
    time.sleep(interval_s)
    return _busy_since(before, _process_ticks(), interval_s, min_share)


@dataclass(frozen=True)
class CpuProbe:
    """Started before a case, read after it: who else used the CPU meanwhile."""

    snapshot: CpuSnapshot
    ticks: dict[int, tuple[int, str]]

    @classmethod
    def start(cls) -> CpuProbe:
        return cls(cpu_snapshot(), _process_ticks())

    def stop(self, min_share: float = 0.05) -> dict[str, Any]:
        """``other_share`` of the machine (see other_cpu_share) and the other processes
        (kernel threads in brackets) that used at least ``min_share`` of a CPU."""
        end = cpu_snapshot()
        seconds = max(end.wall - self.snapshot.wall, 1e-9)
        # This benchmark's own children have exited by now, so they cannot appear here.
        return {"other_share": round(other_cpu_share(self.snapshot, end), 3),
                "busy_others": _busy_since(self.ticks, _process_ticks(), seconds, min_share)}


def loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return "unknown"


def fresh_dir(path: Path) -> Path:
    """An empty directory at ``path`` (whatever was there is removed)."""
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def clear_dir(path: Path) -> None:
    """Removes everything inside ``path``, keeping the directory itself."""
    if not path.is_dir():
        return
    for child in path.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


def _command_output(argv: Sequence[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, check=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _filesystem_of(path: Path) -> str:
    """``fstype source`` of the mount holding ``path`` (longest matching mount point)."""
    best, found = "", "unknown"
    target = str(path.resolve())
    try:
        with open("/proc/mounts", encoding="utf-8") as f:
            for line in f:
                source, mount, fstype = line.split()[:3]
                inside = target == mount or target.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) >= len(best):
                    best, found = mount, f"{fstype} {source} (mounted at {mount})"
    except OSError:
        pass
    return found


def machine_info(scratch: Path) -> dict[str, Any]:
    """Facts needed to compare results across machines."""
    return {
        "nproc": _command_output(["nproc"]),
        "cpu_model": _cpu_model(),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "scratch_dir": str(scratch),
        "scratch_filesystem": _filesystem_of(scratch),
        "memory_total_kib": _meminfo_total_kib(),
    }


def _meminfo_total_kib() -> int | None:
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub-flavoured markdown table with padded columns."""
    widths = [len(h) for h in headers]
    for row in rows:
        if len(row) != len(headers):
            raise ValueError(f"row {row!r} has {len(row)} cells, expected {len(headers)}")
        widths = [max(w, len(c)) for w, c in zip(widths, row)]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(headers), sep, *(line(r) for r in rows)])


def write_atomic(path: Path, text: str) -> None:
    """Writes ``text`` to ``path`` through ``path.tmp`` and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_json(path: Path, data: Any) -> None:
    write_atomic(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def source_state(repo: Path, paths: Sequence[str]) -> dict[str, str]:
    """The commit measured (short hash) and ``git status`` of ``paths`` ("no" if unchanged)."""
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", "-C", str(repo), *args], capture_output=True,
                                  text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    changed = git("status", "--porcelain", "--", *paths)
    return {"commit": git("rev-parse", "--short", "HEAD") or "unknown",
            "code_changed_since_commit": " ".join(changed.split()) if changed else "no"}


def result_row(case: str, key: str | None, figure: float | None, unit: str, figure_text: str, *,
               role: str = "case", anchor: dict[str, Any] | None = None,
               ratio: float | None = None, ratio_text: str = "—",
               target: dict[str, Any] | None = None, target_text: str = "—",
               passed: bool | None = None, verdict: str | None = None,
               reference: str | None = None) -> dict[str, Any]:
    """One row of a benchmark's results in the structured form ``loadtests/report.py`` reads
    (the ``rows`` list of each ``loadtests/results/<area>.json``).

    ``role`` is "case" or "anchor"; ``anchor`` is ``anchor_ref(...)`` of the row this one is
    compared with; ``ratio`` is always in throughput terms: this case's entries (requests,
    rows, bytes) per second ÷ the anchor's for the same work, so > 1 means faster than the
    anchor; ``target`` is ``{"op": "<=" | ">=", "value": float, "unit": str}`` when the target
    is a plain bound on the figure (or on the ratio, unit "x"), None otherwise; ``passed`` is
    None when the row has no target; ``verdict`` is the area table's Pass cell;
    ``reference`` is a figure quoted for comparison but not measured in the run."""
    if verdict is None:
        verdict = "—" if passed is None else ("PASS" if passed else "FAIL")
    return {"case": case, "key": key, "role": role, "figure": figure, "unit": unit,
            "figure_text": figure_text, "anchor": anchor, "ratio": ratio,
            "ratio_text": ratio_text, "target": target, "target_text": target_text,
            "pass": passed, "verdict": verdict, "reference": reference}


def anchor_ref(key: str | None, name: str, figure: float | None, unit: str,
               figure_text: str) -> dict[str, Any]:
    """The ``anchor`` of a :func:`result_row`: which anchor, and its figure in the same run."""
    return {"key": key, "name": name, "figure": figure, "unit": unit,
            "figure_text": figure_text}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
