#!/usr/bin/env bash
# Reaction on cgroup v2 on a real machine, without systemd: the VM's reaction-v2 scenario
# (scripts/vm/scenarios/reaction-v2.sh, which runs under TCG) for a machine whose /sys/fs/cgroup is
# cgroup v2 with the memory controller. Per run, a memory cgroup of its own (memory.max LIMIT_MIB,
# default 512; no swap) holds memhog, asked for RATE MiB/s (default 4096) up to 600 MiB, attached to
# one of three daemons that run side by side, taken in turn run by run:
#   shipped     the default config (the prediction policy, reaction_ms = 250);
#   level       a level-only policy (reaction_ms = 0: a pause at the cgroup's critical line, 95 %),
#               with the reflex (the wake thread reads memory.current and freezes the job at the line);
#   level-probe the same without the reflex (reflex = false: the engine's probe decides).
# Per run: OOM-killed or not; from memhog's CLOCK_BOOTTIME stamps of its progress (one per 1 MiB
# chunk), when usage crossed 95 %, when the daemon decided the pause (its pause's since_ms on the
# same clock) and the job's last progress before the freeze; whether the reflex made the stop.
# Root; python3; release builds of memwatch and memhog. RUNS rounds (default 10). Each run prints
# "rate MiB/s, crossing → decided ms, crossing → last progress ms, frozen at MiB, OOM kills, reflex
# | the pause's reason".
#
#   ./scripts/bench-reaction-v2.sh [memwatch] [memhog]   (default target/release/{memwatch,memhog})
set -u
cd "$(dirname "$0")/.."
MW=$(realpath "${1:-target/release/memwatch}")
HOG=$(realpath "${2:-target/release/memhog}")
RUNS=${RUNS:-10} RATE=${RATE:-4096} LIMIT_MIB=${LIMIT_MIB:-512}
W=${WORK:-/tmp/memwatch-reaction-v2}
CG=/sys/fs/cgroup
[ "$(stat -fc %T $CG)" = cgroup2fs ] || { echo "$CG is not cgroup v2" >&2; exit 2; }
grep -qw memory $CG/cgroup.subtree_control || echo +memory >$CG/cgroup.subtree_control ||
  { echo "cannot enable the memory controller under $CG" >&2; exit 2; }
rm -rf "$W"; mkdir -p "$W"
py() { python3 -c "$@"; }
get() { py "import urllib.request,sys;print(urllib.request.urlopen(sys.argv[1],timeout=5).read().decode())" "$1"; }
POLICIES="shipped level level-probe"
declare -A PORT=([shipped]=9311 [level]=9312 [level-probe]=9313)
declare -A EXTRA=([shipped]="" [level]=$'[policy]\nreaction_ms = 0' [level-probe]=$'[policy]\nreaction_ms = 0\nreflex = false')
pids=()
for p in $POLICIES; do
  mkdir -p "$W/$p/state"
  printf 'listen = "127.0.0.1:%s"\n[gpu]\nenabled = false\n[control]\nsocket = "%s"\nstate_dir = "%s"\n%s\n' \
    "${PORT[$p]}" "$W/$p/control.sock" "$W/$p/state" "${EXTRA[$p]}" >"$W/$p/memwatch.toml"
  "$MW" --config "$W/$p/memwatch.toml" --log-level warn run >"$W/$p/daemon.log" 2>&1 &
  pids+=($!)
done
trap 'kill ${pids[*]} 2>/dev/null; for d in $CG/mwrv-*; do [ -d "$d" ] && { echo 1 >"$d/cgroup.kill"; sleep 0.2; rmdir "$d"; }; done 2>/dev/null' EXIT
for p in $POLICIES; do
  for _ in $(seq 100); do [ -S "$W/$p/control.sock" ] && break; sleep 0.1; done
