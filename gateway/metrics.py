"""Prometheus metrics, the same whichever worker serves the scrape.

Storage totals (entries, bytes, syncs, lag...) come from the shards' shared
state, which every process maps.  Request counters and latency histograms are
per worker: each worker counts into its own small mapped file,
``<data>/.gateway/metrics-<slot>.bin`` (one writer per file, so no locks), and
a scrape reads every worker's file.  A file outlives its worker: a
replacement in the same slot goes on counting from where it stopped, so the
counters stay monotonic.
"""

from __future__ import annotations

from bisect import bisect_left

import mmap
import os
from pathlib import Path

from storage_c import Log

STATUSES = (200, 202, 400, 401, 403, 404, 409, 413, 415, 429, 500, 503, 507)
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
MAGIC = 0x434D4D49  # "IMMC": a new value whenever the layout below changes
# layout (u64 words): magic, per-status counts (+1 other), buckets (+Inf last),
# latency sum ns, events accepted, bytes received
STATUS_AT = 1
BUCKET_AT = STATUS_AT + len(STATUSES) + 1
SUM_AT = BUCKET_AT + len(BUCKETS) + 1
EVENTS_AT = SUM_AT + 1
BYTES_AT = EVENTS_AT + 1
WORDS = BYTES_AT + 1
STATUS_INDEX = {code: i for i, code in enumerate(STATUSES)}


def metrics_dir(data_dir: str | os.PathLike[str]) -> Path:
    return Path(data_dir) / ".gateway"


class WorkerMetrics:
    """This worker's counters, in its mapped file."""

    def __init__(self, mm: mmap.mmap, slot: int) -> None:
        self._mm = mm
        self.words = memoryview(mm).cast("Q")
        self.slot = slot

    @classmethod
    def open(cls, data_dir: str | os.PathLike[str], slot: int) -> WorkerMetrics:
        path = metrics_dir(data_dir) / f"metrics-{slot}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size != WORDS * 8:
                os.ftruncate(fd, WORDS * 8)
            mm = mmap.mmap(fd, WORDS * 8)
        finally:
            os.close(fd)
        metrics = cls(mm, slot)
        if metrics.words[0] != MAGIC:  # new, or another layout: start from zero
            for i in range(WORDS):
                metrics.words[i] = 0
            metrics.words[0] = MAGIC
        return metrics

    def observe(self, status: int, seconds: float, events: int, nbytes: int) -> None:
        w = self.words
        w[STATUS_AT + STATUS_INDEX.get(status, len(STATUSES))] += 1
        w[BUCKET_AT + bisect_left(BUCKETS, seconds)] += 1  # first bucket >= seconds
        w[SUM_AT] += int(seconds * 1e9)
        if events:
            w[EVENTS_AT] += events
        w[BYTES_AT] += nbytes

    def close(self) -> None:
        self.words.release()
        self._mm.close()


