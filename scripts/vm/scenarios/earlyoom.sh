# timeout: 900
# Beside earlyoom. earlyoom (run with an explicit -m 10: it acts when MemAvailable falls under 10 %
# of its "user mem total") watches the host while a job with no cgroup limit grows in host memory.
# Without memwatch, earlyoom kills the job. Attached to memwatch with its defaults (host_memory
# critical 0.90), who acts first is measured; with host_memory critical 0.85 (what `memwatch check`
# and docs/decisions.md advise beside earlyoom -m 10) memwatch pauses the job before earlyoom acts, and the
# job survives.
. /mnt/in/lib.sh
S=earlyoom
UNIT=eojob
CONF=/etc/memwatch/memwatch.toml

ensure_memwatch || { result $S fail "setup: memwatch not serving ($(systemctl is-active memwatch))"; exit 1; }
command -v earlyoom >/dev/null || { result $S fail "setup: earlyoom is not installed"; exit 1; }
total_mib=$(awk '/^MemTotal/ { print int($2 / 1024) }' /proc/meminfo)
earlyoom -m 10 -r 1 >/run/earlyoom.log 2>&1 &
EO_PID=$!
wait_until 10 grep -q 'mem avail' /run/earlyoom.log
eo_total=$(sed -n 's/.*user mem total: *\([0-9]*\) MiB.*/\1/p' /run/earlyoom.log | head -n 1)
eo_version=$(sed -n 's/^earlyoom \(v[0-9.]*\).*/\1/p' /run/earlyoom.log | head -n 1)

avail_mib() { awk '/^MemAvailable/ { print int($2 / 1024) }' /proc/meminfo; }
alive() { [ "$(systemctl is-active $UNIT)" = active ]; }
frozen_job() { [ "$(cg_key "$CG/$UNIT.service/cgroup.events" frozen)" = 1 ]; }
killed_by_earlyoom() { grep -q "sending SIG[A-Z]* to process $JOB_PID " /run/earlyoom.log; }

# start_job: no memory limit, no swap; memhog waits for /run/eo-go, then touches the whole of the
# host's memory at 96 MiB/s.
start_job() {
  rm -f /run/eo-go
  systemctl stop $UNIT >/dev/null 2>&1
  systemctl reset-failed $UNIT >/dev/null 2>&1
  systemd-run --quiet --unit=$UNIT -p MemorySwapMax=0 \
    "$IN/memhog" --rate-mib 96 --total-mib "$total_mib" --hold-ms 600000 --wait-file /run/eo-go
  wait_until 10 sh -c "[ \"\$(systemctl show -p MainPID --value $UNIT)\" -gt 0 ]"
  JOB_PID=$(main_pid $UNIT)
}

# race LABEL: starts the job growing and waits for whichever comes first, memwatch's freeze or
# earlyoom's signal; sets WHO (memwatch|earlyoom|nobody), AT (ms after go) and LOW (MemAvailable
# MiB then).
race() {
  go=$(now_ms)
  touch /run/eo-go
  WHO=nobody AT='' LOW=''
  # The job grows at 96 MiB/s toward all of MemTotal (about 35 s); a slow TCG guest touches memory
  # at a third of that and less.
  deadline=$((go + 240000))
  while [ "$(now_ms)" -lt "$deadline" ]; do
    if [ -n "$1" ] && frozen_job; then WHO=memwatch; break; fi
    if killed_by_earlyoom || ! alive; then WHO=earlyoom; break; fi
    sleep 0.05
  done
  AT=$(( $(now_ms) - go ))
  LOW=$(avail_mib)
}

stop_job() {
  systemctl kill -s KILL $UNIT >/dev/null 2>&1
  memwatch detach eojob >/dev/null 2>&1
  systemctl stop $UNIT >/dev/null 2>&1
  systemctl reset-failed $UNIT >/dev/null 2>&1
  wait_until 20 sh -c "[ \$(awk '/^MemAvailable/ { print int(\$2 / 1024) }' /proc/meminfo) -gt $((total_mib / 2)) ]"
  # The host's level back out of critical (after its 5 s leave hold), so the next run starts calm.
  wait_until 30 sh -c '[ "$(curl -sf 127.0.0.1:9300/api/v1/jobs | jq -r ".levels[]? | select(.resource == \"host_memory\") | .level")" != critical ]'
  sleep 6
}

