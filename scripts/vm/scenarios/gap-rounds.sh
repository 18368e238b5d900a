# timeout: 900
# The daemon dies near a pause, again and again, each time with a fresh job near its line. Each round:
# a unit with MemoryMax=400M and no swap runs memhog (200 MiB/s to 700 MiB, two workers), attached by
# pid. Odd rounds: as soon as the job is seen held (its cgroup.freeze 1, or its main process stopped),
# memwatch's MainPID is killed (SIGKILL, SIGABRT and SIGQUIT in turn), after 0-290 ms in every other
# one of them; a job frozen at the kill must stay frozen until the successor takes over. Even rounds: the kill is
# timed at the resume instead: once the job is held, its MemoryMax is raised to 480M
# (`systemctl set-property --runtime`), the daemon resumes it, and it is SIGKILLed as soon as the
# cgroup is seen thawed; the job, which catches up on its schedule, is then at its new line within a
# fraction of a second, before any successor (SIGKILL). systemd restarts the daemon each time; 1 s
# more is watched after the successor takes over. ok if no round saw an OOM kill and every job ended the round
# alive, held by the new daemon or running inside its limit. One line per round goes to
# /mnt/out/gap-rounds.log: how the kill was timed, what held the job at the kill, when the successor
# took over, whether the guardian held it in the gap, the job's state and peak, and its OOM kills.
# Then rounds before the guardian held the line (1; GAP_BEFORE): the kill at the resume with the guardian killed
# first, so that nothing watches the gap; each must end in the OOM killer (else this scenario would
# not reach the gap's hazard), and the line `before:` says how.
. /mnt/in/lib.sh
S=gap-rounds
ROUNDS=${GAP_ROUNDS:-10}
BEFORE=${GAP_BEFORE:-1}
LOG=$OUT/gap-rounds.log
: >"$LOG"

ensure_memwatch || { result $S fail "setup: memwatch not serving ($(systemctl is-active memwatch))"; exit 1; }
unit=gapjob
U=$CG/$unit.service
# The main process's state letter (R, S, D, T …).
pstate() { awk '{ sub(/.*\) /, ""); print substr($0, 1, 1) }' "/proc/$1/stat" 2>/dev/null; }

