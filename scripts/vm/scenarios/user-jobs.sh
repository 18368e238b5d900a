# timeout: 240
# Jobs as users start them on a systemd machine, each attached, paused by hand (`memwatch pause`,
# `resume`) and by the policy as it grows toward its MemoryMax (200M, no swap), then detached:
# held by the freezer when the attached tree owns its cgroup, by signals when it is one process of
# a cgroup that holds others; alive and never OOM-killed after. The kinds: a root `systemd-run`
# service (signals: its freezer case is freeze-v2), a `systemd-run --scope`, an ordinary user's
# `systemd-run --user` service attached by that user over the control socket (who may not attach or
# pause root's job), and a container-style scope in machine.slice (docker-<id>.scope).
. /mnt/in/lib.sh
S=user-jobs

ensure_memwatch || { result $S fail "setup: memwatch not serving ($(systemctl is-active memwatch))"; exit 1; }

# memhog grows to 190 MiB of the 200M limit at 64 MiB/s once /run/uj-go-LABEL exists, and holds it:
# a job memwatch failed to pause stays under its limit, so it is never OOM-killed either.
hog() { echo "$IN/memhog --rate-mib 64 --total-mib 190 --hold-ms 600000 --wait-file /run/uj-go-$1"; }
LIMIT='-p MemoryMax=200M -p MemorySwapMax=0'

job() { curl -sf 127.0.0.1:9300/api/v1/jobs | jq -r ".jobs[] | select(.name == \"$1\") | $2"; }
# The held pause's mechanism, once the API shows one (read up to 5 s: one read under TCG load has
# found the pause without it for an instant).
kind_of() {
  k=''
  for _ in $(seq 50); do
    k=$(job "$1" '.pause.mechanism.kind')
    [ -n "$k" ] && [ "$k" != null ] && break
    sleep 0.1
  done
  echo "$k"
}
cgroup_of() { sed -n 's/^0:://p' "/proc/$1/cgroup"; }
state_of() { awk '{ sub(/^.*\) /, ""); print substr($0, 1, 1) }' "/proc/$1/stat" 2>/dev/null; }
# Held as the mechanism says: the cgroup frozen, or the attached process stopped.
held() {
  case $2 in
    cgroup_v2_freeze) [ "$(cg_key "/sys/fs/cgroup$3/cgroup.events" frozen)" = 1 ] ;;
    signals) [ "$(state_of "$1")" = T ] ;;
    *) return 1 ;;
  esac
}
running() { ! held "$@" && kill -0 "$1" 2>/dev/null; }
# The pid of $1's child (the job's memhog under `sh -c 'memhog & wait'`).
child_of() { cat "/proc/$1/task/$1/children" 2>/dev/null | awk '{ print $1 }'; }
# wait_pid_in CG_SUFFIX PID: the process has moved into a cgroup whose path ends with CG_SUFFIX.
wait_in() { wait_until 20 sh -c "sed -n 's/^0:://p' /proc/$2/cgroup | grep -q '$1\$'"; }

