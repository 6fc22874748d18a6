"""Prometheus metrics, the same whichever worker serves the scrape.

Storage totals (entries, bytes, syncs, lag...) come from the shards' shared
state, which every process maps.  Request counters, the request duration
histogram and the stall gauges are per worker: each worker counts into its
own small mapped file, ``<data>/.gateway/metrics-<slot>.bin`` (one writer per
file, so no locks: a request costs a few additions to mapped words), and a
scrape reads every worker's file and sums them.  A file outlives its worker:
a replacement in the same slot goes on counting from where it stopped, so the
counters stay monotonic.

The duration histogram has one series per route template, method and status
class - a fixed set, whatever the streams are called - so its size never
grows with the streams.  The route templates are the route table's
(gateway.routes), which builds the ``Layout`` of the files from them.  The stall gauges are kept per second in a ring of
STALL_WINDOW_S slots (each tagged with its monotonic second, so that a slot
left from a minute ago, or by a dead worker, is ignored): a scrape reports
the worst of the last STALL_WINDOW_S seconds, which a scrape interval up to
that long never misses.
"""

from __future__ import annotations

import mmap
import os
import time
import zlib
from bisect import bisect_left
from pathlib import Path
from typing import Callable, Sequence

from storage_c import Log, StreamNotFound, StreamStats

STATUSES = (200, 202, 400, 401, 403, 404, 409, 413, 415, 429, 500, 503, 507)
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
UNMATCHED = "unmatched"
"""The route of a request no route template matches (a 404)."""
METHODS = ("GET", "HEAD", "POST", "PUT", "DELETE", "other")
CLASSES = ("1xx", "2xx", "3xx", "4xx", "5xx")
STALL_WINDOW_S = 60
"""The stall gauges report the worst of the last this many seconds."""
REFUSALS = ("header_too_large", "too_many_headers", "header_timeout", "body_timeout",
            "idle_connection", "connection_limit", "tls_handshake", "auth_failed")
"""Why a worker closed a connection or refused a request before the app answered it (or,
for auth_failed, a request without an accepted token)."""

# layout (u64 words): magic, per-status counts (+1 other), events accepted,
# bytes received, the refusals by reason, the stall ring (per second: its monotonic second, the
# longest loop stall and the longest request, in ns), then the histogram: per
# route, method and class, the buckets (+Inf last, not cumulative) and the sum in ns.
STATUS_AT = 1
EVENTS_AT = STATUS_AT + len(STATUSES) + 1
BYTES_AT = EVENTS_AT + 1
REFUSED_AT = BYTES_AT + 1
RING_AT = REFUSED_AT + len(REFUSALS)
HIST_AT = RING_AT + 3 * STALL_WINDOW_S
SERIES_WORDS = len(BUCKETS) + 2
SUM_OFFSET = len(BUCKETS) + 1
CLASS_WORDS = SERIES_WORDS
METHOD_WORDS = len(CLASSES) * CLASS_WORDS
ROUTE_WORDS = len(METHODS) * METHOD_WORDS
STATUS_INDEX = {code: i for i, code in enumerate(STATUSES)}
REFUSAL_INDEX = {reason: i for i, reason in enumerate(REFUSALS)}
METHOD_INDEX = {method: i for i, method in enumerate(METHODS)}


class Layout:
    """The words of a worker's file for the route templates ``routes`` (the
    histogram's, in order; UNMATCHED is added last)."""

    def __init__(self, routes: Sequence[str]) -> None:
        self.routes = (*routes, UNMATCHED)
        self.route_index = {route: i for i, route in enumerate(self.routes)}
        self.words = HIST_AT + len(self.routes) * ROUTE_WORDS
        # Derived from the layout: a file of another layout (an older gateway) starts from zero.
        self.magic = zlib.crc32(repr((STATUSES, BUCKETS, self.routes, METHODS, CLASSES,
                                      STALL_WINDOW_S, REFUSALS, self.words)).encode())

    def series_of(self, route: str, method: str) -> int:
        """Where the histogram of ``method route`` starts (its 1xx series); KeyError
        for a route that is not in ``routes``."""
        return (HIST_AT + self.route_index[route] * ROUTE_WORDS
                + METHOD_INDEX.get(method, len(METHODS) - 1) * METHOD_WORDS)


CLASS_OFFSET = tuple((min(max(hundreds, 1), 5) - 1) * CLASS_WORDS for hundreds in range(10))
"""By status // 100 (a status has three digits): the offset of its class from a series_of."""


def metrics_dir(data_dir: str | os.PathLike[str]) -> Path:
    return Path(data_dir) / ".gateway"


