#!/usr/bin/env bash
# Builds the image deploy/kubernetes/memwatch.yaml runs, memwatch:VERSION, from this repository and
# nothing pulled: the Debian 12 root scripts/container-image.sh makes with debootstrap (cached), with
# the Debian package (scripts/build-deb.sh) unpacked into it; /usr/bin/memwatch is its entrypoint.
# Imports it into each engine named (docker, podman; none named: every one that answers) and, with
# --save FILE, writes it as an image archive too, for a cluster's runtime:
#
#   sudo ./scripts/build-image.sh [--deb target/debian/memwatch_*.deb] [--save memwatch.tar] [docker|podman…]
#   sudo ctr -n k8s.io images import memwatch.tar      # on each node (containerd), or push it to a registry
#
# Prints the image's name on its last line of stdout. Needs root (debootstrap, the engines).
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "build-image: $*" >&2; }
[ "$(id -u)" = 0 ] || { log "run as root"; exit 1; }
deb='' save='' engines=()
while [ $# -gt 0 ]; do
  case $1 in
    --deb) deb=${2:?--deb needs a file}; shift 2 ;;
    --save) save=${2:?--save needs a file}; shift 2 ;;
    docker | podman) engines+=("$1"); shift ;;
    *) log "unknown argument $1 (--deb FILE, --save FILE, docker, podman)"; exit 2 ;;
  esac
done
if [ ${#engines[@]} = 0 ]; then
  for e in docker podman; do
    command -v "$e" >/dev/null 2>&1 && "$e" info >/dev/null 2>&1 && engines+=("$e")
  done
fi
[ ${#engines[@]} -gt 0 ] || { log "no container engine answers (docker info, podman info): install docker.io or podman"; exit 1; }
if [ -z "$deb" ]; then
  ./scripts/build-deb.sh >/dev/null
  deb=$(ls -t target/debian/memwatch_*.deb | head -n 1)
fi
[ -f "$deb" ] || { log "no package at $deb"; exit 1; }
version=$(dpkg-deb -f "$deb" Version)
image=memwatch:$version

rootfs=$(./scripts/container-image.sh --rootfs | tail -n 1)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/root"
tar -C "$work/root" -xf "$rootfs"
# The package's files, as dpkg would lay them (its maintainer scripts enable a systemd unit, which a
# container has no use for), through the root's merged-/usr links (/lib is usr/lib: kept a link).
dpkg-deb --fsys-tarfile "$deb" | tar -C "$work/root" -x --keep-directory-symlink
"$work/root/usr/bin/memwatch" --version >/dev/null ||
  { log "the packaged binary does not run: $("$work/root/usr/bin/memwatch" --version 2>&1 | tail -n 1)"; exit 1; }
tar -C "$work/root" --numeric-owner -cf "$work/image.tar" .
for e in "${engines[@]}"; do
  "$e" import --change 'ENTRYPOINT ["/usr/bin/memwatch"]' --change 'CMD ["run"]' \
    "$work/image.tar" "$image" >/dev/null
  log "imported $image into $e ($(du -m "$work/image.tar" | cut -f1) MiB)"
done
if [ -n "$save" ]; then
  "${engines[0]}" save -o "$save" "$image"
  log "saved $image to $save"
fi
echo "$image"
