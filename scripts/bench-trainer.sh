#!/usr/bin/env bash
# The cost of memwatch to a trainer, reported in BENCHMARKS.md (not a test):
#  1. optimizer steps per second of memwatch-train without memwatch and attached to a running daemon,
#     RUNS pairs in the same run (default 3), the order within a pair alternating (alone first in odd
#     pairs, attached first in even ones); then the median ratio with its quartiles, and how many
#     pairs were above 1 (a sign test: with no effect, about half);
#  2. the time from a rewrite (staged by memwatch when the fake GPU fills up) to the trainer's
#     acknowledgement, in milliseconds and in epochs.
# Needs the trainer's libtorch (see docs/trainer.md) and the fake NVML.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}
venv=${MEMWATCH_VENV:-$PWD/.venv}
torchlib=$("$venv/bin/python" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
export PATH="$venv/bin:$PATH" LIBTORCH_USE_PYTORCH=1 LD_LIBRARY_PATH="$torchlib"
cargo build --release --quiet --features trainer
cargo build --release --quiet -p memwatch-fake-nvml
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
cat >"$work/memwatch.toml" <<TOML
listen = "127.0.0.1:19302"
[gpu]
library = "$PWD/target/release/libmemwatch_fake_nvml.so"
[control]
socket = "$work/run/control.sock"
state_dir = "$work/state"
TOML
echo '{"devices":[{"name":"Fake","uuid":"GPU-b","memory_total":20000000000,"memory_used":8000000000,"temperature":50,"processes":[]}]}' >"$work/gpu.json"
MEMWATCH_FAKE_NVML_STATE="$work/gpu.json" ./target/release/memwatch --config "$work/memwatch.toml" --log-level error run &
sleep 1
cp trainer/corpus.txt "$work/"
mk() { sed -e "s|epochs = 8|epochs = $2|" -e "s|steps_per_epoch = 20|steps_per_epoch = 40|" \
  -e "s|url = \"http://127.0.0.1:9300\"|url = \"http://127.0.0.1:19302\"|" \
  -e "s|socket = \"/run/memwatch/control.sock\"|socket = \"$work/run/control.sock\"|" \
  -e "s|name = \"memwatch-train\"|name = \"$3\"|" trainer/memwatch-train.toml >"$work/$1.toml"; }
rate() { python3 -c "import json,sys; s=json.load(open(sys.argv[1]))['steps']; print(len(s)/((s[-1]['t_ms']-s[0]['t_ms'])/1000))" "$1"; }
alone() { ./target/release/memwatch-train --config "$work/alone.toml" --no-memwatch --log-json "$work/a.json" >/dev/null; }
attached() { ./target/release/memwatch-train --config "$work/with.toml" --log-json "$work/w.json" >/dev/null 2>&1; }
ratios=()
for i in $(seq "$RUNS"); do
  mk alone 4 alone; mk with 4 "with$i"
  if [ $((i % 2)) = 1 ]; then alone; attached; else attached; alone; fi
  a=$(rate "$work/a.json"); w=$(rate "$work/w.json")
  ratio=$(python3 -c "print(f'{$w/$a:.4f}')")
  ratios+=("$ratio")
  echo "run $i: steps/s without memwatch $a, attached $w, ratio $ratio"
done
python3 - "${ratios[@]}" <<'PY'
import statistics, sys
r = sorted(float(x) for x in sys.argv[1:])
q = statistics.quantiles(r, n=4) if len(r) >= 2 else [r[0]] * 3
above = sum(x > 1 for x in r)
print(f"ratio attached / alone over {len(r)} pairs: median {statistics.median(r):.4f} "
      f"(quartiles {q[0]:.4f} - {q[2]:.4f}), {above} of {len(r)} pairs above 1")
PY
# Rewrite → acknowledgement: fill the GPU once the trainer runs.
mk rw 6 rewrite
./target/release/memwatch-train --config "$work/rw.toml" --log-json "$work/r.json" >/dev/null 2>&1 &
tr=$!
sleep 2
echo "{\"devices\":[{\"name\":\"Fake\",\"uuid\":\"GPU-b\",\"memory_total\":20000000000,\"memory_used\":19000000000,\"temperature\":50,\"processes\":[{\"pid\":$tr,\"used_memory\":19000000000}]}]}" >"$work/gpu.json"
sleep 3
echo '{"devices":[{"name":"Fake","uuid":"GPU-b","memory_total":20000000000,"memory_used":8000000000,"temperature":50,"processes":[]}]}' >"$work/gpu.json"
wait $tr
curl -s 'http://127.0.0.1:19302/api/v1/events?limit=500' | python3 -c '
import json, sys
ev = [e for e in json.load(sys.stdin)["events"] if e["job"] == "rewrite"]
staged = next(e["timestamp_ms"] for e in ev if e["action"] == "rewrite")
applied = next(e for e in ev if e["action"] == "applied")
steps = json.load(open(sys.argv[1]))["steps"]
epoch_ms = (steps[-1]["t_ms"] - steps[0]["t_ms"]) / (steps[-1]["epoch"] + 1)
ms = applied["timestamp_ms"] - staged
detail = applied["detail"]
print(f"rewrite staged → acknowledged: {ms} ms = {ms/epoch_ms:.2f} epochs (epoch ≈ {epoch_ms:.0f} ms); {detail}")
' "$work/r.json"
