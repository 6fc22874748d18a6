"""The commands the multi-process, crash, disk and load tests run in child processes.

Run as `python tests/children/workers.py <command> <args...>` (tests/support/processes.py
starts them).  A command that uses a log opens the data directory itself: a child never
inherits a handle across fork.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import random
import resource
import signal
import sys
import time

from storage_c import Config, Log, NoFreeSlot, ReadBatch, StorageFull


def batch_payloads(seq: int, count: int, size: int) -> list[bytes]:
    """Payloads of batch `seq`: each says which batch, which item, of how many."""
    rng = random.Random(seq)
    return [f"{seq}:{i}:{count}:".encode() + rng.randbytes(rng.randrange(size + 1))
            for i in range(count)]


def crash_appender(path: str, ack_fd: str, start_seq: str, max_batch: str) -> None:
    """Appends batches forever, reporting each acknowledged one on ack_fd."""
    fd = int(ack_fd)
    seq = int(start_seq)
    cfg = Config(shards=1, segment_bytes=1 << 20, durability="none", background_flush=False)
    with Log(path, cfg) as log:
        rng = random.Random(seq)
        while True:
            count = rng.randrange(1, int(max_batch) + 1)
            res = log.append_batch("crash", batch_payloads(seq, count, 2000), shard=0)
            os.write(fd, f"{seq} {res.first} {res.count}\n".encode())
            seq += 1


def writer(path: str, process_count: str, own: str, keyed: str, out: str) -> None:
    """Claims a slot, appends `own` entries to its own shards and `keyed`
    entries to shards owned by other processes, then reports its slot."""
    cfg = Config(shards=8, segment_bytes=1 << 20, process_count=int(process_count))
    with Log(path, cfg) as log:
        slot = log.claim_slot()
        log.create_stream("mp", 8)
        foreign = [s for s in range(8) if s not in log.owned_shards("mp")]
        for i in range(int(own)):
            log.append("mp", f"{slot}:o:{i}".encode())
            if i < int(keyed):
                log.append("mp", f"{slot}:k:{i}".encode(), shard=foreign[i % len(foreign)])
        with open(out + ".tmp", "w") as f:
            f.write(str(slot))
        os.rename(out + ".tmp", out)
        # Hold the slot until every writer has reported one: a writer that
        # finished and closed first would free its slot for a late starter.
        siblings = os.path.dirname(out) or "."
        deadline = time.monotonic() + 60
        while (sum(1 for n in os.listdir(siblings) if n.startswith("slot-") and not n.endswith(".tmp"))
               < int(process_count) and time.monotonic() < deadline):
            time.sleep(0.005)


def hold_slot(path: str, process_count: str) -> None:
    """Claims a slot, prints it, then waits to be killed."""
    with Log(path, Config(process_count=int(process_count))) as log:
        try:
            slot = log.claim_slot()
        except NoFreeSlot as exc:
            print(f"busy {exc}", flush=True)
            return
        print(slot, flush=True)
        time.sleep(600)


def die_holding_lock(path: str, stream: str, shard: str) -> None:
    """Takes the shard's append lock by hand, scribbles a torn entry after the
    committed end, and is killed with SIGKILL while holding the lock."""
    state = os.path.join(path, stream, f"shard-{int(shard):04d}", "state")
    fd = os.open(state, os.O_RDWR)
    mm = mmap.mmap(fd, 4096)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    libc = ctypes.CDLL(None)
    assert libc.pthread_mutex_lock(ctypes.c_void_p(addr + 64)) == 0
    active_base, active_end = (int.from_bytes(mm[200 + 8 * i: 208 + 8 * i], "little") for i in range(2))
    seg = os.path.join(os.path.dirname(state), f"{active_base:020d}.log")
    with open(seg, "r+b") as f:
        f.seek(active_end)
        f.write(b"\xab" * 300)  # what a writer killed mid-copy leaves behind
    print("locked", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def hold_state_locks(path: str, stream: str, shard: str) -> None:
    """Locks the shard's append and sync mutexes by hand through its mapped
    state, without opening the shard (so without its shared OFD lock), prints
    "held" and stays alive holding them until killed: a copy of the directory
    taken now names a living thread as the owner of both."""
    state = os.path.join(path, stream, f"shard-{int(shard):04d}", "state")
    fd = os.open(state, os.O_RDWR)
    mm = mmap.mmap(fd, 4096)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    libc = ctypes.CDLL(None)
    for at in (64, 128):  # FORMAT.md, shard state: append_lock, sync_lock
        assert libc.pthread_mutex_lock(ctypes.c_void_p(addr + at)) == 0
    print("held", flush=True)
    time.sleep(600)


def always_appender(path: str, stream: str) -> None:
    """Appends to shard 0 with durability always until killed (every append
    syncs, so the sync lock is held much of the time); prints "ready" after
    the first one."""
    with Log(path, Config(shards=1, segment_bytes=256 << 10, durability="always")) as log:
        n = 0
        while True:
            log.append(stream, b"live %d" % n + b"." * (n % 200), shard=0)
            if n == 0:
                print("ready", flush=True)
            n += 1


def append_always(path: str, stream: str, payload: str) -> None:
    """Appends one entry to shard 0 with durability always (the append and sync
    locks both taken) and prints its id."""
    with Log(path, Config(shards=1, durability="always")) as log:
        print(log.append(stream, payload.encode(), shard=0)[1], flush=True)


def fill_until_full(path: str, limit: str) -> None:
    """With RLIMIT_FSIZE lowered, appends until StorageFull; then restores the
    limit and appends again.  Prints what happened."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    cfg = Config(shards=1, segment_bytes=1 << 20, background_flush=False)
    with Log(path, cfg) as log:
        appended = 0
        for _ in range(10):  # the first segment exists before the disk "fills"
            log.append("full", b"x" * 1000, shard=0)
            appended += 1
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (int(limit), hard))
        try:
            for _ in range(100_000):
                log.append("full", b"x" * 1000, shard=0)
                appended += 1
            print("never full", flush=True)
            return
        except StorageFull as exc:
            print(f"full after {appended}: {exc}", flush=True)
        stats = log.shard_stats("full", 0)
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        shard, entry = log.append("full", b"after", shard=0)
        print(f"appended {appended} errors {stats.storage_full_errors} next {entry}", flush=True)


