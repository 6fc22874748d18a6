"""Locust load test of the gateway, with a no-loss, no-duplicate check; and its soak variant.

    make loadtest                                   # 60 s, 16 users (LOADTEST_SECONDS, LOADTEST_USERS)
    make soak                                       # 300 s with retention and `comet ship` (SOAK_SECONDS)
    .venv/bin/python loadtests/loadtest.py --run-time 30 --users 8 BatchUser KeyedUser
    .venv/bin/python loadtests/loadtest.py --soak --run-time 90

What a run does (the project's venv runs this file; locust runs in
``.venv-locust``, created here when missing, because it monkey-patches the
standard library with gevent):

1. a fresh data directory under ``loadtests/.scratch/<name>/`` and ``comet serve``
   with ``--workers`` (2) workers on 127.0.0.1 and a free port (access log off
   unless ``--access-log``; storage settings from ``--storage KEY=VALUE``), in a
   process group of its own; it waits until every worker answers ``/readyz``;
2. ``locust --headless`` (one process unless ``--locust-processes``: on this
   2-CPU machine locust, not the gateway, is what saturates first; the
   gateway's own ceiling is what ``bench_gateway.py`` measures with wrk)
   with ``loadtests/locustfile.py`` for ``--run-time``
   seconds (``--stop-timeout`` lets every request in flight get its answer), CSV
   statistics in ``loadtests/results/<name>_*.csv``; each locust process records
   every answer (request id, and for a 202 its stream, shard, first, last, count);
3. the gateway is stopped (TERM: it drains and syncs), then the data directory
   is read back with ``storage_c.Log`` and every stored entry is matched to the
   202 that acknowledged it (the check below);
4. a summary table on stdout, the figures in ``loadtests/results/<name>.json``,
   exit status 0 only when locust's thresholds held and the check passed.

The check: for every shard, the 202s' ranges ``[first, last]`` must not
overlap; the entry at ``first + i`` must be event ``i`` of that very request
(events carry their request id and index); every stored entry must lie in an
acknowledged range (an entry outside them is a duplicate when its request was
acknowledged elsewhere, "stored after an error" when the gateway answered an
error, "unanswered" when the client got no answer, foreign otherwise); keyed
requests must sit in the key's shard.  Events stored == events acknowledged
holds exactly when all of that does.

The soak (``--soak``) runs the same load, paced (``--user-rps``), with a
retention budget (``retention_max_total_bytes``, small segments, 4 shards,
a retention pass every second, unconsumed data protected) and ``comet ship``
draining the stream into a local directory sink (NDJSON.zst objects).  Every
``--sample-interval`` seconds it samples the log's size (segment and index
files: what the budget counts), the data directory's disk usage (du) and the
ship group's lag.  It fails unless the log stays within the budget plus one
segment of slack, the lag stays under ``--max-lag`` and drains to 0 within
``--drain-timeout`` once the load stops.  Its no-loss check is the one above
over the union of the sink's objects and what is left in the log: retention
may only have deleted entries that were shipped (the group protects them), so
every acknowledged event must be found, exactly once, in one or the other;
objects must not overlap and must hold as many lines as their key says.

Every process it starts runs in its own process group and is stopped (TERM,
then KILL of the whole group) on exit, on failure and on Ctrl-C or TERM.
"""

from __future__ import annotations

import argparse
import csv
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

import orjson
import zstandard

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from benchlib import free_port, machine_info  # noqa: E402

from storage_c import CometError, Config, Log, StreamNotFound  # noqa: E402

LOCUST_VENV = REPO / ".venv-locust"
REQUIREMENTS = HERE / "requirements-locust.txt"
LOCUSTFILE = HERE / "locustfile.py"
RESULTS = HERE / "results"
SCRATCH = HERE / ".scratch"
COMET = Path(sys.executable).with_name("comet")
MiB = 1 << 20

READ_CONFIG = Config(create=False, auto_create_streams=False, background_flush=False,
                     retention_interval_ms=0)


# ---- the locust virtualenv -------------------------------------------------------------------


