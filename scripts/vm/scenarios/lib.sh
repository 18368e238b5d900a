# Helpers for the scenarios, sourced by each (POSIX sh: the guest's /bin/sh is dash). A scenario reports
# with `result SCENARIO ok|fail DETAIL`: one `VMRESULT` line per check, with the numbers it measured.

IN=/mnt/in
OUT=/mnt/out
CG=/sys/fs/cgroup/system.slice

result() {
  s=$1 verdict=$2
  shift 2
  echo "VMRESULT $s $verdict $*"
  [ "$verdict" = ok ] || FAILED=1
}

# Milliseconds since boot (CLOCK_BOOTTIME is what the journal's monotonic stamps use too).
now_ms() { awk '{ printf "%d\n", $1 * 1000 }' /proc/uptime; }

# wait_until SECONDS COMMAND…: polls every 0.1 s; 0 once COMMAND succeeds, 1 when time runs out.
wait_until() {
  deadline=$(($(now_ms) + $1 * 1000))
  shift
  while ! "$@" >/dev/null 2>&1; do
    [ "$(now_ms)" -lt "$deadline" ] || return 1
    sleep 0.1
  done
}

is_active() { [ "$(systemctl is-active "$1")" = active ]; }
main_pid() { systemctl show -p MainPID --value "$1"; }
# A key's value in a flat-keyed cgroup file (cgroup.events, memory.events).
cg_key() { awk -v k="$2" '$1 == k { print $2 }' "$1" 2>/dev/null; }
frozen() { [ "$(cg_key "$CG/$1/cgroup.events" frozen)" = 1 ]; }
oom_kills() { cg_key "$CG/$1/memory.events" oom_kill; }
# When the kernel's OOM killer killed PID, in ms since boot (from its log: a unit's cgroup, and so its
# memory.events, is gone as soon as its last process is); nothing if it did not.
oom_killed_at() {
  dmesg | sed -n "s/^\[ *\([0-9.]*\)\].*Killed process $1 .*/\1/p" | awk '{ printf "%d\n", $1 * 1000; exit }'
}
mib() { echo $(($(cat "$CG/$1/memory.current" 2>/dev/null || echo 0) / 1048576)); }

# The package, installed and started (offline: the guest has no network).
ensure_memwatch() {
  if ! dpkg -s memwatch >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y "$IN"/memwatch_*.deb >/dev/null 2>&1 ||
      dpkg -i "$IN"/memwatch_*.deb >/dev/null 2>&1
  fi
  is_active memwatch || systemctl start memwatch
  wait_until 60 curl -sf 127.0.0.1:9300/metrics
}

# start_hog TOTAL_MIB: a transient unit with a 400 MiB limit and no swap, running memhog, which waits
# for /run/hog-go and then touches TOTAL_MIB at 64 MiB/s and holds it; attached to memwatch as "hog".
# Sets HOG_PID.
start_hog() {
  rm -f /run/hog-go
  systemctl stop hogjob >/dev/null 2>&1
  systemctl reset-failed hogjob >/dev/null 2>&1
  systemd-run --quiet --unit=hogjob -p MemoryMax=400M -p MemorySwapMax=0 \
    "$IN/memhog" --rate-mib 64 --total-mib "$1" --hold-ms 600000 --wait-file /run/hog-go
  wait_until 10 sh -c '[ "$(systemctl show -p MainPID --value hogjob)" -gt 0 ]'
  HOG_PID=$(main_pid hogjob)
  memwatch attach "$HOG_PID" --name hog >/dev/null
}

# The attached job's field from the daemon's API (jq path on .jobs[] of the job named hog).
hog_field() { curl -sf 127.0.0.1:9300/api/v1/jobs | jq -r ".jobs[] | select(.name == \"hog\") | $1"; }

stop_hog() {
  memwatch detach hog >/dev/null 2>&1
  [ -f "$CG/hogjob.service/cgroup.freeze" ] && echo 0 >"$CG/hogjob.service/cgroup.freeze"
  systemctl stop hogjob >/dev/null 2>&1
  systemctl reset-failed hogjob >/dev/null 2>&1
  rm -f /run/hog-go
}

# frozen_hog SCENARIO TOTAL_MIB: memwatch serving, a hog set to grow to TOTAL_MIB of its 400 started
# and frozen by memwatch, its pause held; on failure reports the setup's failure and exits.
frozen_hog() {
  ensure_memwatch || { result "$1" fail "setup: memwatch not serving ($(systemctl is-active memwatch))"; exit 1; }
  start_hog "$2"
  touch /run/hog-go
  if ! wait_until 60 frozen hogjob.service; then
    result "$1" fail "setup: the job was never frozen ($(mib hogjob.service) MiB, oom_kill $(oom_kills hogjob.service))"
    stop_hog
    exit 1
  fi
  wait_until 10 sh -c '[ "$(curl -sf 127.0.0.1:9300/api/v1/jobs | jq -r ".jobs[] | select(.name == \"hog\") | .pause.phase")" = held ]'
}
