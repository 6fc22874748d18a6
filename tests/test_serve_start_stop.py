"""What an operator does wrong on day one, done to real `comet serve` processes:
a second gateway on a data directory in use, every stop signal, a start that
cannot succeed (the data directory, the port, the files), and `make serve`'s
address and data directory.  Each mistake ends the command at once with one
line saying what is wrong and what to do, and each stop is prompt and clean."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest

from storage_c import Config, Log

from .support.server import COMET, HOST, SMALL, GatewayProcess, free_port

REPO = Path(__file__).resolve().parent.parent
JSON = {"content-type": "application/json"}
PROMPT_S = 5.0


def refused_start(*args: str, env: dict[str, str] | None = None,
                  cwd: Path | None = None) -> tuple[str, float]:
    """``comet serve ARGS`` that must fail: its one line on stderr, and the
    seconds it took; AssertionError if it starts anything or says more."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("COMET_")}
    t0 = time.monotonic()
    out = subprocess.run([str(COMET), "serve", *args], capture_output=True, text=True,
                         env={**environ, **(env or {})}, cwd=cwd, timeout=60)
    took = time.monotonic() - t0
    assert out.returncode == 1, (out.returncode, out.stderr, out.stdout)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), out.stderr
    assert "Booting worker" not in out.stdout and "Listening at" not in out.stdout, out.stdout
    return lines[0], took


def stored(data_dir: Path, stream: str) -> int:
    with Log(data_dir, Config.inspector()) as log:
        return int(log.stats(stream).entries) if stream in log.streams() else 0


# ---- one gateway per data directory ---------------------------------------------------------

def test_a_second_serve_on_a_data_dir_in_use_exits_at_once_naming_the_pid(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (tmp_path / "link").symlink_to(data)
    with GatewayProcess(data, workers=2, env=SMALL) as first:
        first.wait_ready()
        for other in ([str(data), str(free_port())],        # another port
                      [str(data), str(first.port)],         # the same one too
                      [str(tmp_path / "link"), str(free_port())]):  # another path to it
            line, took = refused_start("--data-dir", other[0], "--port", other[1])
            assert took < PROMPT_S
            assert f"data directory {data} is in use" in line and f"PID {first.proc.pid}" in line, line
            assert f"kill -TERM {first.proc.pid}" in line, line
        # the first one goes on serving, every worker with its slot
        assert first.request("POST", "/streams/ev", b'{"a":1}', JSON)[0] == 202
        assert first.slots_all_held()
        assert first.stop() == 0
    # the hand-over: once the first has exited, the next one starts
    with GatewayProcess(data, workers=2, env=SMALL) as second:
        second.wait_ready()
        assert second.stop() == 0
    assert stored(data, "ev") == 1


@pytest.mark.slow
def test_workers_that_outlive_their_master_still_hold_the_data_dir(tmp_path: Path) -> None:
    """The lock is inherited by the workers: a master killed with SIGKILL leaves it
    held until its last worker has drained and exited."""
    data = tmp_path / "data"
    with GatewayProcess(data, workers=2, env=SMALL) as first:
        first.wait_ready()
        workers = first.worker_pids()
        for pid in workers:
            os.kill(pid, signal.SIGSTOP)  # they cannot react to their master's death yet
        first.proc.kill()
        first.proc.wait(timeout=30)
        line, _ = refused_start("--data-dir", str(data), "--port", str(free_port()))
        assert f"whose master (PID {first.proc.pid}" in line and "has exited" in line, line
        for pid in workers:
            os.kill(pid, signal.SIGCONT)
        deadline = time.monotonic() + 30
        while any(os.path.exists(f"/proc/{pid}") for pid in workers):
            assert time.monotonic() < deadline, "the orphaned workers did not stop"
            time.sleep(0.05)
    with GatewayProcess(data, workers=2, env=SMALL) as second:
        second.wait_ready()
        assert second.stop() == 0


# ---- stop signals ---------------------------------------------------------------------------

# INT to the master, the case met first, in the quick tier; the others in the full suite
STOPS = [pytest.param(to, sig, id=f"{to}-{sig.name[3:]}",
                      marks=() if (to, sig) == ("master", signal.SIGINT) else pytest.mark.slow)
         for to in ("master", "group") for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT)]


