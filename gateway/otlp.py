"""POST /v1/logs, /v1/traces and /v1/metrics: OTLP/HTTP export requests.

Each log record, span or metric data point becomes one JSON event (the
layout: docs/opentelemetry.md) in the signal's stream (``otlp_*_stream``),
and one request is one atomic batch in one shard: the shard of the first
resource's ``service.name``, so one service's records stay in order.

A binary (``application/x-protobuf``) body is decoded and turned into events
in C in one pass (``storage_c.decode_otlp``).  A JSON body (``application/json``,
OTLP's JSON encoding: hex ids, 64-bit integers as strings or numbers, enums
as integers, unknown fields ignored) is parsed by protobuf's own JSON parser
into the same message and then takes the same path, so both encodings store
the same events.

The answers are OTLP's: 200 with an Export*ServiceResponse (its
``partial_success`` counts records refused for bad ids or size while the
others were stored), every error a ``google.rpc.Status``, both in the
request's encoding.  The statuses are chosen for what exporters do with them:
they retry 429, 502, 503 and 504 (honouring Retry-After) and drop the rest,
so a full disk is 503 with Retry-After here, not the 507 of /streams/.
"""

from __future__ import annotations

import base64
import logging
import re
import time
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Iterator

import orjson
from google.protobuf import json_format
from google.protobuf.message import Message
from google.rpc.status_pb2 import Status
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2 as logs_service
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2 as metrics_service
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as trace_service
from starlette.concurrency import run_in_threadpool
from starlette.types import Receive, Scope, Send

from storage_c import BatchTooLarge, CometError, Decoded, InvalidOTLP, decode_otlp
from comet.jsonlog import event

from . import auth
from .bodies import decompress, encoding_of
from .errors import HTTPError, errors_answered, storage_error
from .ingest import (EVENTS, INLINE_BODY_BYTES, ClientGone, Head, Ingest, Outcome,
                     check_idempotency_key, read_body, store)
from .metrics import series_of
from .tokens import WRITE

log = logging.getLogger("comet.gateway.otlp")

PROTOBUF = "application/x-protobuf"
JSON = "application/json"


@dataclass(frozen=True)
class Signal:
    name: str
    """logs, traces or metrics: the name storage_c.decode_otlp and the config use."""
    request: type[Message]
    response: type[Message]
    rejected_field: str
    """The partial_success field counting refused records."""
    records: str
    """What the records are called in messages."""


SIGNALS = {
    "/v1/logs": Signal("logs", logs_service.ExportLogsServiceRequest,
                       logs_service.ExportLogsServiceResponse, "rejected_log_records", "log records"),
    "/v1/traces": Signal("traces", trace_service.ExportTraceServiceRequest,
                         trace_service.ExportTraceServiceResponse, "rejected_spans", "spans"),
    "/v1/metrics": Signal("metrics", metrics_service.ExportMetricsServiceRequest,
                          metrics_service.ExportMetricsServiceResponse, "rejected_data_points",
                          "data points"),
}

# google.rpc.Code of each HTTP status the gateway answers.
GRPC_CODES = {400: 3, 401: 16, 403: 7, 404: 5, 405: 12, 409: 8, 413: 8, 415: 3, 429: 8,
              500: 13, 503: 14}


def status_body(exc: HTTPError, media_type: str) -> tuple[bytes, str]:
    status = Status(code=GRPC_CODES.get(exc.status, 2), message=exc.detail)
    if media_type == PROTOBUF:
        return status.SerializeToString(), PROTOBUF
    return json_format.MessageToJson(status, indent=None).encode(), JSON


def retriable(exc: HTTPError, retry_after_s: int) -> HTTPError:
    """The answer an OTLP exporter acts on: it retries only 429, 502, 503 and
    504, so the storage-full 507 of /streams/ becomes 503 with Retry-After."""
    if exc.status == 507:
        return HTTPError(503, exc.code, exc.detail, retry_after=retry_after_s)
    return exc


# ---- the JSON encoding ------------------------------------------------------------------

