"""The processes of the power-cut scenarios (started by harness.PowerCutFS.spawn).

``writer.py MODE DATA ROUND SEED``: opens the log in DATA (recovery runs: this is
the reopen after a cut), prints what survived as one ``S {json}`` line, then
works until it is killed, printing one line per acknowledged operation:

- ``append DURABILITY SHARDS``: ``A shard entry payload t`` after each append
  returned (t: CLOCK_MONOTONIC, comparable with the cut's instant);
- ``consume``: a consumer process of group ``g`` (another process than the
  writer, as ``comet ship`` is): ``G shard offset t`` after each ack;
- ``batches DURABILITY SHARDS``: ``B shard first count tag t`` per acknowledged batch;
- ``cutpoint DURABILITY``: batches with production chunk sizes (see ``run_cutpoint``);
- ``fsyncgate DURABILITY``: single appends, failures printed (see ``run_fsyncgate``);
- ``keyed DURABILITY`` and ``keyed-retry DURABILITY``: batches with idempotency
  keys, and the retries of a client that lost its answers (see ``run_keyed``);
- ``serve PORT``: the real ``comet serve`` on DATA (two workers, 127.0.0.1:PORT,
  its settings from COMET_* in the environment), no ``S`` line;
- ``lifecycle``: creates, appends to (``always``, large entries: frequent
  rotations), runs retention on and deletes streams: ``C name``,
  ``A name shard entry payload``, ``R segments``, ``d name`` (a deletion begins),
  ``D name``;
- ``ship SINK once|follow`` and ``spark-ship LAKE PAUSE_AT``: the real
  ``comet ship`` / ``comet spark-ship`` commands (test_ship.py,
  test_spark_ship.py), their log lines on stdout (see ``run_ship``).

POWERCUT_RATE limits ``append`` to about that many appends per second;
POWERCUT_JSON=1 makes it write JSON payloads ``{"p": payload, "pad": "x..."}``
(a lake needs JSON), and POWERCUT_BAD=N every Nth one ``not json payload``
instead (a lake's reject); the ``A`` line still gives ``payload``.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import struct
import sys
import time
import zlib
from pathlib import Path
from typing import TypedDict, Unpack, cast

from storage_c import Config, Durability, IdempotencyKey, Log

SEGMENT = 64 << 10
MiB = 1 << 20


def body(tag: str, limit: int, low: int = 0) -> bytes:
    """The payload of the entry tagged ``tag``: the tag, then a padding whose length
    (``low`` to below ``limit``) and bytes follow from the tag, so that a check can
    rebuild every byte from the acknowledgement line."""
    n = low + zlib.crc32(tag.encode()) % (limit - low) if limit > low else low
    fill = b"%08x" % zlib.crc32(tag.encode(), 1)
    return tag.encode() + b"_" + (fill * (n // 8 + 1))[:n]


def digest(payload: bytes) -> str:
    """What a dump reports of each payload besides its tag: a check compares
    it with ``digest(body(...))``, i.e. every byte, padding included."""
    return hashlib.blake2b(payload, digest_size=10).hexdigest()


def tag_of(payload: bytes) -> str:
    """The tag a ``body`` payload starts with; any other payload (the JSON of the lake
    scenarios, their rejects) whole."""
    text = payload.decode("utf-8", "replace")
    head, sep, _ = text.partition("_")
    return head if sep else text


STREAM = "events"
GROUP = "g"


class ExtraConfig(TypedDict, total=False):
    """The Config fields the scenarios set beyond those of ``config``."""

    retention_max_shard_bytes: int
    retention_interval_ms: int
    retention_protect_unconsumed: bool


def config(durability: Durability = "always", shards: int = 2,
           **extra: Unpack[ExtraConfig]) -> Config:
    """POWERCUT_FSYNC_MS: fsync_interval_ms (default 100)."""
    return Config(shards=shards, segment_bytes=SEGMENT, segment_chunk_bytes=SEGMENT,
                  durability=durability,
                  fsync_interval_ms=int(os.environ.get("POWERCUT_FSYNC_MS", "100")),
                  compression_threshold=0, **extra)


def raw_offsets(data: Path) -> dict[str, dict[str, int]]:
    """Group offsets as the offsets files hold them, before any process opens them."""
    out: dict[str, dict[str, int]] = {}
    for path in sorted(data.glob("*/shard-*/offsets")):
        raw = path.read_bytes()
        groups = {}
        for slot in range(512):
            at = 4096 + 128 * slot
            if at + 128 > len(raw):
                break
            state, length = struct.unpack_from("<II", raw, at)
            if state == 1 and 0 < length < 48:
                name = raw[at + 8: at + 8 + length].decode("ascii", "replace")
                groups[name] = struct.unpack_from("<Q", raw, at + 64)[0]
        out[str(path.parent.relative_to(data))] = groups
    return out


def raw_ends(data: Path) -> dict[str, int]:
    """Per shard, the entry after the last whole batch on disk, read from the segment
    files before any process opens (and recovery repairs, or raises) them: from the
    first segment on, entries that check out (number, checksum) and run without a
    gap; the end is after the last one carrying the batch-end bit (FORMAT.md)."""
    from storage_c.checksum import crc32c

    out = {}
    for shard in sorted(data.glob("*/shard-*")):
        end = None
        expect = None
        for seg in sorted(shard.glob("*.log")):
            base = int(seg.name[:-4])
            if expect is not None and base != expect:
                break
            raw = seg.read_bytes()
            if len(raw) < 64 or raw[:4] == bytes(4):
                break
            expect = base if expect is None else expect
            end = base if end is None else end
            at = 64
            while at + 20 <= len(raw):
                crc, lf, low = struct.unpack_from("<III", raw, at)
                length = lf & 0x0FFFFFFF
                if (lf == 0 and crc == 0) or low != expect & 0xFFFFFFFF or at + 20 + length > len(raw):
                    break
                check = crc32c(raw[at + 4:at + 20 + length])
                if ((check >> 15) | (check << 17)) + 0xa282ead8 & 0xFFFFFFFF != crc:
                    break
                expect += 1
                if lf & (1 << 29):
                    end = expect
                at += 20 + length
        if end is not None:
            out[str(shard.relative_to(data))] = end
    return out


def files(data: Path) -> dict[str, int]:
    """File sizes; a file the open log's retention deletes while this walks is left out."""
    out = {}
    for dirpath, _, names in os.walk(data):
        for name in names:
            path = Path(dirpath, name)
            try:
                out[str(path.relative_to(data))] = path.stat().st_size
            except FileNotFoundError:
                continue
    return out


