"""The JSON ingest validator alone: GB/s of ``comet_json_split`` on the gateway
benchmark's bodies, against a plain memchr split of the same bytes (anchor).

    .venv/bin/python loadtests/bench_json.py [--runs N] [--mib M]

Compiles ``loadtests/c/bench_json.c`` with the core (-O2, as the extension is
built), prints a table and the JSON written to ``loadtests/results/json.json``.
Target (issue "Exact ingest"): at least 1 GB/s on 20 KB NDJSON bodies.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

import benchlib

LOADTESTS = Path(__file__).resolve().parent
REPO = LOADTESTS.parent
RESULTS = LOADTESTS / "results" / "json.json"
TARGET_GB_S = 1.0
TITLES = {
    "memchr_split_ndjson": "Anchor: memchr split into lines, nothing checked",
    "validate_ndjson": "Validate + split, 100-event NDJSON (20 KB)",
    "validate_array": "Validate + split, 100-element JSON array",
    "validate_ndjson_spaced": "Validate + split + drop whitespace (\": \", \", \")",
}


def build(out: Path) -> None:
    sources = sorted(str(p) for p in (REPO / "storage_c" / "src").glob("*.c"))
    subprocess.run(["gcc", "-std=c11", "-D_GNU_SOURCE", "-O2", "-Wall", "-Wextra", "-Werror",
                    "-I", str(REPO / "storage_c" / "include"), "-I", str(REPO / "storage_c" / "src"),
                    *sources, str(LOADTESTS / "c" / "bench_json.c"), "-o", str(out),
                    "-lzstd", "-lpthread"], check=True, timeout=300)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--mib", type=int, default=512, help="bytes validated per run, MiB")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        binary = Path(tmp) / "bench_json"
        build(binary)
        out = subprocess.run([str(binary), str(args.runs), str(args.mib)], check=True,
                             capture_output=True, text=True, timeout=600).stdout
    raw = [json.loads(line) for line in out.splitlines() if line.strip()]
    anchor = next(r for r in raw if r["name"] == "memchr_split_ndjson")
    rows, table = [], []
    for r in raw:
        is_anchor = r is anchor
        ratio = r["gb_per_s"] / anchor["gb_per_s"]
        passed = None if is_anchor else r["gb_per_s"] >= TARGET_GB_S
        target = "—" if is_anchor else f"≥ {TARGET_GB_S:.1f} GB/s"
        table.append([TITLES[r["name"]], f"{r['gb_per_s']:.2f} GB/s", target,
                      "—" if passed is None else ("PASS" if passed else "FAIL"),
                      "—" if is_anchor else f"{ratio:.3f}× anchor"])
        rows.append(benchlib.result_row(
            TITLES[r["name"]], r["name"], r["gb_per_s"], "GB/s", f"{r['gb_per_s']:.2f} GB/s",
            role="anchor" if is_anchor else "case", ratio=None if is_anchor else ratio,
            ratio_text="—" if is_anchor else f"{ratio:.3f}×",
            target=None if is_anchor else {"op": ">=", "value": TARGET_GB_S, "unit": "GB/s"},
            target_text=target, passed=passed))
    print(benchlib.markdown_table(["Case", "Measured (median)", "Target", "Pass", "vs anchor"], table))
    result = {"benchmark": "json", "command": "python loadtests/bench_json.py",
              "runs": args.runs, "mib_per_run": args.mib,
              "machine": benchlib.machine_info(Path(tempfile.gettempdir())),
              "source": benchlib.source_state(REPO, ["storage_c/src", "loadtests/c/bench_json.c"]),
              "raw": raw, "rows": rows}
    benchlib.write_json(RESULTS, result)
    print(json.dumps({"rows": rows}, ensure_ascii=False))


if __name__ == "__main__":
    main()
