"""Performance report: the four benchmark areas in one page, plus the storage batch chart.

Reproduce (from the repository root)::

    make bench                                  # every benchmark, then this script
    make report                                 # only this script, from the existing results
    .venv/bin/python loadtests/report.py [--results DIR] [--out FILE] [--chart FILE]

Reads ``loadtests/results/{storage,consumers,gateway,spark}.json`` (and
``loadtest.json`` of ``make loadtest`` when present) and writes
``loadtests/results/REPORT.md`` and ``loadtests/results/storage_batch.png``
(throughput against batch size of the storage core and its anchors, from the
``batch_sweep`` section of storage.json).  It measures nothing itself: every
figure, anchor, ratio, target and verdict comes from the ``rows`` list each
benchmark writes (``benchlib.result_row``); result files older than that
list are read from their markdown-ish ``table`` instead, with fewer columns.
The notes under each table are the benchmark's own (its ``<area>.md``).  An
area whose JSON file is missing or unreadable is reported as not run.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import itertools
import json
import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
CHART_NAME = "storage_batch.png"


@dataclass(frozen=True)
class Area:
    key: str                       # <key>.json and <key>.md under the results directory
    title: str
    script: str                    # its benchmark, for the per-area reproduce line
    headline: tuple[str, ...]      # row keys quoted in the summary, in order


AREAS = (
    Area("storage", "Storage core (issue 2)", "loadtests/bench_storage.py",
         ("c_append_single", "c_append_batch_1000", "py_batch_1000", "py_read")),
    Area("consumers", "Consumers (issue 3)", "loadtests/bench_consumers.py",
         ("ack_group", "read_ack", "ship_dir")),
    Area("gateway", "Gateway (issue 4)", "loadtests/bench_gateway.py",
         ("gateway_single", "gateway_ndjson", "gateway_ndjson_novalidate",
          "gateway_single_paced")),
    Area("spark", "Spark (issue 5)", "loadtests/bench_spark.py",
         ("comet_raw", "comet_ship")),
)
LOADTEST = Area("loadtest", "Load test with locust (issue 6)", "make loadtest", ())
SOAK = Area("soak", "Soak test (issue 6)", "make soak", ())
# The figures of loadtests/loadtest.py's result file shown in the report, in order.
LOADTEST_FIELDS = (("ok", "Passed (no loss, thresholds met)"), ("duration_s", "Load, s"),
                   ("users", "Locust users"), ("workers", "Gateway workers"),
                   ("requests", "Requests"), ("failures", "Failures"),
                   ("req_per_s", "Requests/s"), ("events_per_s", "Events/s acknowledged"),
                   ("p50_ms", "p50, ms"), ("p95_ms", "p95, ms"), ("p99_ms", "p99, ms"),
                   ("events_acked", "Events acknowledged (202)"),
                   ("events_stored", "Events stored (read back)"), ("problems", "Problems"))

# Go Comet's ns per call by batch size as quoted in issue 2 (storage.json carries the same).
GO_REFERENCE_NS = {1: (720, 900), 10: (3000, 3000), 100: (25000, 36000), 1000: (105000, 246000)}


# ---- reading the results -------------------------------------------------------------------------


@dataclass
class AreaResult:
    area: Area
    status: str                             # "ok", "missing" or "unreadable: ..."
    data: dict[str, Any] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)
    structured: bool = True                 # rows from the JSON "rows" list (not a text table)
    notes: list[str] = field(default_factory=list)
    md_path: Path | None = None

    @property
    def ran(self) -> bool:
        return self.status == "ok"

    @property
    def machine(self) -> dict[str, Any]:
        m = self.data.get("machine")
        return m if isinstance(m, dict) else {}

    def cases(self) -> list[dict[str, Any]]:
        """The rows that are not anchors (the anchors show in each row's anchor column)."""
        return [r for r in self.rows if r.get("role") != "anchor"]

    def targeted(self) -> list[dict[str, Any]]:
        return [r for r in self.cases() if r.get("pass") is not None]


def load_area(results: Path, area: Area) -> AreaResult:
    path = results / f"{area.key}.json"
    md = results / f"{area.key}.md"
    if not path.exists():
        return AreaResult(area, "missing")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as exc:
        return AreaResult(area, f"unreadable: {type(exc).__name__}: {exc}")
    md_text = md.read_text(encoding="utf-8") if md.exists() else ""
    result = AreaResult(area, "ok", data, md_path=md if md.exists() else None)
    if isinstance(data.get("rows"), list):
        result.rows = [normalise_row(r) for r in data["rows"] if isinstance(r, dict)]
    else:
        result.structured = False
        result.rows = legacy_rows(data.get("table"), md_text)
    notes = data.get("notes")
    result.notes = ([str(n) for n in notes] if isinstance(notes, list)
                    else md_notes(md_text))
    return result


def normalise_row(row: dict[str, Any]) -> dict[str, Any]:
    """A ``benchlib.result_row`` dict with every key present (older or hand-written files)."""
    out = {"case": "?", "key": None, "role": "case", "figure": None, "unit": "",
           "figure_text": "—", "anchor": None, "ratio": None, "ratio_text": "—",
           "target": None, "target_text": "—", "pass": None, "verdict": None,
           "reference": None}
    out.update(row)
    if out["verdict"] is None:
        out["verdict"] = "—" if out["pass"] is None else ("PASS" if out["pass"] else "FAIL")
    return out


def verdict_pass(verdict: str) -> bool | None:
    text = verdict.strip()
    if text.startswith("PASS"):
        return True
    if text.startswith("FAIL"):
        return False
    return None


def legacy_rows(table: Any, md_text: str) -> list[dict[str, Any]]:
    """Rows from a result file without "rows": its JSON "table" ({"headers", "rows"} or a
    list of dicts) or else the first table of its markdown file, by column name."""
    headers: list[str] = []
    cells: list[list[str]] = []
    if isinstance(table, dict) and isinstance(table.get("rows"), list):
        headers = [str(h) for h in table.get("headers", [])]
        cells = [[str(c) for c in row] for row in table["rows"]]
    elif isinstance(table, list) and table and all(isinstance(r, dict) for r in table):
        names = {"case": "Case", "measured": "Measured (median)", "target": "Target",
                 "passed": "Pass", "ratio": "vs anchor"}
        headers = [names.get(k, k) for k in table[0]]
        cells = [[str(v) for v in row.values()] for row in table]
    else:
        headers, cells = md_table(md_text)

    def column(*prefixes: str) -> int | None:
        for i, h in enumerate(headers):
            if any(h.lower().startswith(p.lower()) for p in prefixes):
                return i
        return None

    c_case, c_fig = column("Case"), column("Measured", "Figure")
    c_target, c_pass, c_anchor = column("Target"), column("Pass"), column("vs anchor")
    out = []
    for row in cells:
        def cell(i: int | None) -> str:
            return row[i] if i is not None and i < len(row) else "—"
        case = cell(c_case if c_case is not None else 0)
        verdict = cell(c_pass)
        out.append(normalise_row({
            "case": case, "role": "anchor" if case.lower().startswith("anchor") else "case",
            "figure_text": cell(c_fig), "ratio_text": cell(c_anchor),
            "target_text": cell(c_target), "pass": verdict_pass(verdict), "verdict": verdict}))
    return out


def md_table(text: str) -> tuple[list[str], list[list[str]]]:
    """The first markdown table in ``text``: (headers, rows)."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("|") and i + 1 < len(lines) and re.match(r"^\|[-| :]+\|$",
                                                                    lines[i + 1].strip()):
            def split(row: str) -> list[str]:
                return [c.strip() for c in row.strip().strip("|").split("|")]
            rows = []
            for body in lines[i + 2:]:
                if not body.startswith("|"):
                    break
                rows.append(split(body))
            return split(line), rows
    return [], []


def md_notes(text: str) -> list[str]:
    """The lines of the "Notes:" section of a benchmark's markdown file (list items)."""
    lines = text.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "Notes:")
    except StopIteration:
        return []
    out: list[str] = []
    for line in lines[start + 1:]:
        if line.startswith("#"):
            break
        if not line.strip():
            continue
        if out and not line.lstrip().startswith("- "):
            out[-1] += " " + line.strip()   # a wrapped item (or a command line with newlines)
        else:
            out.append(line.rstrip())
    return out


