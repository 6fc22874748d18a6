"""The lake's two Delta tables, through delta-rs (the ``deltalake`` package).

The lake root is the main table; ``_rejects/`` under it is the rejects
table (a ``_``-prefixed directory: no reader of the main table lists it).
Both are partitioned by ``stream``, ``dt``, ``hour``.  Executors write the
Parquet files; the driver adds them here, every file of a run in one commit
per table, with:

- per-file statistics (row count, min and max of the ``_comet_`` columns)
  so that readers skip files by shard, entry or time;
- the run's application transaction (``txn``: the shipper's app id, the run
  number), which ``committed_run`` reads back: a run whose number is there
  is never committed again, whatever crashed where;
- the run's summary as commit metadata (``comet.*`` keys, shown by
  ``comet lake history``).

A commit that loses a race (another stream's run committed first, or added
columns) is retried on the table as it is then; the app transaction makes
the retry safe.

Local lakes are made durable here, where delta-rs does not: its commit is a
file renamed into ``_delta_log/`` without an fsync, so after each commit the
new log files and the directory are synced (the run acks its group only
after that); a run starts by syncing the log (``repair``: a killed run's
commit may not be, and this run would ack it); so a commit file that a
power cut left torn (empty, or not JSON) is the last one - the commit of a
run that never acked - and ``repair`` removes it before the run reads the
table.  For the same reason delta-rs's post-commit hook is off (its
checkpoints would be written unsynced): ``checkpoint`` writes one every
``CHECKPOINT_EVERY`` versions and syncs it, and ``repair`` drops a
checkpoint that does not read.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Iterable, Iterator, cast

import pyarrow as pa

from comet.objectstore import delta_storage_options_for
from comet.files import fsync_dir, make_dirs_durably
from comet.jsonlog import event

from .evolve import canonical, type_name
from .lakefs import Lake
from .logmirror import LogMoved, local_log
from .layout import META_COLUMNS, REJECT_SCHEMA, REJECTS_DIR, WrittenFile, partition_values

if TYPE_CHECKING:
    from deltalake import DeltaTable

log = logging.getLogger("comet.lake")

PARTITIONS = ["stream", "dt", "hour"]
PARTITION_FIELDS: list[pa.Field] = [pa.field("stream", pa.string()), pa.field("dt", pa.string()),
                    pa.field("hour", pa.int32())]
LOG_DIR = "_delta_log"
COMMIT_ATTEMPTS = 10
CHECKPOINT_EVERY = 100
_META_NAMES = {f.name for f in META_COLUMNS} | {f.name for f in PARTITION_FIELDS}


class SchemaConflict(ValueError):
    """A column the run needs exists in the table with another type."""


def storage_options(lake: Lake) -> dict[str, str] | None:
    """delta-rs's settings for the lake's object store (None: a local lake)."""
    return delta_storage_options_for(lake.store()) if lake.is_s3 else None


@dataclass(frozen=True)
class LakeTable:
    lake: Lake
    rel: str
    """Where the table is under the lake root: "" (the main table) or ``_rejects``."""

    @classmethod
    def main(cls, lake: Lake) -> LakeTable:
        return cls(lake, "")

    @classmethod
    def rejects(cls, lake: Lake) -> LakeTable:
        return cls(lake, REJECTS_DIR)

    @property
    def root(self) -> str:
        return self.lake.path(self.rel) if self.rel else self.lake.root

    @property
    def uri(self) -> str:
        return ("s3://" if self.lake.is_s3 else "") + self.root

    @property
    def name(self) -> str:
        return "rejects" if self.rel else "main"

    def open(self, version: int | None = None) -> DeltaTable | None:
        """The table as it is now, or at ``version`` (None: not created yet)."""
        return _open(self.uri, storage_options(self.lake), version)

    @contextlib.contextmanager
    def _writing(self) -> Iterator[tuple[str, dict[str, str] | None]]:
        """Where delta-rs writes the table's log (URI, storage options): the
        table, or a single-writer S3 lake's local copy of it, uploaded when
        the block ends (``logmirror.py``: LogMoved, if another commit came
        first).  For operations that write log files only."""
        if self.lake.is_s3 and self.lake.single_writer:
            with local_log(self.lake, self.rel) as root:
                yield root, None
        else:
            yield self.uri, storage_options(self.lake)

    def committed_run(self, app_id: str, table: DeltaTable | None = None) -> int:
        """The last run of ``app_id`` committed here (0: none)."""
        table = table if table is not None else self.open()
        return (table.transaction_version(app_id) or 0) if table is not None else 0

    def value_type(self, table: DeltaTable | None = None) -> pa.StructType:
        """The table's value columns (the main table's columns but its own)."""
        table = table if table is not None else self.open()
        if table is None:
            return pa.struct([])
        return pa.struct([f for f in arrow_schema(table) if f.name not in _META_NAMES])

    # ---- writing ------------------------------------------------------------------------

    def add_columns(self, value_type: pa.StructType) -> list[str]:
        """Makes every field of ``value_type`` a column of the main table
        (new ones nullable; a struct column gets the children it lacks), in
        one commit; the names added.  SchemaConflict if a column has
        another type.  Nothing to do on a table not created yet."""
        for _ in range(COMMIT_ATTEMPTS):
            try:
                with self._writing() as (uri, options):
                    added = self._add_columns(_open(uri, options), value_type)
            except LogMoved:
                continue
            if added is not None:
                return added
        raise RuntimeError(f"could not add columns to {self.uri}: other writers kept committing")

    def _add_columns(self, table: DeltaTable | None, value_type: pa.StructType) -> list[str] | None:
        """One attempt of add_columns (None: another commit came first)."""
        from deltalake import Schema
        from deltalake.exceptions import CommitFailedError

        if table is None:
            return []
        current = {f.name: f.type for f in arrow_schema(table)}
        wanted = [f for f in value_type if f.name not in current or current[f.name] != f.type]
        conflicts = [f for f in wanted if f.name in current and not _extends(current[f.name], f.type)]
        if conflicts:
            raise SchemaConflict(
                "; ".join(f"column {f.name!r} is {type_name(current[f.name])} in the lake, "
                          f"the run has {type_name(f.type)}" for f in conflicts))
        if not wanted:
            return []
        fields = list(Schema.from_arrow(pa.schema(wanted)).fields)
        before = table.version()
        try:
            table.alter.add_columns(fields, post_commithook_properties=no_hooks())
        except CommitFailedError:
            return None
        self.after_commit(before, table)
        return [f.name for f in wanted]

    def commit(self, files: list[WrittenFile], schema: pa.Schema, app_id: str, run: int,
               metadata: dict[str, Any]) -> int | None:
        """Adds ``files`` in one commit carrying run ``run`` of ``app_id``;
        its version, or None if that run had committed already.  ``schema``
        (the full schema, partitions included) creates the table if needed."""
        from deltalake import CommitProperties, Transaction

        adds = [self.add_action(f) for f in files]
        props = CommitProperties(custom_metadata={k: _text(v) for k, v in metadata.items()},
                                 app_transactions=[Transaction(app_id, run)])
        for _ in range(COMMIT_ATTEMPTS):
            try:
                with self._writing() as (uri, options):
                    table = _open(uri, options)
                    if self.committed_run(app_id, table) >= run:
                        return None
                    after = self._commit(uri, options, table, adds, schema, props)
            except LogMoved:
                continue
            if after is not None:
                return int(after.version())
        raise RuntimeError(f"could not commit to {self.uri}: other writers kept committing")

    def ensure(self, schema: pa.Schema) -> None:
        """Creates the table, empty, unless it exists: readers are told to read
        it (the rejects table) from the lake's first run on, rejects or not."""
        from deltalake import CommitProperties

        for _ in range(COMMIT_ATTEMPTS):
            try:
                with self._writing() as (uri, options):
                    if _open(uri, options) is not None or \
                            self._commit(uri, options, None, [], schema, CommitProperties()) is not None:
                        return
            except LogMoved:
                continue
        raise RuntimeError(f"could not create {self.uri}: other writers kept committing")

    def _commit(self, uri: str, options: dict[str, str] | None, table: DeltaTable | None,
                adds: list[Any], schema: pa.Schema, props: Any) -> DeltaTable | None:
        """One attempt of commit: the table after it (None: another commit came first)."""
        from deltalake import Schema
        from deltalake.exceptions import CommitFailedError, DeltaError
        from deltalake.transaction import create_table_with_add_actions

        try:
            if table is None:
                if not self.lake.is_s3:
                    make_dirs_durably(self.root, self.lake.root)
                create_table_with_add_actions(
                    uri, Schema.from_arrow(schema), adds, mode="error", partition_by=PARTITIONS,
                    storage_options=options, commit_properties=props,
                    post_commithook_properties=no_hooks())
            else:
                table.create_write_transaction(
                    adds, mode="append", schema=table.schema(), partition_by=PARTITIONS,
                    commit_properties=props, post_commithook_properties=no_hooks())
        except CommitFailedError:
            return None  # another writer won this version
        except DeltaError as exc:
            if table is None and "exist" in str(exc).lower():
                return None  # created meanwhile by another stream's run
            raise
        after = _open(uri, options)
        assert after is not None
        self.after_commit(table.version() if table is not None else -1, after)
        return after

    def add_action(self, f: WrittenFile) -> Any:
        from deltalake.transaction import AddAction

        shard, entry, time_col = (("_comet_shard", "_comet_entry", "_comet_time") if f.kind == "data"
                                  else ("shard", "entry", "timestamp"))
        stats = {"numRecords": f.rows,
                 "minValues": {shard: f.shard, entry: f.first_entry,
                               time_col: _stat_time(f.first_time_us, up=False)},
                 "maxValues": {shard: f.shard, entry: f.last_entry,
                               time_col: _stat_time(f.last_time_us, up=True)},
                 "nullCount": {shard: 0, entry: 0, time_col: 0}}
        stream = f.path.split("/", 1)[0].partition("=")[2]
        now_ms = int(datetime.now(timezone.utc).timestamp() * 1000)
        return AddAction(f.path, f.bytes, partition_values(stream, f.hour), now_ms, True,
                         json.dumps(stats))

    # ---- durability (local lakes) -------------------------------------------------------

    def made_durable(self, table: DeltaTable) -> None:
        """Syncs the log's files up to the table's version, and the directory."""
        self._sync_log()

    def _sync_log(self) -> None:
        """Syncs the log's files from the last checkpoint on, then the
        directory.  The files before a checkpoint were synced before it was
        written (``commit`` syncs, then checkpoints), so the work stays
        bounded by CHECKPOINT_EVERY however long the log grows (an fsync of
        a file with nothing to write may still flush the disk's cache)."""
        log_dir = os.path.join(self.root, LOG_DIR)
        if self.lake.is_s3 or not os.path.isdir(log_dir):
            return
        make_dirs_durably(log_dir, self.lake.root)
        names = os.listdir(log_dir)
        since = max((int(n[:20]) for n in names if n[:20].isdigit() and _is_checkpoint(n)), default=0)
        for name in names:
            if name == "_last_checkpoint" or (name[:20].isdigit() and int(name[:20]) >= since
                                              and name.endswith((".json", ".parquet"))):
                _fsync_file(os.path.join(log_dir, name))
        fsync_dir(log_dir)

    def after_commit(self, before: int, table: DeltaTable | None = None) -> int:
        """What every commit to a lake table is followed by (spark-ship's, and
        ``comet lake``'s): the log made durable, and a checkpoint when the
        version passed a multiple of CHECKPOINT_EVERY since ``before`` (the
        version the commit read).  ``table``: the table after the commit, as
        the commit wrote it (a single-writer lake's local copy of the log);
        by default the table itself.  Its version now."""
        after = table if table is not None else self.open()
        assert after is not None
        after.update_incremental()
        self.made_durable(after)
        version = int(after.version())
        if version // CHECKPOINT_EVERY > max(before, 0) // CHECKPOINT_EVERY:
            self.checkpoint(after)
        return version

    def checkpoint(self, table: DeltaTable) -> None:
        """A checkpoint of ``table``'s version, synced (readers then replay at
        most CHECKPOINT_EVERY commit files)."""
        version = table.version()
        table.create_checkpoint()
        if not self.lake.is_s3:
            log_dir = os.path.join(self.root, LOG_DIR)
            for name in os.listdir(log_dir):
                if name.startswith(f"{version:020d}.checkpoint") or name == "_last_checkpoint":
                    _fsync_file(os.path.join(log_dir, name))
            fsync_dir(log_dir)

    def repair(self) -> list[str]:
        """Makes a local table's log safe to act on, before anything reads
        it: removes what a power cut can leave torn (the last commit file -
        a run that never acked -, a checkpoint), then syncs the log.  The
        sync is for a process killed between its commit and its sync: this
        one would read that run as committed and ack it, and a power cut
        would then take the commit back but not the ack (the run's entries
        never shipped).  The names removed."""
        log_dir = os.path.join(self.root, LOG_DIR)
        if self.lake.is_s3 or not os.path.isdir(log_dir):
            return []
        removed = []
        commits = sorted(n for n in os.listdir(log_dir) if n.endswith(".json") and n[:20].isdigit())
        if commits and not _whole_commit(os.path.join(log_dir, commits[-1])):
            os.unlink(os.path.join(log_dir, commits[-1]))
            removed.append(commits[-1])
        last = os.path.join(log_dir, "_last_checkpoint")
        if os.path.exists(last) and not _checkpoint_reads(log_dir, last):
            for name in os.listdir(log_dir):
                if ".checkpoint." in name:
                    os.unlink(os.path.join(log_dir, name))
                    removed.append(name)
            os.unlink(last)
            removed.append("_last_checkpoint")
        self._sync_log()
        if removed:
            event(log, "repaired_table_log", table=self.uri, removed=removed)
        return removed


