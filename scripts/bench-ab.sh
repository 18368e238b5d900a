#!/usr/bin/env bash
# Two builds of memwatch side by side in one run: reaction (level-only pauses at 1 GiB/s, by SIGSTOP and
# by the freezer, `ONLY=level` of benches/reaction.rs) and the idle daemon's footprint (no job, GPU
# off), alternated ABBA so that drift in the machine's load falls on both alike. Root; release builds.
#
#   ./scripts/bench-ab.sh BEFORE_BINARY AFTER_BINARY
#   ROUNDS=40 RUNS=2 WINDOWS=8 SECS=60 ./scripts/bench-ab.sh …   (the defaults)
#
# Build a before binary with, e.g., `git worktree add /tmp/before REV && cargo build --release --locked`
# there. Per-run lines go to target/bench-ab/; the tables are printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# = 2 ] || { echo "usage: $0 BEFORE_BINARY AFTER_BINARY" >&2; exit 2; }
before=$(realpath "$1") after=$(realpath "$2")
ROUNDS=${ROUNDS:-40} RUNS=${RUNS:-2} WINDOWS=${WINDOWS:-8} SECS=${SECS:-60} SETTLE=${SETTLE:-5}
out=target/bench-ab
mkdir -p "$out"
bin() { if [ "$1" = before ]; then echo "$before"; else echo "$after"; fi; }
# ABBA: odd rounds before then after, even rounds after then before.
order() { if [ $(($1 % 2)) = 1 ]; then echo "before after"; else echo "after before"; fi; }

cargo build --release --locked -p memwatch-memhog >/dev/null
: >"$out/reaction.log"
for r in $(seq 1 "$ROUNDS"); do
  for which in $(order "$r"); do
    echo "=== round $r $which load $(cut -d' ' -f1-3 /proc/loadavg)" >>"$out/reaction.log"
    ONLY=level RATES=1024 RUNS=$RUNS MEMWATCH_BIN=$(bin "$which") \
      cargo bench --locked --bench reaction 2>&1 | grep -E '^run ' | sed "s/^/$which r$r /" >>"$out/reaction.log"
  done
done

cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }
ctx() { cat /proc/"$1"/task/*/status 2>/dev/null | awk '/^(voluntary|nonvoluntary)_ctxt_switches/ {s+=$2} END {print s}'; }
sched() { cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{s+=$1} END {printf "%d\n", s}'; }
ticks=$(getconf CLK_TCK)
: >"$out/idle.log"
for w in $(seq 1 "$WINDOWS"); do
  which=$(order $(((w + 1) / 2)) | cut -d' ' -f$((2 - w % 2)))
  work=$(mktemp -d "${TMPDIR:-/tmp}/memwatch-bench-ab-XXXXXX")
  printf 'listen = "127.0.0.1:0"\n[gpu]\nenabled = false\n[control]\nsocket = "%s/run/control.sock"\nstate_dir = "%s/state"\n' \
    "$work" "$work" >"$work/memwatch.toml"
  "$(bin "$which")" --config "$work/memwatch.toml" --log-level warn run >"$work/log" 2>&1 &
  mw=$!
  sleep "$SETTLE"
  c0=$(cpu $mw) s0=$(sched $mw) x0=$(ctx $mw) t0=$(date +%s.%N)
  sleep "$SECS"
  c1=$(cpu $mw) s1=$(sched $mw) x1=$(ctx $mw) t1=$(date +%s.%N)
  rss=$(awk '/VmRSS/ {print $2}' "/proc/$mw/status")
  kill "$mw"
  wait "$mw" 2>/dev/null || true
  awk -v b="$which" -v c=$((c1 - c0)) -v s=$((s1 - s0)) -v x=$((x1 - x0)) -v t0="$t0" -v t1="$t1" -v tk="$ticks" -v r="$rss" \
    'BEGIN {d = t1 - t0; printf "%s %.4f %.4f %.2f %d\n", b, c / tk / d * 100, s / 1e9 / d * 100, x / d, r}' >>"$out/idle.log"
  rm -rf "$work"
done

python3 - "$out/reaction.log" "$out/idle.log" <<'EOF'
import re, statistics as st, sys
def pct(v, p):
    v = sorted(v)
    return v[round((len(v) - 1) * p)] if v else float("nan")
rows = {}
for line in open(sys.argv[1]):
    m = re.match(r"(before|after) r\d+ run (sigstop|freezer) .*killed=(\w+) latency_ms=(\S+)", line)
    if m:
        rows.setdefault((m[2], m[1]), []).append((m[3] == "true", None if m[4] == "none" else float(m[4])))
print("| path | binary | n | survived | p50 ms | p90 ms | max ms |\n|---|---|---|---|---|---|---|")
for path in ("sigstop", "freezer"):
    for b in ("before", "after"):
        o = rows.get((path, b), [])
        lat = [x[1] for x in o if x[1] is not None]
        if lat:
            print(f"| {path} | {b} | {len(o)} | {sum(not x[0] for x in o)}/{len(o)} | {pct(lat, .5):.2f} | {pct(lat, .9):.2f} | {max(lat):.2f} |")
print("\n| binary | windows | CPU % of a core (ticks) | CPU % (schedstat) | wakeups/s | VmRSS MiB |\n|---|---|---|---|---|---|")
idle = [l.split() for l in open(sys.argv[2]) if l.strip()]
for b in ("before", "after"):
    r = [p for p in idle if p[0] == b]
    if r:
        med = lambda i: st.median(float(p[i]) for p in r)
        print(f"| {b} | {len(r)} | {med(1):.3f} | {med(2):.4f} | {med(3):.2f} | {med(4) / 1024:.2f} |")
EOF
