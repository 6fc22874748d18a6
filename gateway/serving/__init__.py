"""How `comet serve` runs the gateway's app: gunicorn's master, uvicorn's
worker, server and HTTP protocol, each subclassed where stock behaviour would
lose a request or let one client take a worker.

Everything here works below the app (gateway.app): it sees connections,
sockets and signals, never a route.  The app is built from the configuration
in each worker (``GatewayServer.load``); what the protocol enforces comes
from gateway.limits.

Why each piece exists:

* ``server.GatewayServer`` and ``server.CometArbiter`` (gunicorn's
  application and master): one process whose settings come from one
  GatewayConfig, no gunicorn configuration file, a HUP reload that keeps the
  running configuration when the new one does not load, every stop signal a
  drain, workers that die with their master (a master killed with SIGKILL
  would otherwise leave them holding the port and the storage's slots).
* ``worker.CometWorker`` and ``worker.CometServer`` (uvicorn-worker's worker,
  uvicorn's Server): no request dropped on reload or stop.  The drain is
  marked before the server stops accepting (connections accepted late drain
  too), the connections still queued on the listening sockets are adopted,
  and on the final stop new handshakes are refused first, so that closing the
  listener resets nobody.  TLS handshakes get the head's deadline, QUIT
  drains like TERM, and a stopped worker exits 0.
* ``protocol.CometHttpProtocol`` (uvicorn's httptools protocol): no request
  dropped and no connection reset: lingering closes, an idle connection
  closed only when nothing waits in its receive buffer, a drain that answers
  every request received, a 400 only after the answers before it; and the
  connection limits: the head's size and field count, a deadline on every
  phase (head, body, idle), at most ``max_connections`` per worker, each
  refusal counted and logged.
* ``listeners``: closing a worker's listening sockets without resetting a
  connection the kernel already completed (Linux: /proc and a socket filter
  that drops SYNs).
* ``versions``: these subclasses reach into uvicorn's, gunicorn's and
  uvicorn-worker's internals, which change between minor releases without
  notice; `comet serve` refuses to start with versions it was not tested with
  rather than lose requests silently.

Each module's docstring gives the details: which lines of uvicorn lose what,
and what is left (gateway/serving/protocol.py).
"""