def dump(log: Log, data: Path, raw: dict, raw_ends: dict[str, int]) -> dict:
    """What survived.  POWERCUT_FROM (JSON {"stream/shard": entry}) lists entries
    from there only (the earlier ones were checked after earlier cuts)."""
    start = json.loads(os.environ.get("POWERCUT_FROM", "{}"))
    streams = {}
    for name in log.streams():
        shards = []
        for shard in range(log.shard_count(name)):
            st = log.shard_stats(name, shard)
            entries: list[list[int | str]] = []
            since = max(st.first_entry, start.get(f"{name}/{shard}", 0))
            for batch in log.iter_entries(name, shard, since):
                entries.extend([e, tag_of(p), digest(p)]
                               for e, p in zip(batch.entries, batch.payloads))
            # This process's retention (its first pass runs at the open) may have
            # deleted the oldest segments while they were listed: from its new first
            # entry on, the listing is whole.
            first = log.shard_stats(name, shard).first_entry
            if first > since:
                since = first
                entries = [e for e in entries if int(e[0]) >= first]
            first = max(first, st.first_entry)
            shards.append({"first": first, "listed_from": since, "next": st.next_entry,
                           "durable": st.durable_entry, "entries": entries,
                           "truncated": st.truncated_entries,
                           "skipped": st.skipped_entries, "crc_failures": st.crc_failures,
                           "state_rebuilds": st.state_rebuilds, "recoveries": st.recoveries,
                           "groups": {g.name: g.offset for g in log.groups(name, shard)}})
        streams[name] = shards
    report = log.verify()
    return {"streams": streams, "raw_offsets": raw, "raw_ends": raw_ends, "files": files(data),
            "verify": {"ok": report.ok, "bad_entries": report.bad_entries,
                       "problems": [repr(p) for p in report.problems]}}


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def open_and_dump(data: Path, cfg: Config) -> Log:
    raw = raw_offsets(data) if data.exists() else {}
    ends = raw_ends(data) if data.exists() else {}
    states = {str(p.parent.relative_to(data)): [p.stat().st_size, p.read_bytes()[:64].hex()]
              for p in data.glob("*/shard-*/state")} if data.exists() else {}
    try:
        log = Log(data, cfg)
        say("S " + json.dumps(dict(dump(log, data, raw, ends), raw_states=states)))
    except Exception as exc:  # reported to the test, which fails with it
        say("E " + json.dumps({"error": f"{type(exc).__name__}: {exc}", "raw_offsets": raw,
                               "files": files(data) if data.exists() else {}}))
        sys.exit(1)
    return log


