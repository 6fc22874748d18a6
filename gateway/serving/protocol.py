"""The HTTP protocol of `comet serve`'s workers: uvicorn's httptools protocol,
made to never drop a request it has received, and never reset a connection.

Stock uvicorn 0.54 (``uvicorn/protocols/http/httptools_impl.py``,
``uvicorn/server.py``) loses requests in these places:

* Graceful stop: ``Server.shutdown`` (server.py:281-292) calls every
  connection's ``shutdown()`` (httptools_impl.py:349-356), which closes at
  once, with ``transport.close()``, every connection whose request has not
  been parsed yet (``cycle is None`` or its response complete): just
  accepted, idle between keep-alive requests, or with the request's bytes
  still in the kernel's receive buffer.  Closing a socket with unread input
  makes the kernel send an RST, and bytes that arrive after the close get
  one too: the client sees a reset or an empty reply (curl 56/52) for a
  request it sent.  A connection accepted after that loop ran was never told
  to drain at all.  On every HUP reload and TERM.
* Every close is a full ``close()``: after a ``Connection: close`` response
  (RequestResponseCycle.send, :559-560), at the keep-alive timeout
  (:370-376), after the 400 (:206-220).  If the client had sent anything the
  server did not read, the RST can destroy the response just written, so a
  stored event goes unanswered.
* A parse error (``data_received``, :170-179 -> ``send_400_response``)
  writes the 400 and closes at once, even while an earlier request of the
  connection is still being answered.  A Content-Length shorter than the
  body makes the rest look like a second, broken request: the client gets
  "400 Invalid HTTP request received." while its event was stored.
* ``eof_received`` (:135) lets the transport close on the client's
  half-close, before the answer to its complete request is written.
* On the final stop the gunicorn master closes its listening socket
  (arbiter.py ``stop``) and each worker's ``server.close()`` closes its copy:
  the last close resets every connection still in the accept queue, whose
  clients have already sent their requests.

Stock uvicorn also sets no limit on a request's head and no deadline on any
phase of a connection: one header line of 64 MiB is parsed (its value
concatenated piece by piece, in time quadratic in its length), a connection
that sends nothing, or a byte every few seconds, is kept for ever, and a
worker accepts connections until its file limit, where every client fails
alike.

``CometHttpProtocol`` fixes those at the connection level:

* close = lingering close: write what is buffered, send FIN
  (``write_eof``), keep reading and discarding input until the client closes
  or ``LINGER_S`` passes; only then close the socket (nothing unread, no RST);
* an idle connection is only closed when nothing is waiting in its receive
  buffer (a request that has already arrived is read and answered instead);
* draining (graceful stop): a request in progress is answered with
  ``Connection: close`` (the newest request received is the last one; the
  ones pipelined before it are answered first); an idle connection, and one
  accepted during the stop, gets ``DRAIN_GRACE_S`` to send a request, which
  is served and answered with ``Connection: close``; a request whose head
  has started arriving gets up to ``PARTIAL_REQUEST_S``;
* a parse error waits for the answers to the requests received before the
  bad bytes, then writes the 400 and closes (lingering);
* a client that half-closes after its request still gets the answer;
* limits on every phase (gateway.limits.Limits): a head above
  ``max_header_bytes`` or with more than ``max_headers`` fields is answered
  431 as soon as it passes the limit (the parser is fed a head in slices of
  HEAD_SLICE bytes, so no more than that is parsed beyond it); a head not
  complete ``header_timeout_s`` after its first byte, or a body slower than
  ``body_timeout_s`` plus one second per ``body_min_rate`` bytes, is answered
  408 (a body's request gets ``http.disconnect``: nothing is stored); a
  connection is closed after ``idle_timeout_s`` without a request under way,
  before its first request as after an answer; and a worker keeps at most
  ``max_connections``: the next one closes the connection idle the longest
  (or one stuck in its head), or is answered 503 when every one is serving a
  request.  Every refusal is counted and logged (gateway.limits.Refusals);
  these answers are JSON like the app's: ``{"error", "detail"}``.

The listening sockets are gateway.serving.worker.CometServer's part.

What is left is inherent to HTTP/1.1 keep-alive: a client that sends a
request on an idle connection at the very moment the server decides to close
it (the idle grace or the keep-alive timeout expires while the request's
bytes are still on the wire, so the receive buffer looks empty) gets our FIN
and no answer; the request is read and discarded, never stored.  The window
is the one-way network latency (microseconds on loopback) and only opens on
a connection idle for ``DRAIN_GRACE_S`` (draining) or the keep-alive
timeout (5 s).  Clients close it by checking for the server's FIN before
reusing an idle connection (urllib3 does) or by retrying a request that got
no status.  On the final stop, a handshake slower than
``CometServer.HANDSHAKE_S`` can still be reset (see gateway/serving/worker.py).
"""


