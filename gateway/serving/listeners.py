"""Closing a worker's listening sockets without resetting a connection the
kernel has already completed (Linux: /proc and a socket filter).

``master_holds`` tells a reload (the gunicorn master keeps the socket: what
is queued there waits for the next workers) from the final stop;
``refuse_new_connections`` makes the kernel drop new handshakes, so that the
queue stops growing; ``take_queued`` accepts what is queued and closes.
"""

from __future__ import annotations

import ctypes
import os
import socket
import struct
import sys
from typing import Iterable, Protocol


class Closable(Protocol):
    def close(self) -> None: ...


def master_holds(listener: socket.socket) -> bool:
    """Whether the gunicorn master still has this listening socket open (a
    reload, a single worker's restart) - not the final stop, nor a dead master."""
    try:
        target = f"socket:[{os.fstat(listener.fileno()).st_ino}]"
        fds = f"/proc/{os.getppid()}/fd"
        for name in os.listdir(fds):
            try:
                if os.readlink(f"{fds}/{name}") == target:
                    return True
            except OSError:
                continue
    except OSError:
        return True  # cannot tell (no /proc): do not touch a socket others may use
    return False


SO_ATTACH_FILTER = 26
# Classic BPF on a TCP socket sees the TCP header: drop segments with SYN set
# (new connections), pass the rest (handshakes under way, established ones).
_DROP_SYN = [(0x30, 0, 0, 13),            # ldb [13]        flags byte
             (0x45, 1, 0, 0x02),          # jset #SYN       -> drop
             (0x06, 0, 0, 0xFFFFFFFF),    # ret #-1         pass
             (0x06, 0, 0, 0)]             # ret #0          drop
_filter_code = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *i) for i in _DROP_SYN))


def refuse_new_connections(listener: socket.socket) -> bool:
    """Attaches the SYN-dropping filter to a listening TCP socket (Linux)."""
    if sys.platform != "linux" or listener.family not in (socket.AF_INET, socket.AF_INET6):
        return False
    prog = struct.pack("HL", len(_DROP_SYN), ctypes.addressof(_filter_code))
    try:
        listener.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, prog)
    except OSError:
        return False
    return True


def take_queued(listeners: list[socket.socket], servers: Iterable[Closable]) -> list[socket.socket]:
    """Closes ``servers`` (which stops accepting on ``listeners``) and returns
    the connections that were queued.  A duplicate of each listener is the
    last descriptor closed, right after the accept() that found its queue
    empty."""
    dups = []
    for listener in listeners:
        try:
            dups.append(socket.socket(fileno=os.dup(listener.fileno())))
        except OSError:
            pass
    for server in servers:
        server.close()
    accepted: list[socket.socket] = []
    for dup in dups:
        try:
            dup.setblocking(False)
            while True:
                conn, _ = dup.accept()
                accepted.append(conn)
        except OSError:  # BlockingIOError: the queue is empty
            pass
        finally:
            dup.close()
    return accepted
