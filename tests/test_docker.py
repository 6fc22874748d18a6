"""The Docker files (docker/Dockerfile, docker/Dockerfile.spark, docker/compose.yaml,
.dockerignore), checked without a Docker engine.

Static checks parse the files (a small Dockerfile parser below, PyYAML plus
compose's variable interpolation for the compose file) and hold them against
the project itself:

* every ``comet`` command line (ENTRYPOINT + CMD, compose commands, ``comet``
  calls inside ``sh -c`` scripts) parses with the real click command objects of
  storage_c/cli.py (subcommand, options, option types, required arguments);
* every ``COMET_*`` variable is one the code reads (gateway/config.py's keys,
  and the literal names the sources look up);
* the gateway's effective configuration inside the image (ENV + command,
  through gateway.config.load) binds beyond loopback on the EXPOSEd port, uses
  the VOLUME as data directory, and refuses to start without tokens;
* the HEALTHCHECK asks a GET route of the app that needs no token;
* the builder installs what the Makefile installs (the zstd package, the pip
  bootstrap and --no-build-isolation, extras that exist) on the Python of
  requires-python; the runtime is slim, non-root and owns its volume;
* COPY sources exist, cover the packages pyproject.toml builds, and survive
  .dockerignore (matched with Docker's rules), which keeps build output out;
* compose: one shared data volume mounted where the commands expect it, one PID
  namespace for every container that opens it (test_robust_mutex_... shows
  why), S3 settings (endpoint, keys, WHEN_REQUIRED checksums) and a created
  bucket for every s3:// sink, published ports that match.

Mutation tests feed each check a broken copy and expect it to complain.

The slow tests emulate the image build on this machine (the host is the
image's Debian release and Python): the builder stage's RUN lines run as
written, with the container's absolute paths mapped into a temporary
directory and a fresh venv standing in for the image's system Python (apt
lines are checked against apt-cache instead); then the runtime stage's
command runs from the copied venv alone: ``comet serve`` answers the
HEALTHCHECK, and compose's ``ship`` and ``spark-ship`` command lines, with
compose's environment, ship to an S3 store (Swift's s3api when available,
which like older MinIO needs the WHEN_REQUIRED checksum setting; else moto).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator

import click
import pytest
import yaml

from .gatewayproc import free_port

REPO = Path(__file__).resolve().parent.parent
DOCKER = REPO / "docker"
DOCKERFILES = {"gateway": DOCKER / "Dockerfile", "spark": DOCKER / "Dockerfile.spark"}
COMPOSE = DOCKER / "compose.yaml"
DOCKERIGNORE = REPO / ".dockerignore"
# What the compose file needs from the environment in these tests.
COMPOSE_ENV = {"COMET_TOKENS": "compose-test-token"}
# Read by the code, but only as test hooks: never in a deployment file.
TEST_ONLY_VARS = {"COMET_SPARK_SHIP_CRASH"}
IMAGE_PATH = "/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin"  # python images' PATH
SYSTEM_DIRS = {"usr", "bin", "sbin", "lib", "lib64", "etc", "var", "tmp", "dev", "proc", "sys", "run"}


# ---- a Dockerfile parser ----------------------------------------------------------------------


@dataclasses.dataclass
class Instruction:
    cmd: str                    # upper case
    args: str                   # the rest of the logical line, flags removed
    flags: dict[str, str]       # --from=builder, --interval=15s, ...
    line: int

    def exec_form(self) -> list[str] | None:
        text = self.args
        if self.cmd == "HEALTHCHECK":
            text = re.sub(r"^CMD\s+", "", text)
        if text.startswith("["):
            value = json.loads(text)
            assert isinstance(value, list) and all(isinstance(v, str) for v in value)
            return value
        return None

    def argv(self) -> list[str]:
        """Exec form as is; shell form as docker runs it (/bin/sh -c)."""
        form = self.exec_form()
        if form is not None:
            return form
        text = re.sub(r"^CMD\s+", "", self.args) if self.cmd == "HEALTHCHECK" else self.args
        return ["/bin/sh", "-c", text]


@dataclasses.dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction]

    def all(self, cmd: str) -> list[Instruction]:
        return [i for i in self.instructions if i.cmd == cmd]

    def last(self, cmd: str) -> Instruction | None:
        found = self.all(cmd)
        return found[-1] if found else None

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(base or {"PATH": IMAGE_PATH})
        for ins in self.all("ENV"):
            words = shlex.split(ins.args)
            if words and all("=" in w for w in words):
                pairs = [w.split("=", 1) for w in words]
            else:                               # legacy ENV key value
                pairs = [[words[0], " ".join(words[1:])]]
            for key, value in pairs:
                env[key] = expand(value, env)
        return env

    def runs(self) -> list[str]:
        return [" ".join(i.argv()[2:]) if i.exec_form() is None else shlex.join(i.argv())
                for i in self.all("RUN")]


@dataclasses.dataclass
class Dockerfile:
    path: Path
    args: dict[str, str]
    stages: list[Stage]

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def stage(self, name: str) -> Stage:
        return next(s for s in self.stages if s.name == name)

    @property
    def builder(self) -> Stage:
        """The stage the final one copies from."""
        names = {i.flags["from"] for i in self.final.all("COPY") if "from" in i.flags}
        assert len(names) == 1, f"{self.path}: the runtime copies from one builder stage, not {names}"
        return self.stage(names.pop())

    def entry_argv(self) -> list[str]:
        entrypoint, cmd = self.final.last("ENTRYPOINT"), self.final.last("CMD")
        return (entrypoint.argv() if entrypoint else []) + (cmd.argv() if cmd else [])


def expand(text: str, env: dict[str, str]) -> str:
    """$VAR and ${VAR} as Dockerfile ENV/FROM expand them (unset: empty)."""
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: env.get(m.group(1) or m.group(2), ""), text)


def logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """Joins continuation lines; drops comments, parser directives and blank lines."""
    parts: list[str] = []
    start = 0
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue                    # comments and empty lines, also inside continuations
        if not parts:
            start = number
        if stripped.endswith("\\"):
            parts.append(stripped[:-1].strip())
            continue
        parts.append(stripped)
        yield start, " ".join(parts)
        parts = []
    if parts:
        yield start, " ".join(parts)


def parse_dockerfile(path: Path, text: str | None = None) -> Dockerfile:
    text = path.read_text() if text is None else text
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for number, logical in logical_lines(text):
        match = re.match(r"(\S+)\s*(.*)", logical)
        assert match, logical
        cmd, rest = match.group(1).upper(), match.group(2)
        flags: dict[str, str] = {}
        while True:
            flag = re.match(r"--([\w-]+)=(\S+)\s*(.*)", rest)
            if not flag:
                break
            flags[flag.group(1)] = flag.group(2)
            rest = flag.group(3)
        if cmd == "ARG" and not stages:
            name, _, default = rest.partition("=")
            args[name.strip()] = default.strip().strip('"')
            continue
        if cmd == "FROM":
            words = expand(rest, args).split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(words[0], name, []))
            continue
        assert stages, f"{path}:{number}: {cmd} before FROM"
        stages[-1].instructions.append(Instruction(cmd, rest, flags, number))
    return Dockerfile(path, args, stages)


# ---- shell commands inside RUN and compose scripts ---------------------------------------------

SHELL_OPERATORS = {";", "&", "&&", "|", "||", "(", ")", ";;", "\n"}
SHELL_PREFIXES = {"exec", "nohup", "time", "do", "then", "else", "if", "while", "until", "!", "{"}


def shell_commands(script: str) -> list[list[str]]:
    """The simple commands of a shell script (words, with quotes removed)."""
    out: list[list[str]] = []
    for line in script.splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        current: list[str] = []
        for token in lexer:
            if token in SHELL_OPERATORS:
                if current:
                    out.append(current)
                current = []
            else:
                current.append(token)
        if current:
            out.append(current)
    return out


def comet_calls(argv: list[str]) -> list[list[str]]:
    """The arguments of every `comet` invocation in a container's argv."""
    if not argv:
        return []
    if Path(argv[0]).name == "comet":
        return [argv[1:]]
    if Path(argv[0]).name in ("sh", "bash", "dash") and len(argv) >= 3 and argv[1] == "-c":
        calls = []
        for words in shell_commands(argv[2]):
            while words and (words[0] in SHELL_PREFIXES or re.fullmatch(r"\w+=.*", words[0])):
                words = words[1:]
            if words and Path(words[0]).name == "comet":
                calls.append(words[1:])
        return calls
    return []


def apt_packages(runs: list[str]) -> set[str]:
    packages = set()
    for run in runs:
        for words in shell_commands(run):
            if words[:2] == ["apt-get", "install"]:
                packages |= {w for w in words[2:] if not w.startswith("-")}
    return packages