@pytest.mark.parametrize("to, sig", STOPS)
def test_every_stop_signal_stops_promptly_and_cleanly(tmp_path: Path, sig: int, to: str) -> None:
    """To the master (kill) or to its whole process group, as a terminal's Ctrl-C
    and Ctrl-\\ send it: exit status 0 within 5 s, no warning or error line, and
    what was acknowledged is stored."""
    data = tmp_path / "data"
    with GatewayProcess(data, workers=2, env=SMALL) as server:
        server.wait_ready()
        assert server.request("POST", "/streams/ev", b'{"a":1}', JSON)[0] == 202
        t0 = time.monotonic()
        if to == "master":
            server.proc.send_signal(sig)
        else:
            os.killpg(server.proc.pid, sig)
        status = server.proc.wait(timeout=60)
        took = time.monotonic() - t0
        assert server.stop() == 0 and not server.killed
    assert status == 0 and took < PROMPT_S, (status, took)
    scan = server.scan_log()
    assert scan["tracebacks"] == 0 and scan["warnings_or_errors"] == {}, scan
    assert stored(data, "ev") == 1


def test_a_stop_reaches_a_worker_still_waiting_for_its_slot(tmp_path: Path) -> None:
    """A worker waits up to slot_wait_s for a slot before it serves; a stop
    signal ends that wait at once."""
    data = tmp_path / "data"
    holder = Log(data, Config(process_count=1, background_flush=False), claim_slot=True)
    try:
        with GatewayProcess(data, workers=1, env={**SMALL, "COMET_SLOT_WAIT_S": "60"}) as server:
            server.wait_for_log('"event":"waiting_for_slot"')
            server.wait_for_log("Waiting for application startup.")  # in its lifespan
            t0 = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            server.proc.wait(timeout=60)
            assert time.monotonic() - t0 < PROMPT_S
            assert server.stop() == 0 and not server.killed
    finally:
        holder.close()


# ---- what the master checks before it forks -------------------------------------------------

def test_a_data_dir_that_cannot_be_made_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    line, took = refused_start("--data-dir", str(tmp_path / "file" / "data"), "--port",
                               str(free_port()))
    assert took < PROMPT_S
    assert f"data directory {tmp_path}/file/data cannot be created: {tmp_path}/file is a file" \
        in line, line
    line, _ = refused_start("--data-dir", str(tmp_path / "file"), "--port", str(free_port()))
    assert f"data directory {tmp_path}/file is a file, not a directory" in line, line
    # where the user may not create it (as root, a place nobody may)
    denied = Path("/sys/comet-data") if os.geteuid() == 0 else tmp_path / "locked" / "data"
    if os.geteuid() != 0:
        denied.parent.mkdir(mode=0o500)
    line, _ = refused_start("--data-dir", str(denied), "--port", str(free_port()))
    assert f"data directory {denied} cannot be created" in line and "install -d -o" in line, line
    assert not denied.exists()


