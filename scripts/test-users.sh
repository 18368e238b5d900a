#!/usr/bin/env bash
# Makes the local users the tests act as (tests/common/mod.rs, TEST_USERS), each with a group of its
# own, once, before any test runs: tests running in parallel then only read them. Needs root.
# `scripts/test-users.sh --remove` deletes them, their groups and their home directories.
set -euo pipefail

users=(memwatch-test memwatch-attack memwatch-flood memwatch-slow)

if [ "${1:-}" = --remove ]; then
  for u in "${users[@]}"; do
    if id -u "$u" >/dev/null 2>&1; then
      pkill -KILL -u "$u" 2>/dev/null || true
      userdel --remove "$u" 2>/dev/null || userdel "$u"
    fi
    if getent group "$u" >/dev/null; then groupdel "$u"; fi
    rm -rf "/home/$u"
  done
  exit 0
fi

if [ "$(id -u)" != 0 ]; then
  echo "scripts/test-users.sh: needs root to make the test users ${users[*]}" >&2
  exit 1
fi
for u in "${users[@]}"; do
  if ! id -u "$u" >/dev/null 2>&1; then
    useradd --no-create-home --user-group --shell /usr/sbin/nologin "$u"
  fi
  # Each user's primary group is its own, which spawn_as gives its processes.
  [ "$(id -gn "$u")" = "$u" ] || { echo "scripts/test-users.sh: $u's primary group is $(id -gn "$u"), not $u" >&2; exit 1; }
done
