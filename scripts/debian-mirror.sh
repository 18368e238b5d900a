#!/usr/bin/env bash
# Prints the Debian mirror this machine's apt uses (deb822 .sources or one-line .list files): the one
# that carries bookworm, which carries trixie too. Exits 1, printing nothing, when there is none.
# Used by scripts/vm/image.sh and scripts/container-image.sh to debootstrap from it.
set -euo pipefail
mirror=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '
  /^URIs:/ { uri = $2 } /^Suites:/ { for (i = 2; i <= NF; i++) if ($i == "bookworm") { print uri; exit } }')
if [ -z "$mirror" ]; then
  mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
    awk '$1 == "deb" && $3 == "bookworm" { print $2; exit }')
fi
[ -n "$mirror" ] || exit 1
echo "$mirror"