def rotating_writer(path: str, count: str) -> None:
    """Appends numbered batches through many small segments."""
    cfg = Config(shards=1, segment_bytes=64 << 10, index_interval_bytes=512)
    with Log(path, cfg) as log:
        n = 0
        while n < int(count):
            size = min(1 + n % 37, int(count) - n)
            log.append_batch("rot", [b"%08d" % (n + i) + b"." * ((n + i) % 300) for i in range(size)],
                             shard=0)
            n += size


def append_one(path: str, stream: str, payload: str) -> None:
    """Appends one entry to shard 0 and prints its id."""
    with Log(path, Config(shards=1)) as log:
        print(log.append(stream, payload.encode(), shard=0)[1], flush=True)


def group_offset(path: str, stream: str, group: str, shard: str, ack: str, *rest: str) -> None:
    """Prints a group's offset, acks an entry, prints the new offset; with
    --then-die, is killed with SIGKILL right after (no clean close)."""
    log = Log(path, Config(shards=2, background_flush=False))
    g = log.group(stream, int(shard), group)
    print(g.offset, g.ack(int(ack)), flush=True)
    if "--then-die" in rest:
        os.kill(os.getpid(), signal.SIGKILL)
    log.close()


def consume_assigned(path: str, stream: str, group: str, i: str, n: str, out: str) -> None:
    """Processes its share of the shards until it has seen `expected` idle polls
    in a row, recording every payload it handled."""
    from consumers import Consumer

    seen: list[bytes] = []
    idle = [0]

    def handle(batch: ReadBatch) -> None:
        seen.extend(batch.payloads)
        idle[0] = 0

    def stop() -> bool:
        idle[0] += 1
        return idle[0] > 40  # ~40 empty polls: the stream is drained

    with Consumer(path, stream, group, assignment=(int(i), int(n))) as c:
        c.process(handle, batch_size=97, poll_interval=0.01, stop=stop)
    with open(out, "wb") as f:
        f.write(b"\n".join(seen))


def consume_slowly(path: str, stream: str, group: str, log_path: str) -> None:
    """Handles one entry at a time, slowly, noting each in log_path before
    its batch is acknowledged: killed mid-batch by the test."""
    from consumers import Consumer

    def handle(batch: ReadBatch) -> None:
        with open(log_path, "ab") as f:
            for e in batch.entries:
                f.write(b"%d\n" % e)
                f.flush()
                time.sleep(0.01)

    with Consumer(path, stream, group) as c:
        c.process(handle, batch_size=25, poll_interval=0.01)


def read_through_deletion(path: str, stream: str, total: str, ready: str) -> None:
    """Reads a shard slowly from entry 0 while another process deletes its
    oldest segments: every entry returned must be right, and what it could
    not read must be reported as skipped."""
    cfg = Config(shards=1, segment_bytes=64 << 10, background_flush=False, retention_interval_ms=0)
    with Log(path, cfg) as log:
        first = log.read(stream, 0, 0, 50)
        position, returned, skipped = first.next_entry, len(first), first.skipped
        open(ready, "w").close()
        while position < int(total):
            batch = log.read(stream, 0, position, 50)
            for e, p in zip(batch.entries, batch.payloads):
                assert p == b"%08d" % e + b"." * 200, (e, p[:20])
            returned += len(batch)
            skipped += batch.skipped
            position = batch.next_entry
            time.sleep(0.002)
        print(returned, skipped, flush=True)


