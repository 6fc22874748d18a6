"""Spark benchmark: the ``comet`` source (target ≥ 1.4× the JSON scan) and ``comet
spark-ship`` into its Delta Lake table (≥ 1.2× a JSON → Parquet job) against Spark's JSON
reader on the same events; the Delta commit's own time and its share of each ship run.

    .venv/bin/python -m loadtests.bench_spark [--quick] [--regenerate]
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run by its path: again as a module
    from by_path import rerun_as_module  # type: ignore[import-not-found]

    rerun_as_module(__file__)

import gc
import importlib.metadata
import os
import random
import shutil
import string
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from loadtests import benchlib
from storage_c import Config, Log

LOADTESTS = Path(__file__).resolve().parent
SCRATCH = LOADTESTS / ".scratch" / "spark"
RUNS_DIR = SCRATCH / "runs"
MEASURED_CODE = ["spark_jobs", "storage_c", "consumers"]
FORMAT_VERSION = 1          # bump when the generated events change: the cache is rebuilt
STREAM, SHARDS, CHUNK, SEED = "ev", 8, 5000, 20251121
FIRST_TS_MS = 1_763_700_000_000
MSG_MIN, MSG_MAX = 690, 860  # msg characters: events of ~820-1000 bytes
SCHEMA = ("id long, ts long, device string, site string, temp double, ok boolean, "
          "tags array<string>, msg string")
GROUP, MASTER = "spark-ship", "local[2]"
SPARK_CONF = [("spark.driver.memory", "4g"), ("spark.ui.showConsoleProgress", "false")]


@dataclass(frozen=True)
class Scale:
    entries: int
    rounds: int
    warmup_rounds: int


# Measured at 1 M entries: ~14 s of JIT compilation in the first round of the five cases,
# ~1 s from the sixth on; a --quick round does 40 % of the rows, so it gets more of them.
FULL, QUICK = Scale(1_000_000, 5, 4), Scale(400_000, 3, 5)


def event_maker(rng: random.Random) -> Callable[[int], bytes]:
    """i -> the i-th event; ``msg`` is a slice of 16 MB of random words, so the data
    compress like text, not like repeats."""
    words: set[str] = set()
    while len(words) < 4000:
        words.add("".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 10))))
    vocab = sorted(words)
    sites, tags = vocab[:24], vocab[24:88]
    text = " ".join(rng.choices(vocab, k=2_400_000))
    span = len(text) - MSG_MAX

    def make(i: int) -> bytes:
        start = rng.randrange(span)
        return orjson.dumps({
            "id": i, "ts": FIRST_TS_MS + i, "device": f"dev-{i % 1000}", "site": rng.choice(sites),
            "temp": round(rng.random() * 65 - 20, 2), "ok": rng.random() < 0.9,
            "tags": rng.sample(tags, 3), "msg": text[start:start + rng.randrange(MSG_MIN, MSG_MAX + 1)]})
    return make


def generate(root: Path, entries: int) -> None:
    """The log and the NDJSON files (same events, same order), under a temporary name
    renamed into place with its meta.json."""
    tmp = benchlib.fresh_dir(root.with_name(root.name + ".partial"))
    (tmp / "ndjson").mkdir()
    make = event_maker(random.Random(SEED))
    per_shard = entries // SHARDS
    lengths: list[int] = []
    t0 = time.perf_counter()
    with Log(str(tmp / "log"), Config(shards=SHARDS, compression_threshold=0)) as log:
        log.create_stream(STREAM, SHARDS)
        for shard in range(SHARDS):
            with open(tmp / "ndjson" / f"shard-{shard:02d}.json", "wb") as f:
                for lo in range(shard * per_shard, (shard + 1) * per_shard, CHUNK):
                    events = [make(i) for i in range(lo, min(lo + CHUNK, (shard + 1) * per_shard))]
                    log.append_batch(STREAM, events, shard=shard)
                    f.write(b"\n".join(events) + b"\n")
                    lengths += map(len, events)
        log.sync()
    meta = {"format_version": FORMAT_VERSION, "entries": entries, "shards": SHARDS,
            "payload_bytes": sum(lengths), "payload_min": min(lengths), "payload_max": max(lengths),
            "payload_mean": sum(lengths) / entries, "id_sum": entries * (entries - 1) // 2,
            "ndjson_bytes": [(tmp / "ndjson" / f"shard-{s:02d}.json").stat().st_size
                             for s in range(SHARDS)],
            "schema": SCHEMA, "generated_s": round(time.perf_counter() - t0, 1)}
    (tmp / "meta.json").write_bytes(orjson.dumps(meta, option=orjson.OPT_INDENT_2))
    if root.exists():
        shutil.rmtree(root)
    os.replace(tmp, root)


def reset_group(log_dir: Path) -> None:
    with Log(str(log_dir), Config(create=False, background_flush=False)) as log:
        if any(g.name == GROUP for g in log.groups(STREAM)):
            log.delete_group(STREAM, GROUP)
        if any(g.name == GROUP for g in log.groups(STREAM)):
            raise RuntimeError(f"group {GROUP} still registered after delete_group")


def verify(root: Path, entries: int) -> str | None:
    """None if the cached data holds what meta.json says (N entries), else why not; deletes
    the ship job's group.  Counting lines puts the NDJSON files in the page cache, where the
    segments are too."""
    try:
        meta = orjson.loads((root / "meta.json").read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return "no cached data"
    if (meta.get("format_version"), meta.get("entries"), meta.get("shards"), meta.get("schema")) \
            != (FORMAT_VERSION, entries, SHARDS, SCHEMA):
        return "cached data of another format"
    per_shard = entries // SHARDS
    try:
        with Log(str(root / "log"), Config(create=False, background_flush=False)) as log:
            for shard in range(SHARDS):
                st = log.shard_stats(STREAM, shard)
                if (st.first_entry, st.next_entry) != (0, per_shard):
                    return f"shard {shard} holds entries {st.first_entry}..{st.next_entry}"
        reset_group(root / "log")
    except Exception as exc:  # any failure to open means: regenerate
        return f"the cached log does not open: {type(exc).__name__}: {exc}"
    for shard in range(SHARDS):
        path = root / "ndjson" / f"shard-{shard:02d}.json"
        if not path.is_file() or path.stat().st_size != meta["ndjson_bytes"][shard]:
            return f"{path.name} is missing or has another size"
        with open(path, "rb", buffering=0) as f:
            if sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(8 << 20), b"")) != per_shard:
                return f"{path.name} does not hold {per_shard} lines"
    return None


def dataset(ctx: benchlib.Context, entries: int, regenerate: bool) -> tuple[Path, dict[str, Any]]:
    root = SCRATCH / f"data-v{FORMAT_VERSION}-n{entries}"
    for old in SCRATCH.glob("data-v*"):  # other format versions: never used again
        if old.is_dir() and not old.name.startswith(f"data-v{FORMAT_VERSION}-"):
            shutil.rmtree(old, ignore_errors=True)
    why = "--regenerate" if regenerate else verify(root, entries)
    if why is not None:
        ctx.progress(f"generating {entries:,} entries ({why})")
        generate(root, entries)
        if (why := verify(root, entries)) is not None:
            raise RuntimeError(f"freshly generated data does not verify: {why}")
    return root, orjson.loads((root / "meta.json").read_bytes())


@dataclass(frozen=True)
class Case:
    key: str
    title: str
    anchor: str | None = None
    target: float | None = None


CASES = (Case("anchor_scan", "Anchor: spark.read.schema(S).json → noop"),
         Case("comet_raw", "comet source, raw (value binary) → noop", "anchor_scan", 1.4),
         Case("comet_parsed", "comet source, valueSchema S (pyarrow) → noop", "anchor_scan"),
         Case("anchor_job", "Anchor: read.schema(S).json → parquet (zstd 1)"),
         Case("comet_ship", "comet spark-ship, value_schema S → Delta lake", "anchor_job", 1.2))


class Bench:
    def __init__(self, spark: Any, root: Path, meta: dict[str, Any], ctx: benchlib.Context) -> None:
        self.spark, self.root, self.meta, self.ctx = spark, root, meta, ctx
        self.n = int(meta["entries"])
        beans = spark.sparkContext._jvm.java.lang.management.ManagementFactory
        self.compiler = beans.getCompilationMXBean()
        self.collectors = list(beans.getGarbageCollectorMXBeans())

    def jvm(self) -> tuple[int, int, int]:
        """The driver JVM's JIT ms, GC ms and GC count so far."""
        return (int(self.compiler.getTotalCompilationTime()),
                sum(int(g.getCollectionTime()) for g in self.collectors),
                sum(int(g.getCollectionCount()) for g in self.collectors))

    def json_reader(self) -> Any:
        return self.spark.read.schema(SCHEMA).json(str(self.root / "ndjson"))

    def comet_reader(self, parsed: bool) -> Any:
        reader = self.spark.read.format("comet").option("path", str(self.root / "log")) \
            .option("stream", STREAM)
        return (reader.option("valueSchema", SCHEMA) if parsed else reader).load()

    def action(self, key: str, out: Path) -> int | None:
        """Runs case ``key`` into ``out``; the rows it reports or wrote (None: scans)."""
        noop = lambda df: df.write.format("noop").mode("overwrite").save()  # noqa: E731
        if key == "anchor_scan":
            noop(self.json_reader())
        elif key in ("comet_raw", "comet_parsed"):
            noop(self.comet_reader(key == "comet_parsed"))
        elif key == "anchor_job":
            self.json_reader().write.option("compression", "zstd") \
                .option("parquet.compression.codec.zstd.level", "1").parquet(str(out))
            import pyarrow.parquet as pq
            return sum(pq.read_metadata(p).num_rows for p in out.rglob("*.parquet"))
        else:
            from spark_jobs.lake.lakefs import Lake
            from spark_jobs.spark.ship import ShipOptions, ship

            report = ship(ShipOptions(str(self.root / "log"), STREAM, Lake(str(out)),
                                      value_schema=SCHEMA), lambda: self.spark)
            self.ship_report = report.to_dict()
            return report.rows if report.rejects == 0 and report.missing == 0 else -1
        return None

    def table_rows(self, out: Path) -> int:
        """Rows of the Delta table's current version, by the log's per-file counts (the
        files are not read): what a Delta reader would see."""
        from deltalake import DeltaTable

        adds = pa.table(DeltaTable(str(out)).get_add_actions(flatten=True))
        return int(pc.sum(adds.column("num_records")).as_py() or 0)

    def run(self, case: Case, round_no: int) -> dict[str, Any]:
        out = RUNS_DIR / case.key
        shutil.rmtree(out, ignore_errors=True)
        RUNS_DIR.mkdir(parents=True, exist_ok=True)
        if case.key == "comet_ship":
            reset_group(self.root / "log")
        gc.collect()
        jvm0, probe = self.jvm(), benchlib.CpuProbe.start()
        t0 = time.perf_counter()
        rows = self.action(case.key, out)
        seconds = time.perf_counter() - t0
        cpu, jvm1 = probe.stop(), self.jvm()
        rec: dict[str, Any] = {
            "case": case.key, "round": round_no, "seconds": round(seconds, 4),
            "rows_per_s": self.n / seconds, "cpu": cpu, "rows_checked": rows,
            "jvm": {"jit_ms": jvm1[0] - jvm0[0], "gc_ms": jvm1[1] - jvm0[1], "gc_count": jvm1[2] - jvm0[2]}}
        if rows is not None:
            rec["checks_ok"] = rows == self.n
            rec["output_bytes"] = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
        if case.key == "comet_ship":
            rec["ship_report"] = self.ship_report
            rec["commit_seconds"] = self.ship_report["commit_seconds"]
            rec["commit_share"] = self.ship_report["commit_seconds"] / seconds
            rec["table_rows"] = self.table_rows(out)
            rec["checks_ok"] = rec["checks_ok"] and rec["table_rows"] == self.n
        shutil.rmtree(out, ignore_errors=True)
        self.ctx.progress(f"  {'warm-up' if round_no < 0 else 'round'} {abs(round_no + (round_no >= 0))} "
                          f"{case.key:<13} {seconds:6.2f} s {rec['rows_per_s']:>9,.0f} rows/s  JIT/GC "
                          f"{rec['jvm']['jit_ms']}/{rec['jvm']['gc_ms']} ms  others {cpu['other_share']:.0%}"
                          + ("" if rows is None else f"  rows {'ok' if rec['checks_ok'] else 'WRONG'}")
                          + (f"  commit {rec['commit_seconds']:.2f} s ({rec['commit_share']:.1%})"
                             if "commit_seconds" in rec else ""))
        return rec

    def check_scans(self) -> dict[str, Any]:
        """Counts and checksums of what each scan reads (aggregates, untimed)."""
        from pyspark.sql import functions as F

        n, id_sum, payload = self.n, self.meta["id_sum"], self.meta["payload_bytes"]
        a = self.json_reader().agg(F.count("*"), F.sum("id"), F.count("msg")).first()
        r = self.comet_reader(False).agg(F.count("*"), F.sum(F.length("value")),
                                         F.countDistinct("shard")).first()
        p = self.comet_reader(True).agg(F.count("*"), F.sum("value.id"), F.count("_error"),
                                        F.count("value.msg")).first()
        return {"anchor_scan": {"values": list(a), "ok": list(a) == [n, id_sum, n]},
                "comet_raw": {"values": list(r), "ok": list(r) == [n, payload, SHARDS]},
                "comet_parsed": {"values": list(p), "ok": list(p) == [n, id_sum, 0, n]}}