def pip_commands(runs: list[str]) -> list[list[str]]:
    """`... pip install|wheel ...` commands, from `pip` on (``python -m pip`` too)."""
    out = []
    for run in runs:
        for words in shell_commands(run):
            for i, word in enumerate(words):
                if Path(word).name in ("pip", "pip3") and i + 1 < len(words):
                    out.append(words[i:])
                    break
    return out


# ---- the project side: commands, variables, routes, Makefile, pyproject ------------------------


def check_comet_call(args: list[str], where: str) -> tuple[list[str], dict[str, Any] | None]:
    """Parses a comet command line with the real click objects; (problems, params)."""
    from storage_c.cli import main

    if not args:
        return [f"{where}: `comet` without a command"], None
    command = main.commands.get(args[0])
    if command is None:
        return [f"{where}: comet has no command {args[0]!r} (it has {sorted(main.commands)})"], None
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            ctx = command.make_context(f"comet {args[0]}", list(args[1:]))
    except click.exceptions.Exit as exc:         # --help
        return ([] if exc.exit_code == 0 else [f"{where}: comet {shlex.join(args)} exits"]), None
    except click.ClickException as exc:
        return [f"{where}: comet {shlex.join(args)}: {exc.format_message()}"], None
    return [], {**ctx.params, "_command": args[0]}


def variable_problem(var: str, known: set[str]) -> str | None:
    if var in TEST_ONLY_VARS:
        return f"{var} is a test hook, not a setting"
    if var not in known:
        return f"{var} is not a variable the code reads"
    return None


def comet_variables() -> set[str]:
    """Every COMET_* environment variable the code reads."""
    from gateway.config import STORAGE, TOP_LEVEL

    names = {"COMET_CONFIG"} | {f"COMET_{k.upper()}" for k in TOP_LEVEL}
    names |= {f"COMET_STORAGE_{k.upper()}" for k in STORAGE}
    lookup = re.compile(r"""(?:environ\.get\(|env\.get\(|getenv\(|environ\[|env\[|envvar=)\s*["'](COMET_\w+)["']""")
    for package in ("storage_c", "consumers", "gateway", "spark_jobs"):
        for source in (REPO / package).rglob("*.py"):
            names |= set(lookup.findall(source.read_text()))
    return names


def app_routes() -> dict[str, set[str]]:
    from gateway.app import create_app
    from gateway.config import GatewayConfig

    app = create_app(GatewayConfig())
    return {route.path: set(route.methods or ()) for route in app.router.routes}


def makefile_recipe(target: str) -> str:
    lines = (REPO / "Makefile").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(rf"^{re.escape(target)}\s*:", line))
    recipe = []
    for line in lines[start + 1:]:
        if line and not line[0].isspace():
            break
        recipe.append(line.strip())
    return "\n".join(recipe).replace("\\\n", " ")


def makefile_install() -> dict[str, Any]:
    """What `make` installs: apt packages, the pip bootstrap, the project's pip flags."""
    zstd = set(re.findall(r"apt-get install -y -q (\S+)", makefile_recipe("system-deps")))
    java = set(re.findall(r"apt-get install -y -q (\S+)", makefile_recipe("test-deps")))
    pips = pip_commands([line.replace("$(PY)", "python") for line in makefile_recipe("$(STAMP)").splitlines()])
    bootstrap = next(c for c in pips if "--upgrade" in c)
    project = next(c for c in pips if "-e" in c)
    return {
        "system": zstd, "java": java,
        "bootstrap": {w for w in bootstrap[2:] if not w.startswith("-")},
        "project_flags": {w for w in project[2:] if w.startswith("--")},
    }


def pyproject() -> dict[str, Any]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def requirement_name(req: str) -> str:
    return re.split(r"[<>=!~\[ ;]", req, maxsplit=1)[0].strip().lower()


# ---- .dockerignore with Docker's rules ---------------------------------------------------------


def dockerignore_patterns(text: str) -> list[tuple[bool, re.Pattern[str]]]:
    """(exclude, regex) per line, as moby/patternmatcher compiles them."""
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        exclude = not line.startswith("!")
        line = line.lstrip("!").strip()
        line = os.path.normpath(line).lstrip("/")
        regex, i = "^", 0
        while i < len(line):
            ch = line[i]
            if line.startswith("**", i):
                i += 2
                if line.startswith("/", i):
                    regex += "(.*/)?"
                    i += 1
                else:
                    regex += ".*"
                continue
            if ch == "*":
                regex += "[^/]*"
            elif ch == "?":
                regex += "[^/]"
            elif ch == "[":
                end = line.index("]", i)
                regex += line[i:end + 1]
                i = end
            elif ch == "\\" and i + 1 < len(line):
                i += 1
                regex += re.escape(line[i])
            else:
                regex += re.escape(ch)
            i += 1
        out.append((exclude, re.compile(regex + "$")))
    return out


def ignored(rel: str, patterns: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """A path is left out when the last pattern matching it or a parent excludes it."""
    parts = rel.split("/")
    candidates = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    result = False
    for exclude, regex in patterns:
        if any(regex.match(c) for c in candidates):
            result = exclude
    return result


def context_files(patterns: list[tuple[bool, re.Pattern[str]]], under: str = "") -> list[str]:
    """The files of the build context below `under` (a file or a directory)."""
    base = REPO / under if under else REPO
    if base.is_file():
        return [] if ignored(under, patterns) else [under]
    found = []
    negations = any(not exclude for exclude, _ in patterns)
    for root, dirs, files in os.walk(base):
        rel_root = Path(root).relative_to(REPO).as_posix()
        rel_root = "" if rel_root == "." else rel_root + "/"
        if not negations:
            dirs[:] = [d for d in dirs if not ignored(rel_root + d, patterns)]
        found += [rel_root + f for f in files if not ignored(rel_root + f, patterns)]
    return found


# ---- compose -----------------------------------------------------------------------------------

INTERPOLATION = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<braced>\w+)(?:(?P<op>:?[-?+])(?P<arg>(?:[^{}]|\{[^{}]*\})*))?\}|(?P<named>\w+))")


class ComposeError(ValueError):
    pass


def interpolate(value: Any, env: dict[str, str], used: set[str]) -> Any:
    """Compose's variable interpolation over every string of a loaded file."""
    if isinstance(value, dict):
        return {k: interpolate(v, env, used) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env, used) for v in value]
    if not isinstance(value, str):
        return value

    def one(m: re.Match[str]) -> str:
        if m.group("escaped"):
            return "$"
        name = m.group("braced") or m.group("named")
        used.add(name)
        op, arg = m.group("op"), m.group("arg") or ""
        present = name in env and (env[name] != "" or not (op or "").startswith(":"))
        if op in (":-", "-"):
            return env[name] if present else interpolate(arg, env, used)
        if op in (":?", "?"):
            if not present:
                raise ComposeError(f"required variable {name} is missing a value: {arg}")
            return env[name]
        if op in (":+", "+"):
            return interpolate(arg, env, used) if present else ""
        return env.get(name, "")

    return INTERPOLATION.sub(one, value)


def load_compose(env: dict[str, str], text: str | None = None) -> tuple[dict[str, Any], set[str]]:
    raw = yaml.safe_load(COMPOSE.read_text() if text is None else text)
    used: set[str] = set()
    return interpolate(raw, env, used), used


def as_argv(value: Any) -> list[str] | None:
    if value is None:
        return None
    return shlex.split(value) if isinstance(value, str) else list(value)


def service_argv(svc: dict[str, Any], image: Dockerfile) -> list[str]:
    """Entrypoint + command the container runs (an entrypoint drops the image's CMD)."""
    entrypoint = as_argv(svc.get("entrypoint"))
    if entrypoint is not None:
        return entrypoint + (as_argv(svc.get("command")) or [])
    final = image.final
    image_entry = final.last("ENTRYPOINT")
    command = as_argv(svc.get("command"))
    if command is None:
        cmd = final.last("CMD")
        command = cmd.argv() if cmd else []
    return (image_entry.argv() if image_entry else []) + command


def service_env(svc: dict[str, Any]) -> dict[str, str]:
    env = svc.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


def named_mounts(svc: dict[str, Any], volumes: dict[str, Any]) -> dict[str, str]:
    """target -> named volume of a service's volume mounts."""
    out = {}
    for vol in svc.get("volumes") or []:
        if isinstance(vol, dict):
            source, target = vol.get("source"), vol.get("target")
        else:
            source, _, rest = vol.partition(":")
            target = rest.split(":")[0]
        if source in volumes:
            out[target] = source
    return out


def container_ports(svc: dict[str, Any]) -> set[int]:
    ports = set()
    for entry in svc.get("ports") or []:
        target = entry.get("target") if isinstance(entry, dict) else str(entry).split(":")[-1]
        ports.add(int(str(target).split("/")[0]))
    return ports


