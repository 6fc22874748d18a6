"""Where the lake lives: a local directory or ``s3://bucket/prefix``, both as a
pyarrow filesystem plus a base path, so the job, its Spark tasks and the
reader helper write and read through one code path.

Spark's own ``s3a://`` needs the Hadoop AWS jars, which cannot be fetched
here (no Maven); pyarrow's S3 filesystem is native code with no jars.  The
endpoint, region and credentials are those a ``Lake`` names, the rest read
by the one rule of ``comet.objectstore``, which also bounds timeouts and
retries, so an unreachable endpoint is an error within seconds, not a hang.

A ``Lake`` is a small picklable value (URL + endpoint), not an open
connection: Spark ships it to the tasks, which open their own filesystem.
A local lake's path is made absolute when the ``Lake`` is created (in the
driver): executors run in directories of their own.
"""

from __future__ import annotations

import builtins
import os
import posixpath
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import pyarrow.fs as pafs

from comet.objectstore import S3Location, pyarrow_filesystem_for, s3_location
from comet.files import make_dirs_durably, write_durably


class LakeError(Exception):
    """The lake cannot be reached or used (bad URL, endpoint down, no bucket)."""


def local_path(url: str) -> str:
    """The absolute directory of a local lake URL: a path, ``file:///dir`` or
    ``file:dir`` (a relative one is taken from the working directory)."""
    if url.startswith("file://"):
        url = url[len("file://"):]
    elif url.startswith("file:"):
        url = url[len("file:"):]
    return os.path.abspath(url)


def absolute_local_url(url: str) -> str:
    """``url`` with its path made absolute, in the form it was given (a plain
    path, or ``file://``)."""
    path = local_path(url)
    return f"file://{path}" if url.startswith("file:") else path


