"""The docs cannot go stale unnoticed: the site builds strictly, every link of
the README resolves, and the README's first-screen example runs against a
real gateway and answers what the README shows."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from tests.support.docs import code_blocks, fenced_blocks
from tests.support.server import SMALL, GatewayProcess

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = REPO / "docs"
MKDOCS = Path(sys.executable).with_name("mkdocs")
FIRST_SCREEN_LINES = 40
EXAMPLE_MARK = "<!-- first-screen-example"
README_PORT = "localhost:8080"

_spec = importlib.util.spec_from_file_location("doc_links", DOCS / "hooks" / "links.py")
assert _spec is not None and _spec.loader is not None
doc_links = sys.modules["doc_links"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(doc_links)
links: Callable[[str], list[str]] = doc_links.links
problem: Callable[[Path, str, Path], str | None] = doc_links.problem
prose_lines: Callable[[str], list[str]] = doc_links.prose_lines


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    """A page missing from mkdocs.yml's nav, a broken link or anchor between pages,
    or a broken link from a page to a file outside docs/ fails the build."""
    out = subprocess.run([str(MKDOCS), "build", "--strict", "--site-dir", str(tmp_path / "site")],
                         cwd=REPO, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert out.returncode == 0, f"mkdocs build --strict failed:\n{out.stderr}{out.stdout}"
    assert (tmp_path / "site" / "index.html").exists()


def test_every_readme_link_resolves() -> None:
    """README.md is outside docs/: its relative links name files that exist and
    anchors their Markdown has (as GitHub and the site both spell them)."""
    text = README.read_text(encoding="utf-8")
    targets = links(text)
    assert len(targets) > 10, "the README's links were not found"
    broken = [why for target in targets if (why := problem(README, target, REPO)) is not None]
    assert broken == []


def test_the_link_checker_reports_what_is_broken(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other\n\n## Part `A`\n\n```\n## not a heading\n```\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](other.md#part-a) [gone](missing.md) [no anchor](other.md#not-a-heading)"
                    " [here](#page) [out](../elsewhere.md) `[code](x.md)` [web](https://example.org)\n"
                    "# Page\n")
    found = {target: problem(page, target, tmp_path) for target in links(page.read_text())}
    assert found == {
        "other.md#part-a": None,
        "missing.md": "'missing.md': missing.md does not exist",
        "other.md#not-a-heading": "'other.md#not-a-heading': other.md has no heading with the anchor #not-a-heading",
        "#page": None,
        "../elsewhere.md": "'../elsewhere.md' leaves the repository",
        "https://example.org": None,
    }


# --- the lake's reader examples --------------------------------------------------------

SPARK_PAGE = DOCS / "spark-and-the-lake.md"
READERS = "### Reading the lake"
SHOWN_LAKE = "/srv/lake"


def reader_outputs(rejects: int) -> list[str]:
    """What each example prints for a lake of stream "events" with 5 rows and
    ``rejects`` rejects, in page order."""
    return [rf"5 {rejects}", r"5 \d+", r"\[\('events', 5\)\]", rf"5 {rejects}"]


def small_lake(tmp_path: Path, rejects: int) -> Path:
    """A lake that ``comet spark-ship``'s real tasks wrote (in this process, no JVM)
    in one run: 5 rows and ``rejects`` rejects of stream "events"."""
    from spark_jobs.lake.lakefs import Lake
    from spark_jobs.spark.ship import ShipOptions, ship
    from storage_c import Config, Log
    from tests.support.lake import in_process

    data, lake = tmp_path / "data", tmp_path / "lake"
    with Log(data, Config(shards=2)) as log:
        for n in range(5):
            log.append("events", json.dumps({"device": f"d{n}", "temp": 20.5 + n}).encode())
        for _ in range(rejects):
            log.append("events", b"not json")
    report = ship(ShipOptions(str(data), "events", Lake(str(lake))), in_process)
    assert (report.rows, report.rejects) == (5, rejects)
    return lake


@pytest.mark.parametrize("rejects", [1, 0], ids=["a-reject", "a-fresh-lake-without-rejects"])
def test_the_lake_reader_examples_run_as_written(tmp_path: Path, rejects: int) -> None:
    """Each Python example of the Spark page's "Reading the lake" (Polars, pandas,
    DuckDB, this project's reader), run in a fresh Python against a real lake (its
    path put in place of /srv/lake), prints what a reader of that lake must see:
    the committed rows and rejects, each once; on a lake fresh from its first
    run, the rejects table is there and empty."""
    examples = code_blocks(SPARK_PAGE, READERS)
    outputs = reader_outputs(rejects)
    assert len(examples) == len(outputs), f"{len(examples)} Python examples under {READERS}"
    lake = small_lake(tmp_path, rejects)
    for example, shown in zip(examples, outputs):
        assert SHOWN_LAKE in example, example
        out = subprocess.run([sys.executable, "-c", example.replace(SHOWN_LAKE, str(lake))],
                             cwd=REPO, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, f"{example}\nfailed:\n{out.stderr[-3000:]}"
        assert re.fullmatch(shown, out.stdout.strip()), f"{example}\nprinted {out.stdout!r}"


# --- how the pages write commands ----------------------------------------------------------

CONVENTION = "**How the pages write commands.**"
VENV_COMET = ".venv/bin/comet"
SHELL_BLOCKS = ("", "sh", "bash", "console", "shell")
LEADING = re.compile(r"^(?:\$\s+|[A-Za-z_][A-Za-z0-9_]*=\S*\s+"   # a prompt, variables
                     r"|(?:sudo|runuser|env|exec|nohup|time)\s+"       # what runs a command, with
                     r"(?:-[ug]\s+\S+\s+|--?[\w-]+(?:=\S+)?\s+)*(?:--\s+)?)*")  # its options
CODE_SPAN = re.compile(r"`([^`]+)`")
IN_CONTAINERS = {"docker.md"}
"""Pages whose text runs commands inside the images, where `comet` is on the PATH."""


def command_paths() -> set[tuple[str, ...]]:
    """Every command of `comet`, as the words that name it: ("stat",), ("lake", "check")..."""
    import click

    from comet.cli import main

    ctx = click.Context(main)
    paths: set[tuple[str, ...]] = set()
    for name in main.list_commands(ctx):
        command = main.get_command(ctx, name)
        paths.add((name,))
        if isinstance(command, click.Group):
            paths |= {(name, sub) for sub in command.list_commands(click.Context(command))}
    return paths


def typed_comet(words: list[str], paths: set[tuple[str, ...]]) -> bool:
    """Whether ``comet ...`` in running text is a command line to type (a command
    and an argument), rather than a command's name or one of its options."""
    rest = words[1:]
    named = max((len(p) for p in paths if tuple(rest[:len(p)]) == p), default=0)
    return any(not w.startswith("-") for w in rest[named:])


