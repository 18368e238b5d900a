# timeout: 420
# Beside systemd-oomd. A slice with ManagedOOMMemoryPressure=kill and a low limit holds a job under
# MemoryHigh= alone (no MemoryMax), which grows past memory.high while a child churns the page cache
# (so the slice shows reclaim, which oomd needs before it kills). Without memwatch, oomd kills the job
# under the pressure memory.high makes; attached to memwatch, the job is paused at memory.high's
# level (memory.high is its limit), its cgroup marked user.oomd_omit=1 while held, and oomd leaves it
# alone for longer than its duration; a detach takes the mark off. With memwatch the churn starts once
# the job's own memory is at 150 MiB (78 % of memory.high): from the go, the slice's pressure would
# fill oomd's 5 s before a job slowed by the churn (TCG) reaches 95 %, and what is shown is that
# oomd leaves a job memwatch holds alone, not who wins that race.
. /mnt/in/lib.sh
S=oomd
SLICE=oomtest.slice
UNIT=oomjob
HIGH_MIB=192
DIR=/sys/fs/cgroup/$SLICE/$UNIT.service

ensure_memwatch || { result $S fail "setup: memwatch not serving ($(systemctl is-active memwatch))"; exit 1; }
is_active systemd-oomd || systemctl start systemd-oomd
mkdir -p /run/systemd/system
cat >/run/systemd/system/$SLICE <<EOF
[Slice]
ManagedOOMMemoryPressure=kill
ManagedOOMMemoryPressureLimit=10%
ManagedOOMMemoryPressureDurationSec=5s
EOF
systemctl daemon-reload
systemctl start $SLICE
# What oomd took from the slice (its limit and duration), as oomctl shows it.
watched=$(oomctl 2>/dev/null | awk -v p="/$SLICE" '$1 == "Path:" { on = ($2 == p) } on && /Limit|Duration/ { sub(/^[ \t]+/, ""); printf "%s; ", $0 }')

xattr() { getfattr --only-values -n "$2" "$1" 2>/dev/null; }
alive() { [ "$(systemctl is-active $UNIT)" = active ]; }

# start_job: the unit, MemoryHigh only and no swap; memhog waits for /run/oom-go, then touches
# 400 MiB at 32 MiB/s, while a child (from /run/oom-churn on) reads the whole of /usr over and over
# (page cache, reclaimed at memory.high).
start_job() {
  rm -f /run/oom-go /run/oom-churn
  systemctl stop $UNIT >/dev/null 2>&1
  systemctl reset-failed $UNIT >/dev/null 2>&1
  systemd-run --quiet --unit=$UNIT --slice=$SLICE -p MemoryHigh=${HIGH_MIB}M -p MemorySwapMax=0 \
    /bin/sh -c "(while [ ! -e /run/oom-churn ]; do sleep 0.2; done; while :; do find /usr -type f -size -4M -exec cat {} + >/dev/null 2>&1; done) & exec $IN/memhog --rate-mib 32 --total-mib 400 --hold-ms 600000 --wait-file /run/oom-go"
  wait_until 10 sh -c "[ \"\$(systemctl show -p MainPID --value $UNIT)\" -gt 0 ]"
  JOB_PID=$(main_pid $UNIT)
  sleep 1
}

# Without memwatch: oomd kills the job.
start_job
go=$(now_ms)
touch /run/oom-go /run/oom-churn
killed='' mark='' peak=0
deadline=$((go + 150000))
while [ "$(now_ms)" -lt "$deadline" ]; do
  v=$(xattr "$DIR" user.oomd_kill)
  used=$(($(cat "$DIR/memory.current" 2>/dev/null || echo 0) / 1048576))
  [ "$used" -gt "$peak" ] && peak=$used
  if [ -n "$v" ]; then mark=$v; killed=$(now_ms); break; fi
  if ! alive; then killed=$(now_ms); break; fi
  sleep 0.05
done
pressure=$(awk '/^full/ { print $2 }' /sys/fs/cgroup/$SLICE/memory.pressure 2>/dev/null)
wait_until 10 sh -c "! systemctl is-active -q $UNIT"
res=$(systemctl show -p Result --value $UNIT)
said=$(journalctl -b -u systemd-oomd --no-pager -q -o cat 2>/dev/null | grep "Killed /$SLICE/$UNIT.service" | tail -n 1)
if [ -n "$killed" ] && [ "$res" = oom-kill ]; then
  result $S ok "alone: killed by systemd-oomd $(( (killed - go) / 1000 )).$(( (killed - go) % 1000 / 100 )) s after the job began growing, at a peak of $peak MiB of memory.high $HIGH_MIB MiB; user.oomd_kill=${mark:-(the cgroup was gone before a 50 ms poll read it)}; Result=$res; oomd: \"${said:-no log line}\"; slice ${watched:-not listed by oomctl}"
else
  result $S fail "alone: not killed by oomd in 150 s (alive: $(alive && echo yes || echo no), Result=$res, peak $peak MiB, slice full pressure $pressure, user.oomd_kill=${mark:-none}); ${watched:-slice not listed by oomctl}"
