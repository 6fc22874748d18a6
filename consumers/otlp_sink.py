"""Where forwarded OTLP goes: an OTLP/HTTP endpoint (a Collector, Grafana,
Honeycomb, another ``comet serve``...), one export request per POST.

The endpoint is read as ``OTEL_EXPORTER_OTLP_ENDPOINT`` is: a base URL, to
which ``/v1/logs``, ``/v1/traces`` or ``/v1/metrics`` is appended.  Requests
are protobuf (or OTLP/JSON on request), gzip-compressed by default, with the
headers the operator gives (``--header``, ``OTEL_EXPORTER_OTLP_HEADERS``) and
an ``Idempotency-Key`` that names the records they hold.

``send`` answers with what the forwarder must do, as the OTLP specification
and the exporters read a status: a 2xx is delivered (``partial_success``
counted, never retried); connection errors, timeouts, 429, 502, 503 and 504
are retried, after ``Retry-After`` when the answer has one; 500 and the other
5xx too, since a backend's fault passes and the records wait safely in the
log; a redirect too, since it says the endpoint's URL is wrong, not the
batch; any other status (a 4xx, 501, 505) is permanent for the batch.

urllib3 (pooled, thread-safe, already a dependency) is the client: one pool
of ``connections`` to the endpoint, urllib3's own retries and redirects off
(the forwarder decides), TLS verified against the system's or the given CA,
a client certificate for mutual TLS.
"""

from __future__ import annotations

import base64
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Mapping

import orjson
import urllib3
from isal import igzip
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (ExportLogsServiceRequest,
                                                                    ExportLogsServiceResponse)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest, ExportMetricsServiceResponse)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (ExportTraceServiceRequest,
                                                                      ExportTraceServiceResponse)

from comet.backoff import retry_after_s

SIGNAL_PATHS = {"logs": "v1/logs", "traces": "v1/traces", "metrics": "v1/metrics"}
REQUESTS: dict[str, type[Message]] = {"logs": ExportLogsServiceRequest,
                                      "traces": ExportTraceServiceRequest,
                                      "metrics": ExportMetricsServiceRequest}
RESPONSES: dict[str, type[Message]] = {"logs": ExportLogsServiceResponse,
                                       "traces": ExportTraceServiceResponse,
                                       "metrics": ExportMetricsServiceResponse}
REJECTED_FIELD = {"logs": "rejected_log_records", "traces": "rejected_spans",
                  "metrics": "rejected_data_points"}
RETRYABLE = frozenset({429, 502, 503, 504})
PERMANENT_5XX = frozenset({501, 505})
ID_FIELDS = frozenset({"traceId", "spanId", "parentSpanId"})
"""OTLP/JSON writes these bytes as hex, every other bytes field as base64."""
MAX_ANSWER_CHARS = 2000


class EndpointError(ValueError):
    """The endpoint URL or a TLS file cannot be used."""


def signal_url(endpoint: str, signal: str) -> str:
    """``endpoint`` + ``/v1/<signal>``, as OTEL_EXPORTER_OTLP_ENDPOINT is read."""
    parsed = urllib.parse.urlsplit(endpoint)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise EndpointError(f"{endpoint}: an OTLP/HTTP endpoint is an http:// or https:// URL "
                            "with a host, such as http://collector:4318")
    if parsed.query or parsed.fragment:
        raise EndpointError(f"{endpoint}: the endpoint is a base URL, without ?query or #fragment")
    path = parsed.path.rstrip("/")
    return urllib.parse.urlunsplit((parsed.scheme, parsed.netloc, f"{path}/{SIGNAL_PATHS[signal]}",
                                    "", ""))


def parse_headers(text: str) -> dict[str, str]:
    """``OTEL_EXPORTER_OTLP_HEADERS``: ``key1=value1,key2=value2``, values
    percent-decoded (the W3C Baggage format the specification names)."""
    out: dict[str, str] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"header {item.strip()!r} is not NAME=VALUE")
        out[urllib.parse.unquote(name.strip())] = urllib.parse.unquote(value.strip())
    return out


def to_json(signal: str, request: bytes) -> bytes:
    """An export request in OTLP/JSON: lowerCamelCase keys, enums as
    integers, 64-bit integers as strings, trace and span ids as hex."""
    message = REQUESTS[signal].FromString(request)
    doc = MessageToDict(message, use_integers_for_enums=True)
    return bytes(orjson.dumps(_hex_ids(doc)))


