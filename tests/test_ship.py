"""comet ship: NDJSON.zst objects in a directory or S3, exactly once (SPEC 5)."""

from __future__ import annotations

import random
import signal
import subprocess
import time
from array import array
from pathlib import Path

import orjson
import pytest
import zstandard

from consumers import Consumer, DirectorySink, S3Sink, ShipConfig, Shipper, object_key
from consumers.ship import HOUR_NS
from comet.export import payload_of
from storage_c import Log, ReadBatch

from .support.server import COMET
from .support.ship import CFG, check_objects, fill_shards


def test_ship_to_a_directory(data_dir: Path, tmp_path: Path) -> None:
    sink = DirectorySink(tmp_path / "lake")
    with Log(data_dir, CFG) as log:
        fill_shards(log, 3000)
        with Consumer(log, "ev", "ship") as c:
            stats = Shipper(c, sink, ShipConfig(max_object_bytes=100_000)).run(once=True)
        assert check_objects(log, sink) == 12_000
        assert stats.objects == len(sink.keys()) > 12
        assert all(len(zstandard.ZstdDecompressor().decompress(sink.get(k))) <= 100_000
                   for k in sink.keys())
        fill_shards(log, 500, start=3000)  # a second run ships only what is new
        with Consumer(log, "ev", "ship") as c:
            Shipper(c, sink, ShipConfig(max_object_bytes=100_000)).run(once=True)
        assert check_objects(log, sink) == 14_000
        assert all(g.lag == 0 for g in log.groups("ev") if g.name == "ship")


