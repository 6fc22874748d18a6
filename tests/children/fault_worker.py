"""A process of its own for tests/test_faults.py: writes under a fault plan,
opens under one, or checks a data directory, and says what happened as JSON
lines on stdout.  Each check runs in a fresh process (never the writer's
handle), after the test dropped the files' pages from the page cache, so
that what it reads is what the files hold.

    fault_worker.py write DIR SPEC TOTAL DURABILITY   lines {"ack": e} then {"done": ...}
    fault_worker.py open DIR SPEC                     one line {"error": ..., "fired": ...}
    fault_worker.py check DIR                         one line {"entries": [[e, hex], ...], ...}

SPEC is JSON: a list of rules [kind names, nth, count, errno or "short"],
in force from before the log is opened.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Literal, cast

from storage_c import Config, Log, StreamNotFound
from storage_c.testing import KINDS, SHORT, FaultPlan, Rule, fault_plan

SEG = 64 << 10


def payload(e: int) -> bytes:
    return b"%08d" % e + bytes((e * 31 + k) % 251 for k in range(40 + e % 300))


Durability = Literal["none", "interval", "always"]


def config(durability: str = "always") -> Config:
    return Config(shards=1, segment_bytes=SEG, background_flush=False, retention_interval_ms=0,
                  durability=cast(Durability, durability))


def rules(spec: list[list[Any]]) -> list[Rule]:
    out = []
    for names, nth, count, err in spec:
        kinds = 0
        for name in names:
            kinds |= KINDS[name]
        out.append(Rule(kinds, nth=nth, count=count, err=SHORT if err == "short" else err))
    return out


def say(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def failure(exc: BaseException) -> dict[str, str]:
    return {"type": type(exc).__name__, "message": str(exc)}


def write(where: Path, spec: list[list[Any]], total: int, durability: str) -> None:
    error = None
    plan: FaultPlan | None = None
    with fault_plan(*rules(spec)) as plan:
        try:
            with Log(where, config(durability)) as log:
                try:
                    log.open_stream("s", create=True)
                    for e in range(total):
                        assert log.append("s", payload(e), shard=0) == (0, e)
                        say(ack=e)
                except Exception as exc:  # the first failure ends the run; the log is closed
                    error = failure(exc)
        except Exception as exc:
            error = error or failure(exc)
        fired, calls = plan.fired, plan.calls
    say(done=True, error=error, fired=fired, calls=calls)


def open_and_read(where: Path, spec: list[list[Any]]) -> None:
    error, count = None, 0
    with fault_plan(*rules(spec)) as plan:
        try:
            with Log(where, config()) as log:
                for batch in log.iter_entries("s", 0):
                    count += len(batch.entries)
        except Exception as exc:
            error = failure(exc)
        fired, calls = plan.fired, plan.calls
    say(error=error, fired=fired, calls=calls, read=count)


def check(where: Path) -> None:
    with Log(where, config()) as log:
        try:
            log.open_stream("s", create=False)
        except StreamNotFound:
            say(entries=[], skipped=0, bad_entries=0)
            return
        entries: list[list[Any]] = []
        skipped = 0
        for batch in log.iter_entries("s", 0):
            skipped += batch.skipped
            entries.extend([e, p.hex()] for e, p in zip(batch.entries, batch.payloads))
        report = log.verify("s")
        say(entries=entries, skipped=skipped, bad_entries=report.bad_entries)


def main(argv: list[str]) -> None:
    mode, where = argv[0], Path(argv[1])
    if mode == "write":
        write(where, json.loads(argv[2]), int(argv[3]), argv[4])
    elif mode == "open":
        open_and_read(where, json.loads(argv[2]))
    elif mode == "check":
        check(where)
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main(sys.argv[1:])
