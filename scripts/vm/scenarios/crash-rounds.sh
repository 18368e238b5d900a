# timeout: 400
# The daemon crashes 8 times in a row (CRASH_ROUNDS) (SIGKILL, SIGABRT and SIGQUIT in turn: killed, an abort, a
# core-dumping signal) while it holds a job frozen at its memory limit (the job set to grow to 600 MiB
# of 400): each time systemd restarts it, and the new daemon must take the job over still frozen. Not
# SIGSEGV: Rust's runtime catches it to report stack overflows, so one sent with kill(2) (no fault)
# is survived once; a real fault is fatal like the others. The job's cgroup is read every 50 ms throughout. ok if it never thawed, was never
# OOM-killed, and every new daemon showed the job paused.
. /mnt/in/lib.sh
S=crash-rounds
ROUNDS=${CRASH_ROUNDS:-8}

frozen_hog $S 600
oom0=$(oom_kills hogjob.service)
thaws=0 held=0 times=''
r=0
while [ $r -lt $ROUNDS ]; do
  r=$((r + 1))
  systemctl reset-failed memwatch >/dev/null 2>&1
  old=$(main_pid memwatch)
  t0=$(now_ms)
  case $((r % 3)) in 1) sig=KILL ;; 2) sig=ABRT ;; 0) sig=QUIT ;; esac
  kill -s $sig "$old"
  took=''
  while [ "$(now_ms)" -lt $((t0 + 30000)) ]; do
    [ "$(cg_key "$CG/hogjob.service/cgroup.events" frozen)" = 1 ] || thaws=$((thaws + 1))
    pid=$(main_pid memwatch)
    if [ "$pid" != 0 ] && [ "$pid" != "$old" ] && [ "$(hog_field .state)" = paused ]; then
      took=$(($(now_ms) - t0))
      break
    fi
    sleep 0.05
  done
  [ -n "$took" ] && held=$((held + 1)) && times="$times $took"
done
oom=$(oom_kills hogjob.service)
alive=no
kill -0 "$HOG_PID" 2>/dev/null && alive=yes
sorted=$(echo $times | tr ' ' '\n' | sort -n)
p50=$(echo "$sorted" | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
max=$(echo "$sorted" | tail -n 1)
detail="$ROUNDS crashes (SIGKILL, SIGABRT, SIGQUIT in turn); held by the new daemon in $held (paused in its API, restart to take-over p50 ${p50:-?} ms, max ${max:-?} ms); looks that found the cgroup thawed: $thaws; oom_kill $oom0 -> $oom; job alive: $alive; frozen now: $(cg_key "$CG/hogjob.service/cgroup.events" frozen)"
if [ "$held" = $ROUNDS ] && [ "$thaws" = 0 ] && [ "$oom" = "$oom0" ] && [ "$alive" = yes ]; then
  result $S ok "$detail"
else
  result $S fail "$detail"
fi
stop_hog
exit "${FAILED:-0}"
