"""What the tests of `comet ship` share: a stream of 4 shards filled with numbered JSON
events, and the check that a sink's objects hold every shipped entry once, in order."""

from __future__ import annotations

import random
import re

import orjson
import zstandard

from consumers import DirectorySink, S3Sink
from storage_c import Config, Log

from .storage import fill, read_all

KEY = re.compile(r"^stream=(?P<stream>[^/]+)/dt=(?P<dt>\d{4}-\d\d-\d\d)/hour=(?P<hour>\d\d)/"
                 r"shard=(?P<shard>\d{4})/(?P<first>\d{20})-(?P<last>\d{20})\.ndjson\.zst$")
CFG = Config(shards=4, segment_bytes=1 << 20)


def events(shard: int, start: int, n: int) -> list[bytes]:
    """Events ``start``.. of a shard, 50-400 bytes of message each."""
    rng = random.Random(shard * 100_000 + start)
    return [orjson.dumps({"shard": shard, "n": start + i, "msg": "x" * rng.randrange(50, 400)})
            for i in range(n)]


def fill_shards(log: Log, per_shard: int, start: int = 0) -> None:
    """Events ``start``.. into each of the 4 shards of stream "ev", one append a shard."""
    for shard in range(4):
        fill(log, "ev", events(shard, start, per_shard), shards=4, shard=shard)


def check_objects(log: Log, sink: DirectorySink | S3Sink, stream: str = "ev") -> int:
    """Objects cover every shipped entry once, in order, with nothing overlapping."""
    by_shard: dict[int, list[tuple[int, int, list[bytes]]]] = {}
    for key in sink.keys(f"stream={stream}/"):
        m = KEY.match(key)
        assert m, f"unexpected key {key}"
        lines = zstandard.ZstdDecompressor().decompress(sink.get(key)).split(b"\n")
        assert lines[-1] == b""
        by_shard.setdefault(int(m["shard"]), []).append((int(m["first"]), int(m["last"]), lines[:-1]))
    total = 0
    for shard, objects in by_shard.items():
        objects.sort()
        shipped = [line for _, _, lines in objects for line in lines]
        expect = 0
        for first, last, lines in objects:
            assert first == expect, f"shard {shard}: gap or overlap before {first}"
            assert len(lines) == last - first + 1
            expect = last + 1
        stored = [p for _, _, p in read_all(log, stream, shard)][: len(shipped)]
        assert shipped == stored, f"shard {shard}: objects differ from the log"
        assert log.group(stream, shard, "ship").offset == expect
        total += len(shipped)
    return total
