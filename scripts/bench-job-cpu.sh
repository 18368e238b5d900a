#!/usr/bin/env bash
# The daemon's CPU share with one attached, calm job of 8 processes (memhog and 7 workers), for several
# GPU set-ups alternated round by round in one run (reported in BENCHMARKS.md; not a timed test).
#
# usage: [ROUNDS=8] [SECONDS_EACH=30] scripts/bench-job-cpu.sh VARIANT...
#   VARIANT: the path of an NVML library (the fake's, a real libnvidia-ml) or `off` (GPU sampling off).
# Each line: the variant, the share from utime+stime (CLK_TCK ticks, every thread the daemon ever had)
# and from its live threads' schedstat (nanoseconds; a thread that ended inside the window is missed).
# Then the median, min and max of each. Root is not needed; nothing else should run.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-8}
SECONDS_EACH=${SECONDS_EACH:-30}
[ $# -gt 0 ] || { sed -n 5,6p "$0" >&2; exit 2; }
for v in "$@"; do
  [ "$v" = off ] || [ -f "$v" ] || { echo "bench-job-cpu: no library at $v" >&2; exit 2; }
done
cargo build --release --quiet
cargo build --release --quiet -p memwatch-fake-nvml -p memwatch-memhog
results=$(mktemp)
trap 'rm -f "$results"' EXIT

# CPU time of process $1: utime+stime in ticks (every thread it ever had), and its live threads' run
# time in nanoseconds.
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
nanos() { cat /proc/"$1"/task/*/schedstat | awk '{s += $1} END {print s}'; }

one() {
  local variant=$1 work mw hog enabled=true library=$1
  [ "$variant" = off ] && { enabled=false; library=/nonexistent; }
  work=$(mktemp -d)
  cat >"$work/memwatch.toml" <<TOML
listen = "127.0.0.1:0"
[gpu]
enabled = $enabled
library = "$(realpath -m "$library")"
[control]
socket = "$work/run/control.sock"
state_dir = "$work/state"
TOML
  MEMWATCH_FAKE_NVML_STATE=$PWD/tests/fixtures/nvml/two-gpus.json \
    ./target/release/memwatch --config "$work/memwatch.toml" --log-level error run &
  mw=$!
  for _ in $(seq 100); do [ -S "$work/run/control.sock" ] && break; sleep 0.1; done
  ./target/release/memhog --workers 7 --total-mib 64 --hold-ms 3600000 >/dev/null &
  hog=$!
  sleep 1
  ./target/release/memwatch attach $hog --name bench --socket "$work/run/control.sock" >/dev/null
  sleep 3
  local c0 c1 n0 n1 t0 t1
  c0=$(ticks $mw); n0=$(nanos $mw); t0=$(date +%s.%N)
  sleep "$SECONDS_EACH"
  c1=$(ticks $mw); n1=$(nanos $mw); t1=$(date +%s.%N)
  pkill -P $hog 2>/dev/null || true
  kill $hog $mw 2>/dev/null || true
  wait $hog $mw 2>/dev/null || true
  rm -rf "$work"
  awk -v v="$variant" -v c="$((c1 - c0))" -v n="$((n1 - n0))" -v t0="$t0" -v t1="$t1" -v hz="$(getconf CLK_TCK)" \
    'BEGIN { printf "%s\tticks %.3f %%\tschedstat %.3f %%\n", v, c / hz / (t1 - t0) * 100, n / 1e9 / (t1 - t0) * 100 }' |
    tee -a "$results"
}

for _ in $(seq "$ROUNDS"); do
  for v in "$@"; do one "$v"; done
done
echo "--- median (min–max) of $ROUNDS rounds of ${SECONDS_EACH} s, schedstat:"
for v in "$@"; do
  awk -F'\t' -v v="$v" '$1 == v { split($3, a, " "); print a[2] }' "$results" | sort -n |
    awk -v v="$v" '{ x[NR] = $1 } END { m = NR % 2 ? x[(NR + 1) / 2] : (x[NR / 2] + x[NR / 2 + 1]) / 2;
      printf "%s: %.3f %% (%.3f–%.3f)\n", v, m, x[1], x[NR] }'
done
