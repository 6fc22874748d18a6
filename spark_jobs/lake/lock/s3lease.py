"""The one-run lock of an S3 lake: a lease object written with conditional PUTs.

``_comet/locks/<stream>/<group>.lock`` is created with ``If-None-Match: *``
(the store refuses it with 412 when it exists), says who holds it and for
how long (``lease_s``), and is renewed by a thread every third of that with
``If-Match: <its ETag>``.  A run killed with the lock leaves the object:
once its lease has run out, the next run takes it over, again with
``If-Match`` on the ETag it read, so of two runs taking over at once one
wins.  Whether a lease has run out is judged on the store's clock (the
object's ``Last-Modified`` against the ``Date`` of the answer), so the
clocks of the hosts that ship do not matter.  Released at the end of the
run by a DELETE, unless another run has taken it over meanwhile.

Stores without conditional writes cannot keep a second writer out, and
neither can delta-rs's commits on them.  Some refuse the headers (OpenStack
Swift 2.30's s3api: 501 NotImplemented), some might ignore them: the run
first writes a probe object of its own twice with ``If-None-Match: *``,
and the second write must be refused.  Where it is not, the run is refused
unless the user promised one writer (``Lake.single_writer``,
``--single-writer``); then a store that refuses the conditions gets a lock
written with plain PUTs: it still turns away a second run started while
the first one's lease is live, but two started at the same moment could
both take it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any, Iterator

from botocore.exceptions import ClientError

from comet.objectstore import boto3_client_for
from comet.jsonlog import event

from ..lakefs import Lake, LakeError
from .holder import LakeBusy, busy_message, holder_text, lock_rel

log = logging.getLogger("comet.lake")

LEASE_S = 120.0
"""How long a lease lasts unless renewed: a killed run's lock is free after
that.  Read when a lease is taken (tests shorten it)."""
TAKE_ATTEMPTS = 5
"""Rounds of create / read / take over, when the lock keeps changing hands."""
_LOST = (404, 409, 412)
"""Answers to a conditional write meaning "not as you last saw it"."""


class NoConditionalWrites(LakeError):
    """The object store does not honour If-None-Match: it cannot keep a second writer out."""


@contextlib.contextmanager
def s3_lease(lake: Lake, stream: str, group: str) -> Iterator[None]:
    """Holds the shipper's lease for the block, or raises LakeBusy or NoConditionalWrites."""
    lease = _Lease(lake, stream, group)
    lease.acquire()
    try:
        yield
    finally:
        lease.release()


@dataclass
class _Held:
    """The lock object as read: its text, ETag, and whether its lease has run out."""

    text: bytes
    etag: str
    expired: bool


