"""Relative links in Markdown: which exist, and which anchors a page has.

One checker for the two places links leave the docs site's reach:

- as an MkDocs hook (mkdocs.yml), it checks every link from a page in docs/
  to a file outside docs/ (``../storage_c/FORMAT.md#recovery``): the file must
  exist in the repository and hold the anchor.  MkDocs itself cannot see such
  files and warns about every one of them; the hook lets through only its
  warnings for links that are broken, so ``mkdocs build --strict`` fails on
  those and on nothing else.
- tests/test_docs.py uses the same functions on README.md, which lives
  outside docs/.

An anchor counts only when GitHub's rule and Python-Markdown's (the site's)
give the same slug for its heading, so a link works in both views.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from markdown.extensions.toc import slugify as toc_slugify

FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
# [text](target "title") and ![alt](target); the text may hold one level of brackets
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
HTML_ID = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks, with inline code spans blanked."""
    out, fence = [], ""
    for line in text.splitlines():
        match = FENCE.match(line)
        if fence:
            if match and match.group(1)[0] == fence[0] and len(match.group(1)) >= len(fence):
                fence = ""
            continue
        if match:
            fence = match.group(1)
            continue
        out.append(line)
    return out


def links(text: str) -> list[str]:
    """Every link target of a Markdown text (inline, images, reference definitions)."""
    found: list[str] = []
    for line in prose_lines(text):
        if ref := REFERENCE.match(line):
            found.append(ref.group(1))
            continue
        found += INLINE_LINK.findall(CODE_SPAN.sub("``", line))
    return found


def heading_text(raw: str) -> str:
    """A heading as it reads: links by their text, no backticks or emphasis marks."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", raw)
    return re.sub(r"[`*]", "", text).strip()


def github_slug(text: str) -> str:
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors both GitHub and the site give the headings (and <a id> tags) of a page."""
    found: set[str] = set()
    seen: set[str] = set()
    for line in prose_lines(text):
        found.update(HTML_ID.findall(line))
        match = HEADING.match(line)
        if not match:
            continue
        title = heading_text(match.group(2))
        slug = github_slug(title)
        if slug != toc_slugify(title, "-"):
            continue
        if slug not in seen:  # a repeated heading: GitHub adds "-1", the site "_1"
            seen.add(slug)
            found.add(slug)
    return found


@dataclass(frozen=True)
class Link:
    target: str
    path: Path | None      # the file or directory it names; None for a link within the page
    anchor: str


def resolve(source: Path, target: str) -> Link | None:
    """A relative link of ``source``; None for a URL with a scheme (https:, mailto:)."""
    if SCHEME.match(target) or target.startswith("//"):
        return None
    path, _, anchor = target.partition("#")
    return Link(target, (source.parent / unquote(path)).resolve() if path else None, unquote(anchor))


def problem(source: Path, target: str, root: Path) -> str | None:
    """Why a link of ``source`` is broken (None when it works): it must stay inside
    ``root``, name a file or directory that exists, and an anchor that page has."""
    link = resolve(source, target)
    if link is None:
        return None
    if target.startswith("/"):
        return f"'{target}' is absolute: use a relative link"
    page = link.path or source.resolve()
    if link.path is not None:
        if not link.path.is_relative_to(root.resolve()):
            return f"'{target}' leaves the repository"
        if not link.path.exists():
            return f"'{target}': {link.path.relative_to(root.resolve())} does not exist"
    if link.anchor:
        if page.suffix != ".md" or page.is_dir():
            return f"'{target}': an anchor into a file that is not Markdown"
        if link.anchor not in anchors(page.read_text(encoding="utf-8")):
            return f"'{target}': {page.name} has no heading with the anchor #{link.anchor}"
    return None


# --- the MkDocs hook ---------------------------------------------------------------

log = logging.getLogger("mkdocs.hooks.links")
_checked: set[tuple[str, str]] = set()    # (page, link) pairs that leave docs/ and work


class _OutsideLinks(logging.Filter):
    """Drops MkDocs' "not found among documentation files" warning for the links this
    hook found working; every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(message.startswith(f"Doc file '{page}' contains ")
                       and f" link '{target}'" in message for page, target in _checked)


_FILTER = _OutsideLinks()


def on_config(config: Any) -> Any:
    logging.getLogger("mkdocs.structure.pages").addFilter(_FILTER)
    _checked.clear()
    return config


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    docs = Path(config["docs_dir"]).resolve()
    root = docs.parent
    source = docs / page.file.src_uri
    for target in links(markdown):
        link = resolve(source, target)
        if link is None or link.path is None or link.path.is_relative_to(docs):
            continue  # URLs, and links within docs/: MkDocs checks those itself
        if (why := problem(source, target, root)) is not None:
            log.warning(f"Doc file '{page.file.src_uri}' links outside docs/: {why}")
        else:
            _checked.add((page.file.src_uri, target))
    return markdown
