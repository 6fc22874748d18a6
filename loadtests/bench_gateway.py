"""Gateway benchmark: wrk against `comet serve` and against ``anchor_app.py`` (a bare
Starlette app) with the same bodies, in the same run; stored entries must equal the 202s.

    .venv/bin/python -m loadtests.bench_gateway [--quick]   # 5 rounds of 10 s (--quick: 1 of 5 s)
    .venv/bin/python -m loadtests.bench_gateway --only gateway_single_tls,gateway_ndjson_tls
    .venv/bin/python -m loadtests.bench_gateway --only gateway_single_keyed,gateway_ndjson_keyed
    .venv/bin/python -m loadtests.bench_gateway --paced-only [--paced-seconds 60] [--quick]
    .venv/bin/python -m loadtests.bench_gateway --paced-only --paced-fraction 0.3
    .venv/bin/python -m loadtests.bench_gateway --paced-only --paced-rate 8000 \
        --paced-bodies single --paced-seconds 30 --paced-rounds 2 --wrk-nice 10

``--only`` runs the named cases and what they are compared with, without the paced cases.
The paced cases send single events, then 100-event NDJSON bodies, at half the bare anchor's
maximum rate of that body (``--paced-rate``: at that rate), to the anchor and to the
gateway: the gateway's p99.9 against the anchor's at the same rate, its slowest request,
and its worst stall (from its /metrics). With ``--paced-only`` only the anchors' maxima are
measured first (none with ``--paced-rate``), and each paced case runs ``--paced-rounds``
times (default once) for ``--paced-seconds`` (default 60; otherwise as long as a
throughput run). ``--wrk-nice`` and ``--wrk-cpus`` run the load generator niced or on CPUs
of its own, for the anchor and the gateway alike.
The TLS cases use certificates made for the run (tests/support/tls.py); wrk speaks TLS
(OpenSSL) and keeps its connections open, so a handshake is paid once per connection.

A ratio is the median of the per-round ratios: each round runs every case once, a case
next to its anchor, so a slow or fast spell of this VM (runs of one case spread by
20-30 %) moves both sides of a ratio rather than one median.
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run by its path: again as a module
    from by_path import rerun_as_module  # type: ignore[import-not-found]

    rerun_as_module(__file__)

import dataclasses
import json
import os
import shutil
from collections import Counter
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any, Mapping

from prometheus_client.parser import text_string_to_metric_families

from loadtests import benchlib
from tests.support.noloss import check_stored_count
from tests.support.server import HOST, GatewayProcess, ServerProcess
from tests.support.tls import Pki

LOADTESTS = Path(__file__).resolve().parent
SCRATCH = LOADTESTS / ".scratch" / "gateway"
LOGS = SCRATCH / "logs"
MEASURED_CODE = ["gateway", "storage_c", "pyproject.toml"]
WORKERS, STREAM, PACED_FRACTION, PACED_TOLERANCE = 2, "bench", 0.5, 0.10
# the paced gateway against the paced anchor: its p99.9 at most this many times the anchor's,
# and its slowest request under PACED_MAX_MS
PACED_P999_RATIO, PACED_MAX_MS = 1.5, 20.0
PACED_ONLY_S = 60
WRK_THREADS, WRK_CONNECTIONS = 1, 64  # measured here: -t1 -c64 ~17-19 k req/s on the anchor, -t2 ~13 k
DRAIN_S = 1              # wrk runs this much longer than the load, to collect the last answers
STOP_TIMEOUT_S = 45.0    # above the gateway's graceful_timeout (30 s)


@dataclass(frozen=True)
class Case:
    key: str
    title: str
    server: str            # "anchor" or "gateway"
    script: str
    events: int
    env: Mapping[str, str] = field(default_factory=dict)
    stores_mib_per_s: int = 8   # the warm-up covers what a run may store (NDJSON: ~1.2 M ev/s)
    anchor: str | None = None   # compared with; bound: the least ratio to it (None: no target)
    bound: float | None = None
    twin: str | None = None     # the same body with validation off, and the least ratio to it
    twin_bound: float | None = None
    path: str = f"/streams/{STREAM}"
    stream: str = STREAM        # where the gateway stores what the case posts
    accept: int = 202           # the status of a stored request
    tls: bool = False           # the gateway listens with TLS (a certificate made for the run)

    @property
    def unit(self) -> str:
        return "events/s" if self.server == "gateway" and self.events > 1 else "req/s"


LOG_ON, RAW = {"COMET_ACCESS_LOG": "1"}, {"COMET_ACCESS_LOG": "1", "COMET_VALIDATE": "0"}
BODIES = {"single": ("1 JSON event (200 B)", "single_event.lua", 1),
          "ndjson": ("100-event NDJSON (20 KB)", "ndjson_100.lua", 100),
          "array": ("100-element JSON array (20 KB)", "array_100.lua", 100)}


def case(body: str, suffix: str = "", what: str = "", env: Mapping[str, str] | None = None,
         bound: float | None = None, twin: bool = False) -> Case:
    title, script, events = BODIES[body]
    if env is None:
        return Case(f"anchor_{body}", f"Anchor: bare Starlette, {title}", "anchor", script, events)
    return Case(f"gateway_{body}{suffix}", f"Gateway: {title}, {what}", "gateway", script, events,
                env, 8 if events == 1 else 240, f"anchor_{body}", bound,
                f"gateway_{body}_novalidate" if twin else None, 0.90 if twin else None)


THROUGHPUT = (case("single"), case("single", "", "access log on", LOG_ON, 0.95),
              case("single", "_nolog", "COMET_ACCESS_LOG=0", {"COMET_ACCESS_LOG": "0"}, 0.95),
              case("ndjson"), case("ndjson", "", "validation on", LOG_ON, 0.70, True),
              case("ndjson", "_novalidate", "COMET_VALIDATE=0", RAW),
              case("array"), case("array", "", "validation on", LOG_ON, 0.70, True),
              case("array", "_novalidate", "COMET_VALIDATE=0", RAW),
              # TLS with keep-alive against the same case in plain HTTP: at most 25 % slower
              dataclasses.replace(case("single", "_tls", "TLS (keep-alive), access log on", LOG_ON),
                                  tls=True, anchor="gateway_single", bound=0.75),
              dataclasses.replace(case("ndjson", "_tls", "TLS (keep-alive), validation on", LOG_ON),
                                  tls=True, anchor="gateway_ndjson", bound=0.75),
              # a fresh Idempotency-Key per request against the same case with a header the
              # gateway ignores (X-Request-Id: wrk builds every request anew in both): at most
              # 10 % slower
              case("single", "_nonce", "X-Request-Id, access log on",
                   {**LOG_ON, "WRK_UNIQUE_HEADER": "X-Request-Id"}),
              dataclasses.replace(case("single", "_keyed", "Idempotency-Key, access log on",
                                       {**LOG_ON, "WRK_UNIQUE_HEADER": "Idempotency-Key"}),
                                  anchor="gateway_single_nonce", bound=0.90),
              case("ndjson", "_nonce", "X-Request-Id, validation on",
                   {**LOG_ON, "WRK_UNIQUE_HEADER": "X-Request-Id"}),
              dataclasses.replace(case("ndjson", "_keyed", "Idempotency-Key, validation on",
                                       {**LOG_ON, "WRK_UNIQUE_HEADER": "Idempotency-Key"}),
                                  anchor="gateway_ndjson_nonce", bound=0.90))
A_SINGLE, G_SINGLE = THROUGHPUT[:2]
BY_KEY = {c.key: c for c in THROUGHPUT}


def paced(key: str, pace: str) -> Case:
    """``key``'s case sent at a fixed rate (the gateway's: compared with the paced anchor)."""
    c = BY_KEY[key]
    return dataclasses.replace(c, key=f"{key}_paced", title=f"{c.title}, paced at {pace}",
                               twin=None, bound=None, twin_bound=None,
                               anchor=c.anchor and f"{c.anchor}_paced")


def paced_cases(pace: str, bodies: tuple[str, ...] = ("single", "ndjson")) -> tuple[Case, ...]:
    return tuple(paced(f"{server}_{body}", pace) for body in bodies
                 for server in ("anchor", "gateway"))


@dataclass(frozen=True)
class Scale:
    runs: int
    load_s: int
    warmup_load_s: int


FULL, QUICK = Scale(5, 10, 3), Scale(1, 5, 2)


@dataclass(frozen=True)
class Generator:
    """How wrk runs beside the servers: under ``nice`` (0: as they do), on the CPUs of
    ``cpus`` (taskset's list; empty: any); the same for anchor and gateway."""
    nice: int = 0
    cpus: str = ""

    def prefix(self) -> list[str]:
        return ((["nice", "-n", str(self.nice)] if self.nice else [])
                + (["taskset", "-c", self.cpus] if self.cpus else []))

    def text(self) -> str:
        return (", ".join(([f"nice {self.nice}"] if self.nice else [])
                          + ([f"on CPU(s) {self.cpus}"] if self.cpus else []))
                or "on the same CPUs as the servers, not niced")


def run_wrk(wrk: str, port: int, case: Case, load_s: float, rate: float | None,
            gen: Generator = Generator()) -> dict[str, Any]:
    """One bounded wrk run: the script's WRKJSON summary plus the command line."""
    argv = [*gen.prefix(), wrk, f"-t{WRK_THREADS}", f"-c{WRK_CONNECTIONS}", f"-d{int(load_s) + DRAIN_S}s",
            "-s", str(LOADTESTS / "wrk" / case.script),
            f"{'https' if case.tls else 'http'}://{HOST}:{port}{case.path}",
            "--", f"stop_after={load_s}", f"events={case.events}", f"accept={case.accept}"]
    if rate:
        argv.append(f"rate={rate / WRK_THREADS:.3f}")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=load_s + DRAIN_S + 60,
                          env={**os.environ, **case.env})
    for line in done.stdout.splitlines():
        if line.startswith("WRKJSON "):
            return {**json.loads(line[8:]), "argv": argv, "exit_code": done.returncode}
    raise RuntimeError(f"wrk printed no WRKJSON line (exit {done.returncode}):\n"
                       f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}")


