"""Lakes in the format before Delta (format 1: a lake's own manifests).

Format 1 kept, per stream, ``_comet/<stream>/plans/`` and
``_comet/<stream>/manifests/``; a reader had to follow the manifests.
``comet spark-ship`` refuses such a lake until ``comet lake convert``
turned it into a Delta table (``convert.py``), which moves each converted
stream's format-1 documents to ``_comet/format-1/<stream>/``.
"""

from __future__ import annotations

from .lakefs import Lake

ARCHIVE_DIR = "_comet/format-1"
"""Where ``comet lake convert`` keeps the format-1 documents of the streams it converted."""
_NOT_STREAMS = ("runs", "locks", "tmp", ARCHIVE_DIR.rpartition("/")[2])


def format_1_streams(lake: Lake) -> list[str]:
    """Streams of the lake that have format-1 manifests."""
    return [stream for stream in lake.list_dirs("_comet")
            if stream not in _NOT_STREAMS
            and any(name.endswith(".json") and name[:-5].isdigit()
                    for name in lake.list(f"_comet/{stream}/manifests"))]


def refuse_format_1(lake: Lake) -> None:
    streams = format_1_streams(lake)
    if streams:
        raise ValueError(f"the lake {lake.url} is in the format before Delta Lake (manifests of "
                         f"{', '.join(streams)}): convert it once with `comet lake convert "
                         f"--data-dir DATA_DIR {lake.url}`, then ship again")