# check LABEL MECHANISM PID [PREFIX…]: attaches PID as LABEL (as the user PREFIX runs commands as),
# pauses and resumes it by hand, lets it grow to the policy's pause, detaches it, and reports.
check() {
  label=$1 want=$2 pid=$3
  shift 3
  cg=$(cgroup_of "$pid")
  if ! out=$("$@" memwatch attach "$pid" --name "$label" 2>&1); then
    result $S fail "$label: attach refused: $out"
    return
  fi
  wait_until 10 sh -c "[ -n \"\$(curl -sf 127.0.0.1:9300/api/v1/jobs | jq -r '.jobs[] | select(.name == \"$label\") | .pid')\" ]"
  # By hand.
  "$@" memwatch pause "$label" >/tmp/uj-pause.txt 2>&1
  prc=$?
  wait_until 10 sh -c "[ \"\$(curl -sf 127.0.0.1:9300/api/v1/jobs | jq -r '.jobs[] | select(.name == \"$label\") | .pause.phase')\" = held ]"
  hkind=$(kind_of "$label") hby=$(job "$label" '.pause.by')
  wait_until 5 held "$pid" "$want" "$cg" && hheld=yes || hheld=no
  "$@" memwatch resume "$label" >/tmp/uj-resume.txt 2>&1
  rrc=$?
  wait_until 10 running "$pid" "$want" "$cg" && resumed=yes || resumed=no
  # By the policy, growing toward the limit.
  t0=$(now_ms)
  touch "/run/uj-go-$label"
  wait_until 40 sh -c "[ \"\$(curl -sf 127.0.0.1:9300/api/v1/jobs | jq -r '.jobs[] | select(.name == \"$label\") | .pause.by + \" \" + .pause.phase')\" = 'policy held' ]" && took=$(($(now_ms) - t0)) || took=never
  pkind=$(kind_of "$label") pwhy=$(job "$label" '.pause.reason')
  wait_until 5 held "$pid" "$want" "$cg" && pheld=yes || pheld=no
  used=$(($(cat "/sys/fs/cgroup$cg/memory.current") / 1048576))
  "$@" memwatch detach "$label" >/tmp/uj-detach.txt 2>&1
  drc=$?
  wait_until 10 running "$pid" "$want" "$cg" && free=yes || free=no
  oom=$(cg_key "/sys/fs/cgroup$cg/memory.events" oom_kill)
  detail="$cg: by hand (pause exit $prc, by $hby) $hkind, held $hheld, resumed (exit $rrc) $resumed; by the policy after $took ms at $used of 200 MiB: $pkind, held $pheld ($pwhy); detached (exit $drc), running $free, oom_kill $oom"
  if [ "$prc$rrc$drc" = 000 ] && [ "$hkind" = "$want" ] && [ "$pkind" = "$want" ] && [ "$hby" = user ] &&
    [ "$hheld$resumed$pheld$free" = yesyesyesyes ] && [ "$oom" = 0 ] && [ -z "$(oom_killed_at "$pid")" ]; then
    result $S ok "$label: $detail"
  else
    result $S fail "$label: $detail; pause said: $(cat /tmp/uj-pause.txt); detach said: $(cat /tmp/uj-detach.txt)"
  fi
}

# A root service: one process of the unit attached (its shell is not in the tree), so signals.
systemd-run --quiet --unit=uj-svc $LIMIT sh -c "$(hog svc-sig) & wait"
wait_until 10 sh -c '[ "$(systemctl show -p MainPID --value uj-svc)" -gt 0 ]'
wait_until 10 sh -c "[ -n \"\$(cat /proc/$(main_pid uj-svc)/task/*/children)\" ]"
check svc-sig signals "$(child_of "$(main_pid uj-svc)")"
systemctl stop uj-svc

# A scope: the job is the scope's process (systemd-run execs it), so the freezer; and a shell's child.
systemd-run --quiet --scope --unit=uj-scope $LIMIT $(hog scope) >/dev/null &
spid=$!
wait_in uj-scope.scope $spid
check scope cgroup_v2_freeze $spid
systemd-run --quiet --scope --unit=uj-scope-sig $LIMIT sh -c "$(hog scope-sig) & wait" >/dev/null &
shpid=$!
wait_in uj-scope-sig.scope $shpid
wait_until 10 sh -c "[ -n \"\$(cat /proc/$shpid/task/*/children)\" ]"
check scope-sig signals "$(child_of $shpid)"
kill "$(child_of $shpid)" 2>/dev/null

# A container-style scope (as docker's systemd driver makes them): the origin shows the container.
hex=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
systemd-run --quiet --scope --slice=machine.slice --unit="docker-$hex.scope" $LIMIT $(hog docker) >/dev/null &
dpid=$!
wait_in "docker-$hex.scope" $dpid
memwatch attach $dpid --name docker-job >/dev/null 2>&1
origin=$(job docker-job '.origin.kind + "-" + .origin.id[0:12]')
memwatch detach docker-job >/dev/null 2>&1
check docker cgroup_v2_freeze $dpid
if [ "$origin" = "docker-$(echo "$hex" | cut -c1-12)" ]; then
  result $S ok "docker-origin: $(cgroup_of $dpid) attached with origin $origin"
