"""Checks of what survived a cut, shared by the scenarios."""

from __future__ import annotations


def shard_entries(shard: dict) -> dict[int, str]:
    """entry -> payload of one shard of a dump, after checking that the entries
    run without a hole from the first stored one to the commit point."""
    start = shard.get("listed_from", shard["first"])
    numbers = [e for e, _ in shard["entries"]]
    assert numbers == list(range(start, shard["next"])), (
        f"entries are not contiguous from first={shard['first']} to next={shard['next']}: "
        f"missing {sorted(set(range(start, shard['next'])) - set(numbers))[:40]}, "
        f"{len(numbers)} present (durable point {shard['durable']}, truncated "
        f"{shard['truncated']}, verify {shard.get('verify')})")
    return {e: p for e, p in shard["entries"]}


def check_acked_survived(state: dict, stream: str, acked: dict[tuple[int, int], str],
                         where: str) -> None:
    """Every acknowledged (shard, entry) is there, with its payload."""
    shards = state["streams"].get(stream)
    assert shards is not None or not acked, f"{where}: stream {stream} is gone, {len(acked)} acked"
    present = [shard_entries(s) for s in shards or []]
    lost = sorted((k, v) for k, v in acked.items()
                  if k[1] >= shards[k[0]]["first"] and present[k[0]].get(k[1]) != v)
    assert not lost, (f"{where}: {len(lost)} acknowledged entries lost or changed, first "
                      f"(shard, entry), payload: {lost[:5]}; shard next entries: "
                      f"{[s['next'] for s in shards]}")
    assert state["verify"]["ok"], f"{where}: verify found damage: {state['verify']}"
