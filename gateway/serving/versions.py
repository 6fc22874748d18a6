"""The versions of uvicorn, gunicorn and uvicorn-worker that `comet serve`
is tested with.

gateway/serving/protocol.py and gateway/serving/worker.py subclass uvicorn's internals (the
protocol's ``pipeline`` and ``cycle``, its close and keep-alive paths, the
server's shutdown), which change between uvicorn's minor releases without
notice; so does what they take from gunicorn and uvicorn-worker.
``TESTED`` holds the ranges the tests ran against (pyproject.toml pins the
same ranges, and a test keeps the two equal); ``check`` refuses to start with
anything else rather than lose requests silently.
"""

from __future__ import annotations

import re
from importlib.metadata import PackageNotFoundError, version

# distribution -> (lowest version, first version not tested), as version tuples
TESTED: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "uvicorn": ((0, 54), (0, 55)),
    "gunicorn": ((27,), (28,)),
    "uvicorn-worker": ((0, 4), (0, 5)),
}

LEADING_NUMBERS = re.compile(r"\d+(?:\.\d+)*")


def dotted(parts: tuple[int, ...]) -> str:
    return ".".join(map(str, parts))


def requirement(name: str) -> str:
    """The pin of ``name``, as pyproject.toml writes it."""
    low, high = TESTED[name]
    return f"{name}>={dotted(low)},<{dotted(high)}"


def parse(text: str) -> tuple[int, ...]:
    """The release numbers of a version string ("0.54.0rc1" -> (0, 54, 0))."""
    match = LEADING_NUMBERS.match(text)
    return tuple(int(p) for p in match.group().split(".")) if match else ()


def installed_version(name: str) -> str:
    """The version of the installed distribution ``name``."""
    return version(name)


def problems() -> list[str]:
    """What is installed outside ``TESTED``, one sentence each."""
    out = []
    for name, (low, high) in TESTED.items():
        try:
            found = installed_version(name)
        except PackageNotFoundError:
            out.append(f"{name} is not installed")
            continue
        if not low <= parse(found) < high:
            out.append(f"{name} {found} is installed")
    return out


def check() -> str | None:
    """None when every version is a tested one, else the one-line error that
    `comet serve` stops with."""
    found = problems()
    if not found:
        return None
    wanted = " ".join(f"'{requirement(name)}'" for name in TESTED)
    return (f"comet serve is tested with {wanted} only, but {'; '.join(found)}: "
            f"install those (pip install {wanted})")
