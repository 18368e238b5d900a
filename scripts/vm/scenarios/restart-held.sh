# timeout: 240
# `systemctl restart memwatch` and a package upgrade (apt-get reinstalls the .deb: its prerm leaves
# the service running, its postinst restarts it) while the daemon holds a job frozen at its memory
# limit (set to grow to 600 MiB of 400): the stopping daemon asks systemd, sees a restart, keeps the
# pause for its successor, and the new daemon goes on holding it. The job's cgroup is read every
# 50 ms throughout. ok if it never thawed, was never OOM-killed, and the new daemon showed it paused.
. /mnt/in/lib.sh
S=restart-held

frozen_hog $S 600

# held_across LABEL COMMAND…: runs COMMAND, then watches until a new daemon shows the job paused.
held_across() {
  label=$1
  shift
  old=$(main_pid memwatch)
  oom0=$(oom_kills hogjob.service)
  t0=$(now_ms)
  "$@" >/tmp/$S-cmd.log 2>&1 &
  cmd=$!
  thaws=0 took=''
  while [ "$(now_ms)" -lt $((t0 + 60000)) ]; do
    [ "$(cg_key "$CG/hogjob.service/cgroup.events" frozen)" = 1 ] || thaws=$((thaws + 1))
    pid=$(main_pid memwatch)
    if [ -z "$took" ] && [ "$pid" != 0 ] && [ "$pid" != "$old" ] && [ "$(hog_field .state)" = paused ]; then
      took=$(($(now_ms) - t0))
    fi
    if [ -n "$took" ] && ! kill -0 $cmd 2>/dev/null; then
      break
    fi
    sleep 0.05
  done
  wait $cmd
  rc=$?
  oom=$(oom_kills hogjob.service)
  alive=no
  kill -0 "$HOG_PID" 2>/dev/null && alive=yes
  kept=$(journalctl -u memwatch -o cat --since "-120s" 2>/dev/null | grep -c "kept for the next daemon")
  detail="$label: exit $rc; new daemon (pid $(main_pid memwatch), was $old) showed the job paused at +${took:-never} ms; looks that found the cgroup thawed: $thaws; oom_kill $oom0 -> $oom; job alive: $alive; 'kept for the next daemon' logged $kept times so far"
  if [ "$rc" = 0 ] && [ -n "$took" ] && [ "$thaws" = 0 ] && [ "$oom" = "$oom0" ] && [ "$alive" = yes ]; then
    result $S ok "$detail"
  else
    result $S fail "$detail; $(tail -n 3 /tmp/$S-cmd.log | tr '\n' ' ')"
    journalctl -u memwatch -o cat --since "-120s" | tail -n 30
  fi
}

held_across "systemctl restart" systemctl restart memwatch
held_across "package upgrade" env DEBIAN_FRONTEND=noninteractive apt-get install -y --reinstall "$IN"/memwatch_*.deb
stop_hog
exit "${FAILED:-0}"