def start(case: Case, label: str, pki: Pki | None) -> ServerProcess:
    log = LOGS / f"{label}.log"
    if case.tls and pki is None:
        raise ValueError(f"{case.key} needs certificates (pki)")
    if case.server == "gateway":
        return GatewayProcess(benchlib.fresh_dir(SCRATCH / "data" / label), WORKERS,
                              env={**case.env, **(pki.env() if pki and case.tls else {})},
                              log_path=log, tls=pki.client_context() if pki and case.tls else None)
    # the gateway's gunicorn settings that apply to a bare app (gateway/serving/server.py)
    return ServerProcess.gunicorn("anchor_app:app", chdir=LOADTESTS, workers=WORKERS, log_path=log,
                                  args=["--no-control-socket", "--keep-alive", "5", "--timeout",
                                        "60", "--graceful-timeout", "30"])


def one_run(wrk: str, case: Case, label: str, load_s: float, rate: float | None = None,
            pki: Pki | None = None, gen: Generator = Generator()) -> dict[str, Any]:
    """Fresh server, readiness, page-allocator warm-up, wrk, stop, checks."""
    probe = benchlib.CpuProbe.start()
    server = start(case, label, pki)
    rec: dict[str, Any] = {"case": case.key, "label": label, "server_kind": case.server,
                           "log": str(server.log_path.relative_to(LOADTESTS.parent))}
    try:
        rec["ready_s"] = round(server.wait_ready(30), 3)
        rec["workers_seen"] = server.seen
        warm = max(benchlib.DEFAULT_WARM_MIB, int(case.stores_mib_per_s * (load_s + 2)))
        rec["warm_s"] = round(benchlib.warm_page_allocator(SCRATCH, warm), 3)
        summary = run_wrk(wrk, server.port, case, load_s, rate, gen)
        if rate and isinstance(server, GatewayProcess):
            rec["stall"] = worst_stall(server)
    finally:
        rec["stop"] = {"exit_code": server.stop(timeout=STOP_TIMEOUT_S), "killed": server.killed}
    rec["cpu"] = probe.stop()
    rec["wrk"] = summary
    accepted = int(summary["accepted_202"])
    window = float(summary["window_s"]) or float(load_s)
    rec.update(rate_req_s=accepted / window, events_s=accepted * case.events / window,
               non_202=int(summary["non_202"]), timeouts=int(summary["errors"]["timeout"]),
               socket_errors=sum(int(v) for k, v in summary["errors"].items() if k != "timeout"),
               log_findings=server.scan_log())
    if rate:
        rec["target_rate_req_s"] = rate
    if isinstance(server, GatewayProcess):
        rec.update(check_stored_count(server.data_dir, case.stream, accepted * case.events))
        shutil.rmtree(server.data_dir, ignore_errors=True)
    lat, found = summary["latency_us"], rec["log_findings"]
    print(f"  {label:<34} {rec['rate_req_s']:>9,.0f} req/s {rec['events_s']:>11,.0f} ev/s  p50/p99 "
          f"{lat['p50'] / 1000:.2f}/{lat['p99'] / 1000:.2f} ms  p99.9/max "
          f"{lat['p999'] / 1000:.2f}/{lat['max'] / 1000:.2f} ms  non-202 {rec['non_202']}  errors "
          f"{rec['socket_errors']}+{rec['timeouts']}t  stored=acked {rec.get('stored_equals_acknowledged', 'n/a')}"
          f"  tracebacks {found['tracebacks']}", file=sys.stderr, flush=True)
    return rec


