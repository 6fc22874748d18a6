"""No lock survives its holders (issue 25, item 7; storage_c/FORMAT.md, shard state).

A shard's append and sync locks are robust process-shared mutexes in its mapped
state file, and the kernel may write that page to disk at any moment, so a copy
of a live data directory (``cp -a``, a volume attached again) can hold a lock
word that says "locked by thread T".  A robust mutex reports its owner's death
only to processes that shared the owner's mapping; with the same kernel running
(no new boot id) the opener of the copy would wait for T forever.  The lock
words are only meaningful while a process holds the state's shared lock: the
first opener of a state nobody holds re-initialises them.

Every opener of a copy runs in a fresh process with a timeout: a hang fails the
test, it never holds up the suite.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from storage_c import Config, Log

from .support.processes import REPO, WORKERS
from .support.storage import read_all

TIMEOUT_S = 30
COMET = Path(sys.executable).with_name("comet")


def bounded(args: list[str], what: str) -> str:
    """Runs a fresh process to its end within TIMEOUT_S; its stdout (it must exit 0)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"{what} did not finish in {TIMEOUT_S} s: it waits for a lock nobody holds")
    assert proc.returncode == 0, f"{what} failed ({proc.returncode}):\n{out}\n{err}"
    return out


def verify_copy(copy: Path) -> str:
    return bounded([str(COMET), "verify", str(copy)], f"comet verify {copy}")


def append_to_copy(copy: Path, stream: str, payload: str) -> int:
    """One append with durability always in a fresh process: both locks taken."""
    out = bounded([sys.executable, str(WORKERS), "append_always", str(copy), stream, payload],
                  f"an append to {copy}")
    return int(out)


def copy_state_first(src: Path, dst: Path) -> None:
    """A copy of a live directory, each shard's state before its other files (and
    indexes before segments): the state copied is older than the data, as the
    one a cut leaves, so the copy is one a restart must be able to take."""
    order = {"state": 0, "offsets": 1}
    for dirpath, _, names in os.walk(src):
        target = dst / Path(dirpath).relative_to(src)
        target.mkdir(parents=True, exist_ok=True)
        for name in sorted(names, key=lambda n: (order.get(n, 3 if n.endswith(".log") else 2), n)):
            try:
                shutil.copy2(Path(dirpath, name), target / name)
            except FileNotFoundError:
                continue  # removed meanwhile (a temporary file, a retired segment)


def test_a_copy_holding_a_live_threads_lock_opens_without_waiting(data_dir: Path,
                                                                  tmp_path: Path) -> None:
    """Deterministic: a process that does not hold the shard open locks its append
    and sync mutexes by hand and is frozen (SIGSTOP) while ``cp -a`` copies the
    directory: in the copy both words name a thread that is alive.  ``comet verify``
    of the copy and an ``always`` append to it finish, and everything is there."""
    with Log(data_dir, Config(shards=1)) as log:
        for i in range(10):
            log.append("s", b"before %d" % i, shard=0)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    holder = subprocess.Popen([sys.executable, str(WORKERS), "hold_state_locks", str(data_dir),
                               "s", "0"], env=env, stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == b"held\n"
        os.kill(holder.pid, signal.SIGSTOP)
        copy = tmp_path / "copy"
        subprocess.run(["cp", "-a", str(data_dir), str(copy)], check=True, timeout=TIMEOUT_S)
        assert "10 good entries" in verify_copy(copy)
        assert append_to_copy(copy, "s", "after") == 10
        with Log(copy, Config(shards=1)) as log:
            assert [p for _, _, p in read_all(log, "s", 0)] == (
                [b"before %d" % i for i in range(10)] + [b"after"])
            stats = log.shard_stats("s", 0)
            assert stats.lock_owner_died == 1  # the copied words, found held once and reset
            assert stats.durable_entry == 11
    finally:
        holder.kill()  # stopped or not
        holder.wait()
        if holder.stdout:
            holder.stdout.close()


def test_copies_of_a_directory_under_always_appends_open_and_verify(data_dir: Path,
                                                                     tmp_path: Path) -> None:
    """A writer appends with durability always (a sync per append) while the
    directory is copied six times; every copy verifies clean and takes an
    append in a fresh process, within the timeout, with its entries numbered on
    from what the copy holds."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    writer = subprocess.Popen([sys.executable, str(WORKERS), "always_appender", str(data_dir),
                               "live"], env=env, stdout=subprocess.PIPE)
    try:
        assert writer.stdout is not None
        assert writer.stdout.readline() == b"ready\n"
        copies = []
        for i in range(6):
            copy = tmp_path / f"copy{i}"
            copy_state_first(data_dir, copy)
            copies.append(copy)
        assert writer.poll() is None, "the writer stopped while the copies were taken"
    finally:
        writer.kill()
        writer.wait()
        if writer.stdout:
            writer.stdout.close()
    for copy in copies:
        out = verify_copy(copy)
        assert ", 0 damaged" in out, out
        with Log(copy, Config(shards=1)) as log:
            held = log.shard_stats("live", 0).next_entry
            assert [e for e, _, _ in read_all(log, "live", 0)] == list(range(held))
        assert append_to_copy(copy, "live", "after the copy") == held
