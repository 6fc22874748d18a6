"""What the benchmarks share: repeated runs and medians, the page-allocator warm-up,
CPU probes, machine facts, result rows and the writers of ``results/<area>.md|json``."""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

MiB = 1 << 20
DEFAULT_WARM_MIB = 512
REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "loadtests" / "results"
BUSY_SHARE = 0.10   # runs where other programs used this much of the machine are named


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def warm_page_allocator(scratch: Path, mib: int = DEFAULT_WARM_MIB) -> float:
    """Writes and deletes ``mib`` MiB in ``scratch`` (seconds taken): this VM's first touch of a
    page costs ~10 µs per 4 KiB, so a timer started after this takes pages from a warm pool."""
    scratch.mkdir(parents=True, exist_ok=True)
    path = scratch / "warm-page-allocator.bin"
    chunk = b"\x00" * MiB
    t0 = time.perf_counter()
    with open(path, "wb", buffering=0) as f:
        for _ in range(mib):
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


def repeat_many(units: dict[str, str], runs: int,
                one_run: Callable[[int], dict[str, float]]) -> dict[str, Series]:
    """``one_run(-1)`` unmeasured, then ``one_run(0..runs-1)``; each returns name -> value."""
    series = {name: Series(name, unit) for name, unit in units.items()}
    for name, value in one_run(-1).items():
        series[name].warmup = value
    for i in range(runs):
        for name, value in one_run(i).items():
            series[name].runs.append(value)
    return series


def repeat(name: str, unit: str, runs: int, one_run: Callable[[], float]) -> Series:
    return repeat_many({name: unit}, runs, lambda i: {name: one_run()})[name]


