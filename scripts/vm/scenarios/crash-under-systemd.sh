# timeout: 180
# The daemon is killed (SIGKILL) while it holds a frozen job; systemd restarts it (Restart=always,
# RestartSec=1). What happens to the job over the next 20 s: does it stay frozen, is it thawed, is it
# OOM-killed (it grows past its limit when thawed), when does the new daemon run, does it hold the job.
# ok only if the job is alive, was never OOM-killed and is held, frozen, by the new daemon.
. /mnt/in/lib.sh
S=crash-under-systemd

# 600 MiB of 400: only memwatch's pause keeps it from the OOM killer.
frozen_hog $S 600
oom0=$(oom_kills hogjob.service)
at=$(mib hogjob.service)
old=$(main_pid memwatch)
t0=$(now_ms)
kill -9 "$old"
thawed='' refrozen='' oomed='' dead='' restarted='' was=1 oom=$oom0
while [ "$(now_ms)" -lt $((t0 + 20000)) ]; do
  t=$(($(now_ms) - t0))
  # frozen 1, frozen 0, or nothing once the unit's cgroup is gone.
  case $(cg_key "$CG/hogjob.service/cgroup.events" frozen) in
    1)
      [ "$was" = 0 ] && [ -z "$refrozen" ] && refrozen=$t
      was=1
      ;;
    0)
      [ -z "$thawed" ] && thawed=$t
      was=0
      ;;
  esac
  o=$(oom_kills hogjob.service)
  [ -n "$o" ] && oom=$o
  [ -z "$oomed" ] && [ "$oom" != "$oom0" ] && oomed=$t
  [ -z "$dead" ] && ! kill -0 "$HOG_PID" 2>/dev/null && dead=$t
  if [ -z "$restarted" ]; then
    pid=$(main_pid memwatch)
    [ "$pid" != 0 ] && [ "$pid" != "$old" ] && is_active memwatch && restarted=$t
  fi
  sleep 0.1
done
# A cgroup removed at once after the kill may never have shown its oom_kill: the kernel's log has it.
if [ -z "$oomed" ] && k=$(oom_killed_at "$HOG_PID") && [ -n "$k" ]; then
  oomed=$((k - t0))
  oom="$((oom0 + 1)) (from the kernel log; the unit ended with $(systemctl show -p Result --value hogjob))"
fi
new=$(main_pid memwatch)
alive=no
kill -0 "$HOG_PID" 2>/dev/null && alive=yes
state=$(hog_field .state)
kind=$(hog_field .pause.mechanism.kind)
frozen_now=$(cg_key "$CG/hogjob.service/cgroup.events" frozen)
# "at +N ms" when it happened, else what to say.
when() { if [ -n "$1" ]; then echo "at +$1 ms"; else echo "$2"; fi; }
detail="daemon $old killed at $at MiB of 400 with the job frozen; thawed: $(when "$thawed" never);"
detail="$detail refrozen: $(when "$refrozen" no); OOM-killed: $(when "$oomed" no) (oom_kill $oom0 -> $oom);"
detail="$detail job ended: $(when "$dead" no); new daemon: $(when "$restarted" 'not running after 20 s')${restarted:+ (pid $new)};"
detail="$detail new daemon's job: ${state:-none}${kind:+ ($kind)}; cgroup frozen at 20 s: ${frozen_now:-gone}, $(mib hogjob.service) MiB"
if [ "$alive" = yes ] && [ -z "$oomed" ] && [ "$frozen_now" = 1 ] && [ "$state" = paused ]; then
  result $S ok "$detail"
else
  result $S fail "$detail"
fi
stop_hog
exit "${FAILED:-0}"