def comet_violations(page: Path, paths: set[tuple[str, ...]]) -> list[str]:
    """The places of a page that call bare ``comet``: a command line of a shell
    block (each command of it, after a prompt, sudo or variables), or a command
    line in the text."""
    found = []
    for language, start, lines in fenced_blocks(page):
        if language not in SHELL_BLOCKS:
            continue
        for offset, line in enumerate(lines):
            for command in re.split(r"&&|\|\||;|\||\$\(", line):
                words = LEADING.sub("", command.strip()).split()
                if words[:1] == ["comet"]:
                    found.append(f"{page.name}:{start + offset}: {line.strip()}")
    if page.name not in IN_CONTAINERS:
        for number, line in enumerate(prose_lines(page.read_text(encoding="utf-8")), 1):
            for span in CODE_SPAN.findall(line):
                words = span.split()
                if words[:1] == ["comet"] and typed_comet(words, paths):
                    found.append(f"{page.name} (text): `{span}`")
    return found


def test_every_page_writes_commands_as_the_readme_says() -> None:
    """The README states once how the pages call `comet` (`.venv/bin/comet`, from
    the repository's root): no page calls bare `comet` in a command line."""
    pages = [README, *sorted(DOCS.glob("*.md"))]
    stated = [p.name for p in pages for _ in range(p.read_text(encoding="utf-8").count(CONVENTION))]
    assert stated == ["README.md"], stated
    assert VENV_COMET in README.read_text(encoding="utf-8")
    paths = command_paths()
    assert {("serve",), ("ship",), ("lake", "check"), ("group", "reset")} <= paths
    violations = [v for page in pages for v in comet_violations(page, paths)]
    assert violations == [], "\n".join(violations)