HEX = re.compile(r"(?:[0-9a-fA-F]{2})*")
IdPath = tuple[tuple[str, ...], tuple[str, ...]]
EXEMPLARS: list[IdPath] = [(("resourceMetrics", "scopeMetrics", "metrics", kind, "dataPoints", "exemplars"),
              ("traceId", "spanId"))
             for kind in ("gauge", "sum", "histogram", "exponentialHistogram")]
# Where OTLP JSON holds trace and span ids: the path of messages down to them, the id fields.
ID_PATHS: dict[str, list[IdPath]] = {
    "logs": [(("resourceLogs", "scopeLogs", "logRecords"), ("traceId", "spanId"))],
    "traces": [(("resourceSpans", "scopeSpans", "spans"), ("traceId", "spanId", "parentSpanId")),
               (("resourceSpans", "scopeSpans", "spans", "links"), ("traceId", "spanId"))],
    "metrics": EXEMPLARS,
}


def snake_case(name: str) -> str:
    """protobuf's JSON parser takes a field's proto name as well as its JSON name."""
    return re.sub(r"[A-Z]", lambda m: "_" + m.group().lower(), name)


def messages_at(node: Any, path: tuple[str, ...]) -> Iterator[dict[str, Any]]:
    if not isinstance(node, dict):
        return
    if not path:
        yield node
        return
    for name in {path[0], snake_case(path[0])}:
        child = node.get(name)
        for item in child if isinstance(child, list) else [child]:
            yield from messages_at(item, path[1:])


def ids_to_base64(signal: Signal, tree: dict[str, Any]) -> None:
    """OTLP JSON writes trace and span ids in hex where protobuf's JSON
    mapping has base64: rewrites them in place, where the messages that
    hold ids are (an unknown field is left alone, to be ignored)."""
    for path, fields in ID_PATHS[signal.name]:
        for message in messages_at(tree, path):
            for name in fields:
                for key in {name, snake_case(name)}:
                    value = message.get(key)
                    if isinstance(value, str):
                        if not HEX.fullmatch(value):
                            raise HTTPError(400, "invalid_otlp", f"{key} {value[:64]!r} is not hex")
                        message[key] = base64.b64encode(bytes.fromhex(value)).decode("ascii")


def json_to_protobuf(signal: Signal, body: bytes | bytearray) -> bytes:
    """An OTLP JSON body as the protobuf bytes of the same request (400 if it
    is not one)."""
    try:
        tree = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise HTTPError(400, "invalid_json", f"the body is not valid JSON: {exc}") from None
    if not isinstance(tree, dict):
        raise HTTPError(400, "invalid_otlp", "an OTLP JSON body is one object")
    try:
        ids_to_base64(signal, tree)
        message = json_format.ParseDict(tree, signal.request(), ignore_unknown_fields=True)
    except RecursionError:
        raise HTTPError(400, "invalid_otlp", "the body nests too deeply") from None
    except (json_format.ParseError, ValueError, TypeError) as exc:
        if "Message too deep" in str(exc):  # else a "Failed to parse ... field: " per level
            raise HTTPError(400, "invalid_otlp", "the body nests too deeply") from None
        raise HTTPError(400, "invalid_otlp", f"the body is not an OTLP {signal.name} request: "
                        f"{exc}") from None
    return bytes(message.SerializeToString())


# ---- the request ------------------------------------------------------------------------

def decode(signal: Signal, media_type: str, encoding: str, body: bytes | bytearray,
           max_decompressed: int, max_event_bytes: int) -> Decoded:
    """Decompresses and decodes one body into its events (on the loop or a thread)."""
    raw = decompress(body, encoding, max_decompressed)
    if media_type == JSON:
        raw = json_to_protobuf(signal, raw)
    try:
        return decode_otlp(signal.name, raw, max_event_bytes, max_decompressed)
    except InvalidOTLP as exc:
        raise HTTPError(400, "invalid_otlp", f"the body is not an OTLP {signal.name} request: "
                        f"{exc}") from None
    except BatchTooLarge as exc:
        raise HTTPError(413, "batch_too_large", str(exc)) from None