def test_cuts_at_hour_boundaries_and_names_objects_by_offsets(tmp_path: Path, data_dir: Path) -> None:
    sink = DirectorySink(tmp_path / "lake")
    with Log(data_dir, CFG) as log:
        log.create_stream("ev", 4)
        with Consumer(log, "ev", "ship") as c:
            shipper = Shipper(c, sink, ShipConfig())
            base = (1_800_000_000 * 10**9 // HOUR_NS) * HOUR_NS
            stamps = [base - 2, base - 1, base, base + 5, base + HOUR_NS + 1]
            payloads = [b'{"a":%d}' % i for i in range(5)]
            data = b"".join(payloads)
            offsets = array("i", [0])
            for p in payloads:
                offsets.append(offsets[-1] + len(p))
            batch = ReadBatch("ev", 2, data, offsets, array("q", range(5)), array("q", stamps), 5, 0)
            log.append_batch("ev", payloads, shard=2)  # so that acks are not clamped away
            shipper.take(2, batch, lambda: False)
            shipper.flush(2, lambda: False)
    keys = sink.keys()
    assert keys == sorted([object_key("ev", 2, (base - 1) // HOUR_NS, 0, 1),
                           object_key("ev", 2, base // HOUR_NS, 2, 3),
                           object_key("ev", 2, base // HOUR_NS + 1, 4, 4)])
    assert keys[0].startswith("stream=ev/dt=2027-01-15/hour=07/shard=0002/")


ENVELOPED = [b"one\ntwo", b'{"base64":"eA=="}', b'{ "base64": "a different envelope" }']
"""Payloads a line cannot carry as they are: a newline, an envelope look-alike."""


def test_payloads_that_would_break_the_lines_ship_in_the_envelope(tmp_path: Path,
                                                                  data_dir: Path) -> None:
    """Every other payload is a line as stored; the envelope gives back the exact bytes."""
    kept = [b'{"a":1}', b"123456789012345678901234567890", b'{"a":1,"a":2}', b"\x00\xff binary",
            b'{"base64":"x","other":1}', b""]
    sink = DirectorySink(tmp_path / "lake")
    with Log(data_dir, CFG) as log:
        log.append_batch("nl", ENVELOPED + kept, shard=0)
        with Consumer(log, "nl", "ship") as c:
            Shipper(c, sink).run(once=True)
    [key] = sink.keys()
    lines = zstandard.ZstdDecompressor().decompress(sink.get(key)).split(b"\n")[:-1]
    assert lines[len(ENVELOPED):] == kept  # as stored, byte for byte
    values = [orjson.loads(line) for line in lines[:len(ENVELOPED)]]
    assert all(list(v) == ["base64"] for v in values)
    assert [payload_of(v) for v in values] == ENVELOPED


@pytest.mark.parametrize("odd", [b'{"base64":"eA=="}', b'{ "base64" : "eA==" }'])
def test_the_batch_path_envelopes_an_envelope_like_payload(tmp_path: Path, data_dir: Path,
                                                                    odd: bytes) -> None:
    """No payload holds a newline, so the batch would go whole: it is checked first."""
    sink = DirectorySink(tmp_path / "lake")
    with Log(data_dir, CFG) as log:
        log.append_batch("ev", [b'{"n":1}', odd, b'{"n":3}'], shard=0)
        with Consumer(log, "ev", "ship") as c:
            Shipper(c, sink).run(once=True)
    [key] = sink.keys()
    lines = zstandard.ZstdDecompressor().decompress(sink.get(key)).split(b"\n")[:-1]
    assert lines[0] == b'{"n":1}' and lines[2] == b'{"n":3}'
    assert payload_of(orjson.loads(lines[1])) == odd and list(orjson.loads(lines[1])) == ["base64"]


class FlakySink(DirectorySink):
    def __init__(self, root: Path, failures: int) -> None:
        super().__init__(root)
        self.failures = failures

    def put(self, key: str, data: bytes) -> None:
        if self.failures:
            self.failures -= 1
            raise ConnectionError("the network is down")
        super().put(key, data)


def test_sink_failures_are_retried(tmp_path: Path, data_dir: Path) -> None:
    sink = FlakySink(tmp_path / "lake", failures=3)
    with Log(data_dir, CFG) as log:
        fill_shards(log, 100)
        with Consumer(log, "ev", "ship") as c:
            stats = Shipper(c, sink, ShipConfig(retry_backoff_s=0.01)).run(once=True)
        assert stats.upload_errors == 3
        assert check_objects(log, sink) == 400


def test_ship_to_s3(moto_s3: str, data_dir: Path, aws_env: None) -> None:
    import boto3

    boto3.client("s3", endpoint_url=moto_s3).create_bucket(Bucket="edge")
    with Log(data_dir, CFG) as log:
        fill_shards(log, 1000)
    out = subprocess.run([str(COMET), "ship", str(data_dir), "ev", "s3://edge/lake",
                          "--endpoint-url", moto_s3, "--max-object-bytes", "50000", "--once"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    sink = S3Sink("edge", "lake", endpoint_url=moto_s3)
    with Log(data_dir, CFG) as log:
        assert check_objects(log, sink) == 4000
    assert all(k.startswith("stream=ev/dt=") for k in sink.keys())
    # Every line on stderr is one JSON log record (boto3 and botocore included).
    lines = [orjson.loads(line) for line in out.stderr.splitlines()]
    assert all({"ts", "level", "logger", "event"} <= line.keys() for line in lines), out.stderr
    shipped = [line for line in lines if line["event"] == "shipped"]
    assert len(shipped) == len(sink.keys()) and lines[-1]["event"] == "stopped"
    assert lines[-1]["objects"] == len(shipped) and lines[-1]["logger"] == "comet.ship"


def ship_command(data_dir: Path, lake: Path, *extra: str) -> list[str]:
    return [str(COMET), "ship", str(data_dir), "ev", str(lake), "--max-object-bytes", "20000",
            "--max-object-age", "0.05", *extra]


@pytest.mark.slow
def test_kill_9_twenty_times(data_dir: Path, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    rng = random.Random(11)
    start = 0
    with Log(data_dir, CFG) as log:
        fill_shards(log, 400)
        start = 400
        for _ in range(20):
            shipper = subprocess.Popen(ship_command(data_dir, lake), stderr=subprocess.DEVNULL)
            time.sleep(rng.uniform(0.3, 0.9))
            fill_shards(log, 150, start=start)  # the log keeps growing meanwhile
            start += 150
            time.sleep(rng.uniform(0.0, 0.3))
            shipper.send_signal(signal.SIGKILL)
            shipper.wait()
        final = subprocess.run(ship_command(data_dir, lake, "--once"), capture_output=True,
                               text=True, timeout=120)
        assert final.returncode == 0, final.stderr
        assert check_objects(log, DirectorySink(lake)) == 4 * start
        keys = DirectorySink(lake).keys()
        assert len(keys) == len(set(keys))
        # each run removed the temporary files the run killed before it left
        assert not [p for root in (lake, data_dir / ".ship") for p in root.rglob("*.tmp")]


def test_sigterm_finishes_the_current_object(data_dir: Path, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    with Log(data_dir, CFG) as log:
        fill_shards(log, 200)
        shipper = subprocess.Popen([str(COMET), "ship", str(data_dir), "ev", str(lake),
                                    "--max-object-age", "3600"], stderr=subprocess.PIPE)
        time.sleep(1.5)  # everything read, nothing old enough to cut yet
        shipper.send_signal(signal.SIGTERM)
        _, err = shipper.communicate(timeout=60)
        assert shipper.returncode == 0
        assert orjson.loads(err.splitlines()[-1])["event"] == "stopped"
        assert check_objects(log, DirectorySink(lake)) == 800  # the open objects were shipped