@dataclass(frozen=True)
class Lake:
    url: str
    endpoint_url: str | None = None
    region: str | None = None
    access_key: str | None = field(default=None, repr=False)
    """Explicit credentials travel with the Lake to the Spark tasks; without
    them each task uses the standard AWS chain of its own process."""
    secret_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    single_writer: bool = False
    """The user's word that only one process ever writes into this lake: on
    an S3 store without conditional writes (OpenStack Swift's s3api), the
    only way to use it.  Its Delta commits are made in a local copy of the
    log and uploaded with plain PUTs (``logmirror.py``); the run's lock uses
    plain PUTs where the store refuses conditional ones (``lock/s3lease.py``)."""
    _fs: list[pafs.FileSystem] = field(default_factory=list, compare=False, repr=False)

    def __post_init__(self) -> None:
        parsed = urlparse(self.url)
        if parsed.scheme not in ("", "file", "s3"):
            raise LakeError(f"lake {self.url!r}: use a local path or s3://bucket/prefix")
        if parsed.scheme == "s3" and not parsed.netloc:
            raise LakeError(f"lake {self.url!r}: no bucket")
        if parsed.scheme != "s3":
            # Absolute here, in the process that names the lake: Spark ships the
            # Lake to executors whose working directory is their own (on a
            # cluster, the worker's application directory), where a relative
            # path would name another place.
            object.__setattr__(self, "url", absolute_local_url(self.url))
        else:
            # The store too is read here, for the same executors: their
            # environment may name no endpoint or region.
            store = self.store()
            object.__setattr__(self, "endpoint_url", store.endpoint_url)
            object.__setattr__(self, "region", store.region)

    def __getstate__(self) -> dict[str, object]:
        return {"url": self.url, "endpoint_url": self.endpoint_url, "region": self.region,
                "access_key": self.access_key, "secret_key": self.secret_key,
                "session_token": self.session_token, "single_writer": self.single_writer}

    def __setstate__(self, state: dict[str, object]) -> None:
        for key, value in state.items():
            object.__setattr__(self, key, value)
        object.__setattr__(self, "_fs", [])

    @property
    def is_s3(self) -> bool:
        return self.url.startswith("s3://")

    @property
    def root(self) -> str:
        """The lake's base path inside ``fs`` (``bucket/prefix`` or an absolute directory)."""
        if self.is_s3:
            parsed = urlparse(self.url)
            return posixpath.join(parsed.netloc, parsed.path.strip("/")).rstrip("/")
        return local_path(self.url)

    @property
    def fs(self) -> pafs.FileSystem:
        if not self._fs:
            self._fs.append(self._open())
        return self._fs[0]

    def store(self) -> S3Location:
        """The S3 lake's store: what this Lake names, the rest by the one rule
        of ``comet.objectstore``."""
        return s3_location(self.url, endpoint_url=self.endpoint_url, region=self.region,
                           access_key=self.access_key, secret_key=self.secret_key,
                           session_token=self.session_token)

    def _open(self) -> pafs.FileSystem:
        if not self.is_s3:
            return pafs.LocalFileSystem()
        return pyarrow_filesystem_for(self.store())

    def path(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts)

    def uri(self, *parts: str) -> str:
        """The URL of a path in the lake, as Spark or a user would write it."""
        return ("s3://" if self.is_s3 else "") + self.path(*parts)

    # ---- small documents (plans, manifests) -------------------------------------------

    def write_atomically(self, rel: str, data: bytes) -> None:
        """A whole document or none: S3 PUTs are atomic; locally, a temporary
        name, fsync, rename, fsync of the directory (and of the parents of the
        directories it had to create)."""
        if self.is_s3:
            with self.fs.open_output_stream(self.path(rel)) as out:
                out.write(data)
            return
        path = Path(self.path(rel))
        make_dirs_durably(path.parent, self.root)  # write_durably syncs only the last one
        write_durably(path, data)

    def read(self, rel: str) -> bytes | None:
        try:
            with self.fs.open_input_stream(self.path(rel)) as f:
                return f.read()
        except FileNotFoundError:
            return None

    def list(self, rel: str) -> list[str]:
        """Names of the files directly under ``rel`` (none if it does not exist)."""
        selector = pafs.FileSelector(self.path(rel), allow_not_found=True)
        return sorted(posixpath.basename(i.path) for i in self.fs.get_file_info(selector)
                      if i.type == pafs.FileType.File)

    def list_dirs(self, rel: str) -> builtins.list[str]:  # list: the method above
        """Names of the directories (S3: common prefixes) directly under ``rel``."""
        selector = pafs.FileSelector(self.path(rel), allow_not_found=True)
        return sorted(posixpath.basename(i.path.rstrip("/")) for i in self.fs.get_file_info(selector)
                      if i.type == pafs.FileType.Directory)

    def check(self) -> None:
        """Fails with a clear LakeError when the lake cannot be used (run
        first).  Writes nothing: a local lake's directory is created with the
        first file a run writes there."""
        if not self.is_s3:
            self._check_local()
            return
        bucket = self.root.split("/", 1)[0]
        try:
            info = self.fs.get_file_info(bucket)
        except OSError as exc:
            raise LakeError(f"lake {self.url} is not reachable: {exc}") from None
        if info.type == pafs.FileType.NotFound:
            raise LakeError(f"lake {self.url}: bucket {bucket!r} does not exist")

    def _check_local(self) -> None:
        """The lake's directory, or the nearest of its parents that exists
        (where it would be created), is a directory this process may write in."""
        existing = Path(self.root)
        while not os.path.lexists(existing):
            existing = existing.parent
        if not existing.is_dir():
            raise LakeError(f"lake {self.url}: {existing} is not a directory")
        if not os.access(existing, os.W_OK | os.X_OK):
            raise LakeError(f"lake {self.url}: {existing} is not writable by this user")

    def delete(self, rel: str) -> None:
        """Removes one file (none there: nothing to do)."""
        try:
            self.fs.delete_file(self.path(rel))
        except FileNotFoundError:
            pass

    def delete_tree(self, rel: str) -> None:
        """Removes a directory and everything under it (none: nothing to do).

        On S3, one DELETE per object: the batch DeleteObjects call that
        pyarrow's delete_dir uses needs a Content-MD5 that current AWS SDKs
        no longer send, which stores such as OpenStack Swift 2.30 refuse."""
        path = self.path(rel)
        if not self.is_s3:
            shutil.rmtree(path, ignore_errors=True)
            return
        selector = pafs.FileSelector(path, recursive=True, allow_not_found=True)
        infos = self.fs.get_file_info(selector)
        for info in sorted(infos, key=lambda i: i.path.count("/"), reverse=True):
            if info.type == pafs.FileType.File:
                self.fs.delete_file(info.path)