# ---- the checks (each returns a list of problems) ----------------------------------------------


def check_copy_sources(df: Dockerfile, ignore_text: str) -> list[str]:
    problems = []
    patterns = dockerignore_patterns(ignore_text)
    copied: set[str] = set()
    for stage in df.stages:
        for ins in stage.all("COPY") + stage.all("ADD"):
            if "from" in ins.flags:
                continue
            *sources, _dest = ins.exec_form() or shlex.split(ins.args)
            for src in sources:
                rel = src.rstrip("/")
                if not (REPO / rel).exists():
                    problems.append(f"{df.path.name}:{ins.line}: COPY source {src} does not exist")
                elif not context_files(patterns, rel):
                    problems.append(f"{df.path.name}:{ins.line}: COPY source {src} is excluded by .dockerignore")
                copied.add(rel)
    project = pyproject()
    setup_py = (REPO / "setup.py").read_text()
    needed = {"pyproject.toml", "setup.py", project["project"]["readme"],
              *project["tool"]["setuptools"]["packages"]}
    needed |= {m.split(":")[0] for m in re.findall(r"cffi_modules=\[\"([^\"]+)\"", setup_py)}
    for path in sorted(needed):
        if not any(path == c or path.startswith(c + "/") for c in copied):
            problems.append(f"{df.path.name}: the build needs {path}, which no COPY brings")
    return problems


def check_build(df: Dockerfile, kind: str) -> list[str]:
    """Base image, builder steps against the Makefile and pyproject.toml, runtime contents."""
    problems = []
    name = df.path.name
    project = pyproject()
    make = makefile_install()
    minimum = re.match(r">=\s*(\d+\.\d+)", project["project"]["requires-python"])
    bases = {s.base for s in df.stages}
    if len(bases) != 1:
        problems.append(f"{name}: builder and runtime must share one base image, not {sorted(bases)}")
    for base in bases:
        tag = re.fullmatch(r"python:(\d+\.\d+)-slim(?:-(\w+))?", base)
        if not tag:
            problems.append(f"{name}: base image {base} is not python:X.Y-slim-<release>")
        elif minimum and tag.group(1) != minimum.group(1):
            problems.append(f"{name}: base image Python {tag.group(1)} but requires-python {minimum.group(0)}")
    try:
        builder = df.builder
    except (AssertionError, StopIteration) as exc:
        return problems + [f"{name}: {exc or 'no builder stage'}"]
    runs = builder.runs()
    missing = make["system"] - apt_packages(runs)
    if missing:
        problems.append(f"{name}: the builder does not install {sorted(missing)} (make system-deps does)")
    pips = pip_commands(runs)
    bootstrap = [c for c in pips if c[1] == "install" and "--upgrade" in c]
    if not bootstrap or {w for w in bootstrap[0][2:] if not w.startswith("-")} != make["bootstrap"]:
        problems.append(f"{name}: the builder's pip bootstrap is not the Makefile's "
                        f"`pip install --upgrade {' '.join(sorted(make['bootstrap']))}`")
    build_requires = {requirement_name(r) for r in project["build-system"]["requires"]}
    if not build_requires <= make["bootstrap"]:
        problems.append(f"{name}: build-system requires {sorted(build_requires)} beyond the bootstrap")
    builds = [c for c in pips if c[1] == "wheel" or (c[1] == "install" and "." in c)]
    if not builds:
        problems.append(f"{name}: the builder never builds the project (`pip wheel .`)")
    for command in builds:
        if not make["project_flags"] <= set(command):
            problems.append(f"{name}: `{' '.join(command)}` lacks the Makefile's "
                            f"{sorted(make['project_flags'] - set(command))}")
    extras_known = set(project["project"]["optional-dependencies"])
    installs = [c for c in pips if c[1] == "install" and any(".whl" in w for w in c)]
    if not installs:
        problems.append(f"{name}: the builder never installs the built wheel")
    extras = set()
    for command in installs:
        for word in command:
            extras |= {e.strip() for m in re.findall(r"\.whl[^\[]*\[([^\]]*)\]", word) for e in m.split(",")}
    if extras - extras_known:
        problems.append(f"{name}: extras {sorted(extras - extras_known)} are not in pyproject.toml")
    expected_extras = {"gateway": set(), "spark": {"spark"}}[kind]
    if extras != expected_extras:
        problems.append(f"{name}: installs extras {sorted(extras)}, expected {sorted(expected_extras)}")
    # the runtime
    final = df.final
    runtime_apt = apt_packages(final.runs())
    if "libzstd1" not in runtime_apt:
        problems.append(f"{name}: the runtime does not install libzstd1 (the C core's library)")
    heavy = {p for p in runtime_apt if p.endswith("-dev") or p in ("gcc", "build-essential", "curl", "wget")}
    if heavy:
        problems.append(f"{name}: the runtime installs build or download tools {sorted(heavy)}")
    if kind == "spark" and not make["java"] <= runtime_apt:
        problems.append(f"{name}: the runtime lacks {sorted(make['java'] - runtime_apt)} (make test-deps' Java)")
    for ins in final.all("COPY"):
        if "from" in ins.flags:
            src, dest = shlex.split(ins.args)
            venvs = {w[w.index("venv") + 1] for w in shell_commands("\n".join(runs)) if "venv" in w[:-1]}
            if src.rstrip("/") not in venvs or dest.rstrip("/") != src.rstrip("/"):
                problems.append(f"{name}:{ins.line}: the runtime should copy the builder's venv "
                                f"{sorted(venvs)} to the same path, not {src} -> {dest}")
    return problems


def image_user(df: Dockerfile) -> tuple[int | None, list[str]]:
    """The numeric uid the image runs as, and problems with it."""
    name = df.path.name
    user = df.final.last("USER")
    if user is None:
        return None, [f"{name}: no USER: the container would run as root"]
    spec = user.args.split(":")[0]
    created = {}
    for words in shell_commands("\n".join(df.final.runs())):
        if words and words[0] == "useradd" and "--uid" in words:
            created[words[-1]] = int(words[words.index("--uid") + 1])
    uid = int(spec) if spec.isdigit() else created.get(spec)
    if spec in ("root", "0") or uid == 0:
        return 0, [f"{name}: USER {spec} is root"]
    if uid is None or uid not in created.values():
        return uid, [f"{name}: USER {spec} is not a user the image creates ({created})"]
    return uid, []


def check_runtime(df: Dockerfile, kind: str) -> list[str]:
    """User, volume, command, configuration, port and healthcheck of the final stage."""
    from gateway.auth import OPEN_PATHS
    from gateway.config import ConfigError, load

    name = df.path.name
    final = df.final
    uid, problems = image_user(df)
    volumes = []
    for ins in final.all("VOLUME"):
        volumes += ins.exec_form() or ins.args.split()
    if len(volumes) != 1:
        return problems + [f"{name}: expected one VOLUME (the data directory), got {volumes}"]
    volume = volumes[0]
    volume_line = final.last("VOLUME").line  # type: ignore[union-attr]
    if not any(i.cmd == "RUN" and i.line < volume_line and re.search(rf"chown \S+ {re.escape(volume)}\b", i.args)
               for i in final.instructions):
        problems.append(f"{name}: {volume} is not chowned to the user before VOLUME (a fresh volume "
                        "would be root's)")
    env = final.env()
    known = comet_variables()
    for var in env:
        problem = variable_problem(var, known) if var.startswith("COMET_") else None
        if problem:
            problems.append(f"{name}: ENV {problem}")
    calls = comet_calls(df.entry_argv())
    if not calls:
        return problems + [f"{name}: the entry point runs no comet command: {df.entry_argv()}"]
    for call in calls:
        found, params = check_comet_call(call, f"{name} ENTRYPOINT/CMD")
        problems += found
    if kind == "spark":
        if env.get("PYSPARK_PYTHON", "").rsplit("/bin/", 1)[0] not in {
                shlex.split(i.args)[-1].rstrip("/") for i in final.all("COPY") if "from" in i.flags}:
            problems.append(f"{name}: PYSPARK_PYTHON {env.get('PYSPARK_PYTHON')} is not the copied venv's")
        return problems
    if params is None or params["_command"] != "serve":
        return problems + [f"{name}: the gateway image does not run `comet serve`"]
    # the effective configuration: the environment, then the command line (as serve does)
    overrides = {k: params[k] for k in ("data_dir", "host", "port", "workers") if params.get(k) is not None}
    serve_env = {**env, **{f"COMET_{k.upper()}": str(v) for k, v in overrides.items()}}
    try:
        config = load(env={**serve_env, "COMET_TOKENS": "t"})
    except ConfigError as exc:
        return problems + [f"{name}: the image's configuration does not load: {exc}"]
    try:
        load(env=serve_env)
        problems.append(f"{name}: without COMET_TOKENS the gateway starts with no token "
                        "check: it must refuse to start instead")
    except ConfigError:
        pass                                   # refuses to start without tokens: documented
    from gateway.config import is_loopback

    if is_loopback(config.host):
        problems.append(f"{name}: the gateway binds {config.host}: unreachable from outside the container")
    exposed = {int(p.split("/")[0]) for i in final.all("EXPOSE") for p in i.args.split()}
    if exposed != {config.port}:
        problems.append(f"{name}: EXPOSE {sorted(exposed)} but the gateway listens on {config.port}")
    if os.path.normpath(config.data_dir) != os.path.normpath(volume):
        problems.append(f"{name}: the data directory is {config.data_dir} but the VOLUME is {volume}")
    health = final.last("HEALTHCHECK")
    if health is None:
        return problems + [f"{name}: no HEALTHCHECK"]
    argv = health.argv()
    text = " ".join(argv)
    if re.search(r"\b(curl|wget)\b", text):
        problems.append(f"{name}: the HEALTHCHECK uses curl/wget, which the slim image lacks")
    url = re.search(r"https?://([\w.\[\]:-]+?):([^/'\"]+)(/[\w./-]*)", text)
    if not url:
        return problems + [f"{name}: the HEALTHCHECK asks no http://host:port/path URL: {text}"]
    port_text, path = url.group(2), url.group(3)
    if port_text.isdigit():
        port = int(port_text)
    else:
        default = re.search(r"COMET_PORT['\"],\s*['\"](\d+)['\"]", text)   # environ.get('COMET_PORT', '8080')
        port = int(env.get("COMET_PORT", default.group(1))) if default else -1
    if port != config.port:
        problems.append(f"{name}: the HEALTHCHECK asks port {port_text} (-> {port}), the gateway "
                        f"listens on {config.port}")
    routes = app_routes()
    if "GET" not in routes.get(path, set()):
        problems.append(f"{name}: the HEALTHCHECK asks {path}, not a GET route of the app ({sorted(routes)})")
    if path not in OPEN_PATHS:
        problems.append(f"{name}: the HEALTHCHECK asks {path}, which needs a token")
    return problems


