"""The programs the tests run as processes of their own, by path, under the venv's
python (tests/support/processes.py has their paths and launchers): workers.py, one
command each for the multi-process, crash, disk, consumer and load tests; fault_worker.py,
the writer, opener and checker of tests/test_faults.py.  A test may import a program's
module for what it shares with the program (a payload, a configuration)."""
