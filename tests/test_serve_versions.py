"""`comet serve` starts only with the uvicorn, gunicorn and uvicorn-worker
versions it is tested with (gateway.serving.versions), and says so in one line
before any process starts; pyproject.toml pins the same ranges."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

import gateway.serving.server
from gateway.serving import versions
from comet.cli import main

REPO = Path(__file__).resolve().parent.parent


def test_pyproject_pins_the_tested_ranges() -> None:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    without_extras = {re.sub(r"\[[^]]*\]", "", d) for d in deps}
    for name in versions.TESTED:
        assert versions.requirement(name) in without_extras, without_extras


def test_the_installed_versions_are_tested_ones() -> None:
    assert versions.check() is None


@pytest.mark.parametrize("name,found", [("uvicorn", "0.55.0"), ("uvicorn", "0.53.1"),
                                        ("gunicorn", "28.0.0"), ("uvicorn-worker", "0.5.0rc1")])
def test_serve_refuses_an_untested_version_before_starting(
        name: str, found: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = versions.installed_version
    monkeypatch.setattr(versions, "installed_version", lambda n: found if n == name else real(n))

    def no_server(*args: object) -> None:
        raise AssertionError("the gateway was started")

    monkeypatch.setattr(gateway.serving.server, "GatewayServer", no_server)
    out = CliRunner().invoke(main, ["serve", "--data-dir", str(tmp_path / "data")])
    assert out.exit_code == 1
    lines = out.output.splitlines()
    assert len(lines) == 1, out.output
    assert lines[0].startswith("Error: comet serve is tested with 'uvicorn>=0.54,<0.55' "
                               "'gunicorn>=27,<28' 'uvicorn-worker>=0.4,<0.5' only, but ")
    assert f"{name} {found} is installed" in lines[0]
    assert not (tmp_path / "data").exists()


def test_a_missing_package_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> str:
        from importlib.metadata import PackageNotFoundError
        raise PackageNotFoundError(name)

    monkeypatch.setattr(versions, "installed_version", missing)
    assert "uvicorn-worker is not installed" in (versions.check() or "")


def test_version_numbers() -> None:
    assert versions.parse("0.54.0") == (0, 54, 0)
    assert versions.parse("27.0.1.post1") == (27, 0, 1)
    assert versions.parse("0.5.0rc1") == (0, 5, 0)
    assert (0, 54) <= versions.parse("0.54.0") < (0, 55)
