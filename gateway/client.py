"""A producer's client of the gateway that never stores a batch twice (docs/client.md).

Each ``post`` is one batch with one ``Idempotency-Key``: a fresh one per call unless the
caller gives it, and the same on every retry of that call, so that a retry after a lost
answer gets the first answer again instead of a second copy.  Standard library only (orjson
is used when it is installed), so a producer needs nothing but this file.
"""

from __future__ import annotations

import http.client
import json
import random
import ssl
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Mapping, Self
from urllib.parse import quote, urlsplit

try:
    import orjson

    def _encode(event: Any) -> bytes:
        return orjson.dumps(event)
except ImportError:  # the producer's machine may not have it
    def _encode(event: Any) -> bytes:
        return json.dumps(event, separators=(",", ":"), ensure_ascii=False).encode()

NDJSON = "application/x-ndjson"
# Statuses that say "not now": the batch was not stored, the same request may succeed later.
RETRY_STATUSES = frozenset({429, 502, 503, 504, 507})
IN_FLIGHT = "idempotency_key_in_flight"  # 409: the first attempt of the key is still running
BACKOFF_FIRST_S, BACKOFF_MAX_S = 0.1, 5.0
# TLS errors of a connection cut short (a worker killed mid-handshake), not of a refusal.
TLS_CUT_SHORT = (ssl.SSLEOFError, ssl.SSLZeroReturnError, ssl.SSLSyscallError)


@dataclass(frozen=True)
class PostResult:
    """Where the batch is stored: entries ``first``..``last`` of ``shard``.  ``replayed``: a
    retry found the batch already stored (the gateway answered the first answer again)."""

    stream: str
    shard: int
    first: int
    last: int
    count: int
    replayed: bool
    attempts: int
    idempotency_key: str


class CometClientError(Exception):
    """The base of the client's errors."""


class CometHTTPError(CometClientError):
    """An answer no retry can change (400, 401, 403, 404, 413, 415, 422, 500...): nothing was
    stored by this request."""

    def __init__(self, status: int, code: str, detail: str, idempotency_key: str) -> None:
        super().__init__(f"{status} {code}: {detail}")
        self.status, self.code, self.detail = status, code, detail
        self.idempotency_key = idempotency_key


class CometRetriesExhausted(CometClientError):
    """Every attempt failed for a reason a retry may cure; the batch may or may not be stored.
    Post it again with ``idempotency_key`` (within the gateway's duplicate window) to store it
    exactly once."""

    def __init__(self, stream: str, attempts: int, elapsed_s: float, last_failure: str,
                 idempotency_key: str) -> None:
        super().__init__(
            f"POST /streams/{stream}: gave up after {attempts} attempts in {elapsed_s:.1f} s; "
            f"the last failure: {last_failure}. The batch may or may not be stored: post it "
            f"again with idempotency_key={idempotency_key!r} within the duplicate window to "
            f"store it exactly once")
        self.attempts, self.elapsed_s, self.last_failure = attempts, elapsed_s, last_failure
        self.idempotency_key = idempotency_key


class _Retry(Exception):
    """One attempt failed in a way a retry may cure; ``wait_s``: the server's Retry-After."""

    def __init__(self, why: str, wait_s: float | None = None) -> None:
        super().__init__(why)
        self.wait_s = wait_s


