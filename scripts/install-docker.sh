#!/usr/bin/env bash
# Makes a Docker engine available for tests/test_docker.py and scripts/build-base-image.sh.
# Idempotent; quiet unless something fails.  Prints, for `eval`, the CLI and the socket to
# use, and whether this call started the daemon:
#
#   DOCKER=/usr/bin/docker
#   DOCKER_HOST=unix:///run/comet-docker/docker.sock
#   DOCKER_STARTED=1
#
# 1. Installs Debian's docker.io (dockerd, containerd, runc, the 20.10 CLI with BuildKit)
#    and debootstrap if they are missing (scripts/apt-install.sh).
# 2. Uses the engine that answers at $DOCKER_HOST or at the default socket if there is
#    one; otherwise starts a private dockerd: its own data root ($COMET_DOCKER_ROOT,
#    default /var/lib/comet-docker, where the images stay cached between runs), its own
#    socket, exec root and pid file under $COMET_DOCKER_RUN (default /run/comet-docker),
#    the default bridge network, its log in $COMET_DOCKER_ROOT/dockerd.log.  A daemon
#    started here is marked with $COMET_DOCKER_RUN/started-by-comet; the caller that
#    started it (DOCKER_STARTED=1: the test fixture, scripts/build-base-image.sh) stops it
#    when done, by the PID in $COMET_DOCKER_RUN/dockerd.pid: `scripts/install-docker.sh
#    --stop`, which leaves any other engine alone.
# Needs root or sudo (dockerd runs as root).
set -euo pipefail

ROOT=${COMET_DOCKER_ROOT:-/var/lib/comet-docker}
RUN=${COMET_DOCKER_RUN:-/run/comet-docker}
SOCK=unix://$RUN/docker.sock
PIDFILE=$RUN/dockerd.pid
MARK=$RUN/started-by-comet
DOCKER=/usr/bin/docker   # docker.io's CLI: BuildKit without a buildx plugin

SUDO=()
if [[ $(id -u) != 0 ]]; then
  command -v sudo >/dev/null 2>&1 || { echo "install-docker.sh: need root or sudo" >&2; exit 1; }
  SUDO=(sudo)
  [[ -t 0 ]] || SUDO+=(-n)  # never hang on a password prompt without a terminal
fi

if [[ ${1:-} == --stop ]]; then
  [[ -f $MARK && -f $PIDFILE ]] || exit 0
  pid=$(cat "$PIDFILE")
  "${SUDO[@]}" kill -TERM "$pid" 2>/dev/null || true
  while "${SUDO[@]}" kill -0 "$pid" 2>/dev/null; do sleep 0.2; done  # it stops its containerd first
  "${SUDO[@]}" rm -f "$MARK"
  exit 0
fi

"$(dirname "$0")/apt-install.sh" docker.io debootstrap

answers() { "${SUDO[@]}" env DOCKER_HOST="$1" "$DOCKER" version --format '{{.Server.Version}}' >/dev/null 2>&1; }
found() { printf 'DOCKER=%s\nDOCKER_HOST=%s\nDOCKER_STARTED=%s\n' "$DOCKER" "$1" "$2"; exit 0; }

# ---- an engine that already runs
for host in ${DOCKER_HOST:-} unix:///var/run/docker.sock "$SOCK"; do
  answers "$host" && found "$host" 0
done

# ---- a private dockerd
"${SUDO[@]}" mkdir -p "$ROOT" "$RUN"
if [[ -f $PIDFILE ]] && "${SUDO[@]}" kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
  echo "install-docker.sh: dockerd $(cat "$PIDFILE") runs but $SOCK does not answer; see $ROOT/dockerd.log" >&2
  exit 1
fi
group=()
[[ ${#SUDO[@]} == 0 ]] || group=(--group "$(id -gn)")   # the socket usable without sudo
# BuildKit's cache is collected beyond 5 GB (rebuilds after every source change add up).
echo '{"builder": {"gc": {"enabled": true, "defaultKeepStorage": "5GB"}}}' |
  "${SUDO[@]}" tee "$RUN/daemon.json" >/dev/null
"${SUDO[@]}" setsid /usr/sbin/dockerd --config-file "$RUN/daemon.json" --data-root "$ROOT" \
  --exec-root "$RUN/exec" --host "$SOCK" --pidfile "$PIDFILE" "${group[@]}" \
  </dev/null >>"$ROOT/dockerd.log" 2>&1 &
started=$!
echo "$started" | "${SUDO[@]}" tee "$MARK" >/dev/null
for _ in $(seq 1 300); do          # until the API answers (seconds), at most 60 s
  answers "$SOCK" && found "$SOCK" 1
  "${SUDO[@]}" kill -0 "$started" 2>/dev/null || break
  sleep 0.2
done
"${SUDO[@]}" kill "$started" 2>/dev/null || true
"${SUDO[@]}" rm -f "$MARK"
echo "install-docker.sh: dockerd did not come up; last lines of $ROOT/dockerd.log:" >&2
"${SUDO[@]}" tail -n 30 "$ROOT/dockerd.log" >&2
exit 1
