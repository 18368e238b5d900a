#!/usr/bin/env bash
# Runs every memwatch test: formatting, clippy, unit tests and the end-to-end tests that start the real
# binary on fixture roots with the fake NVML. Installs what the tests need (promtool, from Debian's
# `prometheus` package) when it is missing and this runs as root.
set -euo pipefail
cd "$(dirname "$0")/.."

have() { command -v "$1" >/dev/null 2>&1; }

install_debian() {
  if [ "$(id -u)" != 0 ] || ! have apt-get; then
    echo "scripts/test.sh: missing $*; install them (Debian: apt-get install $*) and run again" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

missing=()
have promtool || missing+=(prometheus)
[ ${#missing[@]} -eq 0 ] || install_debian "${missing[@]}"

cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked
