# timeout: 120
# The daemon is killed (SIGKILL) while it holds a frozen job, and systemd does not restart it
# (Restart=no in a runtime drop-in): the guardian waits control.successor_grace_ms (5 s) for a
# successor, none comes, and it thaws the job. ok if the job runs again between the grace and the grace
# plus 2 s after the kill, alive, never OOM-killed (this job stops growing under its limit).
. /mnt/in/lib.sh
S=guardian-no-restart

mkdir -p /run/systemd/system/memwatch.service.d
printf '[Service]\nRestart=no\n' >/run/systemd/system/memwatch.service.d/no-restart.conf
systemctl daemon-reload
restore() {
  rm -f /run/systemd/system/memwatch.service.d/no-restart.conf
  systemctl daemon-reload
  systemctl reset-failed memwatch >/dev/null 2>&1
  systemctl start memwatch
}
ensure_memwatch || { result $S fail "setup: memwatch not serving ($(systemctl is-active memwatch))"; restore; exit 1; }
# 390 MiB of 400: frozen at the 95 % crossing (380 MiB), and able to run on once thawed.
start_hog 390
touch /run/hog-go
if ! wait_until 60 frozen hogjob.service; then
  result $S fail "setup: the job was never frozen ($(mib hogjob.service) MiB)"
  stop_hog
  restore
  exit 1
fi
wait_until 10 sh -c '[ "$(curl -sf 127.0.0.1:9300/api/v1/jobs | jq -r ".jobs[] | select(.name == \"hog\") | .pause.phase")" = held ]'
oom0=$(oom_kills hogjob.service)
old=$(main_pid memwatch)
t0=$(now_ms)
kill -9 "$old"
thawed=''
while [ "$(now_ms)" -lt $((t0 + 15000)) ]; do
  if [ "$(cg_key "$CG/hogjob.service/cgroup.events" frozen)" = 0 ]; then
    thawed=$(($(now_ms) - t0))
    break
  fi
  sleep 0.05
done
alive=no
kill -0 "$HOG_PID" 2>/dev/null && alive=yes
oom=$(oom_kills hogjob.service)
state=$(systemctl is-active memwatch)
if [ -n "$thawed" ]; then when="at +$thawed ms"; else when="not within 15 s"; fi
detail="daemon $old killed with the job frozen, no restart (memwatch $state); thawed: $when; job alive: $alive; oom_kill $oom0 -> $oom"
if [ -n "$thawed" ] && [ "$thawed" -ge 5000 ] && [ "$thawed" -le 7000 ] && [ "$alive" = yes ] && [ "$oom" = "$oom0" ]; then
  result $S ok "$detail"
else
  result $S fail "$detail"
fi
stop_hog
restore
exit "${FAILED:-0}"
