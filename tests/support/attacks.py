"""What the tests of issue 39 do to a gateway as an attacker would: raw
connections that say too much, too slowly or nothing, and the measures of
what that cost the worker (its memory, the answers other clients got)."""

from __future__ import annotations

import select
import socket
import ssl
import time
from pathlib import Path

from .server import ServerProcess


def rss_kib(pid: int) -> int:
    """The resident memory of process ``pid`` in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise LookupError(f"no VmRSS for {pid}")


def workers_rss_kib(server: ServerProcess) -> dict[int, int]:
    return {pid: rss_kib(pid) for pid in server.worker_pids()}


def response_of(sock: socket.socket, timeout: float = 30) -> tuple[int, bytes]:
    """The status and body of the one answer the server writes before it
    closes (0 and b"" when it closes without one); a reset counts as a close."""
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (ConnectionResetError, BrokenPipeError):
        pass
    if not data:
        return 0, b""
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def closed_within(sock: socket.socket, seconds: float) -> float:
    """Seconds until the server closed ``sock`` (which sends nothing); fails after ``seconds``."""
    t0 = time.monotonic()
    sock.settimeout(seconds)
    try:
        while sock.recv(65536):
            pass
    except (ConnectionResetError, BrokenPipeError):
        pass
    return time.monotonic() - t0


def send_slowly(sock: socket.socket, data: bytes, every_s: float, until: float,
                until_answered: bool = False) -> None:
    """One byte of ``data`` every ``every_s`` until it is sent, ``until`` (monotonic)
    passes, the server closes, or (``until_answered``) its answer starts to arrive."""
    for i in range(len(data)):
        if time.monotonic() > until:
            return
        try:
            sock.sendall(data[i:i + 1])
        except OSError:
            return
        if until_answered:
            if _readable(sock, every_s):
                return
        else:
            time.sleep(every_s)


def trickle_then_answer(sock: socket.socket, data: bytes, every_s: float, until: float,
                        timeout: float = 30) -> tuple[int, bytes]:
    """send_slowly until the server answers, then the answer (response_of).  One
    thread: an SSL socket must not be written by one thread while another reads it
    (OpenSSL's objects are not shared)."""
    deadline = time.monotonic() + timeout
    send_slowly(sock, data, every_s, until, until_answered=True)
    return response_of(sock, max(0.1, deadline - time.monotonic()))


def _readable(sock: socket.socket, wait_s: float) -> bool:
    if isinstance(sock, ssl.SSLSocket) and sock.pending():
        return True
    readable, _, _ = select.select([sock], [], [], wait_s)
    return bool(readable)


def post_json(server: ServerProcess, stream: str, token: str | None = None,
              timeout: float = 10) -> int:
    """The status of one small JSON POST on a new connection (0: no answer)."""
    headers = {"content-type": "application/json"}
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    try:
        return server.request("POST", f"/streams/{stream}", b'{"n":1}', headers, timeout=timeout)[0]
    except OSError:
        return 0
