"""Locust load test of ``comet serve`` with the no-loss check of every 202 (tests/support/noloss.py);
``--soak`` adds retention, `comet ship` into a directory and bounds on disk use and lag.

    make loadtest | make soak
    .venv/bin/python -m loadtests.loadtest --run-time 30 --users 8 BatchUser KeyedUser
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run by its path: again as a module
    from by_path import rerun_as_module  # type: ignore[import-not-found]

    rerun_as_module(__file__)

import argparse
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtests.benchlib import machine_info, write_atomic
from loadtests.report import loadtest_summary
from storage_c import CometError, Log, StreamNotFound
from tests.support.noloss import READ_CONFIG, NoLossReport, check, locust_acks
from tests.support.server import COMET, GatewayProcess, scan_log

HERE = Path(__file__).resolve().parent

LOCUST_VENV = HERE.parent / ".venv-locust"
REQUIREMENTS = HERE / "requirements-locust.txt"
MiB = 1 << 20
STREAM = "loadtest"


def ensure_locust_venv(venv: Path = LOCUST_VENV) -> Path:
    """``venv/bin/locust``, installed by `make locust-venv` when missing or older than
    requirements-locust.txt."""
    locust, stamp = venv / "bin" / "locust", venv / ".installed"
    if not (locust.exists() and stamp.exists()
            and stamp.stat().st_mtime >= REQUIREMENTS.stat().st_mtime):
        subprocess.run(["make", "-C", str(HERE.parent), "locust-venv",
                        f"LOCUST_VENV={venv.resolve()}"], check=True)
    return locust


def stop_group(proc: subprocess.Popen[bytes] | None, timeout: float = 60.0) -> int | None:
    """TERM to ``proc``'s process group, up to ``timeout`` s, then KILL to the group."""
    if proc is None:
        return None
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=timeout)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            print(f"process {proc.pid} did not stop within {timeout:.0f} s: killing its group",
                  file=sys.stderr)
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    return proc.wait()


@dataclass
class Sample:
    t: float
    log_bytes: int     # segment and index files: what the retention budget counts
    du_bytes: int      # the data directory as du counts it
    lag: int | None    # the ship group's lag, None before it exists
    appended: int
    phase: str


def take_sample(data_dir: Path, t0: float, phase: str) -> Sample:
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
    lag, appended = None, 0
    with suppress(StreamNotFound, CometError):
        with Log(data_dir, READ_CONFIG) as log:
            stats = log.stats(STREAM)
        infos = [g for g in stats.groups if g.name == "ship"]
        lag = sum(g.lag for g in infos) if infos else None
        appended = sum(s.next_entry for s in stats.shards)
    return Sample(round(time.monotonic() - t0, 2), counted, used, lag, appended, phase)


def drain(args: argparse.Namespace, data_dir: Path, t0: float, samples: list[Sample],
          ship: subprocess.Popen[bytes]) -> dict[str, Any]:
    """After the load: until the ship group's lag is 0, sampling, or the timeout."""
    start = time.monotonic()
    while True:
        samples.append(take_sample(data_dir, t0, "drain"))
        if ship.poll() is not None:
            return {"drained_s": None, "drain_problem": f"comet ship exited ({ship.returncode})"}
        if samples[-1].lag == 0:
            return {"drained_s": round(time.monotonic() - start, 1)}
        if time.monotonic() - start > args.drain_timeout:
            return {"drained_s": None, "drain_problem":
                    f"lag still {samples[-1].lag} entries {args.drain_timeout:.0f} s after the load"}
        try:
            ship.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            pass