def hold_s3_lease(endpoint: str, url: str, stream: str, group: str, lease_s: str) -> None:
    """Takes an S3 lake's lock for the stream and group with a lease of
    ``lease_s`` seconds, prints "held", then works (renews it) until killed."""
    from spark_jobs.lake.lock import s3lease
    from spark_jobs.lake.lakefs import Lake

    s3lease.LEASE_S = float(lease_s)
    lake = Lake(url, endpoint_url=endpoint, access_key="test", secret_key="test")
    with s3lease.s3_lease(lake, stream, group):
        print("held", flush=True)
        time.sleep(600)


def try_append(path: str, stream: str) -> None:
    """Opens shard 0 of stream, prints "open", and at a line on stdin appends
    one entry to it; prints "appended N" or "refused: <error>"."""
    from storage_c import CometError
    with Log(path, Config(background_flush=False)) as log:
        log.read(stream, 0, 0, 1)  # opens the shard (statistics would not)
        print("open", flush=True)
        sys.stdin.readline()
        try:
            print("appended", log.append(stream, b"x", shard=0)[1])
        except CometError as exc:
            print(f"refused: {type(exc).__name__}: {exc}")


def append_three_durably(path: str) -> None:
    """Appends three entries with durability always, printing "acknowledged i" after
    each: where an armed cut point (COMET_CUT_POINT) ends the process shows."""
    log = Log(path, Config(shards=1, durability="always"))
    for i in range(3):
        log.append("s", b"entry %d" % i, shard=0)
        print("acknowledged", i, flush=True)


def fill_the_disk(path: str) -> None:
    """Appends 1000-byte entries until StorageFull, prints "full <count> <error>", waits
    for a line on stdin (the test frees space), appends one more and prints "after"."""
    cfg = Config(shards=1, segment_bytes=64 << 20, segment_chunk_bytes=256 << 10)
    with Log(path, cfg) as log:
        n = 0
        try:
            while True:
                log.append("full", b"%08d" % n + b"y" * 992, shard=0)
                n += 1
        except StorageFull as exc:
            print("full", n, exc, flush=True)
        sys.stdin.readline()
        log.append("full", b"after", shard=0)
        print("after", flush=True)


def write_within_budget(path: str, stream: str, count: str) -> None:
    """Appends ``count`` 1000-byte entries over two shards under a 3 MiB retention
    budget of the whole directory, then prints "ok"."""
    cfg = Config(shards=2, segment_bytes=256 << 10, segment_chunk_bytes=64 << 10,
                 retention_max_total_bytes=3 << 20, retention_interval_ms=0)
    with Log(path, cfg) as log:
        for i in range(int(count)):
            log.append(stream, b"%s-%08d-" % (stream.encode(), i) + b"z" * 980, shard=i % 2)
    print("ok", flush=True)


def consume_and_print(path: str) -> None:
    """Reads shard 0 of "ev" as group "readers", 7 entries at a time, printing each
    batch's entry numbers before acknowledging it; ends after 4 s without an entry."""
    from consumers.consumer import Consumer

    with Consumer(path, "ev", "readers") as c:
        idle = 0
        while idle < 400:
            batch = c.read(7, shard=0)
            if not len(batch):
                idle += 1
                time.sleep(0.01)
                continue
            idle = 0
            print(" ".join(str(e) for e in batch.entries), flush=True)
            time.sleep(0.02)
            c.ack_batch(batch)


def post_big_bodies(port: str, size: str) -> None:
    """Posts NDJSON bodies of ``size`` bytes to /streams/big of the gateway on ``port``
    over one connection, forever: "ready", then "posted" after each 202."""
    import http.client

    line = b'{"pad":"' + b"p" * 1000 + b'"}\n'
    body = line * (int(size) // len(line))
    conn = http.client.HTTPConnection("127.0.0.1", int(port), timeout=60)
    print("ready", flush=True)
    while True:
        conn.request("POST", "/streams/big", body=body, headers={"content-type": "application/x-ndjson"})
        r = conn.getresponse()
        r.read()
        assert r.status == 202, r.status
        print("posted", flush=True)


COMMANDS = {f.__name__: f for f in (try_append, read_through_deletion, crash_appender, writer, hold_slot,
                                    die_holding_lock, hold_s3_lease, hold_state_locks,
                                    always_appender, append_always,
                                    fill_until_full, rotating_writer, append_one, group_offset,
                                    consume_assigned, consume_slowly, append_three_durably,
                                    fill_the_disk, write_within_budget, consume_and_print,
                                    post_big_bodies)}

if __name__ == "__main__":
    COMMANDS[sys.argv[1]](*sys.argv[2:])
