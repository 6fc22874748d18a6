"""Bearer tokens: off by default on a loopback bind, required otherwise
(unless explicitly turned off).  401 when no bearer token is given, 403 when
the token is not one of the configured ones."""

from __future__ import annotations

import hmac

from starlette.requests import Request

from .config import GatewayConfig
from .errors import HTTPError

OPEN_PATHS = ("/healthz", "/readyz")


def check(request: Request, config: GatewayConfig) -> None:
    if request.url.path not in OPEN_PATHS:
        check_header(request.headers.get("authorization", ""), config)


def check_header(header: str, config: GatewayConfig) -> None:
    if not config.auth_required:
        return
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise HTTPError(401, "unauthorized", "send 'Authorization: Bearer <token>'",
                        headers={"WWW-Authenticate": "Bearer"})
    given = token.strip().encode()
    if not any(hmac.compare_digest(given, t.encode()) for t in config.tokens):
        raise HTTPError(403, "forbidden", "this token is not accepted")