def build_rows(records: list[dict[str, Any]], checks: dict[str, Any]) -> tuple[list[dict[str, Any]],
                                                                           dict[str, Any]]:
    measured = [r for r in records if r["round"] >= 0]
    by = {(r["case"], r["round"]): r["rows_per_s"] for r in measured}
    rounds = sorted({r["round"] for r in measured})
    series = {c.key: benchlib.Series(c.key, "rows/s", [by[(c.key, i)] for i in rounds],
                                     [r["rows_per_s"] for r in records
                                      if r["case"] == c.key and r["round"] < 0][-1])
              for c in CASES}
    rows, ratios = [], {}
    for c in CASES:
        s, recs = series[c.key], [r for r in measured if r["case"] == c.key]
        if c.key in checks:
            ok, rows_text = checks[c.key]["ok"], "count + checksum once, untimed: " + (
                "ok" if checks[c.key]["ok"] else "WRONG")
        else:
            good = sum(1 for r in recs if r["checks_ok"])
            ok, rows_text = good == len(recs), f"rows = N in {good} of {len(recs)} runs"
        anchor = ratio = None
        ratio_text, verdict = "—", "—" if ok else "FAIL (wrong row count)"
        if c.anchor is not None:
            a = series[c.anchor]
            paired = [by[(c.key, i)] / by[(c.anchor, i)] for i in rounds]
            ratio, paired_median = s.median / a.median, benchlib.median(paired)
            ratios[c.key] = {"anchor": c.anchor, "of_medians": ratio, "paired": paired,
                             "paired_median": paired_median, "target": c.target}
            anchor = benchlib.anchor_ref(c.anchor, next(x.title for x in CASES if x.key == c.anchor), a.median, a.unit,
                                         f"{a.median / 1e3:,.0f} k rows/s")
            ratio_text = f"{ratio:.2f}× (median of per-round ratios {paired_median:.2f}×: " \
                         + ", ".join(f"{p:.2f}" for p in paired) + ")"
            if c.target is not None and ok:
                verdict = ("PASS" if ratio >= c.target else "FAIL") + (
                    "" if (ratio >= c.target) == (paired_median >= c.target)
                    else f" (paired ratio {'below' if ratio >= c.target else 'above'})")
        rows.append(benchlib.row(
            c.title, c.key, s.median, "rows/s", f"{s.median / 1e3:,.0f} k rows/s",
            role="case" if c.anchor else "anchor", anchor=anchor, ratio=ratio, ratio_text=ratio_text,
            target=None if c.target is None else {"op": ">=", "value": c.target, "unit": "x"},
            target_text=f"≥ {c.target:.1f}× anchor {(c.anchor or '').removeprefix('anchor_')}"
            if c.target else "—", passed=None if verdict == "—" else verdict.startswith("PASS"),
            verdict=verdict, runs_text=", ".join(f"{v / 1e3:.0f}" for v in s.runs)
            + f" k rows/s; {rows_text}"))
    return rows, {"series": {k: v.to_json() for k, v in series.items()}, "ratios": ratios}


