"""Drives the power-cut filesystem (fs.py) from a test: mount, spawn writers, cut, remount.

Every mount is a new "boot": the processes that use it are started in a mount
namespace of their own where ``/proc/sys/kernel/random/boot_id`` reads a fresh
id.  After a real power cut the kernel's boot id changes, and the storage relies
on that to re-initialise process-shared locks a dead writer may have left
"held" in a state page that reached the disk (see storage_c/FORMAT.md, shard
state); without it a surviving lock word would block the next opener forever.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FS = Path(__file__).with_name("fs.py")
WRITER = Path(__file__).with_name("writer.py")
FUSECTL = Path("/sys/fs/fuse/connections")
CUTS = int(os.environ.get("POWERCUT_CUTS", "30"))  # per scenario
SEED = int(os.environ.get("COMET_POWERCUT_SEED") or time.time_ns() % 1_000_000_007)
"""The seed of this run's random schedules: new each run unless COMET_POWERCUT_SEED
replays one (conftest.py prints it in the test session's header and every failure)."""
ROUNDS = int(os.environ.get("COMET_POWERCUT_ROUNDS", "1"))
"""How many times the named-cut-point scenarios go round (test_cutpoints.py): 1 in
CI, more for a longer run offline."""


def seeded(name: str) -> random.Random:
    """The random schedule of the scenario ``name`` in this run (see SEED)."""
    return random.Random(f"{name}-{SEED}")


class Writer(subprocess.Popen[str]):
    """A process spawned on the mount; its stderr went to the file ``stderr_path``."""

    stderr_path: Path
    whole_namespace: bool = False
    """Its descendants (a Spark driver's JVM and Python workers) are killed with it."""


def _root() -> bool:
    return os.geteuid() == 0


def _ensure_fusectl() -> bool:
    """The fusectl filesystem (for aborting a connection); mounted if we may."""
    if FUSECTL.is_dir() and any(FUSECTL.iterdir()):
        return True
    if not _root() or not FUSECTL.is_dir():
        return False
    with open("/proc/self/mounts") as mounts:
        if any(line.split()[1] == str(FUSECTL) for line in mounts):
            return True
    return subprocess.run(["mount", "-t", "fusectl", "fusectl", str(FUSECTL)],
                          capture_output=True).returncode == 0


class PowerCutFS:
    """One power-cut filesystem mounted at ``root/mnt``, its daemon, its current boot."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.mnt = root / "mnt"
        self.mnt.mkdir(parents=True, exist_ok=True)
        self.procs: list[Writer] = []
        self.conn: str | None = None
        self.boot_file = root / "boot_id"
        self.cuts = 0
        self.spawned = 0
        self.fusectl = _ensure_fusectl()
        env = dict(os.environ, PYTHONPATH=str(REPO))
        self.daemon = subprocess.Popen([sys.executable, str(FS), str(self.mnt)], env=env,
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                       bufsize=1)
        self.mount()

    # ---- daemon control ---------------------------------------------------------

    def _cmd(self, line: str) -> str:
        assert self.daemon.stdin and self.daemon.stdout
        self.daemon.stdin.write(line + "\n")
        self.daemon.stdin.flush()
        answer = self.daemon.stdout.readline().strip()
        if not answer:
            raise RuntimeError(f"power-cut fs daemon died (exit {self.daemon.poll()}) on {line!r}")
        return answer

    def mount(self, same_boot: bool = False) -> None:
        assert self._cmd("mount") == "mounted"
        self.conn = str(os.stat(self.mnt).st_dev)
        if not same_boot:
            self.boot_file.write_text(str(uuid.uuid4()) + "\n")

    def checkpoint(self) -> None:
        """``sync`` then: the dirty pages go to the daemon, and all it holds is durable."""
        writeback(self.mnt)
        assert self._cmd("syncall") == "synced"

    def synclog(self, since: float) -> list[tuple[float, str]]:
        """(monotonic time, path) of every fsync/fsyncdir the daemon served since ``since``."""
        return [tuple(x) for x in json.loads(self._cmd(f"synclog {since}").split(" ", 1)[1])]

    def stats(self) -> dict[str, int]:
        return json.loads(self._cmd("stats").split(" ", 1)[1])

    # ---- processes on the mount -------------------------------------------------

    def spawn(self, *args: object, stdin: int | None = None,
              env: dict[str, str] | None = None, whole_namespace: bool = False) -> Writer:
        """``python writer.py ARGS`` in this boot's namespace; stdout is a pipe of lines.
        ``whole_namespace``: every process of its mount namespace (its descendants)
        is killed with it at the cut, not only itself."""
        inner = [sys.executable, str(WRITER), *map(str, args)]
        script = 'mount --bind "$0" /proc/sys/kernel/random/boot_id && exec "$@"'
        ns = ["unshare", "--mount", "--propagation", "private"]
        if not _root():
            ns = ["unshare", "--user", "--map-root-user", "--mount", "--propagation", "private"]
        env = dict(os.environ, PYTHONPATH=str(REPO), **(env or {}))
        # stderr to a file: after the cut the dying writers' EIO tracebacks are expected
        self.spawned += 1
        err = self.root / f"proc-{self.spawned}.stderr"
        with open(err, "w") as errfile:
            proc = Writer([*ns, "sh", "-c", script, str(self.boot_file), *inner],
                          env=env, stdin=stdin, stdout=subprocess.PIPE, stderr=errfile,
                          text=True, bufsize=1)
        proc.stderr_path = err
        proc.whole_namespace = whole_namespace
        self.procs.append(proc)
        return proc

    def kill(self, proc: Writer) -> None:
        """SIGKILLs one process (with its namespace: see ``spawn``) and waits
        for it, the power staying on: what it wrote stays in the page cache."""
        if proc.whole_namespace and proc.poll() is None:
            _kill_namespace(proc.pid)
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait()

    def _kill_all(self) -> None:
        for proc in self.procs:
            if proc.whole_namespace and proc.poll() is None:
                _kill_namespace(proc.pid)
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
        for proc in self.procs:
            proc.wait()
        self.procs = [p for p in self.procs if p.stdout and not p.stdout.closed]

    def _unmount(self) -> None:
        if self.fusectl and self.conn:
            try:  # drop the kernel's page cache unwritten: what a power cut does to it
                (FUSECTL / self.conn / "abort").write_text("1")
            except OSError:
                pass
        subprocess.run(["fusermount3", "-u", "-z", str(self.mnt)], capture_output=True)

    # ---- the cut ----------------------------------------------------------------

    def cut(self, mode: str = "clean", seed: int = 0) -> tuple[float, int]:
        """The power fails now: returns (the instant, monotonic clock; pages kept).

        Writers are SIGKILLed after the instant, their unread output stays
        readable from their pipes; the filesystem is back mounted, in a new boot.
        """
        assert self._cmd("freeze") == "frozen"
        instant = time.monotonic()
        self._kill_all()
        self._unmount()
        answer = self._cmd(f"reset {mode} {seed}").split()
        self.cuts += 1
        self.mount()
        return instant, int(answer[2])

    def failsync(self, path: Path, count: int = 1) -> None:
        """The next ``count`` fsyncs of the file ``path`` fail with EIO and drop its
        unsynced data (fs.py ``failsync``)."""
        answer = self._cmd(f"failsync /{path.relative_to(self.mnt).as_posix()} {count}")
        assert answer.startswith("failsync ") and "error" not in answer, answer

    def restart(self) -> None:
        """Every process on the mount is killed and the kernel's page cache of it
        dropped, the power staying on (same boot): what the daemon holds, synced or
        not, is what the next process reads - unless a failed sync dropped it."""
        self._kill_all()
        self._unmount()
        assert self._cmd("unmounted") == "unmounted"
        self.mount(same_boot=True)

    def close(self) -> None:
        try:
            self._kill_all()
        finally:
            for proc in self.procs:
                if proc.stdout:
                    proc.stdout.close()
            self.procs = []
            self._unmount()
            if self.daemon.poll() is None:
                try:
                    assert self.daemon.stdin  # a pipe (stdin=PIPE)
                    self.daemon.stdin.write("quit\n")
                    self.daemon.stdin.flush()
                    self.daemon.wait(timeout=10)
                except (OSError, subprocess.TimeoutExpired):
                    self.daemon.kill()
                    self.daemon.wait()
            for stream in (self.daemon.stdin, self.daemon.stdout):
                if stream:
                    stream.close()
            shutil.rmtree(self.mnt, ignore_errors=True)


def _kill_namespace(pid: int) -> None:
    """SIGKILLs every process in the mount namespace of ``pid`` (a namespace
    ``spawn`` made for that process alone: only its descendants share it)."""
    try:
        ns = os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return
    if ns == os.readlink("/proc/self/ns/mnt"):
        return  # not unshared yet: nothing else can be in it
    for _ in range(5):  # again, in case one forked meanwhile
        killed = 0
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                if os.readlink(f"/proc/{entry}/ns/mnt") == ns:
                    os.kill(int(entry), signal.SIGKILL)
                    killed += 1
            except OSError:
                continue
        if not killed:
            return


def writeback(mnt: Path) -> None:
    """Has the kernel write the mount's dirty pages to the daemon (syncfs: no fsync
    reaches it, so they stay volatile): what the page cache may do at any time."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(mnt, os.O_RDONLY | os.O_DIRECTORY)
    try:
        libc.syncfs(fd)
    finally:
        os.close(fd)


