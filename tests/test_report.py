"""loadtests/report.py: REPORT.md and the storage batch chart from benchmark result files.

No benchmark runs here: the result files are small synthetic ones in a temporary
directory, plus a check that the real ``loadtests/results/*.json`` (when present)
are what the report expects.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from loadtests import bench_storage, benchlib, report

REPO = Path(__file__).resolve().parent.parent
LOADTESTS = REPO / "loadtests"
REAL_RESULTS = LOADTESTS / "results"

MACHINE = {"nproc": "2", "cpu_model": "Test CPU", "kernel": "6.1", "python": "3.11.7",
           "date_utc": "2030-01-02T03:04:05+00:00", "scratch_filesystem": "ext4 /dev/test",
           "memory_total_kib": 8 << 20}


def row(case: str, key: str, figure: float, unit: str, text: str, **kw: Any) -> dict[str, Any]:
    return benchlib.row(case, key, figure, unit, text, **kw)


def storage_json() -> dict[str, Any]:
    file_single = benchlib.anchor_ref("file_single", "buffered file write/entry", 200.0,
                                      "ns/call", "200 ns/call")
    data: dict[str, Any] = {
        "machine": {**MACHINE, "commit": "abc1234", "code_changed_since_commit": "no"},
        "mode": "quick", "scale": {"runs": 3}, "elapsed_s": 61.0,
        "other_cpu_by_case": {"c_core": {"other_share": 0.02, "busy_others": []}},
        "series": {
            "c_append_single": {"unit": "ns/call", "median": 100.0},
            "c_append_batch_10": {"unit": "µs/call", "median": 1.0},
            "c_append_batch_100": {"unit": "µs/call", "median": 8.0},
            "c_append_batch_1000": {"unit": "µs/call", "median": 50.0},
            "py_batch_1000": {"unit": "µs/call", "median": 100.0},
            "py_delimited_1000": {"unit": "µs/call", "median": 80.0},
            "file_single": {"unit": "ns/call", "median": 200.0},
            "file_1000": {"unit": "µs/call", "median": 40.0},
            "sqlite_1000": {"unit": "µs/call", "median": 2000.0},
        },
        "rows": [
            row("C core: append, 1 entry", "c_append_single", 100.0, "ns/call", "100 ns/call",
                anchor=file_single, ratio=2.0, target={"op": "<=", "value": 80, "unit": "ns/call"},
                target_text="≤ 80 ns", passed=False),
            row("Python: read", "py_read", 6e6, "entries/s", "6.00 M entries/s",
                target={"op": ">=", "value": 5e6, "unit": "entries/s"},
                target_text="≥ 5 M entries/s", passed=True),
            row("C core: batch read", "c_read", 3e7, "entries/s", "30.00 M entries/s"),
            row("Anchor: buffered file f.write per entry", "file_single", 200.0, "ns/call",
                "200 ns/call", role="anchor"),
        ],
    }
    rates = {"c_append": [1e7, 1e7 * 1.5, 1.8e7, 2e7], "py_append_batch": [5e5, 4e6, 9e6, 1e7],
             "py_append_delimited": [4e5, 4e6, 1.1e7, 1.25e7],
             "file": [5e6, 6e6, 9e6, 2.5e7], "sqlite": [2e4, 1.5e5, 3e5, 5e5]}
    data["batch_sweep"] = {
        "unit": "entries/s", "batch_sizes": [1, 10, 100, 1000],
        "lines": [{"key": k, "label": f"label {k}",
                   "kind": "anchor" if k in ("file", "sqlite") else "comet",
                   "points": [{"batch": n, "entries_per_s": v, "source": "x"}
                              for n, v in zip((1, 10, 100, 1000), vs)]}
                  for k, vs in rates.items()],
        "extra_points": [{"key": "py_append", "label": "label single", "kind": "comet",
                          "points": [{"batch": 1, "entries_per_s": 1.4e6}]}],
    }
    return data


def gateway_json() -> dict[str, Any]:
    anchor = benchlib.anchor_ref("anchor_single", "Anchor: bare Starlette", 16500.0, "req/s",
                                 "16.5 k req/s")
    return {"machine": {**MACHINE, "commit": "def5678"}, "mode": "default",
            "scale": {"runs": 3}, "runs": [{"cpu": {"other_share": 0.31}}],
            "rows": [row("Gateway: 1 event", "gateway_single", 14000.0, "req/s", "14.0 k req/s",
                         anchor=anchor, ratio=14000 / 16500,
                         target={"op": ">=", "value": 0.85, "unit": "x"},
                         target_text="≥ 0.85× anchor", passed=False,
                         verdict="FAIL (non-202)")]}


MD_NOTES = "# X benchmark\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\nNotes:\n\n- {0} first note.\n" \
           "  - a sub-note\nwrapped onto a second line\n- {0} second note.\n"


def write(results: Path, area: str, data: Any, notes: bool = True) -> None:
    results.mkdir(parents=True, exist_ok=True)
    (results / f"{area}.json").write_text(json.dumps(data), encoding="utf-8")
    if notes:
        (results / f"{area}.md").write_text(MD_NOTES.format(area.capitalize()),
                                            encoding="utf-8")


def section(text: str, title: str) -> str:
    """The part of the report under the heading ``## title``."""
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def table_row(text: str, case: str) -> list[str]:
    for line in text.splitlines():
        if line.startswith(f"| {case} |"):
            return [c.strip() for c in line.strip().strip("|").split("|")]
    raise AssertionError(f"no table row {case!r} in:\n{text}")


def test_report_tables_ratios_verdicts_and_chart(tmp_path: Path) -> None:
    results = tmp_path / "results"
    write(results, "storage", storage_json())
    write(results, "gateway", gateway_json())
    out = tmp_path / "out" / "REPORT.md"
    done = report.build(results, out, tmp_path / "out" / "chart.png")
    text = out.read_text(encoding="utf-8")

    storage = section(text, "Storage core at sustained volume (issue 14)")
    assert table_row(storage, "C core: append, 1 entry") == [
        "C core: append, 1 entry", "100 ns/call", "buffered file write/entry: 200 ns/call",
        "2.00×", "≤ 80 ns", "**FAIL**"]
    assert table_row(storage, "Python: read") == [
        "Python: read", "6.00 M entries/s", "—", "—", "≥ 5 M entries/s", "PASS"]
    assert table_row(storage, "C core: batch read")[-1] == "—"
    assert "| Anchor: buffered file f.write per entry |" not in storage  # anchors: own column
    assert "Notes (from storage.md):" in storage
    assert "- Storage first note." in storage
    assert "  - a sub-note wrapped onto a second line" in storage
    assert "![Storage throughput against batch size](chart.png)" in storage
    assert table_row(storage, "label c_append")[1:] == ["10.00", "15.00", "18.00", "20.00"]
    assert table_row(storage, "label single")[1:] == ["1.40", "—", "—", "—"]

    gateway = section(text, "Gateway (issue 4)")
    assert table_row(gateway, "Gateway: 1 event") == [
        "Gateway: 1 event", "14.0 k req/s", "bare Starlette: 16.5 k req/s", "0.85×",
        "≥ 0.85× anchor", "**FAIL (non-202)**"]

    head = section(text, "Headline figures")
    assert "Measured 2030-01-02 on 2 CPUs (Test CPU), 8 GiB RAM" in head
    assert "Targets met: 1 of 2." in head
    assert "Targets met overall: 1 of 3 (consumers, spark, otlp, streams, paced, forward not run)." in head
    assert "Consumers (issue 3): not run (missing)." in head
    assert "C core 10.00 M → 20.00 M; Python append_batch 0.50 M → 10.00 M" in head
    assert "31% of the CPU during Gateway (issue 4)" in head   # other programs were busy
    assert "Storage core at sustained volume (issue 14)" not in head.split("Not an idle machine")[1]

    runs = section(text, "Runs")
    assert table_row(runs, "Storage core at sustained volume (issue 14)")[1:6] == [
        "2030-01-02T03:04:05+00:00", "quick", "3", "abc1234", "1.0 min"]
    assert "`.venv/bin/python -m loadtests.bench_storage --quick`" in runs
    assert table_row(runs, "Spark (issue 5)")[1] == "not run"

    unmet = section(text, "Targets not met")
    assert "C core: append, 1 entry: 100 ns/call, target ≤ 80 ns (FAIL)" in unmet
    assert "Gateway: 1 event: 14.0 k req/s, target ≥ 0.85× anchor (FAIL (non-202))" in unmet
    assert "[storage.md](../results/storage.md)" in unmet
    assert "Python: read" not in unmet
    assert "Spark (issue 5): not run" in unmet

    assert "Not run: missing" in section(text, "Spark (issue 5)")
    assert "Run `make loadtest`" in section(text, "Load test with locust (issue 6)")

    png = (tmp_path / "out" / "chart.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
    assert done["plotted"]["label c_append"] == [(1, 1e7), (10, 1.5e7), (100, 1.8e7),
                                                 (1000, 2e7)]
    assert set(done["plotted"]) == {"label c_append", "label py_append_batch",
                                    "label py_append_delimited", "label file", "label sqlite",
                                    "label single"}


def test_nothing_ran(tmp_path: Path) -> None:
    """No result file at all: every area says not run, no chart, no crash."""
    out = tmp_path / "REPORT.md"
    done = report.build(tmp_path / "empty", out, tmp_path / "chart.png")
    text = out.read_text(encoding="utf-8")
    assert done["chart"] is None and not (tmp_path / "chart.png").exists()
    for title in ("Storage core at sustained volume (issue 14)", "Consumers (issue 3)", "Gateway (issue 4)",
                  "Spark (issue 5)"):
        assert f"- {title}: not run (missing)." in text
        assert "Not run: missing" in section(text, title)
    assert "No area ran." in section(text, "Targets not met")
    assert "Targets met overall: 0 of 0" in text


def test_unreadable_file_is_not_run(tmp_path: Path) -> None:
    """A broken JSON file is "not run"; the others are reported as usual."""
    results = tmp_path / "results"
    write(results, "storage", storage_json())
    (results / "spark.json").write_text("{not json", encoding="utf-8")
    (results / "consumers.json").write_text("[1, 2]", encoding="utf-8")
    out = results / "REPORT.md"
    done = report.build(results, out, None)
    text = out.read_text(encoding="utf-8")
    assert done["areas"]["spark"].startswith("unreadable: ")
    assert done["areas"]["consumers"] == "unreadable: ValueError: not a JSON object"
    assert "Spark (issue 5): not run (unreadable: " in text
    assert "Not run: unreadable" in section(text, "Consumers (issue 3)")
    assert done["chart"] is None and not (results / "storage_batch.png").exists()
    assert "Targets met overall: 1 of 2 (consumers, gateway, spark, otlp, streams, paced, forward not run)" in text


def test_loadtest_files_when_present(tmp_path: Path) -> None:
    """loadtest.json / soak.json of loadtests/loadtest.py: their main figures (the soak's
    only when it ran).  Neither counts in the targets."""
    results = tmp_path / "results"
    out = results / "REPORT.md"
    write(results, "loadtest", {"machine": MACHINE, "ok": True, "requests": 5000,
                                "failures": 0, "req_per_s": 812.25, "p95_ms": 35.0,
                                "events_acked": 90000, "events_stored": 90000,
                                "problems": []}, notes=False)
    write(results, "soak", {"machine": MACHINE, "ok": False, "requests": 100, "failures": 2,
                            "problems": ["lag above bound", "disk above bound"],
                            "soak": {"max_disk_mib": 51.5, "samples": [1, 2]}}, notes=False)
    write(results, "storage", storage_json())
    report.build(results, out, None)
    text = out.read_text(encoding="utf-8")
    loadtest = section(text, "Load test with locust (issue 6)")
    assert "| Passed (no loss, thresholds met) | True |" in loadtest
    assert "| Requests/s | 812.2 |" in loadtest or "| Requests/s | 812.3 |" in loadtest
    assert "| Events stored (read back) | 90000 |" in loadtest
    assert "| Problems | none |" in loadtest
    soak = section(text, "Soak test (issue 6)")
    assert "| Problems | lag above bound; disk above bound |" in soak
    assert "| soak: max_disk_mib | 51.5 |" in soak
    assert "Targets met overall: 1 of 2" in text
    write(results, "loadtest", {"machine": MACHINE, "ok": True, "requests": 5}, notes=False)
    (results / "soak.json").unlink()
    report.build(results, out, None)
    assert "Soak test" not in out.read_text(encoding="utf-8")


def test_command_line(tmp_path: Path) -> None:
    results = tmp_path / "r"
    write(results, "storage", storage_json())
    out = tmp_path / "o" / "R.md"
    proc = subprocess.run([sys.executable, "-m", "loadtests.report", "--results",
                           str(results), "--out", str(out)], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert "gateway: not run (missing)" in proc.stdout
    assert out.exists() and (tmp_path / "o" / "storage_batch.png").exists()


def test_storage_sweep_and_rows() -> None:
    """bench_storage's rows (Go Comet ratio, targets, Comet ÷ floor) and batch_sweep come
    from the series it measured."""
    figures = {"comet_1": 400.0, "comet_10": 1_200.0, "comet_100": 10_000.0,
               "comet_1000": 100_000.0, "comet_1000_budget": 120_000.0, "cffi_floor": 120.0,
               **{f"floor_{n}": 20.0 * n for n in (1, 10, 100, 1000)},
               **{f"file_{n}": 50.0 * n for n in (1, 10, 100, 1000)}}
    series = {k: benchlib.Series(k, "ns/call", [v, v * 1.1, v * 0.9]) for k, v in figures.items()}
    writer = {"floor": {"ns_per_call": 7_000.0, "ratio_to_floor": 1.0, "min": 6e3, "max": 8e3},
              "entries": {"ns_per_call": 21_000.0, "ratio_to_floor": 3.0, "min": 2e4, "max": 2.2e4}}
    rows = {r["key"]: r for r in bench_storage.build_rows(series, writer)}
    core = rows["core_writer_1000"]  # bench_entries.c's figure: a reference, no verdict
    assert core["role"] == "anchor" and core["pass"] is None and "3.00×" in core["ratio_text"]
    assert rows["comet_1"]["pass"] is True and rows["comet_1"]["ratio"] == pytest.approx(1.8)  # 720/400
    assert rows["comet_10"]["pass"] is False and rows["comet_10"]["verdict"] == "MISS"  # > 1,130
    assert rows["comet_1000_budget"]["pass"] is False                               # > 112,000
    ratio = rows["comet_floor_ratio_1000"]
    assert ratio["figure"] == pytest.approx(5.0) and ratio["unit"] == "x" and ratio["pass"] is False
    assert rows["floor_1000"]["role"] == "anchor" and rows["file_1"]["role"] == "anchor"
    sweep = bench_storage.batch_sweep(series)
    for line in sweep["lines"]:
        assert [p["batch"] for p in line["points"]] == [1, 10, 100, 1000]
    comet = {p["batch"]: p["entries_per_s"] for p in sweep["lines"][0]["points"]}
    assert comet[1000] == pytest.approx(1000 * 1e9 / 100_000.0)
    assert "batch 1000" in benchlib.sweep_table(sweep)
    assert "| Go ÷ Comet | 1.80× |" in bench_storage.entry_table(series)


def _bound_met(value: float, target: dict[str, Any]) -> bool:
    return value <= target["value"] if target["op"] == "<=" else value >= target["value"]


@pytest.mark.parametrize("area", ["storage", "consumers", "gateway", "spark"])
def test_real_results_parse(area: str) -> None:
    """The committed results load as the report expects; every PASS meets
    its stated bound."""
    path = REAL_RESULTS / f"{area}.json"
    assert path.exists(), f"{path} is committed with the benchmarks: run `make bench`"
    json.loads(path.read_text(encoding="utf-8"))
    spec = next(a for a in report.AREAS if a.key == area)
    result = report.load_area(REAL_RESULTS, spec)
    assert result.status == "ok"
    assert result.cases(), "no rows"
    assert result.machine.get("date_utc")
    for r in result.rows:
        assert r["pass"] in (True, False, None)
        target = r["target"]
        if r["pass"] and isinstance(target, dict):
            value = r["ratio"] if target["unit"] == "x" and r["unit"] != "x" else r["figure"]
            assert _bound_met(value, target), r
    if area == "storage" and "batch_sweep" in result.data:
        for line in result.data["batch_sweep"]["lines"]:
            assert [p["batch"] for p in line["points"]] == [1, 10, 100, 1000], line["key"]
            assert all(p["entries_per_s"] > 0 for p in line["points"])
