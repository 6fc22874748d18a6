"""Storage full: preallocation failing gives StorageFull, nothing is harmed,
and appends work again when space returns (SPEC 3.2, 3.6)."""

from __future__ import annotations

from pathlib import Path

from storage_c import Config, Log

from .support.processes import run_worker
from .support.storage import read_all


def test_preallocation_failure_is_storage_full_and_recovers(data_dir: Path) -> None:
    # RLIMIT_FSIZE below the segment size: creating the next segment fails
    # with EFBIG, the way a full disk fails with ENOSPC.
    out = run_worker("fill_until_full", data_dir, 512 * 1024)
    full_line, after_line = out.strip().splitlines()
    assert full_line.startswith("full after ")
    assert "storage full" in full_line.lower() or "cannot preallocate" in full_line
    appended = int(full_line.split()[2].rstrip(":"))
    assert appended > 500  # the first segment filled up before the error
    words = after_line.split()
    assert words[0] == "appended" and int(words[1]) == appended
    assert int(words[3]) >= 1  # storage_full_errors
    assert int(words[5]) == appended  # the append after the limit was lifted
    with Log(data_dir, Config(shards=1, segment_bytes=1 << 20)) as log:
        got = [p for _, _, p in read_all(log, "full", 0)]
        assert got == [b"x" * 1000] * appended + [b"after"]
        assert log.verify().ok
        # no half-made segment was left behind
        names = sorted(p.name for p in (data_dir / "full" / "shard-0000").iterdir())
        assert not [n for n in names if n.endswith(".tmp")]