from __future__ import annotations

import asyncio
import select
import time
from dataclasses import dataclass
from typing import Any, cast

import httptools
import orjson
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle

from ..limits import Limits

DRAIN_GRACE_S = 1.0        # draining: how long an idle or new connection may take to send a request
PARTIAL_REQUEST_S = 10.0   # draining: how long a request whose head has started may take to finish it
LINGER_S = 2.0             # after our FIN: how long to read and discard before closing anyway
IDLE_LINGER_S = 0.5        # the same when nothing was answered since the last close decision
RECHECK_S = 0.05           # an idle close found input waiting: look again after this
HEAD_SLICE = 4096          # a head is parsed this much at a time: its size is known to within this
HEAD = "head"
BODY = "body"


@dataclass(frozen=True)
class Refusal:
    """An answer the protocol writes itself, then closes: ``reason`` is what
    gateway.limits.Refusals counts (None: the parser's own 400)."""

    status: int
    code: str
    detail: str
    reason: str | None = None


class HeadRefused(Exception):
    """Raised in a parser callback to stop the parser (the refusal is already set)."""


class _Transport:
    """What the protocol and its request cycles see as their transport: the
    real one, except that ``close()`` is a lingering close, and that a
    response's head can be held back to go out with its body in one write
    (``hold``/``release``, used by ``CometCycle``)."""

    def __init__(self, transport: asyncio.Transport, protocol: CometHttpProtocol) -> None:
        self._transport = transport
        self._protocol = protocol
        self._held: list[bytes] | None = None
        self.pause_reading = transport.pause_reading
        self.resume_reading = transport.resume_reading
        self.get_extra_info = transport.get_extra_info

    def write(self, data: bytes) -> None:
        if self._held is not None:
            self._held.append(data)
        else:
            self._transport.write(data)

    def hold(self) -> None:
        """Writes wait until ``release``."""
        if self._held is None:
            self._held = []

    def release(self) -> None:
        held, self._held = self._held, None
        if held and not self._transport.is_closing():
            self._transport.write(b"".join(held))

    def close(self) -> None:
        self.release()
        self._protocol.close_gracefully()

    def is_closing(self) -> bool:
        return self._protocol.closing or self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class CometCycle(RequestResponseCycle):
    """uvicorn's request cycle, whose response head goes out with the first
    part of its body: one write(2) per small response instead of two (the
    second write was about a tenth of a single-event request's CPU)."""

    async def send(self, message: Any) -> None:
        transport = cast(_Transport, self.transport)  # CometHttpProtocol gives every cycle one
        if message["type"] == "http.response.start" and not self.response_started:
            transport.hold()
            try:
                await super().send(message)
            except BaseException:
                transport.release()
                raise
            return
        try:
            await super().send(message)
        finally:
            transport.release()


class CometHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with lingering closes, a graceful drain
    that answers what it received, and 400s that wait their turn."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.raw: asyncio.Transport | None = None
        self.closing = False            # our FIN is sent (or the socket is closed)
        self.draining = False           # graceful stop: the newest request is the last
        self.eof = False                # the client half-closed: it sends nothing more
        self.error: Refusal | None = None  # to write once the earlier requests are answered
        self.discard = False            # the parser failed: input is read and dropped
        self.in_message = False         # a request has begun and its head is not complete
        self.running: RequestResponseCycle | None = None
        self.drain_started = 0.0
        self.drain_timer: asyncio.TimerHandle | None = None
        self.linger_timer: asyncio.TimerHandle | None = None
        self.limits: Limits = getattr(self.server_state, "limits", None) or Limits()
        self.timeout_keep_alive = self.limits.idle_timeout_s  # type: ignore[assignment]  # call_later takes a float
        self.refusal: Refusal | None = None  # set by a parser callback that stopped the parser
        self.used = False                   # a request has begun on this connection
        self.idle_since = 0.0               # loop time it last had no request under way
        self.in_body = False                # a request's head is complete and its body is not
        self.body_received = 0
        self.head_fed = 0                   # bytes fed to the parser since this head began (to a slice)
        self.phase: str | None = None       # HEAD or BODY while its deadline runs
        self.phase_started = 0.0
        self.deadline_timer: asyncio.TimerHandle | None = None
        self.deadline_timer_at = 0.0

    # ---- connection events -----------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # uvicorn narrows it
        self.raw = transport
        super().connection_made(_Transport(transport, self))  # type: ignore[arg-type]  # a Transport's stand-in
        self.idle_since = self.loop.time()
        if len(self.connections) > self.limits.max_connections:
            self._make_room()
            if self.closing:
                return
        if getattr(self.server_state, "draining", False):  # accepted after the stop began
            self.shutdown()
        else:  # the keep-alive timer, before the first request as after each answer
            self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive,
                                                                self.timeout_keep_alive_handler)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self._cancel(drain=True, linger=True, deadline=True)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.closing or self.discard:
            return  # after our FIN or a parse error: read and drop, so that closing sends no RST
        self._cancel(drain=True)
        self._unset_keepalive_if_required()
        try:
            self._feed(data)
        except httptools.HttpParserUpgrade:
            self._unsupported_upgrade_warning()  # no WebSocket here: the rest is not parsed
        except httptools.HttpParserError:
            if self.refusal is None:
                msg = "Invalid HTTP request received."
                self.logger.warning(msg)
                self.send_400_response(msg)
                return
        if self.refusal is not None:
            refusal, self.refusal = self.refusal, None
            self.refuse(refusal)
            return
        if self.draining and not self.closing and not self.discard and self._idle():
            self._arm_drain_timer(self._grace())  # part of a request head (or nothing yet)

    def _feed(self, data: bytes) -> None:
        """Parses ``data``: a body's bytes at once, a head's HEAD_SLICE at a time,
        stopping (with ``refusal`` set) once the head passes max_header_bytes."""
        parser = self.parser
        limit = self.limits.max_header_bytes
        if len(data) <= HEAD_SLICE and not self.in_body:  # nearly every request: one piece
            parser.feed_data(data)
            if self.in_message:
                self.head_fed += len(data)
                if self.head_fed > limit:
                    self._head_too_large()
            return
        view = memoryview(data)
        while view and self.refusal is None and not self.discard and self.parser is not None:
            if self.in_body:  # to the body's end when its length is known: a head after it is counted
                length = _content_length(self.headers)
                n = len(view) if length is None else max(1, length - self.body_received)
            else:
                n = HEAD_SLICE
            piece = view[:n]
            parser.feed_data(piece)
            if self.in_message:
                self.head_fed += len(piece)
                if self.head_fed > limit:
                    self._head_too_large()
            view = view[len(piece):]

    def _head_too_large(self) -> None:
        self.refusal = Refusal(431, "header_too_large",
                               f"the request line and headers are larger than max_header_bytes "
                               f"({self.limits.max_header_bytes})", "header_too_large")

    # uvicorn declares None; asyncio.Protocol allows a bool (True: keep the transport open)
    def eof_received(self) -> bool | None:  # type: ignore[override]  # see above
        if self.closing:
            return None  # the client closed after our FIN: close now
        self.eof = True
        newest = self.cycle
        if newest is not None and newest.more_body and not newest.response_complete:
            self._drop(newest)  # its body will never be complete
        if self._idle():
            if self.error is not None:
                self._send_error()
            return None  # nothing to answer: close
        self._last_request_is_newest()
        return True  # keep the transport open to write the answers

    # ---- parser callbacks ------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.in_message = True
        self.used = True
        self.head_fed = 0
        self._deadline(HEAD)
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        # Counted here, not per field: max_header_bytes already bounds how many there can be.
        if len(self.headers) > self.limits.max_headers:
            self.refusal = Refusal(431, "too_many_headers", f"the request has more than "
                                   f"max_headers ({self.limits.max_headers}) header fields",
                                   "too_many_headers")
            raise HeadRefused()
        previous = self.cycle
        super().on_headers_complete()
        self.in_message = False
        self.in_body = True
        self.body_received = 0
        self._deadline(BODY)
        cycle = self.cycle
        if cycle is previous or not (self.draining or self.eof):
            return
        # Draining: this request becomes the last one of the connection.
        if previous is not None and not previous.response_complete and not previous.disconnected:
            if previous.response_started and not previous.keep_alive:
                # "Connection: close" is already on its way: this request is not served.
                self._drop(cycle)
                self.discard = True
                return
            if not previous.response_started:
                previous.keep_alive = getattr(previous, "client_keep_alive", previous.keep_alive)
        cycle.client_keep_alive = cycle.keep_alive  # type: ignore[attr-defined]  # ours, read by getattr
        cycle.keep_alive = False

    def on_body(self, body: bytes) -> None:
        self.body_received += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        self.in_message = False
        self.in_body = False
        self.phase = None
        super().on_message_complete()

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        self.running = cycle
        # uvicorn builds its own RequestResponseCycle (on_headers_complete); the
        # task has not run yet, so it finds CometCycle's send.
        cycle.__class__ = CometCycle
        super()._start_asgi_task(cycle, app)

    def on_response_complete(self) -> None:
        self.idle_since = self.loop.time()
        super().on_response_complete()  # starts the next pipelined request, or arms keep-alive
        if self.closing or self.raw is None or self.raw.is_closing() or not self._idle():
            return
        if self.error is not None:
            self._send_error()
        elif self.eof:
            self.close_gracefully()
        elif self.draining:
            self._arm_drain_timer()

    # ---- errors ----------------------------------------------------------------------

    def send_400_response(self, msg: str) -> None:
        """Called by ``data_received`` when the parser fails."""
        self.refuse(Refusal(400, "", msg))

    def refuse(self, refusal: Refusal) -> None:
        """Answers ``refusal`` and closes; the requests received in full before
        the bad bytes are answered first."""
        self.discard = True  # the parser is dead or done with; whatever follows is dropped
        self.in_message = False
        self.phase = None
        newest = self.cycle
        if newest is not None and newest.more_body and not newest.response_complete:
            self._drop(newest)  # the refusal is inside this request: it is never complete
        if refusal.reason is not None:
            self.limits.refusals.refused(refusal.reason, self.client, status=refusal.status)
        self.error = refusal
        if self._idle():
            self._send_error()

    def _send_error(self) -> None:
        refusal, self.error = self.error, None
        if refusal is None or self.closing:
            return
        if not refusal.code:
            super().send_400_response(refusal.detail)  # writes it, then closes (gracefully)
            return
        body = orjson.dumps({"error": refusal.code, "detail": refusal.detail})
        content = [STATUS_LINE[refusal.status]]
        for name, value in self.server_state.default_headers:
            content += [name, b": ", value, b"\r\n"]
        content += [b"content-type: application/json\r\ncontent-length: ", str(len(body)).encode(),
                    b"\r\nconnection: close\r\n",
                    b"retry-after: 1\r\n" if refusal.status == 503 else b"", b"\r\n", body]
        self.transport.write(b"".join(content))
        self.transport.close()

    def _drop(self, cycle: RequestResponseCycle) -> None:
        """A request that will not be served: never started, or its app gets
        http.disconnect (its body is incomplete, so nothing was stored)."""
        self.pipeline = type(self.pipeline)(item for item in self.pipeline if item[0] is not cycle)
        if not cycle.response_started:
            cycle.disconnected = True
            cycle.message_event.set()

    # ---- draining and closing --------------------------------------------------------

    def shutdown(self) -> None:
        """Graceful stop (uvicorn's Server.shutdown, or accepted after it)."""
        if self.draining:
            return
        self.draining = True
        self.drain_started = time.monotonic()
        if not self.closing:
            self._last_request_is_newest()

    def _last_request_is_newest(self) -> None:
        if self._idle():
            if self.eof:
                self.close_gracefully()
            else:
                self._arm_drain_timer()
            return
        newest = self.cycle
        if newest is not None and not newest.response_started:
            newest.client_keep_alive = newest.keep_alive  # type: ignore[attr-defined]  # as above
            newest.keep_alive = False
        # else its response is being written with keep-alive: on_response_complete
        # finds the connection idle and starts the grace from there.

    def _idle(self) -> bool:
        """No request received and not yet answered."""
        running = self.running
        return not self.pipeline and (running is None or running.response_complete or running.disconnected)

    def _arm_drain_timer(self, delay: float = DRAIN_GRACE_S) -> None:
        self._cancel(drain=True)
        self.drain_timer = self.loop.call_later(delay, self._drain_timer_fired)

    def _grace(self) -> float:
        """How long an idle draining connection may stay silent: DRAIN_GRACE_S,
        and while a request head is arriving, up to PARTIAL_REQUEST_S in all."""
        if not self.in_message:
            return DRAIN_GRACE_S
        return max(0.0, min(DRAIN_GRACE_S, self.drain_started + PARTIAL_REQUEST_S - time.monotonic()))

    def _drain_timer_fired(self) -> None:
        self.drain_timer = None
        if self.closing or not self._idle():
            return
        if self.in_message and self._grace() > 0:  # its head has started arriving: give it longer
            self._arm_drain_timer(self._grace())
            return
        self._close_idle()

    def timeout_keep_alive_handler(self) -> None:
        self.timeout_keep_alive_task = None
        if not self.closing and self._idle() and not self.in_message:
            self._close_idle()
            if self.closing and not self.used:
                self.limits.refusals.refused("idle_connection", self.client, status=None)

    # ---- deadlines and the connection budget -----------------------------------------

    def _deadline(self, phase: str) -> None:
        """``phase`` (HEAD or BODY) starts now; one timer per connection checks it."""
        self.phase = phase
        self.phase_started = now = self.loop.time()
        at = now + (self.limits.header_timeout_s if phase == HEAD else self.limits.body_timeout_s)
        if self.deadline_timer is None or at < self.deadline_timer_at:
            self._arm_deadline(at)

    def _arm_deadline(self, at: float) -> None:
        self._cancel(deadline=True)
        self.deadline_timer_at = at
        self.deadline_timer = self.loop.call_at(at, self._deadline_fired)

    def _deadline_at(self) -> float:
        limits = self.limits
        if self.phase == HEAD:
            return self.phase_started + limits.header_timeout_s
        return self.phase_started + limits.body_timeout_s + self.body_received / limits.body_min_rate

    def _deadline_fired(self) -> None:
        self.deadline_timer = None
        if self.phase is None or self.closing or self.discard:
            return
        now = self.loop.time()
        if self.flow is not None and self.flow.read_paused:
            # We stopped reading (a pipelined request waits its turn, or the app has
            # not taken the body so far): the client cannot be late meanwhile.
            self.phase_started = now - (self.body_received / self.limits.body_min_rate
                                        if self.phase == BODY else 0.0)
        at = self._deadline_at()
        if now < at:
            self._arm_deadline(at)
            return
        if self.phase == HEAD:
            self.refuse(Refusal(408, "header_timeout", "the request's headers did not arrive within "
                                f"header_timeout_s ({self.limits.header_timeout_s:g} s)",
                                "header_timeout"))
            return
        cycle = self.cycle
        if cycle is not None and cycle.response_started:  # answered already (a 413): just close
            self.limits.refusals.refused("body_timeout", self.client, status=None)
            self.discard = True
            self.close_gracefully()
            return
        self.refuse(Refusal(408, "body_timeout", f"the body arrived slower than body_timeout_s "
                            f"({self.limits.body_timeout_s:g} s) and body_min_rate "
                            f"({self.limits.body_min_rate} bytes/s) allow; nothing was stored",
                            "body_timeout"))

    def _make_room(self) -> None:
        """Over max_connections: closes the connection idle the longest (one
        that never sent a request first), else one stuck in its head, else
        answers this one 503."""
        best: tuple[int, float] | None = None
        victim: CometHttpProtocol | None = None
        for other in self.connections:
            if other is self or not isinstance(other, CometHttpProtocol) or other.closing:
                continue
            rank = other._eviction_rank()
            if rank is not None and (best is None or rank < best):
                best, victim = rank, other
        if victim is None:
            self.refuse(Refusal(503, "too_many_connections", "this worker serves max_connections "
                                f"({self.limits.max_connections}) connections; retry later",
                                "connection_limit"))
            return
        self.limits.refusals.refused("connection_limit", victim.client, status=None)
        # Closed at once, not lingering: a flood of new connections must not pile
        # up half-closed ones, whose descriptors count against the file limit too.
        victim.closing = victim.discard = True
        victim._cancel(drain=True, linger=True, deadline=True)
        victim._unset_keepalive_if_required()
        if victim.raw is not None:
            victim.raw.close()

    def _eviction_rank(self) -> tuple[int, float] | None:
        """How readily this connection gives way to a new one (lowest first),
        None when it is serving a request."""
        if self.in_body or not self._idle():
            return None
        if self.in_message:
            return (2, self.phase_started)
        return (0 if not self.used else 1, self.idle_since)

    def _close_idle(self) -> None:
        if self._input_waiting():
            # A request (or the client's EOF) has arrived and is not read yet:
            # read it rather than close on it.  data_received/eof_received come next.
            if self.draining:
                self._arm_drain_timer(RECHECK_S)
            else:
                self.timeout_keep_alive_task = self.loop.call_later(RECHECK_S, self.timeout_keep_alive_handler)
            return
        self.close_gracefully(IDLE_LINGER_S)  # only bytes already on the wire can follow

    def _input_waiting(self) -> bool:
        sock = self.raw.get_extra_info("socket") if self.raw is not None else None
        if sock is None:
            return False
        try:
            readable, _, _ = select.select([sock.fileno()], [], [], 0)
        except (OSError, ValueError):
            return False
        return bool(readable)

    def close_gracefully(self, linger: float = LINGER_S) -> None:
        """A lingering close: flush, FIN, read and drop until the client
        closes (or ``linger`` s), then close.  The socket is never closed with
        input unread, so the kernel sends no RST over our last response."""
        if self.closing:
            return
        self.closing = True
        self._cancel(drain=True)
        self._unset_keepalive_if_required()
        raw = self.raw
        if raw is None or raw.is_closing():
            return
        try:
            if raw.can_write_eof():
                raw.write_eof()  # after what is buffered
                raw.resume_reading()
                self.linger_timer = self.loop.call_later(linger, self._linger_expired)
                return
        except (OSError, RuntimeError):
            pass
        raw.close()

    def _linger_expired(self) -> None:
        self.linger_timer = None
        raw = self.raw
        if raw is None or raw.is_closing():
            return
        if raw.get_write_buffer_size():
            raw.abort()  # the client reads nothing: do not wait for it forever
        else:
            raw.close()

    def _cancel(self, drain: bool = False, linger: bool = False, deadline: bool = False) -> None:
        if deadline and self.deadline_timer is not None:
            self.deadline_timer.cancel()
            self.deadline_timer = None
        if drain and self.drain_timer is not None:
            self.drain_timer.cancel()
            self.drain_timer = None
        if linger and self.linger_timer is not None:
            self.linger_timer.cancel()
            self.linger_timer = None


def _content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    """The body length a request's headers declare (None: chunked, or none given)."""
    length = None
    for name, value in headers:
        if name == b"transfer-encoding":
            return None
        if name == b"content-length" and value.isdigit():
            length = int(value)
    return length
