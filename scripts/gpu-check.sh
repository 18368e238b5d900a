#!/usr/bin/env bash
# memwatch on a real NVIDIA GPU through the real NVML (the tests use a fake libnvidia-ml), asserted:
# each check prints `PASS NAME: …` or `FAIL NAME: …` with what it compared, and the script exits 1
# naming every failed check (0 when all passed). One command on any NVIDIA box:
#
#   sudo ./scripts/gpu-check.sh [path/to/memwatch]      (default target/release/memwatch)
#
# The checks (scripts/gpu-check-lib.sh; tests/gpu_check.rs shows each failing on a wrong figure):
#   nvml-*         memwatch's GPU count, memory total and used, and temperature against nvidia-smi's
#   job-*          a CUDA job (scripts/gpu_job.py, 4 DataLoader workers) started as the child of a shell
#                  that is attached by pid: the job's tree found, its GPU memory against nvidia-smi's
#                  per-process figure at 50 %, 93 % and 30 % of the card
#   hand-*         a pause and a resume by hand: every process of the tree stopped, then running
#   thermal-*      a thermal pause with lowered thresholds (critical 3 °C under the GPU's temperature
#                  now), then a daemon with the shipped thresholds takes the job over and resumes it
#   trainer-*      memwatch-train on CUDA (MEMWATCH_TRAIN=path, built with --features trainer against a
#                  CUDA libtorch) beside a job that holds 96 % of the card: memwatch stages a halved
#                  micro-batch and the trainer applies it at an epoch boundary, the effective batch kept
#   systemd-*      the packaged unit (GPU_CHECK_DEB=memwatch_*.deb, installed with dpkg) under systemd
#                  with the real driver: its NVML collector succeeds behind the unit's DeviceAllow
# A check that cannot run here (no memwatch-train, no systemd) fails, unless GPU_CHECK_SKIP (comma-
# separated: trainer, systemd) names it.
#
# Root; python3 with torch and a CUDA device; nvidia-smi. Writes under $WORK (default
# /tmp/memwatch-gpu-check); the daemon listens on 127.0.0.1:$PORT (default 9311).
set -u
cd "$(dirname "$0")/.."
. scripts/gpu-check-lib.sh
MW=$(realpath "${1:-target/release/memwatch}")
W=${WORK:-/tmp/memwatch-gpu-check}
PORT=${PORT:-9311}
rm -rf "$W"
mkdir -p "$W/state"
say() { echo; echo "=== $*"; }
get() { python3 -c "import urllib.request,sys;print(urllib.request.urlopen(sys.argv[1],timeout=5).read().decode())" "http://127.0.0.1:$PORT$1" 2>/dev/null; }
# metric NAME LABEL_MATCH: the value of the first series of NAME whose labels contain LABEL_MATCH.
metric() { get /metrics | awk -v n="$1" -v l="$2" 'index($0, n) == 1 && (l == "" || index($0, l)) { print $NF; exit }'; }
# job FIELD [NAME]: a field (dotted: sample.gpu_bytes) of the job NAME (default cuda-train) in
# /api/v1/jobs.
job() {
  get /api/v1/jobs | python3 -c "
import json, sys
f = sys.argv[1].split('.')
for j in json.load(sys.stdin).get('jobs', []):
    if j.get('name') == sys.argv[2]:
        v = j
        for k in f:
            v = v.get(k) if isinstance(v, dict) else None
        print('' if v is None else v)" "$1" "${2:-cuda-train}"
}
# smi_pid_mib PID…: the GPU memory nvidia-smi shows for those pids, in MiB, summed.
smi_pid_mib() {
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits |
    awk -F', *' -v pids=" $* " 'index(pids, " " $1 " ") { s += $2 } END { print s + 0 }'
}
# tree PID: PID and its descendants.
tree() {
  local p=$1 c
  echo "$p"
  for c in $(cat /proc/"$p"/task/*/children 2>/dev/null); do tree "$c"; done
}
states() { local p; for p in $(tree "$1"); do echo -n "$p:$(awk '{ sub(/.*\) /, ""); print substr($0, 1, 1) }' /proc/"$p"/stat 2>/dev/null) "; done; }
job_is() { [ "$(job state)" = "$1" ]; }
trainer_on_gpu() { [ "$(smi_pid_mib "$TP")" -gt 0 ]; }
trainer_attached() { [ -n "$(job state memwatch-train)" ]; }
trainer_applied() { [ "$(job config.applied_generation memwatch-train)" -ge 1 ] 2>/dev/null; }
at_least_procs() { [ "$(job sample.process_count)" -ge "$1" ] 2>/dev/null; }
# none_in PID LETTERS: no process of PID's tree is in a state among LETTERS.
none_in() { ! states "$1" | grep -q ":[$2] "; }
serving() { get /metrics | grep -q '^memwatch_gpus '; }
# wait_for SECONDS COMMAND…: until COMMAND succeeds.
wait_for() {
  local end=$((SECONDS + $1))
  shift
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $end ] || return 1
    sleep 0.2
  done
}

say machine
uname -r
echo "pid 1: $(cat /proc/1/comm); cgroup $(stat -fc %T /sys/fs/cgroup)"
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,temperature.gpu,power.draw,power.limit --format=csv
NVML=$(ldconfig -p | awk '/libnvidia-ml\.so\.1 /{ print $NF; exit }')
[ -n "$NVML" ] || NVML=$(find /usr/local/nvidia /usr/lib /lib -name 'libnvidia-ml.so.1' 2>/dev/null | head -1)
[ -n "$NVML" ] || { fail nvml-library "no libnvidia-ml.so.1 found"; summary; exit 1; }
echo "NVML: $NVML"

# config EXTRA: the daemon's config, with EXTRA appended.
config() {
  cat >"$W/memwatch.toml" <<CONF
listen = "127.0.0.1:$PORT"
[sampling]
interval_ms = 500
[gpu]
enabled = true
library = "$NVML"
[control]
socket = "$W/control.sock"
state_dir = "$W/state"
$1
CONF
}
M=("$MW" --config "$W/memwatch.toml")
DP='' JP='' TP=''
start_daemon() {
  rm -f "$W/control.sock"
  "${M[@]}" --log-level info run >>"$W/daemon.log" 2>&1 &
  DP=$!
  wait_for 20 test -S "$W/control.sock" && wait_for 20 serving
}
trap 'kill $JP $TP $DP 2>/dev/null' EXIT
config ""
start_daemon || { fail daemon-start "the daemon did not serve within 40 s: $(tail -n 5 "$W/daemon.log")"; summary; exit 1; }

say "NVML against nvidia-smi"
equal nvml-count "$(metric 'memwatch_gpus ' '')" "$(nvidia-smi -L | grep -c '^GPU ')"
n=$(nvidia-smi -L | grep -c '^GPU ')
for ((i = 0; i < n; i++)); do
  read -r total used temp < <(nvidia-smi -i "$i" --query-gpu=memory.total,memory.used,temperature.gpu --format=csv,noheader,nounits | tr -d ',')
  near "nvml-memory-total-gpu$i" "$(metric memwatch_gpu_memory_total_bytes "gpu=\"$i\"")" "$((total << 20))" 1
  # Used memory moves between the two reads: 2 % and 256 MiB of slack.
  near "nvml-memory-used-gpu$i" "$(metric memwatch_gpu_memory_used_bytes "gpu=\"$i\"")" "$((used << 20))" 2 $((256 << 20))
  near "nvml-temperature-gpu$i" "$(metric memwatch_gpu_temperature_celsius "gpu=\"$i\"")" "$temp" 0 3
done

say "a CUDA job, a child of the attached shell"
cat >"$W/train.json" <<CONF
{"per_device_train_batch_size": 64, "gradient_accumulation_steps": 1, "dataloader_num_workers": 4, "dataloader_pin_memory": true}
CONF
echo 0.10 >"$W/target"
# The shell stays the CUDA process's parent (it does not exec a command that is not its last).
bash -c 'python3 -u scripts/gpu_job.py "$1"; exit $?' sh "$W/target" >"$W/job.log" 2>&1 &
JP=$!
if ! wait_for 300 grep -q READY "$W/job.log"; then
  fail job-start "gpu_job.py never said READY: $(tail -n 5 "$W/job.log")"
  summary
  exit 1
fi
cuda=$(sed -n 's/.*READY pid=\([0-9]*\).*/\1/p' "$W/job.log")
"${M[@]}" attach "$JP" --name cuda-train --config-file "$W/train.json" --profile hf
wait_for 10 at_least_procs 6
# The shell, python and its 4 DataLoader workers (and any helper thread's process torch starts).
procs=$(job sample.process_count)
if [ "${procs:-0}" -ge 6 ] 2>/dev/null; then pass job-tree "$procs processes under the shell $JP (python $cuda)"; else fail job-tree "memwatch follows ${procs:-no} processes under $JP, want >= 6 (shell, python, 4 workers): $(states "$JP")"; fi
for t in 0.500 0.930 0.300; do
  echo $t >"$W/target"
  wait_for 300 grep -q "HOLD $t" "$W/job.log" || { fail "job-gpu-$t" "the job never held $t of the card: $(tail -n 2 "$W/job.log")"; continue; }
  sleep 2.5 # two samples of the daemon's 500 ms interval after the job settled, and NVML's own lag
  echo "$(grep "HOLD $t" "$W/job.log")"
  near "job-gpu-memory-$t" "$(job sample.gpu_bytes)" "$(($(smi_pid_mib $(tree "$JP")) << 20))" 2 $((64 << 20))
done

say "a pause and a resume by hand"
"${M[@]}" pause cuda-train
wait_for 5 none_in "$JP" 'RSD'
all_states hand-pause 'T|t' "$(states "$JP")"
echo "GPU memory held while paused: $(smi_pid_mib $(tree "$JP")) MiB"
"${M[@]}" resume cuda-train
wait_for 5 none_in "$JP" 'Tt'
all_states hand-resume 'R|S|D' "$(states "$JP")"

say "a thermal pause with lowered thresholds, resumed by a daemon with the shipped ones"
temp=$(metric memwatch_gpu_temperature_celsius 'gpu="0"')
shutdown=$(metric memwatch_gpu_temperature_shutdown_celsius 'gpu="0"')
slowdown=$(metric memwatch_gpu_temperature_slowdown_celsius 'gpu="0"')
if ! is_number "$temp" || ! is_number "${shutdown:-x}" || ! is_number "${slowdown:-x}"; then
  fail thermal-thresholds "GPU 0's temperature '$temp', shutdown '$shutdown', slowdown '$slowdown' are not all known"
else
  crit=$(awk -v s="$shutdown" -v t="$temp" 'BEGIN { print s - t + 3 }')
  warn=$(awk -v s="$slowdown" -v t="$temp" 'BEGIN { print s - t + 6 }')
  kill "$DP"; wait "$DP" 2>/dev/null
  config "[policy.gpu_temperature]
action = \"pause\"
warn_below_slowdown = $warn
critical_below_shutdown = $crit
enter_hold_ms = 0"
  start_daemon || fail thermal-daemon "the daemon with lowered thresholds did not start: $(tail -n 5 "$W/daemon.log")"
  "${M[@]}" attach "$JP" --name cuda-train --config-file "$W/train.json" --profile hf >/dev/null 2>&1
  if wait_for 30 job_is paused; then
    pass thermal-pause "paused at ${temp} °C with critical at $(awk -v s="$shutdown" -v c="$crit" 'BEGIN { print s - c }') °C: $(job pause.reason)"
    all_states thermal-stopped 'T|t' "$(states "$JP")"
  else
    fail thermal-pause "not paused within 30 s at ${temp} °C (critical at shutdown $shutdown - $crit): state $(job state)"
  fi
  kill "$DP"; wait "$DP" 2>/dev/null
  config ""
  start_daemon || fail thermal-successor "the daemon with shipped thresholds did not start: $(tail -n 5 "$W/daemon.log")"
  # Resumed once the GPU is cool by the shipped policy for its leave hold (10 s).
  if wait_for 60 job_is running; then
    pass thermal-resume "the successor resumed it"
    all_states thermal-running 'R|S|D' "$(states "$JP")"
  else
    fail thermal-resume "not resumed within 60 s by the daemon with shipped thresholds: state $(job state); $(states "$JP")"
  fi
fi
"${M[@]}" detach cuda-train >/dev/null 2>&1

say "memwatch-train on CUDA, a rewrite applied at an epoch boundary"
if [ -z "${MEMWATCH_TRAIN:-}" ] || [ ! -x "${MEMWATCH_TRAIN:-}" ]; then
  not_run trainer "MEMWATCH_TRAIN names no memwatch-train binary (cargo build --release --features trainer with a CUDA libtorch)"
else
  mkdir -p "$W/trainer"
  cp trainer/corpus.txt "$W/trainer/"
  sed -e "s|^url = .*|url = \"http://127.0.0.1:$PORT\"|" -e "s|^socket = .*|socket = \"$W/control.sock\"|" \
    -e 's|^epochs = .*|epochs = 40|' trainer/memwatch-train.toml >"$W/trainer/memwatch-train.toml"
  echo 0.300 >"$W/target"
  (cd "$W/trainer" && exec "$MEMWATCH_TRAIN") >"$W/trainer.log" 2>&1 &
  TP=$!
  wait_for 120 trainer_on_gpu
  above trainer-cuda "$(smi_pid_mib "$TP")" 0 # GPU memory of its own (MiB): it trains on CUDA
  wait_for 30 trainer_attached
  echo 0.960 >"$W/target"
  if wait_for 300 grep -q '^micro_batch = 16$' "$W/trainer/memwatch-train.toml"; then
    pass trainer-rewrite "memwatch staged micro_batch 16, accumulation $(sed -n 's/^accumulation = //p' "$W/trainer/memwatch-train.toml") (was 32 × 2)"
    if wait_for 300 trainer_applied; then
      pass trainer-applied "applied at an epoch boundary: config generation $(job config.applied_generation memwatch-train) acknowledged"
    else
      fail trainer-applied "the trainer never acknowledged the rewrite: generation $(job config.generation memwatch-train), applied $(job config.applied_generation memwatch-train)"
    fi
  else
    fail trainer-rewrite "no rewrite staged with the card at 96 %: $("${M[@]}" jobs 2>&1 | tail -n 4)"
  fi
  echo 0.300 >"$W/target"
  kill "$TP" 2>/dev/null; wait "$TP" 2>/dev/null
fi
kill "$JP" 2>/dev/null; wait "$JP" 2>/dev/null
kill "$DP" 2>/dev/null; wait "$DP" 2>/dev/null

say "the packaged unit under systemd with the real driver"
if [ "$(cat /proc/1/comm)" != systemd ]; then
  not_run systemd "PID 1 is $(cat /proc/1/comm), not systemd"
elif [ -z "${GPU_CHECK_DEB:-}" ] || [ ! -f "${GPU_CHECK_DEB:-}" ]; then
  not_run systemd "GPU_CHECK_DEB names no memwatch .deb (./scripts/build-deb.sh makes one)"
else
  dpkg -i "$GPU_CHECK_DEB" >"$W/dpkg.log" 2>&1 || fail systemd-install "dpkg -i: $(tail -n 3 "$W/dpkg.log")"
  mkdir -p /etc/memwatch
  grep -q '^\[gpu\]' /etc/memwatch/memwatch.toml 2>/dev/null || printf '\n[gpu]\nenabled = true\n' >>/etc/memwatch/memwatch.toml
  systemctl restart memwatch
  ok=''
  for _ in $(seq 100); do
    v=$(python3 -c "import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:9300/metrics',timeout=2).read().decode())" 2>/dev/null |
      awk '/^memwatch_collector_success\{collector="gpu"/ { print $NF; exit }')
    [ "$v" = 1 ] && { ok=yes; break; }
    sleep 0.2
  done
  if [ -n "$ok" ]; then pass systemd-nvml "the unit's NVML collector succeeds (DeviceAllow lets it reach the driver)"; else fail systemd-nvml "collector_success{collector=\"gpu\"} is ${v:-absent} under the unit: $(journalctl -u memwatch -n 5 --no-pager 2>&1)"; fi
fi

say "the daemon's warnings and errors"
grep -E " (WARN|ERROR) " "$W/daemon.log" | grep -v "intervention action" | tail -n 20 || echo none
summary
