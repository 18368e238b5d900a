# timeout: 600
# The way out on cgroup v2 under systemd, configured as a user would (/etc/memwatch/memwatch.toml, the
# packaged emergency-swap drop-in). Each job is a systemd unit (MemoryMax=400M) running memhog: 4
# workers of 60 MiB, then its main process grows to 180 MiB at 64 MiB/s, more than the unit allows; a
# trainer beside it (this script) speaks the protocol and applies the urgent fix (2 workers fewer) 3 s
# after memwatch asks for it.
# (i) lend: the limit is raised through systemd (SetUnitProperties, runtime), shows in `systemctl show
#     -p MemoryMax`, survives `systemctl daemon-reload` and a `set-property` (which puts back a limit
#     written to the cgroup's file: shown on a control unit), and goes back to the unit's own once the job fits;
# (ii) swap: a zram device is made, the job's pages go out (memory.swap.current > 0), the job is
#     resumed and survives, and the device is removed after;
# (iii) a unit with MemorySwapMax=0: the swap step is skipped, with the reason in memwatch's events;
# (iv) a plain unit no fix can help: pushed out to swap while frozen (memory.reclaim), resumed, finishes.
. /mnt/in/lib.sh
S=way-out-v2
EV=/var/lib/memwatch/events.jsonl

ensure_memwatch || { result $S fail "setup: memwatch not serving ($(systemctl is-active memwatch))"; exit 1; }
cp /etc/memwatch/memwatch.toml /root/memwatch.toml.orig

# configure STEPS: the way out a user would set for these jobs, then a restart to read it.
configure() {
  cat >/etc/memwatch/memwatch.toml <<EOF
[way_out]
steps = [$1]
decide_seconds = 2
fix_seconds = 30
swap_margin_mib = 64
swap_max_mib = 256
lend = true
lend_max_mib = 256
[adapt]
verify_seconds = 30
EOF
  systemctl restart memwatch
  wait_until 60 curl -sf 127.0.0.1:9300/-/ready
  [ "$(systemctl is-active memwatch)" = active ] ||
    result $S fail "config: memwatch $(systemctl is-active memwatch) after the restart: $(journalctl -b -u memwatch --no-pager -o cat | grep -m2 -i 'failed' | tr '\n' ' ')"
}

field() { curl -sf 127.0.0.1:9300/api/v1/jobs | jq -r ".jobs[] | select(.name == \"$1\") | $2"; }
events() { jq -r "select(.job == \"$1\") | \"\\(.action)/\\(.reason): \\(.detail)\"" "$EV" 2>/dev/null; }
show_max() { systemctl show -p MemoryMax --value "$1"; }

# trainer NAME: polls the job's directives every 0.2 s (so it speaks the protocol); an urgent one is
# applied 3 s later (memhog drops 2 workers) and acknowledged. While /run/NAME-hold-fix exists the fix
# waits: the lend case keeps the loan until it has checked that a reload leaves it in place.
trainer() {
  tok=$(cat "/run/$1.token")
  since=0
  while :; do
    g=$(curl -sf -H "Authorization: Bearer $tok" "127.0.0.1:9300/api/v1/jobs/$1/directives?since=$since" |
      jq -r '[.directives[]? | select(.urgent == true)] | last | .generation // empty')
    if [ -n "$g" ]; then
      echo "$(now_ms)" >"/run/$1-asked"
      while [ -e "/run/$1-hold-fix" ]; do sleep 0.1; done
      sleep 3
      echo 2 >"/run/$1-drop"
      curl -sf -X POST -H "Authorization: Bearer $tok" -H 'Content-Type: application/json' \
        -d "{\"generation\": $g, \"epoch\": 0}" "127.0.0.1:9300/api/v1/jobs/$1/ack" >/dev/null
      echo "$(now_ms) $g" >"/run/$1-applied"
      since=$g
    fi
    sleep 0.2
  done
}

