#!/usr/bin/env bash
# Runs the reflex bench under the kernel's tracer and times each stop from the kernel's own events
# (scripts/trace-reflex.py): from the hog's page fault that signals the threshold, to the daemon's
# freeze write or signal, to the hog off its CPU. Needs root and tracefs; the bench's environment
# (BASE_BIN, ROWS, RUNS, RATES, ...) passes through.
#
#   BASE_BIN=<an earlier memwatch> ROWS="reflex,floor" RUNS=30 RATES=1024,4096 ./scripts/trace-reflex.sh
#
# The base binary's file must be named memwatch (the daemons are told apart by their paths).
#
# The trace is kept in target/trace-reflex/trace.txt (a few hundred MiB for 240 runs). Tracing
# costs every event a few hundred nanoseconds, so the bench's figures of a traced run are a little
# slower than an untraced one's; compare traced with traced.
set -euo pipefail
cd "$(dirname "$0")/.."
T=/sys/kernel/tracing
[ -d "$T/events" ] || mount -t tracefs nodev "$T"
out=target/trace-reflex
mkdir -p "$out"
reset() {
  echo 0 >"$T/tracing_on"
  echo >"$T/set_event"
  echo 0 >"$T/events/raw_syscalls/sys_enter/filter"
}
trap reset EXIT
reset
echo >"$T/trace"
echo mono >"$T/trace_clock"
echo "${BUF_KB:-262144}" >"$T/buffer_size_kb"
echo 1 >"$T/options/record-tgid"
# Interrupts and softirqs too: what ran on a CPU inside a thread's time there.
for e in sched:sched_waking sched:sched_switch sched:sched_process_exec raw_syscalls:sys_enter \
  irq:irq_handler_entry irq:irq_handler_exit irq:softirq_entry irq:softirq_exit; do
  echo "$e" >>"$T/set_event"
done
# write(2) and pidfd_send_signal(2) only.
echo 'id == 1 || id == 424' >"$T/events/raw_syscalls/sys_enter/filter"
cargo bench --bench reflex --no-run
# The time the host took the virtual CPUs from this guest over the run (/proc/stat's steal, in
# USER_HZ ticks).
steal() { awk '/^cpu / { print $9 }' /proc/stat; }
hz=$(getconf CLK_TCK)
steal0=$(steal)
echo 1 >"$T/tracing_on"
SLOW_US=${SLOW_US:-1500} cargo bench --bench reflex | tee "$out/bench.txt"
echo 0 >"$T/tracing_on"
echo "steal: $(( ($(steal) - steal0) * 1000 / hz )) ms of the CPUs' time taken by the host over the bench"
overrun=$(awk '/^overrun:/ {s += $2} END {print s + 0}' "$T"/per_cpu/cpu*/stats)
cat "$T/trace" >"$out/trace.txt"
[ "$overrun" = 0 ] || echo "the trace lost $overrun events: raise BUF_KB" >&2
python3 scripts/trace-reflex.py "$out/trace.txt"