def check_compose(compose: dict[str, Any], used_vars: set[str],
                  images: dict[str, Dockerfile]) -> list[str]:
    problems: list[str] = []
    services: dict[str, dict[str, Any]] = compose.get("services") or {}
    volumes: dict[str, Any] = compose.get("volumes") or {}
    known = comet_variables()
    for var in sorted(used_vars):
        problem = variable_problem(var, known) if var.startswith("COMET_") else None
        if problem:
            problems.append(f"compose: interpolation ${problem}")
    # which image each service runs
    by_dockerfile = {path.resolve(): kind for kind, path in DOCKERFILES.items()}
    image_of: dict[str, str] = {}           # image name -> kind
    kind_of: dict[str, str] = {}            # service -> kind
    for name, svc in services.items():
        build = svc.get("build")
        if build is None:
            continue
        if isinstance(build, str):
            build = {"context": build}
        context = (DOCKER / build.get("context", ".")).resolve()
        dockerfile = (context / build.get("dockerfile", "Dockerfile")).resolve()
        if context != REPO:
            problems.append(f"compose: {name}: build context {context} is not the repository root")
        if dockerfile not in by_dockerfile:
            problems.append(f"compose: {name}: builds {dockerfile}, which is not one of {sorted(DOCKERFILES)}")
            continue
        kind_of[name] = by_dockerfile[dockerfile]
        if svc.get("image"):
            image_of[svc["image"]] = kind_of[name]
    for name, svc in services.items():
        if name not in kind_of and svc.get("image") in image_of:
            kind_of[name] = image_of[svc["image"]]
    data_volumes: dict[str, set[str]] = {}   # volume -> services using it as the data directory
    gateway_data: tuple[str, str] | None = None
    buckets = {}
    for name, svc in services.items():      # buckets created by one-shot services
        for words in shell_commands(" ".join(service_argv(svc, images["gateway"])[2:])
                                    if svc.get("entrypoint") else ""):
            if words[:2] == ["mc", "mb"]:
                target = [w for w in words[2:] if not w.startswith("-")][0]
                buckets[target.split("/", 1)[1]] = name
    for name, svc in services.items():
        env = service_env(svc)
        for var in env:
            problem = variable_problem(var, known) if var.startswith("COMET_") else None
            if problem:
                problems.append(f"compose: {name}: environment {problem}")
        kind = kind_of.get(name)
        if kind is None:
            continue
        image = images[kind]
        image_env = image.final.env()
        uid, _ = image_user(image)
        if "user" in svc and str(svc["user"]).split(":")[0] not in (str(uid), "comet"):
            problems.append(f"compose: {name}: user {svc['user']} differs from the image's uid {uid}")
        mounts = named_mounts(svc, volumes)
        calls = comet_calls(service_argv(svc, image))
        serves = False
        for call in calls:
            found, params = check_comet_call(call, f"compose: {name}")
            problems += found
            if params is None:
                continue
            effective_env = {**image_env, **env}
            if params["_command"] == "serve":
                from gateway.config import ConfigError, is_loopback, load

                serves = True
                overrides = {k: params[k] for k in ("data_dir", "host", "port") if params.get(k) is not None}
                try:
                    config = load(env={**effective_env, **{f"COMET_{k.upper()}": str(v)
                                                           for k, v in overrides.items()}})
                except ConfigError as exc:
                    problems.append(f"compose: {name}: the gateway's configuration does not load: {exc}")
                    continue
                data_dir = config.data_dir
                if is_loopback(config.host):
                    problems.append(f"compose: {name}: the gateway binds {config.host}: unreachable "
                                    "through the published port")
                if config.port not in container_ports(svc):
                    problems.append(f"compose: {name}: publishes container ports {sorted(container_ports(svc))}"
                                    f" but the gateway listens on {config.port}")
            elif "data_dir" in params:
                data_dir = params["data_dir"]
            else:
                continue
            volume = mounts.get(os.path.normpath(data_dir))
            if volume is None:
                problems.append(f"compose: {name}: the data directory {data_dir} is not a named volume "
                                f"mount (mounts: {mounts})")
            else:
                data_volumes.setdefault(volume, set()).add(name)
                if params["_command"] == "serve":
                    gateway_data = (name, volume)
            for url in (params.get("sink"), params.get("lake")):
                if not url or not str(url).startswith("s3://"):
                    continue
                endpoint = params.get("endpoint_url") if "--endpoint-url" in call else None
                endpoint = endpoint or effective_env.get("AWS_ENDPOINT_URL")
                if not endpoint:
                    problems.append(f"compose: {name}: {url} without AWS_ENDPOINT_URL or --endpoint-url")
                else:
                    host = re.sub(r"^\w+://", "", endpoint).split(":")[0].split("/")[0]
                    if host not in services:
                        problems.append(f"compose: {name}: S3 endpoint {endpoint} is not a compose service")
                for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
                    if not effective_env.get(var):
                        problems.append(f"compose: {name}: {url} needs {var}")
                if effective_env.get("AWS_REQUEST_CHECKSUM_CALCULATION", "").upper() != "WHEN_REQUIRED":
                    problems.append(f"compose: {name}: AWS_REQUEST_CHECKSUM_CALCULATION=WHEN_REQUIRED is "
                                    "missing (MinIO before 2025 refuses the newer checksums)")
                bucket = str(url)[5:].split("/")[0]
                creator = buckets.get(bucket)
                if creator is None:
                    problems.append(f"compose: {name}: no service creates bucket {bucket} ({buckets})")
                else:
                    dep = (svc.get("depends_on") or {})
                    condition = dep.get(creator, {}).get("condition") if isinstance(dep, dict) else None
                    if condition != "service_completed_successfully":
                        problems.append(f"compose: {name}: does not wait for {creator} to create {bucket}")
        has_check = image.final.last("HEALTHCHECK") is not None or "healthcheck" in svc
        disabled = (svc.get("healthcheck") or {}).get("disable") is True
        if has_check and not serves and not disabled:
            problems.append(f"compose: {name}: inherits the gateway's HEALTHCHECK but serves no HTTP "
                            "(healthcheck: disable: true)")
        if serves and disabled:
            problems.append(f"compose: {name}: the gateway's healthcheck is disabled")
    if gateway_data is None:
        problems.append("compose: no service runs `comet serve` with its data directory on a named volume")
    if len(data_volumes) > 1:
        problems.append(f"compose: the comet services use different data volumes: {data_volumes}")
    # one PID namespace for every container that opens the data directory
    for volume, users in data_volumes.items():
        users = users | {n for n, s in services.items() if volume in named_mounts(s, volumes).values()}
        holders = set()
        for user in sorted(users):
            pid = services[user].get("pid")
            if pid is None or not str(pid).startswith("service:"):
                problems.append(f"compose: {user}: mounts {volume} without joining the shared PID namespace "
                                "(pid: \"service:<holder>\"): robust mutexes need one PID namespace")
            else:
                holders.add(str(pid).split(":", 1)[1])
        if len(holders) > 1:
            problems.append(f"compose: the users of {volume} join different PID namespaces: {sorted(holders)}")
        for holder in holders:
            if holder not in services:
                problems.append(f"compose: PID namespace holder {holder} is not a service")
            elif not services[holder].get("init"):
                problems.append(f"compose: {holder} holds the PID namespace without `init: true` "
                                "(nothing would reap orphans)")
    return problems


# ---- fixtures and static tests -----------------------------------------------------------------


@pytest.fixture(scope="module")
def images() -> dict[str, Dockerfile]:
    return {kind: parse_dockerfile(path) for kind, path in DOCKERFILES.items()}


def test_dockerfile_parser_handles_continuations_and_forms() -> None:
    df = parse_dockerfile(Path("x"), "# syntax=docker/dockerfile:1\nARG B=python:3.11-slim\n"
                          "FROM ${B} AS b\nRUN a \\\n  # note\n  && b\nFROM $B\n"
                          'ENV A=1 P=/x:$PATH\nCMD ["c", "d e"]\nHEALTHCHECK --interval=5s CMD x y\n')
    assert [s.base for s in df.stages] == ["python:3.11-slim", "python:3.11-slim"]
    assert df.stages[0].runs() == ["a && b"]
    assert df.final.env()["P"] == "/x:" + IMAGE_PATH
    assert df.entry_argv() == ["c", "d e"]
    health = df.final.last("HEALTHCHECK")
    assert health is not None and health.flags == {"interval": "5s"}
    assert health.argv() == ["/bin/sh", "-c", "x y"]
    assert comet_calls(["/bin/sh", "-c", "trap 'x' TERM\nwhile :; do A=1 comet ship d s t --once & w=$!; done"]) \
        == [["ship", "d", "s", "t", "--once"]]


@pytest.mark.parametrize("kind", sorted(DOCKERFILES))
def test_dockerfile_builds_like_the_makefile(images: dict[str, Dockerfile], kind: str) -> None:
    assert check_build(images[kind], kind) == []


@pytest.mark.parametrize("kind", sorted(DOCKERFILES))
def test_dockerfile_copies_exist_and_survive_dockerignore(images: dict[str, Dockerfile], kind: str) -> None:
    assert check_copy_sources(images[kind], DOCKERIGNORE.read_text()) == []


@pytest.mark.parametrize("kind", sorted(DOCKERFILES))
def test_dockerfile_runtime(images: dict[str, Dockerfile], kind: str) -> None:
    assert check_runtime(images[kind], kind) == []


def test_images_share_base_and_user(images: dict[str, Dockerfile]) -> None:
    assert images["gateway"].final.base == images["spark"].final.base
    assert image_user(images["gateway"])[0] == image_user(images["spark"])[0]


def test_gateway_image_refuses_to_start_without_tokens(images: dict[str, Dockerfile]) -> None:
    from gateway.config import ConfigError, load

    env = images["gateway"].final.env()
    with pytest.raises(ConfigError, match="no tokens"):
        load(env=env)
    assert load(env={**env, "COMET_TOKENS": "a,b"}).tokens == ("a", "b")
    assert not load(env={**env, "COMET_AUTH": "off"}).auth_required


def test_dockerignore_keeps_build_output_out() -> None:
    patterns = dockerignore_patterns(DOCKERIGNORE.read_text())
    for path in (".venv/bin/python", ".venv-locust/bin/python", "build/c/test_append", "data/events/0/state",
                 ".bench-tmp/x", "loadtests/.scratch/run/1", ".git/HEAD", "storage_c/_comet.abi3.so",
                 "storage_c/_comet.c", "gateway/__pycache__/app.cpython-311.pyc", "comet_edge.egg-info/PKG-INFO",
                 "storage_c/x.o", "docker/.env", ".pytest_cache/v"):
        assert ignored(path, patterns), path
    for path in ("README.md", "pyproject.toml", "setup.py", "MANIFEST.in", "storage_c/src/shard.c",
                 "storage_c/include/comet.h", "storage_c/_build.py", "gateway/app.py", "spark_jobs/LAKE.md",
                 "docker/Dockerfile"):
        assert not ignored(path, patterns), path
    sent = context_files(patterns)
    assert sent and not [p for p in sent if p.endswith((".so", ".pyc")) or "__pycache__" in p
                         or p.startswith((".venv", ".git/", "build/", "data/"))]


def test_compose_file() -> None:
    compose, used = load_compose(COMPOSE_ENV)
    assert check_compose(compose, used, {k: parse_dockerfile(p) for k, p in DOCKERFILES.items()}) == []


def test_compose_requires_tokens() -> None:
    with pytest.raises(ComposeError, match="COMET_TOKENS"):
        load_compose({})
    compose, _ = load_compose({"COMET_TOKENS": "x,y"})
    assert service_env(compose["services"]["gateway"])["COMET_TOKENS"] == "x,y"


def test_compose_interpolation() -> None:
    used: set[str] = set()
    env = {"A": "1", "E": ""}
    assert interpolate("$$x ${A} ${B:-d} ${E:-d} ${E-d} ${A:+y} $A", env, used) == "$x 1 d d  y 1"
    assert used == {"A", "B", "E"}
    with pytest.raises(ComposeError):
        interpolate("${E:?no}", env, used)


def test_compose_scripts(tmp_path: Path) -> None:
    """The sh -c scripts of compose.yaml parse, and the spark-ship loop keeps
    going after a failed run and stops promptly (exit 0) on TERM, also while a
    run is in progress.  `comet` is a stub here."""
    compose, _ = load_compose({**COMPOSE_ENV, "SPARK_SHIP_INTERVAL": "1"})
    for name, svc in compose["services"].items():
        argv = as_argv(svc.get("entrypoint") or []) + (as_argv(svc.get("command")) or [])
        if argv[:2] == ["/bin/sh", "-c"]:
            assert subprocess.run(["sh", "-n", "-c", argv[2]]).returncode == 0, name
    svc = compose["services"]["spark-ship"]
    argv = service_argv(svc, parse_dockerfile(DOCKERFILES["spark"]))
    stub = tmp_path / "bin" / "comet"
    stub.parent.mkdir()
    stub.write_text('#!/bin/sh\necho "$*" >> "$CALLS"\n[ -f "$HANG" ] && exec sleep 30\nexit 1\n')
    stub.chmod(0o755)
    calls, hang = tmp_path / "calls", tmp_path / "hang"
    env = {"PATH": f"{stub.parent}:/usr/bin:/bin", "CALLS": str(calls), "HANG": str(hang)}
    for hanging in (False, True):
        calls.write_text("")
        if hanging:
            hang.write_text("")
        loop = subprocess.Popen(argv, env=env)
        deadline = time.monotonic() + 20
        want = 1 if hanging else 2          # a failed run is followed by another one
        while len(calls.read_text().splitlines()) < want and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.2)
        loop.send_signal(signal.SIGTERM)
        assert loop.wait(timeout=10) == 0
        lines = calls.read_text().splitlines()
        assert len(lines) >= want and set(lines) == {"spark-ship /data events s3://comet/lake --group spark-ship"}


# ---- the checks can fail -----------------------------------------------------------------------


def mutate_compose(change: Callable[[dict[str, Any]], None]) -> list[str]:
    compose, used = load_compose(COMPOSE_ENV)
    compose = copy.deepcopy(compose)
    change(compose)
    return check_compose(compose, used, {k: parse_dockerfile(p) for k, p in DOCKERFILES.items()})


def _set(path: list[str], value: Any) -> Callable[[dict[str, Any]], None]:
    def change(compose: dict[str, Any]) -> None:
        node = compose
        for key in path[:-1]:
            node = node[key]
        if value is None:
            del node[path[-1]]
        else:
            node[path[-1]] = value
    return change


