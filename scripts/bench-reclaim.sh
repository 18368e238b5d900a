#!/usr/bin/env bash
# Benchmark of a held job's memory pushed out to swap, reported in BENCHMARKS.md ("Reclaim while held";
# not a timed test). Needs root, a cgroup v1 memory + freezer hierarchy and zram (this machine).
#
# A: the kernel's two ways on cgroup v1, side by side, N runs each (default 10): a frozen job holding
#    HOLD_MIB (default 3072) of incompressible memory in a 4 GiB memory cgroup, pushed out to a zram
#    device either by lowering memory.limit_in_bytes by all it holds (then putting it back) or by
#    memory.force_empty. Prints ms and MiB/s per run, and the medians.
# B: through memwatch, N runs (tests/reclaim.rs with MEMWATCH_BENCH=1): the plain job, no config, held
#    at its line in a LIMIT_MIB (default 3277) cgroup while it needs TOTAL_MIB (default 3700), under
#    the shipped defaults: what moved and how fast, usage and MemAvailable before and after, the pause
#    to the resume, the refaults of the first 10 s after it, OOM kills, and its digest against the
#    same job run once with no limit and no memwatch.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-10}
HOLD_MIB=${HOLD_MIB:-3072}
LIMIT_MIB=${LIMIT_MIB:-3277}
TOTAL_MIB=${TOTAL_MIB:-3700}
out=$(mktemp -d)
cleanup() {
  [ -n "${P:-}" ] && kill -CONT "$P" 2>/dev/null && kill "$P" 2>/dev/null
  [ -n "${Z:-}" ] && { swapoff "/dev/zram$Z" 2>/dev/null; echo "$Z" >/sys/class/zram-control/hot_remove 2>/dev/null; }
  rmdir /sys/fs/cgroup/memory/mwbench /sys/fs/cgroup/freezer/mwbench 2>/dev/null || true
  rm -rf "$out"
}
trap cleanup EXIT

M=/sys/fs/cgroup/memory/mwbench F=/sys/fs/cgroup/freezer/mwbench
[ -f /sys/fs/cgroup/memory/memory.force_empty ] || { echo "bench-reclaim: no cgroup v1 memory hierarchy" >&2; exit 2; }
[ -e /sys/class/zram-control/hot_add ] || { echo "bench-reclaim: no zram" >&2; exit 2; }

# One run of A: prints "WAY MS MOVED_MIB".
push_once() {
  way=$1
  mkdir -p "$M" "$F"
  echo $((4096 << 20)) >"$M/memory.limit_in_bytes"
  Z=$(cat /sys/class/zram-control/hot_add)
  echo $(((HOLD_MIB + 512) << 20)) >"/sys/block/zram$Z/disksize"
  mkswap "/dev/zram$Z" >/dev/null && swapon -p 100 "/dev/zram$Z"
  python3 -c '
import hashlib, sys, time
chunks = [hashlib.shake_256(b"%d" % i).digest(16 << 20) for i in range(int(sys.argv[1]) // 16)]
print("ready", flush=True)
time.sleep(3600)' "$HOLD_MIB" >"$out/ready" &
  P=$!
  echo "$P" >"$M/cgroup.procs"
  echo "$P" >"$F/cgroup.procs"
  until grep -q ready "$out/ready" 2>/dev/null; do sleep 0.1; done
  echo FROZEN >"$F/freezer.state"
  until [ "$(cat "$F/freezer.state")" = FROZEN ]; do sleep 0.01; done
  u0=$(cat "$M/memory.usage_in_bytes")
  t0=$(date +%s%N)
  if [ "$way" = limit ]; then
    echo $((4 << 20)) >"$M/memory.limit_in_bytes" 2>/dev/null || true
    echo $((4096 << 20)) >"$M/memory.limit_in_bytes"
  else
    echo 0 >"$M/memory.force_empty" || true
  fi
  t1=$(date +%s%N)
  u1=$(cat "$M/memory.usage_in_bytes")
  echo "$way $(((t1 - t0) / 1000000)) $(((u0 - u1) >> 20))"
  echo THAWED >"$F/freezer.state"
  kill "$P"; wait "$P" 2>/dev/null || true
  P=
  swapoff "/dev/zram$Z"; echo "$Z" >/sys/class/zram-control/hot_remove; Z=
  rmdir "$M" "$F"
}

if [ -z "${SKIP_A:-}" ]; then
echo "== A: the kernel's ways on cgroup v1 ($HOLD_MIB MiB held, frozen, into zram; $N runs each, alternating)"
for i in $(seq "$N"); do
  push_once limit | tee -a "$out/a"
  push_once force_empty | tee -a "$out/a"
done
python3 - "$out/a" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
for way in ("limit", "force_empty"):
    r = [(int(ms), int(mib)) for w, ms, mib in rows if w == way]
    rates = sorted(mib / (ms / 1000) for ms, mib in r if ms)
    print(f"{way}: moved p50 {statistics.median(m for _, m in r):.0f} MiB in p50 {statistics.median(ms for ms, _ in r):.0f} ms, "
          f"max {max(ms for ms, _ in r)} ms; MiB/s p50 {statistics.median(rates):.0f}, min {rates[0]:.0f}, max {rates[-1]:.0f} (n={len(r)})")
PY
fi

echo "== B: through memwatch ($TOTAL_MIB MiB needed in $LIMIT_MIB MiB; $N runs)"
cargo build --quiet --tests
cargo build --quiet -p memwatch-fake-nvml -p memwatch-memhog
touch "$out/go"
ref=$(python3 - "$TOTAL_MIB" "$out/go" <<'PY' | tail -n 1 | awk '{print $NF}'
import hashlib, sys
mib = int(sys.argv[1])
whole = hashlib.sha256()
for i in range(mib // 16):
    whole.update(hashlib.shake_256(b"%d" % i).digest(16 << 20))
print(whole.hexdigest())
PY
)
for i in $(seq "$N"); do
  MEMWATCH_BENCH=1 MEMWATCH_RECLAIM_LIMIT_MIB=$LIMIT_MIB MEMWATCH_RECLAIM_TOTAL_MIB=$TOTAL_MIB \
    cargo test --quiet --test reclaim -- --nocapture 2>&1 | grep '^bench: ' | sed 's/^bench: //' | tee -a "$out/b" || true
done
python3 - "$out/b" "$ref" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
ref = sys.argv[2]
if not rows:
    sys.exit("no run reported")
def p(key):
    v = sorted(r[key] for r in rows if r.get(key) is not None)
    return f"p50 {statistics.median(v):.0f}, min {v[0]:.0f}, max {v[-1]:.0f}" if v else "none"
print(f"runs {len(rows)}; identical digests {sum(r['digest'] == ref for r in rows)} of {len(rows)}; "
      f"OOM kills {sum(r['oom_kills'] for r in rows)}")
for k in ("moved_mib", "mib_per_s", "push_ms", "usage_before_mib", "usage_after_mib",
          "available_at_pause_mib", "available_after_push_mib", "pause_to_resume_ms", "refaults_first_10s_mib"):
    print(f"{k}: {p(k)}")
PY