def _open(uri: str, options: dict[str, str] | None, version: int | None = None) -> DeltaTable | None:
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return DeltaTable(uri, version=version, storage_options=options)
    except TableNotFoundError:
        return None


def main_schema(value_type: pa.StructType) -> pa.Schema:
    return pa.schema(list(value_type) + META_COLUMNS + PARTITION_FIELDS)


def rejects_schema() -> pa.Schema:
    return pa.schema(list(REJECT_SCHEMA) + PARTITION_FIELDS)


def arrow_schema(table: DeltaTable) -> pa.Schema:
    """The table's schema in pyarrow's types, one spelling per type."""
    # to_arrow() gives an Arrow C-interface schema, which pyarrow takes as it is
    schema = pa.schema(cast(Any, table.schema().to_arrow()))
    return pa.schema([pa.field(f.name, canonical(f.type)) for f in schema])


def _extends(current: pa.DataType, wanted: pa.DataType) -> bool:
    """A struct column whose children ``wanted`` keeps, with the same types, and adds to."""
    if not (pa.types.is_struct(current) and pa.types.is_struct(wanted)):
        return False
    have = {f.name: f.type for f in current}
    return all(f.name not in have or have[f.name] == f.type or _extends(have[f.name], f.type)
               for f in wanted)


def no_hooks() -> Any:
    from deltalake.transaction import PostCommitHookProperties

    return PostCommitHookProperties(create_checkpoint=False, cleanup_expired_logs=False)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def _stat_time(micros: int, up: bool) -> str:
    """A statistics timestamp: Delta's are in milliseconds, so a maximum is
    rounded up and a minimum down (a reader must never skip a file wrongly)."""
    millis = -(-micros // 1000) if up else micros // 1000
    at = datetime.fromtimestamp(millis / 1000, tz=timezone.utc)
    return f"{at:%Y-%m-%dT%H:%M:%S}.{millis % 1000:03d}Z"


def _fsync_file(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return  # a temporary file of delta-rs, renamed meanwhile
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _is_checkpoint(name: str) -> bool:
    return ".checkpoint." in name and name.endswith(".parquet")


def _whole_commit(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            lines = [line for line in f.read().splitlines() if line.strip()]
        return bool(lines) and all(isinstance(json.loads(line), dict) for line in lines)
    except (OSError, ValueError):
        return False


def _checkpoint_reads(log_dir: str, last: str) -> bool:
    import pyarrow.parquet as pq

    try:
        with open(last, "rb") as f:
            version = int(json.loads(f.read())["version"])
        names = [n for n in os.listdir(log_dir) if n.startswith(f"{version:020d}.checkpoint")]
        return bool(names) and all(pq.read_metadata(os.path.join(log_dir, n)).num_rows >= 0
                                   for n in names)
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException):
        return False


def ranges_text(ranges: Iterable[tuple[int, tuple[int, int]]]) -> str:
    return json.dumps({str(s): [a, b] for s, (a, b) in sorted(ranges)}, separators=(",", ":"))