COMPOSE_MUTATIONS: dict[str, tuple[Callable[[dict[str, Any]], Any], str]] = {
    "bogus option": (lambda c: c["services"]["ship"]["command"].append("--bogus-option"), "--bogus-option"),
    "bogus command": (lambda c: c["services"]["ship"]["command"].__setitem__(0, "shipp"), "no command 'shipp'"),
    "bad option value": (lambda c: c["services"]["ship"]["command"].extend(["--level", "high"]), "--level"),
    "option in the spark loop": (lambda c: c["services"]["spark-ship"].__setitem__(
        "command", [c["services"]["spark-ship"]["command"][0].replace("--group", "--groupe")]), "--groupe"),
    "unknown COMET_ variable": (_set(["services", "gateway", "environment", "COMET_WORKER"], "2"), "COMET_WORKER"),
    "test-only hook": (_set(["services", "ship", "environment", "COMET_SPARK_SHIP_CRASH"], "x"),
                       "COMET_SPARK_SHIP_CRASH"),
    "port mismatch": (_set(["services", "gateway", "ports"], ["8080:9090"]), "listens on 8080"),
    "gateway port override unpublished": (_set(["services", "gateway", "environment", "COMET_PORT"], "9000"),
                                          "listens on 9000"),
    "no shared PID namespace": (_set(["services", "ship", "pid"], None), "PID namespace"),
    "two PID namespaces": (_set(["services", "ship", "pid"], "service:gateway"), "different PID namespaces"),
    "holder without init": (_set(["services", "pidns", "init"], False), "init"),
    "data dir not on the volume": (_set(["services", "ship", "volumes"], ["comet-data:/srv"]), "/data"),
    "two data volumes": (lambda c: (c["volumes"].__setitem__("other", None),
                                    _set(["services", "ship", "volumes"], ["other:/data"])(c)), "different data"),
    "no checksum setting": (_set(["services", "ship", "environment", "AWS_REQUEST_CHECKSUM_CALCULATION"], None),
                            "WHEN_REQUIRED"),
    "no S3 endpoint": (_set(["services", "spark-ship", "environment", "AWS_ENDPOINT_URL"], None),
                       "AWS_ENDPOINT_URL"),
    "bucket nobody creates": (lambda c: c["services"]["ship"]["command"].__setitem__(3, "s3://other/raw"),
                              "bucket other"),
    "bucket not awaited": (_set(["services", "ship", "depends_on", "minio-init"], None), "does not wait"),
    "worker with the gateway's healthcheck": (_set(["services", "ship", "healthcheck"], None), "HEALTHCHECK"),
    "root user": (_set(["services", "ship", "user"], "0"), "uid"),
    "loopback-only gateway": (_set(["services", "gateway", "environment", "COMET_HOST"], "127.0.0.1"),
                              "unreachable"),
}


@pytest.mark.parametrize("mutation", sorted(COMPOSE_MUTATIONS))
def test_compose_check_reports(mutation: str) -> None:
    change, expected = COMPOSE_MUTATIONS[mutation]
    problems = mutate_compose(change)
    assert problems, f"{mutation}: nothing reported"
    assert any(expected in p for p in problems), problems


DOCKERFILE_MUTATIONS = {
    "healthcheck path": ("gateway", "/healthz' %", "/health' %", "not a GET route"),
    "healthcheck port": ("gateway", "'http://127.0.0.1:%s/healthz' % os.environ.get('COMET_PORT', '8080')",
                         "'http://127.0.0.1:9999/healthz'", "asks port 9999"),
    "healthcheck with curl": ("gateway", 'CMD ["python", "-c", "import os, urllib.request;',
                              'CMD ["curl", "-c", "import os, urllib.request;', "curl"),
    "root user": ("gateway", "USER 10001:10001", "USER root", "root"),
    "no user": ("spark", "USER 10001:10001", "", "root"),
    "exposed port": ("gateway", "EXPOSE 8080", "EXPOSE 9090", "EXPOSE [9090]"),
    "port in the command": ("gateway", 'CMD ["serve"]', 'CMD ["serve", "--port", "9000"]', "listens on 9000"),
    "volume": ("gateway", 'VOLUME ["/data"]', 'VOLUME ["/var/lib/comet"]', "VOLUME is /var/lib/comet"),
    "loopback bind": ("gateway", "COMET_HOST=0.0.0.0", "COMET_HOST=127.0.0.1", "unreachable"),
    "auth off": ("gateway", "COMET_AUTH=on\n", "COMET_AUTH=off\n", "no token check"),
    "unknown variable": ("gateway", "COMET_AUTH=on\n", "COMET_AUTH=on COMET_WORKER=2\n", "COMET_WORKER"),
    "bogus serve option": ("gateway", 'CMD ["serve"]', 'CMD ["serve", "--bind", "x"]', "--bind"),
    "missing COPY source": ("gateway", "COPY gateway/ gateway/", "COPY gateways/ gateway/", "does not exist"),
    "package not copied": ("spark", "COPY consumers/ consumers/\n", "", "needs consumers"),
    "ignored COPY source": ("gateway", "COPY storage_c/ storage_c/",
                            "COPY storage_c/ storage_c/\nCOPY .git/ .git/", "excluded by .dockerignore"),
    "no zstd headers": ("gateway", "gcc libc6-dev libzstd-dev", "gcc libc6-dev", "libzstd-dev"),
    "build isolation": ("gateway", "--no-build-isolation --no-deps", "--no-deps", "--no-build-isolation"),
    "bootstrap differs": ("gateway", "--upgrade pip setuptools wheel cffi", "--upgrade pip wheel cffi", "bootstrap"),
    "unknown extra": ("spark", "[spark]", "[sparks]", "sparks"),
    "Python version": ("gateway", "python:3.11-slim-bookworm", "python:3.12-slim-bookworm", "Python 3.12"),
    "different bases": ("spark", "FROM ${PYTHON_IMAGE}\n", "FROM python:3.11-slim-trixie\n", "one base image"),
    "no Java": ("spark", "openjdk-17-jre-headless ", "", "openjdk-17-jre-headless"),
    "compiler at run time": ("gateway", "--no-install-recommends libzstd1", "--no-install-recommends libzstd1 gcc",
                             "build or download tools"),
    "volume owned by root": ("gateway", " && chown comet:comet /data", "", "chowned"),
    "venv copied elsewhere": ("gateway", "COPY --from=builder /opt/comet /opt/comet",
                              "COPY --from=builder /opt/comet /usr/local", "same path"),
}


@pytest.mark.parametrize("mutation", sorted(DOCKERFILE_MUTATIONS))
def test_dockerfile_checks_report(mutation: str) -> None:
    kind, old, new, expected = DOCKERFILE_MUTATIONS[mutation]
    text = DOCKERFILES[kind].read_text()
    assert old in text, f"{mutation}: {old!r} is not in {DOCKERFILES[kind].name} any more"
    df = parse_dockerfile(DOCKERFILES[kind], text.replace(old, new, 1))
    problems = (check_build(df, kind) + check_runtime(df, kind)
                + check_copy_sources(df, DOCKERIGNORE.read_text()))
    assert any(expected in p for p in problems), problems


def test_dockerignore_check_reports() -> None:
    naive = DOCKERIGNORE.read_text().replace("**/*.so", "*.so").replace("**/__pycache__", "__pycache__")
    patterns = dockerignore_patterns(naive)
    assert not ignored("storage_c/_comet.abi3.so", patterns)       # Docker matches from the root
    assert not ignored("gateway/__pycache__", patterns)
    df = parse_dockerfile(DOCKERFILES["gateway"])
    assert any("excluded by .dockerignore" in p
               for p in check_copy_sources(df, DOCKERIGNORE.read_text() + "\nREADME.md\n"))


# ---- why compose shares one PID namespace ------------------------------------------------------

