"""Line coverage of the C core by its tests: `make coverage` compiles the core
once with --coverage (BUILD/core), links every C test to it (BUILD/tests) and
runs them, each adding its counts to the same .gcda files; this sums gcov's
per-line counts over the directories under BUILD (a line is covered when any
test ran it) and prints one row per source file of SRC's folders plus the total.  With
--min PERCENT it exits 1, saying so, when the total is below PERCENT (the gate
of `make coverage`: COVERAGE_MIN in the Makefile).

    python3 scripts/coverage-summary.py build/coverage storage_c/src [--min 83.3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path


def line_counts(test_dir: Path) -> dict[str, dict[int, int]]:
    """{source file name: {line: count}} of one test's run, from gcov's JSON."""
    notes = sorted(p.name for p in test_dir.glob("*.gcno"))
    out = subprocess.run(["gcov", "--json-format", "--stdout", *notes], cwd=test_dir,
                         capture_output=True, text=True, check=True).stdout
    counts: dict[str, dict[int, int]] = defaultdict(dict)
    decoder = json.JSONDecoder()
    text, at = out.strip(), 0
    while at < len(text):  # one JSON document per note file, back to back
        doc, end = decoder.raw_decode(text, at)
        at = end
        while at < len(text) and text[at].isspace():
            at += 1
        for f in doc["files"]:
            lines = counts[Path(f["file"]).name]
            for line in f["lines"]:
                n = line["line_number"]
                lines[n] = lines.get(n, 0) + line["count"]
    return counts


def main(build: str, src: str, minimum: float | None = None) -> int:
    sources = {p.name for p in Path(src).rglob("*.c")}  # its folders' files: no two share a name
    total: dict[str, dict[int, int]] = defaultdict(dict)
    for test_dir in sorted(p for p in Path(build).iterdir() if p.is_dir()):
        for name, lines in line_counts(test_dir).items():
            if name in sources:
                for n, c in lines.items():
                    total[name][n] = total[name].get(n, 0) + c
    print(f"{'file':<16} {'lines':>6} {'run':>6} {'cover':>7}")
    all_lines = all_run = 0
    for name in sorted(sources):
        lines = total.get(name, {})
        run = sum(1 for c in lines.values() if c)
        all_lines += len(lines)
        all_run += run
        pct = 100 * run / len(lines) if lines else 0.0
        print(f"{name:<16} {len(lines):>6} {run:>6} {pct:>6.1f}%")
    cover = 100 * all_run / max(all_lines, 1)
    print(f"{'total':<16} {all_lines:>6} {all_run:>6} {cover:>6.1f}%")
    if minimum is not None and round(cover, 1) < minimum:
        print(f"line coverage of {src} is {cover:.1f}%, below the floor of {minimum:.1f}% "
              f"(COVERAGE_MIN in the Makefile): test the new code, or lower the floor with a "
              f"reason", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("build", help="the coverage build directory (build/coverage)")
    parser.add_argument("src", help="the C sources (storage_c/src)")
    parser.add_argument("--min", type=float, dest="minimum", metavar="PERCENT",
                        help="exit 1 when the total line coverage is below PERCENT")
    args = parser.parse_args()
    sys.exit(main(args.build, args.src, args.minimum))