# Without memwatch.
start_job
race ''
line=$(grep "sending SIG[A-Z]* to process $JOB_PID " /run/earlyoom.log | head -n 1 | sed 's/^.*sending/sending/; s/, cmdline.*//')
# What earlyoom read last before it acted.
seen=$(grep -B 3 "sending SIG[A-Z]* to process $JOB_PID " /run/earlyoom.log | grep 'mem avail' | tail -n 1 | sed 's/^.*mem avail/mem avail/')
if [ "$WHO" = earlyoom ]; then
  result $S ok "alone: earlyoom $eo_version (-m 10, user mem total ${eo_total:-?} of $total_mib MiB) killed the job $((AT / 1000)).$((AT % 1000 / 100)) s after it began growing; it read ${seen:-?}; $line"
else
  result $S fail "alone: earlyoom did not act in 240 s (MemAvailable $LOW MiB, alive: $(alive && echo yes || echo no))"
fi
stop_job

# With memwatch's defaults: who acts first.
start_job
memwatch attach "$JOB_PID" --name eojob >/dev/null
race memwatch
sleep 2
survived=$(alive && ! killed_by_earlyoom && echo yes || echo no)
result $S ok "defaults: $WHO acted first, $((AT / 1000)).$((AT % 1000 / 100)) s after the job began growing, MemAvailable $LOW MiB ($((LOW * 100 / total_mib)) % of MemTotal); host_memory critical 0.90 (the default); job alive 2 s later: $survived"
stop_job

# With host_memory critical below earlyoom's line: memwatch pauses first, and the job survives.
cp "$CONF" /run/memwatch.toml.orig
cat >"$CONF" <<'EOF'
# Beside earlyoom -m 10: memwatch pauses at 85 % used, 5 points before earlyoom's 10 % available.
[policy.host_memory]
warn = 0.75
warn_leave = 0.70
critical = 0.85
critical_leave = 0.80
EOF
systemctl restart memwatch
wait_until 60 curl -sf 127.0.0.1:9300/metrics
start_job
memwatch attach "$JOB_PID" --name eojob >/dev/null
race memwatch
if [ "$WHO" = memwatch ]; then
  why=$(curl -sf 127.0.0.1:9300/api/v1/jobs | jq -r '.jobs[] | select(.name == "eojob") | .pause.reason')
  held_from=$(now_ms)
  survived=yes
  while [ $(( $(now_ms) - held_from )) -lt 20000 ]; do
    if ! alive || killed_by_earlyoom; then survived=no; break; fi
    sleep 0.5
  done
  held=$(( ($(now_ms) - held_from) / 1000 ))
  if [ $survived = yes ]; then
    result $S ok "configured: memwatch (host_memory critical 0.85) froze the job $((AT / 1000)).$((AT % 1000 / 100)) s after it began growing, MemAvailable $LOW MiB ($((LOW * 100 / total_mib)) % of MemTotal, earlyoom's line $(( ${eo_total:-$total_mib} / 10 )) MiB): $why; alive and never signalled by earlyoom over $held s paused"
  else
    result $S fail "configured: frozen at $AT ms, then killed within $held s (earlyoom: $(grep -c sending /run/earlyoom.log) signal(s))"
  fi
else
  result $S fail "configured: $WHO acted first at $AT ms, MemAvailable $LOW MiB"
fi
stop_job
cp /run/memwatch.toml.orig "$CONF"
systemctl restart memwatch
wait_until 60 curl -sf 127.0.0.1:9300/metrics
kill "$EO_PID" 2>/dev/null
rm -f /run/eo-go
exit "${FAILED:-0}"
