"""Where shipped objects go: a directory, or S3 (any S3-compatible store).

A sink stores one whole object under a key, or raises.  Writing the same key
again replaces the object with the same bytes, which is what makes a retried
shipment idempotent.  The directory sink never shows a partial object: it
writes a temporary file, fsyncs it, renames it into place and fsyncs the
directory, after making the directories above it durable in theirs
(``make_dirs_durably``); ``remove_temp_files`` removes what a killed writer
left.  S3 needs no cleaning: an object is one PUT (never a multipart upload),
stored whole or not at all.

Failures are classified permanent or transient by ``errors.classify``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

from comet.objectstore import boto3_client_for, s3_location
from comet.files import make_dirs_durably, remove_stale_temp_files, write_durably

from .errors import SinkError

# What botocore accepts before it sends anything (stores add their own rules).
VALID_BUCKET = re.compile(r"^[a-zA-Z0-9.\-_]{1,255}$")


class Sink(Protocol):
    def put(self, key: str, data: bytes) -> None: ...

    def describe(self) -> str: ...


def _check_key(key: str) -> None:
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"object key {key!r} is not a clean relative path")


class DirectorySink:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def describe(self) -> str:
        return f"directory {self.root}"

    def put(self, key: str, data: bytes) -> None:
        _check_key(key)
        path = self.root / key
        make_dirs_durably(path.parent, self.root)
        write_durably(path, data)

    def remove_temp_files(self, key: str, *, mine_are_stale: bool = False) -> list[Path]:
        """Removes the temporary files that writers now dead left in the
        directory of ``key`` (see ``comet.files.remove_stale_temp_files``)."""
        _check_key(key)
        return remove_stale_temp_files((self.root / key).parent, mine_are_stale=mine_are_stale)

    def keys(self, prefix: str = "") -> list[str]:
        """Stored keys (temporary files excluded), sorted."""
        out = []
        for p in self.root.rglob("*"):
            if p.is_file() and not p.name.startswith("."):
                key = p.relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    out.append(key)
        return sorted(out)

    def get(self, key: str) -> bytes:
        _check_key(key)
        return (self.root / key).read_bytes()


class S3Sink:
    """S3 through boto3: endpoint, region and credentials are read by the one
    rule of ``comet.objectstore`` unless given."""

    def __init__(self, bucket: str, prefix: str = "", *, endpoint_url: str | None = None,
                 region: str | None = None, client: Any = None) -> None:
        if not VALID_BUCKET.match(bucket):
            raise SinkError(f"s3://{bucket}/: {bucket!r} is not a valid bucket name",
                            permanent=True, code="InvalidBucketName",
                            hint="fix the bucket name in the sink URL")
        if client is None:
            location = s3_location(f"s3://{bucket}/{prefix}", endpoint_url=endpoint_url, region=region)
            client = boto3_client_for(location)
        self.client = client
        self.bucket = bucket
        self.prefix = prefix.strip("/")

    def describe(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    def _full(self, key: str) -> str:
        _check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def put(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self._full(key), Body=data)

    def keys(self, prefix: str = "") -> list[str]:
        out: list[str] = []
        start = f"{self.prefix}/" if self.prefix else ""
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=start + prefix):
            out.extend(obj["Key"][len(start):] for obj in page.get("Contents", []))
        return sorted(out)

    def get(self, key: str) -> bytes:
        body: bytes = self.client.get_object(Bucket=self.bucket, Key=self._full(key))["Body"].read()
        return body


def sink_from_url(url: str, *, endpoint_url: str | None = None,
                  region: str | None = None) -> DirectorySink | S3Sink:
    """``s3://bucket/prefix``, ``file:///path``, ``dir:path`` or a plain path."""
    parsed = urlparse(url)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise ValueError(f"{url}: no bucket")
        return S3Sink(parsed.netloc, parsed.path, endpoint_url=endpoint_url, region=region)
    if parsed.scheme == "file":
        return DirectorySink(parsed.path)
    if parsed.scheme == "dir":
        return DirectorySink(url[len("dir:"):])
    if parsed.scheme == "":
        return DirectorySink(url)
    raise ValueError(f"{url}: unknown sink (use s3://bucket/prefix or a directory)")