def make_synced_dir(path: Path) -> Path:
    """mkdir, then fsync the parent: an installation step (the data directory
    exists, durably, before the storage is first opened)."""
    path.mkdir()
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def read_state(proc: Writer) -> dict:
    """The first line of a writer: what survived (``S``), or why opening failed (``E``)."""
    assert proc.stdout
    line = proc.stdout.readline()
    if line.startswith("E "):
        raise AssertionError(f"reopening after the cut failed: {json.loads(line[2:])}")
    assert line.startswith("S "), (f"writer said {line!r} (exit {proc.wait()}):\n"
                                   f"{proc.stderr_path.read_text()}")
    return json.loads(line[2:])


def read_lines(proc: Writer, count: int) -> list[list[str]]:
    assert proc.stdout
    out = []
    for _ in range(count):
        line = proc.stdout.readline()
        assert line.endswith("\n"), (f"writer ended early (exit {proc.wait()}): {line!r}\n"
                                      f"{proc.stderr_path.read_text()}")
        out.append(line.split())
    return out


def drain(proc: subprocess.Popen[str]) -> list[list[str]]:
    """What a killed writer had written to its pipe: complete lines only."""
    assert proc.stdout
    rest = proc.stdout.read()
    proc.stdout.close()
    return [line.split() for line in rest.split("\n")[:-1]]


def run_to_exit(proc: Writer, timeout: float) -> tuple[list[list[str]], int]:
    """Every line of a process that is to die by itself (at its cut point) and its
    exit status; killed after ``timeout`` seconds (status -9: it never got there)."""
    def stop() -> None:
        if proc.poll() is None:
            proc.kill()

    timer = threading.Timer(timeout, stop)
    timer.start()
    try:
        lines = drain(proc)
        return lines, proc.wait()
    finally:
        timer.cancel()


def discard_output(proc: Writer) -> threading.Thread:
    """Reads a writer's acknowledgements away (this scenario looks at what
    survived, not at what was acknowledged), so that its pipe never fills."""
    def run() -> None:
        assert proc.stdout
        for _ in proc.stdout:
            pass

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread
