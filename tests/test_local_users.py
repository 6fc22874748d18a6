"""Other local users (issue 39, point 3): with the usual umask (022) a data
directory was 0755 and its files 0644, so any user read the events and, having
opened a file read-only, could flock() it or take an OFD read lock on it: a
read lock on .slots held over a HUP kept the new workers at 503 `starting`, an
exclusive flock on a shard's state hung its writes.  Now nobody but the
gateway's user (and its data_group) can open anything there.  The attacker is
a real process of another user (nobody), so these tests need root."""

from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest

from storage_c import Config, Log

from .support.attacks import post_json
from .support.server import SMALL, GatewayProcess

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root")

ATTACKER = r"""
import fcntl, json, os, struct, sys, time
paths, hold = json.loads(sys.argv[1]), float(sys.argv[2])
got, held = {}, []
for path in paths:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        got[path] = exc.strerror
        continue
    locks = []
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        locks.append("flock")
    except OSError:
        pass
    try:  # an OFD read lock on every byte (F_OFD_SETLK = 37)
        fcntl.fcntl(fd, 37, struct.pack("hhqqi4x", fcntl.F_RDLCK, 0, 0, 0, 0))
        locks.append("ofd read lock")
    except OSError:
        pass
    got[path] = "opened, " + (" and ".join(locks) or "no lock")
    held.append(fd)
print(json.dumps(got), flush=True)
time.sleep(hold)
"""


def as_user(paths: list[Path], hold: float = 0.0, user: str = "nobody",
            groups: tuple[str, ...] = ()) -> tuple[subprocess.Popen[str], dict[str, str]]:
    """Runs the attacker as ``user`` (with ``groups``): what it could open and lock
    of ``paths``; it holds what it got for ``hold`` seconds."""
    who = pwd.getpwnam(user)
    proc = subprocess.Popen(["/usr/bin/python3", "-c", ATTACKER, json.dumps([str(p) for p in paths]),
                             str(hold)], user=who.pw_uid, group=who.pw_gid,
                            extra_groups=[grp.getgrnam(g).gr_gid for g in groups],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, json.loads(proc.stdout.readline())


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory every user may enter (pytest's own are 0700: no test at all)."""
    path = Path(tempfile.mkdtemp(prefix="comet-users-", dir="/tmp"))
    path.chmod(0o755)
    old = os.umask(0o022)  # what a service usually runs with
    try:
        yield path
    finally:
        os.umask(old)
        shutil.rmtree(path, ignore_errors=True)


def everything(data_dir: Path) -> list[Path]:
    return [data_dir, *sorted(data_dir.rglob("*"))]


def test_the_data_directory_is_the_gateways_users_alone(open_dir: Path) -> None:
    data_dir = open_dir / "data"
    with GatewayProcess(data_dir, 2, env=SMALL, log_path=open_dir / "serve.log") as server:
        server.wait_ready()
        assert post_json(server, "private") == 202
        assert server.request("POST", "/streams/private", b"{}", {"content-type": "application/json",
                                                                  "idempotency-key": "k"})[0] == 202
        modes = {str(p.relative_to(open_dir)): stat.S_IMODE(p.stat().st_mode) for p in everything(data_dir)}
        for kind in ("state", ".slots", ".log", "stream.meta", "metrics-0.bin", "keys"):
            assert any(name.endswith(kind) for name in modes), (kind, sorted(modes))
        assert {m for name, m in modes.items() if (open_dir / name).is_dir()} == {0o700}, modes
        assert {m for name, m in modes.items() if not (open_dir / name).is_dir()} == {0o600}, modes
        _, got = as_user(everything(data_dir))
        assert set(got.values()) == {"Permission denied"}, got
        assert server.stop() == 0


def test_another_user_cannot_hold_the_slots_over_a_reload(open_dir: Path) -> None:
    data_dir = open_dir / "data"
    with GatewayProcess(data_dir, 2, env=SMALL, log_path=open_dir / "serve.log") as server:
        server.wait_ready()
        assert post_json(server, "ev") == 202
        locked = [data_dir / ".slots", *sorted(data_dir.glob("ev/shard-*/state"))]
        attacker, got = as_user(locked, hold=30)
        try:
            assert set(got.values()) == {"Permission denied"}, got
            server.proc.send_signal(1)  # HUP: new workers claim the slots
            time.sleep(0.5)
            deadline = time.monotonic() + 15
            statuses: list[int] = []
            while time.monotonic() < deadline and statuses[-5:] != [202] * 5:
                statuses.append(post_json(server, "ev", timeout=5))
            assert statuses[-5:] == [202] * 5, statuses
        finally:
            attacker.kill()
            attacker.wait()
        assert server.stop() == 0


def test_a_data_directory_an_older_build_left_open_is_closed_at_start(open_dir: Path) -> None:
    data_dir = open_dir / "data"
    with Log(data_dir, Config(shards=2, background_flush=False)) as log:
        log.append("old", b"{}")
    for path in everything(data_dir):
        path.chmod(0o755 if path.is_dir() else 0o644)
    _, before = as_user([data_dir / "old" / "shard-0000" / "state"])
    assert list(before.values())[0].startswith("opened"), before  # the hole, as it was
    with GatewayProcess(data_dir, 1, env=SMALL, log_path=open_dir / "serve.log") as server:
        server.wait_ready()
        assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
        _, after = as_user(everything(data_dir))
        assert set(after.values()) == {"Permission denied"}, after
        assert server.stop() == 0


def test_a_data_group_shares_the_directory_with_its_members_only(open_dir: Path) -> None:
    group = "daemon"
    if "nobody" in grp.getgrnam(group).gr_mem:
        pytest.skip(f"nobody is a member of {group}")
    data_dir = open_dir / "data"
    env = {**SMALL, "COMET_DATA_GROUP": group}
    with GatewayProcess(data_dir, 1, env=env, log_path=open_dir / "serve.log") as server:
        server.wait_ready()
        assert post_json(server, "shared") == 202
        gid = grp.getgrnam(group).gr_gid
        for path in everything(data_dir):
            if ".gateway" in path.parts:
                continue  # the gateway's own files stay its user's
            mode = stat.S_IMODE(path.stat().st_mode)
            assert path.stat().st_gid == gid, path
            assert mode == (0o2770 if path.is_dir() else 0o660), (path, oct(mode))
        state = sorted(data_dir.glob("shared/shard-*/state"))[0]
        _, member = as_user([state], groups=(group,))
        assert member[str(state)].startswith("opened"), member
        _, stranger = as_user([state])
        assert set(stranger.values()) == {"Permission denied"}, stranger
        assert server.stop() == 0