def answer(signal: Signal, media_type: str, decoded: Decoded) -> bytes:
    response = signal.response()
    if decoded.rejected:
        partial_success = getattr(response, "partial_success")
        setattr(partial_success, signal.rejected_field, decoded.rejected)
        partial_success.error_message = (f"{decoded.rejected} {signal.records} refused, "
                                         f"the first: {decoded.reason}")
    if media_type == PROTOBUF:
        return bytes(response.SerializeToString())
    return json_format.MessageToJson(response, indent=None).encode()


class OtlpIngest:
    """The three OTLP paths as one plain ASGI application, on the admission,
    storing and accounting of the /streams/ ingest path."""

    def __init__(self, ingest: Ingest) -> None:
        self.ingest = ingest
        self.runtime = ingest.runtime
        self.series = {path: series_of(path, "POST") for path in SIGNALS}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        t0 = time.perf_counter()
        signal = SIGNALS[scope["path"]]
        runtime = self.runtime
        head = Head.parse(scope, runtime.config.otlp_stream(signal.name))
        media_type = head.content_type if head.content_type in (PROTOBUF, JSON) else JSON
        outcome = Outcome()
        headers: dict[str, str] = {}
        try:
            outcome.token = auth.identify(head.authorization, runtime.config, head.authorizations)
            auth.require(outcome.token, runtime.config, WRITE, head.stream)
            body = await self.handle(signal, head, receive, outcome)
            outcome.status = 200
        except HTTPError as exc:
            exc = retriable(exc, runtime.config.retry_after_s)
            outcome.status, headers = exc.status, exc.headers
            runtime.answered(exc, scope)
            body, media_type = status_body(exc, media_type)
        except ClientGone:
            return
        except Exception:  # a bug, not the client's fault: say so, answer (and count) a 500
            event(log, "internal_error", logging.ERROR, exc_info=True, method="POST",
                  path=scope["path"])
            error = HTTPError(500, "internal", "unexpected error; see the gateway's log")
            outcome.status, headers = 500, error.headers
            body, media_type = status_body(error, media_type)
        raw_headers = [(b"content-type", media_type.encode()),
                       (b"content-length", str(len(body)).encode())]
        raw_headers += [(k.lower().encode(), v.encode()) for k, v in headers.items()]
        await send({"type": "http.response.start", "status": outcome.status, "headers": raw_headers})
        await send({"type": "http.response.body", "body": body})
        seconds = time.perf_counter() - t0
        if runtime.metrics is not None:
            runtime.metrics.observe(self.series[scope["path"]], outcome.status, seconds,
                                    outcome.events, head.length or 0)
        if self.ingest.access_log is not None:
            self.ingest.access_log.request(scope["path"], outcome.status, outcome.events, seconds,
                                           runtime.slot, outcome.token, scope.get("client"))

    async def handle(self, signal: Signal, head: Head, receive: Receive, outcome: Outcome) -> bytes:
        ingest = self.ingest
        runtime = self.runtime
        config = runtime.config
        check_idempotency_key(head.idempotency_key)
        ingest.check_ready()
        if head.content_type not in (PROTOBUF, JSON):
            raise HTTPError(415, "unsupported_media_type",
                            f"Content-Type {head.content_type or '(none)'!r} is not accepted on "
                            f"/v1/{signal.name}; use {PROTOBUF} or {JSON}")
        encoding = encoding_of(head.encoding)
        reservation = ingest.reserve(head, outcome.token)
        try:
            body = await read_body(receive, config.max_body_bytes, head.length, reservation)
            offload = (encoding != "identity" or len(body) > INLINE_BODY_BYTES
                       or head.content_type == JSON)
            work: Callable[[], Decoded] = partial(
                decode, signal, head.content_type, encoding, body, config.max_decompressed_bytes,
                config.storage.max_entry_bytes)
            try:
                decoded = await run_in_threadpool(work) if offload else work()
            except CometError as exc:  # out of memory: as the storage errors' table says
                raise storage_error(exc, config.retry_after_s) from None
            if decoded.count:
                work_store = partial(store, runtime, head.stream, EVENTS, decoded.events,
                                     decoded.key, idempotency_key=head.idempotency_key,
                                     token=outcome.token)
                await ingest.store(head.stream, work_store,
                                   offload or config.storage.durability == "always", outcome.token)
        finally:
            reservation.release()
        outcome.events = decoded.count
        return answer(signal, head.content_type, decoded)
