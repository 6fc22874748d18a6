"""One house: storage_c is the bottom and imports nothing above it; comet (the
command and the shared kit) sits on it and imports no package above; every
package owns its commands, loaded lazily by `comet`; the tests share helpers
through tests/support/ only.  (What the packages above need from the storage is
public storage_c API: test_storage_api.py and test_envelope.py.)"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
from click.testing import CliRunner

from comet.cli import main
from storage_c import Config, Log

REPO = Path(__file__).resolve().parent.parent
ABOVE = ("consumers", "gateway", "spark_jobs")
HEAVY = ("pyspark", "starlette", "boto3", "botocore", "pyarrow", "uvicorn", "gunicorn")


def imported_modules(path: Path) -> set[str]:
    """Every module a source file imports (at any level, lazily or not)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


# ---- layering ---------------------------------------------------------------------------


def test_storage_c_imports_nothing_above_it() -> None:
    for source in sorted((REPO / "storage_c").glob("*.py")):
        above = {m for m in imported_modules(source) if m.split(".")[0] in ABOVE + ("comet",)}
        assert not above, f"{source.name} imports {sorted(above)}"


def test_the_kit_imports_no_package_above_it() -> None:
    for source in sorted((REPO / "comet").glob("*.py")):
        above = {m for m in imported_modules(source) if m.split(".")[0] in ABOVE}
        assert not above, f"comet/{source.name} imports {sorted(above)}"


def test_nothing_above_storage_c_uses_its_c_binding() -> None:
    for package in ABOVE + ("comet",):
        for source in sorted((REPO / package).rglob("*.py")):
            assert not {m for m in imported_modules(source) if m.startswith("storage_c._")}, \
                f"{source.relative_to(REPO)} uses storage_c's private modules"


def test_spark_submit_script_does_not_go_back_through_the_comet_group() -> None:
    assert "comet.cli" not in imported_modules(REPO / "spark_jobs" / "spark" / "submit.py")
    loaded = modules_after("import spark_jobs.spark.submit")
    assert "comet.cli" not in loaded and "spark_jobs.spark.cli" in loaded


def modules_after(code: str, *argv: str) -> set[str]:
    """The modules loaded in a fresh interpreter after ``code`` runs."""
    probe = textwrap.dedent(f"""
        import json, sys
        sys.argv = ["comet", *{list(argv)!r}]
        try:
            {code}
        except SystemExit:
            pass
        sys.stdout.flush()
        print("\\nMODULES=" + json.dumps(sorted(sys.modules)))
    """)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stdout.rsplit("MODULES=", 1)[1]))


def forbidden(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m.split(".")[0] in HEAVY + ABOVE)


@pytest.mark.parametrize("args", [["stat", "--help"], ["stat", "{data}"], ["--help"]])
def test_comet_stat_loads_no_other_package(args: list[str], data_dir: Path) -> None:
    """`comet stat` (and `comet --help`, which lists every command) import
    neither Spark, Starlette nor boto3; `comet stat` not even the packages
    above the storage."""
    with Log(data_dir, Config(shards=1)) as log:
        log.append("ev", b"{}")
    argv = [a.format(data=data_dir) for a in args]
    loaded = modules_after("from comet.cli import main; main()", *argv)
    if args[0] == "stat":
        assert forbidden(loaded) == []
    else:  # --help imports each package's command module, nothing heavy
        assert [m for m in forbidden(loaded) if m.split(".")[0] in HEAVY] == []


def test_installed_comet_stat_under_importtime(data_dir: Path) -> None:
    """The real console script, measured by the interpreter itself."""
    with Log(data_dir, Config(shards=1)) as log:
        log.append("ev", b"{}")
    comet = Path(sys.executable).with_name("comet")
    out = subprocess.run([sys.executable, "-X", "importtime", str(comet), "stat", str(data_dir)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "ev" in out.stdout
    imported = {line.rsplit("|", 1)[1].strip() for line in out.stderr.splitlines()
                if line.startswith("import time:") and "|" in line}
    assert "comet.cli" in imported
    assert forbidden(imported) == []


def test_help_lists_every_command() -> None:
    out = CliRunner().invoke(main, ["--help"])
    assert out.exit_code == 0, out.output
    listed = {line.split()[0] for line in out.output.split("Commands:")[1].splitlines() if line.strip()}
    assert listed == {"stat", "tail", "verify", "group", "stream", "consume", "ship", "serve",
                      "spark-ship", "lake"}


def test_each_package_owns_its_commands() -> None:
    ctx = main.make_context("comet", ["stat", "x"])
    owners = {name: main.get_command(ctx, name).callback.__module__  # type: ignore[union-attr]  # all listed
              for name in main.list_commands(ctx)}
    assert owners == {"stat": "comet.cli", "tail": "comet.cli", "verify": "comet.cli",
                      "group": "comet.admin", "stream": "comet.admin",
                      "consume": "consumers.cli", "ship": "consumers.cli",
                      "serve": "gateway.cli", "spark-ship": "spark_jobs.spark.cli",
                      "lake": "spark_jobs.lake.cli"}


def test_a_command_that_cannot_load_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    import comet.cli as cli

    broken = EntryPoint("broken", "no_such_package.cli:cmd", cli.ENTRY_POINT_GROUP)
    monkeypatch.setattr(cli, "entry_points", lambda group: [broken])
    listing = CliRunner().invoke(main, ["--help"])
    assert listing.exit_code == 0 and "broken" in listing.output
    out = CliRunner().invoke(main, ["broken", "./data", "--some-option"])
    assert out.exit_code == 1
    assert "comet broken is not available: cannot import no_such_package.cli:cmd" in out.output
    assert "Traceback" not in out.output


# ---- the tests ----------------------------------------------------------------------------


def imported_test_modules(path: Path) -> set[str]:
    """The last part of every module a source file imports, relative imports included
    (``from .test_x import y`` -> test_x; ``from . import conftest`` -> conftest)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.rsplit(".", 1)[-1] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.module:
                names.add(node.module.rsplit(".", 1)[-1])
            names |= {a.name for a in node.names}
    return {n for n in names if n.startswith("test_") or n == "conftest"}


def test_no_test_module_imports_another_or_a_conftest() -> None:
    """Shared test helpers live in tests/support/ (conftest.py holds fixtures only):
    a module of the tests or the load tests imports no test module and no conftest."""
    sources = [*sorted((REPO / "tests").rglob("*.py")), *sorted((REPO / "loadtests").glob("*.py"))]
    assert len(sources) > 40
    wrong = {str(s.relative_to(REPO)): sorted(found) for s in sources
             if (found := imported_test_modules(s))}
    assert not wrong, f"move what these import to tests/support/: {wrong}"
