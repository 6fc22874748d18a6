"""A real server in a process of its own, for the tests and the benchmarks.

``GatewayProcess`` runs ``comet serve``; ``ServerProcess.gunicorn`` runs any gunicorn
app (the benchmark's bare anchor).  Either way the server starts in a session
(process group) of its own on a free port of 127.0.0.1, with the caller's
``COMET_*`` settings and none inherited, its stdout and stderr in a log file.
``wait_ready`` returns once every worker has answered ``/readyz`` (new
connections land on any worker, so it polls until it has seen them all);
``stop`` sends TERM to the master, waits, then KILLs the whole group, each
step bounded; ``scan_log`` counts tracebacks, warnings and errors in the log.
With ``tls`` (a client context trusting the server's certificate; the server's
own COMET_TLS_* settings are in ``env``) ``url``, ``request`` and ``connect``
speak TLS.
Stopping a gateway (``stop``, or leaving its ``with`` block) also checks that
every answer of 500 in its access log has a line naming its cause
(``unlogged_errors``): every test that runs a gateway fails if one was
answered silently.

The tests and the benchmarks (loadtests/) start servers only through this
module, so that both measure and check the same thing.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any, Mapping, Self, Sequence

from storage_c import Config, Log, NoFreeSlot

HOST = "127.0.0.1"
COMET = Path(sys.executable).with_name("comet")
# What the tests run with: 8 shards, 1 MiB segments, the access log on (stopping a
# gateway reads it for answers of 500; see unlogged_errors).
SMALL = {"COMET_ACCESS_LOG": "1", "COMET_STORAGE_SHARDS": "8",
         "COMET_STORAGE_SEGMENT_BYTES": str(1 << 20)}


def free_port() -> int:
    """A TCP port of 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """A server command in its own session; ``argv`` must make it listen on ``port``."""

    def __init__(self, argv: Sequence[str], port: int, *, workers: int, log_path: Path,
                 env: Mapping[str, str] | None = None, ready_key: str = "slot",
                 tls: ssl.SSLContext | None = None) -> None:
        self.port, self.workers, self.log_path, self.ready_key = port, workers, log_path, ready_key
        self.tls = tls
        self.ready_s = 0.0
        self.seen: list[int] = []       # the ready_key values of the workers that answered
        self.killed = False             # stop() had to KILL
        environ = {k: v for k, v in os.environ.items() if not k.startswith("COMET_")}
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log: IO[bytes] = open(log_path, "wb")
        try:
            self.proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=self._log,
                                         stderr=subprocess.STDOUT, env={**environ, **(env or {})},
                                         start_new_session=True)
        except BaseException:
            self._log.close()
            raise

    @classmethod
    def gunicorn(cls, app: str, *, chdir: Path, workers: int, log_path: Path,
                 env: Mapping[str, str] | None = None, args: Sequence[str] = ()) -> ServerProcess:
        """``app`` ("module:attribute" in ``chdir``) on gunicorn with uvicorn workers; its
        ``/readyz`` must answer 200 with a JSON object whose "pid" tells the workers apart."""
        port = free_port()
        argv = [sys.executable, "-m", "gunicorn", "-k", "uvicorn_worker.UvicornWorker",
                "-w", str(workers), "-b", f"{HOST}:{port}", "--chdir", str(chdir), *args, app]
        return cls(argv, port, workers=workers, log_path=log_path, env=env, ready_key="pid")

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{HOST}:{self.port}"

    def connection(self, timeout: float = 10) -> http.client.HTTPConnection:
        """An http.client connection to the server (HTTPS with ``tls``), not yet connected."""
        if self.tls is not None:
            return http.client.HTTPSConnection(HOST, self.port, timeout=timeout, context=self.tls)
        return http.client.HTTPConnection(HOST, self.port, timeout=timeout)

    def connect(self, timeout: float = 15, handshake: bool = True) -> socket.socket:
        """A connected socket; with ``tls``, after the TLS handshake, or (not
        ``handshake``) with the handshake done by the first send or receive."""
        sock = socket.create_connection((HOST, self.port), timeout=timeout)
        if self.tls is None:
            return sock
        try:
            return self.tls.wrap_socket(sock, server_hostname=HOST, do_handshake_on_connect=handshake)
        except BaseException:
            sock.close()
            raise

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: Mapping[str, str] | None = None,
                timeout: float = 10) -> tuple[int, bytes, dict[str, str]]:
        """One request on a new connection: (status, body, headers)."""
        conn = self.connection(timeout)
        try:
            conn.request(method, path, body=body, headers={"connection": "close", **(headers or {})})
            r = conn.getresponse()
            return r.status, r.read(), dict(r.getheaders())
        finally:
            conn.close()

    def wait_ready(self, timeout: float = 60) -> float:
        """Until every worker answered /readyz with 200; returns the seconds it took.
        Raises RuntimeError (with the log's tail) if the server exits or the time is up."""
        t0 = time.monotonic()
        seen: set[int] = set()
        while len(seen) < self.workers:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode} before it was "
                                   f"ready; {self.log_path}:\n{self.tail()}")
            if time.monotonic() - t0 > timeout:
                raise RuntimeError(f"only {sorted(seen)} of {self.workers} workers ready after "
                                   f"{timeout:.0f} s; {self.log_path}:\n{self.tail()}")
            try:
                status, body, _ = self.request("GET", "/readyz", timeout=2)
                value = json.loads(body).get(self.ready_key) if status == 200 else None
            except (OSError, http.client.HTTPException, ValueError, AttributeError):
                value = None
            if isinstance(value, int):
                seen.add(value)
            else:
                time.sleep(0.02)  # not listening yet, or a worker still starting
        self.seen, self.ready_s = sorted(seen), time.monotonic() - t0
        return self.ready_s

    def wait_for_log(self, text: str, timeout: float = 60, times: int = 1) -> None:
        """Until ``text`` is in the server's log (``times`` times); AssertionError
        if the server exits first or the time is up."""
        deadline = time.monotonic() + timeout
        while self.tail(1 << 20).count(text) < times:
            assert time.monotonic() < deadline, f"no {text!r} in the log:\n{self.tail()}"
            assert self.proc.poll() is None, f"the server exited:\n{self.tail()}"
            time.sleep(0.02)

    def reload_workers(self, timeout: float = 60) -> None:
        """HUP, then until none of the old workers is left and the new ones are ready."""
        old = set(self.worker_pids())
        self.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + timeout
        while old & set(self.worker_pids()):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"old workers {sorted(old)} still running after the HUP, or "
                                   f"the master exited; {self.log_path}:\n{self.tail()}")
            time.sleep(0.05)
        self.wait_ready()

    def worker_pids(self) -> list[int]:
        """The workers: processes whose parent is the master."""
        pids = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == self.proc.pid:
                pids.append(int(stat.parent.name))
        return pids

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        """``sig`` to the master and up to ``timeout`` s for it to exit, then KILL to the
        group; whatever of the group is left after that is KILLed too (within 5 s).
        Returns the master's exit status (negative: the signal that ended it)."""
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(sig)
                try:
                    self.proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    self.killed = True
                    self._kill_group()
                    self.proc.wait(timeout=10)
            deadline = time.monotonic() + 5  # workers outliving their master, if any
            while self._group_alive() and time.monotonic() < deadline:
                time.sleep(0.05)
            if self._group_alive():
                self.killed = True
                self._kill_group()
        finally:
            self._log.close()
        return self.proc.returncode

    def kill(self) -> None:
        """KILL the whole group at once (a test that failed half-way)."""
        self._kill_group()
        self.proc.wait()
        self._log.close()

    def _group_alive(self) -> bool:
        try:
            os.killpg(self.proc.pid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    def _kill_group(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def scan_log(self) -> dict[str, Any]:
        return scan_log(self.log_path)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


class GatewayProcess(ServerProcess):
    """``comet serve`` on ``data_dir`` with ``workers`` workers; ``env`` holds its COMET_*
    settings (``SMALL`` for the tests), ``config`` a TOML file for ``--config``; ``tls``
    as ServerProcess's (tests/support/tls.py makes both halves); ``bind`` the address it
    listens on (the tests reach it on 127.0.0.1 all the same: "0.0.0.0" includes it)."""

    def __init__(self, data_dir: Path, workers: int = 2, *, env: Mapping[str, str] | None = None,
                 config: Path | None = None, log_path: Path | None = None,
                 tls: ssl.SSLContext | None = None, bind: str = HOST) -> None:
        self.data_dir = data_dir
        port = free_port()
        argv = [str(COMET), "serve", "--data-dir", str(data_dir), "--host", bind,
                "--port", str(port), "--workers", str(workers)]
        if config is not None:
            argv += ["--config", str(config)]
        super().__init__(argv, port, workers=workers, env=env, tls=tls,
                         log_path=log_path or data_dir.parent / f"serve-{port}.log")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        """ServerProcess.stop, then AssertionError if an answer of 500 in the access log
        has no line naming its cause (see unlogged_errors)."""
        status = super().stop(sig, timeout)
        silent = unlogged_errors(self.log_path)
        if silent:
            raise AssertionError(f"{len(silent)} answers of 500 without a log line naming the "
                                 f"cause in {self.log_path}, the first: {silent[:3]}")
        return status

    def __exit__(self, *exc: object) -> None:
        """KILLs what is left; a block that ended without an exception is checked as
        ``stop`` checks (a killed worker's last access lines may be missing: never a
        500 the check would miss a line for)."""
        super().__exit__(*exc)
        silent = unlogged_errors(self.log_path) if exc[0] is None else []
        if silent:
            raise AssertionError(f"{len(silent)} answers of 500 without a log line naming the "
                                 f"cause in {self.log_path}, the first: {silent[:3]}")

    def slots_all_held(self) -> bool:
        """Every process slot of the data directory is claimed (by the workers)."""
        with Log(self.data_dir, Config(process_count=self.workers, background_flush=False)) as log:
            try:
                log.claim_slot()
            except NoFreeSlot:
                return True
            return False


ACCESS_LINE = b'"event":"request"'
LEVEL = re.compile(r"\[(DEBUG|INFO|WARNING|ERROR|CRITICAL)\]\s*(.*)")
DIGITS = re.compile(r"\d+")


CAUSE_EVENTS = ("error_answer", "internal_error")
# The gateway logs a cause once per minute per worker (gateway/errors.py, ErrorLog);
# the access line of an answer is written up to a batch interval after the answer.
CAUSE_WINDOW_S = 61.0


def unlogged_errors(path: Path) -> list[dict[str, Any]]:
    """The access lines of answers of 500 in a gateway's log that no line names the cause
    of: an "error_answer" of status 500 from the same worker (slot) at most CAUSE_WINDOW_S
    before, or an error line with a traceback (an exception the server caught) as near."""
    answers: list[dict[str, Any]] = []
    causes: dict[object, list[float]] = {}  # slot (None: any worker) -> when
    try:
        f = open(path, "rb")
    except OSError:
        return []
    with f:
        for raw in f:
            if not raw.startswith(b"{"):
                continue
            try:
                record = json.loads(raw)
            except ValueError:
                continue
            ts = float(record.get("ts", 0))
            if record.get("event") == "request":
                if record.get("status") == 500:
                    answers.append(record)
            elif record.get("event") in CAUSE_EVENTS and record.get("status", 500) == 500:
                causes.setdefault(record.get("slot"), []).append(ts)
            elif record.get("level") == "error" and record.get("exception"):
                causes.setdefault(None, []).append(ts)
    silent = []
    for a in answers:
        ts = float(a["ts"])
        near = causes.get(a.get("slot"), []) + causes.get(None, [])
        if not any(ts - CAUSE_WINDOW_S <= t <= ts + 1 for t in near):
            silent.append(a)
    return silent


def scan_log(path: Path) -> dict[str, Any]:
    """Tracebacks, and warning/error lines by message (digits as N) in a server's output:
    the gateway's JSON lines or gunicorn's ``[LEVEL]`` text; a line that is neither counts
    as a problem; info lines that mention an error are counted apart."""
    tracebacks, access = 0, 0
    problems: dict[str, int] = {}
    info_errors: dict[str, int] = {}
    try:
        f = open(path, "rb")
    except OSError:
        return {"tracebacks": 0, "warnings_or_errors": {"no log": 1},
                "info_lines_mentioning_errors": {}, "access_log_lines": 0}
    with f:
        for raw in f:
            if ACCESS_LINE in raw:
                access += 1
                continue
            line = raw.decode(errors="replace").rstrip()
            if not line.strip():
                continue
            tracebacks += "Traceback" in line
            level, text = "unparsed", line
            if line.startswith("{"):
                try:
                    record = json.loads(line)
                    level = str(record.get("level", "")).lower()
                    text = str(record.get("message") or record.get("event") or line)
                    tracebacks += bool(record.get("exception")) and "Traceback" not in line
                except ValueError:
                    pass
            elif match := LEVEL.search(line):
                level, text = match.group(1).lower(), match.group(2)
            text = DIGITS.sub("N", text)[:200]
            if level in ("warning", "error", "critical", "unparsed"):
                problems[text] = problems.get(text, 0) + 1
            elif "rror" in text or "xception" in text:
                info_errors[text] = info_errors.get(text, 0) + 1
    return {"tracebacks": tracebacks, "warnings_or_errors": problems,
            "info_lines_mentioning_errors": info_errors, "access_log_lines": access}
