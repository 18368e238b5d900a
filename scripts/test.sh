#!/usr/bin/env bash
# Runs every memwatch test: formatting, clippy, unit tests and the end-to-end tests that start the real
# binary on fixture roots with the fake NVML. Runs as root (the tests make cgroups and users) with a Rust
# toolchain on PATH, and installs what else the tests need when it is missing: a C/C++ compiler, python3
# and its venv, promtool and prometheus, systemd-analyze, chromium, node/npm, tmux, fuse3 and python3-fusepy,
# slurmctld, slurmd, slurm-client and munge, debootstrap and qemu-system-x86 for the VM tests, docker.io
# and podman for the container tests (Debian),
# playwright-core (npm), kubernetes-validate (PyPI, for the manifest),
# and torch 2.13.0 for the trainer plus the Python package's pinned test dependencies (PyPI).
set -euo pipefail
cd "$(dirname "$0")/.."

have() { command -v "$1" >/dev/null 2>&1; }

# What this script cannot install: a Rust toolchain (rustup's), and root.
if ! have cargo || ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
  echo "scripts/test.sh: no cargo with rustfmt and clippy on PATH: install Rust $(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml) or newer with both (rustup), and under sudo keep your PATH and toolchain: sudo env \"PATH=\$PATH\" RUSTUP_HOME=\"\${RUSTUP_HOME:-\$HOME/.rustup}\" ./scripts/test.sh" >&2
  exit 1
fi
if [ "$(id -u)" != 0 ]; then
  echo "scripts/test.sh: run as root: the tests make memory cgroups, act as test users, run Slurm and boot a VM (as any user, cargo test -p memwatch-core runs the core's tests)" >&2
  exit 1
fi

# Room on disk, asked first so that a full disk is named here and not, half an hour in, as a failed test:
# a clean run grows target/ to about 7 GiB and the venv (torch) to about 5 GiB, and the emergency
# swapfile test (tests/way_out.rs) makes 1 GiB of swap in /var/tmp, which the daemon refuses unless
# another 1 GiB stays free. What target/ and the venv already hold counts towards it.
free_gib() { df -P -B1G "$1" 2>/dev/null | awk 'NR == 2 { print $4 }'; }
used_gib() { { du -s -B1G "$@" 2>/dev/null || true; } | awk '{ n += $1 } END { print n + 0 }'; }
if [ -n "${MEMWATCH_SKIP_TRAINER:-}" ]; then build_gib=7; else build_gib=12; fi
build_gib=$((build_gib - $(used_gib target "${MEMWATCH_VENV:-.venv}")))
[ "$build_gib" -gt 0 ] || build_gib=0
swap_gib=2
here=$(df -P . | awk 'NR == 2 { print $1 }')
there=$(df -P /var/tmp 2>/dev/null | awk 'NR == 2 { print $1 }')
if [ "$here" = "$there" ]; then
  need=$((build_gib + swap_gib)) free=$(free_gib .)
  [ "${free:-0}" -ge "$need" ] || {
    echo "scripts/test.sh: $PWD and /var/tmp have ${free:-0} GiB free on one disk; the tests need $need GiB (builds $build_gib, emergency swapfile $swap_gib): free some and run again" >&2
    exit 1
  }
else
  free=$(free_gib .)
  [ "${free:-0}" -ge "$build_gib" ] || {
    echo "scripts/test.sh: $PWD has ${free:-0} GiB free; the builds need $build_gib GiB: free some and run again" >&2
    exit 1
  }
  free=$(free_gib /var/tmp)
  [ "${free:-0}" -ge "$swap_gib" ] || {
    echo "scripts/test.sh: /var/tmp has ${free:-0} GiB free; the emergency swapfile test needs $swap_gib GiB: free some and run again" >&2
    exit 1
  }
