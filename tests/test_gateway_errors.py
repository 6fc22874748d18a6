"""One table maps the storage's errors to HTTP answers (gateway/errors.py):
every exception class of storage_c has a row of its own, and each row gives
a JSON error body with Retry-After exactly when it says so."""

from __future__ import annotations

import orjson
import pytest

import storage_c
from gateway.errors import STORAGE_ERRORS, storage_error
from storage_c import CometError


def every_storage_error() -> list[type[CometError]]:
    """CometError and every subclass of it that storage_c defines, at any depth."""
    found: list[type[CometError]] = []
    todo = [CometError]
    while todo:
        cls = todo.pop()
        if cls.__module__.split(".")[0] == "storage_c":
            found.append(cls)
        todo.extend(cls.__subclasses__())
    return sorted(set(found), key=lambda cls: cls.__name__)


def test_every_storage_error_has_a_row_of_its_own() -> None:
    classes = every_storage_error()
    assert len(classes) > 20  # the walk found them
    unmapped = [cls.__name__ for cls in classes if cls not in STORAGE_ERRORS]
    assert not unmapped, f"add these to gateway.errors.STORAGE_ERRORS: {unmapped}"
    public = {getattr(storage_c, name) for name in storage_c.__all__}
    assert set(STORAGE_ERRORS) <= public | {CometError}


@pytest.mark.parametrize("cls", every_storage_error(), ids=lambda cls: cls.__name__)
def test_each_row_is_an_error_body(cls: type[CometError]) -> None:
    row = STORAGE_ERRORS[cls]
    answer = storage_error(cls("what went wrong"), retry_after_s=3)
    assert (answer.status, answer.code) == (row.status, row.code)
    assert 400 <= answer.status < 600
    assert orjson.loads(answer.body()) == {"error": row.code, "detail": "what went wrong"}
    response = answer.response()
    assert response.status_code == row.status
    assert response.headers["content-type"] == "application/json"
    assert response.headers.get("retry-after") == ("3" if row.retry else None)


def test_a_subclass_without_a_row_is_answered_as_its_nearest_base() -> None:
    class Unforeseen(storage_c.StreamNotFound):
        pass

    assert storage_error(Unforeseen("gone"), 1).code == "unknown_stream"
