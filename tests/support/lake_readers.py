"""A lake read as its users read it, each reader on its own: deltalake, Polars
(``pl.read_delta``) and DuckDB (``delta_scan``, with the extension file of
the ``duckdb-ext-delta`` package: no download); and what the tables' commits
say about the runs (``comet.*`` commit metadata, the app transaction)."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

Keys = list[tuple[int, int]]
MAIN_KEYS = ("_comet_shard", "_comet_entry")
REJECT_KEYS = ("shard", "entry")


def is_table(table: Path) -> bool:
    """A Delta table is there: its log has a commit (a ``_delta_log`` a
    power cut left empty is no table yet, for every reader)."""
    log = table / "_delta_log"
    return log.is_dir() and any(p.name[:20].isdigit() for p in log.glob("*.json"))


def _deltalake(table: Path, columns: tuple[str, str]) -> Keys:
    """The files deltalake's log lists, read by pyarrow (spark_jobs.lake.read): what
    ``DeltaTable.to_pyarrow_table`` does, without its Rust filesystem handler,
    whose threads make a process abort at exit now and then."""
    from spark_jobs.lake.read import read_table
    from spark_jobs.lake.lakefs import Lake

    rejects = table.name == "_rejects"
    read = read_table(Lake(str(table.parent if rejects else table)),
                      kind="rejects" if rejects else "data").to_pydict()
    return [(int(s), int(e)) for s, e in zip(read[columns[0]], read[columns[1]])]


def _polars(table: Path, columns: tuple[str, str]) -> Keys:
    import polars as pl

    frame = pl.read_delta(str(table), columns=list(columns))
    return [(int(s), int(e)) for s, e in frame.select(list(columns)).iter_rows()]


@functools.cache
def duckdb_delta_extension() -> str:
    """The delta extension file that ``duckdb-ext-delta`` installs."""
    import importlib.util

    spec = importlib.util.find_spec("duckdb_ext")  # a namespace package: files only
    assert spec is not None and spec.submodule_search_locations, "duckdb-ext-delta is not installed"
    found = sorted(f for d in spec.submodule_search_locations
                   for f in Path(d).glob("extensions/v1.4.4/*/delta.duckdb_extension"))
    assert found, "duckdb-ext-delta installed no delta extension for duckdb 1.4.4"
    return str(found[0])


def _duckdb(table: Path, columns: tuple[str, str]) -> Keys:
    import duckdb

    con = duckdb.connect(config={"autoinstall_known_extensions": False,
                                 "autoload_known_extensions": False})
    try:
        con.execute(f"LOAD '{duckdb_delta_extension()}'")
        where = str(table).replace("'", "''")
        rows = con.execute(f"select {columns[0]}, {columns[1]} from delta_scan('{where}')").fetchall()
    finally:
        con.close()
    return [(int(s), int(e)) for s, e in rows]


READERS: dict[str, Callable[[Path, tuple[str, str]], Keys]] = {
    "deltalake": _deltalake, "polars": _polars, "duckdb": _duckdb}


def keys_by_reader(table: Path, columns: tuple[str, str]) -> dict[str, Keys]:
    """(shard, entry) of every row of the table as each reader sees it,
    sorted (nothing: the table does not exist yet)."""
    if not is_table(table):
        return {name: [] for name in READERS}
    return {name: sorted(read(table, columns)) for name, read in READERS.items()}


@dataclass(frozen=True)
class RunCommit:
    """One commit of a spark-ship run, from its ``comet.*`` commit metadata."""

    version: int
    app: str
    run: int
    ranges: dict[int, tuple[int, int]]
    rows: int
    rejects: int
    missing: int


def run_commits(table: Path, version: int | None = None) -> list[RunCommit]:
    """The runs' commits of the table (as of ``version``), oldest first; each
    one checked against the app transaction the table records for its app."""
    from deltalake import DeltaTable

    if not is_table(table):
        return []
    delta = DeltaTable(str(table), version=version)
    out = []
    for commit in sorted(delta.history(), key=lambda c: int(c["version"])):
        if "comet.run" not in commit:
            continue  # a schema change (added columns)
        ranges = {int(s): (int(a), int(b)) for s, (a, b) in json.loads(commit["comet.ranges"]).items()}
        out.append(RunCommit(int(commit["version"]), commit["comet.app"], int(commit["comet.run"]),
                             ranges, int(commit["comet.rows"]), int(commit["comet.rejects"]),
                             int(commit["comet.missing"])))
    for app in {c.app for c in out}:
        last = max(c.run for c in out if c.app == app)
        assert delta.transaction_version(app) == last, (
            f"{table}: the app transaction of {app} is {delta.transaction_version(app)}, its last "
            f"commit's run {last}")
    return out
