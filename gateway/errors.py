"""HTTP errors of the gateway: every one is JSON ``{"error": code, "detail": text}``."""

from __future__ import annotations

import orjson
from starlette.responses import Response


class HTTPError(Exception):
    """Raised by handlers; turned into a JSON response by the app."""

    def __init__(self, status: int, code: str, detail: str, *, retry_after: int | None = None,
                 headers: dict[str, str] | None = None, extra: dict[str, object] | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.extra = extra or {}
        self.headers = dict(headers or {})
        if retry_after is not None:
            self.headers["Retry-After"] = str(retry_after)


def error_response(status: int, code: str, detail: str, headers: dict[str, str] | None = None,
                   extra: dict[str, object] | None = None) -> Response:
    body = {"error": code, "detail": detail, **(extra or {})}
    return Response(orjson.dumps(body), status_code=status, media_type="application/json",
                    headers=headers)


def error_body(exc: HTTPError) -> bytes:
    return orjson.dumps({"error": exc.code, "detail": exc.detail, **exc.extra})


def response_for(exc: HTTPError) -> Response:
    return error_response(exc.status, exc.code, exc.detail, exc.headers, exc.extra)