# start_job NAME [systemd-run -p …]: the unit NAME.service, attached as NAME with its config and
# trainer (TRAINER); its growth starts with `touch /run/NAME-go`. 1 on failure.
start_job() {
  n=$1
  shift
  rm -f "/run/$n-go" "/run/$n-drop" "/run/$n-asked" "/run/$n-applied" "/run/$n-hold-fix"
  mkdir -p /root/wayout
  printf '{"train": {"micro_batch": 8, "accumulation": 1, "workers": 4}}\n' >"/root/wayout/$n.json"
  systemd-run --quiet --unit="$n" -p MemoryMax=400M "$@" "$IN/memhog" --rate-mib 64 --total-mib 180 \
    --workers 4 --worker-mib 60 --hold-ms 600000 --wait-file "/run/$n-go" --drop-file "/run/$n-drop" || return 1
  wait_until 10 sh -c "[ \$(wc -l <$CG/$n.service/cgroup.procs) -ge 5 ]" || return 1
  sleep 1
  memwatch attach "$(main_pid "$n")" --name "$n" --config-file "/root/wayout/$n.json" --profile generic \
    --key workers=train.workers --token-file "/run/$n.token" >"/run/$n.attach" 2>&1 || return 1
  trainer "$n" &
  TRAINER=$!
}

end_job() {
  kill "$TRAINER" 2>/dev/null
  memwatch detach "$1" >/dev/null 2>&1
  [ -f "$CG/$1.service/cgroup.freeze" ] && echo 0 >"$CG/$1.service/cgroup.freeze"
  systemctl stop "$1" >/dev/null 2>&1
  systemctl reset-failed "$1" >/dev/null 2>&1
}

# The premise: what makes systemd write a unit's MemoryMax back over a value written to its cgroup.
systemd-run --quiet --unit=wctl -p MemoryMax=100M sleep 300
premise() {
  echo 209715200 >"$CG/wctl.service/memory.max"
  "$@" >/dev/null 2>&1
  echo "$* → $(cat "$CG/wctl.service/memory.max")"
}
p1=$(premise systemctl daemon-reload)
p2=$(premise systemctl set-property --runtime wctl MemoryHigh=infinity)
p3=$(premise systemctl daemon-reexec)
systemctl stop wctl
result $S ok "premise: a unit with MemoryMax=100M (104857600), 209715200 written to its memory.max, then: $p1; $p2; $p3"
oomd="ManagedOOMSwap=$(systemctl show -p ManagedOOMSwap --value -- -.slice), oomd $(systemctl is-active systemd-oomd)"

# (i) lend through systemd.
configure '"lend"'
if ! start_job wl; then
  result $S fail "lend: setup: wl.service did not start or attach ($(systemctl is-active wl))"
else
  max0=$(show_max wl)
  file0=$(cat "$CG/wl.service/memory.max")
  # The fix waits until the reload has been checked: in a slow guest a daemon-reload outlasts the 3 s
  # the trainer takes, and the loan was given back before it was looked at.
  touch /run/wl-hold-fix
  t0=$(now_ms)
  touch /run/wl-go
  wait_until 60 frozen wl.service
  frozen_at=$(($(now_ms) - t0))
  fstate="FreezerState=$(systemctl show -p FreezerState --value wl), $(systemctl status wl --no-pager 2>/dev/null | sed -n 's/^ *Active: //p' | cut -c1-40)"
  wait_until 60 sh -c "[ \"\$(systemctl show -p MemoryMax --value wl)\" != $max0 ]"
  lent=$(show_max wl)
  lent_file=$(cat "$CG/wl.service/memory.max")
  lent_at=$(($(now_ms) - t0))
  systemctl daemon-reload
  systemctl set-property --runtime wl MemoryHigh=infinity
  reload_show=$(show_max wl)
  reload_file=$(cat "$CG/wl.service/memory.max")
  rm -f /run/wl-hold-fix
  wait_until 30 sh -c '[ "$(curl -sf 127.0.0.1:9300/api/v1/jobs | jq -r ".jobs[] | select(.name == \"wl\") | .pause")" = null ]'
  resumed_at=$(($(now_ms) - t0))
  peak=$(cat "$CG/wl.service/memory.peak" 2>/dev/null)
  wait_until 90 sh -c "[ \"\$(systemctl show -p MemoryMax --value wl)\" = $max0 ]"
  back_at=$(($(now_ms) - t0))
  max1=$(show_max wl)
  file1=$(cat "$CG/wl.service/memory.max")
  used=$(mib wl.service)
  alive=no
  kill -0 "$(main_pid wl)" 2>/dev/null && alive=yes
  oom=$(oom_kills wl.service)
  how=$(events wl | grep -m1 'raised' | sed 's/.*(through \([^)]*\)).*/\1/')
  calls=$(journalctl -b -u memwatch --no-pager -o cat | sed -n 's/.*MemoryMax set through systemd unit="*wl.service"* memory_max=\([0-9]*\) ms=\([0-9]*\) ok=\([a-z]*\).*/\1 in \2 ms (ok \3)/p' | tr '\n' ',' | sed 's/,$//')
  detail="MemoryMax $max0 (memory.max $file0); frozen at +$frozen_at ms ($fstate); lent at +$lent_at ms: systemctl show $lent, memory.max $lent_file (through $how; busctl calls: $calls); after systemctl daemon-reload and set-property --runtime wl MemoryHigh=infinity: show $reload_show, memory.max $reload_file; resumed at +$resumed_at ms (memory.peak $((${peak:-0} / 1048576)) MiB); back at +$back_at ms: show $max1, memory.max $file1, the job at $used MiB, alive $alive, oom_kill $oom"
  if [ "$lent" != "$max0" ] && [ "$lent" = "$lent_file" ] && [ "$reload_show" = "$lent" ] && [ "$reload_file" = "$lent" ] &&
    [ "$max1" = "$max0" ] && [ "$file1" = "$file0" ] && [ "$alive" = yes ] && [ "$oom" = 0 ]; then
    result $S ok "lend: $detail"
  else
    result $S fail "lend: $detail; events: $(events wl | tail -n 6 | tr '\n' '|')"
  fi
  end_job wl
