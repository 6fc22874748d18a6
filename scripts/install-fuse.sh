#!/usr/bin/env bash
# scripts/install-fuse.sh: what the power-cut tests (tests/powercut/) need from the system:
# Debian's fuse3 (fusermount3, /etc/fuse.conf) and libfuse3-3 (the library mfusepy loads
# through ctypes), util-linux's unshare and mount (present on Debian).  Idempotent: a no-op
# when all are installed.  The Python side (mfusepy) is in pyproject's dev extras.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
"$here/apt-install.sh" fuse3 libfuse3-3 util-linux mount
if [[ ! -e /dev/fuse ]]; then
  echo "install-fuse.sh: /dev/fuse is missing (no FUSE in this kernel or container:" \
       "run the container with --device /dev/fuse --cap-add SYS_ADMIN)" >&2
  exit 1
fi
