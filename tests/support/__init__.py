"""The test kit: what the tests and the load tests (loadtests/, as ``tests.support``)
share; test modules import helpers from here only, never from one another or from a
conftest.py.  Servers in processes of their own (server.py), the load generator
(posters.py), the no-loss check (noloss.py), the storage helpers (storage.py), the
in-process gateway (gateway_app.py), `comet ship`'s checks (ship.py), the programs of
tests/children/ in child processes (processes.py), OpenStack Swift (swift_server.py)."""
