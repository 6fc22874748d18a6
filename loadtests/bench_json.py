"""The JSON ingest validator (``c/bench_json.c``): GB/s against a memchr split of the
same bodies (anchor); target ≥ 1 GB/s on the gateway benchmark's 20 KB bodies
(NDJSON and the array).  The spaced NDJSON row (every event compacted) is a
reference without a target.

    .venv/bin/python -m loadtests.bench_json [--quick] [--runs N] [--mib M]
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run by its path: again as a module
    from by_path import rerun_as_module  # type: ignore[import-not-found]

    rerun_as_module(__file__)

import json
import subprocess
import tempfile
from pathlib import Path

from loadtests import benchlib

LOADTESTS = Path(__file__).resolve().parent
TARGET_GB_S = 1.0
TARGETED = {"validate_ndjson", "validate_array"}
TITLES = {
    "memchr_split_ndjson": "Anchor: memchr split into lines, nothing checked",
    "validate_ndjson": "Validate + split, 100-event NDJSON (20 KB)",
    "validate_array": "Validate + split, 100-element JSON array",
    "validate_ndjson_spaced": "Validate + split + drop whitespace (\": \", \", \")",
}


def main() -> None:
    parser = benchlib.parser(__doc__, "1 run of 64 MiB")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--mib", type=int, default=512, help="bytes validated per run, MiB")
    args = parser.parse_args()
    runs, mib = (1, 64) if args.quick else (args.runs, args.mib)
    ctx = benchlib.Context("bench_json", Path(tempfile.gettempdir()),
                           ["storage_c/src", "loadtests/c/bench_json.c"])
    with tempfile.TemporaryDirectory() as tmp:
        binary = Path(tmp) / "bench_json"
        benchlib.build_c(LOADTESTS / "c" / "bench_json.c", binary)
        out = subprocess.run([str(binary), str(runs), str(mib)], check=True,
                             capture_output=True, text=True, timeout=600).stdout
    raw = [json.loads(line) for line in out.splitlines() if line.strip()]
    anchor = next(r for r in raw if r["name"] == "memchr_split_ndjson")
    ref = benchlib.anchor_ref(anchor["name"], "memchr split", anchor["gb_per_s"], "GB/s",
                              f"{anchor['gb_per_s']:.2f} GB/s")
    rows = [benchlib.row(TITLES[r["name"]], r["name"], r["gb_per_s"], "GB/s",
                         f"{r['gb_per_s']:.2f} GB/s", role="anchor" if r is anchor else "case",
                         anchor=None if r is anchor else ref,
                         ratio=None if r is anchor else r["gb_per_s"] / anchor["gb_per_s"],
                         target={"op": ">=", "value": TARGET_GB_S, "unit": "GB/s"}
                         if r["name"] in TARGETED else None,
                         target_text=f"≥ {TARGET_GB_S:.1f} GB/s" if r["name"] in TARGETED else "—",
                         runs_text=", ".join(f"{x:.2f}" for x in r["runs_gb_per_s"]) + " GB/s")
            for r in raw]
    ctx.write(args, "json", "JSON validator", rows, [f"- Median of {runs} run(s) of {mib} MiB each."],
              {"scale": {"runs": runs, "mib_per_run": mib}, "raw": raw})


if __name__ == "__main__":
    main()
