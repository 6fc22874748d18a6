"""spark_jobs's two rooms: ``lake/`` works without Spark and never reaches into
``spark/``, which builds on it."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LAKE = REPO / "spark_jobs" / "lake"


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")


def imports_of(path: Path) -> set[str]:
    """Every module a source file imports, relative imports resolved (at any
    level, lazily or not); ``from p import x`` counts as ``p`` and ``p.x``."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path.parent)
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            anchor = parts[:len(parts) - node.level + 1] if node.level else []
            base = ".".join(anchor + ([node.module] if node.module else []))
            names |= {base} | {f"{base}.{a.name}" for a in node.names}
    return names


def test_the_lake_imports_neither_pyspark_nor_the_spark_room() -> None:
    sources = sorted(LAKE.rglob("*.py"))
    assert len(sources) > 10, "the lake's modules were not found"
    for path in sources:
        wrong = sorted(m for m in imports_of(path)
                       if m.split(".")[0] == "pyspark" or m.startswith("spark_jobs.spark"))
        assert not wrong, f"{path.relative_to(REPO)} imports {wrong}"


def test_the_import_resolver_sees_relative_imports() -> None:
    assert "spark_jobs.lake.layout" in imports_of(LAKE / "delta.py")
    assert "spark_jobs.lake.lakefs" in imports_of(LAKE / "lock" / "__init__.py")
    assert "spark_jobs.lake.delta" in imports_of(REPO / "spark_jobs" / "spark" / "ship.py")


def test_importing_the_whole_lake_loads_no_spark() -> None:
    """Every module of the lake, imported in a fresh interpreter: no pyspark
    module is loaded, and nothing of ``spark_jobs.spark``."""
    names = sorted(module_name(p) for p in LAKE.rglob("*.py"))
    probe = (f"import importlib, json, sys\nfor name in {names!r}:\n    importlib.import_module(name)\n"
             "print(json.dumps(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout.splitlines()[-1])
    assert {"spark_jobs.lake.cli", "spark_jobs.lake.lock.s3lease"} <= set(loaded)  # the probe did import them
    spark = [m for m in loaded if m.split(".")[0] == "pyspark" or m.startswith("spark_jobs.spark")]
    assert not spark, f"the lake loads {spark}"


def test_the_package_still_offers_the_session() -> None:
    import spark_jobs
    from spark_jobs.spark.session import register, spark_session

    assert (spark_jobs.spark_session, spark_jobs.register) == (spark_session, register)
