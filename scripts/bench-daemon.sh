#!/usr/bin/env bash
# Daemon-level benchmark, reported in BENCHMARKS.md (not a timed test):
#  1. memwatch's RSS and CPU share sampling the real host at 1 Hz (with the fake NVML's two GPUs) over
#     DURATION seconds (default 60);
#  2. the same with one attached job of 8 processes (memhog and 7 workers), calm;
#  3. /metrics throughput with wrk, memwatch and prometheus-node-exporter side by side in the same run.
# Needs: wrk, prometheus-node-exporter, bc, curl (Debian packages; installed when missing and run as root).
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-60}
# GPU=off measures without GPU sampling (the fake NVML stands in for the driver; it re-reads its JSON
# state at most every 10 ms, so one sample's calls cost one read and parse).
GPU=${GPU:-on}
WRK_SECONDS=${WRK_SECONDS:-10}

have() { command -v "$1" >/dev/null 2>&1; }
missing=()
have wrk || missing+=(wrk)
have prometheus-node-exporter || missing+=(prometheus-node-exporter)
have bc || missing+=(bc)
have curl || missing+=(curl)
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

cargo build --release --quiet
cargo build --release --quiet -p memwatch-fake-nvml -p memwatch-memhog
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
cat >"$work/memwatch.toml" <<TOML
listen = "127.0.0.1:19300"
[gpu]
enabled = $([ "$GPU" = off ] && echo false || echo true)
library = "$PWD/target/release/libmemwatch_fake_nvml.so"
[control]
socket = "$work/run/control.sock"
state_dir = "$work/state"
TOML
MEMWATCH_FAKE_NVML_STATE=$PWD/tests/fixtures/nvml/two-gpus.json \
  ./target/release/memwatch --config "$work/memwatch.toml" --log-level warn run &
mw=$!
prometheus-node-exporter --web.listen-address=127.0.0.1:19100 --log.level=warn 2>/dev/null &
ne=$!
sleep 2

ticks=$(getconf CLK_TCK)
cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }
c0=$(cpu $mw); t0=$(date +%s.%N)
sleep "$DURATION"
c1=$(cpu $mw); t1=$(date +%s.%N)
rss=$(awk '/VmRSS/ {print $2}' /proc/$mw/status)
hwm=$(awk '/VmHWM/ {print $2}' /proc/$mw/status)
echo "memwatch idle at 1 Hz over ${DURATION}s: CPU $(echo "($c1 - $c0) / $ticks / ($t1 - $t0) * 100" | bc -l | xargs printf '%.3f') % of one core, RSS $((rss / 1024)).$(( (rss % 1024) * 10 / 1024 )) MiB (peak $((hwm / 1024)).$(( (hwm % 1024) * 10 / 1024 )) MiB)"

./target/release/memhog --workers 7 --total-mib 64 --hold-ms 3600000 >/dev/null &
hog=$!
sleep 1
./target/release/memwatch attach $hog --name bench --socket "$work/run/control.sock" >/dev/null
sleep 2
c0=$(cpu $mw); t0=$(date +%s.%N)
sleep "$DURATION"
c1=$(cpu $mw); t1=$(date +%s.%N)
rss=$(awk '/VmRSS/ {print $2}' /proc/$mw/status)
procs=$(./target/release/memwatch jobs --json --socket "$work/run/control.sock" | grep -c '"pid"' || true)
echo "memwatch with one attached job ($((procs - 1)) processes), calm, over ${DURATION}s: CPU $(echo "($c1 - $c0) / $ticks / ($t1 - $t0) * 100" | bc -l | xargs printf '%.3f') % of one core, RSS $((rss / 1024)).$(( (rss % 1024) * 10 / 1024 )) MiB"
pkill -P $hog 2>/dev/null; kill $hog

for target in memwatch:19300 node_exporter:19100 memwatch:19300 node_exporter:19100; do
  name=${target%%:*}; port=${target##*:}
  rps=$(wrk -t2 -c8 -d"${WRK_SECONDS}s" "http://127.0.0.1:$port/metrics" | awk '/Requests\/sec/ {print $2}')
  bytes=$(curl -s "http://127.0.0.1:$port/metrics" | wc -c)
  echo "wrk -t2 -c8 -d${WRK_SECONDS}s /metrics  $name: $rps req/s  (${bytes} B per scrape)"
done
rss=$(awk '/VmRSS/ {print $2}' /proc/$mw/status)
nrss=$(awk '/VmRSS/ {print $2}' /proc/$ne/status)
echo "RSS after load: memwatch $((rss / 1024)) MiB, node_exporter $((nrss / 1024)) MiB"
