"""gunicorn settings for `comet serve` (``gunicorn -c gateway/gunicorn.conf.py``).

Workers are uvicorn workers; each claims a process slot in post_worker_init
(worker side, after its signal handlers are in place) - never in post_fork,
where blocking would stall the master.  Shutdown work lives in the ASGI
lifespan, because gunicorn's worker_exit does not run under the uvicorn worker.
"""

from __future__ import annotations

from typing import Any

from gateway.config import load
from gateway.logs import LOGCONFIG

_config = load()

bind = [f"{_config.host}:{_config.port}"]
workers = _config.worker_count
worker_class = "uvicorn_worker.UvicornWorker"
control_socket_disable = True  # parallel gunicorns must not share one control socket
graceful_timeout = 30
timeout = 60
keepalive = 5
accesslog = None
logconfig_dict = LOGCONFIG
proc_name = "comet-gateway"


def post_worker_init(worker: Any) -> None:
    worker.wsgi.state.runtime.claim_slot()
