# timeout: 300
# A calm cgroup v2 job lets the daemon be calm. v2 has no usage thresholds, so the daemon's wake thread
# reads the job's memory.current itself, timed by the room left to its critical line, and tells the
# engine of a read across half the limit, warn or critical as v1's eventfd would
# (memwatch_kernel_notifications_total{source="job_usage_read"}). A unit (MemoryMax=512M, no swap)
# runs memhog, which waits for /run/cv-go, then grows to 300 MiB at 64 MiB/s and holds it.
# - calm (asserted): attached and holding a few MiB, the daemon stretches its full samples to
#   calm_interval_ms (memwatch_sample_interval_seconds 10) within 60 s.
# - cost (reported, TCG: not this machine's figures): the daemon's CPU from its unit's cpu.stat over
#   30 s unread, idle (no job) and then with the calm job, side by side in one boot.
# - crossing (asserted): the job grows past half its limit: a read tells it (job_usage_read goes up,
#   the daemon logs its first), and once the job holds still the daemon is calm again within 60 s.
. /mnt/in/lib.sh
S=calm-v2
WINDOW_S=30

ensure_memwatch || { result $S fail "setup: memwatch not serving ($(systemctl is-active memwatch))"; exit 1; }
metric() { curl -sf 127.0.0.1:9300/metrics | awk -v m="$1" '$1 == m { print $2 }'; }
count() { metric "memwatch_kernel_notifications_total{source=\"$1\"}"; }
calm() { [ "$(metric memwatch_sample_interval_seconds)" = 10 ]; }
cpu_usec() { cg_key "$CG/memwatch.service/cpu.stat" usage_usec; }
# The daemon's threads: "TID COMM RUN_NS SLICES" per line, from their schedstat.
threads() {
  for t in /proc/"$(main_pid memwatch)"/task/*; do
    echo "${t##*/} $(tr ' ' _ <"$t/comm") $(cat "$t/schedstat" 2>/dev/null)"
  done
}
# window: the daemon's CPU in % of a core over WINDOW_S seconds, nothing reading it meanwhile; sets
# BUSIEST to its three busiest threads' share and wake-ups per second.
window() {
  a=$(cpu_usec)
  threads >/tmp/cv-threads.a
  sleep $WINDOW_S
  b=$(cpu_usec)
  threads >/tmp/cv-threads.b
  BUSIEST=$(awk -v s=$WINDOW_S 'NR == FNR { ns[$1] = $3; n[$1] = $5; next }
    { printf "%s %.3f %% %.1f/s\n", $2, ($3 - ns[$1]) / (s * 1e7), ($5 - n[$1]) / s }' /tmp/cv-threads.a /tmp/cv-threads.b |
    sort -k2 -rn | head -n 3 | paste -sd ';' -)
  awk -v a="$a" -v b="$b" -v s=$WINDOW_S 'BEGIN { printf "%.3f", (b - a) / (s * 1e6) * 100 }'
}

jobs=$(curl -sf 127.0.0.1:9300/api/v1/jobs | jq '.jobs | length')
wait_until 60 calm || true
window >/tmp/cv-idle
idle=$(cat /tmp/cv-idle) idle_busiest=$BUSIEST

rm -f /run/cv-go
systemd-run --quiet --unit=cv -p MemoryMax=512M -p MemorySwapMax=0 \
  "$IN/memhog" --rate-mib 64 --chunk-mib 1 --total-mib 300 --hold-ms 600000 --wait-file /run/cv-go
wait_until 10 sh -c '[ "$(systemctl show -p MainPID --value cv)" -gt 0 ]'
PID=$(main_pid cv)
memwatch attach "$PID" --name cv >/dev/null
t0=$(now_ms)
if wait_until 60 calm; then
  took="full samples every 10 s $(($(now_ms) - t0)) ms after the attach"
  verdict=ok
else
  took="not calm 60 s after the attach (interval $(metric memwatch_sample_interval_seconds) s)"
  verdict=fail
fi
window >/tmp/cv-job
result $S $verdict "calm: with a v2 job attached ($(mib cv.service) MiB of 512), $took; the daemon's CPU over ${WINDOW_S} s: idle $idle % (busiest threads: $idle_busiest), with the job $(cat /tmp/cv-job) % of a core (busiest: $BUSIEST) (TCG; $jobs other jobs attached before)"

before=$(count job_usage_read)
touch /run/cv-go
t0=$(now_ms)
if wait_until 30 sh -c "journalctl -b --no-pager -u memwatch -o cat | grep -q \"first read of cv's usage across one of its lines\""; then
  told=$(($(now_ms) - t0))
  after=$(count job_usage_read)
  if [ "${after:-0}" -gt "${before:-0}" ]; then
    result $S ok "crossing: the job grew past half its limit; a read told the daemon within $told ms of the growth's start; job_usage_read $before → $after"
  else
    result $S fail "crossing: logged, but job_usage_read $before → $after"
  fi
else
  result $S fail "crossing: no read told of the growth in 30 s ($(mib cv.service) MiB); job_usage_read $before → $(count job_usage_read)"
fi
grown() { [ "$(mib cv.service)" -ge 295 ]; }
wait_until 30 grown || true
t0=$(now_ms)
if wait_until 60 calm; then
  result $S ok "calm-again: holding $(mib cv.service) MiB of 512, calm again $(($(now_ms) - t0)) ms after it stopped growing"
else
  result $S fail "calm-again: not calm 60 s after the job stopped growing (interval $(metric memwatch_sample_interval_seconds) s)"
fi

memwatch detach cv >/dev/null 2>&1
systemctl stop cv >/dev/null 2>&1
systemctl reset-failed cv >/dev/null 2>&1
rm -f /run/cv-go
exit "${FAILED:-0}"