def _machine_busy() -> tuple[float, float, float]:
    """(wall, busy CPU s of the machine, CPU s of this process and its waited-for children)."""
    with open("/proc/stat", encoding="utf-8") as f:
        ticks = [int(x) for x in f.readline().split()[1:9]]
    t = os.times()
    return (time.perf_counter(), (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK"),
            t.user + t.system + t.children_user + t.children_system)


def process_ticks() -> dict[int, tuple[int, int, str]]:
    """pid -> (utime + stime ticks, parent pid, command line) of every other process."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        name = " ".join(cmd.split()) or "[" + stat.split("(", 1)[1].rsplit(")", 1)[0] + "]"
        out[int(entry.name)] = (int(fields[11]) + int(fields[12]), int(fields[1]), name)
    return out


def _descendants(ticks: dict[int, tuple[int, int, str]]) -> set[int]:
    out: set[int] = set()
    todo = [os.getpid()]
    while todo:
        parent = todo.pop()
        todo += [pid for pid, (_, ppid, _) in ticks.items() if ppid == parent and pid not in out]
        out.update(todo)
    return out


@dataclass(frozen=True)
class CpuProbe:
    """Started before a case, stopped after it: the share of the machine's CPU that anything
    but this benchmark and its live children (a Spark JVM) used meanwhile, and who."""
    start_busy: tuple[float, float, float]
    ticks: dict[int, tuple[int, int, str]]

    @classmethod
    def start(cls) -> CpuProbe:
        return cls(_machine_busy(), process_ticks())

    def stop(self, min_share: float = 0.05) -> dict[str, Any]:
        wall0, busy0, own0 = self.start_busy
        (wall1, busy1, own1), ticks = _machine_busy(), process_ticks()
        tree = _descendants(ticks)
        hz, wall = os.sysconf("SC_CLK_TCK"), max(wall1 - wall0, 1e-9)
        # CPU time of each process since the start; a process of the tree started since counts whole
        used = {pid: (t - self.ticks.get(pid, (0 if pid in tree else t, 0, ""))[0]) / hz
                for pid, (t, _, _) in ticks.items()}
        tree_s = sum(s for pid, s in used.items() if pid in tree)
        other = (busy1 - busy0) - (own1 - own0) - tree_s
        busy = sorted(((s / wall, pid) for pid, s in used.items()
                       if pid not in tree and s / wall >= min_share), reverse=True)
        return {"other_share": round(max(0.0, other / (wall * (os.cpu_count() or 1))), 3),
                "bench_cpus": round((own1 - own0 + tree_s) / wall, 2),
                "busy_others": [f"pid {pid} at {share:.0%} of a CPU: {ticks[pid][2][:120]}"
                                for share, pid in busy]}


def fresh_dir(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def _first(path: str, prefix: str) -> str:
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith(prefix)), "unknown")


def _filesystem_of(path: Path) -> str:
    best, found, target = "", "unknown", str(path.resolve())
    with open("/proc/mounts", encoding="utf-8") as f:
        for line in f:
            source, mount, fstype = line.split()[:3]
            if (target == mount or target.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best):
                best, found = mount, f"{fstype} {source} (mounted at {mount})"
    return found


def machine_info(scratch: Path) -> dict[str, Any]:
    mem = _first("/proc/meminfo", "MemTotal:").split()[0]
    return {"nproc": str(os.cpu_count()), "cpu_model": _first("/proc/cpuinfo", "model name"),
            "kernel": platform.release(), "python": sys.version.split()[0],
            "date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "scratch_dir": str(scratch), "scratch_filesystem": _filesystem_of(scratch),
            "memory_total_kib": int(mem) if mem.isdigit() else None}


def source_state(paths: Sequence[str]) -> dict[str, str]:
    """The commit measured and ``git status`` of ``paths`` ("no" if unchanged)."""
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True,
                                  text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    changed = git("status", "--porcelain", "--", *paths)
    return {"commit": git("rev-parse", "--short", "HEAD") or "unknown",
            "code_changed_since_commit": " ".join(changed.split()) if changed else "no"}


class Context:
    """One benchmark run: the code state and other programs' CPU use at the start; at
    ``machine()``, the machine's facts and whether the measured code changed meanwhile."""

    def __init__(self, name: str, scratch: Path, code: Sequence[str]) -> None:
        self.name, self.scratch, self.code = name, scratch, code
        scratch.mkdir(parents=True, exist_ok=True)
        self.t0 = time.perf_counter()
        self.source = source_state(code)
        probe = CpuProbe.start()
        time.sleep(1.0)  # a second's sample of what else is running
        self.busy = probe.stop(0.1)["busy_others"]
        for line in self.busy:
            self.progress(f"WARNING: machine not idle, {line}")

    def progress(self, text: str) -> None:
        print(f"[{self.name}] {text}", file=sys.stderr, flush=True)

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def machine(self) -> dict[str, Any]:
        return {**machine_info(self.scratch), **self.source, "busy_at_start": self.busy,
                "code_changed_during_run": source_state(self.code) != self.source,
                "loadavg_end": Path("/proc/loadavg").read_text().strip()}

    def write(self, args: argparse.Namespace, area: str, title: str, rows: list[dict[str, Any]],
              notes: list[str], data: dict[str, Any], machine: dict[str, Any] | None = None,
              extra_md: str = "") -> None:
        """write_results with the machine, the mode, the time taken and the machine notes."""
        machine = machine or self.machine()
        write_results(args.results, area, title, rows, [*notes, *machine_notes(machine, self.code)],
                      {"machine": machine, "mode": "quick" if args.quick else "default", **data,
                       "elapsed_s": round(self.elapsed, 1)}, extra_md)


def machine_notes(machine: dict[str, Any], code: Sequence[str]) -> list[str]:
    """The notes on the code measured and the machine, as every report ends."""
    dirs = ", ".join(c if "." in c else c.rstrip("/") + "/" for c in code)
    return [f"- Code: commit {machine['commit']}; {dirs} changed since: "
            f"{machine['code_changed_since_commit']}"
            + ("; CHANGED DURING THE RUN (figures mix versions)"
               if machine["code_changed_during_run"] else "") + ".",
            f"- Machine: {machine['nproc']} CPUs, {machine['cpu_model']}, kernel "
            f"{machine['kernel']}, Python {machine['python']}, scratch on "
            f"{machine['scratch_filesystem']}; {machine['date_utc']}; busy at the start: "
            + ("; ".join(machine["busy_at_start"]) or "nothing") + "."]


def cpu_note(probes: dict[str, dict[str, Any]]) -> str:
    """The busiest of ``probes`` (label -> CpuProbe.stop()) and those at BUSY_SHARE or more."""
    worst = max(probes, key=lambda k: probes[k]["other_share"])
    noisy = [f"{k} ({p['other_share']:.0%}: {'; '.join(p['busy_others'][:2]) or 'unattributed'})"
             for k, p in probes.items() if p["other_share"] >= BUSY_SHARE]
    return (f"- CPU used by other programs (and kernel threads), as a share of the machine: "
            f"max {probes[worst]['other_share']:.0%} ({worst}); at or above {BUSY_SHARE:.0%}: "
            + ("; ".join(noisy) if noisy else "none") + ".")


def fmt_rate(value: float, unit: str) -> str:
    """``1.23 M events/s``, ``45.6 k req/s``, ``789 MB/s``."""
    return (f"{value / 1e6:.2f} M {unit}" if value >= 1e6 else f"{value / 1e3:.1f} k {unit}"
            if value >= 1e4 else f"{value:,.0f} {unit}")


def fmt_value(value: float, unit: str) -> str:
    """``1.23×``, a rate (fmt_rate), ``123 ns/call``, ``45.6 µs/call``."""
    if unit == "x":
        return f"{value:.2f}×"
    if unit.endswith("/s"):
        return fmt_rate(value, unit)
    return f"{value:,.0f} {unit}" if unit.startswith("ns") or value >= 100 else f"{value:,.1f} {unit}"


def row(case: str, key: str | None, figure: float | None, unit: str, figure_text: str = "", *,
        role: str = "case", anchor: dict[str, Any] | None = None, ratio: float | None = None,
        ratio_text: str | None = None, target: dict[str, Any] | None = None,
        target_text: str = "—", passed: bool | None = None, verdict: str | None = None,
        reference: str | None = None, runs_text: str = "—") -> dict[str, Any]:
    """One result row, as ``report.py`` reads it: ``ratio`` in throughput terms (> 1: faster
    than ``anchor``); ``target`` {"op": "<=" | ">=", "value", "unit"} (unit "x": a bound on
    the ratio) decides ``passed`` unless given; ``reference``: a figure quoted, not measured."""
    if figure is not None and not figure_text:
        figure_text = fmt_value(figure, unit)
    if passed is None and target is not None and figure is not None:
        bounded = ratio if target["unit"] == "x" and unit != "x" else figure
        passed = None if bounded is None else (bounded <= target["value"] if target["op"] == "<="
                                               else bounded >= target["value"])
    if verdict is None:
        verdict = "—" if passed is None else ("PASS" if passed else "FAIL")
    if ratio_text is None:
        ratio_text = "—" if ratio is None else f"{ratio:.2f}×"
    return {"case": case, "key": key, "role": role, "figure": figure, "unit": unit,
            "figure_text": figure_text, "anchor": anchor, "ratio": ratio,
            "ratio_text": ratio_text, "target": target, "target_text": target_text,
            "pass": passed, "verdict": verdict, "reference": reference, "runs_text": runs_text}


def anchor_ref(key: str | None, name: str, figure: float | None, unit: str,
               figure_text: str = "") -> dict[str, Any]:
    return {"key": key, "name": name, "figure": figure, "unit": unit,
            "figure_text": figure_text or (fmt_value(figure, unit) if figure is not None else "—")}


def series_row(case: str, s: Series, anchor: Series | None = None, anchor_name: str = "",
               target: tuple[str, float] | None = None, target_text: str = "—",
               reference: str | None = None, target_unit: str | None = None) -> dict[str, Any]:
    """A row from measured series: the ratio in throughput terms whatever the unit (a time
    per call is inverted), the target a bound on the figure (target_unit "x": on the ratio)."""
    faster = s.unit.endswith("/s") or s.unit == "x"
    return row(case, s.name, s.median, s.unit, role="anchor" if case.startswith("Anchor:") else "case",
               anchor=None if anchor is None else anchor_ref(anchor.name, anchor_name, anchor.median,
                                                             anchor.unit),
               ratio=None if anchor is None else (s.median / anchor.median if faster
                                                  else anchor.median / s.median),
               target=None if target is None else {"op": target[0], "value": target[1],
                                                   "unit": target_unit or s.unit},
               target_text=target_text, reference=reference, runs_text=runs_text(s))


def sweep_table(sweep: dict[str, Any]) -> str:
    """storage.json's ``batch_sweep`` as a table: M entries/s of every line by batch size."""
    sizes = sweep["batch_sizes"]
    return markdown_table(["M entries/s (median)", *(f"batch {n}" for n in sizes)],
                          [[line["label"], *(f"{by[n] / 1e6:.2f}" if n in by else "—" for n in sizes)]
                           for line in sweep_lines(sweep)
                           for by in [{int(p["batch"]): p["entries_per_s"] for p in line["points"]}]])


def sweep_lines(sweep: dict[str, Any]) -> list[dict[str, Any]]:
    return [*sweep["lines"], *sweep.get("extra_points", [])]


def build_c(source: Path, out: Path) -> Path:
    """``source`` compiled with the storage core into ``out`` (-O2, as the extension is built)."""
    core = REPO / "storage_c"
    subprocess.run(["gcc", "-std=c11", "-D_GNU_SOURCE", "-O2", "-Wall", "-Wextra", "-Werror",
                    "-I", str(core / "include"), "-I", str(core / "src"),
                    *sorted(str(p) for p in (core / "src").glob("*/*.c")), str(source), "-o", str(out),
                    "-lzstd", "-lpthread"], check=True, cwd=REPO, timeout=300)
    return out


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(c).replace("|", "\\|").replace("\n", " ") for c in r] for r in [headers, *rows]]
    return "\n".join(["| " + " | ".join(cells[0]) + " |", "|" + "---|" * len(headers),
                      *("| " + " | ".join(r) + " |" for r in cells[1:])])