def ensure_locust_venv(venv: Path = LOCUST_VENV) -> Path:
    """``venv/bin/locust``, installing it from requirements-locust.txt first when
    missing or older than that file (what ``make locust-venv`` does)."""
    locust = venv / "bin" / "locust"
    stamp = venv / ".installed"
    if locust.exists() and stamp.exists() and stamp.stat().st_mtime >= REQUIREMENTS.stat().st_mtime:
        return locust
    print(f"installing locust into {venv} ...", flush=True)
    python = venv / "bin" / "python"
    if not python.exists():
        base = getattr(sys, "_base_executable", None) or sys.executable
        subprocess.run([base, "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run(pip + ["--upgrade", "pip"], check=True)
    subprocess.run(pip + ["-r", str(REQUIREMENTS)], check=True)
    stamp.touch()
    return locust


# ---- processes -------------------------------------------------------------------------------


def stop_group(proc: subprocess.Popen[bytes] | None, sig: int = signal.SIGTERM,
               timeout: float = 60.0, whole_group: bool = True) -> int | None:
    """Sends ``sig`` (to the leader, or to its whole process group), waits up to
    ``timeout``, then SIGKILLs the group: nothing it started survives."""
    if proc is None:
        return None
    if proc.poll() is None:
        try:
            if whole_group:
                os.killpg(proc.pid, sig)
            else:
                proc.send_signal(sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            print(f"process {proc.pid} did not stop within {timeout:.0f} s: killing its group",
                  file=sys.stderr)
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # stragglers of the group (workers), if any
    except (ProcessLookupError, PermissionError):
        pass
    return proc.wait()


class Gateway:
    """``comet serve`` in a process group of its own."""

    def __init__(self, data_dir: Path, workers: int, env: dict[str, str], log_path: Path) -> None:
        self.data_dir = data_dir
        self.workers = workers
        self.port = free_port()
        self.log_path = log_path
        self.proc = subprocess.Popen(
            [str(COMET), "serve", "--data-dir", str(data_dir), "--host", "127.0.0.1",
             "--port", str(self.port), "--workers", str(workers)],
            stdout=open(log_path, "wb"), stderr=subprocess.STDOUT, env=env,
            start_new_session=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str, timeout: float = 2.0) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request("GET", path, headers={"connection": "close"})
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Until every worker answered /readyz (connections land on any worker)."""
        deadline = time.monotonic() + timeout
        slots: set[int] = set()
        while len(slots) < self.workers:
            if self.proc.poll() is not None:
                raise RuntimeError(f"comet serve exited ({self.proc.returncode}):\n{self.tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"workers not ready after {timeout:.0f} s:\n{self.tail()}")
            try:
                status, body = self.get("/readyz")
                if status == 200:
                    slots.add(int(orjson.loads(body)["slot"]))
                else:
                    time.sleep(0.05)
            except (OSError, ValueError, KeyError):
                time.sleep(0.05)

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> int | None:
        # TERM to the master only: it drains its workers gracefully (a TERM to
        # every worker at once would work too, but this is how operators stop it).
        return stop_group(self.proc, signal.SIGTERM, timeout=60.0, whole_group=False)


def scan_log(path: Path) -> dict[str, Any]:
    """Tracebacks and error lines in a process's output."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return {"tracebacks": 0, "error_lines": 0, "examples": []}
    lines = text.splitlines()
    bad = [ln for ln in lines if "Traceback" in ln or '"level": "ERROR"' in ln or "[ERROR]" in ln
           or "CRITICAL" in ln]
    return {"tracebacks": text.count("Traceback"), "error_lines": len(bad), "examples": bad[:5]}


# ---- what locust recorded --------------------------------------------------------------------


@dataclass
class Records:
    """Every answer the locust processes recorded."""

    acks: dict[tuple[str, int], list[tuple[int, int, str, str | None]]] = field(default_factory=dict)
    """(stream, shard) -> [(first, last, request id, key)] of every 202."""
    acked_rids: set[str] = field(default_factory=set)
    failed: dict[str, int] = field(default_factory=dict)
    """request id -> status of every other answer (0: no answer came)."""
    acked_requests: int = 0
    acked_events: int = 0
    failed_requests: int = 0
    bad_lines: int = 0
    files: int = 0

    def streams(self) -> set[str]:
        return {stream for stream, _ in self.acks}


def load_records(directory: Path) -> Records:
    rec = Records()
    for path in sorted(Path(directory).glob("acks-*.ndjson")):
        rec.files += 1
        with open(path, "rb") as f:
            for line in f:
                try:
                    r = orjson.loads(line)
                    rid = str(r["r"])
                    if "st" in r:
                        rec.failed[rid] = int(r["st"])
                        rec.failed_requests += 1
                        continue
                    first, last, count = int(r["f"]), int(r["l"]), int(r["n"])
                    key = (str(r["s"]), int(r["sh"]))
                except (ValueError, KeyError, TypeError):
                    rec.bad_lines += 1  # a line cut short by a killed process
                    continue
                rec.acks.setdefault(key, []).append((first, last, rid, r.get("k")))
                rec.acked_rids.add(rid)
                rec.acked_requests += 1
                rec.acked_events += count
    return rec


# ---- the check -------------------------------------------------------------------------------


@dataclass
class CheckReport:
    acked_requests: int = 0
    acked_events: int = 0
    stored_events: int = 0
    """Entries found: in the log, plus (soak) those retention deleted after they were shipped."""
    in_log: int = 0
    """Entries the log still holds (between each shard's first and next entry)."""
    deleted_by_retention: int = 0
    """Entries below each shard's first entry: retention deleted them."""
    shipped_only: int = 0
    """Of those, found in the sink: shipped, then deleted by retention."""
    shipped_events: int = 0
    """Lines in the sink's objects."""
    matched: int = 0
    """Acknowledged events found exactly where their 202 said."""
    lost: int = 0
    """Acknowledged events not found where their 202 said (missing, or another entry there)."""
    misplaced: int = 0
    """Of ``lost``: another entry in an acknowledged position."""
    missing_positions: int = 0
    """Entry numbers below a shard's end found neither in the log nor in the sink."""
    duplicates: int = 0
    """Entries of an acknowledged request stored outside its 202's range."""
    stored_after_error: int = 0
    """Entries of a request the gateway answered with an error status."""
    unanswered_stored: int = 0
    """Entries of a request whose answer the client never got (outcome unknown to it)."""
    foreign: int = 0
    """Entries that are no event of this run."""
    overlapping_acks: int = 0
    """Two 202s claiming the same entries."""
    wrong_shard_keys: int = 0
    """Keyed requests stored outside hash(key) % shards."""
    overlapping_objects: int = 0
    bad_objects: int = 0
    retention_deleted_segments: int = 0
    retention_lost_entries: int = 0
    """Unshipped entries retention deleted anyway (force_delete_after): counted by the storage."""
    bad_record_lines: int = 0
    examples: list[str] = field(default_factory=list)

    def note(self, text: str) -> None:
        if len(self.examples) < 20:
            self.examples.append(text)

    @property
    def deleted_unshipped(self) -> int:
        return max(0, self.deleted_by_retention - self.shipped_only)

    @property
    def problems(self) -> list[str]:
        out = []
        for name, what in (("lost", "acknowledged events lost"),
                           ("duplicates", "events stored twice"),
                           ("stored_after_error", "events stored although the gateway answered an error"),
                           ("unanswered_stored", "events stored whose request got no answer "
                                                 "(not a loss, but stored != acknowledged)"),
                           ("foreign", "entries that no request of this run sent"),
                           ("overlapping_acks", "202s claiming the same entries"),
                           ("wrong_shard_keys", "keyed requests outside their key's shard"),
                           ("overlapping_objects", "shipped objects overlapping"),
                           ("bad_objects", "shipped objects whose line count does not match their key"),
                           ("retention_lost_entries", "entries retention deleted before shipping"),
                           ("deleted_unshipped", "entries retention deleted that no shipped object holds"),
                           ("bad_record_lines", "unreadable lines in locust's records")):
            value = getattr(self, name)
            if value:
                out.append(f"{value} {what}")
        if not out and self.stored_events != self.acked_events:
            out.append(f"{self.stored_events} events stored != {self.acked_events} acknowledged")
        if self.acked_requests == 0:
            out.append("no request was acknowledged")
        return out

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok, "problems": self.problems}


def sink_objects(sink: Path | None, stream: str) -> dict[int, list[tuple[int, int, Path]]]:
    """shard -> [(first, last, path)] of the ship sink's objects of ``stream``, sorted."""
    out: dict[int, list[tuple[int, int, Path]]] = {}
    if sink is None or not (sink / stream).is_dir():
        return out
    for path in (sink / stream).rglob("*.ndjson.zst"):
        shard = int(path.parent.name.split("=", 1)[1])
        first, last = (int(x) for x in path.name[: -len(".ndjson.zst")].split("-"))
        out.setdefault(shard, []).append((first, last, path))
    for objects in out.values():
        objects.sort()
    return out


def object_lines(path: Path) -> list[bytes]:
    data = zstandard.ZstdDecompressor().decompress(path.read_bytes())
    lines = data.split(b"\n")
    if lines and not lines[-1]:
        lines.pop()
    return lines


def log_entries(log: Log, stream: str, shard: int, start: int, stop: int) -> Iterator[tuple[int, bytes]]:
    """Stored entries of [start, stop) (retention may have deleted a prefix)."""
    pos = start
    while pos < stop:
        batch = log.read(stream, shard, pos, min(4096, stop - pos))
        if not len(batch):
            if batch.next_entry > pos:  # skipped (deleted or damaged) up to there
                pos = batch.next_entry
                continue
            return
        for entry, payload in zip(batch.entries, batch.payloads):
            if entry >= stop:
                return
            yield entry, payload
        pos = batch.next_entry


def shard_entries(log: Log, stream: str, shard: int, start: int, end: int,
                  objects: list[tuple[int, int, Path]], report: CheckReport) -> Iterator[tuple[int, bytes]]:
    """Entries 0..end-1 of a shard in order: from the sink where an object holds
    them, from the log otherwise; counts positions found in neither."""
    pos, k = 0, 0
    while True:
        nxt = objects[k] if k < len(objects) else None
        if nxt is not None and nxt[0] <= pos:
            first, last, path = nxt
            k += 1
            if first < pos:
                report.overlapping_objects += 1
                report.note(f"object {path.name} (shard {shard}) overlaps the one before")
            lines = object_lines(path)
            report.shipped_events += len(lines)
            if len(lines) != last - first + 1:
                report.bad_objects += 1
                report.note(f"object {path.name} (shard {shard}) holds {len(lines)} lines")
            for j, line in enumerate(lines):
                if first + j >= pos:
                    if first + j < start:
                        report.shipped_only += 1
                    yield first + j, line
            pos = max(pos, last + 1)
            continue
        stop = end if nxt is None else nxt[0]
        expect = pos
        for entry, payload in log_entries(log, stream, shard, pos, stop):
            if entry > expect:
                report.missing_positions += entry - expect
            yield entry, payload
            expect = entry + 1
        if stop > expect:
            report.missing_positions += stop - expect
        pos = max(pos, stop)
        if nxt is None:
            return


def check(data_dir: Path, records: Records, sink: Path | None = None) -> CheckReport:
    """Matches the log (and the sink, when given) against locust's records."""
    rep = CheckReport(acked_requests=records.acked_requests, acked_events=records.acked_events,
                      bad_record_lines=records.bad_lines)
    with Log(data_dir, READ_CONFIG) as log:
        streams = sorted(set(log.streams()) | records.streams())
        for stream in streams:
            try:
                shards = log.shard_count(stream)
            except StreamNotFound:
                shards = 0
            objects = sink_objects(sink, stream)
            for shard in sorted(set(range(shards)) | {s for (st, s) in records.acks if st == stream}):
                check_shard(log, stream, shard, shard < shards, records,
                            objects.get(shard, []), rep)
            if shards:
                stats = log.stats(stream)
                rep.retention_deleted_segments += stats.total("retention_deleted_segments")
                rep.retention_lost_entries += stats.total("retention_lost_entries")
        for (stream, shard), acks in records.acks.items():
            for _, _, rid, key in acks:
                if key is None:
                    continue
                try:
                    want = log.shard_for_key(stream, key)
                except CometError:
                    continue
                if want != shard:
                    rep.wrong_shard_keys += 1
                    rep.note(f"request {rid} with key {key!r} went to shard {shard}, not {want}")
    rep.lost = rep.acked_events - rep.matched
    return rep


def check_shard(log: Log, stream: str, shard: int, exists: bool, records: Records,
                objects: list[tuple[int, int, Path]], rep: CheckReport) -> None:
    ranges = sorted(records.acks.get((stream, shard), []))
    for (f1, l1, r1, _), (f2, _, r2, _) in zip(ranges, ranges[1:]):
        if f2 <= l1:
            rep.overlapping_acks += 1
            rep.note(f"{stream}/{shard}: 202s of {r1} [{f1}, {l1}] and {r2} [from {f2}] overlap")
    if not exists:
        rep.note(f"{stream}/{shard}: acknowledged, but the shard does not exist")
        return
    stats = log.shard_stats(stream, shard)
    rep.in_log += stats.next_entry - stats.first_entry
    rep.deleted_by_retention += stats.first_entry
    j = 0
    for entry, payload in shard_entries(log, stream, shard, stats.first_entry, stats.next_entry,
                                        objects, rep):
        rep.stored_events += 1
        while j < len(ranges) and ranges[j][1] < entry:
            j += 1
        try:
            event = orjson.loads(payload)
            rid, index = str(event["r"]), int(event["i"])
        except (ValueError, KeyError, TypeError):
            rid, index = "", -1
        if j < len(ranges) and ranges[j][0] <= entry:
            first, last, want, _ = ranges[j]
            if rid == want and index == entry - first:
                rep.matched += 1
                continue
            rep.misplaced += 1
            rep.note(f"{stream}/{shard}-{entry}: acknowledged for event {entry - first} of {want}, "
                     f"holds {rid or payload[:60]!r} {index}")
        if not rid:
            rep.foreign += 1
            rep.note(f"{stream}/{shard}-{entry}: not an event of this run: {payload[:80]!r}")
        elif rid in records.acked_rids:
            rep.duplicates += 1
            rep.note(f"{stream}/{shard}-{entry}: event {index} of {rid}, stored outside its 202's range")
        elif records.failed.get(rid, 0) > 0:
            rep.stored_after_error += 1
            rep.note(f"{stream}/{shard}-{entry}: event {index} of {rid}, answered with "
                     f"{records.failed[rid]}")
        elif rid in records.failed:
            rep.unanswered_stored += 1
        elif not (j < len(ranges) and ranges[j][0] <= entry):
            rep.unanswered_stored += 1  # no record at all: the client died mid-request


# ---- soak sampling ---------------------------------------------------------------------------


def log_bytes(data_dir: Path) -> tuple[int, int]:
    """(bytes of segment and index files - what the retention budget counts -,
    disk usage of the whole data directory as du counts it)."""
    counted = used = 0
    for root, _, files in os.walk(data_dir):
        for name in files:
            try:
                st = os.stat(os.path.join(root, name))
            except OSError:
                continue  # deleted meanwhile
            used += st.st_blocks * 512
            if name.endswith((".log", ".idx")) and os.path.basename(root).startswith("shard-"):
                counted += st.st_size
    return counted, used


def group_lag(data_dir: Path, stream: str, group: str) -> tuple[int | None, int]:
    """(lag of ``group`` summed over shards, or None before it exists; entries appended)."""
    try:
        with Log(data_dir, READ_CONFIG) as log:
            stats = log.stats(stream)
    except (StreamNotFound, CometError):
        return None, 0
    infos = [g for g in stats.groups if g.name == group]
    appended = sum(s.next_entry for s in stats.shards)
    return (sum(g.lag for g in infos) if infos else None), appended


@dataclass
class Sample:
    t: float
    log_bytes: int
    du_bytes: int
    lag: int | None
    appended: int
    phase: str


class Sampler(threading.Thread):
    def __init__(self, data_dir: Path, stream: str, group: str, interval: float) -> None:
        super().__init__(name="soak-sampler", daemon=True)
        self.data_dir, self.stream, self.group, self.interval = data_dir, stream, group, interval
        self.samples: list[Sample] = []
        self.phase = "load"
        self.t0 = time.monotonic()
        self.halt = threading.Event()

    def sample(self) -> Sample:
        counted, used = log_bytes(self.data_dir)
        lag, appended = group_lag(self.data_dir, self.stream, self.group)
        s = Sample(round(time.monotonic() - self.t0, 2), counted, used, lag, appended, self.phase)
        self.samples.append(s)
        return s

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                self.sample()
            except Exception as exc:  # keep sampling; say what went wrong
                print(f"sampler: {exc!r}", file=sys.stderr)
            self.halt.wait(self.interval)


# ---- locust's figures ------------------------------------------------------------------------


def read_locust_csv(prefix: Path) -> dict[str, Any]:
    """Rows of <prefix>_final_stats.csv (written by the locustfile as locust
    quits), else of locust's <prefix>_stats.csv, by name ("Aggregated" is the total)."""
    path = Path(f"{prefix}_final_stats.csv")
    if not path.exists():
        path = Path(f"{prefix}_stats.csv")
    if not path.exists():
        return {}
    out = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            def num(key: str) -> float | None:
                value = row.get(key, "")
                try:
                    return float(value)
                except (TypeError, ValueError):
                    return None
            out[row["Name"]] = {
                "type": row.get("Type", ""), "requests": int(num("Request Count") or 0),
                "failures": int(num("Failure Count") or 0), "req_per_s": num("Requests/s"),
                "p50_ms": num("50%"), "p95_ms": num("95%"), "p99_ms": num("99%"),
                "avg_ms": num("Average Response Time"), "max_ms": num("Max Response Time"),
            }
    return out


def table(rows: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k.ljust(width)}  {v}" for k, v in rows)


# ---- the run ---------------------------------------------------------------------------------


class Interrupted(Exception):
    pass


def on_signal(signum: int, frame: Any) -> None:
    raise Interrupted(f"signal {signum}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("user_classes", nargs="*", help="locust user classes (default: all of them)")
    p.add_argument("--soak", action="store_true", help="retention on, comet ship running, sampled")
    p.add_argument("--run-time", type=float, help="seconds of load (default 60; soak 300)")
    p.add_argument("--users", type=int, help="locust users (default 16)")
    p.add_argument("--spawn-rate", type=float, help="users started per second (default: all at once)")
    p.add_argument("--user-rps", type=float,
                   help="requests per second per user (default: unpaced; soak 25)")
    p.add_argument("--workers", type=int, default=2, help="gateway workers (default 2)")
    p.add_argument("--stream", default="loadtest")
    p.add_argument("--max-fail-ratio", type=float, default=0.0,
                   help="locust threshold (default 0: any failure fails the run)")
    p.add_argument("--max-p95-ms", type=float, default=1000.0, help="locust threshold (default 1000)")
    p.add_argument("--stop-timeout", type=float, default=30.0,
                   help="seconds locust waits for requests in flight at the end (default 30)")
    p.add_argument("--storage", action="append", default=[], metavar="KEY=VALUE",
                   help="storage setting for the gateway (COMET_STORAGE_<KEY>), repeatable")
    p.add_argument("--access-log", action="store_true", help="keep the gateway's access log on")
    p.add_argument("--name", help="result file names (default loadtest, or soak)")
    p.add_argument("--results-dir", type=Path, default=RESULTS)
    p.add_argument("--scratch", type=Path, help="work directory (default loadtests/.scratch/<name>)")
    p.add_argument("--keep-data", action="store_true", help="keep the data directory (and sink)")
    p.add_argument("--locust", type=Path, help="locust executable (default: .venv-locust, created if missing)")
    p.add_argument("--locust-processes", type=int, default=1,
                   help="locust processes (locust --processes; default 1: one CPU generates the load)")
    soak = p.add_argument_group("soak")
    soak.add_argument("--shards", type=int, default=4, help="shards per stream (soak; default 4)")
    soak.add_argument("--segment-mib", type=float, default=2.0, help="segment size (soak; default 2)")
    soak.add_argument("--retention-mib", type=float, default=48.0,
                      help="retention_max_total_bytes (soak; default 48)")
    soak.add_argument("--sample-interval", type=float, default=2.0, help="seconds (default 2)")
    soak.add_argument("--max-lag", type=int, default=500_000,
                      help="ship group lag bound in entries (default 500000)")
    soak.add_argument("--drain-timeout", type=float, default=60.0,
                      help="seconds for the lag to reach 0 after the load (default 60)")
    soak.add_argument("--ship-max-object-age", type=float, default=2.0, help="seconds (default 2)")
    soak.add_argument("--ship-max-object-mib", type=float, default=4.0, help="default 4")
    args = p.parse_args(argv)
    args.name = args.name or ("soak" if args.soak else "loadtest")
    args.run_time = args.run_time or (300.0 if args.soak else 60.0)
    args.users = args.users or 16
    args.spawn_rate = args.spawn_rate or float(args.users)
    if args.user_rps is None:
        args.user_rps = 25.0 if args.soak else 0.0
    args.scratch = args.scratch or SCRATCH / args.name
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        if sig == signal.SIGHUP and signal.getsignal(sig) == signal.SIG_IGN:
            continue  # nohup
        signal.signal(sig, on_signal)
    try:
        return run(args)
    except (Interrupted, KeyboardInterrupt) as exc:
        print(f"\ninterrupted ({exc or 'Ctrl-C'}): everything started was stopped", file=sys.stderr)
        return 130
    except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
        print(f"\nload test failed: {exc}", file=sys.stderr)
        return 1


def run(args: argparse.Namespace) -> int:
    locust = args.locust or ensure_locust_venv()
    scratch: Path = args.scratch
    if scratch.exists():
        shutil.rmtree(scratch)
    data_dir, records_dir, sink = scratch / "data", scratch / "records", scratch / "sink"
    records_dir.mkdir(parents=True)
    args.results_dir.mkdir(parents=True, exist_ok=True)
    csv_prefix = args.results_dir / args.name
    for old in args.results_dir.glob(f"{args.name}_*.csv"):
        old.unlink()

    env = dict(os.environ)
    if not args.access_log:
        env["COMET_ACCESS_LOG"] = "0"
    storage: dict[str, str] = {}
    segment_bytes = int(args.segment_mib * MiB)
    budget = int(args.retention_mib * MiB)
    if args.soak:
        storage.update(shards=str(args.shards), segment_bytes=str(segment_bytes),
                       retention_max_total_bytes=str(budget), retention_interval_ms="1000",
                       retention_protect_unconsumed="true")
    for item in args.storage:
        key, eq, value = item.partition("=")
        if not eq:
            raise SystemExit(f"--storage {item!r}: use KEY=VALUE")
        storage[key.strip().lower()] = value.strip()
    for key, value in storage.items():
        env[f"COMET_STORAGE_{key.upper()}"] = value

    gateway: Gateway | None = None
    locust_proc: subprocess.Popen[bytes] | None = None
    ship: subprocess.Popen[bytes] | None = None
    sampler: Sampler | None = None
    result: dict[str, Any] = {}
    ok = False
    try:
        gateway = Gateway(data_dir, args.workers, env, scratch / "serve.log")
        gateway.wait_ready()
        if args.soak:
            ship = subprocess.Popen(
                [str(COMET), "ship", str(data_dir), args.stream, str(sink), "--group", "ship",
                 "--max-object-age", str(args.ship_max_object_age),
                 "--max-object-bytes", str(int(args.ship_max_object_mib * MiB))],
                stdout=open(scratch / "ship.log", "wb"), stderr=subprocess.STDOUT, env=env,
                start_new_session=True)
            sampler = Sampler(data_dir, args.stream, "ship", args.sample_interval)
            sampler.start()

        lenv = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        lenv["COMET_LT_RECORD_DIR"] = str(records_dir)
        cmd = [str(locust), "-f", str(LOCUSTFILE), "--headless", "-H", gateway.url,
               "-u", str(args.users), "-r", str(args.spawn_rate), "-t", f"{int(args.run_time)}s",
               "--stop-timeout", str(int(args.stop_timeout)), "--only-summary",
               "--csv", str(csv_prefix), "--max-fail-ratio", str(args.max_fail_ratio),
               "--max-p95-ms", str(args.max_p95_ms), "--stream", args.stream,
               "--user-rps", str(args.user_rps)]
        if args.locust_processes > 1:
            cmd += ["--processes", str(args.locust_processes)]
        cmd += args.user_classes
        print(f"gateway: {gateway.url}, {args.workers} workers, data {data_dir}"
              + (f", storage {storage}" if storage else ""), flush=True)
        print("locust: " + " ".join(cmd[1:]), flush=True)
        started = time.time()
        t0 = time.monotonic()
        locust_proc = subprocess.Popen(cmd, env=lenv, start_new_session=True)
        try:
            locust_code = locust_proc.wait(timeout=args.run_time + args.stop_timeout + 120)
        except subprocess.TimeoutExpired:
            print("locust did not finish in time: stopping it", file=sys.stderr)
            locust_code = stop_group(locust_proc, signal.SIGTERM, timeout=30)
        locust_wall = time.monotonic() - t0

        soak: dict[str, Any] = {}
        if args.soak:
            assert sampler is not None and ship is not None
            sampler.phase = "drain"
            soak = drain(args, sampler, ship)
            sampler.halt.set()
            sampler.join()
            stop_group(ship, signal.SIGTERM, timeout=60)
            ship_code = ship.returncode
            soak["ship_exit_code"] = ship_code
        gateway_code = gateway.stop()

        records = load_records(records_dir)
        t_check = time.monotonic()
        report = check(data_dir, records, sink if args.soak else None)
        check_s = time.monotonic() - t_check
        if args.soak:
            assert sampler is not None
            sampler.phase = "stopped"
            sampler.sample()
            soak.update(judge_soak(args, sampler, segment_bytes, budget, report))
            if soak.get("drain_problem"):
                soak["problems"].append(soak["drain_problem"])
            if soak.get("ship_exit_code") not in (0, None):
                soak["problems"].append(f"comet ship exited {soak['ship_exit_code']}")
            write_samples(args.results_dir / f"{args.name}_samples.csv", sampler.samples)

        stats = read_locust_csv(csv_prefix)
        total = stats.get("Aggregated", {})
        verdict_path = records_dir / "verdict.json"
        verdict = json.loads(verdict_path.read_text()) if verdict_path.exists() else {}
        problems = []
        if locust_code != 0:
            problems.append(f"locust exited {locust_code}: " + "; ".join(verdict.get("problems", []))
                            if verdict.get("problems") else f"locust exited {locust_code}")
        problems += report.problems
        problems += soak.get("problems", [])
        if gateway_code not in (0, None):
            problems.append(f"comet serve exited {gateway_code}")
        ok = not problems
        duration = float(args.run_time)
        result = {
            "name": args.name,
            "kind": "soak" if args.soak else "loadtest",
            "ok": ok,
            "problems": problems,
            "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "machine": machine_info(scratch),
            "workers": args.workers,
            "users": args.users,
            "locust_processes": args.locust_processes,
            "spawn_rate": args.spawn_rate,
            "user_rps": args.user_rps or None,
            "user_classes": args.user_classes or "all",
            "duration_s": duration,
            "locust_wall_s": round(locust_wall, 1),
            "check_s": round(check_s, 1),
            "storage": storage,
            "access_log": args.access_log,
            "requests": total.get("requests"),
            "failures": total.get("failures"),
            "fail_ratio": (total["failures"] / total["requests"]) if total.get("requests") else None,
            "req_per_s": total.get("req_per_s"),
            "events_per_s": round(records.acked_events / duration, 1),
            "p50_ms": total.get("p50_ms"),
            "p95_ms": total.get("p95_ms"),
            "p99_ms": total.get("p99_ms"),
            "max_ms": total.get("max_ms"),
            "events_acked": report.acked_events,
            "events_stored": report.stored_events,
            "thresholds": {"max_fail_ratio": args.max_fail_ratio, "max_p95_ms": args.max_p95_ms},
            "locust": {"exit_code": locust_code, "verdict": verdict, "by_name": stats},
            "check": report.to_json(),
            "gateway": {"exit_code": gateway_code, "log": scan_log(scratch / "serve.log")},
            "files": {"csv": [str(p) for p in sorted(args.results_dir.glob(f"{args.name}_*.csv"))],
                      "scratch": str(scratch)},
        }
        if args.soak:
            result["soak"] = soak
            result["soak"]["ship_log"] = scan_log(scratch / "ship.log")
        out = args.results_dir / f"{args.name}.json"
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(json.dumps(result, indent=2, default=str) + "\n")
        tmp.replace(out)
        print()
        print(summary(result))
        print(f"\nresults: {out} and {csv_prefix}_*.csv")
        return 0 if ok else 1
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):  # the cleanup below must not be cut short
            signal.signal(sig, signal.SIG_IGN)
        if sampler is not None:
            sampler.halt.set()
        stop_group(locust_proc, signal.SIGTERM, timeout=args.stop_timeout + 30)
        stop_group(ship, signal.SIGTERM, timeout=60)
        if gateway is not None:
            gateway.stop()
        if ok and not args.keep_data:
            shutil.rmtree(data_dir, ignore_errors=True)
            shutil.rmtree(sink, ignore_errors=True)
        elif scratch.exists():
            print(f"data kept in {scratch}", file=sys.stderr)


def drain(args: argparse.Namespace, sampler: Sampler, ship: subprocess.Popen[bytes]) -> dict[str, Any]:
    """Waits, after the load, until the ship group's lag is 0 (or the timeout)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < args.drain_timeout:
        if ship.poll() is not None:
            return {"drained_s": None, "drain_problem": f"comet ship exited ({ship.returncode})"}
        lag, _ = group_lag(sampler.data_dir, sampler.stream, sampler.group)
        if lag == 0:
            return {"drained_s": round(time.monotonic() - t0, 1)}
        time.sleep(0.5)
    lag, _ = group_lag(sampler.data_dir, sampler.stream, sampler.group)
    return {"drained_s": None,
            "drain_problem": f"lag still {lag} entries {args.drain_timeout:.0f} s after the load"}


def judge_soak(args: argparse.Namespace, sampler: Sampler, segment_bytes: int, budget: int,
               report: CheckReport) -> dict[str, Any]:
    samples = sampler.samples
    # One new segment (and its preallocated index) past the budget: what a
    # rotation racing another process's rotation may add before either deletes.
    slack = segment_bytes + segment_bytes // 4096 * 16 + 4096
    max_log = max((s.log_bytes for s in samples), default=0)
    max_du = max((s.du_bytes for s in samples), default=0)
    load = [s for s in samples if s.phase == "load"]
    lags = [s.lag for s in load if s.lag is not None]
    max_lag = max(lags, default=0)
    rate = ((load[-1].appended - load[0].appended) / (load[-1].t - load[0].t)
            if len(load) > 1 and load[-1].t > load[0].t else 0.0)
    problems = []
    if max_log > budget + slack:
        problems.append(f"log size reached {max_log} bytes, above the budget {budget} + one "
                        f"segment of slack {slack}")
    if max_lag > args.max_lag:
        problems.append(f"ship lag reached {max_lag} entries, above --max-lag {args.max_lag}")
    if not lags:
        problems.append("no lag sample: the ship group never appeared")
    return {
        "budget_bytes": budget,
        "slack_bytes": slack,
        "segment_bytes": segment_bytes,
        "max_log_bytes": max_log,
        "max_du_bytes": max_du,
        "final_log_bytes": samples[-1].log_bytes if samples else None,
        "max_lag": max_lag,
        "median_lag": sorted(lags)[len(lags) // 2] if lags else None,
        "max_lag_bound": args.max_lag,
        "ingest_entries_per_s": round(rate, 1),
        "max_lag_s": round(max_lag / rate, 2) if rate else None,
        "samples": len(samples),
        "retention_deleted_segments": report.retention_deleted_segments,
        "retention_lost_entries": report.retention_lost_entries,
        "shipped_events": report.shipped_events,
        "in_log_events": report.in_log,
        "deleted_by_retention_events": report.deleted_by_retention,
        "shipped_and_deleted_events": report.shipped_only,
        "problems": problems,
        "notes": ([] if report.retention_deleted_segments else
                  ["retention deleted nothing: the run was too short or too slow to reach the "
                   "budget, so the bound was not exercised"]),
    }


def write_samples(path: Path, samples: list[Sample]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["t_s", "phase", "log_bytes", "du_bytes", "lag", "appended"])
        for s in samples:
            w.writerow([s.t, s.phase, s.log_bytes, s.du_bytes, "" if s.lag is None else s.lag,
                        s.appended])


def summary(r: dict[str, Any]) -> str:
    c = r["check"]

    def ms(v: Any) -> str:
        return "-" if v is None else f"{v:.0f} ms"

    rows = [
        ("run", f"{r['kind']} {r['name']}, {r['date_utc']}, {r['machine'].get('nproc')} CPUs"),
        ("gateway", f"{r['workers']} workers" + (f", storage {r['storage']}" if r["storage"] else "")),
        ("locust", f"{r['users']} users, {r['user_classes']}, {r['duration_s']:.0f} s, "
                   f"{r['locust_processes']} process(es)"
                   + (f", {r['user_rps']} req/s per user" if r["user_rps"] else "")),
        ("requests", f"{r['requests']} ({r['failures']} failed)"),
        ("req/s", f"{r['req_per_s']:.1f}" if r["req_per_s"] is not None else "-"),
        ("events/s (acked)", f"{r['events_per_s']:.0f}"),
        ("latency p50/p95/p99", f"{ms(r['p50_ms'])} / {ms(r['p95_ms'])} / {ms(r['p99_ms'])}"),
        ("events acked (202)", str(c["acked_events"])),
        ("events stored", str(c["stored_events"])
         + (f" ({c['in_log']} still in the log, {c['shipped_only']} shipped then deleted "
            f"by retention)" if r["kind"] == "soak" else "")),
        ("matched where the 202 said", str(c["matched"])),
        ("how", "every stored entry read back and matched to its 202 by request id and index"
                + (", from the sink's objects where shipped, else from the log" if r["kind"] == "soak"
                   else "")),
        ("lost / duplicate / foreign", f"{c['lost']} / {c['duplicates']} / {c['foreign']}"),
    ]
    if r["kind"] == "soak":
        s = r["soak"]
        rows += [
            ("log size max (budget)", f"{s['max_log_bytes'] / MiB:.1f} MiB "
                                      f"({s['budget_bytes'] / MiB:.1f} MiB + {s['slack_bytes'] / MiB:.1f} slack)"),
            ("data dir du max", f"{s['max_du_bytes'] / MiB:.1f} MiB"),
            ("ship lag max / median", f"{s['max_lag']} / {s['median_lag']} entries "
                                      f"(bound {s['max_lag_bound']}; max = {s['max_lag_s']} s of ingest)"),
            ("lag drained after load", "-" if s.get("drained_s") is None else f"{s['drained_s']} s"),
            ("retention", f"{s['retention_deleted_segments']} segments deleted, "
                          f"{s['retention_lost_entries']} entries lost"),
            ("shipped", f"{s['shipped_events']} events"),
        ]
    rows.append(("verdict", "OK" if r["ok"] else "FAILED: " + "; ".join(r["problems"])))
    return table(rows)


if __name__ == "__main__":
    sys.exit(main())
