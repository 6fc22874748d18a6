"""The access log: one JSON line per ingest request on stdout, in the shape
of every other log line (comet.jsonlog): ts, level, logger, event, then
the request's fields, "client": the address the request came from (a
trusted proxy's X-Forwarded-For, see forwarded_allow_ips), and "token": the
name of the request's token (absent when auth is off or no token was accepted).  It is formatted here, not by the logging module,
because it is written once per request (see AccessLog)."""

from __future__ import annotations

import asyncio
import os
import select
import time
from typing import Any

import orjson

from .errors import clipped
from .tokens import Token

# Writes of at most PIPE_BUF bytes to a pipe are atomic: lines from several
# workers sharing stdout never interleave.
PIPE_BUF = select.PIPE_BUF

LOGGER = "comet.gateway.access"
# Every field of a line is bounded (a path by errors.clipped, a token's name by its 64
# characters), so that a line stays well within PIPE_BUF.
REQUEST_LINE = (b'{"ts":%d.%06d,"level":"info","logger":"' + LOGGER.encode() + b'",'
                b'"event":"request","method":"POST","path":%b,"status":%d,"events":%d,'
                b'"ms":%.3f,"slot":%b,"client":%b%b}\n')

# How many requests wait for their lines at most: ~180 bytes each, so that one
# batch usually fits one PIPE_BUF write.
BATCH_LINES = 22


class AccessLog:
    """The access log, batched: a request costs a tuple append, and its line is
    formatted and written with the others at most ``interval`` seconds later
    (or once BATCH_LINES are waiting, and at shutdown, by ``flush``), in writes
    of at most PIPE_BUF bytes that end on a line.  Formatting a line per request
    in between the request's own work cost a live worker three to four times
    what the same formatting costs in a loop (measured with py-spy: 4.5 % of a
    worker's samples); one write(2) per request cost about a sixth of a
    single-event request.  A kill -9 loses at most ``interval`` of access lines."""

    def __init__(self, fd: int = 1, interval: float = 0.2) -> None:
        self.fd = fd
        self.interval = interval
        self.pending: list[tuple[str, int, int, float, int | None, int, Token | None, Any]] = []
        self.paths: dict[str, bytes] = {}  # path -> its JSON string (a few streams, many requests)
        self.clients: dict[str, bytes] = {}  # client address -> its JSON string
        self.tokens: dict[str, bytes] = {}  # token name -> its "token" field
        self._timer: asyncio.TimerHandle | None = None

    def request(self, path: str, status: int, events: int, seconds: float, slot: int | None,
                token: Token | None = None, client: Any = None) -> None:
        """One ingest request; its line is written with the batch.  ``client`` is the
        ASGI scope's: (address, port), or None."""
        self.pending.append((path, status, events, seconds, slot, time.time_ns(), token, client))
        if len(self.pending) >= BATCH_LINES:
            self.flush()
        elif self._timer is None:
            self._arm()

    def _arm(self) -> None:
        try:
            self._timer = asyncio.get_running_loop().call_later(self.interval, self._tick)
        except RuntimeError:  # no loop (a caller outside the server): write now
            self.flush()

    def _tick(self) -> None:
        self._timer = None
        self.flush()

    def _line(self, path: str, status: int, events: int, seconds: float, slot: int | None,
              ts_ns: int, token: Token | None, client: Any) -> bytes:
        address = client[0] if client else None
        named = b""
        if token is not None:
            named = self.tokens.get(token.name, b"")
            if not named:
                named = self.tokens[token.name] = b',"token":' + orjson.dumps(token.name)
        second, ns = divmod(ts_ns, 1_000_000_000)
        return REQUEST_LINE % (second, ns // 1000, _quoted(self.paths, clipped(path)), status, events,
                               seconds * 1000, b"null" if slot is None else b"%d" % slot,
                               b"null" if address is None else _quoted(self.clients, str(address)),
                               named)

    def flush(self) -> None:
        pending, self.pending = self.pending, []
        chunk = bytearray()
        for record in pending:
            line = self._line(*record)
            if len(chunk) + len(line) > PIPE_BUF:
                self._write(bytes(chunk))
                chunk.clear()
            chunk += line
        if chunk:
            self._write(bytes(chunk))

    def _write(self, data: bytes) -> None:
        while data:
            try:
                data = data[os.write(self.fd, data):]
            except InterruptedError:
                continue
            except OSError:  # stdout gone: nothing to log to
                return


def _quoted(cache: dict[str, bytes], text: str) -> bytes:
    """``text`` as a JSON string, remembered for the next line (the first 1000 texts)."""
    quoted = cache.get(text)
    if quoted is None:
        quoted = orjson.dumps(text)
        if len(cache) < 1000:
            cache[text] = quoted
    return quoted