fi

# (ii) zram emergency swap for a unit that allows swap.
dropin=/usr/share/doc/memwatch/examples/emergency-swap.conf
if [ -f "$dropin" ]; then
  install -Dm644 "$dropin" /etc/systemd/system/memwatch.service.d/emergency-swap.conf
  systemctl daemon-reload
fi
configure '"swap"'
if ! start_job ws; then
  result $S fail "swap: setup: ws.service did not start or attach (unit $(systemctl is-active ws), memwatch $(systemctl is-active memwatch): $(cat /run/ws.attach 2>/dev/null))"
else
  t0=$(now_ms)
  swapmax=$(cat "$CG/ws.service/memory.swap.max")
  touch /run/ws-go
  dev=''
  wait_until 60 sh -c '[ "$(curl -sf 127.0.0.1:9300/api/v1/jobs | jq -r ".jobs[] | select(.name == \"ws\") | .way_out.swap.device.zram // empty")" != "" ]'
  dev=/dev/zram$(field ws '.way_out.swap.device.zram')
  size=$(($(field ws '.way_out.swap.bytes') / 1048576))
  made_at=$(($(now_ms) - t0))
  # The job's pages going out: memory.swap.current, read every 0.1 s until the device is gone.
  swapped=0 devpeak=0 gone=''
  deadline=$(($(now_ms) + 120000))
  while [ "$(now_ms)" -lt "$deadline" ]; do
    s=$(cat "$CG/ws.service/memory.swap.current" 2>/dev/null || echo 0)
    [ "$s" -gt "$swapped" ] && swapped=$s
    u=$(awk -v d="$dev" '$1 == d { print $4 }' /proc/swaps)
    [ -n "$u" ] && [ "$u" -gt "$devpeak" ] && devpeak=$u
    if [ -z "$u" ] && [ ! -e "/sys/block/${dev#/dev/}" ] && [ "$swapped" -gt 0 ]; then
      gone=$(($(now_ms) - t0))
      break
    fi
    sleep 0.1
  done
  alive=no
  kill -0 "$(main_pid ws)" 2>/dev/null && alive=yes
  oom=$(oom_kills ws.service)
  phase=$(field ws '.way_out.phase')
  paused=$(field ws '.pause.phase // "no"')
  applied=$(cut -d' ' -f1 /run/ws-applied 2>/dev/null)
  detail="memory.swap.max $swapmax; $dev of $size MiB made at +$made_at ms; memory.swap.current up to $((swapped / 1024)) KiB, the device's use up to $((devpeak / 1024)) MiB of $size ($oomd: its 90 % is $((size * 9 / 10)) MiB); fix applied at +$((${applied:-$t0} - t0)) ms; device removed at +${gone:-never} ms; phase $phase, paused $paused, alive $alive, oom_kill $oom, the job at $(mib ws.service) MiB"
  if [ "$swapped" -gt 0 ] && [ -n "$gone" ] && [ "$alive" = yes ] && [ "$oom" = 0 ] && [ "$paused" = no ]; then
    result $S ok "swap: $detail"
  else
    result $S fail "swap: $detail; events: $(events ws | tail -n 8 | tr '\n' '|')"
  fi
  end_job ws
