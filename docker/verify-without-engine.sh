#!/usr/bin/env bash
# Checks the Docker files on a machine without a Docker engine (see tests/test_docker.py):
#   - the static checks of the Dockerfiles, compose.yaml and .dockerignore (a few seconds);
#   - the emulated build (about a minute): the builder stage's RUN lines as written (paths mapped into a temporary
#     directory, a fresh venv as the image's Python), then the runtime stage from the copied venv
#     alone: `comet serve` answers the HEALTHCHECK, refuses to start without tokens, takes
#     authenticated writes and stops on TERM; compose's `ship` and `spark-ship` command lines
#     with compose's environment ship to an S3 store (Swift's s3api, else moto).
# Both run in `make test`; this script runs only them.  Needs the venv, Java, Swift if possible, and PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || make venv
exec .venv/bin/python -m pytest tests/test_docker.py -p no:cacheprovider -rs "$@"
