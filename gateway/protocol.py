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
* a client that half-closes after its request still gets the answer.

The listening sockets are gateway.worker.CometServer's part.

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
``CometServer.HANDSHAKE_S`` can still be reset (see gateway/worker.py).
"""


from __future__ import annotations

import asyncio
import select
import time
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

DRAIN_GRACE_S = 1.0        # draining: how long an idle or new connection may take to send a request
PARTIAL_REQUEST_S = 10.0   # draining: how long a request whose head has started may take to finish it
LINGER_S = 2.0             # after our FIN: how long to read and discard before closing anyway
IDLE_LINGER_S = 0.5        # the same when nothing was answered since the last close decision
RECHECK_S = 0.05           # an idle close found input waiting: look again after this


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
        self.error: str | None = None   # a 400 to write once the earlier requests are answered
        self.discard = False            # the parser failed: input is read and dropped
        self.in_message = False         # a request has begun and its head is not complete
        self.running: RequestResponseCycle | None = None
        self.drain_started = 0.0
        self.drain_timer: asyncio.TimerHandle | None = None
        self.linger_timer: asyncio.TimerHandle | None = None

    # ---- connection events -----------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # uvicorn narrows it
        self.raw = transport
        super().connection_made(_Transport(transport, self))  # type: ignore[arg-type]  # a Transport's stand-in
        if getattr(self.server_state, "draining", False):  # accepted after the stop began
            self.shutdown()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self._cancel(drain=True, linger=True)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.closing or self.discard:
            return  # after our FIN or a parse error: read and drop, so that closing sends no RST
        self._cancel(drain=True)
        super().data_received(data)
        if self.draining and not self.closing and not self.discard and self._idle():
            self._arm_drain_timer(self._grace())  # part of a request head (or nothing yet)

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
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        previous = self.cycle
        super().on_headers_complete()
        self.in_message = False
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

    def on_message_complete(self) -> None:
        self.in_message = False
        super().on_message_complete()

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        self.running = cycle
        # uvicorn builds its own RequestResponseCycle (on_headers_complete); the
        # task has not run yet, so it finds CometCycle's send.
        cycle.__class__ = CometCycle
        super()._start_asgi_task(cycle, app)

    def on_response_complete(self) -> None:
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
        """Called by ``data_received`` when the parser fails: the requests
        received in full before the bad bytes are answered first."""
        self.discard = True  # the parser is dead; whatever follows is dropped
        self.in_message = False
        newest = self.cycle
        if newest is not None and newest.more_body and not newest.response_complete:
            self._drop(newest)  # the bad bytes are inside this request: it is never complete
        self.error = msg
        if self._idle():
            self._send_error()

    def _send_error(self) -> None:
        msg, self.error = self.error, None
        if msg is not None and not self.closing:
            super().send_400_response(msg)  # writes it, then closes (gracefully)

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

    def _cancel(self, drain: bool = False, linger: bool = False) -> None:
        if drain and self.drain_timer is not None:
            self.drain_timer.cancel()
            self.drain_timer = None
        if linger and self.linger_timer is not None:
            self.linger_timer.cancel()
            self.linger_timer = None
