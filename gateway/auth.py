"""Bearer tokens and the scope a route needs.

Tokens are off by default on a loopback bind and required otherwise (unless
explicitly turned off).  401 when no bearer token is given; 403 ``forbidden``
when the token is not one of the configured ones, or when it lacks the scope
the route needs: the detail names the token (its name, never its secret), the
scope and the stream.

Each route of gateway.routes.TABLE declares its ``Rule`` (``SCOPES`` there;
the docs' table is checked against it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .config import GatewayConfig
from .errors import HTTPError, check_name
from .tokens import ADMIN, READ, Token

OPEN = "open"
TOKEN = "token"
PATH = "{name}"
ANY = "any"
OTLP = "otlp"


@dataclass(frozen=True)
class Rule:
    """What a route needs: ``scope`` (open: nothing; token: any accepted token;
    read, write, admin) and, for read and write, on which stream: the path's
    ({name}), any stream (the token has at least one pattern), or the
    configured OTLP stream of the route's signal (otlp)."""

    scope: str
    stream: str = ""

    def describe(self) -> str:
        if self.scope == OPEN:
            return "none (no token needed)"
        if self.scope == TOKEN:
            return "any accepted token"
        if self.scope == ADMIN:
            return "admin"
        if self.stream == ANY:
            return f"{self.scope} on any stream"
        if self.stream == OTLP:
            return f"{self.scope} on the configured OTLP stream"
        return f"{self.scope} on {self.stream}"


class AuthFailed(HTTPError):
    """401 (no bearer token) or 403 (a token that is not accepted).  The answer
    closes the connection: a client guessing tokens pays a new connection (and
    TLS handshake) per guess; each failure is counted and logged
    (Runtime.answered)."""


def identify(header: str, config: GatewayConfig, count: int = 1) -> Token | None:
    """The token of an ``Authorization`` header (``count``: how many the request
    has): None when auth is off, else 401 without a bearer token or with two
    headers, and 403 for one that is not accepted."""
    if not config.auth_required:
        return None
    scheme, _, secret = header.partition(" ")
    secret = secret.strip()
    if count > 1:
        raise AuthFailed(401, "unauthorized", f"send one 'Authorization: Bearer <token>' header, "
                         f"not {count}", headers={"WWW-Authenticate": "Bearer", "Connection": "close"})
    if scheme.lower() != "bearer" or not secret:
        raise AuthFailed(401, "unauthorized", "send 'Authorization: Bearer <token>'",
                         headers={"WWW-Authenticate": "Bearer", "Connection": "close"})
    token = config.access.identify(secret.encode())
    if token is None:
        raise AuthFailed(403, "forbidden", "this token is not accepted", headers={"Connection": "close"})
    return token


def require(token: Token | None, config: GatewayConfig, scope: str, stream: str | None) -> None:
    """403 unless ``token`` may ``scope`` ``stream`` (None: any stream); a
    token of None (auth off) may do everything."""
    if token is None or scope in (OPEN, TOKEN):
        return
    if scope == ADMIN:
        if not token.admin:
            raise HTTPError(403, "forbidden", f"token {token.name!r} lacks admin (the stream and "
                            "consumer group life cycle)")
    elif stream is None:
        if not token.patterns(scope):
            raise HTTPError(403, "forbidden", f"token {token.name!r} lacks {scope} on any stream")
    elif not config.access.allows(token, scope, stream):
        check_name(stream)  # a bad name is a 400 of its own, whoever asks
        raise HTTPError(403, "forbidden", f"token {token.name!r} lacks {scope} on stream {stream!r}")


def readable(token: Token | None, config: GatewayConfig) -> Callable[[str], bool]:
    """Whether the token may read a stream (every stream when auth is off)."""
    if token is None:
        return lambda stream: True
    return lambda stream: config.access.allows(token, READ, stream)


def stream_of(rule: Rule, path_params: dict[str, object]) -> str | None:
    """The stream a request of a guarded route is about (None: any)."""
    return str(path_params["name"]) if rule.stream == PATH else None