fi
systemctl stop $UNIT >/dev/null 2>&1
systemctl reset-failed $UNIT >/dev/null 2>&1

# With memwatch: paused at memory.high's level, marked while held, never killed.
start_job
memwatch attach "$JOB_PID" --name oomjob >/dev/null
job_field() { curl -sf 127.0.0.1:9300/api/v1/jobs | jq -r ".jobs[] | select(.name == \"oomjob\") | $1"; }
wait_until 10 sh -c "[ \"\$(curl -sf 127.0.0.1:9300/api/v1/jobs | jq -r '.jobs[] | select(.name == \"oomjob\") | .sample.cgroup.limit_source.file')\" = memory.high ]"
source_file=$(job_field '.sample.cgroup.limit_source.file')
limit_mib=$(( $(job_field '.sample.cgroup.limit_bytes' || echo 0) / 1048576 ))
go=$(now_ms)
touch /run/oom-go
paused=''
deadline=$((go + 60000))
while [ "$(now_ms)" -lt "$deadline" ]; do
  if [ "$(cg_key "$DIR/cgroup.events" frozen)" = 1 ]; then paused=$(now_ms); break; fi
  [ -e /run/oom-churn ] || [ "$(cg_key "$DIR/memory.stat" anon)" -lt $((150 << 20)) ] || touch /run/oom-churn
  sleep 0.05
done
touch /run/oom-churn
at=$(($(cat "$DIR/memory.current" 2>/dev/null || echo 0) / 1048576))
wait_until 10 sh -c "[ \"\$(curl -sf 127.0.0.1:9300/api/v1/jobs | jq -r '.jobs[] | select(.name == \"oomjob\") | .pause.phase')\" = held ]"
why=$(job_field '.pause.reason')
omit=$(xattr "$DIR" user.oomd_omit)
recorded=$(job_field '.pause.oomd_omit[0].dir')
if [ -n "$paused" ] && [ "$omit" = 1 ] && [ "$recorded" = "$DIR" ] && [ "$source_file" = memory.high ]; then
  result $S ok "paused: frozen $(( (paused - go) / 1000 )).$(( (paused - go) % 1000 / 100 )) s after the job began growing, at $at MiB of memory.high $HIGH_MIB MiB (memwatch's limit $limit_mib MiB from $source_file): $why; user.oomd_omit=$omit on $recorded while held"
else
  result $S fail "paused: frozen at ${paused:-never} (go $go), $at MiB; limit ${limit_mib} MiB from ${source_file:-?}; user.oomd_omit=${omit:-none}; recorded ${recorded:-none}; pause by $(job_field '.pause.mechanism.kind'): ${why:-none}; alive: $(alive && echo yes || echo no)"
fi
# Held for 40 s, more than oomd's 5 s duration plus the 10 s its avg10 takes to build and fall.
held_from=$(now_ms)
wait_s=40
survived=yes
while [ $(( $(now_ms) - held_from )) -lt $((wait_s * 1000)) ]; do
  if ! alive || [ -n "$(xattr "$DIR" user.oomd_kill)" ]; then survived=no; break; fi
  sleep 0.5
done
held_ms=$(( $(now_ms) - held_from ))
still=$(xattr "$DIR" user.oomd_omit)
peak_p=$(awk '/^full/ { sub("avg60=", "", $3); print $3 }' /sys/fs/cgroup/$SLICE/memory.pressure 2>/dev/null)
if [ $survived = yes ] && [ "$still" = 1 ]; then
  result $S ok "survived: alive and never killed by systemd-oomd over $((held_ms / 1000)) s held (oomd's duration 5 s), user.oomd_omit still $still, slice full avg60 $peak_p %, no user.oomd_kill"
else
  result $S fail "survived: alive $survived after $((held_ms / 1000)) s, user.oomd_kill=$(xattr "$DIR" user.oomd_kill), user.oomd_omit=$still, Result=$(systemctl show -p Result --value $UNIT)"
fi
t1=$(now_ms)
memwatch detach oomjob >/tmp/detach.txt 2>&1
gone=no
wait_until 5 sh -c "! getfattr -n user.oomd_omit $DIR >/dev/null 2>&1" && gone=yes
thawed=$(cg_key "$DIR/cgroup.events" frozen)
if [ $gone = yes ] && [ "$thawed" = 0 ]; then
  result $S ok "unmarked: memwatch detach took user.oomd_omit off and thawed the job in $(($(now_ms) - t1)) ms; paused $(( (t1 - paused) / 1000 )) s in all"
else
  result $S fail "unmarked: after detach ($(cat /tmp/detach.txt)) user.oomd_omit=$(xattr "$DIR" user.oomd_omit), frozen=$thawed"
fi
systemctl kill -s KILL $UNIT >/dev/null 2>&1
systemctl stop $UNIT >/dev/null 2>&1
systemctl reset-failed $UNIT >/dev/null 2>&1
systemctl stop $SLICE >/dev/null 2>&1
rm -f /run/systemd/system/$SLICE /run/oom-go /run/oom-churn
systemctl daemon-reload
exit "${FAILED:-0}"
