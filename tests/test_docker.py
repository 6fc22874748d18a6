"""The images of docker/, built and run by a real Docker engine.

`make test` installs Docker and builds the local base image before pytest
(scripts/build-base-image.sh: debootstrap, no image registry needed); the fixtures run
the scripts again (no-ops then), so this module also works on its own.
scripts/install-docker.sh gives the engine: one that runs already, or a private dockerd
that the fixture stops again at the end.  Containers publish on 127.0.0.1 only and are
removed by id; the images stay (the build cache).  In CI (CI=true) an engine that cannot
run is a failure; elsewhere the tests skip, saying why.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, NoReturn

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "scripts"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
BASE_IMAGE = os.environ.get("COMET_BASE_IMAGE", "comet-base:bookworm")
TOKEN = secrets.token_hex(8)
NO_TOKENS = "auth is on but no tokens are configured"  # docs/docker.md, docker/Dockerfile

pytestmark = pytest.mark.timeout(900)  # a cold image build downloads from Debian and PyPI


def unavailable(reason: str) -> NoReturn:
    if IN_CI:
        pytest.fail(f"Docker must run in CI: {reason}")
    pytest.skip(reason)


def script(name: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPTS / name), *args], stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=900, env=env)


@dataclass
class Docker:
    cli: str
    env: dict[str, str]
    created: list[str] = field(default_factory=list)

    def __call__(self, *args: str, timeout: float = 120, check: bool = True) -> str:
        out = subprocess.run([self.cli, *args], env=self.env, stdin=subprocess.DEVNULL,
                             capture_output=True, text=True, timeout=timeout)
        if check and out.returncode != 0:
            raise AssertionError(f"docker {shlex.join(args)} exited {out.returncode}:\n{out.stderr[-4000:]}")
        return out.stdout.strip()

    def create(self, *args: str) -> str:
        cid = self("create", *args)
        self.created.append(cid)
        return cid

    def logs(self, cid: str) -> str:
        out = subprocess.run([self.cli, "logs", cid], env=self.env, capture_output=True, text=True, timeout=60)
        return out.stdout + out.stderr

    def start_and_wait(self, cid: str, wanted: tuple[str, ...], seconds: float = 120) -> str:
        """Starts the container and returns the first of its events (`docker events`) in
        `wanted`, "die" or "health_status: unhealthy"; "timeout" after `seconds`."""
        since = str(int(time.time()) - 1)  # replayed by the daemon: nothing is missed
        until = str(int(time.time() + seconds))
        with subprocess.Popen([self.cli, "events", "--since", since, "--until", until, "--filter",
                               f"container={cid}", "--format", "{{.Status}}"], env=self.env,
                              stdout=subprocess.PIPE, text=True) as events:
            assert events.stdout is not None
            self("start", cid)
            try:
                for line in events.stdout:
                    status = line.strip()
                    if status in wanted or status in ("die", "health_status: unhealthy"):
                        return status
                return "timeout"
            finally:
                events.terminate()


@pytest.fixture(scope="module")
def docker() -> Iterator[Docker]:
    if not Path("/usr/bin/apt-get").exists():
        unavailable("scripts/install-docker.sh needs Debian or Ubuntu (apt-get)")
    done = script("install-docker.sh")
    if done.returncode != 0:
        unavailable(f"scripts/install-docker.sh failed: {done.stderr.strip()[-3000:]}")
    found = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    engine = Docker(found["DOCKER"], {**os.environ, "DOCKER_HOST": found["DOCKER_HOST"], "DOCKER_BUILDKIT": "1"})
    try:
        yield engine
    finally:
        for cid in reversed(engine.created):  # --volumes-from users first: then the volume goes too
            engine("rm", "--force", "--volumes", cid, check=False)
        if found["DOCKER_STARTED"] == "1":
            script("install-docker.sh", "--stop")  # the private dockerd started above, by its pid


def build(docker: Docker, dockerfile: str, tag: str) -> str:
    base = script("build-base-image.sh", env={**os.environ, "COMET_BASE_IMAGE": BASE_IMAGE})
    assert base.returncode == 0, f"scripts/build-base-image.sh failed:\n{base.stderr[-4000:]}"
    previous = docker("image", "inspect", "--format", "{{.Id}}", tag, check=False)
    began = time.monotonic()
    docker("build", "--file", str(REPO / "docker" / dockerfile), "--build-arg", f"BASE_IMAGE={BASE_IMAGE}",
           "--tag", tag, str(REPO), timeout=840)
    print(f"docker build {dockerfile}: {time.monotonic() - began:.1f} s", file=sys.stderr)
    if previous and previous != docker("image", "inspect", "--format", "{{.Id}}", tag):
        docker("rmi", previous, check=False)  # the image this build replaced, by id
    return tag


@pytest.fixture(scope="module")
def image(docker: Docker) -> str:
    return build(docker, "Dockerfile", "comet-edge:test")


@pytest.fixture(scope="module")
def spark_image(docker: Docker) -> str:
    return build(docker, "Dockerfile.spark", "comet-edge-spark:test")


def http(url: str, body: bytes | None = None, token: str | None = None) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/x-ndjson"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, body, headers), timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def serve(docker: Docker, image: str) -> tuple[str, str]:
    """A gateway container, healthy through the image's own HEALTHCHECK (run every second
    here) and ready (every worker holds a slot); its id and URL on 127.0.0.1."""
    cid = docker.create("--publish", "127.0.0.1::8080", "--health-interval", "1s",
                        "--env", f"COMET_TOKENS={TOKEN}", "--env", "COMET_WORKERS=2", image)
    status = docker.start_and_wait(cid, ("health_status: healthy",))
    assert status == "health_status: healthy", f"{status}; container log:\n{docker.logs(cid)[-4000:]}"
    url = "http://" + docker("port", cid, "8080/tcp").splitlines()[0]
    deadline = time.monotonic() + 30
    while http(f"{url}/readyz")[0] != 200:  # no 503 "starting" from a worker still claiming its slot
        assert time.monotonic() < deadline, docker.logs(cid)[-4000:]
        time.sleep(0.1)
    return cid, url


def run_to_end(docker: Docker, *args: str, seconds: float = 120) -> tuple[int, str]:
    """`docker run` of a one-shot container: its exit code and log."""
    cid = docker.create(*args)
    assert docker.start_and_wait(cid, (), seconds) == "die", docker.logs(cid)[-4000:]
    return int(docker("inspect", "--format", "{{.State.ExitCode}}", cid)), docker.logs(cid)


def post(url: str, events: list[dict[str, object]]) -> dict[str, int]:
    body = b"".join(json.dumps(e).encode() + b"\n" for e in events)
    code, answer = http(f"{url}/streams/events", body, token=TOKEN)
    assert code == 202, answer
    stored: dict[str, int] = json.loads(answer)
    return stored


def test_gateway_container(docker: Docker, image: str) -> None:
    """Takes authenticated writes, stores them in the volume, drains and exits 0 on TERM."""
    cid, url = serve(docker, image)
    events = [{"device": f"d{i}", "temp": 20 + i} for i in range(3)]
    assert http(f"{url}/streams/events", b'{"a":1}')[0] == 401
    assert http(f"{url}/streams/events", b'{"a":1}', token="wrong")[0] == 403
    stored = post(url, events)
    assert stored["count"] == 3
    read = json.loads(http(f"{url}/streams/events/entries?shard={stored['shard']}&from={stored['first']}",
                           token=TOKEN)[1])
    assert [e["value"] for e in read["entries"]] == events
    stat = json.loads(docker("exec", cid, "comet", "stat", "/data", "--json"))
    assert sum(s["next_entry"] - s["first_entry"] for s in stat["events"]["shards"]) == 3

    assert docker("stop", "--time", "40", cid, timeout=60) == cid
    assert docker("inspect", "--format", "{{.State.ExitCode}}", cid) == "0", docker.logs(cid)[-4000:]
    assert run_to_end(docker, "--volumes-from", cid, image, "verify", "/data")[0] == 0  # the volume, after the stop


def test_gateway_container_refuses_to_start_without_tokens(docker: Docker, image: str) -> None:
    code, log = run_to_end(docker, image)
    assert code != 0
    assert NO_TOKENS in log


def test_spark_image_ships_the_gateway_volume(docker: Docker, image: str, spark_image: str) -> None:
    """`comet spark-ship` (Java 17, pyspark) from the Spark image, as compose runs it: on the
    gateway's volume, in the gateway's PID namespace, as the same user, while it serves."""
    gateway, url = serve(docker, image)
    events = [{"device": f"d{i % 3}", "temp": i / 2} for i in range(50)]
    post(url, events[:20])
    post(url, events[20:])
    code, log = run_to_end(docker, "--pid", f"container:{gateway}", "--volumes-from", gateway, spark_image,
                           "spark-ship", "/data", "events", "/data/lake", "--master", "local[2]",
                           "--schema", "device string, temp double", seconds=600)
    assert code == 0, log[-4000:]
    done = json.loads([line for line in log.splitlines() if line.startswith('{"run"')][-1])
    assert (done["rows"], done["rejects"]) == (50, 0)
    groups = json.loads(http(f"{url}/streams/events", token=TOKEN)[1])["groups"]
    assert [(g["name"], g["lag"]) for g in groups] == [("spark-ship", 0)]


def test_compose_commands_exist() -> None:
    """Every `comet` command line of compose.yaml (including the `sh -c` loop of spark-ship)
    names a command and options that the `comet` CLI has."""
    compose = yaml.safe_load((REPO / "docker" / "compose.yaml").read_text())
    comet = Path(sys.executable).with_name("comet")
    checked = 0
    for name, service in compose["services"].items():
        if not str(service.get("image", "")).startswith("comet-edge"):
            continue
        command = service.get("command", ["serve"])
        if service.get("entrypoint") == ["/bin/sh", "-c"]:
            lines = [shlex.split(m) for m in re.findall(r"\bcomet ([^&;\n]+)", "\n".join(command))]
        elif service.get("entrypoint") is None:
            lines = [command]
        else:
            continue  # pidns: sleep
        for argv in lines:
            helped = subprocess.run([str(comet), argv[0], "--help"], capture_output=True, text=True, timeout=60)
            assert helped.returncode == 0, f"{name}: comet {argv[0]}: {helped.stderr}"
            for option in (a for a in argv if a.startswith("--")):
                assert re.search(rf"(^|[\s,]){re.escape(option)}\b", helped.stdout), f"{name}: comet {argv[0]} {option}"
            checked += 1
    assert checked == 3  # gateway (serve), ship, spark-ship
