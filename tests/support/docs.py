"""Code examples of the docs, as the tests that run them read them: the docs
show what runs, and a test runs what the docs show."""

from __future__ import annotations

import re
from pathlib import Path

FENCE = re.compile(r"^(`{3,})(\w*)\s*$")
HEADING = re.compile(r"^(#{1,6})\s")


def code_blocks(page: Path, section: str, language: str = "python") -> list[str]:
    """The fenced blocks in ``language`` of the section whose heading line is
    ``section`` (``"### Reading the lake"``), up to the next heading of its
    level or above, in page order."""
    lines = page.read_text(encoding="utf-8").splitlines()
    if section not in lines:
        raise AssertionError(f"{page.name} has no heading {section!r}")
    level = len(section) - len(section.lstrip("#"))
    blocks: list[str] = []
    body: list[str] = []
    fence, wanted = "", False
    for line in lines[lines.index(section) + 1:]:
        if fence:  # inside a block
            if line.strip() == fence:
                if wanted:
                    blocks.append("\n".join(body) + "\n")
                fence, body = "", []
            elif wanted:
                body.append(line)
            continue
        heading = HEADING.match(line)
        if heading and len(heading.group(1)) <= level:
            break
        opening = FENCE.match(line)
        if opening:
            fence, wanted = opening.group(1), opening.group(2) == language
    return blocks


def fenced_blocks(page: Path) -> list[tuple[str, int, list[str]]]:
    """Every fenced block of a page: its language ("" for none), the line number
    of its first line, its lines."""
    blocks: list[tuple[str, int, list[str]]] = []
    body: list[str] = []
    fence, language, start = "", "", 0
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        if fence:
            if line.strip() == fence:
                blocks.append((language, start, body))
                fence, body = "", []
            else:
                body.append(line)
            continue
        opening = FENCE.match(line.strip())
        if opening:
            fence, language, start = opening.group(1), opening.group(2), number + 1
    return blocks
