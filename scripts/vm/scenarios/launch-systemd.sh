# timeout: 180
# `memwatch launch` where systemd runs the machine: as root and as an ordinary user (through the
# user's own manager, no root), the job runs in a transient scope of its own (systemd knows it,
# with the MemoryMax asked for), memwatch attaches it, and when it ends systemd removes the scope;
# nothing is ever made at the root of the cgroup tree (/sys/fs/cgroup/memwatch). A user without a
# user bus is served through the manager's private socket; a user without a manager is told what to do.
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
    wait $lpid
    rc=$?
    cp /tmp/launch-$who.log "$OUT/launch-$who.log"
    result $S fail "$who: never attached (launch exited $rc; its output in launch-$who.log): $(tail -n 3 /tmp/launch-$who.log | tr '\n' ' ' | cut -c1-600)"
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

# No user manager at all (no login, no linger): launch fails at once and says what to do.
loginctl disable-linger mwuser
wait_until 30 sh -c "! test -e /run/user/$uid/systemd/private" || { result $S fail "user-nomanager: mwuser's manager still runs after disable-linger"; exit 1; }
if runuser -u mwuser -- env XDG_RUNTIME_DIR=/run/user/$uid memwatch launch --name lj-none -- true >/tmp/launch-none.log 2>&1; then
  result $S fail "user-nomanager: launch succeeded with no user manager: $(tail -n 2 /tmp/launch-none.log)"
elif grep -q 'enable-linger' /tmp/launch-none.log; then
  result $S ok "user-nomanager: launch refused: $(tail -n 1 /tmp/launch-none.log | cut -c1-300)"
else
  result $S fail "user-nomanager: the error does not say what to do: $(tail -n 2 /tmp/launch-none.log)"
fi

# The same user with no user bus (the user manager's dbus.socket masked, as on a server without
# dbus-user-session, and the user's runtime directory made afresh): launch reaches the user manager
# through its private socket, as systemctl --user does. The mask goes afterwards, and the user's
# manager with it, so that later scenarios find the machine as it was.
mkdir -p /etc/systemd/user
ln -sf /dev/null /etc/systemd/user/dbus.socket
wait_until 30 sh -c "! test -d /run/user/$uid" || { result $S fail "user-nobus: /run/user/$uid outlived the user manager"; exit 1; }
loginctl enable-linger mwuser
wait_until 30 test -S /run/user/$uid/systemd/private || { result $S fail "user-nobus: no private socket for mwuser's manager"; exit 1; }
if [ -e /run/user/$uid/bus ]; then
  result $S fail "user-nobus: /run/user/$uid/bus is there with the user's dbus.socket masked"
else
  launch_check user-nobus runuser -u mwuser -- env XDG_RUNTIME_DIR=/run/user/$uid
fi
rm -f /etc/systemd/user/dbus.socket
loginctl disable-linger mwuser
wait_until 30 sh -c "! test -d /run/user/$uid" || result $S fail "cleanup: mwuser's manager outlived disable-linger"
exit "${FAILED:-0}"
