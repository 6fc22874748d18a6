"""Performance report: REPORT.md and the storage batch chart from the result files
(it measures nothing).

    make report   # or: .venv/bin/python -m loadtests.report [--results DIR] [--out FILE] [--chart FILE | --no-chart]
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run by its path: again as a module
    from by_path import rerun_as_module  # type: ignore[import-not-found]

    rerun_as_module(__file__)

import argparse
import datetime as _dt
import itertools
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from loadtests.benchlib import BUSY_SHARE, markdown_table, sweep_lines, sweep_table, write_atomic

HERE = Path(__file__).resolve().parent

RESULTS = HERE / "results"
CHART_NAME = "storage_batch.png"


@dataclass(frozen=True)
class Area:
    key: str                       # <key>.json and <key>.md in the results directory
    title: str
    script: str
    headline: tuple[str, ...] = ()  # row keys quoted in the summary, in order


AREAS = (
    Area("storage", "Storage core at sustained volume (issue 14)", "-m loadtests.bench_storage",
         ("comet_1", "comet_10", "comet_100", "comet_1000", "comet_floor_ratio_1000")),
    Area("consumers", "Consumers (issue 3)", "-m loadtests.bench_consumers",
         ("ack_group", "read_ack", "ship_dir")),
    Area("gateway", "Gateway (issue 4)", "-m loadtests.bench_gateway",
         ("gateway_single", "gateway_ndjson", "gateway_ndjson_novalidate", "gateway_single_paced")),
    Area("spark", "Spark (issue 5)", "-m loadtests.bench_spark", ("comet_raw", "comet_ship")),
    Area("otlp", "OTLP/HTTP ingest (issue 24)", "-m loadtests.bench_otlp", ("otlp_logs", "otlp_traces")),
    Area("streams", "Many streams (issue 27)", "-m loadtests.bench_streams",
         ("streams_events", "streams_all_202", "streams_fds_0", "streams_rss_0", "streams_disk_per_shard")),
    Area("paced", "Paced latency (issue 27)", "-m loadtests.bench_gateway --paced-only",
         ("gateway_single_paced", "gateway_ndjson_paced")),
    Area("forward", "Forwarding to an OTLP backend (issue 35)", "-m loadtests.bench_forward",
         ("drain", "catch_up")),
)
LOADTEST = Area("loadtest", "Load test with locust (issue 6)", "make loadtest")
SOAK = Area("soak", "Soak test (issue 6)", "make soak")
LOADTEST_FIELDS = (("ok", "Passed (no loss, thresholds met)"), ("duration_s", "Load, s"),
                   ("users", "Locust users"), ("workers", "Gateway workers"),
                   ("requests", "Requests"), ("failures", "Failures"),
                   ("req_per_s", "Requests/s"), ("events_per_s", "Events/s acknowledged"),
                   ("p50_ms", "p50, ms"), ("p95_ms", "p95, ms"), ("p99_ms", "p99, ms"),
                   ("events_acked", "Events acknowledged (202)"),
                   ("events_stored", "Events stored (read back)"), ("problems", "Problems"))
SWEEP_SHORT = {"c_append": "C core", "py_append_batch": "Python append_batch",
               "py_append_delimited": "Python append_delimited", "file": "buffered file",
               "sqlite": "SQLite"}


@dataclass
class AreaResult:
    area: Area
    status: str                             # "ok", "missing" or "unreadable: ..."
    data: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    md_path: Path | None = None

    @property
    def ran(self) -> bool:
        return self.status == "ok"

    @property
    def machine(self) -> dict[str, Any]:
        return self.data.get("machine") or {}

    @property
    def rows(self) -> list[dict[str, Any]]:
        return list(self.data.get("rows") or [])

    def cases(self) -> list[dict[str, Any]]:
        """The rows that are not anchors (anchors show in their cases' anchor column)."""
        return [r for r in self.rows if r["role"] != "anchor"]

    def targeted(self) -> list[dict[str, Any]]:
        return [r for r in self.cases() if r["pass"] is not None]


def load_area(results: Path, area: Area) -> AreaResult:
    path, md = results / f"{area.key}.json", results / f"{area.key}.md"
    if not path.exists():
        return AreaResult(area, "missing")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as exc:
        return AreaResult(area, f"unreadable: {type(exc).__name__}: {exc}")
    return AreaResult(area, "ok", data, *((md_notes(md.read_text(encoding="utf-8")), md)
                                          if md.exists() else ()))


def md_notes(text: str) -> list[str]:
    """The items of the "Notes:" section of a benchmark's markdown file."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == "Notes:"), len(lines))
    out: list[str] = []
    for line in itertools.takewhile(lambda x: not x.startswith("#"), lines[start + 1:]):
        if out and line.strip() and not line.lstrip().startswith("- "):
            out[-1] += " " + line.strip()   # a wrapped item
        elif line.strip():
            out.append(line.rstrip())
    return out


def anchor_name(anchor: dict[str, Any]) -> str:
    return str(anchor["name"]).removeprefix("Anchor: ")


def fmt_anchor(row: dict[str, Any]) -> str:
    parts = [f"{anchor_name(a)}: {a['figure_text']}"] if (a := row["anchor"]) else []
    return "; ".join(parts + ([row["reference"]] if row["reference"] else [])) or "—"


def fmt_machine(m: dict[str, Any]) -> str:
    mem = m.get("memory_total_kib")
    return (f"{m.get('nproc', '?')} CPUs ({m.get('cpu_model', '?')})"
            + (f", {mem / (1 << 20):.0f} GiB RAM" if mem else "")
            + f", kernel {m.get('kernel', '?')}, Python {m.get('python', '?')}, "
              f"scratch on {m.get('scratch_filesystem', '?')}") if m else "not recorded"


def code_state(m: dict[str, Any]) -> str:
    text = str(m.get("commit") or "not recorded")
    if m.get("code_changed_since_commit") not in (None, "no"):
        text += f" (+ uncommitted changes: {m['code_changed_since_commit']})"
    return text + (" (CHANGED DURING THE RUN)" if m.get("code_changed_during_run") else "")


def other_cpu_max(node: Any) -> float | None:
    """The largest ``other_share`` anywhere in a result file, None when not recorded."""
    if isinstance(node, dict):
        found = [(float(v) if isinstance(v, (int, float)) else None) if k == "other_share"
                 else other_cpu_max(v) for k, v in node.items()]
    else:
        found = [other_cpu_max(v) for v in node] if isinstance(node, list) else []
    return max((f for f in found if f is not None), default=None)


def fmt_share(share: float | None) -> str:
    return "not recorded" if share is None else f"{share:.0%}" + (" (busy)" if share > BUSY_SHARE else "")


def reproduce(area: Area, data: dict[str, Any]) -> str:
    return (f"`{area.script}`" if area in (LOADTEST, SOAK) else
            f"`.venv/bin/python {area.script}{' --quick' if data.get('mode') == 'quick' else ''}`")


def relative(path: Path, start: Path) -> str:
    return Path(os.path.relpath(path, start)).as_posix()


def slug(title: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def make_chart(storage: AreaResult, path: Path) -> dict[str, list[tuple[int, float]]]:
    """Writes the throughput-against-batch-size PNG; returns label -> [(batch, entries/s)]."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plotted: dict[str, list[tuple[int, float]]] = {}
    fig, ax = plt.subplots(figsize=(9, 5.6), dpi=110)
    styles = {"comet": {"linestyle": "-", "linewidth": 2.2},
              "anchor": {"linestyle": "--", "linewidth": 1.8}}
    markers = itertools.cycle("osD^vP*X")
    for line in sweep_lines(storage.data["batch_sweep"]):
        pts = sorted((int(p["batch"]), float(p["entries_per_s"])) for p in line["points"]
                     if p.get("entries_per_s"))
        if not pts:
            continue
        plotted[line["label"]] = pts
        xs, ys = zip(*pts)
        style = {"linestyle": "none", "markersize": 9} if len(pts) == 1 else styles[line["kind"]]
        ax.plot(xs, ys, marker=next(markers), label=line["label"], **style)  # type: ignore[arg-type]
    go = storage.data["batch_sweep"].get("go_reference_ns_per_call", {})
    if go:
        xs, lows, highs = zip(*sorted((int(n), int(n) * 1e9 / hi, int(n) * 1e9 / lo)
                                      for n, (lo, hi) in go.items()))
        ax.fill_between(xs, lows, highs, color="grey", alpha=0.18,
                        label="Go Comet, quoted in issue 14 (not measured here)")
    ax.set(xscale="log", yscale="log", xticks=[1, 10, 100, 1000], xticklabels=["1", "10", "100", "1000"],
           xlabel="entries per call (batch size)", ylabel="entries/s (median, log scale)")
    m = storage.machine
    sub = (f"{m.get('nproc', '?')} CPUs {m.get('cpu_model', '')}, {m.get('date_utc')}, "
           f"mode {storage.data.get('mode', '?')}")
    busy = other_cpu_max(storage.data)
    if busy is not None and busy > BUSY_SHARE:
        sub += f"; NOT IDLE: other programs used up to {busy:.0%} of the CPU"
    ax.set_title(f"Storage: sustained append throughput against batch size, 88-116-byte entries\n{sub}",
                 fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    os.replace(tmp, path)
    return plotted


def sweep_headline(storage: AreaResult) -> str:
    """Entries/s of each chart line at its smallest and largest batch."""
    parts = []
    for line in sweep_lines(storage.data["batch_sweep"]):
        pts = sorted((int(p["batch"]), float(p["entries_per_s"])) for p in line["points"])
        if line["key"] in SWEEP_SHORT and pts:
            ends = [pts[0], pts[-1]] if len(pts) > 1 else pts
            parts.append(f"{SWEEP_SHORT[line['key']]} " + " → ".join(f"{v / 1e6:.2f} M" for _, v in ends)
                         + ("" if [n for n, _ in ends] == [1, 1000]
                            else f" (batch {' → '.join(str(n) for n, _ in ends)})"))
    return ("M entries/s at batch 1 → 1000: " + "; ".join(parts)) if parts else "no points"


def headline_text(row: dict[str, Any]) -> str:
    extra = []
    if row["ratio"] is not None and row["anchor"] is not None:
        extra.append(f"{row['ratio']:.2f}× {anchor_name(row['anchor'])}")
    if row["pass"] is not None:
        extra.append(f"target {row['target_text']}: {row['verdict']}")
    return f"{row['case']} {row['figure_text']}" + (f" ({'; '.join(extra)})" if extra else "")


def render(results: list[AreaResult], extra: list[AreaResult], out: Path, chart: Path | None,
           generated: str) -> str:
    """The report; ``extra`` are the load and soak tests (shown, not counted in the targets;
    the soak only when it ran)."""
    extra = [r for r in extra if r.ran or r.area is LOADTEST]
    ran = [r for r in results if r.ran]
    base = out.parent
    lines = ["# Performance report", "",
             f"Generated {generated} by `loadtests/report.py` from the result files in "
             "`loadtests/results/`. Reproduce everything with `make bench` (the four "
             "benchmarks, each with its anchors in the same run, then this report); `make "
             "report` rebuilds this page from the existing result files; each area's own "
             "command is in the table below. Figures are medians; ratios are throughput ÷ the "
             "anchor's throughput in the same run (> 1: faster than the anchor).", "",
             "## Headline figures", ""]
    machines = {fmt_machine(r.machine) for r in ran}
    if ran:
        dates = sorted(str(r.machine.get("date_utc"))[:10] for r in ran)
        span = dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}"
        lines.append(f"- Measured {span} on "
                     f"{machines.pop() if len(machines) == 1 else 'several machines, see the runs table'}.")
    for res in results:
        if not res.ran:
            lines.append(f"- {res.area.title}: not run ({res.status}).")
            continue
        by_key: dict[str, dict[str, Any]] = {}
        for r in res.cases():
            by_key.setdefault(r["key"] or "", r)   # the first row of a key is its main one
        items = [by_key[k] for k in res.area.headline if k in by_key] or res.targeted()[:4]
        met = sum(1 for r in res.targeted() if r["pass"])
        lines.append(f"- **{res.area.title}**: {'; '.join(map(headline_text, items)) or 'no figures'}"
                     f". Targets met: {met} of {len(res.targeted())}.")
        if res.area.key == "storage":
            lines.append(f"- **Storage throughput against batch size**: {sweep_headline(res)}.")
    busy = [(r.area.title, s) for r in ran if (s := other_cpu_max(r.data)) is not None and s > BUSY_SHARE]
    if busy:
        lines.append("- **Not an idle machine**: other programs used up to "
                     + ", ".join(f"{share:.0%} of the CPU during {title}" for title, share in busy)
                     + "; those figures are pessimistic (see the area's notes); rerun "
                     "`make bench` on an idle machine.")
    targeted = [r for res in ran for r in res.targeted()]
    lines += [f"- Targets met overall: {sum(1 for r in targeted if r['pass'])} of {len(targeted)}"
              + (f" ({', '.join(r.area.key for r in results if not r.ran)} not run)"
                 if len(ran) < len(results) else "") + ".", "", "## Runs", ""]
    rows = []
    for res in [*results, *extra]:
        if not res.ran:
            rows.append([res.area.title, "not run", *["—"] * 6, reproduce(res.area, {})])
            continue
        m, scale, elapsed = res.machine, res.data.get("scale") or {}, res.data.get("elapsed_s")
        rows.append([res.area.title, m.get("date_utc") or "not recorded",
                     res.data.get("mode", "not recorded"), scale.get("runs", scale.get("rounds", "?")),
                     code_state(m), f"{elapsed / 60:.1f} min" if elapsed else "—",
                     f"{m.get('nproc', '?')} CPUs {m.get('cpu_model', '?')}" if m else "—",
                     fmt_share(other_cpu_max(res.data)), reproduce(res.area, res.data)])
    lines.append(markdown_table(["Area", "Date (UTC)", "Mode", "Runs per case", "Commit", "Took",
                                 "Machine", "Other programs' CPU (max)", "Reproduce"], rows))
    if len(machines) <= 1 and ran:
        lines += ["", f"Machine: {fmt_machine(ran[0].machine)}."]
    lines += ["", "## Targets not met", ""]
    unmet = [(res, r) for res in ran for r in res.targeted() if not r["pass"]]
    if not unmet:
        lines.append(("None" + (" of the areas that ran." if len(ran) < len(results) else "."))
                     if ran else "No area ran.")
    for res, r in unmet:
        lines.append(f"- {res.area.title} — {r['case']}: {r['figure_text']}, target "
                     f"{r['target_text']} ({r['verdict']}); see the notes under "
                     f"[{res.area.title}](#{slug(res.area.title)}) and "
                     + (f"[{res.area.key}.md]({relative(res.md_path, base)})"
                        if res.md_path else f"{res.area.key}.json") + ".")
    lines += [f"- {res.area.title}: not run, so its targets are not checked here."
              for res in results if not res.ran] + [""]
    for res in [*results, *extra]:
        lines += [f"## {res.area.title}", ""]
        if not res.ran:
            lines += [f"Not run: {res.status} (`{res.area.key}.json` in the results directory). "
                      f"Run {reproduce(res.area, {})}.", ""]
            continue
        if res.md_path:  # when, how and on what: the runs table above
            lines += [f"Full table: [{res.area.key}.md]({relative(res.md_path, base)}).", ""]
        if res.area in (LOADTEST, SOAK):
            lines += [loadtest_summary(res.data), ""]
        else:
            lines += [markdown_table(["Case", "Figure (median)", "Anchor (same run)",
                                      "Ratio vs anchor", "Target", "Pass"],
                                     [[r["case"], r["figure_text"], fmt_anchor(r),
                                       "—" if r["ratio"] is None else f"{r['ratio']:.2f}×",
                                       r["target_text"], f"**{r['verdict']}**"
                                       if r["verdict"].startswith("FAIL") else r["verdict"]]
                                      for r in res.cases()]), ""]
        if res.area.key == "storage":
            if chart is not None:
                lines += [f"![Storage throughput against batch size]({relative(chart, base)})", ""]
            lines += ["Throughput against batch size, same run:", "",
                      sweep_table(res.data["batch_sweep"]), ""]
        if res.notes:
            lines += [f"Notes (from {res.area.key}.md):", "", *res.notes, ""]
    return "\n".join(lines).rstrip() + "\n"


def loadtest_summary(data: dict[str, Any]) -> str:
    """The main figures of loadtest.json / soak.json, its check's counts and the scalars of
    its "soak" part (also what loadtest.py prints)."""
    rows = [[label, "none" if data[key] == [] else "; ".join(map(str, data[key]))
             if isinstance(data[key], list) else f"{data[key]:,.1f}"
             if isinstance(data[key], float) else data[key]]
            for key, label in LOADTEST_FIELDS if key in data]
    rows += [[f"check: {k}", v] for k, v in (data.get("check") or {}).items()
             if k in ("matched", "lost", "duplicates", "foreign", "unanswered_stored")]
    rows += [[f"soak: {k}", v] for k, v in (data.get("soak") or {}).items()
             if isinstance(v, (str, int, float, bool))]
    return markdown_table(["Figure", "Value"], rows)


def build(results_dir: Path, out: Path, chart: Path | None) -> dict[str, Any]:
    """Writes the report (and the chart unless ``chart`` is None); returns what it did."""
    results = [load_area(results_dir, area) for area in AREAS]
    extra = [load_area(results_dir, LOADTEST), load_area(results_dir, SOAK)]
    chart = chart if results[0].ran else None
    plotted = make_chart(results[0], chart) if chart is not None else {}
    generated = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    out.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(out, render(results, extra, out, chart, generated))
    return {"report": out, "chart": chart, "plotted": plotted,
            "areas": {r.area.key: r.status for r in [*results, *extra]}}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS,
                        help="directory of the <area>.json / <area>.md files (default loadtests/results)")
    parser.add_argument("--out", type=Path, help="the report (default RESULTS/REPORT.md)")
    parser.add_argument("--chart", type=Path, help=f"the PNG (default {CHART_NAME} beside the report)")
    parser.add_argument("--no-chart", action="store_true", help="write no PNG")
    args = parser.parse_args(argv)
    out = args.out or args.results / "REPORT.md"
    done = build(args.results, out, None if args.no_chart else (args.chart or out.parent / CHART_NAME))
    for area, status in done["areas"].items():
        print(f"{area}: {'ok' if status == 'ok' else 'not run (' + status + ')'}")
    print(f"wrote {done['report']}" + (f" and {done['chart']}" if done["chart"] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
