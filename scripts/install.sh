#!/usr/bin/env bash
# Installs memwatch as a systemd service: the binary in /usr/local/bin, the config in /etc/memwatch (the
# documented defaults, unless one is there already), the unit in /etc/systemd/system. Run as root.
# Then: systemctl start memwatch (this script enables and starts it when systemd is running).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "scripts/install.sh: run as root" >&2; exit 1; }
cargo build --release --locked
install -m 0755 target/release/memwatch /usr/local/bin/memwatch
install -d -m 0755 /etc/memwatch
[ -e /etc/memwatch/memwatch.toml ] || install -m 0644 memwatch.example.toml /etc/memwatch/memwatch.toml
/usr/local/bin/memwatch --config /etc/memwatch/memwatch.toml config check >/dev/null
install -m 0644 systemd/memwatch.service /etc/systemd/system/memwatch.service
if [ -d /run/systemd/system ]; then
  systemctl daemon-reload
  systemctl enable --now memwatch
  systemctl --no-pager status memwatch | head -n 5
else
  echo "installed; systemd is not running here, so start it with: /usr/local/bin/memwatch run"
fi