class CometClient:
    """Posts batches of events to a gateway at ``url`` (``http://host:port`` or
    ``https://...``, optionally with a path prefix) over one keep-alive connection, opened
    again after a failure.  Calls from several threads take turns (a lock); for parallel
    requests give each thread a client of its own.

    ``timeout``: seconds for connecting and for each read of the answer.  A call gives up
    after ``max_attempts`` attempts or once a wait would end later than ``max_retry_s`` after
    its first attempt.  TLS: ``ssl_context``, or ``cafile`` (the CA that signed the gateway's
    certificate) and ``certfile``/``keyfile`` (the client's own, for mutual TLS)."""

    def __init__(self, url: str, token: str | None = None, *, timeout: float = 10.0,
                 max_attempts: int = 10, max_retry_s: float = 60.0,
                 ssl_context: ssl.SSLContext | None = None, cafile: str | None = None,
                 certfile: str | None = None, keyfile: str | None = None) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url {url!r}: expected http://host[:port] or https://host[:port]")
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self.host, self.port = parts.hostname, parts.port
        self.prefix = parts.path.rstrip("/")
        self.timeout, self.max_attempts, self.max_retry_s = timeout, max_attempts, max_retry_s
        self._auth = {"Authorization": f"Bearer {token}"} if token is not None else {}
        self._tls: ssl.SSLContext | None = None
        if parts.scheme == "https":
            self._tls = ssl_context or ssl.create_default_context(cafile=cafile)
            if ssl_context is None and certfile is not None:
                self._tls.load_cert_chain(certfile, keyfile)
        self._conn: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()

    def post(self, stream: str, events: list[Any] | bytes, *, content_type: str | None = None,
             key: str | None = None, idempotency_key: str | None = None) -> PostResult:
        """Stores ``events`` as one batch, exactly once: a list is sent as NDJSON (one JSON
        value per line), bytes as they are with ``content_type`` (NDJSON by default).  ``key``
        routes by key (``X-Comet-Key``).  Raises CometHTTPError for an answer no retry can
        change, CometRetriesExhausted when the retries ran out."""
        if isinstance(events, list):
            if content_type not in (None, NDJSON):
                raise ValueError(f"a list is sent as {NDJSON}; pass bytes for {content_type}")
            body = b"\n".join(_encode(e) for e in events)
        else:
            body = bytes(events)
        ikey = idempotency_key if idempotency_key is not None else uuid.uuid4().hex
        if not 1 <= len(ikey) <= 255 or not all(" " < c <= "~" for c in ikey):
            raise ValueError("idempotency_key: 1 to 255 printable ASCII characters")
        headers: dict[str, str | bytes] = {**self._auth, "Content-Type": content_type or NDJSON,
                                           "Idempotency-Key": ikey}
        if key is not None:
            headers["X-Comet-Key"] = key.encode()
        path = f"{self.prefix}/streams/{quote(stream, safe='')}"
        with self._lock:
            start = time.monotonic()  # after any wait for the lock: the budget is this call's
            for attempt in range(1, self.max_attempts + 1):
                try:
                    return self._attempt(path, body, headers, attempt, ikey)
                except _Retry as failure:
                    wait = failure.wait_s if failure.wait_s is not None else _backoff(attempt)
                    elapsed = time.monotonic() - start
                    if attempt == self.max_attempts or elapsed + wait > self.max_retry_s:
                        raise CometRetriesExhausted(stream, attempt, elapsed, str(failure),
                                                    ikey) from None
                    time.sleep(wait)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _attempt(self, path: str, body: bytes, headers: Mapping[str, str | bytes],
                 attempt: int, ikey: str) -> PostResult:
        try:
            conn = self._connection()
            conn.request("POST", path, body=body, headers=dict(headers))
            answer = conn.getresponse()
            data = answer.read()
        except (OSError, http.client.HTTPException) as exc:  # no answer: stored or not
            self.close()
            if isinstance(exc, ssl.SSLError) and not isinstance(exc, TLS_CUT_SHORT):
                raise  # a certificate refused by either side: no retry will change it
            raise _Retry(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
        if answer.will_close:
            self.close()
        status = answer.status
        if 200 <= status < 300:
            got = json.loads(data)
            return PostResult(str(got["stream"]), int(got["shard"]), int(got["first"]),
                              int(got["last"]), int(got["count"]),
                              answer.getheader("Idempotent-Replayed", "").lower() == "true",
                              attempt, ikey)
        code, detail = _error_of(data)
        if status in RETRY_STATUSES or (status == 409 and code == IN_FLIGHT):
            raise _Retry(f"{status} {code}: {detail}", _retry_after(answer.getheader("Retry-After")))
        raise CometHTTPError(status, code, detail, ikey)

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            if self._tls is not None:
                self._conn = http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout,
                                                         context=self._tls)
            else:
                self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        return self._conn

    def close(self) -> None:
        """Closes the connection (the next post opens one again)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _backoff(attempt: int) -> float:
    """0.1 s doubling to 5 s, each drawn from its upper half: clients that failed together
    do not all come back at once.  The rule of ``comet.backoff.backoff_delay``, written out
    because a producer may copy this one file (tests/test_backoff.py holds the two equal)."""
    ceiling = min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2 ** (attempt - 1))
    return random.uniform(ceiling / 2, ceiling)


def _retry_after(value: str | None) -> float | None:
    """Retry-After in seconds; None when absent or an HTTP date (then the backoff applies)."""
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def _error_of(data: bytes) -> tuple[str, str]:
    """The gateway's ``{"error", "detail"}``; a body of someone else (a proxy) as text."""
    try:
        got = json.loads(data)
        return str(got["error"]), str(got.get("detail", ""))
    except (ValueError, KeyError, TypeError):
        return "", data[:300].decode("utf-8", "replace")