def test_a_taken_port_is_one_line_naming_it_and_leaves_nothing_behind(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen()
        port = taken.getsockname()[1]
        line, took = refused_start("--data-dir", str(tmp_path / "new" / "data"), "--port", str(port))
    assert took < PROMPT_S  # gunicorn's own bind retries for 5 s
    assert f"port {port} on {HOST} is in use" in line and "--port" in line, line
    assert not (tmp_path / "new").exists()  # the data directory it created is gone again
    line, _ = refused_start("--data-dir", str(tmp_path / "data"), "--host", "192.0.2.1",
                            "--port", str(free_port()), env={"COMET_AUTH": "off"})
    assert "cannot listen on 192.0.2.1: it is no address of this machine" in line, line


def test_a_socket_systemd_hands_over_is_served_not_bound_again(tmp_path: Path) -> None:
    """Socket activation (LISTEN_FDS): gunicorn takes the inherited socket, so the
    master binds nothing itself (its port is taken: by that very socket)."""
    listener = socket.create_server((HOST, 0))
    port = listener.getsockname()[1]
    environ = {k: v for k, v in os.environ.items() if not k.startswith("COMET_")}
    log = (tmp_path / "serve.log").open("wb")
    proc = subprocess.Popen(
        ["sh", "-c", 'LISTEN_PID=$$ LISTEN_FDS=1 exec "$@"', "sh", str(COMET), "serve",
         "--data-dir", str(tmp_path / "data"), "--port", str(port), "--workers", "1"],
        stdout=log, stderr=subprocess.STDOUT, env=environ, start_new_session=True, pass_fds=(3,),
        preexec_fn=lambda: os.dup2(listener.fileno(), 3))
    try:
        deadline = time.monotonic() + 60
        while not answers(port):
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            assert time.monotonic() < deadline, "no answer on the inherited socket"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.close()
        listener.close()


def test_files_the_config_names_are_checked_before_any_process_starts(tmp_path: Path) -> None:
    data, port = str(tmp_path / "data"), str(free_port())
    missing = str(tmp_path / "missing.pem")
    for env, says in [
        ({"COMET_TLS_CERT_FILE": missing, "COMET_TLS_KEY_FILE": missing},
         f"tls_cert_file {missing} cannot be read"),
        ({"COMET_TOKENS_FILE": str(tmp_path / "tokens.toml"), "COMET_AUTH": "on"},
         f"tokens_file {tmp_path}/tokens.toml does not exist"),
        ({"COMET_HOST": "0.0.0.0"}, "host 0.0.0.0 is not loopback, so tokens are required"),
        ({"COMET_WORKERS": "2000"}, "workers = 2000: process_count must be between 1 and 1024"),
    ]:
        line, took = refused_start("--data-dir", data, "--port", port, env=env)
        assert says in line and took < PROMPT_S, line
    assert not Path(data).exists()


def test_the_pages_say_what_a_start_without_tokens_does(tmp_path: Path) -> None:
    """Listening beyond loopback without tokens, or with auth on and none, the
    gateway refuses to start; the Docker page quotes both refusals as comet
    serve words them, and no page says it would run and answer 401/403."""
    docker = (REPO / "docs" / "docker.md").read_text()
    for env in ({"COMET_HOST": "0.0.0.0"}, {"COMET_AUTH": "on"}):
        line, _ = refused_start("--data-dir", str(tmp_path / "data"), "--port", str(free_port()),
                                env=env)
        words = line.removeprefix("Error: ")
        quoted = words[:words.index(" (")] if " (" in words else words
        assert quoted in " ".join(docker.split()), line
    for page in [REPO / "README.md", *(REPO / "docs").glob("*.md")]:
        assert "answer 401/403 to every write" not in " ".join(page.read_text().split()), page.name


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes where the owner is someone else")
def test_a_data_dir_of_another_user_is_one_line(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o555)
    line, _ = refused_start("--data-dir", str(data), "--port", str(free_port()))
    assert f"data directory {data} is not writable by user" in line, line


# ---- make serve ------------------------------------------------------------------------------

@contextlib.contextmanager
def make_serve(*assignments: str) -> Iterator[subprocess.Popen[str]]:
    """`make serve VAR=...` in a session of its own (the venv taken as built); what is
    left of it at the end is KILLed."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("COMET_")}
    proc = subprocess.Popen(["make", "--no-print-directory", "-o", ".venv/.installed", "-C", str(REPO),
                             "serve", *assignments], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**environ, "HOST": "somewhere.example", "PORT": "1"})
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()


def test_make_serve_takes_port_host_and_data_and_ignores_the_environment(tmp_path: Path) -> None:
    """PORT, HOST and DATA on make's command line; HOST and PORT in the
    environment (a shell's HOST is often the machine's name) are not taken."""
    port, data = free_port(), tmp_path / "served"
    with make_serve(f"PORT={port}", f"DATA={data}", f"HOST={HOST}") as proc:
        deadline = time.monotonic() + 60
        while not (data / ".gateway" / "serve.lock").exists() or not answers(port):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "make serve did not start"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C
        _, err = proc.communicate(timeout=30)
    assert "error" not in err.lower(), err
    # the defaults, with HOST and PORT in the environment
    dry = subprocess.run(["make", "-n", "-o", ".venv/.installed", "-C", str(REPO), "serve"],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "HOST": "somewhere.example", "PORT": "1"})
    assert "serve --data-dir ./data --host 127.0.0.1 --port 8080" in dry.stdout, dry.stdout


def answers(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=1) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            return s.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def test_make_serve_on_a_taken_port_says_which_and_what_to_do(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen()
        port = taken.getsockname()[1]
        with make_serve(f"PORT={port}", f"DATA={tmp_path / 'data'}") as proc:
            _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    ours = [line for line in err.splitlines() if not line.startswith("make")]
    assert len(ours) == 1 and f"port {port} on {HOST} is in use" in ours[0] \
        and "make serve PORT=" in ours[0], err


def test_make_venv_installs_libzstd_dev_as_make_serve_does() -> None:
    """The C core builds against libzstd-dev: whatever makes the venv installs it
    first (a dry run: make prints what it would do)."""
    for target in ("venv", "serve"):
        dry = subprocess.run(["make", "-n", "-C", str(REPO), target], capture_output=True,
                             text=True, timeout=60)
        assert dry.returncode == 0 and "apt-get install -y -q libzstd-dev" in dry.stdout, dry.stdout
