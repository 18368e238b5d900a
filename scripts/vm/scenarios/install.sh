# timeout: 240
# The package on a clean Debian 13 under systemd: apt-get installs it offline and its postinst starts
# the service; it serves metrics and answers `memwatch status`; its first 30 s log no stale samples;
# the unit's exposure; restart and stop.
. /mnt/in/lib.sh
S=install

t0=$(now_ms)
if DEBIAN_FRONTEND=noninteractive apt-get install -y "$IN"/memwatch_*.deb >/tmp/apt.log 2>&1; then
  result $S ok "package: apt-get install (offline) took $(($(now_ms) - t0)) ms, $(dpkg-query -W -f '${Package} ${Version}' memwatch)"
else
  tail -n 5 /tmp/apt.log
  DEBIAN_FRONTEND=noninteractive dpkg -i "$IN"/memwatch_*.deb >/tmp/dpkg.log 2>&1
  result $S fail "package: apt-get install failed ($(tail -n 1 /tmp/apt.log)); dpkg -i exit $?"
fi

if wait_until 60 is_active memwatch; then
  result $S ok "active: systemctl is-active memwatch = active $(($(now_ms) - t0)) ms after the install began (MainPID $(main_pid memwatch), enabled: $(systemctl is-enabled memwatch))"
else
  result $S fail "active: memwatch is $(systemctl is-active memwatch) 60 s after the install"
fi
started=$(systemctl show -p ExecMainStartTimestampMonotonic --value memwatch)

if wait_until 30 sh -c 'curl -sf 127.0.0.1:9300/metrics | grep -q "^memwatch_"'; then
  n=$(curl -sf 127.0.0.1:9300/metrics | grep -c '^memwatch_')
  result $S ok "metrics: curl 127.0.0.1:9300/metrics has $n memwatch_ samples"
else
  result $S fail "metrics: no memwatch_ series at 127.0.0.1:9300/metrics within 30 s"
fi

if memwatch status >/tmp/status.txt 2>&1; then
  result $S ok "status: memwatch status exit 0: $(head -n 1 /tmp/status.txt)"
else
  result $S fail "status: memwatch status exit $?: $(head -n 3 /tmp/status.txt | tr '\n' ' ')"
fi

# The wake thread (the kernel's notifications, the reflexes) at real-time priority under the unit
# (LimitRTPRIO=1, policy.reflex_priority = 1): SCHED_FIFO is policy 1 in /proc/TID/stat's 41st field.
pid=$(main_pid memwatch)
tid=$(grep -lx wake /proc/"$pid"/task/*/comm 2>/dev/null | head -n 1 | cut -d/ -f5)
prio= policy=
if [ -n "$tid" ]; then
  # The command (field 2) is "(wake)", with no space: fields split on blanks.
  prio=$(awk '{ print $40 }' /proc/"$pid"/task/"$tid"/stat)
  policy=$(awk '{ print $41 }' /proc/"$pid"/task/"$tid"/stat)
fi
if [ "$policy" = 1 ] && [ "$prio" = 1 ]; then
  result $S ok "realtime: the wake thread ($tid) runs SCHED_FIFO at priority $prio under the unit"
else
  result $S fail "realtime: the wake thread (${tid:-none}) has policy ${policy:-?} priority ${prio:-?}; journal: $(journalctl -u memwatch --no-pager | grep -m 1 'real-time')"
fi

# The journal of the daemon's first 30 s (from its start, on the monotonic clock).
until_us=$((started + 30000000))
while [ "$(awk '{ printf "%d\n", $1 * 1000000 }' /proc/uptime)" -lt "$until_us" ]; do sleep 1; done
stale=$(journalctl -b -u memwatch --no-pager -o json |
  jq -r --argjson a "$started" --argjson b "$until_us" \
    'select((.__MONOTONIC_TIMESTAMP | tonumber) >= $a and (.__MONOTONIC_TIMESTAMP | tonumber) <= $b) | .MESSAGE | tostring' |
  grep -c 'samples are stale')
if [ "$stale" = 0 ]; then
  result $S ok "stale: 0 \"samples are stale\" warnings in the daemon's first 30 s"
else
  result $S fail "stale: $stale \"samples are stale\" warnings in the daemon's first 30 s (a known bug)"
fi

score=$(systemd-analyze security memwatch.service --no-pager 2>/dev/null | sed -n 's/.*Overall exposure level for memwatch.service: //p')
if [ -n "$score" ]; then
  result $S ok "security: systemd-analyze security memwatch: $score"
else
  result $S fail "security: systemd-analyze security memwatch gave no exposure level"
fi

old=$(main_pid memwatch)
t1=$(now_ms)
systemctl restart memwatch
if wait_until 60 is_active memwatch && [ "$(main_pid memwatch)" != "$old" ]; then
  result $S ok "restart: active again in $(($(now_ms) - t1)) ms (MainPID $old -> $(main_pid memwatch))"
else
  result $S fail "restart: $(systemctl is-active memwatch) after systemctl restart (MainPID $old -> $(main_pid memwatch))"
fi

t1=$(now_ms)
systemctl stop memwatch
r=$(systemctl show -p Result --value memwatch)
stopped=$(($(now_ms) - t1))
# The guardian (KillMode=process leaves it to itself) goes as soon as the daemon has gone.
wait_until 2 sh -c '! pgrep -x memwatch'
left=$(pgrep -x memwatch | wc -l)
if [ "$r" = success ] && ! is_active memwatch && [ "$left" = 0 ]; then
  result $S ok "stop: stopped in $stopped ms, Result=$r, no memwatch process left $(($(now_ms) - t1)) ms after the stop began"
else
  result $S fail "stop: Result=$r, state $(systemctl is-active memwatch), $left memwatch processes left"
fi
# The next scenarios find it running, as a fresh install leaves it.
systemctl start memwatch
exit "${FAILED:-0}"
