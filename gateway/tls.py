"""TLS on the listener: the certificate, key and client CA, read once per
configuration load, and the server SSLContext built from those bytes.

The master reads the files when it loads its configuration (at start and on
every HUP) and checks that the pair loads; each worker builds its context
from the bytes the master read, never from the files.  A renewal is then
picked up whole at the next HUP, and a renewal half-written when the HUP
comes (a key that does not match its certificate, a truncated file) is
refused by the master, which keeps the running configuration, instead of
failing every new worker.

OpenSSL loads a certificate chain and key only from a path: the bytes are
handed to it through anonymous memory files (memfd), closed right after.

A handshake that fails (no client certificate where mutual TLS wants one, a
client CA the gateway does not trust, a TLS version below the floor) sends
the client OpenSSL's alert before the connection closes
(``AlertingSSLObject``), so that the client reports why, not an empty reply.

TLS 1.2 connections get only AEAD suites with forward secrecy (no CBC); every
failed handshake is also reported to ``handshake_failures``: the event loops
drop it without a word (asyncio and uvloop log it only in debug mode).
"""

from __future__ import annotations

import os
import ssl
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

TLS_FLOOR = ssl.TLSVersion.TLSv1_2
TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"
"""TLS 1.2 suites: ECDHE key exchange, AES-GCM or ChaCha20-Poly1305 (TLS 1.3's are all AEAD)."""


class HandshakeFailures:
    """Where refused handshakes are reported: ``refusals`` (gateway.limits.Refusals,
    set by the worker) counts and logs them; None: nowhere."""

    refusals: Any = None

    def failed(self, exc: ssl.SSLError) -> None:
        if self.refusals is not None:
            reason = exc.reason or type(exc).__name__
            self.refusals.refused("tls_handshake", None, cause=reason, error=reason,
                                  detail=getattr(exc, "verify_message", None) or str(exc))


handshake_failures = HandshakeFailures()


class TlsError(ValueError):
    """A file that cannot be read, or a certificate, key or CA that does not load."""


@dataclass(frozen=True)
class TlsMaterial:
    """What a worker's SSLContext is built from: PEM bytes, and the files they came from."""

    cert: bytes
    key: bytes
    client_ca: bytes | None
    cert_file: str
    key_file: str
    client_ca_file: str

    def __repr__(self) -> str:  # never the key in a log line or a traceback
        return (f"TlsMaterial(cert_file={self.cert_file!r}, key_file={self.key_file!r}, "
                f"client_ca_file={self.client_ca_file!r})")

    def context(self) -> ssl.SSLContext:
        """The server context: TLS 1.2 or later, and with a client CA, a client
        certificate signed by it required at the handshake."""
        ctx = AlertingContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = TLS_FLOOR
        ctx.set_ciphers(TLS12_CIPHERS)
        with ExitStack() as files:
            cert = files.enter_context(_memory_file("comet-tls-cert", self.cert))
            key = files.enter_context(_memory_file("comet-tls-key", self.key))
            try:
                ctx.load_cert_chain(cert, key)
            except ssl.SSLError as exc:
                raise TlsError(f"certificate {self.cert_file} and key {self.key_file} do not "
                               f"load as a pair: {exc.reason or exc}") from None
        if self.client_ca is not None:
            try:
                ctx.load_verify_locations(cadata=self.client_ca.decode("ascii", "replace"))
            except (ssl.SSLError, ValueError) as exc:
                raise TlsError(f"client CA {self.client_ca_file} does not load: {exc}") from None
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    def certificate(self) -> dict[str, Any]:
        """The listener's certificate as the ssl module decodes one
        (``serialNumber``, ``notAfter``, ``subject``...), for log lines; empty
        where this Python cannot decode it."""
        decode = getattr(getattr(ssl, "_ssl", None), "_test_decode_cert", None)
        if decode is None:
            return {}
        with _memory_file("comet-tls-cert", self.cert) as path:
            try:
                return dict(decode(path))
            except (ssl.SSLError, ValueError):
                return {}


class AlertingSSLObject(ssl.SSLObject):
    """An SSLObject whose failed handshake is reported (handshake_failures),
    and first lets its alert out.

    The event loops' TLS layers (asyncio's and uvloop's alike) close the
    connection as soon as ``do_handshake`` raises, before they send what
    OpenSSL wrote meanwhile: the alert saying why (``certificate required``,
    ``unknown ca``...).  The client then sees an empty reply or a reset.  So
    a failure that left bytes to send is first reported as "want read", on
    which the layers send them and wait; the next call, when the client
    answers or closes, raises the failure itself.  A failure with nothing to
    send (plain HTTP on the TLS port) is raised at once."""

    outgoing: ssl.MemoryBIO | None = None
    _failure: ssl.SSLError | None = None

    def do_handshake(self) -> None:
        if self._failure is not None:
            raise self._failure
        try:
            super().do_handshake()
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            raise
        except ssl.SSLError as exc:
            handshake_failures.failed(exc)
            if self.outgoing is None or not self.outgoing.pending:
                raise
            self._failure = exc
            raise ssl.SSLWantReadError("the handshake failed: its alert goes out first") from None


class AlertingContext(ssl.SSLContext):
    """A server context whose TLS objects are AlertingSSLObjects, each told
    where its outgoing bytes wait."""

    sslobject_class = AlertingSSLObject

    def wrap_bio(self, incoming: ssl.MemoryBIO, outgoing: ssl.MemoryBIO, *args: Any,
                 **kwargs: Any) -> ssl.SSLObject:
        wrapped = super().wrap_bio(incoming, outgoing, *args, **kwargs)
        if isinstance(wrapped, AlertingSSLObject):
            wrapped.outgoing = outgoing
        return wrapped


def read_material(cert_file: str, key_file: str, client_ca_file: str) -> TlsMaterial | None:
    """The files' contents, checked by building a context once; None when TLS
    is off (no certificate and no key)."""
    if not cert_file and not key_file:
        if client_ca_file:
            raise TlsError("tls_client_ca_file is set but tls_cert_file and tls_key_file are not: "
                           "mutual TLS needs TLS")
        return None
    if not cert_file or not key_file:
        given, missing = ("tls_cert_file", "tls_key_file") if cert_file else ("tls_key_file", "tls_cert_file")
        raise TlsError(f"{given} is set but {missing} is not: set both, or neither")
    material = TlsMaterial(cert=_read(cert_file, "tls_cert_file"), key=_read(key_file, "tls_key_file"),
                           client_ca=_read(client_ca_file, "tls_client_ca_file") if client_ca_file else None,
                           cert_file=cert_file, key_file=key_file, client_ca_file=client_ca_file)
    material.context()
    return material


def _read(path: str, setting: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise TlsError(f"{setting} {path} cannot be read: {exc.strerror or exc}") from None


class _memory_file:
    """``data`` in an anonymous memory file; its path while the block runs."""

    def __init__(self, name: str, data: bytes) -> None:
        self.fd = os.memfd_create(name)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self.fd, view):]
        except BaseException:
            os.close(self.fd)
            raise

    def __enter__(self) -> str:
        return f"/proc/self/fd/{self.fd}"

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)