class _Lease:
    def __init__(self, lake: Lake, stream: str, group: str) -> None:
        self.lake, self.stream, self.group = lake, stream, group
        self.s3 = boto3_client_for(lake.store())
        self.bucket, _, prefix = lake.root.partition("/")
        rel = lock_rel(stream, group)
        self.key = f"{prefix}/{rel}" if prefix else rel
        self.lease_s = LEASE_S
        self.holder = {**json.loads(holder_text(stream, group)), "lease_s": self.lease_s}
        self.etag = ""
        self.conditional = True
        """False: a single-writer lake on a store that refuses conditional writes."""
        self.stop = threading.Event()
        self.renewer: threading.Thread | None = None

    # ---- taking it ----------------------------------------------------------------------

    def acquire(self) -> None:
        if not self.lake.single_writer:
            self._probe()
        self.etag = self._take()
        self.renewer = threading.Thread(target=self._renew, name="comet-lake-lease", daemon=True)
        self.renewer.start()

    def _take(self) -> str:
        text = b""
        for _ in range(TAKE_ATTEMPTS):
            try:
                return self._put(IfNoneMatch="*")
            except ClientError as exc:
                if _refuses_conditions(exc):
                    if not self.lake.single_writer:
                        raise self._no_conditional_writes() from None
                    self.conditional = False
                    return self._take_unconditionally()
                if _status(exc) not in (409, 412):
                    raise
            held = self._read()
            if held is None:
                continue  # released meanwhile: create it again
            text = held.text
            if not held.expired:
                raise LakeBusy(busy_message(self.lake, self.stream, self.group, held.text))
            try:
                etag = self._put(IfMatch=held.etag)
            except ClientError as exc:
                if _status(exc) not in _LOST:
                    raise
                continue  # another run took it over, or it was released: look again
            event(log, "took_over_lock", lake=self.lake.url, stream=self.stream, group=self.group,
                  previous=held.text.decode(errors="replace"))
            return etag
        raise LakeBusy(busy_message(self.lake, self.stream, self.group, text))

    def _take_unconditionally(self) -> str:
        held = self._read()
        if held is not None and not held.expired:
            raise LakeBusy(busy_message(self.lake, self.stream, self.group, held.text))
        return self._put()

    def _probe(self) -> None:
        """Raises NoConditionalWrites unless a second ``If-None-Match: *``
        write of an object is refused (an object of this run's own: a
        store that ignores the condition overwrites nothing of another run)."""
        key = f"{self.key}.probe-{uuid.uuid4().hex}"
        try:
            self.s3.put_object(Bucket=self.bucket, Key=key, Body=b"", IfNoneMatch="*")
            try:
                self.s3.put_object(Bucket=self.bucket, Key=key, Body=b"", IfNoneMatch="*")
            except ClientError as exc:
                if _status(exc) in (409, 412):
                    return
                raise
        except ClientError as exc:
            if _refuses_conditions(exc):
                raise self._no_conditional_writes() from None
            raise
        finally:
            with contextlib.suppress(ClientError):
                self.s3.delete_object(Bucket=self.bucket, Key=key)
        raise self._no_conditional_writes()

    def _no_conditional_writes(self) -> NoConditionalWrites:
        return NoConditionalWrites(
            f"lake {self.lake.url}: the object store does not support conditional writes "
            "(If-None-Match), so neither the run's lock nor the Delta commits can keep a second "
            "writer out; if only one process ever ships into this lake, say so with "
            "--single-writer")

    # ---- holding it ---------------------------------------------------------------------

    def _renew(self) -> None:
        while not self.stop.wait(self.lease_s / 3):
            try:
                self.etag = self._put(IfMatch=self.etag) if self.conditional else self._put()
            except ClientError as exc:
                if _status(exc) in _LOST:
                    event(log, "lost_lock", logging.ERROR, lake=self.lake.url, stream=self.stream,
                          group=self.group, status=_status(exc))
                    return  # taken over: the commit's app transaction still guards the run
                event(log, "lock_renewal_failed", logging.WARNING, error=str(exc))
            except Exception as exc:  # the store unreachable for a moment: try again
                event(log, "lock_renewal_failed", logging.WARNING, error=str(exc))

    def release(self) -> None:
        """Stops renewing and removes the lock, if it is still this run's."""
        self.stop.set()
        if self.renewer is not None:
            self.renewer.join()
        with contextlib.suppress(Exception):  # the lease then runs out by itself
            if self.conditional:
                head = self.s3.head_object(Bucket=self.bucket, Key=self.key)
                if head["ETag"] != self.etag:
                    return  # another run's now
            self.s3.delete_object(Bucket=self.bucket, Key=self.key)

    # ---- the object ---------------------------------------------------------------------

    def _put(self, **condition: Any) -> str:
        # Every write of the lock differs (its time), so its ETag changes: a
        # run taking over an expired lease with If-Match on what it read
        # fails if the holder renewed it meanwhile.
        body = json.dumps({**self.holder, "written": time.time()}).encode()
        return str(self.s3.put_object(Bucket=self.bucket, Key=self.key, Body=body,
                                      **condition)["ETag"])

    def _read(self) -> _Held | None:
        try:
            got = self.s3.get_object(Bucket=self.bucket, Key=self.key)
        except ClientError as exc:
            if _status(exc) == 404:
                return None
            raise
        text = got["Body"].read()
        try:
            lease_s = float(json.loads(text)["lease_s"])
        except (ValueError, KeyError, TypeError):
            lease_s = 0.0  # not a lock this code wrote: nobody renews it
        date = got["ResponseMetadata"].get("HTTPHeaders", {}).get("date")
        now = parsedate_to_datetime(date).timestamp() if date else time.time()
        # Last-Modified and Date have whole seconds: one more, so a live
        # lease never looks expired.
        expired = now > got["LastModified"].timestamp() + lease_s + 1
        return _Held(text, str(got["ETag"]), expired)


def _status(exc: Exception) -> int:
    return int(getattr(exc, "response", {}).get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def _refuses_conditions(exc: Exception) -> bool:
    """The store's answer to a conditional PUT it does not implement (Swift: 501 NotImplemented)."""
    code = getattr(exc, "response", {}).get("Error", {}).get("Code", "")
    return _status(exc) == 501 or code == "NotImplemented"
