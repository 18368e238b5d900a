#!/bin/sh
# In the guest, as /mnt/in/run.sh: runs each scenario named in /mnt/in/scenarios/list in turn, each under
# the timeout its header gives ("# timeout: SECONDS"), and makes sure each reports: a scenario that
# timed out or printed no VMRESULT line gets a failing one. After a failure the journal's tail goes to
# /mnt/out/journal-SCENARIO.txt (memwatch's unit and the whole boot).
cd /mnt/in || exit 1
# The sizes a benchmark run asked for (scripts/vm/run.sh writes them).
[ -f env ] && . ./env
for s in $(cat scenarios/list); do
  limit=$(sed -n 's/^# timeout: //p' "scenarios/$s.sh")
  start=$(awk '{ print $1 }' /proc/uptime)
  echo "VMSTART $s at $start s"
  { timeout -k 5 "${limit:-300}" sh "scenarios/$s.sh" 2>&1; echo "$?" >"/tmp/$s.rc"; } | tee "/tmp/$s.out"
  rc=$(cat "/tmp/$s.rc")
  [ "$rc" = 124 ] && echo "VMRESULT $s fail timed out after ${limit:-300} s" | tee -a "/tmp/$s.out"
  grep -q "^VMRESULT $s " "/tmp/$s.out" || echo "VMRESULT $s fail reported nothing (exit $rc)" | tee -a "/tmp/$s.out"
  if [ "$rc" != 0 ] || grep -q "^VMRESULT $s fail" "/tmp/$s.out"; then
    {
      echo "== journalctl -b -u memwatch (last 150 lines)"
      journalctl -b --no-pager -u memwatch | tail -n 150
      echo "== journalctl -b (last 80 lines)"
      journalctl -b --no-pager | tail -n 80
    } >"/mnt/out/journal-$s.txt" 2>&1
  fi
  echo "VMEND $s after $(awk -v s="$start" '{ printf "%.1f", $1 - s }' /proc/uptime) s"
done
