#!/usr/bin/env bash
# scripts/apt-install.sh PACKAGE...: installs the Debian packages that are missing
# (--no-install-recommends), refreshing the package index once if the first attempt fails
# (a fresh CI machine).  Idempotent: a no-op when all are installed.  Quiet unless it
# fails.  Waits for a concurrent apt/dpkg run instead of failing.  Needs root or sudo.
set -euo pipefail

missing=()
for pkg in "$@"; do
  [[ $(dpkg-query -W -f='${db:Status-Abbrev}' "$pkg" 2>/dev/null || true) == ii* ]] || missing+=("$pkg")
done
(( ${#missing[@]} )) || exit 0

command -v apt-get >/dev/null 2>&1 || { echo "apt-install.sh: apt-get not found (Debian/Ubuntu only)" >&2; exit 1; }
SUDO=()
if [[ $(id -u) != 0 ]]; then
  command -v sudo >/dev/null 2>&1 || { echo "apt-install.sh: need root or sudo" >&2; exit 1; }
  SUDO=(sudo)
  [[ -t 0 ]] || SUDO+=(-n)  # never hang on a password prompt without a terminal
fi
LOG=$(mktemp "${TMPDIR:-/tmp}/apt-install.XXXXXX")
trap 'rm -f "$LOG"' EXIT
apt_get() {
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -q -y -o DPkg::Lock::Timeout=300 "$@" >>"$LOG" 2>&1
}
apt_get install --no-install-recommends "${missing[@]}" ||
  { apt_get update && apt_get install --no-install-recommends "${missing[@]}"; } ||
  { echo "apt-install.sh: installing ${missing[*]} failed; last lines of apt-get:" >&2; tail -n 30 "$LOG" >&2; exit 1; }
