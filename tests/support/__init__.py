"""What the tests and the load tests share: servers in processes of their own, the
gateway in the test's own process, the no-loss check."""
