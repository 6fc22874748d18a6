"""The one-run lock of an S3 lake: a lease object written with conditional PUTs.

``_comet/locks/<stream>/<group>.lock`` is created with ``If-None-Match: *``
(the store refuses it with 412 when it exists), holds who took it and until
when, and is renewed by a thread every third of ``LEASE_S`` with
``If-Match: <its ETag>``.  A run killed with the lock leaves the object:
once its lease has run out, the next run takes it over, again with
``If-Match`` on the ETag it read, so of two runs taking over at once one
wins.  Released by a DELETE at the end of the run.

A store that ignores the conditions would let two runs both "create" the
lock.  So the lock is probed once taken: a second ``If-None-Match: *`` PUT
of it must be refused.  Where it is not (OpenStack Swift's s3api, for one),
the run is refused unless the user promised one writer
(``--single-writer``): Delta commits on such a store are not safe against
a second writer either.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from typing import Any, Iterator

from .lakefs import Lake, LakeError
from .lock import LakeBusy, busy_message, holder_text, lock_rel

LEASE_S = 120.0


class NoConditionalWrites(LakeError):
    """The object store ignores If-None-Match: it cannot enforce one writer."""


def _client(lake: Lake) -> Any:
    import boto3
    from botocore.config import Config

    kwargs: dict[str, Any] = {"region_name": lake.region_name(),
                              "config": Config(connect_timeout=5, read_timeout=60,
                                               retries={"max_attempts": 3})}
    if lake.endpoint():
        kwargs["endpoint_url"] = lake.endpoint()
    if lake.access_key:
        kwargs.update(aws_access_key_id=lake.access_key, aws_secret_access_key=lake.secret_key,
                      aws_session_token=lake.session_token)
    return boto3.client("s3", **kwargs)


def _status(exc: Exception) -> int:
    return int(getattr(exc, "response", {}).get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def _body(stream: str, group: str) -> bytes:
    doc = json.loads(holder_text(stream, group))
    doc["expires"] = time.time() + LEASE_S
    return json.dumps(doc).encode()


@contextlib.contextmanager
def s3_lease(lake: Lake, stream: str, group: str, single_writer: bool = False) -> Iterator[None]:
    from botocore.exceptions import ClientError

    s3 = _client(lake)
    bucket, _, prefix = lake.root.partition("/")
    key = f"{prefix}/{lock_rel(stream, group)}" if prefix else lock_rel(stream, group)
    body = _body(stream, group)
    try:
        etag = s3.put_object(Bucket=bucket, Key=key, Body=body, IfNoneMatch="*")["ETag"]
    except ClientError as exc:
        if _status(exc) not in (409, 412):
            raise
        etag = _take_over(s3, bucket, key, lake, stream, group)
    try:
        if not single_writer:
            _probe(s3, bucket, key, body, lake)
        stop = threading.Event()
        renewer = threading.Thread(target=_renew, args=(s3, bucket, key, etag, stream, group, stop),
                                   name="comet-lake-lease", daemon=True)
        renewer.start()
        try:
            yield
        finally:
            stop.set()
            renewer.join()
    finally:
        with contextlib.suppress(ClientError):
            s3.delete_object(Bucket=bucket, Key=key)


def _take_over(s3: Any, bucket: str, key: str, lake: Lake, stream: str, group: str) -> str:
    from botocore.exceptions import ClientError

    held = s3.get_object(Bucket=bucket, Key=key)
    text = held["Body"].read()
    try:
        expires = float(json.loads(text)["expires"])
    except (ValueError, KeyError, TypeError):
        expires = 0.0
    if expires > time.time():
        raise LakeBusy(busy_message(lake, stream, group, text))
    try:
        return str(s3.put_object(Bucket=bucket, Key=key, Body=_body(stream, group),
                                 IfMatch=held["ETag"])["ETag"])
    except ClientError as exc:
        if _status(exc) in (409, 412):
            raise LakeBusy(busy_message(lake, stream, group, text)) from None
        raise


def _probe(s3: Any, bucket: str, key: str, body: bytes, lake: Lake) -> None:
    from botocore.exceptions import ClientError

    try:
        s3.put_object(Bucket=bucket, Key=key, Body=body, IfNoneMatch="*")
    except ClientError as exc:
        if _status(exc) in (409, 412):
            return
        raise
    raise NoConditionalWrites(
        f"lake {lake.url}: the object store ignores conditional writes (If-None-Match), so it "
        "cannot keep a second spark-ship (or a second Delta writer) out; if only one process "
        "ever ships into this lake, say so with --single-writer")


def _renew(s3: Any, bucket: str, key: str, etag: str, stream: str, group: str,
           stop: threading.Event) -> None:
    from botocore.exceptions import ClientError

    while not stop.wait(LEASE_S / 3):
        try:
            etag = s3.put_object(Bucket=bucket, Key=key, Body=_body(stream, group),
                                 IfMatch=etag)["ETag"]
        except ClientError:
            return  # taken over or gone: the commit's app transaction still guards the run
