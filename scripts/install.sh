#!/usr/bin/env bash
# Installs memwatch as a systemd service and starts it. Run as root.
#
#   sudo ./scripts/install.sh memwatch_0.1.0_amd64.deb   # a package (no Rust toolchain needed): apt-get
#                                                        # installs it, and its postinst starts it
#   sudo ./scripts/install.sh                            # from source where cargo is on PATH, else a
#                                                        # package in target/debian/ or the checkout: the binary in
#                                                        # /usr/local/bin, the man page, the config in /etc/memwatch
#                                                        # (the documented defaults, unless one is
#                                                        # there already), the unit in /etc/systemd/system
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "scripts/install.sh: run as root" >&2; exit 1; }
deb=${1:-}
if [ -z "$deb" ] && ! command -v cargo >/dev/null 2>&1; then
  deb=$(ls -t target/debian/memwatch_*.deb memwatch_*.deb 2>/dev/null | head -n 1 || true)
  [ -n "$deb" ] || { echo "scripts/install.sh: no cargo on PATH and no memwatch_*.deb here (in target/debian/ or the checkout); under sudo, keep your toolchain: sudo env \"PATH=\$PATH\" RUSTUP_HOME=\"\${RUSTUP_HOME:-\$HOME/.rustup}\" ./scripts/install.sh; or build a package with ./scripts/build-deb.sh on a machine with cargo" >&2; exit 1; }
fi
if [ -n "$deb" ]; then
  apt-get install -y "$(realpath "$deb")"
  memwatch --config /etc/memwatch/memwatch.toml config check >/dev/null
  [ -d /run/systemd/system ] || echo "installed; systemd is not running here, so start it with: memwatch run"
  exit 0
fi
cargo build --release --locked
install -m 0755 target/release/memwatch /usr/local/bin/memwatch
install -d -m 0755 /etc/memwatch
[ -e /etc/memwatch/memwatch.toml ] || install -m 0644 memwatch.example.toml /etc/memwatch/memwatch.toml
/usr/local/bin/memwatch --config /etc/memwatch/memwatch.toml config check >/dev/null
install -m 0644 systemd/memwatch.service /etc/systemd/system/memwatch.service
# The man page the unit's Documentation= names (the package ships it too).
install -d -m 0755 /usr/local/share/man/man1
/usr/local/bin/memwatch manpage | gzip -9n >/usr/local/share/man/man1/memwatch.1.gz
if [ -d /run/systemd/system ]; then
  systemctl daemon-reload
  systemctl enable --now memwatch
  systemctl --no-pager status memwatch | head -n 5
else
  echo "installed; systemd is not running here, so start it with: /usr/local/bin/memwatch run"
fi