# ---- formatting ----------------------------------------------------------------------------------


def md_cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    out = ["| " + " | ".join(md_cell(h) for h in headers) + " |",
           "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(md_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def fmt_ratio(row: dict[str, Any]) -> str:
    ratio = row.get("ratio")
    if isinstance(ratio, (int, float)) and math.isfinite(ratio):
        return f"{ratio:.2f}×"
    text = row.get("ratio_text") or "—"
    return str(text)


def anchor_name(anchor: dict[str, Any]) -> str:
    name = str(anchor.get("name") or anchor.get("key") or "anchor")
    return name.removeprefix("Anchor: ")


def fmt_anchor(row: dict[str, Any]) -> str:
    anchor = row.get("anchor")
    parts = []
    if isinstance(anchor, dict):
        parts.append(f"{anchor_name(anchor)}: {anchor.get('figure_text') or anchor.get('figure')}")
    if row.get("reference"):
        parts.append(str(row["reference"]))
    return "; ".join(parts) or "—"


def fmt_pass(row: dict[str, Any]) -> str:
    verdict = str(row.get("verdict") or "—")
    return f"**{verdict}**" if verdict.startswith("FAIL") else verdict


def fmt_date(machine: dict[str, Any]) -> str:
    return str(machine.get("date_utc") or "not recorded")


def fmt_machine(machine: dict[str, Any]) -> str:
    if not machine:
        return "not recorded"
    mem = machine.get("memory_total_kib")
    mem_text = f", {mem / (1 << 20):.0f} GiB RAM" if isinstance(mem, (int, float)) else ""
    return (f"{machine.get('nproc', '?')} CPUs ({machine.get('cpu_model', '?')}){mem_text}, "
            f"kernel {machine.get('kernel', '?')}, Python {machine.get('python', '?')}, "
            f"scratch on {machine.get('scratch_filesystem', '?')}")


def code_state(machine: dict[str, Any]) -> str:
    commit = machine.get("commit")
    if not commit:
        return "not recorded"
    changed = machine.get("code_changed_since_commit",
                          machine.get("gateway_or_storage_changed_since_commit"))
    text = str(commit)
    if changed not in (None, "no"):
        text += f" (+ uncommitted changes: {changed})"
    if machine.get("code_changed_during_run"):
        text += " (CHANGED DURING THE RUN)"
    return text


BUSY_SHARE = 0.10   # as the benchmarks' own warnings: another program used this much of the machine


def other_cpu_max(data: Any) -> float | None:
    """The largest ``other_share`` anywhere in a result file (the share of the machine's CPU
    that other programs used during a case or run), or None when it was not recorded."""
    found: list[float] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "other_share" and isinstance(v, (int, float)):
                    found.append(float(v))
                else:
                    walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(data)
    return max(found) if found else None


def fmt_share(share: float | None) -> str:
    if share is None:
        return "not recorded"
    return f"{share:.0%}" + (" (busy)" if share > BUSY_SHARE else "")


def runs_per_case(data: dict[str, Any]) -> str:
    scale = data.get("scale")
    if not isinstance(scale, dict):
        return "?"
    for key in ("runs", "rounds"):
        if key in scale:
            return str(scale[key])
    return "?"


def relative(path: Path, start: Path) -> str:
    return Path(os.path.relpath(path, start)).as_posix()


def reproduce(area: Area, data: dict[str, Any]) -> str:
    if area in (LOADTEST, SOAK):
        return f"`{area.script}`"
    quick = " --quick" if data.get("mode") == "quick" else ""
    return f"`.venv/bin/python {area.script}{quick}`"


# ---- the chart -----------------------------------------------------------------------------------


def sweep_lines(storage: dict[str, Any]) -> tuple[list[dict[str, Any]], bool]:
    """(lines, complete): the batch_sweep lines of storage.json, or, for a file without it,
    the points its table measured (complete = False)."""
    sweep = storage.get("batch_sweep")
    if isinstance(sweep, dict) and isinstance(sweep.get("lines"), list):
        lines = [dict(line) for line in sweep["lines"]]
        lines += [dict(p) for p in sweep.get("extra_points", [])]
        return lines, True
    series = storage.get("series") or {}

    def rate(key: str, batch: int) -> dict[str, Any] | None:
        s = series.get(key)
        if not isinstance(s, dict) or not s.get("median"):
            return None
        v, unit = float(s["median"]), s.get("unit")
        value = (batch * 1e9 / v if unit == "ns/call" else batch * 1e6 / v
                 if unit == "µs/call" else v)
        return {"batch": batch, "entries_per_s": value, "source": key}

    spec = [("c_append", "C core: comet_append (1), comet_append_batch (10-1000)", "comet",
             {1: "c_append_single", 10: "c_append_batch_10", 100: "c_append_batch_100",
              1000: "c_append_batch_1000"}),
            ("py_append_batch", "Python: Log.append_batch(list of n)", "comet",
             {1000: "py_batch_1000"}),
            ("py_append_delimited", "Python: Log.append_delimited(buffer of n lines)", "comet",
             {1000: "py_delimited_1000"}),
            ("file", "Anchor: buffered file, one f.write per batch", "anchor",
             {1: "file_single", 1000: "file_1000"}),
            ("sqlite", "Anchor: SQLite WAL, one executemany transaction per batch", "anchor",
             {1000: "sqlite_1000"})]
    lines = []
    for key, label, kind, points in spec:
        pts = [p for p in (rate(k, n) for n, k in sorted(points.items())) if p]
        if pts:
            lines.append({"key": key, "label": label, "kind": kind, "points": pts})
    return lines, False


def make_chart(storage: AreaResult, path: Path) -> dict[str, list[tuple[int, float]]]:
    """Writes the throughput-against-batch-size PNG; returns what it plotted (label ->
    [(batch, entries/s)])."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines, complete = sweep_lines(storage.data)
    plotted: dict[str, list[tuple[int, float]]] = {}
    fig, ax = plt.subplots(figsize=(9, 5.6), dpi=110)
    styles = {"comet": {"linestyle": "-", "linewidth": 2.2},
              "anchor": {"linestyle": "--", "linewidth": 1.8}}
    markers = itertools.cycle("osD^vP*X")
    for line in lines:
        pts = sorted((int(p["batch"]), float(p["entries_per_s"])) for p in line["points"]
                     if p.get("entries_per_s"))
        if not pts:
            continue
        plotted[line["label"]] = pts
        xs, ys = zip(*pts)
        style = styles.get(line.get("kind", "comet"), styles["comet"])
        if len(pts) == 1:
            ax.plot(xs, ys, marker=next(markers), linestyle="none", markersize=9,
                    label=line["label"])
        else:
            ax.plot(xs, ys, marker=next(markers), label=line["label"], **style)
    sweep = storage.data.get("batch_sweep") or {}
    go = sweep.get("go_reference_ns_per_call") or {str(k): v for k, v in GO_REFERENCE_NS.items()}
    go_pts = sorted((int(n), int(n) * 1e9 / hi, int(n) * 1e9 / lo) for n, (lo, hi) in go.items())
    if go_pts:
        xs, lows, highs = zip(*go_pts)
        ax.fill_between(xs, lows, highs, color="grey", alpha=0.18,
                        label="Go Comet, quoted in issue 2 (not measured here)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks([1, 10, 100, 1000])
    ax.set_xticklabels(["1", "10", "100", "1000"])
    ax.set_xlabel("entries per call (batch size)")
    ax.set_ylabel("entries/s (median, log scale)")
    machine = storage.machine
    title = "Storage: append throughput against batch size, 100-byte entries"
    sub = (f"{machine.get('nproc', '?')} CPUs {machine.get('cpu_model', '')}, "
           f"{fmt_date(machine)}, mode {storage.data.get('mode', '?')}"
           + ("" if complete else "; partial: storage.json has no batch_sweep"))
    busy = other_cpu_max(storage.data)
    if busy is not None and busy > BUSY_SHARE:
        sub += f"; NOT IDLE: other programs used up to {busy:.0%} of the CPU"
    ax.set_title(f"{title}\n{sub}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    os.replace(tmp, path)
    return plotted


def sweep_table(storage: AreaResult) -> str:
    lines, complete = sweep_lines(storage.data)
    sizes = sorted({int(p["batch"]) for line in lines for p in line["points"]})
    rows = []
    for line in lines:
        by = {int(p["batch"]): float(p["entries_per_s"]) for p in line["points"]}
        rows.append([line["label"], *(f"{by[n] / 1e6:.2f}" if n in by else "—" for n in sizes)])
    table = markdown_table(["M entries/s (median)", *(f"batch {n}" for n in sizes)], rows)
    if not complete:
        table += ("\n\n(storage.json predates the batch sweep: only the batch sizes its "
                  "table measured; rerun `make bench` for every point.)")
    return table


# ---- the report ----------------------------------------------------------------------------------


def headline_items(result: AreaResult) -> list[dict[str, Any]]:
    by_key: dict[str, dict[str, Any]] = {}
    for r in result.cases():
        by_key.setdefault(r.get("key") or "", r)   # the first row of a key is its main one
    picked = [by_key[k] for k in result.area.headline if k in by_key]
    return picked or result.targeted()[:4]


def headline_text(row: dict[str, Any]) -> str:
    """``case figure (ratio× anchor; target: verdict)``, short enough to quote."""
    extra = []
    ratio, anchor = row.get("ratio"), row.get("anchor")
    if isinstance(ratio, (int, float)) and isinstance(anchor, dict):
        extra.append(f"{ratio:.2f}× {anchor_name(anchor)}")
    if row.get("pass") is not None:
        extra.append(f"target {row['target_text']}: {row['verdict']}")
    return f"{row['case']} {row['figure_text']}" + (f" ({'; '.join(extra)})" if extra else "")


SWEEP_SHORT = {"c_append": "C core", "py_append_batch": "Python append_batch",
               "py_append_delimited": "Python append_delimited", "file": "buffered file",
               "sqlite": "SQLite"}


def sweep_headline(storage: AreaResult) -> str:
    """Entries/s of each chart line at batch 1 and 1000 (or its smallest and largest)."""
    lines, _complete = sweep_lines(storage.data)
    parts = []
    for line in lines:
        if line.get("key") not in SWEEP_SHORT:
            continue
        pts = sorted((int(p["batch"]), float(p["entries_per_s"])) for p in line["points"])
        if not pts:
            continue
        ends = [pts[0], pts[-1]] if len(pts) > 1 else pts
        parts.append(f"{SWEEP_SHORT[line['key']]} "
                     + " → ".join(f"{v / 1e6:.2f} M" for _n, v in ends)
                     + ("" if [n for n, _v in ends] == [1, 1000]
                        else f" (batch {' → '.join(str(n) for n, _v in ends)})"))
    return ("M entries/s at batch 1 → 1000: " + "; ".join(parts)) if parts else "no points"


def target_count(results: Sequence[AreaResult]) -> tuple[int, int]:
    rows = [r for res in results if res.ran for r in res.targeted()]
    return sum(1 for r in rows if r["pass"]), len(rows)


def render(results: list[AreaResult], extra: list[AreaResult], out: Path, chart: Path | None,
           generated: str) -> str:
    """The report; ``extra`` are the load and soak tests (shown, not counted in the targets;
    the soak test only when it ran)."""
    extra = [r for r in extra if r.ran or r.area is LOADTEST]
    ran = [r for r in results if r.ran]
    base = out.parent
    lines = ["# Performance report", ""]
    lines.append(f"Generated {generated} by `loadtests/report.py` from the result files in "
                 f"`loadtests/results/`. Reproduce everything with `make bench` (the four "
                 "benchmarks, each with its anchors in the same run, then this report); "
                 "`make report` rebuilds this page from the existing result files; each area's "
                 "own command is in the table below. Figures are medians; ratios are "
                 "throughput ÷ the anchor's throughput in the same run (> 1: faster than the "
                 "anchor).")
    lines.append("")

    # headline
    lines += ["## Headline figures", ""]
    machines = {fmt_machine(r.machine) for r in ran}
    if ran:
        dates = sorted(fmt_date(r.machine)[:10] for r in ran)
        span = dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}"
        machine_text = (machines.pop() if len(machines) == 1
                        else "several machines, see the runs table")
        lines.append(f"- Measured {span} on {machine_text}.")
    for res in results:
        if not res.ran:
            lines.append(f"- {res.area.title}: not run ({res.status}).")
            continue
        items = headline_items(res)
        met = sum(1 for r in res.targeted() if r["pass"])
        summary = "; ".join(headline_text(r) for r in items) or "no figures"
        lines.append(f"- **{res.area.title}**: {summary}. Targets met: {met} of "
                     f"{len(res.targeted())}.")
        if res.area.key == "storage":
            lines.append(f"- **Storage throughput against batch size**: {sweep_headline(res)}.")
    busy = [(r.area.title, other_cpu_max(r.data)) for r in ran]
    busy = [(t, s) for t, s in busy if s is not None and s > BUSY_SHARE]
    if busy:
        lines.append("- **Not an idle machine**: other programs used up to "
                     + ", ".join(f"{share:.0%} of the CPU during {title}" for title, share in busy)
                     + "; those figures are pessimistic (see the area's notes); rerun "
                     "`make bench` on an idle machine.")
    met, total = target_count(results)
    lines.append(f"- Targets met overall: {met} of {total}"
                 + (f" ({', '.join(r.area.key for r in results if not r.ran)} not run)"
                    if len(ran) < len(results) else "") + ".")
    lines.append("")

    # runs
    lines += ["## Runs", ""]
    rows = []
    for res in [*results, *extra]:
        if not res.ran:
            rows.append([res.area.title, "not run", "—", "—", "—", "—", "—", "—",
                         reproduce(res.area, {})])
            continue
        m = res.machine
        elapsed = res.data.get("elapsed_s")
        rows.append([res.area.title, fmt_date(m), res.data.get("mode", "not recorded"),
                     runs_per_case(res.data), code_state(m),
                     f"{float(elapsed) / 60:.1f} min" if isinstance(elapsed, (int, float))
                     else "—",
                     f"{m.get('nproc', '?')} CPUs {m.get('cpu_model', '?')}" if m else "—",
                     fmt_share(other_cpu_max(res.data)), reproduce(res.area, res.data)])
    lines.append(markdown_table(["Area", "Date (UTC)", "Mode", "Runs per case", "Commit",
                                 "Took", "Machine", "Other programs' CPU (max)", "Reproduce"],
                                rows))
    if len(machines) <= 1 and ran:
        lines += ["", f"Machine: {fmt_machine(ran[0].machine)}."]
    lines.append("")

    # unmet targets
    lines += ["## Targets not met", ""]
    unmet = [(res, r) for res in ran for r in res.targeted() if not r["pass"]]
    if not unmet:
        lines.append("None" + (" of the areas that ran." if len(ran) < len(results) else ".")
                     if ran else "No area ran.")
    for res, r in unmet:
        lines.append(f"- {res.area.title} — {r['case']}: {r['figure_text']}, target "
                     f"{r['target_text']} ({r['verdict']}); see the notes under "
                     f"[{res.area.title}](#{slug(res.area.title)}) and "
                     + (f"[{res.area.key}.md]({relative(res.md_path, base)})"
                        if res.md_path else f"{res.area.key}.json") + ".")
    not_run = [res for res in results if not res.ran]
    for res in not_run:
        lines.append(f"- {res.area.title}: not run, so its targets are not checked here.")
    lines.append("")

    # per area
    for res in [*results, *extra]:
        lines += [f"## {res.area.title}", ""]
        if not res.ran:
            how = reproduce(res.area, {})
            lines += [f"Not run: {res.status} (`{res.area.key}.json` in the results "
                      f"directory). Run {how}.", ""]
            continue
        lines.append(f"Run {fmt_date(res.machine)}, mode {res.data.get('mode', 'not recorded')}"
                     f", commit {code_state(res.machine)}; reproduce: "
                     f"{reproduce(res.area, res.data)}"
                     + (f"; full table: [{res.area.key}.md]({relative(res.md_path, base)})"
                        if res.md_path else "") + ".")
        lines.append("")
        if res.area in (LOADTEST, SOAK) and not res.rows:
            lines += [loadtest_summary(res.data), ""]
        else:
            lines.append(area_table(res))
            lines.append("")
        if not res.structured and res.area not in (LOADTEST, SOAK):
            lines += ["(This result file predates the structured `rows`: the anchor column "
                      "shows the benchmark's own \"vs anchor\" text; rerun the benchmark for "
                      "the anchor figures.)", ""]
        if res.area.key == "storage":
            if chart is not None:
                lines += [f"![Storage throughput against batch size]"
                          f"({relative(chart, base)})", ""]
            lines += ["Throughput against batch size, same run:", "", sweep_table(res), ""]
        if res.notes:
            lines += [f"Notes (from {res.area.key}.md):", "", *res.notes, ""]
    return "\n".join(lines).rstrip() + "\n"


def area_table(res: AreaResult) -> str:
    rows = [[r["case"], r["figure_text"], fmt_anchor(r), fmt_ratio(r), r["target_text"],
             fmt_pass(r)] for r in res.cases()]
    return markdown_table(["Case", "Figure (median)", "Anchor (same run)",
                           "Ratio vs anchor", "Target", "Pass"], rows)


def loadtest_summary(data: dict[str, Any]) -> str:
    """The main figures of a loadtest.json / soak.json (LOADTEST_FIELDS, and the scalars of
    its "soak" section); any other JSON object: its scalar fields."""
    known = [(label, data[key]) for key, label in LOADTEST_FIELDS if key in data]
    if len(known) >= 3:
        rows = [[label, "none" if value == [] else
                 "; ".join(map(str, value)) if isinstance(value, list) else
                 f"{value:,.1f}" if isinstance(value, float) else value]
                for label, value in known]
        soak = data.get("soak")
        if isinstance(soak, dict):
            rows += [[f"soak: {k}", v] for k, v in soak.items()
                     if isinstance(v, (str, int, float, bool))]
        return markdown_table(["Figure", "Value"], rows)
    rows = []
    for key, value in data.items():
        if key == "machine":
            continue
        if isinstance(value, dict):
            for k, v in value.items():
                if isinstance(v, (str, int, float, bool)) or v is None:
                    rows.append([f"{key}.{k}", v])
        elif isinstance(value, (str, int, float, bool)):
            rows.append([key, value])
    return markdown_table(["Field", "Value"], rows[:40]) if rows else "(no summary fields)"


def slug(title: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", title.lower())
    return text.replace(" ", "-")


def build(results_dir: Path, out: Path, chart: Path | None) -> dict[str, Any]:
    """Writes the report (and the chart unless ``chart`` is None); returns what it did."""
    results = [load_area(results_dir, area) for area in AREAS]
    extra = [load_area(results_dir, LOADTEST), load_area(results_dir, SOAK)]
    storage = results[0]
    plotted: dict[str, list[tuple[int, float]]] = {}
    chart_written = None
    if chart is not None and storage.ran:
        plotted = make_chart(storage, chart)
        chart_written = chart
    generated = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    text = render(results, extra, out, chart_written, generated)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, out)
    return {"report": out, "chart": chart_written, "plotted": plotted,
            "areas": {r.area.key: r.status for r in [*results, *extra]}}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS,
                        help="directory of the <area>.json / <area>.md result files "
                             "(default: loadtests/results)")
    parser.add_argument("--out", type=Path, default=None,
                        help="the report to write (default: RESULTS/REPORT.md)")
    parser.add_argument("--chart", type=Path, default=None,
                        help=f"the PNG to write (default: {CHART_NAME} next to the report)")
    parser.add_argument("--no-chart", action="store_true", help="write no PNG")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = args.out or args.results / "REPORT.md"
    chart = None if args.no_chart else (args.chart or out.parent / CHART_NAME)
    done = build(args.results, out, chart)
    for area, status in done["areas"].items():
        print(f"{area}: {'ok' if status == 'ok' else 'not run (' + status + ')'}")
    print(f"wrote {done['report']}" + (f" and {done['chart']}" if done["chart"] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
