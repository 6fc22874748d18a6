"""The service install of docs/operations.md, done as the page says and run as
a user of its own: the install commands (in a scratch directory instead of
/opt/comet), then the systemd unit's ExecStart as that user (nobody), which
must serve, take a write and stop cleanly.  The venv links to the Python
that made it, so a venv made from root's own Python (a pyenv under /root)
fails here with "Permission denied", as the unit would."""

from __future__ import annotations

import os
import pwd
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from .support.docs import fenced_blocks
from .support.server import ServerProcess, free_port

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "docs" / "operations.md"
INSTALLED = "/opt/comet"
USER = "nobody"

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="installs as root and runs as another user")]


def install_commands() -> list[str]:
    """The page's install block: the shell block that runs make venv in /opt/comet."""
    blocks = [lines for language, _, lines in fenced_blocks(PAGE)
              if language == "sh" and any(f"make -C {INSTALLED} venv" in line for line in lines)]
    assert len(blocks) == 1, "operations.md has no one install block"
    return [line.split("#")[0].strip() for line in blocks[0] if line.strip()]


def unit_setting(name: str) -> str:
    """A setting of the page's systemd unit."""
    [unit] = [lines for language, _, lines in fenced_blocks(PAGE)
              if language == "ini" and any(line.startswith("ExecStart=") for line in lines)]
    [value] = [line.split("=", 1)[1] for line in unit if line.startswith(f"{name}=")]
    return value


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A directory every user can pass (pytest's own are root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="comet-service-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def copy_sources(target: Path) -> None:
    """The working tree's sources (what `git archive HEAD` gives, and what is not
    committed yet), without the checkout's venv and build."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=REPO, capture_output=True, check=True).stdout.split(b"\0")
    for name in filter(None, (f.decode() for f in files)):
        source = REPO / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)


def run_as_root(command: str, opt: Path) -> None:
    """One install line as the page gives it, with /opt/comet in ``opt`` and the
    service's user ``nobody``; ``sudo`` is not needed (this runs as root)."""
    line = command.replace(INSTALLED, str(opt)).replace("-u comet", f"-u {USER}")
    line = re.sub(r"(^|&&\s*|\|\s*)sudo\s+", r"\1", line)
    out = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert out.returncode == 0, f"{line}\n{out.stdout[-2000:]}{out.stderr[-3000:]}"


def test_the_units_command_line_runs_as_the_service_user(scratch: Path) -> None:
    opt, data, etc = scratch / "opt-comet", scratch / "var-lib-comet", scratch / "etc-comet"
    commands = install_commands()
    assert [c.split()[1] for c in commands] == ["install", "make", "useradd", "runuser"], commands
    assert "git archive HEAD" in commands[0] and "PYTHON=/usr/bin/python3" in commands[1]
    opt.mkdir()
    copy_sources(opt)                  # the first line, with the sources not yet committed
    for command in commands[1:]:
        if command.startswith("sudo useradd"):
            continue                   # the service user here is nobody, who exists
        run_as_root(command, opt)
    python = os.path.realpath(opt / ".venv" / "bin" / "python")
    assert not python.startswith("/root/"), python
    # the unit's own settings: its user runs its command line
    assert unit_setting("User") == "comet"
    exec_start = shlex.split(unit_setting("ExecStart").replace(INSTALLED, str(opt)))
    data.mkdir()
    shutil.chown(data, USER)           # StateDirectory=comet does this
    etc.mkdir()
    port = free_port()
    (etc / "comet.toml").write_text(f'data_dir = "{data}"\nport = {port}\nworkers = 2\n')
    exec_start[exec_start.index("/etc/comet/comet.toml")] = str(etc / "comet.toml")
    # as systemd's User= does it: the user's ids, then exec (runuser would stay the parent)
    as_user = ["setpriv", f"--reuid={USER}", f"--regid={pwd.getpwnam(USER).pw_gid}", "--clear-groups",
               "--"]
    with ServerProcess([*as_user, *exec_start], port, workers=2,
                       log_path=scratch / "serve.log") as server:
        server.wait_ready()
        status, body, _ = server.request("POST", "/streams/events", b'{"level":"info"}',
                                         {"content-type": "application/json"})
        assert status == 202, body
        assert server.stop(signal.SIGTERM) == 0 and not server.killed
    assert (data / "events").is_dir() and (data / "events").stat().st_uid == (data.stat().st_uid)
    assert "Traceback" not in server.tail(1 << 20)


def test_make_venv_takes_a_python_every_user_can_run(scratch: Path) -> None:
    """scripts/pick-python (make venv's default PYTHON) passes over a python3 on
    the PATH that other users cannot run; scripts/venv-reach.py, which make venv
    runs, is quiet for the system's Python and notes one that is closed."""
    script = REPO / "scripts" / "venv-reach.py"
    closed = scratch / "closed"
    closed.mkdir(mode=0o700)
    shutil.copy2(os.path.realpath(sys.executable), closed / "python3.real")
    copy = closed / "python3"  # this Python, in a directory only root may enter
    copy.write_text(f"#!/bin/sh\nPYTHONHOME={sys.base_prefix} exec {closed}/python3.real \"$@\"\n")
    copy.chmod(0o755)
    picked = subprocess.run([str(REPO / "scripts" / "pick-python")], capture_output=True, text=True,
                            timeout=60, env={**os.environ, "PATH": f"{closed}:/usr/bin:/bin"})
    assert picked.stdout.strip() == "/usr/bin/python3", picked.stdout
    quiet = subprocess.run(["/usr/bin/python3", str(script)], capture_output=True, text=True,
                           timeout=60)
    assert quiet.returncode == 0 and quiet.stdout == "", quiet.stdout
    noted = subprocess.run([str(copy), str(script)], capture_output=True, text=True, timeout=60)
    assert noted.returncode == 0
    assert f"{closed} is closed to them" in noted.stdout and "make venv PYTHON=" in noted.stdout