def run_append(data: Path, rnd: int, rng: random.Random, durability: Durability,
               shards: int) -> None:
    log = open_and_dump(data, config(durability, shards))
    as_json = os.environ.get("POWERCUT_JSON") == "1"
    bad_every = int(os.environ.get("POWERCUT_BAD", "0"))
    pause = 1 / float(os.environ.get("POWERCUT_RATE", "inf"))
    seq = 0
    while True:
        if pause:
            time.sleep(pause)
        payload = f"{rnd}.{seq}"
        pad = b"x" * rng.randrange(200)
        data_ = (b'{"p":"%s","pad":"%s"}' % (payload.encode(), pad) if as_json
                 else body(payload, 200))
        if as_json and bad_every and seq % bad_every == bad_every - 1:
            data_ = b"not json " + payload.encode()
        shard, entry = log.append(STREAM, data_, shard=seq % shards)
        say(f"A {shard} {entry} {payload} {time.monotonic()}")
        seq += 1


def run_batches(data: Path, rnd: int, rng: random.Random, durability: Durability,
                shards: int) -> None:
    """Batches of 1-40 entries: ``B shard first count tag t``; entry i's payload is tag.i.

    POWERCUT_PAD: payload padding (default up to 100 bytes); POWERCUT_RETAIN: keep
    at most that many segments per shard (retention every 100 ms)."""
    pad = int(os.environ.get("POWERCUT_PAD", "100"))
    retain = int(os.environ.get("POWERCUT_RETAIN", "0"))
    extra = ExtraConfig(retention_max_shard_bytes=retain * SEGMENT, retention_interval_ms=100,
                        retention_protect_unconsumed=False) if retain else ExtraConfig()
    log = open_and_dump(data, config(durability, shards, **extra))
    seq = 0
    while True:
        tag = f"{rnd}.{seq}"
        count = rng.randrange(1, 41)
        result = log.append_batch(STREAM, [body(f"{tag}.{i}", pad) for i in range(count)],
                                  shard=seq % shards)
        say(f"B {seq % shards} {result.first} {count} {tag} {time.monotonic()}")
        seq += 1


KEYED_SHARDS = 4


def keyed_batch(tag: str) -> tuple[bytes, int]:
    """The body (lines, one entry each: ``tag.i``) of the keyed batch ``tag`` and its count."""
    count = 1 + zlib.crc32(tag.encode()) % 12
    return b"\n".join(body(f"{tag}.{i}", 200) for i in range(count)), count


def keyed_append(log: Log, tag: str) -> None:
    """One keyed batch (the key is the tag): ``K tag shard first count replayed t``."""
    payload, count = keyed_batch(tag)
    result = log.ingest(STREAM, payload, "lines",
                        idempotency=IdempotencyKey.of(tag, 600, b"lines", payload))
    assert result.count == count, f"{tag}: {result.count} entries, {count} sent"
    say(f"K {tag} {result.shard} {result.first} {count} {int(result.replayed)} {time.monotonic()}")


