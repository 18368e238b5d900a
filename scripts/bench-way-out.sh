#!/usr/bin/env bash
# Survival benchmark of the way out, reported in BENCHMARKS.md (not a timed test): N runs (default 20)
# each of tests/way_out.rs's (a) protocol trainer on emergency swap and (b) trainer that knows nothing
# under `memwatch launch`, plus N runs of the same job unconstrained (no memory limit, no memwatch) as
# the baseline. Every way-out run prints one `bench:` JSON line (finished, OOM kills, processes left
# stopped, seconds, peak emergency swap used); this script collects them and prints the summary.
# Needs root (memory cgroups, zram) and the torch venv the test command sets up (.venv).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-20}
venv=${MEMWATCH_VENV:-$PWD/.venv}
export PATH="$venv/bin:$PATH"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

cargo build --quiet --tests
cargo build --quiet -p memwatch-fake-nvml -p memwatch-memhog

# The baseline: the same job, 4 workers, no limit and no memwatch.
cat >"$out/train.json" <<'JSON'
{"train": {"micro_batch": 32, "accumulation": 2, "workers": 4, "pin_memory": true},
 "epochs": 3, "samples": 2048, "cache_mib": 160, "step_ms": 20}
JSON
python3 -c 'import torch.utils.data' 2>/dev/null
for i in $(seq "$N"); do
  start=$(date +%s.%N)
  python3 tests/trainer/dataloader.py "$out/train.json" "$out/base.json" plain >/dev/null 2>&1
  end=$(date +%s.%N)
  echo "{\"scenario\": \"baseline\", \"finished\": true, \"seconds\": $(echo "$end - $start" | bc)}" >>"$out/lines"
done

for test in a_protocol_trainer_takes_the_fix_now_on_emergency_swap \
            a_trainer_that_knows_nothing_is_checkpointed_stopped_and_relaunched; do
  for i in $(seq "$N"); do
    MEMWATCH_BENCH=1 cargo test --quiet --test way_out "$test" -- --exact --nocapture 2>&1 \
      | grep '^bench: ' | sed 's/^bench: //' >>"$out/lines" || true
  done
done

python3 - "$out/lines" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
base = statistics.median(r["seconds"] for r in rows if r["scenario"] == "baseline")
print(f"baseline (unconstrained, no memwatch): median {base:.1f} s over "
      f"{sum(r['scenario'] == 'baseline' for r in rows)} runs")
for s in ("a", "b"):
    rs = [r for r in rows if r["scenario"] == s]
    if not rs:
        continue
    secs = [r["seconds"] for r in rs if r["finished"]]
    med = statistics.median(secs) if secs else float("nan")
    print(f"({s}) runs {len(rs)}: finished {sum(r['finished'] for r in rs)}, "
          f"OOM-killed {sum(r['oom_kills'] > 0 for r in rs)}, "
          f"left stopped {sum(r['stopped_left'] > 0 for r in rs)}, "
          f"median {med:.1f} s (+{med - base:.1f} s, {100 * (med - base) / base:.0f} % over the baseline), "
          f"max {max(secs, default=float('nan')):.1f} s, "
          f"peak emergency swap used: median {statistics.median(r['swap_peak_mib'] for r in rs):.0f} MiB, "
          f"max {max(r['swap_peak_mib'] for r in rs)} MiB")
PY
