#!/usr/bin/env bash
# What a watchdog costs when nothing happens: memwatch idle (no job, GPU off), memwatch with one calm
# job of 8 processes attached (memhog holding 64 MiB with 7 sleeping workers) and with one of LARGE
# (1 024) processes, and earlyoom with its defaults, alternated window by window so that drift in the
# machine's load falls on each alike. Per window: CPU in ns (the process alone in a cpuacct cgroup
# where v1's cpuacct is mounted, else its live threads' schedstat), wakeups (voluntary and involuntary
# context switches of its live threads), and VmRSS at the end; target/bench-idle/calm.log says when
# each daemon left or entered calm, and why, and when the host's pressure trigger woke it while calm.
# One more row, memwatch-scraped: the 8-process job again, with /metrics fetched every SCRAPE s
# (curl, as a Prometheus scrape would; the scraper's own CPU is not counted).
# Each calm job runs in a memory cgroup of its own (limit 32 GiB: the 1 024 processes hold 8 GiB, away
# from the half-limit line), as a systemd unit or `memwatch launch` gives one, where the machine has a
# memory controller (v1 or v2), and a row starts only once the row before's job has left it (its
# workers, init's once memhog is gone, exit on their own time); JOB_CGROUP=0 leaves it in the
# script's. BASE=/path/to/another/memwatch
# adds the idle and calm rows again for that build ("base-…"), in the same windows' alternation, for
# a before and after side by side. IDLE_ONLY=1 runs only the idle rows and earlyoom.
# Root; a release build of memwatch; earlyoom on PATH (Debian's `earlyoom` package; this script
# installs nothing).
#
#   ./scripts/bench-idle.sh                 WINDOWS=2 SECS=60 SCRAPE=15 (each watcher gets WINDOWS windows)
#   BASE=/tmp/memwatch-base ./scripts/bench-idle.sh
set -euo pipefail
cd "$(dirname "$0")/.."
WINDOWS=${WINDOWS:-2} SECS=${SECS:-60} SETTLE=${SETTLE:-5} LARGE=${LARGE:-1024} SCRAPE=${SCRAPE:-15}
JOB_CGROUP=${JOB_CGROUP:-1} BASE=${BASE:-} IDLE_ONLY=${IDLE_ONLY:-0}
command -v earlyoom >/dev/null || { echo "earlyoom is not on PATH (apt-get install earlyoom)" >&2; exit 2; }
cargo build --release --locked -p memwatch -p memwatch-memhog >/dev/null
mw=target/release/memwatch hog=target/release/memhog
out=target/bench-idle
mkdir -p "$out"
: >"$out/idle.log"
: >"$out/calm.log"

# CPU: the watcher alone in a cpuacct cgroup of its own where there is one (it counts threads that
# end inside the window too: tokio's blocking threads come and go), else its live threads' schedstat.
acct=/sys/fs/cgroup/cpuacct/memwatch-bench-idle
[ -d /sys/fs/cgroup/cpuacct ] && mkdir -p "$acct" || acct=
# The calm job's own memory cgroup (v1 where the memory controller is on v1, else v2).
jobcg= limit_file=
if [ "$JOB_CGROUP" = 1 ]; then
  if [ -f /sys/fs/cgroup/memory/memory.limit_in_bytes ]; then
    jobcg=/sys/fs/cgroup/memory/memwatch-bench-idle-job limit_file=memory.limit_in_bytes
  elif grep -qw memory /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
    jobcg=/sys/fs/cgroup/memwatch-bench-idle-job limit_file=memory.max
  fi
fi
if [ -n "$jobcg" ]; then
  mkdir -p "$jobcg"
  echo $((32 << 30)) >"$jobcg/$limit_file"