def run_keyed(data: Path, rnd: int, retry: bool, durability: Durability) -> None:
    """``keyed``: batches keyed ``rnd.seq`` in turn, ``T tag`` before each attempt
    and ``K ...`` after its answer, until killed.  ``keyed-retry``: the client
    that lost answers sends every tag listed in the file POWERCUT_TAGS again,
    prints ``K ...`` lines, then what the log holds (``S2 {json}``) and exits."""
    log = open_and_dump(data, config(durability, KEYED_SHARDS))
    if STREAM not in log.streams():
        log.create_stream(STREAM, KEYED_SHARDS)
    if retry:
        for tag in Path(os.environ["POWERCUT_TAGS"]).read_text().split():
            keyed_append(log, tag)
        say("S2 " + json.dumps(dump(log, data, {}, {})))
        log.close()
        return
    seq = 0
    while True:
        tag = f"{rnd}.{seq}"
        say(f"T {tag}")
        keyed_append(log, tag)
        seq += 1


CUT_SEGMENT = 4 * MiB + 256 * 1024
"""The segment size of ``cutpoint``: the default 4 MiB chunk and then some, so that
growth runs every step production runs (64 KiB first, doubled up to the 4 MiB chunk,
then a last, partial chunk) before each rotation."""


def cutpoint_config(durability: Durability, retention: bool = True) -> Config:
    """Without ``retention`` (the checking process): nothing is deleted while it lists."""
    return Config(shards=1, segment_bytes=CUT_SEGMENT, durability=durability,
                  fsync_interval_ms=int(os.environ.get("POWERCUT_FSYNC_MS", "100")),
                  compression_threshold=0,
                  retention_max_shard_bytes=2 * CUT_SEGMENT + 2 * MiB if retention else 0,
                  retention_interval_ms=100 if retention else 0,
                  retention_protect_unconsumed=False)


def run_cutpoint(data: Path, rnd: int, rng: random.Random, durability: Durability) -> None:
    """Batches of 1-40 entries of up to 6000 bytes to one shard with the default
    chunk size (``cutpoint_config``), every other one with an idempotency key,
    retention at about two segments (its unlinks:
    every rotation after the second), and group ``g`` acknowledged by this process
    after each batch, a random few entries short of its end: the append, growth,
    rotation, retention and offsets cut points all come by within ~10 MiB.
    Lines: ``B 0 first count tag t`` and ``G 0 offset t`` (none with POWERCUT_ACK=0)."""
    log = open_and_dump(data, cutpoint_config(durability))
    if STREAM not in log.streams():
        log.create_stream(STREAM, 1)
    group = log.group(STREAM, 0, GROUP)
    acks = os.environ.get("POWERCUT_ACK", "1") == "1"
    seq = 0
    while True:
        tag = f"{rnd}.{seq}"
        count = rng.randrange(1, 41)
        payloads = [body(f"{tag}.{i}", 6000) for i in range(count)]
        if seq % 2:  # a keyed batch every other time (its key recorded first: keys.c)
            lines = b"\n".join(payloads)
            result = log.ingest(STREAM, lines, "lines", shard=0,
                                idempotency=IdempotencyKey.of(tag, 600, b"lines", lines))
        else:
            result = log.append_batch(STREAM, payloads, shard=0)
        say(f"B 0 {result.first} {count} {tag} {time.monotonic()}")
        if acks:
            offset = group.ack(result.first + count - 1 - rng.randrange(count))
            say(f"G 0 {offset} {time.monotonic()}")
        seq += 1


def run_fsyncgate(data: Path, rnd: int, rng: random.Random, durability: Durability) -> None:
    """Single appends to one shard, ``A 0 entry tag t`` each; an append that fails
    prints ``F ErrorClass t`` and the next is tried 10 ms later (a client retrying):
    after a failed sync (the test arms fs.py's ``failsync``) every append must fail."""
    log = open_and_dump(data, config(durability, 1))
    seq = 0
    while True:
        tag = f"{rnd}.{seq}"
        try:
            _, entry = log.append(STREAM, body(tag, 200), shard=0)
        except Exception as exc:  # noqa: BLE001 - the test names the class it expects
            say(f"F {type(exc).__name__} {time.monotonic()}")
            time.sleep(0.01)
            continue
        say(f"A 0 {entry} {tag} {time.monotonic()}")
        seq += 1
        time.sleep(0.002)  # a few hundred appends per second: the flusher's syncs interleave