NOT_INGEST = {"/metrics", "/readyz", "/healthz"}   # the benchmark's own requests
STALL_GAUGES = {"comet_event_loop_stall_max_seconds": "event loop stall",
                "comet_http_request_max_seconds": "longest request",
                "comet_append_latency_max_seconds": "longest append in the core"}


def worst_stall(server: GatewayProcess) -> dict[str, Any]:
    """The gateway's own view of its tail, from /metrics read after the load: the largest
    value of each STALL_GAUGES gauge over workers and streams, and the upper bound of the
    slowest non-empty bucket of the ingest routes' request durations (absent: not there)."""
    status, body, _ = server.request("GET", "/metrics", timeout=30)
    if status != 200:
        return {"error": f"/metrics answered {status}"}
    gauges: dict[str, float] = {}
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if sample.name in STALL_GAUGES:
                gauges[sample.name] = max(gauges.get(sample.name, 0.0), sample.value)
            elif (sample.name == "comet_http_request_duration_seconds_bucket"
                  and sample.labels.get("route") not in NOT_INGEST):
                le = float(sample.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + sample.value
    total = buckets.get(float("inf"))
    out: dict[str, Any] = {"gauges_s": gauges, "requests_in_histogram": total}
    if total:
        out["slowest_bucket_le_s"] = min(le for le, n in buckets.items() if n >= total)
    return out


def stall_text(recs: list[dict[str, Any]]) -> str:
    """The worst of each stall gauge and the slowest histogram bucket over ``recs``."""
    found = [r["stall"] for r in recs if "stall" in r]
    parts = []
    for name, what in STALL_GAUGES.items():
        values = [s["gauges_s"][name] for s in found if name in s.get("gauges_s", {})]
        parts.append(f"{what} " + (f"{max(values) * 1000:.1f} ms" if values else "n/a"))
    les = [s["slowest_bucket_le_s"] for s in found if "slowest_bucket_le_s" in s]
    parts.append("slowest request " + (f"≤ {max(les) * 1000:g} ms (histogram)" if les else "n/a"))
    return "worst in /metrics: " + ", ".join(parts)


def integrity(recs: list[dict[str, Any]]) -> tuple[str, list[str]]:
    """(non-202 / errors / stored text, reasons a PASS must become a FAIL)."""
    non202 = sum(r["non_202"] for r in recs)
    errors = sum(r["socket_errors"] + r["timeouts"] for r in recs)
    statuses = sum((Counter(r["wrk"]["non_202_by_status"]) for r in recs), Counter[str]())
    checks = [r["stored_equals_acknowledged"] for r in recs if "stored_equals_acknowledged" in r]
    text = (f"non-202 {non202}" + "".join(f", {n}× {s}" for s, n in sorted(statuses.items()))
            + (f"; {errors} socket errors/timeouts" if errors else "")
            + ("" if not checks else "; stored = acked: " + (
                "yes" if all(checks) else f"NO in {checks.count(False)} of {len(checks)} runs")))
    reasons = (["non-202"] if non202 else []) + (["errors"] if errors else [])
    if any(r["wrk"]["status_ge_400"] > r["non_202"] for r in recs):
        reasons.append("wrk counted status errors the script did not")
    return text, reasons + ([] if all(checks) else ["stored≠acked"])


def verdict(passed: bool | None, reasons: list[str]) -> str:
    why = f"({', '.join(reasons)})" if reasons else ""
    if passed is None:
        return why or "—"
    return "PASS" if passed and not reasons else f"FAIL {why}".rstrip()


def paired_ratio(records: dict[str, list[dict[str, Any]]], key: str, other: str) -> tuple[float, str]:
    """The median of round-by-round ratios of two cases' req/s, and the ratios as text."""
    ratios = [r["rate_req_s"] / o["rate_req_s"] for r, o in zip(records[key], records[other])]
    return benchlib.median(ratios), ", ".join(f"{x:.2f}" for x in ratios)


def selected(only: str | None) -> tuple[Case, ...]:
    """The cases named in ``only`` (comma-separated keys; None: all) and those they are compared with."""
    if only is None:
        return THROUGHPUT
    keys = {k.strip() for k in only.split(",") if k.strip()}
    unknown = keys - set(BY_KEY)
    if unknown:
        sys.exit(f"unknown case(s) {sorted(unknown)}; cases: {', '.join(BY_KEY)}")
    while True:
        more = {k for c in THROUGHPUT if c.key in keys for k in (c.anchor, c.twin) if k} - keys
        if not more:
            return tuple(c for c in THROUGHPUT if c.key in keys)
        keys |= more


def req_s(recs: list[dict[str, Any]]) -> float:
    return benchlib.median([r["rate_req_s"] for r in recs])


def build_rows(series: dict[str, benchlib.Series], records: dict[str, list[dict[str, Any]]],
               cases: tuple[Case, ...]) -> list[dict[str, Any]]:
    req = {k: req_s(recs) for k, recs in records.items()}
    rows = []
    for case in cases:
        s, recs = series[case.key], records[case.key]
        checks, reasons = integrity(recs)
        lat = [benchlib.median([r["wrk"]["latency_us"][p] for r in recs]) / 1000
               for p in ("p50", "p99")]
        text = benchlib.fmt_rate(s.median, s.unit)
        if case.server == "anchor" and case.events > 1:
            text += f" (= {benchlib.fmt_rate(s.median * case.events, 'events/s')})"
        anchor, ratio, ratio_text, target, target_text, passed = None, None, None, None, "—", None
        if case.anchor is not None:
            a, bound, twin, twin_bound = BY_KEY[case.anchor], case.bound, case.twin, case.twin_bound
            ratio, per_round = paired_ratio(records, case.key, a.key)
            a_text = benchlib.fmt_rate(req[a.key], "req/s") + (
                f" (= {benchlib.fmt_rate(req[a.key] * a.events, 'events/s')})" if a.events > 1 else "")
            anchor = benchlib.anchor_ref(a.key, a.title, series[a.key].median, series[a.key].unit, a_text)
            ratio_text, targets = f"{ratio:.2f}× (rounds: {per_round})", []
            if bound is not None:
                target, passed = {"op": ">=", "value": bound, "unit": "x"}, ratio >= bound
                targets.append(f"≥ {bound:.2f}× anchor")
            if twin is not None and twin_bound is not None:
                t, per_round = paired_ratio(records, case.key, twin)
                ratio_text += f"; {t:.2f}× validation off (rounds: {per_round})"
                targets.append(f"≥ {twin_bound:.2f}× validation off")
                passed = bool(passed) and t >= twin_bound
            target_text = ", ".join(targets) or "—"
        rows.append(benchlib.row(
            case.title, case.key, s.median, s.unit, text,
            role="anchor" if case.server == "anchor" else "case", anchor=anchor, ratio=ratio,
            ratio_text=ratio_text, target=target, target_text=target_text, passed=passed,
            verdict=verdict(passed, reasons),
            runs_text=f"{benchlib.runs_text(s)}; p50/p99 {lat[0]:.2f}/{lat[1]:.2f} ms; {checks}"))
    return rows


def paced_rows(records: dict[str, list[dict[str, Any]]], targets: dict[str, float],
               paced_set: tuple[Case, ...]) -> list[dict[str, Any]]:
    """Each paced case: its p99 (p99.9, rate achieved); the gateway's against the anchor's."""
    def p(key: str, q: str) -> float:
        return benchlib.median([r["wrk"]["latency_us"][q] for r in records[key]]) / 1000

    def slowest(key: str) -> float:
        return max(r["wrk"]["latency_us"]["max"] for r in records[key]) / 1000

    rows = []
    for case in paced_set:
        recs, target = records[case.key], targets[case.key]
        checks, reasons = integrity(recs)
        rate = benchlib.median([r["rate_req_s"] for r in recs])
        runs = ", ".join(f"p99/p99.9 {r['wrk']['latency_us']['p99'] / 1000:.2f}/"
                         f"{r['wrk']['latency_us']['p999'] / 1000:.2f} ms at {r['rate_req_s']:,.0f} "
                         f"req/s" for r in recs) + f"; {checks}"
        text = (f"p99 {p(case.key, 'p99'):.2f} ms, p99.9 {p(case.key, 'p999'):.2f} ms "
                f"(p50 {p(case.key, 'p50'):.2f}) at {benchlib.fmt_rate(rate, 'req/s')}")
        on_rate = all(abs(r["rate_req_s"] / target - 1) <= PACED_TOLERANCE for r in recs)
        title = f"{case.title} ({target:,.0f} req/s)"
        if case.anchor is None:
            rows.append(benchlib.row(title, case.key, p(case.key, "p99"), "ms", text, role="anchor",
                                     runs_text=runs))
            continue
        a = case.anchor
        ratio = p(case.key, "p999") / p(a, "p999")
        worst = slowest(case.key)
        passed = on_rate and ratio <= PACED_P999_RATIO and worst < PACED_MAX_MS
        rows.append(benchlib.row(
            title, case.key, p(case.key, "p999"), "ms", f"{text}, slowest {worst:.1f} ms",
            anchor=benchlib.anchor_ref(a, "Anchor: the same body, paced", p(a, "p999"), "ms",
                                       f"p99 {p(a, 'p99'):.2f} ms, p99.9 {p(a, 'p999'):.2f} ms, "
                                       f"slowest {slowest(a):.1f} ms"),
            ratio=1 / ratio, ratio_text=f"p99.9 {ratio:.2f}× the anchor's",
            target_text=f"p99.9 ≤ {PACED_P999_RATIO}× the anchor's, slowest < "
                        f"{PACED_MAX_MS:g} ms, rate within ±{PACED_TOLERANCE:.0%}",
            passed=passed, verdict=verdict(passed, reasons),
            runs_text=f"{runs}; {stall_text(recs)}"))
    return rows


def log_notes(every: list[dict[str, Any]]) -> str:
    out = []
    for kind in ("anchor", "gateway"):
        recs = [r for r in every if r["server_kind"] == kind]
        sums = [sum((Counter(r["log_findings"][part]) for r in recs), Counter[str]())
                for part in ("warnings_or_errors", "info_lines_mentioning_errors")]
        listed = [", ".join(f"{n}× {t!r}" for t, n in sorted(d.items())) or "none" for d in sums]
        out.append(f"{kind} ({len(recs)} runs): "
                   f"{sum(r['log_findings']['tracebacks'] for r in recs)} traceback(s); "
                   f"warnings/errors: {listed[0]}; info lines mentioning an error: {listed[1]}")
    return "; ".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = benchlib.parser(__doc__, "1 run per case with 5 s of load (default: 3 runs, 10 s)")
    parser.add_argument("--only", help="comma-separated case keys: these, what they are compared "
                                       "with, and no paced case")
    parser.add_argument("--paced-only", action="store_true",
                        help="the anchors' maxima, then the paced cases once each (results in "
                             "paced.md/json)")
    parser.add_argument("--paced-seconds", type=int, help="load of each paced run (default: "
                        f"{PACED_ONLY_S} with --paced-only, else as a throughput run)")
    parser.add_argument("--paced-fraction", type=float, default=PACED_FRACTION,
                        help="the paced cases' rate as a fraction of the anchor's maximum "
                             f"(default {PACED_FRACTION}: the issue's target; another gives the "
                             "tail against load, results in paced-<percent>.md/json)")
    parser.add_argument("--paced-rate", type=float,
                        help="the paced cases at this many requests/s instead of a fraction of "
                             "the anchor's maximum (the maxima are then not measured; results in "
                             "paced-<rate>rps.md/json)")
    parser.add_argument("--paced-bodies", default="single,ndjson",
                        help="the bodies of the paced cases (default: single,ndjson)")
    parser.add_argument("--paced-rounds", type=int,
                        help="runs of each paced case (default: 1 with --paced-only, else as "
                             "the throughput cases), anchor and gateway alternating")
    parser.add_argument("--wrk-nice", type=int, default=0,
                        help="run wrk under nice -n N, for anchor and gateway alike")
    parser.add_argument("--wrk-cpus", default="",
                        help="run wrk on these CPUs (taskset -c), for anchor and gateway alike")
    args = parser.parse_args(argv)
    fraction, fixed_rate = args.paced_fraction, args.paced_rate
    if not 0 < fraction <= 1:
        sys.exit(f"--paced-fraction {fraction}: give a fraction in (0, 1]")
    bodies = tuple(b for b in args.paced_bodies.split(",") if b)
    if not bodies or not set(bodies) <= {"single", "ndjson"}:
        sys.exit(f"--paced-bodies {args.paced_bodies!r}: give single, ndjson or both")
    if fixed_rate is not None and fixed_rate <= 0:
        sys.exit(f"--paced-rate {fixed_rate}: give a rate above 0")
    pace = (f"{fixed_rate:,.0f} req/s" if fixed_rate
            else f"{fraction:.0%} of the anchor's max")
    paced_set = paced_cases(pace, bodies)
    gen = Generator(args.wrk_nice, args.wrk_cpus)
    if args.only and args.paced_only:
        sys.exit("--only and --paced-only exclude each other")
    if fixed_rate and not args.paced_only:
        sys.exit("--paced-rate goes with --paced-only")
    cases: tuple[Case, ...] = (() if fixed_rate else tuple(BY_KEY[f"anchor_{b}"] for b in bodies)) \
        if args.paced_only else selected(args.only)
    scale = QUICK if args.quick else FULL
    signal.signal(signal.SIGTERM, lambda n, f: sys.exit(128 + n))  # finally: servers stopped
    wrk = shutil.which("wrk") or sys.exit("wrk is missing: run `make bench-deps` (apt-get install wrk)")
    benchlib.fresh_dir(SCRATCH)
    ctx = benchlib.Context("bench_gateway", SCRATCH, MEASURED_CODE)
    pki = Pki.make(SCRATCH / "pki")
    warmups = [c for c in (A_SINGLE, G_SINGLE) if c in cases] or [
        cases[0] if cases else BY_KEY[f"gateway_{bodies[0]}"]]
    every = [one_run(wrk, c, f"warmup-{c.key}", scale.warmup_load_s, pki=pki, gen=gen)
             for c in warmups]
    records: dict[str, list[dict[str, Any]]] = {c.key: [] for c in cases}
    for i in range(scale.runs):
        ctx.progress(f"round {i + 1} of {scale.runs}")
        for case in cases:
            records[case.key].append(one_run(wrk, case, f"{case.key}-{i}", scale.load_s, pki=pki,
                                             gen=gen))
    series = {c.key: benchlib.Series(c.key, c.unit, [r["events_s" if c.unit == "events/s"
                                                       else "rate_req_s"] for r in records[c.key]])
              for c in cases}
    for warm in every:
        if warm["case"] in series:
            series[warm["case"]].warmup = warm["rate_req_s"]
    # each body at a fraction of its anchor's maximum, to the anchor and the gateway alike
    targets = {} if args.only else {
        c.key: fixed_rate or fraction * req_s(records[(c.anchor or c.key).removesuffix("_paced")])
        for c in paced_set}
    rounds = args.paced_rounds or (1 if args.paced_only else scale.runs)
    paced_s = args.paced_seconds or (PACED_ONLY_S if args.paced_only else scale.load_s)
    for i in range(rounds if targets else 0):
        ctx.progress(f"paced round {i + 1} of {rounds}, {paced_s} s each")
        for case in paced_set:
            records.setdefault(case.key, []).append(one_run(
                wrk, case, f"{case.key}-{i}", paced_s, rate=targets[case.key], gen=gen))
    for case in paced_set if targets else ():
        series[case.key] = benchlib.Series(case.key + "_p99", "µs", [
            r["wrk"]["latency_us"]["p99"] for r in records[case.key]])
    every += [r for recs in records.values() for r in recs]
    machine = ctx.machine()
    machine["wrk"] = subprocess.run([wrk, "-v"], capture_output=True, text=True).stdout \
        .split(" Copyright")[0].strip() or "unknown"
    rows = ([] if args.paced_only else build_rows(series, records, cases)) + (
        paced_rows(records, targets, paced_set) if targets else [])
    notes = [
        f"- Median of {scale.runs} run(s) per case, {scale.load_s} s of load each (plus "
        f"{DRAIN_S} s for the last answers); {machine['wrk']} -t{WRK_THREADS} "
        f"-c{WRK_CONNECTIONS} on loopback for every case, {gen.text()}; {WORKERS} workers for anchor and "
        "gateway; a fresh server and data directory per run; one unmeasured warm-up run each "
        "of the single-event anchor and gateway cases run, first. Rates count 202s only; "
        "events/s = 202s × 100 "
        "for the 100-event bodies; stored = acked: the stream's entries after the stop "
        "equal 202s × events per request. The access log goes to the server's stdout, a "
        "file on the data directory's disk. A ratio is the median of the per-round ratios "
        "(the case and its anchor, or its validation-off twin, from the same round).",
        *([] if args.paced_only else [
            "- TLS cases: the gateway with a certificate made for the run (ECDSA P-256), wrk "
            "over TLS with its connections kept open; compared with the same case in plain "
            "HTTP from the same round."]),
        f"- Paced cases: sends scheduled at "
        + (f"{fixed_rate:,.0f} req/s" if fixed_rate else
           f"{fraction:.0%} of the anchor's median maximum for that body")
        + f", to the anchor and to the gateway (access log on), {rounds} "
        f"run(s) of {paced_s} s each; the first request of each of the {WRK_CONNECTIONS} "
        "connections goes at once, unpaced. Latency as wrk measures it (from the send, so a "
        "slipped schedule is not counted as waiting). Worst stall: the largest value of "
        + ", ".join(STALL_GAUGES) + " (each over the last minute, n/a: not in this "
        "version) in the gateway's /metrics read right after the load, and the slowest "
        "non-empty bucket of comet_http_request_duration_seconds (ingest routes, since the "
        "start), over the gateway's runs of the case.",
        f"- Server logs in {LOGS.relative_to(LOADTESTS.parent)}/ (warm-up runs included): "
        + log_notes(every) + ".",
        benchlib.cpu_note({r["label"]: r["cpu"] for r in every}),
    ]
    versions = {name: version(name) for name in ("gunicorn", "uvicorn", "uvicorn-worker",
                                                 "starlette", "uvloop", "httptools", "orjson")}
    paced_area = (f"paced-{fixed_rate:.0f}rps" if fixed_rate else "paced"
                  if fraction == PACED_FRACTION else f"paced-{fraction * 100:.0f}")
    area = ((paced_area, f"Paced latency benchmark ({pace})")
            if args.paced_only else ("gateway", "Gateway benchmark"))
    ctx.write(args, *area, rows, notes, {
        "versions": versions, "scale": asdict(scale),
        "settings": {"workers": WORKERS, "wrk_threads": WRK_THREADS,
                     "wrk_connections": WRK_CONNECTIONS, "drain_s": DRAIN_S, "stream": STREAM,
                     "paced_targets_req_s": targets, "paced_tolerance": PACED_TOLERANCE,
                     "paced_runs": rounds, "paced_s": paced_s, "only": args.only,
                     "wrk_generator": asdict(gen)},
        "series": {k: v.to_json() for k, v in series.items()}, "runs": every}, machine)
    shutil.rmtree(SCRATCH / "data", ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