def rows_table(rows: Sequence[dict[str, Any]]) -> str:
    def vs(r: dict[str, Any]) -> str:
        a = r["anchor"]
        text = " ".join(([] if r["ratio"] is None else [r["ratio_text"]]) + (
            [] if a is None else [f"({a['name'].removeprefix('Anchor: ')}: {a['figure_text']})"]))
        return "; ".join(t for t in (text, r["reference"]) if t) or "—"
    return markdown_table(["Case", "Measured (median)", "Target", "Pass", "vs anchor", "Runs"],
                          [[r["case"], r["figure_text"], r["target_text"], r["verdict"], vs(r),
                            r["runs_text"]] for r in rows])


def runs_text(s: Series) -> str:
    unit = "" if s.unit == "x" else f" {s.unit}"
    return ", ".join(fmt_value(v, s.unit).removesuffix(unit) for v in s.runs) + unit


def parser(doc: str, quick: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help=quick)
    p.add_argument("--results", type=Path, default=RESULTS,
                   help="directory of the <area>.md / <area>.json written (default "
                        "loadtests/results; give a scratch one for trial runs)")
    return p


def write_results(results: Path, area: str, title: str, rows: list[dict[str, Any]],
                  notes: list[str], data: dict[str, Any], extra_md: str = "") -> None:
    """Prints the table and notes, then the rows as one JSON line; writes ``<area>.md``
    (table, notes) and ``<area>.json`` (``data`` plus the rows)."""
    text = (f"# {title}\n\n{rows_table(rows)}\n" + (f"\n{extra_md}\n" if extra_md else "")
            + "\nNotes:\n\n" + "\n".join(notes) + "\n")
    print(text)
    print(json.dumps({"rows": rows}, ensure_ascii=False))
    results.mkdir(parents=True, exist_ok=True)
    write_atomic(results / f"{area}.md", text)
    write_atomic(results / f"{area}.json",
                 json.dumps({**data, "rows": rows}, indent=2, ensure_ascii=False, default=str) + "\n")


def write_atomic(path: Path, text: str) -> None:
    path.with_name(path.name + ".tmp").write_text(text, encoding="utf-8")
    os.replace(path.with_name(path.name + ".tmp"), path)
