"""Instructions per append call against the budgets committed beside this file.

    python3 storage_c/tests/append_budget.py BENCH_APPEND [BUDGETS] [--update]
    make append-budget          # builds build/bench/bench_append, then runs this

Runs loadtests/c/bench_append.c's fixed workload (1, 10, 100 and 1000 entries per
call into one shard, the calls the Python API makes) under callgrind, which dumps
the instructions of each case's calls alone, and compares instructions per call
with append_budget.txt.  A count is this machine's compiler's and C library's and
does not depend on load or timing (runs differ by a few instructions in millions),
so the check is exact where a timed one would be noise.  A case more than the
file's tolerance above its budget fails, with the figures; one well below it is
reported so that the budget can come down with the change that won it.  Raising
a budget is a line of that file, in the change that needs it (--update rewrites
the figures from this run).  Prints a table, then "N passed, N failed".
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_BUDGETS = HERE / "append_budget.txt"
SLACK_NOTE = 0.10  # a case this far below its budget is pointed out


def read_budgets(path: Path) -> tuple[float, dict[int, float], list[str]]:
    """(tolerance in percent, budget by entries per call, the file's comment lines)."""
    tolerance = 3.0
    budgets: dict[int, float] = {}
    comments: list[str] = []
    for line in path.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            comments.append(line)
            continue
        key, value = line.split()
        if key == "tolerance_percent":
            tolerance = float(value)
        else:
            budgets[int(key)] = float(value)
    return tolerance, budgets, comments


def write_budgets(path: Path, tolerance: float, counts: dict[int, float], comments: list[str]) -> None:
    lines = [*comments, f"tolerance_percent {tolerance:g}"]
    lines += [f"{n} {counts[n]:.0f}" for n in sorted(counts)]
    path.write_text("\n".join(lines) + "\n")


def scratch_root() -> str | None:
    """/dev/shm when it is there (the workload writes about 50 MiB), else TMPDIR."""
    return "/dev/shm" if os.access("/dev/shm", os.W_OK) else None


def count(binary: Path) -> dict[int, float]:
    """Instructions per call of each case: one callgrind dump per case."""
    if not shutil.which("valgrind"):
        sys.exit("append_budget: valgrind is not installed (make system-deps installs it)")
    with tempfile.TemporaryDirectory(prefix="comet-append-budget.", dir=scratch_root()) as tmp:
        work = Path(tmp) / "work"
        work.mkdir()
        run = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/cg.%p", str(binary),
             str(work)], capture_output=True, text=True, timeout=600)
        if run.returncode:
            sys.exit(f"append_budget: {binary} failed ({run.returncode}):\n{run.stderr[-2000:]}")
        calls = {c["entries"]: c["calls"] for c in map(json.loads, run.stdout.splitlines())}
        per_call: dict[int, float] = {}
        for dump in Path(tmp).glob("cg.*.*"):
            text = dump.read_text()
            case = re.search(r"^desc: Trigger: Client Request: append (\d+)$", text, re.M)
            total = re.search(r"^(?:summary|totals): (\d+)", text, re.M)
            if case and total:
                n = int(case.group(1))
                per_call[n] = int(total.group(1)) / calls[n]
    if set(per_call) != set(calls):
        sys.exit(f"append_budget: callgrind dumped {sorted(per_call)}, the workload ran {sorted(calls)}")
    return per_call


def compiler() -> str:
    cc = os.environ.get("CC", "cc")
    try:
        return subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    except (OSError, IndexError):
        return cc


def main(argv: list[str]) -> int:
    args = [a for a in argv if a != "--update"]
    if not 1 <= len(args) <= 2:
        print(__doc__, file=sys.stderr)
        return 2
    binary = Path(args[0])
    budgets_path = Path(args[1]) if len(args) == 2 else DEFAULT_BUDGETS
    tolerance, budgets, comments = read_budgets(budgets_path)
    counts = count(binary)
    if "--update" in argv:
        write_budgets(budgets_path, tolerance, counts, comments)
        budgets = {n: round(c) for n, c in counts.items()}
        print(f"append_budget: {budgets_path} rewritten from this run")
    print(f"Instructions per append call (callgrind; budgets: {budgets_path.name}, "
          f"tolerance {tolerance:g} %; {compiler()}):")
    print(f"  {'entries/call':>12} {'budget':>10} {'measured':>10} {'change':>8}  verdict")
    failed = passed = 0
    for n in sorted(counts):
        budget = budgets.get(n)
        if budget is None:
            print(f"  {n:>12} {'-':>10} {counts[n]:>10.0f} {'':>8}  FAIL: no budget for {n} entries")
            failed += 1
            continue
        change = (counts[n] / budget - 1) * 100
        if counts[n] > budget * (1 + tolerance / 100):
            verdict = f"FAIL: over the budget by more than {tolerance:g} %"
            failed += 1
        else:
            verdict = "ok"
            if counts[n] < budget * (1 - SLACK_NOTE):
                verdict += f" (well below: the budget may come down to {counts[n]:.0f})"
            passed += 1
        print(f"  {n:>12} {budget:>10.0f} {counts[n]:>10.0f} {change:>+7.1f}%  {verdict}")
    if failed:
        print(f"  An append got dearer.  Find where with `valgrind --tool=callgrind {binary} DIR` "
              "and callgrind_annotate on the case's dump; if the cost is meant, raise its line "
              f"in {budgets_path} in the same change.")
    print(f"append budget: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
