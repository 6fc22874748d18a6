"""The benchmarks and the load test, run from the repository's root as
``python -m loadtests.<name>``: a package beside ``tests`` so that both import the
test kit (``tests.support``) by name, as pytest imports it from the same root."""
