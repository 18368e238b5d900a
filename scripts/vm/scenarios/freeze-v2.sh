# timeout: 180
# A systemd unit's job (MemoryMax=400M, no swap) grows toward its limit at 64 MiB/s; memwatch, attached
# to it, freezes the unit's cgroup (cgroup v2's cgroup.freeze) before the OOM killer fires, and thaws
# it when detached.
. /mnt/in/lib.sh
S=freeze-v2

ensure_memwatch || { result $S fail "setup: memwatch not serving ($(systemctl is-active memwatch))"; exit 1; }
# 390 MiB of 400: held below the limit, so a job memwatch failed to pause is not OOM-killed either.
start_hog 390
if [ -z "$HOG_PID" ] || [ "$HOG_PID" = 0 ]; then
  result $S fail "setup: hogjob.service did not start ($(systemctl is-active hogjob))"
  exit 1
fi
limit=$(($(cat "$CG/hogjob.service/memory.max") / 1048576))
go=$(now_ms)
touch /run/hog-go
crossed='' froze=''
# Polls every 50 ms: when usage crosses 95 % of the limit (critical), when the cgroup is frozen.
deadline=$((go + 60000))
while [ "$(now_ms)" -lt "$deadline" ]; do
  used=$(mib hogjob.service)
  [ -z "$crossed" ] && [ $((used * 100)) -ge $((limit * 95)) ] && crossed=$(now_ms)
  if frozen hogjob.service; then
    froze=$(now_ms)
    break
  fi
  sleep 0.05
done
used=$(mib hogjob.service)
oom=$(oom_kills hogjob.service)
kind=$(hog_field '.pause.mechanism.kind')
by=$(hog_field '.pause.by')
why=$(hog_field '.pause.reason')
if [ -n "$froze" ]; then
  if [ -n "$crossed" ]; then
    timing="95 % crossed at +$((crossed - go)) ms, frozen at +$((froze - go)) ms ($((froze - crossed)) ms later; 50 ms polls)"
  else
    timing="frozen at +$((froze - go)) ms, before 95 % was crossed (50 ms polls)"
  fi
  detail="$timing at $used of $limit MiB; memory.events oom_kill $oom; mechanism $kind, by $by: $why"
  if [ "$oom" = 0 ] && [ -z "$(oom_killed_at "$HOG_PID")" ] && [ "$kind" = cgroup_v2_freeze ] && kill -0 "$HOG_PID" 2>/dev/null; then
    result $S ok "frozen: $detail"
  else
    result $S fail "frozen: $detail; job alive: $(kill -0 "$HOG_PID" 2>/dev/null && echo yes || echo no)"
  fi
else
  result $S fail "frozen: not frozen 60 s after the job began growing ($used of $limit MiB, oom_kill $oom, job state $(hog_field .state), alive: $(kill -0 "$HOG_PID" 2>/dev/null && echo yes || echo no))"
fi

# Detached, the job is resumed first: the cgroup thaws and the job goes on.
t1=$(now_ms)
memwatch detach hog >/tmp/detach.txt 2>&1
rc=$?
if wait_until 10 sh -c "! grep -q '^frozen 1' $CG/hogjob.service/cgroup.events" && kill -0 "$HOG_PID" 2>/dev/null; then
  result $S ok "thawed: memwatch detach hog (exit $rc) thawed the cgroup in $(($(now_ms) - t1)) ms; job alive, oom_kill $(oom_kills hogjob.service)"
else
  result $S fail "thawed: after memwatch detach hog (exit $rc: $(cat /tmp/detach.txt)) frozen=$(cg_key "$CG/hogjob.service/cgroup.events" frozen), alive: $(kill -0 "$HOG_PID" 2>/dev/null && echo yes || echo no)"
fi
stop_hog
if is_active memwatch; then
  result $S ok "daemon: still active after the job's unit stopped (MainPID $(main_pid memwatch))"
else
  result $S fail "daemon: $(systemctl is-active memwatch) after the job's unit stopped"
fi
exit "${FAILED:-0}"
