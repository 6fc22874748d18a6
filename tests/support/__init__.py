"""What the tests and the load tests share (test modules import helpers from here only,
never from one another or from a conftest.py): servers in processes of their own
(server.py), the no-loss check (noloss.py), the storage helpers (storage.py), the
in-process gateway (gateway_app.py), `comet ship`'s checks (ship.py), tests/workers.py
in child processes (processes.py), OpenStack Swift (swift_server.py)."""