fi
trap '[ -z "$acct" ] || rmdir "$acct" 2>/dev/null || true; [ -z "$jobcg" ] || rmdir "$jobcg" 2>/dev/null || true' EXIT
sched() {
  if [ -n "$acct" ]; then cat "$acct/cpuacct.usage"; return; fi
  cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{s+=$1} END {printf "%d\n", s}'
}
ctx() { cat /proc/"$1"/task/*/status 2>/dev/null | awk '/^(voluntary|nonvoluntary)_ctxt_switches/ {s+=$2} END {print s}'; }

# settle_job PROCS: waits until a job of PROCS processes just started holds still (its workers touch
# their memory for a while after they are started): its cgroup's usage moving less than 16 MiB over
# 2 s (at most 2 minutes); without a cgroup of its own, a second per 256 processes.
settle_job() {
  if [ -z "$jobcg" ]; then sleep $((1 + $1 / 256)); return; fi
  local f=memory.usage_in_bytes prev=0 now
  [ "$limit_file" = memory.max ] && f=memory.current
  for _ in $(seq 1 60); do
    sleep 2
    now=$(cat "$jobcg/$f")
    if [ "$prev" != 0 ] && [ $((now > prev ? now - prev : prev - now)) -lt $((16 << 20)) ]; then return; fi
    prev=$now
  done
}

# empty_job_cgroup: waits until the job's cgroup holds no process (at most 2 minutes).
empty_job_cgroup() {
  [ -n "$jobcg" ] || return 0
  for _ in $(seq 1 1200); do
    [ -n "$(cat "$jobcg/cgroup.procs")" ] || return 0  # (cgroupfs files have no size)
    sleep 0.1
  done
  echo "the job's cgroup $jobcg still holds processes after 2 minutes" >&2
  exit 1
}

# measure NAME PID: one window of PID, a line to idle.log.
measure() {
  [ -z "$acct" ] || echo "$2" >"$acct/cgroup.procs"
  sleep "$SETTLE"
  local s0 x0 t0 s1 x1 t1 rss
  s0=$(sched "$2") x0=$(ctx "$2") t0=$(date +%s.%N)
  sleep "$SECS"
  s1=$(sched "$2") x1=$(ctx "$2") t1=$(date +%s.%N)
  rss=$(awk '/VmRSS/ {print $2}' "/proc/$2/status")
  awk -v n="$1" -v s=$((s1 - s0)) -v x=$((x1 - x0)) -v t0="$t0" -v t1="$t1" -v r="$rss" -v l="$(cut -d' ' -f1 /proc/loadavg)" \
    'BEGIN {d = t1 - t0; printf "%s %.5f %.2f %d %s\n", n, s / 1e9 / d * 100, x / d, r, l}' >>"$out/idle.log"
}

# start_memwatch [BINARY]: a daemon on a fresh state directory, the release build unless given.
start_memwatch() {
  bin=${1:-$mw}
  work=$(mktemp -d "${TMPDIR:-/tmp}/memwatch-bench-idle-XXXXXX")
  printf 'listen = "127.0.0.1:0"\n[gpu]\nenabled = false\n[control]\nsocket = "%s/run/control.sock"\nstate_dir = "%s/state"\n' \
    "$work" "$work" >"$work/memwatch.toml"
  "$bin" --config "$work/memwatch.toml" --log-level debug run >"$work/log" 2>&1 &
  pid=$!
  for _ in $(seq 1 100); do [ -S "$work/run/control.sock" ] && break; sleep 0.05; done
}
stop_memwatch() {
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  # Why the daemon left or entered calm, per window (transitions only: debug logs nothing else idle),
  # and each PSI trigger on the host it answered with a full sample while calm.
  grep -E "full-sample interval|pressure trigger fired while calm" "$work/log" | sed "s/^/${1:-memwatch} /" >>"$out/calm.log" || true
  rm -rf "$work"
}

for w in $(seq 1 "$WINDOWS"); do
  # idle memwatch (and BASE's)
  start_memwatch
  measure memwatch-idle "$pid"
  stop_memwatch memwatch-idle
  if [ -n "$BASE" ]; then
    start_memwatch "$BASE"
    measure base-idle "$pid"
    stop_memwatch base-idle
  fi
  # earlyoom, defaults (it reports every hour by default; -r 0 would only silence that)
  earlyoom >/dev/null 2>&1 &
  eo=$!
  measure earlyoom "$eo"
  kill "$eo"
  wait "$eo" 2>/dev/null || true
  # memwatch with one calm job of 8 processes, then of LARGE, then of 8 scraped; and BASE's the same
  [ "$IDLE_ONLY" = 1 ] && continue
  for n in 8 "$LARGE" scraped ${BASE:+base-8 "base-$LARGE" base-scraped}; do
    procs=${n#base-} row=memwatch-calm-$n bin=$mw scraper=
    case $n in base-*) bin=$BASE row=base-calm-${n#base-} ;; esac
    [ "$procs" = scraped ] && procs=8 row=${row%calm-scraped}scraped
    start_memwatch "$bin"
    # The hog moves itself into the job's cgroup, then becomes memhog: its workers are born there.
    sh -c "${jobcg:+echo \$\$ >$jobcg/cgroup.procs && }exec $hog --rate-mib 256 --total-mib 64 --workers $((procs - 1)) --hold-ms $(((SETTLE + SECS + 150) * 1000))" >/dev/null &
    job=$!
    settle_job "$procs"
    "$bin" --config "$work/memwatch.toml" attach "$job" --name calm >/dev/null
    if [ "${n#base-}" = scraped ]; then
      addr=$(sed -n 's/.*listening addr=\([0-9.:]*\).*/\1/p' "$work/log" | head -n 1)
      [ -n "$addr" ] || { echo "no listening address in the daemon's log" >&2; exit 1; }
      (while :; do curl -sf "http://$addr/metrics" >/dev/null; sleep "$SCRAPE"; done) &
      scraper=$!
    fi
    measure "$row" "$pid"
    [ -z "$scraper" ] || { kill "$scraper"; wait "$scraper" 2>/dev/null || true; }
    # The workers first: once memhog is gone they are init's, and -P finds none.
    pkill -P "$job" 2>/dev/null || true
    kill "$job" 2>/dev/null || true
    wait "$job" 2>/dev/null || true
    # Its workers' exits, not waited for above (they are init's once memhog is gone), must not fall
    # in the next row's window: that row's job shares the cgroup, and its daemon would see them go.
    empty_job_cgroup
    stop_memwatch "$row"
  done
done

how=schedstat
[ -z "$acct" ] || how=cpuacct
echo "| watcher | windows | CPU of a core, median ($how) | wakeups/s, median | VmRSS, median | 1-min load |"
echo "|---|---|---|---|---|---|"
for n in memwatch-idle ${BASE:+base-idle} memwatch-calm-8 "memwatch-calm-$LARGE" memwatch-scraped \
  ${BASE:+base-calm-8 "base-calm-$LARGE" base-scraped} earlyoom; do
  awk -v n="$n" 'BEGIN {k = 0} $1 == n {c[k] = $2; x[k] = $3; r[k] = $4; l = l (l ? ", " : "") $5; k++}
    function med(a, m,   i, j, t) { for (i = 0; i < m; i++) for (j = i + 1; j < m; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
      return (m % 2) ? a[int(m / 2)] : (a[m / 2 - 1] + a[m / 2]) / 2 }
    END { if (k) printf "| %s | %d | %.4f %% | %.2f | %.1f MiB | %s |\n", n, k, med(c, k), med(x, k), med(r, k) / 1024, l }' "$out/idle.log"
done
