"""A power-cut filesystem: an in-memory FUSE filesystem that forgets what was never synced.

Run as its own process (``python tests/powercut/fs.py MOUNTPOINT``, driven by
:class:`tests.powercut.harness.PowerCutFS`); never serve it from a process that
also touches the mount (a page fault on a FUSE mapping waits for the daemon).

What is volatile, what is durable
---------------------------------
Every inode has a *current* state (what the kernel has sent us) and a *durable*
state (what survived its last sync):

- file data and size: durable when the file is fsynced or fdatasynced (FUSE
  ``fsync``; ``msync(MS_SYNC)`` of a shared mapping reaches us as the write-back
  of the dirty pages followed by ``fsync``).  Pages written through a
  ``MAP_SHARED`` mapping are not even *current* until the kernel writes them
  back (``msync``, ``fsync``, ``syncfs``, memory pressure or the periodic
  flusher): until then they exist only in the kernel's page cache.
- directory entries (create, mkdir, link, rename, unlink, rmdir): durable when
  that directory is fsynced (FUSE ``fsyncdir``).  A rename between two
  directories is durable in each of them when each is synced.  A new file whose
  data was synced but whose entry was not is lost whole; an unlinked file whose
  removal was not synced comes back with its durable data.
- nothing else is kept (no times, no modes beyond file/directory).

A cut (``freeze`` then ``reset``)
--------------------------------
``freeze`` is the instant of the power failure: from then on every request
fails with EIO, so no sync can succeed after it and nothing the kernel still
writes back (dirty mapped pages of killed processes, the unmount's flush) can
reach the durable state.  The harness then kills the processes using the
mount, aborts the FUSE connection (so the kernel drops its page cache instead
of writing it back) and unmounts.  ``reset MODE SEED`` rebuilds the tree from
the root's durable entries:

- mode ``clean``: every reachable inode gets exactly its durable state;
- mode ``pages``: as a real page cache may have written back any dirty page
  before the power went, every file also keeps a random subset (probability
  1/2 each) of the pages that reached us since its last sync, and its size is
  either the durable or the current one (chosen at random).  Directory entries
  are still only the synced ones.
- ``+dirs`` after either (``clean+dirs``, ``pages+dirs``): unsynced directory
  changes may survive too, as on ext4, whose journal commits them in order (an
  unrelated fsync commits everything before it): of the changes not made
  durable by their directory's fsyncdir, a random prefix, in their order, is
  kept (a rename's new name comes before its old name goes, so no prefix loses
  the file).

Then ``mount`` serves the reset tree again, with a fresh kernel page cache.

Control protocol (one line per command on stdin, one line per answer on stdout):
``freeze`` -> ``frozen``; ``syncall`` -> ``synced`` (everything the daemon
holds becomes durable: a checkpoint, not a cut); ``reset clean|pages[+dirs] SEED`` (after the unmount) ->
``reset FILES KEPT_PAGES``; ``unmounted`` -> ``unmounted`` (once the FUSE loop
ended after an unmount without a cut: a restart keeps every state);
``mount`` -> ``mounted`` (once the kernel's INIT arrived); ``stats`` -> ``stats {json}``;
``synclog SINCE`` -> ``synclog [[t, path], ...]`` (fsyncs and fsyncdirs at or after
monotonic time SINCE: evidence when a scenario fails); ``failsync PATH N`` ->
``failsync INODE``: the next N fsyncs of that file (path inside the mount) fail
with EIO, and each drops what of the file was not durable (its current content
reverts to the durable one: a later read that misses the page cache sees the
old bytes, and the next fsync has nothing to write and succeeds - the
"fsyncgate" behaviour of Linux); ``stats`` also counts the ``injected`` faults
and the directory changes the last ``+dirs`` reset kept of those unsynced;
``quit`` (or end of
input: the daemon then unmounts itself).  ``POWERCUT_TRACE=1`` in its
environment prints every operation on stderr.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import queue
import random
import stat
import subprocess
import sys
import threading
import time
import warnings
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mfusepy import fuse_config, fuse_conn_info

PAGE = 4096
TRACE = bool(os.environ.get("POWERCUT_TRACE"))


class Inode:
    __slots__ = ("ino", "is_dir", "data", "durable", "dirty", "entries", "durable_entries",
                 "mtime", "mode")

    def __init__(self, ino: int, is_dir: bool, mode: int) -> None:
        self.ino = ino
        self.is_dir = is_dir
        self.mode = mode
        self.mtime = time.time_ns()
        self.data = bytearray()          # current file content
        self.durable = b""               # file content as of the last fsync
        self.dirty: set[int] = set()     # pages changed (or size changed) since the last fsync
        self.entries: dict[str, int] = {}          # current directory entries
        self.durable_entries: dict[str, int] = {}  # as of the last fsyncdir


def _err(code: int) -> OSError:
    return OSError(code, os.strerror(code))


class PowerCutOps:
    """The filesystem's state and its FUSE operations (mfusepy's path API, fh = inode)."""

    use_ns = True
    flag_nullpath_ok = True
    flag_nopath = True

    def __init__(self) -> None:
        self.mutex = threading.Lock()
        self.frozen = False
        self.inodes: dict[int, Inode] = {}
        self.next_ino = 2
        root = Inode(1, True, 0o755)
        self.inodes[1] = root
        self.counts: dict[str, int] = {}
        self.names: dict[int, str] = {1: "/"}      # inode -> a path it had (for the sync log)
        self.sync_log: list[tuple[float, int]] = []  # (monotonic time, inode) of each sync
        # Directory changes not yet made durable by an fsyncdir of their directory, in
        # order: [directory inode, name, inode or None (removed)] (a rename is two, one
        # per directory, next to each other); mode ``+dirs`` keeps a random prefix.
        self.dir_journal: list[list[int | str | None]] = []
        self.failing: dict[int, int] = {}  # inode -> fsyncs still to fail (failsync)
        self.injected = 0
        self.dirs_kept = (0, 0)  # (kept, unsynced) directory changes at the last reset
        self.mounted = threading.Event()

    # ---- helpers ----------------------------------------------------------------

    def _check(self, op: str, *args: object) -> None:
        if TRACE:
            print(op, *args, file=sys.stderr)
        if self.frozen:
            raise _err(errno.EIO)
        self.counts[op] = self.counts.get(op, 0) + 1

    def _lookup(self, path: str) -> Inode:
        node = self.inodes[1]
        for part in path.split("/"):
            if not part:
                continue
            if not node.is_dir:
                raise _err(errno.ENOTDIR)
            ino = node.entries.get(part)
            if ino is None:
                raise _err(errno.ENOENT)
            node = self.inodes[ino]
        return node

    def _node(self, path: str | None, fh: int | None) -> Inode:
        if fh:
            node = self.inodes.get(fh)
            if node is not None:
                return node
        if path is None:
            raise _err(errno.EBADF)
        return self._lookup(path)

    def _parent(self, path: str) -> tuple[Inode, str]:
        head, _, name = path.rstrip("/").rpartition("/")
        parent = self._lookup(head or "/")
        if not parent.is_dir:
            raise _err(errno.ENOTDIR)
        return parent, name

    def _journal(self, parent: Inode, name: str, ino: int | None) -> None:
        self.dir_journal.append([parent.ino, name, ino])

    def _new(self, is_dir: bool, mode: int) -> Inode:
        node = Inode(self.next_ino, is_dir, mode)
        self.next_ino += 1
        self.inodes[node.ino] = node
        return node

    @staticmethod
    def _resize(node: Inode, size: int) -> None:
        old = len(node.data)
        if size == old:
            return
        if size < old:
            del node.data[size:]
        else:
            node.data.extend(bytes(size - old))
        lo, hi = min(old, size), max(old, size)
        node.dirty.update(range(lo // PAGE, hi // PAGE + 1))
        node.dirty.add(-1)  # -1: the size itself changed

    @staticmethod
    def _sync_file(node: Inode) -> None:
        if not node.dirty:
            return
        size = len(node.data)
        durable = bytearray(node.durable)
        if len(durable) > size:
            del durable[size:]
        elif len(durable) < size:
            durable.extend(bytes(size - len(durable)))
        for page in node.dirty:
            if page >= 0:
                lo = page * PAGE
                durable[lo:lo + PAGE] = node.data[lo:lo + PAGE]
        node.durable = bytes(durable)
        node.dirty.clear()

    # ---- FUSE operations --------------------------------------------------------

    def init_with_config(self, conn: fuse_conn_info | None, config: fuse_config | None) -> None:
        if config is not None:
            config.hard_remove = 1        # unlinked but open files stay usable through fh
            config.use_ino = 1
        self.mounted.set()

    def getattr(self, path: str | None, fh: int | None = None) -> dict[str, int]:
        with self.mutex:
            self._check("getattr", path, fh)
            node = self._node(path, fh)
            if node.is_dir:
                return {"st_mode": stat.S_IFDIR | node.mode, "st_nlink": 2, "st_ino": node.ino,
                        "st_size": 4096, "st_mtime": node.mtime, "st_ctime": node.mtime,
                        "st_atime": node.mtime, "st_uid": os.getuid(), "st_gid": os.getgid()}
            size = len(node.data)
            return {"st_mode": stat.S_IFREG | node.mode, "st_nlink": 1, "st_ino": node.ino,
                    "st_size": size, "st_blocks": (size + 511) // 512, "st_blksize": PAGE,
                    "st_mtime": node.mtime, "st_ctime": node.mtime, "st_atime": node.mtime,
                    "st_uid": os.getuid(), "st_gid": os.getgid()}

    def access(self, path: str, amode: int) -> int:
        with self.mutex:
            self._check("access")
            self._lookup(path)
        return 0

    def opendir(self, path: str) -> int:
        with self.mutex:
            self._check("opendir")
            node = self._lookup(path)
            if not node.is_dir:
                raise _err(errno.ENOTDIR)
            return node.ino

    def readdir(self, path: str | None, fh: int) -> list[tuple[str, dict[str, int], int]]:
        with self.mutex:
            self._check("readdir", path, fh)
            node = self._node(path, fh)
            # with use_ino the dirent's inode number is ours: 0 would hide the entry
            out = [(".", {"st_ino": node.ino, "st_mode": stat.S_IFDIR}, 0),
                   ("..", {"st_ino": 1, "st_mode": stat.S_IFDIR}, 0)]
            for name, ino in node.entries.items():
                kind = stat.S_IFDIR if self.inodes[ino].is_dir else stat.S_IFREG
                out.append((name, {"st_ino": ino, "st_mode": kind}, 0))
        return out

    def releasedir(self, path: str | None, fh: int) -> int:
        return 0

    def fsyncdir(self, path: str | None, datasync: int, fh: int) -> int:
        with self.mutex:
            self._check("fsyncdir", path, fh)
            node = self._node(path, fh)
            node.durable_entries = dict(node.entries)
            self.dir_journal = [j for j in self.dir_journal if j[0] != node.ino]
            self.sync_log.append((time.monotonic(), node.ino))
            del self.sync_log[:-4096]
        return 0

    def mkdir(self, path: str, mode: int) -> int:
        with self.mutex:
            self._check("mkdir", path)
            parent, name = self._parent(path)
            if name in parent.entries:
                raise _err(errno.EEXIST)
            node = self._new(True, mode & 0o7777)
            parent.entries[name] = node.ino
            self._journal(parent, name, node.ino)
            self.names[node.ino] = path
            parent.mtime = time.time_ns()
        return 0

    def rmdir(self, path: str) -> int:
        with self.mutex:
            self._check("rmdir", path)
            parent, name = self._parent(path)
            ino = parent.entries.get(name)
            if ino is None:
                raise _err(errno.ENOENT)
            node = self.inodes[ino]
            if not node.is_dir:
                raise _err(errno.ENOTDIR)
            if node.entries:
                raise _err(errno.ENOTEMPTY)
            del parent.entries[name]
            self._journal(parent, name, None)
        return 0

    def create(self, path: str, mode: int, flags: int = 0) -> int:
        with self.mutex:
            self._check("create", path)
            parent, name = self._parent(path)
            ino = parent.entries.get(name)
            if ino is not None:
                if flags & os.O_EXCL:
                    raise _err(errno.EEXIST)
                node = self.inodes[ino]
                if flags & os.O_TRUNC:
                    self._resize(node, 0)
                return ino
            node = self._new(False, mode & 0o7777)
            parent.entries[name] = node.ino
            self._journal(parent, name, node.ino)
            self.names[node.ino] = path
            parent.mtime = time.time_ns()
            return node.ino

    def open(self, path: str, flags: int) -> int:
        with self.mutex:
            self._check("open", path)
            node = self._lookup(path)
            if node.is_dir:
                raise _err(errno.EISDIR)
            if flags & os.O_TRUNC:
                self._resize(node, 0)
            return node.ino

    def read(self, path: str | None, size: int, offset: int, fh: int) -> bytes:
        with self.mutex:
            self._check("read")
            node = self._node(path, fh)
            return bytes(node.data[offset:offset + size])

    def write(self, path: str | None, data: bytes, offset: int, fh: int) -> int:
        with self.mutex:
            self._check("write")
            node = self._node(path, fh)
            end = offset + len(data)
            if end > len(node.data):
                self._resize(node, end)
            node.data[offset:end] = data
            node.dirty.update(range(offset // PAGE, (end - 1) // PAGE + 1))
            node.mtime = time.time_ns()
            return len(data)

    def truncate(self, path: str | None, length: int, fh: int | None = None) -> int:
        with self.mutex:
            self._check("truncate")
            self._resize(self._node(path, fh), length)
        return 0

    def fallocate(self, path: str | None, mode: int, offset: int, size: int, fh: int) -> int:
        with self.mutex:
            self._check("fallocate", path, fh, offset, size)
            if mode != 0:
                raise _err(errno.EOPNOTSUPP)
            node = self._node(path, fh)
            if offset + size > len(node.data):
                self._resize(node, offset + size)
        return 0

    def fsync(self, path: str | None, datasync: int, fh: int) -> int:
        with self.mutex:
            self._check("fsync")
            node = self._node(path, fh)
            if self.failing.get(node.ino):
                # The device failed the write-back: what was not durable is gone from
                # the "disk" (a later read past the page cache sees the durable
                # bytes), and the next sync finds nothing to write - Linux's fsyncgate.
                self.failing[node.ino] -= 1
                self.injected += 1
                node.data = bytearray(node.durable)
                node.dirty.clear()
                raise _err(errno.EIO)
            self._sync_file(node)
            self.sync_log.append((time.monotonic(), node.ino))
            del self.sync_log[:-4096]
        return 0

    def flush(self, path: str | None, fh: int) -> int:
        with self.mutex:
            self._check("flush")
        return 0

    def release(self, path: str | None, fh: int) -> int:
        return 0

    def unlink(self, path: str) -> int:
        with self.mutex:
            self._check("unlink", path)
            parent, name = self._parent(path)
            ino = parent.entries.get(name)
            if ino is None:
                raise _err(errno.ENOENT)
            if self.inodes[ino].is_dir:
                raise _err(errno.EISDIR)
            del parent.entries[name]
            self._journal(parent, name, None)
            parent.mtime = time.time_ns()
        return 0

    def rename(self, old: str, new: str, flags: int = 0) -> int:
        with self.mutex:
            self._check("rename", old, new)
            src, sname = self._parent(old)
            dst, dname = self._parent(new)
            ino = src.entries.get(sname)
            if ino is None:
                raise _err(errno.ENOENT)
            target = dst.entries.get(dname)
            if target is not None and target != ino:
                tnode = self.inodes[target]
                if tnode.is_dir and tnode.entries:
                    raise _err(errno.ENOTEMPTY)
            del src.entries[sname]
            dst.entries[dname] = ino
            self._journal(dst, dname, ino)  # the new name first: a prefix never loses the file
            self._journal(src, sname, None)
            self.names[ino] = new
            src.mtime = dst.mtime = time.time_ns()
        return 0

    def link(self, target: str, source: str) -> int:
        """Hard link: the new name ``target`` for the existing file ``source``."""
        with self.mutex:
            self._check("link", target, source)
            node = self._lookup(source)
            if node.is_dir:
                raise _err(errno.EPERM)
            parent, name = self._parent(target)
            if name in parent.entries:
                raise _err(errno.EEXIST)
            parent.entries[name] = node.ino
            self._journal(parent, name, node.ino)
            self.names[node.ino] = target
        return 0

    def chmod(self, path: str, mode: int) -> int:
        with self.mutex:
            self._check("chmod")
            self._lookup(path).mode = mode & 0o7777
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        with self.mutex:
            self._check("utimens")
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        return {"f_bsize": PAGE, "f_frsize": PAGE, "f_blocks": 1 << 22, "f_bfree": 1 << 21,
                "f_bavail": 1 << 21, "f_files": 1 << 20, "f_ffree": 1 << 19, "f_namemax": 255}

    # ---- the cut ----------------------------------------------------------------

    def sync_all(self) -> None:
        """Everything current becomes durable (a clean ``sync`` of the whole tree)."""
        with self.mutex:
            for node in self.inodes.values():
                if node.is_dir:
                    node.durable_entries = dict(node.entries)
                else:
                    self._sync_file(node)
            self.dir_journal = []

    def freeze(self) -> None:
        with self.mutex:
            self.frozen = True

    def reset(self, mode: str, seed: int) -> tuple[int, int]:
        """Rebuilds the tree from the durable state (see the module docstring)."""
        rng = random.Random(seed)
        kept_pages = 0
        mode, _, dirs = mode.partition("+")
        with self.mutex:
            if dirs == "dirs":  # ext4's journal committed the first k changes, in order
                kept = rng.randint(0, len(self.dir_journal))
                for parent, name, ino in self.dir_journal[:kept]:
                    entries = self.inodes[int(parent)].durable_entries  # type: ignore[arg-type]
                    if ino is None:
                        entries.pop(str(name), None)
                    else:
                        entries[str(name)] = int(ino)
                self.dirs_kept = (kept, len(self.dir_journal))
            self.dir_journal = []
            self.failing = {}
            survivors: dict[int, Inode] = {}
            todo = [1]
            while todo:
                ino = todo.pop()
                if ino in survivors:
                    continue
                node = self.inodes[ino]
                survivors[ino] = node
                if node.is_dir:
                    node.entries = dict(node.durable_entries)
                    todo.extend(node.entries.values())
                    continue
                if mode == "pages" and node.dirty:
                    size = len(node.durable) if -1 not in node.dirty or rng.random() < 0.5 \
                        else len(node.data)
                    data = bytearray(node.durable[:size])
                    data.extend(bytes(size - len(data)))
                    for page in sorted(node.dirty):
                        lo = page * PAGE
                        if page >= 0 and lo < size and rng.random() < 0.5:
                            data[lo:lo + PAGE] = node.data[lo:lo + PAGE]
                            del data[size:]
                            data.extend(bytes(size - len(data)))
                            kept_pages += 1
                    node.durable = bytes(data)
                node.data = bytearray(node.durable)
                node.dirty.clear()
            self.inodes = survivors
            self.frozen = False
            self.mounted.clear()
            return sum(1 for n in survivors.values() if not n.is_dir), kept_pages


def serve(mountpoint: str) -> None:
    import mfusepy

    class Fuse(mfusepy.FUSE):
        def truncate_fuse_3(self, path: bytes | None, length: int, fip: object) -> int:
            """mfusepy's own drops FUSE 3's file handle, and with ``flag_nopath``
            an ``ftruncate(fd)`` comes without a path: it could not find its file."""
            fi = getattr(fip, "contents", None)
            fh = (fi if self.raw_fi else fi.fh) if fi is not None else None
            return int(self.operations.truncate(
                None if path is None else path.decode(self.encoding, self.errors), length, fh))

    logging.getLogger("mfusepy").setLevel(logging.CRITICAL)
    warnings.simplefilter("ignore")
    ops = PowerCutOps()
    out = sys.stdout
    out_lock = threading.Lock()
    mount_requests: queue.Queue[str] = queue.Queue()
    loop_idle = threading.Event()
    loop_idle.set()

    def say(line: str) -> None:
        with out_lock:
            out.write(line + "\n")
            out.flush()

    def announce_mounted() -> None:
        ops.mounted.wait()
        say("mounted")

    def control() -> None:
        for line in sys.stdin:
            cmd, *args = line.split()
            if cmd == "freeze":
                ops.freeze()
                say("frozen")
            elif cmd == "reset":
                loop_idle.wait()
                files, kept = ops.reset(args[0], int(args[1]))
                say(f"reset {files} {kept}")
            elif cmd == "unmounted":  # (after an unmount without a reset) the loop ended
                loop_idle.wait()
                ops.mounted.clear()
                say("unmounted")
            elif cmd == "mount":
                loop_idle.clear()
                mount_requests.put("mount")
                threading.Thread(target=announce_mounted, daemon=True).start()
            elif cmd == "syncall":
                ops.sync_all()
                say("synced")
            elif cmd == "synclog":
                since = float(args[0])
                with ops.mutex:
                    log = [(t, ops.names.get(ino, str(ino))) for t, ino in ops.sync_log
                           if t >= since]
                say("synclog " + json.dumps(log))
            elif cmd == "stats":
                with ops.mutex:
                    say("stats " + json.dumps(dict(ops.counts, injected=ops.injected,
                                                   dirs_kept=ops.dirs_kept[0],
                                                   dirs_unsynced=ops.dirs_kept[1])))
            elif cmd == "failsync":
                with ops.mutex:
                    try:
                        node = ops._lookup(args[0])
                    except OSError as exc:
                        say(f"failsync error {exc.strerror}")
                        continue
                    ops.failing[node.ino] = int(args[1])
                say(f"failsync {node.ino}")
            elif cmd == "quit":
                break
        # quit, or the test process is gone (EOF): never leave the mount behind
        mount_requests.put("quit")
        if not loop_idle.is_set():
            subprocess.run(["fusermount3", "-u", "-z", mountpoint], capture_output=True)

    threading.Thread(target=control, daemon=True).start()
    while mount_requests.get() == "mount":
        try:
            Fuse(ops, mountpoint, foreground=True, nothreads=True, fsname="powercut",
                         hard_remove=True, use_ino=True, kernel_cache=True)
        except RuntimeError:
            pass  # an aborted connection ends the loop with an error
        finally:
            loop_idle.set()


if __name__ == "__main__":
    serve(sys.argv[1])