thaws=0 before_killed=0 before_detail='' resumed_held=0 kills=0 alive_all=0 held_new=0 running=0 by_guardian=0 rounds_done=0 bad=''
r=0
while [ $r -lt $((ROUNDS + BEFORE)) ]; do
  r=$((r + 1))
  before=no
  [ $r -gt "$ROUNDS" ] && before=yes
  rm -f /run/gap-go
  systemctl stop $unit >/dev/null 2>&1
  systemctl reset-failed $unit memwatch >/dev/null 2>&1
  wait_until 30 curl -sf 127.0.0.1:9300/-/ready || { bad="$bad $r:no-daemon"; continue; }
  systemd-run --quiet --unit=$unit -p MemoryMax=400M -p MemorySwapMax=0 \
    "$IN/memhog" --rate-mib 200 --total-mib 700 --workers 2 --hold-ms 600000 --wait-file /run/gap-go
  wait_until 10 sh -c "[ \"\$(systemctl show -p MainPID --value $unit)\" -gt 0 ]"
  pid=$(main_pid $unit)
  name=gap$r
  memwatch attach "$pid" --name $name >/dev/null 2>&1 || { bad="$bad $r:attach"; systemctl stop $unit; continue; }
  delay=0 timing=pause limit=400 sig=KILL
  case $(((r + 1) / 2 % 3)) in 1) sig=ABRT ;; 2) sig=QUIT ;; esac
  [ $((r % 4)) = 3 ] && delay=$(((r * 137) % 300 / 10 * 10))
  [ $((r % 2)) = 0 ] && timing=resume sig=KILL
  [ $before = yes ] && timing=resume delay=0 sig=KILL
  old=$(main_pid memwatch)
  # Found ahead: under TCG pgrep takes longer than the job needs to reach its line again.
  gpids=''
  [ $before = yes ] && gpids=$(pgrep -f 'memwatch guardian' | tr '\n' ' ')
  touch /run/gap-go
  t0=$(now_ms) sign=''
  while [ "$(now_ms)" -lt $((t0 + 30000)) ]; do
    if [ "$(cat "$U/cgroup.freeze" 2>/dev/null)" = 1 ]; then sign=frozen; break; fi
    if [ "$(pstate "$pid")" = T ]; then sign=stopped; break; fi
    kill -0 "$pid" 2>/dev/null || { sign=gone; break; }
  done
  at_sign=$(mib $unit.service)
  [ "$delay" = 0 ] || sleep "0.$(printf '%03d' "$delay")"
  if [ "$timing" = resume ]; then
    # Room: the daemon resumes the job; the kill as soon as the cgroup is seen thawed.
    limit=480
    systemctl set-property --runtime $unit MemoryMax=${limit}M
    t1=$(now_ms) sign="$sign, then thawed"
    while [ "$(cat "$U/cgroup.freeze" 2>/dev/null)" != 0 ] || [ "$(pstate "$pid")" = T ]; do
      [ "$(now_ms)" -lt $((t1 + 20000)) ] || { sign="$sign never"; break; }
    done
  fi
  if [ $before = yes ]; then
    # At once, before the reads below (slow under TCG), so that nothing watches the gap.
    timing="resume, the guardian killed too"
    # shellcheck disable=SC2086
    kill -KILL $gpids "$old"
    tk=$(now_ms)
  fi
  at_kill=$(mib $unit.service)
  still=$(cat "$U/cgroup.freeze" 2>/dev/null)
  if [ $before = no ]; then
    kill -s $sig "$old"
    tk=$(now_ms)
  fi
  # The successor: a new MainPID whose API lists the job; the peak, the OOM kills and (for a job
  # frozen at the kill) any look that finds it thawed meanwhile.
  took='' peak=$at_kill thawed=0
  while [ "$(now_ms)" -lt $((tk + 20000)) ]; do
    m=$(mib $unit.service)
    [ "$m" -gt "$peak" ] && peak=$m
    [ "$still" = 1 ] && [ "$(cat "$U/cgroup.freeze" 2>/dev/null)" != 1 ] && thawed=$((thawed + 1))
    new=$(main_pid memwatch)
    if [ "$new" != 0 ] && [ "$new" != "$old" ] &&
      curl -sf 127.0.0.1:9300/api/v1/jobs 2>/dev/null | jq -e ".jobs[] | select(.name == \"$name\")" >/dev/null 2>&1; then
      took=$(($(now_ms) - tk))
      break
    fi
    sleep 0.05
  done
  # 1 s more under the new daemon.
  te=$(($(now_ms) + 1000))
  while [ "$(now_ms)" -lt "$te" ]; do
    m=$(mib $unit.service)
    [ "$m" -gt "$peak" ] && peak=$m
    sleep 0.1
  done
  job=$(curl -sf 127.0.0.1:9300/api/v1/jobs 2>/dev/null | jq -c ".jobs[] | select(.name == \"$name\")" 2>/dev/null)
  state=$(echo "$job" | jq -r '.state // "absent"' 2>/dev/null)
  reason=$(echo "$job" | jq -r '.pause.reason // ""' 2>/dev/null)
  guardian=no
  journalctl -u memwatch --since "@$(($(date +%s) - 30))" --no-pager -o cat 2>/dev/null |
    grep "the guardian held the job at its critical line" | grep -q "job=$name " && guardian=yes
  [ "$timing" = resume ] && [ "$guardian" = yes ] && resumed_held=$((resumed_held + 1))
  oom=$(oom_kills $unit.service)
  [ -z "$oom" ] && [ -n "$(oom_killed_at "$pid")" ] && oom=1
  isalive=no
  kill -0 "$pid" 2>/dev/null && isalive=yes
  echo "round $r: SIG$sig at the $timing, delay ${delay} ms; first sign: $sign at $at_sign MiB, $at_kill MiB at the kill (cgroup.freeze ${still:-?}); successor took over after ${took:-never} ms (looks that found it thawed before: $thawed); guardian held it in the gap: $guardian; then: $state (${reason:-no pause}), peak $peak MiB of $limit; oom_kill ${oom:-?}; alive $isalive" | tee -a "$LOG"
  if [ $before = yes ]; then
    [ "${oom:-0}" != 0 ] && [ "$isalive" = no ] && before_killed=$((before_killed + 1))
    before_detail="$before_detail; round $r: peak $peak MiB of $limit, oom_kill ${oom:-?}, alive $isalive"
    memwatch detach $name >/dev/null 2>&1
    systemctl stop $unit >/dev/null 2>&1
    continue
  fi
  rounds_done=$((rounds_done + 1))
  thaws=$((thaws + thawed))
  [ "${oom:-0}" = 0 ] || kills=$((kills + 1))
  [ "$guardian" = yes ] && by_guardian=$((by_guardian + 1))
  if [ "$isalive" = yes ] && { [ "$state" = paused ] || { [ "$state" = running ] && [ "$peak" -le $limit ]; }; }; then
    alive_all=$((alive_all + 1))
    [ "$state" = paused ] && held_new=$((held_new + 1)) || running=$((running + 1))
  else
    bad="$bad $r:$state/$isalive"
  fi
  memwatch detach $name >/dev/null 2>&1
  echo 0 >"$U/cgroup.freeze" 2>/dev/null
  systemctl stop $unit >/dev/null 2>&1
done
systemctl reset-failed $unit memwatch >/dev/null 2>&1
detail="$rounds_done of $ROUNDS rounds (log: gap-rounds.log): jobs OOM-killed $kills; looks that found a job frozen at the kill thawed before the take-over $thaws; alive at the end $alive_all (held by the new daemon $held_new, running inside the limit $running); held by the guardian in the gap $by_guardian (of the $((ROUNDS / 2)) kills at a resume: $resumed_held); failed rounds:${bad:- none}"
if [ "$rounds_done" = "$ROUNDS" ] && [ "$kills" = 0 ] && [ "$thaws" = 0 ] && [ "$alive_all" = "$ROUNDS" ]; then
  result $S ok "$detail"
else
  result $S fail "$detail"
fi
detail="before: $BEFORE kills at a resume with the guardian killed too, OOM-killed $before_killed$before_detail"
if [ "$before_killed" = "$BEFORE" ]; then
  result $S ok "$detail"
else
  result $S fail "$detail (each should have been: the rounds above do not reach the gap's hazard)"
fi
exit "${FAILED:-0}"