FUTEX_DEMO = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
/* A process-shared robust mutex in a mapped file, set up like storage_c/src/state.c's. */
int main(int argc, char **argv) {
    int fd = open(argv[1], O_RDWR | O_CREAT, 0644);
    if (fd < 0 || ftruncate(fd, 4096)) return 2;
    pthread_mutex_t *m = mmap(0, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) return 2;
    if (!strcmp(argv[2], "init")) {
        pthread_mutexattr_t a;
        pthread_mutexattr_init(&a);
        pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
        pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
        return pthread_mutex_init(m, &a);
    }
    if (!strcmp(argv[2], "hold")) {            /* lock, say so (argv[3] appears), keep it */
        if (pthread_mutex_lock(m)) return 3;
        close(open(argv[3], O_WRONLY | O_CREAT, 0644));
        printf("held\n");
        fflush(stdout);
        sleep(30);
        return 0;
    }
    if (!strcmp(argv[2], "wait")) {            /* argv[3] appears, then block on the lock */
        close(open(argv[3], O_WRONLY | O_CREAT, 0644));
        pthread_mutex_lock(m);
        return 0;
    }
    int rc = pthread_mutex_trylock(m);         /* "try": what a third process finds */
    printf("%s\n", rc == EOWNERDEAD ? "EOWNERDEAD" : rc == EBUSY ? "EBUSY" : rc ? "ERROR" : "FREE");
    return 0;
}
"""


def _pid_namespaces_available() -> str | None:
    if shutil.which("unshare") is None or shutil.which("gcc") is None:
        return "needs unshare and gcc"
    probe = subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True)
    return None if probe.returncode == 0 else f"cannot create PID namespaces here: {probe.stderr.decode()[:200]}"


def futex_scenario(demo: Path, lock: Path, shared_namespace: bool) -> str:
    """A holder and a waiter with the same pid (2) in separate PID namespaces, or
    both in one namespace; the waiter is killed with SIGKILL while it waits; what
    does a third process find?  ``unshare`` stands in for two containers."""
    subprocess.run([str(demo), str(lock), "init"], check=True)
    held, waiting = f"{lock}.held", f"{lock}.waiting"
    until = "while [ ! -e {0} ]; do sleep 0.05; done; sleep 0.2"   # then the waiter is in futex_wait
    kill_waiter = f"{demo} {lock} wait {waiting} & w=$!; {until.format(waiting)}; kill -9 $w; wait $w"
    if shared_namespace:
        script = (f"{demo} {lock} hold {held} & h=$!; {until.format(held)}; {kill_waiter}; "
                  f"{demo} {lock} try; kill $h")
        out = subprocess.run(["unshare", "--pid", "--fork", "sh", "-c", script],
                             capture_output=True, text=True, timeout=30)
        return out.stdout.split()[-1]
    holder = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", "sh", "-c",
                               f"{demo} {lock} hold {held} & wait"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        subprocess.run(["unshare", "--pid", "--fork", "sh", "-c", kill_waiter], capture_output=True, timeout=30)
        return subprocess.run([str(demo), str(lock), "try"], capture_output=True, text=True,
                              check=True).stdout.strip()
    finally:
        holder.kill()
        holder.wait()


def test_robust_mutex_needs_one_pid_namespace(tmp_path: Path) -> None:
    """The reason compose.yaml puts every user of the data volume into one PID
    namespace: the kernel's robust-futex cleanup compares the dead thread's id,
    in its own namespace, with the id stored in the lock word.  A waiter killed
    in one namespace whose pid equals the live holder's pid in another makes the
    kernel mark the lock owner-dead: a third process then takes a lock that is
    still held (the storage would 'repair' a batch being appended).  In one
    namespace the same sequence leaves the lock held."""
    reason = _pid_namespaces_available()
    if reason:
        pytest.skip(reason)
    demo = tmp_path / "futex_demo"
    (tmp_path / "futex_demo.c").write_text(FUTEX_DEMO)
    subprocess.run(["gcc", "-O1", "-o", str(demo), str(tmp_path / "futex_demo.c"), "-lpthread"], check=True)
    assert futex_scenario(demo, tmp_path / "one", shared_namespace=True) == "EBUSY"
    assert futex_scenario(demo, tmp_path / "two", shared_namespace=False) == "EOWNERDEAD"


# ---- the image, built and run without an engine (slow) ----------------------------------------


def _pypi_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
        return True
    except OSError:
        return False


@dataclasses.dataclass
class EmulatedImage:
    root: Path                       # the containers' file system roots live under it
    dockerfile: Dockerfile
    env: dict[str, str]              # the runtime stage's environment, paths mapped
    workdir: Path
    map: Callable[[str], str]
    apt: set[str]
    log: list[str]

    def run(self, argv: list[str], env: dict[str, str] | None = None, **kw: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.map(a) for a in argv], env={**self.env, **(env or {})}, cwd=self.workdir,
                              capture_output=True, text=True, **kw)

    def popen(self, argv: list[str], env: dict[str, str] | None = None, **kw: Any) -> subprocess.Popen[bytes]:
        return subprocess.Popen([self.map(a) for a in argv], env={**self.env, **(env or {})}, cwd=self.workdir,
                                **kw)


def path_mapper(df: Dockerfile, root: Path) -> Callable[[str], str]:
    """Maps the container paths the Dockerfile uses (/src, /opt/..., /data, ...) under root."""
    text = "\n".join(f"{i.args}" for s in df.stages for i in s.instructions)
    tops = {m for m in re.findall(r"(?<![\w.:/$-])/([\w.-]+)", text) if m not in SYSTEM_DIRS}
    pattern = re.compile(r"(?<![\w.:/-])(/(?:" + "|".join(map(re.escape, sorted(tops))) + r"))(?=[/\s\"':]|$)")
    return lambda value: pattern.sub(lambda m: str(root) + m.group(1), value)


def emulate_build(df: Dockerfile, root: Path) -> EmulatedImage:
    """Runs the Dockerfile's builder on this host; returns the runtime stage's view."""
    mapped = path_mapper(df, root)
    ignore = dockerignore_patterns(DOCKERIGNORE.read_text())
    log: list[str] = []
    # the image's system Python: a fresh venv of this interpreter's base installation
    system_python = root / "_image_python"
    base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    subprocess.run([str(base), "-m", "venv", str(system_python)], check=True)
    passthrough = {k: v for k, v in os.environ.items()
                   if k.startswith("PIP_") or k.lower().endswith("_proxy") or k in ("HOME", "LANG")}
    apt: set[str] = set()
    builder = df.builder
    for stage in df.stages:
        workdir = root
        env = stage.env()
        for ins in stage.instructions:
            if ins.cmd == "WORKDIR":
                workdir = Path(mapped(ins.args))
                workdir.mkdir(parents=True, exist_ok=True)
            elif ins.cmd == "COPY" and "from" not in ins.flags:
                *sources, dest = ins.exec_form() or shlex.split(ins.args)
                target = Path(mapped(dest)) if dest.startswith("/") else workdir / dest
                for src in (s.rstrip("/") for s in sources):
                    is_dir = (REPO / src).is_dir()
                    for rel in context_files(ignore, src):
                        if is_dir:                  # a directory's contents go into dest
                            out = target / Path(rel).relative_to(src)
                        elif dest.endswith("/") or len(sources) > 1:
                            out = target / Path(rel).name
                        else:
                            out = target
                        out.parent.mkdir(parents=True, exist_ok=True)
                        shutil.copy2(REPO / rel, out)
            elif ins.cmd == "COPY":
                src = Path(mapped(shlex.split(ins.args)[0]))
                assert src.exists(), f"COPY --from: {src} was not built"
                dest = Path(mapped(shlex.split(ins.args)[1]))
                if dest != src:
                    shutil.copytree(src, dest, symlinks=True, dirs_exist_ok=True)
            elif ins.cmd == "RUN" and stage is builder:
                command = " ".join(ins.argv()[2:])
                if "apt-get" in command:
                    apt |= apt_packages([command])
                    continue
                run_env = {**passthrough, **{k: mapped(v) for k, v in env.items()},
                           "PATH": f"{system_python / 'bin'}:{mapped(env['PATH'])}"}
                began = time.monotonic()
                done = subprocess.run(["/bin/sh", "-c", mapped(command)], cwd=workdir, env=run_env,
                                      capture_output=True, text=True)
                log.append(f"RUN {command} ({time.monotonic() - began:.1f} s)")
                assert done.returncode == 0, f"{df.path.name}:{ins.line}: {command}\n{done.stdout}\n{done.stderr}"
            elif ins.cmd == "RUN":
                apt |= apt_packages([" ".join(ins.argv()[2:])])   # the runtime's user and volume: not here
    final = df.final
    env = {k: mapped(v) for k, v in final.env().items()}
    env["PATH"] = mapped(final.env()["PATH"])
    env.update(LANG="C.UTF-8", HOME=mapped("/home/comet"))
    workdir = Path(mapped(final.last("WORKDIR").args)) if final.last("WORKDIR") else root  # type: ignore[union-attr]
    workdir.mkdir(parents=True, exist_ok=True)
    for volume in final.last("VOLUME").exec_form() or []:  # type: ignore[union-attr]
        Path(mapped(volume)).mkdir(parents=True, exist_ok=True)
    return EmulatedImage(root, df, env, workdir, mapped, apt, log)


@pytest.fixture(scope="module")
def gateway_image(tmp_path_factory: pytest.TempPathFactory) -> EmulatedImage:
    if not _pypi_reachable():
        pytest.skip("PyPI is not reachable: the builder stage installs from it")
    return emulate_build(parse_dockerfile(DOCKERFILES["gateway"]), tmp_path_factory.mktemp("image"))


def _http(url: str, data: bytes | None = None, token: str | None = None) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/x-ndjson"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.mark.slow
def test_image_runtime_is_self_contained(gateway_image: EmulatedImage) -> None:
    """The runtime venv alone: the wheel carries the C core, linked to the
    libzstd the runtime stage installs; no source tree on the path."""
    image = gateway_image
    done = image.run(["python", "-c", "import storage_c, storage_c._comet as c; print(storage_c.__file__, c.__file__)"])
    assert done.returncode == 0, done.stderr
    module, core = done.stdout.split()
    venv = image.map("/opt/comet")
    assert module.startswith(venv) and core.startswith(venv), done.stdout
    assert not [p for p in Path(venv).rglob("*") if p.name in ("comet.h", "shard.c", "format.h")], \
        "the C core's sources in the runtime"
    assert image.run(["comet", "--help"]).returncode == 0
    if shutil.which("ldd") and shutil.which("dpkg"):
        ldd = subprocess.run(["ldd", core], capture_output=True, text=True, check=True).stdout
        zstd = re.search(r"libzstd\.so\.1 => (\S+)", ldd)
        assert zstd, ldd
        owner = subprocess.run(["dpkg", "-S", os.path.realpath(zstd.group(1))], capture_output=True, text=True)
        if owner.returncode:
            owner = subprocess.run(["dpkg", "-S", zstd.group(1)], capture_output=True, text=True)
        package = owner.stdout.split(":")[0]
        apt = apt_packages(image.dockerfile.final.runs())
        assert package in apt, f"the core links {zstd.group(1)} of {package}, the runtime installs {apt}"


def test_apt_packages_exist_in_the_image_release(images: dict[str, Dockerfile]) -> None:
    release = re.search(r"-slim-(\w+)", images["gateway"].final.base)
    os_release = Path("/etc/os-release")
    codename = re.search(r"VERSION_CODENAME=(\w+)", os_release.read_text()) if os_release.exists() else None
    if not release or not codename or codename.group(1) != release.group(1) or not shutil.which("apt-cache"):
        pytest.skip(f"this host is not Debian {release.group(1) if release else '?'} with apt-cache")
    packages = set()
    for df in images.values():
        packages |= apt_packages([r for s in df.stages for r in s.runs()])
    shown = subprocess.run(["apt-cache", "show", "--no-all-versions", *sorted(packages)],
                           capture_output=True, text=True).stdout
    missing = packages - set(re.findall(r"^Package: (\S+)$", shown, flags=re.M))
    assert not missing, f"not in {release.group(1)}: {sorted(missing)}"


EVENTS = b"".join(json.dumps({"device": f"d{i}", "temp": 20 + i / 10}).encode() + b"\n" for i in range(50))


@pytest.fixture(scope="module")
def running_gateway(gateway_image: EmulatedImage) -> Iterator[dict[str, Any]]:
    """The image's ENTRYPOINT + CMD as `docker run -e COMET_TOKENS=... -e COMET_PORT=...` would."""
    image = gateway_image
    port, token = free_port(), "emulated-token"
    env = {"COMET_TOKENS": token, "COMET_PORT": str(port), "COMET_WORKERS": "2"}
    proc = image.popen(image.dockerfile.entry_argv(), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    health = image.dockerfile.final.last("HEALTHCHECK")
    assert health is not None
    deadline = time.monotonic() + 60
    while True:
        check = image.run(health.argv(), env=env, timeout=30)
        if check.returncode == 0:
            break
        assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""  # type: ignore[union-attr]
        assert time.monotonic() < deadline, f"HEALTHCHECK never passed: {check.stderr}"
        time.sleep(0.3)
    base = f"http://127.0.0.1:{port}"
    status, answer = _http(f"{base}/streams/events", EVENTS, token)
    assert status == 202 and json.loads(answer)["count"] == len(EVENTS.splitlines()), answer
    yield {"proc": proc, "port": port, "token": token, "env": env, "base": base,
           "data": Path(image.env["COMET_DATA_DIR"])}
    if proc.poll() is None:
        proc.kill()
    proc.wait()


@pytest.mark.slow
def test_image_refuses_to_start_without_tokens(gateway_image: EmulatedImage) -> None:
    done = gateway_image.run(gateway_image.dockerfile.entry_argv(), env={"COMET_PORT": str(free_port())},
                             timeout=60)
    assert done.returncode != 0 and "no tokens" in done.stderr, done


@pytest.mark.slow
def test_image_serves_with_tokens(running_gateway: dict[str, Any]) -> None:
    base, token = running_gateway["base"], running_gateway["token"]
    body = b'{"a": 1}\n{"a": 2}\n'
    assert _http(f"{base}/streams/auth-check", body)[0] == 401
    assert _http(f"{base}/streams/auth-check", body, "wrong")[0] == 403
    status, answer = _http(f"{base}/streams/auth-check", body, token)
    assert status == 202 and json.loads(answer)["count"] == 2, answer
    assert _http(f"{base}/readyz")[0] == 200
    assert _http(f"{base}/streams", token=token)[0] == 200


def s3_store(request: pytest.FixtureRequest) -> dict[str, str]:
    """Swift's s3api (checksum-strict like MinIO before 2025) when it can run here, else moto."""
    try:
        swift = request.getfixturevalue("swift")
        return {"kind": "swift", "AWS_ENDPOINT_URL": swift.endpoint_url, "AWS_ACCESS_KEY_ID": swift.access_key,
                "AWS_SECRET_ACCESS_KEY": swift.secret_key}
    except pytest.skip.Exception:
        endpoint = request.getfixturevalue("moto_s3")
        return {"kind": "moto", "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "test",
                "AWS_SECRET_ACCESS_KEY": "test"}


def compose_worker(name: str, store: dict[str, str], extra: dict[str, str] | None = None
                   ) -> tuple[list[str], dict[str, str], str]:
    """A compose service's comet call and environment, pointed at `store`; the bucket it needs."""
    compose, _ = load_compose({**COMPOSE_ENV, **(extra or {})})
    svc = compose["services"][name]
    kind = "spark" if "spark" in svc["build"]["dockerfile"] else "gateway"
    calls = comet_calls(service_argv(svc, parse_dockerfile(DOCKERFILES[kind])))
    assert len(calls) == 1, calls
    env = service_env(svc)
    for var in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        env[var] = store[var]                 # only where and who: the rest is compose's
    url = next(a for a in calls[0] if a.startswith("s3://"))
    return calls[0], env, url[5:].split("/")[0]


def _s3_client(env: dict[str, str]) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"], region_name=env["AWS_DEFAULT_REGION"],
                        config=Config(request_checksum_calculation="when_required",
                                      response_checksum_validation="when_required"))