def run_consume(data: Path, rnd: int, rng: random.Random, shards: int) -> None:
    log = open_and_dump(data, config("interval", shards))
    groups = [log.group(STREAM, shard, GROUP) for shard in range(shards)]
    while True:
        moved = False
        for group in groups:
            batch = log.read(STREAM, group.shard, group.offset, rng.randrange(1, 20))
            if len(batch):
                offset = group.ack(batch.entries[-1])
                say(f"G {group.shard} {offset} {time.monotonic()}")
                moved = True
        if not moved:
            time.sleep(0.001)  # nothing to consume yet: the writer is another process


LIFECYCLE_PAD = (2000, 9000)  # payload sizes of ``lifecycle``: a rotation every few appends


def run_lifecycle(data: Path, rnd: int, rng: random.Random) -> None:
    cfg = config("always", 1, retention_max_shard_bytes=3 * SEGMENT, retention_interval_ms=0,
                 retention_protect_unconsumed=False)
    log = open_and_dump(data, cfg)
    live = list(log.streams())
    made = 0
    seq = 0
    while True:
        action = rng.random()
        if not live or action < 0.08:
            name = f"s{rnd}-{made}"
            made += 1
            log.create_stream(name, 1)
            live.append(name)
            say(f"C {name}")
        elif action < 0.12 and len(live) > 1:
            name = live.pop(rng.randrange(len(live)))
            say(f"d {name}")  # under way: a cut now may leave it or not
            log.delete_stream(name)
            say(f"D {name}")
        elif action < 0.2:
            report = log.run_retention()
            say(f"R {report.deleted_segments}")
        else:
            name = rng.choice(live)
            payload = f"{rnd}.{seq}"
            seq += 1
            _, entry = log.append(name, body(payload, LIFECYCLE_PAD[1], LIFECYCLE_PAD[0]),
                                  shard=0)
            say(f"A {name} 0 {entry} {payload}")


def run_ship(data: Path, rnd: int, args: list[str]) -> None:
    """``ship SINK once|follow [dump]`` and ``spark-ship LAKE PAUSE_AT [dump]``;
    SINK is a directory or an OTLP/HTTP endpoint (``http://...``).

    With ``dump`` the log is first opened (recovery), what survived printed
    (``S``) and closed again.  Then the real command runs in this process
    with its JSON log lines on stdout as ``L {json}``; at the end ``X``.
    ``spark-ship`` also prints ``P name`` at each of the run's crash points
    (its ``spark_ship.*`` cut points, storage_c/src/cutpoint.h), and ``P unsynced-main`` /
    ``P unsynced-rejects`` after each Delta commit, before the commit is
    synced; at the one named PAUSE_AT it waits for a line on stdin: the
    test cuts the power there (or kills it).  POWERCUT_CHECKPOINT_EVERY
    sets spark_jobs.lake.delta.CHECKPOINT_EVERY (checkpoints under the cuts).
    ``ship`` waits so after
    the object (or request) POWERCUT_SHIP_PAUSE of shard 0 (1: its first)
    was stored, before it is acknowledged; POWERCUT_READER_FSYNC_MS sets the
    fsync_interval_ms of its ``Config.reader()`` (the flusher of its acks)."""
    import logging

    kind, target, how = args[0], args[1], args[2]
    if args[3:] == ["dump"]:
        open_and_dump(data, config("interval", 2)).close()

    pause_at = int(os.environ.get("POWERCUT_SHIP_PAUSE", "0"))
    shipped = 0

    from comet.jsonlog import JsonFormatter

    as_json = JsonFormatter()

    class Lines(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            nonlocal shipped
            line = as_json.format(record)
            say("L " + line)
            if (record.getMessage() == "shipped" and "/shard=0000/" in line) or \
                    (record.getMessage() == "delivered" and f'"{STREAM}/0/' in line):
                shipped += 1
                if shipped == pause_at:  # stored, not acknowledged yet: wait for the cut
                    sys.stdin.readline()

    if "POWERCUT_READER_FSYNC_MS" in os.environ:  # the shipper's own flusher, for its acks
        import consumers.consumer

        every = int(os.environ["POWERCUT_READER_FSYNC_MS"])
        setattr(consumers.consumer, "Config", type("Config", (Config,), {
            "reader": classmethod(lambda cls: Config.reader(fsync_interval_ms=every))}))

    forwarding = target.startswith("http")
    for name in ("comet.ship", "comet.spark_ship"):
        logger = logging.getLogger(name)
        logger.addHandler(Lines())
        logger.setLevel(logging.DEBUG if forwarding else logging.INFO)  # "delivered" is DEBUG
        logger.propagate = False
    if kind == "ship":
        from consumers.cli import ship

        if forwarding:  # batches of a few entries, cut by age and by count, two in flight
            cli = ["--group", "ship", "--batch-age", "0.05", "--batch-records", "7",
                   "--concurrency", "2", "--status-interval", "0"]
        else:
            cli = ["--max-object-age", "0.05", "--max-object-bytes", "6000", "--status-interval", "0"]
        cli += ["--once"] if how == "once" else []
        ship.main([str(data), STREAM, target, *cli], standalone_mode=False)
    else:
        import spark_jobs.spark.ship
        from spark_jobs.spark.cli import spark_ship

        def cut_point(name: str) -> None:
            say(f"P {name}")
            if name == how:
                sys.stdin.readline()

        spark_jobs.spark.ship.cut_point = cut_point
        import spark_jobs.lake.delta
        from spark_jobs.lake.delta import LakeTable

        made_durable = LakeTable.made_durable

        def committed_unsynced(self: LakeTable, table: object) -> None:
            cut_point(f"unsynced-{self.name}")
            made_durable(self, table)  # type: ignore[arg-type]  # the DeltaTable, passed on

        setattr(LakeTable, "made_durable", committed_unsynced)
        if "POWERCUT_CHECKPOINT_EVERY" in os.environ:
            spark_jobs.lake.delta.CHECKPOINT_EVERY = int(os.environ["POWERCUT_CHECKPOINT_EVERY"])
        spark_ship.main([str(data), STREAM, target, "--schema", "p string, pad string",
                         "--conf", "spark.sql.shuffle.partitions=2", "--master", "local[2]"],
                        standalone_mode=False)
    say("X")


def main() -> None:
    mode, data, rnd, seed = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    rng = random.Random(seed)
    # MODE's DURABILITY argument: Config rejects any value but a Durability
    if mode == "append":
        run_append(data, rnd, rng, cast(Durability, sys.argv[5]), int(sys.argv[6]))
    elif mode == "batches":
        run_batches(data, rnd, rng, cast(Durability, sys.argv[5]), int(sys.argv[6]))
    elif mode == "cutpoint":
        run_cutpoint(data, rnd, rng, cast(Durability, sys.argv[5]))
    elif mode == "fsyncgate":
        run_fsyncgate(data, rnd, rng, cast(Durability, sys.argv[5]))
    elif mode == "serve":
        comet = Path(sys.executable).with_name("comet")
        os.execv(comet, [str(comet), "serve", "--data-dir", str(data), "--host", "127.0.0.1",
                         "--port", sys.argv[5], "--workers", "2"])
    elif mode in ("keyed", "keyed-retry"):
        run_keyed(data, rnd, mode == "keyed-retry", cast(Durability, sys.argv[5]))
    elif mode == "consume":
        run_consume(data, rnd, rng, int(sys.argv[5]))
    elif mode == "lifecycle":
        run_lifecycle(data, rnd, rng)
    elif mode in ("ship", "spark-ship"):
        run_ship(data, rnd, [mode, *sys.argv[5:]])
    elif mode == "dump":
        open_and_dump(data, config(cast(Durability, sys.argv[5]), int(sys.argv[6])))
    elif mode == "cutdump":
        open_and_dump(data, cutpoint_config(cast(Durability, sys.argv[5]), retention=False))
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
