#!/usr/bin/env bash
# Builds the local base image of docker/Dockerfile and docker/Dockerfile.spark when no image
# registry is reachable (CI): a minimal Debian bookworm (debootstrap --variant=minbase from
# the Debian mirror this machine's apt uses) with Python 3.11, venv and CA certificates,
# imported as $COMET_BASE_IMAGE (default comet-base:bookworm).  Idempotent and cached:
#   - nothing to do when the image exists and carries the hash of this script's code
#     (label comet.base);
#   - else the root file system tarball cached in $COMET_DOCKER_CACHE (default
#     /var/cache/comet-docker) is imported again (seconds);
#   - else debootstrap runs (45-55 s with a nearby mirror) and fills that cache.
# The engine comes from scripts/install-docker.sh (run here, idempotent; a dockerd that it
# starts for this script is stopped again at the end).
#
# The image trusts what this machine trusts: the host's local CA certificates
# (/usr/local/share/ca-certificates, e.g. a TLS-intercepting proxy's) are added to its
# store, and pip is pointed at that store, so that `pip install` inside a build reaches
# PyPI wherever the host's pip does.  Needs root or sudo.
set -euo pipefail
cd "$(dirname "$0")/.."

TAG=${COMET_BASE_IMAGE:-comet-base:bookworm}
CACHE=${COMET_DOCKER_CACHE:-/var/cache/comet-docker}
SUITE=bookworm
PACKAGES=python3,python3-venv,ca-certificates,passwd
HASH=$(grep -v '^[[:space:]]*#' "$0" | sha256sum | cut -c1-12)   # comments aside
TARBALL=$CACHE/comet-base-$SUITE-$HASH.tar

engine=$(scripts/install-docker.sh)   # DOCKER, DOCKER_HOST, DOCKER_STARTED
eval "$engine"
export DOCKER_HOST
[[ $DOCKER_STARTED == 0 ]] || trap 'scripts/install-docker.sh --stop' EXIT   # only what we started
SUDO=()
[[ $(id -u) == 0 ]] || SUDO=(sudo -n)

have=$("$DOCKER" image inspect --format '{{index .Config.Labels "comet.base"}}' "$TAG" 2>/dev/null || true)
[[ $have == "$HASH" ]] && exit 0

if [[ ! -s $TARBALL ]]; then
  # The mirrors of this machine's apt (deb822 .sources or one-line sources.list).
  uris=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null |
         sed -n -e 's/^URIs:[[:space:]]*//p' \
                -e 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([^[:space:]]\+\).*/\2/p' | tr ' ' '\n' || true)
  mirror=$(grep -m1 -E '/debian/?$' <<<"$uris" || echo http://deb.debian.org/debian)
  security=$(grep -m1 -E '/debian-security/?$' <<<"$uris" || echo http://deb.debian.org/debian-security)

  "${SUDO[@]}" mkdir -p "$CACHE"
  work=$("${SUDO[@]}" mktemp -d "$CACHE/rootfs.XXXXXX")
  log=$(mktemp "${TMPDIR:-/tmp}/debootstrap.XXXXXX")
  trap '"${SUDO[@]}" rm -rf "$work"; rm -f "$log"; [[ $DOCKER_STARTED == 0 ]] || scripts/install-docker.sh --stop' EXIT
  root=$work/root
  if ! "${SUDO[@]}" debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$root" "$mirror" \
        >"$log" 2>&1; then
    echo "build-base-image.sh: debootstrap failed; last lines of its log:" >&2
    tail -n 30 "$log" >&2
    [[ -f $root/debootstrap/debootstrap.log ]] && "${SUDO[@]}" tail -n 30 "$root/debootstrap/debootstrap.log" >&2
    exit 1
  fi
  "${SUDO[@]}" sh -eu -c '
    root=$1 mirror=$2 security=$3 suite=$4
    rm -f "$root/etc/apt/sources.list"
    cat >"$root/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $mirror
Suites: $suite $suite-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $security
Suites: $suite-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then
      cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
      chroot "$root" update-ca-certificates >/dev/null 2>&1
    fi
    printf "[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n" >"$root/etc/pip.conf"
    : >"$root/etc/resolv.conf"; : >"$root/etc/hostname"
    rm -rf "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* \
           "$root"/var/log/* "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/*
    tar --numeric-owner -C "$root" -cf "$5.part" . && mv "$5.part" "$5"
  ' sh "$root" "$mirror" "$security" "$SUITE" "$TARBALL"
  "${SUDO[@]}" rm -f "$CACHE"/comet-base-"$SUITE"-*.tar.part
  for old in "$CACHE"/comet-base-"$SUITE"-*.tar; do
    [[ $old == "$TARBALL" ]] || "${SUDO[@]}" rm -f "$old"
  done
fi

previous=$("$DOCKER" image inspect --format '{{.Id}}' "$TAG" 2>/dev/null || true)
"${SUDO[@]}" cat "$TARBALL" | "$DOCKER" import \
  -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8' \
  -c "LABEL comet.base=$HASH" -c 'CMD ["/bin/bash"]' \
  -m "debootstrap --variant=minbase --include=$PACKAGES $SUITE" - "$TAG" >/dev/null
[[ -z $previous ]] || "$DOCKER" rmi "$previous" >/dev/null 2>&1 || true   # the image replaced, by id
