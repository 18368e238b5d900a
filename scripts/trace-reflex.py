#!/usr/bin/env python3
"""Times each reflex stop of a traced `benches/reflex.rs` run from the kernel's own events.

Reads the text of /sys/kernel/tracing/trace as `scripts/trace-reflex.sh` records it (record-tgid
on; sched_waking, sched_switch, sched_process_exec, the irq and softirq entries and exits, and
raw_syscalls:sys_enter of write and pidfd_send_signal only). For each memwatch daemon (each exec of
a binary named memwatch, told apart by its path), and each of its stops:

- the crossing: the last burst of the hog's wake-ups of the daemon's wake thread or firers before
  the stop (the kernel signals a v1 threshold's eventfd from the hog's own page fault, so the hog is
  the waker, on the CPU it runs on);
- the act: the first freeze write (6 bytes, "FROZEN") or pidfd_send_signal by the daemon's wake
  thread or a firer after it;
- the stop: the hog switched out in a state other than runnable after the act.

Printed per daemon: crossing to act, act to stop and crossing to stop, p50 / p90 / p99 / max, and
how many acts each thread made, on the hog's CPU or another; and for each act to stop over SLOW µs
(500, or the second argument), what ran on the hog's CPU in between, thread by thread, and how long
(the time the hog waited for its CPU after the act), interrupts and softirqs named apart (their
time is also inside the thread's they interrupted). A thread's time there that none of these
explains, in a system call of microseconds, is the virtual CPU's time taken by the host (steal:
trace-reflex.sh prints the run's total from /proc/stat). The bench's own figure (its observer's
stamp to the freezer's FROZEN or waitid) is beside it in the bench's output; this one does not
depend on when the observer's thread ran.

    python3 scripts/trace-reflex.py TRACE_TEXT [SLOW_US]
"""

import re
import statistics
import sys

LINE = re.compile(
    r"^\s*(?P<comm>.+?)-(?P<pid>\d+)\s+\(\s*(?P<tgid>[-\d]+)\)\s+\[(?P<cpu>\d+)\]\s+\S+\s+"
    r"(?P<ts>[\d.]+): (?P<event>\w+): (?P<args>.*)$"
)
WAKING = re.compile(r"comm=(?P<comm>\S+) pid=(?P<pid>\d+) prio=\d+ target_cpu=(?P<cpu>\d+)")
EXEC = re.compile(r"filename=(?P<file>\S+) pid=(?P<pid>\d+)")
SYS = re.compile(r"NR (?P<nr>\d+) \((?P<args>[^)]*)\)")
SWITCH = re.compile(
    r"prev_comm=(?P<comm>.+?) prev_pid=(?P<pid>\d+) .*prev_state=(?P<state>\S+) ==> "
    r"next_comm=(?P<next>.+?) next_pid=(?P<next_pid>\d+)"
)
WRITE, PIDFD_SEND_SIGNAL = 1, 424
BURST = 50e-6
# A crossing this long before an act is another run's.
STALE = 0.1


def events(path):
    with open(path, errors="replace") as f:
        for line in f:
            m = LINE.match(line)
            if m:
                yield m


def quantiles(values):
    v = sorted(values)
    if not v:
        return "none"
    at = lambda q: v[min(len(v) - 1, int(len(v) * q))]
    return "p50 %.0f / p90 %.0f / p99 %.0f / max %.0f µs (%d)" % (
        statistics.median(v), at(0.9), at(0.99), v[-1], len(v))


