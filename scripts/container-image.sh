#!/usr/bin/env bash
# Builds the image the container tests (tests/containers.rs) run: Debian 12 (bookworm) minbase with
# python3, made here with debootstrap from the Debian mirror this machine's apt uses (nothing is pulled
# from an image registry), and imports it into each engine named on the command line (docker, podman;
# none named: every one of them that answers) as memwatch-test:KEY, unless it is there already.
# Prints the image's name (memwatch-test:KEY) on its last line of stdout. With --rootfs it imports
# nothing and prints the cached root's tar instead (scripts/build-image.sh builds on it).
#
# The root filesystem is cached as a tar under MEMWATCH_CONTAINER_CACHE (default
# /var/cache/memwatch-containers), in a directory keyed by a hash of this script, so it is built once
# per machine and again only when this script changes; KEY is that hash. Needs root (debootstrap) and
# installs debootstrap when it is missing. MEMWATCH_CONTAINER_MIRROR overrides the mirror.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "container-image: $*" >&2; }
[ "$(id -u)" = 0 ] || { log "run as root (debootstrap)"; exit 1; }

cache=${MEMWATCH_CONTAINER_CACHE:-/var/cache/memwatch-containers}
key=$(sha256sum scripts/container-image.sh | cut -c1-16)
image=memwatch-test:$key
dir=$cache/rootfs-$key
mkdir -p "$cache"
# One build at a time; a second caller waits for it and then uses it.
exec 9>"$cache/lock"
flock 9

rootfs_only=''
if [ "${1:-}" = --rootfs ]; then
  rootfs_only=yes
  shift
fi
engines=("$@")
if [ -n "$rootfs_only" ]; then
  engines=()
elif [ ${#engines[@]} = 0 ]; then
  for e in docker podman; do
    command -v "$e" >/dev/null 2>&1 && "$e" info >/dev/null 2>&1 && engines+=("$e")
  done
fi
for e in "${engines[@]}"; do
  case $e in
  docker | podman) ;;
  *) log "unknown engine $e (docker or podman)"; exit 1 ;;
  esac
  command -v "$e" >/dev/null 2>&1 || { log "no $e here"; exit 1; }
done

if [ ! -f "$dir/done" ]; then
  command -v debootstrap >/dev/null 2>&1 || {
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
  }
  # The mirror this machine's apt uses (scripts/debian-mirror.sh).
  suite=bookworm
  mirror=${MEMWATCH_CONTAINER_MIRROR:-$(./scripts/debian-mirror.sh || true)}
  [ -n "$mirror" ] || { log "no bookworm mirror in /etc/apt; set MEMWATCH_CONTAINER_MIRROR"; exit 1; }

  # Older builds go: they are keyed by older versions of this script.
  for old in "$cache"/rootfs-*; do
    [ "$old" = "$dir" ] || rm -rf "$old"
  done
  work=$dir.tmp
  rm -rf "$work"
  mkdir -p "$work"
  root=$work/root
  start=$(date +%s)
  log "debootstrap $suite from $mirror into $root"
  debootstrap --variant=minbase --include=python3,procps "$suite" "$root" "$mirror" \
    >"$work/debootstrap.log" 2>&1 || {
    tail -n 30 "$work/debootstrap.log" >&2
    exit 1
  }
  rm -rf "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/locale/* \
    "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*_Packages
  tar -C "$root" --numeric-owner -cf "$work/rootfs.tar" .
  rm -rf "$root"
  log "built in $(($(date +%s) - start)) s ($(du -m "$work/rootfs.tar" | cut -f1) MiB)"
  touch "$work/done"
  mv "$work" "$dir"
fi
if [ -n "$rootfs_only" ]; then
  echo "$dir/rootfs.tar"
  exit 0
fi

for e in "${engines[@]}"; do
  if ! "$e" image inspect "$image" >/dev/null 2>&1; then
    start=$(date +%s)
    "$e" import --change 'CMD ["/bin/bash"]' "$dir/rootfs.tar" "$image" >/dev/null
    log "imported $image into $e in $(($(date +%s) - start)) s"
  fi
  # Older images of this script go.
  "$e" images --format '{{.Repository}}:{{.Tag}}' 2>/dev/null | grep '^\(localhost/\)\?memwatch-test:' |
    grep -v ":$key\$" | xargs -r "$e" rmi >/dev/null 2>&1 || true
done
echo "$image"
