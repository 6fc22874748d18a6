"""gunicorn settings for `comet serve` (``gunicorn -c gateway/gunicorn.conf.py``).

Workers are uvicorn workers (gateway.worker.CometWorker: lingering closes, a
graceful drain that answers every request it received); each claims a process
slot in post_worker_init (worker side, after its signal handlers are in place),
never in post_fork, where blocking would stall the master.  Shutdown work lives
in the ASGI lifespan, because gunicorn's worker_exit does not run under the
uvicorn worker.
"""

from __future__ import annotations

import ctypes
import os
import signal
from typing import Any

from gateway.config import load
from gateway.logs import LOGCONFIG

_config = load()
PR_SET_PDEATHSIG = 1

bind = [f"{_config.host}:{_config.port}"]
workers = _config.worker_count
worker_class = "gateway.worker.CometWorker"  # uvicorn's, with a drain that answers every request
control_socket_disable = True  # parallel gunicorns must not share one control socket
graceful_timeout = 30
timeout = 60
keepalive = 5
accesslog = None
logconfig_dict = LOGCONFIG
proc_name = "comet-gateway"


def post_worker_init(worker: Any) -> None:
    # The uvicorn worker never checks that its master is alive: a master
    # killed with SIGKILL would leave workers holding the port and the slots
    # forever.  Ask the kernel for a SIGTERM (a graceful stop) when it dies.
    if not set_parent_death_signal(signal.SIGTERM) or os.getppid() != worker.ppid:
        os.kill(os.getpid(), signal.SIGTERM)
    worker.wsgi.state.runtime.claim_slot()


def set_parent_death_signal(sig: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