def commit_figures(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The ship runs' Delta commit time (``ShipReport.commit_seconds``: the rejects and
    main tables' commits) and its share of each run's wall time, measured rounds in order."""
    ship = [r for r in records if r["case"] == "comet_ship" and r["round"] >= 0]
    return {"seconds": [r["commit_seconds"] for r in ship],
            "share": [r["commit_share"] for r in ship],
            "run_seconds": [r["seconds"] for r in ship],
            "median_seconds": benchlib.median([r["commit_seconds"] for r in ship]),
            "median_share": benchlib.median([r["commit_share"] for r in ship]),
            "max_share": max(r["commit_share"] for r in ship)}


def commit_table(commit: dict[str, Any]) -> str:
    """The Delta commit of each measured ship run, beside the run."""
    rounds = range(1, len(commit["seconds"]) + 1)
    return "comet spark-ship: the Delta commit's own time, per measured round:\n\n" + \
        benchlib.markdown_table(
            ["", *(f"round {i}" for i in rounds), "median"],
            [["run, s", *(f"{s:.2f}" for s in commit["run_seconds"]),
              f"{benchlib.median(commit['run_seconds']):.2f}"],
             ["commit, s", *(f"{s:.3f}" for s in commit["seconds"]), f"{commit['median_seconds']:.3f}"],
             ["commit share of the run", *(f"{s:.1%}" for s in commit["share"]),
              f"{commit['median_share']:.1%}"]])


def jvm_note(records: list[dict[str, Any]]) -> str:
    """The driver JVM's JIT compilation and GC per measured run (the JIT shares the CPUs)."""
    measured = [r for r in records if r["round"] >= 0]
    return "- Driver JVM per measured run (median): " + "; ".join(
        f"{c.key} {benchlib.median([r['jvm']['jit_ms'] for r in measured if r['case'] == c.key]):.0f} ms"
        f" JIT / {benchlib.median([r['jvm']['gc_ms'] for r in measured if r['case'] == c.key]):.0f} ms GC"
        for c in CASES) + "; JIT per warm-up round: " + ", ".join(
        f"{sum(r['jvm']['jit_ms'] for r in records if r['round'] == -w) / 1000:.1f} s"
        for w in range(1, -min(r["round"] for r in records) + 1)) + "."


def main(argv: list[str] | None = None) -> int:
    parser = benchlib.parser(__doc__, "400,000 entries and 3 measured rounds (default: 1,000,000 and 5)")
    parser.add_argument("--regenerate", action="store_true", help="rebuild the cached data")
    args = parser.parse_args(argv)
    scale = QUICK if args.quick else FULL
    ctx = benchlib.Context("bench_spark", SCRATCH, MEASURED_CODE)
    root, meta = dataset(ctx, scale.entries, args.regenerate)

    from spark_jobs.spark.session import spark_session

    spark = spark_session(MASTER, app="comet-bench-spark", conf=SPARK_CONF)
    records: list[dict[str, Any]] = []
    try:
        versions = {"spark": spark.version, "java": spark.sparkContext._jvm.java.lang.System
                    .getProperty("java.version"), "pyarrow": importlib.metadata.version("pyarrow"),
                    "deltalake": importlib.metadata.version("deltalake")}
        bench = Bench(spark, root, meta, ctx)
        checks: dict[str, Any] = {}
        for w in range(1, scale.warmup_rounds + 1):
            order = CASES if w % 2 else CASES[::-1]
            records += [bench.run(c, -w) for c in order]
            if w == 1:
                checks = bench.check_scans()
                ctx.progress(f"untimed checks of the scans: {checks}")
        for i in range(scale.rounds):
            ctx.progress(f"round {i + 1} of {scale.rounds} ({ctx.elapsed:.0f} s elapsed)")
            records += [bench.run(c, i) for c in (CASES if i % 2 == 0 else CASES[::-1])]
    finally:
        spark.stop()
        shutil.rmtree(RUNS_DIR, ignore_errors=True)
    machine = {**ctx.machine(), **versions}
    rows, figures = build_rows(records, checks)
    commit = commit_figures(records)
    out_mb = {k: benchlib.median([r["output_bytes"] for r in records if r["case"] == k
                                  and r["round"] >= 0]) / 1e6 for k in ("anchor_job", "comet_ship")}
    measured = [r for r in records if r["round"] >= 0]
    notes = [
        f"- {scale.entries:,} entries of JSON ({meta['payload_min']}–{meta['payload_max']} bytes, "
        f"mean {meta['payload_mean']:.0f}; {meta['payload_bytes'] / 1e6:,.0f} MB) in stream "
        f"`{STREAM}`, {SHARDS} shards, uncompressed; the anchors read the same events from "
        f"{SHARDS} NDJSON files ({sum(meta['ndjson_bytes']) / 1e6:,.0f} MB). S = `{SCHEMA}`.",
        f"- One SparkSession `{MASTER}`, 4 GB driver, Spark {versions['spark']}, Java "
        f"{versions['java']}, pyarrow {versions['pyarrow']}, deltalake {versions['deltalake']}; "
        "rows/s = N ÷ wall time of the action (planning, and for ship its plan, its Delta "
        "commits and its acks, included).",
        f"- {scale.warmup_rounds} unmeasured warm-up rounds, then {scale.rounds} measured "
        "rounds, orders 1→5 and 5→1 alternating; the ratio is that of the medians, the "
        "per-round ratios pair each comet run with the same round's anchor run.",
        jvm_note(records),
        f"- Output (median): anchor {out_mb['anchor_job']:,.0f} MB of Parquet; ship "
        f"{out_mb['comet_ship']:,.0f} MB (plus _comet_shard, _comet_entry, _comet_time; files "
        "fsynced and renamed, a plan written, one Delta commit with per-file statistics, its "
        "log synced, the group acked); ship's rows checked twice: the run's report and the "
        "Delta log's per-file row counts.",
        f"- The Delta commit (ShipReport.commit_seconds): median {commit['median_seconds']:.3f} s, "
        f"{commit['median_share']:.1%} of a ship run (at most {commit['max_share']:.1%}).",
        benchlib.cpu_note({f"{r['case']} round {r['round'] + 1}": r["cpu"] for r in measured}),
    ]
    ctx.write(args, "spark", "Spark benchmark", rows, notes, {
        "scale": asdict(scale), "settings": {"master": MASTER, "conf": dict(SPARK_CONF),
        "stream": STREAM, "shards": SHARDS, "schema": SCHEMA, "group": GROUP,
        "format_version": FORMAT_VERSION}, "data": meta, **figures, "ship_commit": commit,
        "scan_checks": checks, "runs": records}, machine, extra_md=commit_table(commit))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
