"""What the tests and the load tests share: servers in processes of their own, the no-loss check."""
