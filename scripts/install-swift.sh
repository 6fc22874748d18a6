#!/usr/bin/env bash
# Installs the Debian OpenStack Swift packages that tests/swift_server.py runs as a
# local S3 endpoint (s3api + tempauth on 127.0.0.1). Idempotent: exits 0 at once when
# everything is already installed. Quiet unless something fails.
#
# Only the packages' Depends are installed (--no-install-recommends keeps keystone,
# barbican and their desktop baggage out). The packaged systemd units stay inert: they
# require rings in /etc/swift, which nothing here creates; the test fixture runs its own
# servers from a private configuration directory.
set -euo pipefail

PACKAGES=(swift swift-proxy swift-object swift-container swift-account)

installed() {
  local status
  for pkg in "${PACKAGES[@]}"; do
    status=$(dpkg-query -W -f='${db:Status-Abbrev}' "$pkg" 2>/dev/null || true)
    [[ $status == ii* ]] || return 1
  done
}

installed && exit 0

if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-swift.sh: apt-get not found (Debian/Ubuntu only)" >&2
  exit 1
fi

SUDO=()
if [[ $(id -u) != 0 ]]; then
  command -v sudo >/dev/null 2>&1 || { echo "install-swift.sh: need root or sudo" >&2; exit 1; }
  SUDO=(sudo)
  [[ -t 0 ]] || SUDO+=(-n)  # never hang on a password prompt without a terminal
fi

LOG=$(mktemp "${TMPDIR:-/tmp}/install-swift.XXXXXX")
trap 'rm -f "$LOG"' EXIT

apt_get() {
  # Wait for a concurrent apt/dpkg run (another test, unattended-upgrades) instead of failing.
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get -q -y -o DPkg::Lock::Timeout=300 "$@" >>"$LOG" 2>&1
}

if ! apt_get install --no-install-recommends "${PACKAGES[@]}"; then
  # Usually a stale or empty package index (fresh CI image): refresh it once and retry.
  if ! { apt_get update && apt_get install --no-install-recommends "${PACKAGES[@]}"; }; then
    echo "install-swift.sh: apt-get failed; last lines of its output:" >&2
    tail -n 30 "$LOG" >&2
    exit 1
  fi
fi

installed || { echo "install-swift.sh: packages still not installed: ${PACKAGES[*]}" >&2; exit 1; }