def _create_bucket(client: Any, bucket: str) -> None:
    from botocore.exceptions import ClientError

    try:
        client.create_bucket(Bucket=bucket)
    except ClientError as exc:
        if exc.response["Error"]["Code"] not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
            raise


def _keys(client: Any, bucket: str, prefix: str) -> list[str]:
    return [o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])]


@pytest.mark.slow
def test_compose_ship_worker_from_the_image(request: pytest.FixtureRequest, gateway_image: EmulatedImage,
                                            running_gateway: dict[str, Any]) -> None:
    """compose's `ship` command line and environment, run from the image's venv,
    next to the running gateway, into S3."""
    import zstandard

    store = s3_store(request)
    call, env, bucket = compose_worker("ship", store, {"SHIP_MAX_OBJECT_AGE": "1"})
    client = _s3_client(env)
    _create_bucket(client, bucket)
    proc = gateway_image.popen(["comet", *call], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not _keys(client, bucket, "raw/events/") and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
    finally:
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=60)[0].decode()
    assert proc.returncode == 0, output
    keys = _keys(client, bucket, "raw/events/")
    assert keys, f"nothing shipped to {store['kind']}:\n{output}"
    print(f"shipped {len(keys)} object(s) to {store['kind']}")
    rows = []
    for key in keys:
        data = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        rows += zstandard.ZstdDecompressor().decompressobj().decompress(data).splitlines()
    assert len(rows) == 50 and json.loads(rows[0])["device"].startswith("d")


@pytest.mark.slow
def test_compose_spark_ship_loop(request: pytest.FixtureRequest, running_gateway: dict[str, Any],
                                 tmp_path: Path) -> None:
    """compose's spark-ship call and environment, once, into S3 (run with this
    venv's pyspark and Java: the Spark image itself is not built here)."""
    if shutil.which("java") is None:
        pytest.skip("needs Java")
    store = s3_store(request)
    call, env, bucket = compose_worker("spark-ship", store)
    _create_bucket(_s3_client(env), bucket)
    data_dir = str(running_gateway["data"])
    argv = [data_dir if a == "/data" else a for a in call]
    run_env = {**os.environ, **env, "PYSPARK_PYTHON": sys.executable}
    for stray in ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
        run_env.pop(stray, None)
    done = subprocess.run([str(Path(sys.executable).with_name("comet")), *argv], env=run_env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report.get("rows") == 50, report
    assert _keys(_s3_client(env), bucket, "lake/")


@pytest.mark.slow
def test_image_gateway_stops_on_term(running_gateway: dict[str, Any]) -> None:
    proc = running_gateway["proc"]
    proc.send_signal(signal.SIGTERM)     # docker stop
    output = proc.communicate(timeout=40)[0].decode()
    assert proc.returncode == 0, output[-3000:]