else
  result $S fail "docker-origin: $(cgroup_of $dpid) attached with origin '$origin'"
fi
kill $dpid 2>/dev/null

# An ordinary user's own service (a lingering user manager), attached by that user over the socket.
id mwuser >/dev/null 2>&1 || useradd -m mwuser
uid=$(id -u mwuser)
loginctl enable-linger mwuser
wait_until 30 test -S /run/user/$uid/bus || { result $S fail "user: no user manager bus for mwuser"; exit 1; }
U="runuser -u mwuser -- env XDG_RUNTIME_DIR=/run/user/$uid DBUS_SESSION_BUS_ADDRESS=unix:path=/run/user/$uid/bus"
rm -f /run/uj-go-user /run/uj-go-user-sig
$U systemd-run --user --quiet --unit=uj-user $LIMIT $(hog user)
$U systemd-run --user --quiet --unit=uj-user-sig $LIMIT sh -c "$(hog user-sig) & wait"
upid=$($U systemctl --user show -p MainPID --value uj-user)
uspid=$($U systemctl --user show -p MainPID --value uj-user-sig)
wait_until 10 sh -c "[ -n \"\$(cat /proc/$uspid/task/*/children)\" ]"
check user cgroup_v2_freeze "$upid" $U
check user-sig signals "$(child_of "$uspid")" $U
# Its cgroup is the user's (delegated, files mode 0644 owned by the user): the daemon, root without
# CAP_DAC_OVERRIDE, set its PSI trigger too.
refused=$(journalctl -b --no-pager -u memwatch -o cat | grep 'no kernel notifications for this job' | grep -E -c 'job="?user')
owner=$(stat -c %U "/sys/fs/cgroup$(cgroup_of "$upid")/memory.pressure")
if [ "$refused" = 0 ]; then
  result $S ok "user-psi: the PSI trigger on the user's cgroup (memory.pressure owned by $owner) was set"
else
  result $S fail "user-psi: $refused \"no kernel notifications\" line(s) for the user's jobs (memory.pressure owned by $owner): $(journalctl -b --no-pager -u memwatch -o cat | grep 'no kernel notifications for this job' | tail -n 1)"
fi

# The user may not attach or pause root's job (a root scope's process, attached by root).
systemd-run --quiet --scope --unit=uj-root sleep 600 >/dev/null &
rpid=$!
wait_in uj-root.scope $rpid
memwatch attach "$rpid" --name rootjob >/dev/null 2>&1
a=$($U memwatch attach "$rpid" --name mine 2>&1)
arc=$?
p=$($U memwatch pause rootjob 2>&1)
prc=$?
rstate=$(state_of "$rpid")
if [ "$arc" != 0 ] && [ "$prc" != 0 ] && [ -z "$(job mine .pid)" ] && [ "$(job rootjob .pause)" = null ] &&
  [ "$rstate" != T ] && [ "$(cg_key "/sys/fs/cgroup$(cgroup_of "$rpid")/cgroup.events" frozen)" = 0 ]; then
  result $S ok "user-refused: attach of root's pid $rpid: exit $arc \"$a\"; pause of root's job: exit $prc \"$p\"; the job runs ($rstate), not paused"
else
  result $S fail "user-refused: attach exit $arc \"$a\"; pause exit $prc \"$p\"; state $rstate, pause $(job rootjob .pause)"
fi
memwatch detach rootjob >/dev/null 2>&1
kill $rpid 2>/dev/null
$U systemctl --user stop uj-user uj-user-sig
kill $spid 2>/dev/null
rm -f /run/uj-go-*
exit "${FAILED:-0}"