def read_all_workers(data_dir: str | os.PathLike[str]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for path in sorted(metrics_dir(data_dir).glob("metrics-*.bin")):
        try:
            slot = int(path.stem.split("-", 1)[1])
            raw = path.read_bytes()
        except (ValueError, OSError):
            continue
        if len(raw) != WORDS * 8:
            continue
        words = list(memoryview(raw).cast("Q"))
        if words[0] == MAGIC:
            out[slot] = words
    return out


def _line(name: str, labels: dict[str, object], value: float | int) -> str:
    text = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return f"{name}{{{text}}} {value}" if text else f"{name} {value}"


def render(log: Log, data_dir: str | os.PathLike[str]) -> str:
    """The Prometheus text exposition of the storage and of every worker."""
    lines: list[str] = []

    def family(name: str, kind: str, help_text: str) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")

    workers = read_all_workers(data_dir)
    family("comet_http_requests_total", "counter", "Ingest requests (POST /streams/{name}, the OTLP paths) by status.")
    for slot, w in workers.items():
        for i, code in enumerate(STATUSES):
            lines.append(_line("comet_http_requests_total", {"slot": slot, "code": code}, w[STATUS_AT + i]))
        lines.append(_line("comet_http_requests_total", {"slot": slot, "code": "other"},
                           w[STATUS_AT + len(STATUSES)]))
    family("comet_http_request_duration_seconds", "histogram", "Ingest request latency.")
    for slot, w in workers.items():
        running = 0
        for i, bound in enumerate(BUCKETS):
            running += w[BUCKET_AT + i]
            lines.append(_line("comet_http_request_duration_seconds_bucket",
                               {"slot": slot, "le": bound}, running))
        running += w[BUCKET_AT + len(BUCKETS)]
        lines.append(_line("comet_http_request_duration_seconds_bucket",
                           {"slot": slot, "le": "+Inf"}, running))
        lines.append(_line("comet_http_request_duration_seconds_sum", {"slot": slot}, w[SUM_AT] / 1e9))
        lines.append(_line("comet_http_request_duration_seconds_count", {"slot": slot}, running))
    family("comet_http_events_accepted_total", "counter", "Events acknowledged (202; 200 on the OTLP paths).")
    for slot, w in workers.items():
        lines.append(_line("comet_http_events_accepted_total", {"slot": slot}, w[EVENTS_AT]))
    family("comet_http_received_bytes_total", "counter", "Request body bytes received.")
    for slot, w in workers.items():
        lines.append(_line("comet_http_received_bytes_total", {"slot": slot}, w[BYTES_AT]))

    storage: list[tuple[str, str, str, str]] = [
        ("comet_stream_appended_entries_total", "counter", "appended_entries", "Entries appended."),
        ("comet_stream_appends_total", "counter", "appends", "Append calls (batches)."),
        ("comet_stream_appended_raw_bytes_total", "counter", "appended_raw_bytes", "Payload bytes before compression."),
        ("comet_stream_appended_stored_bytes_total", "counter", "appended_stored_bytes", "Bytes written to segments."),
        ("comet_stream_disk_bytes", "gauge", "disk_bytes", "Bytes of segment and index files."),
        ("comet_stream_segments", "gauge", "segments", "Segment files."),
        ("comet_stream_syncs_total", "counter", "syncs", "fdatasync calls."),
        ("comet_stream_rotations_total", "counter", "rotations", "Segment rotations."),
        ("comet_stream_crc_failures_total", "counter", "crc_failures", "Damaged entries met by readers."),
        ("comet_stream_truncated_entries_total", "counter", "truncated_entries", "Entries cut by recovery."),
        ("comet_stream_storage_full_errors_total", "counter", "storage_full_errors", "Appends refused: storage full."),
        ("comet_stream_sync_failures_total", "counter", "sync_failures", "Syncs (fsync, fdatasync, msync) that failed."),
        ("comet_stream_retention_deleted_segments_total", "counter", "retention_deleted_segments", "Segments deleted by retention."),
        ("comet_stream_retention_lost_entries_total", "counter", "retention_lost_entries", "Unconsumed entries deleted by force."),
        ("comet_stream_recycled_segments_total", "counter", "recycled_segments", "Segments that reused a deleted segment's file."),
        ("comet_stream_key_replays_total", "counter", "key_replays", "Requests answered with the batch their Idempotency-Key stored before."),
    ]
    stats = [log.stats(name) for name in log.streams()]
    for metric, kind, fieldname, help_text in storage:
        family(metric, kind, help_text)
        for s in stats:
            lines.append(_line(metric, {"stream": s.stream}, s.total(fieldname)))
    family("comet_stream_entries", "gauge", "Entries stored now.")
    for s in stats:
        lines.append(_line("comet_stream_entries", {"stream": s.stream}, s.entries))
    family("comet_append_latency_seconds_sum", "counter", "Append latency in the storage core (sum).")
    for s in stats:
        lines.append(_line("comet_append_latency_seconds_sum", {"stream": s.stream},
                           s.total("append_latency_sum_ns") / 1e9))
    family("comet_append_latency_seconds_count", "counter", "Appends timed by the storage core.")
    for s in stats:
        lines.append(_line("comet_append_latency_seconds_count", {"stream": s.stream},
                           s.total("append_latency_count")))
    family("comet_consumer_lag", "gauge", "Entries committed but not acknowledged, per group.")
    for s in stats:
        for group in s.group_lag().values():
            lines.append(_line("comet_consumer_lag", {"stream": s.stream, "group": group.name},
                               group.lag))
    return "\n".join(lines) + "\n"