def judge_soak(args: argparse.Namespace, samples: list[Sample], segment_bytes: int, budget: int,
               rep: NoLossReport) -> dict[str, Any]:
    # One new segment (and its index) past the budget: what a rotation racing another
    # process's rotation may add before either deletes.
    slack = segment_bytes + segment_bytes // 4096 * 16 + 4096
    max_log = max((s.log_bytes for s in samples), default=0)
    load = [s for s in samples if s.phase == "load"]
    lags = sorted(s.lag for s in load if s.lag is not None)
    max_lag = lags[-1] if lags else 0
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
    return {"budget_bytes": budget, "slack_bytes": slack, "segment_bytes": segment_bytes,
            "max_log_bytes": max_log, "max_du_bytes": max((s.du_bytes for s in samples), default=0),
            "final_log_bytes": samples[-1].log_bytes if samples else None,
            "max_lag": max_lag, "median_lag": lags[len(lags) // 2] if lags else None,
            "max_lag_bound": args.max_lag, "ingest_entries_per_s": round(rate, 1),
            "max_lag_s": round(max_lag / rate, 2) if rate else None, "samples": len(samples),
            "retention_deleted_segments": rep.retention_deleted_segments,
            "retention_lost_entries": rep.retention_lost_entries,
            "shipped_events": rep.shipped_events, "in_log_events": rep.in_log,
            "deleted_by_retention_events": rep.deleted_by_retention,
            "shipped_and_deleted_events": rep.shipped_only, "problems": problems,
            "notes": [] if rep.retention_deleted_segments else [
                "retention deleted nothing: the run was too short or too slow to reach the "
                "budget, so the bound was not exercised"]}


class Interrupted(Exception):
    pass


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add = p.add_argument
    add("user_classes", nargs="*", help="locust user classes (default: all of them)")
    add("--soak", action="store_true", help="retention on, comet ship running, sampled")
    add("--run-time", type=float, help="seconds of load (default 60; soak 300)")
    add("--users", type=int, default=16, help="locust users (default 16)")
    add("--user-rps", type=float, help="requests/s per user (default unpaced; soak 25)")
    add("--workers", type=int, default=2, help="gateway workers (default 2)")
    add("--max-fail-ratio", type=float, default=0.0, help="locust threshold (default 0)")
    add("--max-p95-ms", type=float, default=1000.0, help="locust threshold (default 1000)")
    add("--stop-timeout", type=float, default=30.0,
        help="seconds locust waits for requests in flight at the end (default 30)")
    add("--storage", action="append", default=[], metavar="KEY=VALUE",
        help="storage setting for the gateway (COMET_STORAGE_<KEY>), repeatable")
    add("--access-log", action="store_true", help="keep the gateway's access log on")
    add("--name", help="result file names (default loadtest, or soak)")
    add("--results-dir", type=Path, default=HERE / "results")
    add("--scratch", type=Path, help="work directory (default loadtests/.scratch/<name>)")
    add("--retention-mib", type=float, default=48.0, help="soak: retention budget (default 48)")
    add("--max-lag", type=int, default=500_000, help="soak: ship lag bound, entries (default 500000)")
    add("--drain-timeout", type=float, default=60.0,
        help="soak: seconds for the lag to reach 0 after the load (default 60)")
    args = p.parse_args(argv)
    args.name = args.name or ("soak" if args.soak else "loadtest")
    args.run_time = args.run_time or (300.0 if args.soak else 60.0)
    args.user_rps = (25.0 if args.soak else 0.0) if args.user_rps is None else args.user_rps
    args.scratch = args.scratch or HERE / ".scratch" / args.name
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def on_signal(signum: int, frame: Any) -> None:
        raise Interrupted(f"signal {signum}")
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        if sig != signal.SIGHUP or signal.getsignal(sig) != signal.SIG_IGN:  # nohup
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
    locust = ensure_locust_venv()
    scratch, results = args.scratch, args.results_dir
    shutil.rmtree(scratch, ignore_errors=True)
    data_dir, records_dir, sink = scratch / "data", scratch / "records", scratch / "sink"
    records_dir.mkdir(parents=True)
    results.mkdir(parents=True, exist_ok=True)
    csv_prefix = results / args.name
    for old in results.glob(f"{args.name}_*.csv"):
        old.unlink()
    budget = int(args.retention_mib * MiB)
    storage = dict(shards="4", segment_bytes=str(2 * MiB), retention_max_total_bytes=str(budget),
                   retention_interval_ms="1000", retention_protect_unconsumed="true") if args.soak else {}
    for item in args.storage:
        key, eq, value = item.partition("=")
        if not eq:
            raise SystemExit(f"--storage {item!r}: use KEY=VALUE")
        storage[key.strip().lower()] = value.strip()
    env = {f"COMET_STORAGE_{k.upper()}": v for k, v in storage.items()}
    env.update({} if args.access_log else {"COMET_ACCESS_LOG": "0"})
    gateway: GatewayProcess | None = None
    locust_proc = ship = None
    samples: list[Sample] = []
    ok = False
    try:
        gateway = GatewayProcess(data_dir, args.workers, env=env, log_path=scratch / "serve.log")
        gateway.wait_ready()
        cmd = [str(locust), "-f", str(HERE / "locustfile.py"), "--headless", "-H", gateway.url,
               "-u", str(args.users), "-r", str(args.users), "-t", f"{int(args.run_time)}s",
               "--stop-timeout", str(int(args.stop_timeout)), "--only-summary",
               "--csv", str(csv_prefix), "--max-fail-ratio", str(args.max_fail_ratio),
               "--max-p95-ms", str(args.max_p95_ms), "--stream", STREAM,
               "--user-rps", str(args.user_rps), *args.user_classes]
        print(f"gateway: {gateway.url}, {args.workers} workers, data {data_dir}"
              + (f", storage {storage}" if storage else "") + "\nlocust: " + " ".join(cmd[1:]),
              flush=True)
        started, t0 = time.time(), time.monotonic()
        lenv = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        locust_proc = subprocess.Popen(cmd, env={**lenv, "COMET_LT_RECORD_DIR": str(records_dir)},
                                       start_new_session=True)
        deadline, locust_code = t0 + args.run_time + args.stop_timeout + 120, None
        while locust_code is None:  # the soak samples every 2 s meanwhile
            if args.soak:
                samples.append(take_sample(data_dir, t0, "load"))
                if ship is None and samples[-1].appended:  # `comet ship` needs the stream
                    ship = subprocess.Popen(
                        [str(COMET), "ship", str(data_dir), STREAM, str(sink), "--group", "ship",
                         "--max-object-age", "2", "--max-object-bytes", str(4 * MiB)],
                        stdout=open(scratch / "ship.log", "wb"), stderr=subprocess.STDOUT,
                        env={**os.environ, **env}, start_new_session=True)
            try:
                locust_code = locust_proc.wait(timeout=2.0 if args.soak else deadline - t0)
            except subprocess.TimeoutExpired:
                if time.monotonic() > deadline:
                    print("locust did not finish in time: stopping it", file=sys.stderr)
                    locust_code = stop_group(locust_proc, timeout=30)
        locust_wall = time.monotonic() - t0
        soak: dict[str, Any] = {}
        if ship is not None:
            soak = drain(args, data_dir, t0, samples, ship)
            soak["ship_exit_code"] = stop_group(ship)
        gateway_code = gateway.stop()
        acks = locust_acks(records_dir)
        t_check = time.monotonic()
        report = check(data_dir, acks, sink if args.soak else None)
        check_s = time.monotonic() - t_check
        if args.soak:
            samples.append(take_sample(data_dir, t0, "stopped"))
            soak.update(judge_soak(args, samples, int(storage["segment_bytes"]), budget, report),
                        ship_log=scan_log(scratch / "ship.log"))
            soak["problems"] += ([soak["drain_problem"]] if soak.get("drain_problem") else []) + (
                [f"comet ship exited {soak['ship_exit_code']}"]
                if soak.get("ship_exit_code") not in (0, None) else [])
            with open(results / f"{args.name}_samples.csv", "w", newline="") as f:
                csv.writer(f).writerows([["t_s", "phase", "log_bytes", "du_bytes", "lag", "appended"],
                                         *([x.t, x.phase, x.log_bytes, x.du_bytes,
                                            "" if x.lag is None else x.lag, x.appended]
                                           for x in samples)])
        verdict_path = records_dir / "verdict.json"
        verdict = json.loads(verdict_path.read_text()) if verdict_path.exists() else {}
        stats = verdict.pop("by_name", {})
        total = stats.get("Aggregated", {})
        problems = ([f"locust exited {locust_code}" + "".join(f"; {p}" for p in verdict.get("problems", []))]
                    if locust_code != 0 else []) + report.problems + soak.get("problems", [])
        if gateway_code not in (0, None):
            problems.append(f"comet serve exited {gateway_code}")
        ok = not problems
        result = {
            "name": args.name, "kind": "soak" if args.soak else "loadtest", "ok": ok,
            "problems": problems,
            "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "machine": machine_info(scratch), "workers": args.workers, "users": args.users,
            "user_rps": args.user_rps or None, "user_classes": args.user_classes or "all",
            "duration_s": float(args.run_time), "locust_wall_s": round(locust_wall, 1),
            "check_s": round(check_s, 1), "storage": storage, "access_log": args.access_log,
            "requests": total.get("requests"), "failures": total.get("failures"),
            "fail_ratio": total["failures"] / total["requests"] if total.get("requests") else None,
            "req_per_s": total.get("req_per_s"),
            "events_per_s": round(acks.events / float(args.run_time), 1),
            **{k: total.get(k) for k in ("p50_ms", "p95_ms", "p99_ms", "max_ms")},
            "events_acked": report.acked_events, "events_stored": report.stored_events,
            "thresholds": {"max_fail_ratio": args.max_fail_ratio, "max_p95_ms": args.max_p95_ms},
            "locust": {"exit_code": locust_code, "verdict": verdict, "by_name": stats},
            "check": report.to_json(),
            "gateway": {"exit_code": gateway_code, "log": gateway.scan_log()},
            **({"soak": soak} if args.soak else {}),
        }
        out = results / f"{args.name}.json"
        write_atomic(out, json.dumps(result, indent=2, default=str) + "\n")
        print(f"\n{loadtest_summary(result)}\n\nresults: {out} and {csv_prefix}_*.csv")
        return 0 if ok else 1
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):  # the cleanup below must not be cut short
            signal.signal(sig, signal.SIG_IGN)
        stop_group(locust_proc, timeout=args.stop_timeout + 30)
        stop_group(ship)
        if gateway is not None:
            gateway.stop()
        if ok:
            shutil.rmtree(data_dir, ignore_errors=True)
            shutil.rmtree(sink, ignore_errors=True)
        elif scratch.exists():
            print(f"data kept in {scratch}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
