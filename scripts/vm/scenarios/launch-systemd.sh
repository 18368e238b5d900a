# timeout: 180
# `memwatch launch` where systemd runs the machine: as root and as an ordinary user (through the
# user's own manager, no root), the job runs in a transient scope of its own (systemd knows it,
# with the MemoryMax asked for), memwatch attaches it, and when it ends systemd removes the scope;
# nothing is ever made at the root of the cgroup tree (/sys/fs/cgroup/memwatch).
. /mnt/in/lib.sh
S=launch-systemd

ensure_memwatch || { result $S fail "setup: memwatch not serving ($(systemctl is-active memwatch))"; exit 1; }

# launch_check WHO PREFIX…: launches a 6 s job named lj-WHO with PREFIX (empty for root, runuser …
# for the user) and checks its scope while it runs and after it ends.
launch_check() {
  who=$1
  shift
  "$@" memwatch launch --name "lj-$who" --memory-max 300M -- sleep 6 >/tmp/launch-$who.log 2>&1 &
  lpid=$!
  job=''
  for _ in $(seq 1 100); do
    job=$(curl -sf 127.0.0.1:9300/api/v1/jobs | jq -r ".jobs[] | select(.name == \"lj-$who\") | .pid")
    [ -n "$job" ] && break
    sleep 0.1
  done
  if [ -z "$job" ]; then
    result $S fail "$who: never attached: $(cat /tmp/launch-$who.log)"
    wait $lpid
    return
  fi
  cg=$(sed -n 's/^0:://p' /proc/"$job"/cgroup)
  max=$(cat "/sys/fs/cgroup$cg/memory.max" 2>/dev/null)
  case $cg in
    *.scope) ;;
    *) result $S fail "$who: the job's cgroup is $cg, not a scope"; wait $lpid; return ;;
  esac
  wait $lpid
  rc=$?
  gone=no
  [ -d "/sys/fs/cgroup$cg" ] || gone=yes
  if [ "$rc" = 0 ] && [ "$gone" = yes ] && [ ! -e /sys/fs/cgroup/memwatch ]; then
    result $S ok "$who: the job ran in $cg (MemoryMax $max), attached as lj-$who; exit $rc; the scope gone after; nothing at /sys/fs/cgroup/memwatch"
  else
    result $S fail "$who: cgroup $cg (MemoryMax $max), exit $rc, scope gone: $gone, /sys/fs/cgroup/memwatch $(ls -d /sys/fs/cgroup/memwatch 2>/dev/null || echo absent); $(tail -n 3 /tmp/launch-$who.log)"
  fi
}

launch_check root

# An ordinary user with a user manager of their own (lingering, as on a shared server).
id mwuser >/dev/null 2>&1 || useradd -m mwuser
uid=$(id -u mwuser)
loginctl enable-linger mwuser
wait_until 30 test -S /run/user/$uid/bus || { result $S fail "user: no user manager bus for mwuser"; exit 1; }
launch_check user runuser -u mwuser -- env XDG_RUNTIME_DIR=/run/user/$uid DBUS_SESSION_BUS_ADDRESS=unix:path=/run/user/$uid/bus
exit "${FAILED:-0}"
