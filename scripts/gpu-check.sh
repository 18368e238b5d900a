#!/usr/bin/env bash
# memwatch on a real NVIDIA GPU through the real NVML (the tests use a fake libnvidia-ml): the
# daemon with the GPU on, a small CUDA training loop with 4 DataLoader workers (scripts/gpu_job.py)
# attached with an HF-style config file, its GPU memory taken to 50 %, 93 %, 98.5 % and back to 30 %
# of the card. At each step it prints nvidia-smi's figures beside memwatch's (/metrics, /api/v1/jobs),
# then the events, the config file as memwatch left it, `memwatch status`, `advise` and `jobs`, a
# pause and resume by hand (every process's state, and the GPU memory held while paused), and
# `memwatch check --params 7B` on this machine. Nothing here is a test: read it beside nvidia-smi.
#
# Root (or the job's owner, with a socket and state directory of its own); python3 with torch and a
# CUDA device; nvidia-smi. Writes under $WORK (default /tmp/memwatch-gpu-check).
#
#   ./scripts/gpu-check.sh [path/to/memwatch]      (default target/release/memwatch)
set -u
cd "$(dirname "$0")/.."
MW=$(realpath "${1:-target/release/memwatch}")
W=${WORK:-/tmp/memwatch-gpu-check}
mkdir -p "$W/state"
get() { python3 -c "import urllib.request,sys;print(urllib.request.urlopen(sys.argv[1],timeout=5).read().decode())" "http://127.0.0.1:${PORT:-9300}$1"; }
say() { echo; echo "=== $*"; }
say machine
uname -r; nproc; echo "pid 1: $(cat /proc/1/comm)"; stat -fc %T /sys/fs/cgroup
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,temperature.gpu,power.draw,power.limit --format=csv
NVML=$(ldconfig -p | awk '/libnvidia-ml\.so\.1 /{print $NF; exit}')
[ -n "$NVML" ] || NVML=$(find /usr/local/nvidia /usr/lib /lib -name 'libnvidia-ml.so.1' 2>/dev/null | head -1)
echo "NVML: ${NVML:?no libnvidia-ml.so.1 found}"
cat >"$W/memwatch.toml" <<CONF
listen = "127.0.0.1:${PORT:-9300}"
[sampling]
interval_ms = 500
[gpu]
enabled = true
library = "$NVML"
[control]
socket = "$W/control.sock"
state_dir = "$W/state"
CONF
M=("$MW" --config "$W/memwatch.toml")
"${M[@]}" --log-level info run >"$W/daemon.log" 2>&1 &
DP=$!
JP=
trap 'kill $JP $DP 2>/dev/null' EXIT
for _ in $(seq 100); do [ -S "$W/control.sock" ] && break; sleep 0.1; done
sleep 1.5
say "the daemon's GPU series"
get /metrics | grep -E '^memwatch_(gpus|gpu_info|gpu_memory_(total|used)_bytes|gpu_temperature|gpu_power|collector_success\{collector="gpu)'
cat >"$W/train.json" <<CONF
{"per_device_train_batch_size": 64, "gradient_accumulation_steps": 1, "dataloader_num_workers": 4, "dataloader_pin_memory": true}
CONF
echo 0.10 >"$W/target"
python3 -u scripts/gpu_job.py "$W/target" >"$W/job.log" 2>&1 &
JP=$!
for _ in $(seq 600); do grep -q READY "$W/job.log" && break; kill -0 $JP 2>/dev/null || break; sleep 0.2; done
say job; cat "$W/job.log"
"${M[@]}" attach $JP --name cuda-train --config-file "$W/train.json" --profile hf
for t in 0.500 0.930 0.985 0.300; do
  echo $t >"$W/target"
  for _ in $(seq 600); do grep -q "HOLD $t" "$W/job.log" && break; kill -0 $JP 2>/dev/null || break; sleep 0.2; done
  sleep 2.5
  say "target $t: $(grep "HOLD $t" "$W/job.log")"
  echo "nvidia-smi: $(nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader); by pid: $(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | tr '\n' ' ')"
  get /metrics | grep -E '^memwatch_(gpu_memory_used_bytes|gpu_process_memory_bytes|level\{resource="gpu)'
  get /api/v1/jobs | python3 -c "
import json, sys
d = json.load(sys.stdin)
for j in d.get('jobs', []):
    s = j.get('sample') or {}
    print('job', j.get('name'), j.get('state'), 'gpu_bytes', s.get('gpu_bytes'), 'gpus', s.get('gpus'), 'processes', s.get('process_count'))
    print('  tightest', j.get('tightest'))
for l in d.get('levels', []):
    print('  level', l['resource'], l['level'], l.get('value'))"
done
say events
get '/api/v1/events?limit=30' | python3 -c "
import json, sys
for e in json.load(sys.stdin).get('events', []):
    print(e.get('action'), e.get('reason'), e.get('job'), '|', e.get('message') or e.get('detail'))"
say "the config file after"; cat "$W/train.json"; echo
say "status, advise, jobs"
"${M[@]}" status; "${M[@]}" advise; "${M[@]}" jobs
say "pause and resume by hand"
states() { for p in $JP $(cat /proc/$JP/task/*/children); do echo -n "$p:$(awk '{print $3}' /proc/$p/stat) "; done; echo; }
"${M[@]}" pause cuda-train; sleep 0.5; states
echo "GPU memory held while paused: $(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | tr '\n' ' ')"
"${M[@]}" resume cuda-train; sleep 0.5; states
"${M[@]}" detach cuda-train
kill $JP; wait $JP 2>/dev/null
say "check 7B on this machine"
"${M[@]}" check --params 7B | head -20
kill $DP; wait $DP; echo "daemon exit $?"
say "the daemon's warnings and errors"; grep -v " INFO " "$W/daemon.log" | grep -v "intervention action" || echo none