def test_the_command_check_finds_bare_comet(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("Run `comet stat ./data`, or see `comet ship`, `comet stat --json`.\n\n"
                    "```\n$ comet verify ./data\nsudo FOO=1 comet ship a b c\n"
                    "cd x && comet tail ./data ev\n.venv/bin/comet stat ./data\n"
                    "sudo -u comet comet stat ./data\nsudo runuser -u comet -- /opt/bin/comet stat\n```\n"
                    "```toml\ncomet = 1\n```\n")
    assert comet_violations(page, command_paths()) == [
        "page.md:4: $ comet verify ./data", "page.md:5: sudo FOO=1 comet ship a b c",
        "page.md:6: cd x && comet tail ./data ev", "page.md:8: sudo -u comet comet stat ./data",
        "page.md (text): `comet stat ./data`"]


# --- what the examples leave in the checkout -----------------------------------------------

CREATES = (re.compile(r"-(?:keyout|out)\s+(\w[\w./-]*)"),     # openssl's outputs
           re.compile(r"(?:^|\s)>>?\s*(\.?\w[\w./-]*)"),        # a redirection's file
           re.compile(r"(?:^|\s)\./(\w[\w.-]*)"))               # a data directory, a sink
NAMED_FILE = re.compile(r"^# ([\w.-]+\.(?:toml|ya?ml|json))$")  # "# comet.toml" atop a file's block


def example_outputs(page: Path) -> set[str]:
    """The relative paths a page's examples create when run from the repository's
    root: the files and directories their command lines write (after a `cd`, under
    it), and the files their blocks are named as."""
    out: set[str] = set()
    for language, _, lines in fenced_blocks(page):
        if language not in SHELL_BLOCKS:
            named = NAMED_FILE.match(lines[0]) if lines else None
            if named:
                out.add(named.group(1))
            continue
        prompted = any(line.startswith("$ ") for line in lines)
        cwd = ""
        for line in lines:
            if prompted and not line.startswith("$ "):
                continue  # what a command printed
            command = line.removeprefix("$ ").split(" #")[0]
            if command.startswith("cd "):
                cwd = command.split()[1]
                continue
            for pattern in CREATES:
                out |= {os.path.normpath(os.path.join(cwd, path)) for path in pattern.findall(command)}
    return out


def test_what_the_examples_create_is_ignored_by_git() -> None:
    """A key, a certificate or a configuration file made by copying a page's
    example into the checkout cannot be committed by a `git add .`."""
    outputs = sorted(set().union(*(example_outputs(p) for p in [README, *DOCS.glob("*.md")])))
    assert {"cert.pem", "key.pem", "clients-ca.key", "comet.toml", "outbox", "data",
            "blob.bin", "docker/.env"} <= set(outputs), outputs
    checked = subprocess.run(["git", "check-ignore", "--no-index", "--verbose", "--non-matching",
                              "--", *outputs], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert checked.returncode in (0, 1) and len(checked.stdout.splitlines()) == len(outputs), checked
    unignored = [line.split("\t")[1] for line in checked.stdout.splitlines() if line.startswith("::")]
    assert unignored == [], f"not in .gitignore: {unignored}"
    tracked = subprocess.run(["git", "ls-files", "--cached", "--ignored", "--exclude-standard"],
                             cwd=REPO, capture_output=True, text=True, timeout=60).stdout.split()
    assert tracked == [], f"tracked files .gitignore now names: {tracked}"


# --- the metrics table ------------------------------------------------------------------------

OPERATIONS = DOCS / "operations.md"
TYPE_LINE = re.compile(r"^# TYPE (\S+) (\S+)$", re.M)


def documented_metrics() -> dict[str, str]:
    """operations.md's metrics table: each name with its type (a row naming
    ``x_sum``, ``_count`` names both)."""
    lines = OPERATIONS.read_text(encoding="utf-8").splitlines()
    start = lines.index("| metric | type | labels | meaning |")
    out: dict[str, str] = {}
    for row in lines[start + 2:]:
        if not row.startswith("|"):
            break
        names_cell, kind = [c.strip() for c in row.strip("|").split("|")][:2]
        names = CODE_SPAN.findall(names_cell)
        for name in names:
            full = names[0].rsplit("_", 1)[0] + name if name.startswith("_") else name
            out[full] = kind
    return out


def test_the_metrics_table_lists_what_metrics_serves(tmp_path: Path) -> None:
    """Every metric /metrics serves (a stream with a consumer group: every family
    there is) is in operations.md's table with its type, and the table names no
    metric gateway/metrics.py does not make."""
    from starlette.testclient import TestClient

    from gateway import metrics
    from gateway.app import create_app
    from storage_c import Log
    from tests.support.gateway_app import JSON, STORAGE, config

    with TestClient(create_app(config(tmp_path / "data"))) as client:
        assert client.post("/streams/ev", content=b'{"a":1}', headers=JSON).status_code == 202
        with Log(tmp_path / "data", STORAGE) as log:
            log.group("ev", 0, "readers")
        served = dict(TYPE_LINE.findall(client.get("/metrics").text))
    documented = documented_metrics()
    assert len(served) > 20
    assert {name: documented.get(name) for name in served} == served, "served but not in the table"
    source = Path(metrics.__file__).read_text(encoding="utf-8")
    made = {name for name in documented
            if f'"{name}"' in source or f'"{re.sub(r"_(sum|count|bucket)$", "", name)}"' in source}
    assert sorted(set(documented) - made) == [], "in the table, but gateway/metrics.py makes no such metric"


DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
COMMIT = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b")


def test_no_dates_or_commits_outside_the_changelog() -> None:
    """History lives in CHANGELOG.md; the README and the pages say what is. (Example
    output in code blocks may show timestamps.)"""
    found = []
    for path in [README, *sorted(DOCS.glob("*.md"))]:
        for line in prose_lines(path.read_text(encoding="utf-8")):
            found += [f"{path.relative_to(REPO)}: {m.group(0)!r} in {line.strip()[:80]!r}"
                      for m in [*DATE.finditer(line), *COMMIT.finditer(line)]]
    assert found == []


# --- the README's first screen ------------------------------------------------------

def first_screen_example() -> list[tuple[str, str]]:
    """(command, the output the README shows) for each ``$ `` line of the fenced block
    after the marker comment, which must lie within the README's first screen."""
    lines = README.read_text(encoding="utf-8").splitlines()
    mark = next((i for i, line in enumerate(lines) if line.startswith(EXAMPLE_MARK)), None)
    assert mark is not None, f"README.md has no {EXAMPLE_MARK} ... --> marker"
    assert lines[mark + 1].startswith("```"), "the marker must stand right before a fenced block"
    end = next(i for i in range(mark + 2, len(lines)) if lines[i].startswith("```"))
    assert end < FIRST_SCREEN_LINES, f"the example ends on line {end + 1}, past the first screen"
    steps: list[tuple[str, str]] = []
    for line in lines[mark + 2:end]:
        if line.startswith("$ "):
            steps.append((line[2:], ""))
        else:
            assert steps, f"output before any command: {line!r}"
            command, shown = steps[-1]
            steps[-1] = (command, (shown + "\n" + line).strip())
    return steps


class Matcher:
    """Compares an answer with the README's: equal, but for what a run cannot repeat
    (timestamps, cursors) and the shard a worker chose, which must be the same shard
    wherever the README shows the same one."""

    VOLATILE: dict[str, type | tuple[type, ...]] = {"timestamp": int, "next": (str, int)}

    def __init__(self) -> None:
        self.shards: dict[int, int] = {}

    def same(self, shown: Any, real: Any, where: str = "") -> Iterator[str]:
        if isinstance(shown, dict) and isinstance(real, dict):
            if set(shown) != set(real):
                yield f"{where or 'the answer'}: keys {sorted(real)}, the README shows {sorted(shown)}"
                return
            for key, value in shown.items():
                yield from self.field(key, value, real[key], f"{where}.{key}")
        elif isinstance(shown, list) and isinstance(real, list):
            if len(shown) != len(real):
                yield f"{where}: {len(real)} items, the README shows {len(shown)}"
                return
            for i, (a, b) in enumerate(zip(shown, real)):
                yield from self.same(a, b, f"{where}[{i}]")
        elif shown != real:
            yield f"{where}: {real!r}, the README shows {shown!r}"

    def field(self, key: str, shown: Any, real: Any, where: str) -> Iterator[str]:
        if key in self.VOLATILE:
            if not isinstance(real, self.VOLATILE[key]):
                yield f"{where}: {real!r} is not a {key}"
        elif key == "shard" and isinstance(shown, int) and isinstance(real, int):
            if self.shards.setdefault(shown, real) != real:
                yield f"{where}: shard {real}, where the README's shard {shown} was {self.shards[shown]}"
        elif key == "id" and isinstance(shown, str) and isinstance(real, str):
            shard, _, entry = shown.partition("-")
            yield from self.field("shard", int(shard), int(real.partition("-")[0]), where)
            yield from self.same(entry, real.partition("-")[2], where)
        else:
            yield from self.same(shown, real, where)


def test_the_readme_first_screen_example_works(tmp_path: Path) -> None:
    """The README's first request and its read-back, run as shown against a gateway with
    the default of several workers, answer what the README shows."""
    steps = first_screen_example()
    assert [command.split()[0] for command, _ in steps] == ["curl"] * len(steps)
    assert any("-X POST" in command for command, _ in steps) and "-X POST" not in steps[-1][0]
    curl = shutil.which("curl")
    assert curl is not None, "the README's example needs curl"
    with GatewayProcess(tmp_path / "data", workers=2, env=SMALL) as gateway:
        gateway.wait_ready()
        matcher = Matcher()
        for command, shown in steps:
            real_command = command.replace(README_PORT, f"127.0.0.1:{gateway.port}")
            assert real_command != command, f"the example does not use {README_PORT}: {command}"
            out = subprocess.run(["bash", "-c", real_command], capture_output=True, text=True,
                                 timeout=30)
            assert out.returncode == 0, f"{command}\nfailed ({out.returncode}): {out.stderr}"
            answer = json.loads(out.stdout)
            differences = list(matcher.same(json.loads(shown), answer))
            assert differences == [], f"$ {command}\n{out.stdout}\n" + "\n".join(differences)
        gateway.stop()
