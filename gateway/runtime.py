"""What one gateway worker holds: the opened data directory, its process slot,
the in-flight byte budget (and each tenant's part of it), what tenants share
(gateway.tenants), the refusals it counts and logs (gateway.limits), and
whether it is starting, serving or draining.

The slot is claimed from gunicorn's ``post_worker_init`` hook (in the worker,
after its signal handlers are set up).  When every slot is still held - a
reload starts the new workers while the old ones drain - a background thread
keeps trying every 100 ms instead of blocking, and the worker answers 503
until it has one.  Without gunicorn (tests, a single uvicorn), the ASGI
lifespan claims it.  Shutdown, in the lifespan's shutdown (gunicorn's
``worker_exit`` never runs under the uvicorn worker), stops taking writes,
waits for the ones in flight, syncs, and releases the slot by closing.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time

from starlette.types import Scope

from comet.files import share_data_dir
from comet.jsonlog import event
from storage_c import Log, NoFreeSlot

from .auth import AuthFailed
from .config import GatewayConfig
from .errors import HTTPError, clipped, errors_answered
from .limits import Refusals
from .metrics import Layout, WorkerMetrics
from .tenants import Creators, IdempotencyShards

log = logging.getLogger("comet.gateway.runtime")


class Runtime:
    def __init__(self, config: GatewayConfig, layout: Layout) -> None:
        self.config = config
        self.layout = layout
        """Of this worker's metrics file: the route table's (gateway.routes.LAYOUT)."""
        self.log: Log | None = None
        self.metrics: WorkerMetrics | None = None
        self.draining = False
        self.inflight = 0
        self.tenants: dict[str, int] = {}  # in-flight bytes by tenant (one entry per tenant in flight)
        self._slot: int | None = None
        self.storage_full: str | None = None
        """Why the last write failed with storage full; None once a write
        succeeds or readiness finds room again (see room_returned)."""
        self.storage_refused: str | None = None
        """Why the storage refused a write until an operator acts (a removed directory, a
        read-only filesystem, a failed sync): the shard stays refused in this worker until
        it restarts, and readiness says so meanwhile."""
        self.refusals = Refusals(lambda: self.metrics)
        self.creators = Creators(config.data_dir)
        self.idempotency_shards = IdempotencyShards(config.data_dir)
        self._claiming: threading.Thread | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()

    # ---- lifecycle -------------------------------------------------------------------

    def open(self) -> None:
        with self._lock:
            if self.log is None:
                missing = not os.path.exists(self.config.data_dir)
                if self.config.data_group:
                    share_data_dir(self.config.data_dir, self.config.data_group)
                self.log = Log(self.config.data_dir, self.config.worker_storage_config())
                if missing:  # a first start, or one after the directory was removed: say so
                    event(log, "data_directory_created", logging.INFO,
                          path=self.config.data_dir)
                mode = stat.S_IMODE(os.stat(self.config.data_dir).st_mode)
                if mode & 0o007:  # the storage takes these away from a directory it owns
                    event(log, "data_directory_open_to_others", logging.WARNING,
                          path=self.config.data_dir, mode=f"{mode:04o}",
                          risk="other local users can read the events and lock the storage's "
                               "files against the gateway",
                          action=f"chmod o-rwx {self.config.data_dir}, or run the gateway as "
                                 "the directory's owner")

    def claim_slot(self) -> None:
        """Claims a slot now, or keeps trying in the background."""
        self.open()
        with self._lock:
            if self.slot is not None or self._claiming is not None:
                return
            self._claiming = threading.Thread(target=self._claim_loop, name="comet-slot",
                                              daemon=True)
            self._claiming.start()

    def _claim_loop(self) -> None:
        started = time.monotonic()
        told = warned = False
        while not self._stop.is_set():
            try:
                assert self.log is not None
                slot = self.log.claim_slot()
            except NoFreeSlot:
                waited = time.monotonic() - started
                if not told:
                    event(log, "waiting_for_slot", slots=self.config.worker_count)
                    told = True
                elif not warned and waited >= self.config.slot_wait_s:
                    # serving by now, with 503s: say why, once
                    warned = True
                    event(log, "still_waiting_for_slot", logging.WARNING, waited_s=round(waited, 1),
                          action="answering 503 until a slot is free: old workers still drain "
                                 "after a reload, or another process holds slots of "
                                 f"{self.config.data_dir} (fuser -v {self.config.data_dir}/.slots)")
                self._stop.wait(0.1)
                continue
            except Exception as exc:  # a closed log or an I/O error: say it, stop trying
                event(log, "slot_claim_failed", logging.ERROR, error=str(exc))
                return
            self._slot = slot
            self.metrics = WorkerMetrics.open(self.config.data_dir, slot, self.layout)
            # the time a claim blocked inside the storage (another opener of .slots) counts too
            event(log, "slot_claimed", slot=slot, waited_s=round(time.monotonic() - started, 1))
            return

    def answered(self, exc: HTTPError, scope: Scope) -> None:
        """An error answer of any route: logged if it names a fault the operator
        must hear of (errors.ErrorLog), counted and logged if it refused a token."""
        path = scope["path"]
        errors_answered.answered(exc.status, exc.code, exc.detail, path, self.slot)
        if isinstance(exc, AuthFailed):
            client = scope.get("client")
            address = client[0] if client else None
            # one line a minute per client and status: a guesser shows, its guesses do not flood
            self.refusals.refused("auth_failed", address, cause=f"{exc.status} {address}",
                                  status=exc.status, detail=exc.detail, path=clipped(path))

    def stop_waiting(self) -> None:
        """A stop signal came: a worker still waiting for its slot gives up
        (and stops at once instead of after slot_wait_s)."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def slot(self) -> int | None:
        return self._slot  # kept here: asked per request (the access log)

    @property
    def ready(self) -> bool:
        return self.metrics is not None and not self.draining

    def drain_and_close(self, timeout: float = 30.0) -> None:
        """Stops taking writes, lets the ones in flight finish, syncs, closes."""
        self.draining = True
        self._stop.set()
        deadline = time.monotonic() + timeout
        while self.inflight and time.monotonic() < deadline:
            time.sleep(0.01)
        with self._lock:
            if self.log is not None:
                self.log.sync()
                self.log.close()
            self.idempotency_shards.close()
            self._slot = None
        if self.metrics is not None:
            self.metrics.close()

    # ---- storage full ------------------------------------------------------------

    def room_returned(self) -> bool:
        """Whether the next write could fit again after a storage-full error:
        the filesystem has two chunks free, and the directory is under its
        retention budget by a chunk once retention has deleted what it may.
        Readiness asks this, so that a worker taken out of rotation for a
        full disk comes back without a write having to succeed first."""
        storage = self.config.storage
        # a new segment's first chunk and index, or the next chunk: at most this
        need = storage.segment_chunk_bytes + storage.segment_bytes // 256 + 8192
        fs = os.statvfs(self.config.data_dir)
        if fs.f_bavail * fs.f_frsize < 2 * need:
            return False
        budget = storage.retention_max_total_bytes
        if budget and self.log is not None:
            self.log.run_retention(room=need)
            if self.log.data_bytes() + need > budget:
                return False
        self.storage_full = None
        return True

    # ---- the in-flight budget --------------------------------------------------------

    def reserve(self, nbytes: int, tenant: str, own: int = 0) -> str | None:
        """Takes nbytes more of the worker's in-flight budget for a request of
        ``tenant`` that holds ``own`` bytes already, or says which budget is
        spent: "tenant" (its share, tenant_inflight_bytes) or "worker"
        (inflight_bytes).  A request alone in flight for its tenant may grow
        however large, and so may one alone in the worker."""
        held = self.tenants.get(tenant, 0)
        if held > own and held + nbytes > self.config.tenant_inflight_bytes:
            return "tenant"
        if self.inflight > own and self.inflight + nbytes > self.config.inflight_bytes:
            return "worker"
        self.inflight += nbytes
        self.tenants[tenant] = held + nbytes
        return None

    def release(self, nbytes: int, tenant: str) -> None:
        self.inflight -= nbytes
        left = self.tenants.pop(tenant, 0) - nbytes
        if left > 0:
            self.tenants[tenant] = left