fi

# (iii) a unit that forbids swap: the step is skipped, and says why.
if ! start_job wn -p MemorySwapMax=0; then
  result $S fail "no-swap: setup: wn.service did not start or attach (unit $(systemctl is-active wn), memwatch $(systemctl is-active memwatch): $(cat /run/wn.attach 2>/dev/null))"
else
  touch /run/wn-go
  wait_until 60 sh -c "jq -r 'select(.job == \"wn\") | .detail' $EV | grep -q 'swap: skipped'"
  why=$(events wn | grep -m1 'swap: skipped')
  made=$(events wn | grep -c 'MiB on /dev/zram')
  alive=no
  kill -0 "$(main_pid wn)" 2>/dev/null && alive=yes
  if echo "$why" | grep -q 'memory.swap.max is 0' && [ "$made" = 0 ] && [ "$alive" = yes ]; then
    result $S ok "no-swap: MemorySwapMax=0 (memory.swap.max $(cat "$CG/wn.service/memory.swap.max")): \"$why\"; no device made; the job held, alive"
  else
    result $S fail "no-swap: \"$why\", devices made $made, alive $alive; events: $(events wn | tail -n 6 | tr '\n' '|')"
  fi
  end_job wn
fi

# (iv) a plain unit (no config file, no trainer) that needs more than its MemoryMax: no fix can be
# applied, so its held memory is pushed out to swap through memory.reclaim while it stays frozen; it
# is resumed into that room and finishes, with no OOM kill.
rm -f /run/wr-go
systemd-run --quiet --unit=wr -p MemoryMax=400M -p RemainAfterExit=yes "$IN/memhog" --rate-mib 64 \
  --total-mib 560 --hold-ms 2000 --wait-file /run/wr-go
if ! wait_until 10 sh -c '[ "$(systemctl show -p MainPID --value wr)" -gt 0 ]' ||
  ! memwatch attach "$(main_pid wr)" --name wr >/run/wr.attach 2>&1; then
  result $S fail "reclaim: setup: wr.service did not start or attach (unit $(systemctl is-active wr): $(cat /run/wr.attach 2>/dev/null))"
else
  t0=$(now_ms)
  touch /run/wr-go
  wait_until 240 sh -c '[ "$(systemctl show -p SubState --value wr)" = exited ]'
  done_at=$(($(now_ms) - t0))
  code=$(systemctl show -p ExecMainCode --value wr)
  status=$(systemctl show -p ExecMainStatus --value wr)
  pushed=$(events wr | grep -m1 'pushed out to swap while held')
  before=$(echo "$pushed" | sed -n 's/.*its cgroup \([0-9]*\) → \([0-9]*\) MiB.*/\1/p')
  after=$(echo "$pushed" | sed -n 's/.*its cgroup \([0-9]*\) → \([0-9]*\) MiB.*/\2/p')
  killed=$(events wr | grep -c '^oom_kill/')
  detail="memhog to 560 MiB under MemoryMax=400M, no config: finished at +$done_at ms (ExecMainCode $code, status $status); \"$pushed\"; oom_kill events $killed"
  if [ "$code" = 1 ] && [ "$status" = 0 ] && echo "$pushed" | grep -q 'memory.reclaim' &&
    [ -n "$after" ] && [ "$after" -lt "$before" ] && [ "$killed" = 0 ]; then
    result $S ok "reclaim: $detail"
  else
    result $S fail "reclaim: $detail; events: $(events wr | tail -n 8 | tr '\n' '|')"
  fi
  memwatch detach wr >/dev/null 2>&1
  systemctl stop wr >/dev/null 2>&1
  systemctl reset-failed wr >/dev/null 2>&1
fi

# As the next scenarios expect: the package's config, no drop-in.
cp /root/memwatch.toml.orig /etc/memwatch/memwatch.toml
rm -f /etc/systemd/system/memwatch.service.d/emergency-swap.conf
systemctl daemon-reload
systemctl restart memwatch
wait_until 60 curl -sf 127.0.0.1:9300/-/ready
exit "${FAILED:-0}"
