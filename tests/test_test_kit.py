"""The tests and the benchmarks reach what they share as packages: tests.support (the
kit) and loadtests, imported by name from the repository's root, with no sys.path
edits; the benchmarks take from tests/ the kit only, and the child-process programs
live in tests/children/."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SOURCES = sorted([*(REPO / "tests").rglob("*.py"), *(REPO / "loadtests").rglob("*.py")])
SYS_PATH_EDIT = re.compile(r"sys\.path\s*(\[[^\]]*\]\s*)?(=|\.insert|\.append|\.extend|\+=)")


def imported(source: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def runs_as_a_program(source: Path) -> bool:
    """Whether the module has a top-level ``if __name__ == "__main__":``."""
    return any(isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
               and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__"
               for node in ast.parse(source.read_text()).body)


def test_no_source_edits_sys_path() -> None:
    assert len(SOURCES) > 100
    found = {str(s.relative_to(REPO)): m.group(0) for s in SOURCES
             if (m := SYS_PATH_EDIT.search(s.read_text()))}
    assert not found, f"import these as packages instead: {found}"


def test_the_benchmarks_take_only_the_kit_from_the_tests() -> None:
    wrong = {str(s.relative_to(REPO)): sorted(bad) for s in sorted((REPO / "loadtests").rglob("*.py"))
             if (bad := {m for m in imported(s) if m.split(".")[0] == "tests"
                         and not m.startswith("tests.support")})}
    assert not wrong, wrong


def test_child_programs_live_in_tests_children() -> None:
    """A module run as a program of its own (``if __name__ == "__main__"``) is in
    tests/children/, but for the power-cut harness's filesystem and writer and the
    Swift servers, which their own modules run."""
    own_runners = {"tests/powercut/fs.py", "tests/powercut/writer.py", "tests/support/swift_server.py"}
    programs = {str(s.relative_to(REPO)) for s in SOURCES
                if s.parts[len(REPO.parts)] == "tests" and runs_as_a_program(s)}
    assert programs - own_runners == {"tests/children/workers.py", "tests/children/fault_worker.py"}


def test_a_benchmark_runs_by_its_path_too(tmp_path: Path) -> None:
    """``python loadtests/bench_x.py`` from any directory runs it as the module."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(REPO / "loadtests" / "bench_storage.py"), "--help"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "usage:" in out.stdout and "--gb" in out.stdout
