"""Checks of what survived a cut, shared by the scenarios.

A dump (writer.py) lists each entry as [number, tag, digest of the whole payload];
the checks rebuild every acknowledged payload from its tag (writer.body) and
compare digests, so a changed byte anywhere - padding included - fails them."""

from __future__ import annotations

from .writer import body, digest


def shard_entries(shard: dict, where: str = "") -> dict[int, str]:
    """entry -> tag of one shard of a dump, after checking that the entries
    run without a hole from the first stored one to the commit point."""
    start = shard.get("listed_from", shard["first"])
    numbers = [e[0] for e in shard["entries"]]
    assert numbers == list(range(start, shard["next"])), (
        f"{where + ': ' if where else ''}entries are not contiguous from first={shard['first']} to next={shard['next']}: "
        f"missing {sorted(set(range(start, shard['next'])) - set(numbers))[:40]}, "
        f"{len(numbers)} present (durable point {shard['durable']}, truncated "
        f"{shard['truncated']}, skipped {shard['skipped']}, state rebuilt "
        f"{shard.get('state_rebuilds')} times, recoveries {shard.get('recoveries')})")
    return {e[0]: e[1] for e in shard["entries"]}


def shard_digests(shard: dict, where: str = "") -> dict[int, str]:
    """entry -> digest of its whole payload (after the same contiguity check)."""
    shard_entries(shard, where)
    return {e[0]: e[2] for e in shard["entries"]}


def check_acked_survived(state: dict, stream: str, acked: dict[tuple[int, int], str],
                         where: str, pad: int = 200, retained: bool = False,
                         low: int = 0) -> None:
    """Every acknowledged (shard, entry) is there, byte for byte (its payload is
    ``writer.body(tag, pad)``), the log verifies clean and no segment was set aside
    as ``.orphan`` (no test plants damage here; ``low``: the padding's least length).  ``retained``: retention runs, and
    an entry below the shard's first entry counts as deleted by it - only when
    that first entry is where a segment file on disk starts (retention deletes whole
    segments; a deleted one may come back after a cut when its unlink was not
    synced, and then lies below the first entry)."""
    shards = state["streams"].get(stream)
    assert shards is not None or not acked, f"{where}: stream {stream} is gone, {len(acked)} acked"
    present = [shard_digests(s, where) for s in shards or []]
    if retained:
        for i, s in enumerate(shards or []):
            bases = sorted(int(name.rsplit("/", 1)[1][:-4]) for name in state["files"]
                           if name.startswith(f"{stream}/shard-{i:04d}/") and name.endswith(".log"))
            below = [e for (sh, e) in acked if sh == i and e < s["first"]]
            assert not below or s["first"] in bases or (
                s["first"] == s["next"] and all(b < s["first"] for b in bases)), (
                f"{where}: shard {i}: {len(below)} acknowledged entries below the first entry "
                f"{s['first']}, where no segment on disk starts ({bases[:5]}): they were not "
                f"deleted by retention")
    lost = sorted((k, v) for k, v in acked.items()
                  if not (retained and k[1] < shards[k[0]]["first"])
                  and present[k[0]].get(k[1]) != digest(body(v, pad, low)))
    assert not lost, (f"{where}: {len(lost)} acknowledged entries lost or changed, first "
                      f"(shard, entry), tag: {lost[:5]}; shard next entries: "
                      f"{[s['next'] for s in shards]}")
    assert state["verify"]["ok"], f"{where}: verify found damage: {state['verify']}"
    check_no_orphans(state, where)


def check_no_orphans(state: dict, where: str) -> None:
    """Recovery set no segment aside: with nothing damaged on purpose, an
    ``.orphan`` file is data recovery could not place."""
    orphans = sorted(name for name in state["files"] if name.endswith(".orphan"))
    assert not orphans, f"{where}: segments set aside by recovery: {orphans}"


def check_offsets_before_recovery(state: dict, stream: str, group: str, where: str) -> None:
    """A group offset, as the offsets file held it after the cut, is never ahead of
    the data on disk then (writer.raw_ends: the end of the last whole batch, read
    before recovery).  After recovery the commit point is raised to such an offset
    (the numbers are skipped), which would hide it."""
    for key, groups in state["raw_offsets"].items():
        if not key.startswith(stream + "/") or group not in groups:
            continue
        end = state["raw_ends"].get(key, 0)
        assert groups[group] <= end, (
            f"{where}: {key}: the offsets file says group {group} is at {groups[group]}, "
            f"but the data on disk ends at entry {end} (before recovery): entries "
            f"{end}..{groups[group] - 1} were acknowledged by the group and are lost")
