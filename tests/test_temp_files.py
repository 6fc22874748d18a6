"""The one rule for temporary files that no writer will finish
(``comet.files.remove_stale_temp_files``), which ``comet ship`` (intents,
directory sinks) and ``comet spark-ship`` (plans) both follow."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from comet.files import STALE_TEMP_AGE_S, pid_alive, remove_stale_temp_files


def zombie_process() -> subprocess.Popen[bytes]:
    """A child that exited and is not reaped yet."""
    zombie = subprocess.Popen(["true"])
    deadline = time.monotonic() + 30
    while not Path(f"/proc/{zombie.pid}/stat").read_text().split(") ")[1].startswith("Z"):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return zombie


def test_a_temp_file_is_stale_when_its_writer_is_gone_or_it_is_an_hour_old(tmp_path: Path) -> None:
    live = subprocess.Popen(["sleep", "60"])
    dead = subprocess.Popen(["true"])
    dead.wait()
    zombie = zombie_process()
    try:
        assert pid_alive(live.pid) and not pid_alive(dead.pid) and not pid_alive(zombie.pid)
        me = os.getpid()
        files = {who: tmp_path / f".00-01.ndjson.zst.{pid}.tmp" for who, pid in
                 {"live": live.pid, "dead": dead.pid, "zombie": zombie.pid, "me": me}.items()}
        files["old live"] = tmp_path / f".00000004.json.{live.pid}.tmp"
        files["old mine"] = tmp_path / f".00000005.json.{me}.tmp"
        files["other name"] = tmp_path / f".other.{dead.pid}.tmp"
        for path in files.values():
            path.write_bytes(b"partial")
        an_hour_ago = time.time() - STALE_TEMP_AGE_S - 60
        for who in ("old live", "old mine"):
            os.utime(files[who], (an_hour_ago, an_hour_ago))
        stored = tmp_path / "00-01.ndjson.zst"
        stored.write_bytes(b"stored")
        (tmp_path / ".hidden").write_bytes(b"not a temporary file")

        only = remove_stale_temp_files(tmp_path, name="00-01.ndjson.zst")
        assert sorted(only) == sorted([files["dead"], files["zombie"]])
        rest = remove_stale_temp_files(tmp_path)
        assert sorted(rest) == sorted([files["old live"], files["old mine"], files["other name"]])
        assert files["live"].exists() and files["me"].exists()
        # A caller that has not started writing may count its own files as stale.
        assert remove_stale_temp_files(tmp_path, mine_are_stale=True) == [files["me"]]
        assert files["live"].exists() and stored.exists() and (tmp_path / ".hidden").exists()
        assert remove_stale_temp_files(tmp_path / "missing") == []
    finally:
        live.kill()
        for proc in (live, zombie):
            proc.wait()