fi

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
have systemd-analyze || missing+=(systemd)
have chromium || missing+=(chromium)
have node || missing+=(nodejs)
have npm || missing+=(npm)
# `memwatch status` and `memwatch top` are tested in a real terminal.
have tmux || missing+=(tmux)
# The Debian package is built (dpkg-deb, objdump for its libc6 dependency) and installed into a fresh root.
have dpkg-deb || missing+=(dpkg)
have objdump || missing+=(binutils)
# The stall test mounts a real slow filesystem (FUSE, tests/stall/slowfs.py).
have fusermount3 || missing+=(fuse3)
[ -f /usr/lib/python3/dist-packages/fusepy.py ] || missing+=(python3-fusepy)
ldconfig -p 2>/dev/null | grep -q 'libfuse\.so\.2' || missing+=(libfuse2)
# A real single-node Slurm cluster (tests/slurm.rs): slurmctld, slurmd, the clients and munge.
have slurmctld || missing+=(slurmctld)
have slurmd || missing+=(slurmd)
have sbatch || missing+=(slurm-client)
have munged || missing+=(munge)
# The two-node cluster (tests/slurm_nodes.rs): a network, UTS and mount namespace per node (unshare,
# nsenter), joined by veths and a bridge (ip).
have ip || missing+=(iproute2)
have nsenter || missing+=(util-linux)
# The VM tests (tests/vm.rs, scripts/vm/): debootstrap builds a Debian 13 guest, qemu boots it.
have debootstrap || [ -x /usr/sbin/debootstrap ] || missing+=(debootstrap)
# Jobs in real containers (tests/containers.rs): Debian's docker.io (dockerd, containerd, runc) and
# podman; their image is built from a Debian root (scripts/container-image.sh), never pulled.
have dockerd || missing+=(docker.io)
have podman || missing+=(podman)
# What builds and tests need beside cargo: a C and C++ compiler (the linker, torch-sys), python3 with
# venv (the trainer's torch, kubernetes-validate, the Python package).
have cc || missing+=(gcc)
have c++ || missing+=(g++)
have python3 || missing+=(python3)
python3 -c 'import ensurepip' 2>/dev/null || missing+=(python3-venv)
[ ${#missing[@]} -eq 0 ] || install_debian "${missing[@]}"
# This machine's (Debian 12) qemu-system-x86 needs qemu-utils of its own version: a newer one (backports) is downgraded
# to it. Only as root: tests/vm.rs needs root.
if ! have qemu-system-x86_64 && [ "$(id -u)" = 0 ] && have apt-get; then
  apt-get update -qq
  qemu=$(apt-cache policy qemu-system-x86 | awk '/Candidate:/ { print $2 }')
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends --allow-downgrades \
    "qemu-system-x86=$qemu" "qemu-utils=$qemu" >/dev/null
fi
# The Docker engine, started where it is not running (without systemd: by hand, with no bridge or
# iptables rules, as the tests' containers have no network).
if ! docker info >/dev/null 2>&1; then
  if [ -d /run/systemd/system ]; then
    systemctl start docker
  else
    setsid dockerd --iptables=false --ip6tables=false --bridge=none >/var/log/memwatch-dockerd.log 2>&1 </dev/null &
  fi
  for _ in $(seq 150); do docker info >/dev/null 2>&1 && break; sleep 0.2; done
  docker info >/dev/null 2>&1 || { echo "scripts/test.sh: dockerd did not start: $(tail -n 3 /var/log/memwatch-dockerd.log 2>/dev/null)" >&2; exit 1; }
fi
# playwright-core drives Debian's chromium (no browser download); the lock file pins it.
[ -d tests/browser/node_modules/playwright-core ] || (cd tests/browser && npm ci --no-audit --no-fund --silent)

# tests/deploy.rs validates the Kubernetes manifest against Kubernetes' own schemas with PyPI's
# kubernetes-validate (pinned in deploy/kubernetes/requirements-validate.txt), in a venv of its own.
validate_venv=$PWD/target/validate-venv
if ! "$validate_venv/bin/kubernetes-validate" --version >/dev/null 2>&1; then
  python3 -m venv "$validate_venv"
  "$validate_venv/bin/pip" install -q -r deploy/kubernetes/requirements-validate.txt
fi
export MEMWATCH_KUBERNETES_VALIDATE="$validate_venv/bin/kubernetes-validate"

# The embedded trainer (memwatch-train) needs libtorch, taken from PyPI's torch==2.13.0 in a venv
# (MEMWATCH_VENV, default .venv). MEMWATCH_SKIP_TRAINER=1 skips building and testing it.
features=()
if [ -z "${MEMWATCH_SKIP_TRAINER:-}" ]; then
  venv=${MEMWATCH_VENV:-$PWD/.venv}
  if ! "$venv/bin/python" -c 'import sys, torch; sys.exit(not torch.__version__.startswith("2.13.0"))' 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q torch==2.13.0
  fi
  torchlib=$("$venv/bin/python" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
  export PATH="$venv/bin:$PATH" LIBTORCH_USE_PYTORCH=1 LD_LIBRARY_PATH="$torchlib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  features=(--features memwatch/trainer)
fi

cargo fmt --all -- --check
cargo clippy --workspace --all-targets "${features[@]}" --locked -- -D warnings
# Every public item is documented (missing_docs in src/lib.rs) and the docs' links resolve.
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --lib --locked -p memwatch-core -p memwatch
# The users the tests act as, made once here so that tests running in parallel never race to make them.
[ "$(id -u)" != 0 ] || ./scripts/test-users.sh
cargo test --workspace "${features[@]}" --locked

# The Python package (python/): built as a wheel, installed into the same venv next to the framework
# versions its tests pin (python/requirements-test.txt), and tested against the daemon cargo built.
if [ -z "${MEMWATCH_SKIP_TRAINER:-}" ]; then
  "$venv/bin/pip" install -q -r python/requirements-test.txt
  cargo build --locked "${features[@]}" -p memwatch -p memwatch-fake-nvml
  rm -rf target/wheels
  "$venv/bin/pip" wheel -q --no-deps --no-build-isolation ./python -w target/wheels
  "$venv/bin/pip" install -q --force-reinstall --no-deps target/wheels/memwatch-*.whl
  (cd python && "$venv/bin/python" -m mypy src/memwatch && "$venv/bin/python" -m pytest -q -p no:cacheprovider)
fi
