"""Networks that fail a client on purpose (tests/test_client.py): ``ScriptedServer``, an HTTP
server in a thread answering each request as its script says (a status with headers, a reset,
no answer until released) and recording what it was sent; ``DroppingProxy``, a TCP proxy in
front of a real gateway that forwards requests but drops the first answers (a lost answer:
the batch is stored, the client hears nothing)."""

from __future__ import annotations

import http.server
import socket
import ssl
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Self

from .server import HOST


def reset(sock: socket.socket) -> None:
    """Closes ``sock`` with a TCP reset (RST), as a crashed peer does, not an orderly FIN."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()


@dataclass
class Step:
    """One answer: ``status`` with ``headers`` and ``body``; or ``reset`` (close the connection
    with RST, no answer); or ``hang`` (answer nothing until the server is closed)."""

    status: int = 202
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b'{"stream":"s","shard":3,"first":10,"last":11,"count":2}'
    reset: bool = False
    hang: bool = False
    lost: bool = False
    """The request was taken (a backend stores it), then the connection is reset: a lost answer."""


OK = Step()


@dataclass
class Seen:
    at: float                  # monotonic, when its body was read
    path: str
    headers: dict[str, str]    # names in lower case
    body: bytes


class Quiet(http.server.ThreadingHTTPServer):
    """Connections the script resets or a client drops are not errors to print."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


class ScriptedServer:
    """Answers request n with ``script[n]`` (the last step once the script runs out), or
    with what ``script(seen)`` returns for each request; over TLS with ``tls``."""

    def __init__(self, script: list[Step] | Callable[[Seen], Step],
                 tls: ssl.SSLContext | None = None) -> None:
        self.script = script
        self.seen: list[Seen] = []
        self.released = threading.Event()    # ends every hanging answer
        self._lock = threading.Lock()
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the gateway

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                seen = Seen(time.monotonic(), self.path,
                            {k.lower(): v for k, v in self.headers.items()}, body)
                with owner._lock:
                    owner.seen.append(seen)
                    owner.changed.notify_all()
                    if not callable(owner.script):
                        step = owner.script[min(len(owner.seen), len(owner.script)) - 1]
                if callable(owner.script):  # outside the lock: it may wait
                    step = owner.script(seen)
                    with owner._lock:
                        owner.changed.notify_all()
                if step.hang:
                    owner.released.wait(30)
                if step.reset or step.hang or step.lost:
                    self.close_connection = True
                    reset(self.connection)
                    return
                self.send_response(step.status)
                for name, value in {"Content-Type": "application/json", **step.headers}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(step.body)))
                self.end_headers()
                self.wfile.write(step.body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.changed = threading.Condition(self._lock)
        self.httpd = Quiet((HOST, 0), Handler)
        self.httpd.daemon_threads = True
        self.scheme = "http"
        if tls is not None:
            self.scheme = "https"
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"{self.scheme}://{HOST}:{self.httpd.server_address[1]}"

    def wait_for(self, done: Callable[[list[Seen]], bool], timeout: float = 60) -> None:
        """Returns once ``done(seen)`` holds for the requests seen so far."""
        with self.changed:
            assert self.changed.wait_for(lambda: done(self.seen), timeout), \
                f"not within {timeout} s: {len(self.seen)} requests seen"

    def keys(self) -> list[str | None]:
        return [s.headers.get("idempotency-key") for s in self.seen]

    def close(self) -> None:
        self.released.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class DroppingProxy:
    """Forwards connections to ``port`` of 127.0.0.1; the first ``drop`` answers of the
    upstream are not passed on: once the upstream starts answering, both sides are reset."""

    def __init__(self, port: int, drop: int = 1) -> None:
        self.upstream, self.drop = port, drop
        self.dropped = 0
        self.listener = socket.create_server((HOST, 0))
        self._lock = threading.Lock()
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.listener.getsockname()[1]}"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection((HOST, self.upstream))
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, answers: bool) -> None:
        try:
            while data := src.recv(65536):
                if answers:
                    with self._lock:
                        lose = self.dropped < self.drop
                        self.dropped += lose
                    if lose:  # the gateway answered: the client never hears it
                        for sock in (dst, src):  # shutdown wakes the other pump's recv
                            sock.shutdown(socket.SHUT_RDWR)
                            reset(sock)
                        return
                dst.sendall(data)
        except OSError:
            pass
        for sock in (src, dst):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        src.close()  # each socket is the source of one pump

    def close(self) -> None:
        self._stop.set()
        self.listener.close()

    def __enter__(self) -> DroppingProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