done
sleep 1
# One run: policy P, run N; appends "rate decided last frozen_mib oom reflex" to $W/P.runs.
run() {
  p=$1 n=$2 name=mwrv-$1-$2 d=$CG/mwrv-$1-$2
  mkdir "$d"
  echo $((LIMIT_MIB << 20)) >"$d/memory.max"
  echo 0 >"$d/memory.swap.max" 2>/dev/null
  rm -f "$W/go" "$W/stamps"
  sh -c "echo \$\$ >$d/cgroup.procs && exec $HOG --rate-mib $RATE --chunk-mib 1 --total-mib 600 --hold-ms 600000 --wait-file $W/go --stamps $W/stamps" >/dev/null &
  pid=$!
  for _ in $(seq 100); do grep -qx "$pid" "$d/cgroup.procs" 2>/dev/null && [ "$(readlink /proc/$pid/exe)" = "$HOG" ] && break; sleep 0.02; done
  "$MW" --config "$W/$p/memwatch.toml" attach "$pid" --name "$name" >/dev/null || { echo "attach failed" >&2; return; }
  api="http://127.0.0.1:${PORT[$p]}"
  for _ in $(seq 100); do
    get "$api/api/v1/jobs" | py "import json,sys; d=json.load(sys.stdin); sys.exit(0 if any(l.get('limit')=='cgroup' for j in d['jobs'] if j['name']=='$name' for l in j.get('limits',[])) else 1)" && break
    sleep 0.1
  done
  base=$(cat "$d/memory.current")
  touch "$W/go"
  for _ in $(seq 300); do grep -q '^frozen 1' "$d/cgroup.events" && break; kill -0 $pid 2>/dev/null || break; grep -q '^oom_kill [1-9]' "$d/memory.events" && break; [ "$(awk '{ print $3 }' /proc/$pid/stat 2>/dev/null)" = T ] && break; sleep 0.1; done
  sleep 0.2
  used=$(cat "$d/memory.current" 2>/dev/null || echo 0)
  oom=$(awk '$1 == "oom_kill" { print $2 }' "$d/memory.events")
  anchor=$(py "import json; print(json.load(open('$W/$p/state/state.json'))['clock']['anchor_ms'])" 2>/dev/null || echo 0)
  since=$(get "$api/api/v1/jobs" | py "import json,sys; d=json.load(sys.stdin); print(next(((j.get('pause') or {}).get('since_ms') or 0 for j in d['jobs'] if j['name']=='$name'), 0))")
  get "$api/api/v1/events?limit=50" | py "import json,sys; d=json.load(sys.stdin); print('\n'.join(e.get('action') + ': ' + (e.get('detail') or '') for e in d.get('events',[]) if e.get('job')=='$name' and e.get('action')!='attach'))" >"$W/pause"
  reflex=$(grep -c '^pause: .*stopped by the reflex' "$W/pause")
  [ "$reflex" -gt 0 ] && reflex=1
  PAUSE=$(paste -sd '|' "$W/pause")
  echo "$(awk -v base="$base" -v used="$used" -v lim=$((LIMIT_MIB << 20)) -v dec="${since:-0}" -v anchor="$anchor" \
    -f scripts/vm/scenarios/stamps.awk "$W/stamps") $((used >> 20)) ${oom:-0} $reflex" >>"$W/$p.runs"
  echo 1 >"$d/cgroup.kill"
  wait $pid 2>/dev/null
  for _ in $(seq 100); do [ -s "$d/cgroup.procs" ] || break; sleep 0.02; done
  rmdir "$d"
}
for n in $(seq "$RUNS"); do
  for p in $POLICIES; do run "$p" "$n" && echo "run $n $p: $(tail -n 1 "$W/$p.runs") | $PAUSE"; done
done
# p50 / p90 / max of column C of a file ("none" left out, counted).
stats() {
  awk -v c="$2" '$c == "none" { none++; next } { v[n++] = $c }
    END { if (!n) { printf "none of %d", none; exit }
      for (i = 0; i < n; i++) for (j = i + 1; j < n; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
      printf "p50 %s / p90 %s / max %s", v[int((n - 1) * 0.5 + 0.5)], v[int((n - 1) * 0.9 + 0.5)], v[n - 1]
      if (none) printf " (%d without)", none }' "$1"
}
echo "cgroup v2, memory.max $LIMIT_MIB MiB, asked $RATE MiB/s, $RUNS runs per policy, alternated; $(nproc) cores, kernel $(uname -r)"
for p in $POLICIES; do
  f=$W/$p.runs
  echo "$p: $(wc -l <"$f") runs; measured $(stats "$f" 1) MiB/s; OOM-killed $(awk '$5 > 0' "$f" | wc -l); stopped by the reflex $(awk '$6 > 0' "$f" | wc -l); 95 % crossing → pause decided $(stats "$f" 2) ms, → last progress $(stats "$f" 3) ms; frozen at $(stats "$f" 4) MiB"
done
for p in $POLICIES; do grep -v "intervention" "$W/$p/daemon.log" | head -3; done