class WorkerMetrics:
    """This worker's counters, in its mapped file.  Written from the event
    loop's thread only."""

    def __init__(self, mm: mmap.mmap, slot: int, layout: Layout) -> None:
        self._mm = mm
        self.words = memoryview(mm).cast("Q")
        self.slot = slot
        self.layout = layout
        self.longest_ns = 0
        """The longest request since the last tick (see tick)."""

    @classmethod
    def open(cls, data_dir: str | os.PathLike[str], slot: int, layout: Layout) -> WorkerMetrics:
        path = metrics_dir(data_dir) / f"metrics-{slot}.bin"
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        size = layout.words * 8
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size != size:
                os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        metrics = cls(mm, slot, layout)
        if metrics.words[0] != layout.magic:  # new, or another layout: start from zero
            for i in range(layout.words):
                metrics.words[i] = 0
            metrics.words[0] = layout.magic
        return metrics

    def observe(self, series: int, status: int, seconds: float, events: int, nbytes: int) -> None:
        """An ingest request (POST /streams/{name}, the OTLP paths): its status
        counter, events and bytes, and its duration (as ``request``)."""
        w = self.words
        w[STATUS_AT + STATUS_INDEX.get(status, len(STATUSES))] += 1
        if events:
            w[EVENTS_AT] += events
        w[BYTES_AT] += nbytes
        # request(), inlined: this runs once per ingest request
        at = series + CLASS_OFFSET[status // 100]
        w[at + bisect_left(BUCKETS, seconds)] += 1
        ns = int(seconds * 1e9)
        w[at + SUM_OFFSET] += ns
        if ns > self.longest_ns:
            self.longest_ns = ns

    def request(self, series: int, status: int, seconds: float) -> None:
        """A request of any route answered ``status`` after ``seconds``;
        ``series``: its route and method's, from Layout.series_of."""
        w = self.words
        at = series + CLASS_OFFSET[status // 100]
        w[at + bisect_left(BUCKETS, seconds)] += 1  # first bucket >= seconds
        ns = int(seconds * 1e9)
        w[at + SUM_OFFSET] += ns
        if ns > self.longest_ns:
            self.longest_ns = ns

    def refused(self, reason: str) -> None:
        """A connection closed or a request refused for ``reason`` (one of REFUSALS)."""
        self.words[REFUSED_AT + REFUSAL_INDEX[reason]] += 1

    def tick(self, stall_s: float, now: float | None = None) -> None:
        """The loop monitor woke ``stall_s`` late: into this second's slot of
        the ring, with the longest request since the last tick."""
        second = int(time.monotonic() if now is None else now)
        at = RING_AT + 3 * (second % STALL_WINDOW_S)
        w = self.words
        if w[at] != second:  # a slot of STALL_WINDOW_S ago: this second's now
            w[at + 1] = w[at + 2] = 0  # cleared before it is tagged: a reader never
            w[at] = second              # sees an old value under the new second
        stall_ns = int(stall_s * 1e9)
        if stall_ns > w[at + 1]:
            w[at + 1] = stall_ns
        if self.longest_ns > w[at + 2]:
            w[at + 2] = self.longest_ns
        self.longest_ns = 0

    def close(self) -> None:
        self.words.release()
        self._mm.close()


def read_all_workers(data_dir: str | os.PathLike[str], layout: Layout) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for path in sorted(metrics_dir(data_dir).glob("metrics-*.bin")):
        try:
            slot = int(path.stem.split("-", 1)[1])
            raw = path.read_bytes()
        except (ValueError, OSError):
            continue
        if len(raw) != layout.words * 8:
            continue
        words = list(memoryview(raw).cast("Q"))
        if words[0] == layout.magic:
            out[slot] = words
    return out


def worst_stalls(words: list[int], now: float | None = None) -> tuple[int, int]:
    """(longest loop stall, longest request) in ns over the last STALL_WINDOW_S seconds."""
    second = int(time.monotonic() if now is None else now)
    stall = longest = 0
    for i in range(STALL_WINDOW_S):
        at = RING_AT + 3 * i
        if second - STALL_WINDOW_S < words[at] <= second:
            stall = max(stall, words[at + 1])
            longest = max(longest, words[at + 2])
    return stall, longest


def _line(name: str, labels: dict[str, object], value: float | int) -> str:
    text = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return f"{name}{{{text}}} {value}" if text else f"{name} {value}"


def histogram_lines(workers: dict[int, list[int]], layout: Layout) -> list[str]:
    """comet_http_request_duration_seconds, summed over the workers: the
    series that counted something (cumulative buckets, as Prometheus wants)."""
    name = "comet_http_request_duration_seconds"
    totals = [sum(column) for column in zip(*(w[HIST_AT:] for w in workers.values()))]
    lines: list[str] = []
    if not totals:
        return lines
    for r, route in enumerate(layout.routes):
        for m, method in enumerate(METHODS):
            for c, cls in enumerate(CLASSES):
                at = r * ROUTE_WORDS + m * METHOD_WORDS + c * CLASS_WORDS
                counts = totals[at:at + len(BUCKETS) + 1]
                if not any(counts):
                    continue
                labels: dict[str, object] = {"method": method, "route": route, "class": cls}
                running = 0
                for bound, count in zip((*BUCKETS, "+Inf"), counts):
                    running += count
                    lines.append(_line(name + "_bucket", {**labels, "le": bound}, running))
                lines.append(_line(name + "_sum", labels, totals[at + SUM_OFFSET] / 1e9))
                lines.append(_line(name + "_count", labels, running))
    return lines


def _total(field: str) -> Callable[[StreamStats], float]:
    return lambda s: s.total(field)


# Per-stream families: (metric, type, its value from a stream's stats, help).
STORAGE_METRICS: tuple[tuple[str, str, Callable[[StreamStats], float], str], ...] = (
    ("comet_stream_appended_entries_total", "counter", _total("appended_entries"), "Entries appended."),
    ("comet_stream_appends_total", "counter", _total("appends"), "Append calls (batches)."),
    ("comet_stream_appended_raw_bytes_total", "counter", _total("appended_raw_bytes"), "Payload bytes before compression."),
    ("comet_stream_appended_stored_bytes_total", "counter", _total("appended_stored_bytes"), "Bytes written to segments."),
    ("comet_stream_disk_bytes", "gauge", _total("disk_bytes"), "Bytes of segment and index files."),
    ("comet_stream_segments", "gauge", _total("segments"), "Segment files."),
    ("comet_stream_syncs_total", "counter", _total("syncs"), "fdatasync calls."),
    ("comet_stream_rotations_total", "counter", _total("rotations"), "Segment rotations."),
    ("comet_stream_crc_failures_total", "counter", _total("crc_failures"), "Damaged entries met by readers."),
    ("comet_stream_truncated_entries_total", "counter", _total("truncated_entries"), "Entries cut by recovery."),
    ("comet_stream_storage_full_errors_total", "counter", _total("storage_full_errors"), "Appends refused: storage full."),
    ("comet_stream_sync_failures_total", "counter", _total("sync_failures"), "Syncs (fsync, fdatasync, msync) that failed."),
    ("comet_stream_retention_deleted_segments_total", "counter", _total("retention_deleted_segments"), "Segments deleted by retention."),
    ("comet_stream_retention_lost_entries_total", "counter", _total("retention_lost_entries"), "Unconsumed entries deleted by force."),
    ("comet_stream_recycled_segments_total", "counter", _total("recycled_segments"), "Segments that reused a deleted segment's file."),
    ("comet_stream_key_replays_total", "counter", _total("key_replays"), "Requests answered with the batch their Idempotency-Key stored before."),
    ("comet_stream_entries", "gauge", lambda s: s.entries, "Entries stored now."),
    ("comet_append_latency_seconds_sum", "counter", lambda s: s.total("append_latency_sum_ns") / 1e9,
     "Append latency in the storage core (sum)."),
    ("comet_append_latency_seconds_count", "counter", lambda s: s.total("append_latency_count"),
     "Appends timed by the storage core."),
    ("comet_append_latency_max_seconds", "gauge",
     lambda s: max((x.append_latency_max_ns for x in s.shards), default=0) / 1e9,
     "Longest append in the storage core since the stream's shards were created."),
)


GROUP_METRICS = (
    ("comet_consumer_lag", "gauge", "Entries committed but not acknowledged, per group."),
    ("comet_consumer_lag_bytes", "gauge",
     "Bytes of those entries (estimated: each shard's lag times its mean entry size)."),
    ("comet_consumer_oldest_unacked_age_seconds", "gauge",
     "Age of the oldest entry the group has not acknowledged (0: none)."),
    ("comet_consumer_delivered_records_total", "counter",
     "Records the group's shipper delivered (comet ship: a 2xx from the endpoint)."),
    ("comet_consumer_retries_total", "counter", "Failed deliveries the group's shipper retried."),
    ("comet_consumer_failed_records_total", "counter",
     "Records the group's shipper gave up on (refused for good: in the stream's dead letters)."),
    ("comet_consumer_last_delivery_timestamp_seconds", "gauge",
     "When the group's shipper last delivered (unix seconds; 0: never)."),
)

GroupRow = tuple[str, list[float]]


def _stream_row(log: Log, name: str) -> tuple[str, list[float], list[GroupRow]] | None:
    """A stream's values for STORAGE_METRICS and its groups' for
    GROUP_METRICS; None when it was deleted since it was listed."""
    try:
        s = log.stats(name, oldest=False)
        backlogs = log.backlogs(s) if s.groups else {}
    except StreamNotFound:
        return None
    now = time.time_ns()
    groups = [(g.name, [g.lag, backlogs[g.name].bytes,
                        (now - backlogs[g.name].oldest_ns) / 1e9 if backlogs[g.name].oldest_ns else 0,
                        g.delivered, g.retries, g.failed, g.last_delivery_ns / 1e9])
              for g in s.group_lag().values()]
    return (name, [value(s) for _, _, value, _ in STORAGE_METRICS], groups)


def render(log: Log, data_dir: str | os.PathLike[str], layout: Layout,
           readable: Callable[[str], bool] = lambda stream: True) -> str:
    """The Prometheus text exposition of the storage and of every worker; of the
    streams, those ``readable`` says the asker may read."""
    lines: list[str] = []

    def family(name: str, kind: str, help_text: str) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")

    workers = read_all_workers(data_dir, layout)
    family("comet_http_requests_total", "counter", "Ingest requests (POST /streams/{name}, the OTLP paths) by status.")
    for slot, w in workers.items():
        for i, code in enumerate(STATUSES):
            lines.append(_line("comet_http_requests_total", {"slot": slot, "code": code}, w[STATUS_AT + i]))
        lines.append(_line("comet_http_requests_total", {"slot": slot, "code": "other"},
                           w[STATUS_AT + len(STATUSES)]))
    family("comet_http_request_duration_seconds", "histogram",
           "Request duration by route template, method and status class, all workers.")
    lines += histogram_lines(workers, layout)
    family("comet_http_events_accepted_total", "counter", "Events acknowledged (202; 200 on the OTLP paths).")
    for slot, w in workers.items():
        lines.append(_line("comet_http_events_accepted_total", {"slot": slot}, w[EVENTS_AT]))
    family("comet_http_received_bytes_total", "counter", "Request body bytes received.")
    for slot, w in workers.items():
        lines.append(_line("comet_http_received_bytes_total", {"slot": slot}, w[BYTES_AT]))
    family("comet_http_refused_total", "counter",
           "Connections closed and requests refused before the app answered, by reason.")
    for slot, w in workers.items():
        for i, reason in enumerate(REFUSALS[:-1]):
            lines.append(_line("comet_http_refused_total", {"slot": slot, "reason": reason},
                               w[REFUSED_AT + i]))
    family("comet_http_auth_failures_total", "counter",
           "Requests without a bearer token where one is needed, or with one not accepted.")
    for slot, w in workers.items():
        lines.append(_line("comet_http_auth_failures_total", {"slot": slot},
                           w[REFUSED_AT + REFUSAL_INDEX["auth_failed"]]))
    stalls = {slot: worst_stalls(w) for slot, w in workers.items()}
    family("comet_event_loop_stall_max_seconds", "gauge",
           f"Longest a worker's event loop was blocked in the last {STALL_WINDOW_S} s.")
    for slot, (stall, _) in stalls.items():
        lines.append(_line("comet_event_loop_stall_max_seconds", {"slot": slot}, stall / 1e9))
    family("comet_http_request_max_seconds", "gauge",
           f"Longest request a worker answered in the last {STALL_WINDOW_S} s.")
    for slot, (_, longest) in stalls.items():
        lines.append(_line("comet_http_request_max_seconds", {"slot": slot}, longest / 1e9))

    # One row of numbers per stream, its shards' stats let go at once: a
    # worker serving this for 10,000 streams of 16 shards must not hold
    # 160,000 shard records (hundreds of MiB) until the text is built.
    rows = [row for name in log.streams() if readable(name) and (row := _stream_row(log, name))]
    for i, (metric, kind, _, help_text) in enumerate(STORAGE_METRICS):
        family(metric, kind, help_text)
        for name, values, _ in rows:
            lines.append(_line(metric, {"stream": name}, values[i]))
    for i, (metric, kind, help_text) in enumerate(GROUP_METRICS):
        family(metric, kind, help_text)
        for name, _, groups in rows:
            for group, values in groups:
                lines.append(_line(metric, {"stream": name, "group": group}, values[i]))
    return "\n".join(lines) + "\n"