def main(path, slow_us):
    tgid_of, binary = {}, {}
    for m in events(path):
        if m["tgid"].isdigit():
            tgid_of[int(m["pid"])] = int(m["tgid"])
        if m["event"] == "sched_process_exec":
            e = EXEC.search(m["args"])
            if e and e["file"].endswith("/memwatch"):
                binary[int(e["pid"])] = e["file"]
    daemon = lambda pid: tgid_of.get(pid) if tgid_of.get(pid) in binary else None
    state = {t: {"crossing": None, "last": None, "act": None, "to_act": [], "to_stop": [],
                 "whole": [], "at": None, "untimed": 0,
                 "by": {}, "ran": None, "slow": []} for t in binary}
    # Per CPU: the thread on it and since when, to tell what ran on the hog's CPU after an act;
    # and the interrupt or softirq it is in, since when.
    on_cpu, in_irq = {}, {}

    def charge(cpu, since, ts, name):
        """Counts what ran on `cpu` from `since` to `ts` against each act waiting on that CPU."""
        for s in state.values():
            r = s["ran"]
            if s["act"] is not None and r is not None and r["cpu"] == cpu:
                r["times"][name] = r["times"].get(name, 0) + (ts - max(since, s["act"])) * 1e6

    for m in events(path):
        ts, cpu, event, args = float(m["ts"]), int(m["cpu"]), m["event"], m["args"]
        if event == "sched_waking" and m["comm"] == "memhog":
            w = WAKING.search(args)
            t = w and daemon(int(w["pid"]))
            if t and (w["comm"] == "wake" or w["comm"].startswith("fire-")):
                s = state[t]
                if s["last"] is None or ts - s["last"] > BURST:
                    s["crossing"] = (ts, cpu)
                s["last"] = ts
        elif event == "sys_enter":
            t = daemon(int(m["pid"]))
            comm = m["comm"]
            if not t or not (comm == "wake" or comm.startswith("fire-")):
                continue
            c = SYS.search(args)
            if not c:
                continue
            nr, a = int(c["nr"]), [x.strip() for x in c["args"].split(",")]
            s = state[t]
            act = nr == PIDFD_SEND_SIGNAL or (nr == WRITE and len(a) > 2 and a[2] == "6")
            if act and s["crossing"] and ts - s["crossing"][0] > STALE:
                # No crossing of this stop's own (the wake thread's read of a job over its line
                # after a rearm): not timed.
                s["crossing"] = None
                s["untimed"] += 1
            if act and s["crossing"]:
                at, hog_cpu = s["crossing"]
                s["to_act"].append((ts - at) * 1e6)
                who = ("a firer" if comm.startswith("fire-") else "the wake thread") + (
                    ", on the hog's CPU" if cpu == hog_cpu else ", on another CPU")
                s["by"][who] = s["by"].get(who, 0) + 1
                s["act"], s["crossing"], s["at"] = ts, None, at
                # What runs on the hog's CPU from the act to its stop: name -> µs.
                s["ran"] = {"cpu": hog_cpu, "times": {}}
        elif event in ("irq_handler_entry", "softirq_entry"):
            name = "irq" if event == "irq_handler_entry" else "softirq " + args.split("action=")[-1]
            in_irq[cpu] = (ts, name)
        elif event in ("irq_handler_exit", "softirq_exit") and cpu in in_irq:
            since, name = in_irq.pop(cpu)
            charge(cpu, since, ts, name)
        elif event == "sched_switch":
            sw = SWITCH.search(args)
            if not sw:
                continue
            prev_since = on_cpu.get(cpu)
            on_cpu[cpu] = (ts, sw["next"], int(sw["next_pid"]))
            if prev_since is not None:
                since, comm, pid = prev_since
                charge(cpu, since, ts, comm + (" (memwatch)" if daemon(pid) else ""))
            if sw["comm"] == "memhog" and sw["state"] not in ("R", "R+"):
                for s in state.values():
                    if s["act"] is not None:
                        took = (ts - s["act"]) * 1e6
                        s["to_stop"].append(took)
                        s["whole"].append((ts - s["at"]) * 1e6)
                        if took > slow_us and s["ran"]:
                            s["slow"].append((took, s["ran"]))
                        s["act"], s["ran"] = None, None
    for t, s in sorted(state.items(), key=lambda kv: binary[kv[0]]):
        if not s["to_act"]:
            continue
        print(f"{binary[t]} (pid {t})")
        print(f"  crossing -> act:  {quantiles(s['to_act'])}")
        print(f"  act -> hog off its CPU stopped or frozen: {quantiles(s['to_stop'])}")
        print(f"  crossing -> hog off its CPU stopped or frozen: {quantiles(s['whole'])}")
        print("  acts by " + ", ".join(f"{who}: {n}" for who, n in sorted(s["by"].items()))
              + f"; acts with no crossing of their own within {STALE * 1e3:.0f} ms: "
              + str(s["untimed"]))
        for took, ran in sorted(s["slow"], key=lambda x: -x[0]):
            times = sorted(ran["times"].items(), key=lambda kv: -kv[1])
            print(f"  slow stop {took:.0f} µs, on CPU {ran['cpu']}: " +
                  ", ".join(f"{n} {t:.0f}" for n, t in times[:6]))


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: trace-reflex.py TRACE_TEXT [SLOW_US]")
    main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) == 3 else 500.0)