def _hex_ids(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: (base64.b64decode(v).hex() if k in ID_FIELDS and isinstance(v, str)
                    else _hex_ids(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [_hex_ids(v) for v in value]
    return value


@dataclass(frozen=True)
class Outcome:
    """What one POST came to."""

    delivered: bool
    retry: bool = False
    """Not delivered, and worth another attempt."""
    status: int = 0
    """The HTTP status (0: no answer)."""
    answer: str = ""
    """The answer's body (or the error), shortened, for logs and dead letters."""
    retry_after_s: float | None = None
    rejected: int = 0
    """partial_success: records the backend refused (not retried)."""
    rejected_message: str = ""

    @property
    def permanent(self) -> bool:
        return not self.delivered and not self.retry

    def describe(self) -> str:
        if self.status:
            return f"HTTP {self.status}: {self.answer}" if self.answer else f"HTTP {self.status}"
        return self.answer


@dataclass(frozen=True)
class OtlpTarget:
    """How to reach the backend."""

    endpoint: str
    signal: str
    encoding: str = "protobuf"
    """"protobuf" (application/x-protobuf) or "json" (application/json)."""
    compression: str = "gzip"
    """"gzip" or "none"."""
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = 10.0
    ca_file: str | None = None
    client_cert: str | None = None
    client_key: str | None = None


class OtlpHttpSink:
    """Posts export requests to one endpoint; thread-safe."""

    def __init__(self, target: OtlpTarget, connections: int = 4) -> None:
        if target.signal not in SIGNAL_PATHS:
            raise ValueError(f"signal {target.signal!r} is not logs, traces or metrics")
        if target.encoding not in ("protobuf", "json"):
            raise ValueError(f"encoding {target.encoding!r} is not protobuf or json")
        if target.compression not in ("gzip", "none"):
            raise ValueError(f"compression {target.compression!r} is not gzip or none")
        if target.client_key and not target.client_cert:
            raise EndpointError("a client key needs its client certificate (--client-cert)")
        self.target = target
        self.url = signal_url(target.endpoint, target.signal)
        content_type = "application/x-protobuf" if target.encoding == "protobuf" else "application/json"
        self.headers = {"User-Agent": "comet-ship", **target.headers, "Content-Type": content_type}
        if target.compression == "gzip":
            self.headers["Content-Encoding"] = "gzip"
        tls: dict[str, Any] = {}
        if self.url.startswith("https:"):
            tls = {"cert_reqs": "CERT_REQUIRED", "ca_certs": target.ca_file,
                   "cert_file": target.client_cert, "key_file": target.client_key}
        try:
            self.pool = urllib3.PoolManager(
                num_pools=2, maxsize=max(1, connections), block=True, retries=False,
                timeout=urllib3.Timeout(total=target.timeout_s), **tls)
        except (OSError, ValueError) as exc:
            raise EndpointError(f"{self.url}: {exc}") from None

    def describe(self) -> str:
        """The endpoint, without credentials (userinfo is dropped)."""
        parsed = urllib.parse.urlsplit(self.url)
        host = parsed.hostname or ""
        netloc = f"[{host}]" if ":" in host else host
        if parsed.port:
            netloc += f":{parsed.port}"
        return urllib.parse.urlunsplit((parsed.scheme, netloc, parsed.path, "", ""))

    def body(self, request: bytes) -> bytes:
        """What goes on the wire for a protobuf export request."""
        data = request if self.target.encoding == "protobuf" else to_json(self.target.signal, request)
        if self.target.compression == "gzip":
            # igzip level 1: zlib's ratio at a sixth of its time
            data = igzip.compress(data, compresslevel=1, mtime=0)
        return data

    def send(self, body: bytes, idempotency_key: str) -> Outcome:
        """One POST of a body ``body()`` made; never raises for the network."""
        headers = dict(self.headers)
        headers["Idempotency-Key"] = idempotency_key
        try:
            answer = self.pool.request("POST", self.url, body=body, headers=headers,
                                       redirect=False, preload_content=True)
        except urllib3.exceptions.HTTPError as exc:
            return Outcome(False, retry=True, answer=_error_text(exc))
        except OSError as exc:
            return Outcome(False, retry=True, answer=f"{type(exc).__name__}: {exc}")
        return self.classify(answer.status, answer.headers, answer.data)

    def classify(self, status: int, headers: Mapping[str, str], data: bytes) -> Outcome:
        text = data[:MAX_ANSWER_CHARS * 4].decode("utf-8", "replace")[:MAX_ANSWER_CHARS]
        if 200 <= status < 300:
            rejected, message = self.partial_success(headers.get("Content-Type", ""), data)
            return Outcome(True, status=status, rejected=rejected, rejected_message=message)
        if 300 <= status < 400:
            # The endpoint's URL is wrong, not the batch: kept and retried, said loudly.
            where = headers.get("Location", "?")
            return Outcome(False, retry=True, status=status,
                           answer=f"redirected to {where}: give comet ship that URL")
        retry = status in RETRYABLE or (status >= 500 and status not in PERMANENT_5XX)
        delay = retry_after_s(headers.get("Retry-After")) if retry else None
        return Outcome(False, retry=retry, status=status, answer=text, retry_after_s=delay)

    def partial_success(self, content_type: str, data: bytes) -> tuple[int, str]:
        """Records refused by a 2xx answer (the specification: not retried)."""
        if not data:
            return 0, ""
        signal = self.target.signal
        try:
            if "json" in content_type:
                doc = orjson.loads(data)
                part = doc.get("partialSuccess") or doc.get("partial_success") or {}
                camel = "".join(w.title() if i else w
                                for i, w in enumerate(REJECTED_FIELD[signal].split("_")))
                count = part.get(camel, part.get(REJECTED_FIELD[signal], 0))
                return int(count or 0), str(part.get("errorMessage", part.get("error_message", "")))
            response: Any = RESPONSES[signal].FromString(data)
            part = response.partial_success
            return int(getattr(part, REJECTED_FIELD[signal])), str(part.error_message)
        except (DecodeError, ValueError, TypeError, AttributeError):
            return 0, ""  # a 2xx is delivered whatever its body says

    def close(self) -> None:
        self.pool.clear()


def _error_text(exc: BaseException) -> str:
    """One line for a failed attempt: the error's class and its own words,
    without urllib3's ``HTTPConnection(host=..., port=...)`` prefix."""
    reason = getattr(exc, "reason", None)
    cause = reason if isinstance(reason, BaseException) and reason is not exc else exc
    text = " ".join(str(cause).split())
    if text.startswith(("HTTPConnection(", "HTTPSConnection(")) and "): " in text:
        text = text.split("): ", 1)[1]
    return f"{type(cause).__name__}: {text}"
