"""Many-streams benchmark: N streams of 16 shards, 20 single events each, posted by several
wrk threads against `comet serve` (2 workers, ``max_streams = 0``); its anchor, in the same
run, posts as many events into ONE stream of a fresh gateway.

    .venv/bin/python -m loadtests.bench_streams [--quick] [--streams N] [--interleave]

Checks every answer is 202 (the others counted by status), ``GET /streams`` and ``GET
/metrics`` after the load (status, time), each worker's peak descriptors (/proc/PID/fd)
and peak RSS (VmHWM, and the largest VmRSS sampled) against the targets, and reports the
data directory's disk use (allocated, as du counts) per shard written and the files of
one such idle shard.
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run by its path: again as a module
    from by_path import rerun_as_module  # type: ignore[import-not-found]

    rerun_as_module(__file__)

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtests import benchlib
from tests.support.server import HOST, GatewayProcess

LOADTESTS = Path(__file__).resolve().parent
SCRATCH = LOADTESTS / ".scratch" / "streams"
MEASURED_CODE = ["gateway", "storage_c", "pyproject.toml"]
WORKERS, SHARDS, EACH = 2, 16, 20
WRK_THREADS, WRK_CONNECTIONS = 4, 64       # four clients of 16 connections each
FD_TARGET, RSS_TARGET_MIB = 1024, 200
SAMPLE_S = 0.25
MIN_FREE_BYTES = 2 << 30                    # the load stops when the disk has less left
READ_TIMEOUT_S = 120.0                      # GET /streams and /metrics after the load
ENV = {"COMET_ACCESS_LOG": "1", "COMET_MAX_STREAMS": "0", "COMET_STORAGE_SHARDS": str(SHARDS)}


@dataclass
class WorkerPeak:
    """What one worker process held at its worst, from /proc samples."""
    pid: int
    fds: int = 0
    maps: int = 0
    rss_kib: int = 0          # the largest VmRSS sampled
    hwm_kib: int = 0          # VmHWM at the last sample: the kernel's own peak
    samples: int = 0


@dataclass
class Sampler:
    """A thread reading /proc of the server's workers every SAMPLE_S until stopped; it
    interrupts ``wrk`` (once set) if the data directory's disk gets below MIN_FREE_BYTES
    free (today a shard of a few events takes ~200 KiB: 10,000 streams, ~31 GiB)."""
    server: GatewayProcess
    peaks: dict[int, WorkerPeak] = field(default_factory=dict)
    done: threading.Event = field(default_factory=threading.Event)
    wrk: subprocess.Popen[str] | None = None
    wrk_since: float = 0.0
    disk_low: bool = False

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        pids, refreshed = self.server.worker_pids(), time.monotonic()
        while True:
            for pid in pids:
                self.sample(pid)
            disk = os.statvfs(self.server.data_dir)
            # wrk takes SIGINT as "stop and report" once it has started its threads
            if (self.wrk and not self.disk_low and time.monotonic() - self.wrk_since > 1
                    and disk.f_bavail * disk.f_frsize < MIN_FREE_BYTES):
                self.disk_low = True
                self.wrk.send_signal(signal.SIGINT)
            if self.done.wait(SAMPLE_S):
                return
            if time.monotonic() - refreshed > 2:   # a worker may have been replaced
                pids, refreshed = self.server.worker_pids(), time.monotonic()

    def sample(self, pid: int) -> None:
        try:
            fds = len(os.listdir(f"/proc/{pid}/fd"))
            with open(f"/proc/{pid}/maps", "rb") as f:
                maps = sum(1 for _ in f)
            status = dict(line.split(":", 1) for line in
                          Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
        except OSError:
            return   # exited meanwhile
        peak = self.peaks.setdefault(pid, WorkerPeak(pid))
        peak.fds, peak.maps = max(peak.fds, fds), max(peak.maps, maps)
        peak.rss_kib = max(peak.rss_kib, int(status["VmRSS"].split()[0]))
        peak.hwm_kib = max(peak.hwm_kib, int(status["VmHWM"].split()[0]))
        peak.samples += 1

    def stop(self) -> list[WorkerPeak]:
        for pid in self.server.worker_pids():   # the final VmHWM, before the stop
            self.sample(pid)
        self.done.set()
        self.thread.join()
        return sorted(self.peaks.values(), key=lambda p: p.pid)


def run_wrk(wrk: str, port: int, streams: int, one: str | None, interleave: bool,
            max_s: int, sampler: Sampler) -> dict[str, Any]:
    threads = min(WRK_THREADS, streams)
    argv = [wrk, f"-t{threads}", f"-c{max(WRK_CONNECTIONS, threads)}", f"-d{max_s}s",
            "-s", str(LOADTESTS / "wrk" / "streams.lua"), f"http://{HOST}:{port}/",
            "--", f"streams={streams}", f"each={EACH}", f"threads={threads}", "events=1",
            f"order={'round' if interleave else 'burst'}", *([f"one={one}"] if one else [])]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        sampler.wrk, sampler.wrk_since = proc, time.monotonic()
        lines, finished = [], 0
        for line in proc.stdout:    # ends with wrk, at -d at the latest
            lines.append(line)
            finished += line.startswith("WRKDONE")
            if finished == threads:
                proc.send_signal(signal.SIGINT)   # wrk prints its summary and done() on SIGINT
                finished += 1
        err = proc.stderr.read()
    for line in lines:
        if line.startswith("WRKJSON "):
            return {**json.loads(line[8:]), "argv": argv[1:], "exit_code": proc.returncode}
    raise RuntimeError(f"wrk printed no WRKJSON line (exit {proc.returncode}):\n"
                       f"{''.join(lines)[-2000:]}\n{err[-2000:]}")


def timed_get(server: GatewayProcess, path: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    try:
        status, body, _ = server.request("GET", path, timeout=READ_TIMEOUT_S)
    except OSError as exc:
        return {"status": None, "seconds": round(time.perf_counter() - t0, 3), "error": repr(exc)}
    out: dict[str, Any] = {"status": status, "seconds": round(time.perf_counter() - t0, 3),
                           "bytes": len(body)}
    if status != 200:
        out["body"] = body[:500].decode(errors="replace")
    elif path == "/streams":
        out["streams_listed"] = len(json.loads(body).get("streams", []))
    return out


def allocated(path: Path) -> int:
    """Bytes allocated on disk for ``path`` (a file) or everything under it, as ``du`` counts."""
    total = path.lstat().st_blocks * 512
    for root, dirs, files in os.walk(path):
        total += sum(os.lstat(os.path.join(root, n)).st_blocks * 512 for n in dirs + files)
    return total


def disk_use(data_dir: Path, example_stream: str) -> dict[str, Any]:
    shards = [p for p in data_dir.glob("*/shard-*") if p.is_dir()]
    total = allocated(data_dir)
    example = [p for p in sorted((data_dir / example_stream).glob("shard-*")) if any(p.iterdir())]
    files = {} if not example else {
        f.name: {"bytes": f.stat().st_size, "allocated": f.stat().st_blocks * 512}
        for f in sorted(example[0].iterdir())}
    return {"allocated_bytes": total, "shards_written": len(shards),
            "per_shard_bytes": total / len(shards) if shards else None,
            "example_shard": str(example[0].relative_to(data_dir)) if example else None,
            "example_files": files}


def one_run(wrk: str, label: str, streams: int, one: str | None, interleave: bool,
            max_s: int) -> dict[str, Any]:
    """A fresh gateway, the load with /proc sampled, the reads after it, the disk, the stop."""
    probe = benchlib.CpuProbe.start()
    data = benchlib.fresh_dir(SCRATCH / "data" / label)
    server = GatewayProcess(data, WORKERS, env=ENV, log_path=SCRATCH / "logs" / f"{label}.log")
    rec: dict[str, Any] = {"label": label, "streams": streams, "one_stream": one,
                           "log": str(server.log_path.relative_to(LOADTESTS.parent))}
    try:
        rec["ready_s"] = round(server.wait_ready(30), 3)
        sampler = Sampler(server)
        try:
            rec["wrk"] = run_wrk(wrk, server.port, streams, one, interleave, max_s, sampler)
            rec["stopped_for_disk"] = sampler.disk_low
            rec["streams_get"] = timed_get(server, "/streams")
            rec["metrics_get"] = timed_get(server, "/metrics")
        finally:
            rec["workers"] = [vars(p) for p in sampler.stop()]
    finally:
        try:
            rec["stop"] = {"exit_code": server.stop(timeout=45), "killed": server.killed}
        except AssertionError as exc:   # 500s the log gives no cause for: reported, not fatal
            rec["stop"] = {"unlogged_500s": str(exc)[:500], "killed": server.killed}
    rec["cpu"] = probe.stop()
    rec["disk"] = disk_use(data, one or f"svc-{streams // 2:05d}")
    rec["log_findings"] = server.scan_log()
    w = rec["wrk"]
    window = float(w["window_s"]) or 1e-9
    rec.update(events_s=int(w["accepted_202"]) / window, expected=streams * EACH,
               socket_errors=sum(int(v) for v in w["errors"].values()))
    print(f"  {label:<10} {rec['events_s']:>9,.0f} ev/s  202s {w['accepted_202']:,} of "
          f"{rec['expected']:,}  others {w['non_202_by_status'] or 0}  errors "
          f"{rec['socket_errors']}  peak fds {[p['fds'] for p in rec['workers']]}  peak RSS MiB "
          f"{[p['hwm_kib'] // 1024 for p in rec['workers']]}  /streams "
          f"{rec['streams_get']['status']} in {rec['streams_get']['seconds']} s",
          file=sys.stderr, flush=True)
    shutil.rmtree(data, ignore_errors=True)
    return rec


def every_request_answered(rec: dict[str, Any]) -> bool:
    """Every request of the quota answered 202: socket errors then only hit
    connections with nothing in flight (wrk counts those too)."""
    w = rec["wrk"]
    return (int(w["accepted_202"]) == rec["expected"] and not int(w["non_202"])
            and not int(w["errors"]["timeout"]))


def statuses_text(rec: dict[str, Any]) -> str:
    w = rec["wrk"]
    others = ", ".join(f"{n:,}× {s}" for s, n in sorted(w["non_202_by_status"].items()))
    missing = rec["expected"] - int(w["accepted_202"]) - int(w["non_202"])
    return (f"{int(w['accepted_202']):,} × 202 of {rec['expected']:,} requests"
            + (f"; others: {others}" if others else "") + (
                f"; {rec['socket_errors']:,} socket errors/timeouts" if rec["socket_errors"] and
                not every_request_answered(rec) else "")
            + (f"; {rec['socket_errors']:,} read errors on idle keep-alive connections (a wrk "
               "thread done before the others: the server closes them after its keep-alive)"
               if rec["socket_errors"] and every_request_answered(rec) else "")
            + (f"; {missing:,} never sent or answered" if missing else "")
            + (f"; load STOPPED: under {MIN_FREE_BYTES >> 30} GiB of disk left"
               if rec.get("stopped_for_disk") else ""))


def get_text(got: dict[str, Any]) -> str:
    return (f"{got['status']} in {got['seconds']:.2f} s" + (
        f" ({got['streams_listed']:,} streams listed)" if "streams_listed" in got else "")
        + (f": {got.get('body') or got.get('error')}" if got["status"] != 200 else ""))


def build_rows(anchor: dict[str, Any], case: dict[str, Any]) -> list[dict[str, Any]]:
    n = case["streams"]
    title = f"{n:,} streams × {SHARDS} shards, {EACH} events each"
    a_row = benchlib.row(f"Anchor: {n * EACH:,} events into one stream", "one_stream",
                         anchor["events_s"], "events/s", role="anchor",
                         runs_text=statuses_text(anchor))
    ref = benchlib.anchor_ref("one_stream", a_row["case"], anchor["events_s"], "events/s")
    w = case["wrk"]
    all_202 = every_request_answered(case)
    rows = [a_row,
            benchlib.row(title, "streams_events", case["events_s"], "events/s", anchor=ref,
                         ratio=case["events_s"] / anchor["events_s"], runs_text=statuses_text(case)),
            benchlib.row(f"{title}: every answer 202", "streams_all_202", int(w["non_202"]),
                         "non-202", f"{case['expected'] - int(w['accepted_202']):,} not 202",
                         target_text="all 202", passed=all_202, runs_text=statuses_text(case))]
    for key, path in (("streams_get", "/streams"), ("metrics_get", "/metrics")):
        got = case[key]
        rows.append(benchlib.row(f"GET {path} after the load", f"streams_{key}", got["seconds"],
                                 "s", get_text(got), target_text="200",
                                 passed=got["status"] == 200, runs_text=get_text(got)))
    for i, p in enumerate(case["workers"]):
        where = f"worker {i + 1} (pid {p['pid']})"
        rows.append(benchlib.row(f"{where}: peak descriptors", f"streams_fds_{i}", p["fds"],
                                 "fds", f"{p['fds']:,}", target_text=f"≤ {FD_TARGET:,}",
                                 passed=p["fds"] <= FD_TARGET,
                                 runs_text=f"{p['maps']:,} mappings at most; {p['samples']} samples"))
        rows.append(benchlib.row(f"{where}: peak RSS (VmHWM)", f"streams_rss_{i}",
                                 p["hwm_kib"] / 1024, "MiB", f"{p['hwm_kib'] / 1024:,.0f} MiB",
                                 target_text=f"≤ {RSS_TARGET_MIB} MiB",
                                 passed=p["hwm_kib"] <= RSS_TARGET_MIB * 1024,
                                 runs_text=f"largest VmRSS sampled {p['rss_kib'] / 1024:,.0f} MiB"))
    d = case["disk"]
    files = ", ".join(f"{name} {f['bytes']:,} B ({f['allocated'] // 1024:,} KiB on disk)"
                      for name, f in d["example_files"].items())
    per = d["per_shard_bytes"]
    rows.append(benchlib.row(
        "Disk per idle shard (allocated ÷ shards written)", "streams_disk_per_shard",
        None if per is None else per / 1024, "KiB",
        "n/a" if per is None else f"{per / 1024:,.0f} KiB",
        runs_text=f"{d['allocated_bytes'] / benchlib.MiB:,.0f} MiB over {d['shards_written']:,} "
                  f"shards; {d['example_shard']}: {files}"))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = benchlib.parser(__doc__, "500 streams (default: 10,000)")
    parser.add_argument("--streams", type=int, help="streams to post to (default 10,000; "
                                                     "--quick: 500)")
    parser.add_argument("--interleave", action="store_true",
                        help="one event to every stream in turn, 20 times over (default: a "
                             "stream's 20 events, then the next stream)")
    parser.add_argument("--max-seconds", type=int, default=600,
                        help="bound on each load (wrk -d; default 600)")
    args = parser.parse_args(argv)
    streams = args.streams or (500 if args.quick else 10_000)
    if streams < WRK_THREADS:
        sys.exit(f"--streams must be at least {WRK_THREADS}")
    signal.signal(signal.SIGTERM, lambda n, f: sys.exit(128 + n))  # finally: servers stopped
    wrk = shutil.which("wrk") or sys.exit("wrk is missing: run `make bench-deps` (apt-get install wrk)")
    benchlib.fresh_dir(SCRATCH)
    ctx = benchlib.Context("bench_streams", SCRATCH, MEASURED_CODE)
    ctx.progress(f"anchor: {streams * EACH:,} events into one stream")
    anchor = one_run(wrk, "anchor", streams, "one", args.interleave, args.max_seconds)
    ctx.progress(f"{streams:,} streams × {EACH} events")
    case = one_run(wrk, "streams", streams, None, args.interleave, args.max_seconds)
    rows = build_rows(anchor, case)
    found = Counter[str]()
    for rec in (anchor, case):
        found.update(rec["log_findings"]["warnings_or_errors"])
    notes = [
        f"- One run each, a fresh gateway ({WORKERS} workers, max_streams = 0, {SHARDS} shards, "
        f"access log on) and data directory per run; wrk -t{WRK_THREADS} -c{WRK_CONNECTIONS}, "
        f"one ~200-byte JSON event per request, thread t posting to streams t, t+{WRK_THREADS}, "
        + ("... one event to each in turn, 20 times over." if args.interleave else
           "... a stream's events one after the other, then the next stream (so a written "
           "stream goes idle)."),
        f"- Workers sampled every {SAMPLE_S} s: descriptors (/proc/PID/fd), mappings "
        "(/proc/PID/maps), VmRSS; VmHWM read at the last sample, after the reads. Disk: the "
        "data directory's allocated blocks (files and directories, as du counts) ÷ the shard "
        "directories written; the example shard is the first with files of a stream in the "
        f"middle. The load stops if the disk gets below {MIN_FREE_BYTES >> 30} GiB free.",
        "- Anchor: the same requests, all to one stream, against a fresh gateway.",
        f"- Server logs in {(SCRATCH / 'logs').relative_to(LOADTESTS.parent)}/: "
        + (", ".join(f"{n}× {t!r}" for t, n in found.most_common(5)) or "no warnings or errors")
        + "; unlogged 500s at the stop: "
        + ("; ".join(r["stop"].get("unlogged_500s", "") for r in (anchor, case)).strip("; ")
           or "none") + ".",
        benchlib.cpu_note({r["label"]: r["cpu"] for r in (anchor, case)}),
    ]
    ctx.write(args, "streams", "Many-streams benchmark", rows, notes, {
        "scale": {"runs": 1, "streams": streams, "events_each": EACH},
        "settings": {"workers": WORKERS, "shards": SHARDS, "wrk_threads": WRK_THREADS,
                     "wrk_connections": WRK_CONNECTIONS, "interleave": args.interleave,
                     "fd_target": FD_TARGET, "rss_target_mib": RSS_TARGET_MIB},
        "runs": [anchor, case]})
    shutil.rmtree(SCRATCH / "data", ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
